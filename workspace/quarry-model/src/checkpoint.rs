//! Hugging Face checkpoint folders: `config.json` for the architecture, the weights in
//! safetensors (`model.safetensors`, or the shards `model.safetensors.index.json` names),
//! memory-mapped through candle. Each tensor is read under llama.cpp's name and converted as
//! llama.cpp's converter converts it, so that the forward pass is the GGUF one:
//!
//! - names: `model.layers.N.self_attn.q_proj.weight` is `blk.N.attn_q.weight`, and so on
//!   ([`Checkpoint::hf_name`]); multimodal Gemma 3 folders keep the text model under
//!   `model.language_model.` (or `language_model.model.`), which is found by its embeddings;
//! - RoPE: a checkpoint's queries and keys rotate head halves (transformers' `rotate_half`) in
//!   every architecture; llama.cpp permutes a llama's Q and K rows into adjacent pairs instead,
//!   which is the same rotation, so a checkpoint needs no permutation, only
//!   [`RopeStyle::Halves`];
//! - Gemma 3's RMS norms scale by `1 + w`; llama.cpp stores `1 + w`, so 1 is added here;
//! - RoPE scaling from `rope_scaling` (or `rope_parameters`): `linear` (a scale), `llama3` (the
//!   per-frequency factors, computed as Meta publishes them: [`llama3_factors`]), `yarn`
//!   ([`crate::Yarn`], with transformers' defaults and its `attention_factor`, `mscale` and
//!   `truncate`);
//! - the values: bf16, f16 or f32, read in their own type ([`crate::weights::Stored::Dense`]);
//!   a CPU multiplies them in f32 (what the F32 GGUF path does, checked against llama.cpp), a GPU
//!   in f16 from bf16 and f16 (exact: bf16's 8-bit significand fits f16's 11, within f16's range)
//!   and in f32 from f32. Norms are f32 everywhere.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device};
use serde_json::Value;

use crate::config::{LlamaConfig, RopeStyle, SlidingWindow, Switches, Yarn};
use crate::error::{without_backtrace, ModelError, Result};
use crate::weights::{Stored, Weights};

/// The `model_type`s a checkpoint may have, and the architecture each runs as.
pub const CHECKPOINT_TYPES: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("mistral", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("gemma3_text", "gemma3"),
    ("gemma3", "gemma3"),
];

/// Where the text model's tensors may live in a checkpoint: a text-only model, then the
/// multimodal Gemma 3 layouts of recent and older transformers.
const PREFIXES: [&str; 3] = ["model.", "model.language_model.", "language_model.model."];

/// An opened checkpoint folder.
pub struct Checkpoint {
    dir: PathBuf,
    config: LlamaConfig,
    tensors: MmapedSafetensors,
    /// The text model's prefix ([`PREFIXES`]).
    prefix: &'static str,
    /// Names of every tensor in the safetensors files.
    names: std::collections::HashSet<String>,
}

