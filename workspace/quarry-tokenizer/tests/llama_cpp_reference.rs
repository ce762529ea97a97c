//! quarry's tokenizer against llama.cpp, on fixtures made by `tests/fixtures/gen_tokenizer_fixtures.py`.

use common::{checkpoint, fixture, ids, model, pieces};
use quarry_tokenizer::{ChatMessage, EncodeOptions, TokenKind, Tokenizer};
use serde_json::Value;

mod common;

/// A fixture case's text and `parse_special`, and quarry's ids for it (without BOS, as the
/// fixture script asks llama.cpp).
fn encode_case<'a>(tok: &Tokenizer, case: &'a Value) -> (&'a str, bool, Vec<u32>) {
    let text = case["text"].as_str().unwrap();
    let parse_special = case["parse_special"].as_bool().unwrap();
    let options = EncodeOptions {
        add_bos: false,
        parse_special,
    };
    (text, parse_special, tok.encode_with(text, options).unwrap())
}

/// "Hello" with the model's default BOS setting gets llama.cpp's ids.
fn assert_default_bos_matches(tok: &Tokenizer, fx: &Value) {
    let opts = EncodeOptions {
        add_bos: tok.add_bos_by_default(),
        parse_special: false,
    };
    assert_eq!(
        tok.encode_with("Hello", opts).unwrap(),
        ids(&fx["hello_with_default_bos"])
    );
}

/// Every fixture case whose ids differ from llama.cpp's, as printable lines.
fn id_mismatches(tok: &Tokenizer, fx: &Value) -> (usize, Vec<String>) {
    let cases = fx["cases"].as_array().unwrap();
    let mut bad = Vec::new();
    for case in cases {
        let (text, parse_special, got) = encode_case(tok, case);
        let want = ids(&case["ids"]);
        if got != want {
            bad.push(format!(
                "{text:?} (parse_special={parse_special}): llama.cpp {want:?}, quarry {got:?}"
            ));
        }
    }
    (cases.len(), bad)
}

#[test]
fn smollm2_ids_equal_llama_cpp_on_every_fixture_string() {
    let tok = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_ids_equal_llama_cpp(&tok, "smollm2.cases.json");
}

fn check_pieces(tok: &Tokenizer, fixture_name: &str, expected_len: usize) {
    check_pieces_except(tok, fixture_name, expected_len, |_| false);
}

