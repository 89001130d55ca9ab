//! `tpar._tpar`: the native half of tpar's Python package.
//!
//! Thin wrappers over the public Rust API, with raw addresses as integers (what
//! `tensor.data_ptr()` and `torch.cuda.current_stream().cuda_stream` give), so the wheel links
//! against no libtorch and serves every torch version. The typed, checked API is the
//! pure-Python `tpar.torch`; this module trusts its caller for what Python cannot check here
//! (that an address is live and holds `count` elements), and checks everything else.
//!
//! | class | wraps |
//! |---|---|
//! | [`CpuComm`] | `tpar::CpuCommunicator`: CPU rank processes, POSIX shared memory |
//! | [`GpuComm`] | `tpar::cuda::GpuCommunicator`: one process per GPU, launches on the caller's stream |
//!
//! Contract: every `tpar::Error` becomes an exception of the `TparError` family carrying
//! tpar's own message; nothing panics; the GIL is released around every call that can wait
//! (joining, CPU all-reduces, barriers, synchronising), so other Python threads run and a
//! peer's death is noticed within the timeout.

mod doctor;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::time::Duration;
use std::sync::{Mutex, MutexGuard};
use tpar::cuda::fused::FusedRoute;
use tpar::cuda::{Call, FusedBufs, FusedCall, FusedPath, FusedPattern, GpuCommunicator, GpuOptions, NcclCalls, NcclUse, Route, Served};
use tpar::{bf16, f16, Algorithm, CaptureMode, Collective, CpuCommunicator, Config, DType, Element, Error, Settings};

create_exception!(tpar, TparError, PyException, "Any error of tpar; the message is tpar's own.");
create_exception!(tpar, TparTimeoutError, TparError, "A bounded wait ran out (tpar::Error::Timeout); the communicator is poisoned.");
create_exception!(tpar, PeerDiedError, TparError, "A peer rank's process exited during a call (tpar::Error::PeerDied).");
create_exception!(tpar, AbortedError, TparError, "Another rank failed and raised the shared abort flag (tpar::Error::Aborted).");
create_exception!(tpar, MismatchError, TparError, "Ranks disagree about a call: count, dtype, algorithm or plan inputs (tpar::Error::Mismatch).");
create_exception!(tpar, PoisonedError, TparError, "An earlier error poisoned the communicator (tpar::Error::Poisoned).");
create_exception!(tpar, InvalidArgumentError, TparError, "The caller passed something that cannot work (tpar::Error::InvalidArgument).");
create_exception!(tpar, UnsupportedError, TparError, "This cannot run here (tpar::Error::Unsupported).");
create_exception!(tpar, LibraryError, TparError, "A CUDA library (driver, NVRTC, NCCL, NVML) is missing or failed (tpar::Error::Library, Cuda).");
create_exception!(tpar, ConfigError, TparError, "A TPAR_* setting is malformed (tpar::Error::Config) or a rendezvous was refused.");

/// The exception class for `e`, carrying tpar's message.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Timeout { .. } => TparTimeoutError::new_err(msg),
        Error::PeerDied { .. } => PeerDiedError::new_err(msg),
        Error::Aborted { .. } => AbortedError::new_err(msg),
        Error::Mismatch { .. } => MismatchError::new_err(msg),
        Error::Poisoned { .. } => PoisonedError::new_err(msg),
        Error::InvalidArgument { .. } => InvalidArgumentError::new_err(msg),
        Error::Unsupported { .. } => UnsupportedError::new_err(msg),
        Error::Library { .. } | Error::Cuda { .. } => LibraryError::new_err(msg),
        Error::Config { .. } | Error::Rendezvous { .. } => ConfigError::new_err(msg),
        Error::Io { .. } | Error::Tune { .. } => TparError::new_err(msg),
    }
}

/// The fused family's pattern of a call: a residual unless its address is 0, the Gemma
/// offset, NVFP4 output where block scales' address is given (`scale` then the global
/// scale's), else FP8 output where a scale's address is given.
fn pattern_of(residual: u64, gemma: bool, scale: u64, scale_out: u64) -> FusedPattern {
    FusedPattern { residual: residual != 0, gemma, fp8: scale != 0 && scale_out == 0, nvfp4: scale_out != 0 }
}

/// The dtype named `name` (Rust's one table: `DType::from_str`).
fn dtype_of(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(py_err)
}

fn collective_of(name: &str) -> PyResult<Collective> {
    name.parse::<Collective>().map_err(py_err)
}

/// # Safety
/// `input` and `output` must be valid for `collective.io_elems(count, world)` elements of `T`
/// (reads; reads and writes) for the duration of the call, disjoint, and untouched by anything
/// else meanwhile.
unsafe fn cpu_collective<T: Element>(comm: &mut CpuCommunicator, collective: Collective, algo: Algorithm, count: usize, input: u64, output: u64) -> Result<(), Error> {
    let (ins, outs) = collective.io_elems(count, comm.world());
    if ins == 0 && outs == 0 {
        return comm.collective::<T>(collective, Some(algo), &[], &mut []);
    }
    check_address::<T>("input", input)?;
    check_address::<T>("output", output)?;
    let size = std::mem::size_of::<T>() as u64;
    let (i_end, o_end) = (input.saturating_add(ins as u64 * size), output.saturating_add(outs as u64 * size));
    if input < o_end && output < i_end {
        return Err(Error::InvalidArgument { field: "output", reason: format!("the {collective}'s output overlaps its input") });
    }
    // SAFETY: the caller vouches for both ranges; they are disjoint (checked above).
    let (src, dst) = unsafe { (std::slice::from_raw_parts(input as *const T, ins), std::slice::from_raw_parts_mut(output as *mut T, outs)) };
    comm.collective(collective, Some(algo), src, dst)
}

