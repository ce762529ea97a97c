//! `ModelInfo` against llama.cpp's reading of the same GGUF headers (fixture made by
//! `tests/fixtures/gen_tokenizer_fixtures.py`). The files are found under `$QUARRY_ROOT` where it is
//! set ([`common::root`]), as on a GPU machine the test binaries are carried to.

mod common;

use common::root;
use quarry_model::ModelInfo;
use serde_json::Value;

fn check(model_file: &str, fixture: &str) {
    let path = root().join("models").join(model_file);
    assert!(
        path.exists(),
        "{} is missing: run `make setup` first",
        path.display()
    );
    let info = ModelInfo::from_gguf(&path).unwrap();
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/tokenizer").join(fixture)).unwrap(),
    )
    .unwrap();
    let facts = &fx["model_facts"];
    let md = &facts["metadata"];
    let arch = md["general.architecture"].as_str().unwrap();
    assert_eq!(info.architecture, arch);
    assert_eq!(info.name.as_deref(), md["general.name"].as_str());
    let int = |k: &str| {
        md[format!("{arch}.{k}")]
            .as_str()
            .map(|s| s.parse::<u64>().unwrap())
    };
    let float = |k: &str| {
        md[format!("{arch}.{k}")]
            .as_str()
            .map(|s| s.parse::<f64>().unwrap())
    };
    assert_eq!(info.context_length, int("context_length"));
    assert_eq!(info.embedding_length, int("embedding_length"));
    assert_eq!(info.block_count, int("block_count"));
    assert_eq!(info.feed_forward_length, int("feed_forward_length"));
    assert_eq!(info.head_count, int("attention.head_count"));
    assert_eq!(info.head_count_kv, int("attention.head_count_kv"));
    let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-6 * b.abs().max(1e-9),
        (None, None) => true,
        _ => false,
    };
    // llama.cpp prints floats with six decimals, so compare to that precision.
    assert!(close(info.rope_freq_base, float("rope.freq_base")));
    let eps_ref = float("attention.layer_norm_rms_epsilon").unwrap();
    assert!(
        (info.rms_norm_eps.unwrap() - eps_ref).abs() < 5e-7,
        "{:?} vs {eps_ref}",
        info.rms_norm_eps
    );
    assert_eq!(info.parameter_count, facts["n_params"].as_u64().unwrap());
}

#[test]
fn smollm2_header_matches_llama_cpp() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.cases.json");
}

#[test]
fn gemma3_header_matches_llama_cpp() {
    check("gemma-3-270m-q4_k_m.gguf", "gemma3.cases.json");
}

#[test]
fn not_a_gguf_file_is_a_typed_error() {
    let p = std::env::temp_dir().join(format!("quarry-model-test-{}.gguf", std::process::id()));
    std::fs::write(&p, b"GGUF but not really").unwrap();
    let err = ModelInfo::from_gguf(&p).unwrap_err();
    assert!(
        matches!(err, quarry_model::ModelError::Gguf { .. }),
        "{err}"
    );
    let missing = ModelInfo::from_gguf("/nonexistent/model.gguf").unwrap_err();
    assert!(
        matches!(missing, quarry_model::ModelError::Io { .. }),
        "{missing}"
    );
}
