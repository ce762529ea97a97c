//! `quarry bench`: the throughput benchmark users run to compare devices. It extracts JSON from
//! real documents with the package schema at each batch size of a sweep, on a fresh engine per
//! run, and prints one table (medians over `--repeats`) plus a JSON file with every run.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use quarry_engine::EngineConfig;
use quarry_eval::{self as bench, RunMetrics};
use serde_json::{json, Value};

use crate::ModelArg;

#[derive(Args)]
#[command(after_help = "Examples:
  quarry bench                                      # CPU, batch sizes 1, 8 and 32
  quarry bench --device cuda:0 --batch 1,16,64,128 --docs 256
  quarry bench --docs 8 --batch 4 --repeats 3 --out cpu.json
  quarry bench --device cuda:0 --batch 1,64 --modes a,b,c    # what constraints and jump-forward cost
  quarry bench --input my-docs.jsonl --schema schemas/my-schema.json
  quarry bench --dummy-weights llama3.1-8b --modes a --batch 1 --max-tokens 16   # an 8B shape, random weights

The documents are Debian package records from /var/lib/dpkg/status (real text, the same on every
Debian or Ubuntu machine of a release), or --input, a JSONL file of {\"text\": …} objects. Every
prompt starts with the same instruction of about 300 tokens; outputs are constrained by --schema
and checked with the jsonschema crate. The runs of a batch size and mode share one engine, started
over between them (the prefix cache emptied, the grammar and its masks kept: a long job's steady
state); --cold gives every run a new engine. Columns:
  docs/s, output tok/s  over the wall time of the run
  TPOT ms               median time per output token after the first, per request
  TTFT ms               median time from admission to the first output token (prefill)
  mask µs               constraint mask time per engine step
  forced                share of output tokens jump-forward appended without sampling
  cache hit             share of prompt tokens served by the radix cache
  valid                 outputs that parse and pass the schema
  fwd ms/pass           model time per forward pass
The table goes to stdout, every run as JSON to --out.")]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    runtime: crate::RuntimeArgs,
    /// `cpu`, or `cuda:N` in a build with CUDA (`make build-cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Batch sizes to sweep (sequences decoding at once), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batch: Vec<usize>,
    /// Documents per run.
    #[arg(long, default_value_t = 32)]
    docs: usize,
    /// Runs per batch size; the table shows the run with the median docs/s.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Output tokens at most per document.
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// JSON Schema the outputs must follow.
    #[arg(long, default_value = "schemas/debian-package.json")]
    schema: PathBuf,
    /// Debian package database to take documents from.
    #[arg(long, default_value = "/var/lib/dpkg/status", conflicts_with = "input")]
    status: PathBuf,
    /// A JSONL file of {"text": …} documents instead of the package database.
    #[arg(long, value_name = "FILE.jsonl")]
    input: Option<PathBuf>,
    /// Tokens per forward pass (0: 512, or the batch size when larger).
    #[arg(long, default_value_t = 0)]
    step_tokens: usize,
    /// Modes to run at each batch size: `c` the schema with jump-forward (quarry's default), `b`
    /// the schema without jump-forward, `a` no constraint (the prompt alone asks for JSON).
    #[arg(long, value_delimiter = ',', default_value = "c", value_parser = ["a", "b", "c"])]
    modes: Vec<String>,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the JSON results go (default: quarry-bench-<device>-<time>.json here).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Time each phase of the forward pass on a GPU (norms, projections, RoPE, KV writes,
    /// attention, …), synchronizing the device after each: the runs get slower, the split shows
    /// where a pass's time goes. Printed per run and written to the JSON as `profile` (also
    /// `--runtime profile=on`). The CPU's forward pass (the host layout) is not split.
    #[arg(long)]
    profile: bool,
    /// A new engine for every run: each run compiles the constraint and fills its masks
    /// afresh, as a job's first documents do. By default the runs of a batch size and mode share
    /// one engine, started over between them (its prefix cache emptied, its counters zeroed, its
    /// grammar and masks kept: `Engine::start_over`), as a long job's later documents run; the
    /// first run is cold either way.
    #[arg(long)]
    cold: bool,
    /// Records that always close off (`close_within_budget`, docs/budget.md): constrained
    /// outputs may end cut at `--max-tokens`, for before/after comparisons.
    #[arg(long)]
    no_budget: bool,
    /// Random weights in a real model's shape instead of `--model`'s (speed does not depend on
    /// the values): llama3.1-8b, llama3.2-3b, qwen2.5-7b, qwen3-8b,
    /// qwen2.5-1.5b, mistral-nemo-12b, gemma3-12b, gemma3-27b, or a config.json path.
    /// Quantized Q4_1 on a CPU, Q8_0 (with f16 copies) on a GPU; the tokenizer is
    /// `--dummy-tokenizer`'s, whose vocabulary the output projection takes. Outputs are random
    /// text, so use mode a (`--modes a`), where each runs to `--max-tokens`.
    #[arg(long, value_name = "SHAPE")]
    dummy_weights: Option<String>,
    /// Also write the `--dummy-weights` model (the same weights, format and tokenizer) as a GGUF
    /// file here, for llama.cpp's `llama-batched-bench` to run beside it.
    #[arg(long, value_name = "FILE.gguf", requires = "dummy_weights")]
    dummy_gguf: Option<PathBuf>,
    /// The model file whose tokenizer a `--dummy-weights` model runs with.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )]
    dummy_tokenizer: PathBuf,
}

pub(crate) fn run(args: BenchArgs) -> Result<()> {
    if args.batch.is_empty() || args.batch.contains(&0) {
        bail!("--batch needs batch sizes of at least 1, e.g. --batch 1,8,32");
    }
    if args.repeats == 0 || args.max_tokens == 0 {
        bail!("--repeats and --max-tokens must be at least 1");
    }
    if let Some(t) = args.threads {
        // Read by the CPU kernels' thread pools when they first start, which is after this.
        std::env::set_var("RAYON_NUM_THREADS", t.to_string());
    }
    let schema_text = std::fs::read_to_string(&args.schema)
        .with_context(|| format!("reading the schema {}", args.schema.display()))?;
    let schema: Value = serde_json::from_str(&schema_text)
        .with_context(|| format!("{} is not JSON", args.schema.display()))?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| anyhow::anyhow!("{}: not a valid JSON Schema: {e}", args.schema.display()))?;
    let docs = match &args.input {
        Some(path) => bench::jsonl_records(path, args.docs)?,
        None => bench::package_records(&args.status, args.docs)?,
    };
    let mut options = args.runtime.options()?;
    // Profiling starts at load; the warm-up's phases are dropped below.
    options.profile |= args.profile;
    let (
        crate::Loaded {
            model,
            tokenizer: tok,
        },
        dummy,
    ) = match &args.dummy_weights {
        None => (
            crate::load_model(&args.model.model, &args.device, options)?,
            None,
        ),
        Some(shape) => {
            let (loaded, shape) = load_dummy(shape, &args.dummy_tokenizer, &args.device, &options)?;
            if let Some(path) = &args.dummy_gguf {
                quarry_model::dummy::write_gguf(
                    &shape,
                    &args.dummy_tokenizer,
                    loaded.model.device(),
                    path,
                )
                .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("dummy weights written to {} for llama.cpp", path.display());
            }
            (loaded, Some(shape))
        }
    };
    let longest_prompt = bench::requests(&docs, None, 1)
        .iter()
        .map(|r| match &r.prompt {
            quarry_engine::Prompt::Chat(m) => {
                Ok(tok.encode_chat(&tok.apply_chat_template(m, true)?)?)
            }
            quarry_engine::Prompt::Text(t) => Ok(tok.encode(t)?),
        })
        .map(|ids: Result<Vec<u32>>| Ok(ids?.len()))
        .collect::<Result<Vec<usize>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    let config = |batch: usize, jump_forward: bool| {
        let d = EngineConfig::default();
        EngineConfig {
            max_running: batch,
            step_tokens: if args.step_tokens > 0 {
                args.step_tokens
            } else {
                d.step_tokens.max(batch)
            },
            // Room for every running sequence's whole prompt and output, so the sweep measures
            // batching rather than eviction.
            kv_tokens: d
                .kv_tokens
                .max(batch * (longest_prompt + args.max_tokens + 16)),
            jump_forward,
            close_within_budget: !args.no_budget,
            ..d
        }
    };
    // On a GPU: the positions its free memory holds after the weights, and so the largest batch
    // at this job's context (each document's prompt and output).
    let kv_dtype = quarry_model::kv_dtype(model.device(), model.options().kv_dtype);
    let kv_capacity = quarry_model::KvPool::gpu_capacity(
        model.config(),
        model.device(),
        kv_dtype,
        quarry_engine::KV_PAGE_SIZE,
    )?;
    let per_doc = longest_prompt + args.max_tokens + 16;
    if let Some(tokens) = kv_capacity {
        eprintln!(
            "KV capacity: {tokens} positions in the free GPU memory; at {per_doc} a document, \
             batches up to {} fit",
            tokens / per_doc
        );
        if let Some(&b) = args.batch.iter().find(|&&b| b * per_doc > tokens) {
            bail!(
                "batch {b} needs {} positions of keys and values, over the {tokens} the GPU's free \
                 memory holds: the largest batch at {per_doc} positions a document is {}",
                b * per_doc,
                tokens / per_doc
            );
        }
    }
    let device_name = describe_device(&args.device);
    eprintln!(
        "{} documents (longest prompt {longest_prompt} tokens) on {} ({device_name}); warming up",
        docs.len(),
        args.device
    );
    // Kernel loading and first-touch allocation stay out of the numbers.
    let warm = bench::requests(&docs[..docs.len().min(2)], Some(&schema), 8);
    bench::measure(&model, &tok, config(2, true), warm, &validator)?;
    quarry_model::profile::take();

    let mut results = Vec::new();
    for &b in &args.batch {
        for mode in &args.modes {
            let constrained = mode != "a";
            let (mut runs, mut profiles) = (Vec::new(), Vec::new());
            let graphs_before = model.cuda_graphs();
            // Graphs captured in each run: the first run of a pool's shape captures its steps'
            // keys, and the runs after replay them on the same pool (`Llama::kv_pool`), as a
            // long job's steps do.
            let mut captured_per_run = Vec::new();
            // One engine per batch size and mode, started over between runs (its grammar and
            // masks warm, its prefix cache empty), unless every run is to start cold.
            let mut engine = None;
            for rep in 0..args.repeats {
                let reqs = bench::requests(&docs, constrained.then_some(&schema), args.max_tokens);
                let run_before = model.cuda_graphs();
                let warm = match engine.as_mut().filter(|_| !args.cold) {
                    Some(e) => {
                        quarry_engine::Engine::start_over(e)?;
                        true
                    }
                    None => {
                        engine = Some(quarry_engine::Engine::new(
                            model.clone(),
                            tok.clone(),
                            config(b, mode != "b"),
                        )?);
                        false
                    }
                };
                let e = engine.as_mut().expect("made above");
                let m = bench::measure_on(e, reqs, &validator)?;
                captured_per_run.push(model.cuda_graphs().since(&run_before).captured);
                eprintln!(
                    "batch {b} mode {mode} run {} ({}): {:.3} docs/s, {:.1} output tok/s",
                    rep + 1,
                    if warm { "started over" } else { "new engine" },
                    m.docs_per_s,
                    m.output_tokens_per_s
                );
                if quarry_model::profile::enabled() {
                    let kinds = quarry_model::profile::take();
                    print_profile(&kinds);
                    profiles.push(json!(kinds));
                }
                runs.push(m);
            }
            // The CUDA graphs over these runs (quarry_model::step_graph): passes replayed
            // against every pass on the GPU, what the kept graphs hold, the padding computed.
            let g = model.cuda_graphs().since(&graphs_before);
            let graphs = json!({
                "enabled": g.enabled,
                "captured": g.captured,
                "captured_per_run": captured_per_run,
                "replayed": g.replayed,
                "eager": g.eager,
                "replay_share": g.replay_share(),
                "evicted": g.evicted,
                "graphs": g.graphs,
                "bytes": g.bytes,
                "padded_tokens": g.padded_tokens,
                "real_tokens": g.real_tokens,
                "failed": g.failed,
            });
            if g.enabled {
                eprintln!(
                    "batch {b} mode {mode}: CUDA graphs replayed {} of {} passes ({:.1}%), {} \
                     captured ({captured_per_run:?} by run), {} kept ({:.1} MiB), padding {:.1}% \
                     of graphed tokens",
                    g.replayed,
                    g.replayed + g.captured + g.eager,
                    100.0 * g.replay_share(),
                    g.captured,
                    g.graphs,
                    g.bytes as f64 / (1 << 20) as f64,
                    100.0 * g.padded_tokens as f64
                        / (g.padded_tokens + g.real_tokens).max(1) as f64,
                );
            }
            results.push((b, mode.clone(), runs, profiles, graphs));
        }
    }
    print_table(
        &results
            .iter()
            .map(|(b, m, r, _, _)| (*b, m.clone(), r.clone()))
            .collect::<Vec<_>>(),
    )?;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "quarry-bench-{}-{}.json",
            args.device.replace(':', ""),
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
        ))
    });
    let doc = json!({
        "bench": "quarry bench",
        "quarry_version": env!("CARGO_PKG_VERSION"),
        "date": chrono::Utc::now().to_rfc3339(),
        "device": args.device,
        "device_name": device_name,
        "threads": args.threads,
        "model": match &dummy {
            Some(_) => "dummy weights".to_string(),
            None => args.model.model.display().to_string(),
        },
        "dummy_weights": dummy.as_ref().map(|s| json!({
            "shape": s.name,
            "parameters": s.parameters(),
            "format": format!("{:?}", quarry_model::DummyShape::format(model.device())),
            "vocabulary": s.config.vocab_size,
            "published_vocabulary": s.published_vocab,
            "tokenizer": args.dummy_tokenizer.display().to_string(),
        })),
        "schema": args.schema.display().to_string(),
        "documents": args.input.as_ref().unwrap_or(&args.status).display().to_string(),
        "docs": docs.len(),
        "longest_prompt_tokens": longest_prompt,
        "max_tokens": args.max_tokens,
        "close_within_budget": !args.no_budget,
        "model_runtime": model.options(),
        "gpu_weights": model.gpu_weights(),
        "host_weights": model.host_weights(),
        "kv_capacity_tokens": kv_capacity,
        "largest_batch": kv_capacity.map(|t| t / per_doc),
        "modes": {"a": "no constraint", "b": "schema, no jump-forward", "c": "schema + jump-forward"},
        "repeats": args.repeats,
        // Whether every run had a new engine (`--cold`), or the runs after the first of each
        // batch size and mode ran on it started over.
        "cold": args.cold,
        "results": results.iter().map(|(b, mode, runs, profiles, graphs)| {
            let mut r = json!({
                "batch": b,
                "mode": mode,
                "median": bench::median_run(runs),
                "runs": runs,
                "cuda_graphs": graphs,
            });
            if !profiles.is_empty() {
                // Per run and pass kind (decode, multi-token): passes, tokens, each phase's marks and
                // seconds (QUARRY_PROFILE, quarry_model::profile).
                r["profile"] = json!(profiles);
            }
            r
        }).collect::<Vec<_>>(),
    });
    write_json(&out, &doc)?;
    eprintln!("results: {}", out.display());
    Ok(())
}

