//! [`Tokenizer::settled_len`] against the tokenizer itself: whatever follows a text, its encoding
//! starts with the tokens of the text's own encoding that lie in the settled prefix.

use common::model;
use quarry_tokenizer::Tokenizer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod common;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Pieces chosen for the pre-tokenizer's edge cases: contractions and their letters, whitespace
/// runs, digits, punctuation runs, JSON structure, multi-byte letters and symbols, and control-token
/// text (plain text when not parsed).
const PIECES: &[&str] = &[
    "'",
    "r",
    "e",
    "v",
    "l",
    "s",
    "t",
    "d",
    "m",
    "a",
    "x",
    "Q",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "\"",
    ",",
    ":",
    "{",
    "}",
    "[",
    "]",
    "1",
    "23",
    "-",
    ".",
    "é",
    "中",
    "—",
    "🙂",
    "\\",
    "_",
    "(",
    "<",
    "|",
    ">",
    "\":\"",
    "\",\"",
    "version",
    " the",
    "'re",
    "<|im_end|>",
    "\u{a0}",
    "ǅ",
];

/// Endings where a pre-token is still open, and beginnings that close or extend one; drawn often,
/// so the rare cases (a contraction completed by the next letter) come up in every run.
const EDGES: &[&str] = &[
    "'r", "'v", "'l", "'", " ", "  ", "\n", "\"", "e", "ll", "s", "1",
];

fn random_text(rng: &mut SmallRng, max_pieces: usize) -> String {
    let mut text: String = (0..rng.random_range(0..=max_pieces))
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect();
    if rng.random_bool(0.3) {
        text.push_str(EDGES[rng.random_range(0..EDGES.len())]);
    }
    text
}

/// A continuation that starts at a pre-token edge half of the time.
fn random_continuation(rng: &mut SmallRng) -> String {
    let mut cont = String::new();
    if rng.random_bool(0.5) {
        cont.push_str(EDGES[rng.random_range(0..EDGES.len())]);
    }
    cont + &random_text(rng, 3)
}

/// The tokens of `encode(text)` that lie within its first `bytes` bytes.
fn tokens_within(tok: &Tokenizer, text: &str, bytes: usize) -> Vec<u32> {
    let mut end = 0;
    tok.encode(text)
        .unwrap()
        .into_iter()
        .take_while(|&t| {
            end += tok.token_bytes(t).unwrap().len();
            end <= bytes
        })
        .collect()
}

/// Checks the settled prefix of `text` against `text + cont`, and returns it. With `next_known`
/// the tokenizer is told the one byte that follows (as a constraint would tell it the bytes it
/// allows); otherwise anything may follow. The failure message names both strings.
fn check(tok: &Tokenizer, text: &str, cont: &str, next_known: bool) -> usize {
    let next = cont.as_bytes().first().copied();
    let n = tok
        .settled_len(text, |b| !next_known || Some(b) == next)
        .expect("byte-level BPE with the GPT-2 regex");
    assert!(n <= text.len() && text.is_char_boundary(n));
    let settled = tokens_within(tok, text, n);
    let spelled: usize = settled
        .iter()
        .map(|&t| tok.token_bytes(t).unwrap().len())
        .sum();
    assert_eq!(spelled, n, "{text:?}: no token boundary at {n}");
    let full = tok.encode(&format!("{text}{cont}")).unwrap();
    assert!(
        full.starts_with(&settled),
        "{text:?} settled at {n} ({:?} -> {settled:?}, next byte known: {next_known}), but {:?} \
         encodes as {full:?}",
        &text[..n],
        format!("{text}{cont}"),
    );
    n
}

