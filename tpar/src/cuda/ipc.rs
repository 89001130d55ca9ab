//! One rank of a multi-process CUDA group: this process's workspace, exported through CUDA
//! IPC, and its peers' workspaces opened from their handle bytes. The transport of those
//! bytes (the rendezvous) is the caller's: [`IpcWorkspace::handle_blob`] gives them,
//! [`IpcWorkspace::connect`] takes every rank's.
//!
//! Owns: this rank's data area and flag area (`cuMemAlloc`, so they can be exported), its
//! device-local epoch state, its host-visible error record, its stream, and the mappings of
//! the peers' areas. Must never refill the push region once connected (peers write into it
//! at any time); none is needed: the empty sentinel ([`abi::EMPTY_WORD`]) is the same word
//! for every dtype. Must not be dropped while a peer may still write into it: the caller
//! agrees on the end (a final barrier over the rendezvous) before dropping.
//!
//! With [`Transport::Host`] ([`IpcWorkspace::with_transport`]) the data and flag areas are
//! instead the job's shared host segment ([`super::host_ws`]): rank 0's handle blob is the
//! segment's welcome bytes, the others' are empty, `connect` maps and registers it, and
//! [`IpcWorkspace::all_attached`] (after a barrier) removes its name.

use super::abi::{self, TparArgs, TparError, TparFusedArgs, TparState, MAX_RANKS};
use super::fused::{fused_unfit, FusedBufs, FusedCall};
use super::driver::{Device, DeviceBuffer, HostMapped, IpcMapping, Stream};
use super::host_ws::HostWorkspace;
use super::launch::{self, CallSpec, Launch, Launcher};
use crate::error::{Error, Result};
use crate::plan::HostProtocol;
use crate::settings::LaunchSettings;
use crate::dtype::DType;
use crate::kinds::{Algorithm, Transport};
use std::time::Duration;

/// Bytes of one rank's handle blob: the data-area handle, then the flag-area handle.
pub const HANDLE_BLOB_BYTES: usize = 128;

/// Where this rank's data and flag areas live.
enum Areas {
    /// `cuMemAlloc`, exported through CUDA IPC (the p2p transport).
    Device { data: DeviceBuffer, flags: DeviceBuffer },
    /// The job's shared host segment (the host transport); `None` until `connect` on the
    /// ranks that attach.
    Host { job_id: u64, ws: Option<HostWorkspace>, welcome: Vec<u8> },
}

/// This process's rank of a CUDA IPC group.
pub struct IpcWorkspace {
    launcher: Launcher,
    peer_data: Vec<Option<IpcMapping>>,
    peer_flags: Vec<Option<IpcMapping>>,
    stream: Stream,
    areas: Areas,
    state: DeviceBuffer,
    err: HostMapped,
    data_ptrs: [u64; MAX_RANKS],
    flag_ptrs: [u64; MAX_RANKS],
    rank: usize,
    world: usize,
    slot_vecs: usize,
    timeout_ns: u64,
    connected: bool,
    poisoned: Option<String>,
    check_calls: bool,
    /// `TparArgs::islands` of every call (`set_islands`; 0: one island).
    islands: u64,
    /// The copy-engine path (`enable_ce`), where the registry runs it over this transport.
    ce: Option<super::ce::CeRank>,
    dev: Device,
}

impl IpcWorkspace {
    /// Allocates and initialises rank `rank`'s workspace on device `ordinal`, for calls of
    /// up to `max_bytes` of any dtype, over p2p with the default launch settings.
    pub fn new(ordinal: usize, rank: usize, world: usize, max_bytes: usize, timeout: Duration) -> Result<Self> {
        Self::with_transport(ordinal, rank, world, max_bytes, timeout, Transport::P2p, None, 0, LaunchSettings::default())
    }

