//! Attention over the paged KV pool (and, for the tensor layout, the KV writes; the host forward
//! writes keys and values in its RoPE pass).
//!
//! Two implementations, picked by the pool's [`KvLayout`](crate::KvLayout):
//! - **host**: a CPU kernel that reads each sequence's keys and values in place through its block
//!   table. Work items are (tile of up to four consecutive new tokens of one sequence, the query
//!   heads of one key-value head), so the tile's key and value rows stay in cache for all its
//!   query rows; a single decode, too small to share out that way, has one item per query head.
//!   They run on candle's CPU worker pool, the one the matmuls use. With AVX2 and FMA, scores come
//!   eight keys at a time (eight independent accumulators and one transposing reduction, instead
//!   of a dependent chain and a horizontal sum per key) and each query row's weighted sum of
//!   values stays in registers, 64 values at a time.
//! - **tensor**: device-agnostic candle ops. Each sequence's rows are gathered with `index_select`
//!   and attended with batched matmuls under a causal mask: on CPU the independent cross-check of
//!   the host kernel (a GPU runs the paged attention kernel, `crate::ragged`, unless
//!   `attention = gather` in `ModelOptions`). The tensor layout's KV writes are [`StoreRows`].

use std::cell::RefCell;

use candle_core::{CpuStorage, Device, InplaceOp3, Layout, Tensor};

use crate::batch::{Plan, SeqInput};
use crate::error::Result;
use crate::host_mem::SharedMut;
use crate::pool::PageId;
use crate::ragged::Heads;
use crate::simd::{softmax_in_place, Avx2};

/// The host kernel. Row `t` of `q` starts at `t * q_stride` and holds `n_head * head_dim` query
/// values (the stacked Q/K/V output has room for K and V after them); `k`/`v` are one layer of the
/// pool (`[slots, kv_dim]`). The result is written to `out`, `[T, n_head * head_dim]`: every value
/// of it, so the buffer needs no zeroing.
///
/// Work items are (token tile, query heads) pairs on candle's CPU worker pool (see the module doc).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_host(
    q: &[f32],
    q_stride: usize,
    k: &[f32],
    v: &[f32],
    plan: &Plan,
    batch: &[SeqInput],
    h: Heads,
    out: &mut [f32],
) {
    assert_eq!(out.len(), plan.tokens.len() * h.n_head * h.head_dim);
    let out = SharedMut::new(out);
    let avx = Avx2::detect();
    // Tiles of up to TILE consecutive new tokens of one sequence: each key and value row read
    // serves the whole tile, which is what makes long prefills cheap.
    let mut tiles: Vec<(u32, u32)> = Vec::new();
    for (s, rows) in plan.seq_rows.iter().enumerate() {
        let mut t = rows.start;
        while t < rows.end {
            let n = TILE.min(rows.end - t);
            tiles.push((t as u32, s as u32));
            t += n;
        }
    }
    let job = Job {
        q,
        q_stride,
        k,
        v,
        plan,
        batch,
        h,
        out,
    };
    // Query heads per work item: a whole GQA group shares each key and value row read, unless that
    // leaves too few items to keep every worker busy (a single decode).
    let heads = if tiles.len() * h.n_kv >= 4 * candle_core::utils::get_num_threads() {
        h.group()
    } else {
        1
    };
    let per_tile = h.n_head / heads;
    candle_core::utils::barrier_pool().execute_chunked(tiles.len() * per_tile, |range| {
        for item in range {
            let (t0, seq) = tiles[item / per_tile];
            let head0 = (item % per_tile) * heads;
            job.tile(t0 as usize, seq as usize, head0, heads, avx);
        }
    });
}

/// New tokens attended together by one work item.
const TILE: usize = 4;

struct Job<'a> {
    q: &'a [f32],
    q_stride: usize,
    k: &'a [f32],
    v: &'a [f32],
    plan: &'a Plan,
    batch: &'a [SeqInput<'a>],
    h: Heads,
    /// `[T, n_head * head_dim]` output; each (tile, head) item writes only its own slices.
    out: SharedMut<f32>,
}

