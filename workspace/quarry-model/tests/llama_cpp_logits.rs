//! quarry's SmolLM2 forward pass against llama.cpp's on the same weights (fixtures written by
//! `tests/fixtures/gen_model_fixtures.py`), twice:
//!
//! **F32 weights** (the Q4_1 file with every tensor dequantized to F32, on both sides). Neither side
//! rounds activations, so this sees the forward pass itself — RoPE, RMS norms, grouped-query
//! attention, SwiGLU, tied embeddings — at float precision, and holds it to the bar: top-1
//! agreement on at least 99% of positions, log-softmax within `F32_LOGPROB_MAX_TOL`, greedy
//! continuations identical.
//!
//! **Q4_1 weights as stored.** Both sides quantize activations to 8 bits per 32-block before every
//! Q4_1 and Q8_0 matmul, and quarry does that bit for bit as llama.cpp does, and computes the same
//! exact integer block sums; what remains is float summation order in the matmuls (quarry adds
//! whole scaled blocks, llama.cpp eight lanes of partial blocks), attention, norms and `exp`. That is enough to flip 8-bit roundings, and a
//! flipped rounding in one of 30 layers moves the logits by hundredths to tenths of a nat, so two
//! correct implementations disagree at a few percent of near-tied positions:
//! - llama.cpp against itself with its default f16 KV cache: top-1 agreement about 96.5% (recorded
//!   in the fixture);
//! - quarry's two attention kernels (host and tensor layouts, which differ only in summation order)
//!   against each other on the first 200 positions of each prompt: 96.7% (measured 2026-11-22).
//!
//! So the Q4_1 checks, with their tolerances, are:
//! - top-1 agreement at least llama.cpp's own f16-vs-f32 agreement (less one point of slack for
//!   which near-ties happen to flip), and complete wherever the reference's top-2 gap is at least
//!   `GAP_TOL` nats (a clear choice);
//! - log-softmax of the reference top-20 within `LOGPROB_MEDIAN_TOL` at the median,
//!   `LOGPROB_P99_TOL` at the 99th percentile and `LOGPROB_MAX_TOL` at worst (measured 2026-11-23
//!   with the interleaved matmul kernel: 0.082, 0.46 and 1.37 nats; 2026-11-22 with the previous
//!   one: 0.079, 0.46 and 1.06; top-1 agreement 96.8% and 97.0%).
//!
//! `GAP_TOL` is `LOGPROB_P99_TOL`: a choice counts as clear when its gap exceeds the error accepted
//! on a single log-prob at the 99th percentile (two log-probs off in opposite directions by less
//! than that can still swap, so this is the tighter of the consistent choices). It was 0.5 until 2026-11-23, when the interleaved kernel
//! picked llama.cpp's third token at `json@15`, where its top-2 gap is 0.51 and its top-1-to-3 gap
//! 0.74. Both kernels are 0.43 nats off llama.cpp on that third token there; the previous one kept
//! llama.cpp's choice by 0.07 nats of its own, so the flip is a near-tie of quarry's, not a
//! regression.
//! - greedy continuations identical, or leaving llama.cpp's only at a step whose top-2 gap is below
//!   `GAP_TOL`.
//!
//! **On a GPU** (`QUARRY_TEST_DEVICE=cuda:0`) quarry does not repeat llama.cpp's CPU arithmetic:
//! it multiplies the weights dequantized to f16, with f16 activations and f32 sums (no 8-bit
//! activations), and keeps its KV pages in f16. That computes the F32 fixture's model (the same
//! weights, dequantized) with three 16-bit roundings, so on a GPU SmolLM2 Q4_1 is held to the F32
//! fixture within llama.cpp's own spread there under one such rounding (its f16 KV cache on the
//! F32 weights, recorded in the fixture: median 0.0012, p99 0.0105, worst 0.035 nats), with
//! slack for three roundings where the yardstick has one (`GPU_SLACK`, set from an H100 run); a
//! greedy step may leave llama.cpp's where its top-2 gap is below twice that spread's 99th
//! percentile (`greedy_gap_tol`). The F32 copies keep the F32 bar, with F32 pages
//! (`common::pool_for`). On an H100 (2026-11-26, when steps under 32 rows
//! still used candle's quantized kernels) SmolLM2 Q4_1 gave top-1 96.4%, median 0.074, p99 0.58
//! and worst 2.65 nats against the CPU's Q4_1 fixture, outside llama.cpp's own spread there
//! (0.081, 0.46, 1.06), which is why the GPU is not compared with that fixture; the F32 copy on
//! f16 pages gave median 0.001, p99 0.0085, worst 0.038, llama.cpp's own f16-KV spread.

