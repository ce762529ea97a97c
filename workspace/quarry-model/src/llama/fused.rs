//! The attention's inputs as few ops: what the tensor forward pass does between the
//! stacked Q/K/V projection and the attention kernel.
//!
//! [`RopeQk`] takes the projection's `[tokens, q_w + 2·kv_w]` output (f32, or f16 from the
//! dense weights' GEMM on a GPU) and returns the queries, keys and values as three f32 planes of
//! one tensor, the bias added (Qwen2), each query and key head normalized (Gemma 3) and rotated
//! (RoPE); [`crate::attention::StoreRows`] then writes the keys, and the values, into their
//! pool's rows at the tokens' slots, in the pool's element type. On a GPU that is three launches
//! (`kernels/rope_store.cu`) where candle's ops took about a dozen (casts, bias adds, norms, two
//! RoPE kernels, copies, a cast and a scatter per pool); on the CPU (the tensor layout's
//! cross-check of the host forward) the same arithmetic in Rust: [`rotate_heads`], which the host
//! forward runs too, so the CUDA kernels' GPU tests compare them with the host's own arithmetic.

use candle_core::{CpuStorage, CustomOp1, DType, InplaceOp2, Layout, Shape, Tensor};

use crate::config::RopeStyle;
use crate::host_mem::f32_values;
pub(crate) use crate::op_args::{AddNorm, Norm, RopeQk};
use crate::options::{ModelOptions, Switch};

/// `y = y / rms(y) · w` for one row, as candle's `rms_norm` computes it.
#[inline]
pub fn rms_norm_row(y: &mut [f32], w: &[f32], eps: f32) {
    let sum2: f32 = y.iter().map(|v| v * v).sum();
    let m = (sum2 / y.len() as f32 + eps).sqrt();
    for (y, w) in y.iter_mut().zip(w) {
        *y = *y / m * w;
    }
}

/// Per-head query and key norms, and their epsilon.
pub type QkNorm<'a> = Option<(&'a [f32], &'a [f32], f32)>;

/// One token's query and key heads (`qk`: `q_w` query values, then the key heads), normalized
/// per head when `qk_norm` is given, then rotated by the position whose `cos` and `sin` rows
/// (`head_dim / 2` each) are given: each pair of `style` turns by `p·θ_i`.
pub fn rotate_heads(
    qk: &mut [f32],
    q_w: usize,
    head_dim: usize,
    style: RopeStyle,
    (cos, sin): (&[f32], &[f32]),
    qk_norm: QkNorm<'_>,
) {
    let half = head_dim / 2;
    for (i, head) in qk.chunks_exact_mut(head_dim).enumerate() {
        if let Some((qn, kn, eps)) = qk_norm {
            rms_norm_row(head, if i * head_dim < q_w { qn } else { kn }, eps);
        }
        match style {
            RopeStyle::Interleaved => {
                for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * c - x1 * s;
                    pair[1] = x0 * s + x1 * c;
                }
            }
            RopeStyle::Halves => {
                let (lo, hi) = head.split_at_mut(half);
                for ((x0, x1), (&c, &s)) in
                    lo.iter_mut().zip(hi.iter_mut()).zip(cos.iter().zip(sin))
                {
                    let (a, b) = (*x0, *x1);
                    *x0 = a * c - b * s;
                    *x1 = a * s + b * c;
                }
            }
        }
    }
}

