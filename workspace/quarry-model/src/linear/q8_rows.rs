//! Small steps on 8-bit weights for a GPU (W8A16): a Q8_0 matrix repacked at load into its int8
//! values (`[outputs, inputs]`, a row's values 16-byte aligned) and one f16 scale per 32 values
//! (`[outputs, inputs / 32]`), multiplied by `kernels/gemv_q8.cu` for steps of a few rows. Such a
//! step reads every weight once, so its time is the weights' bytes: 8.5 bits a weight where the
//! f16 copies take 16. The activations stay f16 or f32 (candle's quantized kernels, which this
//! replaces for Q8_0 below `dense_from_rows` with `q8_gemv`, round them to 8 bits), with sums in
//! f32.
//!
//! Three of its forms finish a layer's work in the same launch (the projections' epilogues,
//! taken where `gemm_add` is, `llama::fused::Fusions`): [`Q8Rows::add_into`] adds the output and
//! down projections' sums into the f32 residual stream, as the dense weights' GEMM does
//! (`linear::GemmAdd`); [`Q8Rows::glu`] writes `act(gate) · up` from the stacked gate/up matrix,
//! a warp pairing gate row j with up row f + j, where `glu::Glu` ran after it; and
//! `llama::fused::RopeStore` with `gemv` rotates the stacked Q/K/V projection's query and key
//! pairs and writes the keys and values into the pools (with `rope_store` on too). Four launches
//! fewer a layer, the same arithmetic.
//!
//! The ops' CPU side is the reference ([`gemv_q8_reference`], then the add or `glu::Glu`'s CPU
//! side): the kernel's products, summed in another order. Tests: `quarry-cuda-emu` runs the
//! kernel's source against it on the CPU (the fused forms against the plain form and the
//! launches they replace, bit for bit), and `cuda::gemv` tests the launcher on a GPU.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, InplaceOp2, Layout, Shape, Tensor};

use crate::config::Activation;
use crate::error::Result;

/// Rows one launch multiplies (`Q8_MAX_ROWS` in the kernel); a larger step runs in slices.
pub const Q8_MAX_ROWS: usize = 8;

/// Values per scale (Q8_0's block).
const BLOCK: usize = 32;

/// Rows the `_norm` forms take (`kernels/gemv_q8.cu`: forms for 1 and 2).
pub(crate) const NORM_MAX_ROWS: usize = 2;

/// The most dynamic shared memory a `_norm` form's normalized rows take (f16): what a launch
/// gets without opting in to more.
const NORM_SHARED_BYTES: usize = 48 * 1024;

/// A `_norm` form's prologue: the residual stream's rows normalized by `weight` (f32,
/// `[inputs]`) with `eps` in the GEMV's own launch, as `op_args::Norm` into f16 writes them
/// (bit for bit: the kernel adds the squares in `rms_norm`'s order), where a norm's launch ran
/// before it.
#[derive(Clone, Copy)]
pub(crate) struct Prologue<'a> {
    pub weight: &'a Tensor,
    pub eps: f32,
}

/// Bytes of a Q8_0 block: its f16 scale, then 32 int8 values.
const Q8_0_BLOCK_BYTES: usize = 2 + BLOCK;