fn print_table(results: &[(usize, String, Vec<RunMetrics>)]) -> Result<()> {
    let mut w = std::io::stdout().lock();
    writeln!(
        w,
        "{:>5} {:>4}  {:>8}  {:>12}  {:>8}  {:>9}  {:>9}  {:>10}  {:>7}  {:>9}  {:>7}  {:>5}  {:>6}  {:>11}  {:>12}  {:>12}",
        "batch",
        "mode",
        "docs/s",
        "output tok/s",
        "TPOT ms",
        "TTFT ms",
        "mask µs",
        "mask wait",
        "forced",
        "cache hit",
        "valid",
        "cut",
        "closed",
        "fwd ms/pass",
        "draw ms/pass",
        "host ms/pass"
    )?;
    for (b, mode, runs) in results {
        let Some(m) = bench::median_run(runs) else {
            continue;
        };
        let per_pass = |s: f64| 1e3 * s / m.forward_passes.max(1) as f64;
        writeln!(
            w,
            "{b:>5} {mode:>4}  {:>8.3}  {:>12.1}  {:>8.2}  {:>9.1}  {:>9.0}  {:>10.0}  {:>6.1}%  {:>8.1}%  {:>3}/{:<3}  {:>5}  {:>6}  {:>11.2}  {:>12.2}  {:>12.2}",
            m.docs_per_s,
            m.output_tokens_per_s,
            m.tpot_ms,
            m.ttft_ms,
            m.mask_us_per_step,
            m.mask_wait_us_per_step,
            100.0 * m.forced_share,
            100.0 * m.hit_rate,
            m.schema_valid,
            m.docs,
            m.cut_at_max_tokens,
            m.budget_closed,
            per_pass(m.forward_s),
            per_pass(m.sample_s),
            per_pass(m.host_s)
        )?;
    }
    Ok(())
}

