//! `quarry inspect`: what published Parquet files hold (schema, counts, offsets, sample rows).

use std::io::Write;

use anyhow::Result;
use clap::Args;
use quarry_pipeline::inspect::{self, FileSummary, Sample, Totals};
use serde_json::json;

#[derive(Args)]
#[command(after_help = "Examples:
  quarry inspect target/demo/out/packages/part-00000.parquet
  quarry inspect target/demo/out                      # every .parquet file under the folder
  quarry inspect s3://bucket/quarry/out/ --sample 0   # counts and offsets only
  quarry inspect out/topic=docs/partition=0 --all --json | jq '.files[0].rows'
  quarry inspect s3://bucket/out/ s3://bucket/rejects/ --totals   # a whole job: complete or partial

Accepted files count rows by _finish_reason, rejects files by cause; offset ranges are the
_offset values per _source and _partition. The totals add every file up; given a dataset job's
output and rejects prefixes they say whether every shard it listed is published (complete) or
how many are not (partial), whichever workers ran them. Object-store URLs take the usual credentials from the
environment (AWS_*, GOOGLE_*, AZURE_*).")]
pub(crate) struct InspectArgs {
    /// Parquet files, folders or object-store prefixes.
    #[arg(required = true, value_name = "FILE.parquet|FOLDER|URL")]
    targets: Vec<String>,
    /// Rows to show per file.
    #[arg(long, default_value_t = 3, conflicts_with = "all")]
    sample: usize,
    /// Show every row.
    #[arg(long)]
    all: bool,
    /// Text report without the column list, and sample rows without the lineage (`_…`) columns.
    #[arg(long)]
    brief: bool,
    /// Print one JSON object: {"files": [...], "totals": {...}}.
    #[arg(long)]
    json: bool,
    /// Only the totals (with --json, only {"totals": {...}}): a whole job's output and rejects
    /// prefixes on one screen, however many files they hold.
    #[arg(long, conflicts_with = "all")]
    totals: bool,
}

pub(crate) fn run(args: InspectArgs) -> Result<()> {
    let sample = if args.all {
        Sample::All
    } else if args.totals {
        Sample::First(0)
    } else {
        Sample::First(args.sample)
    };
    let mut files = Vec::new();
    for t in &args.targets {
        if args.totals {
            // Footers only, but for the rejects' causes.
            files.extend(inspect::inspect_totals(t)?);
        } else {
            files.extend(inspect::inspect(t, sample)?);
        }
    }
    let totals = Totals::of(&files);
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut t = serde_json::to_value(&totals)?;
        t["complete"] = json!(totals.complete());
        let doc = if args.totals {
            json!({ "totals": t })
        } else {
            json!({"files": files, "totals": t})
        };
        writeln!(out, "{}", serde_json::to_string(&doc)?)?;
        return Ok(());
    }
    for f in files.iter().filter(|_| !args.totals) {
        print_file(&mut out, f, args.brief)?;
    }
    print_totals(&mut out, &totals)?;
    Ok(())
}

/// The totals of every file shown: rows, rejects by cause, and for a dataset job's output and
/// rejects prefixes, whether every shard it listed is published.
fn print_totals(out: &mut impl Write, t: &Totals) -> Result<()> {
    writeln!(
        out,
        "total: {} file(s), {} accepted row(s), {} rejected row(s)",
        t.files, t.accepted, t.rejected
    )?;
    if !t.causes.is_empty() {
        let causes: Vec<String> = t.causes.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(out, "  rejected by cause: {}", causes.join(" · "))?;
    }
    let Some(listed) = t.shards_listed else {
        return Ok(());
    };
    let slices: Vec<&str> = t.slices.iter().map(String::as_str).collect();
    let verdict = match t.complete() {
        Some(true) => "complete".to_string(),
        _ => format!(
            "partial: {} shard(s) not published",
            listed.saturating_sub(t.shards_published)
        ),
    };
    writeln!(
        out,
        "  shards: {} published of {listed} listed, by worker slice(s) {}: {verdict}",
        t.shards_published,
        slices.join(", ")
    )?;
    if let Some((lo, hi)) = t.listings_differ {
        writeln!(
            out,
            "  note: files record listings of {lo} to {hi} shards (the input changed between runs or workers)"
        )?;
    }
    for u in &t.unmarked {
        writeln!(
            out,
            "  note: {u} has no rejects marker here (in progress, or a crash the next run completes; or the rejects prefix was not given)"
        )?;
    }
    Ok(())
}

fn print_file(out: &mut impl Write, f: &FileSummary, brief: bool) -> Result<()> {
    let meta = |k: &str| f.metadata.get(k).map(String::as_str).unwrap_or("?");
    writeln!(out, "{}", f.path)?;
    writeln!(
        out,
        "  dataset   {} (pipeline {}, quarry {})",
        f.dataset,
        meta("quarry.pipeline"),
        meta("quarry.version")
    )?;
    writeln!(
        out,
        "  rows      {} in {} row group(s), {}, {:.1} KiB",
        f.rows,
        f.row_groups,
        f.compression.as_deref().unwrap_or("no data"),
        f.bytes as f64 / 1024.0
    )?;
    if f.metadata.contains_key("quarry.model") {
        writeln!(
            out,
            "  model     {} · schema sha256 {}",
            meta("quarry.model"),
            meta("quarry.schema_sha256")
        )?;
    }
    let counts: Vec<String> = f.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    if !counts.is_empty() {
        let label = if f.dataset == "rejects" {
            "causes"
        } else {
            "finish"
        };
        writeln!(out, "  {label:<9} {}", counts.join(" · "))?;
    }
    for r in &f.offsets {
        let partition = r
            .partition
            .map_or(String::new(), |p| format!(" partition {p}"));
        writeln!(
            out,
            "  offsets   {}{partition}: {}–{} ({} row(s))",
            r.source, r.first, r.last, r.rows
        )?;
    }
    let other: Vec<String> = f
        .metadata
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "quarry.pipeline"
                    | "quarry.version"
                    | "quarry.dataset"
                    | "quarry.model"
                    | "quarry.schema_sha256"
            )
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !other.is_empty() {
        writeln!(out, "  metadata  {}", other.join(" · "))?;
    }
    if !brief {
        writeln!(out, "  schema")?;
        for (name, ty, nullable) in &f.schema {
            let null = if *nullable { "" } else { " not null" };
            writeln!(out, "    {name}: {ty}{null}")?;
        }
    }
    if !f.sample.is_empty() {
        writeln!(out, "  rows ({} of {})", f.sample.len(), f.rows)?;
        for row in &f.sample {
            let mut row = row.clone();
            if let (true, Some(obj)) = (brief, row.as_object_mut()) {
                obj.retain(|k, _| !k.starts_with('_'));
            }
            writeln!(out, "    {}", serde_json::to_string(&row)?)?;
        }
    }
    Ok(())
}
