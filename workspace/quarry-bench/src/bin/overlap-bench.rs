//! The engine's step against a device that takes a fixed time per pass: what a GPU sees of the
//! host. A model double ([`quarry_bench::double::Device`]) stands in for the GPU: its forward call
//! returns at once (a launch) and its draw waits until the pass's device time has passed since the
//! launch, then picks each row's token from the row's mask, as the device-side sampler does. Everything else is the real
//! engine on real documents: the SmolLM2 tokenizer, the package schema, constrained decoding with
//! jump-forward and drafts, the radix cache.
//!
//! The peer is the device alone: a step can take no less than its device time, and the engine
//! hides its masks behind it when it builds them while the pass runs. Per batch size and mode,
//! the table gives the step's wall time against its device time (1.00 is a step the device
//! alone decides), the masks' time and what a step still waited for them after the launch, and
//! the host's own time per step (scheduling, the radix cache, taking tokens, jump-forward, the
//! budget's draws again), during which a GPU would sit idle. The double's own picks (a GPU
//! sampler's work, done here on the host) are timed apart (`pick ms`) and left out of it. The device time per pass is `--pass-us` plus `--token-us` per new
//! token (defaults from an H100 running SmolLM2: about 1.2 ms at batch 1 and 10 ms at 512).
//!
//! With `--modes a --pass-us 0 --token-us 0` it measures the engine's own bookkeeping per step
//! with a model that costs nothing (what `examples/step_overhead.rs` of the engine measured).
//!
//! The double's token choice is not a model's (see its docs). Throughput here says nothing about
//! a model; the host's share of a step does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use quarry_bench::double::{mix, Device};
use quarry_bench::median;
use quarry_engine::{Engine, EngineConfig, FinishReason};
use quarry_eval as bench;
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
    /// Batch sizes (documents: the batch size, 16 at least).
    #[arg(long, value_delimiter = ',', default_value = "8,32,128,512")]
    batch: Vec<usize>,
    /// Modes: a, no constraint; b, the schema without jump-forward; c, with it (the default).
    /// `--modes a --pass-us 0 --token-us 0` gives the engine's own host time per step with a
    /// model that costs nothing.
    #[arg(long, value_delimiter = ',', default_value = "b,c")]
    modes: Vec<String>,
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// The device's time per pass, in microseconds, and per new token of the pass.
    #[arg(long, default_value_t = 1200)]
    pass_us: u64,
    #[arg(long, default_value_t = 17)]
    token_us: u64,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// A new engine for every run (each run compiles the schema and fills its masks afresh);
    /// by default the runs of a batch size and mode share one, started over between them.
    #[arg(long)]
    cold: bool,
    /// Feed the engine as the pipeline does, this many documents a run (0: the batch's
    /// documents at once, through `run_batch`): twice the batch in flight, a new document
    /// submitted for each one that finishes. Documents past the database's usable records repeat
    /// them, each copy with its number appended, so every prompt is its own.
    #[arg(long, default_value_t = 0)]
    feed: usize,
    /// Tokens a pass computes at most (the engine's `step_tokens`).
    #[arg(long, default_value_t = 4096)]
    step_tokens: usize,
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `reqs` as the pipeline feeds an engine: `in_flight` submitted, then one submitted for
/// each that finishes. The completions in the order of `reqs`.
fn run_fed(
    engine: &mut Engine,
    reqs: Vec<quarry_engine::Request>,
    in_flight: usize,
) -> Result<Vec<quarry_engine::Completion>> {
    let n = reqs.len();
    let mut reqs = reqs.into_iter();
    let mut ids = std::collections::HashMap::new();
    let mut out: Vec<Option<quarry_engine::Completion>> = vec![None; n];
    let mut next = 0;
    loop {
        while engine.in_flight() < in_flight {
            let Some(r) = reqs.next() else { break };
            ids.insert(engine.submit(r)?, next);
            next += 1;
        }
        if engine.is_idle() {
            break;
        }
        for c in engine.step()? {
            let i = ids.remove(&c.id).expect("a submitted request");
            out[i] = Some(c);
        }
    }
    Ok(out
        .into_iter()
        .map(|c| c.expect("every request completes"))
        .collect())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let tok = Arc::new(Tokenizer::from_gguf(&args.model)?);
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let mut results = Vec::new();
    println!(
        "device: {} µs a pass + {} µs a token; {} repeats, medians",
        args.pass_us, args.token_us, args.repeats
    );
    println!(
        "{:>5} {:>4}  {:>6}  {:>8}  {:>10}  {:>9}  {:>8}  {:>12}  {:>13}  {:>8}  {:>9}  {:>7}  {:>4}",
        "batch",
        "mode",
        "steps",
        "step ms",
        "device ms",
        "step/dev",
        "mask µs",
        "mask wait µs",
        "host ms/step",
        "pick ms",
        "budget µs",
        "redraws",
        "cut"
    );
    for &b in &args.batch {
        let docs = if args.feed > 0 {
            quarry_bench::fed_documents(&args.status, args.feed)?
        } else {
            bench::package_records(&args.status, b.max(16))?
        };
        for mode in &args.modes {
            let mut runs = Vec::new();
            let device = Arc::new(Device::new(
                tok.vocab_size(),
                Duration::from_micros(args.pass_us),
                Duration::from_micros(args.token_us),
            ));
            let cfg = EngineConfig {
                max_running: b,
                step_tokens: args.step_tokens.max(b),
                kv_tokens: (b * (1024 + args.max_tokens)).max(16_384),
                jump_forward: mode != "b",
                ..EngineConfig::default()
            };
            // One engine per batch size and mode, started over between runs (its grammar and
            // masks warm), as `quarry bench` runs; `--cold`: a new engine every run.
            let mut kept: Option<Engine> = None;
            for _ in 0..args.repeats {
                device.reset();
                let mut engine = match kept.take().filter(|_| !args.cold) {
                    Some(mut e) => {
                        e.start_over()?;
                        e
                    }
                    None => Engine::new(device.clone(), tok.clone(), cfg.clone())?,
                };
                let constraint = (mode != "a").then_some(&schema);
                let reqs = bench::requests(&docs, constraint, args.max_tokens);
                let t = Instant::now();
                let out = if args.feed > 0 {
                    run_fed(&mut engine, reqs, 2 * b)?
                } else {
                    engine.run_batch(reqs)?
                };
                let wall = t.elapsed().as_secs_f64();
                let s = engine.stats();
                let passes = s.forward_passes.max(1) as f64;
                let device_s = device.device_s();
                let pick_s = device.pick_s();
                let cut = out
                    .iter()
                    .filter(|c| c.finish == FinishReason::Length)
                    .count();
                runs.push(json!({
                    "wall_s": wall,
                    "passes": s.forward_passes,
                    "step_ms": 1e3 * wall / passes,
                    "device_ms": 1e3 * device_s / passes,
                    // 0 with a device that costs nothing.
                    "step_over_device": if device_s > 0.0 { wall / device_s } else { 0.0 },
                    "mask_us": s.mask_us_per_step(),
                    "mask_wait_us": s.mask_wait_us_per_step(),
                    "host_ms": 1e3 * (wall - device_s).max(0.0) / passes,
                    // The double's picks, which a GPU's sampler makes on the device; the host's
                    // own time a step is `host_ms - pick_ms`.
                    "pick_ms": 1e3 * pick_s / passes,
                    "engine_host_ms": 1e3 * (wall - device_s - pick_s).max(0.0) / passes,
                    // The budget's draws again, a step, on the step's path (not beside it).
                    "budget_us": 1e6 * s.budget_s / passes,
                    "redraws": s.budget_redraws,
                    "fits_beside": s.budget_fits_beside,
                    "redraws_beside": s.budget_redraws_beside,
                    "forced_share": s.forced_share(),
                    "cut_at_max_tokens": cut,
                    "docs": out.len(),
                "docs_per_s": out.len() as f64 / wall,
                    // Runs of the same outputs have the same hash (`--cold` or not).
                    "outputs_hash": out.iter().fold(0, |h, c| {
                        c.tokens.iter().fold(mix(h, c.tokens.len() as u64), |h, &t| mix(h, t.into()))
                    }),
                }));
                kept = Some(engine);
            }
            let med = |k: &str| median(runs.iter().map(|r| r[k].as_f64().unwrap()).collect());
            println!(
                "{b:>5} {mode:>4}  {:>6.0}  {:>8.2}  {:>10.2}  {:>9.2}  {:>8.0}  {:>12.0}  {:>13.2}  {:>8.2}  {:>9.0}  {:>7.0}  {:>4.0}",
                med("passes"),
                med("step_ms"),
                med("device_ms"),
                med("step_over_device"),
                med("mask_us"),
                med("mask_wait_us"),
                med("engine_host_ms"),
                med("pick_ms"),
                med("budget_us"),
                med("redraws"),
                med("cut_at_max_tokens"),
            );
            results.push(json!({"batch": b, "mode": mode, "runs": runs}));
        }
    }
    if let Some(out) = &args.out {
        std::fs::write(
            out,
            serde_json::to_string_pretty(&json!({
                "bench": "overlap-bench",
                "pass_us": args.pass_us,
                "token_us": args.token_us,
                "max_tokens": args.max_tokens,
                "cold": args.cold,
                "feed": args.feed,
                "step_tokens": args.step_tokens,
                "results": results,
            }))?,
        )?;
    }
    Ok(())
}
