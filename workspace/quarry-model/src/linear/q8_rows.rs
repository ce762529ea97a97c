//! Small steps on 8-bit weights for a GPU (W8A16): a Q8_0 matrix repacked at load into its int8
//! values (`[outputs, inputs]`, a row's values 16-byte aligned) and one f16 scale per 32 values
//! (`[outputs, inputs / 32]`), multiplied by `kernels/gemv_q8.cu` for steps of a few rows. Such a
//! step reads every weight once, so its time is the weights' bytes: 8.5 bits a weight where the
//! f16 copies take 16. The activations stay f16 or f32 (candle's quantized kernels, which this
//! replaces for Q8_0 below `dense_from_rows` with `q8_gemv`, round them to 8 bits), with sums in
//! f32.
//!
//! The op's CPU side is the reference ([`gemv_q8_reference`]): the kernel's products, summed in
//! another order. Tests: `quarry-cuda-emu` runs the kernel's source against it on the CPU, and
//! `cuda::gemv` tests the launcher on a GPU.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

use crate::error::Result;

/// Rows one launch multiplies (`Q8_MAX_ROWS` in the kernel); a larger step runs in slices.
pub const Q8_MAX_ROWS: usize = 8;

/// Values per scale (Q8_0's block).
const BLOCK: usize = 32;

/// Bytes of a Q8_0 block: its f16 scale, then 32 int8 values.
const Q8_0_BLOCK_BYTES: usize = 2 + BLOCK;

/// A Q8_0 matrix as `gemv_q8` reads it.
pub(crate) struct Q8Rows {
    /// `[outputs, inputs]`, the int8 values' bits as u8.
    q: Tensor,
    /// `[outputs, inputs / 32]`, f16.
    scales: Tensor,
}

impl Q8Rows {
    /// The repacked form of the Q8_0 matrix `t` (`[outputs, inputs]`, inputs a multiple of 32),
    /// on `device`: the same values and scales, exactly.
    pub(crate) fn from_q8_0(t: &QTensor, device: &Device) -> Result<Self> {
        let (outputs, inputs) = t.shape().dims2()?;
        if t.dtype() != GgmlDType::Q8_0 || !inputs.is_multiple_of(BLOCK) {
            return Err(candle_core::Error::Msg(format!(
                "q8 rows: a Q8_0 matrix with rows of a multiple of {BLOCK} values, not {:?} {outputs}x{inputs}",
                t.dtype()
            ))
            .into());
        }
        let blocks = outputs * inputs / BLOCK;
        let data = t.data()?;
        if data.len() < blocks * Q8_0_BLOCK_BYTES {
            return Err(candle_core::Error::Msg(format!(
                "q8 rows: {} bytes hold fewer than {blocks} Q8_0 blocks",
                data.len()
            ))
            .into());
        }
        let mut q = Vec::with_capacity(outputs * inputs);
        let mut scales = Vec::with_capacity(blocks);
        for block in data[..blocks * Q8_0_BLOCK_BYTES].chunks_exact(Q8_0_BLOCK_BYTES) {
            scales.push(half::f16::from_le_bytes([block[0], block[1]]));
            q.extend_from_slice(&block[2..]);
        }
        Ok(Self {
            q: Tensor::from_vec(q, (outputs, inputs), device)?,
            scales: Tensor::from_vec(scales, (outputs, inputs / BLOCK), device)?,
        })
    }

    /// Several matrices of one input width as one, their outputs side by side (Q, K and V; gate
    /// and up).
    pub(crate) fn stack(parts: Vec<Self>) -> Result<Self> {
        let q: Vec<&Tensor> = parts.iter().map(|p| &p.q).collect();
        let s: Vec<&Tensor> = parts.iter().map(|p| &p.scales).collect();
        Ok(Self {
            q: Tensor::cat(&q, 0)?,
            scales: Tensor::cat(&s, 0)?,
        })
    }

    /// `x · Wᵀ` (`x` f32 or f16, `[.., inputs]`) in f32, `[.., outputs]`; steps of more than
    /// [`Q8_MAX_ROWS`] rows in slices of that many.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let inputs = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / inputs.max(1);
        let mut x = x.reshape((rows, inputs))?;
        if !matches!(x.dtype(), DType::F32 | DType::F16) {
            x = x.to_dtype(DType::F32)?;
        }
        // The kernel reads 16 values at a time from 16-byte aligned rows.
        if !x.is_contiguous() || !x.layout().start_offset().is_multiple_of(16) {
            x = x.copy()?;
        }
        let op = Q8Op { w: self };
        let y = if rows <= Q8_MAX_ROWS {
            x.apply_op1_no_bwd(&op)?
        } else {
            let slices = (0..rows)
                .step_by(Q8_MAX_ROWS)
                .map(|r| {
                    x.narrow(0, r, Q8_MAX_ROWS.min(rows - r))?
                        .copy()?
                        .apply_op1_no_bwd(&op)
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&slices, 0)?
        };
        let mut out = dims;
        *out.last_mut().expect("a matrix") = self.outputs();
        Ok(y.reshape(out)?)
    }

    pub(crate) fn outputs(&self) -> usize {
        self.q.dims()[0]
    }

    pub(crate) fn inputs(&self) -> usize {
        self.q.dims()[1]
    }
}

