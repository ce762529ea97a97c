//! Dataset jobs (`quarry extract`): every input file under a prefix becomes shards, each shard one
//! output file. A shard whose rejects marker is already published is skipped, so a rerun resumes
//! where a crash left off.
//!
//! Inputs: JSONL (each file a shard, each line a document, `_offset` = the line's byte offset in
//! the file, decompressed), plain text (one document per file, `text_shard_files` files per
//! shard, `_offset` = index in the shard) and Parquet with a string text column (each file a
//! shard, `_offset` = row index in the file). A JSONL or Parquet file over `split_bytes` is cut
//! into parts, each a shard ([`crate::shard`]). A shard is read a chunk of documents at a time
//! ([`read`]), beside the step loop ([`io`]).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

mod io;
pub(crate) mod read;

use crate::config::{DatasetSource, PipelineConfig, SourceConfig};
use crate::error::PipelineError;
use crate::extract::Extractor;
use crate::flow::{FileReport, Flow, Publisher};
use crate::metrics::Metrics;
pub use crate::shard::{check_splits, shards, Part, Shard, ShardSlice};
use crate::shutdown::Shutdown;
use crate::store::Location;
use io::{Beside, Next, Read, Stores};

/// What a dataset job did (`quarry extract --json` prints it).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct JobSummary {
    /// Shards the input listing holds (every worker's).
    pub shards: usize,
    /// This worker's slice of them (`0/1` alone).
    pub slice: ShardSlice,
    /// Shards of this worker's slice.
    pub shards_assigned: usize,
    /// Of those, already published when the job started (skipped).
    pub shards_skipped: usize,
    /// Published by this worker now.
    pub shards_done: usize,
    /// Of those, shards whose accepted file an earlier, crashed run had published (completed now).
    pub shards_replayed: usize,
    /// Published by another worker after this one listed them and before it read them (skipped,
    /// no work lost): another worker runs the same slice.
    pub shards_published_meanwhile: usize,
    /// Worked on by this worker but published first by another (duplicated work; nothing of this
    /// worker's landed for them): another worker runs the same slice. `docs_duplicated` counts
    /// their documents, which are in no other count of this summary.
    pub shards_duplicated: usize,
    pub docs_duplicated: u64,
    pub consumed: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub causes: BTreeMap<String, u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub forced_tokens: u64,
    pub wall_s: f64,
    /// Time spent reading shards and encoding and publishing files (the pipeline's own work,
    /// beside the step loop, on threads of its own: it can exceed `wall_s`). Validation runs per
    /// document between engine steps, in microseconds.
    pub io_s: f64,
    /// Of `wall_s`, the time the step loop waited for that work: with no document to step while
    /// the next shard was read, at the end for the last publishes, or with too many files
    /// waiting for a publisher.
    #[serde(default)]
    pub io_wait_s: f64,
    /// Stopped by a signal before every shard was done.
    pub interrupted: bool,
    /// The files this worker published.
    pub files: Vec<String>,
    /// The shards another worker published first (`shards_duplicated`).
    pub duplicated: Vec<String>,
}

impl JobSummary {
    pub fn add(&mut self, r: &FileReport) {
        if r.duplicate {
            self.shards_duplicated += 1;
            self.docs_duplicated += r.duplicated_docs;
            self.duplicated.push(r.name.clone());
            return;
        }
        self.shards_done += 1;
        self.shards_replayed += r.replayed as usize;
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

    /// The summary of several workers' (or one worker's devices') jobs over the same listing.
    pub fn merge(&mut self, o: &JobSummary) {
        self.shards = self.shards.max(o.shards);
        self.shards_assigned += o.shards_assigned;
        self.shards_skipped += o.shards_skipped;
        self.shards_done += o.shards_done;
        self.shards_replayed += o.shards_replayed;
        self.shards_published_meanwhile += o.shards_published_meanwhile;
        self.shards_duplicated += o.shards_duplicated;
        self.docs_duplicated += o.docs_duplicated;
        self.consumed += o.consumed;
        self.accepted += o.accepted;
        self.rejected += o.rejected;
        for (c, n) in &o.causes {
            *self.causes.entry(c.clone()).or_default() += n;
        }
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.output_tokens += o.output_tokens;
        self.forced_tokens += o.forced_tokens;
        self.wall_s = self.wall_s.max(o.wall_s);
        self.io_s += o.io_s;
        self.io_wait_s += o.io_wait_s;
        self.interrupted |= o.interrupted;
        self.files.extend(o.files.iter().cloned());
        self.duplicated.extend(o.duplicated.iter().cloned());
    }
}

/// Documents a chunk of a shard holds at least (more where the engine keeps more loaded).
const MIN_CHUNK_DOCS: usize = 64;

/// Options a caller adds to a dataset job.
#[derive(Debug, Clone, Default)]
pub struct DatasetOptions {
    /// Process at most this many shards (after skipping the published ones).
    pub limit_shards: Option<usize>,
    /// Print progress (a bar on a terminal, plain lines otherwise).
    pub progress: bool,
    /// This worker's shards ([`ShardSlice::ALL`] alone).
    pub slice: ShardSlice,
}

/// A dataset job, the counterpart of the Kafka [`crate::kafka::Worker`]: built from its
/// definition over a [`Flow`] and a [`Publisher`], then [`DatasetJob::run`] to the end or to a
/// signal. It lists the input, keeps this worker's slice, skips what is published, keeps the
/// engine full a shard at a time, and publishes each shard as it finishes.
pub struct DatasetJob<'a, E: Extractor> {
    cfg: &'a PipelineConfig,
    src: &'a DatasetSource,
    input: &'a Location,
    flow: &'a mut Flow<E>,
    publisher: &'a Publisher,
    metrics: &'a Metrics,
    opts: DatasetOptions,
    /// The shard whose chunks are arriving (its name and file), until its last one.
    reading: Option<(String, u64)>,
}

