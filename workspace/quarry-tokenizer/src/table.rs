//! The token → bytes table: the exact byte string each token id stands for.

/// What kind of token an id is, following GGUF's `tokenizer.ggml.token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Ordinary text.
    Normal,
    /// The unknown-token placeholder.
    Unknown,
    /// A control token (BOS, EOS, chat-turn markers). Never produced by plain text.
    Control,
    /// A token added by the model author and matched literally in text (Gemma's whitespace runs, tags).
    UserDefined,
    /// Reserved and never used by the model.
    Unused,
    /// A single raw byte (`<0xNN>` in SentencePiece vocabularies).
    Byte,
}

impl TokenKind {
    /// Maps GGUF's `llama_token_type` integer. Unknown values are treated as normal, like llama.cpp.
    pub(crate) fn from_gguf(v: i32) -> Self {
        match v {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Control, unknown and unused tokens carry no text a constraint could match.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused
        )
    }
}

/// The byte string of every token id, stored flat (one allocation for the whole vocabulary).
///
/// For special tokens the bytes are their literal text (`<|im_end|>`), which is what llama.cpp's
/// `token_to_piece(special = true)` prints; callers building a grammar vocabulary should look at
/// [`TokenKind::is_special`] and keep those out of masks.
#[derive(Debug, Clone)]
pub struct TokenTable {
    bytes: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is token `i`'s slice of `bytes`.
    offsets: Vec<u32>,
    kinds: Vec<TokenKind>,
}

impl TokenTable {
    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        Self {
            bytes: Vec::with_capacity(n * 8),
            offsets,
            kinds: Vec::with_capacity(n),
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8], kind: TokenKind) {
        self.bytes.extend_from_slice(bytes);
        self.offsets.push(self.bytes.len() as u32);
        self.kinds.push(kind);
    }

    /// Number of token ids.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The bytes of token `id`, or `None` outside the vocabulary.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.kinds.len() {
            return None;
        }
        Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    /// The kind of token `id`, or `None` outside the vocabulary.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Iterates `(id, bytes, kind)` over the whole vocabulary.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u8], TokenKind)> + '_ {
        (0..self.kinds.len()).map(move |i| {
            let b = &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize];
            (i as u32, b, self.kinds[i])
        })
    }
}
