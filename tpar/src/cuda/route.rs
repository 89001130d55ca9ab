//! What one call shape resolves to, once ([`Resolved`]): the plan's decision and its
//! [`Route`] — tpar's kernel with its launch (variant, grid, threads, PDL) and the
//! descriptor it announces, the copy-engine path, NCCL on tpar's own communicator, or NCCL
//! on the caller's.
//! `GpuCommunicator::resolve` makes and memoises them; a call then only checks its pointers.
//!
//! Owns: the shape of a resolved call. Must never hold anything per call (pointers, counts).

use super::launch::Launch;
use crate::plan::Plan;
use crate::kinds::{Algorithm, Collective};
use std::sync::Arc;

/// Where a resolved call goes.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// tpar's kernel: its launch and the descriptor the call announces (`abi::desc_code`).
    Kernel { algorithm: Algorithm, launch: Launch, desc_code: u32 },
    /// tpar's copy-engine path (`ce-ring`, `cuda::ce`): copies and small kernels, no launch
    /// shape to resolve; the descriptor its flags announce.
    CopyEngine { desc_code: u32 },
    /// NCCL, on tpar's own communicator.
    Nccl,
    /// NCCL, on the caller's ([`NcclUse::Caller`]): tpar enqueues nothing.
    Caller,
}

/// One call shape, resolved once: the plan's decision and where it goes.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub plan: Arc<Plan>,
    pub route: Route,
    /// What the call computes.
    pub collective: Collective,
}

impl Resolved {
    /// The algorithm that runs (NCCL for both NCCL routes).
    pub fn algorithm(&self) -> Algorithm {
        match self.route {
            Route::Kernel { algorithm, .. } => algorithm,
            Route::CopyEngine { .. } => Algorithm::CeRing,
            Route::Nccl | Route::Caller => Algorithm::Nccl,
        }
    }
}

/// What [`GpuCommunicator::submit_on`](super::GpuCommunicator::submit_on) did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Enqueued on the caller's stream: tpar's kernel, or NCCL on tpar's own communicator.
    Ran(Algorithm),
    /// Routed to NCCL, which is the caller's to run: nothing was enqueued.
    ToCaller,
}
