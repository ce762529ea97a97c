//! Device selection from a user-facing name (`cpu`, `cuda:0`), and a GPU's memory.

use candle_core::Device;

use crate::error::{ModelError, Result};

/// Opens the device named `cpu`, `cuda` (ordinal 0) or `cuda:N`.
///
/// CUDA needs a build with the `cuda` feature (`make build-cuda`); without it the error says so.
pub fn parse_device(name: &str) -> Result<Device> {
    let err = |message: String| ModelError::Device {
        device: name.to_owned(),
        message,
    };
    let ordinal = match name.trim() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => return Err(err("expected `cpu`, `cuda` or `cuda:N`".into())),
        },
    };
    if !cfg!(feature = "cuda") {
        return Err(err(
            "this build has no CUDA support; rebuild with `make build-cuda` (the `cuda` feature)"
                .into(),
        ));
    }
    Device::new_cuda(ordinal).map_err(|e| ModelError::DeviceOpen {
        device: name.to_owned(),
        source: Box::new(crate::error::without_backtrace(e)),
    })
}

/// Memory a GPU keeps free beside the weights and the KV pool for the passes' activations,
/// logits and graphs: a tenth of what is free, 1 GiB at least.
pub(crate) fn gpu_headroom(free: usize) -> usize {
    (free / 10).max(1 << 30)
}

/// The device's memory available to a new allocation, and its total, in bytes: what the driver
/// reports free (`cuMemGetInfo`) plus what the default memory pool holds reserved but unused —
/// memory freed earlier, which `cuda::prepare` keeps mapped for reuse instead of handing it back, so
/// the driver counts it as used.
#[cfg(feature = "cuda")]
pub fn memory_info(dev: &candle_core::CudaDevice) -> Result<(usize, usize)> {
    use candle_core::cuda::cudarc::driver::sys;
    use candle_core::cuda::WrapErr;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let (free, total) = candle_core::cuda::cudarc::driver::result::mem_get_info().w()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let (mut reserved, mut used) = (0u64, 0u64);
    // SAFETY: the context is current on this thread; both attributes are u64s, as the driver
    // writes them.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .w()?;
        for (attr, out) in [
            (
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut reserved,
            ),
            (
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                &mut used,
            ),
        ] {
            sys::cuMemPoolGetAttribute(pool, attr, (out as *mut u64).cast())
                .result()
                .w()?;
        }
    }
    Ok((free + reserved.saturating_sub(used) as usize, total))
}
