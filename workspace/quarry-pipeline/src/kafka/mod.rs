//! Kafka workers (`quarry worker`): a consumer group member with `cooperative-sticky` assignment
//! and manual commits, feeding the engine between polls.
//!
//! Each assigned partition's messages are cut into offset ranges (`batching.file_docs` documents
//! or `batching.flush_ms`, whichever comes first), and each range is one output file named
//! `topic=T/partition=P/<first>-<last>.parquet`. After a range's rejects marker is published (see
//! [`crate::flow`]) its offset is committed. On assignment the worker reconciles from the output:
//! it resumes after the highest published marker, and when it finds an accepted file without a
//! marker (a crash between the two) it replays exactly that range under exactly that name. Each
//! range first claims its first offset (`ranges`' module docs): a worker whose claim another range
//! holds publishes nothing of it and reads the partition again from the output
//! (`Worker::fenced`), so a worker expelled from the group but still running cannot publish a
//! range that overlaps the new owner's.
//!
//! ## Assignment
//! librdkafka's rebalance callback does no I/O: it hands the partitions to the job loop and
//! returns. The loop reconciles each partition from the output store and only then makes the
//! assign call, with each partition's offset set to where it resumes, so a partition's first
//! fetch already starts at the right offset (a seek after assigning would not do: librdkafka
//! refuses to seek a partition whose fetcher has not started). Until the loop answers, the group
//! waits for this member, as it did while the callback read the store. Revocation stays in the
//! callback: closing the consumer calls it and waits for the unassign.
//!
//! The loop never blocks on the model for long: it polls the consumer between engine steps, and a
//! partition with `batching.max_buffered` documents waiting is paused (not left) until they drain.
//! Nor does it block on the store: `output.publishers` threads publish finished files beside it,
//! one at a time per partition and in order, and the loop commits each range when its publish
//! comes back (see [`crate::lanes`]). Commits are asynchronous; one not confirmed is made again, and
//! waited for, when the worker stops.
//!
//! ## Input the worker cannot move past
//! Every codec Kafka defines is decoded (none, gzip, snappy, lz4, zstd). When a partition still
//! cannot move (a corrupt batch, a fetch error that repeats), librdkafka retries the same offset
//! forever and reports errors without saying which partition they belong to. So the worker watches
//! each partition instead: one that stays behind its high watermark (librdkafka's statistics) with
//! nothing delivered is *stalled*. After [`STALL_WARN`] it is counted in
//! `quarry_stalled_partitions` and logged once, naming topic, partition, offset and the consumer
//! errors seen since it last moved; after `source.stall_timeout_s` the worker drains what it holds
//! and stops with [`PipelineError::Stalled`] (a non-zero exit). Nothing is ever skipped.
//! Consumer errors are counted by kind in `quarry_consumer_errors_total` and logged once per kind
//! a minute, not once per retry.
//!
//! ## Stopping
//! Every stop reports each assigned partition's lag (committed offset against high watermark).
//! `--idle-exit` succeeds only when all of them are zero; otherwise [`WorkerSummary::verdict`]
//! is [`PipelineError::LagLeft`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::BaseProducer;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{KafkaSource, PipelineConfig, SourceConfig, TombstonePolicy};
use crate::error::{PartitionLag, PipelineError, StallCause};
use crate::extract::Extractor;
use crate::flow::{FileReport, Flow, Publisher};
use crate::metrics::{ErrorKindLabel, Metrics, PartitionLabel};
use crate::record::{decode, tombstone, Lineage};
use crate::shutdown::Shutdown;

mod client;
mod dead_letters;
mod ranges;
mod summary;

pub use client::{client_properties, ENV_PREFIX};
pub use ranges::{
    claim_name, commit_metadata, committed_range, list_from, parse_range, partition_dir,
    range_name, reconcile, ListFrom, PublishedRange, Reconciled,
};
pub use summary::{Stall, StopReason, WorkerSummary};

use crate::lanes::{Lanes, UnderWay};
use client::{error_kind, Event, Throttle, WorkerContext};
use dead_letters::DeadLetters;

/// A partition as librdkafka's statistics last saw it (every 5 s, no broker round trip).
#[derive(Debug, Clone, Copy, PartialEq)]
struct FetchStats {
    /// Messages behind the high watermark, from the committed offset.
    consumer_lag: i64,
    hi_offset: i64,
    lo_offset: i64,
    committed_offset: i64,
    /// The offset the fetcher asks the broker for next (negative while it has none).
    next_offset: i64,
}

impl FetchStats {
    /// The partition has records beyond `position` that the fetcher has not got past.
    fn behind(&self, position: Option<i64>) -> bool {
        let start = position.unwrap_or(if self.committed_offset >= 0 {
            self.committed_offset
        } else {
            self.lo_offset
        });
        self.hi_offset > start.max(self.next_offset)
    }
}

