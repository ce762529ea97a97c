//! Llama-family hyper-parameters, read from GGUF metadata.

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{ModelError, Result};
use crate::info::{architecture, as_f64, as_u64, invalid};

/// The architectures whose tensors and forward pass [`crate::Llama`] implements.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

/// What the forward pass needs to know about a llama-architecture model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlamaConfig {
    pub architecture: String,
    pub block_count: usize,
    pub embedding_length: usize,
    pub feed_forward_length: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    /// Per-head width of queries and keys (`attention.key_length`, default `embedding_length / head_count`).
    pub head_dim: usize,
    pub rope_freq_base: f32,
    pub rms_norm_eps: f32,
    /// The training context; positions at or past it are refused.
    pub context_length: usize,
    pub vocab_size: usize,
}

impl LlamaConfig {
    /// Reads the hyper-parameters from GGUF metadata. `vocab_size` comes from the embedding tensor.
    pub fn from_content(content: &Content) -> Result<Self> {
        let md = &content.metadata;
        let architecture = architecture(content)?;
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(ModelError::UnsupportedArchitecture {
                architecture,
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            });
        }
        let get = |k: &str| -> Option<(String, &Value)> {
            let key = format!("{architecture}.{k}");
            md.get(&key).map(|v| (key, v))
        };
        let uint = |k: &str| -> Result<Option<usize>> {
            get(k)
                .map(|(key, v)| match as_u64(v) {
                    Ok(0) => Err(ModelError::InvalidKey {
                        key,
                        message: "must be positive".into(),
                    }),
                    Ok(x) => Ok(x as usize),
                    Err(e) => Err(invalid(&key, e)),
                })
                .transpose()
        };
        let required = |k: &str| -> Result<usize> {
            uint(k)?.ok_or_else(|| ModelError::MissingKey {
                key: format!("{architecture}.{k}"),
            })
        };
        let float = |k: &str| -> Result<Option<f64>> {
            get(k)
                .map(|(key, v)| as_f64(v).map_err(|e| invalid(&key, e)))
                .transpose()
        };
        let embedding_length = required("embedding_length")?;
        let head_count = required("attention.head_count")?;
        let head_count_kv = uint("attention.head_count_kv")?.unwrap_or(head_count);
        let head_dim = match uint("attention.key_length")? {
            Some(d) => d,
            None if embedding_length % head_count == 0 => embedding_length / head_count,
            None => {
                return Err(ModelError::InvalidKey {
                    key: format!("{architecture}.attention.head_count"),
                    message: format!(
                        "{head_count} heads do not divide the embedding length {embedding_length}"
                    ),
                })
            }
        };
        if head_count % head_count_kv != 0 {
            return Err(ModelError::InvalidKey {
                key: format!("{architecture}.attention.head_count_kv"),
                message: format!("{head_count_kv} KV heads do not divide {head_count} query heads"),
            });
        }
        if let Some(v) = uint("attention.value_length")? {
            if v != head_dim {
                return Err(ModelError::InvalidKey {
                    key: format!("{architecture}.attention.value_length"),
                    message: format!(
                        "value width {v} differs from key width {head_dim}, which is not supported"
                    ),
                });
            }
        }
        let rope_dim = uint("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim != head_dim || head_dim % 2 != 0 {
            return Err(ModelError::InvalidKey {
                key: format!("{architecture}.rope.dimension_count"),
                message: format!(
                    "RoPE over {rope_dim} of {head_dim} head dimensions is not supported (only full, even widths)"
                ),
            });
        }
        // Scaled RoPE (Llama 3.1's `rope_freqs`, linear or YaRN scaling) changes every position's
        // rotation; running such a model with plain RoPE would be silently wrong.
        let scaling = md
            .get(&format!("{architecture}.rope.scaling.type"))
            .and_then(|v| v.to_string().ok().cloned());
        if let Some(kind) = scaling.filter(|k| k != "none") {
            return Err(ModelError::InvalidKey {
                key: format!("{architecture}.rope.scaling.type"),
                message: format!("RoPE scaling `{kind}` is not supported"),
            });
        }
        if content.tensor_infos.contains_key("rope_freqs.weight") {
            return Err(ModelError::InvalidKey {
                key: "rope_freqs.weight".into(),
                message: "per-frequency RoPE factors (Llama 3.1 style) are not supported".into(),
            });
        }
        let embd = content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: "token_embd.weight".into(),
            })?;
        let vocab_size = match embd.shape.dims() {
            [v, d] if *d == embedding_length && *v > 0 => *v,
            dims => {
                return Err(ModelError::TensorShape {
                    tensor: "token_embd.weight".into(),
                    expected: format!("[vocab, {embedding_length}]"),
                    found: format!("{dims:?}"),
                })
            }
        };
        Ok(Self {
            block_count: required("block_count")?,
            embedding_length,
            feed_forward_length: required("feed_forward_length")?,
            head_count,
            head_count_kv,
            head_dim,
            rope_freq_base: float("rope.freq_base")?.unwrap_or(10_000.0) as f32,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32,
            context_length: required("context_length")?,
            vocab_size,
            architecture,
        })
    }

    /// Width of one token's keys (or values) in one layer: `head_count_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.head_count_kv * self.head_dim
    }
}
