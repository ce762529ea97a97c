//! Rows to Arrow record batches to Parquet bytes (zstd, row groups sized by config, key/value
//! metadata). Nothing here touches storage; [`crate::store`] publishes the bytes.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
    TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use crate::columns::{rejects_schema, RecordShape};
use crate::error::FormatError;
use crate::record::{Lineage, RejectCause};

/// What every row of one file shares.
#[derive(Debug, Clone)]
pub struct FileContext {
    pub pipeline: String,
    pub model: String,
    pub schema_sha256: String,
    /// Microseconds since the epoch.
    pub extracted_at_us: i64,
}

/// An accepted record with its lineage.
#[derive(Debug, Clone)]
pub struct AcceptedRow {
    pub lineage: Lineage,
    pub doc_id: String,
    pub finish: String,
    /// The record as JSON text ([`crate::record::Outcome::Accepted`]).
    pub record: Box<str>,
}

/// Records parsed and conformed at a time while a file is encoded; the others stay text, so
/// encoding a file of many records holds this many parsed values at most.
const CONFORM_ROWS: usize = 1024;

/// A reject with its lineage.
#[derive(Debug, Clone)]
pub struct RejectRow {
    pub lineage: Lineage,
    pub doc_id: String,
    pub finish: Option<String>,
    pub cause: RejectCause,
    pub raw_output: Option<String>,
    pub input_preview: String,
}

/// Lineage columns for `rows`.
fn lineage_arrays<'a>(
    ctx: &FileContext,
    rows: impl Iterator<Item = (&'a Lineage, &'a str, Option<&'a str>)>,
) -> Vec<ArrayRef> {
    let mut source = StringBuilder::new();
    let mut partition = Int32Builder::new();
    let mut offset = Int64Builder::new();
    let mut doc_id = StringBuilder::new();
    let mut model = StringBuilder::new();
    let mut sha = StringBuilder::new();
    let mut finish = StringBuilder::new();
    let mut at = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut key = BinaryBuilder::new();
    let mut ts = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let mut headers = StringBuilder::new();
    for (l, id, fin) in rows {
        source.append_value(&l.source);
        partition.append_option(l.partition);
        offset.append_value(l.offset);
        doc_id.append_value(id);
        model.append_value(&ctx.model);
        sha.append_value(&ctx.schema_sha256);
        finish.append_option(fin);
        at.append_value(ctx.extracted_at_us);
        key.append_option(l.key.as_deref());
        ts.append_option(l.timestamp_ms);
        headers.append_option(l.headers.as_deref());
    }
    vec![
        Arc::new(source.finish()),
        Arc::new(partition.finish()),
        Arc::new(offset.finish()),
        Arc::new(doc_id.finish()),
        Arc::new(model.finish()),
        Arc::new(sha.finish()),
        Arc::new(finish.finish()),
        Arc::new(at.finish()),
        Arc::new(key.finish()),
        Arc::new(ts.finish()),
        Arc::new(headers.finish()),
    ]
}

/// Decodes records into the record columns with arrow-json, each parsed and conformed to the
/// columns [`CONFORM_ROWS`] at a time.
fn record_arrays(shape: &RecordShape, rows: &[AcceptedRow]) -> Result<Vec<ArrayRef>, ArrowError> {
    let schema = shape.record_schema();
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.len().max(1))
        .with_strict_mode(true)
        .build_decoder()?;
    for chunk in rows.chunks(CONFORM_ROWS) {
        let conformed = chunk
            .iter()
            .map(|r| {
                serde_json::from_str(&r.record)
                    .map(|v| shape.row(v))
                    .map_err(|e| ArrowError::JsonError(format!("not JSON: {e}")))
            })
            .collect::<Result<Vec<Value>, _>>()?;
        decoder.serialize(&conformed)?;
    }
    match decoder.flush()? {
        Some(batch) => Ok(batch.columns().to_vec()),
        None => Ok(RecordBatch::new_empty(schema).columns().to_vec()),
    }
}

/// The accepted batch. A record the Arrow schema cannot hold (which validation should already
/// have excluded) is moved out and returned with its reason, to become a reject.
pub fn accepted_batch(
    shape: &RecordShape,
    ctx: &FileContext,
    rows: Vec<AcceptedRow>,
) -> (RecordBatch, Vec<(AcceptedRow, String)>) {
    let (rows, mut columns, failed) = match record_arrays(shape, &rows) {
        Ok(columns) => (rows, columns, Vec::new()),
        Err(_) => {
            // Find the rows at fault one by one; the rest are kept.
            let mut keep = Vec::new();
            let mut failed = Vec::new();
            for row in rows {
                match record_arrays(shape, std::slice::from_ref(&row)) {
                    Ok(_) => keep.push(row),
                    Err(e) => failed.push((row, e.to_string())),
                }
            }
            let columns =
                record_arrays(shape, &keep).expect("rows that decoded alone decode together");
            (keep, columns, failed)
        }
    };
    columns.extend(lineage_arrays(
        ctx,
        rows.iter()
            .map(|r| (&r.lineage, r.doc_id.as_str(), Some(r.finish.as_str()))),
    ));
    let batch = RecordBatch::try_new(shape.accepted_schema(), columns)
        .expect("columns are built from the schema they are checked against");
    (batch, failed)
}

