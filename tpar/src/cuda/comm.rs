//! [`GpuCommunicator`]: one rank per process, one GPU per rank — how inference engines run.
//!
//! The setup chain is explicit: rendezvous (tpar's validated Unix socket, used here as the
//! control plane only) -> every rank's PCI address exchanged, the topology seen from the
//! ranks ([`Topology::for_ranks`]) -> this rank's workspace (`cuMemAlloc`) -> every peer's
//! workspace mapped through CUDA IPC handles carried by the control plane -> NCCL joined over
//! the same rendezvous when tpar itself may call it ([`NcclUse`]) -> a watchdog thread that
//! ends this rank's calls in flight when a peer's process dies. Ranks must agree on the
//! plan's inputs (topology, profile, overrides): their digest salts the rendezvous
//! fingerprint, and the ranks' topology is compared once more after the exchange.
//!
//! A call is resolved once per (dtype, bytes, capture mode) into a [`Resolved`]: the plan's
//! decision and, for a kernel, its launch (variant, grid, threads, PDL) and the descriptor it
//! announces. Resolution is where a decision can still be refused (a forced algorithm the
//! registry's gate refuses, NCCL planned but not joined): the error names why and the way
//! out. After it, a call checks its pointers and launches.
//!
//! Owns: the dispatch from a resolved call to a kernel, an NCCL call, or the caller's NCCL.
//! Must never launch nothing: every route is matched, and a call routed to the caller's NCCL
//! is refused by [`call`](GpuCommunicator::call) under [`NcclCalls::Tpars`] and handed back
//! ([`Served::ToCaller`]) under the others (callers may ask [`route`](GpuCommunicator::route)
//! first).

use super::driver::{Event, Stream};
use super::rank_set::{RankSet, SetOptions};

use super::fused::{FusedBufs, FusedCall, FusedPath, FusedResolved, FusedRoute};
use super::launch::Launch;
pub use super::route::{Resolved, Route, Served};
use super::nccl::{self, NcclComm};
use crate::algorithms::registry;
use crate::config::Config;
use crate::control::{ControlPlane, NoDataPlane, Watchdog, DEAD_PEER_GRACE, LIVENESS_PERIOD};
use crate::error::{Error, Result};
use crate::plan::cache::PlanCache;
use crate::plan::{plan_fingerprint, Backend, CaptureMode, Overrides, Plan, PlanInput};
use crate::plan::profile::Profile;
use crate::rendezvous::JoinSpec;
use crate::topology::ranks::Placement;
use crate::topology::Topology;
use crate::dtype::DType;
use crate::kinds::{Algorithm, Collective, Transport};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Errors and completion (the host-bounded wait).
mod completion;
// The fused all-reduce + residual add + RMSNorm.
mod fused_calls;
// The first-use tune: its start on every rank, adoption, `TPAR_PROFILE`.
mod tune_start;
use tune_start::{load_profiles, mode_index, TuneContext};


/// Beyond the device-side deadline, so that a kernel's own timeout (which names the peer and
/// phase) is what the caller sees when it can be.
const HOST_GRACE: Duration = Duration::from_secs(1);
/// Resolved calls kept before the memo starts over (many distinct sizes must not grow it
/// without bound).
const RESOLVED_MAX: usize = 4096;

/// Whether tpar joins an NCCL communicator of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NcclUse {
    /// Join one at init, and run the calls the plan gives to NCCL on it (the default).
    #[default]
    Own,
    /// Join none: the caller (an engine, with its own NCCL) runs the calls the plan gives to
    /// NCCL; [`GpuCommunicator::route`] says which they are. Saves NCCL's memory and start-up.
    Caller,
}

/// Where and how large a rank's GPU workspace is.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// CUDA ordinal; default: rank modulo the number of GPUs in the topology.
    pub device: Option<usize>,
    /// Largest message tpar's kernels take; larger ones go to NCCL (the plan says so).
    pub max_bytes: usize,
    /// The fabric to plan for; default: `TPAR_TOPOLOGY` (`Config::topology`), else
    /// discovered through NVML.
    pub topology: Option<Topology>,
    /// Whether tpar joins NCCL itself.
    pub nccl: NcclUse,
}

