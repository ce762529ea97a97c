//! `quarry grammar …` as a user runs it, on the real SmolLM2 vocabulary. Masks printed by the CLI are
//! checked against an oracle written here from the token bytes alone.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn quarry(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quarry"))
        .args(args)
        .current_dir(root())
        .env_remove("QUARRY_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run quarry");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The bytes `grammar mask` says the schema forces after `prefix`, with `extra` options.
fn forced_after(schema: &str, extra: &[&str], prefix: &str) -> Value {
    let mut args = vec![
        "grammar", "mask", "--json", "--schema", schema, "--prefix", prefix,
    ];
    args.extend_from_slice(extra);
    json_out(&args)["forced"].take()
}

fn json_out(args: &[&str]) -> Value {
    let o = quarry(args, "");
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn error_line(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "expected exit 2: {o:?}");
    let err = String::from_utf8(o.stderr.clone()).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

fn tokenizer() -> quarry_tokenizer::Tokenizer {
    quarry_tokenizer::Tokenizer::from_gguf(root().join(MODEL)).unwrap()
}

#[test]
fn mask_of_a_choice_equals_prefix_oracle() {
    let choices = ["Paris", "Prague", "Praha ✓"];
    let tok = tokenizer();
    for prefix in ["", "P", "Pr", "Pra", "Prah", "Praha \u{2713}"] {
        let mut args = vec!["grammar", "mask", "--json", "--prefix", prefix];
        for c in choices {
            args.extend(["--choice", c]);
        }
        let v = json_out(&args);
        let allowed: Vec<u32> = v["allowed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        // Oracle: a non-special token is allowed iff prefix + its bytes is a prefix of a choice;
        // an end-of-generation token iff the prefix is a choice.
        let eog = &tok.special_tokens().end_of_generation;
        let mut expected = Vec::new();
        for (id, bytes, kind) in tok.token_table().iter() {
            let ok = if kind.is_special() {
                eog.contains(&id) && choices.contains(&prefix)
            } else {
                let mut s = prefix.as_bytes().to_vec();
                s.extend_from_slice(bytes);
                !bytes.is_empty() && choices.iter().any(|c| c.as_bytes().starts_with(&s))
            };
            if ok {
                expected.push(id);
            }
        }
        assert_eq!(allowed, expected, "prefix {prefix:?}");
        assert_eq!(
            v["accepting"],
            choices.contains(&prefix),
            "prefix {prefix:?}"
        );
    }
}

#[test]
fn mask_reports_forced_bytes_and_text_mode_prints_a_json_array() {
    let v = json_out(&[
        "grammar",
        "mask",
        "--json",
        "--regex",
        r#"\{"name": "[a-z]+"\}"#,
        "--prefix",
        "{",
    ]);
    assert_eq!(v["forced"], "\"name\": \"");
    let o = quarry(
        &[
            "grammar", "mask", "--choice", "Paris", "--choice", "Prague", "--prefix", "Pa",
        ],
        "",
    );
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let first: Vec<u32> = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(!first.is_empty());
    assert!(text.contains("forced  \"ris\""), "{text}");
}

#[test]
fn mask_of_a_prefix_outside_the_language_is_exit_2() {
    let err = error_line(&quarry(
        &["grammar", "mask", "--regex", "[0-9]+", "--prefix", "12x"],
        "",
    ));
    assert!(err.contains("byte 2"), "{err}");
}

#[test]
fn accepts_answers_through_the_token_path() {
    let date = [
        "grammar",
        "accepts",
        "--regex",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}",
    ];
    assert_eq!(quarry(&date, "2024-02-29").status.code(), Some(0));
    assert_eq!(quarry(&date, "2024-02-2").status.code(), Some(1));
    assert_eq!(quarry(&date, "2024-02-29\n").status.code(), Some(1));
    let mut chomp = date.to_vec();
    chomp.push("--chomp");
    assert_eq!(quarry(&chomp, "2024-02-29\n").status.code(), Some(0));

    let mut explain = date.to_vec();
    explain.push("--explain");
    let o = quarry(&explain, "2024-0x-29");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.starts_with("refused: token"), "{err}");
    let o = quarry(&explain, "2024-02-2");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains("end of sequence"), "{err}");
    let o = quarry(&explain, "2024-02-29\n");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains("--chomp"), "{err}");

    // Multi-byte text through the token path.
    let choice = [
        "grammar",
        "accepts",
        "--choice",
        "Ünïcødé 😀",
        "--choice",
        "plain",
    ];
    assert_eq!(quarry(&choice, "Ünïcødé 😀").status.code(), Some(0));
    assert_eq!(quarry(&choice, "Ünïcødé 😁").status.code(), Some(1));
    // Control-token text in the input is text, never a control token.
    let any = ["grammar", "accepts", "--regex", r"[\s\S]*"];
    assert_eq!(quarry(&any, "a <|im_end|> b").status.code(), Some(0));
}