mod common;

use common::*;
use quarry_model::{argmax, KvLayout, Llama, Logits, PageId, SeqInput};

/// Prompt tokens per forward call in [`Comparison::run`].
const CHUNK: usize = 256;

const LOGPROB_MEDIAN_TOL: f64 = 0.15;
const LOGPROB_P99_TOL: f64 = 0.75;
const GAP_TOL: f64 = LOGPROB_P99_TOL;
const LOGPROB_MAX_TOL: f64 = 1.5;

/// F32 weights: the worst log-softmax difference on the reference top-20, and the top-2 gap below
/// which a greedy step may differ (float summation order alone).
const F32_LOGPROB_MAX_TOL: f64 = 0.005;
const F32_GAP_TOL: f64 = 0.01;

/// Gemma 3 with F32 weights. Measured 2026-11-23: top-1 100%, every greedy token identical,
/// log-softmax difference median 0.0008, p99 0.006, max 0.025 (SmolLM2: 0.0005 at worst). Part of
/// the gap is llama.cpp's GELU, which it looks up in an f16 table (input and output rounded to
/// f16): computing GELU that way here brings the median to 0.0006 and p99 to 0.005, but not the
/// worst. The rest is at the first positions of a prompt, where Gemma's activations are largest.
const GEMMA_F32_LOGPROB_MAX_TOL: f64 = 0.05;
const GEMMA_F32_GAP_TOL: f64 = 0.05;

/// quarry's prompt logits against one fixture.
struct Comparison {
    positions: usize,
    top1_same: usize,
    /// Positions where llama.cpp's default (f16) KV cache gives its f32 top-1 (Q4_1 fixture only).
    f16_same: usize,
    /// Positions where quarry's top-1 differs although the reference's top-2 gap is at least
    /// `gap_tol`.
    clear_misses: Vec<String>,
    /// |log-softmax difference| over every reference top-20 entry, sorted.
    diffs: Vec<f64>,
    long_seen: bool,
}

impl Comparison {
    fn run(model: &Llama, fx: &serde_json::Value, gap_tol: f64) -> Self {
        Self::run_on(model, fx, gap_tol, KvLayout::Host)
    }

    fn run_on(model: &Llama, fx: &serde_json::Value, gap_tol: f64, layout: KvLayout) -> Self {
        let mut c = Comparison {
            positions: 0,
            top1_same: 0,
            f16_same: 0,
            clear_misses: Vec::new(),
            diffs: Vec::new(),
            long_seen: false,
        };
        for case in fx["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let tokens = ids(&case["tokens"]);
            c.long_seen |= tokens.len() > 1000;
            let f16_top1 = case.get("f16_kv_top1").map(ids);
            let mut case_worst = 0f64;
            // The prompt goes in as a prefill and extends of CHUNK tokens, so that a long prompt
            // never holds every position's logits (262,144 each for Gemma) at once.
            let mut pool = pool_for(model, 16, tokens.len().div_ceil(16), layout);
            let mut table: Vec<PageId> = Vec::new();
            assert!(pool.alloc_into(pool.num_pages(), &mut table));
            let mut out = Logits::new();
            for start in (0..tokens.len()).step_by(CHUNK) {
                let chunk = &tokens[start..(start + CHUNK).min(tokens.len())];
                model
                    .forward(
                        &[SeqInput::new(chunk, start, &table).with_all_logits()],
                        &mut pool,
                        &mut out,
                    )
                    .unwrap();
                for (i, row) in out.positions(0).enumerate() {
                    let pos = start + i;
                    let ref_ids = ids(&case["top_ids"][pos]);
                    let ref_logits: Vec<f64> = case["top_logits"][pos]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap())
                        .collect();
                    let ref_lse = case["lse"][pos].as_f64().unwrap();
                    let lse = log_sum_exp(row);
                    c.positions += 1;
                    if let Some(f16) = &f16_top1 {
                        c.f16_same += (f16[pos] == ref_ids[0]) as usize;
                    }
                    if argmax(row) == Some(ref_ids[0]) {
                        c.top1_same += 1;
                    } else if ref_logits[0] - ref_logits[1] >= gap_tol {
                        c.clear_misses.push(format!("{name}@{pos}"));
                    }
                    for (&id, &l) in ref_ids.iter().zip(&ref_logits) {
                        let d = (row[id as usize] as f64 - lse - (l - ref_lse)).abs();
                        case_worst = case_worst.max(d);
                        c.diffs.push(d);
                    }
                }
            }
            eprintln!(
                "{name}: {} positions, worst log-softmax difference {case_worst:.4}",
                tokens.len()
            );
        }
        c.diffs.sort_by(f64::total_cmp);
        eprintln!(
            "top-1 agreement {}/{} = {:.4}; log-softmax difference median {:.5}, p99 {:.5}, max {:.5}",
            c.top1_same,
            c.positions,
            c.agreement(),
            c.quantile(0.5),
            c.quantile(0.99),
            c.quantile(1.0)
        );
        assert!(
            c.long_seen,
            "the fixture must hold a prompt over 1,000 tokens"
        );
        c
    }

    fn agreement(&self) -> f64 {
        self.top1_same as f64 / self.positions as f64
    }

    fn quantile(&self, p: f64) -> f64 {
        self.diffs[((self.diffs.len() - 1) as f64 * p) as usize]
    }
}

