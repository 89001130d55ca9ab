//! The link probe: measures, between this machine's GPUs, SM store, SM load and copy-engine
//! bandwidth (each pair alone, then every pair at once) and one-way flag latency, and on
//! each GPU the same against its own memory and pinned host memory. `tpar topo --probe`
//! puts the result into the topology ([`crate::topology::probe::Probe`]); the simulator and
//! the plan then use it instead of a link class's assumed figures.
//!
//! Owns: the probe kernels' launch (`kernels/probe.cu`), peer access, timing with events.
//! Must never: register an algorithm (a probe is not one), or leave peer access half set up
//! on error (access stays enabled; that is harmless). Runs in one process over all GPUs;
//! `probe_ipc` runs the same kernels across rank processes (the first-use tune).
//!
//! Written once for both ([`PerGpu`]): the buffers and kernels of one GPU, the launch of a
//! transfer or a ping-pong, and the conversion of their events to GB/s and one-way us. Apart,
//! because they really differ: the schedule (here one process drives every GPU by ordinal,
//! binding each in turn; there each rank drives its own GPU, reaches peers through IPC
//! mappings and takes turns over the control plane so that every rank stops at the same
//! point when one fails) and the way peers' memory is reached (peer access vs IPC).

use super::driver::{launch_with_struct, sys, Device, DeviceBuffer, Event, HostMapped, Module, Stream};
use super::nvrtc;
use crate::error::{Error, Result};
use crate::topology::probe::{PairProbe, Probe};

/// The probe kernels' source (not an algorithm: compiled here, never through the registry).
pub const PROBE_CU: &str = include_str!("../../kernels/probe.cu");

/// How much and how long to measure.
#[derive(Clone, Copy, Debug)]
pub struct ProbeOptions {
    /// Bytes per transfer: large enough that launch cost is noise (64 MiB: ~1.2 ms at 55 GB/s).
    pub bytes: usize,
    /// Timed repetitions per figure (the fastest counts: interference only slows a transfer).
    pub reps: u32,
    /// Blocks and threads of the store/load kernels (enough to fill a link).
    pub blocks: u32,
    pub threads: u32,
    /// Round trips of the flag ping-pong.
    pub pings: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions { bytes: 64 << 20, reps: 3, blocks: 128, threads: 512, pings: 2000 }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProbeArgs {
    pub(super) target: u64,
    pub(super) bytes: u64,
    pub(super) sink: u64,
    pub(super) pad: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct PingArgs {
    pub(super) mine: u64,
    pub(super) theirs: u64,
    pub(super) iters: u32,
    pub(super) role: u32,
    pub(super) deadline_ns: u64,
}

/// A ping-pong that takes longer than this per round trip did not complete (its deadline
/// fired), us.
pub(super) const PING_GIVE_UP_US: f64 = 1000.0;
/// Deadline of one ping-pong kernel, ns.
pub(super) const PING_DEADLINE_NS: u64 = 2_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Store,
    Load,
    Copy,
}

/// Where a transfer goes: a GPU's target buffer, or pinned host memory of the source GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Gpu(usize),
    Host,
}

/// One GPU's side of a probe: the probe kernels loaded, a target and a copy source of
/// `opts.bytes`, pinned host memory, a sink, flags, and its streams. The same for the probe of
/// one process ([`run`]) and the one across rank processes (`probe_ipc`).
pub(super) struct PerGpu {
    pub(super) dev: Device,
    /// Keeps the functions below loaded.
    _module: Module,
    pub(super) f_store: sys::CUfunction,
    pub(super) f_load: sys::CUfunction,
    pub(super) f_ping: sys::CUfunction,
    /// Peers store into / load from this.
    pub(super) target: DeviceBuffer,
    /// Copy-engine source.
    pub(super) local: DeviceBuffer,
    pub(super) host: HostMapped,
    pub(super) sink: DeviceBuffer,
    pub(super) flags: DeviceBuffer,
    pub(super) streams: Vec<Stream>,
}

