//! Plain-data structs shared with the kernels, defined once here and once in
//! `kernels/common.cuh`, with size and offset assertions on both sides.
//!
//! Owns: `TparArgs` (the one struct of peer pointers every kernel takes), `TparState`
//! (per-rank device-local epoch), `TparError` (per-rank host-visible error record), and the
//! workspace layout arithmetic. Must never change a field without changing the `.cuh` twin.

use crate::dtype::DType;
use crate::kinds::{Algorithm, Collective};
use std::mem::{offset_of, size_of};

/// Most ranks a kernel addresses (the length of the peer-pointer arrays).
pub const MAX_RANKS: usize = 16;
/// Most blocks per rank per call (the flag area has one slot row per block).
pub const MAX_BLOCKS: usize = 64;
const _: () = assert!(MAX_BLOCKS == crate::plan::MAX_KERNEL_BLOCKS as usize, "the plan's block cap is the kernels'");
/// Threads per block; kernels are compiled with `__launch_bounds__` of this.
pub const THREADS: u32 = 512;
/// Bytes of one vector, the unit the kernels move.
pub const VEC_BYTES: usize = 16;

/// Error code: a device-side wait passed its deadline.
pub const ERR_TIMEOUT: u32 = 1;
/// Error code: a peer's call differs from this rank's (count, dtype or algorithm).
pub const ERR_MISMATCH: u32 = 2;
/// Error code written by the host, not a kernel: a peer's process died while this rank's
/// calls waited for it (the GPU communicator's watchdog; `TparError::peer` names it).
pub const ERR_PEER_DIED: u32 = 3;

/// The push regions' empty sentinel, one 32-bit word for every dtype (all ones: the
/// kernels' `TPAR_EMPTY_WORD`, the CPU backend's `dtype::EMPTY`), so calls of different
/// dtypes share a push region with no refill between them.
pub const EMPTY_WORD: u32 = crate::dtype::EMPTY as u32;

/// Kernel argument, passed by value. Twin of `struct TparArgs` in common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TparArgs {
    pub data: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
    pub state: u64,
    pub err: u64,
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub slot_vecs: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
    /// [`desc_code`] of the call, which every rank tells every peer.
    pub desc_code: u32,
    /// Test hook: the kernel spins this long before the call (skewed-rank stress); 0 normally.
    pub test_delay_ns: u32,
    /// `hierarchical`: rank q's island label (the island's first rank) at bits 4q..4q+3
    /// (`algorithms::hierarchical::island_word`); 0 is one island. Appended: the fields
    /// above keep their offsets.
    pub islands: u64,
    /// This call's [`TparIo`] in device memory (every rank's registered input and output:
    /// the pull kernels' zero-copy path for graph calls, io.cuh), 0 for none. Appended.
    pub io: u64,
}

/// Every rank's input and output of one registered call, as one rank addresses them: the
/// table `TparArgs::io` points at. Twin of `struct TparIo` in io.cuh. `input[rank] == 0`
/// (the rank's own input) marks a table the host left unregistered: the kernel copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TparIo {
    pub input: [u64; MAX_RANKS],
    pub output: [u64; MAX_RANKS],
}

/// The fused call's arguments beyond the all-reduce's (all-reduce + RMSNorm family,
/// docs/cuda.md "Fused"). Twin of `struct TparNorm` in common.cuh. The standalone add-RMSNorm
/// kernel takes the same (with `TparArgs::input`, `output`, `count` only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TparNorm {
    /// Residual input, rows x hidden, 16-byte aligned ([`NORM_RESIDUAL`]; else 0).
    pub residual: u64,
    /// The updated residual (without a residual: the all-reduce's sum), 16-byte aligned (may
    /// equal `residual`).
    pub residual_out: u64,
    /// RMSNorm weight, `hidden` elements, 16-byte aligned.
    pub weight: u64,
    /// Elements per row.
    pub hidden: u32,
    /// Epsilon as f32 bits.
    pub eps_bits: u32,
    /// [`NORM_FP8`]: the device address of the f32 static scale; [`NORM_NVFP4`]: of the f32
    /// global scale (else 0).
    pub scale: u64,
    /// The pattern: [`NORM_RESIDUAL`] | [`NORM_GEMMA`] | [`NORM_FP8`] or [`NORM_NVFP4`].
    pub flags: u32,
    pub pad: u32,
    /// [`NORM_NVFP4`]: the device address of the block scales (e4m3fn bytes in vLLM's
    /// 128x4-swizzled layout, `tpar::testing::nvfp4_scale_offset`; else 0).
    pub scale_out: u64,
}