/// A Q8_0 matrix as `gemv_q8` reads it.
pub(crate) struct Q8Rows {
    /// `[outputs, inputs]`, the int8 values' bits as u8.
    q: Tensor,
    /// `[outputs, inputs / 32]`, f16.
    scales: Tensor,
    /// Trips of weights each of the GPU kernel's lanes asks L2 for beyond the one it loads (0:
    /// none; `gemv_prefetch`). The CPU ignores it.
    ahead: usize,
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
            ahead: 0,
        })
    }

    /// The same matrix, its GPU kernel prefetching `ahead` trips of weights
    /// ([`crate::ModelOptions::gemv_prefetch`]).
    pub(crate) fn prefetching(self, ahead: usize) -> Self {
        Self { ahead, ..self }
    }

    /// The trips its GPU kernel prefetches ([`Q8Rows::prefetching`]).
    #[cfg(test)]
    pub(crate) fn ahead(&self) -> usize {
        self.ahead
    }

    /// Several matrices of one input width as one, their outputs side by side (Q, K and V; gate
    /// and up).
    pub(crate) fn stack(parts: Vec<Self>) -> Result<Self> {
        let q: Vec<&Tensor> = parts.iter().map(|p| &p.q).collect();
        let s: Vec<&Tensor> = parts.iter().map(|p| &p.scales).collect();
        Ok(Self {
            q: Tensor::cat(&q, 0)?,
            scales: Tensor::cat(&s, 0)?,
            ahead: parts.iter().map(|p| p.ahead).max().unwrap_or(0),
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
        let x = aligned(x)?;
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

    /// `stream += x · Wᵀ` in one launch (`gemv_q8_add`), and true, where the fused form takes the
    /// step: `x` f16 (what [`super::Small::input_dtype`] asks the projection's input in), at most
    /// [`Q8_MAX_ROWS`] rows, `stream` their f32 rows of `outputs` values. False, with nothing
    /// done, otherwise (the caller adds [`Q8Rows::forward`]'s output).
    pub(crate) fn add_into(&self, stream: &Tensor, x: &Tensor) -> Result<bool> {
        let Some(x) = self.fused_input(x)? else {
            return Ok(false);
        };
        stream.inplace_op2(&x, &Q8AddOp { w: self })?;
        Ok(true)
    }

    /// `act(gate) · up` in `out` (f16 or f32), `[rows, outputs / 2]`, for this matrix holding the
    /// gate rows then as many up rows (the stacked gate/up projection), in one launch
    /// (`gemv_q8_glu`); `None` where the fused form does not take the step (as
    /// [`Q8Rows::add_into`], or an odd number of rows in the matrix, or another `out`).
    ///
    /// With `norm`, `x` is the residual stream's rows, normalized in the launch's prologue
    /// ([`Prologue`], [`Q8Rows::normed_input`]).
    pub(crate) fn glu(
        &self,
        x: &Tensor,
        act: Activation,
        out: DType,
        norm: Option<Prologue<'_>>,
    ) -> Result<Option<Tensor>> {
        if !self.outputs().is_multiple_of(2) || !matches!(out, DType::F16 | DType::F32) {
            return Ok(None);
        }
        let x = match norm {
            Some(_) => self.normed_input(x)?,
            None => self.fused_input(x)?,
        };
        let Some(x) = x else {
            return Ok(None);
        };
        let op = Q8GluOp {
            w: self,
            act,
            out,
            norm,
        };
        Ok(Some(x.apply_op1_no_bwd(&op)?))
    }

    /// The stream's rows `x` as a `_norm` form takes them, `[rows, inputs]` and 16-byte
    /// aligned: f32, at most [`NORM_MAX_ROWS`] rows whose f16 norm fits a block's shared memory;
    /// `None` otherwise.
    pub(crate) fn normed_input(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let inputs = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / inputs.max(1);
        if x.dtype() != DType::F32
            || rows > NORM_MAX_ROWS
            || inputs != self.inputs()
            || rows * inputs * 2 > NORM_SHARED_BYTES
        {
            return Ok(None);
        }
        Ok(Some(aligned(x.reshape((rows, inputs))?)?))
    }

    /// The reference's sums for `s`, `l`, normalized first where there is a prologue.
    pub(crate) fn sums_after(
        &self,
        norm: Option<Prologue<'_>>,
        s: &CpuStorage,
        l: &Layout,
    ) -> candle_core::Result<Vec<f32>> {
        let Some(p) = norm else {
            return self.reference_sums(s, l);
        };
        let op = crate::op_args::Norm {
            weight: p.weight,
            eps: p.eps,
            out: DType::F16,
        };
        let (h, shape) = CustomOp1::cpu_fwd(&op, s, l)?;
        self.reference_sums(&h, &Layout::contiguous(shape))
    }

    /// The reference's sums for the input `s`, `l` (`[rows, inputs]`, f32 or f16, contiguous):
    /// `[rows, outputs]`, row-major.
    pub(crate) fn reference_sums(
        &self,
        s: &CpuStorage,
        l: &Layout,
    ) -> candle_core::Result<Vec<f32>> {
        let (rows, inputs) = l.shape().dims2()?;
        let x = crate::host_mem::f32_values(s, l, "q8 rows: the input")?;
        let q: Vec<i8> = self
            .q
            .flatten_all()?
            .to_vec1::<u8>()?
            .into_iter()
            .map(|b| b as i8)
            .collect();
        let scales = self.scales.flatten_all()?.to_vec1::<half::f16>()?;
        Ok(gemv_q8_reference(&q, &scales, &x, rows, inputs))
    }

    /// The repacked values (u8 `[outputs, inputs]`) and scales (f16 `[outputs, inputs / 32]`),
    /// and the trips its lanes prefetch, for a launch that multiplies them in another op
    /// (`llama::fused::RopeStore`).
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(&self) -> (&Tensor, &Tensor, i32) {
        (&self.q, &self.scales, self.ahead as i32)
    }

    /// The input of a step that a fused form takes, `[rows, inputs]` and 16-byte aligned: f16
    /// and at most [`Q8_MAX_ROWS`] rows; `None` otherwise.
    pub(crate) fn fused_input(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let inputs = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / inputs.max(1);
        if x.dtype() != DType::F16 || rows > Q8_MAX_ROWS || inputs != self.inputs() {
            return Ok(None);
        }
        Ok(Some(aligned(x.reshape((rows, inputs))?)?))
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

/// `x` 16-byte aligned and contiguous, as the kernel reads it (a copy where it is not).
fn aligned(x: Tensor) -> Result<Tensor> {
    if x.is_contiguous() && x.layout().start_offset().is_multiple_of(16) {
        return Ok(x);
    }
    Ok(x.copy()?)
}

impl Q8Rows {
    /// The GEMV's operands: `rows` rows of `inputs` values of the input `s`, `l`, and this
    /// matrix.
    #[cfg(feature = "cuda")]
    fn operands<'a>(
        &'a self,
        s: &'a candle_core::CudaStorage,
        l: &'a Layout,
        rows: usize,
        inputs: usize,
    ) -> crate::cuda::GemvOperands<'a> {
        crate::cuda::GemvOperands {
            s,
            l,
            q: &self.q,
            scales: &self.scales,
            rows,
            inputs,
            ahead: self.ahead as i32,
        }
    }

    /// `(rows, inputs)` of an op's input (`[rows, inputs]`, at most [`Q8_MAX_ROWS`] rows on a
    /// GPU), or the error naming it.
    pub(crate) fn input_shape(
        &self,
        l: &Layout,
        on_gpu: bool,
    ) -> candle_core::Result<(usize, usize)> {
        let (rows, inputs) = l.shape().dims2()?;
        if inputs != self.inputs() {
            candle_core::bail!(
                "q8 rows: an input of {inputs} values for a matrix of {}",
                self.inputs()
            );
        }
        if on_gpu && rows > Q8_MAX_ROWS {
            candle_core::bail!("q8 rows: {rows} rows in one launch, over {Q8_MAX_ROWS}");
        }
        Ok((rows, inputs))
    }
}

/// The plain GEMV on `x` (`[rows, inputs]`, contiguous): `[rows, outputs]` f32.
struct Q8Op<'a> {
    w: &'a Q8Rows,
}

impl CustomOp1 for Q8Op<'_> {
    fn name(&self) -> &'static str {
        "quarry-gemv-q8"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, _) = self.w.input_shape(l, false)?;
        let shape = Shape::from((rows, self.w.outputs()));
        Ok((CpuStorage::F32(self.w.reference_sums(s, l)?), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, inputs) = self.w.input_shape(l, true)?;
        let y = crate::cuda::gemv_q8(self.w.operands(s, l, rows, inputs))?;
        Ok((y, Shape::from((rows, self.w.outputs()))))
    }
}

