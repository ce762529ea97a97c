//! Which tokens still fit the budget, per state: the budget's draw again without a walk.
//!
//! Where a drawn token leaves no completion that fits in the tokens left, the engine draws again
//! from the tokens that do ([`crate::Matcher::retain_fitting`], `docs/budget.md`). Whether a token
//! fits depends only on the state and on how many tokens are left: token `t` fits with `left`
//! tokens when the completion after it takes fewer than `left`. So a state's allowed tokens are
//! sorted once by that need, into cumulative masks, one per distinct need ("every token that
//! needs at most 3 more"), and a draw again is one AND of the sequence's mask with the mask of
//! the largest need below `left`, where it walked every allowed token's bytes before. Sequences
//! of one constraint share the tables, as they share masks.
//!
//! Bounded: a table keeps the [`MAX_LEVELS`] smallest needs (a draw again happens near the end
//! of the budget, where only the smallest matter), and a grammar keeps tables of at most
//! [`crate::Limits::max_fit_table_bytes`] in all; beyond either, the matcher walks the tokens
//! as before (same result, slower). A table costs one walk of the state's tokens, so it is
//! built on the second draw again in a state: a state met once is walked once.
//!
//! Both walk the vocabulary's byte trie from the state ([`Grammar::for_each_need`]), not each
//! token's bytes: a prefix that thousands of tokens share is stepped once, and a dead one ends
//! the walk of everything below it, and a subtree whose paths run through states of one need
//! is taken in one look (0.10× the time of the walk of each token at 49k tokens, 0.45× at
//! 128k–152k, where non-ASCII tokens are walked node by node: BENCHMARKS.md, *The budget's
//! masks beside the pass*). [`crate::Matcher::retain_fitting_by_walk`]
//! keeps the walk of each token as the reference the tests hold both to.

use std::sync::atomic::Ordering;

use crate::dfa::DEAD;
use crate::grammar::Grammar;

/// Distinct needs a table keeps as masks (the smallest ones).
pub(crate) const MAX_LEVELS: usize = 8;

/// Tokens below a trie node from which [`Grammar::for_each_need`] tries to take the node's
/// whole subtree at once.
const MIN_RUN_TOKENS: u32 = 8;

/// A state's allowed tokens (end of generation and special tokens left out) by the tokens a
/// shortest completion needs after them.
#[derive(Debug)]
pub(crate) struct FitTable {
    /// `(need, mask)`, needs ascending: the mask holds every token whose completion after it
    /// takes at most `need` tokens.
    levels: Vec<(u32, Box<[u32]>)>,
    /// Every allowed token with a completion is in the last level (no need was left out).
    complete: bool,
}

impl FitTable {
    fn bytes(&self) -> usize {
        self.levels
            .iter()
            .map(|(_, m)| m.len() * 4 + 8)
            .sum::<usize>()
            + 32
    }
}

impl Grammar {
    /// State `s`'s table, built on the second call in `s`; `None` before that, and where the
    /// grammar's tables already take [`crate::Limits::max_fit_table_bytes`].
    pub(crate) fn fit_table(&self, s: u32) -> Option<&FitTable> {
        let cell = self.fit_tables.at(s as usize);
        if cell.get().is_none() {
            // A table costs a walk of the state's tokens (what one draw again costs without
            // it): built on the second draw again in a state, so that a state met once (most,
            // on varied records) is walked once, not walked and tabled.
            let seen = self
                .fit_visits
                .at(s as usize)
                .fetch_add(1, Ordering::Relaxed);
            if seen == 0 {
                return None;
            }
        }
        cell.get_or_init(|| {
            if self.fit_bytes.load(Ordering::Relaxed) >= self.limits().max_fit_table_bytes {
                // No room left: not built only to be dropped.
                return None;
            }
            let table = self.build_fit_table(s);
            let bytes = table.bytes();
            let used = self.fit_bytes.fetch_add(bytes, Ordering::Relaxed);
            if used + bytes > self.limits().max_fit_table_bytes {
                self.fit_bytes.fetch_sub(bytes, Ordering::Relaxed);
                None
            } else {
                Some(table)
            }
        })
        .as_ref()
    }

    /// Calls `f(ids, need)` for every node of the vocabulary's trie that tokens end at and that
    /// the walk from state `s` reaches alive: `ids` the tokens that end there (end of
    /// generation among them too, where it has bytes: callers leave it out), `need` the tokens
    /// a shortest completion takes after them (`None` where the search found none).
    pub(crate) fn for_each_need(&self, s: u32, mut f: impl FnMut(&[u32], Option<u32>)) {
        let trie = self.vocabulary().trie();
        let nodes = &trie.nodes;
        let dfa = self.dfa();
        // The state at each depth of the path to the current node (the root's is `s`).
        let mut states = vec![s; trie.max_depth + 1];
        let mut i = 1;
        while i < nodes.len() {
            let n = &nodes[i];
            let d = n.depth as usize;
            let next = dfa.next(states[d - 1], dfa.classes[n.byte as usize] as usize);
            if next == DEAD {
                i = n.subtree_end as usize;
                continue;
            }
            if n.tokens_end > n.tokens_start {
                let ids = &trie.token_ids[n.tokens_start as usize..n.tokens_end as usize];
                f(ids, self.completion(next).map(|c| c.len));
            }
            if let Some(need) = self.need_below(next, n) {
                // Every token below ends in a state of one need: all of them at once.
                f(
                    &trie.token_ids[n.tokens_end as usize..n.subtree_tokens_end as usize],
                    need,
                );
                i = n.subtree_end as usize;
                continue;
            }
            states[d] = next;
            i += 1;
        }
    }

