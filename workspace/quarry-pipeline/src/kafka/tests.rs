//! The worker loop on librdkafka's mock cluster.

use super::*;
use crate::store::Location;
use rdkafka::producer::{BaseRecord, Producer};

fn stats(hi: i64, next: i64, committed: i64) -> FetchStats {
    FetchStats {
        consumer_lag: -1,
        hi_offset: hi,
        lo_offset: 0,
        committed_offset: committed,
        next_offset: next,
    }
}

#[test]
fn a_partition_is_behind_only_with_records_neither_delivered_nor_fetched_past() {
    // Stuck: the fetcher sits at offset 2, the worker expects 2, the log ends at 5.
    assert!(stats(5, 2, -1001).behind(Some(2)));
    // Caught up.
    assert!(!stats(5, 5, 5).behind(Some(5)));
    // The fetcher is past the last records (a transaction marker the consumer never sees).
    assert!(!stats(5, 5, 4).behind(Some(4)));
    // Nothing delivered yet: start from the committed offset, else the log start.
    assert!(stats(5, -1001, 3).behind(None));
    assert!(!stats(3, -1001, 3).behind(None));
    assert!(stats(1, -1001, -1001).behind(None));
    assert!(!stats(0, -1001, -1001).behind(None));
}

type Cluster = rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

/// A mock cluster whose topic `t` of `partitions` partitions holds `docs` (partition, text).
fn cluster_with(partitions: i32, docs: impl IntoIterator<Item = (i32, String)>) -> Cluster {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    cluster.create_topic("t", partitions, 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()
        .unwrap();
    for (p, text) in docs {
        producer
            .send(BaseRecord::<(), str>::to("t").partition(p).payload(&text))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    cluster
}

/// A worker's job over topic `t` of `cluster`, with `sections` (TOML) after its model.
fn worker_config(cluster: &Cluster, sections: &str) -> PipelineConfig {
    let text = format!(
        r#"name = "w"
schema = "unused.json"
[source]
kind = "kafka"
brokers = "{}"
topic = "t"
group = "g"
[prompt]
template = "{{{{ text }}}}"
[model]
path = "unused.gguf"
{sections}
[output]
url = "memory://unused/out"
[rejects]
url = "memory://unused/rej"
"#,
        cluster.bootstrap_servers()
    );
    PipelineConfig::parse(&text, "test", std::path::PathBuf::new()).unwrap()
}

/// An extractor these tests never give a document.
struct Unused;

impl Extractor for Unused {
    fn submit(
        &mut self,
        _: u64,
        _: &crate::record::Document,
    ) -> Result<(), crate::record::RejectCause> {
        panic!("nothing may be read before the partition is reconciled")
    }
    fn step(&mut self) -> Result<Vec<(u64, crate::extract::Generated)>, PipelineError> {
        Ok(Vec::new())
    }
    fn in_flight(&self) -> usize {
        0
    }
    fn capacity(&self) -> usize {
        1
    }
}

/// The output store cannot be listed when the group assigns the partitions: the worker reads
/// nothing, stops with `Reconcile` naming a partition and the store error, and its consumer
/// closes although the group's assignment was never answered.
#[test]
fn a_partition_that_cannot_be_reconciled_stops_the_worker_before_it_reads_anything() {
    let cluster = cluster_with(2, (0..2).map(|p| (p, "a document".to_string())));
    let cfg = worker_config(&cluster, "");
    let schema = serde_json::json!({"type": "object"});
    let rejects = Location::open("memory://reconcile-fails/rej").unwrap();
    let failing = crate::faults::FaultyStore::new(rejects.store.clone(), 0, false)
        .fail_lists(crate::store::ATTEMPTS as usize);
    let publisher = Publisher {
        shape: crate::columns::RecordShape::derive(&schema).unwrap(),
        output: Location::open("memory://reconcile-fails/out").unwrap(),
        rejects: rejects.with_store(std::sync::Arc::new(failing)),
        pipeline: "test".into(),
        model: "none".into(),
        model_runtime: String::new(),
        schema_sha256: "0".into(),
        row_group_rows: 1,
        zstd_level: 3,
    };
    let result = run_worker(cfg, publisher, Unused, schema, Duration::from_secs(60));
    match result {
        Err(PipelineError::Reconcile { partition, source }) => {
            assert!((0..2).contains(&partition), "partition {partition}");
            assert!(
                matches!(*source, PipelineError::Store { op: "list", .. }),
                "{source}"
            );
        }
        other => panic!("expected a reconcile error, got {other:?}"),
    }
}

/// Runs a worker of `cfg` until it is idle for `idle`, on a thread with a 90 s limit, so a hang
/// fails the test. The result comes after `run` returned, so after the worker's consumer closed.
fn run_worker<E: Extractor + Send + 'static>(
    cfg: PipelineConfig,
    publisher: Publisher,
    extractor: E,
    schema: serde_json::Value,
    idle: Duration,
) -> Result<WorkerSummary, PipelineError> {
    let opts = WorkerOptions {
        idle_exit: Some(idle),
        ..WorkerOptions::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut flow = Flow::new(
            extractor,
            crate::extract::Validator::new(&schema, "s").unwrap(),
        );
        let metrics = Metrics::new();
        let result = Worker::new(&cfg, &opts, &mut flow, &publisher, &metrics)
            .and_then(|w| w.run(&Shutdown::manual(), &opts));
        let _ = tx.send(result);
    });
    rx.recv_timeout(Duration::from_secs(90))
        .expect("the worker stopped and its consumer closed within 90 s")
}