impl Checkpoint {
    /// Reads `dir/config.json` and maps the safetensors files.
    pub fn open(dir: &Path) -> Result<Self> {
        let bad = |message: String| ModelError::Checkpoint {
            path: dir.to_owned(),
            message,
        };
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| bad(format!("config.json is not JSON: {e}")))?;
        let files = safetensors_files(dir)?;
        // SAFETY: the files are mapped read-only; a file changed on disk while a model is loaded
        // from it is outside what any loader can guard against (candle's and transformers' alike).
        let tensors = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
            bad(format!(
                "the safetensors files do not read: {}",
                without_backtrace(e)
            ))
        })?;
        let names: std::collections::HashSet<String> =
            tensors.tensors().into_iter().map(|(n, _)| n).collect();
        let prefix = PREFIXES
            .into_iter()
            .find(|p| names.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| {
                bad("no `model.embed_tokens.weight` (nor a multimodal model's) in the safetensors files".into())
            })?;
        let vocab = tensors
            .get(&format!("{prefix}embed_tokens.weight"))
            .map(|v| v.shape().first().copied().unwrap_or(0))
            .unwrap_or(0);
        let config = config_from_json(&json, vocab)?;
        Ok(Self {
            dir: dir.to_owned(),
            config,
            tensors,
            prefix,
            names,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder as `quarry info` shows a model: the config's hyper-parameters, and the
    /// safetensors files' tensors, sizes and element types.
    pub fn info(&self) -> crate::ModelInfo {
        let c = &self.config;
        let mut tensor_dtypes = std::collections::BTreeMap::new();
        let mut parameter_count = 0u64;
        for (_, view) in self.tensors.tensors() {
            *tensor_dtypes
                .entry(format!("{:?}", view.dtype()))
                .or_insert(0) += 1;
            parameter_count += view.shape().iter().product::<usize>() as u64;
        }
        let file_bytes = safetensors_files(&self.dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        crate::ModelInfo {
            architecture: c.architecture.clone(),
            name: self
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
            gguf_version: 0,
            file_bytes,
            context_length: Some(c.context_length as u64),
            embedding_length: Some(c.embedding_length as u64),
            block_count: Some(c.block_count as u64),
            feed_forward_length: Some(c.feed_forward_length as u64),
            head_count: Some(c.head_count as u64),
            head_count_kv: Some(c.head_count_kv as u64),
            rope_freq_base: Some(f64::from(c.rope_freq_base)),
            rope_scaling: c.rope_scaling_summary(false),
            rms_norm_eps: Some(f64::from(c.rms_norm_eps)),
            sliding_window: c.sliding_window.map(|w| w.size as u64),
            sliding_layers: Some(c.sliding_layers() as u64),
            tensor_count: self.names.len(),
            parameter_count,
            tensor_dtypes,
        }
    }

    /// The checkpoint's name for llama.cpp's tensor `gguf`, or `None` for a tensor a checkpoint
    /// never has (`rope_freqs.weight`: computed from the config).
    pub fn hf_name(&self, gguf: &str) -> Option<String> {
        hf_name(self.prefix, self.config.architecture == "gemma3", gguf)
    }
}

/// The checkpoint name of llama.cpp's tensor `gguf` in a text model under `p` ([`PREFIXES`]),
/// Gemma 3's (`gemma`) or another's.
fn hf_name(p: &str, gemma: bool, gguf: &str) -> Option<String> {
    {
        match gguf {
            "token_embd.weight" => return Some(format!("{p}embed_tokens.weight")),
            "output_norm.weight" => return Some(format!("{p}norm.weight")),
            // The output projection sits beside the text model, not in it.
            "output.weight" => {
                return Some(match p {
                    "language_model.model." => "language_model.lm_head.weight".into(),
                    _ => "lm_head.weight".into(),
                })
            }
            _ => {}
        }
        let rest = gguf.strip_prefix("blk.")?;
        let (layer, name) = rest.split_once('.')?;
        let hf = match name {
            "attn_norm.weight" => "input_layernorm.weight",
            "attn_q.weight" => "self_attn.q_proj.weight",
            "attn_k.weight" => "self_attn.k_proj.weight",
            "attn_v.weight" => "self_attn.v_proj.weight",
            "attn_q.bias" => "self_attn.q_proj.bias",
            "attn_k.bias" => "self_attn.k_proj.bias",
            "attn_v.bias" => "self_attn.v_proj.bias",
            "attn_output.weight" => "self_attn.o_proj.weight",
            "attn_q_norm.weight" => "self_attn.q_norm.weight",
            "attn_k_norm.weight" => "self_attn.k_norm.weight",
            // Gemma 3 normalizes the attention's output here; a llama the feed-forward's input.
            "post_attention_norm.weight" if gemma => "post_attention_layernorm.weight",
            "ffn_norm.weight" if gemma => "pre_feedforward_layernorm.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
            "ffn_gate.weight" => "mlp.gate_proj.weight",
            "ffn_up.weight" => "mlp.up_proj.weight",
            "ffn_down.weight" => "mlp.down_proj.weight",
            _ => return None,
        };
        Some(format!("{p}layers.{layer}.{hf}"))
    }
}

impl Weights for Checkpoint {
    fn has(&self, name: &str) -> bool {
        self.hf_name(name).is_some_and(|n| self.names.contains(&n))
    }

    fn stored_type(&self, name: &str) -> Option<GgmlDType> {
        let view = self.tensors.get(&self.hf_name(name)?).ok()?;
        match view.dtype() {
            safetensors::Dtype::BF16 => Some(GgmlDType::BF16),
            safetensors::Dtype::F16 => Some(GgmlDType::F16),
            _ => Some(GgmlDType::F32),
        }
    }

    fn tensor(&mut self, name: &str, _: &[usize], device: &Device) -> Result<Stored> {
        let hf = self
            .hf_name(name)
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.into(),
            })?;
        let load_err = |e: candle_core::Error| ModelError::LoadTensor {
            tensor: hf.clone(),
            source: Box::new(without_backtrace(e)),
        };
        let mut t = self.tensors.load(&hf, &Device::Cpu).map_err(load_err)?;
        // Anything but bf16 and f16 (f32, f64, integers) is read as f32; norms always are.
        if !matches!(t.dtype(), DType::BF16 | DType::F16) || name.contains("norm") {
            t = t.to_dtype(DType::F32).map_err(load_err)?;
        }
        if self.config.architecture == "gemma3" && name.contains("norm") {
            t = (t + 1.0).map_err(load_err)?;
        }
        Ok(Stored::Dense(t.to_device(device).map_err(load_err)?))
    }
}

