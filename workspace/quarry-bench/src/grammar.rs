//! The constraint benchmark: for each regex and each engine, compile time, time to first mask, and
//! the per-token mask time over a realistic walk (the canonical tokens of a text the regex
//! matches), cold (a fresh compile: first visit to every state) and warm (the same walk again on
//! the same compiled constraint).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::peers::{Peer, Quarry, Spec};
use crate::xgrammar::{compare_masks, Walk, Xgrammar, XgrammarArgs};
use crate::ModelVocab;

/// A regex and a realistic output it matches.
pub struct Case {
    pub name: &'static str,
    pub regex: String,
    pub text: &'static str,
}

/// Capitals of the 48 European states, as a long alternation.
const CAPITALS: &[&str] = &[
    "Amsterdam",
    "Andorra la Vella",
    "Athens",
    "Belgrade",
    "Berlin",
    "Bern",
    "Bratislava",
    "Brussels",
    "Bucharest",
    "Budapest",
    "Chisinau",
    "Copenhagen",
    "Dublin",
    "Helsinki",
    "Kyiv",
    "Lisbon",
    "Ljubljana",
    "London",
    "Luxembourg",
    "Madrid",
    "Minsk",
    "Monaco",
    "Moscow",
    "Nicosia",
    "Oslo",
    "Paris",
    "Podgorica",
    "Prague",
    "Reykjavik",
    "Riga",
    "Rome",
    "San Marino",
    "Sarajevo",
    "Skopje",
    "Sofia",
    "Stockholm",
    "Tallinn",
    "Tbilisi",
    "Tirana",
    "Vaduz",
    "Valletta",
    "Vatican City",
    "Vienna",
    "Vilnius",
    "Warsaw",
    "Yerevan",
    "Zagreb",
    "Baku",
];

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "json-object",
            regex: r#"\{"name": "[A-Za-z .'-]{1,40}", "age": (0|[1-9][0-9]{0,2}), "email": "[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,6}", "tags": \[("[a-z]{1,12}"(, "[a-z]{1,12}"){0,4})?\]\}"#.into(),
            text: r#"{"name": "Ada Lovelace", "age": 36, "email": "ada.lovelace@analytical-engine.org", "tags": ["math", "poetry", "computing"]}"#,
        },
        Case {
            name: "email",
            regex: r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,6}".into(),
            text: "grace.hopper+cobol@navy.mil",
        },
        Case {
            name: "date-time",
            regex: r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](Z|[+-][0-9]{2}:[0-9]{2})".into(),
            text: "2026-11-22T09:41:07+01:00",
        },
        Case {
            name: "alternation-48",
            regex: CAPITALS
                .iter()
                .map(|c| regex_escape(c))
                .collect::<Vec<_>>()
                .join("|"),
            text: "Andorra la Vella",
        },
        Case {
            name: "seed-number",
            regex: r"([0-9]*)?\.?[0-9]*".into(),
            text: "3.14159265358979323846",
        },
    ]
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    pct(v, 50.0)
}

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({
        "n": v.len(),
        "p50_us": pct(&v, 50.0),
        "p99_us": pct(&v, 99.0),
        "max_us": v.last().copied().unwrap_or(f64::NAN),
    })
}