impl RopeQk<'_> {
    fn widths(&self) -> (usize, usize) {
        (self.n_head * self.head_dim, self.n_kv * self.head_dim)
    }

    /// The planes' tensors: queries `[tokens, n_head, head_dim]`, keys and values `[tokens,
    /// kv_w]`, views of the op's output.
    pub(crate) fn split(&self, planes: &Tensor, tokens: usize) -> crate::Result<[Tensor; 3]> {
        let (q_w, kv_w) = self.widths();
        Ok([
            planes
                .narrow(0, 0, tokens * q_w)?
                .reshape((tokens, self.n_head, self.head_dim))?,
            planes
                .narrow(0, tokens * q_w, tokens * kv_w)?
                .reshape((tokens, kv_w))?,
            planes
                .narrow(0, tokens * (q_w + kv_w), tokens * kv_w)?
                .reshape((tokens, kv_w))?,
        ])
    }

    /// The input's rows, checked against the heads' width.
    fn tokens(&self, l: &Layout) -> candle_core::Result<usize> {
        let (q_w, kv_w) = self.widths();
        let (tokens, width) = l.shape().dims2()?;
        if width != q_w + 2 * kv_w {
            candle_core::bail!(
                "rope: rows of {width} values, expected {q_w} + 2 × {kv_w} (Q, K, V)"
            );
        }
        Ok(tokens)
    }
}

/// A small tensor's values on the host (the CPU side's parameters).
fn host_vec<T: candle_core::WithDType>(t: &Tensor) -> candle_core::Result<Vec<T>> {
    t.flatten_all()?.to_vec1::<T>()
}

impl CustomOp1 for RopeQk<'_> {
    fn name(&self) -> &'static str {
        "quarry-rope-qk"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let tokens = self.tokens(l)?;
        let rows = f32_values(s, l, "rope: the projection's output")?;
        let (q_w, kv_w) = self.widths();
        let width = q_w + 2 * kv_w;
        let half = self.head_dim / 2;
        let positions = host_vec::<u32>(self.positions)?;
        let (cos, sin) = (host_vec::<f32>(self.cos)?, host_vec::<f32>(self.sin)?);
        let bias = self.bias.map(host_vec::<f32>).transpose()?;
        let norms = match self.qk_norm {
            Some((q, k)) => Some((host_vec::<f32>(q)?, host_vec::<f32>(k)?)),
            None => None,
        };
        let mut out = vec![0f32; tokens * width];
        let (q_plane, rest) = out.split_at_mut(tokens * q_w);
        let (k_plane, v_plane) = rest.split_at_mut(tokens * kv_w);
        let mut row = vec![0f32; width];
        for (t, &pos) in positions.iter().enumerate().take(tokens) {
            row.copy_from_slice(&rows[t * width..(t + 1) * width]);
            if let Some(bias) = &bias {
                row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
            }
            let at = pos as usize * half;
            rotate_heads(
                &mut row[..q_w + kv_w],
                q_w,
                self.head_dim,
                self.style,
                (&cos[at..at + half], &sin[at..at + half]),
                norms
                    .as_ref()
                    .map(|(q, k)| (q.as_slice(), k.as_slice(), self.eps)),
            );
            q_plane[t * q_w..(t + 1) * q_w].copy_from_slice(&row[..q_w]);
            k_plane[t * kv_w..(t + 1) * kv_w].copy_from_slice(&row[q_w..q_w + kv_w]);
            v_plane[t * kv_w..(t + 1) * kv_w].copy_from_slice(&row[q_w + kv_w..]);
        }
        Ok((CpuStorage::F32(out), Shape::from(tokens * width)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let tokens = self.tokens(l)?;
        let (q_w, kv_w) = self.widths();
        let out = crate::cuda::rope(s, l, self, tokens, crate::cuda::RopeOut::Planes, None)?;
        Ok((out, Shape::from(tokens * (q_w + 2 * kv_w))))
    }
}

