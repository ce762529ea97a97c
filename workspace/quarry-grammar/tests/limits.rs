//! Typed errors for bad and oversized constraints: never a hang, never out of memory.

use std::sync::Arc;

use quarry_grammar::{Constraint, Grammar, GrammarError, Limits, Matcher, Rejection, Vocabulary};

fn tiny_vocab() -> Arc<Vocabulary> {
    let toks: [&[u8]; 5] = [b"a", b"b", b"aa", b"ba", b"<eos>"];
    Arc::new(Vocabulary::new(
        toks.iter().enumerate().map(|(i, t)| (*t, i == 4)),
        &[4],
    ))
}

fn compile(re: &str, limits: Limits) -> Result<Grammar, GrammarError> {
    Grammar::compile(&Constraint::Regex(re.into()), tiny_vocab(), limits)
}

#[test]
fn exponential_dfa_compiles_lazily_and_stops_at_the_state_limit() {
    // 2^20 states in full; compiling builds none of them.
    let limits = Limits {
        max_states: 1000,
        ..Limits::default()
    };
    let g = compile("[ab]*a[ab]{20}", limits).unwrap();
    assert_eq!(g.state_count(), 1);
    assert_eq!(
        g.explore().unwrap_err(),
        GrammarError::LimitExceeded {
            limit: "max_states",
            value: 1000
        }
    );
    assert_eq!(g.state_count(), 1000);
    assert!(g.overflow_error().is_some());
}

#[test]
fn huge_repetitions_stay_symbolic() {
    // A Thompson NFA would hold 200,000 copies; here it is two repetition terms.
    let g = compile("a{100000}b{100000}", Limits::default()).unwrap();
    assert!(g.term_count() < 16, "{} terms", g.term_count());
    let g = Arc::new(compile("a{1000}b{1000}", Limits::default()).unwrap());
    let mut m = Matcher::new(g.clone());
    m.accept_bytes(&[b'a'; 1000]).unwrap();
    assert_eq!(m.accept_bytes(b"a"), Err(Rejection::Bytes { offset: 0 }));
    m.accept_bytes(&[b'b'; 1000]).unwrap();
    assert!(m.is_accepting() && m.is_finished());
    assert_eq!(g.state_count(), 2001);
    // Exploring all of a{2000000} is what the state limit is for.
    let g = compile("a{2000000}", Limits::default()).unwrap();
    assert_eq!(
        g.explore().unwrap_err(),
        GrammarError::LimitExceeded {
            limit: "max_states",
            value: 100_000
        }
    );
}

#[test]
fn state_limit_refuses_new_states_soundly() {
    let g = Arc::new(
        compile(
            "[ab]{0,40}",
            Limits {
                max_states: 10,
                ..Limits::default()
            },
        )
        .unwrap(),
    );
    let mut m = Matcher::new(g.clone());
    // Nine bytes reach the tenth state; the tenth byte would need an eleventh.
    m.accept_bytes(b"abababab").unwrap();
    m.accept_bytes(b"a").unwrap();
    assert_eq!(m.accept_bytes(b"b"), Err(Rejection::Bytes { offset: 0 }));
    assert!(
        m.is_accepting(),
        "what was reached is still in the language"
    );
    assert_eq!(
        g.overflow_error(),
        Some(GrammarError::LimitExceeded {
            limit: "max_states",
            value: 10
        })
    );
}