/// Where a call goes that the plan gives to NCCL ([`Call::nccl`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NcclCalls {
    /// On tpar's own NCCL; a communicator that joined none ([`NcclUse::Caller`]) refuses
    /// the call (`Error::Unsupported`; [`GpuCommunicator::route`] says which calls those are).
    #[default]
    Tpars,
    /// On tpar's own NCCL where it joined one, else handed back ([`Served::ToCaller`]):
    /// framework bindings, whose framework has an NCCL of its own.
    CallersIfNone,
    /// Always handed back ([`Served::ToCaller`]): the caller prefers its own NCCL even where
    /// tpar joined one.
    Callers,
}

/// One call of [`GpuCommunicator::call`]: `count` elements of `dtype` per rank as
/// [`Collective::io_elems`] counts them (an all-gather's `input` holds `count`, its `output`
/// `world x count`; a reduce-scatter's the other way round), device pointers `input` and
/// `output`. Built with [`Call::new`] / [`Call::all_reduce`]; the rest defaults to an eager
/// call on the communicator's own stream, the plan's algorithm, NCCL calls on tpar's NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub collective: Collective,
    pub dtype: DType,
    pub count: usize,
    pub input: u64,
    pub output: u64,
    /// Whether the stream is being captured into a CUDA graph.
    pub mode: CaptureMode,
    /// The caller's stream (`None`: [`GpuCommunicator::stream`]).
    pub stream: Option<u64>,
    /// An algorithm forced instead of the plan's (`None`: the plan's).
    pub algorithm: Option<Algorithm>,
    pub nccl: NcclCalls,
}

impl Call {
    pub fn new(collective: Collective, dtype: DType, count: usize, input: u64, output: u64) -> Call {
        Call { collective, dtype, count, input, output, mode: CaptureMode::Eager, stream: None, algorithm: None, nccl: NcclCalls::Tpars }
    }

    /// A sum all-reduce of `count` elements (`output` may equal `input`).
    pub fn all_reduce(dtype: DType, count: usize, input: u64, output: u64) -> Call {
        Call::new(Collective::AllReduce, dtype, count, input, output)
    }

    pub fn mode(self, mode: CaptureMode) -> Call {
        Call { mode, ..self }
    }

    pub fn on_stream(self, stream: u64) -> Call {
        Call { stream: Some(stream), ..self }
    }

    /// `algorithm` instead of the plan's; `None` leaves the plan's.
    pub fn forced(self, algorithm: Option<Algorithm>) -> Call {
        Call { algorithm, ..self }
    }

    pub fn nccl(self, nccl: NcclCalls) -> Call {
        Call { nccl, ..self }
    }
}

/// One rank of a multi-process GPU group.
pub struct GpuCommunicator {
    // Dropped first: the watchdog thread writes into the workspace until it is joined.
    watchdog: Watchdog,
    pub(super) control: ControlPlane,
    pub(super) ws: RankSet,
    nccl: std::result::Result<NcclComm, String>,
    nccl_use: NcclUse,
    pub(super) topology: Topology,
    pub(super) placement: Placement,
    pub(super) overrides: Overrides,
    /// The profile the plan takes for calls of each capture mode (`tune_start::mode_index`): the
    /// first-use tune's tables, or `TPAR_PROFILE`'s in both.
    pub(super) profiles: [Option<Profile>; 2],
    /// Candidates this machine's bit-exact screen rejected, per collective: never run for it
    /// (the plan's pick of one goes to NCCL).
    pub(super) rejected: Vec<crate::plan::tuned::Rejection>,
    /// How this start's tune went.
    pub(super) tune: crate::tune::Outcome,
    /// What later starts of the tune need from the `Config`.
    tune_ctx: TuneContext,
    /// Orders this communicator's stream after a caller's stream ([`Self::wait_for`]).
    after_caller: Event,
    /// Orders a caller's stream after this communicator's calls ([`Self::signal_to`]).
    after_calls: Event,
    /// Bound on any wait (`Config::timeout`).
    timeout: Duration,
    /// The plan's decisions (pure; also what [`plan`](Self::plan) shows).
    plans: PlanCache,
    /// Calls resolved so far, per (collective, dtype, bytes per rank, capture mode).
    resolved: HashMap<(Collective, DType, u64, CaptureMode), Arc<Resolved>>,
    /// Fused calls resolved so far, per (dtype, rows, hidden, capture mode).
    fused_resolved: HashMap<(DType, usize, usize, super::fused::FusedPattern, CaptureMode), Arc<FusedResolved>>,
    /// Whether calls are checked across ranks (TPAR_CHECK_CALLS, on by default).
    pub(super) check_calls: bool,
    /// Between [`begin_capture_check`](Self::begin_capture_check) and
    /// [`end_capture_check`](Self::end_capture_check): every call captured in graph mode,
    /// `count << 8 | desc_code` (the call as the kernels' descriptors would announce it).
    /// Those kernels run with no descriptor; the sequences are compared over the control
    /// plane when the capture ends.
    pub(super) captured: Option<Vec<u64>>,
}

