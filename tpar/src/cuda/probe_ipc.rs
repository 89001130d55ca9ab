//! The link probe across rank processes (the first-use tune's): the kernels of
//! `kernels/probe.cu` run by each rank on its own GPU against its peers' memory, mapped
//! through CUDA IPC as the communicator maps its workspaces, the pairs taken in turn over
//! the control plane. So it measures the ranks' GPUs by rank, whatever their CUDA ordinals,
//! inside an engine where every rank is a process of its own. Each rank measures SM stores,
//! SM loads and copy-engine copies from its GPU into every peer's memory (one pair at a
//! time, then every rank to every peer at once), into its own memory and into pinned host
//! memory, and the one-way flag latency of each pair (a ping-pong between the two ranks'
//! kernels) and within its own and host memory. Ranks whose GPUs cannot reach each other
//! (the host transport) measure their own and host memory only.
//!
//! The launches and their timing are `probe`'s ([`PerGpu`]); what is this file's is the
//! schedule across processes and the IPC mappings.
//!
//! Owns: the probe's mappings and turn-taking. Must never: run a transfer without
//! its turn (every turn starts with a status-carrying barrier, so a rank that fails stops
//! every rank at the same point), or name GPUs by ordinal (entries are by rank).

use super::driver::{Device, Event, IpcMapping};
use super::probe::{one_way_us, rate, slot, Kind, PerGpu, ProbeOptions};
use crate::error::{Error, Result};
use crate::topology::probe::{PairProbe, Probe};
use crate::tune::{step, Ranks};

/// The first-use tune's probe: 16 MiB per transfer (0.3 ms at PCIe Gen5's ~50 GB/s, past
/// launch noise), best of 3, 128 x 512 threads (enough to fill a link), 500 ping round trips.
/// At 8 GPUs: 72 (source, target) turns x 3 kinds x 3 transfers, 28 ping pairs: about 0.3 s
/// on PCIe (docs/tune.md).
pub const FIRST_USE_PROBE: ProbeOptions = ProbeOptions { bytes: 16 << 20, reps: 2, blocks: 128, threads: 512, pings: 500 };

/// Where a transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Peer(usize),
    Own,
    Host,
}

/// One rank's side of the probe: its GPU's ([`PerGpu`]) and its peers' memory, mapped.
struct Side {
    // The peers' mappings go first (fields drop in order), before this GPU's buffers.
    peer_target: Vec<Option<IpcMapping>>,
    peer_flags: Vec<Option<IpcMapping>>,
    gpu: PerGpu,
}

impl Side {
    fn new(dev: &Device, opts: &ProbeOptions, world: usize) -> Result<Side> {
        Ok(Side { peer_target: (0..world).map(|_| None).collect(), peer_flags: (0..world).map(|_| None).collect(), gpu: PerGpu::new(dev, opts, world + 1)? })
    }

    fn handles(&self) -> Result<Vec<u8>> {
        Ok([self.gpu.target.ipc_handle()?, self.gpu.flags.ipc_handle()?].concat())
    }

    fn map(&mut self, blobs: &[Vec<u8>], me: usize) -> Result<()> {
        for (q, b) in blobs.iter().enumerate() {
            if q == me {
                continue;
            }
            let h = |r: std::ops::Range<usize>| -> Result<[u8; 64]> {
                b.get(r).and_then(|s| s.try_into().ok()).ok_or_else(|| Error::invalid("probe handles", format!("rank {q} sent {} bytes, not 128", b.len())))
            };
            self.peer_target[q] = Some(IpcMapping::open(&self.gpu.dev, &h(0..64)?)?);
            self.peer_flags[q] = Some(IpcMapping::open(&self.gpu.dev, &h(64..128)?)?);
        }
        Ok(())
    }

    fn address(&self, t: Target) -> Result<u64> {
        match t {
            Target::Own => Ok(self.gpu.target.ptr),
            Target::Host => Ok(self.gpu.host.dev),
            Target::Peer(q) => self.peer_target.get(q).and_then(|m| m.as_ref()).map(|m| m.ptr).ok_or_else(|| Error::invalid("probe", format!("rank {q}'s memory is not mapped"))),
        }
    }

