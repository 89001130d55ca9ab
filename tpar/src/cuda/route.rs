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

/// What [`GpuCommunicator::call`](super::GpuCommunicator::call) did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Enqueued: tpar's kernel, or NCCL on tpar's own communicator.
    Ran(Algorithm),
    /// Routed to NCCL, which is the caller's to run: nothing was enqueued.
    ToCaller,
}

impl Served {
    /// The algorithm that ran; a call handed back to the caller's NCCL is an error here (for
    /// callers that run every call themselves: [`NcclCalls::Tpars`](super::NcclCalls::Tpars)
    /// never hands one back).
    pub fn ran(self) -> crate::error::Result<Algorithm> {
        match self {
            Served::Ran(a) => Ok(a),
            Served::ToCaller => Err(crate::error::Error::Unsupported { what: "a call handed back to the caller's NCCL".into(), reason: "this caller runs no NCCL of its own: call with NcclCalls::Tpars".into() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Call, NcclCalls};
    use super::*;
    use crate::kinds::{CaptureMode, Collective};
    use crate::dtype::DType;

    #[test]
    fn a_call_defaults_to_eager_on_the_own_stream_with_the_plans_pick_and_tpars_nccl() {
        let c = Call::all_reduce(DType::BF16, 8, 0x1000, 0x2000);
        assert_eq!((c.collective, c.mode, c.stream, c.algorithm, c.nccl), (Collective::AllReduce, CaptureMode::Eager, None, None, NcclCalls::Tpars));
        let g = Call::new(Collective::AllGather, DType::F16, 4, 1, 2).mode(CaptureMode::Graph).on_stream(7).forced(Some(Algorithm::OneshotPush)).nccl(NcclCalls::Callers);
        assert_eq!((g.collective, g.mode, g.stream, g.algorithm, g.nccl), (Collective::AllGather, CaptureMode::Graph, Some(7), Some(Algorithm::OneshotPush), NcclCalls::Callers));
        assert_eq!(g.forced(None).algorithm, None);
    }

    #[test]
    fn a_handed_back_call_is_an_error_to_callers_that_run_every_call() {
        assert_eq!(Served::Ran(Algorithm::Nccl).ran().unwrap(), Algorithm::Nccl);
        let e = Served::ToCaller.ran().unwrap_err().to_string();
        assert!(e.contains("handed back") && e.contains("NcclCalls::Tpars"), "{e}");
    }
}
