//! `cfg-bench`: context-free constraints (GBNF grammars, recursive JSON Schemas, `json_object`),
//! quarry against llguidance on the same vocabularies, in one run. For each case: compile time,
//! time to first mask, and the per-token mask time along a realistic output, cold (a fresh
//! compile) and warm (the same walk again). Prints a table and writes JSON (see `BENCHMARKS.md`).
//!
//! Schemas and `json_object` are the same input for both engines (llguidance told to use compact
//! separators, quarry's default layout). Grammars are quarry's GBNF test grammars and the same
//! languages written in llguidance's Lark syntax (`workspace/quarry-grammar/tests/grammars/*.lark`, which quarry also reads).
//! xgrammar is not in the run: its Python package requires torch (see `BENCHMARKS.md`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use quarry_bench::cfg::cases;
use quarry_bench::grammar::{print_header, run_case, Reps, Run};
use quarry_bench::peers::{Llguidance, Peer, Quarry};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Context-free constraint compile and mask times: quarry vs llguidance")]
struct Args {
    /// GGUF files whose vocabularies are used (49k and 152k tokens).
    #[arg(long, default_values = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])]
    model: Vec<PathBuf>,
    #[command(flatten)]
    reps: Reps,
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
        print_header();
        let peers: [&dyn Peer; 2] = [&quarry, &llg];
        for case in cases()? {
            if !args.reps.selects(case.name) {
                continue;
            }
            let tokens = mv.tokenizer.encode(&case.text)?;
            let run = Run {
                model: &model,
                case: case.name,
                tokens: &tokens,
                mask_words: v.mask_words(),
                cold_reps: args.reps.cold_reps,
                warm_reps: args.reps.warm_reps,
            };
            for peer in peers {
                results.push(run_case(peer, &case.spec, &run));
            }
        }
    }
    args.reps.write(
        &args.out,
        json!({
            "quarry-grammar": env!("CARGO_PKG_VERSION"),
            "llguidance": "1.9.1",
        }),
        results,
    )
}
