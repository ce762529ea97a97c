//! Random weights in a real model's shape, for benchmarks: a forward pass's speed does not depend
//! on the weights' values (vLLM's and SGLang's `--load-format dummy` rest on the same fact), so
//! an 8B model's throughput can be measured without its 16 GB of weights (`quarry bench
//! --dummy-weights llama3.1-8b`).
//!
//! A shape is a Hugging Face `config.json` (the named ones below are the published models'; any
//! file works), read as a checkpoint's is ([`crate::checkpoint`]), with the vocabulary of the
//! tokenizer it runs with. The projections are quantized blocks (Q4_1 on a CPU, where quarry's
//! kernels run it and an 8B model takes 5 GB; Q8_0 on a GPU, which multiplies their f16 copies)
//! made by repeating one quantized random tile, so that an 8B model is built at memory speed;
//! norms are ones and biases zeros. The tile is the same on every run (a fixed xorshift), so
//! [`write_gguf`] writes the very weights [`Llama::dummy`] runs, for llama.cpp to run beside it.

use std::borrow::Cow;
use std::path::Path;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::options::ModelOptions;
use crate::weights::{tensor_list, Stored, Weights};
use crate::Llama;

/// The named shapes: each published model's `config.json` (the keys quarry reads).
pub const DUMMY_SHAPES: &[(&str, &str)] = &[
    (
        "llama3.1-8b",
        r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "vocab_size": 128256, "tie_word_embeddings": false}"#,
    ),
    (
        "qwen2.5-7b",
        r#"{"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "vocab_size": 152064, "tie_word_embeddings": false}"#,
    ),
    (
        "qwen3-8b",
        r#"{"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 36, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "vocab_size": 151936, "tie_word_embeddings": false}"#,
    ),
    (
        "llama3.2-3b",
        r#"{"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 28, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "vocab_size": 128256, "tie_word_embeddings": true}"#,
    ),
    (
        "gemma3-12b",
        r#"{"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
            "hidden_size": 3840, "intermediate_size": 15360, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 48,
            "query_pre_attn_scalar": 256, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024,
            "sliding_window_pattern": 6, "vocab_size": 262208}}"#,
    ),
    (
        "gemma3-27b",
        r#"{"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
            "hidden_size": 5376, "intermediate_size": 21504, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 62,
            "query_pre_attn_scalar": 168, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024,
            "sliding_window_pattern": 6, "vocab_size": 262208}}"#,
    ),
    (
        "mistral-nemo-12b",
        r#"{"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 40, "max_position_embeddings": 1024000, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0, "sliding_window": null, "vocab_size": 131072,
            "tie_word_embeddings": false}"#,
    ),
    (
        "qwen2.5-1.5b",
        r#"{"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
            "num_attention_heads": 12, "num_key_value_heads": 2, "num_hidden_layers": 28,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "vocab_size": 151936, "tie_word_embeddings": true}"#,
    ),
];

/// A shape to build: its config, whether the output projection is the embeddings', and the
/// vocabulary its `config.json` gives (the model runs with the tokenizer's).
#[derive(Debug, Clone)]
pub struct DummyShape {
    pub name: String,
    pub config: LlamaConfig,
    pub tied: bool,
    pub published_vocab: usize,
}

