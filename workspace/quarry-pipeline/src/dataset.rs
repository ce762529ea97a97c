//! Dataset jobs (`quarry extract`): every input file under a prefix becomes shards, each shard one
//! output file. A shard whose rejects marker is already published is skipped, so a rerun resumes
//! where a crash left off.
//!
//! Inputs: JSONL (each file a shard, each line a document, `_offset` = line index), plain text
//! (one document per file, `text_shard_files` files per shard, `_offset` = index in the shard)
//! and Parquet with a string text column (each file a shard, `_offset` = row index).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use object_store::path::Path;

use crate::config::{DatasetSource, InputFormat, PipelineConfig, SourceConfig, ValueFormat};
use crate::error::PipelineError;
use crate::extract::Extractor;
use crate::flow::{FileReport, Flow, Publisher};
use crate::metrics::Metrics;
use crate::record::{decode, Input, Lineage};
use crate::shutdown::Shutdown;
use crate::store::Location;

/// A unit of work and of output: one output file name and the input objects it reads.
#[derive(Debug, Clone)]
pub struct Shard {
    pub name: String,
    pub files: Vec<Path>,
}

/// What a dataset job did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct JobSummary {
    pub shards: usize,
    pub shards_skipped: usize,
    pub shards_done: usize,
    pub consumed: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub causes: BTreeMap<String, u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub forced_tokens: u64,
    pub wall_s: f64,
    /// Of `wall_s`, the time spent reading shards and encoding and publishing files (the
    /// pipeline's own work; validation runs per document between engine steps, in microseconds).
    pub io_s: f64,
    /// Stopped by a signal before every shard was done.
    pub interrupted: bool,
    pub files: Vec<String>,
}

impl JobSummary {
    pub fn add(&mut self, r: &FileReport) {
        self.shards_done += 1;
        self.consumed += r.consumed;
        self.accepted += r.accepted;
        self.rejected += r.rejected;
        for (c, n) in &r.causes {
            *self.causes.entry(c.to_string()).or_default() += n;
        }
        self.prompt_tokens += r.stats.prompt_tokens;
        self.cached_tokens += r.stats.cached_tokens;
        self.output_tokens += r.stats.output_tokens;
        self.forced_tokens += r.stats.forced_tokens;
        self.files.push(r.name.clone());
    }
}

/// Lists the shards of a dataset, in name order.
pub fn shards(input: &Location, src: &DatasetSource) -> Result<Vec<Shard>, PipelineError> {
    let objects = input.list("")?;
    let visible = objects.into_iter().map(|m| m.location).filter(|p| {
        let rel = input.relative(p);
        !rel.split('/')
            .any(|part| part.starts_with('.') || part.starts_with('_'))
    });
    let with_ext = |p: &Path, exts: &[&str]| p.extension().is_some_and(|e| exts.contains(&e));
    let renamed = |p: &Path| {
        let rel = input.relative(p);
        match rel.rsplit_once('.') {
            Some((stem, _)) => format!("{stem}.parquet"),
            None => format!("{rel}.parquet"),
        }
    };
    Ok(match src.format {
        InputFormat::Jsonl => visible
            .filter(|p| with_ext(p, &["jsonl", "ndjson", "json"]))
            .map(|p| Shard {
                name: renamed(&p),
                files: vec![p],
            })
            .collect(),
        InputFormat::Parquet => visible
            .filter(|p| with_ext(p, &["parquet"]))
            .map(|p| Shard {
                name: renamed(&p),
                files: vec![p],
            })
            .collect(),
        InputFormat::Text => {
            let files: Vec<Path> = visible.collect();
            files
                .chunks(src.text_shard_files)
                .enumerate()
                .map(|(k, chunk)| Shard {
                    name: format!("text-{k:06}.parquet"),
                    files: chunk.to_vec(),
                })
                .collect()
        }
    })
}

