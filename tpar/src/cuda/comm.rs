//! [`GpuCommunicator`]: one rank per process, one GPU per rank — how inference engines run.
//!
//! The setup chain is explicit: rendezvous (tpar's validated Unix socket, used here as the
//! control plane only) -> this rank's workspace (`cuMemAlloc`) -> every peer's workspace
//! mapped through CUDA IPC handles carried by the control plane -> NCCL joined over the same
//! rendezvous when it can be -> per call, the plan. Ranks must agree on the plan's inputs
//! (topology, profile, overrides): their digest salts the rendezvous fingerprint, so a rank
//! that would plan differently is refused at init.
//!
//! Owns: the dispatch from a plan decision to a kernel, an NCCL call, or an error. Must never
//! launch nothing: every decision the plan can make is matched here, and the ones with no
//! kernel yet (`hierarchical`) or no NCCL available are errors naming the way out.

use super::abi::MAX_BLOCKS;
use super::driver::{Event, Stream};
use super::fused::{FusedBufs, FusedCall, FusedPath};
use super::ipc::IpcWorkspace;
use super::nccl::{self, NcclComm};
use crate::algorithms::registry;
use crate::comm::Config;
use crate::control::{ControlPlane, NoDataPlane};
use crate::rendezvous::JoinSpec;
use crate::error::{Error, Result};
use crate::plan::cache::PlanCache;
use crate::plan::{plan_fingerprint, plan_logged, Backend, CaptureMode, Overrides, Plan, PlanInput};
use std::sync::{Arc, Mutex};
use crate::profile::Profile;
use crate::topology::Topology;
use crate::{Algorithm, DType, Transport};
use std::time::{Duration, Instant};

/// How often [`GpuCommunicator::synchronize`] asks whether a peer process died.
const LIVENESS_PERIOD: Duration = Duration::from_millis(10);
/// How long a dead peer's work may still complete before the wait is abandoned (a peer that
/// finished its part and exited is not a failure).
const DEAD_PEER_GRACE: Duration = Duration::from_millis(200);
/// Beyond the device-side deadline, so that a kernel's own timeout (which names the peer and
/// phase) is what the caller sees when it can be.
const HOST_GRACE: Duration = Duration::from_secs(1);

/// Where and how large a rank's GPU workspace is.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// CUDA ordinal; default: rank modulo the number of GPUs in the topology.
    pub device: Option<usize>,
    /// Largest message tpar's kernels take; larger ones go to NCCL (the plan says so).
    pub max_bytes: usize,
    /// The fabric to plan for; default: discovered through NVML.
    pub topology: Option<Topology>,
}

/// One rank of a multi-process GPU group.
pub struct GpuCommunicator {
    control: ControlPlane,
    ws: IpcWorkspace,
    nccl: std::result::Result<NcclComm, String>,
    topology: Topology,
    overrides: Overrides,
    profile: Option<Profile>,
    capture: CaptureMode,
    /// Orders this communicator's stream after a caller's stream ([`Self::wait_for`]).
    after_caller: Event,
    /// Orders a caller's stream after this communicator's calls ([`Self::signal_to`]).
    after_calls: Event,
    /// Bound on any wait (`Config::timeout`).
    timeout: Duration,
    /// Decisions already made (eager calls do not re-plan).
    plans: Mutex<PlanCache>,
    /// Whether calls are checked across ranks (TPAR_CHECK_CALLS, on by default).
    check_calls: bool,
    /// Between [`begin_capture_check`](Self::begin_capture_check) and
    /// [`end_capture_check`](Self::end_capture_check): every call captured in graph mode,
    /// `count << 8 | desc_code` (the call as the kernels' descriptors would announce it).
    /// Those kernels run with no descriptor; the sequences are compared over the control
    /// plane when the capture ends.
    captured: Option<Vec<u64>>,
}

