//! The engine benchmark: extract JSON from real documents (Debian package records from this
//! machine's `/var/lib/dpkg/status`) with a schema, under four configurations in one run:
//! - (a) no constraint (the prompt asks for JSON, the model writes what it likes);
//! - (b) the schema as a constraint, jump-forward off;
//! - (c) the schema with jump-forward (quarry's default);
//! - (d) as (c) with the radix prefix cache off;
//! - (e), on request: as (c) with [`KeepBack::Settled`] (commit the tokenizer's settled prefix)
//!   instead of keeping back `--keep-back` tokens, to measure what the settled rule is worth.
//!
//! Every prompt starts with the same instruction of about 300 tokens, so (c) vs (d) shows what the
//! prefix cache is worth. Each configuration runs `--repeats` times on a fresh engine; the table
//! gives medians. Constrained outputs are validated with the jsonschema crate, and every output is
//! scored on the six facts the instruction asks for against the record itself
//! ([`bench::facts_correct`]): speed counts only next to correctness.

use quarry_bench::median;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::Parser;
use quarry_engine::{EngineConfig, KeepBack};
use quarry_eval as bench;
use quarry_grammar::{Constraint, Grammar, Limits, SchemaOptions, Whitespace};
use quarry_model::{parse_device, Llama};
use quarry_tokenizer::Tokenizer;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    #[arg(long, default_value = "schemas/debian-package.json")]
    schema: PathBuf,
    #[arg(long, default_value = "/var/lib/dpkg/status")]
    status: PathBuf,
    /// Documents (package records) to extract from.
    #[arg(long, default_value_t = 50)]
    docs: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    #[arg(long, default_value_t = 32)]
    max_running: usize,
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Configurations to run, from a, b, c, d, e.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d")]
    configs: Vec<String>,
    /// Jump-forward: tokens of the re-encoded boundary left for the model (in (e) only where the
    /// tokenizer has no settled prefix).
    #[arg(long, default_value_t = EngineConfig::default().keep_back)]
    keep_back: usize,
    /// Jump-forward: keep back the tail of a forced run outright instead of appending it as drafts
    /// for the next pass to verify.
    #[arg(long)]
    no_drafts: bool,
    /// Records that always close off (`EngineConfig::close_within_budget`): outputs may end cut
    /// at `--max-tokens`, as before it (docs/budget.md), for before/after comparisons.
    #[arg(long)]
    no_budget: bool,
    /// Jump-forward: sampled tokens re-encoded with the forced bytes at a boundary.
    #[arg(long, default_value_t = EngineConfig::default().retokenize)]
    retokenize: usize,
    /// Layout of the constrained JSON: compact, spaced, pretty or pretty:N.
    #[arg(long, default_value_t = EngineConfig::default().schema_options.whitespace)]
    whitespace: Whitespace,
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write each configuration's outputs (first run) to DIR/<config>.jsonl, one
    /// {"text", "finish"} line per document, to see what the model wrote.
    #[arg(long, value_name = "DIR")]
    outputs: Option<PathBuf>,
    /// Write the documents' prompts as this run would tokenize them (one {"ids"} line per
    /// document: the chat template rendered, the instruction and the record) to FILE, and stop:
    /// what a peer is given (`infra/llama_cpp_extract_bench.py`).
    #[arg(long, value_name = "FILE")]
    write_prompts: Option<PathBuf>,
    /// Score a peer's outputs instead of running quarry: FILE holds one {"text", "finish"} line
    /// per document, in order (as `--outputs` writes them); each is validated against the schema
    /// and scored on the same facts.
    #[arg(long, value_name = "FILE")]
    peer: Option<PathBuf>,
}

struct Config {
    name: &'static str,
    label: &'static str,
    constrained: bool,
    jump_forward: bool,
    radix_cache: bool,
    keep_back_rule: KeepBack,
}

