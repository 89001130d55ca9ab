//! Baseline, labelled as such everywhere: rank 0 reads every rank's exposed input, reduces,
//! publishes the result, and every rank copies it. One rank does all the work; this is the
//! "obvious" all-reduce the others must beat, not something the plan ever picks.
//!
//! Buffers: `exposed`, rank 0's `result`, barrier slots; the same no-third-barrier argument
//! as two-shot pull.

use super::call::{expose_and_meet, slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{barrier, Wait, Word};
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step, unsupported};
use crate::kinds::Algorithm;
use crate::kinds::Transport;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T]) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    let n = input.len();
    expose_and_meet(c, input)?;
    if me == 0 {
        let v = views(world, |s| W::view(ws.exposed(s), n));
        reduce_into(&slices(&v[..world])[..world], out);
        W::store_plain(ws.result(0), out);
    }
    barrier(ws, me, &c.desc, 1, c.waiter)?;
    if me != 0 {
        out.copy_from_slice(&W::view(ws.result(0), n));
    }
    Ok(())
}

/// The communication schedule the simulator replays: rank 0 reads every rank, every rank
/// reads rank 0. Needs P2P reads.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_read() {
        return Err(unsupported(Algorithm::GatherBcast, "it reads peer memory and this fabric has no P2P reads"));
    }
    let n = fabric.world();
    let read = |src: usize, dst: usize| Flow {
        src: gpu(src),
        dst: gpu(dst),
        bytes: s,
        op: Op::Read,
    };
    Ok((
        Transport::P2p,
        vec![
            step("barrier", Vec::new(), Sync::Barrier),
            step("rank 0 reads all", (1..n).map(|i| read(i, 0)).collect(), Sync::Poll),
            step("barrier", Vec::new(), Sync::Barrier),
            step("all read rank 0", (1..n).map(|i| read(0, i)).collect(), Sync::Poll),
            step("barrier", Vec::new(), Sync::Barrier),
        ],
    ))
}
