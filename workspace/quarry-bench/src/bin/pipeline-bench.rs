//! Pipeline overhead: the same documents and prompts through (1) the engine alone
//! (`Engine::run_batch`, results kept in memory) and (2) the whole dataset job (JSONL shards read
//! from disk, validation, Arrow, Parquet with zstd, create-if-absent publish of accepted and
//! rejects). Runs alternate, each on a fresh engine (empty prefix cache); medians are reported.
//! Target: the pipeline within 3% of the engine's docs/s. Both take the KV pool and pass sizes
//! the job takes on its device ([`quarry_engine::BatchSizes`]); `--device cuda:0` (a build with
//! the `cuda` feature) measures the job on a GPU, where the engine's steps are short and the
//! job's own work shows.

use quarry_bench::{median, package_records};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quarry_engine::{ConstraintSpec, Engine, EngineConfig, Request};
use quarry_pipeline::extract::{EngineExtractor, PromptBuilder};
use quarry_pipeline::job::Prepared;
use quarry_pipeline::record::{Document, Lineage};
use quarry_pipeline::store::Location;
use quarry_pipeline::PipelineConfig;
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "pipelines/debian-packages.toml")]
    pipeline: PathBuf,
    #[arg(long, default_value = "/var/lib/dpkg/status")]
    status: PathBuf,
    #[arg(long, default_value_t = 40)]
    docs: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// The model, the device, the batch and the output cap, over the job's own.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long)]
    device: Option<String>,
    #[arg(long)]
    max_running: Option<usize>,
    #[arg(long)]
    max_tokens: Option<usize>,
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string());
    let mut cfg = PipelineConfig::load(&args.pipeline)?;
    // The QUARRY_* model runtime variables over `[model.runtime]`, as `quarry` reads them.
    cfg.model.runtime.apply_vars(|k| std::env::var(k).ok())?;
    if let Some(m) = &args.model {
        // Relative to where the command runs, as `quarry extract --model` takes it.
        cfg.model.path = std::path::absolute(m)?;
    }
    if let Some(d) = &args.device {
        cfg.model.device = d.clone();
    }
    if let Some(n) = args.max_running {
        cfg.batching.max_running = n;
    }
    if let Some(n) = args.max_tokens {
        cfg.sampling.max_tokens = n;
    }
    let job = Prepared::new(cfg)?;
    let docs = package_records(&args.status, args.docs)?;
    let loaded = job.cfg.model_spec().load()?;
    let (model, tok) = (loaded.model.clone(), loaded.tokenizer.clone());
    let b = &job.cfg.batching;
    let sizes = loaded.batch_sizes(b.max_running, b.kv_tokens, b.step_tokens)?;
    eprintln!(
        "{} on {}; {sizes}",
        job.cfg.model_path().display(),
        job.cfg.model.device
    );
    let ecfg = EngineConfig {
        max_running: b.max_running,
        step_tokens: sizes.step_tokens,
        kv_tokens: sizes.kv_tokens,
        close_within_budget: job.cfg.sampling.close_within_budget,
        ..EngineConfig::default()
    };
    let work = std::env::temp_dir().join(format!("quarry-pipeline-bench-{}", std::process::id()));
    let input_dir = work.join("in");
    std::fs::create_dir_all(&input_dir)?;
    let lines: Vec<String> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| json!({"id": i.to_string(), "text": d}).to_string())
        .collect();
    std::fs::write(input_dir.join("docs.jsonl"), lines.join("\n") + "\n")?;
    let input = Location::open_input(input_dir.to_str().unwrap())?;

    // The engine alone, with exactly the prompts the pipeline builds.
    let prompts = PromptBuilder::new(&job.cfg.prompt, Some(&tok))?;
    let requests = || -> Result<Vec<Request>> {
        docs.iter()
            .enumerate()
            .map(|(i, d)| {
                let doc = Document {
                    id: i.to_string(),
                    text: d.clone(),
                    fields: serde_json::Map::new(),
                    lineage: Lineage::new("bench", None, i as i64),
                };
                let p = prompts
                    .build(&doc)
                    .map_err(|e| anyhow::anyhow!("{}", e.detail()))?;
                Ok(Request::new(p)
                    .with_constraint(ConstraintSpec::JsonSchema(job.schema.clone()))
                    .with_max_tokens(job.cfg.sampling.max_tokens))
            })
            .collect()
    };
    let mut engine_rates = Vec::new();
    let mut pipeline_rates = Vec::new();
    let mut io_shares = Vec::new();
    for rep in 0..args.repeats {
        let mut engine = Engine::new(model.clone(), tok.clone(), ecfg.clone())?;
        let reqs = requests()?;
        let t = Instant::now();
        let out = engine.run_batch(reqs)?;
        let e_wall = t.elapsed().as_secs_f64();
        engine_rates.push(out.len() as f64 / e_wall);

        let out_dir = work.join(format!("out-{rep}"));
        let publisher = job.publisher(
            Some(out_dir.join("accepted").to_str().unwrap()),
            Some(out_dir.join("rejects").to_str().unwrap()),
        )?;
        let extractor = EngineExtractor::new(
            model.clone(),
            tok.clone(),
            ecfg.clone(),
            &job.cfg,
            &job.schema,
        )?;
        let t = Instant::now();
        let s = job.run_dataset_plain(extractor, &input, &publisher)?;
        let p_wall = t.elapsed().as_secs_f64();
        pipeline_rates.push(s.consumed as f64 / p_wall);
        io_shares.push(s.io_s / p_wall);
        eprintln!(
            "rep {rep}: engine {:.3} docs/s ({e_wall:.1}s), pipeline {:.3} docs/s ({p_wall:.1}s; {} accepted, {} rejected; {:.3}s reading and publishing)",
            engine_rates[rep], pipeline_rates[rep], s.accepted, s.rejected, s.io_s
        );
    }
    let e = median(engine_rates.clone());
    let p = median(pipeline_rates.clone());
    let overhead = 1.0 - p / e;
    println!("engine alone: {e:.3} docs/s (median of {})", args.repeats);
    println!("pipeline:     {p:.3} docs/s (median of {})", args.repeats);
    let io = median(io_shares.clone());
    println!(
        "overhead:     {:.1}% in docs/s (target < 3%)",
        overhead * 100.0
    );
    println!(
        "reading shards, encoding and publishing: {:.3}% of the job's wall time",
        io * 100.0
    );
    if let Some(path) = args.out {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let v = json!({
            "docs": args.docs,
            "model": job.cfg.model_path(),
            "device": job.cfg.model.device,
            "max_running": b.max_running,
            "max_tokens": job.cfg.sampling.max_tokens,
            "kv_tokens": sizes.kv_tokens,
            "step_tokens": sizes.step_tokens,
            "threads": args.threads,
            "engine_docs_per_s": engine_rates,
            "pipeline_docs_per_s": pipeline_rates,
            "engine_median": e,
            "pipeline_median": p,
            "overhead": overhead,
            "io_share": io_shares,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}
