//! Tuned profiles: which algorithm measured fastest at which sizes on one machine.
//!
//! Owns: the profile schema (TOML), its fingerprint and matching rule, building a profile
//! from bench records ([`Profile::from_measurements`]), load and save. Must never: run a
//! benchmark (the `tpar tune` command does, then calls this), or let a record that failed
//! its correctness check (`wrong != 0`) choose an algorithm.
//!
//! A profile is used by the plan only when its fingerprint matches the machine and the call
//! (same topology hash, GPU UUIDs, backend, world and capture mode); otherwise the plan
//! ignores it and its reason says which field differed.
//!
//! ```toml
//! reads_beat_writes = false
//! [fingerprint]
//! gpu_uuids = ["GPU-..."]
//! driver_version = "580.65.06"
//! topology_hash = "9f0c2a4b1d3e5f60"
//! backend = "cuda"
//! world = 8
//! capture = "graph"
//! [[tables]]
//! dtype = "bfloat16"
//! buckets = [ { max_bytes = 65536, algorithm = "oneshot-push", median_us = 9.1 }, ... ]
//! [[tables]]
//! dtype = "bfloat16"
//! collective = "all-gather"
//! buckets = [ { max_bytes = 28672, algorithm = "oneshot-push", median_us = 6.2, rival = { algorithm = "nccl", median_us = 14.8 } }, ... ]
//! ```
//!
//! A table decides one collective at one dtype (`collective` absent: the all-reduce, as in
//! profiles written before the all-gather and the reduce-scatter were tuned). The all-gather's
//! and the reduce-scatter's tables are keyed by bytes per rank (the plan's bytes for them,
//! [`Collective::io_elems`]'s count) and carry the measured rival of each bucket's winner
//! (one-shot push against NCCL), so that the plan's reason names both figures.

use crate::algorithms::Algorithm;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kinds::Collective;
use crate::plan::{human_bytes, Backend, CaptureMode};
use crate::report::Record;
use crate::topology::probe::Probe;
use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Where a profile was measured. `topology_hash` is hex text because TOML integers are
/// signed 64-bit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileFingerprint {
    pub gpu_uuids: Vec<String>,
    /// NVML's driver version when tuned; recorded, compared only when both sides know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// [`Topology::hash`], 16 hex digits.
    pub topology_hash: String,
    pub backend: Backend,
    pub world: usize,
    pub capture: CaptureMode,
}

impl ProfileFingerprint {
    /// The fingerprint of a machine and call. GPU UUIDs are those of the first `world`
    /// GPUs (ranks map to ordinals 0..world); none on the CPU backend.
    pub fn new(topology: &Topology, driver_version: Option<String>, backend: Backend, world: usize, capture: CaptureMode) -> Self {
        let gpu_uuids = match backend {
            Backend::Cpu => Vec::new(),
            Backend::Cuda => topology.gpus.iter().take(world).map(|g| g.uuid.clone()).collect(),
        };
        ProfileFingerprint { gpu_uuids, driver_version, topology_hash: format!("{:016x}", topology.hash()), backend, world, capture }
    }

    /// What the planner knows about the call (no driver version).
    pub(crate) fn of_input(topology: &Topology, world: usize, backend: Backend, capture: CaptureMode) -> Self {
        Self::new(topology, None, backend, world, capture)
    }
}

/// Fastest algorithm for sizes up to `max_bytes` (and above the previous bucket's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub max_bytes: u64,
    pub algorithm: Algorithm,
    /// Median time of the winner at `max_bytes`, us (for reasons; not used to decide).
    pub median_us: f64,
    /// The fastest other algorithm measured at `max_bytes` (the all-gather's and the
    /// reduce-scatter's tables: one-shot push against NCCL), for the plan's reason; absent in
    /// the all-reduce's tables and where nothing else was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rival: Option<Rival>,
}

