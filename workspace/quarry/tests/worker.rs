//! `quarry worker` end to end against a real Kafka-protocol broker (tansu, started by
//! `make test` as QUARRY_BROKERS) and the real model: lineage, bad messages, metrics, SIGKILL at
//! every crash point followed by a restart, and rebalances across two and three workers. After
//! every scenario the invariant checker reads all output with pyarrow and asserts each produced
//! (topic, partition, offset) appears exactly once across accepted and rejects.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{json, Value};

mod common;
use common::pq_dump;

/// The scenarios run one at a time: each starts model processes, and on 2 cores parallel runs
/// only make group joins and timeouts slower.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn brokers() -> String {
    std::env::var("QUARRY_BROKERS").expect(
        "QUARRY_BROKERS is not set: run the tests with `make test`, which starts tansu \
         (or start one with infra/local-kafka.sh start and export QUARRY_BROKERS)",
    )
}

fn tansu() -> PathBuf {
    std::env::var_os("QUARRY_TANSU")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/quarry/tools/bin/tansu")
        })
}

fn create_topic(name: &str, partitions: i32) {
    let st = Command::new(tansu())
        .args([
            "topic",
            "create",
            "--broker",
            &format!("tcp://{}", brokers()),
            name,
        ])
        .args(["--partitions", &partitions.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("tansu runs");
    assert!(st.success(), "creating topic {name}");
}

/// Real package records (the fields only).
fn packages(n: usize) -> Vec<String> {
    let text = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    let mut recs: Vec<String> = text
        .split("\n\n")
        .filter(|r| r.starts_with("Package: "))
        .map(|r| {
            r.lines()
                .filter(|l| !l.starts_with(' '))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    recs.sort();
    let step = recs.len() / n;
    (0..n).map(|i| recs[i * step].clone()).collect()
}

/// Produces `values` round-robin over `partitions`; returns the (partition, offset) of each, in
/// the order produced per partition (offsets assigned by the broker, counted per partition).
fn produce(topic: &str, partitions: i32, values: &[Vec<u8>]) -> BTreeMap<i32, i64> {
    produce_to(&brokers(), topic, partitions, values)
}

fn produce_to(
    brokers: &str,
    topic: &str,
    partitions: i32,
    values: &[Vec<u8>],
) -> BTreeMap<i32, i64> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let mut counts = BTreeMap::new();
    for (i, v) in values.iter().enumerate() {
        let part = i as i32 % partitions;
        let key = format!("k{i}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "origin",
            value: Some("test"),
        });
        p.send(
            BaseRecord::to(topic)
                .partition(part)
                .key(&key)
                .payload(v)
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .unwrap();
        *counts.entry(part).or_insert(0i64) += 1;
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30)).unwrap();
    counts
}

fn doc(i: usize, text: &str) -> Vec<u8> {
    json!({"id": format!("d{i}"), "text": text})
        .to_string()
        .into_bytes()
}

struct Job {
    dir: PathBuf,
    pipeline: PathBuf,
    topic: String,
}

impl Job {
    fn new(tag: &str, file_docs: usize) -> Self {
        Self::on(&brokers(), tag, file_docs)
    }

    fn on(brokers: &str, tag: &str, file_docs: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("quarry-worker-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let topic = format!("{tag}-{}", std::process::id());
        let root = root();
        let pipeline = dir.join("job.toml");
        std::fs::write(
            &pipeline,
            format!(
                r#"name = "test-{tag}"
schema = "{schema}"
[source]
kind = "kafka"
brokers = "{brokers}"
topic = "{topic}"
group = "g-{topic}"
value = "json"
fields = {{ text = "text", id = "id" }}
properties = {{ "session.timeout.ms" = "10000", "max.poll.interval.ms" = "20000" }}
[prompt]
system = "Extract the package's name and version from this Debian package record as JSON."
template = "{{{{ text }}}}"
[model]
path = "{model}"
[sampling]
max_tokens = 48
[batching]
max_running = 8
file_docs = {file_docs}
flush_ms = 2000
max_buffered = 16
max_doc_bytes = 100000
[output]
url = "{out}"
row_group_rows = 1
[rejects]
url = "{rej}"
"#,
                schema = root.join("schemas/package-id.json").display(),
                model = root
                    .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
                    .display(),
                brokers = brokers,
                out = dir.join("out").display(),
                rej = dir.join("rej").display(),
            ),
        )
        .unwrap();
        Job {
            dir,
            pipeline,
            topic,
        }
    }

    /// Sends rejects to `<topic>-dlq` too (the topic is created here).
    fn with_dead_letters(self) -> Self {
        let dlq = self.dead_letter_topic();
        create_topic(&dlq, 1);
        let mut text = std::fs::read_to_string(&self.pipeline).unwrap();
        assert!(text
            .trim_end()
            .ends_with(&format!("url = \"{}\"", self.dir.join("rej").display())));
        text.push_str(&format!("dead_letter_topic = \"{dlq}\"\n"));
        std::fs::write(&self.pipeline, text).unwrap();
        self
    }

    /// Adds a line to the `[source]` section (after its `properties` line).
    fn with_source_line(self, line: &str) -> Self {
        let text = std::fs::read_to_string(&self.pipeline).unwrap();
        let anchor = "\"max.poll.interval.ms\" = \"20000\" }\n";
        assert!(text.contains(anchor));
        std::fs::write(
            &self.pipeline,
            text.replace(anchor, &format!("{anchor}{line}\n")),
        )
        .unwrap();
        self
    }

    fn dead_letter_topic(&self) -> String {
        format!("{}-dlq", self.topic)
    }

    /// Every message on the dead-letter topic, as (key, JSON value), read from the start until
    /// `n` arrived or 60 s passed.
    fn dead_letters(&self, n: usize) -> Vec<(Option<Vec<u8>>, Value)> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::Message;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", format!("dlq-reader-{}", self.topic))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        c.subscribe(&[&self.dead_letter_topic()]).unwrap();
        let mut out = Vec::new();
        let start = Instant::now();
        while out.len() < n && start.elapsed() < Duration::from_secs(60) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(500)) {
                let v = serde_json::from_slice(m.payload().unwrap()).unwrap();
                out.push((m.key().map(<[u8]>::to_vec), v));
            }
        }
        out
    }

    fn spawn(&self, extra_env: &[(&str, &str)], extra_args: &[&str]) -> Child {
        self.spawn_idle(6, extra_env, extra_args)
    }

    fn spawn_idle(&self, idle_s: u32, extra_env: &[(&str, &str)], extra_args: &[&str]) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_quarry"));
        cmd.args(["worker", "--pipeline"])
            .arg(&self.pipeline)
            .args(["--idle-exit", &idle_s.to_string()])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("quarry worker starts")
    }

    fn dump(&self, which: &str) -> Value {
        pq_dump(&self.dir.join(which))
    }

    /// The invariant: every produced (topic, partition, offset) exactly once across accepted and
    /// rejects, and every footer readable (pq_dump fails otherwise).
    fn check_exactly_once(&self, produced: &BTreeMap<i32, i64>) -> (Vec<Value>, Vec<Value>) {
        let want: Vec<(i32, i64)> = produced
            .iter()
            .flat_map(|(p, n)| (0..*n).map(move |o| (*p, o)))
            .collect();
        self.check_exactly_once_of(&want)
    }

    /// The same for an explicit set of (partition, offset).
    fn check_exactly_once_of(&self, offsets: &[(i32, i64)]) -> (Vec<Value>, Vec<Value>) {
        let acc = self.dump("out")["rows"].as_array().unwrap().clone();
        let rej = self.dump("rej")["rows"].as_array().unwrap().clone();
        let mut seen: Vec<(String, i64, i64)> = acc
            .iter()
            .chain(&rej)
            .map(|r| {
                (
                    r["_source"].as_str().unwrap().to_string(),
                    r["_partition"].as_i64().unwrap(),
                    r["_offset"].as_i64().unwrap(),
                )
            })
            .collect();
        seen.sort();
        let mut want: Vec<(String, i64, i64)> = offsets
            .iter()
            .map(|(p, o)| (self.topic.clone(), *p as i64, *o))
            .collect();
        want.sort();
        assert_eq!(
            seen, want,
            "each produced offset exactly once across accepted and rejects"
        );
        (acc, rej)
    }
}

