//! Compiling a constraint to a byte DFA, and the per-state token masks and forced bytes cached in it.

use std::sync::{Arc, OnceLock};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

use crate::error::GrammarError;
use crate::limits::Limits;
use crate::vocab::Vocabulary;

/// What the output must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// The whole output matches this regex (anchored at both ends).
    Regex(String),
    /// The whole output is exactly one of these strings.
    Choice(Vec<String>),
}

impl Constraint {
    fn pattern(&self) -> Result<String, GrammarError> {
        match self {
            Constraint::Regex(r) => Ok(r.clone()),
            Constraint::Choice(c) if c.is_empty() => Err(GrammarError::EmptyChoice),
            Constraint::Choice(c) => Ok(c
                .iter()
                .map(|s| regex_syntax::escape(s))
                .collect::<Vec<_>>()
                .join("|")),
        }
    }
}

/// A compiled constraint over one vocabulary. Immutable apart from its caches, `Send + Sync`, and
/// shared through an `Arc` by every sequence and thread that uses the same constraint.
#[derive(Debug)]
pub struct Grammar {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    vocab: Arc<Vocabulary>,
    limits: Limits,
    states: usize,
    /// Per state: a match is still reachable from it.
    live: Vec<bool>,
    /// Per state (indexed by `id >> stride2`): its token mask, computed on first use.
    masks: Vec<OnceLock<Box<[u32]>>>,
    /// Per state: its forced bytes, computed on first use.
    forced: Vec<OnceLock<Box<[u8]>>>,
}

