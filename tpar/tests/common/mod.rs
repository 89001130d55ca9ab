//! Helpers for the CPU backend's integration tests: rank groups as threads of one process,
//! each with its own socket connection, shared-memory mapping and liveness lock (the same
//! code path as separate processes; the process-level tests live in the CLI crate).
#![allow(dead_code)]

mod skip;
#[allow(unused_imports)]
pub use skip::skip;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tpar::{CpuCommunicator, Config};

/// A private directory (0700) holding the rendezvous socket, under this test process's own
/// directory, which is removed when the process exits (so the suite leaves nothing in /tmp).
pub fn rdzv_path(tag: &str) -> PathBuf {
    let dir = test_root().join(format!("{tag}-{}", rand_u32()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir.join("rdzv.sock")
}

fn root_path() -> PathBuf {
    std::env::temp_dir().join(format!("tpar-test-{}", std::process::id()))
}

extern "C" fn remove_root() {
    let _ = std::fs::remove_dir_all(root_path());
}

/// `/tmp/tpar-test-PID`, made once; removed at process exit (the test harness exits through
/// `exit`, which runs `atexit` handlers).
fn test_root() -> PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = std::fs::create_dir_all(root_path());
        // SAFETY: registers a plain extern "C" function with no captured state; it only
        // removes a directory this process made.
        unsafe {
            libc::atexit(remove_root);
        }
    });
    root_path()
}

pub fn rand_u32() -> u32 {
    use std::time::SystemTime;
    let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().subsec_nanos();
    t ^ (std::process::id() << 7)
}

pub fn config(rank: usize, world: usize, path: &std::path::Path) -> Config {
    let mut c = Config::new(rank, world, path);
    c.timeout = Duration::from_secs(20);
    c.shm_budget = 16 << 20;
    c
}

/// Runs `f` on `world` rank threads; returns each rank's result in rank order.
pub fn run_group<R: Send + 'static>(
    world: usize,
    tweak: impl Fn(&mut Config) + Send + Sync + 'static,
    f: impl Fn(&mut CpuCommunicator) -> R + Send + Sync + 'static,
) -> Vec<Result<R, tpar::Error>> {
    let path = rdzv_path("g");
    let f = Arc::new(f);
    let tweak = Arc::new(tweak);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (f, tweak, path) = (f.clone(), tweak.clone(), path.clone());
            std::thread::spawn(move || {
                let mut c = config(r, world, &path);
                tweak(&mut c);
                let mut comm = CpuCommunicator::init(&c)?;
                Ok(f(&mut comm))
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect();
    // Every group checks that its own job left nothing in /dev/shm, whatever happened.
    let job = format!("{:016x}", config(0, world, &path).job_id);
    let left = tpar::transport::shm::leftover_segments(&job);
    assert!(left.is_empty(), "shared memory left behind by job {job}: {left:?}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
    out
}
