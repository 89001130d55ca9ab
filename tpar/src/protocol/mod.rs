//! Protocols: how a reader knows that data has landed, written only in terms of 64-bit words
//! with acquire/release ordering, so the same code runs over shared memory between processes
//! and under the loom model checker.
//!
//! - `flagged copy` (push): a writer copies a slot's data with plain stores
//!   ([`Word::store_plain`]), then stores its call descriptor into its flag in the owner's
//!   block with release; the owner polls *its own* flag until it is not [`EMPTY`]
//!   ([`take_descriptor`]), checks and clears it, and reads the slot in place
//!   ([`Word::view`]). No remote reads, one release per slot.
//! - `barrier`: generation counters stored into each peer's slot and polled locally, compared
//!   modulo 2^32 so they may wrap.
//!
//! Owns: the [`Word`] and [`Wait`] abstractions, call descriptors, and the verbs
//! (`poll_until_not_empty`, `clear`, `barrier`). Must never block without a bound: every
//! spin goes through a [`Wait`], which enforces the deadline, the abort flag and peer
//! liveness.

use crate::kinds::{Algorithm, Collective};
use crate::dtype::{DType, EMPTY};
use crate::error::{Error, Result};
use crate::workspace::Workspace;

pub use crate::workspace::Word;


/// What a rank is waiting for, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A peer's call descriptor in my inbox.
    Descriptor,
    /// A peer's data words in my inbox.
    Data,
    /// A peer's arrival at barrier `k` of the call.
    Barrier(u32),
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::Descriptor => f.write_str("call descriptor"),
            Phase::Data => f.write_str("data"),
            Phase::Barrier(k) => write!(f, "barrier {k}"),
        }
    }
}

/// Polls that spin (with the CPU's pause hint) before a wait asks its [`Wait`] for more.
/// Short waits, such as a reader catching up with a writer word by word, end inside this
/// spin and never pay for a clock read or a system call.
pub const SPINS_PER_PAUSE: u32 = 64;

/// Called when a wait has spun [`SPINS_PER_PAUSE`] polls in vain; `round` counts such calls
/// within this one wait (0, 1, 2, …), so the waiter can escalate from yielding to sleeping
/// per wait rather than per call. `ready` polls the awaited word once more (true: the wait
/// is over), for a waiter that goes to sleep: it must look again after announcing that it
/// sleeps, or a writer that looked before the announcement would never wake it. Returns an
/// error to abandon the wait (deadline passed, abort raised, peer dead).
pub trait Wait {
    fn pause(&mut self, peer: usize, phase: Phase, round: u32, ready: &dyn Fn() -> bool) -> Result<()>;
    /// Polls per pause; a model checker wants 1, so that every poll is a scheduling point.
    fn spins_per_pause(&self) -> u32 {
        SPINS_PER_PAUSE
    }
    /// Called after a rank stored (with release) words its peers may wait for: a waiter that
    /// went to sleep is woken here. Once per batch of stores, not per store.
    fn published(&mut self) {}
}

/// Spins until `ready(load())` or the waiter gives up; returns the last value loaded.
#[inline(always)]
fn spin_until<W: Word, S: Wait>(w: &W, ready: impl Fn(u64) -> bool, waiter: &mut S, peer: usize, phase: Phase) -> Result<u64> {
    let mut round = 0u32;
    loop {
        // Asked each round: a waiter may learn in a pause that spinning is futile.
        for _ in 0..waiter.spins_per_pause().max(1) {
            let v = w.load_acquire();
            if ready(v) {
                return Ok(v);
            }
            std::hint::spin_loop();
        }
        waiter.pause(peer, phase, round, &|| ready(w.load_acquire()))?;
        round = round.saturating_add(1);
    }
}

/// What every rank states about a call; ranks must agree on all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub epoch: u32,
    pub algorithm: Algorithm,
    pub dtype: DType,
    /// What the call computes (all-reduce, all-gather, reduce-scatter).
    pub collective: Collective,
    /// Total element count of the user's call (not of the chunk), per rank as
    /// [`Collective::io_elems`] counts it.
    pub count: u64,
}

/// Largest element count a descriptor can carry (38 bits).
pub const MAX_COUNT: u64 = (1 << 38) - 1;

