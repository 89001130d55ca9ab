//! CI test without a GPU: tpar finds NVRTC in a Python environment the way an engine's torch
//! finds its own — with no `TPAR_NVRTC_LIB` and nothing on `LD_LIBRARY_PATH` — and compiles
//! with it. The environment is the pinned `nvidia-cuda-nvrtc==13.0.88` wheel that
//! `scripts/install-nvrtc.sh` installs into `.nvrtc/` (a `pip --target` directory: the same
//! layout as a venv's `site-packages`, `nvidia/cu13/lib/libnvrtc.so.13`).
//!
//! Each case runs in a child process (this test binary again) whose environment has neither
//! `TPAR_NVRTC_LIB` nor `LD_LIBRARY_PATH`, since the test command exports both for the kernel
//! compile test. Without `.nvrtc/` the test prints `SKIPPED <test>: <why>` (logged for the summary); with
//! `TPAR_REQUIRE_NVRTC=1` a missing `.nvrtc/` fails instead.
#![cfg(feature = "cuda")]

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;
use tpar::cuda::libpath::{self, Origin};
use tpar::cuda::nvrtc;

const CASE: &str = "TPAR_DISCOVERY_CASE";
const SITE: &str = "TPAR_DISCOVERY_SITE";

fn site() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.join(".nvrtc");
    dir.join("nvidia/cu13/lib/libnvrtc.so.13").is_file().then_some(dir)
}

fn skip_or_fail(why: &str) {
    if std::env::var("TPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("TPAR_REQUIRE_NVRTC=1 but {why}");
    }
    common::skip("nvrtc_discovery", why);
}

/// Runs `case` in a child process with a clean library environment; returns its stderr.
fn child(case: &str, site: &Path, extra: &[(&str, &Path)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--exact", "child_case", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env(SITE, site)
        .env_remove("TPAR_NVRTC_LIB")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "case {case} failed:\n{err}");
    assert!(err.contains(&format!("case {case} ok")), "case {case} did not run:\n{err}");
    err
}

/// The child: what the case asserts runs here, in a process of its own (ignored in a plain
/// run: the tests above start it with `--ignored`).
#[test]
#[ignore = "a child process of the discovery tests"]
fn child_case() {
    let case = std::env::var(CASE).expect("started by a discovery test, which sets the case");
    let site = PathBuf::from(std::env::var(SITE).unwrap());
    assert!(std::env::var_os("TPAR_NVRTC_LIB").is_none());
    assert_eq!(std::env::var_os("LD_LIBRARY_PATH").is_some(), case == "shadowed");
    if case == "shadowed" {
        // A `libnvrtc.so` on the loader's path (as a CUDA toolkit's lib64 has): cudarc opens
        // that name first, so it is the NVRTC in use, and found() must say so.
        libpath::set_environment_dirs(vec![site.clone()]);
        nvrtc::probe().unwrap_or_else(|e| panic!("{e}"));
        let found = nvrtc::found().unwrap();
        let other = std::fs::canonicalize(PathBuf::from(std::env::var_os("LD_LIBRARY_PATH").unwrap()).join("libnvrtc.so")).unwrap();
        assert_eq!(found.origin, Origin::System, "{found:?}");
        assert_eq!(std::fs::canonicalize(&found.path).unwrap(), other, "{found:?}");
        eprintln!("case {case} ok: {} ({})", found.path, found.origin.describe());
        return;
    }
    match case.as_str() {
        // The Python package registers its environment's directories (tpar/__init__.py).
        "registered" => libpath::set_environment_dirs(vec![site.join("absent"), site.clone()]),
        // The CLI in an activated venv: VIRTUAL_ENV, set by the parent.
        "virtual_env" => {}
        other => panic!("unknown case {other}"),
    }
    let v = nvrtc::probe().unwrap_or_else(|e| panic!("NVRTC not found from {}: {e}", site.display()));
    assert_eq!((v.major, v.minor), (13, 0), "the pinned wheel is 13.0");
    let found = nvrtc::found().expect("probe succeeded, so where NVRTC came from is known");
    assert_eq!(found.origin, Origin::Environment, "{found:?}");
    let want = std::fs::canonicalize(site.join("nvidia/cu13/lib/libnvrtc.so.13")).unwrap();
    assert_eq!(std::fs::canonicalize(&found.path).unwrap(), want, "{found:?}");
    // The library the loader mapped is that file (and no other libnvrtc was loaded).
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| Path::new(p).file_name().is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc.so")))
        .map(|p| std::fs::canonicalize(p).unwrap())
        .collect();
    assert!(!mapped.is_empty() && mapped.iter().all(|p| *p == want), "mapped libnvrtc: {mapped:?}, want {}", want.display());
    // And it compiles (its builtins, loaded beside it, are found too).
    let unit = tpar::cuda::kernels::probe_unit();
    let c = nvrtc::compile_unit("discovery", &unit, &nvrtc::options("sm_90", None)).unwrap_or_else(|e| panic!("compile with the discovered NVRTC: {e}"));
    assert!(!c.cubin.is_empty());
    eprintln!("case {case} ok: {} ({})", found.path, found.origin.describe());
}

