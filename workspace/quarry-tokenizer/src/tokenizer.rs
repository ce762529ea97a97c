//! [`Tokenizer`]: encode, decode, token bytes, special ids and chat template, built from GGUF
//! metadata or a `tokenizer.json`.

use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper};

use crate::byte_level::CharToByte;
use crate::chat::{ChatMessage, ChatTemplate, ChatVars};
use crate::error::{tk_err, Result, TokenizerError};
use crate::gguf::{read_content, GgufVocab};
use crate::settle::{settled_len, Settling};
use crate::spm;
use crate::table::{TokenKind, TokenTable};

/// How the vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VocabKind {
    /// GPT-2 byte-level BPE (`tokenizer.ggml.model = gpt2`): every byte is a printable character.
    ByteLevelBpe,
    /// SentencePiece-style BPE (`tokenizer.ggml.model = llama`): `▁` for space, `<0xNN>` byte tokens.
    SentencePiece,
}

impl std::fmt::Display for VocabKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VocabKind::ByteLevelBpe => "byte-level BPE",
            VocabKind::SentencePiece => "SentencePiece BPE",
        })
    }
}

/// Ids with a fixed role.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn, where the model has one distinct from EOS.
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// Every id that ends generation: EOS, EOT, end-of-message, and control tokens whose text is a
    /// known end marker (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, `<|endoftext|>`, …). Sorted.
    pub end_of_generation: Vec<u32>,
}

/// Options for [`Tokenizer::encode_with`]. The default is right for untrusted document text: no BOS,
/// and control-token text such as `<|im_end|>` is tokenized as plain text, never as the control token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Prepend the BOS token (when the model has one).
    pub add_bos: bool,
    /// Match control tokens written in the text (for rendered chat templates, never for documents).
    pub parse_special: bool,
}

/// A loaded tokenizer. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Tokenizer {
    /// Control tokens in the text stay plain text.
    plain: tokenizers::Tokenizer,
    /// Control tokens in the text become their ids.
    parsing: tokenizers::Tokenizer,
    table: TokenTable,
    kind: VocabKind,
    pre_tokenizer: Option<String>,
    special: SpecialTokens,
    add_bos: bool,
    strip_leading_space: bool,
    chat_template: Option<ChatTemplate>,
    settling: Settling,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.table.len())
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

/// Pre-tokenizer names (llama.cpp's `tokenizer.ggml.pre`) that split digits one by one and then
/// apply the GPT-2 regex. llama.cpp gives all of these the same two regexes.
const DIGITS_THEN_GPT2: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva",
];

/// The split regex of llama.cpp's `qwen2` pre-tokenizer (Qwen2/2.5, and the GGUF names llama.cpp
/// maps to it): the GPT-2 shape with case-insensitive contractions, one digit per pre-token, and
/// punctuation runs that keep their trailing newlines. Written as llama.cpp writes it (its
/// `(?:'[sS]|…)` for the `(?i:'s|…)` of Qwen's `tokenizer.json`).
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of llama.cpp's `llama3` pre-tokenizer (`llama-bpe` in Llama 3 GGUF files): as
/// [`QWEN2_SPLIT`] but with up to three digits per pre-token.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of llama.cpp's `tekken` pre-tokenizer (Mistral Nemo, Mistral Small 3, Ministral):
/// words split at case changes, one digit per pre-token, `/` kept with punctuation. Written as
/// llama.cpp writes it: an upper-case letter is a letter outside `a-z` and a lower-case one a
/// letter outside `A-Z`, so every letter beyond ASCII is both, and a combining mark (`\p{M}`, in
/// the letters of the `tokenizer.json` original) is not a letter. The two differ on marks
/// (Devanagari's vowel signs), where quarry follows llama.cpp, as for every GGUF.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF pre-tokenizer names, the split regex llama.cpp gives each (followed by the byte-level
/// mapping, without the GPT-2 regex), and whether llama.cpp treats the vocabulary as Llama 3's:
/// a pre-token that is itself in the vocabulary is taken whole before any merge (`ignore_merges`,
/// the `tokenizer.json` key of the same name: Llama 3's vocabulary, made by tiktoken, has tokens
/// no chain of its merges reaches, such as ` dấu`, which merging alone would split), and BOS is
/// added by default where the file has no `tokenizer.ggml.add_bos_token`.
const SPLIT_THEN_BYTES: &[(&str, &str, bool)] = &[
    ("qwen2", QWEN2_SPLIT, false),
    ("deepseek-r1-qwen", QWEN2_SPLIT, false),
    ("megrez", QWEN2_SPLIT, false),
    ("llama3", LLAMA3_SPLIT, true),
    ("llama-v3", LLAMA3_SPLIT, true),
    ("llama-bpe", LLAMA3_SPLIT, true),
    ("falcon3", LLAMA3_SPLIT, true),
    ("tekken", TEKKEN_SPLIT, true),
];

