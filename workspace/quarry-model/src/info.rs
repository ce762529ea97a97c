//! Model facts read from GGUF metadata and tensor headers, without loading any weights.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{without_backtrace, ModelError, Result};

/// What a GGUF file says about its model. Reading it touches only the header.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelInfo {
    /// `general.architecture` (`llama`, `gemma3`, …).
    pub architecture: String,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// GGUF format version (1, 2 or 3); 0 for a checkpoint folder.
    pub gguf_version: u32,
    pub file_bytes: u64,
    pub context_length: Option<u64>,
    pub embedding_length: Option<u64>,
    pub block_count: Option<u64>,
    pub feed_forward_length: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    pub rope_freq_base: Option<f64>,
    /// The RoPE scaling in words ([`crate::LlamaConfig::rope_scaling_summary`]), where there is
    /// one and quarry reads the architecture.
    pub rope_scaling: Option<String>,
    pub rms_norm_eps: Option<f64>,
    /// The positions a local layer attends over (Gemma 3's window, Mistral 7B v0.1's), if any.
    pub sliding_window: Option<u64>,
    /// How many layers are local; the others attend over every position. Known where quarry
    /// reads the architecture ([`ModelInfo::from_model`]), else `None`.
    pub sliding_layers: Option<u64>,
    pub tensor_count: usize,
    pub parameter_count: u64,
    /// Tensor count per ggml dtype (`Q4_1`, `Q6K`, `F32`, …).
    pub tensor_dtypes: BTreeMap<String, usize>,
}

impl ModelInfo {
    /// Reads the header of the GGUF file at `path`.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self> {
        let (content, file_bytes, _) = read_gguf(path.as_ref())?;
        Self::from_content(&content, file_bytes)
    }

    /// Builds the summary from already-read GGUF content; `file_bytes` is the file's length, used to
    /// check that every tensor's data is present.
    pub fn from_content(content: &Content, file_bytes: u64) -> Result<Self> {
        let md = &content.metadata;
        let architecture = architecture(content)?;
        let arch_key = |k: &str| format!("{architecture}.{k}");
        let uint = |k: &str| -> Result<Option<u64>> {
            let key = arch_key(k);
            md.get(&key)
                .map(|v| as_u64(v).map_err(|e| invalid(&key, e)))
                .transpose()
        };
        let float = |k: &str| -> Result<Option<f64>> {
            let key = arch_key(k);
            md.get(&key)
                .map(|v| as_f64(v).map_err(|e| invalid(&key, e)))
                .transpose()
        };
        let mut tensor_dtypes = BTreeMap::new();
        let mut parameter_count = 0u64;
        // The tensor whose data ends last, so a truncated file is reported the same way every time.
        let mut last: Option<(u64, &String)> = None;
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.elem_count() as u64;
            let bytes =
                elems / info.ggml_dtype.block_size() as u64 * info.ggml_dtype.type_size() as u64;
            let end = content.tensor_data_offset + info.offset + bytes;
            if last.is_none_or(|(e, n)| (end, name) > (e, n)) {
                last = Some((end, name));
            }
            *tensor_dtypes
                .entry(format!("{:?}", info.ggml_dtype))
                .or_default() += 1;
            parameter_count += info.shape.elem_count() as u64;
        }
        if let Some((needed, tensor)) = last.filter(|(end, _)| *end > file_bytes) {
            return Err(ModelError::Truncated {
                tensor: tensor.clone(),
                needed,
                file_bytes,
            });
        }
        use candle_core::quantized::gguf_file::VersionedMagic as M;
        Ok(Self {
            name: md
                .get("general.name")
                .and_then(|v| v.to_string().ok().cloned()),
            gguf_version: match content.magic {
                M::GgufV1 => 1,
                M::GgufV2 => 2,
                M::GgufV3 => 3,
            },
            file_bytes,
            context_length: uint("context_length")?,
            embedding_length: uint("embedding_length")?,
            block_count: uint("block_count")?,
            feed_forward_length: uint("feed_forward_length")?,
            head_count: uint("attention.head_count")?,
            head_count_kv: uint("attention.head_count_kv")?,
            rope_freq_base: float("rope.freq_base")?,
            rope_scaling: None,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
            sliding_window: uint("attention.sliding_window")?,
            sliding_layers: None,
            tensor_count: content.tensor_infos.len(),
            parameter_count,
            tensor_dtypes,
            architecture,
        })
    }
}

/// Opens a GGUF file and reads its header: the content, the file's length, and the reader
/// positioned for loading tensors.
pub(crate) fn read_gguf(path: &Path) -> Result<(Content, u64, std::io::BufReader<std::fs::File>)> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let file_bytes = std::fs::metadata(path).map_err(io)?.len();
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let content = Content::read(&mut file).map_err(|e| ModelError::Gguf {
        path: path.to_owned(),
        source: Box::new(crate::error::without_backtrace(e)),
    })?;
    Ok((content, file_bytes, file))
}

/// `general.architecture`, which names the prefix of every other model key.
pub(crate) fn architecture(content: &Content) -> Result<String> {
    match content.metadata.get("general.architecture") {
        Some(v) => Ok(v
            .to_string()
            .map_err(|e| invalid("general.architecture", e))?
            .clone()),
        None => Err(ModelError::MissingKey {
            key: "general.architecture".into(),
        }),
    }
}

pub(crate) fn invalid(key: &str, e: candle_core::Error) -> ModelError {
    ModelError::KeyType {
        key: key.to_owned(),
        source: Box::new(without_backtrace(e)),
    }
}

pub(crate) fn as_u64(v: &Value) -> candle_core::Result<u64> {
    match v {
        Value::U8(x) => Ok(*x as u64),
        Value::U16(x) => Ok(*x as u64),
        Value::U32(x) => Ok(*x as u64),
        Value::U64(x) => Ok(*x),
        Value::I8(x) if *x >= 0 => Ok(*x as u64),
        Value::I16(x) if *x >= 0 => Ok(*x as u64),
        Value::I32(x) if *x >= 0 => Ok(*x as u64),
        Value::I64(x) if *x >= 0 => Ok(*x as u64),
        other => candle_core::bail!("expected a non-negative integer, found {other:?}"),
    }
}

pub(crate) fn as_f64(v: &Value) -> candle_core::Result<f64> {
    match v {
        Value::F32(x) => Ok(*x as f64),
        Value::F64(x) => Ok(*x),
        other => as_u64(other).map(|x| x as f64),
    }
}