impl crate::ModelInfo {
    /// What a GGUF file's header says ([`crate::ModelInfo::from_gguf`]), or a Hugging Face
    /// checkpoint folder's `config.json` and safetensors headers ([`Checkpoint::info`]). (Here
    /// rather than in `info.rs`, which the config reader below it imports.)
    pub fn from_model(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Ok(Checkpoint::open(path)?.info());
        }
        let (content, file_bytes, _) = crate::info::read_gguf(path)?;
        let mut info = Self::from_content(&content, file_bytes)?;
        // Which layers slide and how RoPE is scaled are the architecture's to say; a file quarry
        // cannot run keeps `None`.
        if let Ok(c) = LlamaConfig::from_content(&content) {
            info.sliding_window = c.sliding_window.map(|w| w.size as u64);
            info.sliding_layers = Some(c.sliding_layers() as u64);
            let factors = content.tensor_infos.contains_key("rope_freqs.weight");
            info.rope_scaling = c.rope_scaling_summary(factors);
        }
        Ok(info)
    }
}

impl crate::Footprint {
    /// What the weights of the GGUF file or checkpoint folder at `path` take on a GPU in each
    /// form, from its header alone (no weights read).
    pub fn of_model(path: impl AsRef<Path>) -> Result<Self> {
        from_header(path.as_ref(), |c, ty| Self::of(c, ty))
    }
}

impl crate::HostFootprint {
    /// What the weights of the GGUF file or checkpoint folder at `path` take in a CPU's memory
    /// in each form, from its header alone (no weights read).
    pub fn of_model(path: impl AsRef<Path>) -> Result<Self> {
        from_header(path.as_ref(), |c, ty| Self::of(c, ty))
    }
}

/// `f` of the config and the tensors' stored types of the GGUF file or checkpoint folder at
/// `path`, read from its header.
fn from_header<T>(
    path: &Path,
    f: impl Fn(&LlamaConfig, &dyn Fn(&str) -> Option<GgmlDType>) -> T,
) -> Result<T> {
    if path.is_dir() {
        let c = Checkpoint::open(path)?;
        return Ok(f(&c.config, &|n| c.stored_type(n)));
    }
    let (content, _, _) = crate::info::read_gguf(path)?;
    let config = LlamaConfig::from_content(&content)?;
    Ok(f(&config, &|n| {
        content.tensor_infos.get(n).map(|t| t.ggml_dtype)
    }))
}

/// `model.safetensors`, or every shard `model.safetensors.index.json` names (in its order, each
/// once).
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index_path = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index_path).map_err(|_| ModelError::Checkpoint {
        path: dir.to_owned(),
        message: "neither model.safetensors nor model.safetensors.index.json is there".into(),
    })?;
    let index: Value = serde_json::from_str(&text).map_err(|e| ModelError::Checkpoint {
        path: index_path.clone(),
        message: format!("not JSON: {e}"),
    })?;
    let map = index["weight_map"]
        .as_object()
        .ok_or_else(|| ModelError::Checkpoint {
            path: index_path.clone(),
            message: "no `weight_map` object".into(),
        })?;
    let mut files: Vec<PathBuf> = Vec::new();
    for shard in map.values() {
        let name = shard.as_str().ok_or_else(|| ModelError::Checkpoint {
            path: index_path.clone(),
            message: format!("a shard name that is not a string: {shard}"),
        })?;
        // A shard is a file in the folder, never a path out of it.
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            return Err(ModelError::Checkpoint {
                path: index_path.clone(),
                message: format!("shard `{name}` is not a file name in the folder"),
            });
        }
        let path = dir.join(name);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

