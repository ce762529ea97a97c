//! JSON Schema → a regex over quarry's canonical JSON text, compiled by the same DFA machinery as
//! any regex constraint.
//!
//! # Output form
//! - Canonical JSON: object properties in schema order (`properties`), then any additional
//!   properties; strings escaped exactly as `serde_json` writes them (`\"`, `\\`, `\b \f \n \r \t`,
//!   other control characters as `\u00xx`, everything else raw UTF-8).
//! - Whitespace: [`Whitespace::Compact`] (none, the default) or [`Whitespace::Pretty`], which allows
//!   up to `max_run` whitespace bytes around each structural character. Never unbounded.
//! - Optional properties may be omitted. With `strict`, a missing `additionalProperties` means
//!   `false` (OpenAI structured-outputs semantics); without it, the schema's own rule applies.
//! - Where a schema allows *any* value (`true`, an absent `items`, additional properties), the
//!   values generated are JSON nested at most [`SchemaOptions::any_value_depth`] levels deep.
//!
//! # Drafts
//! `$schema` selects draft 4, 6, 7, 2019-09 or 2020-12 (the default). Where drafts differ, the
//! declared draft is honoured: `items` as an array with `additionalItems` (before 2020-12) versus
//! `prefixItems` + `items`; `exclusiveMinimum`/`exclusiveMaximum` as booleans (draft 4) versus
//! numbers; `$ref` siblings ignored (before 2019-09) versus applied.
//!
//! # Keywords: the contract
//! Supported:
//! - types: `type` (a name or an array of names, `null` included), `enum`, `const` (filtered by the
//!   schema's other keywords);
//! - objects: `properties`, `required`, `additionalProperties` (boolean or schema),
//!   `minProperties`/`maxProperties` (up to 32), `dependentRequired` (draft 4–7: `dependencies`
//!   with name lists) over at most 6 declared properties;
//! - arrays: `items`, `prefixItems`, `additionalItems`, `minItems`, `maxItems`; `uniqueItems` when
//!   `maxItems` ≤ 1 or the items are at most 6 values (`enum`, `const`, boolean); `contains` with `minContains` on arrays whose items are otherwise
//!   unconstrained;
//! - strings: `minLength`, `maxLength` (code points), `pattern` (alone: a search, as ECMA-262 has it),
//!   `format` for `date`, `time`, `date-time`, `uuid`, `ipv4`, and conservative subsets (every value
//!   allowed is valid) of `ipv6` (uncompressed), `hostname`, `email`, `duration`, `uri` and
//!   `uri-reference`;
//! - numbers: the exact JSON number grammar (no leading zeros; fraction; exponent), bounded to at
//!   most 18 integer digits, 18 fraction digits and a 2-digit exponent so every output parses as an
//!   `f64` and digits cannot run to `max_tokens`; `minimum`,
//!   `maximum`, `exclusiveMinimum`, `exclusiveMaximum` as exact digit languages for integers;
//!   for `number`, a lower bound of 0 (inclusive or exclusive); `multipleOf: 1` on integers;
//! - combinators: `anyOf`; `oneOf` whose branches are of pairwise different types; `allOf`, merged
//!   keyword by keyword where that is exact (types intersected, `required` united, `properties`
//!   merged per name, the tighter of two bounds, `enum` intersected); keywords next to
//!   `anyOf`/`oneOf` are merged into each branch; `not: {type: …}` (and `not: true/false`);
//! - references: local `$ref` (`#`, `#/$defs/…`, `#/definitions/…`, any JSON Pointer into the
//!   document), `$defs`, `definitions`.
//!
//! Ignored (annotations): `title`, `description`, `examples`, `default`, `$comment`, `deprecated`,
//! `readOnly`, `writeOnly`, `$schema`, `$id`, `$anchor`, `$dynamicAnchor`, `$vocabulary`,
//! `contentMediaType`, `contentEncoding`, `contentSchema`.
//!
//! A typed [`SchemaError::Unsupported`] naming the keyword and its JSON Pointer, never a silent drop:
//! `patternProperties`, `propertyNames`, schema-valued `dependencies`, `dependentSchemas`,
//! dependencies over more than 6 properties or involving additional properties, other `contains`,
//! `maxContains`, other `uniqueItems: true`, other `not`, `if`/`then`/`else`,
//! `unevaluatedProperties`, `unevaluatedItems`, `$dynamicRef`, `$recursiveRef`, other
//! `multipleOf`, bounds on non-integer numbers other than 0, other formats, `pattern` together with
//! a length or a format, `allOf` branches that set the same other keyword differently or split a
//! coupled pair (`properties`/`additionalProperties`, `prefixItems`/`items`), `oneOf` whose
//! branches may overlap, remote references, and recursive references. (From 2019-09, keywords next
//! to `$ref` are merged into its target.) Keywords that the declared draft does not define
//! (`dependencies` in 2019-09 and later, `dependentRequired` before) are ignored, as validators of
//! that draft ignore them.
//! Any other keyword is [`SchemaError::UnknownKeyword`], unless
//! [`SchemaOptions::ignore_unknown_keywords`] is set.

use serde_json::{json, Map, Value};

/// Whitespace the output may contain between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Whitespace {
    /// No whitespace at all: `{"a":1,"b":[true]}`.
    #[default]
    Compact,
    /// Up to `max_run` bytes of space, tab, CR or LF around each structural character.
    Pretty { max_run: u8 },
}

/// How a schema becomes a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaOptions {
    pub whitespace: Whitespace,
    /// A missing `additionalProperties` means `false`.
    pub strict: bool,
    /// Nesting depth of values generated where the schema allows any value. Default 2.
    pub any_value_depth: usize,
    /// Treat keywords this module does not know (`markdownDescription`, `x-…` vendor extensions)
    /// as annotations, as JSON Schema validators do, instead of failing with
    /// [`SchemaError::UnknownKeyword`]. Default false: a typo such as `propertees` is an error.
    pub ignore_unknown_keywords: bool,
}

impl Default for SchemaOptions {
    fn default() -> Self {
        Self {
            whitespace: Whitespace::Compact,
            strict: false,
            any_value_depth: 2,
            ignore_unknown_keywords: false,
        }
    }
}

/// Why a schema cannot be turned into a constraint. `pointer` is the JSON Pointer of the
/// subschema (`#/properties/age`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("unsupported `{keyword}` at {pointer}: {reason}")]
    Unsupported {
        keyword: String,
        pointer: String,
        reason: String,
    },
    #[error("unknown keyword `{keyword}` at {pointer}")]
    UnknownKeyword { keyword: String, pointer: String },
    #[error("invalid schema at {pointer}: {message}")]
    Invalid { pointer: String, message: String },
}

type Result<T> = std::result::Result<T, SchemaError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Draft {
    D4,
    D6,
    D7,
    D2019,
    D2020,
}

/// One code point of a JSON string, as canonical JSON writes it.
const STR_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u00[01][0-9a-f])"#;
/// Numbers are bounded so that every output parses as an `f64` (serde_json, Python and JavaScript
/// refuse or round to infinity beyond ±1.8e308) and a model cannot run digits to `max_tokens`: at
/// most 18 integer digits, 18 fraction digits and a 2-digit exponent.
const NUMBER: &str = r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,18})?(?:[eE][+-]?[0-9]{1,2})?";
const INTEGER: &str = r"-?(?:0|[1-9][0-9]{0,17})";
const FRAC_EXP: &str = r"(?:\.[0-9]{1,18})?(?:[eE][+-]?[0-9]{1,2})?";
const EXP: &str = r"(?:[eE][+-]?[0-9]{1,2})?";
/// A regex with an empty language.
const NOTHING: &str = r"[^\x00-\x{10FFFF}]";

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$schema",
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
    "$defs",
    "definitions",
];

const SUPPORTED: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "not",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependencies",
];

const UNSUPPORTED: &[&str] = &[
    "patternProperties",
    "propertyNames",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
    "$recursiveAnchor",
];

const TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "string"];