#[test]
fn nvrtc_is_found_in_the_python_environment_the_package_registers() {
    let Some(site) = site() else { return skip_or_fail(".nvrtc/ holds no libnvrtc.so.13 (scripts/install-nvrtc.sh installs it)") };
    let out = child("registered", &site, &[]);
    eprintln!("{}", out.lines().find(|l| l.contains("case registered ok")).unwrap_or_default());
}

#[test]
fn nvrtc_is_found_in_the_active_virtual_env() {
    let Some(site) = site() else { return skip_or_fail(".nvrtc/ holds no libnvrtc.so.13 (scripts/install-nvrtc.sh installs it)") };
    // A venv's layout, its site-packages' `nvidia` the wheel's.
    let venv = std::env::temp_dir().join(format!("tpar-discovery-venv-{}", std::process::id()));
    let sp = venv.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(&sp).unwrap();
    let link = sp.join("nvidia");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(site.join("nvidia"), &link).unwrap();
    let out = child("virtual_env", &site, &[("VIRTUAL_ENV", &venv)]);
    std::fs::remove_dir_all(&venv).unwrap();
    eprintln!("{}", out.lines().find(|l| l.contains("case virtual_env ok")).unwrap_or_default());
}

#[test]
fn a_libnvrtc_so_on_the_loader_path_is_reported_as_the_one_in_use() {
    let Some(site) = site() else { return skip_or_fail(".nvrtc/ holds no libnvrtc.so.13 (scripts/install-nvrtc.sh installs it)") };
    // Another NVRTC file (the wheel's alternative build), named as a toolkit names its own.
    let dir = std::env::temp_dir().join(format!("tpar-discovery-shadow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(site.join("nvidia/cu13/lib/libnvrtc.alt.so.13"), dir.join("libnvrtc.so.13.9")).unwrap();
    let link = dir.join("libnvrtc.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libnvrtc.so.13.9", &link).unwrap();
    let out = child("shadowed", &site, &[("LD_LIBRARY_PATH", &dir)]);
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!("{}", out.lines().find(|l| l.contains("case shadowed ok")).unwrap_or_default());
}

#[test]
fn without_an_environment_the_error_says_where_it_looked() {
    // No setting, no registered directory, no venv: NVRTC only by name, which this machine
    // may or may not have; where it has none, the error names what was searched.
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--ignored", "--exact", "child_absent", "--nocapture"])
        .env(CASE, "absent")
        .env_remove("TPAR_NVRTC_LIB")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("absent case ran"), "{err}");
}

#[test]
#[ignore = "a child process of the discovery tests"]
fn child_absent() {
    assert_eq!(std::env::var(CASE).as_deref(), Ok("absent"), "started by without_an_environment_the_error_says_where_it_looked");
    match nvrtc::probe() {
        Ok(_) => {
            let f = nvrtc::found().unwrap();
            assert_eq!(f.origin, Origin::System, "{f:?}");
            eprintln!("absent case ran: the system has NVRTC by name: {}", f.path);
        }
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains("TPAR_NVRTC_LIB") && s.contains("no VIRTUAL_ENV or CONDA_PREFIX") && s.contains("nvidia-cuda-nvrtc"), "{s}");
            eprintln!("absent case ran: {s}");
        }
    }
}
