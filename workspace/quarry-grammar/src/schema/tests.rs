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

/// Checks `schema` on string instances: each `(text, accepted)` pair.
fn strings(schema: &Value, cases: &[(&str, bool)]) {
    for (text, ok) in cases {
        assert_eq!(
            accepts(schema.clone(), &format!("\"{text}\"")),
            *ok,
            "{schema} on {text:?}"
        );
    }
}

/// Whether the schema's regex matches `text`: read by regex-automata, or where it holds
/// intersection terms, by the grammar's lazy DFA over them (exact at these sizes).
fn accepts(schema: Value, text: &str) -> bool {
    narrowing(&schema).is_match(text.as_bytes())
}

/// The schema's language as a test of whole texts: its regex read by regex-automata (through
/// its text), or where it holds intersection terms, by the grammar's lazy DFA over them (exact
/// at these sizes).
fn narrowing(schema: &Value) -> super::object::Narrowing {
    let limits = crate::Limits::default();
    let deadline = std::time::Instant::now() + limits.compile_time;
    let (re, rules) = schema_to_rules_by(
        schema,
        &SchemaOptions::default(),
        &limits,
        deadline,
        Measure::Held,
    )
    .unwrap_or_else(|e| panic!("{schema}: {e}"));
    assert!(rules.is_empty(), "{schema}: recursive");
    super::object::Narrowing::new(&re, "test", "#").unwrap()
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
    // Each branch's additionalProperties is read against its own properties: a name only the
    // other branch declares must satisfy it too (here: neither a nor b may appear).
    let s = json!({"allOf": [
        {"properties": {"a": {}}, "additionalProperties": false},
        {"properties": {"b": {}}, "additionalProperties": false}
    ]});
    assert!(accepts(s.clone(), "{}"));
    assert!(!accepts(s.clone(), r#"{"a":1}"#));
    assert!(!accepts(s, r#"{"b":1}"#));
    let s = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        {"properties": {"b": {"maxLength": 2}}}
    ]});
    assert!(accepts(s.clone(), r#"{"a":1,"b":"xy"}"#));
    assert!(!accepts(s.clone(), r#"{"b":"xyz"}"#)); // b's own bound
    assert!(!accepts(s, r#"{"b":3}"#)); // additionalProperties of the first branch

    // Two tuples: position i takes both sides' schemas for it, the rest both rests.
    let s = json!({"allOf": [
        {"prefixItems": [{"type": "integer"}], "items": false},
        {"prefixItems": [{}, {}]}
    ]});
    assert!(accepts(s.clone(), "[]") && accepts(s.clone(), "[1]"));
    assert!(!accepts(s.clone(), "[1,2]") && !accepts(s, r#"["x"]"#));
    let s = json!({"allOf": [
        {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
        {"prefixItems": [{}, {"maxLength": 1}], "items": {"minLength": 1}}
    ]});
    assert!(accepts(s.clone(), r#"[1,"a","bc"]"#));
    assert!(!accepts(s.clone(), r#"[1,"ab"]"#) && !accepts(s, r#"[1,"a",""]"#));
    // Draft 7: an array `items` with `additionalItems`, against a schema-valued `items`.
    let s = json!({"$schema": "http://json-schema.org/draft-07/schema#", "allOf": [
        {"items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
        {"items": {"type": ["integer", "string"]}, "maxItems": 2}
    ]});
    assert!(accepts(s.clone(), r#"[1,"a"]"#) && !accepts(s, r#"[1,2]"#));

    // unevaluated* of a branch sees only that branch: a name the other branch declares is
    // unevaluated there.
    let s = json!({"allOf": [
        {"properties": {"foo": {}}, "unevaluatedProperties": true},
        {"unevaluatedProperties": false}
    ]});
    assert!(accepts(s.clone(), "{}") && !accepts(s, r#"{"foo":1}"#));
    let s = json!({"allOf": [{"prefixItems": [true]}, {"unevaluatedItems": false}]});
    assert!(accepts(s.clone(), "[]") && !accepts(s, "[1]"));

    // Coupled pairs that cannot be merged exactly are refused: here `unevaluatedItems` reads
    // its own tuple and the items `contains` matched.
    let s = json!({"allOf": [
        {"prefixItems": [{"type": "integer"}], "contains": {"type": "string"},
         "unevaluatedItems": false},
        {"prefixItems": [{}, {}]}
    ]});
    assert!(schema_to_regex(&s, &SchemaOptions::default()).is_err());
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
    let re = full(&key_not_in(&["a", "ab", "b\"c"]).to_string());
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

#[test]
fn recursion_is_refused_or_unrolled() {
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 3},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
        }, "required": ["name"], "additionalProperties": false}},
        "$ref": "#/$defs/node"
    });
    let err = schema_to_regex(&tree, &SchemaOptions::default()).unwrap_err();
    assert!(err.to_string().contains("max_recursion_depth"), "{err}");
    let options = SchemaOptions {
        max_recursion_depth: Some(2),
        ..SchemaOptions::default()
    };
    let re = full(&schema_to_regex(&tree, &options).unwrap());
    let nest = |depth: usize| {
        let mut v = json!({"name": "x"});
        for _ in 0..depth {
            v = json!({"name": "p", "children": [v]});
        }
        v.to_string()
    };
    for depth in 0..=2 {
        assert!(re.is_match(nest(depth).as_bytes()), "depth {depth}");
    }
    // One level past the limit: the innermost reference admits nothing.
    assert!(!re.is_match(nest(3).as_bytes()));
    // A sibling keyword next to a recursive $ref (2019-09 on) terminates too.
    let s = json!({"$defs": {"l": {"type": "array", "items": {"$ref": "#/$defs/l", "maxItems": 1}}},
                   "$ref": "#/$defs/l"});
    assert!(schema_to_regex(&s, &SchemaOptions::default()).is_err());
    assert!(schema_to_regex(&s, &options).is_ok());
}

#[test]
fn patterns_follow_ecma_and_combine_with_lengths() {
    // ECMA-262 \d is ASCII only, `.` stops at \r; regex-syntax's Unicode ones are wider.
    let s = json!({"type": "string", "pattern": "^\\d+$"});
    assert!(accepts(s.clone(), r#""42""#));
    assert!(!accepts(s, "\"\u{0663}\""));
    assert!(!accepts(
        json!({"type": "string", "pattern": "^.$"}),
        r#""\r""#
    ));
    // One variable part: the length is exact.
    let arn = json!({"type": "string", "pattern": "^arn:[a-z]+$", "minLength": 6, "maxLength": 8});
    strings(
        &arn,
        &[
            ("arn:a", false),
            ("arn:ab", true),
            ("arn:abcd", true),
            ("arn:abcde", false),
        ],
    );
    // A search with a length is matched in full (sound, narrower: "abc" would be valid).
    let s = json!({"type": "string", "pattern": "b+", "maxLength": 3});
    strings(
        &s,
        &[("b", true), ("bbb", true), ("abc", false), ("bbbb", false)],
    );
    // Two variable parts share the length budget; a pattern with a format: both must hold.
    let s = json!({"type": "string", "pattern": "^a*-b*$", "maxLength": 5});
    strings(
        &s,
        &[
            ("-", true),
            ("aa-bb", true),
            ("aaaa-", false),
            ("aa-bbb", false),
        ],
    );
    let s = json!({"type": "string", "format": "date", "pattern": "^2026-"});
    assert!(accepts(s.clone(), r#""2026-11-22""#));
    assert!(!accepts(s.clone(), r#""2025-11-22""#));
    assert!(!accepts(s, r#""2026-13-01""#));
}

#[test]
fn property_names_and_pattern_properties() {
    let s = json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "string"}, "^n_": {"type": "integer"}},
        "additionalProperties": false,
        "propertyNames": {"maxLength": 4}
    });
    assert!(accepts(s.clone(), r#"{"id":1,"x-a":"v","n_b":2}"#));
    assert!(!accepts(s.clone(), r#"{"x-a":3}"#)); // wrong value type for the pattern
    assert!(!accepts(s.clone(), r#"{"other":1}"#)); // no pattern: additionalProperties false
    assert!(!accepts(s, r#"{"x-abc":"v"}"#)); // name longer than 4
}

#[test]
fn optional_members_in_order_any_subset() {
    let names = ["a", "b", "c", "d", "e"];
    let props: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| (n.to_string(), json!({"type": "integer"})))
        .collect();
    for required in [vec![], vec!["c"]] {
        let s = json!({"type": "object", "properties": props, "required": required,
                       "additionalProperties": false});
        let re = full(&schema_to_regex(&s, &SchemaOptions::default()).unwrap());
        for subset in 0u32..32 {
            let members: Vec<String> = (0..5)
                .filter(|i| subset >> i & 1 == 1)
                .map(|i| format!("\"{}\":{i}", names[i]))
                .collect();
            let text = format!("{{{}}}", members.join(","));
            let want = required.is_empty() || subset >> 2 & 1 == 1;
            assert_eq!(
                re.is_match(text.as_bytes()),
                want,
                "{text} required {required:?}"
            );
        }
        // Out of order is not canonical.
        assert!(!re.is_match(br#"{"c":1,"a":0}"#));
    }
    // Many optional properties: the regex grows as n log n, not n^2.
    let many: serde_json::Map<String, Value> = (0..256)
        .map(|i| (format!("p{i}"), json!({"type": "boolean"})))
        .collect();
    let re = schema_to_regex(
        &json!({"properties": many, "additionalProperties": false}),
        &SchemaOptions::default(),
    )
    .unwrap();
    let member = r#""p100":(?:true|false)"#.len();
    assert!(re.len() < 256 * member * 12, "{} bytes", re.len());
}

#[test]
fn spaced_layout_writes_one_space_after_each_separator() {
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "array", "items": {"type": "boolean"}},
            "c": {"enum": [{"x": [1, 2]}, "y:z, w"]},
            "d": {"type": "object"}
        },
        "required": ["a", "b"]
    });
    let opts = |whitespace| SchemaOptions {
        whitespace,
        ..SchemaOptions::default()
    };
    let spaced = full(&schema_to_regex(&schema, &opts(Whitespace::Spaced)).unwrap());
    let compact = full(&schema_to_regex(&schema, &opts(Whitespace::Compact)).unwrap());
    let pretty = full(&schema_to_regex(&schema, &opts(Whitespace::Pretty { max_run: 2 })).unwrap());
    for v in [
        json!({"a": 1, "b": []}),
        json!({"a": -3, "b": [true, false], "c": {"x": [1, 2]}}),
        json!({"a": 0, "b": [false], "c": "y:z, w", "d": {"k": [null, {"m": "n"}]}}),
    ] {
        let s = Whitespace::Spaced.render(&v);
        let c = Whitespace::Compact.render(&v);
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
        assert!(spaced.is_match(s.as_bytes()), "spaced {s}");
        assert!(
            !spaced.is_match(c.as_bytes()),
            "spaced accepted compact {c}"
        );
        assert!(compact.is_match(c.as_bytes()), "compact {c}");
        assert!(
            !compact.is_match(s.as_bytes()),
            "compact accepted spaced {s}"
        );
        assert!(pretty.is_match(s.as_bytes()) && pretty.is_match(c.as_bytes()));
    }
    // Inside strings nothing changes; a space before a separator is not the layout.
    assert_eq!(
        Whitespace::Spaced.render(&json!({"k": "a,b: c", "l": [1]})),
        r#"{"k": "a,b: c", "l": [1]}"#
    );
    assert!(!spaced.is_match(br#"{"a" : 1, "b": []}"#));
    assert!(!spaced.is_match(br#"{"a": 1,  "b": []}"#));
    assert!(!spaced.is_match(br#"{ "a": 1, "b": [] }"#));
}

#[test]
fn whitespace_names_round_trip() {
    for w in [
        Whitespace::Compact,
        Whitespace::Spaced,
        Whitespace::Pretty { max_run: 1 },
        Whitespace::Pretty { max_run: 255 },
    ] {
        assert_eq!(w.to_string().parse::<Whitespace>(), Ok(w));
    }
    assert_eq!("pretty".parse(), Ok(Whitespace::Pretty { max_run: 8 }));
    for bad in ["", "Spaced", "pretty:0", "pretty:256", "pretty:x", "tabs"] {
        let e = bad.parse::<Whitespace>().unwrap_err();
        assert_eq!(e.given, bad);
        assert!(
            e.to_string().contains("expected compact, spaced"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn json_pointers_and_the_ascii_forms_of_iri_and_idn_email() {
    let pointer = |f: &str| json!({"type": "string", "format": f});
    strings(
        &pointer("json-pointer"),
        &[
            ("", true),
            ("/a~0b/c~1d", true),
            ("/", true),
            ("//x", true),
            ("/a~2", false),
            ("a/b", false),
            ("/a~", false),
        ],
    );
    strings(
        &pointer("relative-json-pointer"),
        &[
            ("0", true),
            ("1/a~1", true),
            ("12#", true),
            ("01", false),
            ("/a", false),
            ("1#/a", false),
        ],
    );
    // An IRI's ASCII form is a URI; an internationalized address's, an address.
    for (f, good, bad) in [
        ("iri", "https://example.org/a?b#c", "no scheme"),
        ("iri-reference", "../a/b", "a b"),
        ("idn-email", "ada@example.org", "ada@"),
    ] {
        strings(&pointer(f), &[(good, true), (bad, false)]);
    }
}

/// Every string of at most `max` characters from `alphabet`.
fn words(alphabet: &str, max: usize) -> Vec<String> {
    let chars: Vec<char> = alphabet.chars().collect();
    crate::testing::words(&chars, max)
        .into_iter()
        .map(String::from_iter)
        .collect()
}

/// Look-aheads at the top level of a pattern and anchors on each branch of an alternation: every
/// short string over each pattern's alphabet is accepted exactly when the `jsonschema` crate (an
/// independent ECMA-262 implementation) finds it valid.
#[test]
fn look_aheads_and_anchored_branches_search_as_ecma_does() {
    let cases = [
        ("^(?!aws:)[a-z:]+$", "aws:x"),
        ("^(?!d-)([0-9a-d]+)([-]*[0-9a-d])*$", "d-1"),
        (
            "^(?!rc-)(?![-])(?![a-z-]*[-]$)(?![a-z-]*[-]{2})[a-z-]+$",
            "rc-",
        ),
        ("^(?![ \t]*$)[^\n]+", " a\t"),
        ("^(?!aws:[a-z]*)", "aws:"),
        ("x(?=ab)", "xab"),
        ("^a(?=b)[a-c]{2}", "abc"),
        ("^a+$|^$", "ab"),
        ("([$]L|[$]D|^[1-9][0-9]*$)", "$LD10"),
        ("^(^a:(b|c)$)|(^d/(a+)$)$", "a:bcd/"),
        ("(?!^[0-9]+$)([a-c0-9 ]+)", "a1 x"),
        ("(?=^a)[ab]", "abc"),
    ];
    for (pattern, alphabet) in cases {
        let schema = json!({"type": "string", "pattern": pattern});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let ours = narrowing(&schema);
        let words = words(alphabet, 5);
        for w in &words {
            let text = serde_json::to_string(w).unwrap();
            assert_eq!(
                ours.is_match(text.as_bytes()),
                validator.is_valid(&json!(w)),
                "{pattern:?} on {w:?}"
            );
        }
    }
    // What stays refused, with a typed error.
    for pattern in ["(a(?!b))c", "(?<=a)b", "a(?!b)|c", "x(?!^[0-9]+$)"] {
        let schema = json!({"type": "string", "pattern": pattern});
        let e = schema_to_regex(&schema, &SchemaOptions::default()).unwrap_err();
        assert!(
            matches!(e, SchemaError::Unsupported { .. }),
            "{pattern}: {e}"
        );
    }
}

/// Overlapping `oneOf` branches that share keywords (the schema's own, merged into each branch):
/// only what a branch asks beyond the other is negated, so `additionalProperties` and nested
/// `oneOf`s next to them need no negation; branches that each require a name the others forbid
/// are disjoint. Every small object is accepted exactly when the `jsonschema` crate finds it
/// valid.
#[test]
fn one_of_negates_only_what_branches_do_not_share() {
    let schemas = [
        json!({"type": "object",
               "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
               "additionalProperties": false,
               "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}),
        json!({"properties": {"t": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                              "a": {"type": "integer"}},
               "oneOf": [{"required": ["a"]}, {"required": ["t"]}, {"required": ["a", "t"]}]}),
        json!({"type": "object", "additionalProperties": false,
               "properties": {"a": {"type": "integer", "maximum": 3}, "b": {"type": "string"}},
               "oneOf": [{"required": ["a"], "properties": {"a": {"minimum": 1}}},
                         {"required": ["a"], "properties": {"a": {"minimum": 2}}}]}),
        // Disjoint: each branch requires a name the others forbid.
        json!({"oneOf": [
            {"type": "object", "additionalProperties": false,
             "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "additionalProperties": false,
             "properties": {"b": {"type": "string"}, "t": {}}, "required": ["b"]},
            {"type": "object", "additionalProperties": false,
             "properties": {"t": {}}, "required": ["t"]}]}),
    ];
    let values = [json!(1), json!(2), json!(5), json!("x")];
    for schema in schemas {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let ours = narrowing(&schema);
        let mut checked = 0;
        for keys in 0..8u32 {
            for pick in 0..values.len().pow(3) {
                let mut m = Map::new();
                for (k, name) in ["a", "b", "t"].iter().enumerate() {
                    if keys >> k & 1 == 1 {
                        let v = values[pick / values.len().pow(k as u32) % values.len()].clone();
                        m.insert(name.to_string(), v);
                    }
                }
                let instance = Value::Object(m);
                let text = canonicalize(&instance, &schema, Whitespace::Compact);
                assert_eq!(
                    ours.is_match(text.as_bytes()),
                    validator.is_valid(&instance),
                    "{schema} on {text}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 8 * 64);
    }
    // Branches whose differences include `properties` next to `additionalProperties` need that
    // negation: see `additional_properties_negated_against_closed_names`.
}

/// Negated `oneOf` (none, or two at once), and `allOf` branches that set `if`, `items` or
/// `multipleOf` differently: every small instance is accepted exactly when the `jsonschema`
/// crate finds it valid.
#[test]
fn negated_one_of_and_merged_conditionals_items_multiples() {
    let schemas = [
        json!({"not": {"oneOf": [{"type": "integer", "minimum": 2}, {"type": "integer", "maximum": 5}]}}),
        json!({"type": "integer", "allOf": [
            {"if": {"minimum": 5}, "then": {"multipleOf": 2}},
            {"if": {"maximum": 7}, "then": {"multipleOf": 5}, "else": {"maximum": 12}}]}),
        json!({"type": "integer", "allOf": [{"multipleOf": 4}, {"multipleOf": 10}]}),
        json!({"type": "array", "maxItems": 2,
               "allOf": [{"items": {"type": "integer"}}, {"items": {"minimum": 2}}]}),
    ];
    let mut instances: Vec<Value> = (-3..45).map(|i| json!(i)).collect();
    instances.extend([json!("a"), json!(null), json!(2.5), json!([]), json!({})]);
    for a in [json!(1), json!(3), json!("x")] {
        instances.push(json!([a]));
        for b in [json!(2), json!(7)] {
            instances.push(json!([a, b]));
        }
    }
    for schema in schemas {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let ours = narrowing(&schema);
        for instance in &instances {
            let text = serde_json::to_string(instance).unwrap();
            assert_eq!(
                ours.is_match(text.as_bytes()),
                validator.is_valid(instance),
                "{schema} on {text}"
            );
        }
    }
}

/// `idn-hostname`, `regex`, `uri-template`, `uri` and `uri-reference` as sound subsets: every short string over an
/// alphabet of interesting characters that quarry accepts is valid for the `jsonschema` crate
/// (formats asserted), and typical values are accepted.
#[test]
fn idn_hostname_regex_and_uri_template_are_sound_subsets() {
    for (format, alphabet, max, typical) in [
        ("idn-hostname", "a-.9x", 5, "example-1.org"),
        ("regex", "a(-[ *\\", 5, "a b_c-d"),
        ("uri-template", "a{/'%1", 5, "/search?q=x&page=2"),
        // `h://:h` has an authority whose port is not a number.
        ("uri", "h:/1", 6, "https://user@example.org:8080/a//b?c#d"),
        ("uri-reference", "h:/1", 6, "../a/b?c#d"),
    ] {
        let schema = json!({"type": "string", "format": format});
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .unwrap();
        let ours = narrowing(&schema);
        let words = words(alphabet, max);
        let mut accepted = 0;
        for w in words.iter().map(String::as_str).chain([typical]) {
            let text = serde_json::to_string(w).unwrap();
            if ours.is_match(text.as_bytes()) {
                assert!(
                    validator.is_valid(&json!(w)),
                    "{format}: {w:?} is not valid"
                );
                accepted += 1;
            }
        }
        assert!(
            ours.is_match(serde_json::to_string(typical).unwrap().as_bytes()),
            "{format}: {typical}"
        );
        assert!(accepted > 10, "{format}: only {accepted} accepted");
    }
}

/// Checks that `schema`'s language holds exactly the canonical texts of the `instances` the
/// `jsonschema` crate finds valid; returns how many are valid.
fn agrees_with_jsonschema(schema: &Value, instances: &[Value]) -> usize {
    let validator = jsonschema::validator_for(schema).unwrap();
    let ours = narrowing(schema);
    let mut valid = 0;
    for instance in instances {
        let text = canonicalize(instance, schema, Whitespace::Compact);
        let ok = validator.is_valid(instance);
        assert_eq!(ours.is_match(text.as_bytes()), ok, "{schema} on {text}");
        valid += ok as usize;
    }
    valid
}

/// `unevaluated*` next to in-place applicators applies at its own instance location only: not to
/// a property's value, an item or a property name below it, whatever merges and references lead
/// there; and a user's keyword that merely looks like quarry's is an annotation like any other
/// unknown keyword. Every instance is accepted exactly when the `jsonschema` crate finds it
/// valid.
#[test]
fn unevaluated_applies_at_its_own_location_only() {
    let schemas = [
        json!({"unevaluatedProperties": false,
               "allOf": [{"properties": {"a": {"type": "object"}}}]}),
        json!({"unevaluatedProperties": {"type": "integer"},
               "$defs": {"d": {"properties": {"a": {"type": ["object", "integer"]}}}},
               "anyOf": [{"$ref": "#/$defs/d"}, {"properties": {"b": {"type": "array"}}}]}),
        json!({"unevaluatedProperties": false, "propertyNames": {"maxLength": 1},
               "oneOf": [{"properties": {"a": {}}, "required": ["a"]},
                         {"properties": {"b": {}}, "required": ["b"]}]}),
        json!({"unevaluatedItems": false,
               "allOf": [{"prefixItems": [{"type": "array"}, {"type": "object"}]}]}),
        json!({"unevaluatedItems": {"type": "integer"},
               "if": {"minItems": 2},
               "then": {"prefixItems": [{"type": "array"}], "maxItems": 3}}),
        json!({"$quarry:unevaluatedProperties": false,
               "allOf": [{"properties": {"a": {}}}]}),
    ];
    let instances = [
        json!({}),
        json!({"a": {}}),
        json!({"a": {"x": 1}}),
        json!({"a": 1}),
        json!({"b": [1]}),
        json!({"a": {"x": 1}, "c": 3}),
        json!({"b": [{"y": 2}], "c": 3}),
        json!({"a": 1, "c": 2}),
        json!({"a": 1, "c": "z"}),
        json!({"a": {}, "bb": 1}),
        json!({"b": 1}),
        json!([]),
        json!([[1, 2]]),
        json!([[1], {"x": [3]}]),
        json!([[1], {}, 5]),
        json!([[1], 5, 6]),
        json!([[1], 5, 6, 7]),
        json!([1, [2]]),
    ];
    for schema in schemas {
        agrees_with_jsonschema(&schema, &instances);
    }
}

/// `additionalProperties` negated relative to the schema the negation is intersected with: where
/// that schema closes the names an object can have, "some other member" is one of its names the
/// negated schema does not declare (the `oneOf`s of closed objects in CI configuration schemas),
/// at the top and at nested properties and items; where it has no objects, nothing. Every small
/// instance is accepted exactly when the `jsonschema` crate finds it valid.
#[test]
fn additional_properties_negated_against_closed_names() {
    let closed = |props: Value| json!({"type": "object", "additionalProperties": false, "properties": props});
    let schemas = [
        // Overlap on {} only: exactly one of the two names.
        json!({"oneOf": [closed(json!({"a": {"type": "integer"}})), closed(json!({"b": {}}))]}),
        // Overlap on the shared optional `c`.
        json!({"oneOf": [closed(json!({"a": {}, "c": {"type": "integer"}})),
                         closed(json!({"b": {}, "c": {}}))]}),
        // Nested: the overlap is inside property `a`.
        json!({"oneOf": [closed(json!({"a": closed(json!({"b": {}}))})),
                         closed(json!({"a": closed(json!({"c": {}}))}))]}),
        // Through items, with a non-object branch.
        json!({"type": "array", "maxItems": 2, "items": {"oneOf": [
            {"type": "null"}, closed(json!({"b": {"type": "integer"}})), closed(json!({"c": {}}))]}}),
        // patternProperties negated: a name of the other side matching a pattern.
        json!({"type": "object", "additionalProperties": false,
               "properties": {"a": {}, "b": {}, "c": {}},
               "not": {"patternProperties": {"^[ab]$": {"type": "integer"}},
                       "additionalProperties": {"type": "string"}}}),
        // `not` and `if` against the closed rest.
        json!({"type": "object", "additionalProperties": false,
               "properties": {"a": {}, "b": {}, "c": {}},
               "not": {"additionalProperties": false, "properties": {"a": {}, "b": {}}}}),
        json!({"type": "object", "additionalProperties": false,
               "properties": {"a": {}, "b": {"type": "integer"}},
               "if": {"additionalProperties": {"type": "integer"}, "properties": {"a": {}}},
               "then": {"required": ["b"]}, "else": {"maxProperties": 1}}),
    ];
    let values = [
        json!(1),
        json!("x"),
        json!({}),
        json!({"b": 2}),
        json!({"c": 1}),
    ];
    let mut instances = vec![json!(null), json!([]), json!([null, {}]), json!([{"c": 1}])];
    for keys in 0..8u32 {
        for pick in 0..values.len().pow(keys.count_ones()) {
            let mut m = Map::new();
            let mut k = 0;
            for (bit, name) in ["a", "b", "c"].iter().enumerate() {
                if keys >> bit & 1 == 1 {
                    let v = values[pick / values.len().pow(k) % values.len()].clone();
                    m.insert(name.to_string(), v);
                    k += 1;
                }
            }
            let object = Value::Object(m);
            instances.push(json!([object.clone()]));
            instances.push(object);
        }
    }
    for schema in schemas {
        let valid = agrees_with_jsonschema(&schema, &instances);
        assert!(valid > 0, "{schema} accepts nothing here");
    }
    // Where the other side leaves names open (no `additionalProperties`, or a schema), negating
    // `additionalProperties` stays refused.
    for open in [
        json!({}),
        json!({"additionalProperties": {"type": "integer"}}),
    ] {
        let mut a = json!({"properties": {"a": {}}});
        a.as_object_mut()
            .unwrap()
            .extend(open.as_object().unwrap().clone());
        let s = json!({"oneOf": [a, {"properties": {"b": {}}, "additionalProperties": false}]});
        assert!(
            matches!(
                schema_to_regex(&s, &SchemaOptions::default()),
                Err(SchemaError::Unsupported { .. })
            ),
            "{s}"
        );
    }
}

/// `not`s of values and patterns merged by `allOf` (two merge into `not: {anyOf: …}`, three into
/// nested `anyOf`s) are removed from the text together; translating them used to negate the
/// `anyOf` back into `not`s that merged into it again, until the nesting limit (the `if`/`then`
/// blocks of github-workflows and github-issue-forms). Every instance is accepted exactly when
/// the `jsonschema` crate finds it valid.
#[test]
fn merged_nots_of_values_and_patterns_are_one_difference() {
    let schemas = [
        json!({"type": "string", "allOf": [{"not": {"const": "a"}}, {"not": {"const": "b"}}]}),
        json!({"allOf": [{"not": {"const": "a"}}, {"not": {"enum": ["b", 1, null]}},
                         {"not": {"const": 2}}]}),
        json!({"allOf": [{"not": {"pattern": "^a"}}, {"not": {"enum": ["b", 1]}}]}),
        json!({"type": "object", "properties": {"t": {"type": "string"}},
               "allOf": [
                   {"if": {"properties": {"t": {"const": "a"}}, "required": ["t"]},
                    "then": {"required": ["x"]}},
                   {"if": {"properties": {"t": {"const": "b"}}, "required": ["t"]},
                    "then": {"required": ["y"]}},
                   {"if": {"properties": {"t": {"const": "c"}}, "required": ["t"]},
                    "then": {"maxProperties": 1}}]}),
    ];
    let mut instances = vec![
        json!(null),
        json!(1),
        json!(2),
        json!(3),
        json!(true),
        json!({}),
    ];
    for s in ["a", "b", "c", "ab", "ba", ""] {
        instances.push(json!(s));
        // (Not both x and y: written in slots of their own, they come out in schema order.)
        for extra in [json!({}), json!({"x": 1}), json!({"y": 1})] {
            let mut m = extra.as_object().unwrap().clone();
            m.insert("t".into(), json!(s));
            instances.push(Value::Object(m));
        }
    }
    for schema in schemas {
        agrees_with_jsonschema(&schema, &instances);
    }
}

/// Over the real-schema corpus and the official suite's schemas: each translated tree's text
/// (what `quarry grammar explain` prints) has the length `max_regex_bytes` measures and parses
/// back to the very term the tree lowers to, rule references and intersections included.
#[test]
fn typed_regexes_and_their_text_agree_on_real_schemas() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut schemas: Vec<(String, Value)> = Vec::new();
    let mut dirs = vec![
        root.join("schema-corpus"),
        root.join("json-schema-test-suite/tests/draft2020-12"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(&path).unwrap()) else {
                continue;
            };
            let name = path.display().to_string();
            match v {
                // A suite file: groups of cases, each with its schema.
                Value::Array(groups) => schemas.extend(
                    groups
                        .into_iter()
                        .map(|mut g| (name.clone(), g["schema"].take())),
                ),
                v => schemas.push((name, v)),
            }
        }
    }
    assert!(
        schemas.len() > 450,
        "fixtures missing under {}",
        root.display()
    );
    let limits = crate::Limits::default();
    let mut checked = 0;
    for (name, schema) in &schemas {
        let deadline = std::time::Instant::now() + limits.compile_time;
        let options = SchemaOptions::default();
        let Ok((re, rules)) =
            schema_to_rules_by(schema, &options, &limits, deadline, Measure::Text)
        else {
            continue;
        };
        let n = rules.len() as u32 + 1;
        let mut terms = crate::deriv::Terms::new();
        for r in std::iter::once(&re).chain(&rules) {
            let text = r.to_string();
            assert_eq!(r.len(), text.len(), "{name}");
            let lowered = r.lower(&mut terms).unwrap();
            let parsed = crate::parse::parse_with_rules(&mut terms, &text, true, n).unwrap();
            assert_eq!(lowered, parsed, "{name}");
        }
        checked += 1;
    }
    assert!(checked > 350, "only {checked} schemas translated");
}

/// `oneOf` branches whose types cannot meet are disjoint however the types are spelled: through
/// a `$ref` to a `oneOf`, `anyOf`s, `allOf`s and `enum`s (travis' `stringOrNumber` or an array
/// of them; its `uniqueItems`, which matchers check while decoding, is left out here). Where the
/// types do meet, the overlap is still excluded.
#[test]
fn one_of_branches_are_disjoint_by_the_types_they_allow() {
    let instances = [
        json!("a"),
        json!(""),
        json!(5),
        json!(2.5),
        json!(null),
        json!([]),
        json!(["x"]),
        json!([1]),
        json!([1, 1]),
        json!(["x", 2]),
        json!({}),
    ];
    let disjoint = json!({
        "definitions": {
            "stringOrNumber": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "number"}]},
        },
        "oneOf": [
            {"$ref": "#/definitions/stringOrNumber"},
            {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/stringOrNumber"}},
            {"allOf": [{"anyOf": [{"type": "null"}, {"enum": [true, false]}]}]},
        ],
    });
    // Valid: "a", 5, 2.5, null, ["x"], [1], [1, 1], ["x", 2].
    assert_eq!(agrees_with_jsonschema(&disjoint, &instances), 8);
    // With `uniqueItems` the array branch cannot be negated: only disjointness lets it compile.
    let mut unique = disjoint.clone();
    unique["oneOf"][1]["uniqueItems"] = json!(true);
    schema_to_regex(&unique, &SchemaOptions::default()).unwrap();
    unique["oneOf"][0] = json!({"anyOf": [{"type": "string"}, {"type": "array"}]});
    let err = schema_to_regex(&unique, &SchemaOptions::default()).unwrap_err();
    assert!(err.to_string().contains("uniqueItems"), "{err}");
    let overlapping = json!({"oneOf": [
        {"anyOf": [{"type": "string"}, {"type": "array"}]},
        {"type": "array", "items": {"type": "integer"}},
    ]});
    // Valid: "a", "", ["x"], ["x", 2]; arrays of integers (and []) match both branches.
    assert_eq!(agrees_with_jsonschema(&overlapping, &instances), 4);
}
