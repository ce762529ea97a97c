//! The tokenizers and chat templates the models people run ship on the Hub: the real
//! `tokenizer.json` and `tokenizer_config.json` of Llama 3 and 3.2, Qwen2.5, Qwen3, Gemma 3 and
//! Mistral Nemo (`models/hub-tokenizers/`, installed by `make test`'s set-up from npm packages
//! that carry them), against transformers and llama.cpp on fixtures made by
//! `tests/fixtures/gen_hub_tokenizer_fixtures.py`.
//!
//! - a checkpoint folder's tokenizer ([`Tokenizer::from_tokenizer_json`]) gives transformers'
//!   ids, BOS and chat renders (template variables included);
//! - quarry's own GGUF tokenizer, on the same vocabularies written as llama.cpp's converter writes
//!   them (`tests/fixtures/hub_vocab.py`), gives llama.cpp's ids and token bytes: the split-regex
//!   byte-level BPE of `llama-bpe` (every Llama 3.x GGUF), of `qwen2` with Qwen3's added tokens
//!   and of `tekken` (Mistral Nemo, Mistral Small 3).

use std::path::PathBuf;

use common::{fixture, ids, pieces, root};
use quarry_tokenizer::{read_content, ChatMessage, ChatVars, EncodeOptions, GgufVocab, Tokenizer};
use serde_json::Value;

mod common;

const NAMES: [&str; 6] = [
    "llama3",
    "llama3.2",
    "qwen2.5",
    "qwen3",
    "gemma3",
    "mistral-nemo",
];

fn folder(name: &str) -> PathBuf {
    let dir = root().join("models/hub-tokenizers").join(name);
    assert!(
        dir.join("tokenizer.json").exists(),
        "{} is missing: run `make test`'s set-up (infra/fetch_models.py --tests)",
        dir.display()
    );
    dir
}

