//! Records that always close (`docs/budget.md`), through the whole engine: batching, the radix
//! cache, jump-forward and drafts, the draws again.
//!
//! First against an adversary: a fake model (behind the engine's `Model` seam) whose logits
//! always prefer, of the tokens the constraint allows, the one after which the record needs the
//! most tokens to close. Left alone it keeps every record open past any budget; under the budget
//! every output closes complete and valid for every `max_tokens` at or above the shortest record,
//! and every request below it is refused up front. Then the real SmolLM2 and Qwen2.5 on schemas
//! that run long (an open object, long strings, a growing array).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use quarry_engine::{
    grammar_vocabulary, Completion, ConstraintSpec, Engine, EngineConfig, FinishReason, Model,
    Prompt, Request,
};
use quarry_grammar::{Constraint, Grammar, Limits, Matcher, SchemaOptions};
use quarry_model::{parse_device, KvPool, Llama, LlamaConfig, Logits, SeqInput};
use quarry_tokenizer::{EncodeOptions, Tokenizer};
use serde_json::{json, Value};

fn model_path(file: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    assert!(p.exists(), "{} is missing: run `make setup`", p.display());
    p
}

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn tokenizer() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| Arc::new(Tokenizer::from_gguf(model_path(SMOLLM2)).unwrap()))
        .clone()
}

/// Schemas with the shapes that run long, and one of every other constraint kind.
fn constraints() -> Vec<(&'static str, ConstraintSpec)> {
    let package: Value = serde_json::from_slice(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas/debian-package.json"),
        )
        .unwrap(),
    )
    .unwrap();
    vec![
        ("package", ConstraintSpec::JsonSchema(package)),
        (
            "open object",
            ConstraintSpec::JsonSchema(json!({"type": "object",
                "properties": {"name": {"type": "string"}}, "required": ["name"],
                "additionalProperties": {"type": "string"}})),
        ),
        (
            "long strings and a growing array",
            ConstraintSpec::JsonSchema(json!({"type": "object", "properties": {
                "summary": {"type": "string", "minLength": 8},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
              "required": ["summary", "tags"]})),
        ),
        (
            "regex",
            ConstraintSpec::Regex("[a-z]{2,6}(-[a-z]{2,6})*@[a-z]+\\.(com|org)".into()),
        ),
        ("json_object", ConstraintSpec::JsonObject),
        (
            "gbnf",
            ConstraintSpec::Grammar(
                "root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\"".into(),
            ),
        ),
    ]
}

/// The adversary. Every request has the same prompt (`PROMPT`), so the output is what follows
/// it in the context, read back through the block table as the real model reads its KV.
struct Adversary {
    tok: Arc<Tokenizer>,
    grammar: Arc<Grammar>,
    prompt_len: usize,
    pages: Mutex<Vec<Option<u32>>>,
}

const PROMPT: &str = "Write the record.";

impl Adversary {
    fn new(tok: Arc<Tokenizer>, c: &ConstraintSpec, options: SchemaOptions) -> Arc<Self> {
        let vocab = grammar_vocabulary(&tok);
        let constraint: Constraint = c.to_constraint(options).unwrap();
        let grammar = Arc::new(Grammar::compile(&constraint, vocab, Limits::default()).unwrap());
        let opts = EncodeOptions {
            add_bos: tok.add_bos_by_default(),
            parse_special: false,
        };
        let prompt_len = tok.encode_with(PROMPT, opts).unwrap().len();
        Arc::new(Self {
            tok,
            grammar,
            prompt_len,
            pages: Mutex::new(Vec::new()),
        })
    }

    /// Logits after `output`: of the allowed tokens (a spread of at most 256 of them, the
    /// completion's first token among them), the higher the more tokens the record needs after
    /// it, then the longer; other allowed tokens below those, end of generation last.
    fn logits(&self, output: &[u32], row: &mut [f32]) {
        row.fill(-1e9);
        let mut m = Matcher::new(self.grammar.clone());
        for &t in output {
            if m.accept_token(t).is_err() {
                // Past the constraint (a forced marker, say): any token.
                row.fill(0.0);
                return;
            }
        }
        let vocab = self.grammar.vocabulary();
        let mut mask = vec![0u32; vocab.mask_words()];
        m.fill_mask(&mut mask);
        let allowed: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
            .collect();
        for &t in &allowed {
            row[t as usize] = -1e6;
        }
        let stride = allowed.len().div_ceil(256).max(1);
        let spread = allowed.iter().copied().step_by(stride);
        for t in spread.chain(m.completion_first()) {
            if vocab.is_eos(t) {
                continue;
            }
            let need = m.completion_after(t).unwrap_or(0) as f32;
            let len = vocab.token_bytes(t).map_or(0, |b| b.len()) as f32;
            row[t as usize] = need * 100.0 + len;
        }
        for &e in vocab.eos() {
            if allowed.contains(&e) {
                row[e as usize] = -1e7;
            }
        }
    }
}

