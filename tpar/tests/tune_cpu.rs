//! The first-use tune's protocol on CPU rank groups (threads with their own sockets, shared
//! memory and liveness locks, as separate processes would have): a first start tunes and
//! stores, a second reads the cache, `force` re-tunes, `off` skips; rank 0 decides and every
//! rank adopts the same bytes; a candidate that fails the bit-exact screen is reported and
//! never chosen; a rank that fails mid-tune, a spent budget, a corrupt or outdated entry, and
//! two jobs starting at once. Real processes (and a killed tuner) are in the CLI's tests.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use tpar::kinds::{Backend, CaptureMode, Collective};
use tpar::plan::profile::ProfileFingerprint;
use tpar::plan::{plan, Overrides, PlanInput};
use tpar::settings::Tune;
use tpar::tune::cache::Cache;
use tpar::tune::cpu::{cpu_key, CpuRanks};
use tpar::tune::{start, CollectiveSizes, Outcome, Rounds, StartSpec, TunePlan};
use tpar::{Algorithm, CpuCommunicator, DType, Topology};

fn cache_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpar-tune-cpu-{tag}-{}-{}", std::process::id(), common::rand_u32()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn small_plan() -> TunePlan {
    TunePlan {
        sizes: vec![1024, 16384],
        dtypes: vec![DType::F32],
        modes: vec![CaptureMode::Eager],
        rounds: Rounds { warmup: 0, iters: 2, inner: 2 },
        probe: false,
        max_seconds: 60.0,
        collectives: Vec::new(),
    }
}

/// [`small_plan`] with the all-gather and the reduce-scatter of tensors of 3 and 48 KiB (1 and
/// 16 KiB a rank at 3 ranks).
fn gather_scatter_plan() -> TunePlan {
    let collectives = [Collective::AllGather, Collective::ReduceScatter].map(|collective| CollectiveSizes { collective, totals: vec![3 * 1024, 3 * 16384], dtypes: vec![DType::F32] }).to_vec();
    TunePlan { collectives, ..small_plan() }
}

/// One start on this rank, as a communicator's init would run it.
fn start_on(comm: &mut CpuCommunicator, dir: &Path, tune: Tune, plan: &TunePlan, hook: impl FnOnce(&mut CpuRanks)) -> Outcome {
    let world = comm.world();
    let fp = move |m| ProfileFingerprint::new(&Topology::cpu(), None, Backend::Cpu, world, m);
    let never = |_, _, _| false;
    let spec = StartSpec {
        tune,
        skip: None,
        cache: Some(dir.to_path_buf()),
        key: cpu_key(world),
        max_bytes: 16384,
        plan: plan.clone(),
        lock_wait: std::time::Duration::from_secs(10),
        fingerprint: &fp,
        default_is_nccl: &never,
    };
    let mut r = CpuRanks::new(comm);
    hook(&mut r);
    start(&mut r, &spec).unwrap()
}

fn entry(o: &Outcome) -> Option<String> {
    o.tuned().map(|t| t.to_entry().unwrap())
}

