//! The run-time libraries tpar loads on a GPU machine — the NVIDIA driver (`libcuda.so.1`),
//! NVRTC (`libnvrtc.so.13`, which compiles the kernels) and NCCL (`libnccl.so.2`) — and the
//! kernel cache directory, as `tpar doctor` reports them.
//!
//! Each library is first loaded the way tpar loads it (`cuda::driver`, `cuda::nvrtc::probe`,
//! `cuda::nccl::load`: the `TPAR_*_LIB` setting, then the Python environment, then by name
//! through the loader's path), and reported with where it came from; only
//! where that fails are other places searched (files of the engine Python's installed
//! distributions, e.g. the `nvidia-cuda-nvrtc` wheel, and the usual system directories). A
//! library found only by searching gets the line that makes tpar find it.
//!
//! Owns: the search and the checks. Must never: fail or panic (a missing library is a status),
//! or change how tpar loads a library (it asks the loaders tpar uses).

use super::engine::Candidate;
use serde::{Deserialize, Serialize};
use std::path::Path;
#[cfg(feature = "cuda")]
use std::path::PathBuf;

/// The library files tpar loads, by the kind a [`Candidate`] names (the engine's Python
/// looks for them among its distributions' files: `rules::query`).
pub const FILES: [(&str, &str); 3] = [("libnvrtc.so.13", "nvrtc"), ("libnccl.so.2", "nccl"), ("libcuda.so.1", "cuda")];

/// How a library was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LibStatus {
    /// tpar finds it as it is (its setting, or by name).
    Found,
    /// tpar would not find it, but a file that loads was found by searching.
    FoundBySearch,
    /// Not found anywhere looked.
    Missing,
    /// Not checked (tpar built without the `cuda` feature).
    NotChecked,
}

/// One run-time library.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Library {
    pub name: String,
    /// The file tpar asks the loader for.
    pub file: String,
    /// The setting that names the file, where there is one.
    pub variable: Option<String>,
    pub status: LibStatus,
    /// Where it was found.
    pub path: Option<String>,
    pub version: Option<String>,
    /// How it was found, or why not and where it was looked for.
    pub detail: String,
    /// What tpar needs it for.
    pub needed_for: String,
}

impl Library {
    /// The problem line, if this library is a problem.
    pub fn problem(&self) -> Option<String> {
        match self.status {
            LibStatus::Found | LibStatus::NotChecked => None,
            LibStatus::FoundBySearch => Some(format!("{} ({}) is not found the way tpar loads it; found by searching at {} (the lines below make tpar find it)", self.name, self.file, self.path.as_deref().unwrap_or("?"))),
            LibStatus::Missing => Some(format!("{} ({}) not found: {}", self.name, self.file, self.detail)),
        }
    }

    /// The directory to put on `LD_LIBRARY_PATH` where no `TPAR_*` setting names the file.
    pub fn dir(&self) -> Option<String> {
        Path::new(self.path.as_deref()?).parent().map(|d| d.display().to_string())
    }
}

/// The kernel cache directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CacheStatus {
    pub dir: Option<String>,
    pub exists: bool,
    pub writable: bool,
    /// Compiled kernels in it.
    pub entries: usize,
    pub detail: String,
}

impl CacheStatus {
    pub fn problem(&self) -> Option<String> {
        match (&self.dir, self.writable) {
            (None, _) => Some(self.detail.clone()),
            (Some(d), false) => Some(format!("the kernel cache {d} is not writable: every process compiles its kernels again (about 1 s on its first call); set TPAR_CACHE_DIR to a writable directory")),
            (Some(_), true) => None,
        }
    }
}

/// The kernel cache (`settings::cache_dir`): where it is, whether it exists and can be written
/// (checked with `access(2)`, nothing created), how many compiled kernels it holds.
pub fn cache_status() -> CacheStatus {
    let Some(dir) = crate::settings::cache_dir() else {
        return CacheStatus { dir: None, exists: false, writable: false, entries: 0, detail: "no kernel cache directory: TPAR_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset, so every process compiles its kernels again".into() };
    };
    let exists = dir.is_dir();
    // The directory, or the nearest existing ancestor it would be created in.
    let mut probe: &Path = &dir;
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p,
            None => break,
        }
    }
    let writable = nix::unistd::access(probe, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK).is_ok();
    let entries = std::fs::read_dir(&dir).map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".cubin")).count()).unwrap_or(0);
    let detail = match (exists, writable) {
        (true, true) => format!("{entries} compiled kernels"),
        (true, false) => "exists, not writable".into(),
        (false, true) => format!("not created yet ({} is writable: the first GPU call creates it)", probe.display()),
        (false, false) => format!("not created yet, and {} is not writable", probe.display()),
    };
    CacheStatus { dir: Some(dir.display().to_string()), exists, writable, entries, detail }
}