/// RoPE with the KV writes in one op: [`RopeQk`]'s work on the stacked Q/K/V output, returning
/// only the queries (`[tokens · q_w]` f32) and writing the keys and values into the pools' rows
/// at `slots` in the pools' element type, as [`crate::attention::StoreRows`] writes them:
/// `qkv.apply_op1_no_bwd(&RopeStore { .. })`. On a GPU one launch (`rope_store`,
/// kernels/rope_store.cu) where `RopeQk` and two `StoreRows` run three. candle lets an op write
/// one storage, so the op writes the pools from inside an in-place op on each (the key pool's,
/// and within it the value pool's): each storage written under candle's own write lock. On the
/// CPU, `RopeQk` then `StoreRows` on each pool.
///
/// With `gemv`, the op's input is the stacked Q/K/V projection's own input (`[tokens, inputs]`
/// f16, at most 8 rows) and its 8-bit GEMV computes the projection and does the op's work in its
/// epilogue, in one launch (`gemv_q8_rope`, kernels/gemv_q8.cu; no per-head norms): the step's
/// projection, RoPE and KV writes in one launch where there were two. On the CPU, the GEMV's
/// reference, then as above.
pub(crate) struct RopeStore<'a> {
    pub rope: RopeQk<'a>,
    /// The tokens' pool rows (u32, `[tokens]`).
    pub slots: &'a Tensor,
    pub k_pool: &'a Tensor,
    pub v_pool: &'a Tensor,
    /// The stacked projection's 8-bit matrix, where the op's input is the projection's input.
    pub gemv: Option<&'a crate::linear::Q8Rows>,
    /// With `gemv`: the norm before the projection, in the launch's prologue
    /// (`linear::Prologue`); the op's input is then the residual stream's f32 rows.
    pub norm: Option<crate::linear::Prologue<'a>>,
}

impl RopeStore<'_> {
    /// The input's rows: the projection's output's, checked against the heads' width, or with
    /// `gemv` the projection's input's, checked against the matrix.
    fn tokens(&self, l: &Layout, on_gpu: bool) -> candle_core::Result<usize> {
        match self.gemv {
            None => self.rope.tokens(l),
            Some(w) => {
                let (q_w, kv_w) = self.rope.widths();
                if w.outputs() != q_w + 2 * kv_w {
                    candle_core::bail!(
                        "rope: a projection of {} rows, expected {q_w} + 2 × {kv_w} (Q, K, V)",
                        w.outputs()
                    );
                }
                Ok(w.input_shape(l, on_gpu)?.0)
            }
        }
    }
}

impl CustomOp1 for RopeStore<'_> {
    fn name(&self) -> &'static str {
        "quarry-rope-store"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let tokens = self.tokens(l, false)?;
        let (q_w, kv_w) = self.rope.widths();
        let projected = match self.gemv {
            Some(w) => Some((
                CpuStorage::F32(w.sums_after(self.norm, s, l)?),
                Layout::contiguous((tokens, q_w + 2 * kv_w)),
            )),
            None => None,
        };
        let (s, l) = projected.as_ref().map_or((s, l), |(s, l)| (s, l));
        let (CpuStorage::F32(mut planes), _) = self.rope.cpu_fwd(s, l)? else {
            candle_core::bail!("rope: the planes are f32");
        };
        let plane = |at: usize| {
            Tensor::from_slice(
                &planes[at..at + tokens * kv_w],
                (tokens, kv_w),
                &candle_core::Device::Cpu,
            )
        };
        let store = crate::attention::StoreRows;
        self.k_pool
            .inplace_op3(&plane(tokens * q_w)?, self.slots, &store)?;
        self.v_pool
            .inplace_op3(&plane(tokens * (q_w + kv_w))?, self.slots, &store)?;
        planes.truncate(tokens * q_w);
        Ok((CpuStorage::F32(planes), Shape::from(tokens * q_w)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let tokens = self.tokens(l, true)?;
        // The nested write locks would wait on each other (a hang) if two of the storages were
        // one: an error instead.
        let (k, v) = (
            rope_store::address(self.k_pool),
            rope_store::address(self.v_pool),
        );
        if k == v || [k, v].contains(&std::ptr::from_ref(s).addr()) {
            candle_core::bail!(
                "rope: the key pool, the value pool and the input must be three storages"
            );
        }
        let queries = std::cell::Cell::new(None);
        self.k_pool.inplace_op1(&rope_store::WithKeys {
            op: self,
            qkv: (s, l),
            tokens,
            queries: &queries,
        })?;
        let Some(q) = queries.take() else {
            candle_core::bail!("rope: the queries were not written");
        };
        Ok((q, Shape::from(tokens * self.rope.widths().0)))
    }
}

