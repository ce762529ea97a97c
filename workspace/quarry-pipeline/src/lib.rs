//! The job runner around the engine.
//!
//! Not built yet: this crate will hold the Kafka and object-store sources, JSON Schema validation of
//! outputs, the Arrow/Parquet sink (files named by offset range, published create-if-absent), offset
//! commits after publish, the rejects dataset and metrics.
