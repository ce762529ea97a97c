//! `uniqueItems` over items a grammar cannot enumerate, checked while decoding.
//!
//! "No two items are equal" is not a context-free property, so no automaton can carry it. The
//! translator writes such arrays with everything else their schema says (items, counts) and
//! leaves uniqueness to this module, which every [`crate::Matcher`] of the grammar runs on top:
//!
//! - `UniquePlan` (built once per schema) says which arrays of an instance need unique items: an
//!   automaton over *instance locations* whose states are sets of subschemas. A property name
//!   moves to `properties`, matching `patternProperties` or `additionalProperties`; an index to
//!   `prefixItems`/`items` (`additionalItems` before 2020-12); in-place applicators (`$ref`,
//!   `allOf`, `anyOf`, `oneOf`, `if`/`then`/`else`, `dependentSchemas`) add their subschemas to
//!   the same location. An array is checked when any subschema at its location has
//!   `uniqueItems: true`. Following every branch of an `anyOf` at once is sound (every output is
//!   valid) and narrower only where a branch not taken asks for uniqueness at a place another
//!   branch does not.
//! - `Tracker` (one per matcher) follows the JSON text byte by byte: a stack of open containers
//!   with their locations, and for each checked array the canonical form of its items so far
//!   (JSON equality: `1` equals `1.0`, objects equal whatever their key order). A token whose
//!   bytes complete an item equal to an earlier one is refused by `accept_token` and left out of
//!   the mask. Where the items are listed strings (`enum`/`const`), so is a token that starts or
//!   extends a string item no unused listed string extends: it could only end as a repeat, a
//!   dead end the DFA cannot see. Other finite item languages are not looked ahead into.
//!
//! Cost: nothing for schemas without such arrays (no tracker). Otherwise a scan of each accepted
//! token's bytes, and while an array being checked is open, only the tokens that can end a value
//! (a `"` or `\` inside a string) are tried: a token ending a string item is looked up directly,
//! others get a lexical pre-check (can it complete an item here?) and a trial copy only if so.
//! At an item of listed strings every allowed token is tried (the DFA allows few there).

use std::sync::Arc;

use regex_automata::meta::Regex;
use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::Value;

use super::{resolve_local, Draft, ANNOTATIONS};

/// Which arrays of an instance need unique items (see the module doc).
#[derive(Debug)]
pub(crate) struct UniquePlan {
    nodes: Vec<Node>,
    /// The subschemas at the root of the instance.
    root: Box<[u32]>,
}

#[derive(Debug, Default)]
struct Node {
    unique: bool,
    /// Subschemas that apply at the same location (`$ref`, `allOf`, …), not closed.
    same: Vec<u32>,
    properties: Vec<(String, u32)>,
    /// `None`: a pattern the regex engine cannot take, assumed to match every name (sound).
    patterns: Vec<(Option<Regex>, u32)>,
    additional: Option<u32>,
    /// Subschemas of every property (`unevaluatedProperties`, assumed to apply: sound).
    every_property: Vec<u32>,
    prefix: Vec<u32>,
    items: Option<u32>,
    /// Subschemas of every item (`contains`, `unevaluatedItems`).
    every_item: Vec<u32>,
    /// Closed over `same`, and only nodes from which a checked array is reachable.
    closure: Box<[u32]>,
    /// A checked array is reachable from here.
    live: bool,
    /// What the node asks of a value: nothing beyond its applicators (`Open`), one of a few
    /// strings (`Strings`: their JSON texts), or something else (`Other`).
    values: Values,
    /// For a node with `uniqueItems` whose `items` (with every subschema applying in place) only
    /// lists strings: the JSON texts of those strings. Each item must be one of them, so a
    /// prefix none of the unused ones extends has no completion (the tracker leaves it out
    /// rather than meet a dead end later). Where another `anyOf` branch at the same place
    /// allows other items, following this one is narrower and still sound.
    domain: Option<Arc<[Box<[u8]>]>>,
}

#[derive(Debug, Default, Clone)]
enum Values {
    #[default]
    Open,
    Strings(Vec<Box<[u8]>>),
    Other,
}

