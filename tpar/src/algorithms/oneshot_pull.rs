//! One-shot pull (the vLLM / SGLang design): expose my input, barrier, read every rank's
//! exposed input and reduce in rank order, barrier again so nobody overwrites its exposed
//! buffer while a peer still reads it. Kept as a baseline and for fabrics where reads beat
//! writes; measured, not assumed.
//!
//! The all-gather and the reduce-scatter read the same way ([`all_gather`],
//! [`reduce_scatter`]): every rank exposes its part (or its pieces for every owner) once,
//! and every reader copies or sums them straight out of the owners' exposed buffers.
//!
//! Buffers: `exposed` (written by its owner only at call start, read by peers only between
//! the two barriers) and the barrier slots. Must never write a peer's data region.

use super::call::{expose_and_meet, slices, views, Call};
use crate::dtype::{reduce_into, Element};
use crate::error::Result;
use crate::protocol::{barrier, Wait, Word};
use super::schedule::{FabricView, Op, Step, Sync, all_pairs, step, unsupported};
use crate::kinds::{Algorithm, Collective};
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

/// All-gather by reads: my part of the call (`input`, one chunk of my input) into my exposed
/// buffer, barrier, rank s's part from its exposed buffer (my own from `input`) to
/// `out[s * stride + offset ..]`, `input.len()` elements each; barrier again (nobody
/// overwrites its exposed buffer while a peer still reads it). A bitwise copy.
pub(crate) fn all_gather<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], out: &mut [T], stride: usize, offset: usize) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    let n = input.len();
    expose_and_meet(c, input)?;
    let at = |s: usize| s * stride + offset;
    out[at(me)..at(me) + n].copy_from_slice(input);
    for i in 1..world {
        let s = (me + i) % world;
        out[at(s)..at(s) + n].copy_from_slice(&W::view(ws.exposed(s), n));
    }
    barrier(ws, me, &c.desc, 1, c.waiter)
}

/// Reduce-scatter by reads: owner j's piece of the call (`input[j * stride + offset ..]`,
/// `out.len()` elements) into my exposed buffer at piece j's place (`n.div_ceil(LANES)`
/// words a piece: the caller's chunks fit `world` pieces, [`exposed_elems`]), barrier, my
/// piece read from every rank's exposed buffer (my own from `input`) and summed in rank order
/// in f32, rounded once: bitwise the same slice of the all-reduce. Barrier again.
pub(crate) fn reduce_scatter<W: Word, S: Wait, T: Element>(c: &mut Call<'_, '_, W, S>, input: &[T], stride: usize, offset: usize, out: &mut [T]) -> Result<()> {
    let (ws, me, world) = (c.ws, c.rank, c.world());
    let n = out.len();
    let words = n.div_ceil(T::LANES);
    let piece = |j: usize| &input[j * stride + offset..j * stride + offset + n];
    let mine = ws.exposed(me);
    for j in (0..world).filter(|&j| j != me) {
        W::store_plain(&mine[j * words..(j + 1) * words], piece(j));
    }
    crate::protocol::barrier(ws, me, &c.desc, 0, c.waiter)?;
    {
        let v = views(world, |s| if s == me { Cow::Borrowed(piece(me)) } else { W::view(&ws.exposed(s)[me * words..], n) });
        reduce_into(&slices(&v[..world])[..world], out);
    }
    barrier(ws, me, &c.desc, 1, c.waiter)
}

/// Most elements per rank a chunk of `collective` by one-shot pull may hold on the CPU
/// backend, whose exposed buffer holds `cap` elements: the reduce-scatter exposes a piece for
/// every rank (`world` pieces of whole words, `lanes` elements a word), the all-gather one part.
pub(crate) fn exposed_elems(collective: Collective, cap: usize, world: usize, lanes: usize) -> usize {
    match collective {
        Collective::ReduceScatter => cap / lanes.max(1) / world.max(1) * lanes.max(1),
        Collective::AllReduce | Collective::AllGather => cap,
    }
}

/// Whether the CUDA kernel's exposed area holds a call of `collective` of `bytes` per rank at
/// `world` ranks, in a workspace of `max_bytes` slots (`Err`: why not). The kernel exposes
/// the all-gather's part in the exposed slot (`bytes` <= `max_bytes`, as every call), and the
/// reduce-scatter's whole input but its own piece in its buffer's pull area, the exposed and
/// the partial slot together (kernels/oneshot_pull.cu): `world x bytes` <= 2 x `max_bytes`
/// rounded to whole vectors. The plan and the launcher both ask it.
pub fn exposed_fits(collective: Collective, bytes: u64, world: usize, max_bytes: u64) -> std::result::Result<(), String> {
    if collective != Collective::ReduceScatter {
        return Ok(());
    }
    let need = bytes.saturating_mul(world as u64);
    let room = 2 * max_bytes.div_ceil(16) * 16;
    if need <= room {
        Ok(())
    } else {
        Err(format!(
            "one-shot pull's reduce-scatter exposes every rank's piece ({world} x {} per rank = {}), more than the workspace's pull area ({}: twice max_bytes)",
            crate::units::human_bytes(bytes),
            crate::units::human_bytes(need),
            crate::units::human_bytes(room)
        ))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduce_scatter_exposes_a_piece_for_every_rank_and_the_all_gather_its_part() {
        // GPU: world x bytes in the exposed and partial slots (twice max_bytes, whole vectors).
        assert!(exposed_fits(Collective::ReduceScatter, 1 << 20, 8, 4 << 20).is_ok());
        assert!(exposed_fits(Collective::ReduceScatter, (1 << 20) + 16, 8, 4 << 20).is_err());
        assert!(exposed_fits(Collective::ReduceScatter, 16, 3, 24).is_ok(), "24 B of slot: two vectors each, 64 B");
        assert!(exposed_fits(Collective::ReduceScatter, 32, 3, 24).is_err());
        let why = exposed_fits(Collective::ReduceScatter, 1 << 20, 8, 1 << 20).unwrap_err();
        assert!(why.contains("8 x 1 MiB") && why.contains("8 MiB") && why.contains("2 MiB"), "{why}");
        assert!(exposed_fits(Collective::AllGather, 1 << 20, 16, 1 << 20).is_ok());
        // CPU: a world's pieces of whole words in `cap` elements (4 lanes a word: 16-bit).
        assert_eq!(exposed_elems(Collective::ReduceScatter, 1000, 3, 4), 332);
        assert_eq!(exposed_elems(Collective::AllGather, 1000, 3, 4), 1000);
    }
}
