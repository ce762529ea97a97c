//! Records that always close: the shortest completion of every state, in tokens.
//!
//! A sequence with `R` tokens left can still end complete exactly when some completion of its
//! state fits in `R`. For each state the grammar keeps one concrete completion `C(state)` (the
//! bytes of a shortest accepted continuation, spelled in the fewest tokens), computed on first
//! use and cached like the masks. The engine allows a token only where, after it, a completion
//! still fits, so the invariant "a completion fits in what is left" holds at every step and an
//! output can only end complete (`docs/budget.md`).
//!
//! # How a completion is found
//! - **Bytes:** A* over the lazy DFA's states (its pushdown configurations too), one edge per
//!   byte class, with [`crate::deriv::Terms::min_len`] as the estimate. The estimate is exact for
//!   plain regular terms (concatenations, alternatives, repetitions count their shortest parts;
//!   a rule reference its rule's shortest yield, a least fixpoint over the rules; a stack its
//!   frames'), so there the search walks straight down a shortest path, expanding about one
//!   state per byte. Under an intersection or complement it is a lower bound (the longest part
//!   of an intersection, 0 for a complement), so the search widens there but stays exact: it is
//!   admissible and consistent. Ties go to the deeper state, then to the first pushed, so the
//!   completion does not depend on the order in which threads built the states.
//! - **Tokens:** the first of the fewest tokens that spell those bytes ([`crate::Vocabulary`]'s
//!   trie). A state keeps only that first token, the state after it and the length: the
//!   completion is the token followed by the next state's completion, so its length is
//!   `1 + len(next)` *exactly*. That is what makes the engine's invariant hold by induction:
//!   following the first token of a completion that fits leaves one that fits. (Spelling the
//!   whole byte path in its fewest tokens can be one shorter, but the state after its first
//!   token may then find a path that tokenizes worse, and the invariant would break.) Storage is
//!   three words per state, however long the record.
//! - **A chain at a time:** a state's completion is computed by walking forward (search, first
//!   token, next state) until a state whose completion is known, then filling the chain
//!   backwards, each length read back from the cache so that two threads that raced agree.
//! - **Bounded:** each search expands at most [`crate::Limits::max_completion_search`] states;
//!   past it the state has no completion and the caller decodes there without the guarantee.
//!   The bytes are found by a search that only ever follows the automaton's own transitions,
//!   so a completion always exists: it may be longer than the shortest in tokens (safe), never
//!   impossible.
//!
//! Not seen by the DFA, so not by the completion: a JSON Schema's `uniqueItems` beyond a finite
//! item domain (the matcher's tracker), and the engine's logit processors. The engine checks the
//! completion it follows against both and says so where one refuses it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::deriv::INF;
use crate::dfa::DEAD;
use crate::grammar::Grammar;

/// A state's lower bound not computed yet.
pub(crate) const UNKNOWN_BOUND: u32 = u32::MAX - 1;

/// The first step of a state's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Tokens in the completion: 0 in an accepting state (then `token` and `next` mean nothing).
    pub(crate) len: u32,
    pub(crate) token: u32,
    /// The state after `token`.
    pub(crate) next: u32,
}

/// State `s`'s completion step, computing the chain of steps to a known one where needed.
pub(crate) fn completion(g: &Grammar, s: u32) -> Option<Step> {
    if let Some(known) = g.completion_cell(s).get() {
        return *known;
    }
    // Forward: each state's first token, until a state whose completion is known.
    let mut chain: Vec<(u32, u32, u32)> = Vec::new();
    let mut at = s;
    let mut end = loop {
        if let Some(known) = g.completion_cell(at).get() {
            break *known;
        }
        if g.is_accepting(at) {
            let done = Some(Step {
                len: 0,
                token: 0,
                next: at,
            });
            break *g.completion_cell(at).get_or_init(|| done);
        }
        let first = shortest_bytes(g, at, g.limits().max_completion_search)
            .and_then(|bytes| g.vocabulary().fewest_tokens(&bytes))
            .and_then(|tokens| {
                let t = *tokens.first()?;
                let mut next = at;
                for &b in g.vocabulary().token_bytes(t)? {
                    next = g.step(next, b)?;
                }
                Some((t, next))
            });
        match first {
            Some((t, next)) => {
                chain.push((at, t, next));
                at = next;
            }
            None => break *g.completion_cell(at).get_or_init(|| None),
        }
    };
    // Backward: each length one more than its successor's, as the cache holds it.
    for &(state, token, next) in chain.iter().rev() {
        let step = end.map(|e| Step {
            len: e.len + 1,
            token,
            next,
        });
        end = *g.completion_cell(state).get_or_init(|| step);
    }
    *g.completion_cell(s).get().expect("filled above")
}

/// The whole completion of state `s`, token by token.
pub(crate) fn tokens(g: &Grammar, s: u32) -> Option<Vec<u32>> {
    let mut step = completion(g, s)?;
    let mut out = Vec::with_capacity(step.len as usize);
    while step.len > 0 {
        out.push(step.token);
        step = completion(g, step.next)?;
    }
    Some(out)
}

/// The bytes of a shortest path from `s` to an accepting state: A* over byte classes.
fn shortest_bytes(g: &Grammar, s: u32, max_expansions: usize) -> Option<Vec<u8>> {
    let dfa = g.dfa();
    let h0 = g.lower_bound(s);
    if h0 == INF {
        return None;
    }
    // state → (bytes from `s`, the state before, the byte taken from it).
    let mut best: FxHashMap<u32, (u32, u32, u8)> = FxHashMap::default();
    best.insert(s, (0, DEAD, 0));
    // Least estimate first, then the deeper state, then the first pushed.
    let mut open = BinaryHeap::new();
    let mut pushed = 0u64;
    open.push((Reverse(h0), 0u32, Reverse(pushed), s));
    let mut expanded = 0;
    while let Some((_, cost, _, x)) = open.pop() {
        if best.get(&x).is_some_and(|b| b.0 < cost) {
            continue;
        }
        if g.is_accepting(x) {
            let mut bytes = Vec::with_capacity(cost as usize);
            let mut at = x;
            while at != s {
                let (_, prev, byte) = best[&at];
                bytes.push(byte);
                at = prev;
            }
            bytes.reverse();
            return Some(bytes);
        }
        expanded += 1;
        if expanded > max_expansions {
            return None;
        }
        let next_cost = cost + 1;
        for c in 0..dfa.nclasses {
            let n = dfa.next(x, c);
            if n == DEAD || best.get(&n).is_some_and(|b| b.0 <= next_cost) {
                continue;
            }
            let h = g.lower_bound(n);
            if h == INF {
                continue;
            }
            best.insert(n, (next_cost, x, dfa.class_byte(c)));
            pushed += 1;
            open.push((
                Reverse(next_cost.saturating_add(h)),
                next_cost,
                Reverse(pushed),
                n,
            ));
        }
    }
    None
}