    /// Runs every transfer of `kind` in `to` at once, each on its own stream; GB/s of each.
    fn transfer(&self, kind: Kind, to: &[Target], opts: &ProbeOptions) -> Result<Vec<f64>> {
        self.gpu.dev.bind()?;
        let mut evs = Vec::with_capacity(to.len());
        for (k, &t) in to.iter().enumerate() {
            let s = self.gpu.streams.get(k).ok_or_else(|| Error::invalid("probe", "more transfers than streams"))?;
            let (e0, e1) = (Event::new(&self.gpu.dev)?, Event::new(&self.gpu.dev)?);
            let target = self.address(t)?;
            s.record(&e0)?;
            // SAFETY: target is this rank's buffer, a live IPC mapping of a peer's, or mapped
            // host memory, each of `bytes` and reachable from this GPU; s is its stream.
            unsafe { self.gpu.transfer(kind, target, opts, s)? };
            s.record(&e1)?;
            evs.push((e0, e1));
        }
        let mut out = Vec::with_capacity(to.len());
        for (k, (e0, e1)) in evs.iter().enumerate() {
            self.gpu.streams[k].synchronize()?;
            out.push(rate(opts, e0, e1)?);
        }
        Ok(out)
    }

    /// Half the round trip of a ping-pong, us (`None`: it did not complete): `role` 0 pings
    /// first; `theirs` is the flag this side stores to. With `local`, two blocks of one kernel
    /// play both roles on this GPU (flags in its own or host memory).
    fn ping(&self, opts: &ProbeOptions, mine: u64, theirs: u64, role: u32, local: bool) -> Result<Option<f64>> {
        self.gpu.dev.bind()?;
        let s = &self.gpu.streams[0];
        let (e0, e1) = (Event::new(&self.gpu.dev)?, Event::new(&self.gpu.dev)?);
        s.record(&e0)?;
        // SAFETY: both flags lie in live allocations of >= 256 bytes reachable from this GPU
        // (its own, mapped host memory, or a peer's IPC mapping).
        unsafe { self.gpu.ping(opts, mine, theirs, role, if local { 2 } else { 1 }, s)? };
        s.record(&e1)?;
        s.synchronize()?;
        one_way_us(opts, &e0, &e1)
    }
}

fn entry(mine: &mut [PairProbe], t: Target) -> Option<&mut PairProbe> {
    let dst = match t {
        Target::Peer(q) => Some(q as u32),
        Target::Own => mine.first().map(|p| p.src),
        Target::Host => None,
    };
    mine.iter_mut().find(|p| p.dst == dst)
}

