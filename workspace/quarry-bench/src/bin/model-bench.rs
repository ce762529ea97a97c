//! Model runtime throughput, quarry vs llama.cpp, on the same GGUF, token ids and thread count.
//!
//! Measures, each as the median of `--repeats` runs:
//! - prefill tokens/s: one `--prefill`-token prompt into an empty cache;
//! - decode tokens/s at batch 1, 8 and 32: B sequences, each with its own 64-token prompt
//!   (prefilled untimed), then `--steps` greedy steps of one token per sequence.
//!
//! The prompts are real text: the 1,100-token Apache License prompt of the model fixtures. llama.cpp
//! runs in a child process (`scripts/llama_cpp_model_bench.py` under the reference venv).

use quarry_bench::median;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use quarry_model::{argmax, KvPool, Llama, Logits, SeqInput};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Python with llama-cpp-python (the `make fixtures` venv); `none` skips llama.cpp.
    #[arg(long, env = "LLAMA_PYTHON")]
    llama_python: Option<String>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    #[arg(long, default_value_t = 64)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // candle's CPU worker pool reads this before its first matmul.
    std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = long_prompt(&root, &args.model)?;
    if text.len() < args.prefill {
        bail!(
            "the fixture prompt has {} tokens, fewer than --prefill",
            text.len()
        );
    }
    let prefill_tokens = text[..args.prefill].to_vec();
    let max_b = args.batches.iter().copied().max().unwrap_or(1);
    let decode_prompts: Vec<Vec<u32>> = (0..max_b)
        .map(|s| text[(s * 16) % (text.len() - 64)..][..64].to_vec())
        .collect();

    let quarry = run_quarry(&args, &prefill_tokens, &decode_prompts)?;
    let llama = match args.llama_python.as_deref() {
        Some("none") => Value::Null,
        other => {
            let py = other.map(str::to_owned).unwrap_or_else(|| {
                let cache = std::env::var("QUARRY_CACHE").unwrap_or_else(|_| {
                    format!("{}/.cache/quarry", std::env::var("HOME").unwrap())
                });
                format!("{cache}/refvenv/bin/python")
            });
            run_llama(&args, &py, &root, &prefill_tokens, &decode_prompts)?
        }
    };
    let mut rows = vec![("prefill_tok_s".to_string(), "prefill".to_string())];
    for b in &args.batches {
        rows.push((format!("decode_b{b}_tok_s"), format!("decode, batch {b}")));
    }
    println!(
        "{:<20} {:>12} {:>12} {:>8}",
        "tokens/s", "quarry", "llama.cpp", "ratio"
    );
    for (key, label) in &rows {
        let q = quarry[key].as_f64().unwrap_or(f64::NAN);
        let l = llama[key].as_f64().unwrap_or(f64::NAN);
        println!("{label:<20} {q:>12.1} {l:>12.1} {:>7.2}x", q / l);
    }
    let single = quarry["decode_b1_tok_s"].as_f64();
    if let (Some(s), Some(b32)) = (single, quarry["decode_b32_tok_s"].as_f64()) {
        println!("quarry batch-32 / single-stream decode: {:.2}x", b32 / s);
    }
    let result = json!({
        "date": std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d").output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default(),
        "model": args.model.file_name().map(|f| f.to_string_lossy().to_string()),
        "threads": args.threads,
        "prefill_tokens": args.prefill,
        "steps": args.steps,
        "repeats": args.repeats,
        "quarry": quarry,
        "llama_cpp": llama,
    });
    if let Some(out) = &args.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, serde_json::to_string_pretty(&result)?)?;
    }
    Ok(())
}

/// The long prompt's token ids from the model fixture made for `model` (SmolLM2's, Gemma 3's or
/// Qwen2.5's: token ids belong to one vocabulary).
fn long_prompt(root: &std::path::Path, model: &std::path::Path) -> Result<Vec<u32>> {
    let file_name = model.file_name().map(|f| f.to_string_lossy().to_string());
    let mut fx = None;
    for name in [
        "smollm2.logits.json.gz",
        "gemma3.logits.json.gz",
        "qwen25.logits.json.gz",
    ] {
        let path = root.join("tests/fixtures/model").join(name);
        let file = std::fs::File::open(&path).with_context(|| path.display().to_string())?;
        let v: Value = serde_json::from_reader(flate2::read::GzDecoder::new(file))?;
        if v["model"].as_str().map(str::to_string) == file_name {
            fx = Some(v);
            break;
        }
    }
    let Some(fx) = fx else {
        bail!(
            "no model fixture was made for {}: the benchmark prompts are token ids of SmolLM2-135M-Instruct.Q4_1.gguf, gemma-3-270m-q4_k_m.gguf or qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            model.display()
        );
    };
    let case = fx["cases"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "long_apache_license"))
        .context("no long prompt in the fixture")?;
    Ok(case["tokens"]
        .as_array()
        .context("tokens")?
        .iter()
        .filter_map(|v| v.as_u64().map(|x| x as u32))
        .collect())
}

