//! The small steps' 8-bit GEMV on a GPU (`kernels/gemv_q8.cu`, `linear/q8_rows.rs`): its
//! launches, plain and with the layer's work fused around it (the adds into the residual stream,
//! the GLU, the norms' prologue; the RoPE form is launched by `forward::rope`).

use candle_core::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda::CudaStorage;
use candle_core::cuda::WrapErr;
use candle_core::{DType, Layout, Result, Tensor};

use super::forward::{act_name, arg_f32_or_f16, dtype_name, held, held_view, view};

/// The 8-bit GEMV's forms, a module per room (build.rs): the driver compiles a module whole at
/// its first load, and a process of batch-1 steps launches the r1 forms alone.
const GEMV_Q8_PTX: [(u8, &str, &str); 4] = [
    (
        1,
        "quarry_gemv_q8_r1",
        include_str!(concat!(env!("OUT_DIR"), "/gemv_q8_r1.ptx")),
    ),
    (
        2,
        "quarry_gemv_q8_r2",
        include_str!(concat!(env!("OUT_DIR"), "/gemv_q8_r2.ptx")),
    ),
    (
        4,
        "quarry_gemv_q8_r4",
        include_str!(concat!(env!("OUT_DIR"), "/gemv_q8_r4.ptx")),
    ),
    (
        8,
        "quarry_gemv_q8_r8",
        include_str!(concat!(env!("OUT_DIR"), "/gemv_q8_r8.ptx")),
    ),
];

/// Threads per block of `gemv_q8`: 8 warps, each computing `GEMV_Q8_OUTS` outputs.
const GEMV_Q8_THREADS: u32 = 256;
/// Outputs a warp of `gemv_q8` computes (its `Q8_OUTS`).
const GEMV_Q8_OUTS: usize = 2;

/// What every form of the 8-bit GEMV multiplies: `rows` (at most 8) rows of the input `s`, `l`
/// (`[rows, inputs]`, f32 or f16, contiguous, 16-byte aligned) and the repacked Q8_0 matrix `q`
/// (u8 `[outputs, inputs]`) with its `scales` (f16 `[outputs, inputs / 32]`), as
/// [`crate::linear::Q8Rows`] holds them.
#[derive(Clone, Copy)]
pub(crate) struct GemvOperands<'a> {
    pub(crate) s: &'a CudaStorage,
    pub(crate) l: &'a Layout,
    pub(crate) q: &'a Tensor,
    pub(crate) scales: &'a Tensor,
    pub(crate) rows: usize,
    pub(crate) inputs: usize,
    /// Trips of weights each lane prefetches into L2 (the kernels' `ahead`; `gemv_prefetch`).
    pub(crate) ahead: i32,
}

/// One launch of the 8-bit GEMV (`kernels/gemv_q8.cu`), all but its output: the form, its grid
/// and the sizes it is passed.
pub(super) struct GemvLaunch<'a> {
    /// The form (`gemv_q8…`), loaded by the launch (candle does not name its function type),
    /// and its module's name and PTX.
    pub(super) name: String,
    pub(super) module: (&'static str, &'static str),
    pub(super) cfg: LaunchConfig,
    pub(super) inputs: i32,
    pub(super) outputs: i32,
    pub(super) rows: i32,
    /// The kernels' `ahead`, passed after `rows` ([`GemvOperands::ahead`]).
    pub(super) ahead: i32,
    /// A `_norm` form's prologue: the norm's weight (f32 `[inputs]`) and epsilon, passed last.
    pub(super) norm: Option<(&'a Tensor, f32)>,
}

