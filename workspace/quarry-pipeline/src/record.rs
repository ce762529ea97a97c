//! Documents in, records out: what the sources produce, what the extractor answers, and the
//! typed reasons a document becomes a reject instead of a record.

use serde_json::{Map, Value};

use crate::config::{DocFields, ValueFormat};

/// Where a document came from: enough to find it again, and the key of effectively-once
/// delivery, `(source, partition, offset)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lineage {
    /// The Kafka topic, or the input file's location.
    pub source: String,
    /// The Kafka partition; `None` for datasets.
    pub partition: Option<i32>,
    /// The Kafka offset, or the line / row / file index inside the shard.
    pub offset: i64,
    /// Kafka message key.
    pub key: Option<Vec<u8>>,
    /// Kafka message timestamp, milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// Kafka headers as a JSON object (values as UTF-8, lossily), `None` when absent.
    pub headers: Option<String>,
}

impl Lineage {
    pub fn new(source: impl Into<String>, partition: Option<i32>, offset: i64) -> Self {
        Self {
            source: source.into(),
            partition,
            offset,
            key: None,
            timestamp_ms: None,
            headers: None,
        }
    }

    /// The default document id: `source:partition:offset` (or `source:offset`).
    pub fn default_id(&self) -> String {
        match self.partition {
            Some(p) => format!("{}:{}:{}", self.source, p, self.offset),
            None => format!("{}:{}", self.source, self.offset),
        }
    }
}

/// A document ready for the model.
#[derive(Debug, Clone)]
pub struct Document {
    pub id: String,
    pub text: String,
    /// The input's JSON fields (`doc` in the prompt template); empty for plain text.
    pub fields: Map<String, Value>,
    pub lineage: Lineage,
}

/// Why a document produced no record. Each becomes a rejects row with this cause and a detail.
#[derive(Debug, Clone, PartialEq)]
pub enum RejectCause {
    /// A Kafka message with no value (a tombstone): compacted topics use them to delete a key.
    Tombstone,
    /// The input bytes are not UTF-8.
    InvalidUtf8(String),
    /// No text to extract from.
    Empty,
    /// Larger than `batching.max_doc_bytes`.
    TooLarge { bytes: usize, limit: usize },
    /// JSON expected (value format or JSONL line) but the bytes are not a JSON object.
    NotJson(String),
    /// The JSON object lacks the configured text field, or it is not a string.
    MissingField(String),
    /// The prompt template failed for this document.
    Template(String),
    /// The engine refused or failed the request (prompt longer than the context, ...).
    Engine(String),
    /// The model stopped at `max_tokens` before the constraint was complete (only with
    /// `engine.close_within_budget = false`; with the budget, records close).
    Truncated,
    /// Refused before decoding: the schema's shortest record takes `shortest` tokens, more than
    /// `sampling.max_tokens`.
    BudgetTooSmall { shortest: usize, max_tokens: usize },
    /// The output is not JSON.
    InvalidJson(String),
    /// The output is JSON but breaks the schema.
    SchemaViolation(String),
    /// The record could not be encoded in the Arrow schema.
    Encoding(String),
    /// Accepted on a replay after a crash, but the accepted file the earlier run published does
    /// not hold it (decoding was not deterministic); kept here so it is neither lost nor doubled.
    ReplayMismatch,
}

impl RejectCause {
    /// The `cause` column: a short stable name to group by.
    pub fn name(&self) -> &'static str {
        match self {
            RejectCause::Tombstone => "tombstone",
            RejectCause::InvalidUtf8(_) => "invalid_utf8",
            RejectCause::Empty => "empty",
            RejectCause::TooLarge { .. } => "too_large",
            RejectCause::NotJson(_) => "not_json",
            RejectCause::MissingField(_) => "missing_field",
            RejectCause::Template(_) => "template",
            RejectCause::Engine(_) => "engine_error",
            RejectCause::Truncated => "truncated",
            RejectCause::BudgetTooSmall { .. } => "budget_too_small",
            RejectCause::InvalidJson(_) => "invalid_json",
            RejectCause::SchemaViolation(_) => "schema_violation",
            RejectCause::Encoding(_) => "encoding",
            RejectCause::ReplayMismatch => "replay_mismatch",
        }
    }

    /// The `detail` column: what exactly, and where.
    pub fn detail(&self) -> String {
        match self {
            RejectCause::InvalidUtf8(d)
            | RejectCause::NotJson(d)
            | RejectCause::MissingField(d)
            | RejectCause::Template(d)
            | RejectCause::Engine(d)
            | RejectCause::InvalidJson(d)
            | RejectCause::SchemaViolation(d)
            | RejectCause::Encoding(d) => d.clone(),
            RejectCause::Empty => "the document has no text".into(),
            RejectCause::Tombstone => {
                "the message has no value (a tombstone); source.tombstones = \"skip\" skips them"
                    .into()
            }
            RejectCause::TooLarge { bytes, limit } => {
                format!("{bytes} bytes, over batching.max_doc_bytes = {limit}")
            }
            RejectCause::ReplayMismatch => {
                "accepted on replay, but the earlier run's accepted file does not hold it".into()
            }
            RejectCause::Truncated => {
                "the output hit sampling.max_tokens before the schema was complete".into()
            }
            RejectCause::BudgetTooSmall {
                shortest,
                max_tokens,
            } => format!(
                "the schema's shortest record takes {shortest} tokens, over sampling.max_tokens = {max_tokens}: raise it to at least {shortest}"
            ),
        }
    }
}

