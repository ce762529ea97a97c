//! Compiling a constraint to a byte DFA, and the per-state token masks and forced bytes cached in it.

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use crate::cfg::{Prepared, Rules};
use crate::deriv::Terms;
use crate::dfa::{Grow, LazyDfa, Overflow, DEAD};
use crate::error::GrammarError;
use crate::limits::Limits;
use crate::loops::ByteSet;
use crate::schema::unique::UniquePlan;
use crate::schema::{schema_to_regex, Re, SchemaOptions, Whitespace};
use crate::vocab::{Vocabulary, BYTE_GROUP};

mod walk;
use walk::{Returns, SubtreeCache, TextEntry, TextStep};

/// What the output must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// The whole output matches this regex (anchored at both ends).
    Regex(String),
    /// The whole output is exactly one of these strings.
    Choice(Vec<String>),
    /// The output is canonical JSON that the schema accepts (see [`crate::schema`]). Recursive
    /// `$ref`s make it a grammar ([`crate::cfg`]).
    JsonSchema {
        schema: serde_json::Value,
        options: SchemaOptions,
    },
    /// The output is a grammar in GBNF, llama.cpp's syntax ([`crate::gbnf`]).
    Gbnf(String),
    /// The output is a grammar in Lark's syntax, as llguidance and Outlines take it (the
    /// subset that describes a language; see the `lark` module).
    Lark(String),
    /// The output is a JSON object whose values are any JSON value, nested to any depth, laid
    /// out like a schema's output (`json_object` in OpenAI's and vLLM's APIs).
    JsonObject { whitespace: Whitespace },
}

/// A constraint as the key of a compiled-grammar cache: equal exactly when two constraints
/// compile to the same grammar (the same text, or the same schema value for value with object
/// members in the same order, since member order is output order, and the same options), and
/// hashed structurally to match. (`Constraint`'s own `==` ignores the order of object members.)
#[derive(Debug, Clone)]
pub struct ConstraintKey(Constraint);

impl ConstraintKey {
    pub fn new(c: &Constraint) -> Self {
        ConstraintKey(c.clone())
    }
}

impl PartialEq for ConstraintKey {
    fn eq(&self, other: &Self) -> bool {
        use Constraint::*;
        match (&self.0, &other.0) {
            (Regex(a), Regex(b)) | (Gbnf(a), Gbnf(b)) | (Lark(a), Lark(b)) => a == b,
            (Choice(a), Choice(b)) => a == b,
            (
                JsonSchema {
                    schema: a,
                    options: oa,
                },
                JsonSchema {
                    schema: b,
                    options: ob,
                },
            ) => oa == ob && same_value(a, b),
            (JsonObject { whitespace: a }, JsonObject { whitespace: b }) => a == b,
            _ => false,
        }
    }
}

impl Eq for ConstraintKey {}

impl std::hash::Hash for ConstraintKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::mem::discriminant(&self.0).hash(h);
        match &self.0 {
            Constraint::Regex(t) | Constraint::Gbnf(t) | Constraint::Lark(t) => t.hash(h),
            Constraint::Choice(c) => c.hash(h),
            Constraint::JsonSchema { schema, options } => {
                hash_value(schema, h);
                options.hash(h);
            }
            Constraint::JsonObject { whitespace } => whitespace.hash(h),
        }
    }
}

/// Equal values with object members in the same order (numbers as `Number` compares them).
fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kp, p), (kq, q))| kp == kq && same_value(p, q))
        }
        _ => a == b,
    }
}

