//! The token budget's completions (`docs/budget.md`): every constraint kind has a shortest
//! record; for regexes it is exactly the shortest match that an independent DFA
//! (regex-automata's) gives; a schema's validates with the `jsonschema` crate; and decoding
//! driven by an adversary that always takes the token that keeps the record open longest,
//! under the budget's rule, ends complete for every `max_tokens` at or above the shortest
//! record, with the byte vocabulary and with SmolLM2's.

#[path = "common/vocab.rs"]
mod vocab;

use std::path::PathBuf;
use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, Limits, Matcher, SchemaOptions, Vocabulary};
use regex_automata::dfa::{dense, Automaton};
use regex_automata::util::{primitives::StateID, start};
use regex_automata::Anchored;
use serde_json::{json, Value};

const REGEXES: &[&str] = &[
    "(ab)+",
    "a{3,5}b?",
    "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,6}",
    r"([0-9]*)?\.?[0-9]*",
    "(yes|no|maybe)",
    "x(abc|de)*y(fgh){2}",
    r#"\{"name": "[a-z]{2,8}", "tags": \[("[a-z]+"(, "[a-z]+"){1,3})\]\}"#,
    "(a|bc|def){4}z",
    "[^\"]{10,12}\"",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn compile(c: &Constraint, vocab: &Arc<Vocabulary>) -> Arc<Grammar> {
    Arc::new(Grammar::compile(c, vocab.clone(), Limits::default()).unwrap())
}

/// The shortest full match of `pattern` in bytes, by breadth-first search over regex-automata's
/// anchored dense DFA (all 256 bytes, a match where the end-of-input transition matches).
fn reference_shortest(pattern: &str) -> usize {
    let dfa = dense::DFA::new(&format!("^(?:{pattern})$")).unwrap();
    let start = dfa
        .start_state(&start::Config::new().anchored(Anchored::Yes))
        .unwrap();
    let mut seen = std::collections::HashSet::<StateID>::from([start]);
    let mut frontier = vec![start];
    for depth in 0.. {
        assert!(!frontier.is_empty(), "{pattern}: no match");
        if frontier
            .iter()
            .any(|&s| dfa.is_match_state(dfa.next_eoi_state(s)))
        {
            return depth;
        }
        let mut next = Vec::new();
        for &s in &frontier {
            for b in 0..=255u8 {
                let n = dfa.next_state(s, b);
                if !dfa.is_dead_state(n) && seen.insert(n) {
                    next.push(n);
                }
            }
        }
        frontier = next;
    }
    unreachable!()
}

/// The constraints of every kind the budget covers: the regexes, a choice, the repository's
/// schemas and some with the shapes that run long (open objects, long strings, growing arrays,
/// recursion), the GBNF and Lark grammars of the tests, and `json_object`.
fn corpus() -> Vec<(String, Constraint)> {
    let mut out: Vec<(String, Constraint)> = REGEXES
        .iter()
        .map(|r| (format!("regex {r}"), Constraint::Regex(r.to_string())))
        .collect();
    out.push((
        "choice".into(),
        Constraint::Choice(vec!["installed".into(), "ok".into(), "held back".into()]),
    ));
    let schema = |name: &str, schema: Value| {
        (
            format!("schema {name}"),
            Constraint::JsonSchema {
                schema,
                options: SchemaOptions::default(),
            },
        )
    };
    for file in ["debian-package.json", "package-id.json"] {
        let text = std::fs::read(root().join("schemas").join(file)).unwrap();
        out.push(schema(file, serde_json::from_slice(&text).unwrap()));
    }
    out.push(schema(
        "open object",
        json!({"type": "object", "properties": {"id": {"type": "integer"}},
               "required": ["id"], "additionalProperties": {"type": "string"}}),
    ));
    out.push(schema(
        "long string and growing array",
        json!({"type": "object", "properties": {
            "summary": {"type": "string", "minLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 3},
            "score": {"type": "number"}},
          "required": ["summary", "tags", "score"]}),
    ));
    out.push(schema(
        "recursive tree",
        json!({"$defs": {"node": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
              "required": ["name", "children"]}},
          "$ref": "#/$defs/node"}),
    ));
    out.push(schema(
        "not and enum",
        json!({"type": "object", "properties": {
            "kind": {"enum": ["alpha", "beta", "gamma"]},
            "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
          "required": ["kind", "code"],
          "additionalProperties": false}),
    ));
    let grammars = root().join("workspace/quarry-grammar/tests/grammars");
    for name in ["json.gbnf", "arithmetic.gbnf", "csv.lark", "json.lark"] {
        let text = std::fs::read_to_string(grammars.join(name)).unwrap();
        let c = if name.ends_with(".lark") {
            Constraint::Lark(text)
        } else {
            Constraint::Gbnf(text)
        };
        out.push((name.to_string(), c));
    }
    out.push((
        "json_object".into(),
        Constraint::JsonObject {
            whitespace: Default::default(),
        },
    ));
    out
}

#[test]
fn a_regex_shortest_record_is_its_shortest_match() {
    let vocab = vocab::byte_vocab();
    for pattern in REGEXES {
        let g = compile(&Constraint::Regex(pattern.to_string()), &vocab);
        assert_eq!(
            g.shortest_record(),
            Some(reference_shortest(pattern)),
            "{pattern}"
        );
        // The completion spells a match, token by token.
        let tokens = g.shortest_record_tokens().unwrap();
        let mut m = Matcher::new(g.clone());
        for t in tokens {
            m.accept_token(t).unwrap();
        }
        assert!(m.is_accepting(), "{pattern}");
    }
}

#[test]
fn every_constraint_kind_has_a_shortest_record_that_it_accepts() {
    for vocab in [
        vocab::byte_vocab(),
        vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf"),
    ] {
        for (name, c) in corpus() {
            let g = compile(&c, &vocab);
            let tokens = g
                .shortest_record_tokens()
                .unwrap_or_else(|| panic!("{name}: no shortest record"));
            assert_eq!(Some(tokens.len()), g.shortest_record(), "{name}");
            let mut m = Matcher::new(g.clone());
            let mut text = Vec::new();
            for (i, &t) in tokens.iter().enumerate() {
                // Each step leaves a completion exactly one token shorter: the invariant the
                // engine's budget rests on.
                assert_eq!(m.completion_len(), Some(tokens.len() - i), "{name}");
                assert_eq!(m.completion_first(), Some(t), "{name}");
                m.accept_token(t).unwrap();
                text.extend_from_slice(vocab.token_bytes(t).unwrap());
            }
            assert!(m.is_accepting(), "{name}");
            assert_eq!(m.completion_len(), Some(0), "{name}");
            if let Constraint::JsonSchema { schema, .. } = &c {
                let value: Value = serde_json::from_slice(&text)
                    .unwrap_or_else(|e| panic!("{name}: {e}: {}", String::from_utf8_lossy(&text)));
                assert!(
                    jsonschema::is_valid(schema, &value),
                    "{name}: {value} is not valid"
                );
            }
        }
    }
}

/// Decodes `g` for at most `max_tokens` tokens as an adversary would: at every step it takes,
/// of the allowed tokens it looks at, the one after which the record needs the most tokens
/// to close (the longest first on ties), never EOS while anything else is allowed. The budget's
/// rule: a token that would leave no completion within what is left is refused, and the
/// adversary chooses again among the tokens that fit ([`Matcher::retain_fitting`]). `slack`
/// breaks the rule by that many tokens (the mutation check). Returns the output and whether the
/// record is complete.
fn adversarial(g: &Arc<Grammar>, max_tokens: usize, slack: usize) -> (Vec<u8>, bool) {
    let vocab = g.vocabulary().clone();
    let mut m = Matcher::new(g.clone());
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut out = Vec::new();
    for written in 0..max_tokens {
        if m.is_finished() {
            break;
        }
        let left = max_tokens - written;
        m.fill_mask(&mut mask);
        let pick = |mask: &[u32]| -> Option<u32> {
            let allowed: Vec<u32> = (0..vocab.len() as u32)
                .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
                .collect();
            // A deterministic spread of at most 256 candidates (a 152k-token mask is too many
            // to rank at every step), the EOS token and the completion's first token always in.
            let stride = allowed.len().div_ceil(256).max(1);
            let mut candidates: Vec<u32> = allowed.iter().copied().step_by(stride).collect();
            candidates.extend(m.completion_first().filter(|t| allowed.contains(t)));
            let key = |&t: &u32| {
                let eos = vocab.is_eos(t);
                let need = m.completion_after(t).unwrap_or(0);
                (!eos, need, vocab.token_bytes(t).map_or(0, |b| b.len()))
            };
            candidates.into_iter().max_by_key(key)
        };
        let mut t = pick(&mask).expect("a live state allows a token");
        let fits = |t: u32| {
            vocab.is_eos(t)
                || m.completion_after(t)
                    .is_some_and(|need| need < left + slack)
        };
        if !fits(t) {
            let kept = m.retain_fitting(&mut mask, left + slack);
            assert!(kept > 0, "nothing fits with {left} tokens left");
            t = pick(&mask).expect("kept");
        }
        if vocab.is_eos(t) {
            break;
        }
        m.accept_token(t).unwrap();
        out.extend_from_slice(vocab.token_bytes(t).unwrap());
    }
    let done = m.is_accepting();
    (out, done)
}

#[test]
fn an_adversary_under_the_budget_always_closes_the_record() {
    for vocab in [
        vocab::byte_vocab(),
        vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf"),
    ] {
        for (name, c) in corpus() {
            let g = compile(&c, &vocab);
            let shortest = g.shortest_record().unwrap();
            for extra in [0, 1, 2, 5, 13, 40] {
                let max_tokens = shortest + extra;
                let (out, done) = adversarial(&g, max_tokens, 0);
                assert!(
                    done,
                    "{name}: max_tokens {max_tokens} (shortest {shortest}) ended incomplete: {}",
                    String::from_utf8_lossy(&out)
                );
                if let Constraint::JsonSchema { schema, .. } = &c {
                    let value: Value = serde_json::from_slice(&out).unwrap();
                    assert!(jsonschema::is_valid(schema, &value), "{name}: {value}");
                }
            }
        }
    }
}

#[test]
fn breaking_the_bound_by_one_token_lets_records_end_cut() {
    // The mutation check: the same adversary with the rule loosened by one token ends some
    // record incomplete, so the test above would catch an off-by-one in the bound.
    let vocab = vocab::byte_vocab();
    let cut = corpus()
        .iter()
        .filter(|(_, c)| {
            let g = compile(c, &vocab);
            let shortest = g.shortest_record().unwrap();
            [0, 1, 5]
                .iter()
                .any(|extra| !adversarial(&g, shortest + extra, 1).1)
        })
        .count();
    assert!(cut > 0, "a bound loosened by one still closed every record");
}

#[test]
fn a_peeked_token_is_accepted_as_accept_token_would() {
    // The engine walks a drawn token once (`peek_token`), checks the budget on it and accepts
    // the walk (`accept_peeked`): the same states, masks and completions as `accept_token`,
    // and a peek made before the matcher moved is walked again, not trusted.
    let vocab = vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf");
    let (mut a_mask, mut b_mask) = (
        vec![0u32; vocab.mask_words()],
        vec![0u32; vocab.mask_words()],
    );
    for (name, c) in corpus() {
        let g = compile(&c, &vocab);
        let record = g.shortest_record_tokens().unwrap();
        let (mut a, mut b) = (Matcher::new(g.clone()), Matcher::new(g.clone()));
        let mut stale = None;
        for (i, &t) in record.iter().enumerate() {
            let peek = b.peek_token(t).unwrap();
            assert_eq!(peek.token(), t);
            assert_eq!(
                b.completion_after_peek(&peek),
                a.completion_after(t),
                "{name}"
            );
            a.accept_token(t).unwrap();
            b.accept_peeked(peek).unwrap();
            a.fill_mask(&mut a_mask);
            b.fill_mask(&mut b_mask);
            assert!(a_mask == b_mask, "{name}: masks differ after token {i}");
            assert_eq!(a.completion_len(), b.completion_len(), "{name}");
            if i == 0 {
                stale = Some(peek);
            }
        }
        assert!(b.is_accepting(), "{name}");
        if record.len() > 1 {
            // A peek of the first token, from the start, accepted at the end: walked again from
            // where the matcher is, so the result is whatever `accept_token` says there.
            let stale = stale.unwrap();
            let by_token = a.clone().accept_token(stale.token());
            let by_peek = b.accept_peeked(stale);
            assert_eq!(by_token.is_ok(), by_peek.is_ok(), "{name}");
        }
    }
}

/// The budget's draw again by the states' fit tables keeps exactly the tokens the walk over
/// every allowed token keeps, at every step of adversarial and greedy decodes and for every
/// number of tokens left; with no room for tables (`max_fit_table_bytes = 0`) it walks, with
/// the same result.
#[test]
fn fit_tables_keep_what_the_walk_keeps() {
    let vocab = vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut compared = 0;
    let mut tables = 0;
    for room in [64 << 20, 0] {
        let limits = Limits {
            max_fit_table_bytes: room,
            ..Limits::default()
        };
        for (name, c) in corpus() {
            let g = Arc::new(Grammar::compile(&c, vocab.clone(), limits).unwrap());
            let mut m = Matcher::new(g.clone());
            let mut mask = vec![0u32; vocab.mask_words()];
            for step in 0..40 {
                if m.is_finished() {
                    break;
                }
                m.fill_mask(&mut mask);
                for left in [0, 1, 2, 3, 5, 8, 13] {
                    let (mut by_table, mut by_walk) = (mask.clone(), mask.clone());
                    let kept = m.retain_fitting(&mut by_table, left);
                    let walked = m.retain_fitting_by_walk(&mut by_walk, left);
                    assert_eq!(
                        (kept, &by_table),
                        (walked, &by_walk),
                        "{name}: step {step}, {left} left"
                    );
                    compared += 1;
                }
                // Alternate the longest-needing and the completion's own token, so that the
                // walk meets states with many distinct needs and accepting ones.
                let next = if step % 2 == 0 {
                    m.completion_first()
                } else {
                    (0..vocab.len() as u32)
                        .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
                        .filter(|&t| !vocab.is_eos(t))
                        .step_by(7)
                        .take(300)
                        .max_by_key(|&t| (m.completion_after(t).unwrap_or(0), t))
                };
                let Some(t) = next else { break };
                m.accept_token(t).unwrap();
            }
            tables += usize::from(room > 0);
        }
    }
    assert!(compared > 500 && tables > 5, "{compared} comparisons");
}
