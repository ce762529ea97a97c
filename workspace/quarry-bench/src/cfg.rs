//! The context-free constraint cases of `cfg-bench`: GBNF grammars (with the same language in
//! llguidance's Lark syntax), recursive JSON Schemas and `json_object`, each with a realistic
//! output the walk follows token by token.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use crate::peers::Spec;

pub struct CfgCase {
    pub name: &'static str,
    pub spec: Spec,
    pub text: String,
}

fn grammar(name: &str) -> Result<Spec> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    Ok(Spec::Grammar {
        gbnf: read(&root.join(format!("../quarry-grammar/tests/grammars/{name}.gbnf")))?,
        lark: read(&root.join(format!("../quarry-grammar/tests/grammars/{name}.lark")))?,
    })
}

/// A tree of named nodes.
pub fn tree_schema() -> serde_json::Value {
    json!({
        "$defs": {"node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "size": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            },
            "required": ["name", "children"],
            "additionalProperties": false
        }},
        "$ref": "#/$defs/node"
    })
}

/// A comment thread: each comment has replies, which are comments.
pub fn thread_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "author": {"type": "string"},
            "text": {"type": "string"},
            "score": {"type": "integer"},
            "replies": {"type": "array", "items": {"$ref": "#"}}
        },
        "required": ["author", "text", "replies"],
        "additionalProperties": false
    })
}

pub fn cases() -> Result<Vec<CfgCase>> {
    let tree = r#"{"name":"src","size":4096,"children":[{"name":"main.rs","size":812,"children":[]},{"name":"grammar","children":[{"name":"cfg.rs","size":9312,"children":[]},{"name":"gbnf","children":[{"name":"parse.rs","size":10240,"children":[]}]}]},{"name":"README.md","size":2210,"children":[]}]}"#;
    let thread = r#"{"author":"ada","text":"Does the grammar handle recursion natively?","score":12,"replies":[{"author":"grace","text":"Yes: a pushdown layer over the regex DFA.","score":7,"replies":[{"author":"ada","text":"And ambiguous grammars?","replies":[{"author":"grace","text":"Merged stacks, with a work limit.","score":3,"replies":[]}]}]},{"author":"alan","text":"Benchmarks or it did not happen.","score":-1,"replies":[]}]}"#;
    let object = r#"{"id":"pkg-1942","tags":["cli","json",{"lang":"rust","stars":[1,2,[3,[4,{"deep":true}]]]}],"meta":{"created":"2026-11-25","ok":null,"ratio":0.75}}"#;
    let json_doc = "{\"name\": \"quarry\", \"version\": [0, 27, 1],\n  \"deps\": [{\"name\": \"regex-automata\", \"features\": [\"dfa\", \"syntax\"]}, {\"name\": \"tokenizers\", \"optional\": false}],\n  \"score\": -1.5e3}";
    Ok(vec![
        CfgCase {
            name: "gbnf-json",
            spec: grammar("json")?,
            text: json_doc.into(),
        },
        CfgCase {
            name: "gbnf-arith",
            spec: grammar("arithmetic")?,
            text: "((12 + 7) * -(3 - 40)) / (5 * (2 + (9 - 4))) - 1000 * (((1)))".into(),
        },
        CfgCase {
            name: "gbnf-sql",
            spec: grammar("sql")?,
            text: "SELECT id, name, email FROM users WHERE (age >= 18 AND NOT country = 'FR') OR id < 100 ORDER BY name DESC LIMIT 25;".into(),
        },
        CfgCase {
            name: "gbnf-csv",
            spec: grammar("csv")?,
            text: "name,city,quote\nAda,London,\"said \"\"hello\"\", then left\"\nGrace,Arlington,\nAlan,Wilmslow,\"a, b\"\n".into(),
        },
        CfgCase {
            name: "schema-tree",
            spec: Spec::Schema(tree_schema()),
            text: tree.into(),
        },
        CfgCase {
            name: "schema-thread",
            spec: Spec::Schema(thread_schema()),
            text: thread.into(),
        },
        CfgCase {
            name: "json-object",
            spec: Spec::JsonObject,
            text: object.into(),
        },
    ])
}
