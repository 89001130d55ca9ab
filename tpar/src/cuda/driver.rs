//! Thin owning wrappers over the CUDA driver API (through cudarc's `sys`/`result` layers):
//! device, device buffers from `cuMemAlloc` (IPC-exportable, unlike cudarc's stream-ordered
//! pool), pinned mapped host memory, streams, events, graphs, modules, and the IPC handle
//! hooks the multi-process backend will exchange over the rendezvous.
//!
//! Owns: every raw CUDA handle the backend creates, and freeing it. Must never panic
//! (a missing libcuda is an `Error::Library`); `Drop` frees and ignores failures.

use crate::error::{Error, Result};
use cudarc::driver::{result, CudaContext, DriverError};
pub use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

pub(crate) fn cu<T>(context: impl FnOnce() -> String, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| Error::Cuda { context: context(), code: format!("{:?}", e.0) })
}

pub(crate) fn cu_rc(context: impl FnOnce() -> String, rc: sys::CUresult) -> Result<()> {
    cu(context, rc.result())
}

/// Checks that libcuda can be loaded (cudarc panics if it cannot) and initialises it.
pub fn init_driver() -> Result<()> {
    // SAFETY: is_culib_present only tries dlopen on candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Library {
            library: "cuda",
            reason: "libcuda.so (the NVIDIA driver) not found: this machine has no NVIDIA driver, or it is not on the loader path".into(),
        });
    }
    cu(|| "cuInit".into(), result::init())
}

/// One GPU, its primary context bound to the calling thread.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub ordinal: usize,
    pub name: String,
    pub major: i32,
    pub minor: i32,
}

impl Device {
    /// Opens device `ordinal`. Event tracking is disabled: collectives order themselves
    /// (cudarc's per-buffer events would order launches of ranks that share a buffer, one after
    /// the other: every rank then waits for the previous one and the collective times out).
    pub fn open(ordinal: usize) -> Result<Self> {
        init_driver()?;
        let ctx = cu(|| format!("opening device {ordinal}"), CudaContext::new(ordinal))?;
        // SAFETY: no cudarc-tracked buffers exist yet in this context; tpar orders its own work.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = cu(|| "compute capability".into(), ctx.compute_capability())?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Self { ctx, ordinal, name, major, minor })
    }

    /// NVRTC architecture name, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        cu(|| "binding context".into(), self.ctx.bind_to_thread())
    }
}

/// Device memory from `cuMemAlloc` (exportable through CUDA IPC).
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DeviceBuffer {
    pub fn new(dev: &Device, bytes: usize) -> Result<Self> {
        dev.bind()?;
        // SAFETY: the context is current; the size is nonzero (max(1)).
        let ptr = cu(|| format!("cuMemAlloc({bytes} B)"), unsafe { result::malloc_sync(bytes.max(1)) })?;
        Ok(Self { ctx: dev.ctx.clone(), ptr, bytes })
    }

    /// Fills with a 32-bit pattern and waits until the fill is done.
    ///
    /// cuMemsetD32 on device memory may return before the fill is done, and it runs on the
    /// legacy stream, which tpar's non-blocking streams do not wait for: without the wait a
    /// kernel enqueued next could race it.
    pub fn fill_u32(&self, word: u32) -> Result<()> {
        // SAFETY: ptr is a live allocation of `bytes` bytes; the count covers whole words only.
        cu_rc(|| "cuMemsetD32".into(), unsafe { sys::cuMemsetD32_v2(self.ptr, word, self.bytes / 4) })?;
        cu(|| "cuCtxSynchronize after cuMemsetD32".into(), self.ctx.synchronize())
    }

    pub fn upload<T: Copy>(&self, src: &[T]) -> Result<()> {
        if std::mem::size_of_val(src) > self.bytes {
            return Err(Error::invalid("upload", "source larger than the buffer"));
        }
        // SAFETY: bounds checked above; the source is read before the call returns.
        cu(|| "cuMemcpyHtoD".into(), unsafe { result::memcpy_htod_sync(self.ptr, src) })?;
        // From pageable memory cuMemcpyHtoD returns once the source is staged, before the DMA
        // lands, and tpar's non-blocking streams do not wait for it: a kernel enqueued next
        // could read the old contents (seen on 4 H200s: in-place calls of 1 MiB read stale
        // input). Wait for the copy to land.
        cu(|| "cuCtxSynchronize after cuMemcpyHtoD".into(), self.ctx.synchronize())
    }

    /// Enqueues a copy of the first `bytes` of `src` into this buffer on `stream`.
    pub fn copy_from_async(&self, src: &DeviceBuffer, bytes: usize, stream: &Stream) -> Result<()> {
        if bytes > self.bytes || bytes > src.bytes {
            return Err(Error::invalid("copy", "more bytes than a buffer holds"));
        }
        // SAFETY: both are live cuMemAlloc allocations of at least `bytes` (checked above);
        // the stream is live.
        cu(|| "cuMemcpyDtoDAsync".into(), unsafe { result::memcpy_dtod_async(self.ptr, src.ptr, bytes, stream.raw) })
    }

    pub fn download<T: Copy>(&self, dst: &mut [T]) -> Result<()> {
        if std::mem::size_of_val(dst) > self.bytes {
            return Err(Error::invalid("download", "destination larger than the buffer"));
        }
        // SAFETY: bounds checked above; a device-to-pageable copy completes before it returns.
        // It does not wait for non-blocking streams: the caller synchronizes the stream that
        // wrote the buffer first.
        cu(|| "cuMemcpyDtoH".into(), unsafe { result::memcpy_dtoh_sync(dst, self.ptr) })
    }

    /// The CUDA IPC handle bytes (64) a peer process opens with [`IpcMapping::open`].
    /// Hook for the multi-process backend: it travels over the rendezvous.
    pub fn ipc_handle(&self) -> Result<[u8; 64]> {
        let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: ptr is a cuMemAlloc allocation; h is a valid out-pointer.
        cu_rc(|| "cuIpcGetMemHandle".into(), unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), self.ptr) })?;
        // SAFETY: cuIpcGetMemHandle succeeded and filled the handle.
        let h = unsafe { h.assume_init() };
        let mut out = [0u8; 64];
        for (o, b) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *b as u8;
        }
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: ptr came from cuMemAlloc and is freed once; failure is ignored (never panic).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A peer's device memory opened from its IPC handle bytes (multi-process backend hook).
pub struct IpcMapping {
    ctx: Arc<CudaContext>,
    pub ptr: sys::CUdeviceptr,
}

