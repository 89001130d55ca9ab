//! The plan of the all-gather and the reduce-scatter: where tpar's one-shot push or one-shot
//! pull runs them and where NCCL does, with the reason. A pure function of the same inputs as
//! the all-reduce's plan, plus the collective; the same on every rank.
//!
//! Which of tpar's two: one-shot push (writes into every peer's inbox; one trip, but each
//! part crosses memory twice: the inbox, then the output, and the inbox is cleared) up to a
//! per-world size, one-shot pull (every rank's part exposed once, read by every peer straight
//! into its output, behind a barrier) above it, for calls captured in a CUDA graph on NVLink
//! (or one GPU's emulated ranks) where peers' reads are possible and the workspace holds what
//! the pull exposes ([`ALL_GATHER_GRAPH_PUSH_MAX`], [`REDUCE_SCATTER_GRAPH_PUSH_MAX`]). Elsewhere
//! one-shot push.
//!
//! Where a tuned profile measured here has a bucket for the call (the first-use tune times
//! every kernel that computes the collective against NCCL at the engines' sequence-parallel
//! sizes), the measurement decides and the reason names both figures ("tuned"); elsewhere the
//! simulator decides between that kernel and NCCL, with NCCL's ring assumed.
//!
//! Sizes are per rank, as nccl-tests and [`Collective::io_elems`] count them (the
//! all-gather's input, the reduce-scatter's output): the bytes each rank sends to each peer.
//! Owns: [`plan_collective`]. Must never pick a kernel that cannot run on the fabric
//! (`feasibility::check`), never a tpar kernel for a size that is not whole 16-byte vectors
//! per rank (the kernels place each rank's part at a vector boundary), and never one-shot
//! pull where its exposed area does not hold the call (`oneshot_pull::exposed_fits`).

use super::feasibility::{check, natural_transport, transport_usable, Fabric};
use super::profile::ProfileFingerprint;
use super::{finish_plan, human_bytes, make, nccl, plan, Plan, PlanInput};
use crate::algorithms::oneshot_pull::exposed_fits;
use crate::kinds::{Algorithm, Backend, CaptureMode, Collective, Transport};
use crate::sim::{Launch, Params, Simulator, Source};

const KIB: u64 = 1024;

/// tpar's small-message kernel for these collectives (and the one over the host transport).
const PUSH: Algorithm = Algorithm::OneshotPush;
/// tpar's large-message kernel for them (reads peers: P2P only).
const PULL: Algorithm = Algorithm::OneshotPull;

/// NVLink (or one GPU's emulated ranks), calls captured in a CUDA graph, per world (<= 2,
/// <= 4, more): one-shot push up to this many bytes per rank, one-shot pull above it (0: pull
/// at every size). Measured on one H200, emulated ranks, bf16, graphs, both kernels and vLLM
/// 0.33.0's own in the same call (bench/results/2026-12-07-h200-gather-scatter-pull/README.md,
/// median us per call push / pull per rank): 2 ranks, 256 KiB 2.54 / slower, 1 MiB 5.96 /
/// 4.36; 4 ranks, 64 KiB 3.10 / slower, 256 KiB 5.86 / 4.45; 8 ranks, pull faster from the
/// smallest size measured (1 KiB 4.10 / 3.60, 1 MiB 78.52 / 37.88). Push writes every part
/// into each peer's inbox and copies it out again; the pull reads each part once, behind a
/// barrier, which pays once the parts are large or the peers many.
pub const ALL_GATHER_GRAPH_PUSH_MAX: [u64; 3] = [256 * KIB, 64 * KIB, 0];

/// As [`ALL_GATHER_GRAPH_PUSH_MAX`], for the reduce-scatter (the same record): 2 ranks, 64
/// KiB 2.46 / slower, 256 KiB 2.81 / 2.72, 4 MiB 17.74 / 6.93; 4 ranks, 64 KiB 3.69 /
/// slower, 256 KiB 6.89 / 3.85; 8 ranks, pull faster from 1 KiB (5.30 / 4.73; 1 MiB 122.45 /
/// 25.76).
pub const REDUCE_SCATTER_GRAPH_PUSH_MAX: [u64; 3] = [64 * KIB, 64 * KIB, 0];

