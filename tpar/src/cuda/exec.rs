//! The execution half of the driver wrappers: streams, events, graphs, modules, and kernel
//! launches (with or without programmatic dependent launch), plus the per-thread capture
//! mode. `driver` re-exports everything here, so callers name one module.
//!
//! Owns: every stream, event, graph and module handle the backend creates, and freeing it.
//! Must never panic; `Drop` frees and ignores failures.

use super::driver::{cu, cu_rc, sys, Device};
use crate::error::{Error, Result};
use cudarc::driver::{result, CudaContext};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// A non-blocking stream.
pub struct Stream {
    ctx: Arc<CudaContext>,
    pub raw: sys::CUstream,
}

// SAFETY: CUDA streams may be used from any thread with the context current.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(dev: &Device) -> Result<Self> {
        dev.bind()?;
        let raw = cu(|| "cuStreamCreate".into(), result::stream::create(result::stream::StreamKind::NonBlocking))?;
        Ok(Self { ctx: dev.ctx.clone(), raw })
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live stream.
        cu(|| "cuStreamSynchronize".into(), unsafe { result::stream::synchronize(self.raw) })
    }

    /// Whether all work enqueued so far has completed (cuStreamQuery), without blocking.
    pub fn is_done(&self) -> Result<bool> {
        // SAFETY: raw is a live stream.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::Cuda { context: "cuStreamQuery".into(), code: format!("{e:?}") }),
        }
    }

    pub fn wait(&self, ev: &Event) -> Result<()> {
        // SAFETY: both handles are live.
        cu(|| "cuStreamWaitEvent".into(), unsafe {
            result::stream::wait_event(self.raw, ev.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
    }

    pub fn record(&self, ev: &Event) -> Result<()> {
        // SAFETY: both handles are live.
        cu(|| "cuEventRecord".into(), unsafe { result::event::record(ev.raw, self.raw) })
    }

    pub fn begin_capture(&self) -> Result<()> {
        // SAFETY: raw is a live stream.
        cu(|| "cuStreamBeginCapture".into(), unsafe {
            result::stream::begin_capture(self.raw, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        })
    }

    pub fn end_capture(&self) -> Result<Graph> {
        // SAFETY: raw is capturing (begin_capture succeeded on it).
        let graph = cu(|| "cuStreamEndCapture".into(), unsafe { result::stream::end_capture(self.raw) })?;
        // SAFETY: graph is a live graph just returned by the driver.
        let exec = match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: graph is live and destroyed once.
                let _ = unsafe { result::graph::destroy(graph) };
                return Err(Error::Cuda { context: "cuGraphInstantiate".into(), code: format!("{:?}", e.0) });
            }
        };
        Ok(Graph { ctx: self.ctx.clone(), graph, exec })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: raw is a live stream destroyed once; pending work completes first (driver semantics).
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}

/// A timing-capable event.
pub struct Event {
    ctx: Arc<CudaContext>,
    pub raw: sys::CUevent,
}

impl Event {
    pub fn new(dev: &Device) -> Result<Self> {
        dev.bind()?;
        let raw = cu(|| "cuEventCreate".into(), result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        Ok(Self { ctx: dev.ctx.clone(), raw })
    }

    /// An event for ordering only (no timestamps: cheaper to record and wait on).
    pub fn ordering(dev: &Device) -> Result<Self> {
        dev.bind()?;
        let raw = cu(|| "cuEventCreate".into(), result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        Ok(Self { ctx: dev.ctx.clone(), raw })
    }

    /// Records this event on a raw stream handle (another library's stream).
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context, or null (the legacy stream).
    pub unsafe fn record_on(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the event is live; the caller vouches for the stream.
        cu(|| "cuEventRecord".into(), unsafe { result::event::record(self.raw, stream) })
    }

    /// Makes a raw stream handle wait for this event's last record.
    ///
    /// # Safety
    /// As for [`record_on`](Self::record_on).
    pub unsafe fn wait_on(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the event is live; the caller vouches for the stream.
        cu(|| "cuStreamWaitEvent".into(), unsafe {
            result::stream::wait_event(stream, self.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
    }

    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        // SAFETY: both events are live.
        cu(|| "cuEventElapsedTime".into(), unsafe { result::event::elapsed(self.raw, end.raw) })
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is live.
        cu(|| "cuEventSynchronize".into(), unsafe { result::event::synchronize(self.raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: raw is live and destroyed once.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    ctx: Arc<CudaContext>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: exec and stream are live.
        cu(|| "cuGraphLaunch".into(), unsafe { result::graph::launch(self.exec, stream.raw) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: both handles are live and destroyed once.
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
        // SAFETY: as above.
        let _ = unsafe { result::graph::destroy(self.graph) };
    }
}

/// A loaded module and its functions by name.
pub struct Module {
    ctx: Arc<CudaContext>,
    raw: sys::CUmodule,
    funcs: HashMap<String, sys::CUfunction>,
}

impl Module {
    /// Loads PTX text (the driver JIT-compiles it for the device).
    pub fn load_ptx(dev: &Device, ptx: &str) -> Result<Self> {
        dev.bind()?;
        let c = CString::new(ptx).map_err(|_| Error::invalid("ptx", "contains a NUL byte"))?;
        // SAFETY: c is a NUL-terminated PTX image that outlives the call.
        let raw = cu(|| "cuModuleLoadData".into(), unsafe { result::module::load_data(c.as_ptr() as *const c_void) })?;
        Ok(Self { ctx: dev.ctx.clone(), raw, funcs: HashMap::new() })
    }

    /// Loads a compiled image (cubin for this device's architecture; the driver compiles nothing).
    pub fn load_image(dev: &Device, image: &[u8]) -> Result<Self> {
        dev.bind()?;
        if image.is_empty() {
            return Err(Error::invalid("cubin", "empty image"));
        }
        // SAFETY: image is a whole cubin (checksummed by the cache) that outlives the call;
        // the driver validates the ELF and copies what it keeps.
        let raw = cu(|| "cuModuleLoadData (cubin)".into(), unsafe { result::module::load_data(image.as_ptr() as *const c_void) })?;
        Ok(Self { ctx: dev.ctx.clone(), raw, funcs: HashMap::new() })
    }

    pub fn function(&mut self, name: &str) -> Result<sys::CUfunction> {
        if let Some(f) = self.funcs.get(name) {
            return Ok(*f);
        }
        let c = CString::new(name).map_err(|_| Error::invalid("kernel name", "contains a NUL byte"))?;
        // SAFETY: raw is a live module; c is NUL-terminated.
        let f = cu(|| format!("cuModuleGetFunction({name})"), unsafe { result::module::get_function(self.raw, c) })?;
        self.funcs.insert(name.to_string(), f);
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: raw is a live module unloaded once; its functions are not used afterwards.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

/// Launches `f` with one by-value argument struct.
///
/// # Safety
/// `f` must be a live function whose single parameter has the layout of `T`, and every
/// pointer inside `arg` must be valid for the kernel's accesses until it completes.
pub unsafe fn launch_with_struct<T: Copy>(f: sys::CUfunction, grid: u32, block: u32, stream: &Stream, arg: &T) -> Result<()> {
    let mut a = *arg;
    let mut params = [&mut a as *mut T as *mut c_void];
    // SAFETY: caller's contract; cuLaunchKernel copies the parameter before returning.
    cu(|| "cuLaunchKernel".into(), unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, stream.raw, &mut params) })
}

/// Blocks of `f` one SM holds at once at `threads` threads per block.
///
/// # Safety
/// `f` must be a function of a loaded, live module.
pub unsafe fn occupancy(f: sys::CUfunction, threads: u32) -> Result<u32> {
    let mut p = 0i32;
    // SAFETY: the caller vouches for f; p is a valid out-pointer.
    let rc = unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut p, f, threads as i32, 0) };
    cu_rc(|| "cuOccupancyMaxActiveBlocksPerMultiprocessor".into(), rc)?;
    Ok(p.max(0) as u32)
}

/// Thread-block clusters of `cluster` blocks of `f` (`threads` each) the GPU holds at once
/// (`cuOccupancyMaxActiveClusters`; sm_90 and later).
///
/// # Safety
/// `f` must be a function of a loaded, live module.
pub unsafe fn occupancy_clusters(f: sys::CUfunction, threads: u32, cluster: u32) -> Result<u32> {
    let mut attr = cluster_attr(cluster);
    let cfg = launch_config(cluster, threads, std::ptr::null_mut(), &mut attr, 1);
    let mut n = 0i32;
    // SAFETY: the caller vouches for f; cfg, the attribute it points to and n outlive the call.
    let rc = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &cfg) };
    cu_rc(|| format!("cuOccupancyMaxActiveClusters ({cluster} blocks of {threads} threads)"), rc)?;
    Ok(n.max(0) as u32)
}

/// The launch attribute for thread-block clusters of `cluster` blocks (in x).
fn cluster_attr(cluster: u32) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero launch attribute is plain data, filled below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

/// A one-dimensional launch of `grid` blocks of `threads` on `stream` with the `n`
/// attributes at `attrs` (which must outlive every use of the configuration).
fn launch_config(grid: u32, threads: u32, stream: sys::CUstream, attrs: *mut sys::CUlaunchAttribute, n: u32) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs,
        numAttrs: n,
    }
}

/// Launches `f` with one by-value argument `arg` on `grid` blocks of `threads`:
/// `cuLaunchKernelEx`, with programmatic stream serialization when `pdl` (the kernel's
/// `griddepcontrol.wait` then orders it after the previous one on the stream), and as
/// thread-block clusters of `cluster` blocks when `cluster > 1` (`grid` a multiple of it).
///
/// # Safety
/// `f` must take exactly one `T` by value, and every pointer inside `arg` must be valid for
/// the kernel's accesses until it completes.
pub unsafe fn launch_ex<T: Copy>(f: sys::CUfunction, grid: u32, threads: u32, pdl: bool, cluster: u32, stream: &Stream, arg: &T) -> Result<()> {
    let mut a = *arg;
    let mut params = [&mut a as *mut T as *mut c_void];
    // SAFETY: all-zero launch attributes are plain data, filled below for those used.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0usize;
    if pdl {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if cluster > 1 {
        attrs[n] = cluster_attr(cluster);
        n += 1;
    }
    let cfg = launch_config(grid, threads, stream.raw, attrs.as_mut_ptr(), n as u32);
    // SAFETY: cfg, attrs and params outlive the call (the driver copies the parameter); the
    // caller vouches for the function and the pointers inside `arg`.
    let rc = unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) };
    cu_rc(|| "cuLaunchKernelEx".into(), rc)
}

/// Sets this thread's stream-capture mode to relaxed, and restores it on drop (module loads
/// may then happen while a stream of this thread is being captured).
pub(crate) struct RelaxedCapture(sys::CUstreamCaptureMode);
impl RelaxedCapture {
    pub(crate) fn enter() -> Self {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: mode is a valid in/out pointer; the call only swaps a per-thread setting.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        Self(mode)
    }
}
impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.0;
        // SAFETY: as in enter; restores the previous mode, ignoring failure.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

/// Enqueues a store of the 32-bit `word` at device address `addr` on `stream`
/// (asynchronous; kernels on other streams see it land while they run).
///
/// # Safety
/// `addr` must be a 4-byte aligned word of a live device allocation of the stream's context.
pub unsafe fn set_word_at_async(addr: u64, word: u32, stream: &Stream) -> Result<()> {
    // SAFETY: the caller vouches for the word; the stream is live.
    cu_rc(|| "cuMemsetD32Async".into(), unsafe { sys::cuMemsetD32Async(addr, word, 1, stream.raw) })
}
