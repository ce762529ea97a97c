//! References across a compound document: base URIs from `$id` (draft 4: `id`), plain-name
//! anchors (`$anchor`, `$dynamicAnchor`, draft 6/7's `$id: "#name"`), relative and absolute
//! `$ref`s, and documents given beside the schema ([`bundle`]).
//!
//! [`flatten`] resolves every `$ref` once, up front, the way a validator does (RFC 3986 against the
//! base URI of the schema object that holds it), and rewrites it as a JSON Pointer from the
//! document's root (`#/$defs/a/properties/b`); the identifiers it read are then dropped. The
//! translator merges, negates and copies subschemas, which moves a `$ref` away from the `$id`s
//! it was relative to; a pointer from the root means the same thing wherever it ends up. A
//! document whose references are all pointers already, with no identifiers, is used as it is.
//!
//! A reference to a resource that is neither in the document nor given is left as its absolute
//! URI; the translator refuses it when (and only if) it is reached, naming it. A `$dynamicRef`
//! becomes a `$ref` where its target is the same on every evaluation path ([`resolve_dynamic`]);
//! the others are left for the translator to refuse.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{Map, Value};
use url::Url;

use super::{child, invalid, Draft, Result};

/// Base URI of a document without `$id` (relative references resolve against it).
const DEFAULT_BASE: &str = "json-schema:///";

/// Keywords whose value is a subschema.
const ONE: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "items",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
];
/// Keywords whose value maps names to subschemas (`dependencies` values may also be lists of
/// names, which are skipped).
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];
/// Keywords whose value is a list of subschemas (`items` before 2020-12).
const LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// What a walk over the document found.
#[derive(Default)]
struct Index {
    /// Absolute URI of each resource (no fragment) → pointer of its root.
    resources: HashMap<String, String>,
    /// (resource URI, anchor name) → pointer.
    anchors: HashMap<(String, String), String>,
    /// Each `$ref`: pointer of the schema object holding it, its absolute target.
    refs: Vec<(String, Url)>,
    /// (resource URI, name) → pointer of each `$dynamicAnchor` (2020-12).
    dynamic_anchors: HashMap<(String, String), String>,
    /// Each `$dynamicRef`: pointer of the schema object holding it, its absolute target.
    dynamic_refs: Vec<(String, Url)>,
    /// The URI of the document's own resource (where evaluation starts).
    root_resource: String,
    /// Pointers of the schema objects whose identifiers were read (to drop them).
    identified: Vec<String>,
    /// Whether some reference is not already a pointer from the root.
    needs_rewrite: bool,
}

/// Name of the identifier keyword in `draft`.
fn id_keyword(draft: Draft) -> &'static str {
    if draft == Draft::D4 {
        "id"
    } else {
        "$id"
    }
}