/// [`TparNorm::flags`]: the residual add before the norm (common.cuh `TPAR_NORM_RESIDUAL`).
pub const NORM_RESIDUAL: u32 = 1;
/// [`TparNorm::flags`]: the Gemma weight offset, `f32(w) + 1` (`TPAR_NORM_GEMMA`).
pub const NORM_GEMMA: u32 = 2;
/// [`TparNorm::flags`]: the FP8 e4m3fn output, static scale (`TPAR_NORM_FP8`).
pub const NORM_FP8: u32 = 4;
/// [`TparNorm::flags`], not a pattern bit: two-shot pull's fused kernel splits the message
/// into whole rows a rank, which their owner normalises (`TPAR_NORM_ROWS`;
/// `cuda::fused::rows_owned` decides).
pub const NORM_ROWS: u32 = 8;
/// [`TparNorm::flags`]: the NVFP4 output (e2m1 codes two a byte, e4m3fn block scales of 16
/// elements into [`TparNorm::scale_out`], vLLM's `scaled_fp4_quant` with the global scale at
/// [`TparNorm::scale`]; `TPAR_NORM_NVFP4`). Never with [`NORM_FP8`].
pub const NORM_NVFP4: u32 = 16;

/// A fused kernel's one argument: the all-reduce's (`output` is the normalised output) and
/// the norm's. Twin of `struct TparFusedArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TparFusedArgs {
    pub a: TparArgs,
    pub n: TparNorm,
}

/// Where a rank's tile sums of squares (fused calls) start in its state buffer: after the
/// [`TparState`] (common.cuh `TPAR_SCRATCH_OFFSET`).
pub const SCRATCH_OFFSET: usize = 512;
/// Vectors in a tile: one warp's (common.cuh `TPAR_TILE_VECS`); a fused call's rows and
/// two-shot chunks are whole tiles.
pub const TILE_VECS: usize = 32;
/// Most tiles in a row the kernels' row sum takes (norm.cuh `TPAR_ROW_TILES_MAX`).
pub const ROW_TILES_MAX: usize = 128;

/// Bytes of a rank's state buffer: the [`TparState`], then one 8-byte tile word per tile of
/// the largest message (`slot_vecs` vectors), then the stamps ([`stamps_offset`]).
pub fn state_bytes(slot_vecs: usize) -> usize {
    stamps_offset(slot_vecs) + STAMP_BYTES
}

/// Stamps a block writes in a call compiled with `TPAR_TEST_STAMPS` (common.cuh `TPAR_STAMP`).
pub const STAMPS_PER_BLOCK: usize = 8;
/// Bytes of the stamps: one u64 `%globaltimer` per stamp and block, every block a call may
/// launch.
pub const STAMP_BYTES: usize = MAX_BLOCKS * STAMPS_PER_BLOCK * 8;
/// Where the stamps start in a rank's state buffer: after the tile words (common.cuh
/// `tpar_stamps`, the same arithmetic from `TparArgs::slot_vecs`).
pub fn stamps_offset(slot_vecs: usize) -> usize {
    SCRATCH_OFFSET + slot_vecs.div_ceil(TILE_VECS) * 8
}

/// What a call's descriptor says besides its count: algorithm code << 4 | dtype code.
pub fn desc_code(algo: Algorithm, dtype: DType) -> u32 {
    ((algo.code() as u32) << 4) | dtype.code() as u32
}