/// A work item's scratch: its score rows, and the pool offsets of the positions it reads.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    offsets: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Job<'_> {
    /// Attention for query heads `head0..head0 + heads` (of one key-value head) of the new tokens
    /// `t0..t0 + n` (consecutive positions of sequence `seq`): scores over positions `0..=p`
    /// through the block table, softmax, then the weighted sum of values. Every (token, head) row
    /// is computed the same way whatever the tile and grouping, so batching changes no result.
    fn tile(&self, t0: usize, seq: usize, head0: usize, heads: usize, avx: Option<Avx2>) {
        let h = self.h;
        let d = h.head_dim;
        let g = head0 / h.group();
        let rows = &self.plan.seq_rows[seq];
        let n = TILE.min(rows.end - t0);
        let p0 = self.plan.positions[t0] as usize;
        // Token i of the tile sees positions 0..=p0 + i.
        let ctx = p0 + n;
        let scale = h.scale;
        let stride = h.n_head * d;
        SCRATCH.with(|cell| {
            let scratch = &mut *cell.borrow_mut();
            let Scratch { scores, offsets } = scratch;
            offsets.clear();
            let pages = self.batch[seq].pages;
            for_each_row(pages, h.page_size, ctx, h.kv_dim(), g * d, |_, at| {
                offsets.push(at)
            });
            scores.resize(heads * n * ctx, 0.0);
            // Query row `j·n + i` is head `head0 + j` of token `t0 + i`.
            for (r, row) in scores.chunks_exact_mut(ctx).enumerate() {
                let (j, i) = (r / n, r % n);
                let at = (t0 + i) * self.q_stride + (head0 + j) * d;
                let q = &self.q[at..at + d];
                let seen = h.first_seen(p0 + i)..p0 + i + 1;
                let row = &mut row[seen.clone()];
                score_row(q, self.k, &offsets[seen.clone()], row, scale, avx);
                softmax_in_place(row, avx);
                // SAFETY: this item alone writes heads head0..head0+heads of rows t0..t0+n, and
                // the slice lies within the `[T, n_head * head_dim]` output.
                let out = unsafe { self.out.slice((t0 + i) * stride + (head0 + j) * d, d) };
                weighted_sum(row, self.v, &offsets[seen], out, avx);
            }
        });
    }
}

/// `row[p] = q·k[offsets[p]..] · scale` for every position.
#[inline]
fn score_row(
    q: &[f32],
    k: &[f32],
    offsets: &[usize],
    row: &mut [f32],
    scale: f32,
    avx: Option<Avx2>,
) {
    let d = q.len();
    #[cfg(target_arch = "x86_64")]
    if avx.is_some() && d.is_multiple_of(8) {
        // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
        unsafe { score_row_avx2(q, k, offsets, row, scale) };
        return;
    }
    let _ = avx;
    for (s, &at) in row.iter_mut().zip(offsets) {
        *s = dot(q, &k[at..at + d]) * scale;
    }
}

/// `out = Σ_p w[p] · v[offsets[p]..]`.
#[inline]
fn weighted_sum(w: &[f32], v: &[f32], offsets: &[usize], out: &mut [f32], avx: Option<Avx2>) {
    let d = out.len();
    #[cfg(target_arch = "x86_64")]
    if avx.is_some() && d.is_multiple_of(64) {
        // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
        unsafe { weighted_sum_avx2(w, v, offsets, out) };
        return;
    }
    let _ = avx;
    out.fill(0.0);
    for (&wp, &at) in w.iter().zip(offsets) {
        axpy(out, wp, &v[at..at + d]);
    }
}

/// Eight positions at a time: eight independent accumulators (one per key row) share each query
/// chunk, and one transposing reduction turns them into eight adjacent scores. A dot product per
/// position would be one dependent chain of FMAs and a horizontal sum each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn score_row_avx2(q: &[f32], k: &[f32], offsets: &[usize], row: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    let d = q.len();
    let chunks = d / 8;
    let scale8 = _mm256_set1_ps(scale);
    let mut blocks = offsets.chunks_exact(8);
    let mut p = 0;
    for block in blocks.by_ref() {
        let keys: [*const f32; 8] = std::array::from_fn(|j| k[block[j]..block[j] + d].as_ptr());
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in 0..chunks {
            let qc = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            for (a, key) in acc.iter_mut().zip(&keys) {
                *a = _mm256_fmadd_ps(qc, _mm256_loadu_ps(key.add(8 * c)), *a);
            }
        }
        // Pairwise sums until lane j holds key j's total.
        let t0 = _mm256_hadd_ps(acc[0], acc[1]);
        let t1 = _mm256_hadd_ps(acc[2], acc[3]);
        let t2 = _mm256_hadd_ps(acc[4], acc[5]);
        let t3 = _mm256_hadd_ps(acc[6], acc[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        let sums = _mm256_add_ps(
            _mm256_permute2f128_ps(u0, u1, 0x20),
            _mm256_permute2f128_ps(u0, u1, 0x31),
        );
        _mm256_storeu_ps(row[p..p + 8].as_mut_ptr(), _mm256_mul_ps(sums, scale8));
        p += 8;
    }
    for (s, &at) in row[p..].iter_mut().zip(blocks.remainder()) {
        *s = dot(q, &k[at..at + d]) * scale;
    }
}

/// Sixty-four output values at a time, held in eight registers while every value row streams
/// past, so the sum never goes through memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_avx2(w: &[f32], v: &[f32], offsets: &[usize], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let d = out.len();
    for slab in (0..d).step_by(64) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (&wp, &at) in w.iter().zip(offsets) {
            let row = v[at + slab..at + slab + 64].as_ptr();
            let wp = _mm256_set1_ps(wp);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wp, _mm256_loadu_ps(row.add(8 * c)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[slab + 8 * c..slab + 8 * c + 8].as_mut_ptr(), *a);
        }
    }
}