impl UniquePlan {
    /// The plan for `schema`, or `None` when no array needs a check the grammar does not make:
    /// no `uniqueItems: true`, or only ones the translator wrote exactly (at most one item, or
    /// a finite item domain).
    pub(crate) fn new(schema: &Value) -> Option<Self> {
        if !mentions_unique(schema) {
            return None;
        }
        // References as pointers from the root, as the translator reads them (a schema whose
        // identifiers are malformed does not compile, so it needs no plan).
        let flat = super::resolve::flatten(schema).ok()?;
        let schema = &*flat;
        let mut b = Builder {
            root: schema,
            draft: Draft::of(schema),
            ids: FxHashMap::default(),
            nodes: Vec::new(),
        };
        let root = b.intern(schema);
        let mut plan = UniquePlan {
            nodes: b.nodes,
            root: Box::new([]),
        };
        plan.close();
        if !plan.nodes[root as usize].live {
            return None;
        }
        plan.root = plan.nodes[root as usize].closure.clone();
        Some(plan)
    }

    /// Liveness by fixed point, then each live node's closure over `same`, keeping live nodes.
    fn close(&mut self) {
        let n = self.nodes.len();
        let mut live: Vec<bool> = self.nodes.iter().map(|x| x.unique).collect();
        loop {
            let mut changed = false;
            for i in 0..n {
                if live[i] {
                    continue;
                }
                let x = &self.nodes[i];
                let reach = x
                    .same
                    .iter()
                    .chain(x.properties.iter().map(|(_, t)| t))
                    .chain(x.patterns.iter().map(|(_, t)| t))
                    .chain(&x.additional)
                    .chain(&x.every_property)
                    .chain(&x.prefix)
                    .chain(&x.items)
                    .chain(&x.every_item)
                    .any(|&t| live[t as usize]);
                if reach {
                    live[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for i in 0..n {
            if self.nodes[i].unique && self.nodes[i].prefix.is_empty() {
                self.nodes[i].domain = self.nodes[i].items.and_then(|t| self.strings_of(t));
            }
        }
        for i in 0..n {
            self.nodes[i].live = live[i];
            if !live[i] {
                continue;
            }
            let mut seen = FxHashSet::default();
            let mut todo = vec![i as u32];
            let mut out = Vec::new();
            while let Some(t) = todo.pop() {
                if !seen.insert(t) || !live[t as usize] {
                    continue;
                }
                out.push(t);
                todo.extend(self.nodes[t as usize].same.iter().copied());
            }
            out.sort_unstable();
            self.nodes[i].closure = out.into_boxed_slice();
        }
    }

    /// The union of the strings listed by `t` and the subschemas applying with it, when every
    /// one of them that asks anything lists strings.
    fn strings_of(&self, t: u32) -> Option<Arc<[Box<[u8]>]>> {
        let mut seen = FxHashSet::default();
        let mut todo = vec![t];
        let mut texts: Vec<Box<[u8]>> = Vec::new();
        let mut listed = false;
        while let Some(n) = todo.pop() {
            if !seen.insert(n) {
                continue;
            }
            let x = &self.nodes[n as usize];
            match &x.values {
                Values::Open => {}
                Values::Other => return None,
                Values::Strings(v) => {
                    listed = true;
                    texts.extend(v.iter().cloned());
                }
            }
            todo.extend(x.same.iter().copied());
        }
        texts.sort();
        texts.dedup();
        listed.then(|| texts.into())
    }

    fn unique(&self, at: &[u32]) -> bool {
        at.iter().any(|&n| self.nodes[n as usize].unique)
    }

    /// The location of property `name` of an object at `at`.
    fn property(&self, at: &[u32], name: &str, out: &mut Vec<u32>) {
        out.clear();
        for &n in at {
            let x = &self.nodes[n as usize];
            let mut named = false;
            for (k, t) in &x.properties {
                if k == name {
                    named = true;
                    self.add(*t, out);
                }
            }
            for (re, t) in &x.patterns {
                if re.as_ref().is_none_or(|re| re.is_match(name)) {
                    named = true;
                    self.add(*t, out);
                }
            }
            if !named {
                self.add_all(x.additional.as_slice(), out);
            }
            self.add_all(&x.every_property, out);
        }
        out.sort_unstable();
        out.dedup();
    }

    /// The location of item `index` of an array at `at`.
    fn item(&self, at: &[u32], index: usize, out: &mut Vec<u32>) {
        out.clear();
        for &n in at {
            let x = &self.nodes[n as usize];
            match x.prefix.get(index) {
                Some(&t) => self.add(t, out),
                None => self.add_all(x.items.as_slice(), out),
            }
            self.add_all(&x.every_item, out);
        }
        out.sort_unstable();
        out.dedup();
    }

    /// The strings an item of a checked array at `at` can only be (see [`Node::domain`]).
    fn item_strings(&self, at: &[u32]) -> Option<Arc<[Box<[u8]>]>> {
        at.iter()
            .find_map(|&n| self.nodes[n as usize].domain.clone())
    }

    fn add_all(&self, ts: &[u32], out: &mut Vec<u32>) {
        for &t in ts {
            self.add(t, out);
        }
    }

    fn add(&self, t: u32, out: &mut Vec<u32>) {
        out.extend_from_slice(&self.nodes[t as usize].closure);
    }
}

/// What a schema object asks of a value, for [`UniquePlan::item_strings`]: applicators and
/// annotations ask nothing themselves (their subschemas are nodes of the same location).
fn values_of(m: &serde_json::Map<String, Value>) -> Values {
    const APPLICATORS: &[&str] = &[
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "$defs",
        "definitions",
        "$schema",
        "$id",
        "$anchor",
    ];
    let strings = |vs: &[Value]| -> Option<Vec<Box<[u8]>>> {
        vs.iter()
            .map(|v| {
                v.as_str()
                    .map(|_| serde_json::to_vec(v).expect("a string serializes").into())
            })
            .collect()
    };
    let listed = match (m.get("const"), m.get("enum")) {
        (Some(c), _) => Some(strings(std::slice::from_ref(c))),
        (None, Some(Value::Array(e))) => Some(strings(e)),
        _ => None,
    };
    match listed {
        Some(Some(texts)) => Values::Strings(texts),
        Some(None) => Values::Other,
        None if m
            .keys()
            .all(|k| APPLICATORS.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str())) =>
        {
            Values::Open
        }
        None => Values::Other,
    }
}

fn mentions_unique(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("uniqueItems") == Some(&Value::Bool(true)) || m.values().any(mentions_unique)
        }
        Value::Array(a) => a.iter().any(mentions_unique),
        _ => false,
    }
}

struct Builder<'v> {
    root: &'v Value,
    draft: Draft,
    /// By address: each subschema of the document once.
    ids: FxHashMap<*const Value, u32>,
    nodes: Vec<Node>,
}

