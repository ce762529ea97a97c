//! Paged, batched forward equals single-sequence forward: mixed batches of prefills, extends and
//! decodes, page sizes 1 and 16, pages handed out in scrambled order, and a sequence that reads
//! another's pages for their shared prefix. Each KV layout is checked against its own
//! single-sequence, single-call forward, and the two layouts against each other. Gemma 3's
//! sliding-window layers get the same checks over a sequence that outgrows the window.

mod common;

use common::*;
use quarry_model::{Fusions, KvLayout, Logits, ModelError, PageId, SeqInput};

/// Real token ids: the fixture prompts' text, so the model sees natural input.
fn text_tokens(n: usize, offset: usize) -> Vec<u32> {
    long_tokens(&fixture(), n, offset)
}

/// Tokens `offset..offset + n` of the long prompt of fixture `fx`.
fn long_tokens(fx: &serde_json::Value, n: usize, offset: usize) -> Vec<u32> {
    let long = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["tokens"].as_array().unwrap().len() > 1000)
        .unwrap();
    ids(&long["tokens"])[offset..offset + n].to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Three prompts of the fixture's text (40, 17 and 5 tokens).
fn three_prompts() -> [Vec<u32>; 3] {
    [
        text_tokens(40, 0),
        text_tokens(17, 100),
        text_tokens(5, 300),
    ]
}

/// `n` block tables of `pages` pages each from `pool`.
fn tables(pool: &mut quarry_model::KvPool, n: usize, pages: usize) -> Vec<Vec<PageId>> {
    (0..n)
        .map(|_| {
            let mut t = Vec::new();
            assert!(pool.alloc_into(pages, &mut t));
            t
        })
        .collect()
}

/// Pages of the pool in a scrambled (but fixed) order.
fn scrambled(pool: &mut quarry_model::KvPool) -> Vec<PageId> {
    let mut all = Vec::new();
    assert!(pool.alloc_into(pool.num_pages(), &mut all));
    let n = all.len();
    (0..n).map(|i| all[(i * 7919 + 13) % n]).collect::<Vec<_>>()
}

fn check(page_size: usize, layout: KvLayout, tol: f32) {
    let a = text_tokens(40, 0);
    let b = text_tokens(30, 100);
    let c = text_tokens(25, 200);
    // D shares A's first 32 tokens (whole pages at both page sizes), then goes its own way.
    let mut d = a[..32].to_vec();
    d.extend(text_tokens(8, 300));
    let reference: Vec<Vec<Vec<f32>>> = [&a, &b, &c, &d]
        .iter()
        .map(|s| prefill_all(s, 16, layout))
        .collect();

    let pages_for = |n: usize| n.div_ceil(page_size);
    let mut pool = pool(
        page_size,
        pages_for(40) + pages_for(30) + pages_for(25) + pages_for(8),
        layout,
    );
    let mut free = scrambled(&mut pool).into_iter();
    let mut take = |n: usize| -> Vec<PageId> { (0..n).map(|_| free.next().unwrap()).collect() };
    let ta = take(pages_for(40));
    let tb = take(pages_for(30));
    let tc = take(pages_for(25));
    let mut td = ta[..32 / page_size].to_vec();
    td.extend(take(pages_for(8)));

    let model = smollm2();
    let mut out = Logits::new();
    // Call 1: three prefills (B and C only partly).
    model
        .forward(
            &[
                SeqInput::new(&a, 0, &ta).with_all_logits(),
                SeqInput::new(&b[..20], 0, &tb).with_all_logits(),
                SeqInput::new(&c[..24], 0, &tc),
            ],
            &mut pool,
            &mut out,
        )
        .unwrap();
    let mut worst = 0f32;
    for (p, row) in out.positions(0).enumerate() {
        worst = worst.max(max_diff(row, &reference[0][p]));
    }
    for (p, row) in out.positions(1).enumerate() {
        worst = worst.max(max_diff(row, &reference[1][p]));
    }
    assert_eq!(out.positions(2).len(), 1);
    worst = worst.max(max_diff(out.last(2), &reference[2][23]));

    // Call 2: an extend, a decode, and D's extend over A's pages.
    model
        .forward(
            &[
                SeqInput::new(&b[20..], 20, &tb).with_all_logits(),
                SeqInput::new(&c[24..], 24, &tc),
                SeqInput::new(&d[32..], 32, &td).with_all_logits(),
            ],
            &mut pool,
            &mut out,
        )
        .unwrap();
    for (i, row) in out.positions(0).enumerate() {
        worst = worst.max(max_diff(row, &reference[1][20 + i]));
    }
    worst = worst.max(max_diff(out.last(1), &reference[2][24]));
    assert_eq!(out.positions(2).len(), 8);
    for (i, row) in out.positions(2).enumerate() {
        worst = worst.max(max_diff(row, &reference[3][32 + i]));
    }
    eprintln!("page size {page_size}, {layout:?}: worst logit difference {worst:e}");
    assert!(
        worst <= tol,
        "page size {page_size}, {layout:?}: {worst} > {tol}"
    );
}