#[cfg(feature = "cuda")]
/// Directories searched after the engine's distributions, per library (the CUDA toolkit's,
/// the distributions' library directories, a container's driver mount, WSL's).
fn system_dirs(file: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    if !file.starts_with("libcuda") {
        v.push("/usr/local/cuda/lib64".into());
        v.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
        v.push("/usr/local/cuda/targets/sbsa-linux/lib".into());
        if let Ok(rd) = std::fs::read_dir("/usr/local") {
            let mut more: Vec<PathBuf> = rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("cuda-")).map(|e| e.path().join("lib64")).collect();
            more.sort();
            v.extend(more);
        }
    }
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib"] {
        v.push(d.into());
    }
    v
}

/// A library file found by searching: (path, version, where).
#[cfg(feature = "cuda")]
type Hit = (String, Option<String>, String);

#[cfg(feature = "cuda")]
/// Where `file` was searched for, and the first candidate that loads: (path, version, from).
fn search(file: &str, candidates: &[Candidate], kind: &str, version: impl Fn(&Path) -> Option<String>) -> (Option<Hit>, Vec<String>) {
    let mut looked = Vec::new();
    let mut tries: Vec<(PathBuf, String)> = candidates.iter().filter(|c| c.library == kind).map(|c| (PathBuf::from(&c.path), format!("the {} distribution of the engine's Python", c.distribution))).collect();
    if !tries.is_empty() {
        looked.push("the engine Python's nvidia-* distributions".to_string());
    }
    for d in system_dirs(file) {
        tries.push((d.join(file), d.display().to_string()));
    }
    looked.push(system_dirs(file).iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "));
    for (path, from) in tries {
        if path.is_file() && loads(&path) {
            let v = version(&path);
            return (Some((path.display().to_string(), v, from)), looked);
        }
    }
    (None, looked)
}

#[cfg(feature = "cuda")]
/// The file of this process's mapped libraries whose name starts with `stem` (where the
/// loader found a library loaded by name).
fn mapped(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| Path::new(p).file_name().is_some_and(|n| n.to_string_lossy().starts_with(stem))).map(str::to_string)
}

#[cfg(feature = "cuda")]
fn loads(path: &Path) -> bool {
    // SAFETY: loading a shared library runs its initialisers; these are NVIDIA's libraries
    // (found by their file names), whose initialisers have no preconditions.
    unsafe { libloading::Library::new(path) }.is_ok()
}

/// `ncclGetVersion` of the library at `path`, as `2.28.5`.
#[cfg(feature = "cuda")]
fn nccl_version_at(path: &Path) -> Option<String> {
    // SAFETY: as in `loads`.
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    // SAFETY: NCCL's public entry point `ncclResult_t ncclGetVersion(int*)` (nccl.h).
    let f: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int> = unsafe { lib.get(b"ncclGetVersion\0") }.ok()?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: v is a valid out-pointer.
    (unsafe { f(&mut v) } == 0).then(|| nccl_version(v))
}

/// `nvrtcVersion` of the library at `path`, as `13.0`.
#[cfg(feature = "cuda")]
fn nvrtc_version_at(path: &Path) -> Option<String> {
    // SAFETY: as in `loads`.
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    // SAFETY: NVRTC's public entry point `nvrtcResult nvrtcVersion(int*, int*)` (nvrtc.h).
    let f: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_int, *mut std::ffi::c_int) -> std::ffi::c_int> = unsafe { lib.get(b"nvrtcVersion\0") }.ok()?;
    let (mut a, mut b): (std::ffi::c_int, std::ffi::c_int) = (0, 0);
    // SAFETY: both are valid out-pointers.
    (unsafe { f(&mut a, &mut b) } == 0).then(|| format!("{a}.{b}"))
}

/// NCCL's version code (22805) as `2.28.5`.
pub fn nccl_version(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
}

/// The three libraries, each loaded the way tpar loads it and, where that fails, searched for
/// (`candidates`: files the engine Python's distributions hold).
#[cfg(feature = "cuda")]
pub fn check(candidates: &[Candidate]) -> Vec<Library> {
    vec![driver(candidates), nvrtc(candidates), nccl(candidates)]
}

#[cfg(not(feature = "cuda"))]
pub fn check(_: &[Candidate]) -> Vec<Library> {
    ["NVIDIA driver", "NVRTC", "NCCL"]
        .iter()
        .map(|n| Library { name: n.to_string(), file: String::new(), variable: None, status: LibStatus::NotChecked, path: None, version: None, detail: "this tpar was built without the `cuda` feature".into(), needed_for: String::new() })
        .collect()
}