impl Comparison {
    /// The quantized-weights top-1 checks: agreement at least llama.cpp's with itself under f16 KV
    /// (`f16_agreement`) less one point of slack (which near-ties flip is chance, and 1% of
    /// 1,236 positions is 12 of them), and complete where the reference gap is at least `GAP_TOL`.
    fn assert_quantized_top1(&self, f16_agreement: f64) {
        assert!(
            self.agreement() >= f16_agreement - 0.01,
            "top-1 agreement {} is below llama.cpp's own {f16_agreement}",
            self.agreement()
        );
        assert!(
            self.clear_misses.is_empty(),
            "top-1 differs where the reference gap is >= {GAP_TOL}: {:?}",
            self.clear_misses
        );
    }

    /// The bar for F32 weights: top-1 agreement of at least 99%, complete wherever the
    /// reference gap is at least `gap_tol`, and log-softmax within `max_tol` everywhere.
    fn assert_f32_bar(&self, gap_tol: f64, max_tol: f64) {
        assert!(
            self.agreement() >= 0.99,
            "top-1 agreement {} is below 99%",
            self.agreement()
        );
        assert!(
            self.clear_misses.is_empty(),
            "top-1 differs where the reference gap is >= {gap_tol}: {:?}",
            self.clear_misses
        );
        assert!(
            self.quantile(1.0) <= max_tol,
            "worst log-softmax difference {}",
            self.quantile(1.0)
        );
    }
}

#[test]
fn f32_weights_prompt_logits_match_llama_cpp() {
    Comparison::run(smollm2_f32(), &fixture_f32(), F32_GAP_TOL)
        .assert_f32_bar(F32_GAP_TOL, F32_LOGPROB_MAX_TOL);
}

#[test]
fn prompt_logits_match_llama_cpp() {
    if !device().is_cpu() {
        // The F32 fixture's model in 16-bit arithmetic (module documentation).
        return assert_within_spread(smollm2(), "smollm2-f32.logits.json.gz", GPU_SLACK);
    }
    let c = Comparison::run(smollm2(), &fixture(), GAP_TOL);
    let f16_agreement = c.f16_same as f64 / c.positions as f64;
    eprintln!("llama.cpp f16 vs f32 KV top-1 agreement: {f16_agreement:.4}");
    c.assert_quantized_top1(f16_agreement);
    let checks = [
        ("median", 0.5, LOGPROB_MEDIAN_TOL),
        ("p99", 0.99, LOGPROB_P99_TOL),
        ("worst", 1.0, LOGPROB_MAX_TOL),
    ];
    for (what, p, tol) in checks {
        assert!(
            c.quantile(p) <= tol,
            "{what} log-softmax difference {} > {tol}",
            c.quantile(p)
        );
    }
}

