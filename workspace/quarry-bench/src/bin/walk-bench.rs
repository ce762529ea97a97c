//! `walk-bench`: token masks along whole records of a JSON Schema, quarry against llguidance and
//! (with `--xgrammar-python`, in its own process) xgrammar, in one run on the same vocabulary and
//! the same token sequences. The records are random walks:
//! each step takes the smallest allowed token one time in three and a random allowed one
//! otherwise (what `overlap-bench`'s device double draws), so strings run to their `maxLength`
//! and every grammar state a bounded string has is visited. Each engine then replays the same
//! sequences from a fresh compile, timing every mask: the total is what a batch of that many
//! documents costs the host before the masks are warm, which is when an engine on a GPU waits for
//! them. xgrammar computes its masks' tables when it compiles, so each engine's compile is timed
//! beside its masks. quarry runs three times: with its shared subtree walks (the default),
//! without them (`Limits::max_shared_subtrees = 0`), so the table also gives that change's
//! effect, and eagerly (every state's mask computed at compile, `Grammar::precompute`, on as many
//! threads as xgrammar's compiler).
//!
//! A second table times the token budget's mask of the tokens that fit (`Matcher::retain_fitting`,
//! `docs/budget.md`) along the first `--fit-docs` records, at every step as if the tokens left
//! were exactly the state's shortest completion (where almost every draw again happens): by one
//! walk of the vocabulary's trie (what quarry does where a state has no fit table yet; tables off
//! here) against the walk of each allowed token's bytes (what it did before,
//! `Matcher::retain_fitting_by_walk`), each on a fresh compile, checked equal. Prints the tables
//! and writes JSON (see `BENCHMARKS.md`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use quarry_bench::median;
use quarry_bench::peers::{Llguidance, Peer, Spec, Walker};
use quarry_bench::xgrammar::{Walk, Xgrammar, XgrammarArgs};
use quarry_bench::ModelVocab;
use quarry_grammar::{Constraint, Grammar, Limits, SchemaOptions, Vocabulary};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Masks along random records of a schema: quarry vs llguidance, xgrammar")]
struct Args {
    /// GGUF files whose vocabularies are used, one run each (Llama 3's 128k vocabulary is
    /// `models/hub-tokenizers/llama3/vocab.gguf` once `make test`'s set-up has written it).
    #[arg(long, default_values = [
        "models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ])]
    model: Vec<PathBuf>,
    #[arg(long, default_value = "schemas/debian-package.json")]
    schema: PathBuf,
    /// Records per run.
    #[arg(long, default_value_t = 64)]
    docs: usize,
    /// Tokens a record may take at most.
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// Runs per engine (fresh compiles); medians are reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Records along which the budget's fit masks are timed (0: none).
    #[arg(long, default_value_t = 16)]
    fit_docs: usize,
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    xgrammar: XgrammarArgs,
}

/// quarry's grammar with the given limits.
fn quarry_grammar(vocab: &Arc<Vocabulary>, schema: &Value, limits: Limits) -> Result<Arc<Grammar>> {
    let c = Constraint::JsonSchema {
        schema: schema.clone(),
        options: SchemaOptions::default(),
    };
    Ok(Arc::new(Grammar::compile(&c, vocab.clone(), limits)?))
}

