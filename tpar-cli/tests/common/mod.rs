//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)]

// One helper for both test crates: the library's file, not a copy of it.
#[path = "../../../tpar/tests/common/skip.rs"]
mod skip;
#[allow(unused_imports)]
pub use skip::skip;
