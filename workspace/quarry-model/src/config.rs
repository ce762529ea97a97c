//! Llama-family hyper-parameters, read from GGUF metadata.
//!
//! Gemma 3 is a llama with a few switches flipped, so it shares the config and the forward pass:
//! a scaled embedding, RoPE over the two halves of each head instead of adjacent pairs, RMS norms
//! over each head's queries and keys, norms of the attention and feed-forward outputs before the
//! residual add, a GELU-gated feed-forward, and local layers that attend over a sliding window with
//! their own RoPE base. Each difference is a field below, set from the architecture as llama.cpp's
//! `llama-model.cpp` sets it.
//!
//! Qwen2 (Qwen2 and Qwen2.5) is a llama with biases on the Q, K and V projections, RoPE over head
//! halves (llama.cpp's NEOX rope type: its converter does not permute Q and K), and an output
//! projection tied to the embeddings in the small models. Qwen3 drops the biases and normalizes
//! each head's queries and keys (Gemma 3's Q/K norms), with heads wider than
//! `embedding_length / head_count` (`attention.key_length`).
//!
//! RoPE is scaled the two ways llama.cpp reads from a GGUF file: linear (`rope.scaling.type =
//! linear`, `rope.scaling.factor`: every angle divided by the factor; Gemma 3 1B–27B scale their
//! global layers so, the local ones not), and per-frequency factors (the `rope_freqs.weight`
//! tensor llama.cpp's converter writes for Llama 3.1/3.2's `rope_scaling` of type `llama3`: each
//! frequency divided by its factor), and YaRN (`rope.scaling.type = yarn`: Qwen2.5's and Qwen3's
//! long-context files; [`Yarn`]). LongRoPE and partial RoPE are refused.

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{ModelError, Result};
use crate::info::{architecture, as_f64, as_u64, invalid};

/// The architectures whose tensors and forward pass [`crate::Llama`] implements.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "gemma3", "qwen2", "qwen3"];

/// How a head's dimensions pair up for RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)`: GGUF llama files (the converter permutes Q and K into this order).
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)` (llama.cpp's NEOX style): Gemma, Qwen2, Qwen3.
    Halves,
}

/// The gate's activation in the gated feed-forward `down(act(gate(x)) · up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU (llama).
    Silu,
    /// GELU, tanh approximation (GeGLU; Gemma).
    GeluTanh,
}

/// Local attention layers, which attend only to the last `size` positions (the query's own
/// included). `pattern` says which layers, as llama.cpp's `set_swa_pattern` does: every
/// `pattern`-th layer is global and the others local (Gemma 3: 6), or with 0 every layer is local
/// (Mistral 7B v0.1's window of 4,096).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SlidingWindow {
    pub size: usize,
    pub pattern: usize,
    /// The local layers' own RoPE base, never scaled (Gemma 3's `rope.freq_base_swa`); `None`:
    /// they rotate as the global layers do (Mistral).
    pub rope_freq_base: Option<f32>,
}

impl SlidingWindow {
    /// Every layer attends over the last `size` positions, with the model's one RoPE.
    pub fn every_layer(size: usize) -> Self {
        Self {
            size,
            pattern: 0,
            rope_freq_base: None,
        }
    }

    fn holds(&self, layer: usize) -> bool {
        self.pattern == 0 || layer % self.pattern < self.pattern - 1
    }
}

/// YaRN RoPE scaling (`rope.scaling.type = yarn`, or a checkpoint's `rope_scaling` of type
/// `yarn`): the long-context files of Qwen2.5 and Qwen3. Each frequency of a scaled layer mixes
/// its interpolated value (times [`LlamaConfig::rope_freq_scale`], `1 / factor`) with its original
/// one, by a ramp over the frequency index ([`Yarn::extrapolation`]), and every cosine and sine is
/// multiplied by [`Yarn::magnitude`], as llama.cpp's `rope_yarn` and transformers'
/// `_compute_yarn_parameters` compute them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Yarn {
    /// The context the model was trained on before its extension
    /// (`rope.scaling.original_context_length`; `original_max_position_embeddings`), in positions.
    pub original_context: f64,
    /// The frequencies that turn more than `beta_fast` times over the original context keep their
    /// value, those turning fewer than `beta_slow` times are interpolated (32 and 1 by default).
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// The ramp's height (llama.cpp's `yarn_ext_factor`: 1 for YaRN unless the file says).
    pub ext_factor: f64,
    /// Multiplier of every cosine and sine of a scaled layer: `1 + 0.1 ln factor` unless the file
    /// or `rope_scaling` names one ([`Yarn::default_magnitude`]).
    pub magnitude: f64,
    /// Whether the ramp's ends are rounded outwards to whole frequency indices (llama.cpp always;
    /// transformers unless `truncate` is false).
    pub truncate: bool,
}

