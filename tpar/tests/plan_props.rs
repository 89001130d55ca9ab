//! The plan is total and never picks something the fabric cannot do.
//!
//! `preconditions_hold` is written from the fabric rules and the topology data alone — it
//! shares no code with `tpar::plan` — so a planner bug cannot hide behind its own checker.
//! On top of it, every plan must be runnable by its backend as users run it (one process
//! per GPU): the registry's gate, which the CPU and GPU dispatch themselves call, must
//! accept it — no `Unsupported` after a plan.

use proptest::prelude::*;
use tpar::plan::{plan, Backend, CaptureMode, Overrides, Plan, PlanInput};
use tpar::profile::{Bucket, Profile, ProfileFingerprint, Table};
use tpar::topology::{presets, Topology};
use tpar::algorithms::registry;
use tpar::{Algorithm, DType, Transport};

const GIB: u64 = 1 << 30;

fn topologies() -> Vec<Topology> {
    let mut v = presets::all();
    v.push(Topology::cpu());
    v
}

/// Whether the topology's probe shows collapsed peer writes among ranks `0..world`.
fn collapsed_writes(t: &Topology, world: usize) -> bool {
    t.probe.as_ref().and_then(|p| p.collapsed_writes(world)).is_some()
}

/// What must be true of any plan for `world` ranks on `t` with `backend`.
fn preconditions_hold(p: &Plan, t: &Topology, world: usize, backend: Backend) -> Result<(), String> {
    use Algorithm as A;
    if p.reason.trim().is_empty() {
        return Err("empty reason".into());
    }
    let world = world.max(1);
    if world >= 2 {
        registry::runnable(p.algorithm, backend, p.transport).map_err(|why| format!("planned but not runnable: {why}"))?;
    }
    match backend {
        Backend::Cpu => {
            if p.transport != Transport::Shm {
                return Err(format!("CPU ranks must use shm, got {}", p.transport));
            }
            if ![A::OneshotPush, A::OneshotPull, A::TwoshotPush, A::TwoshotPull, A::GatherBcast].contains(&p.algorithm) {
                return Err(format!("the CPU backend cannot run {}", p.algorithm));
            }
            if p.blocks != 1 {
                return Err(format!("CPU plans use 1 block, got {}", p.blocks));
            }
            Ok(())
        }
        Backend::Cuda => {
            if (p.algorithm == A::Nccl) != (p.transport == Transport::Nccl) {
                return Err(format!("{} over {}: NCCL and its transport go together", p.algorithm, p.transport));
            }
            if p.algorithm == A::Nccl {
                return if p.blocks == 0 { Ok(()) } else { Err("NCCL picks its own channels: blocks must be 0".into()) };
            }
            if p.transport == Transport::Shm {
                return Err("GPU ranks cannot use shm".into());
            }
            if world > t.gpus.len() {
                return Err(format!("{} on {world} ranks but only {} GPUs", p.algorithm, t.gpus.len()));
            }
            if !(1..=64).contains(&p.blocks) {
                return Err(format!("blocks {} out of 1..=64", p.blocks));
            }
            let pairs = || (0..world).flat_map(|i| (0..world).filter(move |&j| j != i).map(move |j| (i, j)));
            match p.transport {
                Transport::Host => {
                    // Push kernels write into host memory; copy engines copy into it.
                    if ![A::OneshotPush, A::TwoshotPush, A::CeRing].contains(&p.algorithm) {
                        return Err(format!("{} cannot run through host memory", p.algorithm));
                    }
                }
                Transport::P2p => {
                    if let Some((i, j)) = pairs().find(|&(i, j)| !t.links[i][j].p2p_write) {
                        return Err(format!("{} over p2p but GPU{i} cannot write GPU{j}", p.algorithm));
                    }
                    if [A::OneshotPull, A::TwoshotPull, A::GatherBcast].contains(&p.algorithm) {
                        if let Some((i, j)) = pairs().find(|&(i, j)| !t.links[i][j].p2p_read) {
                            return Err(format!("{} reads but GPU{i} cannot read GPU{j}", p.algorithm));
                        }
                    }
                    if p.algorithm == A::Hierarchical {
                        let islands = t.islands.iter().filter(|isl| isl.gpus.iter().any(|&g| (g as usize) < world)).count();
                        if islands < 2 {
                            return Err(format!("hierarchical on {islands} island(s)"));
                        }
                    }
                }
                Transport::Shm | Transport::Nccl => {}
            }
            Ok(())
        }
    }
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

fn overrides() -> impl Strategy<Value = Overrides> {
    (
        prop::option::weighted(0.3, algorithm()),
        prop::option::weighted(0.2, prop::sample::select(Transport::ALL.to_vec())),
        prop::option::weighted(0.2, 0u64..=GIB),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(algorithm, transport, max_bytes, disable)| Overrides { algorithm, transport, max_bytes, disable, ..Overrides::default() })
}

/// A profile with arbitrary (possibly infeasible) winners; `matching` decides whether its
/// fingerprint is the call's.
fn profile_for(t: &Topology, world: usize, backend: Backend, capture: CaptureMode, matching: bool, algs: &[Algorithm], reads: bool) -> Profile {
    let mut fingerprint = ProfileFingerprint::new(t, None, backend, world.max(1), capture);
    if !matching {
        fingerprint.world += 1;
    }
    let buckets = algs
        .iter()
        .enumerate()
        .map(|(k, &algorithm)| Bucket { max_bytes: 1u64 << (6 + 3 * k), algorithm, median_us: 1.0 + k as f64 })
        .collect();
    Profile { reads_beat_writes: reads, fingerprint, tables: vec![Table { dtype: DType::BF16, buckets }], probe: None }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, .. ProptestConfig::default() })]

    #[test]
    fn every_input_gets_a_plan_that_is_correct_on_its_fabric(
        ti in 0usize..7,
        world in 0usize..=16,
        bytes in prop_oneof![0u64..=GIB, (0u32..=30).prop_map(|k| 1u64 << k)],
        dtype in prop::sample::select(DType::ALL.to_vec()),
        graph in any::<bool>(),
        cuda in any::<bool>(),
        o in overrides(),
        with_profile in any::<bool>(),
        matching in any::<bool>(),
        algs in prop::collection::vec(algorithm(), 0..6),
        reads in any::<bool>(),
    ) {
        let t = &topologies()[ti];
        let backend = if cuda { Backend::Cuda } else { Backend::Cpu };
        let capture = if graph { CaptureMode::Graph } else { CaptureMode::Eager };
        let profile = profile_for(t, world, backend, capture, matching, &algs, reads);
        let input = PlanInput {
            topology: t,
            world,
            bytes,
            dtype,
            capture,
            backend,
            profile: with_profile.then_some(&profile),
            overrides: &o,
        };
        let p = plan(&input);
        if let Err(why) = preconditions_hold(&p, t, world, backend) {
            return Err(TestCaseError::fail(format!("{}: world {world}, {bytes} B, {backend}: {p}: {why}", t.name)));
        }
        prop_assert_eq!(plan(&input), p.clone(), "plan must be deterministic");

        // Overrides that validate are obeyed.
        if backend == Backend::Cuda && o.disable {
            prop_assert_eq!(p.algorithm, Algorithm::Nccl, "TPAR_DISABLE: {}", p);
        }
        if backend == Backend::Cuda && o.max_bytes.is_some_and(|m| bytes > m) {
            prop_assert_eq!(p.algorithm, Algorithm::Nccl, "above TPAR_MAX_BYTES: {}", p);
        }
        if let (Ok(()), Some(a)) = (o.validate(t, world, backend), o.algorithm) {
            let capped = backend == Backend::Cuda && (o.disable || o.max_bytes.is_some_and(|m| bytes > m));
            if !capped {
                prop_assert_eq!(p.algorithm, a, "a validated TPAR_ALGO is obeyed: {}", p);
                if let Some(tr) = o.transport {
                    prop_assert_eq!(p.transport, tr, "a validated TPAR_TRANSPORT is obeyed: {}", p);
                }
            }
        }
        // Pull only when forced, from a matching measured profile, or where the topology's
        // probe shows collapsed peer writes (then no push algorithm either).
        let pull = matches!(p.algorithm, Algorithm::OneshotPull | Algorithm::TwoshotPull);
        let collapsed = backend == Backend::Cuda && collapsed_writes(t, world);
        if pull && o.algorithm.is_none() {
            prop_assert!((with_profile && matching) || collapsed, "pull without a measured profile or a write collapse: {}", p);
        }
        if collapsed && o.algorithm.is_none() && !(with_profile && matching) && p.transport == Transport::P2p {
            prop_assert!(registry::spec(p.algorithm).reads_remote, "push picked on a fabric whose probe shows collapsed writes: {}", p);
        }
        // A mismatched profile is never silently used.
        if with_profile && !matching && o.algorithm.is_none() && !o.disable {
            prop_assert!(!p.reason.starts_with("profile:"), "{}", p);
        }
    }
}

