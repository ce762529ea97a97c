//! Kafka workers (`quarry worker`): a consumer group member with `cooperative-sticky` assignment
//! and manual commits, feeding the engine between polls.
//!
//! Each assigned partition's messages are cut into offset ranges (`batching.file_docs` documents
//! or `batching.flush_ms`, whichever comes first), and each range is one output file named
//! `topic=T/partition=P/<first>-<last>.parquet`. After a range's rejects marker is published (see
//! [`crate::flow`]) its offset is committed. On assignment the worker reconciles from the output:
//! it resumes after the highest published marker, and when it finds an accepted file without a
//! marker (a crash between the two) it replays exactly that range under exactly that name.
//!
//! The loop never blocks on the model for long: it polls the consumer between engine steps, and a
//! partition with `batching.max_buffered` documents waiting is paused (not left) until they drain.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::config::{KafkaSource, PipelineConfig, SourceConfig};
use crate::error::PipelineError;
use crate::extract::Extractor;
use crate::flow::{FileReport, Flow, Publisher};
use crate::metrics::{Metrics, PartitionLabel};
use crate::record::{decode, Lineage};
use crate::shutdown::Shutdown;
use crate::store::Location;

/// The file name of an offset range.
pub fn range_name(topic: &str, partition: i32, first: i64, last: i64) -> String {
    format!(
        "{}/{first:020}-{last:020}.parquet",
        partition_dir(topic, partition)
    )
}

pub fn partition_dir(topic: &str, partition: i32) -> String {
    format!("topic={topic}/partition={partition}")
}

/// The (first, last) offsets in a range file's name.
pub fn parse_range(name: &str) -> Option<(i64, i64)> {
    let file = name.rsplit('/').next()?;
    let stem = file.strip_suffix(".parquet")?;
    let (a, b) = stem.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Where a partition resumes, from what is published.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// The first offset not yet published; `None` when nothing is (use the committed offset).
    pub resume: Option<i64>,
    /// An accepted file without its rejects marker: (name, first, last). Its range is replayed
    /// exactly.
    pub replay: Option<(String, i64, i64)>,
}

/// Reads a partition's published files.
pub fn reconcile(
    output: &Location,
    rejects: &Location,
    topic: &str,
    partition: i32,
) -> Result<Reconciled, PipelineError> {
    let dir = partition_dir(topic, partition);
    let ranges = |loc: &Location| -> Result<Vec<(String, i64, i64)>, PipelineError> {
        Ok(loc
            .list(&dir)?
            .iter()
            .filter_map(|m| {
                let rel = loc.relative(&m.location);
                parse_range(&rel).map(|(a, b)| (rel, a, b))
            })
            .collect())
    };
    let marked = ranges(rejects)?;
    let highest = marked.iter().map(|r| r.2).max();
    let orphan = ranges(output)?
        .into_iter()
        .filter(|(_, first, _)| highest.is_none_or(|h| *first > h))
        .min_by_key(|r| r.1);
    let resume = match (&orphan, highest) {
        (_, Some(h)) => Some(h + 1),
        (Some((_, first, _)), None) => Some(*first),
        (None, None) => None,
    };
    Ok(Reconciled {
        resume,
        replay: orphan,
    })
}

enum Event {
    Assigned(i32, Reconciled),
    Revoked(i32),
    Fatal(String),
}

struct WorkerContext {
    topic: String,
    output: Location,
    rejects: Location,
    events: Mutex<Vec<Event>>,
    /// Consumer lag per partition from librdkafka's statistics (no broker round trip).
    lag: Mutex<HashMap<i32, i64>>,
}

