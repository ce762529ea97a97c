//! The DFA of a [`crate::Grammar`], built lazily from derivatives and shared by every thread.
//!
//! State 0 is the constraint's term; a state's row (its successor for each byte class) is computed
//! the first time any thread steps out of it: the derivative of its term by each class's
//! representative byte, interned so that equal terms are one state. Rows are stored in
//! [`Grow`], an append-only table of atomics whose addresses never move, so a step is an atomic
//! load with no lock; only filling a row takes the mutex that guards the term store. State numbers
//! are stable for the grammar's lifetime, so masks and forced bytes can be cached per state and
//! matchers can hold states across threads.
//!
//! # Grammars with recursion
//! For a context-free grammar ([`crate::cfg`]) a state is a *configuration* of a pushdown
//! automaton instead of one term. Stack frames are terms: the rule body being read on top, and
//! below it what each caller still has to read once the rule ends. Stacks are a graph-structured
//! stack of hash-consed nodes `(term, set of parent nodes)`, and a configuration maps each top
//! term to the set of nodes it sits on; configurations are interned like terms. A step by a byte
//! steps every top by its derivative and then closes the configuration under the two moves that
//! read nothing: *call* (the top can start with a rule reference: replace it by its derivative by
//! that rule and push the rule's body) and *return* (the top is nullable: pop it). Everything
//! else (rows, masks, runs, forced bytes, rollback by state number) is the same code for both
//! kinds, which is why the matcher API does not change, and why a configuration seen before costs
//! one atomic load, like a regex state.
//!
//! - A return frame with nothing left to read is never pushed (a tail call), so right recursion
//!   (`list ::= item ("," list)?`) keeps stacks as deep as the nesting, not the length.
//! - Nodes with the same term in one parent set are merged (`(t, P₁)`, `(t, P₂)` → `(t, P₁ ∪ P₂)`,
//!   the same stacks), level by level. Without it an ambiguous grammar keeps one chain per way of
//!   splitting the input, exponentially many; with it a set holds one node per term.
//! - Left recursion would push forever and is refused when the grammar is built.
//! - [`crate::Limits::max_parser_stacks`] bounds the `(top, parent)` pairs one closure may visit:
//!   the parser's work per byte. A step past it is refused like a state past `max_states` (a
//!   typed error through [`crate::Grammar::overflow_error`], never a hang).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use rustc_hash::FxHashMap;

use crate::deriv::{Id, Terms, EMPTY, NOTHING};

/// No transition: the byte leads outside the language.
pub(crate) const DEAD: u32 = u32::MAX;
/// A row slot not computed yet.
pub(crate) const UNKNOWN: u32 = u32::MAX - 1;

/// Why the DFA stopped growing ([`LazyDfa::overflow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    States,
    Terms,
    Stacks,
}

/// An append-only table of rows of `width` items each, in segments of 64·2ᵏ rows allocated on
/// first use. `row(r)` never moves, so readers need no lock.
pub(crate) struct Grow<T> {
    width: usize,
    make: fn() -> T,
    segs: [OnceLock<Box<[T]>>; 32],
}

const BASE: usize = 64;

impl<T> std::fmt::Debug for Grow<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let segments = self.segs.iter().filter(|s| s.get().is_some()).count();
        write!(f, "Grow({segments} segments of {} per row)", self.width)
    }
}

