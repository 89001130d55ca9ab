//! # tpar — an all-reduce for tensor-parallel inference on one host
//!
//! Every call runs the fastest algorithm that is correct on this machine's fabric, and
//! either reduces correctly or returns an [`Error`] that says why. A tour of the crate:
//!
//! | module | owns |
//! |---|---|
//! | [`doctor`] | `tpar doctor`: what tpar sees on this box and would do inside an engine (text and JSON) |
//! | [`comm`] | the public [`CpuCommunicator`]: join, all-reduce, poisoning |
//! | [`config`] | [`Config`]: how a rank joins its job |
//! | [`settings`] | every `TPAR_*` environment variable, declared and parsed once |
//! | [`topology`] | what the fabric is: GPUs, per-pair links and P2P, switches, islands; NVML discovery, presets, JSON |
//! | [`plan`] | the pure, total dispatch decision; `TPAR_*` overrides; the plan-input digest ranks compare |
//! | [`profile`] | tuned profiles (TOML): measured crossovers and their fingerprint |
//! | [`transport`] | where bytes travel: POSIX shared memory for CPU ranks, liveness locks |
//! | [`control`] | the control plane: rendezvous, host-side gather / broadcast / barrier, peer liveness |
//! | [`rendezvous`] | the validated Unix-socket handshake and the control plane's messages over its sockets |
//! | [`workspace`] | the shared workspace layout, defined once |
//! | [`protocol`] | sentinel and barrier protocols over 64-bit words; descriptors; bounded waits |
//! | [`algorithms`] | one file per algorithm (CPU body, schedule); the registry of what runs where |
//! | [`kinds`] | the names every layer shares: [`Algorithm`], [`Transport`], [`Backend`], [`CaptureMode`] |
//! | [`dtype`] | element types, packing into 64-bit words, the empty sentinel |
//! | [`units`] | the size grammar (`42K`, `1.5MiB`), the byte formatter, the stable hash, percentiles |
//! | [`report`] | benchmark records (`--json`) and bandwidth arithmetic |
//! | [`sim`] | flow-level fabric simulator: links, switches, max-min sharing, per-algorithm schedules |
//! | [`model`] | decode / speculative-decode throughput from all-reduce latency |
//! | [`plot`] | latency-versus-size SVG charts of bench or sim records |
//! | [`testing`] | reproducible inputs, exact and f64 references, poisoning, digests |
//! | [`tune`] | the first-use tune: budget, screen, timings, rank 0's decision, the tune cache |
//! | [`error`] | the one error enum |
//! | `cuda` | (feature `cuda`) NVRTC-compiled kernels, emulated ranks on one GPU, host transport, NCCL |
//!
//! See docs/architecture.md for the layers, the registry and the life of one call.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod algorithms;

pub mod comm;
pub mod config;
pub mod control;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod doctor;
pub mod dtype;
pub mod error;
pub mod kinds;
pub mod model;
#[cfg(feature = "plot")]
pub mod plot;
pub mod plan;
pub use plan::profile;
pub mod protocol;
pub mod rendezvous;
pub mod report;
pub mod settings;
pub mod sim;
pub mod testing;
pub mod topology;
pub mod transport;
pub mod tune;
pub mod units;
pub mod workspace;

pub use algorithms::{Algorithm, Transport};
pub use kinds::Collective;
pub use comm::CpuCommunicator;
pub use config::Config;
pub use settings::Settings;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use plan::{plan, Backend, CaptureMode, Overrides, Plan, PlanInput};
pub use profile::Profile;
pub use topology::Topology;
pub use half::{bf16, f16};
