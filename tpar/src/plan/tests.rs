//! The plan's unit tests (decision, logging, fingerprint, overrides).

use super::*;
use crate::topology::presets;

fn run(t: &Topology, world: usize, bytes: u64, backend: Backend, o: &Overrides) -> Plan {
    plan(&PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend, profile: None, overrides: o })
}

#[test]
fn debug_logs_each_decision_once() {
    assert!(first_time("tpar test line A"));
    assert!(!first_time("tpar test line A"));
    assert!(first_time("tpar test line B"));
    let t = presets::pcie_2();
    let o = Overrides::from_pairs([("TPAR_DEBUG", "INFO")]).unwrap();
    let input = PlanInput { topology: &t, world: 2, bytes: 8, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o };
    assert_eq!(plan_logged(&input), plan(&input));
}

#[test]
fn the_pick_carries_its_time_and_where_it_comes_from() {
    // Issue 14's case on the switch box: a tpar kernel, its time and NCCL's from the
    // simulator, and the pick's figures published (the collapse test on that box).
    let t = presets::rtxpro6000_pcie_switch_8();
    let p = run(&t, 8, 42 * 1024, Backend::Cuda, &Overrides::default());
    assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
    let (us, nccl_us) = (p.predicted_us.unwrap(), p.nccl_us.unwrap());
    assert!(us < nccl_us && p.gain().unwrap() > 1.0, "{p:?}");
    assert_eq!(p.source, Some(Source::Published), "{p:?}");
    assert!(p.reason.contains(&format!("{us:.1} us")), "{p}");
    // A forced setting decides without figures, and says so by having none.
    let o = Overrides::from_pairs([("TPAR_ALGO", "oneshot-push")]).unwrap();
    let p = run(&t, 8, 42 * 1024, Backend::Cuda, &o);
    assert_eq!((p.source, p.predicted_us), (None, None), "{p:?}");
}

#[test]
fn an_unmeasured_figure_decides_only_where_it_holds_at_the_bound() {
    // The two-socket box: its stores under load are unmeasured (only a pair alone is
    // published, 2.7 GB/s). Small calls keep a tpar kernel that beats NCCL even at the
    // bound; at 42 KiB the simulator's fastest kernel loses to NCCL there, so NCCL, with
    // the kernel, its time at the bound and the unmeasured figure named.
    let ds = presets::rtxpro6000_dualsocket_8();
    let small = plan(&PlanInput { topology: &ds, world: 8, bytes: 1024, dtype: DType::BF16, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &Overrides::default() });
    assert_ne!(small.algorithm, Algorithm::Nccl, "{small}");
    assert_eq!(small.source, Some(Source::Assumed));
    let b = small.bound_us.unwrap();
    assert!(b < small.nccl_us.unwrap() && small.reason.contains("holds at the bound"), "{small:?}");
    let mid = plan(&PlanInput { bytes: 42 * 1024, ..PlanInput { topology: &ds, world: 8, bytes: 0, dtype: DType::BF16, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &Overrides::default() } });
    assert_eq!(mid.algorithm, Algorithm::Nccl, "{mid}");
    let u = mid.instead_of.unwrap();
    assert!(u.bound_us >= mid.nccl_us.unwrap() && u.us < mid.nccl_us.unwrap(), "{mid:?}");
    assert!(mid.reason.contains("unmeasured SM stores under load") && mid.reason.contains(&format!("{:.1} us", u.bound_us)), "{mid}");
    // Where NCCL cannot join (ranks sharing one GPU), the kernel it stood in for runs, over
    // the communicator's transport, and says why; a plan that chose NCCL for another reason
    // (or a kernel) has no stand-in.
    let k = mid.without_nccl("invalid usage", Transport::Host).unwrap();
    assert_eq!((k.algorithm, k.transport, k.blocks), (u.algorithm, Transport::Host, 0), "{k:?}");
    assert!(k.reason.contains("NCCL did not join (invalid usage)") && k.reason.contains(&mid.reason), "{k}");
    assert!(k.instead_of.is_none() && k.nccl_us.is_none(), "{k:?}");
    assert!(small.without_nccl("x", Transport::Host).is_none());
    // A forced algorithm keeps the plan's figures; NCCL always runs over NCCL.
    let f = small.replaced(Algorithm::Nccl, Transport::Host, "forced".into());
    assert_eq!((f.algorithm, f.transport, f.blocks, f.predicted_us, f.reason.as_str()), (Algorithm::Nccl, Transport::Nccl, 0, small.predicted_us, "forced"), "{f:?}");
    let o = Overrides::from_pairs([("TPAR_DISABLE", "1")]).unwrap();
    let off = plan(&PlanInput { topology: &ds, world: 8, bytes: 42 * 1024, dtype: DType::BF16, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o });
    assert_eq!(off.algorithm, Algorithm::Nccl, "{off}");
    assert!(off.without_nccl("x", Transport::Host).is_none(), "{off:?}");
    // Measure the same figures (a probe of this machine) and the simulator's pick stands.
    let mut probed = ds.clone();
    if let Some(pr) = probed.probe.as_mut() {
        pr.source = "measured by tpar's link probe (test)".into();
        for q in &mut pr.pairs {
            q.sm_store_loaded_gbps = Some(2.7 / 7.0);
            q.sm_load_loaded_gbps = Some(6.0);
        }
    }
    let p = plan(&PlanInput { topology: &probed, world: 8, bytes: 42 * 1024, dtype: DType::BF16, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &Overrides::default() });
    assert!(p.instead_of.is_none() && p.bound_us.is_none(), "{p:?}");
    assert!(matches!(p.source, Some(Source::Probe) | Some(Source::Published)), "{p:?}");
}