/// How far a row's logits in a batch may be from the same row's alone. On the CPU not at all: each
/// layout computes a row with the same kernels in the same order, whatever else is in the batch and
/// wherever the pages are. On a GPU every row goes through the same kernels too (dense f16 weights
/// at every batch size), but cuBLAS may pick another GEMM algorithm (tiles, split-K) for another
/// number of rows and so add the same f32 products in another order; a last-bit difference can
/// flip the f16 rounding of an activation in a later layer (2^-11 relative), which 30 layers carry
/// to hundredths of a logit. The bound is from that reasoning, ten times over; the next GPU check
/// measures it. (On an H100, 2026-11-26: exactly 0 with the quantized weights alone; 2.64 with
/// the old switch from quantized to dense weights at 32 rows, which moved a row's arithmetic with
/// the batch's size and is gone.)
fn batch_tolerance() -> f32 {
    if device().is_cpu() {
        0.0
    } else {
        0.1
    }
}

#[test]
fn host_layout_page_16_equals_single_sequence() {
    check(16, KvLayout::Host, batch_tolerance());
}

#[test]
fn host_layout_page_1_equals_single_sequence() {
    check(1, KvLayout::Host, batch_tolerance());
}

#[test]
fn tensor_layout_page_16_equals_single_sequence() {
    check(16, KvLayout::Tensor, batch_tolerance());
}

#[test]
fn tensor_layout_page_1_equals_single_sequence() {
    check(1, KvLayout::Tensor, batch_tolerance());
}

/// The two attention implementations sum in different orders, and 8-bit activation quantization
/// in 30 layers amplifies that (see `llama_cpp_logits.rs`), so they are compared by distribution:
/// the host kernel against the independent tensor-op path.
/// Top-1 agreement and the median log-softmax difference of two layouts' rows, reported.
fn layouts_agree(what: &str, host: &[Vec<f32>], tensor: &[Vec<f32>]) -> (f64, f64) {
    let mut diffs = Vec::new();
    let mut same_top1 = 0;
    for (h, t) in host.iter().zip(tensor) {
        let (lh, lt) = (log_sum_exp(h), log_sum_exp(t));
        diffs.extend(
            h.iter()
                .zip(t)
                .map(|(x, y)| ((*x as f64 - lh) - (*y as f64 - lt)).abs()),
        );
        same_top1 += (quarry_model::argmax(h) == quarry_model::argmax(t)) as usize;
    }
    diffs.sort_by(f64::total_cmp);
    let median = diffs[diffs.len() / 2];
    let share = same_top1 as f64 / host.len() as f64;
    eprintln!(
        "{what}: host vs tensor top-1 agreement {share:.3}, log-softmax difference median {median:.4}"
    );
    (share, median)
}

#[test]
fn host_kernel_agrees_with_tensor_ops() {
    let tokens = text_tokens(300, 400);
    let host = prefill_all(&tokens, 16, KvLayout::Host);
    let tensor = prefill_all(&tokens, 16, KvLayout::Tensor);
    let (share, median) = layouts_agree("smollm2", &host, &tensor);
    // Measured 2026-11-22: median 0.11 nats, top-1 97%; a masking or paging bug moves whole rows.
    assert!(median < 0.25, "median {median}");
    assert!(share >= 0.95, "top-1 agreement {share}");
}