/// A bucket's runner-up at its `max_bytes`: the algorithm and its median, us.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rival {
    pub algorithm: Algorithm,
    pub median_us: f64,
}

/// Crossovers for one collective and dtype: buckets in ascending `max_bytes`, neighbours
/// never equal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub dtype: DType,
    /// What the table decides (absent: the all-reduce, as every table was before the
    /// all-gather and the reduce-scatter were tuned).
    #[serde(default, skip_serializing_if = "is_all_reduce")]
    pub collective: Collective,
    pub buckets: Vec<Bucket>,
}

fn is_all_reduce(c: &Collective) -> bool {
    *c == Collective::AllReduce
}

/// A tuned profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Whether pull algorithms measured faster than their push twins at more than half the
    /// sizes where both ran. The plan then prefers pull where it has no bucket.
    pub reads_beat_writes: bool,
    pub fingerprint: ProfileFingerprint,
    pub tables: Vec<Table>,
    /// The link probe `tpar tune` ran before timing (SM store / SM load / copy-engine rates
    /// alone and under all-to-all load, flag latency), when it ran one. Where the profile
    /// applies and the topology carries no probe of its own, the plan's defaults (sizes and
    /// dtypes without a bucket) and the simulator use these figures instead of the link
    /// class's assumed ones ([`Profile::topology_with_probe`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

impl Profile {
    /// Builds a profile from bench records. Only records with `wrong == 0` (checked and
    /// correct) of the fingerprint's backend and world count. Per collective, dtype and size
    /// the algorithm with the lowest median wins (repeated records of one algorithm and size
    /// are combined by their median); equal neighbouring winners merge into one bucket. The
    /// all-gather's and the reduce-scatter's records (whose `bytes` are every rank's part, as
    /// nccl-tests counts them) make tables keyed by bytes per rank, whose buckets carry the
    /// runner-up ([`Bucket::rival`]).
    pub fn from_measurements(records: &[Record], fingerprint: ProfileFingerprint) -> Profile {
        // (collective, dtype, bytes per rank) -> algorithm -> times
        let mut by_point: BTreeMap<(Collective, DType, u64), BTreeMap<Algorithm, Vec<f64>>> = BTreeMap::new();
        let world = fingerprint.world.max(1) as u64;
        for r in records.iter().filter(|r| {
            r.wrong == 0 && r.world == fingerprint.world && r.backend.eq_ignore_ascii_case(fingerprint.backend.name()) && r.time_us.is_finite() && r.time_us >= 0.0
        }) {
            let bytes = match r.collective {
                Collective::AllReduce => r.bytes as u64,
                Collective::AllGather | Collective::ReduceScatter => r.bytes as u64 / world,
            };
            by_point.entry((r.collective, r.dtype, bytes)).or_default().entry(r.algorithm).or_default().push(r.time_us);
        }
        let mut tables: BTreeMap<(Collective, DType), Vec<Bucket>> = BTreeMap::new();
        let (mut pull_wins, mut comparisons) = (0usize, 0usize);
        for ((collective, dtype, bytes), algs) in &by_point {
            let medians: BTreeMap<Algorithm, f64> = algs.iter().map(|(a, ts)| (*a, median(ts))).collect();
            if *collective == Collective::AllReduce {
                for (pull, push) in [(Algorithm::OneshotPull, Algorithm::OneshotPush), (Algorithm::TwoshotPull, Algorithm::TwoshotPush)] {
                    if let (Some(r), Some(w)) = (medians.get(&pull), medians.get(&push)) {
                        comparisons += 1;
                        pull_wins += usize::from(r < w);
                    }
                }
            }
            // Ties go to the earlier algorithm in Algorithm order (stable across runs).
            let fastest = |skip: Option<Algorithm>| {
                medians.iter().filter(|(a, _)| Some(**a) != skip).fold(None::<(Algorithm, f64)>, |acc, (&a, &t)| match acc {
                    Some((_, bt)) if bt <= t => acc,
                    Some(_) | None => Some((a, t)),
                })
            };
            if let Some((algorithm, median_us)) = fastest(None) {
                let rival = match collective {
                    Collective::AllReduce => None,
                    Collective::AllGather | Collective::ReduceScatter => fastest(Some(algorithm)).map(|(algorithm, median_us)| Rival { algorithm, median_us }),
                };
                let buckets = tables.entry((*collective, *dtype)).or_default();
                match buckets.last_mut() {
                    Some(last) if last.algorithm == algorithm => {
                        last.max_bytes = *bytes;
                        last.median_us = median_us;
                        last.rival = rival;
                    }
                    Some(_) | None => buckets.push(Bucket { max_bytes: *bytes, algorithm, median_us, rival }),
                }
            }
        }
        Profile {
            reads_beat_writes: comparisons > 0 && 2 * pull_wins > comparisons,
            fingerprint,
            tables: tables.into_iter().map(|((collective, dtype), buckets)| Table { dtype, collective, buckets }).collect(),
            probe: None,
        }
    }

