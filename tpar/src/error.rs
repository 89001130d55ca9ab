//! The crate's one error type. Every variant carries the context a user needs to act:
//! which rank saw it, which peer or field was involved, what was expected.
//!
//! Contract: library code returns these; it never panics, unwraps or exits.

use std::fmt;

/// Result alias used throughout tpar.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tpar.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bounded wait ran out. The communicator is poisoned afterwards.
    #[error("rank {rank}: timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        rank: usize,
        waited_ms: u64,
        /// What was awaited, with whatever the peers' published state says.
        what: String,
    },
    /// A peer process exited (its liveness lock was released) while we waited for it.
    #[error("rank {rank}: peer rank {peer} died during {during}")]
    PeerDied {
        rank: usize,
        peer: usize,
        during: String,
    },
    /// Another rank hit an error and raised the shared abort flag.
    #[error("rank {rank}: aborted because rank {by} failed")]
    Aborted { rank: usize, by: usize },
    /// An earlier call failed; the communicator refuses further work.
    #[error("rank {rank}: communicator is poisoned by an earlier error: {cause}")]
    Poisoned { rank: usize, cause: String },
    /// A rendezvous message or peer failed validation.
    #[error("rank {rank}: rendezvous refused: field `{field}`: expected {expected}, got {got}")]
    Rendezvous {
        rank: usize,
        field: &'static str,
        expected: String,
        got: String,
    },
    /// Ranks disagree about a collective call (count, dtype, algorithm, plan inputs).
    #[error("rank {rank}: rank {peer} disagrees on `{field}`: this rank has {ours}, rank {peer} has {theirs}")]
    Mismatch {
        rank: usize,
        peer: usize,
        field: &'static str,
        ours: String,
        theirs: String,
    },
    /// A caller passed something that cannot work.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// An environment variable or setting is malformed.
    #[error("bad setting {var}={value:?}: {reason}")]
    Config {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// The requested algorithm/transport cannot run correctly here.
    #[error("{what} is not supported here: {reason}")]
    Unsupported { what: String, reason: String },
    /// An operating-system call failed.
    #[error("rank {rank}: {context}: {source}")]
    Io {
        rank: usize,
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A CUDA driver call failed.
    #[error("CUDA: {context}: {code}")]
    Cuda { context: String, code: String },
    /// The first-use tune stopped (`crate::tune`). `agreed`: every rank stopped at the same
    /// exchange with this reason (the communicator itself is fine and keeps the plan's
    /// defaults); otherwise the control plane failed under it.
    #[error("the tune failed: {reason}")]
    Tune { agreed: bool, reason: String },
    /// A required shared library (CUDA driver, NVRTC, NCCL, NVML) is missing or failed.
    #[error("{library}: {reason}")]
    Library { library: &'static str, reason: String },
}

impl Error {
    pub(crate) fn io(rank: usize, context: impl fmt::Display, source: impl Into<std::io::Error>) -> Self {
        Error::Io {
            rank,
            context: context.to_string(),
            source: source.into(),
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl fmt::Display) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.to_string(),
        }
    }

    /// True for errors after which the communicator must not be used again
    /// (a peer may be anywhere in the protocol).
    pub fn poisons(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::PeerDied { .. }
                | Error::Aborted { .. }
                | Error::Mismatch { .. }
                | Error::Poisoned { .. }
        )
    }
}
