//! The all-reduce algorithms, one file each. Each file holds its CPU execution over the
//! protocol verbs (where the CPU backend runs it) and the communication schedule the
//! simulator replays; the CUDA kernel is `kernels/<name>.cu`, launched by `cuda/`. What each
//! algorithm is and where it runs is [`registry`]'s table; the schedule vocabulary is
//! [`schedule`]'s (the simulator implements it).
//!
//! Contract: an algorithm reads and writes the workspace only through `protocol` verbs, so
//! the buffer-reuse argument written there holds for every algorithm.

use crate::dtype::{pack_acc, unpack_into, Element};
use crate::error::{Error, Result};
use crate::protocol::{Desc, Wait, Word};
use crate::workspace::{Workspace, MAX_WORLD};

pub use crate::kinds::{Algorithm, Transport};

pub mod registry;
pub mod schedule;

pub(crate) mod gather_bcast;
pub(crate) mod hierarchical;
pub(crate) mod nccl;
pub(crate) mod oneshot_pull;
pub(crate) mod oneshot_push;
pub(crate) mod staged_push;
pub(crate) mod twoshot_pull;
pub(crate) mod twoshot_push;

/// One chunk of one call, as an algorithm sees it: the workspace, who I am, what every rank
/// agreed to do, and the bounded waiter every spin goes through.
pub(crate) struct Call<'a, 'w, W, S> {
    pub ws: &'a Workspace<'w, W>,
    pub rank: usize,
    pub desc: Desc,
    pub waiter: &'a mut S,
}

impl<W: Word, S: Wait> Call<'_, '_, W, S> {
    pub fn world(&self) -> usize {
        self.ws.layout.world
    }
    /// Which of the two buffers of a parity-buffered region this call uses.
    pub fn parity(&self) -> usize {
        (self.desc.epoch & 1) as usize
    }
}

/// Runs one chunk of `algo` on the CPU backend: `packed` is this rank's input packed into
/// words (at most `layout.cap`), `out` receives the reduced elements.
pub(crate) fn run_chunk<W: Word, S: Wait, T: Element>(
    algo: Algorithm,
    call: &mut Call<'_, '_, W, S>,
    packed: &[u64],
    out: &mut [T],
) -> Result<()> {
    // The registry is the gate: what it says the CPU backend runs, this runs; the rest is
    // refused with the registry's reason.
    registry::runnable(algo, crate::Backend::Cpu, crate::Transport::Shm)
        .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
    match algo {
        Algorithm::OneshotPush => oneshot_push::run(call, packed, out),
        Algorithm::OneshotPull => oneshot_pull::run(call, packed, out),
        Algorithm::TwoshotPush => twoshot_push::run(call, packed, out),
        Algorithm::TwoshotPull => twoshot_pull::run(call, packed, out),
        Algorithm::GatherBcast => gather_bcast::run(call, packed, out),
        Algorithm::StagedPush | Algorithm::Hierarchical | Algorithm::Nccl => Err(Error::Unsupported {
            what: format!("{algo} on the CPU shared-memory backend"),
            reason: "the registry lists a CPU body this dispatch lacks".into(),
        }),
    }
}

/// Writes the lanes of reduced word `i` into `out`.
#[inline(always)]
pub(crate) fn write_word<T: Element>(out: &mut [T], i: usize, acc: &[f32; 4]) {
    let a = i * T::LANES;
    let b = (a + T::LANES).min(out.len());
    if a < b {
        unpack_into(pack_acc::<T>(acc), &mut out[a..b]);
    }
}

/// Copies word `w` (already reduced and packed) into `out` at word `i`.
#[inline(always)]
pub(crate) fn copy_word<T: Element>(out: &mut [T], i: usize, w: u64) {
    let a = i * T::LANES;
    let b = (a + T::LANES).min(out.len());
    if a < b {
        unpack_into(w, &mut out[a..b]);
    }
}

/// The pull algorithms' prologue: publish my packed input in my `exposed` region, then meet
/// every rank at barrier 0, after which every rank's exposed input may be read.
pub(crate) fn expose_and_meet<W: Word, S: Wait>(c: &mut Call<'_, '_, W, S>, packed: &[u64]) -> Result<()> {
    for (slot, w) in c.ws.exposed(c.rank).iter().zip(packed) {
        slot.store_relaxed(*w);
    }
    crate::protocol::barrier(c.ws, c.rank, &c.desc, 0, c.waiter)
}

/// A fixed array of per-peer slices, so hot loops index instead of recomputing offsets.
pub(crate) fn per_peer<'w, W>(world: usize, f: impl Fn(usize) -> &'w [W]) -> [&'w [W]; MAX_WORLD] {
    let mut a: [&'w [W]; MAX_WORLD] = [&[]; MAX_WORLD];
    for (s, slot) in a.iter_mut().enumerate().take(world) {
        *slot = f(s);
    }
    a
}

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