/// Options a caller adds to a worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    pub brokers: Option<String>,
    pub group: Option<String>,
    /// Static group membership (`group.instance.id`): a restarted worker with the same id takes
    /// its partitions back at once instead of waiting for the group to expire its old session.
    pub instance_id: Option<String>,
    /// Stop gracefully after this long with nothing consumed and nothing in flight.
    pub idle_exit: Option<Duration>,
    /// Overrides `source.stall_timeout_s`.
    pub stall_timeout: Option<Duration>,
    /// The `QUARRY_KAFKA_*` variables ([`ENV_PREFIX`]) that set client properties over
    /// `source.properties` (credentials from a Kubernetes Secret): the binary passes its
    /// environment's; this crate reads none.
    pub client_env: Vec<(String, String)>,
}

/// The file a partition is filling.
#[derive(Debug, Clone, Copy)]
struct OpenRange {
    /// The flow's id of the file.
    file: u64,
    /// When it was opened (the `flush_ms` clock).
    since: Instant,
}

struct Part {
    /// The next offset this worker expects; earlier deliveries are stale.
    next: Option<i64>,
    open: Option<OpenRange>,
    replay: Option<PublishedRange>,
    paused: bool,
    /// The last time this partition moved (a delivery), was assigned or resumed, or had nothing
    /// left to read: the stall clock.
    progress: Instant,
    /// Counted in `quarry_stalled_partitions` and logged.
    stalled: bool,
    /// When the broker was last asked for this partition's watermarks by the stall check, and
    /// its answer (kept until the next question).
    asked: Option<(Instant, Standing)>,
    /// The offset after the last published range, and whether its (asynchronous) commit is not
    /// known to have landed: made again, synchronously, when the worker stops, so the lag it
    /// reports is true.
    published_next: Option<i64>,
    commit_pending: bool,
    /// The last range known published with its marker (this worker's last, or the reconcile's):
    /// its first offset goes with each commit ([`commit_metadata`]), and a reconcile of the
    /// partition starts its listing there.
    marked: Option<(i64, i64)>,
}

impl Part {
    fn new(r: Reconciled) -> Self {
        let next = r.resume;
        Self {
            next,
            open: None,
            replay: r.replay,
            paused: false,
            progress: Instant::now(),
            stalled: false,
            asked: None,
            // Reconciled from the output: everything before it has its rejects marker.
            published_next: next,
            commit_pending: false,
            marked: r.marked,
        }
    }
}

/// Adds partition `p`'s commit of the offset after `range` to `tpl`, with the range's first
/// offset as its metadata ([`commit_metadata`]).
fn add_commit(
    tpl: &mut TopicPartitionList,
    topic: &str,
    p: i32,
    (first, last): (i64, i64),
) -> Result<(), KafkaError> {
    let mut e = tpl.add_partition(topic, p);
    e.set_offset(Offset::Offset(last + 1))?;
    e.set_metadata(commit_metadata(first));
    Ok(())
}

/// A partition with nothing delivered for this long while behind is counted and logged as stalled
/// (the worker stops only at `source.stall_timeout_s`).
pub const STALL_WARN: Duration = Duration::from_secs(15);

/// Broker round trips at stop (committed offsets, watermarks) give up after this long.
const STOP_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A fenced partition's seek gives up after this long (and stops the worker).
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// The stall check's watermark query blocks the loop at most this long (rare: only for a quiet
/// partition whose end librdkafka's statistics do not know).
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);

/// A partition against its high watermark, for the stall check.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Standing {
    /// Nothing left to read, or paused by the worker: the stall clock restarts.
    CaughtUp,
    /// Records from `offset` on are not delivered (`high_watermark` `None`: the broker cannot say).
    Behind {
        offset: Option<i64>,
        high_watermark: Option<i64>,
    },
    /// Not known yet: the clock keeps running.
    Unknown,
}

/// A running worker.
pub struct Worker<'a, E: Extractor> {
    src: KafkaSource,
    cfg: &'a PipelineConfig,
    consumer: BaseConsumer<WorkerContext>,
    dead_letters: Option<DeadLetters>,
    flow: &'a mut Flow<E>,
    publisher: &'a Publisher,
    metrics: &'a Metrics,
    parts: HashMap<i32, Part>,
    summary: WorkerSummary,
    stall_limit: Duration,
    /// Consumer errors by kind: how many, and when the last one came.
    errors: BTreeMap<String, (u64, Instant)>,
    errors_logged: Throttle,
    stop: StopReason,
}

fn kafka_err(op: &'static str, source: KafkaError) -> PipelineError {
    PipelineError::Kafka { op, source }
}

