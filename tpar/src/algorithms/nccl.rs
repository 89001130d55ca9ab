//! NCCL: the fallback for sizes where tpar's kernels do not win, and the path across hosts.
//! Run by `cuda::nccl` (loaded by tpar itself); the CPU backend has none. This file holds the
//! schedule the simulator replays for it.

use crate::error::Result;
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step};
use crate::kinds::Transport;

/// NCCL's ring all-reduce as the simulator models it: 2(n-1) steps of one chunk to the next
/// rank, LL protocol (wire bytes inflated by the protocol's flag words).
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    let wire = s / n as f64 * fabric.nccl_wire_factor();
    let hops: Vec<Flow> = (0..n)
        .map(|i| {
            let j = (i + 1) % n;
            let p2p = fabric.nccl_direct(i, j);
            Flow {
                src: gpu(i),
                dst: gpu(j),
                bytes: wire,
                op: if p2p { Op::Write } else { Op::ViaHost },
            }
        })
        .collect();
    let steps = (0..2 * n.saturating_sub(1)).map(|_| step("ring step", hops.clone(), Sync::NcclStep)).collect();
    Ok((Transport::Nccl, steps))
}