/// Deterministic sweep of the whole grid (every preset and the CPU topology, world 0..=16,
/// sizes around every power of two up to 1 GiB, every dtype, capture mode and backend),
/// without overrides or profile: the defaults alone must be correct everywhere.
#[test]
fn default_plans_are_correct_on_the_whole_grid() {
    let o = Overrides::default();
    let mut sizes = vec![0u64];
    for k in 0..=30 {
        let p = 1u64 << k;
        sizes.extend([p - 1, p, p + 1]);
    }
    let mut count = 0usize;
    for t in topologies() {
        for world in 0..=16 {
            for &bytes in &sizes {
                for dtype in DType::ALL {
                    for capture in CaptureMode::ALL {
                        for backend in Backend::ALL {
                            let p = plan(&PlanInput { topology: &t, world, bytes, dtype, capture, backend, profile: None, overrides: &o });
                            if let Err(why) = preconditions_hold(&p, &t, world, backend) {
                                panic!("{}: world {world}, {bytes} B, {dtype}, {capture}, {backend}: {p}: {why}", t.name);
                            }
                            assert!(p.algorithm != Algorithm::GatherBcast, "{p}");
                            assert!(p.algorithm != Algorithm::CeRing, "ce-ring only from a profile that measured it: {}: {p}", t.name);
                            let pull = matches!(p.algorithm, Algorithm::OneshotPull | Algorithm::TwoshotPull);
                            let collapsed = backend == Backend::Cuda && collapsed_writes(&t, world);
                            assert!(!pull || collapsed, "pull by default only where writes collapsed: {}: {p}", t.name);
                            if collapsed && p.transport == Transport::P2p {
                                assert!(registry::spec(p.algorithm).reads_remote, "push on collapsed writes: {}: {p}", t.name);
                            }
                            count += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(count > 10_000);
}

/// The checker itself must be able to fail.
#[test]
fn checker_refuses_wrong_plans() {
    let np = presets::rtx4090_nop2p_4();
    let bad = |a, tr, blocks| Plan { algorithm: a, transport: tr, blocks, reason: "x".into() };
    assert!(preconditions_hold(&bad(Algorithm::OneshotPush, Transport::P2p, 1), &np, 4, Backend::Cuda).is_err());
    assert!(preconditions_hold(&bad(Algorithm::OneshotPull, Transport::Host, 1), &np, 4, Backend::Cuda).is_err());
    assert!(preconditions_hold(&bad(Algorithm::OneshotPush, Transport::Host, 1), &np, 5, Backend::Cuda).is_err());
    // Correct on the fabric and runnable: one process per GPU runs the push kernels over
    // shared host memory; a pull over host is not.
    assert!(preconditions_hold(&bad(Algorithm::OneshotPush, Transport::Host, 1), &np, 4, Backend::Cuda).is_ok());
    assert!(preconditions_hold(&bad(Algorithm::TwoshotPush, Transport::Host, 1), &np, 4, Backend::Cuda).is_ok());
    assert!(preconditions_hold(&bad(Algorithm::StagedPush, Transport::Host, 1), &np, 4, Backend::Cuda).is_err());
    let sw = presets::rtxpro6000_pcie_switch_8();
    assert!(preconditions_hold(&bad(Algorithm::Hierarchical, Transport::P2p, 1), &sw, 8, Backend::Cuda).is_err());
    let ds = presets::rtxpro6000_dualsocket_8();
    assert!(preconditions_hold(&bad(Algorithm::Hierarchical, Transport::P2p, 1), &ds, 4, Backend::Cuda).is_err());
    // Two islands (4 + 1): hierarchical runs there; over the host transport it does not (one
    // process per GPU runs p2p only).
    assert!(preconditions_hold(&bad(Algorithm::Hierarchical, Transport::P2p, 1), &ds, 5, Backend::Cuda).is_ok());
    assert!(preconditions_hold(&bad(Algorithm::Hierarchical, Transport::Host, 1), &ds, 5, Backend::Cuda).is_err());
    assert!(preconditions_hold(&bad(Algorithm::StagedPush, Transport::P2p, 1), &ds, 5, Backend::Cuda).is_ok());
    assert!(preconditions_hold(&bad(Algorithm::Nccl, Transport::P2p, 0), &ds, 5, Backend::Cuda).is_err());
    assert!(preconditions_hold(&bad(Algorithm::StagedPush, Transport::Shm, 1), &Topology::cpu(), 4, Backend::Cpu).is_err());
    assert!(preconditions_hold(&bad(Algorithm::Nccl, Transport::Nccl, 0), &Topology::cpu(), 4, Backend::Cpu).is_err());
}

/// Every forced algorithm, on every preset, world and backend, is either refused at init
/// (`Overrides::validate`, with a reason naming the setting) or planned and runnable.
#[test]
fn forced_algorithms_are_runnable_or_refused_at_init() {
    let mut refused = 0usize;
    let mut obeyed = 0usize;
    for t in topologies() {
        for world in 2..=16 {
            for backend in Backend::ALL {
                for a in Algorithm::ALL {
                    let o = Overrides { algorithm: Some(a), ..Overrides::default() };
                    match o.validate(&t, world, backend) {
                        Err(e) => {
                            let msg = e.to_string();
                            assert!(msg.contains("TPAR_ALGO"), "{}: refusal must name the setting: {msg}", t.name);
                            refused += 1;
                        }
                        Ok(()) => {
                            for bytes in [8u64, 43008, 1 << 20] {
                                let p = plan(&PlanInput {
                                    topology: &t,
                                    world,
                                    bytes,
                                    dtype: DType::BF16,
                                    capture: CaptureMode::Graph,
                                    backend,
                                    profile: None,
                                    overrides: &o,
                                });
                                if let Err(why) = preconditions_hold(&p, &t, world, backend) {
                                    panic!("{}: TPAR_ALGO={a} validated, world {world}, {backend}: {p}: {why}", t.name);
                                }
                                if p.algorithm == a {
                                    obeyed += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(refused > 0 && obeyed > 0, "refused {refused}, obeyed {obeyed}");
}

/// Large calls on PCIe go to NCCL without a profile, and the reason carries the simulator's
/// `ce-ring` prediction with where its copy-engine rates came from (the probe's, or assumed);
/// NVLink reasons never mention it; a profile that measured `ce-ring` fastest is obeyed.
#[test]
fn ce_ring_is_simulated_on_pcie_but_picked_only_when_measured() {
    let o = Overrides::default();
    let bytes = 64u64 << 20;
    let mut named = 0;
    for t in presets::all() {
        for capture in CaptureMode::ALL {
            let world = t.gpus.len().min(8);
            let input = PlanInput { topology: &t, world, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: &o };
            let p = plan(&input);
            assert_ne!(p.algorithm, Algorithm::CeRing, "{}: {p}", t.name);
            if !p.reason.contains("ce-ring") {
                continue;
            }
            named += 1;
            assert_eq!(p.algorithm, Algorithm::Nccl, "{}: {p}", t.name);
            let probed = t.probe.as_ref().is_some_and(|pr| (0..world).all(|i| (0..world).filter(|&j| j != i).all(|j| pr.pair(i, Some(j)).is_some_and(|q| q.ce_gbps.is_some()))));
            let want = if probed { "measured by the link probe" } else { "copy-engine rates assumed" };
            assert!(p.reason.contains(want) && p.reason.contains("until `tpar tune` measures ce-ring"), "{}: {p}", t.name);
            assert!(!t.name.contains("nvswitch"), "NVLink plans do not consider copy engines: {p}");
            let profile = Profile {
                reads_beat_writes: false,
                fingerprint: ProfileFingerprint::new(&t, None, Backend::Cuda, world, capture),
                tables: vec![Table { dtype: DType::BF16, buckets: vec![Bucket { max_bytes: GIB, algorithm: Algorithm::CeRing, median_us: 900.0 }] }],
                probe: None,
            };
            let q = plan(&PlanInput { profile: Some(&profile), ..input });
            assert_eq!(q.algorithm, Algorithm::CeRing, "{}: {q}", t.name);
            assert!(preconditions_hold(&q, &t, world, Backend::Cuda).is_ok(), "{q}");
        }
    }
    assert!(named >= 4, "the PCIe presets with P2P name ce-ring in their reasons ({named})");
}