#[test]
fn regex_and_term_limits_are_errors() {
    let long = "a".repeat(100);
    let err = compile(
        &long,
        Limits {
            max_regex_bytes: 99,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::LimitExceeded {
            limit: "max_regex_bytes",
            value: 99
        }
    );
    let words: Vec<String> = (0..500).map(|i| format!("w{i}x")).collect();
    let err = compile(
        &words.join("|"),
        Limits {
            max_terms: 1000,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::LimitExceeded {
            limit: "max_terms",
            value: 1000
        }
    );
}

#[test]
fn ambiguous_star_compiles_small() {
    let g = compile("(a|aa)*b", Limits::default()).unwrap();
    assert!(g.explore().unwrap() <= 4, "{}", g.state_count());
}

#[test]
fn unsupported_syntax_is_an_invalid_regex_error() {
    for re in [
        "(?=a)b",
        r"(a)\1",
        "a(",
        r"\bword\b",
        r"(?-u:\b)x",
        "a^b",
        "a$b",
        "(?m)^a",
    ] {
        let err = compile(re, Limits::default()).unwrap_err();
        assert!(
            matches!(err, GrammarError::InvalidRegex { .. }),
            "{re}: {err}"
        );
    }
    let empty = Grammar::compile(&Constraint::Choice(vec![]), tiny_vocab(), Limits::default());
    assert_eq!(empty.unwrap_err(), GrammarError::EmptyChoice);
}

#[test]
fn choice_eos_special_and_rollback() {
    let g = Arc::new(
        Grammar::compile(
            &Constraint::Choice(vec!["ab".into(), "aab".into()]),
            tiny_vocab(),
            Limits::default(),
        )
        .unwrap(),
    );
    let mut m = Matcher::new(g);
    assert_eq!(m.accept_token(4), Err(Rejection::EosNotAllowed));
    assert_eq!(m.accept_token(1), Err(Rejection::Token { id: 1 }));
    m.accept_token(0).unwrap(); // "a": "b" or "ab" may follow, nothing forced
    assert_eq!(m.forced_bytes(), b"");
    m.accept_token(0).unwrap(); // "aa": "b" is forced
    assert_eq!(m.forced_bytes(), b"b");
    m.accept_bytes(b"b").unwrap();
    assert!(m.is_accepting() && m.is_finished());
    m.accept_token(4).unwrap();
    assert_eq!(m.accept_token(0), Err(Rejection::Terminated));
    assert_eq!(m.rollback(2), 2); // back to after "a"
    assert!(!m.is_accepting());
    let mut mask = [0u32; 1];
    m.fill_mask(&mut mask);
    assert_eq!(mask[0], 0b0011, "a or b after \"a\"");
}

#[test]
fn compile_time_is_bounded() {
    let err = compile(
        "[a-z]{0,300}",
        Limits {
            compile_time: std::time::Duration::ZERO,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::LimitExceeded {
            limit: "compile_time",
            value: 0
        }
    );
}

/// Nine levels of definitions, each with five properties referring to the next: inlined, the
/// regex grows as 5^9. `sibling` adds a keyword next to each `$ref` (from 2019-09 it applies, so
/// the reference cannot be shared).
fn fan_out(sibling: bool) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for level in 0..9 {
        let mut next = serde_json::json!({"$ref": format!("#/$defs/l{}", level + 1)});
        if sibling {
            next["minProperties"] = serde_json::json!(0);
        }
        let props: serde_json::Map<String, serde_json::Value> =
            (0..5).map(|i| (format!("p{i}"), next.clone())).collect();
        defs.insert(
            format!("l{level}"),
            serde_json::json!({"type": "object", "properties": props}),
        );
    }
    defs.insert("l9".into(), serde_json::json!({"type": "integer"}));
    serde_json::json!({"$defs": defs, "$ref": "#/$defs/l0"})
}

/// The exponential fan-out compiles: large references become rules shared by their uses (which
/// the grammar layer inlines as shared terms, since none recurses), and an output validates.
#[test]
fn exploding_references_are_shared_rules() {
    let schema = fan_out(false);
    let grammar = Grammar::compile(
        &Constraint::JsonSchema {
            schema: schema.clone(),
            options: Default::default(),
        },
        tiny_vocab(),
        Limits::default(),
    )
    .unwrap();
    let mut m = Matcher::new(std::sync::Arc::new(grammar));
    // Always one nested object deep, then an integer: `{"p0":{"p0":…1…}}`.
    let text = (0..9).fold("1".to_string(), |inner, _| format!("{{\"p0\":{inner}}}"));
    m.accept_bytes(text.as_bytes()).unwrap();
    assert!(m.is_accepting());
    let instance: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(jsonschema::validator_for(&schema)
        .unwrap()
        .is_valid(&instance));
}

/// Many uses of a definition too small to be shared on the second try (16 KiB of text) still
/// fit: a third try shares targets above 512 bytes. Shown with a lowered `max_regex_bytes`, so
/// the schema stays small: each of the 40 uses copies the definition, about 100 KiB of typed
/// regex built, and its text is more than twice the bound.
#[test]
fn many_uses_of_a_medium_definition_are_shared_on_a_later_try() {
    let words = serde_json::json!({"enum": ["alpha", "beta", "gamma"]});
    let item: serde_json::Map<String, serde_json::Value> =
        (0..30).map(|i| (format!("p{i}"), words.clone())).collect();
    let uses: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| (format!("q{i}"), serde_json::json!({"$ref": "#/$defs/d"})))
        .collect();
    let schema = serde_json::json!({
        "$defs": {"d": {"type": "object", "properties": item, "additionalProperties": false}},
        "type": "object", "properties": uses, "additionalProperties": false});
    let limits = Limits {
        max_regex_bytes: 128 << 10,
        ..Limits::default()
    };
    let inline = quarry_grammar::schema::schema_to_regex(&schema, &Default::default()).unwrap();
    assert!(
        inline.len() > 2 * limits.max_regex_bytes,
        "{}",
        inline.len()
    );
    let constraint = Constraint::JsonSchema {
        schema: schema.clone(),
        options: Default::default(),
    };
    let grammar = Arc::new(Grammar::compile(&constraint, tiny_vocab(), limits).unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (text, ok) in [
        (
            r#"{"q3":{"p5":"beta"},"q39":{"p0":"alpha","p29":"gamma"}}"#,
            true,
        ),
        (r#"{"q3":{"p5":"delta"}}"#, false),
        (r#"{"q40":{}}"#, false),
    ] {
        let mut m = Matcher::new(grammar.clone());
        let accepted = m.accept_bytes(text.as_bytes()).is_ok() && m.is_accepting();
        assert_eq!(accepted, ok, "{text}");
        let instance: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(validator.is_valid(&instance), ok, "{text}");
    }
}

/// The same fan-out where every reference has a keyword next to it (no sharing): a typed error,
/// quickly.
#[test]
fn exploding_schema_is_a_typed_error() {
    let err = Grammar::compile(
        &Constraint::JsonSchema {
            schema: fan_out(true),
            options: Default::default(),
        },
        tiny_vocab(),
        Limits::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            GrammarError::Schema(quarry_grammar::SchemaError::TooLarge { .. })
                | GrammarError::LimitExceeded {
                    limit: "compile_time",
                    ..
                }
        ),
        "{err}"
    );
}

/// Subschemas nested past `Limits::max_schema_nesting` are a typed error, not a stack overflow,
/// even when the caller's thread has a small stack (deep recursion moves to stack segments of its
/// own); the bound is the caller's `Limits`, not a constant of the translator.
#[test]
fn deep_nesting_is_a_typed_error_on_a_small_stack() {
    let nested = |depth: usize| {
        let mut schema = serde_json::json!({"type": "integer"});
        for _ in 0..depth {
            schema = serde_json::json!({"type": "object", "properties": {"a": schema}});
        }
        Constraint::JsonSchema {
            schema,
            options: Default::default(),
        }
    };
    let shallow = Limits {
        max_schema_nesting: 12,
        ..Limits::default()
    };
    assert!(Grammar::compile(&nested(20), tiny_vocab(), Limits::default()).is_ok());
    match Grammar::compile(&nested(20), tiny_vocab(), shallow) {
        Err(GrammarError::Schema(quarry_grammar::SchemaError::TooDeep { limit, .. })) => {
            assert_eq!(limit, 12)
        }
        other => panic!("expected TooDeep at 12 levels, got {other:?}"),
    }
    let mut schema = serde_json::json!({"type": "integer"});
    for _ in 0..Limits::default().max_schema_nesting + 10 {
        schema = serde_json::json!({"type": "object", "properties": {"a": schema}});
    }
    let err = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            Grammar::compile(
                &Constraint::JsonSchema {
                    schema,
                    options: Default::default(),
                },
                tiny_vocab(),
                Limits::default(),
            )
            .unwrap_err()
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(
        matches!(
            err,
            GrammarError::Schema(quarry_grammar::SchemaError::TooDeep { .. })
        ),
        "{err}"
    );
}

/// A part shared by many uses counts once against `max_regex_bytes` when compiling: counting 24
/// optional properties up to 20 writes each member under every count reached so far, so the
/// text doubles with each property (far past 4 MiB), while the tree shares those parts and
/// holds a few hundred nodes. It compiles and counts exactly; printing its text is refused.
#[test]
fn a_schema_whose_text_is_exponential_compiles_from_its_shared_tree() {
    let props: serde_json::Map<String, serde_json::Value> = (0..24)
        .map(|i| (format!("p{i}"), serde_json::json!({"type": "integer"})))
        .collect();
    let schema = serde_json::json!({
        "type": "object", "properties": props, "additionalProperties": false,
        "maxProperties": 20});
    match quarry_grammar::schema::schema_to_regex(&schema, &Default::default()) {
        Err(quarry_grammar::SchemaError::TooLarge { .. }) => {}
        other => panic!("expected the text to be too large, got {other:?}"),
    }
    let constraint = Constraint::JsonSchema {
        schema: schema.clone(),
        options: Default::default(),
    };
    let grammar = Arc::new(Grammar::compile(&constraint, tiny_vocab(), Limits::default()).unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    for n in [0, 1, 7, 20, 21, 24] {
        let members: Vec<String> = (0..n).map(|i| format!("\"p{i}\":{i}")).collect();
        let text = format!("{{{}}}", members.join(","));
        let mut m = Matcher::new(grammar.clone());
        let accepted = m.accept_bytes(text.as_bytes()).is_ok() && m.is_accepting();
        let instance: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(accepted, validator.is_valid(&instance), "{text}");
        assert_eq!(accepted, n <= 20, "{text}");
    }
}
