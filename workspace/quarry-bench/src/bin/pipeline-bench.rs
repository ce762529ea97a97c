//! Pipeline overhead: the same documents and prompts through (1) the engine alone
//! (`Engine::run_batch`, results kept in memory) and (2) the whole dataset job (JSONL shards read
//! from disk, validation, Arrow, Parquet with zstd, create-if-absent publish of accepted and
//! rejects). Runs alternate, each on a fresh engine (empty prefix cache); medians are reported.
//! Target: the pipeline within 3% of the engine's docs/s. Both take the KV pool and pass sizes
//! the job takes on its device ([`quarry_engine::BatchSizes`]); `--device cuda:0` (a build with
//! the `cuda` feature) measures the job on a GPU, where the engine's steps are short and the
//! job's own work shows.
//!
//! `--double` runs both against the device double of `overlap-bench` (a GPU's step times on this
//! host, with the job's tokenizer), `--shard-docs` splits the documents into shards of that many
//! (`--text`: one file a document, that many files a shard),
//! and `--store-latency-ms` makes every call to the input and output stores take that long (as
//! an object store's requests do), so what the job's reads and publishes cost a GPU shows here.
//!
//! `--parquet-rows N` writes the shards as Parquet (row groups of N rows) instead of JSONL.
//!
//! `--job-only` skips the engine-alone runs (which hold every request in memory) and reports the
//! job's memory: the process's peak resident set (`VmHWM`, reset before the first run) above its
//! resident set before that run, against the input's size on disk (one JSONL shard unless `--shard-docs` splits it).
//!
//! `--kafka-partitions N` runs a Kafka worker instead of the dataset job: the documents are
//! produced, as JSON values, round-robin to a topic of N partitions on librdkafka's in-process
//! mock cluster, and the worker publishes a file every `--shard-docs` documents of a partition.
//! Its rate leaves out the group join (until the first message), the one idle second that stops
//! it, and the broker round trips of its stop.