/// The descriptor bits (2-3) that say what a call computes: 0 the all-reduce,
/// [`DESC_ALL_GATHER`], [`DESC_FUSED`] (all-reduce + residual add + RMSNorm),
/// [`DESC_REDUCE_SCATTER`]; dtype codes use the low two bits. A rank calling one while a
/// peer calls another gets a Mismatch, never ranks that silently diverge.
pub const DESC_KIND: u32 = 0xc;
/// [`DESC_KIND`] of an all-gather.
pub const DESC_ALL_GATHER: u32 = 0x4;
/// [`DESC_KIND`] of a fused call.
pub const DESC_FUSED: u32 = 0x8;
/// [`DESC_KIND`] of a reduce-scatter.
pub const DESC_REDUCE_SCATTER: u32 = 0xc;

/// [`desc_code`] of a fused call of the pattern `flags` ([`TparNorm::flags`], in bits 8-10
/// and 12 ([`NORM_NVFP4`]), and [`NORM_ROWS`] in bit 11: ranks that call different patterns,
/// or split the message differently, get a Mismatch).
pub fn fused_desc_code(algo: Algorithm, dtype: DType, flags: u32) -> u32 {
    desc_code(algo, dtype) | DESC_FUSED | (flags & 0x1f) << 8
}

/// The fused pattern's name from [`TparNorm::flags`] ([`crate::kinds::norm_pattern_name`],
/// as `tpar::testing::NormPattern::name` names it).
pub fn pattern_name(flags: u32) -> String {
    crate::kinds::norm_pattern_name(flags & NORM_RESIDUAL != 0, flags & NORM_GEMMA != 0, if flags & NORM_NVFP4 != 0 { "nvfp4" } else if flags & NORM_FP8 != 0 { "fp8" } else { "" })
}

/// [`desc_code`] of a call of `collective` (the all-reduce's is [`desc_code`]'s).
pub fn collective_desc_code(algo: Algorithm, dtype: DType, collective: Collective) -> u32 {
    desc_code(algo, dtype)
        | match collective {
            Collective::AllReduce => 0,
            Collective::AllGather => DESC_ALL_GATHER,
            Collective::ReduceScatter => DESC_REDUCE_SCATTER,
        }
}

/// What the [`DESC_KIND`] bits of a descriptor code say, in words.
fn kind_name(code: u64) -> &'static str {
    match code as u32 & DESC_KIND {
        0 => "all-reduce",
        DESC_ALL_GATHER => "all-gather",
        DESC_FUSED => "all-reduce fused with RMSNorm",
        _ => "reduce-scatter",
    }
}

/// Which field two differing calls (`count << 8 | desc_code`, [`pack_call`]) differ in.
fn differing_field(ours: u64, theirs: u64) -> &'static str {
    let kinds = (ours as u32 & DESC_KIND, theirs as u32 & DESC_KIND);
    if kinds == (DESC_FUSED, DESC_FUSED) && ours >> 56 != theirs >> 56 {
        return "fused pattern (residual add, Gemma offset, FP8 or NVFP4 output) or two-shot pull's row ownership (TPAR_FUSED_ROWS)";
    }
    if kinds.0 != kinds.1 {
        if matches!(kinds, (0, DESC_FUSED) | (DESC_FUSED, 0)) {
            "fused (the all-reduce alone, or fused with RMSNorm)"
        } else {
            "collective (all-reduce, all-gather, reduce-scatter, or the all-reduce fused with RMSNorm)"
        }
    } else if ours >> 8 != theirs >> 8 {
        "count"
    } else if (ours ^ theirs) & 0x3 != 0 {
        "dtype"
    } else {
        "algorithm"
    }
}

