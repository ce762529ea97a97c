//! Loop regions of the token trie: where a mask walk reaches a state that a set of bytes leads
//! back to (an identifier's `[a-z0-9_]*`, a number's digits), every token below that node whose
//! further bytes stay in the set is allowed, whatever the state's context, and only the nodes where
//! a path first leaves the set (its *exits*) need the state's transitions.
//!
//! A walk from such a state used to step the DFA at every node of that region, once per state: a
//! grammar that reaches one identifier loop from many contexts (SQL: after `SELECT`, `FROM`,
//! `WHERE`, each comma, each operator) walked the same 20–25k tokens at 152k again for each. The
//! first walk of a region (per byte set and trie node) records a [`LoopIndex`] of its tokens and
//! exits as it goes, without stepping the DFA inside the region; each later state, in any
//! grammar over the same vocabulary, costs a copy of the token ranges and a walk of the exits its
//! transitions allow.

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

/// The loop region of one byte set `L` below one trie node, its *anchor*: the tokens of the
/// nodes whose path from the anchor is in `L*`, and the exits, nodes whose parent is in the region
/// but whose own byte is not in `L`.
#[derive(Debug)]
pub(crate) struct LoopIndex {
    /// The region's tokens as ranges `token_ids[first..end]`, in order, adjacent ones merged.
    pub(crate) fills: Box<[(u32, u32)]>,
    /// Exits as `(byte, node)`, by byte, each byte's in preorder.
    exits: Box<[(u8, u32)]>,
}

/// What a walk of a loop region finds, in preorder ([`LoopIndex::walk`]).
pub(crate) enum Part {
    /// Tokens `token_ids[first..end]` of the region.
    Tokens(u32, u32),
    /// An exit node.
    Exit(u32),
}

impl LoopIndex {
    /// Walks the region of `set` below `anchor` in `trie`, telling `found` each part as it goes
    /// (so the first walk of a region can fill a mask while it builds the index), and returns
    /// the index.
    pub(crate) fn walk(
        trie: &TokenTrie,
        set: &ByteSet,
        anchor: usize,
        mut found: impl FnMut(Part),
    ) -> Self {
        let nodes = &trie.nodes;
        let whole = set.whole_groups();
        let mut fills: Vec<(u32, u32)> = Vec::new();
        let mut fill = |first: u32, end: u32, found: &mut dyn FnMut(Part)| {
            if first == end {
                return;
            }
            found(Part::Tokens(first, end));
            match fills.last_mut() {
                Some(last) if last.1 == first => last.1 = end,
                _ => fills.push((first, end)),
            }
        };
        let mut exits: Vec<(u8, u32)> = Vec::new();
        let end = nodes[anchor].subtree_end as usize;
        let mut i = anchor + 1;
        while i < end {
            let n = &nodes[i];
            if !set.contains(n.byte) {
                exits.push((n.byte, i as u32));
                found(Part::Exit(i as u32));
                i = n.subtree_end as usize;
            } else if n.below & !whole == 0 {
                fill(n.tokens_start, n.subtree_tokens_end, &mut found);
                i = n.subtree_end as usize;
            } else {
                fill(n.tokens_start, n.tokens_end, &mut found);
                i += 1;
            }
        }
        exits.sort_unstable();
        LoopIndex {
            fills: fills.into(),
            exits: exits.into(),
        }
    }

    /// The exits grouped by byte: `(byte, [(byte, node)])`, nodes in preorder.
    pub(crate) fn exits(&self) -> impl Iterator<Item = (u8, &[(u8, u32)])> {
        self.exits
            .chunk_by(|a, b| a.0 == b.0)
            .map(|run| (run[0].0, run))
    }

    /// Entries held (ranges and nodes listed), for the cache's bound.
    fn entries(&self) -> usize {
        self.fills.len() + self.exits.len()
    }
}

/// Which of a vocabulary's tries an index is of: all tokens, or the text slice's `rest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Trie {
    All,
    Rest,
}

/// An index's key: the trie, the byte set, the anchor node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LoopKey {
    pub(crate) trie: Trie,
    pub(crate) set: ByteSet,
    pub(crate) anchor: u32,
}

/// Entries the loop indexes of one vocabulary may hold in all (about 8 MB). The region of an
/// identifier below one letter at 152k tokens holds a few hundred. Past the bound, walks step
/// through regions node by node.
const MAX_ENTRIES: usize = 1 << 20;

/// The loop indexes of one vocabulary, built by the first walk of each region and shared by
/// every grammar compiled for that vocabulary (an index depends on the tokens only). A clone
/// starts empty.
#[derive(Debug, Default)]
pub(crate) struct LoopCache(Mutex<CacheInner>);

#[derive(Debug, Default)]
struct CacheInner {
    indexes: FxHashMap<LoopKey, Arc<LoopIndex>>,
    entries: usize,
}

impl Clone for LoopCache {
    fn clone(&self) -> Self {
        LoopCache::default()
    }
}

/// What the cache holds for a key.
pub(crate) enum Lookup {
    Found(Arc<LoopIndex>),
    /// Not built yet: the caller walks the region and [`LoopCache::insert`]s the index.
    Missing,
    /// Not built, and the cache is full.
    Full,
}

impl LoopCache {
    pub(crate) fn lookup(&self, key: &LoopKey) -> Lookup {
        let cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match cache.indexes.get(key) {
            Some(index) => Lookup::Found(index.clone()),
            None if cache.entries >= MAX_ENTRIES => Lookup::Full,
            None => Lookup::Missing,
        }
    }

    /// Keeps `index` for `key` (another thread may have built the same one meanwhile: the
    /// first kept stays).
    pub(crate) fn insert(&self, key: LoopKey, index: LoopIndex) {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.entries < MAX_ENTRIES && !cache.indexes.contains_key(&key) {
            cache.entries += index.entries();
            cache.indexes.insert(key, Arc::new(index));
        }
    }
}
