//! The forward pass's fused kernels (`kernels/residual.cu`, `glu.cu`, `rope_store.cu`) on the
//! CPU against the host forward's own arithmetic (`quarry_model::reference`), with the CUDA
//! launchers' shapes (`quarry-model/src/cuda/forward.rs`): 256 threads, a block per row for the
//! norms and RoPE, grid-stride loops for the element-wise kernels. Where every operation is
//! rounded alone (`__fadd_rn`, `__fmul_rn`, …) the kernel must equal the reference bit for bit;
//! where it adds a sum in another order (the norms), within rounding.

mod common;

use std::ffi::c_void;

use common::{first_difference, run};
use half::f16;
use quarry_cuda_emu::{kernels, Buf};
use quarry_model::reference::{
    gelu_tanh, gemv_q8_reference, relative_error, rms_norm_row, rotate_heads, silu, values,
};
use quarry_model::RopeStyle;

const THREADS: u32 = 256;

/// The element-wise kernels' grid: a block per 256 values, 65,535 at most.
fn elementwise(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32, 1, 1)
}

fn to_f16(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&v| f16::from_f32(v)).collect()
}

fn from_f16(x: &[f16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// A buffer of f32 values, or of their f16 roundings, as a kernel's untyped input.
enum Input {
    F32(Buf<f32>),
    F16(Buf<f16>),
}

impl Input {
    fn new(x: &[f32], f16_input: bool) -> Self {
        if f16_input {
            Self::F16(Buf::from_slice(&to_f16(x)))
        } else {
            Self::F32(Buf::from_slice(x))
        }
    }
    fn ptr(&self) -> *const c_void {
        match self {
            Self::F32(b) => b.ptr() as *const c_void,
            Self::F16(b) => b.ptr() as *const c_void,
        }
    }
    /// The values the kernel reads (after the f16 rounding).
    fn values(&self) -> Vec<f32> {
        match self {
            Self::F32(b) => b.read("input"),
            Self::F16(b) => from_f16(&b.read("input")),
        }
    }
}

/// An output buffer of f32 or f16, poisoned.
enum Output {
    F32(Buf<f32>),
    F16(Buf<f16>),
}

impl Output {
    fn new(n: usize, f16_output: bool) -> Self {
        if f16_output {
            Self::F16(Buf::poisoned(n))
        } else {
            Self::F32(Buf::poisoned(n))
        }
    }
    fn ptr(&mut self) -> *mut c_void {
        match self {
            Self::F32(b) => b.ptr_mut() as *mut c_void,
            Self::F16(b) => b.ptr_mut() as *mut c_void,
        }
    }
    fn read(&self, what: &str) -> Vec<f32> {
        match self {
            Self::F32(b) => b.read(what),
            Self::F16(b) => from_f16(&b.read(what)),
        }
    }
    /// `want` as this buffer's type holds it.
    fn rounded(&self, want: &[f32]) -> Vec<f32> {
        match self {
            Self::F32(_) => want.to_vec(),
            Self::F16(_) => from_f16(&to_f16(want)),
        }
    }
}

fn ty(f16: bool) -> &'static str {
    if f16 {
        "f16"
    } else {
        "f32"
    }
}

/// Every form of `rms_norm` on rows of SmolLM2's (576), Gemma's (640) and an odd width (37, fewer
/// values than threads) against `rms_norm_row`.
#[test]
fn rms_norm_matches_the_host_norm() {
    for (rows, width) in [(5usize, 576usize), (3, 640), (4, 37)] {
        for (f16_in, f16_out) in [(false, false), (false, true), (true, false), (true, true)] {
            let name = format!("rms_norm_{}_{}", ty(f16_in), ty(f16_out));
            let kernel = kernels::rms_norm::by_name(&name).expect(&name);
            let x = Input::new(
                &values(width as u64 * 7 + 1, rows * width, -3.0, 3.0),
                f16_in,
            );
            let w = Buf::from_slice(&values(width as u64 * 11 + 5, width, 0.5, 1.5));
            let mut out = Output::new(rows * width, f16_out);
            let (xp, wp, op, eps) = (x.ptr(), w.ptr(), out.ptr(), 1e-5f32);
            unsafe {
                run(&name, (rows as u32, 1, 1), THREADS, 0, || {
                    kernel(xp, op, wp, width as i32, eps)
                })
            };
            let mut want = x.values();
            let weights = w.read("w");
            for row in want.chunks_mut(width) {
                rms_norm_row(row, &weights, eps);
            }
            let got = out.read(&name);
            let err = relative_error(&got, &out.rounded(&want));
            // The block adds the squares in another order than the host: within f32 rounding,
            // or one f16 rounding of the result.
            let bound = if f16_out { 1e-3 } else { 1e-6 };
            assert!(err < bound, "{name} over {width}: relative error {err:.2e}");
        }
    }
}

/// `add_into` adds f32 or f16 values into the f32 stream in place, bit for bit, over more values
/// than one grid's stride covers and a count that is not a multiple of the block.
#[test]
fn add_into_adds_in_place_bit_for_bit() {
    for n in [1000usize, 65_535 * 256 + 77] {
        for f16_y in [false, true] {
            let name = format!("add_into_{}", ty(f16_y));
            let kernel = kernels::add_into::by_name(&name).expect(&name);
            let x0 = values(n as u64 + 3, n, -2.0, 2.0);
            let y = Input::new(&values(n as u64 + 9, n, -2.0, 2.0), f16_y);
            let mut x = Buf::from_slice(&x0);
            let (xp, yp) = (x.ptr_mut(), y.ptr());
            unsafe {
                run(&name, elementwise(n), THREADS, 0, || {
                    kernel(xp, yp, n as u64)
                })
            };
            let want: Vec<f32> = x0.iter().zip(y.values()).map(|(a, b)| a + b).collect();
            let got = x.read(&name);
            assert_eq!(
                first_difference(&got, &want),
                None,
                "{name} over {n} values"
            );
        }
    }
}

/// `add_norm` (the residual add and the next norm in one launch) over rows of SmolLM2's, Gemma's
/// and an odd width, from f32 or f16: the stream's rows bit for bit as `add_into` leaves them and
/// the normalized rows bit for bit as `rms_norm_f32_f32` writes them after it (the fused path
/// changes no value), both within rounding of the host's `rms_norm_row`.
#[test]
fn add_norm_equals_add_into_then_rms_norm() {
    for (rows, width) in [(5usize, 576usize), (3, 640), (4, 37)] {
        for f16_y in [false, true] {
            let name = format!("add_norm_{}", ty(f16_y));
            let kernel = kernels::add_norm::by_name(&name).expect(&name);
            let n = rows * width;
            let x0 = values(width as u64 * 3 + 2, n, -3.0, 3.0);
            let y = Input::new(&values(width as u64 * 5 + 4, n, -3.0, 3.0), f16_y);
            let w = Buf::from_slice(&values(width as u64 * 13 + 1, width, 0.5, 1.5));
            // The stream's rows, then room for the norm's (poisoned: every value must be written).
            let mut room = x0.clone();
            room.extend(std::iter::repeat_n(f32::NAN, n));
            let mut xh = Buf::from_slice(&room);
            let (xhp, yp, wp, eps) = (xh.ptr_mut(), y.ptr(), w.ptr(), 1e-6f32);
            unsafe {
                run(&name, (rows as u32, 1, 1), THREADS, 0, || {
                    kernel(xhp, yp, wp, width as i32, eps)
                })
            };
            let got = xh.read(&name);

            // The two launches it replaces, on the emulator.
            let add = kernels::add_into::by_name(&format!("add_into_{}", ty(f16_y))).unwrap();
            let norm = kernels::rms_norm::by_name("rms_norm_f32_f32").unwrap();
            let mut x = Buf::from_slice(&x0);
            let mut h = Buf::<f32>::poisoned(n);
            let (xp, hp) = (x.ptr_mut(), h.ptr_mut());
            unsafe {
                run("add_into", elementwise(n), THREADS, 0, || {
                    add(xp, yp, n as u64)
                });
                run("rms_norm", (rows as u32, 1, 1), THREADS, 0, || {
                    norm(
                        xp as *const c_void,
                        hp as *mut c_void,
                        wp,
                        width as i32,
                        eps,
                    )
                });
            }
            let (x_two, h_two) = (x.read("add_into"), h.read("rms_norm"));
            assert_eq!(
                first_difference(&got[..n], &x_two),
                None,
                "{name}: the stream"
            );
            assert_eq!(
                first_difference(&got[n..], &h_two),
                None,
                "{name}: the norm"
            );

            // And the host's arithmetic.
            let sum: Vec<f32> = x0.iter().zip(y.values()).map(|(a, b)| a + b).collect();
            assert_eq!(first_difference(&got[..n], &sum), None, "{name}: host add");
            let mut want = sum;
            let weights = w.read("w");
            for row in want.chunks_mut(width) {
                rms_norm_row(row, &weights, eps);
            }
            let err = relative_error(&got[n..], &want);
            assert!(err < 1e-6, "{name} over {width}: relative error {err:.2e}");
        }
    }
}

/// Every form of the GLU: `act(gate) · up` from the stacked `[rows, 2f]` input, SiLU and
/// GELU-tanh, against the host's formulas.
#[test]
fn glu_matches_the_host_activations() {
    let (rows, f) = (3usize, 1536usize);
    for gelu in [false, true] {
        for (f16_in, f16_out) in [(false, false), (false, true), (true, false), (true, true)] {
            let act = if gelu { "gelu_tanh" } else { "silu" };
            let name = format!("glu_{act}_{}_{}", ty(f16_in), ty(f16_out));
            let kernel = kernels::glu::by_name(&name).expect(&name);
            let x = Input::new(&values(41, rows * 2 * f, -6.0, 6.0), f16_in);
            let mut out = Output::new(rows * f, f16_out);
            let (xp, op) = (x.ptr(), out.ptr());
            unsafe {
                run(&name, elementwise(rows * f), THREADS, 0, || {
                    kernel(xp, op, rows as u64, f as u64)
                })
            };
            let input = x.values();
            let want: Vec<f32> = input
                .chunks(2 * f)
                .flat_map(|r| {
                    let (gate, up) = r.split_at(f);
                    gate.iter()
                        .zip(up)
                        .map(|(&g, &u)| if gelu { gelu_tanh(g) } else { silu(g) } * u)
                        .collect::<Vec<_>>()
                })
                .collect();
            let err = relative_error(&out.read(&name), &out.rounded(&want));
            // expf and tanhf against Rust's exp and tanh: a few ulps.
            let bound = if f16_out { 1e-3 } else { 1e-6 };
            assert!(err < bound, "{name}: relative error {err:.2e}");
        }
    }
}

/// One model's shape for `rope_qk`.
struct Heads {
    n_head: usize,
    n_kv: usize,
    head_dim: usize,
    style: RopeStyle,
    bias: bool,
    norms: bool,
}

/// SmolLM2's shape (interleaved pairs), Qwen2.5's (halves, biases) and Gemma 3's (halves,
/// per-head norms, heads of 256).
const ROPE_SHAPES: [Heads; 3] = [
    Heads {
        n_head: 9,
        n_kv: 3,
        head_dim: 64,
        style: RopeStyle::Interleaved,
        bias: false,
        norms: false,
    },
    Heads {
        n_head: 14,
        n_kv: 2,
        head_dim: 64,
        style: RopeStyle::Halves,
        bias: true,
        norms: false,
    },
    Heads {
        n_head: 4,
        n_kv: 1,
        head_dim: 256,
        style: RopeStyle::Halves,
        bias: false,
        norms: true,
    },
];

/// The RoPE kernels' inputs for five tokens of `h`'s shape: the stacked Q/K/V rows (f32 or their
/// f16 roundings), the optional bias and per-head norms, the cos and sin tables as the model
/// builds them (of p · θ_i, 256 positions) and the tokens' positions.
struct RopeInputs {
    x: Input,
    bias: Option<Buf<f32>>,
    norms: Option<(Buf<f32>, Buf<f32>)>,
    cos: Buf<f32>,
    sin: Buf<f32>,
    positions: Buf<u32>,
    tokens: usize,
    q_w: usize,
    kv_w: usize,
}

const ROPE_EPS: f32 = 1e-6;

impl RopeInputs {
    fn new(h: &Heads, f16_in: bool) -> Self {
        let (q_w, kv_w) = (h.n_head * h.head_dim, h.n_kv * h.head_dim);
        let width = q_w + 2 * kv_w;
        let half = h.head_dim / 2;
        let tokens = 5usize;
        let table_rows = 256usize;
        let theta: Vec<f32> = (0..half)
            .map(|i| 10_000f32.powf(-2.0 * i as f32 / h.head_dim as f32))
            .collect();
        let table = |f: fn(f32) -> f32| -> Vec<f32> {
            (0..table_rows * half)
                .map(|j| f((j / half) as f32 * theta[j % half]))
                .collect()
        };
        Self {
            x: Input::new(
                &values(h.head_dim as u64 + 1, tokens * width, -2.0, 2.0),
                f16_in,
            ),
            bias: h
                .bias
                .then(|| Buf::from_slice(&values(5, width, -0.5, 0.5))),
            norms: h.norms.then(|| {
                (
                    Buf::from_slice(&values(7, h.head_dim, 0.5, 1.5)),
                    Buf::from_slice(&values(9, h.head_dim, 0.5, 1.5)),
                )
            }),
            cos: Buf::from_slice(&table(f32::cos)),
            sin: Buf::from_slice(&table(f32::sin)),
            positions: Buf::from_slice(&[0u32, 17, 3, 250, 99]),
            tokens,
            q_w,
            kv_w,
        }
    }

    fn width(&self) -> usize {
        self.q_w + 2 * self.kv_w
    }

    /// The arguments both RoPE kernels take first (the rows, the bias and the two norms, null
    /// where absent, the tables, the positions), and the pair style of `h`.
    fn args(&self, h: &Heads) -> RopeArgs {
        let null = std::ptr::null::<f32>();
        let (q_norm, k_norm) = self
            .norms
            .as_ref()
            .map_or((null, null), |(q, k)| (q.ptr(), k.ptr()));
        RopeArgs {
            x: self.x.ptr(),
            bias: self.bias.as_ref().map_or(null, |b| b.ptr()),
            q_norm,
            k_norm,
            cos: self.cos.ptr(),
            sin: self.sin.ptr(),
            positions: self.positions.ptr(),
            interleaved: i32::from(h.style == RopeStyle::Interleaved),
        }
    }

    /// `rope_qk`'s planes, from the kernel of that name.
    fn planes(&self, name: &str, h: &Heads) -> Vec<f32> {
        let kernel = kernels::rope_qk::by_name(name).expect(name);
        let mut out = Buf::<f32>::poisoned(self.tokens * self.width());
        let (a, op) = (self.args(h), out.ptr_mut());
        unsafe {
            run(
                name,
                (self.tokens as u32, 1, 1),
                THREADS,
                self.width() * 4,
                || {
                    kernel(
                        a.x,
                        a.bias,
                        a.q_norm,
                        a.k_norm,
                        a.cos,
                        a.sin,
                        a.positions,
                        op,
                        self.tokens as i32,
                        h.n_head as i32,
                        h.n_kv as i32,
                        h.head_dim as i32,
                        a.interleaved,
                        ROPE_EPS,
                    )
                },
            )
        };
        out.read(name)
    }
}

/// `rope_qk` against `rotate_heads` on [`ROPE_SHAPES`]: bit for bit without the norms.
#[test]
fn rope_qk_matches_the_host_rotation() {
    for h in ROPE_SHAPES {
        for f16_in in [false, true] {
            let name = format!("rope_qk_{}", ty(f16_in));
            let r = RopeInputs::new(&h, f16_in);
            let (tokens, q_w, kv_w, width) = (r.tokens, r.q_w, r.kv_w, r.width());
            let half = h.head_dim / 2;
            let got = r.planes(&name, &h);
            // The host's arithmetic: the bias, then each head normed and rotated, then the
            // planes (queries, keys, values).
            let input = r.x.values();
            let (cos, sin, positions) = (
                r.cos.read("cos"),
                r.sin.read("sin"),
                r.positions.read("positions"),
            );
            let bias_v = r.bias.as_ref().map(|b| b.read("bias"));
            let norm_v = r
                .norms
                .as_ref()
                .map(|(q, k)| (q.read("q norm"), k.read("k norm")));
            let mut want = vec![0f32; tokens * width];
            let (q_plane, rest) = want.split_at_mut(tokens * q_w);
            let (k_plane, v_plane) = rest.split_at_mut(tokens * kv_w);
            for t in 0..tokens {
                let mut row = input[t * width..(t + 1) * width].to_vec();
                if let Some(b) = &bias_v {
                    row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                }
                let at = positions[t] as usize * half;
                rotate_heads(
                    &mut row[..q_w + kv_w],
                    q_w,
                    h.head_dim,
                    h.style,
                    (&cos[at..at + half], &sin[at..at + half]),
                    norm_v
                        .as_ref()
                        .map(|(q, k)| (q.as_slice(), k.as_slice(), ROPE_EPS)),
                );
                q_plane[t * q_w..(t + 1) * q_w].copy_from_slice(&row[..q_w]);
                k_plane[t * kv_w..(t + 1) * kv_w].copy_from_slice(&row[q_w..q_w + kv_w]);
                v_plane[t * kv_w..(t + 1) * kv_w].copy_from_slice(&row[q_w + kv_w..]);
            }
            let what = format!("{name}, {} heads of {}", h.n_head, h.head_dim);
            if h.norms {
                let err = relative_error(&got, &want);
                assert!(err < 1e-6, "{what}: relative error {err:.2e}");
            } else {
                assert_eq!(
                    first_difference(&got, &want),
                    None,
                    "{what}: not bit for bit"
                );
            }
        }
    }
}

/// `rope_store` writes what `rope_qk` then `store_rows` on each pool write, bit for bit, on
/// [`ROPE_SHAPES`], from f32 or f16 rows into f32, f16 and bf16 pools at scattered slots: the
/// queries as a plane, the keys and values at their slots' rows, every other row untouched.
#[test]
fn rope_store_writes_what_rope_qk_and_store_rows_write() {
    let slots: Vec<u32> = vec![39, 0, 17, 18, 5];
    let pool_rows = 40usize;
    for h in ROPE_SHAPES {
        for f16_in in [false, true] {
            let r = RopeInputs::new(&h, f16_in);
            let (tokens, q_w, kv_w) = (r.tokens, r.q_w, r.kv_w);
            let planes = r.planes(&format!("rope_qk_{}", ty(f16_in)), &h);
            let lb = Buf::from_slice(&slots);
            for pool in ["f32", "f16", "bf16"] {
                let name = format!("rope_store_{}_{pool}", ty(f16_in));
                let what = format!("{name}, {} heads of {}", h.n_head, h.head_dim);
                let kernel = kernels::rope_store::by_name(&name).expect(&name);
                // Each pool in the type named, poisoned; read back as f32.
                let (mut k, mut v) = (
                    Pool::new(pool, pool_rows * kv_w),
                    Pool::new(pool, pool_rows * kv_w),
                );
                let mut q = Buf::<f32>::poisoned(tokens * q_w);
                let (a, sl) = (r.args(&h), lb.ptr());
                let (qp, kp, vp) = (q.ptr_mut(), k.ptr(), v.ptr());
                unsafe {
                    run(&name, (tokens as u32, 1, 1), THREADS, r.width() * 4, || {
                        kernel(
                            a.x,
                            a.bias,
                            a.q_norm,
                            a.k_norm,
                            a.cos,
                            a.sin,
                            a.positions,
                            sl,
                            qp,
                            kp,
                            vp,
                            h.n_head as i32,
                            h.n_kv as i32,
                            h.head_dim as i32,
                            a.interleaved,
                            ROPE_EPS,
                        )
                    })
                };
                assert_eq!(
                    first_difference(&q.read(&name), &planes[..tokens * q_w]),
                    None,
                    "{what}: the queries"
                );
                // The two launches it replaces, on pools of their own.
                let store = kernels::store_rows::by_name(&format!("store_rows_{pool}")).unwrap();
                for (plane, got, which) in [(1, &k, "keys"), (2, &v, "values")] {
                    let at = tokens * q_w + (plane - 1) * tokens * kv_w;
                    let src = Buf::from_slice(&planes[at..at + tokens * kv_w]);
                    let mut want = Pool::new(pool, pool_rows * kv_w);
                    let (s, l, p) = (src.ptr(), lb.ptr(), want.ptr());
                    unsafe {
                        run("store_rows", elementwise(tokens * kv_w), THREADS, 0, || {
                            store(s, l, p, tokens as u64, kv_w as u64)
                        })
                    };
                    assert_eq!(
                        first_difference(&got.read(), &want.read()),
                        None,
                        "{what}: the {which}"
                    );
                }
            }
        }
    }
}

/// [`RopeInputs::args`]: the RoPE kernels' first arguments.
#[derive(Clone, Copy)]
struct RopeArgs {
    x: *const c_void,
    bias: *const f32,
    q_norm: *const f32,
    k_norm: *const f32,
    cos: *const f32,
    sin: *const f32,
    positions: *const u32,
    interleaved: i32,
}

/// A KV pool of f32, f16 or bf16 values, poisoned, read back as f32.
enum Pool {
    F32(Buf<f32>),
    F16(Buf<f16>),
    Bf16(Buf<half::bf16>),
}

impl Pool {
    fn new(ty: &str, n: usize) -> Self {
        match ty {
            "f32" => Self::F32(Buf::poisoned(n)),
            "f16" => Self::F16(Buf::poisoned(n)),
            _ => Self::Bf16(Buf::poisoned(n)),
        }
    }
    /// The kernel's pointer to it (the launch writes through it).
    fn ptr(&mut self) -> *mut c_void {
        match self {
            Self::F32(b) => b.ptr_mut() as *mut c_void,
            Self::F16(b) => b.ptr_mut() as *mut c_void,
            Self::Bf16(b) => b.ptr_mut() as *mut c_void,
        }
    }
    fn read(&self) -> Vec<f32> {
        match self {
            Self::F32(b) => b.read("pool"),
            Self::F16(b) => from_f16(&b.read("pool")),
            Self::Bf16(b) => b.read("pool").iter().map(|v| v.to_f32()).collect(),
        }
    }
}

/// `store_rows` writes each token's row at its slot in the pool's type (round to nearest even),
/// and nothing else: the other rows keep their poison.
#[test]
fn store_rows_writes_each_row_at_its_slot() {
    let (tokens, width, rows) = (6usize, 192usize, 40usize);
    let slots: Vec<u32> = vec![39, 0, 17, 18, 5, 33];
    let src = values(3, tokens * width, -4.0, 4.0);
    let (sb, lb) = (Buf::from_slice(&src), Buf::from_slice(&slots));
    let check = |name: &str, got: Vec<f32>, round: &dyn Fn(f32) -> f32| {
        for r in 0..rows {
            let row = &got[r * width..(r + 1) * width];
            match slots.iter().position(|&s| s as usize == r) {
                Some(t) => {
                    let want: Vec<f32> = src[t * width..(t + 1) * width]
                        .iter()
                        .map(|&x| round(x))
                        .collect();
                    assert_eq!(
                        first_difference(row, &want),
                        None,
                        "{name}: row {r} (token {t})"
                    );
                }
                None => assert!(row.iter().all(|x| x.is_nan()), "{name}: row {r} written"),
            }
        }
    };
    let launch = |name: &str, pool: *mut c_void| {
        let kernel = kernels::store_rows::by_name(name).expect(name);
        let (s, l) = (sb.ptr(), lb.ptr());
        unsafe {
            run(name, elementwise(tokens * width), THREADS, 0, || {
                kernel(s, l, pool, tokens as u64, width as u64)
            })
        };
    };
    let mut p32 = Buf::<f32>::poisoned(rows * width);
    launch("store_rows_f32", p32.ptr_mut() as *mut c_void);
    check("store_rows_f32", p32.read("pool"), &|x| x);
    let mut p16 = Buf::<f16>::poisoned(rows * width);
    launch("store_rows_f16", p16.ptr_mut() as *mut c_void);
    check("store_rows_f16", from_f16(&p16.read("pool")), &|x| {
        f16::from_f32(x).to_f32()
    });
    let mut pb = Buf::<half::bf16>::poisoned(rows * width);
    launch("store_rows_bf16", pb.ptr_mut() as *mut c_void);
    let got: Vec<f32> = pb.read("pool").iter().map(|v| v.to_f32()).collect();
    check("store_rows_bf16", got, &|x| {
        half::bf16::from_f32(x).to_f32()
    });
}

/// `gemv_q8` (the small steps' 8-bit GEMV) with the launcher's shape (256 threads, a warp per 2
/// outputs, the form with the least room for the rows) against `gemv_q8_reference`, within f32
/// rounding (the lanes add their 16-value sums in another order): inputs with and without a
/// partial last trip (576 = 512 + 64, 1024 = two passes, 1536 = three), an odd number of outputs
/// (the warp's second output past the end), 1 to 8 rows (fewer than a form's room too), f32 and
/// f16 inputs.
#[test]
fn gemv_q8_matches_its_reference() {
    for (inputs, outputs, rows) in [
        (576usize, 37usize, 1usize),
        (1536, 20, 2),
        (576, 64, 3),
        (1024, 33, 5),
        (1024, 33, 8),
    ] {
        let q: Vec<i8> = values(7, outputs * inputs, -128.0, 128.0)
            .iter()
            .map(|v| v.floor().clamp(-128.0, 127.0) as i8)
            .collect();
        let scales = to_f16(&values(11, outputs * inputs / 32, 1e-3, 2e-2));
        let (qb, sb) = (Buf::from_slice(&q), Buf::from_slice(&scales));
        for f16_in in [false, true] {
            let room = [1, 2, 4, 8].into_iter().find(|&r| r >= rows).unwrap();
            let name = format!("gemv_q8_r{room}_{}", ty(f16_in));
            let kernel = kernels::gemv_q8::by_name(&name).expect(&name);
            let x = Input::new(&values(13, rows * inputs, -2.0, 2.0), f16_in);
            let mut y = Buf::<f32>::poisoned(rows * outputs);
            let (qp, sp, xp, yp) = (qb.ptr(), sb.ptr() as *const c_void, x.ptr(), y.ptr_mut());
            let blocks = (outputs.div_ceil(2) * 32).div_ceil(THREADS as usize) as u32;
            unsafe {
                run(&name, (blocks, 1, 1), THREADS, 0, || {
                    kernel(
                        qp,
                        sp,
                        xp,
                        yp,
                        inputs as i32,
                        outputs as i32,
                        rows as i32,
                        0,
                    )
                })
            };
            let want = gemv_q8_reference(&q, &scales, &x.values(), rows, inputs);
            let err = relative_error(&y.read(&name), &want);
            assert!(
                err < 1e-6,
                "{name} {inputs}x{outputs}, {rows} rows: {err:.2e}"
            );
        }
    }
}

/// The GEMV's prefetch (`gemv_prefetch`, its `ahead` argument): with any `ahead` over 0 its
/// lanes ask L2 for exactly the 128-byte lines of every trip of every matrix row after the first
/// trip (which they load at once), and for nothing with 0; a matrix of one trip asks for nothing.
/// A trip is 1,024 values of a row for steps of 1 or 2 rows, 512 above (the kernel's `TRIP`).
#[test]
fn the_gemv_prefetch_asks_for_the_weights_of_the_trips_after_the_first() {
    use std::collections::BTreeSet;
    for (inputs, outputs, rows) in [(2560usize, 9usize, 1usize), (2560, 10, 3), (1024, 6, 2)] {
        let case = Q8Case::new(90, inputs, outputs, rows);
        let trip = if rows <= 2 { 1024 } else { 512 };
        let name = format!("gemv_q8_r{}_f16", room(rows));
        let kernel = kernels::gemv_q8::by_name(&name).expect(&name);
        for ahead in [0, 1, 2, 5] {
            let mut y = Buf::<f32>::poisoned(rows * outputs);
            let yp = y.ptr_mut();
            let base = std::cell::Cell::new(0usize);
            quarry_cuda_emu::take_prefetches();
            case.run(&name, outputs, |q, s, x| unsafe {
                base.set(q as usize);
                kernel(
                    q,
                    s,
                    x,
                    yp,
                    inputs as i32,
                    outputs as i32,
                    rows as i32,
                    ahead,
                )
            });
            let asked: BTreeSet<usize> = quarry_cuda_emu::take_prefetches().into_iter().collect();
            let want: BTreeSet<usize> = match ahead {
                0 => BTreeSet::new(),
                _ => (0..outputs)
                    .flat_map(|o| (trip..inputs).step_by(16).map(move |k| o * inputs + k))
                    .map(|offset| (base.get() + offset) & !127)
                    .collect(),
            };
            let what = format!("{name}, {inputs}x{outputs}, {rows} rows, {ahead} ahead");
            assert_eq!(asked.len(), want.len(), "{what}: lines asked");
            assert!(asked == want, "{what}: other lines than its later trips'");
            assert!(
                y.read(&name).iter().all(|v| v.is_finite()),
                "{what}: output"
            );
        }
    }
}

/// The trips of weights the fused forms' lanes prefetch (`gemv_prefetch`), where the plain form
/// they are held to prefetches none: a prefetch only asks L2 for lines (the emulator records
/// them: `the_gemv_prefetch_asks_for_the_weights_of_the_trips_after_the_first`), so the sums
/// are the same bits either way.
const AHEAD: i32 = 1;

/// The GEMV's `q`, `scales` and f16 input `x` for `outputs` rows of `inputs` values and `rows`
/// rows of activations, from seeds `seed` on.
struct Q8Case {
    q: Vec<i8>,
    scales: Vec<f16>,
    x: Vec<f16>,
}

impl Q8Case {
    fn new(seed: u64, inputs: usize, outputs: usize, rows: usize) -> Self {
        Self {
            q: values(seed, outputs * inputs, -128.0, 128.0)
                .iter()
                .map(|v| v.floor().clamp(-128.0, 127.0) as i8)
                .collect(),
            scales: to_f16(&values(seed + 1, outputs * inputs / 32, 1e-3, 2e-2)),
            x: to_f16(&values(seed + 2, rows * inputs, -2.0, 2.0)),
        }
    }

    /// `gemv_q8_r{room}_f16`'s output, `[rows, outputs]`.
    fn plain(&self, inputs: usize, outputs: usize, rows: usize) -> Vec<f32> {
        let name = format!("gemv_q8_r{}_f16", room(rows));
        let kernel = kernels::gemv_q8::by_name(&name).expect(&name);
        let mut y = Buf::<f32>::poisoned(rows * outputs);
        let yp = y.ptr_mut();
        self.run(&name, outputs, |q, s, x| unsafe {
            kernel(q, s, x, yp, inputs as i32, outputs as i32, rows as i32, 0)
        });
        y.read(&name)
    }

    /// `launch(q, scales, x)` under `name`, with the launcher's grid: a warp per 2 outputs (for
    /// a GLU, per gate/up pair: as many).
    fn run(
        &self,
        name: &str,
        outputs: usize,
        launch: impl Fn(*const i8, *const c_void, *const c_void),
    ) {
        let xb = Buf::from_slice(&self.x);
        self.run_on(name, outputs, 0, |q, s| {
            launch(q, s, xb.ptr() as *const c_void)
        });
    }

    /// [`Q8Case::run`] with the caller's input, and `shared` bytes of dynamic shared memory.
    fn run_on(
        &self,
        name: &str,
        outputs: usize,
        shared: usize,
        launch: impl Fn(*const i8, *const c_void),
    ) {
        let (qb, sb) = (Buf::from_slice(&self.q), Buf::from_slice(&self.scales));
        let (q, s) = (qb.ptr(), sb.ptr() as *const c_void);
        let blocks = (outputs.div_ceil(2) * 32).div_ceil(THREADS as usize) as u32;
        unsafe { run(name, (blocks, 1, 1), THREADS, shared, || launch(q, s)) };
    }

    /// The case with `rows` rows of a residual stream (f32, from `seed`) in place of its input:
    /// the stream, its norm's weight, and the case whose input is the stream normalized by
    /// `rms_norm_f32_f16` (what the `_norm` forms must multiply).
    fn normed(mut self, seed: u64, inputs: usize, rows: usize) -> (Vec<f32>, Vec<f32>, Self) {
        let stream = values(seed, rows * inputs, -3.0, 3.0);
        let w = values(seed + 1, inputs, 0.5, 1.5);
        let name = "rms_norm_f32_f16";
        let kernel = kernels::rms_norm::by_name(name).expect(name);
        let (xb, wb) = (Buf::from_slice(&stream), Buf::from_slice(&w));
        let mut h = Buf::<f16>::poisoned(rows * inputs);
        let (xp, wp, hp) = (
            xb.ptr() as *const c_void,
            wb.ptr(),
            h.ptr_mut() as *mut c_void,
        );
        unsafe {
            run(name, (rows as u32, 1, 1), THREADS, 0, || {
                kernel(xp, hp, wp, inputs as i32, NORM_EPS)
            })
        };
        self.x = h.read(name);
        (stream, w, self)
    }
}

/// The `_norm` forms' epsilon.
const NORM_EPS: f32 = 1e-5;

/// The GEMV's form with room for `rows` rows (the launcher's choice).
fn room(rows: usize) -> usize {
    [1, 2, 4, 8]
        .into_iter()
        .find(|&r| r >= rows)
        .expect("at most 8 rows")
}

/// The GEMV's shapes for its fused epilogues: a partial last trip, several passes, an odd number
/// of outputs (a GLU's gate/up pairs), 1 to 8 rows.
const Q8_FUSED_SHAPES: [(usize, usize, usize); 5] = [
    (576, 74, 1),
    (1536, 20, 2),
    (576, 66, 3),
    (1024, 34, 5),
    (1024, 38, 8),
];

/// `gemv_q8_add` (the output and down projections adding into the residual stream) equals the
/// plain form's sums added into the stream, bit for bit (`__fadd_rn`, as `add_into`), and writes
/// nothing past the stream's rows.
#[test]
fn gemv_q8_add_adds_the_plain_forms_sums_into_the_stream() {
    for (i, &(inputs, outputs, rows)) in Q8_FUSED_SHAPES.iter().enumerate() {
        let case = Q8Case::new(50 + 10 * i as u64, inputs, outputs, rows);
        let sums = case.plain(inputs, outputs, rows);
        let stream = values(60 + i as u64, rows * outputs, -3.0, 3.0);
        // The stream's rows, then a poisoned row the kernel must leave alone.
        let mut buf = stream.clone();
        buf.extend(std::iter::repeat_n(f32::NAN, outputs));
        let mut x = Buf::from_slice(&buf);
        let name = format!("gemv_q8_add_r{}_f16", room(rows));
        let kernel = kernels::gemv_q8::by_name(&name).expect(&name);
        let xp = x.ptr_mut();
        case.run(&name, outputs, |q, s, a| unsafe {
            kernel(
                q,
                s,
                a,
                xp,
                inputs as i32,
                outputs as i32,
                rows as i32,
                AHEAD,
            )
        });
        let got = x.read(&name);
        let want: Vec<f32> = stream.iter().zip(&sums).map(|(s, y)| s + y).collect();
        assert_eq!(
            first_difference(&got[..rows * outputs], &want),
            None,
            "{inputs}x{outputs}, {rows} rows"
        );
        assert!(
            got[rows * outputs..].iter().all(|v| v.is_nan()),
            "written past the stream"
        );
    }
}

/// The stream a `_norm` form reads (f32 rows) and its norm's weight, as kernel pointers.
#[derive(Clone, Copy)]
struct NormArgs {
    stream: *const f32,
    weight: *const f32,
}

impl Q8Case {
    /// `gemv_q8_glu_{act}_r{room}_f16_{out}`'s `[rows, outputs / 2]` (with `norm`,
    /// `gemv_q8_norm_glu_…_f32_{out}` on the stream), read back as f32.
    fn glu(
        &self,
        act: &str,
        f16_out: bool,
        (inputs, outputs, rows): (usize, usize, usize),
        norm: Option<NormArgs>,
    ) -> Vec<f32> {
        let mut y = Output::new(rows * (outputs / 2), f16_out);
        let yp = y.ptr();
        let (i, o, n) = (inputs as i32, outputs as i32, rows as i32);
        let name = match norm {
            None => {
                let name = format!("gemv_q8_glu_{act}_r{}_f16_{}", room(rows), ty(f16_out));
                let kernel = kernels::gemv_q8_glu::by_name(&name).expect(&name);
                self.run(&name, outputs, |q, s, x| unsafe {
                    kernel(q, s, x, yp, i, o, n, AHEAD)
                });
                name
            }
            Some(m) => {
                let name = format!("gemv_q8_norm_glu_{act}_r{}_f32_{}", room(rows), ty(f16_out));
                let kernel = kernels::gemv_q8_norm_glu::by_name(&name).expect(&name);
                self.run_on(&name, outputs, room(rows) * inputs * 2, |q, s| unsafe {
                    kernel(q, s, m.stream, yp, i, o, n, AHEAD, m.weight, NORM_EPS)
                });
                name
            }
        };
        y.read(&name)
    }

    /// `gemv_q8_rope_r{room}_f16_{pool}`'s queries, keys and values (with `norm`,
    /// `gemv_q8_norm_rope_…_f32_{pool}` on the stream) for heads `h` at `slots`, into a fresh
    /// poisoned plane and pools of `pool_rows` rows, read back as f32.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        h: &Heads,
        a: RopeArgs,
        pool: &str,
        slots: *const u32,
        pool_rows: usize,
        (inputs, rows): (usize, usize),
        norm: Option<NormArgs>,
    ) -> [Vec<f32>; 3] {
        let (q_w, kv_w) = (h.n_head * h.head_dim, h.n_kv * h.head_dim);
        let width = q_w + 2 * kv_w;
        let mut out_q = Buf::<f32>::poisoned(rows * q_w);
        let (mut k, mut v) = (
            Pool::new(pool, pool_rows * kv_w),
            Pool::new(pool, pool_rows * kv_w),
        );
        let (qp, kp, vp) = (out_q.ptr_mut(), k.ptr(), v.ptr());
        let (n_head, n_kv, dim) = (h.n_head as i32, h.n_kv as i32, h.head_dim as i32);
        let (i, n) = (inputs as i32, rows as i32);
        // Both forms' arguments after their input, the same (src/kernels.rs); the `_norm`
        // form's norm weight and epsilon after them.
        macro_rules! rope_form {
            ($kernel:expr, $q:expr, $s:expr, $x:expr $(, $tail:expr)*) => {
                $kernel(
                    $q, $s, $x, a.bias, a.cos, a.sin, a.positions, slots, qp, kp, vp, n_head,
                    n_kv, dim, a.interleaved, i, n, AHEAD $(, $tail)*
                )
            };
        }
        let name = match norm {
            None => {
                let name = format!("gemv_q8_rope_r{}_f16_{pool}", room(rows));
                let kernel = kernels::gemv_q8_rope::by_name(&name).expect(&name);
                self.run(&name, width, |q, s, x| unsafe {
                    rope_form!(kernel, q, s, x)
                });
                name
            }
            Some(m) => {
                let name = format!("gemv_q8_norm_rope_r{}_f32_{pool}", room(rows));
                let kernel = kernels::gemv_q8_norm_rope::by_name(&name).expect(&name);
                self.run_on(&name, width, room(rows) * inputs * 2, |q, s| unsafe {
                    rope_form!(kernel, q, s, m.stream, m.weight, NORM_EPS)
                });
                name
            }
        };
        [out_q.read(&name), k.read(), v.read()]
    }
}

