//! Copy-engine flows (`Op::Copy`, `cuMemcpyAsync`): routed like a posted write of the source
//! GPU, peer to peer or into host memory, but moved by a copy engine, not by SM stores. So
//! no kernel injection limit and no SM-store cap (behind switches whose SM stores collapse,
//! copy engines keep ~56 GB/s: docs/references.md), capped instead by the probe's
//! copy-engine rate of the pair alone where it was measured. The probe's loaded copy-engine
//! figure describes all-to-all copies, which `ce-ring` never issues (one copy per engine at
//! a time): the fabric's own resources decide how its shifted copies share links.
//!
//! Owns: that routing. Must never: decide what is copied (`algorithms::ce_ring`).

use super::{Endpoint, Fabric, FlowSpec};
use crate::error::{Error, Result};

impl Fabric {
    pub(super) fn copy_flow(&self, src: Endpoint, dst: Endpoint, bytes: f64) -> Result<FlowSpec> {
        let p = &self.params;
        match (src, dst) {
            (Endpoint::Gpu(a), Endpoint::Gpu(b)) => {
                if !self.p2p_write[a][b] {
                    return Err(Error::Unsupported {
                        what: format!("copy-engine copy GPU{a}->GPU{b}"),
                        reason: "the topology says P2P is off for this pair".into(),
                    });
                }
                let (r, lat, _, _) = self.p2p_route(a, b)?;
                let mut f = FlowSpec::new(r, bytes, lat);
                if let Some(cap) = self.ce_cap[a][b] {
                    f.rate_cap_gbps = cap;
                }
                Ok(f)
            }
            (Endpoint::Gpu(a), Endpoint::Host(s)) => {
                let (mut r, sa) = self.up(a)?;
                r.extend(self.across(sa, s)?.into_iter().filter(|x| !self.rc.contains(x)));
                r.push(*self.mem.get(s).ok_or_else(|| Error::invalid("socket", format!("no socket {s}")))?);
                let lat = p.pcie_egress_us + p.rc_hop_us + if sa != s { p.socket_hop_us + p.rc_hop_us } else { 0.0 };
                Ok(FlowSpec::new(r, bytes, lat))
            }
            (s, d) => Err(Error::Unsupported {
                what: format!("a copy-engine copy from {s:?} to {d:?}"),
                reason: "the simulator routes copies from a GPU to a GPU or to host memory".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Fabric, Op};
    use super::*;
    use crate::sim::flows::simulate;
    use crate::sim::Params;
    use crate::topology::presets;

    #[test]
    fn copies_skip_the_collapsed_sm_stores_and_follow_the_probed_engine_rate() {
        // The dual-socket preset: SM stores collapse to 2.7 GB/s, copy engines 54.5 same NUMA.
        let t = presets::rtxpro6000_dualsocket_8();
        let f = Fabric::new(&t, 8, &Params::default()).unwrap();
        let bytes = 64e6;
        let time = |op| {
            let fl = f.flow(Endpoint::Gpu(0), Endpoint::Gpu(2), bytes, op).unwrap();
            simulate(&f.capacities(), &[fl]).unwrap()[0]
        };
        let (store, copy) = (time(Op::Write), time(Op::Copy));
        assert!(copy * 10.0 < store, "copy {copy} us vs collapsed stores {store} us");
        // No faster than the probed 54.5 GB/s.
        assert!(copy >= bytes / (54.5 * 1e3), "{copy}");
        assert!(f.flow(Endpoint::Gpu(0), Endpoint::Host(0), 1.0, Op::Copy).is_ok());
        assert!(f.flow(Endpoint::Host(0), Endpoint::Gpu(0), 1.0, Op::Copy).is_err());
        let np = presets::rtx4090_nop2p_4();
        let g = Fabric::new(&np, 4, &Params::default()).unwrap();
        assert!(g.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1.0, Op::Copy).is_err());
        assert!(g.flow(Endpoint::Gpu(0), Endpoint::Host(0), 1.0, Op::Copy).is_ok());
    }

    #[test]
    fn ce_ring_is_timed_on_every_p2p_preset_and_its_figures_are_assumed() {
        use crate::kinds::Algorithm;
        use crate::sim::provenance::Source;
        use crate::sim::Simulator;
        for t in presets::all() {
            let n = t.gpus.len().min(8);
            let sim = Simulator::new(&t, n, &Params::default()).unwrap();
            let p = sim.predict(Algorithm::CeRing, 64 << 20).unwrap();
            assert!(p.total_us.is_finite() && p.total_us > 0.0, "{}: {p:?}", t.name);
            // Twice the copies' bytes cannot beat the busiest link: a floor for the prediction.
            assert!(p.total_us >= 2.0 * (n - 1) as f64 * ((64 << 20) as f64 / n as f64) / (1e3 * 1e3), "{}: {}", t.name, p.total_us);
            assert_eq!(sim.provenance(Algorithm::CeRing).unwrap().source, Source::Assumed, "{}", t.name);
        }
    }
}
