//! The skip contract every test crate shares (tests/common/skip.rs): a test that cannot run
//! prints `SKIPPED <test>: <reason>` on stderr and, where `TPAR_SKIP_LOG` names a file,
//! appends `<test>: <reason>` to it, so the suite's summary lists every skip. Checked in a
//! real child process (this test binary, running only the ignored `a_test_that_skips`).

mod common;

use std::path::Path;
use std::process::Command;

/// Run only by `skips_print_and_append_to_the_log`: skips twice.
#[test]
#[ignore = "a child of skips_print_and_append_to_the_log"]
fn a_test_that_skips() {
    common::skip("skip_log::a_test_that_skips", "first reason");
    common::skip("skip_log::a_test_that_skips", "second\nreason");
}

fn child(log: Option<&Path>) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--ignored", "--exact", "a_test_that_skips", "--nocapture", "--test-threads", "1"]);
    c.env_remove("TPAR_SKIP_LOG");
    if let Some(l) = log {
        c.env("TPAR_SKIP_LOG", l);
    }
    let out = c.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn skips_print_and_append_to_the_log() {
    let dir = std::env::temp_dir().join(format!("tpar-skip-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("skips.txt");
    std::fs::write(&log, "earlier: kept\n").unwrap();
    let (ok, err) = child(Some(&log));
    assert!(ok, "{err}");
    assert!(err.contains("SKIPPED skip_log::a_test_that_skips: first reason\n"), "{err}");
    assert!(err.contains("SKIPPED skip_log::a_test_that_skips: second reason\n"), "one line per skip: {err}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "earlier: kept\nskip_log::a_test_that_skips: first reason\nskip_log::a_test_that_skips: second reason\n");
    // Without the variable: stderr only, no file.
    std::fs::remove_file(&log).unwrap();
    let (ok, err) = child(None);
    assert!(ok && err.contains("SKIPPED skip_log::a_test_that_skips: first reason"), "{err}");
    assert!(!log.exists());
    std::fs::remove_dir_all(&dir).ok();
}
