//! [`RankSet`]: the GPU ranks a process drives, each with its device, stream and workspace,
//! whose peers are reached through plain pointers (emulated ranks: streams of one GPU in one
//! process), CUDA IPC mappings, or a shared host segment (rank processes). Emulated ranks are
//! a placement of the set, not a second implementation: one launch path ([`Launcher`]), one
//! kernel argument ([`TparArgs`], built in one place), one fused call, one completion and
//! error path, whichever way the ranks are placed.
//!
//! | placement | local ranks | peers | made by |
//! |---|---|---|---|
//! | [`RankPlacement::Emulated`] | every rank of the group, one stream each, forked from and joined into an origin stream | this process's own areas | [`RankSet::emulated`] |
//! | [`RankPlacement::Process`] | this process's rank, on its stream | CUDA IPC mappings (p2p) or the job's host segment (host), after [`RankSet::connect`] | [`RankSet::process`] |
//!
//! The communicator above it ([`super::GpuCommunicator`]) adds the control plane, the plan,
//! NCCL and the watchdog for rank processes; emulated ranks are driven directly (one process
//! holds every rank, so a call checks and captures across ranks here), through
//! [`RankSet::call`], which takes the communicator's own [`Call`](super::Call).
//!
//! Owns: the local ranks' streams, device-local epoch state and host-visible error records,
//! the areas ([`areas`]), the fork/join that makes one collective out of several local
//! launches (so it can be captured into one graph), and turning an error record into an
//! error + poisoning. Must never launch a kernel for a subset of local ranks except through
//! the explicit test hook, never reuse a poisoned set, and never be dropped while a peer of
//! another process may still write into it (the caller agrees on the end first).

use super::abi::{self, TparArgs, TparError, TparFusedArgs, TparNorm, TparState, MAX_RANKS};
use super::driver::{Device, DeviceBuffer, Event, HostMapped, Stream};
use super::io_tables::{self, IoTables};
use super::launch::{self, CallSpec, Launch, Launcher};
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Transport};
use crate::plan::HostProtocol;
use crate::settings::{LaunchSettings, Overrides};
use crate::dtype::DType;
use std::time::Duration;

// Where the workspaces live (emulated, CUDA IPC, host segment).
mod areas;
// Ending a rank's calls in flight from another thread (the watchdog).
mod abort;
// Completion, device errors and graph capture.
mod completion;
// The fused all-reduce + residual add + RMSNorm.
mod fused_calls;
// Test and measurement hooks (skew, stamps, epochs, absent ranks).
mod hooks;
// The copy-engine path (`ce-ring`).
mod ce;
// The all-gather and the reduce-scatter.
mod collectives;

pub use abort::Aborter;
pub use areas::HANDLE_BLOB_BYTES;

/// Device-side deadline per call when `TPAR_TIMEOUT_MS` is unset: the crate's one default.
pub const DEFAULT_TIMEOUT: Duration = crate::settings::DEFAULT_TIMEOUT;

/// Launches [`RankSet::take_launches`] keeps.
pub const RECENT_LAUNCHES: usize = 8;

/// How a rank set's ranks are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankPlacement {
    /// Every rank of the group is a stream of this process on one GPU.
    Emulated,
    /// This process is rank `rank`; the others are processes of their own.
    Process { rank: usize },
}

/// Options of a rank set (either placement).
#[derive(Clone, Debug)]
pub struct SetOptions {
    /// `P2p`: workspaces in device memory (IPC-mapped between processes);
    /// `Host`: workspaces in pinned host memory mapped into the device.
    pub transport: Transport,
    /// Device-side deadline of every wait in a call.
    pub timeout: Duration,
    /// Compare every call's count, dtype and algorithm across ranks (TPAR_CHECK_CALLS).
    /// Every rank must set the same: a rank that checks waits for peers' descriptors.
    pub check_calls: bool,
    /// The islands `hierarchical` reduces over, as lists of ranks that partition the world
    /// (`algorithms::hierarchical::from_sizes` makes them from sizes); empty: one island.
    /// Emulated ranks share one GPU: islands there choose the protocol, not the fabric.
    pub islands: Vec<Vec<u32>>,
    /// The push kernels' protocol over the host transport, when forced
    /// (`Overrides::host_protocol`, TPAR_HOST_PROTOCOL); `None`: [`HostProtocol::auto`].
    /// Every rank must pass the same (the plan digest carries it).
    pub host_protocol: Option<HostProtocol>,
    /// How the kernels are launched (`TPAR_PDL`, `TPAR_LEAN`, `TPAR_ZERO_COPY`, …).
    pub launch: LaunchSettings,
    /// `TPAR_BLOCKS`: the plan's [`Overrides::blocks`], given to the launcher for the calls
    /// the plan did not size (0 blocks given: a forced algorithm's, the tune's, an emulated
    /// group's). Every rank must pass the same (the plan digest carries it).
    pub blocks: Option<u32>,
    /// What `ce-ring` puts on the wire (`TPAR_WIRE`; exact by default).
    pub wire: crate::kinds::Wire,
}

