//! Two-shot push: reduce-scatter by writes (rank j owns piece j of the elements: every rank
//! copies its piece j into rank j's inbox and raises its flag there), the owner reduces its
//! piece in rank order straight from its inbox (its own part from its input), then
//! all-gather by writes (the owner copies the reduced piece into every rank's gather buffer
//! and raises its flag there). Each rank sends about 2·(N-1)/N·S bytes instead of (N-1)·S;
//! two hops. Pieces start on cache lines, so owners never share a line of a gather buffer.
//!
//! Buffers: `rs_desc` / `rs_data` / `ag_desc` / `ag_data`, parity `epoch & 1`. Flags are
//! cleared by their owner (argument at `protocol::clear`: every rank's gather flags come
//! from every owner, and each owner's reduction needed every rank's flag, so the all-to-all
//! dependency per call holds); data words are read only after their flag and never
//! cleared. Must never read a peer's block.

use super::call::{slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{take_descriptor, Wait, Word};
use crate::workspace::piece_range;
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, host_reads, host_write, step};
use crate::kinds::Transport;
use std::borrow::Cow;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T]) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    let n = input.len();
    // Reduce-scatter: piece j of my input goes to owner j (mine stays where it is).
    for i in 1..world {
        let j = (me + i) % world;
        let (a, b) = piece_range::<T>(n, world, j);
        W::store_plain(ws.rs_data(j, parity, me), &input[a..b]);
        ws.rs_desc(j, parity, me).store_release(d);
    }
    c.waiter.published();
    for i in 1..world {
        let s = (me + i) % world;
        take_descriptor(ws.rs_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
    }
    let (a, b) = piece_range::<T>(n, world, me);
    {
        let v = views(world, |s| if s == me { Cow::Borrowed(&input[a..b]) } else { W::view(ws.rs_data(me, parity, s), b - a) });
        reduce_into(&slices(&v[..world])[..world], &mut out[a..b]);
    }
    // All-gather: my reduced piece into every peer's gather buffer, at its element offset.
    for i in 1..world {
        let p = (me + i) % world;
        W::store_plain(&ws.ag_data(p, parity)[a / T::LANES..], &out[a..b]);
        ws.ag_desc(p, parity, me).store_release(d);
    }
    c.waiter.published();
    for i in 1..world {
        let j = (me + i) % world;
        take_descriptor(ws.ag_desc(me, parity, j), &c.desc, me, j, c.waiter)?;
        let (ja, jb) = piece_range::<T>(n, world, j);
        out[ja..jb].copy_from_slice(&W::view(&ws.ag_data(me, parity)[ja / T::LANES..], jb - ja));
    }
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
