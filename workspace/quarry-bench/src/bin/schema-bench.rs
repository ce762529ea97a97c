//! `schema-bench`: JSON Schema compile time on a corpus of real schemas, quarry against
//! llguidance and (with `--xgrammar-python`) xgrammar, in one run on the same vocabulary. For each schema and engine: whether it compiles,
//! the median compile time (schema → automaton or parser) and the median time to the first token
//! mask. Then the cost of the decode-time `uniqueItems` check: warm masks inside arrays whose
//! items must be unique, against the same schema without `uniqueItems` (llguidance refuses the
//! keyword). Then masks along outputs of schemas whose keywords constrain the same text twice
//! (`pattern` with lengths, `format` with a length, `not`/`enum` on a string, `propertyNames`):
//! cold and warm per-token mask times, both engines. Prints a summary and writes JSON (see
//! `BENCHMARKS.md`).

use quarry_bench::median;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quarry_bench::grammar::{print_header, run_case, run_xgrammar_case, Run};
use quarry_bench::peers::{Llguidance, Peer, Quarry, Spec};
use quarry_bench::xgrammar::{Xgrammar, XgrammarArgs};
use quarry_bench::ModelVocab;
use quarry_grammar::{Constraint, Grammar, Limits, Matcher, SchemaOptions};
use serde_json::{json, Value};

#[cfg(test)]
mod tests {
    use super::warning_kind;

    #[test]
    fn warnings_group_without_their_regex() {
        assert_eq!(
            warning_kind(
                "Lookahead assertion is not supported and is ignored in regex: ^(?!aws:).*$"
            ),
            "Lookahead assertion is not supported and is ignored in regex"
        );
        assert_eq!(
            warning_kind("Anchor '$' in the middle of regex is ignored: ^[a-z]+$|^$"),
            "Anchor '$' in the middle of regex is ignored"
        );
        assert_eq!(
            warning_kind("Regex parsing warning at position 14: Escape sequence '\\p' is not recognized. The character itself will be matched"),
            "Regex parsing warning: Escape sequence '\\p' is not recognized"
        );
        assert_eq!(
            warning_kind("pattern combined with minLength/maxLength is not supported; ignoring minLength/maxLength"),
            "pattern combined with minLength/maxLength is not supported; ignoring minLength/maxLength"
        );
    }
}

#[derive(Parser)]
#[command(about = "JSON Schema compile times on real schemas: quarry vs llguidance, xgrammar")]
struct Args {
    /// Directory of schemas (searched one level deep).
    #[arg(long, default_value = "tests/fixtures/schema-corpus")]
    corpus: PathBuf,
    /// GGUF files whose vocabularies are used, one run each (SmolLM2's 49k tokens and
    /// Qwen2.5's 152k).
    #[arg(long, default_values = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])]
    model: Vec<PathBuf>,
    /// Compiles per engine and schema; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Only the intersection cases whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/schemas.json")]
    out: PathBuf,
    #[command(flatten)]
    xgrammar: XgrammarArgs,
}

fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// (compile ms, first-mask ms) medians, or the error.
fn quarry(
    schema: &Value,
    vocab: &Arc<quarry_grammar::Vocabulary>,
    reps: usize,
) -> Result<(f64, f64, Value)> {
    let constraint = Constraint::JsonSchema {
        schema: schema.clone(),
        options: SchemaOptions {
            ignore_unknown_keywords: true,
            ..SchemaOptions::default()
        },
    };
    let (mut compile, mut first) = (Vec::new(), Vec::new());
    let mut stats = Value::Null;
    let mut mask = vec![0u32; vocab.mask_words()];
    for rep in 0..reps {
        let t = Instant::now();
        let g = Arc::new(Grammar::compile(
            &constraint,
            vocab.clone(),
            Limits::default(),
        )?);
        compile.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        Matcher::new(g.clone()).fill_mask(&mut mask);
        first.push(t.elapsed().as_secs_f64() * 1e3);
        if rep + 1 == reps {
            // Compiling builds no state; the whole automaton's size is a statistic only.
            let all = g.explore().ok();
            stats = json!({"states": all, "dfa_bytes": all.map(|_| g.dfa_bytes())});
        }
    }
    Ok((median(compile), median(first), stats))
}

