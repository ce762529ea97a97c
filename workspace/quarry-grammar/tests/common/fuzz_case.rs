//! One fuzz case: bytes → a regex and a walk of matcher operations, every step checked against the
//! oracle. Used by the `cargo fuzz` target (`fuzz/fuzz_targets/walk.rs`) and by
//! `tests/fuzz_regressions.rs`, which replays the checked-in inputs.
//!
//! Input layout: byte 0 picks the mode. Mode "raw" (byte 0 % 4 == 0) reads the regex as text up to
//! the first NUL, so the parser and the limits see arbitrary input; otherwise the bytes drive a
//! structured regex generator. The remaining bytes choose the walk.

#![allow(dead_code)]

use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, Limits, Matcher, Rejection, Vocabulary};
use rand::RngCore;

use super::oracle::{random_regex, Oracle};

/// A "random" source that replays the fuzzer's bytes (zeros once they run out), so libFuzzer's
/// mutations map onto regex and walk structure.
pub struct ByteRng<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> ByteRng<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }
}

impl RngCore for ByteRng<'_> {
    fn next_u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn next_u64(&mut self) -> u64 {
        (self.next_u32() as u64) << 32 | self.next_u32() as u64
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for b in dst {
            *b = self.byte();
        }
    }
}

/// Every single byte, plus multi-byte tokens that cross UTF-8 and JSON boundaries (including
/// halves of a 4-byte character), an EOS and a non-EOS special token.
pub fn small_vocab() -> Arc<Vocabulary> {
    let mut toks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [
        "ab", "ba", "aa", "abc", " a", "é", "😀", "{\"", "\": ", "12", "123", "0.", ".5", "\n\n",
        "xx", "α", "ω", "αβ", "\"}", "-0", "ab\"",
    ] {
        toks.push(t.as_bytes().to_vec());
    }
    toks.push(vec![0xF0, 0x9F]);
    toks.push(vec![0x98, 0x80]);
    toks.push(vec![0xC3]);
    let eos = toks.len() as u32;
    toks.push(b"<eos>".to_vec());
    toks.push(b"<pad>".to_vec());
    let n = toks.len();
    Arc::new(Vocabulary::new(
        toks.iter()
            .enumerate()
            .map(|(i, t)| (t.as_slice(), i >= n - 2)),
        &[eos],
    ))
}

fn ids(mask: &[u32]) -> Vec<u32> {
    (0..mask.len() as u32 * 32)
        .filter(|&i| mask[i as usize / 32] >> (i % 32) & 1 == 1)
        .collect()
}

/// Runs one case; panics (with the regex in the message) where the crate and the oracle disagree.
pub fn run_case(data: &[u8], vocab: &Arc<Vocabulary>) {
    let mut rng = ByteRng::new(data);
    let pattern = if rng.byte().is_multiple_of(4) {
        let rest = data.get(1..).unwrap_or(&[]);
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(rest.len())
            .min(96);
        rng.pos = 1 + end + 1;
        String::from_utf8_lossy(&rest[..end]).into_owned()
    } else {
        random_regex(&mut rng, 4)
    };
    let limits = Limits {
        max_states: 2_000,
        ..Limits::default()
    };
    // Any input may fail to compile, but only with a typed error, never a panic.
    let Ok(grammar) = Grammar::compile(&Constraint::Regex(pattern.clone()), vocab.clone(), limits)
    else {
        return;
    };
    let grammar = Arc::new(grammar);
    // Patterns whose full DFA is too big for the oracle are only checked for not panicking.
    let Some(mut oracle) = Oracle::try_new(&pattern, 4 << 20) else {
        return;
    };
    let mut m = Matcher::new(grammar.clone());
    let mut os = oracle.start();
    // Oracle state before each accepted token, mirroring the matcher's rollback history.
    let mut history = Vec::new();
    let mut terminated = false;
    for _ in 0..24 {
        if rng.exhausted() {
            break;
        }
        let want = if terminated {
            vec![0u32; vocab.mask_words()]
        } else {
            oracle.mask(os, vocab)
        };
        if !terminated {
            let mask = m.mask();
            if grammar.overflow_error().is_some() {
                // Past `max_states` the grammar refuses new states: still sound, not complete.
                for (got, all) in mask.iter().zip(&want) {
                    assert_eq!(got & !all, 0, "{pattern:?}: unsound mask after overflow");
                }
                return;
            }
            assert_eq!(mask, want.as_slice(), "{pattern:?}: mask");
        }
        let mut filled = vec![u32::MAX; vocab.mask_words()];
        m.fill_mask(&mut filled);
        assert_eq!(filled, want, "{pattern:?}: fill_mask");
        if !terminated {
            assert_eq!(
                m.forced_bytes(),
                oracle.forced(os).as_slice(),
                "{pattern:?}: forced"
            );
            assert_eq!(
                m.is_accepting(),
                oracle.accepts(os),
                "{pattern:?}: accepting"
            );
            let finished = (0..=255u8).all(|b| !oracle.allowed(os, &[b]));
            assert_eq!(m.is_finished(), finished, "{pattern:?}: finished");
        }
        let allowed = ids(&want);
        match rng.byte() % 12 {
            0..=6 if !allowed.is_empty() => {
                let id = allowed[rng.byte() as usize % allowed.len()];
                m.accept_token(id).unwrap();
                history.push(os);
                if vocab.is_eos(id) {
                    terminated = true;
                } else {
                    os = oracle.walk(os, vocab.token_bytes(id).unwrap()).unwrap();
                }
            }
            7 | 8 => {
                let k = 1 + rng.byte() as usize % 3;
                let undone = m.rollback(k);
                assert_eq!(undone, k.min(history.len()), "{pattern:?}: rollback count");
                if undone > 0 {
                    os = history[history.len() - undone];
                    history.truncate(history.len() - undone);
                    terminated = false;
                }
                assert_eq!(m.tokens_accepted(), history.len());
            }
            9 if !terminated && !m.forced_bytes().is_empty() => {
                let forced = m.forced_bytes().to_vec();
                m.accept_bytes(&forced).unwrap();
                os = oracle.walk(os, &forced).unwrap();
            }
            _ => {
                // A refused token or byte string leaves the matcher unchanged.
                let id = rng.byte() as u32 % vocab.len() as u32;
                if want[id as usize / 32] >> (id % 32) & 1 == 0 {
                    let before = m.tokens_accepted();
                    let err = m.accept_token(id).unwrap_err();
                    if terminated {
                        assert_eq!(err, Rejection::Terminated);
                    }
                    assert_eq!(m.tokens_accepted(), before);
                }
            }
        }
    }
}