impl<'a> GemvLaunch<'a> {
    /// `gemv_q8{form}_r{room}_{input}{suffix}` for the operands `x`, with a warp for each of
    /// `warps`; `None` where there is nothing to compute. With `norm`, the `_norm` form
    /// (`gemv_q8_norm{form}…`: the input is the stream's f32 rows, at most 2, normalized into
    /// the block's shared memory first).
    pub(super) fn new(
        x: &GemvOperands<'_>,
        (form, suffix): (&str, &str),
        warps: usize,
        norm: Option<(&'a Tensor, f32)>,
    ) -> Result<Option<Self>> {
        use candle_core::cuda::CudaStorageSlice as S;
        let GemvOperands {
            s, l, rows, inputs, ..
        } = *x;
        let outputs = x.q.dims()[0];
        if !inputs.is_multiple_of(32) || !l.start_offset().is_multiple_of(16) {
            candle_core::bail!(
                "gemv_q8: rows of a multiple of 32 values from a 16-value boundary, not {inputs} from {}",
                l.start_offset()
            );
        }
        let input = match &s.slice {
            S::F32(_) => "f32",
            S::F16(_) => "f16",
            _ => candle_core::bail!("gemv_q8: an f32 or f16 input"),
        };
        if rows == 0 || warps == 0 {
            return Ok(None);
        }
        // The form with room for the step's rows (its registers grow with them).
        let room = [1, 2, 4, 8].into_iter().find(|&r| r >= rows).unwrap_or(8);
        let (prologue, shared) = match norm {
            None => ("", 0),
            Some(_) if input == "f32" && room <= 2 && room * inputs * 2 <= 48 * 1024 => {
                ("_norm", room * inputs * 2)
            }
            Some(_) => candle_core::bail!(
                "gemv_q8: a norm in the prologue takes 1 or 2 f32 rows of at most 12,288 values, \
                 not {rows} {input} rows of {inputs}"
            ),
        };
        let name = format!("gemv_q8{prologue}{form}_r{room}_{input}{suffix}");
        let module = GEMV_Q8_PTX
            .iter()
            .find(|(r, _, _)| usize::from(*r) == room)
            .map(|&(_, module, ptx)| (module, ptx))
            .ok_or_else(|| candle_core::Error::Msg(format!("gemv_q8: no forms for {room} rows")))?;
        let cfg = LaunchConfig {
            grid_dim: ((warps * 32).div_ceil(GEMV_Q8_THREADS as usize) as u32, 1, 1),
            block_dim: (GEMV_Q8_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        Ok(Some(Self {
            name,
            module,
            cfg,
            inputs: inputs as i32,
            outputs: outputs as i32,
            rows: rows as i32,
            ahead: x.ahead,
            norm,
        }))
    }
}

/// Launches the [`GemvLaunch`] `$g` on the [`GemvOperands`] `$x`, writing `$y` (a `&mut` of
/// what the kernel's `y` points to).
macro_rules! launch_gemv_q8 {
    ($g:expr, $x:expr, $y:expr) => {{
        let (g, x): (GemvLaunch<'_>, GemvOperands<'_>) = ($g, $x);
        let qh = held(x.q);
        let qv = held_view::<u8>(&qh.0, qh.1, "gemv_q8: the weights")?;
        let sh = held(x.scales);
        let sv = held_view::<half::f16>(&sh.0, sh.1, "gemv_q8: the scales")?;
        let nh = g.norm.map(|(w, _)| held(w));
        let nv = match &nh {
            Some((h, l)) => Some(held_view::<f32>(h, l, "gemv_q8: the norm's weight")?),
            None => None,
        };
        let (x32, x16);
        let func =
            x.s.device
                .get_or_load_custom_func(&g.name, g.module.0, g.module.1)?;
        let mut b = func.builder();
        b.arg(&qv).arg(&sv);
        arg_f32_or_f16!(b, x.s, x.l, "gemv_q8: the input", x32, x16);
        b.arg($y)
            .arg(&g.inputs)
            .arg(&g.outputs)
            .arg(&g.rows)
            .arg(&g.ahead);
        if let (Some(w), Some((_, eps))) = (&nv, &g.norm) {
            b.arg(w).arg(eps);
        }
        // SAFETY: the arguments match `gemv_q8*` in kernels/gemv_q8.cu: `q` holds outputs ·
        // inputs bytes and `scales` outputs · inputs / 32 values, the input `rows` rows of
        // `inputs` values from an aligned start; `y` holds what the form writes (the callers
        // size it), and the kernel writes every value of it.
        unsafe { b.launch(g.cfg) }.w()?;
    }};
}

/// `x · Wᵀ` for the operands `x`, into a new f32 `[rows, outputs]`: one launch of
/// `kernels/gemv_q8.cu` ([`crate::linear::Q8Rows`]).
pub(crate) fn gemv_q8(x: GemvOperands<'_>) -> Result<CudaStorage> {
    let (rows, outputs) = (x.rows, x.q.dims()[0]);
    let warps = outputs.div_ceil(GEMV_Q8_OUTS);
    // SAFETY: the kernel below writes every one of the rows · outputs values (none when there
    // are none).
    let mut y = unsafe { x.s.device.alloc::<f32>((rows * outputs).max(1))? };
    if let Some(g) = GemvLaunch::new(&x, ("", ""), warps, None)? {
        launch_gemv_q8!(g, x, &mut y);
    }
    Ok(CudaStorage::wrap_cuda_slice(y, x.s.device.clone()))
}

/// `stream += x · Wᵀ` in place, for the operands `x` (f16) and the f32 residual stream
/// `stream`, `ls` (`[rows, outputs]`, contiguous): one launch of `gemv_q8_add`.
pub(crate) fn gemv_q8_add(
    stream: &mut CudaStorage,
    ls: &Layout,
    x: GemvOperands<'_>,
) -> Result<()> {
    use candle_core::cuda::CudaStorageSlice as S;
    let outputs = x.q.dims()[0];
    if !matches!(x.s.slice, S::F16(_)) {
        candle_core::bail!("gemv_q8_add: an f16 input");
    }
    let warps = outputs.div_ceil(GEMV_Q8_OUTS);
    let Some(g) = GemvLaunch::new(&x, ("_add", ""), warps, None)? else {
        return Ok(());
    };
    let start = ls.start_offset();
    let S::F32(xs) = &mut stream.slice else {
        candle_core::bail!("gemv_q8_add: the residual stream must be f32");
    };
    let mut xs = xs.slice_mut(start..start + x.rows * outputs);
    launch_gemv_q8!(g, x, &mut xs);
    Ok(())
}

/// `act(gate) · up` in `out` (f32 or f16), `[rows, outputs / 2]`, for the operands `x` with
/// the stacked gate/up matrix (its `outputs / 2` gate rows, then as many up rows): one launch
/// of `gemv_q8_glu` (`x` f16), a warp per gate/up pair; with `norm` (the norm's weight and
/// epsilon), of `gemv_q8_norm_glu` (`x` the stream's f32 rows, normalized in the prologue).
pub(crate) fn gemv_q8_glu(
    x: GemvOperands<'_>,
    (act, out): (crate::config::Activation, DType),
    norm: Option<(&Tensor, f32)>,
) -> Result<CudaStorage> {
    use candle_core::cuda::CudaStorageSlice as S;
    let f = x.q.dims()[0] / 2;
    let input_ok = match norm {
        Some(_) => matches!(x.s.slice, S::F32(_)),
        None => matches!(x.s.slice, S::F16(_)),
    };
    if !input_ok || !matches!(out, DType::F32 | DType::F16) {
        candle_core::bail!(
            "gemv_q8_glu: an f16 input (f32 with a norm), an f32 or f16 output, not {out:?}"
        );
    }
    let form = (
        format!("_glu_{}", act_name(act)),
        format!("_{}", dtype_name(out)),
    );
    let g = GemvLaunch::new(&x, (&form.0, &form.1), f, norm)?;
    let n = (x.rows * f).max(1);
    let dev = &x.s.device;
    if out == DType::F16 {
        // SAFETY: the kernel writes every one of the rows · f values (none when there are none).
        let mut y = unsafe { dev.alloc::<half::f16>(n)? };
        if let Some(g) = g {
            launch_gemv_q8!(g, x, &mut y);
        }
        return Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()));
    }
    // SAFETY: as above.
    let mut y = unsafe { dev.alloc::<f32>(n)? };
    if let Some(g) = g {
        launch_gemv_q8!(g, x, &mut y);
    }
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::{both, gpu, host_f32, ids_on_both};
    use crate::linear::Q8Rows;
    use crate::simd::testing::{relative_error, values};

    /// A random Q8_0 matrix of `outputs` rows of `inputs` values (from `seed`), repacked on the
    /// GPU and on the CPU (the ops' references).
    fn q8_on_both(seed: u64, outputs: usize, inputs: usize) -> (Q8Rows, Q8Rows) {
        use candle_core::quantized::{GgmlDType, QTensor};
        let cpu = candle_core::Device::Cpu;
        let w = values(seed, outputs * inputs, -1.0, 1.0);
        let w = Tensor::from_slice(&w, (outputs, inputs), &cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let gpu = candle_core::Device::Cuda(gpu());
        (
            Q8Rows::from_q8_0(&q, &gpu).unwrap(),
            Q8Rows::from_q8_0(&q, &cpu).unwrap(),
        )
    }

    /// The small steps' 8-bit GEMV (`gemv_q8`, through `Q8Rows` as the forward pass calls it)
    /// against its reference (the op's CPU side) on a random Q8_0 matrix in Llama 3 8B's down
    /// projection's width (14,336 inputs: 28 passes of a warp, the last one whole) and an odd
    /// number of outputs, and on SmolLM2's (576: a partial last pass), at 1 to 20 rows (slices of
    /// 8 past 8), from f32 and f16, the outputs poisoned by a first run on other inputs.
    #[test]
    fn gemv_q8_matches_its_reference() {
        for (outputs, inputs) in [(1001usize, 14_336usize), (96, 576)] {
            let (on_gpu, on_cpu) = q8_on_both(5, outputs, inputs);
            for rows in [1usize, 2, 3, 5, 8, 20] {
                for input in [DType::F32, DType::F16] {
                    let (junk, _) = both(
                        &values(9, rows * inputs, -50.0, 50.0),
                        &[rows, inputs],
                        input,
                    );
                    let _ = on_gpu.forward(&junk).unwrap();
                    let (xg, xc) = both(
                        &values(17, rows * inputs, -2.0, 2.0),
                        &[rows, inputs],
                        input,
                    );
                    let got = on_gpu.forward(&xg).unwrap();
                    assert_eq!(
                        (got.dims(), got.dtype()),
                        (&[rows, outputs][..], DType::F32)
                    );
                    let want = host_f32(&on_cpu.forward(&xc).unwrap());
                    let err = relative_error(&host_f32(&got), &want);
                    eprintln!("gemv_q8 {outputs}x{inputs}, {rows} rows, {input:?}: relative error {err:.2e}");
                    assert!(
                        err < 1e-5,
                        "{outputs}x{inputs}, {rows} rows, {input:?}: {err:.2e}"
                    );
                }
            }
        }
    }

    /// The prefetch (`gemv_prefetch`) asks L2 for lines and changes nothing else: with 1, 3
    /// and 8 trips ahead the plain and adding forms give the sums of none, bit for bit, on Llama
    /// 3 8B's down projection's width (14 trips of a row at 1 or 2 rows) at 1, 2 and 5 rows.
    /// (quarry-cuda-emu checks which lines are asked for.)
    #[test]
    fn the_gemv_prefetch_keeps_the_sums() {
        let (outputs, inputs) = (1002usize, 14_336usize);
        let (plain, _) = q8_on_both(5, outputs, inputs);
        for ahead in [1usize, 3, 8] {
            let (prefetching, _) = q8_on_both(5, outputs, inputs);
            let prefetching = prefetching.prefetching(ahead);
            for rows in [1usize, 2, 5] {
                let (x, _) = both(
                    &values(17, rows * inputs, -2.0, 2.0),
                    &[rows, inputs],
                    DType::F16,
                );
                let bits = |t: &Tensor| host_f32(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let want = bits(&plain.forward(&x).unwrap());
                let got = bits(&prefetching.forward(&x).unwrap());
                assert!(got == want, "{ahead} trips ahead, {rows} rows: other sums");
                let stream = |m: &Q8Rows| {
                    let (s, _) = both(
                        &values(23, rows * outputs, -3.0, 3.0),
                        &[rows, outputs],
                        DType::F32,
                    );
                    assert!(m.add_into(&s, &x).unwrap(), "the adding form took the step");
                    bits(&s)
                };
                assert!(
                    stream(&prefetching) == stream(&plain),
                    "{ahead} ahead, {rows} rows: the add"
                );
            }
        }
    }

    /// The 8-bit GEMV's fused epilogues (through `Q8Rows` as the forward pass calls them)
    /// against their references (the ops' CPU sides): the adding form on a random f32 stream,
    /// and the GLU form (SiLU and GELU-tanh into f16 and f32) on a stacked gate/up matrix, in
    /// Llama 3 8B's down projection's width and SmolLM2's, at 1 to 8 rows of f16 input; each
    /// output poisoned by a first run on other inputs.
    #[test]
    fn gemv_q8_add_and_glu_match_their_references() {
        use crate::config::Activation;
        for (outputs, inputs) in [(1002usize, 14_336usize), (96, 576)] {
            let (on_gpu, on_cpu) = q8_on_both(5, outputs, inputs);
            for rows in [1usize, 2, 3, 5, 8] {
                let input = |seed| {
                    both(
                        &values(seed, rows * inputs, -2.0, 2.0),
                        &[rows, inputs],
                        DType::F16,
                    )
                };
                let ((junk, _), (xg, xc)) = (input(9), input(17));
                let (sg, sc) = both(
                    &values(23, rows * outputs, -4.0, 4.0),
                    &[rows, outputs],
                    DType::F32,
                );
                assert!(on_gpu.add_into(&sg, &xg).unwrap() && on_cpu.add_into(&sc, &xc).unwrap());
                let err = relative_error(&host_f32(&sg), &host_f32(&sc));
                eprintln!("gemv_q8_add {outputs}x{inputs}, {rows} rows: relative error {err:.2e}");
                assert!(err < 1e-5, "add {outputs}x{inputs}, {rows} rows: {err:.2e}");
                for act in [Activation::Silu, Activation::GeluTanh] {
                    for out in [DType::F16, DType::F32] {
                        let _ = on_gpu.glu(&junk, act, out, None).unwrap();
                        let got = on_gpu
                            .glu(&xg, act, out, None)
                            .unwrap()
                            .expect("the fused form");
                        assert_eq!((got.dims(), got.dtype()), (&[rows, outputs / 2][..], out));
                        let want = on_cpu
                            .glu(&xc, act, out, None)
                            .unwrap()
                            .expect("the fused form");
                        let err = relative_error(&host_f32(&got), &host_f32(&want));
                        eprintln!("gemv_q8_glu {act:?} -> {out:?} {outputs}x{inputs}, {rows} rows: relative error {err:.2e}");
                        let bound = if out == DType::F16 { 1e-3 } else { 1e-5 };
                        assert!(err < bound, "glu {act:?} {out:?}, {rows} rows: {err:.2e}");
                    }
                }
                if rows <= crate::linear::NORM_MAX_ROWS {
                    gemv_q8_norm_check(&on_gpu, &on_cpu, rows, inputs);
                }
            }
        }
    }

    /// The GLU form with the norm in its prologue, on the stream's f32 rows: against its CPU
    /// side, and against the norm's own launch then the form without the prologue on the GPU
    /// (the same arithmetic in the same order: the values that differ are counted and shown).
    fn gemv_q8_norm_check(
        on_gpu: &crate::linear::Q8Rows,
        on_cpu: &crate::linear::Q8Rows,
        rows: usize,
        inputs: usize,
    ) {
        use crate::config::Activation;
        use crate::linear::Prologue;
        let (sg, sc) = both(
            &values(29, rows * inputs, -3.0, 3.0),
            &[rows, inputs],
            DType::F32,
        );
        let (wg, wc) = both(&values(31, inputs, 0.5, 1.5), &[inputs], DType::F32);
        let eps = 1e-5;
        let (pg, pc) = (Prologue { weight: &wg, eps }, Prologue { weight: &wc, eps });
        let act = Activation::Silu;
        let got = on_gpu
            .glu(&sg, act, DType::F16, Some(pg))
            .unwrap()
            .expect("the norm form");
        let want = on_cpu
            .glu(&sc, act, DType::F16, Some(pc))
            .unwrap()
            .expect("the norm form");
        let (got, want) = (host_f32(&got), host_f32(&want));
        let err = relative_error(&got, &want);
        let norm = crate::op_args::Norm {
            weight: &wg,
            eps,
            out: DType::F16,
        };
        let h = sg.apply_op1_no_bwd(&norm).unwrap();
        let two = on_gpu
            .glu(&h, act, DType::F16, None)
            .unwrap()
            .expect("the fused form");
        let two = host_f32(&two);
        let differ = got
            .iter()
            .zip(&two)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        eprintln!(
            "gemv_q8_norm_glu {inputs} inputs, {rows} rows: relative error {err:.2e}; \
             {differ} of {} values differ from the norm's launch then the GLU form's",
            got.len()
        );
        assert!(err < 1e-3, "norm glu, {rows} rows: {err:.2e}");
        assert!(
            relative_error(&got, &two) < 1e-3,
            "norm glu against two launches, {rows} rows"
        );
    }

    /// The stacked Q/K/V projection on the 8-bit GEMV with RoPE and the KV writes in its
    /// epilogue (`RopeStore` with `gemv`, one launch of `gemv_q8_rope`) against the plain GEMV
    /// then `RopeStore` on its output (two launches), on the GPU: the queries and the pools'
    /// rows in every pool type. SmolLM2's heads (interleaved pairs), Qwen2.5's (halves, a bias)
    /// and Llama 3 8B's (groups of 4, heads of 128, 4,096 inputs), 1 to 8 rows of f16 input.
    /// The same sums and the same rotation: equal within an f16 rounding or two.
    #[test]
    fn gemv_q8_rope_matches_the_gemv_then_rope_store() {
        use crate::config::RopeStyle;
        use crate::llama::fused::RopeStore;
        use crate::op_args::RopeQk;
        let context = 64;
        let cases = [
            (9, 3, 64, RopeStyle::Interleaved, false, 576),
            (14, 2, 64, RopeStyle::Halves, true, 896),
            (32, 8, 128, RopeStyle::Halves, false, 4096),
        ];
        for (n_head, n_kv, head_dim, style, with_bias, inputs) in cases {
            let (q_w, kv_w) = (n_head * head_dim, n_kv * head_dim);
            let (width, half) = (q_w + 2 * kv_w, head_dim / 2);
            let seed = (n_head * 1000 + head_dim) as u64;
            let (matrix, _) = q8_on_both(seed, width, inputs);
            let table = |f: fn(f64) -> f64| -> Vec<f32> {
                (0..context * half)
                    .map(|j| {
                        let i = (j % half) as f64;
                        f((j / half) as f64 * 10_000f64.powf(-2.0 * i / head_dim as f64)) as f32
                    })
                    .collect()
            };
            let (cg, _) = both(&table(f64::cos), &[context, half], DType::F32);
            let (sg, _) = both(&table(f64::sin), &[context, half], DType::F32);
            let (bg, _) = both(&values(seed + 1, width, -1.0, 1.0), &[width], DType::F32);
            for rows in [1usize, 2, 3, 8] {
                let pos: Vec<u32> = (0..rows as u32)
                    .map(|i| (i * 29 + 5) % context as u32)
                    .collect();
                let slots: Vec<u32> = (0..rows as u32)
                    .map(|i| (i * 13 + 3) % context as u32)
                    .collect();
                let ((pg, _), (zg, _)) = (ids_on_both(&pos), ids_on_both(&slots));
                let (hg, _) = both(
                    &values(seed + 2, rows * inputs, -2.0, 2.0),
                    &[rows, inputs],
                    DType::F16,
                );
                let rope = || RopeQk {
                    n_head,
                    n_kv,
                    head_dim,
                    style,
                    positions: &pg,
                    cos: &cg,
                    sin: &sg,
                    bias: with_bias.then_some(&bg),
                    qk_norm: None,
                    eps: 1e-6,
                };
                for pool in [DType::F32, DType::F16, DType::BF16] {
                    let what =
                        format!("{n_head}/{n_kv} heads of {head_dim}, {rows} rows, {pool:?}");
                    let fresh = || {
                        both(
                            &values(seed + 5, context * kv_w, -1.0, 1.0),
                            &[context, kv_w],
                            pool,
                        )
                        .0
                    };
                    let (k_two, v_two, k_one, v_one) = (fresh(), fresh(), fresh(), fresh());
                    let qkv = matrix.forward(&hg).unwrap();
                    let two = RopeStore {
                        rope: rope(),
                        slots: &zg,
                        k_pool: &k_two,
                        v_pool: &v_two,
                        gemv: None,
                        norm: None,
                    };
                    let want = qkv.apply_op1_no_bwd(&two).unwrap();
                    let one = RopeStore {
                        rope: rope(),
                        slots: &zg,
                        k_pool: &k_one,
                        v_pool: &v_one,
                        gemv: Some(&matrix),
                        norm: None,
                    };
                    let got = hg.apply_op1_no_bwd(&one).unwrap();
                    assert_eq!(got.dims(), [rows * q_w], "{what}");
                    for (got, want, which) in [
                        (&got, &want, "queries"),
                        (&k_one, &k_two, "keys"),
                        (&v_one, &v_two, "values"),
                    ] {
                        let err = relative_error(&host_f32(got), &host_f32(want));
                        eprintln!("gemv_q8_rope {what}, the {which}: relative error {err:.2e}");
                        assert!(err < 1e-5, "{what}, the {which}: {err:.2e}");
                    }
                    if rows > crate::linear::NORM_MAX_ROWS {
                        continue;
                    }
                    // The norm in the prologue: the stream's rows in, against the norm's launch
                    // then the form above.
                    let (stream, _) = both(
                        &values(seed + 7, rows * inputs, -3.0, 3.0),
                        &[rows, inputs],
                        DType::F32,
                    );
                    let (wg, _) = both(&values(seed + 8, inputs, 0.5, 1.5), &[inputs], DType::F32);
                    let norm = crate::op_args::Norm {
                        weight: &wg,
                        eps: 1e-5,
                        out: DType::F16,
                    };
                    let h = stream.apply_op1_no_bwd(&norm).unwrap();
                    let (k_h, v_h, k_n, v_n) = (fresh(), fresh(), fresh(), fresh());
                    let want = h
                        .apply_op1_no_bwd(&RopeStore {
                            k_pool: &k_h,
                            v_pool: &v_h,
                            ..one
                        })
                        .unwrap();
                    let normed = RopeStore {
                        rope: rope(),
                        slots: &zg,
                        k_pool: &k_n,
                        v_pool: &v_n,
                        gemv: Some(&matrix),
                        norm: Some(crate::linear::Prologue {
                            weight: &wg,
                            eps: 1e-5,
                        }),
                    };
                    let got = stream.apply_op1_no_bwd(&normed).unwrap();
                    for (got, want, which) in [
                        (&got, &want, "queries"),
                        (&k_n, &k_h, "keys"),
                        (&v_n, &v_h, "values"),
                    ] {
                        let err = relative_error(&host_f32(got), &host_f32(want));
                        eprintln!(
                            "gemv_q8_norm_rope {what}, the {which}: relative error {err:.2e}"
                        );
                        assert!(
                            err < 1e-5,
                            "{what}, the {which} after the prologue: {err:.2e}"
                        );
                    }
                }
            }
        }
    }
}
