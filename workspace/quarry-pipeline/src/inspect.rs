//! What a published Parquet file holds, for `quarry inspect`: footer facts, the schema, counts of
//! accepted and rejected rows (by finish reason or reject cause), offset ranges per source and
//! partition, and rows as JSON. It reads files through the same object-store locations the jobs
//! write to, so `quarry inspect s3://bucket/out/` works like a local folder.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::ArrowError;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{FormatError, InputProblem};
use crate::store::Location;
use crate::PipelineError;

/// One Parquet file, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct FileSummary {
    pub path: String,
    /// The name under the inspected folder or prefix (a shard's or range's file name): an
    /// accepted file and its rejects marker share it.
    pub name: String,
    pub bytes: usize,
    pub rows: usize,
    pub row_groups: usize,
    /// The first column chunk's codec, e.g. `ZSTD` (quarry writes every column with the same one).
    pub compression: Option<String>,
    pub created_by: Option<String>,
    /// `accepted`, `rejects`, or `unknown` for a file quarry did not write.
    pub dataset: String,
    /// The footer's key/value metadata (quarry writes `quarry.*` keys).
    pub metadata: BTreeMap<String, String>,
    /// Top-level columns: name, Arrow type, nullable.
    pub schema: Vec<(String, String, bool)>,
    /// Accepted rows by `_finish_reason`, or rejected rows by `cause`.
    pub counts: BTreeMap<String, usize>,
    pub offsets: Vec<OffsetRange>,
    /// Rows as JSON objects (the first `sample`, or all).
    pub sample: Vec<Value>,
}

/// The offsets one file holds for one source and partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OffsetRange {
    pub source: String,
    pub partition: Option<i32>,
    pub first: i64,
    pub last: i64,
    pub rows: usize,
}

/// How many rows to keep as JSON.
#[derive(Debug, Clone, Copy)]
pub enum Sample {
    First(usize),
    All,
}

/// Summarises the Parquet file `bytes` (named `path` in messages).
pub fn summarize(path: &str, bytes: Bytes, sample: Sample) -> Result<FileSummary, PipelineError> {
    let bad = |source: FormatError| PipelineError::Parquet {
        location: path.to_string(),
        source,
    };
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .map_err(|e| bad(e.into()))?;
    let (mut summary, arrow) = from_footer(path, bytes.len(), Arc::new(footer))?;
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, arrow)
        .build()
        .map_err(|e| bad(e.into()))?;
    let mut ranges: BTreeMap<(String, Option<i32>), (i64, i64, usize)> = BTreeMap::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.into()))?;
        count(&batch, &mut summary.counts);
        offsets(&batch, &mut ranges);
        let room = match sample {
            Sample::All => batch.num_rows(),
            Sample::First(n) => n.saturating_sub(summary.sample.len()),
        };
        if room > 0 {
            let part = batch.slice(0, room.min(batch.num_rows()));
            summary.sample.extend(to_json(&part).map_err(bad)?);
        }
    }
    summary.offsets = ranges
        .into_iter()
        .map(|((source, partition), (first, last, rows))| OffsetRange {
            source,
            partition,
            first,
            last,
            rows,
        })
        .collect();
    Ok(summary)
}

/// What a file's footer says (`meta`, of a file of `size` bytes named `path`): everything but
/// the counts, offsets and sample rows, and the Arrow view of the file to read them with.
fn from_footer(
    path: &str,
    size: usize,
    meta: Arc<ParquetMetaData>,
) -> Result<(FileSummary, ArrowReaderMetadata), PipelineError> {
    let bad = |source: FormatError| PipelineError::Parquet {
        location: path.to_string(),
        source,
    };
    let arrow = ArrowReaderMetadata::try_new(Arc::clone(&meta), ArrowReaderOptions::new())
        .map_err(|e| bad(e.into()))?;
    let file_meta = meta.file_metadata();
    let metadata: BTreeMap<String, String> = file_meta
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter(|kv| !kv.key.starts_with("ARROW:"))
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    let compression = meta
        .row_groups()
        .first()
        .and_then(|rg| rg.columns().first())
        // The codec only: Parquet footers do not record the compression level.
        .map(|c| {
            let codec = c.compression().to_string();
            codec.split('(').next().unwrap_or_default().to_string()
        });
    let columns = arrow
        .schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
        .collect();
    let dataset = metadata
        .get("quarry.dataset")
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let summary = FileSummary {
        path: path.to_string(),
        name: path.rsplit('/').next().unwrap_or(path).to_string(),
        bytes: size,
        rows: file_meta.num_rows() as usize,
        row_groups: meta.num_row_groups(),
        compression,
        created_by: file_meta.created_by().map(str::to_string),
        dataset,
        metadata,
        schema: columns,
        counts: BTreeMap::new(),
        offsets: Vec::new(),
        sample: Vec::new(),
    };
    Ok((summary, arrow))
}