/// [`RopeStore`]'s launch from inside the pools' in-place ops.
#[cfg(feature = "cuda")]
mod rope_store {
    use std::cell::Cell;

    use candle_core::{CpuStorage, CudaStorage, InplaceOp1, Layout};

    use super::RopeStore;
    use crate::cuda::RopeOut;

    /// The op on the key pool: runs [`WithValues`] on the value pool.
    pub(super) struct WithKeys<'a> {
        pub op: &'a RopeStore<'a>,
        pub qkv: (&'a CudaStorage, &'a Layout),
        pub tokens: usize,
        /// Where the launch leaves the queries.
        pub queries: &'a Cell<Option<CudaStorage>>,
    }

    /// The op on the value pool, holding the key pool's storage: the launch.
    struct WithValues<'a> {
        keys: &'a WithKeys<'a>,
        k: Cell<Option<(&'a mut CudaStorage, &'a Layout)>>,
    }

    /// Where a GPU tensor's storage lives (0 for another device's): two tensors of one storage
    /// have one address.
    pub(super) fn address(t: &candle_core::Tensor) -> usize {
        match &*t.storage_and_layout().0 {
            candle_core::Storage::Cuda(c) => std::ptr::from_ref(c).addr(),
            _ => 0,
        }
    }

    fn cpu_side() -> candle_core::Result<()> {
        candle_core::bail!(
            "rope: the pools' nested ops are the GPU's (the CPU runs RopeQk and StoreRows)"
        )
    }

    impl InplaceOp1 for WithKeys<'_> {
        fn name(&self) -> &'static str {
            "quarry-rope-store-keys"
        }

        fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
            cpu_side()
        }

        fn cuda_fwd(&self, k: &mut CudaStorage, lk: &Layout) -> candle_core::Result<()> {
            self.op.v_pool.inplace_op1(&WithValues {
                keys: self,
                k: Cell::new(Some((k, lk))),
            })
        }
    }

    impl InplaceOp1 for WithValues<'_> {
        fn name(&self) -> &'static str {
            "quarry-rope-store-values"
        }

        fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
            cpu_side()
        }

        fn cuda_fwd(&self, v: &mut CudaStorage, lv: &Layout) -> candle_core::Result<()> {
            let Some(k) = self.k.take() else {
                candle_core::bail!("rope: the key pool was taken");
            };
            let (s, l) = self.keys.qkv;
            let to = RopeOut::Pools {
                slots: self.keys.op.slots,
                k,
                v: (v, lv),
            };
            let op = self.keys.op;
            let norm = op.norm.map(|p| (p.weight, p.eps));
            let gemv = op.gemv.map(|w| (w.parts(), norm));
            let q = crate::cuda::rope(s, l, &op.rope, self.keys.tokens, to, gemv)?;
            self.keys.queries.set(Some(q));
            Ok(())
        }
    }
}

impl Norm<'_> {
    fn shape(&self, l: &Layout) -> candle_core::Result<(usize, usize)> {
        let width = l.shape().dims().last().copied().unwrap_or(0);
        if width != self.weight.elem_count() || !matches!(self.out, DType::F32 | DType::F16) {
            candle_core::bail!(
                "norm: rows of {width} values with a weight of {}, into {:?}",
                self.weight.elem_count(),
                self.out
            );
        }
        Ok((l.shape().elem_count() / width.max(1), width))
    }
}

impl CustomOp1 for Norm<'_> {
    fn name(&self) -> &'static str {
        "quarry-rms-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, width) = self.shape(l)?;
        let mut x = f32_values(s, l, "norm: the input")?;
        let w = host_vec::<f32>(self.weight)?;
        for row in x.chunks_exact_mut(width.max(1)) {
            rms_norm_row(row, &w, self.eps);
        }
        Ok((cpu_in(x, self.out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, width) = self.shape(l)?;
        let out = crate::cuda::rms_norm(s, l, self, rows, width)?;
        Ok((out, l.shape().clone()))
    }
}

