//! `quarry extract` (a dataset job) and `quarry worker` (a Kafka consumer-group member): both
//! run a `pipelines/*.toml` definition through quarry-pipeline.

mod devices;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use quarry_pipeline::dataset::{DatasetJob, DatasetOptions, JobSummary, ShardSlice};
use quarry_pipeline::extract::{EngineExtractor, Extractor};
use quarry_pipeline::flow::Flow;
use quarry_pipeline::job::Prepared;
use quarry_pipeline::kafka::{Worker, WorkerOptions};
use quarry_pipeline::metrics::Metrics;
use quarry_pipeline::shutdown::Shutdown;
use quarry_pipeline::store::Location;
use quarry_pipeline::PipelineConfig;

#[derive(Args, Clone)]
#[command(after_help = "Examples:\n  \
    quarry extract --pipeline pipelines/debian-packages.toml\n  \
    quarry extract --pipeline pipelines/reprocess-s3.toml --input s3://bucket/docs/ --output s3://bucket/out/\n  \
    quarry extract --pipeline pipelines/reprocess-s3.toml --shard-index 1 --shard-count 4\n  \
    quarry extract --pipeline pipelines/reprocess-s3.toml --device cuda:0,cuda:1\n\n\
    A rerun skips shards whose rejects marker is published, so a crashed job resumes.\n\
    Workers split a prefix with no coordinator: worker I of N takes the shards whose stable hash\n\
    (SHA-256 of the shard name) is I modulo N. A Kubernetes Indexed Job sets JOB_COMPLETION_INDEX,\n\
    which is the index when --shard-index is not given. A device list runs one process per device,\n\
    each on its own part of this worker's shards.")]
pub(crate) struct ExtractArgs {
    /// Job definition (TOML, `source.kind = "dataset"`).
    #[arg(long)]
    pipeline: PathBuf,
    /// Input prefix URL (overrides `source.input`).
    #[arg(long)]
    input: Option<String>,
    /// Output prefix URL (overrides `output.url`).
    #[arg(long)]
    output: Option<String>,
    /// Rejects prefix URL (overrides `rejects.url`).
    #[arg(long)]
    rejects: Option<String>,
    /// Process at most N shards (those not yet published; per device with a device list).
    #[arg(long)]
    limit_shards: Option<usize>,
    /// This worker's index among --shard-count workers [default: $JOB_COMPLETION_INDEX, then
    /// source.shard_index, then 0].
    #[arg(long)]
    shard_index: Option<usize>,
    /// How many workers share the input [default: source.shard_count, then 1].
    #[arg(long)]
    shard_count: Option<usize>,
    /// Cut JSONL and Parquet files larger than this many bytes into parts, each a shard
    /// (overrides `source.split_bytes`, 256 MiB by default; 0 never cuts). Every worker of a job,
    /// and every rerun, must use the same value.
    #[arg(long)]
    split_bytes: Option<u64>,
    /// Device (overrides `model.device`): cpu or cuda:N, or a comma-separated list
    /// (cuda:0,cuda:1): one process per device, each on its part of this worker's shards.
    #[arg(long)]
    device: Option<String>,
    /// GGUF model file, relative to the current folder (overrides `model.path`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prometheus endpoint host:port (overrides `metrics.listen`; with a device list, device g
    /// listens on the port + g).
    #[arg(long)]
    metrics: Option<String>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Log format on stderr.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    quarry worker --pipeline pipelines/kafka-packages.toml\n  \
    quarry worker --pipeline pipelines/kafka-packages.toml --brokers 127.0.0.1:9092 --group extract-1\n\n\
    SIGTERM or SIGINT: stop fetching, finish and publish what is held, commit, exit 0.\n\
    A second signal abandons in-flight work (uncommitted; the next owner redoes it).\n\
    --idle-exit exits 0 only when every assigned partition is committed up to its high watermark;\n\
    otherwise it exits non-zero and prints each partition's lag. A partition stalled past the\n\
    stall timeout (a batch that cannot be decoded, a fetch error that repeats) makes the worker\n\
    drain, name the partition and offset, and exit non-zero. The summary line always has the lag.")]
pub(crate) struct WorkerArgs {
    /// Job definition (TOML, `source.kind = "kafka"`).
    #[arg(long)]
    pipeline: PathBuf,
    /// Bootstrap brokers, host:port[,host:port] (overrides `source.brokers`).
    #[arg(long)]
    brokers: Option<String>,
    /// Consumer group (overrides `source.group`).
    #[arg(long)]
    group: Option<String>,
    /// Static group membership id (`group.instance.id`), e.g. the pod name of a StatefulSet: a
    /// restarted worker takes its partitions back at once.
    #[arg(long, env = "QUARRY_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Output prefix URL (overrides `output.url`).
    #[arg(long)]
    output: Option<String>,
    /// Rejects prefix URL (overrides `rejects.url`).
    #[arg(long)]
    rejects: Option<String>,
    /// Prometheus endpoint host:port (overrides `metrics.listen`).
    #[arg(long)]
    metrics: Option<String>,
    /// Exit after this many seconds with nothing to do (drain a topic and stop); the exit is 0
    /// only when every assigned partition is committed up to its high watermark.
    #[arg(long)]
    idle_exit: Option<f64>,
    /// Seconds a partition may stay behind with nothing delivered before the worker stops with a
    /// non-zero exit (overrides `source.stall_timeout_s`, default 120).
    #[arg(long)]
    stall_timeout: Option<f64>,
    /// Device (overrides `model.device`): cpu or cuda:N.
    #[arg(long)]
    device: Option<String>,
    /// GGUF model file, relative to the current folder (overrides `model.path`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn init_logs(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colours only on a terminal: logs collected from files and pods stay plain text.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        b.json().try_init()
    } else {
        b.try_init()
    };
}