impl ClientContext for WorkerContext {
    /// librdkafka's log lines go to `tracing` (target `librdkafka`).
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, "{msg}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{msg}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{msg}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{msg}"),
        }
    }

    fn stats(&self, stats: rdkafka::Statistics) {
        if let Some(t) = stats.topics.get(&self.topic) {
            let mut lag = self.lag.lock().expect("lag lock");
            for (p, part) in &t.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    lag.insert(*p, part.consumer_lag);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl ConsumerContext for WorkerContext {
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let mut events = self.events.lock().expect("events lock");
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                for el in tpl.elements() {
                    if el.topic() != self.topic {
                        continue;
                    }
                    let p = el.partition();
                    match reconcile(&self.output, &self.rejects, &self.topic, p) {
                        Ok(r) => {
                            tracing::info!(partition = p, resume = ?r.resume, replay = ?r.replay, "assigned");
                            events.push(Event::Assigned(p, r));
                        }
                        Err(e) => events.push(Event::Fatal(format!(
                            "cannot reconcile partition {p} from the output: {e}"
                        ))),
                    }
                }
                for ev in events.iter() {
                    if let Event::Assigned(
                        p,
                        Reconciled {
                            resume: Some(o), ..
                        },
                    ) = ev
                    {
                        let _ = tpl.set_partition_offset(&self.topic, *p, Offset::Offset(*o));
                    }
                }
                let r = if cooperative {
                    base.incremental_assign(tpl)
                } else {
                    base.assign(tpl)
                };
                if let Err(e) = r {
                    events.push(Event::Fatal(format!("assign failed: {e}")));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                for el in tpl.elements() {
                    if el.topic() == self.topic {
                        tracing::info!(
                            partition = el.partition(),
                            lost = base.assignment_lost(),
                            "revoked"
                        );
                        events.push(Event::Revoked(el.partition()));
                    }
                }
                let r = if cooperative {
                    base.incremental_unassign(tpl)
                } else {
                    base.unassign()
                };
                if let Err(e) = r {
                    tracing::warn!(error = %e, "unassign failed");
                }
            }
            other => tracing::warn!(error = ?other, "rebalance error"),
        }
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
}

/// What a worker did before it stopped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WorkerSummary {
    pub consumed: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub files: u64,
    pub replays: u64,
    pub abandoned: u64,
    pub causes: BTreeMap<String, u64>,
    pub wall_s: f64,
}

struct Part {
    /// The next offset this worker expects; earlier deliveries are stale.
    next: Option<i64>,
    open: Option<(u64, Instant)>,
    replay: Option<(String, i64, i64)>,
    paused: bool,
}

/// A running worker.
pub struct Worker<'a, E: Extractor> {
    src: KafkaSource,
    cfg: &'a PipelineConfig,
    consumer: BaseConsumer<WorkerContext>,
    producer: Option<(BaseProducer, String)>,
    flow: &'a mut Flow<E>,
    publisher: &'a Publisher,
    metrics: &'a Metrics,
    parts: HashMap<i32, Part>,
    summary: WorkerSummary,
}

/// The prefix of environment variables that set librdkafka properties, so credentials come from a
/// Kubernetes Secret rather than the job definition: `QUARRY_KAFKA_SASL_PASSWORD` sets
/// `sasl.password` (lower case, `_` → `.`).
pub const ENV_PREFIX: &str = "QUARRY_KAFKA_";

/// `source.properties`, then the `QUARRY_KAFKA_*` variables of `env` over them.
pub fn client_properties(
    src: &KafkaSource,
    env: impl Iterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    let mut props = src.properties.clone();
    for (k, v) in env {
        if let Some(name) = k.strip_prefix(ENV_PREFIX).filter(|n| !n.is_empty()) {
            props.insert(name.to_ascii_lowercase().replace('_', "."), v);
        }
    }
    props
}

