//! The CUDA backend on a machine without CUDA (CI): nothing panics, every absence is an
//! error that says what to install, and the pure parts (layout, cache key) hold.
#![cfg(feature = "cuda")]

mod common;
use tpar::cuda::kernels::sources;
use tpar::cuda::{abi, nccl, nvrtc, RankSet, SetOptions};
use tpar::Error;

#[test]
fn emulated_group_without_a_driver_is_an_error_not_a_panic() {
    match RankSet::emulated(0, 2, 1 << 16, SetOptions::default()) {
        // A machine with a GPU and NVRTC (the GPU machine) may build one: then there is no
        // missing driver to report, and the test says so.
        Ok(g) => {
            assert_eq!(g.world(), 2);
            common::skip("cuda_no_gpu::emulated_group_without_a_driver_is_an_error_not_a_panic", "a CUDA driver and GPU are here: the error for their absence is not checked");
        }
        Err(e) => {
            let s = e.to_string();
            assert!(matches!(e, Error::Library { .. } | Error::Cuda { .. }), "unexpected error kind: {s}");
        }
    }
}

#[test]
fn bad_worlds_are_refused_before_touching_cuda() {
    for w in [0usize, 1, abi::MAX_RANKS + 1] {
        let e = RankSet::emulated(0, w, 1 << 16, SetOptions::default()).err();
        assert!(matches!(e, Some(Error::InvalidArgument { field: "world", .. })), "world {w}: {e:?}");
    }
}

#[test]
fn missing_nccl_says_what_to_install() {
    match nccl::load() {
        Ok(n) => {
            assert!(!n.path.is_empty());
            common::skip("cuda_no_gpu::missing_nccl_says_what_to_install", &format!("NCCL is here ({}): the message for its absence is not checked", n.path));
        }
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains("nvidia-nccl-cu13") && s.contains("TPAR_NCCL_LIB"), "{s}");
        }
    }
}

#[test]
fn layout_sizes_cover_every_region() {
    let s = abi::slot_vecs(43008);
    assert_eq!(s, 2688);
    assert_eq!(abi::slot_vecs(1), 1);
    // three buffers: push region 3(N+1)·S plus pull region 3·2·S.
    assert_eq!(abi::data_bytes(8, s), (3 * (8 + 1) + 6) * s * 16);
    assert_eq!(abi::push_region_bytes(8, s), 3 * (8 + 1) * s * 16);
    // barrier flags [2][64 blocks][16 ranks] u32, then call descriptors [3][16 ranks] x 16 B
    // (the kernels put the descriptors at byte 2*64*16*4: TPAR_DESC_OFFSET in frame.cuh),
    // then the copy-engine ring's descriptors, appended so the offsets before them hold.
    assert_eq!(abi::CE_FLAG_OFFSET, 2 * 64 * 16 * 4 + 3 * 16 * 16);
    assert_eq!(abi::FLAG_BYTES, abi::CE_FLAG_OFFSET + abi::CE_FLAG_BYTES);
    assert_eq!(abi::CE_FLAG_BYTES, 3 * tpar::algorithms::ce_ring::MAX_PIECES * 16 * 16);
    assert!(tpar::cuda::kernels::header().contains("#define TPAR_DESC_OFFSET (2u * TPAR_MAX_BLOCKS * TPAR_MAX_RANKS * 4u)"));
    assert!(tpar::cuda::kernels::header().contains("#define TPAR_BUFS 3u"));
    assert_eq!(abi::BUFS, 3);
}

#[test]
fn the_block_policy_is_one_function_reading_no_environment() {
    use tpar::cuda::launch;
    use tpar::{Algorithm, Transport};
    // NVLink / one GPU: one block per 2 KiB, 128 threads each (one 16-byte vector per thread).
    // TPAR_BLOCKS is applied by the plan and by the launcher (its `Overrides::blocks`), not here.
    assert_eq!(launch::policy_blocks(Algorithm::OneshotPush, Transport::P2p, 43008, 8), 21);
    assert_eq!(launch::threads_for(43008, 21), 128);
    assert_eq!(launch::policy_blocks(Algorithm::TwoshotPush, Transport::Host, 16 << 20, 8), launch::HOST_MAX_BLOCKS);
}