#[test]
fn first_start_tunes_second_reads_force_retunes_off_skips_and_every_rank_adopts_the_same() {
    let dir = cache_dir("life");
    let d = dir.clone();
    let res = common::run_group(3, |_| {}, move |comm| {
        let plan = small_plan();
        [Tune::Auto, Tune::Auto, Tune::Force, Tune::Off].map(|t| start_on(comm, &d, t, &plan, |_| {}))
    });
    let per_rank: Vec<[Outcome; 4]> = res.into_iter().map(|r| r.unwrap()).collect();
    for o in &per_rank {
        assert!(matches!(o[0], Outcome::Tuned { .. }), "{}", o[0].line());
        assert!(matches!(o[1], Outcome::Cached { .. }), "{}", o[1].line());
        assert!(matches!(&o[2], Outcome::Tuned { because, .. } if because == "TPAR_TUNE=force"), "{}", o[2].line());
        assert!(matches!(&o[3], Outcome::Skipped { why } if why == "TPAR_TUNE=off"), "{}", o[3].line());
        assert!(o[3].line().contains("the plan's defaults are in force"), "{}", o[3].line());
        assert!(o[0].line().contains("stored in"), "{}", o[0].line());
    }
    // Every rank holds rank 0's bytes; the cache gives back what was stored.
    for k in 0..3 {
        let e = entry(&per_rank[0][k]);
        assert!(per_rank.iter().all(|o| entry(&o[k]) == e), "start {k}: ranks differ");
    }
    assert_eq!(entry(&per_rank[0][0]), entry(&per_rank[0][1]), "the second start read the first one's entry");
    let tuned = per_rank[0][0].tuned().unwrap();
    assert_eq!(tuned.key.world, 3);
    assert!(tuned.rejected.is_empty(), "{:?}", tuned.rejected);
    assert!(tuned.cost.points > 0 && tuned.cost.screens > 0);
    // The plan takes the tune's eager table.
    let t = Topology::cpu();
    let o = Overrides::default();
    let p = plan(&PlanInput { topology: &t, world: 3, bytes: 1024, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cpu, profile: Some(tuned.plan_profile(CaptureMode::Eager).unwrap()), overrides: &o });
    assert!(p.reason.starts_with("profile:"), "{p}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_candidate_failing_the_screen_is_reported_and_never_chosen() {
    let dir = cache_dir("reject");
    let d = dir.clone();
    let res = common::run_group(2, |_| {}, move |comm| start_on(comm, &d, Tune::Auto, &small_plan(), |r| r.corrupt_for_test(Algorithm::OneshotPush)));
    for o in res {
        let o = o.unwrap();
        let t = o.tuned().unwrap_or_else(|| panic!("{}", o.line()));
        let r = t.rejection_for(Collective::AllReduce, Algorithm::OneshotPush).expect("rejected");
        assert!(r.wrong >= 1 && !r.identical, "{r:?}");
        for p in &t.profiles {
            assert!(p.tables.iter().all(|tb| tb.buckets.iter().all(|b| b.algorithm != Algorithm::OneshotPush)), "{:?}", p.tables);
        }
        assert!(o.line().contains("rejected by the bit-exact screen") && o.line().contains("oneshot-push"), "{}", o.line());
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_rank_failing_mid_tune_or_a_spent_budget_leaves_the_defaults_on_every_rank() {
    let dir = cache_dir("fail");
    let d = dir.clone();
    let res = common::run_group(3, |_| {}, move |comm| {
        let rank = comm.rank();
        let failed = start_on(comm, &d, Tune::Auto, &small_plan(), |r| {
            if rank == 1 {
                r.fail_after_for_test(2)
            }
        });
        let spent = start_on(comm, &d, Tune::Auto, &TunePlan { max_seconds: 0.0, ..small_plan() }, |_| {});
        // The communicator still works after both, and the next start tunes (the lock went).
        let after = start_on(comm, &d, Tune::Auto, &small_plan(), |_| {});
        let mut out = [0f32; 4];
        comm.all_reduce(&[1.0f32; 4], &mut out).unwrap();
        (failed, spent, after, out)
    });
    for r in res {
        let (failed, spent, after, out) = r.unwrap();
        match &failed {
            Outcome::Failed { why, .. } => assert!(why.starts_with("rank 1:") && why.contains("fails its screen 3"), "{why}"),
            o => panic!("{}", o.line()),
        }
        assert!(failed.line().contains("the plan's defaults are in force"), "{}", failed.line());
        assert!(matches!(&spent, Outcome::Failed { why, .. } if why.contains("past its bound")), "{}", spent.line());
        assert!(matches!(after, Outcome::Tuned { .. }), "{}", after.line());
        assert_eq!(out, [3.0; 4]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_corrupt_or_outdated_entry_is_re_tuned_with_the_reason() {
    let dir = cache_dir("stale");
    let cache = Cache::under(&dir);
    let k = cpu_key(2);
    let header = format!("# tpar tuned profile v{} fnv1a64=0123 bytes=5\nhello", tpar::plan::tuned::ENTRY_FORMAT);
    cache.write_raw_for_test(&k, header.as_bytes()).unwrap();
    let d = dir.clone();
    let res = common::run_group(2, |_| {}, move |comm| start_on(comm, &d, Tune::Auto, &small_plan(), |_| {}));
    let first = res.into_iter().next().unwrap().unwrap();
    assert!(matches!(&first, Outcome::Tuned { because, .. } if because.contains("refused") && because.contains("checksum")), "{}", first.line());
    // The same entry, as an older tpar would have stored it.
    let mut t = first.tuned().unwrap().clone();
    t.key.tpar_version = "0.0.1".into();
    cache.write_raw_for_test(&k, t.to_entry().unwrap().as_bytes()).unwrap();
    let d = dir.clone();
    let res = common::run_group(2, |_| {}, move |comm| start_on(comm, &d, Tune::Auto, &small_plan(), |_| {}));
    let again = res.into_iter().next().unwrap().unwrap();
    assert!(matches!(&again, Outcome::Tuned { because, .. } if because.contains("tpar 0.0.1")), "{}", again.line());
    assert!(matches!(cache.read(&k, 1), tpar::tune::cache::Lookup::Hit { .. }), "replaced by this tpar's");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_jobs_starting_at_once_tune_once() {
    let dir = cache_dir("race");
    let gate = Arc::new(Barrier::new(2));
    let jobs: Vec<_> = (0..2)
        .map(|_| {
            let (d, gate) = (dir.clone(), gate.clone());
            std::thread::spawn(move || {
                gate.wait();
                let d2 = d.clone();
                common::run_group(2, |_| {}, move |comm| start_on(comm, &d2, Tune::Auto, &small_plan(), |_| {}))
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = jobs.into_iter().flat_map(|j| j.join().unwrap()).map(|r| r.unwrap()).collect();
    let tuned = outcomes.iter().filter(|o| matches!(o, Outcome::Tuned { .. })).count();
    let cached = outcomes.iter().filter(|o| matches!(o, Outcome::Cached { .. })).count();
    assert_eq!((tuned, cached), (2, 2), "{:?}", outcomes.iter().map(Outcome::line).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_tune_measures_the_all_gather_and_the_reduce_scatter_and_decides_each() {
    let dir = cache_dir("agrs");
    let d = dir.clone();
    let res = common::run_group(3, |_| {}, move |comm| {
        let with = start_on(comm, &d, Tune::Force, &gather_scatter_plan(), |_| {});
        let without = start_on(comm, &d, Tune::Force, &small_plan(), |_| {});
        (with, without)
    });
    let per_rank: Vec<(Outcome, Outcome)> = res.into_iter().map(|r| r.unwrap()).collect();
    let e = entry(&per_rank[0].0);
    assert!(per_rank.iter().all(|(o, _)| entry(o) == e), "every rank adopts rank 0's bytes");
    let (with, without) = (per_rank[0].0.tuned().unwrap(), per_rank[0].1.tuned().unwrap());
    assert!(with.rejected.is_empty(), "{:?}", with.rejected);
    // Two candidates (one-shot push and one-shot pull; CPU ranks have no NCCL) x 2 sizes x 2
    // collectives, eager.
    assert_eq!((with.cost.screens, with.cost.points), (without.cost.screens + 8, without.cost.points + 8), "{:?} vs {:?}", with.cost, without.cost);
    assert!(with.cost.budget.contains(&format!("all-gather, reduce-scatter: 2 tensors (3 KiB to 48 KiB) x {}", DType::F32)), "{}", with.cost.budget);
    let p = with.plan_profile(CaptureMode::Eager).unwrap();
    for c in [Collective::AllGather, Collective::ReduceScatter] {
        let t = p.table(c, DType::F32).unwrap_or_else(|| panic!("{c}: {:?}", p.tables));
        // Per rank, up to the larger of 1 and 16 KiB; the winners are timings (free to differ),
        // each with the other kernel as its rival.
        assert_eq!(t.buckets.last().map(|b| b.max_bytes), Some(16384), "{c}: {t:?}");
        for b in &t.buckets {
            let kernels = [Algorithm::OneshotPush, Algorithm::OneshotPull];
            assert!(kernels.contains(&b.algorithm) && b.median_us > 0.0, "{c}: {t:?}");
            assert!(b.rival.is_some_and(|r| kernels.contains(&r.algorithm) && r.algorithm != b.algorithm), "{c}: the other kernel timed: {t:?}");
        }
    }
    // The all-reduce's table is the all-reduce's alone: its sizes, up to 16 KiB (its winners
    // are timings of two runs, free to differ).
    let ar = |t: &tpar::plan::tuned::Tuned| t.plan_profile(CaptureMode::Eager).unwrap().table(Collective::AllReduce, DType::F32).and_then(|t| t.buckets.last().map(|b| b.max_bytes));
    assert_eq!((ar(with), ar(without)), (Some(16384), Some(16384)));
    assert!(with.describe().iter().any(|l| l.starts_with(&format!("eager all-gather {}: ", DType::F32)) && l.contains("<= 16 KiB")), "{:?}", with.describe());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_all_gather_or_reduce_scatter_computing_a_wrong_result_is_rejected_for_that_collective_alone() {
    for broken in [Collective::AllGather, Collective::ReduceScatter] {
        let dir = cache_dir("agrs-reject");
        let d = dir.clone();
        let res = common::run_group(2, |_| {}, move |comm| start_on(comm, &d, Tune::Auto, &gather_scatter_plan(), |r| r.corrupt_collective_for_test(broken, Algorithm::OneshotPush)));
        for o in res {
            let o = o.unwrap();
            let t = o.tuned().unwrap_or_else(|| panic!("{}", o.line()));
            assert_eq!(t.rejected.len(), 1, "{:?}", t.rejected);
            let r = t.rejection_for(broken, Algorithm::OneshotPush).expect("rejected");
            assert!(r.wrong >= 1, "{r:?}");
            // The all-gather's ranks must agree bitwise; the reduce-scatter's hold different slices.
            assert_eq!(r.identical, broken == Collective::ReduceScatter, "{r:?}");
            let p = t.plan_profile(CaptureMode::Eager).unwrap();
            // One-shot pull survives for the broken collective and is its table alone; the other
            // keeps both kernels.
            assert!(p.table(broken, DType::F32).is_some_and(|t| t.buckets.iter().all(|b| b.algorithm == Algorithm::OneshotPull && b.rival.is_none())), "{broken}: only the survivor: {:?}", p.tables);
            let other = if broken == Collective::AllGather { Collective::ReduceScatter } else { Collective::AllGather };
            assert!(p.table(other, DType::F32).is_some_and(|t| t.buckets.iter().all(|b| matches!(b.algorithm, Algorithm::OneshotPush | Algorithm::OneshotPull))), "{other}: {:?}", p.tables);
            assert!(p.table(Collective::AllReduce, DType::F32).is_some());
            assert!(o.line().contains("rejected by the bit-exact screen") && o.line().contains(&format!("oneshot-push {broken}")), "{}", o.line());
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
