//! The ragged batch as a whole-batch paged attention kernel reads it: flat `u32` arrays,
//! one upload each per step, and the plain-Rust arithmetic such a kernel must reproduce.
//!
//! One launch covers every new token of every sequence, decode rows and prefill rows alike: the
//! thread block of (token, key-value head) finds its sequence, its position and, through the
//! sequence's slice of the concatenated block tables, the pool row of every position it attends
//! to. [`RaggedBatch::fill`] builds those arrays from the engine's [`SeqInput`]s into buffers it
//! keeps, so a step allocates nothing once the buffers have grown; [`attend_reference`] is the
//! kernel's arithmetic, checked here against the host kernel ([`crate::attention`]) and, on a
//! GPU, the reference the CUDA kernel is compared with. [`Heads`], the attention's shape, lives
//! here too; the candle op that launches the kernel is `paged.rs`, its launch plan
//! `kernel_plan.rs`. This module imports nothing above it.

use crate::batch::SeqInput;

/// The attention's heads and pages, as the host kernel, the reference and the launch plan see them.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Multiplier of the query-key dot products.
    pub scale: f32,
    /// Sliding window: a query at position `p` sees positions `p + 1 - window ..= p` only.
    pub window: Option<usize>,
}

impl Heads {
    pub(crate) fn group(&self) -> usize {
        self.n_head / self.n_kv
    }
    pub(crate) fn kv_dim(&self) -> usize {
        self.n_kv * self.head_dim
    }
    /// The first position a query at `pos` attends to.
    pub(crate) fn first_seen(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// The batch's metadata, as the kernel reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RaggedBatch {
    /// Per new token (in batch order): its sequence.
    pub token_seq: Vec<u32>,
    /// Per new token: its position in its sequence.
    pub token_pos: Vec<u32>,
    /// Per new token: the positions at the start of its context that are the batch's shared
    /// prefix (the cascade's, [`RaggedBatch::fill`]), or 0 where its sequence does not hold it.
    pub token_shared: Vec<u32>,
    /// Per sequence, where its pages begin in `block_table`; one more entry than sequences, the
    /// last being `block_table.len()` (the offsets of a compressed sparse row).
    pub page_start: Vec<u32>,
    /// Every sequence's block table, concatenated: the pages it needs for positions
    /// `0..start + tokens.len()`, no more.
    pub block_table: Vec<u32>,
    pub page_size: u32,
}

impl RaggedBatch {
    /// Refills the arrays for `batch` (capacity is kept between steps).
    ///
    /// # Panics
    /// If a sequence's block table does not cover its last new position, or a count does not fit
    /// `u32` (the engine's own checks come first: [`crate::batch::Plan`] refuses both).
    pub fn fill(&mut self, batch: &[SeqInput], page_size: usize) {
        assert!(page_size > 0, "a page holds at least one position");
        self.token_seq.clear();
        self.token_pos.clear();
        self.token_shared.clear();
        self.page_start.clear();
        self.block_table.clear();
        self.page_size = u32::try_from(page_size).expect("page size fits u32");
        for (s, seq) in batch.iter().enumerate() {
            let end = seq.start + seq.tokens.len();
            let pages = end.div_ceil(page_size);
            assert!(
                seq.pages.len() >= pages,
                "sequence {s}: {} pages do not cover position {}",
                seq.pages.len(),
                end.saturating_sub(1)
            );
            self.page_start.push(to_u32(self.block_table.len()));
            self.block_table.extend_from_slice(&seq.pages[..pages]);
            for p in seq.start..end {
                self.token_seq.push(to_u32(s));
                self.token_pos.push(to_u32(p));
            }
        }
        self.page_start.push(to_u32(self.block_table.len()));
        self.token_shared.resize(self.token_seq.len(), 0);
        self.mark_shared_prefix(batch, page_size);
    }

