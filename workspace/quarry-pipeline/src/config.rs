//! Job definitions: `pipelines/*.toml`, loaded with `deny_unknown_fields` and errors that name the
//! file and the key.
//!
//! Relative paths inside a definition (schema, model) are resolved against the definition's own
//! folder, so `pipelines/x.toml` says `schema = "../schemas/x.json"` and works from any working
//! directory.

use std::path::{Path, PathBuf};

use quarry_grammar::Whitespace;
use quarry_model::ModelOptions;
use serde::Deserialize;

use crate::error::PipelineError;

/// One job: where documents come from, how they become prompts, what they must become, where the
/// records go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Names the job in file metadata, metrics and logs.
    pub name: String,
    pub source: SourceConfig,
    pub prompt: PromptConfig,
    /// The JSON Schema every record must satisfy; it is also the decoding constraint unless
    /// `grammar` is set.
    pub schema: PathBuf,
    /// JSON Schema documents the schema's `$ref`s name (`"$ref": "common.json#/$defs/id"`),
    /// each known by its file's location and its own `$id`, as with `--schema-resource`. They are
    /// embedded into the schema when the job starts, for decoding and validation alike.
    #[serde(default)]
    pub schema_resources: Vec<PathBuf>,
    /// A GBNF grammar (llama.cpp's syntax) to decode with instead of the schema, for jobs that
    /// already have one. Records are still validated against `schema`; an output the schema
    /// refuses is a rejects row (`schema_violation`).
    #[serde(default)]
    pub grammar: Option<PathBuf>,
    /// Layout of the JSON the model writes: `compact`, `spaced` (`", "` and `": "`), `pretty` or
    /// `pretty:N`. Defaults to the engine's default.
    #[serde(
        default = "default_whitespace",
        deserialize_with = "deserialize_whitespace"
    )]
    pub whitespace: Whitespace,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub sampling: SamplingConfig,
    #[serde(default)]
    pub batching: BatchingConfig,
    pub output: OutputConfig,
    pub rejects: RejectsConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Folder of the definition file; relative paths are resolved against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Where documents come from.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceConfig {
    /// Always-on: a Kafka topic read by a consumer group.
    Kafka(KafkaSource),
    /// Scheduled or reprocessing: files under an object-store prefix.
    Dataset(DatasetSource),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSource {
    /// `host:port[,host:port]`; `quarry worker --brokers` overrides it.
    pub brokers: String,
    pub topic: String,
    /// Consumer group; `quarry worker --group` overrides it.
    pub group: String,
    /// How a message value becomes a document.
    #[serde(default)]
    pub value: ValueFormat,
    #[serde(default)]
    pub fields: DocFields,
    /// Extra librdkafka settings (`security.protocol`, `sasl.*`, ...), applied last.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
    /// What a message with no value (a tombstone, as compacted topics use to delete a key)
    /// becomes: `reject` (default: a rejects row with cause `tombstone`) or `skip` (no row; counted
    /// as `skipped` in the summary, the file's metadata and `quarry_docs_skipped_total`).
    #[serde(default)]
    pub tombstones: TombstonePolicy,
    /// Seconds a partition may sit behind its high watermark with nothing delivered (a batch the
    /// client cannot decode, a fetch error that repeats) before the worker drains, names the
    /// partition and offset, and exits non-zero so that the orchestrator restarts it and the
    /// operator sees it. The records are never skipped. Default 120; `quarry worker
    /// --stall-timeout` overrides it. A paused partition (its buffer full) is never stalled.
    #[serde(default = "default_stall_timeout_s")]
    pub stall_timeout_s: u64,
}

fn default_stall_timeout_s() -> u64 {
    120
}

/// What a Kafka tombstone (a message with a null value) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TombstonePolicy {
    /// A rejects row with cause `tombstone` (and a dead letter when configured).
    #[default]
    Reject,
    /// No row: the offset is covered by the range file and counted as skipped.
    Skip,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSource {
    /// `file:///abs/path/`, `s3://bucket/prefix/`, `gs://`, `az://`, `memory:///`, or a local
    /// path; `quarry extract --input` overrides it.
    pub input: String,
    pub format: InputFormat,
    #[serde(default)]
    pub fields: DocFields,
    /// Files per shard for `format = "text"` (one document per file).
    #[serde(default = "default_text_shard_files")]
    pub text_shard_files: usize,
    /// A JSONL or Parquet file larger than this is split into parts of about this many bytes,
    /// each a shard of its own (`0`: never split). Compressed JSONL is never split.
    #[serde(default = "default_split_bytes")]
    pub split_bytes: u64,
    /// This worker's index among `shard_count` workers (`--shard-index` and the environment's
    /// `JOB_COMPLETION_INDEX` come first; see [`crate::shard::ShardSlice::resolve`]).
    #[serde(default)]
    pub shard_index: Option<usize>,
    /// How many workers share the input (`--shard-count` comes first); 1 when unset.
    #[serde(default)]
    pub shard_count: Option<usize>,
}

fn default_whitespace() -> Whitespace {
    quarry_engine::EngineConfig::default()
        .schema_options
        .whitespace
}

fn deserialize_whitespace<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Whitespace, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

fn default_text_shard_files() -> usize {
    256
}

/// 256 MiB: a part of a few hundred thousand documents, minutes of a GPU's work, whose records
/// a worker holds until it publishes them.
pub const DEFAULT_SPLIT_BYTES: u64 = 256 << 20;

fn default_split_bytes() -> u64 {
    DEFAULT_SPLIT_BYTES
}

/// Input files of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// One JSON object per line; each file is a shard (or `split_bytes` parts of it).
    Jsonl,
    /// One document per file; `text_shard_files` files make a shard.
    Text,
    /// Parquet with a string column named by `fields.text`; each file is a shard (or
    /// `split_bytes` parts of it, whole row groups each).
    Parquet,
}

