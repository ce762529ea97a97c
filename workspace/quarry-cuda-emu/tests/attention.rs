//! The paged attention kernel (`kernels/paged_attention.cu`) on the CPU against
//! `attend_reference`, every layout and pool type, launched as the CUDA launcher launches it:
//! the same [`AttentionPlan`] (form, grid, threads, shared memory, split-K chunk), on an H100's
//! 132 SMs, on the GPU test's own cases (`quarry_model::reference::AttentionCase`): the batch mixes
//! what a step mixes (long and short prefills, decodes at long contexts, an extension) on
//! scattered pages; the shapes are SmolLM2's, Qwen2.5's, heads of 128 and 80, and Gemma 3's with
//! its sliding window.

mod common;

use std::ffi::c_void;

use common::{run, run_launch};
use half::{bf16, f16};
use quarry_cuda_emu::{kernels, Buf, Launch};
use quarry_model::kernel_plan::{AttentionPlan, AttentionShape, BatchSize, STATIC_SHARED, TILE};
use quarry_model::reference::{check_around_default_shared, relative_error, AttentionCase};
use quarry_model::{AttentionKernel, RaggedBatch};

const SMS: usize = 132;

/// A layer's pool in one element type, as the kernel's untyped arguments.
enum Pool {
    F32(Buf<f32>, Buf<f32>),
    F16(Buf<f16>, Buf<f16>),
    Bf16(Buf<bf16>, Buf<bf16>),
}

impl Pool {
    fn new(element: &str, k: &[f32], v: &[f32]) -> Self {
        match element {
            "f32" => Self::F32(Buf::from_slice(k), Buf::from_slice(v)),
            "f16" => {
                let h = |x: &[f32]| {
                    Buf::from_slice(&x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<_>>())
                };
                Self::F16(h(k), h(v))
            }
            _ => {
                let b = |x: &[f32]| {
                    Buf::from_slice(&x.iter().map(|&y| bf16::from_f32(y)).collect::<Vec<_>>())
                };
                Self::Bf16(b(k), b(v))
            }
        }
    }
    fn ptrs(&self) -> (*const c_void, *const c_void) {
        match self {
            Self::F32(k, v) => (k.ptr() as _, v.ptr() as _),
            Self::F16(k, v) => (k.ptr() as _, v.ptr() as _),
            Self::Bf16(k, v) => (k.ptr() as _, v.ptr() as _),
        }
    }
}

/// The kernel's output for `q` over `pool` in `kernel`'s layout, in f16 when `out16` (widened
/// here): one launch, or the split kernel's and the combine's, as `paged_attention` in
/// src/cuda/attention.rs runs them.
fn attend(
    meta: &RaggedBatch,
    q: &[f32],
    pool: &Pool,
    element: &str,
    shape: AttentionShape,
    kernel: AttentionKernel,
    out16: bool,
) -> (AttentionPlan, Vec<f32>) {
    let launch = Batch::of(meta, BatchSize::new(meta, shape.window, SMS));
    attend_batch(&launch, q, pool, element, shape, kernel, out16)
}

/// A batch as the kernel reads it: its five arrays (`token_seq`, `token_pos`, `token_shared`,
/// `page_start`, `block_table`) and what its launch is planned for.
struct Batch<'a> {
    arrays: [&'a [u32]; 5],
    size: BatchSize,
    page_size: u32,
}

impl<'a> Batch<'a> {
    /// `meta`'s arrays, its launch planned for `size`.
    fn of(meta: &'a RaggedBatch, size: BatchSize) -> Self {
        Self {
            arrays: [
                &meta.token_seq,
                &meta.token_pos,
                &meta.token_shared,
                &meta.page_start,
                &meta.block_table,
            ],
            size,
            page_size: meta.page_size,
        }
    }
}