/// A checkpoint's `config.json` read into the config the forward pass runs (`vocab`: the rows
/// of the embeddings, which a config's `vocab_size` must agree with).
pub(crate) fn config_from_json(json: &Value, vocab: usize) -> Result<LlamaConfig> {
    let model_type = json["model_type"].as_str().unwrap_or("");
    let architecture = CHECKPOINT_TYPES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, a)| *a)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            architecture: format!("{model_type:?} (config.json's model_type)"),
            supported: CHECKPOINT_TYPES
                .iter()
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    // Multimodal Gemma 3 keeps the text model's hyper-parameters under `text_config`.
    let c = match &json["text_config"] {
        Value::Object(_) => &json["text_config"],
        _ => json,
    };
    let keys = JsonKeys(c);
    let embedding_length = keys.required("hidden_size")?;
    let head_count = keys.required("num_attention_heads")?;
    let head_count_kv = keys.uint("num_key_value_heads")?.unwrap_or(head_count);
    let head_dim = match keys.uint("head_dim")? {
        Some(d) => d,
        None => embedding_length / head_count,
    };
    if !head_count.is_multiple_of(head_count_kv) || !head_dim.is_multiple_of(2) || head_dim == 0 {
        return Err(keys.bad(
            "num_key_value_heads",
            format!(
                "{head_count} query heads on {head_count_kv} key-value heads of {head_dim} \
                 dimensions (groups must divide evenly, heads be of an even width)"
            ),
        ));
    }
    let vocab_size = keys.uint("vocab_size")?.unwrap_or(vocab);
    if vocab_size != vocab {
        return Err(keys.bad(
            "vocab_size",
            format!("{vocab_size}, but the embeddings have {vocab} rows"),
        ));
    }
    let gemma = architecture == "gemma3";
    let rope_freq_base = keys
        .float("rope_theta")?
        .or(keys.rope_param("rope_theta"))
        .unwrap_or(10_000.0) as f32;
    let context_length = keys.required("max_position_embeddings")?;
    let (rope_freq_scale, rope_freq_factors, rope_yarn) =
        keys.rope_scaling(head_dim, rope_freq_base, context_length)?;
    let sliding_window = keys.sliding_window(model_type)?;
    let attention_scale = match keys.float("query_pre_attn_scalar")? {
        Some(s) if gemma => 1.0 / (s as f32).sqrt(),
        _ => 1.0 / (head_dim as f32).sqrt(),
    };
    let switches = Switches::of(architecture, embedding_length);
    Ok(LlamaConfig {
        architecture: architecture.into(),
        block_count: keys.required("num_hidden_layers")?,
        embedding_length,
        feed_forward_length: keys.required("intermediate_size")?,
        head_count,
        head_count_kv,
        head_dim,
        rope_freq_base,
        rope_freq_scale,
        rope_freq_factors,
        rope_yarn,
        rms_norm_eps: keys.float("rms_norm_eps")?.unwrap_or(1e-6) as f32,
        context_length,
        vocab_size,
        embedding_scale: switches.embedding_scale,
        attention_scale,
        rope_style: RopeStyle::Halves,
        activation: switches.activation,
        qk_norm: switches.qk_norm,
        post_norms: switches.post_norms,
        qkv_bias: switches.qkv_bias || c["attention_bias"] == true,
        sliding_window,
    })
}

/// A checkpoint's config keys, read with typed errors that name the key.
struct JsonKeys<'a>(&'a Value);

