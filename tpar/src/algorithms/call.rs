//! What an algorithm's CPU body works with: one chunk of one call, and the small helpers
//! every body shares (the pull prologue, per-rank views).

use crate::dtype::Element;
use crate::error::Result;
use crate::protocol::{Desc, Wait, Word};
use crate::workspace::{Workspace, MAX_WORLD};
use std::borrow::Cow;

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

/// The pull algorithms' prologue: publish my input in my `exposed` region, then meet every
/// rank at barrier 0 (its release publishes the copy), after which every rank's exposed
/// input may be read.
pub(crate) fn expose_and_meet<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T]) -> Result<()> {
    W::store_plain(c.ws.exposed(c.rank), input);
    crate::protocol::barrier(c.ws, c.rank, &c.desc, 0, c.waiter)
}

/// Per-rank read-only views (rank order), so the reduce reads peers' buffers in place.
/// Only the first `world` entries are built: this runs on every call, and a 2-byte call
/// should not pay for sixteen.
#[inline(always)]
pub(crate) fn views<'w, T: Element>(world: usize, f: impl Fn(usize) -> Cow<'w, [T]>) -> [Cow<'w, [T]>; MAX_WORLD] {
    let mut v = [const { Cow::Borrowed(&[] as &[T]) }; MAX_WORLD];
    for (s, slot) in v.iter_mut().enumerate().take(world) {
        *slot = f(s);
    }
    v
}

/// The views as plain slices, for `dtype::reduce_into`.
#[inline(always)]
pub(crate) fn slices<'a, T: Element>(v: &'a [Cow<'_, [T]>]) -> [&'a [T]; MAX_WORLD] {
    let mut out: [&'a [T]; MAX_WORLD] = [&[]; MAX_WORLD];
    for (o, c) in out.iter_mut().zip(v) {
        *o = c;
    }
    out
}
