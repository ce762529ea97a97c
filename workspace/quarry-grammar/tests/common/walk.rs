//! A random walk of a matcher to a complete output, as a model would drive it: take forced bytes
//! sometimes, otherwise a random allowed token, preferring closing tokens so walks finish.

use std::sync::Arc;

use quarry_grammar::{Grammar, Matcher, Vocabulary};
use rand::rngs::SmallRng;
use rand::Rng;

/// The output of one walk that ended with EOS within `steps`, or `None`. Panics on a dead end
/// (a state with no allowed token), which live-state pruning rules out.
pub fn walk(
    grammar: &Arc<Grammar>,
    vocab: &Vocabulary,
    rng: &mut SmallRng,
    mask: &mut [u32],
    steps: usize,
) -> Option<String> {
    let eos = vocab.eos()[0];
    let mut m = Matcher::new(grammar.clone());
    let mut out = Vec::new();
    for _ in 0..steps {
        if !m.forced_bytes().is_empty() && rng.random_bool(0.5) {
            let f = m.forced_bytes().to_vec();
            m.accept_bytes(&f).unwrap();
            out.extend_from_slice(&f);
            continue;
        }
        m.fill_mask(mask);
        let allowed = allowed_after(mask, vocab, &out);
        let closing: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| t == eos || matches!(vocab.token_bytes(t), Some(b"\"" | b"]" | b"}")))
            .collect();
        let t = if !closing.is_empty() && rng.random_bool(0.4) {
            closing[rng.random_range(0..closing.len())]
        } else {
            allowed[rng.random_range(0..allowed.len())]
        };
        m.accept_token(t).unwrap();
        if t == eos {
            break;
        }
        out.extend_from_slice(vocab.token_bytes(t).unwrap());
    }
    if !m.is_finished() || m.is_accepting() {
        return None;
    }
    Some(String::from_utf8(out).expect("outputs are UTF-8"))
}

/// The token ids `mask` allows. Panics on a dead end (no token allowed), naming the text `out`
/// written so far.
pub fn allowed_after(mask: &[u32], vocab: &Vocabulary, out: &[u8]) -> Vec<u32> {
    let allowed: Vec<u32> = (0..vocab.len() as u32)
        .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
        .collect();
    assert!(
        !allowed.is_empty(),
        "dead end after {:?}",
        String::from_utf8_lossy(out)
    );
    allowed
}
