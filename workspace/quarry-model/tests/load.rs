//! Loading: the real model's configuration from GGUF metadata, and typed errors for files the
//! runtime cannot run.

mod common;

use candle_core::{DType, Device};
use common::*;
use quarry_model::{
    Activation, KvLayout, KvPool, Llama, LlamaConfig, ModelError, ModelInfo, RopeStyle,
};

/// The config's header fields against the header as ModelInfo reads it (itself checked against
/// llama.cpp in llama_cpp_header.rs).
fn assert_header_matches(c: &LlamaConfig, path: std::path::PathBuf, architecture: &str) {
    let info = ModelInfo::from_gguf(path).unwrap();
    assert_eq!(c.architecture, architecture);
    assert_eq!(Some(c.block_count as u64), info.block_count);
    assert_eq!(Some(c.embedding_length as u64), info.embedding_length);
    assert_eq!(Some(c.head_count as u64), info.head_count);
    assert_eq!(Some(c.head_count_kv as u64), info.head_count_kv);
    assert_eq!(Some(c.context_length as u64), info.context_length);
    // The file's RoPE base (Gemma's global layers).
    assert!((c.rope_freq_base as f64 - info.rope_freq_base.unwrap()).abs() < 1e-3);
}

#[test]
fn smollm2_config_comes_from_metadata() {
    let c = smollm2().config();
    assert_header_matches(c, smollm2_path(), "llama");
    assert_eq!(c.head_dim * c.head_count, c.embedding_length);
    assert_eq!(c.vocab_size, 49152);
    // None of the switches Gemma 3 and Qwen2.5 flip (each model's test reads its own file alone,
    // so that a GPU machine carrying one model runs that model's tests).
    assert_eq!(
        (c.rope_style, c.activation),
        (RopeStyle::Interleaved, Activation::Silu)
    );
    assert!(!c.qk_norm && !c.post_norms && c.sliding_window.is_none() && !c.qkv_bias);
    assert_eq!(c.embedding_scale, 1.0);
}

/// Gemma 3: the llama switches it flips, from its metadata (llama.cpp's choices where the file
/// says nothing: five local layers to one global, local RoPE base 10,000).
#[test]
fn gemma3_config_comes_from_metadata() {
    let c = gemma3().config();
    assert_header_matches(c, gemma3_path(), "gemma3");
    assert_eq!(c.vocab_size, 262_144);
    assert_eq!(c.rope_style, RopeStyle::Halves);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert!(c.qk_norm && c.post_norms);
    assert_eq!(c.embedding_scale, (c.embedding_length as f32).sqrt());
    assert_eq!(c.attention_scale, 1.0 / (c.head_dim as f32).sqrt());
    let window = c.sliding_window.expect("gemma3 has a sliding window");
    let global: Vec<usize> = (0..c.block_count)
        .filter(|&l| c.window(l).is_none())
        .collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(c.window(0), Some(window.size));
    assert_eq!(c.rope_base(0), 10_000.0);
    assert_eq!(c.rope_base(5), c.rope_freq_base);
    assert!(!c.qkv_bias);
}

/// A GGUF of another architecture is refused by name, listing what is supported.
#[test]
fn unsupported_and_broken_files_are_typed_errors() {
    use candle_core::quantized::gguf_file;
    let other = std::env::temp_dir().join(format!("quarry-mamba-{}.gguf", std::process::id()));
    let arch = gguf_file::Value::String("mamba".into());
    let mut f = std::fs::File::create(&other).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch)], &[]).unwrap();
    drop(f);
    let e = Llama::load(&other, &Device::Cpu)
        .err()
        .expect("mamba is refused");
    std::fs::remove_file(&other).ok();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { ref architecture, ref supported } if architecture == "mamba" && supported.contains("qwen2")),
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

/// Qwen2.5's switches come from its architecture and metadata, as llama.cpp reads them.
#[test]
fn qwen25_config_comes_from_its_metadata() {
    let c = qwen25().config();
    assert_eq!(c.architecture, "qwen2");
    assert_eq!(
        (c.block_count, c.head_count, c.head_count_kv, c.head_dim),
        (24, 14, 2, 64)
    );
    assert_eq!(c.vocab_size, 151_936);
    assert_eq!(c.rope_freq_base, 1_000_000.0);
    assert_eq!(c.rope_style, RopeStyle::Halves);
    assert_eq!(c.activation, Activation::Silu);
    assert!(c.qkv_bias);
    assert!(!c.qk_norm && !c.post_norms && c.sliding_window.is_none());
}

/// What a GPU's free memory is said to hold is what a pool can be asked for there: the pages it
/// hands out and its scratch page fit in the room, and one page more would not (on 2026-11-30
/// the whole room was offered, and the scratch page made every `quarry generate` on an H200 ask
/// for one position more than fitted).
#[test]
fn a_pool_of_the_positions_a_room_holds_fits_it_with_its_scratch_page() {
    let c = smollm2().config();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let per_token = KvPool::bytes_per_token(c, dtype);
        for page_size in [1, 16] {
            let per_page = KvPool::bytes_per_page(c, page_size, dtype);
            for room in [
                0,
                per_page - 1,
                per_page,
                2 * per_page,
                5_824_287 * per_token + 7,
            ] {
                let positions = KvPool::positions_in(room, c, dtype, page_size);
                assert_eq!(positions % page_size, 0, "whole pages");
                let pages = positions / page_size;
                if positions > 0 {
                    let slots = (pages + 1) * page_size;
                    assert!(slots * per_token <= room, "{dtype:?}, pages of {page_size}, room {room}: {positions} positions and the scratch page need {} bytes", slots * per_token);
                }
                assert!(
                    (pages + 2) * per_page > room,
                    "{dtype:?}, pages of {page_size}, room {room}: a page more than {positions} positions would fit"
                );
            }
        }
    }
}
