//! Thresholds (each with where its number came from) and the floor arithmetic left for the
//! one case the simulator does not time: a forced host transport (`TPAR_TRANSPORT=host`) on a
//! fabric with P2P. PCIe fabrics, with P2P or through host memory, are decided by the
//! calibrated simulator (`sim_cost`, docs/sim.md), not by floors; NVLink by thresholds measured
//! on H200s.

/// Most thread blocks a tpar kernel runs with (the flag area has a slot per block).
pub use crate::settings::MAX_KERNEL_BLOCKS;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// CPU ranks: one-shot push up to this size, two-shot push above. Re-measured after the CPU
/// bodies moved to flagged bulk copies (bench/results/2026-12-01-dev-2core-cpu-vs-mpi/README.md, "one-shot
/// limit"; 2-core development machine, median us, one-shot vs two-shot): 2 ranks float,
/// one-shot leads to 4 KiB (2 KiB 0.36 vs 0.43, 4 KiB 0.52 vs 0.60), ties at 8 KiB (1.37 vs
/// 1.39), trails from 16 KiB; 2 ranks bf16, two-shot leads from 1 KiB (0.54 vs 0.44); 4 ranks
/// (two per core), one-shot leads to 8 KiB (float 4 KiB 13.0 vs 20.4, bf16 8 KiB 20.9 vs
/// 23.0). The plan's limit is one byte count for every dtype and world: 4 KiB costs 2-rank
/// bf16 a quarter of a microsecond at 1-4 KiB and keeps the larger wins at 4 ranks.
pub const CPU_ONESHOT_MAX_BYTES: u64 = 4 * KIB;

/// CPU ranks: bytes per epoch of a large call (a step of the chunk loop in `comm.rs`; a call
/// up to twice this runs in one epoch). Measured (bench/results/2026-12-01-dev-2core-cpu-vs-mpi/README.md, "step
/// size"), 2 ranks, two-shot push float, three alternating runs: steps of 256 KiB / 512 KiB /
/// 1 MiB / 2 MiB took 158-162 / 122-124 / 135-148 / 136-138 us at 2 MiB and 1143-1194 /
/// 960-991 / 944-1174 / 1203-1284 us at 8 MiB. Smaller steps pay a wait per step (and a
/// wait that yields, a scheduling round trip); larger ones fall out of the 1 MiB L2.
pub const CPU_STEP_BYTES: u64 = 512 * KIB;

/// NVLink, 2 ranks: one-shot push up to this size, two-shot above. Measured on 4 H200s
/// (NV18 each pair), one process per GPU, bf16 in CUDA graphs, with one block per 8 KiB
/// (bench/results/2026-11-29-h200-x4-all-algorithms/README.md, blocks sweep): one-shot stays ahead to 1 MiB (9.05 vs 10.67
/// us). (The 64 KiB measured on 2 H200s earlier was an artefact of 32 KiB per block.)
pub const NVLINK_ONESHOT_MAX_BYTES_2: u64 = MIB;
/// NVLink, 3 or 4 ranks: one-shot push up to this size, two-shot above. Measured on 4 H200s
/// (bench/results/2026-11-29-h200-x4-all-algorithms/README.md, blocks sweep, 4 ranks): one-shot 8.99 vs two-shot 9.71 us at
/// 256 KiB, 13.39 vs 10.57 us at 512 KiB. vLLM's dispatch uses 512 KB.
pub const NVLINK_ONESHOT_MAX_BYTES_4: u64 = 256 * KIB;
/// NVLink, more than 4 ranks: one-shot push up to this size, two-shot above (not measured:
/// no 8-GPU machine yet). After: vLLM custom_all_reduce dispatch (1-stage below 256 KB at
/// <= 8 ranks). Floor (docs/references.md): 7 x 256 KiB at 370 GB/s is 5.0 us, where two-shot's
/// 2(n-1)/n S starts to pay.
pub const NVLINK_ONESHOT_MAX_BYTES_8: u64 = 256 * KIB;
/// NVLink: tpar's kernels up to this size, NCCL above (bandwidth-bound; NCCL's rings are
/// tuned for it). Measured on H200s, 2, 3 and 4 ranks (bench/results/2026-11-29-h200-x4-all-algorithms/README.md): two-shot
/// leads NCCL to 2 MiB and NCCL leads from 4 MiB (4 ranks, 4 MiB: 39.8 vs 43.7 us).
/// vLLM's custom all-reduce defaults to 8 MiB.
pub const NVLINK_CUSTOM_MAX_BYTES: u64 = 2 * MIB;