    /// Finds the batch's shared prefix and marks its sequences' tokens in `token_shared`: the
    /// first pages of their block tables that several sequences hold in common (the same pages:
    /// the radix cache's, an extraction job's instructions), at least two sequences and one page,
    /// chosen to save the most reads: (sequences - 1) × pages, the reads of the prefix that the
    /// sequences beyond the first no longer make (ties to the longer prefix). A sequence can
    /// share only whole pages before its first new token, so every marked token attends past
    /// the prefix. The tables compared are against the one of the most common first page (a
    /// majority vote: no allocation but the list of lengths).
    fn mark_shared_prefix<'a>(&mut self, batch: &[SeqInput<'a>], page_size: usize) {
        let whole = |s: &SeqInput<'a>| -> &'a [u32] {
            &s.pages[..(s.start / page_size).min(s.pages.len())]
        };
        let (mut anchor, mut votes) = (None::<&[u32]>, 0usize);
        for pages in batch.iter().map(whole).filter(|p| !p.is_empty()) {
            match anchor {
                Some(a) if a[0] == pages[0] => votes += 1,
                _ if votes == 0 => (anchor, votes) = (Some(pages), 1),
                _ => votes -= 1,
            }
        }
        let Some(anchor) = anchor else { return };
        let common = |s: &SeqInput<'a>| {
            let pages = whole(s);
            anchor.iter().zip(pages).take_while(|(a, b)| a == b).count()
        };
        let mut lens: Vec<usize> = batch.iter().map(common).filter(|&n| n > 0).collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        // The k longest share lens[k - 1] pages.
        let Some((k, pages)) = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| (i + 1, n))
            .max_by_key(|&(k, n)| ((k - 1) * n, n))
        else {
            return;
        };
        if k < 2 {
            return;
        }
        let shared = to_u32(pages * page_size);
        let mut t = 0;
        for seq in batch {
            let n = seq.tokens.len();
            if common(seq) >= pages {
                self.token_shared[t..t + n].fill(shared);
            }
            t += n;
        }
    }

    /// The positions the batch's shared prefix covers (0: none; [`RaggedBatch::fill`]).
    pub fn shared_prefix(&self) -> usize {
        self.token_shared.iter().copied().max().unwrap_or(0) as usize
    }

    /// New tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.token_seq.len()
    }

    /// The pool row that holds position `pos` of sequence `seq`.
    pub fn row(&self, seq: usize, pos: usize) -> usize {
        let ps = self.page_size as usize;
        let page = self.block_table[self.page_start[seq] as usize + pos / ps] as usize;
        page * ps + pos % ps
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).expect("batch sizes fit u32")
}

/// The paged attention kernel's arithmetic, one (token, query head) at a time: scores
/// `q·k · scale` over the positions the token sees (causal, and within Gemma's sliding window),
/// a softmax that subtracts the row's maximum, then the weighted sum of the values. Query head
/// `h` reads key-value head `h / (n_head / n_kv)` (grouped-query attention).
///
/// `q` is `[tokens, n_head · head_dim]`, `k` and `v` are the layer's pool (`[rows, n_kv ·
/// head_dim]`), `out` is `[tokens, n_head · head_dim]`. The tests compare it with the host kernel
/// here and with the CUDA kernel on a GPU; [`PagedAttention`] runs it on the CPU.
pub fn attend_reference(
    meta: &RaggedBatch,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: Heads,
    out: &mut [f32],
) {
    let mut scores = Vec::new();
    for_each_row(meta, q, h, out, |seq, first, pos, kv, qh, o| {
        scores.clear();
        scores.extend((first..=pos).map(|p| score(qh, k, meta.row(seq, p), kv, h)));
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        o.fill(0.0);
        for (i, p) in (first..=pos).enumerate() {
            let w = scores[i] / sum;
            let vr = kv_row(v, meta.row(seq, p), kv, h);
            for (x, y) in o.iter_mut().zip(vr) {
                *x += w * y;
            }
        }
    });
}

/// The split-K (flash-decoding) kernel's arithmetic: each token's attended positions in chunks of
/// `chunk`; per chunk z and query head, the scores' maximum `m_z`, `l_z = Σ exp(s - m_z)` and the
/// unnormalized `acc_z = Σ exp(s - m_z)·v`; then, with `M = max m_z`, `out = Σ exp(m_z - M)·acc_z
/// / Σ exp(m_z - M)·l_z`, chunks in order. Equal to [`attend_reference`] up to rounding (the
/// test below), with which the CUDA kernel's GPU test compares its split form (a test kit's).
#[cfg(any(test, feature = "test-support"))]
pub fn attend_split_reference(
    meta: &RaggedBatch,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: Heads,
    chunk: usize,
    out: &mut [f32],
) {
    assert!(chunk > 0, "a chunk holds at least one position");
    // Per chunk: its maximum, its sum, its unnormalized weighted values.
    let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::new();
    for_each_row(meta, q, h, out, |seq, first, pos, kv, qh, o| {
        parts.clear();
        for start in (first..=pos).step_by(chunk) {
            let span = start..=(start + chunk - 1).min(pos);
            let scores: Vec<f32> = span
                .clone()
                .map(|p| score(qh, k, meta.row(seq, p), kv, h))
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut sum, mut acc) = (0.0, vec![0f32; h.head_dim]);
            for (s, p) in scores.iter().zip(span) {
                let e = (s - max).exp();
                sum += e;
                for (x, y) in acc.iter_mut().zip(kv_row(v, meta.row(seq, p), kv, h)) {
                    *x += e * y;
                }
            }
            parts.push((max, sum, acc));
        }
        let max = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = parts.iter().map(|(m, l, _)| (m - max).exp() * l).sum();
        o.fill(0.0);
        for (m, _, acc) in &parts {
            let w = (m - max).exp();
            for (x, y) in o.iter_mut().zip(acc) {
                *x += w * y;
            }
        }
        for x in o.iter_mut() {
            *x /= sum;
        }
    });
}