fn algorithm_of(name: &str) -> PyResult<Algorithm> {
    name.parse::<Algorithm>().map_err(py_err)
}

/// The job's configuration: every `TPAR_*` setting from this process's environment, parsed
/// by tpar's one settings module (`tpar::settings`; every rank reads its own, and ranks that
/// disagree are refused at init), and the values the caller passed explicitly.
fn config(rank: usize, world: usize, path: PathBuf, timeout_ms: Option<i64>, shm_bytes: Option<i64>) -> PyResult<Config> {
    let s = Settings::from_env().map_err(py_err)?;
    let mut c = Config::with_settings(rank, world, &path, &s);
    // The path is a private directory rank 0 made for this job alone (tpar.torch), so the
    // path identifies the job; ranks of engines need not share a parent process.
    c.job_id = tpar::units::fnv1a64(path.as_os_str().as_encoded_bytes());
    if let Some(ms) = timeout_ms {
        let ms = u64::try_from(ms).ok().filter(|&m| m > 0).ok_or_else(|| py_err(Error::InvalidArgument { field: "timeout_ms", reason: format!("{ms}: expected a positive number of milliseconds") }))?;
        c.timeout = Duration::from_millis(ms);
    }
    if let Some(b) = shm_bytes {
        c.shm_budget = usize::try_from(b).ok().filter(|&b| b > 0).ok_or_else(|| py_err(Error::InvalidArgument { field: "shm_bytes", reason: format!("{b}: expected a positive size in bytes") }))?;
    }
    Ok(c)
}

/// Refuses addresses that cannot hold elements of `T`.
fn check_address<T>(field: &'static str, addr: u64) -> Result<(), Error> {
    if addr == 0 || addr % std::mem::align_of::<T>() as u64 != 0 {
        return Err(Error::InvalidArgument {
            field,
            reason: format!("address {addr:#x} is null or not aligned to {} bytes", std::mem::align_of::<T>()),
        });
    }
    Ok(())
}

/// # Safety
/// `input` and `output` must be valid for `count` elements of `T` (reads, and reads and
/// writes) for the duration of the call, and nothing else may access them meanwhile.
unsafe fn cpu_all_reduce<T: Element>(comm: &mut CpuCommunicator, algo: Option<Algorithm>, count: usize, input: u64, output: u64) -> Result<(), Error> {
    if count == 0 {
        // Every rank still takes part (an empty call is a barrier).
        let mut empty: [T; 0] = [];
        return comm.all_reduce_in_place(algo, &mut empty);
    }
    check_address::<T>("input", input)?;
    check_address::<T>("output", output)?;
    let bytes = count
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::InvalidArgument { field: "count", reason: format!("{count} elements overflow") })?;
    if input == output {
        // SAFETY: the caller vouches for `count` elements at `output`, used by nobody else.
        let buf = unsafe { std::slice::from_raw_parts_mut(output as *mut T, count) };
        return comm.all_reduce_in_place(algo, buf);
    }
    let (lo, hi) = (input.min(output), input.max(output));
    if lo + bytes as u64 > hi {
        return Err(Error::InvalidArgument {
            field: "output",
            reason: "overlaps the input without being the same buffer (pass out=None for in place)".into(),
        });
    }
    // SAFETY: the caller vouches for both ranges; they are disjoint (checked above), so the
    // shared and the mutable slice do not alias.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(input as *const T, count),
            std::slice::from_raw_parts_mut(output as *mut T, count),
        )
    };
    match algo {
        Some(a) => comm.all_reduce_with(a, src, dst),
        None => comm.all_reduce(src, dst),
    }
}

/// One rank of a CPU job: `tpar::CpuCommunicator` (POSIX shared memory, Unix-socket rendezvous).
#[pyclass(module = "tpar._tpar")]
pub struct CpuComm {
    inner: Option<CpuCommunicator>,
    rank: usize,
    world: usize,
}

impl CpuComm {
    fn comm(&mut self) -> PyResult<&mut CpuCommunicator> {
        let rank = self.rank;
        self.inner.as_mut().ok_or_else(|| PoisonedError::new_err(format!("rank {rank}: communicator is closed")))
    }
}

