//! NCCL, the fallback and the engine across hosts: loaded by tpar itself (libloading), with
//! cudarc's NCCL types, because cudarc does not try `libnccl.so.2` — the only name pip
//! wheels and many distributions ship — and panics where a library is missing.
//!
//! Owns: finding NCCL (`TPAR_NCCL_LIB`, else the Python environment's `nvidia-nccl-cu13`
//! wheel, then `libnccl.so.2`, then `libnccl.so` by name: `cuda::libpath`), the unique-id
//! bytes that the rendezvous carries between processes (hook: [`unique_id`] and
//! [`NcclComm::init_rank`]), one-process multi-rank communicators for tools
//! ([`NcclComm::init_all`]), and all-reduce. Must never panic: a missing NCCL is an
//! `Error::Library` that says what to install.

use super::driver::{Device, Stream};
use super::libpath::{self, Found, Origin};
use crate::error::{Error, Result};
use crate::dtype::DType;
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// Environment variable naming the NCCL library file.
pub const NCCL_LIB_ENV: &str = "TPAR_NCCL_LIB";

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int;
type CommInitAll = unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(ncclComm_t) -> c_int;
type CommAbort = unsafe extern "C" fn(ncclComm_t) -> c_int;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, *mut c_void) -> c_int;
type AllGather = unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, *mut c_void) -> c_int;
type ReduceScatter = unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, *mut c_void) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type Group = unsafe extern "C" fn() -> c_int;

/// The loaded library and the entry points tpar uses.
pub struct Nccl {
    _lib: libloading::Library,
    /// The file loaded (for one found by name, the file the loader mapped, where readable).
    pub path: String,
    /// Where it was found: the setting, the Python environment, the system.
    pub origin: Origin,
    get_version: GetVersion,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_init_all: CommInitAll,
    comm_destroy: CommDestroy,
    comm_abort: CommAbort,
    all_reduce: AllReduce,
    all_gather: AllGather,
    reduce_scatter: ReduceScatter,
    get_error_string: GetErrorString,
    group_start: Group,
    group_end: Group,
}

static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();

/// The files to try, in `cuda::libpath`'s order: the setting (tried first, as before), the
/// Python environment's `nvidia-nccl-cu13` wheel, then the loader by name.
fn candidates() -> Vec<(String, Origin)> {
    let mut v: Vec<(String, Origin)> = Vec::new();
    if let Some(p) = crate::settings::nccl_lib() {
        v.push((p.to_string_lossy().into_owned(), Origin::Setting(NCCL_LIB_ENV)));
    }
    v.extend(libpath::files_in(libpath::NCCL, &libpath::environment_dirs()).into_iter().map(|p| (p.to_string_lossy().into_owned(), Origin::Environment)));
    v.push(("libnccl.so.2".into(), Origin::System));
    v.push(("libnccl.so".into(), Origin::System));
    v
}

fn open() -> std::result::Result<Nccl, String> {
    let mut tried = Vec::new();
    for (name, origin) in candidates() {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => {
                let path = match origin {
                    Origin::System => libpath::mapped("libnccl.so").unwrap_or(name),
                    _ => name,
                };
                return bind(lib, Found { path, origin });
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "NCCL not found (tried {}). Install it into the engine's environment (`pip install nvidia-nccl-cu13`; \
         torch's CUDA 13 wheels pull it) or the system (the libnccl2 package, its directory on LD_LIBRARY_PATH), \
         or set {NCCL_LIB_ENV} to the library file",
        tried.join("; ")
    ))
}

fn bind(lib: libloading::Library, found: Found) -> std::result::Result<Nccl, String> {
    let path = found.path.clone();
    macro_rules! sym {
        ($name:literal, $t:ty) => {{
            // SAFETY: the symbol is NCCL's public C entry point with exactly this signature (nccl.h).
            let s: libloading::Symbol<$t> = unsafe { lib.get($name) }
                .map_err(|e| format!("{path}: missing {}: {e}", String::from_utf8_lossy($name)))?;
            *s
        }};
    }
    let get_version = sym!(b"ncclGetVersion\0", GetVersion);
    let get_unique_id = sym!(b"ncclGetUniqueId\0", GetUniqueId);
    let comm_init_rank = sym!(b"ncclCommInitRank\0", CommInitRank);
    let comm_init_all = sym!(b"ncclCommInitAll\0", CommInitAll);
    let comm_destroy = sym!(b"ncclCommDestroy\0", CommDestroy);
    let comm_abort = sym!(b"ncclCommAbort\0", CommAbort);
    let all_reduce = sym!(b"ncclAllReduce\0", AllReduce);
    let all_gather = sym!(b"ncclAllGather\0", AllGather);
    let reduce_scatter = sym!(b"ncclReduceScatter\0", ReduceScatter);
    let get_error_string = sym!(b"ncclGetErrorString\0", GetErrorString);
    let group_start = sym!(b"ncclGroupStart\0", Group);
    let group_end = sym!(b"ncclGroupEnd\0", Group);
    Ok(Nccl {
        _lib: lib,
        path,
        origin: found.origin,
        get_version,
        get_unique_id,
        comm_init_rank,
        comm_init_all,
        comm_destroy,
        comm_abort,
        all_reduce,
        all_gather,
        reduce_scatter,
        get_error_string,
        group_start,
        group_end,
    })
}