/// Texts that end a turn although the metadata does not call them EOS. Like llama.cpp, a token with
/// one of these texts is treated as a control token whatever its GGUF type (Gemma 3 stores `</s>` as
/// user-defined; llama.cpp matches it only when special tokens are parsed, and so do we).
const END_MARKERS: &[&str] = &[
    "</s>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<EOT>",
];

impl Tokenizer {
    /// Loads the tokenizer stored in a GGUF file's metadata (tensors are not read).
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self> {
        let content = read_content(path.as_ref())?;
        Self::from_gguf_vocab(GgufVocab::from_content(&content)?)
    }

    /// Builds the tokenizer from already-decoded GGUF metadata.
    pub fn from_gguf_vocab(mut v: GgufVocab) -> Result<Self> {
        let n = v.tokens.len();
        for (t, k) in v.tokens.iter().zip(v.kinds.iter_mut()) {
            if END_MARKERS.contains(&t.as_str()) {
                *k = TokenKind::Control;
            }
        }
        let mut llama3_like = false;
        let (kind, model, table, normalizer, pre, decoder) = match v.model.as_str() {
            "gpt2" => {
                let pre_name = v.pre.as_deref().unwrap_or("gpt-2");
                let pre: PreTokenizerWrapper = if DIGITS_THEN_GPT2.contains(&pre_name) {
                    PreTokenizerSequence::new(vec![
                        Digits::new(true).into(),
                        ByteLevel::new(false, true, true).into(),
                    ])
                    .into()
                } else if pre_name == "gpt-2" || pre_name == "gpt2" {
                    ByteLevel::new(false, true, true).into()
                } else if let Some(&(_, regex, llama3)) =
                    SPLIT_THEN_BYTES.iter().find(|(name, ..)| *name == pre_name)
                {
                    llama3_like = llama3;
                    let split = Split::new(
                        SplitPattern::Regex(regex.to_string()),
                        SplitDelimiterBehavior::Isolated,
                        false,
                    )
                    .map_err(tk_err)?;
                    PreTokenizerSequence::new(vec![
                        split.into(),
                        ByteLevel::new(false, false, false).into(),
                    ])
                    .into()
                } else {
                    let split: Vec<&str> = SPLIT_THEN_BYTES.iter().map(|(n, ..)| *n).collect();
                    return Err(TokenizerError::Unsupported(format!(
                        "byte-level BPE pre-tokenizer `{pre_name}` (supported: gpt-2, {}, {})",
                        DIGITS_THEN_GPT2.join(", "),
                        split.join(", ")
                    )));
                };
                let merges = v
                    .merges
                    .as_ref()
                    .ok_or(TokenizerError::MissingKey {
                        key: "tokenizer.ggml.merges",
                    })?
                    .iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_owned(), b.to_owned()))
                            .ok_or_else(|| TokenizerError::InvalidKey {
                                key: "tokenizer.ggml.merges",
                                message: format!("merge {m:?} has no space"),
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let model = BPE::builder()
                    .vocab_and_merges(vocab_map(&v.tokens), merges)
                    .ignore_merges(llama3_like)
                    .build()
                    .map_err(tk_err)?;
                let table = byte_level_table(&v.tokens, &v.kinds);
                let dec: DecoderWrapper = ByteLevelDecoder::default().into();
                (VocabKind::ByteLevelBpe, model, table, None, Some(pre), dec)
            }
            "llama" => {
                let scores = v.scores.as_ref().ok_or(TokenizerError::MissingKey {
                    key: "tokenizer.ggml.scores",
                })?;
                let merges = spm::merges_from_scores(&v.tokens, &v.kinds, scores);
                let mut builder = BPE::builder()
                    .vocab_and_merges(vocab_map(&v.tokens), merges)
                    .byte_fallback(true);
                if let Some(unk) = v.unk {
                    builder = builder.unk_token(v.tokens[unk as usize].clone());
                }
                let model = builder.build().map_err(tk_err)?;
                let mut table = TokenTable::with_capacity(n);
                let mut buf = Vec::new();
                for (tok, k) in v.tokens.iter().zip(&v.kinds) {
                    buf.clear();
                    spm::token_bytes(tok, *k, &mut buf);
                    table.push(&buf, *k);
                }
                let space = spm::SPACE.to_string();
                let mut norms: Vec<NormalizerWrapper> = Vec::new();
                if v.add_space_prefix.unwrap_or(true) {
                    norms.push(Prepend::new(space.clone()).into());
                }
                norms.push(Replace::new(" ", space.as_str()).map_err(tk_err)?.into());
                let dec: DecoderWrapper = DecoderSequence::new(vec![
                    tokenizers::decoders::DecoderWrapper::Replace(
                        Replace::new(space.as_str(), " ").map_err(tk_err)?,
                    ),
                    ByteFallback::new().into(),
                    Fuse::new().into(),
                ])
                .into();
                let norm: NormalizerWrapper = NormalizerSequence::new(norms).into();
                (
                    VocabKind::SentencePiece,
                    model,
                    table,
                    Some(norm),
                    None,
                    dec,
                )
            }
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.model `{other}` (supported: gpt2, llama)"
                )))
            }
        };

        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_normalizer(normalizer).map_err(tk_err)?;
        inner.with_pre_tokenizer(pre);
        inner.with_decoder(Some(decoder));
        // Control tokens are special (matched only when asked); user-defined ones always match,
        // on the raw text, as in llama.cpp.
        let added: Vec<AddedToken> = v
            .tokens
            .iter()
            .zip(&v.kinds)
            .filter(|(_, k)| matches!(k, TokenKind::Control | TokenKind::UserDefined))
            .map(|(t, k)| AddedToken::from(t.clone(), *k == TokenKind::Control).normalized(false))
            .collect();
        let (specials, plain): (Vec<_>, Vec<_>) = added.into_iter().partition(|t| t.special);
        inner.add_special_tokens(specials).map_err(tk_err)?;
        inner.add_tokens(plain).map_err(tk_err)?;
        let mut plain_tk = inner.clone();
        plain_tk.set_encode_special_tokens(true);

        let special = special_tokens(&v, &table);
        // [`Tokenizer::settled_len`]'s analysis covers the GPT-2 regex (with or without the digit
        // split) only; SentencePiece has no pre-tokenizer, and the split-regex families are not
        // analysed (the engine then keeps back a fixed count).
        let gpt2_family = v
            .pre
            .as_deref()
            .is_none_or(|p| DIGITS_THEN_GPT2.contains(&p) || p == "gpt-2" || p == "gpt2");
        let settling = Settling {
            gpt2_regex: kind == VocabKind::ByteLevelBpe && gpt2_family,
            plain_added: plain_added(&inner),
        };
        let chat_template = match &v.chat_template {
            Some(src) => {
                let text =
                    |id: Option<u32>| id.map(|i| v.tokens[i as usize].clone()).unwrap_or_default();
                Some(ChatTemplate::new(src, &text(v.bos), &text(v.eos))?)
            }
            None => None,
        };
        Ok(Self {
            plain: plain_tk,
            parsing: inner,
            table,
            kind,
            pre_tokenizer: v.pre.clone(),
            // llama.cpp's default where the file does not say.
            add_bos: v
                .add_bos
                .unwrap_or(kind == VocabKind::SentencePiece || llama3_like)
                && v.bos.is_some(),
            strip_leading_space: kind == VocabKind::SentencePiece
                && v.add_space_prefix.unwrap_or(true),
            special,
            chat_template,
            settling,
        })
    }

    /// The tokenizer of a model: a GGUF file's ([`Tokenizer::from_gguf`]), or a Hugging Face
    /// checkpoint folder's ([`Tokenizer::from_checkpoint`]).
    pub fn from_model(path: impl AsRef<Path>) -> Result<Self> {
        match path.as_ref().is_dir() {
            true => Self::from_checkpoint(path),
            false => Self::from_gguf(path),
        }
    }

    /// A checkpoint folder's tokenizer: `tokenizer.json` with its `tokenizer_config.json`
    /// ([`Tokenizer::from_tokenizer_json`]); the chat template from `chat_template.jinja` where the
    /// config has none (recent transformers write it there); and every id that
    /// `generation_config.json`'s `eos_token_id` names (a number or a list: Llama 3's
    /// `<|eot_id|>` beside its EOS) ends generation too.
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let mut t = Self::from_tokenizer_json(dir.join("tokenizer.json"))?;
        let jinja = dir.join("chat_template.jinja");
        if t.chat_template.is_none() && jinja.exists() {
            let src = std::fs::read_to_string(&jinja).map_err(|source| TokenizerError::Io {
                path: jinja.clone(),
                source,
            })?;
            let text = |id: Option<u32>| id.and_then(|id| t.token_text(id)).unwrap_or_default();
            let (bos, eos) = (text(t.special.bos), text(t.special.eos));
            t.chat_template = Some(ChatTemplate::new(&src, &bos, &eos)?);
        }
        let gen_path = dir.join("generation_config.json");
        if let Ok(raw) = std::fs::read_to_string(&gen_path) {
            let bad = |message: String| TokenizerError::TokenizerJson {
                path: gen_path.clone(),
                message,
            };
            let doc: serde_json::Value =
                serde_json::from_str(&raw).map_err(|e| bad(e.to_string()))?;
            let ids = match &doc["eos_token_id"] {
                serde_json::Value::Null => Vec::new(),
                serde_json::Value::Array(a) => a.clone(),
                one => vec![one.clone()],
            };
            for v in ids {
                let id = v
                    .as_u64()
                    .filter(|&id| (id as usize) < t.vocab_size())
                    .ok_or_else(|| bad(format!("eos_token_id {v} is not a token id")))?;
                t.special.end_of_generation.push(id as u32);
            }
            t.special.end_of_generation.sort_unstable();
            t.special.end_of_generation.dedup();
        }
        Ok(t)
    }

    /// Loads a Hugging Face `tokenizer.json`. A `tokenizer_config.json` beside it, when present,
    /// supplies the chat template, BOS/EOS and `add_bos_token`.
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json_err = |message: String| TokenizerError::TokenizerJson {
            path: path.to_owned(),
            message,
        };
        let raw = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_owned(),
            source,
        })?;
        let doc: serde_json::Value =
            serde_json::from_str(&raw).map_err(|e| json_err(e.to_string()))?;
        let inner: tokenizers::Tokenizer = raw
            .parse()
            .map_err(|e: tokenizers::Error| json_err(e.to_string()))?;
        let byte_level = doc["decoder"]["type"] == "ByteLevel"
            || doc["pre_tokenizer"]["type"] == "ByteLevel"
            || doc["pre_tokenizer"]["pretokenizers"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p["type"] == "ByteLevel"));
        let kind = if byte_level {
            VocabKind::ByteLevelBpe
        } else if doc["model"]["byte_fallback"] == true {
            VocabKind::SentencePiece
        } else {
            return Err(json_err(
                "only byte-level BPE and SentencePiece-style BPE (byte_fallback) are supported"
                    .into(),
            ));
        };
        let n = inner.get_vocab_size(true);
        let mut tokens = vec![String::new(); n];
        for (t, id) in inner.get_vocab(true) {
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = t;
            }
        }
        let added = inner.get_added_tokens_decoder();
        let kinds: Vec<TokenKind> = (0..n as u32)
            .map(|id| match added.get(&id) {
                Some(t) if t.special => TokenKind::Control,
                Some(_) => TokenKind::UserDefined,
                None if kind == VocabKind::SentencePiece
                    && spm::parse_byte_token(&tokens[id as usize]).is_some() =>
                {
                    TokenKind::Byte
                }
                None => TokenKind::Normal,
            })
            .collect();
        let table = match kind {
            VocabKind::ByteLevelBpe => byte_level_table(&tokens, &kinds),
            VocabKind::SentencePiece => {
                let mut table = TokenTable::with_capacity(n);
                let mut buf = Vec::new();
                for (tok, k) in tokens.iter().zip(&kinds) {
                    buf.clear();
                    spm::token_bytes(tok, *k, &mut buf);
                    table.push(&buf, *k);
                }
                table
            }
        };
        let config_path = path.with_file_name("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| TokenizerError::TokenizerJson {
                path: config_path.clone(),
                message: e.to_string(),
            })?,
            Err(_) => serde_json::Value::Null,
        };
        let token_text = |key: &str| -> Option<String> {
            match &config[key] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => {
                    o.get("content").and_then(|c| c.as_str()).map(String::from)
                }
                _ => None,
            }
        };
        let id_of = |t: &Option<String>| t.as_ref().and_then(|t| inner.token_to_id(t));
        let (bos_text, eos_text) = (token_text("bos_token"), token_text("eos_token"));
        let v = GgufVocab {
            model: String::new(),
            pre: None,
            tokens,
            kinds,
            scores: None,
            merges: None,
            bos: id_of(&bos_text),
            eos: id_of(&eos_text),
            eot: None,
            eom: None,
            unk: id_of(&token_text("unk_token")),
            pad: id_of(&token_text("pad_token")),
            // transformers' fast tokenizers add what the post-processor's template says where
            // tokenizer_config.json does not say (Llama 3's puts `<|begin_of_text|>` there).
            add_bos: config["add_bos_token"].as_bool().or_else(|| {
                bos_text
                    .as_deref()
                    .map(|bos| template_starts_with(&doc["post_processor"], bos))
            }),
            add_eos: None,
            add_space_prefix: None,
            chat_template: config_template(&config["chat_template"]),
        };
        let special = special_tokens(&v, &table);
        let chat_template = match &v.chat_template {
            Some(src) => Some(ChatTemplate::new(
                src,
                bos_text.as_deref().unwrap_or(""),
                eos_text.as_deref().unwrap_or(""),
            )?),
            None => None,
        };
        let settling = Settling {
            gpt2_regex: kind == VocabKind::ByteLevelBpe
                && doc["normalizer"].is_null()
                && gpt2_regex_pre_tokenizer(&doc["pre_tokenizer"]),
            plain_added: plain_added(&inner),
        };
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        Ok(Self {
            plain,
            parsing: inner,
            table,
            kind,
            pre_tokenizer: None,
            add_bos: v.add_bos.unwrap_or(false) && v.bos.is_some(),
            strip_leading_space: false,
            special,
            chat_template,
            settling,
        })
    }

    /// Encodes untrusted text: no BOS, control-token text stays text. See [`EncodeOptions`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, EncodeOptions::default())
    }

    /// Encodes with explicit options.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>> {
        let tk = if opts.parse_special {
            &self.parsing
        } else {
            &self.plain
        };
        let enc = tk.encode_fast(text, false).map_err(tk_err)?;
        let ids = enc.get_ids();
        let bos = self.special.bos.filter(|_| opts.add_bos);
        let mut out = Vec::with_capacity(ids.len() + usize::from(bos.is_some()));
        out.extend(bos);
        out.extend_from_slice(ids);
        Ok(out)
    }

    /// Encodes a prompt the chat template rendered: control tokens parsed, and the model's BOS
    /// once. Where the template already wrote it (Llama 3's and Gemma 3's begin with
    /// `bos_token`), none is added, as llama.cpp strips the template's and transformers adds none;
    /// otherwise BOS is added where the model adds it to every prompt.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        let written = self
            .special
            .bos
            .and_then(|b| self.token_bytes(b).ok())
            .is_some_and(|b| !b.is_empty() && rendered.as_bytes().starts_with(b));
        let opts = EncodeOptions {
            add_bos: self.add_bos && !written,
            parse_special: true,
        };
        self.encode_with(rendered, opts)
    }

    /// The exact bytes of `ids` concatenated, special tokens included as their text. This is the
    /// byte stream a grammar sees.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Decodes `ids` to text. Special tokens are skipped when `skip_special` is set; bytes that do
    /// not form valid UTF-8 (a sequence cut inside a character) become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let bytes = self.token_bytes(id)?;
            let kind = self.table.kind(id).unwrap_or(TokenKind::Normal);
            if skip_special && kind.is_special() {
                continue;
            }
            // SentencePiece's dummy prefix: the leading space of the first piece is not text.
            let bytes = if i == 0 && self.strip_leading_space && kind == TokenKind::Normal {
                bytes.strip_prefix(b" ").unwrap_or(bytes)
            } else {
                bytes
            };
            out.extend_from_slice(bytes);
        }
        Ok(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The longest prefix of `text`, in bytes, whose tokens no continuation can change: the tokens
    /// of `encode(text)` that lie within `text[..n]` are the first tokens of `encode(text + s)`
    /// for every string `s` whose first byte satisfies `may_follow` (pass `|_| true` when anything
    /// may follow). Encoding `text[..n]` alone can differ: a whitespace run at its end splits
    /// otherwise.
    ///
    /// Known for byte-level BPE with the GPT-2 pre-tokenizer (with or without the digit split):
    /// only the last pre-token (and a `'` before a final `r`, `v` or `l`) can still change, and
    /// the last one cannot when no byte that may follow would join it. `None` for
    /// SentencePiece-style BPE, whose merges may cross any boundary, and for `tokenizer.json`
    /// pre-tokenizers that are not that one.
    pub fn settled_len(&self, text: &str, may_follow: impl Fn(u8) -> bool) -> Option<usize> {
        settled_len(
            &self.settling,
            self.plain.get_pre_tokenizer(),
            text,
            may_follow,
        )
    }

    /// The exact bytes token `id` stands for.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.table.bytes(id).ok_or(TokenizerError::UnknownTokenId {
            id,
            vocab_size: self.table.len(),
        })
    }

    /// The vocabulary string of token `id` as stored in the model (`Ġhello`, `▁hello`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.parsing.id_to_token(id)
    }

    /// The token → bytes table for the whole vocabulary.
    pub fn token_table(&self) -> &TokenTable {
        &self.table
    }

    pub fn vocab_size(&self) -> usize {
        self.table.len()
    }

    pub fn vocab_kind(&self) -> VocabKind {
        self.kind
    }

    /// The GGUF pre-tokenizer name (`tokenizer.ggml.pre`), when the tokenizer came from GGUF.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        self.pre_tokenizer.as_deref()
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Whether the model expects a BOS token in front of a prompt.
    pub fn add_bos_by_default(&self) -> bool {
        self.add_bos
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders `messages` with the model's chat template, for a reply that does not think first
    /// (`enable_thinking = false`: [`ChatVars`]).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(
            messages,
            add_generation_prompt,
            &ChatVars::default().for_reply(false),
        )
    }

    /// [`Tokenizer::apply_chat_template`] with the template variables `vars`, as given.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &ChatVars,
    ) -> Result<String> {
        self.chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?
            .render_with(messages, add_generation_prompt, vars)
    }

    /// The underlying `tokenizers::Tokenizer` (with control-token parsing on).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.parsing
    }
}

