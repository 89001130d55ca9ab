//! vLLM's custom all-reduce, all-gather and reduce-scatter as a peer: the C API of
//! `bench/compare/vllm_ar/peer.cu` loaded with libloading, driven on emulated ranks or one rank
//! per GPU process, its results checked (the all-reduce against [`vllm_expected`], the
//! all-gather and the reduce-scatter by the CLI's one verifier, `harness::verify::Judge`) and
//! timed as tpar is (the module above says how).

use super::Site;
use crate::harness::verify::{err, Judge, Outcome, Verdict, POISON_WORD, TIMING_WORD};
use crate::harness::Timing;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use tpar::cuda::driver::{Device, DeviceBuffer, Event, Graph, Stream};
use tpar::cuda::GpuCommunicator;
use tpar::plan::CaptureMode;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest};
use tpar::units::{percentiles, Spread};
use tpar::kinds::Wire;
use tpar::{Algorithm, Collective, DType, Element};

/// The API version of `bench/compare/vllm_ar/peer.cu` this module speaks (its `kAbi`).
const PEER_ABI: c_int = 2;

// ------------------------------------------------------------------------------------------
// The library.
// ------------------------------------------------------------------------------------------

type Handle = *mut c_void;

/// `bench/compare/vllm_ar/peer.cu`'s entry points, resolved once.
pub(super) struct Api {
    last_error: unsafe extern "C" fn() -> *const c_char,
    create: unsafe extern "C" fn(c_int, c_int, *const c_int, c_int, usize, c_int, c_int, *mut Handle) -> c_int,
    info: unsafe extern "C" fn(Handle) -> *const c_char,
    block_limit: unsafe extern "C" fn(Handle, c_int) -> c_int,
    connect_local: unsafe extern "C" fn(Handle) -> c_int,
    export: unsafe extern "C" fn(Handle, *mut u8, usize, *mut usize) -> c_int,
    connect: unsafe extern "C" fn(Handle, *const u8, usize) -> c_int,
    stage: unsafe extern "C" fn(Handle, usize) -> c_int,
    all_reduce: unsafe extern "C" fn(Handle, c_int, *mut c_void, c_int, *const c_void, *mut c_void, usize) -> c_int,
    all_gather: unsafe extern "C" fn(Handle, c_int, *mut c_void, c_int, *const c_void, *mut c_void, usize) -> c_int,
    reduce_scatter: unsafe extern "C" fn(Handle, c_int, *mut c_void, c_int, *const c_void, *mut c_void, usize) -> c_int,
    register_graph_local: unsafe extern "C" fn(Handle) -> c_int,
    graph_meta: unsafe extern "C" fn(Handle, *mut u8, usize, *mut usize) -> c_int,
    register_graph: unsafe extern "C" fn(Handle, *const *const u8, *const usize) -> c_int,
    destroy: unsafe extern "C" fn(Handle),
    // Last: the function pointers above point into it.
    _lib: Library,
}

impl Api {
    pub(super) fn load(path: &Path) -> Result<Api, String> {
        let what = |e: libloading::Error| format!("loading the peer library {}: {e}", path.display());
        // SAFETY: loading runs the library's initialisers: peer.cu has none of its own beyond
        // the CUDA runtime's static state (libcudart linked statically by nvcc).
        let lib = unsafe { Library::new(path) }.map_err(what)?;
        // SAFETY: each symbol is looked up by the name peer.cu exports with C linkage and the
        // type written in this struct, the same as in peer.cu; the pointers stay valid while
        // `lib` (kept in the struct) is loaded.
        unsafe {
            let abi: unsafe extern "C" fn() -> c_int = *lib.get(b"tpar_peer_abi\0").map_err(what)?;
            let got = abi();
            if got != PEER_ABI {
                return Err(format!("{}: peer API version {got}, this tpar speaks {PEER_ABI}: rebuild it from this checkout", path.display()));
            }
            Ok(Api {
                last_error: *lib.get(b"tpar_peer_last_error\0").map_err(what)?,
                create: *lib.get(b"tpar_peer_create\0").map_err(what)?,
                info: *lib.get(b"tpar_peer_info\0").map_err(what)?,
                block_limit: *lib.get(b"tpar_peer_block_limit\0").map_err(what)?,
                connect_local: *lib.get(b"tpar_peer_connect_local\0").map_err(what)?,
                export: *lib.get(b"tpar_peer_export\0").map_err(what)?,
                connect: *lib.get(b"tpar_peer_connect\0").map_err(what)?,
                stage: *lib.get(b"tpar_peer_stage\0").map_err(what)?,
                all_reduce: *lib.get(b"tpar_peer_all_reduce\0").map_err(what)?,
                all_gather: *lib.get(b"tpar_peer_all_gather\0").map_err(what)?,
                reduce_scatter: *lib.get(b"tpar_peer_reduce_scatter\0").map_err(what)?,
                register_graph_local: *lib.get(b"tpar_peer_register_graph_local\0").map_err(what)?,
                graph_meta: *lib.get(b"tpar_peer_graph_meta\0").map_err(what)?,
                register_graph: *lib.get(b"tpar_peer_register_graph\0").map_err(what)?,
                destroy: *lib.get(b"tpar_peer_destroy\0").map_err(what)?,
                _lib: lib,
            })
        }
    }

