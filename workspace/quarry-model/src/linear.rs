//! Weight matrices: candle's quantized matmul, plus a kernel of our own for Q4_1 on CPU.
//!
//! candle-core 0.11 multiplies Q4_1 weights with a scalar dot product (no SIMD path), which made
//! the required SmolLM2 Q4_1 model about 10× slower than its Q4_0 and Q8_0 kernels. [`Q41Matrix`]
//! does the same arithmetic as llama.cpp's `ggml_vec_dot_q4_1_q8_1`: activations are quantized per
//! 32-block to 8 bits with a scale `d` and `s = d·Σq` (both rounded to f16), and a block's dot
//! product is `d_w·d_a·Σ(q_w·q_a) + m_w·s_a`. On x86-64 with AVX2 and FMA the integer part runs on
//! `maddubs`/`madd`; elsewhere a scalar loop computes the identical integer sums.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;

use crate::error::Result;

const QK: usize = 32;
/// Bytes of one Q4_1 block: f16 `d`, f16 `m`, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;

/// A projection `y = x·Wᵀ`.
pub(crate) enum Linear {
    Candle(QMatMul),
    Q41(Q41Matrix),
}

impl Linear {
    pub(crate) fn new(t: QTensor, device: &Device) -> Result<Self> {
        if t.dtype() == GgmlDType::Q4_1 && device.is_cpu() {
            return Ok(Linear::Q41(Q41Matrix::new(&[t])?));
        }
        Ok(Linear::Candle(QMatMul::from_qtensor(t)?))
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Q41(m) => m.forward(x),
        }
    }
}

/// Projections of the same input (Q, K and V; gate and up). Q4_1 weights on CPU are stacked into
/// one matrix, so the input is quantized once and the worker pool is woken once instead of per
/// projection; other types keep one candle matmul each.
pub(crate) enum Fused {
    Stacked(Q41Matrix, Vec<usize>),
    Separate(Vec<Linear>),
}

