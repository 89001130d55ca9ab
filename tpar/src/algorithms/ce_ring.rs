//! `ce-ring`: the copy-engine path for large messages. Copy engines (`cuMemcpyAsync`, no SM
//! involved) move the data; small kernels (`kernels/ce_ring.cu`) only synchronise and add.
//!
//! One call, on `world` ranks, cut into `pieces` pieces (pipelining), each piece into `world`
//! chunks; rank c owns chunk c of every piece:
//!
//! 1. entry: every rank tells every peer it has finished its previous call (the regions
//!    written below are shared with the pull kernels, whose last reads end no barrier);
//! 2. reduce-scatter: rank s copies chunk c of its input into slot [s] of owner c's inbox
//!    (`world - 1` copies, back to back on its copy stream: at every moment one outbound
//!    copy per rank, the staged pattern PCIe fabrics need);
//! 3. the owner sums its chunk over every rank **in rank order** 0..world-1, in f32, rounded
//!    once: the same bits as every other tpar algorithm (tpar promises the rank-order sum on
//!    every rank). A ring's natural order (owner + 1, owner + 2, ...) would differ from the
//!    other algorithms' sums and carry a rounding per hop; gathering the raw chunks to their
//!    owner costs no more bytes than a ring's partial sums (2(n-1)/n of the message per rank
//!    in all) and needs no order but rank order;
//! 4. all-gather: the owner copies its summed chunk into slot [c] of every peer's gather area;
//!    each rank copies (or, on a lossy wire, dequantises) the gathered chunks into its output.
//!
//! With `TPAR_WIRE=fp8|int8` the reduce-scatter copies carry quantised chunks and the
//! all-gather carries the owner's quantised sum, which the owner itself dequantises too, so
//! every rank still holds the same bits (`ce_wire` is the reference and the error bound).
//!
//! Owns: the geometry every side computes the same way (host copies, kernel arguments, the
//! CPU reference of the wire), and the schedule the simulator replays. Must never: decide
//! where it runs (the registry), or launch anything (`cuda::ce`).

use super::schedule::{gpu, step, unsupported, Endpoint, FabricView, Flow, Op, Step, Sync};
use crate::dtype::DType;
use crate::error::Result;
use crate::kinds::{Algorithm, Transport};
use std::ops::Range;

/// Elements per quantisation block of a lossy wire (one f32 scale each): b12x's DmaAllReduce
/// uses 128 (`FP8_QUANT_BLOCK`), 4 scale bytes per 128 payload bytes.
pub const QBLOCK: usize = 128;
/// Most pieces a call is cut into (the flag area has a row of slots per piece).
pub const MAX_PIECES: usize = 4;
/// A call is cut into two pieces once each piece's chunk is at least this large, so that the
/// owners' reductions of piece 0 overlap the copies of piece 1. After b12x's measurement
/// (pcie_dma.py, `_pick_pieces`): two pieces were best at every size on 8 RTX PRO 6000, with
/// at least 512 KiB per piece of a shard. Not measured by tpar yet (no PCIe machine).
pub const PIECE_MIN_CHUNK_BYTES: usize = 512 << 10;
/// Slots are aligned to this (copy engines move aligned bursts fastest).
pub const SLOT_ALIGN: usize = 256;
const VEC: usize = 16;

/// Where every chunk of one call lies, in vectors of 16 bytes and in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub count: usize,
    pub dtype: DType,
    pub world: usize,
    /// Elements per 16-byte vector.
    pub lanes: usize,
    /// Vectors of the message (the last may be partial).
    pub nvec: usize,
    pub pieces: usize,
    /// Vectors per piece (the last piece may be shorter).
    pub piece_vecs: usize,
    /// Bytes of one slot (one rank's chunk of one piece), raw or on the wire, whichever is
    /// larger, aligned to [`SLOT_ALIGN`].
    pub slot_bytes: usize,
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Bytes of `n` elements on a lossy wire: one byte each (padded to 16), then one f32 scale
/// per block of [`QBLOCK`] elements.
pub fn wire_bytes(n: usize) -> usize {
    round_up(n, VEC) + 4 * n.div_ceil(QBLOCK)
}