/// `docs` random records (token ids), drawn from the tokens every engine allows (llguidance
/// refuses DEL, U+007F, inside a JSON string, which JSON allows and quarry does too; xgrammar,
/// where it runs, allows other spellings of a string's characters, `\/` and `\u` escapes,
/// where quarry writes each string one way, serde_json's).
fn records(
    vocab: &Arc<Vocabulary>,
    schema: &Value,
    llg: &Llguidance,
    xgr: Option<&Xgrammar>,
    args: &Args,
) -> Result<Vec<Vec<u32>>> {
    let g = quarry_grammar(vocab, schema, Limits::default())?;
    let peer = llg.compile_spec(&Spec::Schema(schema.clone()))?;
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut peer_mask = mask.clone();
    let mut allowed = Vec::with_capacity(vocab.len());
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(args.docs);
    for _ in 0..args.docs {
        let mut m = quarry_grammar::Matcher::new(g.clone());
        let mut p = peer.walker()?;
        let mut x_mask = xgr
            .map(|x| x.begin(&Spec::Schema(schema.clone())))
            .transpose()?;
        let mut ids = Vec::new();
        while ids.len() < args.max_tokens && !m.is_finished() {
            m.fill_mask(&mut mask);
            p.fill_mask(&mut peer_mask);
            for (a, b) in mask.iter_mut().zip(&peer_mask) {
                *a &= b;
            }
            if let Some(x) = &x_mask {
                for (a, b) in mask.iter_mut().zip(x) {
                    *a &= b;
                }
            }
            allowed.clear();
            allowed.extend(
                (0..vocab.len() as u32)
                    .filter(|&i| mask[i as usize / 32] >> (i % 32) & 1 == 1 && !vocab.is_eos(i)),
            );
            if allowed.is_empty() {
                break;
            }
            h = h
                .wrapping_mul(0x5851_F42D_4C95_7F2D)
                .wrapping_add(0x1405_7B7E_F767_814F);
            let id = if h >> 60 < 5 {
                allowed[0]
            } else {
                allowed[(h >> 20) as usize % allowed.len()]
            };
            m.accept_token(id)?;
            if !p.accept(id) {
                bail!("llguidance refused token {id}, which its mask allowed");
            }
            if let Some(x) = xgr {
                x_mask = Some(x.accept(id)?);
            }
            ids.push(id);
        }
        out.push(ids);
    }
    Ok(out)
}

/// Replays `records` through fresh walkers, timing each mask (µs).
fn replay<'a>(
    mut walker: impl FnMut() -> Result<Box<dyn Walker + 'a>>,
    records: &[Vec<u32>],
    words: usize,
) -> Result<Vec<f64>> {
    let mut mask = vec![0u32; words];
    let mut times = Vec::new();
    for (r, ids) in records.iter().enumerate() {
        let mut w = walker()?;
        for (i, &id) in ids.iter().enumerate() {
            let t = Instant::now();
            w.fill_mask(&mut mask);
            times.push(t.elapsed().as_secs_f64() * 1e6);
            if mask[id as usize / 32] >> (id % 32) & 1 == 0 || !w.accept(id) {
                bail!("record {r}: token {i} ({id}) refused on replay");
            }
        }
    }
    Ok(times)
}

/// Each step's time (µs), and the tokens kept with a hash of the mask they make.
type FitRun = (Vec<f64>, Vec<(usize, u64)>);

/// The budget's fit mask at every step of `records` with as many tokens left as the state's
/// shortest completion, on a fresh compile without fit tables: by the trie walk (`by_trie`) or
/// by each token's walk. Returns each step's time (µs), and the tokens kept with a hash of the
/// mask they make (to check the two walks agree without keeping every mask).
fn fits(
    vocab: &Arc<Vocabulary>,
    schema: &Value,
    records: &[Vec<u32>],
    by_trie: bool,
) -> Result<FitRun> {
    let limits = Limits {
        max_fit_table_bytes: 0,
        ..Limits::default()
    };
    let g = quarry_grammar(vocab, schema, limits)?;
    let mut mask = vec![0u32; vocab.mask_words()];
    let (mut times, mut kept) = (Vec::new(), Vec::new());
    for ids in records {
        let mut m = quarry_grammar::Matcher::new(g.clone());
        for &id in ids {
            m.fill_mask(&mut mask);
            if let Some(need) = m.completion_len() {
                let t = Instant::now();
                let k = if by_trie {
                    m.retain_fitting(&mut mask, need)
                } else {
                    m.retain_fitting_by_walk(&mut mask, need)
                };
                times.push(t.elapsed().as_secs_f64() * 1e6);
                let hash = mask.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &w| {
                    (h ^ u64::from(w)).wrapping_mul(0x0100_0000_01B3)
                });
                kept.push((k, hash));
            }
            m.accept_token(id)?;
        }
    }
    Ok((times, kept))
}

