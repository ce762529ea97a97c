//! The official JSON-Schema-Test-Suite (draft 2020-12 and draft 7, required tests), run as a
//! ratchet. For every case the instance is written in quarry's canonical form for its schema and fed
//! to the compiled constraint; "accepted" must equal the suite's `valid`.
//!
//! - A schema quarry refuses (a typed error) makes its cases "unsupported".
//! - Accepting an instance the suite calls invalid is a soundness bug: that count must be 0.
//! - `json_schema_suite.baseline.json` holds the pass counts; they may only go up.
//! - The layout must not change what is accepted: the suite runs again with
//!   [`Whitespace::Spaced`] (instances written with `", "` and `": "`), and its counts must equal
//!   the compact run's.
//!
//! `QUARRY_SUITE_VERBOSE=1` also lists the valid instances that were rejected (completeness gaps),
//! every reason for refusing a schema (not only the 12 most frequent), and each refused group.
//!
//! References to other documents (`http://localhost:1234/…`, which the suite serves from its
//! `remotes/` folder) are given to [`quarry_grammar::schema::bundle`], as a user gives theirs to
//! `--schema-resource`.
//!
//! The suite is in `tests/fixtures/json-schema-test-suite` (with its license), fetched by
//! `tests/fixtures/fetch_json_schema_test_suite.py`.

#[path = "common/vocab.rs"]
mod vocab;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use quarry_grammar::schema::{bundle, canonicalize};
use quarry_grammar::{Constraint, Grammar, Limits, Matcher, SchemaOptions, Vocabulary, Whitespace};
use serde_json::{json, Value};

#[derive(Default, Debug, PartialEq, Eq)]
struct Counts {
    passed: usize,
    unsupported: usize,
    rejected_valid: usize,
    accepted_invalid: usize,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why groups were refused: the error message with the JSON Pointer taken out, and how many cases.
type Reasons = BTreeMap<String, usize>;

fn verbose() -> bool {
    std::env::var_os("QUARRY_SUITE_VERBOSE").is_some()
}

/// The suite's `remotes/` documents, under the URIs its tests refer to them by.
fn remotes() -> Vec<(String, Value)> {
    fn add(dir: &std::path::Path, prefix: &str, out: &mut Vec<(String, Value)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                add(&path, &format!("{prefix}{name}/"), out);
            } else {
                let doc = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                out.push((format!("{prefix}{name}"), doc));
            }
        }
    }
    let mut out = Vec::new();
    let dir = root().join("tests/fixtures/json-schema-test-suite/remotes");
    add(&dir, "http://localhost:1234/", &mut out);
    assert!(
        out.len() > 20,
        "{}: too few remote documents",
        dir.display()
    );
    out
}