impl JsonKeys<'_> {
    fn name(k: &str) -> String {
        format!("config.json: {k}")
    }

    fn bad(&self, k: &str, message: String) -> ModelError {
        ModelError::InvalidKey {
            key: Self::name(k),
            message,
        }
    }

    /// A positive integer, if present (and not null).
    fn uint(&self, k: &str) -> Result<Option<usize>> {
        match &self.0[k] {
            Value::Null => Ok(None),
            v => match v.as_u64() {
                Some(x) if x > 0 => Ok(Some(x as usize)),
                _ => Err(self.bad(k, format!("{v} is not a positive integer"))),
            },
        }
    }

    fn required(&self, k: &str) -> Result<usize> {
        self.uint(k)?
            .ok_or_else(|| ModelError::MissingKey { key: Self::name(k) })
    }

    fn float(&self, k: &str) -> Result<Option<f64>> {
        match &self.0[k] {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.bad(k, format!("{v} is not a number"))),
        }
    }

    /// The local layers, as transformers reads them for each `model_type`:
    /// - Gemma 3: `sliding_window` in the pattern below, with their own RoPE base
    ///   (`rope_local_base_freq`);
    /// - Mistral: `sliding_window` in every layer (Mistral 7B v0.1: 4,096; null in v0.2 and
    ///   later);
    /// - Qwen2 and Qwen3: only where `use_sliding_window` is true (no released model sets it),
    ///   refused;
    /// - a llama: none (transformers' llama reads no `sliding_window`).
    ///
    /// Where the key is absent, transformers' default for the type (4,096 for Gemma 3 and
    /// Mistral) applies; `null` is no window.
    fn sliding_window(&self, model_type: &str) -> Result<Option<SlidingWindow>> {
        let size = || -> Result<Option<usize>> {
            match self.0.get("sliding_window") {
                None => Ok(Some(4096)),
                Some(_) => self.uint("sliding_window"),
            }
        };
        match model_type {
            "gemma3" | "gemma3_text" => size()?
                .map(|size| {
                    Ok(SlidingWindow {
                        size,
                        pattern: self.sliding_window_pattern()?,
                        rope_freq_base: Some(
                            self.float("rope_local_base_freq")?.unwrap_or(10_000.0) as f32,
                        ),
                    })
                })
                .transpose(),
            "mistral" => Ok(size()?.map(SlidingWindow::every_layer)),
            "qwen2" | "qwen3" if self.0["use_sliding_window"] == true => Err(self.bad(
                "use_sliding_window",
                "sliding-window attention in the layers past `max_window_layers` is not \
                 supported"
                    .into(),
            )),
            _ => Ok(None),
        }
    }

    /// Gemma 3's local-to-global pattern: `sliding_window_pattern`, or where recent transformers
    /// list `layer_types`, the position of the first full-attention layer plus one; else 6.
    fn sliding_window_pattern(&self) -> Result<usize> {
        if let Some(n) = self.uint("sliding_window_pattern")? {
            return Ok(n);
        }
        let Some(types) = self.0["layer_types"].as_array() else {
            return Ok(6);
        };
        let pattern = types
            .iter()
            .position(|t| t == "full_attention")
            .map(|i| i + 1)
            .ok_or_else(|| self.bad("layer_types", "no full_attention layer".into()))?;
        // The forward pass repeats one pattern: every layer must follow it.
        let follows = types
            .iter()
            .enumerate()
            .all(|(i, t)| (t == "full_attention") == (i % pattern == pattern - 1));
        if !follows {
            return Err(self.bad(
                "layer_types",
                format!(
                    "not a repetition of {} local layers and a global one",
                    pattern - 1
                ),
            ));
        }
        Ok(pattern)
    }

    /// `rope_parameters.<k>` (recent transformers' spelling of `rope_theta` and
    /// `rope_scaling`).
    fn rope_param(&self, k: &str) -> Option<f64> {
        self.0["rope_parameters"][k].as_f64()
    }

    /// The scale, the per-frequency factors and YaRN's parameters of `rope_scaling` (or
    /// `rope_parameters`), for a model of `context` positions.
    fn rope_scaling(&self, head_dim: usize, base: f32, context: usize) -> Result<RopeScaling> {
        let (key, s) = match (&self.0["rope_scaling"], &self.0["rope_parameters"]) {
            (Value::Object(_), _) => ("rope_scaling", &self.0["rope_scaling"]),
            (_, Value::Object(_)) => ("rope_parameters", &self.0["rope_parameters"]),
            _ => return Ok((1.0, None, None)),
        };
        let kind = s["rope_type"]
            .as_str()
            .or(s["type"].as_str())
            .unwrap_or("default");
        let number = |k: &str, default: Option<f64>| -> Result<f64> {
            s[k].as_f64()
                .or(default)
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    self.bad(
                        &format!("{key}.{k}"),
                        format!("{} is not a positive number", s[k]),
                    )
                })
        };
        match kind {
            "default" => Ok((1.0, None, None)),
            "linear" => Ok(((1.0 / number("factor", None)?) as f32, None, None)),
            "yarn" => {
                // transformers' `_compute_yarn_parameters`: `beta_fast or 32` (a 0 is the
                // default too), the magnitude from `attention_factor`, else from `mscale` over
                // `mscale_all_dim` where both are set, else `1 + 0.1 ln factor`.
                let factor = number("factor", None)?;
                let set = |k: &str| s[k].as_f64().filter(|x| *x != 0.0);
                // Python's `or`: absent, null and 0 take the default; anything else must be a
                // positive number.
                let or = |k: &str, default: f64| match set(k) {
                    Some(_) => number(k, None),
                    None if s[k].is_null() || s[k].as_f64().is_some() => Ok(default),
                    None => number(k, None),
                };
                let mscale = |m: f64| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                let magnitude = match (
                    set("attention_factor"),
                    set("mscale"),
                    set("mscale_all_dim"),
                ) {
                    (Some(_), ..) => number("attention_factor", None)?,
                    (None, Some(m), Some(all)) => mscale(m) / mscale(all),
                    _ => Yarn::default_magnitude(factor),
                };
                let truncate = match &s["truncate"] {
                    Value::Null => true,
                    Value::Bool(b) => *b,
                    other => {
                        return Err(self.bad(
                            &format!("{key}.truncate"),
                            format!("{other} is not a boolean"),
                        ))
                    }
                };
                let yarn = Yarn {
                    original_context: or("original_max_position_embeddings", context as f64)?,
                    beta_fast: or("beta_fast", 32.0)?,
                    beta_slow: or("beta_slow", 1.0)?,
                    ext_factor: 1.0,
                    magnitude,
                    truncate,
                };
                Ok(((1.0 / factor) as f32, None, Some(yarn)))
            }
            "llama3" => {
                let scaling = Llama3Scaling {
                    factor: number("factor", Some(8.0))?,
                    low_freq_factor: number("low_freq_factor", Some(1.0))?,
                    high_freq_factor: number("high_freq_factor", Some(4.0))?,
                    original_context: number("original_max_position_embeddings", Some(8192.0))?,
                };
                if scaling.low_freq_factor >= scaling.high_freq_factor {
                    return Err(self.bad(
                        &format!("{key}.low_freq_factor"),
                        "must be below high_freq_factor".into(),
                    ));
                }
                Ok((1.0, Some(llama3_factors(&scaling, head_dim, base)), None))
            }
            other => Err(self.bad(
                &format!("{key}.rope_type"),
                format!(
                    "RoPE scaling `{other}` is not supported (default, linear, llama3 and yarn are)"
                ),
            )),
        }
    }
}