impl<'v> Builder<'v> {
    fn intern(&mut self, v: &'v Value) -> u32 {
        let key = v as *const Value;
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.ids.insert(key, id);
        self.nodes.push(Node::default());
        let Value::Object(m) = v else {
            return id;
        };
        let mut x = Node {
            unique: m.get("uniqueItems") == Some(&Value::Bool(true)),
            values: values_of(m),
            ..Node::default()
        };
        let one = |b: &mut Self, k: &str| m.get(k).map(|s| b.intern(s));
        let many = |b: &mut Self, k: &str| -> Vec<u32> {
            match m.get(k) {
                Some(Value::Array(a)) => a.iter().map(|s| b.intern(s)).collect(),
                _ => Vec::new(),
            }
        };
        if let Some(target) = m
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| resolve_local(self.root, r))
        {
            x.same.push(self.intern(target));
            // Before 2019-09, keywords next to `$ref` are ignored.
            if self.draft < Draft::D2019 {
                self.nodes[id as usize] = x;
                return id;
            }
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            let b = many(self, k);
            x.same.extend(b);
        }
        for k in ["if", "then", "else"] {
            x.same.extend(one(self, k));
        }
        let dependent = if self.draft >= Draft::D2019 {
            "dependentSchemas"
        } else {
            "dependencies"
        };
        if let Some(Value::Object(d)) = m.get(dependent) {
            for s in d.values().filter(|s| s.is_object() || s.is_boolean()) {
                x.same.push(self.intern(s));
            }
        }
        if let Some(Value::Object(p)) = m.get("properties") {
            for (k, s) in p {
                x.properties.push((k.clone(), self.intern(s)));
            }
        }
        if let Some(Value::Object(p)) = m.get("patternProperties") {
            for (k, s) in p {
                x.patterns.push((Regex::new(k).ok(), self.intern(s)));
            }
        }
        x.additional = one(self, "additionalProperties");
        x.every_property.extend(one(self, "unevaluatedProperties"));
        if self.draft >= Draft::D2020 {
            x.prefix = many(self, "prefixItems");
            x.items = one(self, "items");
        } else {
            match m.get("items") {
                Some(Value::Array(_)) => {
                    x.prefix = many(self, "items");
                    x.items = one(self, "additionalItems");
                }
                Some(_) => x.items = one(self, "items"),
                None => {}
            }
        }
        x.every_item.extend(one(self, "contains"));
        x.every_item.extend(one(self, "unevaluatedItems"));
        self.nodes[id as usize] = x;
        id
    }
}

