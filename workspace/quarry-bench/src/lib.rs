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

/// The `.json` files under `dir`, any depth, sorted (the real-schema corpus).
pub fn schema_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(schema_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// How a record drawn under an engine's masks ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The mask allowed the end-of-sequence token: the record is complete.
    Stop,
    /// Nothing was allowed before the record could end.
    DeadEnd,
    /// Still open after the most tokens a record may take.
    MaxTokens,
    /// The engine refused a token its own mask allowed.
    Refused,
}

/// A record drawn under an engine's masks: its bytes, and how it ended.
#[derive(Debug, Clone)]
pub struct Drawn {
    pub bytes: Vec<u8>,
    pub end: End,
}

/// The tokens a [`draw`] that closes takes first: `"`, `]` and `}` alone, in that order.
pub fn closing_tokens(vocab: &Vocabulary) -> Vec<u32> {
    [b"\"", b"]", b"}"]
        .iter()
        .filter_map(|c| (0..vocab.len() as u32).find(|&id| vocab.token_bytes(id) == Some(&c[..])))
        .collect()
}

/// Draws one record from `walker`: it ends where the mask allows `eos`. Otherwise a 64-bit LCG
/// steps, and where its top four bits are below 5 (5 times in 16) the next token is the smallest
/// allowed one, so strings run to their bounds; where they are 5 to 7 and `closing` holds
/// tokens, the first of them allowed (so records end); else the allowed token the LCG picks.
/// `infra/xgrammar_peer.py` draws by the same rule. `h` carries the LCG from record to record.
pub fn draw(
    walker: &mut dyn peers::Walker,
    vocab: &Vocabulary,
    eos: u32,
    closing: &[u32],
    max_tokens: usize,
    h: &mut u64,
) -> Drawn {
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut allowed = Vec::new();
    let mut bytes = Vec::new();
    for _ in 0..max_tokens {
        walker.fill_mask(&mut mask);
        let bit = |id: u32| mask[id as usize / 32] >> (id % 32) & 1 == 1;
        if bit(eos) {
            return Drawn {
                bytes,
                end: End::Stop,
            };
        }
        allowed.clear();
        allowed.extend((0..vocab.len() as u32).filter(|&id| bit(id) && !vocab.is_eos(id)));
        if allowed.is_empty() {
            return Drawn {
                bytes,
                end: End::DeadEnd,
            };
        }
        *h = h
            .wrapping_mul(0x5851_F42D_4C95_7F2D)
            .wrapping_add(0x1405_7B7E_F767_814F);
        let close = closing.iter().copied().find(|&c| bit(c));
        let id = match (*h >> 60, close) {
            (0..5, _) => allowed[0],
            (5..8, Some(c)) => c,
            _ => allowed[(*h >> 20) as usize % allowed.len()],
        };
        if !walker.accept(id) {
            return Drawn {
                bytes,
                end: End::Refused,
            };
        }
        bytes.extend_from_slice(vocab.token_bytes(id).unwrap_or_default());
    }
    Drawn {
        bytes,
        end: End::MaxTokens,
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

#[cfg(test)]
mod tests {
    use super::*;
    use peers::{Peer, Quarry, Spec};

    /// Every single byte, then the end token.
    fn byte_vocab() -> Arc<Vocabulary> {
        let bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
        let tokens = bytes
            .iter()
            .map(|b| (&b[..], false))
            .chain([(&b""[..], true)]);
        Arc::new(Vocabulary::new(tokens, &[256]))
    }

    #[test]
    fn draws_end_and_follow_the_mask() {
        let vocab = byte_vocab();
        let closing = closing_tokens(&vocab);
        assert_eq!(closing, vec![b'"' as u32, b']' as u32, b'}' as u32]);
        let quarry = Quarry {
            vocab: vocab.clone(),
            eager: false,
        };
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "array", "items": {"type": "integer"}}},
            "required": ["a", "b"],
            "additionalProperties": false
        });
        let validator = jsonschema::validator_for(&schema).unwrap();
        let compiled = quarry.compile_spec(&Spec::Schema(schema)).unwrap();
        let (mut h, mut ends) = (7u64, Vec::new());
        for _ in 0..16 {
            let mut w = compiled.walker().unwrap();
            let d = draw(w.as_mut(), &vocab, 256, &closing, 200, &mut h);
            if d.end == End::Stop {
                let v: serde_json::Value = serde_json::from_slice(&d.bytes).unwrap();
                assert!(
                    validator.is_valid(&v),
                    "{}",
                    String::from_utf8_lossy(&d.bytes)
                );
            }
            ends.push(d.end);
        }
        // Closing tokens end records within the bound; without them no draw takes `"` in a
        // string (the smallest allowed byte there is 0x20), so records stay open longer.
        assert!(ends.iter().all(|e| *e == End::Stop), "{ends:?}");
        let mut w = compiled.walker().unwrap();
        let open = draw(w.as_mut(), &vocab, 256, &[], 3, &mut h);
        assert_eq!(open.end, End::MaxTokens);
        assert_eq!(open.bytes.len(), 3);
    }
}