/// Greedy decoding one token at a time after each fixture prompt: identical to llama.cpp's, or
/// leaving it only at a step whose reference top-2 gap is below `gap_tol`.
fn greedy_matches(model: &Llama, fx: &serde_json::Value, gap_tol: f64) {
    for case in fx["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["tokens"]);
        let want = ids(&case["greedy"]["tokens"]);
        let gaps: Vec<f64> = case["greedy"]["top2_gap"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        let pages = (prompt.len() + want.len()).div_ceil(16);
        let mut pool = pool_for(model, 16, pages, KvLayout::Host);
        let mut table: Vec<PageId> = Vec::new();
        assert!(pool.alloc_into(pool.num_pages(), &mut table));
        let mut out = Logits::new();
        model
            .forward(&[SeqInput::new(&prompt, 0, &table)], &mut pool, &mut out)
            .unwrap();
        let mut got = Vec::new();
        for step in 0..want.len() {
            let next = argmax(out.last(0)).unwrap();
            got.push(next);
            if next != want[step] {
                assert!(
                    gaps[step] < gap_tol,
                    "{name}: step {step} chose {next}, llama.cpp {} with a top-2 gap of {}",
                    want[step],
                    gaps[step]
                );
                eprintln!(
                    "{name}: diverges at step {step} where llama.cpp's top-2 gap is {}",
                    gaps[step]
                );
                break;
            }
            let pos = prompt.len() + step;
            model
                .forward(
                    &[SeqInput::new(&want[step..=step], pos, &table)],
                    &mut pool,
                    &mut out,
                )
                .unwrap();
        }
        eprintln!(
            "{name}: {} of {} greedy tokens identical",
            got.iter().zip(&want).take_while(|(a, b)| a == b).count(),
            want.len()
        );
    }
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    // On a GPU, against the F32 fixture's model (module documentation).
    let fx = match device().is_cpu() {
        true => fixture(),
        false => fixture_f32(),
    };
    greedy_matches(smollm2(), &fx, greedy_gap_tol(&fx));
}

#[test]
fn f32_weights_greedy_continuations_match_llama_cpp() {
    greedy_matches(smollm2_f32(), &fixture_f32(), F32_GAP_TOL);
}

// Gemma 3 270M (Q4_K_M: Q5_0, Q8_0, Q4_K and Q6_K weights), the same checks on its own fixtures:
// scaled embeddings, per-head query/key norms, RoPE over head halves, output norms, GeGLU, and
// sliding-window local layers (the long prompt is twice the 512-token window).

#[test]
fn gemma3_f32_weights_prompt_logits_match_llama_cpp() {
    Comparison::run(
        gemma3_f32(),
        &read_fixture("gemma3-f32.logits.json.gz"),
        GEMMA_F32_GAP_TOL,
    )
    .assert_f32_bar(GEMMA_F32_GAP_TOL, GEMMA_F32_LOGPROB_MAX_TOL);
}

/// The tensor layout (candle ops: the CUDA path) held to the same bar with F32 weights, where the
/// noise is small enough that its sliding window, norms and RoPE show: without its window, rows
/// past position 512 of the long prompt leave llama.cpp's.
#[test]
fn gemma3_f32_weights_tensor_layout_matches_llama_cpp() {
    Comparison::run_on(
        gemma3_f32(),
        &read_fixture("gemma3-f32.logits.json.gz"),
        GEMMA_F32_GAP_TOL,
        KvLayout::Tensor,
    )
    .assert_f32_bar(GEMMA_F32_GAP_TOL, GEMMA_F32_LOGPROB_MAX_TOL);
}

/// Gemma 3 Q4_K_M, against llama.cpp's own spread. Its fixture records the log-softmax that
/// llama.cpp's default f16 KV cache gives for the same top-20 ids, so the tolerances here are
/// llama.cpp's distance from itself under a change of rounding (measured 2026-11-23: top-1 95.9%,
/// median 0.106, p99 0.666, max 2.89 nats; this model is more sensitive than SmolLM2), with slack:
/// quarry's top-1 agreement at least that less one point, its median and p99 within 1.25 times,
/// its worst within 1.5 times.
#[test]
fn gemma3_prompt_logits_match_llama_cpp() {
    assert_within_llama_cpp_spread("gemma3", gemma3(), "gemma3.logits.json.gz");
}

/// llama.cpp's own log-softmax differences, its f16 against its f32 KV cache, over the fixture's
/// top-20 ids at every position, sorted.
fn own_spread(fx: &serde_json::Value) -> Vec<f64> {
    let mut own: Vec<f64> = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let rows = case["top_logits"].as_array().unwrap();
        for (pos, row) in rows.iter().enumerate() {
            let lse = case["lse"][pos].as_f64().unwrap();
            let f16 = case["f16_kv_top_logprobs"][pos].as_array().unwrap();
            for (l, f) in row.as_array().unwrap().iter().zip(f16) {
                own.push((l.as_f64().unwrap() - lse - f.as_f64().unwrap()).abs());
            }
        }
    }
    own.sort_by(f64::total_cmp);
    own
}

/// The top-2 gap below which a quantized model's greedy step may leave llama.cpp's: `GAP_TOL` on
/// the CPU; on a GPU, where the arithmetic is a change of rounding from the fixture's, twice the
/// 99th percentile of llama.cpp's own spread under one (two log-probs each moved that far in
/// opposite directions swap), and at least `F32_GAP_TOL`.
fn greedy_gap_tol(fx: &serde_json::Value) -> f64 {
    if device().is_cpu() {
        return GAP_TOL;
    }
    let own = own_spread(fx);
    F32_GAP_TOL.max(2.0 * own[((own.len() - 1) as f64 * 0.99) as usize])
}