/// Measures one engine on one case. `cold_reps` fresh compiles, each walked once (cold), then
/// `warm_reps` more walks on the last compile (warm). For an engine with a token budget (quarry,
/// `docs/budget.md`), the cold walks also time the budget's check of each next token (a walk of
/// its bytes and its next state's shortest completion, computed on first use: `budget.cold`),
/// and each warm rep walks the tokens twice more without masks, accepting them plainly and as
/// the engine does under the budget (the check's cached length looked up after the walk that
/// accepts: `budget.warm_*_ns_per_token`, whole walks timed, so no timer per token): the
/// difference is what the budget adds to a token, to set against the mask's time.
pub fn measure(
    peer: &dyn Peer,
    spec: &Spec,
    tokens: &[u32],
    mask_words: usize,
    cold_reps: usize,
    warm_reps: usize,
) -> Result<Value> {
    let mut mask = vec![0u32; mask_words];
    let mut compile_us = Vec::new();
    let mut ttfm_us = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let (mut budget_cold, mut budget_warm) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..cold_reps.max(1) {
        let t0 = Instant::now();
        let compiled = peer.compile_spec(spec)?;
        compile_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let mut w = compiled.walker()?;
        let t1 = Instant::now();
        w.fill_mask(&mut mask);
        let first = t1.elapsed().as_secs_f64() * 1e6;
        ttfm_us.push(t0.elapsed().as_secs_f64() * 1e6);
        cold.push(first);
        for (i, &t) in tokens.iter().enumerate() {
            if mask[t as usize / 32] >> (t % 32) & 1 == 0 {
                bail!("{} does not allow token {i} ({t}) of the walk", peer.name());
            }
            let t2 = Instant::now();
            if w.budget_check(t).is_some() {
                budget_cold.push(t2.elapsed().as_secs_f64() * 1e6);
            }
            if !w.accept(t) {
                bail!("{} refused token {i} ({t}) of the walk", peer.name());
            }
            let t1 = Instant::now();
            w.fill_mask(&mut mask);
            cold.push(t1.elapsed().as_secs_f64() * 1e6);
        }
        drop(w);
        last = Some(compiled);
    }
    let compiled = last.unwrap();
    for _ in 0..warm_reps {
        let mut w = compiled.walker()?;
        let t1 = Instant::now();
        w.fill_mask(&mut mask);
        warm.push(t1.elapsed().as_secs_f64() * 1e6);
        for &t in tokens {
            let t2 = Instant::now();
            if w.budget_check(t).is_some() {
                budget_warm.push(t2.elapsed().as_secs_f64() * 1e6);
            }
            w.accept(t);
            let t1 = Instant::now();
            w.fill_mask(&mut mask);
            warm.push(t1.elapsed().as_secs_f64() * 1e6);
        }
    }
    // The budget's cost per warm token: plain walks against walks under the budget.
    let (mut plain_ns, mut checked_ns) = (Vec::new(), Vec::new());
    if !budget_cold.is_empty() && !tokens.is_empty() {
        let per_token = |t: Instant| t.elapsed().as_secs_f64() * 1e9 / tokens.len() as f64;
        for _ in 0..warm_reps {
            let mut w = compiled.walker()?;
            let t = Instant::now();
            for &tok in tokens {
                std::hint::black_box(w.accept(tok));
            }
            plain_ns.push(per_token(t));
            let mut w = compiled.walker()?;
            let t = Instant::now();
            for &tok in tokens {
                std::hint::black_box(w.budget_accept(tok));
            }
            checked_ns.push(per_token(t));
        }
    }
    let mut out = json!({
        "engine": peer.name(),
        "compile_us": median(&mut compile_us),
        "time_to_first_mask_us": median(&mut ttfm_us),
        "cold": summary(cold),
        "warm": summary(warm),
    });
    if !budget_cold.is_empty() {
        let plain = median(&mut plain_ns);
        let checked = median(&mut checked_ns);
        out["budget"] = json!({
            "cold": summary(budget_cold),
            "warm": summary(budget_warm),
            "warm_plain_ns_per_token": plain,
            "warm_budget_ns_per_token": checked,
            "warm_added_ns_per_token": checked - plain,
        });
    }
    Ok(out)
}

/// The table header [`run_case`] prints rows under.
pub fn print_header() {
    println!(
        "{:<15} {:<15} {:>6} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case",
        "engine",
        "tokens",
        "compile µs",
        "TTFM µs",
        "cold p50",
        "cold p99",
        "cold max",
        "warm p50",
        "warm p99",
        "warm max"
    );
}

/// One benchmark case on one vocabulary: its walk and how often to repeat it.
pub struct Run<'a> {
    pub model: &'a str,
    pub case: &'a str,
    pub tokens: &'a [u32],
    pub mask_words: usize,
    pub cold_reps: usize,
    pub warm_reps: usize,
}