impl<'a, E: Extractor> Worker<'a, E> {
    pub fn new(
        cfg: &'a PipelineConfig,
        opts: &WorkerOptions,
        flow: &'a mut Flow<E>,
        publisher: &'a Publisher,
        metrics: &'a Metrics,
    ) -> Result<Self, PipelineError> {
        let SourceConfig::Kafka(src) = &cfg.source else {
            return Err(PipelineError::WrongSource {
                pipeline: cfg.name.clone(),
                command: "quarry worker",
                needs: "kafka",
            });
        };
        let mut src = src.clone();
        if let Some(b) = &opts.brokers {
            src.brokers = b.clone();
        }
        if let Some(g) = &opts.group {
            src.group = g.clone();
        }
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &src.brokers)
            .set("group.id", &src.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("client.id", format!("quarry-{}", cfg.name))
            .set("statistics.interval.ms", "5000");
        if let Some(id) = &opts.instance_id {
            cc.set("group.instance.id", id);
        }
        let props = client_properties(&src, opts.client_env.iter().cloned());
        for (k, v) in &props {
            cc.set(k, v);
        }
        // Without a `log` logger rdkafka would silence librdkafka; its lines go to tracing.
        cc.set_log_level(if src.properties.contains_key("debug") {
            rdkafka::config::RDKafkaLogLevel::Debug
        } else {
            rdkafka::config::RDKafkaLogLevel::Info
        });
        let ctx = WorkerContext {
            topic: src.topic.clone(),
            events: Mutex::new(Vec::new()),
            commits: Mutex::new(Vec::new()),
            under_way: Arc::new(UnderWay::default()),
            fetch: Mutex::new(HashMap::new()),
            errors_logged: Mutex::new(Throttle::default()),
        };
        let consumer: BaseConsumer<WorkerContext> = cc
            .create_with_context(ctx)
            .map_err(|e| kafka_err("consumer", e))?;
        consumer
            .subscribe(&[&src.topic])
            .map_err(|e| kafka_err("subscribe", e))?;
        let dead_letters = match &cfg.rejects.dead_letter_topic {
            Some(topic) => {
                let mut pc = ClientConfig::new();
                pc.set("bootstrap.servers", &src.brokers);
                for (k, v) in &props {
                    pc.set(k, v);
                }
                let p: BaseProducer = pc
                    .create()
                    .map_err(|e| kafka_err("dead-letter producer", e))?;
                Some(DeadLetters {
                    producer: p,
                    topic: topic.clone(),
                })
            }
            None => None,
        };
        let stall_limit = opts
            .stall_timeout
            .unwrap_or(Duration::from_secs(src.stall_timeout_s));
        let summary = WorkerSummary {
            topic: src.topic.clone(),
            stall_limit,
            ..WorkerSummary::default()
        };
        Ok(Self {
            src,
            cfg,
            consumer,
            dead_letters,
            flow,
            publisher,
            metrics,
            parts: HashMap::new(),
            summary,
            stall_limit,
            errors: BTreeMap::new(),
            errors_logged: Throttle::default(),
            stop: StopReason::Signal,
        })
    }

    fn group(&self, p: i32) -> String {
        partition_dir(&self.src.topic, p)
    }

    /// Runs until a signal (or `idle_exit`) stops it. Files are published on threads beside the
    /// loop ([`crate::lanes`]); they end before this returns, and the consumer closes after them.
    pub fn run(
        mut self,
        shutdown: &Shutdown,
        opts: &WorkerOptions,
    ) -> Result<WorkerSummary, PipelineError> {
        let publisher = self.publisher;
        let dead_letters = self.dead_letters.take();
        let under_way = self.consumer.context().under_way.clone();
        let publishers = self.cfg.output.publishers;
        let send = |r: &FileReport| dead_letters.as_ref().map_or(Ok(()), |d| d.send(r));
        std::thread::scope(|scope| {
            let mut lanes = Lanes::start(scope, publisher, Some(&send), publishers, under_way);
            self.run_loop(&mut lanes, shutdown, opts)
        })
    }