/// The regex (over canonical JSON text, full match) of the instances `schema` accepts.
pub fn schema_to_regex(schema: &Value, options: &SchemaOptions) -> Result<String> {
    let draft = match schema.get("$schema").and_then(Value::as_str) {
        Some(s) if s.contains("draft-04") => Draft::D4,
        Some(s) if s.contains("draft-06") => Draft::D6,
        Some(s) if s.contains("draft-07") => Draft::D7,
        Some(s) if s.contains("2019-09") => Draft::D2019,
        _ => Draft::D2020,
    };
    let ws = match options.whitespace {
        Whitespace::Compact => String::new(),
        Whitespace::Pretty { max_run } => format!("[ \\t\\n\\r]{{0,{max_run}}}"),
    };
    let mut t = Translator {
        root: schema,
        options,
        draft,
        ws,
        refs: Vec::new(),
    };
    t.value(schema, "#")
}

struct Translator<'a> {
    root: &'a Value,
    options: &'a SchemaOptions,
    draft: Draft,
    /// Whitespace between tokens.
    ws: String,
    /// References being expanded (cycle detection).
    refs: Vec<String>,
}

fn unsupported(keyword: &str, pointer: &str, reason: &str) -> SchemaError {
    SchemaError::Unsupported {
        keyword: keyword.into(),
        pointer: pointer.into(),
        reason: reason.into(),
    }
}

fn invalid(pointer: &str, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        pointer: pointer.into(),
        message: message.into(),
    }
}

fn child(pointer: &str, key: &str) -> String {
    format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn alt(parts: &[String]) -> String {
    match parts.len() {
        0 => NOTHING.to_owned(),
        1 => parts[0].clone(),
        _ => format!("(?:{})", parts.join("|")),
    }
}

/// A value's canonical JSON text as a regex literal.
fn literal(v: &Value) -> String {
    regex_syntax::escape(&serde_json::to_string(v).expect("a Value serializes"))
}

/// An `enum`/`const` value as a regex: its canonical text, where a number with an integral value
/// may also be written with `.0` (JSON Schema compares numbers by value: `1` and `1.0` are equal).
fn value_literal(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                let i = f as i64;
                format!("(?:{i}|{i}\\.0)")
            }
            _ => literal(v),
        },
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(value_literal).collect();
            format!("\\[{}\\]", items.join(","))
        }
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .map(|(k, x)| {
                    format!(
                        "{}:{}",
                        literal(&Value::String(k.clone())),
                        value_literal(x)
                    )
                })
                .collect();
            format!("\\{{{}\\}}", members.join(","))
        }
        _ => literal(v),
    }
}

fn as_count(v: &Value, pointer: &str, keyword: &str) -> Result<u64> {
    v.as_u64()
        .or_else(|| {
            v.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                .map(|f| f as u64)
        })
        .ok_or_else(|| invalid(&child(pointer, keyword), "expected a non-negative integer"))
}

