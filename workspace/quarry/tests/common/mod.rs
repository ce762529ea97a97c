//! Shared by the `quarry` binary's test files.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test venv's Python (pyarrow, the independent Parquet reader), from `infra/setup-test.sh`.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("QUARRY_TESTVENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/quarry/testvenv")
        });
    venv.join("bin/python")
}

/// What pyarrow reads under `dir` (tests/pipeline/pq_dump.py): `{"files": [...], "rows": [...]}`.
/// Fails the test if any footer is unreadable.
pub fn pq_dump(dir: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(python())
        .arg(root().join("tests/pipeline/pq_dump.py"))
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pq_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