/// One-shot push or one-shot pull for a call over `t` (see the module doc), and the reason's
/// clause that says why ("" where push is the only candidate). `runs`: whether a kernel can
/// run this call here (the fabric, and the pull's exposed area), as [`plan_collective`] asks it.
fn kernel_for(collective: Collective, input: &PlanInput<'_>, f: &Fabric, t: Transport, runs: &dyn Fn(Algorithm) -> Result<(), String>) -> (Algorithm, String) {
    let world = input.world.max(1);
    let s = input.bytes;
    if t != Transport::P2p || !f.nvlink || input.capture != CaptureMode::Graph {
        return (PUSH, String::new());
    }
    let cuts = if collective == Collective::ReduceScatter { REDUCE_SCATTER_GRAPH_PUSH_MAX } else { ALL_GATHER_GRAPH_PUSH_MAX };
    let push_max = cuts[if world <= 2 { 0 } else if world <= 4 { 1 } else { 2 }];
    let cut = human_bytes(push_max);
    if s <= push_max {
        return (PUSH, format!("; one-shot push: graph, <= {cut} per rank at {world} ranks (measured faster than one-shot pull there)"));
    }
    let above = if push_max == 0 { "at every size".to_string() } else { format!("above {cut} per rank") };
    if let Err(why) = runs(PULL) {
        return (PUSH, format!("; one-shot push: one-shot pull ({above} at {world} ranks) cannot run here: {why}"));
    }
    (PULL, format!("; one-shot pull: graph, {above} at {world} ranks (every part read once from its owner: measured faster than push's inbox and copy-out there)"))
}

