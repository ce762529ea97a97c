//! The part both job kinds share: documents grouped into output files, fed through an
//! [`Extractor`], judged by the [`Validator`], and published once every document of a file has an
//! outcome.
//!
//! ## The publish protocol (effectively once)
//! A file of documents (one Kafka partition's offset range, or one dataset shard) is published as
//! up to two objects with the same name:
//! 1. the accepted records, only when there are any, create-if-absent;
//! 2. the rejects, **always** (possibly with no rows), create-if-absent. The rejects file is the
//!    commit marker: a range or shard is done exactly when its rejects file exists.
//!
//! A crash between 1 and 2 leaves an accepted file without its marker. The replay finds it
//! (`AlreadyExists`), reads its `_offset`s, and writes to rejects only what that file lacks: the
//! documents rejected now, and (were decoding not deterministic) documents accepted now but not
//! then, with cause `replay_mismatch`. Every document therefore lands in exactly one of the two
//! datasets, exactly once.
//!
//! ## Two workers on one file
//! Dataset workers given the same shard (the same index twice) may publish concurrently. Whoever's
//! marker lands owns the file; its rejects were computed against the accepted file it saw. A worker
//! that finds the marker already there publishes nothing (its report has `duplicate` set). One whose
//! marker put finds another's marker (not byte for byte its own, which would be its own lost
//! response: every marker carries a name of its own, `quarry.marker`) is a duplicate too, and if its accepted file landed *after* that marker was computed
//! without it (the other worker accepted nothing and saw no accepted file), the marker holds those
//! documents already: it withdraws its accepted file. The one window left open is a crash between
//! that put and the withdrawal, which needs the misconfiguration, decoding that differs between
//! the two workers and the crash together.
//!
//! ## Two workers on one partition
//! A Kafka worker expelled from its group that keeps running (a *zombie*: a stall longer than the
//! session) and the partition's new owner may cut the same offsets into ranges with different
//! boundaries, which identical names cannot fence. So a Kafka range is first *claimed*: before
//! step 1, an object named after the range's first offset ([`OpenFile::claim`],
//! `crate::kafka::claim_name`) is created if absent, holding the range's name. A worker whose claim
//! finds another range's name there publishes nothing of its file (its report has `fenced` set)
//! and reconciles the partition again from the output. Why that keeps ranges from overlapping is
//! in `crate::kafka`'s `ranges` module.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::columns::RecordShape;
use crate::encode::{
    accepted_batch, read_offsets, rejects_batch, to_parquet, AcceptedRow, FileContext, RejectRow,
};
use crate::error::PipelineError;
use crate::extract::{Extractor, Validator};
use crate::record::{DocStats, Document, Input, Lineage, Outcome, RejectCause};
use crate::store::{Location, Published};

/// What a file keeps of each input: where it came from, its id, and what a rejects row shows of
/// it. The document itself waits in the flow's queue and is dropped once the extractor has it
/// (a prompt), so a file holds its documents' text only until they are submitted: a large shard
/// costs its records and lineage, not its input again.
#[derive(Debug)]
pub struct Kept {
    pub lineage: Lineage,
    pub id: Option<String>,
    /// Emptied once the document is accepted (only a rejects row shows it).
    pub preview: String,
}

impl Kept {
    /// What a file keeps of `input`, and its document (or why it has none).
    fn split(input: Input) -> (Self, Result<Document, RejectCause>) {
        let Input {
            lineage,
            id,
            preview,
            doc,
        } = input;
        (
            Kept {
                lineage,
                id,
                preview,
            },
            doc,
        )
    }
}

/// A file being filled: its documents in order and their outcomes as they arrive.
#[derive(Debug)]
pub struct OpenFile {
    /// Name under the output and rejects prefixes (`…/000…-000….parquet`).
    pub name: String,
    /// Files of one group (a Kafka partition) are published in creation order.
    pub group: String,
    pub inputs: Vec<Kept>,
    outcomes: Vec<Option<Outcome>>,
    remaining: usize,
    /// No more documents will join.
    pub sealed: bool,
    /// Extra footer metadata (offset range, shard).
    pub metadata: Vec<(String, String)>,
    /// The claim created before anything of the file is published (a Kafka range: the name of
    /// the claim on its first offset, see the module docs); `None` for a dataset shard.
    pub claim: Option<String>,
}

impl OpenFile {
    pub fn first_offset(&self) -> Option<i64> {
        self.inputs.first().map(|i| i.lineage.offset)
    }
    pub fn last_offset(&self) -> Option<i64> {
        self.inputs.last().map(|i| i.lineage.offset)
    }
    /// The Kafka partition its documents came from (a file never mixes partitions).
    pub fn partition(&self) -> Option<i32> {
        self.inputs.first().and_then(|i| i.lineage.partition)
    }
    pub fn len(&self) -> usize {
        self.inputs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }
    fn is_done(&self) -> bool {
        self.sealed && self.remaining == 0
    }
}