/// Rows by `_finish_reason` (accepted files) or `cause` (rejects files).
fn count(batch: &RecordBatch, counts: &mut BTreeMap<String, usize>) {
    let Some(col) = batch
        .column_by_name("cause")
        .or_else(|| batch.column_by_name("_finish_reason"))
    else {
        return;
    };
    let Some(strings) = col.as_string_opt::<i32>() else {
        return;
    };
    for i in 0..strings.len() {
        let key = if strings.is_null(i) {
            "(null)"
        } else {
            strings.value(i)
        };
        *counts.entry(key.to_string()).or_default() += 1;
    }
}

fn offsets(batch: &RecordBatch, ranges: &mut BTreeMap<(String, Option<i32>), (i64, i64, usize)>) {
    let (Some(source), Some(offset)) = (
        batch
            .column_by_name("_source")
            .and_then(|c| c.as_string_opt::<i32>()),
        batch
            .column_by_name("_offset")
            .and_then(|c| c.as_primitive_opt::<Int64Type>()),
    ) else {
        return;
    };
    let partition = batch
        .column_by_name("_partition")
        .and_then(|c| c.as_primitive_opt::<Int32Type>());
    for i in 0..batch.num_rows() {
        if source.is_null(i) || offset.is_null(i) {
            continue;
        }
        let p = partition.filter(|p| !p.is_null(i)).map(|p| p.value(i));
        let o = offset.value(i);
        let e = ranges
            .entry((source.value(i).to_string(), p))
            .or_insert((o, o, 0));
        e.0 = e.0.min(o);
        e.1 = e.1.max(o);
        e.2 += 1;
    }
}

/// Rows as JSON objects (arrow-json: structs as objects, lists as arrays, binary as hex,
/// timestamps as RFC 3339 text, nulls kept).
fn to_json(batch: &RecordBatch) -> Result<Vec<Value>, FormatError> {
    let batch = &utc_as_offset(batch)?;
    let mut buf = Vec::new();
    let mut w = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::JsonArray>(&mut buf);
    w.write(batch)?;
    w.finish()?;
    drop(w);
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<Map<String, Value>> = serde_json::from_slice(&buf)?;
    Ok(rows.into_iter().map(Value::Object).collect())
}