/// The shards left to read, and the footer metadata every file of the job carries.
struct Plan {
    todo: Vec<Shard>,
    job_meta: Vec<(String, String)>,
}

impl<'a, E: Extractor> DatasetJob<'a, E> {
    pub fn new(
        cfg: &'a PipelineConfig,
        input: &'a Location,
        flow: &'a mut Flow<E>,
        publisher: &'a Publisher,
        metrics: &'a Metrics,
        opts: DatasetOptions,
    ) -> Result<Self, PipelineError> {
        let SourceConfig::Dataset(src) = &cfg.source else {
            return Err(PipelineError::WrongSource {
                pipeline: cfg.name.clone(),
                command: "quarry extract",
                needs: "dataset",
            });
        };
        Ok(Self {
            cfg,
            src,
            input,
            flow,
            publisher,
            metrics,
            opts,
            reading: None,
        })
    }

    /// Runs to the end (or to a signal). Shards are read and files published beside the step
    /// loop ([`io`]).
    pub fn run(mut self, shutdown: &Shutdown) -> Result<JobSummary, PipelineError> {
        let started = Instant::now();
        let mut summary = JobSummary {
            slice: self.opts.slice,
            ..Default::default()
        };
        let Plan { todo, job_meta } = self.plan(&mut summary)?;
        let progress = Progress::new(self.opts.progress, todo.len());
        let stores = Stores {
            input: self.input,
            src: self.src,
            max_doc_bytes: self.cfg.batching.max_doc_bytes,
            // What the loop keeps loaded (below), so a chunk refills it.
            chunk_docs: (self.flow.extractor.capacity() * 2).max(MIN_CHUNK_DOCS),
            publisher: self.publisher,
            publishers: self.cfg.output.publishers,
        };
        std::thread::scope(|scope| {
            let mut io = Beside::start(scope, todo, stores);
            let looped = self.run_loop(
                &mut io,
                shutdown,
                &job_meta,
                &mut summary,
                &progress,
                started,
            );
            summary.io_wait_s = io.wait_s();
            looped
        })?;
        progress.finish();
        summary.wall_s = started.elapsed().as_secs_f64();
        if summary.accepted + summary.rejected != summary.consumed {
            return Err(PipelineError::Conservation {
                file: None,
                accepted: summary.accepted,
                rejected: summary.rejected,
                skipped: 0,
                consumed: summary.consumed,
            });
        }
        Ok(summary)
    }

