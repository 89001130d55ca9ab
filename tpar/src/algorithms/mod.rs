//! The all-reduce algorithms, one file each. Each file holds its CPU execution over the
//! protocol verbs (where the CPU backend runs it) and the communication schedule the
//! simulator replays; the CUDA kernel is `kernels/<name>.cu`, launched by `cuda/`.
//!
//! Contract: an algorithm reads and writes the workspace only through `protocol` verbs, so
//! the buffer-reuse argument written there holds for every algorithm.

use crate::dtype::{pack_acc, unpack_into, Element};
use crate::error::{Error, Result};
use crate::protocol::{Desc, Wait, Word};
use crate::workspace::{Workspace, MAX_WORLD};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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
    match algo {
        Algorithm::OneshotPush => oneshot_push::run(call, packed, out),
        Algorithm::OneshotPull => oneshot_pull::run(call, packed, out),
        Algorithm::TwoshotPush => twoshot_push::run(call, packed, out),
        Algorithm::TwoshotPull => twoshot_pull::run(call, packed, out),
        Algorithm::GatherBcast => gather_bcast::run(call, packed, out),
        Algorithm::StagedPush | Algorithm::Hierarchical | Algorithm::Nccl => Err(Error::Unsupported {
            what: format!("{algo} on the CPU shared-memory backend"),
            reason: "it is a GPU-fabric algorithm; CPU ranks run oneshot-push, oneshot-pull, twoshot-push, twoshot-pull or gather-bcast".into(),
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

/// An all-reduce algorithm. Names are kebab-case on the command line and in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Write my input into every peer's inbox (sentinel protocol), poll locally, reduce.
    OneshotPush,
    /// Barrier, read every peer's exposed input, reduce, barrier.
    OneshotPull,
    /// Reduce-scatter by writes, then all-gather by writes (sentinel protocol).
    TwoshotPush,
    /// Reduce-scatter by reads, then all-gather by reads (barrier protocol).
    TwoshotPull,
    /// One outbound and one inbound flow per rank per step (PCIe fabrics).
    StagedPush,
    /// Reduce inside each island, exchange across islands.
    Hierarchical,
    /// Baseline: rank 0 gathers, reduces and broadcasts. For comparison only.
    GatherBcast,
    /// NCCL's all-reduce.
    Nccl,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::OneshotPush,
        Algorithm::OneshotPull,
        Algorithm::TwoshotPush,
        Algorithm::TwoshotPull,
        Algorithm::StagedPush,
        Algorithm::Hierarchical,
        Algorithm::GatherBcast,
        Algorithm::Nccl,
    ];

    /// Algorithms the CPU shared-memory backend runs.
    pub const CPU: [Algorithm; 5] = [
        Algorithm::OneshotPush,
        Algorithm::OneshotPull,
        Algorithm::TwoshotPush,
        Algorithm::TwoshotPull,
        Algorithm::GatherBcast,
    ];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneshotPush => "oneshot-push",
            Algorithm::OneshotPull => "oneshot-pull",
            Algorithm::TwoshotPush => "twoshot-push",
            Algorithm::TwoshotPull => "twoshot-pull",
            Algorithm::StagedPush => "staged-push",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::GatherBcast => "gather-bcast",
            Algorithm::Nccl => "nccl",
        }
    }

    /// Small integer for on-the-wire descriptors (never 0).
    pub fn code(self) -> u64 {
        match self {
            Algorithm::OneshotPush => 1,
            Algorithm::OneshotPull => 2,
            Algorithm::TwoshotPush => 3,
            Algorithm::TwoshotPull => 4,
            Algorithm::StagedPush => 5,
            Algorithm::Hierarchical => 6,
            Algorithm::GatherBcast => 7,
            Algorithm::Nccl => 8,
        }
    }

    /// Inverse of [`Algorithm::code`].
    pub fn from_code(c: u64) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.code() == c)
    }

    /// Whether the algorithm reads peer memory (needs P2P reads / a barrier protocol).
    pub fn reads_remote(self) -> bool {
        matches!(self, Algorithm::OneshotPull | Algorithm::TwoshotPull | Algorithm::GatherBcast)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                Error::invalid("algorithm", format!("unknown algorithm {s:?}; expected one of {}", names.join(", ")))
            })
    }
}

/// Where bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// CUDA IPC-mapped peer device memory.
    P2p,
    /// Pinned shared host memory mapped into every GPU.
    Host,
    /// POSIX shared memory between CPU rank processes.
    Shm,
    /// NCCL.
    Nccl,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 4] = [Transport::P2p, Transport::Host, Transport::Shm, Transport::Nccl];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Transport::P2p => "p2p",
            Transport::Host => "host",
            Transport::Shm => "shm",
            Transport::Nccl => "nccl",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        Transport::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::invalid("transport", format!("unknown transport {s:?}; expected p2p, host, shm or nccl")))
    }
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
