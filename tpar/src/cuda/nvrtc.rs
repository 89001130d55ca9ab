//! Run-time compilation of the kernels with NVRTC (through cudarc), and the on-disk cache.
//!
//! Owns: finding libnvrtc without panicking (cudarc panics on a missing library, so presence
//! is checked first) in `cuda::libpath`'s order — `TPAR_NVRTC_LIB`, the Python environment's
//! `nvidia-cuda-nvrtc` wheel, the system — and recording where it came from ([`found`]), the
//! compile options, and the cubin cache in `$XDG_CACHE_HOME/tpar` (or `~/.cache/tpar`).
//!
//! Kernels are compiled straight to the device's architecture (`-arch=sm_XX`, cubin), one
//! (algorithm, dtype) variant at a time, when a call first needs it: the driver then has
//! nothing left to compile (PTX handed to the driver cost ~20 s of JIT on a fresh H200).
//! A cache entry's name hashes the source, the options, the architecture and the NVRTC and
//! driver versions; its content carries a checksum, so a torn, corrupt or foreign file is
//! rebuilt, never trusted. Entries are written to a unique temporary file and renamed into
//! place, so eight ranks filling the cache at once never see each other's half-written files.
//! A cache failure is a warning, never an error. Must never need nvcc, a CUDA header or an
//! include path.

use super::kernels::KernelSource;
use super::libpath::{self, Found, Origin};
use crate::units::fnv1a64;
use crate::dtype::DType;
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

/// The NVRTC wheel to install where the system has none: CUDA 13.0's, the version the GPU
/// machine's driver takes (a newer NVRTC emits PTX that an older driver refuses); the pin of
/// `scripts/install-nvrtc.sh`.
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";

/// What `preload` settled on: the libraries it keeps loaded, and where NVRTC came from
/// (None: nothing preloaded, cudarc finds it by name).
struct Preloaded {
    _libs: Vec<libloading::Library>,
    from: Option<Found>,
}

static PRELOADED: OnceLock<std::result::Result<Preloaded, String>> = OnceLock::new();
static FOUND: OnceLock<Found> = OnceLock::new();

/// Loads `path` and the `libnvrtc-builtins.so.*` beside it (builtins first: libnvrtc resolves
/// them lazily, by name).
fn load_with_builtins(path: &std::path::Path) -> std::result::Result<Vec<libloading::Library>, String> {
    let mut files = Vec::new();
    if let Some(dir) = path.parent() {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("libnvrtc-builtins.so") {
                    files.push(e.path());
                }
            }
        }
    }
    files.sort();
    files.push(path.to_path_buf());
    let mut libs = Vec::new();
    for f in files {
        // SAFETY: loading NVRTC's libraries runs their initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(&f) } {
            Ok(lib) => libs.push(lib),
            Err(e) if f == path => return Err(format!("could not be loaded: {e}")),
            Err(e) => tracing::warn!("tpar: {} not preloaded: {e}", f.display()),
        }
    }
    Ok(libs)
}

/// Finds libnvrtc in `cuda::libpath`'s order and keeps the file loaded: the setting
/// (`$TPAR_NVRTC_LIB`: that file or an error), then the Python environment's wheel, then
/// nothing (cudarc's search by name). cudarc then opens `libnvrtc.so.13` by name and NVRTC
/// opens its builtins by name, and the dynamic loader hands back the already-loaded objects
/// (it matches by soname), so the wheel's library is used without touching LD_LIBRARY_PATH.
fn preload() -> Result<()> {
    let r = PRELOADED.get_or_init(|| {
        if let Some(path) = crate::settings::nvrtc_lib() {
            let libs = load_with_builtins(&path).map_err(|e| format!("{NVRTC_LIB_ENV}={} {e}", path.display()))?;
            let from = Found { path: path.display().to_string(), origin: Origin::Setting(NVRTC_LIB_ENV) };
            return Ok(Preloaded { _libs: libs, from: Some(from) });
        }
        for path in libpath::files_in(libpath::NVRTC, &libpath::environment_dirs()) {
            match load_with_builtins(&path) {
                Ok(libs) => {
                    let from = Found { path: path.display().to_string(), origin: Origin::Environment };
                    return Ok(Preloaded { _libs: libs, from: Some(from) });
                }
                // A broken wheel is not the end: the next directory, then the system.
                Err(e) => tracing::warn!("tpar: the Python environment's {} skipped: {e}", path.display()),
            }
        }
        Ok(Preloaded { _libs: Vec::new(), from: None })
    });
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Library { library: "nvrtc", reason: e.clone() }),
    }
}

/// Where the NVRTC in use came from (the setting, the Python environment, or the system's
/// loader, with the file it mapped), once [`probe`] has succeeded; None before, or without
/// NVRTC. `tpar doctor` reports it.
pub fn found() -> Option<&'static Found> {
    FOUND.get()
}