/// A Kafka message value's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormat {
    /// The value is the document text (UTF-8).
    #[default]
    Text,
    /// The value is a JSON object with the text and id fields named by `fields`.
    Json,
}

/// Where a structured input keeps the text and the id.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocFields {
    #[serde(default = "default_text_field")]
    pub text: String,
    /// Optional: without it, the document id is the lineage (`source:partition:offset`).
    #[serde(default)]
    pub id: Option<String>,
}

impl Default for DocFields {
    fn default() -> Self {
        Self {
            text: default_text_field(),
            id: None,
        }
    }
}

fn default_text_field() -> String {
    "text".into()
}

/// How a document becomes the model's prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptConfig {
    /// minijinja template of the user message (or of the whole prompt when `chat = false`).
    /// Variables: `text`, `id`, and `doc` (the input's JSON fields, when it has any).
    pub template: String,
    /// Optional system message (chat only).
    #[serde(default)]
    pub system: Option<String>,
    /// Wrap the prompt in the model's chat template.
    #[serde(default = "yes")]
    pub chat: bool,
    /// Variables the chat template sees beside the messages (transformers'
    /// `chat_template_kwargs`); `enable_thinking` is `false` unless they set it
    /// ([`quarry_tokenizer::ChatVars`]).
    #[serde(default)]
    pub chat_vars: quarry_tokenizer::ChatVars,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// GGUF file; relative to the definition's folder.
    #[serde(default = "default_model")]
    pub path: PathBuf,
    /// `cpu` or `cuda:N`.
    #[serde(default = "default_device")]
    pub device: String,
    /// The `[model.runtime]` table: how the model runs (attention form, KV type, CUDA graphs,
    /// fusions, profiling; `quarry_model::ModelOptions`, docs/model-options.md). The binary
    /// applies the `QUARRY_*` variables over it at start-up.
    #[serde(default)]
    pub runtime: ModelOptions,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: default_model(),
            device: default_device(),
            runtime: ModelOptions::default(),
        }
    }
}

fn default_model() -> PathBuf {
    "../models/SmolLM2-135M-Instruct.Q4_1.gguf".into()
}

