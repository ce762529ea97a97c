//! Weight matrices: candle's quantized matmul, plus kernels of our own for Q4_1 and Q8_0 on CPU.
//!
//! candle-core 0.11 multiplies Q4_1 weights with a scalar dot product (no SIMD path), which made
//! the required SmolLM2 Q4_1 model about 10× slower than its Q4_0 and Q8_0 kernels; and its Q8_0
//! matmul streams the whole weight matrix once per activation row, which at batch 32 made the
//! 28 MB vocabulary projection a fifth of a decode step. [`QuantMatrix`] does the same arithmetic as
//! llama.cpp's `ggml_vec_dot_q4_1_q8_1` and `ggml_vec_dot_q8_0_q8_0`:
//! - activations are quantized per 32-block to 8 bits with a scale `d` (and, for Q4_1, `s = d·Σq`),
//!   both rounded to f16, as `quantize_row_q8_1`/`quantize_row_q8_0` do;
//! - a Q4_1 block's dot product is `d_w·d_a·Σ(q_w·q_a) + m_w·s_a`, a Q8_0 block's `d_w·d_a·Σ(q_w·q_a)`,
//!   summed over blocks in eight float lanes.
//!
//! On x86-64 with AVX2 and FMA the integer part runs on `maddubs`/`madd`, four activation rows per
//! loaded weight block; elsewhere a scalar loop computes the identical integer sums.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;

use crate::error::Result;

const QK: usize = 32;

/// A projection `y = x·Wᵀ`.
pub(crate) enum Linear {
    Candle(QMatMul),
    Quant(QuantMatrix),
}

impl Linear {
    pub(crate) fn new(t: QTensor, device: &Device) -> Result<Self> {
        if device.is_cpu() && Format::of(t.dtype()).is_some() {
            return Ok(Linear::Quant(QuantMatrix::new(&[t])?));
        }
        Ok(Linear::Candle(QMatMul::from_qtensor(t)?))
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Quant(m) => m.forward(x),
        }
    }
}

/// Projections of the same input (Q, K and V; gate and up). On CPU, parts of one type with a kernel
/// here are stacked into one matrix, so the input is quantized once and the worker pool is woken
/// once instead of per projection; other types keep one candle matmul each.
pub(crate) enum Fused {
    Stacked(QuantMatrix, Vec<usize>),
    Separate(Vec<Linear>),
}

impl Fused {
    pub(crate) fn new(parts: Vec<QTensor>, device: &Device) -> Result<Self> {
        let dtype = parts[0].dtype();
        if device.is_cpu()
            && Format::of(dtype).is_some()
            && parts.iter().all(|t| t.dtype() == dtype)
        {
            let widths = parts.iter().map(|t| t.shape().dims()[0]).collect();
            return Ok(Fused::Stacked(QuantMatrix::new(&parts)?, widths));
        }
        Ok(Fused::Separate(
            parts
                .into_iter()
                .map(|t| Linear::new(t, device))
                .collect::<Result<_>>()?,
        ))
    }

    /// One output per part, each `[rows, width]` and contiguous.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Fused::Separate(ls) => ls.iter().map(|l| l.forward(x)).collect(),
            Fused::Stacked(m, widths) => {
                let y = m.forward(x)?;
                let mut at = 0;
                let mut out = Vec::with_capacity(widths.len());
                for &w in widths {
                    out.push(y.narrow(1, at, w)?.contiguous()?);
                    at += w;
                }
                Ok(out)
            }
        }
    }
}

/// The block formats with a kernel here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    /// f16 `d`, f16 `m`, 16 bytes of nibbles: `w = d·q + m`, `q` in 0..16.
    Q4_1,
    /// f16 `d`, 32 signed bytes: `w = d·q`.
    Q8_0,
}

impl Format {
    fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one GGUF block.
    fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
        }
    }

    /// Bytes of quantized values per block (after the scales are split out).
    fn qs_bytes(self) -> usize {
        match self {
            Format::Q4_1 => QK / 2,
            Format::Q8_0 => QK,
        }
    }
}

