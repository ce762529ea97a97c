//! Constraints compiled to byte automata and per-state token masks.
//!
//! # Key types
//! - [`Vocabulary`]: token id → bytes, special and EOS ids. Plain data built by the caller.
//! - [`Constraint`]: a regex (full match), a choice list, a JSON Schema ([`schema`]), a GBNF
//!   grammar, or `json_object`. Grammars and recursive schemas go through a pushdown layer over the
//!   same DFA (`cfg`, `dfa`; `docs/grammars.md`).
//! - [`Grammar`]: the compiled constraint: a byte DFA grown lazily from regex derivatives, with
//!   per-state token masks and forced bytes computed on first use and cached. `Send + Sync`,
//!   shared by `Arc`.
//! - [`Matcher`]: one sequence's state plus its rollback history.
//!
//! # The loop
//! ```
//! use std::sync::Arc;
//! use quarry_grammar::{Constraint, Grammar, Limits, Matcher, Vocabulary};
//! let tokens: [&[u8]; 4] = [b"a", b"b", b"ab", b"</s>"];
//! let vocab = Arc::new(Vocabulary::new(tokens.iter().enumerate().map(|(i, t)| (*t, i == 3)), &[3]));
//! let grammar = Arc::new(Grammar::compile(&Constraint::Regex("(ab)+".into()), vocab.clone(), Limits::default())?);
//! let mut m = Matcher::new(grammar);
//! let mut mask = vec![0u32; vocab.mask_words()];
//! m.fill_mask(&mut mask);                 // allowed: "a", "ab"
//! assert_eq!(mask[0], 0b0101);
//! m.accept_token(2).unwrap();             // "ab"
//! m.fill_mask(&mut mask);                 // "a", "ab" or EOS
//! assert_eq!(mask[0], 0b1101);
//! m.accept_token(0).unwrap();             // "a": now "b" is forced
//! assert_eq!(m.forced_bytes(), b"b");
//! m.rollback(1);
//! assert!(m.is_accepting());
//! # Ok::<(), quarry_grammar::GrammarError>(())
//! ```
//!
//! # Semantics
//! - Soundness: a token is in the mask only if its bytes keep the DFA alive; completeness: every
//!   such token is. EOS is allowed exactly in accepting states; other special tokens never.
//!   For a JSON Schema's `uniqueItems` beyond a finite item domain (not a regular or context-free
//!   property), the matcher also leaves out tokens that would repeat an item
//!   ([`schema::unique`]); there, a prefix whose every completion repeats an item has an empty
//!   mask.
//! - Regexes use regex-syntax's syntax (Unicode on, so `.` and classes are whole UTF-8
//!   characters). Look-around and backreferences are rejected by the parser; anchors (`^ $ \A \z`)
//!   are accepted only at the start or end of the pattern (the whole output is matched anyway), and
//!   word boundaries and multi-line anchors are an [`GrammarError::InvalidRegex`] error.
//! - Tokens longer than 65,534 bytes are never allowed (no real vocabulary has one).
//!
//! # Cost
//! - Compile: the regex is parsed into hash-consed terms (`deriv`, `parse`) and nothing else is
//!   built. Each DFA state is a term; the successor of a state by a byte is the term's Brzozowski
//!   derivative, computed the first time any thread takes that step (`dfa`). Counted repetitions
//!   stay symbolic (`x{0,64}` is one term), so a big JSON Schema costs what its outputs visit, not
//!   the size of its full automaton. Every state other than the dead one can reach a match, so
//!   steps need no liveness check. [`Limits::max_states`] bounds the states built.
//! - A state's mask is computed on first use by walking the vocabulary's byte trie (built once per
//!   [`Vocabulary`]) from that state, skipping dead subtrees. Where the state has a *run* (a set of
//!   byte groups that keeps it in the language for `n` steps: a self-loop such as `[a-z]*`, or the
//!   k-th step of `[a-z]{1,40}`), whole subtrees whose bytes fit the run are added without being
//!   visited. Masks are then cached in the grammar and shared by every matcher.
//! - [`Grammar::precompute`] builds every state and fills its mask ahead of time, on N threads;
//!   [`Grammar::explore`] builds every state (for statistics, or to check the limits up front).
//! - `BENCHMARKS.md` has the numbers against outlines-core and llguidance.
//!
//! Status: regex and choice constraints; JSON Schema for the keywords listed in [`schema`], with
//! recursive `$ref`; GBNF grammars (llama.cpp's syntax, without left recursion) and `json_object`.

mod budget;
mod cfg;
mod deriv;
mod dfa;
mod ebnf;
mod error;
mod fits;
mod gbnf;
mod grammar;
mod lark;
mod limits;
mod loops;
mod matcher;
mod parse;
pub mod schema;
#[cfg(test)]
mod testing;
mod vocab;

pub use error::{GrammarError, RegexError, Rejection};
pub use grammar::{Constraint, ConstraintKey, Grammar};
pub use limits::Limits;
pub use matcher::{Matcher, Peek};
pub use schema::{SchemaError, SchemaOptions, UnknownWhitespace, Whitespace};
pub use vocab::Vocabulary;