/// `gemv_q8_glu` (the stacked gate/up projection with the activation in its epilogue) equals
/// the plain form's `[rows, 2f]` sums through `glu_{act}_f32_{out}`, bit for bit, for SiLU and
/// GELU-tanh, f16 and f32 outputs, an odd `f` among them.
#[test]
fn gemv_q8_glu_equals_the_plain_form_then_the_glu() {
    for (i, &(inputs, outputs, rows)) in Q8_FUSED_SHAPES.iter().enumerate() {
        let case = Q8Case::new(80 + 10 * i as u64, inputs, outputs, rows);
        let gate_up = Buf::from_slice(&case.plain(inputs, outputs, rows));
        let f = outputs / 2;
        for act in ["silu", "gelu_tanh"] {
            for f16_out in [true, false] {
                let glu = format!("glu_{act}_f32_{}", ty(f16_out));
                let kernel = kernels::glu::by_name(&glu).expect(&glu);
                let mut want = Output::new(rows * f, f16_out);
                let (gp, wp) = (gate_up.ptr() as *const c_void, want.ptr());
                unsafe {
                    run(&glu, elementwise(rows * f), THREADS, 0, || {
                        kernel(gp, wp, rows as u64, f as u64)
                    })
                };
                let got = case.glu(act, f16_out, (inputs, outputs, rows), None);
                assert_eq!(
                    first_difference(&got, &want.read(&glu)),
                    None,
                    "{act} to {}: {inputs}x{outputs}, {rows} rows",
                    ty(f16_out)
                );
            }
        }
    }
}