/// Reads a shard into documents (or per-document rejects). A file that cannot be read at all is
/// an error for the whole job: nothing of it is skipped silently.
pub fn read_shard(
    input: &Location,
    shard: &Shard,
    src: &DatasetSource,
    max_doc_bytes: usize,
) -> Result<Vec<Input>, PipelineError> {
    let mut out = Vec::new();
    for (fi, path) in shard.files.iter().enumerate() {
        let source = format!(
            "{}/{}",
            input.url.trim_end_matches('/'),
            input.relative(path)
        );
        let bytes = input.read(path)?;
        match src.format {
            InputFormat::Text => out.push(decode(
                &bytes,
                ValueFormat::Text,
                &src.fields,
                max_doc_bytes,
                Lineage::new(source, None, fi as i64),
            )),
            InputFormat::Jsonl => {
                // Lines split on bytes, so one line of bad UTF-8 is one reject, not a lost file.
                let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
                if lines.last().is_some_and(|l| l.is_empty()) {
                    lines.pop();
                }
                for (i, line) in lines.into_iter().enumerate() {
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    out.push(decode(
                        line,
                        ValueFormat::Json,
                        &src.fields,
                        max_doc_bytes,
                        Lineage::new(source.clone(), None, i as i64),
                    ));
                }
            }
            InputFormat::Parquet => {
                let rows = parquet_rows(bytes).map_err(|message| PipelineError::Input {
                    location: source.clone(),
                    message,
                })?;
                for (i, row) in rows.into_iter().enumerate() {
                    let lineage = Lineage::new(source.clone(), None, i as i64);
                    let raw = serde_json::to_vec(&row).unwrap_or_default();
                    out.push(decode(
                        &raw,
                        ValueFormat::Json,
                        &src.fields,
                        max_doc_bytes,
                        lineage,
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// Parquet rows as JSON objects (arrow-json's writer, so every Arrow type has one spelling).
fn parquet_rows(bytes: bytes::Bytes) -> Result<Vec<serde_json::Value>, String> {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch: RecordBatch = batch.map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut w = arrow_json::ArrayWriter::new(&mut buf);
        w.write(&batch).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        if !buf.is_empty() {
            let v: Vec<serde_json::Value> =
                serde_json::from_slice(&buf).map_err(|e| e.to_string())?;
            rows.extend(v);
        }
    }
    Ok(rows)
}

/// Options a caller adds to a dataset job.
#[derive(Debug, Clone, Default)]
pub struct DatasetOptions {
    /// Process at most this many shards (after skipping the published ones).
    pub limit_shards: Option<usize>,
    /// Print progress (a bar on a terminal, plain lines otherwise).
    pub progress: bool,
}

/// Runs a dataset job to the end (or to a signal).
pub fn run_dataset<E: Extractor>(
    cfg: &PipelineConfig,
    input: &Location,
    flow: &mut Flow<E>,
    publisher: &Publisher,
    metrics: &Metrics,
    shutdown: &Shutdown,
    opts: &DatasetOptions,
) -> Result<JobSummary, PipelineError> {
    let SourceConfig::Dataset(src) = &cfg.source else {
        return Err(PipelineError::Config {
            path: cfg.name.clone(),
            message: "`quarry extract` needs source.kind = \"dataset\"".into(),
        });
    };
    let started = Instant::now();
    let all = shards(input, src)?;
    let mut summary = JobSummary {
        shards: all.len(),
        ..Default::default()
    };
    let mut todo = Vec::new();
    for s in all {
        if publisher.rejects.exists(&s.name)? {
            summary.shards_skipped += 1;
        } else {
            todo.push(s);
        }
    }
    if let Some(n) = opts.limit_shards {
        todo.truncate(n);
    }
    tracing::info!(
        pipeline = %cfg.name,
        shards = summary.shards,
        skipped = summary.shards_skipped,
        todo = todo.len(),
        "dataset job starts"
    );
    let progress = Progress::new(opts.progress, todo.len());
    let mut next = todo.into_iter();
    let low_water = flow.extractor.capacity() * 2;
    let mut exhausted = false;
    loop {
        metrics.beat();
        if shutdown.abandon() {
            summary.interrupted = true;
            break;
        }
        if shutdown.requested() {
            summary.interrupted = true;
            exhausted = true;
        }
        // Keep enough documents loaded to keep the engine full, a shard at a time.
        while !exhausted && flow.pending() < low_water {
            match next.next() {
                Some(shard) => {
                    let t = Instant::now();
                    let inputs = read_shard(input, &shard, src, cfg.batching.max_doc_bytes)?;
                    summary.io_s += t.elapsed().as_secs_f64();
                    let id = flow.open(shard.name.clone(), shard.name.clone(), Vec::new());
                    for i in inputs {
                        flow.push(id, i);
                    }
                    flow.seal(id);
                }
                None => exhausted = true,
            }
        }
        let t = Instant::now();
        let worked = flow.pump()?;
        if worked {
            metrics.step(t.elapsed());
        }
        metrics.in_flight.set(flow.pending() as i64);
        for file in flow.take_ready() {
            let t = Instant::now();
            let report = publisher.publish(file)?;
            summary.io_s += t.elapsed().as_secs_f64();
            metrics.file(&report);
            summary.add(&report);
            progress.shard(&report, &summary, started.elapsed());
        }
        if let Some(s) = flow.extractor.engine_stats() {
            metrics.engine(&s);
        }
        if exhausted && flow.open_files() == 0 {
            break;
        }
        if !worked && flow.pending() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    progress.finish();
    summary.wall_s = started.elapsed().as_secs_f64();
    if summary.accepted + summary.rejected != summary.consumed {
        return Err(PipelineError::Conservation(format!(
            "accepted {} + rejected {} != consumed {}",
            summary.accepted, summary.rejected, summary.consumed
        )));
    }
    Ok(summary)
}

/// A bar with ETA on a terminal; one plain line per shard otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    total: usize,
}

impl Progress {
    fn new(enabled: bool, total: usize) -> Self {
        if !enabled {
            return Self {
                bar: None,
                plain: false,
                total,
            };
        }
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} shards  {msg}  ETA {eta}",
                )
                .expect("static template"),
            );
            Self {
                bar: Some(bar),
                plain: false,
                total,
            }
        } else {
            Self {
                bar: None,
                plain: true,
                total,
            }
        }
    }

    fn shard(&self, r: &FileReport, s: &JobSummary, elapsed: Duration) {
        let rate = s.consumed as f64 / elapsed.as_secs_f64().max(1e-9);
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(format!(
                "{} docs, {} rejected, {rate:.2} docs/s",
                s.consumed, s.rejected
            ));
        } else if self.plain {
            let done = s.shards_done;
            let eta = if done > 0 {
                elapsed.as_secs_f64() / done as f64 * (self.total.saturating_sub(done)) as f64
            } else {
                0.0
            };
            eprintln!(
                "shard {done}/{}: {} ({} docs: {} accepted, {} rejected), {rate:.2} docs/s, ETA {eta:.0}s",
                self.total, r.name, r.consumed, r.accepted, r.rejected
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