/// Whether a `tokenizer.json` post-processor puts the special token `token` first in a single
/// sequence: a `TemplateProcessing` whose `single` template starts with it, alone or inside a
/// `Sequence` of processors.
fn template_starts_with(processor: &serde_json::Value, token: &str) -> bool {
    match processor["type"].as_str() {
        Some("TemplateProcessing") => {
            processor["single"][0]["SpecialToken"]["id"].as_str() == Some(token)
        }
        Some("Sequence") => processor["processors"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| template_starts_with(p, token))),
        _ => false,
    }
}

/// `tokenizer_config.json`'s `chat_template`: one template, or transformers' list of named
/// templates (`[{"name": "default", "template": …}, {"name": "tool_use", …}]`), of which the
/// default.
fn config_template(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(String::from),
        _ => None,
    }
}

/// Texts of the added tokens that match in plain text (control tokens match only when parsed).
fn plain_added(tk: &tokenizers::Tokenizer) -> Vec<String> {
    tk.get_added_tokens_decoder()
        .into_values()
        .filter(|t| !t.special)
        .map(|t| t.content)
        .filter(|c| !c.is_empty())
        .collect()
}

/// Whether a `tokenizer.json` pre-tokenizer is the GPT-2 regex, alone or after splitting digits
/// one by one (the two shapes [`Tokenizer::settled_len`] knows).
fn gpt2_regex_pre_tokenizer(pre: &serde_json::Value) -> bool {
    let byte_level = |p: &serde_json::Value| {
        p["type"] == "ByteLevel"
            && p["use_regex"].as_bool().unwrap_or(true)
            && !p["add_prefix_space"].as_bool().unwrap_or(false)
    };
    match pre["type"].as_str() {
        Some("ByteLevel") => byte_level(pre),
        Some("Sequence") => match pre["pretokenizers"].as_array().map(Vec::as_slice) {
            Some([p]) => byte_level(p),
            Some([d, p]) => {
                d["type"] == "Digits" && d["individual_digits"] == true && byte_level(p)
            }
            _ => false,
        },
        _ => false,
    }
}

