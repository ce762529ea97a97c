//! The extraction engine.
//!
//! Not built yet: this crate will hold requests, the continuous-batching scheduler, the radix-tree
//! prefix cache that owns the model's KV pages, the sampler and logit processors, constrained decoding
//! with `quarry-grammar` matchers, and jump-forward that reuses KV through the radix cache.
