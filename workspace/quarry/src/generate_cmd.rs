//! `quarry generate`: text generation through the engine, free or constrained, one prompt streamed
//! or a JSONL batch, ending with the measured speed (and the engine's counters with `--stats`).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use quarry_engine::{
    Completion, ConstraintSpec, Engine, EngineConfig, EngineStats, FinishReason, Prompt, Request,
};
use quarry_grammar::{SchemaOptions, Whitespace};
use quarry_model::SamplingParams;
use quarry_tokenizer::{ChatMessage, ChatVars};
use serde_json::{json, Value};

use crate::ModelArg;

#[derive(Args)]
#[command(after_help = "Examples:
  quarry generate --prompt 'The capital of France is'
  quarry generate --chat --prompt 'Name three Debian package managers.' --max-tokens 64
  quarry generate --prompt 'Once upon a time' --temperature 0.8 --top-p 0.95 --seed 7
  quarry generate --chat --prompt 'Is the sky blue?' --choice yes --choice no
  quarry generate --chat --prompt 'Describe curl as JSON' --schema schemas/debian-package.json --stats
  quarry generate --batch prompts.jsonl --json-object --chat > results.jsonl
  quarry generate --chat --prompt 'Write 12*(3+4) as arithmetic' --grammar workspace/quarry-grammar/tests/grammars/arithmetic.gbnf