/// Checks that libnvrtc can be loaded and returns its version. Never panics.
pub fn probe() -> Result<NvrtcVersion> {
    preload()?;
    // SAFETY: is_culib_present only tries dlopen on candidate names and drops the handles.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(Error::Library {
            library: "nvrtc",
            reason: format!(
                "libnvrtc (CUDA 13) not found: looked in {NVRTC_LIB_ENV} (unset), the Python environment ({}) and by name. \
                 `pip install {NVRTC_WHEEL}` into the engine's environment (torch's CUDA 13 wheels pull it), \
                 or put its directory on LD_LIBRARY_PATH (e.g. /usr/local/cuda/lib64), or set {NVRTC_LIB_ENV} to the file; \
                 in a clone of tpar, `scripts/install-nvrtc.sh` installs the same wheel into .nvrtc/",
                describe_dirs(&libpath::environment_dirs())
            ),
        });
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); both out-pointers are valid.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Library { library: "nvrtc", reason: format!("nvrtcVersion failed: {rc:?}") });
    }
    let _ = FOUND.get_or_init(|| match PRELOADED.get() {
        Some(Ok(Preloaded { from: Some(f), .. })) => match other_nvrtc(&f.path) {
            // cudarc opens `libnvrtc.so` by name before `libnvrtc.so.13`; where the loader's
            // path has one (a CUDA toolkit's), that file is the NVRTC in use, not ours.
            Some(other) => {
                tracing::warn!("tpar: {} was preloaded ({}), but the loader also opened {other} by name (libnvrtc.so on its path), and that one compiles the kernels", f.path, f.origin.describe());
                Found { path: other, origin: Origin::System }
            }
            None => f.clone(),
        },
        _ => Found { path: libpath::mapped("libnvrtc.so").unwrap_or_else(|| "libnvrtc (by name)".into()), origin: Origin::System },
    });
    Ok(NvrtcVersion { major, minor })
}

/// A mapped `libnvrtc.so*` file other than `ours` (both canonicalised), if the loader has one.
fn other_nvrtc(ours: &str) -> Option<String> {
    let ours = std::fs::canonicalize(ours).ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| std::path::Path::new(p).file_name().is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc.so")))
        .find(|p| std::fs::canonicalize(p).map_or(true, |c| c != ours))
        .map(str::to_string)
}

/// The directories searched, for messages: `none registered` when there are none.
fn describe_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        "no directory: no Python package registered one, no VIRTUAL_ENV or CONDA_PREFIX".into()
    } else {
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// The options every kernel is compiled with. `arch` is e.g. `sm_90`; `variant` names the one
/// dtype instantiation to compile (`None`: all three, as the CI compile test does).
pub fn options(arch: &str, variant: Option<DType>) -> Vec<String> {
    let mut o = vec![
        // A real architecture: NVRTC emits SASS (cubin), the driver compiles nothing.
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        // Exact f32 adds in rank order: no flush-to-zero, no fast math.
        "--ftz=false".into(),
        "--fmad=false".into(),
        "--restrict".into(),
    ];
    if let Some(d) = variant {
        o.push(format!("-DTPAR_ONLY_{}", super::kernels::dtype_suffix(d).to_ascii_uppercase()));
    }
    o
}

/// What one compile produced.
pub struct Compiled {
    /// SASS for the architecture (what the driver loads).
    pub cubin: Vec<u8>,
    /// The PTX of the same compile (the CI test reads it: entries, no local memory).
    pub ptx: String,
    /// The compiler's log of a successful compile (with `--ptxas-options=-v`: each
    /// function's registers, stack frame and spills; the CI test reads it).
    pub log: String,
}

/// Compiles a translation unit with `opts`. `name` is for messages.
pub fn compile_unit(name: &str, text: &str, opts: &[String]) -> Result<Compiled> {
    probe()?;
    let lib_err = |what: &str, e: nvrtc_result::NvrtcError| Error::Library { library: "nvrtc", reason: format!("{what} for {name}: {e:?}") };
    let text = CString::new(text).map_err(|_| Error::invalid("kernel source", format!("{name} contains a NUL byte")))?;
    let cname = CString::new(name).map_err(|_| Error::invalid("kernel name", "NUL byte"))?;
    let prog = nvrtc_result::create_program(&text, Some(cname.as_c_str())).map_err(|e| lib_err("nvrtcCreateProgram", e))?;
    let guard = ProgramGuard(prog);
    // SAFETY: prog is a live program (owned by guard); options are plain strings.
    let compiled = unsafe { nvrtc_result::compile_program(guard.0, opts) };
    if let Err(e) = compiled {
        let log = program_log(&guard);
        return Err(Error::Library { library: "nvrtc", reason: format!("compiling {name} ({}) failed ({e:?}):\n{log}", opts.join(" ")) });
    }
    // SAFETY: prog compiled successfully; get_ptx copies the PTX out.
    let ptx = unsafe { nvrtc_result::get_ptx(guard.0) }.map_err(|e| lib_err("nvrtcGetPTX", e))?;
    let bytes: Vec<u8> = ptx.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
    let ptx = String::from_utf8(bytes).map_err(|_| Error::Library { library: "nvrtc", reason: "PTX is not UTF-8".into() })?;
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; size is a valid out-pointer.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBINSize(guard.0, &mut size) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(Error::Library { library: "nvrtc", reason: format!("nvrtcGetCUBINSize for {name}: {rc:?} (size {size}); was a real sm_XX architecture given?") });
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin holds exactly `size` bytes, as NVRTC asked for.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut std::ffi::c_char) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Library { library: "nvrtc", reason: format!("nvrtcGetCUBIN for {name}: {rc:?}") });
    }
    let log = program_log(&guard);
    Ok(Compiled { cubin, ptx, log })
}