/// `stream.inplace_op2(&x, ..)`: the GEMV's sums added into the f32 stream
/// (`[rows, outputs]`, contiguous) in place.
struct Q8AddOp<'a> {
    w: &'a Q8Rows,
}

impl Q8AddOp<'_> {
    /// `(rows, inputs)`, the stream's rows checked against the input's.
    fn shape(&self, lx: &Layout, l: &Layout, on_gpu: bool) -> candle_core::Result<(usize, usize)> {
        let (rows, inputs) = self.w.input_shape(l, on_gpu)?;
        if lx.shape().dims() != [rows, self.w.outputs()] || !lx.is_contiguous() {
            candle_core::bail!(
                "q8 rows: a contiguous stream of {rows}x{} to add into, not {:?}",
                self.w.outputs(),
                lx.shape()
            );
        }
        Ok((rows, inputs))
    }
}

impl InplaceOp2 for Q8AddOp<'_> {
    fn name(&self) -> &'static str {
        "quarry-gemv-q8-add"
    }

    fn cpu_fwd(
        &self,
        x: &mut CpuStorage,
        lx: &Layout,
        s: &CpuStorage,
        l: &Layout,
    ) -> candle_core::Result<()> {
        self.shape(lx, l, false)?;
        // The sums, then the add `llama::fused::AddInto` does (host_mem's).
        let sums = self.w.reference_sums(s, l)?;
        crate::host_mem::add_into_stream(x, lx, &sums, "q8 rows")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &mut candle_core::CudaStorage,
        lx: &Layout,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<()> {
        let (rows, inputs) = self.shape(lx, l, true)?;
        crate::cuda::gemv_q8_add(x, lx, self.w.operands(s, l, rows, inputs))
    }
}