/// Indexes every schema object under `root` (an explicit stack: schemas may nest deeper than a
/// thread's stack allows recursion). Compiling runs this on every schema, so it allocates only
/// per path segment and per base URI; a pointer is written out only for an object that has an
/// identifier or a reference.
fn walk(root: &Value, base: &Url, draft: Draft, index: &mut Index) -> Result<()> {
    /// One step of a path: a key, or an index into a list.
    enum Seg<'a> {
        Key(&'a str),
        At(usize),
    }
    let pointer_of = |segs: &[(usize, Seg)], mut node: usize| -> String {
        let mut parts = Vec::new();
        while node != 0 {
            let (parent, seg) = &segs[node];
            parts.push(seg);
            node = *parent;
        }
        let mut out = String::new();
        for seg in parts.iter().rev() {
            out = match seg {
                Seg::Key(k) => child(&out, k),
                Seg::At(i) => child(&out, &i.to_string()),
            };
        }
        out
    };
    let id_key = id_keyword(draft);
    let marks = [id_key, "$anchor", "$dynamicAnchor", "$ref", "$dynamicRef"];
    // Node 0 is the root; each node is (parent, step).
    let mut segs: Vec<(usize, Seg)> = vec![(0, Seg::At(0))];
    let mut bases: Vec<Url> = vec![base.clone()];
    let mut todo: Vec<(&Value, usize, usize)> = vec![(root, 0, 0)];
    while let Some((v, node, mut b)) = todo.pop() {
        let Value::Object(m) = v else {
            continue;
        };
        if marks.iter().any(|k| m.contains_key(*k)) {
            let pointer = pointer_of(&segs, node);
            let next = visit(m, &pointer, bases[b].clone(), draft, index)?;
            if next != bases[b] {
                bases.push(next);
                b = bases.len() - 1;
            }
        }
        if node == 0 {
            index.root_resource = bases[b].as_str().to_owned();
        }
        for (k, sub) in m {
            let key = k.as_str();
            let (one, list, map) = (ONE.contains(&key), LIST.contains(&key), MAP.contains(&key));
            if !(one || list || map) {
                continue;
            }
            segs.push((node, Seg::Key(key)));
            let here = segs.len() - 1;
            if one {
                todo.push((sub, here, b));
            }
            match sub {
                Value::Array(items) if list => {
                    for (i, s) in items.iter().enumerate() {
                        segs.push((here, Seg::At(i)));
                        todo.push((s, segs.len() - 1, b));
                    }
                }
                Value::Object(entries) if map => {
                    for (name, s) in entries {
                        segs.push((here, Seg::Key(name)));
                        todo.push((s, segs.len() - 1, b));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Reads one schema object's identifiers and reference; returns the base URI of its
/// subschemas.
fn visit(
    m: &Map<String, Value>,
    pointer: &str,
    mut base: Url,
    draft: Draft,
    index: &mut Index,
) -> Result<Url> {
    let has_ref = m.contains_key("$ref");
    // Up to draft 7 every keyword next to `$ref` is ignored, `$id` included.
    let id_applies = draft >= Draft::D2019 || !has_ref;
    let id_key = id_keyword(draft);
    if let (true, Some(id)) = (id_applies, m.get(id_key)) {
        let here = format!("#{}", child(pointer, id_key));
        let id = id
            .as_str()
            .ok_or_else(|| invalid(&here, "expected a string"))?;
        let mut url = base
            .join(id)
            .map_err(|e| invalid(&here, format!("{id:?} is not a URI reference: {e}")))?;
        let anchor = url.fragment().filter(|f| !f.is_empty()).map(str::to_owned);
        url.set_fragment(None);
        if !id.starts_with('#') {
            register(&mut index.resources, url.as_str(), pointer, &here)?;
            base = url;
        }
        if let (Some(a), true) = (anchor, draft <= Draft::D7) {
            register_anchor(index, base.as_str(), &a, pointer, &here)?;
        }
        index.identified.push(pointer.to_owned());
        index.needs_rewrite = true;
    }
    if draft >= Draft::D2019 {
        if let Some(a) = m.get("$anchor").and_then(Value::as_str) {
            let here = format!("#{}", child(pointer, "$anchor"));
            register_anchor(index, base.as_str(), a, pointer, &here)?;
            index.identified.push(pointer.to_owned());
            index.needs_rewrite = true;
        }
        // A `$dynamicAnchor` is a plain anchor too (the first of a name in a resource).
        if let Some(a) = m.get("$dynamicAnchor").and_then(Value::as_str) {
            let key = (base.as_str().to_owned(), a.to_owned());
            index
                .anchors
                .entry(key.clone())
                .or_insert_with(|| pointer.to_owned());
            if draft >= Draft::D2020 {
                index
                    .dynamic_anchors
                    .entry(key)
                    .or_insert_with(|| pointer.to_owned());
                index.identified.push(pointer.to_owned());
            }
        }
        if let (Some(r), true) = (
            m.get("$dynamicRef").and_then(Value::as_str),
            draft >= Draft::D2020,
        ) {
            let url = base.join(r).map_err(|e| {
                invalid(
                    &format!("#{}", child(pointer, "$dynamicRef")),
                    format!("{r:?} is not a URI reference: {e}"),
                )
            })?;
            index.dynamic_refs.push((pointer.to_owned(), url));
            index.needs_rewrite = true;
        }
    }
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let url = base.join(r).map_err(|e| {
            invalid(
                &format!("#{}", child(pointer, "$ref")),
                format!("{r:?} is not a URI reference: {e}"),
            )
        })?;
        if !(r == "#" || r.starts_with("#/")) {
            index.needs_rewrite = true;
        }
        index.refs.push((pointer.to_owned(), url));
    }
    Ok(base)
}

fn register(
    resources: &mut HashMap<String, String>,
    uri: &str,
    pointer: &str,
    here: &str,
) -> Result<()> {
    match resources.get(uri) {
        Some(p) if p != pointer => Err(invalid(
            here,
            format!("{uri:?} identifies two schemas (also the one at #{p})"),
        )),
        Some(_) => Ok(()),
        None => {
            resources.insert(uri.to_owned(), pointer.to_owned());
            Ok(())
        }
    }
}

fn register_anchor(
    index: &mut Index,
    resource: &str,
    name: &str,
    pointer: &str,
    here: &str,
) -> Result<()> {
    let key = (resource.to_owned(), name.to_owned());
    match index.anchors.get(&key) {
        Some(p) if p != pointer => Err(invalid(
            here,
            format!("anchor {name:?} of {resource:?} names two schemas (also the one at #{p})"),
        )),
        _ => {
            index.anchors.insert(key, pointer.to_owned());
            Ok(())
        }
    }
}

/// `%` written as `%25`, so that the translator's percent-decoding of a fragment gives the
/// pointer back.
fn fragment_of(pointer: &str) -> String {
    format!("#{}", pointer.replace('%', "%25"))
}

fn percent_decoded(s: &str) -> String {
    super::percent_decode(s)
}

/// The pointer from the root that `target` names, if the document holds it.
fn locate(root: &Value, index: &Index, target: &Url) -> Option<String> {
    let mut resource = target.clone();
    resource.set_fragment(None);
    let at = index.resources.get(resource.as_str())?;
    let fragment = percent_decoded(target.fragment().unwrap_or(""));
    let pointer = if fragment.is_empty() {
        at.clone()
    } else if fragment.starts_with('/') {
        format!("{at}{fragment}")
    } else {
        index
            .anchors
            .get(&(resource.as_str().to_owned(), fragment))?
            .clone()
    };
    root.pointer(&pointer).map(|_| pointer)
}

fn index_of(root: &Value, base: &Url, draft: Draft, extra: &[(String, String)]) -> Result<Index> {
    let mut index = Index::default();
    index
        .resources
        .insert(base.as_str().to_owned(), String::new());
    for (uri, pointer) in extra {
        register(&mut index.resources, uri, pointer, "#")?;
    }
    walk(root, base, draft, &mut index)?;
    Ok(index)
}

/// `schema` with every `$ref` that names a schema of the document rewritten as a pointer from its
/// root (`#/$defs/a`), each `$dynamicRef` whose target is the same on every evaluation path
/// rewritten as a `$ref`, and the identifiers dropped (see the module doc): what the schema
/// compiler reads, and what tools that follow only local pointers can read. Borrowed when
/// nothing needs rewriting. Errors name a malformed or duplicate identifier.
pub fn flatten(schema: &Value) -> Result<Cow<'_, Value>> {
    let draft = Draft::of(schema);
    let base = Url::parse(DEFAULT_BASE).expect("a valid URI");
    let index = index_of(schema, &base, draft, &[])?;
    if !index.needs_rewrite {
        return Ok(Cow::Borrowed(schema));
    }
    Ok(Cow::Owned(rewrite(schema.clone(), &index, draft)))
}

fn rewrite(mut root: Value, index: &Index, draft: Draft) -> Value {
    let targets: Vec<(String, String)> = index
        .refs
        .iter()
        .map(|(at, url)| {
            let r = match locate(&root, index, url) {
                Some(p) => fragment_of(&p),
                None => url.as_str().to_owned(),
            };
            (at.clone(), r)
        })
        .collect();
    for (at, r) in targets {
        if let Some(Value::Object(m)) = root.pointer_mut(&at) {
            m.insert("$ref".into(), Value::String(r));
        }
    }
    let dynamic: Vec<(String, Option<String>)> = index
        .dynamic_refs
        .iter()
        .map(|(at, url)| (at.clone(), resolve_dynamic(&root, index, url)))
        .collect();
    for (at, target) in dynamic {
        let (Some(Value::Object(m)), Some(p)) = (root.pointer_mut(&at), target) else {
            continue;
        };
        m.remove("$dynamicRef");
        let r = Value::String(fragment_of(&p));
        if m.contains_key("$ref") {
            // Both apply: the second as an `allOf` branch.
            let all = m.entry("allOf").or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = all {
                a.push(serde_json::json!({ "$ref": r }));
            }
        } else {
            m.insert("$ref".into(), r);
        }
    }
    for at in &index.identified {
        if let Some(Value::Object(m)) = root.pointer_mut(at) {
            m.remove(id_keyword(draft));
            m.remove("$anchor");
            m.remove("$dynamicAnchor");
        }
    }
    root
}

/// The pointer a `$dynamicRef` names, where it is the same on every evaluation path. It starts
/// where `$ref` would; if that is a `$dynamicAnchor` of the fragment's name, the dynamic scope
/// decides: its outermost resource with an anchor of that name. The document's own resource is
/// always the outermost, so its anchor wins where it has one; where only one resource has one,
/// that one is the answer. Otherwise the answer depends on the path taken (`None`: the
/// translator refuses the keyword).
fn resolve_dynamic(root: &Value, index: &Index, url: &Url) -> Option<String> {
    let initial = locate(root, index, url)?;
    let name = percent_decoded(url.fragment().unwrap_or(""));
    let mut resource = url.clone();
    resource.set_fragment(None);
    let dynamic = !name.is_empty()
        && !name.starts_with('/')
        && index
            .dynamic_anchors
            .get(&(resource.as_str().to_owned(), name.clone()))
            == Some(&initial);
    if !dynamic {
        return Some(initial);
    }
    if let Some(p) = index
        .dynamic_anchors
        .get(&(index.root_resource.clone(), name.clone()))
    {
        return Some(p.clone());
    }
    let holders = index
        .dynamic_anchors
        .keys()
        .filter(|(_, n)| *n == name)
        .count();
    (holders == 1).then_some(initial)
}

/// `schema` with the documents it refers to embedded, as one self-contained compound document:
/// each `(uri, document)` is what a reference to `uri` (or to the document's own `$id`) retrieves,
/// the way a validator's registry or retriever would. `base` is the URI `schema` itself was
/// read from (its file's URL, say), against which its references resolve unless its `$id` says
/// otherwise; it becomes the root's `$id` when the root has none. The documents that are
/// referred to, directly or through each other, are placed under the root's `$defs`
/// (`definitions` up to draft 7), keyed by their URI, each with its `$id`, as JSON Schema's
/// bundling describes (so validators read the result too); unused documents are left out. A
/// reference by a URI a document was retrieved by, where its `$id` says another, is rewritten
/// to the `$id`. A reference to a document that was not given stays as it is, and compiling
/// refuses it by name.
pub fn bundle(schema: &Value, base: Option<&str>, resources: &[(String, Value)]) -> Result<Value> {
    let draft = Draft::of(schema);
    let Value::Object(_) = schema else {
        return Ok(schema.clone());
    };
    let id_key = id_keyword(draft);
    let mut root = schema.clone();
    let mut base_url = Url::parse(DEFAULT_BASE).expect("a valid URI");
    if let Some(b) = base {
        let url = Url::parse(b)
            .map_err(|e| invalid("#", format!("base URI {b:?} is not an absolute URI: {e}")))?;
        let m = root.as_object_mut().expect("checked above");
        // Up to draft 7 an `$id` next to `$ref` is ignored: such a root keeps the default base.
        if !m.contains_key(id_key) && (draft >= Draft::D2019 || !m.contains_key("$ref")) {
            m.insert(id_key.into(), Value::String(url.as_str().into()));
            base_url = url;
        } else if m.contains_key(id_key) {
            base_url = url;
        }
    }
    let defs = if draft >= Draft::D2019 {
        "$defs"
    } else {
        "definitions"
    };
    // Each document under the URI it is retrieved by and, where it has one, its own `$id`.
    let mut known: Vec<(Url, Url, &Value)> = Vec::new();
    for (uri, doc) in resources {
        let mut by = Url::parse(uri).map_err(|e| {
            invalid(
                "#",
                format!("resource URI {uri:?} is not an absolute URI: {e}"),
            )
        })?;
        by.set_fragment(None);
        let mut own = match doc.get(id_key).and_then(Value::as_str) {
            Some(id) if !id.starts_with('#') => by.join(id).map_err(|e| {
                invalid(
                    "#",
                    format!("resource {uri:?}: $id {id:?} is not a URI: {e}"),
                )
            })?,
            _ => by.clone(),
        };
        own.set_fragment(None);
        known.push((by, own, doc));
    }
    // (retrieval URI, pointer) of each embedded document whose `$id` says another URI.
    let mut aliases: Vec<(String, String)> = Vec::new();
    let mut done = vec![false; known.len()];
    loop {
        let index = index_of(&root, &base_url, draft, &aliases)?;
        let mut missing = Vec::new();
        for (_, url) in index.refs.iter().chain(&index.dynamic_refs) {
            let mut resource = url.clone();
            resource.set_fragment(None);
            if index.resources.contains_key(resource.as_str()) {
                continue;
            }
            if let Some(k) = known
                .iter()
                .position(|(by, own, _)| *by == resource || *own == resource)
            {
                if !done[k] && !missing.contains(&k) {
                    missing.push(k);
                }
            }
        }
        if missing.is_empty() {
            return Ok(unalias(root, &index, &known));
        }
        let m = root.as_object_mut().expect("checked above");
        let holder = m
            .entry(defs)
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
            .ok_or_else(|| invalid(&child("#", defs), "expected an object"))?;
        for k in missing {
            done[k] = true;
            let (by, own, doc) = &known[k];
            let mut doc = (*doc).clone();
            if let Value::Object(d) = &mut doc {
                // The document's base is where it was retrieved from, unless it says otherwise.
                d.insert(id_key.into(), Value::String(own.as_str().into()));
            }
            let mut key = by.as_str().to_owned();
            while holder.contains_key(&key) {
                key.push('_');
            }
            holder.insert(key.clone(), doc);
            if by != own {
                aliases.push((by.as_str().to_owned(), child("", defs) + &child("", &key)));
            }
        }
    }
}

/// `root` with each reference through a retrieval URI that is not its document's `$id`
/// rewritten to the `$id` (the compound document knows the document by that alone).
fn unalias(mut root: Value, index: &Index, known: &[(Url, Url, &Value)]) -> Value {
    for (keyword, refs) in [("$ref", &index.refs), ("$dynamicRef", &index.dynamic_refs)] {
        for (at, url) in refs {
            let mut resource = url.clone();
            resource.set_fragment(None);
            let Some((_, own, _)) = known
                .iter()
                .find(|(by, own, _)| *by == resource && by != own)
            else {
                continue;
            };
            let mut to = own.clone();
            to.set_fragment(url.fragment());
            if let Some(Value::Object(m)) = root.pointer_mut(at) {
                m.insert(keyword.into(), Value::String(to.into()));
            }
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_pointers_are_used_as_they_are() {
        let s = json!({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"});
        assert!(matches!(flatten(&s).unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn ids_anchors_and_relative_refs_become_pointers() {
        let s = json!({
            "$id": "http://example.com/root.json",
            "$defs": {
                "A": {"$id": "nested/a.json", "$defs": {"x": {"type": "integer"}},
                      "$ref": "#/$defs/x"},
                "B": {"$anchor": "bee", "type": "string"},
                "C": {"$id": "urn:uuid:deadbeef-1234-0000-0000-4321feebdaed", "minimum": 3}
            },
            "properties": {
                "a": {"$ref": "nested/a.json"},
                "b": {"$ref": "#bee"},
                "c": {"$ref": "urn:uuid:deadbeef-1234-0000-0000-4321feebdaed"},
                "d": {"$ref": "http://example.com/nested/a.json#/$defs/x"},
                "e": {"$ref": "other.json"}
            }
        });
        let f = flatten(&s).unwrap().into_owned();
        let r = |p: &str| f.pointer(p).unwrap().as_str().unwrap().to_owned();
        assert_eq!(r("/properties/a/$ref"), "#/$defs/A");
        assert_eq!(r("/properties/b/$ref"), "#/$defs/B");
        assert_eq!(r("/properties/c/$ref"), "#/$defs/C");
        assert_eq!(r("/properties/d/$ref"), "#/$defs/A/$defs/x");
        // Relative to the nested resource, not the document.
        assert_eq!(r("/$defs/A/$ref"), "#/$defs/A/$defs/x");
        // Not in the document: its absolute URI, for the translator to name.
        assert_eq!(r("/properties/e/$ref"), "http://example.com/other.json");
        assert!(f.pointer("/$id").is_none() && f.pointer("/$defs/B/$anchor").is_none());
        // Flattening is idempotent.
        assert_eq!(flatten(&f).unwrap().into_owned(), f);
    }

    #[test]
    fn draft7_ignores_an_id_next_to_ref_and_reads_fragment_ids_as_anchors() {
        let s = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$id": "http://example.com/base/",
            "definitions": {
                "foo": {"$id": "http://example.com/foo.json", "type": "string"},
                "base_foo": {"$id": "foo.json", "type": "number"},
                "named": {"$id": "#named", "type": "null"}
            },
            "allOf": [{"$id": "http://example.com/", "$ref": "foo.json"}, {"$ref": "#named"}]
        });
        let f = flatten(&s).unwrap().into_owned();
        assert_eq!(f["allOf"][0]["$ref"], "#/definitions/base_foo");
        assert_eq!(f["allOf"][1]["$ref"], "#/definitions/named");
    }

    #[test]
    fn percent_signs_in_names_survive_the_rewrite() {
        let s = json!({"$id": "http://x/", "$defs": {"a%b": {"type": "null"}},
                       "$ref": "#/$defs/a%25b"});
        let f = flatten(&s).unwrap().into_owned();
        assert_eq!(f["$ref"], "#/$defs/a%25b");
        assert!(super::super::resolve_local(&f, f["$ref"].as_str().unwrap()).is_some());
    }

    #[test]
    fn duplicate_ids_are_an_error() {
        let s = json!({"$defs": {"a": {"$id": "http://x/a"}, "b": {"$id": "http://x/a"}}});
        let e = flatten(&s).unwrap_err().to_string();
        assert!(e.contains("identifies two schemas"), "{e}");
        // The error names where, as a JSON Pointer like the translator's.
        assert!(e.contains("at #/$defs/"), "{e}");
        let e = flatten(&json!({"properties": {"a": {"$ref": "http://[x"}}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("#/properties/a/$ref") && e.contains("not a URI"),
            "{e}"
        );
    }

    #[test]
    fn bundle_embeds_the_documents_referred_to_transitively() {
        let s = json!({"$id": "http://localhost:1234/root", "$ref": "a.json"});
        let resources = vec![
            (
                "http://localhost:1234/a.json".to_owned(),
                json!({"$ref": "b.json#/$defs/x"}),
            ),
            (
                "http://localhost:1234/b.json".to_owned(),
                json!({"$defs": {"x": {"type": "integer"}}}),
            ),
            ("http://localhost:1234/unused.json".to_owned(), json!({})),
        ];
        let b = bundle(&s, None, &resources).unwrap();
        let defs = b["$defs"].as_object().unwrap();
        assert_eq!(defs.len(), 2, "{b}");
        let b = flatten(&b).unwrap().into_owned();
        let a = b["$ref"].as_str().unwrap();
        let target = super::super::resolve_local(&b, a).unwrap();
        let inner = super::super::resolve_local(&b, target["$ref"].as_str().unwrap()).unwrap();
        assert_eq!(inner, &json!({"type": "integer"}));
    }

    #[test]
    fn dynamic_refs_resolve_where_every_path_agrees() {
        // The root's anchor is the outermost in every dynamic scope: it wins.
        let s = json!({
            "$id": "http://x/strict", "$dynamicAnchor": "node", "$ref": "tree",
            "unevaluatedProperties": false,
            "$defs": {"tree": {"$id": "http://x/tree", "$dynamicAnchor": "node",
                "properties": {"kids": {"items": {"$dynamicRef": "#node"}}}}}
        });
        let f = flatten(&s).unwrap().into_owned();
        assert_eq!(
            f.pointer("/$defs/tree/properties/kids/items/$ref").unwrap(),
            "#"
        );
        assert!(f
            .pointer("/$defs/tree/properties/kids/items/$dynamicRef")
            .is_none());
        // A fragment that is a plain `$anchor` (or a pointer) is a `$ref`; next to a `$ref`
        // the two apply as an `allOf`.
        let s = json!({"$defs": {"a": {"$anchor": "a", "type": "string"}},
                       "$ref": "#/$defs/a", "$dynamicRef": "#a"});
        let f = flatten(&s).unwrap().into_owned();
        assert_eq!(f["allOf"], json!([{"$ref": "#/$defs/a"}]));
        // Two resources with the anchor and none at the root: it depends on the path.
        let s = json!({"$id": "http://x/r", "$defs": {
            "one": {"$id": "one", "$dynamicAnchor": "n", "$dynamicRef": "#n"},
            "two": {"$id": "two", "$dynamicAnchor": "n"}}});
        let f = flatten(&s).unwrap().into_owned();
        assert_eq!(f.pointer("/$defs/one/$dynamicRef").unwrap(), "#n");
    }

    #[test]
    fn bundle_resolves_against_the_base_it_is_given() {
        let s = json!({"properties": {"a": {"$ref": "common.json#/$defs/id"}}});
        let common = json!({"$defs": {"id": {"type": "integer"}}});
        let resources = vec![("file:///data/schemas/common.json".to_owned(), common)];
        let b = bundle(&s, Some("file:///data/schemas/job.json"), &resources).unwrap();
        assert_eq!(b["$id"], "file:///data/schemas/job.json");
        let b = flatten(&b).unwrap().into_owned();
        let r = b["properties"]["a"]["$ref"].as_str().unwrap();
        let target = super::super::resolve_local(&b, r).unwrap();
        assert_eq!(target, &json!({"type": "integer"}));
        // Without the base, the reference names a document that was not given.
        let b = flatten(&bundle(&s, None, &resources).unwrap())
            .unwrap()
            .into_owned();
        assert_eq!(
            b["properties"]["a"]["$ref"],
            "json-schema:///common.json#/$defs/id"
        );
    }
}