/// The program's log (empty if NVRTC cannot give it).
fn program_log(guard: &ProgramGuard) -> String {
    // SAFETY: guard.0 is a live program; the log is a NUL-terminated buffer NVRTC filled.
    unsafe { nvrtc_result::get_program_log(guard.0) }
        .map(|v| {
            let bytes: Vec<u8> = v.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default()
}

/// Compiles one kernel file for `arch`: one dtype's instantiation, or all three.
pub fn compile(src: &KernelSource, arch: &str, variant: Option<DType>) -> Result<Compiled> {
    compile_unit(src.file, &src.translation_unit(), &options(arch, variant))
}

struct ProgramGuard(nvrtc_sys::nvrtcProgram);
impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by create_program and is destroyed once, here.
        // A failure to destroy leaks a little host memory; it must not panic.
        let _ = unsafe { nvrtc_result::destroy_program(self.0) };
    }
}

/// Directory of the compile cache (`crate::settings::cache_dir`).
pub fn cache_dir() -> Option<PathBuf> {
    crate::settings::cache_dir()
}

/// Everything a compiled image depends on. Two keys are equal only if the images would be.
#[derive(Clone, Debug)]
pub struct CacheKey {
    /// `oneshot_push-bf16`, `common`: for people reading the directory.
    pub label: String,
    pub hash: u64,
}

/// The key of a translation unit compiled with `opts` for `arch`, by NVRTC `v` for a driver
/// of version `driver` (cuDriverGetVersion; 0 when unknown).
pub fn cache_key_for(label: &str, text: &str, opts: &[String], arch: &str, v: NvrtcVersion, driver: i32) -> CacheKey {
    let mut material = Vec::with_capacity(text.len() + 256);
    material.extend_from_slice(text.as_bytes());
    for o in opts {
        material.push(0);
        material.extend_from_slice(o.as_bytes());
    }
    material.extend_from_slice(format!("\0{arch}\0nvrtc{}.{}\0driver{driver}\0{CACHE_FORMAT}", v.major, v.minor).as_bytes());
    CacheKey { label: label.to_string(), hash: fnv1a64(&material) }
}

/// File name of a cache entry.
pub fn cache_file_name(key: &CacheKey) -> String {
    format!("{}-{:016x}.cubin", key.label, key.hash)
}

/// The old name scheme's stand-in, kept for tests: the key of one kernel file for `arch`.
pub fn cache_key(src: &KernelSource, arch: &str, v: NvrtcVersion) -> String {
    let opts = options(arch, None);
    let k = cache_key_for(src.stem(), &src.translation_unit(), &opts, arch, v, 0);
    format!("{}-{arch}-nvrtc{}.{}", cache_file_name(&k), v.major, v.minor)
}

/// Bumped whenever the entry format changes.
const CACHE_FORMAT: &str = "tpar-cubin-v1";
/// An entry: this magic, the payload's length (u64 LE), its FNV-1a 64 (u64 LE), the key's
/// hash (u64 LE), then the payload.
const MAGIC: &[u8; 8] = b"TPARCUB1";
const HEADER: usize = 8 + 8 + 8 + 8;

/// The payload of a cache entry, if the bytes are a whole, uncorrupted entry for `key`.
pub fn decode_entry<'a>(bytes: &'a [u8], key: &CacheKey) -> Option<&'a [u8]> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let word = |i: usize| bytes.get(i..i + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes);
    let (len, sum, k) = (word(8)?, word(16)?, word(24)?);
    let payload = &bytes[HEADER..];
    (payload.len() as u64 == len && fnv1a64(payload) == sum && k == key.hash).then_some(payload)
}