/// `x += y` in place: `x` the f32 residual stream, `y` a projection's output of its shape (f32,
/// or f16 from the dense weights' GEMM), both contiguous: `x.inplace_op2(&y, &AddInto)`. On a GPU
/// one launch where candle ran a cast and an add into a new tensor.
pub(crate) struct AddInto;

impl AddInto {
    fn check(lx: &Layout, ly: &Layout) -> candle_core::Result<()> {
        if lx.shape() != ly.shape() || !lx.is_contiguous() || !ly.is_contiguous() {
            candle_core::bail!(
                "add: {:?} and {:?} must be contiguous of one shape",
                lx.shape(),
                ly.shape()
            );
        }
        Ok(())
    }
}

impl InplaceOp2 for AddInto {
    fn name(&self) -> &'static str {
        "quarry-add-into"
    }

    fn cpu_fwd(
        &self,
        x: &mut CpuStorage,
        lx: &Layout,
        y: &CpuStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        Self::check(lx, ly)?;
        let y = f32_values(y, ly, "add: the projection's output")?;
        crate::host_mem::add_into_stream(x, lx, &y, "add")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &mut candle_core::CudaStorage,
        lx: &Layout,
        y: &candle_core::CudaStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        Self::check(lx, ly)?;
        crate::cuda::add_into(x, lx, y, ly)
    }
}

/// Steps of at most this many new tokens (their graph's bucket) take the GEMM-add and RoPE-store
/// fusions and the split-K attention on a GPU unless a variable says otherwise
/// ([`Fusions::small_steps`]): together they made a decode step 1.44x faster at batch 1 and 1.20x
/// at batch 8, the same at 32 and 512, and 0.95x at 128 (H200, SmolLM2, `quarry bench` mode a,
/// 2026-11-28; 1.45x at batch 1 on an H100, 2026-11-27). BENCHMARKS.md has the runs.
pub const SMALL_STEP_TOKENS: usize = 16;

/// The tensor forward's optional fusions, each fewer launches for the same work (docs/gpu.md),
/// as [`ModelOptions`] chose them ([`Fusions::from_options`], [`crate::Llama::set_fusions`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fusions {
    /// The projections' epilogues in their own launch (a GPU's): the output and down
    /// projections add into the residual stream (the dense weights' GEMM, `linear::GemmAdd`,
    /// and the 8-bit GEMV's adding form), the 8-bit GEMV's gate/up projection applies the
    /// activation (`linear::Q8Rows::glu`) and, with `rope_store`, its Q/K/V projection rotates
    /// and writes the keys and values ([`RopeStore`] with `gemv`).
    pub gemm_add: bool,
    /// The residual add writes the next norm where its rows are f32 ([`AddNorm`]).
    pub add_norm: bool,
    /// RoPE writes the keys and values into the pools itself ([`RopeStore`]).
    pub rope_store: bool,
    /// Where `gemm_add` is on, the 8-bit GEMV's steps of 1 or 2 rows normalize the stream in
    /// their own launch (`linear::Prologue`).
    pub gemv_norm: bool,
    /// Split-K attention combines its chunks in the chunks' launch, the last block of each
    /// (token, key-value head) to finish doing its query heads' (`combine_if_last` in
    /// kernels/paged_attention.cu): one launch a layer fewer on split steps.
    pub split_combine: bool,
    /// GEMM add and RoPE store for GPU steps of at most [`SMALL_STEP_TOKENS`] tokens, where they
    /// measured faster ([`Fusions::for_step`]): where both options are `auto` (the default;
    /// either `on` or `off` decides for every step).
    pub small_steps: bool,
}

impl Fusions {
    /// The fusions `options` choose.
    pub fn from_options(options: &ModelOptions) -> Self {
        Self {
            gemm_add: options.gemm_add == Switch::On,
            add_norm: options.add_norm,
            rope_store: options.rope_store == Switch::On,
            gemv_norm: options.gemv_norm,
            split_combine: options.split_combine,
            small_steps: options.gemm_add == Switch::Auto && options.rope_store == Switch::Auto,
        }
    }