impl DummyShape {
    /// The named shape `name` ([`DUMMY_SHAPES`]), or the `config.json` at the path `name`, with a
    /// vocabulary of `vocab` tokens (the tokenizer's).
    pub fn resolve(name: &str, vocab: usize) -> Result<Self> {
        let text = match DUMMY_SHAPES.iter().find(|(n, _)| *n == name) {
            Some((_, json)) => (*json).to_owned(),
            None if name.ends_with(".json") => {
                std::fs::read_to_string(name).map_err(|source| ModelError::Io {
                    path: name.into(),
                    source,
                })?
            }
            None => {
                return Err(ModelError::UnsupportedArchitecture {
                    architecture: format!("dummy shape `{name}`"),
                    supported: DUMMY_SHAPES
                        .iter()
                        .map(|(n, _)| *n)
                        .chain(["a config.json path"])
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        };
        let mut json: Value = serde_json::from_str(&text).map_err(|e| ModelError::Checkpoint {
            path: name.into(),
            message: format!("not JSON: {e}"),
        })?;
        let c = match &json["text_config"] {
            Value::Object(_) => &mut json["text_config"],
            _ => &mut json,
        };
        let published_vocab = c["vocab_size"].as_u64().unwrap_or(vocab as u64) as usize;
        // transformers' default where the config does not say: Gemma ties, the others do not.
        let gemma = c["model_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("gemma"));
        let tied = c["tie_word_embeddings"].as_bool().unwrap_or(gemma);
        c["vocab_size"] = vocab.into();
        let mut config = crate::checkpoint::config_from_json(&json, vocab)?;
        // Random weights rotate as the GGUF of the shape does ([`write_gguf`]), so that quarry
        // and llama.cpp run the same model: a llama's rows in adjacent pairs.
        if config.architecture == "llama" {
            config.rope_style = crate::config::RopeStyle::Interleaved;
        }
        Ok(Self {
            name: name.to_owned(),
            config,
            tied,
            published_vocab,
        })
    }

    /// The format of the projections on `device` (Q4_1 on a CPU, Q8_0 elsewhere).
    pub fn format(device: &Device) -> GgmlDType {
        if device.is_cpu() {
            GgmlDType::Q4_1
        } else {
            GgmlDType::Q8_0
        }
    }

    /// Parameters of the model as built (the output projection counted once when tied).
    pub fn parameters(&self) -> u64 {
        let c = &self.config;
        let (e, f) = (c.embedding_length as u64, c.feed_forward_length as u64);
        let q = (c.head_count * c.head_dim) as u64;
        let kv = (c.head_count_kv * c.head_dim) as u64;
        let hd = c.head_dim as u64;
        let norms = 2 * e
            + if c.qk_norm { 2 * hd } else { 0 }
            + if c.post_norms { 2 * e } else { 0 }
            + if c.qkv_bias { q + 2 * kv } else { 0 };
        let layer = e * q * 2 + e * kv * 2 + 3 * e * f + norms;
        let embed = c.vocab_size as u64 * e;
        c.block_count as u64 * layer + e + embed * if self.tied { 1 } else { 2 }
    }
}

impl Llama {
    /// A model of `shape` with random weights on `device` ([`crate::dummy`]).
    pub fn dummy(shape: &DummyShape, device: &Device, options: &ModelOptions) -> Result<Self> {
        let mut weights = DummyWeights {
            tied: shape.tied,
            format: DummyShape::format(device),
            tile: Vec::new(),
        };
        Self::from_weights(shape.config.clone(), &mut weights, device, options)
    }
}

/// Writes the model [`Llama::dummy`] builds for `shape` on `device` (the same weights, in the
/// same format) as a GGUF file llama.cpp runs, with the tokenizer of the GGUF file `tokenizer`:
/// the peer of a `--dummy-weights` benchmark (`quarry bench --dummy-gguf`).
pub fn write_gguf(shape: &DummyShape, tokenizer: &Path, device: &Device, out: &Path) -> Result<()> {
    use candle_core::quantized::gguf_file::{self, Value as V};
    let (tok, _, _) = crate::info::read_gguf(tokenizer)?;
    let c = &shape.config;
    let format = DummyShape::format(device);
    let arch = c.architecture.as_str();
    let u = |x: usize| V::U32(x as u32);
    // llama.cpp's file types: 3 mostly Q4_1, 7 mostly Q8_0.
    let file_type = if format == GgmlDType::Q4_1 { 3 } else { 7 };
    let mut keys: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String(arch.into())),
        (
            "general.name".into(),
            V::String(format!("quarry dummy {}", shape.name)),
        ),
        ("general.file_type".into(), u(file_type)),
    ];
    let mut arch_keys = vec![
        ("block_count", u(c.block_count)),
        ("context_length", u(c.context_length)),
        ("embedding_length", u(c.embedding_length)),
        ("feed_forward_length", u(c.feed_forward_length)),
        ("attention.head_count", u(c.head_count)),
        ("attention.head_count_kv", u(c.head_count_kv)),
        ("attention.key_length", u(c.head_dim)),
        ("attention.value_length", u(c.head_dim)),
        ("rope.dimension_count", u(c.head_dim)),
        ("rope.freq_base", V::F32(c.rope_freq_base)),
        ("attention.layer_norm_rms_epsilon", V::F32(c.rms_norm_eps)),
    ];
    if let Some(y) = &c.rope_yarn {
        // The magnitude only where it is not the factor's own, which the reader computes again
        // (an f32 of it would read back as another number).
        let factor = (1.0 / f64::from(c.rope_freq_scale)) as f32;
        arch_keys.extend([
            ("rope.scaling.type", V::String("yarn".into())),
            ("rope.scaling.factor", V::F32(factor)),
            (
                "rope.scaling.original_context_length",
                u(y.original_context as usize),
            ),
            ("rope.scaling.yarn_beta_fast", V::F32(y.beta_fast as f32)),
            ("rope.scaling.yarn_beta_slow", V::F32(y.beta_slow as f32)),
            ("rope.scaling.yarn_ext_factor", V::F32(y.ext_factor as f32)),
        ]);
        if y.magnitude != crate::Yarn::default_magnitude(f64::from(factor)) {
            arch_keys.push(("rope.scaling.yarn_attn_factor", V::F32(y.magnitude as f32)));
        }
    } else if c.rope_freq_scale != 1.0 {
        arch_keys.push(("rope.scaling.type", V::String("linear".into())));
        arch_keys.push(("rope.scaling.factor", V::F32(1.0 / c.rope_freq_scale)));
    }
    if let Some(w) = &c.sliding_window {
        arch_keys.push(("attention.sliding_window", u(w.size)));
        if let Some(base) = w.rope_freq_base {
            arch_keys.push(("rope.freq_base_swa", V::F32(base)));
        }
    }
    keys.extend(
        arch_keys
            .into_iter()
            .map(|(k, v)| (format!("{arch}.{k}"), v)),
    );
    for (k, v) in &tok.metadata {
        if k.starts_with("tokenizer.") {
            keys.push((k.clone(), v.clone()));
        }
    }
    let mut weights = DummyWeights {
        tied: shape.tied,
        format,
        tile: Vec::new(),
    };
    let mut tensors = Vec::new();
    for (name, dims) in tensor_list(c, shape.tied) {
        let t = match weights.tensor(&name, &dims, &Device::Cpu)? {
            Stored::Quant(q) => q,
            Stored::Dense(t) => QTensor::quantize(&t, GgmlDType::F32)?,
        };
        tensors.push((name, t));
    }
    if let Some(f) = &c.rope_freq_factors {
        let t = Tensor::from_vec(f.clone(), f.len(), &Device::Cpu)?;
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32)?,
        ));
    }
    let file = std::fs::File::create(out).map_err(|source| ModelError::Io {
        path: out.to_owned(),
        source,
    })?;
    let mut w = std::io::BufWriter::new(file);
    let metadata: Vec<(&str, &V)> = keys.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut w, &metadata, &refs)?;
    Ok(())
}

