//! The scheduler on a fake model behind the engine's [`Model`] seam: admission, planning within
//! the token budget, retraction when the pool runs out, the prefix cache and its eviction, and
//! jump-forward, each checked against the same requests run one at a time, in milliseconds.
//!
//! The fake reads its context the way a transformer does, through the pool: every forward writes
//! each new token into the page its block table names for that position, and the logits of a
//! position are a hash of the tokens read back through the table for every position up to it. A
//! wrong block table, a page freed while still used or a cached prefix that is not what it claims
//! changes the output, so "equal to the one-at-a-time run" checks the KV bookkeeping too.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use quarry_engine::{
    Completion, ConstraintSpec, Engine, EngineConfig, FinishReason, Model, Prompt, Request,
};
use quarry_model::{parse_device, KvPool, LlamaConfig, Logits, SeqInput};
use quarry_tokenizer::Tokenizer;
use serde_json::json;

fn tokenizer() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(p.exists(), "{} is missing: run `make setup`", p.display());
        Arc::new(Tokenizer::from_gguf(p).unwrap())
    })
    .clone()
}

/// What the fake saw: the largest batch and the most tokens of one forward pass.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    passes: usize,
    max_seqs: usize,
    max_tokens: usize,
}

struct Fake {
    vocab: usize,
    /// The token each page (one position each) holds.
    pages: Mutex<Vec<Option<u32>>>,
    seen: Mutex<Seen>,
    /// Tokens the fake never prefers (end of generation), so free text runs to `max_tokens`.
    never: Vec<u32>,
}

impl Fake {
    fn new(tok: &Tokenizer) -> Arc<Fake> {
        Arc::new(Fake {
            vocab: tok.vocab_size(),
            pages: Mutex::new(Vec::new()),
            seen: Mutex::new(Seen::default()),
            never: tok.special_tokens().end_of_generation.clone(),
        })
    }

    fn seen(&self) -> Seen {
        *self.seen.lock().unwrap()
    }
}

fn mix(mut h: u64, x: u64) -> u64 {
    h ^= x
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(h << 6)
        .wrapping_add(h >> 2);
    h.wrapping_mul(0xFF51_AFD7_ED55_8CCD)
}

