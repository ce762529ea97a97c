//! Helpers shared by the tokenizer's integration tests: the real model files from `make setup`.
#![allow(dead_code)]

use std::path::PathBuf;

use quarry_tokenizer::Tokenizer;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tokenizer of the checkpoint folder `models/checkpoints/<name>` that
/// `tests/fixtures/checkpoints.py` builds from a GGUF (`make test` runs it).
pub fn checkpoint(name: &str) -> Tokenizer {
    let dir = root().join("models/checkpoints").join(name);
    assert!(
        dir.exists(),
        "{} is missing: run `make test`'s set-up",
        dir.display()
    );
    Tokenizer::from_checkpoint(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
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
