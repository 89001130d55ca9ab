//! Plain-data structs shared with the kernels, defined once here and once in
//! `kernels/common.cuh`, with size and offset assertions on both sides.
//!
//! Owns: `TparArgs` (the one struct of peer pointers every kernel takes), `TparState`
//! (per-rank device-local epoch), `TparError` (per-rank host-visible error record), and the
//! workspace layout arithmetic. Must never change a field without changing the `.cuh` twin.

use std::mem::{offset_of, size_of};

/// Most ranks a kernel addresses (the length of the peer-pointer arrays).
pub const MAX_RANKS: usize = 16;
/// Most blocks per rank per call (the flag area has one slot row per block).
pub const MAX_BLOCKS: usize = 32;
const _: () = assert!(MAX_BLOCKS == crate::plan::MAX_KERNEL_BLOCKS as usize, "the plan's block cap is the kernels'");
/// Threads per block; kernels are compiled with `__launch_bounds__` of this.
pub const THREADS: u32 = 512;
/// Bytes of one vector, the unit the kernels move.
pub const VEC_BYTES: usize = 16;

/// Error code: a device-side wait passed its deadline.
pub const ERR_TIMEOUT: u32 = 1;

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
}

/// Per-rank device-local state. Twin of `struct TparState`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TparState {
    pub epoch: u32,
    pub done_blocks: u32,
    pub err_claim: u32,
    pub pad: [u32; 13],
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
}

const _: () = {
    assert!(size_of::<TparArgs>() == 320);
    assert!(offset_of!(TparArgs, flags) == 128);
    assert!(offset_of!(TparArgs, state) == 256);
    assert!(offset_of!(TparArgs, count) == 288);
    assert!(offset_of!(TparArgs, timeout_ns) == 304);
    assert!(offset_of!(TparArgs, rank) == 312);
    assert!(size_of::<TparState>() == 64);
    assert!(size_of::<TparError>() == 32);
    assert!(offset_of!(TparError, waited_ns) == 24);
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
        _ => "unknown phase",
    }
}

/// Vectors in one slot that holds `max_bytes`.
pub fn slot_vecs(max_bytes: usize) -> usize {
    max_bytes.div_ceil(VEC_BYTES).max(1)
}

/// Bytes of a rank's data area (see the layout in common.cuh):
/// push region `(2N+2)·S` vectors plus pull region `4·S` vectors.
pub fn data_bytes(world: usize, slot_vecs: usize) -> usize {
    (2 * world + 2 + 4) * slot_vecs * VEC_BYTES
}

/// Vectors of the push region (the part that must hold the sentinel when idle).
pub fn push_region_bytes(world: usize, slot_vecs: usize) -> usize {
    (2 * world + 2) * slot_vecs * VEC_BYTES
}

/// Bytes of a rank's flag area: `flags[2][MAX_BLOCKS][MAX_RANKS]` u32.
pub const FLAG_BYTES: usize = 2 * MAX_BLOCKS * MAX_RANKS * 4;
