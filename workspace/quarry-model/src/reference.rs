//! The plain-Rust arithmetic each of quarry's CUDA kernels is checked against, and the cases they
//! are checked on: on a GPU by the tests in `src/cuda/`, on the CPU by `quarry-cuda-emu`, which
//! runs the kernels' CUDA source there. One set of inputs, so both check the same thing.

pub use crate::glu::{gelu_tanh, silu};
pub use crate::linear::gemv_q8_reference;
pub use crate::llama::fused::{rms_norm_row, rotate_heads, QkNorm};
pub use crate::ragged::Heads;
pub use crate::ragged::{attend_reference, attend_split_reference};

use crate::batch::SeqInput;
use crate::kernel_plan::AttentionKernel;
use crate::kernel_plan::{AttentionPlan, AttentionShape, BatchSize, DEFAULT_SHARED};
use crate::ragged::RaggedBatch;
use crate::sampling::{SampleRows, Sampler, SamplingParams};

/// ‖got − want‖ / ‖want‖, in f64.
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den).sqrt()
}

/// `n` values spread over `[lo, hi)` from a xorshift64 stream seeded with `seed` (non-zero).
pub fn values(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x >> 40) as f32 / (1u64 << 24) as f32 * (hi - lo)
        })
        .collect()
}

/// The attention shapes both checks run, as (query heads, key-value heads, head dimensions,
/// window): SmolLM2's groups of 3 and Qwen2.5's of 7 (heads of 64), a head of 128, a head of 80
/// (rows that do not split into 16-byte pieces over a warp), Gemma 3's heads of 256 with its
/// sliding window.
pub const ATTENTION_SHAPES: [(usize, usize, usize, usize); 5] = [
    (9, 3, 64, 0),
    (14, 2, 64, 0),
    (8, 2, 128, 0),
    (6, 3, 80, 0),
    (4, 1, 256, 48),
];

/// One attention case: a batch's metadata, the heads, the queries and the pool's keys and values
/// (f32; a check rounds them to its pool's type), and the reference's output.
pub struct AttentionCase {
    pub meta: RaggedBatch,
    pub heads: Heads,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub want: Vec<f32>,
}

impl AttentionCase {
    fn new(meta: RaggedBatch, heads: Heads, rows: usize, seeds: [u64; 3], q_range: f32) -> Self {
        let kv = rows * heads.n_kv * heads.head_dim;
        let k = values(seeds[0], kv, -1.0, 1.0);
        let v = values(seeds[1], kv, -1.0, 1.0);
        let n = meta.tokens() * heads.n_head * heads.head_dim;
        let q = values(seeds[2], n, -q_range, q_range);
        let mut want = vec![0f32; q.len()];
        attend_reference(&meta, &q, &k, &v, heads, &mut want);
        Self {
            meta,
            heads,
            q,
            k,
            v,
            want,
        }
    }

    /// Every shape of [`ATTENTION_SHAPES`] over the mixed batch (long and short prefills,
    /// decodes at long contexts, an extension) on scattered pages of `page_size` positions.
    pub fn mixed(page_size: usize) -> Vec<Self> {
        let (tokens, starts, pages) = mixed_batch(page_size);
        let batch: Vec<SeqInput<'_>> = (0..tokens.len())
            .map(|i| SeqInput::new(&tokens[i], starts[i], &pages[i]))
            .collect();
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, page_size);
        let rows = (pages.iter().flatten().max().expect("pages") + 1) as usize * page_size;
        ATTENTION_SHAPES
            .iter()
            .map(|&(n_head, n_kv, head_dim, window)| {
                let heads = Heads {
                    n_head,
                    n_kv,
                    head_dim,
                    page_size,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window: (window > 0).then_some(window),
                };
                let seed = (n_head * 1000 + head_dim + window) as u64;
                let seeds = [seed * 3 + 1, seed * 5 + 2, seed * 7 + 3];
                Self::new(meta.clone(), heads, rows, seeds, 1.0)
            })
            .collect()
    }

    /// One decode row at 20,000 positions (pages of one position, backwards) with Qwen2.5's
    /// groups of 7: more than one block's shared memory holds.
    pub fn long_context() -> Self {
        Self::decode_at(20_000)
    }

    /// One decode row at `context` positions (pages of one position, backwards) with Qwen2.5's
    /// groups of 7 and heads of 64.
    pub fn decode_at(context: usize) -> Self {
        let pages: Vec<u32> = (0..context as u32).rev().collect();
        let tokens = [1u32];
        let mut meta = RaggedBatch::default();
        meta.fill(&[SeqInput::new(&tokens, context - 1, &pages)], 1);
        let heads = Heads {
            n_head: 14,
            n_kv: 2,
            head_dim: 64,
            page_size: 1,
            scale: 0.125,
            window: None,
        };
        Self::new(meta, heads, context, [11, 13, 17], 3.0)
    }
}

