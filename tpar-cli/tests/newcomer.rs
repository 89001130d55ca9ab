//! What a new user hit (issue 10), each through the built binary in real processes: output
//! paths checked before the run, a signalled launcher leaving no rank and no file behind, a
//! closed pipe ending quietly, invalid values refused with the valid range, the one size
//! grammar in every command, the cores warning, and no `\r` progress in logs.

mod common;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tpar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpar"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TPAR_") {
            c.env_remove(k);
        }
    }
    c
}

/// A private TMPDIR for one test, so what the run leaves there can be seen; removed on drop.
struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!("tpar-cli-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tmp(d)
    }
    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = tpar().args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            v.push(p);
        }
    }
    v
}

fn alive(pid: u32) -> bool {
    // A zombie has exited: only its parent's wait is missing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
}

fn job_of(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(b"TPAR_JOB_ID=").map(|j| String::from_utf8_lossy(j).into_owned()))
}

fn shm_of(job: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm").unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("tpar-") && n.contains(job)).collect()
}

#[test]
fn output_paths_are_checked_before_any_rank_starts() {
    let tmp = Tmp::new("paths");
    let missing = tmp.0.join("no/such/folder/out");
    let m = missing.to_str().unwrap();
    for (cmd, flag) in [("bench", "--json"), ("bench", "--csv"), ("bench", "--svg"), ("tune", "-o")] {
        // The run asked for would take hours (10^9 iterations per size): failing within a
        // minute shows the path was checked before it, with a minute of slack for a loaded
        // machine. With TMPDIR here, a started rank would have left its rendezvous folder.
        let t = Instant::now();
        let out = tpar().args([cmd, "--backend", "cpu", "--world", "2", "-n", "1000000000", flag, m]).env("TMPDIR", &tmp.0).output().unwrap();
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd} {flag} to a missing folder must fail: {err}");
        assert!(err.contains(flag) && err.contains("does not exist"), "{err}");
        assert!(took < Duration::from_secs(60), "{cmd} {flag}: failed only after {took:?}");
        assert!(tmp.entries().is_empty(), "{cmd} {flag}: left in TMPDIR: {:?}", tmp.entries());
    }
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--world", "2", "--json", tmp.0.to_str().unwrap()]);
    assert!(!ok && err.contains("is a folder"), "{err}");
    assert!(tmp.entries().is_empty(), "the check leaves nothing: {:?}", tmp.entries());
}

