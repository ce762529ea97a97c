//! Scale-out of a dataset job: the same input processed by one `quarry extract` worker
//! and by two (`--shard-index 0/1 --shard-count 2`) started together, each worker pinned to one
//! core (`taskset`) with one compute thread. Repeats alternate the order of the two
//! configurations; every run must publish every shard with every document accounted for.
//!
//! `make bench-workers` (builds the release `quarry` first); results go to BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use quarry_bench::{median, package_records};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// The release `quarry` binary.
    #[arg(long)]
    quarry: PathBuf,
    #[arg(long, default_value = "pipelines/debian-packages.toml")]
    pipeline: PathBuf,
    /// GGUF model (overrides the job's).
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    #[arg(long, default_value = "/var/lib/dpkg/status")]
    status: PathBuf,
    #[arg(long, default_value_t = 24)]
    docs: usize,
    /// JSONL shards the documents are spread over.
    #[arg(long, default_value_t = 12)]
    shards: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Passed to every worker: cut shard files larger than this into parts (`--shards 1` and a
    /// value under the file's size: one large file shared by the workers; 0: never cut).
    #[arg(long)]
    split_bytes: Option<u64>,
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One worker: `quarry extract` on `core`, slice `index` of `count`, into `out`.
fn worker(
    a: &Args,
    input: &Path,
    out: &Path,
    core: usize,
    index: usize,
    count: usize,
) -> Result<Child> {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(core.to_string()).arg(&a.quarry);
    c.args(["extract", "--json", "--pipeline"]).arg(&a.pipeline);
    c.arg("--model").arg(&a.model);
    c.arg("--input").arg(input);
    c.arg("--output").arg(out.join("out"));
    c.arg("--rejects").arg(out.join("rejects"));
    if let Some(split) = a.split_bytes {
        c.arg("--split-bytes").arg(split.to_string());
    }
    c.args([
        "--shard-index",
        &index.to_string(),
        "--shard-count",
        &count.to_string(),
    ]);
    c.env("RAYON_NUM_THREADS", "1")
        .env_remove("JOB_COMPLETION_INDEX")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c.spawn()
        .context("taskset and quarry (util-linux's taskset pins a worker to a core)")
}

/// Runs `count` workers at once (worker i on core i) and returns the wall time and summaries.
fn run(a: &Args, input: &Path, out: &Path, count: usize) -> Result<(f64, Vec<Value>)> {
    let _ = std::fs::remove_dir_all(out);
    let t = Instant::now();
    let children: Vec<Child> = (0..count)
        .map(|i| worker(a, input, out, i, i, count))
        .collect::<Result<_>>()?;
    let mut summaries = Vec::new();
    for c in children {
        let o = c.wait_with_output()?;
        ensure!(o.status.success(), "a worker failed: {}", o.status);
        summaries.push(serde_json::from_slice::<Value>(&o.stdout)?);
    }
    let wall = t.elapsed().as_secs_f64();
    let sum = |k: &str| {
        summaries
            .iter()
            .map(|s| s[k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    // The shards the listing holds: the files, or their parts where they are cut.
    let listed = summaries
        .iter()
        .map(|s| s["shards"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    ensure!(
        sum("shards_done") == listed && sum("consumed") as usize == a.docs,
        "{count} worker(s) published {} of {listed} shards, {} of {} documents",
        sum("shards_done"),
        sum("consumed"),
        a.docs
    );
    Ok((wall, summaries))
}

fn main() -> Result<()> {
    let a = Args::parse();
    ensure!(
        a.docs % a.shards == 0,
        "--docs must be a multiple of --shards"
    );
    let docs = package_records(&a.status, a.docs)?;
    let work = std::env::temp_dir().join(format!("quarry-workers-bench-{}", std::process::id()));
    let input = work.join("in");
    std::fs::create_dir_all(&input)?;
    let per = a.docs / a.shards;
    for (k, chunk) in docs.chunks(per).enumerate() {
        let lines: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(i, d)| json!({"id": format!("{k}-{i}"), "text": d}).to_string())
            .collect();
        std::fs::write(
            input.join(format!("part-{k:03}.jsonl")),
            lines.join("\n") + "\n",
        )?;
    }
    let mut rows = Vec::new();
    for r in 0..a.repeats {
        // Alternate which configuration goes first, so drift favours neither.
        let order: [usize; 2] = if r % 2 == 0 { [1, 2] } else { [2, 1] };
        let mut wall = [0.0f64; 3];
        let mut split = Vec::new();
        for count in order {
            let (w, s) = run(&a, &input, &work.join(format!("out-{count}")), count)?;
            wall[count] = w;
            if count == 2 {
                split = s
                    .iter()
                    .map(|s| json!({"shards": s["shards_done"], "docs": s["consumed"], "wall_s": s["wall_s"]}))
                    .collect();
            }
            eprintln!(
                "repeat {r}: {count} worker(s): {w:.1} s, {:.3} docs/s",
                a.docs as f64 / w
            );
        }
        rows.push(json!({
            "repeat": r,
            "one_worker_s": wall[1],
            "two_workers_s": wall[2],
            "one_worker_docs_per_s": a.docs as f64 / wall[1],
            "two_workers_docs_per_s": a.docs as f64 / wall[2],
            "speedup": wall[1] / wall[2],
            "two_workers_split": split,
        }));
    }
    let med = |k: &str| median(rows.iter().map(|r| r[k].as_f64().unwrap()).collect());
    let cpu = quarry_eval::cpu_model().unwrap_or_default();
    let doc = json!({
        "bench": "workers",
        "date": today(),
        "cpu": cpu,
        "docs": a.docs,
        "shards": a.shards,
        "split_bytes": a.split_bytes,
        "model": a.model,
        "pipeline": a.pipeline,
        "threads_per_worker": 1,
        "runs": rows,
        "median": {
            "one_worker_docs_per_s": med("one_worker_docs_per_s"),
            "two_workers_docs_per_s": med("two_workers_docs_per_s"),
            "speedup": med("speedup"),
        },
    });
    println!(
        "median over {} repeats: 1 worker {:.3} docs/s, 2 workers {:.3} docs/s, {:.2}x",
        a.repeats,
        med("one_worker_docs_per_s"),
        med("two_workers_docs_per_s"),
        med("speedup")
    );
    if let Some(p) = &a.out {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
        eprintln!("results: {}", p.display());
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Today's date (UTC) from `date`, which every machine this runs on has.
fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