impl GpuCommunicator {
    /// Joins the job of `cfg` on this process's GPU.
    pub fn init(cfg: &Config, opts: &GpuOptions) -> Result<GpuCommunicator> {
        cfg.validate()?;
        let (machine, given) = match (&opts.topology, &cfg.topology) {
            (Some(t), _) => (t.clone(), true),
            (None, Some(name)) => (Topology::load(name)?, true),
            (None, None) => (Topology::discover(), false),
        };
        if opts.max_bytes == 0 {
            return Err(Error::invalid("max_bytes", "must be positive"));
        }
        // Messages above the workspace go to NCCL, by the plan's own TPAR_MAX_BYTES rule.
        let mut overrides = cfg.overrides.clone();
        let cap = opts.max_bytes as u64;
        overrides.max_bytes = Some(overrides.max_bytes.map_or(cap, |m| m.min(cap)));
        // TPAR_PROFILE: a profile of `tpar tune` (one mode) or an entry of the tune cache
        // (both modes); its contents are part of the plan digest the ranks compare.
        let profiles = match &overrides.profile {
            Some(p) => load_profiles(p)?,
            None => [None, None],
        };
        // The control plane alone (no CPU workspace): rendezvous, gather/broadcast, liveness.
        let digest = |p: &Option<Profile>| plan_fingerprint(&machine, p.as_ref(), &overrides);
        // TPAR_FUSED_ROWS changes two-shot pull's fused layout across ranks (fused::rows_owned):
        // set, the ranks agree on it at the rendezvous, as on TPAR_FUSED (in the plan digest),
        // so that a disagreement is refused even where TPAR_CHECK_CALLS=0 leaves no descriptor.
        let rows_salt = cfg.launch.fused_rows.map_or(0, |on| crate::units::fnv1a64(format!("TPAR_FUSED_ROWS={on}").as_bytes()));
        let fingerprint = cfg.fingerprint ^ digest(&profiles[0]) ^ digest(&profiles[1]).rotate_left(1) ^ rows_salt;
        let (mut control, _) = ControlPlane::join::<NoDataPlane>(&JoinSpec { fingerprint, ..cfg.join_spec() })?;
        let device = opts.device.unwrap_or(cfg.rank % machine.gpu_count().max(1));
        let dev = super::driver::Device::open(device)?;
        // Ranks are placed on the topology by their devices' PCI addresses, not by ordinal.
        let ids: Vec<String> = control
            .all_gather_bytes(dev.pci_bus_id()?.as_bytes())?
            .into_iter()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect();
        let (topology, placement) = machine.for_ranks(&ids, given);
        if let Placement::Unknown(why) = &placement {
            tracing::warn!("tpar: rank {}: {why}; calls go to NCCL", cfg.rank);
        }
        overrides.validate(&topology, cfg.world, Backend::Cuda)?;
        let transport = crate::plan::feasibility::kernel_transport(&topology, cfg.world, &overrides);
        // The check setting is in the plan digest, so every rank that got this far has the
        // same. Every rank derived the same ranks' topology (the addresses were exchanged), so
        // every rank labels the same islands; islands that do not cover the ranks run as one.
        let check_calls = overrides.check_calls != Some(false);
        let islands = as_u32(&islands_for(&topology, cfg.world));
        let islands = if crate::algorithms::hierarchical::island_word(&islands, cfg.world).is_ok() { islands } else { Vec::new() };
        let set_opts = SetOptions { islands, ..SetOptions::from_overrides(transport, cfg.timeout, &overrides, cfg.launch) };
        let mut ws = RankSet::process(device, cfg.rank, cfg.world, opts.max_bytes, cfg.job_id, set_opts)?;
        let blobs = control.all_gather_bytes(&ws.handle_blob()?)?;
        ws.connect(&blobs)?;
        // Every rank has mapped the workspaces: the host segment's name can go.
        control.barrier()?;
        ws.all_attached()?;
        if registry::spec(Algorithm::CeRing).gpu_transports.contains(&ws.transport()) {
            ws.enable_ce(overrides.wire.unwrap_or_default())?;
        }
        let nccl = match opts.nccl {
            NcclUse::Own => nccl::init_over_rendezvous(&mut control, ws.device()).map_err(|e| e.to_string()),
            NcclUse::Caller => Err("not joined: the caller runs NCCL's calls (NcclUse::Caller)".to_string()),
        };
        let after_caller = Event::ordering(ws.device())?;
        let after_calls = Event::ordering(ws.device())?;
        let aborter = ws.aborter()?;
        let rank = cfg.rank;
        let watchdog = Watchdog::start(control.liveness_probe()?, cfg.rank, cfg.world, move |peer| {
            if let Err(e) = aborter.peer_died(peer) {
                tracing::warn!("tpar: rank {rank}: could not end the calls in flight after rank {peer} died: {e}");
            }
        })?;
        let mut comm = GpuCommunicator {
            watchdog,
            after_caller,
            after_calls,
            timeout: cfg.timeout,
            control,
            ws,
            nccl,
            nccl_use: opts.nccl,
            topology,
            placement,
            overrides,
            profiles,
            rejected: Vec::new(),
            tune: crate::tune::Outcome::Skipped { why: "not started".into() },
            tune_ctx: TuneContext::of(cfg, opts.max_bytes),
            plans: PlanCache::default(),
            resolved: HashMap::new(),
            fused_resolved: HashMap::new(),
            check_calls,
            captured: None,
        };
        // This machine's tune: from the cache, measured now, or the defaults (and why).
        comm.tune_with(crate::tune::StartOptions::first_use(cfg.tune))?;
        Ok(comm)
    }

