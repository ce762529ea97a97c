//! quarry-pipeline: the job runner around the engine.
//!
//! Rooms, in data-flow order:
//! - [`config`]: job definitions (`pipelines/*.toml`);
//! - [`record`]: documents, lineage, and the typed causes of rejects;
//! - [`dataset`] and [`kafka`]: the two sources and their job loops; [`shard`]: a dataset's shards
//!   and which of them are one worker's;
//! - [`extract`]: prompt template, the engine behind the [`extract::Extractor`] trait, and JSON Schema
//!   validation;
//! - [`flow`]: documents grouped into output files, and the effectively-once publish protocol;
//!   `lanes`: the threads that publish them beside a job's loop;
//! - [`columns`] and [`encode`]: the Arrow schema derived from the JSON Schema, and Parquet bytes;
//! - [`store`]: object-store locations, create-if-absent publishing with retries;
//! - [`metrics`] and [`shutdown`]: operations;
//! - [`inspect`]: what a published file holds (`quarry inspect`).
//!
//! The benchmark workload lives in `quarry-eval`.

pub mod columns;
pub mod config;
pub mod dataset;
pub mod encode;
pub mod error;
pub mod extract;
pub mod faults;
pub mod flow;
pub mod inspect;
pub mod job;
pub mod kafka;
mod lanes;
pub mod metrics;
pub mod record;
pub mod shard;
pub mod shutdown;
pub mod store;
#[cfg(test)]
mod testing;

pub use config::PipelineConfig;
pub use error::PipelineError;
