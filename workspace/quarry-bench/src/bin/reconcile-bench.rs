//! What a Kafka worker's assignment waits for: reconciling a partition from its published files,
//! against the partition's history. The store is filled with `--ranges` published ranges (an
//! accepted file, its rejects marker and its claim each), a claimed range without its file and an
//! accepted file without its marker (what a crash leaves), as a worker lays them out. Then the
//! reconcile runs in turn the way it did before commits named their range (the peer: the
//! partition's whole folders listed), from the range the group's last commit names, and from the
//! committed offset alone (a broker that keeps no commit metadata: the markers looked for a
//! file's documents before it), the order rotating. All must give the same answer.
//!
//! `make bench-reconcile` (moto S3 on 127.0.0.1 through `infra/bench-reconcile.sh`; `--url` a
//! local folder runs it without one); results go to
//! BENCHMARKS.md.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use quarry_bench::median;
use quarry_pipeline::kafka::{claim_name, range_name, reconcile, ListFrom, Reconciled};
use quarry_pipeline::store::{block_on, Location};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Where the output and rejects folders go (`s3://bucket/prefix`, or a local folder).
    #[arg(long)]
    url: String,
    /// Published ranges in the partition's history, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    ranges: Vec<u64>,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Puts at once while the history is written.
    #[arg(long, default_value_t = 32)]
    puts: usize,
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// Documents a range holds (its offsets).
const RANGE_DOCS: i64 = 100;

/// Writes `ranges` published ranges of partition 0, then a claimed range without its file and an
/// accepted file without its marker.
fn fill(out: &Location, rej: &Location, ranges: i64, at_once: usize) -> Result<()> {
    let mut puts: Vec<(&Location, String, Bytes)> = Vec::new();
    let name = |i: i64| range_name("t", 0, i * RANGE_DOCS, (i + 1) * RANGE_DOCS - 1);
    for i in 0..ranges {
        puts.push((rej, claim_name("t", 0, i * RANGE_DOCS), name(i).into()));
        puts.push((out, name(i), Bytes::from_static(b"accepted")));
        puts.push((rej, name(i), Bytes::from_static(b"marker")));
    }
    puts.push((
        rej,
        claim_name("t", 0, ranges * RANGE_DOCS),
        name(ranges).into(),
    ));
    puts.push((out, name(ranges + 1), Bytes::from_static(b"accepted")));
    let results: Vec<object_store::Result<_>> = block_on(
        futures::stream::iter(puts)
            .map(|(l, n, b)| async move { l.store.put(&l.path(&n), PutPayload::from(b)).await })
            .buffer_unordered(at_once)
            .collect(),
    );
    for r in results {
        r.context("filling the store")?;
    }
    Ok(())
}

fn timed(out: &Location, rej: &Location, from: Option<ListFrom>) -> Result<(f64, Reconciled)> {
    let t = Instant::now();
    let r = reconcile(out, rej, "t", 0, from)?;
    Ok((t.elapsed().as_secs_f64() * 1e3, r))
}

/// The three ways to start, by name.
const WAYS: [&str; 3] = ["whole", "from_committed", "from_offset"];

fn main() -> Result<()> {
    let a = Args::parse();
    let mut rows = Vec::new();
    println!(
        "| ranges | objects | whole folders: listed, ms | from the committed range: listed, ms | from the committed offset: listed, ms | ratios |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &ranges in &a.ranges {
        let ranges = ranges as i64;
        let base = format!("{}/r{ranges}", a.url.trim_end_matches('/'));
        let out = Location::open(&format!("{base}/out"))?;
        let rej = Location::open(&format!("{base}/rej"))?;
        let started = Instant::now();
        fill(&out, &rej, ranges, a.puts)?;
        eprintln!(
            "{ranges} ranges written in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let committed = ranges * RANGE_DOCS;
        let starts = [
            None,
            Some(ListFrom::Range(committed - RANGE_DOCS, committed - 1)),
            Some(ListFrom::Before {
                offset: committed,
                window: RANGE_DOCS,
            }),
        ];
        let mut ms: [Vec<f64>; 3] = Default::default();
        let mut listed = [0; 3];
        for rep in 0..a.repeats {
            // Rotate which goes first.
            for k in 0..3 {
                let way = (rep + k) % 3;
                let (took, r) = timed(&out, &rej, starts[way])?;
                ensure!(
                    r.resume == Some(committed)
                        && r.replay.as_ref().map(|p| p.first) == Some(committed),
                    "a reconcile ({}) answered {r:?}",
                    WAYS[way]
                );
                ensure!(
                    r.listed_from.is_some() == (way > 0),
                    "{}: listed from {:?}",
                    WAYS[way],
                    r.listed_from
                );
                ms[way].push(took);
                listed[way] = r.listed;
            }
        }
        let medians = ms.clone().map(median);
        println!(
            "| {ranges} | {} | {}, {:.1} | {}, {:.1} | {}, {:.1} | {:.1}×, {:.1}× |",
            3 * ranges + 2,
            listed[0],
            medians[0],
            listed[1],
            medians[1],
            listed[2],
            medians[2],
            medians[0] / medians[1],
            medians[0] / medians[2],
        );
        let mut row = json!({ "ranges": ranges, "objects": 3 * ranges + 2 });
        for way in 0..3 {
            row[WAYS[way]] =
                json!({"listed": listed[way], "ms": ms[way], "median_ms": medians[way]});
        }
        rows.push(row);
    }
    if let Some(path) = &a.out {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({ "runs": rows }))?,
        )?;
    }
    Ok(())
}