/// Counts of one published file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileReport {
    pub name: String,
    pub group: String,
    pub consumed: u64,
    pub accepted: u64,
    /// Of the accepted, those whose end the token budget shaped (finish `budget_closed`).
    pub budget_closed: u64,
    pub rejected: u64,
    /// Left out by configuration (tombstones with `source.tombstones = "skip"`); no row anywhere.
    pub skipped: u64,
    /// Skips by cause name.
    pub skipped_causes: BTreeMap<&'static str, u64>,
    /// The accepted file was already there (a replay after a crash).
    pub replayed: bool,
    /// Another worker published this file's rejects marker first (two workers ran the same
    /// shard): what that worker published stands, nothing of this one's does, and every count
    /// above is 0 (the documents are that worker's to count).
    pub duplicate: bool,
    /// For a duplicate or a fenced file, the documents whose work was duplicated.
    pub duplicated_docs: u64,
    /// The range that holds this file's claim, when another worker claimed the same first offset
    /// for a different range: nothing of this file was published, every count is 0, and the
    /// worker reconciles the partition again (its documents are published by that range or
    /// after it).
    pub fenced: Option<String>,
    /// The Kafka partition of the file's documents (from their lineage; `None` for a dataset).
    pub partition: Option<i32>,
    pub first_offset: Option<i64>,
    pub last_offset: Option<i64>,
    pub stats: DocStats,
    /// Rejects by cause name.
    pub causes: BTreeMap<&'static str, u64>,
    /// The rejects as JSON messages for a dead-letter topic: (key, value).
    pub dead_letters: Vec<(Option<Vec<u8>>, serde_json::Value)>,
}

impl FileReport {
    /// The report of a file whose marker another worker published before this one published
    /// anything of it.
    fn duplicate(file: &OpenFile) -> Self {
        FileReport {
            name: file.name.clone(),
            group: file.group.clone(),
            duplicate: true,
            duplicated_docs: file.len() as u64,
            partition: file.partition(),
            first_offset: file.first_offset(),
            last_offset: file.last_offset(),
            ..FileReport::default()
        }
    }

    /// The report of a file whose claim holds another range, `holder`.
    fn fenced(file: &OpenFile, holder: String) -> Self {
        FileReport {
            name: file.name.clone(),
            group: file.group.clone(),
            fenced: Some(holder),
            duplicated_docs: file.len() as u64,
            partition: file.partition(),
            first_offset: file.first_offset(),
            last_offset: file.last_offset(),
            ..FileReport::default()
        }
    }

    /// `r` turned into a duplicate's report: its name and range, every count 0.
    fn duplicate_of(r: FileReport) -> Self {
        FileReport {
            duplicate: true,
            duplicated_docs: r.consumed,
            name: r.name,
            group: r.group,
            partition: r.partition,
            first_offset: r.first_offset,
            last_offset: r.last_offset,
            ..FileReport::default()
        }
    }
}

/// Documents in flight across open files, and the extractor they go through.
pub struct Flow<E: Extractor> {
    pub extractor: E,
    validator: Validator,
    files: BTreeMap<u64, OpenFile>,
    next_file: u64,
    /// Extractor key → (file id, index).
    keys: HashMap<u64, (u64, usize)>,
    next_key: u64,
    /// Documents waiting for room in the extractor, under their keys.
    queue: VecDeque<(u64, Document)>,
}

impl<E: Extractor> Flow<E> {
    pub fn new(extractor: E, validator: Validator) -> Self {
        Self {
            extractor,
            validator,
            files: BTreeMap::new(),
            next_file: 0,
            keys: HashMap::new(),
            next_key: 0,
            queue: VecDeque::new(),
        }
    }

    /// Starts a file; documents join it with [`Flow::push`].
    pub fn open(&mut self, name: String, group: String, metadata: Vec<(String, String)>) -> u64 {
        let id = self.next_file;
        self.next_file += 1;
        self.files.insert(
            id,
            OpenFile {
                name,
                group,
                inputs: Vec::new(),
                outcomes: Vec::new(),
                remaining: 0,
                sealed: false,
                metadata,
                claim: None,
            },
        );
        id
    }

    pub fn file(&self, id: u64) -> Option<&OpenFile> {
        self.files.get(&id)
    }

    /// Adds a document to an open file. Inputs that are already rejects get their outcome now.
    pub fn push(&mut self, file: u64, input: Input) {
        let f = self.files.get_mut(&file).expect("push into an open file");
        debug_assert!(!f.sealed, "push into a sealed file");
        let idx = f.inputs.len();
        let (kept, doc) = Kept::split(input);
        let outcome = match doc {
            Ok(doc) => {
                let key = self.next_key;
                self.next_key += 1;
                self.keys.insert(key, (file, idx));
                self.queue.push_back((key, doc));
                f.remaining += 1;
                None
            }
            Err(cause) => Some(Outcome::Rejected {
                cause,
                raw_output: None,
                finish: None,
                stats: DocStats::default(),
            }),
        };
        f.inputs.push(kept);
        f.outcomes.push(outcome);
    }

