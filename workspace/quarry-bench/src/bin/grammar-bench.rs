//! `grammar-bench`: quarry against outlines-core and llguidance on the same regexes and the same
//! vocabularies, in one run. Prints a table and writes JSON (see `BENCHMARKS.md`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quarry_bench::grammar::{cases, print_header, run_case, Reps, Run};
use quarry_bench::peers::{Llguidance, Outlines, Peer, Quarry, Spec};
use quarry_bench::ModelVocab;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Constraint compile and mask times: quarry vs outlines-core vs llguidance")]
struct Args {
    /// GGUF files whose vocabularies are used (49k, 262k and 152k tokens).
    #[arg(long, default_values = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-q4_k_m.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])]
    model: Vec<PathBuf>,
    #[command(flatten)]
    reps: Reps,
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
        print_header();
        let peers: [&dyn Peer; 4] = [&quarry, &eager, &outlines, &llg];
        for case in cases() {
            if !args.reps.selects(case.name) {
                continue;
            }
            let tokens = mv.tokenizer.encode(case.text)?;
            let run = Run {
                model: &model,
                case: case.name,
                tokens: &tokens,
                mask_words: v.mask_words(),
                cold_reps: args.reps.cold_reps,
                warm_reps: args.reps.warm_reps,
            };
            for peer in peers {
                results.push(run_case(peer, &Spec::Regex(case.regex.clone()), &run));
            }
        }
    }
    args.reps.write(
        &args.out,
        json!({
            "quarry-grammar": env!("CARGO_PKG_VERSION"),
            "outlines-core": "0.2.14",
            "llguidance": "1.9.1",
        }),
        results,
    )
}
