//! Feasibility: which (algorithm, transport) pairs reduce correctly on the fabric the first
//! `world` ranks see, and run on the backend as users run it (the registry's gates).
//!
//! Owns: the fabric summary the plan reads, the natural transport of an algorithm, and the
//! one `check` that the plan, `Overrides::validate` and the profile lookup all call. Must
//! never accept a pair the registry says has no code on that backend.

use super::floors::P2P_WRITE_EFFICIENCY;
use crate::algorithms::registry;
use crate::kinds::{Algorithm, Backend, Transport};
use crate::settings::Overrides;
use crate::topology::Topology;


/// What the plan needs to know about the ranks' GPUs.
#[derive(Clone, Debug)]
pub(crate) struct Fabric {
    pub backend: Backend,
    pub world: usize,
    pub gpus: usize,
    /// Every pair among the first `world` GPUs has P2P write / read.
    pub p2p_write: bool,
    pub p2p_read: bool,
    /// First pair lacking P2P write, for reasons.
    pub missing_write: Option<(usize, usize)>,
    pub missing_read: Option<(usize, usize)>,
    /// Every pair is NVLink.
    pub nvlink: bool,
    pub islands: usize,
    /// GPUs in the largest island.
    pub largest_island: usize,
    /// Slowest PCIe link among the ranks' GPUs, GB/s per direction.
    pub pcie_gbps: f64,
}

impl Fabric {
    pub fn of(t: &Topology, world: usize, backend: Backend) -> Fabric {
        let used = world.min(t.gpu_count());
        let mut f = Fabric {
            backend,
            world,
            gpus: t.gpu_count(),
            p2p_write: true,
            p2p_read: true,
            missing_write: None,
            missing_read: None,
            nvlink: used > 1,
            islands: t.islands_of(used).len(),
            largest_island: t.islands_of(used).iter().map(Vec::len).max().unwrap_or(0),
            pcie_gbps: t.gpus.iter().take(used).map(|g| g.pcie_gbps).fold(f64::INFINITY, f64::min),
        };
        if !f.pcie_gbps.is_finite() {
            f.pcie_gbps = 0.0;
        }
        for i in 0..used {
            for j in 0..used {
                if i == j {
                    continue;
                }
                let link = t.link(i, j).copied();
                let (w, r, nv) = link.map(|l| (l.p2p_write, l.p2p_read, l.class.is_nvlink())).unwrap_or((false, false, false));
                if !w && f.missing_write.is_none() {
                    f.missing_write = Some((i, j));
                }
                if !r && f.missing_read.is_none() {
                    f.missing_read = Some((i, j));
                }
                f.p2p_write &= w;
                f.p2p_read &= r;
                f.nvlink &= nv;
            }
        }
        f
    }

    pub fn fits(&self) -> bool {
        self.world <= self.gpus
    }

    /// Effective P2P write bandwidth, GB/s.
    pub fn p2p_gbps(&self) -> f64 {
        self.pcie_gbps * P2P_WRITE_EFFICIENCY
    }
}

/// Whether `transport` can carry anything at all here.
pub(crate) fn transport_usable(t: Transport, f: &Fabric) -> std::result::Result<(), String> {
    match (f.backend, t) {
        (Backend::Cpu, Transport::Shm) => Ok(()),
        (Backend::Cpu, Transport::P2p | Transport::Host | Transport::Nccl) => {
            Err(format!("CPU ranks exchange data only through shared memory (shm), not {t}"))
        }
        (Backend::Cuda, Transport::Shm) => Err("shm carries CPU ranks; GPU ranks use p2p, host or nccl".into()),
        (Backend::Cuda, Transport::Nccl) => Ok(()),
        (Backend::Cuda, Transport::P2p | Transport::Host) if !f.fits() => {
            Err(format!("world {} exceeds the {} GPUs of this topology; only NCCL spans them", f.world, f.gpus))
        }
        (Backend::Cuda, Transport::P2p) => match f.missing_write {
            None => Ok(()),
            Some((i, j)) => Err(format!("GPU{i} cannot write GPU{j} peer-to-peer")),
        },
        (Backend::Cuda, Transport::Host) => {
            if registry::REGISTRY.iter().any(|s| s.gpu_transports.contains(&Transport::Host)) {
                Ok(())
            } else {
                Err("no algorithm of the registry runs over the host transport with one process per GPU".into())
            }
        }
    }
}

/// The transport an algorithm runs over here when none is forced.
pub(crate) fn natural_transport(a: Algorithm, f: &Fabric) -> Transport {
    let spec = registry::spec(a);
    // The first transport the registry lists for this backend that the fabric can carry;
    // failing that, what the fabric would offer (so `check` names the real obstacle).
    if let Some(t) = spec.transports(f.backend).iter().copied().find(|&t| transport_usable(t, f).is_ok()) {
        return t;
    }
    match f.backend {
        Backend::Cpu => Transport::Shm,
        Backend::Cuda if a == Algorithm::Nccl => Transport::Nccl,
        Backend::Cuda if f.p2p_write => Transport::P2p,
        Backend::Cuda => Transport::Host,
    }
}

/// Whether `a` over `t` reduces correctly here and has code that runs it on this backend;
/// `Err` says why not.
pub(crate) fn check(a: Algorithm, t: Transport, f: &Fabric) -> std::result::Result<(), String> {
    transport_usable(t, f)?;
    let spec = registry::spec(a);
    if t == Transport::P2p && spec.reads_remote {
        if let Some((i, j)) = f.missing_read {
            return Err(format!("{a} reads peer memory but GPU{i} cannot read GPU{j}"));
        }
    }
    if spec.needs_islands && f.backend == Backend::Cuda && f.islands < 2 {
        return Err(format!("{a} needs at least two islands; the {} ranks form {}", f.world, f.islands));
    }
    registry::runnable(a, f.backend, t)
}

/// The transport of tpar's kernels for a GPU communicator, fixed at init (its workspaces live
/// there): `host` when the settings force it or when the plan would use it (the ranks' GPUs
/// cannot write each other peer-to-peer), else `p2p`. It follows the plan's own rule (`plan::default_plan`, and
/// `feasibility::natural_transport` for profiles and forced algorithms), so every kernel
/// plan the plan makes here runs over it; its inputs are in the plan digest, so every rank
/// picks the same.
pub fn kernel_transport(topology: &Topology, world: usize, overrides: &Overrides) -> Transport {
    let f = Fabric::of(topology, world.max(1), Backend::Cuda);
    let host_ok = transport_usable(Transport::Host, &f).is_ok();
    match overrides.transport {
        Some(Transport::Host) => Transport::Host,
        Some(_) => Transport::P2p,
        None if host_ok && f.fits() && transport_usable(Transport::P2p, &f).is_err() => Transport::Host,
        None => Transport::P2p,
    }
}
