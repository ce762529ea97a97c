//! xgrammar, the peer that vLLM and SGLang use by default, measured in its own process.
//!
//! xgrammar is a C++ library with Python bindings and no Rust crate, so it cannot sit behind
//! [`crate::peers::Peer`]'s in-process calls. `infra/xgrammar_peer.py` runs it instead: the
//! benchmark hands it the same token bytes, constraints and token walks as the other peers, and
//! the script times each xgrammar call itself (no pipe inside a timing; one Python call into the
//! bindings inside each, whose cost it reports as `call_overhead_us`). Its answers come back in
//! the shape [`crate::grammar::measure`] gives the in-process peers, plus the masks of the first
//! cold walk where asked, so the benchmark can check that both engines allow the same tokens.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use quarry_grammar::Vocabulary;
use serde_json::{json, Value};

use crate::peers::{single_eos, Spec};
use crate::{Drawn, End};

/// The script that runs xgrammar, relative to the repository root (where the benchmarks run).
pub const SCRIPT: &str = "infra/xgrammar_peer.py";

/// The benchmarks' options for the xgrammar peer.
#[derive(clap::Args, Debug, Clone)]
pub struct XgrammarArgs {
    /// A Python with xgrammar installed (`make xgrammar-peer` makes one, under `$QUARRY_CACHE`;
    /// the `make bench-*` targets pass it where it exists). Without it xgrammar is left out of
    /// the run, and the run says so.
    #[arg(long)]
    pub xgrammar_python: Option<PathBuf>,
    /// Threads xgrammar's compiler may use (vLLM gives it 8; this machine's cores by default).
    #[arg(long, default_value_t = default_threads())]
    pub xgrammar_threads: usize,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl XgrammarArgs {
    /// The peer started on `vocab`, or `None` (said on stdout) where no Python was given.
    pub fn start(&self, vocab: &Vocabulary) -> Result<Option<Xgrammar>> {
        match &self.xgrammar_python {
            None => {
                println!(
                    "xgrammar: not in this run (`make xgrammar-peer`, then --xgrammar-python)"
                );
                Ok(None)
            }
            Some(python) => {
                let x = Xgrammar::start(python, Path::new(SCRIPT), vocab, self.xgrammar_threads)?;
                let s = &x.setup;
                println!(
                    "xgrammar {}: vocabulary set-up {:.0} ms, {} compiler threads, {:.2} µs a timed empty call (inside each of its timings)",
                    s.version, s.setup_ms, s.threads, s.call_overhead_us
                );
                Ok(Some(x))
            }
        }
    }
}

/// What the peer answered when it took the vocabulary.
#[derive(Debug, Clone)]
pub struct Setup {
    pub version: String,
    pub setup_ms: f64,
    /// One timed empty call into the bindings (median, µs): inside every timing it reports.
    pub call_overhead_us: f64,
    pub threads: usize,
}

impl Setup {
    /// For a benchmark's JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "version": self.version,
            "setup_ms": self.setup_ms,
            "call_overhead_us": self.call_overhead_us,
            "threads": self.threads,
        })
    }
}

/// The xgrammar process, one vocabulary for its life.
pub struct Xgrammar {
    io: RefCell<(ChildStdin, BufReader<ChildStdout>)>,
    child: RefCell<Child>,
    pub setup: Setup,
    words: usize,
}

/// How [`Xgrammar::walk`] walks.
#[derive(Debug, Clone, Copy)]
pub struct Walk {
    /// Fresh compiles, each walking every record.
    pub cold_reps: usize,
    /// Walks of every record on the last compile.
    pub warm_reps: usize,
    /// Return the first cold walk's masks.
    pub masks: bool,
    /// A mask after each record's last token too (as [`crate::grammar::measure`] takes one).
    pub final_mask: bool,
}

impl Default for Walk {
    fn default() -> Self {
        Self {
            cold_reps: 1,
            warm_reps: 0,
            masks: false,
            final_mask: true,
        }
    }
}

/// A walk's timings, each in µs: as [`crate::grammar::measure`] takes them.
#[derive(Debug, Clone, Default)]
pub struct Walked {
    pub compile_us: Vec<f64>,
    pub first_mask_us: Vec<f64>,
    /// Every mask of each cold rep (a fresh compile, then every record).
    pub cold: Vec<Vec<f64>>,
    pub warm: Vec<f64>,
    /// The masks of the first cold walk, in order, where asked.
    pub masks: Vec<Vec<u32>>,
    /// What xgrammar's compiler warned, each message once: a keyword it ignores, so that its
    /// language is wider than the schema's (`pattern combined with minLength/maxLength is not
    /// supported; ignoring minLength/maxLength`).
    pub warnings: Vec<String>,
}

