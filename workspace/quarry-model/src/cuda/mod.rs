//! quarry's own CUDA kernels, launched on the stream of candle's device so that they
//! order with candle's own work, one file per concept:
//! - [`attention`]: the whole-batch paged attention (`kernels/paged_attention.cu`), its layouts
//!   and split-K;
//! - [`forward`]: the forward pass's fused ops (`kernels/rope_store.cu`, `residual.cu`,
//!   `glu.cu`), the launchers of the candle ops in `llama/fused.rs` and `glu.rs`;
//! - [`gemv`]: the small steps' 8-bit GEMV (`kernels/gemv_q8.cu`, `linear/q8_rows.rs`), plain
//!   and with a layer's small work fused around it;
//! - [`sampling`]: the step's masks on their way to the GPU and its draws
//!   (`kernels/sampling.cu`).
//!
//! build.rs compiles the kernels to PTX, embedded here; the driver compiles that for its GPU when
//! a device first loads the module. Each launcher takes the host-side description of its work
//! ([`RaggedBatch`](crate::RaggedBatch), [`SampleRows`](crate::SampleRows)), uploads its small
//! arrays and leaves the large ones (queries, the KV pool, logits, masks) where they are. The
//! tests compare every kernel with its plain-Rust reference on random inputs; they need a GPU and
//! exist only in a CUDA build (`make build-cuda CUDA_TESTS=1`, then `infra/gpu-check.sh`).

use candle_core::cuda::WrapErr;
use candle_core::{CudaDevice, Result};

pub mod attention;
pub mod forward;
pub mod gemv;
pub mod graph;
pub mod sampling;

pub use crate::kernel_plan::AttentionShape;
pub use attention::{paged_attention, AttentionOut, DeviceBatch, KvPool};
pub use forward::glu;
pub(crate) use forward::{add_into, add_norm, gemm_add, rms_norm, rope, store_rows, RopeOut};
pub(crate) use gemv::{gemv_q8, gemv_q8_add, gemv_q8_glu, GemvOperands};
pub use graph::StepGraphs;
pub use sampling::{sample_rows, MaskUpload};

/// Sets up a device for the forward pass: one stream, memory kept between steps.
///
/// - Event tracking off. cudarc, in the multi-stream mode candle's device puts it in, gives every
///   allocation two events and makes every launch wait on and record them for each buffer it
///   reads or writes (a dozen driver calls per launch), so that buffers shared between streams
///   stay ordered. quarry queues all its work on candle's one stream, where order is already
///   kept; a CUDA graph cannot capture waits on events recorded outside it either. Measured on
///   an H100 (2026-11-27, docs/benchmarks-history.md): with the events a batch-1 step ran at
///   0.8× and could not be captured, so there is no switch back.
/// - Freed memory stays mapped. candle allocates every tensor through the stream-ordered
///   allocator (`cuMemAllocAsync` from the device's default pool), whose default release
///   threshold of 0 hands freed memory back to the driver at every synchronization, so each step
///   (one synchronization at least: its tokens come back) would map its activations and its
///   logits (100 MB at batch 512 for a 49,152-token vocabulary) afresh. With no threshold the
///   pool keeps what the largest step needed, as PyTorch's caching allocator does.
pub fn prepare(dev: &CudaDevice) -> crate::Result<()> {
    // SAFETY: every buffer of the process is used on candle's stream only (the kernels of this
    // module, candle's ops and cuBLAS all queue there), so no wait between streams is needed;
    // page-locked host buffers keep their own events (MaskUpload).
    unsafe { dev.disable_event_tracking() };
    Ok(keep_freed_memory(dev)?)
}

/// The default memory pool's release threshold at its maximum ([`prepare`]).
fn keep_freed_memory(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda::cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the context is current on this thread; `pool` receives the device's default pool,
    // and the attribute's value is a u64, as the driver reads it.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(())
}

/// A zero-length upload is refused by the driver; an empty array travels as one unused element.
fn nonempty(v: &[u32]) -> Vec<u32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{CudaDevice, DType, Tensor};

    /// The GPU the kernel tests run on. They exist only in CUDA builds and fail without a GPU:
    /// a CUDA build's test run is the GPU check.
    pub(crate) fn gpu() -> CudaDevice {
        candle_core::Device::new_cuda(0)
            .and_then(|d| d.as_cuda_device().cloned())
            .expect("the CUDA kernel tests need a GPU (run them through infra/gpu-check.sh)")
    }

    /// A tensor of `values` on the GPU and on the CPU, in `dtype`.
    pub(crate) fn both(x: &[f32], shape: &[usize], dtype: DType) -> (Tensor, Tensor) {
        on_both(
            Tensor::from_slice(x, shape, &candle_core::Device::Cpu)
                .and_then(|t| t.to_dtype(dtype))
                .unwrap(),
        )
    }

    /// A CPU tensor's copy on the GPU, and the tensor.
    pub(crate) fn on_both(cpu: Tensor) -> (Tensor, Tensor) {
        (
            cpu.to_device(&candle_core::Device::Cuda(gpu())).unwrap(),
            cpu,
        )
    }

    /// A CPU tensor of u32 `ids`, on both.
    pub(crate) fn ids_on_both(ids: &[u32]) -> (Tensor, Tensor) {
        on_both(Tensor::from_slice(ids, ids.len(), &candle_core::Device::Cpu).unwrap())
    }

    pub(crate) fn host_f32(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap()
    }
}