impl Desc {
    /// Encodes as a word: epoch low 16 bits | algorithm 4 bits | dtype 2 bits | collective 2
    /// bits | count 38 bits. Bits 62 and 63 stay clear, so a descriptor is never [`EMPTY`].
    pub fn encode(&self) -> u64 {
        (self.epoch as u64 & 0xffff)
            | ((self.algorithm.code() & 0xf) << 16)
            | ((self.dtype.code() & 0x3) << 20)
            | ((self.collective.code() & 0x3) << 22)
            | ((self.count & MAX_COUNT) << 24)
    }

    /// The 32-bit check carried beside barrier generations.
    pub fn check32(&self) -> u32 {
        let w = self.encode();
        (w ^ (w >> 32)) as u32
    }

    /// Names the first field in which `theirs` (a peer's encoded descriptor) differs.
    pub fn diff(&self, theirs: u64) -> Option<(&'static str, String, String)> {
        let ours = self.encode();
        let alg = |w: u64| Algorithm::from_code((w >> 16) & 0xf).map_or("?".to_string(), |a| a.name().to_string());
        let dt = |w: u64| DType::from_code((w >> 20) & 0x3).map_or("?".to_string(), |d| d.name().to_string());
        let coll = |w: u64| Collective::from_code((w >> 22) & 0x3).map_or("?".to_string(), |k| k.name().to_string());
        if (ours >> 22) & 0x3 != (theirs >> 22) & 0x3 {
            return Some(("collective", coll(ours), coll(theirs)));
        }
        if (ours >> 16) & 0xf != (theirs >> 16) & 0xf {
            return Some(("algorithm", alg(ours), alg(theirs)));
        }
        if (ours >> 20) & 0x3 != (theirs >> 20) & 0x3 {
            return Some(("dtype", dt(ours), dt(theirs)));
        }
        if ours >> 24 != theirs >> 24 {
            return Some(("count", (ours >> 24).to_string(), (theirs >> 24).to_string()));
        }
        if ours & 0xffff != theirs & 0xffff {
            return Some(("epoch (call sequence)", (ours & 0xffff).to_string(), (theirs & 0xffff).to_string()));
        }
        None
    }
}

/// Polls `w` (in my own memory) until it is not [`EMPTY`] and returns it.
#[inline(always)]
pub fn poll_until_not_empty<W: Word, S: Wait>(w: &W, waiter: &mut S, peer: usize, phase: Phase) -> Result<u64> {
    let v = w.load_acquire();
    if v != EMPTY {
        return Ok(v);
    }
    spin_until(w, |v| v != EMPTY, waiter, peer, phase)
}

/// Returns a peer's descriptor from my inbox after validating it against mine.
pub fn take_descriptor<W: Word, S: Wait>(slot: &W, ours: &Desc, rank: usize, peer: usize, waiter: &mut S) -> Result<()> {
    let theirs = poll_until_not_empty(slot, waiter, peer, Phase::Descriptor)?;
    slot.store_relaxed(EMPTY);
    if theirs != ours.encode() {
        let (field, o, t) = ours
            .diff(theirs)
            .unwrap_or(("descriptor", format!("{:#x}", ours.encode()), format!("{theirs:#x}")));
        return Err(Error::Mismatch {
            rank,
            peer,
            field,
            ours: o,
            theirs: t,
        });
    }
    Ok(())
}

/// Owner-only: returns consumed words (flags) to [`EMPTY`].
///
/// Buffer-reuse argument (the rule that makes push protocols correct): a slot and its flag
/// of parity `e & 1` are read and cleared by their owner during call `e`, before the owner
/// stores anything for call `e + 1`. A peer writes them again only in call `e + 2`, which it
/// can enter only after finishing call `e + 1`, and every algorithm makes each rank acquire,
/// during a call, a word that every other rank released during that same call (directly, or
/// through an owner in two-shot). So the owner's reads and clear happen-before the next
/// write: the writer's flag store is later in the flag's modification order, and its plain
/// data copy cannot overlap the owner's reads. Relaxed stores suffice for the clear: the
/// release that publishes the owner's next-call data orders them.
#[inline]
pub fn clear<W: Word>(slots: &[W]) {
    for s in slots {
        s.store_relaxed(EMPTY);
    }
}

