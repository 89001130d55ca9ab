//! Flow-level simulator of one host's GPU fabric: what each all-reduce algorithm would
//! cost on a machine we may not have.
//!
//! Owns: predictions for (topology, world, algorithm, bytes). The pieces, low to high:
//!
//! | file | owns |
//! |---|---|
//! | [`flows`] | max-min fair sharing of capacitated resources, event-driven progressive filling |
//! | [`params`] | every number not in the topology, with where it came from (spec / measured / fitted) |
//! | [`fabric`] | resources (links per direction, switch uplinks, root complexes, socket link, read trackers, host memory) and routes |
//! | [`calibrate`] | docs/references.md figures, the prediction for each, and the error |
//! | [`provenance`] | where each figure a prediction rests on comes from (profile, probe, published, assumed) |
//!
//! Contention is not typed in: when 8 GPUs write all peers at once, their flows meet on the
//! same GPU links, root complexes and socket link, and max-min sharing decides what each
//! gets. A step ends when its last flow lands plus its sync cost; a call costs its launch,
//! its fixed kernel work and its steps.
//!
//! Contract: pure and deterministic; no I/O; never panics; an algorithm that cannot run on a
//! fabric (a pull without P2P reads) is an `Unsupported` error, not a number.

pub mod calibrate;
pub mod fabric;
pub mod flows;
pub mod params;
pub mod provenance;

use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::kinds::{Algorithm, Collective};
use crate::kinds::Transport;
use fabric::Fabric;
pub use params::{Launch, Params};
pub use provenance::{Figure, PairKind, Source};
use crate::algorithms::registry;
use crate::algorithms::schedule::{Op, Schedule, Sync};
use serde::{Deserialize, Serialize};

/// Kernel launches of one `ce-ring` call of one piece (`algorithms::ce_ring`).
const CE_RING_LAUNCHES: f64 = 8.0;

/// One prediction, as `tpar sim --json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimRecord {
    pub topology: String,
    pub algorithm: Algorithm,
    pub world: usize,
    pub bytes: usize,
    pub predicted_us: f64,
}

impl SimRecord {
    /// The prediction in `tpar bench --json`'s form (backend `sim`, bf16, unchecked), so
    /// predictions and measurements can share a plot or a `tpar model --bench` file.
    pub fn to_bench_record(&self) -> crate::report::Record {
        let (algbw, busbw) = crate::report::bandwidths(self.bytes, self.world, self.predicted_us);
        crate::report::Record {
            algorithm: self.algorithm,
            collective: Default::default(),
            backend: "sim".into(),
            dtype: crate::dtype::DType::BF16,
            world: self.world,
            bytes: self.bytes,
            count: self.bytes / crate::dtype::DType::BF16.size(),
            time_us: self.predicted_us,
            p10_us: self.predicted_us,
            p90_us: self.predicted_us,
            algbw,
            busbw,
            wrong: -1,
        }
    }
}

/// A prediction with where its time goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub algorithm: Algorithm,
    pub transport: Transport,
    pub total_us: f64,
    /// Launch and fixed kernel work.
    pub fixed_us: f64,
    /// Each step's (label, time in us).
    pub steps: Vec<(&'static str, f64)>,
}

/// What a kernel's predicted time rests on: the figures of the operations its schedule
/// moves bulk data with, per kind of pair, under load, and where each comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// The least trusted of the figures (`Published` when the kernel moves no bulk data over
    /// a link, e.g. one rank).
    pub source: Source,
    pub figures: Vec<Figure>,
}

impl Provenance {
    /// The figures in words, those of one operation with one source and citation together:
    /// `SM stores under load (inside a switch; across sockets): assumed (...)`.
    pub fn describe(&self) -> Vec<String> {
        let mut groups: Vec<(crate::topology::presets::LinkOp, Source, &str, Vec<&str>)> = Vec::new();
        for f in &self.figures {
            match groups.iter_mut().find(|g| g.0 == f.op && g.1 == f.source && g.2 == f.cite) {
                Some(g) => g.3.push(f.pairs.name()),
                None => groups.push((f.op, f.source, &f.cite, vec![f.pairs.name()])),
            }
        }
        groups.into_iter().map(|(op, source, cite, pairs)| format!("{} under load ({}): {source} ({cite})", op.name(), pairs.join("; "))).collect()
    }

