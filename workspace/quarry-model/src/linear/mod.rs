//! Weight matrices and which form multiplies them: [`Linear`] (one projection) and [`Fused`]
//! (several projections of one input, side by side). On a CPU the quantized kernels of
//! [`quant`] (Q4_1 and Q8_0, and the formats repacked into them) or candle's quantized matmul;
//! on a GPU the weights dequantized once to f16 for cuBLAS (with [`gemm_add::GemmAdd`] adding
//! into the residual stream), or candle's quantized kernels below
//! `ModelOptions::dense_from_rows`.

mod gemm_add;
pub(crate) mod quant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::Result;
pub(crate) use gemm_add::GemmAdd;
use quant::{Format, QuantMatrix};

/// A projection `y = x·Wᵀ`.
pub(crate) enum Linear {
    Candle(QMatMul),
    Quant(QuantMatrix),
    /// On a GPU: the weights dequantized once to f16 (a cuBLAS GEMM with f32 accumulation) for
    /// steps of at least `dense_from` rows, and the quantized weights (candle's kernels, which
    /// round activations to 8 bits) for fewer. By default every step is dense
    /// ([`crate::ModelOptions::dense_from_rows`], which says why); 0 keeps only the quantized
    /// weights.
    Dual {
        quant: QMatMul,
        dense: Tensor,
        dense_from: usize,
    },
}

impl Linear {
    /// A projection of weights `t` on `device`; on a GPU dense from `dense_from` rows
    /// ([`crate::ModelOptions::dense_from_rows`]).
    pub(crate) fn new(t: QTensor, device: &Device, dense_from: usize) -> Result<Self> {
        if device.is_cpu() && Format::of(t.dtype()).is_some() {
            return Ok(Linear::Quant(QuantMatrix::new(&[t])?));
        }
        if !device.is_cpu() {
            return Self::dual(t, device, dense_from);
        }
        Ok(Linear::Candle(QMatMul::from_qtensor(t)?))
    }

    /// Both forms of the weights, switching at `dense_from` rows (0: the quantized form only).
    fn dual(t: QTensor, device: &Device, dense_from: usize) -> Result<Self> {
        if dense_from == 0 || matches!(t.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
        {
            return Ok(Linear::Candle(QMatMul::from_qtensor(t)?));
        }
        let dense = t.dequantize_f16(device)?;
        Ok(Linear::Dual {
            quant: QMatMul::from_qtensor(t)?,
            dense,
            dense_from,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Quant(m) => m.forward(x),
            Linear::Dual {
                quant,
                dense,
                dense_from,
            } => {
                if rows_of(x)? < *dense_from {
                    return Ok(quant.forward(x)?);
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
            Linear::Dual {
                dense, dense_from, ..
            } if rows_of(x)? >= *dense_from => {
                dense_forward(&x.to_dtype(candle_core::DType::F16)?, dense)
            }
            _ => self.forward(x),
        }
    }

    /// Where this projection multiplies its dense f16 weights (a [`Linear::Dual`] at or past its
    /// switch, on a GPU): `x += input · Wᵀ` in one GEMM that accumulates into the f32 stream `x`
    /// ([`GemmAdd`]), and true; false, with nothing done, otherwise (the caller adds
    /// [`Linear::forward_raw`]'s output).
    pub(crate) fn add_into(&self, x: &Tensor, input: &Tensor) -> Result<bool> {
        match self {
            Linear::Dual {
                dense, dense_from, ..
            } if !x.device().is_cpu() && rows_of(input)? >= *dense_from => {
                let a = input.to_dtype(candle_core::DType::F16)?;
                x.inplace_op3(&a, dense, &GemmAdd)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The element type this projection takes its `rows`-row input in without a cast: f16 for
    /// the dense weights of a [`Linear::Dual`] at or past its switch, else f32.
    pub(crate) fn input_dtype(&self, rows: usize) -> candle_core::DType {
        match self {
            Linear::Dual { dense_from, .. } if rows >= *dense_from => candle_core::DType::F16,
            _ => candle_core::DType::F32,
        }
    }

    /// The host forward's form: `m` rows of `xs` into `dst` (`[m, outputs]`, resized).
    pub(crate) fn forward_host(&self, xs: &[f32], m: usize, dst: &mut Vec<f32>) -> Result<()> {
        match self {
            Linear::Quant(q) => q.forward_host(xs, m, dst),
            Linear::Candle(_) | Linear::Dual { .. } => {
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
/// per projection; on a GPU their dense f16 copies are stacked into one matrix, one GEMM for all
/// parts; other types keep one candle matmul each.
pub(crate) enum Fused {
    Stacked(QuantMatrix),
    Separate(Vec<Linear>),
    /// On a GPU: every part's weights dequantized to f16 and stacked (`[Σ widths, inputs]`), for
    /// steps of at least `dense_from` rows (as [`Linear::Dual`]), and the parts' quantized forms
    /// for fewer.
    Dense {
        stacked: Tensor,
        quant: Vec<Linear>,
        dense_from: usize,
    },
}

impl Fused {
    pub(crate) fn new(parts: Vec<QTensor>, device: &Device, dense_from: usize) -> Result<Self> {
        let format = Format::of(parts[0].dtype());
        if device.is_cpu()
            && format.is_some()
            && parts.iter().all(|t| Format::of(t.dtype()) == format)
        {
            return Ok(Fused::Stacked(QuantMatrix::new(&parts)?));
        }
        if !device.is_cpu() {
            return Self::dense(parts, device, dense_from);
        }
        Ok(Fused::Separate(
            parts
                .into_iter()
                .map(|t| Linear::new(t, device, dense_from))
                .collect::<Result<_>>()?,
        ))
    }

    /// The GPU's form: the parts' f16 copies stacked, switching at `dense_from` rows (0, or a
    /// part stored as F32, F16 or BF16: each part alone, as [`Linear::dual`] decides).
    fn dense(parts: Vec<QTensor>, device: &Device, dense_from: usize) -> Result<Self> {
        let dense =
            |t: &QTensor| !matches!(t.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        if dense_from == 0 || !parts.iter().all(dense) {
            return Ok(Fused::Separate(
                parts
                    .into_iter()
                    .map(|t| Linear::dual(t, device, dense_from))
                    .collect::<Result<_>>()?,
            ));
        }
        let copies = parts
            .iter()
            .map(|t| t.dequantize_f16(device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let stacked = Tensor::cat(&copies, 0)?;
        drop(copies);
        Ok(Fused::Dense {
            stacked,
            quant: parts
                .into_iter()
                .map(|t| Ok(Linear::Candle(QMatMul::from_qtensor(t)?)))
                .collect::<Result<_>>()?,
            dense_from,
        })
    }

    /// The element type this projection takes its `rows`-row input in without a cast: f16 for
    /// the stacked dense weights at or past their switch, else f32.
    pub(crate) fn input_dtype(&self, rows: usize) -> candle_core::DType {
        match self {
            Fused::Dense { dense_from, .. } if rows >= *dense_from => candle_core::DType::F16,
            _ => candle_core::DType::F32,
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
                if rows_of(x)? < *dense_from {
                    return side_by_side(quant);
                }
                dense_forward(&x.to_dtype(candle_core::DType::F16)?, stacked)
            }
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
