//! The `quarry` binary as a user runs it, on the real model files from `make setup`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{pq_dump, root};

/// Runs `quarry ARGS` from the repository root, so the default model path resolves.
fn quarry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quarry"))
        .args(args)
        .current_dir(root())
        .env_remove("QUARRY_MODEL")
        .output()
        .expect("run quarry")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "quarry failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quarry-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The error a user sees: exactly one line on stderr, exit code 2.
fn one_line_error(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected failure, got {:?}",
        o.status
    );
    let err = String::from_utf8(o.stderr.clone()).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

#[test]
fn tokenize_json_prints_llama_cpp_ids() {
    let text = r#"{"name": "Ünïcødé 😀", "n": 12345}"#;
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/tokenizer/smollm2.cases.json"))
            .unwrap(),
    )
    .unwrap();
    let want = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == text && c["parse_special"] == false)
        .expect("fixture has the README example")["ids"]
        .clone();
    let out: Value = serde_json::from_str(&stdout(&quarry(&["tokenize", "--json", text]))).unwrap();
    assert_eq!(out["ids"], want);
    assert_eq!(out["text"], text);
    assert_eq!(
        out["tokens"].as_array().unwrap().len(),
        want.as_array().unwrap().len()
    );
    // The pieces are the token bytes, so together they spell the text (emoji split across tokens
    // show as U+FFFD piece by piece, so compare the ASCII-only prefix).
    assert_eq!(out["pieces"][0], "{\"");
}

#[test]
fn tokenize_parses_control_tokens_only_when_asked() {
    let plain: Value =
        serde_json::from_str(&stdout(&quarry(&["tokenize", "--json", "<|im_end|>"]))).unwrap();
    assert_ne!(plain["ids"], serde_json::json!([2]));
    let parsed: Value = serde_json::from_str(&stdout(&quarry(&[
        "tokenize",
        "--json",
        "--parse-special",
        "<|im_end|>",
    ])))
    .unwrap();
    assert_eq!(parsed["ids"], serde_json::json!([2]));
}

#[test]
fn info_reports_model_facts() {
    let out = stdout(&quarry(&["info"]));
    assert!(out.contains("architecture    llama"), "{out}");
    assert!(
        out.contains("49152 tokens, byte-level BPE (pre-tokenizer smollm)"),
        "{out}"
    );
    assert!(out.contains("layers          30"), "{out}");
    assert!(!out.contains("sliding window"), "{out}");
    assert!(
        out.contains("<|im_start|>assistant"),
        "chat template missing: {out}"
    );

    let json: Value = serde_json::from_str(&stdout(&quarry(&[
        "info",
        "--json",
        "--model",
        "models/gemma-3-270m-q4_k_m.gguf",
    ])))
    .unwrap();
    assert_eq!(json["model"]["architecture"], "gemma3");
    assert_eq!(json["tokenizer"]["vocab_size"], 262_144);
    assert_eq!(json["tokenizer"]["vocab_kind"], "sentence_piece");
    // Gemma 3 270M: five local layers in six, over 512 positions; Mistral 7B v0.1's window
    // slides in every layer (the tiny model in its shape, as a checkpoint folder).
    assert_eq!(
        (
            &json["model"]["sliding_window"],
            &json["model"]["sliding_layers"]
        ),
        (&Value::from(512), &Value::from(15)),
        "{json}"
    );
    let mistral = stdout(&quarry(&[
        "info",
        "--model",
        "models/checkpoints/tiny-mistral",
    ]));
    assert!(
        mistral.contains("attention       a sliding window of 8 positions in every layer"),
        "{mistral}"
    );
    // How RoPE is scaled, from a GGUF header and from a config.json.
    for (model, scaling) in [
        (
            "models/tiny/tiny-qwen3-yarn.gguf",
            "YaRN, factor 4 over an original context of 512",
        ),
        (
            "models/checkpoints/tiny-qwen3-yarn",
            "YaRN, factor 4 over an original context of 512",
        ),
        (
            "models/tiny/tiny-gemma3.gguf",
            "linear, factor 8 in the global layers",
        ),
        (
            "models/tiny/tiny-llama3.gguf",
            "Llama 3's per-frequency factors",
        ),
    ] {
        let json: Value =
            serde_json::from_str(&stdout(&quarry(&["info", "--json", "--model", model]))).unwrap();
        assert_eq!(json["model"]["rope_scaling"], scaling, "{model}");
    }
    assert!(out.contains("rope base       100000 · rms eps"), "{out}");
}

