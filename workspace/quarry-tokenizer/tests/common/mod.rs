//! Helpers shared by the tokenizer's integration tests: the real model files from `make setup`.

use std::path::PathBuf;

use quarry_tokenizer::Tokenizer;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tokenizer of a model file under `models/` (or `$QUARRY_MODELS_DIR`).
pub fn model(file: &str) -> Tokenizer {
    let dir = std::env::var_os("QUARRY_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or(root().join("models"));
    let path = dir.join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make setup` first",
        path.display()
    );
    Tokenizer::from_gguf(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}