#[pymethods]
impl CpuComm {
    /// Joins the job whose rank 0 listens on `path` (every rank passes the same path).
    #[new]
    #[pyo3(signature = (rank, world, path, timeout_ms=None, shm_bytes=None))]
    fn new(py: Python<'_>, rank: usize, world: usize, path: PathBuf, timeout_ms: Option<i64>, shm_bytes: Option<i64>) -> PyResult<Self> {
        let cfg = config(rank, world, path, timeout_ms, shm_bytes)?;
        let comm = py.detach(|| CpuCommunicator::init(&cfg)).map_err(py_err)?;
        Ok(CpuComm { inner: Some(comm), rank, world })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    /// Whether an earlier error poisoned this communicator (or it was closed).
    #[getter]
    fn poisoned(&self) -> bool {
        self.inner.as_ref().map_or(true, |c| c.is_poisoned())
    }

    /// The algorithm the plan picks for `nbytes` of `dtype`.
    fn plan(&mut self, dtype: &str, nbytes: usize) -> PyResult<String> {
        let d = dtype_of(dtype)?;
        Ok(self.comm()?.planned(d, nbytes).name().to_string())
    }

    /// Sums `count` elements at address `input` over all ranks into `output` (`output ==
    /// input`: in place), blocking, with the GIL released. Returns the algorithm's name.
    ///
    /// The addresses must be live host memory of `count` elements of `dtype` that nothing
    /// else touches during the call (`tpar.torch` passes contiguous tensors it has checked).
    #[pyo3(signature = (dtype, count, input, output, algorithm=None))]
    fn all_reduce(&mut self, py: Python<'_>, dtype: &str, count: usize, input: u64, output: u64, algorithm: Option<&str>) -> PyResult<String> {
        let d = dtype_of(dtype)?;
        let forced = algorithm.map(algorithm_of).transpose()?;
        let comm = self.comm()?;
        let algo = match forced {
            Some(a) => a,
            None => comm.planned(d, count.saturating_mul(d.size())),
        };
        // SAFETY: the caller's contract (see the doc comment) is cpu_all_reduce's.
        py.detach(|| unsafe {
            match d {
                DType::F32 => cpu_all_reduce::<f32>(comm, Some(algo), count, input, output),
                DType::F16 => cpu_all_reduce::<f16>(comm, Some(algo), count, input, output),
                DType::BF16 => cpu_all_reduce::<bf16>(comm, Some(algo), count, input, output),
            }
        })
        .map_err(py_err)?;
        Ok(algo.name().to_string())
    }

    /// The algorithm the plan picks for `collective` ("all-gather", "reduce-scatter") of
    /// `nbytes` per rank (the all-gather's input, the reduce-scatter's output) of `dtype`.
    fn plan_collective(&mut self, collective: &str, dtype: &str, nbytes: usize) -> PyResult<String> {
        let (c, d) = (collective_of(collective)?, dtype_of(dtype)?);
        Ok(self.comm()?.planned_for(c, d, nbytes).name().to_string())
    }

    /// One `collective` of `count` elements per rank (an all-gather's input, a reduce-scatter's
    /// output: torch.distributed's shapes), blocking, with the GIL released. Returns the
    /// algorithm's name. Addresses as for `all_reduce`; output and input never overlap.
    #[pyo3(signature = (collective, dtype, count, input, output, algorithm=None))]
    #[allow(clippy::too_many_arguments)]
    fn collective(&mut self, py: Python<'_>, collective: &str, dtype: &str, count: usize, input: u64, output: u64, algorithm: Option<&str>) -> PyResult<String> {
        let (c, d) = (collective_of(collective)?, dtype_of(dtype)?);
        let forced = algorithm.map(algorithm_of).transpose()?;
        let comm = self.comm()?;
        let algo = match forced {
            Some(a) => a,
            None => comm.planned_for(c, d, count.saturating_mul(d.size())),
        };
        // SAFETY: the caller's contract (see the doc comment) is cpu_collective's.
        py.detach(|| unsafe {
            match d {
                DType::F32 => cpu_collective::<f32>(comm, c, algo, count, input, output),
                DType::F16 => cpu_collective::<f16>(comm, c, algo, count, input, output),
                DType::BF16 => cpu_collective::<bf16>(comm, c, algo, count, input, output),
            }
        })
        .map_err(py_err)?;
        Ok(algo.name().to_string())
    }

    /// Waits until every rank gets here (or raises within the timeout).
    fn barrier(&mut self, py: Python<'_>) -> PyResult<()> {
        let comm = self.comm()?;
        py.detach(|| comm.barrier()).map_err(py_err)
    }

    /// Leaves the job: unmaps the shared workspace. Later calls raise `PoisonedError`.
    fn close(&mut self) {
        self.inner = None;
    }
}

/// One rank of a GPU job: `tpar::cuda::GpuCommunicator` on this process's GPU. Usable from
/// any thread (engines run the forward pass in worker threads, e.g. vLLM's dual-batch
/// overlap): the communicator sits behind a mutex, every method takes it with the GIL
/// released, and tpar binds its CUDA context on the calling thread.
#[pyclass(module = "tpar._tpar")]
pub struct GpuComm {
    inner: Mutex<Option<SendGpu>>,
    rank: usize,
    world: usize,
}

/// A GPU communicator that may move between threads.
struct SendGpu(GpuCommunicator);

// SAFETY: GpuCommunicator holds CUDA handles (context, streams, events, module functions,
// IPC mappings), host memory and a watchdog thread's handle; the driver API lets any thread
// use them while the context is current, and every call path binds the context on the
// calling thread first (`Device::bind`). The mutex in `GpuComm` gives one thread at a time.
unsafe impl Send for SendGpu {}

/// Where a call the plan gives to NCCL goes: `nccl` (the binding's flag): on tpar's own NCCL
/// where it joined one; else always the caller's (torch's NCCL group).
fn nccl_calls(nccl: bool) -> NcclCalls {
    if nccl {
        NcclCalls::CallersIfNone
    } else {
        NcclCalls::Callers
    }
}

fn mode(graph: bool) -> CaptureMode {
    if graph {
        CaptureMode::Graph
    } else {
        CaptureMode::Eager
    }
}

impl GpuComm {
    /// The communicator, locked. Called with the GIL released (`py.detach`), so a thread
    /// that waits here never holds the GIL from the thread it waits for.
    fn lock(&self) -> PyResult<MutexGuard<'_, Option<SendGpu>>> {
        // A poisoned lock means a panic in another thread mid-call (none is expected: tpar
        // returns errors); the communicator's own state says whether it is still usable.
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut GpuCommunicator) -> Result<T, Error> + Send) -> PyResult<T> {
        let rank = self.rank;
        py.detach(|| {
            let mut g = self.lock()?;
            let c = g.as_mut().ok_or_else(|| PoisonedError::new_err(format!("rank {rank}: communicator is closed")))?;
            f(&mut c.0).map_err(py_err)
        })
    }
}

