//! One-shot push: every rank writes its packed input into every peer's inbox, then polls
//! only its own inbox (sentinel protocol), reduces in rank order, and clears each word as
//! it consumes it. Reads nothing remote; one hop of latency; each rank sends (N-1)·S bytes.
//!
//! Buffers: `push_desc` / `push_data`, parity `epoch & 1`. The reuse argument is at
//! `protocol::clear`. Must never read a peer's block.

use super::call::{per_peer, write_word, Call};
use crate::dtype::{unpack_add, Element, EMPTY};
use crate::error::Result;
use crate::protocol::{poll_until_not_empty, take_descriptor, Phase, Wait, Word};
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, host_reads, host_write, step};
use crate::Transport;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, packed: &[u64], out: &mut [T]) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    // My own contribution is read from `packed` directly; only peers' inboxes are written.
    // Start with the right-hand neighbour so ranks do not all write rank 0 first.
    for i in 1..world {
        let p = (me + i) % world;
        ws.push_desc(p, parity, me).store_release(d);
        for (slot, w) in ws.push_data(p, parity, me).iter().zip(packed) {
            slot.store_release(*w);
        }
    }
    for s in (0..world).filter(|&s| s != me) {
        take_descriptor(ws.push_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
    }
    let nw = packed.len();
    let inbox = per_peer(world, |s| &ws.push_data(me, parity, s)[..nw]);
    for i in 0..nw {
        let mut acc = [-0.0f32; 4]; // -0.0 is the additive identity: -0.0 + x == x
        for (s, slots) in inbox.iter().enumerate().take(world) {
            let w = if s == me {
                packed[i]
            } else {
                let w = poll_until_not_empty(&slots[i], c.waiter, s, Phase::Data)?;
                // Consumed: clear at once, while the line is in cache (argument at `clear`).
                slots[i].store_relaxed(EMPTY);
                w
            };
            unpack_add::<T>(w, &mut acc);
        }
        write_word(out, i, &acc);
    }
    Ok(())
}

/// The communication schedule the simulator replays: one step of all-to-all writes; without
/// P2P, through host memory.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    Ok(if fabric.all_p2p_write() {
        (Transport::P2p, vec![step("push to all", all_pairs(n, s, Op::Write), Sync::Poll)])
    } else {
        (
            Transport::Host,
            vec![
                step("stage in host", (0..n).map(|i| host_write(fabric, i, s)).collect(), Sync::HostPoll),
                step("read peers from host", host_reads(fabric, n, s), Sync::Poll),
            ],
        )
    })
}
