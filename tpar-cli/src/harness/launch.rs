//! Launching rank processes, as torchrun or mpirun would: `tpar bench --world N` re-executes
//! itself N times with `TPAR_RANK`, `TPAR_WORLD_SIZE`, `TPAR_RDZV` and `TPAR_JOB_ID` set,
//! waits for all of them, stops the rest when one fails, and leaves nothing behind: the
//! rendezvous directory and any shared memory a killed rank left are removed on every exit.
//!
//! Signals: SIGINT or SIGTERM to the launcher is forwarded to every rank (SIGTERM, then
//! SIGKILL after [`STOP_GRACE`]); each rank also asks the kernel for SIGKILL when its
//! launcher dies (`PR_SET_PDEATHSIG`), so a SIGKILLed launcher leaves no orphans. A rank
//! killed by SIGPIPE (`tpar bench | head`) ends the run quietly, as `yes | head` does.
//!
//! A reader leaving is an orderly stop, not a death. Only rank 0 writes to standard output;
//! when its reader goes, rank 0 dies of SIGPIPE and the other ranks, blocked in a call with
//! it, see a dead peer (or a closed socket) and would say so on standard error before the
//! launcher stops them: a race on every `tpar bench | head`. So the other ranks' standard
//! error comes through the launcher ([`Captured`]) and is written out once every rank has
//! exited: in rank order, and not at all when the run ended because its reader left.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the other ranks may take to fail after one did (a dead peer is noticed within
/// the timeout, 30 s by default), before they are killed.
pub const FAIL_GRACE: Duration = Duration::from_secs(60);

/// How long ranks get between SIGTERM and SIGKILL when the run is stopped.
const STOP_GRACE: Duration = Duration::from_millis(300);

/// How long the launcher waits, once every rank has exited, for the last bytes of their
/// standard error (a process a rank forked may hold the pipe open: never wait for it).
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// One rank's standard error so far, and the thread that reads it.
struct RankStderr {
    buf: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

/// Standard error of the ranks other than 0, held until every rank has exited.
#[derive(Default)]
struct Captured {
    /// In rank order.
    ranks: Vec<RankStderr>,
}

impl Captured {
    /// Reads `pipe` to its end on a thread of its own (a rank must never block on a full pipe).
    fn add(&mut self, rank: usize, mut pipe: ChildStderr) -> Result<(), String> {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let reader = std::thread::Builder::new()
            .name(format!("tpar-rank{rank}-stderr"))
            .spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    // A reader that panicked poisons nothing we need: keep what it had.
                    let mut b = sink.lock().unwrap_or_else(|p| p.into_inner());
                    b.extend_from_slice(&chunk[..n]);
                }
            })
            .map_err(|e| format!("starting the reader of rank {rank}'s standard error: {e}"))?;
        self.ranks.push(RankStderr { buf, reader });
        Ok(())
    }

    /// Once every rank has exited: what each wrote, in rank order, to our standard error.
    fn write_out(self) {
        let t = Instant::now();
        let mut err = std::io::stderr().lock();
        for RankStderr { buf, reader } in self.ranks {
            while !reader.is_finished() && t.elapsed() < DRAIN_GRACE {
                std::thread::sleep(Duration::from_millis(2));
            }
            let b = buf.lock().unwrap_or_else(|p| p.into_inner());
            let _ = err.write_all(&b);
        }
        let _ = err.flush();
    }
}

/// Whether this process is a rank (launched by us or by an outside launcher): `TPAR_RANK`
/// is set (a malformed one is reported when the rank joins).
pub fn is_rank() -> bool {
    tpar::settings::is_set("TPAR_RANK")
}