/// Decodes a mismatch record's `count << 8 | desc_code`: "oneshot-push all-reduce bfloat16
/// count 21504".
pub fn describe_call(packed: u64) -> (u64, String) {
    let code = packed & 0xff;
    let count = (packed >> 8) & ((1 << 48) - 1);
    let algo = Algorithm::from_code(code >> 4).map_or("unknown algorithm", |a| a.name());
    let dtype = DType::from_code(code & 0x3).map_or("unknown dtype", |d| d.name());
    let kind = if code as u32 & DESC_KIND == DESC_FUSED {
        let flags = (packed >> 56) as u32;
        format!("{} ({}{})", kind_name(code), pattern_name(flags), if flags & NORM_ROWS != 0 { ", rows owned" } else { "" })
    } else {
        kind_name(code).to_string()
    };
    (count, format!("{algo} {kind} {dtype} count {count}"))
}

/// A call as the kernels' descriptors, their mismatch records and checked captures pack it:
/// `pattern << 56 | count << 8 | desc_code's low byte` (counts below 2^48; the pattern is a
/// fused call's, `desc_code` bits 8-10; [`describe_call`] reads it back; desc.cuh packs the
/// same).
pub fn pack_call(count: usize, desc_code: u32) -> u64 {
    (u64::from((desc_code >> 8) & 0xff) << 56) | (((count as u64) & ((1 << 48) - 1)) << 8) | u64::from(desc_code & 0xff)
}

/// Captured call sequences ([`pack_call`] per call, one sequence per rank) compared across
/// ranks: the first call where they differ — the lowest call index, then the lowest rank that
/// differs from rank 0 there — as `(call, rank)`; `None` when every rank captured the same.
pub fn first_captured_difference(seqs: &[Vec<u64>]) -> Option<(usize, usize)> {
    let base = seqs.first()?;
    let n = seqs.iter().map(Vec::len).max().unwrap_or(0);
    (0..n).find_map(|k| seqs.iter().enumerate().skip(1).find(|(_, s)| s.get(k) != base.get(k)).map(|(r, _)| (k, r)))
}

/// The error `rank` reports for the difference `(call, differing)` that
/// [`first_captured_difference`] found: against the differing rank, or against rank 0 when
/// `rank` is the one that differs.
pub fn captured_mismatch(rank: usize, seqs: &[Vec<u64>], (k, differing): (usize, usize)) -> crate::error::Error {
    let peer = if differing == rank { 0 } else { differing };
    let call = |q: usize| seqs.get(q).and_then(|s| s.get(k)).copied();
    let at = |q: usize| match call(q) {
        Some(c) => describe_call(c).1,
        None => format!("no call (captured {} calls)", seqs.get(q).map_or(0, Vec::len)),
    };
    let field = match (call(rank), call(peer)) {
        (Some(a), Some(b)) => differing_field(a, b),
        _ => "number of captured calls",
    };
    crate::error::Error::Mismatch { rank, peer, field, ours: format!("{} at captured call {k}", at(rank)), theirs: at(peer) }
}

/// The error a rank's device record holds, if any: a timeout naming the peer and phase, or a
/// mismatch naming the peer and the field that differs. `where_` says which transport.
pub fn device_error(rec: &TparError, where_: &str) -> Option<crate::error::Error> {
    match rec.code {
        ERR_TIMEOUT => Some(crate::error::Error::Timeout {
            rank: rec.rank as usize,
            waited_ms: rec.waited_ns / 1_000_000,
            what: format!("rank {} in {} (block {}, call epoch {}); {where_}", rec.peer, phase_name(rec.phase), rec.block, rec.epoch),
        }),
        ERR_MISMATCH => {
            let ((_, ours), (_, theirs)) = (describe_call(rec.ours), describe_call(rec.theirs));
            let field = differing_field(rec.ours, rec.theirs);
            Some(crate::error::Error::Mismatch {
                rank: rec.rank as usize,
                peer: rec.peer as usize,
                field,
                ours: format!("{ours} (call epoch {})", rec.epoch),
                theirs,
            })
        }
        ERR_PEER_DIED => Some(crate::error::Error::PeerDied {
            rank: rec.rank as usize,
            peer: rec.peer as usize,
            during: format!("this rank's calls on the GPU, which waited for it (ended by the liveness watchdog); {where_}"),
        }),
        _ => None,
    }
}