#[test]
fn the_motivating_case_gets_a_custom_kernel() {
    // 8x RTX PRO 6000 over PCIe, 42 KiB verify all-reduce: not NCCL.
    let t = presets::rtxpro6000_pcie_switch_8();
    let p = run(&t, 8, 42 * 1024, Backend::Cuda, &Overrides::default());
    assert_eq!(p.transport, Transport::P2p, "{p}");
    assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
    assert!(p.reason.contains("simulator"), "{p}");
    assert!(p.blocks >= 1 && p.blocks <= PCIE_MAX_BLOCKS);
}

#[test]
fn shapes_follow_the_design() {
    let o = Overrides::default();
    let h = presets::h200_nvswitch_8();
    assert_eq!(run(&h, 8, 16 * 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
    // Graphs (registered buffers): the rule measured against vLLM's kernel (floors.rs).
    assert_eq!(run(&h, 8, 64 * 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPull);
    assert_eq!(run(&h, 8, 1 << 20, Backend::Cuda, &o).algorithm, Algorithm::TwoshotPull);
    assert_eq!(run(&h, 8, 16 << 20, Backend::Cuda, &o).algorithm, Algorithm::TwoshotPull);
    assert_eq!(run(&h, 2, 512 * 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
    assert_eq!(run(&h, 2, 1 << 20, Backend::Cuda, &o).algorithm, Algorithm::TwoshotPull);
    assert_eq!(run(&h, 8, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
    // Eager calls copy: the eager rule, NCCL above 2 MiB.
    let eager = |w: usize, b: u64| {
        plan(&PlanInput { topology: &h, world: w, bytes: b, dtype: DType::BF16, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o }).algorithm
    };
    assert_eq!(eager(8, 1 << 20), Algorithm::TwoshotPush);
    assert_eq!(eager(8, 4 << 20), Algorithm::Nccl);
    let sw = presets::rtxpro6000_pcie_switch_8();
    assert_eq!(run(&sw, 8, 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
    assert_eq!(run(&sw, 8, 16 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
    let ds = presets::rtxpro6000_dualsocket_8();
    // Two sockets: hierarchical is a candidate (it is timed, not refused).
    let p = run(&ds, 8, 256 * 1024, Backend::Cuda, &o);
    assert!(!p.reason.contains("hierarchical cannot run"), "{p}");
    // No P2P: the simulator times the host transport against NCCL; tiny calls go through
    // shared host memory, large ones to NCCL.
    let np = presets::rtx4090_nop2p_4();
    let p = run(&np, 4, 64, Backend::Cuda, &o);
    assert_eq!((p.algorithm, p.transport), (Algorithm::OneshotPush, Transport::Host), "{p}");
    assert!(p.reason.contains("no P2P") && p.reason.contains("simulator"), "{p}");
    assert_eq!(run(&np, 4, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
    assert_eq!(run(&np, 8, 8, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
    let c = Topology::cpu();
    let p = run(&c, 4, 8, Backend::Cpu, &o);
    assert_eq!((p.algorithm, p.transport, p.blocks), (Algorithm::OneshotPush, Transport::Shm, 1));
    assert_eq!(run(&c, 4, 1 << 20, Backend::Cpu, &o).algorithm, Algorithm::TwoshotPush);
    let p = run(&h, 1, 1 << 20, Backend::Cuda, &o);
    assert!(p.reason.starts_with("world 1: copy"), "{p}");
}

#[test]
fn infeasible_overrides_are_ignored_by_plan_and_refused_by_validate() {
    let np = presets::rtx4090_nop2p_4();
    let o = Overrides::from_pairs([("TPAR_ALGO", "oneshot-pull")]).unwrap();
    let p = run(&np, 4, 1024, Backend::Cuda, &o);
    assert_ne!(p.algorithm, Algorithm::OneshotPull);
    assert!(p.reason.contains("TPAR_ALGO=oneshot-pull over host ignored"), "{p}");
    assert!(o.validate(&np, 4, Backend::Cuda).is_err());
}
