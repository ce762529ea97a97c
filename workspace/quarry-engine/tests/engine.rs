//! The engine on the real SmolLM2 model and tokenizer: determinism, batching, constraints,
//! jump-forward, the prefix cache, logit processors and per-request errors.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use quarry_engine::{
    Completion, ConstraintSpec, Engine, EngineConfig, EngineError, FinishReason, KeepBack,
    Processor, Prompt, Reasoning, Request,
};
use quarry_model::{parse_device, Llama, SamplingParams};
use quarry_tokenizer::{ChatMessage, Tokenizer};
use serde_json::json;

fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run `make setup`", p.display());
    p
}

fn model() -> (Arc<Llama>, Arc<Tokenizer>) {
    static M: OnceLock<(Arc<Llama>, Arc<Tokenizer>)> = OnceLock::new();
    M.get_or_init(|| {
        let dev = parse_device("cpu").unwrap();
        (
            Arc::new(Llama::load(model_path(), &dev).unwrap()),
            Arc::new(Tokenizer::from_gguf(model_path()).unwrap()),
        )
    })
    .clone()
}

fn engine(cfg: EngineConfig) -> Engine {
    let (m, t) = model();
    Engine::new(m, t, cfg).unwrap()
}

fn small() -> EngineConfig {
    EngineConfig {
        kv_tokens: 8192,
        max_running: 8,
        step_tokens: 256,
        ..EngineConfig::default()
    }
}

/// [`small`] with compact JSON (the grammar library's layout; the engine's default is
/// `pretty:1`): the jump-forward tests' layout, where every separator is forced, so forced runs
/// are long and a draft differs from what the model writes only where a tokenization does.
/// Under `pretty:1` the model refuses most drafts at a separator (it may write a space there),
/// which the outputs tolerate (they are the same) but the counts these tests check do not
/// describe.
fn small_compact() -> EngineConfig {
    EngineConfig {
        schema_options: quarry_grammar::SchemaOptions::default(),
        ..small()
    }
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

const QUESTIONS: [&str; 6] = [
    "What is the capital of France?",
    "Name a colour of the sky.",
    "Write one word about cats.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Describe the sea in five words.",
];

fn run(e: &mut Engine, reqs: Vec<Request>) -> Vec<Completion> {
    let out = e.run_batch(reqs).unwrap();
    e.check_pages().unwrap();
    out
}

#[test]
fn greedy_is_deterministic_and_batched_equals_sequential() {
    let reqs: Vec<Request> = QUESTIONS
        .iter()
        .map(|q| Request::new(chat(q)).with_max_tokens(20))
        .collect();
    let mut batched = engine(small());
    let a = run(&mut batched, reqs.clone());
    let b = run(&mut batched, reqs.clone());
    let mut one = engine(EngineConfig {
        max_running: 1,
        radix_cache: false,
        ..small()
    });
    for (i, r) in reqs.into_iter().enumerate() {
        let s = run(&mut one, vec![r]).remove(0);
        assert_eq!(
            s.tokens, a[i].tokens,
            "request {i}: batched differs from sequential"
        );
        assert_eq!(s.text, a[i].text);
    }
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.tokens, y.tokens, "a second run differs");
        assert!(!x.tokens.is_empty());
        assert!(matches!(
            x.finish,
            FinishReason::Stop | FinishReason::Length
        ));
    }
    // The second run found every prompt in the cache (all but its last token).
    let s = batched.stats();
    assert!(s.cache.hit_tokens > 0, "{s:?}");
}