impl Yarn {
    /// The magnitude YaRN gives a scaling `factor` (transformers' `get_mscale`, llama.cpp's
    /// `rope_yarn`): `1 + 0.1 ln factor` above 1, else 1.
    pub fn default_magnitude(factor: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            1.0 + 0.1 * factor.ln()
        }
    }

    /// For each of a head's `head_dim / 2` frequencies at RoPE base `base`, the weight of its
    /// original value against the interpolated one: `ext_factor` below the ramp (the fast
    /// frequencies), 0 above it, linear between the correction dimensions of `beta_fast` and
    /// `beta_slow` rotations over the original context.
    pub fn extrapolation(&self, head_dim: usize, base: f32) -> Vec<f64> {
        let d = head_dim as f64;
        let two_pi = 2.0 * std::f64::consts::PI;
        let dim = |rotations: f64| {
            d * (self.original_context / (rotations * two_pi)).ln() / (2.0 * f64::from(base).ln())
        };
        let (mut low, mut high) = (dim(self.beta_fast), dim(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0), high.min(d - 1.0));
        (0..head_dim / 2)
            .map(|i| {
                let y = (i as f64 - low) / (high - low).max(0.001);
                (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor
            })
            .collect()
    }
}

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
    /// Linear RoPE scaling of the global layers: every angle times this, `1 / rope.scaling.factor`
    /// (1 without scaling; local layers are never scaled, as in llama.cpp).
    pub rope_freq_scale: f32,
    /// Per-frequency RoPE divisors (`head_dim / 2` of them, llama.cpp's `rope_freqs.weight`:
    /// Llama 3.1/3.2's `llama3` scaling), for every layer. Read with the weights
    /// ([`crate::Llama::load`]); `None` in a config read from metadata alone.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// YaRN scaling of the global layers, where the model has it (with `rope_freq_scale` its
    /// `1 / factor`).
    pub rope_yarn: Option<Yarn>,
    pub rms_norm_eps: f32,
    /// The training context; positions at or past it are refused.
    pub context_length: usize,
    pub vocab_size: usize,
    /// Multiplier of the token embeddings: `√embedding_length` for Gemma, else 1.
    pub embedding_scale: f32,
    /// Scale of the query-key dot products, `1/√head_dim` (Gemma 3 27B: `1/√(embedding/heads)`).
    pub attention_scale: f32,
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// RMS norms over each head's queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMS norms of the attention and feed-forward outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Biases added to the Q, K and V projections (`attn_q.bias`, `attn_k.bias`, `attn_v.bias`):
    /// Qwen2.
    pub qkv_bias: bool,
    pub sliding_window: Option<SlidingWindow>,
}

impl LlamaConfig {
    /// The smallest configuration a [`crate::KvPool`] accepts (one layer, one head of two values),
    /// for a model double behind the engine's seam that keeps its own state but must hand the
    /// engine a pool: the scheduler's tests, the engine's step-overhead diagnostic.
    pub fn minimal(architecture: &str, vocab_size: usize, context_length: usize) -> Self {
        LlamaConfig {
            architecture: architecture.into(),
            block_count: 1,
            embedding_length: 2,
            feed_forward_length: 2,
            head_count: 1,
            head_count_kv: 1,
            head_dim: 2,
            rope_freq_base: 10_000.0,
            rope_freq_scale: 1.0,
            rope_freq_factors: None,
            rope_yarn: None,
            rms_norm_eps: 1e-6,
            context_length,
            vocab_size,
            embedding_scale: 1.0,
            attention_scale: 1.0,
            rope_style: RopeStyle::Interleaved,
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            qkv_bias: false,
            sliding_window: None,
        }
    }