/// [`attend`] over a batch given as the kernel's arrays and planned for `b.size`: a CUDA graph's
/// fixed layout, planned for its key's bounds.
fn attend_batch(
    b: &Batch<'_>,
    q: &[f32],
    pool: &Pool,
    element: &str,
    shape: AttentionShape,
    kernel: AttentionKernel,
    out16: bool,
) -> (AttentionPlan, Vec<f32>) {
    let plan = AttentionPlan::new(b.size, shape, kernel, element, out16).unwrap();
    let arrays = b.arrays.map(Buf::from_slice);
    let [seq, pos, shared, start, table] = arrays.each_ref().map(|b| b.ptr());
    let qb = Buf::from_slice(q);
    let (qp, (kp, vp)) = (qb.ptr(), pool.ptrs());
    let (mut out32, mut out16b) = (Buf::<f32>::poisoned(q.len()), Buf::<f16>::poisoned(q.len()));
    let op = if out16 {
        out16b.ptr_mut() as *mut c_void
    } else {
        out32.ptr_mut() as *mut c_void
    };
    let (n_head, n_kv, head_dim) = (
        shape.n_head as i32,
        shape.n_kv as i32,
        shape.head_dim as i32,
    );
    let (page, scale, window) = (b.page_size as i32, shape.scale, shape.window as i32);
    let reads = shape.reads();
    // The launch as the driver checks it: the kernel's static `red` and the limit the CUDA
    // launcher raises.
    let launch = Launch {
        static_shared: STATIC_SHARED,
        shared_limit: plan.shared_limit(),
        ..Launch::new(plan.grid, plan.threads, plan.shared_bytes)
    };
    match (plan.chunk, plan.tokens) {
        (None, Some(tokens)) => {
            let f = kernels::attention_tiled::by_name(&plan.kernel).expect(&plan.kernel);
            let tokens = tokens as i32;
            unsafe {
                run_launch(&plan.kernel, launch, || {
                    f(
                        qp, kp, vp, seq, pos, start, table, op, n_head, n_kv, head_dim, page,
                        scale, window, tokens,
                    )
                })
            };
        }
        (None, None) => {
            let f = kernels::attention::by_name(&plan.kernel).expect(&plan.kernel);
            unsafe {
                run_launch(&plan.kernel, launch, || {
                    f(
                        qp, kp, vp, seq, pos, start, table, op, n_head, n_kv, head_dim, page,
                        scale, window, reads,
                    )
                })
            };
        }
        (Some(chunk), _) => {
            let slots = plan.slots();
            let rows = b.size.tokens * shape.n_head * slots;
            let mut acc = Buf::<f32>::poisoned(rows * shape.head_dim);
            let mut ml = Buf::<f32>::poisoned(rows * 2);
            let (ap, mp) = (acc.ptr_mut(), ml.ptr_mut());
            let (slots32, tokens32) = (slots as i32, b.size.tokens as i32);
            if let Some(prefix) = &plan.prefix {
                let f = kernels::attention_prefix::by_name(&prefix.kernel).expect(&prefix.kernel);
                let launch = Launch {
                    shared_limit: prefix.shared_limit(),
                    ..Launch::new(prefix.grid, prefix.threads, prefix.shared_bytes)
                };
                unsafe {
                    run_launch(&prefix.kernel, launch, || {
                        f(
                            qp, kp, vp, seq, shared, start, table, ap, mp, tokens32, n_head, n_kv,
                            head_dim, page, scale, slots32,
                        )
                    })
                };
            }
            let f = kernels::attention_split::by_name(&plan.kernel).expect(&plan.kernel);
            let slot0 = plan.prefix_slots() as i32;
            // The split launch, the combine after it where `counters` is null, else in its last
            // block of each (token, key-value head) into `combined`.
            let split = |ap: *mut f32, mp: *mut f32, counters: *mut u32, combined: *mut c_void| {
                let (c32, c16) = match (counters.is_null(), out16) {
                    (true, _) => (std::ptr::null_mut(), std::ptr::null_mut()),
                    (false, true) => (std::ptr::null_mut(), combined),
                    (false, false) => (combined as *mut f32, std::ptr::null_mut()),
                };
                unsafe {
                    run_launch(&plan.kernel, launch, || {
                        f(
                            qp,
                            kp,
                            vp,
                            seq,
                            pos,
                            start,
                            table,
                            ap,
                            n_head,
                            n_kv,
                            head_dim,
                            page,
                            scale,
                            window,
                            chunk as i32,
                            mp,
                            shared,
                            slot0,
                            counters,
                            c32,
                            c16,
                            reads,
                        )
                    })
                };
            };
            split(ap, mp, std::ptr::null_mut(), std::ptr::null_mut());
            // Every slot's maximum and sum written, and the sums of every slot the combine
            // reads (those whose maximum is finite: the cascade's prefix slots of a token
            // outside the prefix are -inf, their sums never written).
            let (acc_read, ml_read) = (acc.read("acc"), ml.read("ml"));
            assert!(
                ml_read.iter().all(|x| !x.is_nan()),
                "{}: a slot's max or sum unwritten",
                plan.kernel
            );
            for (i, row) in acc_read.chunks(shape.head_dim).enumerate() {
                if ml_read[2 * i] != f32::NEG_INFINITY {
                    assert!(
                        row.iter().all(|x| !x.is_nan()),
                        "{}: slot {i}'s sums unwritten",
                        plan.kernel
                    );
                }
            }
            let combine = kernels::combine::by_name(plan.combine_kernel()).unwrap();
            let (blocks, threads) = plan.combine(shape);
            let (ap, mp) = (acc.ptr(), ml.ptr());
            unsafe {
                run(plan.combine_kernel(), (blocks, 1, 1), threads, 0, || {
                    combine(ap, mp, op, head_dim, slots32)
                })
            };
            // The same launch combining in its last blocks (`split_combine`): bit for bit the
            // combine's launch, every counter back at 0 (a graph replays the same buffer). The
            // cascade's prefix slots are the first launch's (the same values, written before).
            // On the f16 pool, the one quarry runs, in the forms the model's groups take: the
            // combine reads the chunks' f32 results, whatever the pool (and the emulator's
            // attention runs are the test suite's slowest).
            if element == "f16" && !shape.widest_group_form {
                let counters = b.size.tokens * shape.n_kv;
                check_last_block_combine(&plan, counters, out16, &acc, &ml, split, &out32, &out16b);
            }
        }
    }
    let got = if out16 {
        out16b.read("out").iter().map(|x| x.to_f32()).collect()
    } else {
        out32.read("out")
    };
    (plan, got)
}