impl<T> Grow<T> {
    pub(crate) fn new(width: usize, make: fn() -> T) -> Self {
        Self {
            width,
            make,
            segs: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    #[inline]
    pub(crate) fn row(&self, r: usize) -> &[T] {
        let j = r / BASE + 1;
        let k = (usize::BITS - 1 - j.leading_zeros()) as usize;
        let off = r - BASE * ((1 << k) - 1);
        let seg = self.segs[k].get_or_init(|| {
            (0..(BASE << k) * self.width)
                .map(|_| (self.make)())
                .collect()
        });
        &seg[off * self.width..][..self.width]
    }

    #[inline]
    pub(crate) fn at(&self, r: usize) -> &T {
        &self.row(r)[0]
    }
}

struct Inner {
    terms: Terms,
    state_of: FxHashMap<Id, u32>,
    term_of: Vec<Id>,
    /// The pushdown layer, for grammars with recursion (then `state_of`/`term_of` are unused).
    pda: Option<Pda>,
    /// Each widened term ([`LazyDfa::widened`]) and the first state widened to it.
    widened_from: FxHashMap<Id, u32>,
}

/// The bottom of every stack: the node below the root's frame.
const BOTTOM: u32 = 0;
/// The parent set `{BOTTOM}` (the first set interned).
const BOTTOM_SET: u32 = 0;
/// Terms one emptiness search may visit ([`LazyDfa::live`]).
const VOID_BUDGET: usize = 100_000;
/// How many levels [`Pda::merged`] merges before it stops (a bound on its recursion).
const MERGE_DEPTH: usize = 256;

/// The stacks and configurations of a grammar with recursion (see the module doc).
///
/// Stacks form a graph-structured stack: node `k` is `(term, parent set)`, standing for every
/// stack with that term on top of a stack of one of its parents. A configuration maps each top
/// term to the set of parents it sits on, so two parses that reach the same top with different
/// histories are one entry with two parents, not two stacks. That keeps configurations small on
/// ambiguous grammars, where lists of whole stacks grow exponentially: the random grammars of the
/// oracle test reached the work limit within 15 bytes as lists, and never do merged.
struct Pda {
    /// The body term of each rule that is still referenced after inlining.
    bodies: Vec<Id>,
    /// Node `k` is `(term, parent set)`; node 0 is the bottom.
    nodes: Vec<(Id, u32)>,
    node_of: FxHashMap<(Id, u32), u32>,
    /// Interned sorted sets of nodes.
    psets: Vec<Box<[u32]>>,
    pset_of: FxHashMap<Box<[u32]>, u32>,
    /// The configuration of each state: `(top term, parent set)`, sorted by term.
    configs: Vec<Box<[(Id, u32)]>>,
    config_of: FxHashMap<Box<[(Id, u32)]>, u32>,
    max_entries: usize,
    /// Scratch for [`Pda::close`].
    seen: rustc_hash::FxHashSet<(Id, u32)>,
    /// [`Pda::merged`] of each node list already merged.
    merged_of: FxHashMap<Box<[u32]>, u32>,
    /// [`Pda::stack_bound`] of each node, once asked ([`UNKNOWN`] before).
    node_bounds: Vec<u32>,
}

impl Pda {
    fn new(bodies: Vec<Id>, max_entries: usize) -> Self {
        let mut pda = Pda {
            bodies,
            nodes: vec![(NOTHING, 0)],
            node_of: FxHashMap::default(),
            psets: Vec::new(),
            pset_of: FxHashMap::default(),
            configs: Vec::new(),
            config_of: FxHashMap::default(),
            max_entries: max_entries.max(1),
            seen: Default::default(),
            merged_of: FxHashMap::default(),
            node_bounds: Vec::new(),
        };
        pda.pset(vec![BOTTOM]);
        pda
    }

    fn pset(&mut self, set: Vec<u32>) -> u32 {
        if let Some(&k) = self.pset_of.get(set.as_slice()) {
            return k;
        }
        let k = self.psets.len() as u32;
        let set: Box<[u32]> = set.into();
        self.pset_of.insert(set.clone(), k);
        self.psets.push(set);
        k
    }

    fn node(&mut self, term: Id, parents: u32) -> u32 {
        let next = self.nodes.len() as u32;
        *self.node_of.entry((term, parents)).or_insert_with(|| {
            self.nodes.push((term, parents));
            next
        })
    }

    /// Closes `entries` (`(top term, parent node)` pairs) under calls and returns (see the module
    /// doc) and groups them into a configuration, or `None` past `max_entries` pairs.
    fn close(&mut self, terms: &mut Terms, entries: &[(Id, u32)]) -> Option<Box<[(Id, u32)]>> {
        let mut seen = std::mem::take(&mut self.seen);
        seen.clear();
        let mut work: Vec<(Id, u32)> = Vec::new();
        for &e in entries {
            if seen.insert(e) {
                work.push(e);
            }
        }
        while let Some((top, parent)) = work.pop() {
            if seen.len() > self.max_entries {
                self.seen = seen;
                return None;
            }
            let mut add = |e: (Id, u32), work: &mut Vec<(Id, u32)>| {
                if seen.insert(e) {
                    work.push(e);
                }
            };
            if parent != BOTTOM && terms.nullable(top) {
                // Return: the parent's term is on top again, over the parent's parents.
                let (t, ps) = self.nodes[parent as usize];
                for &m in self.psets[ps as usize].iter() {
                    add((t, m), &mut work);
                }
            }
            for &(r, rest) in terms.ref_row(top).iter() {
                let body = self.bodies[r as usize];
                // A call: the rule's body on top of what the caller still has to read, or
                // straight on the caller's parent when nothing is left (a tail call).
                let below = if rest == EMPTY {
                    parent
                } else {
                    let ps = self.pset(vec![parent]);
                    self.node(rest, ps)
                };
                add((body, below), &mut work);
            }
        }
        let mut pairs: Vec<(Id, u32)> = seen
            .drain()
            .filter(|&(t, p)| t != EMPTY || p == BOTTOM)
            .collect();
        self.seen = seen;
        pairs.sort_unstable();
        let mut config = Vec::new();
        let mut i = 0;
        while i < pairs.len() {
            let top = pairs[i].0;
            let j = i + pairs[i..].iter().take_while(|p| p.0 == top).count();
            let set = pairs[i..j].iter().map(|p| p.1).collect();
            config.push((top, self.merged(set)));
            i = j;
        }
        Some(config.into())
    }

    /// The parent set of `nodes` with nodes of equal terms merged: `(t, P₁)` and `(t, P₂)` stand
    /// for the same stacks as `(t, P₁ ∪ P₂)`, merged again one level down. Without it, every
    /// way an ambiguous grammar can split the input leaves its own chain of nodes and sets grow
    /// exponentially; with it, a set holds one node per term at each level.
    fn merged(&mut self, nodes: Vec<u32>) -> u32 {
        self.merged_to(nodes, 0)
    }

    /// [`Pda::merged`] `depth` levels down. Merging is only an economy (the merged set stands for
    /// the same stacks), so past [`MERGE_DEPTH`] levels sets are kept as they are rather than
    /// recursing further.
    fn merged_to(&mut self, mut nodes: Vec<u32>, depth: usize) -> u32 {
        nodes.sort_unstable_by_key(|&n| (self.nodes[n as usize].0, n));
        nodes.dedup();
        if let Some(&k) = self.merged_of.get(nodes.as_slice()) {
            return k;
        }
        let key: Box<[u32]> = nodes.as_slice().into();
        let mut out = Vec::with_capacity(nodes.len());
        let mut i = 0;
        while i < nodes.len() {
            let term = self.nodes[nodes[i] as usize].0;
            let j = i + nodes[i..]
                .iter()
                .take_while(|&&n| self.nodes[n as usize].0 == term)
                .count();
            if j - i == 1 || nodes[i] == BOTTOM || depth >= MERGE_DEPTH {
                out.extend_from_slice(&nodes[i..j]);
            } else {
                let below: Vec<u32> = nodes[i..j]
                    .iter()
                    .flat_map(|&n| {
                        self.psets[self.nodes[n as usize].1 as usize]
                            .iter()
                            .copied()
                    })
                    .collect();
                let ps = self.merged_to(below, depth + 1);
                out.push(self.node(term, ps));
            }
            i = j;
        }
        out.sort_unstable();
        out.dedup();
        let k = self.pset(out);
        self.merged_of.insert(key, k);
        k
    }

    /// A lower bound on the bytes that the stacks of parent set `ps` still need before they
    /// are empty: the least, over its nodes, of the node's term's [`Terms::min_len`] plus its own
    /// parents'. Memoized per node (nodes are immutable, and a node's parents are older).
    fn stack_bound(&mut self, terms: &mut Terms, ps: u32) -> u32 {
        let nodes = self.psets[ps as usize].clone();
        let mut best = crate::deriv::INF;
        for &k in nodes.iter() {
            if k == BOTTOM {
                return 0;
            }
            if self.node_bounds.len() <= k as usize {
                self.node_bounds.resize(self.nodes.len(), UNKNOWN);
            }
            let mut v = self.node_bounds[k as usize];
            if v == UNKNOWN {
                let (term, parents) = self.nodes[k as usize];
                v = terms
                    .min_len(term)
                    .saturating_add(self.stack_bound(terms, parents));
                self.node_bounds[k as usize] = v;
            }
            best = best.min(v);
        }
        best
    }

    fn accepting(&self, terms: &Terms, config: &[(Id, u32)]) -> bool {
        config
            .iter()
            .any(|&(t, ps)| terms.nullable(t) && self.psets[ps as usize].first() == Some(&BOTTOM))
    }

    /// Interns `config` as state `t` (the caller checked it is new).
    fn add_config(&mut self, config: Box<[(Id, u32)]>, t: u32) {
        self.config_of.insert(config.clone(), t);
        self.configs.push(config);
    }

    /// Nodes and parent sets held (counted with terms against `max_terms`).
    fn size(&self) -> usize {
        self.nodes.len() + self.psets.len() + self.merged_of.len()
    }
}

pub(crate) struct LazyDfa {
    pub(crate) classes: [u8; 256],
    pub(crate) nclasses: usize,
    /// A byte of each class.
    reps: Vec<u8>,
    /// A byte of each class as a completion spells it ([`LazyDfa::class_byte`]).
    nice: Vec<u8>,
    rows: Grow<AtomicU32>,
    accepting: Grow<AtomicBool>,
    states: AtomicU32,
    inner: Mutex<Inner>,
    max_states: usize,
    max_terms: usize,
    /// 0, or 1 + the [`Overflow`] that stopped growth.
    overflow: AtomicU8,
}

impl std::fmt::Debug for LazyDfa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyDfa")
            .field("nclasses", &self.nclasses)
            .field("states", &self.state_count())
            .finish()
    }
}

