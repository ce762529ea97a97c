//! `validity-bench`: records drawn at random under each engine's own masks, for every schema of
//! the real-schema corpus the engine compiles, checked by an independent validator (the
//! `jsonschema` crate, which the pipeline runs on every record): how many records each engine
//! lets through that the schema refuses. quarry, llguidance and (with `--xgrammar-python`, in its
//! own process) xgrammar, on the same vocabulary.
//!
//! The draw ([`quarry_bench::draw`]) ends a record as soon as its mask allows the end token and
//! otherwise takes the smallest allowed token 5 times in 16 and a random allowed one the rest, so
//! strings run long and bounds are reached; half the records also take `"`, `]` or `}` where
//! allowed 3 times in 16, so that they end: where an engine reads a keyword loosely (xgrammar
//! warns that it ignores `minLength`/`maxLength` beside a `pattern`), random records find it.
//! Records still open at `--max-tokens` are counted apart, not checked. Prints a table per
//! engine and the schemas with refused records, and writes JSON (see `BENCHMARKS.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use quarry_bench::peers::{single_eos, Llguidance, Peer, Quarry, Spec};
use quarry_bench::xgrammar::XgrammarArgs;
use quarry_bench::{closing_tokens, draw, schema_files, Drawn, End, ModelVocab};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Records drawn under each engine's masks, checked by the jsonschema crate")]
struct Args {
    /// Directory of schemas (searched at any depth).
    #[arg(long, default_value = "tests/fixtures/schema-corpus")]
    corpus: PathBuf,
    /// The GGUF file whose vocabulary every engine uses.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Records drawn per engine and schema.
    #[arg(long, default_value_t = 8)]
    records: usize,
    /// Tokens a record may take at most.
    #[arg(long, default_value_t = 400)]
    max_tokens: usize,
    /// The draw's seed (each schema starts from it).
    #[arg(long, default_value_t = 0x9E37_79B9_7F4A_7C15)]
    seed: u64,
    /// Only schemas whose path contains this.
    #[arg(long)]
    only: Option<String>,
    #[arg(long, default_value = "target/bench/validity.json")]
    out: PathBuf,
    #[command(flatten)]
    xgrammar: XgrammarArgs,
}

/// One engine's count over the corpus.
#[derive(Default, Debug)]
struct Tally {
    schemas: usize,
    refused_schemas: usize,
    records: usize,
    complete: usize,
    valid: usize,
    not_json: usize,
    invalid: usize,
    open: usize,
    dead_ends: usize,
    engine_refused: usize,
}

impl Tally {
    fn to_json(&self) -> Value {
        json!({
            "schemas_compiled": self.schemas,
            "schemas_with_an_invalid_record": self.refused_schemas,
            "records": self.records,
            "complete": self.complete,
            "valid": self.valid,
            "invalid_json": self.not_json,
            "invalid_by_schema": self.invalid,
            "open_at_max_tokens": self.open,
            "dead_ends": self.dead_ends,
            "refused_own_mask": self.engine_refused,
        })
    }
}

/// Checks `drawn` against `validator`, counting it in `tally`; the validator's first error for
/// an invalid complete record.
fn check(drawn: &Drawn, validator: &jsonschema::Validator, tally: &mut Tally) -> Option<String> {
    tally.records += 1;
    match drawn.end {
        End::MaxTokens => tally.open += 1,
        End::DeadEnd => tally.dead_ends += 1,
        End::Refused => tally.engine_refused += 1,
        End::Stop => {
            tally.complete += 1;
            match serde_json::from_slice::<Value>(&drawn.bytes) {
                Err(e) => {
                    tally.not_json += 1;
                    return Some(format!("not JSON: {e}"));
                }
                Ok(v) => match validator.iter_errors(&v).next() {
                    None => tally.valid += 1,
                    Some(e) => {
                        tally.invalid += 1;
                        return Some(format!("{e} at {}", e.instance_path()));
                    }
                },
            }
        }
    }
    None
}