#[test]
fn chat_template_renders_a_prompt_ending_at_the_reply() {
    let out = stdout(&quarry(&[
        "chat-template",
        "--system",
        "Be brief.",
        "Total?",
    ]));
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTotal?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn missing_model_says_how_to_fix_it() {
    let err = one_line_error(&quarry(&["info", "--model", "models/nope.gguf"]));
    assert!(err.contains("models/nope.gguf not found"), "{err}");
    assert!(err.contains("make setup"), "{err}");
}

#[test]
fn corrupt_model_is_one_line_not_a_panic() {
    let garbage = scratch("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    for cmd in ["info", "tokenize"] {
        let mut args = vec![cmd, "--model", garbage.to_str().unwrap()];
        if cmd == "tokenize" {
            args.push("hello");
        }
        let err = one_line_error(&quarry(&args));
        assert!(err.contains("not a readable GGUF file"), "{err}");
        assert!(err.contains("make setup"), "{err}");
    }
}

#[test]
fn truncated_model_is_detected() {
    let full = std::fs::read(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let cut = scratch("truncated.gguf");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let err = one_line_error(&quarry(&["info", "--model", cut.to_str().unwrap()]));
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn values_that_begin_with_a_hyphen_are_text_not_flags() {
    // Positional text: `quarry tokenize -1e5` is the text "-1e5", as `-- -1e5` is.
    let ids = |args: &[&str]| -> Value { serde_json::from_str(&stdout(&quarry(args))).unwrap() };
    let bare = ids(&["tokenize", "--json", "-1e5"]);
    assert_eq!(bare["text"], "-1e5");
    assert_eq!(
        bare["ids"],
        ids(&["tokenize", "--json", "--", "-1e5"])["ids"]
    );
    // A flag after the text is still a flag.
    assert_eq!(ids(&["tokenize", "-x", "--json"])["text"], "-x");
    // Chat messages.
    let chat = stdout(&quarry(&[
        "chat-template",
        "--system",
        "-be brief",
        "-5 degrees?",
    ]));
    assert!(
        chat.contains("-be brief") && chat.contains("-5 degrees?"),
        "{chat}"
    );
    // Generation: the prompt, a regex, choices and stop strings.
    let num = stdout(&quarry(&[
        "generate",
        "--prompt",
        "-40 plus 2 is",
        "--regex",
        "-?[0-9]{1,3}",
        "--max-tokens",
        "4",
        "--stop",
        "-x",
    ]));
    let num = num.trim();
    let digits = num.strip_prefix('-').unwrap_or(num);
    assert!(
        (1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
        "{num:?}"
    );
    let pick = stdout(&quarry(&[
        "generate",
        "--prompt",
        "Pick one:",
        "--choice",
        "-1",
        "--choice",
        "+1",
        "--max-tokens",
        "4",
    ]));
    assert!(["-1", "+1"].contains(&pick.trim()), "{pick:?}");
}

#[test]
fn generate_is_deterministic_greedy_and_seeded() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "12",
        ];
        args.extend_from_slice(extra);
        let o = quarry(&args);
        let text = stdout(&o);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(err.contains("tok/s"), "speed line missing: {err}");
        text
    };
    let greedy = run(&[]);
    assert!(!greedy.trim().is_empty());
    assert_eq!(
        greedy,
        run(&[]),
        "greedy output must not change between runs"
    );
    let seeded = run(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "5"]);
    assert_eq!(
        seeded,
        run(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "5"])
    );
}