impl GpuCommunicator {
    /// Joins the job of `cfg` on this process's GPU.
    pub fn init(cfg: &Config, opts: &GpuOptions) -> Result<GpuCommunicator> {
        cfg.validate()?;
        let topology = match &opts.topology {
            Some(t) => t.clone(),
            None => Topology::discover(),
        };
        if opts.max_bytes == 0 {
            return Err(Error::invalid("max_bytes", "must be positive"));
        }
        // Messages above the workspace go to NCCL, by the plan's own TPAR_MAX_BYTES rule.
        let mut overrides = cfg.overrides.clone();
        let cap = opts.max_bytes as u64;
        overrides.max_bytes = Some(overrides.max_bytes.map_or(cap, |m| m.min(cap)));
        overrides.validate(&topology, cfg.world, Backend::Cuda)?;
        let profile = match &overrides.profile {
            Some(p) => Some(Profile::load(p)?),
            None => None,
        };
        // The control plane alone (no CPU workspace): rendezvous, gather/broadcast, liveness.
        let fingerprint = cfg.fingerprint ^ plan_fingerprint(&topology, profile.as_ref(), &overrides);
        let (mut control, _) = ControlPlane::join::<NoDataPlane>(&JoinSpec { fingerprint, ..cfg.join_spec() })?;
        let device = opts.device.unwrap_or(cfg.rank % topology.gpu_count().max(1));
        let transport = kernel_transport(&topology, cfg.world, &overrides);
        let mut ws = IpcWorkspace::with_transport(device, cfg.rank, cfg.world, opts.max_bytes, DType::BF16, cfg.timeout, transport, overrides.host_protocol, cfg.job_id)?;
        let blobs = control.all_gather_bytes(&ws.handle_blob()?)?;
        ws.connect(&blobs)?;
        // Every rank has mapped the workspaces: the host segment's name can go.
        control.barrier()?;
        ws.all_attached()?;
        // The setting is in the plan digest, so every rank that got this far has the same.
        let check_calls = overrides.check_calls != Some(false);
        ws.set_check_calls(check_calls);
        // The topology is in the plan digest too: every rank labels the same islands. Islands
        // that do not cover the ranks (a world past the topology's GPUs) run as one.
        ws.set_islands(crate::algorithms::hierarchical::island_word(&as_u32(&islands_for(&topology, cfg.world)), cfg.world).unwrap_or(0));
        let nccl = nccl::init_over_rendezvous(&mut control, ws.device()).map_err(|e| e.to_string());
        let after_caller = Event::ordering(ws.device())?;
        let after_calls = Event::ordering(ws.device())?;
        Ok(GpuCommunicator {
            after_caller,
            after_calls,
            timeout: cfg.timeout,
            control,
            ws,
            nccl,
            topology,
            overrides,
            profile,
            capture: CaptureMode::Eager,
            plans: Mutex::new(PlanCache::default()),
            check_calls,
            captured: None,
        })
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

    /// The fabric the plan decides for.
    pub fn topology(&self) -> &Topology {
        &self.topology
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

    /// Tells the plan whether calls are being captured into a CUDA graph.
    pub fn set_capture_mode(&mut self, capture: CaptureMode) {
        self.capture = capture;
    }

    /// Starts a checked capture: from now until [`end_capture_check`](Self::end_capture_check),
    /// calls made in graph mode ([`set_capture_mode`](Self::set_capture_mode)) are recorded
    /// on the host and launched without a per-call descriptor (the kernels then skip the
    /// descriptor exchange); eager calls in between keep theirs. Every rank must bracket the
    /// same capture. Without this bracket, captured calls carry descriptors as eager ones do.
    pub fn begin_capture_check(&mut self) -> Result<()> {
        self.ws.check_poisoned()?;
        if self.captured.is_some() {
            return Err(Error::invalid("capture", "begin_capture_check called twice without end_capture_check"));
        }
        if self.check_calls {
            self.captured = Some(Vec::new());
        }
        Ok(())
    }

    /// Ends a checked capture: every rank's captured call sequence is compared over the
    /// control plane (a 16-byte digest; the sequences themselves only when digests differ).
    /// Returns how many calls this rank captured. When the ranks differ, every rank gets
    /// `Error::Mismatch` naming the first differing call, and the communicator is poisoned
    /// (the captured graph must not be replayed: its kernels carry no descriptor to catch it).
    pub fn end_capture_check(&mut self) -> Result<usize> {
        self.ws.set_check_calls(self.check_calls);
        let Some(seq) = self.captured.take() else {
            self.ws.check_poisoned()?;
            return Ok(0);
        };
        let digest = |s: &[u64]| {
            let bytes: Vec<u8> = s.iter().flat_map(|c| c.to_le_bytes()).collect();
            crate::units::fnv1a64(&bytes)
        };
        let mut mine = Vec::with_capacity(16);
        mine.extend_from_slice(&(seq.len() as u64).to_le_bytes());
        mine.extend_from_slice(&digest(&seq).to_le_bytes());
        let all = self.control.all_gather_bytes(&mine)?;
        if all.iter().all(|d| *d == mine) {
            return Ok(seq.len());
        }
        let bytes: Vec<u8> = seq.iter().flat_map(|c| c.to_le_bytes()).collect();
        let seqs: Vec<Vec<u64>> = self
            .control
            .all_gather_bytes(&bytes)?
            .iter()
            .map(|b| b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
            .collect();
        let e = match super::abi::first_captured_difference(&seqs) {
            Some(d) => super::abi::captured_mismatch(self.rank(), &seqs, d),
            None => Error::invalid("capture", "the captured sequences' digests differ but their calls do not"),
        };
        self.ws.poison(e.to_string());
        Err(e)
    }

    /// The decision for `bytes` of `dtype` (logged once under `TPAR_DEBUG=INFO`).
    pub fn plan(&self, dtype: DType, bytes: usize) -> Plan {
        (*self.cached_plan(dtype, bytes)).clone()
    }

    /// [`plan`](Self::plan) from this communicator's memo (`plan::cache`): one decision per
    /// (dtype, size, capture mode), shared, so an eager call does not re-plan (nor format a
    /// reason). What bindings pass to [`all_reduce_on`](Self::all_reduce_on).
    pub fn cached_plan(&self, dtype: DType, bytes: usize) -> Arc<Plan> {
        let input = PlanInput {
            topology: &self.topology,
            world: self.control.world(),
            bytes: bytes as u64,
            dtype,
            capture: self.capture,
            backend: Backend::Cuda,
            profile: self.profile.as_ref(),
            overrides: &self.overrides,
        };
        match self.plans.lock() {
            Ok(mut c) => c.get(&input),
            // A poisoned lock only means a panic elsewhere mid-insert; plan afresh.
            Err(_) => Arc::new(plan_logged(&input)),
        }
    }

    /// Enqueues a sum all-reduce of `count` elements on [`stream`](Self::stream) and returns
    /// the algorithm the plan chose. Every rank must make the same calls in the same order.
    ///
    /// # Safety
    /// `input` and `output` must be device pointers on this rank's GPU, 16-byte aligned,
    /// valid for `count` elements of `dtype` until the stream's work completes (`output` may
    /// equal `input`). The input must be complete when the call runs on
    /// [`stream`](Self::stream): enqueue the work that writes it there, or call
    /// [`wait_for`](Self::wait_for) with the stream it runs on. The stream is non-blocking,
    /// so it does not wait for the legacy default stream (a plain `cuMemcpyHtoD` from
    /// pageable memory may still be landing when it returns).
    pub unsafe fn all_reduce(&mut self, dtype: DType, count: usize, input: u64, output: u64) -> Result<Algorithm> {
        let p = self.cached_plan(dtype, count.saturating_mul(dtype.size()));
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.dispatch(&p, dtype, count, input, output) }
    }

    /// Enqueues the decision `p` (from [`plan`](Self::plan), which a caller may cache per
    /// dtype, size and capture mode) directly on the caller's `stream`: no event pair
    /// ([`wait_for`](Self::wait_for) / [`signal_to`](Self::signal_to)) is needed, since the
    /// kernel (or NCCL) runs after the work enqueued there before and before the work
    /// enqueued after. What framework bindings use (PyTorch's current stream), inside and
    /// outside CUDA graph capture. [`synchronize`](Self::synchronize) then only reads the
    /// kernels' error records: to wait for the calls themselves, [`wait_for`](Self::wait_for)
    /// the caller's stream first.
    ///
    /// # Safety
    /// As for [`all_reduce`](Self::all_reduce), and `stream` must be a live stream of this
    /// rank's device (or 0, the legacy stream).
    pub unsafe fn all_reduce_on(&mut self, stream: u64, p: &Plan, dtype: DType, count: usize, input: u64, output: u64) -> Result<Algorithm> {
        // SAFETY: the caller vouches for `stream`; it is swapped back before returning, and
        // `dispatch` neither panics nor drops the workspace.
        let own = unsafe { self.ws.swap_stream(stream as super::driver::sys::CUstream) };
        // SAFETY: the caller's contract is passed on unchanged.
        let r = unsafe { self.dispatch(p, dtype, count, input, output) };
        // SAFETY: `own` is this workspace's own live stream, swapped out above.
        unsafe { self.ws.swap_stream(own) };
        r
    }

    /// As [`all_reduce`](Self::all_reduce) with `algo` forced (benchmarks, comparisons with
    /// NCCL in the same run). The forced algorithm still goes through the same dispatch.
    ///
    /// # Safety
    /// As for [`all_reduce`](Self::all_reduce).
    pub unsafe fn all_reduce_with(&mut self, algo: Algorithm, dtype: DType, count: usize, input: u64, output: u64) -> Result<Algorithm> {
        let mut p = self.plan(dtype, count.saturating_mul(dtype.size()));
        if p.algorithm != algo {
            p.reason = format!("forced by the caller (the plan said {}: {})", p.algorithm, p.reason);
            p.algorithm = algo;
            p.transport = if algo == Algorithm::Nccl { Transport::Nccl } else { self.transport() };
            if p.blocks == 0 {
                p.blocks = super::launch::blocks_for(algo, p.transport, count.saturating_mul(dtype.size()), self.world());
            }
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.dispatch(&p, dtype, count, input, output) }
    }

    /// Enqueues a fused all-reduce + residual add + RMSNorm on [`stream`](Self::stream)
    /// (docs/cuda.md "Fused"): the sum of every rank's `bufs.input` in rank order, rounded
    /// once; `residual_out = round(sum + residual)`; `norm_out = round((residual_out *
    /// inv_rms) * weight)` per row, with the fixed-order sum of squares. The plan for the
    /// message (x's bytes) decides the algorithm; its fused kernel runs where it takes the
    /// call (`fused::fused_unfit`), else the unfused path (that algorithm's all-reduce, or
    /// NCCL, into `norm_out`, then tpar's add-RMSNorm kernel in place): the same bits.
    /// Returns the path taken. `residual` and `weight` must be the same on every rank.
    ///
    /// # Safety
    /// As for [`all_reduce`](Self::all_reduce), for every buffer of `bufs` (x, the residual
    /// and both outputs `call.count()` elements, the weight `call.hidden`).
    pub unsafe fn all_reduce_add_rmsnorm(&mut self, call: &FusedCall, bufs: &FusedBufs) -> Result<FusedPath> {
        let p = self.cached_plan(call.dtype, call.bytes());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.dispatch_fused(&p, call, bufs, false) }
    }

    /// As [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm), with the plan `p` (for
    /// x's bytes), directly on the caller's `stream` (as [`all_reduce_on`](Self::all_reduce_on)).
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm), and `stream` must be a
    /// live stream of this rank's device (or 0, the legacy stream).
    pub unsafe fn all_reduce_add_rmsnorm_on(&mut self, stream: u64, p: &Plan, call: &FusedCall, bufs: &FusedBufs) -> Result<FusedPath> {
        // SAFETY: as in all_reduce_on: swapped back before returning.
        let own = unsafe { self.ws.swap_stream(stream as super::driver::sys::CUstream) };
        // SAFETY: the caller's contract is passed on unchanged.
        let r = unsafe { self.dispatch_fused(p, call, bufs, false) };
        // SAFETY: `own` is this workspace's own live stream, swapped out above.
        unsafe { self.ws.swap_stream(own) };
        r
    }