/// Byte offset of the scales in a wire chunk of `n` elements.
pub fn wire_scales_offset(n: usize) -> usize {
    round_up(n, VEC)
}

/// Pieces for a call of `bytes` on `world` ranks ([`PIECE_MIN_CHUNK_BYTES`]).
pub fn pieces(bytes: usize, world: usize) -> usize {
    if bytes / (2 * world.max(1)) >= PIECE_MIN_CHUNK_BYTES {
        2
    } else {
        1
    }
}

impl Geometry {
    pub fn new(count: usize, dtype: DType, world: usize) -> Geometry {
        let world = world.max(1);
        let lanes = VEC / dtype.size();
        let nvec = count.div_ceil(lanes);
        let pieces = pieces(count * dtype.size(), world).min(MAX_PIECES);
        let piece_vecs = nvec.div_ceil(pieces).max(1);
        let cv = Self::chunk_vecs_for(piece_vecs, world, lanes);
        let slot_bytes = round_up((cv * VEC).max(wire_bytes(cv * lanes)).max(1), SLOT_ALIGN);
        Geometry { count, dtype, world, lanes, nvec, pieces, piece_vecs, slot_bytes }
    }

    /// Vectors per chunk of a piece of `pv` vectors: a whole number of quantisation blocks.
    fn chunk_vecs_for(pv: usize, world: usize, lanes: usize) -> usize {
        round_up(pv.div_ceil(world).max(1), (QBLOCK / lanes).max(1))
    }

    /// Vectors of piece `p`.
    pub fn piece(&self, p: usize) -> Range<usize> {
        let v0 = (p * self.piece_vecs).min(self.nvec);
        v0..(v0 + self.piece_vecs).min(self.nvec)
    }

    /// Vectors per chunk of piece `p` (its chunks' stride; the last chunks may be shorter or
    /// empty).
    pub fn chunk_vecs(&self, p: usize) -> usize {
        Self::chunk_vecs_for(self.piece(p).len(), self.world, self.lanes)
    }

    /// Vectors of chunk `c` (owner c) of piece `p`; empty when the piece ends before it.
    pub fn chunk(&self, p: usize, c: usize) -> Range<usize> {
        let r = self.piece(p);
        let v0 = (r.start + c * self.chunk_vecs(p)).min(r.end);
        v0..(v0 + self.chunk_vecs(p)).min(r.end)
    }

    /// Elements of chunk `c` of piece `p`.
    pub fn chunk_elems(&self, p: usize, c: usize) -> Range<usize> {
        let v = self.chunk(p, c);
        let e0 = (v.start * self.lanes).min(self.count);
        e0..(v.end * self.lanes).min(self.count)
    }

    /// Bytes a copy of chunk `c` of piece `p` moves: raw, or on a lossy wire.
    pub fn copy_bytes(&self, p: usize, c: usize, lossy: bool) -> usize {
        let n = self.chunk_elems(p, c).len();
        if n == 0 {
            0
        } else if lossy {
            wire_bytes(n)
        } else {
            n * self.dtype.size()
        }
    }

    /// Byte offset of slot (`rank`, `p`) in an inbox or gather region (`rank`: the source in
    /// an inbox, the owner in a gather area) and in the local stage (`rank`: the chunk).
    pub fn slot_offset(&self, rank: usize, p: usize) -> usize {
        (rank * self.pieces + p) * self.slot_bytes
    }

    /// Bytes of one inbox (or one gather area, or the stage): `world` x `pieces` slots.
    pub fn region_bytes(&self) -> usize {
        self.world * self.pieces * self.slot_bytes
    }
}

