//! How the model runs, as data: [`ModelOptions`], fixed for a model's life
//! ([`crate::Llama::load_with`]).
//!
//! Every choice of the forward pass that is not in the model file lives here: the attention
//! kernel's form, the KV pool's element type, when projections use dense weights, where tokens
//! are drawn, CUDA graphs, the optional fusions, event tracking and profiling. A job file gives
//! them as its `[model.runtime]` table, `quarry bench` and `quarry generate` as `--runtime
//! KEY=VALUE`, and the binary reads the `QUARRY_*` variables of [`ModelOptions::VARIABLES`] once
//! at start-up through [`ModelOptions::apply_vars`]: this crate reads no environment. Every field
//! says its default, what it trades and the measurement behind the default (BENCHMARKS.md). A
//! CPU ignores the GPU's options.

use serde::de::value::{Error as ValueError, StrDeserializer};
use serde::{Deserialize, Deserializer, Serialize};

/// The model runtime's options; `ModelOptions::default()` is what quarry runs with unless told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelOptions {
    /// The paged attention kernel's form on a GPU. `auto` (the default): `split` (split-K over
    /// chunks of the context) for steps of at most 16 (`SMALL_STEP_TOKENS`) new
    /// tokens, `warps` (one warp per query row) above: split-K with the two small-step fusions
    /// made a decode step 1.48× faster at batch 1 and 1.34× at batch 8 on an H200, and 0.95× at
    /// batch 128 (2026-11-28). `tiled`: the warps layout where a prefill's or extension's tokens
    /// of one sequence share their key reads, four tokens a block (not yet measured).
    /// `cascade`: the positions a batch's sequences share at their start (an extraction job's
    /// instructions, held once by the radix cache) read once for all their tokens, then each
    /// token's own (not yet measured).
    /// `per-dimension` is the kernel's first layout; `gather` runs attention as per-sequence
    /// tensor ops (the CPU's cross-check; slow).
    pub attention: Attention,
    /// Context positions per split-K chunk; `None` (the default) lets the kernel plan choose
    /// from the step's shape.
    #[serde(deserialize_with = "positive_chunk")]
    pub attention_chunk: Option<usize>,
    /// What the attention's warps and split forms ask L2 for as they find their pool rows
    /// ([`crate::Prefetch`]): `values`, `keys`, `both`, or `off` (the default). The output is the
    /// same bits; written 2026-11-30 without a GPU for the batch-256 steps, whose attention read
    /// the pool at 2.2-2.6 TB/s where a copy reads 4.0-4.2 (attention-bench times each choice:
    /// not yet run).
    pub attention_prefetch: crate::Prefetch,
    /// How the attention's warps and split forms read their key rows ([`crate::KeyReads`]):
    /// `direct` (the default: each thread its own row, a warp's load across 32 cache lines) or
    /// `staged` (a block's rows through shared memory in coalesced loads). The same bits either
    /// way; written 2026-11-30 without a GPU for the same batch-256 reads (attention-bench
    /// times both: not yet run).
    pub attention_keys: crate::KeyReads,
    /// The GPU KV pool's element type. `f16` (the default): half the bytes read per attended
    /// position of `f32` and twice the pages in the same memory; f16 over bf16 for its three
    /// more mantissa bits (not yet compared on a GPU). A CPU always stores f32.
    pub kv_dtype: KvDtype,
    /// Rows from which a GPU projection multiplies dequantized f16 weights instead of the
    /// quantized ones (candle's kernels, which round activations to 8 bits); 0 keeps only the
    /// quantized weights. 1 (the default): every step dense, so a row's logits do not depend on
    /// how many rows share its step. With the switch at 32 a record's text changed with its
    /// batch (logits up to 2.6 apart); dense, batch 128 ran 1.19× faster and agreed with
    /// llama.cpp more often (H100, 2026-11-26).
    pub dense_from_rows: usize,
    /// Steps below `dense_from_rows` multiply Q8_0 weights with quarry's 8-bit GEMV
    /// (`kernels/gemv_q8.cu`: the weights' int8 values with activations kept f16) instead of
    /// candle's quantized kernels, where `dense_from_rows` is at most 9. Off by default: its
    /// first form made a batch-1 step of the Llama-3.1-8B shape 5.90 ms on an H200, where
    /// candle's kernels took 5.08 and the f16 copies 5.69 (2026-11-28); the form built since is
    /// not yet measured.
    pub q8_gemv: bool,
    /// Trips of weights each lane of the 8-bit GEMV (`q8_gemv`) asks L2 for beyond the one it
    /// loads (a trip: 1,024 values of a row at 1 or 2 rows, 512 above); 0 (the default): none.
    /// The sums are the same bits. Written 2026-11-30 without a GPU for the batch-1 step, whose
    /// GEMV read its 8.5 GB at 1.9 TB/s where a copy reads 4.0-4.2 (not yet measured).
    #[serde(deserialize_with = "gemv_trips")]
    pub gemv_prefetch: usize,
    /// Where a GPU draws a step's tokens: `device` (the default: the sampling kernel, so only
    /// the tokens come back) or `host` (the logits come back and the host draws, as on a CPU;
    /// for comparing the two).
    pub sampling: SamplingSite,
    /// Decode steps on a GPU replay CUDA graphs (one per batch shape bucket), one launch where
    /// a step makes hundreds. On by default: 98% of batch-1 passes replayed and the batch-1
    /// step went under llama.cpp's (1.22 against 1.32 ms, H200, 2026-11-28).
    pub cuda_graphs: bool,
    /// The dense output and down projections' GEMMs add into the residual stream (one launch
    /// fewer each), as does the 8-bit GEMV (`q8_gemv`), whose gate/up projection also applies
    /// the activation. `auto` (the default): on for steps of at most
    /// 16 (`SMALL_STEP_TOKENS`) tokens, where it measured faster (with `rope_store`
    /// and the split attention, above); `on`/`off` decide for every step.
    pub gemm_add: Switch,
    /// RoPE writes the keys and values into the pool itself (one launch where there were two);
    /// `auto` as `gemm_add`.
    pub rope_store: Switch,
    /// The residual add writes the next norm where its rows are f32 (the quantized weights'
    /// small batches): one launch fewer per norm. Off by default (not faster where measured).
    pub add_norm: bool,
    /// Where `gemm_add` fuses the 8-bit GEMV's epilogues (`q8_gemv`), its steps of 1 or 2 rows
    /// take the attention and feed-forward norms in their own launch too: each block normalizes
    /// the stream's rows into its shared memory first, bit for bit as the norm's launch (a
    /// single block at batch 1) wrote them. On by default; not yet measured on a GPU.
    pub gemv_norm: bool,
    /// Split-K attention (`attention` above) combines its chunks in its own launch: the last
    /// block of each (token, key-value head) to finish combines that group's query heads, where
    /// the combine had a launch of its own after it (one launch a layer fewer on every split
    /// step: a batch-1 decode step of the Llama-3.1-8B shape launches 32 fewer kernels). The
    /// output is the combine's launch's, bit for bit. Off by default: not yet measured on a GPU.
    pub split_combine: bool,
    /// Every phase of a forward pass synchronizes and records its time ([`crate::profile`]).
    /// Off by default (it slows the pass); `quarry bench --profile` turns it on.
    pub profile: bool,
    /// How a CPU holds plain projections (a checkpoint's bf16, f16 and f32): `auto` (the
    /// default) in f32 where they leave an eighth of the available memory, else quantized to
    /// Q8_0 at load, said once ([`crate::HostWeights`]); `f32` always (refused where it does not
    /// fit); `q8_0` always. A GPU ignores it.
    pub cpu_weights: CpuWeights,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            attention: Attention::Auto,
            attention_chunk: None,
            attention_prefetch: crate::Prefetch::Off,
            attention_keys: crate::KeyReads::Direct,
            kv_dtype: KvDtype::F16,
            dense_from_rows: 1,
            q8_gemv: false,
            gemv_prefetch: 0,
            sampling: SamplingSite::Device,
            cuda_graphs: true,
            gemm_add: Switch::Auto,
            rope_store: Switch::Auto,
            add_norm: false,
            gemv_norm: true,
            split_combine: false,
            profile: false,
            cpu_weights: CpuWeights::Auto,
        }
    }
}