/// A quantized model's logits against llama.cpp's, with tolerances taken from llama.cpp's own
/// distance from itself under its default f16 KV cache (recorded in the fixture): top-1 agreement
/// at least that less one point, median and p99 log-softmax difference within 1.25 times, the
/// worst within 1.5 times.
fn assert_within_llama_cpp_spread(name: &str, model: &Llama, fixture: &str) {
    eprintln!("{name}:");
    assert_within_spread(model, fixture, [1.25, 1.25, 1.5]);
}

/// A GPU's 16-bit arithmetic against the F32 fixture, in multiples of llama.cpp's own f16-KV
/// spread there (median, p99, worst). Three roundings where that yardstick has one, and the
/// weights' (every weight rounded to f16 once) moves the log-probs more than the KV cache's: on an
/// H100 (2026-11-26) SmolLM2 Q4_1 was 3.6×, 2.3× and 3.5× llama.cpp's own spread (median 0.0044,
/// p99 0.024, worst 0.12 nats) with top-1 agreement 99.92%, llama.cpp's own. The bars leave room
/// for another GPU's cuBLAS algorithms and still fail a real error (a wrong RoPE, norm or mask moves
/// the median by tenths of a nat, a hundred times llama.cpp's spread).
const GPU_SLACK: [f64; 3] = [5.0, 3.0, 5.0];

/// [`assert_within_llama_cpp_spread`] with `slack` times llama.cpp's own median, p99 and worst.
fn assert_within_spread(model: &Llama, fixture: &str, slack: [f64; 3]) {
    let fx = read_fixture(fixture);
    let c = Comparison::run(model, &fx, GAP_TOL);
    let f16_agreement = c.f16_same as f64 / c.positions as f64;
    let own = own_spread(&fx);
    let own_q = |p: f64| own[((own.len() - 1) as f64 * p) as usize];
    eprintln!(
        "{fixture}: llama.cpp f16 vs f32 KV: top-1 agreement {f16_agreement:.4}, log-softmax difference median {:.5}, p99 {:.5}, max {:.5}",
        own_q(0.5),
        own_q(0.99),
        own_q(1.0)
    );
    c.assert_quantized_top1(f16_agreement);
    for ((what, p), slack) in [("median", 0.5), ("p99", 0.99), ("worst", 1.0)]
        .into_iter()
        .zip(slack)
    {
        assert!(
            c.quantile(p) <= own_q(p) * slack,
            "{fixture}: {what} log-softmax difference {} > {slack} x llama.cpp's own {}",
            c.quantile(p),
            own_q(p)
        );
    }
}

#[test]
fn gemma3_greedy_continuations_match_llama_cpp() {
    let fx = read_fixture("gemma3.logits.json.gz");
    greedy_matches(gemma3(), &fx, greedy_gap_tol(&fx));
}

#[test]
fn gemma3_f32_weights_greedy_continuations_match_llama_cpp() {
    greedy_matches(
        gemma3_f32(),
        &read_fixture("gemma3-f32.logits.json.gz"),
        GEMMA_F32_GAP_TOL,
    );
}

// Qwen2.5-Coder 0.5B Instruct (Q4_K_M: Q5_0, Q8_0, Q4_K and Q6_K weights): biases on Q, K and V,
// RoPE over head halves, grouped queries (14 heads, 2 KV heads), tied output weights, 151,936 ids.

#[test]
fn qwen25_f32_weights_prompt_logits_match_llama_cpp() {
    Comparison::run(
        qwen25_f32(),
        &read_fixture("qwen25-f32.logits.json.gz"),
        F32_GAP_TOL,
    )
    .assert_f32_bar(F32_GAP_TOL, F32_LOGPROB_MAX_TOL);
}

#[test]
fn qwen25_f32_weights_tensor_layout_matches_llama_cpp() {
    Comparison::run_on(
        qwen25_f32(),
        &read_fixture("qwen25-f32.logits.json.gz"),
        F32_GAP_TOL,
        KvLayout::Tensor,
    )
    .assert_f32_bar(F32_GAP_TOL, F32_LOGPROB_MAX_TOL);
}

#[test]
fn qwen25_prompt_logits_match_llama_cpp() {
    assert_within_llama_cpp_spread("qwen25", qwen25(), "qwen25.logits.json.gz");
}

#[test]
fn qwen25_greedy_continuations_match_llama_cpp() {
    let fx = read_fixture("qwen25.logits.json.gz");
    greedy_matches(qwen25(), &fx, greedy_gap_tol(&fx));
}

#[test]
fn qwen25_f32_weights_greedy_continuations_match_llama_cpp() {
    greedy_matches(
        qwen25_f32(),
        &read_fixture("qwen25-f32.logits.json.gz"),
        F32_GAP_TOL,
    );
}