    /// The fusions a GPU step of `tokens` new tokens takes: [`Fusions::small_steps`] turns the
    /// GEMM add and the RoPE store on at most [`SMALL_STEP_TOKENS`].
    pub fn for_step(self, tokens: usize) -> Self {
        if self.small_steps && tokens <= SMALL_STEP_TOKENS {
            Self {
                gemm_add: true,
                rope_store: true,
                ..self
            }
        } else {
            self
        }
    }
}

impl AddNorm<'_> {
    /// `(rows, width)`, or the error naming the shapes.
    fn shape(&self, lxh: &Layout, ly: &Layout) -> candle_core::Result<(usize, usize)> {
        let (xh, y) = (lxh.shape().dims(), ly.shape().dims());
        let width = self.weight.elem_count();
        match (xh, y) {
            (&[r2, w1], &[r, w2])
                if r2 == 2 * r
                    && w1 == width
                    && w2 == width
                    && lxh.is_contiguous()
                    && ly.is_contiguous() =>
            {
                Ok((r, width))
            }
            _ => candle_core::bail!(
                "add and norm: a contiguous stream with room for its norm ({xh:?}) and a \
                 contiguous projection output ({y:?}) of {width} values a row"
            ),
        }
    }
}

impl InplaceOp2 for AddNorm<'_> {
    fn name(&self) -> &'static str {
        "quarry-add-norm"
    }

    fn cpu_fwd(
        &self,
        xh: &mut CpuStorage,
        lxh: &Layout,
        y: &CpuStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        let (rows, width) = self.shape(lxh, ly)?;
        let y = f32_values(y, ly, "add and norm: the projection's output")?;
        let w = host_vec::<f32>(self.weight)?;
        let CpuStorage::F32(xh) = xh else {
            candle_core::bail!("add and norm: the residual stream must be f32");
        };
        let at = lxh.start_offset();
        let (x, h) = xh[at..at + 2 * rows * width].split_at_mut(rows * width);
        for (x, y) in x.iter_mut().zip(&y) {
            *x += y;
        }
        h.copy_from_slice(x);
        for row in h.chunks_exact_mut(width.max(1)) {
            rms_norm_row(row, &w, self.eps);
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xh: &mut candle_core::CudaStorage,
        lxh: &Layout,
        y: &candle_core::CudaStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        let (rows, width) = self.shape(lxh, ly)?;
        crate::cuda::add_norm(xh, lxh, y, ly, self, rows, width)
    }
}

