//! Errors that stop a job. A bad *document* never becomes one of these: it becomes a rejects row
//! (see [`crate::record::RejectCause`]).

use thiserror::Error;

/// How far one partition is from its high watermark when a worker stops.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    pub partition: i32,
    /// The group's committed offset; `None` when nothing was committed or it could not be read.
    pub committed: Option<i64>,
    /// The offset after the last range this worker published. The output is the source of truth
    /// for progress: a commit refused in a rebalance (`IllegalGeneration`) leaves the committed
    /// offset behind what is durably published, and the next owner resumes from the output.
    pub published: Option<i64>,
    /// The partition's high watermark; `None` when it could not be read.
    pub high_watermark: Option<i64>,
    /// `high_watermark - max(committed, published, low watermark)`; `None` when unknown.
    pub lag: Option<i64>,
}

impl PartitionLag {
    /// Caught up: the lag is known and zero.
    pub fn is_done(&self) -> bool {
        self.lag == Some(0)
    }
}

fn known(v: Option<i64>) -> String {
    v.map_or("unknown".to_string(), |v| v.to_string())
}

fn retried(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

fn lag_list(parts: &[PartitionLag]) -> String {
    let one = |p: &PartitionLag| {
        let opt = known;
        format!(
            "partition {} lag {} (committed {}, published {}, high watermark {})",
            p.partition,
            opt(p.lag),
            opt(p.committed),
            opt(p.published),
            opt(p.high_watermark)
        )
    };
    parts.iter().map(one).collect::<Vec<_>>().join("; ")
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// A job definition whose values cannot be used together (the checker's sentence says
    /// which and why).
    #[error("pipeline {path}: {message}")]
    Config { path: String, message: String },
    /// A file the job names (its definition, a grammar) cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// A job definition that is not valid TOML for its fields.
    #[error("pipeline {path}: {source}")]
    Definition {
        path: String,
        source: Box<toml::de::Error>,
    },
    /// A command given a job of the other kind (`quarry worker` with a dataset source, …).
    #[error("pipeline {pipeline}: `{command}` needs source.kind = \"{needs}\"")]
    WrongSource {
        pipeline: String,
        command: &'static str,
        needs: &'static str,
    },
    /// The job's JSON Schema cannot be read, resolved, validated against, mapped to columns or
    /// decoded by.
    #[error("schema {path}: {source}")]
    Schema { path: String, source: SchemaProblem },
    /// The job's grammar file (`grammar`) cannot be a decoding constraint.
    #[error("grammar {path}: {source}")]
    Grammar {
        path: String,
        source: quarry_grammar::GrammarError,
    },
    /// The metrics endpoint cannot listen.
    #[error("metrics.listen {addr}: {source}")]
    MetricsListen {
        addr: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The signal handlers cannot be installed.
    #[error("cannot install the SIGTERM/SIGINT handlers: {0}")]
    Signals(std::io::Error),
    /// An object-store operation that failed: after `attempts` tries for a transient error, at
    /// once for one a retry cannot fix (nothing there, or a store that cannot create-if-absent).
    #[error("object store: {op} {location}: {source}{}", retried(*.attempts))]
    Store {
        op: &'static str,
        location: String,
        attempts: u32,
        source: object_store::Error,
    },
    /// A URL or local path that cannot be opened as a location.
    #[error("url {url}: {source}")]
    Url { url: String, source: UrlProblem },
    /// An input that is not there, or a file that cannot be read as its format says (the whole
    /// shard, not one document).
    #[error("input {location}: {source}")]
    Input {
        location: String,
        source: InputProblem,
    },
    /// A Kafka client call that failed (broker unreachable, commit failed, …); `op` names it.
    #[error("kafka: {op}: {source}")]
    Kafka {
        op: &'static str,
        source: rdkafka::error::KafkaError,
    },
    /// A partition assigned to this worker whose published files could not be read to find
    /// where it resumes; nothing of it was consumed.
    #[error("kafka: cannot reconcile partition {partition} from the output: {source}")]
    Reconcile {
        partition: i32,
        source: Box<PipelineError>,
    },
    /// A range's claim (`_claim-<first>` beside the rejects markers) that does not hold the name
    /// of a range of its partition starting at its offset: written by something other than quarry.
    #[error("kafka: claim {claim} holds {held:?}, not the name of a range of its partition starting at its offset")]
    BadClaim { claim: String, held: String },
    /// A partition sat behind its high watermark with nothing delivered for longer than
    /// `source.stall_timeout_s`. Its records were not skipped: a restart starts from them again.
    #[error(
        "kafka topic {topic} partition {partition}: stalled at offset {} (high watermark \
         {}) for {stalled_s} s, over source.stall_timeout_s = {limit_s}; cause: {cause}; the \
         records were not skipped",
        known(*.offset),
        known(*.high_watermark)
    )]
    Stalled {
        topic: String,
        partition: i32,
        /// `None` when neither the worker nor the broker could say (nothing delivered yet).
        offset: Option<i64>,
        /// `None` when the broker could not say where the partition ends.
        high_watermark: Option<i64>,
        stalled_s: u64,
        limit_s: u64,
        cause: StallCause,
    },
    /// `--idle-exit` stopped with records left: a committed offset short of its high watermark
    /// (or one that could not be read).
    #[error("kafka topic {topic}: idle exit with records left: {}", lag_list(.partitions))]
    LagLeft {
        topic: String,
        partitions: Vec<PartitionLag>,
    },
    /// A whole file that Arrow or Parquet could not encode, or read back.
    #[error("parquet {location}: {source}")]
    Parquet {
        location: String,
        source: FormatError,
    },
    /// The model file cannot be loaded on the device, or the device cannot be opened.
    #[error("model {path}: {source}")]
    Model {
        path: String,
        source: quarry_model::ModelError,
    },
    /// The model file's tokenizer cannot be read.
    #[error("tokenizer of {path}: {source}")]
    Tokenizer {
        path: String,
        source: quarry_tokenizer::TokenizerError,
    },
    /// The engine cannot start or step (a device error or a bug; a bad request is a reject).
    /// A dataset job's reading or publishing thread ended without a result (it panicked).
    #[error("the {what} thread of the dataset job stopped without a result (see the panic above)")]
    IoThread { what: &'static str },
    #[error("engine: {0}")]
    Engine(#[from] quarry_engine::EngineError),
    /// Accepted + rejected (+ skipped) ≠ consumed: a bug, reported rather than hidden. `file` is
    /// the file whose counts disagree, or `None` for a whole job's totals.
    #[error(
        "count conservation violated{}: accepted {accepted} + rejected {rejected} + skipped {skipped} != consumed {consumed}",
        file.as_ref().map(|f| format!(" in {f}")).unwrap_or_default()
    )]
    Conservation {
        file: Option<String>,
        accepted: u64,
        rejected: u64,
        skipped: u64,
        consumed: u64,
    },
    /// `prompt.template` does not parse.
    #[error("prompt template: {0:#}")]
    Template(#[from] minijinja::Error),
    /// `prompt.chat` is on and the model's chat template cannot render the job's turns (no
    /// template, or one that refuses them, such as a system message): every document would be
    /// rejected, so the job stops before the first.
    #[error("prompt.chat: {problem}; {fix}")]
    ChatTurns { problem: String, fix: &'static str },
}

/// What the worker saw while a partition did not move: the consumer errors since it last moved,
/// by kind, with how many of each so far. librdkafka does not say which partition an error
/// belongs to, so these are the client's errors in that time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StallCause {
    pub consumer_errors: Vec<(String, u64)>,
}

impl std::fmt::Display for StallCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.consumer_errors.is_empty() {
            return f.write_str(
                "nothing delivered and no consumer error reported (a fetch that never completes?)",
            );
        }
        f.write_str("consumer errors ")?;
        for (i, (kind, n)) in self.consumer_errors.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{kind} ({n} so far)")?;
        }
        Ok(())
    }
}

