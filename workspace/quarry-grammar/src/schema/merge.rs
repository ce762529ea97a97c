//! `allOf` merging: the intersection of two schemas as one schema, where merging keyword by
//! keyword is exact, and `$ref` targets inlined so they can be merged.

use serde_json::{json, Map, Value};

use super::{
    child, invalid, json_equal, resolve_local, unsupported, Draft, Result, Translator, ANNOTATIONS,
};

impl Translator<'_> {
    /// A `$ref`-only schema replaced by its target (with the other keywords merged in, from
    /// 2019-09 on). Other schemas are returned as they are.
    pub(super) fn inline_ref(&mut self, s: &Value, pointer: &str, depth: usize) -> Result<Value> {
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
        let target = resolve_local(self.root, r)
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
    pub(super) fn merge(
        &mut self,
        a: &Value,
        b: &Value,
        pointer: &str,
        depth: usize,
    ) -> Result<Value> {
        self.nested(pointer, |t| t.merge_unchecked(a, b, pointer, depth))
    }

    fn merge_unchecked(
        &mut self,
        a: &Value,
        b: &Value,
        pointer: &str,
        depth: usize,
    ) -> Result<Value> {
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
        let (mut out, mut b) = match (a, b) {
            (Value::Object(a), Value::Object(b)) => (a, b),
            (a, b) => return self.merge(&a, &b, pointer, depth + 1),
        };
        self.settle_unevaluated(&mut out);
        self.settle_unevaluated(&mut b);
        self.separate_conditionals(&out, &mut b, pointer, depth)?;
        // additionalProperties read against each side's own properties, made explicit: a name
        // one side declares and the other does not takes the other's additionalProperties.
        let (mut out, mut b) = Self::close_properties(out, b);
        self.merge_tuples(&mut out, &mut b);
        Self::check_coupled(&out, &b, pointer)?;
        for (k, vb) in b {
            // Annotations, definitions included: every reference is a pointer from the root
            // (`resolve::flatten`), so definitions carried into a merge are never read, and
            // copying them made every merge next to a root's `$defs` copy all of them.
            if ANNOTATIONS.contains(&k.as_str()) {
                continue;
            }
            let Some(va) = out.get(&k).cloned() else {
                out.insert(k, vb);
                continue;
            };
            if json_equal(&va, &vb) {
                continue;
            }
            match self.merge_keyword(&k, va, vb, pointer)? {
                Some(merged) => out.insert(k, merged),
                // Nothing satisfies both (two different `const`s).
                None => return Ok(Value::Bool(false)),
            };
        }
        Ok(Value::Object(out))
    }

    /// Two different conditionals cannot share one object's `if`: `b`'s becomes the `anyOf` it
    /// stands for, `(if ∧ then) ∨ (¬if ∧ else)`, merged with `b`'s own `anyOf` by product.
    fn separate_conditionals(
        &mut self,
        out: &Map<String, Value>,
        b: &mut Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<()> {
        let conditional =
            |m: &Map<String, Value>| ["if", "then", "else"].map(|k| m.get(k).cloned());
        if self.draft < Draft::D7
            || !b.contains_key("if")
            || !out.contains_key("if")
            || conditional(out) == conditional(b)
        {
            return Ok(());
        }
        let cond = b.remove("if").expect("checked");
        let then = b.remove("then").unwrap_or(Value::Bool(true));
        let other = b.remove("else").unwrap_or(Value::Bool(true));
        let negated = self.negate(&cond, &child(pointer, "if"), depth + 1)?;
        let branches = json!([{"allOf": [cond, then]}, {"allOf": [negated, other]}]);
        let any = match b.remove("anyOf") {
            Some(a) => Self::any_of_product(&a, &branches, pointer)?,
            None => branches,
        };
        b.insert("anyOf".into(), any);
        Ok(())
    }

    /// Refuses to merge a keyword whose meaning depends on a sibling in the same schema object
    /// (`additionalProperties` on `properties`, …) when that sibling differs between the sides.
    fn check_coupled(
        out: &Map<String, Value>,
        b: &Map<String, Value>,
        pointer: &str,
    ) -> Result<()> {
        const COUPLED: &[(&str, &str)] = &[
            ("additionalProperties", "properties"),
            ("additionalProperties", "patternProperties"),
            ("unevaluatedProperties", "properties"),
            ("unevaluatedProperties", "patternProperties"),
            ("unevaluatedProperties", "additionalProperties"),
            ("unevaluatedItems", "items"),
            ("unevaluatedItems", "prefixItems"),
            ("unevaluatedItems", "contains"),
            ("items", "prefixItems"),
            ("additionalItems", "items"),
        ];
        for (x, y) in COUPLED {
            // `x` is read against its own object's `y`: merging is exact only if `y` is the same
            // on both sides (allOf [{properties: a, additionalProperties: false},
            // {properties: b, additionalProperties: false}] admits neither a nor b).
            let same_y = match (out.get(*y), b.get(*y)) {
                (None, None) => true,
                // For properties only the names matter: which names are "additional".
                (Some(Value::Object(p)), Some(Value::Object(q))) if *y == "properties" => {
                    p.len() == q.len() && p.keys().all(|k| q.contains_key(k))
                }
                (Some(p), Some(q)) => json_equal(p, q),
                _ => false,
            };
            // A side with neither keyword leaves the other's pair as it is.
            let untouched = |m: &Map<String, Value>| !m.contains_key(*x) && !m.contains_key(*y);
            if (out.contains_key(*x) || b.contains_key(*x))
                && !same_y
                && !untouched(out)
                && !untouched(b)
            {
                return Err(unsupported(
                    x,
                    pointer,
                    &format!(
                        "merging `{x}` with `{y}` from another allOf branch is not supported yet"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Keyword `k` of both sides (`va` and `vb`, which differ) as one value; `None` where no
    /// instance can satisfy both (two different `const`s).
    fn merge_keyword(&self, k: &str, va: Value, vb: Value, pointer: &str) -> Result<Option<Value>> {
        let lowest = |va: &Value, vb: &Value| {
            json!(va
                .as_f64()
                .unwrap_or(f64::MAX)
                .min(vb.as_f64().unwrap_or(f64::MAX)))
        };
        let highest = |va: &Value, vb: &Value| {
            json!(va.as_f64().unwrap_or(0.0).max(vb.as_f64().unwrap_or(0.0)))
        };
        let merged = match k {
            "type" => merge_types(&va, &vb),
            "required" => {
                let mut r = va.as_array().cloned().unwrap_or_default();
                for x in vb.as_array().cloned().unwrap_or_default() {
                    if !r.contains(&x) {
                        r.push(x);
                    }
                }
                Value::Array(r)
            }
            "properties" => {
                let mut p = va.as_object().cloned().unwrap_or_default();
                for (name, s) in vb.as_object().cloned().unwrap_or_default() {
                    let v = match p.get(&name) {
                        Some(prev) => json!({ "allOf": [prev, s] }),
                        None => s,
                    };
                    p.insert(name, v);
                }
                Value::Object(p)
            }
            "minimum" | "minLength" | "minItems" => highest(&va, &vb),
            "maximum" | "maxLength" | "maxItems" => lowest(&va, &vb),
            "exclusiveMinimum" if self.draft > Draft::D4 => highest(&va, &vb),
            "exclusiveMaximum" if self.draft > Draft::D4 => lowest(&va, &vb),
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
            "const" => return Ok(None),
            // Both apply to the same items (the prefixes are the same: see `check_coupled`).
            "items" | "additionalItems" if va.is_object() && vb.is_object() => {
                json!({ "allOf": [va, vb] })
            }
            "multipleOf" => merge_multiple_of(&va, &vb, pointer)?,
            // Both apply to the same names (see close_properties).
            "additionalProperties" => json!({ "allOf": [va, vb] }),
            "anyOf" => Self::any_of_product(&va, &vb, pointer)?,
            "not" => json!({ "anyOf": [va, vb] }),
            other => {
                return Err(unsupported(
                    other,
                    pointer,
                    "two allOf branches set it differently; merging it is not supported yet",
                ))
            }
        };
        Ok(Some(merged))
    }

    /// `unevaluatedProperties`/`unevaluatedItems` of a schema object without in-place
    /// applicators see only that object's own keywords, not the other `allOf` branch's: they are
    /// `additionalProperties` (`items`; `additionalItems` after an array `items` in 2019-09)
    /// against them, and nothing where those already evaluate every member. Written so, they
    /// merge exactly like those keywords. `unevaluatedItems` next to `contains` (which evaluates
    /// the items it matches) stays as it is.
    fn settle_unevaluated(&self, m: &mut Map<String, Value>) {
        const IN_PLACE: &[&str] = &[
            "$ref",
            "allOf",
            "anyOf",
            "oneOf",
            "not",
            "if",
            "then",
            "else",
            "dependentSchemas",
            "dependencies",
        ];
        if self.draft < Draft::D2019 || IN_PLACE.iter().any(|k| m.contains_key(*k)) {
            return;
        }
        if let Some(v) = m.remove("unevaluatedProperties") {
            if !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), v);
            }
        }
        if m.contains_key("unevaluatedItems") && !m.contains_key("contains") {
            let v = m.remove("unevaluatedItems").expect("checked");
            let rest = match m.get("items") {
                None => Some("items"),
                Some(Value::Array(_)) if self.draft < Draft::D2020 => {
                    Some("additionalItems").filter(|k| !m.contains_key(*k))
                }
                Some(_) => None,
            };
            if let Some(k) = rest {
                m.insert(k.into(), v);
            }
        }
    }

    /// Two different tuples (`prefixItems` and `items`; before 2020-12 an array `items` and
    /// `additionalItems`) as one: position `i` takes both sides' schemas for it (its prefix entry,
    /// else its rest), the rest takes both rests. Exact, and what a parent's `unevaluatedItems`
    /// sees is the same (the longer prefix, or everything where a side has a rest). Both sides
    /// get the merged tuple; a side whose own `unevaluatedItems` reads its tuple is left alone.
    fn merge_tuples(&self, a: &mut Map<String, Value>, b: &mut Map<String, Value>) {
        let (prefix_key, rest_key) = if self.draft >= Draft::D2020 {
            ("prefixItems", "items")
        } else {
            ("items", "additionalItems")
        };
        let tuple = |m: &Map<String, Value>| -> (Vec<Value>, Option<Value>) {
            match m.get(prefix_key) {
                Some(Value::Array(p)) => (p.clone(), m.get(rest_key).cloned()),
                // Before 2020-12 a schema-valued `items` is the rest of an empty tuple.
                _ if prefix_key == "items" => (Vec::new(), m.get("items").cloned()),
                _ => (Vec::new(), m.get(rest_key).cloned()),
            }
        };
        let (pa, ra) = tuple(a);
        let (pb, rb) = tuple(b);
        let reads_tuple = |m: &Map<String, Value>| m.contains_key("unevaluatedItems");
        if (pa.is_empty() && pb.is_empty())
            || reads_tuple(a)
            || reads_tuple(b)
            || (json_equal(&Value::Array(pa.clone()), &Value::Array(pb.clone()))
                && ra
                    .as_ref()
                    .zip(rb.as_ref())
                    .is_none_or(|(x, y)| json_equal(x, y))
                && ra.is_some() == rb.is_some())
        {
            return;
        }
        let both = |x: Option<&Value>, y: Option<&Value>| -> Option<Value> {
            match (x, y) {
                (None, None) => None,
                (Some(v), None) | (None, Some(v)) => Some(v.clone()),
                (Some(x), Some(y)) if json_equal(x, y) => Some(x.clone()),
                (Some(x), Some(y)) => Some(json!({"allOf": [x, y]})),
            }
        };
        let n = pa.len().max(pb.len());
        let prefix: Vec<Value> = (0..n)
            .map(|i| {
                both(pa.get(i).or(ra.as_ref()), pb.get(i).or(rb.as_ref()))
                    .unwrap_or(Value::Bool(true))
            })
            .collect();
        let rest = both(ra.as_ref(), rb.as_ref());
        for m in [a, b] {
            m.insert(prefix_key.into(), Value::Array(prefix.clone()));
            match &rest {
                Some(r) => m.insert(rest_key.into(), r.clone()),
                None => m.remove(rest_key),
            };
        }
    }

    /// For two objects without `patternProperties` where at least one has
    /// `additionalProperties`: each name declared on only one side gets the other side's
    /// `additionalProperties` in an `allOf`, and both get the same `properties` keys, so the merge
    /// below is exact (`additionalProperties` is then merged as any other keyword).
    fn close_properties(
        mut a: Map<String, Value>,
        mut b: Map<String, Value>,
    ) -> (Map<String, Value>, Map<String, Value>) {
        let ap = "additionalProperties";
        let pattern = |m: &Map<String, Value>| m.contains_key("patternProperties");
        if pattern(&a) || pattern(&b) || (!a.contains_key(ap) && !b.contains_key(ap)) {
            return (a, b);
        }
        let names = |m: &Map<String, Value>| -> Vec<String> {
            m.get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        let (na, nb) = (names(&a), names(&b));
        let widen = |m: &mut Map<String, Value>, own: &[String], theirs: &[String]| {
            let extra = m.get(ap).cloned().unwrap_or(Value::Bool(true));
            let props = m
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(p) = props {
                for n in theirs.iter().filter(|n| !own.contains(n)) {
                    p.insert(n.clone(), extra.clone());
                }
            }
        };
        widen(&mut a, &na, &nb);
        widen(&mut b, &nb, &na);
        (a, b)
    }
}

/// The types both `type` values allow (`integer` where one says `number` and the other
/// `integer`).
fn merge_types(va: &Value, vb: &Value) -> Value {
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
    let (ta, tb) = (list(va), list(vb));
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

/// Multiples of two integers are the multiples of their least common multiple; other pairs are
/// not merged.
fn merge_multiple_of(va: &Value, vb: &Value, pointer: &str) -> Result<Value> {
    match (va.as_u64(), vb.as_u64()) {
        (Some(x), Some(y)) if x > 0 && y > 0 => {
            let gcd = |mut a: u64, mut b: u64| {
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                a
            };
            match (x / gcd(x, y)).checked_mul(y) {
                Some(l) => Ok(json!(l)),
                None => Err(unsupported(
                    "multipleOf",
                    pointer,
                    "the least common multiple overflows",
                )),
            }
        }
        _ => Err(unsupported(
            "multipleOf",
            pointer,
            "two allOf branches set it differently (other than two integers); \
             merging it is not supported yet",
        )),
    }
}