/// The same batch with `UTC` timestamp zones spelled `+00:00`: the same instants, in the form
/// arrow-json formats without a time-zone database.
fn utc_as_offset(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    use arrow_schema::{DataType, Schema};
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        let (field, col) = match f.data_type() {
            DataType::Timestamp(unit, Some(tz)) if tz.as_ref() == "UTC" => {
                let to = DataType::Timestamp(*unit, Some("+00:00".into()));
                let col = arrow_cast::cast(c, &to)?;
                (f.as_ref().clone().with_data_type(to), col)
            }
            _ => (f.as_ref().clone(), c.clone()),
        };
        fields.push(field);
        columns.push(col);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// One Parquet file a target names: how it is shown, where it is, and its size.
pub struct Found {
    pub shown: String,
    pub loc: Arc<Location>,
    pub path: object_store::path::Path,
    pub size: u64,
}

/// The Parquet files a command-line target names: a `.parquet` file, or every `.parquet` file
/// under a folder or object-store prefix (sorted), each with its bytes read on demand.
pub fn files(target: &str) -> Result<Vec<Found>, PipelineError> {
    let local = crate::store::local_path(target);
    if local.is_some_and(|p| !p.exists()) {
        return Err(PipelineError::Input {
            location: target.to_string(),
            source: InputProblem::NotFound,
        });
    }
    let single = local.map_or(target.ends_with(".parquet"), |p| p.is_file());
    if single {
        let (dir, name) = match target.rsplit_once('/') {
            Some((d, n)) if !d.is_empty() && !d.ends_with(':') && !d.ends_with('/') => (d, n),
            _ => (".", target),
        };
        let loc = Arc::new(Location::open_input(dir).or_else(|_| Location::open(dir))?);
        let path = loc.path(name);
        let size = loc.size(&path)?;
        return Ok(vec![Found {
            shown: target.to_string(),
            loc,
            path,
            size,
        }]);
    }
    let loc = Arc::new(if local.is_some() {
        Location::open_input(target)?
    } else {
        Location::open(target)?
    });
    let base = target.trim_end_matches('/');
    Ok(loc
        .list("")?
        .into_iter()
        .filter(|m| m.location.as_ref().ends_with(".parquet"))
        .map(|m| Found {
            shown: format!("{base}/{}", loc.relative(&m.location)),
            loc: loc.clone(),
            path: m.location,
            size: m.size,
        })
        .collect())
}

/// What a set of files adds up to: for the output and rejects prefixes of a job, the job.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub files: usize,
    pub accepted: usize,
    pub rejected: usize,
    /// Rejected rows by cause.
    pub causes: BTreeMap<String, usize>,
    /// Dataset jobs: the shards whose rejects marker is among the files (each shard once, however
    /// many workers ran it).
    pub shards_published: usize,
    /// The shards the job's input listing held, as its files record it (`quarry.shards_listed`);
    /// `None` when no file records it (Kafka ranges, files of older versions).
    pub shards_listed: Option<usize>,
    /// When files record different listings (the input changed between workers or runs): the
    /// smallest and largest.
    pub listings_differ: Option<(usize, usize)>,
    /// The worker slices (`index/count`) whose files are here.
    pub slices: std::collections::BTreeSet<String>,
    /// Accepted files whose rejects marker is not among the files: a publish in progress, a crash
    /// between its two halves (the next run completes it), or only the output prefix inspected.
    pub unmarked: Vec<String>,
}

impl Totals {
    pub fn of(files: &[FileSummary]) -> Totals {
        let mut t = Totals {
            files: files.len(),
            ..Totals::default()
        };
        let mut markers = std::collections::BTreeSet::new();
        let mut listed = std::collections::BTreeSet::new();
        for f in files {
            match f.dataset.as_str() {
                "accepted" => t.accepted += f.rows,
                "rejects" => {
                    t.rejected += f.rows;
                    for (cause, n) in &f.counts {
                        *t.causes.entry(cause.clone()).or_default() += n;
                    }
                    markers.insert(f.name.as_str());
                }
                _ => {}
            }
            if let Some(n) = f.metadata.get("quarry.shards_listed") {
                listed.extend(n.parse::<usize>().ok());
                if f.dataset == "rejects" {
                    t.shards_published += 1;
                }
            }
            t.slices
                .extend(f.metadata.get("quarry.shard_slice").cloned());
        }
        t.unmarked = files
            .iter()
            .filter(|f| f.dataset == "accepted" && !markers.contains(f.name.as_str()))
            .map(|f| f.path.clone())
            .collect();
        t.shards_listed = listed.last().copied();
        if listed.len() > 1 {
            t.listings_differ = Some((
                listed.first().copied().unwrap_or(0),
                listed.last().copied().unwrap_or(0),
            ));
        }
        t
    }

    /// Every listed shard has its marker.
    pub fn complete(&self) -> Option<bool> {
        self.shards_listed
            .map(|n| self.shards_published >= n && self.unmarked.is_empty())
    }
}

/// [`files`], where finding none is an error naming `target`.
fn some_files(target: &str) -> Result<Vec<Found>, PipelineError> {
    let found = files(target)?;
    if found.is_empty() {
        return Err(PipelineError::Input {
            location: target.to_string(),
            source: InputProblem::NoParquetFiles,
        });
    }
    Ok(found)
}

