//! Compiling a constraint to a byte DFA, and the per-state token masks and forced bytes cached in it.

use std::sync::{Arc, OnceLock};

use crate::cfg::{Prepared, Rules};
use crate::deriv::Terms;
use crate::dfa::{Grow, LazyDfa, Overflow, DEAD};
use crate::error::GrammarError;
use crate::limits::Limits;
use crate::schema::{schema_to_regex, SchemaOptions, Whitespace};
use crate::vocab::{Vocabulary, BYTE_GROUP};

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
    /// The output is a JSON object whose values are any JSON value, nested to any depth, laid
    /// out like a schema's output (`json_object` in OpenAI's and vLLM's APIs).
    JsonObject { whitespace: Whitespace },
}

impl Constraint {
    /// The constraint as regex text: for a regex or choice list its regex, for a schema (and
    /// `json_object`) the regex of the root and of each rule recursion needs, as
    /// `(name, regex)` pairs where `(?P<quarry_rule_k>)` refers to the k-th pair (the root is
    /// 0). A GBNF grammar is its own text and has no regex form: `InvalidRule`.
    pub fn rules(&self) -> Result<Vec<(String, String)>, GrammarError> {
        let deadline = std::time::Instant::now() + Limits::default().compile_time;
        let (root, rules) = match self {
            Constraint::JsonSchema { schema, options } => {
                crate::schema::schema_to_rules_by(schema, options, deadline)?
            }
            Constraint::JsonObject { whitespace } => crate::schema::json_object_rules(*whitespace),
            Constraint::Gbnf(_) => {
                return Err(GrammarError::InvalidRule {
                    rule: "root".into(),
                    message: "a GBNF grammar has no regex form; its text is the constraint".into(),
                })
            }
            _ => (self.pattern()?, Vec::new()),
        };
        let mut out = vec![("root".to_owned(), root)];
        for (k, body) in rules.into_iter().enumerate() {
            out.push((format!("rule {}", k + 1), body));
        }
        Ok(out)
    }

    /// The regex this constraint compiles from (for a schema, the derived regex). A grammar
    /// (GBNF, `json_object`, a schema with recursion) has none: see [`Constraint::rules`].
    pub fn pattern(&self) -> Result<String, GrammarError> {
        match self {
            Constraint::JsonSchema { schema, options } => Ok(schema_to_regex(schema, options)?),
            Constraint::Gbnf(_) | Constraint::JsonObject { .. } => Err(GrammarError::InvalidRule {
                rule: "root".into(),
                message: "a grammar has no single regex; see Constraint::rules".into(),
            }),
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

fn check_length(pattern: &str, limits: &Limits) -> Result<(), GrammarError> {
    if pattern.len() > limits.max_regex_bytes {
        return Err(GrammarError::LimitExceeded {
            limit: "max_regex_bytes",
            value: limits.max_regex_bytes,
        });
    }
    Ok(())
}

fn check_terms(terms: &Terms, limits: &Limits) -> Result<(), GrammarError> {
    if terms.len() > limits.max_terms {
        return Err(GrammarError::LimitExceeded {
            limit: "max_terms",
            value: limits.max_terms,
        });
    }
    Ok(())
}

/// A schema's (or `json_object`'s) regex text for the root and its rules, parsed and prepared.
/// Schema regexes may contain byte classes from intersections (see `schema::automaton`), so they
/// are parsed in byte mode; user regexes must match UTF-8 only.
fn from_regex_rules(
    root: &str,
    rules: Vec<String>,
    limits: &Limits,
) -> Result<Prepared, GrammarError> {
    let total = root.len() + rules.iter().map(String::len).sum::<usize>();
    if total > limits.max_regex_bytes {
        return Err(GrammarError::LimitExceeded {
            limit: "max_regex_bytes",
            value: limits.max_regex_bytes,
        });
    }
    let mut terms = Terms::new();
    let n = rules.len() as u32 + 1;
    let parse = |terms: &mut Terms, text: &str| {
        crate::parse::parse_with_rules(terms, text, true, n).map_err(|message| {
            GrammarError::InvalidRegex {
                pattern: text.to_owned(),
                message,
            }
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
    for (k, text) in rules.iter().enumerate() {
        bodies.push(parse(&mut terms, text)?);
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
        let out_of_time = || GrammarError::LimitExceeded {
            limit: "compile_time",
            value: limits.compile_time.as_millis() as usize,
        };
        let deadline = started + limits.compile_time;
        let prepared = match constraint {
            Constraint::JsonSchema { schema, options } => {
                let (root, rules) = crate::schema::schema_to_rules_by(schema, options, deadline)
                    .map_err(|e| match e {
                        crate::schema::SchemaError::OutOfTime { .. } => out_of_time(),
                        e => e.into(),
                    })?;
                from_regex_rules(&root, rules, &limits)?
            }
            Constraint::JsonObject { whitespace } => {
                let (root, rules) = crate::schema::json_object_rules(*whitespace);
                from_regex_rules(&root, rules, &limits)?
            }
            Constraint::Gbnf(text) => {
                let rules = crate::gbnf::parse(text)?;
                check_terms(&rules.terms, &limits)?;
                crate::cfg::prepare(rules)?
            }
            _ => {
                let pattern = constraint.pattern()?;
                check_length(&pattern, &limits)?;
                let mut terms = Terms::new();
                let root = crate::parse::parse(&mut terms, &pattern, false).map_err(|message| {
                    GrammarError::InvalidRegex {
                        pattern: pattern.clone(),
                        message,
                    }
                })?;
                Prepared {
                    terms,
                    root,
                    bodies: Vec::new(),
                }
            }
        };
        check_terms(&prepared.terms, &limits)?;
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
            dfa,
            vocab,
            limits,
            runs: Grow::new(1, OnceLock::new),
            firsts: Grow::new(1, OnceLock::new),
            masks: Grow::new(1, OnceLock::new),
            forced: Grow::new(1, OnceLock::new),
        })
    }

    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
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
                return Run { groups, len: 0 };
            }
            let cap = self.vocab.trie().max_depth.min(u16::MAX as usize);
            let (mut cur, mut len) = (s, 0usize);
            while len < cap {
                let (g, next) = self.first(cur);
                if groups & !g != 0 {
                    break;
                }
                cur = next;
                len += 1;
            }
            Run {
                groups,
                len: len as u16,
            }
        })
    }