impl PerGpu {
    /// Loads the probe kernels on `dev` and allocates its buffers and `streams` streams.
    pub(super) fn new(dev: &Device, opts: &ProbeOptions, streams: usize) -> Result<PerGpu> {
        check_bytes(opts)?;
        let arch = dev.arch();
        // Compiled and cached like the kernels (cubin for this device, checksummed entry).
        let mut module = super::launch::load_unit(dev, "probe", PROBE_CU, &nvrtc::options(&arch, None), &arch, super::driver::driver_version())?;
        let (f_store, f_load, f_ping) = (module.function("probe_store")?, module.function("probe_load")?, module.function("probe_pingpong")?);
        Ok(PerGpu {
            target: DeviceBuffer::new(dev, opts.bytes)?,
            local: DeviceBuffer::new(dev, opts.bytes)?,
            host: HostMapped::new(dev, opts.bytes)?,
            sink: DeviceBuffer::new(dev, 256)?,
            flags: DeviceBuffer::new(dev, 256)?,
            _module: module,
            f_store,
            f_load,
            f_ping,
            streams: (0..streams).map(|_| Stream::new(dev)).collect::<Result<Vec<_>>>()?,
            dev: dev.clone(),
        })
    }

    /// Enqueues one transfer of `kind` from this GPU into `target` (an address reachable from
    /// it) on `s`: the store or load kernel, or a copy-engine copy of `opts.bytes`.
    ///
    /// # Safety
    /// `target` must be a live allocation of at least `opts.bytes` bytes reachable from this
    /// GPU (its own, a peer's through peer access or an IPC mapping, or mapped host memory),
    /// and `s` one of this GPU's streams.
    pub(super) unsafe fn transfer(&self, kind: Kind, target: u64, opts: &ProbeOptions, s: &Stream) -> Result<()> {
        match kind {
            Kind::Store | Kind::Load => {
                let f = if kind == Kind::Store { self.f_store } else { self.f_load };
                let args = ProbeArgs { target, bytes: opts.bytes as u64, sink: self.sink.ptr, pad: 0 };
                // SAFETY: f takes one ProbeArgs; target (the caller's contract) and sink are
                // live allocations of at least `bytes` / 256 bytes reachable from this GPU.
                unsafe { launch_with_struct(f, opts.blocks, opts.threads, s, &args) }
            }
            // SAFETY: `local` holds `bytes`; target does (the caller's contract).
            Kind::Copy => unsafe { super::driver::memcpy_async(target, self.local.ptr, opts.bytes, s) },
        }
    }

    /// Enqueues the ping-pong kernel on `s` with `blocks` blocks (2: both roles on this GPU;
    /// 1: `role` only, the peer's kernel plays the other).
    ///
    /// # Safety
    /// `mine` and `theirs` must lie in live allocations of at least 128 bytes reachable from
    /// this GPU, and `s` be one of its streams.
    pub(super) unsafe fn ping(&self, opts: &ProbeOptions, mine: u64, theirs: u64, role: u32, blocks: u32, s: &Stream) -> Result<()> {
        let args = PingArgs { mine, theirs, iters: opts.pings, role, deadline_ns: PING_DEADLINE_NS };
        // SAFETY: f takes one PingArgs; both flags as the caller's contract says.
        unsafe { launch_with_struct(self.f_ping, blocks, 32, s, &args) }
    }
}

/// The rate of one transfer of `opts.bytes` timed by `e0`..`e1`, GB/s (0 if no time passed).
pub(super) fn rate(opts: &ProbeOptions, e0: &Event, e1: &Event) -> Result<f64> {
    let ms = f64::from(e0.elapsed_ms(e1)?);
    Ok(if ms > 0.0 { opts.bytes as f64 / (ms * 1e6) } else { 0.0 })
}

/// Half the round trip of `opts.pings` ping-pongs timed by `e0`..`e1`, us; `None` if they
/// did not complete (the kernel gave up at its deadline).
pub(super) fn one_way_us(opts: &ProbeOptions, e0: &Event, e1: &Event) -> Result<Option<f64>> {
    let us = f64::from(e0.elapsed_ms(e1)?) * 1e3 / (2.0 * f64::from(opts.pings.max(1)));
    Ok((us * 2.0 < PING_GIVE_UP_US).then_some(us))
}

fn check_bytes(opts: &ProbeOptions) -> Result<()> {
    if opts.bytes < 16 || opts.bytes % 16 != 0 {
        return Err(Error::invalid("probe bytes", format!("{} is not a positive multiple of 16", opts.bytes)));
    }
    Ok(())
}

