//! A dataset job end to end on the real model: real package records and bad documents in JSONL
//! shards, the shipped `pipelines/debian-packages.toml`, Parquet read back with pyarrow, a rerun
//! that skips everything, and a replay after a crash between the two halves of a publish.

mod common;

use std::collections::BTreeMap;

use common::*;
use quarry_pipeline::config::{InputFormat, SourceConfig};
use quarry_pipeline::extract::EngineExtractor;
use quarry_pipeline::job::Prepared;
use quarry_pipeline::store::Location;
use quarry_pipeline::PipelineConfig;
use serde_json::{json, Value};

/// Runs the test venv's python with `args`, `stdin` as its input; its stdout. A non-zero exit
/// fails the test with python's stderr.
fn python_with_stdin(args: &[&std::ffi::OsStr], stdin: &[u8]) -> Vec<u8> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(python())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn line(id: &str, text: &str) -> String {
    json!({"id": id, "text": text}).to_string()
}

/// Each line's first byte's offset in `text`: a JSONL document's `_offset`.
fn line_starts(text: &[u8]) -> Vec<i64> {
    let mut at = 0;
    let mut starts: Vec<i64> = text
        .split(|b| *b == b'\n')
        .map(|l| {
            let start = at;
            at += l.len() as i64 + 1;
            start
        })
        .collect();
    if text.ends_with(b"\n") {
        starts.pop();
    }
    starts
}

/// The inputs, each with its documents' offsets.
fn write_inputs(dir: &std::path::Path) -> BTreeMap<String, Vec<i64>> {
    let docs = packages(5);
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let a = [line("a0", &docs[0]), line("a1", &docs[1])].join("\n") + "\n";
    let b = [line("b0", &docs[2]), line("b1", &docs[3])].join("\n") + "\n";
    std::fs::write(input.join("a.jsonl"), &a).unwrap();
    std::fs::write(input.join("b.jsonl"), &b).unwrap();
    let mut bad: Vec<u8> = Vec::new();
    bad.extend_from_slice(b"{\"id\": \"u\", \"text\": \"caf\xc3\x28\"}\n"); // 0 invalid UTF-8
    bad.extend_from_slice(line("e", "   ").as_bytes()); // 1 empty
    bad.push(b'\n');
    bad.extend_from_slice(b"Package: not json at all\n"); // 2 not JSON
    bad.extend_from_slice(b"{\"id\": \"m\", \"body\": \"no text field\"}\n"); // 3 missing field
    bad.extend_from_slice(line("big", &"x".repeat(10 << 20)).as_bytes()); // 4 10 MB
    bad.push(b'\n');
    // 5: far longer than the model's 8,192-token context, under max_doc_bytes.
    let long = docs[4].repeat(400_000 / docs[4].len() + 1);
    bad.extend_from_slice(line("long", &long[..400_000]).as_bytes());
    bad.push(b'\n');
    bad.extend_from_slice(line("ok", &docs[4]).as_bytes()); // 6 a good one after the bad ones
    bad.push(b'\n');
    std::fs::write(input.join("bad.jsonl"), &bad).unwrap();
    // Hidden and non-JSONL files are not inputs.
    std::fs::write(input.join("_SUCCESS"), b"").unwrap();
    std::fs::write(input.join("notes.txt"), b"not an input").unwrap();
    let expected = BTreeMap::from([
        ("a.jsonl".into(), line_starts(a.as_bytes())),
        ("b.jsonl".into(), line_starts(b.as_bytes())),
        ("bad.jsonl".into(), line_starts(&bad)),
    ]);
    assert_eq!(expected.values().map(Vec::len).sum::<usize>(), 11);
    expected
}

struct Run {
    job: Prepared,
    input: Location,
    out: String,
    rej: String,
}

impl Run {
    fn new(dir: &std::path::Path) -> Self {
        Self::with(dir, |_| {})
    }

    /// The job with `edit` applied to its configuration.
    fn with(dir: &std::path::Path, edit: impl FnOnce(&mut PipelineConfig)) -> Self {
        let mut cfg = PipelineConfig::load(&root().join("pipelines/debian-packages.toml")).unwrap();
        // The job's mechanics, not the extraction's quality, are under test: the small model keeps
        // it quick (the shipped default is Qwen2.5, three times slower per document).
        cfg.model.path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        cfg.sampling.max_tokens = 192;
        cfg.batching.max_running = 8;
        cfg.output.row_group_rows = 1;
        edit(&mut cfg);
        Run {
            job: Prepared::new(cfg).unwrap(),
            input: Location::open_input(dir.join("in").to_str().unwrap()).unwrap(),
            out: dir.join("out").display().to_string(),
            rej: dir.join("rej").display().to_string(),
        }
    }

