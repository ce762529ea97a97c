use serde_json::json;

use super::*;
use crate::config::Activation;

fn llama() -> Value {
    json!({
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "vocab_size": 100,
    })
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn key_of(e: ModelError) -> String {
    match e {
        ModelError::InvalidKey { key, .. } | ModelError::MissingKey { key } => key,
        other => panic!("expected a key error, got {other}"),
    }
}

#[test]
fn a_config_reads_as_the_gguf_header_would() {
    let c = config_from_json(&llama(), 100).unwrap();
    assert_eq!(c.architecture, "llama");
    assert_eq!((c.head_count, c.head_count_kv, c.head_dim), (4, 2, 16));
    assert_eq!((c.block_count, c.feed_forward_length), (2, 128));
    assert_eq!((c.rope_freq_base, c.rope_freq_scale), (500_000.0, 1.0));
    // A checkpoint's queries and keys rotate head halves in every architecture.
    assert_eq!(c.rope_style, RopeStyle::Halves);
    assert!(!c.qk_norm && !c.qkv_bias && c.sliding_window.is_none());
    let q = config_from_json(&with(llama(), json!({"model_type": "qwen2"})), 100).unwrap();
    assert!(q.qkv_bias && !q.qk_norm);
    let q = config_from_json(
        &with(llama(), json!({"model_type": "qwen3", "head_dim": 32})),
        100,
    )
    .unwrap();
    assert!(q.qk_norm && !q.qkv_bias && q.head_dim == 32);
    assert_eq!(q.attention_scale, 1.0 / 32f32.sqrt());
}

#[test]
fn gemma3_reads_its_window_its_scale_and_its_layer_pattern() {
    let g = json!({
        "model_type": "gemma3_text",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 6,
        "max_position_embeddings": 2048, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "sliding_window": 8, "query_pre_attn_scalar": 64, "vocab_size": 100,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                        "sliding_attention", "sliding_attention", "full_attention"],
    });
    let c = config_from_json(&g, 100).unwrap();
    assert_eq!(c.architecture, "gemma3");
    assert_eq!(c.rope_freq_scale, 0.125);
    assert_eq!(c.attention_scale, 1.0 / 8.0);
    assert_eq!(c.embedding_scale, 8.0);
    let w = c.sliding_window.unwrap();
    assert_eq!(
        (w.size, w.pattern, w.rope_freq_base),
        (8, 6, Some(10_000.0))
    );
    assert!(c.qk_norm && c.post_norms && c.activation == Activation::GeluTanh);
    // A multimodal folder's text model.
    let mm = json!({"model_type": "gemma3", "text_config": g});
    assert_eq!(config_from_json(&mm, 100).unwrap(), c);
    let odd = with(
        g.clone(),
        json!({"layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                               "sliding_attention", "full_attention", "full_attention"]}),
    );
    assert_eq!(
        key_of(config_from_json(&odd, 100).unwrap_err()),
        "config.json: layer_types"
    );
}

#[test]
fn mistral_s_window_slides_in_every_layer_as_transformers_reads_it() {
    let window = |extra: Value| {
        config_from_json(&with(llama(), extra), 100)
            .unwrap()
            .sliding_window
    };
    // Mistral 7B v0.1; v0.2 and later write null; an absent key is transformers' default.
    assert_eq!(
        window(json!({"model_type": "mistral", "sliding_window": 4096})),
        Some(SlidingWindow::every_layer(4096))
    );
    assert_eq!(
        window(json!({"model_type": "mistral", "sliding_window": null})),
        None
    );
    assert_eq!(
        window(json!({"model_type": "mistral"})),
        Some(SlidingWindow::every_layer(4096))
    );
    let c = config_from_json(
        &with(
            llama(),
            json!({"model_type": "mistral", "sliding_window": 8}),
        ),
        100,
    )
    .unwrap();
    assert!((0..c.block_count).all(|l| c.window(l) == Some(8) && c.local_rope(l).is_none()));
    // transformers' llama and Qwen read no window unless `use_sliding_window` says so.
    assert_eq!(window(json!({"sliding_window": 4096})), None);
    assert_eq!(
        window(json!({"model_type": "qwen2", "sliding_window": 32768,
                      "use_sliding_window": false})),
        None
    );
}

#[test]
fn llama3_scaling_divides_low_frequencies_and_keeps_high_ones() {
    let scaled = with(
        llama(),
        json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    );
    let c = config_from_json(&scaled, 100).unwrap();
    let f = c.rope_freq_factors.clone().unwrap();
    assert_eq!(f.len(), 8);
    // Wavelength 2π·base^(2i/d) grows with i: kept below 16 positions, divided by 8 above 64.
    assert_eq!(f[0], 1.0);
    assert_eq!(f[7], 8.0);
    assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    assert!(f.iter().any(|x| *x > 1.0 && *x < 8.0), "{f:?}");
    for (i, x) in f.iter().enumerate() {
        let wavelen = 2.0 * std::f64::consts::PI * 500_000f64.powf(2.0 * i as f64 / 16.0);
        match wavelen {
            w if w < 16.0 => assert_eq!(*x, 1.0),
            w if w > 64.0 => assert_eq!(*x, 8.0),
            _ => assert!(*x > 1.0 && *x < 8.0),
        }
    }
    // recent transformers' spelling
    let params = with(
        llama(),
        json!({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "original_max_position_embeddings": 64}}),
    );
    let p = config_from_json(&params, 100).unwrap();
    assert_eq!(p.rope_freq_factors, c.rope_freq_factors);
}

/// YaRN as transformers reads it: its defaults (Python's `or`: a 0 is the default too), its
/// magnitude from `attention_factor`, else `mscale` over `mscale_all_dim`, and `truncate`.
#[test]
fn yarn_reads_with_transformers_defaults_and_overrides() {
    let yarn = |scaling: Value| {
        let c = config_from_json(&with(llama(), json!({"rope_scaling": scaling})), 100).unwrap();
        (c.rope_freq_scale, c.rope_yarn.expect("yarn read"))
    };
    let (scale, y) = yarn(json!({"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 512}));
    assert_eq!(scale, 0.25);
    let want = crate::Yarn {
        original_context: 512.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        ext_factor: 1.0,
        magnitude: 1.0 + 0.1 * 4f64.ln(),
        truncate: true,
    };
    assert_eq!(y, want);
    // The old spelling `type`, no original context (the model's own), betas of 0 and null.
    let (_, y) = yarn(json!({"type": "yarn", "factor": 4.0, "beta_fast": 0, "beta_slow": null}));
    assert_eq!(
        y,
        crate::Yarn {
            original_context: 2048.0,
            ..want
        }
    );
    let (_, y) = yarn(
        json!({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5,
                             "mscale": 2.0, "mscale_all_dim": 1.0, "truncate": false,
                             "beta_fast": 16, "beta_slow": 2}),
    );
    assert_eq!(
        (y.magnitude, y.truncate, y.beta_fast, y.beta_slow),
        (1.5, false, 16.0, 2.0)
    );
    let (_, y) = yarn(json!({"rope_type": "yarn", "factor": 4.0, "mscale": 2.0,
                             "mscale_all_dim": 1.0}));
    let m = |x: f64| 0.1 * x * 4f64.ln() + 1.0;
    assert_eq!(y.magnitude, m(2.0) / m(1.0));
}

#[test]
fn what_quarry_cannot_run_is_refused_by_name() {
    let cases = [
        (
            json!({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}),
            "config.json: rope_scaling.rope_type",
        ),
        (
            json!({"rope_scaling": {"rope_type": "yarn"}}),
            "config.json: rope_scaling.factor",
        ),
        (
            json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": -32}}),
            "config.json: rope_scaling.beta_fast",
        ),
        (
            json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": "no"}}),
            "config.json: rope_scaling.truncate",
        ),
        (
            json!({"rope_scaling": {"rope_type": "linear"}}),
            "config.json: rope_scaling.factor",
        ),
        (
            json!({"num_key_value_heads": 3}),
            "config.json: num_key_value_heads",
        ),
        (json!({"vocab_size": 99}), "config.json: vocab_size"),
        (
            json!({"model_type": "mistral", "sliding_window": 0}),
            "config.json: sliding_window",
        ),
        (
            json!({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4096}),
            "config.json: use_sliding_window",
        ),
        (json!({"hidden_size": -1}), "config.json: hidden_size"),
        (
            json!({"num_hidden_layers": null}),
            "config.json: num_hidden_layers",
        ),
    ];
    for (extra, key) in cases {
        let e = config_from_json(&with(llama(), extra.clone()), 100).unwrap_err();
        assert_eq!(key_of(e), key, "{extra}");
    }
    let e = config_from_json(&with(llama(), json!({"model_type": "phi3"})), 100).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { .. }),
        "{e}"
    );
}

#[test]
fn tensor_names_follow_llama_cpp_s_converter() {
    let llama = |n: &str| hf_name("model.", false, n);
    assert_eq!(
        llama("token_embd.weight").unwrap(),
        "model.embed_tokens.weight"
    );
    assert_eq!(llama("output.weight").unwrap(), "lm_head.weight");
    assert_eq!(
        llama("blk.3.ffn_norm.weight").unwrap(),
        "model.layers.3.post_attention_layernorm.weight"
    );
    assert_eq!(
        llama("blk.0.attn_q.bias").unwrap(),
        "model.layers.0.self_attn.q_proj.bias"
    );
    assert_eq!(llama("rope_freqs.weight"), None);
    let gemma = |n: &str| hf_name("model.language_model.", true, n);
    assert_eq!(
        gemma("blk.1.ffn_norm.weight").unwrap(),
        "model.language_model.layers.1.pre_feedforward_layernorm.weight"
    );
    assert_eq!(
        gemma("blk.1.post_attention_norm.weight").unwrap(),
        "model.language_model.layers.1.post_attention_layernorm.weight"
    );
    assert_eq!(gemma("output.weight").unwrap(), "lm_head.weight");
}

/// A micro checkpoint written by the test itself in bf16, f16 and f32: the same values (bf16's,
/// which f16 and f32 hold exactly at this scale), so the three load into the same model and give
/// the same logits bit for bit; the f32 one split into two shards with an index.
#[test]
fn bf16_f16_and_f32_weights_and_shards_load_into_one_model() {
    use candle_core::Tensor;
    let config = json!({
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "max_position_embeddings": 256, "vocab_size": 96, "tie_word_embeddings": true,
    });
    let c = config_from_json(&config, 96).unwrap();
    let mut tensors = std::collections::HashMap::new();
    for (gguf, dims) in crate::weights::tensor_list(&c, true) {
        let n: usize = dims.iter().product();
        // Values with few mantissa bits (multiples of 1/256 below 1/4) are exact in all three.
        let values: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 127) as f32 - 63.0) / 256.0)
            .collect();
        let t = Tensor::from_vec(values, dims, &Device::Cpu).unwrap();
        tensors.insert(hf_name("model.", false, &gguf).unwrap(), t);
    }
    let logits: Vec<Vec<f32>> = [DType::BF16, DType::F16, DType::F32]
        .into_iter()
        .map(|dtype| {
            let dir =
                std::env::temp_dir().join(format!("quarry-ckpt-{dtype:?}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
            let cast: Vec<(String, Tensor)> = tensors
                .iter()
                .map(|(k, v)| (k.clone(), v.to_dtype(dtype).unwrap()))
                .collect();
            if dtype == DType::F32 {
                let (a, b) = cast.split_at(cast.len() / 2);
                let mut map = serde_json::Map::new();
                for (file, part) in [("one.safetensors", a), ("two.safetensors", b)] {
                    let part: std::collections::HashMap<_, _> = part.iter().cloned().collect();
                    candle_core::safetensors::save(&part, dir.join(file)).unwrap();
                    for k in part.keys() {
                        map.insert(k.clone(), file.into());
                    }
                }
                let index = json!({ "weight_map": map });
                std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
                    .unwrap();
            } else {
                let all: std::collections::HashMap<_, _> = cast.into_iter().collect();
                candle_core::safetensors::save(&all, dir.join("model.safetensors")).unwrap();
            }
            let model = crate::Llama::load(&dir, &Device::Cpu).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            let mut pool = crate::KvPool::new(model.config(), 16, 1, &Device::Cpu, None).unwrap();
            let mut table = Vec::new();
            assert!(pool.alloc_into(1, &mut table));
            let mut out = crate::Logits::new();
            let tokens = [3u32, 14, 15, 92];
            let seq = [crate::SeqInput::new(&tokens, 0, &table)];
            model.forward(&seq, &mut pool, &mut out).unwrap();
            out.last(0).to_vec()
        })
        .collect();
    assert!(logits[0].iter().all(|x| x.is_finite()) && logits[0].len() == 96);
    assert_eq!(logits[0], logits[1], "bf16 against f16");
    assert_eq!(logits[0], logits[2], "bf16 against f32 in shards");
}
