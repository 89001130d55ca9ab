//! Where the CUDA libraries tpar loads itself (NVRTC, NCCL) are looked for, in the order an
//! engine's torch finds its own:
//!
//! 1. the setting (`TPAR_NVRTC_LIB`: that file, or an error; `TPAR_NCCL_LIB`: tried first);
//! 2. the Python environment: the directories the Python package registered at import
//!    ([`set_environment_dirs`]: the import path of the `nvidia` namespace package, torch's
//!    lib directory), else, for the CLI, the active virtual or conda environment's
//!    `site-packages` (`VIRTUAL_ENV`, `CONDA_PREFIX`; [`crate::settings::python_env_prefixes`]).
//!    In each directory the pip wheels' layouts are tried (`nvidia/cu13/lib/libnvrtc.so.13` of
//!    `nvidia-cuda-nvrtc` 13.x, `nvidia/nccl/lib/libnccl.so.2` of `nvidia-nccl-cu13`), then the
//!    file itself;
//! 3. the system: the dynamic loader by name (`LD_LIBRARY_PATH`, `ld.so.cache`).
//!
//! Owns: the candidate list and the record of where each library came from ([`Found`]).
//! Must never: load anything (the callers do, so that a failure carries their message), or
//! read the environment itself.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The `TPAR_*_LIB` setting named the file.
    Setting(&'static str),
    /// A Python environment's directory (from the Python package, or `VIRTUAL_ENV` /
    /// `CONDA_PREFIX` for the CLI).
    Environment,
    /// The dynamic loader, by name.
    System,
}

impl Origin {
    /// How the origin reads in reports: `TPAR_NVRTC_LIB`, `the Python environment`, `by name`.
    pub fn describe(&self) -> String {
        match self {
            Origin::Setting(var) => (*var).to_string(),
            Origin::Environment => "the Python environment".to_string(),
            Origin::System => "by name (the system's loader path)".to_string(),
        }
    }
}

/// A library as loaded: its file (for one loaded by name, the file the loader mapped, where
/// it can be read back) and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: String,
    pub origin: Origin,
}

/// One library tpar looks for.
#[derive(Clone, Copy, Debug)]
pub struct Wanted {
    /// The file name (the soname pip wheels and distributions ship).
    pub file: &'static str,
    /// Where the pip wheels put it, relative to a `site-packages` directory.
    pub layouts: &'static [&'static str],
}

/// `nvidia-cuda-nvrtc` 13.x (torch 2.11's CUDA 13 wheels): `nvidia/cu13/lib/libnvrtc.so.13`.
pub const NVRTC: Wanted = Wanted { file: "libnvrtc.so.13", layouts: &["nvidia/cu13/lib"] };
/// `nvidia-nccl-cu13` (torch 2.11 pins 2.28.9): `nvidia/nccl/lib/libnccl.so.2`.
pub const NCCL: Wanted = Wanted { file: "libnccl.so.2", layouts: &["nvidia/nccl/lib"] };

static ENV_DIRS: Mutex<Option<Vec<PathBuf>>> = Mutex::new(None);

/// Registers the Python environment's directories (the Python package calls this once at
/// import, before any library is loaded): each is a `site-packages`-like directory holding
/// `nvidia/`, or a directory holding the library files themselves. Replaces what the CLI
/// would derive from `VIRTUAL_ENV` / `CONDA_PREFIX`. A library already loaded stays loaded.
pub fn set_environment_dirs(dirs: Vec<PathBuf>) {
    let mut g = ENV_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    *g = Some(dirs);
}

/// The environment's directories: those registered from Python, else the active virtual /
/// conda environment's `lib/python3.*/site-packages`.
pub fn environment_dirs() -> Vec<PathBuf> {
    let registered = ENV_DIRS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match registered {
        Some(d) => d,
        None => crate::settings::python_env_prefixes().iter().flat_map(|p| site_packages(p)).collect(),
    }
}

/// `PREFIX/lib/python3.*/site-packages`, sorted (one per Python version in the environment).
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(prefix.join("lib"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join("site-packages"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The files of `lib` in `dirs` that exist, in order (each directory: the wheels' layouts,
/// then the directory itself).
pub fn files_in(lib: Wanted, dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        for sub in lib.layouts.iter().copied().chain(std::iter::once("")) {
            let f = if sub.is_empty() { d.join(lib.file) } else { d.join(sub).join(lib.file) };
            if f.is_file() && !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// The file of this process's mapped libraries whose name starts with `stem` (which file the
/// loader picked for a library loaded by name). Linux only; None elsewhere or if unreadable.
pub fn mapped(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| Path::new(p).file_name().is_some_and(|n| n.to_string_lossy().starts_with(stem)))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_layouts_come_before_the_bare_directory_and_missing_files_are_skipped() {
        let root = std::env::temp_dir().join(format!("tpar-libpath-{}", std::process::id()));
        let site = root.join("site");
        let plain = root.join("plain");
        std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::write(site.join("nvidia/cu13/lib/libnvrtc.so.13"), b"").unwrap();
        std::fs::write(plain.join("libnvrtc.so.13"), b"").unwrap();
        let dirs = vec![root.join("absent"), site.clone(), plain.clone()];
        assert_eq!(files_in(NVRTC, &dirs), vec![site.join("nvidia/cu13/lib/libnvrtc.so.13"), plain.join("libnvrtc.so.13")]);
        assert!(files_in(NCCL, &dirs).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