impl Xgrammar {
    /// Starts `script` under `python` and hands it `vocab`'s token bytes: every token as quarry
    /// holds it, its first EOS as the stop token, the special tokens marked so that no
    /// constraint allows them as text (as [`crate::peers::Llguidance`] marks them).
    pub fn start(python: &Path, script: &Path, vocab: &Vocabulary, threads: usize) -> Result<Self> {
        if !script.exists() {
            bail!(
                "{} not found: run the benchmark from the repository root",
                script.display()
            );
        }
        let mut child = Command::new(python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), script.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = Self {
            io: RefCell::new((stdin, stdout)),
            child: RefCell::new(child),
            setup: Setup {
                version: String::new(),
                setup_ms: 0.0,
                call_overhead_us: 0.0,
                threads,
            },
            words: vocab.mask_words(),
        };
        let tokens: Vec<String> = (0..vocab.len() as u32)
            .map(|id| hex(vocab.token_bytes(id).unwrap_or_default()))
            .collect();
        let special: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.is_special(id))
            .collect();
        let a = peer.ask(&json!({
            "op": "vocab",
            "tokens": tokens,
            "eos": single_eos(vocab)?,
            "special": special,
            "threads": threads,
        }))?;
        peer.setup = Setup {
            version: a["version"].as_str().unwrap_or("unknown").to_string(),
            setup_ms: a["setup_ms"].as_f64().unwrap_or(f64::NAN),
            call_overhead_us: a["call_overhead_us"].as_f64().unwrap_or(f64::NAN),
            threads,
        };
        Ok(peer)
    }

    /// One request and its answer; an `error` answer is an `Err` with its message.
    fn ask(&self, request: &Value) -> Result<Value> {
        let mut io = self.io.borrow_mut();
        let (stdin, stdout) = &mut *io;
        writeln!(stdin, "{request}").context("writing to the xgrammar peer")?;
        stdin.flush()?;
        let mut line = String::new();
        if stdout.read_line(&mut line)? == 0 {
            let status = self.child.borrow_mut().wait()?;
            bail!("the xgrammar peer exited ({status}) without answering");
        }
        let answer: Value = serde_json::from_str(&line)
            .with_context(|| format!("the xgrammar peer answered {line:?}"))?;
        match answer.get("error") {
            Some(e) => Err(anyhow!("xgrammar: {}", e.as_str().unwrap_or("error"))),
            None => Ok(answer),
        }
    }

    /// `cold_reps` fresh compiles of `spec`, each walking every record (a mask before each
    /// token, and after the last where `how.final_mask`), then `warm_reps` walks on the last;
    /// with `how.masks`, the first cold walk's masks too.
    pub fn walk(&self, spec: &Spec, records: &[Vec<u32>], how: Walk) -> Result<Walked> {
        let a = self.ask(&json!({
            "op": "walk",
            "spec": spec_json(spec),
            "records": records,
            "cold_reps": how.cold_reps,
            "warm_reps": how.warm_reps,
            "masks": how.masks,
            "final_mask": how.final_mask,
        }))?;
        let floats = |v: &Value| -> Vec<f64> {
            v.as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let masks = a["masks"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .map(|m| words_from_hex(m.as_str().unwrap_or(""), self.words))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Walked {
            compile_us: floats(&a["compile_us"]),
            first_mask_us: floats(&a["first_mask_us"]),
            cold: a["cold"]
                .as_array()
                .map(|reps| reps.iter().map(floats).collect())
                .unwrap_or_default(),
            warm: floats(&a["warm"]),
            masks,
            warnings: a["warnings"]
                .as_array()
                .map(|ws| {
                    ws.iter()
                        .filter_map(|w| w.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// `reps` fresh compiles of `spec`, each with its first mask: their times (µs) and what
    /// the compiler warned, in a [`Walked`] without walks.
    pub fn compile(&self, spec: &Spec, reps: usize) -> Result<Walked> {
        let how = Walk {
            cold_reps: reps,
            ..Walk::default()
        };
        self.walk(spec, &[], how)
    }

    /// `count` records drawn under xgrammar's own masks by [`crate::draw`]'s rule (in the
    /// script, closing with `closing`), each with how it ended, and what the compiler warned.
    pub fn sample(
        &self,
        spec: &Spec,
        count: usize,
        max_tokens: usize,
        seed: u64,
        closing: &[u32],
    ) -> Result<(Vec<Drawn>, Vec<String>)> {
        let a = self.ask(&json!({
            "op": "sample",
            "spec": spec_json(spec),
            "count": count,
            "max_tokens": max_tokens,
            "seed": seed,
            "closing": closing,
        }))?;
        let mut records = Vec::new();
        for r in a["records"].as_array().into_iter().flatten() {
            let bytes = bytes_from_hex(r["text"].as_str().unwrap_or(""))
                .context("a record from the xgrammar peer")?;
            let end = match r["end"].as_str() {
                Some("stop") => End::Stop,
                Some("dead_end") => End::DeadEnd,
                Some("refused") => End::Refused,
                _ => End::MaxTokens,
            };
            records.push(Drawn { bytes, end });
        }
        let warnings = a["warnings"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok((records, warnings))
    }

    /// A matcher of `spec` that the caller steps (untimed): its first mask.
    pub fn begin(&self, spec: &Spec) -> Result<Vec<u32>> {
        let a = self.ask(&json!({"op": "begin", "spec": spec_json(spec)}))?;
        words_from_hex(a["mask"].as_str().unwrap_or(""), self.words)
    }

    /// Accepts `token` on the matcher of [`Xgrammar::begin`]: the next mask, or an error where
    /// xgrammar refuses the token.
    pub fn accept(&self, token: u32) -> Result<Vec<u32>> {
        let a = self.ask(&json!({"op": "accept", "token": token}))?;
        words_from_hex(a["mask"].as_str().unwrap_or(""), self.words)
    }
}

impl Drop for Xgrammar {
    fn drop(&mut self) {
        // The script keeps nothing worth a clean exit.
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The script's form of `spec`: a GBNF grammar goes to xgrammar's EBNF reader, which takes
/// GBNF's syntax but for an empty alternative ([`ebnf`]).
fn spec_json(spec: &Spec) -> Value {
    match spec {
        Spec::Regex(r) => json!({"regex": r}),
        Spec::Schema(s) => json!({"schema": s}),
        Spec::JsonObject => json!({"json_object": true}),
        Spec::Grammar { gbnf, .. } => json!({"ebnf": ebnf(gbnf)}),
    }
}

/// `gbnf` with each empty alternative written `""`, the one GBNF spelling xgrammar's EBNF
/// reader refuses (`ws ::= | " "` reads as `ws ::= "" | " "`): the same language.
fn ebnf(gbnf: &str) -> String {
    let mut out = String::with_capacity(gbnf.len());
    for line in gbnf.lines() {
        let (code, comment) = match line.find('#') {
            // A `#` inside a string or class is left alone: only lines whose `#` follows
            // whitespace are split (the grammars' comments).
            Some(i) if i == 0 || line.as_bytes()[i - 1].is_ascii_whitespace() => line.split_at(i),
            _ => (line, ""),
        };
        let mut code = code.to_string();
        for (empty, filled) in [
            ("::= |", "::= \"\" |"),
            ("::=|", "::= \"\" |"),
            ("( |", "(\"\" |"),
            ("(|", "(\"\" |"),
            ("| |", "| \"\" |"),
            ("| )", "| \"\")"),
        ] {
            while code.contains(empty) {
                code = code.replace(empty, filled);
            }
        }
        out.push_str(&code);
        out.push_str(comment);
        out.push('\n');
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `text` spells in hex.
fn bytes_from_hex(text: &str) -> Result<Vec<u8>> {
    if text.len() % 2 == 1 || !text.is_ascii() {
        bail!("{} characters are not hex bytes", text.len());
    }
    Ok((0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()?)
}

/// A mask the script sent as the hex of its little-endian 32-bit words.
fn words_from_hex(text: &str, words: usize) -> Result<Vec<u32>> {
    let bytes = bytes_from_hex(text).context("a mask from the xgrammar peer")?;
    if bytes.len() != words * 4 {
        bail!(
            "a mask from the xgrammar peer has {} bytes, not {}",
            bytes.len(),
            words * 4
        );
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Where two engines' masks along the same walk differ, leaving out the EOS ids (a peer takes
/// one of them, quarry all).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaskComparison {
    /// Steps compared.
    pub steps: usize,
    /// Steps whose masks differ.
    pub differing_steps: usize,
    /// The distinct tokens only quarry allowed at some step, and only the peer.
    pub only_quarry: BTreeSet<u32>,
    pub only_peer: BTreeSet<u32>,
    /// The first differing step, described with the vocabulary's token bytes.
    pub first: Option<String>,
}

impl MaskComparison {
    /// For a benchmark's JSON: counts, and how many of each side's tokens hold a backslash (a
    /// JSON string's escape, which quarry spells one way and a peer may spell several).
    pub fn to_json(&self, vocab: &Vocabulary) -> Value {
        let escapes = |ids: &BTreeSet<u32>| {
            ids.iter()
                .filter(|&&id| vocab.token_bytes(id).unwrap_or_default().contains(&b'\\'))
                .count()
        };
        json!({
            "steps": self.steps,
            "differing_steps": self.differing_steps,
            "tokens_only_quarry": self.only_quarry.len(),
            "tokens_only_peer": self.only_peer.len(),
            "with_backslash_only_quarry": escapes(&self.only_quarry),
            "with_backslash_only_peer": escapes(&self.only_peer),
            "first_difference": self.first,
        })
    }
}

/// Compares quarry's masks (`ours`) with a peer's along the same walk.
pub fn compare_masks(vocab: &Vocabulary, ours: &[Vec<u32>], theirs: &[Vec<u32>]) -> MaskComparison {
    let mut c = MaskComparison {
        steps: ours.len().min(theirs.len()),
        ..MaskComparison::default()
    };
    for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
        for id in 0..vocab.len() as u32 {
            if vocab.is_eos(id) {
                continue;
            }
            let bit = |m: &[u32]| m[id as usize / 32] >> (id % 32) & 1 == 1;
            match (bit(a), bit(b)) {
                (true, false) => only_a.push(id),
                (false, true) => only_b.push(id),
                _ => {}
            }
        }
        if only_a.is_empty() && only_b.is_empty() {
            continue;
        }
        c.differing_steps += 1;
        if c.first.is_none() {
            let show = |ids: &[u32]| {
                ids.iter()
                    .take(4)
                    .map(|&id| {
                        format!(
                            "{:?}",
                            String::from_utf8_lossy(vocab.token_bytes(id).unwrap_or_default())
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            c.first = Some(format!(
                "step {step}: {} tokens only quarry allows ({}), {} only the peer ({})",
                only_a.len(),
                show(&only_a),
                only_b.len(),
                show(&only_b)
            ));
        }
        c.only_quarry.extend(only_a);
        c.only_peer.extend(only_b);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_travel_as_little_endian_hex_words() {
        let words = words_from_hex("01000000ffffffff", 2).unwrap();
        assert_eq!(words, vec![1, u32::MAX]);
        assert!(words_from_hex("0100", 2).is_err());
        assert!(words_from_hex("zz000000", 1).is_err());
        assert_eq!(hex(&[0, 0xab, 7]), "00ab07");
    }

    #[test]
    fn empty_alternatives_become_empty_strings() {
        assert_eq!(
            ebnf("ws ::= | \" \" | \"\\n\" # optional space\nroot ::= (| \"a\") \"#\" x |\n  y\n"),
            "ws ::= \"\" | \" \" | \"\\n\" # optional space\nroot ::= (\"\" | \"a\") \"#\" x |\n  y\n"
        );
    }

    #[test]
    fn mask_differences_leave_out_eos_and_name_the_first() {
        // Tokens "a", "b", "c", and two EOS ids (3, 4).
        let tokens: [(&[u8], bool); 5] = [
            (b"a", false),
            (b"b", false),
            (b"c", false),
            (b"", true),
            (b"", true),
        ];
        let vocab = Vocabulary::new(tokens, &[3, 4]);
        // Step 0 agrees but for the EOS ids; step 1 differs on "b" and "c".
        let ours = vec![vec![0b11001], vec![0b00011]];
        let theirs = vec![vec![0b01001], vec![0b00101]];
        let c = compare_masks(&vocab, &ours, &theirs);
        assert_eq!((c.steps, c.differing_steps), (2, 1));
        assert_eq!((c.only_quarry, c.only_peer), ([1].into(), [2].into()));
        let first = c.first.expect("a difference");
        assert!(
            first.starts_with(
                "step 1: 1 tokens only quarry allows (\"b\"), 1 only the peer (\"c\")"
            ),
            "{first}"
        );
        assert_eq!(compare_masks(&vocab, &ours, &ours).differing_steps, 0);
        let j = compare_masks(&vocab, &ours, &theirs).to_json(&vocab);
        assert_eq!(j["tokens_only_peer"], 1);
        assert_eq!(j["with_backslash_only_peer"], 0);
    }
}
