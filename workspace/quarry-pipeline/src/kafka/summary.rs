//! What a worker reports when it stops, and whether that stop is a success.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{PartitionLag, PipelineError, StallCause};

/// Why a worker stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// SIGTERM or SIGINT: drained and committed what it held.
    #[default]
    Signal,
    /// `--idle-exit`: nothing to do for that long.
    Idle,
    /// A partition stalled past `source.stall_timeout_s`.
    Stalled,
    /// A second signal: in-flight work abandoned, uncommitted.
    Abandoned,
}

/// A partition that stopped the worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    pub partition: i32,
    /// The first offset not delivered; `None` when neither the worker nor the broker knows.
    pub offset: Option<i64>,
    /// `None` when the broker could not say where the partition ends.
    pub high_watermark: Option<i64>,
    pub stalled: Duration,
    pub cause: StallCause,
}

/// What a worker did before it stopped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WorkerSummary {
    pub topic: String,
    pub stop: StopReason,
    pub consumed: u64,
    pub accepted: u64,
    pub rejected: u64,
    /// Left out by configuration (`source.tombstones = "skip"`).
    pub skipped: u64,
    pub files: u64,
    pub replays: u64,
    pub abandoned: u64,
    /// Ranges not published because another worker claimed their first offset for another range
    /// (their documents counted in `abandoned`; see `quarry_files_fenced_total`).
    pub fenced: u64,
    pub causes: BTreeMap<String, u64>,
    /// Consumer errors by kind (see `quarry_consumer_errors_total`).
    pub consumer_errors: BTreeMap<String, u64>,
    /// Each assigned partition's lag when the worker stopped.
    pub lag: Vec<PartitionLag>,
    /// The records left in the assigned partitions (the sum of `lag`; unknown ones not counted).
    pub lag_total: i64,
    pub wall_s: f64,
    /// Seconds from the start to the first message (joining the group, reconciling); `None`
    /// when none came.
    pub first_message_s: Option<f64>,
    /// Seconds the stop's broker round trips took (commits not yet confirmed, the committed
    /// offsets and watermarks for `lag`), part of `wall_s`.
    pub stop_s: f64,
    /// Objects the assignments' reconciles listed (see `quarry_reconcile_objects_listed_total`).
    pub reconcile_listed: u64,
    /// Seconds the assignments spent reconciling, part of `wall_s`.
    pub reconcile_s: f64,
    /// Seconds spent publishing files, on the publisher threads beside the loop (it can exceed
    /// `wall_s`).
    pub publish_s: f64,
    /// Seconds the loop waited for publishes: at its limit of files held, or at the end.
    pub publish_wait_s: f64,
    #[serde(skip)]
    pub stall: Option<Stall>,
    #[serde(skip)]
    pub stall_limit: Duration,
}

impl WorkerSummary {
    /// Whether the stop is a success: a stall never is, and an idle exit only with every
    /// assigned partition committed up to its high watermark.
    pub fn verdict(&self) -> Result<(), PipelineError> {
        match self.stop {
            StopReason::Stalled => {
                let s = self.stall.clone().unwrap_or(Stall {
                    partition: -1,
                    offset: None,
                    high_watermark: None,
                    stalled: Duration::ZERO,
                    cause: StallCause::default(),
                });
                Err(PipelineError::Stalled {
                    topic: self.topic.clone(),
                    partition: s.partition,
                    offset: s.offset,
                    high_watermark: s.high_watermark,
                    stalled_s: s.stalled.as_secs(),
                    limit_s: self.stall_limit.as_secs(),
                    cause: s.cause,
                })
            }
            StopReason::Idle if !self.lag.iter().all(PartitionLag::is_done) => {
                Err(PipelineError::LagLeft {
                    topic: self.topic.clone(),
                    partitions: self.lag.iter().filter(|l| !l.is_done()).cloned().collect(),
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_fails_a_stall_and_an_idle_exit_with_lag_left() {
        let lag = |partition, committed, high| PartitionLag {
            partition,
            committed,
            published: None,
            high_watermark: high,
            lag: match (committed, high) {
                (Some(c), Some(h)) => Some(h - c),
                _ => None,
            },
        };
        let mut s = WorkerSummary {
            topic: "docs".into(),
            stop: StopReason::Idle,
            lag: vec![lag(0, Some(5), Some(5)), lag(1, Some(2), Some(2))],
            ..Default::default()
        };
        assert!(s.verdict().is_ok());
        s.lag.push(lag(2, Some(2), Some(5)));
        s.lag.push(lag(3, None, None));
        let e = s.verdict().unwrap_err().to_string();
        assert_eq!(
            e,
            "kafka topic docs: idle exit with records left: partition 2 lag 3 (committed 2, \
             published unknown, high watermark 5); partition 3 lag unknown (committed unknown, \
             published unknown, high watermark unknown)"
        );
        // A signal is a stop, not a finish: lag left is reported, not an error.
        s.stop = StopReason::Signal;
        assert!(s.verdict().is_ok());
        s.stop = StopReason::Stalled;
        s.stall_limit = Duration::from_secs(120);
        s.stall = Some(Stall {
            partition: 2,
            offset: Some(2),
            high_watermark: Some(5),
            stalled: Duration::from_secs(121),
            cause: StallCause {
                consumer_errors: vec![("bad_compression".into(), 40), ("transport".into(), 2)],
            },
        });
        let e = s.verdict().unwrap_err().to_string();
        assert!(
            e.starts_with("kafka topic docs partition 2: stalled at offset 2 (high watermark 5) for 121 s, over source.stall_timeout_s = 120; cause: consumer errors bad_compression (40 so far), transport (2 so far);"),
            "{e}"
        );
        assert!(StallCause::default()
            .to_string()
            .starts_with("nothing delivered"));
    }
}