// The tiny random-weight models (tests/fixtures/tiny_models.py): the architectures and RoPE
// scalings no small real model on the registries has, on F32 weights, held to the F32 bar.
// `qwen3`: per-head Q/K norms, no Q/K/V bias, heads wider than embedding/heads; `llama3`: Llama
// 3.1's per-frequency RoPE factors (`rope_freqs.weight`) over 1,100 positions, 17 times the
// original context the factors were computed for, and an untied output; `gemma3`: linear RoPE
// scaling (factor 8) of the global layer, unscaled local layers with a window of 8; `mistral`:
// Mistral 7B v0.1's window (8 here) in every layer, against llama.cpp's logits on the same
// weights as its `granite_swa` (llama.cpp reads no window for a `llama`); `qwen3-yarn`: YaRN
// (factor 4 over an original context of 512, llama.cpp's defaults for the rest), as Qwen3's and
// Qwen2.5's long-context files write it.

#[test]
fn tiny_models_prompt_logits_match_llama_cpp() {
    for name in TINY {
        eprintln!("tiny-{name}:");
        let fx = read_fixture(&format!("tiny-{name}.logits.json.gz"));
        Comparison::run(tiny(name, &fx), &fx, F32_GAP_TOL)
            .assert_f32_bar(F32_GAP_TOL, F32_LOGPROB_MAX_TOL);
    }
}

/// The tensor layout (candle ops: the CUDA path's forward) on the same bar.
#[test]
fn tiny_models_tensor_layout_matches_llama_cpp() {
    for name in TINY {
        eprintln!("tiny-{name}:");
        let fx = read_fixture(&format!("tiny-{name}.logits.json.gz"));
        Comparison::run_on(tiny(name, &fx), &fx, F32_GAP_TOL, KvLayout::Tensor)
            .assert_f32_bar(F32_GAP_TOL, F32_LOGPROB_MAX_TOL);
    }
}

#[test]
fn tiny_models_greedy_continuations_match_llama_cpp() {
    for name in TINY {
        let fx = read_fixture(&format!("tiny-{name}.logits.json.gz"));
        greedy_matches(tiny(name, &fx), &fx, F32_GAP_TOL);
    }
}

/// Each tiny model's scaling is what the fixture tests: without it the logits leave llama.cpp's.
#[test]
fn tiny_models_need_their_rope_scaling_and_their_window() {
    let fx = read_fixture("tiny-llama3.logits.json.gz");
    let c = tiny("llama3", &fx).config();
    let factors = c
        .rope_freq_factors
        .as_ref()
        .expect("rope_freqs.weight read");
    assert!(factors.contains(&1.0) && factors.contains(&8.0));
    assert!(factors.iter().any(|f| *f > 1.0 && *f < 8.0), "{factors:?}");
    let fx = read_fixture("tiny-gemma3.logits.json.gz");
    let c = tiny("gemma3", &fx).config();
    assert_eq!(c.rope_freq_scale, 0.125);
    assert_eq!(
        c.sliding_window.and_then(|w| w.rope_freq_base),
        Some(10_000.0)
    );
    let fx = read_fixture("tiny-qwen3.logits.json.gz");
    let c = tiny("qwen3", &fx).config();
    assert!(c.qk_norm && !c.qkv_bias && c.head_dim * c.head_count > c.embedding_length);
}

/// The tiny YaRN model's scaling is what its fixture tests: its ramp reaches frequencies that keep
/// their value, mixed ones and interpolated ones, and the same weights read with linear scaling of
/// the same factor (the `yarn` type taken out of the header), or with YaRN's frequencies but
/// rotations of length 1, leave llama.cpp's logits far past the bar.
#[test]
fn tiny_yarn_needs_its_ramp_and_its_magnitude() {
    let fx = read_fixture("tiny-qwen3-yarn.logits.json.gz");
    let c = tiny("qwen3-yarn", &fx).config();
    let y = c.rope_yarn.expect("yarn read");
    assert_eq!((c.rope_freq_scale, y.original_context), (0.25, 512.0));
    let keep = y.extrapolation(c.head_dim, c.rope_freq_base);
    assert!(keep[0] == 1.0 && keep.contains(&0.0), "{keep:?}");
    assert!(keep.iter().any(|k| *k > 0.0 && *k < 1.0), "{keep:?}");
    let path = model_path("tiny/tiny-qwen3-yarn.gguf");
    let mut file = std::fs::File::open(&path).unwrap();
    let mut header = || {
        use std::io::Seek;
        file.rewind().unwrap();
        candle_core::quantized::gguf_file::Content::read(&mut file).unwrap()
    };
    let (mut linear, mut unit) = (header(), header());
    assert!(linear.metadata.remove("qwen3.rope.scaling.type").is_some());
    unit.metadata.insert(
        "qwen3.rope.scaling.yarn_attn_factor".into(),
        candle_core::quantized::gguf_file::Value::F32(1.0),
    );
    for (what, header) in [("linear scaling", linear), ("a magnitude of 1", unit)] {
        let m = Llama::from_content(&header, &mut file, &device(), &options()).unwrap();
        let off = Comparison::run(&m, &fx, F32_GAP_TOL);
        eprintln!(
            "with {what}: agreement {:.3}, worst {:.3}",
            off.agreement(),
            off.quantile(1.0)
        );
        assert!(
            off.quantile(1.0) > 100.0 * F32_LOGPROB_MAX_TOL,
            "{what} should leave llama.cpp's YaRN logits: agreement {}, worst {}",
            off.agreement(),
            off.quantile(1.0)
        );
    }
}