fn run(
    draft: &str,
    schema_uri: &str,
    vocab: &Arc<Vocabulary>,
    remotes: &[(String, Value)],
    whitespace: Whitespace,
) -> (Counts, Vec<String>, Reasons) {
    let dir = root()
        .join("tests/fixtures/json-schema-test-suite/tests")
        .join(draft);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut counts = Counts::default();
    let mut unsound = Vec::new();
    let mut reasons = Reasons::new();
    let limits = Limits {
        compile_time: std::time::Duration::from_secs(2),
        ..Limits::default()
    };
    for file in files {
        let groups: Vec<Value> = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        for group in groups {
            let mut schema = group["schema"].clone();
            if let Value::Object(m) = &mut schema {
                m.entry("$schema").or_insert(json!(schema_uri));
            }
            let schema = match bundle(&schema, None, remotes) {
                Ok(s) => s,
                Err(e) => {
                    *reasons.entry(e.to_string()).or_default() +=
                        group["tests"].as_array().unwrap().len();
                    counts.unsupported += group["tests"].as_array().unwrap().len();
                    continue;
                }
            };
            let constraint = Constraint::JsonSchema {
                schema: schema.clone(),
                options: SchemaOptions {
                    whitespace,
                    ..SchemaOptions::default()
                },
            };
            let grammar = match Grammar::compile(&constraint, vocab.clone(), limits) {
                Ok(g) => Some(Arc::new(g)),
                Err(e) => {
                    let msg = e.to_string();
                    let key = match (msg.find(" at "), msg.find(": ")) {
                        (Some(a), Some(b)) if a < b => format!("{}{}", &msg[..a], &msg[b..]),
                        _ => msg,
                    };
                    if verbose() {
                        println!(
                            "  refused: {}: {}: {key}",
                            file.file_name().unwrap().to_string_lossy(),
                            group["description"]
                        );
                    }
                    *reasons.entry(key).or_default() += group["tests"].as_array().unwrap().len();
                    None
                }
            };
            for case in group["tests"].as_array().unwrap() {
                let valid = case["valid"].as_bool().unwrap();
                let Some(g) = &grammar else {
                    counts.unsupported += 1;
                    continue;
                };
                let text = canonicalize(&case["data"], &schema, whitespace);
                let mut m = Matcher::new(g.clone());
                let accepted = m.accept_bytes(text.as_bytes()).is_ok() && m.is_accepting();
                match (accepted, valid) {
                    (a, v) if a == v => counts.passed += 1,
                    (true, false) => {
                        counts.accepted_invalid += 1;
                        unsound.push(format!(
                            "{}: {} / {}: accepted invalid {text}",
                            file.file_name().unwrap().to_string_lossy(),
                            group["description"],
                            case["description"]
                        ));
                    }
                    _ => {
                        counts.rejected_valid += 1;
                        if verbose() {
                            println!(
                                "  valid rejected: {}: {} / {}: {text}",
                                file.file_name().unwrap().to_string_lossy(),
                                group["description"],
                                case["description"]
                            );
                        }
                    }
                }
            }
        }
    }
    (counts, unsound, reasons)
}

#[test]
fn official_suite_ratchet() {
    let vocab = vocab::byte_vocab();
    let remotes = remotes();
    let baseline: BTreeMap<String, usize> = serde_json::from_slice(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/json_schema_suite.baseline.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut failures = Vec::new();
    for (draft, uri) in [
        (
            "draft2020-12",
            "https://json-schema.org/draft/2020-12/schema",
        ),
        ("draft7", "http://json-schema.org/draft-07/schema#"),
    ] {
        let (c, unsound, reasons) = run(draft, uri, &vocab, &remotes, Whitespace::Compact);
        let total = c.passed + c.unsupported + c.rejected_valid + c.accepted_invalid;
        println!(
            "{draft}: {} of {total} passed, {} unsupported, {} valid rejected, {} invalid accepted",
            c.passed, c.unsupported, c.rejected_valid, c.accepted_invalid
        );
        let mut reasons: Vec<_> = reasons.into_iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        let shown = if verbose() { usize::MAX } else { 12 };
        for (why, n) in reasons.iter().take(shown) {
            println!("  {n:>4} cases unsupported: {why}");
        }
        failures.extend(unsound);
        let floor = baseline.get(draft).copied().unwrap_or(0);
        if c.passed < floor {
            failures.push(format!(
                "{draft}: {} passed, below the baseline {floor}",
                c.passed
            ));
        } else if c.passed > floor {
            println!(
                "{draft}: above the baseline {floor}; raise it in json_schema_suite.baseline.json"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same suite with `", "` and `": "` separators: what is accepted must not depend on the
/// layout, so every count equals the compact run's (and nothing invalid is accepted).
#[test]
fn official_suite_spaced_equals_compact() {
    let vocab = vocab::byte_vocab();
    let remotes = remotes();
    for (draft, uri) in [
        (
            "draft2020-12",
            "https://json-schema.org/draft/2020-12/schema",
        ),
        ("draft7", "http://json-schema.org/draft-07/schema#"),
    ] {
        let (compact, _, _) = run(draft, uri, &vocab, &remotes, Whitespace::Compact);
        let (spaced, unsound, _) = run(draft, uri, &vocab, &remotes, Whitespace::Spaced);
        assert!(unsound.is_empty(), "{draft}: {}", unsound.join("\n"));
        assert_eq!(spaced, compact, "{draft}: spaced layout against compact");
    }
}