impl Translator<'_> {
    /// The regex of values that `schema` (at `pointer`) accepts.
    fn value(&mut self, schema: &Value, pointer: &str) -> Result<String> {
        let m = match schema {
            Value::Bool(true) => return Ok(self.any_value(self.options.any_value_depth)),
            Value::Bool(false) => return Ok(NOTHING.to_owned()),
            Value::Object(m) => m,
            _ => return Err(invalid(pointer, "a schema is an object or a boolean")),
        };
        for k in m.keys() {
            let k = k.as_str();
            if UNSUPPORTED.contains(&k) {
                return Err(unsupported(k, pointer, "this keyword is not supported yet"));
            }
            if !SUPPORTED.contains(&k)
                && !ANNOTATIONS.contains(&k)
                && !self.options.ignore_unknown_keywords
            {
                return Err(SchemaError::UnknownKeyword {
                    keyword: k.into(),
                    pointer: pointer.into(),
                });
            }
        }
        if let Some(r) = m.get("$ref") {
            return self.reference(m, r, pointer);
        }
        for comb in ["anyOf", "oneOf", "allOf"] {
            if let Some(branches) = m.get(comb) {
                return self.combinator(m, comb, branches, pointer);
            }
        }
        if m.contains_key("enum") || m.contains_key("const") {
            return self.enumeration(m, pointer);
        }
        let types: Vec<&str> = match m.get("type") {
            None => TYPES.to_vec(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| invalid(pointer, "type names are strings"))
                })
                .collect::<Result<_>>()?,
            Some(_) => {
                return Err(invalid(
                    &child(pointer, "type"),
                    "expected a string or array",
                ))
            }
        };
        let types = self.without_negated_types(m, types, pointer)?;
        let mut parts = Vec::new();
        let has_number = types.contains(&"number");
        for t in &types {
            let r = match *t {
                "null" => "null".to_owned(),
                "boolean" => "(?:true|false)".to_owned(),
                "object" => self.object(m, pointer)?,
                "array" => self.array(m, pointer)?,
                "string" => self.string(m, pointer)?,
                "number" => self.number(m, pointer)?,
                // Integers are numbers: covered by "number" when both are listed.
                "integer" if has_number => continue,
                "integer" => self.integer(m, pointer)?,
                other => {
                    return Err(invalid(
                        &child(pointer, "type"),
                        format!("unknown type {other:?}"),
                    ))
                }
            };
            parts.push(r);
        }
        Ok(alt(&parts))
    }

    /// Applies `not` where it is decidable here: `not: {type: …}` removes those types (`number`
    /// takes `integer` with it; removing only `integer` from `number` is not supported),
    /// `not: false` removes nothing. Any other `not` is unsupported.
    fn without_negated_types<'t>(
        &self,
        m: &Map<String, Value>,
        mut types: Vec<&'t str>,
        pointer: &str,
    ) -> Result<Vec<&'t str>> {
        let Some(not) = m.get("not") else {
            return Ok(types);
        };
        let here = child(pointer, "not");
        let refuse = || {
            unsupported(
                "not",
                pointer,
                "only `not: {type: …}` and `not: false` are supported yet",
            )
        };
        let excluded: Vec<String> = match not {
            Value::Bool(false) => return Ok(types),
            Value::Bool(true) => return Ok(Vec::new()),
            Value::Object(n) => {
                if Self::constraining(n, &[]) != ["type"] {
                    return Err(refuse());
                }
                match &n["type"] {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(ts) => ts
                        .iter()
                        .map(|t| {
                            t.as_str()
                                .map(str::to_owned)
                                .ok_or_else(|| invalid(&here, "type names are strings"))
                        })
                        .collect::<Result<_>>()?,
                    _ => return Err(invalid(&here, "expected a string or array")),
                }
            }
            _ => return Err(invalid(&here, "a schema is an object or a boolean")),
        };
        let gone = |t: &str| {
            excluded
                .iter()
                .any(|e| e == t || (e == "number" && t == "integer"))
        };
        if excluded.iter().any(|e| e == "integer") && types.contains(&"number") && !gone("number") {
            return Err(unsupported(
                "not",
                pointer,
                "numbers that are not integers are not supported yet",
            ));
        }
        types.retain(|t| !gone(t));
        Ok(types)
    }

    /// Keywords other than annotations and those listed.
    fn constraining<'m>(m: &'m Map<String, Value>, except: &[&str]) -> Vec<&'m str> {
        m.keys()
            .map(String::as_str)
            .filter(|k| !ANNOTATIONS.contains(k) && !except.contains(k))
            .collect()
    }

    fn reference(&mut self, m: &Map<String, Value>, r: &Value, pointer: &str) -> Result<String> {
        let r = r
            .as_str()
            .ok_or_else(|| invalid(&child(pointer, "$ref"), "expected a string"))?;
        if self.draft >= Draft::D2019 && !Self::constraining(m, &["$ref"]).is_empty() {
            // Keywords next to $ref apply too: merge them into the target.
            let merged = self.inline_ref(&Value::Object(m.clone()), pointer, 0)?;
            return self.value(&merged, pointer);
        }
        let Some(fragment) = r.strip_prefix('#') else {
            return Err(unsupported(
                "$ref",
                pointer,
                &format!("remote reference {r:?}; only local references (#…) are supported"),
            ));
        };
        if self.refs.iter().any(|x| x == r) {
            return Err(unsupported(
                "$ref",
                pointer,
                &format!("recursive reference {r:?}"),
            ));
        }
        let decoded = percent_decode(fragment);
        let target = if decoded.is_empty() {
            Some(self.root)
        } else if decoded.starts_with('/') {
            self.root.pointer(&decoded)
        } else {
            None
        };
        let target = target.ok_or_else(|| {
            unsupported(
                "$ref",
                pointer,
                &format!("{r:?} does not resolve to a subschema of this document"),
            )
        })?;
        self.refs.push(r.to_owned());
        let out = self.value(target, r);
        self.refs.pop();
        out
    }

    fn combinator(
        &mut self,
        m: &Map<String, Value>,
        comb: &str,
        branches: &Value,
        pointer: &str,
    ) -> Result<String> {
        let branches = branches
            .as_array()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| invalid(&child(pointer, comb), "expected a non-empty array"))?;
        // The schema's own keywords apply to every branch: intersection distributes over union.
        let mut rest = m.clone();
        rest.remove(comb);
        let rest = Value::Object(rest);
        let has_rest = !Self::constraining(rest.as_object().unwrap(), &[]).is_empty();
        let here = child(pointer, comb);
        if comb == "allOf" {
            let mut acc = rest;
            for b in branches {
                acc = self.merge(&acc, b, pointer, 0)?;
            }
            return self.value(&acc, pointer);
        }
        let branches: Vec<Value> = if has_rest {
            branches
                .iter()
                .map(|b| self.merge(&rest, b, pointer, 0))
                .collect::<Result<_>>()?
        } else {
            branches.clone()
        };
        if comb == "oneOf" {
            // Sound only when no instance can match two branches: require each branch to declare
            // a single type, all different ("integer" overlaps "number").
            let mut seen = Vec::new();
            for b in &branches {
                let t = match b.get("type").and_then(Value::as_str) {
                    Some("integer") => Some("number"),
                    t => t,
                };
                match t {
                    Some(t) if !seen.contains(&t) => seen.push(t),
                    _ => {
                        return Err(unsupported(
                            "oneOf",
                            pointer,
                            "branches must be of pairwise different types to be provably disjoint",
                        ))
                    }
                }
            }
        }
        self.branches(&branches, &here)
    }

    /// A `$ref`-only schema replaced by its target (with the other keywords merged in, from
    /// 2019-09 on). Other schemas are returned as they are.
    fn inline_ref(&mut self, s: &Value, pointer: &str, depth: usize) -> Result<Value> {
        let Some(r) = s.get("$ref") else {
            return Ok(s.clone());
        };
        if depth > 16 {
            return Err(unsupported(
                "$ref",
                pointer,
                "reference chain too deep to merge",
            ));
        }
        let r = r
            .as_str()
            .ok_or_else(|| invalid(&child(pointer, "$ref"), "expected a string"))?;
        let target = r
            .strip_prefix('#')
            .map(percent_decode)
            .and_then(|f| {
                if f.is_empty() {
                    Some(self.root)
                } else {
                    self.root.pointer(&f)
                }
            })
            .ok_or_else(|| unsupported("$ref", pointer, &format!("cannot merge {r:?}")))?
            .clone();
        let target = self.inline_ref(&target, pointer, depth + 1)?;
        let mut rest = s.as_object().unwrap().clone();
        rest.remove("$ref");
        if self.draft < Draft::D2019 || Self::constraining(&rest, &[]).is_empty() {
            return Ok(target);
        }
        self.merge(&target, &Value::Object(rest), pointer, depth + 1)
    }

    /// The intersection of two schemas as one schema, where keyword-by-keyword merging is exact.
    fn merge(&mut self, a: &Value, b: &Value, pointer: &str, depth: usize) -> Result<Value> {
        let a = self.inline_ref(a, pointer, depth)?;
        let b = self.inline_ref(b, pointer, depth)?;
        let (a, b) = match (a, b) {
            (Value::Bool(false), _) | (_, Value::Bool(false)) => return Ok(Value::Bool(false)),
            (Value::Bool(true), x) | (x, Value::Bool(true)) => return Ok(x),
            (Value::Object(a), Value::Object(b)) => (a, b),
            _ => return Err(invalid(pointer, "a schema is an object or a boolean")),
        };
        // Nested allOf: flatten first.
        let flatten = |t: &mut Self, m: Map<String, Value>| -> Result<Value> {
            match m.get("allOf").and_then(Value::as_array).cloned() {
                Some(bs) => {
                    let mut rest = m;
                    rest.remove("allOf");
                    let mut acc = Value::Object(rest);
                    for x in &bs {
                        acc = t.merge(&acc, x, pointer, depth + 1)?;
                    }
                    Ok(acc)
                }
                None => Ok(Value::Object(m)),
            }
        };
        let (a, b) = (flatten(self, a)?, flatten(self, b)?);
        let (mut out, b) = match (a, b) {
            (Value::Object(a), Value::Object(b)) => (a, b),
            (a, b) => return self.merge(&a, &b, pointer, depth + 1),
        };
        // Keywords whose meaning depends on a sibling in the same schema object.
        const COUPLED: &[(&str, &str)] = &[
            ("additionalProperties", "properties"),
            ("items", "prefixItems"),
            ("additionalItems", "items"),
        ];
        for (x, y) in COUPLED {
            // `x` is read against its own object's `y`: merging is exact only if `y` is the same
            // on both sides (allOf [{properties: a, additionalProperties: false},
            // {properties: b, additionalProperties: false}] admits neither a nor b).
            let same_y = match (out.get(*y), b.get(*y)) {
                (None, None) => true,
                (Some(p), Some(q)) => json_equal(p, q),
                _ => false,
            };
            if (out.contains_key(*x) || b.contains_key(*x)) && !same_y {
                return Err(unsupported(
                    x,
                    pointer,
                    &format!(
                        "merging `{x}` with `{y}` from another allOf branch is not supported yet"
                    ),
                ));
            }
        }
        for (k, vb) in b {
            if ANNOTATIONS.contains(&k.as_str()) && k != "$defs" && k != "definitions" {
                continue;
            }
            let Some(va) = out.get(&k).cloned() else {
                out.insert(k, vb);
                continue;
            };
            if json_equal(&va, &vb) {
                continue;
            }
            let merged =
                match k.as_str() {
                    "type" => {
                        let list = |v: &Value| -> Vec<String> {
                            match v {
                                Value::String(s) => vec![s.clone()],
                                Value::Array(a) => a
                                    .iter()
                                    .filter_map(|x| x.as_str().map(str::to_owned))
                                    .collect(),
                                _ => Vec::new(),
                            }
                        };
                        let (ta, tb) = (list(&va), list(&vb));
                        let has = |l: &[String], t: &str| l.iter().any(|x| x == t);
                        let mut both: Vec<Value> = Vec::new();
                        for t in &ta {
                            let keep = has(&tb, t) || (t == "integer" && has(&tb, "number"));
                            if keep {
                                both.push(json!(t));
                            } else if t == "number" && has(&tb, "integer") {
                                both.push(json!("integer"));
                            }
                        }
                        Value::Array(both)
                    }
                    "required" => {
                        let mut r = va.as_array().cloned().unwrap_or_default();
                        for x in vb.as_array().cloned().unwrap_or_default() {
                            if !r.contains(&x) {
                                r.push(x);
                            }
                        }
                        Value::Array(r)
                    }
                    "properties" | "$defs" | "definitions" => {
                        let mut p = va.as_object().cloned().unwrap_or_default();
                        for (name, s) in vb.as_object().cloned().unwrap_or_default() {
                            let v = match p.get(&name) {
                                Some(prev) if k == "properties" => json!({ "allOf": [prev, s] }),
                                Some(prev) => prev.clone(),
                                None => s,
                            };
                            p.insert(name, v);
                        }
                        Value::Object(p)
                    }
                    "minimum" | "minLength" | "minItems" => {
                        json!(va.as_f64().unwrap_or(0.0).max(vb.as_f64().unwrap_or(0.0)))
                    }
                    "maximum" | "maxLength" | "maxItems" => {
                        json!(va
                            .as_f64()
                            .unwrap_or(f64::MAX)
                            .min(vb.as_f64().unwrap_or(f64::MAX)))
                    }
                    "exclusiveMinimum" if self.draft > Draft::D4 => {
                        json!(va.as_f64().unwrap_or(0.0).max(vb.as_f64().unwrap_or(0.0)))
                    }
                    "exclusiveMaximum" if self.draft > Draft::D4 => {
                        json!(va
                            .as_f64()
                            .unwrap_or(f64::MAX)
                            .min(vb.as_f64().unwrap_or(f64::MAX)))
                    }
                    "enum" => {
                        let bv = vb.as_array().cloned().unwrap_or_default();
                        Value::Array(
                            va.as_array()
                                .cloned()
                                .unwrap_or_default()
                                .into_iter()
                                .filter(|x| bv.iter().any(|y| json_equal(x, y)))
                                .collect(),
                        )
                    }
                    "const" => return Ok(Value::Bool(false)),
                    other => return Err(unsupported(
                        other,
                        pointer,
                        "two allOf branches set it differently; merging it is not supported yet",
                    )),
                };
            out.insert(k, merged);
        }
        Ok(Value::Object(out))
    }

    fn branches(&mut self, branches: &[Value], pointer: &str) -> Result<String> {
        let parts = branches
            .iter()
            .enumerate()
            .map(|(i, b)| self.value(b, &child(pointer, &i.to_string())))
            .collect::<Result<Vec<_>>>()?;
        Ok(alt(&parts))
    }

    /// `enum`/`const`, keeping only the values the rest of the schema accepts.
    fn enumeration(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        let mut values: Vec<Value> = match m.get("enum") {
            Some(Value::Array(vs)) => vs.clone(),
            Some(_) => return Err(invalid(&child(pointer, "enum"), "expected an array")),
            None => Vec::new(),
        };
        if let Some(c) = m.get("const") {
            values = if m.contains_key("enum") {
                values.into_iter().filter(|v| json_equal(v, c)).collect()
            } else {
                vec![c.clone()]
            };
        }
        let mut rest = m.clone();
        rest.remove("enum");
        rest.remove("const");
        let keep: Vec<String> = if Self::constraining(&rest, &[]).is_empty() {
            values.iter().map(value_literal).collect()
        } else {
            let rest_re = self.value(&Value::Object(rest), pointer)?;
            let full = regex_automata::dfa::regex::Regex::new(&format!("^(?:{rest_re})$"))
                .map_err(|e| unsupported("enum", pointer, &format!("filtering the values: {e}")))?;
            values
                .iter()
                .filter(|v| full.is_match(serde_json::to_string(v).unwrap().as_bytes()))
                .map(value_literal)
                .collect()
        };
        Ok(alt(&keep))
    }

    fn any_value(&self, depth: usize) -> String {
        let scalar = format!("(?:null|true|false|{NUMBER}|\"{STR_CHAR}*\")");
        if depth == 0 {
            return scalar;
        }
        let inner = self.any_value(depth - 1);
        let w = &self.ws;
        let member = format!("\"{STR_CHAR}*\"{w}:{w}{inner}");
        format!(
            "(?:{scalar}|\\[{w}(?:{inner}(?:{w},{w}{inner})*)?{w}\\]|\\{{{w}(?:{member}(?:{w},{w}{member})*)?{w}\\}})"
        )
    }

    fn object(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        let empty = Map::new();
        let props = match m.get("properties") {
            Some(Value::Object(p)) => p,
            Some(_) => return Err(invalid(&child(pointer, "properties"), "expected an object")),
            None => &empty,
        };
        let required: Vec<&str> = match m.get("required") {
            Some(Value::Array(r)) => r
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| invalid(&child(pointer, "required"), "expected strings"))
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(invalid(&child(pointer, "required"), "expected an array")),
            None => Vec::new(),
        };
        let extra_schema = match m.get("additionalProperties") {
            Some(s) => s.clone(),
            None if self.options.strict => Value::Bool(false),
            None => Value::Bool(true),
        };
        // (name, value regex, required) in canonical order; required names the schema does not
        // describe come after `properties`, with the additional-properties schema.
        let mut items: Vec<(String, String, bool)> = Vec::new();
        let pp = child(pointer, "properties");
        for (name, s) in props {
            let v = self.value(s, &child(&pp, name))?;
            items.push((name.clone(), v, required.contains(&name.as_str())));
        }
        let ap = child(pointer, "additionalProperties");
        for name in &required {
            if !props.contains_key(*name) {
                let v = self.value(&extra_schema, &ap)?;
                items.push(((*name).to_owned(), v, true));
            }
        }
        let w = self.ws.clone();
        let extra = if extra_schema == Value::Bool(false) {
            None
        } else {
            let names: Vec<&str> = items.iter().map(|(n, _, _)| n.as_str()).collect();
            let key = key_not_in(&names);
            let v = self.value(&extra_schema, &ap)?;
            Some(format!("{key}{w}:{w}{v}"))
        };
        let member = |(name, v, _): &(String, String, bool)| {
            format!("{}{w}:{w}{v}", literal(&Value::String(name.clone())))
        };
        let min_p = m
            .get("minProperties")
            .map(|v| as_count(v, pointer, "minProperties"))
            .transpose()?;
        let max_p = m
            .get("maxProperties")
            .map(|v| as_count(v, pointer, "maxProperties"))
            .transpose()?;
        let deps = self.dependencies(m, &items, extra.is_some(), pointer)?;
        if min_p.is_some() || max_p.is_some() || !deps.is_empty() {
            let (lo, hi) = (min_p.unwrap_or(0), max_p);
            if lo > 32 || hi.is_some_and(|h| h > 32) {
                return Err(unsupported(
                    "maxProperties",
                    pointer,
                    "property counts above 32 are not supported yet",
                ));
            }
            let members: Vec<(String, bool)> = items.iter().map(|it| (member(it), it.2)).collect();
            let body = counted_members(&members, extra.as_deref(), lo, hi, &deps, &w);
            return Ok(format!("\\{{{w}{body}{w}\\}}"));
        }
        // head(i): members from i on when none was written yet; tail(i): after one was.
        let mut tail = match &extra {
            Some(e) => format!("(?:{w},{w}{e})*"),
            None => String::new(),
        };
        let mut head = match &extra {
            Some(e) => format!("(?:{e}{tail})?"),
            None => String::new(),
        };
        for it in items.iter().rev() {
            let mem = member(it);
            let (new_head, new_tail) = if it.2 {
                (format!("{mem}{tail}"), format!("{w},{w}{mem}{tail}"))
            } else {
                (
                    format!("(?:{mem}{tail}|{head})"),
                    format!("(?:{w},{w}{mem})?{tail}"),
                )
            };
            head = new_head;
            tail = new_tail;
        }
        Ok(format!("\\{{{w}{head}{w}\\}}"))
    }

    /// `dependentRequired` (and draft 4–7 `dependencies` with name lists) as (trigger, dependent)
    /// indexes into `items`. A pair whose trigger is never written is dropped; one that would need
    /// an additional property tracked is unsupported.
    fn dependencies(
        &self,
        m: &Map<String, Value>,
        items: &[(String, String, bool)],
        extras_allowed: bool,
        pointer: &str,
    ) -> Result<Vec<(usize, usize)>> {
        let key = if self.draft >= Draft::D2019 {
            "dependentRequired"
        } else {
            "dependencies"
        };
        let Some(deps) = m.get(key) else {
            return Ok(Vec::new());
        };
        let here = child(pointer, key);
        let deps = deps
            .as_object()
            .ok_or_else(|| invalid(&here, "expected an object"))?;
        let index = |n: &str| items.iter().position(|(name, _, _)| name == n);
        let mut out = Vec::new();
        for (trigger, needed) in deps {
            let Value::Array(needed) = needed else {
                return Err(unsupported(
                    key,
                    &here,
                    "schema dependencies are not supported yet",
                ));
            };
            let t = match index(trigger) {
                Some(t) => t,
                None if extras_allowed => {
                    return Err(unsupported(
                        key,
                        &here,
                        &format!("trigger {trigger:?} could be an additional property"),
                    ))
                }
                None => continue, // never written: the dependency is vacuous
            };
            for d in needed {
                let d = d
                    .as_str()
                    .ok_or_else(|| invalid(&here, "expected property names"))?;
                match index(d) {
                    Some(d) => out.push((t, d)),
                    // The dependent can never be written: the trigger must not be either.
                    None if !extras_allowed => out.push((t, usize::MAX)),
                    None => {
                        return Err(unsupported(
                            key,
                            &here,
                            &format!("dependent {d:?} could only be an additional property"),
                        ))
                    }
                }
            }
        }
        let tracked: std::collections::BTreeSet<usize> = out
            .iter()
            .flat_map(|&(a, b)| [a, b])
            .filter(|&x| x != usize::MAX)
            .collect();
        if tracked.len() > 6 {
            return Err(unsupported(
                key,
                &here,
                "more than 6 properties in dependencies are not supported yet",
            ));
        }
        Ok(out)
    }

    fn array(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        if m.contains_key("contains")
            || m.contains_key("minContains")
            || m.contains_key("maxContains")
        {
            return self.array_contains(m, pointer);
        }
        let at_most_one = m
            .get("maxItems")
            .and_then(Value::as_f64)
            .is_some_and(|x| x <= 1.0);
        if m.get("uniqueItems") == Some(&Value::Bool(true)) && !at_most_one {
            if let Some(values) = self.finite_items(m) {
                return self.unique_array(m, &values, pointer);
            }
            return Err(unsupported(
                "uniqueItems",
                pointer,
                "uniqueItems: true is supported only over at most 6 enum, const or boolean item values",
            ));
        }
        let min = m
            .get("minItems")
            .map(|v| as_count(v, pointer, "minItems"))
            .transpose()?
            .unwrap_or(0);
        let mut max = m
            .get("maxItems")
            .map(|v| as_count(v, pointer, "maxItems"))
            .transpose()?;
        let (prefix, rest): (Vec<Value>, Value) = if self.draft >= Draft::D2020 {
            let prefix = match m.get("prefixItems") {
                Some(Value::Array(p)) => p.clone(),
                Some(_) => {
                    return Err(invalid(&child(pointer, "prefixItems"), "expected an array"))
                }
                None => Vec::new(),
            };
            (prefix, m.get("items").cloned().unwrap_or(Value::Bool(true)))
        } else {
            match m.get("items") {
                Some(Value::Array(p)) => (
                    p.clone(),
                    m.get("additionalItems")
                        .cloned()
                        .unwrap_or(Value::Bool(true)),
                ),
                Some(s) => (Vec::new(), s.clone()),
                None => (Vec::new(), Value::Bool(true)),
            }
        };
        let k = prefix.len() as u64;
        let rest_pointer =
            if self.draft >= Draft::D2020 || m.get("items").is_some_and(Value::is_object) {
                child(pointer, "items")
            } else {
                child(pointer, "additionalItems")
            };
        if rest == Value::Bool(false) {
            max = Some(max.map_or(k, |x| x.min(k)));
        }
        if max.is_some_and(|x| x < min) {
            return Ok(NOTHING.to_owned());
        }
        let prefix_pointer = if self.draft >= Draft::D2020 {
            "prefixItems"
        } else {
            "items"
        };
        let mut elems = Vec::new();
        for (i, p) in prefix.iter().enumerate() {
            if max.is_some_and(|x| i as u64 >= x) {
                break;
            }
            elems.push(self.value(p, &child(&child(pointer, prefix_pointer), &i.to_string()))?);
        }
        let rest_re = if max.is_none_or(|x| x > k) {
            Some(self.value(&rest, &rest_pointer)?)
        } else {
            None
        };
        let w = self.ws.clone();
        // build(i): elements from position i on, after i elements were written (i >= 1).
        let build_rest = |i: u64| -> String {
            let Some(r) = &rest_re else {
                return String::new();
            };
            let lo = min.saturating_sub(i);
            match max {
                Some(x) if x <= i => String::new(),
                Some(x) => format!("(?:{w},{w}{r}){{{lo},{}}}", x - i),
                None => format!("(?:{w},{w}{r}){{{lo},}}"),
            }
        };
        let mut tail = build_rest(k.max(1));
        // Prefix positions from the last down to 1 (position 0 is the first element).
        for i in (1..elems.len() as u64).rev() {
            let e = &elems[i as usize];
            let cont = format!("{w},{w}{e}{tail}");
            tail = if i >= min {
                format!("(?:{cont})?")
            } else {
                cont
            };
        }
        let first = match elems.first() {
            Some(e) => Some(e.clone()),
            None => rest_re.clone(),
        };
        let body = match first {
            None => String::new(),
            Some(_) if max == Some(0) => String::new(),
            Some(f) => {
                let seq = format!("{f}{tail}");
                if min == 0 {
                    format!("(?:{seq})?")
                } else {
                    seq
                }
            }
        };
        Ok(format!("\\[{w}{body}{w}\\]"))
    }

    /// The item values of an array whose items form a small finite set: `items` is an `enum`,
    /// a `const` or `{"type": "boolean"}` (and nothing else), with no prefix items.
    fn finite_items(&self, m: &Map<String, Value>) -> Option<Vec<Value>> {
        let allowed = ["items", "uniqueItems", "minItems", "maxItems", "type"];
        if m.keys()
            .any(|k| !allowed.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
        {
            return None;
        }
        let items = m.get("items")?.as_object()?;
        if !Self::constraining(items, &["enum", "const", "type"]).is_empty() {
            return None;
        }
        let mut values: Vec<Value> =
            match (items.get("enum"), items.get("const"), items.get("type")) {
                (Some(Value::Array(e)), None, None) => e.clone(),
                (None, Some(c), None) => vec![c.clone()],
                (None, None, Some(t)) if t == "boolean" => vec![json!(false), json!(true)],
                _ => return None,
            };
        // Values equal as JSON Schema compares them count once.
        let mut distinct: Vec<Value> = Vec::new();
        for v in values.drain(..) {
            if !distinct.iter().any(|d| json_equal(d, &v)) {
                distinct.push(v);
            }
        }
        (distinct.len() <= 6).then_some(distinct)
    }

    /// Arrays of pairwise different values from `values`: every order of every subset, within
    /// `minItems`/`maxItems`.
    fn unique_array(
        &self,
        m: &Map<String, Value>,
        values: &[Value],
        pointer: &str,
    ) -> Result<String> {
        let min = m
            .get("minItems")
            .map(|v| as_count(v, pointer, "minItems"))
            .transpose()?
            .unwrap_or(0);
        let max = m
            .get("maxItems")
            .map(|v| as_count(v, pointer, "maxItems"))
            .transpose()?
            .unwrap_or(u64::MAX)
            .min(values.len() as u64);
        let lits: Vec<String> = values.iter().map(value_literal).collect();
        let w = &self.ws;
        fn rest(used: u32, lits: &[String], min: u64, max: u64, w: &str) -> String {
            let n = used.count_ones() as u64;
            let mut alts = Vec::new();
            if n < max {
                for (i, l) in lits.iter().enumerate() {
                    if used >> i & 1 == 0 {
                        let sep = if n == 0 {
                            String::new()
                        } else {
                            format!("{w},{w}")
                        };
                        alts.push(format!(
                            "{sep}{l}{}",
                            rest(used | 1 << i, lits, min, max, w)
                        ));
                    }
                }
            }
            if n >= min {
                alts.push(String::new());
            }
            if alts.is_empty() {
                return NOTHING.to_owned();
            }
            format!("(?:{})", alts.join("|"))
        }
        if min > max {
            return Ok(NOTHING.to_owned());
        }
        Ok(format!("\\[{w}{}{w}\\]", rest(0, &lits, min, max, w)))
    }

    /// `contains` (with `minContains`) on an array whose items are otherwise unconstrained: at least
    /// k elements match, the others are any value.
    fn array_contains(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        let others = [
            "items",
            "prefixItems",
            "additionalItems",
            "minItems",
            "maxItems",
            "maxContains",
            "uniqueItems",
        ];
        if let Some(k) = others.iter().find(|k| m.contains_key(**k)) {
            return Err(unsupported(
                k,
                pointer,
                "`contains` together with this keyword is not supported yet",
            ));
        }
        let Some(c) = m.get("contains") else {
            // minContains without contains has no effect.
            return self.array(&Map::new(), pointer);
        };
        let k = match m.get("minContains") {
            Some(v) if self.draft >= Draft::D2019 => as_count(v, pointer, "minContains")?,
            _ => 1,
        };
        let any = self.any_value(self.options.any_value_depth);
        if k == 0 {
            let w = &self.ws;
            return Ok(format!("\\[{w}(?:{any}(?:{w},{w}{any})*)?{w}\\]"));
        }
        if k > 16 {
            return Err(unsupported(
                "minContains",
                pointer,
                "more than 16 is not supported yet",
            ));
        }
        let c = self.value(c, &child(pointer, "contains"))?;
        let w = self.ws.clone();
        let lead = format!("(?:{any}{w},{w})*");
        let more = format!("(?:{w},{w}{lead}{c}){{{}}}", k - 1);
        Ok(format!("\\[{w}{lead}{c}{more}(?:{w},{w}{any})*{w}\\]"))
    }

    fn string(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        let min = m
            .get("minLength")
            .map(|v| as_count(v, pointer, "minLength"))
            .transpose()?;
        let max = m
            .get("maxLength")
            .map(|v| as_count(v, pointer, "maxLength"))
            .transpose()?;
        let format = m.get("format").map(|f| {
            f.as_str()
                .ok_or_else(|| invalid(&child(pointer, "format"), "expected a string"))
        });
        let format = format.transpose()?;
        let pattern = m.get("pattern").map(|p| {
            p.as_str()
                .ok_or_else(|| invalid(&child(pointer, "pattern"), "expected a string"))
        });
        let pattern = pattern.transpose()?;
        let lengths = min.is_some() || max.is_some();
        if pattern.is_some() && (lengths || format.is_some()) {
            return Err(unsupported(
                "pattern",
                pointer,
                "pattern together with minLength/maxLength or format is not supported yet",
            ));
        }
        if let Some(f) = format {
            if lengths {
                return Err(unsupported(
                    "format",
                    pointer,
                    "format together with minLength/maxLength is not supported yet",
                ));
            }
            let body = match f {
                "date" => DATE.to_owned(),
                "time" => TIME.to_owned(),
                "date-time" => format!("{DATE}[Tt]{TIME}"),
                "uuid" => {
                    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                        .to_owned()
                }
                "ipv4" => {
                    let o = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
                    format!("{o}\\.{o}\\.{o}\\.{o}")
                }
                // The formats below are conservative subsets of their RFCs: every value they
                // allow is valid, not every valid value is allowed.
                "ipv6" => "[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}".to_owned(),
                "hostname" => format!("{LABEL}(?:\\.{LABEL})*"),
                "email" => format!(
                    "[A-Za-z0-9_%+-]{{1,32}}(?:\\.[A-Za-z0-9_%+-]{{1,15}}){{0,2}}@{LABEL}(?:\\.{LABEL}){{1,4}}"
                ),
                "duration" => {
                    // RFC 3339 appendix A, exactly: each unit may only be followed by the next.
                    let n = "[0-9]{1,9}";
                    let sec = format!("{n}S");
                    let min = format!("{n}M(?:{sec})?");
                    let hour = format!("{n}H(?:{min})?");
                    let time = format!("T(?:{hour}|{min}|{sec})");
                    let day = format!("{n}D");
                    let month = format!("{n}M(?:{day})?");
                    let year = format!("{n}Y(?:{month})?");
                    format!("P(?:(?:{day}|{month}|{year})(?:{time})?|{time}|{n}W)")
                }
                "uri" => format!("[A-Za-z][A-Za-z0-9+.-]{{0,15}}:(?:{PCHAR}|/)*{QUERY_FRAGMENT}"),
                "uri-reference" => format!(
                    "(?:[A-Za-z][A-Za-z0-9+.-]{{0,15}}:(?:{PCHAR}|/)*|/(?:{PCHAR}|/)*|{PCHAR_NO_COLON}*(?:/(?:{PCHAR}|/)*)?){QUERY_FRAGMENT}"
                ),
                other => {
                    return Err(unsupported(
                        "format",
                        pointer,
                        &format!("format {other:?} is not supported yet"),
                    ))
                }
            };
            return Ok(format!("\"{body}\""));
        }
        if let Some(p) = pattern {
            return Ok(format!(
                "\"{}\"",
                pattern_in_json(p, &child(pointer, "pattern"))?
            ));
        }
        let lo = min.unwrap_or(0);
        Ok(match max {
            Some(hi) if hi < lo => NOTHING.to_owned(),
            Some(hi) => format!("\"{STR_CHAR}{{{lo},{hi}}}\""),
            None if lo == 0 => format!("\"{STR_CHAR}*\""),
            None => format!("\"{STR_CHAR}{{{lo},}}\""),
        })
    }

    /// Lower and upper bounds as (value, exclusive), honouring the draft's form of `exclusive*`.
    fn bounds(&self, m: &Map<String, Value>, pointer: &str) -> Result<[Option<(f64, bool)>; 2]> {
        let num = |k: &str| -> Result<Option<f64>> {
            m.get(k)
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| invalid(&child(pointer, k), "expected a number"))
                })
                .transpose()
        };
        let (min, max) = (num("minimum")?, num("maximum")?);
        if self.draft == Draft::D4 {
            let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(false);
            return Ok([
                min.map(|v| (v, flag("exclusiveMinimum"))),
                max.map(|v| (v, flag("exclusiveMaximum"))),
            ]);
        }
        let (xmin, xmax) = (num("exclusiveMinimum")?, num("exclusiveMaximum")?);
        // The tighter of the inclusive and exclusive bound.
        let lower = match (min, xmin) {
            (Some(a), Some(b)) if b >= a => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        let upper = match (max, xmax) {
            (Some(a), Some(b)) if b <= a => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        Ok([lower, upper])
    }

    fn integer(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        if let Some(x) = m.get("multipleOf") {
            if x.as_f64() != Some(1.0) {
                return Err(unsupported(
                    "multipleOf",
                    pointer,
                    "only multipleOf: 1 is supported yet",
                ));
            }
        }
        let [lower, upper] = self.bounds(m, pointer)?;
        let lo = lower.map(|(v, x)| if x { v.floor() + 1.0 } else { v.ceil() });
        let hi = upper.map(|(v, x)| if x { v.ceil() - 1.0 } else { v.floor() });
        let fits = |v: f64| v.abs() < 1e18;
        if lo.is_some_and(|v| !fits(v)) || hi.is_some_and(|v| !fits(v)) {
            return Err(unsupported(
                "minimum",
                pointer,
                "integer bounds beyond ±10^18",
            ));
        }
        Ok(int_range(lo.map(|v| v as i64), hi.map(|v| v as i64)))
    }

    fn number(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<String> {
        if m.contains_key("multipleOf") {
            return Err(unsupported(
                "multipleOf",
                pointer,
                "multipleOf on numbers is not supported yet",
            ));
        }
        let [lower, upper] = self.bounds(m, pointer)?;
        if upper.is_some() {
            return Err(unsupported(
                "maximum",
                pointer,
                "upper bounds on non-integer numbers are not supported yet",
            ));
        }
        // (bound is zero, exclusive)
        Ok(match lower.map(|(v, x)| (v == 0.0, x)) {
            None => NUMBER.to_owned(),
            Some((true, false)) => format!("(?:0|[1-9][0-9]{{0,17}}){FRAC_EXP}"),
            Some((true, true)) => format!(
                r"(?:[1-9][0-9]{{0,17}}(?:\.[0-9]{{1,18}})?{EXP}|0\.0{{0,17}}[1-9][0-9]{{0,17}}{EXP})"
            ),
            Some(_) => {
                return Err(unsupported(
                    "minimum",
                    pointer,
                    "lower bounds other than 0 on non-integer numbers are not supported yet",
                ))
            }
        })
    }
}

/// A host name label (RFC 1123): letters, digits and inner hyphens, at most 63.
const LABEL: &str = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
/// RFC 3986 path characters (`pchar`); without `:` for the first segment of a relative path.
const PCHAR: &str = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";
const PCHAR_NO_COLON: &str = "(?:[A-Za-z0-9._~!$&'()*+,;=@-]|%[0-9A-Fa-f]{2})";
const QUERY_FRAGMENT: &str = "(?:\\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?(?:#(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?";

/// RFC 3339 full-date, exactly: 30-day months, February 28 days, or 29 in leap years (divisible
/// by 4, centuries only when divisible by 400).
const DATE: &str = concat!(
    "(?:[0-9]{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "|[0-9]{4}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    "|[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-8])",
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
);
const TIME: &str = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// JSON equality as JSON Schema defines it (1 == 1.0).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A JSON string body (without quotes) that is not one of `names`: a trie over the names, where at
/// each node the text may leave the trie with a character no name continues with, or end if the
/// node is not a name.
fn key_not_in(names: &[&str]) -> String {
    #[derive(Default)]
    struct Node {
        children: std::collections::BTreeMap<char, Node>,
        terminal: bool,
    }
    let mut root = Node::default();
    for n in names {
        let mut cur = &mut root;
        for c in n.chars() {
            cur = cur.children.entry(c).or_default();
        }
        cur.terminal = true;
    }
    fn encode(c: char) -> String {
        let s = serde_json::to_string(&c.to_string()).unwrap();
        regex_syntax::escape(&s[1..s.len() - 1])
    }
    fn build(n: &Node) -> String {
        let plain: String = n
            .children
            .keys()
            .filter(|c| !(**c == '"' || **c == '\\' || (**c as u32) < 0x20))
            .map(|c| regex_syntax::escape(&c.to_string()))
            .collect();
        let needs_escape = n
            .children
            .keys()
            .any(|c| *c == '"' || *c == '\\' || (*c as u32) < 0x20);
        // A character no name continues with; escapes are left out where a name continues with
        // an escaped character (sound, slightly narrower).
        let other = match (plain.is_empty(), needs_escape) {
            (true, false) => STR_CHAR.to_owned(),
            (false, false) => {
                format!(r#"(?:[[^"\\\x00-\x1F]--[{plain}]]|\\["\\bfnrt]|\\u00[01][0-9a-f])"#)
            }
            (true, true) => r#"[^"\\\x00-\x1F]"#.to_owned(),
            (false, true) => format!(r#"[[^"\\\x00-\x1F]--[{plain}]]"#),
        };
        let mut parts = vec![format!("{other}{STR_CHAR}*")];
        for (c, child) in &n.children {
            parts.push(format!("{}{}", encode(*c), build(child)));
        }
        if !n.terminal {
            parts.push(String::new());
        }
        format!("(?:{})", parts.join("|"))
    }
    format!("\"{}\"", build(&root))
}

/// Object members in order (`(regex, required)`), then any number of `extra` members, with the
/// total count in `[min, max]`. `h(i, c)`: members from `i` on after `c` were written (`c` is capped
/// where larger counts behave the same), so the regex tracks the count it needs and no more.
fn counted_members(
    members: &[(String, bool)],
    extra: Option<&str>,
    min: u64,
    max: Option<u64>,
    deps: &[(usize, usize)],
    w: &str,
) -> String {
    struct Counted<'a> {
        members: &'a [(String, bool)],
        extra: Option<&'a str>,
        min: u64,
        max: Option<u64>,
        w: &'a str,
        cap: u64,
        /// (trigger, dependent) as bits of `present`; a dependent bit of 0 can never be set.
        deps: Vec<(u64, u64)>,
        /// Member index → its bit in `present`, or 0 when no dependency mentions it.
        bit: Vec<u64>,
        memo: std::collections::HashMap<(usize, u64, u64), String>,
    }
    impl Counted<'_> {
        fn bound(lo: u64, hi: Option<u64>) -> String {
            match hi {
                Some(h) => format!("{{{lo},{h}}}"),
                None => format!("{{{lo},}}"),
            }
        }
        fn h(&mut self, i: usize, c: u64, present: u64) -> String {
            if let Some(r) = self.memo.get(&(i, c, present)) {
                return r.clone();
            }
            let w = self.w;
            let sep = if c == 0 {
                String::new()
            } else {
                format!("{w},{w}")
            };
            let broken = self
                .deps
                .iter()
                .any(|&(t, d)| present & t != 0 && present & d == 0);
            let r = if i == self.members.len() && broken {
                NOTHING.to_owned()
            } else if i == self.members.len() {
                let lo = self.min.saturating_sub(c);
                let hi = self.max.map(|m| m.saturating_sub(c));
                match self.extra {
                    Some(e) if hi != Some(0) => {
                        if c == 0 {
                            let rest = Self::bound(lo.saturating_sub(1), hi.map(|h| h - 1));
                            let body = format!("{e}(?:{w},{w}{e}){rest}");
                            if lo == 0 {
                                format!("(?:{body})?")
                            } else {
                                body
                            }
                        } else {
                            format!("(?:{w},{w}{e}){}", Self::bound(lo, hi))
                        }
                    }
                    _ if lo == 0 => String::new(),
                    _ => NOTHING.to_owned(),
                }
            } else {
                let (mem, required) = self.members[i].clone();
                let with = if self.max.is_some_and(|m| c + 1 > m) {
                    NOTHING.to_owned()
                } else {
                    let next = (c + 1).min(self.cap);
                    format!("{sep}{mem}{}", self.h(i + 1, next, present | self.bit[i]))
                };
                if required {
                    with
                } else {
                    format!("(?:{with}|{})", self.h(i + 1, c, present))
                }
            };
            self.memo.insert((i, c, present), r.clone());
            r
        }
    }
    let mut bit = vec![0u64; members.len()];
    let mut next_bit = 1u64;
    for &(t, d) in deps {
        for x in [t, d] {
            if x != usize::MAX && bit[x] == 0 {
                bit[x] = next_bit;
                next_bit <<= 1;
            }
        }
    }
    let deps = deps
        .iter()
        .map(|&(t, d)| (bit[t], if d == usize::MAX { 0 } else { bit[d] }))
        .collect();
    Counted {
        members,
        extra,
        min,
        max,
        w,
        cap: max.unwrap_or(min.max(1)).max(1),
        deps,
        bit,
        memo: std::collections::HashMap::new(),
    }
    .h(0, 0, 0)
}

/// Decimal integers in `[lo, hi]` (either end open), in canonical form (no `-0`, no leading zeros).
fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    match (lo, hi) {
        (None, None) => INTEGER.to_owned(),
        (Some(l), Some(h)) if l > h => NOTHING.to_owned(),
        _ => {
            let mut parts = Vec::new();
            // Negative part: -[max(-h,1), -l].
            if lo.is_none_or(|l| l < 0) {
                let from = hi.map_or(1, |h| if h < 0 { -h as u64 } else { 1 });
                let to = lo.map(|l| l.unsigned_abs());
                parts.push(format!("-{}", nonneg_range(from, to)));
            }
            // Non-negative part: [max(l,0), h].
            if hi.is_none_or(|h| h >= 0) {
                let from = lo.map_or(0, |l| l.max(0) as u64);
                parts.push(nonneg_range(from, hi.map(|h| h as u64)));
            }
            alt(&parts)
        }
    }
}

