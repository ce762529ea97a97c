//! SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`, e.g. Gemma 3).
//!
//! GGUF stores no merges for these: a SentencePiece BPE model merges the adjacent pair whose
//! concatenation is the highest-scoring vocabulary entry. That is exactly BPE with one merge rule per
//! way of splitting a token into two vocabulary entries, ranked by the token's score, which is how
//! we build a `tokenizers` BPE model for them.

use std::collections::HashMap;

use crate::table::TokenKind;

/// `▁` (U+2581), SentencePiece's visible space.
pub(crate) const SPACE: char = '\u{2581}';

/// The bytes a SentencePiece token stands for: `<0xNN>` byte tokens are that byte, `▁` is a space.
pub(crate) fn token_bytes(token: &str, kind: TokenKind, out: &mut Vec<u8>) {
    match kind {
        TokenKind::Byte => match parse_byte_token(token) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(token.as_bytes()),
        },
        TokenKind::Normal => {
            for c in token.chars() {
                let c = if c == SPACE { ' ' } else { c };
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
        // llama.cpp's `token_to_piece` gives unused (reserved) tokens no bytes at all.
        TokenKind::Unused => {}
        // llama.cpp copies the text of user-defined and special tokens verbatim.
        _ => out.extend_from_slice(token.as_bytes()),
    }
}

/// Parses `<0xNN>`.
pub(crate) fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// One BPE merge rule per (left, right) split of every mergeable token, highest score first.
///
/// Control, byte, unknown and unused tokens are never the product of a merge.
pub(crate) fn merges_from_scores(
    tokens: &[String],
    kinds: &[TokenKind],
    scores: &[f32],
) -> Vec<(String, String)> {
    let index: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let mut rules: Vec<(f32, u32, u32)> = Vec::new(); // (score, merged id, split byte offset)
    for (id, tok) in tokens.iter().enumerate() {
        if !matches!(kinds[id], TokenKind::Normal | TokenKind::UserDefined) {
            continue;
        }
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if index.contains_key(l) && index.contains_key(r) {
                rules.push((scores[id], id as u32, split as u32));
            }
        }
    }
    // Higher score merges first; among equal scores, the lower id, then the shorter left part.
    rules.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    rules
        .into_iter()
        .map(|(_, id, split)| {
            let (l, r) = tokens[id as usize].split_at(split as usize);
            (l.to_owned(), r.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_and_spaces() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token("<0xZZ>"), None);
        assert_eq!(parse_byte_token("<0x0A0>"), None);
        let mut out = Vec::new();
        token_bytes("▁hello", TokenKind::Normal, &mut out);
        assert_eq!(out, b" hello");
        out.clear();
        token_bytes("<0xF0>", TokenKind::Byte, &mut out);
        assert_eq!(out, [0xF0]);
    }

    #[test]
    fn merges_follow_scores() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .map(String::from)
            .to_vec();
        let kinds = vec![TokenKind::Normal; tokens.len()];
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let merges = merges_from_scores(&tokens, &kinds, &scores);
        let got: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        assert_eq!(got, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
