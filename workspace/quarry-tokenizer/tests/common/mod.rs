//! Helpers shared by the tokenizer's integration tests: the real model files from `make setup`.
#![allow(dead_code)]

use std::io::Read;
use std::path::PathBuf;

use quarry_tokenizer::Tokenizer;
use serde_json::Value;

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

/// A JSON fixture of `tests/fixtures/tokenizer/` (gzipped where the name ends in `.gz`).
pub fn fixture(name: &str) -> Value {
    let path = root().join("tests/fixtures/tokenizer").join(name);
    let mut text = String::new();
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if name.ends_with(".gz") {
        flate2::read::GzDecoder::new(file).read_to_string(&mut text)
    } else {
        std::io::BufReader::new(file).read_to_string(&mut text)
    }
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// llama.cpp's bytes of every token (`token_to_piece`, special tokens spelled), one hex line per
/// id, from a `.pieces.txt.gz` fixture.
pub fn pieces(name: &str) -> Vec<Vec<u8>> {
    let path = root().join("tests/fixtures/tokenizer").join(name);
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
