//! The dataset job's loop against stores that hold or fail its calls: reads and publishes run
//! beside the steps, and their errors stop the job, never hang it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;

use super::*;
use crate::extract::Validator;
use crate::faults::FaultyStore;
use crate::testing::{fake, publisher, schema, Fake};

fn config(format: &str) -> PipelineConfig {
    let text = format!(
        "name = \"t\"\nschema = \"s.json\"\n[source]\nkind = \"dataset\"\ninput = \"in\"\n\
         format = \"{format}\"\n[prompt]\ntemplate = \"{{{{ text }}}}\"\n[output]\nurl = \"o\"\n\
         [rejects]\nurl = \"r\"\n"
    );
    PipelineConfig::parse(&text, "t.toml", PathBuf::new()).unwrap()
}

/// An input of `shards` JSONL shards `s0.jsonl`, `s1.jsonl`, … of two documents each.
fn input(tag: &str, shards: usize) -> Location {
    let input = Location::open(&format!("memory://dataset-{tag}/in")).unwrap();
    for k in 0..shards {
        let lines = format!("{{\"text\": \"d{k}a\"}}\n{{\"text\": \"d{k}b\"}}\n");
        input
            .publish(&format!("s{k}.jsonl"), lines.into_bytes().into())
            .unwrap();
    }
    input
}

/// Runs the job on a thread and gives up after a minute, so a hang fails the test.
fn run(
    cfg: PipelineConfig,
    input: Location,
    publisher: Publisher,
    fake: Fake,
) -> Result<JobSummary, PipelineError> {
    run_until(cfg, input, publisher, fake, Shutdown::manual())
}

/// [`run`] under `shutdown`.
fn run_until(
    cfg: PipelineConfig,
    input: Location,
    publisher: Publisher,
    fake: Fake,
    shutdown: Shutdown,
) -> Result<JobSummary, PipelineError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut flow = Flow::new(fake, Validator::new(&schema(), "s").unwrap());
        let metrics = Metrics::new();
        let job = DatasetJob::new(
            &cfg,
            &input,
            &mut flow,
            &publisher,
            &metrics,
            DatasetOptions::default(),
        );
        let _ = tx.send(job.and_then(|j| j.run(&shutdown)));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the job ends within a minute")
}

#[test]
fn the_steps_go_on_while_shards_are_read_and_files_published() {
    let ticks = Arc::new(AtomicUsize::new(0));
    // The second and third shards' reads, and the first shard's publish, each land only once
    // the engine has stepped twice more: on the loop's own thread they would wait for ever (5 s,
    // then counted as timed out).
    let held_reads =
        |p: &Path| p.as_ref().ends_with("s1.jsonl") || p.as_ref().ends_with("s2.jsonl");
    let held_puts = |p: &Path| p.as_ref().ends_with("s0.parquet");
    let input = input("held", 4);
    let reads = Arc::new(FaultyStore::new(input.store.clone(), 0, false).hold(
        ticks.clone(),
        2,
        held_reads,
    ));
    let input = input.with_store(reads.clone());
    let puts = std::sync::Mutex::new(Vec::new());
    let publisher = publisher("dataset-held", |l| {
        let s =
            Arc::new(FaultyStore::new(l.store.clone(), 0, false).hold(ticks.clone(), 2, held_puts));
        puts.lock().unwrap().push(s.clone());
        s
    });
    // 25 steps a document leave the held calls (2 steps) a wide margin on a busy machine.
    let s = run(config("jsonl"), input, publisher.clone(), fake(25, &ticks)).unwrap();
    assert_eq!((s.consumed, s.accepted, s.shards_done), (8, 8, 4));
    assert_eq!(
        reads.holds_timed_out.load(Ordering::SeqCst),
        0,
        "a held read stopped the steps"
    );
    let timed_out: usize = puts
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.holds_timed_out.load(Ordering::SeqCst))
        .sum();
    assert_eq!(timed_out, 0, "a held publish stopped the steps");
    for k in 0..4 {
        assert!(
            publisher.rejects.exists(&format!("s{k}.parquet")).unwrap(),
            "s{k}'s marker"
        );
        assert!(
            publisher.output.exists(&format!("s{k}.parquet")).unwrap(),
            "s{k}'s records"
        );
    }
    assert!(s.io_s > 0.0 && s.io_wait_s <= s.wall_s, "{s:?}");
}

#[test]
fn a_publish_that_fails_stops_the_job_with_its_error() {
    let ticks = Arc::new(AtomicUsize::new(0));
    // Every put fails (after the store's retries): the first file's error ends the job.
    let publisher = publisher("dataset-failing", |l| {
        Arc::new(FaultyStore::new(l.store.clone(), usize::MAX, false))
    });
    let e = run(
        config("jsonl"),
        input("failing", 6),
        publisher,
        fake(1, &ticks),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PipelineError::Store { .. }), "{msg}");
    assert!(
        msg.contains(".parquet") && msg.contains("injected put failure"),
        "{msg}"
    );
}

#[test]
fn a_shard_that_cannot_be_read_stops_the_job_naming_it() {
    let ticks = Arc::new(AtomicUsize::new(0));
    let input = Location::open("memory://dataset-unreadable/in").unwrap();
    input
        .publish("a.parquet", bytes::Bytes::from_static(b"PAR1 not parquet"))
        .unwrap();
    let publisher = publisher("dataset-unreadable", |l| {
        Arc::new(FaultyStore::new(l.store.clone(), 0, false))
    });
    let e = run(config("parquet"), input, publisher.clone(), fake(1, &ticks)).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, PipelineError::Input { .. }) && msg.contains("a.parquet"),
        "{msg}"
    );
    assert!(
        !publisher.rejects.exists("a.parquet").unwrap(),
        "nothing published"
    );
}

