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
//! | `cuda` | (feature `cuda`) NVRTC-compiled kernels, emulated ranks on one GPU, host transport, NCCL |
//!
//! See `docs/` and the repository's DESIGN notes for the architecture.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod algorithms;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod report;

pub use algorithms::{Algorithm, Transport};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half::{bf16, f16};
