//! Peers: another project's all-reduce kernel timed beside tpar's, in the same run and the same
//! group, by the same harness (`tpar bench --compare vllm`). Today one peer: vLLM's custom
//! all-reduce (`vllm::CustomAllreduce`), through the small C API of
//! `bench/compare/vllm_ar/peer.cu`, which `bench/compare/vllm.sh` compiles against vLLM's
//! downloaded headers on the GPU machine; this module loads that library with libloading.
//!
//! Owns: loading a peer library, driving it on emulated ranks (streams of one GPU, the peers'
//! pointers plain device pointers) or as one rank per GPU process (IPC handles exchanged over
//! tpar's control plane), its correctness check and its timings, and the table of tpar / peer.
//! Timed exactly as [`super::emulated::EmulatedRanks::time_op`] and `GpuGroup::time_local`
//! time tpar: the same K calls per iteration (back to back, or captured once in one graph and
//! replayed), the same events on the same kind of origin stream, the same fork/join of rank
//! streams, the same warm-up, medians and p10/p90, per iteration the slowest rank.
//! Must never: time a peer whose results were not checked in the same run (unless `-c 0`
//! asked, as for tpar's blocks), run a peer's
//! spin-waiting kernels with more blocks than one GPU holds at once (they would deadlock), or
//! present a time-sliced run (rank processes sharing one GPU) as a measurement.

use super::verify::{err, POISON_WORD, TIMING_WORD};
use super::output::BenchRecord;
use super::{Group, Timing};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use tpar::cuda::driver::{Device, DeviceBuffer, Event, Graph, Stream};
use tpar::cuda::GpuCommunicator;
use tpar::plan::CaptureMode;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest};
use tpar::units::{percentiles, Spread};
use tpar::{Algorithm, DType, Element};

/// The API version of `bench/compare/vllm_ar/peer.cu` this module speaks (its `kAbi`).
const PEER_ABI: c_int = 1;

/// Where `bench/compare/vllm.sh` puts the library, relative to the repository root (an
/// ignored folder).
pub const VLLM_DEFAULT_LIB: &str = ".gpu/vllm-build/libtpar_vllm_ar.so";

/// The topology whose plan stands for "tpar's pick" on emulated ranks, which have no fabric and
/// so no plan of their own: every peer of an emulated rank is local memory, as on NVSwitch.
pub const EMULATED_PLAN_PRESET: &str = "h200-nvswitch-8";

/// Call ids of the peer's checked calls (tpar's blocks use the algorithm's code; `0x7065` is
/// "pe"): different inputs from tpar's, fresh per size and mode.
const PEER_CALL_TAG: u64 = 0x7065 << 40;

/// One `--compare` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSpec {
    pub name: String,
    pub lib: PathBuf,
}

/// `--compare vllm[=LIB],...`: the peers to time. Known: `vllm`.
pub fn parse(s: &str) -> Result<Vec<PeerSpec>, String> {
    let mut v: Vec<PeerSpec> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let (name, lib) = match item.split_once('=') {
            Some((n, p)) => (n.trim(), Some(PathBuf::from(p.trim()))),
            None => (item, None),
        };
        match name {
            "vllm" => {
                let lib = lib.or_else(tpar::settings::vllm_lib).unwrap_or_else(|| PathBuf::from(VLLM_DEFAULT_LIB));
                v.push(PeerSpec { name: name.into(), lib });
            }
            "flashinfer" | "b12x" => {
                return Err(format!(
                    "--compare {name}: its all-reduce runs one process per GPU from Python (bench/compare/peers_multi_gpu.py), not inside tpar bench"
                ))
            }
            other => return Err(format!("--compare {other:?}: known peers: vllm (vllm=PATH for the library's path)")),
        }
    }
    if v.is_empty() {
        return Err("--compare: name a peer (vllm)".into());
    }
    v.dedup_by(|a, b| a.name == b.name);
    Ok(v)
}

/// Fails unless every peer's library exists, with the command that builds it.
pub fn check_libs(peers: &[PeerSpec]) -> Result<(), String> {
    for p in peers {
        if !p.lib.is_file() {
            return Err(format!(
                "--compare {}: no library at {} (build it on the GPU machine with bench/compare/vllm.sh, which needs nvcc; or give vllm=PATH)",
                p.name,
                p.lib.display()
            ));
        }
    }
    Ok(())
}

