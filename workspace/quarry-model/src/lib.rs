//! The model runtime on candle: llama-family GGUF models with a batched ragged forward pass over a
//! KV page pool that the engine owns.
//!
//! # Key types
//! - [`Llama`]: weights loaded from GGUF (quantized types stay quantized) and
//!   [`Llama::forward`], which takes a ragged batch of [`SeqInput`]s (prefills, extends and
//!   decodes side by side) and fills [`Logits`].
//! - [`KvPool`]: fixed-size pages of keys and values for every layer. The engine allocates pages
//!   and builds block tables; the model only writes the rows of new tokens and reads the rows a
//!   block table names. Sequences that share a prefix share its pages.
//! - [`Sampler`]: greedy, temperature, top-k and top-p sampling on a seeded, reproducible stream.
//! - [`ModelInfo`] and [`LlamaConfig`]: what a GGUF file says about its model.
//! - [`parse_device`]: `cpu`, or `cuda:N` in a build with the `cuda` feature.
//!
//! # Where the time goes
//! The matmuls run on candle's quantized kernels over all new tokens of the batch at once, so a
//! weight is read once per step however many sequences are in it. Attention on CPU is a kernel of
//! this crate that reads pages in place ([`KvLayout::Host`]); on other devices it gathers each
//! sequence's rows with tensor ops ([`KvLayout::Tensor`]).

mod attention;
mod batch;
mod config;
mod device;
mod error;
mod info;
mod linear;
mod llama;
mod pool;
mod sampling;
mod simd;

pub use batch::{Logits, SeqInput};
pub use config::{LlamaConfig, SUPPORTED_ARCHITECTURES};
pub use device::parse_device;
pub use error::{ModelError, Result};
pub use info::ModelInfo;
pub use llama::Llama;
pub use pool::{KvLayout, KvPool, PageId};
pub use sampling::{argmax, Sampler, SamplingParams};
