//! Two-shot pull: expose my input, barrier, reduce my piece by reading every rank's exposed
//! input, publish it in my `result` region, barrier, read every owner's reduced piece.
//!
//! No third barrier: `exposed` is read only before barrier 1, which its owner must pass
//! before its next call can overwrite it; `result` is overwritten only after barrier 0 of a
//! later call, which no rank passes before every rank has finished this one.

use super::call::{expose_and_meet, copy_word, per_peer, write_word, Call};
use crate::dtype::{pack_acc, unpack_add, Element};
use crate::error::Result;
use crate::protocol::{barrier, Wait, Word};
use crate::workspace::piece_range;
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, step, unsupported};
use crate::{Algorithm, Transport};

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, packed: &[u64], out: &mut [T]) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    let nw = packed.len();
    expose_and_meet(c, packed)?;
    let (a, b) = piece_range(nw, world, me);
    let peers = per_peer(world, |s| &ws.exposed(s)[..nw]);
    let result = ws.result(me);
    for i in a..b {
        let mut acc = [-0.0f32; 4]; // -0.0 is the additive identity: -0.0 + x == x
        for slots in peers.iter().take(world) {
            unpack_add::<T>(slots[i].load_acquire(), &mut acc);
        }
        let r = pack_acc::<T>(&acc);
        result[i].store_relaxed(r);
        write_word(out, i, &acc);
    }
    barrier(ws, me, &c.desc, 1, c.waiter)?;
    for j in (0..world).filter(|&j| j != me) {
        let (ja, jb) = piece_range(nw, world, j);
        for (i, slot) in ws.result(j).iter().enumerate().take(jb).skip(ja) {
            copy_word(out, i, slot.load_acquire());
        }
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
