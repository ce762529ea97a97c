//! Which forward passes a GPU replays as a CUDA graph, and the fixed layout of the inputs a graph
//! reads (issue 25). Plain arithmetic, compiled on every target so the CPU's tests check it; the
//! capture and the replay are in `cuda/graph.rs`.
//!
//! A graph replays the launches of one captured pass with the same arguments: the same buffers,
//! grids and shared memory. A decode step's inputs change every step (tokens, positions, the slots
//! of the new keys, block tables), so a graph reads them from buffers of fixed size and place that
//! each step refills, and its launches are planned for a bound on the context instead of the
//! context itself: [`GraphKey`] names what a graph was planned for, and a step replays the graph
//! of its key.

use crate::ragged::RaggedBatch;

/// Contexts are rounded up to a multiple of this for a graph's key, so a batch that decodes
/// replays one graph for this many steps before the next is captured; the attention's shared
/// memory is planned for the rounded context (at most this many positions more than it needs).
pub const CONTEXT_BUCKET: usize = 256;

/// Graphs kept at once (the least recently used goes first): a batch that shrinks as sequences
/// finish moves to a new key, and each graph holds its own activations.
pub const MAX_GRAPHS: usize = 4;

/// What a decode graph was captured for: `seqs` sequences of one new token each, every one
/// wanting its logits, none attending to more than `context` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub seqs: usize,
    /// The longest context of the step, rounded up to [`CONTEXT_BUCKET`].
    pub context: usize,
    pub page_size: usize,
}

impl GraphKey {
    /// The key of a step over `meta` with `logit_rows` rows of logits, or `None` when the step is
    /// not a plain decode step (a prefill or an extend: more tokens than sequences, each its
    /// own shape), which runs without a graph.
    pub fn of(meta: &RaggedBatch, logit_rows: usize) -> Option<Self> {
        let seqs = meta.page_start.len().checked_sub(1)?;
        if seqs == 0 || meta.tokens() != seqs || logit_rows != seqs {
            return None;
        }
        // One token per sequence, in batch order (RaggedBatch::fill).
        let longest = meta.token_pos.iter().map(|&p| p as usize + 1).max()?;
        Some(Self {
            seqs,
            context: longest.div_ceil(CONTEXT_BUCKET) * CONTEXT_BUCKET,
            page_size: meta.page_size as usize,
        })
    }

    /// Block-table entries a step of this key may need: every sequence's pages for the whole
    /// bounded context.
    pub fn blocks(&self) -> usize {
        self.seqs * self.context.div_ceil(self.page_size)
    }

    /// Where `token_seq`, `token_pos`, `page_start` and `block_table` start in the graph's
    /// metadata buffer, and where the last ends (its length).
    pub fn layout(&self) -> [usize; 5] {
        let s = self.seqs;
        [0, s, 2 * s, 3 * s + 1, 3 * s + 1 + self.blocks()]
    }

    /// `meta` (a step of this key) in the fixed layout: `out` is cleared and filled to
    /// [`GraphKey::layout`]'s length, the block table's unused tail zero.
    pub fn pack(&self, meta: &RaggedBatch, out: &mut Vec<u32>) {
        debug_assert_eq!(
            GraphKey::of(meta, self.seqs),
            Some(*self),
            "a step of this key"
        );
        let at = self.layout();
        out.clear();
        out.extend_from_slice(&meta.token_seq);
        out.extend_from_slice(&meta.token_pos);
        out.extend_from_slice(&meta.page_start);
        out.extend_from_slice(&meta.block_table);
        out.resize(at[4], 0);
    }
}

/// What a decode step does with its graph ([`GraphCache::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Replay the graph at this index ([`GraphCache::get_mut`]).
    Replay(usize),
    /// Capture a graph of the step (its key came the step before too), then replay it.
    Capture,
    /// Run without a graph.
    Eager,
}

/// The decode graphs of one model, each `T` tied to its key and to the KV pool `P` it was
/// captured on (a graph holds the pool's addresses: another pool needs its own graph), and the
/// policy: a key is captured the second step in a row it comes with the same pool, so a batch
/// whose shape changes every step never pays for a capture it does not replay; past
/// [`MAX_GRAPHS`] the least recently used graph goes.
pub struct GraphCache<T, P> {
    entries: Vec<(GraphKey, P, u64, T)>,
    /// The last step's key and pool, when it had no graph.
    last: Option<(GraphKey, P)>,
    /// Steps seen, for the least recently used.
    clock: u64,
}

