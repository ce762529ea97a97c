//! Dataset jobs split across workers, as users run them: `quarry extract` processes
//! with `--shard-index`/`--shard-count` over one input prefix on a real S3 API (moto_server,
//! started by `make test` as QUARRY_S3_ENDPOINT), the real model, the output read back from S3 by
//! pyarrow, and the shard assignment checked against Python's own SHA-256.

#[path = "../../quarry-pipeline/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use common::{dump, keys, package_id_job, packages, root, rows, run_python, temp_dir};
use serde_json::{json, Value};

fn endpoint() -> String {
    std::env::var("QUARRY_S3_ENDPOINT").expect(
        "QUARRY_S3_ENDPOINT is not set: run the tests with `make test`, which starts moto_server \
         (or infra/local-s3.sh start and export QUARRY_S3_ENDPOINT)",
    )
}

/// Runs a Python snippet with boto3 as `s3` (on moto) and returns what it prints.
fn py(script: &str) -> String {
    let program = format!(
        "import boto3, hashlib, json, os, sys\ns3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='test', aws_secret_access_key='test', region_name='us-east-1')\n{script}",
        endpoint()
    );
    String::from_utf8(run_python(&format!("python: {script}"), &["-c", &program])).unwrap()
}

/// One test's bucket: `shards` JSONL shards under `in/` (one package record each; the first also
/// holds a line that is not JSON, a reject), and a job definition that reads them.
struct Job {
    bucket: String,
    pipeline: PathBuf,
    /// Shard names (output file names), sorted.
    names: Vec<String>,
    /// (source, offset) of every input line.
    lines: Vec<(String, i64)>,
}

impl Job {
    fn new(tag: &str, shards: usize) -> Job {
        let bucket = format!("quarry-shard-{tag}-{}", std::process::id());
        let dir = temp_dir(&format!("sharding-{tag}"));
        let docs = packages(shards);
        let mut lines = Vec::new();
        for (k, doc) in docs.iter().enumerate() {
            let mut text = json!({"id": format!("d{k}"), "text": doc}).to_string() + "\n";
            if k == 0 {
                text.push_str("Package: not json\n");
            }
            let name = format!("part-{k}.jsonl");
            std::fs::write(dir.join(&name), &text).unwrap();
            // A line's offset is its first byte's.
            let mut at = 0;
            for l in text.lines() {
                lines.push((format!("s3://{bucket}/in/{name}"), at));
                at += l.len() as i64 + 1;
            }
        }
        py(&format!(
            "s3.create_bucket(Bucket='{bucket}')\nfor f in sorted(os.listdir('{d}')):\n    if f.endswith('.jsonl'): s3.upload_file(os.path.join('{d}', f), '{bucket}', 'in/' + f)",
            d = dir.display()
        ));
        let pipeline = dir.join("job.toml");
        std::fs::write(&pipeline, package_id_job("sharding-test", &bucket)).unwrap();
        let mut names: Vec<String> = (0..shards).map(|k| format!("part-{k}.parquet")).collect();
        names.sort();
        lines.sort();
        Job {
            bucket,
            pipeline,
            names,
            lines,
        }
    }

