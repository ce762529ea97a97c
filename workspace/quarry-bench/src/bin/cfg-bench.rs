//! `cfg-bench`: context-free constraints (GBNF grammars, recursive JSON Schemas, `json_object`),
//! quarry against llguidance on the same vocabularies, in one run. For each case: compile time,
//! time to first mask, and the per-token mask time along a realistic output, cold (a fresh
//! compile) and warm (the same walk again). Prints a table and writes JSON (see `BENCHMARKS.md`).
//!
//! Schemas and `json_object` are the same input for both engines (llguidance told to use compact
//! separators, quarry's default layout). Grammars are quarry's GBNF test grammars and the same
//! languages written in llguidance's Lark syntax (`workspace/quarry-grammar/tests/grammars/*.lark`, which quarry also reads).
//! With `--xgrammar-python`, xgrammar runs the same cases in its own process (its EBNF reader takes
//! the GBNF grammars), its masks checked against quarry's.

use anyhow::Result;
use clap::Parser;
use quarry_bench::cfg::cases;
use quarry_bench::grammar::{print_header, Engines, Reps};
use quarry_bench::peers::{Llguidance, Peer, Quarry};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

/// SmolLM2 (49k tokens) and Qwen2.5 (152k), unless `--model` says otherwise.
const MODELS: [&str; 2] = [
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
];

#[derive(Parser)]
#[command(about = "Context-free constraint compile and mask times: quarry vs llguidance, xgrammar")]
struct Args {
    #[command(flatten)]
    reps: Reps,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut results: Vec<Value> = Vec::new();
    for path in &args.reps.models(&MODELS) {
        let mv = ModelVocab::load(path)?;
        let v = &mv.vocab;
        let llg = Llguidance::new(v)?;
        let quarry = Quarry {
            vocab: v.clone(),
            eager: false,
        };
        let model = path.file_name().unwrap().to_string_lossy().into_owned();
        println!("\n{model}: {} tokens", v.len());
        let xgr = args.reps.xgrammar.start(v)?;
        print_header();
        let peers: [&dyn Peer; 2] = [&quarry, &llg];
        let engines = Engines {
            peers: &peers,
            xgrammar: xgr.as_ref(),
            quarry: &quarry,
        };
        let cases = cases()?;
        let specs = cases
            .iter()
            .map(|c| (c.name, c.text.as_str(), c.spec.clone()));
        args.reps
            .run_cases(&model, &mv, &engines, specs, &mut results)?;
    }
    args.reps.write(
        "cfg",
        json!({
            "quarry-grammar": env!("CARGO_PKG_VERSION"),
            "llguidance": "1.9.1",
        }),
        results,
    )
}