/// Gemma 3's local layers attend over the last 512 positions only. A sequence of 560 tokens runs
/// as a prefill past the window's end and an extend and decodes beyond it, next to another
/// sequence, on scrambled pages; its logits at positions 500..560 (on both sides of the window's
/// first slide, at 512) and the other's must equal a single call over each sequence alone.
///
/// Returns A's reference rows and the worst difference. The host layout must be exact. The tensor
/// layout is not asserted here: candle's f32 matmul of queries by keys rounds differently for
/// different context lengths at Gemma's head size of 256 (B's rows 36..40 of a 40-token call
/// differ from the same rows of an 80-token call by up to 1 logit, rows 0..36 not at all); it is
/// checked against the host kernel instead.
fn gemma3_check(page_size: usize, layout: KvLayout) -> (Vec<Vec<f32>>, f32) {
    let fx = read_fixture("gemma3.logits.json.gz");
    let a = long_tokens(&fx, 560, 0);
    let b = long_tokens(&fx, 80, 600);
    let model = gemma3();
    // The references keep only the rows compared, not 560 rows of 262,144 logits.
    let ref_a = prefill_all_with(model, &a, 16, layout).split_off(500);
    let ref_b = prefill_all_with(model, &b, 16, layout);

    let pages_for = |n: usize| n.div_ceil(page_size);
    let mut pool = pool_for(model, page_size, pages_for(560) + pages_for(80), layout);
    let mut free = scrambled(&mut pool).into_iter();
    let mut take = |n: usize| -> Vec<PageId> { (0..n).map(|_| free.next().unwrap()).collect() };
    let (ta, tb) = (take(pages_for(560)), take(pages_for(80)));
    let mut out = Logits::new();
    let mut worst = 0f32;
    // Call 1: A's prefill up to position 520 (last logits only), B's first 40 tokens.
    model
        .forward(
            &[
                SeqInput::new(&a[..521], 0, &ta),
                SeqInput::new(&b[..40], 0, &tb).with_all_logits(),
            ],
            &mut pool,
            &mut out,
        )
        .unwrap();
    worst = worst.max(max_diff(out.last(0), &ref_a[20]));
    for (p, row) in out.positions(1).enumerate() {
        worst = worst.max(max_diff(row, &ref_b[p]));
    }
    // Call 2: A extends by 30, B by 40.
    model
        .forward(
            &[
                SeqInput::new(&a[521..551], 521, &ta).with_all_logits(),
                SeqInput::new(&b[40..], 40, &tb).with_all_logits(),
            ],
            &mut pool,
            &mut out,
        )
        .unwrap();
    for (i, row) in out.positions(0).enumerate() {
        worst = worst.max(max_diff(row, &ref_a[21 + i]));
    }
    for (i, row) in out.positions(1).enumerate() {
        worst = worst.max(max_diff(row, &ref_b[40 + i]));
    }
    // Then A decodes one token at a time.
    for p in 551..560 {
        model
            .forward(&[SeqInput::new(&a[p..=p], p, &ta)], &mut pool, &mut out)
            .unwrap();
        worst = worst.max(max_diff(out.last(0), &ref_a[p - 500]));
    }
    eprintln!("gemma3, page size {page_size}, {layout:?}: worst logit difference {worst:e}");
    if layout == KvLayout::Host {
        assert!(worst == 0.0, "page size {page_size}, {layout:?}: {worst}");
    }
    (ref_a, worst)
}

#[test]
fn gemma3_sliding_window_paged_equals_single_sequence() {
    gemma3_check(16, KvLayout::Host);
    gemma3_check(1, KvLayout::Host);
}

/// The tensor layout over the window too: paged within two logits of its single-sequence rows (see
/// [`gemma3_check`]), and its rows past the window's first slide against the host kernel's by
/// distribution, as for SmolLM2 above. This is a coarse check (a tensor path without its window
/// still agrees on 95% of these 60 rows); the sharp one is
/// `gemma3_f32_weights_tensor_layout_matches_llama_cpp`, where that mistake drops top-1
/// agreement with llama.cpp to 64%.
#[test]
fn gemma3_sliding_window_tensor_layout_and_host_kernel_agree() {
    let (host, _) = gemma3_check(16, KvLayout::Host);
    let (_, worst_1) = gemma3_check(1, KvLayout::Tensor);
    let (tensor, worst_16) = gemma3_check(16, KvLayout::Tensor);
    assert!(
        worst_1.max(worst_16) < 2.0,
        "tensor layout: {worst_1} (page 1), {worst_16} (page 16)"
    );
    let (share, median) = layouts_agree("gemma3, positions 500..560", &host, &tensor);
    assert!(median < 0.25, "median {median}");
    assert!(share >= 0.9, "top-1 agreement {share}");
}

#[test]
fn malformed_batches_are_typed_errors() {
    let model = smollm2();
    let mut pool = pool(4, 4, KvLayout::Host);
    let mut table = Vec::new();
    assert!(pool.alloc_into(2, &mut table));
    let mut out = Logits::new();
    let toks = [1u32, 2, 3];
    let mut run = |seqs: &[SeqInput]| model.forward(seqs, &mut pool, &mut out).unwrap_err();
    // Block table too short for positions 6..9.
    let e = run(&[SeqInput::new(&toks, 6, &table)]);
    assert!(matches!(e, ModelError::Batch { seq: 0, .. }), "{e}");
    // A token outside the vocabulary, in the second sequence.
    let bad = [49152u32];
    let e = run(&[
        SeqInput::new(&toks, 0, &table),
        SeqInput::new(&bad, 0, &table),
    ]);
    assert!(matches!(e, ModelError::Batch { seq: 1, .. }), "{e}");
    // A page that was never allocated.
    let e = run(&[SeqInput::new(&toks, 0, &[3])]);
    assert!(e.to_string().contains("not allocated"), "{e}");
    // No tokens.
    let e = run(&[SeqInput::new(&[], 0, &table)]);
    assert!(matches!(e, ModelError::Batch { .. }), "{e}");
    // Past the context length.
    let e = run(&[SeqInput::new(&toks, 8192, &table)]);
    assert!(e.to_string().contains("context length"), "{e}");
    // Two sequences writing the same pool rows (a shared page past the shared prefix).
    let e = run(&[
        SeqInput::new(&toks, 0, &table),
        SeqInput::new(&toks, 0, &table),
    ]);
    assert!(matches!(e, ModelError::Batch { seq: 1, .. }), "{e}");
    assert!(e.to_string().contains("also writes"), "{e}");
    // Freeing twice is caught.
    pool.free(table[0]).unwrap();
    assert!(pool.free(table[0]).is_err());
    assert!(pool.free(99).is_err());
}