/// Where the scanner is inside a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between values: whitespace, `,`, `:`, brackets, or the first byte of a value.
    Between,
    /// Inside a string that started at `start`; `key` when it is a property name.
    Str {
        start: usize,
        key: bool,
        escape: bool,
    },
    /// Inside a number or literal that started at `start`.
    Scalar { start: usize },
}

#[derive(Debug, Clone)]
struct Frame {
    array: bool,
    /// Where the container started in the text.
    start: usize,
    /// Its location in the plan (empty: nothing below needs a check).
    at: Vec<u32>,
    /// Objects: a property name comes next. Arrays: unused.
    expect_key: bool,
    /// Objects: the name of the property whose value comes next.
    key: String,
    /// Arrays: items completed so far.
    index: usize,
    /// Arrays that need unique items: the canonical form of each item so far.
    seen: Option<FxHashSet<Box<[u8]>>>,
    /// Checked arrays whose items can only be these strings ([`Node::domain`]).
    domain: Option<Arc<[Box<[u8]>]>>,
}

/// Follows one output's JSON text for [`UniquePlan`] (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Tracker {
    plan: Arc<UniquePlan>,
    text: Vec<u8>,
    stack: Vec<Frame>,
    lex: Lex,
    /// Open frames with `seen`.
    checked: usize,
    scratch: Vec<u32>,
}

/// An item equal to an earlier one of an array that needs unique items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Duplicate;

impl Tracker {
    pub(crate) fn new(plan: Arc<UniquePlan>) -> Self {
        Self {
            plan,
            text: Vec::new(),
            stack: Vec::new(),
            lex: Lex::Between,
            checked: 0,
            scratch: Vec::new(),
        }
    }

    /// Bytes of text seen so far (a rollback point for [`Tracker::truncate`]).
    pub(crate) fn len(&self) -> usize {
        self.text.len()
    }

    /// Back to the state after the first `len` bytes, by scanning them again.
    pub(crate) fn truncate(&mut self, len: usize) {
        let text = std::mem::take(&mut self.text);
        *self = Self::new(self.plan.clone());
        self.feed(&text[..len])
            .expect("accepted text has no duplicate items");
    }

