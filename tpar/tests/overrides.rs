//! Every bad `TPAR_*` setting is refused, naming the variable or the reason.

use tpar::plan::{plan, plan_fingerprint, Backend, CaptureMode, Overrides, PlanInput};
use tpar::profile::{Profile, ProfileFingerprint};
use tpar::topology::{presets, Topology};
use tpar::{Algorithm, DType, Error, Transport};

fn parse(pairs: &[(&str, &str)]) -> tpar::Result<Overrides> {
    Overrides::from_pairs(pairs.iter().copied())
}

#[test]
fn malformed_values_are_config_errors_naming_the_variable() {
    for (var, value) in [
        ("TPAR_ALGO", "oneshot"),
        ("TPAR_ALGO", "ring"),
        ("TPAR_TRANSPORT", "nvlink"),
        ("TPAR_MAX_BYTES", "12Q"),
        ("TPAR_MAX_BYTES", "-5"),
        ("TPAR_DISABLE", "maybe"),
        ("TPAR_DEBUG", "LOUD"),
        ("TPAR_BLOCKS", "0"),
        ("TPAR_BLOCKS", "65"),
        ("TPAR_BLOCKS", "many"),
        ("TPAR_CHECK_CALLS", "sometimes"),
    ] {
        match parse(&[(var, value)]) {
            Err(Error::Config { var: v, value: got, reason }) => {
                assert_eq!(v, var);
                assert_eq!(got, value);
                assert!(!reason.is_empty());
            }
            other => panic!("{var}={value}: expected a Config error, got {other:?}"),
        }
    }
}

#[test]
fn good_values_parse() {
    let o = parse(&[
        ("TPAR_ALGO", "Staged_Push"),
        ("TPAR_TRANSPORT", "p2p"),
        ("TPAR_MAX_BYTES", "4M"),
        ("TPAR_DISABLE", "0"),
        ("TPAR_DEBUG", "INFO"),
        ("TPAR_PROFILE", "/tmp/p.toml"),
        ("TPAR_TIMEOUT_MS", "100"),
        ("PATH", "/bin"),
    ])
    .unwrap();
    assert_eq!(o.algorithm, Some(Algorithm::StagedPush));
    assert_eq!(o.transport, Some(Transport::P2p));
    assert_eq!(o.max_bytes, Some(4 << 20));
    assert!(!o.disable && o.debug);
    assert_eq!(o.profile.as_deref(), Some(std::path::Path::new("/tmp/p.toml")));
    assert_eq!(parse(&[("TPAR_ALGO", "auto"), ("TPAR_TRANSPORT", "")]).unwrap(), Overrides::default());
    assert_eq!(parse(&[("TPAR_BLOCKS", "auto")]).unwrap(), Overrides::default());
    assert_eq!(parse(&[("TPAR_CHECK_CALLS", "0")]).unwrap().check_calls, Some(false));
}

/// Ranks that disagree on TPAR_CHECK_CALLS would wait for descriptors that never come: the
/// setting is part of the plan digest, so init refuses them instead.
#[test]
fn check_calls_is_part_of_the_plan_digest() {
    let t = presets::h200_nvswitch_8();
    let on = parse(&[]).unwrap();
    let off = parse(&[("TPAR_CHECK_CALLS", "0")]).unwrap();
    assert_ne!(plan_fingerprint(&t, None, &on), plan_fingerprint(&t, None, &off));
}

/// TPAR_BLOCKS sets the block count of kernel plans, says so in the reason, and leaves
/// NCCL plans alone.
#[test]
fn blocks_override_applies_to_kernels_only() {
    let t = presets::h200_nvswitch_8();
    let o = parse(&[("TPAR_BLOCKS", "24")]).unwrap();
    let at = |bytes: u64| plan(&PlanInput { topology: &t, world: 4, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend: Backend::Cuda, profile: None, overrides: &o });
    let small = at(32 << 10);
    assert_ne!(small.algorithm, Algorithm::Nccl);
    assert_eq!(small.blocks, 24);
    assert!(small.reason.contains("TPAR_BLOCKS=24"), "{}", small.reason);
    let big = at(1 << 30);
    assert_eq!((big.algorithm, big.blocks), (Algorithm::Nccl, 0));
}