/// An engine gives its KV pool back to the model when it drops, and the next engine of the same
/// pool size runs on that pool (`Llama::kv_pool`: on a GPU its CUDA graphs replay there): with
/// the requests in the other order, so that each takes pages another wrote, every request gets
/// the tokens it got on the new pool. An engine of another pool size gets a new pool.
#[test]
fn engines_one_after_another_share_one_pool() {
    // A model of its own: the other tests' engines would take its spare pool meanwhile.
    let llama = Arc::new(Llama::load(model_path(), &parse_device("cpu").unwrap()).unwrap());
    let tok = model().1;
    let reqs: Vec<Request> = QUESTIONS
        .iter()
        .map(|q| Request::new(chat(q)).with_max_tokens(12))
        .collect();
    let outputs = |reqs: Vec<Request>| {
        let mut e = Engine::new(llama.clone(), tok.clone(), small()).unwrap();
        run(&mut e, reqs)
    };
    let first = outputs(reqs.clone());
    assert_eq!((llama.kv_pools().made, llama.kv_pools().lent_again), (1, 0));
    let mut second = outputs(reqs.into_iter().rev().collect());
    second.reverse();
    assert_eq!((llama.kv_pools().made, llama.kv_pools().lent_again), (1, 1));
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        assert!(!a.tokens.is_empty());
        assert_eq!(a.tokens, b.tokens, "request {i} on the pool lent again");
    }
    let other = Engine::new(
        llama.clone(),
        tok,
        EngineConfig {
            kv_tokens: 4096,
            ..small()
        },
    )
    .unwrap();
    assert_eq!((llama.kv_pools().made, llama.kv_pools().lent_again), (2, 1));
    drop(other);
}

fn full_match(pattern: &str, text: &str) -> bool {
    let re = regex_automata::meta::Regex::new(&format!("^(?:{pattern})$")).unwrap();
    re.is_match(text)
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 0.95,
        seed,
    }
}

#[test]
fn regex_and_choice_outputs_always_match() {
    let mut e = engine(small());
    let pattern = r"[A-Z][a-z]{2,12}, [0-9]{1,3} (apples|pears)";
    let choices = vec![
        "red".to_string(),
        "green".into(),
        "blue".into(),
        "dark blue".into(),
    ];
    let mut reqs = Vec::new();
    for (i, q) in QUESTIONS.iter().enumerate() {
        for seed in 0..3 {
            reqs.push(
                Request::new(chat(q))
                    .with_constraint(ConstraintSpec::Regex(pattern.into()))
                    .with_sampling(sampled(seed + 10 * i as u64))
                    .with_max_tokens(40),
            );
            reqs.push(
                Request::new(chat(q))
                    .with_constraint(ConstraintSpec::Choice(choices.clone()))
                    .with_sampling(sampled(seed))
                    .with_max_tokens(10),
            );
        }
    }
    for (r, c) in reqs.iter().zip(run(&mut e, reqs.clone())) {
        assert_eq!(c.finish, FinishReason::ConstraintComplete, "{c:?}");
        match &r.constraint {
            ConstraintSpec::Regex(p) => assert!(full_match(p, &c.text), "{:?} !~ {p}", c.text),
            ConstraintSpec::Choice(ch) => assert!(ch.contains(&c.text), "{:?}", c.text),
            _ => unreachable!(),
        }
    }
}

fn package_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "version": {"type": "string", "pattern": "^[0-9][0-9a-z.+~-]{0,20}$"},
            "essential": {"type": "boolean"},
            "priority": {"enum": ["required", "important", "standard", "optional"]},
            "depends": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}
        },
        "required": ["name", "version", "essential", "priority", "depends"],
        "additionalProperties": false
    })
}

const PACKAGES: [&str; 4] = [
    "Package: coreutils\nEssential: yes\nPriority: required\nVersion: 9.1-1\nPre-Depends: libacl1, libattr1\nDescription: GNU core utilities",
    "Package: curl\nPriority: optional\nVersion: 7.88.1-10\nDepends: libc6, libcurl4, zlib1g\nDescription: command line tool for transferring data with URL syntax",
    "Package: tzdata\nPriority: required\nVersion: 2024a-0\nDepends: debconf\nDescription: time zone and daylight-saving time data",
    "Package: git\nPriority: optional\nVersion: 1:2.39.2-1.1\nDepends: libc6, libcurl3-gnutls, libexpat1, perl\nDescription: fast, scalable, distributed revision control system",
];