impl<T, P> Default for GraphCache<T, P> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            last: None,
            clock: 0,
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
            .position(|(k, p, ..)| *k == key && *p == pool)
        {
            self.entries[i].2 = self.clock;
            return Decision::Replay(i);
        }
        match self.last.replace((key, pool)) == Some((key, pool)) {
            true => Decision::Capture,
            false => Decision::Eager,
        }
    }

    pub fn get_mut(&mut self, i: usize) -> &mut T {
        &mut self.entries[i].3
    }

    /// Keeps the graph captured for `key` on `pool`; returns the one it pushed out, if any.
    pub fn insert(&mut self, key: GraphKey, pool: P, graph: T) -> Option<T> {
        let evicted = if self.entries.len() >= MAX_GRAPHS {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].2)
                .expect("full");
            Some(self.entries.swap_remove(oldest).3)
        } else {
            None
        };
        self.entries.push((key, pool, self.clock, graph));
        self.last = None;
        evicted
    }

    /// Drops every graph and the last step: the next step of any key runs eagerly.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.last = None;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a model's decode graphs have done since it was loaded ([`crate::Llama::cuda_graphs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    /// Whether decode steps may replay graphs (`$QUARRY_CUDA_GRAPHS`, a GPU).
    pub enabled: bool,
    pub captured: u64,
    pub replayed: u64,
    /// Why a capture failed (steps run without graphs since).
    pub failed: Option<String>,
}

/// Whether a GPU replays decode steps as CUDA graphs: `$QUARRY_CUDA_GRAPHS` `on` (the default)
/// or `off`.
pub fn graphs_enabled() -> Result<bool, String> {
    parse_switch(
        "QUARRY_CUDA_GRAPHS",
        std::env::var("QUARRY_CUDA_GRAPHS").ok().as_deref(),
        true,
    )
}

