//! `grammar-bench`: quarry against outlines-core and llguidance on the same regexes and the same
//! vocabularies, in one run. Prints a table and writes JSON (see `BENCHMARKS.md`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quarry_bench::grammar::{cases, measure};
use quarry_bench::peers::{Llguidance, Outlines, Peer, Quarry, Spec};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Constraint compile and mask times: quarry vs outlines-core vs llguidance")]
struct Args {
    /// GGUF files whose vocabularies are used (49k, 262k and 152k tokens).
    #[arg(long, default_values = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-q4_k_m.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])]
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
    #[arg(long, default_value = "target/bench/grammar.json")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut results: Vec<Value> = Vec::new();
    for path in &args.model {
        let mv = ModelVocab::load(path)?;
        let v = &mv.vocab;
        let t = Instant::now();
        let outlines = Outlines::new(v)?;
        let outlines_vocab_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let llg = Llguidance::new(v)?;
        let llg_vocab_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let reload = ModelVocab::load(path)?;
        let quarry_vocab_ms = t.elapsed().as_secs_f64() * 1e3;
        let quarry = Quarry {
            vocab: reload.vocab.clone(),
            eager: false,
        };
        let eager = Quarry {
            vocab: reload.vocab.clone(),
            eager: true,
        };
        let model = path.file_name().unwrap().to_string_lossy().into_owned();
        println!(
            "\n{model}: {} tokens · vocabulary set-up: quarry {quarry_vocab_ms:.0} ms (tokenizer + trie), \
             outlines-core {outlines_vocab_ms:.0} ms, llguidance {llg_vocab_ms:.0} ms",
            v.len()
        );
        println!(
            "{:<15} {:<15} {:>12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "case",
            "engine",
            "compile µs",
            "TTFM µs",
            "cold p50",
            "cold p99",
            "cold max",
            "warm p50",
            "warm p99",
            "warm max"
        );
        let peers: [&dyn Peer; 4] = [&quarry, &eager, &outlines, &llg];
        for case in cases() {
            if args.only.as_deref().is_some_and(|o| !case.name.contains(o)) {
                continue;
            }
            let tokens = mv.tokenizer.encode(case.text)?;
            for peer in peers {
                let r = match measure(
                    peer,
                    &Spec::Regex(case.regex.clone()),
                    &tokens,
                    v.mask_words(),
                    args.cold_reps,
                    args.warm_reps,
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        println!("{:<15} {:<15} error: {e:#}", case.name, peer.name());
                        results.push(json!({"model": model, "case": case.name, "engine": peer.name(), "error": format!("{e:#}")}));
                        continue;
                    }
                };
                let f = |k: &str, q: &str| r[k][q].as_f64().unwrap_or(f64::NAN);
                println!(
                    "{:<15} {:<15} {:>12.1} {:>12.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                    case.name,
                    peer.name(),
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
                "outlines-core": "0.2.14",
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