fn llguidance(schema: &Value, llg: &Llguidance, reps: usize) -> Result<(f64, f64)> {
    let (mut compile, mut first) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        let grammar = llguidance::api::TopLevelGrammar::from_json_schema(schema.clone());
        let parser = llg.factory.create_parser(grammar)?;
        compile.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let mut m = llguidance::Matcher::new(Ok(parser));
        m.compute_mask()?;
        first.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(compile), median(first)))
}

/// (compile ms, first-mask ms) medians from xgrammar's own timings, and what its compiler
/// warned (a keyword it ignores), or the error.
fn xgrammar(schema: &Value, xgr: &Xgrammar, reps: usize) -> Result<(f64, f64, Vec<String>)> {
    let w = xgr.compile(&Spec::Schema(schema.clone()), reps)?;
    let ms = |v: Vec<f64>| median(v.into_iter().map(|us| us / 1e3).collect());
    Ok((ms(w.compile_us), ms(w.first_mask_us), w.warnings))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let files = quarry_bench::schema_files(&args.corpus)?;
    let mut runs = Vec::new();
    for model in &args.model {
        runs.push(run(&args, model, &files)?);
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({
            "versions": {"quarry-grammar": env!("CARGO_PKG_VERSION"), "llguidance": "1.9.1"},
            "reps": args.reps,
            "runs": runs,
        }))?,
    )?;
    println!("\nwrote {}", args.out.display());
    Ok(())
}