/// [`ModelOptions::attention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attention {
    Auto,
    Warps,
    Split,
    PerDimension,
    Gather,
    Tiled,
    Cascade,
}

/// [`ModelOptions::kv_dtype`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvDtype {
    F16,
    Bf16,
    F32,
}

/// [`ModelOptions::sampling`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplingSite {
    Device,
    Host,
}

/// [`ModelOptions::cpu_weights`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuWeights {
    Auto,
    F32,
    Q8_0,
}

/// An option that is on, off, or decided per step by what was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Switch {
    Auto,
    On,
    Off,
}

/// A bad option: which one (the key, or the variable it came from), what it was given and what
/// it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("{name} is `{value}`: expected {expected}")]
    Value {
        name: String,
        value: String,
        expected: &'static str,
    },
    #[error("`{key}` is not a model runtime option (expected one of {})", KEYS.join(", "))]
    Unknown { key: String },
}

/// The option keys, in the order of [`ModelOptions`]'s fields.
const KEYS: [&str; 17] = [
    "attention",
    "attention_chunk",
    "attention_prefetch",
    "attention_keys",
    "kv_dtype",
    "dense_from_rows",
    "q8_gemv",
    "gemv_prefetch",
    "sampling",
    "cuda_graphs",
    "gemm_add",
    "rope_store",
    "add_norm",
    "gemv_norm",
    "split_combine",
    "profile",
    "cpu_weights",
];