    /// `t` with this profile's link probe, when `t` has none of its own and the probe
    /// names only GPUs `t` has; `None` otherwise (use `t` as it is). The caller has checked
    /// that the profile applies to `t` ([`Profile::mismatch`]): the probe was measured on
    /// this fabric, whose [`Topology::hash`] leaves probes out.
    pub fn topology_with_probe(&self, t: &Topology) -> Option<Topology> {
        let probe = self.probe.as_ref()?;
        if t.probe.is_some() || probe.validate(t.gpu_count()).is_err() {
            return None;
        }
        let mut with = t.clone();
        with.probe = Some(probe.clone());
        Some(with)
    }

    /// The all-reduce's bucket covering `bytes` of `dtype`: the first with `bytes <=
    /// max_bytes`. None above the largest measured size or for an unmeasured dtype.
    pub fn lookup(&self, dtype: DType, bytes: u64) -> Option<&Bucket> {
        self.lookup_for(Collective::AllReduce, dtype, bytes)
    }

    /// As [`lookup`](Self::lookup), in `collective`'s table (`bytes` per rank, as the plan
    /// takes them).
    pub fn lookup_for(&self, collective: Collective, dtype: DType, bytes: u64) -> Option<&Bucket> {
        self.table(collective, dtype)?.buckets.iter().find(|b| bytes <= b.max_bytes)
    }

    /// The table of `collective` at `dtype`, if one was measured.
    pub fn table(&self, collective: Collective, dtype: DType) -> Option<&Table> {
        self.tables.iter().find(|t| t.dtype == dtype && t.collective == collective)
    }

    /// Why this profile does not apply to `here`, or None when it does. The driver version
    /// is compared only when both are known.
    pub fn mismatch(&self, here: &ProfileFingerprint) -> Option<String> {
        let p = &self.fingerprint;
        if p.topology_hash != here.topology_hash {
            return Some(format!("tuned on topology {} but this one is {}", p.topology_hash, here.topology_hash));
        }
        if p.backend != here.backend {
            return Some(format!("tuned for the {} backend, not {}", p.backend, here.backend));
        }
        if p.world != here.world {
            return Some(format!("tuned for world {}, not {}", p.world, here.world));
        }
        if p.capture != here.capture {
            return Some(format!("tuned in {} mode, not {}", p.capture, here.capture));
        }
        if p.gpu_uuids != here.gpu_uuids {
            return Some("tuned on other GPUs (UUIDs differ)".to_string());
        }
        if let (Some(a), Some(b)) = (&p.driver_version, &here.driver_version) {
            if a != b {
                return Some(format!("tuned with driver {a}, this is {b}"));
            }
        }
        None
    }

