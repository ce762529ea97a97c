//! Negation and the keywords built on it: `not`, `if`/`then`/`else`, `dependentSchemas` (and
//! draft 4–7 schema `dependencies`), and `oneOf` whose branches are not provably disjoint.
//!
//! Negation is exact or refused, never approximated, because an approximate "not" is unsound.
//! A schema is a conjunction of keywords, so its negation is the union of each keyword's failures
//! (De Morgan), each restricted to the type the keyword applies to:
//! - `type` → the other types (`integer` → the other types and numbers with a fraction);
//! - bounds, lengths and counts → the opposite bound (`minimum: 5` → `exclusiveMaximum: 5`);
//! - `required: [a, b]` → an object without `a`, or one without `b`;
//! - `properties: {a: S}` → an object with `a` whose value fails `S`;
//! - `items: S` → an array that contains an item failing `S`;
//! - `anyOf` → every branch fails; `allOf` → some branch fails; `not: S` → `S`;
//! - `enum`/`const` over scalars and `pattern` stay as a `not` leaf: strings, booleans and null are
//!   removed from the text by a difference term (`Translator::combine`; a string has exactly one
//!   canonical text), numbers by keeping the open intervals between the excluded values (a number
//!   has many texts: `1`, `1.0`, `1e0`).
//!
//! Anything else under `not` is a typed `Unsupported` error.

use serde_json::{json, Map, Value};

use super::{
    child, invalid, json_equal, literal, resolve_local, scalar::pattern_in_json, unsupported,
    Draft, Op, Re, Result, Translator, TYPES,
};

/// Numbers that are not integers, in canonical decimal form.
pub(super) const FRACTIONAL: &str = r"-?(?:0|[1-9][0-9]{0,17})\.[0-9]{0,17}[1-9]";

/// A child location of the one being negated.
#[derive(Debug, Clone, Copy)]
enum Below<'a> {
    /// The value of the property of this name.
    Property(&'a str),
    /// Every item.
    Items,
}

/// A set of JSON types as bits ([`type_bits`]); `number` is `integer` and the other numbers.
type InstanceTypes = u8;
const ANY_TYPE: InstanceTypes = 0x7f;

/// The bits of the type named `t` (an unknown name, which translation refuses: any).
fn type_bits(t: &str) -> InstanceTypes {
    match t {
        "null" => 1,
        "boolean" => 2,
        "object" => 4,
        "array" => 8,
        "string" => 16,
        "integer" => 32,
        "number" => 32 | 64,
        _ => ANY_TYPE,
    }
}

/// The bit of a value's type (a number with an integral value is an integer).
fn value_bits(v: &Value) -> InstanceTypes {
    match v {
        Value::Null => 1,
        Value::Bool(_) => 2,
        Value::Object(_) => 4,
        Value::Array(_) => 8,
        Value::String(_) => 16,
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => 32,
        Value::Number(_) => 64,
    }
}

/// How many branches a cross product of `anyOf`s may have.
const MAX_BRANCHES: usize = 128;

/// The most branches of a `oneOf` that is negated (its negation has a branch per pair).
const MAX_ONE_OF_NEGATED: usize = 8;