fn extraction(doc: &str) -> Prompt {
    chat(&format!("Extract the package as JSON.\n\n{doc}"))
}

/// A greedy request to extract `doc` under [`package_schema`].
fn schema_request(doc: &str) -> Request {
    Request::new(extraction(doc))
        .with_constraint(ConstraintSpec::JsonSchema(package_schema()))
        .with_max_tokens(120)
}

/// An engine started over runs its next requests as a new engine does: the same outputs, passes
/// and prompt tokens computed (its prefix cache emptied: nothing hits from before), with the
/// grammar it compiled still warm (no new compile). It refuses to start over with requests in
/// flight.
#[test]
fn an_engine_started_over_runs_like_a_new_one() {
    let reqs: Vec<Request> = PACKAGES.iter().map(|d| schema_request(d)).collect();
    let mut fresh = engine(small());
    let first = run(&mut fresh, reqs.clone());
    let cold = fresh.stats();
    fresh.start_over().unwrap();
    assert_eq!(fresh.stats().forward_passes, 0, "counters zeroed");
    let again = run(&mut fresh, reqs.clone());
    let warm = fresh.stats();
    for (i, (a, b)) in first.iter().zip(&again).enumerate() {
        assert_eq!(a.finish, FinishReason::ConstraintComplete, "{a:?}");
        assert_eq!(a.tokens, b.tokens, "request {i} after starting over");
    }
    assert_eq!(
        (
            warm.forward_passes,
            warm.forward_tokens,
            warm.cache.hit_tokens
        ),
        (
            cold.forward_passes,
            cold.forward_tokens,
            cold.cache.hit_tokens
        ),
        "the prompts computed as on a new engine"
    );
    assert_eq!(
        warm.grammars_compiled, 0,
        "the grammar stays compiled: {warm:?}"
    );
    assert!(cold.grammars_compiled > 0, "{cold:?}");
    fresh.submit(schema_request(PACKAGES[0])).unwrap();
    assert!(fresh.start_over().is_err(), "a request is in flight");
}

#[test]
fn json_schema_outputs_validate_with_and_without_jump_forward() {
    let schema = package_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut reqs = Vec::new();
    for (i, doc) in PACKAGES.iter().enumerate() {
        reqs.push(schema_request(doc));
        reqs.push(schema_request(doc).with_sampling(sampled(i as u64)));
    }
    let mut passes = Vec::new();
    for jump_forward in [false, true] {
        let mut e = engine(EngineConfig {
            jump_forward,
            ..small()
        });
        let out = run(&mut e, reqs.clone());
        for c in &out {
            assert_eq!(c.finish, FinishReason::ConstraintComplete, "{c:?}");
            let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
            assert!(
                validator.is_valid(&v),
                "jump_forward={jump_forward}: {}",
                c.text
            );
        }
        let s = e.stats();
        if jump_forward {
            assert!(s.forced_tokens > 0, "{s:?}");
        } else {
            assert_eq!(s.forced_tokens, 0);
        }
        passes.push(out.iter().map(|c| c.stats.forward_passes).sum::<usize>());
    }
    assert!(
        passes[1] < passes[0],
        "jump-forward should need fewer forward passes: {passes:?}"
    );
}

