//! Which forward passes a GPU replays as a CUDA graph, how a step is padded to the shape its graph
//! was captured for, and the fixed layout of the inputs a graph reads. Plain arithmetic, compiled
//! on every target so the CPU's tests check it; the capture and the replay are in `cuda/graph.rs`.
//!
//! A graph replays the launches of one captured pass with the same arguments: the same buffers,
//! grids and shared memory. A step's inputs change every step (tokens, positions, the slots of
//! the new keys, block tables), so a graph reads them from buffers of fixed size and place that
//! each step refills, and its launches are planned for bounds instead of the step itself:
//! [`GraphKey`] names them.
//!
//! **Buckets.** Constrained extraction rarely repeats a step's exact shape: sequences finish at
//! different steps, and jump-forward turns decodes into extends of a few tokens and draft
//! verifications. Keyed by its exact shape, a step at batch 128 replayed a graph 18–22 times in a
//! run where plain decoding replayed 298 (H100, 2026-11-27). So a step's new tokens are padded up
//! to a bucket ([`token_bucket`]: 1, 2, 4, then steps of 8, 16 and 32 up to
//! [`MAX_GRAPH_TOKENS`]), whatever mix of decodes, extends, drafts and short prefill chunks they
//! are, and its longest context up to a multiple of [`CONTEXT_BUCKET`]. The padding is one
//! scratch sequence ([`GraphKey::pad`]): its tokens (id 0, position 0) all write the same values
//! to one scratch row of the KV pool that no sequence owns ([`crate::KvPool::scratch_page`]) and
//! attend to that row alone, so they cost their share of the matmuls and nothing else; their
//! rows are never read. A graph covers the layers; the logits (the final norm and the vocabulary
//! projection of the rows a step wants, a handful of launches) run after it at the step's own
//! size, so the number of logit rows is not part of the key and no graph holds a `[rows, vocab]`
//! buffer.

use crate::ragged::RaggedBatch;

/// Contexts are rounded up to a multiple of this for a graph's key, so a batch that decodes
/// replays one graph for this many steps before the next is captured; the attention's shared
/// memory is planned for the rounded context (at most this many positions more than it needs).
pub const CONTEXT_BUCKET: usize = 256;

/// The most new tokens a graphed step carries: a step past it (a long prefill chunk, which is
/// compute-bound: its launches are a small share of its time) runs without a graph. 1,024 and not
/// 512: a batch of 512 that decodes and extends in one step carries a few more than 512 tokens,
/// and at 512 such steps ran without a graph (mode c replayed 29.5% of its passes at batch 512,
/// H200, 2026-11-28).
pub const MAX_GRAPH_TOKENS: usize = 1024;

/// The bucket a step of `tokens` new tokens is padded up to: 1, 2, 4, then multiples of 8 up to
/// 64, of 16 up to 256, of 32 up to 512 and of 64 up to [`MAX_GRAPH_TOKENS`]: 39 buckets, and
/// fewer padding tokens than the bucket's step (8, 16, 32, 64: under an eighth of the step's
/// tokens past 256, where the matmuls start to cost more than the launches). `None` for 0 or past
/// the largest.
pub fn token_bucket(tokens: usize) -> Option<usize> {
    let step = match tokens {
        0 => return None,
        1..=4 => return Some(tokens.next_power_of_two()),
        5..=64 => 8,
        65..=256 => 16,
        257..=512 => 32,
        513..=MAX_GRAPH_TOKENS => 64,
        _ => return None,
    };
    Some(tokens.div_ceil(step) * step)
}

/// What a graph was captured for: `tokens` new tokens (a bucket, [`token_bucket`]), of any number
/// of sequences, none attending to more than `context` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub tokens: usize,
    /// The longest context of the step, rounded up to [`CONTEXT_BUCKET`].
    pub context: usize,
    pub page_size: usize,
}

