//! Replays every input in `tests/fuzz-regressions/` (crashes found by `cargo fuzz` and a minimised
//! seed corpus) through the fuzz case, then a few hundred seeded random inputs, so each CI run is a
//! small fuzz run of its own.

mod common;

use std::path::PathBuf;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use common::fuzz_case::{run_case, small_vocab};

#[test]
fn checked_in_fuzz_inputs_still_pass() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let vocab = small_vocab();
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let result = std::panic::catch_unwind(|| run_case(&data, &vocab));
        assert!(result.is_ok(), "fuzz regression {} fails", path.display());
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}

#[test]
fn seeded_random_inputs_pass() {
    let vocab = small_vocab();
    let mut rng = SmallRng::seed_from_u64(20261122);
    for _ in 0..300 {
        let len = rng.random_range(1..200);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        run_case(&data, &vocab);
    }
}
