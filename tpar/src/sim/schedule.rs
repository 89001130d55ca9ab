//! Communication schedules: what each algorithm sends, step by step.
//!
//! Owns: one function per algorithm, (world, bytes, fabric) -> [`Schedule`], each step a set
//! of flows {src, dst, bytes, write | read | via host} and the synchronisation that ends it.
//! Must never: time anything (that is `flows`) or know link rates (that is `fabric`).
//!
//! DESIGN.md wants each algorithm's schedule in that algorithm's own file; they live here
//! for now because the algorithm files are being written on another branch and the
//! schedules are pure data. Moving them is mechanical: each `fn` below takes only its inputs.

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

fn gpu(i: usize) -> Endpoint {
    Endpoint::Gpu(i)
}

/// All ordered pairs (i, j), i != j, as flows of `bytes`.
fn all_pairs(n: usize, bytes: f64, op: Op) -> Vec<Flow> {
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

fn step(label: &'static str, flows: Vec<Flow>, sync: Sync) -> Step {
    Step { label, flows, sync }
}

fn unsupported(a: Algorithm, reason: &str) -> Error {
    Error::Unsupported {
        what: format!("{a} in the simulator"),
        reason: reason.into(),
    }
}

/// The schedule of `algorithm` for `bytes` on `fabric`'s ranks. Errors when the algorithm
/// cannot run on this fabric (e.g. a pull without P2P reads).
pub fn schedule(algorithm: Algorithm, bytes: usize, fabric: &Fabric, islands: &[Vec<u32>]) -> Result<Schedule> {
    let n = fabric.world();
    let s = bytes as f64;
    let chunk = s / n as f64;
    let p2p_w = fabric.all_p2p_write();
    let p2p_r = fabric.all_p2p_read();
    let mk = |transport, steps| {
        Ok(Schedule {
            algorithm,
            transport,
            steps,
        })
    };
    match algorithm {
        Algorithm::OneshotPush if p2p_w => mk(Transport::P2p, vec![step("push to all", all_pairs(n, s, Op::Write), Sync::Poll)]),
        Algorithm::OneshotPush => mk(
            Transport::Host,
            vec![
                step("stage in host", (0..n).map(|i| host_write(fabric, i, s)).collect(), Sync::HostPoll),
                step("read peers from host", host_reads(fabric, n, s), Sync::Poll),
            ],
        ),
        Algorithm::TwoshotPush if p2p_w => mk(
            Transport::P2p,
            vec![
                step("reduce-scatter", all_pairs(n, chunk, Op::Write), Sync::Poll),
                step("all-gather", all_pairs(n, chunk, Op::Write), Sync::Poll),
            ],
        ),
        Algorithm::TwoshotPush => mk(
            Transport::Host,
            vec![
                step("stage in host", (0..n).map(|i| host_write(fabric, i, s)).collect(), Sync::HostPoll),
                step("read my chunk from peers", host_reads(fabric, n, chunk), Sync::Poll),
                step(
                    "stage reduced chunk",
                    (0..n).map(|i| host_write(fabric, i, chunk)).collect(),
                    Sync::HostPoll,
                ),
                step("read chunks from host", host_reads(fabric, n, chunk), Sync::Poll),
            ],
        ),
        Algorithm::OneshotPull | Algorithm::TwoshotPull | Algorithm::GatherBcast if !p2p_r => {
            Err(unsupported(algorithm, "it reads peer memory and this fabric has no P2P reads"))
        }
        Algorithm::OneshotPull => mk(
            Transport::P2p,
            vec![
                step("barrier", Vec::new(), Sync::Barrier),
                step("read all peers", all_pairs(n, s, Op::Read), Sync::Poll),
                step("barrier", Vec::new(), Sync::Barrier),
            ],
        ),
        Algorithm::TwoshotPull => mk(
            Transport::P2p,
            vec![
                step("barrier", Vec::new(), Sync::Barrier),
                step("read my chunk", all_pairs(n, chunk, Op::Read), Sync::Poll),
                step("barrier", Vec::new(), Sync::Barrier),
                step("read reduced chunks", all_pairs(n, chunk, Op::Read), Sync::Poll),
                step("barrier", Vec::new(), Sync::Barrier),
            ],
        ),
        Algorithm::GatherBcast => {
            let gather = (1..n)
                .map(|i| Flow {
                    src: gpu(i),
                    dst: gpu(0),
                    bytes: s,
                    op: Op::Read,
                })
                .collect();
            let bcast = (1..n)
                .map(|i| Flow {
                    src: gpu(0),
                    dst: gpu(i),
                    bytes: s,
                    op: Op::Read,
                })
                .collect();
            mk(
                Transport::P2p,
                vec![
                    step("barrier", Vec::new(), Sync::Barrier),
                    step("rank 0 reads all", gather, Sync::Poll),
                    step("barrier", Vec::new(), Sync::Barrier),
                    step("all read rank 0", bcast, Sync::Poll),
                    step("barrier", Vec::new(), Sync::Barrier),
                ],
            )
        }
        Algorithm::StagedPush | Algorithm::Hierarchical if !p2p_w => {
            Err(unsupported(algorithm, "it pushes peer to peer and this fabric has no P2P writes"))
        }
        Algorithm::StagedPush => {
            // Step k: rank i writes to rank i+k: one flow out and one in per rank.
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
            mk(Transport::P2p, steps)
        }
        Algorithm::Hierarchical => {
            let islands: Vec<Vec<usize>> = islands
                .iter()
                .map(|i| i.iter().map(|&g| g as usize).filter(|&g| g < n).collect::<Vec<_>>())
                .filter(|v| !v.is_empty())
                .collect();
            if islands.iter().map(Vec::len).sum::<usize>() != n {
                return Err(Error::invalid("islands", format!("islands do not cover the {n} ranks")));
            }
            let mut inside = Vec::new();
            for isl in &islands {
                for &i in isl {
                    for &j in isl {
                        if i != j {
                            inside.push(Flow {
                                src: gpu(i),
                                dst: gpu(j),
                                bytes: s,
                                op: Op::Write,
                            });
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
                            let i = ia[p % ia.len()];
                            across.push(Flow {
                                src: gpu(i),
                                dst: gpu(j),
                                bytes: s,
                                op: Op::Write,
                            });
                        }
                    }
                }
            }
            let mut steps = vec![step("reduce inside island", inside, Sync::Poll)];
            if islands.len() > 1 {
                steps.push(step("exchange across islands", across, Sync::Poll));
            }
            mk(Transport::P2p, steps)
        }
        Algorithm::Nccl => {
            // Ring all-reduce: 2(n-1) steps of one chunk to the next rank, LL protocol.
            let wire = chunk * fabric.params().nccl_ll_wire_factor;
            let hops: Vec<Flow> = (0..n)
                .map(|i| {
                    let j = (i + 1) % n;
                    // NCCL takes P2P over NVLink always, over PCIe only within a socket unless
                    // NCCL_P2P_LEVEL=SYS; otherwise the hop goes through host memory (SHM).
                    let p2p = fabric.p2p_write(i, j)
                        && (fabric.class(i, j).is_nvlink()
                            || fabric.params().nccl_p2p_across_sockets
                            || fabric.socket(i) == fabric.socket(j));
                    Flow {
                        src: gpu(i),
                        dst: gpu(j),
                        bytes: wire,
                        op: if p2p { Op::Write } else { Op::ViaHost },
                    }
                })
                .collect();
            let steps = (0..2 * (n - 1)).map(|_| step("ring step", hops.clone(), Sync::NcclStep)).collect();
            mk(Transport::Nccl, steps)
        }
    }
}

fn host_write(fabric: &Fabric, i: usize, bytes: f64) -> Flow {
    Flow {
        src: gpu(i),
        dst: Endpoint::Host(fabric.socket(i)),
        bytes,
        op: Op::Write,
    }
}

/// Every rank reads every peer's host-staged buffer.
fn host_reads(fabric: &Fabric, n: usize, bytes: f64) -> Vec<Flow> {
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