/// Decode rows of Qwen2.5's shape on an f32 pool whose warps-layout blocks need just under,
/// around and just over the 48 KiB of shared memory a kernel has without opting in (1,020 to
/// 1,040 positions, 32 bytes a position): each through `attend` (the device's launch), checked
/// against the reference. The driver counts the kernel's static memory against those 48 KiB; a
/// launcher that raised the limit only above 48 KiB failed on an H100 (2026-11-27). Panics
/// naming the context that fails, or if the contexts no longer cover the threshold.
pub fn check_around_default_shared(
    mut attend: impl FnMut(&AttentionCase) -> Result<Vec<f32>, String>,
) {
    let mut sizes = Vec::new();
    for context in 1020..=1040 {
        let case = AttentionCase::decode_at(context);
        let size = BatchSize::new(&case.meta, 0, 132);
        let shape = AttentionShape::from(case.heads);
        let plan = AttentionPlan::new(size, shape, AttentionKernel::Warps, "f32", false).unwrap();
        sizes.push(plan.shared_bytes);
        let got = attend(&case).unwrap_or_else(|e| panic!("{context} positions: {e}"));
        let err = relative_error(&got, &case.want);
        assert!(err < 1e-5, "{context} positions: relative error {err:.2e}");
    }
    assert!(sizes.iter().any(|&b| b <= DEFAULT_SHARED), "{sizes:?}");
    let between = |&b: &usize| b > DEFAULT_SHARED && b <= 48 * 1024;
    assert!(sizes.iter().any(between), "{sizes:?}");
    assert!(sizes.iter().any(|&b| b > 48 * 1024), "{sizes:?}");
}

/// The attention kernel's batch, as a step mixes them, on scattered pages of `page_size`
/// positions: long and short prefills, decodes at long contexts, an extension. Per sequence: its
/// new tokens, its start, its pages (every other page, backwards: nothing contiguous or ordered).
/// Sequences 1, 2 and 3 (two decodes and the extension) begin with the same pages for 208
/// positions, the batch's shared prefix (`RaggedBatch::fill` marks it; the cascade reads it once,
/// in 64-position chunks), and sequence 6 (a decode) with the first 64 of them only, so it
/// attends to shared pages outside the prefix.
fn mixed_batch(page_size: usize) -> (Vec<Vec<u32>>, Vec<usize>, Vec<Vec<u32>>) {
    let lens = [37usize, 1, 1, 5, 120, 1, 1];
    let starts = [0usize, 700, 263, 260, 0, 2, 300];
    let shared_positions = [0usize, 208, 208, 208, 0, 0, 64];
    let mut next_page = 0u32;
    let mut take = |n: usize| {
        let p: Vec<u32> = (0..n as u32)
            .rev()
            .map(|i| (next_page + i) * 2 + 1)
            .collect();
        next_page += n as u32;
        p
    };
    let prefix = take(208usize.div_ceil(page_size));
    let mut pages = Vec::new();
    for ((l, s), shared) in lens.iter().zip(&starts).zip(shared_positions) {
        let n = (s + l).div_ceil(page_size);
        let own = shared / page_size;
        let mut p = prefix[..own].to_vec();
        p.extend(take(n - own));
        pages.push(p);
    }
    let tokens = lens.iter().map(|&l| vec![1u32; l]).collect();
    (tokens, starts.to_vec(), pages)
}

/// The sampling kernel's case: rows of every kind over `vocab` tokens (49,157: not a multiple of
/// 32, the last 5 past the masks' 1,536 words), logits quantized to 1/8 so that many tie at the
/// top-k and top-p boundaries, then a row with a NaN and a row every token of which an empty
/// mask removes. The rows read their logits through `logit_row`, reversed.
pub struct SamplingCase {
    pub vocab: usize,
    pub words_per_mask: usize,
    pub masks: Vec<u32>,
    /// Row `r`'s logits at `r · vocab` (the host's order).
    pub logits: Vec<f32>,
    /// The same rows in reverse, as the device reads them through `rows.logit_row`.
    pub reversed: Vec<f32>,
    pub rows: SampleRows,
    /// Each row's sampling parameters (the kinds cycle over the first 64 rows).
    pub kinds: Vec<SamplingParams>,
}