/// `model`'s logits over a prefill of `prompts` and then a decode step per token of `next` (the
/// same token for every sequence), on a pool of their own (pages of 16):
/// `[step][sequence][vocab]`, the prefill's (each sequence's last position) first.
fn prefill_then_decode(
    model: &quarry_model::Llama,
    prompts: &[Vec<u32>],
    next: &[u32],
) -> Vec<Vec<Vec<f32>>> {
    let pages_of = |p: &Vec<u32>| (p.len() + next.len()).div_ceil(16);
    let mut pool = pool_for(
        model,
        16,
        prompts.iter().map(pages_of).sum(),
        KvLayout::Tensor,
    );
    prefill_then_decode_on(model, &mut pool, prompts, next)
}

/// [`prefill_then_decode`] on `pool`, from whose free pages each sequence takes its own.
fn prefill_then_decode_on(
    model: &quarry_model::Llama,
    pool: &mut quarry_model::KvPool,
    prompts: &[Vec<u32>],
    next: &[u32],
) -> Vec<Vec<Vec<f32>>> {
    let page_size = pool.page_size();
    let pages_of = |p: &Vec<u32>| (p.len() + next.len()).div_ceil(page_size);
    let tables: Vec<Vec<PageId>> = prompts
        .iter()
        .map(|p| {
            let mut t = Vec::new();
            assert!(pool.alloc_into(pages_of(p), &mut t), "the pool has room");
            t
        })
        .collect();
    let mut out = Logits::new();
    let last = |out: &Logits| (0..prompts.len()).map(|s| out.last(s).to_vec()).collect();
    let prefill: Vec<SeqInput> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqInput::new(p, 0, t))
        .collect();
    model.forward(&prefill, pool, &mut out).unwrap();
    let mut logits = vec![last(&out)];
    for (i, token) in next.iter().enumerate() {
        let token = [*token];
        let decode: Vec<SeqInput> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqInput::new(&token, p.len() + i, t))
            .collect();
        model.forward(&decode, pool, &mut out).unwrap();
        logits.push(last(&out));
    }
    logits
}

/// An engine gives its KV pool back to the model when it drops, and the next pool asked for in
/// that shape is the same one (`Llama::kv_pool`): every page free again, and what the last user
/// wrote in it changes nothing, so the same steps give the same logits as on a new pool. A pool
/// of another shape is a new one. On a GPU, the graphs captured on the pool replay on it when it
/// is lent again (no capture), and go when it is dropped.
#[test]
fn a_pool_given_back_is_lent_again_clean() {
    let model = smollm2();
    let prompts = three_prompts().map(|p| p.to_vec());
    let next = text_tokens(4, 700);
    // Other text on the pages `prompts` will take next time, to leave them dirty.
    let others = [
        text_tokens(45, 400),
        text_tokens(44, 500),
        text_tokens(30, 600),
    ];
    let pages = 256;
    let counts = model.kv_pools();
    let mut fresh = model.kv_pool(1, pages).unwrap();
    let reference = prefill_then_decode_on(model, &mut fresh, &prompts, &next);
    let graphs_before = model.cuda_graphs();
    drop(fresh);

    let mut pool = model.kv_pool(1, pages).unwrap();
    prefill_then_decode_on(model, &mut pool, &others, &next);
    // On later pages, the steps of `prompts` (their graphs captured on this pool, on a GPU).
    prefill_then_decode_on(model, &mut pool, &prompts, &next);
    let mut rest = Vec::new();
    assert!(pool.alloc_into(pool.free_pages(), &mut rest));
    model.give_back_pool(pool);
    let graphs_given = model.cuda_graphs();
    let mut again = model.kv_pool(1, pages).unwrap();
    let lent = model.kv_pools();
    assert_eq!(
        (lent.made - counts.made, lent.lent_again - counts.lent_again),
        (2, 1),
        "the second pool new (the first was dropped, not given back), the third lent again"
    );
    assert_eq!(again.free_pages(), pages, "every page free again");
    let replayed = prefill_then_decode_on(model, &mut again, &prompts, &next);
    let graphs_again = model.cuda_graphs().since(&graphs_given);
    let mut worst = 0f32;
    for (r, a) in reference.iter().flatten().zip(replayed.iter().flatten()) {
        worst = worst.max(max_diff(r, a));
    }
    assert!(worst <= batch_tolerance(), "worst logit difference {worst}");
    model.give_back_pool(again);

    // Another shape: a new pool, the spare dropped with its graphs.
    let other = model.kv_pool(1, pages / 2).unwrap();
    let after = model.kv_pools();
    assert_eq!(
        (after.made - lent.made, after.lent_again),
        (1, lent.lent_again)
    );
    assert_eq!(other.free_pages(), pages / 2);
    let graphs_dropped = model.cuda_graphs();
    if graphs_again.enabled {
        assert_eq!(graphs_again.captured, 0, "{graphs_again:?}");
        assert!(graphs_again.replayed > 0, "{graphs_again:?}");
        assert!(
            graphs_given.graphs > graphs_before.graphs
                && graphs_dropped.graphs < graphs_given.graphs,
            "the lent pool's graphs go with it: {graphs_before:?} {graphs_given:?} {graphs_dropped:?}"
        );
    }
    model.give_back_pool(other);
}

