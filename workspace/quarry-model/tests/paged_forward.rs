//! Paged, batched forward equals single-sequence forward: mixed batches of prefills, extends and
//! decodes, page sizes 1 and 16, pages handed out in scrambled order, and a sequence that reads
//! another's pages for their shared prefix. Each KV layout is checked against its own
//! single-sequence, single-call forward, and the two layouts against each other.

mod common;

use common::*;
use quarry_model::{KvLayout, Logits, ModelError, PageId, SeqInput};

/// Real token ids: the fixture prompts' text, so the model sees natural input.
fn text_tokens(n: usize, offset: usize) -> Vec<u32> {
    let fx = fixture();
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

// Each layout computes a row exactly as it does for a sequence alone: the same kernels, in the same
// order, whatever else is in the batch and wherever the pages are.
#[test]
fn host_layout_page_16_equals_single_sequence() {
    check(16, KvLayout::Host, 0.0);
}

#[test]
fn host_layout_page_1_equals_single_sequence() {
    check(1, KvLayout::Host, 0.0);
}

#[test]
fn tensor_layout_page_16_equals_single_sequence() {
    check(16, KvLayout::Tensor, 0.0);
}

#[test]
fn tensor_layout_page_1_equals_single_sequence() {
    check(1, KvLayout::Tensor, 0.0);
}

/// The two attention implementations sum in different orders, and 8-bit activation quantization
/// in 30 layers amplifies that (see `llama_cpp_logits.rs`), so they are compared by distribution:
/// the host kernel against the independent tensor-op path.
#[test]
fn host_kernel_agrees_with_tensor_ops() {
    let tokens = text_tokens(300, 400);
    let host = prefill_all(&tokens, 16, KvLayout::Host);
    let tensor = prefill_all(&tokens, 16, KvLayout::Tensor);
    let mut diffs = Vec::new();
    let mut same_top1 = 0;
    for (h, t) in host.iter().zip(&tensor) {
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
        "host vs tensor: top-1 agreement {share:.3}, log-softmax difference median {median:.4}"
    );
    // Measured 2026-11-22: median 0.11 nats, top-1 97%; a masking or paging bug moves whole rows.
    assert!(median < 0.25, "median {median}");
    assert!(share >= 0.95, "top-1 agreement {share}");
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