impl IpcMapping {
    pub fn open(dev: &Device, handle: &[u8; 64]) -> Result<Self> {
        dev.bind()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        for (r, b) in h.reserved.iter_mut().zip(handle.iter()) {
            *r = *b as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: h holds handle bytes from a peer's cuIpcGetMemHandle; ptr is an out-pointer.
        cu_rc(|| "cuIpcOpenMemHandle".into(), unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
        })?;
        Ok(Self { ctx: dev.ctx.clone(), ptr })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: ptr came from cuIpcOpenMemHandle and is closed once.
        let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
    }
}

/// Pinned host memory mapped into the device (`cuMemHostAlloc` with DEVICEMAP|PORTABLE).
/// Every access from a kernel crosses the GPU's PCIe link.
pub struct HostMapped {
    ctx: Arc<CudaContext>,
    pub host: *mut c_void,
    pub dev: sys::CUdeviceptr,
    pub bytes: usize,
}

// SAFETY: the pointer is to process memory owned by this value; access is by the device or
// through volatile reads after synchronisation.
unsafe impl Send for HostMapped {}

impl HostMapped {
    pub fn new(dev: &Device, bytes: usize) -> Result<Self> {
        dev.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: context current; size nonzero.
        let host = cu(|| format!("cuMemHostAlloc({bytes} B)"), unsafe { result::malloc_host(bytes.max(1), flags) })?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: host is a live DEVICEMAP allocation; dptr is an out-pointer.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) };
        if let Err(e) = cu_rc(|| "cuMemHostGetDevicePointer".into(), rc) {
            // SAFETY: host came from cuMemHostAlloc above and is freed once.
            let _ = unsafe { result::free_host(host) };
            return Err(e);
        }
        // SAFETY: host points at `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes.max(1)) };
        Ok(Self { ctx: dev.ctx.clone(), host, dev: dptr, bytes })
    }

    /// Fills with a 32-bit pattern from the host (no kernel may be running on it).
    pub fn fill_u32(&self, word: u32) {
        let n = self.bytes / 4;
        for i in 0..n {
            // SAFETY: i < bytes/4, the allocation is 4-byte aligned (page aligned).
            unsafe { std::ptr::write_volatile((self.host as *mut u32).add(i), word) };
        }
    }

    /// Reads a `T` at byte offset `off` (volatile: the device may have written it).
    pub fn read<T: Copy>(&self, off: usize) -> Option<T> {
        if off + std::mem::size_of::<T>() > self.bytes || off % std::mem::align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: bounds and alignment checked above.
        Some(unsafe { std::ptr::read_volatile((self.host as *const u8).add(off) as *const T) })
    }

    /// Writes a `T` at byte offset `off`.
    pub fn write<T: Copy>(&self, off: usize, v: T) -> bool {
        if off + std::mem::size_of::<T>() > self.bytes || off % std::mem::align_of::<T>() != 0 {
            return false;
        }
        // SAFETY: bounds and alignment checked above.
        unsafe { std::ptr::write_volatile((self.host as *mut u8).add(off) as *mut T, v) };
        true
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: host came from cuMemHostAlloc and is freed once.
        let _ = unsafe { result::free_host(self.host) };
    }
}

/// Host memory this process mapped itself (a shared-memory segment), registered with the
/// driver as pinned and mapped into the device (`cuMemHostRegister` with DEVICEMAP|PORTABLE),
/// so kernels reach it through [`dev`](Self::dev) over the GPU's PCIe link. The device
/// pointer is this process's own: another process mapping the same pages gets another.
/// Unregistered on drop; the mapping itself stays its owner's.
pub struct HostRegistration {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    pub dev: sys::CUdeviceptr,
    pub bytes: usize,
}

// SAFETY: plain handles (a host address this value registered, a device address); the
// memory is accessed by kernels or through the owner of the mapping.
unsafe impl Send for HostRegistration {}

impl HostRegistration {
    /// Registers `bytes` at `host` (page-aligned, a whole mapping of this process).
    ///
    /// # Safety
    /// `host..host + bytes` must be a live mapping of this process that outlives the
    /// returned value (drop the registration before unmapping).
    pub unsafe fn new(dev: &Device, host: *mut c_void, bytes: usize) -> Result<Self> {
        dev.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller vouches for the range; the context is current.
        cu_rc(|| format!("cuMemHostRegister({bytes} B of shared memory)"), unsafe { sys::cuMemHostRegister_v2(host, bytes, flags) })?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: host was registered with DEVICEMAP above; dptr is an out-pointer.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) };
        if let Err(e) = cu_rc(|| "cuMemHostGetDevicePointer (registered shared memory)".into(), rc) {
            // SAFETY: registered above, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(host) };
            return Err(e);
        }
        Ok(Self { ctx: dev.ctx.clone(), host, dev: dptr, bytes })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: host was registered in `new` and is unregistered once; failure is ignored.
        let _ = unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

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