A --batch file has one request per line: {\"prompt\": \"text\"} or
{\"prompt\": [{\"role\": \"user\", \"content\": \"…\"}]}, optionally with \"constraint\"
({\"regex\": …}, {\"choice\": […]}, {\"json_schema\": {…}}, \"json_object\",
{\"grammar\": \"root ::= …\"}), \"max_tokens\",
\"temperature\", \"top_p\", \"top_k\", \"seed\", \"stop\", \"processors\" and \"reasoning\".
Keys a line leaves out come from the command line. Results are JSON lines in input order.")]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    runtime: crate::RuntimeArgs,
    /// The prompt text.
    #[arg(
        long,
        required_unless_present = "batch",
        conflicts_with = "batch",
        allow_hyphen_values = true
    )]
    prompt: Option<String>,
    /// A JSONL file of requests, run together (continuous batching, shared prefixes cached).
    #[arg(long, value_name = "FILE.jsonl")]
    batch: Option<PathBuf>,
    /// Wrap text prompts in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// A variable the chat template sees (transformers' `chat_template_kwargs`): KEY=VALUE,
    /// VALUE as JSON where it is JSON, else a string (repeat the flag). `enable_thinking` is
    /// false unless set here (true for a request in a reasoning mode).
    #[arg(long, value_name = "KEY=VALUE", value_parser = ChatVars::parse_pair)]
    chat_var: Vec<(String, serde_json::Value)>,
    /// The output must match this regex.
    #[arg(long, group = "constraint", allow_hyphen_values = true)]
    regex: Option<String>,
    /// The output must be one of these strings (repeat the flag).
    #[arg(long, group = "constraint", allow_hyphen_values = true)]
    choice: Vec<String>,
    /// The output must be JSON valid against this JSON Schema file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    schema: Option<PathBuf>,
    /// With --schema: a JSON Schema document its `$ref`s name (repeat the flag), known by its
    /// file's location and its own `$id`.
    #[arg(long, value_name = "FILE", requires = "schema")]
    schema_resource: Vec<PathBuf>,
    /// The output must be a JSON object (its values nested to any depth).
    #[arg(long, group = "constraint")]
    json_object: bool,
    /// The output must follow this grammar: GBNF (llama.cpp's syntax), or Lark's syntax for a
    /// `.lark` file.
    #[arg(long, value_name = "FILE.gbnf|FILE.lark", group = "constraint")]
    grammar: Option<PathBuf>,
    /// Layout of --schema and --json-object output: compact (`{"a":1,"b":2}`), spaced
    /// (`{"a": 1, "b": 2}`), pretty (up to 8 whitespace bytes around each token) or pretty:N.
    #[arg(long, value_name = "LAYOUT", default_value_t = EngineConfig::default().schema_options.whitespace)]
    whitespace: Whitespace,
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Stop before this string (free text; repeat the flag).
    #[arg(long, allow_hyphen_values = true)]
    stop: Vec<String>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampling stream: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sample every token, even where the constraint forces the next bytes (for A/B runs).
    #[arg(long)]
    no_jump_forward: bool,
    /// Jump-forward: tokens at the end of a re-encoded boundary left for the model to choose
    /// (0 forces every forced byte; the engine benchmark in BENCHMARKS.md compares 0, 1 and 2).
    #[arg(long, value_name = "N", default_value_t = EngineConfig::default().keep_back)]
    keep_back: usize,
    /// Jump-forward: leave the kept-back tokens to the model outright, instead of appending them
    /// as drafts that the next forward pass verifies (same output, more passes; for A/B runs).
    #[arg(long)]
    no_drafts: bool,
    /// Recompute every prompt instead of reusing cached prefixes (for A/B runs).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Sequences decoding at once.
    #[arg(long, default_value_t = EngineConfig::default().max_running)]
    max_running: usize,
    /// Positions of keys and values the engine's pool holds. Default: on a GPU, every position
    /// its free memory holds once the model is loaded; on a CPU, 16,384.
    #[arg(long, value_name = "N")]
    kv_tokens: Option<usize>,
    /// Tokens a forward pass computes at most. Default: on a GPU, 4,096 or twice
    /// `--max-running`; on a CPU, 512 or `--max-running`.
    #[arg(long, value_name = "N")]
    step_tokens: Option<usize>,
    /// Print forward passes, forced tokens, cache hits and mask time (stderr).
    #[arg(long)]
    stats: bool,
    /// `cpu`, or `cuda:N` in a build with CUDA (`make build-cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

impl GenerateArgs {
    fn constraint(&self) -> Result<ConstraintSpec> {
        Ok(if let Some(r) = &self.regex {
            ConstraintSpec::Regex(r.clone())
        } else if !self.choice.is_empty() {
            ConstraintSpec::Choice(self.choice.clone())
        } else if let Some(path) = &self.schema {
            ConstraintSpec::JsonSchema(crate::load_schema(path, &self.schema_resource)?)
        } else if let Some(path) = &self.grammar {
            ConstraintSpec::grammar_file(
                path,
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the grammar {}", path.display()))?,
            )
        } else if self.json_object {
            ConstraintSpec::JsonObject
        } else {
            ConstraintSpec::None
        })
    }

    /// The request the command-line flags describe, as JSON (batch lines override its keys).
    fn defaults(&self) -> Result<Value> {
        let sampling = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        };
        sampling.validate()?;
        let r = Request::text("")
            .with_constraint(self.constraint()?)
            .with_sampling(sampling)
            .with_max_tokens(self.max_tokens);
        let mut v = serde_json::to_value(Request {
            stop: self.stop.clone(),
            ..r
        })?;
        v.as_object_mut()
            .expect("a request is an object")
            .remove("prompt");
        Ok(v)
    }

    fn prompt(&self, text: String) -> Prompt {
        if self.chat {
            Prompt::Chat(vec![ChatMessage::new("user", text)])
        } else {
            Prompt::Text(text)
        }
    }
}

pub(crate) fn run(args: GenerateArgs) -> Result<()> {
    let defaults = args.defaults()?;
    let loaded = crate::load_model(&args.model.model, &args.device, args.runtime.options()?)?;
    let sizes = loaded.batch_sizes(args.max_running, args.kv_tokens, args.step_tokens)?;
    let cfg = EngineConfig {
        jump_forward: !args.no_jump_forward,
        keep_back: args.keep_back,
        draft_kept_back: !args.no_drafts,
        radix_cache: !args.no_prefix_cache,
        max_running: args.max_running,
        step_tokens: sizes.step_tokens,
        kv_tokens: sizes.kv_tokens,
        schema_options: SchemaOptions {
            whitespace: args.whitespace,
            ..EngineConfig::default().schema_options
        },
        chat_vars: ChatVars(args.chat_var.iter().cloned().collect()),
        ..EngineConfig::default()
    };
    let mut engine = loaded.engine(cfg)?;
    let started = Instant::now();
    let completions = match &args.batch {
        Some(path) => {
            let requests = read_batch(path, &defaults, &args)?;
            let out = engine.run_batch(requests)?;
            let stdout = std::io::stdout();
            let mut w = stdout.lock();
            for (i, c) in out.iter().enumerate() {
                writeln!(w, "{}", result_line(i, c))?;
            }
            out
        }
        None => {
            let text = args
                .prompt
                .clone()
                .expect("clap requires --prompt without --batch");
            let mut v = defaults;
            v["prompt"] = serde_json::to_value(args.prompt(text))?;
            let req: Request = serde_json::from_value(v)?;
            vec![stream_one(&mut engine, req)?]
        }
    };
    // A single prompt that could not run is the command's error (one line, exit 2).
    if let (None, [c]) = (&args.batch, &completions[..]) {
        match &c.finish {
            FinishReason::Error(m) => bail!("{m}"),
            FinishReason::BudgetTooSmall {
                shortest,
                max_tokens,
            } => bail!(
                "--max-tokens is {max_tokens}, but the constraint's shortest record takes {shortest} tokens: raise it to at least {shortest} (docs/budget.md)"
            ),
            _ => {}
        }
    }
    report(
        &engine.stats(),
        &completions,
        started.elapsed().as_secs_f64(),
        args.stats,
    );
    Ok(())
}

/// Runs one request, printing its output as it grows (whole UTF-8 characters only).
fn stream_one(engine: &mut Engine, req: Request) -> Result<Completion> {
    // Bytes that could still turn out to start a stop string are shown only at the end.
    let hold = req.stop.iter().map(|s| s.len()).max().unwrap_or(0);
    let id = engine.submit(req)?;
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let mut printed = 0usize;
    loop {
        let mut done = engine.step()?;
        if let Some(c) = done.pop() {
            let bytes = c.text.as_bytes();
            // The completion's text is final (a stop string may have cut what was shown).
            if printed <= bytes.len() {
                w.write_all(&bytes[printed..])?;
            }
            writeln!(w)?;
            return Ok(c);
        }
        if let Some(out) = engine.partial_output(id) {
            let out = &out[..out.len().saturating_sub(hold).max(printed)];
            let complete = match std::str::from_utf8(&out[printed..]) {
                Ok(s) => s.len(),
                Err(e) => e.valid_up_to(),
            };
            w.write_all(&out[printed..printed + complete])?;
            w.flush()?;
            printed += complete;
        }
    }
}

fn read_batch(path: &PathBuf, defaults: &Value, args: &GenerateArgs) -> Result<Vec<Request>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let mut v: Value = serde_json::from_str(&line).with_context(at)?;
        let Some(obj) = v.as_object_mut() else {
            bail!("{}: a request must be a JSON object", at());
        };
        for (k, dv) in defaults.as_object().expect("object") {
            obj.entry(k.clone()).or_insert_with(|| dv.clone());
        }
        let mut req: Request = serde_json::from_value(v).with_context(at)?;
        if let Prompt::Text(t) = &req.prompt {
            req.prompt = args.prompt(t.clone());
        }
        out.push(req);
    }
    if out.is_empty() {
        bail!("{} holds no requests", path.display());
    }
    Ok(out)
}