#[pymethods]
impl GpuComm {
    /// Joins the job whose rank 0 listens on `path`, on CUDA device `device` (the ordinal as
    /// this process sees it), for tpar's kernels up to `max_bytes` (larger calls: NCCL).
    /// `topology`: the fabric to plan for — a preset name, a JSON file, or None for
    /// `TPAR_TOPOLOGY`, else the fabric NVML discovers (ranks are placed on it by their
    /// GPUs' PCI addresses). `nccl`: whether tpar joins an NCCL communicator of its own for
    /// the calls its plan gives to NCCL (False: the caller runs those on its own NCCL).
    #[new]
    #[pyo3(signature = (rank, world, path, device, max_bytes, timeout_ms=None, topology=None, nccl=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, rank: usize, world: usize, path: PathBuf, device: usize, max_bytes: usize, timeout_ms: Option<i64>, topology: Option<String>, nccl: bool) -> PyResult<Self> {
        let cfg = config(rank, world, path, timeout_ms, None)?;
        let topology = topology.map(|t| tpar::Topology::load(&t)).transpose().map_err(py_err)?;
        let opts = GpuOptions { device: Some(device), max_bytes, topology, nccl: if nccl { NcclUse::Own } else { NcclUse::Caller } };
        let comm = py.detach(|| GpuCommunicator::init(&cfg, &opts).map(SendGpu)).map_err(py_err)?;
        Ok(GpuComm { inner: Mutex::new(Some(comm)), rank, world })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    /// `None` when tpar's own NCCL joined, else why not.
    #[getter]
    fn nccl_status(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, |c| Ok(c.nccl_status().err().map(str::to_string)))
    }

    /// How the ranks were placed on the topology: `by-bus-id`, `as-if` (a named topology
    /// that lists none of the ranks' GPUs) or `unknown: <why>` (calls go to NCCL).
    #[getter]
    fn placement(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |c| {
            Ok(match c.placement() {
                tpar::topology::ranks::Placement::ByBusId => "by-bus-id".to_string(),
                tpar::topology::ranks::Placement::AsIf => "as-if".to_string(),
                tpar::topology::ranks::Placement::Unknown(why) => format!("unknown: {why}"),
            })
        })
    }

    /// How this communicator's first-use tune went: the one line its start printed (tuned in
    /// X s / read from the cache in Y ms / no tune, and why / failed: defaults in force).
    #[getter]
    fn tune_status(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |c| Ok(c.tune_outcome().line()))
    }

    /// The plan's decision for `nbytes` of `dtype`, eager or captured: (algorithm, reason).
    #[pyo3(signature = (dtype, nbytes, graph=false))]
    fn plan(&self, py: Python<'_>, dtype: &str, nbytes: usize, graph: bool) -> PyResult<(String, String)> {
        let d = dtype_of(dtype)?;
        self.with(py, |c| {
            let p = c.plan(d, nbytes, mode(graph));
            Ok((p.algorithm.name().to_string(), p.to_string()))
        })
    }

    /// The algorithm a call of `nbytes` of `dtype` runs (eager or captured), from the
    /// communicator's memo of resolved calls: cheap, for an engine's per-call question
    /// (`should_custom_ar`). `"nccl"`: NCCL takes it (the caller's, without tpar's own).
    #[pyo3(signature = (dtype, nbytes, graph=false))]
    fn route(&self, py: Python<'_>, dtype: &str, nbytes: usize, graph: bool) -> PyResult<&'static str> {
        let d = dtype_of(dtype)?;
        self.with(py, |c| c.route(d, nbytes, mode(graph)).map(|r| route_name(&r)))
    }

    /// Enqueues an all-reduce of `count` elements directly on the CUDA stream `stream` (a raw
    /// `CUstream`, e.g. `torch.cuda.current_stream().cuda_stream`), resolved once per
    /// (dtype, size, `graph`: being captured into a CUDA graph). Returns the algorithm's name.
    /// Where the plan says NCCL and `nccl` is false (or tpar joined no NCCL), nothing is
    /// enqueued and `"caller"` is returned: the caller runs its own NCCL (the engine's,
    /// torch's). `"nccl"` means tpar's own NCCL ran the call: nothing is left to do.
    /// An eager call first raises what is known without waiting: a dead peer, an error a
    /// kernel recorded.
    ///
    /// The addresses must be device memory of this rank's GPU, 16-byte aligned, holding
    /// `count` elements of `dtype` until the stream's work completes (`output == input`:
    /// in place). Does not wait.
    #[pyo3(signature = (stream, dtype, count, input, output, graph=false, nccl=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(&self, py: Python<'_>, stream: u64, dtype: &str, count: usize, input: u64, output: u64, graph: bool, nccl: bool) -> PyResult<&'static str> {
        let d = dtype_of(dtype)?;
        let m = mode(graph);
        self.with(py, |c| {
            if !graph {
                c.check_errors()?;
            }
            // SAFETY: the caller's contract (see the doc comment) is GpuCommunicator::call's.
            match unsafe { c.call(&Call::all_reduce(d, count, input, output).mode(m).on_stream(stream).nccl(nccl_calls(nccl))) }? {
                Served::Ran(a) => Ok(a.name()),
                Served::ToCaller => Ok("caller"),
            }
        })
    }

    /// The route of `collective` ("all-gather", "reduce-scatter") of `nbytes` per rank (the
    /// all-gather's input, the reduce-scatter's output) of `dtype`, eager or captured, as
    /// `route` answers for the all-reduce: a kernel's name, or `"nccl"`.
    #[pyo3(signature = (collective, dtype, nbytes, graph=false))]
    fn route_collective(&self, py: Python<'_>, collective: &str, dtype: &str, nbytes: usize, graph: bool) -> PyResult<&'static str> {
        let (c, d) = (collective_of(collective)?, dtype_of(dtype)?);
        self.with(py, |g| g.resolve_for(c, d, nbytes, mode(graph)).map(|r| route_name(&r.route)))
    }

    /// Enqueues one `collective` ("all-gather", "reduce-scatter", "all-reduce") of `count`
    /// elements per rank (torch.distributed's shapes: an all-gather's input and a
    /// reduce-scatter's output) on `stream`, as `all_reduce` does: returns the algorithm's name,
    /// or `"caller"` where the plan says NCCL and the caller's NCCL runs it. The output never
    /// overlaps the input. Addresses as for `all_reduce`. Does not wait.
    #[pyo3(signature = (stream, collective, dtype, count, input, output, graph=false, nccl=false))]
    #[allow(clippy::too_many_arguments)]
    fn collective(&self, py: Python<'_>, stream: u64, collective: &str, dtype: &str, count: usize, input: u64, output: u64, graph: bool, nccl: bool) -> PyResult<&'static str> {
        let (c, d) = (collective_of(collective)?, dtype_of(dtype)?);
        let m = mode(graph);
        self.with(py, |g| {
            if !graph {
                g.check_errors()?;
            }
            // SAFETY: the caller's contract (see the doc comment) is GpuCommunicator::call's.
            match unsafe { g.call(&Call::new(c, d, count, input, output).mode(m).on_stream(stream).nccl(nccl_calls(nccl))) }? {
                Served::Ran(a) => Ok(a.name()),
                Served::ToCaller => Ok("caller"),
            }
        })
    }

    /// Enqueues a fused all-reduce + residual add + RMSNorm on `stream` (docs/cuda.md
    /// "Fused"): x (`input`, this rank's partial sum) summed over the ranks in rank order,
    /// `residual_out = round(sum + residual)`, `norm_out = round((residual_out * inv_rms) *
    /// weight)` per row of `hidden`; resolved once per (dtype, rows, hidden, `graph`). Returns
    /// (path, algorithm): path "fused" (one kernel) or "unfused" (tpar's all-reduce or NCCL,
    /// then tpar's add-RMSNorm kernel). Where the plan gives the all-reduce to NCCL and `nccl`
    /// is false (or tpar joined no NCCL), nothing is enqueued and ("nccl", "nccl") is
    /// returned: the caller all-reduces into `norm_out` itself, then calls `add_rmsnorm`.
    ///
    /// Addresses as for `all_reduce`: device memory of this rank's GPU, 16-byte aligned; x,
    /// residual and both outputs `rows * hidden` elements, the weight `hidden`; `norm_out`
    /// may be `input`, `residual_out` may be `residual`.
    ///
    /// The family (`tpar::cuda::FusedPattern`): `residual` 0 is the pattern without the
    /// residual add (`residual_out` then receives the sum); `gemma` the weight offset
    /// (`f32(w) + 1`); `scale` non-zero (a device f32) the FP8 e4m3fn output (`norm_out` 1
    /// byte an element, not `input`); `scale_out` non-zero the NVFP4 output instead (`norm_out`
    /// half a byte an element, `scale_out` the 128x4-swizzled e4m3fn block scales, `scale`
    /// the f32 global scale). With ("nccl", "nccl") the caller all-reduces into `norm_out`,
    /// or for FP8 and NVFP4 into `residual_out` (into `input` where `residual_out` is the
    /// residual), then calls `add_rmsnorm` with that buffer as `input`.
    #[pyo3(signature = (stream, dtype, rows, hidden, eps, input, residual, weight, norm_out, residual_out, graph=false, nccl=false, gemma=false, scale=0, scale_out=0))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_add_rmsnorm(
        &self,
        py: Python<'_>,
        stream: u64,
        dtype: &str,
        rows: usize,
        hidden: usize,
        eps: f32,
        input: u64,
        residual: u64,
        weight: u64,
        norm_out: u64,
        residual_out: u64,
        graph: bool,
        nccl: bool,
        gemma: bool,
        scale: u64,
        scale_out: u64,
    ) -> PyResult<(&'static str, &'static str)> {
        let call = FusedCall { dtype: dtype_of(dtype)?, rows, hidden, eps, pattern: pattern_of(residual, gemma, scale, scale_out) };
        let bufs = FusedBufs { input, residual, weight, norm_out, residual_out, scale, scale_out };
        let m = mode(graph);
        self.with(py, |c| {
            if !graph {
                c.check_errors()?;
            }
            let r = c.resolve_fused(&call, m)?;
            match r.route {
                FusedRoute::Unfused { all_reduce: Route::Caller, .. } => return Ok(("nccl", Algorithm::Nccl.name())),
                FusedRoute::Unfused { all_reduce: Route::Nccl, .. } if !nccl => return Ok(("nccl", Algorithm::Nccl.name())),
                _ => {}
            }
            // SAFETY: the caller's contract (see the doc comment) is all_reduce_add_rmsnorm_on's.
            Ok(match unsafe { c.all_reduce_add_rmsnorm_on(stream, &call, &bufs, m) }? {
                FusedPath::Fused(a) => ("fused", a.name()),
                FusedPath::Unfused(a) => ("unfused", a.name()),
            })
        })
    }

    /// How a fused call of `rows` x `hidden` of `dtype` would run now (eager or captured):
    /// (path, algorithm) as `all_reduce_add_rmsnorm` returns them, from the memo; "nccl"
    /// where NCCL takes the all-reduce.
    #[pyo3(signature = (dtype, rows, hidden, graph=false))]
    fn fused_route(&self, py: Python<'_>, dtype: &str, rows: usize, hidden: usize, graph: bool) -> PyResult<(&'static str, &'static str)> {
        let call = FusedCall { dtype: dtype_of(dtype)?, rows, hidden, eps: 0.0, pattern: FusedPattern::ADD_RMSNORM };
        self.with(py, |c| {
            let r = c.resolve_fused(&call, mode(graph))?;
            Ok(match r.route {
                FusedRoute::Fused { algorithm, .. } => ("fused", algorithm.name()),
                FusedRoute::Unfused { all_reduce: Route::Caller | Route::Nccl, .. } => ("nccl", Algorithm::Nccl.name()),
                FusedRoute::Unfused { all_reduce: Route::Kernel { algorithm, .. }, .. } => ("unfused", algorithm.name()),
                FusedRoute::Unfused { all_reduce: Route::CopyEngine { .. }, .. } => ("unfused", Algorithm::CeRing.name()),
            })
        })
    }

    /// tpar's add-RMSNorm kernel alone on `stream` (no communication): `residual_out = input
    /// + residual`, `norm_out = rmsnorm(residual_out) * weight` (in place when `norm_out ==
    /// input`), bit for bit the fused call's epilogue. Addresses and the pattern (`residual`
    /// 0, `gemma`, `scale`, `scale_out`) as for `all_reduce_add_rmsnorm`.
    #[pyo3(signature = (stream, dtype, rows, hidden, eps, input, residual, weight, norm_out, residual_out, gemma=false, scale=0, scale_out=0))]
    #[allow(clippy::too_many_arguments)]
    fn add_rmsnorm(&self, py: Python<'_>, stream: u64, dtype: &str, rows: usize, hidden: usize, eps: f32, input: u64, residual: u64, weight: u64, norm_out: u64, residual_out: u64, gemma: bool, scale: u64, scale_out: u64) -> PyResult<()> {
        let call = FusedCall { dtype: dtype_of(dtype)?, rows, hidden, eps, pattern: pattern_of(residual, gemma, scale, scale_out) };
        let bufs = FusedBufs { input, residual, weight, norm_out, residual_out, scale, scale_out };
        // SAFETY: as for all_reduce_add_rmsnorm.
        self.with(py, |c| unsafe { c.add_rmsnorm_on(stream, &call, &bufs) })
    }

    /// Raises what is known without waiting: a dead peer, the first error a kernel recorded,
    /// or a poisoned state (cheap: no synchronisation).
    fn poll(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c| c.check_errors())
    }

    /// Raises the first error a kernel recorded (timeout, peer, mismatch across ranks), or a
    /// dead peer, after waiting for the work enqueued so far on `stream` — bounded by the
    /// timeout, with the GIL released. A host synchronisation: not while capturing.
    fn check(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        self.with(py, |c| {
            // SAFETY: the caller passes a live stream of this device (torch's current one).
            unsafe { c.wait_for(stream) }?;
            c.synchronize()
        })
    }

    /// Starts a checked capture (`GpuCommunicator::begin_capture_check`): calls captured
    /// from now on carry no per-call descriptor; their sequence is compared across ranks by
    /// `end_capture`.
    fn begin_capture(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c| c.begin_capture_check())
    }

    /// Ends a checked capture: compares every rank's captured calls over the control plane
    /// and returns how many this rank captured; `MismatchError` on every rank when they
    /// differ (the communicator is then poisoned).
    fn end_capture(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |c| c.end_capture_check())
    }

    /// Waits until every rank gets here, over the control plane.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c| c.barrier())
    }

    /// Leaves the job. Every rank must have finished its calls (a barrier first): peers may
    /// still write into this rank's workspace until they have.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = py.detach(|| self.lock().map(|mut g| g.take()))?;
        // Dropped with the GIL released: the watchdog thread is joined and CUDA frees.
        py.detach(move || drop(taken));
        Ok(())
    }
}