/// Every schema of `files` compiled by both engines over `model`'s vocabulary: the table, the
/// summary, and the run's JSON.
fn run(args: &Args, model: &Path, files: &[PathBuf]) -> Result<Value> {
    let mv = ModelVocab::load(model)?;
    let llg = Llguidance::new(&mv.vocab)?;
    let mut rows = Vec::new();
    println!("\n{}: {} tokens", model.display(), mv.vocab.len());
    let xgr = args.xgrammar.start(&mv.vocab)?;
    println!(
        "{:<48} {:>12} {:>10} {:>9} {:>12} {:>10} {:>12} {:>10}",
        "schema", "quarry ms", "q TTFM ms", "states", "llg ms", "l TTFM ms", "xgr ms", "x TTFM ms"
    );
    for file in files {
        let name = file
            .strip_prefix(&args.corpus)
            .unwrap_or(file)
            .display()
            .to_string();
        let schema: Value = serde_json::from_slice(&std::fs::read(file)?)?;
        let q = quarry(&schema, &mv.vocab, args.reps);
        let l = llguidance(&schema, &llg, args.reps);
        let x = xgr.as_ref().map(|x| xgrammar(&schema, x, args.reps));
        let cell = |r: &Result<(f64, f64)>| match r {
            Ok((c, f)) => (format!("{c:.2}"), format!("{f:.2}")),
            Err(_) => ("-".into(), "-".into()),
        };
        let qs = cell(
            &q.as_ref()
                .map(|(c, f, _)| (*c, *f))
                .map_err(|e| anyhow::anyhow!("{e}")),
        );
        let ls = cell(&l.as_ref().map(|x| *x).map_err(|e| anyhow::anyhow!("{e}")));
        let xs = match &x {
            Some(x) => cell(
                &x.as_ref()
                    .map(|(c, f, _)| (*c, *f))
                    .map_err(|e| anyhow::anyhow!("{e}")),
            ),
            None => (String::new(), String::new()),
        };
        let states = q
            .as_ref()
            .map(|(_, _, s)| s["states"].to_string())
            .unwrap_or_else(|_| "-".into());
        println!(
            "{:<48} {:>12} {:>10} {:>9} {:>12} {:>10} {:>12} {:>10}",
            name, qs.0, qs.1, states, ls.0, ls.1, xs.0, xs.1
        );
        let mut row = json!({
            "schema": name,
            "quarry": match &q {
                Ok((c, f, s)) => json!({"compile_ms": c, "first_mask_ms": f, "states": s["states"], "dfa_bytes": s["dfa_bytes"]}),
                Err(e) => json!({"error": format!("{e:#}")}),
            },
            "llguidance": match &l {
                Ok((c, f)) => json!({"compile_ms": c, "first_mask_ms": f}),
                Err(e) => json!({"error": format!("{e:#}")}),
            },
        });
        if let Some(x) = &x {
            row["xgrammar"] = match x {
                Ok((c, f, warnings)) => {
                    json!({"compile_ms": c, "first_mask_ms": f, "warnings": warnings})
                }
                Err(e) => json!({"error": format!("{e:#}")}),
            };
        }
        rows.push(row);
    }
    // Summary: each engine over what it compiles, then quarry and each peer over what both
    // compile, and over what xgrammar compiles without ignoring a keyword ("exact").
    let compiled = |r: &Value, engine: &str| {
        let (engine, exact) = match engine.strip_suffix(" exact") {
            Some(e) => (e, true),
            None => (engine, false),
        };
        r[engine].is_object()
            && r[engine].get("error").is_none()
            && (!exact || r[engine]["warnings"].as_array().is_none_or(Vec::is_empty))
    };
    let times = |engine: &str, key: &str, with: Option<&str>| -> Vec<f64> {
        rows.iter()
            .filter(|r| with.is_none_or(|w| compiled(r, "quarry") && compiled(r, w)))
            .filter_map(|r| r[engine][key].as_f64())
            .collect()
    };
    let mut summary = Vec::new();
    println!(
        "\n{} schemas, vocabulary of {} tokens, median of {} compiles",
        files.len(),
        mv.vocab.len(),
        args.reps
    );
    println!(
        "{:<12} {:<22} {:>9} {:>11} {:>11} {:>11} {:>11}",
        "engine", "set", "compiled", "p50 ms", "p99 ms", "TTFM p50", "TTFM p99"
    );
    let peers: &[&str] = if xgr.is_some() {
        &["llguidance", "xgrammar"]
    } else {
        &["llguidance"]
    };
    let mut sets: Vec<(&str, Option<&str>)> = vec![("quarry", None)];
    sets.extend(peers.iter().map(|&p| (p, None)));
    for &p in peers {
        sets.push(("quarry", Some(p)));
        sets.push((p, Some(p)));
    }
    if xgr.is_some() {
        sets.push(("quarry", Some("xgrammar exact")));
        sets.push(("xgrammar", Some("xgrammar exact")));
    }
    for (engine, with) in sets {
        let c = times(engine, "compile_ms", with);
        let f = times(engine, "first_mask_ms", with);
        // "both" is what the summary called quarry ∩ llguidance before xgrammar joined.
        let set = match with {
            None => "own".to_string(),
            Some("llguidance") => "both".to_string(),
            Some(p) => format!("both, {p}"),
        };
        println!(
            "{:<12} {:<22} {:>9} {:>11.2} {:>11.2} {:>11.2} {:>11.2}",
            engine,
            set,
            c.len(),
            quantile(&c, 0.5),
            quantile(&c, 0.99),
            quantile(&f, 0.5),
            quantile(&f, 0.99)
        );
        summary.push(json!({
            "engine": engine, "set": set, "compiled": c.len(),
            "compile_p50_ms": quantile(&c, 0.5), "compile_p99_ms": quantile(&c, 0.99),
            "first_mask_p50_ms": quantile(&f, 0.5), "first_mask_p99_ms": quantile(&f, 0.99),
        }));
    }
    let ignored = xgrammar_ignored(&rows);
    let unique = unique_items(&mv.vocab, args.reps.max(20))?;
    let intersections = intersections(&mv, &llg, xgr.as_ref(), args)?;
    Ok(json!({
        "model": model.display().to_string(),
        "vocab": mv.vocab.len(),
        "summary": summary,
        "xgrammar": xgr.as_ref().map(|x| x.setup.to_json()),
        "xgrammar_ignored": ignored,
        "schemas": rows,
        "unique_items": unique,
        "intersections": intersections,
    }))
}