impl LazyDfa {
    /// The DFA of a grammar with recursion: `bodies[r]` is the body of rule `r` (the rules `root`
    /// refers to). [`crate::Limits::max_parser_stacks`] bounds one closure.
    pub(crate) fn with_rules(
        terms: Terms,
        root: Id,
        bodies: Vec<Id>,
        limits: &crate::Limits,
    ) -> Self {
        let dfa = Self::new(terms, root, limits.max_states, limits.max_terms);
        let mut guard = dfa.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *guard;
        let mut pda = Pda::new(bodies, limits.max_parser_stacks);
        inner.terms.settle_rules(&pda.bodies);
        let config = match pda.close(&mut inner.terms, &[(root, BOTTOM)]) {
            Some(c) => c,
            None => {
                dfa.overflow
                    .store(1 + Overflow::Stacks as u8, Ordering::Relaxed);
                Box::default()
            }
        };
        dfa.accepting
            .at(0)
            .store(pda.accepting(&inner.terms, &config), Ordering::Relaxed);
        if config.is_empty() {
            for slot in dfa.rows.row(0) {
                slot.store(DEAD, Ordering::Relaxed);
            }
        }
        pda.add_config(config, 0);
        inner.pda = Some(pda);
        drop(guard);
        dfa
    }

    pub(crate) fn new(terms: Terms, root: Id, max_states: usize, max_terms: usize) -> Self {
        let (classes, nclasses) = terms.byte_classes();
        let mut reps = vec![0u8; nclasses];
        for b in (0..=255u8).rev() {
            reps[classes[b as usize] as usize] = b;
        }
        // The most readable byte of each class: a lower-case letter, a digit, an upper-case
        // letter, a space, other printable ASCII, then the lowest byte.
        let rank = |b: u8| match b {
            b'a'..=b'z' => 0,
            b'0'..=b'9' => 1,
            b'A'..=b'Z' => 2,
            b' ' => 3,
            0x21..=0x7e => 4,
            _ => 5,
        };
        let mut nice = reps.clone();
        for b in 0..=255u8 {
            let c = classes[b as usize] as usize;
            if rank(b) < rank(nice[c]) {
                nice[c] = b;
            }
        }
        let dfa = Self {
            classes,
            nclasses,
            reps,
            nice,
            rows: Grow::new(nclasses, || AtomicU32::new(UNKNOWN)),
            accepting: Grow::new(1, || AtomicBool::new(false)),
            states: AtomicU32::new(1),
            inner: Mutex::new(Inner {
                state_of: FxHashMap::from_iter([(root, 0)]),
                term_of: vec![root],
                terms,
                pda: None,
                widened_from: FxHashMap::default(),
            }),
            max_states: max_states.max(1),
            max_terms,
            overflow: AtomicU8::new(0),
        };
        let mut inner = dfa.inner.lock().unwrap_or_else(PoisonError::into_inner);
        dfa.accepting
            .at(0)
            .store(inner.terms.nullable(root), Ordering::Relaxed);
        if root == NOTHING || !dfa.live(&mut inner.terms, root) {
            // The empty language: the start has no way forward.
            for slot in dfa.rows.row(0) {
                slot.store(DEAD, Ordering::Relaxed);
            }
        }
        drop(inner);
        dfa
    }