    fn go(&self) -> quarry_pipeline::dataset::JobSummary {
        let publisher = self
            .job
            .publisher(Some(&self.out), Some(&self.rej))
            .unwrap();
        let extractor = EngineExtractor::load(&self.job.cfg, &self.job.schema).unwrap();
        self.job
            .run_dataset_plain(extractor, &self.input, &publisher)
            .unwrap()
    }
}

/// Every input line appears once across accepted and rejects, and nowhere twice.
fn assert_exactly_once(
    run: &Run,
    expected: &BTreeMap<String, Vec<i64>>,
) -> (Vec<Value>, Vec<Value>) {
    let acc = rows(&dump(&run.out, &[]));
    let rej = rows(&dump(&run.rej, &[]));
    let mut all = keys(&acc);
    all.extend(keys(&rej));
    all.sort();
    let mut want = Vec::new();
    for (file, offsets) in expected {
        let src = format!("{}/{file}", run.input.url.trim_end_matches('/'));
        want.extend(offsets.iter().map(|&o| (src.clone(), o)));
    }
    want.sort();
    assert_eq!(
        all, want,
        "each input line once across accepted and rejects"
    );
    (acc, rej)
}

#[test]
fn dataset_job_end_to_end() {
    let dir = temp_dir("dataset-e2e");
    let expected = write_inputs(&dir);
    let run = Run::new(&dir);

    let s = run.go();
    assert_eq!((s.shards, s.shards_skipped, s.shards_done), (3, 0, 3));
    assert_eq!(s.consumed, 11);
    assert_eq!(s.accepted + s.rejected, s.consumed);
    let (acc, rej) = assert_exactly_once(&run, &expected);

    // Bad documents are rejects with their cause, and the good one after them is not lost.
    let cause_at = |line: usize| {
        let o = expected["bad.jsonl"][line];
        rej.iter()
            .find(|r| r["_source"].as_str().unwrap().ends_with("bad.jsonl") && r["_offset"] == o)
            .map(|r| r["cause"].as_str().unwrap().to_string())
    };
    assert_eq!(cause_at(0).as_deref(), Some("invalid_utf8"));
    assert_eq!(cause_at(1).as_deref(), Some("empty"));
    assert_eq!(cause_at(2).as_deref(), Some("not_json"));
    assert_eq!(cause_at(3).as_deref(), Some("missing_field"));
    assert_eq!(cause_at(4).as_deref(), Some("too_large"));
    assert_eq!(cause_at(5).as_deref(), Some("engine_error"));
    let long = rej.iter().find(|r| r["_doc_id"] == "long").unwrap();
    assert!(
        long["detail"].as_str().unwrap().contains("context"),
        "{long}"
    );

    // Accepted rows hold valid records: validate them again, independently of the pipeline.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schemas/debian-package.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for r in &acc {
        let mut rec = serde_json::Map::new();
        for (k, v) in r.as_object().unwrap() {
            let optional_null = v.is_null() && !["homepage"].contains(&k.as_str());
            if !k.starts_with('_') && !optional_null {
                rec.insert(k.clone(), v.clone());
            }
        }
        let rec = Value::Object(rec);
        assert!(
            validator.is_valid(&rec),
            "accepted row breaks the schema: {rec}"
        );
        assert_eq!(r["_model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(r["_schema_sha256"].as_str().unwrap().len(), 64);
    }
    for r in acc.iter().chain(&rej) {
        assert!(
            r["_extracted_at"].as_str().unwrap().starts_with("20"),
            "{r}"
        );
    }

    // Files: the derived Arrow schema, zstd, metadata, one row group per row here.
    let files = dump(&run.out, &[])["files"].as_array().unwrap().clone();
    assert!(!files.is_empty());
    for f in &files {
        let schema: Vec<(String, String, bool)> =
            serde_json::from_value(f["schema"].clone()).unwrap();
        let col = |n: &str| schema.iter().find(|c| c.0 == n).unwrap().clone();
        assert_eq!(col("name"), ("name".into(), "string".into(), false));
        assert_eq!(col("depends").1, "list<item: string>");
        assert_eq!(col("essential"), ("essential".into(), "bool".into(), true));
        assert_eq!(col("installed_size_kib").1, "int64");
        assert_eq!(col("_offset"), ("_offset".into(), "int64".into(), false));
        assert_eq!(col("_extracted_at").1, "timestamp[us, tz=UTC]");
        assert_eq!(f["compression"], "ZSTD");
        assert_eq!(f["metadata"]["quarry.pipeline"], "debian-packages");
        assert_eq!(f["metadata"]["quarry.version"], env!("CARGO_PKG_VERSION"));
        assert!(f["metadata"]["quarry.offset_first"].is_string());
        // The model runtime options in force, as JSON (this job sets none: the defaults).
        let runtime = f["metadata"]["quarry.model_runtime"].as_str().unwrap();
        let runtime: quarry_model::ModelOptions = serde_json::from_str(runtime).unwrap();
        assert_eq!(runtime, quarry_model::ModelOptions::default());
        assert_eq!(f["row_groups"], f["rows"]);
    }

    // A rerun finds every shard's marker and does nothing.
    let again = run.go();
    assert_eq!(
        (again.shards_skipped, again.shards_done, again.consumed),
        (3, 0, 0)
    );

    // A crash between the accepted file and the marker: remove a marker with accepted rows, and
    // the rerun replays that shard alone; still exactly once.
    let a_accepted = acc
        .iter()
        .any(|r| r["_source"].as_str().unwrap().ends_with("/a.jsonl"));
    let shard = if a_accepted { "a.parquet" } else { "b.parquet" };
    std::fs::remove_file(dir.join("rej").join(shard)).unwrap();
    let replay = run.go();
    assert_eq!((replay.shards_skipped, replay.shards_done), (2, 1));
    assert_exactly_once(&run, &expected);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parquet inputs as pyarrow writes them, in every codec it has (Snappy is the default of
/// pyarrow, pandas and Spark), several row groups each: every row is read once, with its row
/// number in the file as its offset, and a null text field is a reject, not a lost row.
#[test]
fn parquet_inputs_in_every_codec() {
    const CODECS: [&str; 6] = ["none", "snappy", "gzip", "brotli", "lz4", "zstd"];
    let dir = temp_dir("dataset-parquet-codecs");
    let docs = packages(CODECS.len());
    let input = dir.join("in");
    let mut expected = BTreeMap::new();
    // One file per codec: a package record, a row with no text, and another record, in row
    // groups of one row.
    for (k, codec) in CODECS.iter().enumerate() {
        let rows = json!([
            {"id": format!("{codec}-0"), "text": docs[k]},
            {"id": format!("{codec}-1"), "text": null},
            {"id": format!("{codec}-2"), "text": docs[(k + 1) % docs.len()]},
        ]);
        let script = root().join("tests/pipeline/pq_write.py");
        let out = python_with_stdin(
            &[
                script.as_os_str(),
                input.as_os_str(),
                "1".as_ref(),
                codec.as_ref(),
            ],
            rows.to_string().as_bytes(),
        );
        let report: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(report[codec]["row_groups"], 3, "{report}");
        expected.insert(format!("{codec}.parquet"), vec![0, 1, 2]);
    }
    let run = Run::with(&dir, |cfg| {
        cfg.sampling.max_tokens = 96;
        match &mut cfg.source {
            SourceConfig::Dataset(src) => src.format = InputFormat::Parquet,
            _ => unreachable!("the package job reads a dataset"),
        }
    });

    let s = run.go();
    assert_eq!((s.shards, s.shards_done), (CODECS.len(), CODECS.len()));
    assert_eq!(s.consumed, 3 * CODECS.len() as u64);
    let (acc, rej) = assert_exactly_once(&run, &expected);
    for codec in CODECS {
        let src = format!("/{codec}.parquet");
        let at = |o: i64| {
            acc.iter()
                .chain(&rej)
                .find(|r| r["_source"].as_str().unwrap().ends_with(&src) && r["_offset"] == o)
                .unwrap_or_else(|| panic!("{codec} row {o}"))
        };
        // Each row's own id, so the rows were read in order and whole.
        for o in 0..3 {
            assert_eq!(at(o)["_doc_id"], format!("{codec}-{o}"), "{codec} row {o}");
        }
        assert_eq!(at(1)["cause"], "missing_field", "{codec}: {}", at(1));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Parquet file pyarrow writes, larger than `source.split_bytes`, is cut into parts that
/// workers take apart: together they hold each row once, with its row number in the whole file.
#[test]
fn a_parquet_file_over_split_bytes_is_published_in_parts() {
    let dir = temp_dir("dataset-parquet-parts");
    let docs = packages(2);
    let input = dir.join("in");
    // Six rows in row groups of one: two package records and four rows with no text (rejects
    // that cost no model time).
    let rows: Vec<Value> = (0..6)
        .map(|k| {
            let text = if k % 3 == 0 {
                json!(docs[k / 3])
            } else {
                Value::Null
            };
            json!({"id": format!("r{k}"), "text": text})
        })
        .collect();
    let script = root().join("tests/pipeline/pq_write.py");
    let out = python_with_stdin(
        &[
            script.as_os_str(),
            input.as_os_str(),
            "1".as_ref(),
            "snappy".as_ref(),
        ],
        Value::Array(rows).to_string().as_bytes(),
    );
    let report: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["snappy"]["row_groups"], 6, "{report}");
    let size = std::fs::metadata(input.join("snappy.parquet"))
        .unwrap()
        .len();
    let run = Run::with(&dir, |cfg| {
        cfg.sampling.max_tokens = 96;
        match &mut cfg.source {
            SourceConfig::Dataset(src) => {
                src.format = InputFormat::Parquet;
                src.split_bytes = size.div_ceil(3);
            }
            _ => unreachable!("the package job reads a dataset"),
        }
    });
    let s = run.go();
    assert_eq!((s.shards, s.shards_done, s.consumed), (3, 3, 6), "{s:?}");
    let expected = BTreeMap::from([("snappy.parquet".to_string(), (0..6).collect())]);
    let (acc, rej) = assert_exactly_once(&run, &expected);
    for r in acc.iter().chain(&rej) {
        assert_eq!(r["_doc_id"], format!("r{}", r["_offset"]), "{r}");
    }
    // Each part is a shard of its own, published with its marker.
    for k in 0..3 {
        let name = format!("snappy.part-{k:05}-of-00003.parquet");
        assert!(dir.join("rej").join(&name).is_file(), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// JSONL compressed as gzip (Python's zlib) and zstd (pyarrow's libzstd) reads as the plain file
/// does: every line once, with its byte offset in the decompressed file, bad lines as rejects.
#[test]
fn compressed_jsonl_inputs() {
    let dir = temp_dir("dataset-compressed");
    let docs = packages(2);
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let mut expected = BTreeMap::new();
    for (k, (codec, name)) in [("gzip", "g.jsonl.gz"), ("zstd", "z.ndjson.zst")]
        .into_iter()
        .enumerate()
    {
        let text = [
            line(&format!("{codec}-0"), &docs[k]),
            "not json".to_string(),
        ]
        .join("\n")
            + "\n";
        let script = root().join("tests/pipeline/jsonl_write.py");
        let path = input.join(name);
        python_with_stdin(
            &[script.as_os_str(), path.as_os_str(), codec.as_ref()],
            text.as_bytes(),
        );
        expected.insert(name.to_string(), line_starts(text.as_bytes()));
    }
    let run = Run::with(&dir, |cfg| cfg.sampling.max_tokens = 96);
    let s = run.go();
    assert_eq!((s.shards, s.shards_done, s.consumed), (2, 2, 4), "{s:?}");
    let (acc, rej) = assert_exactly_once(&run, &expected);
    for (codec, name) in [("gzip", "g.jsonl.gz"), ("zstd", "z.ndjson.zst")] {
        let at = |line: usize| {
            // The offset in the decompressed file.
            let o = expected[name][line];
            acc.iter()
                .chain(&rej)
                .find(|r| r["_source"].as_str().unwrap().ends_with(name) && r["_offset"] == o)
                .unwrap_or_else(|| panic!("{name} line {o}"))
        };
        assert_eq!(at(0)["_doc_id"], format!("{codec}-0"));
        assert_eq!(at(1)["cause"], "not_json", "{}", at(1));
    }
    // Each shard is named after its input without the codec: g.parquet, z.parquet.
    assert!(dir.join("rej/g.parquet").is_file() && dir.join("rej/z.parquet").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}