/// f32 values as a CPU storage of `dtype` (f32 or f16).
fn cpu_in(x: Vec<f32>, dtype: DType) -> CpuStorage {
    match dtype {
        DType::F16 => CpuStorage::F16(x.into_iter().map(half::f16::from_f32).collect()),
        _ => CpuStorage::F32(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::testing::{relative_error, values};
    use candle_core::Device;

    /// Each option reaches its fusion, and a small step's GEMM add and RoPE store keep the
    /// fusions that are not theirs.
    #[test]
    fn the_options_choose_the_fusions() {
        let defaults = Fusions::from_options(&ModelOptions::default());
        assert_eq!(
            defaults,
            Fusions {
                gemv_norm: true,
                small_steps: true,
                ..Fusions::default()
            }
        );
        let mut options = ModelOptions::default();
        for pair in [
            "split_combine=on",
            "add_norm=on",
            "gemv_norm=off",
            "gemm_add=on",
        ] {
            options.set_pair(pair).unwrap();
        }
        let chosen = Fusions::from_options(&options);
        assert_eq!(
            chosen,
            Fusions {
                gemm_add: true,
                add_norm: true,
                split_combine: true,
                ..Fusions::default()
            }
        );
        let small = Fusions {
            split_combine: true,
            ..defaults
        }
        .for_step(1);
        assert!(small.gemm_add && small.rope_store && small.split_combine && small.gemv_norm);
        assert!(!defaults.for_step(SMALL_STEP_TOKENS + 1).gemm_add);
    }

    /// The op gives what candle's ops gave the tensor forward pass before it (a cast, the bias
    /// add, `rms_norm` per head, `rope_i` or `rope` on the queries and keys), laid out as its
    /// three planes, for both pair styles, with and without bias and norms, from f32 and f16.
    #[test]
    fn rope_qk_equals_candles_ops_in_planes() {
        let dev = Device::Cpu;
        let (tokens, context, eps) = (5, 40, 1e-6);
        for (n_head, n_kv, head_dim, style, extras, input) in [
            (6, 2, 16, RopeStyle::Interleaved, false, DType::F16),
            (6, 2, 16, RopeStyle::Halves, true, DType::F32),
            (4, 1, 32, RopeStyle::Halves, true, DType::F16),
        ] {
            let (q_w, kv_w) = (n_head * head_dim, n_kv * head_dim);
            let width = q_w + 2 * kv_w;
            let half = head_dim / 2;
            let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &dev).unwrap();
            let x = t(values(7, tokens * width, -3.0, 3.0), &[tokens, width])
                .to_dtype(input)
                .unwrap();
            let positions: Vec<u32> = vec![0, 3, 39, 17, 8];
            let pos = Tensor::from_slice(&positions, tokens, &dev).unwrap();
            let cos = t(values(8, context * half, -1.0, 1.0), &[context, half]);
            let sin = t(values(9, context * half, -1.0, 1.0), &[context, half]);
            let bias = t(values(10, width, -1.0, 1.0), &[width]);
            let (qn, kn) = (
                t(values(11, head_dim, 0.5, 1.5), &[head_dim]),
                t(values(12, head_dim, 0.5, 1.5), &[head_dim]),
            );
            let op = RopeQk {
                n_head,
                n_kv,
                head_dim,
                style,
                positions: &pos,
                cos: &cos,
                sin: &sin,
                bias: extras.then_some(&bias),
                qk_norm: extras.then_some((&qn, &kn)),
                eps,
            };
            let planes = x.apply_op1_no_bwd(&op).unwrap();
            let [q, k, v] = op.split(&planes, tokens).unwrap();
            assert_eq!(q.dims(), [tokens, n_head, head_dim]);

            // candle's ops, as forward_tensor ran them.
            let mut y = x.to_dtype(DType::F32).unwrap();
            if extras {
                y = y.broadcast_add(&bias).unwrap();
            }
            let tab = |tab: &Tensor| {
                tab.index_select(&pos, 0)
                    .unwrap()
                    .reshape((tokens, 1, half))
                    .unwrap()
            };
            let (c, s) = (tab(&cos), tab(&sin));
            let rope = |at: usize, n: usize, norm: &Tensor| {
                let mut h = y
                    .narrow(1, at, n * head_dim)
                    .unwrap()
                    .reshape((tokens, n, head_dim))
                    .unwrap();
                if extras {
                    h = candle_nn::ops::rms_norm(&h.contiguous().unwrap(), norm, eps).unwrap();
                }
                let h = h
                    .reshape((tokens, n, 1, head_dim))
                    .unwrap()
                    .contiguous()
                    .unwrap();
                match style {
                    RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&h, &c, &s),
                    RopeStyle::Halves => candle_nn::rotary_emb::rope(&h, &c, &s),
                }
                .unwrap()
            };
            let v_want = y.narrow(1, q_w + kv_w, kv_w).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (got, want, what) in [
                (&q, rope(0, n_head, &qn), "queries"),
                (&k, rope(q_w, n_kv, &kn), "keys"),
                (&v, v_want, "values"),
            ] {
                let err = relative_error(&flat(got), &flat(&want));
                assert!(
                    err < 1e-6,
                    "{style:?}, extras {extras}, {input:?}: {what} off by {err:.2e}"
                );
            }
        }
    }

    /// `RopeStore` on the stacked projection's input with its 8-bit matrix (`gemv`) does what
    /// it does on the matrix's output: the same queries and pool rows (the CPU side is the GEMV's
    /// reference, then the same op). A matrix of another height is refused, naming both.
    #[test]
    fn rope_store_through_the_gemv_equals_it_after_the_gemv() {
        use crate::linear::Q8Rows;
        use candle_core::quantized::{GgmlDType, QTensor};
        let dev = Device::Cpu;
        let (n_head, n_kv, head_dim, inputs, context, tokens) = (4, 2, 16, 64, 20, 3);
        let (q_w, kv_w) = (n_head * head_dim, n_kv * head_dim);
        let width = q_w + 2 * kv_w;
        let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &dev).unwrap();
        let q8 = |rows: usize| {
            let w = t(values(3, rows * inputs, -1.0, 1.0), &[rows, inputs]);
            Q8Rows::from_q8_0(&QTensor::quantize(&w, GgmlDType::Q8_0).unwrap(), &dev).unwrap()
        };
        let matrix = q8(width);
        let h = t(values(4, tokens * inputs, -2.0, 2.0), &[tokens, inputs])
            .to_dtype(DType::F16)
            .unwrap();
        let pos = Tensor::from_slice(&[2u32, 19, 7], tokens, &dev).unwrap();
        let slots = Tensor::from_slice(&[11u32, 0, 5], tokens, &dev).unwrap();
        let half = head_dim / 2;
        let cos = t(values(8, context * half, -1.0, 1.0), &[context, half]);
        let sin = t(values(9, context * half, -1.0, 1.0), &[context, half]);
        let bias = t(values(10, width, -1.0, 1.0), &[width]);
        let pool = || t(values(12, context * kv_w, -1.0, 1.0), &[context, kv_w]);
        let (k_one, v_one, k_two, v_two) = (pool(), pool(), pool(), pool());
        let rope = || RopeQk {
            n_head,
            n_kv,
            head_dim,
            style: RopeStyle::Halves,
            positions: &pos,
            cos: &cos,
            sin: &sin,
            bias: Some(&bias),
            qk_norm: None,
            eps: 1e-6,
        };
        let store = |k_pool, v_pool, gemv| RopeStore {
            rope: rope(),
            slots: &slots,
            k_pool,
            v_pool,
            gemv,
            norm: None,
        };
        let after = matrix.forward(&h).unwrap();
        let want = after
            .apply_op1_no_bwd(&store(&k_two, &v_two, None))
            .unwrap();
        let got = h
            .apply_op1_no_bwd(&store(&k_one, &v_one, Some(&matrix)))
            .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&got), flat(&want), "the queries");
        assert_eq!(flat(&k_one), flat(&k_two), "the keys");
        assert_eq!(flat(&v_one), flat(&v_two), "the values");
        assert_ne!(flat(&k_one), flat(&pool()), "no key written");
        // With the norm in the prologue: the stream's rows in, what the norm then the GEMV give.
        let weight = t(values(13, inputs, 0.5, 1.5), &[inputs]);
        let stream = t(values(14, tokens * inputs, -3.0, 3.0), &[tokens, inputs]);
        let h = stream
            .apply_op1_no_bwd(&Norm {
                weight: &weight,
                eps: 1e-5,
                out: DType::F16,
            })
            .unwrap();
        let (k_three, v_three) = (pool(), pool());
        let want = h
            .apply_op1_no_bwd(&store(&k_one, &v_one, Some(&matrix)))
            .unwrap();
        let normed = RopeStore {
            norm: Some(crate::linear::Prologue {
                weight: &weight,
                eps: 1e-5,
            }),
            ..store(&k_three, &v_three, Some(&matrix))
        };
        let got = stream.apply_op1_no_bwd(&normed).unwrap();
        assert_eq!(flat(&got), flat(&want), "the queries after the prologue");
        assert_eq!(flat(&k_three), flat(&k_one), "the keys after the prologue");
        assert_eq!(
            flat(&v_three),
            flat(&v_one),
            "the values after the prologue"
        );
        let short = q8(width - 32);
        let err = h
            .apply_op1_no_bwd(&store(&k_one, &v_one, Some(&short)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("64 + 2 × 32"), "{err}");
    }
}