/// A step padded to its CUDA graph's shape (`step_graph::GraphKey::pad`) gives every real row the
/// logits the step gives unpadded, and leaves the real sequences' keys and values as they were:
/// a mixed prefill of three sequences (62 tokens, padded to 64), an extend step with every logit
/// wanted (6 tokens, to 8), then decodes (3 tokens, to 4), on SmolLM2 and Gemma 3, each run on a
/// pool of its own. `forward_paged` runs the pass a graph replays without a graph (on the CPU the
/// paged attention's reference arithmetic, which the host kernel agrees with, above), so a
/// padding token that wrote a real sequence's row, or attended to one, would move the logits of
/// the steps after it. (Against the gather attention of the CPU's tensor forward, the paged
/// reference differs by rounding, about 1e-7 in the first layer's output, which the quantized
/// activations of 30 layers carry to about a logit: so both runs here take the paged attention.)
#[test]
fn padded_steps_keep_every_real_row() {
    padded_steps_keep_the_logits(smollm2());
}

/// [`padded_steps_keep_every_real_row`] on Gemma 3 (its own test, so that a GPU check carrying
/// SmolLM2 alone skips it by name).
#[test]
fn padded_steps_keep_every_real_row_gemma3() {
    padded_steps_keep_the_logits(gemma3());
}

fn padded_steps_keep_the_logits(model: &'static quarry_model::Llama) {
    {
        let prompts = three_prompts();
        let extend = [
            text_tokens(3, 500),
            text_tokens(1, 520),
            text_tokens(2, 540),
        ];
        let next = text_tokens(3, 700);
        let run = |padded: bool| -> Vec<Vec<f32>> {
            let mut pool = pool_for(model, 16, 12, KvLayout::Tensor);
            let tables = tables(&mut pool, 3, 4);
            let mut rows = Vec::new();
            let mut out = Logits::new();
            let mut step = |batch: &[SeqInput], pool: &mut quarry_model::KvPool| {
                model.forward_paged(batch, pool, &mut out, padded).unwrap();
                for s in 0..batch.len() {
                    rows.extend(out.positions(s).map(<[f32]>::to_vec));
                }
            };
            let mut len: Vec<usize> = prompts.iter().map(Vec::len).collect();
            let prefill: Vec<SeqInput> = prompts
                .iter()
                .zip(&tables)
                .map(|(p, t)| SeqInput::new(p, 0, t))
                .collect();
            step(&prefill, &mut pool);
            let extends: Vec<SeqInput> = extend
                .iter()
                .zip(&tables)
                .zip(&len)
                .map(|((e, t), &l)| SeqInput::new(e, l, t).with_all_logits())
                .collect();
            step(&extends, &mut pool);
            for (l, e) in len.iter_mut().zip(&extend) {
                *l += e.len();
            }
            for (i, token) in next.iter().enumerate() {
                let token = [*token];
                let decode: Vec<SeqInput> = tables
                    .iter()
                    .zip(&len)
                    .map(|(t, &l)| SeqInput::new(&token, l + i, t))
                    .collect();
                step(&decode, &mut pool);
            }
            rows
        };
        let (plain, padded) = (run(false), run(true));
        assert_eq!(plain.len(), 3 + 6 + 3 * 3);
        assert_eq!(plain.len(), padded.len());
        let worst = plain
            .iter()
            .zip(&padded)
            .map(|(a, b)| max_diff(a, b))
            .fold(0f32, f32::max);
        eprintln!("padded steps: worst logit difference {worst:e}");
        assert!(
            worst <= batch_tolerance(),
            "padding moved a logit by {worst}"
        );
    }
}