    /// Reads the hyper-parameters from GGUF metadata. `vocab_size` comes from the embedding tensor.
    pub fn from_content(content: &Content) -> Result<Self> {
        let architecture = architecture(content)?;
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(ModelError::UnsupportedArchitecture {
                architecture,
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            });
        }
        let keys = Keys {
            content,
            architecture: &architecture,
        };
        let embedding_length = keys.required("embedding_length")?;
        let (head_count, head_count_kv, head_dim) = keys.heads(embedding_length)?;
        let (rope_freq_scale, rope_yarn) = keys.rope_scaling(head_dim)?;
        let vocab_size = vocab_size(content, embedding_length)?;
        let gemma = architecture == "gemma3";
        let qwen2 = architecture == "qwen2";
        let qwen3 = architecture == "qwen3";
        let sliding_window = keys.sliding_window()?;
        let switches = Switches::of(&architecture, embedding_length);
        let block_count = keys.required("block_count")?;
        let attention_scale = if gemma && block_count == 62 {
            // Gemma 3 27B scales by the query width per head, not the head size (as llama.cpp).
            1.0 / ((embedding_length / head_count) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        Ok(Self {
            block_count,
            embedding_length,
            feed_forward_length: keys.required("feed_forward_length")?,
            head_count,
            head_count_kv,
            head_dim,
            rope_freq_base: keys.float("rope.freq_base")?.unwrap_or(10_000.0) as f32,
            rope_freq_scale,
            rope_freq_factors: None,
            rope_yarn,
            rms_norm_eps: keys
                .float("attention.layer_norm_rms_epsilon")?
                .unwrap_or(1e-5) as f32,
            context_length: keys.required("context_length")?,
            vocab_size,
            embedding_scale: switches.embedding_scale,
            attention_scale,
            rope_style: if gemma || qwen2 || qwen3 {
                RopeStyle::Halves
            } else {
                RopeStyle::Interleaved
            },
            activation: switches.activation,
            qk_norm: switches.qk_norm,
            post_norms: switches.post_norms,
            qkv_bias: switches.qkv_bias,
            sliding_window,
            architecture,
        })
    }

    /// Width of one token's keys (or values) in one layer: `head_count_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.head_count_kv * self.head_dim
    }

    /// The positions layer `layer` attends over before a query: its sliding window, or `None` for
    /// all of them.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.local(layer).map(|w| w.size)
    }

    /// How many layers attend over a sliding window (Gemma 3: five in six; Mistral 7B v0.1:
    /// all).
    pub fn sliding_layers(&self) -> usize {
        (0..self.block_count)
            .filter(|&l| self.window(l).is_some())
            .count()
    }

    /// Layer `layer`'s RoPE base.
    pub fn rope_base(&self, layer: usize) -> f32 {
        self.local_rope(layer).unwrap_or(self.rope_freq_base)
    }

    /// Layer `layer`'s own RoPE base, where it is a local layer with one (Gemma 3's); `None`
    /// where the layer rotates by the global layers' angles.
    pub fn local_rope(&self, layer: usize) -> Option<f32> {
        self.local(layer).and_then(|w| w.rope_freq_base)
    }

    /// The angle per position of each of a head's `head_dim / 2` rotations, in the global layers
    /// (`local`: Gemma 3's local ones, with their own base): `scale · base^(-2i/head_dim) /
    /// factor_i`, as llama.cpp's `ggml_rope_ext` computes it, where YaRN's `scale` is frequency
    /// `i`'s mix of `rope_freq_scale` and 1 ([`Yarn::extrapolation`]).
    pub fn rope_frequencies(&self, local: bool) -> Vec<f64> {
        let (base, scale, yarn) = match self.own_local_base(local) {
            Some(b) => (b, 1.0, None),
            None => (self.rope_freq_base, self.rope_freq_scale, self.rope_yarn),
        };
        let keep = yarn.map(|y| y.extrapolation(self.head_dim, base));
        let d = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let factor = self
                    .rope_freq_factors
                    .as_ref()
                    .map_or(1.0, |f| f64::from(f[i]));
                let scale = match &keep {
                    Some(k) => f64::from(scale) * (1.0 - k[i]) + k[i],
                    None => f64::from(scale),
                };
                scale * f64::from(base).powf(-2.0 * i as f64 / d) / factor
            })
            .collect()
    }

    /// The RoPE scaling in words (`quarry info`), `None` without any: YaRN's factor and original
    /// context, a linear factor, Llama 3's per-frequency factors (`factors`: where the config was
    /// read from a header alone, whether the file has `rope_freqs.weight`).
    pub fn rope_scaling_summary(&self, factors: bool) -> Option<String> {
        // In f32, as the scale is held: 1 / (1/3 in f32) prints as 3.
        let factor = 1.0 / self.rope_freq_scale;
        let global = if self
            .sliding_window
            .is_some_and(|w| w.rope_freq_base.is_some())
        {
            " in the global layers"
        } else {
            ""
        };
        let mut parts = Vec::new();
        match self.rope_yarn {
            Some(y) => parts.push(format!(
                "YaRN, factor {factor} over an original context of {}{global}",
                y.original_context
            )),
            None if self.rope_freq_scale != 1.0 => {
                parts.push(format!("linear, factor {factor}{global}"))
            }
            None => {}
        }
        if factors || self.rope_freq_factors.is_some() {
            parts.push("Llama 3's per-frequency factors".into());
        }
        (!parts.is_empty()).then(|| parts.join(" and "))
    }

    /// What every cosine and sine of the global layers' RoPE (`local`: Gemma 3's local ones) is
    /// multiplied by: YaRN's [`Yarn::magnitude`] where it scales them, else 1.
    pub fn rope_magnitude(&self, local: bool) -> f64 {
        match (self.own_local_base(local), self.rope_yarn) {
            (None, Some(y)) => y.magnitude,
            _ => 1.0,
        }
    }

    /// The local layers' own RoPE base, where `local` asks for them and they have one (Gemma 3's).
    fn own_local_base(&self, local: bool) -> Option<f32> {
        self.sliding_window
            .and_then(|w| w.rope_freq_base)
            .filter(|_| local)
    }

    fn local(&self, layer: usize) -> Option<&SlidingWindow> {
        self.sliding_window.as_ref().filter(|w| w.holds(layer))
    }
}

