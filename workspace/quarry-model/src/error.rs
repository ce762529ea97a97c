use std::path::PathBuf;

/// Errors from loading or running a model. Each names the file, key or tensor involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a readable GGUF file: {message}")]
    Gguf { path: PathBuf, message: String },
    /// The header is intact but tensor data runs past the end of the file (an interrupted download).
    #[error("tensor `{tensor}` needs bytes up to offset {needed} but the file has only {file_bytes}: the file is truncated")]
    Truncated {
        tensor: String,
        needed: u64,
        file_bytes: u64,
    },
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("GGUF metadata key `{key}` is invalid: {message}")]
    InvalidKey { key: String, message: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