/// The decision for one call of `collective` (the all-reduce: [`plan`]).
pub fn plan_collective(collective: Collective, input: &PlanInput<'_>) -> Plan {
    if collective == Collective::AllReduce {
        return plan(input);
    }
    let world = input.world.max(1);
    let f = Fabric::of(input.topology, world, input.backend);
    let o = input.overrides;
    let s = input.bytes;
    let size = human_bytes(s);
    let mut notes: Vec<String> = Vec::new();
    let finish = |p: Plan, notes: Vec<String>| finish_plan(p, o, notes);
    // A forced algorithm that does not compute this collective is noted and left out.
    let forced = match o.algorithm {
        Some(a) if crate::algorithms::registry::computes(a, collective).is_err() => {
            notes.push(format!("TPAR_ALGO={a} ignored for the {collective}: {a} computes the all-reduce only"));
            None
        }
        other => other,
    };
    if input.backend == Backend::Cpu {
        let p = make(PUSH, Transport::Shm, s, &f, format!("CPU ranks over shm: {size} per rank: one-shot push (the CPU backend's {collective})"));
        return finish(p, notes);
    }
    if o.disable {
        return finish(nccl("TPAR_DISABLE=1: always NCCL".into()), notes);
    }
    if let Some(m) = o.max_bytes {
        if s > m {
            return finish(nccl(format!("{size} per rank > TPAR_MAX_BYTES={}: NCCL", human_bytes(m))), notes);
        }
    }
    if !f.fits() {
        return finish(nccl(format!("world {world} exceeds the {} GPUs of this topology (ranks on other hosts or sharing GPUs): NCCL", f.gpus)), notes);
    }
    if forced == Some(Algorithm::Nccl) || o.transport == Some(Transport::Nccl) {
        return finish(nccl("TPAR_ALGO / TPAR_TRANSPORT: NCCL".into()), notes);
    }
    let t = match o.transport {
        Some(t) => match transport_usable(t, &f) {
            Ok(()) => t,
            Err(why) => {
                notes.push(format!("TPAR_TRANSPORT={t} ignored: {why}"));
                natural_transport(PUSH, &f)
            }
        },
        None => natural_transport(PUSH, &f),
    };
    if world == 1 {
        return finish(make(PUSH, t, s, &f, "world 1: copy".into()), notes);
    }
    if s % 16 != 0 {
        return finish(nccl(format!("{size} per rank is not a whole number of 16-byte vectors (tpar's {collective} places each rank's part at a vector): NCCL")), notes);
    }
    // A forced kernel that cannot run this call here is noted and left out.
    let runs = |a: Algorithm| -> Result<(), String> {
        check(a, t, &f)?;
        match o.max_bytes {
            Some(m) if a == PULL => exposed_fits(collective, s, world, m),
            _ => Ok(()),
        }
    };
    match forced {
        Some(a) if a == PUSH || a == PULL => match runs(a) {
            Ok(()) => return finish(make(a, t, s, &f, format!("TPAR_ALGO={a} forced")), notes),
            Err(why) => notes.push(format!("TPAR_ALGO={a} ignored for the {collective}: {why}")),
        },
        _ => {}
    }
    let (k, chosen) = kernel_for(collective, input, &f, t, &runs);
    if let Err(why) = check(k, t, &f) {
        return finish(nccl(format!("{} cannot run here ({why}): NCCL", name(k))), notes);
    }
    // A tune's measurement on this machine, where it has a bucket for this call (a profile
    // that measured no such call says nothing here).
    if let Some(p) = input.profile.filter(|p| p.tables.iter().any(|t| t.collective == collective)) {
        let here = ProfileFingerprint::of_input(input.topology, world, input.backend, input.capture);
        match p.mismatch(&here) {
            Some(why) => notes.push(format!("profile ignored: {why}")),
            None => match p.lookup_for(collective, input.dtype, s) {
                Some(b) if b.algorithm == Algorithm::Nccl || ((b.algorithm == PUSH || b.algorithm == PULL) && runs(b.algorithm).is_ok()) => {
                    let within = format!("{collective} of {size} per rank <= {} ({world} ranks, {})", human_bytes(b.max_bytes), input.dtype);
                    let rival = b.rival.filter(|r| r.algorithm != b.algorithm);
                    let vs = match rival {
                        Some(r) => format!(" vs {} {:.1} us", name(r.algorithm), r.median_us),
                        None => " (nothing else timed)".to_string(),
                    };
                    let nccl_us = if b.algorithm == Algorithm::Nccl { Some(b.median_us) } else { rival.filter(|r| r.algorithm == Algorithm::Nccl).map(|r| r.median_us) };
                    let nccl_source = nccl_us.map(|_| Source::Profile);
                    let p = if b.algorithm == Algorithm::Nccl {
                        nccl(format!("tuned: {within}: NCCL {:.1} us{vs} (measured here): NCCL", b.median_us))
                    } else {
                        make(b.algorithm, t, s, &f, format!("tuned: {within}: {} {:.1} us{vs} (measured here)", name(b.algorithm), b.median_us))
                    };
                    return finish(p.timed(Some(b.median_us), Source::Profile, nccl_us, nccl_source), notes);
                }
                Some(b) if b.algorithm == PUSH || b.algorithm == PULL => notes.push(format!("profile's {} ignored for the {collective}: {}", b.algorithm, runs(b.algorithm).err().unwrap_or_default())),
                Some(b) => notes.push(format!("profile's {} ignored for the {collective}: only one-shot push, one-shot pull and NCCL compute it", b.algorithm)),
                None => notes.push(format!("profile has no {collective} bucket for {size} per rank {} at {world} ranks: simulator", input.dtype)),
            },
        }
    }
    // The simulator: tpar's kernels against NCCL's ring (n - 1 steps of the per-rank bytes).
    // They are timed as one-shot push, for the pull too: both move the per-rank bytes once
    // between every pair, and the simulator's read model (one window of reads in flight per
    // flow) is far below what a pull kernel's grid keeps in flight (8 MiB at 2 ranks on
    // NVLink: about 1 ms against push's 70 us), so it would send every large pull to NCCL.
    let launch = if input.capture == CaptureMode::Graph { Launch::Graph } else { Launch::Eager };
    let fabric = if f.nvlink { "NVLink" } else if t == Transport::Host { "PCIe through host memory" } else { "PCIe" };
    let timed = Simulator::new(input.topology, world, &Params::with_launch(launch)).and_then(|sim| {
        let b = usize::try_from(s).unwrap_or(usize::MAX);
        let ours = sim.predict_collective(collective, PUSH, b)?.total_us;
        let theirs = sim.predict_collective(collective, Algorithm::Nccl, b)?.total_us;
        let source = sim.provenance(PUSH)?.source;
        Ok((ours, theirs, source))
    });
    let kn = if k == PUSH { "one-shot push".to_string() } else { format!("{}, timed as one-shot push,", name(k)) };
    match timed {
        Ok((ours, theirs, source)) if ours <= theirs => {
            let why = format!("{fabric}, {world} ranks: {collective} of {size} per rank: {kn} {ours:.1} us vs NCCL {theirs:.1} us (simulator; NCCL's ring assumed){chosen}");
            finish(make(k, t, s, &f, why).timed(Some(ours), source, Some(theirs), Some(Source::Assumed)), notes)
        }
        Ok((ours, theirs, _)) => {
            let why = format!("{fabric}, {world} ranks: {collective} of {size} per rank: NCCL {theirs:.1} us vs {kn} {ours:.1} us (simulator; NCCL's ring assumed){chosen}: NCCL");
            finish(nccl(why).timed(Some(theirs), Source::Assumed, Some(theirs), Some(Source::Assumed)), notes)
        }
        Err(e) => finish(nccl(format!("the simulator cannot time this fabric ({e}): NCCL")), notes),
    }
}