/// The settled keep-back commits every forced token the tokenizer cannot change, so it forces more
/// than keeping back a fixed 2 tokens; outputs stay valid, and the committed text is tokenized
/// the way the tokenizer tokenizes it.
#[test]
fn settled_keep_back_forces_more_and_commits_canonical_tokens() {
    let (_, tok) = model();
    let schema = package_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    // After the choice, the rest is forced: a long literal with words, punctuation and spaces.
    let pattern = r"(yes|no), the package (is|is not) essential to the system's boot";
    let mut reqs = Vec::new();
    for (i, doc) in PACKAGES.iter().enumerate() {
        reqs.push(schema_request(doc));
        reqs.push(
            Request::new(chat(&format!("Is this package essential?\n\n{doc}")))
                .with_constraint(ConstraintSpec::Regex(pattern.into()))
                .with_sampling(sampled(i as u64))
                .with_max_tokens(40),
        );
    }
    let mut forced = Vec::new();
    for rule in [KeepBack::Count, KeepBack::Settled] {
        let mut e = engine(EngineConfig {
            keep_back_rule: rule,
            // The rules themselves, without drafts (which force the kept-back tail after all).
            draft_kept_back: false,
            ..small_compact()
        });
        let out = run(&mut e, reqs.clone());
        for (r, c) in reqs.iter().zip(&out) {
            assert_eq!(
                c.finish,
                FinishReason::ConstraintComplete,
                "{rule:?}: {c:?}"
            );
            match &r.constraint {
                ConstraintSpec::Regex(p) => {
                    assert!(full_match(p, &c.text), "{rule:?}: {:?} !~ {p}", c.text);
                    // Only the choices were sampled, and jump-forward re-encodes the tokens
                    // before each forced run, so up to the settled prefix the output is
                    // tokenized as the tokenizer would.
                    let settled = tok.settled_len(&c.text, |_| true).unwrap();
                    let canonical = tok.encode(&c.text[..settled]).unwrap();
                    assert_eq!(
                        c.tokens.get(..canonical.len()),
                        Some(&canonical[..]),
                        "{rule:?}: {:?}",
                        c.text
                    );
                }
                _ => {
                    let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
                    assert!(validator.is_valid(&v), "{rule:?}: {}", c.text);
                }
            }
        }
        forced.push(e.stats().forced_tokens);
    }
    assert!(
        forced[1] > forced[0],
        "settled keep-back should force more tokens than a fixed count: {forced:?}"
    );
}

/// Drafts change how many tokens are forced and how many passes a sequence takes, never what it
/// writes: greedy and seeded sampled outputs equal keeping back, token for token. The model
/// confirms most drafts and refuses some (SmolLM2 writes `":` then `"` where the canonical
/// draft is `":"`), so both paths run.
#[test]
fn drafts_give_the_kept_back_outputs_with_more_forced_tokens() {
    let mut reqs = Vec::new();
    for (i, doc) in PACKAGES.iter().enumerate() {
        reqs.push(schema_request(doc));
        reqs.push(schema_request(doc).with_sampling(sampled(i as u64)));
    }
    // Budgets that run out inside the output, at every point of its first forced runs.
    for max_tokens in 4..=24 {
        reqs.push(schema_request(PACKAGES[1]).with_max_tokens(max_tokens));
    }
    // Without the token budget first (outputs cut inside a forced run: every path of drafts
    // and `max_tokens` runs), then with it (its checks of forced runs and drafts).
    for close_within_budget in [false, true] {
        drafts_equal_keep_back(&reqs, close_within_budget);
    }
}