/// The tiny Mistral's window is what its fixture tests: in every layer, and without it (the same
/// weights, the window key taken out of the header) the logits leave llama.cpp's far past the bar.
#[test]
fn tiny_mistral_attends_over_its_window_in_every_layer() {
    let fx = read_fixture("tiny-mistral.logits.json.gz");
    let c = tiny("mistral", &fx).config();
    assert!((0..c.block_count).all(|l| c.window(l) == Some(8) && c.local_rope(l).is_none()));
    let path = model_path("tiny/tiny-mistral.gguf");
    let mut file = std::fs::File::open(&path).unwrap();
    let mut content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    assert!(content
        .metadata
        .remove("llama.attention.sliding_window")
        .is_some());
    let full = Llama::from_content(&content, &mut file, &device(), &options()).unwrap();
    assert!(full.config().sliding_window.is_none());
    let unwindowed = Comparison::run(&full, &fx, F32_GAP_TOL);
    assert!(
        unwindowed.agreement() < 0.9 && unwindowed.quantile(1.0) > 100.0 * F32_LOGPROB_MAX_TOL,
        "full attention should leave llama.cpp's windowed logits: agreement {}, worst {}",
        unwindowed.agreement(),
        unwindowed.quantile(1.0)
    );
}

// Hugging Face checkpoint folders built from the same GGUFs (tests/fixtures/checkpoints.py:
// safetensors, config.json, Q/K rows un-permuted, Gemma's norms as transformers holds them): the
// same models, so the same bars against the same fixtures. SmolLM2's F32 fixture is its Q4_1 file
// dequantized, which is what the checkpoint holds.

/// On a GPU (infra/gpu-check.sh builds SmolLM2's folder alone, in f16: the tiny models are not
/// carried) the f16 weights are held to the bar of the GGUF's f16 copies, against the same F32
/// fixture (module documentation); on a CPU every folder to the F32 bar.
#[test]
fn checkpoints_prompt_logits_match_llama_cpp() {
    if !device().is_cpu() {
        return assert_within_spread(
            checkpoint("smollm2"),
            "smollm2-f32.logits.json.gz",
            GPU_SLACK,
        );
    }
    for (name, fixture) in CHECKPOINTS {
        eprintln!("checkpoint {name}:");
        let gap = if name.contains("gemma") {
            GEMMA_F32_GAP_TOL
        } else {
            F32_GAP_TOL
        };
        Comparison::run(checkpoint(name), &read_fixture(fixture), gap)
            .assert_f32_bar(gap, F32_LOGPROB_MAX_TOL);
    }
}

#[test]
fn checkpoints_greedy_continuations_match_llama_cpp() {
    if !device().is_cpu() {
        let fx = fixture_f32();
        return greedy_matches(checkpoint("smollm2"), &fx, greedy_gap_tol(&fx));
    }
    for (name, fixture) in CHECKPOINTS {
        greedy_matches(checkpoint(name), &read_fixture(fixture), F32_GAP_TOL);
    }
}