impl ModelOptions {
    /// The environment variables the binary reads at start-up, and the option each sets.
    pub const VARIABLES: [(&'static str, &'static str); 17] = [
        ("QUARRY_ATTENTION", "attention"),
        ("QUARRY_ATTENTION_CHUNK", "attention_chunk"),
        ("QUARRY_ATTENTION_PREFETCH", "attention_prefetch"),
        ("QUARRY_ATTENTION_KEYS", "attention_keys"),
        ("QUARRY_KV_DTYPE", "kv_dtype"),
        ("QUARRY_DENSE_FROM_ROWS", "dense_from_rows"),
        ("QUARRY_Q8_GEMV", "q8_gemv"),
        ("QUARRY_GEMV_PREFETCH", "gemv_prefetch"),
        ("QUARRY_SAMPLING", "sampling"),
        ("QUARRY_CUDA_GRAPHS", "cuda_graphs"),
        ("QUARRY_GEMM_ADD", "gemm_add"),
        ("QUARRY_ROPE_STORE", "rope_store"),
        ("QUARRY_ADD_NORM", "add_norm"),
        ("QUARRY_GEMV_NORM", "gemv_norm"),
        ("QUARRY_SPLIT_COMBINE", "split_combine"),
        ("QUARRY_PROFILE", "profile"),
        ("QUARRY_CPU_WEIGHTS", "cpu_weights"),
    ];