/// An algorithm as the reasons name it.
fn name(a: Algorithm) -> &'static str {
    if a == PUSH {
        "one-shot push"
    } else if a == PULL {
        "one-shot pull"
    } else if a == Algorithm::Nccl {
        "NCCL"
    } else {
        a.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::plan::Overrides;
    use crate::topology::{presets, Topology};

    fn input<'a>(t: &'a Topology, o: &'a Overrides, world: usize, bytes: u64, backend: Backend) -> PlanInput<'a> {
        PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend, profile: None, overrides: o }
    }

    #[test]
    fn small_calls_push_and_large_ones_go_to_nccl_on_pcie() {
        let t = presets::rtxpro6000_pcie_switch_8();
        let o = Overrides::default();
        for k in [Collective::AllGather, Collective::ReduceScatter] {
            let small = plan_collective(k, &input(&t, &o, 8, 4096, Backend::Cuda));
            assert_eq!(small.algorithm, PUSH, "{k}: {}", small.reason);
            assert!(small.predicted_us.is_some() && small.nccl_us.is_some() && small.predicted_us <= small.nccl_us, "{small:?}");
            let large = plan_collective(k, &input(&t, &o, 8, 64 << 20, Backend::Cuda));
            assert_eq!(large.algorithm, Algorithm::Nccl, "{k}: {}", large.reason);
            assert!(large.reason.contains("NCCL") && large.reason.contains(k.name()), "{}", large.reason);
        }
    }

    #[test]
    fn odd_sizes_settings_and_cpu_ranks() {
        let t = presets::rtxpro6000_pcie_switch_8();
        let o = Overrides::default();
        let odd = plan_collective(Collective::AllGather, &input(&t, &o, 4, 4098, Backend::Cuda));
        assert_eq!(odd.algorithm, Algorithm::Nccl);
        assert!(odd.reason.contains("16-byte"), "{}", odd.reason);
        let off = Overrides { disable: true, ..Overrides::default() };
        assert_eq!(plan_collective(Collective::ReduceScatter, &input(&t, &off, 4, 4096, Backend::Cuda)).algorithm, Algorithm::Nccl);
        let two = Overrides { algorithm: Some(Algorithm::TwoshotPull), ..Overrides::default() };
        let p = plan_collective(Collective::AllGather, &input(&t, &two, 4, 4096, Backend::Cuda));
        assert_eq!(p.algorithm, PUSH);
        assert!(p.reason.contains("TPAR_ALGO=twoshot-pull ignored"), "{}", p.reason);
        let cpu = Topology::cpu();
        let c = plan_collective(Collective::ReduceScatter, &input(&cpu, &o, 4, 6, Backend::Cpu));
        assert_eq!((c.algorithm, c.transport), (PUSH, Transport::Shm));
        // The all-reduce is the all-reduce's plan.
        let ar = input(&t, &o, 4, 4096, Backend::Cuda);
        assert_eq!(plan_collective(Collective::AllReduce, &ar), plan(&ar));
    }

    /// NVLink, graphs: one-shot push up to the world's cut, one-shot pull above it (at 8 ranks
    /// at every size), and the reason says which and why; eager calls, PCIe and the host
    /// transport keep push, and a reduce-scatter whose exposed input the workspace cannot hold
    /// stays with push.
    #[test]
    fn graph_calls_on_nvlink_switch_from_push_to_pull_at_the_worlds_cut() {
        let t = presets::h200_nvswitch_8();
        let o = Overrides::default();
        for (k, cuts) in [(Collective::AllGather, ALL_GATHER_GRAPH_PUSH_MAX), (Collective::ReduceScatter, REDUCE_SCATTER_GRAPH_PUSH_MAX)] {
            for (world, cut) in [(2usize, cuts[0]), (3, cuts[1]), (4, cuts[1]), (8, cuts[2])] {
                if cut > 0 {
                    let at = plan_collective(k, &input(&t, &o, world, cut, Backend::Cuda));
                    assert_eq!(at.algorithm, PUSH, "{k} {world} ranks at the cut: {}", at.reason);
                    assert!(at.reason.contains(&format!("one-shot push: graph, <= {} per rank at {world} ranks", human_bytes(cut))), "{}", at.reason);
                }
                let size = if cut > 0 { 2 * cut } else { 1024 };
                let above = plan_collective(k, &input(&t, &o, world, size, Backend::Cuda));
                assert_eq!((above.algorithm, above.transport), (PULL, Transport::P2p), "{k} {world} ranks above the cut: {}", above.reason);
                let said = if cut > 0 { format!("one-shot pull: graph, above {} per rank at {world} ranks", human_bytes(cut)) } else { format!("one-shot pull: graph, at every size at {world} ranks") };
                assert!(above.reason.contains(&said), "{}", above.reason);
                assert!(above.predicted_us.is_some() && above.nccl_us.is_some(), "{above:?}");
                let eager = plan_collective(k, &PlanInput { capture: CaptureMode::Eager, ..input(&t, &o, world, size, Backend::Cuda) });
                assert_ne!(eager.algorithm, PULL, "{k} eager: {}", eager.reason);
            }
        }
        // The reduce-scatter's pull exposes world x the per-rank bytes: 8 x 1 MiB needs a
        // workspace of at least 4 MiB (twice max_bytes holds it); the all-gather only its part.
        let small = Overrides { max_bytes: Some(3 << 20), ..Overrides::default() };
        let rs = plan_collective(Collective::ReduceScatter, &input(&t, &small, 8, 1 << 20, Backend::Cuda));
        assert_eq!(rs.algorithm, PUSH, "{}", rs.reason);
        assert!(rs.reason.contains("exposes every rank's piece"), "{}", rs.reason);
        let fits = PULL;
        assert_eq!(plan_collective(Collective::AllGather, &input(&t, &small, 8, 1 << 20, Backend::Cuda)).algorithm, fits);
        let roomy = Overrides { max_bytes: Some(4 << 20), ..Overrides::default() };
        assert_eq!(plan_collective(Collective::ReduceScatter, &input(&t, &roomy, 8, 1 << 20, Backend::Cuda)).algorithm, fits);
        // Forced: pull where it runs; over the host transport it cannot (it reads peers), and
        // the note says so.
        let forced = Overrides { algorithm: Some(PULL), ..Overrides::default() };
        let f = plan_collective(Collective::AllGather, &input(&t, &forced, 8, 4096, Backend::Cuda));
        assert_eq!((f.algorithm, f.reason.as_str()), (PULL, "TPAR_ALGO=oneshot-pull forced"));
        let host = Overrides { algorithm: Some(PULL), transport: Some(Transport::Host), ..Overrides::default() };
        let h = plan_collective(Collective::ReduceScatter, &input(&t, &host, 8, 1 << 20, Backend::Cuda));
        assert_ne!(h.algorithm, PULL, "{}", h.reason);
        assert!(h.reason.contains("TPAR_ALGO=oneshot-pull ignored for the reduce-scatter"), "{}", h.reason);
        // PCIe: push (or NCCL) at every size; never the pull.
        let pcie = presets::rtxpro6000_pcie_switch_8();
        for bytes in [4096u64, 1 << 20, 8 << 20] {
            for k in [Collective::AllGather, Collective::ReduceScatter] {
                assert_ne!(plan_collective(k, &input(&pcie, &o, 8, bytes, Backend::Cuda)).algorithm, PULL, "{k} {bytes} on PCIe");
            }
        }
    }

    /// A tune's profile of the switch box, graph mode: the all-gather's push measured slower
    /// than NCCL up to 8 KiB per rank and faster up to 64 KiB (the simulator says push at
    /// 4 KiB: the measurement overrides it), and an all-reduce table.
    fn tuned_profile(t: &Topology) -> crate::plan::profile::Profile {
        use crate::plan::profile::{Profile, ProfileFingerprint};
        use crate::report::Record;
        let rec = |c: Collective, a: Algorithm, per_rank: usize, us: f64| Record::measured_for(c, a, "cuda", DType::BF16, 8, per_rank / 2 * if c == Collective::AllReduce { 1 } else { 8 }, (us, us, us), 0);
        let records = vec![
            rec(Collective::AllGather, PUSH, 8192, 30.0),
            rec(Collective::AllGather, Algorithm::Nccl, 8192, 12.5),
            rec(Collective::AllGather, PUSH, 65536, 20.0),
            rec(Collective::AllGather, Algorithm::Nccl, 65536, 40.0),
            rec(Collective::AllReduce, Algorithm::OneshotPush, 65536, 9.0),
            rec(Collective::AllReduce, Algorithm::Nccl, 65536, 30.0),
        ];
        Profile::from_measurements(&records, ProfileFingerprint::new(t, None, Backend::Cuda, 8, CaptureMode::Graph))
    }

    #[test]
    fn a_tuned_bucket_decides_with_both_figures_and_the_simulator_keeps_the_rest() {
        let t = presets::rtxpro6000_pcie_switch_8();
        let o = Overrides::default();
        let p = tuned_profile(&t);
        let with = |bytes, capture| PlanInput { profile: Some(&p), capture, ..input(&t, &o, 8, bytes, Backend::Cuda) };
        // The simulator picks push at 4 KiB per rank; the tune measured NCCL faster there.
        assert_eq!(plan_collective(Collective::AllGather, &input(&t, &o, 8, 4096, Backend::Cuda)).algorithm, PUSH);
        let got = plan_collective(Collective::AllGather, &with(4096, CaptureMode::Graph));
        assert_eq!(got.algorithm, Algorithm::Nccl, "{got}");
        assert!(got.reason.starts_with("tuned:") && got.reason.contains("NCCL 12.5 us vs one-shot push 30.0 us"), "{}", got.reason);
        assert_eq!((got.predicted_us, got.nccl_us, got.source), (Some(12.5), Some(12.5), Some(Source::Profile)));
        let got = plan_collective(Collective::AllGather, &with(65536, CaptureMode::Graph));
        assert_eq!((got.algorithm, got.transport), (PUSH, Transport::P2p), "{got}");
        assert!(got.reason.contains("one-shot push 20.0 us vs NCCL 40.0 us"), "{}", got.reason);
        assert_eq!((got.predicted_us, got.nccl_us), (Some(20.0), Some(40.0)));
        // Above the largest tuned size, the simulator, and the reason says why.
        let above = plan_collective(Collective::AllGather, &with(1 << 20, CaptureMode::Graph));
        assert!(above.reason.contains("(simulator; NCCL's ring assumed)") && above.reason.contains("profile has no all-gather bucket"), "{}", above.reason);
        // No reduce-scatter table: the simulator's plan, unchanged, without a note.
        let rs = plan_collective(Collective::ReduceScatter, &with(4096, CaptureMode::Graph));
        assert_eq!(rs, plan_collective(Collective::ReduceScatter, &input(&t, &o, 8, 4096, Backend::Cuda)));
        // Measured in graph mode: an eager call ignores it, and says so.
        let eager = plan_collective(Collective::AllGather, &with(4096, CaptureMode::Eager));
        assert_eq!(eager.algorithm, PUSH, "{eager}");
        assert!(eager.reason.contains("profile ignored: tuned in graph mode, not eager"), "{}", eager.reason);
        // Settings still come first.
        let off = Overrides { disable: true, ..Overrides::default() };
        let d = plan_collective(Collective::AllGather, &PlanInput { profile: Some(&p), ..input(&t, &off, 8, 65536, Backend::Cuda) });
        assert!(d.reason.starts_with("TPAR_DISABLE"), "{}", d.reason);
        // The all-reduce's decisions with this profile are those with its all-reduce table alone.
        let mut ar_only = p.clone();
        ar_only.tables.retain(|t| t.collective == Collective::AllReduce);
        for bytes in [4096, 65536, 1 << 20] {
            assert_eq!(plan(&with(bytes, CaptureMode::Graph)), plan(&PlanInput { profile: Some(&ar_only), ..with(bytes, CaptureMode::Graph) }), "{bytes}");
        }
    }
}
