//! House rules checked like code: configuration is data (job files, flags, typed options), so
//! the libraries read no environment variable. Only the binaries do: the `quarry` crate (the model
//! runtime's `QUARRY_*` options through `ModelOptions::apply_vars`, Kafka credentials, the crash
//! tests' fault injection) and the benchmark binaries under `src/bin/`. Tests may.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, leaving out `bin/` folders (binaries).
fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                library_sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` that read the environment, outside comments.
fn env_reads(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            ["env::var(", "env::vars(", "env::var_os("]
                .iter()
                .any(|p| l.contains(p))
        })
        .map(|(i, l)| (i + 1, l.trim().to_owned()))
        .collect()
}

#[test]
fn the_libraries_read_no_environment_variable() {
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(root().join("workspace")).unwrap() {
        let dir = entry.unwrap().path();
        // The `quarry` crate is the binary: the one place the environment is read.
        if dir.file_name().is_some_and(|n| n == "quarry") || !dir.join("src").is_dir() {
            continue;
        }
        library_sources(&dir.join("src"), &mut sources);
    }
    assert!(
        sources.len() > 50,
        "found only {} library files",
        sources.len()
    );
    let mut found = Vec::new();
    for path in &sources {
        let text = std::fs::read_to_string(path).unwrap();
        for (line, code) in env_reads(&text) {
            found.push(format!("{}:{line}: {code}", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "libraries read the environment (pass it in from the binary as typed options):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_an_environment_read_where_there_is_one() {
    // The binary reads the model runtime's variables: the check above would see them there.
    let main = std::fs::read_to_string(root().join("workspace/quarry/src/main.rs")).unwrap();
    assert!(!env_reads(&main).is_empty());
    assert!(env_reads("    // std::env::var(\"X\") in a comment").is_empty());
    assert_eq!(
        env_reads("let a = 1;\nlet v = std::env::var_os(\"X\");").len(),
        1
    );
}
