//! The radix-tree prefix cache: token-id paths mapped to the KV pages that hold them.
//!
//! The engine's pool uses one token position per page, so a path of `n` tokens owns `n` pages and a
//! match can end at any token (SGLang's default granularity). A node holds a run of tokens and their
//! pages; children are keyed by their first token. Sequences *lock* the node where their cached
//! prefix ends, which pins the whole path to the root; only unlocked leaves are evicted, least
//! recently used first, so a page a running sequence reads is never freed.
//!
//! Every operation costs time linear in the tokens it touches (plus `log` of the leaf count for
//! eviction).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use quarry_model::PageId;
use rustc_hash::FxHashMap;

/// A node of the tree. `ROOT` is the empty prefix and is never evicted.
pub type NodeId = u32;
pub const ROOT: NodeId = 0;

#[derive(Debug, Default, Clone)]
struct Node {
    parent: NodeId,
    key: Vec<u32>,
    pages: Vec<PageId>,
    children: FxHashMap<u32, NodeId>,
    /// Sequences whose locked node is this one or below it.
    lock_ref: u32,
    /// Logical time of the last match or insert that went through this node.
    last_access: u64,
    live: bool,
}

/// Hit, miss and eviction counters since the cache was created.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Prompt tokens whose KV was found in the cache.
    pub hit_tokens: u64,
    /// Prompt tokens that had to be computed.
    pub miss_tokens: u64,
    /// Pages freed by eviction.
    pub evicted_pages: u64,
    /// Leaves removed by eviction.
    pub evictions: u64,
    /// Time spent in lookups, inserts and evictions (the cache's whole overhead), in nanoseconds.
    pub busy_ns: u64,
}

impl CacheStats {
    /// Share of looked-up prompt tokens served from the cache (0 when nothing was looked up).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hit_tokens + self.miss_tokens;
        if total == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / total as f64
        }
    }
}

/// A prefix match: the deepest node reached and the pages of every matched token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub node: NodeId,
    pub pages: Vec<PageId>,
}

/// The radix tree over token ids. It owns the pages on its paths; the caller frees the pages that
/// [`RadixCache::insert`] and [`RadixCache::evict`] hand back.
#[derive(Debug)]
pub struct RadixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<NodeId>,
    clock: u64,
    /// Pages held by the tree (all nodes).
    cached_pages: usize,
    stats: CacheStats,
}

impl Default for RadixCache {
    fn default() -> Self {
        Self::new()
    }
}