#[cfg(feature = "cuda")]
fn found_or_searched(mut lib: Library, err: String, candidates: &[Candidate], kind: &str, version: impl Fn(&Path) -> Option<String>) -> Library {
    let (hit, looked) = search(&lib.file, candidates, kind, version);
    match hit {
        Some((path, v, from)) => {
            lib.status = LibStatus::FoundBySearch;
            lib.detail = format!("not loadable the way tpar loads it ({err}); found in {from}");
            lib.path = Some(path);
            lib.version = v;
        }
        None => {
            lib.status = LibStatus::Missing;
            lib.detail = format!("{err}; also looked in {}", looked.join("; "));
        }
    }
    lib
}

#[cfg(feature = "cuda")]
fn driver(candidates: &[Candidate]) -> Library {
    let lib = Library {
        name: "NVIDIA driver".into(),
        file: "libcuda.so.1".into(),
        variable: None,
        status: LibStatus::Found,
        path: None,
        version: None,
        detail: String::new(),
        needed_for: "every GPU call".into(),
    };
    match crate::cuda::driver::init_driver() {
        Ok(()) => {
            let v = crate::cuda::driver::driver_version();
            let nvml = crate::topology::nvml::driver_version().map(|d| format!("driver {d}, ")).unwrap_or_default();
            Library { path: mapped("libcuda.so"), version: Some(format!("{nvml}CUDA {}.{}", v / 1000, (v % 1000) / 10)), detail: "by name".into(), ..lib }
        }
        Err(e) => found_or_searched(lib, e.to_string(), candidates, "cuda", |_| None),
    }
}

#[cfg(feature = "cuda")]
fn nvrtc(candidates: &[Candidate]) -> Library {
    let var = crate::cuda::nvrtc::NVRTC_LIB_ENV;
    let lib = Library {
        name: "NVRTC".into(),
        file: "libnvrtc.so.13".into(),
        variable: Some(var.into()),
        status: LibStatus::Found,
        path: None,
        version: None,
        detail: String::new(),
        needed_for: "compiling tpar's kernels on first use (without it tpar cannot start on a GPU: the engine keeps its own all-reduce)".into(),
    };
    match crate::cuda::nvrtc::probe() {
        Ok(v) => {
            // Where the loader found it: the setting, the Python environment, or by name.
            let (path, how) = match crate::cuda::nvrtc::found() {
                Some(f) => (Some(f.path.clone()), f.origin.describe()),
                None => (mapped("libnvrtc.so"), "by name".to_string()),
            };
            Library { path, version: Some(format!("{}.{}", v.major, v.minor)), detail: how, ..lib }
        }
        Err(e) => found_or_searched(lib, e.to_string(), candidates, "nvrtc", nvrtc_version_at),
    }
}

#[cfg(feature = "cuda")]
fn nccl(candidates: &[Candidate]) -> Library {
    let var = crate::cuda::nccl::NCCL_LIB_ENV;
    let lib = Library {
        name: "NCCL".into(),
        file: "libnccl.so.2".into(),
        variable: Some(var.into()),
        status: LibStatus::Found,
        path: None,
        version: None,
        detail: String::new(),
        needed_for: "tpar's own NCCL, where it runs the calls its plan gives NCCL (`tpar bench`, `tpar.torch` without an NCCL group); inside an engine those calls go to the engine's NCCL".into(),
    };
    match crate::cuda::nccl::load() {
        Ok(n) => {
            let path = if n.path.starts_with('/') { Some(n.path.clone()) } else { mapped("libnccl.so").or_else(|| Some(n.path.clone())) };
            let how = n.origin.describe();
            Library { path, version: n.version().ok().map(nccl_version), detail: how, ..lib }
        }
        Err(e) => found_or_searched(lib, e.to_string(), candidates, "nccl", nccl_version_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_codes_read_as_versions() {
        assert_eq!(nccl_version(22805), "2.28.5");
        assert_eq!(nccl_version(21903), "2.19.3");
    }

    #[test]
    fn every_library_is_reported_and_none_panics() {
        // On a machine without the libraries (CI), each is missing or found by searching,
        // never an error; with them, found. Either way: three entries, each with a detail.
        let libs = check(&[Candidate { library: "nvrtc".into(), path: "/nonexistent/libnvrtc.so.13".into(), distribution: "nvidia-cuda-nvrtc 0".into() }]);
        assert_eq!(libs.len(), 3);
        for l in &libs {
            assert!(!l.detail.is_empty(), "{l:?}");
            if l.status == LibStatus::Missing {
                assert!(l.problem().is_some_and(|p| p.contains(&l.file)), "{l:?}");
            }
        }
    }

    #[test]
    fn the_cache_is_described_without_creating_it() {
        let c = cache_status();
        if let Some(d) = &c.dir {
            assert_eq!(c.exists, Path::new(d).is_dir());
        }
        assert!(!c.detail.is_empty());
    }
}