    /// As [`new`](Self::new), over `transport`: `P2p` (device memory through CUDA IPC) or
    /// `Host` (the job's shared host segment, named after `job_id`; rank 0 creates it here),
    /// with the push kernels' `host_protocol` when forced (`None`: [`HostProtocol::auto`];
    /// every rank must pass the same: the plan digest carries it) and `launch` settings.
    #[allow(clippy::too_many_arguments)]
    pub fn with_transport(ordinal: usize, rank: usize, world: usize, max_bytes: usize, timeout: Duration, transport: Transport, host_protocol: Option<HostProtocol>, job_id: u64, launch: LaunchSettings) -> Result<Self> {
        if !matches!(transport, Transport::P2p | Transport::Host) {
            return Err(Error::Unsupported {
                what: format!("transport {transport} for tpar's kernels"),
                reason: "their workspaces are device memory (p2p) or shared host memory (host)".into(),
            });
        }
        if !(2..=MAX_RANKS).contains(&world) || rank >= world {
            return Err(Error::invalid("world", format!("rank {rank} of {world}: need 2 to {MAX_RANKS} ranks")));
        }
        if max_bytes == 0 {
            return Err(Error::invalid("max_bytes", "must be positive"));
        }
        let dev = Device::open(ordinal)?;
        let stream = Stream::new(&dev)?;
        // One rank per process: its kernels share the GPU with no other rank of this process.
        let launcher = Launcher::new(&dev, &stream, world, 1, transport, host_protocol, max_bytes, launch)?;
        let slot_vecs = abi::slot_vecs(max_bytes);
        // The state, then the fused calls' tile words (norm.cuh): zero-filled below, epoch 0.
        let state = DeviceBuffer::new(&dev, abi::state_bytes(slot_vecs))?;
        let err = HostMapped::new(&dev, std::mem::size_of::<TparError>())?;
        let word = abi::EMPTY_WORD;
        let mut data_ptrs = [0u64; MAX_RANKS];
        let mut flag_ptrs = [0u64; MAX_RANKS];
        let areas = if transport == Transport::Host {
            // Rank 0 creates every rank's areas, initialised (push regions empty, flags 0),
            // before any peer learns the name; the others map them in `connect`.
            if rank == 0 {
                let (ws, welcome) = HostWorkspace::create(&dev, job_id, rank, world, slot_vecs, word)?;
                for q in 0..world {
                    data_ptrs[q] = ws.data_ptr(q);
                    flag_ptrs[q] = ws.flag_ptr(q);
                }
                Areas::Host { job_id, ws: Some(ws), welcome }
            } else {
                Areas::Host { job_id, ws: None, welcome: Vec::new() }
            }
        } else {
            let data = DeviceBuffer::new(&dev, abi::data_bytes(world, slot_vecs))?;
            let flags = DeviceBuffer::new(&dev, abi::FLAG_BYTES)?;
            // The push region holds the sentinel, everything else zeroes, before any peer can
            // see this memory (handles are given out only after this).
            data.fill_u32(0)?;
            let push = abi::push_region_bytes(world, slot_vecs);
            data.fill_prefix_u32(push, word)?;
            flags.fill_u32(0)?;
            data_ptrs[rank] = data.ptr;
            flag_ptrs[rank] = flags.ptr;
            Areas::Device { data, flags }
        };
        state.fill_u32(0)?;
        state.upload(std::slice::from_ref(&TparState::at(0)))?;
        dev.synchronize()?;
        Ok(Self {
            launcher,
            peer_data: (0..world).map(|_| None).collect(),
            peer_flags: (0..world).map(|_| None).collect(),
            stream,
            areas,
            state,
            err,
            data_ptrs,
            flag_ptrs,
            rank,
            world,
            slot_vecs,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX).max(1),
            connected: false,
            poisoned: None,
            check_calls: true,
            islands: 0,
            ce: None,
            dev,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world(&self) -> usize {
        self.world
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The transport of this workspace's areas (p2p: device memory; host: shared host memory).
    pub fn transport(&self) -> Transport {
        match self.areas {
            Areas::Device { .. } => Transport::P2p,
            Areas::Host { .. } => Transport::Host,
        }
    }

    /// The bytes every peer needs to map this rank's workspace (send them over the rendezvous).
    /// Host transport: rank 0's are the shared segment's welcome, the others' are empty.
    pub fn handle_blob(&self) -> Result<Vec<u8>> {
        let (data, flags) = match &self.areas {
            Areas::Device { data, flags } => (data, flags),
            Areas::Host { welcome, .. } => return Ok(welcome.clone()),
        };
        let mut v = Vec::with_capacity(HANDLE_BLOB_BYTES);
        v.extend_from_slice(&data.ipc_handle()?);
        v.extend_from_slice(&flags.ipc_handle()?);
        Ok(v)
    }

    /// Maps every peer's workspace from `blobs[q]` (this rank's own entry is ignored).
    pub fn connect(&mut self, blobs: &[Vec<u8>]) -> Result<()> {
        if blobs.len() != self.world {
            return Err(Error::invalid("blobs", format!("need {} handle blobs, got {}", self.world, blobs.len())));
        }
        if let Areas::Host { job_id, ws, .. } = &mut self.areas {
            if ws.is_none() {
                let w = HostWorkspace::attach(&self.dev, *job_id, self.rank, self.world, self.slot_vecs, &blobs[0])?;
                for q in 0..self.world {
                    // This process's own device pointers to every rank's areas.
                    self.data_ptrs[q] = w.data_ptr(q);
                    self.flag_ptrs[q] = w.flag_ptr(q);
                }
                *ws = Some(w);
            }
            self.connected = true;
            return Ok(());
        }
        for (q, b) in blobs.iter().enumerate() {
            if q == self.rank {
                continue;
            }
            if b.len() != HANDLE_BLOB_BYTES {
                return Err(Error::Rendezvous {
                    rank: self.rank,
                    field: "cuda ipc handles",
                    expected: format!("{HANDLE_BLOB_BYTES} bytes"),
                    got: format!("{} bytes from rank {q}", b.len()),
                });
            }
            let mut h = [0u8; 64];
            h.copy_from_slice(&b[..64]);
            let d = IpcMapping::open(&self.dev, &h)?;
            h.copy_from_slice(&b[64..]);
            let f = IpcMapping::open(&self.dev, &h)?;
            self.data_ptrs[q] = d.ptr;
            self.flag_ptrs[q] = f.ptr;
            self.peer_data[q] = Some(d);
            self.peer_flags[q] = Some(f);
        }
        self.connected = true;
        Ok(())
    }

    /// Call once every rank's `connect` returned (after a barrier over the rendezvous): the
    /// host transport's segment name is removed (rank 0), so nothing is left in /dev/shm
    /// whatever happens to the processes later. A no-op for device memory.
    pub fn all_attached(&mut self) -> Result<()> {
        match &mut self.areas {
            Areas::Host { ws: Some(w), .. } => w.unlink(),
            Areas::Host { ws: None, .. } | Areas::Device { .. } => Ok(()),
        }
    }

    /// Enqueues this rank's part of an all-reduce on its stream (asynchronous). Every rank
    /// must make the same calls in the same order, with the same count and blocks (0: the
    /// launch policy, the same on every rank). Resolves the call's shape each time: callers
    /// that repeat shapes resolve once ([`resolve`](Self::resolve)) and use
    /// [`launch_resolved`](Self::launch_resolved).
    pub fn enqueue(&mut self, algo: Algorithm, dtype: DType, count: usize, input: u64, output: u64, blocks: u32) -> Result<()> {
        self.check_poisoned()?;
        let l = self.launcher.prepare(&self.dev, CallSpec { algo, dtype, count, blocks, registered: false }, &[input, output])?;
        let code = if self.check_calls { abi::desc_code(algo, dtype) } else { 0 };
        self.launch_resolved(&l, code, count, input, output)
    }

    /// Resolves a call shape on this workspace ([`Launcher::resolve`]): once per shape.
    pub fn resolve(&mut self, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32) -> Result<Launch> {
        self.launcher.resolve(&self.dev, algo, dtype, bytes, blocks)
    }

    /// Launches a resolved call: `desc_code` is what this rank announces to its peers
    /// (`abi::desc_code`; 0: no per-call check). Only the pointers are checked here.
    pub fn launch_resolved(&mut self, l: &Launch, desc_code: u32, count: usize, input: u64, output: u64) -> Result<()> {
        self.check_poisoned()?;
        if !self.connected {
            return Err(Error::invalid("workspace", "connect() first"));
        }
        launch::check_pointers(&[input, output])?;
        let a = self.call_args(count, input, output, desc_code);
        // SAFETY: l.f takes one TparArgs by value; every pointer in `a` is this rank's live
        // allocation, a live IPC mapping of a peer's (kept in self), or the caller's buffer
        // of >= count elements; the kernel stays inside the layout of common.cuh.
        unsafe { launch::launch(l, &self.stream, &a) }
    }

    /// The kernel argument of a call of `count` elements announced as `desc_code`.
    fn call_args(&self, count: usize, input: u64, output: u64, desc_code: u32) -> TparArgs {
        TparArgs {
            data: self.data_ptrs,
            flags: self.flag_ptrs,
            state: self.state.ptr,
            err: self.err.dev,
            input,
            output,
            count: count as u64,
            slot_vecs: self.slot_vecs as u64,
            timeout_ns: self.timeout_ns,
            rank: self.rank as u32,
            world: self.world as u32,
            desc_code,
            test_delay_ns: 0,
            islands: self.islands,
            io: 0,
        }
    }

    /// Whether `algo`'s fused kernel takes `call` in this workspace (`fused::fused_unfit`:
    /// `None`), else why not. The same answer on every rank of the same call.
    pub fn fused_unfit(&self, algo: Algorithm, call: &FusedCall) -> Option<String> {
        fused_unfit(algo, call, self.world, self.slot_vecs)
    }

    /// Resolves the fused variant of `algo` for `call` on this workspace, once per shape
    /// (a call the fused kernel cannot take is an error: the caller decides the path, every
    /// rank the same, with [`fused_unfit`](Self::fused_unfit)).
    pub fn resolve_fused(&mut self, algo: Algorithm, call: &FusedCall, blocks: u32) -> Result<Launch> {
        call.validate()?;
        if let Some(why) = self.fused_unfit(algo, call) {
            return Err(Error::Unsupported { what: format!("{algo} fused with add-RMSNorm for {} x {} {}", call.rows, call.hidden, call.dtype), reason: why });
        }
        self.launcher.resolve_fused(&self.dev, algo, call.dtype, call.bytes(), call.row_bytes(), blocks)
    }

    /// Launches a resolved fused call (docs/cuda.md "Fused"): `desc_code` is
    /// `abi::fused_desc_code` (0: no per-call check); the buffers are checked here.
    pub fn launch_fused_resolved(&mut self, l: &Launch, desc_code: u32, call: &FusedCall, bufs: &FusedBufs) -> Result<()> {
        self.check_poisoned()?;
        if !self.connected {
            return Err(Error::invalid("workspace", "connect() first"));
        }
        bufs.check(call)?;
        let a = self.call_args(call.count(), bufs.input, bufs.norm_out, desc_code);
        // SAFETY: l.f takes one TparFusedArgs by value; `a` as in launch_resolved; the norm's
        // buffers are the caller's, checked above, valid until the stream's work completes.
        unsafe { launch::launch_fused(l, &self.stream, &TparFusedArgs { a, n: call.norm_args(bufs) }) }
    }

    /// Enqueues this rank's part of a fused all-reduce + residual add + RMSNorm with `algo`'s
    /// fused kernel: [`resolve_fused`](Self::resolve_fused) and
    /// [`launch_fused_resolved`](Self::launch_fused_resolved) in one.
    pub fn enqueue_fused(&mut self, algo: Algorithm, call: &FusedCall, bufs: &FusedBufs, blocks: u32) -> Result<()> {
        self.check_poisoned()?;
        let l = self.resolve_fused(algo, call, blocks)?;
        let code = if self.check_calls { abi::fused_desc_code(algo, call.dtype) } else { 0 };
        self.launch_fused_resolved(&l, code, call, bufs)
    }

    /// Resolves tpar's add-RMSNorm kernel (no communication) for `call`'s shape, once per shape.
    pub fn resolve_add_rmsnorm(&mut self, call: &FusedCall) -> Result<Launch> {
        call.validate()?;
        self.launcher.resolve_add_rmsnorm(&self.dev, call.dtype, call.rows, call.row_vecs())
    }

    /// Launches a resolved add-RMSNorm on this rank's stream: x = `bufs.input` (the unfused
    /// path passes the all-reduce's output, `norm_out`, in place).
    pub fn launch_add_rmsnorm(&mut self, l: &Launch, call: &FusedCall, bufs: &FusedBufs) -> Result<()> {
        self.check_poisoned()?;
        bufs.check(call)?;
        let a = TparArgs { input: bufs.input, output: bufs.norm_out, count: call.count() as u64, ..Default::default() };
        // SAFETY: l.f takes one TparFusedArgs by value and touches only input, output,
        // count and the norm's buffers: the caller's, checked above.
        unsafe { launch::launch_fused(l, &self.stream, &TparFusedArgs { a, n: call.norm_args(bufs) }) }
    }

    /// [`resolve_add_rmsnorm`](Self::resolve_add_rmsnorm) and
    /// [`launch_add_rmsnorm`](Self::launch_add_rmsnorm) in one.
    pub fn enqueue_add_rmsnorm(&mut self, call: &FusedCall, bufs: &FusedBufs) -> Result<()> {
        self.check_poisoned()?;
        let l = self.resolve_add_rmsnorm(call)?;
        self.launch_add_rmsnorm(&l, call, bufs)
    }

    /// Sets up the copy-engine path (`ce-ring`) with `wire` on the wire: its streams, events,
    /// generation words and (lossy wire) stage. At init, never inside a capture.
    pub(crate) fn enable_ce(&mut self, wire: crate::kinds::Wire) -> Result<()> {
        self.ce = Some(super::ce::CeRank::new(&self.dev, wire, self.slot_vecs * abi::VEC_BYTES, self.world)?);
        Ok(())
    }

    fn ce_view(&self) -> super::ce::RankView {
        let (region, region_cap) = super::ce::region_of(self.world, self.slot_vecs);
        super::ce::RankView { data: self.data_ptrs, flags: self.flag_ptrs, state: self.state.ptr, err: self.err.dev, rank: self.rank, world: self.world, timeout_ns: self.timeout_ns, region, region_cap, gens: 0, stage: 0 }
    }

    fn ce_rank(&mut self) -> Result<&mut super::ce::CeRank> {
        self.ce.as_mut().ok_or_else(|| Error::Unsupported { what: "ce-ring".into(), reason: "the copy-engine path is not set up on this workspace (enable_ce)".into() })
    }

    /// Loads the copy-engine kernels of `dtype` and checks that a call of `bytes` fits.
    pub(crate) fn ce_prepare(&mut self, dtype: DType, bytes: usize) -> Result<()> {
        let (dev, view) = (self.dev.clone(), self.ce_view());
        self.ce_rank()?.prepare(&dev, dtype, bytes / dtype.size(), view)
    }

    /// Enqueues this rank's part of a `ce-ring` call on its stream (`desc_code`: what it
    /// announces; 0: no per-call check).
    pub(crate) fn ce_launch(&mut self, dtype: DType, count: usize, input: u64, output: u64, desc_code: u32) -> Result<()> {
        self.check_poisoned()?;
        if !self.connected {
            return Err(Error::invalid("workspace", "connect() first"));
        }
        launch::check_pointers(&[input, output])?;
        let view = self.ce_view();
        match self.ce.as_mut() {
            Some(ce) => ce.enqueue(&self.dev, &self.stream, view, dtype, count, (input, output), desc_code),
            None => Err(Error::Unsupported { what: "ce-ring".into(), reason: "the copy-engine path is not set up on this workspace (enable_ce)".into() }),
        }
    }

    /// What a watchdog thread needs to end this rank's calls in flight when a peer dies
    /// ([`Aborter`]). The caller must stop using it before this workspace is dropped.
    pub fn aborter(&self) -> Result<Aborter> {
        Ok(Aborter {
            dev: self.dev.clone(),
            stream: Stream::new(&self.dev)?,
            state: self.state.ptr,
            err: self.err.host as *mut TparError,
            rank: self.rank as u32,
        })
    }

    /// Whether calls carry their descriptor (the per-call check across ranks).
    pub fn check_calls(&self) -> bool {
        self.check_calls
    }

    /// The islands `hierarchical` reduces over (`algorithms::hierarchical::island_word`;
    /// every rank must set the same word).
    pub fn set_islands(&mut self, word: u64) {
        self.islands = word;
    }

    /// The launch path (its settings; PDL on or off for comparisons).
    pub fn launcher(&mut self) -> &mut Launcher {
        &mut self.launcher
    }

    /// Compiles and loads the kernels of `calls` now (first calls then compile nothing).
    pub fn preload(&mut self, calls: &[(Algorithm, DType)]) -> Result<()> {
        self.launcher.preload(&self.dev, calls)
    }

    /// Points this workspace's launches at `stream` and returns the stream they used before.
    /// [`GpuCommunicator::all_reduce_on`](super::GpuCommunicator::all_reduce_on) swaps a
    /// caller's stream in for one call and back, so that the call's kernel runs on the
    /// caller's stream with no event between them.
    ///
    /// # Safety
    /// `stream` must be a live stream of this workspace's context, and the stream returned
    /// must be swapped back before this workspace is used otherwise or dropped (dropping
    /// destroys whatever stream is in place).
    pub(crate) unsafe fn swap_stream(&mut self, stream: super::driver::sys::CUstream) -> super::driver::sys::CUstream {
        std::mem::replace(&mut self.stream.raw, stream)
    }

    /// Whether every call's count, dtype and algorithm are compared across ranks (default
    /// on). Every rank must set the same: a rank that checks waits for peers' descriptors.
    pub fn set_check_calls(&mut self, on: bool) {
        self.check_calls = on;
    }

    /// `Error::Poisoned` once an earlier call failed.
    pub fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(c) => Err(Error::Poisoned { rank: self.rank, cause: c.clone() }),
            None => Ok(()),
        }
    }

    /// Refuses all further work, giving `cause` (the caller found a failure the device did
    /// not record: a dead peer, a wait past the host's bound).
    pub fn poison(&mut self, cause: String) {
        self.poisoned.get_or_insert(cause);
    }

    /// The error a kernel (or the watchdog) recorded so far, without waiting; it poisons.
    pub fn recorded_error(&mut self) -> Option<Error> {
        let rec = self.err.read::<TparError>(0)?;
        let e = abi::device_error(&rec, "CUDA IPC")?;
        self.poisoned.get_or_insert_with(|| e.to_string());
        Some(e)
    }

    /// Waits for this rank's work; a device timeout becomes `Error::Timeout` and poisons.
    pub fn synchronize(&mut self) -> Result<()> {
        let sync = self.stream.synchronize();
        if let Some(rec) = self.err.read::<TparError>(0) {
            if let Some(e) = abi::device_error(&rec, "CUDA IPC") {
                self.poisoned = Some(e.to_string());
                return Err(e);
            }
        }
        sync
    }
}

/// Ends a rank's calls in flight from another thread (the GPU communicator's watchdog): it
/// fills the host-visible record with [`abi::ERR_PEER_DIED`] (every spinning thread of the
/// rank's kernels reads its code at its next clock check, `still_waiting` in frame.cuh, and
/// stops), then claims the record on the device (`TparState::err_claim`), so the next call or
/// `synchronize` raises `Error::PeerDied` naming the peer.
pub struct Aborter {
    dev: Device,
    stream: Stream,
    state: u64,
    err: *mut TparError,
    rank: u32,
}

// SAFETY: `err` points into the workspace's pinned host record, `state` into its device
// state; both stay allocated while the workspace lives, and the communicator joins the
// watchdog thread (the only user) before dropping the workspace. The record is written with
// volatile stores only; the device word through the driver.
unsafe impl Send for Aborter {}

impl Aborter {
    /// Fails this rank's calls in flight because `peer` died. The pinned error record first,
    /// with plain stores: waiting kernels read its code (frame.cuh `still_waiting`) and stop,
    /// even when the stream's queue is full of calls behind them, where any CUDA call of the
    /// host would wait for the queue to drain (an engine's eager step enqueues about a
    /// thousand launches before it synchronises: the abort waited for the device timeout).
    /// Then the device claim word, which keeps later kernels from writing a record of their own.
    pub fn peer_died(&self, peer: usize) -> Result<()> {
        // SAFETY: err points to the live pinned record (see the Send impl); a kernel that
        // recorded first (its code set) keeps its record.
        unsafe {
            let code = std::ptr::addr_of!((*self.err).code);
            if std::ptr::read_volatile(code) == 0 {
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).rank), self.rank);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).peer), peer as u32);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).phase), 0);
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).code), abi::ERR_PEER_DIED);
            }
        }
        self.dev.bind()?;
        let off = std::mem::offset_of!(TparState, err_claim) as u64;
        // SAFETY: state is the workspace's live TparState allocation (see the Send impl); the
        // claim word is an aligned word inside it.
        unsafe { super::driver::set_word_at_async(self.state + off, 1, &self.stream) }?;
        self.stream.synchronize()
    }
}
