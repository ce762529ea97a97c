//! Weight matrices and which form multiplies them: [`Linear`] (one projection) and [`Fused`]
//! (several projections of one input, side by side). On a CPU the quantized kernels of
//! [`quant`] (Q4_1 and Q8_0, and the formats repacked into them) or candle's quantized matmul,
//! and plain weights in f32; on a GPU the weights in f16 for cuBLAS (dequantized once, or a
//! checkpoint's bf16/f16 as they are; [`gemm_add::GemmAdd`] adds into the residual stream), or
//! candle's quantized kernels where [`GpuWeights`] finds that the f16 copies do not fit; below
//! `ModelOptions::dense_from_rows`, candle's quantized kernels, or for Q8_0 with
//! `ModelOptions::q8_gemv` quarry's own 8-bit GEMV ([`q8_rows`]).

mod gemm_add;
mod host_plan;
mod plan;
mod q8_rows;
pub(crate) mod quant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::error::Result;
use crate::weights::Stored;
pub(crate) use gemm_add::GemmAdd;
pub(crate) use host_plan::host_available;
pub use host_plan::{HostFootprint, HostWeights};
pub use plan::{Footprint, GpuWeights};
#[cfg(any(test, feature = "test-support"))]
pub use q8_rows::gemv_q8_reference;
#[cfg(all(test, feature = "cuda"))]
pub(crate) use q8_rows::NORM_MAX_ROWS;
pub(crate) use q8_rows::{Prologue, Q8Rows, Q8_MAX_ROWS};
use quant::{Format, QuantMatrix};

/// How a GPU holds a projection's quantized weights: their f16 copies from `dense_from` rows
/// ([`crate::ModelOptions::dense_from_rows`], or 0 where [`GpuWeights`] found no room), and
/// below, Q8_0 through the 8-bit GEMV where `q8_gemv` ([`crate::ModelOptions::q8_gemv`]),
/// candle's kernels otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuForms {
    pub dense_from: usize,
    pub q8_gemv: bool,
    /// The 8-bit GEMV's prefetch: trips of weights each lane asks L2 for beyond the one it loads
    /// ([`crate::ModelOptions::gemv_prefetch`]).
    pub gemv_prefetch: usize,
}

#[cfg(test)]
impl GpuForms {
    /// Dense from `rows`, candle's kernels below.
    pub(crate) fn dense_from(rows: usize) -> Self {
        Self {
            dense_from: rows,
            q8_gemv: false,
            gemv_prefetch: 0,
        }
    }
}

/// A projection `y = x·Wᵀ`.
pub(crate) enum Linear {
    Candle(QMatMul),
    Quant(QuantMatrix),
    /// On a GPU: f16 weights (a cuBLAS GEMM with f32 accumulation) at every row count — the
    /// quantized weights dequantized once (the default, `dense_from_rows = 1`), or a
    /// checkpoint's or GGUF's own f16/bf16 values.
    Dense(Tensor),
    /// On a GPU: the weights dequantized once to f16 for steps of at least `dense_from` rows,
    /// and the quantized weights for fewer ([`Small`]; [`crate::ModelOptions::dense_from_rows`]
    /// above 1); both held.
    Dual {
        quant: Small,
        dense: Tensor,
        dense_from: usize,
    },
}

/// The quantized form a GPU multiplies steps of fewer than `dense_from_rows` rows with.
pub(crate) enum Small {
    /// candle's quantized kernels (activations rounded to 8 bits).
    Candle(QMatMul),
    /// Q8_0 weights through `kernels/gemv_q8.cu` (activations as they come, 8.5 bits a weight
    /// read), with `q8_gemv` and where `dense_from_rows` is at most [`Q8_MAX_ROWS`] + 1, so
    /// that a small step is one launch.
    Q8(Q8Rows),
}

impl Small {
    /// The form for `t`'s format below the switch of `forms`.
    fn new(t: QTensor, device: &Device, forms: GpuForms) -> Result<Self> {
        if forms.q8_gemv
            && t.dtype() == GgmlDType::Q8_0
            && forms.dense_from <= Q8_MAX_ROWS + 1
            && t.shape().dims2()?.1.is_multiple_of(32)
        {
            let rows = Q8Rows::from_q8_0(&t, device)?.prefetching(forms.gemv_prefetch);
            return Ok(Small::Q8(rows));
        }
        Ok(Small::Candle(QMatMul::from_qtensor(t)?))
    }

