//! Thin owning wrappers over the CUDA driver API (through cudarc's `sys`/`result` layers):
//! device, device buffers from `cuMemAlloc` (IPC-exportable, unlike cudarc's stream-ordered
//! pool), pinned mapped host memory, streams, events, graphs, modules, and the IPC handle
//! hooks the multi-process backend will exchange over the rendezvous.
//!
//! Streams, events, graphs, modules and launches are in `exec` (re-exported here).
//!
//! Owns: every raw CUDA handle the backend creates, and freeing it. Must never panic
//! (a missing libcuda is an `Error::Library`); `Drop` frees and ignores failures.

use crate::error::{Error, Result};
use cudarc::driver::{result, CudaContext, DriverError};
pub use super::exec::*;
pub use cudarc::driver::sys;

use std::ffi::c_void;
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
#[derive(Clone)]
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

    /// Waits until everything enqueued in this device's context is done.
    pub fn synchronize(&self) -> Result<()> {
        cu(|| "cuCtxSynchronize".into(), self.ctx.synchronize())
    }

    /// Streaming multiprocessors of this device.
    pub fn sm_count(&self) -> Result<u32> {
        let n = cu(|| "SM count".into(), self.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT))?;
        Ok(n.max(0) as u32)
    }

    /// The PCI address of this device as the driver names it (`0000:3b:00.0`).
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        let cu_dev = self.ctx.cu_device();
        // SAFETY: buf holds 32 bytes (the driver writes at most 13 plus a NUL); cu_dev is valid.
        cu_rc(|| "cuDeviceGetPCIBusId".into(), unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, cu_dev) })?;
        // SAFETY: the driver wrote a NUL-terminated string into buf.
        let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(id.to_string_lossy().into_owned())
    }

    /// The device's UUID as NVML and nvidia-smi write it (`GPU-xxxxxxxx-xxxx-...`): the one id
    /// of the hardware that neither `CUDA_VISIBLE_DEVICES` nor ordinals change.
    pub fn uuid(&self) -> Result<String> {
        let u = cu(|| "cuDeviceGetUuid".into(), self.ctx.uuid())?;
        let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
        let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        Ok(format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16)))
    }

    /// Lets this device's kernels access `to`'s memory (already enabled is fine).
    pub fn enable_peer_access(&self, to: &Device) -> Result<()> {
        self.bind()?;
        // SAFETY: this context is current; `to.ctx` is a live context of another device.
        let rc = unsafe { sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0) };
        if rc == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        cu_rc(|| format!("cuCtxEnablePeerAccess GPU{} -> GPU{}", self.ordinal, to.ordinal), rc)
    }
}

/// The driver's CUDA version (e.g. 13000), 0 when it cannot say.
pub fn driver_version() -> i32 {
    let mut v = 0i32;
    // SAFETY: v is a valid out-pointer; the call has no other precondition.
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}

/// CUDA devices visible to this process.
pub fn device_count() -> Result<usize> {
    init_driver()?;
    let mut count: i32 = 0;
    // SAFETY: the driver is initialised; count is an out-pointer.
    cu_rc(|| "cuDeviceGetCount".into(), unsafe { sys::cuDeviceGetCount(&mut count) })?;
    Ok(count.max(0) as usize)
}

/// Enqueues a copy of `bytes` between two device-accessible (UVA) addresses on `stream`.
///
/// # Safety
/// Both ranges must be live allocations of at least `bytes`, reachable from the stream's
/// device, until the copy completes.
pub unsafe fn memcpy_async(dst: u64, src: u64, bytes: usize, stream: &Stream) -> Result<()> {
    // SAFETY: the caller vouches for both ranges; the stream is live.
    cu_rc(|| "cuMemcpyAsync".into(), unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.raw) })
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

    /// Fills the first `bytes` (whole words) with a 32-bit pattern, without waiting: the caller
    /// synchronises the device before any kernel can read it.
    pub fn fill_prefix_u32(&self, bytes: usize, word: u32) -> Result<()> {
        // SAFETY: ptr is a live allocation of `self.bytes`; the count stays inside it.
        cu_rc(|| "cuMemsetD32".into(), unsafe { sys::cuMemsetD32_v2(self.ptr, word, bytes.min(self.bytes) / 4) })
    }

    pub fn upload<T: Copy>(&self, src: &[T]) -> Result<()> {
        self.upload_at(0, src)
    }

    /// [`upload`](Self::upload) at `offset` bytes into the buffer.
    pub fn upload_at<T: Copy>(&self, offset: usize, src: &[T]) -> Result<()> {
        if offset.checked_add(std::mem::size_of_val(src)).map_or(true, |end| end > self.bytes) {
            return Err(Error::invalid("upload", "source larger than the buffer"));
        }
        // SAFETY: bounds checked above; the source is read before the call returns.
        cu(|| "cuMemcpyHtoD".into(), unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, src) })?;
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
        self.download_at(0, dst)
    }

    /// [`download`](Self::download) from `offset` bytes into the buffer.
    pub fn download_at<T: Copy>(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        if offset.checked_add(std::mem::size_of_val(dst)).map_or(true, |end| end > self.bytes) {
            return Err(Error::invalid("download", "destination larger than the buffer"));
        }
        // SAFETY: bounds checked above; a device-to-pageable copy completes before it returns.
        // It does not wait for non-blocking streams: the caller synchronizes the stream that
        // wrote the buffer first.
        cu(|| "cuMemcpyDtoH".into(), unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset as u64) })
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