impl Default for SetOptions {
    /// p2p, [`DEFAULT_TIMEOUT`], calls checked, the host protocol chosen by world size.
    /// Reads nothing from the environment: [`SetOptions::from_env`] does.
    fn default() -> Self {
        Self { transport: Transport::P2p, timeout: DEFAULT_TIMEOUT, check_calls: true, islands: Vec::new(), host_protocol: None, launch: LaunchSettings::default(), blocks: None, wire: crate::kinds::Wire::Exact }
    }
}

impl SetOptions {
    /// The defaults under the environment's settings (`crate::settings`): `TPAR_TIMEOUT_MS`,
    /// `TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL` and the launch settings. A malformed value is
    /// an error that names it, never ignored.
    pub fn from_env(transport: Transport) -> Result<Self> {
        Ok(Self::from_settings(transport, &crate::settings::Settings::from_env()?))
    }

    /// As [`from_env`](Self::from_env), from settings already parsed.
    pub fn from_settings(transport: Transport, s: &crate::settings::Settings) -> Self {
        Self::from_overrides(transport, s.job.timeout.unwrap_or(DEFAULT_TIMEOUT), &s.overrides, s.launch)
    }

    /// The options of a rank set that runs what `overrides` plans: every plan setting the
    /// launch reads (`TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL`, `TPAR_BLOCKS`, `TPAR_WIRE`)
    /// taken from the overrides the plan digest covers, so that the launch and the plan read
    /// one value; `launch`: the launch's own settings; one island.
    pub fn from_overrides(transport: Transport, timeout: Duration, overrides: &Overrides, launch: LaunchSettings) -> Self {
        Self {
            transport,
            timeout,
            check_calls: overrides.check_calls != Some(false),
            host_protocol: overrides.host_protocol,
            launch,
            blocks: overrides.blocks,
            wire: overrides.wire.unwrap_or_default(),
            islands: Vec::new(),
        }
    }
}

/// A rank this process drives: its index in the group, its stream, its device-local state
/// (epochs, claim words, the fused calls' tile words, stamps).
struct LocalRank {
    rank: usize,
    stream: Stream,
    state: DeviceBuffer,
}

/// Several local ranks as one collective: their calls fork from and join into `origin`.
struct Fan {
    origin: Stream,
    fork: Event,
    joins: Vec<Event>,
}

/// The GPU ranks this process drives (see the module's contract).
pub struct RankSet {
    // Field order is drop order: graphs, modules and streams hold the context in `dev` by
    // Arc, so any order is safe; the launcher (modules) first, the device last, for clarity.
    launcher: Launcher,
    ranks: Vec<LocalRank>,
    fan: Option<Fan>,
    ws: areas::Workspaces,
    /// One host-visible error record per local rank.
    err: HostMapped,
    placement: RankPlacement,
    world: usize,
    max_bytes: usize,
    slot_vecs: usize,
    timeout_ns: u64,
    check_calls: bool,
    /// `TparArgs::islands` of every call (0: one island).
    islands: u64,
    capturing: bool,
    poisoned: Option<String>,
    /// During a capture: what each local rank was asked to call, `count << 8 | desc_code`,
    /// checked across the local ranks when the capture ends (the kernels then carry no
    /// descriptor; a communicator compares its rank's across processes itself).
    captured: Vec<Vec<u64>>,
    /// The registered-buffer tables of captured calls (zero copy; `launch::registers`):
    /// emulated ranks' pointers are all this process's, so a capture registers its calls.
    io: IoTables,
    /// Test hook: (rank, descriptor code) that rank announces instead of its call's.
    desc_override: Option<(usize, u32)>,
    /// Test hook: (seed, most ns) of random per-rank, per-call delays; launches counted.
    skew: Option<(u64, u32)>,
    launches: u64,
    /// The shapes of the kernel launches since [`take_launches`](Self::take_launches) last
    /// ran (the most recent [`RECENT_LAUNCHES`]): what a call ran, for the bench's report.
    recent: Vec<Launch>,
    ce: Option<super::ce::CePath>,
    dev: Device,
}

