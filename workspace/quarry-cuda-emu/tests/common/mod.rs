//! What the kernel tests share: reproducible inputs, the error measure, a launch that must work.
#![allow(dead_code)]

use quarry_cuda_emu::{launch, Launch};

/// `n` values spread over `[lo, hi)` from a xorshift64 stream seeded with `seed` (non-zero), as
/// quarry-model's GPU tests draw theirs.
pub fn values(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x >> 40) as f32 / (1u64 << 24) as f32 * (hi - lo)
        })
        .collect()
}

/// ‖got − want‖ / ‖want‖, in f64.
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den).sqrt()
}

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
    let shape = Launch {
        grid,
        threads,
        shared_bytes: shared,
    };
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
