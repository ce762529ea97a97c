//! quarry-eval: the evaluation workload behind `quarry bench` (a batch-size sweep on any device)
//! and the `engine-bench` A/B runs, kept out of the job runner so that production crates hold
//! production code: real package records with a shared instruction and the package
//! schema, run through the engine on a fresh [`Engine`] per measurement.
//!
//! The documents are this machine's Debian package database (`/var/lib/dpkg/status`), or any JSONL
//! file of objects with a `text` field, so a run on another machine measures the same kind of work.
//! Every prompt starts with the same instruction of about 300 tokens, which is what the radix cache
//! shares between documents.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use quarry_engine::{ConstraintSpec, Engine, EngineConfig, Prompt, Request};
use quarry_grammar::{Grammar, Matcher};
use quarry_model::Llama;
use quarry_tokenizer::{ChatMessage, Tokenizer};
use serde::Serialize;
use serde_json::Value;

/// This machine's CPU model name (`/proc/cpuinfo`), for benchmark records.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
}

/// What can stop an evaluation run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Documents that cannot be read, or a text the constraint refuses.
    #[error("input {location}: {message}")]
    Input { location: String, message: String },
    /// The engine cannot start or run, or it reported a wrong answer as complete.
    #[error("engine: {0}")]
    Engine(String),
}

/// The instruction every benchmark prompt starts with (shared prefix of about 300 tokens).
pub const PACKAGE_INSTRUCTION: &str = "You are a careful data extraction assistant working on the \
Debian package database. You will be shown one package record in the format of \
/var/lib/dpkg/status. Each record is a list of fields: Package gives the package name, Version the \
full version string including any epoch and Debian revision, Maintainer the name and email address \
of the person or team responsible for the package, Depends and Pre-Depends the comma separated list \
of packages it needs (each possibly with a version constraint in parentheses and alternatives \
separated by a vertical bar), Homepage the upstream project's web site, and Description a one-line \
summary followed by a longer description. Extract these facts into a JSON object with the keys \
name, version, maintainer, depends, homepage and summary. Copy values exactly as they appear in the \
record, without changing spelling or case. The depends value is a list with one string per \
dependency as written in the record, in the same order; use an empty list when the package has no \
dependencies. The summary is the first line of the description only. Do not invent values that the \
record does not contain, do not add explanations, and do not wrap the JSON in code fences. Answer \
with the JSON object and nothing else. Keep the keys in the order given above, write every string \
on one line, escape quotation marks inside values as JSON requires, and keep email addresses inside \
angle brackets exactly as the record shows them. If a field appears twice, use its first \
occurrence.\n\n";

/// The fields of a status entry the workload keeps (the rest, such as file lists and conffiles,
/// would only lengthen prompts).
const KEPT_FIELDS: [&str; 11] = [
    "Package",
    "Version",
    "Maintainer",
    "Depends",
    "Pre-Depends",
    "Homepage",
    "Description",
    "Priority",
    "Section",
    "Installed-Size",
    "Essential",
];

/// `n` package records with a homepage and a description, spread evenly over the sorted database,
/// each cut to [`KEPT_FIELDS`] and the first lines of its description.
pub fn package_records(status: &Path, n: usize) -> Result<Vec<String>, EvalError> {
    let records = usable_package_records(status)?;
    spread(records, n).map_err(|message| EvalError::Input {
        location: status.display().to_string(),
        message,
    })
}

/// Every usable record of a Debian package database (with a homepage and a description, cut as
/// [`package_records`] cuts them), sorted.
pub fn usable_package_records(status: &Path) -> Result<Vec<String>, EvalError> {
    let input_err = |message: String| EvalError::Input {
        location: status.display().to_string(),
        message,
    };
    let text = std::fs::read(status).map_err(|e| {
        input_err(format!(
            "{e} (the package workload needs a Debian package database; pass --input FILE.jsonl \
             elsewhere)"
        ))
    })?;
    let text = String::from_utf8_lossy(&text);
    let mut records: Vec<String> = text
        .split("\n\n")
        .filter(|r| r.contains("\nHomepage: ") && r.contains("\nDescription: "))
        .map(cut_record)
        .collect();
    records.sort();
    Ok(records)
}

