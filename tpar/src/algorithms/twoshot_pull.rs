//! Two-shot pull: expose my input, barrier, reduce my piece by reading every rank's exposed
//! input, publish it in my `result` region, barrier, read every owner's reduced piece.
//!
//! No third barrier: `exposed` is read only before barrier 1, which its owner must pass
//! before its next call can overwrite it; `result` is overwritten only after barrier 0 of a
//! later call, which no rank passes before every rank has finished this one.

use super::call::{expose_and_meet, slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{barrier, Wait, Word};
use crate::workspace::piece_range;
use std::borrow::Cow;
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, step, unsupported};
use crate::kinds::Algorithm;
use crate::kinds::Transport;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T]) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    let n = input.len();
    expose_and_meet(c, input)?;
    let (a, b) = piece_range::<T>(n, world, me);
    {
        let v = views(world, |s| if s == me { Cow::Borrowed(&input[a..b]) } else { W::view(&ws.exposed(s)[a / T::LANES..], b - a) });
        reduce_into(&slices(&v[..world])[..world], &mut out[a..b]);
    }
    // My piece of `result` sits at the same element offset as in the input.
    W::store_plain(&ws.result(me)[a / T::LANES..], &out[a..b]);
    barrier(ws, me, &c.desc, 1, c.waiter)?;
    for j in (0..world).filter(|&j| j != me) {
        let (ja, jb) = piece_range::<T>(n, world, j);
        out[ja..jb].copy_from_slice(&W::view(&ws.result(j)[ja / T::LANES..], jb - ja));
    }
    Ok(())
}

/// The communication schedule the simulator replays (the GPU kernel's three barriers). Needs
/// P2P reads.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_read() {
        return Err(unsupported(Algorithm::TwoshotPull, "it reads peer memory and this fabric has no P2P reads"));
    }
    let n = fabric.world();
    let chunk = s / n as f64;
    Ok((
        Transport::P2p,
        vec![
            step("barrier", Vec::new(), Sync::Barrier),
            step("read my chunk", all_pairs(n, chunk, Op::Read), Sync::Poll),
            step("barrier", Vec::new(), Sync::Barrier),
            step("read reduced chunks", all_pairs(n, chunk, Op::Read), Sync::Poll),
            step("barrier", Vec::new(), Sync::Barrier),
        ],
    ))
}