/// A cache entry holding `payload` under `key`.
pub fn encode_entry(payload: &[u8], key: &CacheKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    out.extend_from_slice(&key.hash.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Whether a compile came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
    /// The cache could not be used (a warning was logged).
    Unavailable,
}

/// Reads a valid entry for `key` from `dir`, or None (missing, torn, corrupt or foreign:
/// the caller rebuilds it).
pub fn cache_read(dir: &std::path::Path, key: &CacheKey) -> Option<Vec<u8>> {
    let path = dir.join(cache_file_name(key));
    let bytes = std::fs::read(&path).ok()?;
    match decode_entry(&bytes, key) {
        Some(p) => Some(p.to_vec()),
        None => {
            tracing::warn!("tpar: kernel cache entry {} is corrupt or stale; rebuilding it", path.display());
            None
        }
    }
}

/// Writes an entry through a temporary file unique to this process and moment, then renames
/// it into place (atomic on one filesystem): concurrent writers each install a whole entry.
pub fn cache_write(dir: &std::path::Path, key: &CacheKey, payload: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = dir.join(format!(".{}.{}.{nanos}.tmp", cache_file_name(key), std::process::id()));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode_entry(payload, key))?;
        f.sync_data()?;
        std::fs::rename(&tmp, dir.join(cache_file_name(key)))
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// The cubin of one translation unit, from the cache or compiled (and then cached).
/// `rebuild` skips the cache read (an entry the driver refused).
pub fn cubin_cached(label: &str, text: &str, opts: &[String], arch: &str, driver: i32, rebuild: bool) -> Result<(Vec<u8>, CacheOutcome)> {
    let v = probe()?;
    let key = cache_key_for(label, text, opts, arch, v, driver);
    let Some(dir) = cache_dir() else {
        tracing::warn!("tpar: no cache directory (TPAR_CACHE_DIR, XDG_CACHE_HOME, HOME unset); compiling {label}");
        return Ok((compile_unit(label, text, opts)?.cubin, CacheOutcome::Unavailable));
    };
    if !rebuild {
        if let Some(c) = cache_read(&dir, &key) {
            return Ok((c, CacheOutcome::Hit));
        }
    }
    let c = compile_unit(label, text, opts)?;
    match cache_write(&dir, &key, &c.cubin) {
        Ok(()) => Ok((c.cubin, CacheOutcome::Miss)),
        Err(e) => {
            tracing::warn!("tpar: kernel cache {} not written: {e}", dir.display());
            Ok((c.cubin, CacheOutcome::Unavailable))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(h: u64) -> CacheKey {
        CacheKey { label: "t".into(), hash: h }
    }

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let k = key(7);
        let e = encode_entry(b"hello cubin", &k);
        assert_eq!(decode_entry(&e, &k), Some(&b"hello cubin"[..]));
        assert_eq!(decode_entry(&e, &key(8)), None, "another key's entry");
        assert_eq!(decode_entry(&e[..e.len() - 1], &k), None, "torn");
        let mut bad = e.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(decode_entry(&bad, &k), None, "flipped bit");
        assert_eq!(decode_entry(b"", &k), None);
        assert_eq!(decode_entry(b"TPARCUB1", &k), None);
    }

    #[test]
    fn keys_depend_on_everything() {
        let v = NvrtcVersion { major: 13, minor: 0 };
        let o = vec!["-a".to_string()];
        let base = cache_key_for("x", "src", &o, "sm_90", v, 13000).hash;
        assert_ne!(base, cache_key_for("x", "src2", &o, "sm_90", v, 13000).hash);
        assert_ne!(base, cache_key_for("x", "src", &["-b".to_string()], "sm_90", v, 13000).hash);
        assert_ne!(base, cache_key_for("x", "src", &o, "sm_80", v, 13000).hash);
        assert_ne!(base, cache_key_for("x", "src", &o, "sm_90", NvrtcVersion { major: 13, minor: 1 }, 13000).hash);
        assert_ne!(base, cache_key_for("x", "src", &o, "sm_90", v, 13010).hash);
    }

    #[test]
    fn concurrent_writers_leave_one_whole_entry() {
        let dir = std::env::temp_dir().join(format!("tpar-test-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let k = key(42);
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let (dir, k) = (&dir, &k);
                s.spawn(move || {
                    for _ in 0..20 {
                        let payload = vec![t; 64 << 10];
                        cache_write(dir, k, &payload).unwrap();
                        // Whatever is there is some writer's whole entry, never a mix.
                        let got = cache_read(dir, k).unwrap();
                        assert!(got.len() == 64 << 10 && got.iter().all(|b| *b == got[0]));
                    }
                });
            }
        });
        // A corrupt entry is reported as absent (the caller rebuilds it).
        std::fs::write(dir.join(cache_file_name(&k)), b"TPARCUB1garbage").unwrap();
        assert!(cache_read(&dir, &k).is_none());
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