    /// Adds an input that configuration leaves out (see [`Outcome::Skipped`]): it takes its place
    /// in the file's offset range and counts, but becomes no row.
    pub fn push_skipped(&mut self, file: u64, input: Input) {
        let f = self.files.get_mut(&file).expect("push into an open file");
        debug_assert!(!f.sealed, "push into a sealed file");
        let (kept, doc) = Kept::split(input);
        let cause = doc.err().unwrap_or(RejectCause::Empty);
        f.inputs.push(kept);
        f.outcomes.push(Some(Outcome::Skipped { cause }));
    }

    pub fn seal(&mut self, file: u64) {
        if let Some(f) = self.files.get_mut(&file) {
            f.sealed = true;
        }
    }

    /// Seals a file under its final name (a Kafka range is named once its last offset is known)
    /// and the claim its publish makes first (see the module docs).
    pub fn seal_as(&mut self, file: u64, name: String, claim: Option<String>) {
        if let Some(f) = self.files.get_mut(&file) {
            f.name = name;
            f.claim = claim;
            f.sealed = true;
        }
    }

    /// Files opened and not yet taken by [`Flow::take_ready`] (or abandoned).
    pub fn open_files(&self) -> usize {
        self.files.len()
    }

    /// Documents not yet judged, across all files.
    pub fn pending(&self) -> usize {
        self.files.values().map(|f| f.remaining).sum()
    }

    /// Pending documents of one group.
    pub fn pending_in(&self, group: &str) -> usize {
        self.files
            .values()
            .filter(|f| f.group == group)
            .map(|f| f.remaining)
            .sum()
    }

    /// Drops every file of a group (a revoked partition). Their documents still in the extractor
    /// are ignored when they come back.
    pub fn abandon(&mut self, group: &str) -> usize {
        let ids: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, f)| f.group == group)
            .map(|(id, _)| *id)
            .collect();
        let mut dropped = 0;
        for id in &ids {
            dropped += self.files.remove(id).map(|f| f.len()).unwrap_or(0);
        }
        self.keys.retain(|_, (file, _)| !ids.contains(file));
        let keys = &self.keys;
        self.queue.retain(|(k, _)| keys.contains_key(k));
        dropped
    }

    /// Feeds the extractor up to its capacity, runs one step when it has work, and files the
    /// outcomes. Returns whether any work was done.
    pub fn pump(&mut self) -> Result<bool, PipelineError> {
        while self.extractor.in_flight() < self.extractor.capacity() {
            let Some((key, doc)) = self.queue.pop_front() else {
                break;
            };
            let Some(&(file, idx)) = self.keys.get(&key) else {
                continue;
            };
            let f = self
                .files
                .get_mut(&file)
                .expect("queued keys belong to open files");
            // The extractor keeps what it needs (the prompt); the document is dropped here.
            if let Err(cause) = self.extractor.submit(key, &doc) {
                self.keys.remove(&key);
                f.outcomes[idx] = Some(Outcome::Rejected {
                    cause,
                    raw_output: None,
                    finish: None,
                    stats: DocStats::default(),
                });
                f.remaining -= 1;
            }
        }
        if self.extractor.in_flight() == 0 {
            return Ok(false);
        }
        for (key, generated) in self.extractor.step()? {
            let Some((file, idx)) = self.keys.remove(&key) else {
                continue;
            };
            let outcome = self.validator.judge(generated);
            if let Some(f) = self.files.get_mut(&file) {
                if matches!(outcome, Outcome::Accepted { .. }) {
                    f.inputs[idx].preview = String::new();
                }
                f.outcomes[idx] = Some(outcome);
                f.remaining -= 1;
            }
        }
        Ok(true)
    }

    /// Files whose every document has an outcome, in publish order: per group, only the oldest
    /// files, up to the first one still busy.
    pub fn take_ready(&mut self) -> Vec<OpenFile> {
        let mut blocked: HashSet<String> = HashSet::new();
        let mut ready = Vec::new();
        for (id, f) in &self.files {
            if blocked.contains(&f.group) {
                continue;
            }
            if f.is_done() {
                ready.push(*id);
            } else {
                blocked.insert(f.group.clone());
            }
        }
        ready
            .into_iter()
            .filter_map(|id| self.files.remove(&id))
            .collect()
    }
}

/// A name for one publish call's commit marker, unique across workers and calls (a random
/// per-process key from the OS, the time, a counter), written into the marker's metadata. An
/// `AlreadyExists` whose bytes equal the marker's is then this call's own write whose response
/// was lost, never another worker's: without it two workers' markers with no rows were equal
/// byte for byte, and both reported the shard as theirs (`sharding` test, 2026-11-26).
fn marker_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static WORKER: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let worker = WORKER.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{worker:016x}-{nanos}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes finished files to the output and rejects datasets.
#[derive(Clone)]
pub struct Publisher {
    pub shape: RecordShape,
    pub output: Location,
    pub rejects: Location,
    pub pipeline: String,
    pub model: String,
    /// The model runtime options in force (`[model.runtime]` and the `QUARRY_*` variables), as
    /// JSON: each file's `quarry.model_runtime` metadata. Empty: not recorded (a test's fake).
    pub model_runtime: String,
    pub schema_sha256: String,
    pub row_group_rows: usize,
    pub zstd_level: i32,
}

