//! The paged attention kernel as one candle op over a whole ragged batch ([`PagedAttention`]):
//! on CUDA a launch of `kernels/paged_attention.cu` (through `crate::cuda`), on the CPU the
//! kernel's reference arithmetic ([`crate::ragged::attend_reference`]), which checks the op's
//! plumbing where there is no GPU.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape};

#[cfg(feature = "cuda")]
use crate::kernel_plan::AttentionKernel;
use crate::ragged::Heads;
use crate::ragged::{attend_reference, RaggedBatch};

/// Attention for every new token of the batch as one candle op over `q` (`[tokens, n_head,
/// head_dim]`, f32) and a layer's K and V pools: on CUDA one launch of the paged attention kernel
/// (`kernels/paged_attention.cu`) reading the pool in its element type; on the CPU
/// [`attend_reference`], which checks the op's plumbing where there is no GPU. Returns `[tokens,
/// n_head · head_dim]` in `out`'s element type (f32, or f16 for an output projection that
/// multiplies dense f16 weights).
pub(crate) struct PagedAttention<'a> {
    pub meta: &'a RaggedBatch,
    /// The batch's metadata uploaded once per forward pass (CUDA only).
    #[cfg(feature = "cuda")]
    pub device_batch: Option<&'a crate::cuda::DeviceBatch>,
    pub heads: Heads,
    /// The output's element type: f32 or f16.
    pub out: candle_core::DType,
    /// Which of the kernel's two layouts a GPU runs (the CPU runs the reference either way).
    #[cfg(feature = "cuda")]
    pub kernel: AttentionKernel,
    /// What its warps and split forms ask L2 for (`ModelOptions::attention_prefetch`).
    #[cfg(feature = "cuda")]
    pub prefetch: crate::Prefetch,
    /// How its warps and split forms read their key rows (`ModelOptions::attention_keys`).
    #[cfg(feature = "cuda")]
    pub keys: crate::KeyReads,
}

impl PagedAttention<'_> {
    fn out_shape(&self) -> Shape {
        Shape::from((self.meta.tokens(), self.heads.n_head * self.heads.head_dim))
    }
}

/// The f32 values of a contiguous CPU storage from offset 0 (16-bit pools widened).
fn host_values(s: &CpuStorage, l: &Layout, what: &str) -> candle_core::Result<Vec<f32>> {
    let Some((0, end)) = l.contiguous_offsets() else {
        candle_core::bail!("paged attention: {what} must be contiguous from its start");
    };
    Ok(match s {
        CpuStorage::F32(v) => v[..end].to_vec(),
        CpuStorage::F16(v) => v[..end].iter().map(|x| x.to_f32()).collect(),
        CpuStorage::BF16(v) => v[..end].iter().map(|x| x.to_f32()).collect(),
        _ => candle_core::bail!("paged attention: {what} must be f32, f16 or bf16"),
    })
}

impl CustomOp3 for PagedAttention<'_> {
    fn name(&self) -> &'static str {
        "quarry-paged-attention"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        lq: &Layout,
        k: &CpuStorage,
        lk: &Layout,
        v: &CpuStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = self.out_shape();
        let q = host_values(q, lq, "q")?;
        if q.len() != shape.elem_count() {
            candle_core::bail!(
                "paged attention: q has {} values, expected {shape:?}",
                q.len()
            );
        }
        let (k, v) = (host_values(k, lk, "k")?, host_values(v, lv, "v")?);
        let mut out = vec![0f32; shape.elem_count()];
        attend_reference(self.meta, &q, &k, &v, self.heads, &mut out);
        Ok(match self.out {
            candle_core::DType::F16 => (
                CpuStorage::F16(out.iter().map(|&x| half::f16::from_f32(x)).collect()),
                shape,
            ),
            _ => (CpuStorage::F32(out), shape),
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        lq: &Layout,
        k: &candle_core::CudaStorage,
        lk: &Layout,
        v: &candle_core::CudaStorage,
        lv: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{AttentionOut, AttentionShape, KvPool};
        use candle_core::cuda::CudaStorageSlice as S;
        for (l, what) in [(lq, "q"), (lk, "k"), (lv, "v")] {
            if !matches!(l.contiguous_offsets(), Some((0, _))) {
                candle_core::bail!("paged attention: {what} must be contiguous from its start");
            }
        }
        let Some(batch) = self.device_batch else {
            candle_core::bail!("paged attention: the batch was not uploaded");
        };
        let shape = self.out_shape();
        let dev = &q.device;
        let pool = match (&k.slice, &v.slice) {
            (S::F32(k), S::F32(v)) => KvPool::F32(k, v),
            (S::F16(k), S::F16(v)) => KvPool::F16(k, v),
            (S::BF16(k), S::BF16(v)) => KvPool::Bf16(k, v),
            _ => {
                candle_core::bail!("paged attention: K and V pools must be f32, f16 or bf16 alike")
            }
        };
        let h = self.heads;
        let dims = AttentionShape {
            prefetch: self.prefetch,
            keys: self.keys,
            ..AttentionShape::from(h)
        };
        let q = q.as_cuda_slice::<f32>()?;
        let n = shape.elem_count();
        // SAFETY (both allocations): the kernel writes every output value (one block per token
        // and head, a thread per dimension).
        let out = match self.out {
            candle_core::DType::F16 => {
                let mut out = unsafe { dev.alloc::<half::f16>(n) }?;
                let o = AttentionOut::F16(&mut out);
                crate::cuda::paged_attention(dev, q, pool, batch, dims, self.kernel, o)?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }
            _ => {
                let mut out = unsafe { dev.alloc::<f32>(n) }?;
                let o = AttentionOut::F32(&mut out);
                crate::cuda::paged_attention(dev, q, pool, batch, dims, self.kernel, o)?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }
        };
        Ok((out, shape))
    }
}