/// Starts a long bench with TMPDIR=`tmp`, waits until all `world` ranks run, and returns
/// the launcher, its ranks and their job id. The caller waits for the launcher.
#[allow(clippy::zombie_processes)]
fn long_bench(tmp: &Tmp, world: usize) -> (std::process::Child, Vec<u32>, String) {
    let launcher = tpar()
        .args(["bench", "--backend", "cpu", "--world", &world.to_string(), "-b", "1K", "-e", "1K", "-n", "100000000", "--algo", "oneshot-push"])
        .env("TMPDIR", &tmp.0)
        .env("TPAR_TIMEOUT_MS", RANK_TIMEOUT_MS.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        let ranks = children_of(launcher.id());
        if ranks.len() == world {
            if let Some(job) = ranks.iter().find_map(|r| job_of(*r)) {
                // Let them get past the rendezvous into the timed loop.
                std::thread::sleep(Duration::from_millis(700));
                return (launcher, ranks, job);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the ranks never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ranks' bound on any wait in the long benches: they run for hours (10^8 iterations),
/// and would notice a vanished peer only through it, so ending within [`GONE_WITHIN`] shows
/// that the launcher's signal (or the kernel's parent-death signal) ended them.
const RANK_TIMEOUT_MS: u64 = 120_000;
/// A sixth of [`RANK_TIMEOUT_MS`]: far below any wait the ranks could run into by
/// themselves, with seconds of slack for a loaded 2-core machine (1 s raced there).
const GONE_WITHIN: Duration = Duration::from_secs(20);

fn assert_gone_soon(mut launcher: std::process::Child, ranks: &[u32], job: &str, tmp: &Tmp, what: &str) {
    let t = Instant::now();
    while (ranks.iter().any(|r| alive(*r)) || launcher.try_wait().unwrap().is_none()) && t.elapsed() < GONE_WITHIN {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left: Vec<u32> = ranks.iter().copied().filter(|r| alive(*r)).collect();
    for r in &left {
        let _ = Command::new("kill").args(["-9", &r.to_string()]).status();
    }
    let _ = launcher.kill();
    let status = launcher.wait().unwrap();
    assert!(left.is_empty(), "{what}: ranks {left:?} still running {:?} later", t.elapsed());
    assert!(!status.success(), "{what}: the launcher must not report success");
    assert!(shm_of(job).is_empty(), "{what}: shared memory left: {:?}", shm_of(job));
    assert!(tmp.entries().is_empty(), "{what}: left in TMPDIR: {:?}", tmp.entries());
}

#[test]
fn sigterm_or_sigint_to_the_launcher_ends_every_rank_and_leaves_nothing() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let tmp = Tmp::new(&format!("sig{sig}"));
        let (launcher, ranks, job) = long_bench(&tmp, 3);
        assert!(!tmp.entries().is_empty(), "the rendezvous directory lives in TMPDIR while running");
        // SAFETY: signalling a child we started.
        assert_eq!(unsafe { libc::kill(launcher.id() as i32, sig) }, 0);
        assert_gone_soon(launcher, &ranks, &job, &tmp, name);
    }
}

#[test]
fn a_sigkilled_launcher_leaves_no_orphan_ranks() {
    let tmp = Tmp::new("sigkill");
    let (mut launcher, ranks, _) = long_bench(&tmp, 2);
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let t = Instant::now();
    while ranks.iter().any(|r| alive(*r)) && t.elapsed() < GONE_WITHIN {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left: Vec<u32> = ranks.iter().copied().filter(|r| alive(*r)).collect();
    for r in &left {
        let _ = Command::new("kill").args(["-9", &r.to_string()]).status();
    }
    assert!(left.is_empty(), "orphaned ranks {left:?} (PR_SET_PDEATHSIG)");
}

#[test]
fn a_normal_run_leaves_nothing_in_tmp() {
    let tmp = Tmp::new("clean");
    let out = tpar()
        .args(["bench", "--backend", "cpu", "--world", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--algo", "oneshot-push"])
        .env("TMPDIR", &tmp.0)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(tmp.entries().is_empty(), "left in TMPDIR: {:?}", tmp.entries());
}

#[test]
fn bench_into_a_closed_pipe_ends_quietly() {
    // A reader leaving is an orderly stop: rank 0 dies of SIGPIPE, and whatever the other
    // ranks say about its end (a dead peer, a closed socket) must not reach the terminal.
    // That was a race, lost in about a third of single runs on a loaded machine: four ranks,
    // three runs, so that the race is lost nearly always where it can be lost at all.
    for run in 0..3 {
        let mut child = tpar()
            .args(["bench", "--backend", "cpu", "--world", "4", "-b", "8", "-e", "64K", "-f", "2", "-n", "3", "-w", "0", "-d", "all"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 64];
        child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
        drop(child.stdout.take()); // as `head` does once it has its lines
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(20), "run {run}: still running after its reader left");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!err.contains("panicked") && !err.contains("error") && !err.contains("died"), "run {run}: not quiet: {err:?}");
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait().unwrap();
        assert!(status.success() || status.signal() == Some(libc::SIGPIPE), "run {run}: {status}");
    }
}

#[test]
fn invalid_values_are_refused_with_the_valid_range() {
    let (ok, _, err) = run(&["bench", "-c", "2"]);
    assert!(!ok && err.contains("expected 0 or 1") && !err.contains("..="), "{err}");
    let (ok, _, err) = run(&["model", "--acceptance", "5"]);
    assert!(!ok && err.contains("1 to 3") && err.contains("--verify-width"), "{err}");
    for w in ["0", "1", "17"] {
        let (ok, _, err) = run(&["plan", "-t", "h200-nvswitch-8", "--world", w, "--bytes", "1K"]);
        assert!(!ok && err.contains("2 to 16"), "--world {w}: {err}");
        let (ok, _, err) = run(&["plan", "--backend", "cpu", "-t", "cpu", "--world", w, "--bytes", "1K"]);
        assert!(!ok && err.contains("2 to 16"), "--world {w}: {err}");
    }
    // More ranks than the preset's GPUs: planned, as docs/plan.md says: NCCL, with the reason.
    let (ok, out, err) = run(&["plan", "-t", "h200-nvswitch-8", "--world", "9", "--bytes", "1K"]);
    assert!(ok && out.contains("algorithm  nccl") && out.contains("world 9 exceeds the 8 GPUs"), "{out}{err}");
    // Sizes below one element, and empty calls, are refused the same way everywhere.
    let (ok, out, err) = run(&["bench", "--backend", "cpu", "--world", "2", "-b", "1", "-e", "1"]);
    assert!(!ok && err.contains("-b 1: smaller than one float element (4 B)") && out.is_empty(), "{out}{err}");
    let (ok, _, err) = run(&["check", "--backend", "cpu", "--world", "2", "-e", "2", "-d", "half,float"]);
    assert!(!ok && err.contains("-e 2: smaller than one float element"), "{err}");
    let (_, _, sim_err) = run(&["sim", "-t", "pcie-2", "--bytes", "0"]);
    for args in [&["plan", "-t", "pcie-2", "--world", "2", "-b", "0"][..], &["bench", "-b", "0"], &["check", "-e", "0"], &["tune", "-e", "0"]] {
        let (ok, _, err) = run(args);
        assert!(!ok && err.contains("bad size \"0\": must be positive"), "{args:?}: {err}");
    }
    assert!(sim_err.contains("bad size \"0\": must be positive"), "sim agrees: {sim_err}");
    // -d names every form it takes.
    let (ok, _, err) = run(&["bench", "-d", "int8"]);
    assert!(!ok && err.contains("\"int8\"") && err.contains("bfloat16") && err.contains("comma list") && err.contains("or all"), "{err}");
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--algo", "all,x"]);
    assert!(!ok && err.contains("stand alone"), "{err}");
    // Lists name only what that backend runs.
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--algo", "staged-push"]);
    assert!(!ok && err.contains("oneshot-push") && !err.contains("nccl") && !err.contains("hierarchical"), "{err}");
    let (ok, _, err) = run(&["check", "--backend", "cpu", "--algo", "ring"]);
    assert!(!ok && err.contains("gather-bcast") && !err.contains("staged-push"), "{err}");
    // No message suggests a flag the command refuses.
    // tune runs emulated ranks as a test of itself (and of its link probe), saying that they
    // measure no fabric; it fails here only for want of a GPU.
    let (ok, _, err) = run(&["tune", "--emulate-ranks", "2", "-o", "/nonexistent-dir/p.toml"]);
    assert!(!ok && err.contains("measure no fabric"), "tune takes --emulate-ranks and says what they measure: {err}");
    assert!(err.contains("tpar: error: -o /nonexistent-dir/p.toml: the folder /nonexistent-dir does not exist"), "{err}");
    let (ok, _, err) = run(&["bench", "--emulate-ranks", "2", "--backend", "cpu"]);
    assert!(!ok && err.contains("use --backend cuda"), "{err}");
    let (ok, _, err) = run(&["tune", "--backend", "cuda"]);
    assert!(!ok && !err.contains("--emulate-ranks"), "{err}");
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--mode", "graph"]);
    assert!(!ok && err.contains("eager calls only"), "{err}");
}

/// `--compare` is refused before any rank or GPU starts, with the way forward: the peer's
/// library and the script that builds it, the ranks it runs on, the peers it knows.
#[test]
fn compare_names_what_is_missing_before_anything_runs() {
    let (ok, _, err) = run(&["bench", "--emulate-ranks", "2", "--compare", "vllm=/nonexistent-dir/libx.so"]);
    assert!(!ok && err.contains("/nonexistent-dir/libx.so") && err.contains("bench/compare/vllm.sh"), "{err}");
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--compare", "vllm"]);
    assert!(!ok && err.contains("--emulate-ranks"), "{err}");
    let (ok, _, err) = run(&["bench", "--emulate-ranks", "2", "--compare", "nccl"]);
    assert!(!ok && err.contains("known peers: vllm"), "{err}");
    let (ok, _, err) = run(&["bench", "--emulate-ranks", "2", "--compare", "b12x"]);
    assert!(!ok && err.contains("peers_multi_gpu.py"), "{err}");
    // The all-gather and the reduce-scatter are compared too (vLLM's kernels for them): the
    // same way forward; only --sequence stays the all-reduce's.
    for c in ["all-gather", "reduce-scatter"] {
        let (ok, _, err) = run(&["bench", "--collective", c, "--emulate-ranks", "2", "--compare", "vllm=/nonexistent-dir/libx.so"]);
        assert!(!ok && err.contains("/nonexistent-dir/libx.so") && err.contains("bench/compare/vllm.sh"), "{err}");
        let (ok, _, err) = run(&["bench", "--collective", c, "--emulate-ranks", "2", "--sequence", "2x1K"]);
        assert!(!ok && err.contains("--sequence times the all-reduce only"), "{err}");
    }
}

#[test]
fn one_size_grammar_in_every_command() {
    let (ok, out, err) = run(&["bench", "--backend", "cpu", "--world", "2", "-b", "1KiB", "-e", "1.5K", "-f", "2", "-n", "1", "-w", "0", "--algo", "oneshot-push"]);
    assert!(ok, "{err}");
    assert!(out.contains("        1024 "), "{out}");
    let (ok, _, err) = run(&["check", "--backend", "cpu", "--world", "2", "-e", "1.5K", "--calls", "5", "-d", "float", "--algo", "oneshot-push"]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["plan", "-t", "pcie-2", "--world", "2", "--bytes", "1.5K"]);
    assert!(ok && out.contains("1.5 KiB"), "{out}{err}");
    let (ok, out, err) = run(&["sim", "-t", "pcie-2", "--bytes", "1KiB,1.5K"]);
    assert!(ok && out.contains("1 KiB") && out.contains("1.5 KiB"), "{out}{err}");
    let (ok, _, err) = run(&["bench", "-b", "3X"]);
    assert!(!ok && err.contains("3X"), "{err}");
}

#[test]
fn more_ranks_than_cores_warns_and_progress_writes_no_carriage_returns() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    if cores + 1 > 16 {
        common::skip("newcomer::more_ranks_than_cores_warns_and_progress_writes_no_carriage_returns", &format!("{cores} cores here, more ranks than cores would exceed tpar's 16"));
        return;
    }
    let world = (cores + 1).to_string();
    let (ok, _, err) = run(&["bench", "--backend", "cpu", "--world", &world, "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--algo", "oneshot-push"]);
    assert!(ok, "{err}");
    assert!(err.contains("warning") && err.contains("cores"), "{err}");
    let tmp = Tmp::new("prog");
    let prof = tmp.0.join("p.toml");
    let out = tpar()
        .args(["tune", "--backend", "cpu", "--world", "2", "-b", "1K", "-e", "2K", "-n", "1", "-w", "0", "-d", "float", "-o"])
        .arg(&prof)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains('\r'), "carriage returns in a log: {err:?}");
    assert!(Path::new(&prof).exists());
}

#[test]
fn ranks_that_fail_at_once_fail_the_run() {
    // Every rank fails within milliseconds of starting (a 1 ms timeout: the rendezvous cannot
    // finish), often all inside one of the launcher's 5 ms sleeps. The launcher once took "no
    // rank still running" for "every rank succeeded" when the last exits happened in that
    // window, and exited 0. (A bad setting no longer reaches the ranks: the launcher refuses
    // it before starting any, see `a_bad_setting_is_refused_once_before_any_rank`.)
    for i in 0..12 {
        let out = tpar().args(["check", "--backend", "cpu", "--world", "3", "-e", "4K"]).env("TPAR_TIMEOUT_MS", "1").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "run {i}: exited 0 although every rank failed:\n{stderr}");
        assert!(stderr.contains("exited with exit status: 1"), "run {i}: the launcher did not name the failed ranks:\n{stderr}");
    }
}

#[test]
fn ctrl_c_keeps_the_rows_already_measured() {
    let out = Tmp::new("ctrlc-out");
    let scratch = Tmp::new("ctrlc-tmp");
    let (json, csv) = (out.0.join("r.json"), out.0.join("r.csv"));
    use std::os::unix::process::CommandExt;
    // Rows of 8 B take a fraction of a second at 20,000 iterations, rows of MiB many seconds:
    // the run is stopped long before its end.
    let mut child = tpar()
        .args(["bench", "--backend", "cpu", "--world", "2", "-b", "8", "-e", "4M", "-f", "2", "-n", "20000", "-w", "0", "--algo", "oneshot-push"])
        .arg("--json")
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .env("TMPDIR", &scratch.0)
        .env("TPAR_TIMEOUT_MS", RANK_TIMEOUT_MS.to_string())
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rows = |p: &Path| std::fs::read_to_string(p).ok().and_then(|s| serde_json::from_str::<Vec<serde_json::Value>>(&s).ok()).map_or(0, |v| v.len());
    let t = Instant::now();
    while rows(&json) < 2 {
        assert!(t.elapsed() < Duration::from_secs(120), "no rows written while measuring");
        assert!(child.try_wait().unwrap().is_none(), "the bench ended before it was stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A terminal's Ctrl-C: SIGINT to the whole process group, the launcher and every rank.
    // SAFETY: signalling the process group of a child we started.
    assert_eq!(unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) }, 0);
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < GONE_WITHIN, "still running {:?} after SIGINT", t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    use std::os::unix::process::ExitStatusExt;
    let status = child.wait().unwrap();
    assert!(status.signal() == Some(libc::SIGINT) || status.code() == Some(130), "{status}");
    let text = std::fs::read_to_string(&json).unwrap();
    let recs: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert!(recs.len() >= 2 && recs.len() < 20, "{} records", recs.len());
    for r in &recs {
        assert_eq!(r["incomplete"], serde_json::Value::Bool(true), "{r}");
        assert!(r["time_us"].as_f64().unwrap() > 0.0 && r["wrong"] == 0, "{r}");
    }
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert!(csv_text.lines().count() >= 3 && csv_text.trim_end().ends_with("these rows are the points measured until then"), "{csv_text}");
    let mut files = out.entries();
    files.sort();
    assert_eq!(files, ["r.csv", "r.json"], "only the outputs, no temporary files");
    assert!(scratch.entries().is_empty(), "left in TMPDIR: {:?}", scratch.entries());
}

#[test]
fn a_bad_setting_is_refused_once_before_any_rank() {
    let out = tpar().args(["check", "--backend", "cpu", "--world", "3", "-e", "4K"]).env("TPAR_ALGO", "bogus").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
    assert_eq!(err.matches("TPAR_ALGO=\"bogus\"").count(), 1, "said once, not once per rank: {err}");
    assert!(err.contains("oneshot-push") && !err.contains("rank 0") && !err.contains("exited with"), "no rank started: {err}");
}

/// A size no workspace holds (`-b 512G -e 1T` ended every rank on a 512 GiB allocation) is
/// refused before any rank starts: exit 1, one line naming the flag and the largest size.
#[test]
fn a_size_beyond_the_workspace_is_refused_before_any_rank() {
    let t = Instant::now();
    let out = tpar().args(["bench", "--backend", "cpu", "--world", "2", "-b", "512G", "-e", "1T", "-n", "1", "-w", "0"]).output().unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "an error exit, not a crash: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("tpar: error: -e 1 TiB") && lines[0].contains("at most 64 GiB"), "{err}");
    assert!(out.stdout.is_empty(), "no rank printed a table: {}", String::from_utf8_lossy(&out.stdout));
    assert!(!err.contains("rank") && !err.contains("memory allocation"), "no rank started: {err}");
    assert!(took < Duration::from_secs(10), "refused before any rank: {took:?}");
    // The largest size it names is taken (refused only later, if at all, not by this check).
    let ok = tpar().args(["bench", "--backend", "cpu", "--world", "2", "-b", "64G", "-e", "64G", "--algo", "nope"]).output().unwrap();
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(!err.contains("larger than tpar bench takes"), "64 GiB is within the bound: {err}");
}