    /// The successor of `s` by a byte of class `class`, or [`DEAD`].
    #[inline]
    pub(crate) fn next(&self, s: u32, class: usize) -> u32 {
        let slot = &self.rows.row(s as usize)[class];
        let v = slot.load(Ordering::Acquire);
        if v != UNKNOWN {
            return v;
        }
        self.fill(s);
        slot.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn step(&self, s: u32, b: u8) -> u32 {
        self.next(s, self.classes[b as usize] as usize)
    }

    pub(crate) fn is_accepting(&self, s: u32) -> bool {
        self.accepting.at(s as usize).load(Ordering::Relaxed)
    }

    /// The byte a completion writes for class `class`: every byte of a class steps every state
    /// alike, so any would do; this is the most readable one.
    pub(crate) fn class_byte(&self, class: usize) -> u8 {
        self.nice[class]
    }

    /// A lower bound on the bytes from state `s` to an accepting state ([`Terms::min_len`] of
    /// its term; for a configuration, the least over its tops of the top's plus its stacks'),
    /// [`crate::deriv::INF`] where none is reachable. Takes the term store's lock: callers
    /// cache it per state ([`crate::Grammar`]).
    pub(crate) fn lower_bound(&self, s: u32) -> u32 {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner {
            terms,
            pda,
            term_of,
            ..
        } = &mut *guard;
        match pda {
            None => terms.min_len(term_of[s as usize]),
            Some(pda) => {
                let config = pda.configs[s as usize].clone();
                config
                    .iter()
                    .map(|&(t, ps)| terms.min_len(t).saturating_add(pda.stack_bound(terms, ps)))
                    .min()
                    .unwrap_or(crate::deriv::INF)
            }
        }
    }

    /// States built so far.
    pub(crate) fn state_count(&self) -> usize {
        self.states.load(Ordering::Acquire) as usize
    }

    /// The language is empty (the start term is `∅`).
    pub(crate) fn is_empty_language(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match &inner.pda {
            Some(pda) => pda.configs[0].is_empty(),
            None => inner.term_of[0] == NOTHING || inner.terms.known_void(inner.term_of[0]),
        }
    }

    /// [`Terms::horizon`] of state `s`'s term: the subtree heights below which [`LazyDfa::widened`]
    /// gives another state. 0 for a pushdown configuration (never widened). Takes the term
    /// store's lock: callers cache it per state ([`crate::Grammar`]).
    pub(crate) fn horizon(&self, s: u32) -> u32 {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *guard;
        if inner.pda.is_some() {
            return 0;
        }
        inner.terms.horizon(inner.term_of[s as usize])
    }

    /// The state of [`Terms::widen`] of `s`'s term by `h`: from it, every byte string of at
    /// most `h` bytes is live exactly when it is from `s`. `s` itself where that term is `s`'s,
    /// where no other state has widened to it yet (a state is made only where two share it: the
    /// second one, and every one after it, gets it), for a pushdown configuration, or past half of
    /// `max_states` or `max_terms` (the states it adds only save work, so they never take the
    /// room of the states a walk needs).
    pub(crate) fn widened(&self, s: u32, h: u32) -> u32 {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner {
            terms,
            state_of,
            term_of,
            pda,
            widened_from,
        } = &mut *guard;
        if pda.is_some() || 2 * term_of.len() >= self.max_states || 2 * terms.len() > self.max_terms
        {
            return s;
        }
        let w = terms.widen(term_of[s as usize], h);
        if *widened_from.entry(w).or_insert(s) == s {
            return s;
        }
        if let Some(&t) = state_of.get(&w) {
            return t;
        }
        let t = term_of.len() as u32;
        term_of.push(w);
        state_of.insert(w, t);
        self.publish(t, terms.nullable(w));
        t
    }

    /// The state of `s`'s configuration with every parent set replaced by the bottom of the
    /// stack: the same tops, no context. `None` for a regular state, a state with no context,
    /// or when that state would pass `max_states`.
    pub(crate) fn core(&self, s: u32) -> Option<u32> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner { terms, pda, .. } = &mut *guard;
        let pda = pda.as_mut()?;
        let config = &pda.configs[s as usize];
        if config.iter().all(|&(_, ps)| ps == BOTTOM_SET) {
            return None;
        }
        let core: Box<[(Id, u32)]> = config.iter().map(|&(t, _)| (t, BOTTOM_SET)).collect();
        if let Some(&c) = pda.config_of.get(&core) {
            return Some(c);
        }
        if !self.room(pda.configs.len(), terms.len() + pda.size()) {
            return None;
        }
        let t = pda.configs.len() as u32;
        let accepting = pda.accepting(terms, &core);
        pda.add_config(core, t);
        self.publish(t, accepting);
        Some(t)
    }