/// What happened to one document.
#[derive(Debug, Clone)]
pub enum Outcome {
    Accepted {
        /// The validated record as compact JSON text: a file holds its records until it is
        /// published, and text takes a tenth of what a parsed value does (package records:
        /// about 0.5 KiB against 5 KiB).
        record: Box<str>,
        finish: String,
        stats: DocStats,
    },
    Rejected {
        cause: RejectCause,
        /// The model's output, when there was one.
        raw_output: Option<String>,
        finish: Option<String>,
        stats: DocStats,
    },
    /// Deliberately left out by configuration (a tombstone with `source.tombstones = "skip"`):
    /// no row in either dataset, counted as skipped, its offset covered by the file's range.
    Skipped { cause: RejectCause },
}

/// Per-document engine numbers, summed into the job's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DocStats {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub forced_tokens: u64,
}

/// A document that has left its source: either ready for the model or already rejected.
#[derive(Debug, Clone)]
pub struct Input {
    pub lineage: Lineage,
    /// The document's id when the input got far enough to have one (a JSON object with the id
    /// field), also for rejects.
    pub id: Option<String>,
    /// The first bytes of the raw input, lossily decoded, for the rejects row.
    pub preview: String,
    pub doc: Result<Document, RejectCause>,
}

/// Bytes of raw input kept in a rejects row.
pub const PREVIEW_BYTES: usize = 1024;

fn preview(bytes: &[u8]) -> String {
    let cut = bytes.len().min(PREVIEW_BYTES);
    String::from_utf8_lossy(&bytes[..cut]).into_owned()
}

/// An input of `bytes` bytes over the limit of `max_bytes`, of which only `start` (its first
/// bytes, at least [`PREVIEW_BYTES`] where it has them) was kept: what [`decode`] makes of it,
/// without the whole input in memory.
pub fn too_large(start: &[u8], bytes: usize, max_bytes: usize, lineage: Lineage) -> Input {
    debug_assert!(bytes > max_bytes);
    Input {
        preview: preview(start),
        lineage,
        id: None,
        doc: Err(RejectCause::TooLarge {
            bytes,
            limit: max_bytes,
        }),
    }
}

/// A Kafka message without a value: a tombstone, never a document.
pub fn tombstone(lineage: Lineage) -> Input {
    Input {
        lineage,
        id: None,
        preview: String::new(),
        doc: Err(RejectCause::Tombstone),
    }
}

/// Turns raw input bytes into a document, or the reason it cannot be one.
pub fn decode(
    bytes: &[u8],
    format: ValueFormat,
    fields: &DocFields,
    max_bytes: usize,
    lineage: Lineage,
) -> Input {
    let doc = decode_doc(bytes, format, fields, max_bytes, &lineage);
    let id = match &doc {
        Ok(d) => Some(d.id.clone()),
        Err(_) if format == ValueFormat::Json && bytes.len() <= max_bytes => {
            serde_json::from_slice::<Value>(bytes)
                .ok()
                .and_then(|v| id_field(&v, fields))
        }
        Err(_) => None,
    };
    Input {
        preview: preview(bytes),
        lineage,
        id,
        doc,
    }
}