/// `y[r][o] = Σ_k x[r][k] · q[o][k] · scales[o][k / 32]`: each block's 32 products summed, scaled,
/// and the blocks' sums added in order, in f32. `q` is `[outputs, inputs]`, `x` `[rows, inputs]`.
pub fn gemv_q8_reference(
    q: &[i8],
    scales: &[half::f16],
    x: &[f32],
    rows: usize,
    inputs: usize,
) -> Vec<f32> {
    let outputs = q.len() / inputs.max(1);
    let mut y = vec![0f32; rows * outputs];
    for r in 0..rows {
        let xr = &x[r * inputs..(r + 1) * inputs];
        for o in 0..outputs {
            let qo = &q[o * inputs..(o + 1) * inputs];
            let so = &scales[o * inputs / BLOCK..(o + 1) * inputs / BLOCK];
            y[r * outputs + o] = qo
                .chunks_exact(BLOCK)
                .zip(xr.chunks_exact(BLOCK))
                .zip(so)
                .map(|((qb, xb), s)| {
                    s.to_f32() * qb.iter().zip(xb).map(|(&q, &x)| q as f32 * x).sum::<f32>()
                })
                .sum();
        }
    }
    y
}

/// The op on `x` (`[rows, inputs]`, at most [`Q8_MAX_ROWS`] rows on a GPU, contiguous).
struct Q8Op<'a> {
    w: &'a Q8Rows,
}

impl Q8Op<'_> {
    fn shape(&self, l: &Layout) -> candle_core::Result<(usize, usize, Shape)> {
        let (rows, inputs) = l.shape().dims2()?;
        if inputs != self.w.inputs() {
            candle_core::bail!(
                "q8 rows: an input of {inputs} values for a matrix of {}",
                self.w.inputs()
            );
        }
        Ok((rows, inputs, Shape::from((rows, self.w.outputs()))))
    }
}

impl CustomOp1 for Q8Op<'_> {
    fn name(&self) -> &'static str {
        "quarry-gemv-q8"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, inputs, shape) = self.shape(l)?;
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("q8 rows: the input must be contiguous");
        };
        let x: Vec<f32> = match s {
            CpuStorage::F32(v) => v[a..b].to_vec(),
            CpuStorage::F16(v) => v[a..b].iter().map(|x| x.to_f32()).collect(),
            _ => candle_core::bail!("q8 rows: the input must be f32 or f16"),
        };
        let q: Vec<i8> = self
            .w
            .q
            .flatten_all()?
            .to_vec1::<u8>()?
            .into_iter()
            .map(|b| b as i8)
            .collect();
        let scales = self.w.scales.flatten_all()?.to_vec1::<half::f16>()?;
        let y = gemv_q8_reference(&q, &scales, &x, rows, inputs);
        Ok((CpuStorage::F32(y), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, inputs, shape) = self.shape(l)?;
        if rows > Q8_MAX_ROWS {
            candle_core::bail!("q8 rows: {rows} rows in one launch, over {Q8_MAX_ROWS}");
        }
        let y = crate::cuda::gemv_q8(s, l, &self.w.q, &self.w.scales, rows, inputs)?;
        Ok((y, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::relative_error;
    use crate::simd::testing::f32s as values;

    /// The repacked matrix multiplies as the Q8_0 matrix's exact values do: within f32 rounding
    /// of x · dequantize(W)ᵀ, at 1 to 20 rows (slices of 8 past 8), for f32 and f16 inputs, and
    /// stacked parts give their outputs side by side.
    #[test]
    fn q8_rows_multiply_the_q8_0_values() {
        let dev = Device::Cpu;
        let (n, k) = (40, 256);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let qt = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let exact = qt.dequantize(&dev).unwrap();
        let rows = Q8Rows::from_q8_0(&qt, &dev).unwrap();
        assert_eq!((rows.outputs(), rows.inputs()), (n, k));
        for m in [1usize, 3, 8, 9, 20] {
            for dtype in [DType::F32, DType::F16] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let got = rows.forward(&x).unwrap();
                assert_eq!((got.dims(), got.dtype()), ([m, n].as_slice(), DType::F32));
                let want = x
                    .to_dtype(DType::F32)
                    .unwrap()
                    .matmul(&exact.t().unwrap())
                    .unwrap();
                let err = relative_error(&values(&got), &values(&want));
                assert!(err < 1e-6, "{m} rows {dtype:?}: {err:.2e}");
            }
        }
        let other = QTensor::quantize(
            &Tensor::randn(0f32, 2.0, (24, k), &dev).unwrap(),
            GgmlDType::Q8_0,
        )
        .unwrap();
        let stacked = Q8Rows::stack(vec![
            Q8Rows::from_q8_0(&qt, &dev).unwrap(),
            Q8Rows::from_q8_0(&other, &dev).unwrap(),
        ])
        .unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, k), &dev).unwrap();
        let want = Tensor::cat(
            &[
                rows.forward(&x).unwrap(),
                Q8Rows::from_q8_0(&other, &dev)
                    .unwrap()
                    .forward(&x)
                    .unwrap(),
            ],
            1,
        )
        .unwrap();
        assert_eq!(values(&stacked.forward(&x).unwrap()), values(&want));
    }

    /// Another format, or rows that are not whole blocks, are refused with what they are.
    #[test]
    fn q8_rows_take_q8_0_alone() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (8, 64), &dev).unwrap();
        let q41 = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let err = Q8Rows::from_q8_0(&q41, &dev).err().unwrap().to_string();
        assert!(err.contains("Q4_1"), "{err}");
    }
}
