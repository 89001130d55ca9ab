//! The launch settings read from the environment, each parsed in one place: `TPAR_BLOCKS`,
//! `TPAR_PDL`, `TPAR_LEAN`, `TPAR_TIMEOUT_MS`, and the two test-only guards that remove the
//! buffer-reuse protection (`TPAR_TEST_UNSAFE_*`). A malformed value is an
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument) that names the variable and what it takes, never ignored.
//! (`TPAR_HOST_PROTOCOL` is a plan override: `plan::overrides`.)

use super::abi::MAX_BLOCKS;
use crate::error::{Error, Result};
use std::time::Duration;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn config(var: &'static str, raw: &str, expected: String) -> Error {
    Error::invalid(var, format!("{raw:?}: expected {expected}"))
}

/// `TPAR_BLOCKS`: `auto` (or unset) or 1..=[`MAX_BLOCKS`].
pub fn blocks_from_env() -> Result<Option<u32>> {
    parse_blocks(env("TPAR_BLOCKS"))
}

fn parse_blocks(raw: Option<String>) -> Result<Option<u32>> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match raw.parse::<u32>() {
        Ok(b) if (1..=MAX_BLOCKS as u32).contains(&b) => Ok(Some(b)),
        _ => Err(config("TPAR_BLOCKS", &raw, format!("auto or 1..={MAX_BLOCKS}"))),
    }
}

/// `TPAR_PDL`: programmatic dependent launch, on (`1`, default) or off (`0`).
pub fn pdl_from_env() -> Result<bool> {
    parse_pdl(env("TPAR_PDL"))
}

fn parse_pdl(raw: Option<String>) -> Result<bool> {
    match raw.as_deref() {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(raw) => Err(config("TPAR_PDL", raw, "0 or 1".into())),
    }
}

/// `TPAR_TIMEOUT_MS`: the bound on every wait, if set.
pub fn timeout_from_env() -> Result<Option<Duration>> {
    parse_timeout(env("TPAR_TIMEOUT_MS"))
}

fn parse_timeout(raw: Option<String>) -> Result<Option<Duration>> {
    let Some(raw) = raw else { return Ok(None) };
    match raw.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(config("TPAR_TIMEOUT_MS", &raw, "a positive number of milliseconds".into())),
    }
}

/// `TPAR_TEST_UNSAFE_TWO_BUFFERS=1`: compile the kernels with two buffers instead of three —
/// the buffer-reuse guard removed — so that the skewed-rank stress can show it catches the
/// race. Never for real use: calls then corrupt or time out under skew.
pub fn unsafe_two_buffers_for_test() -> bool {
    env("TPAR_TEST_UNSAFE_TWO_BUFFERS").as_deref() == Some("1")
}

/// `TPAR_TEST_UNSAFE_ONE_BUFFER=1`: compile the kernels with one buffer — for the flag
/// protocol, whose reuse two buffers already guard (docs/cuda.md): a writer's next call then
/// overwrites a slot its readers may still read, and the skewed-rank graph test (distinct
/// inputs per call) must catch it. Never for real use.
pub fn unsafe_one_buffer_for_test() -> bool {
    env("TPAR_TEST_UNSAFE_ONE_BUFFER").as_deref() == Some("1")
}

/// `TPAR_LEAN`: `auto` (or unset: by size), `1` (the lean variant for every size, where a
/// kernel has one) or `0` (never). For measurements and comparisons.
pub fn lean_from_env() -> Result<Option<bool>> {
    parse_lean(env("TPAR_LEAN"))
}

fn parse_lean(raw: Option<String>) -> Result<Option<bool>> {
    match raw.as_deref() {
        None => Ok(None),
        Some(r) if r.eq_ignore_ascii_case("auto") => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(raw) => Err(config("TPAR_LEAN", raw, "auto, 0 or 1".into())),
    }
}

/// The launch settings, read once per group or workspace.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `TPAR_BLOCKS`, when set.
    pub blocks: Option<u32>,
    /// `TPAR_PDL` (and the device can: sm_90+).
    pub pdl: bool,
    /// `TPAR_LEAN`, when set (the size rule otherwise).
    pub lean: Option<bool>,
}

impl Settings {
    pub fn from_env() -> Result<Self> {
        Ok(Self { blocks: blocks_from_env()?, pdl: pdl_from_env()?, lean: lean_from_env()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_refuse() {
        // The parsers, not the process environment: other tests read TPAR_* concurrently.
        let some = |v: &str| Some(v.to_string());
        assert_eq!(parse_blocks(some("12")).unwrap(), Some(12));
        assert!(parse_blocks(some("33")).is_err());
        assert!(parse_blocks(some("0")).is_err());
        assert_eq!(parse_blocks(some("auto")).unwrap(), None);
        assert_eq!(parse_blocks(None).unwrap(), None);
        assert!(!parse_pdl(some("0")).unwrap());
        assert!(parse_pdl(some("1")).unwrap() && parse_pdl(None).unwrap());
        assert!(parse_pdl(some("yes")).is_err());
        assert_eq!(parse_lean(None).unwrap(), None);
        assert_eq!(parse_lean(some("auto")).unwrap(), None);
        assert_eq!(parse_lean(some("1")).unwrap(), Some(true));
        assert_eq!(parse_lean(some("0")).unwrap(), Some(false));
        assert!(parse_lean(some("yes")).is_err());
        assert_eq!(parse_timeout(some("250")).unwrap(), Some(Duration::from_millis(250)));
        assert!(parse_timeout(some("0")).is_err());
        assert_eq!(parse_timeout(None).unwrap(), None);
    }
}