impl Publisher {
    fn context(&self) -> FileContext {
        FileContext {
            pipeline: self.pipeline.clone(),
            model: self.model.clone(),
            schema_sha256: self.schema_sha256.clone(),
            extracted_at_us: chrono::Utc::now().timestamp_micros(),
        }
    }

    fn metadata(&self, file: &OpenFile, kind: &str) -> Vec<(String, String)> {
        let mut m = vec![
            ("quarry.pipeline".to_string(), self.pipeline.clone()),
            (
                "quarry.version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
            ("quarry.dataset".to_string(), kind.to_string()),
            ("quarry.model".to_string(), self.model.clone()),
            (
                "quarry.schema_sha256".to_string(),
                self.schema_sha256.clone(),
            ),
        ];
        if !self.model_runtime.is_empty() {
            m.push(("quarry.model_runtime".into(), self.model_runtime.clone()));
        }
        if let (Some(a), Some(b)) = (file.first_offset(), file.last_offset()) {
            m.push(("quarry.offset_first".into(), a.to_string()));
            m.push(("quarry.offset_last".into(), b.to_string()));
        }
        let skipped = file
            .outcomes
            .iter()
            .filter(|o| matches!(o, Some(Outcome::Skipped { .. })))
            .count();
        if skipped > 0 {
            m.push(("quarry.skipped".into(), skipped.to_string()));
        }
        m.extend(file.metadata.iter().cloned());
        m
    }

    /// Publishes one finished file by the protocol in the module docs.
    pub fn publish(&self, file: OpenFile) -> Result<FileReport, PipelineError> {
        if self.rejects.exists(&file.name)? {
            return Ok(FileReport::duplicate(&file));
        }
        if let Some(claim) = &file.claim {
            crate::faults::crash_point(crate::faults::CrashPoint::BeforeClaim);
            if let Some(holder) = self.claim(claim, &file.name)? {
                tracing::warn!(file = %file.name, holder = %holder, "another worker claimed this range's first offset for another range: nothing of it is published");
                return Ok(FileReport::fenced(&file, holder));
            }
        }
        let ctx = self.context();
        let accepted_meta = self.metadata(&file, "accepted");
        let mut rejects_meta = self.metadata(&file, "rejects");
        rejects_meta.push(("quarry.marker".to_string(), marker_id()));
        let mut report = FileReport {
            name: file.name.clone(),
            group: file.group.clone(),
            consumed: file.len() as u64,
            partition: file.partition(),
            first_offset: file.first_offset(),
            last_offset: file.last_offset(),
            ..FileReport::default()
        };
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        for (input, outcome) in file.inputs.into_iter().zip(file.outcomes) {
            let outcome = outcome.expect("published files are complete");
            let doc_id = input
                .id
                .clone()
                .unwrap_or_else(|| input.lineage.default_id());
            match outcome {
                Outcome::Accepted {
                    record,
                    finish,
                    stats,
                } => {
                    add(&mut report.stats, &stats);
                    report.budget_closed += u64::from(finish == "budget_closed");
                    accepted.push(AcceptedRow {
                        lineage: input.lineage,
                        doc_id,
                        finish,
                        record,
                    });
                }
                Outcome::Skipped { cause } => {
                    report.skipped += 1;
                    *report.skipped_causes.entry(cause.name()).or_default() += 1;
                }
                Outcome::Rejected {
                    cause,
                    raw_output,
                    finish,
                    stats,
                } => {
                    add(&mut report.stats, &stats);
                    rejected.push(RejectRow {
                        lineage: input.lineage,
                        doc_id,
                        finish,
                        cause,
                        raw_output,
                        input_preview: input.preview,
                    });
                }
            }
        }

        let (batch, unencodable) = accepted_batch(&self.shape, &ctx, accepted);
        for (row, why) in unencodable {
            rejected.push(RejectRow {
                lineage: row.lineage,
                doc_id: row.doc_id,
                finish: Some(row.finish),
                cause: RejectCause::Encoding(why),
                raw_output: Some(row.record.into()),
                input_preview: String::new(),
            });
        }
        let mut accepted_offsets: Option<HashSet<i64>> = None;
        let mut created_accepted = false;
        crate::faults::crash_point(crate::faults::CrashPoint::BeforePublish);
        if batch.num_rows() > 0 {
            let bytes = to_parquet(&batch, &accepted_meta, self.row_group_rows, self.zstd_level)
                .map_err(|source| PipelineError::Parquet {
                    location: file.name.clone(),
                    source,
                })?;
            match self.output.publish(&file.name, bytes)? {
                Published::Created => created_accepted = true,
                Published::AlreadyExists => {
                    accepted_offsets = Some(self.published_offsets(&file.name)?)
                }
            }
        } else if self.output.exists(&file.name)? {
            accepted_offsets = Some(self.published_offsets(&file.name)?);
        }

        crate::faults::crash_point(crate::faults::CrashPoint::BetweenFiles);
        let batch_rows = batch.num_rows() as u64;
        match &accepted_offsets {
            None => report.accepted = batch_rows,
            Some(published) => {
                // Replay: the accepted file of an earlier run stands; everything it lacks goes to
                // rejects, so each offset lands once.
                report.replayed = true;
                report.accepted = published.len() as u64;
                rejected.retain(|r| !published.contains(&r.lineage.offset));
                let offsets = offsets_of(&batch);
                for (i, off) in offsets.iter().enumerate() {
                    if !published.contains(off) {
                        rejected.push(replay_mismatch(&batch, i, *off));
                    }
                }
            }
        }
        rejected.sort_by_key(|r| r.lineage.offset);
        for r in &rejected {
            *report.causes.entry(r.cause.name()).or_default() += 1;
            report.dead_letters.push((
                r.lineage.key.clone(),
                serde_json::json!({
                    "pipeline": self.pipeline,
                    "source": r.lineage.source,
                    "partition": r.lineage.partition,
                    "offset": r.lineage.offset,
                    "doc_id": r.doc_id,
                    "cause": r.cause.name(),
                    "detail": r.cause.detail(),
                    "finish_reason": r.finish,
                    "raw_output": r.raw_output,
                    "input_preview": r.input_preview,
                }),
            ));
        }
        report.rejected = rejected.len() as u64;
        let rejects = rejects_batch(&ctx, &rejected);
        let bytes = to_parquet(
            &rejects,
            &rejects_meta,
            self.row_group_rows,
            self.zstd_level,
        )
        .map_err(|source| PipelineError::Parquet {
            location: file.name.clone(),
            source,
        })?;
        if self.rejects.publish(&file.name, bytes.clone())? == Published::AlreadyExists {
            let marker = self.rejects.read(&self.rejects.path(&file.name))?;
            // Byte for byte ours: an attempt whose response was lost landed. Anything else is
            // another worker's marker (its files carry their own extraction time).
            if marker != bytes {
                if created_accepted {
                    self.withdraw_conflict(&file.name, &batch, marker)?;
                }
                return Ok(FileReport::duplicate_of(report));
            }
        }
        if report.accepted + report.rejected + report.skipped != report.consumed {
            return Err(PipelineError::Conservation {
                file: Some(file.name),
                accepted: report.accepted,
                rejected: report.rejected,
                skipped: report.skipped,
                consumed: report.consumed,
            });
        }
        Ok(report)
    }

    /// Creates `claim` holding `name` unless it exists; returns the range it holds when that is
    /// another one. Holding `name` already is a replay of the same range or this call's own put
    /// whose response was lost.
    fn claim(&self, claim: &str, name: &str) -> Result<Option<String>, PipelineError> {
        let bytes = bytes::Bytes::from(name.to_string());
        if self.rejects.publish(claim, bytes.clone())? == Published::Created {
            return Ok(None);
        }
        let held = self.rejects.read(&self.rejects.path(claim))?;
        Ok((held != bytes).then(|| String::from_utf8_lossy(&held).into_owned()))
    }

    /// Another worker published `name`'s marker while this one published its accepted file. That
    /// worker's rejects were computed against the accepted file it saw: if it saw none (it
    /// accepted nothing and looked before this one's file landed), its marker holds every
    /// document, this one's accepted rows among them, and this one's accepted file must go so
    /// that each document is published once. Otherwise the two agree and both stand.
    fn withdraw_conflict(
        &self,
        name: &str,
        batch: &arrow_array::RecordBatch,
        marker: bytes::Bytes,
    ) -> Result<(), PipelineError> {
        let rejected: HashSet<i64> = read_offsets(marker)
            .map_err(|source| PipelineError::Parquet {
                location: name.to_string(),
                source,
            })?
            .into_iter()
            .collect();
        if offsets_of(batch).iter().any(|o| rejected.contains(o)) {
            tracing::warn!(file = %name, "another worker's rejects marker holds documents this worker's accepted file holds; withdrawing the accepted file");
            self.output.delete(name)?;
        }
        Ok(())
    }

    fn published_offsets(&self, name: &str) -> Result<HashSet<i64>, PipelineError> {
        let bytes = self.output.read(&self.output.path(name))?;
        let offsets = read_offsets(bytes).map_err(|source| PipelineError::Parquet {
            location: name.to_string(),
            source,
        })?;
        Ok(offsets.into_iter().collect())
    }
}

fn add(total: &mut DocStats, s: &DocStats) {
    total.prompt_tokens += s.prompt_tokens;
    total.cached_tokens += s.cached_tokens;
    total.output_tokens += s.output_tokens;
    total.forced_tokens += s.forced_tokens;
}

fn offsets_of(batch: &arrow_array::RecordBatch) -> Vec<i64> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    batch
        .column_by_name("_offset")
        .map(|c| c.as_primitive::<Int64Type>().values().to_vec())
        .unwrap_or_default()
}