/// `gemv_q8_rope` (the stacked Q/K/V projection with RoPE and the KV writes in its epilogue)
/// writes what the plain form then `rope_store_f32_{pool}` write, bit for bit: the queries, and
/// the keys and values at their slots' rows of f32, f16 and bf16 pools, every other row left
/// alone. SmolLM2's heads (interleaved pairs), Qwen2.5's (halves, a bias) and Llama 3's (groups
/// of 4, heads of 128), 1, 3 and 5 rows.
#[test]
fn gemv_q8_rope_writes_what_the_plain_form_then_rope_store_write() {
    let llama3 = Heads {
        n_head: 8,
        n_kv: 2,
        head_dim: 128,
        style: RopeStyle::Halves,
        bias: false,
        norms: false,
    };
    let [smollm2, qwen25, _] = ROPE_SHAPES;
    let (slots, pool_rows, inputs) = (vec![39u32, 0, 17, 18, 5], 40usize, 256usize);
    let lb = Buf::from_slice(&slots);
    for (i, h) in [smollm2, qwen25, llama3].iter().enumerate() {
        let r = RopeInputs::new(h, false);
        let (q_w, kv_w, width) = (r.q_w, r.kv_w, r.width());
        for rows in [1usize, 3, 5] {
            let case = Q8Case::new(110 + 10 * i as u64, inputs, width, rows);
            let qkv = Buf::from_slice(&case.plain(inputs, width, rows));
            for pool in ["f32", "f16", "bf16"] {
                let what = format!(
                    "{pool} pool, {} heads of {}, {rows} rows",
                    h.n_head, h.head_dim
                );
                let a = RopeArgs {
                    x: qkv.ptr() as *const c_void,
                    ..r.args(h)
                };
                let (n_head, n_kv, dim) = (h.n_head as i32, h.n_kv as i32, h.head_dim as i32);
                // The two launches the fused form replaces.
                let name = format!("rope_store_f32_{pool}");
                let kernel = kernels::rope_store::by_name(&name).expect(&name);
                let mut want_q = Buf::<f32>::poisoned(rows * q_w);
                let mut want_k = Pool::new(pool, pool_rows * kv_w);
                let mut want_v = Pool::new(pool, pool_rows * kv_w);
                let (qp, kp, vp, sl) = (want_q.ptr_mut(), want_k.ptr(), want_v.ptr(), lb.ptr());
                unsafe {
                    run(&name, (rows as u32, 1, 1), THREADS, width * 4, || {
                        kernel(
                            a.x,
                            a.bias,
                            a.q_norm,
                            a.k_norm,
                            a.cos,
                            a.sin,
                            a.positions,
                            sl,
                            qp,
                            kp,
                            vp,
                            n_head,
                            n_kv,
                            dim,
                            a.interleaved,
                            ROPE_EPS,
                        )
                    })
                };
                let want = [want_q.read(&name), want_k.read(), want_v.read()];
                let got = case.rope(h, a, pool, sl, pool_rows, (inputs, rows), None);
                for ((got, want), which) in got.iter().zip(&want).zip(["queries", "keys", "values"])
                {
                    assert_eq!(first_difference(got, want), None, "{what}: the {which}");
                }
            }
        }
    }
}

