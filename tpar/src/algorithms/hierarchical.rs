//! Hierarchical: reduce inside each island (GPUs sharing a switch or a socket), then exchange
//! the island sums across islands, so that only a fraction of the bytes crosses the socket
//! link.
//!
//! No kernel yet: the plan may choose it on multi-island fabrics and the GPU communicator
//! answers that choice with an error naming TPAR_ALGO. This file holds its schedule for the
//! simulator.

use crate::error::{Error, Result};
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step, unsupported};
use crate::{Algorithm, Transport};

/// The communication schedule the simulator replays: all-to-all inside each island, then
/// each rank receives every other island's sum from its counterpart there.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_write() {
        return Err(unsupported(Algorithm::Hierarchical, "it pushes peer to peer and this fabric has no P2P writes"));
    }
    let n = fabric.world();
    let islands: Vec<Vec<usize>> = islands
        .iter()
        .map(|i| i.iter().map(|&g| g as usize).filter(|&g| g < n).collect::<Vec<_>>())
        .filter(|v| !v.is_empty())
        .collect();
    if islands.iter().map(Vec::len).sum::<usize>() != n {
        return Err(Error::invalid("islands", format!("islands do not cover the {n} ranks")));
    }
    let write = |i: usize, j: usize| Flow {
        src: gpu(i),
        dst: gpu(j),
        bytes: s,
        op: Op::Write,
    };
    let mut inside = Vec::new();
    for isl in &islands {
        for &i in isl {
            for &j in isl {
                if i != j {
                    inside.push(write(i, j));
                }
            }
        }
    }
    // Every rank needs every other island's sum: the rank at position p of island b
    // receives it from position p (modulo the island's size) of each other island.
    let mut across = Vec::new();
    for (b, ib) in islands.iter().enumerate() {
        for (p, &j) in ib.iter().enumerate() {
            for (a, ia) in islands.iter().enumerate() {
                if a != b {
                    across.push(write(ia[p % ia.len()], j));
                }
            }
        }
    }
    let mut steps = vec![step("reduce inside island", inside, Sync::Poll)];
    if islands.len() > 1 {
        steps.push(step("exchange across islands", across, Sync::Poll));
    }
    Ok((Transport::P2p, steps))
}