/// The algorithm a rank set runs for `c`, or why it refuses the call: a set has no plan (the
/// call names its algorithm) and runs on its own streams (no caller's stream).
fn set_algorithm(c: &super::Call) -> Result<Algorithm> {
    let Some(algo) = c.algorithm else {
        return Err(Error::invalid("algorithm", "a rank set has no plan: name the algorithm (Call::forced)"));
    };
    if c.stream.is_some() {
        return Err(Error::invalid("stream", "a rank set's calls run on its own streams (GpuCommunicator::call takes a caller's)"));
    }
    Ok(algo)
}

fn check_shape(world: usize, transport: Transport, max_bytes: usize) -> Result<()> {
    if !(2..=MAX_RANKS).contains(&world) {
        return Err(Error::invalid("world", format!("{world}: a rank set has 2 to {MAX_RANKS} ranks")));
    }
    if !matches!(transport, Transport::P2p | Transport::Host) {
        return Err(Error::Unsupported {
            what: format!("transport {transport} for tpar's kernels"),
            reason: "their workspaces are device memory (p2p) or pinned host memory (host)".into(),
        });
    }
    if max_bytes == 0 {
        return Err(Error::invalid("max_bytes", "must be positive"));
    }
    Ok(())
}

impl RankSet {
    /// `world` emulated ranks on device `ordinal`: compiles (or loads from cache) the
    /// kernels as calls need them, allocates `world` workspaces able to reduce up to
    /// `max_bytes` per call, and checks the ABI.
    pub fn emulated(ordinal: usize, world: usize, max_bytes: usize, opts: SetOptions) -> Result<Self> {
        check_shape(world, opts.transport, max_bytes)?;
        let queues = crate::settings::cuda_hardware_queues();
        if world > queues {
            return Err(Error::Unsupported {
                what: format!("{world} emulated ranks"),
                reason: format!(
                    "CUDA gives this process {queues} hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set); ranks whose streams share a queue wait on each other until the timeout. Set CUDA_DEVICE_MAX_CONNECTIONS={world} or more before CUDA starts (the tpar command does so for --emulate-ranks above 8)"
                ),
            });
        }
        let dev = Device::open(ordinal)?;
        let origin = Stream::new(&dev)?;
        let launcher = Launcher::new(&dev, &origin, world, world, opts.transport, opts.host_protocol, max_bytes, opts.launch, opts.blocks)?;
        let slot_vecs = abi::slot_vecs(max_bytes);
        let data_bytes = abi::data_bytes(world, slot_vecs);
        let (mut data, mut flags) = (Vec::with_capacity(world), Vec::with_capacity(world));
        let mut ranks = Vec::with_capacity(world);
        let mut joins = Vec::with_capacity(world);
        // Rank by rank, each rank's data, flags and state together: the layout the emulated
        // ranks were always timed with. Every rank's areas first, then the states, measured
        // 0.1-0.2 us slower for one-shot push at 2 ranks, 4-256 KiB in graphs
        // (bench/results/2026-12-06-h100-rank-set/).
        for rank in 0..world {
            data.push(areas::Mem::new(&dev, opts.transport, data_bytes)?);
            flags.push(areas::Mem::new(&dev, opts.transport, abi::FLAG_BYTES)?);
            let state = DeviceBuffer::new(&dev, abi::state_bytes(slot_vecs))?;
            ranks.push(LocalRank { rank, stream: Stream::new(&dev)?, state });
            joins.push(Event::new(&dev)?);
        }
        let ws = areas::Workspaces::local(data, flags);
        let fan = Fan { origin, fork: Event::new(&dev)?, joins };
        let ce = if crate::algorithms::registry::spec(Algorithm::CeRing).emulated_transports.contains(&opts.transport) {
            Some(super::ce::CePath::new(&dev, opts.wire, max_bytes, world, world)?)
        } else {
            None
        };
        let mut set = Self::assemble(launcher, ranks, Some(fan), ws, RankPlacement::Emulated, world, max_bytes, &opts, dev)?;
        set.ce = ce;
        set.reset_workspaces(0)?;
        Ok(set)
    }

