//! Shared pieces of the CPU kernels: the run-time feature check and the elementwise functions
//! (`exp`, and through it softmax and SiLU) that the attention and MLP steps apply to whole rows.
//!
//! Each has a scalar form with the same contract, used where AVX2 and FMA are missing. The vector
//! `exp` is a range reduction to `2^n·e^r`, `|r| ≤ ln2/2`, with a degree-6 polynomial for `e^r`:
//! within 2·10⁻⁷ relative of `f32::exp` (tested), where libm's call per value was a tenth of a
//! batch-32 decode step.

/// Proof that this CPU runs AVX2 and FMA: only [`Avx2::detect`] makes one, after asking the CPU.
/// A safe function that takes `Option<Avx2>` may call `#[target_feature(enable = "avx2,fma")]`
/// code when it holds `Some`: the type carries the soundness, not the caller's word.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// `Some` where the AVX2 + FMA kernels can run (checked once per call site, not per value).
    pub(crate) fn detect() -> Option<Avx2> {
        #[cfg(target_arch = "x86_64")]
        {
            (std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
                .then_some(Avx2(()))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    }
}

/// `row = softmax(row)`.
pub(crate) fn softmax_in_place(row: &mut [f32], avx: Option<Avx2>) {
    #[cfg(target_arch = "x86_64")]
    if avx.is_some() {
        // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
        unsafe { softmax_avx2(row) };
        return;
    }
    let _ = avx;
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

/// `out = silu(gate) · up` (SwiGLU).
pub(crate) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32], avx: Option<Avx2>) {
    gated::<false>(gate, up, out, avx)
}

/// `out = gelu(gate) · up` (GeGLU), GELU in its tanh approximation,
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, computed as `x·sigmoid(2·√(2/π)·(…))`.
pub(crate) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32], avx: Option<Avx2>) {
    gated::<true>(gate, up, out, avx)
}

/// `√(2/π)`, doubled: GELU's sigmoid argument is `GELU_K · (x + GELU_C · x³)`.
const GELU_K: f32 = 2.0 * 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// `x · sigmoid(a)` with `a = x` (SiLU) or GELU's argument: both activations are `x / (1 + e^-a)`.
#[inline(always)]
fn gate_scalar<const GELU: bool>(x: f32) -> f32 {
    let a = if GELU {
        GELU_K * (x + GELU_C * x * x * x)
    } else {
        x
    };
    x / (1.0 + (-a).exp())
}

fn gated<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32], avx: Option<Avx2>) {
    #[cfg(target_arch = "x86_64")]
    if avx.is_some() {
        // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
        unsafe { gated_avx2::<GELU>(gate, up, out) };
        return;
    }
    let _ = avx;
    for ((a, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *a = gate_scalar::<GELU>(g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `e^x` per lane; inputs are clamped to where the result is a normal float.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn exp_avx2(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    // r = x - n·ln2, with ln2 split so that n·LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let scale = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m = _mm256_set1_ps(max);
    let mut sum8 = _mm256_setzero_ps();
    let mut chunks = row.chunks_exact_mut(8);
    for c in chunks.by_ref() {
        let e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
        sum8 = _mm256_add_ps(sum8, e);
        _mm256_storeu_ps(c.as_mut_ptr(), e);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum8);
    let mut sum: f32 = lanes.iter().sum();
    for x in chunks.into_remainder() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let arg = if GELU {
            let g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
            let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_C), g3, g);
            _mm256_mul_ps(_mm256_set1_ps(GELU_K), inner)
        } else {
            g
        };
        let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), arg));
        let a = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), a);
        i += 8;
    }
    for j in i..n {
        out[j] = gate_scalar::<GELU>(gate[j]) * up[j];
    }
}

/// What the kernel tests share: the AVX2 check and reproducible input values.
#[cfg(test)]
pub(crate) mod testing {
    /// Whether a test can compare an AVX2 kernel with its scalar form here. Where it cannot, it says
    /// so on stderr, so a machine without AVX2 shows the comparison as not made rather than passed.
    pub(crate) fn avx2_or_say(test: &str) -> bool {
        let yes = super::Avx2::detect().is_some();
        if !yes {
            eprintln!("{test}: no AVX2 and FMA on this CPU; the vector kernel is not compared");
        }
        yes
    }

    pub(crate) use crate::reference::{relative_error, values};

    /// A tensor's elements in f32, flattened (whatever its element type).
    pub(crate) fn f32s(t: &candle_core::Tensor) -> Vec<f32> {
        t.to_dtype(candle_core::DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector `exp` against `f32::exp` over the range softmax and SiLU use, and the vector
    /// softmax and SiLU against their scalar forms.
    #[test]
    fn vector_exp_softmax_and_silu_match_scalar() {
        if !testing::avx2_or_say("vector_exp_softmax_and_silu_match_scalar") {
            return;
        }
        let xs: Vec<f32> = (0..20_001).map(|i| -80.0 + i as f32 * 0.008).collect();
        let mut worst = 0f32;
        for c in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp_avx2(_mm256_loadu_ps(c.as_ptr()))) };
            for (g, x) in got.iter().zip(c) {
                worst = worst.max((g - x.exp()).abs() / x.exp());
            }
        }
        assert!(worst < 2e-7, "relative error {worst}");
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 23) as f32 * 0.9 - 10.0)
            .collect();
        let (mut a, mut b) = (row.clone(), row.clone());
        softmax_in_place(&mut a, None);
        softmax_in_place(&mut b, Avx2::detect());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-6 * x.max(1e-30), "{x} vs {y}");
        }
        let (gate, up): (Vec<f32>, Vec<f32>) = row.iter().map(|&g| (g, 1.0 - g * 0.1)).unzip();
        for gelu in [false, true] {
            let (mut a, mut b) = (vec![0f32; 37], vec![0f32; 37]);
            let f = if gelu { geglu } else { swiglu };
            f(&gate, &up, &mut a, None);
            f(&gate, &up, &mut b, Avx2::detect());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * x.abs().max(1e-6), "{x} vs {y}");
            }
        }
        // The GELU form against its textbook tanh definition.
        for &x in &row {
            let want = 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh());
            let got = gate_scalar::<true>(x);
            assert!(
                (want - got).abs() <= 1e-6 * want.abs().max(1.0),
                "gelu({x}) {got} vs {want}"
            );
        }
    }
}
