//! Property tests: every mask and every forced-byte string on random regexes and random walks is
//! compared with a brute-force oracle, on the real SmolLM2 (49,152) and Gemma 3 (262,144)
//! vocabularies.
//!
//! The oracle shares nothing with the crate but the regex: it builds its own regex-automata DFA and
//! decides "can this byte string still be completed to a match?" by a plain forward search.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, Limits, Matcher, Vocabulary};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

fn vocab(file: &str) -> Arc<Vocabulary> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make setup` first",
        path.display()
    );
    let tok = quarry_tokenizer::Tokenizer::from_gguf(&path).unwrap();
    let table = tok.token_table();
    Arc::new(Vocabulary::new(
        table.iter().map(|(_, b, k)| (b, k.is_special())),
        &tok.special_tokens().end_of_generation,
    ))
}

struct Oracle {
    dfa: dense::DFA<Vec<u32>>,
    memo: HashMap<StateID, bool>,
}

impl Oracle {
    fn new(pattern: &str) -> Self {
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored),
            )
            .build(pattern)
            .unwrap();
        Oracle {
            dfa,
            memo: HashMap::new(),
        }
    }
    fn start(&self) -> StateID {
        self.dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .unwrap()
    }
    fn accepts(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
    /// Some completion of the input read so far matches (depth-first search over all 256 bytes).
    fn completable(&mut self, s: StateID) -> bool {
        if let Some(&v) = self.memo.get(&s) {
            return v;
        }
        let mut seen = std::collections::HashSet::from([s]);
        let mut stack = vec![s];
        let mut found = false;
        while let Some(x) = stack.pop() {
            if self.accepts(x) {
                found = true;
                break;
            }
            for b in 0..=255u8 {
                let n = self.dfa.next_state(x, b);
                if !self.dfa.is_dead_state(n) && seen.insert(n) {
                    stack.push(n);
                }
            }
        }
        self.memo.insert(s, found);
        found
    }
    fn walk(&self, s: StateID, bytes: &[u8]) -> Option<StateID> {
        let mut s = s;
        for &b in bytes {
            s = self.dfa.next_state(s, b);
            if self.dfa.is_dead_state(s) {
                return None;
            }
        }
        Some(s)
    }
    fn allowed(&mut self, s: StateID, bytes: &[u8]) -> bool {
        match self.walk(s, bytes) {
            Some(n) => self.completable(n),
            None => false,
        }
    }
    fn forced(&mut self, s: StateID) -> Vec<u8> {
        let mut out = Vec::new();
        let mut cur = s;
        while !self.accepts(cur) && out.len() < 4096 {
            let live: Vec<u8> = (0..=255u8).filter(|&b| self.allowed(cur, &[b])).collect();
            if live.len() != 1 {
                break;
            }
            out.push(live[0]);
            cur = self.walk(cur, &live[..1]).unwrap();
        }
        out
    }
}

fn random_regex(rng: &mut SmallRng, depth: u32) -> String {
    const ATOMS: &[&str] = &[
        "a", "b", "ab", "[0-9]", "[a-z]", "x", " ", "\\.", "é", "😀", "[α-ω]", "\\n", "\"",
        "[^a-z]", ".", "\\{",
    ];
    if depth == 0 || rng.random_bool(0.3) {
        return ATOMS[rng.random_range(0..ATOMS.len())].to_string();
    }
    let a = random_regex(rng, depth - 1);
    match rng.random_range(0..7) {
        0 => format!("{a}{}", random_regex(rng, depth - 1)),
        1 => format!("(?:{a}|{})", random_regex(rng, depth - 1)),
        2 => format!("(?:{a})*"),
        3 => format!("(?:{a})+"),
        4 => format!("(?:{a})?"),
        5 => format!(
            "(?:{a}){{{},{}}}",
            rng.random_range(0..2),
            rng.random_range(2..4)
        ),
        _ => format!(
            "{a}{}{}",
            random_regex(rng, depth - 1),
            random_regex(rng, depth - 1)
        ),
    }
}

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
        let grammar = Arc::new(
            Grammar::compile(
                &Constraint::Regex(pattern.clone()),
                vocab.clone(),
                Limits::default(),
            )
            .unwrap(),
        );
        // The same constraint with every state computed up front on two threads must give the
        // same masks and forced bytes as the lazy one.
        let eager = Arc::new(
            Grammar::compile(
                &Constraint::Regex(pattern.clone()),
                vocab.clone(),
                Limits::default(),
            )
            .unwrap(),
        );
        assert!(eager.precompute(2) > 0, "{pattern:?}: no live state");
        let mut oracle = Oracle::new(pattern);
        let mut mask = vec![0u32; words];
        for _ in 0..walks {
            let mut m = Matcher::new(grammar.clone());
            let mut e = Matcher::new(eager.clone());
            let mut os = oracle.start();
            for _ in 0..steps {
                m.fill_mask(&mut mask);
                let mut allowed = Vec::new();
                for id in 0..vocab.len() as u32 {
                    let bit = mask[id as usize / 32] >> (id % 32) & 1 == 1;
                    let want = if vocab.is_eos(id) {
                        oracle.accepts(os)
                    } else if vocab.is_special(id) {
                        false
                    } else {
                        oracle.allowed(os, vocab.token_bytes(id).unwrap())
                    };
                    assert_eq!(
                        bit,
                        want,
                        "{pattern:?}: token {id} {:?}",
                        String::from_utf8_lossy(vocab.token_bytes(id).unwrap())
                    );
                    if bit && !vocab.is_eos(id) {
                        allowed.push(id);
                    }
                }
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
        &vocab("SmolLM2-135M-Instruct.Q4_1.gguf"),
        &patterns(1, 12),
        7,
        3,
        12,
    );
}

#[test]
fn masks_and_forced_bytes_match_the_oracle_on_gemma3() {
    check_walks(
        &vocab("gemma-3-270m-q4_k_m.gguf"),
        &patterns(2, 4),
        11,
        2,
        8,
    );
}
