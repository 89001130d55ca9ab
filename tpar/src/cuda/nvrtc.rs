//! Run-time compilation of the kernels with NVRTC (through cudarc), and the on-disk cache.
//!
//! Owns: finding libnvrtc without panicking (cudarc panics on a missing library, so presence
//! is checked first; `TPAR_NVRTC_LIB` may name the file, e.g. from the pinned pip wheel), the
//! compile options, and the PTX cache in `$XDG_CACHE_HOME/tpar` (or `~/.cache/tpar`), keyed
//! by source hash + arch + NVRTC version. A cache failure is a warning, never an error.
//! Must never need nvcc, a CUDA header or an include path.

use super::kernels::{fnv1a64, KernelSource};
use crate::error::{Error, Result};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Environment variable naming the libnvrtc file to load (e.g. `.nvrtc/nvidia/cu13/lib/libnvrtc.so.13`).
pub const NVRTC_LIB_ENV: &str = "TPAR_NVRTC_LIB";

/// What was found: the NVRTC version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvrtcVersion {
    pub major: i32,
    pub minor: i32,
}

static PRELOADED: OnceLock<std::result::Result<Vec<libloading::Library>, String>> = OnceLock::new();

/// Loads `$TPAR_NVRTC_LIB` (if set), and the `libnvrtc-builtins.so.*` beside it, and keeps
/// them loaded: cudarc then opens `libnvrtc.so.13` by name and NVRTC opens its builtins by
/// name, and the dynamic loader hands back the already-loaded objects (it matches by
/// soname), so the wheel's library is used without touching LD_LIBRARY_PATH.
fn preload() -> Result<()> {
    let r = PRELOADED.get_or_init(|| {
        let Some(path) = std::env::var_os(NVRTC_LIB_ENV) else { return Ok(Vec::new()) };
        let path = PathBuf::from(path);
        let mut files = Vec::new();
        if let Some(dir) = path.parent() {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    // Builtins first: libnvrtc resolves them lazily, by name.
                    if name.starts_with("libnvrtc-builtins.so") {
                        files.push(e.path());
                    }
                }
            }
        }
        files.push(path.clone());
        let mut libs = Vec::new();
        for f in files {
            // SAFETY: loading NVRTC's libraries runs their initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(&f) } {
                Ok(lib) => libs.push(lib),
                Err(e) if f == path => return Err(format!("{NVRTC_LIB_ENV}={} could not be loaded: {e}", path.display())),
                Err(e) => tracing::warn!("tpar: {} not preloaded: {e}", f.display()),
            }
        }
        Ok(libs)
    });
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Library { library: "nvrtc", reason: e.clone() }),
    }
}

/// Checks that libnvrtc can be loaded and returns its version. Never panics.
pub fn probe() -> Result<NvrtcVersion> {
    preload()?;
    // SAFETY: is_culib_present only tries dlopen on candidate names and drops the handles.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(Error::Library {
            library: "nvrtc",
            reason: format!(
                "libnvrtc (CUDA 13) not found: put its directory on LD_LIBRARY_PATH (e.g. /usr/local/cuda/lib64) \
                 or set {NVRTC_LIB_ENV} to the file; `scripts/install-nvrtc.sh` installs the pinned wheel \
                 nvidia-cuda-nvrtc==13.0.88 into .nvrtc/"
            ),
        });
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); both out-pointers are valid.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Library { library: "nvrtc", reason: format!("nvrtcVersion failed: {rc:?}") });
    }
    Ok(NvrtcVersion { major, minor })
}

/// The options every kernel is compiled with. `arch` is e.g. `sm_90`.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        // Exact f32 adds in rank order: no flush-to-zero, no fast math.
        "--ftz=false".into(),
        "--fmad=false".into(),
        "--restrict".into(),
    ]
}