    /// Whether term `d`'s language is not empty ([`Terms::is_void`], for terms with `And` or
    /// `Not`). A search past its budget counts as empty and stops growth as `max_terms` does.
    fn live(&self, terms: &mut Terms, d: Id) -> bool {
        let (void, over) = terms.is_void(d, &self.reps, VOID_BUDGET);
        if over {
            self.overflow
                .store(1 + Overflow::Terms as u8, Ordering::Relaxed);
        }
        !void
    }

    /// Whether a new state may be made, with `states` states and `terms` terms (stack nodes
    /// included) built: if not, records which limit stopped growth.
    fn room(&self, states: usize, terms: usize) -> bool {
        let why = if states >= self.max_states {
            Overflow::States
        } else if terms > self.max_terms {
            Overflow::Terms
        } else {
            return true;
        };
        self.overflow.store(1 + why as u8, Ordering::Relaxed);
        false
    }

    /// Makes the new state `t` visible to other threads.
    fn publish(&self, t: u32, accepting: bool) {
        self.accepting
            .at(t as usize)
            .store(accepting, Ordering::Relaxed);
        self.states.store(t + 1, Ordering::Release);
    }

    /// Whether states are pushdown configurations.
    pub(crate) fn is_context_free(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.pda.is_some()
    }

    /// Terms built so far.
    pub(crate) fn term_count(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.terms.len()
    }