/// [`measure`]s `peer` on `run`, prints its row (or its error) and returns the JSON result
/// labelled with the model, case and walk length.
pub fn run_case(peer: &dyn Peer, spec: &Spec, run: &Run) -> Value {
    let r = measure(
        peer,
        spec,
        run.tokens,
        run.mask_words,
        run.cold_reps,
        run.warm_reps,
    );
    report(peer.name(), r, run)
}

/// Prints `engine`'s row for `run` (or its error) and returns the result labelled with the
/// model, case and walk length.
fn report(engine: &str, r: Result<Value>, run: &Run) -> Value {
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            println!("{:<15} {:<15} error: {e:#}", run.case, engine);
            return json!({"model": run.model, "case": run.case, "engine": engine, "error": format!("{e:#}")});
        }
    };
    let f = |k: &str, q: &str| r[k][q].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<15} {:<15} {:>6} {:>11.1} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        run.case,
        engine,
        run.tokens.len(),
        r["compile_us"].as_f64().unwrap_or(f64::NAN),
        r["time_to_first_mask_us"].as_f64().unwrap_or(f64::NAN),
        f("cold", "p50_us"),
        f("cold", "p99_us"),
        f("cold", "max_us"),
        f("warm", "p50_us"),
        f("warm", "p99_us"),
        f("warm", "max_us"),
    );
    if r.get("budget").is_some() {
        let b = |k: &str, q: &str| r["budget"][k][q].as_f64().unwrap_or(f64::NAN);
        let n = |k: &str| r["budget"][k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<15} {:<15} budget: cold check p50/p99 µs {:.2}/{:.2}; warm accept {:.1} → {:.1} ns/token, +{:.1} ns ({:.1}% of the warm mask p99)",
            "",
            "",
            b("cold", "p50_us"),
            b("cold", "p99_us"),
            n("warm_plain_ns_per_token"),
            n("warm_budget_ns_per_token"),
            n("warm_added_ns_per_token"),
            100.0 * n("warm_added_ns_per_token") / (1000.0 * f("warm", "p99_us")),
        );
    }
    let mut r = r;
    r["model"] = json!(run.model);
    r["case"] = json!(run.case);
    r["walk_tokens"] = json!(run.tokens.len());
    r
}

/// xgrammar on `run`, timed in its own process ([`Xgrammar`]), as [`measure`] times the others:
/// its row printed, its result returned. Its first cold walk's masks are checked against
/// `quarry`'s along the same tokens, and where they differ the row's next line says where.
pub fn run_xgrammar_case(xgr: &Xgrammar, quarry: &Quarry, spec: &Spec, run: &Run) -> Value {
    let tokens = vec![run.tokens.to_vec()];
    let how = Walk {
        cold_reps: run.cold_reps,
        warm_reps: run.warm_reps,
        masks: true,
        final_mask: true,
    };
    let mut notes = Vec::new();
    let r = xgr.walk(spec, &tokens, how).and_then(|w| {
        let ours = masks_along(quarry, spec, run.tokens, run.mask_words)?;
        let c = compare_masks(&quarry.vocab, &ours, &w.masks);
        if let Some(first) = &c.first {
            notes.push(format!(
                "masks differ from quarry's at {} of {} steps ({} tokens only quarry allows, {} only xgrammar); first at {first}",
                c.differing_steps,
                c.steps,
                c.only_quarry.len(),
                c.only_peer.len()
            ));
        }
        notes.extend(w.warnings.iter().map(|w| format!("xgrammar warned: {w}")));
        let ttfm: Vec<f64> = w
            .compile_us
            .iter()
            .zip(&w.first_mask_us)
            .map(|(c, f)| c + f)
            .collect();
        Ok(json!({
            "engine": "xgrammar",
            "compile_us": median(&mut w.compile_us.clone()),
            "time_to_first_mask_us": median(&mut ttfm.clone()),
            "cold": summary(w.cold.concat()),
            "warm": summary(w.warm),
            "masks": c.to_json(&quarry.vocab),
            "warnings": w.warnings,
            "version": xgr.setup.version,
            "call_overhead_us": xgr.setup.call_overhead_us,
            "threads": xgr.setup.threads,
        }))
    });
    let out = report("xgrammar", r, run);
    for note in notes {
        println!("{:<15} {:<15} {note}", "", "");
    }
    out
}