    /// The figures no measurement covers, in words, one entry per operation (empty when all
    /// are measured): `SM stores under load (inside a switch; across sockets)`.
    pub fn unmeasured(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut ops: Vec<crate::topology::presets::LinkOp> = self.figures.iter().filter(|f| !f.source.measured()).map(|f| f.op).collect();
        ops.dedup();
        for op in ops {
            let pairs: Vec<&str> = self.figures.iter().filter(|f| f.op == op && !f.source.measured()).map(|f| f.pairs.name()).collect();
            out.push(format!("{} under load ({})", op.name(), pairs.join("; ")));
        }
        out
    }
}

/// A simulator for one topology and world size (the fabric is built once).
#[derive(Clone, Debug)]
pub struct Simulator {
    fabric: Fabric,
    /// The same fabric with NCCL's Simple protocol (NCCL takes the faster of LL and Simple).
    nccl_simple: Fabric,
    /// The same fabric with unmeasured figures at the bound ([`Fabric::bounded`]).
    bounded: Fabric,
    islands: Vec<Vec<u32>>,
    topology: Topology,
}

impl Simulator {
    /// Simulator for ranks `0..world` of `topo`.
    pub fn new(topo: &Topology, world: usize, params: &Params) -> Result<Simulator> {
        Ok(Simulator {
            fabric: Fabric::new(topo, world, params)?,
            nccl_simple: Fabric::new(topo, world, &params.nccl_simple())?,
            bounded: Fabric::bounded(topo, world, params)?,
            islands: topo.islands_of(world),
            topology: topo.clone(),
        })
    }

    /// The topology simulated.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The time of `algorithm` with every figure its prediction rests on that no
    /// measurement covers (see [`Simulator::provenance`]) at the bound,
    /// `Params::unmeasured_gpu_gbps` per GPU: the worst such rate published for any PCIe box.
    /// Equal to [`Simulator::predict`] where everything is measured, and for NCCL (the
    /// fallback the bound is compared against).
    pub fn predict_bound(&self, algorithm: Algorithm, bytes: usize) -> Result<Prediction> {
        if algorithm == Algorithm::Nccl {
            return self.predict(algorithm, bytes);
        }
        if bytes == 0 {
            return Err(Error::invalid("bytes", "an all-reduce of 0 bytes"));
        }
        self.predict_on(&self.bounded, algorithm, registry::spec(algorithm).schedule, bytes)
    }

    /// What `algorithm`'s prediction rests on: for each operation and kind of pair its
    /// schedule moves bulk data with, the source of the rate under load. An `Unsupported`
    /// error where the algorithm cannot run here.
    pub fn provenance(&self, algorithm: Algorithm) -> Result<Provenance> {
        use crate::topology::presets::LinkOp;
        let (_, steps) = (registry::spec(algorithm).schedule)(1024.0, &self.fabric, &self.islands)?;
        let mut seen: Vec<(LinkOp, PairKind, Source, String)> = Vec::new();
        let exact = crate::topology::presets::exact(&self.topology);
        // Copy-engine copies (`ce-ring`): no figure measures them under that algorithm's load
        // (the probe's copy figures are of a pair alone or of all-to-all copies), so a
        // prediction resting on them is assumed.
        let mut copies = false;
        if algorithm != Algorithm::Nccl {
            for st in &steps {
                for f in &st.flows {
                    if f.op == Op::Copy {
                        copies = true;
                        continue;
                    }
                    let (op, issuer, target) = match (f.src, f.dst, f.op) {
                        (fabric::Endpoint::Gpu(a), fabric::Endpoint::Gpu(b), Op::Write) => (LinkOp::Store, a, Some(b)),
                        (fabric::Endpoint::Gpu(a), fabric::Endpoint::Gpu(b), Op::Read) => (LinkOp::Load, b, Some(a)),
                        (fabric::Endpoint::Gpu(a), fabric::Endpoint::Host(_), _) => (LinkOp::Store, a, None),
                        (fabric::Endpoint::Host(_), fabric::Endpoint::Gpu(b), _) => (LinkOp::Load, b, None),
                        _ => continue,
                    };
                    let kind = PairKind::of(&self.topology, issuer, target);
                    let source = self.fabric.op_source(op, issuer, target);
                    match seen.iter_mut().find(|(o, k, _, _)| *o == op && *k == kind) {
                        Some(e) if source > e.2 => {
                            e.2 = source;
                            e.3 = provenance::op_source_on(&self.topology, exact, op, issuer, target).1;
                        }
                        Some(_) => {}
                        None => seen.push((op, kind, source, provenance::op_source_on(&self.topology, exact, op, issuer, target).1)),
                    }
                }
            }
        }
        seen.sort_by_key(|x| (x.0, x.1));
        let figures: Vec<Figure> = seen.into_iter().map(|(op, pairs, source, cite)| Figure { op, pairs, source, cite }).collect();
        let source = figures.iter().fold(if copies { Source::Assumed } else { Source::Published }, |s, f| s.weaker(f.source));
        Ok(Provenance { source, figures })
    }

