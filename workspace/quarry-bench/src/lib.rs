//! Side-by-side benchmarks against named peers.
//!
//! Not built yet: this crate will hold the benchmarks that time quarry against llama.cpp,
//! outlines-core, llguidance and xgrammar in the same run, and write the medians and ratios recorded
//! in `BENCHMARKS.md`. It is never a dependency of the other crates.