/// Blocks in the repeated tile: a prime, so that rows of any width start at different places in
/// it.
const TILE_BLOCKS: usize = 4099;

struct DummyWeights {
    tied: bool,
    format: GgmlDType,
    /// One quantized random tile of [`TILE_BLOCKS`] blocks, made at the first matrix.
    tile: Vec<u8>,
}

impl Weights for DummyWeights {
    fn has(&self, name: &str) -> bool {
        match name {
            "output.weight" => !self.tied,
            "rope_freqs.weight" => false,
            _ => true,
        }
    }

    fn stored_type(&self, name: &str) -> Option<GgmlDType> {
        // Vectors (norms, biases) end in `.weight`/`.bias` like matrices: told apart by name.
        let vector = name.contains("norm") || name.ends_with(".bias");
        self.has(name)
            .then_some(if vector { GgmlDType::F32 } else { self.format })
    }

    fn tensor(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Stored> {
        if dims.len() == 1 {
            // Norms scale by one; biases add nothing.
            let t = match name.ends_with(".bias") {
                true => Tensor::zeros(dims, DType::F32, device)?,
                false => Tensor::ones(dims, DType::F32, device)?,
            };
            return Ok(Stored::Dense(t));
        }
        let block = self.format.block_size();
        let elements: usize = dims.iter().product();
        if !elements.is_multiple_of(block) {
            return Err(ModelError::TensorShape {
                tensor: name.into(),
                expected: format!("a multiple of {block} elements ({:?} blocks)", self.format),
                found: format!("{dims:?}"),
            });
        }
        if self.tile.is_empty() {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let values: Vec<f32> = (0..TILE_BLOCKS * block)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
                })
                .collect();
            let values = Tensor::from_vec(values, TILE_BLOCKS * block, &Device::Cpu)?;
            self.tile = QTensor::quantize(&values, self.format)?
                .data()?
                .into_owned();
        }
        let bytes = elements / block * self.format.type_size();
        let data: Vec<u8> = self.tile.iter().copied().cycle().take(bytes).collect();
        let storage = QStorage::from_data(Cow::Owned(data), device, self.format)?;
        Ok(Stored::Quant(QTensor::new(storage, dims)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_read_as_the_published_models() {
        let s = DummyShape::resolve("llama3.1-8b", 128_256).unwrap();
        assert_eq!(s.config.architecture, "llama");
        assert_eq!((s.config.head_dim, s.config.block_count), (128, 32));
        assert!(s.config.rope_freq_factors.is_some() && !s.tied);
        // Llama 3.1 8B's published count (its model card: 8,030,261,248).
        assert_eq!(s.parameters(), 8_030_261_248);
        let q = DummyShape::resolve("qwen3-8b", 151_936).unwrap();
        assert!(q.config.qk_norm && q.config.head_dim == 128);
        // A shape runs with the tokenizer's vocabulary and remembers the published one.
        let s = DummyShape::resolve("qwen2.5-7b", 151_936).unwrap();
        assert_eq!((s.config.vocab_size, s.published_vocab), (151_936, 152_064));
        // Llama 3.2 3B: tied, the published 3.21 B parameters.
        let l = DummyShape::resolve("llama3.2-3b", 128_256).unwrap();
        assert!(l.tied && l.config.rope_freq_factors.is_some());
        assert_eq!(l.parameters(), 3_212_749_824);
        // Gemma 3 12B and 27B (the text model of the multimodal folder): five local layers in
        // six with a window of 1,024, linear RoPE scaling on the global ones, 27B's query scale
        // from hidden / heads; 11.77 B and 27.0 B parameters with the published vocabulary
        // (262,208, with the image tokens).
        for (name, scale, billions) in [("gemma3-12b", 256.0, 11.77), ("gemma3-27b", 168.0, 27.01)]
        {
            let g = DummyShape::resolve(name, 262_208).unwrap();
            let w = g.config.sliding_window.unwrap();
            assert_eq!((w.size, w.pattern), (1024, 6), "{name}");
            assert_eq!(g.config.rope_freq_scale, 0.125, "{name}");
            assert_eq!(g.config.attention_scale, 1.0 / f32::sqrt(scale), "{name}");
            let b = g.parameters() as f64 / 1e9;
            assert!((b - billions).abs() < 0.005, "{name}: {b}");
        }
        // Mistral Nemo: heads narrower than hidden / heads (128 against 160), no window.
        let n = DummyShape::resolve("mistral-nemo-12b", 131_072).unwrap();
        assert_eq!((n.config.head_dim, n.config.head_count), (128, 32));
        assert!(n.config.sliding_window.is_none() && !n.tied);
        // Published as 12.2 B parameters.
        assert!(
            (12.2e9..12.3e9).contains(&(n.parameters() as f64)),
            "{}",
            n.parameters()
        );
        let small = DummyShape::resolve("qwen2.5-1.5b", 151_936).unwrap();
        assert!(small.tied && small.config.qkv_bias);
        assert!(matches!(
            DummyShape::resolve("gpt-5", 100),
            Err(ModelError::UnsupportedArchitecture { .. })
        ));
    }

    #[test]
    fn a_dummy_model_runs_a_forward_pass() {
        let shapes = [
            r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_hidden_layers": 2, "max_position_embeddings": 256, "vocab_size": 100}"#,
            // Gemma 3's extra norms, scaled embeddings, tied output and local layers.
            r#"{"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
            "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 6,
            "query_pre_attn_scalar": 32, "max_position_embeddings": 256,
            "rope_local_base_freq": 10000.0, "sliding_window": 2,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "vocab_size": 100}}"#,
        ];
        for (k, json) in shapes.iter().enumerate() {
            let path =
                std::env::temp_dir().join(format!("quarry-dummy-{}-{k}.json", std::process::id()));
            std::fs::write(&path, json).unwrap();
            let shape = DummyShape::resolve(path.to_str().unwrap(), 96).unwrap();
            std::fs::remove_file(&path).unwrap();
            assert_eq!(shape.tied, k == 1, "{json}");
            let model = Llama::dummy(&shape, &Device::Cpu, &ModelOptions::default()).unwrap();
            let mut pool = crate::KvPool::new(model.config(), 16, 4, &Device::Cpu, None).unwrap();
            let mut table = Vec::new();
            assert!(pool.alloc_into(4, &mut table));
            let mut out = crate::Logits::new();
            let tokens = [1u32, 2, 3, 4, 5];
            model
                .forward(
                    &[crate::SeqInput::new(&tokens, 0, &table)],
                    &mut pool,
                    &mut out,
                )
                .unwrap();
            let row = out.last(0);
            assert_eq!(row.len(), 96);
            assert!(row.iter().all(|x| x.is_finite()), "{json}");
        }
    }