/// Split-K with the combine in the split launch's last blocks (`split_combine`), against the
/// combine's own launch, whose output `out32` or `out16b` holds (f16 where `out16`) and whose
/// chunk results `acc` and `ml` hold: `split` launches the split kernel on the given chunk
/// buffers, counters (one per token and key-value head: `counters` of them) and output. Bit for
/// bit the same output, and every counter back at 0 (a CUDA graph replays the same buffer). The
/// cascade's prefix slots are copied from the first launch's (the prefix launch wrote them
/// before the split launch there too). The emulator runs a launch's blocks one after another, so
/// it cannot show a race between them: a block that combined too early would be overwritten by
/// the last one here (the GPU test runs the same comparison where blocks do race).
#[allow(clippy::too_many_arguments)]
fn check_last_block_combine(
    plan: &AttentionPlan,
    counters: usize,
    out16: bool,
    acc: &Buf<f32>,
    ml: &Buf<f32>,
    split: impl Fn(*mut f32, *mut f32, *mut u32, *mut c_void),
    out32: &Buf<f32>,
    out16b: &Buf<f16>,
) {
    let (mut acc2, mut ml2) = match plan.prefix {
        Some(_) => (
            Buf::from_slice(&acc.read("acc")),
            Buf::from_slice(&ml.read("ml")),
        ),
        None => (Buf::poisoned(acc.len()), Buf::poisoned(ml.len())),
    };
    let mut count = Buf::<u32>::from_slice(&vec![0; counters]);
    let (mut last32, mut last16) = (
        Buf::<f32>::poisoned(out32.len()),
        Buf::<f16>::poisoned(out16b.len()),
    );
    let combined = match out16 {
        true => last16.ptr_mut() as *mut c_void,
        false => last32.ptr_mut() as *mut c_void,
    };
    split(acc2.ptr_mut(), ml2.ptr_mut(), count.ptr_mut(), combined);
    assert!(
        count.read("counters").iter().all(|&c| c == 0),
        "{}: a counter left for the next launch",
        plan.kernel
    );
    let bits32 = |b: &Buf<f32>, what| b.read(what).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let bits16 = |b: &Buf<f16>, what| b.read(what).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let same = match out16 {
        true => bits16(&last16, "combined") == bits16(out16b, "out"),
        false => bits32(&last32, "combined") == bits32(out32, "out"),
    };
    assert!(
        same,
        "{}: the last-block combine differs from the combine's launch",
        plan.kernel
    );
}

