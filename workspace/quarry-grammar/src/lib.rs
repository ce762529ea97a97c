//! Constraints compiled to byte automata and per-state token masks.
//!
//! Not built yet: this crate will hold regex, choice, JSON Schema and grammar constraints compiled to a
//! byte-level DFA, the per-state `u32` token bitmasks, the per-sequence matcher (accept, fill mask,
//! rollback, fork) and jump-forward strings. It stays pure CPU and depends on none of our crates: the
//! vocabulary it works over is plain data (token id → bytes, special ids) that callers build from
//! `quarry-tokenizer` (see `quarry_tokenizer::Tokenizer::token_bytes`).