/// A weight matrix of `rows` outputs by `cols` inputs. The GGUF blocks are split at load into
/// quantized values and f32 scales, so the f16 conversion is not redone for every activation row.
pub(crate) struct QuantMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    /// [`Format::qs_bytes`] per block, row-major (Q8_0 bytes are `i8`).
    qs: Vec<u8>,
    /// Per block: the scale `d`, and for Q4_1 the minimum `m` (empty for Q8_0).
    d: Vec<f32>,
    m: Vec<f32>,
}

/// Activation rows quantized to 8 bits per 32-block.
struct QuantRows {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

const ROUND_MAGIC: f32 = 12_582_912.0;

/// Activation rows multiplied against one loaded weight block at a time.
const ROW_TILE: usize = 4;

/// Weight rows per work item: a group stays in L1 while every activation row streams past it, so
/// the weights are read from memory once per call whatever the number of activation rows.
const GROUP: usize = 8;

impl QuantMatrix {
    /// The rows of `parts` (all of one format, all the same width), stacked in order.
    fn new(parts: &[QTensor]) -> Result<Self> {
        let format = Format::of(parts[0].dtype()).expect("a format with a kernel");
        let cols = parts[0].shape().dims2()?.1;
        let mut m = Self {
            format,
            rows: 0,
            cols,
            qs: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
        };
        for t in parts {
            let (rows, c) = t.shape().dims2()?;
            if c % QK != 0 || c != cols || Format::of(t.dtype()) != Some(format) {
                return Err(crate::ModelError::Forward {
                    message: format!(
                        "{format:?} matrix: a {:?} part of width {c} does not stack with width \
                         {cols} (a multiple of {QK})",
                        t.dtype()
                    ),
                });
            }
            let raw = t.data()?;
            let bb = format.block_bytes();
            debug_assert_eq!(raw.len(), rows * cols / QK * bb);
            let half = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
            for b in raw.chunks_exact(bb) {
                m.d.push(half(b, 0));
                match format {
                    Format::Q4_1 => {
                        m.m.push(half(b, 2));
                        m.qs.extend_from_slice(&b[4..]);
                    }
                    Format::Q8_0 => m.qs.extend_from_slice(&b[2..]),
                }
            }
            m.rows += rows;
        }
        Ok(m)
    }

    /// Weight row `c`.
    fn row(&self, c: usize) -> Weights<'_> {
        let nb = self.cols / QK;
        let qb = self.format.qs_bytes();
        Weights {
            qs: &self.qs[c * nb * qb..(c + 1) * nb * qb],
            d: &self.d[c * nb..(c + 1) * nb],
            m: match self.format {
                Format::Q4_1 => &self.m[c * nb..(c + 1) * nb],
                Format::Q8_0 => &[],
            },
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        if k != self.cols {
            return Err(crate::ModelError::Forward {
                message: format!(
                    "{:?} matmul: input width {k}, weights {}",
                    self.format, self.cols
                ),
            });
        }
        let x = x.contiguous()?;
        let a = crate::attention::with_host_slice(&x, |xs| quantize_rows(xs, m, k))?;
        // Row views made once, not per weight row and tile.
        let acts: Vec<Act> = (0..m).map(|r| a.row(r, k)).collect();
        let n = self.rows;
        let mut dst = vec![0f32; m * n];
        let dst_ptr = dst.as_mut_ptr() as usize;
        let avx = has_avx2();
        let format = self.format;
        candle_core::utils::barrier_pool().execute_chunked(n.div_ceil(GROUP), |range| {
            for c in range.start * GROUP..(range.end * GROUP).min(n) {
                let w = self.row(c);
                let mut r = 0;
                while r < m {
                    let tile = ROW_TILE.min(m - r);
                    let act = |i: usize| acts[r + i.min(tile - 1)];
                    let out: [f32; ROW_TILE] = if avx && tile == ROW_TILE {
                        // SAFETY: AVX2 and FMA were detected at run time.
                        unsafe { dot_avx2::<ROW_TILE>(format, &w, std::array::from_fn(act)) }
                    } else {
                        std::array::from_fn(|i| match (i < tile, avx) {
                            (false, _) => 0.0,
                            // SAFETY: as above.
                            (true, true) => unsafe { dot_avx2::<1>(format, &w, [act(i)])[0] },
                            (true, false) => dot_scalar(format, &w, &act(i)),
                        })
                    };
                    for (i, &v) in out.iter().enumerate().take(tile) {
                        // SAFETY: each (row, c) is written by exactly one work item.
                        unsafe { *(dst_ptr as *mut f32).add((r + i) * n + c) = v };
                    }
                    r += tile;
                }
            }
        });
        Ok(Tensor::from_vec(dst, (m, n), x.device())?)
    }
}

/// One weight row.
struct Weights<'a> {
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

/// One quantized activation row.
#[derive(Clone, Copy)]
struct Act<'a> {
    qs: &'a [i8],
    d: &'a [f32],
    s: &'a [f32],
}

