//! The forward pass's fused ops on a GPU (`kernels/rope_store.cu`, `residual.cu`, `glu.cu`):
//! the launchers behind the candle ops of `llama/fused.rs` and `glu.rs`, reading and writing
//! tensors in the element types around them.

use candle_core::cuda::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda::CudaStorage;
use candle_core::cuda::WrapErr;
use candle_core::{DType, Layout, Result, Storage, Tensor};

use super::gemv::{GemvLaunch, GemvOperands};

const GLU_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/glu.ptx"));
const ROPE_STORE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/rope_store.ptx"));
const RESIDUAL_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/residual.ptx"));
/// Threads per block of `rms_norm` (its `NORM_THREADS`): a block per row.
const NORM_THREADS: u32 = 256;
/// Threads per block of the element-wise kernels (GLU, the KV writes) and of `rope_qk`.
const ELEMENTWISE_THREADS: u32 = 256;

/// A grid-stride launch over `n` values.
fn elementwise(n: usize) -> LaunchConfig {
    let blocks = (n as u64)
        .div_ceil(ELEMENTWISE_THREADS as u64)
        .clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The contiguous values a layout addresses in a storage, as a kernel argument.
pub(super) fn view<'a, T: candle_core::cuda::CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what} must be contiguous");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// A tensor's storage, held for a launch that reads it, and its layout.
pub(super) fn held(t: &Tensor) -> (impl std::ops::Deref<Target = Storage> + '_, &Layout) {
    t.storage_and_layout()
}

/// [`view`] of a held tensor's values (a launch's parameter tensor).
pub(super) fn held_view<'a, T: candle_core::cuda::CudaDType>(
    storage: &'a impl std::ops::Deref<Target = Storage>,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match &**storage {
        Storage::Cuda(c) => view::<T>(c, l, what),
        _ => candle_core::bail!("{what} must be on the GPU"),
    }
}

/// Pushes the values storage `$s` and layout `$l` address (f32, else f16) on the builder `$b`;
/// `$x32` and `$x16` are the caller's (declared, unset) bindings that keep the view alive.
macro_rules! arg_f32_or_f16 {
    ($b:ident, $s:expr, $l:expr, $what:expr, $x32:ident, $x16:ident) => {
        match &$s.slice {
            candle_core::cuda::CudaStorageSlice::F32(_) => {
                $x32 = view::<f32>($s, $l, $what)?;
                $b.arg(&$x32)
            }
            _ => {
                $x16 = view::<half::f16>($s, $l, $what)?;
                $b.arg(&$x16)
            }
        }
    };
}
pub(super) use arg_f32_or_f16;

/// Launches `func(x, y, ...)` (a kernel `{prefix}_{input}_{output}`, [`in_out_name`]): `x` the
/// values storage `$s` and layout `$l` address (f32 or f16), `y` a new tensor of `$n` values of
/// `$out` (f32 or f16), then the arguments `$more` pushes on the builder `$b`; evaluates to `y`.
/// The caller's SAFETY: `func` has exactly that signature for both element types and writes
/// every value of `y`.
macro_rules! in_out_launch {
    (@one $in:ty, $o:ty, $s:ident, $l:ident, $func:ident, $n:expr, $cfg:expr, $what:expr,
     |$b:ident| $more:block) => {{
        let x = view::<$in>($s, $l, $what)?;
        let mut y = $s.device.alloc::<$o>(($n).max(1))?;
        if $n > 0 {
            let mut $b = $func.builder();
            $b.arg(&x).arg(&mut y);
            $more
            $b.launch($cfg).w()?;
        }
        CudaStorage::wrap_cuda_slice(y, $s.device.clone())
    }};
    ($s:ident, $l:ident, $out:expr, $func:ident, $n:expr, $cfg:expr, $what:expr,
     |$b:ident| $more:block) => {{
        use candle_core::cuda::CudaStorageSlice as S;
        match (&$s.slice, $out) {
            (S::F32(_), DType::F32) => {
                in_out_launch!(@one f32, f32, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            (S::F32(_), _) => {
                in_out_launch!(@one f32, half::f16, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            (_, DType::F32) => {
                in_out_launch!(@one half::f16, f32, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            _ => in_out_launch!(@one half::f16, half::f16, $s, $l, $func, $n, $cfg, $what, |$b| $more),
        }
    }};
}

/// `act(gate) · up` from the stacked gate/up output (`[rows, 2f]`, f32 or f16) into a new
/// `[rows, f]` of `out` (f32 or f16), one launch of `kernels/glu.cu`.
pub fn glu(
    s: &CudaStorage,
    l: &Layout,
    act: crate::config::Activation,
    out: DType,
    rows: usize,
    f: usize,
) -> Result<CudaStorage> {
    let func = s.device.get_or_load_custom_func(
        &in_out_name(&format!("glu_{}", act_name(act)), s, out)?,
        "quarry_glu",
        GLU_PTX,
    )?;
    let (rows64, f64) = (rows as u64, f as u64);
    // SAFETY: the arguments match `glu_*` in kernels/glu.cu; the input holds `rows` rows of 2f
    // values, the output `rows · f`, every one of which the kernel writes.
    Ok(unsafe {
        in_out_launch!(
            s,
            l,
            out,
            func,
            rows * f,
            elementwise(rows * f),
            "glu: the gate/up output",
            |b| {
                b.arg(&rows64).arg(&f64);
            }
        )
    })
}

/// The kernels' name for an activation (`glu_{act}_…`, `gemv_q8_glu_{act}_…`).
pub(super) fn act_name(act: crate::config::Activation) -> &'static str {
    match act {
        crate::config::Activation::Silu => "silu",
        crate::config::Activation::GeluTanh => "gelu_tanh",
    }
}

/// The kernels' name for an f32 or f16 element type.
pub(super) fn dtype_name(d: DType) -> &'static str {
    if d == DType::F16 {
        "f16"
    } else {
        "f32"
    }
}

/// The kernel `{prefix}_{input}_{output}` for an f32 or f16 input and output.
fn in_out_name(prefix: &str, s: &CudaStorage, out: DType) -> Result<String> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda::CudaStorageSlice as S;
    match (&s.slice, out) {
        (S::F32(_) | S::F16(_), DType::F32 | DType::F16) => Ok(format!(
            "{prefix}_{}_{}",
            dtype_name(s.dtype()),
            dtype_name(out)
        )),
        (_, out) => candle_core::bail!(
            "{prefix}: f32 or f16 in and out, not {:?} to {out:?}",
            s.dtype()
        ),
    }
}

/// The 8-bit GEMV that computes [`rope`]'s input in the same launch: the stacked projection's
/// repacked values and scales with its prefetch's trips ([`crate::linear::Q8Rows::parts`]), and
/// the norm of its prologue (weight, epsilon) where the launch normalizes the stream's rows
/// first.
pub(crate) type RopeGemv<'a> = ((&'a Tensor, &'a Tensor, i32), Option<(&'a Tensor, f32)>);

/// Where [`rope`] writes the keys and values.
pub(crate) enum RopeOut<'a> {
    /// Planes after the queries, in the op's output ([`crate::op_args::RopeQk`]).
    Planes,
    /// The pools' rows at the tokens' slots (`[tokens]` u32), in the pools' element type
    /// ([`crate::llama::RopeStore`]).
    Pools {
        slots: &'a candle_core::Tensor,
        k: (&'a mut CudaStorage, &'a Layout),
        v: (&'a mut CudaStorage, &'a Layout),
    },
}

