//! # tpar — an all-reduce for tensor-parallel inference on one host
//!
//! Every call runs the fastest algorithm that is correct on this machine's fabric, and
//! either reduces correctly or returns an [`Error`] that says why. A tour of the crate:
//!
//! | module | owns |
//! |---|---|
//! | [`dtype`] | element types, packing into 64-bit words, the -0.0 sentinel |
//! | [`algorithms`] | one file per algorithm; [`Algorithm`] and [`Transport`] names |
//! | [`error`] | the one error enum |
//!
//! See `docs/` and the repository's DESIGN notes for the architecture.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod algorithms;
pub mod comm;
pub mod dtype;
pub mod error;
pub mod protocol;
pub mod workspace;
pub mod rendezvous;
pub mod report;
pub mod testing;
pub mod transport;

pub use algorithms::{Algorithm, Transport};
pub use comm::{Communicator, Config};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half::{bf16, f16};