/// PCIe with P2P: tpar's kernels up to this size, NCCL above. docs/references.md, 4x RTX PRO 6000:
/// custom one-shot 104 us vs NCCL 109 us at 1 MB — the latency advantage is gone by 1 MiB.
pub const PCIE_CUSTOM_MAX_BYTES: u64 = MIB;

/// P2P write bandwidth as a fraction of the link's spec bandwidth: 53 / 63 GB/s
/// (docs/references.md: 53-56.6 GB/s measured P2P writes on Gen5 x16, 63 GB/s spec).
pub const P2P_WRITE_EFFICIENCY: f64 = 53.0 / 63.0;
/// Latency of a copy through host memory when GPUs have no P2P, us
/// (docs/references.md: about 14 us, rtx6kpro pcie-bandwidth.md).
pub const HOST_COPY_LATENCY_US: f64 = 14.0;
/// NCCL's small-message floor on 8 PCIe GPUs, us (docs/references.md: 8x RTX 4090 about 42 us at
/// 8 B, nccl #1530; 8x RTX 3090 about 54 us). The lower figure, to favour NCCL when unsure.
pub const NCCL_PCIE_FLOOR_US: f64 = 42.0;

/// Most blocks a PCIe kernel uses: few, since PCIe fabrics collapse when every SM writes.
/// The only PCIe measurement so far is the host transport (pinned host memory over one H200's
/// Gen5 x16 link, 4 emulated ranks, 122 x 42 KiB in a graph; bench/results/2026-12-01-h200-merged-head-verify/README.md):
/// one block per 8 KiB (6 at 42 KiB) took 18.6 us per call (two-shot push) and 27.9 (one-shot),
/// a single block 20.6 and 34.2. Peer-to-peer PCIe not measured.
pub const PCIE_MAX_BLOCKS: u32 = 8;
/// Bytes per block on PCIe before another block is added (the measurement above).
pub const PCIE_BYTES_PER_BLOCK: u64 = 8 * KIB;
/// Most blocks an NVLink kernel uses below [`NVLINK_WIDE_MIN_BYTES`]. Measured on 4 H200s
/// (blocks sweep, bench/results/2026-11-29-h200-x4-all-algorithms/README.md): at 1 MiB, 32 blocks beat 16 (one-shot, 4 ranks:
/// 18.75 vs 25.66 us). 64 did worse below 2 MiB on one H200 with emulated ranks
/// (bench/results/2026-12-02-h200-peer-loads-registered-reduce/README.md: 256 KiB one-shot pull 5.21 -> 5.53 us at 4 ranks, 8.09 ->
/// 8.93 at 8; 1 MiB two-shot pull 5.40 -> 5.56 at 2).
pub const NVLINK_MAX_BLOCKS: u32 = 32;
/// From this size on, NVLink kernels may use [`NVLINK_WIDE_MAX_BLOCKS`]: the registered
/// reduce is bound by how many SMs move the bytes. One H200, emulated ranks, bf16, graphs
/// (bench/results/2026-12-02-h200-peer-loads-registered-reduce/blocks-64/): two-shot pull at 2 ranks 4 MiB 10.06 us on 32
/// blocks, 8.04 on 64 (40: 10.25, 48: 9.40, 56: 8.87); 16 MiB 32.37 -> 25.83; 4 ranks 4 MiB
/// 11.65 -> 11.49, 16 MiB 43.73 -> 43.02. Where the ranks share one GPU the launcher lowers the
/// grid until every rank's blocks are resident (8 emulated ranks: as before).
pub const NVLINK_WIDE_MIN_BYTES: u64 = 2 * MIB;
/// Most blocks of a call of at least [`NVLINK_WIDE_MIN_BYTES`]: the kernels' cap.
pub const NVLINK_WIDE_MAX_BLOCKS: u32 = MAX_KERNEL_BLOCKS;
/// Ranks that share one GPU, for calls the plan did not size (every call of emulated ranks;
/// a forced algorithm; a communicator's kernel standing in for NCCL): below
/// [`NVLINK_WIDE_MIN_BYTES`] a call's grid is at most the GPU's SMs over twice the ranks, so
/// that every rank's running grid and its next one (programmatic dependent launch) each have
/// SMs of their own. A rank alone on its GPU is never limited (132 SMs / 2 = 66 blocks, above
/// [`NVLINK_MAX_BLOCKS`]). One H200, emulated ranks, bf16, graphs of 20 calls, PDL on, us per
/// call, the policy's grid against this one (bench/results/2026-12-02-h200-pull-copy-shared-grid/shared-gpu-grid/): 4 ranks
/// (16 blocks instead of 32) 256 KiB one-shot pull zero copy 3.99 vs 4.80 (at 32 blocks the
/// default variant cannot hold two grids of every rank: PDL was off), two-shot pull 4.49 vs
/// 5.63, 1 MiB two-shot pull 5.28 vs 5.98; 8 ranks (8 instead of 21-32) 122 x 42 KiB one-shot
/// pull 3.66 vs 3.87, 256 KiB two-shot pull 5.68 vs 7.27, 1 MiB 7.40 vs 8.52; one-shot push,
/// which the plan does not pick there, loses (8 ranks 64 KiB 6.01 vs 5.55). From 2 MiB the
/// wide grid wins where it differs (4 ranks 4 MiB two-shot pull 10.20 on the policy's 64
/// blocks against 10.66 on 16; 2 ranks 4 MiB 6.43 on 64 against 6.95 on 32). Fused calls keep
/// the policy's grid (8 ranks, 7168 x 8 rows: 9.47 us on 8 blocks against 8.08).
pub fn shared_gpu_blocks(planned: u32, bytes: u64, ranks_on_device: u32, sms: u32) -> u32 {
    if ranks_on_device <= 1 || bytes >= NVLINK_WIDE_MIN_BYTES {
        return planned;
    }
    planned.min((sms / (2 * ranks_on_device)).max(1))
}
/// Bytes per block on NVLink before another block is added: one 16-byte vector per thread
/// of a [`NVLINK_MIN_THREADS`]-thread block. An SM moves only so many bytes per cycle to
/// memory and peers, so small calls go faster spread over many small blocks (many SMs) than
/// over a few large ones. Measured on one H200 with 8 emulated ranks, 122 x 42 KiB bf16 in a
/// graph (bench/results/2026-12-01-h200-speed-targets/README.md): 6 blocks of 512 threads 5.94 us per call
/// (one-shot push), 12 of 256 5.09, 21 of 128 4.50; 3 blocks of 512, 10.45. On 4 H200s
/// (blocks sweep, 512 threads): one-shot at 32 KiB, 4 ranks, took 11.62 us on one block and
/// 5.53 us on four.
pub const NVLINK_BYTES_PER_BLOCK: u64 = 2 * KIB;
/// Fewest threads per block ([`kernel_threads`]): on NVLink, the threads of a block while
/// the blocks are below their cap (past it, threads grow to [`MAX_KERNEL_THREADS`]).
pub const NVLINK_MIN_THREADS: u32 = 128;
/// Most threads per block (the kernels' `__launch_bounds__`, `TPAR_THREADS` in common.cuh).
pub const MAX_KERNEL_THREADS: u32 = 512;


