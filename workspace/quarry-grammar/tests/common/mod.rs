//! Test support shared by the integration tests and the fuzz target.

pub mod fuzz_case;
pub mod oracle;