impl GraphKey {
    /// The key of a step over `meta`, or `None` when it has no new token or more than
    /// [`MAX_GRAPH_TOKENS`] (it runs without a graph).
    pub fn of(meta: &RaggedBatch) -> Option<Self> {
        let tokens = token_bucket(meta.tokens())?;
        let longest = meta.token_pos.iter().map(|&p| p as usize + 1).max()?;
        Some(Self {
            tokens,
            context: longest.div_ceil(CONTEXT_BUCKET) * CONTEXT_BUCKET,
            page_size: meta.page_size as usize,
        })
    }

    /// Block-table entries a step of this key may need: every sequence's pages for the whole
    /// bounded context, with at most one sequence per token (the scratch sequence's one page
    /// fits too: it comes only with fewer real sequences than tokens).
    pub fn blocks(&self) -> usize {
        self.tokens * self.context.div_ceil(self.page_size)
    }

    /// Where `token_seq`, `token_pos`, `token_shared`, `page_start` (room for a sequence per
    /// token, and the end) and `block_table` start in the graph's metadata buffer, and where the
    /// last ends (its length).
    pub fn layout(&self) -> [usize; 6] {
        let t = self.tokens;
        [0, t, 2 * t, 3 * t, 4 * t + 1, 4 * t + 1 + self.blocks()]
    }

    /// `meta`'s step padded to this key's tokens, into `out` (its buffers reused): the real
    /// tokens first, as they are, then the scratch sequence, whose tokens all sit at position 0
    /// of `scratch_page`. Returns the number of padding tokens.
    ///
    /// # Panics
    /// If `meta` has more tokens than the key (a step of another key).
    pub fn pad(&self, meta: &RaggedBatch, scratch_page: u32, out: &mut RaggedBatch) -> usize {
        let real = meta.tokens();
        assert!(
            real <= self.tokens,
            "a step of {real} tokens under a key of {}",
            self.tokens
        );
        let pad = self.tokens - real;
        out.clone_from(meta);
        if pad > 0 {
            let seq = u32::try_from(meta.page_start.len() - 1).expect("sequences fit u32");
            out.token_seq.resize(self.tokens, seq);
            out.token_pos.resize(self.tokens, 0);
            out.token_shared.resize(self.tokens, 0);
            out.block_table.push(scratch_page);
            out.page_start
                .push(u32::try_from(out.block_table.len()).expect("pages fit u32"));
        }
        pad
    }

    /// The forward pass's ids (tokens, positions, slots: `tokens` each) of a step with `real`
    /// new tokens, padded to this key: padding is token 0 at position 0 writing `scratch_slot`.
    pub fn pad_ids(
        &self,
        tokens: &[u32],
        positions: &[u32],
        slots: &[u32],
        scratch_slot: u32,
        out: &mut Vec<u32>,
    ) {
        let t = self.tokens;
        out.clear();
        for (part, fill) in [(tokens, 0), (positions, 0), (slots, scratch_slot)] {
            assert!(
                part.len() <= t,
                "a step of {} tokens under a key of {t}",
                part.len()
            );
            out.extend_from_slice(part);
            out.resize(out.len() + t - part.len(), fill);
        }
    }

    /// A padded step of this key ([`GraphKey::pad`]) in the fixed layout: `out` is cleared and
    /// filled up to the end of the step's block table (the words a graph must read; what lies
    /// past them in the graph's buffer is never read), `page_start`'s unused entries equal to its
    /// last. Returns the number of words written.
    pub fn pack(&self, padded: &RaggedBatch, out: &mut Vec<u32>) -> usize {
        let at = self.layout();
        assert_eq!(padded.tokens(), self.tokens, "a padded step of this key");
        assert!(
            padded.page_start.len() <= at[4] - at[3] && padded.block_table.len() <= at[5] - at[4],
            "a step of this key"
        );
        out.clear();
        out.extend_from_slice(&padded.token_seq);
        out.extend_from_slice(&padded.token_pos);
        out.extend_from_slice(&padded.token_shared);
        out.extend_from_slice(&padded.page_start);
        let end = *padded
            .page_start
            .last()
            .expect("a batch has its end offset");
        out.resize(at[4], end);
        out.extend_from_slice(&padded.block_table);
        out.len()
    }
}

