//! One forward call's input (a ragged batch of sequences) and output (logits rows).

use std::ops::Range;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::pool::{KvPool, PageId};

/// One sequence's part of a forward batch: a prefill, an extend or a single-token decode.
///
/// The new tokens take positions `start..start + tokens.len()`; positions `0..start` must already
/// be in the pool (written by earlier calls, possibly for another sequence that shares the pages).
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
    /// Block table: page `i` holds positions `i * page_size .. (i + 1) * page_size`. It must cover
    /// every position up to `start + tokens.len()`.
    pub pages: &'a [PageId],
    /// Return logits at this many of the last new positions (for verifying drafted tokens; at
    /// least 1, and `usize::MAX` for every position).
    pub logits: usize,
}

impl<'a> SeqInput<'a> {
    /// New tokens at `start`, last-position logits only.
    pub fn new(tokens: &'a [u32], start: usize, pages: &'a [PageId]) -> Self {
        Self {
            tokens,
            start,
            pages,
            logits: 1,
        }
    }

    /// Logits at every new position.
    pub fn with_all_logits(mut self) -> Self {
        self.logits = usize::MAX;
        self
    }

    /// Logits at the last `n` new positions (all of them if there are fewer).
    pub fn with_last_logits(mut self, n: usize) -> Self {
        self.logits = n.max(1);
        self
    }

    /// Position after the last new token: the sequence's length once this call has run.
    pub fn end(&self) -> usize {
        self.start + self.tokens.len()
    }
}

/// The flattened view of a validated batch that the layers work on.
pub(crate) struct Plan {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Pool row written by each new token.
    pub slots: Vec<u32>,
    /// Rows of the flattened batch that belong to each sequence.
    pub seq_rows: Vec<Range<usize>>,
    /// Flattened rows whose logits are returned, in output order.
    pub logit_rows: Vec<u32>,
    /// Output rows per sequence (into `logit_rows`).
    pub out_rows: Vec<Range<usize>>,
}

impl Plan {
    pub(crate) fn new(batch: &[SeqInput], pool: &KvPool, config: &LlamaConfig) -> Result<Self> {
        let total: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let mut plan = Plan {
            tokens: Vec::with_capacity(total),
            positions: Vec::with_capacity(total),
            slots: Vec::with_capacity(total),
            seq_rows: Vec::with_capacity(batch.len()),
            logit_rows: Vec::with_capacity(batch.len()),
            out_rows: Vec::with_capacity(batch.len()),
        };
        let ps = pool.page_size();
        for (i, seq) in batch.iter().enumerate() {
            let err = |message: String| ModelError::Batch { seq: i, message };
            if seq.tokens.is_empty() {
                return Err(err("no new tokens".into()));
            }
            if seq.end() > config.context_length {
                return Err(err(format!(
                    "positions up to {} exceed the model's context length {}",
                    seq.end(),
                    config.context_length
                )));
            }
            let needed = seq.end().div_ceil(ps);
            if seq.pages.len() < needed {
                return Err(err(format!(
                    "{} positions need {needed} pages of {ps}, the block table has {}",
                    seq.end(),
                    seq.pages.len()
                )));
            }
            if let Some(&p) = seq.pages[..needed].iter().find(|&&p| !pool.is_allocated(p)) {
                return Err(err(format!(
                    "page {p} is not allocated in the pool of {} pages",
                    pool.num_pages()
                )));
            }
            if let Some(&t) = seq
                .tokens
                .iter()
                .find(|&&t| t as usize >= config.vocab_size)
            {
                return Err(err(format!(
                    "token id {t} is outside the vocabulary of {}",
                    config.vocab_size
                )));
            }
            let first = plan.tokens.len();
            plan.tokens.extend_from_slice(seq.tokens);
            for p in seq.start..seq.end() {
                plan.positions.push(p as u32);
                plan.slots
                    .push((seq.pages[p / ps] as usize * ps + p % ps) as u32);
            }
            let rows = first..plan.tokens.len();
            let out_first = plan.logit_rows.len();
            let n = seq.logits.clamp(1, rows.len().max(1));
            plan.logit_rows
                .extend((rows.end - n..rows.end).map(|r| r as u32));
            plan.out_rows.push(out_first..plan.logit_rows.len());
            plan.seq_rows.push(rows);
        }
        plan.check_distinct_slots(batch.len())?;
        Ok(plan)
    }

