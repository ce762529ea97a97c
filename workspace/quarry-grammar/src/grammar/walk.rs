//! How a state's token mask is computed: walks of the vocabulary's byte trie from the state,
//! with the shortcuts that keep them short (runs, the text slice, shared subtree walks, the split
//! by token length, loop regions, and a pushdown core's mask shared by its contexts).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError};

use rustc_hash::FxHashMap;

use super::Grammar;
use crate::dfa::{DEAD, UNKNOWN};
use crate::loops::{ByteSet, Lookup, LoopIndex, LoopKey, Part, Trie};
use crate::vocab::TokenTrie;

impl Grammar {
    /// A state's mask. For a pushdown configuration whose stacks reach below their tops (a
    /// context), most of the mask does not depend on that context (XGrammar's
    /// context-independent split): the tokens that never return past the tops are the mask of the
    /// *core* (the same tops over the bottom of the stack), cached once per core and shared by
    /// every context. Only tokens that pass a point where the core could end (a return point,
    /// found and cached with the core's mask) are walked again, from that point, in this
    /// context. A JSON string at any nesting depth thus costs one walk of the vocabulary in
    /// total, not one per depth.
    pub(super) fn compute_mask(&self, s: u32) -> Box<[u32]> {
        let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
        let core = self
            .cores
            .at(s as usize)
            .get_or_init(|| self.dfa.core(s).unwrap_or(s));
        let returns = (*core != s).then(|| self.returns(*core));
        match returns {
            Some(r) if !r.root => {
                mask.copy_from_slice(self.mask(*core));
                for &e in self.vocab.eos() {
                    mask[e as usize / 32] &= !(1 << (e % 32));
                }
                let trie = if r.in_rest {
                    &self.vocab.text().rest
                } else {
                    self.vocab.trie()
                };
                for (node, path) in r.points.iter() {
                    let mut x = s;
                    for &b in path.iter() {
                        x = self.dfa.step(x, b);
                        if x == DEAD {
                            break;
                        }
                    }
                    if x != DEAD {
                        self.walk(&mut mask, x, trie, *node as usize, None);
                    }
                }
                for &t in r.tokens.iter() {
                    if self.token_lives(s, t) {
                        mask[t as usize / 32] |= 1 << (t % 32);
                    }
                }
            }
            _ => {
                let counted = self.counted_text(s);
                if counted.is_some() || !self.split_by_length(&mut mask, s) {
                    self.walk_all(&mut mask, s, None, counted);
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

    /// The return points of core state `s` ([`Grammar::compute_mask`]), computed with its mask
    /// (which is cached too).
    fn returns(&self, s: u32) -> &Returns {
        self.returns.at(s as usize).get_or_init(|| {
            let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
            let mut points = Points::default();
            let in_rest = self.walk_all(&mut mask, s, Some(&mut points), None);
            if self.is_accepting(s) {
                for &e in self.vocab.eos() {
                    mask[e as usize / 32] |= 1 << (e % 32);
                }
            }
            let _ = self.masks.at(s as usize).get_or_init(|| mask);
            // A point below another is walked again with it (a context's walk from a point
            // covers its whole subtree): keep the outermost ones. Points come in trie order.
            let trie = if in_rest {
                &self.vocab.text().rest
            } else {
                self.vocab.trie()
            };
            let mut outer: Vec<NodePoint> = Vec::new();
            let mut end = 0u32;
            for (node, path) in points.nodes {
                if node >= end {
                    end = trie.nodes[node as usize].subtree_end;
                    outer.push((node, path));
                }
            }
            Returns {
                root: self.is_accepting(s),
                in_rest,
                points: outer.into(),
                tokens: points.tokens.into(),
            }
        })
    }

    /// Adds every token allowed from state `s` to `mask` (with `points`: and records the return
    /// points). Where plain-text characters lead back to `s` (inside a JSON string, say), the
    /// vocabulary's text slice is added at once: all of it, but the tokens holding one of the few
    /// printable bytes that do not loop, which are checked one by one; only the tokens outside
    /// the slice are walked. Without `points`, `counted` ([`Grammar::counted_text`] of `s`) does
    /// the same at a count of a bounded run of characters, with the slice's tokens of at most
    /// the characters left. Returns whether the slice was used (the points then index that
    /// smaller trie).
    fn walk_all(
        &self,
        mask: &mut [u32],
        s: u32,
        mut points: Option<&mut Points>,
        counted: Option<Counted>,
    ) -> bool {
        // Collecting return points needs a slice that passes no accepting state.
        let slice = match self.text_entry(s) {
            Some(e) if points.is_none() || e.quiet => Some(Counted {
                except: e.except,
                chars: usize::MAX,
                open: false,
            }),
            _ => {
                let counted = counted.filter(|_| points.is_none());
                if counted.is_some() {
                    self.counted_texts.fetch_add(1, Ordering::Relaxed);
                }
                counted
            }
        };
        let Some(Counted {
            except,
            chars,
            open,
        }) = slice
        else {
            self.walk(mask, s, self.vocab.trie(), 0, points.map(|p| &mut p.nodes));
            return false;
        };
        let text = self.vocab.text();
        for (m, t) in mask.iter_mut().zip(text.within(chars).iter()) {
            *m |= t;
        }
        if open {
            // The chain is checked only so far: longer slice tokens one by one.
            for &t in text.longer_than(chars) {
                if self.token_lives(s, t) {
                    mask[t as usize / 32] |= 1 << (t % 32);
                }
            }
        }
        let excepted = || {
            (0u8..0x80)
                .filter(move |&b| except >> b & 1 == 1)
                .flat_map(|b| text.containing[b as usize].iter().copied())
        };
        for t in excepted() {
            mask[t as usize / 32] &= !(1 << (t % 32));
        }
        for t in excepted() {
            let mut x = s;
            let mut passes_end = false;
            for &b in self
                .vocab
                .token_bytes(t)
                .expect("a token of the vocabulary")
            {
                passes_end |= self.is_accepting(x);
                x = self.dfa.step(x, b);
                if x == DEAD {
                    break;
                }
            }
            if x != DEAD {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
            if let Some(p) = points.as_deref_mut() {
                if passes_end {
                    p.tokens.push(t);
                }
            }
        }
        self.walk(mask, s, &text.rest, 0, points.map(|p| &mut p.nodes));
        true
    }

    /// Whether the vocabulary's text slice ([`crate::vocab`]: tokens of plain-text characters,
    /// U+0020 and up but `"`, `\\` and DEL) can be added at once from `s`. That holds when
    /// plain-text characters lead from `s` to one state `L` that they keep (`L` = `s` inside a
    /// JSON string; `L` the inside of a field from a CSV field's start): every slice token is
    /// then allowed, except those with a printable ASCII byte that goes elsewhere (from `s` or
    /// from `L`), returned as a bit set. `quiet`: no state after the first character accepts, so
    /// slice tokens hold no return point. `None` when a non-ASCII character goes elsewhere or a
    /// partial one dies, or when the exceptions cover more than an eighth of the slice (a walk is
    /// cheaper then). Checked once per state over sets of states (UTF-8 sequences by lead byte):
    /// a few hundred cached steps.
    fn text_entry(&self, s: u32) -> Option<TextEntry> {
        *self.text_loops.at(s as usize).get_or_init(|| {
            let step = self.text_step(s)?;
            let l = step.next;
            if l == DEAD {
                return None;
            }
            // L must be a loop: what leaves it is an exception too, and every non-ASCII
            // character must come back to it. (Checked here, not by asking L's own entry, so
            // that a chain of states such as `[a-z]{0,1000}` does not recurse.)
            let mut except = step.except;
            for b in crate::vocab::plain_ascii().filter(|&b| self.dfa.step(l, b) != l) {
                except |= 1 << b;
            }
            if !self.few_exceptions(except) {
                return None;
            }
            let mut quiet = !self.is_accepting(l) && step.quiet;
            if l != s {
                quiet &= self.utf8_leads_to(l, l)?;
            }
            Some(TextEntry { except, quiet })
        })
    }

    /// Where plain-text characters lead from `s`: the state most printable ASCII bytes go to
    /// (`DEAD` where they die), and the printable bytes that go elsewhere. `None` where a
    /// non-ASCII character goes elsewhere (or, where they die, a non-ASCII lead byte lives).
    /// Computed once per state.
    fn text_step(&self, s: u32) -> Option<TextStep> {
        *self.text_steps.at(s as usize).get_or_init(|| {
            let printable = crate::vocab::plain_ascii;
            let mut counts: Vec<(u32, usize)> = Vec::new();
            for b in printable() {
                let t = self.dfa.step(s, b);
                match counts.iter_mut().find(|(x, _)| *x == t) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((t, 1)),
                }
            }
            let (next, _) = *counts.iter().max_by_key(|&&(x, n)| (n, x == s))?;
            let mut except = 0u128;
            for b in printable().filter(|&b| self.dfa.step(s, b) != next) {
                except |= 1 << b;
            }
            let quiet = if next == DEAD {
                if (0xC2..=0xF4).any(|b| self.dfa.step(s, b) != DEAD) {
                    return None;
                }
                true
            } else {
                self.utf8_leads_to(s, next)?
            };
            Some(TextStep {
                next,
                except,
                quiet,
            })
        })
    }

    /// Whether the slice tokens holding one of the `except` bytes, checked one by one, are at
    /// most an eighth of the slice (past that a walk costs less).
    fn few_exceptions(&self, except: u128) -> bool {
        let text = self.vocab.text();
        let excepted: usize = (0u8..0x80)
            .filter(|&b| except >> b & 1 == 1)
            .map(|b| text.containing[b as usize].len())
            .sum();
        excepted <= text.len / 8
    }

    /// The text slice at a count of a bounded run of characters (a JSON string's `maxLength`:
    /// `[^"\\]{0,120}` in effect), where [`Grammar::text_entry`] does not apply because each
    /// character leads to the next count: where plain-text characters lead from `s` along a
    /// chain of states `s`, `s1`, `s2`, …, each to the next, until they die at `sm` (the bound)
    /// or the chain loops, a slice token of `c` characters (one begun at its end counts) holding
    /// none of the chain's excepted bytes is allowed exactly when `c <= m` (when the chain loops
    /// or outlasts the slice's longest token, always). Returns the excepted bytes (their tokens
    /// are checked one by one) and `m` (`usize::MAX`: no bound). `None` where the first
    /// character already dies (the walk is short there), where a state of the chain sends
    /// plain-text characters to more than one state, or where the exceptions are too many
    /// ([`Grammar::few_exceptions`]). Each state of the chain is checked once
    /// ([`Grammar::text_step`]), at most [`CHAIN_STEPS_PER_MASK`] new ones per mask: where the
    /// chain is checked only that far, `open` is set and `m` is how far, and the longer slice
    /// tokens are checked one by one (the next counts check the chain further).
    fn counted_text(&self, s: u32) -> Option<Counted> {
        let longest = self.vocab.text().longest_chars();
        let (mut cur, mut except, mut chars, mut open) = (s, 0u128, 0usize, false);
        let mut fresh = 0;
        loop {
            if chars >= longest {
                chars = usize::MAX;
                break;
            }
            if self.text_steps.at(cur as usize).get().is_none() {
                if fresh == CHAIN_STEPS_PER_MASK {
                    open = true;
                    break;
                }
                fresh += 1;
            }
            let step = self.text_step(cur)?;
            except |= step.except;
            if step.next == DEAD {
                if chars == 0 {
                    return None;
                }
                break;
            }
            if step.next == cur {
                chars = usize::MAX;
                break;
            }
            cur = step.next;
            chars += 1;
        }
        self.few_exceptions(except).then_some(Counted {
            except,
            chars,
            open,
        })
    }

    /// Whether token `t`'s bytes keep state `s` alive.
    fn token_lives(&self, s: u32, t: u32) -> bool {
        let bytes = self
            .vocab
            .token_bytes(t)
            .expect("a token of the vocabulary");
        let mut x = s;
        for &b in bytes {
            x = self.dfa.step(x, b);
            if x == DEAD {
                return false;
            }
        }
        true
    }

    /// Whether every non-ASCII character (each valid UTF-8 sequence, by lead byte) leads from
    /// `s` to `target` through states that do not die: `None` if not, else whether none of those
    /// states accepts.
    fn utf8_leads_to(&self, s: u32, target: u32) -> Option<bool> {
        const CONT: std::ops::RangeInclusive<u8> = 0x80..=0xBF;
        let sequences: [(
            std::ops::RangeInclusive<u8>,
            &[std::ops::RangeInclusive<u8>],
        ); 8] = [
            (0xC2..=0xDF, &[CONT]),
            (0xE0..=0xE0, &[0xA0..=0xBF, CONT]),
            (0xE1..=0xEC, &[CONT, CONT]),
            (0xED..=0xED, &[0x80..=0x9F, CONT]),
            (0xEE..=0xEF, &[CONT, CONT]),
            (0xF0..=0xF0, &[0x90..=0xBF, CONT, CONT]),
            (0xF1..=0xF3, &[CONT, CONT, CONT]),
            (0xF4..=0xF4, &[0x80..=0x8F, CONT, CONT]),
        ];
        let mut quiet = true;
        let leads = sequences.iter().all(|(lead, conts)| {
            let mut set: Vec<u32> = lead.clone().map(|b| self.dfa.step(s, b)).collect();
            for range in conts.iter() {
                set.sort_unstable();
                set.dedup();
                if set.contains(&DEAD) {
                    return false;
                }
                quiet &= !set.iter().any(|&x| self.is_accepting(x));
                set = set
                    .iter()
                    .flat_map(|&x| range.clone().map(move |b| (x, b)))
                    .map(|(x, b)| self.dfa.step(x, b))
                    .collect();
            }
            set.iter().all(|&x| x == target)
        });
        leads.then_some(quiet)
    }

    /// Adds to `mask` the tokens below trie node `start` (0: the root, so every token) allowed
    /// from state `s0` at that node. With `points`, also records every node with children where
    /// the state accepts (and its path), never skipping a subtree that holds one.
    fn walk(
        &self,
        mask: &mut [u32],
        s0: u32,
        trie: &TokenTrie,
        start: usize,
        points: Option<&mut Vec<NodePoint>>,
    ) {
        if trie.nodes.is_empty() {
            return;
        }
        let depth = trie.max_depth + 1;
        let mut at = Path {
            top: trie.nodes[start].depth as usize,
            short: 0,
            states: vec![s0; depth],
            bytes: vec![0u8; depth],
        };
        self.walk_below(mask, trie, start, &mut at, points);
    }

    /// [`Grammar::walk`] below node `start`, whose state is `at.states[depth of start]`, and
    /// whose path from the walk's first node is in `at.bytes`.
    fn walk_below(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        start: usize,
        at: &mut Path,
        mut points: Option<&mut Vec<NodePoint>>,
    ) {
        let nodes = &trie.nodes;
        let (dfa, classes) = (&self.dfa, &self.dfa.classes);
        let end = if start == 0 {
            nodes.len()
        } else {
            nodes[start].subtree_end as usize
        };
        let mut i = start + 1;
        while i < end {
            let n = &nodes[i];
            let d = n.depth as usize;
            if d + n.height as usize <= at.short {
                i = n.subtree_end as usize;
                continue;
            }
            let next = dfa.next(at.states[d - 1], classes[n.byte as usize] as usize);
            if next == DEAD {
                i = n.subtree_end as usize;
                continue;
            }
            if n.subtree_end as usize == i + 1 {
                // A leaf: its tokens are allowed, and `next` need not be built any further.
                set_tokens(mask, trie, n.tokens_start, n.tokens_end);
                i += 1;
                continue;
            }
            at.bytes[d - 1] = n.byte;
            if let Some(points) = points.as_deref_mut() {
                if self.is_accepting(next) {
                    points.push((i as u32, at.bytes[at.top..d].into()));
                }
            }
            // Whole subtrees are added (a run, a shared walk, a loop region) unless the short
            // tokens are known ([`Grammar::split_by_length`]): then setting a subtree's tokens
            // one by one costs more than the few steps along its longer tokens' paths.
            let whole = at.short == 0;
            // The run (a chain of states) only where its first step covers every byte below.
            let skip = whole && n.below & !self.first(next).0 == 0 && {
                let run = self.run(next);
                run.covers(n.below, n.height) && (points.is_none() || n.height <= run.plain)
            };
            set_tokens(mask, trie, n.tokens_start, n.tokens_end);
            if skip {
                // Every path below stays in the language: the whole subtree is allowed.
                set_tokens(mask, trie, n.tokens_end, n.subtree_tokens_end);
                i = n.subtree_end as usize;
            } else if whole
                && ((points.is_none() && self.shared_subtree(mask, trie, i, next))
                    || (self.loop_regions
                        && self.through_loop(mask, trie, i, next, at, points.as_deref_mut())))
            {
                // Added from a walk shared with other states, or through a loop region.
                i = n.subtree_end as usize;
            } else {
                at.states[d] = next;
                i += 1;
            }
        }
    }

    /// Adds the tokens below trie node `n` allowed from `x`, the state there, by the walk below
    /// `n` from [`LazyDfa::widened`]`(x, height of n)`, which every state that widens to the same
    /// state shares: a string's `maxLength` of 120 gives about 120 states, one per character
    /// read, and with the vocabulary's subtrees mostly a few bytes high, most of them widen to
    /// the state of a string without a bound there, so a subtree is walked once for all of
    /// them instead of once per state (a mask of such a state walked most of the trie: ~3 ms at
    /// 152k tokens). The walk's result is kept as runs of trie positions, for subtrees of the
    /// vocabulary's trie with at least [`MIN_SHARED_SUBTREE`] tokens, up to
    /// [`Limits::max_shared_subtrees`] of them. `false` (nothing done) where `x` does not widen
    /// at that height, the subtree is smaller, or the trie is another one.
    fn shared_subtree(&self, mask: &mut [u32], trie: &TokenTrie, n: usize, x: u32) -> bool {
        let node = &trie.nodes[n];
        if node.subtree_tokens_end - node.tokens_end < MIN_SHARED_SUBTREE
            || self.limits.max_shared_subtrees == 0
            || !std::ptr::eq(trie, self.vocab.trie())
        {
            return false;
        }
        let Some(w) = self.widened_at(x, node.height as usize) else {
            return false;
        };
        let key = (n as u32, w);
        let cached = self
            .subtrees
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .runs
            .get(&key)
            .cloned();
        let runs = match cached {
            Some(runs) => runs,
            None => {
                let mut below = vec![0u32; mask.len()];
                self.walk(&mut below, w, trie, n, None);
                let mut runs: Vec<(u32, u32)> = Vec::new();
                for p in node.tokens_end..node.subtree_tokens_end {
                    let t = trie.token_ids[p as usize];
                    if below[t as usize / 32] >> (t % 32) & 1 == 1 {
                        match runs.last_mut() {
                            Some(r) if r.1 == p => r.1 = p + 1,
                            _ => runs.push((p, p + 1)),
                        }
                    }
                }
                let runs: TokenRuns = runs.into();
                let mut cache = self
                    .subtrees
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if cache.held + runs.len() <= self.limits.max_shared_subtrees {
                    cache.held += runs.len();
                    cache.runs.insert(key, runs.clone());
                }
                runs
            }
        };
        for &(first, end) in runs.iter() {
            set_tokens(mask, trie, first, end);
        }
        true
    }

    /// The cache of [`Grammar::widened_at`] for state `x`: one cell per height below its
    /// [`LazyDfa::horizon`] (and up to the longest token), none where that is 0.
    fn widened_cells(&self, x: u32) -> &[AtomicU32] {
        self.widened
            .at(x as usize)
            .get_or_init(|| {
                let horizon = self.dfa.horizon(x) as usize;
                (horizon > 0).then(|| {
                    (0..horizon.min(self.vocab.trie().max_depth + 1))
                        .map(|_| AtomicU32::new(UNKNOWN))
                        .collect()
                })
            })
            .as_deref()
            .unwrap_or_default()
    }

    /// [`LazyDfa::widened`]`(x, height)`, cached per state and height; `None` where that is `x`
    /// itself (no bound of `x` shows past `height` bytes, or no other state widened to it yet).
    fn widened_at(&self, x: u32, height: usize) -> Option<u32> {
        let cell = self.widened_cells(x).get(height)?;
        let w = match cell.load(Ordering::Relaxed) {
            UNKNOWN => {
                let w = self.dfa.widened(x, height as u32);
                cell.store(w, Ordering::Relaxed);
                w
            }
            w => w,
        };
        (w != x).then_some(w)
    }

    /// The mask of a state with counted repetitions, split by token length: a token of at most
    /// `h` bytes is allowed from `s` exactly when it is from [`LazyDfa::widened`]`(s, h)` (no
    /// bound past `h` can show within it), so those tokens are that state's mask (computed once
    /// and shared by every state that widens to it: the counts of a string's `maxLength`, but
    /// the last few) masked by the vocabulary's tokens of at most `h` bytes, a few word
    /// operations; only the longer tokens are walked from `s` (at 152k tokens, 1,920 are longer
    /// than 16 bytes). `h` is the longest of the vocabulary's levels
    /// ([`Vocabulary::short_levels`]) at which `s` widens. `false` (nothing done) where it
    /// widens at none, where the text slice applies (cheaper), or with
    /// [`Limits::max_shared_subtrees`] 0.
    fn split_by_length(&self, mask: &mut [u32], s: u32) -> bool {
        if self.limits.max_shared_subtrees == 0 || self.text_entry(s).is_some() {
            return false;
        }
        let levels = self.vocab.short_levels();
        let Some((level, w)) = (0..levels.len())
            .rev()
            .find_map(|i| Some((i, self.widened_at(s, levels[i])?)))
        else {
            return false;
        };
        for ((m, &a), &b) in mask
            .iter_mut()
            .zip(self.mask(w).iter())
            .zip(self.vocab.short_mask(level).iter())
        {
            *m = a & b;
        }
        let trie = self.vocab.trie();
        let depth = trie.max_depth + 1;
        let mut at = Path {
            top: 0,
            short: levels[level],
            states: vec![s; depth],
            bytes: vec![0u8; depth],
        };
        self.walk_below(mask, trie, 0, &mut at, None);
        self.length_splits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Where `x`, the state at trie node `n`, loops on a set of bytes: adds the tokens below `n`
    /// through its loop region ([`crate::loops`]: from the vocabulary's index, or walking the
    /// region and recording the index on first use) and walks on from the exits `x` allows.
    /// `false` (nothing done) where `n` has too few nodes below it or `x` loops on too few bytes
    /// for that to pay ([`Limits::min_loop_region`], [`MIN_LOOP_BYTES`]), or the vocabulary holds
    /// its bound of indexes. Only for grammars with recursion (`loop_regions`). With `points`: an
    /// accepting `x` makes `n` the outermost return point of the region (recorded by the caller),
    /// so only exits are points to record (with the path to them).
    fn through_loop(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        n: usize,
        x: u32,
        at: &mut Path,
        mut points: Option<&mut Vec<NodePoint>>,
    ) -> bool {
        if (trie.nodes[n].subtree_end as usize - n) < self.limits.min_loop_region {
            return false;
        }
        let set = self.loop_set(x);
        if set.len() < MIN_LOOP_BYTES {
            return false;
        }
        if points.is_some() && self.is_accepting(x) {
            points = None;
        }
        let key = LoopKey {
            trie: if std::ptr::eq(trie, self.vocab.trie()) {
                Trie::All
            } else {
                Trie::Rest
            },
            set,
            anchor: n as u32,
        };
        let step = |b: u8| self.dfa.step(x, b);
        match self.vocab.loops().lookup(&key) {
            Lookup::Found(index) => {
                for &(first, end) in index.fills.iter() {
                    set_tokens(mask, trie, first, end);
                }
                for (b, exits) in index.exits() {
                    let y = step(b);
                    if y != DEAD {
                        for &(_, e) in exits {
                            self.exit(mask, trie, n, e, y, at, points.as_deref_mut());
                        }
                    }
                }
            }
            Lookup::Missing => {
                let index = LoopIndex::walk(trie, &set, n, |part| match part {
                    Part::Tokens(first, end) => set_tokens(mask, trie, first, end),
                    Part::Exit(e) => {
                        let y = step(trie.nodes[e as usize].byte);
                        if y != DEAD {
                            self.exit(mask, trie, n, e, y, at, points.as_deref_mut());
                        }
                    }
                });
                self.vocab.loops().insert(key, index);
            }
            Lookup::Full => return false,
        }
        true
    }

    /// The part of [`Grammar::through_loop`] at exit `e` of the loop region below `n`, whose
    /// state is `y`: its tokens, and the walk below it (with `points`, recording `e` where `y`
    /// accepts, with its path).
    #[allow(clippy::too_many_arguments)]
    fn exit(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        n: usize,
        e: u32,
        y: u32,
        at: &mut Path,
        points: Option<&mut Vec<NodePoint>>,
    ) {
        let en = &trie.nodes[e as usize];
        set_tokens(mask, trie, en.tokens_start, en.tokens_end);
        if en.subtree_end == e + 1 {
            return;
        }
        let de = en.depth as usize;
        let mut points = points;
        if let Some(points) = points.as_deref_mut() {
            // Points below need the path: the region's bytes from `n` down to `e`.
            let mut k = n;
            while k != e as usize {
                let mut c = k + 1;
                while trie.nodes[c].subtree_end <= e {
                    c = trie.nodes[c].subtree_end as usize;
                }
                at.bytes[trie.nodes[c].depth as usize - 1] = trie.nodes[c].byte;
                k = c;
            }
            if self.is_accepting(y) {
                points.push((e, at.bytes[at.top..de].into()));
            }
        }
        at.states[de] = y;
        self.walk_below(mask, trie, e as usize, at, points);
    }

    /// The bytes that lead state `s` back to itself, computed once.
    fn loop_set(&self, s: u32) -> ByteSet {
        *self.loop_sets.at(s as usize).get_or_init(|| {
            let loops: Vec<bool> = (0..self.dfa.nclasses)
                .map(|c| self.dfa.next(s, c) == s)
                .collect();
            let mut set = ByteSet::default();
            for b in 0..=255u8 {
                if loops[self.dfa.classes[b as usize] as usize] {
                    set.insert(b);
                }
            }
            set
        })
    }
}

/// A state that loops on fewer bytes walks its region node by node: a few steps cost less than
/// a lookup of the region's index and its exits.
const MIN_LOOP_BYTES: u32 = 8;

/// A mask walk's position: per depth, the state after that many bytes, and the bytes of the
/// current path.
struct Path {
    /// Depth of the walk's first node (points record their path from it).
    top: usize,
    /// Tokens of at most this many bytes are known already ([`Grammar::split_by_length`]):
    /// subtrees of only such tokens are skipped. 0: none.
    short: usize,
    states: Vec<u32>,
    bytes: Vec<u8>,
}

/// The fewest tokens below a trie node for [`Grammar::shared_subtree`] to keep its walk: below
/// it the lookup and the kept runs cost more than walking. With 16, SmolLM2's masks of random
/// package records took 1.0–1.4× the time without sharing; with 64, 0.9–1.0×, and the same at
/// 128k and 152k tokens (the development machine, noisy).
const MIN_SHARED_SUBTREE: u32 = 64;

/// Runs `first..end` of a trie's token positions.
type TokenRuns = Arc<[(u32, u32)]>;

/// [`Grammar::shared_subtree`]'s walks, and the runs they hold in all.
#[derive(Debug, Default)]
pub(super) struct SubtreeCache {
    /// `(trie node, widened state)` to its allowed tokens below the node.
    pub(super) runs: FxHashMap<(u32, u32), TokenRuns>,
    held: usize,
}

/// Adds `trie.token_ids[first..end]` to `mask`.
#[inline]
fn set_tokens(mask: &mut [u32], trie: &TokenTrie, first: u32, end: u32) {
    for &t in &trie.token_ids[first as usize..end as usize] {
        mask[t as usize / 32] |= 1 << (t % 32);
    }
}

/// Where a core state could end inside a token (see [`Grammar::compute_mask`]): at the start
/// (`root`), or after the bytes of each trie node listed (the node's index and its path).
#[derive(Debug)]
pub(super) struct Returns {
    root: bool,
    /// The points index the text slice's `rest` trie (the walk used the slice).
    in_rest: bool,
    points: Box<[NodePoint]>,
    /// Tokens checked one by one ([`Grammar::walk_all`]) that pass an accepting state.
    tokens: Box<[u32]>,
}

/// How the text slice applies at a count ([`Grammar::counted_text`]), or at a loop
/// ([`Grammar::text_entry`]: no bound, never open).
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    /// Printable ASCII bytes whose slice tokens are checked one by one.
    except: u128,
    /// Slice tokens of at most this many characters are allowed (`usize::MAX`: all).
    chars: usize,
    /// The chain was checked only `chars` far: longer slice tokens are checked one by one.
    open: bool,
}

/// The chain states of a bounded run a mask checks at most for the first time
/// ([`Grammar::counted_text`]): a string's first count would otherwise check every state up
/// to the slice's longest token (128 characters at 152k tokens) at once. The slice tokens
/// longer than the part checked are checked one by one (167 longer than 32 characters at 152k,
/// 23 at 49k).
const CHAIN_STEPS_PER_MASK: usize = 32;

/// Where plain-text characters lead from a state ([`Grammar::text_step`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct TextStep {
    next: u32,
    /// Printable ASCII bytes that lead elsewhere.
    except: u128,
    /// No state inside a non-ASCII character accepts.
    quiet: bool,
}

/// How the text slice applies to a state ([`Grammar::text_entry`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct TextEntry {
    /// Printable ASCII bytes whose tokens are checked one by one.
    except: u128,
    /// No state inside a slice token accepts.
    quiet: bool,
}

/// A trie node where a state accepts, and the bytes of its path.
type NodePoint = (u32, Box<[u8]>);

/// Return points found by a walk: trie nodes with their paths, and single tokens.
#[derive(Debug, Default)]
struct Points {
    nodes: Vec<NodePoint>,
    tokens: Vec<u32>,
}