/// The probe of the ranks' links (see the module's contract), this process being rank `me`
/// on `device` among `ranks` (`p2p`: whether the ranks' GPUs reach each other's memory):
/// the same [`Probe`] on every rank, GPUs named by rank.
pub fn probe_links<R: Ranks + ?Sized>(ranks: &mut R, device: &Device, me: usize, p2p: bool, opts: &ProbeOptions) -> Result<Probe> {
    let world = ranks.world();
    let made = Side::new(device, opts, world);
    let blob = match &made {
        Ok(s) if p2p => s.handles(),
        Ok(_) => Ok(Vec::new()),
        Err(e) => Err(Error::invalid("probe", e.to_string())),
    };
    let blobs = step(ranks, blob)?;
    let mut side = made?;
    let mapped = if p2p { side.map(&blobs, me) } else { Ok(()) };
    step(ranks, mapped.map(|()| Vec::new()))?;
    let targets = |a: usize| -> Vec<Target> {
        let mut v: Vec<Target> = if p2p { (0..world).filter(|&q| q != a).map(Target::Peer).collect() } else { Vec::new() };
        v.extend([Target::Own, Target::Host]);
        v
    };
    let mut mine: Vec<PairProbe> = vec![PairProbe::empty(me as u32, Some(me as u32))];
    mine.extend(targets(me).into_iter().filter_map(|t| match t {
        Target::Peer(q) => Some(PairProbe::empty(me as u32, Some(q as u32))),
        Target::Host => Some(PairProbe::empty(me as u32, None)),
        Target::Own => None,
    }));
    for kind in [Kind::Store, Kind::Load, Kind::Copy] {
        // Alone: one source and target at a time; everyone else waits at the turn.
        for a in 0..world {
            for t in targets(a) {
                ranks.sync()?;
                if a == me {
                    let mut best = 0.0f64;
                    for _ in 0..=opts.reps.max(1) {
                        best = best.max(side.transfer(kind, &[t], opts)?[0]);
                    }
                    if let Some(p) = entry(&mut mine, t) {
                        *slot(p, kind, false) = Some(best);
                    }
                }
            }
        }
        // Under load: every rank to every peer at once (own and host memory where the
        // ranks have no peer access).
        let all: Vec<Target> = if p2p && world > 1 { (0..world).filter(|&q| q != me).map(Target::Peer).collect() } else { vec![Target::Own, Target::Host] };
        let mut best = vec![0.0f64; all.len()];
        for _ in 0..=opts.reps.max(1) {
            ranks.sync()?;
            for (b, r) in best.iter_mut().zip(side.transfer(kind, &all, opts)?) {
                *b = b.max(r);
            }
        }
        for (&t, r) in all.iter().zip(best) {
            if let Some(p) = entry(&mut mine, t) {
                *slot(p, kind, true) = Some(r);
            }
        }
    }
    // Flags: within this GPU's memory and through host memory (every rank at once), then
    // each pair of ranks, the lower one timing.
    ranks.sync()?;
    for host in [false, true] {
        let base = if host {
            side.gpu.host.fill_u32(0);
            side.gpu.host.dev
        } else {
            side.gpu.flags.fill_u32(0)?;
            side.gpu.flags.ptr
        };
        let us = side.ping(opts, base, base + 128, 0, true)?;
        if let Some(p) = entry(&mut mine, if host { Target::Host } else { Target::Own }) {
            p.flag_us = us;
        }
    }
    if p2p {
        for a in 0..world {
            for b in a + 1..world {
                side.gpu.flags.fill_u32(0)?;
                ranks.sync()?;
                let (role, peer) = if me == a { (0, b) } else if me == b { (1, a) } else { continue };
                let theirs = side.peer_flags.get(peer).and_then(|m| m.as_ref()).map(|m| m.ptr).ok_or_else(|| Error::invalid("probe", format!("rank {peer}'s flags are not mapped")))?;
                let us = side.ping(opts, side.gpu.flags.ptr, theirs, role, false)?;
                if role == 0 {
                    if let Some(p) = entry(&mut mine, Target::Peer(peer)) {
                        p.flag_us = us;
                    }
                }
            }
        }
    }
    let all = step(ranks, serde_json::to_vec(&mine).map_err(|e| Error::invalid("probe", e.to_string())))?;
    let mut pairs: Vec<PairProbe> = Vec::new();
    for (r, b) in all.iter().enumerate() {
        let got: Vec<PairProbe> = serde_json::from_slice(b).map_err(|e| Error::invalid("probe", format!("rank {r}'s figures: {e}")))?;
        pairs.extend(got);
    }
    // A pair's flag latency was timed by its lower rank: the same figure both ways.
    let flags: Vec<(u32, u32, Option<f64>)> = pairs.iter().filter_map(|p| p.dst.filter(|&d| d > p.src).map(|d| (p.src, d, p.flag_us))).collect();
    for (a, b, us) in flags {
        if let Some(p) = pairs.iter_mut().find(|p| p.src == b && p.dst == Some(a)) {
            p.flag_us = us;
        }
    }
    let source = format!(
        "measured by tpar's first-use tune across {world} rank processes (tpar::cuda::probe_ipc, through CUDA IPC): {} per transfer, {} x {} threads, best of {}",
        crate::units::human_bytes(opts.bytes as u64),
        opts.blocks,
        opts.threads,
        opts.reps + 1
    );
    Ok(Probe { source, pairs })
}