fn decode_doc(
    bytes: &[u8],
    format: ValueFormat,
    fields: &DocFields,
    max_bytes: usize,
    lineage: &Lineage,
) -> Result<Document, RejectCause> {
    if bytes.len() > max_bytes {
        return Err(RejectCause::TooLarge {
            bytes: bytes.len(),
            limit: max_bytes,
        });
    }
    let s = std::str::from_utf8(bytes).map_err(|e| {
        RejectCause::InvalidUtf8(format!("invalid UTF-8 at byte {}", e.valid_up_to()))
    })?;
    // An empty value is `empty` in every format, never a JSON syntax error.
    if s.trim().is_empty() {
        return Err(RejectCause::Empty);
    }
    match format {
        ValueFormat::Text => Ok(Document {
            id: lineage.default_id(),
            text: s.to_string(),
            fields: Map::new(),
            lineage: lineage.clone(),
        }),
        ValueFormat::Json => {
            let v: Value =
                serde_json::from_str(s).map_err(|e| RejectCause::NotJson(e.to_string()))?;
            match v {
                Value::Object(map) => from_object(map, fields, lineage),
                other => Err(RejectCause::NotJson(format!(
                    "expected a JSON object, found {}",
                    json_kind(&other)
                ))),
            }
        }
    }
}

/// A document from a JSON object (a JSONL line, a JSON message, a Parquet row).
pub fn from_object(
    map: Map<String, Value>,
    fields: &DocFields,
    lineage: &Lineage,
) -> Result<Document, RejectCause> {
    let text = match map.get(&fields.text) {
        Some(Value::String(t)) => t.clone(),
        Some(other) => {
            return Err(RejectCause::MissingField(format!(
                "field `{}` is {}, not a string",
                fields.text,
                json_kind(other)
            )))
        }
        None => {
            return Err(RejectCause::MissingField(format!(
                "no field `{}`",
                fields.text
            )))
        }
    };
    if text.trim().is_empty() {
        return Err(RejectCause::Empty);
    }
    let id = match fields.id.as_ref().and_then(|f| map.get(f)) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => lineage.default_id(),
        Some(other) => other.to_string(),
    };
    Ok(Document {
        id,
        text,
        fields: map,
        lineage: lineage.clone(),
    })
}

fn id_field(v: &Value, fields: &DocFields) -> Option<String> {
    match v.get(fields.id.as_ref()?)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lin() -> Lineage {
        Lineage::new("docs", Some(3), 42)
    }

    #[test]
    fn bad_inputs_get_typed_causes() {
        let f = DocFields::default();
        let d = |b: &[u8], fmt| decode(b, fmt, &f, 100, lin()).doc;
        assert_eq!(
            d(b"\xff\xfe", ValueFormat::Text).unwrap_err().name(),
            "invalid_utf8"
        );
        assert_eq!(
            d(b"  \n", ValueFormat::Text).unwrap_err(),
            RejectCause::Empty
        );
        assert_eq!(
            d(&[b'a'; 101], ValueFormat::Text).unwrap_err().name(),
            "too_large"
        );
        assert_eq!(
            d(b"plain", ValueFormat::Json).unwrap_err().name(),
            "not_json"
        );
        assert_eq!(d(b"[1]", ValueFormat::Json).unwrap_err().name(), "not_json");
        // An empty value is `empty` in both formats; a missing value (tombstone) is its own cause.
        assert_eq!(d(b"", ValueFormat::Json).unwrap_err(), RejectCause::Empty);
        assert_eq!(
            d(b" \n", ValueFormat::Json).unwrap_err(),
            RejectCause::Empty
        );
        assert_eq!(d(b"", ValueFormat::Text).unwrap_err(), RejectCause::Empty);
        let t = tombstone(lin());
        assert_eq!(t.doc.unwrap_err().name(), "tombstone");
        assert_eq!(t.lineage, lin());
        assert_eq!(
            d(b"{\"x\":1}", ValueFormat::Json).unwrap_err().name(),
            "missing_field"
        );
        assert_eq!(
            d(b"{\"text\":2}", ValueFormat::Json).unwrap_err().name(),
            "missing_field"
        );
    }

    #[test]
    fn json_documents_keep_fields_and_ids() {
        let f = DocFields {
            text: "body".into(),
            id: Some("key".into()),
        };
        let doc = decode(
            br#"{"body":"hello","key":"k1","n":5}"#,
            ValueFormat::Json,
            &f,
            100,
            lin(),
        )
        .doc
        .unwrap();
        assert_eq!(doc.text, "hello");
        assert_eq!(doc.id, "k1");
        assert_eq!(doc.fields["n"], 5);
        let plain = decode(b"hello", ValueFormat::Text, &f, 100, lin())
            .doc
            .unwrap();
        assert_eq!(plain.id, "docs:3:42");
    }
}