fn route_name(r: &Route) -> &'static str {
    match r {
        Route::Kernel { algorithm, .. } => algorithm.name(),
        Route::CopyEngine { .. } => Algorithm::CeRing.name(),
        Route::Nccl | Route::Caller => Algorithm::Nccl.name(),
    }
}

/// Parses every `TPAR_*` variable of this process's environment (tpar's one settings
/// module) and raises `ConfigError` naming the first malformed one.
#[pyfunction]
fn check_settings() -> PyResult<()> {
    Settings::from_env().map(|_| ()).map_err(py_err)
}

/// Whether `TPAR_DEBUG` asks for INFO logging (parsed by tpar's settings module).
#[pyfunction]
fn debug_logging() -> PyResult<bool> {
    Settings::from_env().map(|s| s.overrides.debug).map_err(py_err)
}

/// The table of every setting tpar reads (Markdown), as `tpar settings --markdown` prints.
#[pyfunction]
fn settings_table() -> String {
    tpar::settings::markdown_table()
}

/// tpar's exact add-RMSNorm of the all-reduce's result, from the Rust reference
/// (`tpar::testing::expected_add_rmsnorm`): every rank's x (`xs`, raw little-endian bytes of
/// `dtype`), the residual and the weight; rows of `hidden`. Returns (norm_out, residual_out)
/// as bytes. For tests that hold `tpar.testing`'s torch reference to the Rust one.
#[pyfunction]
fn reference_add_rmsnorm(dtype: &str, hidden: usize, eps: f32, xs: Vec<Vec<u8>>, residual: Vec<u8>, weight: Vec<u8>) -> PyResult<(Vec<u8>, Vec<u8>)> {
    fn run<T: Element>(hidden: usize, eps: f32, xs: &[Vec<u8>], residual: &[u8], weight: &[u8]) -> PyResult<(Vec<u8>, Vec<u8>)> {
        let w = std::mem::size_of::<T>() as u64;
        let decode = |b: &[u8]| -> PyResult<Vec<T>> {
            if b.len() % w as usize != 0 {
                return Err(InvalidArgumentError::new_err(format!("invalid argument: {} bytes is not whole {w}-byte elements", b.len())));
            }
            Ok(b.chunks_exact(w as usize).map(|c| T::from_lane(c.iter().rev().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))).collect())
        };
        let encode = |v: &[T]| -> Vec<u8> { v.iter().flat_map(|x| x.to_lane().to_le_bytes().into_iter().take(w as usize)).collect() };
        let xs: Vec<Vec<T>> = xs.iter().map(|b| decode(b)).collect::<PyResult<_>>()?;
        let (res, wt) = (decode(residual)?, decode(weight)?);
        let n = res.len();
        if hidden == 0 || n % hidden != 0 || wt.len() != hidden || xs.is_empty() || xs.iter().any(|x| x.len() != n) {
            return Err(InvalidArgumentError::new_err(format!("invalid argument: shapes (x {:?}, residual {n}, weight {}) are not rows of hidden {hidden}", xs.iter().map(Vec::len).collect::<Vec<_>>(), wt.len())));
        }
        let (norm, res_out) = tpar::testing::expected_add_rmsnorm(&xs, &res, &wt, hidden, eps);
        Ok((encode(&norm), encode(&res_out)))
    }
    match dtype_of(dtype)? {
        DType::F32 => run::<f32>(hidden, eps, &xs, &residual, &weight),
        DType::F16 => run::<f16>(hidden, eps, &xs, &residual, &weight),
        DType::BF16 => run::<bf16>(hidden, eps, &xs, &residual, &weight),
    }
}

