//! One-shot pull (the vLLM / SGLang design): expose my input, barrier, read every rank's
//! exposed input and reduce in rank order, barrier again so nobody overwrites its exposed
//! buffer while a peer still reads it. Kept as a baseline and for fabrics where reads beat
//! writes; measured, not assumed.
//!
//! Buffers: `exposed` (written by its owner only at call start, read by peers only between
//! the two barriers) and the barrier slots. Must never write a peer's data region.

use super::call::{expose_and_meet, slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{barrier, Wait, Word};
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, step, unsupported};
use crate::kinds::Algorithm;
use crate::kinds::Transport;
use std::borrow::Cow;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T]) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    expose_and_meet(c, input)?;
    {
        let v = views(world, |s| if s == me { Cow::Borrowed(input) } else { W::view(ws.exposed(s), input.len()) });
        reduce_into(&slices(&v[..world])[..world], out);
    }
    barrier(ws, me, &c.desc, 1, c.waiter)
}

/// The communication schedule the simulator replays: barrier, every rank reads every peer,
/// barrier. Needs P2P reads.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_read() {
        return Err(unsupported(Algorithm::OneshotPull, "it reads peer memory and this fabric has no P2P reads"));
    }
    let n = fabric.world();
    Ok((
        Transport::P2p,
        vec![
            step("barrier", Vec::new(), Sync::Barrier),
            step("read all peers", all_pairs(n, s, Op::Read), Sync::Poll),
            step("barrier", Vec::new(), Sync::Barrier),
        ],
    ))
}