    /// `rc` as a Result, with the library's message.
    fn rc(&self, rc: c_int, what: &str) -> Result<c_int, String> {
        if rc >= 0 {
            return Ok(rc);
        }
        // SAFETY: last_error returns a pointer to a NUL-terminated thread-local string the
        // library keeps until its next failing call on this thread; copied at once.
        let msg = unsafe { CStr::from_ptr((self.last_error)()) }.to_string_lossy().into_owned();
        Err(format!("vllm {what}: {msg}"))
    }
}

/// The control plane of a peer's ranks: nothing for emulated ranks (all in this process),
/// tpar's own for rank processes.
enum Ctl<'a> {
    Local,
    Comm(&'a mut GpuCommunicator),
}

impl Ctl<'_> {
    /// Every process's `mine`, in rank order (emulated: just `mine`).
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        match self {
            Ctl::Local => Ok(vec![mine.to_vec()]),
            Ctl::Comm(c) => c.all_gather_bytes(mine).map_err(err),
        }
    }
    fn barrier(&mut self) -> Result<(), String> {
        match self {
            Ctl::Local => Ok(()),
            Ctl::Comm(c) => c.barrier().map_err(err),
        }
    }
    /// Per iteration the slowest rank's time, at the root (`None` elsewhere).
    fn slowest(&mut self, times: Vec<f64>) -> Result<Option<Spread>, String> {
        match self {
            Ctl::Local => {
                let mut t = times;
                Ok(Some(percentiles(&mut t)))
            }
            Ctl::Comm(c) => Ok(c.gather_bytes(&crate::harness::encode_times(&times)).map_err(err)?.map(|all| crate::harness::slowest(&times, &all))),
        }
    }
}

/// One local rank's buffers and stream.
struct Local {
    rank: usize,
    stream: Stream,
    join: Event,
    input: DeviceBuffer,
    output: DeviceBuffer,
}

/// vLLM's custom all-reduce on this process's ranks of one group.
pub(super) struct VllmRanks<'a> {
    api: &'a Api,
    h: Handle,
    world: usize,
    locals: Vec<Local>,
    /// Emulated: the stream that forks to and joins the rank streams, and carries the timing
    /// events (as `RankSet::origin`); rank processes time on their one rank stream.
    origin: Option<Stream>,
    fork: Event,
    start: Event,
    end: Event,
    ctl: Ctl<'a>,
    pub(super) label: String,
    /// The bytes of every local rank's input and output buffer.
    max_bytes: usize,
    /// vLLM's `fully_connected` for this group (its all-gather and reduce-scatter need it).
    pub(super) full_nvlink: bool,
    // Last: streams, events and buffers need the context it holds.
    dev: Device,
}

impl Drop for VllmRanks<'_> {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        for l in &self.locals {
            let _ = l.stream.synchronize();
        }
        // SAFETY: h came from create and is destroyed once; every call on it has finished
        // (the streams were synchronized above; destroy synchronizes the device again).
        unsafe { (self.api.destroy)(self.h) };
    }
}

fn dtype_code(d: DType) -> c_int {
    d.code() as c_int
}

