//! Vocabularies for the tests: the smallest real one (one token per byte, plus EOS, id 256), and
//! the models' own.

#![allow(dead_code)]

use std::sync::Arc;

use quarry_grammar::Vocabulary;

pub fn byte_vocab() -> Arc<Vocabulary> {
    let toks: Vec<Vec<u8>> = (0..=255u8)
        .map(|b| vec![b])
        .chain([b"<eos>".to_vec()])
        .collect();
    Arc::new(Vocabulary::new(
        toks.iter()
            .enumerate()
            .map(|(i, t)| (t.as_slice(), i == 256)),
        &[256],
    ))
}

/// A model's vocabulary from `models/` (SmolLM2 49,152 tokens, Gemma 3 262,144, Qwen2.5 151,936).
pub fn model_vocab(file: &str) -> Arc<Vocabulary> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make setup` first",
        path.display()
    );
    let tok = quarry_tokenizer::Tokenizer::from_gguf(&path).unwrap();
    let table = tok.token_table();
    Arc::new(Vocabulary::new(
        table.iter().map(|(_, b, k)| (b, k.is_special())),
        &tok.special_tokens().end_of_generation,
    ))
}
