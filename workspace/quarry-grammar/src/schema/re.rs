//! The schema translator's output: a typed regex tree, lowered straight into the grammar's
//! [`Terms`].
//!
//! Objects, arrays, alternatives, repetitions, intersections (`a ∧ b`, `a ∧ ¬b`) and references
//! to the rules of a recursive schema are nodes; only leaf languages (a number range, a format,
//! a user's `pattern`, a literal) are regex text, each parsed on its own. Subtrees are shared by
//! reference counting, so a subschema used in many places (a `$ref` target, a property's value
//! under several branches) is built once, lowered once ([`Lowering`] memoizes shared nodes and
//! equal leaf texts), and never copied as text.
//!
//! [`Re`]'s `Display` writes the tree as regex text, for `quarry grammar explain` and for tests
//! that hand marker-free text to regex-automata: intersections and rule references are written
//! as empty named groups (`(?P<quarry_and>)`, `(?P<quarry_rule_k>)`), which
//! [`crate::parse::parse_with_rules`] reads back into the same terms.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt::{self, Write};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::deriv::{Id, Terms, EMPTY, INF, NOTHING};

/// A regex over canonical JSON text (see the module doc). Cloning shares the tree.
#[derive(Clone)]
pub(crate) struct Re(Rc<Node>);

struct Node {
    kind: Kind,
    /// Bytes of the regex text the tree stands for (its `Display`; saturating: with shared
    /// subtrees it can be exponential in the tree's size).
    len: usize,
    /// Whether a rule reference occurs in the tree (a grammar, not a regular language).
    rule: bool,
    /// Whether an intersection or a rule reference occurs in the tree: text regex-automata
    /// would misread.
    markers: bool,
    /// Bytes this node holds itself, counted in [`held`] while it lives.
    own: usize,
}

impl Drop for Node {
    fn drop(&mut self) {
        // At thread exit the count may be gone before the last shared leaves: nothing to do.
        let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(self.own)));
    }
}