    /// How this start's first-use tune went (`line()`: the one line it printed).
    pub fn tune_outcome(&self) -> &crate::tune::Outcome {
        &self.tune
    }

    pub fn rank(&self) -> usize {
        self.control.rank()
    }

    pub fn world(&self) -> usize {
        self.control.world()
    }

    /// The transport of tpar's kernels here: `p2p` (device memory through CUDA IPC) or
    /// `host` (a shared host-memory segment): `host` when `TPAR_TRANSPORT=host` or when the
    /// ranks' GPUs cannot write each other peer-to-peer.
    pub fn transport(&self) -> Transport {
        self.ws.transport()
    }

    /// This rank's GPU.
    pub fn device(&self) -> &super::driver::Device {
        self.ws.device()
    }

    /// The stream every call is enqueued on (capture it to build a CUDA graph).
    pub fn stream(&self) -> &Stream {
        self.ws.stream()
    }

    /// The fabric the plan decides for, as the ranks see it: GPU r is rank r's GPU.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// How the ranks were placed on the topology (by PCI address, as-if, or not at all).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// What `ce-ring` puts on the wire here (`TPAR_WIRE`; exact unless set).
    pub fn wire(&self) -> crate::kinds::Wire {
        self.overrides.wire.unwrap_or_default()
    }

    /// The islands `hierarchical` reduces over (normalised: members in rank order, islands
    /// by first rank): the topology's, when they partition the ranks; else one island.
    pub fn islands(&self) -> Vec<Vec<usize>> {
        islands_for(&self.topology, self.world())
    }

    /// Makes the calls enqueued from now on wait for the work enqueued so far on the caller's
    /// `stream` (for example the kernel that writes the input). Nothing waits on the host, and
    /// it can be captured into a CUDA graph together with the calls. `stream` is a raw
    /// `CUstream` handle as an integer (what `torch.cuda.current_stream().cuda_stream` gives).
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's device (or 0, the legacy stream).
    pub unsafe fn wait_for(&mut self, stream: u64) -> Result<()> {
        self.ws.device().bind()?;
        // SAFETY: the caller vouches for `stream`; our stream is live.
        unsafe {
            self.after_caller.record_on(stream as super::driver::sys::CUstream)?;
            self.after_caller.wait_on(self.ws.stream().raw)
        }
    }

    /// Makes the work enqueued from now on on the caller's `stream` wait for the calls
    /// enqueued so far (for example the kernel that reads the output). As
    /// [`wait_for`](Self::wait_for), the other direction.
    ///
    /// # Safety
    /// As for [`wait_for`](Self::wait_for).
    pub unsafe fn signal_to(&mut self, stream: u64) -> Result<()> {
        self.ws.device().bind()?;
        // SAFETY: as above.
        unsafe {
            self.after_calls.record_on(self.ws.stream().raw)?;
            self.after_calls.wait_on(stream as super::driver::sys::CUstream)
        }
    }