/// What a step does with its graph ([`GraphCache::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Replay the graph at this index ([`GraphCache::get_mut`]).
    Replay(usize),
    /// Capture a graph of the step (its key's first step on this pool), then replay it.
    Capture,
}

/// How many graphs a model keeps, and how much device memory they may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Default 256: the 39 token buckets over four or five context buckets, as a batch's size
    /// and mix of decodes and extends wander through them. At 64, mode c at batch 128-512
    /// captured 66-75 graphs a run and evicted 23-56 of them (H200, 2026-11-28); a SmolLM2 graph
    /// holds about 1 MiB.
    pub max_graphs: usize,
    /// Default 4 GiB. Each graph holds its pass's activations (measured at capture: the device's
    /// free memory before the capture and after the first launch, [`GraphStats::bytes`]).
    pub max_bytes: u64,
}

impl Default for GraphLimits {
    fn default() -> Self {
        Self {
            max_graphs: 256,
            max_bytes: 4 << 30,
        }
    }
}

/// The graphs of one model, each `T` tied to its key and to the KV pool `P` it was captured on (a
/// graph holds the pool's addresses: another pool needs its own graph), and the policy: a key is
/// captured the first time a step of it comes on a pool, and replayed after; past
/// [`GraphLimits`] the least recently replayed graphs go. (Capturing only the second time a key
/// came, so that a shape seen once never paid for a capture, ran every key's first step without
/// a graph: in mode c at batch 128, 66 of about 160 passes a run. A capture costs about the pass
/// it records, and the buckets bound the keys.)
pub struct GraphCache<T, P> {
    limits: GraphLimits,
    entries: Vec<Entry<T, P>>,
    /// Steps seen, for the least recently used.
    clock: u64,
    bytes: u64,
}

struct Entry<T, P> {
    key: GraphKey,
    pool: P,
    used: u64,
    bytes: u64,
    graph: T,
}

impl<T, P> Default for GraphCache<T, P> {
    fn default() -> Self {
        Self::new(GraphLimits::default())
    }
}

impl<T, P> GraphCache<T, P> {
    pub fn new(limits: GraphLimits) -> Self {
        Self {
            limits,
            entries: Vec::new(),
            clock: 0,
            bytes: 0,
        }
    }
}

impl<T, P: Copy + Eq> GraphCache<T, P> {
    /// What the step of `key` on `pool` does.
    pub fn decide(&mut self, key: GraphKey, pool: P) -> Decision {
        self.clock += 1;
        if let Some(i) = self
            .entries
            .iter()
            .position(|e| e.key == key && e.pool == pool)
        {
            self.entries[i].used = self.clock;
            return Decision::Replay(i);
        }
        Decision::Capture
    }

    pub fn get_mut(&mut self, i: usize) -> &mut T {
        &mut self.entries[i].graph
    }

