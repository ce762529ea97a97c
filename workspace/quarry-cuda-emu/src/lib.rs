//! quarry-model's CUDA kernels (`workspace/quarry-model/kernels/*.cu`), compiled as C++ for the
//! CPU and run by a small emulator of CUDA's execution model, so that CI, which has no GPU, tests
//! every kernel's arithmetic, indexing, barriers and launch shapes against the plain-Rust
//! references the GPU tests use (`tests/`).
//!
//! A launch runs its blocks one after another on the calling thread; a block's threads are fibers
//! that switch only at `__syncthreads` and warp exchanges (`emu/runtime.cpp`), so shared memory
//! behaves as the CUDA programming model promises and no more: dynamic shared memory starts as NaN
//! bytes, writes past it, misaligned vector loads, 16-byte shared accesses outside it, barriers
//! not every thread reaches and cub results read outside thread 0 are errors or poison, and
//! [`Buf`] surrounds each device buffer with canaries that a write out of bounds breaks; the
//! lines a kernel prefetches into L2 are
//! recorded for the tests ([`take_prefetches`]). What it cannot show: speed, register and
//! shared-memory limits, and the GPU's own rounding (fused multiply-adds, the fast `__expf`),
//! which the tests' tolerances cover, as they do on a GPU.
//!
//! A test harness only (x86-64 Linux, a C++20 compiler): nothing in the product depends on it.

use std::ffi::{c_char, c_void, CString};
use std::fmt;

pub mod kernels;

extern "C" {
    fn quarry_emu_launch(
        name: *const c_char,
        grid: *const u32,
        threads: u32,
        shared_bytes: usize,
        body: extern "C" fn(*mut c_void),
        data: *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> i32;
    fn quarry_emu_take_prefetches(out: *mut usize, cap: usize) -> usize;
}

/// The 128-byte lines (their addresses) that this OS thread's launches asked L2 for
/// (`PREFETCH_L2` in the kernels' common.cuh) since the last call, in the order asked; the
/// record starts over.
pub fn take_prefetches() -> Vec<usize> {
    // SAFETY: a null `out` only counts; then `out` has room for `cap` lines.
    unsafe {
        let n = quarry_emu_take_prefetches(std::ptr::null_mut(), 0);
        let mut lines = vec![0usize; n];
        let got = quarry_emu_take_prefetches(lines.as_mut_ptr(), n);
        lines.truncate(got);
        lines
    }
}

/// A launch the emulator stopped: a deadlock, or a write past the dynamic shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchError(pub String);

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LaunchError {}

/// A block's shared memory, static and dynamic together, as the driver counts it on the GPUs
/// quarry builds for (Hopper): 48 KiB unless the kernel opts in to more, by raising its dynamic
/// limit (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`), up to 227 KiB.
pub const DEFAULT_BLOCK_SHARED: usize = 48 * 1024;
pub const OPT_IN_BLOCK_SHARED: usize = 227 * 1024;

/// A launch's shape: blocks (x, y, z), threads per block (one dimension, as every kernel of
/// quarry's uses) and bytes of dynamic shared memory; and what the driver checks that memory
/// against: the kernel's static shared memory and the dynamic limit its launcher set, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: usize,
    /// The kernel's `__shared__` arrays, in bytes (ptxas reports them).
    pub static_shared: usize,
    /// The dynamic shared memory the launcher allowed the kernel, where it raised the default.
    pub shared_limit: Option<usize>,
}

impl Launch {
    /// A launch of a kernel without static shared memory whose launcher raises no limit.
    pub fn new(grid: (u32, u32, u32), threads: u32, shared_bytes: usize) -> Self {
        Self {
            grid,
            threads,
            shared_bytes,
            static_shared: 0,
            shared_limit: None,
        }
    }

    /// The driver's checks of shared memory (each fails a real launch with
    /// `CUDA_ERROR_INVALID_VALUE`): a raised limit may not take a block past
    /// [`OPT_IN_BLOCK_SHARED`], and the dynamic memory may not pass the limit, by default
    /// [`DEFAULT_BLOCK_SHARED`] less the static memory.
    fn check_shared(&self) -> Result<(), LaunchError> {
        if let Some(limit) = self.shared_limit {
            if self.static_shared + limit > OPT_IN_BLOCK_SHARED {
                return Err(LaunchError(format!(
                    "a dynamic shared memory limit of {limit} bytes beside {} static \
                     is over the {OPT_IN_BLOCK_SHARED} bytes a block may opt in to \
                     (CUDA_ERROR_INVALID_VALUE)",
                    self.static_shared
                )));
            }
        }
        let limit = self
            .shared_limit
            .unwrap_or(DEFAULT_BLOCK_SHARED.saturating_sub(self.static_shared));
        if self.shared_bytes > limit {
            return Err(LaunchError(format!(
                "{} bytes of dynamic shared memory are over the kernel's limit of \
                 {limit} ({} static; the launcher must raise the limit): \
                 CUDA_ERROR_INVALID_VALUE",
                self.shared_bytes, self.static_shared
            )));
        }
        Ok(())
    }
}

