//! Property test: random schemas from a generator, random walks of the matcher through their masks
//! (with jump-forward), and every completed output parsed with serde_json and validated by the
//! `jsonschema` crate, an implementation independent of quarry.

mod common;
#[path = "common/vocab.rs"]
mod vocab;
#[path = "common/walk.rs"]
mod walk;

use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, Limits, Matcher, Rejection, SchemaOptions, Whitespace};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

fn scalar(rng: &mut SmallRng) -> Value {
    match rng.random_range(0..5) {
        0 => json!(null),
        1 => json!(rng.random_bool(0.5)),
        2 => json!(rng.random_range(-20..20)),
        3 => json!(["red", "green", "Blue \"b\"", "é"][rng.random_range(0..4)]),
        _ => json!(rng.random_range(-5.0..5.0f64).round() / 2.0),
    }
}

fn gen_schema(rng: &mut SmallRng, depth: u32) -> Value {
    let pick = if depth == 0 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..10)
    };
    match pick {
        0 => {
            let mut s = json!({"type": "string", "maxLength": rng.random_range(1..6)});
            match rng.random_range(0..4) {
                0 => s["minLength"] = json!(rng.random_range(0..2)),
                1 => s = json!({"type": "string", "pattern": "^[a-c]+$"}),
                2 if rng.random_bool(0.5) => {
                    // A pattern (a search) together with a length.
                    s = json!({"type": "string", "pattern": "b", "maxLength": rng.random_range(1..5)})
                }
                2 => {
                    let formats = [
                        "date",
                        "time",
                        "date-time",
                        "uuid",
                        "ipv4",
                        "ipv6",
                        "hostname",
                        "email",
                        "duration",
                        "uri",
                        "uri-reference",
                        "idn-hostname",
                        "regex",
                        "uri-template",
                    ];
                    s = json!({"type": "string", "format": formats[rng.random_range(0..formats.len())]});
                }
                _ => {}
            }
            s
        }
        1 => {
            let lo = rng.random_range(-50..50);
            json!({"type": "integer", "minimum": lo, "exclusiveMaximum": lo + rng.random_range(1..200)})
        }
        2 => [
            json!({"type": "number", "minimum": 0}),
            json!({"type": "number", "exclusiveMinimum": 0}),
            json!({"type": "number"}),
            json!({"type": "number", "minimum": -1.25, "exclusiveMaximum": 2.5}),
            json!({"type": "number", "exclusiveMinimum": 0.125, "maximum": 10}),
            json!({"type": "number", "multipleOf": 0.01, "maximum": 3}),
            json!({"type": "integer", "multipleOf": 5, "minimum": 0}),
            json!({"type": "integer", "multipleOf": 3, "minimum": -10, "maximum": 60}),
        ][rng.random_range(0..8)]
        .clone(),
        3 => {
            let t = ["boolean", "null"][rng.random_range(0..2)];
            json!({ "type": t })
        }
        4 => json!({"enum": (0..rng.random_range(1..4)).map(|_| scalar(rng)).collect::<Vec<_>>()}),
        5 => {
            let mut props = Map::new();
            let mut required = Vec::new();
            for i in 0..rng.random_range(0..4) {
                let name = ["id", "name", "tags", "a\"b", "ünï"][i % 5].to_string();
                if rng.random_bool(0.5) {
                    required.push(json!(name.clone()));
                }
                props.insert(name, gen_schema(rng, depth - 1));
            }
            let (n_props, n_required) = (props.len(), required.len());
            let mut s = json!({"type": "object", "properties": props, "required": required});
            let names: Vec<String> = s["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            if names.len() >= 2 && rng.random_bool(0.4) {
                let (a, b) = (&names[0], &names[names.len() - 1]);
                let (t, d) = if rng.random_bool(0.5) { (a, b) } else { (b, a) };
                s["dependentRequired"] = json!({ t.clone(): [d.clone()] });
            }
            if s.get("dependentRequired").is_none() && rng.random_bool(0.3) {
                // Satisfiable counts: at least the required ones, at most the declared ones.
                let max = n_required + rng.random_range(0..2);
                s["maxProperties"] = json!(max);
                s["minProperties"] = json!(rng.random_range(0..=n_props.min(max)));
            }
            match rng.random_range(0..3) {
                0 => s["additionalProperties"] = json!(false),
                1 => s["additionalProperties"] = json!({"type": "integer"}),
                _ => {}
            }
            s
        }
        6 if rng.random_bool(0.3) => {
            let k = rng.random_range(0..3);
            json!({"type": "array", "contains": gen_schema(rng, depth - 1), "minContains": k})
        }
        6 if rng.random_bool(0.3) => {
            let pool = [
                json!("a"),
                json!("b"),
                json!(1),
                json!(2.5),
                json!(true),
                json!(null),
            ];
            let n = rng.random_range(1..5);
            let values: Vec<Value> = pool[..n].to_vec();
            json!({"type": "array", "items": {"enum": values}, "uniqueItems": true,
                   "minItems": rng.random_range(0..=n), "maxItems": n})
        }
        6 => {
            let min = rng.random_range(0..2);
            let mut s = json!({"type": "array", "items": gen_schema(rng, depth - 1), "minItems": min, "maxItems": min + rng.random_range(0..3)});
            // Unique items of any kind (checked while decoding); at most one item is required,
            // so no item domain is too small.
            if rng.random_bool(0.3) {
                s["uniqueItems"] = json!(true);
            }
            s
        }
        7 => json!({"anyOf": [gen_schema(rng, depth - 1), gen_schema(rng, depth - 1)]}),
        8 => {
            // allOf branches that merge exactly: split an object, an integer range or a length.
            let lo = rng.random_range(-20..20);
            match rng.random_range(0..3) {
                0 => json!({"allOf": [
                    {"type": "object", "properties": {"id": gen_schema(rng, depth - 1)}, "required": ["id"]},
                    {"properties": {"name": gen_schema(rng, depth - 1), "id": {"description": "the key"}}},
                ]}),
                1 => {
                    json!({"allOf": [{"type": "integer", "minimum": lo}, {"maximum": lo + rng.random_range(0..50)}]})
                }
                _ => {
                    json!({"allOf": [{"type": "string", "maxLength": 5}, {"minLength": 1}, {"maxLength": 3}]})
                }
            }
        }
        9 => {
            // Negation and conditionals.
            let a = gen_schema(rng, depth - 1);
            let b = gen_schema(rng, depth - 1);
            match rng.random_range(0..5) {
                0 => json!({"not": {"enum": [scalar(rng), scalar(rng)]}}),
                4 => {
                    json!({"type": "array", "items": {"type": ["integer", "string"], "maxLength": 2},
                    "contains": {"type": "integer", "minimum": 0},
                    "minContains": rng.random_range(0..2), "maxContains": 2})
                }
                1 => json!({"type": "object",
                    "properties": {"kind": {"enum": ["a", "b"]}, "v": {}},
                    "required": ["kind"],
                    "if": {"properties": {"kind": {"const": "a"}}},
                    "then": {"properties": {"v": a}, "required": ["v"]},
                    "else": {"properties": {"v": b}}}),
                // Overlapping branches: the overlaps (integers in [2, 5], strings of length 1
                // or 2) must be excluded.
                2 => json!({"oneOf": [
                    {"type": "integer", "maximum": 5},
                    {"type": "number", "minimum": 2, "maximum": 9},
                    {"type": "string", "maxLength": 2},
                    {"type": "string", "minLength": 1, "maxLength": 4},
                ]}),
                _ => json!({"allOf": [
                    {"type": ["integer", "string"], "maxLength": 3},
                    {"not": {"type": "integer", "minimum": 3}},
                ]}),
            }
        }
        _ => unreachable!(),
    }
}