    /// Whether NCCL joined, or why not.
    pub fn nccl_status(&self) -> std::result::Result<(), &str> {
        self.nccl.as_ref().map(|_| ()).map_err(|s| s.as_str())
    }

    /// The plan's decision for an all-reduce of `bytes` of `dtype` in `mode` (logged once
    /// under `TPAR_DEBUG=INFO`), from this communicator's memo.
    pub fn plan(&mut self, dtype: DType, bytes: usize, mode: CaptureMode) -> Arc<Plan> {
        self.plan_for(Collective::AllReduce, dtype, bytes, mode)
    }

    /// The plan's decision for `collective` of `bytes` per rank (as
    /// [`Collective::io_elems`] counts them) of `dtype` in `mode`, from this communicator's memo.
    pub fn plan_for(&mut self, collective: Collective, dtype: DType, bytes: usize, mode: CaptureMode) -> Arc<Plan> {
        // The memo is taken out for the call: the input borrows the rest of `self`.
        let mut plans = std::mem::take(&mut self.plans);
        let mut p = plans.get_for(collective, &self.plan_input(dtype, bytes, mode));
        self.plans = plans;
        if let (Err(why), NcclUse::Own) = (&self.nccl, self.nccl_use) {
            if let Some(k) = p.without_nccl(why, self.ws.transport()) {
                p = Arc::new(k);
            }
        }
        match self.rejected.iter().find(|r| r.collective == collective && r.algorithm == p.algorithm) {
            None => p,
            Some(r) => Arc::new(Plan {
                algorithm: Algorithm::Nccl,
                transport: Transport::Nccl,
                blocks: 0,
                reason: format!("{} failed this machine's bit-exact screen ({r}): NCCL (the plan said: {})", p.algorithm, p.reason),
                predicted_us: p.nccl_us,
                nccl_us: p.nccl_us,
                source: p.nccl_source,
                nccl_source: p.nccl_source,
                bound_us: None,
                instead_of: None,
            }),
        }
    }

