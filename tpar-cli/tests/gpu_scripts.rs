//! The batched GPU scripts must fail when a step fails: the lead reads their exit status
//! after a device call. Run here against a stand-in `./tpar` (a shell script), so the
//! scripts' own logic is tested without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `scripts/NAME` in a fresh directory whose `./tpar` is `fake` (a shell body).
fn run_with_fake(tag: &str, script: &str, fake: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("tpar-script-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("tpar");
    std::fs::write(&bin, format!("#!/bin/sh\n{fake}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("bash").arg(repo().join("scripts").join(script)).current_dir(&dir).env("OUT", &dir).output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    if let Ok(md) = std::fs::read_to_string(dir.join("check-cost.md")) {
        text.push_str("\n--- check-cost.md\n");
        text.push_str(&md);
    }
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn sentinel_check_exits_non_zero_when_a_step_fails() {
    let (rc, out) = run_with_fake("ok", "sentinel-check.sh", r#"echo "PASS: 8 ranks, 0 wrong elements"; exit 0"#);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("sentinel-check: PASS"), "{out}");

    let fails_ipc = r#"case "$*" in *"selftest ipc"*) echo "ipc broke"; exit 3;; esac; echo "0 wrong"; exit 0"#;
    let (rc, out) = run_with_fake("step", "sentinel-check.sh", fails_ipc);
    assert_eq!(rc, 1, "a failed step must fail the script: {out}");
    assert!(out.contains("FAIL rc=3: tpar selftest ipc") && out.contains("sentinel-check: FAIL"), "{out}");

    // Exit 0 but wrong elements in the log.
    let (rc, out) = run_with_fake("wrong", "sentinel-check.sh", r##"echo "# graph test: 122 calls x 20 replays, 7 wrong, 0.5 s"; exit 0"##);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("the log reports wrong elements"), "{out}");
}

#[test]
fn check_cost_tabulates_the_phases_and_fails_on_a_failed_step() {
    let ok = r##"echo "#  host time per checked call (3300 calls): inputs 0.1 ms, upload + poison 0.2 ms, all-reduce + sync 0.3 ms, download 0.1 ms, judge 0.5 ms"; echo "PASS: 8 ranks, 3300 calls per rank, 0 wrong elements"; exit 0"##;
    let (rc, out) = run_with_fake("cost-ok", "gpu-check-cost.sh", ok);
    assert_eq!(rc, 0, "{out}");
    assert_eq!(out.matches("judge 0.5 ms | PASS: 8 ranks").count(), 6, "three steps, table printed and kept: {out}");

    let bad = r#"case "$*" in *256K*) echo "FAIL: 8 ranks, 1 wrong elements"; exit 1;; esac; echo "PASS: 8 ranks"; exit 0"#;
    let (rc, out) = run_with_fake("cost-bad", "gpu-check-cost.sh", bad);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("FAIL: -e 256K: rc=1") && out.contains("| not printed | FAIL: 8 ranks, 1 wrong elements |"), "{out}");
}