/// The forward pass's fusions ([`Fusions`]) change no logit beyond their stated bounds: SmolLM2,
/// and Gemma 3 (norms after the projections, a scaled embedding, per-head norms), over a prefill
/// of three sequences and five decode steps, each model loaded for this test (the switches are the
/// model's), with the decode graphs captured again after each switch, each fusion alone, then all.
/// - `QUARRY_ROPE_STORE` (llama/fused.rs `RopeStore`): RoPE writes the keys and values into the
///   pools itself; its kernel writes what `rope_qk` and `store_rows` write, bit for bit
///   (quarry-cuda-emu's test and the GPU unit test): equal on the CPU (where the op runs the two
///   ops), within the batch tolerance on a GPU.
/// - `QUARRY_ADD_NORM` (llama/fused.rs `AddNorm`): the add writes the next norm where its rows are
///   f32 (the quantized weights: every step on the CPU; tests/profile.rs counts its phase). The
///   kernel writes what the two it replaces write, bit for bit (quarry-cuda-emu's test and the
///   GPU unit test), so the logits are equal on the CPU and within the batch tolerance on a GPU.
/// - `QUARRY_GEMM_ADD` (linear.rs `GemmAdd`, a GPU's dense projections only): the output and down
///   projections' GEMMs add into the stream, their sums no longer rounded to f16 first (relative
///   2^-12 on average, at 60 adds a pass): some logit must move (else the path did not run), by
///   at most a quarter of a logit (a wrong product moves them by whole units). On the CPU nothing
///   changes.
/// - `QUARRY_SPLIT_COMBINE` (kernels/paged_attention.cu `combine_if_last`): split-K's combine in
///   the chunks' launch, the combine launch's arithmetic in its order: the same logits, bit for
///   bit, on a GPU; the CPU has no split-K.
#[test]
fn the_fusions_keep_the_logits() {
    fusions_check(&smollm2_path(), true);
}

/// Gemma 3's output norms come between each projection and its add: no GEMM adds into its stream.
#[test]
fn gemma3_the_fusions_keep_the_logits() {
    fusions_check(&gemma3_path(), false);
}

/// Every step's logits of [`prefill_then_decode`] with `fusions` set on `model`.
fn fused_logits(
    model: &quarry_model::Llama,
    fusions: Fusions,
    prompts: &[Vec<u32>],
    next: &[u32],
) -> Vec<Vec<f32>> {
    model.set_fusions(fusions);
    prefill_then_decode(model, prompts, next)
        .into_iter()
        .flatten()
        .collect()
}

/// The largest difference between two runs' logits, step by step.
fn worst_difference(x: &[Vec<f32>], y: &[Vec<f32>]) -> f32 {
    assert_eq!(x.len(), y.len());
    x.iter()
        .zip(y)
        .map(|(a, b)| max_diff(a, b))
        .fold(0f32, f32::max)
}

/// [`the_fusions_keep_the_logits`] for the model at `path`; `gemm_adds`: whether its
/// projections may add into the stream in their GEMMs (no output norms).
fn fusions_check(path: &std::path::Path, gemm_adds: bool) {
    let model = quarry_model::Llama::load_with(path, &device(), &options()).unwrap();
    let prompts = three_prompts();
    let next = text_tokens(5, 700);
    let run = |fusions: Fusions| fused_logits(&model, fusions, &prompts, &next);
    let worst = worst_difference;
    let none = Fusions::default();
    let plain = run(none);
    let what = path.display();
    // The fusions that write the values the unfused ops write.
    for (name, fusions) in [
        (
            "add and norm",
            Fusions {
                add_norm: true,
                ..none
            },
        ),
        (
            "RoPE and KV writes",
            Fusions {
                rope_store: true,
                ..none
            },
        ),
    ] {
        let worst = worst(&plain, &run(fusions));
        eprintln!("{what}: {name}, worst logit difference {worst:e}");
        assert!(worst <= batch_tolerance(), "{what}: {name} {worst}");
    }
    // Split-K's combine in the chunks' launch (a GPU's split steps: the decode steps here, on
    // `attention = auto`) does the combine launch's arithmetic in the same order: the same bits.
    let last_block = worst(
        &plain,
        &run(Fusions {
            split_combine: true,
            ..none
        }),
    );
    eprintln!("{what}: split-K's last-block combine, worst logit difference {last_block:e}");
    assert_eq!(last_block, 0.0, "{what}: the last-block combine");
    let gemm_add = worst(
        &plain,
        &run(Fusions {
            gemm_add: true,
            ..none
        }),
    );
    let all = Fusions {
        gemm_add: true,
        add_norm: true,
        rope_store: true,
        gemv_norm: true,
        split_combine: true,
        small_steps: false,
    };
    let both = worst(&plain, &run(all));
    model.set_fusions(none);
    eprintln!("{what}: GEMM add, worst logit difference {gemm_add:e} ({both:e} with all)");
    if device().is_cpu() || !gemm_adds {
        assert_eq!(gemm_add, 0.0, "{what}: no GEMM adds into the stream here");
        assert!(both <= batch_tolerance(), "{what}: all {both}");
    } else {
        assert!(gemm_add > 0.0, "{what}: the GEMM add did not run");
        assert!(
            gemm_add <= 0.25 && both <= 0.25,
            "{what}: GEMM add {gemm_add}, all {both}"
        );
    }
}