    /// Rank `rank` of a `world`-rank group of processes, on device `ordinal`, over
    /// `opts.transport`: `P2p` (device memory through CUDA IPC) or `Host` (the job's shared
    /// host segment, named after `job_id`; rank 0 creates it here). Give every peer
    /// [`handle_blob`](Self::handle_blob), then [`connect`](Self::connect) with every rank's.
    pub fn process(ordinal: usize, rank: usize, world: usize, max_bytes: usize, job_id: u64, opts: SetOptions) -> Result<Self> {
        check_shape(world, opts.transport, max_bytes)?;
        if rank >= world {
            return Err(Error::invalid("rank", format!("rank {rank} of {world}")));
        }
        let dev = Device::open(ordinal)?;
        let stream = Stream::new(&dev)?;
        // One rank per process: its kernels share the GPU with no other rank of this process.
        let launcher = Launcher::new(&dev, &stream, world, 1, opts.transport, opts.host_protocol, max_bytes, opts.launch, opts.blocks)?;
        let slot_vecs = abi::slot_vecs(max_bytes);
        let ws = areas::Workspaces::process(&dev, opts.transport, rank, world, slot_vecs, job_id)?;
        let ranks = vec![LocalRank { rank, stream, state: DeviceBuffer::new(&dev, abi::state_bytes(slot_vecs))? }];
        let mut set = Self::assemble(launcher, ranks, None, ws, RankPlacement::Process { rank }, world, max_bytes, &opts, dev)?;
        set.reset_state(0)?;
        Ok(set)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(launcher: Launcher, ranks: Vec<LocalRank>, fan: Option<Fan>, ws: areas::Workspaces, placement: RankPlacement, world: usize, max_bytes: usize, opts: &SetOptions, dev: Device) -> Result<Self> {
        let islands = if opts.islands.is_empty() { 0 } else { crate::algorithms::hierarchical::island_word(&opts.islands, world)? };
        let err = HostMapped::new(&dev, ranks.len() * std::mem::size_of::<TparError>())?;
        Ok(Self {
            captured: vec![Vec::new(); ranks.len()],
            launcher,
            ranks,
            fan,
            ws,
            err,
            placement,
            world,
            max_bytes,
            slot_vecs: abi::slot_vecs(max_bytes),
            timeout_ns: crate::units::timeout_ns(opts.timeout),
            check_calls: opts.check_calls,
            islands,
            capturing: false,
            poisoned: None,
            io: IoTables::default(),
            desc_override: None,
            skew: None,
            launches: 0,
            recent: Vec::new(),
            ce: None,
            dev,
        })
    }

    /// Every local rank's state and error record at `epoch` (every stream idle).
    fn reset_state(&mut self, epoch: u32) -> Result<()> {
        for (i, r) in self.ranks.iter().enumerate() {
            // The fused calls' tile words carry the epoch: never the next call's generation.
            r.state.fill_u32(epoch)?;
            r.state.upload(std::slice::from_ref(&TparState::at(epoch)))?;
            self.err.write(i * std::mem::size_of::<TparError>(), TparError::default());
        }
        self.dev.synchronize()
    }

    /// Emulated ranks: waits for everything, then refills every push region with the empty
    /// sentinel, zeroes the error records and claim words, and sets every rank's epoch —
    /// and every barrier flag — to `epoch` (flags must equal the last completed generation,
    /// see barrier_block). Rank processes never refill (peers may write at any time).
    fn reset_workspaces(&mut self, epoch: u32) -> Result<()> {
        self.synchronize_streams()?;
        self.ws.refill_local(self.world, self.slot_vecs, epoch)?;
        self.reset_state(epoch)
    }

    pub fn placement(&self) -> RankPlacement {
        self.placement
    }
    pub fn world(&self) -> usize {
        self.world
    }
    /// This process's rank (rank processes); 0 for emulated ranks, which are all of them.
    pub fn rank(&self) -> usize {
        self.ranks.first().map_or(0, |r| r.rank)
    }
    /// The islands word every call carries (`algorithms::hierarchical::island_word`).
    pub fn island_word(&self) -> u64 {
        self.islands
    }
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
    /// The transport of the workspaces (p2p: device memory; host: shared host memory).
    pub fn transport(&self) -> Transport {
        self.ws.transport()
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// The stream that carries the whole collective: time and capture on it (emulated
    /// ranks: the origin every rank forks from; a rank process: its stream).
    pub fn origin(&self) -> &Stream {
        match &self.fan {
            Some(f) => &f.origin,
            // A set has at least one local rank (both placements make one or more).
            None => &self.ranks[0].stream,
        }
    }
    /// A rank process's stream (the origin: see [`origin`](Self::origin)).
    pub fn stream(&self) -> &Stream {
        self.origin()
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }
    /// Whether calls carry their descriptor (the per-call check across ranks).
    pub fn check_calls(&self) -> bool {
        self.check_calls
    }
    /// Whether every call's count, dtype and algorithm are compared across ranks (default
    /// on). Every rank must set the same.
    pub fn set_check_calls(&mut self, on: bool) {
        self.check_calls = on;
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

    /// The bytes every peer needs to map this rank's workspace (send them over the
    /// rendezvous). Host transport: rank 0's are the shared segment's welcome, the others'
    /// are empty.
    pub fn handle_blob(&self) -> Result<Vec<u8>> {
        self.ws.handle_blob()
    }

    /// Maps every peer's workspace from `blobs[q]` (this rank's own entry is ignored).
    pub fn connect(&mut self, blobs: &[Vec<u8>]) -> Result<()> {
        let rank = self.rank();
        self.ws.connect(&self.dev, rank, self.world, self.slot_vecs, blobs)
    }

    /// Call once every rank's `connect` returned (after a barrier over the rendezvous): the
    /// host transport's segment name is removed (rank 0), so nothing is left in /dev/shm
    /// whatever happens to the processes later. A no-op elsewhere.
    pub fn all_attached(&mut self) -> Result<()> {
        self.ws.all_attached()
    }

    /// `Error::Poisoned` once an earlier call failed.
    pub fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(c) => Err(Error::Poisoned { rank: self.rank(), cause: c.clone() }),
            None => Ok(()),
        }
    }

    /// Refuses all further work, giving `cause` (the caller found a failure the device did
    /// not record: a dead peer, a wait past the host's bound).
    pub fn poison(&mut self, cause: String) {
        self.poisoned.get_or_insert(cause);
    }

    fn check_connected(&self) -> Result<()> {
        self.check_poisoned()?;
        if !self.ws.connected {
            return Err(Error::invalid("workspace", "connect() first"));
        }
        Ok(())
    }

    /// The kernel argument of local rank `i`'s part of a call of `count` elements announced
    /// as `desc_code`: the one place a call's argument is built.
    fn args_for(&self, i: usize, count: usize, input: u64, output: u64, desc_code: u32) -> TparArgs {
        let rank = self.ranks[i].rank;
        let mut a = TparArgs {
            data: self.ws.data_ptrs,
            flags: self.ws.flag_ptrs,
            state: self.ranks[i].state.ptr,
            err: self.err.dev + (i * std::mem::size_of::<TparError>()) as u64,
            input,
            output,
            count: count as u64,
            slot_vecs: self.slot_vecs as u64,
            timeout_ns: self.timeout_ns,
            rank: rank as u32,
            world: self.world as u32,
            desc_code,
            test_delay_ns: self.skew_ns(rank),
            islands: self.islands,
            io: 0,
        };
        // The test hook changes what a rank announces, not what it moves.
        if let Some((r, code)) = self.desc_override {
            if r == rank {
                a.desc_code = code;
            }
        }
        a
    }

    /// Enqueues one all-reduce of `count` elements on every local rank (asynchronous);
    /// emulated ranks fork from and join into the origin stream. `inputs[i]`/`outputs[i]`
    /// are local rank i's device pointers (16-byte aligned; an output may equal its input).
    /// Every rank must make the same calls in the same order, with the same count and blocks
    /// (0: the launch policy, the same on every rank).
    pub fn enqueue(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        let all = vec![true; self.ranks.len()];
        self.enqueue_plain(algo, dtype, count, (inputs, outputs), blocks, &all, true)
    }

    /// One call ([`Call`](super::Call), as [`GpuCommunicator::call`](super::GpuCommunicator::call)
    /// takes it) on every local rank: `inputs[i]` / `outputs[i]` are local rank i's buffers
    /// and stand in for the call's own `input` / `output`, which are ignored. Says which
    /// algorithm ran. A set has no plan: the call names its algorithm
    /// ([`Call::forced`](super::Call::forced)); the launch policy sizes the grid. Its ranks
    /// run on the set's streams (`c.stream` is refused): capture with
    /// [`capture`](Self::capture), time on [`origin`](Self::origin). An empty call launches
    /// nothing. Buffers as for [`enqueue_collective`](Self::enqueue_collective).
    pub fn call(&mut self, c: &super::Call, inputs: &[u64], outputs: &[u64]) -> Result<Algorithm> {
        let algo = set_algorithm(c)?;
        if c.count > 0 {
            self.enqueue_collective(c.collective, algo, c.dtype, c.count, inputs, outputs, 0)?;
        }
        Ok(algo)
    }

    /// [`enqueue`](Self::enqueue) for some local ranks (`present`); `may_register`: false
    /// for the all-reduce of a fused call's unfused path (fused calls keep the copy path).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_plain(&mut self, algo: Algorithm, dtype: DType, count: usize, (inputs, outputs): (&[u64], &[u64]), blocks: u32, present: &[bool], may_register: bool) -> Result<()> {
        self.check_connected()?;
        let n = self.ranks.len();
        if inputs.len() != n || outputs.len() != n || present.len() != n {
            return Err(Error::invalid("inputs", format!("need one input and output per local rank ({n})")));
        }
        if algo == Algorithm::CeRing {
            return self.enqueue_ce(dtype, count, inputs, outputs, present);
        }
        let ptrs: Vec<u64> = inputs.iter().chain(outputs.iter()).copied().collect();
        // Inside a capture the buffers are registered (their tables flushed when it ends),
        // unless they alias in a way the registered kernel cannot take (one-shot in place).
        let bytes = count.saturating_mul(dtype.size());
        let registered = may_register && self.capturing && self.registers_when_captured(algo, bytes) && io_tables::may_register(algo, inputs, outputs, bytes);
        let l = self.launcher.prepare(&self.dev, CallSpec { algo, dtype, count, blocks, registered, collective: crate::kinds::Collective::AllReduce }, &ptrs)?;
        let code = if self.check_calls { abi::desc_code(algo, dtype) } else { 0 };
        let io = if registered { Some(io_tables::table(inputs, outputs)) } else { None };
        self.launch_all(&l, (count, code), (inputs, outputs, io), present, None)
    }

