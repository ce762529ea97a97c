//! Real schemas (tests/fixtures/schema-corpus: CloudFormation resource schemas from cfn-lint and
//! SchemaStore schemas from check-jsonschema). Every schema compiles or fails with a typed error
//! (never a panic, never past the compile-time limit); the number that compiles may only go up
//! (`schema_corpus.baseline.json`); and random complete outputs of each compiled schema validate
//! with the `jsonschema` crate.
//!
//! Compile *times* are measured by `make bench-schemas`, not here.

#[path = "common/walk.rs"]
mod walk;

#[path = "common/vocab.rs"]
mod vocab;

use std::path::PathBuf;
use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, GrammarError, Limits, SchemaOptions};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde_json::Value;

#[test]
fn real_schemas_compile_or_refuse_with_a_typed_error() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/schema-corpus");
    let mut files: Vec<PathBuf> = ["cfn", "schemastore"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() > 100, "corpus missing: {}", root.display());
    let vocab = vocab::byte_vocab();
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut rng = SmallRng::seed_from_u64(7);
    let (mut compiled, mut walks) = (0usize, 0usize);
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let schema: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let constraint = Constraint::JsonSchema {
            schema: schema.clone(),
            // Vendor keywords (markdownDescription, AWS handlers…) are annotations here.
            options: SchemaOptions {
                ignore_unknown_keywords: true,
                ..SchemaOptions::default()
            },
        };
        let started = std::time::Instant::now();
        // Coverage, not speed (`make bench-schemas` times compiles): a loaded machine must not
        // turn a slow debug-build compile into a refusal past the default 5 s.
        let limits = Limits {
            compile_time: std::time::Duration::from_secs(120),
            ..Limits::default()
        };
        let compiled_now = Grammar::compile(&constraint, vocab.clone(), limits);
        if std::env::var_os("QUARRY_CORPUS_VERBOSE").is_some() {
            println!("{name}: {:?}", started.elapsed());
        }
        let grammar = match compiled_now {
            Ok(g) => Arc::new(g),
            Err(GrammarError::Schema(e)) => {
                println!("{name}: {e}");
                continue;
            }
            Err(e @ GrammarError::LimitExceeded { .. }) => {
                println!("{name}: {e}");
                continue;
            }
            Err(e) => panic!("{name}: untyped failure {e}"),
        };
        compiled += 1;
        // A `$schema` that names no JSON Schema draft (CloudFormation's provider schema) is read
        // as 2020-12 by quarry; the validator is told the same.
        let mut checked = schema.clone();
        if checked
            .get("$schema")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.contains("json-schema.org"))
        {
            checked.as_object_mut().unwrap().remove("$schema");
        }
        let validator = jsonschema::validator_for(&checked).unwrap();
        for _ in 0..3 {
            if let Some(text) = walk::walk(&grammar, &vocab, &mut rng, &mut mask, 3000) {
                let instance: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name}: output {text:?} is not JSON: {e}"));
                assert!(
                    validator.is_valid(&instance),
                    "{name}: output {text} is invalid"
                );
                walks += 1;
            }
        }
    }
    println!(
        "{compiled} of {} schemas compiled; {walks} complete outputs validated",
        files.len()
    );
    let baseline: Value = serde_json::from_slice(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schema_corpus.baseline.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let floor = baseline["compiled"].as_u64().unwrap() as usize;
    assert!(
        compiled >= floor,
        "{compiled} compiled, below the baseline {floor}"
    );
    if compiled > floor {
        println!("above the baseline {floor}; raise it in schema_corpus.baseline.json");
    }
}