    /// Why growth stopped, if it did: a successor that would have been a new state past
    /// `max_states`, or needed terms past `max_terms`, was made dead instead.
    pub(crate) fn overflow(&self) -> Option<Overflow> {
        match self.overflow.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(Overflow::States),
            2 => Some(Overflow::Terms),
            _ => Some(Overflow::Stacks),
        }
    }

    /// Computes the row of `s`. Slot 0 is written last, so a filled slot 0 means a filled row.
    #[cold]
    fn fill(&self, s: u32) {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *guard;
        let row = self.rows.row(s as usize);
        if row[0].load(Ordering::Acquire) != UNKNOWN {
            return;
        }
        if inner.pda.is_some() {
            return self.fill_pda(inner, s, row);
        }
        let e = inner.term_of[s as usize];
        let derivs = inner.terms.deriv_row(e, &self.reps);
        for c in (0..self.nclasses).rev() {
            let d = derivs[c];
            let t = if d == NOTHING || !self.live(&mut inner.terms, d) {
                DEAD
            } else if let Some(&t) = inner.state_of.get(&d) {
                t
            } else if !self.room(inner.term_of.len(), inner.terms.len()) {
                DEAD
            } else {
                let t = inner.term_of.len() as u32;
                inner.term_of.push(d);
                inner.state_of.insert(d, t);
                self.publish(t, inner.terms.nullable(d));
                t
            };
            row[c].store(t, Ordering::Release);
        }
    }

    /// [`LazyDfa::fill`] for a configuration: every top term steps by the class's byte, then the
    /// result is closed and interned.
    fn fill_pda(&self, inner: &mut Inner, s: u32, row: &[AtomicU32]) {
        let Inner { terms, pda, .. } = inner;
        let pda = pda.as_mut().expect("a pushdown grammar");
        let config = pda.configs[s as usize].clone();
        let derivs: Vec<Box<[Id]>> = config
            .iter()
            .map(|&(t, _)| terms.deriv_row(t, &self.reps))
            .collect();
        let mut entries: Vec<(Id, u32)> = Vec::new();
        for c in (0..self.nclasses).rev() {
            entries.clear();
            for (i, &(_, ps)) in config.iter().enumerate() {
                let d = derivs[i][c];
                if d != NOTHING && self.live(terms, d) {
                    entries.extend(pda.psets[ps as usize].iter().map(|&p| (d, p)));
                }
            }
            // Inside a lexeme (no entry can call or return) the step only moves the tops: the
            // configuration is the stepped entries as they are, with no closure to run.
            let plain = config.iter().enumerate().all(|(i, &(_, ps))| {
                let d = derivs[i][c];
                d == NOTHING
                    || (!terms.may_be_void(d)
                        && !terms.calls(d)
                        && (!terms.nullable(d) || pda.psets[ps as usize].as_ref() == [BOTTOM]))
            });
            let next = if entries.is_empty() {
                None
            } else if plain {
                let mut stepped: Vec<(Id, u32)> = config
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| derivs[i][c] != NOTHING)
                    .map(|(i, &(_, ps))| (derivs[i][c], ps))
                    .collect();
                stepped.sort_unstable();
                // Two tops may step to the same term: merge their parents.
                if stepped.windows(2).any(|w| w[0].0 == w[1].0) {
                    pda.close(terms, &entries)
                } else {
                    Some(stepped.into())
                }
            } else {
                let closed = pda.close(terms, &entries);
                if closed.is_none() {
                    self.overflow
                        .store(1 + Overflow::Stacks as u8, Ordering::Relaxed);
                }
                closed
            };
            let t = match next {
                None => DEAD,
                Some(next) if next.is_empty() => DEAD,
                Some(next) => {
                    if let Some(&t) = pda.config_of.get(&next) {
                        t
                    } else if !self.room(pda.configs.len(), terms.len() + pda.size()) {
                        DEAD
                    } else {
                        let t = pda.configs.len() as u32;
                        let accepting = pda.accepting(terms, &next);
                        pda.add_config(next, t);
                        self.publish(t, accepting);
                        t
                    }
                }
            };
            row[c].store(t, Ordering::Release);
        }
    }
}
