//! Launching rank processes, as torchrun or mpirun would: `tpar bench --ranks N` re-executes
//! itself N times with `TPAR_RANK`, `TPAR_WORLD_SIZE`, `TPAR_RDZV` and `TPAR_JOB_ID` set,
//! waits for all of them, stops the rest when one fails, and removes any shared memory a
//! crashed rank left behind.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether this process is a rank (launched by us or by an outside launcher).
pub fn is_rank() -> bool {
    std::env::var_os("TPAR_RANK").is_some()
}

/// A private directory for the rendezvous socket, removed on drop.
pub struct RdzvDir(pub PathBuf);

impl RdzvDir {
    pub fn new() -> Result<RdzvDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("tpar-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(RdzvDir(dir))
    }
    pub fn socket(&self) -> PathBuf {
        self.0.join("rdzv.sock")
    }
}

impl Drop for RdzvDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs this executable as `world` ranks with the current arguments; returns Ok if every
/// rank exited successfully.
pub fn launch(world: usize, grace: Duration) -> Result<(), String> {
    if !(2..=tpar::workspace::MAX_WORLD).contains(&world) {
        return Err(format!(
            "--ranks {world}: tpar runs 2..={} ranks on one host",
            tpar::workspace::MAX_WORLD
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding my own executable: {e}"))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = RdzvDir::new()?;
    let job: u64 = rand::random();
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(world);
    for r in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("TPAR_RANK", r.to_string())
            .env("TPAR_WORLD_SIZE", world.to_string())
            .env("TPAR_RDZV", format!("unix:{}", dir.socket().display()))
            .env("TPAR_JOB_ID", format!("{job:016x}"))
            .stdin(Stdio::null());
        if r != 0 {
            cmd.stdout(Stdio::null());
        }
        match cmd.spawn() {
            Ok(c) => children.push((r, c)),
            Err(e) => {
                for (_, c) in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("starting rank {r}: {e}"));
            }
        }
    }
    let mut failed: Vec<String> = vec![];
    let mut first_failure: Option<Instant> = None;
    let mut live = world;
    while live > 0 {
        for (r, c) in children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                if !status.success() && !failed.iter().any(|f| f.starts_with(&format!("rank {r} "))) {
                    failed.push(format!("rank {r} exited with {status}"));
                    first_failure.get_or_insert_with(Instant::now);
                }
            }
        }
        live = children.iter_mut().filter_map(|(_, c)| c.try_wait().ok()).filter(|s| s.is_none()).count();
        if let Some(t) = first_failure {
            if live > 0 && t.elapsed() > grace {
                for (r, c) in children.iter_mut() {
                    if matches!(c.try_wait(), Ok(None)) {
                        let _ = c.kill();
                        failed.push(format!("rank {r} killed after a peer failed"));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
    // A rank killed between creating and unlinking the workspace leaves its name behind.
    for name in tpar::transport::shm::leftover_segments(&format!("{job:016x}")) {
        let _ = nix::sys::mman::shm_unlink(format!("/{name}").as_str());
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
