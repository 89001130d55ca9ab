//! The fused all-reduce + (residual add) + RMSNorm's own pick of kernel, where it differs from
//! its all-reduce's. A fused call runs its all-reduce's algorithm's fused kernel by default
//! (`cuda/fused.rs`); the fused kernels do not rank as the all-reduces do, because what follows
//! the sum (the norm of every row, its exchange of tile sums, the quantized store) costs each
//! kernel differently. Where the kernels were timed fused against each other, the measured
//! winner is taken instead ([`FUSED_ONESHOT_PULL_MAX`]). A pure function of the plan's inputs
//! and the all-reduce's plan: the same on every rank (the fused descriptor names the kernel, so
//! a rank that decided otherwise meets a Mismatch, not a wrong sum).
//!
//! Owns: [`fused_kernel`]. Must never pick a kernel the fabric cannot run (`feasibility::check`)
//! nor override a choice the user or a measurement made (a forced algorithm, NCCL).

use super::feasibility::{check, Fabric};
use super::{human_bytes, Plan, PlanInput};
use crate::kinds::{Algorithm, Backend, CaptureMode, Transport};

const KIB: u64 = 1024;

/// NVLink (or one GPU's emulated ranks), calls captured in a CUDA graph, per world (<= 2,
/// <= 4, more): one-shot pull's fused kernel for fused calls of up to this many bytes of x
/// (rows x hidden x the dtype's size), whatever the all-reduce's plan picks there (`None`: the
/// all-reduce's pick, not yet timed fused against the others). Measured on one H200, 8
/// emulated ranks, bf16, graphs, every fused kernel on the same shapes in one call
/// (bench/results/2026-12-07-h200-fused-rows-nvfp4/, `family.txt` and `bench-rows.txt`,
/// median us per fused call, add-RMSNorm): one-shot pull's fused kernel was the fastest of the
/// four at every shape up to 5120 x 32 (320 KiB: 14.57 against two-shot pull's owned-rows
/// 15.36; 7168 x 16, 224 KiB: 11.42 against 14.45; 4096 x 1: 4.95 against one-shot push's
/// 5.68), and slower from 7168 x 32 (448 KiB: 17.76 against 15.65). The all-reduces alone rank
/// the other way there (two-shot pull 5.53 against one-shot pull's 8.52 at 224 KiB): the
/// owned-rows kernel's extra all-gather of the finished rows and the one-shot kernel's
/// redundant sum cost differently once a norm follows.
pub const FUSED_ONESHOT_PULL_MAX: [Option<u64>; 3] = [None, None, Some(320 * KIB)];

/// The plan a fused call of `input.bytes` (x's) takes instead of its all-reduce's `ar`, with
/// the reason (see the module doc); `None`: the all-reduce's. Declines where the user forced an
/// algorithm (`TPAR_ALGO`), where the all-reduce goes to NCCL (a setting, a size limit or a
/// measurement chose it), off NVLink's P2P transport, on eager launches (not timed fused), and
/// where one-shot pull cannot run on this fabric.
pub fn fused_kernel(input: &PlanInput<'_>, ar: &Plan) -> Option<Plan> {
    const PULL: Algorithm = Algorithm::OneshotPull;
    if input.backend != Backend::Cuda || input.capture != CaptureMode::Graph || input.overrides.algorithm.is_some() {
        return None;
    }
    if ar.algorithm == PULL || ar.algorithm == Algorithm::Nccl || ar.transport != Transport::P2p {
        return None;
    }
    let world = input.world.max(1);
    let f = Fabric::of(input.topology, world, input.backend);
    if !f.nvlink || !f.fits() {
        return None;
    }
    let max = FUSED_ONESHOT_PULL_MAX[if world <= 2 { 0 } else if world <= 4 { 1 } else { 2 }]?;
    if input.bytes > max || check(PULL, Transport::P2p, &f).is_err() {
        return None;
    }
    let reason = format!(
        "fused call, graph, {} <= {} at {world} ranks: one-shot pull's fused kernel (measured the fastest fused kernel there; the all-reduce alone takes {}: {})",
        human_bytes(input.bytes),
        human_bytes(max),
        ar.algorithm,
        ar.reason
    );
    Some(ar.replaced(PULL, Transport::P2p, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::plan::{plan, Overrides};
    use crate::topology::Topology;

    fn input<'a>(t: &'a Topology, o: &'a Overrides, world: usize, bytes: u64, capture: CaptureMode) -> PlanInput<'a> {
        PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: o }
    }

    #[test]
    fn eight_nvlink_ranks_take_oneshot_pulls_fused_kernel_up_to_the_measured_cut() {
        let t = crate::topology::presets::by_name("h200-nvswitch-8").unwrap();
        let o = Overrides::default();
        // 7168 x 16 bf16: the all-reduce alone is two-shot pull's; fused, one-shot pull's.
        let i = input(&t, &o, 8, 7168 * 16 * 2, CaptureMode::Graph);
        let ar = plan(&i);
        assert_eq!(ar.algorithm, Algorithm::TwoshotPull, "{}", ar.reason);
        let p = fused_kernel(&i, &ar).expect("one-shot pull's fused kernel");
        assert_eq!((p.algorithm, p.transport), (Algorithm::OneshotPull, Transport::P2p));
        assert!(p.reason.contains("two-shot") || p.reason.contains("twoshot"), "{}", p.reason);
        // 1 row of 4096: the all-reduce is one-shot push's; fused, one-shot pull's.
        let i = input(&t, &o, 8, 4096 * 2, CaptureMode::Graph);
        assert_eq!(fused_kernel(&i, &plan(&i)).map(|p| p.algorithm), Some(Algorithm::OneshotPull));
        // Above the cut (7168 x 32), eager, or at 4 ranks (not timed fused): the all-reduce's.
        for (w, b, c) in [(8, 7168 * 32 * 2, CaptureMode::Graph), (8, 7168 * 16 * 2, CaptureMode::Eager), (4, 7168 * 16 * 2, CaptureMode::Graph)] {
            let i = input(&t, &o, w, b, c);
            assert!(fused_kernel(&i, &plan(&i)).is_none(), "{w} ranks, {b} B, {c:?}");
        }
    }

    #[test]
    fn a_forced_algorithm_nccl_and_pcie_keep_the_all_reduces_pick() {
        let nv = crate::topology::presets::by_name("h200-nvswitch-8").unwrap();
        let forced = Overrides { algorithm: Some(Algorithm::TwoshotPull), ..Overrides::default() };
        let i = input(&nv, &forced, 8, 7168 * 16 * 2, CaptureMode::Graph);
        assert!(fused_kernel(&i, &plan(&i)).is_none());
        let o = Overrides::default();
        let i = input(&nv, &o, 8, 7168 * 16 * 2, CaptureMode::Graph);
        let nccl = plan(&i).replaced(Algorithm::Nccl, Transport::Nccl, "a measurement".into());
        assert!(fused_kernel(&i, &nccl).is_none());
        let pcie = crate::topology::presets::by_name("rtxpro6000-pcie-switch-8").unwrap();
        let i = input(&pcie, &o, 8, 7168 * 16 * 2, CaptureMode::Graph);
        assert!(fused_kernel(&i, &plan(&i)).is_none());
    }
}