/// (topology, world, backend, settings, words the error must contain)
type Refused = (Topology, usize, Backend, Vec<(&'static str, &'static str)>, &'static str);
/// (topology, world, backend, settings, expected algorithm and transport)
type Obeyed = (Topology, usize, Backend, Vec<(&'static str, &'static str)>, Algorithm, Transport);

#[test]
fn settings_the_fabric_cannot_honour_are_refused_with_the_reason() {
    let cases: Vec<Refused> = vec![
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-pull")], "one process per GPU"),
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-push"), ("TPAR_TRANSPORT", "p2p")], "cannot write"),
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_TRANSPORT", "p2p")], "cannot write"),
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_ALGO", "staged-push")], "one process per GPU"),
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-pull"), ("TPAR_TRANSPORT", "host")], "over host: oneshot-push, twoshot-push"),
        (presets::rtxpro6000_dualsocket_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "gather-bcast")], "no GPU implementation"),
        (presets::rtxpro6000_pcie_switch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "hierarchical")], "two islands"),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "hierarchical")], "two islands"),
        (presets::rtxpro6000_dualsocket_8(), 4, Backend::Cuda, vec![("TPAR_ALGO", "hierarchical")], "two islands"),
        (presets::h200_nvswitch_8(), 16, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-push")], "exceeds the 8 GPUs"),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_TRANSPORT", "shm")], "CPU ranks"),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "nccl"), ("TPAR_TRANSPORT", "p2p")], "nccl runs over nccl"),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-push"), ("TPAR_TRANSPORT", "nccl")], "not over nccl"),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-push"), ("TPAR_DISABLE", "1")], "forces NCCL"),
        (Topology::cpu(), 4, Backend::Cpu, vec![("TPAR_ALGO", "staged-push")], "CPU backend runs"),
        (Topology::cpu(), 4, Backend::Cpu, vec![("TPAR_ALGO", "nccl")], "CPU backend runs"),
        (Topology::cpu(), 4, Backend::Cpu, vec![("TPAR_TRANSPORT", "p2p")], "shared memory"),
        (Topology::cpu(), 4, Backend::Cpu, vec![("TPAR_DISABLE", "1")], "no NCCL"),
        (Topology::cpu(), 4, Backend::Cpu, vec![("TPAR_MAX_BYTES", "1M")], "no NCCL"),
    ];
    for (t, world, backend, settings, needle) in cases {
        let o = parse(&settings).unwrap();
        match o.validate(&t, world, backend) {
            Err(e @ Error::Unsupported { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "{}: {settings:?}: {msg:?} should mention {needle:?}", t.name);
                assert!(msg.contains("TPAR_"), "{msg:?} should name the variable");
            }
            other => panic!("{} world {world}: {settings:?} should be refused, got {other:?}", t.name),
        }
        // And plan, which must answer anyway, says it ignored them.
        for bytes in [8u64, 1 << 20] {
            let p = plan(&PlanInput { topology: &t, world, bytes, dtype: DType::BF16, capture: CaptureMode::Eager, backend, profile: None, overrides: &o });
            assert!(p.reason.contains("ignored") || p.algorithm == Algorithm::Nccl, "{}: {settings:?}: {p}", t.name);
        }
    }
}

#[test]
fn settings_the_fabric_can_honour_pass_and_are_obeyed() {
    let cases: Vec<Obeyed> = vec![
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "staged-push")], Algorithm::StagedPush, Transport::P2p),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "oneshot-pull")], Algorithm::OneshotPull, Transport::P2p),
        (presets::rtxpro6000_dualsocket_8(), 8, Backend::Cuda, vec![("TPAR_ALGO", "staged-push")], Algorithm::StagedPush, Transport::P2p),
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_DISABLE", "yes")], Algorithm::Nccl, Transport::Nccl),
        // The host transport runs one process per GPU: forced, or where GPUs lack P2P.
        (presets::rtx4090_nop2p_4(), 4, Backend::Cuda, vec![("TPAR_ALGO", "twoshot-push")], Algorithm::TwoshotPush, Transport::Host),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_TRANSPORT", "host")], Algorithm::OneshotPush, Transport::Host),
        (presets::h200_nvswitch_8(), 8, Backend::Cuda, vec![("TPAR_TRANSPORT", "host"), ("TPAR_ALGO", "twoshot-push")], Algorithm::TwoshotPush, Transport::Host),
        (presets::pcie_2(), 2, Backend::Cuda, vec![("TPAR_MAX_BYTES", "4")], Algorithm::Nccl, Transport::Nccl),
        (Topology::cpu(), 3, Backend::Cpu, vec![("TPAR_ALGO", "gather-bcast")], Algorithm::GatherBcast, Transport::Shm),
    ];
    for (t, world, backend, settings, algorithm, transport) in cases {
        let o = parse(&settings).unwrap();
        o.validate(&t, world, backend).unwrap_or_else(|e| panic!("{}: {settings:?}: {e}", t.name));
        let p = plan(&PlanInput { topology: &t, world, bytes: 4096, dtype: DType::F16, capture: CaptureMode::Graph, backend, profile: None, overrides: &o });
        assert_eq!((p.algorithm, p.transport), (algorithm, transport), "{}: {settings:?}: {p}", t.name);
    }
    // Without P2P and without settings, small calls go through host memory (the simulator
    // times them fastest, and they beat NCCL even at the bound: docs/plan.md).
    let np = presets::rtx4090_nop2p_4();
    let p = plan(&PlanInput { topology: &np, world: 4, bytes: 256, dtype: DType::F16, capture: CaptureMode::Graph, backend: Backend::Cuda, profile: None, overrides: &parse(&[]).unwrap() });
    assert_eq!((p.algorithm, p.transport), (Algorithm::OneshotPush, Transport::Host), "{p}");
}

#[test]
fn plan_fingerprint_changes_with_every_input_that_changes_decisions() {
    let t = presets::rtxpro6000_pcie_switch_8();
    let base = Overrides::default();
    let f0 = plan_fingerprint(&t, None, &base);
    assert_eq!(f0, plan_fingerprint(&t.clone(), None, &base.clone()), "stable");
    // Debug and the profile's path do not change decisions.
    let quiet = parse(&[("TPAR_DEBUG", "INFO"), ("TPAR_PROFILE", "/x")]).unwrap();
    assert_eq!(plan_fingerprint(&t, None, &quiet), f0);
    for o in [parse(&[("TPAR_ALGO", "staged-push")]), parse(&[("TPAR_MAX_BYTES", "1M")]), parse(&[("TPAR_DISABLE", "1")])] {
        assert_ne!(plan_fingerprint(&t, None, &o.unwrap()), f0);
    }
    assert_ne!(plan_fingerprint(&presets::rtxpro6000_dualsocket_8(), None, &base), f0);
    let p = Profile::from_measurements(&[], ProfileFingerprint::new(&t, None, Backend::Cuda, 8, CaptureMode::Graph));
    assert_ne!(plan_fingerprint(&t, Some(&p), &base), f0);
}
