//! Shared helpers of the pipeline's end-to-end tests: paths, real documents, and the independent
//! Parquet reader (pyarrow, from the venv `make test` installs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The test venv's python (pyarrow, moto); `make test` creates it.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("QUARRY_TESTVENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/quarry/testvenv")
        });
    let py = venv.join("bin/python");
    assert!(
        py.is_file(),
        "{} is missing: run `make test` (it installs pyarrow and moto into the test venv)",
        py.display()
    );
    py
}

/// Runs the test venv's python with `args` and returns its stdout; a non-zero exit fails the
/// test with `what` and python's stderr.
pub fn run_python<S: AsRef<std::ffi::OsStr>>(what: &str, args: &[S]) -> Vec<u8> {
    let out = Command::new(python())
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Reads every Parquet file under `dir` with pyarrow (see tests/pipeline/pq_dump.py).
pub fn dump(dir: &str, extra: &[&str]) -> Value {
    let script = root().join("tests/pipeline/pq_dump.py");
    let mut args = vec![script.to_str().expect("a UTF-8 path"), dir];
    args.extend_from_slice(extra);
    serde_json::from_slice(&run_python("pq_dump", &args)).expect("pq_dump prints JSON")
}

/// Real package records from this machine's dpkg database, `n` of them, spread over it.
pub fn packages(n: usize) -> Vec<String> {
    let text = std::fs::read_to_string("/var/lib/dpkg/status").expect("/var/lib/dpkg/status");
    let mut recs: Vec<String> = text
        .split("\n\n")
        .filter(|r| r.contains("\nDescription: ") && r.starts_with("Package: "))
        .map(|r| {
            // The fields and the first description line keep prompts short.
            let mut out = String::new();
            for line in r.lines() {
                if line.starts_with(' ') {
                    continue;
                }
                out.push_str(line);
                out.push('\n');
            }
            out
        })
        .collect();
    recs.sort();
    assert!(recs.len() >= n, "only {} package records", recs.len());
    let step = recs.len() / n;
    (0..n).map(|i| recs[i * step].clone()).collect()
}

/// The (source, offset) pairs of rows, sorted.
pub fn keys(rows: &[Value]) -> Vec<(String, i64)> {
    let mut k: Vec<(String, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["_source"].as_str().unwrap().to_string(),
                r["_offset"].as_i64().unwrap(),
            )
        })
        .collect();
    k.sort();
    k
}

pub fn rows(v: &Value) -> Vec<Value> {
    v["rows"].as_array().unwrap().clone()
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("quarry-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A job definition over `s3://BUCKET/in/` (JSONL, `text` and `id`) that extracts a package's name
/// and version with the small model into `out/` and `rejects/` of the same bucket. Paths are
/// absolute, so the file works from any folder.
pub fn package_id_job(name: &str, bucket: &str) -> String {
    let root = root();
    let root = root.display();
    format!(
        r#"name = "{name}"
schema = "{root}/schemas/package-id.json"
[source]
kind = "dataset"
input = "s3://{bucket}/in/"
format = "jsonl"
fields = {{ text = "text", id = "id" }}
[prompt]
system = "Extract the package's name and version from this Debian package record as JSON."
template = "{{{{ text }}}}"
[model]
path = "{root}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[sampling]
max_tokens = 48
[output]
url = "s3://{bucket}/out/"
[rejects]
url = "s3://{bucket}/rejects/"
"#
    )
}