    /// Reads `bytes`; on a duplicate the tracker is left partly advanced (restore it with
    /// [`Tracker::truncate`]).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), Duplicate> {
        for &b in bytes {
            self.text.push(b);
            self.step(b)?;
        }
        Ok(())
    }

    /// Whether an array that needs unique items is open: only then can a token be refused.
    pub(crate) fn is_checking(&self) -> bool {
        self.checked > 0
    }

    /// Whether every allowed token must be tried: at an item of a checked array whose items are
    /// listed strings, where a token may start or extend an item no unused string extends.
    pub(crate) fn tries_every_token(&self) -> bool {
        self.stack.last().is_some_and(|f| f.domain.is_some())
            && matches!(self.lex, Lex::Between | Lex::Str { key: false, .. })
    }

    /// At an item of a checked array whose items are listed strings: whether `bytes` leave a
    /// string item open that no unused string extends (a dead end the grammar cannot see).
    pub(crate) fn dead_string_item(&self, bytes: &[u8]) -> bool {
        let Some(top) = self.stack.last() else {
            return false;
        };
        let (Some(domain), Some(seen)) = (top.domain.as_ref(), top.seen.as_ref()) else {
            return false;
        };
        // The open item's text so far: from the text before the token, and the token's part.
        let (head, from) = match self.lex {
            Lex::Str {
                start, key: false, ..
            } => (&self.text[start..], 0),
            Lex::Between => {
                let skip = bytes
                    .iter()
                    .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b','));
                match skip {
                    Some(q) if bytes[q] == b'"' => (&self.text[..0], q),
                    _ => return false,
                }
            }
            _ => return false,
        };
        // The token must leave the string open (a closing quote completes the item, which the
        // duplicate check covers).
        let mut escaped = matches!(self.lex, Lex::Str { escape: true, .. });
        let body = &bytes[from..];
        for (i, &b) in body.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' && !(head.is_empty() && i == 0) {
                return false;
            }
        }
        !domain.iter().any(|v| {
            v.len() >= head.len() + body.len()
                && v.starts_with(head)
                && v[head.len()..].starts_with(body)
                && !seen.contains(v)
        })
    }

    /// Inside a string: only a token with `"` or `\\` can end a value.
    pub(crate) fn in_string(&self) -> bool {
        matches!(self.lex, Lex::Str { .. })
    }

    /// Whether accepting `bytes` would complete a duplicate item. A cheap lexical pass first:
    /// only bytes that may complete an item of a checked array (or open a container) are tried
    /// on a copy.
    pub(crate) fn would_duplicate(&self, bytes: &[u8]) -> bool {
        if self.dead_string_item(bytes) {
            return true;
        }
        if let Some(dup) = self.string_item(bytes) {
            return dup;
        }
        let expect_key = self.stack.last().is_some_and(|f| f.expect_key);
        self.completes_checked(self.lex, self.stack.len(), expect_key, bytes)
            && self.clone().feed(bytes).is_err()
    }

    /// The common case without a trial copy: inside a string item of a checked array, a token
    /// that ends the string (and completes nothing more) is a duplicate exactly when the item is.
    /// `None` where that does not apply.
    fn string_item(&self, bytes: &[u8]) -> Option<bool> {
        let Lex::Str {
            start,
            key: false,
            escape,
        } = self.lex
        else {
            return None;
        };
        let top = self.stack.last().filter(|f| f.array)?;
        let seen = top.seen.as_ref()?;
        let mut escaped = escape;
        let mut end = None;
        for (i, &b) in bytes.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                end = Some(i);
                break;
            }
        }
        let Some(k) = end else {
            return Some(false); // the string goes on
        };
        if self.completes_checked(Lex::Between, self.stack.len(), false, &bytes[k + 1..]) {
            return None;
        }
        let (head, tail) = (&self.text[start..], &bytes[..=k]);
        let mut small = [0u8; 256];
        let mut large = Vec::new();
        let item: &[u8] = if head.len() + tail.len() <= small.len() {
            small[..head.len()].copy_from_slice(head);
            small[head.len()..head.len() + tail.len()].copy_from_slice(tail);
            &small[..head.len() + tail.len()]
        } else {
            large.extend_from_slice(head);
            large.extend_from_slice(tail);
            &large
        };
        Some(if item.contains(&b'\\') {
            seen.contains(&canonical(item)[..])
        } else {
            seen.contains(item)
        })
    }

    /// A lexical pass over `bytes` from (`lex`, `depth` open containers, `expect_key`): whether
    /// they may complete an item of a checked array (or open a container, which is not followed).
    fn completes_checked(&self, lex: Lex, depth: usize, expect_key: bool, bytes: &[u8]) -> bool {
        let (mut lex, mut depth, mut expect_key) = (lex, depth, expect_key);
        let completes_checked = |depth: usize| {
            depth > 0 && self.stack[depth - 1].seen.is_some() && self.stack[depth - 1].array
        };
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match lex {
                Lex::Str { key, escape, start } => {
                    if escape {
                        lex = Lex::Str {
                            key,
                            escape: false,
                            start,
                        };
                    } else if b == b'\\' {
                        lex = Lex::Str {
                            key,
                            escape: true,
                            start,
                        };
                    } else if b == b'"' {
                        lex = Lex::Between;
                        if !key && completes_checked(depth) {
                            return true;
                        }
                    }
                }
                Lex::Scalar { .. } => {
                    if is_delimiter(b) {
                        lex = Lex::Between;
                        if completes_checked(depth) {
                            return true;
                        }
                        continue;
                    }
                }
                Lex::Between => match b {
                    b'{' | b'[' => return true,
                    b'}' | b']' => {
                        if depth == 0 {
                            return true;
                        }
                        depth -= 1;
                        expect_key = false;
                        if completes_checked(depth) {
                            return true;
                        }
                    }
                    b',' => expect_key = depth > 0 && !self.stack[depth - 1].array,
                    b':' => expect_key = false,
                    b'"' => {
                        lex = Lex::Str {
                            key: expect_key,
                            escape: false,
                            start: 0,
                        }
                    }
                    b' ' | b'\t' | b'\n' | b'\r' => {}
                    _ => lex = Lex::Scalar { start: 0 },
                },
            }
            i += 1;
        }
        false
    }

    fn step(&mut self, b: u8) -> Result<(), Duplicate> {
        let pos = self.text.len() - 1;
        match self.lex {
            Lex::Str { start, key, escape } => {
                if escape {
                    self.lex = Lex::Str {
                        start,
                        key,
                        escape: false,
                    };
                } else if b == b'\\' {
                    self.lex = Lex::Str {
                        start,
                        key,
                        escape: true,
                    };
                } else if b == b'"' {
                    self.lex = Lex::Between;
                    if key {
                        let top = self.stack.last_mut().expect("a key is inside an object");
                        top.expect_key = false;
                        if !top.at.is_empty() {
                            top.key =
                                serde_json::from_slice(&self.text[start..=pos]).unwrap_or_default();
                        }
                    } else {
                        self.value_done(start, pos + 1)?;
                    }
                }
                Ok(())
            }
            Lex::Scalar { start } => {
                if is_delimiter(b) {
                    self.lex = Lex::Between;
                    self.value_done(start, pos)?;
                    self.between(b, pos)
                } else {
                    Ok(())
                }
            }
            Lex::Between => self.between(b, pos),
        }
    }

    fn between(&mut self, b: u8, pos: usize) -> Result<(), Duplicate> {
        match b {
            b'{' | b'[' => {
                let at = self.location();
                let array = b == b'[';
                let seen = (array && self.plan.unique(&at)).then(FxHashSet::default);
                let domain = seen.as_ref().and_then(|_| self.plan.item_strings(&at));
                self.checked += seen.is_some() as usize;
                self.stack.push(Frame {
                    array,
                    start: pos,
                    at,
                    expect_key: !array,
                    key: String::new(),
                    index: 0,
                    seen,
                    domain,
                });
            }
            b'}' | b']' => {
                if let Some(f) = self.stack.pop() {
                    self.checked -= f.seen.is_some() as usize;
                    self.value_done(f.start, pos + 1)?;
                }
            }
            b',' => {
                if let Some(top) = self.stack.last_mut() {
                    top.expect_key = !top.array;
                }
            }
            b':' | b' ' | b'\t' | b'\n' | b'\r' => {}
            b'"' => {
                let key = self.stack.last().is_some_and(|f| f.expect_key);
                self.lex = Lex::Str {
                    start: pos,
                    key,
                    escape: false,
                };
            }
            _ => self.lex = Lex::Scalar { start: pos },
        }
        Ok(())
    }

    /// The plan location of the value starting now.
    fn location(&mut self) -> Vec<u32> {
        let mut out = std::mem::take(&mut self.scratch);
        match self.stack.last() {
            None => {
                out.clear();
                out.extend_from_slice(&self.plan.root);
            }
            Some(f) if f.at.is_empty() => out.clear(),
            Some(f) if f.array => self.plan.item(&f.at, f.index, &mut out),
            Some(f) => self.plan.property(&f.at, &f.key, &mut out),
        }
        let at = out.clone();
        self.scratch = out;
        at
    }

    /// The value in `text[start..end]` is complete: an item of the array on top, if any.
    fn value_done(&mut self, start: usize, end: usize) -> Result<(), Duplicate> {
        let Some(top) = self.stack.last_mut() else {
            return Ok(());
        };
        if !top.array {
            return Ok(());
        }
        top.index += 1;
        let Some(seen) = top.seen.as_mut() else {
            return Ok(());
        };
        let canon = canonical(&self.text[start..end]);
        if seen.contains(&canon[..]) {
            return Err(Duplicate);
        }
        seen.insert(canon);
        Ok(())
    }
}