impl<'a> VllmRanks<'a> {
    pub(super) fn new(api: &'a Api, site: Site<'a>, max_bytes: usize) -> Result<VllmRanks<'a>, String> {
        let max_bytes = max_bytes.max(16).div_ceil(16) * 16;
        let (ordinal, world, ranks, full_nvlink, ctl, label) = match site {
            // On one GPU every "peer" is local memory: the fully connected case, where vLLM
            // runs its one- and two-stage kernels by size (without full NVLink it runs more
            // than two ranks not at all).
            Site::Emulated { device, world } => (device.ordinal, world, (0..world).collect::<Vec<_>>(), true, Ctl::Local, "cuda-emulated-p2p".to_string()),
            Site::Rank { comm, shared } => {
                if shared {
                    eprintln!("# vllm: every rank process on GPU 0: a correctness test; the processes time-slice the GPU, so the times measure that");
                }
                // vLLM's is_fully_connected: every pair of the group's GPUs on NVLink.
                let t = comm.topology();
                let n = comm.world();
                let nvlink = (0..n).all(|i| (0..n).all(|j| i == j || t.links.get(i).and_then(|r| r.get(j)).is_some_and(|l| l.class.is_nvlink())));
                let full = nvlink || shared;
                (comm.device().ordinal, comm.world(), vec![comm.rank()], full, Ctl::Comm(comm), "cuda".to_string())
            }
        };
        let dev = Device::open(ordinal).map_err(err)?;
        let mut locals = Vec::with_capacity(ranks.len());
        for &rank in &ranks {
            locals.push(Local {
                rank,
                stream: Stream::new(&dev).map_err(err)?,
                join: Event::new(&dev).map_err(err)?,
                input: DeviceBuffer::new(&dev, max_bytes).map_err(err)?,
                output: DeviceBuffer::new(&dev, max_bytes).map_err(err)?,
            });
        }
        let origin = if ranks.len() > 1 { Some(Stream::new(&dev).map_err(err)?) } else { None };
        let (fork, start, end) = (Event::new(&dev).map_err(err)?, Event::new(&dev).map_err(err)?, Event::new(&dev).map_err(err)?);
        let ranks_c: Vec<c_int> = ranks.iter().map(|&r| r as c_int).collect();
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: ranks_c holds nlocal ranks; h receives a handle or stays null on failure.
        let rc = unsafe { (api.create)(ordinal as c_int, world as c_int, ranks_c.as_ptr(), ranks_c.len() as c_int, max_bytes, c_int::from(full_nvlink), tpar::settings::vllm_blocks().unwrap_or(0) as c_int, &mut h) };
        api.rc(rc, "create")?;
        // From here `me` owns h: dropping it destroys h.
        let mut me = VllmRanks { api, h, world, locals, origin, fork, start, end, ctl, label, max_bytes, full_nvlink, dev };
        me.connect()?;
        Ok(me)
    }

    fn connect(&mut self) -> Result<(), String> {
        if matches!(self.ctl, Ctl::Local) {
            // SAFETY: h is live.
            self.api.rc(unsafe { (self.api.connect_local)(self.h) }, "connect")?;
            return Ok(());
        }
        let mut mine = vec![0u8; 256];
        let mut len = 0usize;
        // SAFETY: mine has 256 bytes, more than the 2 x 64 bytes of handles written.
        self.api.rc(unsafe { (self.api.export)(self.h, mine.as_mut_ptr(), mine.len(), &mut len) }, "export")?;
        mine.truncate(len);
        let all = self.ctl.all_gather(&mine)?;
        if all.len() != self.world || all.iter().any(|b| b.len() != len) {
            return Err("vllm: the ranks' IPC handles differ in number or size".into());
        }
        let flat: Vec<u8> = all.concat();
        // SAFETY: flat holds world exports of len bytes each, in rank order.
        self.api.rc(unsafe { (self.api.connect)(self.h, flat.as_ptr(), len) }, "connect")?;
        self.ctl.barrier()
    }

    pub(super) fn info(&self) -> String {
        // SAFETY: info returns a NUL-terminated string owned by the live handle; copied at once.
        unsafe { CStr::from_ptr((self.api.info)(self.h)) }.to_string_lossy().into_owned()
    }

    /// vLLM's blocks per call of `c` (all resident with every local rank's).
    pub(super) fn block_limit(&self, c: Collective) -> Result<i32, String> {
        // SAFETY: h is live.
        self.api.rc(unsafe { (self.api.block_limit)(self.h, c.code() as c_int) }, "block_limit")
    }

    /// vLLM's kernel for a call of `bytes`: `1stage` or `2stage`.
    pub(super) fn stage(&self, bytes: usize) -> Result<u32, String> {
        // SAFETY: h is live.
        self.api.rc(unsafe { (self.api.stage)(self.h, bytes) }, "stage").map(|s| s as u32)
    }

    fn timing_stream(&self) -> &Stream {
        self.origin.as_ref().unwrap_or(&self.locals[0].stream)
    }

    fn capturing_many(&self) -> bool {
        self.origin.is_some()
    }

    /// One call of every local rank on its own stream (`count` per rank as
    /// `Collective::io_elems` takes it). Eager and emulated: forked from and joined into the
    /// origin stream, as `RankSet` launches tpar's ranks.
    fn enqueue(&self, c: Collective, d: DType, count: usize, capturing: bool) -> Result<(), String> {
        let (entry, what) = match c {
            Collective::AllReduce => (self.api.all_reduce, "all_reduce"),
            Collective::AllGather => (self.api.all_gather, "all_gather"),
            Collective::ReduceScatter => (self.api.reduce_scatter, "reduce_scatter"),
        };
        let (ins, outs) = c.io_elems(count, self.world);
        if ins.max(outs).saturating_mul(d.size()) > self.max_bytes {
            return Err(format!("vllm {what}: {count} elements per rank do not fit its {} B buffers", self.max_bytes));
        }
        let fork_join = self.capturing_many() && !capturing;
        if fork_join {
            self.timing_stream().record(&self.fork).map_err(err)?;
        }
        for (slot, l) in self.locals.iter().enumerate() {
            if fork_join {
                l.stream.wait(&self.fork).map_err(err)?;
            }
            // SAFETY: input and output are live device buffers of max_bytes, which hold the
            // call's input and output (checked above; the library checks its staged bytes
            // against its own buffers of the same max_bytes); the stream is live; they outlive
            // every enqueued call (synchronized before drop).
            let rc = unsafe {
                entry(
                    self.h,
                    slot as c_int,
                    l.stream.raw as *mut c_void,
                    dtype_code(d),
                    l.input.ptr as *const c_void,
                    l.output.ptr as *mut c_void,
                    count,
                )
            };
            self.api.rc(rc, what)?;
            if fork_join {
                l.stream.record(&l.join).map_err(err)?;
                self.timing_stream().wait(&l.join).map_err(err)?;
            }
        }
        Ok(())
    }

    /// `calls` calls captured into one graph. The all-reduce's read the inputs themselves
    /// (zero copy), registered after the capture as vLLM registers a captured graph's inputs,
    /// before the graph can run; the all-gather's and reduce-scatter's copy their inputs into
    /// the registered buffers inside the graph (vLLM registers nothing for them).
    fn capture(&mut self, c: Collective, d: DType, count: usize, calls: usize) -> Result<Graph, String> {
        for l in &self.locals {
            l.stream.synchronize().map_err(err)?;
        }
        let origin = self.timing_stream();
        origin.begin_capture().map_err(err)?;
        let mut body = Ok(());
        if self.capturing_many() {
            // Fork once around the whole body, as RankSet::capture does.
            body = origin.record(&self.fork).map_err(err);
            for l in &self.locals {
                body = body.and_then(|()| l.stream.wait(&self.fork).map_err(err));
            }
        }
        for _ in 0..calls {
            body = body.and_then(|()| self.enqueue(c, d, count, true));
        }
        if self.capturing_many() {
            for l in &self.locals {
                // Join even after an error: a capture must end joined.
                let j = l.stream.record(&l.join).map_err(err).and_then(|()| origin.wait(&l.join).map_err(err));
                body = body.and(j);
            }
        }
        let graph = origin.end_capture().map_err(err);
        body?;
        let graph = graph?;
        if c == Collective::AllReduce {
            self.register_graph()?;
        }
        Ok(graph)
    }

    fn register_graph(&mut self) -> Result<(), String> {
        if matches!(self.ctl, Ctl::Local) {
            // SAFETY: h is live; no graph of it is running (registration comes before launch).
            self.api.rc(unsafe { (self.api.register_graph_local)(self.h) }, "register_graph_buffers")?;
            return Ok(());
        }
        let mut len = 0usize;
        // SAFETY: a null buffer asks for the size only.
        self.api.rc(unsafe { (self.api.graph_meta)(self.h, std::ptr::null_mut(), 0, &mut len) }, "get_graph_buffer_ipc_meta")?;
        let mut mine = vec![0u8; len];
        // SAFETY: mine holds len bytes, the size just returned.
        self.api.rc(unsafe { (self.api.graph_meta)(self.h, mine.as_mut_ptr(), mine.len(), &mut len) }, "get_graph_buffer_ipc_meta")?;
        let all = self.ctl.all_gather(&mine)?;
        let ptrs: Vec<*const u8> = all.iter().map(|b| b.as_ptr()).collect();
        let lens: Vec<usize> = all.iter().map(Vec::len).collect();
        // SAFETY: world blobs with their lengths, alive for the call.
        self.api.rc(unsafe { (self.api.register_graph)(self.h, ptrs.as_ptr(), lens.as_ptr()) }, "register_graph_buffers")?;
        // Every rank's inputs are registered before any rank launches the graph.
        self.ctl.barrier()
    }

    fn launch(&self, g: &Graph) -> Result<(), String> {
        g.launch(self.timing_stream()).map_err(err)
    }

    fn synchronize(&self) -> Result<(), String> {
        self.timing_stream().synchronize().map_err(err)?;
        for l in &self.locals {
            l.stream.synchronize().map_err(err)?;
        }
        Ok(())
    }

    /// One call of `c` in `mode` (`count` per rank as `Collective::io_elems` takes it) on
    /// `inputs` (every rank's), this process's ranks' outputs poisoned first; returns once it
    /// finished on every local rank.
    fn run_once<T: Element>(&mut self, c: Collective, mode: CaptureMode, count: usize, inputs: &[Vec<T>]) -> Result<(), String> {
        for l in &self.locals {
            l.input.upload(&inputs[l.rank]).map_err(err)?;
            l.output.fill_u32(POISON_WORD).map_err(err)?;
        }
        self.ctl.barrier()?;
        // The graph lives until the synchronize below.
        let mut graph = None;
        match mode {
            CaptureMode::Eager => self.enqueue(c, T::DTYPE, count, false)?,
            CaptureMode::Graph => {
                let g = self.capture(c, T::DTYPE, count, 1)?;
                self.launch(graph.insert(g))?;
            }
        }
        self.synchronize()?;
        drop(graph);
        Ok(())
    }

    /// One checked call in `mode` on fresh random inputs, outputs poisoned first; judged
    /// against vLLM's own summation order bit for bit and the f64 reference's bound, every
    /// rank's output compared. Returns the `#wrong` of the run's table.
    pub(super) fn checked<T: Element>(&mut self, mode: CaptureMode, call: u64, count: usize) -> Result<i64, String> {
        let bytes = count * T::DTYPE.size();
        let stage = self.stage(bytes)?;
        let inputs = all_inputs::<T>(0xbe4c, call, self.world, count);
        self.run_once(Collective::AllReduce, mode, count, &inputs)?;
        let want = vllm_expected(&inputs, stage);
        let mut mine = Vec::new();
        for l in &self.locals {
            let mut out = vec![T::from_f32(0.0); count];
            l.output.download(&mut out).map_err(err)?;
            let o = [count_wrong(&out, &inputs) as u64, bit_diffs(&out, &want) as u64, digest(&out)];
            mine.extend(o.iter().flat_map(|w| w.to_le_bytes()));
        }
        let all: Vec<u8> = self.ctl.all_gather(&mine)?.concat();
        let words: Vec<u64> = all.chunks_exact(8).map(|c| c.try_into().map_or(u64::MAX, u64::from_le_bytes)).collect();
        let (mut wrong, mut inexact, mut identical) = (0u64, 0u64, true);
        for o in words.chunks_exact(3) {
            wrong = wrong.saturating_add(o[0]);
            inexact = inexact.saturating_add(o[1]);
            identical &= o[2] == words[2];
        }
        let bad = wrong.max(inexact) + if identical { 0 } else { count as u64 };
        Ok(i64::try_from(bad).unwrap_or(i64::MAX))
    }

    /// One checked all-gather or reduce-scatter (`count` per rank as `Collective::io_elems`
    /// takes it) in `mode` on fresh random inputs, outputs poisoned first, every rank's output
    /// judged by the CLI's one verifier ([`Judge::for_collective`]) and the verdicts combined
    /// as tpar's ([`Verdict::of_collective`]). The all-gather: a bitwise copy of every rank's
    /// input in rank order. The reduce-scatter: rank q's slice of the rank-order f32 sum
    /// rounded once, bit for bit, and within the f64 reference's bound, the contract tpar's
    /// kernels are held to (not NCCL's looser one): vLLM's cross_device_reduce_scatter adds
    /// the ranks' registered buffers in rank order in f32 and rounds once (`packed_reduce`,
    /// the same sum as its one-stage all-reduce). Returns the `#wrong` of the run's table.
    pub(super) fn checked_collective<T: Element>(&mut self, c: Collective, mode: CaptureMode, call: u64, count: usize) -> Result<i64, String> {
        if c == Collective::AllReduce {
            return self.checked::<T>(mode, call, count);
        }
        let (ins, outs) = c.io_elems(count, self.world);
        let inputs = all_inputs::<T>(0xbe4c, call, self.world, ins);
        self.run_once(c, mode, count, &inputs)?;
        // `OneshotPush`: the contract of tpar's kernels (see above), not an algorithm vLLM ran.
        let judge = Judge::for_collective(c, &inputs, Algorithm::OneshotPush, &[], Wire::Exact);
        let mut mine = Vec::new();
        for l in &self.locals {
            let mut out = vec![T::from_f32(0.0); outs];
            l.output.download(&mut out).map_err(err)?;
            mine.extend(judge.outcome_of(l.rank, &out).encode());
        }
        let all: Vec<u8> = self.ctl.all_gather(&mine)?.concat();
        let outcomes: Vec<Outcome> = all.chunks(32).map(|b| Outcome::decode(b, outs)).collect();
        if outcomes.len() != self.world {
            return Err(format!("vllm: {} ranks' verdicts for a world of {}", outcomes.len(), self.world));
        }
        Ok(Verdict::of_collective(c, &outcomes, outs).bad_elements())
    }

    /// Per-call microseconds per timed iteration of `c`, as tpar's emulated ranks and rank
    /// processes time theirs (see the module's contract).
    pub(super) fn time(&mut self, c: Collective, d: DType, count: usize, t: Timing) -> Result<Option<Spread>, String> {
        for l in &self.locals {
            l.input.fill_u32(TIMING_WORD).map_err(err)?;
        }
        let inner = t.inner.max(1);
        let graph = match t.mode {
            CaptureMode::Graph => Some(self.capture(c, d, count, inner)?),
            CaptureMode::Eager => None,
        };
        // As GpuRanks::time_local: emulated ranks warm up at least once, rank processes
        // exactly -w.
        let warmup = if self.capturing_many() { t.warmup.max(1) } else { t.warmup };
        let mut samples = Vec::with_capacity(t.iters);
        for k in 0..warmup + t.iters {
            self.ctl.barrier()?;
            self.timing_stream().record(&self.start).map_err(err)?;
            match &graph {
                Some(g) => self.launch(g)?,
                None => {
                    for _ in 0..inner {
                        self.enqueue(c, d, count, false)?;
                    }
                }
            }
            self.timing_stream().record(&self.end).map_err(err)?;
            self.synchronize()?;
            if k >= warmup {
                samples.push(f64::from(self.start.elapsed_ms(&self.end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        self.ctl.slowest(samples)
    }
}

/// vLLM's result for `inputs` (every rank's): an f32 sum rounded once, in vLLM's order. The
/// one-stage kernel adds the ranks in rank order; the two-stage kernel splits the 16-byte
/// vectors into `world` parts (the last part takes the remainder) and rank r sums its part
/// starting from its own input, r, r+1, ..., wrapping (custom_all_reduce.cuh,
/// cross_device_reduce_2stage: `ptrs[i] = _dp->ptrs[(rank + i) % ngpus]`).
pub fn vllm_expected<T: Element>(inputs: &[Vec<T>], stage: u32) -> Vec<T> {
    let n = inputs.len();
    let count = inputs.first().map_or(0, Vec::len);
    let per_vec = 16 / T::DTYPE.size();
    let part = count / per_vec / n.max(1);
    (0..count)
        .map(|i| {
            let owner = match (stage, part) {
                (1, _) => 0,
                (_, 0) => n - 1,
                _ => (i / per_vec / part).min(n - 1),
            };
            let mut acc = inputs[owner][i].to_f32();
            for k in 1..n {
                acc += inputs[(owner + k) % n][i].to_f32();
            }
            T::from_f32(acc)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpar::testing::expected;

    #[test]
    fn one_stage_order_is_rank_order() {
        // vLLM's one-stage kernel sums in rank order, f32, rounded once: tpar's reference.
        for world in [2, 4, 8] {
            let inputs = all_inputs::<tpar::bf16>(7, world as u64, world, 4096);
            assert_eq!(bit_diffs(&vllm_expected(&inputs, 1), &expected(&inputs)), 0);
            let f = all_inputs::<f32>(7, world as u64, world, 1000);
            assert_eq!(bit_diffs(&vllm_expected(&f, 1), &expected(&f)), 0);
        }
    }

    #[test]
    fn reduce_scatter_is_held_to_its_rank_order_sum() {
        // vLLM's cross_device_reduce_scatter sums rank q's slice as its one-stage all-reduce
        // sums everything (packed_reduce: rank order, f32, rounded once): the verifier's
        // reduce-scatter contract, bit for bit.
        let (world, n) = (4, 8 * 64);
        let rs = Collective::ReduceScatter;
        let inputs = all_inputs::<tpar::bf16>(5, 11, world, n * world);
        let judge = Judge::for_collective(rs, &inputs, Algorithm::OneshotPush, &[], Wire::Exact);
        let sum = vllm_expected(&inputs, 1);
        for q in 0..world {
            let o = judge.outcome_of(q, &sum[q * n..(q + 1) * n]);
            assert_eq!((o.wrong, o.inexact), (0, 0), "rank {q}");
        }
        // Another order (each slice started at its own rank, f32 shows it) is caught.
        let f = all_inputs::<f32>(5, 12, world, n * world);
        let judge = Judge::for_collective(rs, &f, Algorithm::OneshotPush, &[], Wire::Exact);
        let rotated = vllm_expected(&f, 2);
        let inexact: usize = (0..world).map(|q| judge.outcome_of(q, &rotated[q * n..(q + 1) * n]).inexact).sum();
        assert!(inexact > 0);
        // A slice of the wrong rank is wrong.
        assert!(judge.outcome_of(1, &vllm_expected(&f, 1)[..n]).wrong > 0);
    }

    #[test]
    fn two_stage_order_starts_at_the_owner() {
        // f32: 4 elements per 16-byte vector; 43 vectors on 4 ranks: parts of 10, the last 13.
        // (In f32 the order shows in the result; in bf16 the final rounding mostly hides it.)
        let world = 4;
        let count = 4 * 43;
        let inputs = all_inputs::<f32>(3, 9, world, count);
        let got = vllm_expected(&inputs, 2);
        let from = |r: usize| expected(&(0..world).map(|k| inputs[(r + k) % world].clone()).collect::<Vec<_>>());
        // Rank 0's part (vectors 0..10) in rank order, rank 2's (20..30) from rank 2: 2, 3,
        // 0, 1; the last rank's (30..43) from rank 3.
        assert_eq!(bit_diffs(&got[..40], &from(0)[..40]), 0);
        assert_eq!(bit_diffs(&got[80..120], &from(2)[80..120]), 0);
        assert_eq!(bit_diffs(&got[120..], &from(3)[120..]), 0);
        // The order matters: the same parts in rank order differ somewhere.
        assert!(bit_diffs(&got[80..], &from(0)[80..]) > 0);
        // Every element is within the f64 bound either way.
        assert_eq!(count_wrong(&got, &inputs), 0);
        // Fewer vectors than ranks: the last rank reduces everything.
        let small = all_inputs::<f32>(3, 10, world, 4 * 3);
        let from3 = expected(&(0..world).map(|k| small[(3 + k) % world].clone()).collect::<Vec<_>>());
        assert_eq!(bit_diffs(&vllm_expected(&small, 2), &from3), 0);
        // bf16: 8 elements per vector, the same partition.
        let b = all_inputs::<tpar::bf16>(4, 9, 8, 8 * 8 * 3);
        let rotated = expected(&(0..8).map(|k| b[(5 + k) % 8].clone()).collect::<Vec<_>>());
        assert_eq!(bit_diffs(&vllm_expected(&b, 2)[8 * 15..8 * 18], &rotated[8 * 15..8 * 18]), 0);
    }
}
