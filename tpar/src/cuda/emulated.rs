//! Emulated ranks on one GPU: `world` ranks in one process, one stream each, "peer"
//! pointers being plain device pointers of the same process. Proves the kernels, the
//! protocols and the timeout path on a single device; with [`Transport::Host`] every
//! workspace lives in pinned host memory, so the traffic crosses the real PCIe link.
//!
//! Owns: the per-rank workspaces (data area from `cuMemAlloc` or pinned mapped host memory,
//! flag area, device-local epoch state, host-visible error record), the rank streams, the
//! fork/join that makes one collective out of `world` launches (so it can be captured into
//! one graph), and turning an error record into `Error::Timeout` + poisoning.
//! Must never launch a kernel for a subset of ranks except through the explicit test hook,
//! and never reuse a poisoned group.

use super::abi::{self, TparArgs, TparError, TparState, MAX_BLOCKS, MAX_RANKS, THREADS, VEC_BYTES};
use super::driver::{launch_with_struct, Device, DeviceBuffer, Event, Graph, HostMapped, Module, Stream};
use super::kernels::{self, kernel_algorithms};
use super::nvrtc;
use crate::error::{Error, Result};
use crate::{Algorithm, DType, Transport};
use std::collections::HashMap;
use std::time::Duration;

/// Default upper bound on blocks per rank per call. Few blocks on purpose: PCIe fabrics
/// collapse when every SM writes (docs/architecture.md, Kernels); the plan may choose more.
pub const DEFAULT_MAX_BLOCKS: u32 = 8;

/// Default device-side deadline per call (`TPAR_TIMEOUT_MS` overrides it in the CLI).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Blocks for a call of `bytes`: one block per THREADS vectors, at least 1, at most `max`.
pub fn default_blocks(bytes: usize, max: u32) -> u32 {
    let vecs = bytes.div_ceil(VEC_BYTES);
    let b = vecs.div_ceil(THREADS as usize).max(1);
    (b.min(max.max(1) as usize) as u32).min(MAX_BLOCKS as u32)
}

/// Options of an emulated group.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// `P2p`: workspaces in device memory (what IPC-mapped peers would be);
    /// `Host`: workspaces in pinned host memory mapped into the device.
    pub transport: Transport,
    /// Device-side deadline of every wait in a call.
    pub timeout: Duration,
    /// Compare every call's count, dtype and algorithm across ranks (TPAR_CHECK_CALLS).
    pub check_calls: bool,
}

impl Default for GroupOptions {
    fn default() -> Self {
        Self { transport: Transport::P2p, timeout: DEFAULT_TIMEOUT, check_calls: true }
    }
}

enum Mem {
    Device(DeviceBuffer),
    Host(HostMapped),
}

impl Mem {
    fn new(dev: &Device, transport: Transport, bytes: usize) -> Result<Self> {
        Ok(match transport {
            Transport::Host => Mem::Host(HostMapped::new(dev, bytes)?),
            _ => Mem::Device(DeviceBuffer::new(dev, bytes)?),
        })
    }
    fn ptr(&self) -> u64 {
        match self {
            Mem::Device(b) => b.ptr,
            Mem::Host(h) => h.dev,
        }
    }
    /// Fills the first `bytes` with `word`. No kernel may be using the memory.
    fn fill_prefix(&self, bytes: usize, word: u32) -> Result<()> {
        match self {
            Mem::Device(b) => {
                // SAFETY: ptr is a live allocation of at least `bytes` (callers pass a prefix length).
                let rc = unsafe { cudarc::driver::sys::cuMemsetD32_v2(b.ptr, word, bytes.min(b.bytes) / 4) };
                super::driver::cu_rc(|| "cuMemsetD32".into(), rc)
            }
            Mem::Host(h) => {
                for off in (0..bytes.min(h.bytes)).step_by(4) {
                    h.write(off, word);
                }
                Ok(())
            }
        }
    }
}