fn load(
    pipeline: &std::path::Path,
    device: &Option<String>,
    model: &Option<PathBuf>,
) -> Result<Prepared> {
    let mut cfg = PipelineConfig::load(pipeline)?;
    crate::runtime_env(&mut cfg.model.runtime)
        .with_context(|| format!("the model runtime options of {}", pipeline.display()))?;
    if let Some(d) = device {
        cfg.model.device = d.clone();
    }
    if let Some(m) = model {
        cfg.model.path = std::path::absolute(m)?;
    }
    let path = cfg.model_path();
    // A GGUF file, or a Hugging Face checkpoint folder (its config.json).
    if !(path.is_file() || path.join("config.json").is_file()) {
        let from = match model {
            Some(_) => "--model".to_string(),
            None => format!("model.path in {}", pipeline.display()),
        };
        anyhow::bail!(
            "model {} ({from}) not found (a GGUF file, or a checkpoint folder with a \
             config.json): run `make setup`, or fix the path",
            path.display()
        );
    }
    Ok(Prepared::new(cfg)?)
}

fn serve_metrics(metrics: &Arc<Metrics>, listen: Option<&str>) -> Result<()> {
    if let Some(addr) = listen {
        let bound = metrics.serve(addr)?;
        tracing::info!(%bound, "metrics at http://{bound}/metrics");
    }
    Ok(())
}

