//! One-shot push: every rank copies its input into every peer's inbox and raises its flag
//! there (the call descriptor, stored with release after the data); each rank waits for
//! every peer's flag in its own inbox and reduces in rank order straight from the inbox
//! (its own contribution from its input). Reads nothing remote; one hop of latency; each
//! rank sends (N-1)·S bytes. The all-gather and the reduce-scatter push the same way
//! ([`all_gather`], [`reduce_scatter`]): every rank's input, or its piece for each owner,
//! written once into the reader's inbox.
//!
//! Buffers: `push_desc` (flags, one line each; a call of at most 56 bytes travels in the
//! rest of the flag's line) / `push_data`, parity `epoch & 1`. Data words
//! are never cleared: a slot is read only after its flag for this call, and the flag is
//! cleared by its owner (argument at `protocol::clear`). Must never read a peer's block.

use super::call::{slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{take_descriptor, Wait, Word};
use crate::workspace::INLINE_WORDS;
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, host_reads, host_write, step};
use crate::kinds::Transport;
use std::borrow::Cow;

pub(crate) fn run<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T]) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    let n = input.len();
    // At most 56 bytes travel in the flag's own line (one transfer instead of two).
    let inline = std::mem::size_of_val(input) <= INLINE_WORDS * 8;
    let slot = |owner: usize, from: usize| if inline { ws.push_inline(owner, parity, from) } else { ws.push_data(owner, parity, from) };
    // Start with the right-hand neighbour so ranks do not all write rank 0 first.
    for i in 1..world {
        let p = (me + i) % world;
        W::store_plain(slot(p, me), input);
        ws.push_desc(p, parity, me).store_release(d);
    }
    c.waiter.published();
    for i in 1..world {
        let s = (me + i) % world;
        take_descriptor(ws.push_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
    }
    let v = views(world, |s| if s == me { Cow::Borrowed(input) } else { W::view(slot(me, s), n) });
    reduce_into(&slices(&v[..world])[..world], out);
    Ok(())
}

/// All-gather by the same pushes: my part of the call (`input`, one chunk of my input) goes
/// into every peer's inbox, and rank s's part from my inbox (my own from `input`) to
/// `out[s * stride + offset ..]`, `input.len()` elements each. A bitwise copy. The call
/// descriptor (collective, count) is checked as for the all-reduce.
pub(crate) fn all_gather<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T], stride: usize, offset: usize) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    let n = input.len();
    let inline = std::mem::size_of_val(input) <= INLINE_WORDS * 8;
    let slot = |owner: usize, from: usize| if inline { ws.push_inline(owner, parity, from) } else { ws.push_data(owner, parity, from) };
    for i in 1..world {
        let p = (me + i) % world;
        W::store_plain(slot(p, me), input);
        ws.push_desc(p, parity, me).store_release(d);
    }
    c.waiter.published();
    let at = |s: usize| s * stride + offset;
    out[at(me)..at(me) + n].copy_from_slice(input);
    for i in 1..world {
        let s = (me + i) % world;
        take_descriptor(ws.push_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
        out[at(s)..at(s) + n].copy_from_slice(&W::view(slot(me, s), n));
    }
    Ok(())
}

/// Reduce-scatter by the same pushes: owner j's piece of the call (`input[j * stride +
/// offset ..]`, `out.len()` elements) goes into rank j's inbox, and I sum my piece in rank
/// order from my inbox (my own part from `input`): the same f32 sum, rounded once, as every
/// all-reduce's, so `out` is bitwise the same slice of the all-reduce.
pub(crate) fn reduce_scatter<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], stride: usize, offset: usize, out: &mut [T]) -> Result<()> {
    let (ws, me, world, parity) = (c.ws, c.rank, c.world(), c.parity());
    let d = c.desc.encode();
    let n = out.len();
    let inline = std::mem::size_of_val(out) <= INLINE_WORDS * 8;
    let slot = |owner: usize, from: usize| if inline { ws.push_inline(owner, parity, from) } else { ws.push_data(owner, parity, from) };
    let piece = |j: usize| &input[j * stride + offset..j * stride + offset + n];
    for i in 1..world {
        let j = (me + i) % world;
        W::store_plain(slot(j, me), piece(j));
        ws.push_desc(j, parity, me).store_release(d);
    }
    c.waiter.published();
    for i in 1..world {
        let s = (me + i) % world;
        take_descriptor(ws.push_desc(me, parity, s), &c.desc, me, s, c.waiter)?;
    }
    let v = views(world, |s| if s == me { Cow::Borrowed(piece(me)) } else { W::view(slot(me, s), n) });
    reduce_into(&slices(&v[..world])[..world], out);
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
