//! Compiling a constraint to a byte DFA, and the per-state token masks and forced bytes cached in it.

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use rustc_hash::FxHashMap;

use crate::cfg::{Prepared, Rules};
use crate::deriv::Terms;
use crate::dfa::{Grow, LazyDfa, Overflow, DEAD, UNKNOWN};
use crate::error::GrammarError;
use crate::limits::Limits;
use crate::loops::{ByteSet, Lookup, LoopIndex, LoopKey, Part, Trie};
use crate::schema::unique::UniquePlan;
use crate::schema::{schema_to_regex, Re, SchemaOptions, Whitespace};
use crate::vocab::{TokenTrie, Vocabulary, BYTE_GROUP};

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
            loop_sets: Grow::new(1, OnceLock::new),
            widened: Grow::new(1, OnceLock::new),
            subtrees: RwLock::new(SubtreeCache::default()),
            length_splits: AtomicUsize::new(0),
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

    /// A state's mask. For a pushdown configuration whose stacks reach below their tops (a
    /// context), most of the mask does not depend on that context (XGrammar's
    /// context-independent split): the tokens that never return past the tops are the mask of the
    /// *core* (the same tops over the bottom of the stack), cached once per core and shared by
    /// every context. Only tokens that pass a point where the core could end (a return point,
    /// found and cached with the core's mask) are walked again, from that point, in this
    /// context. A JSON string at any nesting depth thus costs one walk of the vocabulary in
    /// total, not one per depth.
    fn compute_mask(&self, s: u32) -> Box<[u32]> {
        let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
        let core = self
            .cores
            .at(s as usize)
            .get_or_init(|| self.dfa.core(s).unwrap_or(s));
        let returns = (*core != s).then(|| self.returns(*core));
        match returns {
            Some(r) if !r.root => {
                mask.copy_from_slice(self.mask(*core));
                for &e in self.vocab.eos() {
                    mask[e as usize / 32] &= !(1 << (e % 32));
                }
                let trie = if r.in_rest {
                    &self.vocab.text().rest
                } else {
                    self.vocab.trie()
                };
                for (node, path) in r.points.iter() {
                    let mut x = s;
                    for &b in path.iter() {
                        x = self.dfa.step(x, b);
                        if x == DEAD {
                            break;
                        }
                    }
                    if x != DEAD {
                        self.walk(&mut mask, x, trie, *node as usize, None);
                    }
                }
                for &t in r.tokens.iter() {
                    let bytes = self
                        .vocab
                        .token_bytes(t)
                        .expect("a token of the vocabulary");
                    let mut x = s;
                    for &b in bytes {
                        x = self.dfa.step(x, b);
                        if x == DEAD {
                            break;
                        }
                    }
                    if x != DEAD {
                        mask[t as usize / 32] |= 1 << (t % 32);
                    }
                }
            }
            _ => {
                if !self.split_by_length(&mut mask, s) {
                    self.walk_all(&mut mask, s, None);
                }
            }
        }
        if self.is_accepting(s) {
            for &e in self.vocab.eos() {
                mask[e as usize / 32] |= 1 << (e % 32);
            }
        }
        mask
    }

    /// The return points of core state `s` ([`Grammar::compute_mask`]), computed with its mask
    /// (which is cached too).
    fn returns(&self, s: u32) -> &Returns {
        self.returns.at(s as usize).get_or_init(|| {
            let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
            let mut points = Points::default();
            let in_rest = self.walk_all(&mut mask, s, Some(&mut points));
            if self.is_accepting(s) {
                for &e in self.vocab.eos() {
                    mask[e as usize / 32] |= 1 << (e % 32);
                }
            }
            let _ = self.masks.at(s as usize).get_or_init(|| mask);
            // A point below another is walked again with it (a context's walk from a point
            // covers its whole subtree): keep the outermost ones. Points come in trie order.
            let trie = if in_rest {
                &self.vocab.text().rest
            } else {
                self.vocab.trie()
            };
            let mut outer: Vec<NodePoint> = Vec::new();
            let mut end = 0u32;
            for (node, path) in points.nodes {
                if node >= end {
                    end = trie.nodes[node as usize].subtree_end;
                    outer.push((node, path));
                }
            }
            Returns {
                root: self.is_accepting(s),
                in_rest,
                points: outer.into(),
                tokens: points.tokens.into(),
            }
        })
    }

    /// Adds every token allowed from state `s` to `mask` (with `points`: and records the return
    /// points). Where plain-text characters lead back to `s` (inside a JSON string, say), the
    /// vocabulary's text slice is added at once: all of it, but the tokens holding one of the few
    /// printable bytes that do not loop, which are checked one by one; only the tokens outside
    /// the slice are walked. Returns whether it was (the points then index that smaller trie).
    fn walk_all(&self, mask: &mut [u32], s: u32, mut points: Option<&mut Points>) -> bool {
        // Collecting return points needs a slice that passes no accepting state.
        let slice = self
            .text_entry(s)
            .filter(|e| points.is_none() || e.quiet)
            .map(|e| e.except);
        let Some(except) = slice else {
            self.walk(mask, s, self.vocab.trie(), 0, points.map(|p| &mut p.nodes));
            return false;
        };
        let text = self.vocab.text();
        for (m, t) in mask.iter_mut().zip(text.mask.iter()) {
            *m |= t;
        }
        let excepted = || {
            (0u8..0x80)
                .filter(move |&b| except >> b & 1 == 1)
                .flat_map(|b| text.containing[b as usize].iter().copied())
        };
        for t in excepted() {
            mask[t as usize / 32] &= !(1 << (t % 32));
        }
        for t in excepted() {
            let mut x = s;
            let mut passes_end = false;
            for &b in self
                .vocab
                .token_bytes(t)
                .expect("a token of the vocabulary")
            {
                passes_end |= self.is_accepting(x);
                x = self.dfa.step(x, b);
                if x == DEAD {
                    break;
                }
            }
            if x != DEAD {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
            if let Some(p) = points.as_deref_mut() {
                if passes_end {
                    p.tokens.push(t);
                }
            }
        }
        self.walk(mask, s, &text.rest, 0, points.map(|p| &mut p.nodes));
        true
    }

    /// Whether the vocabulary's text slice ([`crate::vocab`]: tokens of plain-text characters,
    /// U+0020 and up but `"`, `\\` and DEL) can be added at once from `s`. That holds when
    /// plain-text characters lead from `s` to one state `L` that they keep (`L` = `s` inside a
    /// JSON string; `L` the inside of a field from a CSV field's start): every slice token is
    /// then allowed, except those with a printable ASCII byte that goes elsewhere (from `s` or
    /// from `L`), returned as a bit set. `quiet`: no state after the first character accepts, so
    /// slice tokens hold no return point. `None` when a non-ASCII character goes elsewhere or a
    /// partial one dies, or when the exceptions cover more than an eighth of the slice (a walk is
    /// cheaper then). Checked once per state over sets of states (UTF-8 sequences by lead byte):
    /// a few hundred cached steps.
    fn text_entry(&self, s: u32) -> Option<TextEntry> {
        *self.text_loops.at(s as usize).get_or_init(|| {
            let text = self.vocab.text();
            let printable = crate::vocab::plain_ascii;
            // L: where most printable bytes go.
            let mut counts: Vec<(u32, usize)> = Vec::new();
            for b in printable() {
                let t = self.dfa.step(s, b);
                match counts.iter_mut().find(|(x, _)| *x == t) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((t, 1)),
                }
            }
            let (l, _) = *counts.iter().max_by_key(|&&(x, n)| (n, x == s))?;
            if l == DEAD {
                return None;
            }
            let mut except = 0u128;
            for b in printable().filter(|&b| self.dfa.step(s, b) != l) {
                except |= 1 << b;
            }
            // L must be a loop: what leaves it is an exception too, and every non-ASCII
            // character must come back to it. (Checked here, not by asking L's own entry, so
            // that a chain of states such as `[a-z]{0,1000}` does not recurse.)
            for b in printable().filter(|&b| self.dfa.step(l, b) != l) {
                except |= 1 << b;
            }
            let excepted: usize = (0u8..0x80)
                .filter(|&b| except >> b & 1 == 1)
                .map(|b| text.containing[b as usize].len())
                .sum();
            if excepted > text.len / 8 {
                return None;
            }
            let mut quiet = !self.is_accepting(l) && self.utf8_leads_to(s, l)?;
            if l != s {
                quiet &= self.utf8_leads_to(l, l)?;
            }
            Some(TextEntry { except, quiet })
        })
    }

    /// Whether every non-ASCII character (each valid UTF-8 sequence, by lead byte) leads from
    /// `s` to `target` through states that do not die: `None` if not, else whether none of those
    /// states accepts.
    fn utf8_leads_to(&self, s: u32, target: u32) -> Option<bool> {
        const CONT: std::ops::RangeInclusive<u8> = 0x80..=0xBF;
        let sequences: [(
            std::ops::RangeInclusive<u8>,
            &[std::ops::RangeInclusive<u8>],
        ); 8] = [
            (0xC2..=0xDF, &[CONT]),
            (0xE0..=0xE0, &[0xA0..=0xBF, CONT]),
            (0xE1..=0xEC, &[CONT, CONT]),
            (0xED..=0xED, &[0x80..=0x9F, CONT]),
            (0xEE..=0xEF, &[CONT, CONT]),
            (0xF0..=0xF0, &[0x90..=0xBF, CONT, CONT]),
            (0xF1..=0xF3, &[CONT, CONT, CONT]),
            (0xF4..=0xF4, &[0x80..=0x8F, CONT, CONT]),
        ];
        let mut quiet = true;
        let leads = sequences.iter().all(|(lead, conts)| {
            let mut set: Vec<u32> = lead.clone().map(|b| self.dfa.step(s, b)).collect();
            for range in conts.iter() {
                set.sort_unstable();
                set.dedup();
                if set.contains(&DEAD) {
                    return false;
                }
                quiet &= !set.iter().any(|&x| self.is_accepting(x));
                set = set
                    .iter()
                    .flat_map(|&x| range.clone().map(move |b| (x, b)))
                    .map(|(x, b)| self.dfa.step(x, b))
                    .collect();
            }
            set.iter().all(|&x| x == target)
        });
        leads.then_some(quiet)
    }

    /// Adds to `mask` the tokens below trie node `start` (0: the root, so every token) allowed
    /// from state `s0` at that node. With `points`, also records every node with children where
    /// the state accepts (and its path), never skipping a subtree that holds one.
    fn walk(
        &self,
        mask: &mut [u32],
        s0: u32,
        trie: &TokenTrie,
        start: usize,
        points: Option<&mut Vec<NodePoint>>,
    ) {
        if trie.nodes.is_empty() {
            return;
        }
        let depth = trie.max_depth + 1;
        let mut at = Path {
            top: trie.nodes[start].depth as usize,
            short: 0,
            states: vec![s0; depth],
            bytes: vec![0u8; depth],
        };
        self.walk_below(mask, trie, start, &mut at, points);
    }

    /// [`Grammar::walk`] below node `start`, whose state is `at.states[depth of start]`, and
    /// whose path from the walk's first node is in `at.bytes`.
    fn walk_below(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        start: usize,
        at: &mut Path,
        mut points: Option<&mut Vec<NodePoint>>,
    ) {
        let nodes = &trie.nodes;
        let (dfa, classes) = (&self.dfa, &self.dfa.classes);
        let end = if start == 0 {
            nodes.len()
        } else {
            nodes[start].subtree_end as usize
        };
        let mut i = start + 1;
        while i < end {
            let n = &nodes[i];
            let d = n.depth as usize;
            if d + n.height as usize <= at.short {
                i = n.subtree_end as usize;
                continue;
            }
            let next = dfa.next(at.states[d - 1], classes[n.byte as usize] as usize);
            if next == DEAD {
                i = n.subtree_end as usize;
                continue;
            }
            if n.subtree_end as usize == i + 1 {
                // A leaf: its tokens are allowed, and `next` need not be built any further.
                set_tokens(mask, trie, n.tokens_start, n.tokens_end);
                i += 1;
                continue;
            }
            at.bytes[d - 1] = n.byte;
            if let Some(points) = points.as_deref_mut() {
                if self.is_accepting(next) {
                    points.push((i as u32, at.bytes[at.top..d].into()));
                }
            }
            // Whole subtrees are added (a run, a shared walk, a loop region) unless the short
            // tokens are known ([`Grammar::split_by_length`]): then setting a subtree's tokens
            // one by one costs more than the few steps along its longer tokens' paths.
            let whole = at.short == 0;
            // The run (a chain of states) only where its first step covers every byte below.
            let skip = whole && n.below & !self.first(next).0 == 0 && {
                let run = self.run(next);
                run.covers(n.below, n.height) && (points.is_none() || n.height <= run.plain)
            };
            set_tokens(mask, trie, n.tokens_start, n.tokens_end);
            if skip {
                // Every path below stays in the language: the whole subtree is allowed.
                set_tokens(mask, trie, n.tokens_end, n.subtree_tokens_end);
                i = n.subtree_end as usize;
            } else if whole
                && ((points.is_none() && self.shared_subtree(mask, trie, i, next))
                    || (self.loop_regions
                        && self.through_loop(mask, trie, i, next, at, points.as_deref_mut())))
            {
                // Added from a walk shared with other states, or through a loop region.
                i = n.subtree_end as usize;
            } else {
                at.states[d] = next;
                i += 1;
            }
        }
    }

    /// Adds the tokens below trie node `n` allowed from `x`, the state there, by the walk below
    /// `n` from [`LazyDfa::widened`]`(x, height of n)`, which every state that widens to the same
    /// state shares: a string's `maxLength` of 120 gives about 120 states, one per character
    /// read, and with the vocabulary's subtrees mostly a few bytes high, most of them widen to
    /// the state of a string without a bound there, so a subtree is walked once for all of
    /// them instead of once per state (a mask of such a state walked most of the trie: ~3 ms at
    /// 152k tokens). The walk's result is kept as runs of trie positions, for subtrees of the
    /// vocabulary's trie with at least [`MIN_SHARED_SUBTREE`] tokens, up to
    /// [`Limits::max_shared_subtrees`] of them. `false` (nothing done) where `x` does not widen
    /// at that height, the subtree is smaller, or the trie is another one.
    fn shared_subtree(&self, mask: &mut [u32], trie: &TokenTrie, n: usize, x: u32) -> bool {
        let node = &trie.nodes[n];
        if node.subtree_tokens_end - node.tokens_end < MIN_SHARED_SUBTREE
            || self.limits.max_shared_subtrees == 0
            || !std::ptr::eq(trie, self.vocab.trie())
        {
            return false;
        }
        let Some(w) = self.widened_at(x, node.height as usize) else {
            return false;
        };
        let key = (n as u32, w);
        let cached = self
            .subtrees
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .runs
            .get(&key)
            .cloned();
        let runs = match cached {
            Some(runs) => runs,
            None => {
                let mut below = vec![0u32; mask.len()];
                self.walk(&mut below, w, trie, n, None);
                let mut runs: Vec<(u32, u32)> = Vec::new();
                for p in node.tokens_end..node.subtree_tokens_end {
                    let t = trie.token_ids[p as usize];
                    if below[t as usize / 32] >> (t % 32) & 1 == 1 {
                        match runs.last_mut() {
                            Some(r) if r.1 == p => r.1 = p + 1,
                            _ => runs.push((p, p + 1)),
                        }
                    }
                }
                let runs: TokenRuns = runs.into();
                let mut cache = self
                    .subtrees
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if cache.held + runs.len() <= self.limits.max_shared_subtrees {
                    cache.held += runs.len();
                    cache.runs.insert(key, runs.clone());
                }
                runs
            }
        };
        for &(first, end) in runs.iter() {
            set_tokens(mask, trie, first, end);
        }
        true
    }

    /// The cache of [`Grammar::widened_at`] for state `x`: one cell per height below its
    /// [`LazyDfa::horizon`] (and up to the longest token), none where that is 0.
    fn widened_cells(&self, x: u32) -> &[AtomicU32] {
        self.widened
            .at(x as usize)
            .get_or_init(|| {
                let horizon = self.dfa.horizon(x) as usize;
                (horizon > 0).then(|| {
                    (0..horizon.min(self.vocab.trie().max_depth + 1))
                        .map(|_| AtomicU32::new(UNKNOWN))
                        .collect()
                })
            })
            .as_deref()
            .unwrap_or_default()
    }

    /// [`LazyDfa::widened`]`(x, height)`, cached per state and height; `None` where that is `x`
    /// itself (no bound of `x` shows past `height` bytes, or no other state widened to it yet).
    fn widened_at(&self, x: u32, height: usize) -> Option<u32> {
        let cell = self.widened_cells(x).get(height)?;
        let w = match cell.load(Ordering::Relaxed) {
            UNKNOWN => {
                let w = self.dfa.widened(x, height as u32);
                cell.store(w, Ordering::Relaxed);
                w
            }
            w => w,
        };
        (w != x).then_some(w)
    }

    /// The mask of a state with counted repetitions, split by token length: a token of at most
    /// `h` bytes is allowed from `s` exactly when it is from [`LazyDfa::widened`]`(s, h)` (no
    /// bound past `h` can show within it), so those tokens are that state's mask (computed once
    /// and shared by every state that widens to it: the counts of a string's `maxLength`, but
    /// the last few) masked by the vocabulary's tokens of at most `h` bytes, a few word
    /// operations; only the longer tokens are walked from `s` (at 152k tokens, 1,920 are longer
    /// than 16 bytes). `h` is the longest of the vocabulary's levels
    /// ([`Vocabulary::short_levels`]) at which `s` widens. `false` (nothing done) where it
    /// widens at none, where the text slice applies (cheaper), or with
    /// [`Limits::max_shared_subtrees`] 0.
    fn split_by_length(&self, mask: &mut [u32], s: u32) -> bool {
        if self.limits.max_shared_subtrees == 0 || self.text_entry(s).is_some() {
            return false;
        }
        let levels = self.vocab.short_levels();
        let Some((level, w)) = (0..levels.len())
            .rev()
            .find_map(|i| Some((i, self.widened_at(s, levels[i])?)))
        else {
            return false;
        };
        for ((m, &a), &b) in mask
            .iter_mut()
            .zip(self.mask(w).iter())
            .zip(self.vocab.short_mask(level).iter())
        {
            *m = a & b;
        }
        let trie = self.vocab.trie();
        let depth = trie.max_depth + 1;
        let mut at = Path {
            top: 0,
            short: levels[level],
            states: vec![s; depth],
            bytes: vec![0u8; depth],
        };
        self.walk_below(mask, trie, 0, &mut at, None);
        self.length_splits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Where `x`, the state at trie node `n`, loops on a set of bytes: adds the tokens below `n`
    /// through its loop region ([`crate::loops`]: from the vocabulary's index, or walking the
    /// region and recording the index on first use) and walks on from the exits `x` allows.
    /// `false` (nothing done) where `n` has too few nodes below it or `x` loops on too few bytes
    /// for that to pay ([`Limits::min_loop_region`], [`MIN_LOOP_BYTES`]), or the vocabulary holds
    /// its bound of indexes. Only for grammars with recursion (`loop_regions`). With `points`: an
    /// accepting `x` makes `n` the outermost return point of the region (recorded by the caller),
    /// so only exits are points to record (with the path to them).
    fn through_loop(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        n: usize,
        x: u32,
        at: &mut Path,
        mut points: Option<&mut Vec<NodePoint>>,
    ) -> bool {
        if (trie.nodes[n].subtree_end as usize - n) < self.limits.min_loop_region {
            return false;
        }
        let set = self.loop_set(x);
        if set.len() < MIN_LOOP_BYTES {
            return false;
        }
        if points.is_some() && self.is_accepting(x) {
            points = None;
        }
        let key = LoopKey {
            trie: if std::ptr::eq(trie, self.vocab.trie()) {
                Trie::All
            } else {
                Trie::Rest
            },
            set,
            anchor: n as u32,
        };
        let step = |b: u8| self.dfa.step(x, b);
        match self.vocab.loops().lookup(&key) {
            Lookup::Found(index) => {
                for &(first, end) in index.fills.iter() {
                    set_tokens(mask, trie, first, end);
                }
                for (b, exits) in index.exits() {
                    let y = step(b);
                    if y != DEAD {
                        for &(_, e) in exits {
                            self.exit(mask, trie, n, e, y, at, points.as_deref_mut());
                        }
                    }
                }
            }
            Lookup::Missing => {
                let index = LoopIndex::walk(trie, &set, n, |part| match part {
                    Part::Tokens(first, end) => set_tokens(mask, trie, first, end),
                    Part::Exit(e) => {
                        let y = step(trie.nodes[e as usize].byte);
                        if y != DEAD {
                            self.exit(mask, trie, n, e, y, at, points.as_deref_mut());
                        }
                    }
                });
                self.vocab.loops().insert(key, index);
            }
            Lookup::Full => return false,
        }
        true
    }

    /// The part of [`Grammar::through_loop`] at exit `e` of the loop region below `n`, whose
    /// state is `y`: its tokens, and the walk below it (with `points`, recording `e` where `y`
    /// accepts, with its path).
    #[allow(clippy::too_many_arguments)]
    fn exit(
        &self,
        mask: &mut [u32],
        trie: &TokenTrie,
        n: usize,
        e: u32,
        y: u32,
        at: &mut Path,
        points: Option<&mut Vec<NodePoint>>,
    ) {
        let en = &trie.nodes[e as usize];
        set_tokens(mask, trie, en.tokens_start, en.tokens_end);
        if en.subtree_end == e + 1 {
            return;
        }
        let de = en.depth as usize;
        let mut points = points;
        if let Some(points) = points.as_deref_mut() {
            // Points below need the path: the region's bytes from `n` down to `e`.
            let mut k = n;
            while k != e as usize {
                let mut c = k + 1;
                while trie.nodes[c].subtree_end <= e {
                    c = trie.nodes[c].subtree_end as usize;
                }
                at.bytes[trie.nodes[c].depth as usize - 1] = trie.nodes[c].byte;
                k = c;
            }
            if self.is_accepting(y) {
                points.push((e, at.bytes[at.top..de].into()));
            }
        }
        at.states[de] = y;
        self.walk_below(mask, trie, e as usize, at, points);
    }

    /// The bytes that lead state `s` back to itself, computed once.
    fn loop_set(&self, s: u32) -> ByteSet {
        *self.loop_sets.at(s as usize).get_or_init(|| {
            let loops: Vec<bool> = (0..self.dfa.nclasses)
                .map(|c| self.dfa.next(s, c) == s)
                .collect();
            let mut set = ByteSet::default();
            for b in 0..=255u8 {
                if loops[self.dfa.classes[b as usize] as usize] {
                    set.insert(b);
                }
            }
            set
        })
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

/// A state that loops on fewer bytes walks its region node by node: a few steps cost less than
/// a lookup of the region's index and its exits.
const MIN_LOOP_BYTES: u32 = 8;

/// A mask walk's position: per depth, the state after that many bytes, and the bytes of the
/// current path.
struct Path {
    /// Depth of the walk's first node (points record their path from it).
    top: usize,
    /// Tokens of at most this many bytes are known already ([`Grammar::split_by_length`]):
    /// subtrees of only such tokens are skipped. 0: none.
    short: usize,
    states: Vec<u32>,
    bytes: Vec<u8>,
}

/// The fewest tokens below a trie node for [`Grammar::shared_subtree`] to keep its walk: below
/// it the lookup and the kept runs cost more than walking. With 16, SmolLM2's masks of random
/// package records took 1.0–1.4× the time without sharing; with 64, 0.9–1.0×, and the same at
/// 128k and 152k tokens (the development machine, noisy).
const MIN_SHARED_SUBTREE: u32 = 64;

/// Runs `first..end` of a trie's token positions.
type TokenRuns = Arc<[(u32, u32)]>;

/// [`Grammar::shared_subtree`]'s walks, and the runs they hold in all.
#[derive(Debug, Default)]
struct SubtreeCache {
    /// `(trie node, widened state)` to its allowed tokens below the node.
    runs: FxHashMap<(u32, u32), TokenRuns>,
    held: usize,
}

/// Adds `trie.token_ids[first..end]` to `mask`.
#[inline]
fn set_tokens(mask: &mut [u32], trie: &TokenTrie, first: u32, end: u32) {
    for &t in &trie.token_ids[first as usize..end as usize] {
        mask[t as usize / 32] |= 1 << (t % 32);
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

/// Where a core state could end inside a token (see [`Grammar::compute_mask`]): at the start
/// (`root`), or after the bytes of each trie node listed (the node's index and its path).
#[derive(Debug)]
struct Returns {
    root: bool,
    /// The points index the text slice's `rest` trie (the walk used the slice).
    in_rest: bool,
    points: Box<[NodePoint]>,
    /// Tokens checked one by one ([`Grammar::walk_all`]) that pass an accepting state.
    tokens: Box<[u32]>,
}

/// How the text slice applies to a state ([`Grammar::text_entry`]).
#[derive(Debug, Clone, Copy)]
struct TextEntry {
    /// Printable ASCII bytes whose tokens are checked one by one.
    except: u128,
    /// No state inside a slice token accepts.
    quiet: bool,
}

/// A trie node where a state accepts, and the bytes of its path.
type NodePoint = (u32, Box<[u8]>);

/// Return points found by a walk: trie nodes with their paths, and single tokens.
#[derive(Debug, Default)]
struct Points {
    nodes: Vec<NodePoint>,
    tokens: Vec<u32>,
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