impl Model for Fake {
    fn forward(
        &self,
        batch: &[SeqInput],
        _pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()> {
        {
            let mut s = self.seen.lock().unwrap();
            s.passes += 1;
            s.max_seqs = s.max_seqs.max(batch.len());
            s.max_tokens = s.max_tokens.max(batch.iter().map(|b| b.tokens.len()).sum());
        }
        let mut pages = self.pages.lock().unwrap();
        // Write every new token's "KV" first, as the real forward does.
        for seq in batch {
            for (i, &t) in seq.tokens.iter().enumerate() {
                let page = seq.pages[seq.start + i] as usize;
                if pages.len() <= page {
                    pages.resize(page + 1, None);
                }
                pages[page] = Some(t);
            }
        }
        let rows = out.layout(self.vocab, batch);
        let mut row = 0;
        for seq in batch {
            let n = seq.logits.clamp(1, seq.tokens.len().max(1));
            let end = seq.start + seq.tokens.len();
            for pos in end - n..end {
                // The context through the block table, as attention reads it.
                let mut h = 0u64;
                for p in 0..=pos {
                    let t = pages[seq.pages[p] as usize].expect("a position read before written");
                    h = mix(h, t as u64);
                }
                let logits = &mut rows[row * self.vocab..(row + 1) * self.vocab];
                for (t, l) in logits.iter_mut().enumerate() {
                    *l = (mix(h, t as u64) >> 40) as f32 / (1u64 << 24) as f32;
                }
                for &t in &self.never {
                    logits[t as usize] = -1e9;
                }
                row += 1;
            }
        }
        Ok(())
    }

    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool> {
        // The smallest pool the runtime makes; the fake keeps its "KV" itself.
        let cfg = LlamaConfig::minimal("fake", self.vocab, self.context_length());
        KvPool::new(&cfg, page_size, num_pages, &parse_device("cpu")?, None)
    }

    fn context_length(&self) -> usize {
        4096
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}

const INSTRUCTION: &str = "Answer in one short line, with the facts you are sure of and nothing \
else. The record follows. ";

/// Six prompts that share an instruction (what the radix cache shares).
fn prompts() -> Vec<Prompt> {
    [
        "apples", "a river", "the moon", "bees", "granite", "a violin",
    ]
    .iter()
    .map(|w| Prompt::Text(format!("{INSTRUCTION}Tell me about {w}.")))
    .collect()
}

fn free(n: usize) -> Vec<Request> {
    prompts()
        .into_iter()
        .map(|p| Request::new(p).with_max_tokens(n))
        .collect()
}

fn base() -> EngineConfig {
    EngineConfig {
        kv_tokens: 4096,
        max_running: 6,
        step_tokens: 512,
        ..EngineConfig::default()
    }
}

/// Runs `reqs` on a fresh engine over a fresh fake; the outputs in request order, the engine's
/// pages checked consistent, and what the fake saw.
fn run(
    cfg: EngineConfig,
    reqs: Vec<Request>,
) -> (Vec<Completion>, quarry_engine::EngineStats, Seen) {
    let tok = tokenizer();
    let fake = Fake::new(&tok);
    let mut e = Engine::new(fake.clone(), tok, cfg).unwrap();
    let out = e.run_batch(reqs).unwrap();
    e.check_pages().unwrap();
    (out, e.stats(), fake.seen())
}

/// The reference: each request alone on an engine of its own, no cache.
fn alone(reqs: &[Request]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| {
            let cfg = EngineConfig {
                max_running: 1,
                radix_cache: false,
                ..base()
            };
            run(cfg, vec![r.clone()]).0.remove(0).tokens
        })
        .collect()
}

fn tokens(out: &[Completion]) -> Vec<Vec<u32>> {
    out.iter().map(|c| c.tokens.clone()).collect()
}

/// Runs `reqs` under `cfg` and checks that every output is the one the request gets alone.
fn run_as_alone(
    cfg: EngineConfig,
    reqs: &[Request],
) -> (Vec<Completion>, quarry_engine::EngineStats, Seen) {
    let want = alone(reqs);
    let (out, stats, seen) = run(cfg, reqs.to_vec());
    assert_eq!(tokens(&out), want);
    (out, stats, seen)
}

#[test]
fn admission_never_runs_more_than_max_running_and_batching_changes_no_output() {
    let reqs = free(12);
    let want = alone(&reqs);
    assert!(want.iter().all(|t| t.len() == 12));
    assert!(
        want.windows(2).any(|w| w[0] != w[1]),
        "the fake's outputs depend on the prompt"
    );
    for max_running in [1, 2, 4, 6] {
        for radix_cache in [false, true] {
            let cfg = EngineConfig {
                max_running,
                radix_cache,
                ..base()
            };
            let (out, stats, seen) = run(cfg, reqs.clone());
            assert_eq!(
                tokens(&out),
                want,
                "max_running {max_running}, cache {radix_cache}"
            );
            assert!(seen.max_seqs <= max_running, "{seen:?}");
            assert_eq!(stats.completed, 6);
            assert!(out.iter().all(|c| c.finish == FinishReason::Length));
        }
    }
}

#[test]
fn a_step_stays_within_its_token_budget_and_long_prompts_prefill_in_chunks() {
    let reqs = free(4);
    let cfg = EngineConfig {
        step_tokens: 16,
        max_running: 4,
        ..base()
    };
    let (_, _, seen) = run_as_alone(cfg, &reqs);
    assert!(seen.max_tokens <= 16, "{seen:?}");
    let prompt_tokens: usize = reqs
        .iter()
        .map(|r| match &r.prompt {
            Prompt::Text(t) => tokenizer().encode(t).unwrap().len(),
            _ => unreachable!(),
        })
        .sum();
    assert!(
        seen.passes * 16 >= prompt_tokens,
        "every prompt token was computed in 16-token passes: {seen:?}, {prompt_tokens} prompt tokens"
    );
}

#[test]
fn a_pool_too_small_for_everyone_retracts_and_every_output_is_unchanged() {
    // About two sequences' worth of pages for six: the newest go back to the queue and redo.
    let cfg = EngineConfig {
        kv_tokens: 80,
        radix_cache: false,
        ..base()
    };
    let (_, stats, _) = run_as_alone(cfg, &free(24));
    assert!(stats.retracted > 0, "{stats:?}");
}

#[test]
fn the_prefix_cache_shares_the_instruction_and_evicts_when_the_pool_is_full() {
    let reqs = free(8);
    // Two at a time: a finished sequence's path is in the cache when the next one is admitted.
    let two = EngineConfig {
        max_running: 2,
        ..base()
    };
    let (_, stats, _) = run_as_alone(two, &reqs);
    assert!(
        stats.cache.hit_tokens > 0,
        "later prompts reuse the shared instruction: {:?}",
        stats.cache
    );
    // A pool that holds the instruction and about two answers: finished paths must be evicted
    // for new ones.
    let cfg = EngineConfig {
        kv_tokens: 48,
        max_running: 1,
        ..base()
    };
    let (_, stats, _) = run_as_alone(cfg, &reqs);
    assert!(stats.cache.evictions > 0, "{:?}", stats.cache);
}

#[test]
fn jump_forward_appends_what_the_schema_forces_and_every_record_is_valid() {
    let schema = json!({
        "type": "object",
        "properties": {
            "fruit": {"type": "string", "enum": ["apple", "pear", "quince"]},
            "ripe": {"type": "boolean"},
            "count": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["fruit", "ripe", "count"],
        "additionalProperties": false
    });
    let reqs: Vec<Request> = prompts()
        .into_iter()
        .map(|p| {
            Request::new(p)
                .with_constraint(ConstraintSpec::JsonSchema(schema.clone()))
                .with_max_tokens(64)
        })
        .collect();
    let without = EngineConfig {
        jump_forward: false,
        ..base()
    };
    let (plain, plain_stats, _) = run(without, reqs.clone());
    let (jumped, stats, _) = run(base(), reqs);
    // Every record is complete and valid either way. (They need not be equal: the fake, like a
    // real model, sees token ids, and jump-forward writes the forced bytes in canonical tokens.)
    let validator = jsonschema::validator_for(&schema).unwrap();
    for c in plain.iter().chain(&jumped) {
        assert_eq!(c.finish, FinishReason::ConstraintComplete, "{}", c.text);
        let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
        assert!(validator.is_valid(&v), "{}", c.text);
    }
    assert_eq!(plain_stats.forced_tokens, 0);
    assert!(stats.forced_tokens > 0, "{stats:?}");
    assert!(
        stats.sampled_tokens < plain_stats.sampled_tokens,
        "forced bytes are not sampled: {} vs {}",
        stats.sampled_tokens,
        plain_stats.sampled_tokens
    );
}

/// Forty constrained requests with jump-forward in one batch take their drawn tokens in parallel
/// over sequences (32 draws a step or more), four at a time one after another: every output is
/// the one the request gets alone, and the engine's counters add up to the same either way.
#[test]
fn a_large_batch_takes_its_tokens_in_parallel_and_changes_no_output() {
    let schema = json!({
        "type": "object",
        "properties": {
            "fruit": {"type": "string", "enum": ["apple", "pear", "quince"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 999}
        },
        "required": ["fruit", "count"]
    });
    let reqs: Vec<Request> = (0..40)
        .map(|i| {
            let p = match &prompts()[i % 6] {
                Prompt::Text(t) => Prompt::Text(format!("{t} ({i})")),
                other => other.clone(),
            };
            Request::new(p)
                .with_constraint(ConstraintSpec::JsonSchema(schema.clone()))
                .with_max_tokens(48)
        })
        .collect();
    let wide = EngineConfig {
        max_running: 40,
        kv_tokens: 16_384,
        ..base()
    };
    let (out, stats, seen) = run_as_alone(wide, &reqs);
    assert!(seen.max_seqs >= 32, "{seen:?}");
    assert!(stats.forced_tokens > 0, "{stats:?}");
    let narrow = EngineConfig {
        max_running: 4,
        ..base()
    };
    let (few, few_stats, _) = run(narrow, reqs);
    assert_eq!(tokens(&few), tokens(&out));
    assert_eq!(
        (
            stats.sampled_tokens,
            stats.forced_tokens,
            stats.retokenized_tokens
        ),
        (
            few_stats.sampled_tokens,
            few_stats.forced_tokens,
            few_stats.retokenized_tokens
        )
    );
}

#[test]
fn a_constraint_with_no_text_at_all_fails_its_request_alone() {
    let empty = Request::new(prompts().remove(0))
        .with_constraint(ConstraintSpec::Regex("[a&&b]x".into()))
        .with_max_tokens(8);
    let fine = Request::new(prompts().remove(1))
        .with_constraint(ConstraintSpec::Regex("[a-z]{3}".into()))
        .with_max_tokens(8);
    let (out, _, _) = run(base(), vec![empty, fine]);
    match &out[0].finish {
        FinishReason::Error(why) => assert!(why.contains("matches no text at all"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(out[1].finish, FinishReason::ConstraintComplete);
    assert_eq!(out[1].text.len(), 3);
}

/// A chat prompt is rendered for the reply its request asks for: a hybrid-reasoning template's
/// `enable_thinking` is false for a plain request (the record starts at once) and true in a
/// reasoning mode, unless the engine's `chat_vars` set it; other variables reach the template.
#[test]
fn chat_prompts_tell_the_template_whether_the_reply_thinks() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut vocab =
        quarry_tokenizer::GgufVocab::from_content(&quarry_tokenizer::read_content(&path).unwrap())
            .unwrap();
    vocab.chat_template = Some(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
         {% endfor %}<|im_start|>assistant\n{{ greeting | default('') }}\
         {% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
            .into(),
    );
    let tok = Arc::new(Tokenizer::from_gguf_vocab(vocab).unwrap());
    let chat = || {
        Request::new(Prompt::Chat(vec![quarry_tokenizer::ChatMessage::new(
            "user", "Total?",
        )]))
        .with_max_tokens(2)
    };
    let mut thinking = chat();
    thinking.reasoning = Some(quarry_engine::Reasoning::default());
    let prompt_tokens = |cfg: EngineConfig, reqs: Vec<Request>| -> Vec<usize> {
        let fake = Fake::new(&tok);
        let mut e = Engine::new(fake, tok.clone(), cfg).unwrap();
        e.run_batch(reqs)
            .unwrap()
            .iter()
            .map(|c| c.stats.prompt_tokens)
            .collect()
    };
    let think_block = tok.encode("<think>\n\n</think>\n\n").unwrap().len();
    let n = prompt_tokens(base(), vec![chat(), thinking.clone()]);
    assert_eq!(n[0], n[1] + think_block, "{n:?}");
    // The engine's variables win over the request's mode, and reach the template.
    let mut vars = quarry_tokenizer::ChatVars::default();
    vars.0.insert("enable_thinking".into(), json!(true));
    vars.0.insert("greeting".into(), json!("Hello"));
    let cfg = EngineConfig {
        chat_vars: vars,
        ..base()
    };
    let m = prompt_tokens(cfg, vec![chat(), thinking]);
    let greeting = tok.encode("Hello").unwrap().len();
    assert_eq!(m, [n[1] + greeting, n[1] + greeting], "{m:?}");
}

/// A job feeds the engine as documents finish (the pipeline keeps twice the batch in flight):
/// each new prompt is tokenized beside the next forward pass instead of before it, and the outputs
/// are the ones every request gets alone. A request that cannot run still comes back from the
/// step after its submit.
#[test]
fn requests_fed_as_others_finish_are_tokenized_beside_the_pass() {
    // Twelve requests that finish at different steps.
    let reqs: Vec<Request> = prompts()
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
        .map(|(i, p)| Request::new(p).with_max_tokens(3 + i))
        .collect();
    let want = alone(&reqs);
    let tok = tokenizer();
    let cfg = EngineConfig {
        max_running: 2,
        ..base()
    };
    let mut e = Engine::new(Fake::new(&tok), tok, cfg).unwrap();
    let mut out: Vec<Option<Completion>> = vec![None; reqs.len()];
    let mut ids = std::collections::HashMap::new();
    let mut next = reqs.iter().enumerate();
    let mut steps = 0;
    loop {
        while e.in_flight() < 4 {
            let Some((i, r)) = next.next() else { break };
            ids.insert(e.submit(r.clone()).unwrap(), i);
        }
        if e.is_idle() {
            break;
        }
        for c in e.step().unwrap() {
            let i = ids.remove(&c.id).unwrap();
            out[i] = Some(c);
        }
        steps += 1;
        assert!(steps < 1000, "the fed run does not end");
    }
    let out: Vec<Completion> = out.into_iter().map(Option::unwrap).collect();
    assert_eq!(tokens(&out), want);
    e.check_pages().unwrap();
    // The first four were tokenized before the first pass (nothing ran to hide them behind);
    // each later one beside a pass, since the queue always held enough for the free slots.
    let s = e.stats();
    assert_eq!(s.prompts_beside, 8, "{s:?}");
    assert!(s.prompt_s > 0.0 && s.prompt_beside_s > 0.0, "{s:?}");

    // While others run, a request that cannot run is refused by the next step.
    for r in &reqs[..2] {
        e.submit(r.clone()).unwrap();
    }
    assert!(e.step().unwrap().is_empty());
    let bad = e.submit(Request::text("")).unwrap();
    assert_eq!(
        e.partial_output(bad),
        Some(&[][..]),
        "queued, nothing written"
    );
    let done = e.step().unwrap();
    let refused = done.iter().find(|c| c.id == bad).expect("refused at once");
    match &refused.finish {
        FinishReason::Error(why) => assert!(why.contains("empty"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.stats().prompts_beside, 9);
}