fn hash_value<H: std::hash::Hasher>(v: &serde_json::Value, h: &mut H) {
    use serde_json::Value;
    use std::hash::Hash;
    std::mem::discriminant(v).hash(h);
    match v {
        Value::Null => {}
        Value::Bool(b) => b.hash(h),
        // Equal numbers have equal text (`1` and `1.0` are not equal `Number`s).
        Value::Number(n) => n.to_string().hash(h),
        Value::String(s) => s.hash(h),
        Value::Array(a) => {
            a.len().hash(h);
            for x in a {
                hash_value(x, h);
            }
        }
        Value::Object(m) => {
            m.len().hash(h);
            for (k, x) in m {
                k.hash(h);
                hash_value(x, h);
            }
        }
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;
    use serde_json::json;
    use std::hash::{BuildHasher, RandomState};

    #[test]
    fn keys_are_equal_exactly_when_the_grammar_is_the_same() {
        let schema = |v: serde_json::Value| {
            ConstraintKey::new(&Constraint::JsonSchema {
                schema: v,
                options: SchemaOptions::default(),
            })
        };
        let a = schema(json!({"properties": {"x": {"type": "integer"}, "y": {"const": 1}}}));
        let same = schema(json!({"properties": {"x": {"type": "integer"}, "y": {"const": 1}}}));
        let reordered =
            schema(json!({"properties": {"y": {"const": 1}, "x": {"type": "integer"}}}));
        let float = schema(json!({"properties": {"x": {"type": "integer"}, "y": {"const": 1.0}}}));
        let s = RandomState::new();
        assert!(a == same && s.hash_one(&a) == s.hash_one(&same));
        // Member order is output order, so a reordered schema is another grammar, although
        // `Constraint`'s own `==` calls the two equal.
        assert!(a != reordered);
        assert_eq!(a.0, reordered.0);
        assert!(a != float);
        let regex = ConstraintKey::new(&Constraint::Regex("a|b".into()));
        let gbnf = ConstraintKey::new(&Constraint::Gbnf("a|b".into()));
        assert!(regex != gbnf);
    }
}

impl Constraint {
    /// A grammar file's constraint: Lark syntax for a `.lark` file, GBNF otherwise.
    pub fn grammar_file(path: &std::path::Path, text: String) -> Constraint {
        if path.extension().is_some_and(|e| e == "lark") {
            Constraint::Lark(text)
        } else {
            Constraint::Gbnf(text)
        }
    }

    /// The constraint as regex text: for a regex or choice list its regex, for a schema (and
    /// `json_object`) the regex of the root and of each rule recursion needs, as
    /// `(name, regex)` pairs where `(?P<quarry_rule_k>)` refers to the k-th pair (the root is
    /// 0). A GBNF grammar is its own text and has no regex form: `InvalidRule`.
    pub fn rules(&self) -> Result<Vec<(String, String)>, GrammarError> {
        let limits = Limits::default();
        let deadline = std::time::Instant::now() + limits.compile_time;
        let (root, rules) = match self {
            Constraint::JsonSchema { schema, options } => crate::schema::schema_to_rules_by(
                schema,
                options,
                &limits,
                deadline,
                crate::schema::Measure::Text,
            )?,
            Constraint::JsonObject { whitespace } => crate::schema::json_object_rules(*whitespace),
            Constraint::Gbnf(_) | Constraint::Lark(_) => {
                return Err(GrammarError::InvalidRule {
                    rule: "root".into(),
                    message: "a grammar file has no regex form; its text is the constraint".into(),
                })
            }
            _ => return Ok(vec![("root".to_owned(), self.pattern()?)]),
        };
        let mut out = vec![("root".to_owned(), root.to_string())];
        for (k, body) in rules.into_iter().enumerate() {
            out.push((format!("rule {}", k + 1), body.to_string()));
        }
        Ok(out)
    }

    /// The regex this constraint compiles from (for a schema, the derived regex). A grammar
    /// (GBNF, `json_object`, a schema with recursion) has none: see [`Constraint::rules`].
    pub fn pattern(&self) -> Result<String, GrammarError> {
        match self {
            Constraint::JsonSchema { schema, options } => Ok(schema_to_regex(schema, options)?),
            Constraint::Gbnf(_) | Constraint::Lark(_) | Constraint::JsonObject { .. } => {
                Err(GrammarError::InvalidRule {
                    rule: "root".into(),
                    message: "a grammar has no single regex; see Constraint::rules".into(),
                })
            }
            Constraint::Regex(r) => Ok(r.clone()),
            Constraint::Choice(c) if c.is_empty() => Err(GrammarError::EmptyChoice),
            Constraint::Choice(c) => Ok(c
                .iter()
                .map(|s| regex_syntax::escape(s))
                .collect::<Vec<_>>()
                .join("|")),
        }
    }
}

/// `LimitExceeded` naming `limit` when `value` passes its `bound`.
fn within(value: usize, bound: usize, limit: &'static str) -> Result<(), GrammarError> {
    if value > bound {
        return Err(GrammarError::LimitExceeded {
            limit,
            value: bound,
        });
    }
    Ok(())
}

/// A schema's (or `json_object`'s) typed regex for the root and its rules, lowered into terms
/// and prepared (translation bounded its size). Leaf texts are parsed in byte mode (they are
/// quarry's own text, and byte classes in them are meant); user regexes must match UTF-8 only.
fn from_regex_rules(root: &Re, rules: Vec<Re>) -> Result<Prepared, GrammarError> {
    let mut terms = Terms::new();
    let parse = |terms: &mut Terms, re: &Re| {
        re.lower(terms).map_err(|e| GrammarError::InvalidRegex {
            pattern: e.text,
            reason: e.reason,
        })
    };
    let root = parse(&mut terms, root)?;
    if rules.is_empty() {
        return Ok(Prepared {
            terms,
            root,
            bodies: Vec::new(),
        });
    }
    let mut bodies = vec![root];
    let mut names = vec!["root".to_owned()];
    for (k, re) in rules.iter().enumerate() {
        bodies.push(parse(&mut terms, re)?);
        names.push(format!("rule {}", k + 1));
    }
    crate::cfg::prepare(Rules {
        terms,
        names,
        bodies,
    })
}

/// A compiled constraint over one vocabulary. `Send + Sync`, and shared through an `Arc` by every
/// sequence and thread that uses the same constraint.
///
/// Compiling parses the regex into a term and stops: the DFA ([`crate::dfa`]) grows one row at a
/// time as matchers and mask walks step through it, so a big schema costs only the states its
/// outputs visit. Every state is live (a match is still reachable), so a step is one atomic load and
/// leaving the language is the `DEAD` entry, with no separate liveness check.
#[derive(Debug)]
pub struct Grammar {
    dfa: LazyDfa,
    vocab: Arc<Vocabulary>,
    limits: Limits,
    /// Per state: a run of byte groups that can be read without leaving the language ([`Run`]).
    runs: Grow<OnceLock<Run>>,
    /// Per state: the byte groups that lead to one successor, and that successor ([`Run`]).
    firsts: Grow<OnceLock<(u64, u32)>>,
    /// Per state: its token mask, computed on first use.
    masks: Grow<OnceLock<Box<[u32]>>>,
    /// Per state: its forced bytes, computed on first use.
    forced: Grow<OnceLock<Box<[u8]>>>,
    /// Per pushdown state: its core (itself when it has no context), see
    /// [`Grammar::compute_mask`].
    cores: Grow<OnceLock<u32>>,
    /// Per core state: its return points.
    returns: Grow<OnceLock<Returns>>,
    /// Per state: how the text slice applies ([`Grammar::text_entry`]).
    text_loops: Grow<OnceLock<Option<TextEntry>>>,
    /// Per state: where plain-text characters lead ([`Grammar::text_step`]).
    text_steps: Grow<OnceLock<Option<TextStep>>>,
    /// Per state: the bytes that lead back to it ([`Grammar::through_loop`]).
    loop_sets: Grow<OnceLock<ByteSet>>,
    /// Per state whose [`LazyDfa::horizon`] is not 0: [`LazyDfa::widened`] by each subtree
    /// height below it, once asked ([`Grammar::shared_subtree`]).
    widened: Grow<OnceLock<Option<Box<[AtomicU32]>>>>,
    /// The allowed tokens below a trie node from a widened state ([`Grammar::shared_subtree`]):
    /// `(node, state)` to runs of the vocabulary trie's token positions.
    subtrees: RwLock<SubtreeCache>,
    /// Masks made by [`Grammar::split_by_length`].
    length_splits: AtomicUsize,
    /// Masks that took the text slice at a count ([`Grammar::counted_text`]).
    counted_texts: AtomicUsize,
    /// Whether mask walks use loop regions: in a grammar with recursion, where one loop is
    /// reached from many contexts. A regular grammar reaches each state once per compile, and
    /// recording a region's index on that first walk cost more than it saved (the e-mail regex's
    /// first masks at 49k, `make bench-grammar`).
    loop_regions: bool,
    /// Per byte group ([`BYTE_GROUP`]): the DFA's byte classes its bytes fall into (usually
    /// one), so a state's [`Run::first`] reads a few row entries instead of stepping 256 bytes.
    group_classes: Box<[Box<[u8]>]>,
    /// Arrays whose items must be unique beyond what the DFA enforces, checked by each matcher.
    unique: Option<Arc<UniquePlan>>,
    /// Per state: [`LazyDfa::lower_bound`], once asked ([`crate::budget::UNKNOWN_BOUND`] before).
    bounds: Grow<AtomicU32>,
    /// Per state: the first step of its completion in tokens ([`crate::budget`]), computed on
    /// first use; `None` where the search found none within [`Limits::max_completion_search`].
    completions: Grow<OnceLock<Option<crate::budget::Step>>>,
    /// Per state: its allowed tokens by the completion they leave ([`crate::fits`]), built on
    /// the second draw again there; `None` past [`Limits::max_fit_table_bytes`].
    pub(crate) fit_tables: Grow<OnceLock<Option<crate::fits::FitTable>>>,
    /// Bytes the fit tables take.
    pub(crate) fit_bytes: AtomicUsize,
    /// Per state: the draws again there before its fit table was built.
    pub(crate) fit_visits: Grow<AtomicU8>,
}

impl Grammar {
    /// Compiles `constraint` for `vocab`: the regex is parsed into a term and nothing more. DFA
    /// states, token masks and forced bytes are computed per state on first use (or all at once
    /// with [`Grammar::precompute`]).
    pub fn compile(
        constraint: &Constraint,
        vocab: Arc<Vocabulary>,
        limits: Limits,
    ) -> Result<Self, GrammarError> {
        let started = std::time::Instant::now();
        let unique = match constraint {
            Constraint::JsonSchema { schema, .. } => UniquePlan::new(schema).map(Arc::new),
            _ => None,
        };
        let out_of_time = || GrammarError::LimitExceeded {
            limit: "compile_time",
            value: limits.compile_time.as_millis() as usize,
        };
        let deadline = started + limits.compile_time;
        let prepared = match constraint {
            Constraint::JsonSchema { schema, options } => {
                let (root, rules) = crate::schema::schema_to_rules_by(
                    schema,
                    options,
                    &limits,
                    deadline,
                    crate::schema::Measure::Held,
                )
                .map_err(|e| match e {
                    crate::schema::SchemaError::OutOfTime { .. } => out_of_time(),
                    e => e.into(),
                })?;
                from_regex_rules(&root, rules)?
            }
            Constraint::JsonObject { whitespace } => {
                let (root, rules) = crate::schema::json_object_rules(*whitespace);
                from_regex_rules(&root, rules)?
            }
            Constraint::Gbnf(_) | Constraint::Lark(_) => {
                let rules = match constraint {
                    Constraint::Lark(text) => crate::lark::parse(text)?,
                    Constraint::Gbnf(text) => crate::gbnf::parse(text)?,
                    _ => unreachable!("matched above"),
                };
                within(rules.terms.len(), limits.max_terms, "max_terms")?;
                crate::cfg::prepare(rules)?
            }
            _ => {
                let pattern = constraint.pattern()?;
                within(pattern.len(), limits.max_regex_bytes, "max_regex_bytes")?;
                let mut terms = Terms::new();
                let root = crate::parse::parse(&mut terms, &pattern, false).map_err(|reason| {
                    GrammarError::InvalidRegex {
                        pattern: pattern.clone(),
                        reason,
                    }
                })?;
                Prepared {
                    terms,
                    root,
                    bodies: Vec::new(),
                }
            }
        };
        within(prepared.terms.len(), limits.max_terms, "max_terms")?;
        if started.elapsed() > limits.compile_time {
            return Err(out_of_time());
        }
        let Prepared {
            terms,
            root,
            bodies,
        } = prepared;
        let dfa = if bodies.is_empty() {
            LazyDfa::new(terms, root, limits.max_states, limits.max_terms)
        } else {
            LazyDfa::with_rules(terms, root, bodies, &limits)
        };
        Ok(Self {
            vocab,
            limits,
            runs: Grow::new(1, OnceLock::new),
            firsts: Grow::new(1, OnceLock::new),
            masks: Grow::new(1, OnceLock::new),
            forced: Grow::new(1, OnceLock::new),
            cores: Grow::new(1, OnceLock::new),
            returns: Grow::new(1, OnceLock::new),
            text_loops: Grow::new(1, OnceLock::new),
            text_steps: Grow::new(1, OnceLock::new),
            loop_sets: Grow::new(1, OnceLock::new),
            widened: Grow::new(1, OnceLock::new),
            subtrees: RwLock::new(SubtreeCache::default()),
            length_splits: AtomicUsize::new(0),
            counted_texts: AtomicUsize::new(0),
            loop_regions: dfa.is_context_free(),
            group_classes: Self::group_classes(&dfa),
            dfa,
            unique,
            bounds: Grow::new(1, || AtomicU32::new(crate::budget::UNKNOWN_BOUND)),
            completions: Grow::new(1, OnceLock::new),
            fit_tables: Grow::new(1, OnceLock::new),
            fit_bytes: AtomicUsize::new(0),
            fit_visits: Grow::new(1, || AtomicU8::new(0)),
        })
    }

    /// The `uniqueItems` checks matchers make while decoding ([`crate::schema::unique`]).
    pub(crate) fn unique_plan(&self) -> Option<&Arc<UniquePlan>> {
        self.unique.as_ref()
    }

    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// Subtree walks kept for the states of long counted repetitions to share (see
    /// [`Limits::max_shared_subtrees`]).
    pub fn shared_subtree_walks(&self) -> usize {
        self.subtrees
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .runs
            .len()
    }

    /// Masks made from a widened state's mask and a walk of the longer tokens only (a counted
    /// repetition's states far from their bound, see [`Limits::max_shared_subtrees`]).
    pub fn length_splits(&self) -> usize {
        self.length_splits.load(Ordering::Relaxed)
    }

    /// Masks that took the text slice at a count of a bounded run of characters (a JSON
    /// string's `maxLength`) with its tokens of too many characters left out, walking only the
    /// other tokens.
    pub fn counted_text_masks(&self) -> usize {
        self.counted_texts.load(Ordering::Relaxed)
    }

    /// DFA states built so far. The DFA grows as it is used; [`Grammar::explore`] builds all of it.
    pub fn state_count(&self) -> usize {
        self.dfa.state_count()
    }

    /// Regex terms built so far (parsing plus derivatives), bounded by [`Limits::max_terms`].
    pub fn term_count(&self) -> usize {
        self.dfa.term_count()
    }

    /// Heap bytes of the transition rows built so far.
    pub fn dfa_bytes(&self) -> usize {
        self.state_count() * self.dfa.nclasses * 4
    }

    /// The constraint accepts nothing at all (for example `allOf` of two different `const`s).
    pub fn is_empty_language(&self) -> bool {
        self.dfa.is_empty_language()
    }

    /// Whether the constraint needs the pushdown layer (recursion: a GBNF grammar with recursive
    /// rules, `json_object`, a schema with a recursive `$ref`). Its configurations are unbounded,
    /// so [`Grammar::explore`] and [`Grammar::precompute`] stop at [`Limits::max_states`].
    pub fn is_context_free(&self) -> bool {
        self.dfa.is_context_free()
    }

    /// Builds every state reachable from the start and returns how many there are, or
    /// `LimitExceeded` (`max_states` or `max_terms`) where the automaton is larger than the limits
    /// allow. Used for statistics and ahead-of-time warming; decoding never needs it.
    pub fn explore(&self) -> Result<usize, GrammarError> {
        let mut s = 0;
        while s < self.dfa.state_count() {
            for c in 0..self.dfa.nclasses {
                self.dfa.next(s as u32, c);
            }
            s += 1;
        }
        self.overflow_error().map_or(Ok(s), Err)
    }

    /// Where the DFA stopped growing because of [`Limits::max_states`] or [`Limits::max_terms`],
    /// the error naming the limit. From then on, steps into states that would have been new are
    /// dead: outputs stay inside the language (sound) but some valid continuations are refused.
    pub fn overflow_error(&self) -> Option<GrammarError> {
        self.dfa.overflow().map(|o| match o {
            Overflow::States => GrammarError::LimitExceeded {
                limit: "max_states",
                value: self.limits.max_states,
            },
            Overflow::Terms => GrammarError::LimitExceeded {
                limit: "max_terms",
                value: self.limits.max_terms,
            },
            Overflow::Stacks => GrammarError::LimitExceeded {
                limit: "max_parser_stacks",
                value: self.limits.max_parser_stacks,
            },
        })
    }

    pub(crate) fn start(&self) -> u32 {
        0
    }

    #[inline]
    pub(crate) fn step(&self, s: u32, b: u8) -> Option<u32> {
        let n = self.dfa.step(s, b);
        (n != DEAD).then_some(n)
    }

    pub(crate) fn is_accepting(&self, s: u32) -> bool {
        self.dfa.is_accepting(s)
    }

    /// No byte can follow state `s`.
    pub(crate) fn is_finished(&self, s: u32) -> bool {
        (0..self.dfa.nclasses).all(|c| self.dfa.next(s, c) == DEAD)
    }

    fn run(&self, s: u32) -> Run {
        *self.runs.at(s as usize).get_or_init(|| {
            let (groups, _) = self.first(s);
            if groups == 0 {
                return Run {
                    groups,
                    len: 0,
                    plain: 0,
                };
            }
            let cap = self.vocab.trie().max_depth.min(u16::MAX as usize);
            let (mut cur, mut len, mut plain) = (s, 0usize, 0usize);
            while len < cap {
                let (g, next) = self.first(cur);
                if groups & !g != 0 {
                    break;
                }
                let looping = next == cur;
                cur = next;
                len += 1;
                if plain + 1 == len && !self.is_accepting(cur) {
                    plain = len;
                }
                if looping {
                    // Every further step is this one again: the run reaches the cap.
                    if plain == len {
                        plain = cap;
                    }
                    len = cap;
                }
            }
            Run {
                groups,
                len: len as u16,
                plain: plain as u16,
            }
        })
    }

    /// Where every path below trie node `n` from `x`, the state at `n`, follows `x`'s run
    /// ([`Run`], what lets a mask walk add a whole subtree): the state each path below is in at
    /// depths 1, 2, … up to the node's height (one state per depth, whatever the bytes), else
    /// `None`.
    pub(crate) fn run_below(
        &self,
        x: u32,
        n: &crate::vocab::Node,
    ) -> Option<impl Iterator<Item = u32> + '_> {
        if n.below & !self.first(x).0 != 0 || !self.run(x).covers(n.below, n.height) {
            return None;
        }
        let states = std::iter::successors(Some(x), move |&c| Some(self.first(c).1));
        Some(states.skip(1).take(n.height as usize))
    }

    fn first(&self, s: u32) -> (u64, u32) {
        *self
            .firsts
            .at(s as usize)
            .get_or_init(|| Run::first(&self.group_classes, |c| self.dfa.next(s, c as usize)))
    }

    /// The byte classes of each byte group (see [`Grammar::group_classes`]'s field).
    fn group_classes(dfa: &LazyDfa) -> Box<[Box<[u8]>]> {
        let groups = BYTE_GROUP
            .iter()
            .map(|&g| g as usize + 1)
            .max()
            .unwrap_or(0);
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); groups];
        for b in 0..=255u8 {
            let (g, c) = (BYTE_GROUP[b as usize] as usize, dfa.classes[b as usize]);
            if !out[g].contains(&c) {
                out[g].push(c);
            }
        }
        out.into_iter().map(Vec::into_boxed_slice).collect()
    }

    /// The token mask of state `s`, computed once and cached.
    pub(crate) fn mask(&self, s: u32) -> &[u32] {
        self.masks
            .at(s as usize)
            .get_or_init(|| self.compute_mask(s))
    }

    /// Builds every state ([`Grammar::explore`]) and computes its mask, forced bytes and shortest
    /// completion (the token budget's, [`crate::budget`]) now, on `threads` threads (at least
    /// one), instead of on first use. Call it from a background thread on an `Arc<Grammar>` to
    /// warm a grammar while sequences already use it; results are identical either way. Returns
    /// the number of states computed (up to the limits).
    pub fn precompute(&self, threads: usize) -> usize {
        let _ = self.explore();
        let n = self.state_count();
        let threads = threads.clamp(1, n);
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    for s in (t..n).step_by(threads) {
                        self.mask(s as u32);
                        self.forced(s as u32);
                        let _ = self.completion(s as u32);
                    }
                });
            }
        });
        n
    }

    /// The DFA, for the budget's search ([`crate::budget`]).
    pub(crate) fn dfa(&self) -> &LazyDfa {
        &self.dfa
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// [`LazyDfa::lower_bound`] of state `s`, cached.
    pub(crate) fn lower_bound(&self, s: u32) -> u32 {
        let slot = self.bounds.at(s as usize);
        let v = slot.load(Ordering::Relaxed);
        if v != crate::budget::UNKNOWN_BOUND {
            return v;
        }
        let v = self.dfa.lower_bound(s);
        slot.store(v, Ordering::Relaxed);
        v
    }

    /// The first step of state `s`'s completion ([`crate::budget`]), computed once and
    /// cached; `None` where the search found none.
    #[inline]
    pub(crate) fn completion(&self, s: u32) -> Option<crate::budget::Step> {
        // A known completion is one load; the search stays out of line.
        match self.completion_cell(s).get() {
            Some(known) => *known,
            None => crate::budget::completion(self, s),
        }
    }

    /// The cache cell of state `s`'s completion step, for [`crate::budget`].
    #[inline]
    pub(crate) fn completion_cell(&self, s: u32) -> &OnceLock<Option<crate::budget::Step>> {
        self.completions.at(s as usize)
    }

    /// The length in tokens of the shortest record this constraint accepts, as quarry's budget
    /// counts it (`docs/budget.md`; end of generation not counted): a request whose
    /// `max_tokens` is below it cannot end complete. `None` where the language is empty or the
    /// search gave up ([`Limits::max_completion_search`]).
    pub fn shortest_record(&self) -> Option<usize> {
        self.completion(self.start()).map(|c| c.len as usize)
    }

    /// The tokens of [`Grammar::shortest_record`].
    pub fn shortest_record_tokens(&self) -> Option<Vec<u32>> {
        crate::budget::tokens(self, self.start())
    }

    /// The forced bytes of state `s`: each step has exactly one live byte and passes no accepting
    /// state. Computed once and cached; at most `Limits::max_forced_bytes` long.
    pub(crate) fn forced(&self, s: u32) -> &[u8] {
        self.forced.at(s as usize).get_or_init(|| {
            let mut out = Vec::new();
            let mut cur = s;
            while out.len() < self.limits.max_forced_bytes && !self.is_accepting(cur) {
                let mut only = None;
                for b in 0..=255u8 {
                    if let Some(n) = self.step(cur, b) {
                        if only.is_some() {
                            only = None;
                            break;
                        }
                        only = Some((b, n));
                    }
                }
                let Some((b, n)) = only else { break };
                out.push(b);
                cur = n;
            }
            out.into_boxed_slice()
        })
    }
}

