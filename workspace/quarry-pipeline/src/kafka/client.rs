//! The librdkafka side of a worker: its client context (log lines, statistics, client errors, the
//! rebalance callback that hands partitions to the job loop), error kinds as metric labels, and the
//! client properties a job and its environment set.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};

use super::{partition_dir, FetchStats};
use crate::config::KafkaSource;
use crate::lanes::UnderWay;

/// What the rebalance callback hands to the job loop.
pub(super) enum Event {
    /// The group gave these partitions of the topic to this worker (with the eager protocol, the
    /// whole new assignment, perhaps empty). librdkafka waits for the assign call, which
    /// [`Worker::assign`] makes.
    Assign(Vec<i32>),
    Revoked(i32),
}

/// How often a repeating log line may be written.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(60);

/// Logs a repeating line once per key and [`LOG_EVERY`], with how many were held back.
#[derive(Default)]
pub(super) struct Throttle {
    pub(super) seen: HashMap<String, (Instant, u64)>,
}

impl Throttle {
    /// `Some(suppressed since the last line)` when this occurrence should be logged.
    pub(super) fn admit(&mut self, key: &str) -> Option<u64> {
        let now = Instant::now();
        match self.seen.get_mut(key) {
            None => {
                self.seen.insert(key.to_string(), (now, 0));
                Some(0)
            }
            Some((last, held)) if now.duration_since(*last) >= LOG_EVERY => {
                let n = *held;
                *last = now;
                *held = 0;
                Some(n)
            }
            Some((_, held)) => {
                *held += 1;
                None
            }
        }
    }
}

/// The broker's answer to an asynchronous commit, for the job loop.
pub(super) struct CommitAnswer {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) result: Result<(), KafkaError>,
}

pub(super) struct WorkerContext {
    pub(super) topic: String,
    pub(super) events: Mutex<Vec<Event>>,
    pub(super) commits: Mutex<Vec<CommitAnswer>>,
    /// The partitions with a publish under way: a revocation waits for them.
    pub(super) under_way: Arc<UnderWay>,
    pub(super) fetch: Mutex<HashMap<i32, FetchStats>>,
    /// Client-level errors (a broker down) repeat at every retry.
    pub(super) errors_logged: Mutex<Throttle>,
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
            let mut fetch = self.fetch.lock().expect("fetch lock");
            for (p, part) in &t.partitions {
                if *p >= 0 && part.hi_offset >= 0 {
                    fetch.insert(
                        *p,
                        FetchStats {
                            consumer_lag: part.consumer_lag,
                            hi_offset: part.hi_offset,
                            lo_offset: part.lo_offset,
                            committed_offset: part.committed_offset,
                            next_offset: part.next_offset,
                        },
                    );
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let key = error_kind(&error);
        if let Some(held) = self
            .errors_logged
            .lock()
            .expect("throttle lock")
            .admit(&key)
        {
            tracing::warn!(target: "librdkafka", %error, held_back = held, "{reason}");
        }
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
                let partitions = tpl
                    .elements_for_topic(&self.topic)
                    .iter()
                    .map(|el| el.partition())
                    .collect();
                events.push(Event::Assign(partitions));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // A publish under way finishes before the partition is handed back, so the new
                // owner reconciles from a settled output and never cuts its ranges against a
                // file still landing (the loop's thread waits; the publisher threads need nothing
                // from it, and a publish ends within the store's timeouts and retries).
                let lanes: Vec<String> = tpl
                    .elements_for_topic(&self.topic)
                    .iter()
                    .map(|el| partition_dir(&self.topic, el.partition()))
                    .collect();
                drop(events);
                let waiting = Instant::now();
                while !self.under_way.wait_for(&lanes, REVOKE_WARN_EVERY) {
                    tracing::warn!(
                        waited_s = waiting.elapsed().as_secs(),
                        "revocation: waiting for a revoked partition's publish under way before handing it back"
                    );
                }
                let mut events = self.events.lock().expect("events lock");
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

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let mut commits = self.commits.lock().expect("commits lock");
        for el in offsets.elements_for_topic(&self.topic) {
            if let rdkafka::Offset::Offset(offset) = el.offset() {
                let result = match (&result, el.error()) {
                    (Err(e), _) => Err(e.clone()),
                    (Ok(()), Err(e)) => Err(e),
                    (Ok(()), Ok(())) => Ok(()),
                };
                commits.push(CommitAnswer {
                    partition: el.partition(),
                    offset,
                    result,
                });
            }
        }
    }
}

/// A librdkafka error as a metric label: its code in snake case (a bounded set).
pub(super) fn error_kind(e: &KafkaError) -> String {
    let name = match e.rdkafka_error_code() {
        Some(code) => format!("{code:?}"),
        None => return "client".into(),
    };
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// How often the rebalance callback says it is still waiting for a revoked partition's publish.
pub const REVOKE_WARN_EVERY: Duration = Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SourceConfig;

    #[test]
    fn repeating_errors_are_logged_once_per_kind_and_interval() {
        let mut t = Throttle::default();
        assert_eq!(t.admit("bad_compression"), Some(0));
        assert_eq!(t.admit("bad_compression"), None);
        assert_eq!(t.admit("bad_compression"), None);
        assert_eq!(t.admit("transport"), Some(0));
        // After the interval the next one is logged with the count held back.
        t.seen.get_mut("bad_compression").unwrap().0 -= LOG_EVERY;
        assert_eq!(t.admit("bad_compression"), Some(2));
        assert_eq!(t.admit("bad_compression"), None);
    }

    #[test]
    fn error_kinds_are_snake_case_error_codes() {
        use rdkafka::error::RDKafkaErrorCode;
        assert_eq!(
            error_kind(&KafkaError::MessageConsumption(
                RDKafkaErrorCode::BadCompression
            )),
            "bad_compression"
        );
        assert_eq!(
            error_kind(&KafkaError::MessageConsumption(
                RDKafkaErrorCode::NotImplemented
            )),
            "not_implemented"
        );
        assert_eq!(error_kind(&KafkaError::Canceled), "client");
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
}