use quarry_bench::double::Device;
use quarry_bench::{fed_documents, median, package_records};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use quarry_engine::{BatchSizes, ConstraintSpec, Engine, EngineConfig, Model, Request};
use quarry_pipeline::config::{InputFormat, SourceConfig};
use quarry_pipeline::extract::{EngineExtractor, PromptBuilder};
use quarry_pipeline::flow::{Flow, Publisher};
use quarry_pipeline::job::Prepared;
use quarry_pipeline::kafka::{Worker, WorkerOptions};
use quarry_pipeline::metrics::Metrics;
use quarry_pipeline::record::{Document, Lineage};
use quarry_pipeline::shutdown::Shutdown;
use quarry_pipeline::store::Location;
use quarry_pipeline::PipelineConfig;
use quarry_tokenizer::Tokenizer;
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
    /// Against the device double instead of the model (its tokenizer only): `--pass-us` per
    /// pass and `--token-us` per new token, sized as a GPU job is.
    #[arg(long)]
    double: bool,
    #[arg(long, default_value_t = 1200)]
    pass_us: u64,
    #[arg(long, default_value_t = 17)]
    token_us: u64,
    /// Documents per input shard (0: all in one).
    #[arg(long, default_value_t = 0)]
    shard_docs: usize,
    /// One document a file (`format = "text"`, `--shard-docs` files a shard) instead of JSONL.
    #[arg(long)]
    text: bool,
    /// Every call to the input and output stores waits this long first.
    #[arg(long, default_value_t = 0)]
    store_latency_ms: u64,
    /// A Kafka worker over a topic of this many partitions instead of the dataset job (0).
    #[arg(long, default_value_t = 0)]
    kafka_partitions: i32,
    /// Only the job (no engine-alone runs), with its peak memory above the process's before it.
    #[arg(long)]
    job_only: bool,
    /// Bytes of an extra field in each JSONL document (`"extra": "xx…"`), which the prompt does
    /// not read: rows with more columns than the text, a large input at the same engine work.
    #[arg(long, default_value_t = 0)]
    extra_bytes: usize,
    /// Parquet shards (zstd, row groups of this many rows) instead of JSONL; their extra field
    /// is letters from a fixed pseudo-random sequence, so it does not compress away.
    #[arg(long)]
    parquet_rows: Option<usize>,
    /// `source.split_bytes`: cut shard files larger than this into parts (0: never).
    #[arg(long)]
    split_bytes: Option<u64>,
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`), where the kernel gives one.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
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
    if let (Some(_), SourceConfig::Dataset(src)) = (args.parquet_rows, &mut cfg.source) {
        src.format = InputFormat::Parquet;
    }
    if let (Some(split), SourceConfig::Dataset(src)) = (args.split_bytes, &mut cfg.source) {
        src.split_bytes = split;
    }
    if let (true, SourceConfig::Dataset(src)) = (args.text, &mut cfg.source) {
        src.format = InputFormat::Text;
        if args.shard_docs > 0 {
            src.text_shard_files = args.shard_docs;
        }
    }
    let job = Prepared::new(cfg)?;
    let docs = if args.double {
        fed_documents(&args.status, args.docs)?
    } else {
        package_records(&args.status, args.docs)?
    };
    let b = &job.cfg.batching;
    if args.double {
        let tok = Arc::new(Tokenizer::from_gguf(job.cfg.model_path())?);
        // Sized as a GPU job: a pool for the whole batch at the job's context.
        let room = b.max_running * 2048;
        let sizes = BatchSizes::for_device(b.max_running, b.kv_tokens, b.step_tokens, Some(room))?;
        let device = Arc::new(Device::new(
            tok.vocab_size(),
            Duration::from_micros(args.pass_us),
            Duration::from_micros(args.token_us),
        ));
        eprintln!(
            "the device double ({} µs a pass + {} µs a token) with {}'s tokenizer; {sizes}",
            args.pass_us,
            args.token_us,
            job.cfg.model_path().display()
        );
        measure(&args, &job, &docs, device, tok, sizes)
    } else {
        let loaded = job.cfg.model_spec().load()?;
        let sizes = loaded.batch_sizes(b.max_running, b.kv_tokens, b.step_tokens)?;
        eprintln!(
            "{} on {}; {sizes}",
            job.cfg.model_path().display(),
            job.cfg.model.device
        );
        measure(&args, &job, &docs, loaded.model, loaded.tokenizer, sizes)
    }
}

/// Documents as one Parquet file (zstd, row groups of `rows`): `id`, `text` and, with
/// `extra` bytes, an `extra` column of letters from a fixed pseudo-random sequence (row `first`
/// on), which zstd cannot squeeze to nothing.
fn parquet_shard(
    ids: &[String],
    texts: &[String],
    first: usize,
    extra: usize,
    rows: usize,
) -> Result<Vec<u8>> {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(StringArray::from(ids.to_vec()))),
        ("text", Arc::new(StringArray::from(texts.to_vec()))),
    ];
    if extra > 0 {
        let letters: Vec<String> = (first..first + ids.len())
            .map(|row| {
                let mut x = row as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
                (0..extra)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (b'a' + (x % 26) as u8) as char
                    })
                    .collect()
            })
            .collect();
        columns.push(("extra", Arc::new(StringArray::from(letters))));
    }
    let batch = RecordBatch::try_from_iter(columns)?;
    Ok(quarry_pipeline::encode::to_parquet(&batch, &[], rows, 1)?.to_vec())
}

/// Every call to `loc`'s store waits `latency` first.
fn slowed(loc: Location, latency: Duration) -> Location {
    if latency.is_zero() {
        return loc;
    }
    let wait = ThrottleConfig {
        wait_delete_per_call: latency,
        wait_get_per_call: latency,
        wait_list_per_call: latency,
        wait_put_per_call: latency,
        ..ThrottleConfig::default()
    };
    let store = Arc::new(ThrottledStore::new(loc.store.clone(), wait));
    loc.with_store(store)
}

fn measure<M: Model + 'static>(
    args: &Args,
    job: &Prepared,
    docs: &[String],
    model: Arc<M>,
    tok: Arc<Tokenizer>,
    sizes: BatchSizes,
) -> Result<()> {
    let b = &job.cfg.batching;
    let ecfg = EngineConfig {
        max_running: b.max_running,
        step_tokens: sizes.step_tokens,
        kv_tokens: sizes.kv_tokens,
        close_within_budget: job.cfg.sampling.close_within_budget,
        ..EngineConfig::default()
    };
    let latency = Duration::from_millis(args.store_latency_ms);
    let work = std::env::temp_dir().join(format!("quarry-pipeline-bench-{}", std::process::id()));
    // With a latency the stores are in memory (object_store's throttle wraps no local files).
    let url = |name: &str| {
        if latency.is_zero() {
            work.join(name).display().to_string()
        } else {
            format!(
                "memory://quarry-pipeline-bench-{}/{name}",
                std::process::id()
            )
        }
    };
    let input = Location::open(&url("in"))?;
    let lines: Vec<String> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut line = json!({"id": i.to_string(), "text": d});
            if args.extra_bytes > 0 {
                line["extra"] = "x".repeat(args.extra_bytes).into();
            }
            line.to_string()
        })
        .collect();
    let per_shard = if args.shard_docs == 0 {
        lines.len().max(1)
    } else {
        args.shard_docs
    };
    if args.text {
        for (i, d) in docs.iter().enumerate() {
            input.publish(&format!("doc-{i:06}.txt"), d.clone().into_bytes().into())?;
        }
    } else if let Some(rows) = args.parquet_rows {
        let ids: Vec<String> = (0..docs.len()).map(|i| i.to_string()).collect();
        for (k, ((ids, texts), first)) in ids
            .chunks(per_shard)
            .zip(docs.chunks(per_shard))
            .zip((0..).step_by(per_shard))
            .enumerate()
        {
            let bytes = parquet_shard(ids, texts, first, args.extra_bytes, rows)?;
            input.publish(&format!("docs-{k:05}.parquet"), bytes.into())?;
        }
    } else {
        for (k, shard) in lines.chunks(per_shard).enumerate() {
            let text = shard.join("\n") + "\n";
            input.publish(&format!("docs-{k:05}.jsonl"), text.into_bytes().into())?;
        }
    }
    let input_bytes: u64 = input.list("")?.iter().map(|m| m.size).sum();
    let input = slowed(input, latency);
    // The peak from here on: writing 5 to clear_refs resets VmHWM to the resident set now (the
    // input's setup above peaked higher than anything the job holds at its start).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = status_kib("VmRSS");

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
    let mut wait_shares = Vec::new();
    for rep in 0..args.repeats {
        let e_wall = if args.job_only {
            engine_rates.push(f64::NAN);
            f64::NAN
        } else {
            let mut engine = Engine::new(model.clone(), tok.clone(), ecfg.clone())?;
            let reqs = requests()?;
            let t = Instant::now();
            let out = engine.run_batch(reqs)?;
            let e_wall = t.elapsed().as_secs_f64();
            engine_rates.push(out.len() as f64 / e_wall);
            e_wall
        };

        let mut publisher = job.publisher(
            Some(&url(&format!("out-{rep}/accepted"))),
            Some(&url(&format!("out-{rep}/rejects"))),
        )?;
        publisher.output = slowed(publisher.output, latency);
        publisher.rejects = slowed(publisher.rejects, latency);
        let extractor = EngineExtractor::new(
            model.clone(),
            tok.clone(),
            ecfg.clone(),
            &job.cfg,
            &job.schema,
        )?;
        let (consumed, accepted, rejected, io_s, wait_s, p_wall) = if args.kafka_partitions > 0 {
            let s = run_worker(
                job,
                &lines,
                per_shard,
                args.kafka_partitions,
                rep,
                extractor,
                &publisher,
            )?;
            let busy =
                s.wall_s - s.first_message_s.unwrap_or(0.0) - KAFKA_IDLE.as_secs_f64() - s.stop_s;
            (
                s.consumed,
                s.accepted,
                s.rejected,
                s.publish_s,
                s.publish_wait_s,
                busy,
            )
        } else {
            let t = Instant::now();
            let s = job.run_dataset_plain(extractor, &input, &publisher)?;
            let p_wall = t.elapsed().as_secs_f64();
            (
                s.consumed,
                s.accepted,
                s.rejected,
                s.io_s,
                s.io_wait_s,
                p_wall,
            )
        };
        pipeline_rates.push(consumed as f64 / p_wall);
        io_shares.push(io_s / p_wall);
        wait_shares.push(wait_s / p_wall);
        eprintln!(
            "rep {rep}: {}pipeline {:.3} docs/s ({p_wall:.1}s; {accepted} accepted, {rejected} rejected; {io_s:.3}s reading and publishing, {wait_s:.3}s of it waited for)",
            if args.job_only {
                String::new()
            } else {
                format!("engine {:.3} docs/s ({e_wall:.1}s), ", engine_rates[rep])
            },
            pipeline_rates[rep]
        );
    }
    let e = median(engine_rates.clone());
    let p = median(pipeline_rates.clone());
    let overhead = 1.0 - p / e;
    if !args.job_only {
        println!("engine alone: {e:.3} docs/s (median of {})", args.repeats);
    }
    println!("pipeline:     {p:.3} docs/s (median of {})", args.repeats);
    let io = median(io_shares.clone());
    if !args.job_only {
        println!(
            "overhead:     {:.1}% in docs/s (target < 3%)",
            overhead * 100.0
        );
    }
    println!(
        "the job's reads, encoding and publishes:  {:.3}% of the job's wall time, beside the loop",
        io * 100.0
    );
    println!(
        "the loop waited for them:                {:.3}% of the job's wall time",
        median(wait_shares.clone()) * 100.0
    );
    let peak_above = status_kib("VmHWM")
        .zip(rss_before)
        .map(|(peak, before)| peak.saturating_sub(before) as f64 / 1024.0);
    let input_mib = input_bytes as f64 / (1 << 20) as f64;
    // The documents as JSON lines: what a Parquet input decodes to.
    let rows_mib = lines.iter().map(|l| l.len() + 1).sum::<usize>() as f64 / (1 << 20) as f64;
    if let (true, Some(mib)) = (args.job_only, peak_above) {
        println!(
            "memory:       peak {mib:.1} MiB above the start, for {input_mib:.1} MiB of input ({:.2}x; {rows_mib:.1} MiB as JSON lines)",
            mib / input_mib
        );
    }
    if let Some(path) = &args.out {
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
            "double": args.double.then(|| json!({"pass_us": args.pass_us, "token_us": args.token_us})),
            "shard_docs": per_shard,
            "text_files": args.text,
            "store_latency_ms": args.store_latency_ms,
            "kafka_partitions": args.kafka_partitions,
            "engine_docs_per_s": engine_rates,
            "pipeline_docs_per_s": pipeline_rates,
            "engine_median": e,
            "pipeline_median": p,
            "overhead": overhead,
            "io_share": io_shares,
            "io_wait_share": wait_shares,
            "job_only": args.job_only,
            "extra_bytes": args.extra_bytes,
            "parquet_rows": args.parquet_rows,
            "split_bytes": args.split_bytes,
            "input_mib": input_mib,
            "rows_mib": rows_mib,
            "peak_mib_above_start": peak_above,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    Ok(())
}

/// How long a benchmark worker waits with nothing to do before it stops.
const KAFKA_IDLE: Duration = Duration::from_secs(1);

/// Produces `lines` round-robin to a fresh topic of `partitions` partitions on an in-process mock
/// cluster and runs a worker over it until it is idle, publishing a file every `file_docs`
/// documents of a partition.
fn run_worker(
    job: &Prepared,
    lines: &[String],
    file_docs: usize,
    partitions: i32,
    rep: usize,
    extractor: EngineExtractor,
    publisher: &Publisher,
) -> Result<quarry_pipeline::kafka::WorkerSummary> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let cluster = rdkafka::mocking::MockCluster::new(1)?;
    let topic = format!("bench-{rep}");
    cluster.create_topic(&topic, partitions, 1)?;
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()?;
    for (i, line) in lines.iter().enumerate() {
        let rec = BaseRecord::<(), str>::to(&topic)
            .partition(i as i32 % partitions)
            .payload(line.as_str());
        producer.send(rec).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let mut cfg = job.cfg.clone();
    cfg.source = serde_json::from_value(json!({
        "kind": "kafka",
        "brokers": cluster.bootstrap_servers(),
        "topic": topic,
        "group": topic,
        "value": "json",
    }))?;
    cfg.batching.file_docs = file_docs;
    let opts = WorkerOptions {
        idle_exit: Some(KAFKA_IDLE),
        ..WorkerOptions::default()
    };
    let mut flow = Flow::new(extractor, job.validator()?);
    let metrics = Metrics::new();
    let s = Worker::new(&cfg, &opts, &mut flow, publisher, &metrics)?
        .run(&Shutdown::manual(), &opts)?;
    anyhow::ensure!(
        s.consumed == lines.len() as u64 && s.lag_total == 0,
        "the worker consumed {} of {} documents and left {} behind",
        s.consumed,
        lines.len(),
        s.lag_total
    );
    Ok(s)
}
