//! Unit tests of the launch policy (`super`): blocks, threads, variants, residency.

use super::*;

#[test]
fn policy_is_the_plans_rule_capped_by_transport() {
    let a = Algorithm::OneshotPush;
    assert_eq!(policy_blocks(a, Transport::P2p, 1, 8), 1);
    assert_eq!(policy_blocks(a, Transport::P2p, 2048, 8), 1);
    assert_eq!(policy_blocks(a, Transport::P2p, 2049, 8), 2);
    assert_eq!(policy_blocks(a, Transport::P2p, 43008, 8), 21, "NVLink: one block per 2 KiB");
    assert_eq!(policy_blocks(a, Transport::P2p, 4 << 20, 8), P2P_MAX_BLOCKS);
    assert_eq!(policy_blocks(a, Transport::Host, 4 << 20, 8), HOST_MAX_BLOCKS);
    assert_eq!(policy_blocks(a, Transport::Host, 43008, 8), 6, "PCIe: one block per 8 KiB");
}

#[test]
fn threads_follow_the_blocks_one_vector_each() {
    // NVLink rule: 128 threads while the blocks are under their cap, then up to 512.
    assert_eq!(threads_for(1024, policy_blocks(Algorithm::OneshotPush, Transport::P2p, 1024, 8)), 128);
    assert_eq!(threads_for(43008, 21), 128);
    assert_eq!(threads_for(128 << 10, 32), 256);
    assert_eq!(threads_for(4 << 20, 32), THREADS);
    // PCIe rule (8 KiB per block): 448 threads for 2688 vectors on 6 blocks.
    assert_eq!(threads_for(43008, 6), 448);
    assert_eq!(threads_for(4 << 20, 8), THREADS);
    // An explicit small block count: as many threads as the kernels take.
    assert_eq!(threads_for(43008, 1), THREADS);
    for bytes in [1usize, 16, 1000, 43008, 1 << 20, 64 << 20] {
        for blocks in 1..=P2P_MAX_BLOCKS {
            let t = threads_for(bytes, blocks);
            assert!(t % 32 == 0 && (128..=THREADS).contains(&t), "{bytes} B on {blocks}: {t}");
            // frame_end lets thread b of block 0 advance block b's epoch.
            assert!(t >= MAX_BLOCKS as u32);
        }
    }
}

#[test]
fn the_add_rmsnorm_kernel_spreads_a_row_over_whole_warps() {
    assert_eq!(add_rmsnorm_threads(896), 448);
    assert_eq!(add_rmsnorm_threads(2048), 512);
    assert_eq!(add_rmsnorm_threads(512), 512);
    assert_eq!(add_rmsnorm_threads(32), 32);
    assert_eq!(add_rmsnorm_threads(1), 32);
    assert_eq!(add_rmsnorm_threads(360), 384);
}

#[test]
fn protocol_is_sentinel_over_p2p_and_by_world_or_forced_over_host() {
    for w in [2, 3, 4, 8, 16] {
        assert_eq!(push_protocol(Transport::P2p, w, Some(HostProtocol::Flags)), HostProtocol::Sentinel);
        assert_eq!(push_protocol(Transport::Host, w, None), HostProtocol::auto(w));
        assert_eq!(push_protocol(Transport::Host, w, Some(HostProtocol::Sentinel)), HostProtocol::Sentinel);
        assert_eq!(push_protocol(Transport::Host, w, Some(HostProtocol::Flags)), HostProtocol::Flags);
    }
    assert_eq!(protocol_defines(HostProtocol::Flags), vec!["-DTPAR_PROTO_FLAGS".to_string()]);
    assert!(protocol_defines(HostProtocol::Sentinel).is_empty());
}