fn vocab_map(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

fn byte_level_table(tokens: &[String], kinds: &[TokenKind]) -> TokenTable {
    let inv = CharToByte::new();
    let mut table = TokenTable::with_capacity(tokens.len());
    let mut buf = Vec::new();
    for (tok, k) in tokens.iter().zip(kinds) {
        buf.clear();
        // Unused (reserved) tokens have no bytes, as llama.cpp's `token_to_piece` gives them
        // (Qwen2.5 pads its vocabulary with 271 `[PAD…]` ids); they are special, so never allowed.
        if *k == TokenKind::Unused {
            table.push(&buf, *k);
            continue;
        }
        // Control and user-defined tokens are stored as plain text, not byte-level spelled; a
        // normal token with a character outside the byte map is also taken as its UTF-8 text,
        // as llama.cpp does.
        if !matches!(k, TokenKind::Normal | TokenKind::Byte) || !inv.decode(tok, &mut buf) {
            buf.clear();
            buf.extend_from_slice(tok.as_bytes());
        }
        table.push(&buf, *k);
    }
    table
}

fn special_tokens(v: &GgufVocab, table: &TokenTable) -> SpecialTokens {
    let mut eog: Vec<u32> = [v.eos, v.eot, v.eom].into_iter().flatten().collect();
    for (id, bytes, kind) in table.iter() {
        if kind == TokenKind::Control && END_MARKERS.iter().any(|m| m.as_bytes() == bytes) {
            eog.push(id);
        }
    }
    eog.sort_unstable();
    eog.dedup();
    SpecialTokens {
        bos: v.bos,
        eos: v.eos,
        eot: v.eot,
        unk: v.unk,
        pad: v.pad,
        end_of_generation: eog,
    }
}
