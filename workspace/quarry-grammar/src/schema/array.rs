//! Arrays: prefix items, item counts, `contains`, and `uniqueItems` over finite item domains (other
//! `uniqueItems` are checked while decoding: [`super::unique`]).

use serde_json::{json, Map, Value};

use super::{
    as_count, child, count, invalid, json_equal, unsupported, value_literal, Draft, Re, Result,
    Translator, UnevaluatedOf, ANNOTATIONS,
};

impl Translator<'_> {
    pub(super) fn array(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
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
        // Over a finite item domain, uniqueness is written into the language; otherwise the
        // array is written without it and every matcher checks it while decoding (`unique`).
        if m.get("uniqueItems") == Some(&Value::Bool(true)) && !at_most_one {
            if let Some(values) = self.finite_items(m) {
                return self.unique_array(m, &values, pointer);
            }
        }
        let min = count(m, pointer, "minItems")?.unwrap_or(0);
        let mut max = count(m, pointer, "maxItems")?;
        let items = self.item_schemas(m, pointer)?;
        let k = items.prefix.len() as u64;
        if items.rest == Value::Bool(false) {
            max = Some(max.map_or(k, |x| x.min(k)));
        }
        if max.is_some_and(|x| x < min) {
            return Ok(Re::nothing());
        }
        let mut prefix = Vec::new();
        for (i, p) in items.prefix.iter().enumerate() {
            if max.is_some_and(|x| i as u64 >= x) {
                break;
            }
            prefix.push(self.child_value(p, &child(&items.prefix_pointer, &i.to_string()))?);
        }
        let rest = if max.is_none_or(|x| x > k) {
            Some(self.child_value(&items.rest, &items.rest_pointer)?)
        } else {
            None
        };
        let body = elements(&prefix, rest.as_ref(), k, min, max, &self.sep.comma);
        Ok(self.sep.bracketed(r"\[", body, r"\]"))
    }

    /// The schemas of an array's items, as the declared draft spells them: the prefix (2020-12's
    /// `prefixItems`, earlier an array-valued `items`), and the schema of every item after it
    /// (`items`, earlier `additionalItems`; without it `unevaluatedItems`, or anything).
    fn item_schemas(&self, m: &Map<String, Value>, pointer: &str) -> Result<ItemSchemas> {
        let unevaluated = self.unevaluated(m, UnevaluatedOf::Items);
        let otherwise = unevaluated.unwrap_or(Value::Bool(true));
        let (prefix, rest): (Vec<Value>, Value) = if self.draft >= Draft::D2020 {
            let prefix = match m.get("prefixItems") {
                Some(Value::Array(p)) => p.clone(),
                Some(_) => {
                    return Err(invalid(&child(pointer, "prefixItems"), "expected an array"))
                }
                None => Vec::new(),
            };
            (prefix, m.get("items").cloned().unwrap_or(otherwise))
        } else {
            match m.get("items") {
                Some(Value::Array(p)) => (
                    p.clone(),
                    m.get("additionalItems").cloned().unwrap_or(otherwise),
                ),
                Some(s) => (Vec::new(), s.clone()),
                None => (Vec::new(), otherwise),
            }
        };
        let rest_pointer =
            if self.draft >= Draft::D2020 || m.get("items").is_some_and(Value::is_object) {
                child(pointer, "items")
            } else {
                child(pointer, "additionalItems")
            };
        let prefix_pointer = if self.draft >= Draft::D2020 {
            child(pointer, "prefixItems")
        } else {
            child(pointer, "items")
        };
        Ok(ItemSchemas {
            prefix,
            rest,
            prefix_pointer,
            rest_pointer,
        })
    }

    /// The item values of an array whose items form a small finite set: `items` is an `enum`,
    /// a `const` or `{"type": "boolean"}` (and nothing else), with no prefix items.
    pub(super) fn finite_items(&self, m: &Map<String, Value>) -> Option<Vec<Value>> {
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
    pub(super) fn unique_array(
        &self,
        m: &Map<String, Value>,
        values: &[Value],
        pointer: &str,
    ) -> Result<Re> {
        let min = count(m, pointer, "minItems")?.unwrap_or(0);
        let max = count(m, pointer, "maxItems")?
            .unwrap_or(u64::MAX)
            .min(values.len() as u64);
        let lits: Vec<Re> = values.iter().map(|v| value_literal(v, &self.sep)).collect();
        fn rest(used: u32, lits: &[Re], min: u64, max: u64, comma: &Re) -> Re {
            let n = used.count_ones() as u64;
            let mut alts = Vec::new();
            if n < max {
                for (i, l) in lits.iter().enumerate() {
                    if used >> i & 1 == 0 {
                        let sep = if n == 0 { Re::empty() } else { comma.clone() };
                        alts.push(Re::seq([
                            sep,
                            l.clone(),
                            rest(used | 1 << i, lits, min, max, comma),
                        ]));
                    }
                }
            }
            if n >= min {
                alts.push(Re::empty());
            }
            Re::alt(alts)
        }
        if min > max {
            return Ok(Re::nothing());
        }
        let body = rest(0, &lits, min, max, &self.sep.comma);
        Ok(self.sep.bracketed(r"\[", body, r"\]"))
    }

    /// `contains` with `minContains`/`maxContains` (2019-09 on) and a schema-valued `items`: the
    /// elements are M (an item that matches `contains`) or N (an item that does not, or any item
    /// when there is no `maxContains`), with between `minContains` and `maxContains` Ms. Other
    /// array keywords next to `contains` are unsupported, except a `minItems` the Ms already
    /// satisfy.
    pub(super) fn array_contains(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
        let others = [
            "prefixItems",
            "additionalItems",
            "maxItems",
            "uniqueItems",
            "unevaluatedItems",
        ];
        // An enclosing schema's unevaluatedItems at this location counts as this one's own.
        let inherited = self
            .unevaluated
            .items
            .is_some()
            .then_some("unevaluatedItems");
        if let Some(k) = others
            .iter()
            .find(|k| m.contains_key(**k))
            .or(inherited.as_ref())
        {
            return Err(unsupported(
                k,
                pointer,
                "`contains` together with this keyword is not supported yet",
            ));
        }
        let items = match m.get("items") {
            None => Value::Bool(true),
            Some(Value::Array(_)) => {
                return Err(unsupported(
                    "items",
                    pointer,
                    "`contains` with an array of items is not supported yet",
                ))
            }
            Some(s) => s.clone(),
        };
        let Some(c) = m.get("contains") else {
            // minContains/maxContains without contains have no effect.
            let mut rest = m.clone();
            rest.remove("minContains");
            rest.remove("maxContains");
            return self.array(&rest, pointer);
        };
        let counts = self.draft >= Draft::D2019;
        let min = match m.get("minContains") {
            Some(v) if counts => as_count(v, pointer, "minContains")?,
            _ => 1,
        };
        let max = match m.get("maxContains") {
            Some(v) if counts => Some(as_count(v, pointer, "maxContains")?),
            _ => None,
        };
        let min_items = count(m, pointer, "minItems")?.unwrap_or(0);
        if min_items > min.max(1) || (min == 0 && min_items > 0) {
            return Err(unsupported(
                "minItems",
                pointer,
                "`contains` with a minItems above minContains is not supported yet",
            ));
        }
        if min > 16 || max.is_some_and(|x| x > 16) {
            return Err(unsupported(
                "minContains",
                pointer,
                "counts above 16 are not supported yet",
            ));
        }
        if max.is_some_and(|x| x < min) {
            return Ok(Re::nothing());
        }
        let here = child(pointer, "contains");
        let matching = self.child_value(&json!({"allOf": [items, c]}), &here)?;
        let other = match max {
            // Without an upper bound, the other elements may match `contains` too.
            None => self.child_value(&items, &child(pointer, "items"))?,
            Some(_) => {
                let not_c = self.negate(c, &here, 0)?;
                self.child_value(&json!({"allOf": [items, not_c]}), &here)?
            }
        };
        let sep = &self.sep.comma;
        // Any number of others, each after a separator.
        let others_after = Re::star(Re::seq([sep.clone(), other.clone()]));
        // Exactly k ≥ 1 matching elements, others around them.
        let with = |lo: u64, hi: Option<u64>| {
            Re::seq([
                Re::star(Re::seq([other.clone(), sep.clone()])),
                matching.clone(),
                others_after.clone(),
                Re::repeat(
                    Re::seq([sep.clone(), matching.clone(), others_after.clone()]),
                    lo - 1,
                    hi.map(|h| h - 1),
                ),
            ])
        };
        let mut bodies = Vec::new();
        if min == 0 {
            bodies.push(Re::empty());
            bodies.push(Re::seq([other.clone(), others_after.clone()]));
        }
        if max != Some(0) {
            bodies.push(with(min.max(1), max));
        }
        Ok(self.sep.bracketed(r"\[", Re::alt(bodies), r"\]"))
    }
}

