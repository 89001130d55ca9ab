//! The CPU backend across real OS processes, through the `tpar` binary: the launcher, the
//! bench table and JSON, the check sweep, and a rank killed mid-sequence.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tpar() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tpar"))
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpar-cli-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn shm_entries(tag: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tpar-") && n.contains(tag))
        .collect()
}

#[test]
fn bench_prints_nccl_tests_tables_and_json_with_no_wrong_results() {
    let dir = tmpdir("bench");
    let json = dir.join("out.json");
    let svg = dir.join("out.svg");
    let out = tpar()
        .args(["bench", "--ranks", "3", "-b", "8", "-e", "64K", "-f", "16", "-n", "5", "-w", "1", "-d", "all", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    for col in ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"] {
        assert!(stdout.contains(col), "missing column {col}");
    }
    assert!(stdout.contains("gather-bcast (baseline)"));
    let recs: Vec<tpar::report::Record> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // 5 algorithms x 3 dtypes x sizes 8, 128, 2048, 32768.
    assert_eq!(recs.len(), 5 * 3 * 4);
    for r in &recs {
        assert_eq!(r.wrong, 0, "{r:?}");
        assert_eq!(r.world, 3);
        assert!(r.time_us > 0.0 && r.p10_us <= r.time_us && r.time_us <= r.p90_us, "{r:?}");
        assert_eq!(r.bytes, r.count * r.dtype.size());
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("oneshot-push") && plot.contains("<polyline"), "{}", &plot[..200.min(plot.len())]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_passes_across_processes() {
    let out = tpar().args(["check", "--ranks", "3", "--calls", "300"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("PASS") && stdout.contains("0 wrong elements"), "{stdout}");
}

#[test]
fn all_gather_and_reduce_scatter_check_and_bench_as_nccl_tests_size_them() {
    for c in ["all-gather", "reduce_scatter_perf"] {
        let out = tpar()
            .args([
                "check",
                "--ranks",
                "3",
                "--collective",
                c,
                "-e",
                "96K",
                "--calls",
                "150",
                "-d",
                "all",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("PASS: 3 ranks"),
            "{c}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("oneshot-push") && !stdout.contains("twoshot"),
            "only what computes the collective runs: {stdout}"
        );
    }
    let dir = tmpdir("agbench");
    let json = dir.join("ag.json");
    let out = tpar()
        .args([
            "bench",
            "--ranks",
            "4",
            "--collective",
            "all_gather_perf",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "3",
            "-w",
            "1",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all_gather_perf format"), "{stdout}");
    // nccl-tests' row: the size is the output (4 KiB = 1024 floats, 256 per rank), redop none.
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().take(4).collect::<Vec<_>>()
                == ["4096", "1024", "float", "none"]),
        "{stdout}"
    );
    let recs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &recs.as_array().unwrap()[0];
    assert_eq!(r["collective"], "all-gather");
    let (alg, bus) = (r["algbw"].as_f64().unwrap(), r["busbw"].as_f64().unwrap());
    assert!(
        (bus - alg * 3.0 / 4.0).abs() < 1e-9,
        "busbw = algbw x (n-1)/n: {r}"
    );
    // The all-reduce-only algorithms are refused by name.
    let out = tpar()
        .args([
            "check",
            "--ranks",
            "2",
            "--collective",
            "reduce-scatter",
            "--algo",
            "twoshot-push",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("all-reduce only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_rank_killed_mid_sequence_fails_every_other_rank_within_the_timeout() {
    let dir = tmpdir("kill");
    let sock = dir.join("rdzv.sock");
    let job = format!("{:016x}", 0x7e57_0000_0000_0000u64 | std::process::id() as u64);
    let world = 4;
    let timeout_ms = 6000;
    let mut ranks: Vec<_> = (0..world)
        .map(|r| {
            tpar()
                .args(["check", "--calls", "100000000", "-d", "float", "--quiet"])
                .env("TPAR_RANK", r.to_string())
                .env("TPAR_WORLD_SIZE", world.to_string())
                .env("TPAR_RDZV", format!("unix:{}", sock.display()))
                .env("TPAR_JOB_ID", &job)
                .env("TPAR_TIMEOUT_MS", timeout_ms.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    for c in ranks.iter_mut() {
        assert!(c.try_wait().unwrap().is_none(), "all ranks must still be running the sequence");
    }
    ranks[2].kill().unwrap(); // SIGKILL: no destructor, no goodbye
    let killed_at = Instant::now();
    let mut stderrs = vec![];
    for (r, c) in ranks.iter_mut().enumerate() {
        if r == 2 {
            let _ = c.wait();
            continue;
        }
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(!status.success(), "rank {r} must report the failure");
                break;
            }
            assert!(
                killed_at.elapsed() < Duration::from_millis(timeout_ms + 4000),
                "rank {r} still running {:?} after the kill",
                killed_at.elapsed()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut s = String::new();
        use std::io::Read;
        c.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        stderrs.push(s);
    }
    let took = killed_at.elapsed();
    assert!(took < Duration::from_millis(timeout_ms), "survivors took {took:?}");
    assert!(
        stderrs.iter().any(|s| s.contains("peer rank 2 died")),
        "someone names the dead rank: {stderrs:?}"
    );
    for s in &stderrs {
        assert!(s.contains("died") || s.contains("aborted"), "{s}");
    }
    assert!(shm_entries(&job).is_empty(), "stale shared memory: {:?}", shm_entries(&job));
    assert!(!sock.exists(), "stale rendezvous socket");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn launcher_and_environment_errors_are_clear() {
    let out = tpar().args(["bench", "--ranks", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 to 16"));
    let out = tpar()
        .args(["bench"])
        .env("TPAR_RANK", "0")
        .env("TPAR_WORLD_SIZE", "2")
        .env("TPAR_RDZV", "tcp:10.0.0.1:29500")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("TPAR_RDZV") && err.contains("unix:"), "{err}");
    let out = tpar().args(["bench", "-d", "int8"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"int8\""));
    let out = tpar().args(["bench", "--algo", "ring"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("oneshot-push"), "lists the valid names");
}

#[test]
fn tune_writes_a_profile_that_plan_uses_and_a_mismatch_is_reported() {
    let dir = tmpdir("tune");
    let prof = dir.join("profile.toml");
    let out = tpar()
        .args(["tune", "--ranks", "2", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-w", "1", "-d", "float", "-o"])
        .arg(&prof)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("bit-exact"), "{stdout}");
    let text = std::fs::read_to_string(&prof).unwrap();
    assert!(text.contains("[fingerprint]") && text.contains("backend = \"cpu\"") && text.contains("world = 2"), "{text}");
    let plan = |world: &str| {
        let o = tpar()
            .args(["plan", "--backend", "cpu", "--world", world, "-b", "4K", "-d", "float", "--json", "--profile"])
            .arg(&prof)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["reason"].as_str().unwrap().to_string()
    };
    assert!(plan("2").starts_with("profile:"), "{}", plan("2"));
    assert!(plan("3").contains("profile ignored: tuned for world 2"), "{}", plan("3"));
    let _ = std::fs::remove_dir_all(dir);
}