/// Reads and summarises every file `target` names.
pub fn inspect(target: &str, sample: Sample) -> Result<Vec<FileSummary>, PipelineError> {
    some_files(target)?
        .into_iter()
        .map(
            |Found {
                 shown, loc, path, ..
             }| {
                let mut f = summarize(&shown, loc.read(&path)?, sample)?;
                f.name = loc.relative(&path);
                Ok(f)
            },
        )
        .collect()
}

/// What [`Totals::of`] needs of every file `target` names, without reading accepted files whole:
/// their footers (ranged requests from the end) hold their rows and the job's metadata. A
/// rejects file is read whole for its counts by cause; files quarry did not write give only
/// their footers. So `quarry inspect --totals` over a job's output costs one ranged read of at
/// most 64 KiB an accepted file (more only for a longer footer), not the output.
pub fn inspect_totals(target: &str) -> Result<Vec<FileSummary>, PipelineError> {
    some_files(target)?
        .into_iter()
        .map(
            |Found {
                 shown,
                 loc,
                 path,
                 size,
             }| {
                let bad = |e: parquet::errors::ParquetError| PipelineError::Parquet {
                    location: shown.clone(),
                    source: e.into(),
                };
                let footer =
                    crate::dataset::read::parquet_footer(|r| loc.read_range(&path, r), size, &bad)?;
                let (mut f, _) = from_footer(&shown, size as usize, Arc::new(footer))?;
                if f.dataset == "rejects" {
                    f = summarize(&shown, loc.read(&path)?, Sample::First(0))?;
                }
                f.name = loc.relative(&path);
                Ok(f)
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::RecordShape;
    use crate::encode::{accepted_batch, to_parquet, FileContext};
    use crate::record::Lineage;
    use serde_json::json;

    #[test]
    fn summary_counts_offsets_and_rows() {
        let shape = RecordShape::derive(&json!({
            "type": "object", "required": ["n"],
            "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}
        }))
        .unwrap();
        let ctx = FileContext {
            pipeline: "t".into(),
            model: "m".into(),
            schema_sha256: "00".into(),
            extracted_at_us: 1,
        };
        let rows: Vec<_> = (0..5i64)
            .map(|i| crate::encode::AcceptedRow {
                lineage: Lineage::new("topic", Some((i % 2) as i32), 10 + i),
                doc_id: format!("d{i}"),
                finish: if i == 4 {
                    "stop"
                } else {
                    "constraint_complete"
                }
                .into(),
                record: json!({"n": i, "tags": ["a"]}).to_string().into(),
            })
            .collect();
        let (batch, moved) = accepted_batch(&shape, &ctx, rows);
        assert!(moved.is_empty());
        let bytes = to_parquet(
            &batch,
            &[("quarry.dataset".into(), "accepted".into())],
            2,
            3,
        )
        .unwrap();
        let s = summarize("x.parquet", bytes.clone(), Sample::First(2)).unwrap();
        assert_eq!(
            (s.rows, s.row_groups, s.dataset.as_str()),
            (5, 3, "accepted")
        );
        assert_eq!(s.compression.as_deref(), Some("ZSTD"));
        assert_eq!(s.counts["constraint_complete"], 4);
        assert_eq!(s.counts["stop"], 1);
        assert_eq!(
            s.offsets,
            vec![
                OffsetRange {
                    source: "topic".into(),
                    partition: Some(0),
                    first: 10,
                    last: 14,
                    rows: 3
                },
                OffsetRange {
                    source: "topic".into(),
                    partition: Some(1),
                    first: 11,
                    last: 13,
                    rows: 2
                },
            ]
        );
        assert_eq!(s.sample.len(), 2);
        assert_eq!(s.sample[1]["n"], 1);
        assert_eq!(s.sample[1]["tags"], json!(["a"]));
        assert_eq!(s.sample[1]["_doc_id"], "d1");
        let all = summarize("x.parquet", bytes, Sample::All).unwrap();
        assert_eq!(all.sample.len(), 5);
        let err = summarize("bad.parquet", Bytes::from_static(b"nope"), Sample::All).unwrap_err();
        assert!(err.to_string().contains("bad.parquet"), "{err}");
    }
}
