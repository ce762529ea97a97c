//! Shared by the property tests, the fuzz target (`fuzz/`) and the fuzz regression test.
//!
//! The oracle shares nothing with the crate but the regex: it builds its own regex-automata DFA and
//! decides "can this byte string still be completed to a match?" by a plain forward search.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use quarry_grammar::Vocabulary;
use rand::Rng;
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

pub struct Oracle {
    dfa: dense::DFA<Vec<u32>>,
    memo: HashMap<StateID, bool>,
}

impl Oracle {
    pub fn new(pattern: &str) -> Self {
        Self::try_new(pattern, usize::MAX).unwrap()
    }
    /// `None` when the pattern's DFA needs more than `dfa_bytes`.
    pub fn try_new(pattern: &str, dfa_bytes: usize) -> Option<Self> {
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(dfa_bytes))
                    .determinize_size_limit(Some(dfa_bytes)),
            )
            .build(pattern)
            .ok()?;
        Some(Oracle {
            dfa,
            memo: HashMap::new(),
        })
    }
    pub fn start(&self) -> StateID {
        self.dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .unwrap()
    }
    pub fn accepts(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
    /// Some completion of the input read so far matches (depth-first search over all 256 bytes).
    pub fn completable(&mut self, s: StateID) -> bool {
        if let Some(&v) = self.memo.get(&s) {
            return v;
        }
        let mut seen = HashSet::from([s]);
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
    pub fn walk(&self, s: StateID, bytes: &[u8]) -> Option<StateID> {
        let mut s = s;
        for &b in bytes {
            s = self.dfa.next_state(s, b);
            if self.dfa.is_dead_state(s) {
                return None;
            }
        }
        Some(s)
    }
    pub fn allowed(&mut self, s: StateID, bytes: &[u8]) -> bool {
        match self.walk(s, bytes) {
            Some(n) => self.completable(n),
            None => false,
        }
    }
    /// The mask this state should have: non-special tokens whose bytes keep a match reachable,
    /// and EOS exactly where the input so far is a match.
    pub fn mask(&mut self, s: StateID, vocab: &Vocabulary) -> Vec<u32> {
        let mut mask = vec![0u32; vocab.mask_words()];
        for id in 0..vocab.len() as u32 {
            let ok = if vocab.is_eos(id) {
                self.accepts(s)
            } else if vocab.is_special(id) {
                false
            } else {
                self.allowed(s, vocab.token_bytes(id).unwrap())
            };
            if ok {
                mask[id as usize / 32] |= 1 << (id % 32);
            }
        }
        mask
    }

    pub fn forced(&mut self, s: StateID) -> Vec<u8> {
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

pub fn random_regex<R: Rng>(rng: &mut R, depth: u32) -> String {
    const ATOMS: &[&str] = &[
        "a", "b", "ab", "[0-9]", "[a-z]", "x", " ", "\\.", "é", "😀", "[α-ω]", "\\n", "\"",
        "[^a-z]", ".", "\\{",
    ];
    if depth == 0 || rng.random_bool(0.3) {
        return ATOMS[rng.random_range(0..ATOMS.len())].to_string();
    }
    let a = random_regex(&mut *rng, depth - 1);
    match rng.random_range(0..7) {
        0 => format!("{a}{}", random_regex(&mut *rng, depth - 1)),
        1 => format!("(?:{a}|{})", random_regex(&mut *rng, depth - 1)),
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
            random_regex(&mut *rng, depth - 1),
            random_regex(&mut *rng, depth - 1)
        ),
    }
}