/// Calls `f(seq, first, pos, kv, q_head, out_head)` for every (new token, query head) of the
/// batch: the token's sequence, the first and last positions it attends to (causal, and within
/// the window), the offset of its key-value head in a pool row, its query and its output.
fn for_each_row(
    meta: &RaggedBatch,
    q: &[f32],
    h: Heads,
    out: &mut [f32],
    mut f: impl FnMut(usize, usize, usize, usize, &[f32], &mut [f32]),
) {
    let d = h.head_dim;
    let (stride, group) = (h.n_head * d, h.n_head / h.n_kv);
    assert_eq!(q.len(), meta.tokens() * stride);
    assert_eq!(out.len(), meta.tokens() * stride);
    for t in 0..meta.tokens() {
        let (seq, pos) = (meta.token_seq[t] as usize, meta.token_pos[t] as usize);
        let first = h.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for head in 0..h.n_head {
            let at = t * stride + head * d;
            f(
                seq,
                first,
                pos,
                (head / group) * d,
                &q[at..at + d],
                &mut out[at..at + d],
            );
        }
    }
}

/// Key-value head `kv` (its offset) of pool row `row`.
fn kv_row(pool: &[f32], row: usize, kv: usize, h: Heads) -> &[f32] {
    &pool[row * h.n_kv * h.head_dim + kv..][..h.head_dim]
}