    /// Every option with its values and default, for `--help` (docs/model-options.md has the
    /// trade-offs).
    pub const HELP: &'static str = "Model runtime options, as KEY=VALUE (repeatable; the same keys as a job file's \
[model.runtime] table and the QUARRY_<KEY> variables; a CPU ignores the GPU's):
  attention=auto|warps|split|tiled|cascade|per-dimension|gather   GPU attention kernel (auto: split up to 16-token steps, warps above)
  attention_chunk=auto|N                             context positions per split-K chunk (auto: the kernel plan's)
  attention_prefetch=off|values|keys|both            rows the GPU attention asks L2 for as it finds them (off)
  attention_keys=direct|staged                       how the GPU attention's scores read key rows (direct)
  kv_dtype=f16|bf16|f32                              GPU KV pool element type (f16)
  dense_from_rows=N                                  rows from which GPU projections use f16 weights; 0: quantized only (1)
  q8_gemv=on|off                                     Q8_0 below dense_from_rows (at most 9) through quarry's 8-bit GEMV (off)
  gemv_prefetch=N                                    trips of weights the 8-bit GEMV's lanes prefetch into L2, 0 to 8 (0)
  sampling=device|host                               where a GPU draws tokens (device)
  cuda_graphs=on|off                                 replay decode steps as CUDA graphs (on)
  gemm_add=auto|on|off                               projections add into the residual stream (auto: up to 16-token steps)
  rope_store=auto|on|off                             RoPE writes the KV pool itself (auto: up to 16-token steps)
  add_norm=on|off                                    residual add writes the next norm (off)
  gemv_norm=on|off                                   the 8-bit GEMV's 1-2 row steps normalize in their own launch (on)
  split_combine=on|off                               split-K attention combines its chunks in its own launch (off)
  profile=on|off                                     time every phase of a pass (off)
  cpu_weights=auto|f32|q8_0                          how a CPU holds plain (checkpoint) projections (auto: f32, Q8_0 where f32 does not fit)";

    /// Sets option `key` from its text form (`on`/`off` also as `true`/`false`/`1`/`0`), or says
    /// what it accepts.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), OptionError> {
        let v = value.trim();
        let bad = |expected: &'static str| OptionError::Value {
            name: key.to_owned(),
            value: value.to_owned(),
            expected,
        };
        match key.trim() {
            "attention" => {
                self.attention = choice(v).ok_or_else(|| {
                    bad("auto, warps, split, tiled, cascade, per-dimension or gather")
                })?
            }
            "attention_chunk" => {
                self.attention_chunk = match v {
                    "auto" => None,
                    n => Some(
                        n.parse()
                            .ok()
                            .filter(|&c: &usize| c > 0)
                            .ok_or_else(|| bad("auto or a number of positions over 0"))?,
                    ),
                }
            }
            "attention_prefetch" => {
                self.attention_prefetch =
                    choice(v).ok_or_else(|| bad("off, values, keys or both"))?
            }
            "attention_keys" => {
                self.attention_keys = choice(v).ok_or_else(|| bad("direct or staged"))?
            }
            "kv_dtype" => self.kv_dtype = choice(v).ok_or_else(|| bad("f16, bf16 or f32"))?,
            "dense_from_rows" => {
                self.dense_from_rows = v
                    .parse()
                    .map_err(|_| bad("a number of rows (0: the quantized weights only)"))?
            }
            "gemv_prefetch" => {
                self.gemv_prefetch = v
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n <= MAX_GEMV_PREFETCH)
                    .ok_or_else(|| bad("a number of trips from 0 to 8"))?
            }
            "sampling" => self.sampling = choice(v).ok_or_else(|| bad("device or host"))?,
            "gemm_add" => self.gemm_add = choice(v).ok_or_else(|| bad("auto, on or off"))?,
            "rope_store" => self.rope_store = choice(v).ok_or_else(|| bad("auto, on or off"))?,
            "cpu_weights" => {
                self.cpu_weights = choice(v).ok_or_else(|| bad("auto, f32 or q8_0"))?
            }
            k @ ("cuda_graphs" | "add_norm" | "gemv_norm" | "split_combine" | "profile"
            | "q8_gemv") => {
                let on = switch(v).ok_or_else(|| bad("on or off"))?;
                match k {
                    "cuda_graphs" => self.cuda_graphs = on,
                    "add_norm" => self.add_norm = on,
                    "gemv_norm" => self.gemv_norm = on,
                    "split_combine" => self.split_combine = on,
                    "q8_gemv" => self.q8_gemv = on,
                    _ => self.profile = on,
                }
            }
            _ => return Err(OptionError::Unknown { key: key.into() }),
        }
        Ok(())
    }

    /// Sets each option from `KEY=VALUE` (a flag's form).
    pub fn set_pair(&mut self, pair: &str) -> Result<(), OptionError> {
        match pair.split_once('=') {
            Some((k, v)) => self.set(k, v),
            None => Err(OptionError::Value {
                name: "--runtime".into(),
                value: pair.into(),
                expected: "KEY=VALUE",
            }),
        }
    }

    /// Sets the options whose variable ([`ModelOptions::VARIABLES`]) `get` returns non-empty;
    /// an error names the variable. The binary passes the process environment, once.
    pub fn apply_vars(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), OptionError> {
        for (var, key) in Self::VARIABLES {
            let Some(value) = get(var).filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            self.set(key, &value).map_err(|e| match e {
                OptionError::Value {
                    value, expected, ..
                } => OptionError::Value {
                    name: var.into(),
                    value,
                    expected,
                },
                other => other,
            })?;
        }
        Ok(())
    }
}