/// Where a figure of `kind` goes in a pair's entry (`loaded`: measured under load).
pub(super) fn slot(p: &mut PairProbe, kind: Kind, loaded: bool) -> &mut Option<f64> {
    match (kind, loaded) {
        (Kind::Store, false) => &mut p.sm_store_gbps,
        (Kind::Load, false) => &mut p.sm_load_gbps,
        (Kind::Copy, false) => &mut p.ce_gbps,
        (Kind::Store, true) => &mut p.sm_store_loaded_gbps,
        (Kind::Load, true) => &mut p.sm_load_loaded_gbps,
        (Kind::Copy, true) => &mut p.ce_loaded_gbps,
    }
}

/// Measures GPUs `0..gpus` (all of them when `None`).
pub fn run(gpus: Option<usize>, opts: &ProbeOptions) -> Result<Probe> {
    let count = super::driver::device_count()?;
    let n = gpus.unwrap_or(count).min(count);
    if n == 0 {
        return Err(Error::Unsupported { what: "the link probe".into(), reason: "no CUDA GPU is visible".into() });
    }
    check_bytes(opts)?;
    let mut g: Vec<PerGpu> = Vec::with_capacity(n);
    for i in 0..n {
        g.push(PerGpu::new(&Device::open(i)?, opts, n + 2)?);
    }
    for a in 0..n {
        for b in 0..n {
            if a != b {
                g[a].dev.enable_peer_access(&g[b].dev)?;
            }
        }
    }
    let mut pairs: Vec<PairProbe> = Vec::new();
    let targets = |a: usize| -> Vec<Target> {
        let mut v: Vec<Target> = (0..n).filter(|&b| b != a).map(Target::Gpu).collect();
        v.push(Target::Gpu(a));
        v.push(Target::Host);
        v
    };
    for a in 0..n {
        for t in targets(a) {
            let dst = match t {
                Target::Gpu(b) => Some(b as u32),
                Target::Host => None,
            };
            pairs.push(PairProbe::empty(a as u32, dst));
        }
    }
    let index = |pairs: &[PairProbe], a: usize, t: Target| -> Option<usize> {
        let dst = match t {
            Target::Gpu(b) => Some(b as u32),
            Target::Host => None,
        };
        pairs.iter().position(|p| p.src as usize == a && p.dst == dst)
    };
    for kind in [Kind::Store, Kind::Load, Kind::Copy] {
        // Alone.
        for a in 0..n {
            for t in targets(a) {
                let mut best = 0.0f64;
                for _ in 0..opts.reps.max(1) + 1 {
                    best = best.max(timed(&g, opts, kind, &[(a, t)])?[0]);
                }
                if let Some(i) = index(&pairs, a, t) {
                    *slot(&mut pairs[i], kind, false) = Some(best);
                }
            }
        }
        // Under load: every GPU to every peer at once (all-to-all); on one GPU, its own memory
        // and host memory at once.
        let all: Vec<(usize, Target)> = if n > 1 {
            (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, Target::Gpu(b)))).collect()
        } else {
            vec![(0, Target::Gpu(0)), (0, Target::Host)]
        };
        let mut best = vec![0.0f64; all.len()];
        for _ in 0..opts.reps.max(1) + 1 {
            for (b, r) in best.iter_mut().zip(timed(&g, opts, kind, &all)?) {
                *b = b.max(r);
            }
        }
        for (&(a, t), r) in all.iter().zip(best) {
            if let Some(i) = index(&pairs, a, t) {
                *slot(&mut pairs[i], kind, true) = Some(r);
            }
        }
    }
    // Flags: between every pair of GPUs; on each GPU within its own memory and through host
    // memory (two blocks of one kernel ping-pong).
    for a in 0..n {
        for t in [Target::Gpu(a), Target::Host] {
            let us = ping_local(&g[a], opts, t == Target::Host)?;
            if let Some(i) = index(&pairs, a, t) {
                pairs[i].flag_us = us;
            }
        }
        for b in (a + 1)..n {
            let us = ping_pair(&g, opts, a, b)?;
            for (x, y) in [(a, b), (b, a)] {
                if let Some(i) = index(&pairs, x, Target::Gpu(y)) {
                    pairs[i].flag_us = us;
                }
            }
        }
    }
    let source = format!(
        "measured by tpar's link probe (tpar::cuda::probe): {} GPU(s), {} per transfer, {} x {} threads, best of {}",
        n,
        crate::units::human_bytes(opts.bytes as u64),
        opts.blocks,
        opts.threads,
        opts.reps
    );
    Ok(Probe { source, pairs })
}