/// Calls `f(position, offset)` for positions `0..ctx` of a sequence, in order, where `offset` is
/// where that position's row (plus `head_offset`) starts in a pool layer.
#[inline(always)]
fn for_each_row(
    pages: &[PageId],
    page_size: usize,
    ctx: usize,
    kv_dim: usize,
    head_offset: usize,
    mut f: impl FnMut(usize, usize),
) {
    let mut pos = 0;
    for &page in pages {
        if pos == ctx {
            break;
        }
        let rows = page_size.min(ctx - pos);
        let base = page as usize * page_size * kv_dim + head_offset;
        for r in 0..rows {
            f(pos + r, base + r * kv_dim);
        }
        pos += rows;
    }
}

/// Dot product with eight independent accumulators, which the compiler vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a * x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// Writes a plane of keys or values (`[tokens, kv_w]`, f32, contiguous) into a pool layer
/// (`[rows, kv_w]`, f32, f16 or bf16) at the tokens' slots (the third operand, u32 `[tokens]`),
/// rounding to the pool's type: `pool.inplace_op3(&plane, &slots, &StoreRows)`.
pub(crate) struct StoreRows;

impl StoreRows {
    /// The plane's rows and width, checked against the pool and the slots.
    fn shape(pool: &Layout, plane: &Layout, slots: &Layout) -> candle_core::Result<(usize, usize)> {
        let (tokens, width) = plane.shape().dims2()?;
        let (_, pool_width) = pool.shape().dims2()?;
        if pool_width != width || slots.shape().elem_count() != tokens {
            candle_core::bail!(
                "store rows: {tokens} rows of {width} values at {} slots of a pool of rows of {pool_width}",
                slots.shape().elem_count()
            );
        }
        for (l, what) in [(pool, "pool"), (plane, "plane"), (slots, "slots")] {
            if !l.is_contiguous() {
                candle_core::bail!("store rows: the {what} must be contiguous");
            }
        }
        Ok((tokens, width))
    }
}

impl InplaceOp3 for StoreRows {
    fn name(&self) -> &'static str {
        "quarry-store-rows"
    }

    fn cpu_fwd(
        &self,
        pool: &mut CpuStorage,
        lp: &Layout,
        plane: &CpuStorage,
        ls: &Layout,
        slots: &CpuStorage,
        lz: &Layout,
    ) -> candle_core::Result<()> {
        let (tokens, width) = Self::shape(lp, ls, lz)?;
        let (CpuStorage::F32(src), CpuStorage::U32(slots)) = (plane, slots) else {
            candle_core::bail!("store rows: an f32 plane and u32 slots");
        };
        let (src, slots) = (&src[ls.start_offset()..], &slots[lz.start_offset()..]);
        let rows = lp.shape().dims()[0];
        fn put<T>(pool: &mut [T], src: &[f32], slots: &[u32], width: usize, f: impl Fn(f32) -> T) {
            for (r, &slot) in slots.iter().enumerate() {
                let dst = &mut pool[slot as usize * width..][..width];
                for (d, &s) in dst.iter_mut().zip(&src[r * width..(r + 1) * width]) {
                    *d = f(s);
                }
            }
        }
        let slots = &slots[..tokens];
        if let Some(&bad) = slots.iter().find(|&&s| s as usize >= rows) {
            candle_core::bail!("store rows: slot {bad} of a pool of {rows} rows");
        }
        let at = lp.start_offset();
        match pool {
            CpuStorage::F32(p) => put(&mut p[at..], src, slots, width, |x| x),
            CpuStorage::F16(p) => put(&mut p[at..], src, slots, width, half::f16::from_f32),
            CpuStorage::BF16(p) => put(&mut p[at..], src, slots, width, half::bf16::from_f32),
            _ => candle_core::bail!("store rows: pools are f32, f16 or bf16"),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        pool: &mut candle_core::CudaStorage,
        lp: &Layout,
        plane: &candle_core::CudaStorage,
        ls: &Layout,
        slots: &candle_core::CudaStorage,
        lz: &Layout,
    ) -> candle_core::Result<()> {
        let (tokens, width) = Self::shape(lp, ls, lz)?;
        crate::cuda::store_rows(pool, lp, plane, ls, slots, lz, tokens, width)
    }
}