/// Buffers of the push and pull regions (calls cycle through them; frame.cuh says why three).
pub const BUFS: usize = 3;

/// Per-rank device-local state. Twin of `struct TparState`: per-block epochs and buffer
/// indices (equal between calls), the error claim, and what the last two calls left in the
/// push region (for the clear one call behind).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TparState {
    pub epoch: [u32; MAX_BLOCKS],
    pub buf: [u8; MAX_BLOCKS],
    pub err_claim: u32,
    pub pad0: u32,
    pub prev_nvec: [u64; 2],
    pub prev_kind: [u32; 2],
}

// By hand: std derives Default for arrays of at most 32 elements.
impl Default for TparState {
    fn default() -> Self {
        Self { epoch: [0; MAX_BLOCKS], buf: [0; MAX_BLOCKS], err_claim: 0, pad0: 0, prev_nvec: [0; 2], prev_kind: [0; 2] }
    }
}

impl TparState {
    /// Idle state at `epoch`: every block at it, buffer 0, nothing left to clear.
    pub fn at(epoch: u32) -> Self {
        Self { epoch: [epoch; MAX_BLOCKS], ..Default::default() }
    }
}

/// Per-rank error record in pinned mapped host memory. Twin of `struct TparError`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TparError {
    pub code: u32,
    pub rank: u32,
    pub peer: u32,
    pub phase: u32,
    pub block: u32,
    pub epoch: u32,
    pub waited_ns: u64,
    /// ERR_MISMATCH: this rank's call, `count << 8 | desc_code`.
    pub ours: u64,
    /// ERR_MISMATCH: the peer's call, same packing.
    pub theirs: u64,
}

const _: () = {
    assert!(size_of::<TparArgs>() == 344);
    assert!(offset_of!(TparArgs, io) == 336);
    assert!(size_of::<TparIo>() == 256);
    assert!(offset_of!(TparIo, output) == 128);
    assert!(offset_of!(TparArgs, test_delay_ns) == 324);
    assert!(offset_of!(TparArgs, islands) == 328);
    assert!(offset_of!(TparArgs, desc_code) == 320);
    assert!(offset_of!(TparArgs, flags) == 128);
    assert!(offset_of!(TparArgs, state) == 256);
    assert!(offset_of!(TparArgs, count) == 288);
    assert!(offset_of!(TparArgs, timeout_ns) == 304);
    assert!(offset_of!(TparArgs, rank) == 312);
    assert!(size_of::<TparState>() == 352);
    assert!(offset_of!(TparState, buf) == 256);
    assert!(offset_of!(TparState, err_claim) == 320);
    assert!(offset_of!(TparState, prev_nvec) == 328);
    assert!(offset_of!(TparState, prev_kind) == 344);
    assert!(size_of::<TparError>() == 48);
    assert!(size_of::<TparNorm>() == 56);
    assert!(offset_of!(TparNorm, scale_out) == 48);
    assert!(offset_of!(TparNorm, scale) == 32);
    assert!(offset_of!(TparNorm, flags) == 40);
    assert!(size_of::<TparFusedArgs>() == 400);
    assert!(offset_of!(TparFusedArgs, n) == 344);
    assert!(offset_of!(TparNorm, hidden) == 24);
    assert!(size_of::<TparState>() <= SCRATCH_OFFSET);
    assert!(offset_of!(TparError, waited_ns) == 24);
    assert!(offset_of!(TparError, theirs) == 40);
};