/// The most trips [`ModelOptions::gemv_prefetch`] takes: 8 trips of 1,024 values are two whole
/// rows of Llama 3 8B's Q/K/V, output and gate/up projections (4,096 inputs) and over half a row
/// of its down projection (14,336).
const MAX_GEMV_PREFETCH: usize = 8;

/// `attention_chunk` from a job file's table, refused where 0, as [`ModelOptions::set`] refuses
/// it.
fn positive_chunk<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    match Option::<usize>::deserialize(d)? {
        Some(0) => Err(serde::de::Error::custom(
            "attention_chunk = 0: expected a number of positions over 0 (or none: the kernel \
             plan's choice)",
        )),
        chunk => Ok(chunk),
    }
}

/// `gemv_prefetch` from a job file's table, refused past [`MAX_GEMV_PREFETCH`], as
/// [`ModelOptions::set`] refuses it.
fn gemv_trips<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n > MAX_GEMV_PREFETCH {
        return Err(serde::de::Error::custom(format!(
            "gemv_prefetch = {n}: expected a number of trips from 0 to {MAX_GEMV_PREFETCH}"
        )));
    }
    Ok(n)
}

/// A unit variant of `T` by its serde name (`per-dimension`, `f16`, `auto`).
fn choice<T: for<'de> Deserialize<'de>>(v: &str) -> Option<T> {
    T::deserialize(StrDeserializer::<ValueError>::new(v)).ok()
}

