//! The emulator itself: its barriers and warp exchanges order memory as a GPU's do, and what a
//! GPU leaves undefined or hangs on becomes an error or poison here, never a pass.

mod common;

use common::run;
use quarry_cuda_emu::{launch, Buf, Launch};

extern "C" {
    fn emu_reverse(input: *const f32, out: *mut f32);
    fn emu_warp_sum(input: *const f32, out: *mut f32);
    fn emu_deadlock(out: *mut f32);
    fn emu_shared_overflow(words: i32);
    fn emu_read_unwritten(out: *mut f32);
    fn emu_early_return(out: *mut f32);
    fn emu_votes(voter: i32, out: *mut i32);
}

#[test]
fn a_barrier_orders_shared_memory_across_the_block() {
    let (blocks, threads) = (3u32, 256u32);
    let input: Vec<f32> = (0..blocks * threads).map(|i| i as f32).collect();
    let x = Buf::from_slice(&input);
    let mut out = Buf::<f32>::poisoned(input.len());
    let o = out.ptr_mut();
    unsafe {
        run(
            "emu_reverse",
            (blocks, 1, 1),
            threads,
            threads as usize * 4,
            || emu_reverse(x.ptr(), o),
        )
    };
    let want: Vec<f32> = input
        .chunks(threads as usize)
        .flat_map(|c| c.iter().rev().copied())
        .collect();
    assert_eq!(out.read("out"), want);
}

#[test]
fn warp_exchanges_sum_each_warp() {
    let threads = 128u32;
    let input: Vec<f32> = (0..threads).map(|i| (i % 7) as f32).collect();
    let x = Buf::from_slice(&input);
    let mut out = Buf::<f32>::poisoned(input.len());
    let o = out.ptr_mut();
    unsafe {
        run("emu_warp_sum", (1, 1, 1), threads, 0, || {
            emu_warp_sum(x.ptr(), o)
        })
    };
    let want: Vec<f32> = input
        .chunks(32)
        .flat_map(|w| std::iter::repeat_n(w.iter().sum::<f32>(), 32))
        .collect();
    assert_eq!(out.read("out"), want);
}

#[test]
fn a_barrier_some_threads_never_reach_is_a_deadlock_not_a_hang() {
    let mut out = Buf::<f32>::poisoned(64);
    let o = out.ptr_mut();
    let shape = Launch::new((2, 1, 1), 64, 0);
    let err = unsafe { launch("emu_deadlock", shape, || emu_deadlock(o)) }.unwrap_err();
    assert!(err.0.contains("deadlock in block (0, 0, 0)"), "{err}");
    assert!(
        err.0
            .contains("1 threads wait at __syncthreads, 31 at a warp exchange"),
        "{err}"
    );
}

#[test]
fn a_write_past_dynamic_shared_memory_is_reported() {
    let shape = |bytes| Launch::new((1, 1, 1), 32, bytes);
    unsafe { launch("emu_shared_overflow", shape(64), || emu_shared_overflow(15)) }.unwrap();
    let err = unsafe { launch("emu_shared_overflow", shape(64), || emu_shared_overflow(16)) }
        .unwrap_err();
    assert!(
        err.0
            .contains("wrote past its 64 bytes of dynamic shared memory"),
        "{err}"
    );
}

/// The driver's shared-memory limits, which an H100 enforced on the attention's launcher
/// (2026-11-27): the static memory counts against the default 48 KiB and the 227 KiB a kernel
/// may opt in to.
#[test]
fn shared_memory_past_the_drivers_limits_is_refused() {
    let run = |shared_bytes, static_shared, shared_limit| {
        let shape = Launch {
            static_shared,
            shared_limit,
            ..Launch::new((1, 1, 1), 32, shared_bytes)
        };
        unsafe { launch("emu_shared_overflow", shape, || emu_shared_overflow(0)) }
    };
    let kib = 1024;
    run(48 * kib, 0, None).unwrap();
    let err = run(48 * kib, 128, None).unwrap_err();
    assert!(err.0.contains("over the kernel's limit of 49024"), "{err}");
    run(48 * kib, 128, Some(48 * kib)).unwrap();
    let err = run(48 * kib + 1, 0, None).unwrap_err();
    assert!(err.0.contains("CUDA_ERROR_INVALID_VALUE"), "{err}");
    run(227 * kib - 128, 128, Some(227 * kib - 128)).unwrap();
    let err = run(227 * kib, 128, Some(227 * kib)).unwrap_err();
    assert!(err.0.contains("a block may opt in to"), "{err}");
}

#[test]
fn unwritten_shared_memory_reads_as_nan() {
    let mut out = Buf::<f32>::from_slice(&[0.0; 32]);
    let o = out.ptr_mut();
    unsafe {
        run("emu_read_unwritten", (1, 1, 1), 32, 128, || {
            emu_read_unwritten(o)
        })
    };
    assert!(out.read("out").iter().all(|x| x.is_nan()));
}

#[test]
fn returned_threads_release_the_barrier() {
    let mut out = Buf::<f32>::from_slice(&[0.0; 64]);
    let o = out.ptr_mut();
    unsafe { run("emu_early_return", (1, 1, 1), 64, 0, || emu_early_return(o)) };
    let got = out.read("out");
    let want: Vec<f32> = (0..64)
        .map(|i| if i % 2 == 0 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(got, want);
}

/// `__syncthreads_or`: every thread gets the block's vote, each vote its own (a vote does not
/// leak into the next), whichever thread casts it (the first, the last to arrive, a middle one).
#[test]
fn a_vote_at_the_barrier_reaches_every_thread_and_only_its_own_barrier() {
    let threads = 96u32;
    for voter in [0, 47, 95] {
        let mut out = Buf::<i32>::poisoned(3 * threads as usize);
        let o = out.ptr_mut();
        unsafe { run("emu_votes", (1, 1, 1), threads, 0, || emu_votes(voter, o)) };
        let got = out.read("out");
        for (i, votes) in got.chunks(3).enumerate() {
            assert_eq!(votes, [1, 0, 1], "thread {i}, voter {voter}");
        }
    }
}

#[test]
fn a_write_outside_a_buffer_fails_its_read() {
    let mut b = Buf::<f32>::from_slice(&[1.0; 8]);
    assert_eq!(b.read("b"), vec![1.0; 8]);
    assert_eq!(b.ptr() as usize % 256, 0, "a device allocation's alignment");
    unsafe { *b.ptr_mut().add(8) = 2.0 };
    let caught = std::panic::catch_unwind(|| b.read("b")).unwrap_err();
    let msg = caught.downcast_ref::<String>().unwrap();
    assert!(msg.contains("wrote outside the buffer's 8 values"), "{msg}");
}
