//! NCCL: the fallback for sizes where tpar's kernels do not win, and the path across hosts.
//! Run by `cuda::nccl` (loaded by tpar itself); the CPU backend has none. This file holds the
//! schedule the simulator replays for it.

use crate::error::Result;
use crate::sim::fabric::{Fabric, Op};
use crate::sim::schedule::{gpu, step, Flow, Step, Sync};
use crate::Transport;

/// NCCL's ring all-reduce as the simulator models it: 2(n-1) steps of one chunk to the next
/// rank, LL protocol (wire bytes inflated by the protocol's flag words).
pub(crate) fn schedule(s: f64, fabric: &Fabric) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    let wire = s / n as f64 * fabric.params().nccl_ll_wire_factor;
    let hops: Vec<Flow> = (0..n)
        .map(|i| {
            let j = (i + 1) % n;
            // NCCL takes P2P over NVLink always, over PCIe only within a socket unless
            // NCCL_P2P_LEVEL=SYS; otherwise the hop goes through host memory (SHM).
            let p2p = fabric.p2p_write(i, j)
                && (fabric.class(i, j).is_nvlink() || fabric.params().nccl_p2p_across_sockets || fabric.socket(i) == fabric.socket(j));
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