fn switch(v: &str) -> Option<bool> {
    match v {
        "on" | "1" | "true" => Some(true),
        "off" | "0" | "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job file's `[model.runtime]` table (serde's path, not [`ModelOptions::set`]'s) refuses
    /// the values `set` refuses, naming the key: a chunk of 0 positions, a prefetch past 8
    /// trips (whose loop a GPU would run per lane).
    #[test]
    fn a_job_file_s_table_refuses_what_the_flags_refuse() {
        let parse = |json: &str| serde_json::from_str::<ModelOptions>(json);
        let ok =
            parse(r#"{"gemv_prefetch": 8, "attention_chunk": 64, "attention_prefetch": "values", "attention_keys": "staged"}"#)
                .unwrap();
        assert_eq!(
            (ok.gemv_prefetch, ok.attention_chunk, ok.attention_prefetch),
            (8, Some(64), crate::Prefetch::Values)
        );
        assert_eq!(ok.attention_keys, crate::KeyReads::Staged);
        assert_eq!(parse("{}").unwrap(), ModelOptions::default());
        for (json, key) in [
            (r#"{"gemv_prefetch": 9}"#, "gemv_prefetch = 9"),
            (r#"{"attention_chunk": 0}"#, "attention_chunk = 0"),
            (r#"{"attention_prefetch": "all"}"#, "all"),
            (r#"{"attention_keys": "tiled"}"#, "tiled"),
        ] {
            let e = parse(json).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("expected"), "{json}: {e}");
        }
    }

    #[test]
    fn every_key_parses_and_names_what_it_accepts() {
        let mut o = ModelOptions::default();
        for (key, good, bad) in [
            ("attention", "per-dimension", "fast"),
            ("attention_chunk", "64", "0"),
            ("attention_prefetch", "values", "all"),
            ("attention_keys", "staged", "tiled"),
            ("kv_dtype", "bf16", "f8"),
            ("dense_from_rows", "0", "-1"),
            ("q8_gemv", "on", "fast"),
            ("gemv_prefetch", "2", "9"),
            ("sampling", "host", "gpu"),
            ("cuda_graphs", "off", "maybe"),
            ("gemm_add", "on", "yes"),
            ("rope_store", "off", "2"),
            ("add_norm", "true", "auto"),
            ("gemv_norm", "off", "some"),
            ("split_combine", "on", "last"),
            ("profile", "on", ""),
        ] {
            o.set(key, good).unwrap();
            let e = o.set(key, bad).unwrap_err().to_string();
            assert!(e.starts_with(key) && e.contains("expected"), "{e}");
        }
        assert_eq!(o.attention, Attention::PerDimension);
        assert_eq!(o.attention_chunk, Some(64));
        assert_eq!(o.attention_prefetch, crate::Prefetch::Values);
        assert_eq!(o.attention_keys, crate::KeyReads::Staged);
        assert_eq!(o.gemv_prefetch, 2);
        assert_eq!(o.kv_dtype, KvDtype::Bf16);
        assert_eq!(o.dense_from_rows, 0);
        assert_eq!(o.sampling, SamplingSite::Host);
        assert!(!o.cuda_graphs && o.add_norm && o.profile && o.q8_gemv && !o.gemv_norm);
        assert!(o.split_combine);
        assert_eq!((o.gemm_add, o.rope_store), (Switch::On, Switch::Off));
        assert!(matches!(
            o.set("attn", "warps"),
            Err(OptionError::Unknown { .. })
        ));
        assert_eq!(KEYS.len(), ModelOptions::VARIABLES.len());
        for (var, key) in ModelOptions::VARIABLES {
            assert_eq!(var, format!("QUARRY_{}", key.to_uppercase()));
            assert!(ModelOptions::HELP.contains(&format!("  {key}=")), "{key}");
        }
    }

    #[test]
    fn variables_override_and_a_bad_one_is_named() {
        let mut o = ModelOptions::default();
        o.apply_vars(|v| match v {
            "QUARRY_KV_DTYPE" => Some("f32".into()),
            "QUARRY_CUDA_GRAPHS" => Some(" off ".into()),
            "QUARRY_PROFILE" => Some(String::new()),
            _ => None,
        })
        .unwrap();
        assert_eq!(o.kv_dtype, KvDtype::F32);
        assert!(!o.cuda_graphs && !o.profile);
        let e = o
            .apply_vars(|v| (v == "QUARRY_SAMPLING").then(|| "gpu".into()))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "QUARRY_SAMPLING is `gpu`: expected device or host"
        );
    }

    #[test]
    fn a_job_table_reads_the_same_names() {
        let o: ModelOptions = serde_json::from_value(serde_json::json!({
            "attention": "split", "kv_dtype": "bf16", "gemm_add": "off", "cuda_graphs": false
        }))
        .unwrap();
        assert_eq!(o.attention, Attention::Split);
        assert_eq!(o.kv_dtype, KvDtype::Bf16);
        assert_eq!(o.gemm_add, Switch::Off);
        assert!(!o.cuda_graphs);
        assert_eq!(o.rope_store, Switch::Auto);
        let unknown = serde_json::from_value::<ModelOptions>(serde_json::json!({"graphs": true}));
        assert!(unknown.is_err());
    }
}
