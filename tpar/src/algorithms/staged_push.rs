//! Staged push: in step k, rank i writes its input to rank i+k, so every rank has one flow
//! out and one in per step — for PCIe fabrics whose all-to-all bandwidth collapses when every
//! GPU writes every peer at once (docs/references.md: 0.38-0.44 of isolated pairs at 8 GPUs).
//!
//! GPU-only: the kernel is `kernels/staged_push.cu`; the CPU backend refuses it. This file
//! holds its schedule for the simulator.

use crate::error::Result;
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step, unsupported};
use crate::kinds::Algorithm;
use crate::kinds::Transport;

/// The communication schedule the simulator replays: N-1 steps of one shifted push each.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_write() {
        return Err(unsupported(Algorithm::StagedPush, "it pushes peer to peer and this fabric has no P2P writes"));
    }
    let n = fabric.world();
    let steps = (1..n)
        .map(|k| {
            let flows = (0..n)
                .map(|i| Flow {
                    src: gpu(i),
                    dst: gpu((i + k) % n),
                    bytes: s,
                    op: Op::Write,
                })
                .collect();
            step("shifted push", flows, Sync::Poll)
        })
        .collect();
    Ok((Transport::P2p, steps))
}