impl Model for Adversary {
    fn forward(
        &self,
        batch: &[SeqInput],
        _pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()> {
        let vocab = self.tok.vocab_size();
        let mut pages = self.pages.lock().unwrap();
        for seq in batch {
            for (i, &t) in seq.tokens.iter().enumerate() {
                let page = seq.pages[seq.start + i] as usize;
                if pages.len() <= page {
                    pages.resize(page + 1, None);
                }
                pages[page] = Some(t);
            }
        }
        let rows = out.layout(vocab, batch);
        let mut row = 0;
        for seq in batch {
            let n = seq.logits.clamp(1, seq.tokens.len().max(1));
            let end = seq.start + seq.tokens.len();
            for pos in end - n..end {
                let context: Vec<u32> = (0..=pos)
                    .map(|p| pages[seq.pages[p] as usize].expect("written"))
                    .collect();
                let output = &context[self.prompt_len.min(context.len())..];
                self.logits(output, &mut rows[row * vocab..(row + 1) * vocab]);
                row += 1;
            }
        }
        Ok(())
    }

    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool> {
        let cfg = LlamaConfig::minimal("adversary", self.tok.vocab_size(), 4096);
        KvPool::new(&cfg, page_size, num_pages, &parse_device("cpu")?, None)
    }

    fn context_length(&self) -> usize {
        4096
    }

    fn vocab_size(&self) -> usize {
        self.tok.vocab_size()
    }
}

fn config(close_within_budget: bool) -> EngineConfig {
    EngineConfig {
        kv_tokens: 8192,
        max_running: 8,
        step_tokens: 512,
        close_within_budget,
        ..EngineConfig::default()
    }
}

/// Checks that `c` is a complete output of `spec`: its constraint accepts it, and a schema's
/// validates with the `jsonschema` crate.
fn assert_complete(name: &str, spec: &ConstraintSpec, c: &Completion) {
    assert!(
        matches!(
            c.finish,
            FinishReason::ConstraintComplete | FinishReason::BudgetClosed
        ),
        "{name}: {:?} after {} tokens: {}",
        c.finish,
        c.tokens.len(),
        c.text
    );
    let grammar = Grammar::compile(
        &spec.to_constraint(config(true).schema_options).unwrap(),
        grammar_vocabulary(&tokenizer()),
        Limits::default(),
    )
    .unwrap();
    let mut m = Matcher::new(Arc::new(grammar));
    m.accept_bytes(c.text.as_bytes()).unwrap();
    assert!(m.is_accepting(), "{name}: {}", c.text);
    if let ConstraintSpec::JsonSchema(schema) = spec {
        let v: Value = serde_json::from_str(&c.text).unwrap();
        assert!(jsonschema::is_valid(schema, &v), "{name}: {}", c.text);
    }
}

#[test]
fn the_adversary_closes_every_record_under_the_budget_and_none_without() {
    let tok = tokenizer();
    for (name, spec) in constraints() {
        let adversary = Adversary::new(tok.clone(), &spec, config(true).schema_options);
        let shortest = adversary.grammar.shortest_record().unwrap();
        let budgets: Vec<usize> = [0, 1, 2, 4, 9, 25].iter().map(|x| shortest + x).collect();
        let requests = |budgets: &[usize]| -> Vec<Request> {
            budgets
                .iter()
                .map(|&n| {
                    Request::new(Prompt::Text(PROMPT.into()))
                        .with_constraint(spec.clone())
                        .with_max_tokens(n)
                })
                .collect()
        };
        // All in one batch: the radix cache shares the prompt, sequences finish apart.
        let mut e = Engine::new(adversary.clone(), tok.clone(), config(true)).unwrap();
        let out = e.run_batch(requests(&budgets)).unwrap();
        e.check_pages().unwrap();
        for (c, n) in out.iter().zip(&budgets) {
            assert_complete(name, &spec, c);
            assert!(c.tokens.len() <= *n, "{name}: {} > {n}", c.tokens.len());
        }
        assert!(
            out.iter().any(|c| c.finish == FinishReason::BudgetClosed),
            "{name}: the adversary was never stopped"
        );
        assert!(e.stats().budget_redraws > 0, "{name}");
        // Where the tokens left were the state's shortest completion, the tokens that fit were
        // kept beside the pass, and the draws again took them.
        assert!(e.stats().budget_redraws_beside > 0, "{name}");
        // And every draw again drew a token that fits: none had to be replaced.
        assert_eq!(e.stats().budget_replaced, 0, "{name}");
        // Below the shortest record: refused before decoding, naming both numbers.
        let below: Vec<usize> = (1..shortest).rev().take(3).collect();
        for (c, &n) in e.run_batch(requests(&below)).unwrap().iter().zip(&below) {
            assert_eq!(
                c.finish,
                FinishReason::BudgetTooSmall {
                    shortest,
                    max_tokens: n
                },
                "{name}"
            );
            assert!(c.tokens.is_empty());
        }
        // The same adversary without the budget: cut at max_tokens (this test can fail).
        let mut off = Engine::new(adversary.clone(), tok.clone(), config(false)).unwrap();
        let cut = off
            .run_batch(requests(&budgets))
            .unwrap()
            .iter()
            .filter(|c| c.finish == FinishReason::Length)
            .count();
        assert!(cut > 0, "{name}: the adversary closed records by itself");
    }
}

/// The real models on the schemas that run long, with budgets a little above their shortest
/// records: every output closes complete and valid, and the budget closed some of them (the
/// models, left alone, run past these budgets).
fn real_model_closes_records(file: &str) {
    let dev = parse_device("cpu").unwrap();
    let model = Arc::new(Llama::load(model_path(file), &dev).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(model_path(file)).unwrap());
    let document = "Package: dpkg\nVersion: 1.22.6\nArchitecture: amd64\nMaintainer: Dpkg \
        Developers <debian-dpkg@lists.debian.org>\nInstalled-Size: 6512\nSection: admin\n\
        Priority: required\nDescription: Debian package management system\n This package \
        provides the low-level infrastructure for handling the installation and removal of \
        Debian software packages.";
    let prompt = |what: &str| {
        Prompt::Chat(vec![quarry_tokenizer::ChatMessage::new(
            "user",
            format!("{what}\n\n{document}"),
        )])
    };
    let mut e = Engine::new(model, tok.clone(), config(true)).unwrap();
    let vocab = grammar_vocabulary(&tok);
    let mut requests = Vec::new();
    let mut specs = Vec::new();
    for (name, spec) in constraints()
        .into_iter()
        .filter(|(n, _)| ["package", "open object", "long strings and a growing array"].contains(n))
    {
        let g = Grammar::compile(
            &spec.to_constraint(config(true).schema_options).unwrap(),
            vocab.clone(),
            Limits::default(),
        )
        .unwrap();
        let shortest = g.shortest_record().unwrap();
        for extra in [3, 12] {
            requests.push(
                Request::new(prompt(
                    "Describe this package in as much detail as you can, as JSON.",
                ))
                .with_constraint(spec.clone())
                .with_max_tokens(shortest + extra),
            );
            specs.push((name, spec.clone()));
        }
    }
    let out = e.run_batch(requests).unwrap();
    e.check_pages().unwrap();
    for (c, (name, spec)) in out.iter().zip(&specs) {
        let grammar = Grammar::compile(
            &spec.to_constraint(config(true).schema_options).unwrap(),
            vocab.clone(),
            Limits::default(),
        )
        .unwrap();
        let mut matcher = Matcher::new(Arc::new(grammar));
        matcher.accept_bytes(c.text.as_bytes()).unwrap();
        assert!(matcher.is_accepting(), "{file} {name}: {}", c.text);
        assert!(c.is_complete(), "{file} {name}: {:?} {}", c.finish, c.text);
        if let ConstraintSpec::JsonSchema(schema) = spec {
            let v: Value = serde_json::from_str(&c.text).unwrap();
            assert!(
                jsonschema::is_valid(schema, &v),
                "{file} {name}: {}",
                c.text
            );
        }
    }
    assert!(
        out.iter().any(|c| c.finish == FinishReason::BudgetClosed),
        "{file}: no record needed the budget: {:?}",
        out.iter().map(|c| &c.finish).collect::<Vec<_>>()
    );
}

#[test]
fn smollm2_closes_long_records_within_the_budget() {
    real_model_closes_records(SMOLLM2);
}

#[test]
fn qwen25_closes_long_records_within_the_budget() {
    real_model_closes_records(QWEN25);
}