fn drafts_equal_keep_back(reqs: &[Request], close_within_budget: bool) {
    let mut runs = Vec::new();
    for draft_kept_back in [false, true] {
        // One sequence at a time, so a sequence's passes are the engine's.
        let mut e = engine(EngineConfig {
            draft_kept_back,
            max_running: 1,
            close_within_budget,
            ..small_compact()
        });
        let out = run(&mut e, reqs.to_vec());
        runs.push((out, e.stats()));
    }
    let ((kept, ks), (drafted, ds)) = (&runs[0], &runs[1]);
    for ((k, d), r) in kept.iter().zip(drafted).zip(reqs) {
        assert_eq!(k.text, d.text);
        assert_eq!(k.tokens, d.tokens, "{}", k.text);
        assert_eq!(k.finish, d.finish);
        assert!(
            d.tokens.len() <= r.max_tokens,
            "{} > {}",
            d.tokens.len(),
            r.max_tokens
        );
    }
    if close_within_budget {
        // Budgets under the shortest record are refused; every other record closes.
        assert!(kept.iter().all(|c| c.finish != FinishReason::Length));
        assert!(kept
            .iter()
            .any(|c| matches!(c.finish, FinishReason::BudgetTooSmall { .. })));
        assert!(kept.iter().any(|c| c.finish == FinishReason::BudgetClosed));
    } else {
        assert!(kept.iter().any(|c| c.finish == FinishReason::Length));
    }
    assert_eq!((ks.drafts_confirmed, ks.drafts_refused), (0, 0));
    assert!(ds.drafts_confirmed > 0 && ds.drafts_refused > 0, "{ds:?}");
    assert_eq!(
        ds.forced_tokens,
        ks.forced_tokens + ds.drafts_confirmed,
        "{ds:?} {ks:?}"
    );
    assert!(ds.forward_passes < ks.forward_passes, "{ds:?} {ks:?}");

    // Streaming shows only what the model wrote or confirmed: each partial output extends the
    // last, even when a draft is refused.
    let mut e = engine(EngineConfig {
        max_running: 1,
        close_within_budget,
        ..small_compact()
    });
    for r in reqs.iter().take(8) {
        let id = e.submit(r.clone()).unwrap();
        let mut shown: Vec<u8> = Vec::new();
        let done = loop {
            let mut done = e.step().unwrap();
            if let Some(c) = done.pop() {
                break c;
            }
            let now = e.partial_output(id).unwrap().to_vec();
            assert!(now.starts_with(&shown), "{shown:?} then {now:?}");
            shown = now;
        };
        assert!(done.text.as_bytes().starts_with(&shown));
    }
    assert!(e.stats().drafts_refused > 0, "{:?}", e.stats());
}

#[test]
fn json_object_is_an_object() {
    let mut e = engine(small());
    let c = run(
        &mut e,
        vec![Request::new(extraction(PACKAGES[1]))
            .with_constraint(ConstraintSpec::JsonObject)
            .with_max_tokens(200)],
    )
    .remove(0);
    if c.finish == FinishReason::ConstraintComplete {
        let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
        assert!(v.is_object(), "{}", c.text);
    } else {
        assert_eq!(c.finish, FinishReason::Length);
    }
}

#[test]
fn a_grammar_that_hit_a_limit_is_compiled_afresh_for_new_requests() {
    let req = || {
        Request::new(extraction(PACKAGES[1]))
            .with_constraint(ConstraintSpec::JsonObject)
            .with_max_tokens(60)
    };
    // Default limits: one compile serves every request.
    let mut e = engine(small());
    run(&mut e, vec![req()]);
    run(&mut e, vec![req()]);
    assert_eq!(e.stats().grammars_compiled, 1);
    // A state limit so small that the first request's grammar stops growing (its mask walks
    // alone pass it): the output stays inside the language or ends with an error naming the
    // limit, and the next request gets a fresh grammar.
    let mut cfg = small();
    cfg.limits.max_states = 12;
    let mut e = engine(cfg);
    let c = run(&mut e, vec![req()]).remove(0);
    match &c.finish {
        FinishReason::Error(m) => assert!(m.contains("max_states"), "{m}"),
        FinishReason::Length => {}
        FinishReason::ConstraintComplete | FinishReason::BudgetClosed => {
            let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
            assert!(v.is_object(), "{}", c.text);
        }
        other => panic!("{other:?} {:?}", c.text),
    }
    assert_eq!(e.stats().grammars_compiled, 1);
    run(&mut e, vec![req()]);
    assert_eq!(e.stats().grammars_compiled, 2);
}

#[test]
fn max_tokens_inside_a_constraint_is_length_without_the_budget() {
    let mut e = engine(EngineConfig {
        close_within_budget: false,
        ..small()
    });
    let c = run(
        &mut e,
        vec![Request::new(extraction(PACKAGES[0]))
            .with_constraint(ConstraintSpec::JsonSchema(package_schema()))
            .with_max_tokens(5)],
    )
    .remove(0);
    assert_eq!(c.finish, FinishReason::Length);
    assert!(!c.is_complete());
    assert!(c.tokens.len() <= 5, "{}", c.tokens.len());
    assert!(serde_json::from_str::<serde_json::Value>(&c.text).is_err());
}