fn is_delimiter(b: u8) -> bool {
    matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
}

/// The text of one JSON value in a form where JSON-equal values are equal bytes: numbers by
/// value, object keys sorted, no whitespace, strings as `serde_json` escapes them.
fn canonical(text: &[u8]) -> Box<[u8]> {
    // quarry writes strings canonically; one without escapes is its own canonical form.
    if text.len() >= 2 && text[0] == b'"' && !text.contains(&b'\\') {
        return text.into();
    }
    let Ok(v) = serde_json::from_slice::<Value>(text) else {
        // Not JSON (the grammar decides what is): compare the bytes.
        return text.into();
    };
    let mut out = Vec::with_capacity(text.len());
    write_canonical(&v, &mut out);
    out.into_boxed_slice()
}

fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                out.extend_from_slice((x as i64).to_string().as_bytes())
            }
            Some(x) => out.extend_from_slice(format!("{x:e}").as_bytes()),
            None => out.extend_from_slice(n.to_string().as_bytes()),
        },
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).expect("writing to a Vec");
                out.push(b':');
                write_canonical(&m[k], out);
            }
            out.push(b'}');
        }
        other => serde_json::to_writer(&mut *out, other).expect("writing to a Vec"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tracker(schema: Value) -> Tracker {
        Tracker::new(Arc::new(UniquePlan::new(&schema).expect("a plan")))
    }

    #[test]
    fn canonical_forms_equal_exactly_for_json_equal_values() {
        let same = [
            (&b"1"[..], &b"1.0"[..]),
            (b"1e2", b"100"),
            (br#"{"a":1,"b":[2]}"#, br#"{ "b" : [2.0], "a" : 1 }"#),
            (br#""\u0041""#, br#""A""#),
        ];
        for (a, b) in same {
            assert_eq!(canonical(a), canonical(b), "{a:?} {b:?}");
        }
        let different = [
            (&b"1"[..], &b"1.5"[..]),
            (br#"{"a":1}"#, br#"{"a":1,"b":1}"#),
            (br#""a""#, br#""A""#),
            (b"[1,2]", b"[2,1]"),
            (b"0.1", b"0.10000000000000002"),
        ];
        for (a, b) in different {
            assert_ne!(canonical(a), canonical(b), "{a:?} {b:?}");
        }
    }

    #[test]
    fn duplicates_are_found_where_the_schema_asks_and_only_there() {
        let schema = json!({
            "type": "object",
            "properties": {
                "tags": {"$ref": "#/$defs/tags"},
                "free": {"type": "array"},
                "deep": {"type": "array", "items": {"type": "array", "uniqueItems": true}}
            },
            "$defs": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}
        });
        let cases: [(&str, bool); 9] = [
            (r#"{"tags":["a","b"]}"#, true),
            (r#"{"tags":["a","a"]}"#, false),
            (r#"{"tags":["a", "b", "a"]}"#, false),
            (r#"{"free":["a","a"]}"#, true),
            (r#"{"free":[["a","a"]],"tags":["\u0061","a"]}"#, false),
            (r#"{"deep":[[1,2],[1,1.0]]}"#, false),
            (r#"{"deep":[[1,2],[2,1]],"x":{"tags":["a","a"]}}"#, true),
            (r#"{"deep":[[{"k":[1,1]}],[{"k":[1,1]}]]}"#, true),
            (r#"{"deep":[[{"k":1,"j":2},{"j":2,"k":1}]]}"#, false),
        ];
        for (text, ok) in cases {
            let mut t = tracker(schema.clone());
            assert_eq!(t.feed(text.as_bytes()).is_ok(), ok, "{text}");
            // Byte by byte, and the pre-check never misses what a full trial finds.
            let mut t = tracker(schema.clone());
            let mut result = Ok(());
            for i in 0..text.len() {
                for j in i + 1..=text.len().min(i + 6) {
                    let dup = t.would_duplicate(&text.as_bytes()[i..j]);
                    let mut copy = t.clone();
                    assert_eq!(
                        dup,
                        copy.feed(&text.as_bytes()[i..j]).is_err(),
                        "{text} {i}..{j}"
                    );
                }
                result = t.feed(&text.as_bytes()[i..=i]);
                if result.is_err() {
                    break;
                }
            }
            assert_eq!(result.is_ok(), ok, "{text} byte by byte");
        }
    }

    #[test]
    fn truncate_scans_back_to_the_same_state() {
        let mut t = tracker(json!({"type": "array", "uniqueItems": true}));
        t.feed(br#"["x",1,{"a":[1]}"#).unwrap();
        let at = t.len();
        t.feed(br#","y""#).unwrap();
        t.truncate(at);
        assert!(t.clone().feed(br#","y""#).is_ok());
        assert!(t.feed(br#",{"a":[1.0]}"#).is_err());
    }

    #[test]
    fn no_plan_without_unique_items() {
        assert!(UniquePlan::new(&json!({"type": "array", "items": {"type": "string"}})).is_none());
        assert!(UniquePlan::new(&json!({"$defs": {"x": {"uniqueItems": true}}})).is_none());
    }
}