fn matches_its_reference(kernel: AttentionKernel) {
    for case in AttentionCase::mixed(16) {
        let AttentionCase {
            meta,
            heads: h,
            q,
            k,
            v,
            want,
        } = case;
        let (n_head, n_kv, head_dim) = (h.n_head, h.n_kv, h.head_dim);
        let window = h.window.unwrap_or(0);
        // The 16-bit pools hold rounded keys and values: bf16 keeps 8 bits of mantissa, f16 11,
        // so their errors sit near 2^-9 and 2^-12 of the values (the GPU test's bounds).
        // The f16 pool, the one quarry runs, also with the f16 output the dense output projection
        // reads (its rounding, 2^-12 of the values, inside the pool's bound).
        // The f16 case also in the forms sized for groups of 8 where the model's are smaller
        // (attention-bench's comparison; the per-dimension layout has only those).
        let cases = [
            ("f32", false, false, 1e-5),
            ("f16", false, false, 2e-3),
            ("f16", true, false, 2e-3),
            ("f16", true, true, 2e-3),
            ("bf16", false, false, 1e-2),
        ];
        for (element, out16, widest_group_form, bound) in cases {
            if widest_group_form && kernel == AttentionKernel::PerDimension {
                continue;
            }
            let pool = Pool::new(element, &k, &v);
            let shape = AttentionShape {
                widest_group_form,
                ..AttentionShape::from(h)
            };
            let (plan, got) = attend(&meta, &q, &pool, element, shape, kernel, out16);
            if kernel == AttentionKernel::Tiled {
                assert!(plan.kernel.contains("tiled"), "{}", plan.kernel);
            }
            let name = match plan.chunk {
                Some(c) => format!(
                    "{} + {} (chunks of {c})",
                    plan.kernel,
                    plan.combine_kernel()
                ),
                None => plan.kernel.clone(),
            };
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{name}: unwritten or NaN output"
            );
            let err = relative_error(&got, &want);
            eprintln!("{name} ({n_head}/{n_kv} heads of {head_dim}, window {window}): relative error {err:.2e}");
            assert!(
                err < bound,
                "{name}: relative error {err:.2e} over {bound:.0e}"
            );
        }
    }
}

#[test]
fn per_dimension_layout_matches_its_reference_on_a_mixed_batch() {
    matches_its_reference(AttentionKernel::PerDimension);
}

#[test]
fn warps_layout_matches_its_reference_on_a_mixed_batch() {
    matches_its_reference(AttentionKernel::Warps);
}

/// The tiled form on the mixed batch, which has both kinds of tile: whole ones (tokens of one
/// sequence at consecutive positions: the 120- and 37-token prefills, the extension's) that one
/// block computes, and tokens computed alone (decode rows, tiles across two sequences, the last
/// partial tile); with Gemma's window, the tile's tokens' ranges start at different positions.
#[test]
fn tiled_form_matches_its_reference_on_a_mixed_batch() {
    let meta = &AttentionCase::mixed(16)[0].meta;
    let (seq, pos) = (&meta.token_seq, &meta.token_pos);
    let tiles = meta.tokens().div_ceil(TILE);
    let whole = (0..meta.tokens() / TILE)
        .filter(|&b| {
            (1..TILE).all(|i| {
                seq[b * TILE + i] == seq[b * TILE] && pos[b * TILE + i] == pos[b * TILE] + i as u32
            })
        })
        .count();
    assert!(whole > 0 && whole < tiles, "{whole} whole tiles of {tiles}");
    matches_its_reference(AttentionKernel::Tiled);
}

