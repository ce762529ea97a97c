//! Property tests: every mask and every forced-byte string on random regexes and random walks is
//! compared with a brute-force oracle, on the real SmolLM2 (49,152) and Gemma 3 (262,144)
//! vocabularies.
//! The oracle is in `common/oracle.rs`.

mod common;
#[path = "common/vocab.rs"]
mod vocab;

use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, Limits, Matcher, Vocabulary};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use common::oracle::{random_regex, Oracle};

fn check_walks(
    vocab: &Arc<Vocabulary>,
    patterns: &[String],
    seed: u64,
    walks: usize,
    steps: usize,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let words = vocab.mask_words();
    for pattern in patterns {
        let compile = || {
            let c = Constraint::Regex(pattern.clone());
            Arc::new(Grammar::compile(&c, vocab.clone(), Limits::default()).unwrap())
        };
        let grammar = compile();
        // The same constraint with every state computed up front on two threads must give the
        // same masks and forced bytes as the lazy one.
        let eager = compile();
        assert!(eager.precompute(2) > 0, "{pattern:?}: no live state");
        let mut oracle = Oracle::new(pattern);
        let mut mask = vec![0u32; words];
        for _ in 0..walks {
            let mut m = Matcher::new(grammar.clone());
            let mut e = Matcher::new(eager.clone());
            let mut os = oracle.start();
            for _ in 0..steps {
                m.fill_mask(&mut mask);
                let want = oracle.mask(os, vocab);
                if let Some(id) = (0..vocab.len() as u32).find(|&i| bit(&mask, i) != bit(&want, i))
                {
                    panic!(
                        "{pattern:?}: token {id} {:?}: quarry {}, oracle {}",
                        String::from_utf8_lossy(vocab.token_bytes(id).unwrap()),
                        bit(&mask, id),
                        bit(&want, id)
                    );
                }
                let allowed: Vec<u32> = (0..vocab.len() as u32)
                    .filter(|&i| bit(&mask, i) && !vocab.is_eos(i))
                    .collect();
                assert_eq!(
                    m.forced_bytes(),
                    oracle.forced(os).as_slice(),
                    "{pattern:?}: forced bytes"
                );
                assert_eq!(m.is_accepting(), oracle.accepts(os), "{pattern:?}");
                assert_eq!(e.mask(), &mask[..], "{pattern:?}: precomputed mask");
                assert_eq!(e.forced_bytes(), m.forced_bytes(), "{pattern:?}");
                if allowed.is_empty() {
                    break;
                }
                let id = allowed[rng.random_range(0..allowed.len())];
                m.accept_token(id).unwrap();
                e.accept_token(id).unwrap();
                os = oracle.walk(os, vocab.token_bytes(id).unwrap()).unwrap();
            }
        }
    }
}

fn bit(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] >> (id % 32) & 1 == 1
}

fn patterns(seed: u64, n: usize) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out: Vec<String> = vec![
        r"([0-9]*)?\.?[0-9]*".into(),
        r#"\{"name": "[a-zA-Z ]{1,20}", "age": [0-9]{1,3}\}"#.into(),
        r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}".into(),
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into(),
    ];
    out.extend((0..n).map(|_| random_regex(&mut rng, 3)));
    out
}

#[test]
fn masks_and_forced_bytes_match_the_oracle_on_smollm2() {
    check_walks(
        &vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf"),
        &patterns(1, 12),
        7,
        3,
        12,
    );
}

#[test]
fn masks_and_forced_bytes_match_the_oracle_on_gemma3() {
    check_walks(
        &vocab::model_vocab("gemma-3-270m-q4_k_m.gguf"),
        &patterns(2, 4),
        11,
        2,
        8,
    );
}

/// Long counted repetitions (a JSON string's `maxLength`, a list's `maxItems`), whose states
/// take the text slice with the tokens of too many characters left out, or share the walks of
/// the vocabulary's subtrees and take their shorter tokens from a widened state's mask
/// ([`quarry_grammar::Limits::max_shared_subtrees`]): every mask still equals the oracle's, on
/// SmolLM2's vocabulary and on Llama 3's (long whitespace runs, and byte-level pieces of
/// multi-byte characters), with walks that end strings at every count; and each of the three is
/// used (some masks take the counted slice, some are split by length, some subtree walks are
/// kept), so the test is about them.
#[test]
fn masks_of_long_counted_repetitions_match_the_oracle() {
    let patterns: Vec<String> = vec![
        // A string body of at most 120 characters, then a field of at most 40.
        r#""(?:[^"\\\x00-\x1f]|\\["\\nt]){0,120}","b":"[a-zé ]{1,40}"\}"#.into(),
        // A lower bound past every subtree's height, and one repetition inside another.
        r"(?:ab|[0-9]|x ){30,50}!(?:[a-z]{1,20} ){2,30}\.".into(),
        r"(?:[^,]{1,64},){1,8}[0-9]{3,90}".into(),
        r"[a-z]{12,40} [a-z]{1,8}".into(),
        // Plain text with two bytes excepted, and a bound on its characters below a minimum;
        // bytes excepted further along the run than its first character.
        r"[^,;]{0,70};[^,]{5,30}".into(),
        r"[^,]{2}[^;]{0,40}".into(),
        // A run whose bound a non-ASCII character passes where plain ASCII does not.
        r"[^\x00-\x1f]{2}[^\x00-\x7f]".into(),
    ];
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub-tokenizers/llama3/vocab.gguf",
    ] {
        let vocab = vocab::model_vocab(file);
        check_walks(&vocab, &patterns, 17, 3, 40);
        let compile = |p: &str| {
            let c = Constraint::Regex(p.into());
            Arc::new(Grammar::compile(&c, vocab.clone(), Limits::default()).unwrap())
        };
        let g = compile(&patterns[0]);
        let mut m = Matcher::new(g.clone());
        m.accept_bytes(b"\"ab").unwrap();
        m.mask();
        assert!(
            g.counted_text_masks() > 0,
            "{file}: no mask took the counted text slice"
        );
        // Letters and spaces are not plain text (most printable bytes end the run): far from
        // the bound a mask is split by length, near it the count states walk the whole trie
        // and share its subtrees.
        let g = compile("[a-z ]{0,120}!");
        let mut m = Matcher::new(g.clone());
        m.accept_bytes(b"ab").unwrap();
        m.mask();
        m.accept_bytes(b"c").unwrap();
        m.mask();
        assert!(g.length_splits() > 0, "{file}: no mask was split by length");
        m.accept_bytes(&[b'd'; 112]).unwrap();
        m.mask();
        m.accept_bytes(b"e").unwrap();
        m.mask();
        assert!(
            g.shared_subtree_walks() > 0,
            "{file}: no subtree walk was shared"
        );
    }
}

/// Llama 3's real vocabulary (128,256 tokens, tiktoken's long whitespace and code runs), as the
/// Hub's tokenizer written as a GGUF by `tests/fixtures/hub_vocab.py` in `make test`'s set-up.
#[test]
fn masks_and_forced_bytes_match_the_oracle_on_llama3() {
    check_walks(
        &vocab::model_vocab("hub-tokenizers/llama3/vocab.gguf"),
        &patterns(3, 4),
        13,
        2,
        8,
    );
}