impl Translator<'_> {
    /// `if`/`then`/`else` and schema dependencies, rewritten as `anyOf`s next to the remaining
    /// keywords; `None` if the schema has none.
    pub(super) fn expand_conditionals(
        &mut self,
        m: &Map<String, Value>,
        pointer: &str,
    ) -> Result<Option<Value>> {
        let key = if self.draft >= Draft::D2019 {
            "dependentSchemas"
        } else {
            "dependencies"
        };
        let schema_dependencies = match m.get(key) {
            Some(Value::Object(deps)) => deps.values().any(|s| !s.is_array()),
            _ => false,
        };
        if !(schema_dependencies || self.draft >= Draft::D7 && m.contains_key("if")) {
            // Nothing to rewrite: no copy of the schema (a deep one would be copied at every
            // level of its nesting).
            return Ok(None);
        }
        let mut rest = m.clone();
        let mut terms: Vec<Value> = Vec::new();
        if self.draft >= Draft::D7 {
            if let Some(cond) = rest.remove("if") {
                let then = rest.remove("then").unwrap_or(Value::Bool(true));
                let other = rest.remove("else").unwrap_or(Value::Bool(true));
                let keep = self.has_unevaluated(m);
                let positive = Some(Value::Object(rest.clone()));
                let negated = self.negate_keeping(&cond, &child(pointer, "if"), keep, positive)?;
                terms.push(json!({"anyOf": [
                    {"allOf": [cond, then]},
                    {"allOf": [negated, other]},
                ]}));
            }
        }
        if let Some(Value::Object(deps)) = rest.get(key).cloned() {
            let mut lists = Map::new();
            for (trigger, s) in deps {
                if s.is_array() {
                    lists.insert(trigger, s);
                    continue;
                }
                // Without the trigger, or with it and the dependent schema.
                terms.push(json!({"anyOf": [
                    {"properties": {&trigger: false}},
                    {"allOf": [{"required": [&trigger]}, s]},
                ]}));
            }
            if lists.is_empty() {
                rest.remove(key);
            } else {
                rest.insert(key.to_owned(), Value::Object(lists));
            }
        }
        if terms.is_empty() {
            return Ok(None);
        }
        terms.insert(0, Value::Object(rest));
        Ok(Some(json!({ "allOf": terms })))
    }

    /// A schema accepting exactly the instances `schema` rejects, or `Unsupported`.
    pub(super) fn negate(&mut self, schema: &Value, pointer: &str, depth: usize) -> Result<Value> {
        self.nested(pointer, |t| t.negate_unchecked(schema, pointer, depth))
    }

    /// [`Self::negate`] of a child location (`below` the one being negated): the schema the
    /// negation is intersected with there is what the enclosing one says of that child.
    fn negate_at_child(
        &mut self,
        schema: &Value,
        pointer: &str,
        depth: usize,
        below: Below,
    ) -> Result<Value> {
        let inner = match self.positive.clone() {
            Some(p) => self.positive_below(&p, below, pointer),
            None => None,
        };
        let outer = std::mem::replace(&mut self.positive, inner);
        let out = self.negate(schema, pointer, depth);
        self.positive = outer;
        out
    }

    /// Whether no instance of `positive` is an object, by its own `type`.
    fn never_object(&mut self, positive: &Value, pointer: &str) -> bool {
        let Some(p) = self.inline_ref(positive, pointer, 0).ok() else {
            return false;
        };
        match p.get("type") {
            Some(Value::String(t)) => t != "object",
            Some(Value::Array(ts)) => !ts.iter().any(|t| t == "object"),
            _ => p == Value::Bool(false),
        }
    }

    /// What `positive` (its own keywords, which hold whatever it applies in place) requires of
    /// a property's value or of every item; `None` where that is not one schema (a name that
    /// `patternProperties` may match, `prefixItems`).
    fn positive_below(&mut self, positive: &Value, below: Below, pointer: &str) -> Option<Value> {
        let p = self.inline_ref(positive, pointer, 0).ok()?;
        let m = p.as_object()?;
        match below {
            Below::Property(name) => {
                if let Some(s) = m.get("properties").and_then(|ps| ps.get(name)) {
                    return Some(s.clone());
                }
                if m.contains_key("patternProperties") {
                    return None;
                }
                m.get("additionalProperties").cloned()
            }
            Below::Items => {
                if m.contains_key("prefixItems") || m.get("items").is_some_and(Value::is_array) {
                    return None;
                }
                m.get("items").cloned()
            }
        }
    }

    fn negate_unchecked(&mut self, schema: &Value, pointer: &str, depth: usize) -> Result<Value> {
        if depth > 16 {
            return Err(unsupported("not", pointer, "negation nested too deeply"));
        }
        if self.positive == Some(Value::Bool(false)) {
            // Intersected with nothing: any answer is exact.
            return Ok(Value::Bool(false));
        }
        let s = self.inline_ref(schema, pointer, depth)?;
        let m = match s {
            Value::Bool(b) => return Ok(Value::Bool(!b)),
            Value::Object(m) => m,
            _ => return Err(invalid(pointer, "a schema is an object or a boolean")),
        };
        if let Some(expanded) = self.expand_conditionals(&m, pointer)? {
            return self.negate(&expanded, pointer, depth + 1);
        }
        // The schema fails where any of its constraining keywords fails: one alternative each.
        let mut failures: Vec<Value> = Vec::new();
        let constraining = Self::constraining(&m, &[]);
        for (k, v) in &m {
            if constraining.iter().any(|c| c == k) {
                let at = Keyword {
                    name: k,
                    value: v,
                    schema: &m,
                    pointer,
                    depth,
                };
                self.keyword_failures(at, &mut failures)?;
            }
        }
        failures.retain(|f| f != &Value::Bool(false));
        Ok(match failures.len() {
            0 => Value::Bool(false),
            1 => failures.pop().unwrap(),
            _ => json!({ "anyOf": failures }),
        })
    }

    /// Adds to `failures` the schemas of the instances that fail one keyword of a schema object:
    /// each alternative is one way to fail it.
    fn keyword_failures(&mut self, at: Keyword<'_>, failures: &mut Vec<Value>) -> Result<()> {
        let Keyword {
            name: k,
            value: v,
            schema: m,
            pointer,
            depth,
        } = at;
        let d4 = self.draft == Draft::D4;
        let number = |bound: &str, x: &Value| json!({"type": "number", bound: x});
        let f = match k {
            "type" => {
                failures.extend(negate_type(v, pointer)?);
                return Ok(());
            }
            "enum" | "const" | "pattern" => json!({"not": {k: v}}),
            "minimum" if d4 && m.get("exclusiveMinimum") == Some(&Value::Bool(true)) => {
                number("maximum", v)
            }
            "minimum" if d4 => json!({"type": "number", "maximum": v, "exclusiveMaximum": true}),
            "minimum" => number("exclusiveMaximum", v),
            "maximum" if d4 && m.get("exclusiveMaximum") == Some(&Value::Bool(true)) => {
                number("minimum", v)
            }
            "maximum" if d4 => json!({"type": "number", "minimum": v, "exclusiveMinimum": true}),
            "maximum" => number("exclusiveMinimum", v),
            "exclusiveMinimum" | "exclusiveMaximum" if d4 => return Ok(()),
            "exclusiveMinimum" => number("maximum", v),
            "exclusiveMaximum" => number("minimum", v),
            "minLength" | "minItems" | "minProperties" | "maxLength" | "maxItems"
            | "maxProperties" => match negate_count(k, v, pointer)? {
                Some(f) => f,
                None => return Ok(()),
            },
            "required" => {
                for name in v.as_array().into_iter().flatten() {
                    failures.push(json!({"type": "object", "properties": {name.as_str().unwrap_or_default(): false}}));
                }
                return Ok(());
            }
            // Would write a property only the failed schema names: left out next to
            // unevaluatedProperties (see negate_keeping).
            "properties" | "items" if self.keep_evaluated => return Ok(()),
            "not" if self.keep_evaluated => return Err(refuse("not", pointer)),
            "properties" => {
                let here = child(pointer, "properties");
                for (name, p) in v.as_object().into_iter().flatten() {
                    let at = Below::Property(name);
                    let n = self.negate_at_child(p, &child(&here, name), depth + 1, at)?;
                    failures.push(member_fails(name, n));
                }
                return Ok(());
            }
            "additionalProperties" | "patternProperties" => {
                return self.member_failures(at, failures);
            }
            "items" if v.is_object() || v.is_boolean() => {
                let single = self.draft >= Draft::D2020 || !m.contains_key("prefixItems");
                if !single || m.contains_key("prefixItems") {
                    return Err(refuse("items", pointer));
                }
                let n =
                    self.negate_at_child(v, &child(pointer, "items"), depth + 1, Below::Items)?;
                json!({"type": "array", "contains": n})
            }
            "anyOf" | "allOf" | "oneOf" => {
                let here = child(pointer, k);
                let branches = v
                    .as_array()
                    .ok_or_else(|| invalid(&here, "expected an array"))?;
                if k == "oneOf" && branches.len() > MAX_ONE_OF_NEGATED {
                    return Err(unsupported(
                        "not",
                        pointer,
                        &format!(
                            "negating a `oneOf` of more than {MAX_ONE_OF_NEGATED} branches \
                             is not supported"
                        ),
                    ));
                }
                let negated = branches
                    .iter()
                    .enumerate()
                    .map(|(i, b)| self.negate(b, &child(&here, &i.to_string()), depth + 1))
                    .collect::<Result<Vec<_>>>()?;
                match k {
                    "anyOf" => json!({ "allOf": negated }),
                    "allOf" => {
                        failures.extend(negated);
                        return Ok(());
                    }
                    // Not exactly one: none of the branches, or two of them at once.
                    _ => {
                        let mut alts = vec![json!({ "allOf": negated })];
                        for i in 0..branches.len() {
                            for j in i + 1..branches.len() {
                                alts.push(json!({"allOf": [branches[i], branches[j]]}));
                            }
                        }
                        json!({ "anyOf": alts })
                    }
                }
            }
            "not" => v.clone(),
            // Vendor keywords are annotations when the options say so.
            other
                if self.options.ignore_unknown_keywords
                    && !super::SUPPORTED.contains(&other)
                    && !super::UNSUPPORTED.contains(&other) =>
            {
                return Ok(())
            }
            other => return Err(refuse(other, pointer)),
        };
        failures.push(f);
        Ok(())
    }

    /// The failures of `additionalProperties` or `patternProperties`: some member has a value failing what its name calls for, a pattern it matches, or (named
    /// by no `properties` entry and matching no pattern) the additional schema. With the names
    /// the intersected schema allows known, one alternative per such name and schema.
    fn member_failures(&mut self, at: Keyword<'_>, failures: &mut Vec<Value>) -> Result<()> {
        let pointer = at.pointer;
        let positive = self.positive.clone();
        if positive
            .as_ref()
            .is_some_and(|p| self.never_object(p, pointer))
        {
            return Ok(()); // only objects fail it, and the other side has none
        }
        let Some(scope) = positive.and_then(|p| self.closed_names(&p, pointer)) else {
            return Err(refuse(at.name, pointer));
        };
        let patterns = self.pattern_properties(at.schema, pointer)?;
        let declared = at.schema.get("properties").and_then(Value::as_object);
        for name in &scope {
            let quoted = serde_json::to_string(name).expect("a string serializes");
            let matching: Vec<_> = patterns
                .iter()
                .filter(|p| p.matcher.is_match(quoted.as_bytes()))
                .collect();
            let schemas: Vec<(Value, String)> = if at.name == "patternProperties" {
                matching
                    .iter()
                    .map(|p| (p.schema.clone(), p.pointer.clone()))
                    .collect()
            } else if matching.is_empty() && !declared.is_some_and(|d| d.contains_key(name)) {
                vec![(at.value.clone(), child(pointer, "additionalProperties"))]
            } else {
                Vec::new()
            };
            for (schema, here) in schemas {
                let below = Below::Property(name);
                let n = self.negate_at_child(&schema, &here, at.depth + 1, below)?;
                failures.push(member_fails(name, n));
            }
        }
        Ok(())
    }

    /// `m`'s `not`, if it is made of leaves this module applies to text: one keyword out of
    /// `enum`, `const` (scalar values) or `pattern`, or an `anyOf` of such leaves (which is what
    /// two `not`s merge into: before, translating that negated the `anyOf` into two `not`s,
    /// which merged back into it, until the nesting limit).
    pub(super) fn not_leaves(m: &Map<String, Value>) -> Option<Vec<(&str, &Value)>> {
        /// The leaves of `n`, through nested `anyOf`s (three `not`s merge into two levels).
        fn leaves<'v>(n: &'v Map<String, Value>, out: &mut Vec<(&'v str, &'v Value)>) -> bool {
            match Translator::constraining(n, &[]).as_slice() {
                [k @ ("enum" | "const" | "pattern")] => {
                    out.push((k, &n[*k]));
                    true
                }
                ["anyOf"] => n["anyOf"].as_array().is_some_and(|bs| {
                    bs.iter()
                        .all(|b| b.as_object().is_some_and(|b| leaves(b, out)))
                }),
                _ => false,
            }
        }
        let mut out = Vec::new();
        leaves(m.get("not")?.as_object()?, &mut out).then_some(out)
    }

    /// The regex of `m` without its `not` leaf, minus the texts the leaf accepts.
    pub(super) fn without_leaf(
        &mut self,
        m: &Map<String, Value>,
        leaves: &[(&str, &Value)],
        pointer: &str,
    ) -> Result<Re> {
        let here = child(pointer, "not");
        let mut rest = m.clone();
        rest.remove("not");
        let rest = Value::Object(rest);
        // The leaves only remove texts of some types: the difference is taken on those types'
        // part of the language alone, which keeps the automata small.
        let mut numbers: Vec<serde_json::Number> = Vec::new();
        let mut affected: Vec<&str> = Vec::new();
        let mut texts: Vec<Re> = Vec::new();
        let mut pattern = false;
        for (keyword, leaf) in leaves {
            if *keyword == "pattern" {
                let p = leaf
                    .as_str()
                    .ok_or_else(|| invalid(&child(&here, "pattern"), "expected a string"))?;
                let body = pattern_in_json(p, &child(&here, "pattern"))?;
                texts.push(Re::seq([Re::text("\""), body, Re::text("\"")]));
                pattern = true;
                continue;
            }
            let values: Vec<Value> = match (*keyword, leaf) {
                ("enum", Value::Array(vs)) => vs.clone(),
                ("enum", _) => return Err(invalid(&child(&here, "enum"), "expected an array")),
                (_, v) => vec![(*v).clone()],
            };
            for v in &values {
                let (t, text) = match v {
                    Value::Number(n) => {
                        numbers.push(n.clone());
                        ("number", Re::empty())
                    }
                    Value::String(_) => ("string", literal(v)),
                    Value::Bool(_) => ("boolean", literal(v)),
                    Value::Null => ("null", literal(v)),
                    Value::Array(_) | Value::Object(_) => {
                        return Err(unsupported(
                            "not",
                            pointer,
                            "excluding array or object values is not supported yet",
                        ))
                    }
                };
                if !affected.contains(&t) {
                    affected.push(t);
                }
                if t != "number" {
                    texts.push(text);
                }
            }
        }
        if pattern {
            // Non-strings satisfy any pattern, so a `pattern` leaf rejects every one of them.
            affected = vec!["string"];
            numbers.clear();
        }
        let removed = Re::alt(texts);
        let mut parts = Vec::new();
        for t in &affected {
            if *t == "number" {
                // Numbers differ from the excluded values by lying strictly between them.
                let mut cuts: Vec<f64> = numbers.iter().filter_map(|n| n.as_f64()).collect();
                cuts.sort_by(f64::total_cmp);
                cuts.dedup();
                let d4 = self.draft == Draft::D4;
                let bound = |key: &str, v: f64| -> Map<String, Value> {
                    let mut b = Map::new();
                    if d4 {
                        let plain = if key == "exclusiveMinimum" {
                            "minimum"
                        } else {
                            "maximum"
                        };
                        b.insert(plain.into(), json!(v));
                        b.insert(key.into(), json!(true));
                    } else {
                        b.insert(key.into(), json!(v));
                    }
                    b
                };
                for i in 0..=cuts.len() {
                    let mut interval = Map::from_iter([("type".to_owned(), json!("number"))]);
                    if i > 0 {
                        interval.extend(bound("exclusiveMinimum", cuts[i - 1]));
                    }
                    if i < cuts.len() {
                        interval.extend(bound("exclusiveMaximum", cuts[i]));
                    }
                    let typed = self.merge(&rest, &Value::Object(interval), pointer, 0)?;
                    parts.push(self.value(&typed, pointer)?);
                }
                continue;
            }
            let typed = self.merge(&rest, &json!({ "type": t }), pointer, 0)?;
            let base = self.value(&typed, pointer)?;
            parts.push(self.combine(&base, &removed, Op::AndNot, "not", pointer)?);
        }
        if !pattern {
            // Types no excluded value has are untouched.
            let others: Vec<&str> = TYPES
                .iter()
                .copied()
                .filter(|t| !affected.contains(t))
                .collect();
            let typed = self.merge(&rest, &json!({ "type": others }), pointer, 0)?;
            parts.push(self.value(&typed, pointer)?);
        }
        Ok(Re::alt(parts))
    }

    /// The JSON types ([`InstanceTypes`]) an instance of `s` may have, as far as `type`,
    /// `enum`/`const`, `$ref`, `anyOf`/`oneOf` (any branch's) and `allOf` (every branch's) tell:
    /// a superset of the types of its valid instances.
    fn instance_types(&self, s: &Value, depth: usize) -> InstanceTypes {
        let m = match s {
            Value::Bool(false) => return 0,
            Value::Object(m) if depth <= 8 => m,
            _ => return ANY_TYPE,
        };
        let mut out = ANY_TYPE;
        match m.get("type") {
            Some(Value::String(t)) => out &= type_bits(t),
            Some(Value::Array(ts)) => {
                out &= ts
                    .iter()
                    .filter_map(Value::as_str)
                    .map(type_bits)
                    .fold(0, |a, b| a | b)
            }
            _ => {}
        }
        let values = match (m.get("const"), m.get("enum")) {
            (Some(c), _) => Some(std::slice::from_ref(c)),
            (None, Some(Value::Array(e))) => Some(e.as_slice()),
            _ => None,
        };
        if let Some(values) = values {
            out &= values.iter().map(value_bits).fold(0, |a, b| a | b);
        }
        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
            if let Some(target) = resolve_local(self.root, r) {
                out &= self.instance_types(target, depth + 1);
            }
        }
        for k in ["anyOf", "oneOf"] {
            if let Some(Value::Array(bs)) = m.get(k) {
                let any = bs
                    .iter()
                    .map(|b| self.instance_types(b, depth + 1))
                    .fold(0, |a, b| a | b);
                out &= any;
            }
        }
        if let Some(Value::Array(bs)) = m.get("allOf") {
            for b in bs {
                out &= self.instance_types(b, depth + 1);
            }
        }
        out
    }

    /// Whether no instance can satisfy both schemas, by a sufficient syntactic test: types that
    /// do not meet ([`Translator::instance_types`]), disjoint `enum`/`const` values, or a
    /// property both require with disjoint schemas.
    pub(super) fn disjoint(&mut self, a: &Value, b: &Value, pointer: &str, depth: usize) -> bool {
        if depth <= 8 && self.instance_types(a, depth) & self.instance_types(b, depth) == 0 {
            return true;
        }
        if depth > 8 {
            return false;
        }
        let (Ok(a), Ok(b)) = (
            self.inline_ref(a, pointer, depth),
            self.inline_ref(b, pointer, depth),
        ) else {
            return false;
        };
        let (a, b) = match (&a, &b) {
            (Value::Bool(false), _) | (_, Value::Bool(false)) => return true,
            (Value::Object(a), Value::Object(b)) => (a, b),
            _ => return false,
        };
        let values = |m: &Map<String, Value>| -> Option<Vec<Value>> {
            match (m.get("const"), m.get("enum")) {
                (Some(c), _) => Some(vec![c.clone()]),
                (None, Some(Value::Array(e))) => Some(e.clone()),
                _ => None,
            }
        };
        if let (Some(va), Some(vb)) = (values(a), values(b)) {
            if !va.iter().any(|x| vb.iter().any(|y| json_equal(x, y))) {
                return true;
            }
        }
        let required = |m: &Map<String, Value>| -> Vec<String> {
            m.get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (ra, rb) = (required(a), required(b));
        let only_objects = |m: &Map<String, Value>| m.get("type") == Some(&json!("object"));
        // An object of `x` has a property `y` forbids (`additionalProperties: false`, the name not
        // declared; no `patternProperties` to test names against), so it cannot be one of `y`.
        let forbids = |y: &Map<String, Value>, name: &str| {
            y.get("additionalProperties") == Some(&Value::Bool(false))
                && !y.contains_key("patternProperties")
                && !y.contains_key("unevaluatedProperties")
                && y.get("properties").and_then(|p| p.get(name)).is_none()
        };
        for (x, rx, y) in [(a, &ra, b), (b, &rb, a)] {
            if only_objects(x) && rx.iter().any(|n| forbids(y, n)) {
                return true;
            }
        }
        for name in ra.iter().filter(|n| rb.contains(n)) {
            let pa = a.get("properties").and_then(|p| p.get(name));
            let pb = b.get("properties").and_then(|p| p.get(name));
            if let (Some(pa), Some(pb)) = (pa.cloned(), pb.cloned()) {
                // Both require `name` only of objects; a non-object could satisfy both.
                if (only_objects(a) || only_objects(b))
                    && self.disjoint(&pa, &pb, pointer, depth + 1)
                {
                    return true;
                }
            }
        }
        false
    }

    /// `oneOf` as a union: branches proven disjoint stay as they are; each branch that may overlap
    /// others is intersected with their negations. `Unsupported` if a needed negation is.
    pub(super) fn one_of(&mut self, branches: &[Value], pointer: &str) -> Result<Vec<Value>> {
        let n = branches.len();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut terms = vec![branches[i].clone()];
            for j in (0..n).filter(|&j| j != i) {
                if !self.disjoint(&branches[i], &branches[j], pointer, 0) {
                    let keep = branches[i]
                        .as_object()
                        .is_some_and(|b| self.has_unevaluated(b));
                    let here = child(pointer, &j.to_string());
                    // i ∧ ¬j = i ∧ ¬(what j asks beyond i): the keywords both share hold in i.
                    let target = match self.beyond(&branches[j], &branches[i]) {
                        Some(rest) if Self::constraining(&rest, &[]).is_empty() => {
                            // j asks nothing i does not: no instance of i escapes j.
                            terms.push(Value::Bool(false));
                            continue;
                        }
                        Some(rest) => Value::Object(rest),
                        None => branches[j].clone(),
                    };
                    let positive = Some(branches[i].clone());
                    let negated = self.negate_keeping(&target, &here, keep, positive).map_err(|e| {
                        unsupported(
                            "oneOf",
                            pointer,
                            &format!(
                                "branches {i} and {j} may overlap, and excluding the overlap failed: {e}"
                            ),
                        )
                    })?;
                    terms.push(negated);
                }
            }
            out.push(if terms.len() == 1 {
                terms.pop().unwrap()
            } else {
                json!({ "allOf": terms })
            });
        }
        Ok(out)
    }

    /// The keywords of `j` that `i` does not share. A keyword is shared when it has the same value
    /// in both and what its meaning depends on is the same too (`additionalProperties`: the
    /// names of `properties` and `patternProperties`; `items`: the length of `prefixItems`;
    /// `contains` and `if` with their partners), so it holds in every instance of `i`: then
    /// `i ∧ ¬j = i ∧ ¬rest`. `None` where keywords depend on everything in place
    /// (`unevaluated*`) or `$ref` hides its siblings (before 2019-09).
    fn beyond(&self, j: &Value, i: &Value) -> Option<Map<String, Value>> {
        const GROUPS: &[&[&str]] = &[
            &["contains", "minContains", "maxContains"],
            &["if", "then", "else"],
        ];
        let (jm, im) = (j.as_object()?, i.as_object()?);
        let in_place = |m: &Map<String, Value>| {
            m.keys()
                .any(|k| k.starts_with("unevaluated") || k == "$dynamicRef" || k == "$recursiveRef")
        };
        if in_place(jm) || in_place(im) {
            return None;
        }
        if self.draft < Draft::D2019 && (jm.contains_key("$ref") || im.contains_key("$ref")) {
            return None;
        }
        let same = |k: &str| jm.get(k) == im.get(k);
        // What a keyword's meaning depends on besides its value: names, or a prefix's length.
        let names = |m: &Map<String, Value>, k: &str| -> Vec<String> {
            m.get(k)
                .and_then(Value::as_object)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        let same_names = |k: &str| {
            let (mut a, mut b) = (names(jm, k), names(im, k));
            a.sort();
            b.sort();
            a == b
        };
        let length =
            |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_array).map(Vec::len);
        let same_length = |k: &str| length(jm, k) == length(im, k);
        let shared = |k: &str| match k {
            "additionalProperties" => {
                same(k) && same_names("properties") && same_names("patternProperties")
            }
            "items" if self.draft >= Draft::D2020 => same(k) && same_length("prefixItems"),
            "additionalItems" => same(k) && same_length("items"),
            _ => match GROUPS.iter().find(|g| g.contains(&k)) {
                Some(group) => group.iter().all(|k| same(k)),
                None => same(k),
            },
        };
        let rest = jm
            .iter()
            .filter(|(k, _)| !shared(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(rest)
    }

    /// The `anyOf` of every combination of one branch from `a` and one from `b` (both `anyOf`s
    /// applying to the same instance), or `Unsupported` past [`MAX_BRANCHES`].
    pub(super) fn any_of_product(a: &Value, b: &Value, pointer: &str) -> Result<Value> {
        let (Some(a), Some(b)) = (a.as_array(), b.as_array()) else {
            return Err(invalid(pointer, "anyOf is an array"));
        };
        if a.len() * b.len() > MAX_BRANCHES {
            return Err(unsupported(
                "anyOf",
                pointer,
                &format!("combining two anyOf gives more than {MAX_BRANCHES} branches"),
            ));
        }
        let mut out = Vec::new();
        for x in a {
            for y in b {
                out.push(json!({"allOf": [x, y]}));
            }
        }
        Ok(Value::Array(out))
    }
}

/// The typed error for a keyword whose negation is not supported.
fn refuse(k: &str, pointer: &str) -> super::SchemaError {
    unsupported(
        "not",
        pointer,
        &format!("negating `{k}` is not supported yet"),
    )
}

/// An object whose member `name` is present and is `n` (a member failing its schema); nothing
/// (`false`) where no value fails it.
fn member_fails(name: &str, n: Value) -> Value {
    if n == Value::Bool(false) {
        return n;
    }
    json!({"type": "object", "required": [name], "properties": {name: n}})
}

/// The failures of `type` (value `v`): any other type, and a non-integer number where
/// `integer` is listed without `number`.
fn negate_type(v: &Value, pointer: &str) -> Result<Vec<Value>> {
    let listed: Vec<&str> = match v {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return Err(invalid(&child(pointer, "type"), "expected a type")),
    };
    let others: Vec<&str> = TYPES
        .iter()
        .copied()
        .filter(|t| !(listed.contains(t) || *t == "number" && listed.contains(&"integer")))
        .collect();
    let mut out = vec![json!({ "type": others })];
    if listed.contains(&"integer") && !listed.contains(&"number") {
        out.push(json!({"type": "number", "not": {"type": "integer"}}));
    }
    Ok(out)
}

/// The failure of a count bound (`minLength` … `maxProperties`, value `v`): the opposite bound
/// on the same type; `None` for a minimum of 0, which nothing fails.
fn negate_count(k: &str, v: &Value, pointer: &str) -> Result<Option<Value>> {
    let n = super::as_count(v, pointer, k)?;
    let (t, opposite, bound) = match k {
        "minLength" if n > 0 => ("string", "maxLength", n - 1),
        "minItems" if n > 0 => ("array", "maxItems", n - 1),
        "minProperties" if n > 0 => ("object", "maxProperties", n - 1),
        "minLength" | "minItems" | "minProperties" => return Ok(None),
        "maxLength" => ("string", "minLength", n + 1),
        "maxItems" => ("array", "minItems", n + 1),
        _ => ("object", "minProperties", n + 1),
    };
    Ok(Some(json!({"type": t, opposite: bound})))
}

/// One keyword of a schema object being negated: its name and value, the object it is in, where
/// that object is, and the nesting depth.
#[derive(Clone, Copy)]
struct Keyword<'a> {
    name: &'a str,
    value: &'a Value,
    schema: &'a Map<String, Value>,
    pointer: &'a str,
    depth: usize,
}