/// The cascade on the mixed batch, whose sequences 1, 2 and 3 (two decodes and an extension)
/// share 208 positions' pages and sequence 6 the first 64 of them: the prefix launch serves the
/// three members' tokens among blocks of tokens outside the prefix (the 37-token prefill's last
/// ones, the extension's neighbours), the split launch their own positions past it, every other
/// token's whole context. On 132 SMs the prefix is cut into slots of one chunk; on one SM a slot
/// takes all four chunks (the online softmax's rescaling). Shapes with a window or heads of 80
/// run as the warps layout.
#[test]
fn cascade_matches_its_reference_on_a_mixed_batch() {
    let case = &AttentionCase::mixed(16)[0];
    let shared = &case.meta.token_shared;
    assert_eq!(case.meta.shared_prefix(), 208);
    let members = shared.iter().filter(|&&s| s > 0).count();
    assert_eq!(members, 1 + 1 + 5, "{shared:?}");
    for case in AttentionCase::mixed(16) {
        let shape = AttentionShape::from(case.heads);
        let size = BatchSize::new(&case.meta, shape.window, SMS);
        let plan = AttentionPlan::new(size, shape, AttentionKernel::Cascade, "f16", true).unwrap();
        let runs_prefix = shape.window == 0 && shape.head_dim % 64 == 0;
        assert_eq!(plan.prefix.is_some(), runs_prefix, "{plan:?}");
    }
    matches_its_reference(AttentionKernel::Cascade);
    // One slot of four chunks.
    for case in AttentionCase::mixed(16)
        .into_iter()
        .filter(|c| c.heads.window.is_none())
    {
        let shape = AttentionShape::from(case.heads);
        let batch = Batch::of(&case.meta, BatchSize::new(&case.meta, 0, 1));
        for element in ["f32", "f16"] {
            let pool = Pool::new(element, &case.k, &case.v);
            let kernel = AttentionKernel::Cascade;
            let (plan, got) = attend_batch(&batch, &case.q, &pool, element, shape, kernel, false);
            if let Some(prefix) = &plan.prefix {
                assert_eq!(prefix.slots(), 1, "{plan:?}");
            }
            let err = relative_error(&got, &case.want);
            let bound = if element == "f32" { 1e-5 } else { 2e-3 };
            eprintln!(
                "{} on one SM, {element}: relative error {err:.2e}",
                plan.kernel
            );
            assert!(err < bound, "{}: relative error {err:.2e}", plan.kernel);
        }
    }
}

/// Split-K with chunks of 16 and 100 positions (most tokens' contexts split, some in one chunk,
/// chunks past short tokens' ends left empty) and with the chunk it chooses for 132 SMs.
#[test]
fn split_k_matches_its_reference_on_a_mixed_batch() {
    for chunk in [Some(16), Some(100), None] {
        matches_its_reference(AttentionKernel::Split { chunk });
    }
}

/// A decode row at 20,000 positions with Qwen2.5's groups of 7: more than one block's shared
/// memory holds, so the warps layout splits it.
#[test]
fn a_context_too_long_for_one_block_is_split() {
    let AttentionCase {
        meta,
        heads: h,
        q,
        k,
        v,
        want,
    } = AttentionCase::long_context();
    let pool = Pool::new("f32", &k, &v);
    let (plan, got) = attend(
        &meta,
        &q,
        &pool,
        "f32",
        AttentionShape::from(h),
        AttentionKernel::Warps,
        false,
    );
    assert!(plan.chunk.is_some(), "{plan:?}");
    let err = relative_error(&got, &want);
    assert!(err < 1e-5, "{}: relative error {err:.2e}", plan.kernel);
}

/// Shared memory on either side of the 48 KiB a kernel has without opting in, launched with the
/// plan's limit as the driver checks it (`reference::check_around_default_shared`).
#[test]
fn contexts_on_either_side_of_the_default_shared_memory_launch() {
    check_around_default_shared(|case| {
        let pool = Pool::new("f32", &case.k, &case.v);
        let shape = AttentionShape::from(case.heads);
        let (_, got) = attend(
            &case.meta,
            &case.q,
            &pool,
            "f32",
            shape,
            AttentionKernel::Warps,
            false,
        );
        Ok(got)
    });
}

