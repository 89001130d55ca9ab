//! The all-reduce algorithms, one file each. Each file holds its CPU execution over the
//! protocol verbs (where the CPU backend runs it) and the communication schedule the
//! simulator replays; the CUDA kernel is `kernels/<name>.cu`, launched by `cuda/`. What each
//! algorithm is and where it runs is [`registry`]'s table; the schedule vocabulary is
//! [`schedule`]'s (the simulator implements it).
//!
//! Contract: an algorithm reads and writes the workspace only through `protocol` verbs, so
//! the buffer-reuse argument written there holds for every algorithm.


pub use crate::kinds::{Algorithm, Transport};

pub(crate) mod call;
pub(crate) mod cpu;
pub mod registry;
pub mod schedule;

pub mod ce_ring;
pub mod ce_wire;
pub(crate) mod gather_bcast;
pub mod hierarchical;
pub(crate) mod nccl;
pub(crate) mod oneshot_pull;
pub(crate) mod oneshot_push;
pub(crate) mod staged_push;
pub(crate) mod twoshot_pull;
pub(crate) mod twoshot_push;

pub(crate) use call::Call;
pub(crate) use cpu::{run_chunk, run_gather_scatter};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().ok(), Some(a));
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
            let j = serde_json::to_string(&a).unwrap_or_default();
            assert_eq!(j, format!("\"{}\"", a.name()));
        }
        for t in Transport::ALL {
            assert_eq!(t.name().parse::<Transport>().ok(), Some(t));
        }
        assert!("oneshot".parse::<Algorithm>().is_err());
    }
}

#[cfg(test)]
mod loom_tests;
