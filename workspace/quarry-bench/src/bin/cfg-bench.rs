//! `cfg-bench`: context-free constraints (GBNF grammars, recursive JSON Schemas, `json_object`),
//! quarry against llguidance on the same vocabularies, in one run. For each case: compile time,
//! time to first mask, and the per-token mask time along a realistic output, cold (a fresh
//! compile) and warm (the same walk again). Prints a table and writes JSON (see `BENCHMARKS.md`).
//!
//! Schemas and `json_object` are the same input for both engines (llguidance told to use compact
//! separators, quarry's default layout). Grammars are quarry's GBNF test grammars and the same
//! languages written in llguidance's Lark syntax (`workspace/quarry-bench/grammars/`).
//! xgrammar is not in the run: its Python package requires torch (see `BENCHMARKS.md`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use quarry_bench::cfg::cases;
use quarry_bench::grammar::measure;
use quarry_bench::peers::{Llguidance, Peer, Quarry};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Context-free constraint compile and mask times: quarry vs llguidance")]
struct Args {
    /// GGUF files whose vocabularies are used (49k and 152k tokens).
    #[arg(long, default_values = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])]
    model: Vec<PathBuf>,
    /// Fresh compiles per engine and case (each walked once, cold).
    #[arg(long, default_value_t = 5)]
    cold_reps: usize,
    /// Walks on the last compile (warm).
    #[arg(long, default_value_t = 20)]
    warm_reps: usize,
    /// Only cases whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/cfg.json")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut results: Vec<Value> = Vec::new();
    for path in &args.model {
        let mv = ModelVocab::load(path)?;
        let v = &mv.vocab;
        let llg = Llguidance::new(v)?;
        let quarry = Quarry {
            vocab: v.clone(),
            eager: false,
        };
        let model = path.file_name().unwrap().to_string_lossy().into_owned();
        println!("\n{model}: {} tokens", v.len());
        println!(
            "{:<14} {:<11} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "case",
            "engine",
            "tokens",
            "compile µs",
            "TTFM µs",
            "cold p50",
            "cold p99",
            "cold max",
            "warm p50",
            "warm p99",
            "warm max"
        );
        let peers: [&dyn Peer; 2] = [&quarry, &llg];
        for case in cases()? {
            if args.only.as_deref().is_some_and(|o| !case.name.contains(o)) {
                continue;
            }
            let tokens = mv.tokenizer.encode(&case.text)?;
            for peer in peers {
                let r = match measure(
                    peer,
                    &case.spec,
                    &tokens,
                    v.mask_words(),
                    args.cold_reps,
                    args.warm_reps,
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        println!("{:<14} {:<11} error: {e:#}", case.name, peer.name());
                        results.push(json!({"model": model, "case": case.name, "engine": peer.name(), "error": format!("{e:#}")}));
                        continue;
                    }
                };
                let f = |k: &str, q: &str| r[k][q].as_f64().unwrap_or(f64::NAN);
                println!(
                    "{:<14} {:<11} {:>6} {:>10.1} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                    case.name,
                    peer.name(),
                    tokens.len(),
                    r["compile_us"].as_f64().unwrap(),
                    r["time_to_first_mask_us"].as_f64().unwrap(),
                    f("cold", "p50_us"),
                    f("cold", "p99_us"),
                    f("cold", "max_us"),
                    f("warm", "p50_us"),
                    f("warm", "p99_us"),
                    f("warm", "max_us"),
                );
                let mut r = r;
                r["model"] = json!(model);
                r["case"] = json!(case.name);
                r["walk_tokens"] = json!(tokens.len());
                results.push(r);
            }
        }
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({
            "versions": {
                "quarry-grammar": env!("CARGO_PKG_VERSION"),
                "llguidance": "1.9.1",
            },
            "cold_reps": args.cold_reps,
            "warm_reps": args.warm_reps,
            "results": results,
        }))?,
    )?;
    println!("\nwrote {}", args.out.display());
    Ok(())
}
