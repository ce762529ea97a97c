//! Where a model's tensors come from, by llama.cpp's names: a GGUF file (`llama`'s
//! `GgufWeights`), or a checkpoint folder ([`crate::checkpoint::Checkpoint`]) that renames and
//! converts its own. A bottom-layer module: the forward pass reads through it, the checkpoint
//! implements it, and neither imports the other for it.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::config::LlamaConfig;
use crate::error::Result;

pub(crate) trait Weights {
    fn has(&self, name: &str) -> bool;
    /// Tensor `name`, of shape `dims` where the file agrees (the caller checks that it exists
    /// and its shape), on `device`.
    fn tensor(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Stored>;
    /// The type tensor `name` is stored in (a checkpoint's bf16, f16 and f32 as `BF16`, `F16`
    /// and `F32`), without reading it; `None` where there is no such tensor. What a GPU's weight
    /// plan sizes the projections by (`linear::plan`).
    fn stored_type(&self, name: &str) -> Option<GgmlDType>;
}

/// A tensor as its source holds it: quantized blocks (a GGUF file, the dummy weights; F32 and
/// F16 GGUF tensors too) or plain values in their own element type (a checkpoint's bf16, f16 or
/// f32). Which form multiplies a projection is `linear`'s choice; everything else reads f32
/// ([`Stored::to_f32`]).
// A CUDA build's QTensor is 232 bytes; a `Stored` lives only while one tensor is loaded.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Stored {
    Quant(QTensor),
    Dense(Tensor),
}

impl Stored {
    pub(crate) fn dims(&self) -> &[usize] {
        match self {
            Stored::Quant(t) => t.shape().dims(),
            Stored::Dense(t) => t.dims(),
        }
    }

    /// The values in f32, on `device`.
    pub(crate) fn to_f32(&self, device: &Device) -> Result<Tensor> {
        Ok(match self {
            Stored::Quant(t) => t.dequantize(device)?,
            Stored::Dense(t) => t.to_dtype(DType::F32)?.to_device(device)?,
        })
    }
}

/// A source whose plain projections become Q8_0 blocks as they are read (a CPU's Q8_0 form:
/// [`crate::HostWeights`]), a tied embedding table too (it is the output projection; looked up,
/// its blocks are dequantized, as a Q8_0 GGUF's are); everything else as the source has it.
pub(crate) struct Q8AtLoad<'a, W>(pub(crate) &'a mut W);

impl<W: Weights> Weights for Q8AtLoad<'_, W> {
    fn has(&self, name: &str) -> bool {
        self.0.has(name)
    }

    fn stored_type(&self, name: &str) -> Option<GgmlDType> {
        self.0.stored_type(name)
    }

    fn tensor(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Stored> {
        let t = self.0.tensor(name, dims, device)?;
        let plain = match &t {
            Stored::Dense(_) => true,
            Stored::Quant(q) => !is_quantized(q.dtype()),
        };
        let tied = !self.0.has("output.weight");
        if !plain || !q8_0_at_load(name, dims, tied) {
            return Ok(t);
        }
        let values = t.to_f32(device)?;
        Ok(Stored::Quant(QTensor::quantize(&values, GgmlDType::Q8_0)?))
    }
}

/// Whether plain tensor `name` of `dims` becomes Q8_0 blocks in a CPU's Q8_0 form: a matrix
/// whose rows are whole blocks, but the embedding table of an untied model (only looked up).
pub(crate) fn q8_0_at_load(name: &str, dims: &[usize], tied: bool) -> bool {
    (tied || name != "token_embd.weight")
        && dims.len() == 2
        && dims[1].is_multiple_of(GgmlDType::Q8_0.block_size())
}

/// Whether values of type `t` are quantized blocks (not plain f32, f16 or bf16).
pub(crate) fn is_quantized(t: GgmlDType) -> bool {
    !matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// Bytes `elements` values of type `t` take (whole blocks).
pub(crate) fn stored_bytes(t: GgmlDType, elements: usize) -> u64 {
    (elements.div_ceil(t.block_size()) * t.type_size()) as u64
}

/// llama.cpp's name and shape (rows, then columns) of every tensor a model of `c` has.
pub fn tensor_list(c: &LlamaConfig, tied: bool) -> Vec<(String, Vec<usize>)> {
    let (e, f, hd) = (c.embedding_length, c.feed_forward_length, c.head_dim);
    let (q, kv) = (c.head_count * hd, c.kv_dim());
    let mut out = vec![("token_embd.weight".to_owned(), vec![c.vocab_size, e])];
    if !tied {
        out.push(("output.weight".into(), vec![c.vocab_size, e]));
    }
    for i in 0..c.block_count {
        let mut t = |name: &str, dims: Vec<usize>| out.push((format!("blk.{i}.{name}"), dims));
        if c.qk_norm {
            t("attn_q_norm.weight", vec![hd]);
            t("attn_k_norm.weight", vec![hd]);
        }
        if c.post_norms {
            t("post_attention_norm.weight", vec![e]);
            t("post_ffw_norm.weight", vec![e]);
        }
        if c.qkv_bias {
            t("attn_q.bias", vec![q]);
            t("attn_k.bias", vec![kv]);
            t("attn_v.bias", vec![kv]);
        }
        t("attn_norm.weight", vec![e]);
        t("attn_q.weight", vec![q, e]);
        t("attn_k.weight", vec![kv, e]);
        t("attn_v.weight", vec![kv, e]);
        t("attn_output.weight", vec![e, q]);
        t("ffn_norm.weight", vec![e]);
        t("ffn_gate.weight", vec![f, e]);
        t("ffn_up.weight", vec![f, e]);
        t("ffn_down.weight", vec![e, f]);
    }
    out.push(("output_norm.weight".into(), vec![e]));
    out
}
