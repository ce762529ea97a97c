//! Prometheus metrics (`GET /metrics`, text format) for both job kinds. Counters end in `_total`.
//! `GET /healthz` answers 200 while the job loop is alive (liveness and readiness probes).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use quarry_engine::EngineStats;

use crate::error::PipelineError;
use crate::flow::FileReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: String,
}

/// A Kafka client error, by librdkafka's error code in snake case (a bounded set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorKindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub topic: String,
    pub partition: i32,
}

/// Every metric a job exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub docs_consumed: Counter,
    pub docs_accepted: Counter,
    pub docs_budget_closed: Counter,
    pub docs_rejected: Family<CauseLabel, Counter>,
    pub docs_skipped: Family<CauseLabel, Counter>,
    pub files_published: Counter,
    pub replays: Counter,
    pub files_duplicated: Counter,
    pub files_fenced: Counter,
    /// Objects a Kafka worker's reconciles listed (its partitions' output and rejects folders,
    /// from the range the last commit names on).
    pub reconcile_objects_listed: Counter,
    /// Seconds a Kafka worker's assignments spent reconciling (the group waits for them).
    pub reconcile_seconds: Counter<f64, AtomicU64>,
    pub prompt_tokens: Counter,
    pub cached_tokens: Counter,
    pub output_tokens: Counter,
    pub forced_tokens: Counter,
    pub conservation_ok: Gauge,
    pub lag: Family<PartitionLabel, Gauge>,
    pub consumer_errors: Family<ErrorKindLabel, Counter>,
    pub stalled_partitions: Gauge,
    pub in_flight: Gauge,
    pub cache_hit_rate: Gauge<f64, AtomicU64>,
    pub step_seconds: Histogram,
    /// One file's publish (encoding, the store's requests, dead letters), beside the loop.
    pub publish_seconds: Histogram,
    /// What the job loop waited for its reads and publishes (nothing left to step, or too many
    /// files held): a slow store shows here.
    pub io_wait_seconds: Counter<f64, AtomicU64>,
    /// Seconds since the epoch of the last loop iteration (health).
    heartbeat: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Mutex::new(Registry::with_prefix("quarry")),
            docs_consumed: Counter::default(),
            docs_accepted: Counter::default(),
            docs_budget_closed: Counter::default(),
            docs_rejected: Family::default(),
            docs_skipped: Family::default(),
            files_published: Counter::default(),
            replays: Counter::default(),
            files_duplicated: Counter::default(),
            files_fenced: Counter::default(),
            reconcile_objects_listed: Counter::default(),
            reconcile_seconds: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            output_tokens: Counter::default(),
            forced_tokens: Counter::default(),
            conservation_ok: Gauge::default(),
            lag: Family::default(),
            consumer_errors: Family::default(),
            stalled_partitions: Gauge::default(),
            in_flight: Gauge::default(),
            cache_hit_rate: Gauge::default(),
            step_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            publish_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            io_wait_seconds: Counter::default(),
            heartbeat: AtomicI64::new(0),
        };
        m.conservation_ok.set(1);
        {
            let mut r = m.registry.lock().expect("registry lock");
            r.register(
                "docs_consumed",
                "Documents taken from the source",
                m.docs_consumed.clone(),
            );
            r.register(
                "docs_accepted",
                "Documents written as valid records",
                m.docs_accepted.clone(),
            );
            r.register(
                "docs_budget_closed",
                "Valid records whose end the token budget shaped (finish budget_closed; docs/budget.md)",
                m.docs_budget_closed.clone(),
            );
            r.register(
                "docs_rejected",
                "Documents written to rejects, by cause",
                m.docs_rejected.clone(),
            );
            r.register(
                "docs_skipped",
                "Documents left out by configuration (tombstones with source.tombstones = skip)",
                m.docs_skipped.clone(),
            );
            r.register(
                "files_published",
                "Output files published (rejects markers)",
                m.files_published.clone(),
            );
            r.register(
                "replays",
                "Files whose accepted part an earlier run had published",
                m.replays.clone(),
            );
            r.register(
                "files_duplicated",
                "Files another worker published first (the same shard or range worked on twice)",
                m.files_duplicated.clone(),
            );
            r.register(
                "files_fenced",
                "Kafka ranges not published because another worker claimed their first offset for another range (the partition is read again from the output)",
                m.files_fenced.clone(),
            );
            r.register(
                "reconcile_objects_listed",
                "Objects listed to reconcile assigned Kafka partitions from the output (from the range the group's last commit names on; every object of the partition's folders when it names none)",
                m.reconcile_objects_listed.clone(),
            );
            r.register(
                "reconcile_seconds",
                "Seconds Kafka assignments spent reconciling their partitions from the output (the group waits meanwhile)",
                m.reconcile_seconds.clone(),
            );
            r.register("prompt_tokens", "Prompt tokens", m.prompt_tokens.clone());
            r.register(
                "cached_tokens",
                "Prompt tokens served from the radix cache",
                m.cached_tokens.clone(),
            );
            r.register("output_tokens", "Output tokens", m.output_tokens.clone());
            r.register(
                "forced_tokens",
                "Output tokens appended by jump-forward",
                m.forced_tokens.clone(),
            );
            r.register(
                "conservation_ok",
                "1 while accepted + rejected + skipped = consumed for every published file",
                m.conservation_ok.clone(),
            );
            r.register(
                "consumer_lag",
                "Messages behind the partition's high watermark",
                m.lag.clone(),
            );
            r.register(
                "consumer_errors",
                "Kafka consumer errors (undecodable batches, fetch errors), by librdkafka error code",
                m.consumer_errors.clone(),
            );
            r.register(
                "stalled_partitions",
                "Assigned partitions behind their high watermark with nothing delivered for a while",
                m.stalled_partitions.clone(),
            );
            r.register(
                "in_flight_docs",
                "Documents read and not yet published",
                m.in_flight.clone(),
            );
            r.register(
                "cache_hit_rate",
                "Radix cache hit tokens / prompt tokens",
                m.cache_hit_rate.clone(),
            );
            r.register(
                "step_seconds",
                "Engine step latency",
                m.step_seconds.clone(),
            );
            r.register(
                "publish_seconds",
                "One output file's publish, on a publisher thread beside the job loop",
                m.publish_seconds.clone(),
            );
            r.register(
                "io_wait_seconds",
                "Seconds the job loop waited for its reads and publishes",
                m.io_wait_seconds.clone(),
            );
        }
        m.beat();
        m
    }

    /// Counts one published file.
    pub fn file(&self, r: &FileReport) {
        if r.duplicate {
            self.files_duplicated.inc();
            return;
        }
        self.docs_consumed.inc_by(r.consumed);
        self.docs_accepted.inc_by(r.accepted);
        self.docs_budget_closed.inc_by(r.budget_closed);
        for (cause, n) in &r.causes {
            self.docs_rejected
                .get_or_create(&CauseLabel {
                    cause: cause.to_string(),
                })
                .inc_by(*n);
        }
        for (cause, n) in &r.skipped_causes {
            self.docs_skipped
                .get_or_create(&CauseLabel {
                    cause: cause.to_string(),
                })
                .inc_by(*n);
        }
        self.files_published.inc();
        if r.replayed {
            self.replays.inc();
        }
        self.prompt_tokens.inc_by(r.stats.prompt_tokens);
        self.cached_tokens.inc_by(r.stats.cached_tokens);
        self.output_tokens.inc_by(r.stats.output_tokens);
        self.forced_tokens.inc_by(r.stats.forced_tokens);
        if r.accepted + r.rejected + r.skipped != r.consumed {
            self.conservation_ok.set(0);
        }
    }

    pub fn engine(&self, s: &EngineStats) {
        let total = s.cache.hit_tokens + s.cache.miss_tokens;
        if total > 0 {
            self.cache_hit_rate
                .set(s.cache.hit_tokens as f64 / total as f64);
        }
    }

    pub fn step(&self, d: Duration) {
        self.step_seconds.observe(d.as_secs_f64());
    }

    /// One file published in `secs`, beside the loop.
    pub fn published(&self, secs: f64) {
        self.publish_seconds.observe(secs);
    }

    /// The loop waited `secs` more for its reads and publishes.
    pub fn io_waited(&self, secs: f64) {
        if secs > 0.0 {
            self.io_wait_seconds.inc_by(secs);
        }
    }

    /// Marks the job loop alive.
    pub fn beat(&self) {
        self.heartbeat
            .store(chrono::Utc::now().timestamp(), Ordering::Relaxed);
    }

    fn alive(&self, stale_after: Duration) -> bool {
        let last = self.heartbeat.load(Ordering::Relaxed);
        chrono::Utc::now().timestamp() - last <= stale_after.as_secs() as i64
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry.lock().expect("registry lock")).expect("text encoding");
        out
    }

    /// Serves `/metrics` and `/healthz` on `addr` from a background thread.
    pub fn serve(self: &Arc<Self>, addr: &str) -> Result<std::net::SocketAddr, PipelineError> {
        let failed =
            |source: Box<dyn std::error::Error + Send + Sync>| PipelineError::MetricsListen {
                addr: addr.to_string(),
                source,
            };
        let server = tiny_http::Server::http(addr).map_err(failed)?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| failed("not an IP address".into()))?;
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("quarry-metrics".into())
            .spawn(move || {
                let started = Instant::now();
                for req in server.incoming_requests() {
                    let (code, body, ctype) = match req.url() {
                        "/metrics" => (
                            200,
                            me.render(),
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                        "/healthz" => {
                            // A model step on a slow CPU can take seconds; ten minutes of silence
                            // means the loop is stuck.
                            let ok = me.alive(Duration::from_secs(600))
                                || started.elapsed() < Duration::from_secs(600);
                            (
                                if ok { 200 } else { 503 },
                                if ok { "ok\n" } else { "stuck\n" }.to_string(),
                                "text/plain",
                            )
                        }
                        _ => (404, "not found\n".to_string(), "text/plain"),
                    };
                    let header =
                        tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes())
                            .expect("static header");
                    let _ = req.respond(
                        tiny_http::Response::from_string(body)
                            .with_status_code(code)
                            .with_header(header),
                    );
                }
            })
            .map_err(|e| failed(e.into()))?;
        Ok(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_total_suffix() {
        let m = Metrics::new();
        let mut r = FileReport {
            consumed: 3,
            accepted: 2,
            rejected: 1,
            ..Default::default()
        };
        r.causes.insert("empty", 1);
        m.file(&r);
        m.file(&FileReport {
            consumed: 2,
            skipped: 2,
            skipped_causes: [("tombstone", 2)].into(),
            ..Default::default()
        });
        m.consumer_errors
            .get_or_create(&ErrorKindLabel {
                kind: "bad_compression".into(),
            })
            .inc();
        m.stalled_partitions.set(1);
        let text = m.render();
        assert!(text.contains("quarry_docs_consumed_total 5"), "{text}");
        assert!(
            text.contains("quarry_docs_rejected_total{cause=\"empty\"} 1"),
            "{text}"
        );
        assert!(text.contains("quarry_conservation_ok 1"), "{text}");
        assert!(
            text.contains("quarry_docs_skipped_total{cause=\"tombstone\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("quarry_consumer_errors_total{kind=\"bad_compression\"} 1"),
            "{text}"
        );
        assert!(text.contains("quarry_stalled_partitions 1"), "{text}");
    }

    #[test]
    fn publishes_and_the_loops_waits_are_timed() {
        let m = Metrics::new();
        m.published(0.3);
        m.published(0.1);
        m.io_waited(1.25);
        m.io_waited(0.0);
        m.io_waited(0.5);
        let text = m.render();
        assert!(text.contains("quarry_publish_seconds_count 2"), "{text}");
        assert!(text.contains("quarry_publish_seconds_sum 0.4"), "{text}");
        assert!(text.contains("quarry_io_wait_seconds_total 1.75"), "{text}");
    }
}
