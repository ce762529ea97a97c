use std::path::PathBuf;

/// Errors from loading or running a model. Each names the file, key, tensor or sequence involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a readable GGUF file: {source}")]
    Gguf {
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// The header is intact but tensor data runs past the end of the file (an interrupted download).
    #[error("tensor `{tensor}` needs bytes up to offset {needed} but the file has only {file_bytes}: the file is truncated")]
    Truncated {
        tensor: String,
        needed: u64,
        file_bytes: u64,
    },
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: String },
    /// A key whose value quarry cannot use (`message` says why, in quarry's words).
    #[error("GGUF metadata key `{key}` is invalid: {message}")]
    InvalidKey { key: String, message: String },
    /// A key whose value is not of the type it must have (candle's error says which).
    #[error("GGUF metadata key `{key}` is invalid: {source}")]
    KeyType {
        key: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    #[error("architecture `{architecture}` is not supported (supported: {supported})")]
    UnsupportedArchitecture {
        architecture: String,
        supported: String,
    },
    #[error("tensor `{tensor}` is missing from the GGUF file")]
    MissingTensor { tensor: String },
    #[error("tensor `{tensor}` has shape {found}, expected {expected}")]
    TensorShape {
        tensor: String,
        expected: String,
        found: String,
    },
    #[error("cannot load tensor `{tensor}`: {source}")]
    LoadTensor {
        tensor: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// `--device` named something this build cannot run on.
    #[error("device `{device}`: {message}")]
    Device { device: String, message: String },
    /// A Hugging Face checkpoint folder (or its index) that cannot be read as one: no weights,
    /// a config that is not JSON, a shard outside the folder.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// A device this build supports that cannot be opened (no such GPU, a driver error).
    #[error("device `{device}` cannot be opened: {source}")]
    DeviceOpen {
        device: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// The KV pool cannot be created with these settings (zero pages, or more memory than allowed).
    #[error("KV pool: {message}")]
    Pool { message: String },
    /// A sequence of a forward batch is malformed (bad token id, page id, position or block table).
    #[error("batch sequence {seq}: {message}")]
    Batch { seq: usize, message: String },
    /// The model's weights do not fit in the GPU's free memory in any form (quantized, or as f16
    /// copies), with what they need and what is free.
    #[error("the model does not fit on the GPU: {message}")]
    DoesNotFit { message: String },
    /// The pool was made for a different model shape or device.
    #[error("the KV pool does not fit this model: {message}")]
    PoolMismatch { message: String },
    #[error("sampling: {message}")]
    Sampling { message: String },
    /// The forward pass found something it cannot run (a bug, not bad input).
    #[error("forward pass: {message}")]
    Forward { message: String },
    /// A tensor operation (candle's, or one of quarry's kernels through it) failed inside the
    /// forward pass: a bug or a device error, not bad input.
    #[error("forward pass: {source}")]
    Candle {
        #[source]
        source: Box<candle_core::Error>,
    },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Candle {
            source: Box::new(without_backtrace(e)),
        }
    }
}

/// candle's error without the backtrace it may carry (candle attaches one when `RUST_BACKTRACE`
/// is set; a user-facing message wants only the cause): what a typed error keeps as its source.
pub(crate) fn without_backtrace(e: candle_core::Error) -> candle_core::Error {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        other => other,
    }
}