/// Name of the wait that ran out, from an error record's `phase`.
pub fn phase_name(phase: u32) -> &'static str {
    match phase {
        1 => "push inbox poll",
        2 => "reduce-scatter inbox poll",
        3 => "all-gather poll",
        4 => "barrier 0",
        5 => "barrier 1",
        6 => "staged step",
        7 => "call-descriptor check",
        8 => "aborted (another thread of this rank failed first)",
        9 => "cross-island poll (hierarchical: that rank's island sum)",
        10 => "row norm poll (a fused call: this rank's own tile sums of squares)",
        11 => "copy-engine entry (ce-ring: that rank has not finished its previous call)",
        12 => "copy-engine reduce-scatter (ce-ring: that rank's chunk copies)",
        13 => "copy-engine all-gather (ce-ring: that rank's summed chunk)",
        _ => "unknown phase",
    }
}

/// Vectors in one slot that holds `max_bytes`.
pub fn slot_vecs(max_bytes: usize) -> usize {
    max_bytes.div_ceil(VEC_BYTES).max(1)
}

/// Bytes of a rank's data area (see the layout in frame.cuh):
/// push region `3(N+1)·S` vectors plus pull region `6·S` vectors.
pub fn data_bytes(world: usize, slot_vecs: usize) -> usize {
    (BUFS * (world + 1) + 2 * BUFS) * slot_vecs * VEC_BYTES
}

/// Bytes of the push region (the part that must hold the sentinel when idle).
pub fn push_region_bytes(world: usize, slot_vecs: usize) -> usize {
    BUFS * (world + 1) * slot_vecs * VEC_BYTES
}

/// Where the copy-engine path's descriptors start in a flag area (after the call
/// descriptors): `ce[3 phases][ce_ring::MAX_PIECES][MAX_RANKS]`, 16 bytes each
/// (`CE_FLAG_OFFSET` in kernels/ce_ring.cu).
pub const CE_FLAG_OFFSET: usize = 2 * MAX_BLOCKS * MAX_RANKS * 4 + BUFS * MAX_RANKS * VEC_BYTES;
/// Bytes of the copy-engine descriptors.
pub const CE_FLAG_BYTES: usize = 3 * crate::algorithms::ce_ring::MAX_PIECES * MAX_RANKS * VEC_BYTES;

