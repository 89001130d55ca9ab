//! The exit statuses, one meaning each, for every subcommand (the top-level help's footer
//! says them; `tpar-cli/tests/first_hour.rs` pins them):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | the command did what was asked |
//! | 1 | it ran and failed: a wrong result, a rank that failed or died, a file it could not read or write |
//! | 2 | it was refused before anything ran: bad usage (clap's own errors), a flag's value out of its range, a malformed `TPAR_*` variable or one this machine cannot honour |
//!
//! Errors travel as `String`s through the commands; a refusal is marked where it is made
//! ([`refuse`]), so that `main` can tell the two failures apart without every function
//! between carrying a second error type.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// The footer of `tpar --help`.
pub const FOOTER: &str = "Exit status: 0 done; 1 the run failed (wrong results, a rank failed, a file could not be read or written); \
2 refused before anything ran (bad usage, a flag's value out of range, a malformed TPAR_* variable or one this machine cannot honour).";

static REFUSED: AtomicBool = AtomicBool::new(false);

/// Marks this process's error as a refusal (exit status 2) and returns its message.
pub fn refuse(message: impl Into<String>) -> String {
    REFUSED.store(true, Ordering::Relaxed);
    message.into()
}

/// The status for a command that returned an error.
pub fn failure() -> ExitCode {
    if REFUSED.load(Ordering::Relaxed) {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

/// Runs a check of the command line or the settings: its error is a refusal.
pub fn refusing<T>(check: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    check().map_err(refuse)
}