#[test]
fn size_class_is_lean_for_large_calls_the_default_cannot_hold() {
    use crate::plan::floors::lean_min_bytes;
    for a in [Algorithm::OneshotPull, Algorithm::TwoshotPush, Algorithm::TwoshotPull] {
        let big = lean_min_bytes(a) as usize;
        assert_eq!(size_class(a, big - 1, None, false), SizeClass::Default, "{a}: below its size");
        assert_eq!(size_class(a, big, None, false), SizeClass::Lean, "{a}");
        assert_eq!(size_class(a, big, None, true), SizeClass::Default, "{a}: the default holds its grid");
        assert_eq!(size_class(a, 1, Some(true), true), SizeClass::Lean, "{a}: forced");
        assert_eq!(size_class(a, 64 << 20, Some(false), false), SizeClass::Default, "{a}: forced off");
        // 32-bit indices: never at 2^31 vectors or more.
        assert_eq!(size_class(a, VEC_BYTES << 31, Some(true), false), SizeClass::Default, "{a}: 2^31 vectors");
    }
    // No lean variant: never lean, whatever is forced.
    for a in [Algorithm::OneshotPush, Algorithm::StagedPush, Algorithm::Hierarchical] {
        assert_eq!(size_class(a, 64 << 20, None, false), SizeClass::Default, "{a}");
        assert_eq!(size_class(a, 64 << 20, Some(true), false), SizeClass::Default, "{a}");
    }
    assert_eq!(size_class_defines(SizeClass::Lean), vec!["-DTPAR_LEAN".to_string()]);
    assert!(size_class_defines(SizeClass::Default).is_empty());
    // One H200 (132 SMs), 8 ranks: 32 blocks of 512 threads need 512 resident slots.
    assert!(!holds_twice(32, 8, 132), "default, one 512-thread block per SM");
    assert!(!holds_twice(32, 8, 264), "lean: all resident, but not twice (no PDL)");
    assert!(holds_twice(16, 8, 264));
    assert!(holds_twice(32, 1, 132), "one rank per GPU: the default always holds");
}

#[test]
fn ranks_sharing_a_gpu_get_grids_that_hold_twice_below_the_wide_sizes() {
    use crate::plan::floors::{shared_gpu_blocks, NVLINK_WIDE_MIN_BYTES};
    let sms = 132; // one H200
    let wide = NVLINK_WIDE_MIN_BYTES;
    // A rank alone on its GPU: the policy's grid at every size.
    for bytes in [16 << 10, 256 << 10, wide - 1, wide, 64 << 20] {
        let p = policy_blocks(Algorithm::OneshotPull, Transport::P2p, bytes as usize, 8);
        assert_eq!(shared_gpu_blocks(p, bytes, 1, sms), p, "{bytes} B, one rank");
    }
    // 2 / 4 / 8 ranks on one GPU at 256 KiB (the policy: 32 blocks): 32, 16, 8, and each
    // grid holds twice with one 512-thread block per SM (the default variant).
    for (ranks, want) in [(2u32, 32u32), (4, 16), (8, 8)] {
        let g = shared_gpu_blocks(32, 256 << 10, ranks, sms);
        assert_eq!(g, want, "{ranks} ranks");
        assert!(holds_twice(g, ranks, sms), "{ranks} ranks: {g} blocks");
    }
    // Smaller grids stay; from the wide sizes on, the policy's grid again.
    assert_eq!(shared_gpu_blocks(6, 12 << 10, 8, sms), 6);
    assert_eq!(shared_gpu_blocks(32, wide - 1, 4, sms), 16);
    assert_eq!(shared_gpu_blocks(64, wide, 4, sms), 64);
    // Never zero blocks, however many ranks share however few SMs.
    assert_eq!(shared_gpu_blocks(32, 256 << 10, 16, 8), 1);
}

#[test]
fn a_fused_calls_row_is_one_cluster_where_its_blocks_hold_whole_rows() {
    // The policy's grid on p2p, 8 ranks (bf16 rows of 7168: 896 vectors a row).
    let shape = |rows: usize, hidden: usize, size: usize| {
        let bytes = rows * hidden * size;
        let grid = policy_blocks(Algorithm::OneshotPull, Transport::P2p, bytes, 8);
        let threads = threads_for(bytes, grid);
        (grid, threads, row_cluster(grid, threads, bytes, hidden * size))
    };
    assert_eq!(shape(1, 7168, 2), (7, 128, 7), "14 KiB: 7 blocks of 128, one row");
    assert_eq!(shape(3, 7168, 2), (21, 128, 7), "three clusters of 7");
    assert_eq!(shape(8, 7168, 2), (32, 224, 4), "at the 32-block cap a row is 4 blocks of 224");
    assert_eq!(shape(1, 4096, 2), (4, 128, 4));
    assert_eq!(shape(1, 8192, 2), (8, 128, 8));
    assert_eq!(shape(8, 8192, 2), (32, 256, 4));
    // Not whole rows, or not one vector a thread: no cluster.
    assert_eq!(shape(64, 7168, 2).2, 1, "64 rows: more than one vector a thread");
    assert_eq!(shape(1, 16384, 2).2, 1, "16 blocks a row: over the portable 8");
    assert_eq!(row_cluster(7, 128, 14336 + 16, 14336), 1, "the grid does not cover the call exactly");
    assert_eq!(row_cluster(7, 128, 14336, 14336 + 16), 1, "a row is not whole blocks");
    assert_eq!(row_cluster(1, 128, 2048, 2048), 1, "one block a row needs no cluster");
    assert_eq!(row_cluster(0, 0, 0, 0), 1);
    // Every cluster's blocks are one row: grid = rows x c.
    for rows in 1..=8usize {
        let (grid, _, c) = shape(rows, 7168, 2);
        if c > 1 {
            assert_eq!(grid as usize, rows * c as usize);
        }
    }
}

