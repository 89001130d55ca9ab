//! The plan's word on the copy-engine path (`ce-ring`) where its defaults send a large PCIe
//! call to NCCL: the simulator's time for it beside NCCL's, and where its rates came from.
//!
//! Owns: that note. Must never: pick `ce-ring` (only a tuned profile that measured it does).

use super::feasibility::{check, natural_transport, Fabric};
use super::sim_cost;
use crate::kinds::{Algorithm, CaptureMode};
use crate::sim::Source;
use crate::topology::Topology;

/// What the simulator says of `ce-ring` (copy engines) for a large PCIe call the default
/// plan sends to NCCL: `ce-ring` is picked only from a tuned profile that measured it on this
/// machine (`Role::Measured`), so an unmeasured prediction, however fast, only shows in the
/// reason, with where its copy-engine rates came from.
pub(super) fn ce_ring_note(s: u64, f: &Fabric, topo: &Topology, capture: CaptureMode) -> String {
    let a = Algorithm::CeRing;
    if check(a, natural_transport(a, f), f).is_err() {
        return String::new();
    }
    let n = f.world;
    let costs = sim_cost::costs(topo, n, s, capture, &[a, Algorithm::Nccl]);
    let cost = |x: Algorithm| costs.iter().find(|(b, _)| *b == x).and_then(|(_, c)| c.as_ref().ok()).filter(|c| c.us.is_finite());
    let (Some(ce), Some(nc)) = (cost(a), cost(Algorithm::Nccl)) else {
        return String::new();
    };
    let (ce, nc, source) = (ce.us, nc.us, ce.source);
    let probed = topo.probe.as_ref().is_some_and(|p| (0..n).all(|i| (0..n).filter(|&j| j != i).all(|j| p.pair(i, Some(j)).is_some_and(|q| q.ce_gbps.is_some()))));
    // The rates come from the topology's probe: a preset's is published figures, a machine's
    // own is tpar's link probe; the label names which (never "measured" for a preset).
    let rates = match (probed, crate::sim::provenance::probe_source(topo)) {
        (true, Source::Published) => "copy-engine rates published for this box (the preset's probe)",
        (true, _) => "copy-engine rates measured by tpar's link probe",
        (false, _) => "copy-engine rates assumed (the links' rates)",
    };
    format!("; the simulator times ce-ring at {ce:.1} us against NCCL {nc:.1} us ({rates}, per-copy start assumed; the time as a whole: {source}): unmeasured on this machine, so NCCL until `tpar tune` measures ce-ring")
}
