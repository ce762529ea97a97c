//! Attention over the paged KV pool, and the KV writes that precede it.
//!
//! Two implementations, picked by the pool's [`KvLayout`](crate::KvLayout):
//! - **host**: a CPU kernel that reads each sequence's keys and values in place through its block
//!   table. Work items are (tile of up to four consecutive new tokens of one sequence, the query
//!   heads of one key-value head): each key and value row read serves the whole tile and every
//!   query head of its grouped-query group. A single decode, too small to share out that way, has
//!   one item per query head instead. They run on candle's CPU worker pool, the one its matmuls
//!   use, compiled for AVX2/FMA when the CPU has them.
//! - **tensor**: device-agnostic candle ops. Each sequence's rows are gathered with `index_select`
//!   and attended with batched matmuls under a causal mask. This is the CUDA path, and on CPU the
//!   independent cross-check of the host kernel.

use std::cell::RefCell;

use candle_core::{Device, Tensor};

use crate::batch::{Plan, SeqInput};
use crate::error::Result;
use crate::pool::PageId;

/// Shapes shared by both implementations.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub page_size: usize,
}

impl Heads {
    fn group(&self) -> usize {
        self.n_head / self.n_kv
    }
    fn kv_dim(&self) -> usize {
        self.n_kv * self.head_dim
    }
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Copies each new token's key and value row into its pool slot.
pub(crate) fn write_host(dst: &mut [f32], src: &[f32], slots: &[u32], kv_dim: usize) {
    for (row, &slot) in src.chunks_exact(kv_dim).zip(slots) {
        let at = slot as usize * kv_dim;
        dst[at..at + kv_dim].copy_from_slice(row);
    }
}

/// The host kernel. `q` is `[T, n_head, head_dim]`, `k`/`v` are one layer of the pool
/// (`[slots, kv_dim]`); the result is `[T, n_head * head_dim]`.
///
/// Work items are (token tile, query head) pairs on candle's CPU worker pool (see the module doc).
pub(crate) fn attend_host(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    plan: &Plan,
    batch: &[SeqInput],
    h: Heads,
) -> Vec<f32> {
    let t_total = plan.tokens.len();
    let mut out = vec![0f32; t_total * h.n_head * h.head_dim];
    let out_ptr = out.as_mut_ptr() as usize;
    let avx = has_avx2();
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
        k,
        v,
        plan,
        batch,
        h,
        out: out_ptr,
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
            #[cfg(target_arch = "x86_64")]
            if avx {
                // SAFETY: AVX2 and FMA were detected at run time.
                unsafe { job.tile_avx2(t0 as usize, seq as usize, head0, heads) };
                continue;
            }
            let _ = avx;
            job.tile(t0 as usize, seq as usize, head0, heads);
        }
    });
    out
}

/// New tokens attended together by one work item.
const TILE: usize = 4;

struct Job<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    plan: &'a Plan,
    batch: &'a [SeqInput<'a>],
    h: Heads,
    /// `[T, n_head * head_dim]` output; each (tile, head) item writes only its own slices.
    out: usize,
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Job<'_> {
    /// The same code compiled for AVX2 and FMA, so the dot products and sums use 8-wide FMAs.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2(&self, t0: usize, seq: usize, head0: usize, heads: usize) {
        self.tile(t0, seq, head0, heads)
    }

    /// Attention for query heads `head0..head0 + heads` (of one key-value head) of the new tokens
    /// `t0..t0 + n` (consecutive positions of sequence `seq`): scores over positions `0..=p`
    /// through the block table, softmax, then the weighted sum of values. Each (token, head) is
    /// summed in the same order whatever `heads` is, so the grouping changes no result.
    #[inline(always)]
    fn tile(&self, t0: usize, seq: usize, head0: usize, heads: usize) {
        let h = self.h;
        let (d, ps, kv_dim) = (h.head_dim, h.page_size, h.kv_dim());
        let g = head0 / h.group();
        let rows = &self.plan.seq_rows[seq];
        let n = TILE.min(rows.end - t0);
        let pages = self.batch[seq].pages;
        let p0 = self.plan.positions[t0] as usize;
        // Token i of the tile sees positions 0..=p0 + i.
        let ctx = p0 + n;
        let scale = h.scale();
        let stride = h.n_head * d;
        // Row `j·n + i` of the scores and outputs is head `head0 + j`, token `t0 + i`.
        let at = |j: usize, i: usize| (t0 + i) * stride + (head0 + j) * d;
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            scores.clear();
            scores.resize(heads * n * ctx, 0.0);
            let head_offset = g * d;
            for_each_row(pages, ps, ctx, kv_dim, head_offset, |pos, kat| {
                let krow = &self.k[kat..kat + d];
                for j in 0..heads {
                    for i in 0..n {
                        let q = &self.q[at(j, i)..at(j, i) + d];
                        scores[(j * n + i) * ctx + pos] = dot(q, krow) * scale;
                    }
                }
            });
            for j in 0..heads {
                for i in 0..n {
                    let row = (j * n + i) * ctx;
                    softmax_in_place(&mut scores[row..row + p0 + i + 1]);
                }
            }
            for_each_row(pages, ps, ctx, kv_dim, head_offset, |pos, vat| {
                let vrow = &self.v[vat..vat + d];
                for j in 0..heads {
                    // Token i sees this position when pos <= p0 + i.
                    for i in pos.saturating_sub(p0)..n {
                        // SAFETY: this item alone writes heads head0..head0+heads of rows
                        // t0..t0+n, and `at(j, i) + d` is within the output.
                        let out = unsafe {
                            std::slice::from_raw_parts_mut((self.out as *mut f32).add(at(j, i)), d)
                        };
                        axpy(out, scores[(j * n + i) * ctx + pos], vrow);
                    }
                }
            });
        });
    }
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

#[inline(always)]
fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// Writes each new token's key and value into its slot of a tensor-layout pool layer.
pub(crate) fn write_tensor(pool: &Tensor, src: &Tensor, slots: &Tensor) -> Result<()> {
    let (t, kv_dim) = src.dims2()?;
    let index = slots
        .reshape((t, 1))?
        .broadcast_as((t, kv_dim))?
        .contiguous()?;
    pool.scatter_set(&index, src, 0)?;
    Ok(())
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
        let scores = (qs.matmul(&k.t()?)? * h.scale() as f64)?.reshape((h.n_kv, group, n, ctx))?;
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..ctx).map(move |j| {
                    if j <= seq.start + i {
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

/// Runs `f` on the contiguous f32 data of a CPU tensor without copying it.
pub(crate) fn with_host_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(crate::ModelError::Forward {
            message: "expected a CPU tensor".into(),
        });
    };
    let data = cpu.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(f(&data[a..b])),
        None => Err(crate::ModelError::Forward {
            message: "expected a contiguous tensor".into(),
        }),
    }
}