fn cut_record(r: &str) -> String {
    let mut out = String::new();
    let mut desc_lines = 0;
    let mut in_kept = false;
    for line in r.lines() {
        if line.starts_with(' ') {
            if in_kept && desc_lines > 0 && desc_lines < 3 {
                out.push_str(line);
                out.push('\n');
                desc_lines += 1;
            }
            continue;
        }
        let key = line.split(':').next().unwrap_or("");
        in_kept = KEPT_FIELDS.contains(&key);
        if in_kept {
            out.push_str(line);
            out.push('\n');
            if key == "Description" {
                desc_lines = 1;
            }
        }
    }
    out
}

/// `n` documents from a JSONL file of objects with a string `text` field, spread over the file.
pub fn jsonl_records(path: &Path, n: usize) -> Result<Vec<String>, EvalError> {
    let input_err = |message: String| EvalError::Input {
        location: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| input_err(e.to_string()))?;
    let mut docs = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| input_err(format!("line {}: not JSON: {e}", i + 1)))?;
        match v.get("text").and_then(Value::as_str) {
            Some(t) => docs.push(t.to_string()),
            None => {
                return Err(input_err(format!(
                    "line {}: no string field \"text\"",
                    i + 1
                )))
            }
        }
    }
    spread(docs, n).map_err(input_err)
}

fn spread(records: Vec<String>, n: usize) -> Result<Vec<String>, String> {
    if n == 0 {
        return Err("asked for 0 documents".into());
    }
    if records.len() < n {
        return Err(format!(
            "has only {} usable documents, {n} asked for",
            records.len()
        ));
    }
    let step = records.len() / n;
    Ok((0..n).map(|i| records[i * step].clone()).collect())
}

/// The value of `key` in a package record (its first occurrence, first line), if present.
fn record_field<'a>(record: &'a str, key: &str) -> Option<&'a str> {
    record
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// The facts each package output is scored on by [`facts_correct`].
pub const FACTS: [&str; 6] = [
    "name",
    "version",
    "maintainer",
    "depends",
    "homepage",
    "summary",
];

/// How many of the [`FACTS`] the output states as the record does, by the rules of the demo's
/// accuracy report (`infra/demo_report.py`): `name`, `version`, `maintainer` and `homepage` are
/// the Package, Version, Maintainer and Homepage fields, `summary` the first line of the
/// description, `depends` the Depends field split at commas (empty when absent); strings compare
/// after trimming spaces. The output's first JSON object counts, so a free-text answer wrapped in
/// a code fence is scored too; truncated JSON scores nothing.
pub fn facts_correct(record: &str, output: &str) -> usize {
    facts_right(record, output).iter().filter(|&&r| r).count()
}