    pub fn world(&self) -> usize {
        self.fabric.world()
    }

    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// Predicted time of one all-reduce of `bytes` by `algorithm`.
    pub fn predict(&self, algorithm: Algorithm, bytes: usize) -> Result<Prediction> {
        self.predict_collective(Collective::AllReduce, algorithm, bytes)
    }

    /// Predicted time of one call of `collective` of `bytes` per rank (as
    /// [`Collective::io_elems`] counts them) by `algorithm`. The all-gather and the
    /// reduce-scatter by one-shot push or one-shot pull move what their all-reduce of the
    /// same bytes moves (every rank writes, or reads, that many bytes to or from every peer,
    /// once; the local copies are not modelled); NCCL's ring runs n - 1 steps of the
    /// per-rank bytes for them (`algorithms::nccl::gather_scatter_schedule`).
    pub fn predict_collective(&self, collective: Collective, algorithm: Algorithm, bytes: usize) -> Result<Prediction> {
        if bytes == 0 {
            return Err(Error::invalid("bytes", format!("an {collective} of 0 bytes")));
        }
        registry::computes(algorithm, collective).map_err(|reason| Error::Unsupported { what: format!("{collective} with {algorithm}"), reason })?;
        let schedule = match (collective, algorithm) {
            (Collective::AllReduce, _) | (_, Algorithm::OneshotPush | Algorithm::OneshotPull) => registry::spec(algorithm).schedule,
            _ => crate::algorithms::nccl::gather_scatter_schedule,
        };
        let ll = self.predict_on(&self.fabric, algorithm, schedule, bytes)?;
        if algorithm != Algorithm::Nccl {
            return Ok(ll);
        }
        // NCCL picks its protocol per size: LL (flags in the data, twice the wire bytes,
        // cheap hand-off) for small messages, Simple for large.
        let simple = self.predict_on(&self.nccl_simple, algorithm, schedule, bytes)?;
        Ok(if simple.total_us < ll.total_us { simple } else { ll })
    }