#[test]
fn compile_reports_states_timings_and_density() {
    let v = json_out(&[
        "grammar", "compile", "--json", "--choice", "yes", "--choice", "no",
    ]);
    // The minimal DFA of yes|no: start, "es", "s", "o", done.
    assert_eq!(v["dfa_states"].as_u64().unwrap(), 5, "{v}");
    assert!(v["compile_us"].as_f64().unwrap() > 0.0);
    assert!(v["first_mask_us"].as_f64().unwrap() > 0.0);
    let allowed = v["first_mask_allowed"].as_u64().unwrap();
    let mask = json_out(&[
        "grammar", "mask", "--json", "--choice", "yes", "--choice", "no",
    ]);
    assert_eq!(allowed, mask["count"].as_u64().unwrap());
    let density = v["first_mask_density"].as_f64().unwrap();
    assert!((density - allowed as f64 / 49152.0).abs() < 1e-12);
}

#[test]
fn bad_or_huge_constraints_are_one_line_exit_2() {
    // (arguments after `grammar`, stdin, what the one error line must say)
    let cases: &[(&[&str], &str, &str)] = &[
        (&["compile", "--regex", "(a"], "", "unclosed group"),
        (&["compile", "--regex", r"\bword\b"], "", "word boundar"),
        (
            &["compile", "--regex", "[ab]*a[ab]{20}"],
            "",
            "exceeds limit",
        ),
        (
            &["compile", "--regex", "[a-z]{30}", "--max-states", "10"],
            "",
            "max_states",
        ),
        (
            &["accepts", "--regex", "(", "--model", "models/nope.gguf"],
            "x",
            "not found",
        ),
    ];
    for (args, stdin, want) in cases {
        let mut full = vec!["grammar"];
        full.extend_from_slice(args);
        let err = error_line(&quarry(&full, stdin));
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn schema_constraints_compile_accept_and_explain() {
    let schema = "schemas/debian-package.json";
    let v = json_out(&["grammar", "compile", "--json", "--schema", schema]);
    assert!(v["dfa_states"].as_u64().unwrap() > 10, "{v}");
    // Written in another key order: refused as is, accepted once canonicalized.
    let doc = r#"{"version": "1.6-2.1", "name": "jq", "maintainer": "ChangZhuo Chen <czchen@debian.org>",
        "depends": ["libc6 (>= 2.34)"], "summary": "lightweight and flexible command-line JSON processor"}"#;
    let accepts = ["grammar", "accepts", "--schema", schema];
    assert_eq!(quarry(&accepts, doc).status.code(), Some(1));
    let mut canon = accepts.to_vec();
    canon.push("--canonicalize");
    assert_eq!(quarry(&canon, doc).status.code(), Some(0));
    // A required property missing: refused even in canonical form.
    let missing = r#"{"name": "jq", "version": "1", "maintainer": "x", "depends": []}"#;
    assert_eq!(quarry(&canon, missing).status.code(), Some(1));
    // In compact JSON the mask after a property forces the next key (the default layout,
    // `pretty:1`, leaves a space to the model first).
    let compact = ["--whitespace", "compact"];
    assert_eq!(
        forced_after(schema, &compact, r#"{"name":"jq","#),
        r#""version":""#
    );
    assert_eq!(forced_after(schema, &[], r#"{"name":"jq","#), "");
    let o = quarry(
        &[
            "grammar",
            "explain",
            "--schema",
            schema,
            "--whitespace",
            "compact",
        ],
        "",
    );
    assert!(o.status.success());
    assert!(String::from_utf8(o.stdout)
        .unwrap()
        .starts_with(r#"\{"name":""#));
}

#[test]
fn schema_layouts_are_chosen_by_whitespace() {
    let schema = "schemas/debian-package.json";
    let compact =
        r#"{"name":"jq","version":"1","maintainer":"x","depends":["a","b"],"summary":"s"}"#;
    let spaced = r#"{"name": "jq", "version": "1", "maintainer": "x", "depends": ["a", "b"], "summary": "s"}"#;
    let accepts = |layout: Option<&str>, text: &str| {
        let mut args = vec!["grammar", "accepts", "--schema", schema];
        if let Some(l) = layout {
            args.extend(["--whitespace", l]);
        }
        quarry(&args, text).status.code()
    };
    // The default is the engine's, `pretty:1` (either spacing); compact wants none, spaced
    // exactly one space after each separator.
    assert_eq!(accepts(None, compact), Some(0));
    assert_eq!(accepts(None, spaced), Some(0));
    assert_eq!(accepts(Some("compact"), compact), Some(0));
    assert_eq!(accepts(Some("compact"), spaced), Some(1));
    assert_eq!(accepts(Some("spaced"), spaced), Some(0));
    assert_eq!(accepts(Some("spaced"), compact), Some(1));
    assert_eq!(accepts(Some("pretty:1"), spaced), Some(0));
    assert_eq!(accepts(Some("pretty:1"), compact), Some(0));
    // --canonicalize writes the instance in the chosen layout.
    let v = r#"{"version": "1", "name": "jq", "maintainer": "x", "depends": ["a", "b"], "summary": "s"}"#;
    for layout in ["compact", "spaced"] {
        let args = [
            "grammar",
            "accepts",
            "--schema",
            schema,
            "--whitespace",
            layout,
            "--canonicalize",
        ];
        assert_eq!(quarry(&args, v).status.code(), Some(0), "{layout}");
    }
    // After a key, spaced forces `": "`.
    let forced = forced_after(schema, &["--whitespace", "spaced"], r#"{"name": "jq", "#);
    assert_eq!(forced, r#""version": ""#);
    // A usage error (clap's, exit 2) that names the accepted layouts.
    let o = quarry(
        &[
            "grammar",
            "compile",
            "--schema",
            schema,
            "--whitespace",
            "tabs",
        ],
        "",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("expected compact, spaced"), "{err}");
}

#[test]
fn unsupported_schema_keywords_name_the_pointer() {
    let path = std::env::temp_dir().join(format!("quarry-schema-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"type": "object", "properties": {"tags": {"type": "string", "pattern": "(?<=a)b"}}}"#,
    )
    .unwrap();
    let err = error_line(&quarry(
        &["grammar", "compile", "--schema", path.to_str().unwrap()],
        "",
    ));
    assert!(err.contains("look-behind"), "{err}");
    assert!(err.contains("#/properties/tags/pattern"), "{err}");
    std::fs::write(&path, r#"{"type": "object", "propertees": {}}"#).unwrap();
    let err = error_line(&quarry(
        &[
            "grammar",
            "compile",
            "--refuse-unknown-keywords",
            "--schema",
            path.to_str().unwrap(),
        ],
        "",
    ));
    assert!(err.contains("unknown keyword `propertees` at #"), "{err}");
    // By default they are annotations, as validators treat them (vendor keywords such as
    // `markdownDescription` or `x-…`); the old flag still runs.
    for extra in [&[][..], &["--ignore-unknown-keywords"][..]] {
        let mut args = vec!["grammar", "compile", "--schema", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = quarry(&args, "");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    std::fs::write(&path, "{not json").unwrap();
    let err = error_line(&quarry(
        &["grammar", "compile", "--schema", path.to_str().unwrap()],
        "",
    ));
    assert!(err.contains("not valid JSON"), "{err}");
}

/// A schema split over two files: `--schema-resource` gives the second, found by its file's
/// location relative to the first; without it the error names the document that is missing.
#[test]
fn schema_resources_resolve_references_to_other_files() {
    let dir = std::env::temp_dir().join(format!("quarry-schema-res-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("common")).unwrap();
    let main = dir.join("job.json");
    let common = dir.join("common/defs.json");
    std::fs::write(
        &main,
        r#"{"type": "object", "required": ["id"], "additionalProperties": false,
            "properties": {"id": {"$ref": "common/defs.json#/$defs/id"}}}"#,
    )
    .unwrap();
    std::fs::write(
        &common,
        r#"{"$defs": {"id": {"type": "integer", "minimum": 1}}}"#,
    )
    .unwrap();
    let (main, common) = (main.to_str().unwrap(), common.to_str().unwrap());
    let args = [
        "grammar",
        "accepts",
        "--schema",
        main,
        "--schema-resource",
        common,
    ];
    for (text, code) in [(r#"{"id":7}"#, 0), (r#"{"id":0}"#, 1), (r#"{"id":"7"}"#, 1)] {
        let o = quarry(&args, text);
        assert_eq!(o.status.code(), Some(code), "{text}: {o:?}");
    }
    let err = error_line(&quarry(&["grammar", "compile", "--schema", main], ""));
    assert!(
        err.contains("remote reference") && err.contains("common/defs.json#/$defs/id"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

const ARITHMETIC: &str = "workspace/quarry-grammar/tests/grammars/arithmetic.gbnf";

#[test]
fn gbnf_grammars_and_json_object_compile_accept_mask_and_explain() {
    let v = json_out(&["grammar", "compile", "--grammar", ARITHMETIC, "--json"]);
    assert_eq!(v["context_free"], true, "{v}");
    assert!(v["first_mask_allowed"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["constraint"]["grammar"], ARITHMETIC);
    // Accepts through the token path, at a depth no regex reaches.
    let deep = format!("{}1{}", "(".repeat(60), ")".repeat(60));
    // The same language in Lark syntax, chosen by the `.lark` extension.
    let lark = ARITHMETIC.replace(".gbnf", ".lark");
    for grammar in [ARITHMETIC, lark.as_str()] {
        for (text, code) in [("1 + (2 * 3)", 0), ("1 + (2 * 3", 1), (deep.as_str(), 0)] {
            let o = quarry(&["grammar", "accepts", "--grammar", grammar], text);
            assert_eq!(o.status.code(), Some(code), "{grammar} {text:?}: {o:?}");
        }
    }
    let bad_lark = root().join("target/test-scratch/bad.lark");
    std::fs::create_dir_all(bad_lark.parent().unwrap()).unwrap();
    std::fs::write(&bad_lark, "start: \"a\"\n%declare X").unwrap();
    let err = error_line(&quarry(
        &[
            "grammar",
            "compile",
            "--grammar",
            bad_lark.to_str().unwrap(),
        ],
        "",
    ));
    assert!(
        err.contains("line 2, column 1") && err.contains("%declare"),
        "{err}"
    );
    // After `((` the grammar wants a number, a minus, a space or another `(`: the CLI's mask is
    // exactly the tokens whose bytes keep a parse alive, checked here from the token bytes.
    let v = json_out(&[
        "grammar",
        "mask",
        "--json",
        "--grammar",
        ARITHMETIC,
        "--prefix",
        "((",
    ]);
    let ids: Vec<u64> = v["allowed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(!ids.is_empty());
    let tok = tokenizer();
    for (id, bytes, kind) in tok.token_table().iter() {
        let starts_ok = bytes.first().is_some_and(|b| b"(-0123456789 ".contains(b));
        let allowed = ids.contains(&(id as u64));
        if allowed {
            assert!(
                starts_ok,
                "token {id} {bytes:?} should not be allowed after (("
            );
        }
        let number = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit);
        if number && !kind.is_special() {
            assert!(
                allowed,
                "token {id} {bytes:?} (a number) should be allowed after (("
            );
        }
    }
    assert!(ids.len() > 10, "digits and brackets at least: {ids:?}");
    // json_object: an object at the top, and its explain prints one regex per rule.
    let o = quarry(
        &["grammar", "accepts", "--json-object"],
        r#"{"a":[{"b":[[1]]}]}"#,
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = quarry(&["grammar", "accepts", "--json-object"], "[1]");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let o = quarry(&["grammar", "explain", "--json-object"], "");
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.starts_with("root: ") && text.contains("\nrule 1: "),
        "{text}"
    );
    // A malformed grammar is one line naming the line and column.
    let dir = root().join("target/test-scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gbnf");
    std::fs::write(&bad, "root ::= \"a\" |\n  [b-").unwrap();
    let err = error_line(&quarry(
        &["grammar", "compile", "--grammar", bad.to_str().unwrap()],
        "",
    ));
    assert!(
        err.contains("line 2, column 3") && err.contains("not closed"),
        "{err}"
    );
    std::fs::write(&bad, "root ::= root \"x\" | \"y\"").unwrap();
    let err = error_line(&quarry(
        &["grammar", "compile", "--grammar", bad.to_str().unwrap()],
        "",
    ));
    assert!(err.contains("left recursion (root -> root)"), "{err}");
}

#[test]
fn regexes_choices_and_prefixes_may_begin_with_a_hyphen() {
    let accepts = |args: &[&str], text: &str| quarry(args, text).status.code();
    assert_eq!(
        accepts(&["grammar", "accepts", "--regex", "-?[0-9]+"], "-12"),
        Some(0)
    );
    assert_eq!(
        accepts(&["grammar", "accepts", "--regex", "-?[0-9]+"], "12-"),
        Some(1)
    );
    let choices = ["grammar", "accepts", "--choice", "-a", "--choice", "-b"];
    assert_eq!(accepts(&choices, "-b"), Some(0));
    assert_eq!(accepts(&choices, "b"), Some(1));
    let m = json_out(&[
        "grammar",
        "mask",
        "--json",
        "--regex",
        "-?[0-9]+(\\.[0-9]+)?",
        "--prefix",
        "-0.5",
    ]);
    assert_eq!(m["prefix"], "-0.5");
    assert_eq!(m["accepting"], true);
}
