//! NCCL: the fallback for sizes where tpar's kernels do not win, and the path across hosts.
//! Run by `cuda::nccl` (loaded by tpar itself); the CPU backend has none. This file holds the
//! schedules the simulator replays for it.

use crate::error::Result;
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step};
use crate::kinds::Transport;

/// NCCL's ring all-reduce as the simulator models it: 2(n-1) steps of one chunk to the next
/// rank, LL protocol (wire bytes inflated by the protocol's flag words).
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    ring(s / n as f64, 2 * n.saturating_sub(1), fabric)
}

/// NCCL's ring all-gather or reduce-scatter of `s` bytes per rank (the all-gather's input,
/// the reduce-scatter's output): n - 1 steps of `s` to the next rank.
pub(crate) fn gather_scatter_schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    ring(s, fabric.world().saturating_sub(1), fabric)
}

/// `steps` ring steps of `chunk` bytes each to the next rank, LL protocol (wire bytes
/// inflated by the protocol's flag words).
fn ring(chunk: f64, steps: usize, fabric: &dyn FabricView) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    let wire = chunk * fabric.nccl_wire_factor();
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
    let steps = (0..steps).map(|_| step("ring step", hops.clone(), Sync::NcclStep)).collect();
    Ok((Transport::Nccl, steps))
}