/// The 8-bit GEMV's fused epilogues (`q8_gemv`, linear/q8_rows.rs): with `gemm_add` (and
/// `rope_store`) on, in a step of at most 8 rows the output and down projections add into the
/// stream in the GEMV's own launch, the gate/up projection writes `act(gate) · up`, and the
/// Q/K/V projection rotates and writes the keys and values into the pools, where the plain GEMV
/// wrote sums for an add, a GLU or a RoPE launch after it; with `gemv_norm` too, steps of 1 or 2
/// rows normalize the stream in the same launch. SmolLM2 with every matrix in Q8_0, both forms held
/// (`dense_from_rows = 9`): the prefill (over 8 rows) multiplies the f16 copies, the two
/// sequences' decode steps (2 rows) run the GEMV. The fused forms do the unfused launches'
/// arithmetic (quarry-cuda-emu checks them bit for bit), so the logits agree within the batch
/// tolerance; and the GEMV's steps agree with the f16 copies' (`dense_from_rows = 1`) within a
/// quarter of a logit, as the GEMM add does (Q8_0's int8 values times an f16 scale, rounded to f16
/// for the copies). On a GPU only (a CPU multiplies Q8_0 with its own kernels): a CUDA build with
/// `QUARRY_TEST_DEVICE=cuda:0`, as infra/gpu-check.sh runs it.
#[cfg(feature = "cuda")]
#[test]
fn the_8_bit_gemv_s_epilogues_keep_the_logits() {
    assert!(
        !device().is_cpu(),
        "the 8-bit GEMV test runs on a GPU: QUARRY_TEST_DEVICE=cuda:0"
    );
    let mut o = options();
    (o.dense_from_rows, o.q8_gemv) = (9, true);
    let gemv = load_requantized(
        &smollm2_path(),
        "smollm2-gemv",
        candle_core::quantized::GgmlDType::Q8_0,
        &o,
    );
    o.dense_from_rows = 1;
    let copies = load_requantized(
        &smollm2_path(),
        "smollm2-copies",
        candle_core::quantized::GgmlDType::Q8_0,
        &o,
    );
    // Two sequences: decode steps of 2 rows, which the `_norm` forms take too.
    let (prompts, next) = (three_prompts()[..2].to_vec(), text_tokens(5, 700));
    let run = |model: &quarry_model::Llama, fused: bool, gemv_norm: bool| {
        let fusions = Fusions {
            gemm_add: fused,
            rope_store: fused,
            gemv_norm,
            ..Fusions::default()
        };
        fused_logits(model, fusions, &prompts, &next)
    };
    let worst = worst_difference;
    let (plain, epilogues, fused) = (
        run(&gemv, false, false),
        run(&gemv, true, false),
        run(&gemv, true, true),
    );
    let dense = run(&copies, false, false);
    let (epilogues, prologues) = (worst(&plain, &epilogues), worst(&plain, &fused));
    let against_copies = worst(&dense, &fused);
    eprintln!(
        "8-bit GEMV: fused epilogues against plain, worst logit difference {epilogues:e}, \
         with the norms' prologues {prologues:e}; against the f16 copies {against_copies:e}"
    );
    assert!(
        epilogues <= batch_tolerance(),
        "fused epilogues: {epilogues}"
    );
    assert!(
        prologues <= batch_tolerance(),
        "the norms' prologues: {prologues}"
    );
    assert!(
        against_copies > 0.0,
        "the decode steps did not run the GEMV"
    );
    assert!(
        against_copies <= 0.25,
        "against the f16 copies: {against_copies}"
    );
}