impl SamplingCase {
    pub fn new() -> Self {
        let vocab = 49_157;
        let words = 1536; // covers 49,152 tokens: the last 5 are masked under a mask
        let n_masks = 3;
        let mut masks = vec![0u32; n_masks * words];
        let bits = values(77, n_masks * words, 0.0, 1.0);
        for (m, (w, b)) in masks.iter_mut().zip(&bits).enumerate() {
            // Mask 0 dense, mask 1 sparse, mask 2 a handful of tokens.
            *w = match m / words {
                0 => (b * u32::MAX as f32) as u32 | 0x0101_0101,
                1 => 1 << ((b * 32.0) as u32 % 32),
                _ if m % words < 4 => 0x8000_0001,
                _ => 0,
            };
        }
        let p = |temperature, top_k, top_p, seed| SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        };
        let kinds = vec![
            p(0.0, 0, 1.0, 0),
            p(1.0, 0, 1.0, 1),
            p(0.7, 40, 1.0, 2),
            p(1.3, 0, 0.9, 3),
            p(0.8, 50, 0.95, 4),
            p(2.0, 1, 0.5, 5),
            p(0.5, 100_000, 0.3, 6),
        ];
        let mut rows = SampleRows::default();
        let mut logits = Vec::new();
        for (r, k) in kinds.iter().cycle().take(64).enumerate() {
            let row = values(1000 + r as u64, vocab, -12.0, 12.0)
                .into_iter()
                .map(|x| (x * 8.0).round() / 8.0);
            logits.extend(row);
            let mut s = Sampler::new(SamplingParams {
                seed: r as u64,
                ..*k
            })
            .expect("valid parameters");
            let mask = match r % 4 {
                3 => None,
                m => Some(m as u32),
            };
            let bans: Vec<u32> = (0..(r % 3) as u32)
                .map(|i| i * 7919 % vocab as u32)
                .collect();
            rows.push(&mut s, r, mask, bans);
        }
        let sampler = || Sampler::new(kinds[1]).expect("valid parameters");
        logits.extend((0..vocab).map(|i| if i == 4242 { f32::NAN } else { 0.0 }));
        rows.push(&mut sampler(), 64, None, []);
        let empty = masks.len() / words;
        masks.extend(std::iter::repeat_n(0, words));
        logits.extend(std::iter::repeat_n(1.0, vocab));
        rows.push(&mut sampler(), 65, Some(empty as u32), []);
        let n = rows.rows();
        let reversed: Vec<f32> = (0..n)
            .rev()
            .flat_map(|r| logits[r * vocab..(r + 1) * vocab].to_vec())
            .collect();
        for r in 0..n {
            rows.logit_row[r] = (n - 1 - r) as u32;
        }
        Self {
            vocab,
            words_per_mask: words,
            masks,
            logits,
            reversed,
            rows,
            kinds,
        }
    }

    /// Checks the device's draws (`got[r]`: the token, or the error's message) against the host's
    /// row by row; a token may differ only where moving the row's uniform by 1e-9 gives it (the
    /// sums are added in another order), at most twice. Returns (exact, at a boundary).
    pub fn check(&self, got: &[Result<u32, String>]) -> (usize, usize) {
        let (vocab, words) = (self.vocab, self.words_per_mask);
        let mut scratch = Vec::new();
        let (mut exact, mut boundary) = (0, 0);
        for (r, g) in got.iter().enumerate() {
            let row = || self.logits[r * vocab..(r + 1) * vocab].to_vec();
            let want = self
                .rows
                .pick_row(r, &mut row(), &self.masks, words, &mut scratch);
            match (want, g) {
                (Ok(w), Ok(g)) if w == *g => exact += 1,
                (Ok(w), Ok(g)) => {
                    let mut moved = self.rows.clone();
                    let near = [-1e-9, 1e-9].iter().any(|d| {
                        moved.uniform[r] = self.rows.uniform[r] + d;
                        moved
                            .pick_row(r, &mut row(), &self.masks, words, &mut scratch)
                            .ok()
                            == Some(*g)
                    });
                    let kind = self.kinds[r % self.kinds.len()];
                    assert!(near, "row {r} ({kind:?}): host {w}, device {g}");
                    boundary += 1;
                }
                (Err(w), Err(g)) => {
                    assert!(w.to_string().contains(g.as_str()), "row {r}: {w} / {g}")
                }
                (w, g) => panic!("row {r}: host {w:?}, device {g:?}"),
            }
        }
        assert!(boundary <= 2, "{boundary} rows differ: more than rounding");
        (exact, boundary)
    }
}

impl Default for SamplingCase {
    fn default() -> Self {
        Self::new()
    }
}