/// A schema whose items are a local reference into the root's `$defs` (references resolve
/// against the document root, so only the root may hold them).
fn gen_root(rng: &mut SmallRng) -> Value {
    if rng.random_bool(0.2) {
        json!({
            "$defs": {"item": gen_schema(rng, 1)},
            "type": "array",
            "items": {"$ref": "#/$defs/item"},
            "maxItems": 2
        })
    } else {
        gen_schema(rng, 2)
    }
}

#[test]
fn completed_outputs_validate_with_jsonschema() {
    let vocab = common::fuzz_case::small_vocab();
    // QUARRY_PROPTEST_SEED explores other schemas by hand; CI uses the fixed default.
    let seed = std::env::var("QUARRY_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut mask = vec![0u32; vocab.mask_words()];
    let (mut completed, mut schemas) = (0, 0);
    for i in 0..200 {
        let schema = gen_root(&mut rng);
        // `strict` applies to the object an allOf merges to, while a validator given the
        // strictified schema would close each branch on its own properties: not comparable.
        let strict = rng.random_bool(0.3) && !schema.to_string().contains("allOf");
        let options = SchemaOptions {
            strict,
            whitespace: match i % 3 {
                0 => Whitespace::Pretty { max_run: 2 },
                1 => Whitespace::Spaced,
                _ => Whitespace::Compact,
            },
            ..SchemaOptions::default()
        };
        let constraint = Constraint::JsonSchema {
            schema: schema.clone(),
            options,
        };
        let grammar = match Grammar::compile(&constraint, vocab.clone(), Limits::default()) {
            Ok(g) => Arc::new(g),
            Err(e) => panic!("generated schema {schema} failed to compile: {e}"),
        };
        // Under `strict`, a missing additionalProperties means false; say so to the validator.
        let checked = if options.strict {
            strictify(&schema)
        } else {
            schema.clone()
        };
        // Formats are asserted, so the conservative format regexes are checked too.
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&checked)
            .unwrap();
        schemas += 1;
        for _ in 0..4 {
            if grammar.is_empty_language() {
                panic!("{schema}: the generator makes no unsatisfiable schema");
            }
            let Some(text) = walk::walk(&grammar, &vocab, &mut rng, &mut mask, 400) else {
                continue; // the walk did not end with EOS within the step budget
            };
            let instance: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{schema}: output {text:?} is not JSON: {e}"));
            assert!(
                validator.is_valid(&instance),
                "{schema} (strict {}): output {text} is invalid",
                options.strict
            );
            if let Some(bad) = layout_error(&text, options.whitespace) {
                panic!("{schema} ({:?}): output {text}: {bad}", options.whitespace);
            }
            completed += 1;
        }
    }
    assert_eq!(schemas, 200);
    println!("{completed} completed walks over {schemas} schemas, all valid");
    assert!(completed >= 300, "only {completed} walks completed");
}