fn default_device() -> String {
    "cpu".into()
}

/// The `[sampling]` section: the engine's sampling parameters plus `max_tokens`, with the engine's
/// defaults (greedy: extraction wants the most likely record).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// Base seed; each document's seed also mixes in its lineage, so a rerun draws the same.
    pub seed: u64,
    pub max_tokens: usize,
    /// Records that always close (docs/budget.md): a record never ends cut at `max_tokens`; a
    /// schema whose shortest record does not fit is a `budget_too_small` reject. Default on;
    /// off, a record that runs out is a `truncated` reject.
    pub close_within_budget: bool,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        let p = quarry_model::SamplingParams::greedy();
        Self {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            seed: p.seed,
            max_tokens: quarry_engine::DEFAULT_MAX_TOKENS,
            close_within_budget: quarry_engine::EngineConfig::default().close_within_budget,
        }
    }
}

impl SamplingConfig {
    /// The parameters as the engine takes them (the seed is the base seed, before lineage).
    pub fn params(&self) -> quarry_model::SamplingParams {
        quarry_model::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchingConfig {
    /// Sequences decoding at once in the engine.
    #[serde(default = "default_max_running")]
    pub max_running: usize,
    /// Most documents in one output file (one Kafka partition's offset range, or one shard's
    /// slice).
    #[serde(default = "default_file_docs")]
    pub file_docs: usize,
    /// Kafka: publish a partition's file at least this often, even when it is not full.
    #[serde(default = "default_flush_ms")]
    pub flush_ms: u64,
    /// Kafka: a partition with this many documents waiting is paused until they drain.
    #[serde(default = "default_max_buffered")]
    pub max_buffered: usize,
    /// Documents larger than this are rejected (`too_large`) without reaching the model.
    #[serde(default = "default_max_doc_bytes")]
    pub max_doc_bytes: usize,
    /// Positions of keys and values the engine's pool holds (the radix cache's pages among them).
    /// Default: on a GPU, every position its free memory holds once the model is loaded (less
    /// the passes' headroom, as `quarry bench` sizes it); on a CPU, the engine's 16,384.
    #[serde(default)]
    pub kv_tokens: Option<usize>,
    /// Tokens one forward pass computes at most: every running sequence's next token first, then
    /// prompt chunks in the rest. Default: on a GPU, 4,096 or twice `max_running`, whichever is
    /// more (the prompts of the documents that replace finished ones need that room, or the
    /// batch runs short of them); on a CPU, 512 or `max_running`.
    #[serde(default)]
    pub step_tokens: Option<usize>,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        Self {
            max_running: default_max_running(),
            file_docs: default_file_docs(),
            flush_ms: default_flush_ms(),
            max_buffered: default_max_buffered(),
            max_doc_bytes: default_max_doc_bytes(),
            kv_tokens: None,
            step_tokens: None,
        }
    }
}

fn default_max_running() -> usize {
    16
}
fn default_file_docs() -> usize {
    1000
}
fn default_flush_ms() -> u64 {
    30_000
}
fn default_max_buffered() -> usize {
    256
}
fn default_max_doc_bytes() -> usize {
    1 << 20
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Prefix the accepted records go under; `--output` overrides it.
    pub url: String,
    /// Rows per Parquet row group.
    #[serde(default = "default_row_group_rows")]
    pub row_group_rows: usize,
    /// zstd level (1–22).
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// Files encoded and published at once, beside the step loop (a Kafka partition's one at a
    /// time, in offset order).
    #[serde(default = "default_publishers")]
    pub publishers: usize,
}

fn default_row_group_rows() -> usize {
    10_000
}
fn default_zstd_level() -> i32 {
    3
}
fn default_publishers() -> usize {
    4
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectsConfig {
    /// Prefix of the rejects dataset (same file naming as the output).
    pub url: String,
    /// Kafka only: also send each reject, as JSON, to this topic.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` of the Prometheus endpoint (`GET /metrics`); none by default.
    #[serde(default)]
    pub listen: Option<String>,
}

impl PipelineConfig {
    /// Reads and checks a definition file.
    pub fn load(path: &Path) -> Result<Self, PipelineError> {
        let text = std::fs::read_to_string(path).map_err(|source| PipelineError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), base)
    }

    /// Parses a definition; `origin` names it in errors, `base_dir` resolves relative paths.
    pub fn parse(text: &str, origin: &str, base_dir: PathBuf) -> Result<Self, PipelineError> {
        let mut cfg: PipelineConfig =
            toml::from_str(text).map_err(|e| PipelineError::Definition {
                path: origin.to_string(),
                source: Box::new(e),
            })?;
        cfg.base_dir = base_dir;
        cfg.check().map_err(|problem| PipelineError::Config {
            path: origin.to_string(),
            message: problem.to_string(),
        })?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ConfigProblem> {
        use ConfigProblem::*;
        if self.name.trim().is_empty() {
            return Err(Empty { field: "name" });
        }
        let b = &self.batching;
        for (field, value) in [
            ("batching.max_running", b.max_running),
            ("batching.file_docs", b.file_docs),
            ("batching.max_buffered", b.max_buffered),
            ("batching.kv_tokens", b.kv_tokens.unwrap_or(1)),
            ("batching.step_tokens", b.step_tokens.unwrap_or(1)),
            ("output.row_group_rows", self.output.row_group_rows),
            ("output.publishers", self.output.publishers),
            ("sampling.max_tokens", self.sampling.max_tokens),
        ] {
            if value == 0 {
                return Err(Zero { field });
            }
        }
        if let Some(step_tokens) = b.step_tokens.filter(|&t| t < b.max_running) {
            return Err(StepTokens {
                step_tokens,
                max_running: b.max_running,
            });
        }
        if !(1..=22).contains(&self.output.zstd_level) {
            return Err(ZstdLevel {
                level: self.output.zstd_level,
            });
        }
        match &self.source {
            SourceConfig::Dataset(d) if d.text_shard_files == 0 => {
                return Err(Zero {
                    field: "source.text_shard_files",
                });
            }
            SourceConfig::Dataset(d) if d.shard_count == Some(0) => {
                return Err(Zero {
                    field: "source.shard_count",
                });
            }
            SourceConfig::Dataset(d) if matches!((d.shard_index, d.shard_count), (Some(i), c) if i >= c.unwrap_or(1)) =>
            {
                return Err(ShardIndex {
                    index: d.shard_index.unwrap_or(0),
                    count: d.shard_count.unwrap_or(1),
                });
            }
            SourceConfig::Kafka(k) if k.stall_timeout_s == 0 => {
                return Err(Zero {
                    field: "source.stall_timeout_s",
                });
            }
            _ => {}
        }
        if self.output.url == self.rejects.url {
            return Err(SameOutput);
        }
        Ok(())
    }

    /// A path from the definition, resolved against its folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            lexical(&self.base_dir.join(p))
        }
    }

