//! `quarry extract --device cuda:0,cuda:1`: one process per device, each `quarry extract` on its
//! part of this worker's shards ([`ShardSlice::part`]), so the devices never share a shard and
//! together do exactly this worker's slice.
//!
//! One process per device rather than one engine per device in one process: a device's failure
//! (a CUDA fault, an out-of-memory) ends only its own process, each engine keeps its own host
//! threads, and the processes are the same `quarry extract` a user runs by hand (the same
//! resume, the same publish protocol). This process loads no model; it forwards SIGTERM/SIGINT
//! to every child, waits for all of them, and adds their summaries up.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use quarry_pipeline::dataset::{JobSummary, ShardSlice};
use quarry_pipeline::shutdown::Shutdown;

use super::{print_summary, ExtractArgs};

/// One device's process.
struct Part {
    device: String,
    slice: ShardSlice,
    child: Child,
    /// The child's stdout (its JSON summary), read on a thread so a long summary cannot fill the
    /// pipe while this process waits.
    stdout: std::thread::JoinHandle<std::io::Result<String>>,
}

/// The arguments of device `g`'s `quarry extract`.
fn child_args(
    args: &ExtractArgs,
    device: &str,
    slice: ShardSlice,
    metrics: Option<String>,
) -> Vec<String> {
    let mut a: Vec<String> = vec!["extract".into(), "--pipeline".into()];
    a.push(args.pipeline.display().to_string());
    let mut opt = |flag: &str, v: Option<String>| {
        if let Some(v) = v {
            a.push(flag.into());
            a.push(v);
        }
    };
    opt("--input", args.input.clone());
    opt("--output", args.output.clone());
    opt("--rejects", args.rejects.clone());
    opt("--limit-shards", args.limit_shards.map(|n| n.to_string()));
    opt("--split-bytes", args.split_bytes.map(|n| n.to_string()));
    opt(
        "--model",
        args.model.as_ref().map(|m| m.display().to_string()),
    );
    opt("--metrics", metrics);
    opt("--device", Some(device.to_string()));
    opt("--shard-index", Some(slice.index.to_string()));
    opt("--shard-count", Some(slice.count.to_string()));
    opt("--log-format", Some(args.log_format.clone()));
    a.push("--json".into());
    a
}

/// `host:port` moved up by `by` ports (device g's metrics endpoint is the job's port + g).
fn shifted(listen: &str, by: usize) -> Result<String> {
    let (host, port) = listen
        .rsplit_once(':')
        .with_context(|| format!("metrics listen address {listen:?} has no :port"))?;
    let port: usize = port
        .parse()
        .with_context(|| format!("metrics listen address {listen:?}: bad port"))?;
    Ok(format!("{host}:{}", port + by))
}

pub(crate) fn extract_on_each(
    args: &ExtractArgs,
    devices: &[&str],
    slice: ShardSlice,
    metrics: Option<&str>,
    urls: (String, String),
) -> Result<crate::Exit> {
    let exe = std::env::current_exe().context("the path of this quarry binary")?;
    let shutdown = Shutdown::install()?;
    let mut parts = Vec::new();
    for (g, device) in devices.iter().enumerate() {
        let part = slice.part(g, devices.len());
        let listen = metrics.map(|m| shifted(m, g)).transpose()?;
        let mut child = Command::new(&exe)
            .args(child_args(args, device, part, listen))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting quarry extract on {device}"))?;
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            out.read_to_string(&mut s).map(|_| s)
        });
        tracing::info!(device, slice = %part, pid = child.id(), "device process started");
        parts.push(Part {
            device: device.to_string(),
            slice: part,
            child,
            stdout,
        });
    }
    // Wait for every process, passing each stop signal on (a Kubernetes pod's SIGTERM reaches
    // only this process).
    let mut forwarded = 0;
    let mut status = vec![None; parts.len()];
    while status.iter().any(Option::is_none) {
        let signals = shutdown.signals();
        while forwarded < signals {
            forwarded += 1;
            for (p, s) in parts.iter().zip(&status) {
                if s.is_none() {
                    // SAFETY: kill(2) with a pid this process spawned and has not reaped (its
                    // status is still unknown), and a valid signal number; no memory is shared.
                    unsafe { libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM) };
                }
            }
        }
        for (p, s) in parts.iter_mut().zip(status.iter_mut()) {
            if s.is_none() {
                *s = p.child.try_wait().context("waiting for a device process")?;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut total = JobSummary {
        slice,
        ..JobSummary::default()
    };
    let mut per_device = Vec::new();
    let mut interrupted = false;
    let mut failed = Vec::new();
    for (p, s) in parts.into_iter().zip(status) {
        let s = s.expect("all exited");
        let out = p.stdout.join().expect("reader thread").unwrap_or_default();
        match s.code() {
            Some(0) | Some(3) => {
                interrupted |= s.code() == Some(3);
                let v: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| {
                    format!("{}: the device process printed no summary", p.device)
                })?;
                let one: JobSummary = serde_json::from_value(v.clone())?;
                total.merge(&one);
                per_device.push(serde_json::json!({"device": p.device, "summary": v}));
            }
            _ => failed.push(format!("{} (slice {}): {s}", p.device, p.slice)),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "device process(es) failed: {}; their logs are above, and a rerun resumes their shards",
            failed.join(", ")
        );
    }
    let (output, rejects) = urls;
    if args.json {
        let mut v = serde_json::to_value(&total)?;
        v["output"] = output.into();
        v["rejects"] = rejects.into();
        v["devices"] = per_device.into();
        println!("{v}");
    } else {
        print_summary(&total, None, &output, &rejects);
        for d in &per_device {
            let s = &d["summary"];
            println!(
                "  {}: slice {}/{}, {} shard(s) done, {} document(s)",
                d["device"].as_str().unwrap_or("?"),
                s["slice"]["index"],
                s["slice"]["count"],
                s["shards_done"],
                s["consumed"]
            );
        }
    }
    if interrupted || total.interrupted {
        eprintln!("interrupted: rerun the same command to finish the remaining shards");
        return Ok(crate::Exit::Interrupted);
    }
    Ok(crate::Exit::Success)
}