fn result_line(index: usize, c: &Completion) -> Value {
    let mut v = json!({
        "index": index,
        "text": c.text,
        "finish": c.finish.as_str(),
        "output_tokens": c.stats.output_tokens,
        "forced_tokens": c.stats.forced_tokens,
        "cached_tokens": c.stats.cached_tokens,
        "forward_passes": c.stats.forward_passes,
    });
    if let FinishReason::Error(m) = &c.finish {
        v["error"] = json!(m);
    }
    if let FinishReason::BudgetTooSmall {
        shortest,
        max_tokens,
    } = &c.finish
    {
        v["error"] = json!(format!(
            "max_tokens is {max_tokens}, but the constraint's shortest record takes {shortest} tokens"
        ));
    }
    if let Some(r) = &c.reasoning {
        v["reasoning"] = json!(r);
    }
    v
}

fn report(s: &EngineStats, done: &[Completion], wall_s: f64, verbose: bool) {
    let prompt: usize = done.iter().map(|c| c.stats.prompt_tokens).sum();
    let output: usize = done.iter().map(|c| c.stats.output_tokens).sum();
    let finishes = {
        let mut f: Vec<(&str, usize)> = Vec::new();
        for c in done {
            match f.iter_mut().find(|(k, _)| *k == c.finish.as_str()) {
                Some(e) => e.1 += 1,
                None => f.push((c.finish.as_str(), 1)),
            }
        }
        f.iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "[{} request(s): {prompt} prompt tokens, {output} output tokens in {wall_s:.2} s, {:.1} output tok/s; {finishes}]",
        done.len(),
        output as f64 / wall_s.max(1e-9),
    );
    if verbose {
        eprintln!(
            "[forward passes {} ({} tokens, {:.2} s); sampled {} and forced {} tokens ({:.1}% forced); \
             cache hits {} of {} prompt tokens ({:.1}%), {} pages evicted; mask {:.1} µs/step over {} steps; \
             cache overhead {:.3}% of step time]",
            s.forward_passes,
            s.forward_tokens,
            s.forward_s,
            s.sampled_tokens,
            s.forced_tokens,
            100.0 * s.forced_share(),
            s.cache.hit_tokens,
            s.cache.hit_tokens + s.cache.miss_tokens,
            100.0 * s.cache.hit_rate(),
            s.cache.evicted_pages,
            s.mask_us_per_step(),
            s.mask_steps,
            100.0 * s.cache_overhead(),
        );
    }
}