/// [`check_pieces`] for every id but those `skip` names.
fn check_pieces_except(
    tok: &Tokenizer,
    fixture_name: &str,
    expected_len: usize,
    skip: impl Fn(u32) -> bool,
) {
    let want = pieces(fixture_name);
    assert_eq!(want.len(), expected_len);
    assert_eq!(tok.vocab_size(), expected_len);
    let bad: Vec<String> = (0..expected_len as u32)
        .filter(|&id| !skip(id))
        .filter(|&id| tok.token_bytes(id).unwrap() != want[id as usize].as_slice())
        .take(20)
        .map(|id| {
            format!(
                "{id}: llama.cpp {:?}, quarry {:?}",
                want[id as usize],
                tok.token_bytes(id).unwrap()
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "token bytes differ (first 20):\n{}",
        bad.join("\n")
    );
}

#[test]
fn smollm2_token_byte_table_equals_llama_cpp() {
    check_pieces(
        &model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "smollm2.pieces.txt.gz",
        49_152,
    );
}

#[test]
fn gemma3_token_byte_table_equals_llama_cpp() {
    check_pieces(
        &model("gemma-3-270m-q4_k_m.gguf"),
        "gemma3.pieces.txt.gz",
        262_144,
    );
}

/// Every fixture case and the default-BOS "Hello" encode as llama.cpp encoded them.
fn assert_ids_equal_llama_cpp(tok: &Tokenizer, fixture_name: &str) {
    let fx = fixture(fixture_name);
    let (n, bad) = id_mismatches(tok, &fx);
    assert!(n >= 600, "fixture too small: {n} cases");
    assert!(
        bad.is_empty(),
        "{} of {n} cases differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert_default_bos_matches(tok, &fx);
}

#[test]
fn gemma3_ids_equal_llama_cpp_on_every_fixture_string() {
    assert_ids_equal_llama_cpp(&model("gemma-3-270m-q4_k_m.gguf"), "gemma3.cases.json");
}

/// Qwen2.5 (GGUF pre-tokenizer `qwen2`: a split regex, then bytes), 151,936 ids.
const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

#[test]
fn qwen25_token_byte_table_equals_llama_cpp() {
    let tok = model(QWEN25);
    check_pieces(&tok, "qwen25.pieces.txt.gz", tok.vocab_size());
    assert_eq!(tok.vocab_size(), 151_936);
}

#[test]
fn qwen25_ids_equal_llama_cpp_on_every_fixture_string() {
    let tok = model(QWEN25);
    assert_eq!(tok.pre_tokenizer(), Some("qwen2"));
    assert_ids_equal_llama_cpp(&tok, "qwen25.cases.json");
}

#[test]
fn qwen25_chat_template_renders_like_llama_cpp_jinja2() {
    assert_chat_renders_like_llama_cpp(&model(QWEN25), "qwen25.chat.json");
}

#[test]
fn decoding_round_trips_every_fixture_string() {
    for (file, fx) in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.cases.json"),
        ("gemma-3-270m-q4_k_m.gguf", "gemma3.cases.json"),
        (QWEN25, "qwen25.cases.json"),
    ] {
        let tok = model(file);
        for case in fixture(fx)["cases"].as_array().unwrap() {
            let (text, _, ids) = encode_case(&tok, case);
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "{file}: {ids:?}");
            assert_eq!(tok.decode_bytes(&ids).unwrap(), text.as_bytes(), "{file}");
        }
    }
}

#[test]
fn smollm2_chat_template_renders_like_llama_cpp_jinja2() {
    assert_chat_renders_like_llama_cpp(
        &model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "smollm2.chat.json",
    );
}

/// Every conversation in the fixture renders as llama-cpp-python's Jinja2 rendered it.
fn assert_chat_renders_like_llama_cpp(tok: &Tokenizer, fixture_name: &str) {
    let fx = fixture(fixture_name);
    for r in fx["renders"].as_array().unwrap() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(r["messages"].clone()).unwrap();
        let add = r["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(
            tok.apply_chat_template(&msgs, add).unwrap(),
            r["text"].as_str().unwrap()
        );
    }
}