#[test]
fn generate_chat_stops_at_end_of_turn_and_bad_input_is_one_line() {
    let o = quarry(&[
        "generate",
        "--chat",
        "--prompt",
        "Say hello.",
        "--max-tokens",
        "200",
    ]);
    stdout(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 stop"), "{err}");
    for (args, needle) in [
        (
            vec!["generate", "--prompt", "x", "--device", "cuda:0"],
            "no CUDA support",
        ),
        (
            vec!["generate", "--prompt", "x", "--device", "tpu"],
            "expected `cpu`",
        ),
        (
            vec!["generate", "--prompt", "x", "--temperature=-1"],
            "temperature",
        ),
        (vec!["generate", "--prompt", "x", "--top-p", "0"], "top_p"),
        (vec!["generate", "--prompt", ""], "prompt is empty"),
        (
            vec![
                "generate",
                "--prompt",
                "x",
                "--max-running",
                "16",
                "--step-tokens",
                "8",
            ],
            "step_tokens 8 is below max_running 16",
        ),
    ] {
        let o = quarry(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn generate_follows_constraints_and_reports_stats() {
    let choice = stdout(&quarry(&[
        "generate",
        "--chat",
        "--prompt",
        "Is the sky blue?",
        "--choice",
        "yes",
        "--choice",
        "no",
    ]));
    assert!(["yes", "no"].contains(&choice.trim_end()), "{choice:?}");
    let o = quarry(&[
        "generate",
        "--chat",
        "--prompt",
        "Pick a number.",
        "--regex",
        "[1-9][0-9]{2}",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    ]);
    let n = stdout(&o);
    let n = n.trim_end();
    assert!(
        n.len() == 3 && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'),
        "{n:?}"
    );
    // The package schema on one record, with --stats: the output and the stats line.
    let jq = |extra: &[&str]| {
        let mut args = vec![
            "generate", "--chat", "--prompt",
            "Package: jq\nVersion: 1.6-2.1\nMaintainer: ChangZhuo Chen <czchen@debian.org>\nDescription: lightweight JSON processor",
            "--schema", "schemas/debian-package.json", "--max-tokens", "200", "--stats",
        ];
        args.extend_from_slice(extra);
        let o = quarry(&args);
        let v: Value = serde_json::from_str(stdout(&o).trim_end()).expect("schema output is JSON");
        assert!(v["name"].is_string() && v["depends"].is_array(), "{v}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = jq(&[]);
    assert!(
        err.contains("forward passes") && err.contains("forced"),
        "{err}"
    );
    // --keep-back: leaving nothing for the model forces more than leaving every boundary to it
    // (without drafts, which would append the kept-back tokens anyway); drafts force more than
    // keeping back alone.
    let forced = |keep_back: &str, drafts: bool| {
        let mut extra = vec!["--keep-back", keep_back];
        if !drafts {
            extra.push("--no-drafts");
        }
        let err = jq(&extra);
        let n = err
            .split("forced ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok());
        n.unwrap_or_else(|| panic!("no forced count in {err}"))
    };
    let (all, none) = (forced("0", false), forced("1000", false));
    assert!(all > none, "keep-back 0 forced {all}, 1000 forced {none}");
    let (kept, drafted) = (forced("1", false), forced("1", true));
    assert!(
        drafted > kept,
        "drafts forced {drafted}, keep-back alone {kept}"
    );
    let err = one_line_error(&quarry(&["generate", "--prompt", "x", "--regex", "("]));
    assert!(err.contains("regex"), "{err}");
    // --whitespace spaced: the same schema, one space after every separator.
    let o = quarry(&[
        "generate",
        "--chat",
        "--prompt",
        "Describe jq (version 1.6) as a JSON object.",
        "--json-object",
        "--whitespace",
        "spaced",
        "--max-tokens",
        "60",
    ]);
    let text = stdout(&o);
    let text = text.trim_end();
    assert!(text.starts_with('{') && text.len() > 4, "{text:?}");
    assert_spaced(text);
    // --grammar: a GBNF file; the output stays inside the grammar's language (a complete
    // expression, or a prefix of one when max_tokens cut it), checked by the grammar command.
    let grammar = "workspace/quarry-grammar/tests/grammars/arithmetic.gbnf";
    let o = quarry(&[
        "generate",
        "--chat",
        "--prompt",
        "Write an arithmetic expression that adds 12 and 30, then multiplies by 2.",
        "--grammar",
        grammar,
        "--max-tokens",
        "40",
    ]);
    let text = stdout(&o);
    let text = text.trim_end();
    assert!(
        !text.is_empty() && text.chars().all(|c| "0123456789+-*/() ".contains(c)),
        "{text:?}"
    );
    let mask = quarry(&["grammar", "mask", "--grammar", grammar, "--prefix", text]);
    assert!(mask.status.success(), "{text:?} left the grammar: {mask:?}");
    let err = one_line_error(&quarry(&[
        "generate",
        "--prompt",
        "x",
        "--grammar",
        "Cargo.toml",
    ]));
    assert!(err.contains("invalid grammar at line 1"), "{err}");
}

/// Outside strings, each `,` and `:` is followed by exactly one space, and there is no other
/// whitespace (what `--whitespace spaced` writes; a truncated text passes too).
fn assert_spaced(text: &str) {
    let b = text.as_bytes();
    let (mut in_string, mut escaped) = (false, false);
    for (i, &c) in b.iter().enumerate() {
        if in_string {
            (in_string, escaped) = match (escaped, c) {
                (true, _) => (true, false),
                (false, b'\\') => (true, true),
                (false, b'"') => (false, false),
                _ => (true, false),
            };
            continue;
        }
        let after_sep = i > 0 && matches!(b[i - 1], b',' | b':');
        assert_eq!(c == b' ', after_sep, "byte {i} of {text:?}");
        assert!(
            !c.is_ascii_whitespace() || c == b' ',
            "byte {i} of {text:?}"
        );
        in_string = c == b'"';
    }
}

#[test]
fn generate_batch_runs_jsonl_in_order() {
    let path = scratch("batch.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"prompt\": \"Name a fruit.\", \"constraint\": {\"choice\": [\"apple\", \"pear\"]}}\n",
            "\n",
            "{\"prompt\": \"x\", \"constraint\": {\"regex\": \"(\"}}\n",
            "{\"prompt\": [{\"role\": \"user\", \"content\": \"Say hi\"}], \"max_tokens\": 3}\n",
            "{\"prompt\": \"Pick.\", \"constraint\": {\"lark\": \"start: \\\"yes\\\" | \\\"no\\\"\"}}\n",
        ),
    )
    .unwrap();
    let out = stdout(&quarry(&[
        "generate",
        "--batch",
        path.to_str().unwrap(),
        "--chat",
    ]));
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i);
    }
    assert!(["apple", "pear"].contains(&lines[0]["text"].as_str().unwrap()));
    assert_eq!(lines[0]["finish"], "constraint_complete");
    assert_eq!(lines[1]["finish"], "error");
    assert!(lines[1]["error"].as_str().unwrap().contains("regex"));
    assert_eq!(lines[2]["finish"], "length");
    assert_eq!(lines[2]["output_tokens"], 3);
    // A Lark grammar in a request.
    assert!(
        ["yes", "no"].contains(&lines[3]["text"].as_str().unwrap()),
        "{out}"
    );
    assert_eq!(lines[3]["finish"], "constraint_complete");
    std::fs::write(&path, "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n").unwrap();
    let err = one_line_error(&quarry(&["generate", "--batch", path.to_str().unwrap()]));
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn bad_job_definitions_are_one_line_errors_naming_file_and_key() {
    let def = scratch("typo.toml");
    let text = std::fs::read_to_string(root().join("pipelines/debian-packages.toml"))
        .unwrap()
        .replace("[batching]", "[batching]\nmax_runing = 4");
    std::fs::write(&def, text).unwrap();
    let err = one_line_error(&quarry(&["extract", "--pipeline", def.to_str().unwrap()]));
    assert!(
        err.contains("typo.toml") && err.contains("max_runing"),
        "{err}"
    );

    // Each wrong command line names what is wrong.
    let cases: [(&[&str], &[&str]); 3] = [
        (&["pipelines/kafka-packages.toml"], &["quarry worker"]),
        (
            &[
                "pipelines/debian-packages.toml",
                "--input",
                "/nonexistent/quarry-input",
            ],
            &["/nonexistent/quarry-input", "does not exist"],
        ),
        (
            &[
                "pipelines/debian-packages.toml",
                "--model",
                "models/nope.gguf",
            ],
            &["models/nope.gguf", "--model"],
        ),
    ];
    for (args, wants) in cases {
        let mut a = vec!["extract", "--pipeline"];
        a.extend_from_slice(args);
        let err = one_line_error(&quarry(&a));
        assert!(wants.iter().all(|w| err.contains(w)), "{args:?}: {err}");
    }
}

/// The model runtime options (docs/model-options.md): `--help` lists every key, a good one runs,
/// and a bad flag, variable or `[model.runtime]` entry is one line naming it and what it accepts.
#[test]
fn model_runtime_options_are_documented_and_bad_ones_are_one_line_errors() {
    let help = stdout(&quarry(&["bench", "--help"]));
    for key in [
        "attention=",
        "attention_chunk=",
        "attention_prefetch=",
        "attention_keys=",
        "kv_dtype=",
        "dense_from_rows=",
        "q8_gemv=",
        "gemv_prefetch=",
        "sampling=",
        "cuda_graphs=",
        "gemm_add=",
        "rope_store=",
        "add_norm=",
        "gemv_norm=",
        "split_combine=",
        "profile=",
    ] {
        assert!(help.contains(key), "bench --help lacks {key}");
    }
    stdout(&quarry(&[
        "generate",
        "--prompt",
        "x",
        "--max-tokens",
        "2",
        "--runtime",
        "cuda_graphs=off",
        "--runtime",
        "kv_dtype=bf16",
    ]));
    for (args, wants) in [
        (
            vec!["--runtime", "kv_dtype=f8"],
            vec!["kv_dtype is `f8`", "f16, bf16 or f32"],
        ),
        (
            vec!["--runtime", "attn=warps"],
            vec!["`attn` is not a model runtime option", "attention"],
        ),
        (vec!["--runtime", "profile"], vec!["KEY=VALUE"]),
    ] {
        let mut a = vec!["generate", "--prompt", "x"];
        a.extend_from_slice(&args);
        let err = one_line_error(&quarry(&a));
        assert!(wants.iter().all(|w| err.contains(w)), "{args:?}: {err}");
    }
    // A variable the binary reads is named by its own name.
    let o = Command::new(env!("CARGO_BIN_EXE_quarry"))
        .args(["generate", "--prompt", "x"])
        .current_dir(root())
        .env_remove("QUARRY_MODEL")
        .env("QUARRY_SAMPLING", "gpu")
        .output()
        .unwrap();
    let err = one_line_error(&o);
    assert!(
        err.contains("QUARRY_SAMPLING is `gpu`: expected device or host"),
        "{err}"
    );
    // A job file's `[model.runtime]` is read with the same names and refuses a bad value.
    let def = scratch("runtime.toml");
    let text = std::fs::read_to_string(root().join("pipelines/debian-packages.toml")).unwrap();
    let text = format!("{text}\n[model.runtime]\nkv_dtype = \"f8\"\n");
    std::fs::write(&def, text).unwrap();
    let err = one_line_error(&quarry(&["extract", "--pipeline", def.to_str().unwrap()]));
    assert!(
        err.contains("runtime.toml") && err.contains("f8") && err.contains("bf16"),
        "{err}"
    );
}

#[test]
fn extract_writes_parquet_and_a_rerun_skips_published_shards() {
    let dir = scratch("extract-run");
    let _ = std::fs::remove_dir_all(&dir);
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let status = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    let entry = status
        .split("\n\n")
        .find(|e| e.starts_with("Package: "))
        .unwrap();
    let line = serde_json::json!({"id": "p0", "text": entry}).to_string();
    std::fs::write(
        input.join("one.jsonl"),
        format!("{line}\n{{\"id\": \"bad\"}}\n"),
    )
    .unwrap();
    let (out, rej) = (dir.join("out"), dir.join("rej"));
    let run = |json: bool| {
        let (i, o, r) = (
            input.display().to_string(),
            out.display().to_string(),
            rej.display().to_string(),
        );
        let mut a = vec!["extract", "--pipeline", "pipelines/debian-packages.toml"];
        a.extend(["--input", &i, "--output", &o, "--rejects", &r]);
        // `--model` replaces the job's model (Qwen2.5) with the small one, which the rows record.
        a.extend(["--model", "models/SmolLM2-135M-Instruct.Q4_1.gguf"]);
        if json {
            a.push("--json");
        }
        quarry(&a)
    };
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(true))).unwrap();
    assert_eq!(v["consumed"], 2);
    assert_eq!(
        v["accepted"].as_u64().unwrap() + v["rejected"].as_u64().unwrap(),
        2
    );
    assert_eq!(v["causes"]["missing_field"], 1);
    assert!(rej.join("one.parquet").is_file());
    let again = stdout(&run(false));
    assert!(again.contains("0 done now, 1 already published"), "{again}");
    for d in [&out, &rej] {
        inspect_agrees_with_pyarrow(d);
    }
    let text = stdout(&quarry(&["inspect", &dir.display().to_string()]));
    let total = format!(
        "total: 2 file(s), {} accepted row(s), {} rejected row(s)",
        v["accepted"], v["rejected"]
    );
    assert!(text.contains(&total), "{text}");
    assert!(text.contains("missing_field 1"), "{text}");
    // Every row names the model that `--model` chose, not the job file's.
    let rows = inspect_json(&rej);
    let models: Vec<&str> = rows["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["sample"].as_array().unwrap())
        .map(|r| r["_model"].as_str().unwrap())
        .collect();
    assert!(!models.is_empty());
    assert!(
        models
            .iter()
            .all(|m| *m == "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{models:?}"
    );
}

/// What `quarry inspect DIR --all --json` prints.
fn inspect_json(dir: &std::path::Path) -> Value {
    let out = stdout(&quarry(&[
        "inspect",
        &dir.display().to_string(),
        "--all",
        "--json",
    ]));
    serde_json::from_str(&out).unwrap()
}

/// `quarry inspect --all --json` and pyarrow (tests/pipeline/pq_dump.py) read the same files the
/// same way: row and row-group counts, codec, columns and nullability, footer metadata, and every
/// value of every row.
fn inspect_agrees_with_pyarrow(dir: &std::path::Path) {
    let ours = inspect_json(dir);
    let theirs = pq_dump(dir);
    let name = |p: &Value| p.as_str().unwrap().rsplit('/').next().unwrap().to_string();
    let (ours_f, theirs_f) = (
        ours["files"].as_array().unwrap(),
        theirs["files"].as_array().unwrap(),
    );
    assert_eq!(ours_f.len(), theirs_f.len());
    assert!(!ours_f.is_empty());
    // Timestamps: arrow-json writes RFC 3339, pyarrow's str() a space and an offset.
    let norm = |v: &Value| -> Value {
        match v.as_str() {
            Some(s) if s.len() > 19 && s.as_bytes()[10] == b'T' => {
                Value::String(s.replacen('T', " ", 1).replace('Z', "+00:00"))
            }
            _ => v.clone(),
        }
    };
    let mut values = 0;
    for (o, t) in ours_f.iter().zip(theirs_f) {
        assert_eq!(name(&o["path"]), name(&t["path"]));
        assert_eq!(o["rows"], t["rows"]);
        assert_eq!(o["row_groups"], t["row_groups"]);
        if o["rows"].as_u64() > Some(0) {
            assert_eq!(o["compression"], t["compression"]);
        }
        assert_eq!(o["metadata"], t["metadata"]);
        let cols = |v: &Value| -> Vec<(Value, Value)> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|c| (c[0].clone(), c[2].clone()))
                .collect()
        };
        assert_eq!(cols(&o["schema"]), cols(&t["schema"]));
        let file = t["path"].as_str().unwrap();
        let rows: Vec<&Value> = theirs["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["_file"] == file)
            .collect();
        let ours_rows = o["sample"].as_array().unwrap();
        assert_eq!(ours_rows.len(), rows.len());
        for (a, b) in ours_rows.iter().zip(rows) {
            for (k, va) in a.as_object().unwrap() {
                assert_eq!(norm(va), norm(&b[k]), "{file}: column {k}");
                values += 1;
            }
        }
    }
    assert!(values > 0, "no values compared under {}", dir.display());
}

#[test]
fn every_help_carries_examples_and_the_exit_codes_are_listed() {
    let top = stdout(&quarry(&["--help"]));
    assert!(
        top.contains("Exit codes:") && top.contains("  3  "),
        "{top}"
    );
    let commands = [
        vec!["extract"],
        vec!["worker"],
        vec!["inspect"],
        vec!["bench"],
        vec!["generate"],
        vec!["info"],
        vec!["tokenize"],
        vec!["chat-template"],
        vec!["grammar"],
        vec!["grammar", "compile"],
        vec!["grammar", "accepts"],
        vec!["grammar", "explain"],
        vec!["grammar", "mask"],
    ];
    for c in commands {
        let mut args = c.clone();
        args.push("--help");
        let help = stdout(&quarry(&args));
        assert!(
            help.contains("Examples:\n  "),
            "`quarry {}` has no examples",
            c.join(" ")
        );
        // Every command of the list is listed in the top-level help.
        assert!(
            top.contains(&format!("  {} ", c[0])),
            "{} missing from --help",
            c[0]
        );
    }
}

/// Records that always close (docs/budget.md): `grammar explain` prints the shortest record for
/// the model, a `--max-tokens` below it is a one-line error naming both numbers, and at it the
/// record comes out complete.
#[test]
fn a_budget_under_the_shortest_record_is_refused_and_at_it_the_record_closes() {
    let regex = "[a-z]{3}-[0-9]{4}";
    let explained = quarry(&["grammar", "explain", "--regex", regex]);
    assert!(explained.status.success());
    let err = String::from_utf8(explained.stderr).unwrap();
    let shortest: usize = err
        .strip_prefix("shortest record: ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no shortest record in {err}"));
    assert!((2..=8).contains(&shortest), "{err}");
    let generate = |max_tokens: &str| {
        quarry(&[
            "generate",
            "--prompt",
            "Code:",
            "--regex",
            regex,
            "--max-tokens",
            max_tokens,
        ])
    };
    let below = (shortest - 1).to_string();
    let err = one_line_error(&generate(&below));
    assert!(
        err.contains(&format!("shortest record takes {shortest} tokens"))
            && err.contains(&format!("--max-tokens is {below}")),
        "{err}"
    );
    let at = shortest.to_string();
    let out = stdout(&generate(&at));
    let text = out.trim_end_matches('\n').as_bytes();
    let complete = text.len() == 8
        && text[..3].iter().all(u8::is_ascii_lowercase)
        && text[3] == b'-'
        && text[4..].iter().all(u8::is_ascii_digit);
    assert!(complete, "{out:?}");
}

/// `--model` takes a Hugging Face checkpoint folder (built from SmolLM2's GGUF by
/// tests/fixtures/checkpoints.py, `make test`'s set-up): a schema-constrained record with the
/// folder's chat template, and a folder that is not a checkpoint refused by name.
#[test]
fn generate_runs_a_checkpoint_folder() {
    let o = quarry(&[
        "generate",
        "--model",
        "models/checkpoints/smollm2",
        "--chat",
        "--prompt",
        "Package: jq\nVersion: 1.6-2.1\nDescription: lightweight JSON processor",
        "--schema",
        "schemas/debian-package.json",
        "--max-tokens",
        "200",
    ]);
    let v: Value = serde_json::from_str(stdout(&o).trim_end()).expect("schema output is JSON");
    assert!(v["name"].is_string() && v["depends"].is_array(), "{v}");
    // `info` reads the folder's config and safetensors headers: the GGUF's model.
    let info = |model: &str| -> Value {
        serde_json::from_str(&stdout(&quarry(&["info", "--model", model, "--json"]))).unwrap()
    };
    let (folder, gguf) = (
        info("models/checkpoints/smollm2"),
        info("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    );
    for key in [
        "architecture",
        "block_count",
        "head_count",
        "parameter_count",
    ] {
        assert_eq!(folder["model"][key], gguf["model"][key], "{key}");
    }
    // What each takes on a GPU, from the parameter count: the GGUF's projections (every matrix
    // but the norms; the tied embedding is the output projection too) as f16 copies, beside the
    // f32 embedding table and norms; the folder's f32 values held as they are.
    let n = |v: &Value, k: &str| v["model"][k].as_u64().unwrap();
    let (params, e, layers) = (
        n(&gguf, "parameter_count"),
        n(&gguf, "embedding_length"),
        n(&gguf, "block_count"),
    );
    let (norms, embed) = (e * (2 * layers + 1), 49_152 * e);
    let g = |v: &Value, k: &str| v["gpu_weights"][k].as_u64().unwrap();
    assert_eq!(g(&gguf, "f16"), 2 * (params - norms));
    assert_eq!(g(&gguf, "fixed"), 4 * (embed + norms));
    // As stored: the embedding in Q8_0 (34 bytes a block of 32), the rest in Q4_1 (20 bytes).
    assert_eq!(
        g(&gguf, "quantized"),
        embed / 32 * 34 + (params - norms - embed) / 32 * 20,
        "{gguf}"
    );
    assert_eq!(
        (g(&folder, "quantized"), g(&folder, "f16")),
        (0, 0),
        "{folder}"
    );
    assert_eq!(g(&folder, "fixed"), 4 * (params + embed));
    // On a CPU: the folder's projections in f32 (the tied embedding twice: looked up and
    // multiplied), or as Q8_0 blocks (34 bytes a block of 32, the tied output projection too)
    // beside the f32 table looked up; the GGUF's as stored.
    let h = |v: &Value, k: &str| v["cpu_weights"][k].as_u64().unwrap();
    assert_eq!(h(&folder, "f32"), 4 * (params + embed));
    assert_eq!(
        h(&folder, "q8_0"),
        4 * (norms + embed) + (params - norms) / 32 * 34
    );
    assert_eq!(
        (h(&gguf, "f32"), h(&gguf, "q8_0")),
        (g(&gguf, "quantized") + 4 * (norms + embed), h(&gguf, "f32"))
    );
    let o = quarry(&["generate", "--model", "schemas", "--prompt", "x"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("without a config.json"),
        "{err}"
    );
}

/// `bench --dummy-weights` with a config.json of the test's: random weights in that shape, the
/// run and the shape in the JSON; an unknown shape is refused naming the known ones.
#[test]
fn bench_runs_dummy_weights() {
    let dir = std::env::temp_dir().join(format!("quarry-cli-dummy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_hidden_layers": 2, "max_position_embeddings": 2048}"#,
    )
    .unwrap();
    let out = dir.join("bench.json");
    let o = quarry(&[
        "bench",
        "--dummy-weights",
        config.to_str().unwrap(),
        "--modes",
        "a",
        "--batch",
        "2",
        "--docs",
        "2",
        "--max-tokens",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    stdout(&o);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v["model"], "dummy weights");
    // Qwen2.5's tokenizer by default: its vocabulary sizes the output projection.
    assert_eq!(v["dummy_weights"]["vocabulary"], 151_936);
    assert_eq!(v["results"][0]["median"]["docs"], 2, "{v}");
    let o = quarry(&["bench", "--dummy-weights", "gpt-9"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("llama3.1-8b"), "{err}");
}

/// A dataset job over a checkpoint folder (`--model DIR`, as `model.path` would): the record is
/// written, and its `_model` lineage column names the folder (read back with pyarrow).
#[test]
fn extract_runs_a_checkpoint_folder_and_lineage_names_it() {
    let dir = scratch("checkpoint-job");
    let input = one_package_input(
        &dir,
        "Package: jq\nVersion: 1.6-2.1\nDescription: lightweight JSON processor",
    );
    let (out, rejects) = (dir.join("out"), dir.join("rejects"));
    let o = extract_packages(&input, &out, &rejects, "models/checkpoints/tiny-qwen3");
    stdout(&o);
    // The tiny model's weights are random: its record is valid (the schema constrains it), so
    // it is accepted; either way exactly one row names the folder.
    let rows: Vec<Value> = [&out, &rejects]
        .iter()
        .filter(|d| d.exists())
        .flat_map(|d| pq_dump(d)["rows"].as_array().unwrap().clone())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["_model"], "tiny-qwen3", "{:?}", rows[0]);
}

/// A job whose turns the model's chat template cannot render stops before its first document,
/// saying what to change, rather than rejecting every document: a template that takes no system
/// message (Mistral 7B v0.1's and v0.2's raise on one) and a model without a template.
#[test]
fn extract_stops_at_start_when_the_chat_template_refuses_the_job_s_turns() {
    let dir = scratch("chat-turns");
    let input = one_package_input(&dir, "Package: jq");
    // A template in the manner of Mistral 7B v0.1's.
    let model = folder_with_template(
        &dir.join("no-system"),
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} \
         [/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% else %}\
         {{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    );
    let run = |model: &str, out: &str| {
        let rejects = dir.join(format!("{out}-rejects"));
        extract_packages(&input, &dir.join(out), &rejects, model)
    };
    let refused = one_line_error(&run(model.to_str().unwrap(), "a"));
    assert!(
        refused.contains("Only user and assistant roles are supported!")
            && refused.contains("drop `prompt.system`"),
        "{refused}"
    );
    let none = one_line_error(&run("models/tiny/tiny-gemma3.gguf", "b"));
    assert!(
        none.contains("has no chat template") && none.contains("chat = false"),
        "{none}"
    );
    // Nothing was written: the job stopped before its first document.
    let written: Vec<_> = ["a", "a-rejects", "b", "b-rejects"]
        .iter()
        .filter_map(|d| std::fs::read_dir(dir.join(d)).ok())
        .flatten()
        .map(|e| e.unwrap().path())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(written.is_empty(), "{written:?}");
}

/// `dir/in/docs.jsonl`: one document, `text`, with the id `jq`; returns the folder.
fn one_package_input(dir: &Path, text: &str) -> PathBuf {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let line = serde_json::json!({"id": "jq", "text": text});
    std::fs::write(input.join("docs.jsonl"), format!("{line}\n")).unwrap();
    input
}

/// `quarry extract` of the package pipeline over `input` with `model`.
fn extract_packages(input: &Path, out: &Path, rejects: &Path, model: &str) -> Output {
    quarry(&[
        "extract",
        "--pipeline",
        "pipelines/debian-packages.toml",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--rejects",
        rejects.to_str().unwrap(),
        "--model",
        model,
    ])
}

/// The tiny Mistral checkpoint folder copied to `dir`, with `template` as its chat template.
fn folder_with_template(dir: &Path, template: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let src = root().join("models/checkpoints/tiny-mistral");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    dir.to_path_buf()
}

/// `quarry chat-template --model MODEL [--chat-var V]… USER`'s output.
fn render_chat(model: &Path, vars: &[&str], user: &str) -> String {
    let mut args = vec!["chat-template", "--model", model.to_str().unwrap()];
    for v in vars {
        args.extend(["--chat-var", v]);
    }
    args.push(user);
    stdout(&quarry(&args))
}

/// `--chat-var` reaches the template; `enable_thinking` is false unless it is set.
#[test]
fn chat_template_renders_with_the_variables_given() {
    let dir = scratch("chat-vars");
    let model = folder_with_template(
        &dir,
        "{% for m in messages %}{{ m['content'] }}{% endfor %}|\
         {% if not enable_thinking %}<think></think>{% endif %}{{ tone | default('') }}",
    );
    let render = |vars: &[&str]| render_chat(&model, vars, "Total?");
    assert_eq!(render(&[]), "Total?|<think></think>");
    assert_eq!(
        render(&["enable_thinking=true", "tone=terse"]),
        "Total?|terse"
    );
    let bad = quarry(&["chat-template", "--chat-var", "novalue", "x"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        !bad.status.success() && err.contains("`novalue` is not KEY=VALUE"),
        "{err}"
    );
}

/// A folder of tokenizer files alone (the Hub's Qwen3 and Llama 3 ones the set-up installs) is
/// enough for `chat-template` and `tokenize`: Qwen3's real template opens the reply after an empty
/// think block unless `enable_thinking` is set, and the folder tokenizes as the same vocabulary
/// written as a GGUF does.
#[test]
fn tokenizer_commands_take_a_folder_of_tokenizer_files() {
    let qwen3 = root().join("models/hub-tokenizers/qwen3");
    let render = |vars: &[&str]| render_chat(&qwen3, vars, "Total?");
    let (off, on) = (render(&[]), render(&["enable_thinking=true"]));
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off}"
    );
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on}");
    let llama3 = root().join("models/hub-tokenizers/llama3");
    let ids = |model: &Path| {
        let o = quarry(&[
            "tokenize",
            "--json",
            "--model",
            model.to_str().unwrap(),
            "Tiếng Việt có dấu",
        ]);
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["ids"].clone()
    };
    let (folder, gguf) = (ids(&llama3), ids(&llama3.join("vocab.gguf")));
    assert_eq!(folder, gguf);
    assert!(folder.as_array().is_some_and(|a| a.len() == 6), "{folder}");
}