/// `tpar::testing::quant_nvfp4` (vLLM's `scaled_fp4_quant` with the swizzled scale layout) of
/// `x`, raw little-endian bytes of `dtype`, rows of `hidden` (a multiple of 16), with the
/// global scale `global_scale`: (the e2m1 codes, two a byte, and the swizzled e4m3fn block
/// scales, padding 0). For tests that hold `tpar.testing.quant_nvfp4` to the Rust reference.
#[pyfunction]
fn reference_quant_nvfp4(dtype: &str, hidden: usize, x: Vec<u8>, global_scale: f32) -> PyResult<(Vec<u8>, Vec<u8>)> {
    let d = dtype_of(dtype)?;
    let w = d.size();
    if x.len() % w != 0 {
        return Err(InvalidArgumentError::new_err(format!("invalid argument: {} bytes is not whole {w}-byte elements", x.len())));
    }
    let vals: Vec<f32> = x
        .chunks_exact(w)
        .map(|c| {
            let lane = c.iter().rev().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            match d {
                DType::F32 => f32::from_lane(lane),
                DType::F16 => f16::from_lane(lane).to_f32(),
                DType::BF16 => bf16::from_lane(lane).to_f32(),
            }
        })
        .collect();
    let q = tpar::testing::quant_nvfp4(&vals, hidden, global_scale).map_err(py_err)?;
    Ok((q.packed, q.scales))
}

