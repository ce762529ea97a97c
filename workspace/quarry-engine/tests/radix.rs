//! Property tests of the radix prefix cache: random insert, match, lock, unlock and evict sequences
//! against a plain reference (the set of inserted token strings), on many seeds.

use quarry_engine::radix::{NodeId, RadixCache};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;

const PAGES: u32 = 400;

struct World {
    cache: RadixCache,
    free: Vec<u32>,
    /// Locks held: the node, the tokens of its path and their pages when locked.
    locks: Vec<(NodeId, Vec<u32>, Vec<u32>)>,
}

impl World {
    fn new() -> Self {
        Self {
            cache: RadixCache::new(),
            free: (0..PAGES).rev().collect(),
            locks: Vec::new(),
        }
    }

    fn own_locks(&self) -> FxHashMap<NodeId, u32> {
        let mut m = FxHashMap::default();
        for (n, _, _) in &self.locks {
            *m.entry(*n).or_insert(0) += 1;
        }
        m
    }

    fn check(&self, step: usize) {
        self.cache
            .check(&self.own_locks())
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        // Conservation: every page is free or in the tree, never both.
        let mut tree = self.cache.pages();
        assert_eq!(tree.len() + self.free.len(), PAGES as usize, "step {step}");
        tree.extend_from_slice(&self.free);
        tree.sort_unstable();
        tree.dedup();
        assert_eq!(
            tree.len(),
            PAGES as usize,
            "step {step}: a page is lost or doubled"
        );
    }
}

fn random_tokens(rng: &mut SmallRng) -> Vec<u32> {
    // A few common stems so paths share prefixes and nodes split.
    let stems: [&[u32]; 3] = [&[1, 2, 3, 4, 5, 6], &[1, 2, 9], &[7, 7, 7, 7]];
    let mut t = stems[rng.random_range(0..stems.len())].to_vec();
    t.truncate(rng.random_range(1..=t.len()));
    for _ in 0..rng.random_range(0..8) {
        t.push(rng.random_range(0..6));
    }
    t
}

#[test]
fn random_operations_keep_the_tree_consistent() {
    for seed in 0..200u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut w = World::new();
        for step in 0..300 {
            match rng.random_range(0..10) {
                // Insert a sequence: pages for what the cache lacks, as the engine does.
                0..=3 => {
                    let tokens = random_tokens(&mut rng);
                    let m = w.cache.match_prefix(&tokens);
                    let need = tokens.len() - m.pages.len();
                    if w.free.len() < need {
                        let mut freed = Vec::new();
                        w.cache.evict(need - w.free.len(), &mut freed);
                        w.free.extend(freed);
                    }
                    if w.free.len() < need {
                        continue;
                    }
                    let mut pages = m.pages.clone();
                    for _ in 0..need {
                        pages.push(w.free.pop().unwrap());
                    }
                    // Sometimes the caller computed the whole sequence itself (duplicates).
                    if rng.random_bool(0.3) && !m.pages.is_empty() && w.free.len() >= m.pages.len()
                    {
                        for p in pages.iter_mut().take(m.pages.len()) {
                            *p = w.free.pop().unwrap();
                        }
                    }
                    let before = pages.clone();
                    let mut dups = Vec::new();
                    let node = w.cache.insert(&tokens, &mut pages, &mut dups);
                    // Duplicates are exactly the caller's pages that the tree replaced.
                    let replaced: Vec<u32> = before
                        .iter()
                        .zip(&pages)
                        .filter(|(a, b)| a != b)
                        .map(|(a, _)| *a)
                        .collect();
                    assert_eq!(dups, replaced, "seed {seed} step {step}");
                    w.free.extend(dups);
                    assert_eq!(w.cache.path_tokens(node), tokens);
                    if rng.random_bool(0.5) {
                        w.cache.lock(node);
                        w.locks.push((node, tokens, pages));
                    }
                }
                // Match and lock.
                4..=5 => {
                    let tokens = random_tokens(&mut rng);
                    let m = w.cache.match_prefix(&tokens);
                    let path = w.cache.path_tokens(m.node);
                    assert_eq!(path, tokens[..m.pages.len()], "seed {seed} step {step}");
                    if !m.pages.is_empty() {
                        w.cache.lock(m.node);
                        w.locks.push((m.node, path, m.pages));
                    }
                }
                6..=7 => {
                    if !w.locks.is_empty() {
                        let i = rng.random_range(0..w.locks.len());
                        let (node, _, _) = w.locks.swap_remove(i);
                        w.cache.unlock(node);
                    }
                }
                _ => {
                    let mut freed = Vec::new();
                    let want = rng.random_range(1..40);
                    let got = w.cache.evict(want, &mut freed);
                    assert_eq!(got, freed.len());
                    w.free.extend(freed);
                }
            }
            w.check(step);
            // Locked paths are never evicted: each still matches with the same pages.
            for (_, tokens, pages) in w.locks.clone() {
                let m = w.cache.match_prefix(&tokens);
                assert_eq!(
                    m.pages, pages,
                    "seed {seed} step {step}: a locked path lost pages"
                );
            }
        }
        // Unlock everything: the whole tree becomes evictable and eviction empties it.
        for (node, _, _) in std::mem::take(&mut w.locks) {
            w.cache.unlock(node);
        }
        let mut freed = Vec::new();
        w.cache.evict(usize::MAX, &mut freed);
        w.free.extend(freed);
        w.check(usize::MAX);
        assert_eq!(w.cache.cached_pages(), 0, "seed {seed}");
        assert_eq!(w.free.len(), PAGES as usize);
    }
}

#[test]
fn eviction_is_least_recently_used_first() {
    let mut c = RadixCache::new();
    let mut dups = Vec::new();
    let a = c.insert(&[1, 2, 3], &mut [10, 11, 12], &mut dups);
    let _b = c.insert(&[1, 2, 4], &mut [10, 11, 13], &mut dups);
    let _c = c.insert(&[5, 6], &mut [14, 15], &mut dups);
    assert!(dups.is_empty());
    // Touch [1,2,3] so [1,2,4] is now the oldest leaf.
    let m = c.match_prefix(&[1, 2, 3]);
    assert_eq!(m.pages, vec![10, 11, 12]);
    c.lock(a);
    let mut freed = Vec::new();
    assert_eq!(c.evict(1, &mut freed), 1);
    assert_eq!(freed, vec![13]);
    freed.clear();
    // [1,2,3] is locked (and so is its prefix): only [5,6] can go.
    assert_eq!(c.evict(100, &mut freed), 2);
    assert_eq!(freed, vec![14, 15]);
    assert_eq!(c.evictable_pages(), 0);
    c.unlock(a);
    freed.clear();
    assert_eq!(c.evict(100, &mut freed), 3);
    freed.sort();
    assert_eq!(freed, vec![10, 11, 12]);
    let s = c.stats();
    // Leaves [4], [5,6], [3] and then the split-off stem [1,2].
    assert_eq!((s.evicted_pages, s.evictions), (6, 4));
    assert!(s.busy_ns > 0);
}