/// The signal that asked the launcher to stop (0: none yet).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set [`STOP`] instead of killing the launcher, so it can stop its
/// ranks and clean up first.
fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_stop` is async-signal-safe (one atomic store); installing a handler
        // has no other precondition.
        unsafe {
            libc::signal(sig, on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// Dies of `sig` as if it had not been caught (shells then report it as usual).
fn die_of(sig: libc::c_int) -> ! {
    // SAFETY: restoring the default disposition and raising a signal at ourselves are
    // plain system calls with no memory preconditions.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
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

/// The ranks of one run; dropping it kills any still running and removes what they left.
struct Ranks {
    children: Vec<(usize, Child)>,
    job: String,
    _dir: RdzvDir,
}

impl Ranks {
    fn signal_all(&mut self, sig: nix::sys::signal::Signal) {
        for (_, c) in self.children.iter_mut() {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
            }
        }
    }

    fn live(&mut self) -> usize {
        self.children.iter_mut().filter_map(|(_, c)| c.try_wait().ok()).filter(Option::is_none).count()
    }

    /// SIGTERM to every rank, SIGKILL to those still there after the grace.
    fn stop(&mut self) {
        self.signal_all(nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while self.live() > 0 && t.elapsed() < STOP_GRACE {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.signal_all(nix::sys::signal::Signal::SIGKILL);
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        if self.live() > 0 {
            self.signal_all(nix::sys::signal::Signal::SIGKILL);
        }
        for (_, c) in self.children.iter_mut() {
            let _ = c.wait();
            // A rank stopped between writing an output's temporary and renaming it.
            crate::harness::output::remove_partial_writes(c.id());
        }
        // A rank killed between creating and unlinking the workspace leaves its name behind.
        tpar::transport::shm::remove_leftovers(&self.job);
    }
}

/// Runs this executable as `world` ranks with the current arguments; returns Ok if every
/// rank exited successfully. `grace`: how long the others may take to fail after one did.
pub fn launch(world: usize, grace: Duration) -> Result<(), String> {
    crate::harness::check_world(world)?;
    let exe = std::env::current_exe().map_err(|e| format!("finding my own executable: {e}"))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = RdzvDir::new()?;
    let socket = dir.socket();
    let job = format!("{:016x}", rand::random::<u64>());
    catch_stop_signals();
    let mut ranks = Ranks { children: Vec::with_capacity(world), job: job.clone(), _dir: dir };
    let mut captured = Captured::default();
    let launcher = std::process::id() as libc::pid_t;
    for r in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("TPAR_RANK", r.to_string())
            .env("TPAR_WORLD_SIZE", world.to_string())
            .env("TPAR_RDZV", format!("unix:{}", socket.display()))
            .env("TPAR_JOB_ID", &job)
            .stdin(Stdio::null());
        if r != 0 {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: prctl and getppid.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before prctl: then nobody would signal us.
                if libc::getppid() != launcher {
                    return Err(std::io::Error::other("the launcher exited"));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("starting rank {r}: {e}"))?;
        let stderr = child.stderr.take();
        ranks.children.push((r, child));
        if let Some(pipe) = stderr {
            captured.add(r, pipe)?;
        }
    }
    let mut failed: Vec<String> = vec![];
    let mut first_failure: Option<Instant> = None;
    let mut broken_pipe = false;
    loop {
        // Whether any rank is still running, read before the statuses below, so that a rank
        // that exits between the two is still judged by the pass below before we leave.
        let running = ranks.live() > 0;
        let sig = STOP.load(Ordering::SeqCst);
        if sig != 0 {
            ranks.stop();
            drop(ranks);
            captured.write_out();
            die_of(sig);
        }
        for (r, c) in ranks.children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                if !status.success() && !failed.iter().any(|f| f.starts_with(&format!("rank {r} "))) {
                    broken_pipe |= status.signal() == Some(libc::SIGPIPE);
                    failed.push(format!("rank {r} exited with {status}"));
                    first_failure.get_or_insert_with(Instant::now);
                }
            }
        }
        if broken_pipe {
            // Whoever reads our output has gone: stop, quietly. What the other ranks said
            // about rank 0's end (a dead peer, a closed socket) is not an error: drop it.
            ranks.signal_all(nix::sys::signal::Signal::SIGKILL);
            drop(ranks);
            drop(captured);
            die_of(libc::SIGPIPE);
        }
        if let Some(t) = first_failure {
            if t.elapsed() > grace {
                for (r, c) in ranks.children.iter_mut() {
                    if matches!(c.try_wait(), Ok(None)) {
                        let _ = c.kill();
                        failed.push(format!("rank {r} killed after a peer failed"));
                    }
                }
            }
        }
        if !running {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ranks);
    captured.write_out();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
