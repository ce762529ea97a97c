//! Side-by-side benchmarks against named peers.
//!
//! - [`peers`]: quarry, outlines-core's `Index` and llguidance's `Matcher` behind one interface,
//!   all fed the same token bytes from the same GGUF vocabulary.
//! - [`xgrammar`]: xgrammar, fed the same, in its own process (`infra/xgrammar_peer.py`).
//! - [`grammar`]: the constraint benchmark (compile time, time to first mask, per-token mask time
//!   cold and warm) run by `cargo run --release -p quarry-bench --bin grammar-bench`
//!   (`make bench-grammar`); results are recorded in `BENCHMARKS.md`.
//!
//! It is never a dependency of the other crates.

pub mod cfg;
pub mod double;
#[cfg(feature = "cuda")]
pub mod gpu_timing;
pub mod grammar;
pub mod peers;
pub mod xgrammar;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use quarry_grammar::Vocabulary;
use quarry_tokenizer::Tokenizer;

pub use quarry_eval::median;

/// A model's tokenizer and the grammar vocabulary built from its token byte table.
pub struct ModelVocab {
    pub tokenizer: Tokenizer,
    pub vocab: Arc<Vocabulary>,
}

impl ModelVocab {
    pub fn load(path: &Path) -> Result<Self> {
        let tokenizer = Tokenizer::from_gguf(path)
            .with_context(|| format!("{}: run `make setup` first", path.display()))?;
        let vocab = quarry_engine::grammar_vocabulary(&tokenizer);
        Ok(Self { tokenizer, vocab })
    }
}

/// `n` real package records from a dpkg status file (fields only, no continuation lines), sorted
/// and taken every k-th so they spread over the file.
pub fn package_records(path: &Path, n: usize) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut recs: Vec<String> = text
        .split("\n\n")
        .filter(|r| r.starts_with("Package: ") && r.contains("\nDescription: "))
        .map(|r| {
            r.lines()
                .filter(|l| !l.starts_with(' '))
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        })
        .collect();
    recs.sort();
    anyhow::ensure!(recs.len() >= n, "only {} records", recs.len());
    let step = recs.len() / n;
    Ok((0..n).map(|i| recs[i * step].clone()).collect())
}

/// `n` package records: every usable one, then copies of them, each copy's number appended.
pub fn fed_documents(status: &Path, n: usize) -> Result<Vec<String>> {
    let records = quarry_eval::usable_package_records(status)?;
    anyhow::ensure!(!records.is_empty(), "no usable package records");
    Ok((0..n)
        .map(|i| match i / records.len() {
            0 => records[i].clone(),
            copy => format!("{}\n(copy {copy})", records[i % records.len()]),
        })
        .collect())
}