/// A checkpoint's RoPE scale, per-frequency factors and YaRN parameters ([`LlamaConfig`]'s
/// `rope_freq_scale`, `rope_freq_factors`, `rope_yarn`).
type RopeScaling = (f32, Option<Vec<f32>>, Option<Yarn>);

/// Llama 3.1's RoPE scaling (`rope_scaling` of type `llama3`).
#[derive(Debug, Clone, Copy)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_context: f64,
}

/// The divisor of each of a head's `head_dim / 2` RoPE frequencies under Llama 3's scaling, as
/// Meta's reference publishes it: frequencies whose wavelength is below
/// `original_context / high_freq_factor` are kept, those above `original_context /
/// low_freq_factor` divided by `factor`, and those between interpolated smoothly.
pub fn llama3_factors(s: &Llama3Scaling, head_dim: usize, base: f32) -> Vec<f32> {
    let low_wavelen = s.original_context / s.low_freq_factor;
    let high_wavelen = s.original_context / s.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let wavelen =
                2.0 * std::f64::consts::PI * f64::from(base).powf(2.0 * i as f64 / head_dim as f64);
            let divisor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                s.factor
            } else {
                let smooth = (s.original_context / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            };
            divisor as f32
        })
        .collect()
}

#[cfg(test)]
mod tests;