/// The rejects batch.
pub fn rejects_batch(ctx: &FileContext, rows: &[RejectRow]) -> RecordBatch {
    let mut columns = lineage_arrays(
        ctx,
        rows.iter()
            .map(|r| (&r.lineage, r.doc_id.as_str(), r.finish.as_deref())),
    );
    let mut cause = StringBuilder::new();
    let mut detail = StringBuilder::new();
    let mut raw = StringBuilder::new();
    let mut preview = StringBuilder::new();
    for r in rows {
        cause.append_value(r.cause.name());
        detail.append_value(r.cause.detail());
        raw.append_option(r.raw_output.as_deref());
        preview.append_value(&r.input_preview);
    }
    columns.push(Arc::new(cause.finish()));
    columns.push(Arc::new(detail.finish()));
    columns.push(Arc::new(raw.finish()));
    columns.push(Arc::new(preview.finish()));
    RecordBatch::try_new(rejects_schema(), columns).expect("rejects columns match their schema")
}

/// Parquet file bytes for one batch, with zstd, `row_group_rows` rows per group, and `metadata`
/// as the footer's key/value metadata.
pub fn to_parquet(
    batch: &RecordBatch,
    metadata: &[(String, String)],
    row_group_rows: usize,
    zstd_level: i32,
) -> Result<Bytes, FormatError> {
    let level = ZstdLevel::try_new(zstd_level)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_key_value_metadata(Some(
            metadata
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
                .collect(),
        ))
        .build();
    let schema: SchemaRef = batch.schema();
    let mut buf = Vec::with_capacity(4096);
    let mut w = ArrowWriter::try_new(&mut buf, schema, Some(props))?;
    // Row group by row group, so the `mid_write` crash point falls inside a file.
    let step = row_group_rows.max(1);
    let mut at = 0;
    while at < batch.num_rows() {
        let n = step.min(batch.num_rows() - at);
        w.write(&batch.slice(at, n))?;
        w.flush()?;
        at += n;
        if at < batch.num_rows() {
            crate::faults::crash_point(crate::faults::CrashPoint::MidWrite);
        }
    }
    w.close()?;
    Ok(Bytes::from(buf))
}

/// The `_offset` values of a published Parquet file (used to reconcile a half-published range).
pub fn read_offsets(bytes: Bytes) -> Result<Vec<i64>, FormatError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let idx = reader
        .schema()
        .index_of("_offset")
        .map_err(|_| FormatError::MissingColumn("_offset"))?;
    let mask = parquet::arrow::ProjectionMask::roots(reader.parquet_schema(), [idx]);
    let mut out = Vec::new();
    for batch in reader.with_projection(mask).build()? {
        let batch = batch?;
        out.extend(
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> FileContext {
        FileContext {
            pipeline: "t".into(),
            model: "m".into(),
            schema_sha256: "00".into(),
            extracted_at_us: 1,
        }
    }

    #[test]
    fn unencodable_rows_move_out_and_the_rest_stay() {
        let shape = RecordShape::derive(&json!({
            "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}
        }))
        .unwrap();
        let row = |i: i64, v: Value| AcceptedRow {
            lineage: Lineage::new("t", Some(0), i),
            doc_id: i.to_string(),
            finish: "constraint_complete".into(),
            record: v.to_string().into(),
        };
        let rows = vec![
            row(0, json!({"n": 1})),
            row(1, json!({"n": "x"})),
            row(2, json!({"n": 3})),
        ];
        let (batch, failed) = accepted_batch(&shape, &ctx(), rows);
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0.lineage.offset, 1);
        let bytes = to_parquet(&batch, &[("k".into(), "v".into())], 1, 3).unwrap();
        assert_eq!(read_offsets(bytes).unwrap(), vec![0, 2]);
    }

    #[test]
    fn records_over_several_conform_chunks_keep_their_order_and_their_faults() {
        let shape = RecordShape::derive(&json!({
            "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}
        }))
        .unwrap();
        let rows: Vec<AcceptedRow> = (0..2 * CONFORM_ROWS as i64 + 7)
            .map(|i| AcceptedRow {
                lineage: Lineage::new("t", Some(0), i),
                doc_id: i.to_string(),
                finish: "constraint_complete".into(),
                record: match i {
                    1500 => json!({"n": "x"}).to_string().into(),
                    2000 => "{\"n\": 2".into(),
                    _ => json!({ "n": i * 10 }).to_string().into(),
                },
            })
            .collect();
        let total = rows.len() as i64;
        let (batch, failed) = accepted_batch(&shape, &ctx(), rows);
        let moved: Vec<(i64, &str)> = failed
            .iter()
            .map(|(r, _)| (r.lineage.offset, &*r.record))
            .collect();
        assert_eq!(moved, [(1500, "{\"n\":\"x\"}"), (2000, "{\"n\": 2")]);
        assert!(failed[1].1.contains("not JSON"), "{}", failed[1].1);
        let n = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        let want: Vec<i64> = (0..total)
            .filter(|i| ![1500, 2000].contains(i))
            .map(|i| i * 10)
            .collect();
        assert_eq!(n.values().to_vec(), want);
    }
}