#[test]
fn settled_prefix_survives_every_continuation_smollm2() {
    let tok = model(SMOLLM2);
    let mut rng = SmallRng::seed_from_u64(0x5e7713d);
    let (mut total, mut settled, mut whole, mut nonempty) = (0, 0, 0, 0);
    for _ in 0..20_000 {
        let text = random_text(&mut rng, 12);
        let cont = random_continuation(&mut rng);
        settled += check(&tok, &text, &cont, false);
        total += text.len();
        if check(&tok, &text, &cont, true) == text.len() && !text.is_empty() {
            whole += 1;
        }
        nonempty += usize::from(!text.is_empty());
    }
    // The rule must settle most of a text, or jump-forward gains nothing from it; knowing the
    // next byte must settle whole texts often (a letter after punctuation, a space after a word).
    let share = settled as f64 / total as f64;
    assert!(share > 0.6, "only {share:.2} of the bytes settled");
    let whole = whole as f64 / nonempty as f64;
    assert!(whole > 0.2, "only {whole:.2} of the texts settled whole");
}

/// Where the rule draws the line, on cases worked out by hand from the GPT-2 regex.
#[test]
fn settled_prefix_ends_before_the_last_pre_token() {
    let tok = model(SMOLLM2);
    for (text, settled) in [
        // `,"`, `version` and `":"`: only the last punctuation run can grow.
        (",\"version\":\"", ",\"version".len()),
        // `we`, `'`, `r`: `'re` would be one pre-token if an `e` follows.
        ("we'r", 2),
        ("we'x", 3),
        ("we's", 2),
        ("abc", 0),
        // `a` then a trailing space run, which a letter would split.
        ("a  ", 1),
        ("", 0),
        // Digits are split one by one, but the last piece is still kept.
        ("x12", 2),
    ] {
        assert_eq!(tok.settled_len(text, |_| true), Some(settled), "{text:?}");
        for cont in ["e", "ll", " b", "1", "\"", "'s", ""] {
            check(&tok, text, cont, false);
            check(&tok, text, cont, true);
        }
    }
}

/// Where a constraint says what comes next, the last pre-token settles when nothing allowed can
/// join it.
#[test]
fn the_next_bytes_settle_the_last_pre_token() {
    let tok = model(SMOLLM2);
    let key = ",\"essential\":";
    let letter = |b: u8| b.is_ascii_lowercase();
    let quote = |b: u8| b == b'"' || b == b'[';
    // `true`/`false` after `":`: a letter never joins a punctuation run.
    assert_eq!(tok.settled_len(key, letter), Some(key.len()));
    // A string or an array after it: `":"` and `":[` are single pre-tokens.
    assert_eq!(tok.settled_len(key, quote), Some(",\"essential".len()));
    // A word followed by a space or a quote is complete; by a letter it is not.
    assert_eq!(tok.settled_len("a word", |b| b == b' '), Some(6));
    assert_eq!(tok.settled_len("a word", letter), Some(1));
    // A lone `'` takes a letter (`'s`), whatever the class rule says.
    assert_eq!(tok.settled_len("it'", letter), Some(2));
    // Nothing may follow (the constraint is complete): all of it.
    assert_eq!(tok.settled_len("a  ", |_| false), Some(3));
}

/// The contraction exception is needed: without it the first case above would be settled at 3,
/// and a following `e` changes the tokens before that point.
#[test]
fn a_contraction_can_reach_back_over_a_pre_token() {
    let tok = model(SMOLLM2);
    let early = tokens_within(&tok, "we'r", 3);
    let full = tok.encode("we're").unwrap();
    assert!(
        !full.starts_with(&early),
        "{early:?} is a prefix of {full:?}"
    );
}

#[test]
fn sentencepiece_has_no_settled_prefix() {
    let tok = model("gemma-3-270m-q4_k_m.gguf");
    assert_eq!(tok.settled_len(",\"version\":\"", |_| true), None);
}

/// A `tokenizer.json` with the same pre-tokenizer settles the same prefixes.
#[test]
fn tokenizer_json_settles_like_gguf() {
    let gguf = model(SMOLLM2);
    let dir = std::env::temp_dir().join(format!("quarry-settled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    gguf.inner().save(&path, false).unwrap();
    let json = Tokenizer::from_tokenizer_json(&path).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..2_000 {
        let text = random_text(&mut rng, 12);
        assert_eq!(
            json.settled_len(&text, |_| true),
            gguf.settled_len(&text, |_| true),
            "{text:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
