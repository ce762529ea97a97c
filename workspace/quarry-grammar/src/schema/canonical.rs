//! Canonical form of an instance for a schema: what quarry would have written.

use serde_json::{Map, Value};

use super::{resolve_local, Whitespace};

/// `instance` re-serialized in quarry's canonical form for `schema`: laid out as `whitespace`
/// writes it (see [`Whitespace::render`]), object properties in the order the schema lists them,
/// then the others in their own order.
pub fn canonicalize(instance: &Value, schema: &Value, whitespace: Whitespace) -> String {
    fn order(v: &Value, s: &Value, root: &Value, depth: usize) -> Value {
        let s = match s.get("$ref").and_then(Value::as_str) {
            Some(r) if depth < 32 => resolve_local(root, r).unwrap_or(s),
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
                                Some(r) => resolve_local(root, r).unwrap_or(b),
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
    // References as pointers from the root (a schema whose identifiers are malformed is
    // taken as it is).
    let flat = super::resolve::flatten(schema).unwrap_or(std::borrow::Cow::Borrowed(schema));
    whitespace.render(&order(instance, &flat, &flat, 0))
}
