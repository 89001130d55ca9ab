//! What an algorithm's CPU body works with: one chunk of one call, and the small helpers
//! every body shares (packing results out, the pull prologue, per-peer slices).

use crate::dtype::{pack_acc, unpack_into, Element};
use crate::error::Result;
use crate::protocol::{Desc, Wait, Word};
use crate::workspace::{Workspace, MAX_WORLD};

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