fn sha256(path: &std::path::Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The fixture of `name`, after checking that the files it was made from are the installed ones.
fn hub_fixture(name: &str) -> Value {
    let fx = fixture(&format!("hub-{name}.json.gz"));
    let dir = folder(name);
    for (file, want) in fx["files"].as_object().unwrap() {
        assert_eq!(
            sha256(&dir.join(file)),
            want.as_str().unwrap(),
            "{name}/{file} is not the file the fixture was made from"
        );
    }
    fx
}

fn encode(tok: &Tokenizer, text: &str, parse_special: bool) -> Vec<u32> {
    let options = EncodeOptions {
        add_bos: false,
        parse_special,
    };
    tok.encode_with(text, options).unwrap()
}

/// Every case's ids from quarry (`got`, from its text) equal the reference's (`reference`, from
/// the case); else the differing cases, one line each, out of how many.
fn assert_same_ids(
    what: &str,
    cases: &[Value],
    reference: impl Fn(&Value) -> Vec<u32>,
    got: impl Fn(&str) -> Vec<u32>,
) {
    let bad: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let text = c["text"].as_str().unwrap();
            let (want, got) = (reference(c), got(text));
            (want != got).then(|| format!("{text:?}: reference {want:?}, quarry {got:?}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// "Hello" with the tokenizer's default BOS.
fn hello(tok: &Tokenizer) -> Vec<u32> {
    let options = EncodeOptions {
        add_bos: tok.add_bos_by_default(),
        parse_special: false,
    };
    tok.encode_with("Hello", options).unwrap()
}

#[test]
fn hub_tokenizer_json_gives_transformers_ids() {
    for name in NAMES {
        let fx = hub_fixture(name);
        let tok = Tokenizer::from_tokenizer_json(folder(name).join("tokenizer.json")).unwrap();
        assert_eq!(
            tok.vocab_size() as u64,
            fx["vocab_size"].as_u64().unwrap(),
            "{name}"
        );
        let cases = fx["cases"].as_array().unwrap();
        assert!(cases.len() > 340, "{name}: {} cases", cases.len());
        // transformers matches every added token in text (its default), as quarry does when
        // asked to parse special tokens.
        assert_same_ids(
            name,
            cases,
            |c| ids(&c["transformers"]),
            |t| encode(&tok, t, true),
        );
        assert_eq!(
            hello(&tok),
            ids(&fx["hello_with_default_specials"]),
            "{name}"
        );
    }
}

#[test]
fn hub_chat_templates_render_as_transformers() {
    for name in NAMES {
        let fx = hub_fixture(name);
        let tok = Tokenizer::from_checkpoint(folder(name)).unwrap();
        let renders = fx["renders"].as_array().unwrap();
        assert!(renders.len() >= 6, "{name}");
        for r in renders {
            let msgs: Vec<ChatMessage> = serde_json::from_value(r["messages"].clone()).unwrap();
            let add = r["add_generation_prompt"].as_bool().unwrap();
            let vars: ChatVars = serde_json::from_value(r["chat_vars"].clone()).unwrap();
            let got = tok.apply_chat_template_with(&msgs, add, &vars).unwrap();
            assert_eq!(got, r["text"].as_str().unwrap(), "{name}: {r}");
            // One BOS, the template's where it writes one (Llama 3's, Gemma 3's, Mistral's):
            // the ids transformers gives the conversation.
            assert_eq!(
                tok.encode_chat(&got).unwrap(),
                ids(&r["ids"]),
                "{name}: {r}"
            );
        }
    }
}

/// The templates that write `bos_token` themselves would get a second BOS if the prompt were
/// encoded with the model's default BOS on top: `encode_chat` leaves it out.
#[test]
fn chat_prompts_start_with_one_bos() {
    let mut checked = 0;
    for name in NAMES {
        let tok = Tokenizer::from_checkpoint(folder(name)).unwrap();
        let Some(bos) = tok
            .special_tokens()
            .bos
            .filter(|_| tok.add_bos_by_default())
        else {
            continue;
        };
        let text = tok
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap();
        let ids = tok.encode_chat(&text).unwrap();
        assert_eq!(ids[0], bos, "{name}");
        assert_ne!(ids[1], bos, "{name}: two BOS");
        let doubled = tok
            .encode_with(
                &text,
                EncodeOptions {
                    add_bos: true,
                    parse_special: true,
                },
            )
            .unwrap();
        assert_eq!(
            &doubled[..2],
            &[bos, bos],
            "{name}: the template writes BOS"
        );
        checked += 1;
    }
    assert_eq!(
        checked, 4,
        "llama3, llama3.2, gemma3 and mistral-nemo add BOS"
    );
}

/// Qwen3's template opens the reply after an empty think block where `enable_thinking` is
/// false, and leaves it to the model where it is true: the renders differ exactly there.
#[test]
fn qwen3_renders_differ_by_enable_thinking_as_transformers_says() {
    let fx = hub_fixture("qwen3");
    let text = |thinking: Option<bool>| {
        fx["renders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["add_generation_prompt"] == true
                    && r["messages"].as_array().unwrap().len() == 1
                    && r["chat_vars"]
                        .get("enable_thinking")
                        .and_then(Value::as_bool)
                        == thinking
            })
            .unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (off, on, unset) = (text(Some(false)), text(Some(true)), text(None));
    assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(on.ends_with("<|im_start|>assistant\n"));
    assert_eq!(on, unset, "transformers: unset is thinking");
}

/// The vocabularies as GGUF files (llama.cpp's converter's layout): quarry's own GGUF
/// tokenizer gives llama.cpp's ids, with and without special-token parsing, its BOS and its
/// bytes for every token.
#[test]
fn hub_vocabularies_as_gguf_give_llama_cpp_s_ids_and_bytes() {
    for (name, pre, vocab) in [
        ("llama3", "llama-bpe", 128_256),
        ("qwen3", "qwen2", 151_936),
        ("mistral-nemo", "tekken", 131_072),
    ] {
        let fx = hub_fixture(name);
        let path = folder(name).join("vocab.gguf");
        assert_eq!(
            sha256(&path),
            fx["vocab_gguf_sha256"].as_str().unwrap(),
            "{}: not the file the fixture was made from (tests/fixtures/hub_vocab.py changed?)",
            path.display()
        );
        let tok = Tokenizer::from_gguf(&path).unwrap();
        assert_eq!(tok.pre_tokenizer(), Some(pre), "{name}");
        let cases = fx["cases"].as_array().unwrap();
        for special in [false, true] {
            let key = if special { "true" } else { "false" };
            assert_same_ids(
                &format!("{name} (parse_special={special})"),
                cases,
                |c| ids(&c["llama_cpp"][key]),
                |t| encode(&tok, t, special),
            );
        }
        assert_eq!(
            hello(&tok),
            ids(&fx["hello_with_default_bos_llama_cpp"]),
            "{name}"
        );
        let want = pieces(&format!("hub-{name}.pieces.txt.gz"));
        assert_eq!((want.len(), tok.vocab_size()), (vocab, vocab), "{name}");
        let bad: Vec<u32> = (0..vocab as u32)
            .filter(|&id| tok.token_bytes(id).unwrap() != want[id as usize].as_slice())
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: {} token byte strings differ, first {:?}",
            bad.len(),
            &bad[..bad.len().min(10)]
        );
    }
}

/// Gemma 3's Hub tokenizer (a byte-fallback BPE in tokenizer.json) and the vocabulary of the
/// Gemma 3 270M GGUF are the same tokens: on the corpus, quarry's tokenizer.json path gives the
/// ids llama.cpp gave the GGUF (`gemma3.cases.json`, special tokens parsed).
#[test]
fn gemma3_hub_tokenizer_gives_llama_cpp_s_ids_on_its_gguf() {
    hub_fixture("gemma3");
    let tok = Tokenizer::from_tokenizer_json(folder("gemma3").join("tokenizer.json")).unwrap();
    let fx = fixture("gemma3.cases.json");
    let cases: Vec<Value> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["parse_special"] == true)
        .cloned()
        .collect();
    assert!(cases.len() > 300);
    assert_same_ids(
        "gemma3",
        &cases,
        |c| ids(&c["ids"]),
        |t| encode(&tok, t, true),
    );
}

/// A GGUF that does not say `add_bos_token` (older Llama 3 conversions) gets llama.cpp's default
/// for its pre-tokenizer: BOS for the Llama 3 family and tekken, none for Qwen.
#[test]
fn a_gguf_without_add_bos_token_gets_llama_cpp_s_default() {
    for (name, bos) in [("llama3", true), ("mistral-nemo", true), ("qwen3", false)] {
        let content = read_content(&folder(name).join("vocab.gguf")).unwrap();
        let mut v = GgufVocab::from_content(&content).unwrap();
        assert!(v.add_bos.is_some(), "{name}: the converter writes the key");
        v.add_bos = None;
        let tok = Tokenizer::from_gguf_vocab(v).unwrap();
        assert_eq!(tok.add_bos_by_default(), bos, "{name}");
    }
}