/// Generation of barrier `k` (0..4) in the call with epoch `epoch`, wrapping mod 2^32.
#[inline]
pub fn barrier_gen(epoch: u32, k: u32) -> u32 {
    epoch.wrapping_mul(4).wrapping_add(k)
}

/// True when generation `have` is at or past `want`, modulo 2^32 (valid while the two are
/// within 2^31 of each other; a peer can be at most one barrier ahead).
#[inline]
pub fn gen_reached(have: u32, want: u32) -> bool {
    (have.wrapping_sub(want) as i32) >= 0
}

/// The initial value of every barrier slot when the first call has `first_epoch`:
/// one generation before the first barrier.
pub fn barrier_init(first_epoch: u32) -> u64 {
    barrier_gen(first_epoch, 0).wrapping_sub(1) as u64
}

/// Barrier `k` of the call described by `desc`: store my generation into my slot in every
/// rank's barrier array (mine included), then poll my own slots until every peer has
/// reached it. The 32-bit check (from the call descriptor) is compared when the peer's slot
/// holds exactly this generation; a peer already past it was validated by its own barrier.
pub fn barrier<W: Word, S: Wait>(ws: &Workspace<'_, W>, rank: usize, desc: &Desc, k: u32, waiter: &mut S) -> Result<()> {
    let world = ws.layout.world;
    let gen = barrier_gen(desc.epoch, k);
    let word = gen as u64 | ((desc.check32() as u64) << 32);
    for i in 0..world {
        let p = (rank + i) % world;
        ws.barrier_slot(p, rank).store_release(word);
    }
    waiter.published();
    for i in 1..world {
        let p = (rank + i) % world;
        let v = spin_until(ws.barrier_slot(rank, p), |v| gen_reached(v as u32, gen), waiter, p, Phase::Barrier(k))?;
        if v as u32 == gen && (v >> 32) as u32 != desc.check32() {
            return Err(Error::Mismatch {
                rank,
                peer: p,
                field: "call descriptor (algorithm, dtype or count)",
                ours: format!("check {:#010x}", desc.check32()),
                theirs: format!("check {:#010x}", (v >> 32) as u32),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_compare_across_wrap() {
        assert!(gen_reached(5, 5));
        assert!(gen_reached(6, 5));
        assert!(!gen_reached(4, 5));
        assert!(gen_reached(2, u32::MAX - 1));
        assert!(!gen_reached(u32::MAX - 1, 2));
        let e = u32::MAX;
        assert_eq!(barrier_gen(e, 0), u32::MAX - 3);
        assert_eq!(barrier_gen(e.wrapping_add(1), 0), 0);
        assert!(!gen_reached(barrier_init(e) as u32, barrier_gen(e, 0)));
        assert!(!gen_reached(barrier_init(0) as u32, barrier_gen(0, 0)));
    }

    #[test]
    fn descriptors_are_never_empty_and_name_the_field() {
        let d = Desc {
            epoch: u32::MAX,
            algorithm: Algorithm::Nccl,
            dtype: DType::BF16,
            collective: Collective::ReduceScatter,
            count: MAX_COUNT,
        };
        assert_ne!(d.encode(), EMPTY);
        assert_eq!(d.encode() >> 62, 0, "bits 62 and 63 stay clear");
        let other = Desc { count: 7, ..d };
        assert_eq!(d.diff(other.encode()).map(|x| x.0), Some("count"));
        let other = Desc { dtype: DType::F32, ..d };
        assert_eq!(d.diff(other.encode()).map(|x| x.0), Some("dtype"));
        let other = Desc { algorithm: Algorithm::OneshotPull, ..d };
        assert_eq!(d.diff(other.encode()).map(|x| x.0), Some("algorithm"));
        for k in Collective::ALL.into_iter().filter(|&k| k != d.collective) {
            let other = Desc { collective: k, ..d };
            assert_eq!(d.diff(other.encode()), Some(("collective", "reduce-scatter".to_string(), k.name().to_string())));
        }
        assert_eq!(d.diff(d.encode()), None);
    }
}
