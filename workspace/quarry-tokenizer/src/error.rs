use std::path::PathBuf;

/// Everything that can go wrong when loading or using a tokenizer.
///
/// Each variant names what failed and where (a file, a GGUF key, a token id).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a readable GGUF file (bad magic, truncated, corrupt header).
    #[error("{path} is not a readable GGUF file: {source}")]
    Gguf {
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// A metadata key the tokenizer needs is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: &'static str },
    /// A metadata key has an impossible value (`message` says why).
    #[error("GGUF metadata key `{key}` is invalid: {message}")]
    InvalidKey { key: &'static str, message: String },
    /// A metadata key's value is not of the type it must have (candle's error says which).
    #[error("GGUF metadata key `{key}` is invalid: {source}")]
    KeyType {
        key: &'static str,
        #[source]
        source: Box<candle_core::Error>,
    },
    /// The vocabulary type (`tokenizer.ggml.model`) or pre-tokenizer is one we do not implement.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// `tokenizer.json` could not be parsed or built.
    #[error("invalid tokenizer.json at {path}: {message}")]
    TokenizerJson { path: PathBuf, message: String },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownTokenId { id: u32, vocab_size: usize },
    /// The underlying `tokenizers` library failed to encode or build.
    #[error("tokenizer failure: {0}")]
    Tokenizers(#[source] tokenizers::Error),
    /// The chat template failed to compile or render; the message carries the template's line.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The model has no chat template (`tokenizer.chat_template` is absent).
    #[error("this model has no chat template")]
    NoChatTemplate,
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

pub(crate) fn tk_err(e: tokenizers::Error) -> TokenizerError {
    TokenizerError::Tokenizers(e)
}