    /// `x · Wᵀ` in f32.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Small::Candle(m) => Ok(m.forward(x)?),
            Small::Q8(m) => m.forward(x),
        }
    }

    /// The input type taken without a cast: f32 for candle's kernels; the 8-bit GEMV reads f32
    /// or f16, and f16 (what the dense path multiplies, at half the bytes).
    fn input_dtype(&self) -> DType {
        match self {
            Small::Candle(_) => DType::F32,
            Small::Q8(_) => DType::F16,
        }
    }

    /// The forms of several projections side by side: the 8-bit matrices stacked into one where
    /// every part has one, each part alone otherwise.
    fn stack(parts: Vec<Small>) -> Result<Vec<Small>> {
        if !parts.is_empty() && parts.iter().all(|p| matches!(p, Small::Q8(_))) {
            let q8 = parts
                .into_iter()
                .filter_map(|p| match p {
                    Small::Q8(m) => Some(m),
                    Small::Candle(_) => None,
                })
                .collect();
            return Ok(vec![Small::Q8(Q8Rows::stack(q8)?)]);
        }
        Ok(parts)
    }
}

impl Linear {
    /// A projection of weights `t` on `device`, held on a GPU in the `forms` given.
    pub(crate) fn new(t: Stored, device: &Device, forms: GpuForms) -> Result<Self> {
        match t {
            Stored::Quant(t) if device.is_cpu() => match Format::of(t.dtype()) {
                Some(_) => Ok(Linear::Quant(QuantMatrix::new(&[t])?)),
                None => Ok(Linear::Candle(QMatMul::from_qtensor(t)?)),
            },
            Stored::Quant(t) => Self::dual(t, device, forms),
            Stored::Dense(t) => Self::plain(t, device),
        }
    }

    /// A GPU's forms of quantized (or GGUF F32/F16/BF16) weights: f16 only from 1 row, both
    /// forms switching at `dense_from` rows above that, the quantized form only at 0. F16 and
    /// BF16 values are f16 weights at every setting; F32 stay f32.
    fn dual(t: QTensor, device: &Device, forms: GpuForms) -> Result<Self> {
        let dense_from = forms.dense_from;
        match t.dtype() {
            GgmlDType::F32 => return Ok(Linear::Candle(QMatMul::from_qtensor(t)?)),
            GgmlDType::F16 | GgmlDType::BF16 => return Self::plain(t.dequantize(device)?, device),
            _ if dense_from == 0 => return Ok(Linear::Candle(QMatMul::from_qtensor(t)?)),
            _ if dense_from == 1 => return Ok(Linear::Dense(t.dequantize_f16(device)?)),
            _ => {}
        }
        let dense = t.dequantize_f16(device)?;
        Ok(Linear::Dual {
            quant: Small::new(t, device, forms)?,
            dense,
            dense_from,
        })
    }