/// The communication schedule the simulator replays: an entry barrier, then `world - 1`
/// shifted copies per rank for the reduce-scatter and as many for the all-gather (one copy
/// engine per rank, copies back to back: at each moment rank i copies to rank i + k), each
/// phase ended by a flag hop. Through host memory where the fabric has no P2P writes: the
/// copies land in host memory and the readers' kernels read them there.
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, _islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    let n = fabric.world();
    if n < 2 {
        return Err(unsupported(Algorithm::CeRing, "it needs two or more ranks"));
    }
    let chunk = s / n as f64;
    let p2p = fabric.all_p2p_write();
    let shifted = |k: usize| -> Vec<Flow> {
        (0..n)
            .map(|i| {
                let j = (i + k) % n;
                if p2p {
                    Flow { src: gpu(i), dst: gpu(j), bytes: chunk, op: Op::Copy }
                } else {
                    Flow { src: gpu(i), dst: Endpoint::Host(fabric.socket(j)), bytes: chunk, op: Op::Copy }
                }
            })
            .collect()
    };
    // Without P2P the reader's kernel reads each landed chunk from host memory.
    let host_reads = || -> Vec<Flow> {
        (0..n)
            .flat_map(|j| (1..n).map(move |_| j))
            .map(|j| Flow { src: Endpoint::Host(fabric.socket(j)), dst: gpu(j), bytes: chunk, op: Op::Read })
            .collect()
    };
    let mut steps = vec![step("entry barrier", Vec::new(), Sync::Barrier)];
    for phase in ["reduce-scatter copy", "all-gather copy"] {
        for k in 1..n {
            steps.push(step(phase, shifted(k), Sync::CopyStep));
        }
        if !p2p {
            steps.push(step("read landed chunks from host", host_reads(), Sync::Poll));
        }
        steps.push(step("flag hop", Vec::new(), Sync::Poll));
    }
    Ok((if p2p { Transport::P2p } else { Transport::Host }, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_partition_every_piece_and_the_message() {
        for dtype in DType::ALL {
            for world in [2usize, 3, 4, 5, 8, 16] {
                for count in [1usize, 7, 8, 127, 128, 1000, 4097, 65536 + 3, (8 << 20) / dtype.size() + 1, (64 << 20) / dtype.size()] {
                    let g = Geometry::new(count, dtype, world);
                    assert!(g.pieces >= 1 && g.pieces <= MAX_PIECES);
                    let mut next = 0usize;
                    for p in 0..g.pieces {
                        for c in 0..world {
                            let e = g.chunk_elems(p, c);
                            if e.is_empty() {
                                continue;
                            }
                            assert_eq!(e.start, next, "{dtype} world {world} count {count}: gap or overlap at piece {p} chunk {c}");
                            next = e.end;
                            // Chunks start on whole vectors and quantisation blocks stay inside.
                            assert_eq!(e.start % g.lanes, 0);
                            let n = e.len();
                            assert!(n * dtype.size() <= g.slot_bytes && wire_bytes(n) <= g.slot_bytes, "slot too small");
                            assert_eq!(g.copy_bytes(p, c, false), n * dtype.size());
                            assert_eq!(g.copy_bytes(p, c, true), wire_bytes(n));
                        }
                    }
                    assert_eq!(next, count, "{dtype} world {world} count {count}: chunks cover the message");
                    assert_eq!(g.slot_bytes % SLOT_ALIGN, 0);
                    assert_eq!(g.slot_offset(world - 1, g.pieces - 1) + g.slot_bytes, g.region_bytes());
                }
            }
        }
    }

    #[test]
    fn large_calls_are_pipelined_in_two_pieces_and_regions_stay_near_the_message() {
        let g = Geometry::new((64 << 20) / 2, DType::BF16, 8);
        assert_eq!(g.pieces, 2);
        assert_eq!(Geometry::new(4096, DType::BF16, 8).pieces, 1);
        // Inbox plus gather area: about twice the message, never far above it.
        for (count, world) in [((64usize << 20) / 2, 8usize), ((16 << 20) / 2, 4), (1 << 20, 2)] {
            let g = Geometry::new(count, DType::BF16, world);
            let used = g.region_bytes();
            assert!(used <= count * 2 + world * g.pieces * (SLOT_ALIGN + QBLOCK * 2), "{count} x {world}: {used}");
        }
    }

    #[test]
    fn wire_chunks_are_payload_then_scales() {
        assert_eq!(wire_bytes(1), 16 + 4);
        assert_eq!(wire_bytes(128), 128 + 4);
        assert_eq!(wire_bytes(129), 144 + 8);
        assert_eq!(wire_scales_offset(129), 144);
    }
}