    /// Keeps the graph captured for `key` on `pool`, which holds `bytes` of device memory; returns
    /// the graphs it pushed out (least recently used first) to keep within the limits. The new
    /// graph is kept even alone past the memory limit (its step would run without it otherwise;
    /// the limit bounds what accumulates).
    pub fn insert(&mut self, key: GraphKey, pool: P, graph: T, bytes: u64) -> Vec<T> {
        let mut evicted = Vec::new();
        while !self.entries.is_empty()
            && (self.entries.len() >= self.limits.max_graphs
                || self.bytes + bytes > self.limits.max_bytes)
        {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].used)
                .expect("not empty");
            let e = self.entries.swap_remove(oldest);
            self.bytes -= e.bytes;
            evicted.push(e.graph);
        }
        self.bytes += bytes;
        self.entries.push(Entry {
            key,
            pool,
            used: self.clock,
            bytes,
            graph,
        });
        evicted
    }

    /// Drops the graphs captured on `pool` (which is going: they could never replay), so that
    /// they stop holding device memory; returns how many went.
    pub fn forget_pool(&mut self, pool: P) -> usize {
        let before = self.entries.len();
        let mut bytes = self.bytes;
        self.entries.retain(|e| {
            let keep = e.pool != pool;
            if !keep {
                bytes -= e.bytes;
            }
            keep
        });
        self.bytes = bytes;
        before - self.entries.len()
    }

    /// Drops every graph: the next step of any key is captured again.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Device memory the kept graphs hold, as measured at their captures.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// What a model's CUDA graphs have done since it was loaded ([`crate::Llama::cuda_graphs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    /// Whether steps may replay graphs (`$QUARRY_CUDA_GRAPHS`, a GPU).
    pub enabled: bool,
    pub captured: u64,
    pub replayed: u64,
    /// Passes on a GPU that ran without a graph: a key's first step, a step past
    /// [`MAX_GRAPH_TOKENS`], profiled or gather-attention passes, or every pass once a capture
    /// failed. `replayed / (replayed + captured + eager)` is the share of steps a graph ran.
    pub eager: u64,
    /// Graphs pushed out by [`GraphLimits`].
    pub evicted: u64,
    /// Graphs kept now, and the device memory they hold (measured at each capture).
    pub graphs: u64,
    pub bytes: u64,
    /// Padding tokens the graphed steps computed, against their real tokens.
    pub padded_tokens: u64,
    pub real_tokens: u64,
    /// Why a capture failed (steps run without graphs since).
    pub failed: Option<String>,
}

impl GraphStats {
    /// The counts since `before` (the kept graphs and their memory as now).
    pub fn since(&self, before: &GraphStats) -> GraphStats {
        GraphStats {
            captured: self.captured - before.captured,
            replayed: self.replayed - before.replayed,
            eager: self.eager - before.eager,
            evicted: self.evicted - before.evicted,
            padded_tokens: self.padded_tokens - before.padded_tokens,
            real_tokens: self.real_tokens - before.real_tokens,
            ..self.clone()
        }
    }

    /// The share of passes that replayed a graph (0 with none).
    pub fn replay_share(&self) -> f64 {
        let passes = self.replayed + self.captured + self.eager;
        if passes == 0 {
            0.0
        } else {
            self.replayed as f64 / passes as f64
        }
    }
}

/// A step padded to its graph's key ([`GraphKey::pad`]): the padded batch, the
/// padded ids (tokens, positions, slots: `key.tokens` each) and how many are padding.
pub(crate) struct PaddedStep {
    pub key: GraphKey,
    pub meta: crate::ragged::RaggedBatch,
    pub ids: Vec<u32>,
    pub pad: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::SeqInput;