/// CUDA graphs (`QUARRY_CUDA_GRAPHS`, step_graph.rs): the same steps of three sequences, once
/// without graphs and once with them on a pool of their own, give the same logits.
/// - A prefill of 380 tokens (under the largest bucket: captured, padded to 384), then decode
///   steps (3 tokens, padded to 4) cross a context bound (256 positions): for each of the two
///   keys the first step captures and the rest replay.
/// - Then, on another pool and three other sequences, a prefill (190 tokens, captured) and
///   extend steps (2 tokens a sequence, every logit wanted: 6 tokens, padded to 8) alternating
///   with decode steps, as jump-forward makes them: each key is captured the first time it
///   comes and replayed after, though never twice in a row.
///
/// A replay runs the captured launches themselves, the attention planned for the bounds instead
/// of the step (the same arithmetic over the same positions, the padding's rows apart), so the
/// logits are expected equal; the bound leaves room for cuBLAS choosing another algorithm for
/// the padded shape. Needs a GPU (a CUDA build with `QUARRY_TEST_DEVICE=cuda:0`, as
/// infra/gpu-check.sh runs it).
#[cfg(feature = "cuda")]
#[test]
fn cuda_graphs_replay_the_steps_they_capture() {
    assert!(
        !device().is_cpu(),
        "the CUDA graph test runs on a GPU: QUARRY_TEST_DEVICE=cuda:0"
    );
    let model = smollm2();
    let prompts = [
        text_tokens(250, 0),
        text_tokens(100, 300),
        text_tokens(30, 500),
    ];
    let next = text_tokens(10, 700);
    let others = [
        text_tokens(100, 300),
        text_tokens(30, 500),
        text_tokens(60, 900),
    ];
    let extend = text_tokens(2 * 6, 800);
    let run = |graphs: bool| -> Vec<Vec<f32>> {
        model.set_cuda_graphs(graphs);
        let mut rows: Vec<Vec<f32>> = prefill_then_decode(model, &prompts, &next)
            .into_iter()
            .flatten()
            .collect();
        // Extends and decodes in turn on a pool of their own, after a prefill.
        let mut pool = pool_for(model, 16, 3 * 8, KvLayout::Tensor);
        let prompts = &others;
        let tables = tables(&mut pool, 3, 8);
        let mut len: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let mut out = Logits::new();
        let prefill: Vec<SeqInput> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqInput::new(p, 0, t))
            .collect();
        model.forward(&prefill, &mut pool, &mut out).unwrap();
        for i in 0..6 {
            let n = if i % 2 == 0 { 2 } else { 1 };
            let tokens = &extend[2 * i..2 * i + n];
            let batch: Vec<SeqInput> = tables
                .iter()
                .zip(&len)
                .map(|(t, &l)| SeqInput::new(tokens, l, t).with_all_logits())
                .collect();
            model.forward(&batch, &mut pool, &mut out).unwrap();
            for s in 0..3 {
                rows.extend(out.positions(s).map(<[f32]>::to_vec));
            }
            for l in len.iter_mut() {
                *l += n;
            }
        }
        rows
    };
    let before = model.cuda_graphs();
    let eager = run(false);
    let after_eager = model.cuda_graphs();
    let graphed = run(true);
    let after = model.cuda_graphs();
    model.set_cuda_graphs(model.options().cuda_graphs);
    assert_eq!(after.failed, None, "a capture failed");
    let (off, on) = (after_eager.since(&before), after.since(&after_eager));
    // Without graphs: 2 prefills, 10 decodes, 6 alternating steps, every one eager.
    assert_eq!(
        (off.captured, off.replayed, off.eager),
        (0, 0, 18),
        "{off:?}"
    );
    // With them: the first prefill (captured); contexts 251..=256 (a capture, 5 replays),
    // 257..=260 (a capture, 3 replays); the second pool's prefill (captured), then its extends
    // and decodes in turn (each key: a capture, 2 replays). Nothing runs without a graph.
    assert_eq!(on.captured, 1 + 2 + 1 + 2, "{on:?}");
    assert_eq!(on.replayed, 5 + 3 + 2 + 2, "{on:?}");
    assert_eq!(on.eager, 0, "{on:?}");
    assert!(
        on.padded_tokens > 0 && on.graphs >= 6 && on.bytes > 0,
        "{on:?}"
    );
    eprintln!(
        "CUDA graphs: {} graphs hold {} bytes ({} bytes a graph on average)",
        on.graphs,
        on.bytes,
        on.bytes / on.graphs
    );
    let mut worst = 0f32;
    let mut differ = 0;
    assert_eq!(eager.len(), graphed.len());
    for (e, g) in eager.iter().zip(&graphed) {
        worst = worst.max(max_diff(e, g));
        differ += e
            .iter()
            .zip(g)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
    }
    eprintln!("CUDA graphs: worst logit difference {worst:e}, {differ} logits differ");
    assert!(worst <= batch_tolerance(), "worst logit difference {worst}");
}