/// Smallest call (bytes) of `algo` that runs its kernel's lean variant (where it has one and
/// the default variant cannot keep the grid resident: `cuda::launch::size_class`,
/// docs/cuda.md "Variants"). Measured on one H200, 8 emulated ranks, bf16, graphs of 20
/// calls, us per call default -> lean with peer groups of 4 (bench/results/2026-12-01-h200-lean-variants/README.md,
/// exploration; one-shot pull and two-shot push ship with groups of 3, final call 4 MiB 70.6
/// and 69.6): one-shot pull gains from 128 KiB (6.50 -> 5.90; 256 KiB 8.79 -> 7.71, 4 MiB 87.4 -> 65.5;
/// 64 KiB loses, 4.85 -> 5.19, but there the default holds its grid); two-shot push loses
/// at 256-512 KiB (9.76 -> 10.38, 11.93 -> 12.43) and gains from 1 MiB (22.22 -> 20.85);
/// two-shot pull loses to 1 MiB (15.82 -> 16.64) and gains from 2 MiB (28.22 -> 24.70,
/// 4 MiB 49.96 -> 43.43). Other algorithms have no lean variant (never reached).
pub fn lean_min_bytes(algo: crate::kinds::Algorithm) -> u64 {
    use crate::kinds::Algorithm as A;
    match algo {
        A::OneshotPull => 128 * KIB,
        A::TwoshotPush => MIB,
        A::TwoshotPull => 2 * MIB,
        _ => u64::MAX,
    }
}

