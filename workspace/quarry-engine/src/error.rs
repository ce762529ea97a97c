//! Engine errors. A bad request is not one of them: it finishes with
//! [`crate::FinishReason::Error`] and the engine goes on.

use quarry_grammar::GrammarError;
use quarry_model::ModelError;
use quarry_tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The waiting queue is full; submit again after [`crate::Engine::step`] returned some
    /// completions.
    #[error("the engine's queue is full ({capacity} requests waiting); retry after a step")]
    QueueFull { capacity: usize },
    /// The engine settings are inconsistent.
    #[error("engine configuration: {0}")]
    Config(String),
    /// The model failed (a device error or a bug; never bad input, which is caught per request).
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Why one request cannot run. It is never an engine error: the request finishes at once with
/// [`crate::FinishReason::Error`] carrying this message, and the engine goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Sampling parameters out of range.
    #[error(transparent)]
    Sampling(ModelError),
    #[error("the thinking_budget processor needs a reasoning mode")]
    ThinkingBudgetWithoutReasoning,
    #[error("no_repeat_ngram needs n >= 1 and window >= n (got n = {n}, window = {window})")]
    NoRepeatNgram { n: usize, window: usize },
    #[error("disallow_tokens: id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutsideVocabulary { id: u32, vocab_size: usize },
    #[error("reasoning.end_marker is empty")]
    EmptyEndMarker,
    #[error("chat template: {0}")]
    ChatTemplate(TokenizerError),
    #[error("tokenizing the prompt: {0}")]
    Tokenize(TokenizerError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens; the model's context is {context}")]
    PromptOverContext { tokens: usize, context: usize },
    #[error("the prompt has {tokens} tokens; the KV pool holds {pool} (engine kv_tokens)")]
    PromptOverPool { tokens: usize, pool: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// The constraint does not compile, or admits no text at all.
    #[error("constraint: {0}")]
    Constraint(GrammarError),
    /// Even the constraint's shortest record does not fit in `max_tokens`
    /// ([`crate::EngineConfig::close_within_budget`]).
    #[error("max_tokens is {max_tokens}, but the constraint's shortest record takes {shortest} tokens: raise max_tokens to at least {shortest}")]
    BudgetTooSmall { shortest: usize, max_tokens: usize },
}

impl RequestError {
    /// How a request refused with this error finishes: [`crate::FinishReason::BudgetTooSmall`]
    /// for a budget too small, [`crate::FinishReason::Error`] with the message otherwise.
    pub fn finish(&self) -> crate::FinishReason {
        match self {
            RequestError::BudgetTooSmall {
                shortest,
                max_tokens,
            } => crate::FinishReason::BudgetTooSmall {
                shortest: *shortest,
                max_tokens: *max_tokens,
            },
            e => crate::FinishReason::Error(e.to_string()),
        }
    }
}