/// Decimal numbers in `[lo, hi]` (`hi` open when `None`), no leading zeros.
fn nonneg_range(lo: u64, hi: Option<u64>) -> String {
    let digits = |v: u64| v.to_string().len() as u32;
    let mut parts = Vec::new();
    let top = hi.map_or(digits(lo), digits);
    for n in digits(lo)..=top {
        let a = if n == digits(lo) {
            lo
        } else {
            10u64.pow(n - 1)
        };
        let b = match hi {
            Some(h) if n == digits(h) => h,
            _ => 10u64.saturating_pow(n) - 1,
        };
        if a <= b {
            parts.push(same_length(&a.to_string(), &b.to_string()));
        }
    }
    if hi.is_none() && digits(lo) < 18 {
        // Longer numbers, up to the 18 digits every number is bounded to.
        parts.push(format!("[1-9][0-9]{{{},17}}", digits(lo)));
    }
    alt(&parts)
}

/// Digit strings of equal length between `a` and `b` inclusive.
fn same_length(a: &str, b: &str) -> String {
    if a.is_empty() {
        return String::new();
    }
    if a == b {
        return a.to_owned();
    }
    let (a0, b0) = (a.as_bytes()[0], b.as_bytes()[0]);
    let (ar, br) = (&a[1..], &b[1..]);
    let n = ar.len();
    if a0 == b0 {
        return format!("{}{}", a0 as char, same_length(ar, br));
    }
    if ar.bytes().all(|c| c == b'0') && br.bytes().all(|c| c == b'9') {
        return format!("[{}-{}][0-9]{{{n}}}", a0 as char, b0 as char);
    }
    let mut parts = vec![format!("{}{}", a0 as char, same_length(ar, &"9".repeat(n)))];
    if b0 - a0 > 1 {
        parts.push(format!(
            "[{}-{}][0-9]{{{n}}}",
            (a0 + 1) as char,
            (b0 - 1) as char
        ));
    }
    parts.push(format!("{}{}", b0 as char, same_length(&"0".repeat(n), br)));
    alt(&parts)
}