/// Compiles one kernel file (all three dtype instantiations) to PTX for `arch`.
pub fn compile(src: &KernelSource, arch: &str) -> Result<String> {
    probe()?;
    let lib_err = |what: &str, e: nvrtc_result::NvrtcError| Error::Library {
        library: "nvrtc",
        reason: format!("{what} for {} ({arch}): {e:?}", src.file),
    };
    let text = CString::new(src.translation_unit())
        .map_err(|_| Error::invalid("kernel source", format!("{} contains a NUL byte", src.file)))?;
    let name = CString::new(src.file).map_err(|_| Error::invalid("kernel name", "NUL byte"))?;
    let prog = nvrtc_result::create_program(&text, Some(name.as_c_str())).map_err(|e| lib_err("nvrtcCreateProgram", e))?;
    let guard = ProgramGuard(prog);
    // SAFETY: prog is a live program (owned by guard); options are plain strings.
    let compiled = unsafe { nvrtc_result::compile_program(guard.0, &options(arch)) };
    if let Err(e) = compiled {
        // SAFETY: prog is live; the log is a NUL-terminated buffer NVRTC filled.
        let log = unsafe { nvrtc_result::get_program_log(guard.0) }
            .map(|v| {
                let bytes: Vec<u8> = v.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        return Err(Error::Library {
            library: "nvrtc",
            reason: format!("compiling {} for {arch} failed ({e:?}):\n{log}", src.file),
        });
    }
    // SAFETY: prog compiled successfully; get_ptx copies the PTX out.
    let ptx = unsafe { nvrtc_result::get_ptx(guard.0) }.map_err(|e| lib_err("nvrtcGetPTX", e))?;
    let bytes: Vec<u8> = ptx.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
    String::from_utf8(bytes).map_err(|_| Error::Library { library: "nvrtc", reason: "PTX is not UTF-8".into() })
}

struct ProgramGuard(nvrtc_sys::nvrtcProgram);
impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by create_program and is destroyed once, here.
        // A failure to destroy leaks a little host memory; it must not panic.
        let _ = unsafe { nvrtc_result::destroy_program(self.0) };
    }
}

/// Directory of the compile cache, if one can be named.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("tpar"));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache").join("tpar"))
}

/// Cache file name: source hash + arch + NVRTC version.
pub fn cache_key(src: &KernelSource, arch: &str, v: NvrtcVersion) -> String {
    format!("{}-{:016x}-{arch}-nvrtc{}.{}.ptx", src.stem(), fnv1a64(&src.translation_unit()), v.major, v.minor)
}

/// Whether a compile came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
    /// The cache could not be used (a warning was logged).
    Unavailable,
}

/// Compiles through the on-disk cache.
pub fn compile_cached(src: &KernelSource, arch: &str) -> Result<(String, CacheOutcome)> {
    let v = probe()?;
    let Some(dir) = cache_dir() else {
        tracing::warn!("tpar: no cache directory (neither XDG_CACHE_HOME nor HOME is set); compiling {}", src.file);
        return Ok((compile(src, arch)?, CacheOutcome::Unavailable));
    };
    let path = dir.join(cache_key(src, arch, v));
    if let Ok(text) = std::fs::read_to_string(&path) {
        if text.contains(".entry") {
            return Ok((text, CacheOutcome::Hit));
        }
    }
    let ptx = compile(src, arch)?;
    let stored = std::fs::create_dir_all(&dir).and_then(|()| {
        let tmp = dir.join(format!(".{}.{}.tmp", cache_key(src, arch, v), std::process::id()));
        std::fs::write(&tmp, ptx.as_bytes())?;
        std::fs::rename(&tmp, &path)
    });
    match stored {
        Ok(()) => Ok((ptx, CacheOutcome::Miss)),
        Err(e) => {
            tracing::warn!("tpar: kernel cache {} not written: {e}", path.display());
            Ok((ptx, CacheOutcome::Unavailable))
        }
    }
}

/// NUL-terminated copy of a PTX text, for the driver.
pub fn ptx_cstring(ptx: &str) -> Result<CString> {
    CString::new(ptx).map_err(|_| Error::Library { library: "nvrtc", reason: "PTX contains a NUL byte".into() })
}