/// What an architecture switches on in the shared forward pass, as llama.cpp's
/// `llama-model.cpp` sets it (the same for a GGUF file and a checkpoint folder).
pub(crate) struct Switches {
    pub(crate) embedding_scale: f32,
    pub(crate) activation: Activation,
    pub(crate) qk_norm: bool,
    pub(crate) post_norms: bool,
    pub(crate) qkv_bias: bool,
}

impl Switches {
    pub(crate) fn of(architecture: &str, embedding_length: usize) -> Self {
        let gemma = architecture == "gemma3";
        Self {
            embedding_scale: if gemma {
                (embedding_length as f32).sqrt()
            } else {
                1.0
            },
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            qk_norm: gemma || architecture == "qwen3",
            post_norms: gemma,
            qkv_bias: architecture == "qwen2",
        }
    }
}

/// An architecture's GGUF metadata keys (`<architecture>.<key>`), read with typed errors that
/// name the key.
struct Keys<'a> {
    content: &'a Content,
    architecture: &'a str,
}

impl Keys<'_> {
    fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.architecture)
    }

    fn get(&self, k: &str) -> Option<(String, &Value)> {
        let key = self.name(k);
        self.content.metadata.get(&key).map(|v| (key, v))
    }

    /// A positive integer, if present.
    fn uint(&self, k: &str) -> Result<Option<usize>> {
        self.get(k)
            .map(|(key, v)| match as_u64(v) {
                Ok(0) => Err(ModelError::InvalidKey {
                    key,
                    message: "must be positive".into(),
                }),
                Ok(x) => Ok(x as usize),
                Err(e) => Err(invalid(&key, e)),
            })
            .transpose()
    }

    fn required(&self, k: &str) -> Result<usize> {
        self.uint(k)?
            .ok_or_else(|| ModelError::MissingKey { key: self.name(k) })
    }

    fn float(&self, k: &str) -> Result<Option<f64>> {
        self.get(k)
            .map(|(key, v)| as_f64(v).map_err(|e| invalid(&key, e)))
            .transpose()
    }

    fn bad(&self, k: &str, message: String) -> ModelError {
        ModelError::InvalidKey {
            key: self.name(k),
            message,
        }
    }

    /// `(head_count, head_count_kv, head_dim)`: grouped queries that divide evenly, values as
    /// wide as keys.
    fn heads(&self, embedding_length: usize) -> Result<(usize, usize, usize)> {
        let head_count = self.required("attention.head_count")?;
        let head_count_kv = self.uint("attention.head_count_kv")?.unwrap_or(head_count);
        let head_dim = match self.uint("attention.key_length")? {
            Some(d) => d,
            None if embedding_length.is_multiple_of(head_count) => embedding_length / head_count,
            None => {
                return Err(self.bad(
                    "attention.head_count",
                    format!(
                        "{head_count} heads do not divide the embedding length {embedding_length}"
                    ),
                ))
            }
        };
        if !head_count.is_multiple_of(head_count_kv) {
            return Err(self.bad(
                "attention.head_count_kv",
                format!("{head_count_kv} KV heads do not divide {head_count} query heads"),
            ));
        }
        if let Some(v) = self.uint("attention.value_length")? {
            if v != head_dim {
                return Err(self.bad(
                    "attention.value_length",
                    format!(
                        "value width {v} differs from key width {head_dim}, which is not supported"
                    ),
                ));
            }
        }
        Ok((head_count, head_count_kv, head_dim))
    }

    /// Full-width RoPE, its scale (`1 / rope.scaling.factor`, 1 without) and YaRN's parameters:
    /// llama.cpp reads a factor under `rope.scaling.factor` or the older `rope.scale_linear`, as
    /// linear unless `rope.scaling.type` says otherwise. YaRN's ramp and magnitude are read
    /// with llama.cpp's defaults (an original context of `context_length`, betas 32 and 1, a
    /// magnitude of `1 + 0.1 ln factor`), and where the file names them (`yarn_beta_fast`,
    /// `yarn_beta_slow`, `yarn_ext_factor`, `yarn_attn_factor`: llama.cpp's converter writes them
    /// from a checkpoint's `rope_scaling`, which llama.cpp 0.3.36 then ignores) as the file says.
    /// LongRoPE changes every position's rotation in ways quarry does not implement, and running
    /// such a model with plain RoPE would be silently wrong: refused, as is a
    /// `rope.scaling.attn_factor` other than 1 outside YaRN.
    fn rope_scaling(&self, head_dim: usize) -> Result<(f32, Option<Yarn>)> {
        let rope_dim = self.uint("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim != head_dim || !head_dim.is_multiple_of(2) {
            return Err(self.bad(
                "rope.dimension_count",
                format!(
                    "RoPE over {rope_dim} of {head_dim} head dimensions is not supported (only full, even widths)"
                ),
            ));
        }
        let scaling = self
            .content
            .metadata
            .get(&self.name("rope.scaling.type"))
            .and_then(|v| v.to_string().ok().cloned());
        let factor = match scaling.as_deref() {
            Some("none") => None,
            None | Some("linear") | Some("yarn") => match self.float("rope.scaling.factor")? {
                Some(f) => Some(("rope.scaling.factor", f)),
                None => self
                    .float("rope.scale_linear")?
                    .map(|f| ("rope.scale_linear", f)),
            },
            Some(kind) => {
                return Err(self.bad(
                    "rope.scaling.type",
                    format!("RoPE scaling `{kind}` is not supported (none, linear and yarn are)"),
                ))
            }
        };
        let factor = match factor {
            // llama.cpp reads 0 as no scaling.
            None | Some((_, 0.0)) => 1.0,
            Some((_, f)) if f.is_finite() && f > 0.0 => f,
            Some((key, f)) => return Err(self.bad(key, format!("a RoPE scaling factor of {f}"))),
        };
        let attn_factor = self.positive("rope.scaling.attn_factor", 1.0)?;
        if scaling.as_deref() != Some("yarn") {
            if attn_factor != 1.0 {
                return Err(self.bad(
                    "rope.scaling.attn_factor",
                    format!(
                        "{attn_factor}: a RoPE magnitude other than 1 is supported with YaRN only"
                    ),
                ));
            }
            return Ok(((1.0 / factor) as f32, None));
        }
        let yarn = Yarn {
            original_context: match self.uint("rope.scaling.original_context_length")? {
                Some(n) => n as f64,
                None => self.required("context_length")? as f64,
            },
            beta_fast: self.positive("rope.scaling.yarn_beta_fast", 32.0)?,
            beta_slow: self.positive("rope.scaling.yarn_beta_slow", 1.0)?,
            ext_factor: match self.float("rope.scaling.yarn_ext_factor")? {
                Some(x) if x.is_finite() && x >= 0.0 => x,
                Some(x) => {
                    return Err(self.bad(
                        "rope.scaling.yarn_ext_factor",
                        format!("{x} is not a number of at least 0"),
                    ))
                }
                None => 1.0,
            },
            magnitude: attn_factor
                * self.positive(
                    "rope.scaling.yarn_attn_factor",
                    Yarn::default_magnitude(factor),
                )?,
            truncate: true,
        };
        Ok(((1.0 / factor) as f32, Some(yarn)))
    }

    /// A positive number under `k`, `default` where absent.
    fn positive(&self, k: &str, default: f64) -> Result<f64> {
        match self.float(k)? {
            None => Ok(default),
            Some(x) if x.is_finite() && x > 0.0 => Ok(x),
            Some(x) => Err(self.bad(k, format!("{x} is not a positive number"))),
        }
    }

    /// Gemma 3's local layers: llama.cpp's pattern of five local layers to one global, the local
    /// RoPE base `rope.freq_base_swa` (10,000 when absent, whatever the global layers' base). A
    /// llama's window slides in every layer, as Mistral 7B v0.1 was trained (llama.cpp's
    /// converter writes no window for it, and llama.cpp reads none for `llama`: a file that has
    /// one says what its model needs).
    fn sliding_window(&self) -> Result<Option<SlidingWindow>> {
        let Some(size) = self.uint("attention.sliding_window")? else {
            return Ok(None);
        };
        match self.architecture {
            "gemma3" => Ok(Some(SlidingWindow {
                size,
                pattern: 6,
                rope_freq_base: Some(self.float("rope.freq_base_swa")?.unwrap_or(10_000.0) as f32),
            })),
            "llama" => Ok(Some(SlidingWindow::every_layer(size))),
            _ => Err(self.bad(
                "attention.sliding_window",
                "sliding-window attention is supported for gemma3 and llama (every layer)".into(),
            )),
        }
    }
}