/// `world` emulated ranks on one device.
pub struct EmulatedGroup {
    // Field order is drop order: graphs/modules/streams reference the context in `dev`,
    // which every wrapper also holds by Arc, so any order is safe; keep dev last for clarity.
    modules: HashMap<Algorithm, Module>,
    streams: Vec<Stream>,
    origin: Stream,
    fork: Event,
    joins: Vec<Event>,
    data: Vec<Mem>,
    flags: Vec<Mem>,
    state: Vec<DeviceBuffer>,
    err: HostMapped,
    world: usize,
    max_bytes: usize,
    slot_vecs: usize,
    transport: Transport,
    timeout_ns: u64,
    sentinel_word: u32,
    capturing: bool,
    poisoned: Option<String>,
    /// Test hook: (rank, descriptor code) that rank announces instead of its call's.
    desc_override: Option<(usize, u32)>,
    check_calls: bool,
    dev: Device,
}

/// The empty-sentinel word of the push region: all ones for every dtype (the kernels'
/// `TPAR_EMPTY_WORD`, the CPU backend's `dtype::EMPTY`), so calls of different dtypes share
/// the push region with no refill between them.
pub fn sentinel_word(_dtype: DType) -> u32 {
    crate::dtype::EMPTY as u32
}

impl EmulatedGroup {
    /// Opens device `ordinal`, compiles (or loads from cache) every kernel, allocates
    /// `world` workspaces able to reduce up to `max_bytes` per call, and checks the ABI.
    pub fn new(ordinal: usize, world: usize, max_bytes: usize, opts: GroupOptions) -> Result<Self> {
        if !(2..=MAX_RANKS).contains(&world) {
            return Err(Error::invalid("world", format!("{world}: emulated groups have 2..={MAX_RANKS} ranks")));
        }
        if !matches!(opts.transport, Transport::P2p | Transport::Host) {
            return Err(Error::Unsupported {
                what: format!("transport {} for emulated ranks", opts.transport),
                reason: "emulated ranks run the p2p or host transport".into(),
            });
        }
        if max_bytes == 0 {
            return Err(Error::invalid("max_bytes", "must be positive"));
        }
        let dev = Device::open(ordinal)?;
        let arch = dev.arch();
        let modules = load_modules(&dev, &arch)?;
        let slot_vecs = abi::slot_vecs(max_bytes);
        let data_bytes = abi::data_bytes(world, slot_vecs);
        let mut data = Vec::with_capacity(world);
        let mut flags = Vec::with_capacity(world);
        let mut state = Vec::with_capacity(world);
        let mut streams = Vec::with_capacity(world);
        let mut joins = Vec::with_capacity(world);
        for _ in 0..world {
            data.push(Mem::new(&dev, opts.transport, data_bytes)?);
            flags.push(Mem::new(&dev, opts.transport, abi::FLAG_BYTES)?);
            let st = DeviceBuffer::new(&dev, std::mem::size_of::<TparState>())?;
            st.fill_u32(0)?;
            state.push(st);
            streams.push(Stream::new(&dev)?);
            joins.push(Event::new(&dev)?);
        }
        let err = HostMapped::new(&dev, world * std::mem::size_of::<TparError>())?;
        let origin = Stream::new(&dev)?;
        let fork = Event::new(&dev)?;
        let timeout_ns = u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX).max(1);
        let mut g = Self {
            modules,
            streams,
            origin,
            fork,
            joins,
            data,
            flags,
            state,
            err,
            world,
            max_bytes,
            slot_vecs,
            transport: opts.transport,
            timeout_ns,
            sentinel_word: sentinel_word(DType::BF16),
            capturing: false,
            desc_override: None,
            check_calls: opts.check_calls,
            poisoned: None,
            dev,
        };
        g.check_abi()?;
        g.reset_workspaces(sentinel_word(DType::BF16), 0)?;
        Ok(g)
    }

    pub fn world(&self) -> usize {
        self.world
    }
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
    pub fn transport(&self) -> Transport {
        self.transport
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// The stream that represents the whole collective: time and capture on it.
    pub fn origin(&self) -> &Stream {
        &self.origin
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    fn check_abi(&mut self) -> Result<()> {
        check_abi(&self.dev, &mut self.modules, &self.origin)
    }

    /// Waits for everything, then refills every push region with `word`, zeroes the error
    /// records and claim words, and sets every rank's epoch — and every barrier flag — to
    /// `epoch` (flags must equal the last completed generation, see barrier_block).
    fn reset_workspaces(&mut self, word: u32, epoch: u32) -> Result<()> {
        self.synchronize_streams()?;
        let push = abi::push_region_bytes(self.world, self.slot_vecs);
        for r in 0..self.world {
            self.data[r].fill_prefix(push, word)?;
            self.flags[r].fill_prefix(abi::FLAG_BYTES, epoch)?;
            let st = TparState { epoch, ..Default::default() };
            self.state[r].upload(std::slice::from_ref(&st))?;
            self.err.write(r * std::mem::size_of::<TparError>(), TparError::default());
        }
        self.dev.ctx.synchronize().map_err(|e| Error::Cuda { context: "cuCtxSynchronize".into(), code: format!("{:?}", e.0) })?;
        self.sentinel_word = word;
        Ok(())
    }

    /// Test hook: rank `rank` announces `desc_code` (see `abi::desc_code`) instead of its
    /// call's, as a rank calling another dtype or algorithm would, while moving the same data
    /// as the others; None restores the truth.
    pub fn set_desc_override_for_test(&mut self, o: Option<(usize, u32)>) {
        self.desc_override = o;
    }

    /// Test hook: restart every rank's epoch at `epoch` (e.g. near u32::MAX to test wrap-around).
    pub fn set_epoch_for_test(&mut self, epoch: u32) -> Result<()> {
        self.check_usable()?;
        let w = self.sentinel_word;
        self.reset_workspaces(w, epoch)
    }

    /// Reads rank `r`'s device epoch (synchronises first).
    pub fn epoch(&self, r: usize) -> Result<u32> {
        self.synchronize_streams()?;
        let mut st = [TparState::default()];
        self.state.get(r).ok_or_else(|| Error::invalid("rank", "out of range"))?.download(&mut st)?;
        Ok(st[0].epoch)
    }

    fn check_usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(cause) => Err(Error::Poisoned { rank: 0, cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Makes the push region hold `dtype`'s sentinel. Every dtype has the same sentinel now,
    /// so this refills only a workspace left in another state; kept so that a future
    /// dtype-specific protocol (the `flag` protocol) has its hook.
    pub fn prepare(&mut self, dtype: DType) -> Result<()> {
        self.check_usable()?;
        let w = sentinel_word(dtype);
        if w == self.sentinel_word {
            return Ok(());
        }
        if self.capturing {
            return Err(Error::Unsupported {
                what: "switching between 32- and 16-bit dtypes inside a graph capture".into(),
                reason: "the push inboxes must be refilled first; call prepare(dtype) before capturing".into(),
            });
        }
        // Keep the epoch: read rank 0's (all ranks agree when idle).
        let e = self.epoch(0)?;
        self.reset_workspaces(w, e)
    }

    fn args_for(&self, r: usize, count: usize, input: u64, output: u64, desc_code: u32) -> TparArgs {
        let mut a = TparArgs {
            state: self.state[r].ptr,
            err: self.err.dev + (r * std::mem::size_of::<TparError>()) as u64,
            input,
            output,
            count: count as u64,
            slot_vecs: self.slot_vecs as u64,
            timeout_ns: self.timeout_ns,
            rank: r as u32,
            world: self.world as u32,
            desc_code,
            ..Default::default()
        };
        // The test hook changes what rank r announces, not what it moves.
        if let Some((rank, code)) = self.desc_override {
            if rank == r {
                a.desc_code = code;
            }
        }
        for q in 0..self.world {
            a.data[q] = self.data[q].ptr();
            a.flags[q] = self.flags[q].ptr();
        }
        a
    }

    /// Enqueues one all-reduce of `count` elements on every rank (asynchronous), forked from
    /// and joined into the origin stream. `inputs[r]`/`outputs[r]` are rank r's device
    /// pointers (16-byte aligned; an output may equal its input).
    pub fn enqueue(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        let all = vec![true; self.world];
        self.enqueue_ranks(algo, dtype, count, inputs, outputs, blocks, &all)
    }

    /// Test hook behind [`enqueue`](Self::enqueue): launches only the ranks with
    /// `present[r]`, to prove that a rank that never arrives costs a Timeout, not a hang.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_ranks(
        &mut self,
        algo: Algorithm,
        dtype: DType,
        count: usize,
        inputs: &[u64],
        outputs: &[u64],
        blocks: u32,
        present: &[bool],
    ) -> Result<()> {
        self.check_usable()?;
        if sentinel_word(dtype) != self.sentinel_word {
            self.prepare(dtype)?;
        }
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| Error::invalid("count", "overflows"))?;
        if count == 0 {
            return Err(Error::invalid("count", "must be positive"));
        }
        if bytes > self.max_bytes {
            return Err(Error::invalid("count", format!("{bytes} B exceeds the group's max_bytes {}", self.max_bytes)));
        }
        if inputs.len() != self.world || outputs.len() != self.world || present.len() != self.world {
            return Err(Error::invalid("inputs", format!("need one input and output per rank ({})", self.world)));
        }
        if let Some(p) = inputs.iter().chain(outputs.iter()).find(|p| **p % VEC_BYTES as u64 != 0 || **p == 0) {
            return Err(Error::invalid("buffer", format!("pointer {p:#x} is null or not 16-byte aligned")));
        }
        if blocks == 0 || blocks as usize > MAX_BLOCKS {
            return Err(Error::invalid("blocks", format!("{blocks}: must be 1..={MAX_BLOCKS}")));
        }
        let src = kernels::source_for(algo).ok_or_else(|| Error::Unsupported {
            what: format!("algorithm {algo} on the CUDA backend"),
            reason: "it has no kernel (use nccl through tpar::cuda::nccl)".into(),
        })?;
        let entry = src.entry(dtype);
        let code = if self.check_calls { abi::desc_code(algo, dtype) } else { 0 };
        self.launch_all(algo, &entry, (count, code), inputs, outputs, blocks, present)
    }

    /// Measurement hook: launches the empty kernel `tpar_noop` on every rank exactly as a
    /// collective is launched (fork/join, grid, arguments), to measure the launch floor of
    /// emulated ranks.
    pub fn enqueue_floor(&mut self, blocks: u32, inputs: &[u64], outputs: &[u64]) -> Result<()> {
        self.check_usable()?;
        if inputs.len() != self.world || outputs.len() != self.world {
            return Err(Error::invalid("inputs", format!("need one input and output per rank ({})", self.world)));
        }
        let all = vec![true; self.world];
        self.launch_all(Algorithm::OneshotPush, "tpar_noop", (1, 0), inputs, outputs, blocks.clamp(1, MAX_BLOCKS as u32), &all)
    }

    #[allow(clippy::too_many_arguments)]
    /// `(count, desc_code)`: the call as every rank announces it (see `abi::desc_code`).
    #[allow(clippy::too_many_arguments)]
    fn launch_all(&mut self, algo: Algorithm, entry: &str, (count, desc_code): (usize, u32), inputs: &[u64], outputs: &[u64], blocks: u32, present: &[bool]) -> Result<()> {
        let f = self
            .modules
            .get_mut(&algo)
            .ok_or_else(|| Error::invalid("algorithm", "module not loaded"))?
            .function(entry)?;
        // Eager: fork from and join into the origin stream around every call, so the origin
        // stream carries the collective (and timing events on it cover all ranks). Inside a
        // capture the fork/join happens once around the whole body instead, so each rank's
        // calls form an independent chain, as in a real multi-process deployment.
        let eager = !self.capturing;
        if eager {
            self.origin.record(&self.fork)?;
        }
        for r in 0..self.world {
            if !present[r] {
                continue;
            }
            let a = self.args_for(r, count, inputs[r], outputs[r], desc_code);
            if eager {
                self.streams[r].wait(&self.fork)?;
            }
            // SAFETY: f takes one TparArgs by value; every pointer in `a` is a live allocation
            // of this group (or a caller buffer of >= count elements), kept alive by &mut self
            // until synchronize; the kernel's accesses stay inside the layout in common.cuh.
            unsafe { launch_with_struct(f, blocks, THREADS, &self.streams[r], &a)? };
            if eager {
                self.streams[r].record(&self.joins[r])?;
                self.origin.wait(&self.joins[r])?;
            }
        }
        Ok(())
    }

    fn synchronize_streams(&self) -> Result<()> {
        self.origin.synchronize()?;
        for s in &self.streams {
            s.synchronize()?;
        }
        Ok(())
    }

    /// Waits for all enqueued work and turns any device error record into an error; a
    /// timeout poisons the group.
    pub fn synchronize(&mut self) -> Result<()> {
        let sync = self.synchronize_streams();
        if let Some(e) = self.take_device_error() {
            return Err(e);
        }
        sync
    }

    fn take_device_error(&mut self) -> Option<Error> {
        for r in 0..self.world {
            let rec: TparError = self.err.read(r * std::mem::size_of::<TparError>())?;
            if let Some(e) = abi::device_error(&rec, &format!("emulated ranks on {}", self.dev.name)) {
                self.poisoned = Some(e.to_string());
                return Some(e);
            }
        }
        None
    }

    /// One all-reduce, synchronously: enqueue then synchronize.
    pub fn all_reduce(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        self.enqueue(algo, dtype, count, inputs, outputs, blocks)?;
        self.synchronize()
    }

    /// Captures whatever `body` enqueues into one CUDA graph (on the origin stream; the rank
    /// streams join through the fork/join events). Epochs advance on the device, so the graph
    /// replays correctly any number of times.
    pub fn capture(&mut self, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<Graph> {
        self.check_usable()?;
        self.synchronize_streams()?;
        self.origin.begin_capture()?;
        let r = self.fork_all().and_then(|()| {
            self.capturing = true;
            let r = body(self);
            self.capturing = false;
            r
        });
        // Join every rank stream back even after an error: a capture must end joined.
        let j = self.join_all();
        let g = self.origin.end_capture();
        j?;
        r?;
        g
    }

    fn fork_all(&self) -> Result<()> {
        self.origin.record(&self.fork)?;
        for s in &self.streams {
            s.wait(&self.fork)?;
        }
        Ok(())
    }

    fn join_all(&self) -> Result<()> {
        for (s, j) in self.streams.iter().zip(&self.joins) {
            s.record(j)?;
            self.origin.wait(j)?;
        }
        Ok(())
    }

    /// Replays a captured graph on the origin stream (asynchronous).
    pub fn launch(&self, graph: &Graph) -> Result<()> {
        self.check_usable()?;
        graph.launch(&self.origin)
    }
}

/// Compiles (or loads from the cache) every kernel file for `arch` and loads it.
pub(crate) fn load_modules(dev: &Device, arch: &str) -> Result<HashMap<Algorithm, Module>> {
    let mut modules = HashMap::new();
    for a in kernel_algorithms() {
        let src = kernels::source_for(a).ok_or_else(|| Error::Unsupported {
            what: a.to_string(),
            reason: "no kernel source".into(),
        })?;
        let (ptx, _) = nvrtc::compile_cached(&src, arch)?;
        modules.insert(a, Module::load_ptx(dev, &ptx)?);
    }
    Ok(modules)
}

/// Runs `tpar_abi_offsets` and compares the device compiler's field offsets with abi.rs.
pub(crate) fn check_abi(dev: &Device, modules: &mut HashMap<Algorithm, Module>, stream: &Stream) -> Result<()> {
    use std::mem::offset_of;
    let out = DeviceBuffer::new(dev, 12 * 8)?;
    let m = modules.get_mut(&Algorithm::OneshotPush).ok_or_else(|| Error::invalid("modules", "missing"))?;
    let f = m.function("tpar_abi_offsets")?;
    // SAFETY: tpar_abi_offsets takes one u64 pointer; `out` holds 12 u64 and outlives the sync below.
    unsafe { launch_with_struct(f, 1, 1, stream, &out.ptr)? };
    stream.synchronize()?;
    let mut got = [0u64; 12];
    out.download(&mut got)?;
    let want = [
        offset_of!(TparArgs, flags),
        offset_of!(TparArgs, state),
        offset_of!(TparArgs, err),
        offset_of!(TparArgs, input),
        offset_of!(TparArgs, count),
        offset_of!(TparArgs, slot_vecs),
        offset_of!(TparArgs, timeout_ns),
        offset_of!(TparArgs, rank),
        offset_of!(TparError, waited_ns),
        offset_of!(TparState, err_claim),
        offset_of!(TparArgs, desc_code),
        offset_of!(TparError, theirs),
    ]
    .map(|x| x as u64);
    if got != want {
        return Err(Error::Unsupported {
            what: "kernel ABI".into(),
            reason: format!("device field offsets {got:?} differ from abi.rs {want:?}"),
        });
    }
    Ok(())
}