impl Grammar {
    /// Compiles `constraint` for `vocab`. Only the DFA is built here; token masks and forced bytes
    /// are computed per state on first use (or all at once with [`Grammar::precompute`]).
    pub fn compile(
        constraint: &Constraint,
        vocab: Arc<Vocabulary>,
        limits: Limits,
    ) -> Result<Self, GrammarError> {
        let pattern = constraint.pattern()?;
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    // All, not leftmost-first: we need the whole language, not the preferred match.
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(limits.dfa_bytes))
                    .determinize_size_limit(Some(limits.determinize_bytes)),
            )
            .thompson(
                regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(limits.nfa_bytes)),
            )
            .build(&pattern)
            .map_err(|e| build_error(&pattern, &e, &limits))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| GrammarError::InvalidRegex {
                pattern: pattern.clone(),
                message: e.to_string(),
            })?;
        // Reachable states, their predecessor lists (one byte per equivalence class), then which of
        // them can still reach a match. regex-automata reports matches one byte late, so a state
        // after a completed match can be "not dead" yet have no way forward; only co-reachable
        // ("live") states may be entered.
        let stride2 = dfa.stride2();
        let reps: Vec<u8> = dfa
            .byte_classes()
            .representatives(0..=255u8)
            .filter_map(|u| u.as_u8())
            .collect();
        let slot = |s: StateID| s.as_usize() >> stride2;
        let mut seen: Vec<bool> = Vec::new();
        let mut preds: Vec<Vec<u32>> = Vec::new();
        let mut accepting: Vec<StateID> = Vec::new();
        let mut stack = vec![start];
        let mut states = 0usize;
        let grow = |v: &mut Vec<bool>, p: &mut Vec<Vec<u32>>, i: usize| {
            if i >= v.len() {
                v.resize(i + 1, false);
                p.resize(i + 1, Vec::new());
            }
        };
        grow(&mut seen, &mut preds, slot(start));
        seen[slot(start)] = true;
        while let Some(s) = stack.pop() {
            states += 1;
            if states > limits.max_states {
                return Err(GrammarError::LimitExceeded {
                    limit: "max_states",
                    value: limits.max_states,
                });
            }
            if dfa.is_match_state(dfa.next_eoi_state(s)) {
                accepting.push(s);
            }
            for &b in &reps {
                let n = dfa.next_state(s, b);
                if dfa.is_dead_state(n) {
                    continue;
                }
                grow(&mut seen, &mut preds, slot(n));
                preds[slot(n)].push(slot(s) as u32);
                if !seen[slot(n)] {
                    seen[slot(n)] = true;
                    stack.push(n);
                }
            }
        }
        let mut live = vec![false; seen.len()];
        let mut work: Vec<usize> = accepting.iter().map(|&s| slot(s)).collect();
        for &i in &work {
            live[i] = true;
        }
        while let Some(i) = work.pop() {
            for &p in &preds[i] {
                if !live[p as usize] {
                    live[p as usize] = true;
                    work.push(p as usize);
                }
            }
        }
        drop(preds);
        let slots = seen.len();
        Ok(Self {
            masks: (0..slots).map(|_| OnceLock::new()).collect(),
            forced: (0..slots).map(|_| OnceLock::new()).collect(),
            live,
            dfa,
            start,
            vocab,
            limits,
            states,
        })
    }

    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// DFA states reachable from the start.
    pub fn state_count(&self) -> usize {
        self.states
    }

    /// Heap bytes of the DFA transition table.
    pub fn dfa_bytes(&self) -> usize {
        self.dfa.memory_usage()
    }

    pub(crate) fn start(&self) -> StateID {
        self.start
    }

    pub(crate) fn step(&self, s: StateID, b: u8) -> Option<StateID> {
        let n = self.dfa.next_state(s, b);
        self.live
            .get(self.slot(n))
            .copied()
            .unwrap_or(false)
            .then_some(n)
    }

    pub(crate) fn is_accepting(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }

    /// No byte can follow state `s`.
    pub(crate) fn is_finished(&self, s: StateID) -> bool {
        (0..=255u8).all(|b| self.step(s, b).is_none())
    }

    fn slot(&self, s: StateID) -> usize {
        s.as_usize() >> self.dfa.stride2()
    }

    /// The token mask of state `s`, computed once and cached.
    pub(crate) fn mask(&self, s: StateID) -> &[u32] {
        self.masks[self.slot(s)].get_or_init(|| self.compute_mask(s))
    }

    fn compute_mask(&self, s: StateID) -> Box<[u32]> {
        let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
        let trie = self.vocab.trie();
        let nodes = &trie.nodes;
        // states[d] is the DFA state after the first d bytes of the current trie path.
        let mut states: Vec<StateID> = vec![s; 1];
        let mut i = 1;
        while i < nodes.len() {
            let n = nodes[i];
            let d = n.depth as usize;
            states.truncate(d);
            match self.step(states[d - 1], n.byte) {
                None => i = n.subtree_end as usize,
                Some(next) => {
                    states.push(next);
                    for &t in &trie.token_ids[n.tokens_start as usize..n.tokens_end as usize] {
                        mask[t as usize / 32] |= 1 << (t % 32);
                    }
                    i += 1;
                }
            }
        }
        if self.is_accepting(s) {
            for &e in self.vocab.eos() {
                mask[e as usize / 32] |= 1 << (e % 32);
            }
        }
        mask
    }

    /// Computes the mask and forced bytes of every live state now, on `threads` threads (at least
    /// one), instead of on first use. Call it from a background thread on an `Arc<Grammar>` to warm
    /// a grammar while sequences already use it; results are identical either way. Returns the
    /// number of states computed.
    pub fn precompute(&self, threads: usize) -> usize {
        let stride2 = self.dfa.stride2();
        let states: Vec<StateID> = (0..self.live.len())
            .filter(|&i| self.live[i])
            .filter_map(|i| StateID::new(i << stride2).ok())
            .collect();
        let threads = threads.clamp(1, states.len().max(1));
        let chunk = states.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for part in states.chunks(chunk) {
                scope.spawn(move || {
                    for &s in part {
                        self.mask(s);
                        self.forced(s);
                    }
                });
            }
        });
        states.len()
    }

    /// The forced bytes of state `s`: each step has exactly one live byte and passes no accepting
    /// state. Computed once and cached; at most `Limits::max_forced_bytes` long.
    pub(crate) fn forced(&self, s: StateID) -> &[u8] {
        self.forced[self.slot(s)].get_or_init(|| {
            let mut out = Vec::new();
            let mut cur = s;
            while out.len() < self.limits.max_forced_bytes && !self.is_accepting(cur) {
                let mut only = None;
                for b in 0..=255u8 {
                    if let Some(n) = self.step(cur, b) {
                        if only.is_some() {
                            only = None;
                            break;
                        }
                        only = Some((b, n));
                    }
                }
                let Some((b, n)) = only else { break };
                out.push(b);
                cur = n;
            }
            out.into_boxed_slice()
        })
    }
}

fn build_error(pattern: &str, e: &dense::BuildError, limits: &Limits) -> GrammarError {
    if e.is_size_limit_exceeded() {
        // The DFA or determinizer limit; the message says which, map it to our field names.
        let msg = e.to_string();
        if msg.contains("determiniz") {
            return GrammarError::LimitExceeded {
                limit: "determinize_bytes",
                value: limits.determinize_bytes,
            };
        }
        return GrammarError::LimitExceeded {
            limit: "dfa_bytes",
            value: limits.dfa_bytes,
        };
    }
    let msg = e.to_string();
    // The whole cause chain: the parser's message (with its position) is several levels down.
    let mut source = String::new();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if !source.is_empty() {
            source.push_str(": ");
        }
        let text = c.to_string();
        source.push_str(&text.split_whitespace().collect::<Vec<_>>().join(" "));
        cause = c.source();
    }
    if msg.contains("exceeded size limit") || source.contains("exceeded size limit") {
        return GrammarError::LimitExceeded {
            limit: "nfa_bytes",
            value: limits.nfa_bytes,
        };
    }
    GrammarError::InvalidRegex {
        pattern: pattern.to_owned(),
        message: if source.is_empty() {
            msg
        } else {
            format!("{msg}: {source}")
        },
    }
}