    /// Plain weights (f32, f16, bf16): f32 on a CPU (what llama.cpp multiplies them in); on a
    /// GPU f16 from f16 and bf16 ([`f16_copy`]), f32 from f32.
    fn plain(t: Tensor, device: &Device) -> Result<Self> {
        if !device.is_cpu() && t.dtype() != DType::F32 {
            if let Some(h) = f16_copy(&t)? {
                return Ok(Linear::Dense(h));
            }
        }
        Ok(Linear::Candle(QMatMul::Tensor(
            t.to_dtype(DType::F32)?.to_device(device)?,
        )))
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Quant(m) => m.forward(x),
            Linear::Dense(dense) => {
                Ok(dense_forward(&x.to_dtype(DType::F16)?, dense)?.to_dtype(DType::F32)?)
            }
            Linear::Dual {
                quant,
                dense,
                dense_from,
            } => {
                if rows_of(x)? < *dense_from {
                    return quant.forward(x);
                }
                Ok(dense_forward(&x.to_dtype(candle_core::DType::F16)?, dense)?
                    .to_dtype(candle_core::DType::F32)?)
            }
        }
    }

    /// [`Linear::forward`] without the cast of the dense weights' f16 output to f32 (the next
    /// op reads f16 as it is); f32 from the other forms.
    pub(crate) fn forward_raw(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(dense) => dense_forward(&x.to_dtype(DType::F16)?, dense),
            Linear::Dual {
                dense, dense_from, ..
            } if rows_of(x)? >= *dense_from => {
                dense_forward(&x.to_dtype(candle_core::DType::F16)?, dense)
            }
            _ => self.forward(x),
        }
    }

    /// Where this projection multiplies its dense f16 weights (a [`Linear::Dense`], or a
    /// [`Linear::Dual`] at or past its switch, on a GPU): `x += input · Wᵀ` in one GEMM that
    /// accumulates into the f32 stream `x` ([`GemmAdd`]), and true; below the switch, on the
    /// 8-bit GEMV, in one launch of its adding form ([`Q8Rows::add_into`]); false, with nothing
    /// done, otherwise (the caller adds [`Linear::forward_raw`]'s output).
    pub(crate) fn add_into(&self, x: &Tensor, input: &Tensor) -> Result<bool> {
        let dense = match self {
            Linear::Dense(dense) => dense,
            Linear::Dual {
                dense, dense_from, ..
            } if rows_of(input)? >= *dense_from => dense,
            Linear::Dual {
                quant: Small::Q8(m),
                ..
            } => return m.add_into(x, input),
            _ => return Ok(false),
        };
        if x.device().is_cpu() {
            return Ok(false);
        }
        let a = input.to_dtype(candle_core::DType::F16)?;
        x.inplace_op3(&a, dense, &GemmAdd)?;
        Ok(true)
    }

    /// The element type this projection takes its `rows`-row input in without a cast: f16 for
    /// f16 weights ([`Linear::Dense`], a [`Linear::Dual`] at or past its switch) and the 8-bit
    /// GEMV ([`Small::Q8`]), else f32.
    pub(crate) fn input_dtype(&self, rows: usize) -> candle_core::DType {
        match self {
            Linear::Dense(_) => DType::F16,
            Linear::Dual { dense_from, .. } if rows >= *dense_from => DType::F16,
            Linear::Dual { quant, .. } => quant.input_dtype(),
            _ => DType::F32,
        }
    }

    /// The host forward's form: `m` rows of `xs` into `dst` (`[m, outputs]`, resized).
    pub(crate) fn forward_host(&self, xs: &[f32], m: usize, dst: &mut Vec<f32>) -> Result<()> {
        match self {
            Linear::Quant(q) => q.forward_host(xs, m, dst),
            Linear::Candle(_) | Linear::Dense(_) | Linear::Dual { .. } => {
                // Types without a kernel here (F16, F32, Q2_K ...) go through candle.
                let x = Tensor::from_slice(xs, (m, xs.len() / m.max(1)), &Device::Cpu)?;
                let y = self.forward(&x)?;
                dst.clear();
                crate::host_mem::with_host_slice(&y, |ys| dst.extend_from_slice(ys))
            }
        }
    }
}

/// Rows of `x` (all dimensions but the last).
fn rows_of(x: &Tensor) -> Result<usize> {
    Ok(x.elem_count() / x.dim(candle_core::D::Minus1)?.max(1))
}

/// `x16 · denseᵀ` (f16 operands, cuBLAS sums in f32), in f16.
fn dense_forward(x16: &Tensor, dense: &Tensor) -> Result<Tensor> {
    Ok(x16.broadcast_matmul(&dense.t()?)?)
}

/// Projections of the same input (Q, K and V; gate and up), whose outputs the forward pass reads
/// side by side (`[rows, Σ widths]`). On CPU, parts of one type with a kernel here are stacked
/// into one matrix, so the input is quantized once and the worker pool is woken once instead of
/// per projection; on a GPU their f16 weights are stacked into one matrix, one GEMM for all
/// parts; other types keep one matmul each.
pub(crate) enum Fused {
    Stacked(QuantMatrix),
    Separate(Vec<Linear>),
    /// On a GPU: every part's f16 weights stacked (`[Σ widths, inputs]`); with `quant`, the
    /// parts' quantized forms for steps of fewer than `dense_from` rows (as [`Linear::Dual`]:
    /// one stacked matrix where all are [`Small::Q8`], one per part otherwise), without
    /// (empty), the stacked weights at every row count (as [`Linear::Dense`]).
    Dense {
        stacked: Tensor,
        quant: Vec<Small>,
        dense_from: usize,
    },
}