/// The stacked gate/up GEMV on `x` with the activation after it: `[rows, outputs / 2]` in `out`.
struct Q8GluOp<'a> {
    w: &'a Q8Rows,
    act: Activation,
    out: DType,
    norm: Option<Prologue<'a>>,
}

impl CustomOp1 for Q8GluOp<'_> {
    fn name(&self) -> &'static str {
        "quarry-gemv-q8-glu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, _) = self.w.input_shape(l, false)?;
        let sums = CpuStorage::F32(self.w.sums_after(self.norm, s, l)?);
        let glu = crate::glu::Glu {
            act: self.act,
            out: self.out,
        };
        glu.cpu_fwd(&sums, &Layout::contiguous((rows, self.w.outputs())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, inputs) = self.w.input_shape(l, true)?;
        let norm = self.norm.map(|p| (p.weight, p.eps));
        let x = self.w.operands(s, l, rows, inputs);
        let y = crate::cuda::gemv_q8_glu(x, (self.act, self.out), norm)?;
        Ok((y, Shape::from((rows, self.w.outputs() / 2))))
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

    /// A Q8_0 matrix of `n` rows of `k` values, repacked, on the CPU.
    fn matrix(n: usize, k: usize, std: f32) -> Q8Rows {
        let w = Tensor::randn(0f32, std, (n, k), &Device::Cpu).unwrap();
        Q8Rows::from_q8_0(
            &QTensor::quantize(&w, GgmlDType::Q8_0).unwrap(),
            &Device::Cpu,
        )
        .unwrap()
    }

    /// The adding form adds exactly the plain form's sums into the stream (a view past the
    /// start of a larger tensor, as the residual's room makes it), leaving the rest alone; it
    /// declines, touching nothing, an f32 input or more rows than a launch takes.
    #[test]
    fn q8_add_into_adds_the_plain_sums_into_the_stream() {
        let dev = Device::Cpu;
        let (n, k) = (40, 256);
        let m = matrix(n, k, 1.0);
        for rows in [1usize, 3, 8] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
            let x16 = x.to_dtype(DType::F16).unwrap();
            let room = Tensor::randn(0f32, 1.0, (2 * rows, n), &dev).unwrap();
            let before = values(&room);
            let stream = room.narrow(0, rows, rows).unwrap();
            assert!(m.add_into(&stream, &x16).unwrap(), "{rows} rows");
            let sums = values(&m.forward(&x16).unwrap());
            let got = values(&room);
            let (kept, added) = got.split_at(rows * n);
            assert_eq!(
                kept,
                &before[..rows * n],
                "{rows} rows: written before the stream"
            );
            let want: Vec<f32> = before[rows * n..]
                .iter()
                .zip(&sums)
                .map(|(s, y)| s + y)
                .collect();
            assert_eq!(added, want.as_slice(), "{rows} rows");
            assert!(!m.add_into(&stream, &x).unwrap(), "an f32 input");
        }
        let nine = Tensor::randn(0f32, 1.0, (9, k), &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let stream = Tensor::zeros((9, n), DType::F32, &dev).unwrap();
        assert!(!m.add_into(&stream, &nine).unwrap());
        assert!(
            values(&stream).iter().all(|&v| v == 0.0),
            "declined, yet written"
        );
    }

    /// The GLU form equals `glu::Glu` on the plain form's stacked gate/up sums (gate rows, then
    /// as many up rows), for both activations and outputs; it declines an odd number of rows in
    /// the matrix, an f32 input and a bf16 output.
    #[test]
    fn q8_glu_equals_the_glu_of_the_plain_sums() {
        let dev = Device::Cpu;
        let (f, k) = (37, 128);
        let m = Q8Rows::stack(vec![matrix(f, k, 1.0), matrix(f, k, 0.5)]).unwrap();
        for rows in [1usize, 4] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
            let x16 = x.to_dtype(DType::F16).unwrap();
            let sums = m.forward(&x16).unwrap();
            for act in [Activation::Silu, Activation::GeluTanh] {
                for out in [DType::F16, DType::F32] {
                    let got = m
                        .glu(&x16, act, out, None)
                        .unwrap()
                        .expect("the fused form");
                    let want = sums
                        .apply_op1_no_bwd(&crate::glu::Glu { act, out })
                        .unwrap();
                    assert_eq!((got.dims(), got.dtype()), ([rows, f].as_slice(), out));
                    assert_eq!(values(&got), values(&want), "{rows} rows {act:?} {out:?}");
                }
            }
            assert!(m
                .glu(&x, Activation::Silu, DType::F16, None)
                .unwrap()
                .is_none());
            assert!(m
                .glu(&x16, Activation::Silu, DType::BF16, None)
                .unwrap()
                .is_none());
        }
        let odd = matrix(5, k, 1.0);
        let x16 = Tensor::randn(0f32, 1.0, (1, k), &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert!(odd
            .glu(&x16, Activation::Silu, DType::F16, None)
            .unwrap()
            .is_none());
    }

    /// With a prologue, the GLU form takes the stream's f32 rows and equals the norm into f16
    /// (`op_args::Norm`, the norm's own op) then the form without it; it declines more than
    /// [`NORM_MAX_ROWS`] rows, and f16 input.
    #[test]
    fn q8_glu_with_a_prologue_equals_the_norm_then_the_glu() {
        let dev = Device::Cpu;
        let (f, k) = (24, 128);
        let m = Q8Rows::stack(vec![matrix(f, k, 1.0), matrix(f, k, 0.5)]).unwrap();
        let weight = Tensor::randn(1f32, 0.2, k, &dev).unwrap();
        let norm = Prologue {
            weight: &weight,
            eps: 1e-5,
        };
        for rows in [1usize, 2] {
            let stream = Tensor::randn(0f32, 2.0, (rows, k), &dev).unwrap();
            let h = stream
                .apply_op1_no_bwd(&crate::op_args::Norm {
                    weight: &weight,
                    eps: 1e-5,
                    out: DType::F16,
                })
                .unwrap();
            let act = Activation::Silu;
            let want = m.glu(&h, act, DType::F16, None).unwrap().expect("fused");
            let got = m.glu(&stream, act, DType::F16, Some(norm)).unwrap();
            assert_eq!(
                values(&got.expect("the prologue")),
                values(&want),
                "{rows} rows"
            );
            let h16 = Some(norm);
            assert!(
                m.glu(&h, act, DType::F16, h16).unwrap().is_none(),
                "f16 rows"
            );
        }
        let three = Tensor::randn(0f32, 2.0, (3, k), &dev).unwrap();
        let got = m
            .glu(&three, Activation::Silu, DType::F16, Some(norm))
            .unwrap();
        assert!(got.is_none(), "three rows");
    }
}