#[test]
fn a_stop_with_a_shard_read_in_part_leaves_it_whole_for_the_next_run() {
    let ticks = Arc::new(AtomicUsize::new(0));
    // 300 documents: read in chunks of 64, so the stop comes with the shard read in part.
    let (input, starts, _) = big_jsonl("stop-part", 300);
    input
        .publish("small.jsonl", b"{\"text\": \"s0\"}\n"[..].into())
        .unwrap();
    let publisher = publisher("dataset-stop-part", |l| {
        Arc::new(FaultyStore::new(l.store.clone(), 0, false))
    });
    let shutdown = Shutdown::manual();
    let asker = {
        let (shutdown, ticks) = (shutdown.clone(), ticks.clone());
        std::thread::spawn(move || {
            while ticks.load(Ordering::SeqCst) < 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
            shutdown.request();
        })
    };
    let s = run_until(
        config("jsonl"),
        input.clone(),
        publisher.clone(),
        fake(1, &ticks),
        shutdown,
    )
    .unwrap();
    asker.join().unwrap();
    assert!(s.interrupted, "{s:?}");
    assert_eq!((s.shards_done, s.consumed), (0, 0), "{s:?}");
    assert!(!publisher.rejects.exists("big.parquet").unwrap());
    assert!(!publisher.output.exists("big.parquet").unwrap());

    // The next run reads the shard whole and publishes it, every line once.
    let s = run(config("jsonl"), input, publisher.clone(), fake(1, &ticks)).unwrap();
    assert_eq!(
        (s.shards_done, s.consumed, s.accepted),
        (2, 301, 301),
        "{s:?}"
    );
    let bytes = publisher
        .output
        .read(&publisher.output.path("big.parquet"))
        .unwrap();
    let offsets = crate::encode::read_offsets(bytes).unwrap();
    assert_eq!(offsets, starts, "each line once");
}

/// An input holding `big.jsonl`, `lines` documents long, with each line's first byte's offset
/// (its `_offset`) and the file's size.
fn big_jsonl(tag: &str, lines: usize) -> (Location, Vec<i64>, u64) {
    let input = Location::open(&format!("memory://dataset-{tag}/in")).unwrap();
    let mut text = String::new();
    let mut starts = Vec::new();
    for k in 0..lines {
        starts.push(text.len() as i64);
        text.push_str(&format!("{{\"text\": \"document {k}\"}}\n"));
    }
    let size = text.len() as u64;
    input
        .publish("big.jsonl", text.into_bytes().into())
        .unwrap();
    (input, starts, size)
}

/// `cfg` with `source.split_bytes` set.
fn split_at(mut cfg: PipelineConfig, split: u64) -> PipelineConfig {
    match &mut cfg.source {
        SourceConfig::Dataset(d) => d.split_bytes = split,
        _ => unreachable!("a dataset job"),
    }
    cfg
}

#[test]
fn a_large_file_is_published_in_parts_each_line_once_and_a_changed_cut_is_refused() {
    let ticks = Arc::new(AtomicUsize::new(0));
    let (input, starts, size) = big_jsonl("parts", 200);
    let publisher = publisher("dataset-parts", |l| {
        Arc::new(FaultyStore::new(l.store.clone(), 0, false))
    });
    // The job over the same input and output, with files cut at `split` bytes.
    let run_at = |split: u64| {
        run(
            split_at(config("jsonl"), split),
            input.clone(),
            publisher.clone(),
            fake(1, &ticks),
        )
    };
    let split = size / 4;
    let s = run_at(split).unwrap();
    let parts = size.div_ceil(split) as usize;
    assert_eq!(
        (s.shards, s.shards_done, s.consumed),
        (parts, parts, 200),
        "{s:?}"
    );
    let mut offsets = Vec::new();
    for k in 0..parts {
        let name = format!("big.part-{k:05}-of-{parts:05}.parquet");
        let bytes = publisher
            .output
            .read(&publisher.output.path(&name))
            .unwrap();
        let got = crate::encode::read_offsets(bytes).unwrap();
        assert!(got.len() > 30, "{name}: {} lines", got.len());
        offsets.extend(got);
    }
    assert_eq!(
        offsets, starts,
        "each line once, in order, at its byte offset"
    );
    // A rerun with the same cut skips every part; with another it stops before any work.
    let again = run_at(split).unwrap();
    assert_eq!(
        (again.shards_skipped, again.consumed),
        (parts, 0),
        "{again:?}"
    );
    let e = run_at(split / 2).unwrap_err().to_string();
    assert!(
        e.contains("big.jsonl was cut into 5 part(s) by an earlier run"),
        "{e}"
    );
}

#[test]
fn a_rerun_finds_the_published_shards_in_one_listing_not_a_check_each() {
    let ticks = Arc::new(AtomicUsize::new(0));
    let stores = std::sync::Mutex::new(Vec::new());
    let publisher = publisher("dataset-listed", |l| {
        let s = Arc::new(FaultyStore::new(l.store.clone(), 0, false));
        stores.lock().unwrap().push(s.clone());
        s
    });
    let input = input("listed", 5);
    let first = run(
        config("jsonl"),
        input.clone(),
        publisher.clone(),
        fake(1, &ticks),
    )
    .unwrap();
    assert_eq!(first.shards_done, 5);
    let heads = || -> usize {
        stores
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.heads_seen.load(Ordering::SeqCst))
            .sum()
    };
    let before = heads();
    let again = run(config("jsonl"), input, publisher, fake(1, &ticks)).unwrap();
    assert_eq!((again.shards_skipped, again.shards_done), (5, 0));
    assert_eq!(heads() - before, 0, "no existence check a published shard");
}
