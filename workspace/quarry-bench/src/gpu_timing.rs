//! Timing on a GPU for the CUDA benchmarks (`attention-bench`, `projection-bench`): the median
//! of a launch sequence's time on candle's stream, measured with CUDA events (so only the GPU's
//! time counts, not the host's), and the rate of a device-to-device copy, the ceiling a kernel
//! that only streams memory could reach.

use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
use candle_core::CudaDevice;

/// Timed runs whose median [`time_ms`] reports.
pub const REPEATS: usize = 20;
/// Untimed runs before them (the first launch of a form loads its module).
pub const WARM_UP: usize = 3;

/// Median milliseconds of `f` on the device's stream over [`REPEATS`] runs after [`WARM_UP`].
pub fn time_ms(dev: &CudaDevice, mut f: impl FnMut()) -> f32 {
    let stream = dev.cuda_stream();
    for _ in 0..WARM_UP {
        f();
    }
    let mut ms: Vec<f32> = (0..REPEATS)
        .map(|_| {
            let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
            let start = stream.record_event(flags).expect("event");
            f();
            let end = stream.record_event(flags).expect("event");
            start.elapsed_ms(&end).expect("elapsed")
        })
        .collect();
    ms.sort_by(f32::total_cmp);
    ms[REPEATS / 2]
}

/// GB/s of a device-to-device copy of `bytes` (its reads and writes counted, as a kernel's
/// reads are): the memory's practical rate on this GPU.
pub fn copy_gb_per_s(dev: &CudaDevice, bytes: usize) -> f64 {
    let words = (bytes / 4).max(1);
    let src = dev.alloc_zeros::<u32>(words).expect("copy source");
    let mut dst = dev.alloc_zeros::<u32>(words).expect("copy destination");
    let ms = time_ms(dev, || dev.memcpy_dtod(&src, &mut dst).expect("copy"));
    2.0 * (words * 4) as f64 / (ms as f64 * 1e-3) / 1e9
}
