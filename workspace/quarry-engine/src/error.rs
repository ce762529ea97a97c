//! Engine errors. A bad request is not one of them: it finishes with
//! [`crate::FinishReason::Error`] and the engine goes on.

use quarry_model::ModelError;

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