/// Where `text` (valid JSON) departs from the layout: whitespace outside strings only as one space
/// after each `,` and `:` (`Spaced`), never (`Compact`); `Pretty` allows any.
fn layout_error(text: &str, whitespace: Whitespace) -> Option<String> {
    let b = text.as_bytes();
    let (mut in_string, mut escaped) = (false, false);
    for (i, &c) in b.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        let space_expected =
            whitespace == Whitespace::Spaced && i > 0 && matches!(b[i - 1], b',' | b':');
        if space_expected && c != b' ' {
            return Some(format!("no space after byte {}", i - 1));
        }
        match c {
            b'"' => in_string = true,
            b' ' | b'\t' | b'\n' | b'\r' if matches!(whitespace, Whitespace::Pretty { .. }) => {}
            b' ' if space_expected => {}
            b' ' | b'\t' | b'\n' | b'\r' => return Some(format!("whitespace at byte {i}")),
            _ => {}
        }
    }
    None
}

/// The schema with `additionalProperties: false` added to every object schema that has none.
fn strictify(s: &Value) -> Value {
    match s {
        Value::Object(m) => {
            let mut out: Map<String, Value> =
                m.iter().map(|(k, v)| (k.clone(), strictify(v))).collect();
            if out.get("type") == Some(&json!("object"))
                && !out.contains_key("additionalProperties")
            {
                out.insert("additionalProperties".into(), json!(false));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strictify).collect()),
        other => other.clone(),
    }
}

