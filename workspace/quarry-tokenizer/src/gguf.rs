//! Reading a tokenizer's description out of GGUF metadata (`tokenizer.ggml.*`).

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{Result, TokenizerError};
use crate::table::TokenKind;

/// The `tokenizer.*` metadata of a GGUF file, decoded but not yet built into a tokenizer.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece-style).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp uses (`smollm`, `gpt-2`, …).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<String>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

/// Reads only the GGUF header and metadata (not the tensors) of `path`.
pub fn read_content(path: &Path) -> Result<Content> {
    let mut file = std::fs::File::open(path).map_err(|source| TokenizerError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut reader = std::io::BufReader::new(&mut file);
    Content::read(&mut reader).map_err(|e| TokenizerError::Gguf {
        path: path.to_owned(),
        source: Box::new(without_backtrace(e)),
    })
}

impl GgufVocab {
    pub fn from_content(content: &Content) -> Result<Self> {
        let md = &content.metadata;
        let model = string(md.get("tokenizer.ggml.model"), "tokenizer.ggml.model")?.ok_or(
            TokenizerError::MissingKey {
                key: "tokenizer.ggml.model",
            },
        )?;
        let tokens = string_array(md.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey {
                key: "tokenizer.ggml.tokens",
            })?;
        let n = tokens.len();
        let kinds = match md.get("tokenizer.ggml.token_type") {
            None => vec![TokenKind::Normal; n],
            Some(v) => {
                let arr = array(v, "tokenizer.ggml.token_type")?;
                check_len(arr.len(), n, "tokenizer.ggml.token_type")?;
                arr.iter()
                    .map(|x| x.to_i32().map(TokenKind::from_gguf))
                    .collect::<Result<_, _>>()
                    .map_err(|e| invalid("tokenizer.ggml.token_type", e))?
            }
        };
        let scores = match md.get("tokenizer.ggml.scores") {
            None => None,
            Some(v) => {
                let arr = array(v, "tokenizer.ggml.scores")?;
                check_len(arr.len(), n, "tokenizer.ggml.scores")?;
                Some(
                    arr.iter()
                        .map(|x| x.to_f32())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| invalid("tokenizer.ggml.scores", e))?,
                )
            }
        };
        let id = |key: &'static str| -> Result<Option<u32>> {
            match md.get(key) {
                None => Ok(None),
                Some(v) => {
                    let id = v.to_u32().map_err(|e| invalid(key, e))?;
                    if id as usize >= n {
                        return Err(TokenizerError::InvalidKey {
                            key,
                            message: format!("token id {id} is outside the vocabulary of {n}"),
                        });
                    }
                    Ok(Some(id))
                }
            }
        };
        let flag = |key: &'static str| -> Result<Option<bool>> {
            md.get(key)
                .map(|v| v.to_bool().map_err(|e| invalid(key, e)))
                .transpose()
        };
        Ok(Self {
            pre: string(md.get("tokenizer.ggml.pre"), "tokenizer.ggml.pre")?,
            merges: string_array(md.get("tokenizer.ggml.merges"), "tokenizer.ggml.merges")?,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: string(md.get("tokenizer.chat_template"), "tokenizer.chat_template")?,
            model,
            tokens,
            kinds,
            scores,
        })
    }
}

/// candle attaches a captured backtrace to its errors when `RUST_BACKTRACE` is set; keep the cause.
fn without_backtrace(e: candle_core::Error) -> candle_core::Error {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        other => other,
    }
}

fn invalid(key: &'static str, e: candle_core::Error) -> TokenizerError {
    TokenizerError::KeyType {
        key,
        source: Box::new(without_backtrace(e)),
    }
}

fn check_len(got: usize, want: usize, key: &'static str) -> Result<()> {
    if got != want {
        return Err(TokenizerError::InvalidKey {
            key,
            message: format!("has {got} entries but the vocabulary has {want} tokens"),
        });
    }
    Ok(())
}

fn array<'a>(v: &'a Value, key: &'static str) -> Result<&'a Vec<Value>> {
    v.to_vec().map_err(|e| invalid(key, e))
}

fn string(v: Option<&Value>, key: &'static str) -> Result<Option<String>> {
    v.map(|v| v.to_string().cloned().map_err(|e| invalid(key, e)))
        .transpose()
}

fn string_array(v: Option<&Value>, key: &'static str) -> Result<Option<Vec<String>>> {
    let Some(v) = v else { return Ok(None) };
    array(v, key)?
        .iter()
        .map(|x| x.to_string().cloned().map_err(|e| invalid(key, e)))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