    /// `quarry ARGS` with this job's S3 credentials in its environment.
    fn quarry(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quarry"));
        c.args(args)
            .current_dir(root())
            .env("AWS_ENDPOINT", endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env_remove("JOB_COMPLETION_INDEX")
            .stdin(Stdio::null());
        c
    }

    /// `quarry extract --json` on this job with `extra` arguments, started.
    fn extract(&self, extra: &[&str]) -> Child {
        let mut a = vec![
            "extract",
            "--pipeline",
            self.pipeline.to_str().unwrap(),
            "--json",
        ];
        a.extend_from_slice(extra);
        self.quarry(&a)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The names of the shards worker `index` of `count` owns, by Python's SHA-256 (the hash the
    /// documentation gives), not quarry's.
    fn owned(&self, index: usize, count: usize) -> BTreeSet<String> {
        let names = serde_json::to_string(&self.names).unwrap();
        let out = py(&format!(
            "names = json.loads('{names}')\nprint(json.dumps([n for n in names if int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], 'big') % {count} == {index}]))"
        ));
        serde_json::from_str::<Vec<String>>(&out)
            .unwrap()
            .into_iter()
            .collect()
    }

    /// The index of 2 that owns more shards, and its shards.
    fn larger_half(&self) -> (usize, BTreeSet<String>) {
        (0..2)
            .map(|i| (i, self.owned(i, 2)))
            .max_by_key(|(_, m)| m.len())
            .unwrap()
    }

    /// pyarrow's rows under `sub/` of the bucket.
    fn rows(&self, sub: &str) -> Vec<Value> {
        rows(&dump(
            &format!("s3://{}/{sub}", self.bucket),
            &["--s3-endpoint", &endpoint()],
        ))
    }

    /// The file names under `sub/` (boto3's listing).
    fn files(&self, sub: &str) -> BTreeSet<String> {
        let out = py(&format!(
            "r = s3.list_objects_v2(Bucket='{}', Prefix='{sub}/')\nprint(json.dumps([o['Key'][len('{sub}/'):] for o in r.get('Contents', [])]))",
            self.bucket
        ));
        serde_json::from_str::<Vec<String>>(&out)
            .unwrap()
            .into_iter()
            .collect()
    }

    /// Every (source, offset) across the accepted files and rejects under `out/` and
    /// `rejects/`, each once, is exactly the input lines of `shards`.
    fn assert_exactly_once(&self, shards: &BTreeSet<String>) {
        let mut all = keys(&self.rows("out"));
        all.extend(keys(&self.rows("rejects")));
        all.sort();
        let want: Vec<(String, i64)> = self
            .lines
            .iter()
            .filter(|(src, _)| {
                let file = src
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .replace(".jsonl", ".parquet");
                shards.contains(&file)
            })
            .cloned()
            .collect();
        assert_eq!(
            all, want,
            "each input line once across accepted and rejects"
        );
    }

    /// `quarry inspect out/ rejects/ --totals --json`'s totals, which read the accepted files'
    /// footers only: the same as the totals of the files read whole.
    fn totals(&self) -> Value {
        let run = |totals: bool| {
            let (o, r) = (
                format!("s3://{}/out/", self.bucket),
                format!("s3://{}/rejects/", self.bucket),
            );
            let mut args = vec!["inspect", &o, &r, "--json"];
            if totals {
                args.push("--totals");
            }
            let out = self.quarry(&args).output().unwrap();
            serde_json::from_slice::<Value>(&ok(&out)).unwrap()["totals"].clone()
        };
        let footers = run(true);
        assert_eq!(
            footers,
            run(false),
            "totals from footers and from whole files"
        );
        footers
    }
}

/// A finished command's stdout; fails the test with its stderr when it did not succeed.
fn ok(o: &Output) -> Vec<u8> {
    assert!(
        o.status.success(),
        "quarry failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout.clone()
}

/// A `quarry extract --json` summary, once the process ends.
fn summary(child: Child) -> Value {
    serde_json::from_slice(&ok(&child.wait_with_output().unwrap())).unwrap()
}

fn names(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn two_workers_split_a_prefix_and_publish_exactly_what_one_worker_alone_does() {
    let job = Job::new("split", 6);
    let all: BTreeSet<String> = job.names.iter().cloned().collect();
    let (mine0, mine1) = (job.owned(0, 2), job.owned(1, 2));
    assert!(
        !mine0.is_empty() && !mine1.is_empty(),
        "{mine0:?} {mine1:?}"
    );

    // Worker 0 alone first: the job is partial, short by exactly worker 1's shards.
    let s0 = summary(job.extract(&["--shard-index", "0", "--shard-count", "2"]));
    assert_eq!(
        names(&s0["files"]),
        mine0,
        "worker 0 takes the shards its hash gives it"
    );
    assert_eq!(
        (n(&s0, "shards"), n(&s0, "shards_assigned")),
        (6, mine0.len() as u64)
    );
    let t = job.totals();
    assert_eq!(t["complete"], false, "{t}");
    assert_eq!(n(&t, "shards_listed"), 6);
    assert_eq!(n(&t, "shards_published"), mine0.len() as u64);

    // Worker 1 through the variable a Kubernetes Indexed Job sets.
    let s1 = {
        let mut a = vec!["extract", "--pipeline", job.pipeline.to_str().unwrap()];
        a.extend(["--json", "--shard-count", "2"]);
        let c = job
            .quarry(&a)
            .env("JOB_COMPLETION_INDEX", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        summary(c)
    };
    assert_eq!(names(&s1["files"]), mine1);
    assert_eq!(s1["slice"], json!({"index": 1, "count": 2}));
    assert!(mine0.is_disjoint(&mine1));
    let t = job.totals();
    assert_eq!(t["complete"], true, "{t}");
    assert_eq!(n(&t, "shards_published"), 6);
    assert_eq!(t["slices"], json!(["0/2", "1/2"]));
    assert_eq!(
        n(&t, "accepted") + n(&t, "rejected"),
        n(&s0, "consumed") + n(&s1, "consumed")
    );
    job.assert_exactly_once(&all);

    // One worker alone over the same prefix publishes the same file set.
    let bucket = &job.bucket;
    let (o, r) = (
        format!("s3://{bucket}/solo-out/"),
        format!("s3://{bucket}/solo-rejects/"),
    );
    let solo = summary(job.extract(&["--output", &o, "--rejects", &r]));
    assert_eq!(names(&solo["files"]), all);
    let union: BTreeSet<String> = mine0.union(&mine1).cloned().collect();
    assert_eq!(union, all);
    assert_eq!(job.files("rejects"), job.files("solo-rejects"));
    assert_eq!(job.files("out"), job.files("solo-out"));
    assert_eq!(job.files("rejects"), all, "every shard has its marker");
}

#[test]
fn the_same_index_twice_publishes_each_shard_once_and_reports_the_duplicated_work() {
    let job = Job::new("twice", 6);
    let (index, mine) = job.larger_half();
    let i = index.to_string();
    let args = ["--shard-index", i.as_str(), "--shard-count", "2"];
    // Both start together, list the same unpublished shards and work on them at once.
    let (a, b) = (job.extract(&args), job.extract(&args));
    let (a, b) = (summary(a), summary(b));
    let assigned = mine.len() as u64;
    for s in [&a, &b] {
        assert_eq!(n(s, "shards_assigned"), assigned);
        assert_eq!(
            n(s, "shards_done")
                + n(s, "shards_skipped")
                + n(s, "shards_published_meanwhile")
                + n(s, "shards_duplicated"),
            assigned,
            "every shard of the slice is accounted for once per worker: {s}"
        );
        assert_eq!(
            n(s, "accepted") + n(s, "rejected"),
            n(s, "consumed"),
            "a worker counts only what it published"
        );
    }
    // Each shard was published by exactly one of them; the other skipped it or lost the race.
    let done: Vec<String> = [&a, &b].iter().flat_map(|s| names(&s["files"])).collect();
    assert_eq!(done.len() as u64, assigned, "{done:?}");
    assert_eq!(done.iter().cloned().collect::<BTreeSet<_>>(), mine);
    let lost = |s: &Value| n(s, "shards_published_meanwhile") + n(s, "shards_duplicated");
    assert!(
        lost(&a) + lost(&b) > 0,
        "two workers started together on the same slice: the overlap is reported\n{a}\n{b}"
    );
    assert_eq!(
        n(&a, "docs_duplicated") > 0,
        n(&a, "shards_duplicated") > 0,
        "{a}"
    );
    assert_eq!(job.files("rejects"), mine);
    job.assert_exactly_once(&mine);
}

#[test]
fn a_worker_killed_mid_job_resumes_under_the_same_index_without_duplicates() {
    let job = Job::new("kill", 8);
    // One publisher thread, so that the files are published one after another: with the default
    // four, the eight one-document shards finish in the same step and reach the crash point
    // together, and the files the other publishers were finishing while the killing thread was
    // between its count and its SIGKILL could land their markers too (three did on a loaded
    // 2-core machine, 2026-12-02), where this test counts exactly one.
    let toml = std::fs::read_to_string(&job.pipeline).unwrap();
    let one_publisher = toml.replacen("[output]\n", "[output]\npublishers = 1\n", 1);
    assert_ne!(one_publisher, toml, "the job has an [output] table");
    std::fs::write(&job.pipeline, one_publisher).unwrap();
    let (index, mine) = job.larger_half();
    assert!(mine.len() >= 2, "{mine:?}");
    let i = index.to_string();
    let args = ["--shard-index", i.as_str(), "--shard-count", "2"];
    // SIGKILL the second time a file's accepted part is published and its marker is not yet.
    let mut a = vec!["extract", "--pipeline", job.pipeline.to_str().unwrap()];
    a.extend_from_slice(&args);
    let killed = job
        .quarry(&a)
        .env("QUARRY_CRASH_AT", "between_files")
        .env("QUARRY_CRASH_AFTER", "1")
        .output()
        .unwrap();
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let marked = job.files("rejects");
    assert_eq!(
        marked.len(),
        1,
        "one shard finished before the kill: {marked:?}"
    );
    let orphans: BTreeSet<String> = job.files("out").difference(&marked).cloned().collect();
    assert!(orphans.len() <= 1, "{orphans:?}");
    let t = job.totals();
    assert_eq!(t["complete"], false);
    assert_eq!(t["unmarked"].as_array().unwrap().len(), orphans.len());

    let s = summary(job.extract(&args));
    assert_eq!(n(&s, "shards_skipped"), 1);
    assert_eq!(n(&s, "shards_done"), mine.len() as u64 - 1);
    assert_eq!(n(&s, "shards_replayed"), orphans.len() as u64);
    assert_eq!(n(&s, "shards_duplicated"), 0);
    assert_eq!(
        job.files("rejects"),
        mine,
        "only this index's shards, each marked"
    );
    job.assert_exactly_once(&mine);
}

#[test]
fn a_device_list_runs_one_process_per_device_on_disjoint_parts() {
    let job = Job::new("devices", 6);
    let all: BTreeSet<String> = job.names.iter().cloned().collect();
    let s = summary(job.extract(&["--device", "cpu,cpu"]));
    let devices = s["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    let parts: Vec<BTreeSet<String>> = devices
        .iter()
        .map(|d| names(&d["summary"]["files"]))
        .collect();
    for (g, d) in devices.iter().enumerate() {
        assert_eq!(d["device"], "cpu");
        assert_eq!(d["summary"]["slice"], json!({"index": g, "count": 2}));
        assert_eq!(parts[g], job.owned(g, 2));
    }
    assert!(parts[0].is_disjoint(&parts[1]));
    assert_eq!(names(&s["files"]), all);
    assert_eq!(n(&s, "shards_done"), 6);
    assert_eq!(
        n(&s, "consumed"),
        job.lines.len() as u64,
        "the summary adds both processes up"
    );
    job.assert_exactly_once(&all);
}