/// The schemas xgrammar compiled while warning that it ignores part of them (so that its
/// language is wider than the schema's), printed and returned as each kind of warning's schema
/// count ([`warning_kind`]).
fn xgrammar_ignored(rows: &[Value]) -> Value {
    let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
    let mut schemas = 0;
    for r in rows {
        let warnings = r["xgrammar"]["warnings"].as_array();
        if let Some(ws) = warnings.filter(|ws| !ws.is_empty()) {
            schemas += 1;
            let kinds: std::collections::BTreeSet<String> = ws
                .iter()
                .filter_map(Value::as_str)
                .map(warning_kind)
                .collect();
            for kind in kinds {
                *by_kind.entry(kind).or_default() += 1;
            }
        }
    }
    if schemas > 0 {
        println!("xgrammar compiled {schemas} schemas while warning that it ignores part of them:");
        for (kind, n) in &by_kind {
            println!("  {n:>4} schemas: {kind}");
        }
    }
    json!({"schemas": schemas, "kinds": by_kind})
}

/// A warning without the regex or position it names: `Lookahead assertion is not supported and
/// is ignored in regex: ^(?!aws:).*$` is `Lookahead assertion is not supported and is ignored in
/// regex`, `Regex parsing warning at position 14: Escape sequence '\p' is not recognized` is
/// `Regex parsing warning: Escape sequence '\p' is not recognized`.
fn warning_kind(message: &str) -> String {
    let mut kind = message.to_string();
    for cut in ["ignored in regex: ", "is ignored: "] {
        if let Some(i) = kind.find(cut) {
            kind.truncate(i + cut.len() - 2);
        }
    }
    if let (Some(i), Some(j)) = (kind.find(" at position "), kind.find(": ")) {
        if i < j {
            kind.replace_range(i..j, "");
        }
    }
    kind.split(". ").next().unwrap_or("").to_string()
}

