//! The Arrow schema of a job's records, derived from its JSON Schema, and the lineage columns every
//! accepted and rejected row carries.
//!
//! Mapping: object → struct, array → list, integer → int64, number → float64, string and string
//! enums → utf8, boolean → bool. A property is nullable unless it is `required` and not
//! nullable itself. Shapes Arrow cannot express (unions of different types, objects with open
//! `additionalProperties`, tuples, recursive `$ref`s) become a utf8 column holding the value as JSON
//! text. A missing `additionalProperties` means `false`, as in the decoder's strict default.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use serde_json::Value;

use crate::error::SchemaProblem;

/// Names of the lineage columns, in file order after the record's own columns.
pub const LINEAGE_COLUMNS: [&str; 11] = [
    "_source",
    "_partition",
    "_offset",
    "_doc_id",
    "_model",
    "_schema_sha256",
    "_finish_reason",
    "_extracted_at",
    "_key",
    "_timestamp",
    "_headers",
];

/// Columns of the rejects dataset after the lineage.
pub const REJECT_COLUMNS: [&str; 4] = ["cause", "detail", "raw_output", "input_preview"];

/// How one JSON value is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Bool,
    Int,
    Float,
    Str,
    /// Stored as JSON text in a utf8 column.
    Json,
    Struct(Vec<(String, Shape, bool)>),
    List(Box<Shape>),
    /// Only `null` is allowed (a union branch); stored as a utf8 column of nulls on its own.
    Null,
}

impl Shape {
    pub fn data_type(&self) -> DataType {
        match self {
            Shape::Bool => DataType::Boolean,
            Shape::Int => DataType::Int64,
            Shape::Float => DataType::Float64,
            Shape::Str | Shape::Json | Shape::Null => DataType::Utf8,
            Shape::Struct(fields) => DataType::Struct(struct_fields(fields)),
            Shape::List(item) => {
                DataType::List(Arc::new(Field::new("item", item.data_type(), true)))
            }
        }
    }

    /// Rewrites a validated value into what the Arrow JSON decoder expects for this shape:
    /// JSON-text columns become strings, integral floats in integer columns become integers.
    pub fn conform(&self, v: Value) -> Value {
        match (self, v) {
            (_, Value::Null) => Value::Null,
            (Shape::Json, v) => Value::String(v.to_string()),
            (Shape::Int, Value::Number(n)) if n.as_i64().is_none() => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
                _ => Value::Number(n),
            },
            (Shape::Struct(fields), Value::Object(mut map)) => {
                let mut out = serde_json::Map::with_capacity(fields.len());
                for (name, shape, _) in fields {
                    if let Some(v) = map.remove(name) {
                        out.insert(name.clone(), shape.conform(v));
                    }
                }
                Value::Object(out)
            }
            (Shape::List(item), Value::Array(items)) => {
                Value::Array(items.into_iter().map(|v| item.conform(v)).collect())
            }
            (_, v) => v,
        }
    }
}

fn struct_fields(fields: &[(String, Shape, bool)]) -> Fields {
    fields
        .iter()
        .map(|(name, shape, nullable)| Field::new(name, shape.data_type(), *nullable))
        .collect()
}

/// The record columns of a job: a top-level object's properties, or one `value` column.
#[derive(Debug, Clone)]
pub struct RecordShape {
    pub root: Shape,
    /// The record's own columns (before lineage).
    pub fields: Vec<(String, Shape, bool)>,
    /// The record is not an object: it lives in one `value` column.
    wrapped: bool,
}

impl RecordShape {
    /// Derives the columns from a JSON Schema document.
    pub fn derive(schema: &Value) -> Result<Self, SchemaProblem> {
        // References through `$id`s and anchors as pointers from the root, as they are decoded.
        let flat = quarry_grammar::schema::flatten(schema)?;
        let schema = &*flat;
        let (root, nullable) = shape_of(schema, schema, 0);
        let (fields, wrapped) = match &root {
            Shape::Struct(fields) if !nullable => (fields.clone(), false),
            other => (vec![("value".to_string(), other.clone(), true)], true),
        };
        for (name, _, _) in &fields {
            if LINEAGE_COLUMNS.contains(&name.as_str()) {
                return Err(SchemaProblem::LineageCollision(name.clone()));
            }
        }
        Ok(Self {
            root,
            fields,
            wrapped,
        })
    }

    /// A record conformed to the columns, as one JSON object keyed by column name.
    pub fn row(&self, record: Value) -> Value {
        if self.wrapped {
            serde_json::json!({ "value": self.root.conform(record) })
        } else {
            self.root.conform(record)
        }
    }

    pub fn record_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(struct_fields(&self.fields)))
    }

    /// The accepted dataset's schema: record columns, then lineage.
    pub fn accepted_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .fields
            .iter()
            .map(|(n, s, null)| Field::new(n, s.data_type(), *null))
            .collect();
        fields.extend(lineage_fields());
        Arc::new(Schema::new(fields))
    }
}