impl QuantRows {
    fn row(&self, r: usize, k: usize) -> Act<'_> {
        let nb = k / QK;
        Act {
            qs: &self.qs[r * k..(r + 1) * k],
            d: &self.d[r * nb..(r + 1) * nb],
            s: &self.s[r * nb..(r + 1) * nb],
        }
    }
}

/// llama.cpp's `quantize_row_q8_1` (and, ignoring `s`, `quantize_row_q8_0`): per block,
/// `d = max|x| / 127`, `q = round(x·127/max|x|)`, `s = d·Σq`.
fn quantize_rows(xs: &[f32], m: usize, k: usize) -> QuantRows {
    let nb = m * k / QK;
    let mut out = QuantRows {
        qs: vec![0; m * k],
        d: Vec::with_capacity(nb),
        s: Vec::with_capacity(nb),
    };
    for (x, q) in xs.chunks_exact(QK).zip(out.qs.chunks_exact_mut(QK)) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qi, &xi) in q.iter_mut().zip(x) {
            // Round half to even, as llama.cpp's SIMD quantizer does; |x·id| ≤ 127, so adding and
            // subtracting 1.5·2^23 rounds in the FPU's default mode without a libm call.
            *qi = (((xi * id) + ROUND_MAGIC) - ROUND_MAGIC) as i8;
            sum += *qi as i32;
        }
        out.d.push(f16::from_f32(d).to_f32());
        out.s.push(f16::from_f32(d * sum as f32).to_f32());
    }
    out
}