fn kafka_err(what: &str, e: KafkaError) -> PipelineError {
    PipelineError::Kafka(format!("{what}: {e}"))
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
            return Err(PipelineError::Config {
                path: cfg.name.clone(),
                message: "`quarry worker` needs source.kind = \"kafka\"".into(),
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
        let props = client_properties(&src, std::env::vars());
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
            output: publisher.output.clone(),
            rejects: publisher.rejects.clone(),
            events: Mutex::new(Vec::new()),
            lag: Mutex::new(HashMap::new()),
        };
        let consumer: BaseConsumer<WorkerContext> = cc
            .create_with_context(ctx)
            .map_err(|e| kafka_err("consumer", e))?;
        consumer
            .subscribe(&[&src.topic])
            .map_err(|e| kafka_err("subscribe", e))?;
        let producer = match &cfg.rejects.dead_letter_topic {
            Some(topic) => {
                let mut pc = ClientConfig::new();
                pc.set("bootstrap.servers", &src.brokers);
                for (k, v) in &props {
                    pc.set(k, v);
                }
                let p: BaseProducer = pc
                    .create()
                    .map_err(|e| kafka_err("dead-letter producer", e))?;
                Some((p, topic.clone()))
            }
            None => None,
        };
        Ok(Self {
            src,
            cfg,
            consumer,
            producer,
            flow,
            publisher,
            metrics,
            parts: HashMap::new(),
            summary: WorkerSummary::default(),
        })
    }

    fn group(&self, p: i32) -> String {
        partition_dir(&self.src.topic, p)
    }

    /// Runs until a signal (or `idle_exit`) stops it.
    pub fn run(
        mut self,
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
                let n: usize = self
                    .parts
                    .keys()
                    .map(|p| self.group(*p))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(|g| self.flow.abandon(g))
                    .sum();
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
            if (shutdown.requested() || idle_now) && !draining {
                draining = true;
                tracing::info!("draining: no new messages; finishing and publishing what is held");
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
                        let input = decode(
                            msg.payload().unwrap_or_default(),
                            self.src.value,
                            &self.src.fields,
                            self.cfg.batching.max_doc_bytes,
                            lineage,
                        );
                        drop(msg);
                        self.take_message(p, off, input);
                        taken += 1;
                        last_activity = Instant::now();
                        if taken >= 1000 {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "consumer error");
                        break;
                    }
                    None => break,
                }
            }
            let before = self.parts.len();
            self.handle_events()?;
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
            for file in self.flow.take_ready() {
                let report = self.publisher.publish(file)?;
                self.after_publish(&report)?;
            }
            self.resume_drained()?;
            if last_lag.elapsed() > Duration::from_secs(1) {
                self.update_lag();
                last_lag = Instant::now();
            }
            if draining && self.flow.open_files() == 0 {
                break;
            }
        }
        self.summary.wall_s = started.elapsed().as_secs_f64();
        Ok(self.summary)
    }

    fn take_message(&mut self, p: i32, off: i64, input: crate::record::Input) {
        let group = self.group(p);
        let Some(part) = self.parts.get_mut(&p) else {
            // Delivered for a partition revoked since: the new owner will read it.
            return;
        };
        if part.next.is_some_and(|n| off < n) {
            return;
        }
        part.next = Some(off + 1);
        let file = match part.open {
            Some((f, _)) => f,
            None => {
                let f = self.flow.open(String::new(), group.clone(), Vec::new());
                part.open = Some((f, Instant::now()));
                f
            }
        };
        self.flow.push(file, input);
        let len = self.flow.file(file).map(|f| f.len()).unwrap_or(0);
        let replay_end = part.replay.as_ref().map(|r| r.2);
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
        let Some((file, _)) = part.open.take() else {
            return;
        };
        let Some(f) = self.flow.file(file) else {
            return;
        };
        let (Some(first), Some(last)) = (f.first_offset(), f.last_offset()) else {
            return;
        };
        let name = match part.replay.take() {
            Some((name, _, _)) => name,
            None => range_name(&self.src.topic, p, first, last),
        };
        self.flow.seal_as(file, name);
    }

    fn flush_timers(&mut self) {
        let limit = Duration::from_millis(self.cfg.batching.flush_ms);
        let due: Vec<i32> = self
            .parts
            .iter()
            .filter(|(_, part)| part.replay.is_none())
            .filter(|(_, part)| part.open.is_some_and(|(_, t)| t.elapsed() >= limit))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.seal_open(p);
        }
    }

    fn handle_events(&mut self) -> Result<(), PipelineError> {
        let events =
            std::mem::take(&mut *self.consumer.context().events.lock().expect("events lock"));
        for ev in events {
            match ev {
                Event::Assigned(p, r) => {
                    self.parts.insert(
                        p,
                        Part {
                            next: r.resume,
                            open: None,
                            replay: r.replay,
                            paused: false,
                        },
                    );
                }
                Event::Revoked(p) => {
                    let dropped = self.flow.abandon(&self.group(p));
                    self.summary.abandoned += dropped as u64;
                    self.parts.remove(&p);
                    self.metrics.lag.remove(&PartitionLabel {
                        topic: self.src.topic.clone(),
                        partition: p,
                    });
                }
                Event::Fatal(msg) => return Err(PipelineError::Kafka(msg)),
            }
        }
        Ok(())
    }

    fn after_publish(&mut self, r: &FileReport) -> Result<(), PipelineError> {
        self.metrics.file(r);
        self.summary.consumed += r.consumed;
        self.summary.accepted += r.accepted;
        self.summary.rejected += r.rejected;
        self.summary.files += 1;
        self.summary.replays += r.replayed as u64;
        for (c, n) in &r.causes {
            *self.summary.causes.entry(c.to_string()).or_default() += n;
        }
        if let Some((producer, topic)) = &self.producer {
            for (key, value) in &r.dead_letters {
                let payload = value.to_string();
                let mut rec = BaseRecord::<Vec<u8>, String>::to(topic).payload(&payload);
                if let Some(k) = key {
                    rec = rec.key(k);
                }
                if let Err((e, _)) = producer.send(rec) {
                    return Err(kafka_err("dead-letter send", e));
                }
            }
            producer
                .flush(Duration::from_secs(30))
                .map_err(|e| kafka_err("dead-letter flush", e))?;
        }
        crate::faults::crash_point("before_commit");
        let (Some(p), Some(last)) = (parse_partition(&r.group), r.last_offset) else {
            return Ok(());
        };
        if !self.parts.contains_key(&p) {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.src.topic, p, Offset::Offset(last + 1))
            .map_err(|e| kafka_err("commit list", e))?;
        // A failed commit loses nothing: the next owner reconciles from the published files.
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
            tracing::warn!(partition = p, error = %e, "commit failed; the output stays authoritative");
        }
        tracing::info!(file = %r.name, accepted = r.accepted, rejected = r.rejected, "published");
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
            self.parts.get_mut(&p).expect("present").paused = false;
        }
        Ok(())
    }

    fn update_lag(&self) {
        let lag = self
            .consumer
            .context()
            .lag
            .lock()
            .expect("lag lock")
            .clone();
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

fn idle(opts: &WorkerOptions, last: Instant) -> bool {
    opts.idle_exit.is_some_and(|d| last.elapsed() >= d)
}

fn parse_partition(group: &str) -> Option<i32> {
    group.rsplit_once("partition=")?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_names_round_trip_and_sort_by_offset() {
        let a = range_name("docs", 3, 0, 99);
        let b = range_name("docs", 3, 100, 1000);
        assert!(a < b);
        assert_eq!(parse_range(&b), Some((100, 1000)));
        assert_eq!(parse_partition(&partition_dir("docs", 12)), Some(12));
    }

    #[test]
    fn credentials_come_from_the_environment_over_the_definition() {
        let cfg = crate::PipelineConfig::parse(
            r#"
name = "k"
schema = "s.json"
[source]
kind = "kafka"
brokers = "b:9092"
topic = "t"
group = "g"
properties = { "security.protocol" = "SASL_SSL", "sasl.username" = "from-toml" }
[prompt]
template = "{{ text }}"
[model]
path = "m.gguf"
[output]
url = "memory://o"
[rejects]
url = "memory://r"
"#,
            "k.toml",
            std::path::PathBuf::from("."),
        )
        .unwrap();
        let SourceConfig::Kafka(src) = &cfg.source else {
            panic!("a kafka source")
        };
        let env = [
            ("QUARRY_KAFKA_SASL_USERNAME", "svc"),
            ("QUARRY_KAFKA_SASL_PASSWORD", "s3cret"),
            ("QUARRY_KAFKA_", "ignored"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let props = client_properties(src, env.into_iter());
        assert_eq!(props["security.protocol"], "SASL_SSL");
        assert_eq!(props["sasl.username"], "svc");
        assert_eq!(props["sasl.password"], "s3cret");
        assert_eq!(props.len(), 3);
    }

    #[test]
    fn reconcile_resumes_after_the_marker_and_replays_an_orphan() {
        let out = Location::open("memory://reconcile/out").unwrap();
        let rej = Location::open("memory://reconcile/rej").unwrap();
        assert_eq!(
            reconcile(&out, &rej, "t", 0).unwrap(),
            Reconciled {
                resume: None,
                replay: None
            }
        );
        let b = || bytes::Bytes::from_static(b"x");
        out.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        rej.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        out.publish(&range_name("t", 0, 10, 14), b()).unwrap();
        let r = reconcile(&out, &rej, "t", 0).unwrap();
        assert_eq!(r.resume, Some(10));
        assert_eq!(r.replay, Some((range_name("t", 0, 10, 14), 10, 14)));
        // Other partitions are independent.
        assert_eq!(reconcile(&out, &rej, "t", 1).unwrap().resume, None);
    }
}
