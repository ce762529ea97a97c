//! Tokenizers for quarry: built from GGUF metadata or a Hugging Face `tokenizer.json`.
//!
//! # Key types
//! - [`Tokenizer`]: encode and decode text, the exact bytes of every token, special ids, the chat
//!   template. One instance is shared (`&self` everywhere) by every worker.
//! - [`TokenTable`]: token id → bytes and [`TokenKind`], stored flat. This is what a grammar needs to
//!   turn a byte automaton into token masks.
//! - [`ChatTemplate`]: the model's Jinja chat template, rendered with minijinja.
//!
//! # The loop
//! ```no_run
//! use quarry_tokenizer::{ChatMessage, Tokenizer};
//! let tok = Tokenizer::from_gguf("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let prompt = tok.apply_chat_template(&[ChatMessage::new("user", "Extract the invoice total.")], true)?;
//! // The rendered template contains control tokens (`<|im_start|>`), so `encode_chat` parses
//! // them (never parse special tokens in document text) and adds BOS unless the template wrote it.
//! let ids = tok.encode_chat(&prompt)?;
//! let bytes: &[u8] = tok.token_bytes(ids[0])?;
//! assert_eq!(tok.decode(&ids, false)?, prompt);
//! # let _ = bytes;
//! # Ok::<(), quarry_tokenizer::TokenizerError>(())
//! ```
//!
//! # Supported vocabularies
//! - `tokenizer.ggml.model = gpt2`, byte-level BPE, with pre-tokenizer `gpt-2` or the digit-splitting
//!   family llama.cpp calls `smollm` (also `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`,
//!   `minerva`). Checked id for id against llama.cpp on SmolLM2.
//! - `gpt2` with a split-regex pre-tokenizer, as llama.cpp writes each regex: `qwen2` (Qwen2, 2.5,
//!   3), `llama-bpe`/`llama3` (Llama 3.x; a pre-token that is a whole token skips the merges) and
//!   `tekken` (Mistral Nemo, Mistral Small 3). Checked against llama.cpp on Qwen2.5's GGUF and on
//!   the Hub vocabularies of Llama 3, Qwen3 and Mistral Nemo.
//! - `tokenizer.ggml.model = llama`, SentencePiece-style BPE with byte fallback (Gemma 3): the token
//!   byte table is exact; encoding is built as BPE whose merges are ranked by the vocabulary scores.
//! - A Hugging Face `tokenizer.json` (byte-level or byte-fallback BPE) with its
//!   `tokenizer_config.json`, through the `tokenizers` crate: checked against transformers on the
//!   Hub's files of Llama 3 and 3.2, Qwen2.5, Qwen3, Gemma 3 and Mistral Nemo.
//! - Any other model or pre-tokenizer is a [`TokenizerError::Unsupported`] error, never a silent
//!   approximation.

mod byte_level;
mod chat;
mod error;
mod gguf;
mod settle;
mod spm;
mod table;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate, ChatVars};
pub use error::{Result, TokenizerError};
pub use gguf::{read_content, GgufVocab};
pub use table::{TokenKind, TokenTable};
pub use tokenizer::{EncodeOptions, SpecialTokens, Tokenizer, VocabKind};