/// The vocabulary size, from the token embedding's shape (`[vocab, embedding_length]`).
fn vocab_size(content: &Content, embedding_length: usize) -> Result<usize> {
    let embd = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor {
            tensor: "token_embd.weight".into(),
        })?;
    match embd.shape.dims() {
        [v, d] if *d == embedding_length && *v > 0 => Ok(*v),
        dims => Err(ModelError::TensorShape {
            tensor: "token_embd.weight".into(),
            expected: format!("[vocab, {embedding_length}]"),
            found: format!("{dims:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::{TensorInfo, VersionedMagic};
    use candle_core::quantized::GgmlDType;

    use super::*;

    /// A llama header of 8 heads over 64 dimensions, 2 KV heads, with `extra` keys on top.
    fn content(extra: &[(&str, Value)]) -> Content {
        let mut metadata: HashMap<String, Value> = [
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.attention.head_count", Value::U32(8)),
            ("llama.attention.head_count_kv", Value::U32(2)),
            ("llama.block_count", Value::U32(2)),
            ("llama.feed_forward_length", Value::U32(128)),
            ("llama.context_length", Value::U32(256)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            metadata.insert(k.to_string(), v.clone());
        }
        let embd = TensorInfo {
            ggml_dtype: GgmlDType::F32,
            shape: candle_core::Shape::from((100, 64)),
            offset: 0,
        };
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: [("token_embd.weight".to_string(), embd)].into(),
            tensor_data_offset: 0,
        }
    }

    fn refused_key(extra: &[(&str, Value)]) -> String {
        match LlamaConfig::from_content(&content(extra)) {
            Err(ModelError::InvalidKey { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn a_header_reads_into_its_config_and_each_bad_key_is_named() {
        let c = LlamaConfig::from_content(&content(&[])).unwrap();
        assert_eq!((c.head_count, c.head_count_kv, c.head_dim), (8, 2, 8));
        assert_eq!((c.vocab_size, c.context_length), (100, 256));
        assert!(c.sliding_window.is_none());
        let cases: [(&[(&str, Value)], &str); 5] = [
            (
                &[("llama.attention.head_count_kv", Value::U32(3))],
                "llama.attention.head_count_kv",
            ),
            (
                &[("llama.attention.value_length", Value::U32(16))],
                "llama.attention.value_length",
            ),
            (
                &[("llama.rope.dimension_count", Value::U32(4))],
                "llama.rope.dimension_count",
            ),
            (
                &[("llama.rope.scaling.type", Value::String("longrope".into()))],
                "llama.rope.scaling.type",
            ),
            (
                &[("llama.attention.sliding_window", Value::U32(0))],
                "llama.attention.sliding_window",
            ),
        ];
        for (extra, key) in cases {
            assert_eq!(refused_key(extra), key);
        }
        let missing = content(&[]);
        let mut missing = missing;
        missing.metadata.remove("llama.block_count");
        assert!(matches!(
            LlamaConfig::from_content(&missing),
            Err(ModelError::MissingKey { key }) if key == "llama.block_count"
        ));
    }

    #[test]
    fn rope_scaling_reads_as_llama_cpp_reads_it() {
        let scale = |extra: &[(&str, Value)]| {
            LlamaConfig::from_content(&content(extra))
                .unwrap()
                .rope_freq_scale
        };
        let linear = Value::String("linear".into());
        assert_eq!(scale(&[]), 1.0);
        assert_eq!(
            scale(&[
                ("llama.rope.scaling.type", linear.clone()),
                ("llama.rope.scaling.factor", Value::F32(8.0)),
            ]),
            0.125
        );
        // No type is linear; the older key; 0 is no scaling; `none` ignores a factor.
        assert_eq!(
            scale(&[("llama.rope.scaling.factor", Value::F32(2.0))]),
            0.5
        );
        assert_eq!(scale(&[("llama.rope.scale_linear", Value::F32(4.0))]), 0.25);
        assert_eq!(
            scale(&[("llama.rope.scaling.factor", Value::F32(0.0))]),
            1.0
        );
        assert_eq!(
            scale(&[
                ("llama.rope.scaling.type", Value::String("none".into())),
                ("llama.rope.scaling.factor", Value::F32(8.0)),
            ]),
            1.0
        );
        assert_eq!(
            refused_key(&[
                ("llama.rope.scaling.type", linear),
                ("llama.rope.scaling.factor", Value::F32(-2.0)),
            ]),
            "llama.rope.scaling.factor"
        );
    }

    #[test]
    fn yarn_reads_as_llama_cpp_reads_it() {
        let yarn = |extra: &[(&str, Value)]| {
            let mut keys = vec![
                ("llama.rope.scaling.type", Value::String("yarn".into())),
                ("llama.rope.scaling.factor", Value::F32(4.0)),
            ];
            keys.extend_from_slice(extra);
            let c = LlamaConfig::from_content(&content(&keys)).unwrap();
            (c.rope_freq_scale, c.rope_yarn.expect("yarn read"))
        };
        // llama.cpp's defaults: the model's context as the original one, betas 32 and 1, a ramp
        // of height 1, a magnitude of 1 + 0.1 ln factor.
        let (scale, y) = yarn(&[]);
        assert_eq!(scale, 0.25);
        assert_eq!(
            y,
            Yarn {
                original_context: 256.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                ext_factor: 1.0,
                magnitude: 1.0 + 0.1 * 4f64.ln(),
                truncate: true,
            }
        );
        let (_, y) = yarn(&[
            ("llama.rope.scaling.original_context_length", Value::U32(64)),
            ("llama.rope.scaling.yarn_beta_fast", Value::F32(16.0)),
            ("llama.rope.scaling.yarn_attn_factor", Value::F32(1.5)),
            ("llama.rope.scaling.attn_factor", Value::F32(2.0)),
        ]);
        assert_eq!(
            (y.original_context, y.beta_fast, y.magnitude),
            (64.0, 16.0, 3.0)
        );
        let refused = [
            ("llama.rope.scaling.yarn_beta_slow", Value::F32(-1.0)),
            ("llama.rope.scaling.yarn_ext_factor", Value::F32(f32::NAN)),
            ("llama.rope.scaling.original_context_length", Value::U32(0)),
        ];
        for (key, v) in refused {
            let keys = [
                ("llama.rope.scaling.type", Value::String("yarn".into())),
                (key, v),
            ];
            assert_eq!(refused_key(&keys), key);
        }
        // A magnitude outside YaRN would change every rotation's length: refused.
        assert_eq!(
            refused_key(&[("llama.rope.scaling.attn_factor", Value::F32(2.0))]),
            "llama.rope.scaling.attn_factor"
        );
    }

    /// The ramp worked out by hand for heads of 8 (4 frequencies) at base 10,000 and an original
    /// context of 64: the correction dimensions of 32 and 1 rotations are 8·ln(64 / 32·2π) /
    /// 2·ln 10⁴ = -0.50 and 8·ln(64 / 2π) / 2·ln 10⁴ = 1.008, rounded out to 0 and 2: frequency 0
    /// keeps its value, 1 keeps half of it, 2 and 3 are interpolated (times 1/4).
    #[test]
    fn yarn_mixes_each_frequency_by_its_ramp_and_scales_the_magnitude() {
        let mut c = LlamaConfig::from_content(&content(&[])).unwrap();
        c.rope_freq_base = 10_000.0;
        let plain = c.rope_frequencies(false);
        c.rope_freq_scale = 0.25;
        let y = Yarn {
            original_context: 64.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            ext_factor: 1.0,
            magnitude: 1.0 + 0.1 * 4f64.ln(),
            truncate: true,
        };
        c.rope_yarn = Some(y);
        let keep = y.extrapolation(c.head_dim, c.rope_freq_base);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        let want_keep = [1.0, 0.5, 0.0, 0.0];
        assert!(
            keep.iter().zip(want_keep).all(|(k, w)| close(*k, w)),
            "{keep:?}"
        );
        let f = c.rope_frequencies(false);
        for (i, k) in want_keep.into_iter().enumerate() {
            let want = plain[i] * (0.25 * (1.0 - k) + k);
            assert!(close(f[i], want), "frequency {i}: {} against {want}", f[i]);
        }
        assert_eq!(c.rope_magnitude(false), 1.0 + 0.1 * 4f64.ln());
        // Without truncation the ends stay where they fall (0 and 1.008): frequency 1 keeps
        // 1 - 1/1.008 of its value.
        c.rope_yarn = Some(Yarn {
            truncate: false,
            ..y
        });
        let untruncated = c.rope_frequencies(false);
        let k1 = 1.0 - 1.0 / (8.0 * (64.0 / std::f64::consts::TAU).ln() / (2.0 * 10_000f64.ln()));
        assert!(close(untruncated[1], plain[1] * (0.25 * (1.0 - k1) + k1)));
        assert!(untruncated[0] == f[0] && untruncated[3] == f[3]);
        // Gemma 3's local layers, with their own base, are neither mixed nor scaled.
        c.rope_yarn = Some(y);
        c.sliding_window = Some(SlidingWindow {
            size: 4,
            pattern: 6,
            rope_freq_base: Some(c.rope_freq_base),
        });
        assert_eq!(
            (c.rope_frequencies(true), c.rope_magnitude(true)),
            (plain, 1.0)
        );
    }

    #[test]
    fn the_scaling_summary_names_each_kind_and_prints_the_factor_as_written() {
        let mut c = LlamaConfig::from_content(&content(&[])).unwrap();
        assert_eq!(c.rope_scaling_summary(false), None);
        assert_eq!(
            c.rope_scaling_summary(true).as_deref(),
            Some("Llama 3's per-frequency factors")
        );
        c.rope_freq_scale = (1.0 / 3.0f64) as f32;
        assert_eq!(
            c.rope_scaling_summary(false).as_deref(),
            Some("linear, factor 3")
        );
        c.rope_yarn = Some(Yarn {
            original_context: 32_768.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            ext_factor: 1.0,
            magnitude: Yarn::default_magnitude(3.0),
            truncate: true,
        });
        assert_eq!(
            c.rope_scaling_summary(false).as_deref(),
            Some("YaRN, factor 3 over an original context of 32768")
        );
    }

    #[test]
    fn rope_frequencies_take_the_scale_and_the_factors_in_global_layers_only() {
        let mut c = LlamaConfig::from_content(&content(&[])).unwrap();
        let plain = c.rope_frequencies(false);
        assert_eq!(plain.len(), c.head_dim / 2);
        assert!(plain.windows(2).all(|w| w[1] < w[0]) && plain[0] == 1.0);
        c.rope_freq_scale = 0.25;
        let f = c.rope_frequencies(false);
        assert!(f.iter().zip(&plain).all(|(s, p)| *s == p * 0.25));
        c.rope_freq_factors = Some(vec![1.0, 2.0, 4.0, 8.0]);
        let g = c.rope_frequencies(false);
        for (i, d) in [1.0, 2.0, 4.0, 8.0].into_iter().enumerate() {
            assert_eq!(g[i], f[i] / d, "frequency {i}");
        }
        // Gemma 3's local layers: their own base, never scaled.
        c.sliding_window = Some(SlidingWindow {
            size: 4,
            pattern: 6,
            rope_freq_base: Some(c.rope_freq_base),
        });
        c.rope_freq_factors = None;
        assert_eq!(c.rope_frequencies(true), plain);
        assert_eq!(c.rope_frequencies(false), f);
        // Mistral's: the global layers' angles, scale included.
        c.sliding_window = Some(SlidingWindow::every_layer(4));
        assert_eq!(c.rope_frequencies(true), f);
    }

    #[test]
    fn a_llama_window_slides_in_every_layer_and_other_architectures_refuse_one() {
        let c = LlamaConfig::from_content(&content(&[(
            "llama.attention.sliding_window",
            Value::U32(512),
        )]))
        .unwrap();
        for layer in 0..c.block_count {
            assert_eq!(c.window(layer), Some(512), "layer {layer}");
            assert_eq!(c.rope_base(layer), c.rope_freq_base, "layer {layer}");
            assert_eq!(c.local_rope(layer), None, "layer {layer}");
        }
        // Gemma 3's pattern: five local layers with their own base, then a global one.
        let mut g = c.clone();
        g.sliding_window = Some(SlidingWindow {
            size: 512,
            pattern: 6,
            rope_freq_base: Some(10_000.0),
        });
        let local: Vec<bool> = (0..12).map(|l| g.window(l).is_some()).collect();
        assert_eq!(local, [true, true, true, true, true, false].repeat(2));
        assert_eq!((g.local_rope(0), g.local_rope(5)), (Some(10_000.0), None));
        // Qwen2 has no sliding window in llama.cpp's reading (nor in any released Qwen2.5).
        let mut qwen = content(&[]);
        let renamed: HashMap<String, Value> = qwen
            .metadata
            .drain()
            .map(|(k, v)| (k.replacen("llama.", "qwen2.", 1), v))
            .collect();
        qwen.metadata = renamed;
        qwen.metadata
            .insert("general.architecture".into(), Value::String("qwen2".into()));
        assert!(LlamaConfig::from_content(&qwen).is_ok());
        qwen.metadata
            .insert("qwen2.attention.sliding_window".into(), Value::U32(512));
        assert!(matches!(
            LlamaConfig::from_content(&qwen),
            Err(ModelError::InvalidKey { key, .. }) if key == "qwen2.attention.sliding_window"
        ));
    }
}