impl RadixCache {
    pub fn new() -> Self {
        let root = Node {
            live: true,
            // The root is always "locked": it is never evicted.
            lock_ref: 1,
            ..Node::default()
        };
        Self {
            nodes: vec![root],
            free_nodes: Vec::new(),
            clock: 0,
            cached_pages: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Pages the tree holds.
    pub fn cached_pages(&self) -> usize {
        self.cached_pages
    }

    /// Adds `hit` found and `miss` computed prompt tokens to the statistics.
    pub fn record_lookup(&mut self, hit: usize, miss: usize) {
        self.stats.hit_tokens += hit as u64;
        self.stats.miss_tokens += miss as u64;
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The longest cached prefix of `tokens`. Splits a node where the match ends inside it, so the
    /// returned node's path is exactly the matched tokens. Does not lock.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> Match {
        let t = std::time::Instant::now();
        let m = self.match_inner(tokens);
        self.stats.busy_ns += t.elapsed().as_nanos() as u64;
        m
    }

    fn match_inner(&mut self, tokens: &[u32]) -> Match {
        let now = self.tick();
        let mut node = ROOT;
        let mut pages = Vec::new();
        let mut at = 0;
        self.nodes[ROOT as usize].last_access = now;
        while let Some((child, common)) = self.descend(node, &tokens[at..], now) {
            pages.extend_from_slice(&self.nodes[child as usize].pages);
            at += common;
            node = child;
        }
        Match { node, pages }
    }

    /// Inserts the path `tokens` whose KV is in `pages` (one per token). Where the tree already
    /// holds a token, the tree's page is kept: `pages[i]` is replaced by it and the caller's page
    /// is pushed to `duplicates` for the caller to free. Returns the node at the end of the path.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        pages: &mut [PageId],
        duplicates: &mut Vec<PageId>,
    ) -> NodeId {
        let t = std::time::Instant::now();
        let node = self.insert_inner(tokens, pages, duplicates);
        self.stats.busy_ns += t.elapsed().as_nanos() as u64;
        node
    }

    fn insert_inner(
        &mut self,
        tokens: &[u32],
        pages: &mut [PageId],
        duplicates: &mut Vec<PageId>,
    ) -> NodeId {
        assert_eq!(tokens.len(), pages.len(), "one page per token");
        let now = self.tick();
        let mut node = ROOT;
        let mut at = 0;
        while at < tokens.len() {
            match self.descend(node, &tokens[at..], now) {
                Some((child, common)) => {
                    let c = &self.nodes[child as usize];
                    for (mine, theirs) in pages[at..at + common].iter_mut().zip(&c.pages) {
                        if *mine != *theirs {
                            duplicates.push(*mine);
                            *mine = *theirs;
                        }
                    }
                    at += common;
                    node = child;
                }
                None => {
                    let id = self.new_node(Node {
                        parent: node,
                        key: tokens[at..].to_vec(),
                        pages: pages[at..].to_vec(),
                        children: FxHashMap::default(),
                        lock_ref: 0,
                        last_access: now,
                        live: true,
                    });
                    self.cached_pages += tokens.len() - at;
                    self.nodes[node as usize].children.insert(tokens[at], id);
                    node = id;
                    at = tokens.len();
                }
            }
        }
        node
    }

    /// Pins `node` and its ancestors against eviction.
    pub fn lock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            self.nodes[n as usize].lock_ref += 1;
            n = self.nodes[n as usize].parent;
        }
    }

    /// Releases a [`RadixCache::lock`].
    pub fn unlock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            let r = &mut self.nodes[n as usize].lock_ref;
            assert!(*r > 0, "unlock of node {n} that is not locked");
            *r -= 1;
            n = self.nodes[n as usize].parent;
        }
    }

    /// Pages that [`RadixCache::evict`] could free now (held by unlocked nodes).
    pub fn evictable_pages(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.live && n.lock_ref == 0)
            .map(|n| n.pages.len())
            .sum()
    }

    /// Evicts unlocked leaves, least recently used first, until at least `want` pages were
    /// pushed to `freed` or nothing unlocked is left. Returns the number of pages freed.
    pub fn evict(&mut self, want: usize, freed: &mut Vec<PageId>) -> usize {
        let t = std::time::Instant::now();
        let got = self.evict_inner(want, freed);
        self.stats.busy_ns += t.elapsed().as_nanos() as u64;
        got
    }

    fn evict_inner(&mut self, want: usize, freed: &mut Vec<PageId>) -> usize {
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.live && n.lock_ref == 0 && n.children.is_empty())
            .map(|(i, n)| Reverse((n.last_access, i as NodeId)))
            .collect();
        let mut got = 0;
        while got < want {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let node = std::mem::take(&mut self.nodes[id as usize]);
            got += node.pages.len();
            self.cached_pages -= node.pages.len();
            freed.extend_from_slice(&node.pages);
            self.stats.evicted_pages += node.pages.len() as u64;
            self.stats.evictions += 1;
            self.free_nodes.push(id);
            let parent = &mut self.nodes[node.parent as usize];
            parent.children.remove(&node.key[0]);
            if node.parent != ROOT && parent.children.is_empty() && parent.lock_ref == 0 {
                heap.push(Reverse((parent.last_access, node.parent)));
            }
        }
        got
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    /// The child of `node` that shares a first token with `rest`, split so that its key is exactly
    /// the part it shares, and that length; marks it used at `now`. `None` when no child matches.
    fn descend(&mut self, node: NodeId, rest: &[u32], now: u64) -> Option<(NodeId, usize)> {
        let &child = self.nodes[node as usize].children.get(rest.first()?)?;
        let common = common_len(&self.nodes[child as usize].key, rest);
        let child = if common < self.nodes[child as usize].key.len() {
            self.split(child, common)
        } else {
            child
        };
        self.nodes[child as usize].last_access = now;
        Some((child, common))
    }

    /// Splits `child` after `at` tokens; returns the new upper node (holding the first `at`).
    fn split(&mut self, child: NodeId, at: usize) -> NodeId {
        let c = &mut self.nodes[child as usize];
        let tail_key = c.key.split_off(at);
        let tail_pages = c.pages.split_off(at);
        let head_key = std::mem::replace(&mut c.key, tail_key);
        let head_pages = std::mem::replace(&mut c.pages, tail_pages);
        let parent = c.parent;
        let upper = Node {
            parent,
            key: head_key,
            pages: head_pages,
            children: FxHashMap::default(),
            lock_ref: c.lock_ref,
            last_access: c.last_access,
            live: true,
        };
        let first_tail = c.key[0];
        let first_head = upper.key[0];
        let id = self.new_node(upper);
        self.nodes[id as usize].children.insert(first_tail, child);
        self.nodes[child as usize].parent = id;
        self.nodes[parent as usize].children.insert(first_head, id);
        id
    }

    /// The tokens on the path from the root to `node`.
    pub fn path_tokens(&self, node: NodeId) -> Vec<u32> {
        let mut parts = Vec::new();
        let mut n = node;
        while n != ROOT {
            parts.push(n);
            n = self.nodes[n as usize].parent;
        }
        parts
            .iter()
            .rev()
            .flat_map(|&n| self.nodes[n as usize].key.iter().copied())
            .collect()
    }

    /// Checks the tree's structure; a description of the first inconsistency found.
    ///
    /// - every child is live, points back to its parent, is keyed by its first token, and has a
    ///   non-empty key with one page per token;
    /// - a node's lock count is its own locks plus its children's (`own_locks` gives the former);
    /// - no page appears twice, and `cached_pages` counts them all.
    pub fn check(&self, own_locks: &FxHashMap<NodeId, u32>) -> Result<(), Inconsistency> {
        let mut seen = rustc_hash::FxHashSet::default();
        let mut total = 0;
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id as usize];
            if !n.live {
                return Err(Inconsistency::DeadNode { node: id });
            }
            if id != ROOT {
                if n.key.is_empty() || n.key.len() != n.pages.len() {
                    return Err(Inconsistency::PagesPerToken {
                        node: id,
                        tokens: n.key.len(),
                        pages: n.pages.len(),
                    });
                }
                let expected = own_locks.get(&id).copied().unwrap_or(0)
                    + n.children
                        .values()
                        .map(|&c| self.nodes[c as usize].lock_ref)
                        .sum::<u32>();
                if n.lock_ref != expected {
                    return Err(Inconsistency::LockCount {
                        node: id,
                        lock_ref: n.lock_ref,
                        expected,
                    });
                }
            }
            for &p in &n.pages {
                if !seen.insert(p) {
                    return Err(Inconsistency::PageOwners {
                        page: p,
                        owners: 2,
                        allocated: true,
                    });
                }
            }
            total += n.pages.len();
            for (&first, &c) in &n.children {
                let child = &self.nodes[c as usize];
                if child.parent != id || child.key.first() != Some(&first) {
                    return Err(Inconsistency::Link {
                        child: c,
                        parent: id,
                    });
                }
                stack.push(c);
            }
        }
        if total != self.cached_pages {
            return Err(Inconsistency::CachedPages {
                counted: self.cached_pages,
                held: total,
            });
        }
        Ok(())
    }

    /// Every page the tree holds (for tests and leak checks).
    pub fn pages(&self) -> Vec<PageId> {
        self.nodes
            .iter()
            .filter(|n| n.live)
            .flat_map(|n| n.pages.iter().copied())
            .collect()
    }
}

/// What [`RadixCache::check`] or the engine's page check found wrong: a defect in quarry, named
/// by the node or page where it shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Inconsistency {
    #[error("node {node} is reachable but not live")]
    DeadNode { node: NodeId },
    #[error("node {node}: {tokens} tokens, {pages} pages")]
    PagesPerToken {
        node: NodeId,
        tokens: usize,
        pages: usize,
    },
    #[error("node {node}: lock_ref {lock_ref} but {expected} locks at or below it")]
    LockCount {
        node: NodeId,
        lock_ref: u32,
        expected: u32,
    },
    #[error("child {child} of {parent} is linked wrongly")]
    Link { child: NodeId, parent: NodeId },
    #[error("cached_pages is {counted} but the tree holds {held}")]
    CachedPages { counted: usize, held: usize },
    /// A page with no owner that is allocated, an owner that is not, or several owners (the
    /// tree and the running sequences are the owners).
    #[error("page {page}: {owners} owners, allocated = {allocated}")]
    PageOwners {
        page: PageId,
        owners: u8,
        allocated: bool,
    },
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
