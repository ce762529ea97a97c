//! `quarry grammar …`: compile a constraint (regex, choice, JSON Schema, GBNF grammar or
//! `json_object`) against a model's
//! vocabulary and look at it from outside: its size and timings, whether a text passes through the
//! token path, the raw mask, and the regex a schema becomes.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use quarry_grammar::schema::canonicalize;
use quarry_grammar::{
    Constraint, Grammar, Limits, Matcher, Rejection, SchemaOptions, Vocabulary, Whitespace,
};
use quarry_tokenizer::Tokenizer;

use crate::{load_tokenizer, show_bytes, ModelArg};

#[derive(Subcommand)]
pub enum GrammarCommand {
    /// Compile a constraint and report DFA states, compile time, time to first mask and mask
    /// density.
    #[command(after_help = "Examples:\n  \
        quarry grammar compile --regex '[0-9]{4}-[0-9]{2}-[0-9]{2}'\n  \
        quarry grammar compile --choice yes --choice no --json\n  \
        quarry grammar compile --schema schemas/debian-package.json --strict\n  \
        quarry grammar compile --grammar workspace/quarry-grammar/tests/grammars/json.gbnf --json\n  \
        quarry grammar compile --json-object")]
    Compile {
        #[command(flatten)]
        constraint: ConstraintArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Read text from stdin and check it through the token path: exit 0 if the constraint
    /// accepts exactly that text, 1 if not, 2 on error.
    #[command(after_help = "Examples:\n  \
        printf 2024-02-29 | quarry grammar accepts --regex '[0-9]{4}-[0-9]{2}-[0-9]{2}'\n  \
        echo maybe | quarry grammar accepts --choice yes --choice no --chomp --explain")]
    Accepts {
        #[command(flatten)]
        constraint: ConstraintArgs,
        /// Say which token was refused, and what was allowed there.
        #[arg(long)]
        explain: bool,
        /// Drop one trailing newline (`\n` or `\r\n`) from the input, as `echo` adds one.
        #[arg(long)]
        chomp: bool,
        /// With --schema: parse the input as JSON and re-serialize it in canonical form first.
        #[arg(long, requires = "schema")]
        canonicalize: bool,
    },
    /// Print the regex a constraint compiles from (for a schema, the derived regex; for a
    /// recursive schema or --json-object, one regex per rule).
    #[command(after_help = "Examples:\n  \
        quarry grammar explain --schema schemas/debian-package.json\n  \
        quarry grammar explain --choice yes --choice no")]
    Explain {
        #[command(flatten)]
        constraint: ConstraintArgs,
    },
    /// Feed TEXT's bytes to the matcher, then print the allowed next token ids as a JSON array,
    /// and any forced bytes. Exit 2 if TEXT already leaves the language.
    #[command(after_help = "Examples:\n  \
        quarry grammar mask --regex '\\{\"n\": [0-9]+\\}' --prefix '{\"n'\n  \
        quarry grammar mask --choice Paris --choice Prague --prefix Pr --json")]
    Mask {
        #[command(flatten)]
        constraint: ConstraintArgs,
        /// Text already generated (fed as bytes, so it may end inside a token or a character).
        #[arg(long, default_value = "", allow_hyphen_values = true)]
        prefix: String,
        /// Print one JSON object (ids, forced bytes, accepting, finished).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
#[group(id = "what", required = true, multiple = false, args = ["regex", "choice", "schema", "grammar", "json_object"])]
pub struct ConstraintArgs {
    /// The output must match this regex in full (regex-automata syntax; it may begin with `-`).
    #[arg(long, allow_hyphen_values = true)]
    regex: Option<String>,
    /// The output must be exactly one of these strings (repeat the flag).
    #[arg(long, allow_hyphen_values = true)]
    choice: Vec<String>,
    /// The output must be canonical JSON that this JSON Schema file accepts.
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// The output must follow this grammar: GBNF (llama.cpp's syntax), or Lark's syntax for a
    /// `.lark` file.
    #[arg(long, value_name = "FILE.gbnf|FILE.lark")]
    grammar: Option<PathBuf>,
    /// The output must be a JSON object, its values nested to any depth.
    #[arg(long)]
    json_object: bool,
    /// With --schema: a JSON Schema document its `$ref`s name (repeat the flag), known by its
    /// file's location and its own `$id`; `"$ref": "common.json#/$defs/id"` in the schema finds
    /// `--schema-resource common.json` in the same folder.
    #[arg(long, value_name = "FILE", requires = "schema")]
    schema_resource: Vec<PathBuf>,
    /// With --schema: a missing additionalProperties means false (OpenAI structured outputs).
    #[arg(long, requires = "schema")]
    strict: bool,
    /// With --schema: refuse keywords quarry does not know (typos such as `propertees`, vendor
    /// keywords such as `x-…`) instead of treating them as annotations, as validators do.
    #[arg(long, requires = "schema")]
    refuse_unknown_keywords: bool,
    /// Unknown keywords are annotations by default now; kept so older command lines still run.
    #[arg(long, hide = true, conflicts_with = "refuse_unknown_keywords")]
    ignore_unknown_keywords: bool,
    /// With --schema: unroll recursive $refs this many levels into a regex (the deepest level is
    /// empty) instead of compiling them as a grammar.
    #[arg(long, value_name = "N", requires = "schema")]
    max_recursion_depth: Option<usize>,
    /// With --schema or --json-object: the layout, compact (`{"a":1,"b":2}`), spaced
    /// (`{"a": 1, "b": 2}`), pretty (up to 8 whitespace bytes around each token) or pretty:N;
    /// by default `generate`'s and the jobs' (the engine's), so the constraint inspected is the
    /// one they decode with.
    #[arg(long, value_name = "LAYOUT", default_value_t = quarry_engine::EngineConfig::default().schema_options.whitespace)]
    whitespace: Whitespace,
    /// Most DFA states the constraint may build (the DFA grows lazily as it is used).
    #[arg(long, default_value_t = Limits::default().max_states)]
    max_states: usize,
    /// Most regex terms (parse nodes and derivatives) the constraint may build.
    #[arg(long, default_value_t = Limits::default().max_terms)]
    max_terms: usize,
    #[command(flatten)]
    model: ModelArg,
}

impl ConstraintArgs {
    fn schema(&self) -> Result<Option<serde_json::Value>> {
        let Some(path) = &self.schema else {
            return Ok(None);
        };
        crate::load_schema(path, &self.schema_resource).map(Some)
    }

    fn constraint(&self) -> Result<Constraint> {
        if let Some(schema) = self.schema()? {
            let options = SchemaOptions {
                strict: self.strict,
                ignore_unknown_keywords: !self.refuse_unknown_keywords,
                max_recursion_depth: self.max_recursion_depth,
                whitespace: self.whitespace,
                ..SchemaOptions::default()
            };
            return Ok(Constraint::JsonSchema { schema, options });
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the grammar {}", path.display()))?;
            return Ok(Constraint::grammar_file(path, text));
        }
        if self.json_object {
            return Ok(Constraint::JsonObject {
                whitespace: self.whitespace,
            });
        }
        Ok(match &self.regex {
            Some(r) => Constraint::Regex(r.clone()),
            None => Constraint::Choice(self.choice.clone()),
        })
    }

    fn limits(&self) -> Limits {
        Limits {
            max_states: self.max_states,
            max_terms: self.max_terms,
            ..Limits::default()
        }
    }
}

/// A model's tokenizer and the grammar vocabulary built from it.
struct Loaded {
    tok: Tokenizer,
    vocab: Arc<Vocabulary>,
}

fn load(args: &ConstraintArgs) -> Result<Loaded> {
    let tok = load_tokenizer(&args.model.model)?;
    let vocab = quarry_engine::grammar_vocabulary(&tok);
    Ok(Loaded { tok, vocab })
}

fn compile(args: &ConstraintArgs, vocab: &Arc<Vocabulary>) -> Result<Arc<Grammar>> {
    let grammar = Grammar::compile(&args.constraint()?, vocab.clone(), args.limits())
        .context("compiling the constraint")?;
    Ok(Arc::new(grammar))
}

/// Runs a `grammar` subcommand; `Ok(false)` means "answered no" (exit 1).
pub fn run(cmd: GrammarCommand) -> Result<bool> {
    match cmd {
        GrammarCommand::Compile { constraint, json } => {
            compile_cmd(&constraint, json).map(|_| true)
        }
        GrammarCommand::Accepts {
            constraint,
            explain,
            chomp,
            canonicalize,
        } => accepts_cmd(&constraint, explain, chomp, canonicalize),
        GrammarCommand::Explain { constraint } => {
            let rules = constraint.constraint()?.rules()?;
            let mut out = std::io::stdout().lock();
            if let [(_, pattern)] = rules.as_slice() {
                writeln!(out, "{pattern}")?;
            } else {
                // A grammar: each rule's regex, where (?P<quarry_rule_k>) refers to rule k.
                for (name, pattern) in &rules {
                    writeln!(out, "{name}: {pattern}")?;
                }
            }
            // The shortest record for the model's vocabulary (docs/budget.md), on stderr so
            // that stdout stays the regex.
            let Loaded { vocab, .. } = load(&constraint)?;
            let grammar = compile(&constraint, &vocab)?;
            match grammar.shortest_record_tokens() {
                Some(tokens) => {
                    let text: Vec<u8> = tokens
                        .iter()
                        .flat_map(|&t| vocab.token_bytes(t).unwrap_or_default().to_vec())
                        .collect();
                    eprintln!(
                        "shortest record: {} tokens with {} (max_tokens below it is refused): {}",
                        tokens.len(),
                        constraint.model.model.display(),
                        String::from_utf8_lossy(&text)
                    );
                }
                None => eprintln!("shortest record: not found (Limits::max_completion_search)"),
            }
            Ok(true)
        }
        GrammarCommand::Mask {
            constraint,
            prefix,
            json,
        } => mask_cmd(&constraint, &prefix, json).map(|_| true),
    }
}

fn ones(mask: &[u32]) -> usize {
    mask.iter().map(|w| w.count_ones() as usize).sum()
}

fn allowed_ids(mask: &[u32]) -> Vec<u32> {
    let mut ids = Vec::with_capacity(ones(mask));
    for (w, &word) in mask.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            ids.push(w as u32 * 32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    ids
}

fn compile_cmd(args: &ConstraintArgs, json: bool) -> Result<()> {
    let Loaded { vocab, .. } = load(args)?;
    let t0 = Instant::now();
    let grammar = compile(args, &vocab)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let matcher = Matcher::new(grammar.clone());
    let t1 = Instant::now();
    let allowed = ones(&matcher.mask());
    let first_mask_s = t1.elapsed().as_secs_f64();
    // Compiling builds no DFA state; build them all for the statistics (and the limit check).
    let t2 = Instant::now();
    // A grammar with recursion has unboundedly many states: report those built so far.
    let states = if grammar.is_context_free() {
        grammar.state_count()
    } else {
        grammar
            .explore()
            .context("building every state of the constraint's automaton")?
    };
    let explore_s = t2.elapsed().as_secs_f64();
    let density = allowed as f64 / vocab.len() as f64;
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "constraint": match args.constraint()? {
                Constraint::Regex(r) => serde_json::json!({ "regex": r }),
                Constraint::Choice(c) => serde_json::json!({ "choice": c }),
                Constraint::JsonSchema { .. } => serde_json::json!({ "schema": args.schema }),
                Constraint::Gbnf(_) | Constraint::Lark(_) => {
                    serde_json::json!({ "grammar": args.grammar })
                }
                Constraint::JsonObject { .. } => serde_json::json!("json_object"),
            },
            "model": args.model.model,
            "vocab_size": vocab.len(),
            "dfa_states": states,
            "dfa_bytes": grammar.dfa_bytes(),
            "context_free": grammar.is_context_free(),
            "regex_terms": grammar.term_count(),
            "compile_us": compile_s * 1e6,
            "explore_us": explore_s * 1e6,
            "first_mask_us": first_mask_s * 1e6,
            "first_mask_allowed": allowed,
            "first_mask_density": density,
            "forced_prefix": String::from_utf8_lossy(matcher.forced_bytes()),
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(
        out,
        "dfa states      {states} ({:.1} KiB transition table, {} regex terms)",
        grammar.dfa_bytes() as f64 / 1024.0,
        grammar.term_count()
    )?;
    writeln!(out, "compile         {:.1} µs", compile_s * 1e6)?;
    if grammar.is_context_free() {
        writeln!(
            out,
            "context-free    states are parser configurations, built as decoding visits them"
        )?;
    } else {
        writeln!(
            out,
            "all states      {:.1} µs (decoding builds only the states it visits)",
            explore_s * 1e6
        )?;
    }
    writeln!(out, "first mask      {:.1} µs", first_mask_s * 1e6)?;
    writeln!(
        out,
        "mask density    {:.4}% ({allowed} of {} tokens allowed at the start)",
        density * 100.0,
        vocab.len()
    )?;
    if !matcher.forced_bytes().is_empty() {
        writeln!(
            out,
            "forced prefix   {}",
            show_bytes(matcher.forced_bytes())
        )?;
    }
    Ok(())
}

fn accepts_cmd(args: &ConstraintArgs, explain: bool, chomp: bool, canonical: bool) -> Result<bool> {
    let mut input = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut input)
        .context("reading stdin")?;
    let mut text = String::from_utf8(input).context("stdin is not UTF-8")?;
    if chomp && text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if canonical {
        let instance: serde_json::Value =
            serde_json::from_str(&text).context("--canonicalize: stdin is not JSON")?;
        let schema = args.schema()?.unwrap_or_default();
        text = canonicalize(&instance, &schema, args.whitespace);
    }
    let Loaded { tok, vocab } = load(args)?;
    let grammar = compile(args, &vocab)?;
    let ids = tok.encode(&text)?;
    let mut m = Matcher::with_capacity(grammar, ids.len() + 1);
    let mut offset = 0usize;
    let refused = |m: &Matcher, i: usize, id: Option<u32>, offset: usize| -> Result<bool> {
        if explain {
            let what = match id {
                Some(id) => format!(
                    "token {i} (id {id}, {}) at byte {offset}",
                    show_bytes(tok.token_bytes(id)?)
                ),
                None => format!("end of sequence after {i} tokens ({offset} bytes)"),
            };
            let allowed = ones(&m.mask());
            let mut hint = String::new();
            if id.is_none() && !m.forced_bytes().is_empty() {
                hint = format!(
                    "; the text must go on with {}",
                    show_bytes(m.forced_bytes())
                );
            }
            if text.ends_with('\n') {
                hint.push_str("; the input ends with a newline: use printf, or --chomp");
            }
            eprintln!("refused: {what}; {allowed} tokens were allowed there{hint}");
        }
        Ok(false)
    };
    for (i, &id) in ids.iter().enumerate() {
        let word = m.mask()[id as usize / 32];
        if word & (1 << (id % 32)) == 0 {
            return refused(&m, i, Some(id), offset);
        }
        m.accept_token(id)
            .map_err(|e: Rejection| anyhow::anyhow!("mask and matcher disagree: {e}"))?;
        offset += tok.token_bytes(id)?.len();
    }
    let eos_ok = vocab
        .eos()
        .iter()
        .any(|&e| m.mask()[e as usize / 32] & (1 << (e % 32)) != 0);
    if !eos_ok {
        return refused(&m, ids.len(), None, offset);
    }
    if explain {
        eprintln!(
            "accepted: {} tokens, {} bytes, end of sequence allowed",
            ids.len(),
            offset
        );
    }
    Ok(true)
}

fn mask_cmd(args: &ConstraintArgs, prefix: &str, json: bool) -> Result<()> {
    let Loaded { vocab, .. } = load(args)?;
    let grammar = compile(args, &vocab)?;
    let mut m = Matcher::new(grammar);
    if let Err(e) = m.accept_bytes(prefix.as_bytes()) {
        let at = match e {
            Rejection::Bytes { offset } => offset,
            _ => 0,
        };
        anyhow::bail!(
            "the prefix leaves the language at byte {at} ({} of {:?})",
            show_bytes(&prefix.as_bytes()[at..at + 1]),
            prefix
        );
    }
    let ids = allowed_ids(&m.mask());
    let forced = m.forced_bytes();
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "prefix": prefix,
            "vocab_size": vocab.len(),
            "allowed": ids,
            "count": ids.len(),
            "accepting": m.is_accepting(),
            "finished": m.is_finished(),
            "forced": String::from_utf8_lossy(forced),
            "forced_bytes": forced,
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    writeln!(out, "allowed {} of {} tokens", ids.len(), vocab.len())?;
    if !forced.is_empty() {
        writeln!(out, "forced  {}", show_bytes(forced))?;
    }
    if m.is_accepting() {
        writeln!(
            out,
            "the prefix is already a complete match (end of sequence allowed)"
        )?;
    }
    Ok(())
}
