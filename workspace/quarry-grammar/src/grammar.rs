//! Compiling a constraint to a byte DFA, and the per-state token masks and forced bytes cached in it.

use std::sync::{Arc, OnceLock};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

use crate::error::GrammarError;
use crate::limits::Limits;
use crate::schema::{schema_to_regex, SchemaOptions};
use crate::vocab::{Vocabulary, BYTE_GROUP};

/// What the output must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// The whole output matches this regex (anchored at both ends).
    Regex(String),
    /// The whole output is exactly one of these strings.
    Choice(Vec<String>),
    /// The output is canonical JSON that the schema accepts (see [`crate::schema`]).
    JsonSchema {
        schema: serde_json::Value,
        options: SchemaOptions,
    },
}

impl Constraint {
    /// The regex this constraint compiles from (for a schema, the derived regex).
    pub fn pattern(&self) -> Result<String, GrammarError> {
        match self {
            Constraint::JsonSchema { schema, options } => Ok(schema_to_regex(schema, options)?),
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

/// No transition: the byte leads outside the language.
const DEAD: u32 = u32::MAX;

/// A compiled constraint over one vocabulary. Immutable apart from its caches, `Send + Sync`, and
/// shared through an `Arc` by every sequence and thread that uses the same constraint.
///
/// The regex-automata DFA is only used while compiling. What is kept is a dense table over the
/// *live* states (those from which a match is still reachable), so a step is one load and leaving
/// the language is the `DEAD` entry, with no separate liveness check on the hot path.
#[derive(Debug)]
pub struct Grammar {
    /// Byte → equivalence class.
    classes: [u8; 256],
    nclasses: usize,
    /// `trans[s * nclasses + class]`: the next live state, or `DEAD`.
    trans: Vec<u32>,
    accepting: Vec<bool>,
    /// Per state: a run of byte groups ([`crate::vocab::BYTE_GROUP`]) that can be read without
    /// leaving the language. See [`Run`].
    runs: Vec<Run>,
    start: u32,
    vocab: Arc<Vocabulary>,
    limits: Limits,
    /// States reachable from the start in the regex-automata DFA (live or not).
    reachable: usize,
    /// Per state: its token mask, computed on first use.
    masks: Vec<OnceLock<Box<[u32]>>>,
    /// Per state: its forced bytes, computed on first use.
    forced: Vec<OnceLock<Box<[u8]>>>,
}

impl Grammar {
    /// Compiles `constraint` for `vocab`. Only the automaton is built here; token masks and forced
    /// bytes are computed per state on first use (or all at once with [`Grammar::precompute`]).
    pub fn compile(
        constraint: &Constraint,
        vocab: Arc<Vocabulary>,
        limits: Limits,
    ) -> Result<Self, GrammarError> {
        let started = std::time::Instant::now();
        let out_of_time = || GrammarError::LimitExceeded {
            limit: "compile_time",
            value: limits.compile_time.as_millis() as usize,
        };
        let pattern = match constraint {
            Constraint::JsonSchema { schema, options } => {
                crate::schema::schema_to_regex_by(schema, options, started + limits.compile_time)
                    .map_err(|e| match e {
                        crate::schema::SchemaError::OutOfTime { .. } => out_of_time(),
                        e => e.into(),
                    })?
            }
            _ => constraint.pattern()?,
        };
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
            // Schema regexes may contain byte classes from intersections (see schema::automaton);
            // user regexes must match UTF-8 only.
            .syntax(
                regex_automata::util::syntax::Config::new()
                    .utf8(!matches!(constraint, Constraint::JsonSchema { .. })),
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
        let mut accepting_slots: Vec<usize> = Vec::new();
        let mut order: Vec<StateID> = Vec::new();
        let mut stack = vec![start];
        let grow = |v: &mut Vec<bool>, p: &mut Vec<Vec<u32>>, i: usize| {
            if i >= v.len() {
                v.resize(i + 1, false);
                p.resize(i + 1, Vec::new());
            }
        };
        grow(&mut seen, &mut preds, slot(start));
        seen[slot(start)] = true;
        while let Some(s) = stack.pop() {
            order.push(s);
            if order.len() > limits.max_states {
                return Err(GrammarError::LimitExceeded {
                    limit: "max_states",
                    value: limits.max_states,
                });
            }
            if order.len().is_multiple_of(1024) && started.elapsed() > limits.compile_time {
                return Err(out_of_time());
            }
            if dfa.is_match_state(dfa.next_eoi_state(s)) {
                accepting_slots.push(slot(s));
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
        let mut work = accepting_slots.clone();
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
        // Dense numbering: the start first (kept even when the language is empty, so a matcher
        // has somewhere to stand), then every other live state.
        let mut dense_of = vec![DEAD; seen.len()];
        let mut states: Vec<StateID> = vec![start];
        dense_of[slot(start)] = 0;
        for &s in &order {
            if live[slot(s)] && dense_of[slot(s)] == DEAD {
                dense_of[slot(s)] = states.len() as u32;
                states.push(s);
            }
        }
        let classes_of = dfa.byte_classes();
        let mut classes = [0u8; 256];
        for b in 0..=255u8 {
            classes[b as usize] = classes_of.get(b);
        }
        let nclasses = classes_of.alphabet_len() - 1; // without the end-of-input class
        let mut class_rep = vec![0u8; nclasses];
        for b in (0..=255u8).rev() {
            class_rep[classes[b as usize] as usize] = b;
        }
        let mut trans = vec![DEAD; states.len() * nclasses];
        let mut accepting = vec![false; states.len()];
        for (i, &s) in states.iter().enumerate() {
            accepting[i] = dfa.is_match_state(dfa.next_eoi_state(s));
            for (c, &b) in class_rep.iter().enumerate() {
                let n = dfa.next_state(s, b);
                if !dfa.is_dead_state(n) && live[slot(n)] {
                    trans[i * nclasses + c] = dense_of[slot(n)];
                }
            }
        }
        if started.elapsed() > limits.compile_time {
            return Err(out_of_time());
        }
        let runs = Run::all(&trans, &classes, nclasses, vocab.trie().max_depth);
        let n = states.len();
        Ok(Self {
            classes,
            nclasses,
            trans,
            accepting,
            runs,
            start: 0,
            vocab,
            limits,
            reachable: order.len(),
            masks: (0..n).map(|_| OnceLock::new()).collect(),
            forced: (0..n).map(|_| OnceLock::new()).collect(),
        })
    }

    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// DFA states reachable from the start.
    pub fn state_count(&self) -> usize {
        self.reachable
    }

    /// States kept: the live ones (a match is still reachable), plus the start.
    pub fn live_state_count(&self) -> usize {
        self.accepting.len()
    }

    /// Heap bytes of the transition table kept for matching.
    pub fn dfa_bytes(&self) -> usize {
        self.trans.len() * 4
    }

    pub(crate) fn start(&self) -> u32 {
        self.start
    }

    #[inline]
    pub(crate) fn step(&self, s: u32, b: u8) -> Option<u32> {
        let n = self.trans[s as usize * self.nclasses + self.classes[b as usize] as usize];
        (n != DEAD).then_some(n)
    }

    pub(crate) fn is_accepting(&self, s: u32) -> bool {
        self.accepting[s as usize]
    }

    /// No byte can follow state `s`.
    pub(crate) fn is_finished(&self, s: u32) -> bool {
        let row = &self.trans[s as usize * self.nclasses..][..self.nclasses];
        row.iter().all(|&n| n == DEAD)
    }

    /// The token mask of state `s`, computed once and cached.
    pub(crate) fn mask(&self, s: u32) -> &[u32] {
        self.masks[s as usize].get_or_init(|| self.compute_mask(s))
    }

    fn compute_mask(&self, s: u32) -> Box<[u32]> {
        let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
        let trie = self.vocab.trie();
        let nodes = &trie.nodes;
        let ids = &trie.token_ids;
        let (trans, classes, nc) = (&self.trans, &self.classes, self.nclasses);
        // states[d] is the state after the first d bytes of the current trie path.
        let mut states = vec![s; trie.max_depth + 1];
        let mut set = |range: std::ops::Range<u32>| {
            for &t in &ids[range.start as usize..range.end as usize] {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        };
        let mut i = 1;
        while i < nodes.len() {
            let n = &nodes[i];
            let d = n.depth as usize;
            let next = trans[states[d - 1] as usize * nc + classes[n.byte as usize] as usize];
            if next == DEAD {
                i = n.subtree_end as usize;
            } else if self.runs[next as usize].covers(n.below, n.height) {
                // Every path below stays in the language: the whole subtree is allowed.
                set(n.tokens_start..n.subtree_tokens_end);
                i = n.subtree_end as usize;
            } else {
                states[d] = next;
                set(n.tokens_start..n.tokens_end);
                i += 1;
            }
        }
        if self.is_accepting(s) {
            for &e in self.vocab.eos() {
                mask[e as usize / 32] |= 1 << (e % 32);
            }
        }
        mask
    }

    /// Computes the mask and forced bytes of every state now, on `threads` threads (at least
    /// one), instead of on first use. Call it from a background thread on an `Arc<Grammar>` to warm
    /// a grammar while sequences already use it; results are identical either way. Returns the
    /// number of states computed.
    pub fn precompute(&self, threads: usize) -> usize {
        let n = self.accepting.len();
        let threads = threads.clamp(1, n);
        if threads == 1 {
            for s in 0..n {
                self.mask(s as u32);
                self.forced(s as u32);
            }
            return n;
        }
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    for s in (t..n).step_by(threads) {
                        self.mask(s as u32);
                        self.forced(s as u32);
                    }
                });
            }
        });
        n
    }

    /// The forced bytes of state `s`: each step has exactly one live byte and passes no accepting
    /// state. Computed once and cached; at most `Limits::max_forced_bytes` long.
    pub(crate) fn forced(&self, s: u32) -> &[u8] {
        self.forced[s as usize].get_or_init(|| {
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

/// For one state `t`: `groups`, the byte groups all of whose bytes lead to one and the same live
/// successor σ(t) (the successor that takes the most whole groups), and `len`, how many steps
/// t, σ(t), σ²(t), … keep at least those groups. Any byte string of at most `len` bytes drawn from
/// `groups` therefore stays in the language, which lets a mask walk add a whole trie subtree
/// without visiting it: a self-loop (`[a-z]*`, JSON string content) has `len` = the longest token,
/// and the k-th state of `[A-Za-z ]{1,40}` has `len` = 40 − k.
#[derive(Debug, Clone, Copy)]
struct Run {
    groups: u64,
    len: u16,
}

impl Run {
    #[inline]
    fn covers(&self, below: u64, height: u16) -> bool {
        below & !self.groups == 0 && height <= self.len
    }

    fn all(trans: &[u32], classes: &[u8; 256], nclasses: usize, max_len: usize) -> Vec<Run> {
        let n = trans.len() / nclasses.max(1);
        // Per state: (groups, successor).
        let mut first: Vec<(u64, u32)> = Vec::with_capacity(n);
        for s in 0..n {
            let row = &trans[s * nclasses..][..nclasses];
            // Successor of each group, or DEAD when its bytes disagree or leave the language.
            let mut group_next = [None::<u32>; 64];
            let mut mixed = 0u64;
            for b in 0..256 {
                let g = BYTE_GROUP[b] as usize;
                let next = row[classes[b] as usize];
                match group_next[g] {
                    _ if mixed >> g & 1 == 1 => {}
                    None => group_next[g] = Some(next),
                    Some(prev) if prev != next => mixed |= 1 << g,
                    Some(_) => {}
                }
            }
            let mut best = (0u64, DEAD);
            for g in 0..64 {
                let Some(next) = group_next[g] else { continue };
                if next == DEAD || mixed >> g & 1 == 1 || best.0 >> g & 1 == 1 {
                    continue;
                }
                let mut set = 0u64;
                for (h, &n2) in group_next.iter().enumerate() {
                    if n2 == Some(next) && mixed >> h & 1 == 0 {
                        set |= 1 << h;
                    }
                }
                if set.count_ones() > best.0.count_ones() {
                    best = (set, next);
                }
            }
            first.push(best);
        }
        let cap = max_len.min(u16::MAX as usize);
        (0..n)
            .map(|s| {
                let (groups, _) = first[s];
                if groups == 0 {
                    return Run { groups, len: 0 };
                }
                let (mut cur, mut len) = (s, 0usize);
                while len < cap && groups & !first[cur].0 == 0 {
                    cur = first[cur].1 as usize;
                    len += 1;
                }
                Run {
                    groups,
                    len: len as u16,
                }
            })
            .collect()
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
    let nfa_limit = std::error::Error::source(e)
        .and_then(|c| c.downcast_ref::<regex_automata::nfa::thompson::BuildError>())
        .and_then(|b| b.size_limit());
    if nfa_limit.is_some() {
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