/// Pushes the pool rows a layout addresses from its start (f32, f16 or bf16) on the builder `$b`;
/// `$p32`, `$p16` and `$pb16` are the caller's (declared, unset) bindings that keep the view
/// alive.
macro_rules! arg_pool {
    ($b:ident, $pool:expr, $start:expr, $p32:ident, $p16:ident, $pb16:ident) => {
        match &mut $pool.slice {
            candle_core::cuda::CudaStorageSlice::F32(p) => {
                $p32 = p.slice_mut($start..);
                $b.arg(&mut $p32)
            }
            candle_core::cuda::CudaStorageSlice::F16(p) => {
                $p16 = p.slice_mut($start..);
                $b.arg(&mut $p16)
            }
            candle_core::cuda::CudaStorageSlice::BF16(p) => {
                $pb16 = p.slice_mut($start..);
                $b.arg(&mut $pb16)
            }
            _ => candle_core::bail!("pools are f32, f16 or bf16"),
        }
    };
}

/// A pool's element type, as the kernels name it.
fn pool_type(pool: &CudaStorage) -> Result<&'static str> {
    use candle_core::cuda::CudaStorageSlice as S;
    Ok(match &pool.slice {
        S::F32(_) => "f32",
        S::F16(_) => "f16",
        S::BF16(_) => "bf16",
        _ => candle_core::bail!("pools are f32, f16 or bf16"),
    })
}

