//! `grammar-bench`: quarry against outlines-core, llguidance and (with `--xgrammar-python`)
//! xgrammar on the same regexes and the same vocabularies, in one run. Prints a table and writes
//! JSON (see `BENCHMARKS.md`).

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quarry_bench::grammar::{cases, print_header, Engines, Reps};
use quarry_bench::peers::{Llguidance, Outlines, Peer, Quarry, Spec};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

/// SmolLM2 (49k tokens), Gemma 3 (262k) and Qwen2.5 (152k), unless `--model` says otherwise.
const MODELS: [&str; 3] = [
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "models/gemma-3-270m-q4_k_m.gguf",
    "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
];

#[derive(Parser)]
#[command(
    about = "Constraint compile and mask times: quarry vs outlines-core, llguidance, xgrammar"
)]
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
        let xgr = args.reps.xgrammar.start(v)?;
        print_header();
        let peers: [&dyn Peer; 4] = [&quarry, &eager, &outlines, &llg];
        let engines = Engines {
            peers: &peers,
            xgrammar: xgr.as_ref(),
            quarry: &quarry,
        };
        let specs = cases()
            .into_iter()
            .map(|c| (c.name, c.text, Spec::Regex(c.regex)));
        args.reps
            .run_cases(&model, &mv, &engines, specs, &mut results)?;
    }
    args.reps.write(
        "grammar",
        json!({
            "quarry-grammar": env!("CARGO_PKG_VERSION"),
            "outlines-core": "0.2.14",
            "llguidance": "1.9.1",
        }),
        results,
    )
}