    fn first(&self, s: u32) -> (u64, u32) {
        *self
            .firsts
            .at(s as usize)
            .get_or_init(|| Run::first(|b| self.dfa.step(s, b)))
    }

    /// The token mask of state `s`, computed once and cached.
    pub(crate) fn mask(&self, s: u32) -> &[u32] {
        self.masks
            .at(s as usize)
            .get_or_init(|| self.compute_mask(s))
    }

    fn compute_mask(&self, s: u32) -> Box<[u32]> {
        let mut mask = vec![0u32; self.vocab.mask_words()].into_boxed_slice();
        let trie = self.vocab.trie();
        let nodes = &trie.nodes;
        let ids = &trie.token_ids;
        let (dfa, classes) = (&self.dfa, &self.dfa.classes);
        // states[d] is the state after the first d bytes of the current trie path.
        let mut states = vec![s; trie.max_depth + 1];
        let mut set = |range: std::ops::Range<u32>| {
            for &t in &ids[range.start as usize..range.end as usize] {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        };
        let mut i = 1;
        while i < nodes.len() {
            let n = &nodes[i];
            let d = n.depth as usize;
            let next = dfa.next(states[d - 1], classes[n.byte as usize] as usize);
            if next == DEAD {
                i = n.subtree_end as usize;
            } else if self.run(next).covers(n.below, n.height) {
                // Every path below stays in the language: the whole subtree is allowed.
                set(n.tokens_start..n.subtree_tokens_end);
                i = n.subtree_end as usize;
            } else {
                states[d] = next;
                set(n.tokens_start..n.tokens_end);
                i += 1;
            }
        }
        if self.is_accepting(s) {
            for &e in self.vocab.eos() {
                mask[e as usize / 32] |= 1 << (e % 32);
            }
        }
        mask
    }

    /// Builds every state ([`Grammar::explore`]) and computes its mask and forced bytes now, on
    /// `threads` threads (at least one), instead of on first use. Call it from a background thread
    /// on an `Arc<Grammar>` to warm a grammar while sequences already use it; results are identical
    /// either way. Returns the number of states computed (up to the limits).
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
                    }
                });
            }
        });
        n
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
}

impl Run {
    #[inline]
    fn covers(&self, below: u64, height: u16) -> bool {
        below & !self.groups == 0 && height <= self.len
    }

    /// The byte groups whose bytes all lead to one and the same live successor (the successor
    /// that takes the most whole groups), and that successor; `(0, DEAD)` when there is none.
    fn first(step: impl Fn(u8) -> u32) -> (u64, u32) {
        // Successor of each group, or `mixed` when its bytes disagree.
        let mut group_next = [None::<u32>; 64];
        let mut mixed = 0u64;
        for b in 0..=255u8 {
            let g = BYTE_GROUP[b as usize] as usize;
            if mixed >> g & 1 == 1 {
                continue;
            }
            let next = step(b);
            match group_next[g] {
                None => group_next[g] = Some(next),
                Some(prev) if prev != next => mixed |= 1 << g,
                Some(_) => {}
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