/// `tpar::testing::expected_rmsnorm` (the fused all-reduce + RMSNorm family's exact outputs)
/// on raw little-endian bytes: every rank's x, the residual (None: the pattern without one)
/// and the weight, rows of `hidden`; `gemma` the weight offset, `fp8_scale` the static FP8
/// output. Returns (out, fp8 bits or None, residual_out or None) as bytes. For tests that hold
/// `tpar.testing`'s torch reference to the Rust one.
#[pyfunction]
#[pyo3(signature = (dtype, hidden, eps, xs, residual, weight, gemma, fp8_scale))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn reference_rmsnorm(
    dtype: &str,
    hidden: usize,
    eps: f32,
    xs: Vec<Vec<u8>>,
    residual: Option<Vec<u8>>,
    weight: Vec<u8>,
    gemma: bool,
    fp8_scale: Option<f32>,
) -> PyResult<(Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>)> {
    #[allow(clippy::type_complexity)]
    fn run<T: Element>(hidden: usize, eps: f32, xs: &[Vec<u8>], residual: Option<&[u8]>, weight: &[u8], gemma: bool, fp8_scale: Option<f32>) -> PyResult<(Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>)> {
        let w = std::mem::size_of::<T>();
        let decode = |b: &[u8]| -> PyResult<Vec<T>> {
            if b.len() % w != 0 {
                return Err(InvalidArgumentError::new_err(format!("invalid argument: {} bytes is not whole {w}-byte elements", b.len())));
            }
            Ok(b.chunks_exact(w).map(|c| T::from_lane(c.iter().rev().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))).collect())
        };
        let encode = |v: &[T]| -> Vec<u8> { v.iter().flat_map(|x| x.to_lane().to_le_bytes().into_iter().take(w)).collect() };
        let xs: Vec<Vec<T>> = xs.iter().map(|b| decode(b)).collect::<PyResult<_>>()?;
        let res = residual.map(decode).transpose()?;
        let wt = decode(weight)?;
        if xs.is_empty() || xs.iter().any(|x| x.len() != xs[0].len()) {
            return Err(InvalidArgumentError::new_err("invalid argument `xs`: one input per rank, all of one length"));
        }
        let p = tpar::testing::NormPattern { residual: res.is_some(), gemma, fp8_scale, nvfp4_scale: None };
        let o = tpar::testing::expected_rmsnorm(&xs, res.as_deref(), &wt, hidden, eps, &p).map_err(py_err)?;
        Ok((encode(&o.out), o.fp8, o.residual_out.as_deref().map(encode)))
    }
    let residual = residual.as_deref();
    match dtype_of(dtype)? {
        DType::F32 => run::<f32>(hidden, eps, &xs, residual, &weight, gemma, fp8_scale),
        DType::F16 => run::<f16>(hidden, eps, &xs, residual, &weight, gemma, fp8_scale),
        DType::BF16 => run::<bf16>(hidden, eps, &xs, residual, &weight, gemma, fp8_scale),
    }
}