#[test]
fn a_launch_describes_its_grid_block_cluster_and_pdl() {
    let l = Launch { f: std::ptr::null_mut(), grid: 7, threads: 128, pdl: true, cluster: 7 };
    assert_eq!(l.describe(), "7x128 cluster 7 pdl");
    assert_eq!(Launch { cluster: 1, pdl: false, ..l }.describe(), "7x128", "no cluster, no PDL: neither named");
    assert_eq!(Launch { grid: 32, threads: 224, cluster: 1, ..l }.describe(), "32x224 pdl");
}

/// One call's decision as the launch path makes it today, for a call the plan did not size:
/// the block policy, the grid after the shared-GPU cap, threads, the variant where the default
/// holds twice / where a stand-in residency (2048 threads an SM) says, and the registered path.
fn decision_cell(algo: Algorithm, bytes: usize, world: usize, transport: Transport, ranks_on_device: u32, sms: u32) -> String {
    let policy = policy_blocks(algo, transport, bytes, world);
    let grid = crate::plan::call_shape::policy_grid(transport, bytes, P2P_MAX_BLOCKS, ranks_on_device, sms, false);
    assert!(grid <= policy, "the shared-GPU cap only lowers the policy's blocks");
    let threads = threads_for(bytes, grid);
    let holds = holds_twice(grid, ranks_on_device, 2048 / threads.max(1) * sms);
    let class = |c: SizeClass| match c {
        SizeClass::Default => 'd',
        SizeClass::Lean => 'l',
        SizeClass::Fused => 'f',
        SizeClass::FusedCluster => 'c',
        SizeClass::FusedRows => 'r',
    };
    format!("{policy}/{grid}/{threads}/{}{}{}", class(size_class(algo, bytes, None, true)), class(size_class(algo, bytes, None, holds)), u8::from(registers(algo, bytes, None)))
}

/// The per-call decision pinned over a grid of (algorithm, bytes, world, transport, ranks on
/// the GPU): moving where it is made must not change one cell. The table was written from the
/// decision before the move; for an intended change of policy, copy the table a failing run
/// writes (`target/decision_got.txt`) over it, and say why in the commit.
#[test]
fn the_per_call_decision_is_pinned() {
    let mut sizes = Vec::new();
    let mut bytes = 16usize;
    while bytes <= 1 << 30 {
        sizes.extend([bytes, bytes + bytes / 2]);
        bytes *= 2;
    }
    let mut rows = Vec::new();
    for algo in Algorithm::ALL {
        for transport in [Transport::P2p, Transport::Host] {
            for world in [2usize, 4, 8] {
                for ranks_on_device in [1u32, world as u32] {
                    let cells: Vec<String> = sizes.iter().map(|&b| decision_cell(algo, b, world, transport, ranks_on_device, 132)).collect();
                    rows.push(format!("{algo} {transport} w{world} r{ranks_on_device}: {}", cells.join(" ")));
                }
            }
        }
    }
    let got = format!("bytes: {}\n{}\n", sizes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(" "), rows.join("\n"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/launch/decision_pinned.txt");
    let want = include_str!("decision_pinned.txt");
    if got != want {
        let _ = std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/decision_got.txt"), &got);
        eprintln!("the decision now: target/decision_got.txt (copy it over {path} for an intended change)");
    }
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {i} of the per-call decision changed");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "the decision grid changed size");
}