fn run_quarry(args: &Args, prefill: &[u32], prompts: &[Vec<u32>]) -> Result<Value> {
    let dev = candle_core::Device::Cpu;
    // The QUARRY_* model runtime variables, as `quarry` reads them.
    let mut options = quarry_model::ModelOptions::default();
    options.apply_vars(|k| std::env::var(k).ok())?;
    let model = Llama::load_with(&args.model, &dev, &options)?;
    let page = 16;
    let max_b = prompts.len();
    let per_seq = (64 + args.steps).div_ceil(page);
    let pages = (max_b * per_seq).max(prefill.len().div_ceil(page));
    let dtype = quarry_model::kv_dtype(&dev, options.kv_dtype);
    let mut pool = KvPool::with_dtype(model.config(), page, pages, &dev, None, dtype)?;
    let mut out = Logits::new();
    let mut result = serde_json::Map::new();
    result.insert(
        "generator".into(),
        json!(format!("quarry {}", env!("CARGO_PKG_VERSION"))),
    );

    let mut runs = Vec::new();
    for _ in 0..args.repeats {
        let mut table = Vec::new();
        assert!(pool.alloc_into(prefill.len().div_ceil(page), &mut table));
        let t = Instant::now();
        model.forward(&[SeqInput::new(prefill, 0, &table)], &mut pool, &mut out)?;
        argmax(out.last(0));
        runs.push(prefill.len() as f64 / t.elapsed().as_secs_f64());
        for p in table {
            pool.free(p)?;
        }
    }
    result.insert("prefill_tok_s".into(), json!(median(runs)));

    for &b in &args.batches {
        let mut runs = Vec::new();
        for _ in 0..args.repeats {
            let tables: Vec<Vec<u32>> = (0..b)
                .map(|_| {
                    let mut t = Vec::new();
                    assert!(pool.alloc_into(per_seq, &mut t));
                    t
                })
                .collect();
            let mut next = Vec::with_capacity(b);
            for (s, p) in prompts[..b].iter().enumerate() {
                model.forward(&[SeqInput::new(p, 0, &tables[s])], &mut pool, &mut out)?;
                next.push(argmax(out.last(0)).context("no token")?);
            }
            let t = Instant::now();
            for step in 0..args.steps {
                let toks = next.clone();
                let batch: Vec<SeqInput> = (0..b)
                    .map(|s| SeqInput::new(&toks[s..=s], 64 + step, &tables[s]))
                    .collect();
                model.forward(&batch, &mut pool, &mut out)?;
                for (s, n) in next.iter_mut().enumerate() {
                    *n = argmax(out.last(s)).context("no token")?;
                }
            }
            runs.push((b * args.steps) as f64 / t.elapsed().as_secs_f64());
            for t in tables {
                for p in t {
                    pool.free(p)?;
                }
            }
        }
        result.insert(format!("decode_b{b}_tok_s"), json!(median(runs)));
    }
    Ok(Value::Object(result))
}

fn run_llama(
    args: &Args,
    python: &str,
    root: &std::path::Path,
    prefill: &[u32],
    prompts: &[Vec<u32>],
) -> Result<Value> {
    let script = root.join("workspace/quarry-bench/scripts/llama_cpp_model_bench.py");
    let job = json!({
        "model": root.join(&args.model).canonicalize().unwrap_or(args.model.clone()),
        "threads": args.threads,
        "prefill_tokens": prefill,
        "decode_prompts": prompts,
        "steps": args.steps,
        "batches": args.batches,
        "repeats": args.repeats,
    });
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // llama.cpp logs every tensor it loads; keep it for the error message only.
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {python} (set --llama-python, or `none` to skip)"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(job.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        bail!(
            "llama.cpp bench failed with {}: {}",
            out.status,
            tail.join(" | ")
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
