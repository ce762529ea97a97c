//! The gated feed-forward's activation as one op (issue 25): `act(gate) · up`, which candle runs
//! as an activation kernel, then a product kernel, with an intermediate tensor between them. On a
//! GPU one launch of `kernels/glu.cu`; on the CPU the same arithmetic in Rust, the reference the
//! kernel's GPU test compares with.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape};

use crate::config::Activation;

/// `act(gate) · up` over two contiguous f32 tensors of one shape.
pub(crate) struct Glu(pub Activation);

/// SiLU as candle computes it.
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation, as candle's CUDA kernel writes it.
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
}

fn contiguous<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let (CpuStorage::F32(v), Some((a, b))) = (s, l.contiguous_offsets()) else {
        candle_core::bail!("glu: {what} must be contiguous f32");
    };
    Ok(&v[a..b])
}

impl CustomOp2 for Glu {
    fn name(&self) -> &'static str {
        "quarry-glu"
    }

    fn cpu_fwd(
        &self,
        gate: &CpuStorage,
        lg: &Layout,
        up: &CpuStorage,
        lu: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if lg.shape() != lu.shape() {
            candle_core::bail!("glu: gate {:?} and up {:?} differ", lg.shape(), lu.shape());
        }
        let (g, u) = (contiguous(gate, lg, "gate")?, contiguous(up, lu, "up")?);
        let act = match self.0 {
            Activation::Silu => silu,
            Activation::GeluTanh => gelu_tanh,
        };
        let out = g.iter().zip(u).map(|(&g, &u)| act(g) * u).collect();
        Ok((CpuStorage::F32(out), lg.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gate: &candle_core::CudaStorage,
        lg: &Layout,
        up: &candle_core::CudaStorage,
        lu: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        for (l, what) in [(lg, "gate"), (lu, "up")] {
            if !matches!(l.contiguous_offsets(), Some((0, _))) {
                candle_core::bail!("glu: {what} must be contiguous from its start");
            }
        }
        if lg.shape() != lu.shape() {
            candle_core::bail!("glu: gate {:?} and up {:?} differ", lg.shape(), lu.shape());
        }
        let dev = &gate.device;
        let out = crate::cuda::glu(
            dev,
            self.0,
            gate.as_cuda_slice::<f32>()?,
            up.as_cuda_slice::<f32>()?,
            lg.shape().elem_count(),
        )?;
        Ok((
            candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()),
            lg.shape().clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The op equals candle's activation-then-product (SiLU exactly, its formula being candle's;
    /// GELU within float rounding of candle's CPU form), and refuses shapes that differ.
    #[test]
    fn glu_equals_candles_two_ops() {
        let dev = Device::Cpu;
        let gate = Tensor::randn(0f32, 3.0, (5, 77), &dev).unwrap();
        let up = Tensor::randn(0f32, 1.0, (5, 77), &dev).unwrap();
        for (act, want) in [
            (Activation::Silu, (gate.silu().unwrap() * &up).unwrap()),
            (Activation::GeluTanh, (gate.gelu().unwrap() * &up).unwrap()),
        ] {
            let got = gate.apply_op2_no_bwd(&up, &Glu(act)).unwrap();
            assert_eq!(got.dims(), [5, 77]);
            let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let err = crate::simd::testing::relative_error(&v(&got), &v(&want));
            let bound = if act == Activation::Silu { 0.0 } else { 1e-6 };
            assert!(err <= bound, "{act:?}: relative error {err:.2e}");
        }
        let other = Tensor::zeros((5, 76), candle_core::DType::F32, &dev).unwrap();
        assert!(gate
            .apply_op2_no_bwd(&other, &Glu(Activation::Silu))
            .is_err());
    }
}