/// Smallest graph-captured call (bytes) of `algo` that runs registered, i.e. zero copy: the
/// pull kernels read every rank's input in place (and two-shot writes every rank's output)
/// instead of copying the input into the workspace (`cuda::launch::registers`, io.cuh).
/// Measured on one H200, 2/4/8 emulated ranks, bf16, graphs of 20 calls, PDL on, us per call
/// zero copy vs copy (bench/results/2026-12-02-h200-large-zero-copy-graph/): two-shot pull gains at every
/// size (8 ranks: 1 KiB 5.18 vs 8.71, 1 MiB 9.65 vs 15.88, 16 MiB 80.22 vs 156.37; 2 ranks
/// 16 MiB 32.35 vs 94.02); one-shot pull loses to 256 KiB (its end barrier costs more than
/// the copy saves: 8 ranks 256 KiB 10.25 vs 8.06, 2 ranks 3.58 vs 4.41) and gains from 1 MiB
/// at 2 and 4 ranks (6.38 vs 7.58, 9.91 vs 11.73; at 8 ranks 19.35 vs 18.00, where the plan
/// never picks one-shot). Measured after relaxing (bench/results/2026-12-02-h200-registered-barriers-arithmetic/barriers/) the registered
/// barriers (io.cuh); one-shot pull zero copy at 256 KiB is then 3.30 us against the copy's
/// 3.54 at 2 ranks (where the plan runs one-shot push, 2.82), 5.22-5.28 against 5.15-5.26 at
/// 4, 8.48-8.66 against 7.99-8.05 at 8: nowhere a win the plan would take, so 1 MiB stayed.
/// With (bench/results/2026-12-02-h200-pull-copy-shared-grid/shared-gpu-grid/: no canonical-form pass on the pull
/// paths' loads, and the grid of [`shared_gpu_blocks`] under which PDL stays on): zero copy
/// against copy, us, 4 ranks 256 KiB 3.99 vs 4.78, 8 ranks 256 KiB 6.61 vs 8.86, 2 ranks
/// 256 KiB 2.94 vs 3.20; at 64 KiB 3.33 vs 3.34 (4 ranks) but 4.68 vs 4.55 (8), at 16 KiB 4.26
/// vs 3.75 (8): one-shot pull runs registered from 256 KiB.
pub fn registered_min_bytes(algo: crate::kinds::Algorithm) -> u64 {
    use crate::kinds::Algorithm as A;
    match algo {
        A::TwoshotPull => 0,
        A::OneshotPull => 256 * KIB,
        _ => u64::MAX,
    }
}

/// NVLink, calls captured in a CUDA graph (registered: two-shot pull runs zero copy), per
/// world (<= 2, <= 4, more): one-shot push up to the first size, one-shot pull (copy) up to
/// the second, two-shot pull above, tpar's kernels up to [`NVLINK_GRAPH_CUSTOM_MAX_BYTES`].
/// Measured on one H200 with emulated ranks (every peer is local memory, as on NVSwitch),
/// bf16, graphs, PDL on, us per call (bench/results/2026-12-02-h200-large-zero-copy-graph/README.md):
/// - 2 ranks: one-shot push 2.88 at 256 KiB (two-shot pull 4.66), 8.12 at 1 MiB (two-shot
///   pull 5.41): the cut between them, at 512 KiB, interpolated; one-shot pull never leads.
/// - 4 ranks: one-shot push 3.32 at 64 KiB (pull 3.83); at 256 KiB pull 5.15, push 5.43,
///   two-shot pull 6.62; at 1 MiB two-shot pull 6.97, one-shot pull 9.91.
/// - 8 ranks: push 4.00-4.34 at 1-16 KiB (pull 3.80-3.97 with PDL, but 5.13-5.47 against
///   push's 4.84-5.37 without: push stays), pull from 32 KiB (the 122 x 42 KiB step 4.12 vs
///   push 4.42; 64 KiB 4.83 vs 5.59; 256 KiB 8.06 vs two-shot pull 8.80), two-shot pull from
///   1 MiB (9.65 vs one-shot pull 18.00). With (bench/results/2026-12-02-h200-registered-barriers-arithmetic/cheaper-arithmetic/:
///   cheaper reduce arithmetic, relaxed registered barriers): at 256 KiB two-shot pull 7.41 /
///   7.32 us against one-shot pull's 7.98 / 7.80 (two runs; vLLM 8.42 / 8.29), so two-shot
///   from above 128 KiB (the cut between 64 KiB, where one-shot pull leads, and 256 KiB,
///   interpolated).
///
/// Eager calls keep the rule above (no registration; copy-path measurements unchanged).
/// Rank processes do not register their graph buffers yet: there two-shot pull copies.
pub const NVLINK_GRAPH_RULE: [(u64, u64); 3] = [(512 * KIB, 512 * KIB), (64 * KIB, 256 * KIB), (16 * KIB, 128 * KIB)];
/// NVLink, CUDA graphs: tpar's kernels up to this size, NCCL above. Two-shot pull zero copy
/// against vLLM's kernel at 16 MiB (same run as [`NVLINK_GRAPH_RULE`]): 32.35 vs 41.48 us
/// (2 ranks), 43.22 vs 57.90 (4), 80.22 vs 94.16 (8); at 4 MiB 10.06 vs 7.82, 11.57 vs 16.87,
/// 24.76 vs 29.65. NCCL cannot run two ranks on one GPU, so it was not in that run; vLLM
/// hands over to NCCL from 8 MiB by default. Above 16 MiB: not measured.
pub const NVLINK_GRAPH_CUSTOM_MAX_BYTES: u64 = 16 * MIB;