enum Kind {
    /// A leaf regex in the dialect [`crate::parse`] reads, without markers.
    Text(Cow<'static, str>),
    /// Concatenation; empty for the empty string.
    Seq(Box<[Re]>),
    /// Alternation of at least two (none: the empty language).
    Alt(Box<[Re]>),
    /// `x{min,max}`, `max` = [`INF`] for no bound.
    Repeat(Re, u32, u32),
    /// `a ∧ b`, or with `negate` `a ∧ ¬b`.
    And(Re, Re, bool),
    /// A reference to rule `k` of the schema's grammar (the root is rule 0).
    Rule(u32),
}

thread_local! {
    /// Bytes of typed regex alive on this thread ([`held`]).
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Bytes of typed regex alive on this thread: its nodes, their lists of parts and their own
/// leaf text. A translation's size is what it adds; a subtree shared by several uses counts
/// once (the text, [`Re::len`], repeats it), and what the translator built and dropped on the
/// way counts no more.
pub(crate) fn held() -> usize {
    HELD.with(Cell::get)
}

/// The text of a regex with an empty language.
const NOTHING_TEXT: &str = r"[^\x00-\x{10FFFF}]";

impl Re {
    fn node(kind: Kind) -> Re {
        let own = std::mem::size_of::<Node>()
            + 2 * std::mem::size_of::<usize>()
            + match &kind {
                Kind::Text(Cow::Owned(s)) => s.len(),
                Kind::Seq(xs) | Kind::Alt(xs) => xs.len() * std::mem::size_of::<Re>(),
                _ => 0,
            };
        HELD.with(|h| h.set(h.get() + own));
        let sum = |lens: &mut dyn Iterator<Item = usize>| lens.fold(0, usize::saturating_add);
        let (len, rule, markers) = match &kind {
            Kind::Text(s) => (s.len(), false, false),
            Kind::Seq(xs) => (
                sum(&mut xs.iter().map(Re::atom_len)),
                xs.iter().any(|x| x.0.rule),
                xs.iter().any(|x| x.0.markers),
            ),
            Kind::Alt(xs) if xs.is_empty() => (NOTHING_TEXT.len(), false, false),
            Kind::Alt(xs) => (
                sum(&mut xs.iter().map(|x| x.0.len.saturating_add(1))).saturating_add(3),
                xs.iter().any(|x| x.0.rule),
                xs.iter().any(|x| x.0.markers),
            ),
            Kind::Repeat(x, min, max) => (
                x.0.len.saturating_add(4 + quantifier_len(*min, *max)),
                x.0.rule,
                x.0.markers,
            ),
            Kind::And(a, b, negate) => (
                a.0.len
                    .saturating_add(b.0.len)
                    .saturating_add(crate::parse::and_text_len(*negate)),
                a.0.rule || b.0.rule,
                true,
            ),
            Kind::Rule(k) => (crate::parse::rule_ref_len(*k as usize), true, true),
        };
        Re(Rc::new(Node {
            kind,
            len,
            rule,
            markers,
            own,
        }))
    }

    /// Bytes of the text as one piece of a concatenation ([`Re::write_atom`]).
    fn atom_len(&self) -> usize {
        match &self.0.kind {
            Kind::Text(s) if s.contains('|') => s.len().saturating_add(4),
            _ => self.0.len,
        }
    }

    /// A leaf: regex text in [`crate::parse`]'s dialect (a whole regex, alternations included).
    pub(crate) fn text(s: impl Into<Cow<'static, str>>) -> Re {
        let s = s.into();
        if s.is_empty() {
            return Re::empty();
        }
        Re::node(Kind::Text(s))
    }

    /// The literal text `s`.
    pub(crate) fn lit(s: &str) -> Re {
        Re::text(regex_syntax::escape(s))
    }

    /// The empty language.
    pub(crate) fn nothing() -> Re {
        Re::node(Kind::Alt(Box::new([])))
    }

    /// The empty string.
    pub(crate) fn empty() -> Re {
        Re::node(Kind::Seq(Box::new([])))
    }

    /// Whether this is the empty language as built (an intersection may be empty too without
    /// being this).
    pub(crate) fn is_nothing(&self) -> bool {
        matches!(&self.0.kind, Kind::Alt(xs) if xs.is_empty())
    }

    fn is_empty(&self) -> bool {
        matches!(&self.0.kind, Kind::Seq(xs) if xs.is_empty())
    }

    /// The parts one after another: nested sequences are flattened, the empty string dropped,
    /// and the empty language absorbs the whole.
    pub(crate) fn seq(parts: impl IntoIterator<Item = Re>) -> Re {
        let mut out = Vec::new();
        for p in parts {
            match &p.0.kind {
                Kind::Seq(xs) => out.extend(xs.iter().cloned()),
                Kind::Alt(xs) if xs.is_empty() => return Re::nothing(),
                _ => out.push(p),
            }
        }
        match out.len() {
            1 => out.pop().expect("one part"),
            _ => Re::node(Kind::Seq(out.into())),
        }
    }

    /// Any one of the parts (none: the empty language). Empty languages among them are dropped.
    pub(crate) fn alt(parts: impl IntoIterator<Item = Re>) -> Re {
        let mut out: Vec<Re> = parts.into_iter().filter(|p| !p.is_nothing()).collect();
        match out.len() {
            1 => out.pop().expect("one part"),
            _ => Re::node(Kind::Alt(out.into())),
        }
    }

    /// `x{min,max}` (`max`: `None` for no bound).
    pub(crate) fn repeat(x: Re, min: u64, max: Option<u64>) -> Re {
        let clamp = |v: u64| u32::try_from(v).unwrap_or(INF - 1);
        let (min, max) = (clamp(min), max.map_or(INF, clamp));
        if min > max {
            return Re::nothing();
        }
        if max == 0 || x.is_empty() {
            return Re::empty();
        }
        if x.is_nothing() {
            return if min == 0 { Re::empty() } else { Re::nothing() };
        }
        if (min, max) == (1, 1) {
            return x;
        }
        Re::node(Kind::Repeat(x, min, max))
    }

    /// `x?`.
    pub(crate) fn opt(x: Re) -> Re {
        Re::repeat(x, 0, Some(1))
    }

    /// `x*`.
    pub(crate) fn star(x: Re) -> Re {
        Re::repeat(x, 0, None)
    }

    /// `a ∧ b` (`negate`: `a ∧ ¬b`): the lazy DFA builds the product states decoding visits.
    pub(crate) fn and(a: Re, b: Re, negate: bool) -> Re {
        if a.is_nothing() || (b.is_nothing() && !negate) {
            return Re::nothing();
        }
        if b.is_nothing() {
            return a;
        }
        Re::node(Kind::And(a, b, negate))
    }

    /// A reference to rule `k` (the root is 0).
    pub(crate) fn rule(k: usize) -> Re {
        Re::node(Kind::Rule(u32::try_from(k).expect("fewer than 2^32 rules")))
    }

    /// Bytes of regex text this stands for (saturating).
    pub(crate) fn len(&self) -> usize {
        self.0.len
    }

    /// Whether a rule reference occurs in it.
    pub(crate) fn has_rule(&self) -> bool {
        self.0.rule
    }

    /// Whether an intersection or rule reference occurs in it, so its text is not plain regex.
    pub(crate) fn has_markers(&self) -> bool {
        self.0.markers
    }

    /// The term of this tree in `terms`; a leaf text the parser refuses is an error naming it.
    pub(crate) fn lower(&self, terms: &mut Terms) -> Result<Id, LeafError> {
        Lowering::default().lower(terms, self)
    }

    /// Writes the text as one piece of a concatenation (an alternation in a group).
    fn write_atom(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            Kind::Text(s) if s.contains('|') => write!(f, "(?:{s})"),
            _ => write!(f, "{self}"),
        }
    }
}

impl fmt::Display for Re {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            Kind::Text(s) => f.write_str(s),
            Kind::Seq(xs) => xs.iter().try_for_each(|x| x.write_atom(f)),
            Kind::Alt(xs) if xs.is_empty() => f.write_str(NOTHING_TEXT),
            Kind::Alt(xs) => {
                f.write_str("(?:")?;
                for (i, x) in xs.iter().enumerate() {
                    if i > 0 {
                        f.write_char('|')?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_char(')')
            }
            Kind::Repeat(x, min, max) => write!(f, "(?:{x}){}", quantifier(*min, *max)),
            Kind::And(a, b, negate) => f.write_str(&crate::parse::and_text(
                &a.to_string(),
                &b.to_string(),
                *negate,
            )),
            Kind::Rule(k) => f.write_str(&crate::parse::rule_ref_text(*k as usize)),
        }
    }
}

/// The length of [`quantifier`]'s text, without writing it.
fn quantifier_len(min: u32, max: u32) -> usize {
    let digits = |v: u32| v.checked_ilog10().map_or(1, |d| d as usize + 1);
    match (min, max) {
        (0, INF) | (1, INF) | (0, 1) => 1,
        (m, INF) => digits(m) + 3,
        (m, n) if m == n => digits(m) + 2,
        (m, n) => digits(m) + digits(n) + 3,
    }
}

/// The text of a repetition's bounds.
fn quantifier(min: u32, max: u32) -> Cow<'static, str> {
    match (min, max) {
        (0, INF) => "*".into(),
        (1, INF) => "+".into(),
        (0, 1) => "?".into(),
        (m, INF) => format!("{{{m},}}").into(),
        (m, n) if m == n => format!("{{{m}}}").into(),
        (m, n) => format!("{{{m},{n}}}").into(),
    }
}

