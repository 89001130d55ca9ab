//! Where each figure the simulator times a kernel with comes from: a tune on this machine
//! (profile), tpar's link probe (probe), a public figure for this exact box (published), or
//! nothing that constrains it (assumed: a link class's default, an extrapolation).
//!
//! Owns: [`Source`] and the answer, per ordered pair of GPUs and per operation (SM stores,
//! SM loads), of what the simulator's rate for that operation *under all-to-all load* rests
//! on. An all-reduce loads every link at once, and load is where fabrics fail (the founding
//! case: reads that ran at 51 GB/s alone collapsed under all eight GPUs), so a figure
//! measured alone does not count as measuring the collective's deciding links.
//! Must never: read files or the environment, or decide anything (the plan decides).

use crate::topology::presets::{self, LinkOp};
use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a number comes from, most trusted first (the derived order is the trust order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Measured on this machine by a tune (a profile's timings, or the probe it carries).
    Profile,
    /// Measured on this machine by tpar's link probe (`tpar topo --probe`).
    Probe,
    /// A public figure for this exact box: docs/references.md, or tpar's own results in
    /// bench/results/ for that kind of machine.
    Published,
    /// No figure for this box constrains it: a default, or an extrapolation from other boxes.
    Assumed,
}

impl Source {
    /// Every source, most trusted first.
    pub const ALL: [Source; 4] = [Source::Profile, Source::Probe, Source::Published, Source::Assumed];

    pub fn name(self) -> &'static str {
        match self {
            Source::Profile => "profile",
            Source::Probe => "probe",
            Source::Published => "published",
            Source::Assumed => "assumed",
        }
    }

    /// Whether something measured the figure (on this machine, or published for this box).
    pub fn measured(self) -> bool {
        self != Source::Assumed
    }

    /// The less trusted of two: what a result resting on both rests on.
    pub fn weaker(self, other: Source) -> Source {
        self.max(other)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of pair a figure is about (for reasons and tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PairKind {
    NvLink,
    SameSwitch,
    /// One socket, through the root complex (different switches, or root ports).
    AcrossSwitches,
    AcrossSockets,
    /// A GPU and pinned host memory (the host transport).
    Host,
}

impl PairKind {
    pub fn name(self) -> &'static str {
        match self {
            PairKind::NvLink => "over NVLink",
            PairKind::SameSwitch => "inside a switch",
            PairKind::AcrossSwitches => "across switches or root ports of one socket",
            PairKind::AcrossSockets => "across sockets",
            PairKind::Host => "to and from host memory",
        }
    }

    /// The kind of the pair (a, b) of `t` (`b` None: host memory).
    pub fn of(t: &Topology, a: usize, b: Option<usize>) -> PairKind {
        let Some(b) = b else { return PairKind::Host };
        if t.link(a, b).is_some_and(|l| l.class.is_nvlink()) {
            return PairKind::NvLink;
        }
        let (ga, gb) = (&t.gpus[a.min(t.gpus.len().saturating_sub(1))], &t.gpus[b.min(t.gpus.len().saturating_sub(1))]);
        if ga.socket != gb.socket {
            PairKind::AcrossSockets
        } else if ga.switch.is_some() && ga.switch == gb.switch {
            PairKind::SameSwitch
        } else {
            PairKind::AcrossSwitches
        }
    }
}

/// One figure a prediction rests on: an operation between a kind of pair, under load.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub op: LinkOp,
    pub pairs: PairKind,
    pub source: Source,
    /// Where it came from, or (assumed) what the simulator uses instead.
    pub cite: String,
}

impl Figure {
    /// `SM stores under load across sockets: assumed (pair alone: 2.7 GB/s, published)`.
    pub fn describe(&self) -> String {
        format!("{} under load {}: {} ({})", self.op.name(), self.pairs.name(), self.source, self.cite)
    }
}

/// Where NVLink figures come from: NVLink 4 writes measured at 371-377 GB/s (nccl #1264), and
/// tpar's own kernels timed on 2-4 H200s (bench/results/2026-11-29-h200-x4-all-algorithms/README.md).
pub const NVLINK_CITE: &str = "NVLink writes 371-377 GB/s (nccl #1264); tpar's kernels on 2-4 H200s (bench/results/2026-11-29-h200-x4-all-algorithms/README.md)";

/// What the probe's origin makes of a figure it carries: a preset's published figures, or
/// tpar's own probe (a profile's probe is upgraded to [`Source::Profile`] by the caller, who
/// knows where the topology came from).
pub(crate) fn probe_source(t: &Topology) -> Source {
    match &t.probe {
        Some(p) if p.source.starts_with("published") => Source::Published,
        Some(_) => Source::Probe,
        None => Source::Assumed,
    }
}

/// The source of the simulator's rate for `op` issued by GPU `issuer` against `target`'s
/// memory (`None`: host memory) under all-to-all load, with its citation.
pub fn op_source(t: &Topology, op: LinkOp, issuer: usize, target: Option<usize>) -> (Source, String) {
    op_source_on(t, presets::exact(t), op, issuer, target)
}

/// [`op_source`] with the preset `t` is (if any) worked out once by the caller.
pub(crate) fn op_source_on(t: &Topology, exact: Option<&'static str>, op: LinkOp, issuer: usize, target: Option<usize>) -> (Source, String) {
    let kind = PairKind::of(t, issuer, target);
    if kind == PairKind::NvLink {
        return (Source::Published, NVLINK_CITE.into());
    }
    let q = t.probe.as_ref().and_then(|p| p.pair(issuer, target));
    let (loaded, alone) = match op {
        LinkOp::Store => (q.and_then(|q| q.sm_store_loaded_gbps), q.and_then(|q| q.sm_store_gbps)),
        LinkOp::Load => (q.and_then(|q| q.sm_load_loaded_gbps), q.and_then(|q| q.sm_load_gbps)),
    };
    if let Some(g) = loaded {
        let origin = t.probe.as_ref().map(|p| p.source.clone()).unwrap_or_default();
        return (probe_source(t), format!("{g:.1} GB/s under all-to-all load ({origin})"));
    }
    // A preset's evidence speaks for its published figures; a probe of the machine itself
    // (tpar's, or a profile's) replaces both.
    let own_probe = probe_source(t) == Source::Probe;
    if let (Some(b), Some(name), false) = (target, exact, own_probe) {
        if let Some(e) = presets::evidence_on(t, name, op, issuer, b) {
            return (Source::Published, format!("{} ({})", e.what, e.source));
        }
    }
    let instead = match alone {
        Some(g) => format!("no figure under load for this box; the pair alone: {g:.1} GB/s ({})", probe_source(t)),
        None => "no figure for this box; the link class's default".to_string(),
    };
    (Source::Assumed, instead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    #[test]
    fn order_is_trust_and_weaker_takes_the_least_trusted() {
        assert!(Source::Profile < Source::Probe && Source::Probe < Source::Published && Source::Published < Source::Assumed);
        assert_eq!(Source::Published.weaker(Source::Assumed), Source::Assumed);
        assert_eq!(Source::Probe.weaker(Source::Published), Source::Published);
        assert!(!Source::Assumed.measured() && Source::Profile.measured());
    }

    #[test]
    fn sources_follow_the_box_not_its_look_alike() {
        // NVLink: published.
        let h = presets::h200_nvswitch_8();
        assert_eq!(op_source(&h, LinkOp::Store, 0, Some(1)).0, Source::Published);
        // The switch box: stores published (the collapse test), loads under load assumed.
        let sw = presets::rtxpro6000_pcie_switch_8();
        assert_eq!(op_source(&sw, LinkOp::Store, 0, Some(5)).0, Source::Published);
        assert_eq!(op_source(&sw, LinkOp::Load, 0, Some(5)).0, Source::Assumed);
        // The same shape under another name is not that box.
        let mut other = sw.clone();
        other.name = "discovered".into();
        assert_eq!(op_source(&other, LinkOp::Store, 0, Some(5)).0, Source::Assumed);
        // The two-socket box: stores alone are published (2.7 GB/s), under load they are not.
        let ds = presets::rtxpro6000_dualsocket_8();
        let (s, why) = op_source(&ds, LinkOp::Store, 0, Some(4));
        assert_eq!(s, Source::Assumed);
        assert!(why.contains("2.7"), "{why}");
        // A probe that measured loads under load makes them measured (probe).
        let mut probed = ds.clone();
        if let Some(p) = probed.probe.as_mut() {
            p.source = "measured by tpar's link probe".into();
            for q in &mut p.pairs {
                q.sm_load_loaded_gbps = Some(6.0);
            }
        }
        assert_eq!(op_source(&probed, LinkOp::Load, 0, Some(4)).0, Source::Probe);
        assert_eq!(PairKind::of(&ds, 0, Some(4)), PairKind::AcrossSockets);
        assert_eq!(PairKind::of(&sw, 0, Some(1)), PairKind::SameSwitch);
        assert_eq!(PairKind::of(&sw, 0, None), PairKind::Host);
    }
}