/// Why a URL or local path cannot be opened as a location.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum UrlProblem {
    #[error("not a URL: {0}")]
    Parse(#[from] url::ParseError),
    #[error("no bucket in the URL")]
    NoBucket,
    #[error("unknown scheme `{0}`; use file://, s3://, gs://, az:// or memory://")]
    UnknownScheme(String),
    #[error("the input folder does not exist")]
    NoInputFolder,
    #[error("cannot use the folder: {0}")]
    Folder(std::io::Error),
    /// The store's builder refuses the URL or the environment's settings.
    #[error(transparent)]
    Store(#[from] object_store::Error),
}

/// Why an input cannot be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InputProblem {
    #[error("no such file or folder")]
    NotFound,
    #[error("no .parquet files there")]
    NoParquetFiles,
    /// An input file that cannot be read (a Parquet file, a compressed JSONL stream).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Two input files whose shards would be published under one name (`a.jsonl` and
    /// `a.jsonl.gz`, or `a.json`): the second would be taken for the first, published already.
    #[error("{first} and {second} would both be published as {name}: rename one")]
    SameShardName {
        name: String,
        first: String,
        second: String,
    },
    /// A file cut into a different number of parts by an earlier run of the job than now
    /// (`source.split_bytes` changed, or the file): its documents would be published twice.
    #[error(
        "{file} was cut into {was} part(s) by an earlier run ({published} is published) and into \
         {now} now: `source.split_bytes` or the file changed since; run with the earlier \
         split_bytes, or write to a new output"
    )]
    SplitChanged {
        file: String,
        published: String,
        was: usize,
        now: usize,
    },
    /// `source.split_bytes` far below a file's size.
    #[error(
        "{file} ({size} bytes) would be cut into more than {most} parts at split_bytes = {split}: \
         raise source.split_bytes (or --split-bytes)"
    )]
    TooManyParts {
        file: String,
        size: u64,
        split: u64,
        most: u64,
    },
}

/// What is wrong with a job's JSON Schema (or a document its references name), or its grammar.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SchemaProblem {
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    /// A path with no `file://` URL, which the schema's references resolve against.
    #[error("no file URL for this path")]
    NoFileUrl,
    /// References that do not resolve, or a schema the compiler refuses.
    #[error(transparent)]
    Schema(#[from] quarry_grammar::SchemaError),
    /// The validator (the `jsonschema` crate) refuses the schema.
    #[error("the validator refuses it: {0}")]
    Validator(Box<jsonschema::ValidationError<'static>>),
    /// The schema or grammar cannot become a decoding constraint.
    #[error("cannot be a decoding constraint: {0}")]
    Constraint(#[from] quarry_grammar::GrammarError),
    /// A property named like a lineage column (`_source`, `_offset`, …).
    #[error("property `{0}` collides with a lineage column; rename it in the schema")]
    LineageCollision(String),
}

/// Why Arrow or Parquet could not write or read a file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// Not a readable Parquet file (bad footer, cut short), or the writer failed.
    #[error("{0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A compressed input stream that does not decompress (corrupt or cut short).
    #[error("cannot decompress: {0}")]
    Decompress(std::io::Error),
    /// A column the reader needs is not in the file.
    #[error("the file has no `{0}` column")]
    MissingColumn(&'static str),
}

pub type Result<T, E = PipelineError> = std::result::Result<T, E>;