/// Loads NCCL once; a missing library is an error that says what to install.
pub fn load() -> Result<&'static Nccl> {
    match NCCL.get_or_init(open) {
        Ok(n) => Ok(n),
        Err(e) => Err(Error::Library { library: "nccl", reason: e.clone() }),
    }
}

impl Nccl {
    fn check(&self, what: &str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe {
            let p = (self.get_error_string)(rc);
            if p.is_null() { String::from("?") } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
        };
        Err(Error::Library { library: "nccl", reason: format!("{what} failed ({rc}): {msg}") })
    }

    /// NCCL's version code, e.g. 22805 for 2.28.5.
    pub fn version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer.
        self.check("ncclGetVersion", unsafe { (self.get_version)(&mut v) })?;
        Ok(v)
    }
}

/// A fresh unique id (rank 0 makes it; the rendezvous sends the 128 bytes to every rank).
pub fn unique_id() -> Result<[u8; 128]> {
    let n = load()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: id is a valid out-pointer.
    n.check("ncclGetUniqueId", unsafe { (n.get_unique_id)(&mut id) })?;
    let mut out = [0u8; 128];
    for (o, c) in out.iter_mut().zip(id.internal.iter()) {
        *o = *c as u8;
    }
    Ok(out)
}

/// Joins an NCCL communicator of every rank of `comm` over tpar's rendezvous: every rank
/// first says whether NCCL loads here (so no rank enters NCCL's collective init while a peer
/// never will), rank 0 makes the unique id, the control plane carries it (or rank 0's
/// error) to every rank, and every rank joins on `dev`.
pub fn init_over_rendezvous(comm: &mut crate::control::ControlPlane, dev: &Device) -> Result<NcclComm> {
    let mine = match load() {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    for (r, s) in comm.all_gather_bytes(mine.as_bytes())?.iter().enumerate() {
        if !s.is_empty() {
            return Err(Error::Library {
                library: "NCCL",
                reason: format!("rank {r} cannot load NCCL: {}", String::from_utf8_lossy(s)),
            });
        }
    }
    // Rank 0 sends [1] + id, or [0] + why it could not make one.
    let payload = if comm.rank() == 0 {
        match unique_id() {
            Ok(id) => [&[1u8][..], &id[..]].concat(),
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        }
    } else {
        Vec::new()
    };
    let got = comm.broadcast_bytes(&payload)?;
    match got.split_first() {
        Some((1, id)) => {
            let id: [u8; 128] = id.try_into().map_err(|_| Error::Rendezvous {
                rank: comm.rank(),
                field: "nccl unique id",
                expected: "128 bytes".into(),
                got: format!("{} bytes", id.len()),
            })?;
            NcclComm::init_rank(dev, comm.world(), comm.rank(), &id)
        }
        Some((_, why)) => Err(Error::Library {
            library: "NCCL",
            reason: format!("rank 0 could not make a unique id: {}", String::from_utf8_lossy(why)),
        }),
        None => Err(Error::Rendezvous {
            rank: comm.rank(),
            field: "nccl unique id",
            expected: "rank 0's id".into(),
            got: "nothing".into(),
        }),
    }
}

fn nccl_dtype(d: DType) -> ncclDataType_t {
    match d {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
    }
}

/// One NCCL communicator (one rank).
pub struct NcclComm {
    /// Null once aborted.
    raw: ncclComm_t,
    pub rank: usize,
    pub world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (&mut/&self
// discipline of this type plus NCCL's own rules).
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins the communicator named by `id` as `rank` of `world` (multi-process hook).
    pub fn init_rank(dev: &Device, world: usize, rank: usize, id: &[u8; 128]) -> Result<Self> {
        let n = load()?;
        dev.bind()?;
        let mut uid = ncclUniqueId { internal: [0; 128] };
        for (u, b) in uid.internal.iter_mut().zip(id.iter()) {
            *u = *b as c_char;
        }
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: raw is an out-pointer; uid is by value; world/rank are checked by NCCL.
        n.check("ncclCommInitRank", unsafe { (n.comm_init_rank)(&mut raw, world as c_int, uid, rank as c_int) })?;
        Ok(Self { raw, rank, world })
    }

    /// One communicator per device in `ordinals`, in one process (for tools). NCCL refuses a
    /// device listed twice, so emulated ranks on one GPU cannot use this with world > 1.
    pub fn init_all(ordinals: &[i32]) -> Result<Vec<Self>> {
        let n = load()?;
        let mut raws: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: raws has one slot per device; ordinals outlives the call.
        n.check("ncclCommInitAll", unsafe { (n.comm_init_all)(raws.as_mut_ptr(), ordinals.len() as c_int, ordinals.as_ptr()) })?;
        let world = ordinals.len();
        Ok(raws.into_iter().enumerate().map(|(rank, raw)| Self { raw, rank, world }).collect())
    }

    /// Enqueues a sum all-reduce of `count` elements on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be device pointers valid for `count` elements of `dtype` until
    /// the stream's work completes.
    pub unsafe fn all_reduce(&self, send: u64, recv: u64, count: usize, dtype: DType, stream: &Stream) -> Result<()> {
        // SAFETY: the caller's contract; `stream` is live.
        unsafe { self.all_reduce_raw(send, recv, count, dtype, stream.raw as u64) }
    }

    /// As [`all_reduce`](Self::all_reduce), on a raw `CUstream` given as an integer (a
    /// caller's stream, e.g. PyTorch's current one).
    ///
    /// # Safety
    /// As for [`all_reduce`](Self::all_reduce), and `stream` must be a live stream of this
    /// communicator's device (or 0).
    pub unsafe fn all_reduce_raw(&self, send: u64, recv: u64, count: usize, dtype: DType, stream: u64) -> Result<()> {
        let n = load()?;
        if self.raw.is_null() {
            return Err(Error::Unsupported { what: "ncclAllReduce".into(), reason: "this NCCL communicator was aborted".into() });
        }
        // SAFETY: caller's contract on the pointers; raw is a live communicator.
        n.check("ncclAllReduce", unsafe {
            (n.all_reduce)(send as *const c_void, recv as *mut c_void, count, nccl_dtype(dtype), ncclRedOp_t::ncclSum, self.raw, stream as *mut c_void)
        })
    }

    /// Enqueues one call of `collective` of `count` elements per rank (as
    /// [`Collective::io_elems`](crate::kinds::Collective::io_elems) counts them: NCCL's
    /// `sendcount` of `ncclAllGather`, `recvcount` of `ncclReduceScatter`) on a raw
    /// `CUstream`: sums for the reductions.
    ///
    /// # Safety
    /// `send` and `recv` must be device pointers valid for the collective's input and output
    /// elements of `dtype` until the stream's work completes; `stream` as for
    /// [`all_reduce_raw`](Self::all_reduce_raw).
    pub unsafe fn collective_raw(&self, collective: crate::kinds::Collective, send: u64, recv: u64, count: usize, dtype: DType, stream: u64) -> Result<()> {
        use crate::kinds::Collective;
        let n = load()?;
        let name = match collective {
            // SAFETY: the caller's contract is all_reduce_raw's.
            Collective::AllReduce => return unsafe { self.all_reduce_raw(send, recv, count, dtype, stream) },
            Collective::AllGather => "ncclAllGather",
            Collective::ReduceScatter => "ncclReduceScatter",
        };
        if self.raw.is_null() {
            return Err(Error::Unsupported { what: name.into(), reason: "this NCCL communicator was aborted".into() });
        }
        let (send, recv, stream) = (send as *const c_void, recv as *mut c_void, stream as *mut c_void);
        n.check(name, match collective {
            // SAFETY: caller's contract on the pointers; raw is a live communicator.
            Collective::AllGather => unsafe { (n.all_gather)(send, recv, count, nccl_dtype(dtype), self.raw, stream) },
            // SAFETY: as above.
            _ => unsafe { (n.reduce_scatter)(send, recv, count, nccl_dtype(dtype), ncclRedOp_t::ncclSum, self.raw, stream) },
        })
    }

    /// Brackets calls on several communicators of one process.
    pub fn group<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
        let n = load()?;
        // SAFETY: no arguments.
        n.check("ncclGroupStart", unsafe { (n.group_start)() })?;
        let r = body();
        // SAFETY: no arguments; matches the start above.
        let end = n.check("ncclGroupEnd", unsafe { (n.group_end)() });
        let v = r?;
        end?;
        Ok(v)
    }
}

impl NcclComm {
    /// Aborts the communicator: NCCL stops its operations in flight (their kernels return)
    /// and frees it. For a peer that died or never came: NCCL itself would wait forever.
    pub fn abort(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if let Ok(n) = load() {
            // SAFETY: raw is a live communicator, aborted once (set to null below).
            let _ = unsafe { (n.comm_abort)(self.raw) };
        }
        self.raw = std::ptr::null_mut();
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if let Ok(n) = load() {
            // SAFETY: raw is a live communicator destroyed once; failure is ignored.
            let _ = unsafe { (n.comm_destroy)(self.raw) };
        }
    }
}