/// A step padded to its CUDA graph's key (`step_graph::GraphKey::pad`), in the graph's fixed
/// layout (`GraphKey::pack`: a sequence slot per token, unused `page_start` entries repeating its
/// end) and planned for the key's bounds (its tokens, the context rounded up to 256): every real
/// token's output is the unpadded reference's, in every layout, on the f16 pool quarry runs. The
/// padding's tokens sit at position 0 of a scratch page past the case's pages, as the pool's
/// scratch page is past the allocator's.
#[test]
fn a_step_padded_to_its_graph_matches_the_unpadded_reference() {
    use quarry_model::step_graph::GraphKey;
    for case in AttentionCase::mixed(16) {
        let h = case.heads;
        let shape = AttentionShape::from(h);
        let key = GraphKey::of(&case.meta).unwrap();
        let rows = case.k.len() / (h.n_kv * h.head_dim);
        let scratch = rows.div_ceil(16) as u32;
        let mut padded = RaggedBatch::default();
        let pad = key.pad(&case.meta, scratch, &mut padded);
        assert!(pad > 0, "the mixed batch fills no bucket exactly");
        let mut packed = Vec::new();
        let used = key.pack(&padded, &mut packed);
        let at = key.layout();
        packed.resize(at[5], u32::MAX); // past what a step uses: never read
        let arrays: [&[u32]; 5] = std::array::from_fn(|i| &packed[at[i]..at[i + 1]]);
        assert!(used <= at[5]);
        // The pools with the scratch page after the case's rows, the queries with the padding's.
        let width = h.n_kv * h.head_dim;
        let scratch_rows = (scratch as usize + 1) * 16;
        let (mut k, mut v) = (case.k.clone(), case.v.clone());
        k.resize(scratch_rows * width, 0.5);
        v.resize(scratch_rows * width, -0.5);
        let mut q = case.q.clone();
        q.resize(key.tokens * h.n_head * h.head_dim, 0.25);
        let batch = Batch {
            arrays,
            size: BatchSize {
                tokens: key.tokens,
                longest: key.context,
                sms: SMS,
            },
            page_size: 16,
        };
        let pool = Pool::new("f16", &k, &v);
        for kernel in [
            AttentionKernel::Warps,
            AttentionKernel::Split { chunk: None },
            AttentionKernel::PerDimension,
            AttentionKernel::Tiled,
            AttentionKernel::Cascade,
        ] {
            let (plan, got) = attend_batch(&batch, &q, &pool, "f16", shape, kernel, true);
            let real = &got[..case.want.len()];
            let err = relative_error(real, &case.want);
            eprintln!(
                "{} padded by {pad} to {} tokens, context {}: relative error {err:.2e}",
                plan.kernel, key.tokens, key.context
            );
            assert!(err < 2e-3, "{}: relative error {err:.2e}", plan.kernel);
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{}: padding rows",
                plan.kernel
            );
        }
    }
}

/// The L2 prefetch (`attention_prefetch`): the warps and split forms ask for exactly the 128-byte
/// lines of the key rows, the value rows or both of the positions each block attends (its head's
/// bytes of each row, through the block table, within Gemma's window), once each, and nothing
/// when off; the per-dimension form asks for nothing. Heads of 80 in f16 (160 bytes) straddle
/// lines. The output is the same bits whatever is prefetched (a prefetch loads nothing here; on
/// a GPU the CUDA test compares them).
#[test]
fn the_prefetch_asks_l2_for_the_lines_of_the_rows_each_block_reads() {
    use quarry_model::Prefetch;
    let line = |a: usize| a & !127;
    for case in AttentionCase::mixed(16) {
        let (meta, h) = (&case.meta, case.heads);
        let kv_dim = h.n_kv * h.head_dim;
        let window = h.window.unwrap_or(0);
        // Every choice in the warps form on the f16 pool, the others both (the emulator's
        // attention runs are the suite's slowest). The split forms on f32 only: on f16 the test
        // runs their launch twice (the last-block combine's check), which asks for every line
        // twice.
        let both = [Prefetch::Both].as_slice();
        let runs = [
            ("f16", AttentionKernel::Warps, Prefetch::ALL.as_slice()),
            ("f32", AttentionKernel::Warps, both),
            ("f32", AttentionKernel::Split { chunk: Some(16) }, both),
            ("f16", AttentionKernel::PerDimension, both),
        ];
        for (element, kernel, choices) in runs {
            let size = if element == "f32" { 4 } else { 2 };
            let pool = Pool::new(element, &case.k, &case.v);
            let (kp, vp) = pool.ptrs();
            // Every line of `base`'s rows that (token, key-value head) blocks attend.
            let lines_of = |base: *const c_void| {
                let mut lines = Vec::new();
                for t in 0..meta.tokens() {
                    let (s, pos) = (meta.token_seq[t] as usize, meta.token_pos[t] as usize);
                    let pages = &meta.block_table[meta.page_start[s] as usize..];
                    let first = if window > 0 && pos + 1 > window {
                        pos + 1 - window
                    } else {
                        0
                    };
                    for head in 0..h.n_kv {
                        for p in first..=pos {
                            let page_size = meta.page_size as usize;
                            let row = pages[p / page_size] as usize * page_size + p % page_size;
                            let start = base as usize + (row * kv_dim + head * h.head_dim) * size;
                            let end = start + h.head_dim * size;
                            lines.extend((line(start)..end).step_by(128));
                        }
                    }
                }
                lines
            };
            for &prefetch in choices {
                let shape = AttentionShape {
                    prefetch,
                    ..AttentionShape::from(h)
                };
                quarry_cuda_emu::take_prefetches();
                let (plan, got) = attend(meta, &case.q, &pool, element, shape, kernel, false);
                let mut asked = quarry_cuda_emu::take_prefetches();
                let mut want = Vec::new();
                if kernel != AttentionKernel::PerDimension {
                    if matches!(prefetch, Prefetch::Keys | Prefetch::Both) {
                        want.extend(lines_of(kp));
                    }
                    if matches!(prefetch, Prefetch::Values | Prefetch::Both) {
                        want.extend(lines_of(vp));
                    }
                }
                asked.sort_unstable();
                want.sort_unstable();
                let name = format!(
                    "{} ({}, {element} pool, heads of {})",
                    plan.kernel,
                    prefetch.name(),
                    h.head_dim
                );
                eprintln!("{name}: {} lines asked", asked.len());
                assert_eq!(asked.len(), want.len(), "{name}: lines asked");
                assert!(asked == want, "{name}: other lines than the rows it reads");
                let err = relative_error(&got, &case.want);
                assert!(err < 2e-3, "{name}: relative error {err:.2e}");
            }
        }
    }
}