#[test]
fn cache_key_names_source_arch_and_nvrtc_version() {
    let v = nvrtc::NvrtcVersion { major: 13, minor: 0 };
    let k90 = nvrtc::cache_key(&sources().next().unwrap(), "sm_90", v);
    let k80 = nvrtc::cache_key(&sources().next().unwrap(), "sm_80", v);
    let k_other = nvrtc::cache_key(&sources().nth(1).unwrap(), "sm_90", v);
    let k_newer = nvrtc::cache_key(&sources().next().unwrap(), "sm_90", nvrtc::NvrtcVersion { major: 13, minor: 1 });
    assert!(k90.contains("sm_90") && k90.contains("nvrtc13.0"));
    assert_ne!(k90, k80);
    assert_ne!(k90, k_other);
    assert_ne!(k90, k_newer);
}

#[test]
fn host_workspaces_across_processes_need_a_driver_and_refuse_other_transports() {
    use tpar::cuda::{RankSet, SetOptions};
    use tpar::Transport;
    use std::time::Duration;
    let opts = |transport| SetOptions { transport, timeout: Duration::from_secs(1), ..SetOptions::default() };
    // Not a kernel transport: refused before CUDA is touched, for either placement.
    for bad in [Transport::Shm, Transport::Nccl] {
        let e = RankSet::process(0, 0, 2, 1 << 16, 1, opts(bad)).err();
        assert!(matches!(e, Some(Error::Unsupported { .. })), "{bad}: {e:?}");
        let e = RankSet::emulated(0, 2, 1 << 16, opts(bad)).err();
        assert!(matches!(e, Some(Error::Unsupported { .. })), "{bad}: {e:?}");
    }
    // Without a GPU: an error naming the library, never a panic, and no segment left behind.
    let job = 0x7e57_0000_0000_0000 | u64::from(std::process::id());
    match RankSet::process(0, 0, 2, 1 << 16, job, opts(Transport::Host)) {
        Ok(ws) => {
            assert_eq!(ws.transport(), Transport::Host);
            common::skip("cuda_no_gpu::host_workspaces_across_processes_need_a_driver_and_refuse_other_transports", "a CUDA driver is here: the error for its absence is not checked (the refusals are)");
        }
        Err(e) => assert!(matches!(e, Error::Library { .. } | Error::Cuda { .. }), "{e}"),
    }
    assert!(tpar::transport::shm::leftover_segments(&format!("{job:016x}")).is_empty());
}

/// `TPAR_BLOCKS` reaches the launcher from the overrides the plan reads (stored once): a call
/// given no blocks (as a forced algorithm's, the tune's or an emulated group's) runs on the
/// blocks the plan holds its calls to, and on the policy's without it. Needs a GPU and NVRTC
/// for the launch itself; without them it says it skipped.
#[test]
fn a_call_given_no_blocks_runs_on_the_plans_tpar_blocks() {
    use tpar::plan::{plan, PlanInput};
    use tpar::{Algorithm, Backend, CaptureMode, DType, Settings, Transport};
    let name = "cuda_no_gpu::a_call_given_no_blocks_runs_on_the_plans_tpar_blocks";
    let bytes = 256usize << 10;
    let grid = |s: &Settings| -> Result<u32, Error> {
        let mut g = RankSet::emulated(0, 2, 1 << 20, SetOptions::from_settings(Transport::P2p, s))?;
        Ok(g.resolve(Algorithm::OneshotPush, DType::F32, bytes, 0)?.grid)
    };
    let set = Settings::from_pairs([("TPAR_BLOCKS", "5"), ("TPAR_ALGO", "oneshot-push")]).unwrap();
    let unset = Settings::from_pairs([("TPAR_ALGO", "oneshot-push")]).unwrap();
    let topo = tpar::topology::presets::h200_nvswitch_8();
    let planned = plan(&PlanInput { topology: &topo, world: 2, bytes: bytes as u64, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &set.overrides });
    assert_eq!((planned.algorithm, planned.blocks), (Algorithm::OneshotPush, 5), "{planned}");
    match (grid(&set), grid(&unset)) {
        (Ok(held), Ok(policy)) => {
            assert_eq!(held, planned.blocks, "the launcher's blocks for a call given none");
            assert_ne!(policy, held, "without TPAR_BLOCKS the policy sizes the call");
        }
        (Err(e), _) | (_, Err(e)) => {
            assert!(matches!(e, Error::Library { .. } | Error::Cuda { .. }), "{e}");
            common::skip(name, &format!("no GPU and NVRTC to launch on ({e}): the launcher's blocks are not checked (the options' are, in the unit tests)"));
        }
    }
}