impl Fused {
    pub(crate) fn new(parts: Vec<QTensor>, device: &Device) -> Result<Self> {
        if device.is_cpu() && parts.iter().all(|t| t.dtype() == GgmlDType::Q4_1) {
            let widths = parts.iter().map(|t| t.shape().dims()[0]).collect();
            return Ok(Fused::Stacked(Q41Matrix::new(&parts)?, widths));
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

/// A Q4_1 weight matrix of `rows` outputs by `cols` inputs. The GGUF blocks are split at load into
/// nibbles and f32 scales, so the f16 conversion is not redone for every activation row.
pub(crate) struct Q41Matrix {
    rows: usize,
    cols: usize,
    /// 16 bytes of nibbles per block, row-major.
    qs: Vec<u8>,
    /// Per block: the scale `d` and the minimum `m`.
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

impl Q41Matrix {
    /// The rows of `parts` (all Q4_1, all the same width), stacked in order.
    fn new(parts: &[QTensor]) -> Result<Self> {
        let cols = parts[0].shape().dims2()?.1;
        let mut m = Self {
            rows: 0,
            cols,
            qs: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
        };
        for t in parts {
            let (rows, c) = t.shape().dims2()?;
            if c % QK != 0 || c != cols {
                return Err(crate::ModelError::Forward {
                    message: format!(
                        "Q4_1 matrix width {c} is not {cols} or not a multiple of {QK}"
                    ),
                });
            }
            let raw = t.data()?;
            debug_assert_eq!(raw.len(), rows * cols / QK * BLOCK_BYTES);
            for b in raw.chunks_exact(BLOCK_BYTES) {
                m.d.push(f16::from_le_bytes([b[0], b[1]]).to_f32());
                m.m.push(f16::from_le_bytes([b[2], b[3]]).to_f32());
                m.qs.extend_from_slice(&b[4..]);
            }
            m.rows += rows;
        }
        Ok(m)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        if k != self.cols {
            return Err(crate::ModelError::Forward {
                message: format!("Q4_1 matmul: input width {k}, weights {}", self.cols),
            });
        }
        let x = x.contiguous()?;
        let a = crate::attention::with_host_slice(&x, |xs| quantize_rows(xs, m, k))?;
        let n = self.rows;
        let mut dst = vec![0f32; m * n];
        let dst_ptr = dst.as_mut_ptr() as usize;
        let nb = k / QK;
        let avx = has_avx2();
        // Work items are groups of weight rows: a group stays in L1 while every activation row
        // streams past it, so the weights are read from memory once per call whatever `m` is.
        const GROUP: usize = 8;
        let groups = n.div_ceil(GROUP);
        candle_core::utils::barrier_pool().execute_chunked(groups, |range| {
            for c in range.start * GROUP..(range.end * GROUP).min(n) {
                let w = Weights {
                    qs: &self.qs[c * nb * QK / 2..(c + 1) * nb * QK / 2],
                    d: &self.d[c * nb..(c + 1) * nb],
                    m: &self.m[c * nb..(c + 1) * nb],
                };
                let mut r = 0;
                while r < m {
                    let tile = ROW_TILE.min(m - r);
                    let mut out = [0f32; ROW_TILE];
                    let act = |i: usize| Act {
                        qs: &a.qs[(r + i) * k..(r + i + 1) * k],
                        d: &a.d[(r + i) * nb..(r + i + 1) * nb],
                        s: &a.s[(r + i) * nb..(r + i + 1) * nb],
                    };
                    if avx && tile == ROW_TILE {
                        // SAFETY: AVX2 and FMA were detected at run time.
                        out = unsafe { dot_avx2::<ROW_TILE>(&w, std::array::from_fn(act)) };
                    } else if avx {
                        for (i, o) in out.iter_mut().enumerate().take(tile) {
                            *o = unsafe { dot_avx2::<1>(&w, [act(i)]) }[0];
                        }
                    } else {
                        for (i, o) in out.iter_mut().enumerate().take(tile) {
                            *o = dot_scalar(&w, &act(i));
                        }
                    }
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
struct Act<'a> {
    qs: &'a [i8],
    d: &'a [f32],
    s: &'a [f32],
}

/// llama.cpp's `quantize_row_q8_1`: per block, `d = max|x| / 127`, `q = round(x / d)`, `s = d·Σq`.
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

fn dot_scalar(w: &Weights, a: &Act) -> f32 {
    let mut sum = 0f32;
    for (i, q) in w.qs.chunks_exact(QK / 2).enumerate() {
        let x = &a.qs[i * QK..(i + 1) * QK];
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            isum += (q[j] & 0x0F) as i32 * x[j] as i32;
            isum += (q[j] >> 4) as i32 * x[j + QK / 2] as i32;
        }
        sum += isum as f32 * w.d[i] * a.d[i] + w.m[i] * a.s[i];
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

/// `R` dot products of one weight row with `R` activation rows; each weight block is unpacked once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const R: usize>(w: &Weights, a: [Act; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0f32; R];
    for i in 0..w.d.len() {
        let packed = _mm_loadu_si128(w.qs.as_ptr().add(i * QK / 2) as *const __m128i);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        // Low nibbles pair with activations 0..16, high nibbles with 16..32.
        let wq = _mm256_set_m128i(hi, lo);
        let (wd, wm) = (*w.d.get_unchecked(i), *w.m.get_unchecked(i));
        for r in 0..R {
            let aq = _mm256_loadu_si256(a[r].qs.as_ptr().add(i * QK) as *const __m256i);
            let ints = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, aq), ones);
            let scale = _mm256_set1_ps(wd * *a[r].d.get_unchecked(i));
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ints), acc[r]);
            mins[r] += wm * *a[r].s.get_unchecked(i);
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

    /// The kernel against candle's own dequantize-then-matmul on random Q4_1 weights.
    #[test]
    fn q4_1_matmul_matches_dequantized_weights() {
        let dev = Device::Cpu;
        let (n, k, m) = (40, 96, 5);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let exact = q.dequantize(&dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let want = x.matmul(&exact.t().unwrap()).unwrap();
        let mat = Q41Matrix::new(std::slice::from_ref(&q)).unwrap();
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
        assert!(diff < 0.02 * scale, "{diff} vs {scale}");
        // The SIMD and scalar paths compute the same integer sums.
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let a = quantize_rows(&xs, m, k);
        let nb = k / QK;
        for c in 0..n {
            let w = Weights {
                qs: &mat.qs[c * nb * QK / 2..(c + 1) * nb * QK / 2],
                d: &mat.d[c * nb..(c + 1) * nb],
                m: &mat.m[c * nb..(c + 1) * nb],
            };
            let act = |r: usize| Act {
                qs: &a.qs[r * k..(r + 1) * k],
                d: &a.d[r * nb..(r + 1) * nb],
                s: &a.s[r * nb..(r + 1) * nb],
            };
            if has_avx2() {
                let four = unsafe { dot_avx2::<4>(&w, std::array::from_fn(act)) };
                for (r, v) in four.iter().enumerate() {
                    let s = dot_scalar(&w, &act(r));
                    assert!((s - v).abs() <= 1e-4 * s.abs().max(1.0), "{s} vs {v}");
                }
            }
        }
    }
}