    /// A URL from the definition: a relative local path is resolved against its folder; URLs
    /// with a scheme are kept.
    pub fn resolve_url(&self, url: &str) -> String {
        if url.contains("://") || Path::new(url).is_absolute() {
            url.to_string()
        } else {
            self.resolve(Path::new(url)).display().to_string()
        }
    }

    pub fn schema_path(&self) -> PathBuf {
        self.resolve(&self.schema)
    }

    pub fn schema_resource_paths(&self) -> Vec<PathBuf> {
        self.schema_resources
            .iter()
            .map(|p| self.resolve(p))
            .collect()
    }

    pub fn grammar_path(&self) -> Option<PathBuf> {
        self.grammar.as_ref().map(|g| self.resolve(g))
    }

    pub fn model_path(&self) -> PathBuf {
        self.resolve(&self.model.path)
    }

    /// The model this job runs: its resolved path, the device and `[model.runtime]`.
    pub fn model_spec(&self) -> quarry_engine::ModelSpec {
        quarry_engine::ModelSpec {
            path: self.model_path(),
            device: self.model.device.clone(),
            options: self.model.runtime.clone(),
        }
    }
}

/// `a/b/../c` → `a/c`, without touching the file system (`..` at the start stays).
fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Why a job definition's values cannot be used together: what [`PipelineError::Config`]
/// says after the file's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigProblem {
    #[error("`{field}` is empty")]
    Empty { field: &'static str },
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("output.zstd_level {level} is outside 1..=22")]
    ZstdLevel { level: i32 },
    #[error("source.shard_index {index} is not below source.shard_count {count}")]
    ShardIndex { index: usize, count: usize },
    #[error("output.url and rejects.url must differ")]
    SameOutput,
    #[error(
        "batching.step_tokens {step_tokens} is below batching.max_running {max_running}: every \
         running sequence computes a token each step"
    )]
    StepTokens {
        step_tokens: usize,
        max_running: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_definitions_load_and_resolve_against_their_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines");
        for name in [
            "debian-packages.toml",
            "kafka-packages.toml",
            "reprocess-s3.toml",
        ] {
            let cfg = PipelineConfig::load(&root.join(name)).unwrap();
            assert!(
                cfg.schema_path().is_file(),
                "{name}: {}",
                cfg.schema_path().display()
            );
        }
        let cfg = PipelineConfig::load(&root.join("debian-packages.toml")).unwrap();
        assert!(
            !cfg.resolve_url(&cfg.output.url).contains(".."),
            "{}",
            cfg.output.url
        );
        assert_eq!(cfg.resolve_url("s3://b/x"), "s3://b/x");
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let base = "name = \"x\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\nformat = \"jsonl\"\n[prompt]\ntemplate = \"{{ text }}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n";
        assert!(PipelineConfig::parse(base, "a.toml", PathBuf::new()).is_ok());
        let bad = |t: &str| {
            PipelineConfig::parse(t, "a.toml", PathBuf::new())
                .unwrap_err()
                .to_string()
        };
        let e = bad(&base.replace("format = \"jsonl\"", "format = \"csv\""));
        assert!(e.contains("a.toml") && e.contains("csv"), "{e}");
        let e = bad(&base.replace("[output]", "[output]\nrow_group_rows = 0"));
        assert!(e.contains("row_group_rows"), "{e}");
        let e = bad(&base.replace("[output]", "[output]\npublishers = 0"));
        assert!(e.contains("output.publishers"), "{e}");
        let e = bad(&base.replace("url = \"r\"", "url = \"o\""));
        assert!(e.contains("must differ"), "{e}");
        let e = bad(&base.replace("kind = \"dataset\"", "kind = \"dataset\"\nbrokers = \"x\""));
        assert!(e.contains("brokers"), "{e}");
        // Each check names its own field.
        let check = |t: &str| {
            let cfg: PipelineConfig = toml::from_str(t).unwrap();
            cfg.check().unwrap_err()
        };
        for (line, field) in [
            ("file_docs = 0", "batching.file_docs"),
            ("max_buffered = 0", "batching.max_buffered"),
            ("max_running = 0", "batching.max_running"),
            ("kv_tokens = 0", "batching.kv_tokens"),
            ("step_tokens = 0", "batching.step_tokens"),
        ] {
            let t = format!("{base}[batching]\n{line}\n");
            assert_eq!(check(&t), ConfigProblem::Zero { field }, "{line}");
        }
        let t = base.replace("[output]", "[output]\nzstd_level = 23");
        assert_eq!(check(&t), ConfigProblem::ZstdLevel { level: 23 });
        let t = format!("{base}[batching]\nmax_running = 64\nstep_tokens = 63\n");
        assert_eq!(
            check(&t),
            ConfigProblem::StepTokens {
                step_tokens: 63,
                max_running: 64
            }
        );
        let e = bad(&t);
        assert!(
            e.contains("a.toml") && e.contains("batching.step_tokens 63"),
            "{e}"
        );
    }

    #[test]
    fn a_grammar_is_optional_and_resolved_next_to_the_definition() {
        let base = "name = \"x\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\nformat = \"jsonl\"\n[prompt]\ntemplate = \"{{ text }}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n";
        let cfg = PipelineConfig::parse(base, "a.toml", PathBuf::from("/jobs")).unwrap();
        assert_eq!(cfg.grammar_path(), None);
        let with = base.replace(
            "schema = \"s.json\"",
            "schema = \"s.json\"\ngrammar = \"g/json.gbnf\"",
        );
        let cfg = PipelineConfig::parse(&with, "a.toml", PathBuf::from("/jobs")).unwrap();
        assert_eq!(cfg.grammar_path(), Some(PathBuf::from("/jobs/g/json.gbnf")));
    }

    #[test]
    fn kafka_tombstones_and_stall_timeout_have_defaults_and_checked_values() {
        let base = "name = \"x\"\nschema = \"s.json\"\n[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"t\"\ngroup = \"g\"\n[prompt]\ntemplate = \"{{ text }}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n";
        let parse = |t: &str| PipelineConfig::parse(t, "k.toml", PathBuf::new());
        let kafka = |t: &str| match parse(t).unwrap().source {
            SourceConfig::Kafka(k) => k,
            SourceConfig::Dataset(_) => panic!("a kafka source"),
        };
        let k = kafka(base);
        assert_eq!(k.tombstones, TombstonePolicy::Reject);
        assert_eq!(k.stall_timeout_s, 120);
        let with = |line: &str| base.replace("group = \"g\"", &format!("group = \"g\"\n{line}"));
        let k = kafka(&with("tombstones = \"skip\"\nstall_timeout_s = 30"));
        assert_eq!(k.tombstones, TombstonePolicy::Skip);
        assert_eq!(k.stall_timeout_s, 30);
        let e = parse(&with("tombstones = \"drop\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("k.toml") && e.contains("drop"), "{e}");
        let e = parse(&with("stall_timeout_s = 0")).unwrap_err().to_string();
        assert!(e.contains("stall_timeout_s"), "{e}");
    }

    #[test]
    fn whitespace_defaults_to_the_engine_and_parses_by_name() {
        let base = "name = \"x\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\nformat = \"jsonl\"\n[prompt]\ntemplate = \"{{ text }}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n";
        let parse = |t: &str| PipelineConfig::parse(t, "a.toml", PathBuf::new());
        assert_eq!(
            parse(base).unwrap().whitespace,
            quarry_engine::EngineConfig::default()
                .schema_options
                .whitespace
        );
        let with = |w: &str| base.replace("[source]", &format!("whitespace = \"{w}\"\n[source]"));
        assert_eq!(
            parse(&with("spaced")).unwrap().whitespace,
            Whitespace::Spaced
        );
        assert_eq!(
            parse(&with("pretty:2")).unwrap().whitespace,
            Whitespace::Pretty { max_run: 2 }
        );
        let e = parse(&with("tabs")).unwrap_err().to_string();
        assert!(
            e.contains("a.toml") && e.contains("whitespace") && e.contains("tabs"),
            "{e}"
        );
    }

    #[test]
    fn chat_vars_are_a_table_of_the_template_s_variables() {
        let base = "name = \"x\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\nformat = \"jsonl\"\n[prompt]\ntemplate = \"{{ text }}\"\n[output]\nurl = \"o\"\n[rejects]\nurl = \"r\"\n";
        let parse = |t: &str| PipelineConfig::parse(t, "a.toml", PathBuf::new());
        assert!(parse(base).unwrap().prompt.chat_vars.0.is_empty());
        let with = base.replace(
            "[output]",
            "chat_vars = { enable_thinking = true, tools = [\"a\"] }\n[output]",
        );
        let vars = parse(&with).unwrap().prompt.chat_vars;
        assert_eq!(vars.0["enable_thinking"], serde_json::json!(true));
        assert_eq!(vars.0["tools"], serde_json::json!(["a"]));
        let e = parse(&base.replace("[output]", "chat_vars = 3\n[output]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a.toml") && e.contains("chat_vars"), "{e}");
    }
}