impl Fused {
    pub(crate) fn new(parts: Vec<Stored>, device: &Device, forms: GpuForms) -> Result<Self> {
        let format = |t: &Stored| match t {
            Stored::Quant(q) => Format::of(q.dtype()),
            Stored::Dense(_) => None,
        };
        let first = format(&parts[0]);
        if device.is_cpu() && first.is_some() && parts.iter().all(|t| format(t) == first) {
            let parts: Vec<QTensor> = parts
                .into_iter()
                .filter_map(|t| match t {
                    Stored::Quant(q) => Some(q),
                    Stored::Dense(_) => None,
                })
                .collect();
            return Ok(Fused::Stacked(QuantMatrix::new(&parts)?));
        }
        let parts = parts
            .into_iter()
            .map(|t| Linear::new(t, device, forms))
            .collect::<Result<Vec<_>>>()?;
        if device.is_cpu() {
            return Ok(Fused::Separate(parts));
        }
        Self::stack(parts)
    }

    /// The GPU's form: the parts' f16 weights stacked where every part has them in the same
    /// form (all [`Linear::Dense`], or all [`Linear::Dual`] switching at one row count); each
    /// part alone otherwise (the quantized form only, or plain f32 weights).
    fn stack(parts: Vec<Linear>) -> Result<Self> {
        let switch = |l: &Linear| match l {
            Linear::Dense(_) => Some(1),
            Linear::Dual { dense_from, .. } => Some(*dense_from),
            _ => None,
        };
        let first = switch(&parts[0]);
        if first.is_none() || !parts.iter().all(|l| switch(l) == first) {
            return Ok(Fused::Separate(parts));
        }
        let copies: Vec<&Tensor> = parts
            .iter()
            .filter_map(|l| match l {
                Linear::Dense(dense) | Linear::Dual { dense, .. } => Some(dense),
                _ => None,
            })
            .collect();
        let stacked = Tensor::cat(&copies, 0)?;
        let quant = Small::stack(
            parts
                .into_iter()
                .filter_map(|l| match l {
                    Linear::Dual { quant, .. } => Some(quant),
                    _ => None,
                })
                .collect(),
        )?;
        Ok(Fused::Dense {
            stacked,
            quant,
            dense_from: first.unwrap_or(1),
        })
    }

    /// The element type this projection takes its `rows`-row input in without a cast: f16 for
    /// the stacked dense weights at or past their switch, the quantized forms' below it (f16
    /// for the 8-bit GEMV), else f32.
    pub(crate) fn input_dtype(&self, rows: usize) -> candle_core::DType {
        match self {
            Fused::Dense {
                quant, dense_from, ..
            } if quant.is_empty() || rows >= *dense_from => DType::F16,
            Fused::Dense { quant, .. } => quant[0].input_dtype(),
            _ => DType::F32,
        }
    }

