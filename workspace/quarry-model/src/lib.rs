//! The model runtime on candle.
//!
//! # Key types
//! - [`ModelInfo`]: what a GGUF file says about its model (architecture, sizes, tensor dtypes), read
//!   from the header alone.
//!
//! Still to come (the model-runtime issue): loading llama-family GGUF weights, a batched ragged
//! forward over a KV page pool that the engine owns, CPU by default and CUDA behind the `cuda`
//! feature, and sampling primitives.

mod error;
mod info;

pub use error::{ModelError, Result};
pub use info::ModelInfo;