    /// Two new tokens writing one pool row would race and leave one sequence reading the other's
    /// keys: a block-table bug in the caller, reported by sequence instead of corrupting the cache.
    fn check_distinct_slots(&self, seqs: usize) -> Result<()> {
        if seqs < 2 {
            return Ok(()); // one sequence's positions are distinct, so are its slots
        }
        let mut owned: Vec<(u32, usize)> = Vec::with_capacity(self.slots.len());
        for (seq, rows) in self.seq_rows.iter().enumerate() {
            owned.extend(rows.clone().map(|r| (self.slots[r], seq)));
        }
        owned.sort_unstable();
        match owned.windows(2).find(|w| w[0].0 == w[1].0) {
            Some(w) => Err(ModelError::Batch {
                seq: w[1].1,
                message: format!(
                    "writes pool row {} that sequence {} also writes in this call (shared pages must hold only positions before both sequences' new tokens)",
                    w[1].0, w[0].1
                ),
            }),
            None => Ok(()),
        }
    }
}

/// Logits returned by a forward call, one row of `vocab` values per returned position.
/// Reused across calls so the buffer is allocated once.
#[derive(Debug, Default, Clone)]
pub struct Logits {
    pub(crate) data: Vec<f32>,
    pub(crate) vocab: usize,
    pub(crate) rows: Vec<Range<usize>>,
    /// Whether the caller samples through [`crate::Llama::sample_on_device`], so that a forward
    /// pass on a GPU may leave the logits there.
    pub(crate) device_wanted: bool,
    /// The logits left on the GPU (`[rows, vocab]`, f32) instead of `data`.
    pub(crate) device: Option<candle_core::Tensor>,
}

impl Logits {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lays out the rows a forward over `batch` returns (each sequence's last
    /// `clamp(logits, 1, tokens)` positions, in batch order) and returns them to fill, `vocab`
    /// values each. [`crate::Llama`] fills its logits itself; this is for another model behind the
    /// engine's seam (a test double).
    pub fn layout(&mut self, vocab: usize, batch: &[SeqInput]) -> &mut [f32] {
        self.vocab = vocab;
        self.rows.clear();
        let mut end = 0;
        for seq in batch {
            let n = seq.logits.clamp(1, seq.tokens.len().max(1));
            self.rows.push(end..end + n);
            end += n;
        }
        self.device = None;
        self.data.clear();
        self.data.resize(end * vocab, 0.0);
        &mut self.data
    }

    /// Lets a forward pass on a GPU keep these logits on the device (for the engine, which draws
    /// every row it needs there, the rows that verify drafts included, and brings back one token
    /// per row). Host reads of logits left on the device panic: they are a caller's bug.
    pub fn keep_on_device(&mut self, yes: bool) {
        self.device_wanted = yes;
    }

    /// Whether the last forward pass left these logits on the device.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    fn host(&self) -> &[f32] {
        assert!(
            self.device.is_none(),
            "these logits stayed on the device: sample them there"
        );
        &self.data
    }

    fn host_mut(&mut self) -> &mut [f32] {
        assert!(
            self.device.is_none(),
            "these logits stayed on the device: sample them there"
        );
        &mut self.data
    }

    /// Number of sequences in the batch that produced these logits.
    pub fn num_seqs(&self) -> usize {
        self.rows.len()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Logits after the last new token of sequence `seq`.
    pub fn last(&self, seq: usize) -> &[f32] {
        let r = self.rows[seq].end - 1;
        &self.host()[r * self.vocab..(r + 1) * self.vocab]
    }

    /// Mutable logits after the last new token of `seq`, for masking in place before sampling.
    pub fn last_mut(&mut self, seq: usize) -> &mut [f32] {
        let (r, v) = (self.rows[seq].end - 1, self.vocab);
        &mut self.host_mut()[r * v..(r + 1) * v]
    }

    /// The flat row of position `i` of sequence `seq`'s logits (0 is its first logits row),
    /// which [`Logits::row_mut`] and a device's sampling read.
    pub fn row_index(&self, seq: usize, i: usize) -> usize {
        let r = self.rows[seq].start + i;
        assert!(
            r < self.rows[seq].end,
            "position {i} was not returned for sequence {seq}"
        );
        r
    }

    /// The flat row of sequence `seq`'s last logits.
    pub fn last_row_index(&self, seq: usize) -> usize {
        self.rows[seq].end - 1
    }

    /// Flat row `r` of the logits (see [`Logits::row_index`]).
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        let v = self.vocab;
        &mut self.host_mut()[r * v..(r + 1) * v]
    }

    /// Mutable logits at returned position `i` of `seq` (0 is the first position it asked for).
    pub fn position_mut(&mut self, seq: usize, i: usize) -> &mut [f32] {
        let r = self.row_index(seq, i);
        self.row_mut(r)
    }

    /// Logits after each new token of `seq` that it asked logits for (the last, by default).
    pub fn positions(&self, seq: usize) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        let data = self.host();
        self.rows[seq]
            .clone()
            .map(move |r| &data[r * self.vocab..(r + 1) * self.vocab])
    }
}