/// A document accepted on replay that the earlier run's accepted file lacks.
fn replay_mismatch(batch: &arrow_array::RecordBatch, row: usize, offset: i64) -> RejectRow {
    use arrow_array::cast::AsArray;
    let text = |name: &str| {
        batch
            .column_by_name(name)
            .map(|c| c.as_string::<i32>().value(row).to_string())
            .unwrap_or_default()
    };
    let partition = batch.column_by_name("_partition").and_then(|c| {
        use arrow_array::types::Int32Type;
        let a = c.as_primitive::<Int32Type>();
        (!arrow_array::Array::is_null(a, row)).then(|| a.value(row))
    });
    let lineage = crate::record::Lineage::new(text("_source"), partition, offset);
    let one = batch.slice(row, 1);
    let mut buf = Vec::new();
    {
        let mut w = arrow_json::LineDelimitedWriter::new(&mut buf);
        let _ = w.write(&one);
        let _ = w.finish();
    }
    RejectRow {
        lineage,
        doc_id: text("_doc_id"),
        finish: Some(text("_finish_reason")),
        cause: RejectCause::ReplayMismatch,
        raw_output: Some(String::from_utf8_lossy(&buf).trim().to_string()),
        input_preview: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DocFields, ValueFormat};
    use crate::record::{decode, Lineage};
    use crate::testing::Fake;
    use serde_json::json;

    /// The `_offset` values of the published file `name` under `loc`.
    fn offsets_of(loc: &Location, name: &str) -> Vec<i64> {
        read_offsets(loc.read(&loc.path(name)).unwrap()).unwrap()
    }

    /// The shared fake: one step a document (two for "slow"), three at a time.
    fn fake() -> Fake {
        crate::testing::fake(1, &std::sync::Arc::default()).with_capacity(3)
    }

    fn schema() -> serde_json::Value {
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "maxLength": 8}}})
    }

    fn setup(tag: &str, fake: Fake) -> (Flow<Fake>, Publisher) {
        let shape = RecordShape::derive(&schema()).unwrap();
        let publisher = Publisher {
            shape,
            output: Location::open(&format!("memory://flow-{tag}/out")).unwrap(),
            rejects: Location::open(&format!("memory://flow-{tag}/rej")).unwrap(),
            pipeline: "test".into(),
            model: "fake".into(),
            model_runtime: String::new(),
            schema_sha256: "0".into(),
            row_group_rows: 2,
            zstd_level: 3,
        };
        (
            Flow::new(fake, Validator::new(&schema(), "s").unwrap()),
            publisher,
        )
    }

    fn input(off: i64, text: &[u8]) -> Input {
        decode(
            text,
            ValueFormat::Text,
            &DocFields::default(),
            64,
            Lineage::new("t", Some(0), off),
        )
    }

    fn run_file(flow: &mut Flow<Fake>, group: &str, name: &str, docs: &[&[u8]], first: i64) -> u64 {
        let id = flow.open(String::new(), group.into(), Vec::new());
        for (i, d) in docs.iter().enumerate() {
            flow.push(id, input(first + i as i64, d));
        }
        flow.seal_as(id, name.into(), None);
        id
    }

    fn drain(flow: &mut Flow<Fake>) -> Vec<OpenFile> {
        let mut out = Vec::new();
        for _ in 0..100 {
            flow.pump().unwrap();
            out.extend(flow.take_ready());
            if flow.pending() == 0 {
                out.extend(flow.take_ready());
                break;
            }
        }
        out
    }

    #[test]
    fn outcomes_are_sorted_and_counts_conserved() {
        let (mut flow, publisher) = setup("sorted", fake().refusing());
        let docs: Vec<&[u8]> = vec![
            b"ok",
            b"\xff",
            b"",
            b"far too long a name",
            b"cutx",
            b"refuse",
            b"slow",
        ];
        run_file(&mut flow, "g", "a.parquet", &docs, 0);
        let files = drain(&mut flow);
        assert_eq!(files.len(), 1);
        let r = publisher
            .publish(files.into_iter().next().unwrap())
            .unwrap();
        assert_eq!((r.consumed, r.accepted, r.rejected), (7, 2, 5));
        let causes: Vec<_> = r.causes.keys().copied().collect();
        assert_eq!(
            causes,
            [
                "empty",
                "invalid_utf8",
                "schema_violation",
                "template",
                "truncated"
            ]
        );
        assert_eq!(offsets_of(&publisher.output, "a.parquet"), vec![0, 6]);
        assert_eq!(
            offsets_of(&publisher.rejects, "a.parquet"),
            vec![1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn files_of_a_group_publish_in_order() {
        let (mut flow, _) = setup_plain("order");
        run_file(&mut flow, "g", "1", &[b"slow"], 0);
        run_file(&mut flow, "g", "2", &[b"fast"], 1);
        run_file(&mut flow, "h", "3", &[b"fast"], 0);
        flow.pump().unwrap();
        let names: Vec<String> = flow.take_ready().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["3"], "file 2 waits for file 1 of its group");
        flow.pump().unwrap();
        let names: Vec<String> = flow.take_ready().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["1", "2"]);
    }

    #[test]
    fn a_replay_after_a_crash_between_files_lands_each_offset_once() {
        let (mut flow, publisher) = setup_plain("replay");
        run_file(&mut flow, "g", "r.parquet", &[b"a", b"bb", b"nine char"], 0);
        let first = drain(&mut flow).pop().unwrap();
        // The crash: the accepted part of an earlier run, and no rejects marker.
        let mut earlier = first;
        earlier.outcomes[1] = Some(Outcome::Rejected {
            cause: RejectCause::Truncated,
            raw_output: None,
            finish: None,
            stats: DocStats::default(),
        });
        let ctx = publisher.context();
        let mut rows = Vec::new();
        for (i, o) in earlier.outcomes.iter().enumerate() {
            if let Some(Outcome::Accepted { record, finish, .. }) = o {
                rows.push(AcceptedRow {
                    lineage: earlier.inputs[i].lineage.clone(),
                    doc_id: "x".into(),
                    finish: finish.clone(),
                    record: record.clone(),
                });
            }
        }
        let (batch, _) = accepted_batch(&publisher.shape, &ctx, rows);
        publisher
            .output
            .publish("r.parquet", to_parquet(&batch, &[], 10, 3).unwrap())
            .unwrap();

        // The replay accepts offset 1 this time; the earlier file stands and 1 goes to rejects.
        run_file(&mut flow, "g", "r.parquet", &[b"a", b"bb", b"nine char"], 0);
        let r = publisher.publish(drain(&mut flow).pop().unwrap()).unwrap();
        assert!(r.replayed);
        assert_eq!((r.accepted, r.rejected), (1, 2));
        assert_eq!(r.causes.get("replay_mismatch"), Some(&1));
        let acc = offsets_of(&publisher.output, "r.parquet");
        let mut rej = offsets_of(&publisher.rejects, "r.parquet");
        rej.sort();
        assert_eq!(acc, vec![0]);
        assert_eq!(rej, vec![1, 2]);
    }

    /// [`setup`] with a fake that refuses nothing and has nothing queued.
    fn setup_plain(name: &str) -> (Flow<Fake>, Publisher) {
        setup(name, fake())
    }

    /// Publishes one file `name` of `docs` (offsets from 0) through `publisher`.
    fn publish_docs(publisher: &Publisher, name: &str, docs: &[&[u8]]) -> FileReport {
        let (mut flow, _) = setup_plain("unused");
        run_file(&mut flow, "g", name, docs, 0);
        publisher.publish(drain(&mut flow).pop().unwrap()).unwrap()
    }

    #[test]
    fn a_file_another_worker_published_first_is_a_duplicate_that_publishes_nothing() {
        let (_, publisher) = setup_plain("dup");
        let first = publish_docs(&publisher, "d.parquet", &[b"a", b"far too long a name"]);
        assert!(!first.duplicate);
        assert_eq!((first.accepted, first.rejected), (1, 1));
        let marker = publisher
            .rejects
            .read(&publisher.rejects.path("d.parquet"))
            .unwrap();
        // The second worker decodes differently (both accepted); the first's files stand.
        let second = publish_docs(&publisher, "d.parquet", &[b"a", b"bb"]);
        assert!(second.duplicate);
        assert_eq!(second.duplicated_docs, 2);
        assert_eq!(
            (second.consumed, second.accepted, second.rejected),
            (0, 0, 0)
        );
        assert_eq!(offsets_of(&publisher.output, "d.parquet"), vec![0]);
        assert_eq!(
            publisher
                .rejects
                .read(&publisher.rejects.path("d.parquet"))
                .unwrap(),
            marker
        );
    }

    /// `publisher` as a worker whose check for the marker came just before another's landed.
    fn looked_early(publisher: &Publisher) -> Publisher {
        let stale = std::sync::Arc::new(
            crate::faults::FaultyStore::new(publisher.rejects.store.clone(), 0, false)
                .stale_heads(1),
        );
        Publisher {
            rejects: publisher.rejects.clone().with_store(stale),
            ..publisher.clone()
        }
    }

    #[test]
    fn an_accepted_file_that_races_a_marker_holding_its_documents_is_withdrawn() {
        let (_, publisher) = setup_plain("race");
        // Worker X rejects both documents: it publishes no accepted file, only its marker.
        let x = publish_docs(
            &publisher,
            "r.parquet",
            &[b"far too long a name", b"also far too long"],
        );
        assert_eq!((x.accepted, x.rejected), (0, 2));
        // Worker Y looked before X's marker landed (a stale check), accepts both, and its
        // accepted file lands after X's marker: X's marker holds them already, so Y's file goes.
        let y_publisher = looked_early(&publisher);
        let y = publish_docs(&y_publisher, "r.parquet", &[b"a", b"bb"]);
        assert!(y.duplicate);
        assert_eq!(y.duplicated_docs, 2);
        assert!(!publisher.output.exists("r.parquet").unwrap());
        assert_eq!(offsets_of(&publisher.rejects, "r.parquet"), vec![0, 1]);

        // Had X seen Y's accepted file, X's marker would hold only what Y lacks, and Y's file stays.
        let x2 = publish_docs(&publisher, "s.parquet", &[b"a", b"far too long a name"]);
        assert_eq!((x2.accepted, x2.rejected), (1, 1));
        let y2_publisher = looked_early(&publisher);
        let y2 = publish_docs(&y2_publisher, "s.parquet", &[b"a", b"far too long a name"]);
        assert!(y2.duplicate);
        assert_eq!(offsets_of(&publisher.output, "s.parquet"), vec![0]);
        assert_eq!(offsets_of(&publisher.rejects, "s.parquet"), vec![1]);
    }

    /// Two workers that decode alike, the second looking for the marker just before the first's
    /// landed: both markers hold no rows, so without a name of its own the second took the
    /// first's marker for its own lost write and reported the file as its own too.
    #[test]
    fn a_marker_equal_in_rows_to_another_workers_is_still_a_duplicate() {
        let (_, publisher) = setup_plain("alike");
        let x = publish_docs(&publisher, "e.parquet", &[b"a", b"bb"]);
        assert!(!x.duplicate);
        assert_eq!((x.accepted, x.rejected), (2, 0));
        let y = publish_docs(&looked_early(&publisher), "e.parquet", &[b"a", b"bb"]);
        assert!(y.duplicate, "the second worker claimed the file: {y:?}");
        assert_eq!(offsets_of(&publisher.output, "e.parquet"), vec![0, 1]);
        assert!(offsets_of(&publisher.rejects, "e.parquet").is_empty());
    }

    /// Publishes the range `p/<first>-<last>.parquet` (a document "a" at each offset) through
    /// `publisher`, claiming `p/_claim-<first>` first.
    fn publish_range(publisher: &Publisher, first: i64, last: i64) -> FileReport {
        let (mut flow, _) = setup_plain("unused");
        let docs = vec![b"a" as &[u8]; (last - first + 1) as usize];
        let name = format!("p/{first}-{last}.parquet");
        let id = run_file(&mut flow, "g", &name, &docs, first);
        flow.seal_as(id, name, Some(format!("p/_claim-{first}")));
        publisher.publish(drain(&mut flow).pop().unwrap()).unwrap()
    }

    /// Two workers cut one partition's offsets into ranges that start at the same offset and end
    /// apart (one expelled from the group but still running, and the new owner): the first claim
    /// stands, and the other worker publishes nothing of its range and names the one that holds
    /// the claim. A claim that holds the file's own range (a publish under way elsewhere, or one
    /// a crash left) is not a conflict.
    #[test]
    fn a_range_whose_first_offset_another_range_claimed_publishes_nothing() {
        let (_, publisher) = setup_plain("claims");
        let owner = publish_range(&publisher, 0, 4);
        assert_eq!((owner.accepted, owner.fenced.as_deref()), (5, None));
        let zombie = publish_range(&publisher, 0, 2);
        assert_eq!(
            zombie.fenced.as_deref(),
            Some("p/0-4.parquet"),
            "{zombie:?}"
        );
        assert_eq!(
            (zombie.consumed, zombie.accepted, zombie.duplicated_docs),
            (0, 0, 3)
        );
        for loc in [&publisher.output, &publisher.rejects] {
            assert!(!loc.exists("p/0-2.parquet").unwrap());
        }
        let published = offsets_of(&publisher.output, "p/0-4.parquet");
        assert_eq!(published, vec![0, 1, 2, 3, 4]);

        // Claimed by a worker that crashed before its files: the replay publishes that range.
        let held = bytes::Bytes::from_static(b"p/5-6.parquet");
        publisher.rejects.publish("p/_claim-5", held).unwrap();
        let replay = publish_range(&publisher, 5, 6);
        assert_eq!((replay.accepted, replay.fenced.as_deref()), (2, None));
        assert_eq!(offsets_of(&publisher.output, "p/5-6.parquet"), vec![5, 6]);
    }

    #[test]
    fn abandoned_groups_drop_their_work() {
        let (mut flow, _) = setup_plain("abandon");
        run_file(&mut flow, "g", "1", &[b"slow", b"x"], 0);
        run_file(&mut flow, "h", "2", &[b"slow"], 0);
        flow.pump().unwrap();
        assert_eq!(flow.abandon("g"), 2);
        let names: Vec<String> = drain(&mut flow).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["2"]);
        assert_eq!(flow.pending(), 0);
    }
}
