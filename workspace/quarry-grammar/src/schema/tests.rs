use serde_json::json;

use super::object::key_not_in;
use super::scalar::int_range;
use super::*;

fn full(re: &str) -> regex_automata::dfa::regex::Regex {
    regex_automata::dfa::regex::Regex::builder()
        .syntax(super::schema_syntax())
        .build(&format!("^(?:{re})$"))
        .unwrap()
}

#[test]
fn integer_ranges_are_exact() {
    for (lo, hi) in [
        (Some(0), Some(0)),
        (Some(-15), Some(27)),
        (Some(7), Some(1234)),
        (Some(-1000), Some(-3)),
        (Some(18), None),
        (None, Some(-2)),
        (Some(99), Some(100)),
    ] {
        let re = full(&int_range(lo, hi));
        for v in -1500i64..1500 {
            let want = lo.is_none_or(|l| v >= l) && hi.is_none_or(|h| v <= h);
            assert_eq!(
                re.is_match(v.to_string().as_bytes()),
                want,
                "{lo:?}..{hi:?}: {v}"
            );
        }
        assert!(!re.is_match(b"-0") && !re.is_match(b"007"));
    }
}

fn accepts(schema: Value, text: &str) -> bool {
    full(&schema_to_regex(&schema, &SchemaOptions::default()).unwrap()).is_match(text.as_bytes())
}

#[test]
fn all_of_merges_exactly_or_refuses() {
    let s = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"properties": {"a": {"maximum": 9}, "b": {"type": "string"}}, "required": ["b"]}
    ]});
    assert!(accepts(s.clone(), r#"{"a":3,"b":"x"}"#));
    assert!(!accepts(s.clone(), r#"{"a":10,"b":"x"}"#));
    assert!(!accepts(s.clone(), r#"{"a":3}"#));
    assert!(!accepts(s, r#"{"a":-1,"b":"x"}"#));
    // Each branch's additionalProperties is read against its own properties: not mergeable.
    let s = json!({"allOf": [
        {"properties": {"a": {}}, "additionalProperties": false},
        {"properties": {"b": {}}, "additionalProperties": false}
    ]});
    let err = schema_to_regex(&s, &SchemaOptions::default()).unwrap_err();
    assert!(
        matches!(err, SchemaError::Unsupported { ref keyword, .. } if keyword == "additionalProperties"),
        "{err}"
    );
    // Contradictory types leave nothing.
    assert!(!accepts(
        json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
        r#""x""#
    ));
    assert!(accepts(
        json!({"allOf": [{"type": "number"}, {"type": "integer"}]}),
        "7"
    ));
}

#[test]
fn dependent_required_and_property_counts() {
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"b": ["a"]}, "additionalProperties": false});
    for (text, want) in [
        ("{}", true),
        (r#"{"a":1}"#, true),
        (r#"{"a":1,"b":2}"#, true),
        (r#"{"b":2}"#, false),
    ] {
        assert_eq!(accepts(s.clone(), text), want, "{text}");
    }
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2, "maxProperties": 3});
    for (text, want) in [
        (r#"{"a":1}"#, false),
        (r#"{"a":1,"x":null}"#, true),
        (r#"{"x":1,"y":2,"z":3}"#, true),
        (r#"{"a":1,"x":1,"y":2,"z":3}"#, false),
        (r#"{"a":1,"a":2}"#, false),
    ] {
        assert_eq!(accepts(s.clone(), text), want, "{text}");
    }
}

#[test]
fn unique_items_over_a_finite_domain() {
    let s = json!({"type": "array", "items": {"enum": ["a", "b", 1]}, "uniqueItems": true, "minItems": 1});
    for (text, want) in [
        ("[]", false),
        (r#"["a"]"#, true),
        (r#"["b","a",1]"#, true),
        (r#"[1.0,"a"]"#, true),
        (r#"["a","a"]"#, false),
        (r#"[1,1.0]"#, false),
        (r#"["a","b",1,"a"]"#, false),
    ] {
        assert_eq!(accepts(s.clone(), text), want, "{text}");
    }
}

#[test]
fn keys_outside_a_set() {
    let re = full(&key_not_in(&["a", "ab", "b\"c"]));
    for (k, want) in [
        ("\"a\"", false),
        ("\"ab\"", false),
        ("\"b\\\"c\"", false),
        ("\"\"", true),
        ("\"abc\"", true),
        ("\"b\"", true),
        ("\"x\\n\"", true),
        ("\"ac\"", true),
    ] {
        assert_eq!(re.is_match(k.as_bytes()), want, "{k}");
    }
}