/// The `_norm` forms (the stream's rows normalized in the GEMV's prologue, each block into its
/// shared memory) equal `rms_norm_f32_f16` then the form without the prologue, bit for bit: the
/// GLU (both activations, f16 and f32 out) and RoPE ones (SmolLM2's and Qwen2.5's heads, three
/// pool types), 1 and 2 rows, rows of 576 and 1,024 values.
#[test]
fn gemv_q8_norm_forms_equal_rms_norm_then_the_plain_forms() {
    for (i, &(inputs, outputs)) in [(576usize, 74usize), (1024, 38)].iter().enumerate() {
        for rows in [1usize, 2] {
            let seed = 150 + 10 * i as u64;
            let (stream, w, case) =
                Q8Case::new(seed, inputs, outputs, rows).normed(seed + 5, inputs, rows);
            let (sb, wb) = (Buf::from_slice(&stream), Buf::from_slice(&w));
            let norm = NormArgs {
                stream: sb.ptr(),
                weight: wb.ptr(),
            };
            for act in ["silu", "gelu_tanh"] {
                for f16_out in [true, false] {
                    let shape = (inputs, outputs, rows);
                    let want = case.glu(act, f16_out, shape, None);
                    let got = case.glu(act, f16_out, shape, Some(norm));
                    let what = format!("{act} to {}: {inputs}x{outputs}, {rows} rows", ty(f16_out));
                    assert_eq!(first_difference(&got, &want), None, "{what}");
                }
            }
        }
    }
    let [smollm2, qwen25, _] = ROPE_SHAPES;
    let (slots, pool_rows, inputs) = (vec![39u32, 0], 40usize, 576usize);
    let lb = Buf::from_slice(&slots);
    for (i, h) in [smollm2, qwen25].iter().enumerate() {
        let r = RopeInputs::new(h, false);
        for rows in [1usize, 2] {
            let seed = 170 + 10 * i as u64;
            let (stream, w, case) =
                Q8Case::new(seed, inputs, r.width(), rows).normed(seed + 5, inputs, rows);
            let (sb, wb) = (Buf::from_slice(&stream), Buf::from_slice(&w));
            let norm = NormArgs {
                stream: sb.ptr(),
                weight: wb.ptr(),
            };
            for pool in ["f32", "f16", "bf16"] {
                let what = format!("{pool} pool, {} heads, {rows} rows", h.n_head);
                let at = (lb.ptr(), pool_rows);
                let want = case.rope(h, r.args(h), pool, at.0, at.1, (inputs, rows), None);
                let got = case.rope(h, r.args(h), pool, at.0, at.1, (inputs, rows), Some(norm));
                for ((got, want), which) in got.iter().zip(&want).zip(["queries", "keys", "values"])
                {
                    assert_eq!(first_difference(got, want), None, "{what}: the {which}");
                }
            }
        }
    }
}