fn main() -> Result<()> {
    let args = Args::parse();
    let files = schema_files(&args.corpus)?;
    let mv = ModelVocab::load(&args.model)?;
    let vocab = mv.vocab.clone();
    let eos = single_eos(&vocab)?;
    let closing = closing_tokens(&vocab);
    let quarry = Quarry {
        vocab: vocab.clone(),
        eager: false,
    };
    let llg = Llguidance::new(&vocab)?;
    let xgr = args.xgrammar.start(&vocab)?;
    let peers: [&dyn Peer; 2] = [&quarry, &llg];
    let mut engines: Vec<&str> = peers.iter().map(|p| p.name()).collect();
    if xgr.is_some() {
        engines.push("xgrammar");
    }
    let mut tallies: BTreeMap<&str, Tally> =
        engines.iter().map(|e| (*e, Tally::default())).collect();
    let mut rows = Vec::new();
    println!(
        "{}: {} tokens, {} records a schema and engine",
        args.model.display(),
        vocab.len(),
        args.records
    );
    for file in &files {
        let name = file
            .strip_prefix(&args.corpus)
            .unwrap_or(file)
            .display()
            .to_string();
        if args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let schema: Value = serde_json::from_slice(&std::fs::read(file)?)?;
        let Ok(validator) = jsonschema::validator_for(&schema) else {
            rows.push(
                json!({"schema": name, "skipped": "the jsonschema crate cannot build a validator"}),
            );
            continue;
        };
        let spec = Spec::Schema(schema.clone());
        let mut row = json!({"schema": name});
        for engine in &engines {
            // Half the records draw without closing tokens (strings run to their bounds), half
            // with them (records end).
            let half = args.records.div_ceil(2);
            let passes = [
                (half, &[][..], args.seed),
                (args.records - half, &closing[..], !args.seed),
            ];
            let mut drawn: Result<(Vec<Drawn>, Vec<String>)> = Ok((Vec::new(), Vec::new()));
            for (count, closing, seed) in passes {
                let pass = match *engine {
                    "xgrammar" => xgr.as_ref().expect("xgrammar runs").sample(
                        &spec,
                        count,
                        args.max_tokens,
                        seed,
                        closing,
                    ),
                    _ => {
                        let peer = peers.iter().find(|p| p.name() == *engine).expect("a peer");
                        peer.compile_spec(&spec).and_then(|c| {
                            let mut h = seed;
                            let mut out = Vec::new();
                            for _ in 0..count {
                                let mut w = c.walker()?;
                                out.push(draw(
                                    w.as_mut(),
                                    &vocab,
                                    eos,
                                    closing,
                                    args.max_tokens,
                                    &mut h,
                                ));
                            }
                            Ok((out, Vec::new()))
                        })
                    }
                };
                drawn = drawn.and_then(|(mut records, mut warnings)| {
                    let (r, w) = pass?;
                    records.extend(r);
                    warnings.extend(
                        w.into_iter()
                            .filter(|w| !warnings.contains(w))
                            .collect::<Vec<_>>(),
                    );
                    Ok((records, warnings))
                });
            }
            let tally = tallies.get_mut(engine).expect("every engine has a tally");
            row[*engine] = match drawn {
                Err(e) => json!({"error": format!("{e:#}")}),
                Ok((records, warnings)) => {
                    tally.schemas += 1;
                    let mut first_error = None;
                    let mut invalid = 0;
                    for d in &records {
                        if let Some(e) = check(d, &validator, tally) {
                            invalid += 1;
                            first_error.get_or_insert_with(
                                || json!({"error": e, "record": String::from_utf8_lossy(&d.bytes)}),
                            );
                        }
                    }
                    if invalid > 0 {
                        tally.refused_schemas += 1;
                        println!(
                            "{name}: {engine}: {invalid} of {} records invalid: {}",
                            records.len(),
                            first_error
                                .as_ref()
                                .map_or(String::new(), |e| e["error"].to_string())
                        );
                    }
                    json!({"invalid": invalid, "first_invalid": first_error, "warnings": warnings,
                           "ends": records.iter().map(|d| format!("{:?}", d.end)).collect::<Vec<_>>()})
                }
            };
        }
        rows.push(row);
    }
    println!(
        "\n{:<14} {:>9} {:>8} {:>9} {:>7} {:>9} {:>9} {:>6} {:>10} {:>9} {:>13}",
        "engine",
        "schemas",
        "records",
        "complete",
        "valid",
        "not JSON",
        "invalid",
        "open",
        "dead ends",
        "refused",
        "schemas hit"
    );
    for (engine, t) in &tallies {
        println!(
            "{:<14} {:>9} {:>8} {:>9} {:>7} {:>9} {:>9} {:>6} {:>10} {:>9} {:>13}",
            engine,
            t.schemas,
            t.records,
            t.complete,
            t.valid,
            t.not_json,
            t.invalid,
            t.open,
            t.dead_ends,
            t.engine_refused,
            t.refused_schemas
        );
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let summary: BTreeMap<&str, Value> = tallies.iter().map(|(e, t)| (*e, t.to_json())).collect();
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({
            "bench": "validity-bench",
            "model": args.model,
            "vocab": vocab.len(),
            "records_per_schema": args.records,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
            "versions": {"quarry-grammar": env!("CARGO_PKG_VERSION"), "llguidance": "1.9.1",
                         "xgrammar": xgr.as_ref().map(|x| x.setup.version.clone())},
            "summary": summary,
            "schemas": rows,
        }))?,
    )?;
    println!("\nwrote {}", args.out.display());
    Ok(())
}