    fn predict_on(&self, fabric: &Fabric, algorithm: Algorithm, schedule: crate::algorithms::schedule::ScheduleFn, bytes: usize) -> Result<Prediction> {
        let bulk = algorithm != Algorithm::Nccl;
        let (transport, steps) = schedule(bytes as f64, fabric, &self.islands)?;
        let sched = Schedule { algorithm, transport, steps };
        let p = fabric.params();
        let n = self.world();
        let caps = fabric.capacities();
        let fixed = match algorithm {
            Algorithm::Nccl => p.nccl_fixed_us,
            // Its kernels: entry signal and wait, a signal and a wait per phase, the reduction
            // and the final copy (per piece; the simulator times one piece).
            Algorithm::CeRing => p.kernel_fixed_us + CE_RING_LAUNCHES * p.launch_us(),
            _ => p.kernel_fixed_us + p.launch_us(),
        };
        let mut barrier = 0.0f64;
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    barrier = barrier.max(fabric.write_latency(a, b)?);
                }
            }
        }
        let mut steps = Vec::with_capacity(sched.steps.len());
        let mut total = fixed;
        for st in &sched.steps {
            let specs = st
                .flows
                .iter()
                .map(|f| fabric.flow_of(f.src, f.dst, f.bytes, f.op, bulk))
                .collect::<Result<Vec<_>>>()?;
            let done = flows::simulate(&caps, &specs)?;
            let all_p2p = st.flows.iter().all(|f| f.op == Op::Write);
            let land = if st.sync == Sync::NcclStep && all_p2p && !specs.is_empty() {
                // A ring's critical path passes every hop in turn, so each step pays the mean
                // hop latency, not the worst (on two sockets two hops of eight cross the link).
                // Assumed not to hold where some hop goes through host memory (SHM): G's
                // untuned 48.2 us needs the ring to run at its slowest hop's pace there.
                let drained = specs.iter().zip(&done).map(|(f, t)| t - f.latency_us).fold(0.0f64, f64::max);
                drained + specs.iter().map(|f| f.latency_us).sum::<f64>() / specs.len() as f64
            } else {
                done.into_iter().fold(0.0f64, f64::max)
            };
            let sync = match st.sync {
                Sync::Poll => p.poll_us,
                Sync::Barrier => barrier + p.poll_us,
                Sync::HostPoll => p.host_poll_us,
                Sync::NcclStep => p.nccl_step_us,
                Sync::CopyStep => p.ce_copy_us,
            };
            steps.push((st.label, land + sync));
            total += land + sync;
        }
        Ok(Prediction { algorithm, transport: sched.transport, total_us: total, fixed_us: fixed, steps })
    }

    /// Predictions of every algorithm in `algorithms` that can run here; the others are
    /// returned with their reason.
    pub fn predict_all(&self, algorithms: &[Algorithm], bytes: usize) -> (Vec<Prediction>, Vec<(Algorithm, Error)>) {
        let mut ok = Vec::new();
        let mut refused = Vec::new();
        for &a in algorithms {
            match self.predict(a, bytes) {
                Ok(p) => ok.push(p),
                Err(e) => refused.push((a, e)),
            }
        }
        (ok, refused)
    }

    /// The fastest of `algorithms` at `bytes`: the plan the simulator would pick.
    pub fn pick(&self, algorithms: &[Algorithm], bytes: usize) -> Result<Prediction> {
        let (ok, _) = self.predict_all(algorithms, bytes);
        ok.into_iter()
            .min_by(|a, b| a.total_us.total_cmp(&b.total_us))
            .ok_or_else(|| Error::Unsupported {
                what: format!("any of the requested algorithms on {}", self.topology.name),
                reason: "none can run on this fabric".into(),
            })
    }
}