pub(crate) fn extract(args: ExtractArgs) -> Result<crate::Exit> {
    init_logs(&args.log_format);
    let mut job = load(&args.pipeline, &None, &args.model)?;
    if let (Some(split), quarry_pipeline::config::SourceConfig::Dataset(src)) =
        (args.split_bytes, &mut job.cfg.source)
    {
        src.split_bytes = split;
    }
    let quarry_pipeline::config::SourceConfig::Dataset(src) = &job.cfg.source else {
        anyhow::bail!(
            "{}: source.kind is \"kafka\"; run it with `quarry worker`",
            args.pipeline.display()
        );
    };
    let slice = ShardSlice::resolve(
        args.shard_index,
        args.shard_count,
        std::env::var("JOB_COMPLETION_INDEX").ok().as_deref(),
        src,
        &args.pipeline.display().to_string(),
    )?;
    let device = args.device.clone().unwrap_or(job.cfg.model.device.clone());
    let devices: Vec<&str> = device.split(',').map(str::trim).collect();
    if devices.iter().any(|d| d.is_empty()) {
        anyhow::bail!("--device {device:?}: an empty device in the list");
    }
    let listen = args
        .metrics
        .as_deref()
        .or(job.cfg.metrics.listen.as_deref());
    if devices.len() > 1 {
        let publisher = job.publisher(args.output.as_deref(), args.rejects.as_deref())?;
        let urls = (publisher.output.url.clone(), publisher.rejects.url.clone());
        return devices::extract_on_each(&args, &devices, slice, listen, urls);
    }
    job.cfg.model.device = device.clone();
    let input = match &args.input {
        Some(u) => Location::open_input(u)?,
        None => Location::open_input(&job.cfg.resolve_url(&src.input))?,
    };
    let publisher = job.publisher(args.output.as_deref(), args.rejects.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    serve_metrics(&metrics, listen)?;
    let extractor = EngineExtractor::load(&job.cfg, &job.schema)?;
    let mut flow = Flow::new(extractor, job.validator()?);
    let shutdown = Shutdown::install()?;
    let opts = DatasetOptions {
        limit_shards: args.limit_shards,
        progress: !args.json,
        slice,
    };
    let summary = DatasetJob::new(&job.cfg, &input, &mut flow, &publisher, &metrics, opts)
        .and_then(|j| j.run(&shutdown))
        .with_context(|| format!("pipeline {}", job.cfg.name))?;
    let engine = flow.extractor.engine_stats();
    if args.json {
        let mut v = serde_json::to_value(&summary)?;
        v["output"] = publisher.output.url.clone().into();
        v["rejects"] = publisher.rejects.url.clone().into();
        if let Some(s) = &engine {
            v["forced_share"] = s.forced_share().into();
            v["mask_us_per_step"] = s.mask_us_per_step().into();
        }
        println!("{v}");
    } else {
        print_summary(
            &summary,
            engine.as_ref(),
            &publisher.output.url,
            &publisher.rejects.url,
        );
    }
    if summary.interrupted {
        eprintln!("interrupted: rerun the same command to finish the remaining shards");
        return Ok(crate::Exit::Interrupted);
    }
    Ok(crate::Exit::Success)
}

pub(crate) fn print_summary(
    s: &JobSummary,
    e: Option<&quarry_engine::EngineStats>,
    out: &str,
    rej: &str,
) {
    let rate = |n: u64| n as f64 / s.wall_s.max(1e-9);
    if s.slice.count > 1 {
        println!(
            "shards: {} listed, {} in slice {} ({} done now, {} already published)",
            s.shards, s.shards_assigned, s.slice, s.shards_done, s.shards_skipped
        );
    } else {
        println!(
            "shards: {} ({} done now, {} already published)",
            s.shards, s.shards_done, s.shards_skipped
        );
    }
    if s.shards_published_meanwhile + s.shards_duplicated > 0 {
        println!(
            "another worker runs this slice: {} shard(s) it published while this one listed them \
             (skipped), {} it published first while this one worked on them ({} document(s) of \
             duplicated work)",
            s.shards_published_meanwhile, s.shards_duplicated, s.docs_duplicated
        );
    }
    println!(
        "documents: {} consumed, {} accepted, {} rejected",
        s.consumed, s.accepted, s.rejected
    );
    for (cause, n) in &s.causes {
        println!("  rejected {cause}: {n}");
    }
    println!(
        "throughput: {:.2} docs/s, {:.1} output tokens/s, {:.1}s wall",
        rate(s.consumed),
        rate(s.output_tokens),
        s.wall_s
    );
    let hit = if s.prompt_tokens > 0 {
        s.cached_tokens as f64 / s.prompt_tokens as f64
    } else {
        0.0
    };
    let forced = e.map(|e| e.forced_share()).unwrap_or(0.0);
    println!(
        "engine: forced-token share {:.1}%, prefix-cache hit rate {:.1}%",
        forced * 100.0,
        hit * 100.0
    );
    println!("output: {out}\nrejects: {rej}");
}

/// A flag's seconds as a duration: negative, infinite or NaN is an error, not a panic.
fn seconds(v: Option<f64>, flag: &str) -> Result<Option<Duration>> {
    v.map(|s| {
        Duration::try_from_secs_f64(s)
            .map_err(|_| anyhow::anyhow!("{flag} {s}: expected a number of seconds >= 0"))
    })
    .transpose()
}

pub(crate) fn worker(args: WorkerArgs) -> Result<()> {
    init_logs(&args.log_format);
    let job = load(&args.pipeline, &args.device, &args.model)?;
    let publisher = job.publisher(args.output.as_deref(), args.rejects.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    serve_metrics(
        &metrics,
        args.metrics
            .as_deref()
            .or(job.cfg.metrics.listen.as_deref()),
    )?;
    let extractor = EngineExtractor::load(&job.cfg, &job.schema)?;
    let mut flow = Flow::new(extractor, job.validator()?);
    let shutdown = Shutdown::install()?;
    let opts = WorkerOptions {
        brokers: args.brokers.clone(),
        group: args.group.clone(),
        instance_id: args.instance_id.clone(),
        idle_exit: seconds(args.idle_exit, "--idle-exit")?,
        stall_timeout: seconds(args.stall_timeout, "--stall-timeout")?,
        client_env: std::env::vars()
            .filter(|(k, _)| k.starts_with(quarry_pipeline::kafka::ENV_PREFIX))
            .collect(),
    };
    let worker = Worker::new(&job.cfg, &opts, &mut flow, &publisher, &metrics)?;
    let summary = worker
        .run(&shutdown, &opts)
        .with_context(|| format!("pipeline {}", job.cfg.name))?;
    eprintln!("worker stopped: {}", serde_json::to_string(&summary)?);
    summary
        .verdict()
        .with_context(|| format!("pipeline {}", job.cfg.name))?;
    Ok(())
}