fn dot_scalar(format: Format, w: &Weights, a: &Act) -> f32 {
    let mut sum = 0f32;
    for i in 0..w.d.len() {
        let x = &a.qs[i * QK..(i + 1) * QK];
        let mut isum = 0i32;
        match format {
            Format::Q4_1 => {
                let q = &w.qs[i * QK / 2..(i + 1) * QK / 2];
                for j in 0..QK / 2 {
                    isum += (q[j] & 0x0F) as i32 * x[j] as i32;
                    isum += (q[j] >> 4) as i32 * x[j + QK / 2] as i32;
                }
                sum += isum as f32 * w.d[i] * a.d[i] + w.m[i] * a.s[i];
            }
            Format::Q8_0 => {
                let q = &w.qs[i * QK..(i + 1) * QK];
                for j in 0..QK {
                    isum += q[j] as i8 as i32 * x[j] as i32;
                }
                sum += isum as f32 * (w.d[i] * a.d[i]);
            }
        }
    }
    sum
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

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dot_avx2<const R: usize>(_: Format, _: &Weights, _: [Act; R]) -> [f32; R] {
    unreachable!("has_avx2() is false off x86-64")
}

/// `R` dot products of one weight row with `R` activation rows; each weight block is loaded (and
/// for Q4_1 unpacked) once for all of them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const R: usize>(format: Format, w: &Weights, a: [Act; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0f32; R];
    for i in 0..w.d.len() {
        let wd = *w.d.get_unchecked(i);
        match format {
            Format::Q4_1 => {
                let packed = _mm_loadu_si128(w.qs.as_ptr().add(i * QK / 2) as *const __m128i);
                let lo = _mm_and_si128(packed, low);
                let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
                // Low nibbles pair with activations 0..16, high nibbles with 16..32.
                let wq = _mm256_set_m128i(hi, lo);
                let wm = *w.m.get_unchecked(i);
                for r in 0..R {
                    let aq = _mm256_loadu_si256(a[r].qs.as_ptr().add(i * QK) as *const __m256i);
                    let ints = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, aq), ones);
                    let scale = _mm256_set1_ps(wd * *a[r].d.get_unchecked(i));
                    acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ints), acc[r]);
                    mins[r] += wm * *a[r].s.get_unchecked(i);
                }
            }
            Format::Q8_0 => {
                let wq = _mm256_loadu_si256(w.qs.as_ptr().add(i * QK) as *const __m256i);
                // maddubs takes unsigned × signed: |w| against a with w's sign.
                let wabs = _mm256_sign_epi8(wq, wq);
                for r in 0..R {
                    let aq = _mm256_loadu_si256(a[r].qs.as_ptr().add(i * QK) as *const __m256i);
                    let signed = _mm256_sign_epi8(aq, wq);
                    let ints = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, signed), ones);
                    let scale = _mm256_set1_ps(wd * *a[r].d.get_unchecked(i));
                    acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ints), acc[r]);
                }
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let h = _mm_add_ps(
            _mm256_castps256_ps128(acc[r]),
            _mm256_extractf128_ps(acc[r], 1),
        );
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        out[r] = _mm_cvtss_f32(h) + mins[r];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel against candle's own dequantize-then-matmul on random weights, and the SIMD path
    /// against the scalar one.
    fn matches_dequantized_weights(dtype: GgmlDType) {
        let dev = Device::Cpu;
        let (n, k, m) = (40, 96, 5);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let exact = q.dequantize(&dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let want = x.matmul(&exact.t().unwrap()).unwrap();
        let mat = QuantMatrix::new(std::slice::from_ref(&q)).unwrap();
        assert_eq!(mat.format, Format::of(dtype).unwrap());
        let got = mat.forward(&x).unwrap();
        let max_abs = |t: &Tensor| {
            t.abs()
                .and_then(|a| a.max_all())
                .and_then(|m| m.to_scalar::<f32>())
                .unwrap()
        };
        let diff = max_abs(&(got - &want).unwrap());
        let scale = max_abs(&want);
        // 8-bit activations: about 1% of the largest output.
        assert!(diff < 0.02 * scale, "{dtype:?}: {diff} vs {scale}");
        // The SIMD and scalar paths compute the same integer sums.
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let a = quantize_rows(&xs, m, k);
        for c in 0..n {
            let w = mat.row(c);
            if has_avx2() {
                let four =
                    unsafe { dot_avx2::<4>(mat.format, &w, std::array::from_fn(|r| a.row(r, k))) };
                for (r, v) in four.iter().enumerate() {
                    let s = dot_scalar(mat.format, &w, &a.row(r, k));
                    assert!((s - v).abs() <= 1e-4 * s.abs().max(1.0), "{s} vs {v}");
                }
            }
        }
    }

    #[test]
    fn q4_1_matmul_matches_dequantized_weights() {
        matches_dequantized_weights(GgmlDType::Q4_1);
    }

    #[test]
    fn q8_0_matmul_matches_dequantized_weights() {
        matches_dequantized_weights(GgmlDType::Q8_0);
    }

    /// candle's Q8_0 matmul quantizes activations the same way and sums the same integer products,
    /// so the kernel agrees with it to float rounding.
    #[test]
    fn q8_0_matmul_matches_candle() {
        let dev = Device::Cpu;
        let (n, k, m) = (33, 128, 7);
        // Fixed data: candle rounds half away from zero through 1/d, llama.cpp (and this kernel)
        // half to even through 127/max, so a value within an ulp of a tie may round apart; these
        // have none.
        let wave = |len: usize, f: f32| -> Vec<f32> {
            (0..len).map(|i| (i as f32 * f).sin() * 2.0).collect()
        };
        let w = Tensor::from_vec(wave(n * k, 0.37), (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let x = Tensor::from_vec(wave(m * k, 0.71), (m, k), &dev).unwrap();
        let ours = QuantMatrix::new(std::slice::from_ref(&q))
            .unwrap()
            .forward(&x)
            .unwrap();
        let theirs = QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap();
        let diff = (ours - theirs)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-3, "{diff}");
    }
}