/// Bytes of a rank's flag area: `flags[2][MAX_BLOCKS][MAX_RANKS]` u32 (barrier
/// generations), then `desc[3][MAX_RANKS]` 16-byte call descriptors, then the copy-engine
/// descriptors (appended: the offsets before them are unchanged).
pub const FLAG_BYTES: usize = CE_FLAG_OFFSET + CE_FLAG_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(calls: &[(Algorithm, DType, usize)]) -> Vec<u64> {
        calls.iter().map(|&(a, d, n)| pack_call(n, desc_code(a, d))).collect()
    }

    fn first_mismatch(rank: usize, seqs: &[Vec<u64>]) -> crate::error::Error {
        let d = first_captured_difference(seqs).expect("the sequences differ");
        captured_mismatch(rank, seqs, d)
    }

    #[test]
    fn a_mismatch_names_fused_or_the_collective() {
        let (a, d) = (Algorithm::OneshotPush, DType::BF16);
        let plain = u64::from(desc_code(a, d)) | 64 << 8;
        let fused = u64::from(fused_desc_code(a, d, NORM_RESIDUAL)) | 64 << 8;
        let gather = u64::from(collective_desc_code(a, d, Collective::AllGather)) | 64 << 8;
        let scatter = u64::from(collective_desc_code(a, d, Collective::ReduceScatter)) | 64 << 8;
        assert!(differing_field(plain, fused).starts_with("fused"));
        assert!(differing_field(fused, plain).starts_with("fused"));
        assert!(differing_field(plain, gather).starts_with("collective"));
        assert!(differing_field(gather, scatter).starts_with("collective"));
        assert!(differing_field(fused, scatter).starts_with("collective"));
        assert_eq!(differing_field(plain, plain + (1 << 8)), "count");
    }

    #[test]
    fn fused_patterns_differ_in_the_descriptor_and_a_mismatch_names_them() {
        let (a, d) = (Algorithm::TwoshotPush, DType::F16);
        // Every pattern, each with and without two-shot pull's row ownership (NORM_ROWS).
        let codes: Vec<u32> = (0..32).filter(|f| f & (NORM_FP8 | NORM_NVFP4) != (NORM_FP8 | NORM_NVFP4)).map(|f| fused_desc_code(a, d, f)).collect();
        for (i, x) in codes.iter().enumerate() {
            assert_eq!(*x & 0xff, fused_desc_code(a, d, 0) & 0xff, "the low byte is the call's kind");
            for y in &codes[i + 1..] {
                assert_ne!(pack_call(1 << 40, *x), pack_call(1 << 40, *y));
                let crate::error::Error::Mismatch { field, ours, theirs, .. } = mismatch_codes(*x, *y) else { panic!() };
                assert!(field.starts_with("fused pattern"), "{field}");
                let named = |c: u32| format!("({}{})", pattern_name(c >> 8), if (c >> 8) & NORM_ROWS != 0 { ", rows owned" } else { "" });
                assert!(ours.contains(&named(*x)) && theirs.contains(&named(*y)), "{ours} / {theirs}");
            }
        }
        assert_eq!(pattern_name(NORM_RESIDUAL | NORM_GEMMA | NORM_FP8), "add_rmsnorm_gemma_fp8");
        assert_eq!(pattern_name(0), "rmsnorm");
        assert_eq!(pattern_name(NORM_GEMMA | NORM_NVFP4), "rmsnorm_gemma_nvfp4");
        assert_eq!(describe_call(pack_call(1 << 40, fused_desc_code(a, d, NORM_FP8))).0, 1 << 40, "the pattern leaves the count alone");
        assert!(describe_call(pack_call(64, fused_desc_code(a, d, NORM_RESIDUAL | NORM_ROWS))).1.contains("(add_rmsnorm, rows owned)"));
        assert!(!describe_call(pack_call(64, fused_desc_code(a, d, NORM_RESIDUAL))).1.contains("rows owned"));
    }

    #[test]
    fn a_captured_mismatch_names_the_call_field_and_peer_on_every_rank() {
        let honest = seq(&[(Algorithm::OneshotPush, DType::BF16, 21504); 3]);
        let mut odd = honest.clone();
        odd[1] = pack_call(21504, desc_code(Algorithm::OneshotPush, DType::F16));
        let seqs = vec![honest.clone(), honest.clone(), odd];
        assert_eq!(first_captured_difference(&seqs), Some((1, 2)));
        assert_eq!(first_captured_difference(&[honest.clone(), honest.clone()]), None);
        for rank in 0..3 {
            match first_mismatch(rank, &seqs) {
                crate::error::Error::Mismatch { rank: r, peer, field, ours, theirs } => {
                    assert_eq!(r, rank);
                    assert_eq!(peer, if rank == 2 { 0 } else { 2 });
                    assert_eq!(field, "dtype");
                    assert!(ours.ends_with("at captured call 1"), "{ours}");
                    let (mine, other) = if rank == 2 { ("half", "bfloat16") } else { ("bfloat16", "half") };
                    assert!(ours.contains(mine) && theirs.contains(other), "{ours} / {theirs}");
                }
                e => panic!("expected a mismatch, got {e}"),
            }
        }
    }

    #[test]
    fn a_captured_mismatch_reports_a_shorter_sequence_and_counts() {
        let a = seq(&[(Algorithm::TwoshotPull, DType::F32, 100), (Algorithm::Nccl, DType::F32, 1 << 20)]);
        let short = a[..1].to_vec();
        match first_mismatch(1, &[a.clone(), short]) {
            crate::error::Error::Mismatch { field, ours, theirs, .. } => {
                assert_eq!(field, "number of captured calls");
                assert!(ours.starts_with("no call (captured 1 calls)"), "{ours}");
                assert!(theirs.contains("nccl"), "{theirs}");
            }
            e => panic!("expected a mismatch, got {e}"),
        }
        let mut b = a.clone();
        b[0] = pack_call(101, desc_code(Algorithm::TwoshotPull, DType::F32));
        assert!(matches!(first_mismatch(0, &[a, b]), crate::error::Error::Mismatch { field: "count", peer: 1, .. }));
    }

    fn mismatch(ours: (Algorithm, DType, u64), theirs: (Algorithm, DType, u64)) -> crate::error::Error {
        let pack = |(a, d, n): (Algorithm, DType, u64)| pack_call(n as usize, desc_code(a, d));
        let rec = TparError { code: ERR_MISMATCH, rank: 1, peer: 3, phase: 7, epoch: 42, ours: pack(ours), theirs: pack(theirs), ..Default::default() };
        device_error(&rec, "test").unwrap()
    }

    fn mismatch_codes(ours: u32, theirs: u32) -> crate::error::Error {
        let rec = TparError { code: ERR_MISMATCH, rank: 1, peer: 3, phase: 7, epoch: 42, ours: pack_call(100, ours), theirs: pack_call(100, theirs), ..Default::default() };
        device_error(&rec, "test").unwrap()
    }

    #[test]
    fn mismatch_records_name_the_field_and_both_calls() {
        let e = mismatch((Algorithm::OneshotPush, DType::BF16, 21504), (Algorithm::OneshotPush, DType::F16, 21504));
        let crate::error::Error::Mismatch { rank, peer, field, ours, theirs } = &e else { panic!("{e:?}") };
        assert_eq!((*rank, *peer, *field), (1, 3, "dtype"));
        assert_eq!(ours, "oneshot-push all-reduce bfloat16 count 21504 (call epoch 42)");
        assert_eq!(theirs, &format!("oneshot-push all-reduce {} count 21504", DType::F16.name()));
        let crate::error::Error::Mismatch { field, .. } = mismatch((Algorithm::OneshotPush, DType::BF16, 100), (Algorithm::TwoshotPush, DType::BF16, 100)) else { panic!() };
        assert_eq!(field, "algorithm");
        let crate::error::Error::Mismatch { field, theirs, .. } = mismatch((Algorithm::OneshotPush, DType::BF16, 100), (Algorithm::OneshotPush, DType::BF16, 1 << 40)) else { panic!() };
        assert_eq!(field, "count");
        assert!(theirs.ends_with(&format!("count {}", 1u64 << 40)), "{theirs}");
        let crate::error::Error::Mismatch { field, ours, .. } = mismatch_codes(fused_desc_code(Algorithm::OneshotPush, DType::BF16, NORM_RESIDUAL), desc_code(Algorithm::OneshotPush, DType::BF16)) else { panic!() };
        assert!(field.starts_with("fused"), "{field}");
        assert!(ours.starts_with("oneshot-push all-reduce fused with RMSNorm (add_rmsnorm) bfloat16 count 100"), "{ours}");
        // Every pair of collectives differs in the kind bits, whatever the counts.
        let codes = Collective::ALL.map(|k| collective_desc_code(Algorithm::OneshotPush, DType::F16, k));
        for (i, a) in codes.iter().enumerate() {
            for b in &codes[i + 1..] {
                let crate::error::Error::Mismatch { field, ours, theirs, .. } = mismatch_codes(*a, *b) else { panic!() };
                assert!(field.starts_with("collective"), "{field}");
                assert_ne!(ours.split(" count").next(), theirs.split(" count").next());
            }
        }
        assert!(describe_call(pack_call(7, codes[2])).1.contains(&format!("reduce-scatter {} count 7", DType::F16.name())), "{}", describe_call(pack_call(7, codes[2])).1);
        let ok = TparError::default();
        assert!(device_error(&ok, "test").is_none());
        let t = TparError { code: ERR_TIMEOUT, peer: 2, phase: 1, waited_ns: 3_000_000_000, ..Default::default() };
        assert!(matches!(device_error(&t, "x"), Some(crate::error::Error::Timeout { waited_ms: 3000, .. })));
    }
}