/// One profiled run's phases, a table per pass kind (decode steps apart from prefill chunks and
/// extensions): time per pass of that kind and share of its profiled time, largest first.
fn print_profile(kinds: &[quarry_model::profile::PassTotals]) {
    if kinds.is_empty() {
        eprintln!("  (no phases: profiling splits the tensor forward pass, a GPU's)");
        return;
    }
    for kind in kinds {
        let total: f64 = kind.phases.iter().map(|p| p.seconds).sum();
        eprintln!(
            "  {} passes: {} ({:.1} tokens a pass), {:.3} ms a pass profiled",
            kind.pass.name(),
            kind.passes,
            kind.tokens as f64 / kind.passes.max(1) as f64,
            1e3 * total / kind.passes.max(1) as f64
        );
        let mut sorted: Vec<_> = kind.phases.iter().collect();
        sorted.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        eprintln!(
            "  {:<24} {:>10} {:>12} {:>7}",
            "phase", "marks", "ms/pass", "share"
        );
        for p in sorted {
            eprintln!(
                "  {:<24} {:>10} {:>12.3} {:>6.1}%",
                p.phase,
                p.calls,
                1e3 * p.seconds / kind.passes.max(1) as f64,
                100.0 * p.seconds / total.max(1e-12)
            );
        }
    }
}