/// A checkpoint's plain projections quantized to Q8_0 as they load (`cpu_weights=q8_0`, what a
/// CPU falls back to where f32 does not fit): SmolLM2's folder against its F32 fixture, held to
/// the distance llama.cpp's own quantized kernels keep from it on the same weights (its Q4_1
/// file, of which the F32 fixture's weights are the exact dequantization, so the two differ only
/// by the kernels' 8-bit activations): top-1 agreement at least that less one point; median, p99
/// and worst log-softmax difference within 1.5 times (Q8_0 rounds the weights once more, where
/// llama.cpp's file holds the fixture's values exactly). Measured (2026-11-28): 97.1% top-1,
/// median 0.086, p99 0.53, worst 1.51 nats against llama.cpp's 96.8%, 0.071, 0.44 and 1.43; a
/// wrong block layout or scale gives garbage, tenths of a nat at the median.
#[test]
fn checkpoint_quantized_to_q8_0_at_load_stays_as_near_as_llama_cpp_s_kernels() {
    if !device().is_cpu() {
        return;
    }
    let mut o = options();
    o.cpu_weights = quarry_model::CpuWeights::Q8_0;
    let m = Llama::load_with(model_path("checkpoints/smollm2"), &device(), &o).unwrap();
    let plan = m.host_weights().unwrap();
    // The table looked up stays f32: 39% of the f32 form here.
    assert!(
        plan.q8_0 && !plan.fell_back && plan.bytes < plan.footprint.f32 / 2,
        "{plan:?}"
    );
    let f32_fx = fixture_f32();
    let (agreement, spread) = kernels_spread(&f32_fx, &read_fixture("smollm2.logits.json.gz"));
    let q = |p: f64| spread[((spread.len() - 1) as f64 * p) as usize];
    let c = Comparison::run(&m, &f32_fx, GAP_TOL);
    eprintln!(
        "llama.cpp Q4_1 against F32: top-1 {agreement:.4}, median {:.4}, p99 {:.4}, worst {:.4}",
        q(0.5),
        q(0.99),
        q(1.0)
    );
    assert!(c.agreement() >= agreement - 0.01, "top-1 {}", c.agreement());
    for (p, slack) in [(0.5, 1.5), (0.99, 1.5), (1.0, 1.5)] {
        assert!(
            c.quantile(p) <= q(p) * slack,
            "quantile {p}: {} > {slack} x llama.cpp's {}",
            c.quantile(p),
            q(p)
        );
    }
}

/// llama.cpp's top-1 agreement between two fixtures of the same prompts, and its |log-softmax
/// difference| over the first's top ids that the second's top 20 hold too, sorted.
fn kernels_spread(a: &serde_json::Value, b: &serde_json::Value) -> (f64, Vec<f64>) {
    let (mut same, mut n, mut diffs) = (0usize, 0usize, Vec::new());
    let cases = a["cases"].as_array().unwrap().iter();
    for (ca, cb) in cases.zip(b["cases"].as_array().unwrap()) {
        assert_eq!(ca["tokens"], cb["tokens"], "the fixtures' prompts differ");
        for pos in 0..ca["top_ids"].as_array().unwrap().len() {
            let (ia, ib) = (ids(&ca["top_ids"][pos]), ids(&cb["top_ids"][pos]));
            let logits = |c: &serde_json::Value| -> Vec<f64> {
                let row = c["top_logits"][pos].as_array().unwrap();
                row.iter().map(|v| v.as_f64().unwrap()).collect()
            };
            let (la, lb) = (logits(ca), logits(cb));
            let (za, zb) = (
                ca["lse"][pos].as_f64().unwrap(),
                cb["lse"][pos].as_f64().unwrap(),
            );
            n += 1;
            same += usize::from(ia[0] == ib[0]);
            for (id, l) in ia.iter().zip(&la) {
                if let Some(j) = ib.iter().position(|x| x == id) {
                    diffs.push(((l - za) - (lb[j] - zb)).abs());
                }
            }
        }
    }
    diffs.sort_by(f64::total_cmp);
    (same as f64 / n as f64, diffs)
}

/// A checkpoint reads into the config of the GGUF it was built from, but for what a checkpoint
/// spells its own way: RoPE over head halves (its Q/K rows are not permuted), and Llama 3's
/// factors computed from `rope_scaling` rather than read from `rope_freqs.weight`.
#[test]
fn checkpoints_read_into_their_gguf_s_config() {
    for (name, fixture) in CHECKPOINTS {
        let fx = read_fixture(fixture);
        let gguf = match name.strip_prefix("tiny-") {
            Some(tiny_name) => tiny(tiny_name, &fx).config().clone(),
            None => smollm2().config().clone(),
        };
        let mut c = checkpoint(name).config().clone();
        assert_eq!(c.rope_style, quarry_model::RopeStyle::Halves, "{name}");
        c.rope_style = gguf.rope_style;
        if let (Some(got), Some(want)) = (&c.rope_freq_factors, &gguf.rope_freq_factors) {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w, "{name}: factor {g} against {w}");
            }
            c.rope_freq_factors = gguf.rope_freq_factors.clone();
        }
        assert_eq!(c, gguf, "{name}");
    }
}