/// Runs every (GPU, target) transfer of `kind` at once, each on its own stream, and returns
/// each one's rate in GB/s.
fn timed(g: &[PerGpu], opts: &ProbeOptions, kind: Kind, ops: &[(usize, Target)]) -> Result<Vec<f64>> {
    let mut evs: Vec<(Event, Event)> = Vec::with_capacity(ops.len());
    let mut used = vec![0usize; g.len()];
    let mut streams: Vec<&Stream> = Vec::with_capacity(ops.len());
    for &(a, _) in ops {
        let s = g[a].streams.get(used[a]).ok_or_else(|| Error::invalid("probe", "more transfers than streams"))?;
        used[a] += 1;
        streams.push(s);
        evs.push((Event::new(&g[a].dev)?, Event::new(&g[a].dev)?));
    }
    for (k, &(a, t)) in ops.iter().enumerate() {
        let me = &g[a];
        me.dev.bind()?;
        let target = match t {
            Target::Gpu(b) => g[b].target.ptr,
            Target::Host => me.host.dev,
        };
        streams[k].record(&evs[k].0)?;
        // SAFETY: target is GPU b's target or this GPU's mapped host memory, both of `bytes`
        // and reachable from here (peer access enabled, host mapped); the stream is this
        // GPU's and current.
        unsafe { me.transfer(kind, target, opts, streams[k]) }.map_err(|e| Error::Cuda { context: format!("GPU{a} -> {t:?}"), code: e.to_string() })?;
        streams[k].record(&evs[k].1)?;
    }
    let mut out = Vec::with_capacity(ops.len());
    for (k, &(a, _)) in ops.iter().enumerate() {
        g[a].dev.bind()?;
        streams[k].synchronize()?;
        out.push(rate(opts, &evs[k].0, &evs[k].1)?);
    }
    Ok(out)
}

/// Half the round trip of a flag bounced between two blocks of one GPU, through its own
/// memory or through pinned host memory, us; `None` if it did not complete.
fn ping_local(me: &PerGpu, opts: &ProbeOptions, host: bool) -> Result<Option<f64>> {
    me.dev.bind()?;
    let base = if host {
        me.host.fill_u32(0);
        me.host.dev
    } else {
        me.flags.fill_u32(0)?;
        me.flags.ptr
    };
    let s = &me.streams[0];
    let (e0, e1) = (Event::new(&me.dev)?, Event::new(&me.dev)?);
    s.record(&e0)?;
    // SAFETY: both flags lie in a live allocation of >= 256 bytes on this GPU or mapped host.
    unsafe { me.ping(opts, base, base + 128, 0, 2, s)? };
    s.record(&e1)?;
    s.synchronize()?;
    one_way_us(opts, &e0, &e1)
}

/// Half the round trip of a flag bounced between GPU a and GPU b (each polls its own memory,
/// stores into the other's), us; `None` if it did not complete.
fn ping_pair(g: &[PerGpu], opts: &ProbeOptions, a: usize, b: usize) -> Result<Option<f64>> {
    for x in [a, b] {
        g[x].dev.bind()?;
        g[x].flags.fill_u32(0)?;
    }
    let (e0, e1) = (Event::new(&g[a].dev)?, Event::new(&g[a].dev)?);
    // The answering side first, so it is polling when the first ping lands.
    for (x, y, role) in [(b, a, 1u32), (a, b, 0u32)] {
        let me = &g[x];
        me.dev.bind()?;
        if role == 0 {
            me.streams[0].record(&e0)?;
        }
        // SAFETY: both flags are live allocations of 256 bytes reachable through peer access.
        unsafe { me.ping(opts, me.flags.ptr, g[y].flags.ptr, role, 1, &me.streams[0])? };
        if role == 0 {
            me.streams[0].record(&e1)?;
        }
    }
    for x in [a, b] {
        g[x].dev.bind()?;
        g[x].streams[0].synchronize()?;
    }
    g[a].dev.bind()?;
    one_way_us(opts, &e0, &e1)
}