/// Where a group's ranks are, as a peer needs to know it.
pub enum Site<'a> {
    /// Every rank of the world as a stream of this one GPU, in this process.
    Emulated { device: &'a Device, world: usize },
    /// This process is one rank (GPU `comm.device()`); the control plane exchanges bytes.
    /// `shared`: every rank on GPU 0 (a correctness test; the processes time-slice it).
    Rank { comm: &'a mut GpuCommunicator, shared: bool },
}

/// What the peers run: the same sizes, dtypes, modes and timing as tpar's blocks.
#[derive(Clone, Debug)]
pub struct PeerRun {
    pub sizes: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub modes: Vec<CaptureMode>,
    pub inner: usize,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub sequence: Option<(usize, usize)>,
}

/// One measured point of a peer, as `--json` writes it beside tpar's records.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerRecord {
    pub peer: String,
    /// `cuda-emulated-p2p` or `cuda`; `-sequenceN` appended for a `--sequence` step.
    pub backend: String,
    pub dtype: DType,
    pub world: usize,
    pub bytes: usize,
    pub count: usize,
    pub time_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// As tpar's `#wrong`; -1 unchecked.
    pub wrong: i64,
    pub mode: CaptureMode,
    pub inner: usize,
    /// The peer's own kernel choice for this size (vLLM: `1stage` or `2stage`).
    pub kernel: String,
    pub blocks_max: i32,
}

/// One line of the comparison: tpar against one peer at one point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub peer: String,
    pub mode: CaptureMode,
    pub dtype: DType,
    pub world: usize,
    pub bytes: usize,
    /// Calls per step for a `--sequence` line, else 1.
    pub calls: usize,
    /// tpar's plan pick and its time (None: the plan picks what this group does not run).
    pub tpar_plan: Algorithm,
    pub tpar_plan_us: Option<f64>,
    pub tpar_fastest: Option<Algorithm>,
    pub tpar_fastest_us: Option<f64>,
    pub peer_us: f64,
    /// tpar / peer: below 1, tpar is faster.
    pub plan_over_peer: Option<f64>,
    pub fastest_over_peer: Option<f64>,
}

/// `--json FILE`: the peers' records and comparison lines go to `FILE` with `.peers.json` in
/// place of `.json` (tpar's own records keep their file and schema).
pub fn json_path(tpar_json: &Path) -> PathBuf {
    let stem = tpar_json.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    tpar_json.with_file_name(format!("{stem}.peers.json"))
}

pub fn write_json(path: &Path, records: &[PeerRecord], comparisons: &[Comparison]) -> Result<(), String> {
    let v = serde_json::json!({ "peers": records, "comparison": comparisons });
    let s = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, s).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The peers of one `tpar bench --compare` run, across its groups.
pub struct Session {
    peers: Vec<PeerSpec>,
    /// Each peer's library, loaded at the first group and kept loaded to the end of the
    /// process (it links the CUDA runtime statically: no unload and reload between groups).
    apis: Vec<Option<Api>>,
    run: PeerRun,
    records: Vec<PeerRecord>,
    lines: Vec<Comparison>,
}

impl Session {
    /// `--compare` of a run on `target`, checked before any rank starts: known peers, their
    /// libraries present, the peers' JSON path writable. `None`: no `--compare`.
    pub fn new(compare: Option<&str>, target: &super::Target, json: Option<&Path>, run: PeerRun) -> Result<Option<Session>, String> {
        let Some(s) = compare else { return Ok(None) };
        if !matches!(target, super::Target::Emulated { .. } | super::Target::Gpu) {
            return Err("--compare times peers on GPUs: use --emulate-ranks N on one GPU, or --backend cuda across GPUs".into());
        }
        let peers = parse(s)?;
        if super::first_process() {
            check_libs(&peers)?;
            if let Some(j) = json {
                super::output::check_writable("--json (the peers' file)", &json_path(j))?;
            }
        }
        let apis = peers.iter().map(|_| None).collect();
        Ok(Some(Session { peers, apis, run, records: Vec::new(), lines: Vec::new() }))
    }