    fn run_loop(
        &mut self,
        lanes: &mut Lanes,
        shutdown: &Shutdown,
        opts: &WorkerOptions,
    ) -> Result<WorkerSummary, PipelineError> {
        let started = Instant::now();
        let mut last_activity = Instant::now();
        let mut last_lag = Instant::now() - Duration::from_secs(60);
        let mut draining = false;
        loop {
            self.metrics.beat();
            if shutdown.abandon() {
                self.stop = StopReason::Abandoned;
                let n: usize = self
                    .parts
                    .keys()
                    .map(|p| self.group(*p))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(|g| self.flow.abandon(g))
                    .sum::<usize>()
                    + lanes.forget_all();
                self.summary.abandoned += n as u64;
                tracing::warn!(
                    abandoned = n,
                    "second signal: in-flight work abandoned, uncommitted"
                );
                break;
            }
            // Idle only counts once partitions are assigned (a restarted member waits for the
            // group to expire its predecessor), or after 60 s more with none.
            let idle_now = idle(opts, last_activity)
                && (!self.parts.is_empty() || idle(opts, started + Duration::from_secs(60)));
            let stalled = self.summary.stall.is_some();
            if (shutdown.requested() || idle_now || stalled) && !draining {
                draining = true;
                self.stop = if stalled {
                    StopReason::Stalled
                } else if shutdown.requested() {
                    StopReason::Signal
                } else {
                    StopReason::Idle
                };
                tracing::info!(stop = ?self.stop, "draining: no new messages; finishing and publishing what is held");
                self.pause_all()?;
            }
            if draining {
                let open: Vec<i32> = self.parts.keys().copied().collect();
                for p in open {
                    if self.parts[&p].replay.is_some() {
                        // A replay must end exactly where the earlier file did; short of that, it
                        // is left uncommitted for the next run.
                        let dropped = self.flow.abandon(&self.group(p));
                        self.summary.abandoned += dropped as u64;
                        self.parts.get_mut(&p).expect("present").open = None;
                    } else {
                        self.seal_open(p);
                    }
                }
            }
            // Take what the broker has, without waiting while the engine has work.
            let busy = self.flow.pending() > 0;
            let mut taken = 0;
            loop {
                let timeout = if busy || taken > 0 {
                    Duration::ZERO
                } else {
                    Duration::from_millis(100)
                };
                match self.consumer.poll(timeout) {
                    Some(Ok(msg)) => {
                        let (p, off) = (msg.partition(), msg.offset());
                        let mut lineage = Lineage::new(msg.topic(), Some(p), off);
                        lineage.key = msg.key().map(<[u8]>::to_vec);
                        lineage.timestamp_ms = msg.timestamp().to_millis();
                        lineage.headers = msg.headers().map(|h| {
                            let map: serde_json::Map<String, serde_json::Value> = h
                                .iter()
                                .map(|x| {
                                    let v =
                                        x.value.map(|b| String::from_utf8_lossy(b).into_owned());
                                    (x.key.to_string(), v.into())
                                })
                                .collect();
                            serde_json::Value::Object(map).to_string()
                        });
                        let (input, skip) = match msg.payload() {
                            Some(bytes) => (
                                decode(
                                    bytes,
                                    self.src.value,
                                    &self.src.fields,
                                    self.cfg.batching.max_doc_bytes,
                                    lineage,
                                ),
                                false,
                            ),
                            None => (
                                tombstone(lineage),
                                self.src.tombstones == TombstonePolicy::Skip,
                            ),
                        };
                        drop(msg);
                        self.take_message(p, off, input, skip);
                        self.summary
                            .first_message_s
                            .get_or_insert_with(|| started.elapsed().as_secs_f64());
                        taken += 1;
                        last_activity = Instant::now();
                        if taken >= 1000 {
                            break;
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {}
                    Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                        return Err(kafka_err("fatal consumer error", e));
                    }
                    Some(Err(e)) => {
                        self.consumer_error(&e);
                        break;
                    }
                    None => break,
                }
            }
            let before = self.parts.len();
            self.handle_events(lanes)?;
            if self.parts.len() > before {
                last_activity = Instant::now();
            }
            self.flush_timers();
            let t = Instant::now();
            if self.flow.pump()? {
                self.metrics.step(t.elapsed());
                last_activity = Instant::now();
            }
            self.metrics.in_flight.set(self.flow.pending() as i64);
            if let Some(s) = self.flow.extractor.engine_stats() {
                self.metrics.engine(&s);
            }
            let mut done = Vec::new();
            let waited = lanes.wait_s;
            for file in self.flow.take_ready() {
                lanes.publish(file, &mut done)?;
            }
            // Draining with nothing left to step: wait for the publishes rather than spin.
            let wait =
                (draining && self.flow.open_files() == 0).then_some(Duration::from_millis(100));
            lanes.collect(wait, &mut done)?;
            self.metrics.io_waited(lanes.wait_s - waited);
            for (report, secs) in &done {
                self.metrics.published(*secs);
                match &report.fenced {
                    Some(holder) => self.fenced(report, holder, lanes)?,
                    None => self.after_publish(report)?,
                }
            }
            self.resume_drained()?;
            if last_lag.elapsed() > Duration::from_secs(1) {
                self.update_lag();
                if !draining {
                    self.check_stalls();
                }
                last_lag = Instant::now();
            }
            if draining && self.flow.open_files() == 0 && lanes.held() == 0 {
                break;
            }
        }
        self.summary.publish_s = lanes.publish_s;
        self.summary.publish_wait_s = lanes.wait_s;
        self.summary.stop = self.stop;
        let stopping = Instant::now();
        self.retry_commits();
        self.summary.lag = self.final_lag();
        self.summary.lag_total = self.summary.lag.iter().filter_map(|l| l.lag).sum();
        self.summary.consumer_errors = self
            .errors
            .iter()
            .map(|(k, (n, _))| (k.clone(), *n))
            .collect();
        self.summary.stop_s = stopping.elapsed().as_secs_f64();
        self.summary.wall_s = started.elapsed().as_secs_f64();
        Ok(std::mem::take(&mut self.summary))
    }

    /// Counts a consumer error and logs it once per kind and [`LOG_EVERY`]. librdkafka does not
    /// say which partition a fetch error belongs to; [`Worker::check_stalls`] finds that out.
    fn consumer_error(&mut self, e: &KafkaError) {
        let kind = error_kind(e);
        self.metrics
            .consumer_errors
            .get_or_create(&ErrorKindLabel { kind: kind.clone() })
            .inc();
        let entry = self
            .errors
            .entry(kind.clone())
            .or_insert((0, Instant::now()));
        entry.0 += 1;
        entry.1 = Instant::now();
        if let Some(held) = self.errors_logged.admit(&kind) {
            tracing::warn!(topic = %self.src.topic, error = %e, kind = %kind, held_back = held, total = entry.0, "consumer error");
        }
    }

    /// The consumer errors seen since `since`, for a stall's cause.
    fn errors_since(&self, since: Instant) -> StallCause {
        StallCause {
            consumer_errors: self
                .errors
                .iter()
                .filter(|(_, (_, last))| *last >= since)
                .map(|(k, (n, _))| (k.clone(), *n))
                .collect(),
        }
    }

    /// Where a partition stands against its high watermark: from librdkafka's statistics, or,
    /// when they do not know its end (a broker that drops every fetch never reports one), from
    /// the broker, asked at most once per [`STALL_WARN`] and only for a partition that is quiet.
    fn standing(&mut self, p: i32, stats: Option<&FetchStats>, quiet: bool) -> Standing {
        let part = &self.parts[&p];
        if part.paused {
            return Standing::CaughtUp;
        }
        if let Some(st) = stats {
            return if st.behind(part.next) {
                let offset = part
                    .next
                    .unwrap_or(st.next_offset.max(st.committed_offset).max(st.lo_offset));
                Standing::Behind {
                    offset: Some(offset),
                    high_watermark: Some(st.hi_offset),
                }
            } else {
                Standing::CaughtUp
            };
        }
        if !quiet {
            return Standing::Unknown;
        }
        if let Some((at, answer)) = part.asked {
            if at.elapsed() < STALL_WARN && at >= part.progress {
                return answer;
            }
        }
        let next = part.next;
        let since = part.progress;
        let answer = match self
            .consumer
            .fetch_watermarks(&self.src.topic, p, WATERMARK_TIMEOUT)
        {
            Ok((low, high)) => {
                let offset = next.unwrap_or(low).max(low);
                if high > offset {
                    Standing::Behind {
                        offset: Some(offset),
                        high_watermark: Some(high),
                    }
                } else {
                    Standing::CaughtUp
                }
            }
            // The broker cannot even say where the partition ends: behind if the client keeps
            // failing since the partition last moved.
            Err(_) if self.errors.values().any(|(_, last)| *last >= since) => Standing::Behind {
                offset: next,
                high_watermark: None,
            },
            Err(_) => Standing::Unknown,
        };
        self.parts.get_mut(&p).expect("present").asked = Some((Instant::now(), answer));
        answer
    }

    /// Finds partitions that are behind with nothing delivered: logs and counts them after
    /// [`STALL_WARN`], and stops the worker after the stall timeout.
    fn check_stalls(&mut self) {
        let fetch = self
            .consumer
            .context()
            .fetch
            .lock()
            .expect("fetch lock")
            .clone();
        let now = Instant::now();
        let warn_after = STALL_WARN.min(self.stall_limit);
        let mut found: Option<Stall> = None;
        let mut count = 0;
        let mut ps: Vec<i32> = self.parts.keys().copied().collect();
        ps.sort();
        for p in ps {
            let idle_for = now.duration_since(self.parts[&p].progress);
            let (offset, high_watermark) = match self.standing(
                p,
                fetch.get(&p),
                idle_for >= warn_after,
            ) {
                Standing::Behind {
                    offset,
                    high_watermark,
                } => (offset, high_watermark),
                Standing::Unknown => continue,
                Standing::CaughtUp => {
                    let part = self.parts.get_mut(&p).expect("present");
                    part.progress = now;
                    if part.stalled {
                        tracing::info!(topic = %self.src.topic, partition = p, "partition moves again");
                    }
                    part.stalled = false;
                    continue;
                }
            };
            if idle_for < warn_after {
                continue;
            }
            count += 1;
            let stall = Stall {
                partition: p,
                offset,
                high_watermark,
                stalled: idle_for,
                cause: self.errors_since(self.parts[&p].progress),
            };
            if !self.parts[&p].stalled {
                tracing::error!(
                    topic = %self.src.topic,
                    partition = p,
                    offset = ?offset,
                    high_watermark = ?high_watermark,
                    stalled_s = idle_for.as_secs(),
                    stall_timeout_s = self.stall_limit.as_secs(),
                    cause = %stall.cause,
                    "partition stalled: nothing delivered while behind; the worker stops at the stall timeout unless it moves"
                );
                self.parts.get_mut(&p).expect("present").stalled = true;
            }
            if idle_for >= self.stall_limit && found.is_none() {
                found = Some(stall);
            }
        }
        self.metrics.stalled_partitions.set(count);
        if let Some(stall) = found {
            tracing::error!(
                topic = %self.src.topic,
                partition = stall.partition,
                offset = ?stall.offset,
                cause = %stall.cause,
                "stall timeout: draining and stopping with a non-zero exit"
            );
            self.summary.stall = Some(stall);
        }
    }

    /// Commits again, synchronously, the published ranges whose commit is not known to have
    /// landed (failed, or not yet answered).
    fn retry_commits(&mut self) {
        let mut tpl = TopicPartitionList::new();
        for (p, part) in &self.parts {
            if let (true, Some((first, last))) = (part.commit_pending, part.marked) {
                if add_commit(&mut tpl, &self.src.topic, *p, (first, last)).is_err() {
                    return;
                }
            }
        }
        if tpl.count() == 0 {
            return;
        }
        match self.consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                tracing::info!(
                    partitions = tpl.count(),
                    "commits not yet confirmed made again at stop"
                );
                for part in self.parts.values_mut() {
                    part.commit_pending = false;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "failed commits still fail at stop; the lag shows them")
            }
        }
    }

    /// Every assigned partition's committed offset against its high watermark, from the broker.
    fn final_lag(&self) -> Vec<PartitionLag> {
        let committed: HashMap<i32, i64> = match self.consumer.committed(STOP_QUERY_TIMEOUT) {
            Ok(tpl) => tpl
                .elements_for_topic(&self.src.topic)
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the committed offsets");
                HashMap::new()
            }
        };
        let mut ps: Vec<i32> = self.parts.keys().copied().collect();
        ps.sort();
        ps.into_iter()
            .map(|p| {
                let marks = self
                    .consumer
                    .fetch_watermarks(&self.src.topic, p, STOP_QUERY_TIMEOUT);
                let c = committed.get(&p).copied();
                let published = self.parts[&p].published_next;
                let (high, lag) = match marks {
                    Ok((low, high)) => {
                        let done = [c, published].into_iter().flatten().fold(low, i64::max);
                        (Some(high), Some((high - done).max(0)))
                    }
                    Err(e) => {
                        tracing::warn!(partition = p, error = %e, "cannot read the watermarks");
                        (None, None)
                    }
                };
                PartitionLag {
                    partition: p,
                    committed: c,
                    published,
                    high_watermark: high,
                    lag,
                }
            })
            .collect()
    }

    fn take_message(&mut self, p: i32, off: i64, input: crate::record::Input, skip: bool) {
        let group = self.group(p);
        let Some(part) = self.parts.get_mut(&p) else {
            // Delivered for a partition revoked since: the new owner will read it.
            return;
        };
        if part.next.is_some_and(|n| off < n) {
            return;
        }
        part.next = Some(off + 1);
        part.progress = Instant::now();
        let file = match part.open {
            Some(o) => o.file,
            None => {
                let file = self.flow.open(String::new(), group.clone(), Vec::new());
                part.open = Some(OpenRange {
                    file,
                    since: Instant::now(),
                });
                file
            }
        };
        if skip {
            self.flow.push_skipped(file, input);
        } else {
            self.flow.push(file, input);
        }
        let len = self.flow.file(file).map(|f| f.len()).unwrap_or(0);
        let replay_end = part.replay.as_ref().map(|r| r.last);
        let full = match replay_end {
            Some(last) => off >= last,
            None => len >= self.cfg.batching.file_docs,
        };
        if full {
            self.seal_open(p);
        }
        if !self.parts[&p].paused && self.flow.pending_in(&group) >= self.cfg.batching.max_buffered
        {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.src.topic, p);
            if self.consumer.pause(&tpl).is_ok() {
                self.parts.get_mut(&p).expect("present").paused = true;
                tracing::debug!(partition = p, "paused: buffer full");
            }
        }
    }

    /// Seals a partition's open file under its range name (or the replayed name).
    fn seal_open(&mut self, p: i32) {
        let Some(part) = self.parts.get_mut(&p) else {
            return;
        };
        let Some(OpenRange { file, .. }) = part.open.take() else {
            return;
        };
        let Some(f) = self.flow.file(file) else {
            return;
        };
        let (Some(first), Some(last)) = (f.first_offset(), f.last_offset()) else {
            return;
        };
        let name = match part.replay.take() {
            Some(r) => r.name,
            None => range_name(&self.src.topic, p, first, last),
        };
        let claim = claim_name(&self.src.topic, p, first);
        self.flow.seal_as(file, name, Some(claim));
    }

    fn flush_timers(&mut self) {
        let limit = Duration::from_millis(self.cfg.batching.flush_ms);
        let due: Vec<i32> = self
            .parts
            .iter()
            .filter(|(_, part)| part.replay.is_none())
            .filter(|(_, part)| part.open.is_some_and(|o| o.since.elapsed() >= limit))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.seal_open(p);
        }
    }

    fn handle_events(&mut self, lanes: &mut Lanes) -> Result<(), PipelineError> {
        let commits = std::mem::take(
            &mut *self
                .consumer
                .context()
                .commits
                .lock()
                .expect("commits lock"),
        );
        for c in commits {
            let Some(part) = self.parts.get_mut(&c.partition) else {
                continue;
            };
            match c.result {
                Ok(()) if part.published_next == Some(c.offset) => part.commit_pending = false,
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(partition = c.partition, offset = c.offset, error = %e, "commit failed; the output stays authoritative, made again at stop")
                }
            }
        }
        let events =
            std::mem::take(&mut *self.consumer.context().events.lock().expect("events lock"));
        for ev in events {
            match ev {
                Event::Assign(partitions) => self.assign(&partitions)?,
                Event::Revoked(p) => {
                    let group = self.group(p);
                    let dropped = self.flow.abandon(&group) + lanes.forget(&group);
                    self.summary.abandoned += dropped as u64;
                    self.parts.remove(&p);
                    self.metrics.lag.remove(&PartitionLabel {
                        topic: self.src.topic.clone(),
                        partition: p,
                    });
                }
            }
        }
        Ok(())
    }

    /// Answers the group's assignment: reconciles each partition from the output store, then
    /// assigns them all, each at the offset after its last published range (the committed offset
    /// when nothing is published). Each reconcile lists the names from the range the group's
    /// commit names on, or from before its committed offset ([`list_from`]). A partition that cannot be reconciled stops the
    /// worker with [`PipelineError::Reconcile`] before anything is assigned or read; closing the
    /// consumer then hands the partitions back to the group.
    fn assign(&mut self, partitions: &[i32]) -> Result<(), PipelineError> {
        tracing::info!(
            ?partitions,
            protocol = %protocol_name(&self.consumer),
            "assignment: reconciling from the output before the first fetch"
        );
        let started = Instant::now();
        let committed = self.committed_starts(partitions);
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            let r = self.reconcile(p, committed.get(&p).copied())?;
            tracing::info!(partition = p, resume = ?r.resume, replay = ?r.replay, listed = r.listed, listed_from = ?r.listed_from, "assigned");
            let offset = r.resume.map_or(Offset::Invalid, Offset::Offset);
            tpl.add_partition_offset(&self.src.topic, p, offset)
                .map_err(|e| kafka_err("assign list", e))?;
            self.parts.insert(p, Part::new(r));
        }
        let took = started.elapsed().as_secs_f64();
        self.metrics.reconcile_seconds.inc_by(took);
        self.summary.reconcile_s += took;
        let assigned = match self.consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => self.consumer.incremental_assign(&tpl),
            _ => self.consumer.assign(&tpl),
        };
        assigned.map_err(|e| kafka_err("assign", e))
    }

    /// Partition `p` reconciled from the output store ([`reconcile`]), listing from the range
    /// `from` where it is published; an error names the partition.
    fn reconcile(&mut self, p: i32, from: Option<ListFrom>) -> Result<Reconciled, PipelineError> {
        let r = reconcile(
            &self.publisher.output,
            &self.publisher.rejects,
            &self.src.topic,
            p,
            from,
        )
        .map_err(|e| PipelineError::Reconcile {
            partition: p,
            source: Box::new(e),
        })?;
        self.metrics
            .reconcile_objects_listed
            .inc_by(r.listed as u64);
        self.summary.reconcile_listed += r.listed as u64;
        Ok(r)
    }

    /// Where the reconciles of `partitions` start listing, from the group's commits
    /// ([`list_from`]). Where the broker cannot say, or nothing is committed, the reconcile lists
    /// the partition's whole folders: slower, never wrong.
    fn committed_starts(&self, partitions: &[i32]) -> HashMap<i32, ListFrom> {
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition(&self.src.topic, p);
        }
        let committed = match self.consumer.committed_offsets(tpl, STOP_QUERY_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the group's committed offsets are not known; each partition's whole folders are listed to reconcile it");
                return HashMap::new();
            }
        };
        let window = i64::try_from(self.cfg.batching.file_docs).unwrap_or(i64::MAX);
        committed
            .elements()
            .iter()
            .filter_map(|e| {
                let Offset::Offset(offset) = e.offset() else {
                    return None;
                };
                // rdkafka panics on metadata that is not UTF-8 (another tool's bytes): no range.
                let metadata = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    e.metadata().to_string()
                }))
                .unwrap_or_default();
                list_from(offset, &metadata, window).map(|f| (e.partition(), f))
            })
            .collect()
    }

    fn after_publish(&mut self, r: &FileReport) -> Result<(), PipelineError> {
        self.metrics.file(r);
        self.summary.consumed += r.consumed;
        self.summary.accepted += r.accepted;
        self.summary.rejected += r.rejected;
        self.summary.skipped += r.skipped;
        self.summary.files += 1;
        self.summary.replays += r.replayed as u64;
        for (c, n) in &r.causes {
            *self.summary.causes.entry(c.to_string()).or_default() += n;
        }
        // The dead letters were sent with the publish, on its thread.
        crate::faults::crash_point(crate::faults::CrashPoint::BeforeCommit);
        let (Some(p), Some(last)) = (r.partition, r.last_offset) else {
            return Ok(());
        };
        if !self.parts.contains_key(&p) {
            return Ok(());
        }
        let range = (r.first_offset.unwrap_or(last), last);
        let mut tpl = TopicPartitionList::new();
        add_commit(&mut tpl, &self.src.topic, p, range).map_err(|e| kafka_err("commit list", e))?;
        // Asynchronous: its answer comes through the context's commit callback. A failed commit
        // loses nothing: the next owner reconciles from the published files, and this worker
        // commits again when it stops.
        let part = self.parts.get_mut(&p).expect("present");
        part.published_next = Some(last + 1);
        part.marked = Some(range);
        part.commit_pending = true;
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(partition = p, error = %e, "commit failed; the output stays authoritative, made again at stop");
        }
        tracing::info!(file = %r.name, accepted = r.accepted, rejected = r.rejected, skipped = r.skipped, "published");
        Ok(())
    }

    /// Another worker claimed the first offset of this worker's range `r` for the range `holder`
    /// ([`crate::flow`]): one of the two is not the partition's owner any more, or both read it
    /// during a handover. This worker drops its work on the partition (the files behind `r`
    /// included: their ranges follow one that is not published), reconciles the partition again
    /// from the output and reads it from there, as on an assignment (replaying the holder's range
    /// if its marker is not there yet). If the group took the partition away meanwhile, the seek
    /// fails and the worker stops with that error, which loses nothing.
    fn fenced(
        &mut self,
        r: &FileReport,
        holder: &str,
        lanes: &mut Lanes,
    ) -> Result<(), PipelineError> {
        self.metrics.files_fenced.inc();
        self.summary.fenced += 1;
        let dropped = self.flow.abandon(&r.group) + lanes.forget(&r.group);
        self.summary.abandoned += dropped as u64 + r.duplicated_docs;
        let Some(p) = r.partition.filter(|p| self.parts.contains_key(p)) else {
            return Ok(()); // revoked since: the new owner reconciles it
        };
        let from = self.parts[&p]
            .marked
            .map(|(first, last)| ListFrom::Range(first, last));
        let mut again = self.reconcile(p, from)?;
        // A claim is there now, so the output says where to resume.
        let resume = again.resume.or(r.first_offset).unwrap_or(0);
        tracing::warn!(partition = p, range = %r.name, holder, resume, dropped = dropped as u64 + r.duplicated_docs, "fenced: another worker claimed this range's first offset for another range; this worker's work on the partition is dropped and it reads the partition again from where the output says");
        self.consumer
            .seek(&self.src.topic, p, Offset::Offset(resume), SEEK_TIMEOUT)
            .map_err(|e| kafka_err("seek after a fenced publish", e))?;
        let paused = self.parts[&p].paused;
        again.resume = Some(resume);
        let mut part = Part::new(again);
        // A paused partition stays paused until the loop resumes it (its buffer is empty now).
        part.paused = paused;
        self.parts.insert(p, part);
        Ok(())
    }

    fn pause_all(&mut self) -> Result<(), PipelineError> {
        let assignment = self
            .consumer
            .assignment()
            .map_err(|e| kafka_err("assignment", e))?;
        if assignment.count() > 0 {
            self.consumer
                .pause(&assignment)
                .map_err(|e| kafka_err("pause", e))?;
        }
        for part in self.parts.values_mut() {
            part.paused = true;
        }
        Ok(())
    }

    fn resume_drained(&mut self) -> Result<(), PipelineError> {
        if self.parts.values().all(|p| !p.paused) {
            return Ok(());
        }
        let low = self.cfg.batching.max_buffered / 2;
        let ready: Vec<i32> = self
            .parts
            .iter()
            .filter(|(p, part)| part.paused && self.flow.pending_in(&self.group(**p)) <= low)
            .map(|(p, _)| *p)
            .collect();
        for p in ready {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.src.topic, p);
            self.consumer
                .resume(&tpl)
                .map_err(|e| kafka_err("resume", e))?;
            let part = self.parts.get_mut(&p).expect("present");
            part.paused = false;
            part.progress = Instant::now();
        }
        Ok(())
    }

    fn update_lag(&self) {
        let lag: Vec<(i32, i64)> = self
            .consumer
            .context()
            .fetch
            .lock()
            .expect("fetch lock")
            .iter()
            .filter(|(_, f)| f.consumer_lag >= 0)
            .map(|(p, f)| (*p, f.consumer_lag))
            .collect();
        for (p, n) in lag {
            if self.parts.contains_key(&p) {
                self.metrics
                    .lag
                    .get_or_create(&PartitionLabel {
                        topic: self.src.topic.clone(),
                        partition: p,
                    })
                    .set(n);
            }
        }
    }
}

/// The group's rebalance protocol, for the log.
fn protocol_name(consumer: &BaseConsumer<WorkerContext>) -> &'static str {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => "Cooperative",
        RebalanceProtocol::Eager => "Eager",
        RebalanceProtocol::None => "None",
    }
}

fn idle(opts: &WorkerOptions, last: Instant) -> bool {
    opts.idle_exit.is_some_and(|d| last.elapsed() >= d)
}

#[cfg(test)]
mod tests;