/// Sizes at which the fastest algorithm changes, as (bytes where the new winner first
/// wins, previous winner, new winner), from predictions at the given sorted sizes.
pub fn crossovers(winners: &[(usize, Algorithm)]) -> Vec<(usize, Algorithm, Algorithm)> {
    winners
        .windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| (w[1].0, w[0].1, w[1].1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    const SIZES: [usize; 9] = [256, 4096, 16384, 43008, 65536, 262144, 1 << 20, 4 << 20, 16 << 20];

    #[test]
    fn every_preset_algorithm_and_size_is_a_number_or_a_reason() {
        for t in presets::all() {
            let sim = Simulator::new(&t, t.gpu_count(), &Params::default()).unwrap();
            for a in Algorithm::ALL {
                for b in SIZES {
                    match sim.predict(a, b) {
                        Ok(p) => assert!(p.total_us.is_finite() && p.total_us > 0.0, "{} {a} {b}", t.name),
                        Err(Error::Unsupported { .. }) => {}
                        Err(e) => panic!("{} {a} {b}: {e}", t.name),
                    }
                }
            }
        }
    }

    #[test]
    fn time_grows_with_size() {
        for t in presets::all() {
            for launch in [Launch::Eager, Launch::Graph] {
                let sim = Simulator::new(&t, t.gpu_count(), &Params::with_launch(launch)).unwrap();
                for a in Algorithm::ALL {
                    let mut last = 0.0;
                    for b in SIZES {
                        if let Ok(p) = sim.predict(a, b) {
                            assert!(p.total_us >= last, "{} {a}: {b} B took {} < {last}", t.name, p.total_us);
                            last = p.total_us;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pulls_across_sockets_share_the_socket_read_pool_and_one_switch_does_not() {
        // Reads across the socket link hold a slot of one outstanding-read pool (fitted to the
        // ASUS box's all-to-all reads, docs/sim.md group R): on the dual-socket preset a pull
        // one-shot at 42 KiB takes at least its cross-socket bytes over that pool's capacity,
        // and is slower than on the one-CPU switch box.
        let p = Params::default();
        let dual = Simulator::new(&presets::rtxpro6000_dualsocket_8(), 8, &p).unwrap();
        let pull = dual.predict(Algorithm::OneshotPull, 43008).unwrap().total_us;
        let f = dual.fabric();
        let pool = f.resources.iter().find(|r| r.name == "socket.reads").unwrap().gbps;
        let cross_bytes = 8.0 * 4.0 * 43008.0;
        assert!(pull >= cross_bytes / (pool * 1e3), "pull {pull} us, pool {pool} GB/s");
        let one = Simulator::new(&presets::rtxpro6000_pcie_switch_8(), 8, &p).unwrap();
        let pull_one = one.predict(Algorithm::OneshotPull, 43008).unwrap().total_us;
        assert!(pull > 1.5 * pull_one, "two sockets {pull} vs one CPU {pull_one}");
        // On one switch with no root complex in the way, pull is within 3x of push.
        let sw = Simulator::new(&presets::rtxpro6000_pcie_switch_8(), 4, &p).unwrap();
        let pull = sw.predict(Algorithm::OneshotPull, 43008).unwrap().total_us;
        let push = sw.predict(Algorithm::OneshotPush, 43008).unwrap().total_us;
        assert!(pull < 3.0 * push, "pull {pull} push {push}");
    }

    #[test]
    fn a_collapsed_store_figure_times_push_slow() {
        // The ASUS preset's probe: SM stores 2.7 GB/s per pair alone, no figure under load. A
        // GPU's stores together are capped there, so two-shot push moves its 2 (n-1)/n S no
        // faster than 2.7 GB/s; with stores measured healthy under load it is faster.
        let ds = presets::rtxpro6000_dualsocket_8();
        let sim = Simulator::new(&ds, 8, &Params::default()).unwrap();
        let s = 43008.0;
        let push = sim.predict(Algorithm::TwoshotPush, 43008).unwrap().total_us;
        assert!(push >= 2.0 * 7.0 / 8.0 * s / (2.7 * 1e3), "{push}");
        let mut healthy = ds.clone();
        for q in &mut healthy.probe.as_mut().unwrap().pairs {
            q.sm_store_gbps = Some(50.0);
        }
        let fast = Simulator::new(&healthy, 8, &Params::default()).unwrap().predict(Algorithm::TwoshotPush, 43008).unwrap().total_us;
        assert!(fast < push / 2.0, "{fast} vs {push}");
        // Its figures under load are unmeasured: at the bound it is slower still, and says so.
        let p = sim.provenance(Algorithm::TwoshotPush).unwrap();
        assert_eq!(p.source, Source::Assumed);
        assert!(p.unmeasured().iter().any(|u| u.starts_with("SM stores under load")), "{:?}", p.unmeasured());
        assert!(sim.predict_bound(Algorithm::TwoshotPush, 43008).unwrap().total_us > push);
        // NCCL is its own fallback: its bound is its time.
        assert_eq!(sim.predict_bound(Algorithm::Nccl, 43008).unwrap(), sim.predict(Algorithm::Nccl, 43008).unwrap());
    }

    #[test]
    fn no_p2p_preset_runs_push_via_host_and_refuses_pull() {
        let sim = Simulator::new(&presets::rtx4090_nop2p_4(), 4, &Params::default()).unwrap();
        assert_eq!(sim.predict(Algorithm::OneshotPush, 16384).unwrap().transport, Transport::Host);
        assert!(matches!(sim.predict(Algorithm::OneshotPull, 16384), Err(Error::Unsupported { .. })));
        assert!(sim.predict(Algorithm::Nccl, 16384).is_ok());
    }

    #[test]
    fn crossovers_name_each_change_of_winner() {
        use Algorithm::*;
        let w = [(1, OneshotPush), (2, OneshotPush), (4, TwoshotPush), (8, Nccl)];
        assert_eq!(crossovers(&w), vec![(4, OneshotPush, TwoshotPush), (8, TwoshotPush, Nccl)]);
    }
}