/// For one state `t`: `groups`, the byte groups all of whose bytes lead to one and the same live
/// successor σ(t) (the successor that takes the most whole groups), and `len`, how many steps
/// t, σ(t), σ²(t), … keep at least those groups. Any byte string of at most `len` bytes drawn from
/// `groups` therefore stays in the language, which lets a mask walk add a whole trie subtree
/// without visiting it: a self-loop (`[a-z]*`, JSON string content) has `len` = the longest token,
/// and the k-th state of `[A-Za-z ]{1,40}` has `len` = 40 − k.
#[derive(Debug, Clone, Copy)]
struct Run {
    groups: u64,
    len: u16,
    /// How many of the first steps of the run reach no accepting state (return points, see
    /// [`Grammar::compute_mask`]).
    plain: u16,
}

impl Run {
    #[inline]
    fn covers(&self, below: u64, height: u16) -> bool {
        below & !self.groups == 0 && height <= self.len
    }

    /// The byte groups whose bytes all lead to one and the same live successor (the successor
    /// that takes the most whole groups), and that successor; `(0, DEAD)` when there is none.
    /// `group_classes` lists each group's byte classes, `step` steps the state by a class.
    fn first(group_classes: &[Box<[u8]>], step: impl Fn(u8) -> u32) -> (u64, u32) {
        // Successor of each group, or `mixed` when its bytes disagree.
        let mut group_next = [None::<u32>; 64];
        let mut mixed = 0u64;
        for (g, classes) in group_classes.iter().enumerate() {
            let Some((&c0, rest)) = classes.split_first() else {
                continue;
            };
            let next = step(c0);
            group_next[g] = Some(next);
            if rest.iter().any(|&c| step(c) != next) {
                mixed |= 1 << g;
            }
        }
        let mut best = (0u64, DEAD);
        for g in 0..64 {
            let Some(next) = group_next[g] else { continue };
            if next == DEAD || mixed >> g & 1 == 1 || best.0 >> g & 1 == 1 {
                continue;
            }
            let mut set = 0u64;
            for (h, &n2) in group_next.iter().enumerate() {
                if n2 == Some(next) && mixed >> h & 1 == 0 {
                    set |= 1 << h;
                }
            }
            if set.count_ones() > best.0.count_ones() {
                best = (set, next);
            }
        }
        best
    }
}