/// A worker over `cluster` with the fake: `file_docs` documents a file, four publishers, the
/// stores of `publisher`, stopping after three idle seconds.
fn run_fake_worker(
    cluster: &Cluster,
    file_docs: usize,
    publisher: Publisher,
    extractor: crate::testing::Fake,
) -> Result<WorkerSummary, PipelineError> {
    let batching = format!("[batching]\nfile_docs = {file_docs}\nflush_ms = 600000");
    let mut cfg = worker_config(cluster, &batching);
    cfg.output.publishers = 4;
    let schema = crate::testing::schema();
    run_worker(cfg, publisher, extractor, schema, Duration::from_secs(3))
}

/// Partition 0's first file: its puts are held.
fn first_file_of_partition_0(p: &object_store::path::Path) -> bool {
    p.as_ref().ends_with(&range_name("t", 0, 0, 1))
}

/// The first file of partition 0 lands only once the engine has stepped three more times: on the
/// loop's own thread it would wait for ever (5 s, then counted as timed out). Meanwhile that
/// partition's next file waits for it (a later range landing first would be skipped by a
/// reconcile after a crash), and every range's commit lands by the stop.
#[test]
fn the_steps_go_on_while_files_publish_and_a_partitions_files_land_in_order() {
    let docs = (0..2).flat_map(|p| (0..10).map(move |i| (p, format!("p{p}d{i}"))));
    let cluster = cluster_with(2, docs);
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stores = Mutex::new(Vec::new());
    let publisher = crate::testing::publisher("kafka-lanes", |l| {
        let s = Arc::new(
            crate::faults::FaultyStore::new(l.store.clone(), 0, false).hold(
                ticks.clone(),
                3,
                first_file_of_partition_0,
            ),
        );
        stores.lock().unwrap().push(s.clone());
        s
    });
    // 20 documents, two at a time, 4 steps each: 40 steps, of which the held file needs 3.
    let s = run_fake_worker(&cluster, 2, publisher, crate::testing::fake(4, &ticks)).unwrap();
    assert_eq!((s.consumed, s.accepted, s.files), (20, 20, 10), "{s:?}");
    let stores = stores.into_inner().unwrap();
    let timed_out: usize = stores
        .iter()
        .map(|s| s.holds_timed_out.load(std::sync::atomic::Ordering::SeqCst))
        .sum();
    assert_eq!(timed_out, 0, "a held publish stopped the steps");
    // Each store (records, then markers) saw partition 0's ranges land in offset order.
    for store in &stores {
        let landed = store.landed.lock().unwrap().clone();
        let ranges: Vec<(i64, i64)> = landed
            .iter()
            .filter(|p| p.contains("partition=0/"))
            .filter_map(|p| parse_range(p.rsplit('/').next()?))
            .collect();
        assert_eq!(ranges.len(), 5, "{landed:?}");
        assert!(
            ranges.windows(2).all(|w| w[0].1 < w[1].0),
            "partition 0's files landed out of order: {ranges:?}"
        );
    }
    for lag in &s.lag {
        assert_eq!(
            (lag.committed, lag.lag),
            (Some(10), Some(0)),
            "every range committed: {lag:?}"
        );
    }
    assert_eq!(s.lag.len(), 2, "{s:?}");
    assert!(s.publish_s > 0.0 && s.publish_wait_s <= s.wall_s, "{s:?}");
}