    /// Feeds the engine from `io`'s shards and hands `io` each finished file, until every shard
    /// is published (or a signal).
    fn run_loop(
        &mut self,
        io: &mut Beside,
        shutdown: &Shutdown,
        job_meta: &[(String, String)],
        summary: &mut JobSummary,
        progress: &Progress,
        started: Instant,
    ) -> Result<(), PipelineError> {
        let low_water = self.flow.extractor.capacity() * 2;
        let mut exhausted = false;
        let mut done = Vec::new();
        loop {
            self.metrics.beat();
            let waited = io.wait_s();
            if shutdown.abandon() {
                summary.interrupted = true;
                return Ok(());
            }
            if shutdown.requested() && !exhausted {
                summary.interrupted = true;
                exhausted = true;
                io.stop_reading();
                // A shard read in part cannot be published; the next run reads it again.
                if let Some((name, _)) = self.reading.take() {
                    let dropped = self.flow.abandon(&name);
                    tracing::warn!(shard = %name, documents = dropped, "stopping with this shard read in part: it is left for the next run");
                }
            }
            // Keep enough documents loaded to keep the engine full, a chunk at a time; wait for
            // the reader only when there is nothing to step.
            while !exhausted && self.flow.pending() < low_water {
                match io.next_shard(self.flow.pending() == 0)? {
                    Next::Read(read, secs) => {
                        summary.io_s += secs;
                        self.load(read, job_meta, summary);
                    }
                    Next::NotYet => break,
                    Next::Done => exhausted = true,
                }
            }
            let t = Instant::now();
            let worked = self.flow.pump()?;
            if worked {
                self.metrics.step(t.elapsed());
            }
            self.metrics.in_flight.set(self.flow.pending() as i64);
            for file in self.flow.take_ready() {
                io.publish(file, &mut done)?;
            }
            // Wait for the publishers only when nothing is left to step.
            let idle = !worked && self.flow.pending() == 0 && exhausted;
            io.collect(idle, &mut done)?;
            for (report, secs) in done.drain(..) {
                summary.io_s += secs;
                self.metrics.file(&report);
                self.metrics.published(secs);
                if report.duplicate {
                    tracing::warn!(shard = %report.name, slice = %self.opts.slice, docs = report.duplicated_docs, "another worker published this shard first; this worker's work on it is discarded (is the same index running twice?)");
                }
                summary.add(&report);
                progress.shard(&report, summary, started.elapsed());
            }
            if let Some(s) = self.flow.extractor.engine_stats() {
                self.metrics.engine(&s);
            }
            self.metrics.io_waited(io.wait_s() - waited);
            if exhausted && self.flow.open_files() == 0 && io.outstanding() == 0 {
                return Ok(());
            }
            if !worked && self.flow.pending() > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Lists the input and keeps this worker's unpublished shards (at most `limit_shards`).
    fn plan(&self, summary: &mut JobSummary) -> Result<Plan, PipelineError> {
        let all = shards(self.input, self.src)?;
        summary.shards = all.len();
        // The markers published already, from one listing of the rejects prefix (a request a
        // page of names) rather than a request a shard: with 100,000 shards and 20 ms a call
        // that was half an hour before the first step. The reader checks each shard again just
        // before it reads it, beside the loop.
        let rejects = &self.publisher.rejects;
        // Paths, not names: a name's path is what `exists` would have asked for, byte for byte.
        let published: std::collections::HashSet<_> =
            rejects.list("")?.into_iter().map(|m| m.location).collect();
        let names: Vec<String> = published.iter().map(|p| rejects.relative(p)).collect();
        check_splits(self.input, &all, names.iter().map(String::as_str))?;
        let mut todo = Vec::new();
        for s in all.into_iter().filter(|s| self.opts.slice.owns(&s.name)) {
            summary.shards_assigned += 1;
            if published.contains(&rejects.path(&s.name)) {
                summary.shards_skipped += 1;
            } else {
                todo.push(s);
            }
        }
        if let Some(n) = self.opts.limit_shards {
            todo.truncate(n);
        }
        tracing::info!(
            pipeline = %self.cfg.name,
            shards = summary.shards,
            slice = %self.opts.slice,
            assigned = summary.shards_assigned,
            skipped = summary.shards_skipped,
            todo = todo.len(),
            "dataset job starts"
        );
        // Every file this job publishes says which job it belongs to, so `quarry inspect` can
        // tell a finished job from a partial one.
        let job_meta = vec![
            (
                "quarry.shards_listed".to_string(),
                summary.shards.to_string(),
            ),
            (
                "quarry.shard_slice".to_string(),
                self.opts.slice.to_string(),
            ),
        ];
        Ok(Plan { todo, job_meta })
    }

    /// Puts what the reader got to into the flow: a shard's first chunk opens its file, its
    /// last seals it.
    fn load(&mut self, read: Read, job_meta: &[(String, String)], summary: &mut JobSummary) {
        let (name, inputs, last) = match read {
            Read::Meanwhile(name) => {
                // Another worker runs this slice too and got here first.
                summary.shards_published_meanwhile += 1;
                tracing::warn!(shard = %name, slice = %self.opts.slice, "published by another worker since the listing; skipped (is the same index running twice?)");
                return;
            }
            Read::Docs { name, inputs, last } => (name, inputs, last),
        };
        let id = match &self.reading {
            Some((open, id)) if *open == name => *id,
            _ => {
                let id = self
                    .flow
                    .open(name.clone(), name.clone(), job_meta.to_vec());
                self.reading = Some((name, id));
                id
            }
        };
        for i in inputs {
            self.flow.push(id, i);
        }
        if last {
            self.flow.seal(id);
            self.reading = None;
        }
    }
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

#[cfg(all(test, feature = "test-support"))]
mod tests;