fn write_json(path: &Path, doc: &Value) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// What the device is, for the results file: the CPU model, or the GPU's name and driver as
/// `nvidia-smi` reports them.
fn describe_device(device: &str) -> String {
    if let Some(n) = device.strip_prefix("cuda:") {
        let out = std::process::Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
                "-i",
                n,
            ])
            .output();
        return match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => device.to_string(),
        };
    }
    let cpu = bench::cpu_model().unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores")
}

/// A `--dummy-weights` model ([`quarry_model::dummy`]): `tokenizer`'s tokenizer, the shape with
/// its vocabulary, random weights on `device`; said once on stderr.
fn load_dummy(
    shape: &str,
    tokenizer: &std::path::Path,
    device: &str,
    options: &quarry_model::ModelOptions,
) -> Result<(crate::Loaded, quarry_model::DummyShape)> {
    let tok = crate::load_tokenizer(tokenizer)?;
    let shape = quarry_model::DummyShape::resolve(shape, tok.vocab_size())?;
    let dev = quarry_model::parse_device(device)?;
    let started = std::time::Instant::now();
    let model = quarry_model::Llama::dummy(&shape, &dev, options)?;
    crate::say_weights(&model);
    eprintln!(
        "dummy weights: {} ({:.2} B parameters, {:?}; vocabulary {} of {}'s tokenizer, the \
         published model's is {}), built in {:.1} s",
        shape.name,
        shape.parameters() as f64 / 1e9,
        quarry_model::DummyShape::format(&dev),
        shape.config.vocab_size,
        tokenizer.display(),
        shape.published_vocab,
        started.elapsed().as_secs_f64()
    );
    Ok((
        crate::Loaded {
            model: std::sync::Arc::new(model),
            tokenizer: std::sync::Arc::new(tok),
        },
        shape,
    ))
}