/// `q·k · scale` for the key at pool row `row`.
fn score(qh: &[f32], k: &[f32], row: usize, kv: usize, h: Heads) -> f32 {
    let dot: f32 = qh
        .iter()
        .zip(kv_row(k, row, kv, h))
        .map(|(a, b)| a * b)
        .sum();
    dot * h.scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attend_host;
    use crate::batch::Plan;
    #[cfg(feature = "cuda")]
    use crate::kernel_plan::AttentionKernel;
    use crate::paged::PagedAttention;
    use crate::simd::testing::{relative_error, values};

    /// Three sequences in one batch, as a step mixes them: a 7-token prefill, a decode at
    /// position 9 and a 3-token extension from position 4, with scattered pages.
    struct Mixed {
        tokens: [Vec<u32>; 3],
        pages: [Vec<u32>; 3],
        starts: [usize; 3],
    }

    impl Mixed {
        fn new() -> Self {
            Self {
                tokens: [vec![1; 7], vec![2; 1], vec![3; 3]],
                pages: [vec![5, 1], vec![0, 7, 3], vec![6, 2]],
                starts: [0, 9, 4],
            }
        }

        fn batch(&self) -> Vec<SeqInput<'_>> {
            (0..3)
                .map(|i| SeqInput::new(&self.tokens[i], self.starts[i], &self.pages[i]))
                .collect()
        }

        /// What the host and tensor kernels read of a plan: the rows of each sequence and their
        /// positions.
        fn plan(&self) -> Plan {
            let mut seq_rows = Vec::new();
            let mut row = 0;
            for t in &self.tokens {
                seq_rows.push(row..row + t.len());
                row += t.len();
            }
            Plan {
                tokens: self.tokens.concat(),
                positions: self.meta().token_pos,
                slots: Vec::new(),
                seq_rows,
                logit_rows: Vec::new(),
                out_rows: Vec::new(),
            }
        }

        /// Grouped-query heads (4 query heads on 2 KV heads of 64) on its 4-position pages.
        fn heads(window: Option<usize>) -> Heads {
            Heads {
                n_head: 4,
                n_kv: 2,
                head_dim: 64,
                page_size: 4,
                scale: 0.125,
                window,
            }
        }

        /// The batch's metadata with 4-position pages.
        fn meta(&self) -> RaggedBatch {
            let mut meta = RaggedBatch::default();
            meta.fill(&self.batch(), 4);
            meta
        }
    }

    #[test]
    fn fill_lays_out_tokens_and_block_tables_and_keeps_its_buffers() {
        let mixed = Mixed::new();
        let mut meta = mixed.meta();
        assert_eq!(meta.token_seq, [0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2]);
        assert_eq!(meta.token_pos, [0, 1, 2, 3, 4, 5, 6, 9, 4, 5, 6]);
        // Only the pages that hold positions up to the last new one.
        assert_eq!(meta.page_start, [0, 2, 5, 7]);
        assert_eq!(meta.block_table, [5, 1, 0, 7, 3, 6, 2]);
        assert_eq!(meta.row(1, 9), 3 * 4 + 1);
        assert_eq!(meta.row(2, 4), 2 * 4);
        let cap = meta.block_table.capacity();
        meta.fill(&mixed.batch()[1..], 4);
        assert_eq!(meta.page_start, [0, 3, 5]);
        assert_eq!(meta.block_table.capacity(), cap, "the buffer is reused");
    }

    /// The shared prefix: the pages the most sequences begin with, chosen for the reads it saves
    /// ((sequences - 1) × pages), only whole pages before each sequence's first new token; a
    /// sequence that shares fewer pages attends to all of its own.
    #[test]
    fn fill_marks_the_prefix_that_saves_the_most_reads() {
        let tokens = [1u32; 5];
        // Pages of 4. a, b and c begin with pages 10, 11, 12; d with 10, 11 only; e with others.
        let a = [10, 11, 12, 13, 14];
        let b = [10, 11, 12, 20, 21];
        let c = [10, 11, 12, 30];
        let d = [10, 11, 40, 41];
        let e = [50, 51, 52];
        let batch = [
            SeqInput::new(&tokens[..1], 19, &a),
            SeqInput::new(&tokens[..3], 17, &b),
            SeqInput::new(&tokens[..1], 14, &c),
            SeqInput::new(&tokens[..2], 14, &d),
            SeqInput::new(&tokens[..1], 10, &e),
        ];
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, 4);
        // Three sequences over 3 pages save 6 pages' reads; four over 2 save 6: the longer.
        assert_eq!(meta.token_shared, [12, 12, 12, 12, 12, 0, 0, 0]);
        assert_eq!(meta.shared_prefix(), 12);
        // c's first new token at 11: only 2 whole pages before it, so a, b, c, d share 2 pages
        // (6 pages' reads) where a and b share 3 (3): the four take the prefix of 8.
        let batch2 = [
            batch[0],
            batch[1],
            SeqInput::new(&tokens[..1], 11, &c),
            batch[3],
        ];
        meta.fill(&batch2, 4);
        assert_eq!(meta.token_shared, [8; 7]);
        // A single sequence shares nothing, nor do sequences without a whole page before their
        // new tokens (prefills).
        meta.fill(&batch[..1], 4);
        assert_eq!(meta.token_shared, [0]);
        let prefills = [
            SeqInput::new(&tokens, 0, &a),
            SeqInput::new(&tokens[..3], 0, &b),
        ];
        meta.fill(&prefills, 4);
        assert_eq!(meta.shared_prefix(), 0);
        assert_eq!(meta.token_shared.len(), meta.tokens());
    }

    #[test]
    #[should_panic(expected = "do not cover position")]
    fn a_block_table_short_of_the_last_position_is_refused() {
        let pages = [0u32];
        let batch = [SeqInput::new(&[1, 2, 3], 2, &pages)];
        RaggedBatch::default().fill(&batch, 4);
    }

    /// The reference equals the host kernel (AVX2 where the CPU has it) on a mixed batch, with
    /// grouped-query heads, with and without a sliding window.
    #[test]
    fn the_reference_matches_the_host_kernel_on_a_mixed_batch() {
        let mixed = Mixed::new();
        let (batch, meta, plan) = (mixed.batch(), mixed.meta(), mixed.plan());
        for window in [None, Some(3)] {
            let h = Mixed::heads(window);
            let rows = 8 * 4;
            let kv = rows * h.n_kv * h.head_dim;
            let k = values(0x9e37_79b9_7f4a_7c15, kv, -0.5, 0.5);
            let v = values(0x2545_f491_4f6c_dd1d, kv, -0.5, 0.5);
            let stride = h.n_head * h.head_dim;
            let q = values(0x5851_f42d_4c95_7f2d, meta.tokens() * stride, -0.5, 0.5);
            let mut want = vec![0f32; q.len()];
            let mut got = vec![f32::NAN; q.len()];
            attend_reference(&meta, &q, &k, &v, h, &mut want);
            attend_host(&q, stride, &k, &v, &plan, &batch, h, &mut got);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "window {window:?}: value {i} (token {}): reference {a}, host {b}",
                    i / stride
                );
            }
        }
    }

    /// The split-K arithmetic equals the one-pass reference up to rounding for every chunk size,
    /// chunks of one position and chunks longer than any context included, with and without a
    /// window (which moves where the chunks start).
    #[test]
    fn the_split_reference_matches_the_reference_for_every_chunk() {
        let mixed = Mixed::new();
        let meta = mixed.meta();
        for window in [None, Some(3), Some(6)] {
            let h = Mixed::heads(window);
            let kv = 8 * 4 * h.n_kv * h.head_dim;
            // Scores spread over several units, so the chunks' maxima differ and the rescaling
            // to the largest one matters.
            let k = values(0x6a09_e667_f3bc_c908, kv, -2.0, 2.0);
            let v = values(0xbb67_ae85_84ca_a73b, kv, -1.0, 1.0);
            let stride = h.n_head * h.head_dim;
            let q = values(0x3c6e_f372_fe94_f82b, meta.tokens() * stride, -2.0, 2.0);
            let mut want = vec![0f32; q.len()];
            attend_reference(&meta, &q, &k, &v, h, &mut want);
            for chunk in [1, 2, 3, 4, 7, 10, 1000] {
                let mut got = vec![f32::NAN; q.len()];
                attend_split_reference(&meta, &q, &k, &v, h, chunk, &mut got);
                let err = relative_error(&got, &want);
                assert!(
                    err < 1e-6,
                    "window {window:?}, chunk {chunk}: relative error {err:.2e}"
                );
            }
        }
    }

    /// The tensor path (the GPU's today) with 16-bit pools: keys and values are rounded once when
    /// written, so the output stays within that rounding of the reference on f32 values, and an
    /// f32 pool matches it to f32 rounding.
    #[test]
    fn the_tensor_path_with_a_16_bit_pool_stays_within_its_rounding() {
        use candle_core::{DType, Device, Tensor};
        let mixed = Mixed::new();
        let (batch, meta, plan) = (mixed.batch(), mixed.meta(), mixed.plan());
        let h = Mixed::heads(Some(5));
        let dev = Device::Cpu;
        let (rows, kv_dim, stride) = (8 * 4, h.n_kv * h.head_dim, h.n_head * h.head_dim);
        let k = values(0x51_7cc1_b727_220a, rows * kv_dim, -1.0, 1.0);
        let v = values(0x2c1b_3c6d_94d0_49b5, rows * kv_dim, -1.0, 1.0);
        let q = values(0x7fb5_d329_728e_a185, meta.tokens() * stride, -1.0, 1.0);
        let mut want = vec![0f32; q.len()];
        attend_reference(&meta, &q, &k, &v, h, &mut want);
        // Every row of the pool written through the pool's own write path, in reverse: plane row
        // r goes to pool row rows - 1 - r.
        let reversed: Vec<u32> = (0..rows as u32).rev().collect();
        let slots = Tensor::from_vec(reversed, rows, &dev).unwrap();
        let qt = Tensor::from_slice(&q, (meta.tokens(), h.n_head, h.head_dim), &dev).unwrap();
        for (dtype, bound) in [(DType::F32, 1e-6), (DType::F16, 2e-3), (DType::BF16, 1e-2)] {
            let pool = |x: &[f32]| {
                let p = Tensor::zeros((rows, kv_dim), dtype, &dev).unwrap();
                let plane: Vec<f32> = x.chunks(kv_dim).rev().flatten().copied().collect();
                let src = Tensor::from_vec(plane, (rows, kv_dim), &dev).unwrap();
                p.inplace_op3(&src, &slots, &crate::attention::StoreRows)
                    .unwrap();
                p
            };
            let (kp, vp) = (pool(&k), pool(&v));
            assert_eq!(kp.dtype(), dtype);
            let out =
                crate::attention::attend_tensor(&qt, &kp, &vp, &plan, &batch, h, &dev).unwrap();
            let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let err = relative_error(&got, &want);
            assert!(
                err < bound,
                "{dtype:?} pool: relative error {err:.2e} over {bound:.0e}"
            );
            if dtype != DType::F32 {
                assert!(
                    err > 1e-6,
                    "{dtype:?} pool: values were not rounded ({err:.2e})"
                );
            }
        }
    }

    /// The op on the CPU (what runs the kernel on CUDA) takes the pools in their element type and
    /// returns the reference's values in the shape the forward pass expects.
    #[test]
    fn the_paged_attention_op_runs_the_reference_on_the_cpu() {
        use candle_core::{DType, Device, Tensor};
        let mixed = Mixed::new();
        let meta = mixed.meta();
        let h = Mixed::heads(Some(6));
        let dev = Device::Cpu;
        let (rows, kv_dim, stride) = (8 * 4, h.n_kv * h.head_dim, h.n_head * h.head_dim);
        let k = values(0x1234_5678_9abc_def1, rows * kv_dim, -1.0, 1.0);
        let v = values(0x0fed_cba9_8765_4321, rows * kv_dim, -1.0, 1.0);
        let q = values(0x1357_9bdf_2468_ace1, meta.tokens() * stride, -1.0, 1.0);
        let mut want = vec![0f32; q.len()];
        attend_reference(&meta, &q, &k, &v, h, &mut want);
        let op = PagedAttention {
            meta: &meta,
            #[cfg(feature = "cuda")]
            device_batch: None,
            heads: h,
            out: DType::F32,
            #[cfg(feature = "cuda")]
            kernel: AttentionKernel::PerDimension,
            #[cfg(feature = "cuda")]
            prefetch: crate::Prefetch::Off,
            #[cfg(feature = "cuda")]
            keys: crate::KeyReads::Direct,
        };
        let qt = Tensor::from_slice(&q, (meta.tokens(), h.n_head, h.head_dim), &dev).unwrap();
        for dtype in [DType::F32, DType::F16] {
            let pool = |x: &[f32]| {
                Tensor::from_slice(x, (rows, kv_dim), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let out = qt.apply_op3_no_bwd(&pool(&k), &pool(&v), &op).unwrap();
            assert_eq!(out.dims(), [meta.tokens(), stride]);
            let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let bound = if dtype == DType::F32 { 0.0 } else { 2e-3 };
            let err = relative_error(&got, &want);
            assert!(err <= bound, "{dtype:?} pool: relative error {err:.2e}");
        }
        // An f16 output (for dense f16 output weights): the f32 result, rounded.
        let half_op = PagedAttention {
            out: DType::F16,
            ..op
        };
        let pool = |x: &[f32]| Tensor::from_slice(x, (rows, kv_dim), &dev).unwrap();
        let out = qt.apply_op3_no_bwd(&pool(&k), &pool(&v), &half_op).unwrap();
        assert_eq!(out.dtype(), DType::F16);
        let got = out.flatten_all().unwrap().to_vec1::<half::f16>().unwrap();
        let rounded: Vec<half::f16> = want.iter().map(|&x| half::f16::from_f32(x)).collect();
        assert_eq!(got, rounded);
        // A view that does not start at the storage's start is refused, not misread.
        let q2 = Tensor::from_slice(&q, (q.len(),), &dev).unwrap();
        let shifted = q2
            .narrow(0, stride, (meta.tokens() - 1) * stride)
            .unwrap()
            .reshape((meta.tokens() - 1, h.n_head, h.head_dim))
            .unwrap();
        let short = RaggedBatch {
            token_seq: meta.token_seq[1..].to_vec(),
            token_pos: meta.token_pos[1..].to_vec(),
            ..meta.clone()
        };
        let op = PagedAttention { meta: &short, ..op };
        let err = shifted
            .apply_op3_no_bwd(&pool_of(&k, &dev), &pool_of(&v, &dev), &op)
            .unwrap_err();
        assert!(
            err.to_string().contains("contiguous from its start"),
            "{err}"
        );
    }

    fn pool_of(x: &[f32], dev: &candle_core::Device) -> candle_core::Tensor {
        let n = x.len() / (2 * 64);
        candle_core::Tensor::from_slice(x, (n, 2 * 64), dev).unwrap()
    }
}