/// The tensor path: `q` is `[T, n_head, head_dim]`; returns `[T, n_head * head_dim]`.
pub(crate) fn attend_tensor(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    plan: &Plan,
    batch: &[SeqInput],
    h: Heads,
    device: &Device,
) -> Result<Tensor> {
    let (d, group, ps) = (h.head_dim, h.group(), h.page_size);
    let mut outs = Vec::with_capacity(batch.len());
    for (seq, rows) in batch.iter().zip(&plan.seq_rows) {
        let (n, ctx) = (rows.len(), seq.end());
        let slots: Vec<u32> = (0..ctx)
            .map(|p| (seq.pages[p / ps] as usize * ps + p % ps) as u32)
            .collect();
        let idx = Tensor::from_vec(slots, ctx, device)?;
        let gather = |pool: &Tensor| -> candle_core::Result<Tensor> {
            pool.index_select(&idx, 0)?
                .to_dtype(candle_core::DType::F32)?
                .reshape((ctx, h.n_kv, d))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (k, v) = (gather(k_pool)?, gather(v_pool)?);
        // Query heads of one KV head are adjacent, so (n_head, n, d) regroups as (n_kv, group*n, d).
        let qs = q
            .narrow(0, rows.start, n)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((h.n_kv, group * n, d))?;
        let scores = (qs.matmul(&k.t()?)? * h.scale as f64)?.reshape((h.n_kv, group, n, ctx))?;
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| {
                let seen = h.first_seen(seq.start + i)..seq.start + i + 1;
                (0..ctx).map(move |j| {
                    if seen.contains(&j) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (n, ctx), device)?;
        let w = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?.reshape((
            h.n_kv,
            group * n,
            ctx,
        ))?;
        let o = w
            .matmul(&v)?
            .reshape((h.n_head, n, d))?
            .transpose(0, 1)?
            .reshape((n, h.n_head * d))?;
        outs.push(o);
    }
    Ok(Tensor::cat(&outs, 0)?.contiguous()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::testing::{avx2_or_say, values};

    /// The AVX2 score and value-sum kernels against the plain loops, over scattered rows (as a
    /// block table gives them), 19 positions (two blocks of eight and a remainder) and head sizes
    /// 64 and 128.
    #[test]
    fn blocked_kernels_match_the_plain_loops() {
        if !avx2_or_say("blocked_kernels_match_the_plain_loops") {
            return;
        }
        for d in [64, 128] {
            let rows = 40;
            let k = values(0x9e37_79b9_7f4a_7c15, rows * d, -0.5, 0.5);
            let v = values(0x2545_f491_4f6c_dd1d, rows * d, -0.5, 0.5);
            let q = values(0x5851_f42d_4c95_7f2d, d, -0.5, 0.5);
            let offsets: Vec<usize> = (0..19).map(|p| ((p * 17 + 5) % rows) * d).collect();
            let (mut plain, mut fast) = (vec![0f32; 19], vec![0f32; 19]);
            score_row(&q, &k, &offsets, &mut plain, 0.125, None);
            score_row(&q, &k, &offsets, &mut fast, 0.125, Avx2::detect());
            for (a, b) in plain.iter().zip(&fast) {
                assert!((a - b).abs() <= 1e-5, "d {d}: score {a} vs {b}");
            }
            let (mut plain_out, mut fast_out) = (vec![0f32; d], vec![7f32; d]);
            weighted_sum(&plain, &v, &offsets, &mut plain_out, None);
            weighted_sum(&plain, &v, &offsets, &mut fast_out, Avx2::detect());
            for (a, b) in plain_out.iter().zip(&fast_out) {
                assert!((a - b).abs() <= 1e-5, "d {d}: value sum {a} vs {b}");
            }
        }
    }
}
