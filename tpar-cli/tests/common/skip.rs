//! The one way a test says it cannot run (the same file in tpar/tests/common and
//! tpar-cli/tests/common; `skip_log.rs` in tpar-cli checks both and the contract).

/// Says that `test` did not run (or ran only in part) and why: `SKIPPED <test>: <reason>`
/// on stderr, and where `TPAR_SKIP_LOG` names a file, the line `<test>: <reason>` appended
/// to it in one write (so lines of tests running side by side never interleave), for the
/// suite's summary of what was skipped.
pub fn skip(test: &str, reason: &str) {
    let reason = reason.replace('\n', " ");
    // To the stderr handle itself: libtest captures eprint! of passing tests, and a skip
    // must show in the run's output as well as in the summary.
    {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
    }
    if let Some(path) = std::env::var_os("TPAR_SKIP_LOG") {
        use std::io::Write;
        let line = format!("{test}: {reason}\n");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("TPAR_SKIP_LOG {}: {e}", path.to_string_lossy()));
        let n = f.write(line.as_bytes()).unwrap_or_else(|e| panic!("TPAR_SKIP_LOG {}: {e}", path.to_string_lossy()));
        assert_eq!(n, line.len(), "TPAR_SKIP_LOG {}: a short write", path.to_string_lossy());
    }
}