/// `tokenizer.json` loading: save the GGUF-built tokenizer with the `tokenizers` serializer, load it
/// back through [`Tokenizer::from_tokenizer_json`], and hold it to the same llama.cpp fixtures.
#[test]
fn tokenizer_json_round_trip_agrees_with_llama_cpp() {
    for (file, fx_name, pieces_name) in [
        (
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "smollm2.cases.json",
            "smollm2.pieces.txt.gz",
        ),
        (
            "gemma-3-270m-q4_k_m.gguf",
            "gemma3.cases.json",
            "gemma3.pieces.txt.gz",
        ),
        (QWEN25, "qwen25.cases.json", "qwen25.pieces.txt.gz"),
    ] {
        let gguf = model(file);
        let dir =
            std::env::temp_dir().join(format!("quarry-tokjson-{}-{file}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json_path = dir.join("tokenizer.json");
        gguf.inner().save(&json_path, false).unwrap();
        let name = |id: Option<u32>| id.and_then(|i| gguf.token_text(i));
        let config = serde_json::json!({
            "bos_token": name(gguf.special_tokens().bos),
            "eos_token": name(gguf.special_tokens().eos),
            "add_bos_token": gguf.add_bos_by_default(),
            "chat_template": gguf.chat_template().map(|t| t.source()),
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();

        let tok = Tokenizer::from_tokenizer_json(&json_path).unwrap();
        assert_eq!(tok.vocab_kind(), gguf.vocab_kind(), "{file}");
        assert_eq!(
            tok.special_tokens().bos,
            gguf.special_tokens().bos,
            "{file}"
        );
        assert_eq!(
            tok.special_tokens().eos,
            gguf.special_tokens().eos,
            "{file}"
        );
        assert_eq!(
            tok.add_bos_by_default(),
            gguf.add_bos_by_default(),
            "{file}"
        );
        let (n, bad) = id_mismatches(&tok, &fixture(fx_name));
        assert!(
            bad.is_empty(),
            "{file}: {} of {n} differ:\n{}",
            bad.len(),
            bad.join("\n")
        );
        // GGUF's unused ids carry no bytes in llama.cpp (Qwen2.5 pads its vocabulary to the
        // embedding's 151,936 rows with `[PAD…]` tokens). `tokenizer.json` has no such kind: the
        // serializer writes them as plain vocabulary entries, so a reload spells them as text, and
        // they are left out of this comparison. Qwen's own tokenizer.json has no such ids at all.
        let unused = |id: u32| gguf.token_table().kind(id) == Some(TokenKind::Unused);
        check_pieces_except(&tok, pieces_name, gguf.vocab_size(), unused);
        if let Some(t) = gguf.chat_template() {
            let msgs = [ChatMessage::new("user", "hi")];
            assert_eq!(
                tok.apply_chat_template(&msgs, true).unwrap(),
                t.render(&msgs, true).unwrap()
            );
            // transformers' named templates: the default one is the chat template.
            let mut named = config.clone();
            named["chat_template"] = serde_json::json!([
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": t.source()},
            ]);
            std::fs::write(dir.join("tokenizer_config.json"), named.to_string()).unwrap();
            let tok = Tokenizer::from_tokenizer_json(&json_path).unwrap();
            assert_eq!(
                tok.chat_template().map(|c| c.source()),
                Some(t.source()),
                "{file}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

// Checkpoint folders' tokenizers: `tokenizer.json` and `tokenizer_config.json` as transformers'
// own GGUF conversion writes them (tests/fixtures/checkpoints.py), `chat_template.jinja` and
// `generation_config.json` beside them, against llama.cpp's ids on the GGUF they were built from.
// (Gemma 3's is left out: transformers converts a GGUF's Gemma vocabulary into a Unigram model,
// where the Hub's tokenizer.json is BPE, so it is not the tokenizer a Gemma checkpoint ships.)

const CHECKPOINT_TOKENIZERS: [(&str, &str, &str); 2] = [
    ("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    ("tiny-qwen3", QWEN25, "qwen25"),
];

/// Every case gets llama.cpp's ids, but where a tokenizer.json means otherwise than the GGUF:
/// Qwen's applies Unicode NFC first (as the Hub's does; llama.cpp does not), and transformers'
/// converter does not mark `</s>` (a control token in the GGUF) special.
#[test]
fn checkpoint_tokenizers_give_llama_cpp_s_ids() {
    for (name, _, fx) in CHECKPOINT_TOKENIZERS {
        let mut fx = fixture(&format!("{fx}.cases.json"));
        let qwen = name.contains("qwen");
        let cases = fx["cases"].as_array_mut().unwrap();
        let before = cases.len();
        cases.retain(|c| {
            let text = c["text"].as_str().unwrap();
            let nfc_changes = text.contains('\u{301}');
            let control = c["parse_special"] == true && text.contains("</s>");
            !(qwen && (nfc_changes || control))
        });
        let left_out = before - cases.len();
        assert!(
            if qwen {
                (1..=20).contains(&left_out)
            } else {
                left_out == 0
            },
            "{name}: {left_out} cases left out"
        );
        let (n, bad) = id_mismatches(&checkpoint(name), &fx);
        assert!(
            bad.is_empty(),
            "{name}: {} of {n} cases differ:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}

#[test]
fn checkpoint_tokenizers_chat_and_end_as_their_gguf_does() {
    for (name, gguf, fx) in CHECKPOINT_TOKENIZERS {
        let (tok, reference) = (checkpoint(name), model(gguf));
        // The template comes from chat_template.jinja (transformers writes it there).
        assert_chat_renders_like_llama_cpp(&tok, &format!("{fx}.chat.json"));
        let (got, want) = (tok.special_tokens(), reference.special_tokens());
        assert_eq!(got.eos, want.eos, "{name}");
        // Every end the GGUF has is one here, where the tokenizer.json marks the token special
        // (transformers' converter leaves Qwen's `</s>` an added plain token: the case above).
        let special = |id: u32| tok.token_table().kind(id) == Some(TokenKind::Control);
        let mut ends = 0;
        for &id in &want.end_of_generation {
            if special(id) {
                assert!(
                    got.end_of_generation.contains(&id),
                    "{name}: {id} does not end"
                );
                ends += 1;
            }
        }
        assert!(ends >= 1, "{name}: no end checked");
        assert_eq!(tok.vocab_size(), reference.vocab_size(), "{name}");
    }
}