/// An `on`/`off` switch's value from its variable (`None`: unset), or the error naming it.
pub fn parse_switch(name: &str, value: Option<&str>, default: bool) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some("on" | "1" | "true") => Ok(true),
        Some("off" | "0" | "false") => Ok(false),
        Some(other) => Err(format!("{name} is `{other}`: expected on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::SeqInput;

    fn decode(contexts: &[usize], page_size: usize) -> RaggedBatch {
        let pages: Vec<Vec<u32>> = contexts
            .iter()
            .enumerate()
            .map(|(s, &c)| {
                (0..c.div_ceil(page_size) as u32)
                    .map(|p| 1000 * s as u32 + p)
                    .collect()
            })
            .collect();
        let tokens = [7u32];
        let batch: Vec<SeqInput> = contexts
            .iter()
            .zip(&pages)
            .map(|(&c, p)| SeqInput {
                tokens: &tokens,
                start: c - 1,
                pages: p,
                logits: 1,
            })
            .collect();
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, page_size);
        meta
    }

    /// A decode step's key bounds its context by the next multiple of the bucket; steps whose
    /// longest context rounds to the same bound share it.
    #[test]
    fn decode_steps_share_a_key_within_a_bucket() {
        let a = GraphKey::of(&decode(&[10, 300, 5], 16), 3).unwrap();
        assert_eq!((a.seqs, a.context, a.page_size), (3, 512, 16));
        let b = GraphKey::of(&decode(&[11, 301, 6], 16), 3).unwrap();
        assert_eq!(a, b);
        let c = GraphKey::of(&decode(&[11, 513, 6], 16), 3).unwrap();
        assert_eq!(c.context, 768);
        let exact = GraphKey::of(&decode(&[256], 16), 1).unwrap();
        assert_eq!(exact.context, 256);
        assert_ne!(GraphKey::of(&decode(&[10, 20], 16), 2), Some(a));
    }

    /// Prefills and extends (more tokens than sequences), steps that want more or fewer logit
    /// rows than sequences, and an empty batch run without a graph.
    #[test]
    fn only_plain_decode_steps_have_a_key() {
        let pages: Vec<u32> = (0..4).collect();
        let prompt = [1u32, 2, 3];
        let mut meta = RaggedBatch::default();
        let prefill = SeqInput {
            tokens: &prompt,
            start: 0,
            pages: &pages,
            logits: 1,
        };
        meta.fill(&[prefill], 16);
        assert_eq!(GraphKey::of(&meta, 1), None);
        let one = decode(&[40, 50], 16);
        assert!(GraphKey::of(&one, 2).is_some());
        assert_eq!(GraphKey::of(&one, 1), None);
        assert_eq!(GraphKey::of(&one, 3), None);
        meta.fill(&[], 16);
        assert_eq!(GraphKey::of(&meta, 0), None);
    }

    /// The packed buffer holds each array at the layout's offsets: read back through them, it
    /// gives the batch's arrays; the block table's capacity covers every sequence at the bound.
    #[test]
    fn the_packed_layout_reads_back_as_the_batch() {
        for contexts in [&[1usize][..], &[17, 256, 3, 100], &[255, 255]] {
            let meta = decode(contexts, 16);
            let key = GraphKey::of(&meta, contexts.len()).unwrap();
            let at = key.layout();
            let mut packed = vec![99; 3];
            key.pack(&meta, &mut packed);
            assert_eq!(packed.len(), at[4]);
            assert!(meta.block_table.len() <= at[4] - at[3]);
            let part = |i: usize| &packed[at[i]..at[i + 1]];
            assert_eq!(part(0), &meta.token_seq[..]);
            assert_eq!(part(1), &meta.token_pos[..]);
            assert_eq!(part(2), &meta.page_start[..]);
            let table = part(3);
            assert_eq!(&table[..meta.block_table.len()], &meta.block_table[..]);
            assert!(table[meta.block_table.len()..].iter().all(|&b| b == 0));
            // Every position a token may attend to under the bound has its page in the table.
            let last = *meta.page_start.last().unwrap() as usize;
            assert_eq!(last, meta.block_table.len());
        }
    }

    fn key(seqs: usize, context: usize) -> GraphKey {
        GraphKey {
            seqs,
            context,
            page_size: 16,
        }
    }

    /// A key runs without a graph the first step, is captured the second step in a row, and
    /// replays after; a step of another key or another pool in between starts over.
    #[test]
    fn a_key_is_captured_the_second_step_in_a_row_and_replayed_after() {
        let mut c: GraphCache<&str, u32> = GraphCache::default();
        let (a, b) = (key(8, 256), key(7, 256));
        assert_eq!(c.decide(a, 1), Decision::Eager);
        assert_eq!(c.decide(b, 1), Decision::Eager);
        assert_eq!(c.decide(a, 1), Decision::Eager);
        assert_eq!(c.decide(a, 2), Decision::Eager, "another pool");
        assert_eq!(c.decide(a, 2), Decision::Capture);
        assert_eq!(c.insert(a, 2, "a on 2"), None);
        assert_eq!(c.decide(a, 2), Decision::Replay(0));
        assert_eq!(*c.get_mut(0), "a on 2");
        assert_eq!(
            c.decide(a, 1),
            Decision::Eager,
            "the graph is the other pool's"
        );
        assert_eq!(c.decide(a, 1), Decision::Capture);
        c.insert(a, 1, "a on 1");
        assert_eq!(c.decide(a, 1), Decision::Replay(1));
        assert_eq!(c.decide(a, 2), Decision::Replay(0));
    }

    /// Past the limit the least recently replayed graph goes, not the oldest captured.
    #[test]
    fn the_least_recently_used_graph_goes_first() {
        let mut c: GraphCache<usize, u32> = GraphCache::default();
        for s in 1..=MAX_GRAPHS {
            c.decide(key(s, 256), 0);
            assert_eq!(c.decide(key(s, 256), 0), Decision::Capture);
            assert_eq!(c.insert(key(s, 256), 0, s), None);
        }
        // Graph 1 replayed: graph 2 is now the least recently used.
        assert!(matches!(c.decide(key(1, 256), 0), Decision::Replay(_)));
        let new = key(MAX_GRAPHS + 1, 256);
        c.decide(new, 0);
        assert_eq!(c.decide(new, 0), Decision::Capture);
        assert_eq!(c.insert(new, 0, MAX_GRAPHS + 1), Some(2));
        assert_eq!(c.len(), MAX_GRAPHS);
        assert!(matches!(c.decide(key(1, 256), 0), Decision::Replay(_)));
        assert_eq!(c.decide(key(2, 256), 0), Decision::Eager, "graph 2 is gone");
    }

    /// After a clear no graph replays, and a key is captured again only the second step in a row.
    #[test]
    fn a_cleared_cache_starts_over() {
        let mut c: GraphCache<&str, u32> = GraphCache::default();
        let a = key(8, 256);
        c.decide(a, 0);
        assert_eq!(c.decide(a, 0), Decision::Capture);
        c.insert(a, 0, "a");
        c.decide(key(7, 256), 0);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.decide(a, 0), Decision::Eager, "no graph after the clear");
        assert_eq!(c.decide(a, 0), Decision::Capture);
    }

    #[test]
    fn the_switch_reads_on_and_off_and_names_a_bad_value() {
        assert_eq!(parse_switch("X", None, true), Ok(true));
        assert_eq!(parse_switch("X", Some(" "), false), Ok(false));
        assert_eq!(parse_switch("X", Some("off"), true), Ok(false));
        assert_eq!(parse_switch("X", Some("on"), false), Ok(true));
        let err = parse_switch("QUARRY_CUDA_GRAPHS", Some("maybe"), true).unwrap_err();
        assert!(
            err.contains("QUARRY_CUDA_GRAPHS") && err.contains("maybe"),
            "{err}"
        );
    }
}
