//! The gated feed-forward's activation as one op: `act(gate) · up` from the stacked
//! gate/up projection (`[rows, 2·f]`, each row's gate values then its up values, as one GEMM of
//! the stacked weights writes them), in the element type the down projection multiplies. candle
//! would run a split, casts, an activation kernel and a product kernel, with tensors between
//! them. On a GPU one launch of `kernels/glu.cu`; on the CPU the same arithmetic in Rust, the
//! reference the kernel's GPU test compares with.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape};

use crate::config::Activation;

/// `act(gate) · up` over a contiguous stacked `[rows, 2·f]` tensor (f32 or f16), returning
/// `[rows, f]` in `out` (f32 or f16).
pub(crate) struct Glu {
    pub act: Activation,
    pub out: DType,
}

/// SiLU as candle computes it.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation, as candle's CUDA kernel writes it.
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
}

impl Glu {
    /// Rows and `f` of a stacked input, and the output's shape.
    pub(crate) fn shape(&self, l: &Layout) -> candle_core::Result<(usize, usize, Shape)> {
        let (rows, width) = l.shape().dims2()?;
        if width % 2 != 0 {
            candle_core::bail!("glu: rows of {width} values are not gate and up side by side");
        }
        if !matches!(self.out, DType::F32 | DType::F16) {
            candle_core::bail!("glu: writes f32 or f16, not {:?}", self.out);
        }
        Ok((rows, width / 2, Shape::from((rows, width / 2))))
    }
}

impl CustomOp1 for Glu {
    fn name(&self) -> &'static str {
        "quarry-glu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, f, shape) = self.shape(l)?;
        let values = crate::host_mem::f32_values(s, l, "glu: the gate/up output")?;
        let act = match self.act {
            Activation::Silu => silu,
            Activation::GeluTanh => gelu_tanh,
        };
        let out = values.chunks_exact(2 * f.max(1)).flat_map(|row| {
            let (gate, up) = row.split_at(f);
            gate.iter().zip(up).map(move |(&g, &u)| act(g) * u)
        });
        Ok((
            match self.out {
                DType::F16 => CpuStorage::F16(out.map(half::f16::from_f32).collect()),
                _ => CpuStorage::F32(out.collect()),
            },
            shape,
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, f, shape) = self.shape(l)?;
        let out = crate::cuda::glu(s, l, self.act, self.out, rows, f)?;
        Ok((out, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The op equals candle's split, activation and product (SiLU exactly, its formula being
    /// candle's; GELU within float rounding of candle's CPU form), from f32 or f16 input to f32
    /// or f16 output (the f16 output the rounding of the f32 one), and refuses an odd width.
    #[test]
    fn glu_equals_candles_ops() {
        let dev = Device::Cpu;
        let gate_up = Tensor::randn(0f32, 3.0, (5, 2 * 77), &dev).unwrap();
        let v = crate::simd::testing::f32s;
        for input in [DType::F32, DType::F16] {
            let x = gate_up.to_dtype(input).unwrap();
            let xf = x.to_dtype(DType::F32).unwrap();
            let (gate, up) = (xf.narrow(1, 0, 77).unwrap(), xf.narrow(1, 77, 77).unwrap());
            for (act, want) in [
                (Activation::Silu, (gate.silu().unwrap() * &up).unwrap()),
                (Activation::GeluTanh, (gate.gelu().unwrap() * &up).unwrap()),
            ] {
                let got = x
                    .apply_op1_no_bwd(&Glu {
                        act,
                        out: DType::F32,
                    })
                    .unwrap();
                assert_eq!(got.dims(), [5, 77]);
                let err = crate::simd::testing::relative_error(&v(&got), &v(&want));
                let bound = if act == Activation::Silu { 0.0 } else { 1e-6 };
                assert!(err <= bound, "{input:?} {act:?}: relative error {err:.2e}");
                let half = x
                    .apply_op1_no_bwd(&Glu {
                        act,
                        out: DType::F16,
                    })
                    .unwrap();
                assert_eq!(half.dtype(), DType::F16);
                assert_eq!(v(&half), v(&got.to_dtype(DType::F16).unwrap()));
            }
        }
        let odd = Tensor::zeros((5, 77), DType::F32, &dev).unwrap();
        let silu_f32 = Glu {
            act: Activation::Silu,
            out: DType::F32,
        };
        assert!(odd.apply_op1_no_bwd(&silu_f32).is_err());
    }
}