/// Which of the [`FACTS`] (in that order) the output states as the record does, by the rules of
/// [`facts_correct`].
pub fn facts_right(record: &str, output: &str) -> [bool; 6] {
    let mut right = [false; 6];
    let Some(start) = output.find('{') else {
        return right;
    };
    let Some(Ok(Value::Object(got))) = serde_json::Deserializer::from_str(&output[start..])
        .into_iter::<Value>()
        .next()
    else {
        return right;
    };
    let depends: Vec<&str> = record_field(record, "Depends")
        .map(|d| {
            d.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let same = |key: &str, want: Option<&str>| match (got.get(key), want) {
        (Some(Value::String(v)), Some(w)) => v.trim() == w,
        (Some(Value::Null) | None, None) => true,
        _ => false,
    };
    for (i, fact) in FACTS.iter().enumerate() {
        let field = match *fact {
            "name" => "Package",
            "version" => "Version",
            "maintainer" => "Maintainer",
            "homepage" => "Homepage",
            "summary" => "Description",
            _ => continue,
        };
        right[i] = same(fact, record_field(record, field));
    }
    if let Some(Value::Array(list)) = got.get("depends") {
        right[3] = list.len() == depends.len()
            && list
                .iter()
                .zip(&depends)
                .all(|(v, w)| v.as_str().is_some_and(|v| v.trim() == *w));
    }
    right
}

/// Which bytes of `text` its grammar forces: walking the text from the start, wherever the
/// grammar leaves one continuation ([`Matcher::forced_bytes`]) those bytes are marked. This is the
/// most any jump-forward could append without sampling, whatever its keep-back rule. Errors
/// (naming the byte offset) when `text` does not follow the grammar.
pub fn forced_byte_mask(grammar: &Arc<Grammar>, text: &[u8]) -> Result<Vec<bool>, EvalError> {
    let mut m = Matcher::new(grammar.clone());
    let mut mask = vec![false; text.len()];
    let mut pos = 0;
    let off_grammar = |at: usize| EvalError::Input {
        location: format!("output byte {at}"),
        message: "the text does not follow the grammar".into(),
    };
    while pos < text.len() {
        let forced = m.forced_bytes().len();
        let (n, is_forced) = if forced > 0 && text[pos..].starts_with(m.forced_bytes()) {
            (forced, true)
        } else {
            (1, false)
        };
        m.accept_bytes(&text[pos..pos + n])
            .map_err(|_| off_grammar(pos))?;
        mask[pos..pos + n].fill(is_forced);
        pos += n;
    }
    Ok(mask)
}

/// How many of `tokens` (the byte strings of a tokenization of the text `mask` covers, in order)
/// lie wholly in forced bytes. Of a canonical tokenization, that is the ceiling on the share of
/// output tokens jump-forward can force.
pub fn forced_tokens<'a>(mask: &[bool], tokens: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut pos = 0;
    let mut n = 0;
    for t in tokens {
        let end = (pos + t.len()).min(mask.len());
        if end > pos && mask[pos..end].iter().all(|&f| f) {
            n += 1;
        }
        pos = end;
    }
    n
}

/// One request per document: the chat-rendered instruction plus the document, the schema as the
/// constraint (or none), greedy, at most `max_tokens`.
pub fn requests(docs: &[String], schema: Option<&Value>, max_tokens: usize) -> Vec<Request> {
    docs.iter()
        .map(|d| {
            let prompt = Prompt::Chat(vec![ChatMessage::new(
                "user",
                format!("{PACKAGE_INSTRUCTION}{d}"),
            )]);
            let c = schema.map_or(ConstraintSpec::None, |s| {
                ConstraintSpec::JsonSchema(s.clone())
            });
            Request::new(prompt)
                .with_constraint(c)
                .with_max_tokens(max_tokens)
        })
        .collect()
}

/// What one measured run gives; every benchmark reports these names.
#[derive(Debug, Clone, Serialize)]
pub struct RunMetrics {
    pub docs: usize,
    pub wall_s: f64,
    pub docs_per_s: f64,
    pub output_tokens: usize,
    pub output_tokens_per_s: f64,
    /// Median over requests of the time between output tokens after the first (decode latency).
    pub tpot_ms: f64,
    /// Median over requests of the time from admission (the first forward pass) to the first
    /// output token: prefill latency, without the wait for a free batch slot.
    pub ttft_ms: f64,
    pub forward_passes: u64,
    pub forward_tokens: u64,
    /// Seconds inside the model's forward passes (the rest of the wall time is scheduling,
    /// sampling and masks not hidden behind the forward pass).
    pub forward_s: f64,
    /// Seconds in the steps' draws (on a GPU the sampling kernel and the wait for its tokens).
    pub sample_s: f64,
    /// Output tokens appended without sampling (jump-forward), over all output tokens.
    pub forced_share: f64,
    /// Prompt tokens served from the radix cache, over all prompt tokens looked up.
    pub hit_rate: f64,
    /// Mask computation per engine step, in microseconds.
    pub mask_us_per_step: f64,
    /// What a step waited for its masks after the forward pass returned, in microseconds: the
    /// mask time not hidden behind the pass (on a GPU, behind its launches and device work).
    pub mask_wait_us_per_step: f64,
    /// Seconds of the wall time that were neither the forward call, the draws nor the wait for
    /// masks: the host's own scheduling, radix cache, jump-forward and bookkeeping, during which
    /// a GPU sits idle.
    pub host_s: f64,
    /// Seconds tokenizing prompts before the first step (on every core; in the wall time, in no
    /// step's), and beside the passes (requests submitted mid-run; `run_batch` submits none).
    pub prompt_s: f64,
    pub prompt_beside_s: f64,
    /// Radix-cache bookkeeping over step time.
    pub cache_overhead: f64,
    pub retokenized_tokens: u64,
    /// Requests that ended complete (constraint complete or stop).
    pub complete: usize,
    /// Requests that ran out of `max_tokens` (or the context, or the pool) before they ended:
    /// under a constraint, records lost.
    pub cut_at_max_tokens: usize,
    /// Requests that ended complete with their end shaped by the token budget
    /// (`budget_closed`, docs/budget.md).
    pub budget_closed: usize,
    /// Draws the budget refused and drew again ([`quarry_engine::EngineStats::budget_redraws`]).
    pub budget_redraws: u64,
    /// The budget's checks and draws again per engine step, in microseconds: its host cost.
    pub budget_us_per_step: f64,
    /// Outputs that parse as JSON and pass the schema (jsonschema crate).
    pub schema_valid: usize,
    /// Each request's output text and finish reason, in request order (not serialized: the
    /// benchmarks write them separately on request).
    #[serde(skip)]
    pub outputs: Vec<(String, String)>,
}

/// Runs `requests` on a fresh engine over `model` with `config` and measures it. An output that
/// the engine reports complete under a constraint but that fails the schema is an error: the
/// benchmark never counts a wrong answer as throughput.
pub fn measure(
    model: &Arc<Llama>,
    tok: &Arc<Tokenizer>,
    config: EngineConfig,
    requests: Vec<Request>,
    validator: &jsonschema::Validator,
) -> Result<RunMetrics, EvalError> {
    let mut engine = Engine::new(model.clone(), tok.clone(), config)
        .map_err(|e| EvalError::Engine(e.to_string()))?;
    measure_on(&mut engine, requests, validator)
}

/// [`measure`] on `engine`, which must be idle with its counters as they should count from
/// (a new engine, or one [`Engine::start_over`] started over: its grammars stay warm).
pub fn measure_on(
    engine: &mut Engine,
    requests: Vec<Request>,
    validator: &jsonschema::Validator,
) -> Result<RunMetrics, EvalError> {
    let constrained: Vec<bool> = requests
        .iter()
        .map(|r| !matches!(r.constraint, ConstraintSpec::None))
        .collect();
    let t = Instant::now();
    let out = engine
        .run_batch(requests)
        .map_err(|e| EvalError::Engine(e.to_string()))?;
    let wall_s = t.elapsed().as_secs_f64();
    let s = engine.stats();
    let valid =
        |text: &str| serde_json::from_str::<Value>(text).is_ok_and(|v| validator.is_valid(&v));
    if let Some((c, _)) = out
        .iter()
        .zip(&constrained)
        .find(|(c, &con)| con && c.is_complete() && !valid(&c.text))
    {
        return Err(EvalError::Engine(format!(
            "a complete constrained output fails the schema: {}",
            c.text
        )));
    }
    let output_tokens: usize = out.iter().map(|c| c.stats.output_tokens).sum();
    let tpot: Vec<f64> = out
        .iter()
        .filter(|c| c.stats.output_tokens > 1)
        .map(|c| {
            1e3 * (c.stats.total_s - c.stats.first_token_s) / (c.stats.output_tokens - 1) as f64
        })
        .collect();
    let ttft: Vec<f64> = out
        .iter()
        .filter(|c| c.stats.output_tokens > 0)
        .map(|c| 1e3 * (c.stats.first_token_s - c.stats.queue_s))
        .collect();
    Ok(RunMetrics {
        docs: out.len(),
        wall_s,
        docs_per_s: out.len() as f64 / wall_s,
        output_tokens,
        output_tokens_per_s: output_tokens as f64 / wall_s,
        tpot_ms: median(tpot),
        ttft_ms: median(ttft),
        forward_passes: s.forward_passes,
        forward_tokens: s.forward_tokens,
        forward_s: s.forward_s,
        sample_s: s.sample_s,
        forced_share: s.forced_share(),
        hit_rate: s.cache.hit_rate(),
        mask_us_per_step: s.mask_us_per_step(),
        mask_wait_us_per_step: s.mask_wait_us_per_step(),
        host_s: (s.schedule_s - s.sample_s - s.mask_wait_s).max(0.0),
        prompt_s: s.prompt_s,
        prompt_beside_s: s.prompt_beside_s,
        cache_overhead: s.cache_overhead(),
        retokenized_tokens: s.retokenized_tokens,
        complete: out.iter().filter(|c| c.is_complete()).count(),
        cut_at_max_tokens: out
            .iter()
            .filter(|c| c.finish == quarry_engine::FinishReason::Length)
            .count(),
        budget_closed: out
            .iter()
            .filter(|c| c.finish == quarry_engine::FinishReason::BudgetClosed)
            .count(),
        budget_redraws: s.budget_redraws,
        budget_us_per_step: s.budget_s * 1e6 / s.steps.max(1) as f64,
        schema_valid: out.iter().filter(|c| valid(&c.text)).count(),
        outputs: out
            .iter()
            .map(|c| (c.text.clone(), c.finish.as_str().to_owned()))
            .collect(),
    })
}

/// The median of samples (the upper middle one for an even count; 0 for none). The benchmark
/// machines are noisy, so every benchmark reports medians.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The run whose `docs_per_s` is the median of `runs` (so every reported number comes from one
/// real run rather than mixing medians of different runs).
pub fn median_run(runs: &[RunMetrics]) -> Option<&RunMetrics> {
    let mut idx: Vec<usize> = (0..runs.len()).collect();
    idx.sort_by(|&a, &b| runs[a].docs_per_s.total_cmp(&runs[b].docs_per_s));
    idx.get(runs.len() / 2).map(|&i| &runs[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Package: b\nVersion: 1\nMaintainer: M <m@x>\nConffiles:\n /etc/b abc\nHomepage: https://b\nDescription: bee\n line one\n line two\n line three\n\nPackage: a\nVersion: 2\nDescription: no homepage\n\nPackage: c\nVersion: 3\nHomepage: https://c\nDescription: sea\n";

    #[test]
    fn package_records_keep_fields_and_two_description_lines() {
        let dir = std::env::temp_dir().join(format!("quarry-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("status");
        std::fs::write(&path, STATUS).unwrap();
        let docs = package_records(&path, 2).unwrap();
        assert_eq!(
            docs[0],
            "Package: b\nVersion: 1\nMaintainer: M <m@x>\nHomepage: https://b\nDescription: bee\n line one\n line two\n"
        );
        assert!(docs[1].starts_with("Package: c\n"));
        let err = package_records(&path, 3).unwrap_err().to_string();
        assert!(err.contains("only 2 usable documents"), "{err}");
        std::fs::write(&path, "{\"text\": \"x\"}\n\n{\"id\": 1}\n").unwrap();
        let err = jsonl_records(&path, 1).unwrap_err().to_string();
        assert!(err.contains("line 3: no string field"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn forced_bytes_are_the_grammar_s_single_continuations() {
        use quarry_grammar::{Constraint, Limits, SchemaOptions, Vocabulary};
        // A vocabulary of every single byte: masks do not matter here, only the automaton.
        let bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
        let vocab = Arc::new(Vocabulary::new(bytes.iter().map(|b| (&b[..], false)), &[]));
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "tags"],
            "additionalProperties": false
        });
        let constraint = Constraint::JsonSchema {
            schema,
            options: SchemaOptions::default(),
        };
        let g = Arc::new(Grammar::compile(&constraint, vocab, Limits::default()).unwrap());
        let text = br#"{"name":"ab","tags":["x"]}"#;
        let mask = forced_byte_mask(&g, text).unwrap();
        let marked: String = text
            .iter()
            .zip(&mask)
            .map(|(&b, &f)| if f { b as char } else { '_' })
            .collect();
        // The opening and the first key are forced. A string may always go on, so its closing
        // quote is a choice; after it the next key is forced, and after the last value the `}`.
        assert_eq!(marked, r#"{"name":"___,"tags":[____}"#);
        // Tokens wholly inside forced runs count; one straddling a choice does not.
        let toks: [&[u8]; 6] = [
            br#"{"name":""#,
            b"ab",
            br#"",""#,
            br#"tags":["#,
            br#""x""#,
            b"]}",
        ];
        assert_eq!(forced_tokens(&mask, toks), 2);
        // Text off the grammar is an error naming the byte.
        let err = forced_byte_mask(&g, br#"{"nam":"#).unwrap_err().to_string();
        assert!(err.contains("output byte"), "{err}");
    }

    #[test]
    fn median_run_is_one_real_run() {
        let run = |d: f64| RunMetrics {
            docs: 1,
            wall_s: 1.0 / d,
            docs_per_s: d,
            output_tokens: 0,
            output_tokens_per_s: 0.0,
            tpot_ms: d,
            ttft_ms: 0.0,
            forward_passes: 0,
            forward_tokens: 0,
            forward_s: 0.0,
            sample_s: 0.0,
            forced_share: 0.0,
            hit_rate: 0.0,
            mask_us_per_step: 0.0,
            mask_wait_us_per_step: 0.0,
            host_s: 0.0,
            prompt_s: 0.0,
            prompt_beside_s: 0.0,
            cache_overhead: 0.0,
            retokenized_tokens: 0,
            complete: 0,
            cut_at_max_tokens: 0,
            budget_closed: 0,
            budget_redraws: 0,
            budget_us_per_step: 0.0,
            schema_valid: 0,
            outputs: Vec::new(),
        };
        let runs = [run(3.0), run(1.0), run(2.0)];
        assert_eq!(median_run(&runs).unwrap().tpot_ms, 2.0);
        assert!(median_run(&[]).is_none());
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![5.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn facts_are_scored_against_the_record() {
        let record = "Package: bzip2\nVersion: 1.0.8-5+b1\nMaintainer: A <a@x>\nPre-Depends: libc6 (>= 2.34)\nDepends: libbz2-1.0 (= 1.0.8-5+b1), dpkg\nHomepage: https://sourceware.org/bzip2/\nDescription: high-quality block-sorting file compressor\n more text\n";
        let out = |depends: &str, summary: &str| {
            format!(
                r#"{{"name": "bzip2", "version": "1.0.8-5+b1", "maintainer": "A <a@x>", "depends": {depends}, "homepage": "https://sourceware.org/bzip2/", "summary": "{summary}"}}"#
            )
        };
        let deps = r#"["libbz2-1.0 (= 1.0.8-5+b1)", "dpkg"]"#;
        let summary = "high-quality block-sorting file compressor";
        assert_eq!(facts_correct(record, &out(deps, summary)), FACTS.len());
        // Depends only, as the demo's report counts it: Pre-Depends entries added are wrong.
        let pre_first = r#"["libc6 (>= 2.34)", "libbz2-1.0 (= 1.0.8-5+b1)", "dpkg"]"#;
        assert_eq!(facts_correct(record, &out(pre_first, summary)), 5);
        // Spaces around values do not count.
        assert_eq!(
            facts_correct(
                record,
                &out(
                    r#"[" libbz2-1.0 (= 1.0.8-5+b1) ", "dpkg"]"#,
                    &format!(" {summary}")
                )
            ),
            6
        );
        // Wrong order, an empty list, a summary with the second line: each costs one fact.
        assert_eq!(
            facts_correct(
                record,
                &out(r#"["dpkg", "libbz2-1.0 (= 1.0.8-5+b1)"]"#, summary)
            ),
            5
        );
        assert_eq!(facts_correct(record, &out("[]", summary)), 5);
        // Which fact was lost, in the order of FACTS.
        assert_eq!(
            facts_right(record, &out("[]", summary)),
            [true, true, true, false, true, true]
        );
        assert_eq!(
            facts_correct(
                record,
                &out(deps, "high-quality block-sorting file compressor more text")
            ),
            5
        );
        // A fenced free-text answer counts; trailing text after the object is ignored.
        let fenced = format!("```json\n{}\n```\nHope this helps", out(deps, summary));
        assert_eq!(facts_correct(record, &fenced), 6);
        // Not JSON, truncated JSON, or not an object: nothing.
        assert_eq!(facts_correct(record, "bzip2 1.0.8"), 0);
        assert_eq!(facts_correct(record, r#"{"name": "bzip2", "vers"#), 0);
        assert_eq!(facts_correct(record, r#"["bzip2"]"#), 0);
        // Without a Depends line the truth is an empty list; without a Homepage, null or absent.
        let bare = "Package: a\nVersion: 1\nMaintainer: M\nDescription: s\n";
        let got = r#"{"name": "a", "version": "1", "maintainer": "M", "depends": [], "homepage": null, "summary": "s"}"#;
        assert_eq!(facts_correct(bare, got), 6);
        let got =
            r#"{"name": "a", "version": "1", "maintainer": "M", "depends": [], "summary": "s"}"#;
        assert_eq!(facts_correct(bare, got), 6);
    }
}
