//! `QUARRY_PROFILE`'s phases over real forward passes of SmolLM2 on the tensor layout: every
//! layer's phases are marked once per layer and pass, the pass's own once per pass, and the
//! logits are those of a pass without profiling; the totals are split by pass kind. Its own test binary: the totals are
//! process-wide, and no other test may run forward passes beside it.

mod common;

use common::*;
use quarry_model::profile::PassKind;
use quarry_model::{profile, Fusions, KvLayout, Logits, SeqInput};

#[test]
fn profiled_passes_mark_every_phase_once_per_layer_and_keep_their_logits() {
    let model = smollm2();
    // No fusions to begin with (a GPU's default takes two on small steps).
    model.set_fusions(Fusions::default());
    let layers = model.config().block_count as u64;
    let tokens: Vec<u32> = (1..=12).collect();
    let run = |on: bool| {
        profile::set_enabled(on);
        let mut pool = pool(16, 2, KvLayout::Tensor);
        let mut pages = Vec::new();
        assert!(pool.alloc_into(1, &mut pages));
        let mut out = Logits::new();
        let mut last = Vec::new();
        for (start, end) in [(0, 10), (10, 11), (11, 12)] {
            let batch = [SeqInput::new(&tokens[start..end], start, &pages)];
            model.forward(&batch, &mut pool, &mut out).unwrap();
            last.extend_from_slice(out.last(0));
        }
        last
    };
    let plain = run(false);
    assert!(profile::take().is_empty(), "nothing recorded while off");
    let profiled = run(true);
    same_logits(&profiled, &plain, "profiling changes no logit");
    let kinds = profile::take();
    // One prefill of 10 tokens, then two decode steps: a total per kind, in the order they ran.
    let split: Vec<_> = kinds.iter().map(|k| (k.pass, k.passes, k.tokens)).collect();
    assert_eq!(
        split,
        [(PassKind::MultiToken, 1, 10), (PassKind::Decode, 2, 2)]
    );
    for kind in &kinds {
        assert_eq!(
            calls_of(&kind.phases, "set-up and embedding"),
            kind.passes,
            "{:?}: a pass's own phase once a pass of its kind",
            kind.pass
        );
    }
    let calls = |name: &str| total_calls(&kinds, name);
    let passes = 3;
    for per_layer in [
        "Q/K/V projection",
        "RoPE",
        "KV writes",
        "attention",
        "output projection",
        "gate/up projection",
        "GLU",
        "down projection",
    ] {
        assert_eq!(calls(per_layer), passes * layers, "{per_layer}");
    }
    // Two norms and two residual adds per layer.
    assert_eq!(calls("norms"), 2 * passes * layers);
    assert_eq!(calls("residual adds"), 2 * passes * layers);
    assert_eq!(calls("set-up and embedding"), passes);
    assert_eq!(calls("output norm and logits"), passes);
    assert!(
        kinds
            .iter()
            .flat_map(|k| &k.phases)
            .all(|p| p.seconds > 0.0),
        "{kinds:?}"
    );
    assert!(profile::take().is_empty(), "take clears the totals");

    // With the add-and-norm and RoPE-store fusions: RoPE with the KV writes once per layer; where
    // a pass's norms are f32 (the quantized weights: the CPU), the first layer's attention norm
    // alone, the last add alone, every other add with the norm after it. A GPU multiplies dense
    // f16 weights at every batch size, so its norms write f16 and the add-and-norm never runs
    // there (`Llama::fuses_add_norm` says which).
    let fusions = Fusions {
        add_norm: true,
        rope_store: true,
        ..Fusions::default()
    };
    model.set_fusions(fusions);
    let fused_passes = [10, 1, 1]
        .into_iter()
        .filter(|&t| model.fuses_add_norm(t))
        .count() as u64;
    assert_eq!(
        fused_passes == passes,
        device().is_cpu(),
        "every pass fuses on the CPU, none on a GPU's dense f16 weights"
    );
    let fused = run(true);
    model.set_fusions(Fusions::default());
    same_logits(&fused, &plain, "the fusions change no logit");
    let kinds = profile::take();
    let calls = |name: &str| total_calls(&kinds, name);
    let unfused = passes - fused_passes;
    assert_eq!(calls("norms"), fused_passes + 2 * layers * unfused);
    assert_eq!(calls("residual adds"), fused_passes + 2 * layers * unfused);
    assert_eq!(
        calls("residual adds and norms"),
        (2 * layers - 1) * fused_passes
    );
    assert_eq!(calls("RoPE and KV writes"), layers * passes);
    assert_eq!((calls("RoPE"), calls("KV writes")), (0, 0));
    profile::set_enabled(false);
}

/// The same logits: bit for bit on the CPU; on a GPU within the batch tolerance (0.1), since a pass
/// replayed from its CUDA graph plans its split-K attention (the default for steps of at most 16
/// tokens) for the graph's bounds and a profiled pass, which runs without one, for the step
/// itself: the chunks are summed in another order.
fn same_logits(a: &[f32], b: &[f32], what: &str) {
    if device().is_cpu() {
        assert_eq!(a, b, "{what}");
        return;
    }
    assert_eq!(a.len(), b.len(), "{what}");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 0.1, "{what}: worst logit difference {worst}");
}

/// How many times `name` was marked over every pass kind (0 if never).
fn total_calls(kinds: &[profile::PassTotals], name: &str) -> u64 {
    kinds.iter().map(|k| calls_of(&k.phases, name)).sum()
}

/// How many times `phases` recorded `name` (0 if never).
fn calls_of(phases: &[profile::PhaseTime], name: &str) -> u64 {
    phases
        .iter()
        .find(|p| p.phase == name)
        .map_or(0, |p| p.calls)
}
