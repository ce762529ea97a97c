//! Host memory the CPU kernels share: a buffer that parallel work items write in disjoint parts
//! ([`SharedMut`]), a CPU tensor's data read in place ([`with_host_slice`]), and a CPU op's f32 or
//! f16 input as f32 ([`f32_values`]). The bottom layer
//! of the crate: it imports nothing of quarry's but the error type, so the kernels that use it
//! (attention, the projections, the host forward) never import each other for it.

use candle_core::{CpuStorage, Layout, Tensor};

use crate::error::Result;

/// A mutable buffer that work items on the pool write in disjoint parts.
pub(crate) struct SharedMut<T = f32> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}

// SAFETY: users write disjoint ranges only (see `slice`).
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(buf: &mut [T]) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// `len` values from `at`.
    ///
    /// # Safety
    /// No two live slices may overlap, and the buffer must outlive them.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        assert!(at + len <= self.len, "{at}+{len} past {}", self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(at), len)
    }
}

/// Runs `f` on the contiguous f32 data of a CPU tensor without copying it.
pub(crate) fn with_host_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(crate::ModelError::Forward {
            message: "expected a CPU tensor".into(),
        });
    };
    let data = cpu.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(f(&data[a..b])),
        None => Err(crate::ModelError::Forward {
            message: "expected a contiguous tensor".into(),
        }),
    }
}

/// A contiguous f32 or f16 storage's values as f32 (a CPU op's input; `what` names it in the
/// error).
pub(crate) fn f32_values(s: &CpuStorage, l: &Layout, what: &str) -> candle_core::Result<Vec<f32>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what} must be contiguous");
    };
    Ok(match s {
        CpuStorage::F32(v) => v[a..b].to_vec(),
        CpuStorage::F16(v) => v[a..b].iter().map(|x| x.to_f32()).collect(),
        _ => candle_core::bail!("{what} must be f32 or f16"),
    })
}

/// The CPU side of an add into the f32 residual stream (`llama::fused::AddInto`, the 8-bit
/// GEMV's adding form): `x[lx's start ..] += y`, element by element; `what` names the op in the
/// error where the stream is not f32.
pub(crate) fn add_into_stream(
    x: &mut CpuStorage,
    lx: &Layout,
    y: &[f32],
    what: &str,
) -> candle_core::Result<()> {
    let CpuStorage::F32(x) = x else {
        candle_core::bail!("{what}: the residual stream must be f32");
    };
    let at = lx.start_offset();
    for (x, y) in x[at..at + y.len()].iter_mut().zip(y) {
        *x += y;
    }
    Ok(())
}