/// The attention's inputs from the stacked Q/K/V output (`s`, `[tokens, width]`, f32 or f16), in
/// one launch (`kernels/rope_store.cu`): `rope_qk`, returning the f32 planes of
/// [`crate::op_args::RopeQk`], or with [`RopeOut::Pools`] `rope_store`, returning the queries'
/// plane (`tokens · q_w` f32) and writing the keys and values into the pools. With `gemv` (the
/// stacked projection's repacked Q8_0 values and scales), `s` is the projection's input
/// (`[tokens, inputs]` f16, at most 8 rows) and the 8-bit GEMV's launch does `rope_store`'s work
/// in its epilogue (`gemv_q8_rope`, kernels/gemv_q8.cu: pools only, no per-head norms); with a
/// norm as well (its weight and epsilon), `s` is the stream's f32 rows (at most 2), normalized
/// in the launch's prologue (`gemv_q8_norm_rope`).
pub(crate) fn rope(
    s: &CudaStorage,
    l: &Layout,
    op: &crate::op_args::RopeQk<'_>,
    tokens: usize,
    to: RopeOut<'_>,
    gemv: Option<RopeGemv<'_>>,
) -> Result<CudaStorage> {
    use candle_core::cuda::CudaStorageSlice as S;
    let dev = &s.device;
    let (q_w, kv_w) = (op.n_head * op.head_dim, op.n_kv * op.head_dim);
    let width = q_w + 2 * kv_w;
    let input = match &s.slice {
        S::F32(_) => "f32",
        S::F16(_) => "f16",
        _ => candle_core::bail!("rope: the projection's output must be f32 or f16"),
    };
    let (name, out_len) = match &to {
        RopeOut::Planes => (format!("rope_qk_{input}"), tokens * width),
        RopeOut::Pools { k, v, .. } => {
            let pool = pool_type(k.0)?;
            if pool_type(v.0)? != pool {
                candle_core::bail!("rope: the key and value pools differ in type");
            }
            (pool.to_owned(), tokens * q_w)
        }
    };
    // The launch: `rope_qk`/`rope_store` a block per token, or the GEMV's.
    let (func, cfg, gemv_sizes) = match (gemv, &to) {
        (None, _) => {
            let name = match &to {
                RopeOut::Planes => name,
                RopeOut::Pools { .. } => format!("rope_store_{input}_{name}"),
            };
            let shared = (width * 4) as u32;
            if shared > 48 * 1024 {
                candle_core::bail!("rope: rows of {width} values exceed a block's shared memory");
            }
            let cfg = LaunchConfig {
                grid_dim: (tokens as u32, 1, 1),
                block_dim: (ELEMENTWISE_THREADS, 1, 1),
                shared_mem_bytes: shared,
            };
            ((name, "quarry_rope_store", ROPE_STORE_PTX), cfg, None)
        }
        (Some(((q, scales, ahead), norm)), RopeOut::Pools { .. })
            if input == if norm.is_some() { "f32" } else { "f16" } && op.qk_norm.is_none() =>
        {
            if q.dims()[0] != width {
                candle_core::bail!("rope: a GEMV of {} rows for {width} values", q.dims()[0]);
            }
            let inputs = l.shape().dims().last().copied().unwrap_or(0);
            let x = GemvOperands {
                s,
                l,
                q,
                scales,
                rows: tokens,
                inputs,
                ahead,
            };
            let Some(g) = GemvLaunch::new(&x, ("_rope", &format!("_{name}")), width / 2, norm)?
            else {
                // SAFETY: no token, nothing to write.
                return Ok(CudaStorage::wrap_cuda_slice(
                    unsafe { dev.alloc::<f32>(1) }?,
                    dev.clone(),
                ));
            };
            (
                (g.name, g.module.0, g.module.1),
                g.cfg,
                Some((g.inputs, g.rows, g.ahead, g.norm)),
            )
        }
        (Some(_), _) => candle_core::bail!(
            "rope: the GEMV's epilogue writes the pools from f16 input (the stream's f32 rows \
             with a norm), without per-head norms"
        ),
    };
    // The parameters, held while the launch reads them; absent ones are null pointers.
    let positions = held(op.positions);
    let (cos, sin) = (held(op.cos), held(op.sin));
    let bias = op.bias.map(held);
    let norms = op.qk_norm.map(|(q, k)| (held(q), held(k)));
    let slots = match &to {
        RopeOut::Pools { slots, .. } => Some(held(slots)),
        RopeOut::Planes => None,
    };
    let positions = held_view::<u32>(&positions.0, positions.1, "rope: positions")?;
    let cos = held_view::<f32>(&cos.0, cos.1, "rope: cos")?;
    let sin = held_view::<f32>(&sin.0, sin.1, "rope: sin")?;
    let bias = match &bias {
        Some((g, l)) => Some(held_view::<f32>(g, l, "rope: bias")?),
        None => None,
    };
    let norms = match &norms {
        Some(((qg, ql), (kg, kl))) => Some((
            held_view::<f32>(qg, ql, "rope: q norm")?,
            held_view::<f32>(kg, kl, "rope: k norm")?,
        )),
        None => None,
    };
    let slots = match &slots {
        Some((g, l)) => Some(held_view::<u32>(g, l, "rope: slots")?),
        None => None,
    };
    // SAFETY: the kernel writes every value of its output (the planes, or the queries).
    let mut out = unsafe { dev.alloc::<f32>(out_len.max(1)) }?;
    if tokens == 0 {
        return Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    }
    let null = 0u64;
    let (tokens32, n_head, n_kv, head_dim) = (
        tokens as i32,
        op.n_head as i32,
        op.n_kv as i32,
        op.head_dim as i32,
    );
    let interleaved = i32::from(op.style == crate::config::RopeStyle::Interleaved);
    let matrix = gemv.map(|((q, scales, _), _)| (held(q), held(scales)));
    let norm_w = gemv_sizes
        .as_ref()
        .and_then(|(_, _, _, norm)| norm.map(|(w, _)| held(w)));
    let norm_w = match &norm_w {
        Some((h, l)) => Some(held_view::<f32>(h, l, "rope: the norm's weight")?),
        None => None,
    };
    let matrix = match &matrix {
        Some(((qg, ql), (sg, sl))) => Some((
            held_view::<u8>(qg, ql, "rope: the GEMV's weights")?,
            held_view::<half::f16>(sg, sl, "rope: the GEMV's scales")?,
        )),
        None => None,
    };
    let (x32, x16);
    let func = dev.get_or_load_custom_func(&func.0, func.1, func.2)?;
    let mut b = func.builder();
    if let Some((q, scales)) = &matrix {
        b.arg(q).arg(scales);
    }
    arg_f32_or_f16!(b, s, l, "rope: the projection's output", x32, x16);
    match &bias {
        Some(bias) => b.arg(bias),
        None => b.arg(&null),
    };
    match (&norms, &gemv_sizes) {
        (_, Some(_)) => &mut b,
        (Some((q, k)), None) => b.arg(q).arg(k),
        (None, None) => b.arg(&null).arg(&null),
    };
    b.arg(&cos).arg(&sin).arg(&positions);
    let (mut k32, mut k16, mut kb16, mut v32, mut v16, mut vb16);
    match (to, &slots) {
        (RopeOut::Planes, _) => {
            b.arg(&mut out).arg(&tokens32);
        }
        (RopeOut::Pools { k, v, .. }, Some(slots)) => {
            b.arg(slots).arg(&mut out);
            arg_pool!(b, k.0, k.1.start_offset(), k32, k16, kb16);
            arg_pool!(b, v.0, v.1.start_offset(), v32, v16, vb16);
        }
        (RopeOut::Pools { .. }, None) => unreachable!("held above"),
    }
    b.arg(&n_head).arg(&n_kv).arg(&head_dim).arg(&interleaved);
    match &gemv_sizes {
        Some((inputs, rows, ahead, _)) => b.arg(inputs).arg(rows).arg(ahead),
        None => b.arg(&op.eps),
    };
    if let (Some(w), Some((_, _, _, Some((_, eps))))) = (&norm_w, &gemv_sizes) {
        b.arg(w).arg(eps);
    }
    // SAFETY: the arguments match `rope_qk_*` or `rope_store_*` in kernels/rope_store.cu, or
    // `gemv_q8_rope_*` in kernels/gemv_q8.cu (the matrix `width` rows of `inputs` values, the
    // input `tokens` aligned rows of them); the input holds `tokens` rows of `width`, the bias
    // `width` values, each norm `head_dim`, the tables cover every position (the plan checked
    // them against the context length) and the slots name rows of the pools (the plan checked
    // them against the pool's size).
    unsafe { b.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// Each row of `s` (`rows` × `width`, f32 or f16) normalized by [`crate::op_args::Norm`]'s weight,
/// into a new tensor of its `out` type: one launch of `rms_norm` (`kernels/residual.cu`).
pub(crate) fn rms_norm(
    s: &CudaStorage,
    l: &Layout,
    op: &crate::op_args::Norm<'_>,
    rows: usize,
    width: usize,
) -> Result<CudaStorage> {
    let func = s.device.get_or_load_custom_func(
        &in_out_name("rms_norm", s, op.out)?,
        "quarry_residual",
        RESIDUAL_PTX,
    )?;
    let weight = held(op.weight);
    let weight = held_view::<f32>(&weight.0, weight.1, "norm: the weight")?;
    let cfg = LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (NORM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let width32 = width as i32;
    // SAFETY: the arguments match `rms_norm_*` in kernels/residual.cu; the input holds `rows`
    // rows of `width` values, the weight `width`, and the kernel writes every value of the output.
    Ok(unsafe {
        in_out_launch!(
            s,
            l,
            op.out,
            func,
            rows * width,
            cfg,
            "norm: the input",
            |b| {
                b.arg(&weight).arg(&width32).arg(&op.eps);
            }
        )
    })
}

/// `x += y` over their values (x f32, y f32 or f16, contiguous, one shape): one launch of
/// `add_into` (`kernels/residual.cu`).
pub(crate) fn add_into(
    x: &mut CudaStorage,
    lx: &Layout,
    y: &CudaStorage,
    ly: &Layout,
) -> Result<()> {
    use candle_core::cuda::CudaStorageSlice as S;
    let n = ly.shape().elem_count();
    if n == 0 {
        return Ok(());
    }
    let dev = x.device.clone();
    let name = match &y.slice {
        S::F32(_) => "add_into_f32",
        S::F16(_) => "add_into_f16",
        _ => candle_core::bail!("add: the projection's output must be f32 or f16"),
    };
    let func = dev.get_or_load_custom_func(name, "quarry_residual", RESIDUAL_PTX)?;
    let start = lx.start_offset();
    let S::F32(xs) = &mut x.slice else {
        candle_core::bail!("add: the residual stream must be f32");
    };
    let mut xs = xs.slice_mut(start..start + n);
    let n64 = n as u64;
    let (y32, y16);
    let mut b = func.builder();
    b.arg(&mut xs);
    arg_f32_or_f16!(b, y, ly, "add: the projection's output", y32, y16);
    b.arg(&n64);
    // SAFETY: the arguments match `add_into_*`; both hold `n` values.
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(())
}

/// `x += y`, then each of `x`'s new rows normalized by [`crate::op_args::AddNorm`]'s weight into
/// the rows after them: `xh` the stream's `rows` rows of `width` f32 values, then room for as many
/// (contiguous), `y` `rows` × `width` f32 or f16. One launch of `add_norm` (`kernels/residual.cu`).
pub(crate) fn add_norm(
    xh: &mut CudaStorage,
    lxh: &Layout,
    y: &CudaStorage,
    ly: &Layout,
    op: &crate::op_args::AddNorm<'_>,
    rows: usize,
    width: usize,
) -> Result<()> {
    use candle_core::cuda::CudaStorageSlice as S;
    if rows == 0 {
        return Ok(());
    }
    let dev = xh.device.clone();
    let name = match &y.slice {
        S::F32(_) => "add_norm_f32",
        S::F16(_) => "add_norm_f16",
        _ => candle_core::bail!("add and norm: the projection's output must be f32 or f16"),
    };
    let func = dev.get_or_load_custom_func(name, "quarry_residual", RESIDUAL_PTX)?;
    let weight = held(op.weight);
    let weight = held_view::<f32>(&weight.0, weight.1, "add and norm: the weight")?;
    let start = lxh.start_offset();
    let S::F32(xs) = &mut xh.slice else {
        candle_core::bail!("add and norm: the residual stream must be f32");
    };
    let mut xs = xs.slice_mut(start..start + 2 * rows * width);
    let width32 = width as i32;
    let (y32, y16);
    let mut b = func.builder();
    b.arg(&mut xs);
    arg_f32_or_f16!(b, y, ly, "add and norm: the projection's output", y32, y16);
    b.arg(&weight).arg(&width32).arg(&op.eps);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (NORM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `add_norm_*` in kernels/residual.cu; `xs` holds `2 · rows`
    // rows of `width` values, `y` `rows`, the weight `width`; a block per row.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// `x += a · wᵀ` in one cuBLAS GEMM that accumulates into the stream (`beta = 1`): `x` the f32
/// residual stream (`rows` × `outputs`), `a` the projection's f16 input (`rows` × `inputs`), `w`
/// its dense f16 weights (`outputs` × `inputs`), all contiguous; products summed in f32 (as
/// candle's f16 matmul sums them), added to `x` without rounding them to f16 first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_add(
    x: &mut CudaStorage,
    lx: &Layout,
    a: &CudaStorage,
    la: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    rows: usize,
    inputs: usize,
    outputs: usize,
) -> Result<()> {
    use candle_core::cuda::cudarc::cublas::{result::gemm_ex, sys};
    use candle_core::cuda::cudarc::driver::{DevicePtr, DevicePtrMut};
    use candle_core::cuda::CudaStorageSlice as S;
    if rows == 0 {
        return Ok(());
    }
    let dev = x.device.clone();
    let a = view::<half::f16>(a, la, "add into the stream: the projection's input")?;
    let w = view::<half::f16>(w, lw, "add into the stream: the weights")?;
    let start = lx.start_offset();
    let S::F32(xs) = &mut x.slice else {
        candle_core::bail!("add into the stream: the residual stream must be f32");
    };
    let mut xs = xs.slice_mut(start..start + rows * outputs);
    let (stream, blas) = (dev.cuda_stream(), dev.cublas_handle());
    let (ap, _a) = a.device_ptr(&stream);
    let (wp, _w) = w.device_ptr(&stream);
    let (xp, _x) = xs.device_ptr_mut(&stream);
    let (alpha, beta) = (1f32, 1f32);
    let dim = |n: usize| i32::try_from(n).map_err(candle_core::Error::wrap);
    // Column-major, as cuBLAS reads: the stream's rows are columns of `outputs` values, the
    // input's columns of `inputs`, the weights (`w` row-major) transposed.
    // SAFETY: `w` holds `outputs · inputs` values, `a` `rows · inputs`, `x` `rows · outputs`;
    // alpha and beta are read before the call returns (host pointer mode); the handle is
    // candle's, on the stream every pointer above was taken on.
    unsafe {
        gemm_ex(
            *blas.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            dim(outputs)?,
            dim(rows)?,
            dim(inputs)?,
            (&alpha) as *const f32 as *const _,
            wp as *const _,
            sys::cudaDataType_t::CUDA_R_16F,
            dim(inputs)?,
            ap as *const _,
            sys::cudaDataType_t::CUDA_R_16F,
            dim(inputs)?,
            (&beta) as *const f32 as *const _,
            xp as *mut _,
            sys::cudaDataType_t::CUDA_R_32F,
            dim(outputs)?,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(candle_core::Error::wrap)?;
    Ok(())
}

/// Writes a plane of `tokens` rows of `width` f32 values into a pool layer at the rows `slots`
/// names, in the pool's element type: one launch of `store_rows` (`kernels/rope_store.cu`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_rows(
    pool: &mut CudaStorage,
    lp: &Layout,
    plane: &CudaStorage,
    ls: &Layout,
    slots: &CudaStorage,
    lz: &Layout,
    tokens: usize,
    width: usize,
) -> Result<()> {
    if tokens == 0 {
        return Ok(());
    }
    let dev = pool.device.clone();
    let src = view::<f32>(plane, ls, "store rows: the plane")?;
    let slots = view::<u32>(slots, lz, "store rows: the slots")?;
    let (tokens64, width64) = (tokens as u64, width as u64);
    let cfg = elementwise(tokens * width);
    let start = lp.start_offset();
    let name = format!("store_rows_{}", pool_type(pool)?);
    let func = dev.get_or_load_custom_func(&name, "quarry_rope_store", ROPE_STORE_PTX)?;
    let mut b = func.builder();
    b.arg(&src).arg(&slots);
    let (mut p32, mut p16, mut pb16);
    arg_pool!(b, pool, start, p32, p16, pb16);
    b.arg(&tokens64).arg(&width64);
    // SAFETY: the arguments match `store_rows_*`; the plane holds `tokens · width` values, the
    // slots `tokens` rows of the pool (the plan checked them against the pool's size).
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::{both, host_f32, ids_on_both};
    use crate::simd::testing::{relative_error, values};

    /// The fused activation equals its reference (the op's CPU side) on a large random stacked
    /// input, from f32 or f16 to f32 or f16.
    #[test]
    fn glu_matches_its_reference() {
        use crate::config::Activation;
        use crate::glu::Glu;
        let (rows, f) = (300, 1001);
        let x = values(31, rows * 2 * f, -8.0, 8.0);
        for input in [DType::F32, DType::F16] {
            let (xg, xc) = both(&x, &[rows, 2 * f], input);
            for act in [Activation::Silu, Activation::GeluTanh] {
                for out in [DType::F32, DType::F16] {
                    let op = Glu { act, out };
                    let got = xg.apply_op1_no_bwd(&op).unwrap();
                    assert_eq!((got.dims(), got.dtype()), (&[rows, f][..], out));
                    let want = host_f32(&xc.apply_op1_no_bwd(&op).unwrap());
                    let err = relative_error(&host_f32(&got), &want);
                    eprintln!("glu {act:?} {input:?} -> {out:?}: relative error {err:.2e}");
                    // expf and tanhf against Rust's: an ulp or two, then f16 rounding.
                    let bound = if out == DType::F16 { 1e-3 } else { 1e-6 };
                    assert!(err < bound, "{act:?} {input:?} -> {out:?}: {err:.2e}");
                }
            }
        }
    }

    /// The attention's inputs from a stacked Q/K/V output, against the op's CPU side (the host
    /// forward's arithmetic): bit for bit without per-head norms (every operation rounded alone
    /// on both sides), within rounding with them (sums of squares in another order). SmolLM2's
    /// heads (interleaved pairs, f16 input), Qwen2.5's (NeoX pairs, a bias, f32 and f16 input),
    /// Gemma 3's (NeoX pairs, heads of 256, query and key norms).
    #[test]
    fn rope_qk_matches_its_reference() {
        rope_check(false);
    }

    /// RoPE with the KV writes (`RopeStore`, one launch; `QUARRY_ROPE_STORE`) against `RopeQk`
    /// then `StoreRows` on each pool, on the GPU, bit for bit, on [`rope_qk_matches_its_reference`]'s
    /// cases, in every pool type. A test of its own: gpu-check stops where a default kernel
    /// fails, and leaves only this fusion's runs out where this fails.
    #[test]
    fn rope_store_matches_rope_qk_and_store_rows() {
        rope_check(true);
    }

    /// `rope_qk` against its CPU side, or (`store`) `rope_store` against `rope_qk` and `store_rows`.
    fn rope_check(store: bool) {
        use crate::attention::StoreRows;
        use crate::config::RopeStyle;
        use crate::llama::fused::RopeStore;
        use crate::op_args::RopeQk;
        let (tokens, context) = (37, 1000);
        let cases = [
            (9, 3, 64, RopeStyle::Interleaved, false, false, DType::F16),
            (14, 2, 64, RopeStyle::Halves, true, false, DType::F32),
            (14, 2, 64, RopeStyle::Halves, true, false, DType::F16),
            (4, 1, 256, RopeStyle::Halves, false, true, DType::F32),
        ];
        for (n_head, n_kv, head_dim, style, with_bias, with_norm, input) in cases {
            let width = (n_head + 2 * n_kv) * head_dim;
            let half = head_dim / 2;
            let seed = (n_head * 1000 + head_dim) as u64;
            let (xg, xc) = both(
                &values(seed, tokens * width, -4.0, 4.0),
                &[tokens, width],
                input,
            );
            let pos: Vec<u32> = (0..tokens as u32)
                .map(|i| (i * 379 + 11) % context as u32)
                .collect();
            let (pg, pc) = ids_on_both(&pos);
            let angle =
                |p: usize, i: usize| p as f64 * 10_000f64.powf(-2.0 * i as f64 / head_dim as f64);
            let table = |f: fn(f64) -> f64| -> Vec<f32> {
                (0..context * half)
                    .map(|j| f(angle(j / half, j % half)) as f32)
                    .collect()
            };
            let (cg, cc) = both(&table(f64::cos), &[context, half], DType::F32);
            let (sg, sc) = both(&table(f64::sin), &[context, half], DType::F32);
            let (bg, bc) = both(&values(seed + 1, width, -1.0, 1.0), &[width], DType::F32);
            let (qg, qc) = both(
                &values(seed + 2, head_dim, 0.5, 1.5),
                &[head_dim],
                DType::F32,
            );
            let (kg, kc) = both(
                &values(seed + 3, head_dim, 0.5, 1.5),
                &[head_dim],
                DType::F32,
            );
            let op = |positions, cos, sin, bias, qk_norm| RopeQk {
                n_head,
                n_kv,
                head_dim,
                style,
                positions,
                cos,
                sin,
                bias: with_bias.then_some(bias),
                qk_norm: with_norm.then_some(qk_norm),
                eps: 1e-6,
            };
            let got = xg
                .apply_op1_no_bwd(&op(&pg, &cg, &sg, &bg, (&qg, &kg)))
                .unwrap();
            let want = xc
                .apply_op1_no_bwd(&op(&pc, &cc, &sc, &bc, (&qc, &kc)))
                .unwrap();
            assert_eq!(got.dims(), [tokens * width]);
            let what = format!("{n_head}/{n_kv} heads of {head_dim}, {style:?}, bias {with_bias}, norms {with_norm}, {input:?}");

            // RoPE with the KV writes (`RopeStore`): the queries, and the pools' rows as `RopeQk`
            // then `StoreRows` on each pool leave them, bit for bit, in every pool type.
            let (q_w, kv_w) = (n_head * head_dim, n_kv * head_dim);
            let slots: Vec<u32> = (0..tokens as u32)
                .map(|i| (i * 131 + 7) % context as u32)
                .collect();
            let (zg, _) = ids_on_both(&slots);
            let plane = |i: usize| {
                got.narrow(0, tokens * q_w + i * tokens * kv_w, tokens * kv_w)
                    .unwrap()
                    .reshape((tokens, kv_w))
                    .unwrap()
            };
            for pool in [DType::F32, DType::F16, DType::BF16]
                .into_iter()
                .filter(|_| store)
            {
                let fresh = || {
                    let start = values(seed + 5, context * kv_w, -1.0, 1.0);
                    both(&start, &[context, kv_w], pool).0
                };
                let (k_two, v_two, k_one, v_one) = (fresh(), fresh(), fresh(), fresh());
                k_two.inplace_op3(&plane(0), &zg, &StoreRows).unwrap();
                v_two.inplace_op3(&plane(1), &zg, &StoreRows).unwrap();
                let fused = RopeStore {
                    rope: op(&pg, &cg, &sg, &bg, (&qg, &kg)),
                    slots: &zg,
                    k_pool: &k_one,
                    v_pool: &v_one,
                    gemv: None,
                    norm: None,
                };
                let q = xg.apply_op1_no_bwd(&fused).unwrap();
                let queries = got.narrow(0, 0, tokens * q_w).unwrap();
                assert_eq!(
                    host_f32(&q),
                    host_f32(&queries),
                    "{what}, {pool:?}: the queries"
                );
                assert_eq!(
                    host_f32(&k_one),
                    host_f32(&k_two),
                    "{what}, {pool:?}: the keys"
                );
                assert_eq!(
                    host_f32(&v_one),
                    host_f32(&v_two),
                    "{what}, {pool:?}: the values"
                );
                // One pool for both: an error, not the nested locks' hang.
                let one = RopeStore {
                    v_pool: &k_one,
                    ..fused
                };
                let err = xg.apply_op1_no_bwd(&one).unwrap_err().to_string();
                assert!(err.contains("three storages"), "{err}");
            }

            if store {
                continue;
            }
            let (got, want) = (host_f32(&got), host_f32(&want));
            if with_norm {
                let err = relative_error(&got, &want);
                eprintln!("rope_qk {what}: relative error {err:.2e}");
                assert!(err < 1e-6, "{what}: relative error {err:.2e}");
            } else {
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                eprintln!("rope_qk {what}: {differ} values differ");
                assert_eq!(differ, 0, "{what}: {differ} values differ from the host's");
            }
        }
    }

    /// The KV writes put each plane row at its slot in the pool's type, rounded as the host
    /// rounds (equal bit for bit), from a plane that starts inside its storage (as the keys'
    /// and values' planes do), leaving every other row as it was.
    #[test]
    fn store_rows_matches_its_reference() {
        use crate::attention::StoreRows;
        let (rows, width, tokens) = (300, 192, 37);
        let slots: Vec<u32> = (0..tokens as u32)
            .map(|i| (i * 97 + 5) % rows as u32)
            .collect();
        let (zg, zc) = ids_on_both(&slots);
        let planes = values(41, 3 * tokens * width, -3.0, 3.0);
        let (pg, pc) = both(&planes, &[3 * tokens * width], DType::F32);
        let plane = |t: &Tensor| {
            t.narrow(0, tokens * width, tokens * width)
                .unwrap()
                .reshape((tokens, width))
                .unwrap()
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (poolg, poolc) = both(&values(43, rows * width, -1.0, 1.0), &[rows, width], dtype);
            poolg.inplace_op3(&plane(&pg), &zg, &StoreRows).unwrap();
            poolc.inplace_op3(&plane(&pc), &zc, &StoreRows).unwrap();
            let (got, want) = (host_f32(&poolg), host_f32(&poolc));
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{dtype:?}: {differ} values differ");
        }
    }

    /// The projection's GEMM adding into the stream (`linear::GemmAdd`) against its CPU side
    /// (each row's products summed in f32): cuBLAS sums in another order, so within f32
    /// rounding of the sums; at an offset into the stream's storage, nothing outside it touched.
    #[test]
    fn gemm_add_matches_its_reference() {
        use crate::linear::GemmAdd;
        let (rows, inputs, outputs) = (37, 576, 1536);
        let x0 = values(61, 2 * rows * outputs, -4.0, 4.0);
        let (ag, ac) = both(
            &values(63, rows * inputs, -1.0, 1.0),
            &[rows, inputs],
            DType::F16,
        );
        let (wg, wc) = both(
            &values(67, outputs * inputs, -0.1, 0.1),
            &[outputs, inputs],
            DType::F16,
        );
        let (xg, xc) = both(&x0, &[2 * rows, outputs], DType::F32);
        for (x, a, w) in [(&xg, &ag, &wg), (&xc, &ac, &wc)] {
            x.narrow(0, rows, rows)
                .unwrap()
                .inplace_op3(a, w, &GemmAdd)
                .unwrap();
        }
        let (got, want) = (host_f32(&xg), host_f32(&xc));
        let n = rows * outputs;
        assert_eq!(got[..n], x0[..n], "outside the stream's rows");
        let err = relative_error(&got[n..], &want[n..]);
        eprintln!("gemm_add: relative error {err:.2e}");
        assert!(err < 1e-5, "gemm_add: {err:.2e}");
    }

    /// The residual stream's norm against its CPU side (the host forward's `rms_norm_row`):
    /// within rounding (the block sums the squares in another order), from f32 or f16 rows to f32
    /// or f16; the in-place add bit for bit, from f32 or f16.
    #[test]
    fn residual_ops_match_their_reference() {
        use crate::llama::AddInto;
        use crate::op_args::Norm;
        let (rows, width) = (37, 896);
        let x = values(51, rows * width, -4.0, 4.0);
        let (wg, wc) = both(&values(53, width, 0.5, 1.5), &[width], DType::F32);
        for input in [DType::F32, DType::F16] {
            let (xg, xc) = both(&x, &[rows, width], input);
            for out in [DType::F32, DType::F16] {
                let norm = |weight| Norm {
                    weight,
                    eps: 1e-5,
                    out,
                };
                let got = xg.apply_op1_no_bwd(&norm(&wg)).unwrap();
                assert_eq!(got.dtype(), out);
                let want = host_f32(&xc.apply_op1_no_bwd(&norm(&wc)).unwrap());
                let err = relative_error(&host_f32(&got), &want);
                eprintln!("rms_norm {input:?} -> {out:?}: relative error {err:.2e}");
                let bound = if out == DType::F16 { 1e-3 } else { 1e-6 };
                assert!(err < bound, "norm {input:?} -> {out:?}: {err:.2e}");
            }
            let stream = values(57, rows * width, -4.0, 4.0);
            let (sg, sc) = both(&stream, &[rows, width], DType::F32);
            sg.inplace_op2(&xg, &AddInto).unwrap();
            sc.inplace_op2(&xc, &AddInto).unwrap();
            assert_eq!(host_f32(&sg), host_f32(&sc), "add from {input:?}");
        }
    }

    /// The add and the next norm in one op (`AddNorm`, `QUARRY_ADD_NORM`): the stream as
    /// `AddInto` leaves it, the norm's rows as the GPU's own norm writes them over it (bit for
    /// bit), and within rounding of the CPU side; from f32 or f16 projection outputs. A test of
    /// its own: gpu-check stops where a default kernel fails, and leaves only this fusion's runs
    /// out where this fails.
    #[test]
    fn add_norm_matches_add_into_then_rms_norm() {
        use crate::llama::AddInto;
        use crate::op_args::{AddNorm, Norm};
        let (rows, width) = (37, 896);
        let x = values(51, rows * width, -4.0, 4.0);
        let (wg, wc) = both(&values(53, width, 0.5, 1.5), &[width], DType::F32);
        for input in [DType::F32, DType::F16] {
            let (xg, xc) = both(&x, &[rows, width], input);
            let stream = values(57, rows * width, -4.0, 4.0);
            let (sg, sc) = both(&stream, &[rows, width], DType::F32);
            sg.inplace_op2(&xg, &AddInto).unwrap();
            sc.inplace_op2(&xc, &AddInto).unwrap();
            let room: Vec<f32> = stream.iter().chain(&stream).copied().collect();
            let (hg, hc) = both(&room, &[2 * rows, width], DType::F32);
            let add_norm = |weight| AddNorm { weight, eps: 1e-5 };
            hg.inplace_op2(&xg, &add_norm(&wg)).unwrap();
            hc.inplace_op2(&xc, &add_norm(&wc)).unwrap();
            let (got, want, n) = (host_f32(&hg), host_f32(&hc), rows * width);
            assert_eq!(
                got[..n],
                host_f32(&sg)[..],
                "add and norm from {input:?}: the add"
            );
            assert_eq!(want[..n], host_f32(&sc)[..], "the CPU side's add");
            let norm = Norm {
                weight: &wg,
                eps: 1e-5,
                out: DType::F32,
            };
            let normed = host_f32(&sg.apply_op1_no_bwd(&norm).unwrap());
            let err = relative_error(&got[n..], &want[n..]);
            eprintln!("add_norm from {input:?}: relative error {err:.2e}");
            assert!(
                got[n..] == normed[..],
                "add and norm from {input:?}: not the norm's rows"
            );
            assert!(err < 1e-6, "add and norm from {input:?}: {err:.2e}");
        }
    }
}
