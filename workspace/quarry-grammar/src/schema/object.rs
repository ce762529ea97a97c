//! Objects: declared properties in schema order, additional properties with keys proven
//! different from the declared names, property counts and dependencies.

use serde_json::{json, Map, Value};

use super::scalar::pattern_in_json;
use super::{schema_syntax, Op};

use super::{
    child, count, invalid, literal, unsupported, Draft, Re, Result, Translator, UnevaluatedOf,
    ESCAPED, STR_CHAR,
};

impl Translator<'_> {
    pub(super) fn object(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
        let names = self.names(m, pointer)?;
        let (items, declared) = self.members(m, &names, pointer)?;
        let declared: Vec<&str> = declared.iter().map(String::as_str).collect();
        let extra = self.extra_members(
            &declared,
            &names.patterns,
            &names.extra_schema,
            names.schema.as_ref(),
            pointer,
        )?;
        let members: Vec<(Re, bool)> = items
            .iter()
            .map(|it| {
                let name = literal(&Value::String(it.name.clone()));
                let member = Re::seq([name, self.sep.colon.clone(), it.value.clone()]);
                (member, it.required)
            })
            .collect();
        let min_p = count(m, pointer, "minProperties")?;
        let max_p = count(m, pointer, "maxProperties")?;
        let deps = self.dependencies(m, &items, extra.is_some(), &declared, pointer)?;
        let comma = &self.sep.comma;
        let body = if min_p.is_some() || max_p.is_some() || !deps.is_empty() {
            let (lo, hi) = (min_p.unwrap_or(0), max_p);
            if lo > 32 || hi.is_some_and(|h| h > 32) {
                return Err(unsupported(
                    "maxProperties",
                    pointer,
                    "property counts above 32 are not supported yet",
                ));
            }
            counted_members(&members, extra.as_ref(), lo, hi, &deps, comma)
        } else {
            free_members(&members, extra.as_ref(), comma)
        };
        Ok(self.sep.bracketed(r"\{", body, r"\}"))
    }

    /// What decides the names an object may have and the schema of each name's value.
    fn names(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Names> {
        // Without additionalProperties, unevaluatedProperties applies to the same names.
        let unevaluated = self.unevaluated(m, UnevaluatedOf::Properties);
        let extra_schema = match m.get("additionalProperties").cloned().or(unevaluated) {
            Some(s) => s,
            None if self.options.strict => Value::Bool(false),
            None => Value::Bool(true),
        };
        let patterns = self.pattern_properties(m, pointer)?;
        let schema = m.get("propertyNames").cloned();
        let here = child(pointer, "propertyNames");
        let test = match &schema {
            None => None,
            Some(n) => {
                let r = self.child_value(n, &here)?;
                Some(Narrowing::new(&r, "propertyNames", &here)?)
            }
        };
        Ok(Names {
            extra_schema,
            patterns,
            schema,
            test,
        })
    }

    /// The members with a slot of their own, in canonical order: `properties`, then required
    /// names the schema does not describe, then names only dependencies mention; and every name
    /// declared so (which additional members may not take).
    fn members(
        &mut self,
        m: &Map<String, Value>,
        names: &Names,
        pointer: &str,
    ) -> Result<(Vec<Member>, Vec<String>)> {
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
        let mut items: Vec<Member> = Vec::new();
        let mut declared: Vec<String> = Vec::new();
        let pp = child(pointer, "properties");
        for (name, s) in props {
            declared.push(name.clone());
            let required = required.contains(&name.as_str());
            let value = self.member_value(names, name, Some(s), &child(&pp, name))?;
            if value.is_nothing() && !required {
                continue; // can never be written
            }
            items.push(Member {
                name: name.clone(),
                value,
                required,
            });
        }
        let ap = child(pointer, "additionalProperties");
        for name in &required {
            if !props.contains_key(*name) {
                declared.push((*name).to_owned());
                items.push(Member {
                    name: (*name).to_owned(),
                    value: self.member_value(names, name, None, &ap)?,
                    required: true,
                });
            }
        }
        // Names that dependencies mention but `properties` does not could be additional
        // properties: give them a slot after the declared ones, so the dependency can be tracked
        // (an instance writing them among other additional properties is written in that slot
        // first: sound, slightly narrower).
        for name in self.dependency_names(m) {
            if declared.contains(&name) {
                continue;
            }
            let value = if names.value_schema(&name, None) == Value::Bool(false) {
                Re::nothing()
            } else {
                self.member_value(names, &name, None, &ap)?
            };
            declared.push(name.clone());
            if !value.is_nothing() {
                items.push(Member {
                    name,
                    value,
                    required: false,
                });
            }
        }
        Ok((items, declared))
    }

    /// The value of the member `name` (declared with the schema `declared`, or not), or nothing
    /// when `propertyNames` refuses the name.
    fn member_value(
        &mut self,
        names: &Names,
        name: &str,
        declared: Option<&Value>,
        pointer: &str,
    ) -> Result<Re> {
        if !names.allowed(name) {
            return Ok(Re::nothing());
        }
        self.child_value(&names.value_schema(name, declared), pointer)
    }

    /// The names `dependentRequired` (draft 4–7: `dependencies` with name lists) mentions, as
    /// triggers or dependents, in order.
    fn dependency_names(&self, m: &Map<String, Value>) -> Vec<String> {
        let dep_key = if self.draft >= Draft::D2019 {
            "dependentRequired"
        } else {
            "dependencies"
        };
        let mut out: Vec<String> = Vec::new();
        if let Some(Value::Object(deps)) = m.get(dep_key) {
            for (trigger, needed) in deps {
                if let Value::Array(needed) = needed {
                    let mentioned = std::iter::once(trigger.as_str())
                        .chain(needed.iter().filter_map(Value::as_str));
                    for name in mentioned {
                        if !out.iter().any(|n| n == name) {
                            out.push(name.to_owned());
                        }
                    }
                }
            }
        }
        out
    }

    /// `patternProperties` as (pattern, schema, matcher of quoted names).
    pub(super) fn pattern_properties(
        &mut self,
        m: &Map<String, Value>,
        pointer: &str,
    ) -> Result<Vec<PatternProperty>> {
        let Some(pp) = m.get("patternProperties") else {
            return Ok(Vec::new());
        };
        let here = child(pointer, "patternProperties");
        let pp = pp
            .as_object()
            .ok_or_else(|| invalid(&here, "expected an object"))?;
        pp.iter()
            .map(|(pattern, schema)| {
                let at = child(&here, pattern);
                let names = Re::seq([
                    Re::text("\""),
                    pattern_in_json(pattern, &at)?,
                    Re::text("\""),
                ]);
                Ok(PatternProperty {
                    matcher: Narrowing::new(&names, "patternProperties", &at)?,
                    names,
                    schema: schema.clone(),
                    pointer: at,
                })
            })
            .collect()
    }

    /// One regex for any additional member: a name not in `declared` (and accepted by
    /// `propertyNames`), with the value schema that name calls for. Names matching exactly one
    /// pattern take its schema; names matching none take `additionalProperties`; names matching
    /// several patterns are left out (sound, and rare).
    fn extra_members(
        &mut self,
        declared: &[&str],
        patterns: &[PatternProperty],
        extra_schema: &Value,
        names_schema: Option<&Value>,
        pointer: &str,
    ) -> Result<Option<Re>> {
        let colon = self.sep.colon.clone();
        let mut outside = self.keys_outside(declared);
        if let Some(n) = names_schema {
            let here = child(pointer, "propertyNames");
            let names = self.child_value(n, &here)?;
            outside = self.combine(&outside, &names, Op::And, "propertyNames", pointer)?;
        }
        let pp = "patternProperties";
        let mut members = Vec::new();
        for (i, p) in patterns.iter().enumerate() {
            let mut names = self.combine(&outside, &p.names, Op::And, pp, pointer)?;
            for (j, q) in patterns.iter().enumerate() {
                if i != j {
                    names = self.combine(&names, &q.names, Op::AndNot, pp, pointer)?;
                }
            }
            if !names.is_nothing() {
                let v = self.child_value(&p.schema, &p.pointer)?;
                members.push(Re::seq([names, colon.clone(), v]));
            }
        }
        if *extra_schema != Value::Bool(false) {
            let mut names = outside;
            for p in patterns {
                names = self.combine(&names, &p.names, Op::AndNot, pp, pointer)?;
            }
            if !names.is_nothing() {
                let v = self.child_value(extra_schema, &child(pointer, "additionalProperties"))?;
                members.push(Re::seq([names, colon, v]));
            }
        }
        Ok((!members.is_empty()).then(|| Re::alt(members)))
    }

    /// [`key_not_in`], built once per set of names: the branches of a `oneOf` or of an `anyOf`
    /// product often declare the same names, and each used to build the same trie of them again.
    fn keys_outside(&mut self, declared: &[&str]) -> Re {
        let mut names: Vec<String> = declared.iter().map(|n| (*n).to_owned()).collect();
        names.sort_unstable();
        names.dedup();
        if let Some(re) = self.keys_outside.get(&names) {
            return re.clone();
        }
        let re = key_not_in(declared);
        self.keys_outside.insert(names, re.clone());
        re
    }

    /// `dependentRequired` (and draft 4–7 `dependencies` with name lists) as (trigger, dependent)
    /// indexes into `items`. A pair whose trigger is never written is dropped; one that would need
    /// an additional property tracked is unsupported.
    pub(super) fn dependencies(
        &self,
        m: &Map<String, Value>,
        items: &[Member],
        extras_allowed: bool,
        declared: &[&str],
        pointer: &str,
    ) -> Result<Vec<(usize, usize)>> {
        // A name with a slot that is not among the items can never be written.
        let extra_name = |n: &str| extras_allowed && !declared.contains(&n);
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
        let index = |n: &str| items.iter().position(|it| it.name == n);
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
                None if extra_name(trigger) => {
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
                    None if !extra_name(d) => out.push((t, usize::MAX)),
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
}

/// An object member with a slot of its own ([`Translator::members`]).
pub(super) struct Member {
    pub(super) name: String,
    pub(super) value: Re,
    pub(super) required: bool,
}

/// What decides an object's names and the schema of each one's value
/// ([`Translator::names`]).
pub(super) struct Names {
    /// `additionalProperties` (or `unevaluatedProperties`, or `false` under `strict`).
    extra_schema: Value,
    patterns: Vec<PatternProperty>,
    /// `propertyNames`, and its test of quoted names.
    schema: Option<Value>,
    test: Option<Narrowing>,
}

impl Names {
    /// Whether `propertyNames` accepts `name` as a string; tested on the generated language, so
    /// a name outside it is left out (sound).
    fn allowed(&self, name: &str) -> bool {
        self.test
            .as_ref()
            .is_none_or(|r| r.is_match(serde_json::to_string(name).unwrap().as_bytes()))
    }

    /// The schema a named property's value must satisfy: its `properties` entry and every
    /// pattern matching the name, or else `additionalProperties`.
    fn value_schema(&self, name: &str, declared: Option<&Value>) -> Value {
        let quoted = serde_json::to_string(name).unwrap();
        let mut all: Vec<Value> = declared.into_iter().cloned().collect();
        all.extend(
            self.patterns
                .iter()
                .filter(|p| p.matcher.is_match(quoted.as_bytes()))
                .map(|p| p.schema.clone()),
        );
        match all.len() {
            0 => self.extra_schema.clone(),
            1 => all.pop().unwrap(),
            _ => json!({ "allOf": all }),
        }
    }
}

/// Members in order, each optional or required, then any number of `extra` members. The text
/// starts with a non-empty "head" (no leading comma) followed by the rest as a "tail" (each
/// member with a leading comma); see [`ordered_members`].
fn free_members(members: &[(Re, bool)], extra: Option<&Re>, comma: &Re) -> Re {
    let extras = extra
        .map(|e| Re::star(Re::seq([comma.clone(), e.clone()])))
        .unwrap_or_else(Re::empty);
    let mut alts = Vec::new();
    let (first, may_be_empty) = ordered_members(members, comma);
    if let Some(first) = first {
        alts.push(Re::seq([first, extras.clone()]));
    }
    if may_be_empty {
        alts.push(match extra {
            Some(e) => Re::opt(Re::seq([e.clone(), extras])),
            None => Re::empty(),
        });
    }
    Re::alt(alts)
}

/// A JSON string body (without quotes) that is not one of `names`: a trie over the names, where at
/// each node the text may leave the trie with a character no name continues with, or end if the
/// node is not a name.
pub(super) fn key_not_in(names: &[&str]) -> Re {
    if names.is_empty() {
        return super::any_string();
    }
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
                format!(r#"(?:[[^"\\\x00-\x1F]--[{plain}]]|{ESCAPED})"#)
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
    Re::text(format!("\"{}\"", build(&root)))
}

/// Object members in order (`(regex, required)`), then any number of `extra` members, with the
/// total count in `[min, max]`. `h(i, c)`: members from `i` on after `c` were written (`c` is capped
/// where larger counts behave the same), so the regex tracks the count it needs and no more.
fn counted_members(
    members: &[(Re, bool)],
    extra: Option<&Re>,
    min: u64,
    max: Option<u64>,
    deps: &[(usize, usize)],
    comma: &Re,
) -> Re {
    struct Counted<'a> {
        members: &'a [(Re, bool)],
        extra: Option<&'a Re>,
        min: u64,
        max: Option<u64>,
        comma: &'a Re,
        cap: u64,
        /// (trigger, dependent) as bits of `present`; a dependent bit of 0 can never be set.
        deps: Vec<(u64, u64)>,
        /// Member index → its bit in `present`, or 0 when no dependency mentions it.
        bit: Vec<u64>,
        memo: std::collections::HashMap<(usize, u64, u64), Re>,
    }
    impl Counted<'_> {
        fn h(&mut self, i: usize, c: u64, present: u64) -> Re {
            if let Some(r) = self.memo.get(&(i, c, present)) {
                return r.clone();
            }
            let comma = self.comma;
            let sep = if c == 0 { Re::empty() } else { comma.clone() };
            let broken = self
                .deps
                .iter()
                .any(|&(t, d)| present & t != 0 && present & d == 0);
            let r = if i == self.members.len() && broken {
                Re::nothing()
            } else if i == self.members.len() {
                let lo = self.min.saturating_sub(c);
                let hi = self.max.map(|m| m.saturating_sub(c));
                match self.extra {
                    Some(e) if hi != Some(0) => {
                        let more = Re::seq([comma.clone(), e.clone()]);
                        if c == 0 {
                            let rest = Re::repeat(more, lo.saturating_sub(1), hi.map(|h| h - 1));
                            let body = Re::seq([e.clone(), rest]);
                            if lo == 0 {
                                Re::opt(body)
                            } else {
                                body
                            }
                        } else {
                            Re::repeat(more, lo, hi)
                        }
                    }
                    _ if lo == 0 => Re::empty(),
                    _ => Re::nothing(),
                }
            } else {
                let (mem, required) = self.members[i].clone();
                let with = if self.max.is_some_and(|m| c + 1 > m) {
                    Re::nothing()
                } else {
                    let next = (c + 1).min(self.cap);
                    Re::seq([sep, mem, self.h(i + 1, next, present | self.bit[i])])
                };
                if required {
                    with
                } else {
                    Re::alt([with, self.h(i + 1, c, present)])
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
        comma,
        cap: max.unwrap_or(min.max(1)).max(1),
        deps,
        bit,
        memo: std::collections::HashMap::new(),
    }
    .h(0, 0, 0)
}

/// A `patternProperties` entry.
pub(super) struct PatternProperty {
    /// Quoted names the pattern matches.
    names: Re,
    /// Whether a quoted name matches.
    pub(super) matcher: Narrowing,
    pub(super) schema: Value,
    pub(super) pointer: String,
}

/// A full-match regex for testing a few short texts while translating: a lazy DFA, so a large
/// regex costs only the states those texts visit.
pub(super) fn full_match(
    re: &Re,
    keyword: &str,
    pointer: &str,
) -> Result<regex_automata::meta::Regex> {
    if re.has_markers() {
        return Err(unsupported(
            keyword,
            pointer,
            "a recursive reference or a large intersection where names must be tested",
        ));
    }
    regex_automata::meta::Regex::builder()
        .syntax(schema_syntax())
        .configure(regex_automata::meta::Config::new().nfa_size_limit(Some(16 << 20)))
        .build(&format!("^(?:{re})$"))
        .map_err(|e| unsupported(keyword, pointer, &e.to_string()))
}

/// The longest regex text [`Narrowing`] gives regex-automata.
const MAX_MATCH_TEXT: usize = 16 << 10;

/// A test of whole texts against a schema's regex, for callers that keep only what passes (the
/// names `propertyNames` allows, the `enum` values the rest of the schema accepts), where a
/// wrong "no" narrows the output and stays sound. A plain regex is matched by regex-automata
/// ([`full_match`]); one with intersection terms, which regex-automata cannot express, by the
/// grammar's own lazy DFA over those terms. That DFA answers "no" once it outgrows its limits,
/// and a recursive reference matches nothing there.
pub(super) enum Narrowing {
    Regex(regex_automata::meta::Regex),
    Terms(Box<crate::dfa::LazyDfa>),
}

impl Narrowing {
    pub(super) fn new(re: &Re, keyword: &str, pointer: &str) -> Result<Self> {
        // A regex too large for regex-automata's NFA (or to write out: the text repeats every
        // shared part) is read as terms instead.
        if !re.has_markers() && re.len() <= MAX_MATCH_TEXT {
            if let Ok(r) = full_match(re, keyword, pointer) {
                return Ok(Self::Regex(r));
            }
        }
        let mut terms = crate::deriv::Terms::new();
        let root = re
            .lower(&mut terms)
            .map_err(|e| unsupported(keyword, pointer, &e.reason.to_string()))?;
        Ok(Self::Terms(Box::new(crate::dfa::LazyDfa::new(
            terms,
            root,
            4096,
            1 << 20,
        ))))
    }

    pub(super) fn is_match(&self, text: &[u8]) -> bool {
        match self {
            Self::Regex(r) => r.is_match(text),
            Self::Terms(dfa) => {
                let mut s = 0;
                for &b in text {
                    s = dfa.step(s, b);
                    if s == crate::dfa::DEAD {
                        return false;
                    }
                }
                dfa.is_accepting(s)
            }
        }
    }
}

/// Comma-separated members in order, optional ones omissible: the regex of the non-empty
/// sequences (`None` if there are none), and whether the empty sequence is allowed (all optional).
///
/// Split in halves A and B: a non-empty sequence either starts in A (a non-empty sequence of A,
/// then B as a tail, each member with a leading comma) or, if A may be empty, lies in B. Each
/// member appears O(log n) times, where the direct form (for each first member, the rest as a
/// tail) repeats the tail n times: an object with n optional properties was O(n²) regex.
fn ordered_members(members: &[(Re, bool)], comma: &Re) -> (Option<Re>, bool) {
    match members {
        [] => (None, true),
        [(m, required)] => (Some(m.clone()), !required),
        _ => {
            let (a, b) = members.split_at(members.len() / 2);
            let (a_first, a_empty) = ordered_members(a, comma);
            let (b_first, b_empty) = ordered_members(b, comma);
            let tail = Re::seq(b.iter().map(|(m, required)| {
                let m = Re::seq([comma.clone(), m.clone()]);
                if *required {
                    m
                } else {
                    Re::opt(m)
                }
            }));
            let mut alts = Vec::new();
            if let Some(f) = a_first {
                alts.push(Re::seq([f, tail]));
            }
            if a_empty {
                alts.extend(b_first);
            }
            (
                (!alts.is_empty()).then(|| Re::alt(alts)),
                a_empty && b_empty,
            )
        }
    }
}