fn wait(mut child: Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st, err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "worker still running after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn worker_extracts_with_lineage_rejects_bad_messages_and_serves_metrics() {
    let _one_at_a_time = serial();
    let job = Job::new("e2e", 3);
    create_topic(&job.topic, 2);
    let job = job.with_dead_letters();
    let docs = packages(4);
    let mut values: Vec<Vec<u8>> = docs.iter().enumerate().map(|(i, d)| doc(i, d)).collect();
    values.push(b"{\"id\": \"u\", \"text\": \"caf\xc3\x28\"}".to_vec()); // invalid UTF-8
    values.push(doc(5, "  ")); // empty
    values.push(b"Package: not json".to_vec()); // not JSON, JSON expected

    // Over max_doc_bytes (100 kB here). The 10 MB case is in the dataset test: Kafka brokers cap
    // messages at 1 MB by default, and tansu 0.6 accepts a 10 MB message but never serves one over
    // 4–8 MB to a consumer (probed 2026-11-22: 2 and 4 MB arrive; 8 and 10 MB never do, even with
    // max.partition.fetch.bytes at 20 MB).
    values.push(doc(7, &"y".repeat(200_000)));
    values.push(doc(
        8,
        &docs[0].repeat(60_000 / docs[0].len() + 1)[..60_000],
    )); // past the context
    let produced = produce(&job.topic, 2, &values);

    let child = job.spawn(&[], &["--metrics", "127.0.0.1:19465"]);
    // Scrape the endpoint while the worker runs.
    let mut scraped = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(300) {
        if let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:19465") {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            let consumed = body.contains("quarry_docs_consumed_total")
                && !body.contains("quarry_docs_consumed_total 0");
            // Lag comes from librdkafka's statistics, every 5 s.
            if consumed && body.contains("quarry_consumer_lag{") {
                scraped = body;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (st, err) = wait(child, Duration::from_secs(600));
    assert!(st.success(), "worker failed: {err}");
    assert!(
        scraped.contains("quarry_docs_rejected_total"),
        "metrics: {scraped}"
    );
    assert!(
        scraped.contains("quarry_step_seconds_bucket"),
        "metrics: {scraped}"
    );
    // Files were published (documents counted), each timed on its publisher thread.
    assert!(
        scraped.contains("quarry_publish_seconds_count")
            && !scraped.contains("quarry_publish_seconds_count 0"),
        "metrics: {scraped}"
    );
    assert!(
        scraped.contains("quarry_consumer_lag{"),
        "metrics: {scraped}"
    );

    let (acc, rej) = job.check_exactly_once(&produced);
    let cause = |id: &str| {
        rej.iter()
            .find(|r| r["_doc_id"] == id)
            .map(|r| r["cause"].as_str().unwrap().to_string())
    };
    let by_key = |k: &str| {
        rej.iter()
            .chain(&acc)
            .find(|r| r["_key"] == hex(k))
            .cloned()
    };
    assert_eq!(by_key("k4").unwrap()["cause"], "invalid_utf8");
    assert_eq!(cause("d5").as_deref(), Some("empty"));
    assert_eq!(by_key("k6").unwrap()["cause"], "not_json");
    assert_eq!(by_key("k7").unwrap()["cause"], "too_large"); // too large to parse for its id
    assert_eq!(cause("d8").as_deref(), Some("engine_error"));
    assert!(!acc.is_empty(), "some package was extracted");
    for r in acc.iter().chain(&rej) {
        assert_eq!(r["_headers"], r#"{"origin":"test"}"#);
        assert!(r["_timestamp"].as_str().unwrap().starts_with("20"));
    }
    // Files are named by their offset ranges and carry them in their metadata.
    for f in job.dump("rej")["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        let (a, b) = range_of(path);
        assert_eq!(
            f["metadata"]["quarry.offset_first"],
            a.to_string(),
            "{path}"
        );
        assert_eq!(f["metadata"]["quarry.offset_last"], b.to_string(), "{path}");
        assert!(
            path.contains(&format!("topic={}/partition=", job.topic)),
            "{path}"
        );
    }
    assert!(err.contains("worker stopped"), "{err}");

    // Every reject also went to the dead-letter topic, with its key, cause and place.
    let letters = job.dead_letters(rej.len());
    assert_eq!(letters.len(), rej.len(), "dead letters: {letters:?}");
    for r in &rej {
        let (key, v) = letters
            .iter()
            .find(|(_, v)| v["partition"] == r["_partition"] && v["offset"] == r["_offset"])
            .unwrap_or_else(|| panic!("no dead letter for {r}"));
        assert_eq!(v["cause"], r["cause"]);
        assert_eq!(v["source"], job.topic.as_str());
        assert_eq!(v["pipeline"], "test-e2e");
        let key_hex = key
            .as_ref()
            .map(|k| k.iter().map(|b| format!("{b:02x}")).collect::<String>());
        assert_eq!(key_hex.as_deref(), r["_key"].as_str());
    }
}

/// Log lines without terminal colour codes.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn range_of(path: &str) -> (i64, i64) {
    let stem = path
        .rsplit('/')
        .next()
        .unwrap()
        .trim_end_matches(".parquet");
    let (a, b) = stem.split_once('-').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// The crash test's Kafka session timeout.
const SESSION_MS: u64 = 6000;

#[test]
fn worker_is_exactly_once_across_sigkill_at_every_crash_point() {
    let _one_at_a_time = serial();
    let docs = packages(5);
    for point in [
        "before_publish",
        "mid_write",
        "between_files",
        "before_commit",
    ] {
        let job = Job::new(&format!("crash-{}", point.replace('_', "-")), 2);
        create_topic(&job.topic, 1);
        let mut values: Vec<Vec<u8>> = docs.iter().enumerate().map(|(i, d)| doc(i, d)).collect();
        values.insert(1, doc(99, "")); // a reject in every file pair
        let produced = produce(&job.topic, 1, &values);
        // Crash on the second file, so the first is published and committed before. A short
        // session lets tansu expire the killed member within seconds (with the default 45 s it
        // took minutes here), so the restart rejoins the same group: where it resumes comes from
        // its committed offset and from reconciling with the published files together.
        let session_ms = SESSION_MS.to_string();
        let session = [
            ("QUARRY_KAFKA_SESSION_TIMEOUT_MS", session_ms.as_str()),
            ("QUARRY_KAFKA_HEARTBEAT_INTERVAL_MS", "1000"),
        ];
        let mut crash = session.to_vec();
        crash.extend([("QUARRY_CRASH_AT", point), ("QUARRY_CRASH_AFTER", "1")]);
        let child = job.spawn(&crash, &[]);
        let (st, err) = wait(child, Duration::from_secs(600));
        assert_eq!(
            st.signal(),
            Some(9),
            "{point}: the worker should die by SIGKILL: {err}"
        );
        assert!(err.contains(&format!("crash point {point}")), "{err}");
        // The restart joins once the killed member's session has expired. tansu 0.6.0 drops a dead
        // member only when a request finds its session over, and a member that joined before that
        // became a follower of the dead leader: its sync got no assignment, its heartbeats kept
        // succeeding, and it sat without partitions (CI, 2026-11-23, and 1 run in 3 here). Kafka
        // itself holds the join until the old session expires, so this wait is what Kafka does.
        std::thread::sleep(Duration::from_millis(SESSION_MS + 2000));
        // Idle for up to 30 s: the group hands the partition back once the old session expires.
        let (st, err) = wait(job.spawn_idle(30, &session, &[]), Duration::from_secs(600));
        assert!(st.success(), "{point}: restart failed: {err}");
        let plain = strip_ansi(&err);
        assert!(
            plain.contains("resume=Some("),
            "{point}: the restart reconciled from the output: {plain}"
        );
        job.check_exactly_once(&produced);
    }
}

/// Two, then three workers in one group over six partitions while the first is mid-stream: every
/// worker publishes, and every produced offset is in the output exactly once. `idle_s` is how long
/// a worker with nothing to do waits before it exits; `env` is added to each worker's environment.
fn rebalance_scenario(
    bootstrap: &str,
    job: &Job,
    idle_s: u32,
    env: &[(&str, &str)],
) -> Vec<String> {
    let docs = packages(18);
    let values: Vec<Vec<u8>> = docs.iter().enumerate().map(|(i, d)| doc(i, d)).collect();
    let produced = produce_to(bootstrap, &job.topic, 6, &values);
    let a = job.spawn_idle(idle_s, env, &[]);
    std::thread::sleep(Duration::from_secs(10));
    let b = job.spawn_idle(idle_s, env, &[]);
    std::thread::sleep(Duration::from_secs(10));
    let c = job.spawn_idle(idle_s, env, &[]);
    let mut publishers = 0;
    let mut logs = Vec::new();
    for w in [a, b, c] {
        let (st, err) = wait(w, Duration::from_secs(900));
        assert!(st.success(), "worker failed: {err}");
        publishers += err.contains("published") as usize;
        logs.push(err);
    }
    assert!(
        publishers >= 2,
        "the partitions were shared: {publishers} workers published"
    );
    job.check_exactly_once(&produced);
    logs
}

/// On tansu. Its cooperative rebalances are slow: in four runs here (2026-11-22) a revoked partition
/// stayed unowned for up to 28 s before the broker handed it on, so the workers wait a minute with
/// nothing to do before they exit, rather than leave a partition nobody will read.
#[test]
fn rebalances_across_two_then_three_workers_keep_exactly_once() {
    let _one_at_a_time = serial();
    let job = Job::new("rebalance", 2);
    create_topic(&job.topic, 6);
    let logs = rebalance_scenario(&brokers(), &job, 60, &[]);
    assert_protocol(&logs, "Cooperative");
}

/// The rebalance scenario on librdkafka's own mock cluster (in this process, reached by the
/// workers over TCP), whose group coordinator hands revoked partitions on at once; the workers'
/// logs.
fn rebalance_on_the_mock_cluster(tag: &str, env: &[(&str, &str)]) -> Vec<String> {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let job = Job::on(&bootstrap, tag, 2);
    cluster.create_topic(&job.topic, 6, 1).unwrap();
    rebalance_scenario(&bootstrap, &job, 15, env)
}

/// Every assignment in the workers' logs used `protocol` (a worker may have been given none).
fn assert_protocol(logs: &[String], protocol: &str) {
    let text = strip_ansi(&logs.join("\n"));
    let used: Vec<&str> = text
        .split("protocol=")
        .skip(1)
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(
        !used.is_empty() && used.iter().all(|p| *p == protocol),
        "every assignment used the {protocol} protocol, not {used:?}"
    );
}

#[test]
fn rebalances_on_the_mock_cluster_keep_exactly_once() {
    let _one_at_a_time = serial();
    let logs = rebalance_on_the_mock_cluster("rebalance-mock", &[]);
    assert_protocol(&logs, "Cooperative");
}

/// The same with the eager protocol (`range`, set through the environment as a deployment would):
/// every rebalance revokes everything and assigns the whole new set, through `assign`, not
/// `incremental_assign`.
#[test]
fn rebalances_with_the_eager_protocol_keep_exactly_once() {
    let _one_at_a_time = serial();
    let logs = rebalance_on_the_mock_cluster(
        "rebalance-eager",
        &[("QUARRY_KAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range")],
    );
    assert_protocol(&logs, "Eager");
}

// ---- Input from any producer: codecs, tombstones, stalls and an idle exit that tells the truth.

/// One record of a `tests/pipeline/kafka_produce.py` plan: a JSON document, a tombstone (`None`) or
/// an empty value (`Some("")`).
fn plan_record(partition: i32, key: &str, value: Option<&str>) -> Value {
    json!({"partition": partition, "key": key, "value": value, "headers": {"origin": "py"}})
}

/// Produces a plan with kafka-python (not librdkafka); the (partition, offset) of each record, in
/// plan order.
fn produce_foreign(bootstrap: &str, topic: &str, plan: &Value) -> Vec<(i32, i64)> {
    use std::io::Write;
    let mut child = Command::new(common::python())
        .arg(root().join("tests/pipeline/kafka_produce.py"))
        .args([bootstrap, topic])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test venv's python runs (infra/setup-test.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kafka_produce.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let placed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    placed
        .iter()
        .map(|p| {
            (
                p["partition"].as_i64().unwrap() as i32,
                p["offset"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The JSON object after `worker stopped: ` in a worker's log.
fn stop_summary(log: &str) -> Value {
    let plain = strip_ansi(log);
    let line = plain
        .lines()
        .find_map(|l| l.split_once("worker stopped: ").map(|(_, j)| j.to_string()))
        .unwrap_or_else(|| panic!("no summary line in: {plain}"));
    serde_json::from_str(&line).unwrap()
}

/// A batch of `codec` over two partitions: two package documents, a tombstone and an empty value.
/// Each document carries a field the prompt ignores, repetitive enough that every codec pays off
/// (kafka_produce.py fails a batch that goes out uncompressed).
fn codec_batch(codec: &str, docs: &[String], first: usize) -> Value {
    let d = |i: usize| {
        json!({"id": format!("d{}", first + i), "text": docs[i], "note": "compressible ".repeat(40)})
            .to_string()
    };
    json!({"codec": codec, "records": [
        plan_record(0, &format!("{codec}-a"), Some(&d(0))),
        plan_record(1, &format!("{codec}-b"), Some(&d(1))),
        plan_record(0, &format!("{codec}-tomb"), None),
        plan_record(1, &format!("{codec}-empty"), Some("")),
    ]})
}

/// Every codec tansu serves, from kafka-python: each record exactly once across accepted and
/// rejects, each reject also a dead letter, tombstones and empty values told apart, lineage kept,
/// and an idle exit of 0 only because nothing is left.
#[test]
fn every_codec_from_a_foreign_producer_is_consumed_exactly_once() {
    let _one_at_a_time = serial();
    let job = Job::new("codecs", 100);
    create_topic(&job.topic, 2);
    let job = job.with_dead_letters();
    let docs = packages(8);
    // tansu 0.6.0 (the newest on crates.io, 2026-11-24) stores snappy batches but fails every
    // fetch that reaches one (`UnexpectedType("Snappy")`): snappy is covered on the mock cluster.
    let codecs = ["none", "gzip", "lz4", "zstd"];
    let plan: Vec<Value> = codecs
        .iter()
        .enumerate()
        .map(|(i, c)| codec_batch(c, &docs[2 * i..2 * i + 2], 2 * i))
        .collect();
    let placed = produce_foreign(&brokers(), &job.topic, &Value::Array(plan));
    assert_eq!(placed.len(), 16);

    let (st, err) = wait(job.spawn(&[], &[]), Duration::from_secs(600));
    assert!(st.success(), "worker failed: {err}");
    let summary = stop_summary(&err);
    assert_eq!(summary["stop"], "idle", "{summary}");
    assert_eq!(summary["lag_total"], 0, "{summary}");
    assert_eq!(summary["consumed"], 16, "{summary}");
    assert!(
        summary["lag"].as_array().unwrap().len() == 2,
        "both partitions reported: {summary}"
    );

    let (acc, rej) = job.check_exactly_once_of(&placed);
    let row = |key: &str| {
        acc.iter()
            .chain(&rej)
            .find(|r| r["_key"] == hex(key))
            .cloned()
            .unwrap_or_else(|| panic!("no row for key {key}"))
    };
    for c in codecs {
        assert_eq!(row(&format!("{c}-tomb"))["cause"], "tombstone", "{c}");
        assert_eq!(row(&format!("{c}-empty"))["cause"], "empty", "{c}");
        for k in ["a", "b"] {
            let r = row(&format!("{c}-{k}"));
            assert_eq!(r["_headers"], r#"{"origin":"py"}"#, "{c}: {r}");
            assert!(r["_doc_id"].as_str().unwrap().starts_with('d'), "{c}: {r}");
        }
    }
    assert!(!acc.is_empty(), "some package was extracted");
    let letters = job.dead_letters(rej.len());
    assert_eq!(
        letters.len(),
        rej.len(),
        "a dead letter per reject: {letters:?}"
    );
}

/// Snappy (which tansu cannot serve) from kafka-python on librdkafka's mock cluster, whose broker
/// hands batches back as they were produced; tombstones skipped by configuration take their place
/// in the file's offset range, are counted, and become no row.
#[test]
fn snappy_batches_and_skipped_tombstones_on_the_mock_cluster() {
    let _one_at_a_time = serial();
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let job = Job::on(&bootstrap, "snappy-mock", 100).with_source_line("tombstones = \"skip\"");
    cluster.create_topic(&job.topic, 2, 1).unwrap();
    let docs = packages(2);
    let placed = produce_foreign(
        &bootstrap,
        &job.topic,
        &json!([codec_batch("snappy", &docs, 0)]),
    );
    let (st, err) = wait(
        job.spawn_idle(10, &[], &["--metrics", "127.0.0.1:19466"]),
        Duration::from_secs(600),
    );
    assert!(st.success(), "worker failed: {err}");
    let summary = stop_summary(&err);
    assert_eq!(summary["skipped"], 1, "{summary}");
    assert_eq!(summary["consumed"], 4, "{summary}");
    assert_eq!(summary["lag_total"], 0, "{summary}");
    // The tombstone is the third record of the plan: every other offset has a row.
    let rows: Vec<(i32, i64)> = placed
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, p)| *p)
        .collect();
    let (acc, rej) = job.check_exactly_once_of(&rows);
    assert!(
        acc.iter().chain(&rej).all(|r| r["cause"] != "tombstone"),
        "no tombstone rows"
    );
    let marker = job.dump("rej")["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().contains("partition=0/"))
        .cloned()
        .expect("partition 0 has a marker");
    assert_eq!(marker["metadata"]["quarry.skipped"], "1", "{marker}");
    drop(cluster);
}

/// A plan that stops partition 0 at offset 2: two documents, then a gzip batch whose bytes are not
/// gzip (a real batch no consumer can decode), then one more document.
fn stuck_plan(docs: &[String]) -> Value {
    let d = |i: usize| String::from_utf8(doc(i, &docs[i])).unwrap();
    json!([
        {"codec": "none", "records": [plan_record(0, "s0", Some(&d(0))), plan_record(0, "s1", Some(&d(1)))]},
        {"codec": "gzip", "corrupt": true, "records": [plan_record(0, "s2", Some(&d(2))), plan_record(0, "s3", Some(&d(3)))]},
        {"codec": "none", "records": [plan_record(0, "s4", Some(&d(4)))]},
    ])
}

/// A one-partition topic on a fresh mock cluster holding [`stuck_plan`]; keep the cluster alive
/// while the job runs.
fn stuck_job(
    tag: &str,
) -> (
    rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Job,
) {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let job = Job::on(&bootstrap, tag, 100);
    cluster.create_topic(&job.topic, 1, 1).unwrap();
    produce_foreign(&bootstrap, &job.topic, &stuck_plan(&packages(5)));
    (cluster, job)
}

/// A partition stuck on a batch it cannot decode: the worker publishes what came before, names
/// the partition and offset, and exits non-zero within the stall timeout; the consumer error is
/// counted, and logged once rather than at every retry.
#[test]
fn a_partition_stuck_on_an_undecodable_batch_stops_the_worker_naming_it() {
    let _one_at_a_time = serial();
    let (cluster, job) = stuck_job("stuck-mock");
    let started = Instant::now();
    let child = job.spawn_idle(
        600,
        &[],
        &["--stall-timeout", "20", "--metrics", "127.0.0.1:19467"],
    );
    // The gauge and the error counter while it is stalled.
    let mut scraped = String::new();
    while started.elapsed() < Duration::from_secs(300) {
        if let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:19467") {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            if body.contains("quarry_stalled_partitions 1") {
                scraped = body;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let (st, err) = wait(child, Duration::from_secs(600));
    let took = started.elapsed();
    let plain = strip_ansi(&err);
    assert!(!st.success(), "a stalled worker must fail: {plain}");
    assert!(
        scraped.contains("quarry_consumer_errors_total{kind="),
        "consumer errors counted: {scraped}"
    );
    assert!(
        plain.contains("partition 0: stalled at offset 2"),
        "names partition and offset: {plain}"
    );
    assert!(plain.contains("the records were not skipped"), "{plain}");
    // 20 s of stall after the first two documents, plus start-up and the model: well under this.
    assert!(took < Duration::from_secs(240), "exited after {took:?}");
    let errors_logged = plain.matches("consumer error topic=").count();
    assert!(
        (1..=4).contains(&errors_logged),
        "consumer errors logged once per kind and minute, not per retry ({errors_logged}): {plain}"
    );
    let summary = stop_summary(&err);
    assert_eq!(summary["stop"], "stalled", "{summary}");
    assert_eq!(summary["lag_total"], 3, "{summary}");
    // What came before the stuck batch is published and committed; nothing after it is.
    job.check_exactly_once_of(&[(0, 0), (0, 1)]);
    drop(cluster);
}

/// `--idle-exit` with records left behind a stuck batch exits non-zero and prints each
/// partition's lag.
#[test]
fn idle_exit_with_lag_left_exits_non_zero_and_prints_the_lag() {
    let _one_at_a_time = serial();
    let (cluster, job) = stuck_job("lagleft-mock");
    let (st, err) = wait(
        job.spawn_idle(8, &[], &["--stall-timeout", "600"]),
        Duration::from_secs(600),
    );
    let plain = strip_ansi(&err);
    assert!(!st.success(), "lag left must fail the idle exit: {plain}");
    assert!(
        plain.contains(
            "idle exit with records left: partition 0 lag 3 (committed 2, published 2, high watermark 5)"
        ),
        "{plain}"
    );
    let summary = stop_summary(&err);
    assert_eq!(summary["stop"], "idle", "{summary}");
    assert_eq!(summary["lag"][0]["lag"], 3, "{summary}");
    job.check_exactly_once_of(&[(0, 0), (0, 1)]);
    drop(cluster);
}

/// A broker error that repeats: tansu 0.6.0 (pinned by `infra/setup-test.sh`) stores a compressed
/// snappy batch but answers every fetch that reaches it by dropping the connection
/// (`UnexpectedType("Snappy")` in its log), so librdkafka never even learns where the partition
/// ends. The worker asks the broker, names the partition, and exits non-zero within the bound.
/// (Should a later tansu serve snappy, this test needs another broker fault.)
#[test]
fn a_broker_that_fails_every_fetch_stops_the_worker_naming_the_partition() {
    let _one_at_a_time = serial();
    let job = Job::new("fetchfail", 100);
    create_topic(&job.topic, 1);
    let docs = packages(2);
    let d = |i: usize| String::from_utf8(doc(i, &docs[i])).unwrap();
    produce_foreign(
        &brokers(),
        &job.topic,
        &json!([{"codec": "snappy", "records": [
            plan_record(0, "f0", Some(&d(0))),
            plan_record(0, "f1", Some(&d(1))),
        ]}]),
    );
    let started = Instant::now();
    let (st, err) = wait(
        job.spawn_idle(600, &[], &["--stall-timeout", "20"]),
        Duration::from_secs(600),
    );
    let took = started.elapsed();
    let plain = strip_ansi(&err);
    assert!(!st.success(), "a stalled worker must fail: {plain}");
    assert!(
        plain.contains(&format!(
            "kafka topic {} partition 0: stalled at offset",
            job.topic
        )),
        "{plain}"
    );
    assert!(took < Duration::from_secs(180), "exited after {took:?}");
    let summary = stop_summary(&err);
    assert_eq!(summary["stop"], "stalled", "{summary}");
    assert_eq!(summary["consumed"], 0, "{summary}");
    assert_eq!(summary["lag_total"], 2, "{summary}");
}

/// A worker process whose log is read while it runs.
struct Watched {
    child: Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Watched {
    fn new(mut child: Child) -> Self {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr is piped");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Watched { child, log, reader }
    }

    fn log(&self) -> String {
        strip_ansi(&self.log.lock().unwrap())
    }

    /// Waits until `done` holds of the log (or the process state, `ps`'s `stat`), at most `limit`.
    fn wait_until(&self, limit: Duration, done: impl Fn(&str, &str) -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .unwrap_or_default();
            // The state follows the command name in parentheses.
            let state = stat.rsplit(')').next().unwrap_or("").trim().to_string();
            if done(&self.log(), &state) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits for the process to exit (killed after `limit`); its status and whole log.
    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("worker still running after {limit:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let Watched { log, reader, .. } = self;
        reader.join().unwrap();
        let log = strip_ansi(&log.lock().unwrap());
        (status, log)
    }
}

/// A zombie on tansu. Worker A stops itself (SIGSTOP) with its range 0-2 extracted but not yet
/// claimed, as a worker stalled past its session would. The group hands the partition to B, which
/// cuts offsets 0-5 into one range. As soon as B has reconciled the partition (and found nothing),
/// A is continued, claims 0-2 and publishes it. One of the two claims on offset 0 is then fenced:
/// that worker publishes nothing of its range and reads the partition again from the output. Every
/// offset lands once, in ranges that do not overlap; without the claims A's 0-2 and B's 0-5 both
/// landed.
#[test]
fn a_zombie_worker_and_the_new_owner_never_publish_overlapping_ranges() {
    let _one_at_a_time = serial();
    let job = Job::new("zombie", 3);
    create_topic(&job.topic, 1);
    let docs = packages(6);
    let values: Vec<Vec<u8>> = docs.iter().enumerate().map(|(i, d)| doc(i, d)).collect();
    produce(&job.topic, 1, &values[..3]);
    let session_ms = SESSION_MS.to_string();
    let session = [
        ("QUARRY_KAFKA_SESSION_TIMEOUT_MS", session_ms.as_str()),
        ("QUARRY_KAFKA_HEARTBEAT_INTERVAL_MS", "1000"),
    ];
    let mut stall = session.to_vec();
    stall.extend([
        ("QUARRY_CRASH_AT", "before_claim"),
        ("QUARRY_CRASH_SIGNAL", "stop"),
    ]);
    let a = Watched::new(job.spawn_idle(20, &stall, &[]));
    assert!(
        a.wait_until(Duration::from_secs(300), |_, state| state.starts_with('T')),
        "A stopped itself before its claim: {}",
        a.log()
    );
    // Three more records, which only B reads, and B takes all six as one range.
    produce(&job.topic, 1, &values[3..]);
    let text = std::fs::read_to_string(&job.pipeline).unwrap();
    assert!(text.contains("file_docs = 3\n"));
    std::fs::write(
        &job.pipeline,
        text.replace("file_docs = 3\n", "file_docs = 6\n"),
    )
    .unwrap();
    // As in the crash test: B joins once A's session is over.
    std::thread::sleep(Duration::from_millis(SESSION_MS + 2000));
    let b = Watched::new(job.spawn_idle(30, &session, &[]));
    assert!(
        b.wait_until(Duration::from_secs(300), |log, _| log.contains(" assigned")),
        "B was assigned the partition: {}",
        b.log()
    );
    let cont = Command::new("kill")
        .args(["-CONT", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(cont.success());
    let (sb, log_b) = b.finish(Duration::from_secs(600));
    let (sa, log_a) = a.finish(Duration::from_secs(600));
    assert!(sb.success(), "B failed: {log_b}");
    // A, if it is the one fenced, may find the partition taken away when it seeks.
    assert!(
        sa.success() || log_a.contains("seek after a fenced publish"),
        "A failed: {log_a}"
    );
    let fenced = |log: &str| log.contains("claimed this range's first offset");
    eprintln!("fenced: A {}, B {}", fenced(&log_a), fenced(&log_b));
    let offsets: Vec<(i32, i64)> = (0..6).map(|o| (0, o)).collect();
    job.check_exactly_once_of(&offsets);
    let mut ranges: Vec<(i64, i64)> = job.dump("rej")["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| range_of(f["path"].as_str().unwrap()))
        .collect();
    ranges.sort();
    assert!(
        ranges.windows(2).all(|w| w[0].1 < w[1].0),
        "the published ranges overlap: {ranges:?}"
    );
    assert!(
        fenced(&log_a) || fenced(&log_b),
        "one of the two claims on offset 0 was fenced:\nA: {log_a}\nB: {log_b}"
    );
}
