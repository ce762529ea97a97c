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

use std::sync::atomic::Ordering;

use crate::grammar::Grammar;

/// Distinct needs a table keeps as masks (the smallest ones).
pub(crate) const MAX_LEVELS: usize = 8;

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

    fn build_fit_table(&self, s: u32) -> FitTable {
        let vocab = self.vocabulary();
        let words = vocab.mask_words();
        let base = self.mask(s);
        let allowed: usize = base.iter().map(|w| w.count_ones() as usize).sum();
        let mut needs: Vec<(u32, u32)> = Vec::with_capacity(allowed);
        // The smallest distinct needs, ascending; one more than kept says some were left out.
        let mut smallest: Vec<u32> = Vec::with_capacity(MAX_LEVELS + 1);
        for (w, &word) in base.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let id = (w * 32) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                if vocab.is_eos(id) || vocab.is_special(id) {
                    continue;
                }
                let Some(bytes) = vocab.token_bytes(id) else {
                    continue;
                };
                let mut next = Some(s);
                for &b in bytes {
                    next = next.and_then(|n| self.step(n, b));
                }
                let Some(need) = next.and_then(|n| self.completion(n)).map(|c| c.len) else {
                    continue;
                };
                needs.push((need, id));
                if let Err(at) = smallest.binary_search(&need) {
                    if at <= MAX_LEVELS {
                        smallest.insert(at, need);
                        smallest.truncate(MAX_LEVELS + 1);
                    }
                }
            }
        }
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
