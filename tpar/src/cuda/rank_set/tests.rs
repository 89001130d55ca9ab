//! Unit tests of the rank set's options (`super::SetOptions`): what reaches the launcher;
//! and of what a set's `call` takes.

use super::*;
use crate::dtype::DType;
use crate::kinds::{Backend, CaptureMode, Wire};
use crate::plan::{call_shape, plan, PlanInput};
use crate::settings::Settings;
use crate::topology::presets;

/// `TPAR_BLOCKS` is stored once (`Overrides::blocks`): a rank set's options carry that value
/// to the launcher, so a call the plan sized and a call it did not (a forced algorithm's,
/// given 0 blocks) are held to the same blocks; with it unset, both follow their rules. The
/// other plan settings the launch reads come from the same overrides.
#[test]
fn the_launcher_holds_the_blocks_the_plan_holds() {
    let topo = presets::h200_nvswitch_8();
    for (blocks, algo) in [("auto", "auto"), ("auto", "oneshot-push"), ("5", "auto"), ("5", "oneshot-push"), ("12", "twoshot-pull"), ("64", "oneshot-pull")] {
        let s = Settings::from_pairs([("TPAR_BLOCKS", blocks), ("TPAR_ALGO", algo), ("TPAR_CHECK_CALLS", "0"), ("TPAR_HOST_PROTOCOL", "flags"), ("TPAR_WIRE", "fp8")]).unwrap();
        let timeout = Duration::from_millis(1234);
        for (opts, want_timeout) in [(SetOptions::from_settings(Transport::P2p, &s), DEFAULT_TIMEOUT), (SetOptions::from_overrides(Transport::P2p, timeout, &s.overrides, s.launch), timeout)] {
            assert_eq!(opts.blocks, s.overrides.blocks, "TPAR_BLOCKS={blocks}");
            assert_eq!((opts.transport, opts.timeout, opts.launch), (Transport::P2p, want_timeout, s.launch));
            assert!(opts.islands.is_empty());
            assert_eq!((opts.check_calls, opts.host_protocol, opts.wire), (false, Some(HostProtocol::Flags), Wire::Fp8));
            for bytes in [4096u64, 1 << 20] {
                let p = plan(&PlanInput { topology: &topo, world: 8, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend: Backend::Cuda, profile: None, overrides: &s.overrides });
                // The launcher's answer for a call given no blocks (`Launcher::call_blocks`).
                let not_sized = call_shape::call_blocks(0, opts.blocks, || 3);
                match s.overrides.blocks {
                    Some(b) => {
                        assert_eq!(p.blocks, b, "TPAR_BLOCKS={blocks} TPAR_ALGO={algo} {bytes} B: {p}");
                        assert_eq!(not_sized, call_shape::CallBlocks::Held(p.blocks), "TPAR_BLOCKS={blocks} TPAR_ALGO={algo} {bytes} B: {p}");
                    }
                    None => assert_eq!(not_sized, call_shape::CallBlocks::Rule(3), "TPAR_ALGO={algo} {bytes} B"),
                }
            }
        }
    }
    let d = SetOptions::default();
    assert_eq!((d.blocks, d.check_calls, d.host_protocol, d.wire), (None, true, None, Wire::Exact));
}

/// A set's `call` takes the communicator's `Call` as it is, and refuses what a set cannot
/// honour, naming the field: no algorithm (a set has no plan), a caller's stream.
#[test]
fn a_set_runs_the_call_s_named_algorithm_and_refuses_what_it_cannot_honour() {
    use crate::cuda::Call;
    use crate::kinds::Collective;
    for algo in [Algorithm::OneshotPush, Algorithm::TwoshotPull, Algorithm::CeRing] {
        for c in [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter] {
            let call = Call::new(c, DType::BF16, 512, 0x1000, 0x2000).forced(Some(algo));
            assert_eq!(set_algorithm(&call).unwrap(), algo);
            assert_eq!(set_algorithm(&call.mode(CaptureMode::Graph)).unwrap(), algo);
        }
    }
    let planned = Call::all_reduce(DType::F16, 8, 0x1000, 0x1000);
    match set_algorithm(&planned) {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "algorithm"),
        other => panic!("a call with no algorithm: {other:?}"),
    }
    match set_algorithm(&planned.forced(Some(Algorithm::OneshotPush)).on_stream(7)) {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "stream"),
        other => panic!("a call on a caller's stream: {other:?}"),
    }
}