/// `uniqueItems` over strings, objects and numbers, which no automaton can enforce: with a model's
/// vocabulary, at every step of random walks the mask allows a token exactly when the matcher
/// accepts it, duplicates are among the tokens refused, and every output validates. The item
/// domains are open (a repeated prefix can always go on), so no walk meets a dead end (see
/// `docs/limitations.md` for the finite case).
#[test]
fn unique_items_mask_equals_acceptance_with_a_model_vocabulary() {
    let vocab = vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf");
    let schema = json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[ab]{1,16}$"},
                     "uniqueItems": true, "maxItems": 4},
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"},
                       "uniqueItems": true, "maxItems": 3},
            "n": {"type": "array", "items": {"type": "number", "minimum": 0},
                  "uniqueItems": true, "maxItems": 4}
        },
        "required": ["tags", "points", "n"],
        "additionalProperties": false,
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}},
                            "required": ["x"], "additionalProperties": false}}
    });
    let (grammar, validator) = compiled(&schema, &vocab);
    // The tokens that can end an item; the others cannot complete a duplicate.
    let enders: Vec<u32> = (0..vocab.len() as u32)
        .filter(|&t| {
            !vocab.is_special(t)
                && vocab
                    .token_bytes(t)
                    .is_some_and(|b| b.iter().any(|c| b"\"],}".contains(c)))
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(3);
    let mut mask = vec![0u32; vocab.mask_words()];
    let (mut refused, mut outputs) = (0, 0);
    for _ in 0..12 {
        let mut m = Matcher::new(grammar.clone());
        let mut out = Vec::new();
        for _ in 0..120 {
            m.fill_mask(&mut mask);
            let allowed = |t: u32| mask[t as usize / 32] >> (t % 32) & 1 == 1;
            for &t in &enders {
                let accepted = m.fork().accept_token(t);
                assert_eq!(
                    allowed(t),
                    accepted.is_ok(),
                    "after {:?}: token {:?}",
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(vocab.token_bytes(t).unwrap())
                );
                refused += (accepted == Err(Rejection::DuplicateItem)) as usize;
            }
            let choices = walk::allowed_after(&mask, &vocab, &out);
            // Mostly short tokens, so arrays fill up with repeats on offer.
            let short: Vec<u32> = choices
                .iter()
                .copied()
                .filter(|&t| vocab.token_bytes(t).is_some_and(|b| b.len() <= 2))
                .collect();
            let pool = if short.is_empty() || rng.random_bool(0.1) {
                &choices
            } else {
                &short
            };
            let t = pool[rng.random_range(0..pool.len())];
            m.accept_token(t).unwrap();
            if vocab.is_eos(t) {
                break;
            }
            out.extend_from_slice(vocab.token_bytes(t).unwrap());
        }
        if m.is_finished() {
            let instance: Value = serde_json::from_slice(&out).unwrap();
            assert!(validator.is_valid(&instance), "{instance} is invalid");
            outputs += 1;
        }
    }
    println!("{outputs} outputs; {refused} duplicate completions refused");
    assert!(refused > 0, "no walk was offered a duplicate");
    assert!(outputs >= 6, "only {outputs} walks finished");
}

/// Unique items from a list of more strings than the grammar enumerates (7, sharing prefixes),
/// all of them required: a token that starts or extends an item only used strings fit is left
/// out, so random walks with a model's vocabulary never meet a dead end and always write a
/// permutation of the list.
#[test]
fn unique_listed_strings_never_dead_end() {
    let vocab = vocab::model_vocab("SmolLM2-135M-Instruct.Q4_1.gguf");
    let regions = [
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "eu-west-1",
        "eu-west-2",
        "ap-south-1",
        "ap-east-1",
    ];
    let schema = json!({"type": "array", "items": {"enum": regions}, "uniqueItems": true,
                        "minItems": 7, "maxItems": 7});
    let (grammar, validator) = compiled(&schema, &vocab);
    let mut rng = SmallRng::seed_from_u64(11);
    let mut mask = vec![0u32; vocab.mask_words()];
    for _ in 0..12 {
        let mut m = Matcher::new(grammar.clone());
        let mut out = Vec::new();
        while !m.is_finished() {
            m.fill_mask(&mut mask);
            let allowed = walk::allowed_after(&mask, &vocab, &out);
            for &t in &allowed {
                assert!(
                    m.fork().accept_token(t).is_ok(),
                    "allowed token {t} refused"
                );
            }
            let t = allowed[rng.random_range(0..allowed.len())];
            m.accept_token(t).unwrap();
            if vocab.is_eos(t) {
                break;
            }
            out.extend_from_slice(vocab.token_bytes(t).unwrap());
        }
        let instance: Value = serde_json::from_slice(&out).unwrap();
        assert!(validator.is_valid(&instance), "{instance} is invalid");
    }
}

/// `schema` compiled with the default options for `vocab`, and its `jsonschema` validator.
fn compiled(
    schema: &Value,
    vocab: &Arc<quarry_grammar::Vocabulary>,
) -> (Arc<Grammar>, jsonschema::Validator) {
    let constraint = Constraint::JsonSchema {
        schema: schema.clone(),
        options: SchemaOptions::default(),
    };
    let grammar = Grammar::compile(&constraint, vocab.clone(), Limits::default()).unwrap();
    (
        Arc::new(grammar),
        jsonschema::validator_for(schema).unwrap(),
    )
}