    /// Where every path below trie node `n` from `x`, the state at `n`, follows `x`'s run
    /// ([`Grammar::run_below`]) through states whose shortest completions all take the same
    /// number of tokens: that number (`Some(None)` where none was found). Inside a string
    /// without a lower bound left, say, every token of plain text leaves the string open, and
    /// closing it takes as many tokens after any of them: the subtrees of those tokens take one
    /// look each instead of a walk. `None` for subtrees of fewer than [`MIN_RUN_TOKENS`]
    /// tokens (walked: cheaper than the look).
    fn need_below(&self, x: u32, n: &crate::vocab::Node) -> Option<Option<u32>> {
        if n.subtree_tokens_end - n.tokens_end < MIN_RUN_TOKENS {
            return None;
        }
        let mut need = None;
        for state in self.run_below(x, n)? {
            let here = self.completion(state).map(|c| c.len);
            if need.is_some_and(|need| need != here) {
                return None;
            }
            need = Some(here);
        }
        need
    }

    /// [`crate::Matcher::retain_fitting`] from state `s` by one walk of the trie
    /// ([`Grammar::for_each_need`]): clears from `mask` every token that does not fit in `left`
    /// and returns the tokens kept.
    pub(crate) fn retain_fitting_by_trie(&self, s: u32, mask: &mut [u32], left: usize) -> usize {
        let vocab = self.vocabulary();
        let mut fit = vec![0u32; mask.len()];
        self.for_each_need(s, |ids, need| {
            if need.is_some_and(|n| (n as usize) < left) {
                for &id in ids {
                    fit[id as usize / 32] |= 1 << (id % 32);
                }
            }
        });
        // End of generation takes no token: it fits wherever it is allowed, where `s` accepts
        // (whatever the walk said of an end token with bytes).
        let accepting = self.is_accepting(s);
        for &e in vocab.eos() {
            if let Some(w) = fit.get_mut(e as usize / 32) {
                *w = if accepting {
                    *w | 1 << (e % 32)
                } else {
                    *w & !(1 << (e % 32))
                };
            }
        }
        let mut kept = 0;
        for (word, f) in mask.iter_mut().zip(&fit) {
            *word &= f;
            kept += word.count_ones() as usize;
        }
        kept
    }

    fn build_fit_table(&self, s: u32) -> FitTable {
        let vocab = self.vocabulary();
        let words = vocab.mask_words();
        let mut needs: Vec<(u32, u32)> = Vec::new();
        // The smallest distinct needs, ascending; one more than kept says some were left out.
        let mut smallest: Vec<u32> = Vec::with_capacity(MAX_LEVELS + 1);
        self.for_each_need(s, |ids, need| {
            let Some(need) = need else { return };
            let before = needs.len();
            needs.extend(
                ids.iter()
                    .filter(|&&id| !vocab.is_eos(id))
                    .map(|&id| (need, id)),
            );
            if needs.len() == before {
                return;
            }
            if let Err(at) = smallest.binary_search(&need) {
                if at <= MAX_LEVELS {
                    smallest.insert(at, need);
                    smallest.truncate(MAX_LEVELS + 1);
                }
            }
        });
        let complete = smallest.len() <= MAX_LEVELS;
        smallest.truncate(MAX_LEVELS);
        let mut masks = vec![vec![0u32; words]; smallest.len()];
        for &(need, id) in &needs {
            if let Ok(level) = smallest.binary_search(&need) {
                masks[level][id as usize / 32] |= 1 << (id % 32);
            }
        }
        for level in 1..masks.len() {
            let (below, at) = masks.split_at_mut(level);
            for (w, word) in at[0].iter_mut().enumerate() {
                *word |= below[level - 1][w];
            }
        }
        let levels = smallest
            .into_iter()
            .zip(masks)
            .map(|(need, mask)| (need, mask.into_boxed_slice()))
            .collect();
        FitTable { levels, complete }
    }

    /// [`crate::Matcher::retain_fitting`] from state `s` by its table: clears from `mask` every
    /// token that does not fit in `left` and returns the tokens kept, or `None` where the table
    /// cannot say (not kept, or `left` reaches past its levels) and the tokens must be walked.
    pub(crate) fn retain_fitting_by_table(
        &self,
        s: u32,
        mask: &mut [u32],
        left: usize,
    ) -> Option<usize> {
        let table = self.fit_table(s)?;
        let reaches_past = table
            .levels
            .last()
            .is_some_and(|(need, _)| (*need as usize) + 1 < left);
        if !table.complete && reaches_past {
            return None;
        }
        // End of generation ends the output without a token: it fits wherever it is allowed,
        // which is where the state accepts. Its bits are read before the AND and put back.
        let eos_ids = self.vocabulary().eos();
        let mut eos_kept = [false; 16];
        if eos_ids.len() > eos_kept.len() {
            return None;
        }
        let accepting = self.is_accepting(s);
        for (k, &e) in eos_ids.iter().enumerate() {
            let bit = mask
                .get(e as usize / 32)
                .is_some_and(|w| w & (1 << (e % 32)) != 0);
            eos_kept[k] = accepting && bit;
        }
        let level = table
            .levels
            .iter()
            .rev()
            .find(|(need, _)| (*need as usize) < left)
            .map(|(_, m)| &m[..]);
        let mut kept = 0;
        for (w, word) in mask.iter_mut().enumerate() {
            *word &= level.map_or(0, |m| m[w]);
            kept += word.count_ones() as usize;
        }
        for (k, &e) in eos_ids.iter().enumerate() {
            if eos_kept[k] {
                mask[e as usize / 32] |= 1 << (e % 32);
                kept += 1;
            }
        }
        Some(kept)
    }
}