    /// A step of sequences with `(context, new tokens)` each (their new tokens at the end of
    /// their context), pages of `page_size`, sequence `s`'s pages numbered `1000 s + p`.
    fn step(seqs: &[(usize, usize)], page_size: usize) -> RaggedBatch {
        let pages: Vec<Vec<u32>> = seqs
            .iter()
            .enumerate()
            .map(|(s, &(c, _))| {
                (0..c.div_ceil(page_size) as u32)
                    .map(|p| 1000 * s as u32 + p)
                    .collect()
            })
            .collect();
        let tokens = [7u32; 64];
        let batch: Vec<SeqInput> = seqs
            .iter()
            .zip(&pages)
            .map(|(&(c, n), p)| SeqInput {
                tokens: &tokens[..n],
                start: c - n,
                pages: p,
                logits: 1,
            })
            .collect();
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, page_size);
        meta
    }

    fn decode(contexts: &[usize], page_size: usize) -> RaggedBatch {
        let seqs: Vec<_> = contexts.iter().map(|&c| (c, 1)).collect();
        step(&seqs, page_size)
    }

    /// Every step size up to the largest has a bucket at or above it, with the stated padding at
    /// most; a bucket is its own bucket; there are 39.
    #[test]
    fn token_buckets_bound_the_padding() {
        let mut buckets = std::collections::BTreeSet::new();
        for n in 1..=MAX_GRAPH_TOKENS {
            let b = token_bucket(n).unwrap();
            assert!(b >= n && b <= MAX_GRAPH_TOKENS, "{n} → {b}");
            assert_eq!(token_bucket(b), Some(b), "{b} is a bucket");
            let step = match n {
                1..=4 => 2,
                5..=64 => 8,
                65..=256 => 16,
                257..=512 => 32,
                _ => 64,
            };
            assert!(b - n < step, "{n} → {b}");
            assert!(n <= 256 || (b - n) * 8 < n, "{n} → {b}");
            buckets.insert(b);
        }
        assert_eq!(buckets.len(), 39);
        assert_eq!(
            buckets.iter().take(6).copied().collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 24]
        );
        assert_eq!(token_bucket(0), None);
        assert_eq!(token_bucket(MAX_GRAPH_TOKENS + 1), None);
    }

    /// Decodes, extends, drafts and short prefill chunks alike have a key: their tokens' bucket
    /// and their longest context rounded up to the context bucket.
    #[test]
    fn steps_of_any_mix_share_a_key_within_their_buckets() {
        let a = GraphKey::of(&decode(&[10, 300, 5], 16)).unwrap();
        assert_eq!((a.tokens, a.context, a.page_size), (4, 512, 16));
        // Three sequences, five tokens: one decodes, one extends by 3, one verifies a draft.
        let b = GraphKey::of(&step(&[(11, 1), (301, 3), (6, 1)], 16)).unwrap();
        assert_eq!((b.tokens, b.context), (8, 512));
        let c = GraphKey::of(&step(&[(40, 1), (20, 7)], 16)).unwrap();
        assert_eq!(b, GraphKey { context: 512, ..c });
        assert_eq!(GraphKey::of(&decode(&[256], 16)).unwrap().context, 256);
        assert_eq!(GraphKey::of(&decode(&[257], 16)).unwrap().context, 512);
        // A prefill chunk past the largest bucket, and an empty step, run without a graph.
        let long: Vec<_> = (0..17).map(|_| (64, 64)).collect();
        assert_eq!(GraphKey::of(&step(&long, 16)), None);
        assert_eq!(GraphKey::of(&step(&[], 16)), None);
    }

    /// The padded step keeps every real token's sequence, position and pages as they were; the
    /// padding is one more sequence whose every token sits at position 0 of the scratch page.
    #[test]
    fn padding_adds_one_scratch_sequence_after_the_real_ones() {
        let meta = step(&[(40, 1), (300, 4), (17, 2)], 16);
        let key = GraphKey::of(&meta).unwrap();
        assert_eq!(key.tokens, 8);
        let mut padded = RaggedBatch {
            token_seq: vec![9; 40],
            ..Default::default()
        };
        assert_eq!(key.pad(&meta, 77, &mut padded), 1);
        assert_eq!(padded.tokens(), 8);
        assert_eq!(&padded.token_seq[..7], &meta.token_seq[..]);
        assert_eq!(&padded.token_pos[..7], &meta.token_pos[..]);
        assert_eq!(padded.token_seq[7], 3);
        assert_eq!(padded.token_pos[7], 0);
        for i in 0..meta.tokens() {
            let (s, p) = (meta.token_seq[i] as usize, meta.token_pos[i] as usize);
            assert_eq!(padded.row(s, p), meta.row(s, p));
        }
        assert_eq!(padded.row(3, 0), 77 * 16);
        // A step that fills its bucket is left as it is.
        let full = step(&[(40, 1), (300, 3)], 16);
        let key = GraphKey::of(&full).unwrap();
        assert_eq!(key.pad(&full, 77, &mut padded), 0);
        assert_eq!(padded, full);
        // The ids: tokens 0, positions 0, every padding token writing the scratch slot.
        let mut ids = vec![5; 3];
        GraphKey { tokens: 4, ..key }.pad_ids(&[3, 4], &[10, 11], &[20, 21], 99, &mut ids);
        assert_eq!(ids, [3, 4, 0, 0, 10, 11, 0, 0, 20, 21, 99, 99]);
    }

    /// The packed buffer holds each array of the padded step at the layout's offsets, even for
    /// the widest step a key admits (a sequence per token, each at the bounded context); the
    /// unused `page_start` entries repeat its end.
    #[test]
    fn the_packed_layout_reads_back_as_the_padded_step() {
        let widest: Vec<_> = (0..7).map(|_| (512, 1)).collect();
        for seqs in [
            &[(1usize, 1usize)][..],
            &[(17, 1), (256, 3), (3, 1), (100, 2)],
            &widest,
        ] {
            let meta = step(seqs, 16);
            let key = GraphKey::of(&meta).unwrap();
            let mut padded = RaggedBatch::default();
            key.pad(&meta, 5, &mut padded);
            let at = key.layout();
            let mut packed = vec![99; 3];
            let used = key.pack(&padded, &mut packed);
            assert_eq!(used, packed.len());
            assert!(used <= at[5]);
            let part = |i: usize| &packed[at[i]..at[i + 1].min(used)];
            assert_eq!(part(0), &padded.token_seq[..]);
            assert_eq!(part(1), &padded.token_pos[..]);
            assert_eq!(part(2), &padded.token_shared[..]);
            let starts = part(3);
            assert_eq!(&starts[..padded.page_start.len()], &padded.page_start[..]);
            let end = *padded.page_start.last().unwrap();
            assert!(starts[padded.page_start.len()..].iter().all(|&s| s == end));
            assert_eq!(part(4), &padded.block_table[..]);
        }
    }

    fn key(tokens: usize, context: usize) -> GraphKey {
        GraphKey {
            tokens,
            context,
            page_size: 16,
        }
    }

    /// A key is captured the first time it comes on a pool and replays after; each pool has its
    /// own.
    #[test]
    fn a_key_is_captured_the_first_time_it_comes_and_replayed_after() {
        let mut c: GraphCache<&str, u32> = GraphCache::default();
        let (a, b) = (key(8, 256), key(16, 256));
        assert_eq!(c.decide(a, 1), Decision::Capture);
        assert!(c.insert(a, 1, "a on 1", 10).is_empty());
        assert_eq!(c.decide(b, 1), Decision::Capture);
        assert!(c.insert(b, 1, "b on 1", 10).is_empty());
        assert_eq!(c.decide(a, 1), Decision::Replay(0));
        assert_eq!(*c.get_mut(0), "a on 1");
        assert_eq!(c.decide(b, 1), Decision::Replay(1));
        assert_eq!(c.decide(a, 2), Decision::Capture, "another pool");
        assert!(c.insert(a, 2, "a on 2", 10).is_empty());
        assert_eq!(c.decide(a, 2), Decision::Replay(2));
        assert_eq!(c.decide(a, 1), Decision::Replay(0));
        assert_eq!((c.len(), c.bytes()), (3, 30));
    }

    fn filled(limits: GraphLimits, n: usize, bytes: u64) -> GraphCache<usize, u32> {
        let mut c = GraphCache::new(limits);
        for s in 1..=n {
            assert_eq!(c.decide(key(s, 256), 0), Decision::Capture);
            assert!(c.insert(key(s, 256), 0, s, bytes).is_empty());
        }
        c
    }

    /// Past the count limit the least recently replayed graph goes, not the oldest captured.
    #[test]
    fn the_least_recently_used_graph_goes_first() {
        let limits = GraphLimits {
            max_graphs: 4,
            max_bytes: u64::MAX,
        };
        let mut c = filled(limits, 4, 1);
        // Graph 1 replayed: graph 2 is now the least recently used.
        assert!(matches!(c.decide(key(1, 256), 0), Decision::Replay(_)));
        let new = key(5, 256);
        assert_eq!(c.decide(new, 0), Decision::Capture);
        assert_eq!(c.insert(new, 0, 5, 1), [2]);
        assert_eq!(c.len(), 4);
        assert!(matches!(c.decide(key(1, 256), 0), Decision::Replay(_)));
        assert_eq!(
            c.decide(key(2, 256), 0),
            Decision::Capture,
            "graph 2 is gone"
        );
    }

    /// The memory limit pushes out as many graphs as a new one needs room for, and keeps the new
    /// one even when it alone is past the limit.
    #[test]
    fn the_memory_limit_bounds_what_the_graphs_hold() {
        let limits = GraphLimits {
            max_graphs: 64,
            max_bytes: 100,
        };
        let mut c = filled(limits, 3, 30);
        assert_eq!(c.bytes(), 90);
        let new = key(9, 256);
        assert_eq!(c.decide(new, 0), Decision::Capture);
        assert_eq!(c.insert(new, 0, 9, 50), [1, 2]);
        assert_eq!((c.len(), c.bytes()), (2, 80));
        let huge = key(10, 256);
        assert_eq!(c.decide(huge, 0), Decision::Capture);
        assert_eq!(c.insert(huge, 0, 10, 500).len(), 2);
        assert_eq!((c.len(), c.bytes()), (1, 500));
    }

    /// Forgetting a pool drops its graphs and the memory they held, and no other pool's.
    #[test]
    fn a_forgotten_pool_takes_its_graphs_with_it() {
        let mut c: GraphCache<&str, u32> = GraphCache::default();
        let (a, b) = (key(8, 256), key(16, 512));
        for (k, pool, g, bytes) in [
            (a, 1, "a on 1", 10),
            (b, 1, "b on 1", 20),
            (a, 2, "a on 2", 40),
        ] {
            assert_eq!(c.decide(k, pool), Decision::Capture);
            c.insert(k, pool, g, bytes);
        }
        assert_eq!(c.forget_pool(1), 2);
        assert_eq!((c.len(), c.bytes()), (1, 40));
        assert_eq!(c.decide(a, 1), Decision::Capture, "pool 1's graph is gone");
        assert!(matches!(c.decide(a, 2), Decision::Replay(i) if *c.get_mut(i) == "a on 2"));
        assert_eq!(c.forget_pool(3), 0);
        assert_eq!((c.len(), c.bytes()), (1, 40));
    }

    /// After a clear no graph replays: each key is captured again.
    #[test]
    fn a_cleared_cache_starts_over() {
        let mut c: GraphCache<&str, u32> = GraphCache::default();
        let a = key(8, 256);
        assert_eq!(c.decide(a, 0), Decision::Capture);
        c.insert(a, 0, "a", 1);
        assert_eq!(c.decide(a, 0), Decision::Replay(0));
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        assert_eq!(
            c.decide(a, 0),
            Decision::Capture,
            "no graph after the clear"
        );
    }

    /// The replay share counts every pass; `since` subtracts the counts, not the kept graphs.
    #[test]
    fn graph_stats_count_passes() {
        let before = GraphStats {
            captured: 1,
            replayed: 2,
            eager: 3,
            graphs: 1,
            ..Default::default()
        };
        let now = GraphStats {
            captured: 2,
            replayed: 20,
            eager: 5,
            graphs: 2,
            bytes: 7,
            ..Default::default()
        };
        let d = now.since(&before);
        assert_eq!(
            (d.captured, d.replayed, d.eager, d.graphs, d.bytes),
            (1, 18, 2, 2, 7)
        );
        assert!((d.replay_share() - 18.0 / 21.0).abs() < 1e-12);
        assert_eq!(GraphStats::default().replay_share(), 0.0);
    }
}