/// quarry's masks along `tokens`: before each token and after the last.
fn masks_along(
    quarry: &Quarry,
    spec: &Spec,
    tokens: &[u32],
    words: usize,
) -> Result<Vec<Vec<u32>>> {
    let compiled = quarry.compile_spec(spec)?;
    let mut w = compiled.walker()?;
    let mut mask = vec![0u32; words];
    let mut out = Vec::with_capacity(tokens.len() + 1);
    w.fill_mask(&mut mask);
    out.push(mask.clone());
    for &t in tokens {
        if !w.accept(t) {
            bail!("quarry refused token {t} of the walk");
        }
        w.fill_mask(&mut mask);
        out.push(mask.clone());
    }
    Ok(out)
}

/// The engines a benchmark runs: the in-process peers, and xgrammar where it runs, whose masks
/// are checked against `quarry`'s.
pub struct Engines<'a> {
    pub peers: &'a [&'a dyn Peer],
    pub xgrammar: Option<&'a Xgrammar>,
    pub quarry: &'a Quarry,
}

/// The options `grammar-bench` and `cfg-bench` share: which vocabularies, how often each case is
/// walked, which cases, and where the results go.
#[derive(clap::Args, Debug)]
pub struct Reps {
    /// GGUF files whose vocabularies are used, repeatable (default: SmolLM2 and Qwen2.5 from
    /// models/, and Gemma 3 too for grammar-bench).
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Where to write the JSON results (default: target/bench/<benchmark>.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Fresh compiles per engine and case (each walked once, cold).
    #[arg(long, default_value_t = 5)]
    pub cold_reps: usize,
    /// Walks on the last compile (warm).
    #[arg(long, default_value_t = 20)]
    pub warm_reps: usize,
    /// Only cases whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    #[command(flatten)]
    pub xgrammar: XgrammarArgs,
}

impl Reps {
    /// The `--model` files, or `default` when none is given.
    pub fn models(&self, default: &[&str]) -> Vec<PathBuf> {
        if self.model.is_empty() {
            default.iter().map(PathBuf::from).collect()
        } else {
            self.model.clone()
        }
    }

    /// Whether the case `name` is selected by `--only`.
    pub fn selects(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|o| name.contains(o))
    }

    /// Walks each selected case (name, output text, constraint) with every peer on one model's
    /// vocabulary, and with xgrammar where it runs (its masks checked against `quarry`'s),
    /// printing a row each and adding its result to `results`.
    pub fn run_cases<'c>(
        &self,
        model: &str,
        mv: &ModelVocab,
        engines: &Engines,
        cases: impl IntoIterator<Item = (&'c str, &'c str, Spec)>,
        results: &mut Vec<Value>,
    ) -> Result<()> {
        for (name, text, spec) in cases {
            if !self.selects(name) {
                continue;
            }
            let tokens = mv.tokenizer.encode(text)?;
            let run = Run {
                model,
                case: name,
                tokens: &tokens,
                mask_words: mv.vocab.mask_words(),
                cold_reps: self.cold_reps,
                warm_reps: self.warm_reps,
            };
            for peer in engines.peers {
                results.push(run_case(*peer, &spec, &run));
            }
            if let Some(xgr) = engines.xgrammar {
                results.push(run_xgrammar_case(xgr, engines.quarry, &spec, &run));
            }
        }
        Ok(())
    }

    /// Writes the run's results to `--out` (default `target/bench/<bench>.json`, creating its
    /// folder) with the peers' `versions`.
    pub fn write(&self, bench: &str, versions: Value, results: Vec<Value>) -> Result<()> {
        let out = self
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("target/bench/{bench}.json")));
        let out = out.as_path();
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let doc = json!({
            "versions": versions,
            "cold_reps": self.cold_reps,
            "warm_reps": self.warm_reps,
            "results": results,
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
        println!("\nwrote {}", out.display());
        Ok(())
    }
}