/// Prints one vocabulary's fit-mask line (medians over runs of the totals).
fn fit_results_summary(name: &str, trie_ms: f64, walk_ms: f64, run: &Value) {
    println!(
        "{:<40} fit masks at {:>5} tight steps: trie walk {:>8.1} ms, each token's walk {:>8.1} ms, {:.2}×",
        name,
        run["by_trie"]["steps"],
        trie_ms,
        walk_ms,
        trie_ms / walk_ms
    );
}

/// Total, p50 and p99 of per-step times (µs), as JSON.
fn spread(times: &[f64]) -> Value {
    let mut s = times.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: usize| s.get(s.len() * q / 100).copied().unwrap_or(0.0);
    json!({
        "steps": s.len(),
        "total_ms": s.iter().sum::<f64>() / 1e3,
        "p50_us": at(50),
        "p99_us": at(99),
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let spec = Spec::Schema(schema.clone());
    let mut results = Vec::new();
    let mut fit_results = Vec::new();
    println!(
        "{:<40} {:<23} {:>6} {:>10} {:>8} {:>9} {:>9}  {:>13} {:>11}",
        "vocabulary",
        "engine",
        "masks",
        "total ms",
        "p50 µs",
        "p99 µs",
        "max µs",
        "÷ llguidance",
        "compile ms"
    );
    for path in &args.model {
        let mv = ModelVocab::load(path)?;
        let vocab = mv.vocab.clone();
        let words = vocab.mask_words();
        let llg = Llguidance::new(&vocab)?;
        let xgr = args.xgrammar.start(&vocab)?;
        let recs = records(&vocab, &schema, &llg, xgr.as_ref(), &args)?;
        let mut engines = vec![
            "quarry",
            "quarry, no shared walks",
            "llguidance",
            "quarry, eager",
        ];
        let mut runs: Vec<Vec<Vec<f64>>> = vec![Vec::new(); engines.len()];
        // Each run's compile (ms): xgrammar computes its masks' tables there, the others on
        // first use, inside the masks' times.
        let mut compiles: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
        // The states quarry's default run built, and the subtree walks it kept.
        let mut sharing = Value::Null;
        for _ in 0..args.repeats {
            for (e, run) in runs.iter_mut().enumerate() {
                let t = Instant::now();
                let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
                let times = match e {
                    0 => {
                        let g = quarry_grammar(&vocab, &schema, Limits::default())?;
                        compiles[e].push(ms(t));
                        let times = replay(
                            || Ok(Box::new(quarry_grammar::Matcher::new(g.clone()))),
                            &recs,
                            words,
                        )?;
                        sharing = json!({
                            "states": g.state_count(),
                            "shared_subtree_walks": g.shared_subtree_walks(),
                            "length_splits": g.length_splits(),
                        });
                        times
                    }
                    1 => {
                        let limits = Limits {
                            max_shared_subtrees: 0,
                            ..Limits::default()
                        };
                        let g = quarry_grammar(&vocab, &schema, limits)?;
                        compiles[e].push(ms(t));
                        replay(
                            || Ok(Box::new(quarry_grammar::Matcher::new(g.clone()))),
                            &recs,
                            words,
                        )?
                    }
                    2 => {
                        let c = llg.compile_spec(&spec)?;
                        compiles[e].push(ms(t));
                        replay(|| c.walker(), &recs, words)?
                    }
                    _ => {
                        // Every state's mask computed when it compiles, on as many threads as
                        // xgrammar's compiler has.
                        let g = quarry_grammar(&vocab, &schema, Limits::default())?;
                        g.precompute(args.xgrammar.xgrammar_threads);
                        compiles[e].push(ms(t));
                        replay(
                            || Ok(Box::new(quarry_grammar::Matcher::new(g.clone()))),
                            &recs,
                            words,
                        )?
                    }
                };
                run.push(times);
            }
        }
        // xgrammar: the same records from a fresh compile each repeat, timed in its process.
        let mut xgr_error = None;
        let mut xgr_warnings = Vec::new();
        if let Some(x) = &xgr {
            let how = Walk {
                cold_reps: args.repeats,
                final_mask: false,
                ..Walk::default()
            };
            match x.walk(&spec, &recs, how) {
                Ok(w) => {
                    engines.push("xgrammar");
                    runs.push(w.cold);
                    compiles.push(w.compile_us.iter().map(|us| us / 1e3).collect());
                    for warning in &w.warnings {
                        println!("xgrammar warned: {warning}");
                    }
                    xgr_warnings = w.warnings;
                }
                Err(e) => {
                    println!("xgrammar: {e:#}");
                    xgr_error = Some(format!("{e:#}"));
                }
            }
        }
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let summary: Vec<Value> = runs
            .iter()
            .zip(&compiles)
            .map(|(reps, compile)| {
                let q = |f: &dyn Fn(&[f64]) -> f64| {
                    median(
                        reps.iter()
                            .map(|t| {
                                let mut s = t.clone();
                                s.sort_by(f64::total_cmp);
                                f(&s)
                            })
                            .collect(),
                    )
                };
                json!({
                    "masks": reps[0].len(),
                    "total_ms": q(&|s| s.iter().sum::<f64>() / 1e3),
                    "p50_us": q(&|s| s[s.len() / 2]),
                    "p99_us": q(&|s| s[s.len() * 99 / 100]),
                    "max_us": q(&|s| s[s.len() - 1]),
                    "compile_ms": median(compile.clone()),
                })
            })
            .collect();
        let llg_total = summary[2]["total_ms"].as_f64().unwrap_or(0.0);
        for (engine, s) in engines.iter().zip(&summary) {
            let total = s["total_ms"].as_f64().unwrap_or(0.0);
            println!(
                "{:<40} {:<23} {:>6} {:>10.1} {:>8.1} {:>9.0} {:>9.0}  {:>13.2} {:>11.2}",
                name,
                engine,
                s["masks"],
                total,
                s["p50_us"].as_f64().unwrap_or(0.0),
                s["p99_us"].as_f64().unwrap_or(0.0),
                s["max_us"].as_f64().unwrap_or(0.0),
                total / llg_total,
                s["compile_ms"].as_f64().unwrap_or(0.0),
            );
        }
        println!(
            "{:<40} quarry's run: {} states built, {} subtree walks kept, {} masks split by length",
            name, sharing["states"], sharing["shared_subtree_walks"], sharing["length_splits"]
        );
        if args.fit_docs > 0 {
            let recs = &recs[..args.fit_docs.min(recs.len())];
            let (mut trie, mut walk) = (Vec::new(), Vec::new());
            for _ in 0..args.repeats {
                let (t, kept_trie) = fits(&vocab, &schema, recs, true)?;
                let (w, kept_walk) = fits(&vocab, &schema, recs, false)?;
                if kept_trie != kept_walk {
                    bail!("{name}: the trie walk's fit masks differ from each token's walk");
                }
                trie.push(t.iter().sum::<f64>() / 1e3);
                walk.push(w.iter().sum::<f64>() / 1e3);
                if trie.len() == 1 {
                    fit_results.push(json!({
                        "vocabulary": name,
                        "records": recs.len(),
                        "by_trie": spread(&t),
                        "by_each_token": spread(&w),
                    }));
                }
            }
            let last = fit_results.last_mut().expect("pushed");
            last["total_ms_per_run"] = json!({"by_trie": trie, "by_each_token": walk});
            fit_results_summary(&name, median(trie), median(walk), last);
        }
        results.push(json!({
            "vocabulary": name,
            "tokens": vocab.len(),
            "records": recs.len(),
            "xgrammar": xgr.as_ref().map(|x| x.setup.to_json()),
            "xgrammar_error": xgr_error,
            "xgrammar_warnings": xgr_warnings,
            "compile_ms_per_run": compiles,
            "quarry_sharing": sharing,
            "engines": engines.iter().zip(&summary).map(|(e, s)| json!({"engine": e, "median": s})).collect::<Vec<_>>(),
            "total_ms_per_run": runs
                .iter()
                .map(|reps| reps.iter().map(|t| t.iter().sum::<f64>() / 1e3).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        }));
    }
    let doc = json!({
        "bench": "walk-bench",
        "schema": args.schema,
        "docs": args.docs,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "results": results,
        "fits": fit_results,
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