    /// After tpar's blocks of group `g` (`tpar`: every record so far): the peers on the same
    /// group. Returns their wrong elements.
    pub fn after_group(&mut self, g: &mut dyn Group, tpar: &[BenchRecord]) -> Result<i64, String> {
        for (spec, api) in self.peers.iter().zip(self.apis.iter_mut()) {
            if api.is_none() {
                *api = Some(Api::load(&spec.lib)?);
            }
        }
        let peers: Vec<(&PeerSpec, &Api)> = self.peers.iter().zip(self.apis.iter().flatten()).collect();
        compare(g, &peers, &self.run, tpar, &mut self.records, &mut self.lines)
    }

    /// Writes the peers' records and comparison lines beside `--json` (at the root).
    pub fn write(&self, json: Option<&Path>) -> Result<(), String> {
        if let Some(j) = json {
            let p = json_path(j);
            write_json(&p, &self.records, &self.lines)?;
            println!("# wrote {} peer records and {} comparison lines to {}", self.records.len(), self.lines.len(), p.display());
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// The library.
// ------------------------------------------------------------------------------------------

type Handle = *mut c_void;

/// `bench/compare/vllm_ar/peer.cu`'s entry points, resolved once.
struct Api {
    last_error: unsafe extern "C" fn() -> *const c_char,
    create: unsafe extern "C" fn(c_int, c_int, *const c_int, c_int, usize, c_int, c_int, *mut Handle) -> c_int,
    info: unsafe extern "C" fn(Handle) -> *const c_char,
    block_limit: unsafe extern "C" fn(Handle) -> c_int,
    connect_local: unsafe extern "C" fn(Handle) -> c_int,
    export: unsafe extern "C" fn(Handle, *mut u8, usize, *mut usize) -> c_int,
    connect: unsafe extern "C" fn(Handle, *const u8, usize) -> c_int,
    stage: unsafe extern "C" fn(Handle, usize) -> c_int,
    all_reduce: unsafe extern "C" fn(Handle, c_int, *mut c_void, c_int, *const c_void, *mut c_void, usize) -> c_int,
    register_graph_local: unsafe extern "C" fn(Handle) -> c_int,
    graph_meta: unsafe extern "C" fn(Handle, *mut u8, usize, *mut usize) -> c_int,
    register_graph: unsafe extern "C" fn(Handle, *const *const u8, *const usize) -> c_int,
    destroy: unsafe extern "C" fn(Handle),
    // Last: the function pointers above point into it.
    _lib: Library,
}

impl Api {
    fn load(path: &Path) -> Result<Api, String> {
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
            Ctl::Comm(c) => Ok(c.gather_bytes(&super::encode_times(&times)).map_err(err)?.map(|all| super::slowest(&times, &all))),
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
struct VllmRanks<'a> {
    api: &'a Api,
    h: Handle,
    world: usize,
    locals: Vec<Local>,
    /// Emulated: the stream that forks to and joins the rank streams, and carries the timing
    /// events (as `EmulatedGroup::origin`); rank processes time on their one rank stream.
    origin: Option<Stream>,
    fork: Event,
    start: Event,
    end: Event,
    ctl: Ctl<'a>,
    label: String,
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
    fn new(api: &'a Api, site: Site<'a>, max_bytes: usize) -> Result<VllmRanks<'a>, String> {
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
        let rc = unsafe { (api.create)(ordinal as c_int, world as c_int, ranks_c.as_ptr(), ranks_c.len() as c_int, max_bytes, c_int::from(full_nvlink), 0, &mut h) };
        api.rc(rc, "create")?;
        // From here `me` owns h: dropping it destroys h.
        let mut me = VllmRanks { api, h, world, locals, origin, fork, start, end, ctl, label, dev };
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

    fn info(&self) -> String {
        // SAFETY: info returns a NUL-terminated string owned by the live handle; copied at once.
        unsafe { CStr::from_ptr((self.api.info)(self.h)) }.to_string_lossy().into_owned()
    }

    fn block_limit(&self) -> i32 {
        // SAFETY: h is live.
        unsafe { (self.api.block_limit)(self.h) }
    }

    /// vLLM's kernel for a call of `bytes`: `1stage` or `2stage`.
    fn stage(&self, bytes: usize) -> Result<u32, String> {
        // SAFETY: h is live.
        self.api.rc(unsafe { (self.api.stage)(self.h, bytes) }, "stage").map(|s| s as u32)
    }

    fn timing_stream(&self) -> &Stream {
        self.origin.as_ref().unwrap_or(&self.locals[0].stream)
    }

    fn capturing_many(&self) -> bool {
        self.origin.is_some()
    }

    /// One call of every local rank on its own stream. Eager and emulated: forked from and
    /// joined into the origin stream, as `EmulatedGroup` launches tpar's ranks.
    fn enqueue(&self, d: DType, count: usize, capturing: bool) -> Result<(), String> {
        let fork_join = self.capturing_many() && !capturing;
        if fork_join {
            self.timing_stream().record(&self.fork).map_err(err)?;
        }
        for (slot, l) in self.locals.iter().enumerate() {
            if fork_join {
                l.stream.wait(&self.fork).map_err(err)?;
            }
            // SAFETY: input and output are live device buffers of max_bytes >= count * size
            // (the library checks the size against its own buffers of the same max_bytes); the
            // stream is live; they outlive every enqueued call (synchronized before drop).
            let rc = unsafe {
                (self.api.all_reduce)(
                    self.h,
                    slot as c_int,
                    l.stream.raw as *mut c_void,
                    dtype_code(d),
                    l.input.ptr as *const c_void,
                    l.output.ptr as *mut c_void,
                    count,
                )
            };
            self.api.rc(rc, "all_reduce")?;
            if fork_join {
                l.stream.record(&l.join).map_err(err)?;
                self.timing_stream().wait(&l.join).map_err(err)?;
            }
        }
        Ok(())
    }

    /// `calls` calls captured into one graph (zero copy: the inputs themselves), then
    /// registered as vLLM registers a captured graph's inputs, before the graph can run.
    fn capture(&mut self, d: DType, count: usize, calls: usize) -> Result<Graph, String> {
        for l in &self.locals {
            l.stream.synchronize().map_err(err)?;
        }
        let origin = self.timing_stream();
        origin.begin_capture().map_err(err)?;
        let mut body = Ok(());
        if self.capturing_many() {
            // Fork once around the whole body, as EmulatedGroup::capture does.
            body = origin.record(&self.fork).map_err(err);
            for l in &self.locals {
                body = body.and_then(|()| l.stream.wait(&self.fork).map_err(err));
            }
        }
        for _ in 0..calls {
            body = body.and_then(|()| self.enqueue(d, count, true));
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
        self.register_graph()?;
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

    /// One checked call in `mode` on fresh random inputs, outputs poisoned first; judged
    /// against vLLM's own summation order bit for bit and the f64 reference's bound, every
    /// rank's output compared. Returns the `#wrong` of the run's table.
    fn checked<T: Element>(&mut self, mode: CaptureMode, call: u64, count: usize) -> Result<i64, String> {
        let bytes = count * T::DTYPE.size();
        let stage = self.stage(bytes)?;
        let inputs = all_inputs::<T>(0xbe4c, call, self.world, count);
        for l in &self.locals {
            l.input.upload(&inputs[l.rank]).map_err(err)?;
            l.output.fill_u32(POISON_WORD).map_err(err)?;
        }
        self.ctl.barrier()?;
        // The graph lives until the synchronize below.
        let mut graph = None;
        match mode {
            CaptureMode::Eager => self.enqueue(T::DTYPE, count, false)?,
            CaptureMode::Graph => {
                let g = self.capture(T::DTYPE, count, 1)?;
                self.launch(graph.insert(g))?;
            }
        }
        self.synchronize()?;
        drop(graph);
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

    /// Per-call microseconds per timed iteration, as tpar's emulated ranks and rank
    /// processes time theirs (see the module's contract).
    fn time(&mut self, d: DType, count: usize, t: Timing) -> Result<Option<Spread>, String> {
        for l in &self.locals {
            l.input.fill_u32(TIMING_WORD).map_err(err)?;
        }
        let inner = t.inner.max(1);
        let graph = match t.mode {
            CaptureMode::Graph => Some(self.capture(d, count, inner)?),
            CaptureMode::Eager => None,
        };
        // Emulated ranks warm up at least once (EmulatedRanks::time_op); rank processes as
        // GpuGroup::time_local, exactly -w.
        let warmup = if self.capturing_many() { t.warmup.max(1) } else { t.warmup };
        let mut samples = Vec::with_capacity(t.iters);
        for k in 0..warmup + t.iters {
            self.ctl.barrier()?;
            self.timing_stream().record(&self.start).map_err(err)?;
            match &graph {
                Some(g) => self.launch(g)?,
                None => {
                    for _ in 0..inner {
                        self.enqueue(d, count, false)?;
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

// ------------------------------------------------------------------------------------------
// The comparison.
// ------------------------------------------------------------------------------------------

/// tpar's pick for each point: the group's own plan where it has one (rank processes), else
/// the plan for [`EMULATED_PLAN_PRESET`] at this world (emulated ranks).
fn tpar_pick(g: &mut dyn Group, d: DType, bytes: usize, mode: CaptureMode) -> Algorithm {
    if let Some(a) = g.planned(d, bytes, mode) {
        return a;
    }
    let topology = tpar::Topology::load(EMULATED_PLAN_PRESET).unwrap_or_else(|_| tpar::Topology::cpu());
    let overrides = tpar::Overrides::from_env().unwrap_or_default();
    tpar::plan(&tpar::PlanInput {
        topology: &topology,
        world: g.world(),
        bytes: bytes as u64,
        dtype: d,
        capture: mode,
        backend: tpar::Backend::Cuda,
        profile: None,
        overrides: &overrides,
    })
    .algorithm
}

fn peer_header(name: &str, world: usize, place: &str, modes: &[CaptureMode]) {
    super::table::block_header(name, "p2p (the peer's own buffers)", world, place, modes);
}

fn peer_row(cells: &[PeerRecord], wrong: i64, kernel: &str) {
    let Some(f) = cells.first() else { return };
    let mut s = format!("  {:>10} {:>12} {:>8} {:>6}", f.bytes, f.count, f.dtype.name(), "sum");
    for r in cells {
        s.push_str(&format!(" {:>10.2} {:>9.2} {:>9.2} {:>7.2} {:>7.2}", r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw));
    }
    let wrong = if wrong < 0 { "N/A".to_string() } else { wrong.to_string() };
    println!("{s} {wrong:>6}  {kernel}");
}

#[allow(clippy::too_many_arguments)]
fn record(peer: &str, backend: String, d: DType, world: usize, count: usize, s: Spread, wrong: i64, mode: CaptureMode, inner: usize, kernel: String, blocks_max: i32) -> PeerRecord {
    let bytes = count * d.size();
    let (algbw, busbw) = tpar::report::bandwidths(bytes, world, s.median);
    PeerRecord { peer: peer.into(), backend, dtype: d, world, bytes, count, time_us: s.median, p10_us: s.p10, p90_us: s.p90, algbw, busbw, wrong, mode, inner, kernel, blocks_max }
}

/// Runs every peer of `peers` on group `g` (after tpar's blocks for it: `tpar` holds tpar's
/// records, this group's among them), prints each peer's block, its `--sequence` step, and
/// tpar / peer per point. Collective over rank processes. Returns the peers' wrong elements.
fn compare(
    g: &mut dyn Group,
    peers: &[(&PeerSpec, &Api)],
    run: &PeerRun,
    tpar: &[BenchRecord],
    out: &mut Vec<PeerRecord>,
    lines: &mut Vec<Comparison>,
) -> Result<i64, String> {
    let root = g.root();
    let world = g.world();
    let label = g.label();
    let place = if label == "cuda" { "one process per GPU".to_string() } else { format!("emulated on one GPU, {}", label.trim_start_matches("cuda-emulated-")) };
    // tpar's picks, asked before the peer borrows the group.
    let mut picks = Vec::new();
    for &d in &run.dtypes {
        for &mode in &run.modes {
            for &bytes in run.sizes.iter().chain(run.sequence.as_ref().map(|s| &s.1)) {
                picks.push(((d, mode, bytes), tpar_pick(g, d, bytes, mode)));
            }
        }
    }
    let pick = |d: DType, mode: CaptureMode, bytes: usize| picks.iter().find(|(k, _)| *k == (d, mode, bytes)).map(|(_, a)| *a);
    let max_bytes = run.sizes.iter().copied().chain(run.sequence.map(|s| s.1)).max().unwrap_or(16);
    let mut wrong_total = 0i64;
    for &(p, api) in peers {
        if ![2, 4, 6, 8].contains(&world) {
            if root {
                println!("#\n# {}: skipped at {world} ranks (vLLM's custom all-reduce runs 2, 4, 6 or 8)", p.name);
            }
            continue;
        }
        let Some(site) = g.peer_site() else {
            return Err("--compare runs on GPUs (emulated ranks or one process per GPU)".into());
        };
        let mut v = VllmRanks::new(api, site, max_bytes)?;
        let blocks = v.block_limit();
        if root {
            println!("#");
            println!("# peer: vllm, vLLM 0.33.0's custom all-reduce (vllm::CustomAllreduce of csrc/custom_all_reduce.cuh, built from its sdist by bench/compare/vllm.sh), library {}", p.lib.display());
            println!("#   {}", v.info());
            println!("#   graph mode: inputs captured in the graph, registered after capture (zero copy); eager mode: a copy into its registered buffer, then the kernel (vLLM's eager path)");
            println!("#   checked against vLLM's own summation order (rank order for 1stage; 2stage starts each part at its owner rank), bit for bit, and the f64 bound");
            peer_header(&p.name, world, &place, &run.modes);
        }
        let mut mine: Vec<PeerRecord> = Vec::new();
        for &d in &run.dtypes {
            for &bytes in &run.sizes {
                let count = bytes / d.size();
                if count == 0 || bytes % 16 != 0 || count * d.size() != bytes {
                    if root {
                        println!("  {bytes:>10} {:>12} {:>8}  skipped: vLLM needs a positive multiple of 16 bytes", count, d.name());
                    }
                    continue;
                }
                let kernel = format!("{}stage", v.stage(bytes)?);
                let mut wrong = -1i64;
                if run.check {
                    wrong = 0;
                    for (k, &mode) in run.modes.iter().enumerate() {
                        let call = PEER_CALL_TAG ^ (bytes as u64) ^ ((k as u64) << 56);
                        wrong += by_dtype!(d, T => v.checked::<T>(mode, call, count)?);
                    }
                    wrong_total += wrong;
                }
                let mut row = Vec::new();
                for &mode in &run.modes {
                    let t = Timing { mode, inner: run.inner, warmup: run.warmup, iters: run.iters };
                    if let Some(s) = v.time(d, count, t)? {
                        row.push(record(&p.name, v.label.clone(), d, world, count, s, wrong, mode, run.inner, kernel.clone(), blocks));
                    }
                }
                if root {
                    peer_row(&row, wrong, &kernel);
                }
                mine.extend(row);
            }
        }
        if let Some((calls, bytes)) = run.sequence {
            let d = if run.dtypes.contains(&DType::BF16) { DType::BF16 } else { run.dtypes[0] };
            let count = bytes / d.size();
            if count > 0 && bytes % 16 == 0 && count * d.size() == bytes {
                let kernel = format!("{}stage", v.stage(bytes)?);
                let mut wrong = -1;
                if run.check {
                    wrong = 0;
                    for (k, &mode) in run.modes.iter().enumerate() {
                        let call = PEER_CALL_TAG ^ (bytes as u64) ^ ((k as u64 + 8) << 56);
                        wrong += by_dtype!(d, T => v.checked::<T>(mode, call, count)?);
                    }
                    wrong_total += wrong;
                }
                if root {
                    println!("#");
                    println!("# Sequence (peer {}): {calls} all-reduces of {bytes} B {d} per step, {kernel}; us per step, median [p10-p90], slowest rank; #wrong {wrong}", p.name);
                }
                for &mode in &run.modes {
                    let t = Timing { mode, inner: calls, warmup: run.warmup.min(3), iters: run.iters };
                    if let Some(s) = v.time(d, count, t)? {
                        let c = calls as f64;
                        if root {
                            println!("  {:>6} {:>14} {:>10.1} us [{:.1}-{:.1}]  {:>6.2} us per call", mode.name(), p.name, s.median * c, s.p10 * c, s.p90 * c, s.median);
                        }
                        mine.push(record(&p.name, format!("{}-sequence{calls}", v.label), d, world, count, s, wrong, mode, calls, kernel.clone(), blocks));
                    }
                }
            } else if root {
                println!("# Sequence (peer {}): skipped: {bytes} B is not a multiple of 16 bytes", p.name);
            }
        }
        drop(v);
        if root {
            let here: Vec<Comparison> = mine.iter().map(|r| compare_one(r, tpar, &label, world, pick(r.dtype, r.mode, r.bytes))).collect();
            print_comparison(&p.name, &here);
            lines.extend(here);
        }
        out.extend(mine);
    }
    Ok(wrong_total)
}

/// tpar against one peer record: the plan's pick and the fastest of tpar's blocks measured
/// in this group at the same point (same mode, dtype, size; sequence steps against tpar's).
fn compare_one(r: &PeerRecord, tpar: &[BenchRecord], label: &str, world: usize, pick: Option<Algorithm>) -> Comparison {
    let calls = if r.backend.contains("-sequence") { r.inner } else { 1 };
    let backend = if calls > 1 { format!("{label}-sequence{calls}") } else { label.to_string() };
    let here = || {
        tpar.iter().filter(|b| {
            b.mode == r.mode && b.record.backend == backend && b.record.world == world && b.record.dtype == r.dtype && b.record.bytes == r.bytes && b.record.wrong <= 0
        })
    };
    let plan = pick.unwrap_or(Algorithm::Nccl);
    let plan_us = here().find(|b| b.record.algorithm == plan).map(|b| b.record.time_us);
    let fastest = here().filter(|b| b.record.algorithm != Algorithm::GatherBcast).min_by(|a, b| a.record.time_us.total_cmp(&b.record.time_us));
    let ratio = |t: Option<f64>| t.filter(|_| r.time_us > 0.0).map(|t| t / r.time_us);
    Comparison {
        peer: r.peer.clone(),
        mode: r.mode,
        dtype: r.dtype,
        world,
        bytes: r.bytes,
        calls,
        tpar_plan: plan,
        tpar_plan_us: plan_us,
        tpar_fastest: fastest.map(|b| b.record.algorithm),
        tpar_fastest_us: fastest.map(|b| b.record.time_us),
        peer_us: r.time_us,
        plan_over_peer: ratio(plan_us),
        fastest_over_peer: ratio(fastest.map(|b| b.record.time_us)),
    }
}

fn print_comparison(peer: &str, lines: &[Comparison]) {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    println!("#");
    println!(
        "# tpar against {peer}, this group, same harness (median us per call; ratio = tpar / {peer}: below 1 tpar is faster). \
         tpar's pick: the plan here, or on emulated ranks the plan for {EMULATED_PLAN_PRESET} at this world; '-': not measured in this run"
    );
    println!(
        "# {:>6} {:>9} {:>10} {:>5} {:>14} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9}",
        "mode", "type", "size (B)", "calls", "tpar pick", "(us)", "tpar fastest", "(us)", peer, "pick/", "fastest/"
    );
    for c in lines {
        println!(
            "  {:>6} {:>9} {:>10} {:>5} {:>14} {:>9} {:>14} {:>9} {:>9.2} {:>9} {:>9}",
            c.mode.name(),
            c.dtype.name(),
            c.bytes,
            c.calls,
            c.tpar_plan.name(),
            f(c.tpar_plan_us),
            c.tpar_fastest.map_or("-", |a| a.name()),
            f(c.tpar_fastest_us),
            c.peer_us,
            f(c.plan_over_peer),
            f(c.fastest_over_peer)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpar::testing::expected;

    #[test]
    fn compare_lists_parse() {
        let v = parse("vllm=/x/lib.so").unwrap();
        assert_eq!(v, vec![PeerSpec { name: "vllm".into(), lib: "/x/lib.so".into() }]);
        assert_eq!(parse("vllm,vllm").unwrap().len(), 1);
        assert!(parse("nccl").unwrap_err().contains("known peers"));
        assert!(parse("flashinfer").unwrap_err().contains("peers_multi_gpu.py"));
        assert!(parse(" , ").is_err());
        assert!(check_libs(&parse("vllm=/no/such/lib.so").unwrap()).unwrap_err().contains("vllm.sh"));
    }

    #[test]
    fn json_goes_beside_tpars() {
        assert_eq!(json_path(Path::new("/o/run.json")), PathBuf::from("/o/run.peers.json"));
        assert_eq!(json_path(Path::new("run")), PathBuf::from("run.peers.json"));
    }

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