/// Schemas whose keywords intersect on the same text, each with an output it accepts: one per
/// combination of keywords, then all of them but `propertyNames` (which llguidance refuses).
fn intersection_cases() -> Vec<(&'static str, Value, String)> {
    let parts = [
        (
            "pattern-length",
            "sku",
            json!({"type": "string", "pattern": "^[A-Z]{2,4}-[0-9]+$", "maxLength": 12}),
            r#""ABC-12345""#,
        ),
        (
            "search-length",
            "slug",
            json!({"type": "string", "pattern": "[a-z]", "minLength": 3, "maxLength": 24}),
            r#""hello-world-2026""#,
        ),
        (
            "format-length",
            "email",
            json!({"type": "string", "format": "email", "maxLength": 40}),
            r#""ada.lovelace@example.org""#,
        ),
        (
            "not-enum",
            "status",
            json!({"type": "string", "not": {"enum": ["deleted", "banned"]}}),
            r#""active""#,
        ),
        (
            "property-names",
            "labels",
            json!({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 10},
            "additionalProperties": {"type": "integer"}}),
            r#"{"red":1,"blue":22}"#,
        ),
    ];
    let object = |props: &[(&str, &Value)]| {
        let names: Vec<&str> = props.iter().map(|(k, _)| *k).collect();
        let map: serde_json::Map<String, Value> = props
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).clone()))
            .collect();
        json!({"type": "object", "properties": map, "required": names, "additionalProperties": false})
    };
    let mut cases: Vec<(&'static str, Value, String)> = parts
        .iter()
        .map(|(case, key, schema, value)| {
            (
                *case,
                object(&[(key, schema)]),
                format!(r#"{{"{key}":{value}}}"#),
            )
        })
        .collect();
    let all: Vec<_> = parts.iter().filter(|p| p.0 != "property-names").collect();
    cases.push((
        "mixed",
        object(&all.iter().map(|(_, k, s, _)| (*k, s)).collect::<Vec<_>>()),
        format!(
            "{{{}}}",
            all.iter()
                .map(|(_, k, _, v)| format!(r#""{k}":{v}"#))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ));
    cases
}

/// Per-token mask times along the outputs of [`intersection_cases`], both engines.
fn intersections(
    mv: &ModelVocab,
    llg: &Llguidance,
    xgr: Option<&Xgrammar>,
    args: &Args,
) -> Result<Vec<Value>> {
    let quarry = Quarry {
        vocab: mv.vocab.clone(),
        eager: false,
    };
    let model = "schema-bench";
    println!("\nmasks through intersections (cold: a fresh compile per walk)");
    print_header();
    let mut out = Vec::new();
    for (name, schema, text) in intersection_cases() {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let tokens = mv.tokenizer.encode(&text)?;
        let run = Run {
            model,
            case: name,
            tokens: &tokens,
            mask_words: mv.vocab.mask_words(),
            cold_reps: args.reps,
            warm_reps: args.reps.max(20),
        };
        let peers: [&dyn Peer; 2] = [&quarry, llg];
        let spec = Spec::Schema(schema.clone());
        for peer in peers {
            out.push(run_case(peer, &spec, &run));
        }
        if let Some(xgr) = xgr {
            out.push(run_xgrammar_case(xgr, &quarry, &spec, &run));
        }
    }
    Ok(out)
}

/// Warm `fill_mask` times (median µs) at points inside arrays whose items must be unique, with
/// the check and without it (the same schema minus `uniqueItems`).
fn unique_items(vocab: &Arc<quarry_grammar::Vocabulary>, reps: usize) -> Result<Value> {
    let with = json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}, "uniqueItems": true},
            "points": {"type": "array", "uniqueItems": true, "items": {
                "type": "object", "properties": {"x": {"type": "integer"}, "label": {"type": "string"}},
                "required": ["x", "label"], "additionalProperties": false}}
        },
        "required": ["tags", "points"],
        "additionalProperties": false
    });
    let mut without = with.clone();
    for k in ["tags", "points"] {
        without["properties"][k]
            .as_object_mut()
            .expect("an object")
            .remove("uniqueItems");
    }
    let points = [
        ("inside a string item", r#"{"tags":["alpha","beta","gam"#),
        ("after a string item", r#"{"tags":["alpha","beta""#),
        (
            "inside an object item",
            r#"{"tags":["a"],"points":[{"x":1,"label":"one"},{"x":2,"label":"tw"#,
        ),
    ];
    let compile = |schema: &Value| -> Result<Arc<Grammar>> {
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
            options: SchemaOptions::default(),
        };
        Ok(Arc::new(Grammar::compile(
            &c,
            vocab.clone(),
            Limits::default(),
        )?))
    };
    let (gw, go) = (compile(&with)?, compile(&without)?);
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut out = Vec::new();
    println!("\nuniqueItems checked while decoding: warm mask, median of {reps} (µs)");
    println!(
        "{:<24} {:>12} {:>12} {:>8}",
        "point", "checked", "unchecked", "ratio"
    );
    for (name, prefix) in points {
        let mut time = |g: &Arc<Grammar>| -> Result<f64> {
            let mut m = Matcher::new(g.clone());
            m.accept_bytes(prefix.as_bytes())?;
            m.fill_mask(&mut mask);
            let mut ts = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                m.fill_mask(&mut mask);
                ts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            Ok(median(ts))
        };
        let (c, u) = (time(&gw)?, time(&go)?);
        println!("{name:<24} {c:>12.1} {u:>12.1} {:>8.1}", c / u);
        out.push(json!({"point": name, "checked_us": c, "unchecked_us": u}));
    }
    Ok(Value::Array(out))
}