/// Runs `thread` as every thread of `launch`'s grid: it calls the kernel with its arguments,
/// and the kernel reads `threadIdx`, `blockIdx`, `blockDim` and `gridDim` as on a GPU.
///
/// # Safety
/// As for a CUDA launch: the kernel's arguments must match its signature and every pointer must
/// address memory the kernel may read or write for as long as the launch runs.
pub unsafe fn launch<F: Fn()>(name: &str, launch: Launch, thread: F) -> Result<(), LaunchError> {
    extern "C" fn call<F: Fn()>(data: *mut c_void) {
        // SAFETY: `data` is the `&F` below, alive for the whole launch.
        let f = unsafe { &*(data as *const F) };
        // A panic cannot unwind through the fibers' frames.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            std::process::abort();
        }
    }
    launch.check_shared()?;
    let c_name = CString::new(name).expect("a kernel name without NUL");
    let grid = [launch.grid.0, launch.grid.1, launch.grid.2];
    let mut error = vec![0u8; 512];
    // SAFETY: the runtime calls `call::<F>` with `data` only while this frame is alive.
    let rc = unsafe {
        quarry_emu_launch(
            c_name.as_ptr(),
            grid.as_ptr(),
            launch.threads,
            launch.shared_bytes,
            call::<F>,
            &thread as *const F as *mut c_void,
            error.as_mut_ptr() as *mut c_char,
            error.len(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let end = error.iter().position(|&b| b == 0).unwrap_or(error.len());
    Err(LaunchError(
        String::from_utf8_lossy(&error[..end]).into_owned(),
    ))
}

/// Bytes of canary on each side of a [`Buf`]'s values, and the alignment of its values (a
/// device allocation's is at least 256).
const CANARY: usize = 256;
const CANARY_BYTE: u8 = 0xa5;

/// A device buffer in host memory: the values 256-byte aligned, between canaries that
/// [`Buf::read`] checks, so a kernel's write out of bounds fails the test that made it.
pub struct Buf<T: Copy> {
    bytes: Vec<u128>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Copy> Buf<T> {
    /// A buffer holding `values`.
    pub fn from_slice(values: &[T]) -> Self {
        let mut b = Self::filled(values.len(), 0);
        // SAFETY: the buffer holds `len` values of T at `ptr`.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), b.ptr_mut(), values.len()) };
        b
    }

    /// A buffer of `len` values whose every byte is `0xff` (NaN for floats, `u32::MAX` for
    /// ids): what a kernel does not write stays recognizable, as the GPU tests poison theirs.
    pub fn poisoned(len: usize) -> Self {
        Self::filled(len, 0xff)
    }

    fn filled(len: usize, byte: u8) -> Self {
        let size = len * std::mem::size_of::<T>();
        let words = (2 * CANARY + size).div_ceil(16) + CANARY / 16;
        let mut b = Self {
            bytes: vec![0u128; words],
            len,
            _t: std::marker::PhantomData,
        };
        let start = b.start();
        let raw = b.raw_mut();
        raw.fill(CANARY_BYTE);
        raw[start..start + size].fill(byte);
        b
    }

    /// Where the values begin in the allocation's bytes: the first 256-byte boundary after a
    /// canary.
    fn start(&self) -> usize {
        let base = self.bytes.as_ptr() as usize;
        (base + CANARY).next_multiple_of(CANARY) - base
    }

    fn raw_mut(&mut self) -> &mut [u8] {
        let n = self.bytes.len() * 16;
        // SAFETY: the u128 words are plain bytes.
        unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr() as *mut u8, n) }
    }

    fn raw(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe {
            std::slice::from_raw_parts(self.bytes.as_ptr() as *const u8, self.bytes.len() * 16)
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values' address, for a kernel's argument.
    pub fn ptr(&self) -> *const T {
        // SAFETY: `start` is inside the allocation.
        unsafe { (self.bytes.as_ptr() as *const u8).add(self.start()) as *const T }
    }

    pub fn ptr_mut(&mut self) -> *mut T {
        let start = self.start();
        // SAFETY: as above.
        unsafe { (self.bytes.as_mut_ptr() as *mut u8).add(start) as *mut T }
    }

    /// The values, after checking both canaries (panics, naming `what`, when a kernel wrote
    /// outside the buffer).
    pub fn read(&self, what: &str) -> Vec<T> {
        let (start, size) = (self.start(), self.len * std::mem::size_of::<T>());
        let raw = self.raw();
        let before = &raw[start - CANARY..start];
        let after = &raw[start + size..start + size + CANARY];
        assert!(
            before.iter().chain(after).all(|&b| b == CANARY_BYTE),
            "{what}: a kernel wrote outside the buffer's {} values",
            self.len
        );
        // SAFETY: the buffer holds `len` initialized values of T.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }.to_vec()
    }
}
