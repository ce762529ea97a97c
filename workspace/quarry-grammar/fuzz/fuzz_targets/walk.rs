//! regex + walk → every mask, forced-byte string, accept/rollback result checked against the
//! brute-force oracle. The case itself lives in `tests/common/fuzz_case.rs`, shared with the
//! regression test that replays `tests/fuzz-regressions/`.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use quarry_grammar::Vocabulary;

#[path = "../../tests/common/mod.rs"]
mod common;

static VOCAB: OnceLock<Arc<Vocabulary>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let vocab = VOCAB.get_or_init(common::fuzz_case::small_vocab);
    common::fuzz_case::run_case(data, vocab);
});