    /// As [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm) with `algo` forced, and
    /// with `unfused` the unfused path even where a fused kernel would take the call
    /// (benchmarks: the fused kernel against the all-reduce followed by the add-RMSNorm).
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm).
    pub unsafe fn all_reduce_add_rmsnorm_with(&mut self, algo: Algorithm, call: &FusedCall, bufs: &FusedBufs, unfused: bool) -> Result<FusedPath> {
        let mut p = self.plan(call.dtype, call.bytes());
        if p.algorithm != algo {
            p.reason = format!("forced by the caller (the plan said {}: {})", p.algorithm, p.reason);
            p.algorithm = algo;
            p.transport = if algo == Algorithm::Nccl { Transport::Nccl } else { self.transport() };
            if p.blocks == 0 {
                p.blocks = super::launch::blocks_for(algo, p.transport, call.bytes(), self.world());
            }
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.dispatch_fused(&p, call, bufs, unfused) }
    }

    /// tpar's add-RMSNorm kernel alone (no communication) on the caller's `stream`: for a
    /// caller whose all-reduce ran elsewhere (the plan said NCCL and the caller ran its own).
    /// x = `bufs.input`; in place when `norm_out == input`.
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm_on`](Self::all_reduce_add_rmsnorm_on).
    pub unsafe fn add_rmsnorm_on(&mut self, stream: u64, call: &FusedCall, bufs: &FusedBufs) -> Result<()> {
        self.ws.check_poisoned()?;
        // SAFETY: as in all_reduce_on: swapped back before returning.
        let own = unsafe { self.ws.swap_stream(stream as super::driver::sys::CUstream) };
        let r = self.ws.enqueue_add_rmsnorm(call, bufs);
        // SAFETY: `own` is this workspace's own live stream, swapped out above.
        unsafe { self.ws.swap_stream(own) };
        r
    }

    /// # Safety
    /// As for [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm).
    unsafe fn dispatch_fused(&mut self, p: &Plan, call: &FusedCall, bufs: &FusedBufs, unfused: bool) -> Result<FusedPath> {
        self.ws.check_poisoned()?;
        call.validate()?;
        bufs.check(call)?;
        let kernel = !unfused
            && super::kernels::has_fused_variant(p.algorithm)
            && registry::runnable(p.algorithm, Backend::Cuda, p.transport).is_ok()
            && p.transport == self.ws.transport()
            && self.ws.fused_unfit(p.algorithm, call).is_none();
        if kernel {
            let recorded = match (&mut self.captured, self.capture) {
                (Some(seq), CaptureMode::Graph) => {
                    seq.push(super::abi::pack_call(call.count(), super::abi::fused_desc_code(p.algorithm, call.dtype)));
                    true
                }
                _ => false,
            };
            self.ws.set_check_calls(self.check_calls && !recorded);
            self.ws.enqueue_fused(p.algorithm, call, bufs, p.blocks.clamp(1, MAX_BLOCKS as u32))?;
            return Ok(FusedPath::Fused(p.algorithm));
        }
        // SAFETY: the caller's contract covers x and norm_out for count elements.
        let algo = unsafe { self.dispatch(p, call.dtype, call.count(), bufs.input, bufs.norm_out) }?;
        self.ws.enqueue_add_rmsnorm(call, &FusedBufs { input: bufs.norm_out, ..*bufs })?;
        Ok(FusedPath::Unfused(algo))
    }

    /// # Safety
    /// As for [`all_reduce`](Self::all_reduce).
    unsafe fn dispatch(&mut self, p: &Plan, dtype: DType, count: usize, input: u64, output: u64) -> Result<Algorithm> {
        self.ws.check_poisoned()?;
        if count == 0 {
            return Ok(p.algorithm);
        }
        match p.algorithm {
            Algorithm::Nccl => match &self.nccl {
                Ok(n) => {
                    if let (Some(seq), CaptureMode::Graph) = (&mut self.captured, self.capture) {
                        seq.push(super::abi::pack_call(count, super::abi::desc_code(Algorithm::Nccl, dtype)));
                    }
                    // SAFETY: the caller's contract on input/output is NCCL's.
                    unsafe { n.all_reduce(input, output, count, dtype, self.ws.stream()) }.map(|()| Algorithm::Nccl)
                }
                Err(why) => Err(Error::Unsupported {
                    what: format!("the plan's choice of NCCL ({})", p.reason),
                    reason: format!("NCCL did not join: {why}"),
                }),
            },
            Algorithm::OneshotPush
            | Algorithm::OneshotPull
            | Algorithm::TwoshotPush
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast => {
                // The registry is the gate: the plan only picks what it accepts, and a forced
                // algorithm it refuses is an error naming why, never a launch of nothing.
                registry::runnable(p.algorithm, Backend::Cuda, p.transport).map_err(|reason| Error::Unsupported {
                    what: format!("{} over {} ({})", p.algorithm, p.transport, p.reason),
                    reason,
                })?;
                if p.transport != self.ws.transport() {
                    return Err(Error::Unsupported {
                        what: format!("{} over {} ({})", p.algorithm, p.transport, p.reason),
                        reason: format!(
                            "this communicator's workspaces are {} memory (set TPAR_TRANSPORT at init to choose: host, or p2p where the GPUs reach each other)",
                            if self.ws.transport() == Transport::Host { "shared host" } else { "device" }
                        ),
                    });
                }
                let blocks = p.blocks.clamp(1, MAX_BLOCKS as u32);
                // A checked capture records the call on the host instead of a descriptor.
                let recorded = match (&mut self.captured, self.capture) {
                    (Some(seq), CaptureMode::Graph) => {
                        seq.push(super::abi::pack_call(count, super::abi::desc_code(p.algorithm, dtype)));
                        true
                    }
                    _ => false,
                };
                self.ws.set_check_calls(self.check_calls && !recorded);
                self.ws.enqueue(p.algorithm, dtype, count, input, output, blocks)?;
                Ok(p.algorithm)
            }
        }
    }

    /// Waits for this rank's enqueued work; never longer than the timeout (plus a second).
    ///
    /// tpar's kernels bound their own waits on the device (a timeout there is
    /// `Error::Timeout` naming the peer and phase). NCCL's do not: a peer that died mid-call
    /// would leave this stream waiting forever. So the host bounds the wait too: a peer
    /// whose process is gone (and whose work does not complete within 200 ms after) is
    /// `Error::PeerDied`, no completion by the deadline is `Error::Timeout`; either aborts
    /// NCCL (its kernels return) and poisons the communicator.
    pub fn synchronize(&mut self) -> Result<()> {
        let start = Instant::now();
        let deadline = start + self.timeout + HOST_GRACE;
        let mut next_liveness = start + LIVENESS_PERIOD;
        let mut suspect: Option<(usize, Instant)> = None;
        let mut polls = 0u32;
        while !self.ws.stream().is_done()? {
            let now = Instant::now();
            if now >= next_liveness {
                next_liveness = now + LIVENESS_PERIOD;
                match (suspect, self.control.dead_peer()) {
                    (None, Some(p)) => suspect = Some((p, now)),
                    (Some((peer, since)), _) if now.duration_since(since) >= DEAD_PEER_GRACE => {
                        let during = format!("this rank's work on its GPU stream ({} ms after the peer's process ended)", now.duration_since(since).as_millis());
                        return Err(self.abandon(Error::PeerDied { rank: self.rank(), peer, during }));
                    }
                    _ => {}
                }
            }
            if now >= deadline {
                let what = "this rank's GPU stream (tpar's kernels or NCCL) to finish; NCCL aborted".to_string();
                let waited_ms = now.duration_since(start).as_millis().min(u64::MAX as u128) as u64;
                return Err(self.abandon(Error::Timeout { rank: self.rank(), waited_ms, what }));
            }
            polls = polls.saturating_add(1);
            if polls < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.ws.synchronize()
    }

    /// Gives up on the work in flight: aborts NCCL so its kernels return, refuses further
    /// calls. tpar's own kernels end at their device deadline.
    fn abandon(&mut self, e: Error) -> Error {
        if let Ok(n) = &mut self.nccl {
            n.abort();
        }
        self.ws.poison(e.to_string());
        e
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
fn islands_for(t: &Topology, world: usize) -> Vec<Vec<usize>> {
    crate::algorithms::hierarchical::normalize(&t.islands_of(world), world).unwrap_or_else(|_| vec![(0..world).collect()])
}

fn as_u32(islands: &[Vec<usize>]) -> Vec<Vec<u32>> {
    islands.iter().map(|i| i.iter().map(|&r| r as u32).collect()).collect()
}

/// The transport of tpar's kernels for this communicator, fixed at init: `host` when the
/// settings force it or when the plan would use it (the ranks' GPUs cannot write each other
/// peer-to-peer), else `p2p`. It follows the plan's own rule (`plan::default_plan`, and
/// `feasibility::natural_transport` for profiles and forced algorithms), so every kernel
/// plan the plan makes here runs over it; its inputs are in the plan digest, so every rank
/// picks the same.
fn kernel_transport(topology: &Topology, world: usize, overrides: &Overrides) -> Transport {
    use crate::plan::feasibility::{transport_usable, Fabric};
    let f = Fabric::of(topology, world.max(1), Backend::Cuda);
    let host_ok = transport_usable(Transport::Host, &f).is_ok();
    match overrides.transport {
        Some(Transport::Host) => Transport::Host,
        Some(_) => Transport::P2p,
        None if host_ok && f.fits() && transport_usable(Transport::P2p, &f).is_err() => Transport::Host,
        None => Transport::P2p,
    }
}
