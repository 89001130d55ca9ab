//! The plan is total and never picks something the fabric cannot do.
//!
//! `preconditions_hold` is written from the fabric rules and the topology data alone — it
//! shares no code with `tpar::plan` or the registry's gate — so a planner bug cannot hide
//! behind its own checker. What each backend can run as users run it (one process per GPU)
//! is stated here once more ([`may_run`], written from the documented table in
//! docs/architecture.md), and cross-checked against both that table's text and the
//! registry's gate (`registry::runnable`, which the CPU and GPU dispatch call): the three
//! must agree, so a plan the checker accepts is one the dispatch runs.

use proptest::prelude::*;
use tpar::plan::{plan, plan_collective, Backend, CaptureMode, Overrides, Plan, PlanInput};
use tpar::profile::{Bucket, Profile, ProfileFingerprint, Table};
use tpar::topology::{presets, Topology};
use tpar::algorithms::registry;
use tpar::sim::{Launch, Params, Simulator, Source};
use tpar::kinds::Collective;
use tpar::{Algorithm, DType, Transport};

const GIB: u64 = 1 << 30;

fn topologies() -> Vec<Topology> {
    let mut v = presets::all();
    v.push(Topology::cpu());
    v
}

/// Whether `backend` runs `a` over `t` (one process per GPU on CUDA), written out from the
/// "CPU ranks" and "one process per GPU" columns of the registry's table in
/// docs/architecture.md, not computed from the registry.
fn may_run(a: Algorithm, backend: Backend, t: Transport) -> bool {
    use Algorithm as A;
    use Transport as T;
    match backend {
        Backend::Cpu => t == T::Shm && matches!(a, A::OneshotPush | A::OneshotPull | A::TwoshotPush | A::TwoshotPull | A::GatherBcast),
        Backend::Cuda => matches!(
            (a, t),
            (A::OneshotPush | A::TwoshotPush | A::CeRing, T::P2p | T::Host) | (A::OneshotPull | A::TwoshotPull | A::StagedPush | A::Hierarchical, T::P2p) | (A::Nccl, T::Nccl)
        ),
    }
}

#[test]
fn the_written_out_table_matches_the_documented_table_and_the_gate() {
    let doc = include_str!("../../docs/architecture.md");
    let header = doc.lines().find(|l| l.starts_with("| algorithm |") && l.contains("CPU ranks") && l.contains("one process per GPU")).expect("the registry's table in docs/architecture.md");
    let cols: Vec<&str> = header.split('|').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).unwrap();
    let (cpu_col, gpu_col) = (col("CPU ranks"), col("one process per GPU"));
    let mut rows = 0;
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(a) = Algorithm::ALL.into_iter().find(|a| cells[1] == format!("`{}`", a.name())) else { continue };
        if cells.len() != cols.len() {
            continue; // another table's row
        }
        rows += 1;
        for t in Transport::ALL {
            for (backend, cell) in [(Backend::Cpu, cells[cpu_col]), (Backend::Cuda, cells[gpu_col])] {
                let documented = cell.split(',').map(str::trim).any(|x| x == t.name());
                assert_eq!(may_run(a, backend, t), documented, "{a} on {backend:?} over {t}: the test's table vs the docs' ({cell:?})");
                assert_eq!(may_run(a, backend, t), registry::runnable(a, backend, t).is_ok(), "{a} on {backend:?} over {t}: the test's table vs the registry's gate");
            }
        }
    }
    assert_eq!(rows, Algorithm::ALL.len(), "every algorithm has a row in the documented table");
}


