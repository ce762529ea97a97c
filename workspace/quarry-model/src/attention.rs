//! Attention over the paged KV pool, and the KV writes that precede it.
//!
//! Two implementations, picked by the pool's [`KvLayout`](crate::KvLayout):
//! - **host**: a CPU kernel that reads each sequence's keys and values in place through its block
//!   table. Work items are (new token, KV head) pairs, so the query heads sharing a KV head (GQA)
//!   read its rows once. They run on candle's CPU worker pool, the one its matmuls use.
//! - **tensor**: device-agnostic candle ops. Each sequence's rows are gathered with `index_select`
//!   and attended with batched matmuls under a causal mask. This is the CUDA path, and on CPU the
//!   independent cross-check of the host kernel.

use std::cell::RefCell;

use candle_core::{Device, Tensor};

use crate::batch::{Plan, SeqInput};
use crate::error::Result;

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
pub(crate) fn attend_host(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    plan: &Plan,
    batch: &[SeqInput],
    h: Heads,
) -> Vec<f32> {
    let t_total = plan.tokens.len();
    let d = h.head_dim;
    let group = h.group();
    let kv_dim = h.kv_dim();
    let ps = h.page_size;
    let scale = h.scale();
    let mut out = vec![0f32; t_total * h.n_head * d];
    let out_ptr = out.as_mut_ptr() as usize;
    // Which sequence each flattened row belongs to.
    let seq_of = |t: usize| plan.seq_rows.partition_point(|r| r.end <= t);
    thread_local! {
        static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let work = |t: usize, g: usize| {
        let pages = batch[seq_of(t)].pages;
        let ctx = plan.positions[t] as usize + 1;
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            scores.clear();
            scores.resize(group * ctx, 0.0);
            let q0 = (t * h.n_head + g * group) * d;
            let qs = &q[q0..q0 + group * d];
            // Scores, page by page.
            let mut j = 0;
            for &page in pages {
                if j == ctx {
                    break;
                }
                let rows = ps.min(ctx - j);
                let base = page as usize * ps;
                for r in 0..rows {
                    let at = (base + r) * kv_dim + g * d;
                    let krow = &k[at..at + d];
                    for (hh, qh) in qs.chunks_exact(d).enumerate() {
                        scores[hh * ctx + j + r] = dot(qh, krow) * scale;
                    }
                }
                j += rows;
            }
            for row in scores.chunks_exact_mut(ctx) {
                softmax_in_place(row);
            }
            // SAFETY: the item (t, g) alone writes heads g*group..(g+1)*group of row t.
            let o = unsafe {
                std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(q0), group * d)
            };
            let mut j = 0;
            for &page in pages {
                if j == ctx {
                    break;
                }
                let rows = ps.min(ctx - j);
                let base = page as usize * ps;
                for r in 0..rows {
                    let at = (base + r) * kv_dim + g * d;
                    let vrow = &v[at..at + d];
                    for (hh, oh) in o.chunks_exact_mut(d).enumerate() {
                        axpy(oh, scores[hh * ctx + j + r], vrow);
                    }
                }
                j += rows;
            }
        });
    };
    let items = t_total * h.n_kv;
    candle_core::utils::barrier_pool().execute_chunked(items, |range| {
        for item in range {
            work(item / h.n_kv, item % h.n_kv)
        }
    });
    out
}

/// Dot product with eight independent accumulators, which the compiler vectorizes.
#[inline]
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
#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

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
    let index = slots.reshape((t, 1))?.broadcast_as((t, kv_dim))?.contiguous()?;
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
        let w = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?
            .reshape((h.n_kv, group * n, ctx))?;
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