const CONFIGS: [Config; 5] = [
    Config {
        name: "a",
        label: "no constraint",
        constrained: false,
        jump_forward: true,
        radix_cache: true,
        keep_back_rule: KeepBack::Count,
    },
    Config {
        name: "b",
        label: "schema, no jump-forward",
        constrained: true,
        jump_forward: false,
        radix_cache: true,
        keep_back_rule: KeepBack::Count,
    },
    Config {
        name: "c",
        label: "schema + jump-forward",
        constrained: true,
        jump_forward: true,
        radix_cache: true,
        keep_back_rule: KeepBack::Count,
    },
    Config {
        name: "d",
        label: "as (c), no prefix cache",
        constrained: true,
        jump_forward: true,
        radix_cache: false,
        keep_back_rule: KeepBack::Count,
    },
    Config {
        name: "e",
        label: "as (c), settled keep-back",
        constrained: true,
        jump_forward: true,
        radix_cache: true,
        keep_back_rule: KeepBack::Settled,
    },
];

fn main() -> Result<()> {
    let args = Args::parse();
    std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string());
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let validator = jsonschema::validator_for(&schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    let docs = bench::package_records(&args.status, args.docs)?;
    let device = parse_device("cpu")?;
    // The QUARRY_* model runtime variables, as `quarry` reads them.
    let mut options = quarry_model::ModelOptions::default();
    options.apply_vars(|k| std::env::var(k).ok())?;
    let tok = Arc::new(Tokenizer::from_gguf(&args.model)?);
    if let Some(path) = &args.write_prompts {
        return write_prompts(&tok, &docs, path);
    }
    if let Some(path) = &args.peer {
        return score_peer(&docs, path, &validator, args.out.as_deref());
    }
    let model = Arc::new(Llama::load_with(&args.model, &device, &options)?);
    let prefix_tokens = tok.encode(bench::PACKAGE_INSTRUCTION)?.len();
    eprintln!(
        "{} documents; shared instruction of {prefix_tokens} tokens",
        docs.len()
    );
    let mut rows = Vec::new();
    for cfg in CONFIGS
        .iter()
        .filter(|c| args.configs.iter().any(|n| n == c.name))
    {
        let mut runs = Vec::new();
        for rep in 0..args.repeats {
            let config = EngineConfig {
                jump_forward: cfg.jump_forward,
                radix_cache: cfg.radix_cache,
                max_running: args.max_running,
                keep_back: args.keep_back,
                keep_back_rule: cfg.keep_back_rule,
                draft_kept_back: !args.no_drafts,
                close_within_budget: !args.no_budget,
                retokenize: args.retokenize,
                schema_options: SchemaOptions {
                    whitespace: args.whitespace,
                    ..EngineConfig::default().schema_options
                },
                ..EngineConfig::default()
            };
            let reqs = bench::requests(&docs, cfg.constrained.then_some(&schema), args.max_tokens);
            let metrics = bench::measure(&model, &tok, config, reqs, &validator)?;
            if let (Some(dir), 0) = (&args.outputs, rep) {
                std::fs::create_dir_all(dir)?;
                let lines: Vec<String> = metrics
                    .outputs
                    .iter()
                    .map(|(text, finish)| json!({"text": text, "finish": finish}).to_string())
                    .collect();
                std::fs::write(
                    dir.join(format!("{}.jsonl", cfg.name)),
                    lines.join("\n") + "\n",
                )?;
            }
            let mut by_fact = [0usize; 6];
            for (d, (text, _)) in docs.iter().zip(&metrics.outputs) {
                for (n, right) in by_fact.iter_mut().zip(bench::facts_right(d, text)) {
                    *n += usize::from(right);
                }
            }
            let facts: usize = by_fact.iter().sum();
            let mut run = serde_json::to_value(&metrics)?;
            run["facts_correct"] = json!(facts as f64 / (docs.len() * bench::FACTS.len()) as f64);
            // Per fact: how many of the documents state it right.
            run["facts_right"] = json!(bench::FACTS
                .iter()
                .zip(by_fact)
                .map(|(f, n)| (f.to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>());
            if cfg.constrained {
                let (bytes, tokens) = forced_ceiling(&tok, &schema, args.whitespace, &metrics)?;
                run["forced_bytes_share"] = json!(bytes);
                run["forced_ceiling"] = json!(tokens);
            }
            eprintln!("{} ({}) run {}: {run}", cfg.name, cfg.label, rep + 1);
            runs.push(run);
        }
        let med = |k: &str| median(runs.iter().map(|r| r[k].as_f64().unwrap()).collect());
        rows.push(json!({
            "config": cfg.name,
            "label": cfg.label,
            "docs_per_s": med("docs_per_s"),
            "output_tokens_per_s": med("output_tokens_per_s"),
            "forward_passes": med("forward_passes"),
            "forced_share": med("forced_share"),
            "hit_rate": med("hit_rate"),
            "mask_us_per_step": med("mask_us_per_step"),
            "cache_overhead": med("cache_overhead"),
            "complete": med("complete"),
            "cut_at_max_tokens": med("cut_at_max_tokens"),
            "budget_closed": med("budget_closed"),
            "budget_us_per_step": med("budget_us_per_step"),
            "schema_valid": med("schema_valid"),
            "facts_correct": med("facts_correct"),
            "forced_ceiling": runs[0].get("forced_ceiling").cloned(),
            "runs": runs,
        }));
    }
    println!(
        "| config | docs/s | output tok/s | forward passes | forced share | forced ceiling | cache hit rate | mask µs/step | budget µs/step | complete | cut | budget-closed | schema-valid | facts correct |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let ceiling = r["forced_ceiling"]
            .as_f64()
            .map_or("—".to_string(), |c| format!("{:.1}%", 100.0 * c));
        println!(
            "| ({}) {} | {:.3} | {:.1} | {:.0} | {:.1}% | {ceiling} | {:.1}% | {:.0} | {:.0} | {:.0}/{} | {:.0} | {:.0} | {:.0}/{} | {:.1}% |",
            r["config"].as_str().unwrap(),
            r["label"].as_str().unwrap(),
            r["docs_per_s"].as_f64().unwrap(),
            r["output_tokens_per_s"].as_f64().unwrap(),
            r["forward_passes"].as_f64().unwrap(),
            100.0 * r["forced_share"].as_f64().unwrap(),
            100.0 * r["hit_rate"].as_f64().unwrap(),
            r["mask_us_per_step"].as_f64().unwrap(),
            r["budget_us_per_step"].as_f64().unwrap(),
            r["complete"].as_f64().unwrap(),
            docs.len(),
            r["cut_at_max_tokens"].as_f64().unwrap(),
            r["budget_closed"].as_f64().unwrap(),
            r["schema_valid"].as_f64().unwrap(),
            docs.len(),
            100.0 * r["facts_correct"].as_f64().unwrap(),
        );
    }
    for r in &rows {
        let per: Vec<String> = bench::FACTS
            .iter()
            .map(|f| {
                let n = r["runs"][0]["facts_right"][*f].as_u64().unwrap_or(0);
                format!("{f} {n}/{}", docs.len())
            })
            .collect();
        println!(
            "({}) facts right per field (run 1): {}",
            r["config"].as_str().unwrap(),
            per.join(", ")
        );
    }
    let by = |n: &str| {
        rows.iter()
            .find(|r| r["config"] == n)
            .map(|r| r["docs_per_s"].as_f64().unwrap())
    };
    let mut ratios = serde_json::Map::new();
    for (name, x, y) in [
        ("c_over_b", "c", "b"),
        ("c_over_a", "c", "a"),
        ("c_over_d", "c", "d"),
        ("c_over_e", "c", "e"),
    ] {
        if let (Some(a), Some(b)) = (by(x), by(y)) {
            println!("{name}: {:.2}x", a / b);
            ratios.insert(name.into(), json!(a / b));
        }
    }
    if let Some(path) = &args.out {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let doc = json!({
            "bench": "engine",
            "model": args.model.display().to_string(),
            "docs": docs.len(),
            "instruction_tokens": prefix_tokens,
            "threads": args.threads,
            "max_running": args.max_running,
            "max_tokens": args.max_tokens,
            "keep_back": args.keep_back,
            "drafts": !args.no_drafts,
            "close_within_budget": !args.no_budget,
            "retokenize": args.retokenize,
            "whitespace": args.whitespace.to_string(),
            "quarry_version": env!("CARGO_PKG_VERSION"),
            "configs": rows,
            "ratios": ratios,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// The prompts `bench::requests` makes, as the engine tokenizes them, one {"ids"} line each.
fn write_prompts(tok: &Tokenizer, docs: &[String], path: &std::path::Path) -> Result<()> {
    let mut lines = String::new();
    for d in docs {
        let messages = [quarry_tokenizer::ChatMessage::new(
            "user",
            format!("{}{d}", bench::PACKAGE_INSTRUCTION),
        )];
        let text = tok.apply_chat_template(&messages, true)?;
        let ids = tok.encode_chat(&text)?;
        lines.push_str(&json!({ "ids": ids }).to_string());
        lines.push('\n');
    }
    std::fs::write(path, lines)?;
    eprintln!("{} prompts written to {}", docs.len(), path.display());
    Ok(())
}

/// A peer's outputs for `docs` (one {"text", "finish"} line each, in order): how many are
/// schema-valid JSON, and the facts right per field, as quarry's runs are scored.
fn score_peer(
    docs: &[String],
    path: &std::path::Path,
    validator: &jsonschema::Validator,
    out: Option<&std::path::Path>,
) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let outputs: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    if outputs.len() != docs.len() {
        anyhow::bail!(
            "{} holds {} outputs for {} documents: run the peer on the same --docs",
            path.display(),
            outputs.len(),
            docs.len()
        );
    }
    let (mut valid, mut by_fact) = (0usize, [0usize; 6]);
    for (d, o) in docs.iter().zip(&outputs) {
        let out = o["text"].as_str().unwrap_or_default();
        if serde_json::from_str::<Value>(out).is_ok_and(|v| validator.is_valid(&v)) {
            valid += 1;
        }
        for (n, right) in by_fact.iter_mut().zip(bench::facts_right(d, out)) {
            *n += usize::from(right);
        }
    }
    let facts: usize = by_fact.iter().sum();
    let per: Vec<String> = bench::FACTS
        .iter()
        .zip(by_fact)
        .map(|(f, n)| format!("{f} {n}/{}", docs.len()))
        .collect();
    println!(
        "peer {}: schema-valid {valid}/{}, facts right {:.1}% ({})",
        path.display(),
        docs.len(),
        100.0 * facts as f64 / (docs.len() * bench::FACTS.len()) as f64,
        per.join(", ")
    );
    if let Some(out) = out {
        let doc = json!({
            "bench": "engine-peer",
            "peer_outputs": path.display().to_string(),
            "docs": docs.len(),
            "schema_valid": valid,
            "facts_correct": facts as f64 / (docs.len() * bench::FACTS.len()) as f64,
            "facts_right": bench::FACTS
                .iter()
                .zip(by_fact)
                .map(|(f, n)| (f.to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// Over the outputs of a run (truncated ones included, as in the measured forced share): the
/// share of their bytes the schema forces, and the share of their canonical tokens lying wholly
/// in forced bytes ([`bench::forced_tokens`]). The latter is the most any jump-forward could force
/// on these outputs, the ceiling for the measured forced share: each forced token saves at most
/// one forward pass.
fn forced_ceiling(
    tok: &Tokenizer,
    schema: &Value,
    whitespace: Whitespace,
    metrics: &bench::RunMetrics,
) -> Result<(f64, f64)> {
    let vocab = quarry_engine::grammar_vocabulary(tok);
    let constraint = Constraint::JsonSchema {
        schema: schema.clone(),
        options: SchemaOptions {
            whitespace,
            ..EngineConfig::default().schema_options
        },
    };
    let grammar = Arc::new(Grammar::compile(&constraint, vocab, Limits::default())?);
    let (mut bytes, mut forced_bytes, mut tokens, mut forced) = (0, 0, 0, 0);
    for (text, finish) in &metrics.outputs {
        if finish == "error" {
            continue;
        }
        let mask = bench::forced_byte_mask(&grammar, text.as_bytes())?;
        let ids = tok.encode(text)?;
        let spans = ids
            .iter()
            .map(|&id| tok.token_bytes(id))
            .collect::<Result<Vec<_>, _>>()?;
        bytes += mask.len();
        forced_bytes += mask.iter().filter(|&&f| f).count();
        tokens += ids.len();
        forced += bench::forced_tokens(&mask, spans);
    }
    let share = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok((share(forced_bytes, bytes), share(forced, tokens)))
}