/// Every put fails (after the store's retries): the first file's error stops the worker, and its
/// consumer closes (the revocation at close waits for publishes under way: a lane left marked
/// would hang it past the 90 s limit).
#[test]
fn a_publish_that_fails_stops_the_worker_with_its_error() {
    let cluster = cluster_with(2, (0..6).map(|i| (i % 2, format!("d{i}"))));
    let publisher = crate::testing::publisher("kafka-failing", |l| {
        Arc::new(crate::faults::FaultyStore::new(
            l.store.clone(),
            usize::MAX,
            false,
        ))
    });
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let e = run_fake_worker(&cluster, 1, publisher, crate::testing::fake(1, &ticks)).unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::Store {
                op: "create-if-absent put",
                ..
            }
        ),
        "expected the put's error, got {e}"
    );
}

/// Another worker (one expelled from the group but still running) claims partition 0's first
/// range as offsets 0-2 just before this worker claims it as 0-4, after this worker reconciled
/// the partition, and publishes nothing yet. This worker's range is fenced:
/// it publishes nothing of it, reads the partition again from where the output says, replays
/// exactly 0-2 and goes on from 3. Every offset lands once, in ranges that do not overlap.
#[test]
fn a_range_another_worker_claimed_is_not_published_and_the_partition_is_read_again() {
    let cluster = cluster_with(1, (0..10).map(|i| (0, format!("d{i}"))));
    let zombie = range_name("t", 0, 0, 2);
    let publisher = crate::testing::publisher("kafka-fenced", |l| {
        let claim = l.path(&claim_name("t", 0, 0));
        let store = crate::faults::FaultyStore::new(l.store.clone(), 0, false);
        Arc::new(store.rival(claim, zombie.clone().into()))
    });
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = run_fake_worker(
        &cluster,
        5,
        publisher.clone(),
        crate::testing::fake(1, &ticks),
    )
    .unwrap();
    assert_eq!(
        (s.fenced, s.consumed, s.accepted, s.files),
        (1, 10, 10, 3),
        "{s:?}"
    );
    let mut ranges: Vec<(i64, i64)> = publisher
        .rejects
        .list("")
        .unwrap()
        .iter()
        .filter_map(|m| parse_range(m.location.as_ref()))
        .collect();
    ranges.sort();
    assert_eq!(ranges, [(0, 2), (3, 7), (8, 9)]);
    let mut offsets: Vec<i64> = ranges
        .iter()
        .flat_map(|&(a, b)| {
            let name = range_name("t", 0, a, b);
            crate::encode::read_offsets(
                publisher
                    .output
                    .read(&publisher.output.path(&name))
                    .unwrap(),
            )
            .unwrap()
        })
        .collect();
    offsets.sort();
    assert_eq!(offsets, (0..10).collect::<Vec<i64>>());
    assert_eq!(s.lag[0].committed, Some(10), "{s:?}");
}

/// Each commit names its range's first offset, so the group's next worker reconciles each
/// partition from its last committed range on: 2 objects a partition (that range's accepted file
/// and marker) where the folders hold 15 (5 ranges, each with its claim), and nothing is read
/// twice. A worker of another group (no commit) lists the whole folders and still resumes where
/// the output says.
#[test]
fn a_restarted_worker_reconciles_from_the_range_its_group_committed() {
    let cluster = cluster_with(
        2,
        (0..2).flat_map(|p| (0..10).map(move |i| (p, format!("{i}")))),
    );
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let run = |group: &str| {
        let mut cfg = worker_config(&cluster, "[batching]\nfile_docs = 2\nflush_ms = 600000");
        cfg.output.publishers = 4;
        if let SourceConfig::Kafka(k) = &mut cfg.source {
            k.group = group.to_string();
        }
        let publisher = crate::testing::publisher("kafka-reconcile-from", |l| {
            Arc::new(crate::faults::FaultyStore::new(l.store.clone(), 0, false))
        });
        let fake = crate::testing::fake(1, &ticks);
        let schema = crate::testing::schema();
        run_worker(cfg, publisher, fake, schema, Duration::from_secs(3)).unwrap()
    };
    let first = run("g");
    assert_eq!((first.consumed, first.files), (20, 10), "{first:?}");
    assert_eq!(
        first.reconcile_listed, 0,
        "nothing was published: {first:?}"
    );
    let second = run("g");
    assert_eq!((second.consumed, second.files), (0, 0), "{second:?}");
    assert_eq!(second.reconcile_listed, 2 * 2, "{second:?}");
    let other = run("another group");
    assert_eq!((other.consumed, other.files), (0, 0), "{other:?}");
    assert_eq!(other.reconcile_listed, 2 * 15, "{other:?}");
}
