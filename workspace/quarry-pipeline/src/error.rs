//! Errors that stop a job. A bad *document* never becomes one of these: it becomes a rejects row
//! (see [`crate::record::RejectCause`]).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PipelineError {
    /// A job definition that cannot be used.
    #[error("pipeline {path}: {message}")]
    Config { path: String, message: String },
    /// The JSON Schema cannot be compiled, validated against, or mapped to Arrow.
    #[error("schema {path}: {message}")]
    Schema { path: String, message: String },
    /// An object-store operation that failed after its retries.
    #[error("object store: {op} {location}: {message}")]
    Store {
        op: &'static str,
        location: String,
        message: String,
    },
    /// A URL we cannot open.
    #[error("url {url}: {message}")]
    Url { url: String, message: String },
    /// An input file that cannot be read as its format says (the whole shard, not one document).
    #[error("input {location}: {message}")]
    Input { location: String, message: String },
    /// Kafka client errors (broker unreachable, commit failed, ...).
    #[error("kafka: {0}")]
    Kafka(String),
    /// Arrow or Parquet encoding failed for a whole file.
    #[error("parquet {location}: {message}")]
    Parquet { location: String, message: String },
    /// The model or engine cannot start.
    #[error("engine: {0}")]
    Engine(String),
    /// Accepted + rejected ≠ consumed: a bug, reported rather than hidden.
    #[error("count conservation violated: {0}")]
    Conservation(String),
    /// A template that does not parse or render.
    #[error("prompt template: {0}")]
    Template(String),
}

pub type Result<T, E = PipelineError> = std::result::Result<T, E>;
