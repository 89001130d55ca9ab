//! Two-shot push: reduce-scatter by writes (rank j owns piece j of the words: every rank
//! writes its piece j into rank j's inbox), the owner reduces its piece in rank order, then
//! all-gather by writes (the owner writes the reduced piece into every rank's gather
//! buffer). Each rank sends about 2·(N-1)/N·S bytes instead of (N-1)·S; two hops.
//!
//! Buffers: `rs_desc` / `rs_data` / `ag_data`, parity `epoch & 1`, each cleared by its owner
//! after consuming (argument at `protocol::clear`: every rank's gather words come from every
//! owner, and each owner's reduction needed every rank's piece, so the all-to-all dependency
//! per call holds). Must never read a peer's block.

use super::call::{copy_word, per_peer, Call};
use crate::dtype::{pack_acc, unpack_add, Element};
use crate::error::Result;
use crate::protocol::{clear, poll_until_not_empty, take_descriptor, Phase, Wait, Word};
use crate::workspace::piece_range;
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, host_reads, host_write, step};
use crate::Transport;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, packed: &[u64], out: &mut [T]) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    let nw = packed.len();
    // Reduce-scatter: piece j of my input goes to owner j.
    for i in 1..=world {
        let j = (me + i) % world;
        let (a, b) = piece_range(nw, world, j);
        ws.rs_desc(j, parity, me).store_release(d);
        for (slot, w) in ws.rs_data(j, parity, me).iter().zip(&packed[a..b]) {
            slot.store_release(*w);
        }
    }
    for s in 0..world {
        take_descriptor(ws.rs_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
    }
    let (a, b) = piece_range(nw, world, me);
    let inbox = per_peer(world, |s| &ws.rs_data(me, parity, s)[..b - a]);
    let gather = per_peer(world, |p| ws.ag_data(p, parity));
    for k in 0..b - a {
        let mut acc = [-0.0f32; 4]; // -0.0 is the additive identity: -0.0 + x == x
        for (s, slots) in inbox.iter().enumerate().take(world) {
            let w = poll_until_not_empty(&slots[k], c.waiter, s, Phase::Data)?;
            unpack_add::<T>(w, &mut acc);
        }
        let r = pack_acc::<T>(&acc);
        for i in 1..=world {
            gather[(me + i) % world][a + k].store_release(r);
        }
    }
    for slots in inbox.iter().take(world) {
        clear(slots);
    }
    // All-gather: every owner's reduced piece lands in my gather buffer.
    let mine = &ws.ag_data(me, parity)[..nw];
    for j in 0..world {
        let (ja, jb) = piece_range(nw, world, j);
        for (i, slot) in mine.iter().enumerate().take(jb).skip(ja) {
            let w = poll_until_not_empty(slot, c.waiter, j, Phase::Data)?;
            copy_word(out, i, w);
        }
    }
    clear(mine);
    Ok(())
}

/// The communication schedule the simulator replays: reduce-scatter then all-gather, each an
/// all-to-all of one chunk; without P2P, both halves through host memory.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    let chunk = s / n as f64;
    Ok(if fabric.all_p2p_write() {
        (
            Transport::P2p,
            vec![
                step("reduce-scatter", all_pairs(n, chunk, Op::Write), Sync::Poll),
                step("all-gather", all_pairs(n, chunk, Op::Write), Sync::Poll),
            ],
        )
    } else {
        (
            Transport::Host,
            vec![
                step("stage in host", (0..n).map(|i| host_write(fabric, i, s)).collect(), Sync::HostPoll),
                step("read my chunk from peers", host_reads(fabric, n, chunk), Sync::Poll),
                step("stage reduced chunk", (0..n).map(|i| host_write(fabric, i, chunk)).collect(), Sync::HostPoll),
                step("read chunks from host", host_reads(fabric, n, chunk), Sync::Poll),
            ],
        )
    })
}
