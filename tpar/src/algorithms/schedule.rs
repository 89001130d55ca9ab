//! The schedule vocabulary: what an algorithm sends, step by step, in words the simulator
//! replays. Owned by the algorithms' side; the simulator implements [`FabricView`] and
//! times the steps, so the simulator imports the algorithms and never the other way round.
//!
//! Owns: endpoints, operations, flows, steps, their synchronisation, the builders every
//! algorithm's `schedule` shares, and the read-only view of a fabric those functions need.
//! Must never: time anything or know link rates (that is `sim`).

use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Transport};

/// Where bytes start or land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A GPU, by rank (= CUDA ordinal).
    Gpu(usize),
    /// Pinned host memory on a socket.
    Host(usize),
}

/// How bytes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Posted write issued by `src`.
    Write,
    /// Non-posted read issued by `dst` (data flows src -> dst).
    Read,
    /// NCCL's SHM path: `src` copies into host memory, `dst` copies out (P2P off).
    ViaHost,
    /// A copy engine of `src` copies into `dst` (`cuMemcpyAsync`): no SM, so no kernel
    /// injection limit; the probe's copy-engine rates where measured.
    Copy,
}

/// What a schedule needs to know of the fabric its ranks sit on (the simulator's fabric
/// implements it).
pub trait FabricView {
    /// Ranks.
    fn world(&self) -> usize;
    /// Socket of rank `a`.
    fn socket(&self, a: usize) -> usize;
    /// Whether P2P writes from `a` to `b` are allowed.
    fn p2p_write(&self, a: usize, b: usize) -> bool;
    /// Every ordered pair of distinct ranks allows P2P writes.
    fn all_p2p_write(&self) -> bool;
    /// Every ordered pair of distinct ranks allows P2P reads.
    fn all_p2p_read(&self) -> bool;
    /// Whether NCCL moves data from `a` to `b` peer-to-peer (else through host memory).
    fn nccl_direct(&self, a: usize, b: usize) -> bool;
    /// Wire bytes per payload byte of NCCL's LL protocol.
    fn nccl_wire_factor(&self) -> f64;
}

/// The signature of every algorithm's schedule: (bytes per rank, fabric, islands).
pub type ScheduleFn = fn(f64, &dyn FabricView, &[Vec<u32>]) -> Result<(Transport, Vec<Step>)>;

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
    /// The next copy of a copy engine's queue starts (copies back to back, no flag between).
    CopyStep,
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

pub(crate) fn host_write(fabric: &dyn FabricView, i: usize, bytes: f64) -> Flow {
    Flow {
        src: gpu(i),
        dst: Endpoint::Host(fabric.socket(i)),
        bytes,
        op: Op::Write,
    }
}

/// Every rank reads every peer's host-staged buffer.
pub(crate) fn host_reads(fabric: &dyn FabricView, n: usize, bytes: f64) -> Vec<Flow> {
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