/// Threads per block for a call of `bytes` on `blocks` blocks (the other half of
/// [`kernel_blocks`]): one 16-byte vector per thread, rounded up to whole warps, at least
/// [`NVLINK_MIN_THREADS`] and at most [`MAX_KERNEL_THREADS`]. Under the NVLink rule that is
/// 128 threads until the blocks reach their cap, then more threads per block; under the PCIe
/// rule, 512 threads from 8 KiB on.
pub fn kernel_threads(bytes: u64, blocks: u32) -> u32 {
    let per_block = bytes.div_ceil(16).div_ceil(u64::from(blocks.max(1)));
    let t = per_block.div_ceil(32).saturating_mul(32);
    u32::try_from(t).unwrap_or(u32::MAX).clamp(NVLINK_MIN_THREADS, MAX_KERNEL_THREADS)
}

/// Transfer time of `bytes` at `gbps`, us.
pub(crate) fn xfer_us(bytes: f64, gbps: f64) -> f64 {
    if gbps <= 0.0 {
        f64::INFINITY
    } else {
        bytes / (gbps * 1e3)
    }
}


/// One-shot through host memory: write S once, read the other n-1 inputs, through one link.
pub(crate) fn host_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    HOST_COPY_LATENCY_US + xfer_us(n as f64 * s as f64, gbps)
}

/// NCCL: its small-message floor plus a ring's 2(n-1)/n·S.
pub(crate) fn nccl_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    let n_f = n as f64;
    NCCL_PCIE_FLOOR_US + xfer_us(2.0 * (n_f - 1.0) / n_f * s as f64, gbps)
}

/// Which block rule a call follows: where the bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockClass {
    /// NVLink peers, or one GPU's own memory (emulated ranks over p2p): many SMs pay.
    NvLink,
    /// PCIe: peer memory behind switches or the root complex, or pinned host memory.
    Pcie,
}

/// The block policy, the one place it lives: thread blocks per rank for a call of `bytes`.
/// NVLink: one block per [`NVLINK_BYTES_PER_BLOCK`], at most [`NVLINK_MAX_BLOCKS`] (from
/// [`NVLINK_WIDE_MIN_BYTES`] on, [`NVLINK_WIDE_MAX_BLOCKS`]); PCIe:
/// one per [`PCIE_BYTES_PER_BLOCK`], at most [`PCIE_MAX_BLOCKS`]. The plan calls it for its
/// decisions and the CUDA launch layer for calls the plan did not size (forced algorithms,
/// emulated ranks); `TPAR_BLOCKS` overrides both.
pub fn kernel_blocks(bytes: u64, class: BlockClass) -> u32 {
    let (per_block, max) = match class {
        BlockClass::NvLink if bytes >= NVLINK_WIDE_MIN_BYTES => (NVLINK_BYTES_PER_BLOCK, NVLINK_WIDE_MAX_BLOCKS),
        BlockClass::NvLink => (NVLINK_BYTES_PER_BLOCK, NVLINK_MAX_BLOCKS),
        BlockClass::Pcie => (PCIE_BYTES_PER_BLOCK, PCIE_MAX_BLOCKS),
    };
    let want = bytes.div_ceil(per_block.max(1)).max(1);
    u32::try_from(want).unwrap_or(u32::MAX).min(max)
}