    /// The file [`write_gguf`] writes is the model [`Llama::dummy`] runs: loaded back through the
    /// GGUF path, the same logits; and its tensors are the ones the loader reads.
    #[test]
    fn the_written_gguf_is_the_dummy_model() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let tokenizer = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let shapes = [
            r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "max_position_embeddings": 256, "tie_word_embeddings": false,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                             "original_max_position_embeddings": 64}}"#,
            r#"{"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_hidden_layers": 6, "query_pre_attn_scalar": 32,
            "max_position_embeddings": 256, "rope_local_base_freq": 10000.0,
            "sliding_window": 2, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#,
            // Qwen3's long-context YaRN.
            r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_hidden_layers": 2, "max_position_embeddings": 256,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 64}}"#,
        ];
        for (k, json) in shapes.iter().enumerate() {
            let dir =
                std::env::temp_dir().join(format!("quarry-dummy-gguf-{}-{k}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let config = dir.join("config.json");
            std::fs::write(&config, json).unwrap();
            let shape = DummyShape::resolve(config.to_str().unwrap(), 49_152).unwrap();
            let file = dir.join("dummy.gguf");
            write_gguf(&shape, &tokenizer, &Device::Cpu, &file).unwrap();
            let logits = |model: &Llama| {
                let mut pool =
                    crate::KvPool::new(model.config(), 16, 2, &Device::Cpu, None).unwrap();
                let mut table = Vec::new();
                assert!(pool.alloc_into(2, &mut table));
                let mut out = crate::Logits::new();
                let tokens = [1u32, 200, 3000, 40, 5];
                let seq = [crate::SeqInput::new(&tokens, 0, &table)];
                model.forward(&seq, &mut pool, &mut out).unwrap();
                out.last(0).to_vec()
            };
            let options = ModelOptions::default();
            let built = Llama::dummy(&shape, &Device::Cpu, &options).unwrap();
            let loaded = Llama::load_with(&file, &Device::Cpu, &options).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            assert_eq!(loaded.config(), built.config(), "{json}");
            assert_eq!(logits(&loaded), logits(&built), "{json}");
            assert!(logits(&built).iter().any(|x| *x != 0.0));
        }
    }
}