    /// Whether a call of `algo` moving `bytes` per rank runs registered (zero copy: every
    /// rank's buffers read in place, io.cuh) when captured on this set: an emulated group
    /// over p2p (one address space), where the launch rule (`launch::registers`, under
    /// `TPAR_ZERO_COPY`) takes it. The all-reduce also needs buffers the registered kernel
    /// can take (`io_tables::may_register`); the all-gather's and reduce-scatter's never alias.
    pub fn registers_when_captured(&self, algo: Algorithm, bytes: usize) -> bool {
        self.fan.is_some() && self.ws.transport() == Transport::P2p && launch::registers(algo, bytes, self.launcher.settings().zero_copy)
    }

    /// Resolves a call shape ([`Launcher::resolve`]): once per shape.
    pub fn resolve(&mut self, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32) -> Result<Launch> {
        self.launcher.resolve(&self.dev, algo, dtype, bytes, blocks)
    }

    /// Launches a resolved call on every local rank: `desc_code` is what each announces to
    /// its peers (`abi::desc_code`; 0: no per-call check). Only the pointers are checked.
    pub fn launch_resolved(&mut self, l: &Launch, desc_code: u32, count: usize, inputs: &[u64], outputs: &[u64]) -> Result<()> {
        self.check_connected()?;
        launch::check_pointers(inputs)?;
        launch::check_pointers(outputs)?;
        let all = vec![true; self.ranks.len()];
        self.launch_all(l, (count, desc_code), (inputs, outputs, None), &all, None)
    }