/// What must be true of any plan for `world` ranks on `t` with `backend`.
fn preconditions_hold(p: &Plan, t: &Topology, world: usize, backend: Backend) -> Result<(), String> {
    use Algorithm as A;
    if p.reason.trim().is_empty() {
        return Err("empty reason".into());
    }
    let world = world.max(1);
    if world >= 2 && !may_run(p.algorithm, backend, p.transport) {
        return Err(format!("planned but not runnable: {} over {} on {backend:?}", p.algorithm, p.transport));
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
        .map(|(k, &algorithm)| Bucket { max_bytes: 1u64 << (6 + 3 * k), algorithm, median_us: 1.0 + k as f64, rival: None })
        .collect();
    Profile { reads_beat_writes: reads, fingerprint, tables: vec![Table { dtype: DType::BF16, collective: Collective::AllReduce, buckets }], probe: None }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, .. ProptestConfig::default() })]

    #[test]
    fn every_input_gets_a_plan_that_is_correct_on_its_fabric(
        ti in any::<prop::sample::Index>(),
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
        let all = topologies();
        let t = &all[ti.index(all.len())];
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
        // Pull only when forced, from a matching measured profile, where the simulator
        // times it fastest, or by the NVLink graph rule measured against vLLM's kernel
        // (floors::NVLINK_GRAPH_RULE); the reason then says so.
        let pull = matches!(p.algorithm, Algorithm::OneshotPull | Algorithm::TwoshotPull);
        if pull && o.algorithm.is_none() && !(with_profile && matching) {
            let graph_rule = capture == CaptureMode::Graph && p.reason.contains(", graph: ") && p.reason.contains("measured");
            prop_assert!(p.reason.contains("simulator") || graph_rule, "pull without a measured profile, the simulator's say or the graph rule: {}", p);
        }
        // A mismatched profile is never silently used.
        if with_profile && !matching && o.algorithm.is_none() && !o.disable {
            prop_assert!(!p.reason.starts_with("profile:"), "{}", p);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    /// The all-gather's and the reduce-scatter's plan with a profile whose tables for them name
    /// arbitrary winners: always one-shot push, one-shot pull or NCCL, correct on the fabric, a tuned pick
    /// only from a matching profile, and the all-reduce's plan unchanged by those tables.
    #[test]
    fn gather_scatter_plans_take_a_tune_only_where_it_holds(
        ti in any::<prop::sample::Index>(),
        world in 0usize..=16,
        bytes in prop_oneof![0u64..=GIB, (0u32..=30).prop_map(|k| 1u64 << k)],
        graph in any::<bool>(),
        cuda in any::<bool>(),
        o in overrides(),
        matching in any::<bool>(),
        scatter in any::<bool>(),
        algs in prop::collection::vec(algorithm(), 0..6),
    ) {
        let all = topologies();
        let t = &all[ti.index(all.len())];
        let backend = if cuda { Backend::Cuda } else { Backend::Cpu };
        let capture = if graph { CaptureMode::Graph } else { CaptureMode::Eager };
        let collective = if scatter { Collective::ReduceScatter } else { Collective::AllGather };
        let mut profile = profile_for(t, world, backend, capture, matching, &[], false);
        let mut ours = profile_for(t, world, backend, capture, matching, &algs, false).tables.remove(0);
        ours.collective = collective;
        profile.tables.push(ours);
        let input = PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture, backend, profile: Some(&profile), overrides: &o };
        let p = plan_collective(collective, &input);
        prop_assert!(matches!(p.algorithm, Algorithm::OneshotPush | Algorithm::OneshotPull | Algorithm::Nccl), "{}", p);
        // One-shot pull: peer to peer only, and only forced, tuned, or by the graph rule on
        // NVLink; its reduce-scatter only where the workspace holds what it exposes.
        if p.algorithm == Algorithm::OneshotPull {
            prop_assert_eq!(p.transport, Transport::P2p, "{}", p);
            prop_assert!(p.reason.contains("TPAR_ALGO=oneshot-pull forced") || p.reason.starts_with("tuned:") || (graph && p.reason.contains("one-shot pull: graph, ")), "{}", p);
            if let (Some(m), true) = (o.max_bytes, scatter) {
                prop_assert!(bytes.saturating_mul(world as u64) <= 2 * m.div_ceil(16) * 16, "{}", p);
            }
        }
        if let Err(why) = preconditions_hold(&p, t, world, backend) {
            return Err(TestCaseError::fail(format!("{}: world {world}, {bytes} B, {backend}: {p}: {why}", t.name)));
        }
        prop_assert_eq!(plan_collective(collective, &input), p.clone(), "deterministic");
        if p.reason.starts_with("tuned:") {
            prop_assert!(matching, "a mismatched profile is never used: {}", p);
            prop_assert_eq!(p.source, Some(Source::Profile));
        }
        let mut stripped = profile.clone();
        stripped.tables.retain(|t| t.collective == Collective::AllReduce);
        let without = PlanInput { profile: Some(&stripped), ..input };
        prop_assert_eq!(plan(&input), plan(&without), "an all-gather or reduce-scatter table never moves the all-reduce");
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
                            // Or by the NVLink graph rule measured against vLLM's kernel (floors::NVLINK_GRAPH_RULE).
                            let graph_rule = capture == CaptureMode::Graph && p.reason.contains(", graph: ") && p.reason.contains("measured");
                            assert!(!pull || p.reason.contains("simulator") || graph_rule, "pull by default only where the simulator times it fastest or the graph rule says: {}: {p}", t.name);
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
    let bad = |a, tr, blocks| Plan { algorithm: a, transport: tr, blocks, reason: "x".into(), predicted_us: None, nccl_us: None, source: None, nccl_source: None, bound_us: None, instead_of: None };
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
            // A preset's probe is its published figures: never "measured" (the doctor printed
            // "measured by the link probe" under a header saying "not measured by tpar").
            let want = if probed { "copy-engine rates published for this box" } else { "copy-engine rates assumed" };
            assert!(p.reason.contains(want) && p.reason.contains("until `tpar tune` measures ce-ring"), "{}: {p}", t.name);
            assert!(!p.reason.contains("measured by"), "a preset's figures are published, not measured: {}: {p}", t.name);
            assert!(!t.name.contains("nvswitch"), "NVLink plans do not consider copy engines: {p}");
            let profile = Profile {
                reads_beat_writes: false,
                fingerprint: ProfileFingerprint::new(&t, None, Backend::Cuda, world, capture),
                tables: vec![Table { dtype: DType::BF16, collective: Collective::AllReduce, buckets: vec![Bucket { max_bytes: GIB, algorithm: Algorithm::CeRing, median_us: 900.0, rival: None }] }],
                probe: None,
            };
            let q = plan(&PlanInput { profile: Some(&profile), ..input });
            assert_eq!(q.algorithm, Algorithm::CeRing, "{}: {q}", t.name);
            assert!(preconditions_hold(&q, &t, world, Backend::Cuda).is_ok(), "{q}");
        }
    }
    assert!(named >= 4, "the PCIe presets with P2P name ce-ring in their reasons ({named})");
}

