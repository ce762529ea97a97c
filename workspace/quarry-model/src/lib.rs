//! The model runtime on candle: llama-family models (Llama 3, Qwen2/3, Gemma 3) from GGUF files or
//! Hugging Face checkpoint folders, with a batched ragged forward pass over a KV page pool that
//! the engine owns.
//!
//! # Key types
//! - [`Llama`]: weights loaded from a GGUF file (quantized types stay quantized), a checkpoint
//!   folder ([`Checkpoint`]: safetensors and `config.json`) or random ones in a real model's shape
//!   ([`DummyShape`], for benchmarks), through one seam (`weights.rs`), and
//!   [`Llama::forward`], which takes a ragged batch of [`SeqInput`]s (prefills, extends and
//!   decodes side by side) and fills [`Logits`].
//! - [`KvPool`]: fixed-size pages of keys and values for every layer. The engine allocates pages
//!   and builds block tables; the model only writes the rows of new tokens and reads the rows a
//!   block table names. Sequences that share a prefix share its pages.
//! - [`Sampler`]: greedy, temperature, top-k and top-p sampling on a seeded, reproducible stream.
//! - [`ModelInfo`] and [`LlamaConfig`]: what a GGUF file or a checkpoint says about its model.
//! - [`parse_device`]: `cpu`, or `cuda:N` in a build with the `cuda` feature.
//! - [`ModelOptions`]: how the model runs (attention form, KV type, CUDA graphs, fusions,
//!   profiling), fixed at load ([`Llama::load_with`]); this crate reads no environment.
//!
//! # Where the time goes
//! On CPU the forward pass runs on plain slices (`llama/host.rs`): the Q4_1 and Q8_0 matmuls are
//! kernels of this crate over all new tokens of the batch at once, so a weight is read once per
//! step however many sequences are in it; attention reads the KV pages in place
//! ([`KvLayout::Host`]); norms, RoPE and SiLU are fused passes. Every step is shared out on
//! candle's barrier pool. On other devices the forward pass is candle tensor ops over f16 KV
//! pages ([`KvLayout::Tensor`]), with quarry's own CUDA kernels as candle ops for attention (one
//! paged launch per layer for the whole batch), the norms, RoPE and KV writes, the residual stream
//! and sampling, projections on dequantized f16 weights, and decode steps replayed as CUDA graphs
//! (docs/gpu.md, measured on H100s and H200s in BENCHMARKS.md).
//!
//! Where this crate sits among the others, and which state it owns (the weights and the device's
//! buffers and graphs; the KV pages belong to the engine): docs/architecture.md.

mod attention;
mod batch;
pub mod checkpoint;
mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
pub mod dummy;
mod error;
mod glu;
mod host_mem;
mod info;
pub mod kernel_plan;
mod linear;
mod llama;
mod op_args;
mod options;
mod pool;
pub mod profile;
pub mod step_graph;

mod paged;
mod ragged;
/// The kernels' reference arithmetic and test cases, for this crate's GPU tests and
/// quarry-cuda-emu: a test kit, behind the `test-support` feature.
#[cfg(any(test, feature = "test-support"))]
pub mod reference;
mod sampling;
mod simd;
mod weights;

pub use batch::{Logits, SeqInput};
pub use checkpoint::{Checkpoint, CHECKPOINT_TYPES};
pub use config::{
    Activation, LlamaConfig, RopeStyle, SlidingWindow, Yarn, SUPPORTED_ARCHITECTURES,
};
pub use device::parse_device;
pub use dummy::{DummyShape, DUMMY_SHAPES};
pub use error::{ModelError, Result};
pub use info::ModelInfo;
pub use kernel_plan::{AttentionKernel, KeyReads, Prefetch};
pub use linear::{Footprint, GpuWeights, HostFootprint, HostWeights};
pub use llama::{Fusions, Llama};
pub use options::{
    Attention, CpuWeights, KvDtype, ModelOptions, OptionError, SamplingSite, Switch,
};
pub use pool::{kv_dtype, KvLayout, KvPool, PageId, PoolCounts};
pub use ragged::RaggedBatch;
pub use sampling::{apply_mask, argmax, pick, SampleRows, Sampler, SamplingParams, NO_MASK};