    /// `(count, desc_code)`: the call as every rank announces it (see `abi::desc_code`).
    /// Inside a capture of emulated ranks the kernels get no descriptor: the host records
    /// each rank's call and checks the sequences across ranks when the capture ends. `io`:
    /// the call's registered buffers (every rank's input and output, one table for all
    /// ranks: one address space; never with `norm`). `norm`: the kernel takes the fused
    /// arguments, local rank i's norm part `norm[i]` (fused kernels, tpar's add-RMSNorm).
    fn launch_all(&mut self, l: &Launch, (count, desc_code): (usize, u32), (inputs, outputs, io): (&[u64], &[u64], Option<abi::TparIo>), present: &[bool], norm: Option<&[TparNorm]>) -> Result<()> {
        if inputs.len() != self.ranks.len() || outputs.len() != self.ranks.len() {
            return Err(Error::invalid("inputs", format!("need one input and output per local rank ({})", self.ranks.len())));
        }
        // Eager: fork from and join into the origin stream around every call, so the origin
        // stream carries the collective (and timing events on it cover all ranks). Inside a
        // capture the fork/join happens once around the whole body instead, so each rank's
        // calls form an independent chain, as in a real multi-process deployment.
        let fan = if self.capturing { None } else { self.fan.as_ref() };
        if let Some(f) = fan {
            f.origin.record(&f.fork)?;
        }
        for i in 0..self.ranks.len() {
            if !present[i] {
                continue;
            }
            let mut a = self.args_for(i, count, inputs[i], outputs[i], desc_code);
            if let Some(t) = io {
                a.io = self.io.address(&self.dev, t)?;
            }
            if self.capturing && desc_code != 0 {
                if let Some(seq) = self.captured.get_mut(i) {
                    seq.push(abi::pack_call(count, a.desc_code));
                }
                a.desc_code = 0;
            }
            let stream = &self.ranks[i].stream;
            if let Some(f) = fan {
                stream.wait(&f.fork)?;
            }
            match norm.and_then(|n| n.get(i)) {
                // SAFETY: l.f takes one TparFusedArgs (the callers pair a fused or add-RMSNorm
                // launch with `norm`); `a` as below, and n's buffers are the caller's, checked
                // (FusedBufs::check) and kept alive by the caller until synchronize.
                Some(n) => unsafe { launch::launch_fused(l, stream, &TparFusedArgs { a, n: *n })? },
                // SAFETY: l.f takes one TparArgs by value; every pointer in `a` is a live
                // allocation of this set, a live IPC mapping of a peer's (kept in self.ws), or
                // a caller buffer of >= count elements, kept alive until synchronize; the
                // kernel's accesses stay inside the layout in common.cuh.
                None => unsafe { launch::launch(l, stream, &a)? },
            }
            if let Some(f) = fan {
                stream.record(&f.joins[i])?;
                f.origin.wait(&f.joins[i])?;
            }
        }
        if self.recent.len() == RECENT_LAUNCHES {
            self.recent.remove(0);
        }
        self.recent.push(*l);
        self.launches += 1;
        Ok(())
    }

    /// Points a rank process's launches at `stream` and returns the stream they used
    /// before. [`GpuCommunicator::call`](super::GpuCommunicator::call) swaps a
    /// caller's stream in for one call and back, so that the call's kernel runs on the
    /// caller's stream with no event between them.
    ///
    /// # Safety
    /// `stream` must be a live stream of this set's context, and the stream returned must be
    /// swapped back before this set is used otherwise or dropped (dropping destroys whatever
    /// stream is in place).
    pub(crate) unsafe fn swap_stream(&mut self, stream: super::driver::sys::CUstream) -> super::driver::sys::CUstream {
        match self.ranks.first_mut() {
            Some(r) if self.fan.is_none() => std::mem::replace(&mut r.stream.raw, stream),
            // Emulated ranks run on streams of their own: nothing to swap.
            _ => stream,
        }
    }
}

#[cfg(test)]
mod tests;
