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
fn exponential_dfa_is_a_limit_error() {
    let limits = Limits {
        dfa_bytes: 1 << 20,
        determinize_bytes: 1 << 20,
        ..Limits::default()
    };
    let err = compile("[ab]*a[ab]{20}", limits).unwrap_err();
    assert!(
        matches!(
            err,
            GrammarError::LimitExceeded {
                limit: "dfa_bytes" | "determinize_bytes",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn huge_repetition_is_a_limit_error() {
    // The NFA is small enough here (a few MiB); the DFA's state count is what stops it.
    let err = compile("a{100000}b{100000}", Limits::default()).unwrap_err();
    assert!(matches!(err, GrammarError::LimitExceeded { .. }), "{err}");
    // Here the NFA itself would exceed 16 MiB, and is stopped before determinization starts.
    for re in ["a{2000000}", r"(\w{100}){100}"] {
        assert_eq!(
            compile(re, Limits::default()).unwrap_err(),
            GrammarError::LimitExceeded {
                limit: "nfa_bytes",
                value: 16 << 20
            },
            "{re}"
        );
    }
}

#[test]
fn state_limit_is_enforced() {
    let err = compile(
        "[ab]{0,40}",
        Limits {
            max_states: 10,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::LimitExceeded {
            limit: "max_states",
            value: 10
        }
    );
}

#[test]
fn ambiguous_star_compiles_small() {
    let g = compile("(a|aa)*b", Limits::default()).unwrap();
    assert!(g.state_count() <= 4, "{}", g.state_count());
}

#[test]
fn unsupported_syntax_is_an_invalid_regex_error() {
    for re in ["(?=a)b", r"(a)\1", "a(", r"\bword\b"] {
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

/// A schema whose regex grows exponentially with its `$ref` fan-out: a typed error, quickly.
#[test]
fn exploding_schema_is_a_typed_error() {
    let mut defs = serde_json::Map::new();
    for level in 0..9 {
        let next = serde_json::json!({"$ref": format!("#/$defs/l{}", level + 1)});
        let props: serde_json::Map<String, serde_json::Value> =
            (0..5).map(|i| (format!("p{i}"), next.clone())).collect();
        defs.insert(
            format!("l{level}"),
            serde_json::json!({"type": "object", "properties": props}),
        );
    }
    defs.insert("l9".into(), serde_json::json!({"type": "integer"}));
    let schema = serde_json::json!({"$defs": defs, "$ref": "#/$defs/l0"});
    let err = Grammar::compile(
        &Constraint::JsonSchema {
            schema,
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