    /// Logs a warning when this profile will be ignored here; returns the reason.
    pub fn warn_if_mismatched(&self, here: &ProfileFingerprint) -> Option<String> {
        let why = self.mismatch(here)?;
        tracing::warn!(target: "tpar::profile", "tuned profile ignored: {why}");
        Some(why)
    }

    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| Error::invalid("profile", format!("cannot write profile as TOML: {e}")))
    }

    pub fn from_toml(text: &str) -> Result<Profile> {
        let p: Profile = toml::from_str(text).map_err(|e| Error::invalid("profile", format!("bad profile TOML: {e}")))?;
        if let Some(probe) = &p.probe {
            // GPU indices are checked against the topology when the probe is used.
            probe.validate(usize::MAX)?;
        }
        for (i, t) in p.tables.iter().enumerate() {
            if t.buckets.windows(2).any(|w| w[0].max_bytes >= w[1].max_bytes) {
                return Err(Error::invalid("profile", format!("{} {} buckets must have strictly ascending max_bytes", t.collective, t.dtype)));
            }
            if p.tables[..i].iter().any(|u| u.collective == t.collective && u.dtype == t.dtype) {
                return Err(Error::invalid("profile", format!("two {} {} tables", t.collective, t.dtype)));
            }
        }
        Ok(p)
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(0, format!("reading profile {}", path.display()), e))?;
        Profile::from_toml(&text)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = self.to_toml()?;
        std::fs::write(path, text).map_err(|e| Error::io(0, format!("writing profile {}", path.display()), e))
    }

    /// A one-line summary per table: `bfloat16: oneshot-push <= 64 KiB < staged-push <= 1 MiB`
    /// (the all-reduce), `all-gather bfloat16: oneshot-push <= 224 KiB < nccl <= 896 KiB`
    /// (bytes per rank).
    pub fn describe(&self) -> Vec<String> {
        self.tables
            .iter()
            .map(|t| {
                let parts: Vec<String> = t.buckets.iter().map(|b| format!("{} <= {}", b.algorithm, human_bytes(b.max_bytes))).collect();
                match t.collective {
                    Collective::AllReduce => format!("{}: {}", t.dtype, parts.join(" < ")),
                    c => format!("{c} {}: {}", t.dtype, parts.join(" < ")),
                }
            })
            .collect()
    }
}

