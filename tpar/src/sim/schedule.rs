//! Communication schedules: what each algorithm sends, step by step.
//!
//! Owns: one function per algorithm, (world, bytes, fabric) -> [`Schedule`], each step a set
//! of flows {src, dst, bytes, write | read | via host} and the synchronisation that ends it.
//! Must never: time anything (that is `flows`) or know link rates (that is `fabric`).
//!
//! Each algorithm's schedule lives in its own file under `algorithms/` (DESIGN.md: one file
//! per algorithm holds its CPU execution and the schedule the simulator replays); this file
//! holds the types, the builders they share and the dispatch.

use super::fabric::{Endpoint, Fabric, Op};
use crate::error::{Error, Result};
use crate::{Algorithm, Transport};

/// What ends a step, besides its flows landing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// Readers poll their own memory until the data's sentinel/flag flips.
    Poll,
    /// Every rank stores a counter into every peer's slot and polls its own.
    Barrier,
    /// A GPU polls host memory for a flag (one PCIe read round trip).
    HostPoll,
    /// NCCL's per-step hand-off.
    NcclStep,
}

/// One flow of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flow {
    pub src: Endpoint,
    pub dst: Endpoint,
    pub bytes: f64,
    pub op: Op,
}

/// One step: its flows all start together; the step ends when the last lands and `sync`
/// has been paid.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub label: &'static str,
    pub flows: Vec<Flow>,
    pub sync: Sync,
}

/// An algorithm's whole schedule for one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub algorithm: Algorithm,
    pub transport: Transport,
    pub steps: Vec<Step>,
}

pub(crate) fn gpu(i: usize) -> Endpoint {
    Endpoint::Gpu(i)
}

/// All ordered pairs (i, j), i != j, as flows of `bytes`.
pub(crate) fn all_pairs(n: usize, bytes: f64, op: Op) -> Vec<Flow> {
    let mut v = Vec::with_capacity(n * n.saturating_sub(1));
    for i in 0..n {
        for j in 0..n {
            if i != j {
                v.push(Flow {
                    src: gpu(i),
                    dst: gpu(j),
                    bytes,
                    op,
                });
            }
        }
    }
    v
}

pub(crate) fn step(label: &'static str, flows: Vec<Flow>, sync: Sync) -> Step {
    Step { label, flows, sync }
}

pub(crate) fn unsupported(a: Algorithm, reason: &str) -> Error {
    Error::Unsupported {
        what: format!("{a} in the simulator"),
        reason: reason.into(),
    }
}

/// The schedule of `algorithm` for `bytes` on `fabric`'s ranks. Errors when the algorithm
/// cannot run on this fabric (e.g. a pull without P2P reads).
pub fn schedule(algorithm: Algorithm, bytes: usize, fabric: &Fabric, islands: &[Vec<u32>]) -> Result<Schedule> {
    use crate::algorithms as alg;
    let s = bytes as f64;
    // Each algorithm's schedule lives in its own file, beside its CPU execution.
    let (transport, steps) = match algorithm {
        Algorithm::OneshotPush => alg::oneshot_push::schedule(s, fabric)?,
        Algorithm::OneshotPull => alg::oneshot_pull::schedule(s, fabric)?,
        Algorithm::TwoshotPush => alg::twoshot_push::schedule(s, fabric)?,
        Algorithm::TwoshotPull => alg::twoshot_pull::schedule(s, fabric)?,
        Algorithm::GatherBcast => alg::gather_bcast::schedule(s, fabric)?,
        Algorithm::StagedPush => alg::staged_push::schedule(s, fabric)?,
        Algorithm::Hierarchical => alg::hierarchical::schedule(s, fabric, islands)?,
        Algorithm::Nccl => alg::nccl::schedule(s, fabric)?,
    };
    Ok(Schedule {
        algorithm,
        transport,
        steps,
    })
}

pub(crate) fn host_write(fabric: &Fabric, i: usize, bytes: f64) -> Flow {
    Flow {
        src: gpu(i),
        dst: Endpoint::Host(fabric.socket(i)),
        bytes,
        op: Op::Write,
    }
}

/// Every rank reads every peer's host-staged buffer.
pub(crate) fn host_reads(fabric: &Fabric, n: usize, bytes: f64) -> Vec<Flow> {
    let mut v = Vec::new();
    for i in 0..n {
        for j in 0..n {
            if i != j {
                v.push(Flow {
                    src: Endpoint::Host(fabric.socket(i)),
                    dst: gpu(j),
                    bytes,
                    op: Op::Read,
                });
            }
        }
    }
    v
}
