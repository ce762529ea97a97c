//! The extraction engine: requests in, constrained completions out, as many at once as the model's
//! batch and KV pool allow.
//!
//! # Key types
//! - [`Request`]: a prompt (text or chat messages), a constraint ([`ConstraintSpec`]: regex,
//!   choice, JSON Schema, any JSON object), sampling parameters, `max_tokens`, stop strings, logit
//!   [`Processor`]s and an optional [`Reasoning`] mode. Plain serde data: nothing a job file says
//!   can run code on a worker.
//! - [`Engine`]: [`Engine::submit`] queues a request (a full queue is
//!   [`EngineError::QueueFull`], the backpressure signal); [`Engine::step`] runs one scheduler step
//!   and returns the [`Completion`]s that finished; [`Engine::run_batch`] runs an offline batch.
//! - [`RadixCache`]: the prefix cache over token ids that owns KV pages of the model's pool.
//! - [`Model`]: the seam to the model (a ragged forward over the engine's pool, the pool's shape,
//!   the context length, the vocabulary size). `quarry_model::Llama` implements it on CPU and
//!   CUDA; `tests/scheduler.rs` drives the scheduler with a fake that reads its context through the
//!   block tables, so admission, budgets, retraction, eviction and jump-forward are tested in
//!   milliseconds.
//!
//! # A step
//! 1. **Admit** waiting requests while fewer than `max_running` run. Each looks up its prompt in
//!    the radix cache, locks the matched path and takes pages for the rest. A request whose prefix
//!    another request is still prefilling waits one step, so the prefix is computed once.
//!    [`Engine::run_batch`] submits in depth-first order of the radix tree (prompts sorted by
//!    token ids).
//! 2. **Plan** the forward pass within `step_tokens`: every decode (one token, or a jump-forward
//!    extend) first, then prefill chunks. When the pool is full the cache evicts unlocked leaves
//!    (LRU); when that is not enough the newest sequence is retracted to the queue.
//! 3. **Forward** the ragged batch. Meanwhile a second thread fills the token masks of every
//!    constrained sequence that samples this step (rayon over sequences) into one reusable `u32`
//!    buffer: a mask depends only on the matcher state, which is known before the logits are.
//! 4. **Sample**: processors, then the mask (`-inf` for refused tokens; EOS only where the
//!    constraint accepts), then the request's sampler. The matcher takes the token; when the
//!    constraint then forces bytes, **jump-forward** appends them without sampling (see
//!    [`EngineConfig::retokenize`] and [`KeepBack`]): the boundary is re-encoded canonically, its
//!    last tokens are left for the model, the matcher rolled back and moved forward, and the next
//!    step extends the sequence in one pass that keeps every KV page before the change.
//! 5. **Release** finished sequences: their computed tokens go into the radix cache (pages the
//!    cache already had are freed) and their completions are returned.
//!
//! # Finish reasons
//! `stop` (end of generation or a stop string), `length` (`max_tokens`, the context, or the pool;
//! a constrained output cut short is never reported valid), `constraint_complete`,
//! `budget_closed` (complete, its end shaped by the token budget), `budget_too_small` (refused:
//! the shortest record does not fit `max_tokens`), and `error` with the cause (bad constraint,
//! prompt too long, nothing allowed).
//!
//! # Records that always close
//! With [`EngineConfig::close_within_budget`] (the default) a constrained sequence only takes a
//! token after which a completion of its constraint still fits in the tokens it has left
//! (a cached length looked up after the walk that accepts the token:
//! `quarry_grammar::Matcher::peek_token`): a drawn token that does not fit is drawn again from
//! the tokens that do. So a constrained output never ends cut at `max_tokens`; a request
//! whose shortest record is longer than `max_tokens` is refused before decoding
//! (`docs/budget.md`).

mod engine;
mod error;
pub mod logits;
mod model;
pub mod radix;
mod request;
mod sequence;
mod spec;
mod stats;

pub use engine::{Engine, EngineConfig, KeepBack, KV_PAGE_SIZE};
pub use error::{EngineError, RequestError};
pub use model::{Draws, Model};
pub use radix::{CacheStats, Inconsistency, RadixCache};
pub use request::{
    Completion, ConstraintSpec, FinishReason, Processor, Prompt, Reasoning, Request, RequestStats,
    DEFAULT_MAX_TOKENS,
};
pub use spec::{BatchSizes, LoadError, Loaded, ModelSpec, SizeError};
pub use stats::EngineStats;

use std::sync::Arc;

/// The grammar's view of a tokenizer's vocabulary: every token's exact bytes, control tokens
/// marked (a constraint never allows one), and the end-of-generation ids. The one adapter between
/// the tokenizer and the grammar crate: the engine, the CLI and the benchmarks all build it here.
pub fn grammar_vocabulary(tok: &quarry_tokenizer::Tokenizer) -> Arc<quarry_grammar::Vocabulary> {
    Arc::new(quarry_grammar::Vocabulary::new(
        tok.token_table()
            .iter()
            .map(|(_, bytes, kind)| (bytes, kind.is_special())),
        &tok.special_tokens().end_of_generation,
    ))
}