    /// Every part's output side by side, `[rows, Σ widths]`, contiguous: f16 from the stacked
    /// dense weights (the GEMM's own output; the next op reads it as it is), f32 otherwise.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let side_by_side = |ls: &[Linear]| -> Result<Tensor> {
            let parts = ls
                .iter()
                .map(|l| l.forward(x))
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, candle_core::D::Minus1)?)
        };
        match self {
            Fused::Stacked(m) => m.forward(x),
            Fused::Separate(ls) => side_by_side(ls),
            Fused::Dense {
                stacked,
                quant,
                dense_from,
            } => {
                if !quant.is_empty() && rows_of(x)? < *dense_from {
                    let parts = quant
                        .iter()
                        .map(|q| q.forward(x))
                        .collect::<Result<Vec<_>>>()?;
                    return match <[Tensor; 1]>::try_from(parts) {
                        Ok([one]) => Ok(one),
                        Err(parts) => Ok(Tensor::cat(&parts, candle_core::D::Minus1)?),
                    };
                }
                dense_forward(&x.to_dtype(candle_core::DType::F16)?, stacked)
            }
        }
    }

    /// `act(gate) · up` in `out` from this gate/up projection in one launch, where its step
    /// runs on the 8-bit GEMV (below the switch, the parts stacked into one [`Small::Q8`]) and
    /// the GEMV's GLU form takes it ([`Q8Rows::glu`]); `None`, with nothing done, otherwise
    /// (the caller applies `glu::Glu` to [`Fused::forward`]'s output). With `norm`, `x` is the
    /// residual stream's rows, normalized in the launch's prologue (1 or 2 rows).
    pub(crate) fn forward_glu(
        &self,
        x: &Tensor,
        norm: Option<Prologue<'_>>,
        act: crate::config::Activation,
        out: DType,
    ) -> Result<Option<Tensor>> {
        match self.gemv_step(x, norm.is_some())? {
            Some((m, x)) => m.glu(&x, act, out, norm),
            None => Ok(None),
        }
    }

    /// Where a step of input `x` runs on the 8-bit GEMV (below the switch, the parts stacked
    /// into one [`Small::Q8`]) and its fused forms take it: the matrix, and `x` as they read it
    /// ([`Q8Rows::fused_input`]; `normed`: `x` is the residual stream's rows, for a form that
    /// normalizes them first, [`Q8Rows::normed_input`]); `None` otherwise.
    pub(crate) fn gemv_step(&self, x: &Tensor, normed: bool) -> Result<Option<(&Q8Rows, Tensor)>> {
        match self {
            Fused::Dense {
                quant, dense_from, ..
            } if rows_of(x)? < *dense_from => match quant.as_slice() {
                [Small::Q8(m)] => {
                    let x = match normed {
                        true => m.normed_input(x)?,
                        false => m.fused_input(x)?,
                    };
                    Ok(x.map(|x| (m, x)))
                }
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// The host forward's form: every part's outputs side by side in one `[m, Σ widths]` buffer,
    /// as the stacked matrix produces them.
    pub(crate) fn forward_host(&self, xs: &[f32], m: usize, dst: &mut Vec<f32>) -> Result<()> {
        match self {
            Fused::Stacked(q) => q.forward_host(xs, m, dst),
            Fused::Dense { .. } => unreachable!("the host forward runs on the CPU"),
            Fused::Separate(ls) => {
                let parts: Vec<Vec<f32>> = ls
                    .iter()
                    .map(|l| {
                        let mut y = Vec::new();
                        l.forward_host(xs, m, &mut y).map(|()| y)
                    })
                    .collect::<Result<_>>()?;
                dst.clear();
                for r in 0..m {
                    for p in &parts {
                        let w = p.len() / m;
                        dst.extend_from_slice(&p[r * w..(r + 1) * w]);
                    }
                }
                Ok(())
            }
        }
    }
}

/// `t` (f16 or bf16) as f16 weights, or `None` where a value is beyond f16's range (bf16 reaches
/// 3·10³⁸, f16 65504): those stay f32 rather than become infinities.
fn f16_copy(t: &Tensor) -> Result<Option<Tensor>> {
    let h = t.to_dtype(DType::F16)?;
    if t.dtype() == DType::F16 {
        return Ok(Some(h));
    }
    let largest = h.abs()?.flatten_all()?.max(0)?.to_dtype(DType::F32)?;
    Ok(largest.to_scalar::<f32>()?.is_finite().then_some(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::testing::f32s as values;

    /// A `rows × cols` matrix of normal values of deviation `std`, stored in bf16 as a
    /// checkpoint stores it.
    fn bf16_matrix(rows: usize, cols: usize, std: f32) -> Tensor {
        Tensor::randn(0f32, std, (rows, cols), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
    }

    /// `dense_from_rows = 1` (the default) keeps the f16 copy alone: the same products as the
    /// both-forms projection past its switch, bit for bit, at every row count, with f16 input.
    #[test]
    fn dense_from_one_row_drops_the_quantized_copy() {
        let dev = Device::Cpu;
        let (n, k) = (24, 128);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = || QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let dense = Linear::dual(q(), &dev, GpuForms::dense_from(1)).unwrap();
        assert!(matches!(dense, Linear::Dense(_)));
        let both = Linear::dual(q(), &dev, GpuForms::dense_from(2)).unwrap();
        for m in [1usize, 2, 5] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
            assert_eq!(dense.input_dtype(m), DType::F16);
            let got = dense.forward(&x).unwrap();
            assert_eq!(got.dtype(), DType::F32);
            if m >= 2 {
                assert_eq!(values(&got), values(&both.forward(&x).unwrap()), "{m} rows");
            }
            let raw = dense.forward_raw(&x).unwrap();
            assert_eq!(raw.dtype(), DType::F16);
            assert_eq!(values(&raw.to_dtype(DType::F32).unwrap()), values(&got));
        }
    }

    /// A checkpoint's bf16 values become f16 weights exactly (bf16's significand fits), unless
    /// one is beyond f16's range; f16 passes as it is.
    #[test]
    fn bf16_weights_become_f16_exactly_within_range() {
        let dev = Device::Cpu;
        let w = bf16_matrix(8, 64, 3.0);
        let h = f16_copy(&w).unwrap().expect("in range");
        assert_eq!(h.dtype(), DType::F16);
        assert_eq!(values(&h), values(&w));
        let wide = Tensor::new(&[1.0f32, -7.0e4, 2.0, 0.5], &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        assert!(f16_copy(&wide).unwrap().is_none());
        let f16 = w.to_dtype(DType::F16).unwrap();
        assert_eq!(values(&f16_copy(&f16).unwrap().unwrap()), values(&w));
    }

    /// On a CPU, plain weights multiply in f32 whatever they are stored in: a bf16 matrix gives
    /// the f32 product of its values.
    #[test]
    fn plain_weights_multiply_in_f32_on_a_cpu() {
        let dev = Device::Cpu;
        let w = bf16_matrix(16, 32, 1.0);
        let l = Linear::new(Stored::Dense(w.clone()), &dev, GpuForms::dense_from(1)).unwrap();
        assert!(matches!(l, Linear::Candle(_)));
        assert_eq!(l.input_dtype(3), DType::F32);
        let x = Tensor::randn(0f32, 1.0, (3, 32), &dev).unwrap();
        let want = x
            .matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap())
            .unwrap();
        assert_eq!(values(&l.forward(&x).unwrap()), values(&want));
    }

    /// Parts held as f16 alone stack into one matrix used at every row count: each part's
    /// output side by side, in f16.
    #[test]
    fn dense_parts_stack_without_a_quantized_form() {
        let dev = Device::Cpu;
        let k = 64;
        let parts: Vec<Linear> = [16usize, 8]
            .iter()
            .map(|&n| {
                let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
                Linear::dual(
                    QTensor::quantize(&w, GgmlDType::Q8_0).unwrap(),
                    &dev,
                    GpuForms::dense_from(1),
                )
                .unwrap()
            })
            .collect();
        let x = Tensor::randn(0f32, 1.0, (1, k), &dev).unwrap();
        let want: Vec<Tensor> = parts.iter().map(|p| p.forward_raw(&x).unwrap()).collect();
        let want = values(&Tensor::cat(&want, 1).unwrap());
        let fused = Fused::stack(parts).unwrap();
        assert!(matches!(&fused, Fused::Dense { quant, .. } if quant.is_empty()));
        assert_eq!(fused.input_dtype(1), DType::F16);
        let got = fused.forward(&x).unwrap();
        assert_eq!((got.dims(), got.dtype()), ([1, 24].as_slice(), DType::F16));
        assert_eq!(values(&got), want);
    }

    /// Q8_0 parts held in both forms with the 8-bit GEMV below a switch at `dense_from`, on
    /// the CPU (whose ops are the kernels' references).
    fn q8_parts(widths: &[usize], k: usize, dense_from: usize) -> Vec<Linear> {
        q8_parts_prefetching(widths, k, dense_from, 0)
    }

    /// [`q8_parts`] whose GEMV prefetches `ahead` trips (`gemv_prefetch`).
    fn q8_parts_prefetching(
        widths: &[usize],
        k: usize,
        dense_from: usize,
        ahead: usize,
    ) -> Vec<Linear> {
        let forms = GpuForms {
            dense_from,
            q8_gemv: true,
            gemv_prefetch: ahead,
        };
        widths
            .iter()
            .map(|&n| {
                let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
                Linear::dual(
                    QTensor::quantize(&w, GgmlDType::Q8_0).unwrap(),
                    &Device::Cpu,
                    forms,
                )
                .unwrap()
            })
            .collect()
    }

    /// `gemv_prefetch` reaches the GEMV's operands: each projection's Q8_0 matrix takes the
    /// trips from its forms, and the stacked Q/K/V or gate/up matrix keeps them.
    #[test]
    fn the_gemv_prefetch_reaches_each_and_the_stacked_matrix() {
        let q8 = |l: &Linear| match l {
            Linear::Dual {
                quant: Small::Q8(m),
                ..
            } => m.ahead(),
            _ => panic!("not held as Q8_0 for the GEMV"),
        };
        for ahead in [0usize, 3] {
            let parts = q8_parts_prefetching(&[24, 8, 8], 64, 3, ahead);
            assert!(parts.iter().all(|p| q8(p) == ahead), "{ahead} trips");
            let Fused::Dense { quant, .. } = Fused::stack(parts).unwrap() else {
                panic!("not stacked");
            };
            let [Small::Q8(stacked)] = quant.as_slice() else {
                panic!("the Q8_0 parts not stacked into one");
            };
            assert_eq!(stacked.ahead(), ahead, "stacked, {ahead} trips");
        }
    }

    /// Below its switch an 8-bit GEMV projection adds into the stream itself (the plain sums
    /// plus the stream); at the switch it leaves the add to the caller on a CPU, as the dense
    /// form does.
    #[test]
    fn the_8_bit_gemv_adds_into_the_stream_below_its_switch() {
        let dev = Device::Cpu;
        let k = 64;
        let [l] = <[Linear; 1]>::try_from(q8_parts(&[24], k, 3)).ok().unwrap();
        assert!(matches!(
            l,
            Linear::Dual {
                quant: Small::Q8(_),
                ..
            }
        ));
        for (rows, fused) in [(1usize, true), (2, true), (3, false)] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let stream = Tensor::randn(0f32, 1.0, (rows, 24), &dev).unwrap();
            let before = values(&stream);
            assert_eq!(l.add_into(&stream, &x).unwrap(), fused, "{rows} rows");
            let want: Vec<f32> = match fused {
                true => {
                    let y = values(&l.forward_raw(&x).unwrap());
                    before.iter().zip(&y).map(|(s, y)| s + y).collect()
                }
                false => before,
            };
            assert_eq!(values(&stream), want, "{rows} rows");
        }
    }

    /// A gate/up projection stacked on the 8-bit GEMV gives `act(gate) · up` in one op below its
    /// switch, equal to `glu::Glu` on its forward; at the switch, and where the f16 copies alone
    /// are held (`dense_from_rows = 1`), it declines.
    #[test]
    fn a_stacked_8_bit_gate_up_applies_its_activation_below_its_switch() {
        let dev = Device::Cpu;
        let (f, k) = (16, 64);
        let fused = Fused::stack(q8_parts(&[f, f], k, 3)).unwrap();
        assert!(matches!(&fused, Fused::Dense { quant, .. } if quant.len() == 1));
        let act = crate::config::Activation::Silu;
        for (rows, takes) in [(1usize, true), (2, true), (3, false)] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let got = fused.forward_glu(&x, None, act, DType::F16).unwrap();
            assert_eq!(got.is_some(), takes, "{rows} rows");
            if let Some(got) = got {
                let glu = crate::glu::Glu {
                    act,
                    out: DType::F16,
                };
                let want = fused.forward(&x).unwrap().apply_op1_no_bwd(&glu).unwrap();
                assert_eq!(values(&got), values(&want), "{rows} rows");
            }
        }
        let mixed = Fused::stack(q8_parts(&[f, f], k, 1)).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, k), &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert!(mixed
            .forward_glu(&x, None, act, DType::F16)
            .unwrap()
            .is_none());
    }
}