/// Sizes the agreement tests sweep: every power of two from 8 B to 4 MiB and the Kimi-class
/// all-reduces (1, 3, 4 and 8 tokens of hidden 7168 in bf16).
fn agreement_sizes() -> Vec<u64> {
    let mut v: Vec<u64> = (3..=22).map(|k| 1u64 << k).collect();
    v.extend([14_336, 43_008, 57_344, 114_688]);
    v.sort_unstable();
    v
}

/// The simulator's fastest runnable candidate, computed through the public API only: every
/// registry candidate and NCCL the simulator can time (it refuses what the fabric cannot
/// carry, e.g. pulls without P2P reads), whose transport the registry's gate runs, and which
/// has the islands it needs. Shares no code with the plan's decision.
fn sim_fastest(sim: &Simulator, t: &Topology, world: usize, bytes: usize) -> (Algorithm, f64) {
    let islands = t.islands_of(world).len();
    registry::REGISTRY
        .iter()
        .filter(|sp| sp.role == registry::Role::Candidate || sp.algorithm == Algorithm::Nccl)
        .filter(|sp| !(sp.needs_islands && islands < 2))
        .filter_map(|sp| sim.predict(sp.algorithm, bytes).ok())
        .filter(|p| registry::runnable(p.algorithm, Backend::Cuda, p.transport).is_ok())
        .map(|p| (p.algorithm, p.total_us))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("NCCL is always timed")
}