/// The rejects dataset's schema: lineage, then cause, detail, raw output and input preview.
pub fn rejects_schema() -> SchemaRef {
    let mut fields = lineage_fields();
    fields.push(Field::new("cause", DataType::Utf8, false));
    fields.push(Field::new("detail", DataType::Utf8, false));
    fields.push(Field::new("raw_output", DataType::Utf8, true));
    fields.push(Field::new("input_preview", DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

pub fn lineage_fields() -> Vec<Field> {
    let utc: Arc<str> = Arc::from("UTC");
    vec![
        Field::new("_source", DataType::Utf8, false),
        Field::new("_partition", DataType::Int32, true),
        Field::new("_offset", DataType::Int64, false),
        Field::new("_doc_id", DataType::Utf8, false),
        Field::new("_model", DataType::Utf8, false),
        Field::new("_schema_sha256", DataType::Utf8, false),
        Field::new("_finish_reason", DataType::Utf8, true),
        Field::new(
            "_extracted_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some(utc.clone())),
            false,
        ),
        Field::new("_key", DataType::Binary, true),
        Field::new(
            "_timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some(utc)),
            true,
        ),
        Field::new("_headers", DataType::Utf8, true),
    ]
}

const MAX_REF_DEPTH: usize = 32;

/// The shape of `s`, and whether it admits null.
fn shape_of(s: &Value, root: &Value, depth: usize) -> (Shape, bool) {
    if depth > MAX_REF_DEPTH {
        return (Shape::Json, true);
    }
    let Some(obj) = s.as_object() else {
        // `true`, `false` or something odd: anything goes.
        return (Shape::Json, true);
    };
    if let Some(Value::String(r)) = obj.get("$ref") {
        return match resolve_ref(root, r) {
            Some(target) => shape_of(target, root, depth + 1),
            None => (Shape::Json, true),
        };
    }
    if let Some(c) = obj.get("const") {
        return shape_of_values(std::slice::from_ref(c));
    }
    if let Some(Value::Array(vals)) = obj.get("enum") {
        return shape_of_values(vals);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = obj.get(key) {
            let shapes: Vec<(Shape, bool)> = branches
                .iter()
                .map(|b| shape_of(b, root, depth + 1))
                .collect();
            return unify(shapes);
        }
    }
    if let Some(Value::Array(parts)) = obj.get("allOf") {
        return match parts.as_slice() {
            [one] => shape_of(one, root, depth + 1),
            _ => (Shape::Json, true),
        };
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if obj.contains_key("properties") => vec!["object"],
        _ if obj.contains_key("items") => vec!["array"],
        _ => return (Shape::Json, true),
    };
    let nullable = types.contains(&"null");
    let mut shapes: Vec<(Shape, bool)> = types
        .iter()
        .filter(|t| **t != "null")
        .map(|t| (of_type(t, obj, root, depth), nullable))
        .collect();
    if nullable && shapes.is_empty() {
        return (Shape::Null, true);
    }
    if shapes.len() == 1 {
        return shapes.pop().unwrap();
    }
    unify(shapes)
}

fn of_type(t: &str, obj: &serde_json::Map<String, Value>, root: &Value, depth: usize) -> Shape {
    match t {
        "boolean" => Shape::Bool,
        "integer" => Shape::Int,
        "number" => Shape::Float,
        "string" => Shape::Str,
        "array" => match (obj.get("items"), obj.get("prefixItems")) {
            (_, Some(_)) => Shape::Json,
            (Some(items), None) if items.is_object() => {
                Shape::List(Box::new(shape_of(items, root, depth + 1).0))
            }
            _ => Shape::List(Box::new(Shape::Json)),
        },
        "object" => {
            let open = matches!(obj.get("additionalProperties"), Some(v) if v != &Value::Bool(false))
                || obj.contains_key("patternProperties");
            let props = obj.get("properties").and_then(Value::as_object);
            match props {
                Some(props) if !open && !props.is_empty() => {
                    let required: Vec<&str> = obj
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|r| r.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    Shape::Struct(
                        props
                            .iter()
                            .map(|(name, sub)| {
                                let (shape, nullable) = shape_of(sub, root, depth + 1);
                                let null = nullable || !required.contains(&name.as_str());
                                (name.clone(), shape, null)
                            })
                            .collect(),
                    )
                }
                _ => Shape::Json,
            }
        }
        _ => Shape::Json,
    }
}

/// One shape for a union: nulls only make it nullable; integers widen to numbers; anything
/// else mixed is JSON text.
fn unify(shapes: Vec<(Shape, bool)>) -> (Shape, bool) {
    let nullable = shapes.iter().any(|(s, n)| *n || *s == Shape::Null);
    let mut kinds: Vec<Shape> = Vec::new();
    for (s, _) in shapes {
        if s != Shape::Null && !kinds.contains(&s) {
            kinds.push(s);
        }
    }
    match kinds.as_slice() {
        [] => (Shape::Null, true),
        [one] => (one.clone(), nullable),
        [a, b]
            if matches!(
                (a, b),
                (Shape::Int, Shape::Float) | (Shape::Float, Shape::Int)
            ) =>
        {
            (Shape::Float, nullable)
        }
        _ => (Shape::Json, nullable),
    }
}

fn shape_of_values(vals: &[Value]) -> (Shape, bool) {
    let shapes = vals
        .iter()
        .map(|v| match v {
            Value::Null => (Shape::Null, true),
            Value::Bool(_) => (Shape::Bool, false),
            Value::Number(n) if n.is_i64() || n.is_u64() => (Shape::Int, false),
            Value::Number(_) => (Shape::Float, false),
            Value::String(_) => (Shape::Str, false),
            _ => (Shape::Json, false),
        })
        .collect::<Vec<_>>();
    unify(shapes)
}

/// A `$ref` as a pointer from the root (`#/$defs/x`, `#`; [`RecordShape::derive`] resolves the
/// others to that form first); a document that was not given is JSON text.
fn resolve_ref<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let pointer = r.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_through_ids_give_the_same_columns_as_pointers() {
        let by_id = json!({"$id": "http://x/root", "type": "object", "required": ["n"],
            "properties": {"n": {"$ref": "defs/n"}},
            "$defs": {"n": {"$id": "defs/n", "type": "integer"}}});
        let by_pointer = json!({"type": "object", "required": ["n"],
            "properties": {"n": {"$ref": "#/$defs/n"}},
            "$defs": {"n": {"type": "integer"}}});
        assert_eq!(cols(by_id), cols(by_pointer.clone()));
        assert_eq!(cols(by_pointer)[0].1, DataType::Int64);
    }

    fn cols(schema: Value) -> Vec<(String, DataType, bool)> {
        RecordShape::derive(&schema)
            .unwrap()
            .record_schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone(), f.is_nullable()))
            .collect()
    }

    #[test]
    fn maps_each_json_type() {
        let c = cols(json!({
            "type": "object",
            "required": ["name", "n", "tags", "ok"],
            "properties": {
                "name": {"type": "string"},
                "n": {"type": "integer"},
                "x": {"type": "number"},
                "ok": {"type": "boolean"},
                "kind": {"enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "owner": {"type": "object", "required": ["id"],
                          "properties": {"id": {"type": "integer"}, "mail": {"type": ["string", "null"]}}},
                "mixed": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "open": {"type": "object", "additionalProperties": true}
            }
        }));
        let get = |n: &str| c.iter().find(|(name, _, _)| name == n).unwrap().clone();
        assert_eq!(get("name"), ("name".into(), DataType::Utf8, false));
        assert_eq!(get("n").1, DataType::Int64);
        assert_eq!(get("x"), ("x".into(), DataType::Float64, true));
        assert_eq!(get("ok").1, DataType::Boolean);
        assert_eq!(get("kind").1, DataType::Utf8);
        assert!(matches!(get("tags").1, DataType::List(f) if f.data_type() == &DataType::Utf8));
        let DataType::Struct(owner) = get("owner").1 else {
            panic!("owner is not a struct")
        };
        assert!(!owner[0].is_nullable() && owner[0].data_type() == &DataType::Int64);
        assert!(owner[1].is_nullable());
        assert_eq!(get("mixed").1, DataType::Utf8, "a mixed union is JSON text");
        assert_eq!(get("either"), ("either".into(), DataType::Int64, true));
        assert_eq!(get("open").1, DataType::Utf8);
    }

    #[test]
    fn refs_resolve_and_recursion_falls_back() {
        let c = cols(json!({
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/item"}, "tree": {"$ref": "#/$defs/node"}},
            "$defs": {
                "item": {"type": "integer"},
                "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
            }
        }));
        assert_eq!(c[0].1, DataType::Int64);
        // Recursion ends as JSON text at the depth limit rather than looping.
        assert!(matches!(&c[1].1, DataType::Struct(_)));
    }

    #[test]
    fn conform_turns_json_columns_into_text() {
        let shape = RecordShape::derive(&json!({
            "type": "object",
            "properties": {"m": {"anyOf": [{"type": "string"}, {"type": "object"}]}, "n": {"type": "integer"}}
        }))
        .unwrap();
        let row = shape.row(json!({"m": {"k": [1, 2]}, "n": 3.0}));
        assert_eq!(row, json!({"m": "{\"k\":[1,2]}", "n": 3}));
    }

    #[test]
    fn lineage_names_are_reserved() {
        let err = RecordShape::derive(
            &json!({"type": "object", "properties": {"_offset": {"type": "integer"}}}),
        )
        .unwrap_err();
        assert!(
            matches!(&err, SchemaProblem::LineageCollision(name) if name == "_offset"),
            "{err}"
        );
    }

    #[test]
    fn non_object_root_is_one_value_column() {
        let c = cols(json!({"type": "array", "items": {"type": "integer"}}));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "value");
    }
}
