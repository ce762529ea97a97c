//! `x += a · wᵀ` in place on a GPU: a projection's GEMM adding into the residual stream.

/// `x += a · wᵀ` in place: `x.inplace_op3(&a, &w, &GemmAdd)`, `x` the f32 residual stream
/// (`[rows, outputs]`), `a` a projection's f16 input (`[rows, inputs]`), `w` its dense f16
/// weights (`[outputs, inputs]`), all contiguous. On a GPU one cuBLAS GEMM that accumulates into
/// the stream (`crate::cuda::gemm_add`), where the dense projection wrote an f16 output and
/// `llama::fused::AddInto` added it: a launch fewer, and the products' sum is not rounded to f16
/// before the add. The CPU side sums each row's products in f32, in order (the GPU test's
/// reference).
pub(crate) struct GemmAdd;

impl GemmAdd {
    /// `(rows, inputs, outputs)`, or the error naming the shapes.
    fn shape(
        lx: &candle_core::Layout,
        la: &candle_core::Layout,
        lw: &candle_core::Layout,
    ) -> candle_core::Result<(usize, usize, usize)> {
        let (x, a, w) = (lx.shape().dims(), la.shape().dims(), lw.shape().dims());
        match (x, a, w) {
            (&[r, o], &[r2, i], &[o2, i2])
                if r == r2
                    && o == o2
                    && i == i2
                    && lx.is_contiguous()
                    && la.is_contiguous()
                    && lw.is_contiguous() =>
            {
                Ok((r, i, o))
            }
            _ => candle_core::bail!(
                "add into the stream: a contiguous stream {x:?}, input {a:?} and weights {w:?} \
                 ([rows, outputs], [rows, inputs], [outputs, inputs])"
            ),
        }
    }
}

impl candle_core::InplaceOp3 for GemmAdd {
    fn name(&self) -> &'static str {
        "quarry-gemm-add"
    }

    fn cpu_fwd(
        &self,
        x: &mut candle_core::CpuStorage,
        lx: &candle_core::Layout,
        a: &candle_core::CpuStorage,
        la: &candle_core::Layout,
        w: &candle_core::CpuStorage,
        lw: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage as C;
        let (rows, inputs, outputs) = Self::shape(lx, la, lw)?;
        let (C::F32(x), C::F16(a), C::F16(w)) = (x, a, w) else {
            candle_core::bail!("add into the stream: an f32 stream, f16 input and weights");
        };
        let a = &a[la.start_offset()..la.start_offset() + rows * inputs];
        let w = &w[lw.start_offset()..lw.start_offset() + outputs * inputs];
        let at = lx.start_offset();
        let x = &mut x[at..at + rows * outputs];
        for (xr, ar) in x.chunks_exact_mut(outputs).zip(a.chunks_exact(inputs)) {
            for (xo, wr) in xr.iter_mut().zip(w.chunks_exact(inputs)) {
                let dot: f32 = ar
                    .iter()
                    .zip(wr)
                    .map(|(a, w)| a.to_f32() * w.to_f32())
                    .sum();
                *xo += dot;
            }
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn cuda_fwd(
        &self,
        x: &mut candle_core::CudaStorage,
        lx: &candle_core::Layout,
        a: &candle_core::CudaStorage,
        la: &candle_core::Layout,
        w: &candle_core::CudaStorage,
        lw: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        let (rows, inputs, outputs) = Self::shape(lx, la, lw)?;
        crate::cuda::gemm_add(x, lx, a, la, w, lw, rows, inputs, outputs)
    }
}