/// `tpar sim` and `tpar plan` agree on every preset: wherever the plan decides from the
/// simulator (PCIe, P2P or host memory, up to 1 MiB), its pick is the simulator's fastest
/// runnable candidate, or NCCL where that candidate rests on an unmeasured figure and loses
/// to NCCL at the bound — never a third thing, and never by a rule of its own. On NVLink the
/// plan follows thresholds measured with tpar's kernels on H200s, a more trusted source than
/// the simulator's NVLink times; there the reason must say so.
#[test]
fn plan_agrees_with_the_simulator_on_every_preset() {
    let o = Overrides::default();
    let mut compared = 0usize;
    for t in presets::all() {
        let nvlink = (0..t.gpu_count()).all(|i| (0..t.gpu_count()).all(|j| i == j || t.links[i][j].class.is_nvlink()));
        for world in 2..=t.gpu_count() {
            for capture in CaptureMode::ALL {
                let launch = if capture == CaptureMode::Graph { Launch::Graph } else { Launch::Eager };
                let sim = Simulator::new(&t, world, &Params::with_launch(launch)).unwrap();
                for bytes in agreement_sizes() {
                    let p = plan(&PlanInput { topology: &t, world, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: &o });
                    let ctx = format!("{} world {world} {bytes} B {capture}: {p}", t.name);
                    if nvlink {
                        assert!(p.reason.starts_with("NVLink") && p.reason.contains("measured"), "{ctx}");
                        continue;
                    }
                    if bytes > 1 << 20 {
                        assert_eq!(p.algorithm, Algorithm::Nccl, "{ctx}");
                        continue;
                    }
                    let (best, best_us) = sim_fastest(&sim, &t, world, bytes as usize);
                    let nccl_us = sim.predict(Algorithm::Nccl, bytes as usize).unwrap().total_us;
                    if p.algorithm == best {
                        let us = p.predicted_us.expect("a simulated pick has a time");
                        assert!((us - best_us).abs() <= 1e-9 * best_us.max(1.0), "{ctx}: plan {us} vs sim {best_us}");
                        if best != Algorithm::Nccl && !sim.provenance(best).unwrap().source.measured() {
                            let bound = sim.predict_bound(best, bytes as usize).unwrap().total_us;
                            assert!(bound < nccl_us, "{ctx}: an unmeasured pick must hold at the bound ({bound} vs NCCL {nccl_us})");
                        }
                    } else {
                        assert_eq!(p.algorithm, Algorithm::Nccl, "{ctx}: neither the simulator's fastest ({best}) nor NCCL");
                        assert!(!sim.provenance(best).unwrap().source.measured(), "{ctx}: {best} rests on measured figures and was not picked");
                        let bound = sim.predict_bound(best, bytes as usize).unwrap().total_us;
                        assert!(bound >= nccl_us, "{ctx}: {best} holds at the bound ({bound} < {nccl_us}) but was not picked");
                        assert_eq!(p.instead_of.map(|u| u.algorithm), Some(best), "{ctx}");
                    }
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 1000, "{compared}");
}

/// On every preset, world and size of `tpar plan --table`, no pick rests on an unmeasured
/// figure without saying so: a tpar kernel whose time rests on an assumed figure says it
/// holds at the bound (and does); a NCCL that replaced one names it and the figures.
#[test]
fn no_pick_rests_on_an_unmeasured_figure_without_saying_so() {
    let o = Overrides::default();
    let mut tpar_picks_on_assumed = 0usize;
    let mut replaced = 0usize;
    for t in presets::all() {
        for world in 2..=t.gpu_count() {
            for capture in CaptureMode::ALL {
                for k in 3..=30 {
                    let bytes = 1u64 << k;
                    let p = plan(&PlanInput { topology: &t, world, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: &o });
                    let ctx = format!("{} world {world} {bytes} B {capture}: {p}", t.name);
                    let source = p.source.expect("every default pick on a GPU preset names its source");
                    if p.algorithm != Algorithm::Nccl && source == Source::Assumed {
                        let (b, n) = (p.bound_us.expect("bound"), p.nccl_us.expect("nccl"));
                        assert!(b < n && p.reason.contains("unmeasured") && p.reason.contains("holds at the bound"), "{ctx}");
                        tpar_picks_on_assumed += 1;
                    }
                    if let Some(u) = p.instead_of {
                        assert_eq!(p.algorithm, Algorithm::Nccl, "{ctx}");
                        assert!(p.reason.contains("unmeasured") && p.reason.contains(&u.algorithm.to_string()), "{ctx}");
                        replaced += 1;
                    }
                    if p.algorithm != Algorithm::Nccl {
                        assert!(p.predicted_us.is_some() && p.nccl_us.is_some() && p.nccl_source.is_some(), "{ctx}");
                    }
                }
            }
        }
    }
    // Both cases occur on the presets (the two-socket box has both).
    assert!(tpar_picks_on_assumed > 0 && replaced > 0, "{tpar_picks_on_assumed} {replaced}");
}

/// Where tpar has measured figures (NVLink: tpar's kernels on H200s; the switch box: its
/// published posted-write test), the defaults still pick tpar's kernels, from published
/// sources.
#[test]
fn measured_fabrics_keep_tpar_kernels() {
    let o = Overrides::default();
    let h = presets::h200_nvswitch_8();
    for world in 2..=8 {
        for bytes in [1024u64, 43_008, 1 << 20] {
            for capture in CaptureMode::ALL {
                let p = plan(&PlanInput { topology: &h, world, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: &o });
                assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
                assert_eq!(p.source, Some(Source::Published), "{p}");
            }
        }
    }
    let sw = presets::rtxpro6000_pcie_switch_8();
    for bytes in [14_336u64, 43_008, 114_688] {
        let p = plan(&PlanInput { topology: &sw, world: 8, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend: Backend::Cuda, profile: None, overrides: &o });
        assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
        assert_eq!(p.source, Some(Source::Published), "{p}");
    }
}