/// An array's item schemas ([`Translator::item_schemas`]).
struct ItemSchemas {
    prefix: Vec<Value>,
    rest: Value,
    prefix_pointer: String,
    rest_pointer: String,
}

/// The items of an array between its brackets: the `prefix` values in order, then `rest` values
/// (if any may follow) to `max` items in all, at least `min` items, comma-separated. `k` is the
/// prefix's length before `maxItems` cut it.
fn elements(
    prefix: &[Re],
    rest: Option<&Re>,
    k: u64,
    min: u64,
    max: Option<u64>,
    comma: &Re,
) -> Re {
    // Items from position i on, after i items were written (i >= 1).
    let rest_from = |i: u64| -> Re {
        let Some(r) = rest else {
            return Re::empty();
        };
        match max {
            Some(x) if x <= i => Re::empty(),
            _ => Re::repeat(
                Re::seq([comma.clone(), r.clone()]),
                min.saturating_sub(i),
                max.map(|x| x - i),
            ),
        }
    };
    let mut tail = rest_from(k.max(1));
    // Prefix positions from the last down to 1 (position 0 is the first item).
    for i in (1..prefix.len() as u64).rev() {
        let cont = Re::seq([comma.clone(), prefix[i as usize].clone(), tail]);
        tail = if i >= min { Re::opt(cont) } else { cont };
    }
    match prefix.first().or(rest) {
        None => Re::empty(),
        Some(_) if max == Some(0) => Re::empty(),
        Some(first) => {
            let seq = Re::seq([first.clone(), tail]);
            if min == 0 {
                Re::opt(seq)
            } else {
                seq
            }
        }
    }
}