#[test]
fn shared_prefix_is_computed_once() {
    let instruction =
        "You read Debian package records and answer questions about them. ".repeat(12);
    let reqs: Vec<Request> = PACKAGES
        .iter()
        .map(|d| {
            Request::text(format!("{instruction}\n{d}\nThe package name is")).with_max_tokens(4)
        })
        .collect();
    let mut on = engine(small());
    let a = run(&mut on, reqs.clone());
    let mut off = engine(EngineConfig {
        radix_cache: false,
        ..small()
    });
    let b = run(&mut off, reqs);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.tokens, y.tokens, "cached KV changed the output");
    }
    let s = on.stats();
    // The instruction's tokens, less one where it meets the document.
    let (_, tok) = model();
    let prefix = tok.encode(&instruction).unwrap().len() - 1;
    assert!(
        s.cache.hit_tokens as usize >= 3 * prefix,
        "three of four prompts should reuse the instruction: {s:?}"
    );
    assert!(on.stats().forward_tokens < off.stats().forward_tokens);
    assert_eq!(off.stats().cache.hit_tokens, 0);
}

#[test]
fn eviction_and_retraction_under_a_small_pool() {
    // Room for about two sequences at a time: requests wait, the cache evicts, outputs stay the same.
    let reqs: Vec<Request> = QUESTIONS
        .iter()
        .map(|q| Request::new(chat(q)).with_max_tokens(40))
        .collect();
    let mut roomy = engine(small());
    let want = run(&mut roomy, reqs.clone());
    let mut tight = engine(EngineConfig {
        kv_tokens: 130,
        ..small()
    });
    let got = run(&mut tight, reqs);
    for (x, y) in want.iter().zip(&got) {
        assert_eq!(x.tokens, y.tokens);
    }
    let s = tight.stats();
    assert!(s.cache.evicted_pages > 0, "{s:?}");
}

#[test]
fn disallowed_tokens_never_appear() {
    let (_, tok) = model();
    let req = Request::new(chat(QUESTIONS[0])).with_max_tokens(16);
    let mut e = engine(small());
    let base = run(&mut e, vec![req.clone()]).remove(0);
    let banned: Vec<u32> = base.tokens.iter().copied().take(3).collect();
    let mut r = req;
    r.processors.push(Processor::DisallowTokens {
        ids: banned.clone(),
    });
    let c = run(&mut e, vec![r]).remove(0);
    assert!(!c.tokens.is_empty());
    assert!(
        c.tokens.iter().all(|t| !banned.contains(t)),
        "banned {:?} in {:?}",
        tok.decode(&banned, false),
        c.text
    );
}

#[test]
fn no_repeat_ngram_removes_repeats() {
    // Greedy decoding of a list prompt repeats itself.
    let prompt = Prompt::Text("one two three one two three one two three one two".into());
    let mut e = engine(small());
    let base = run(
        &mut e,
        vec![Request::new(prompt.clone()).with_max_tokens(24)],
    )
    .remove(0);
    let repeats = |t: &[u32], n: usize| {
        (0..t.len().saturating_sub(n))
            .any(|i| (i + 1..=t.len() - n).any(|j| t[i..i + n] == t[j..j + n]))
    };
    assert!(
        repeats(&base.tokens, 3),
        "the base output should repeat: {:?}",
        base.text
    );
    let mut r = Request::new(prompt).with_max_tokens(24);
    r.processors.push(Processor::NoRepeatNgram {
        n: 3,
        window: 64,
        whitelist: vec![],
    });
    let c = run(&mut e, vec![r]).remove(0);
    assert!(!repeats(&c.tokens, 3), "{:?}", c.text);
}