/// An ECMA-262 `pattern` (a search over the decoded string) as a regex over the canonical JSON
/// encoding of the string, without the quotes.
fn pattern_in_json(pattern: &str, pointer: &str) -> Result<String> {
    use regex_syntax::hir::{Class, Hir, HirKind, Look};
    let hir =
        regex_syntax::ParserBuilder::new()
            .build()
            .parse(pattern)
            .map_err(|e| {
                unsupported(
                    "pattern",
                    pointer,
                    &format!(
                    "not expressible as a DFA regex (look-around and backreferences are not): {}",
                    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
                ),
                )
            })?;
    // Strip a leading ^ and a trailing $ (anchors); any other assertion is unsupported.
    let (mut items, anchored_start, anchored_end) = match hir.kind() {
        HirKind::Concat(items) => {
            let mut items = items.clone();
            let s = matches!(
                items.first().map(Hir::kind),
                Some(HirKind::Look(Look::Start))
            );
            if s {
                items.remove(0);
            }
            let e = matches!(items.last().map(Hir::kind), Some(HirKind::Look(Look::End)));
            if e {
                items.pop();
            }
            (items, s, e)
        }
        HirKind::Look(Look::Start) => (vec![], true, false),
        HirKind::Look(Look::End) => (vec![], false, true),
        _ => (vec![hir.clone()], false, false),
    };
    fn encode_char(c: char) -> String {
        let s = serde_json::to_string(&c.to_string()).unwrap();
        regex_syntax::escape(&s[1..s.len() - 1])
    }
    fn tr(h: &Hir, pointer: &str) -> Result<String> {
        Ok(match h.kind() {
            HirKind::Empty => String::new(),
            HirKind::Literal(lit) => {
                let s = std::str::from_utf8(&lit.0)
                    .map_err(|_| unsupported("pattern", pointer, "a byte-level literal"))?;
                s.chars().map(encode_char).collect()
            }
            HirKind::Class(Class::Unicode(cls)) => {
                // Characters that JSON writes raw stay a class; the others become their escapes.
                let mut raw = String::new();
                let mut escaped = Vec::new();
                for r in cls.ranges() {
                    let (a, b) = (r.start() as u32, r.end() as u32);
                    for special in (0..0x20).chain([0x22, 0x5C]) {
                        if a <= special && special <= b {
                            escaped.push(encode_char(char::from_u32(special).unwrap()));
                        }
                    }
                    raw.push_str(&format!("\\x{{{a:x}}}-\\x{{{b:x}}}"));
                }
                let class = format!(r#"[[{raw}]--[\x00-\x1F"\\]]"#);
                if escaped.is_empty() {
                    class
                } else {
                    format!("(?:{class}|{})", escaped.join("|"))
                }
            }
            HirKind::Class(Class::Bytes(_)) => {
                return Err(unsupported("pattern", pointer, "a byte class"))
            }
            HirKind::Look(_) => {
                return Err(unsupported(
                    "pattern",
                    pointer,
                    "anchors or word boundaries inside the pattern",
                ))
            }
            HirKind::Repetition(rep) => {
                let inner = tr(&rep.sub, pointer)?;
                let max = rep.max.map_or(String::new(), |m| m.to_string());
                let q = if rep.max == Some(rep.min) {
                    format!("{{{}}}", rep.min)
                } else {
                    format!("{{{},{max}}}", rep.min)
                };
                format!("(?:{inner}){q}")
            }
            HirKind::Capture(c) => format!("(?:{})", tr(&c.sub, pointer)?),
            HirKind::Concat(hs) => hs
                .iter()
                .map(|h| tr(h, pointer))
                .collect::<Result<String>>()?,
            HirKind::Alternation(hs) => format!(
                "(?:{})",
                hs.iter()
                    .map(|h| tr(h, pointer))
                    .collect::<Result<Vec<_>>>()?
                    .join("|")
            ),
        })
    }
    let body: String = items
        .drain(..)
        .map(|h| tr(&h, pointer))
        .collect::<Result<String>>()?;
    let pre = if anchored_start {
        String::new()
    } else {
        format!("{STR_CHAR}*")
    };
    let post = if anchored_end {
        String::new()
    } else {
        format!("{STR_CHAR}*")
    };
    Ok(format!("{pre}(?:{body}){post}"))
}

/// `instance` re-serialized in quarry's canonical form for `schema`: compact, object properties in
/// the order the schema lists them, then the others in their own order.
pub fn canonicalize(instance: &Value, schema: &Value) -> String {
    fn order(v: &Value, s: &Value, root: &Value, depth: usize) -> Value {
        let s = match s.get("$ref").and_then(Value::as_str) {
            Some(r) if depth < 32 => r
                .strip_prefix('#')
                .and_then(|f| {
                    if f.is_empty() {
                        Some(root)
                    } else {
                        root.pointer(f)
                    }
                })
                .unwrap_or(s),
            _ => s,
        };
        let sub = |k: &str| s.get(k).cloned().unwrap_or(Value::Bool(true));
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                // Declared properties in schema order, following allOf branches as merging does.
                let mut declared: Vec<(String, Value)> = Vec::new();
                let mut schemas = vec![s.clone()];
                while let Some(x) = schemas.pop() {
                    if let Some(p) = x.get("properties").and_then(Value::as_object) {
                        for (k, ps) in p {
                            if !declared.iter().any(|(d, _)| d == k) {
                                declared.push((k.clone(), ps.clone()));
                            }
                        }
                    }
                    if let Some(bs) = x.get("allOf").and_then(Value::as_array) {
                        for b in bs.iter().rev() {
                            let b = match b.get("$ref").and_then(Value::as_str) {
                                Some(r) => r
                                    .strip_prefix('#')
                                    .and_then(|f| {
                                        if f.is_empty() {
                                            Some(root)
                                        } else {
                                            root.pointer(f)
                                        }
                                    })
                                    .unwrap_or(b),
                                None => b,
                            };
                            schemas.push(b.clone());
                        }
                    }
                }
                for (k, ps) in &declared {
                    if let Some(x) = m.get(k) {
                        out.insert(k.clone(), order(x, ps, root, depth + 1));
                    }
                }
                let extra = sub("additionalProperties");
                for (k, x) in m {
                    if !out.contains_key(k) {
                        out.insert(k.clone(), order(x, &extra, root, depth + 1));
                    }
                }
                Value::Object(out)
            }
            Value::Array(a) => {
                let prefix = s
                    .get("prefixItems")
                    .or_else(|| s.get("items").filter(|i| i.is_array()))
                    .and_then(Value::as_array);
                let rest = s
                    .get("items")
                    .filter(|i| !i.is_array())
                    .cloned()
                    .unwrap_or(Value::Bool(true));
                Value::Array(
                    a.iter()
                        .enumerate()
                        .map(|(i, x)| {
                            let ps = prefix.and_then(|p| p.get(i)).unwrap_or(&rest);
                            order(x, ps, root, depth + 1)
                        })
                        .collect(),
                )
            }
            other => other.clone(),
        }
    }
    serde_json::to_string(&order(instance, schema, schema, 0)).expect("a Value serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(re: &str) -> regex_automata::dfa::regex::Regex {
        regex_automata::dfa::regex::Regex::new(&format!("^(?:{re})$")).unwrap()
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
        full(&schema_to_regex(&schema, &SchemaOptions::default()).unwrap())
            .is_match(text.as_bytes())
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
}