/// Why `algorithm`'s fused kernel would not take a call of `rows` x `hidden` of `dtype` among
/// `world` ranks in a workspace of `max_bytes` (`tpar::cuda::fused::fused_unfit`), or None
/// when it would.
#[pyfunction]
fn fused_unfit(algorithm: &str, dtype: &str, rows: usize, hidden: usize, world: usize, max_bytes: usize) -> PyResult<Option<String>> {
    let call = tpar::cuda::FusedCall { dtype: dtype_of(dtype)?, rows, hidden, eps: 0.0, pattern: FusedPattern::ADD_RMSNORM };
    if let Err(e) = call.validate() {
        return Ok(Some(e.to_string()));
    }
    Ok(tpar::cuda::fused::fused_unfit(algorithm_of(algorithm)?, &call, world, tpar::cuda::abi::slot_vecs(max_bytes)))
}

/// Registers the Python environment's directories where tpar looks for NVRTC and NCCL before
/// the system's loader path (`tpar::cuda::libpath`): `site-packages` directories holding the
/// `nvidia` namespace package (pip's `nvidia-cuda-nvrtc`, `nvidia-nccl-cu13`) or directories
/// holding the libraries. `tpar/__init__.py` calls it once at import; the setting
/// (`TPAR_NVRTC_LIB`, `TPAR_NCCL_LIB`) still comes first.
#[pyfunction]
fn set_library_dirs(dirs: Vec<PathBuf>) {
    tpar::cuda::libpath::set_environment_dirs(dirs);
}

/// The directories registered by `set_library_dirs` (else the active venv's, for the CLI).
#[pyfunction]
fn library_dirs() -> Vec<PathBuf> {
    tpar::cuda::libpath::environment_dirs()
}

/// Loads NVRTC the way tpar's kernels will and says where it came from:
/// `(path, origin, "13.0")`, origin one of `TPAR_NVRTC_LIB`, `the Python environment`,
/// `by name (...)`. Raises `LibraryError` (what was searched, what to install) without it.
#[pyfunction]
fn find_nvrtc() -> PyResult<(String, String, String)> {
    let v = tpar::cuda::nvrtc::probe().map_err(py_err)?;
    let f = tpar::cuda::nvrtc::found().ok_or_else(|| py_err(Error::Library { library: "nvrtc", reason: "loaded, but where from was not recorded".into() }))?;
    Ok((f.path.clone(), f.origin.describe(), format!("{}.{}", v.major, v.minor)))
}

/// Loads NCCL the way tpar will and says where it came from: `(path, origin)`. Raises
/// `LibraryError` without it.
#[pyfunction]
fn find_nccl() -> PyResult<(String, String)> {
    let n = tpar::cuda::nccl::load().map_err(py_err)?;
    Ok((n.path.clone(), n.origin.describe()))
}

/// The element size of a dtype name, in bytes.
#[pyfunction]
fn dtype_size(dtype: &str) -> PyResult<usize> {
    Ok(dtype_of(dtype)?.size())
}

#[pymodule]
fn _tpar(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<CpuComm>()?;
    m.add_class::<GpuComm>()?;
    m.add_function(wrap_pyfunction!(dtype_size, m)?)?;
    m.add_function(wrap_pyfunction!(reference_add_rmsnorm, m)?)?;
    m.add_function(wrap_pyfunction!(reference_rmsnorm, m)?)?;
    m.add_function(wrap_pyfunction!(reference_quant_nvfp4, m)?)?;
    m.add_function(wrap_pyfunction!(fused_unfit, m)?)?;
    m.add_function(wrap_pyfunction!(check_settings, m)?)?;
    m.add_function(wrap_pyfunction!(debug_logging, m)?)?;
    m.add_function(wrap_pyfunction!(settings_table, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor_query, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor_engine, m)?)?;
    m.add_function(wrap_pyfunction!(set_library_dirs, m)?)?;
    m.add_function(wrap_pyfunction!(library_dirs, m)?)?;
    m.add_function(wrap_pyfunction!(find_nvrtc, m)?)?;
    m.add_function(wrap_pyfunction!(find_nccl, m)?)?;
    m.add("TparError", py.get_type::<TparError>())?;
    m.add("TparTimeoutError", py.get_type::<TparTimeoutError>())?;
    m.add("PeerDiedError", py.get_type::<PeerDiedError>())?;
    m.add("AbortedError", py.get_type::<AbortedError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("PoisonedError", py.get_type::<PoisonedError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("LibraryError", py.get_type::<LibraryError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