    /// What the plan decides from for `bytes` (per rank) of `dtype` in `mode` here.
    fn plan_input(&self, dtype: DType, bytes: usize, mode: CaptureMode) -> PlanInput<'_> {
        PlanInput {
            topology: &self.topology,
            world: self.control.world(),
            bytes: bytes as u64,
            dtype,
            capture: mode,
            backend: Backend::Cuda,
            profile: self.profiles[mode_index(mode)].as_ref(),
            overrides: &self.overrides,
        }
    }

    /// The all-reduce of `bytes` of `dtype` in `mode`, resolved once (plan, gate, launch
    /// shape) and remembered. An error here (a refusal that names why) is not remembered.
    pub fn resolve(&mut self, dtype: DType, bytes: usize, mode: CaptureMode) -> Result<Arc<Resolved>> {
        self.resolve_for(Collective::AllReduce, dtype, bytes, mode)
    }

    /// As [`resolve`](Self::resolve), for `collective` of `bytes` per rank.
    pub fn resolve_for(&mut self, collective: Collective, dtype: DType, bytes: usize, mode: CaptureMode) -> Result<Arc<Resolved>> {
        let key = (collective, dtype, bytes as u64, mode);
        if let Some(r) = self.resolved.get(&key) {
            return Ok(Arc::clone(r));
        }
        let plan = self.plan_for(collective, dtype, bytes, mode);
        let route = self.route_of(&plan, collective, dtype, bytes)?;
        if self.resolved.len() >= RESOLVED_MAX {
            self.resolved.clear();
        }
        let r = Arc::new(Resolved { plan, route, collective });
        self.resolved.insert(key, Arc::clone(&r));
        Ok(r)
    }

    /// Where a call of `bytes` of `dtype` in `mode` goes: what an engine asks before it
    /// hands a call over (`should_custom_ar`). Memoised with the resolution.
    pub fn route(&mut self, dtype: DType, bytes: usize, mode: CaptureMode) -> Result<Route> {
        self.resolve(dtype, bytes, mode).map(|r| r.route)
    }

    fn route_of(&mut self, plan: &Plan, collective: Collective, dtype: DType, bytes: usize) -> Result<Route> {
        let refused = |reason: String| Error::Unsupported { what: format!("{} over {} ({})", plan.algorithm, plan.transport, plan.reason), reason };
        match plan.algorithm {
            Algorithm::Nccl => match (&self.nccl, self.nccl_use) {
                (Ok(_), _) => Ok(Route::Nccl),
                (Err(_), NcclUse::Caller) => Ok(Route::Caller),
                (Err(why), NcclUse::Own) => Err(Error::Unsupported { what: format!("the plan's choice of NCCL ({})", plan.reason), reason: format!("NCCL did not join: {why}") }),
            },
            Algorithm::OneshotPush
            | Algorithm::OneshotPull
            | Algorithm::TwoshotPush
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast
            | Algorithm::CeRing => {
                // The registry is the gate: the plan only picks what it accepts, and a forced
                // algorithm it refuses is an error naming why, never a launch of nothing.
                registry::runnable(plan.algorithm, Backend::Cuda, plan.transport).map_err(refused)?;
                registry::computes(plan.algorithm, collective).map_err(refused)?;
                if plan.transport != self.ws.transport() {
                    return Err(refused(format!(
                        "this communicator's workspaces are {} memory (set TPAR_TRANSPORT at init to choose: host, or p2p where the GPUs reach each other)",
                        if self.ws.transport() == Transport::Host { "shared host" } else { "device" }
                    )));
                }
                if bytes == 0 {
                    // Nothing moves; every rank returns at once (see `submit`).
                    return Ok(Route::Kernel { algorithm: plan.algorithm, launch: Launch::none(), desc_code: 0 });
                }
                let desc_code = super::abi::collective_desc_code(plan.algorithm, dtype, collective);
                if plan.algorithm == Algorithm::CeRing {
                    self.ws.ce_prepare(dtype, bytes)?;
                    return Ok(Route::CopyEngine { desc_code });
                }
                let launch = self.ws.resolve_collective(collective, plan.algorithm, dtype, bytes, plan.blocks)?;
                Ok(Route::Kernel { algorithm: plan.algorithm, launch, desc_code })
            }
        }
    }

    /// Enqueues one call ([`Call`]: the collective, dtype and count, the buffers, the capture
    /// mode, the stream, a forced algorithm, where the plan's NCCL calls go) and says what
    /// ran: [`Served::Ran`] with the algorithm, or [`Served::ToCaller`] where the call is the
    /// caller's NCCL to run (only under [`NcclCalls::CallersIfNone`] or
    /// [`NcclCalls::Callers`]: never a silent no-op). The one entry for every collective,
    /// eager or captured, on this communicator's stream or the caller's. Every rank must make
    /// the same calls in the same order.
    ///
    /// Resolution is memoised per (collective, dtype, bytes, mode); a forced algorithm
    /// (benchmarks, comparisons with NCCL in the same run) replaces the plan's pick and is
    /// resolved the same way (the block count then the launch policy's). On the caller's
    /// stream no event pair ([`wait_for`](Self::wait_for) / [`signal_to`](Self::signal_to)) is
    /// needed: the call runs after the work enqueued there before and before the work
    /// enqueued after, inside and outside CUDA graph capture, and
    /// [`synchronize`](Self::synchronize) then only reads the kernels' error records.
    ///
    /// # Safety
    /// `input` and `output` must be device pointers on this rank's GPU, 16-byte aligned,
    /// valid for the collective's input and output ([`Collective::io_elems`] of `count`
    /// elements of `dtype`) until the stream's work completes. An all-reduce's `output` may
    /// equal its `input`; an all-gather's or reduce-scatter's never overlaps it. The input
    /// must be complete when the call runs: on [`stream`](Self::stream), enqueue the work
    /// that writes it there or [`wait_for`](Self::wait_for) the stream it runs on (that
    /// stream is non-blocking, so it does not wait for the legacy default stream). `stream`,
    /// where given, must be a live stream of this rank's device (or 0, the legacy stream).
    pub unsafe fn call(&mut self, c: &Call) -> Result<Served> {
        let bytes = c.count.saturating_mul(c.dtype.size());
        let r = match c.algorithm {
            None => self.resolve_for(c.collective, c.dtype, bytes, c.mode)?,
            Some(algo) => {
                let planned = self.plan_for(c.collective, c.dtype, bytes, c.mode);
                if planned.algorithm == algo {
                    self.resolve_for(c.collective, c.dtype, bytes, c.mode)?
                } else {
                    let p = planned.replaced(algo, self.transport(), format!("forced by the caller (the plan said {}: {})", planned.algorithm, planned.reason));
                    let route = self.route_of(&p, c.collective, c.dtype, bytes)?;
                    Arc::new(Resolved { plan: Arc::new(p), route, collective: c.collective })
                }
            }
        };
        match (r.route, c.nccl) {
            (Route::Caller, NcclCalls::CallersIfNone | NcclCalls::Callers) | (Route::Nccl, NcclCalls::Callers) => return Ok(Served::ToCaller),
            _ => {}
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.submit(c, &r) }.map(Served::Ran)
    }

    /// Runs `c` as resolved by `r`: on `c.stream` (the caller's) or this communicator's own.
    ///
    /// # Safety
    /// As for [`call`](Self::call).
    unsafe fn submit(&mut self, c: &Call, r: &Resolved) -> Result<Algorithm> {
        let Call { dtype, count, input, output, mode, stream, .. } = *c;
        self.ws.check_poisoned()?;
        if let Some(peer) = self.watchdog.dead_peer() {
            let e = Error::PeerDied { rank: self.rank(), peer, during: "an earlier call (seen by this rank's liveness watchdog)".into() };
            self.ws.poison(e.to_string());
            return Err(e);
        }
        if count == 0 {
            return Ok(r.algorithm());
        }
        self.ws.device().bind()?;
        let recorded = match (&mut self.captured, mode) {
            (Some(seq), CaptureMode::Graph) => {
                seq.push(super::abi::pack_call(count, super::abi::collective_desc_code(r.algorithm(), dtype, r.collective)));
                true
            }
            _ => false,
        };
        match r.route {
            Route::Caller => Err(Error::Unsupported {
                what: format!("the plan's choice of NCCL ({})", r.plan.reason),
                reason: "this communicator joined no NCCL (NcclUse::Caller): the caller runs these calls on its own NCCL (route() says which)".into(),
            }),
            Route::Nccl => {
                let Ok(n) = &self.nccl else {
                    return Err(Error::Unsupported { what: "NCCL".into(), reason: "not joined".into() });
                };
                let s = stream.unwrap_or(self.ws.stream().raw as u64);
                // SAFETY: the caller's contract on input/output/stream is NCCL's; our own
                // stream is live.
                unsafe { n.collective_raw(r.collective, input, output, count, dtype, s) }.map(|()| Algorithm::Nccl)
            }
            Route::Kernel { desc_code, .. } | Route::CopyEngine { desc_code } => {
                let desc = if recorded || !self.check_calls { 0 } else { desc_code };
                let own = stream.map(|s| {
                    // SAFETY: the caller vouches for `s`; it is swapped back below, and
                    // launch_resolved neither panics nor drops the workspace.
                    unsafe { self.ws.swap_stream(s as super::driver::sys::CUstream) }
                });
                let res = match r.route {
                    Route::Kernel { launch, .. } => self.ws.launch_resolved(&launch, desc, count, &[input], &[output]),
                    _ => self.ws.ce_launch(dtype, count, &[input], &[output], &[true], desc),
                };
                if let Some(own) = own {
                    // SAFETY: `own` is this workspace's own live stream, swapped out above.
                    unsafe { self.ws.swap_stream(own) };
                }
                res.map(|()| r.algorithm())
            }
        }
    }

    /// Control plane: every rank's bytes to every rank.
    pub fn all_gather_bytes(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.control.all_gather_bytes(payload)
    }

    /// Control plane: every rank's bytes to rank 0 (`None` on the other ranks).
    pub fn gather_bytes(&mut self, payload: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.control.gather_bytes(payload)
    }

    /// Host-side barrier over the control plane (ranks agree before freeing buffers).
    pub fn barrier(&mut self) -> Result<()> {
        self.ws.check_poisoned()?;
        self.control.barrier()
    }
}

/// The topology's islands over ranks `0..world`, normalised; one island when they do not
/// partition the ranks (a world past the topology's GPUs).
pub(super) fn islands_for(t: &Topology, world: usize) -> Vec<Vec<usize>> {
    crate::algorithms::hierarchical::normalize(&t.islands_of(world), world).unwrap_or_else(|_| vec![(0..world).collect()])
}

pub(super) fn as_u32(islands: &[Vec<usize>]) -> Vec<Vec<u32>> {
    islands.iter().map(|i| i.iter().map(|&r| r as u32).collect()).collect()
}
