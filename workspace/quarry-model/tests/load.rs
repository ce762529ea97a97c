//! Loading: the real model's configuration from GGUF metadata, and typed errors for files the
//! runtime cannot run.

mod common;

use candle_core::Device;
use common::*;
use quarry_model::{KvLayout, KvPool, Llama, ModelError, ModelInfo};

#[test]
fn smollm2_config_comes_from_metadata() {
    let c = smollm2().config();
    // The header as ModelInfo reads it (itself checked against llama.cpp in llama_cpp_header.rs).
    let info = ModelInfo::from_gguf(smollm2_path()).unwrap();
    assert_eq!(c.architecture, "llama");
    assert_eq!(Some(c.block_count as u64), info.block_count);
    assert_eq!(Some(c.embedding_length as u64), info.embedding_length);
    assert_eq!(Some(c.head_count as u64), info.head_count);
    assert_eq!(Some(c.head_count_kv as u64), info.head_count_kv);
    assert_eq!(Some(c.context_length as u64), info.context_length);
    assert_eq!(c.head_dim * c.head_count, c.embedding_length);
    assert_eq!(c.vocab_size, 49152);
    assert!((c.rope_freq_base as f64 - info.rope_freq_base.unwrap()).abs() < 1e-3);
}

#[test]
fn unsupported_and_broken_files_are_typed_errors() {
    let gemma = root().join("models/gemma-3-270m-q4_k_m.gguf");
    let e = Llama::load(&gemma, &Device::Cpu)
        .err()
        .expect("gemma3 is refused");
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { ref architecture, .. } if architecture == "gemma3"),
        "{e}"
    );
    let e = Llama::load("/nonexistent/m.gguf", &Device::Cpu)
        .err()
        .unwrap();
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
    // A truncated copy of the real file: the header is intact, the weights are not.
    let full = std::fs::read(smollm2_path()).unwrap();
    let cut = std::env::temp_dir().join(format!("quarry-load-{}.gguf", std::process::id()));
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let e = Llama::load(&cut, &Device::Cpu).err().unwrap();
    std::fs::remove_file(&cut).ok();
    assert!(matches!(e, ModelError::Truncated { .. }), "{e}");
}

#[test]
fn pool_rejects_bad_shapes_and_other_models() {
    let c = smollm2().config();
    assert!(KvPool::new(c, 0, 4, &Device::Cpu, None).is_err());
    assert!(KvPool::new(c, 16, 0, &Device::Cpu, None).is_err());
    // A pool made for another shape is refused by forward.
    let mut other = c.clone();
    other.block_count = 2;
    let mut pool = KvPool::new(&other, 16, 1, &Device::Cpu, Some(KvLayout::Host)).unwrap();
    let mut table = Vec::new();
    assert!(pool.alloc_into(1, &mut table));
    let e = smollm2()
        .forward(
            &[quarry_model::SeqInput::new(&[1], 0, &table)],
            &mut pool,
            &mut quarry_model::Logits::new(),
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::PoolMismatch { .. }), "{e}");
    // Page accounting.
    assert_eq!(pool.free_pages(), 0);
    assert!(pool.alloc().is_none());
    assert!(!pool.alloc_into(1, &mut table));
    pool.free(table[0]).unwrap();
    assert_eq!(pool.free_pages(), 1);
}
