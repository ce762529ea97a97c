//! Where a model's tensors come from, by llama.cpp's names: a GGUF file (`llama`'s
//! `GgufWeights`), or a checkpoint folder ([`crate::checkpoint::Checkpoint`]) that renames and
//! converts its own. A bottom-layer module: the forward pass reads through it, the checkpoint
//! implements it, and neither imports the other for it.

use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::config::LlamaConfig;
use crate::error::Result;

pub(crate) trait Weights {
    fn has(&self, name: &str) -> bool;
    /// Tensor `name`, of shape `dims` where the file agrees (the caller checks that it exists
    /// and its shape), on `device`.
    fn tensor(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<QTensor>;
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
