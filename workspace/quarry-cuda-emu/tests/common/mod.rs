//! What the kernel tests share beyond `quarry_model::reference`: a launch that must work, a
//! bit-for-bit comparison.
#![allow(dead_code)]

use quarry_cuda_emu::{launch, Launch};

/// Runs `kernel` (one call per thread) and panics with the emulator's message if it stops.
///
/// # Safety
/// As [`quarry_cuda_emu::launch`].
pub unsafe fn run<F: Fn()>(
    name: &str,
    grid: (u32, u32, u32),
    threads: u32,
    shared: usize,
    kernel: F,
) {
    unsafe { run_launch(name, Launch::new(grid, threads, shared), kernel) }
}

/// [`run`] with the whole launch: static shared memory and a raised limit included.
///
/// # Safety
/// As [`quarry_cuda_emu::launch`].
pub unsafe fn run_launch<F: Fn()>(name: &str, shape: Launch, kernel: F) {
    if let Err(e) = unsafe { launch(name, shape, kernel) } {
        panic!("{name}: {e}");
    }
}

/// Where two slices first differ in their bits, for a bit-for-bit comparison's message.
pub fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())
        .map(|(i, (g, w))| (i, *g, *w))
}