fn median(ts: &[f64]) -> f64 {
    let mut v = ts.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::INFINITY,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, Overrides, PlanInput};
    use crate::topology::presets;
    use crate::kinds::Transport;

    fn rec(a: Algorithm, bytes: usize, t: f64, wrong: i64) -> Record {
        Record::measured(a, "cuda", DType::BF16, 8, bytes / 2, (t, t, t), wrong)
    }

    fn fp(t: &Topology) -> ProfileFingerprint {
        ProfileFingerprint::new(t, Some("580.00".into()), Backend::Cuda, 8, CaptureMode::Graph)
    }

    fn sample() -> (Topology, Profile) {
        let t = presets::rtxpro6000_pcie_switch_8();
        let records = vec![
            rec(Algorithm::OneshotPush, 8192, 8.0, 0),
            rec(Algorithm::OneshotPull, 8192, 7.0, 0),
            rec(Algorithm::StagedPush, 8192, 12.0, 0),
            rec(Algorithm::OneshotPull, 16384, 8.0, 0),
            rec(Algorithm::OneshotPush, 16384, 9.0, 0),
            // Fastest but wrong: must not win.
            rec(Algorithm::TwoshotPush, 65536, 1.0, 3),
            rec(Algorithm::OneshotPull, 65536, 20.0, 0),
            rec(Algorithm::StagedPush, 65536, 15.0, 0),
            // Unchecked: must not win.
            rec(Algorithm::TwoshotPush, 1 << 20, 1.0, -1),
            rec(Algorithm::StagedPush, 1 << 20, 60.0, 0),
            rec(Algorithm::StagedPush, 1 << 20, 80.0, 0),
            rec(Algorithm::StagedPush, 1 << 20, 70.0, 0),
            rec(Algorithm::Nccl, 1 << 20, 69.0, 0),
        ];
        let p = Profile::from_measurements(&records, fp(&t));
        (t, p)
    }

    #[test]
    fn from_measurements_picks_correct_fastest_and_merges_neighbours() {
        let (_, p) = sample();
        assert_eq!(p.tables.len(), 1);
        let b: Vec<(u64, Algorithm)> = p.tables[0].buckets.iter().map(|b| (b.max_bytes, b.algorithm)).collect();
        assert_eq!(
            b,
            vec![(16384, Algorithm::OneshotPull), (65536, Algorithm::StagedPush), (1 << 20, Algorithm::Nccl)],
            "staged median of 60/80/70 is 70 > nccl's 69"
        );
        assert!(p.reads_beat_writes);
        assert_eq!(p.lookup(DType::BF16, 100).map(|b| b.algorithm), Some(Algorithm::OneshotPull));
        assert_eq!(p.lookup(DType::BF16, 16385).map(|b| b.algorithm), Some(Algorithm::StagedPush));
        assert!(p.lookup(DType::BF16, (1 << 20) + 1).is_none());
        assert!(p.lookup(DType::F32, 100).is_none());
    }

    /// A probe of all 8 GPUs of the switch box with SM stores collapsed (the Broadcom
    /// figures: 2.7 vs 51 GB/s), plus each GPU against host memory (`dst` None).
    fn collapsed_probe() -> Probe {
        use crate::topology::probe::PairProbe;
        let mut p = Probe::uniform("test: published Broadcom figures", 8, |a, b| PairProbe {
            sm_store_gbps: Some(2.7),
            sm_load_gbps: Some(51.0),
            ce_gbps: Some(56.0),
            flag_us: Some(0.9),
            ..PairProbe::empty(a as u32, Some(b as u32))
        });
        for a in 0..8 {
            p.pairs.push(PairProbe { sm_store_gbps: Some(52.7), sm_load_gbps: Some(51.1), ..PairProbe::empty(a, None) });
        }
        p
    }

    #[test]
    fn a_profile_with_a_probe_round_trips_and_its_links_change_the_defaults() {
        // The preset without its published figures (the flag latencies), as a discovered
        // topology would be.
        let mut t = presets::rtxpro6000_pcie_switch_8();
        t.probe = None;
        // Tuned up to 8 KiB only: 42 KiB falls to the defaults, where the probe matters.
        let records = vec![rec(Algorithm::OneshotPull, 8192, 9.0, 0), rec(Algorithm::OneshotPush, 8192, 8.0, 0)];
        let mut with_probe = t.clone();
        with_probe.probe = Some(collapsed_probe());
        // tpar tune fingerprints the topology it probed; the discovered one (no probe) matches.
        let mut p = Profile::from_measurements(&records, fp(&with_probe));
        p.probe = with_probe.probe.clone();
        assert!(p.mismatch(&fp(&t)).is_none(), "a probe is not part of the fabric's identity");

        let text = p.to_toml().unwrap();
        assert!(text.contains("sm_store_gbps = 2.7"), "{text}");
        let back = Profile::from_toml(&text).unwrap();
        assert_eq!(back, p, "the probe (host entries without dst included) survives TOML");
        assert!(back.probe.as_ref().unwrap().pairs.iter().any(|q| q.dst.is_none()));
        assert_eq!(back.topology_with_probe(&t).unwrap().probe, p.probe);
        assert!(back.topology_with_probe(&with_probe).is_none(), "a topology's own probe wins");

        let o = Overrides::default();
        let input = |profile| PlanInput {
            topology: &t,
            world: 8,
            bytes: 43008,
            dtype: DType::BF16,
            capture: CaptureMode::Graph,
            backend: crate::plan::Backend::Cuda,
            profile,
            overrides: &o,
        };
        let mut no_probe = back.clone();
        no_probe.probe = None;
        let before = plan(&input(Some(&no_probe)));
        let after = plan(&input(Some(&back)));
        assert!(!crate::algorithms::registry::spec(before.algorithm).reads_remote && before.algorithm != Algorithm::Nccl, "healthy links: a push algorithm: {before}");
        // No special rule: the simulator times pushes at the probe's 2.7 GB/s, and they lose.
        assert!(crate::algorithms::registry::spec(after.algorithm).reads_remote || after.algorithm == Algorithm::Nccl, "collapsed writes: no push: {after}");
        assert!(after.reason.contains("profile's probe"), "{after}");
        // The simulator on the probed topology times pushes with the measured store rate.
        let sim = |t: &Topology| crate::sim::Simulator::new(t, 8, &crate::sim::Params::default()).unwrap().predict(Algorithm::OneshotPush, 43008).unwrap().total_us;
        let (probed, assumed) = (sim(&back.topology_with_probe(&t).unwrap()), sim(&t));
        assert!(probed > assumed, "one-shot push at 42 KiB: {probed} us with the probe, {assumed} us without");
        // A bad probe in a profile is refused at load.
        let bad = text.replace("sm_store_gbps = 2.7", "sm_store_gbps = -2.7");
        assert!(Profile::from_toml(&bad).is_err());
    }

    #[test]
    fn toml_round_trip() {
        let (_, p) = sample();
        let text = p.to_toml().unwrap();
        let back = Profile::from_toml(&text).unwrap();
        assert_eq!(back, p);
        let dir = std::env::temp_dir().join(format!("tpar-profile-{}.toml", std::process::id()));
        p.save(&dir).unwrap();
        assert_eq!(Profile::load(&dir).unwrap(), p);
        let _ = std::fs::remove_file(&dir);
        assert!(Profile::from_toml("reads_beat_writes = 3").is_err());
    }

    #[test]
    fn matching_profile_decides_and_mismatched_is_ignored_with_reason() {
        let (t, p) = sample();
        let o = Overrides::default();
        let input = PlanInput {
            topology: &t,
            world: 8,
            bytes: 8192,
            dtype: DType::BF16,
            capture: CaptureMode::Graph,
            backend: crate::plan::Backend::Cuda,
            profile: Some(&p),
            overrides: &o,
        };
        let got = plan(&input);
        assert_eq!((got.algorithm, got.transport), (Algorithm::OneshotPull, Transport::P2p), "{got}");
        assert!(got.reason.starts_with("profile:"), "{got}");
        assert_eq!(got.source, Some(crate::sim::Source::Profile), "a tune's pick is the most trusted source: {got:?}");
        assert!(got.predicted_us.is_some(), "{got:?}");

        // Another world, capture mode, topology: ignored, and the reason says so.
        let other = presets::rtxpro6000_dualsocket_8();
        for (topo, world, capture, needle) in [
            (&t, 4, CaptureMode::Graph, "tuned for world 8, not 4"),
            (&t, 8, CaptureMode::Eager, "tuned in graph mode, not eager"),
            (&other, 8, CaptureMode::Graph, "tuned on topology"),
        ] {
            let got = plan(&PlanInput { topology: topo, world, capture, ..input });
            assert!(got.reason.contains("profile ignored"), "{got}");
            assert!(got.reason.contains(needle), "{got}");
            assert_ne!(got.algorithm, Algorithm::OneshotPull, "pull is only for measured profiles: {got}");
        }
        let mut p2 = p.clone();
        p2.fingerprint.gpu_uuids[0] = "GPU-else".into();
        assert!(p2.warn_if_mismatched(&ProfileFingerprint::of_input(&t, 8, Backend::Cuda, CaptureMode::Graph)).is_some());
        let mut here = fp(&t);
        here.driver_version = Some("999".into());
        assert!(p.mismatch(&here).is_some_and(|m| m.contains("driver")));
    }
}