impl fmt::Debug for Re {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Re({self})")
    }
}

/// A leaf text the regex parser refused, and why.
#[derive(Debug)]
pub(crate) struct LeafError {
    pub(crate) text: String,
    pub(crate) reason: crate::error::RegexError,
}

/// Stack kept free for one more level of lowering (the tree is as deep as the schema's
/// nesting); below it, lowering continues on a new segment.
const STACK_RED_ZONE: usize = 64 << 10;
const STACK_SEGMENT: usize = 4 << 20;

/// One lowering pass: the terms of shared nodes and of leaf texts already lowered.
#[derive(Default)]
struct Lowering<'r> {
    shared: FxHashMap<*const Node, Id>,
    texts: FxHashMap<&'r str, Id>,
}

impl<'r> Lowering<'r> {
    fn lower(&mut self, t: &mut Terms, re: &'r Re) -> Result<Id, LeafError> {
        let shared = Rc::strong_count(&re.0) > 1;
        if shared {
            if let Some(&id) = self.shared.get(&Rc::as_ptr(&re.0)) {
                return Ok(id);
            }
        }
        let id = stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || self.build(t, re))?;
        if shared {
            self.shared.insert(Rc::as_ptr(&re.0), id);
        }
        Ok(id)
    }

    fn build(&mut self, t: &mut Terms, re: &'r Re) -> Result<Id, LeafError> {
        Ok(match &re.0.kind {
            Kind::Text(s) => {
                if let Some(&id) = self.texts.get(&**s) {
                    return Ok(id);
                }
                let id = crate::parse::parse(t, s, true).map_err(|reason| LeafError {
                    text: s.to_string(),
                    reason,
                })?;
                self.texts.insert(s, id);
                id
            }
            Kind::Seq(xs) => {
                let mut acc = EMPTY;
                for x in xs.iter().rev() {
                    let x = self.lower(t, x)?;
                    acc = t.concat(x, acc);
                }
                acc
            }
            Kind::Alt(xs) if xs.is_empty() => NOTHING,
            Kind::Alt(xs) => {
                let items = xs
                    .iter()
                    .map(|x| self.lower(t, x))
                    .collect::<Result<Vec<_>, _>>()?;
                t.or(&items)
            }
            Kind::Repeat(x, min, max) => {
                let x = self.lower(t, x)?;
                t.repeat(x, *min, *max)
            }
            Kind::And(a, b, negate) => {
                let a = self.lower(t, a)?;
                let b = self.lower(t, b)?;
                let b = if *negate { t.not(b) } else { b };
                t.and(&[a, b])
            }
            Kind::Rule(k) => t.rule_ref(*k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` is the length of the text, and lowering builds the term the text parses to (read
    /// as schema text, with markers: at least one rule).
    fn check(re: &Re, rules: u32) -> Id {
        let text = re.to_string();
        assert_eq!(re.len(), text.len(), "{text}");
        let mut t = Terms::new();
        let lowered = re.lower(&mut t).unwrap();
        let parsed = crate::parse::parse_with_rules(&mut t, &text, true, rules.max(1)).unwrap();
        assert_eq!(lowered, parsed, "{text}");
        lowered
    }

    #[test]
    fn text_and_terms_agree() {
        let ab = Re::text("a|b");
        let cases = [
            Re::empty(),
            Re::nothing(),
            Re::seq([Re::lit("x.y"), ab.clone(), Re::text("[0-9]{2}")]),
            Re::alt([ab.clone(), Re::empty(), Re::lit("c")]),
            Re::repeat(ab.clone(), 2, Some(5)),
            Re::repeat(Re::seq([Re::text(","), ab.clone()]), 3, None),
            Re::star(Re::opt(ab.clone())),
            Re::and(Re::text("[a-z]+"), Re::text("ab|ba"), false),
            Re::seq([
                Re::text("<"),
                Re::and(Re::text("[a-z]*"), Re::lit("q"), true),
                Re::text(">"),
            ]),
            Re::seq([Re::text("\\["), Re::rule(1), Re::opt(Re::rule(2))]),
            // Bounds and rule numbers of several digits.
            Re::repeat(ab.clone(), 12, Some(345)),
            Re::repeat(ab.clone(), 10, None),
            Re::repeat(Re::lit("x"), 100, Some(100)),
            Re::alt([Re::rule(12), Re::rule(9), Re::rule(10)]),
        ];
        for re in &cases {
            check(re, 20);
        }
    }

    #[test]
    fn the_empty_language_absorbs_and_vanishes() {
        let x = Re::lit("x");
        assert!(Re::seq([x.clone(), Re::nothing()]).is_nothing());
        assert!(Re::and(Re::nothing(), x.clone(), true).is_nothing());
        assert!(Re::and(x.clone(), Re::nothing(), false).is_nothing());
        assert!(Re::repeat(Re::nothing(), 1, None).is_nothing());
        assert!(Re::repeat(x.clone(), 3, Some(2)).is_nothing());
        assert_eq!(Re::alt([Re::nothing(), x.clone()]).to_string(), "x");
        assert_eq!(Re::and(x.clone(), Re::nothing(), true).to_string(), "x");
        assert_eq!(Re::repeat(Re::nothing(), 0, Some(4)).to_string(), "");
        // None of these is structurally empty, though the last has an empty language: only
        // lowering decides that.
        for re in [x.clone(), Re::empty(), Re::and(x.clone(), x.clone(), true)] {
            assert!(!re.is_nothing());
        }
        let mut t = Terms::new();
        let void = Re::and(x.clone(), x.clone(), true).lower(&mut t).unwrap();
        let live = Re::and(Re::text("x|y"), x, true).lower(&mut t).unwrap();
        let (classes, n) = t.byte_classes();
        let reps: Vec<u8> = (0..n)
            .map(|c| {
                (0..=255u8)
                    .find(|&b| classes[b as usize] as usize == c)
                    .unwrap()
            })
            .collect();
        assert_eq!(t.is_void(void, &reps, 1000), (true, false));
        assert_eq!(t.is_void(live, &reps, 1000), (false, false));
    }

    #[test]
    fn held_bytes_count_shared_parts_once_and_go_with_the_tree() {
        let before = held();
        let leaf = Re::text("x".repeat(1000));
        let one = held() - before;
        assert!(one > 1000);
        // A hundred uses of one leaf hold one leaf and a list of a hundred parts, where the
        // text repeats it a hundred times.
        let many = Re::seq(vec![leaf.clone(); 100]);
        assert_eq!(many.len(), 100 * leaf.len());
        let shared = held() - before;
        assert!(shared < 2 * one, "{shared} vs {one}");
        let copies = Re::seq((0..100).map(|_| Re::text("x".repeat(1000))));
        assert!(held() - before > 100 * one);
        drop((leaf, many, copies));
        assert_eq!(held(), before);
    }

    #[test]
    fn shared_subtrees_lower_once_and_flags_propagate() {
        let item = Re::seq([Re::text("[0-9]+"), Re::lit(".")]);
        let list = Re::seq([
            item.clone(),
            Re::star(Re::seq([Re::text(","), item.clone()])),
        ]);
        assert!(!list.has_markers() && !list.has_rule());
        let id = check(&list, 0);
        assert_ne!(id, NOTHING);
        let recursive = Re::alt([list.clone(), Re::seq([Re::text("\\("), Re::rule(1)])]);
        assert!(recursive.has_rule() && recursive.has_markers());
        let and = Re::and(list.clone(), Re::text("1.*"), false);
        assert!(and.has_markers() && !and.has_rule());
        check(&recursive, 2);
        check(&and, 0);
        // A bad leaf is an error naming its text.
        let bad = Re::seq([list, Re::text("a{3,1}")]);
        let err = bad.lower(&mut Terms::new()).unwrap_err();
        assert_eq!(err.text, "a{3,1}");
    }
}
