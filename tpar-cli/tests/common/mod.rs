//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)]

mod skip;
#[allow(unused_imports)]
pub use skip::skip;