/// The staged key reads (`attention_keys = staged`): the warps and split forms, and the
/// cascade's split launch, give the direct reads' output bits on every shape of the mixed batch
/// (heads of 64, 80, 128 and 256, groups of 2 to 7, Gemma's window) and every pool type: the
/// decode at 701 positions takes three tiles of 256 rows, the last of 189; heads of 80 take a
/// round of 8 pieces and one of 2 (f16) or 4 (f32); chunks of 300 start tiles mid-context. The
/// plan makes room for the stage, which the emulator holds the kernel to (a write past the
/// shared memory, a misaligned 16-byte access: errors).
#[test]
fn staged_key_reads_give_the_direct_reads_bits() {
    use quarry_model::KeyReads;
    let runs = [
        ("f16", AttentionKernel::Warps, true),
        ("f32", AttentionKernel::Warps, false),
        ("bf16", AttentionKernel::Warps, false),
        ("f16", AttentionKernel::Split { chunk: Some(300) }, false),
        ("f32", AttentionKernel::Split { chunk: Some(16) }, false),
        ("f16", AttentionKernel::Cascade, true),
    ];
    for case in AttentionCase::mixed(16) {
        for (element, kernel, out16) in runs {
            let pool = Pool::new(element, &case.k, &case.v);
            let direct = AttentionShape::from(case.heads);
            let staged = AttentionShape {
                keys: KeyReads::Staged,
                ..direct
            };
            let (plan, want) = attend(&case.meta, &case.q, &pool, element, direct, kernel, out16);
            let (staged_plan, got) =
                attend(&case.meta, &case.q, &pool, element, staged, kernel, out16);
            let name = format!(
                "{} ({element} pool, heads of {}, group {})",
                plan.kernel,
                case.heads.head_dim,
                case.heads.n_head / case.heads.n_kv
            );
            assert_eq!(staged_plan.kernel, plan.kernel, "{name}: the same form");
            assert!(
                staged_plan.shared_bytes > plan.shared_bytes,
                "{name}: no room made for the stage"
            );
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            eprintln!("{name}: {differ} of {} outputs differ", got.len());
            assert_eq!(differ, 0, "{name}: staged keys change the output");
            let err = relative_error(&got, &case.want);
            let bound = if element == "f32" { 1e-5 } else { 1e-2 };
            assert!(err < bound, "{name}: relative error {err:.2e}");
        }
    }
}
