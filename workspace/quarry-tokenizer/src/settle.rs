//! Where a text's tokenization is settled: the longest prefix such that the tokens of the text's
//! encoding inside it are the same whatever follows the text. Jump-forward commits forced bytes
//! only up to there, so the tokens it appends are the ones the tokenizer itself would produce for
//! the finished output.
//!
//! Byte-level BPE merges only inside a pre-token, so a token boundary is settled when the
//! pre-token split before it is. For the GPT-2 pre-tokenizer regex
//! (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, optionally after
//! splitting digits one by one) every pre-token but the last is decided by characters inside the
//! text: each greedy run stops at a character the text holds, and `\s+(?!\S)` looks one character
//! past a run that ends before the text does. The one exception is a contraction: `'` followed by
//! a final `r`, `v` or `l` is two pre-tokens now but becomes `'re`, `'ve` or `'ll` if the right
//! letter follows. So the settled prefix ends where the last pre-token starts, or where that `'`
//! starts.
//!
//! When the caller knows which bytes may come next (a constraint does), the last pre-token is
//! settled too if none of them can join it: a letter run grows only by a letter, a digit by a
//! digit, a punctuation run by punctuation, and a lone `'` by a letter (a contraction). A
//! whitespace run, a non-ASCII character or a control byte on either side counts as joining.
//!
//! Added tokens that match in plain text are split out before pre-tokenization, so a text whose
//! tail could begin one is settled only before that tail.
//!
//! SentencePiece-style BPE has no pre-tokenizer (merges may cross spaces), and other
//! pre-tokenizers are not analysed: for those the answer is `None`, and callers fall back to a
//! fixed count of tokens.

use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

/// The pre-tokenizer facts [`settled_len`] needs, fixed when the tokenizer is built.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settling {
    /// The pre-tokenizer is the GPT-2 regex (after an optional digit split) and there is no
    /// normalizer: the analysis above holds.
    pub gpt2_regex: bool,
    /// Texts of the added tokens that match in plain text (the non-special ones).
    pub plain_added: Vec<String>,
}

/// The settled prefix of `text` in bytes (a character boundary), given that the next byte, if
/// any, is one for which `may_follow` holds; `None` when `settling` says the pre-tokenizer is not
/// one whose boundaries are known.
pub(crate) fn settled_len(
    settling: &Settling,
    pre: Option<&impl PreTokenizer>,
    text: &str,
    may_follow: impl Fn(u8) -> bool,
) -> Option<usize> {
    if !settling.gpt2_regex {
        return None;
    }
    let pre = pre?;
    let mut pts = PreTokenizedString::from(text);
    pre.pre_tokenize(&mut pts).ok()?;
    let splits = pts.get_splits(OffsetReferential::Original, OffsetType::Byte);
    let mut settled = match splits.as_slice() {
        [] => 0,
        [.., (_, (prev, _), _), (_, (last, end), _)]
            if &text[*prev..*last] == "'" && matches!(&text[*last..*end], "r" | "v" | "l") =>
        {
            *prev
        }
        [.., (_, (last, end), _)] => {
            let open = (0..=255u8).any(|b| joins(&text[*last..*end], b) && may_follow(b));
            if open {
                *last
            } else {
                *end
            }
        }
    };
    // An added token is split out before pre-tokenization, so the text before the first one is
    // pre-tokenized on its own whatever follows; a tail that could begin one is not settled.
    let first_added = settling
        .plain_added
        .iter()
        .filter_map(|a| text.find(a.as_str()))
        .min();
    if let Some(at) = first_added {
        settled = at;
    }
    for added in &settling.plain_added {
        if let Some(n) = (1..added.len())
            .rev()
            .find(|&n| added.is_char_boundary(n) && text.ends_with(&added[..n]))
        {
            settled = settled.min(text.len() - n);
        }
    }
    Some(settled)
}

/// The GPT-2 regex's character classes, for ASCII; anything else is `Other`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Punct,
    Space,
    Other,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => Class::Space,
        0x21..=0x7e => Class::Punct,
        _ => Class::Other,
    }
}

/// Whether byte `b` after the final pre-token `last` could make it another pre-token.
fn joins(last: &str, b: u8) -> bool {
    let Some(&end) = last.as_bytes().last() else {
        return true;
    };
    match (class(end), class(b)) {
        (Class::Other | Class::Space, _) | (_, Class::Other) => true,
        (Class::Punct, Class::Letter) => last == "'",
        (x, y) => x == y,
    }
}
