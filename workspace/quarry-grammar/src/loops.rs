//! Loop regions of the token trie: where a mask walk reaches a state that a set of bytes leads
//! back to (an identifier's `[a-z0-9_]*`, a number's digits), every token below that node whose
//! further bytes stay in the set is allowed, whatever the state's context, and only the nodes where
//! a path first leaves the set (its *exits*) need the state's transitions.
//!
//! A walk from such a state used to step the DFA at every node of that region, once per state: a
//! grammar that reaches one identifier loop from many contexts (SQL: after `SELECT`, `FROM`,
//! `WHERE`, each comma, each operator) walked the same 20k tokens at 152k again for each. A
//! [`LoopIndex`] lists the region's tokens and its exits once per (byte set, trie node), so each
//! further state costs a copy of the token ranges and a walk of the exits its transitions allow.

use std::sync::{Arc, Mutex, PoisonError};

use rustc_hash::FxHashMap;

use crate::vocab::{TokenTrie, BYTE_GROUP};

/// A set of bytes (the bytes that lead a state back to itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct ByteSet(pub(crate) [u64; 4]);

impl ByteSet {
    #[inline]
    pub(crate) fn contains(&self, b: u8) -> bool {
        self.0[b as usize / 64] >> (b % 64) & 1 == 1
    }

    pub(crate) fn insert(&mut self, b: u8) {
        self.0[b as usize / 64] |= 1 << (b % 64);
    }

    pub(crate) fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// The byte groups ([`BYTE_GROUP`]) all of whose bytes are in the set.
    fn whole_groups(&self) -> u64 {
        let mut partial = 0u64;
        let mut any = 0u64;
        for b in 0..=255u8 {
            let g = 1u64 << BYTE_GROUP[b as usize];
            if self.contains(b) {
                any |= g;
            } else {
                partial |= g;
            }
        }
        any & !partial
    }
}

/// The loop region of one byte set `L` below one trie node `base`: the tokens of the nodes whose
/// path from `base` is in `L*`, and the exits, nodes whose parent is in the region but whose own
/// byte is not in `L`. Both in preorder, so the part below any region node `n` is found by
/// binary search: the token ranges inside `n`'s window of token positions, the exits whose node
/// index lies in `n`'s subtree.
#[derive(Debug)]
pub(crate) struct LoopIndex {
    /// The region's tokens as ranges `token_ids[first..end]`, in order, adjacent ones merged.
    fills: Box<[(u32, u32)]>,
    /// Exits grouped by their byte: `(byte, nodes)`.
    exits: Box<[(u8, Box<[u32]>)]>,
}

impl LoopIndex {
    /// The region of `set` below `base` in `trie`.
    fn new(trie: &TokenTrie, set: &ByteSet, base: usize) -> Self {
        let nodes = &trie.nodes;
        let whole = set.whole_groups();
        let mut fills: Vec<(u32, u32)> = Vec::new();
        let mut fill = |first: u32, end: u32| match fills.last_mut() {
            Some(last) if last.1 == first => last.1 = end,
            _ if first < end => fills.push((first, end)),
            _ => {}
        };
        let mut exits: Vec<(u8, u32)> = Vec::new();
        let end = nodes[base].subtree_end as usize;
        let mut i = base + 1;
        while i < end {
            let n = &nodes[i];
            if !set.contains(n.byte) {
                exits.push((n.byte, i as u32));
                i = n.subtree_end as usize;
            } else if n.below & !whole == 0 {
                fill(n.tokens_start, n.subtree_tokens_end);
                i = n.subtree_end as usize;
            } else {
                fill(n.tokens_start, n.tokens_end);
                i += 1;
            }
        }
        // By byte, each in preorder (the sort is stable).
        exits.sort_by_key(|&(b, _)| b);
        let mut grouped: Vec<(u8, Box<[u32]>)> = Vec::new();
        for run in exits.chunk_by(|a, b| a.0 == b.0) {
            grouped.push((run[0].0, run.iter().map(|&(_, e)| e).collect()));
        }
        LoopIndex {
            fills: fills.into(),
            exits: grouped.into(),
        }
    }

    /// The token ranges (`token_ids[first..end]`) of the region strictly below node `n`, which
    /// must be in the region or be its base. (A node's descendants hold the tokens
    /// `tokens_end..subtree_tokens_end`, so the ranges are cut to that window.)
    pub(crate) fn fills_below(
        &self,
        trie: &TokenTrie,
        n: usize,
    ) -> impl Iterator<Item = (u32, u32)> + '_ {
        let (lo, hi) = (trie.nodes[n].tokens_end, trie.nodes[n].subtree_tokens_end);
        let a = self.fills.partition_point(|f| f.1 <= lo);
        self.fills[a..]
            .iter()
            .take_while(move |f| f.0 < hi)
            .map(move |&(first, end)| (first.max(lo), end.min(hi)))
    }

    /// The exits strictly below node `n` (in the region or its base) whose byte `live` allows,
    /// by byte.
    pub(crate) fn exits_below<'a>(
        &'a self,
        trie: &TokenTrie,
        n: usize,
        mut live: impl FnMut(u8) -> bool + 'a,
    ) -> impl Iterator<Item = (u8, &'a [u32])> + 'a {
        let (lo, hi) = (n as u32 + 1, trie.nodes[n].subtree_end);
        self.exits.iter().filter_map(move |(b, e)| {
            if !live(*b) {
                return None;
            }
            let a = e.partition_point(|&x| x < lo);
            let z = a + e[a..].partition_point(|&x| x < hi);
            (z > a).then(|| (*b, &e[a..z]))
        })
    }

    /// Entries held (nodes listed), for the cache's bound.
    fn entries(&self) -> usize {
        self.fills.len() + self.exits.iter().map(|(_, e)| e.len()).sum::<usize>()
    }
}

/// Which of a vocabulary's tries an index is of: all tokens, or the text slice's `rest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Trie {
    All,
    Rest,
}

/// Entries (nodes listed) the loop indexes of one vocabulary may hold in all: about 16 MB. An
/// identifier's region at 152k tokens is about 6,500. Past the bound, walks step through
/// regions node by node.
const MAX_ENTRIES: usize = 1 << 20;

/// The loop indexes of one vocabulary, built on first use and shared by every grammar compiled
/// for it (an index depends on the tokens only). A clone starts empty.
#[derive(Debug, Default)]
pub(crate) struct LoopCache(Mutex<CacheInner>);

#[derive(Debug, Default)]
struct CacheInner {
    indexes: FxHashMap<(Trie, ByteSet, u32), Arc<LoopIndex>>,
    entries: usize,
}

impl Clone for LoopCache {
    fn clone(&self) -> Self {
        LoopCache::default()
    }
}

impl LoopCache {
    /// The index of `set` below node `base` of `trie` (which is `which`), built on first use;
    /// `None` once the cache holds [`MAX_ENTRIES`].
    pub(crate) fn get(
        &self,
        which: Trie,
        trie: &TokenTrie,
        set: ByteSet,
        base: usize,
    ) -> Option<Arc<LoopIndex>> {
        let key = (which, set, base as u32);
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = cache.indexes.get(&key) {
            return Some(index.clone());
        }
        if cache.entries >= MAX_ENTRIES {
            return None;
        }
        let index = Arc::new(LoopIndex::new(trie, &set, base));
        cache.entries += index.entries();
        cache.indexes.insert(key, index.clone());
        Some(index)
    }
}
