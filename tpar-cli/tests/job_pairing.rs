//! Two jobs on one rendezvous path never pair up, even with the default job id: a rank of a
//! second job (started by another launcher) is refused by the first job's rank 0, and the
//! first job still forms with its own ranks.

use std::process::{Command, Stdio};

#[test]
fn a_second_job_on_the_same_path_is_refused_not_paired() {
    let dir = std::env::temp_dir().join(format!("tpar-test-pairing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("rdzv.sock");
    let go = dir.join("go");
    let exe = env!("CARGO_BIN_EXE_tpar");
    // A generous bound on every wait: the steps below follow events, not sleeps, so the
    // timeout only ends a run that went wrong (job B's rank would otherwise pair and hang).
    let rank = |r: usize| {
        format!("TPAR_RANK={r} TPAR_WORLD_SIZE=2 TPAR_RDZV=unix:{} TPAR_TIMEOUT_MS=60000 {exe} bench --backend cpu -b 64 -e 64 -n 5 -w 1", sock.display())
    };
    // Job A: one launcher (this shell) starts rank 0, and rank 1 only once the test says go,
    // which it does after job B's rank was refused: job A's rank 0 is still missing its
    // rank 1 then, whatever the machine's load.
    let job_a = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "env -u TPAR_JOB_ID {} & while [ ! -e {} ]; do sleep 0.05; done; env -u TPAR_JOB_ID {} >/dev/null; a=$?; wait %1; b=$?; exit $((a + b))",
            rank(0),
            go.display(),
            rank(1)
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Job B, another launcher: its rank 1 connects as soon as job A's rank 0 listens.
    let job_b = Command::new("sh").arg("-c").arg(format!("env -u TPAR_JOB_ID {}; exit $?", rank(1))).output().unwrap();
    std::fs::write(&go, b"").unwrap();
    let a = job_a.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let b_err = String::from_utf8_lossy(&job_b.stderr);
    assert!(!job_b.status.success(), "job B's rank must be refused, not join job A:\n{b_err}");
    assert!(b_err.contains("job_id") && b_err.contains("refused by rank 0"), "the refusal names the field: {b_err}");
    let a_out = String::from_utf8_lossy(&a.stdout);
    assert!(a.status.success(), "job A still forms with its own rank 1:\nstdout:\n{a_out}\nstderr:\n{}", String::from_utf8_lossy(&a.stderr));
    assert!(a_out.contains("#wrong"), "job A ran its bench:\n{a_out}");
}