/// Records that always close with a reasoning mode and no thinking budget (docs/budget.md): the
/// model thinks until only the answer's room is left (the marker and the shortest record), then
/// the marker is forced and the record closes within `max_tokens`; a budget under that room is
/// refused up front.
#[test]
fn the_token_budget_ends_the_thinking_in_time_for_the_record() {
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"]});
    let request = |max_tokens: usize| {
        let mut r = Request::new(chat("Think at length, then answer: is the sky blue?"))
            .with_constraint(ConstraintSpec::JsonSchema(schema.clone()))
            .with_max_tokens(max_tokens);
        r.reasoning = Some(Reasoning::default());
        r
    };
    let mut e = engine(small());
    let out = run(&mut e, vec![request(40), request(3)]);
    let c = &out[0];
    assert!(c.is_complete(), "{c:?}");
    assert!(c.tokens.len() <= 40, "{}", c.tokens.len());
    let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
    assert!(v["answer"] == "yes" || v["answer"] == "no", "{}", c.text);
    assert!(
        c.reasoning.as_deref().unwrap().ends_with("</think>"),
        "{c:?}"
    );
    assert!(
        matches!(
            out[1].finish,
            FinishReason::BudgetTooSmall { max_tokens: 3, .. }
        ),
        "{:?}",
        out[1].finish
    );
}

#[test]
fn thinking_budget_then_constraint() {
    let (_, tok) = model();
    let mut r = Request::new(chat("Think, then say yes or no: is the sky blue?"))
        .with_constraint(ConstraintSpec::Choice(vec!["yes".into(), "no".into()]))
        .with_max_tokens(40);
    r.reasoning = Some(Reasoning::default());
    r.processors
        .push(Processor::ThinkingBudget { max_tokens: 6 });
    let mut e = engine(small());
    let c = run(&mut e, vec![r]).remove(0);
    assert_eq!(c.finish, FinishReason::ConstraintComplete, "{c:?}");
    assert!(c.text == "yes" || c.text == "no", "{:?}", c.text);
    let thinking = c.reasoning.unwrap();
    assert!(thinking.ends_with("\n</think>"), "{thinking:?}");
    // Six thinking tokens, then the forced newline and marker.
    let forced = tok
        .encode_with(
            "\n</think>",
            quarry_tokenizer::EncodeOptions {
                add_bos: false,
                parse_special: true,
            },
        )
        .unwrap();
    assert_eq!(&c.tokens[6..6 + forced.len()], &forced[..]);
    assert_eq!(c.stats.forced_tokens, forced.len());
}

#[test]
fn bad_requests_fail_alone() {
    let mut e = engine(EngineConfig {
        max_waiting: 4,
        ..small()
    });
    let good = Request::new(chat(QUESTIONS[1])).with_max_tokens(4);
    let reqs = vec![
        Request::new(chat("x")).with_constraint(ConstraintSpec::Regex("(".into())),
        good.clone(),
        Request::text(""),
        Request::text("hi").with_sampling(SamplingParams {
            top_p: 0.0,
            ..SamplingParams::greedy()
        }),
        Request::text("a ".repeat(9000)),
        Request {
            processors: vec![Processor::ThinkingBudget { max_tokens: 3 }],
            ..good.clone()
        },
    ];
    let out = run(&mut e, reqs);
    let msg = |c: &Completion| match &c.finish {
        FinishReason::Error(m) => m.clone(),
        f => panic!("expected an error, got {f:?}"),
    };
    assert!(msg(&out[0]).contains("constraint"), "{}", msg(&out[0]));
    assert!(out[1].is_complete() || out[1].finish == FinishReason::Length);
    assert!(msg(&out[2]).contains("empty"));
    assert!(msg(&out[3]).contains("top_p"));
    assert!(msg(&out[4]).contains("context") || msg(&out[4]).contains("KV pool"));
    assert!(msg(&out[5]).contains("reasoning"));
    // Backpressure: a full queue refuses, and says so.
    for _ in 0..4 {
        e.submit(good.clone()).unwrap();
    }
    assert!(matches!(
        e.submit(good),
        Err(EngineError::QueueFull { capacity: 4 })
    ));
}
