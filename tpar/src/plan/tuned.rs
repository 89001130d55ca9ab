//! A machine's measured tune, as the first-use tune makes it and the tune cache holds it:
//! one [`Profile`] per capture mode (eager and graph), the key of the machine and software it
//! was measured on ([`TuneKey`]), the candidates the bit-exact screen rejected, how NCCL was
//! timed, and what the tune cost. The decision ([`Tuned::decide`]) and the entry format
//! ([`Tuned::to_entry`] / [`Tuned::from_entry`]: TOML under a checksummed header) live here,
//! so that they build and are tested without the `cuda` feature.
//!
//! Owns: the key's fields and their comparison, the per-mode and per-collective decision from
//! measured points, the entry format. Must never: measure anything (`crate::tune` drives the
//! ranks), let a candidate that failed the screen for a collective choose anything for it (it
//! is dropped from that collective's tables at every mode, dtype and size), or trust an entry whose checksum, format or key does not match (it is refused with
//! the reason, and the caller re-tunes).
//!
//! A tune measured on ranks that share a GPU (rank processes on one GPU, or emulated ranks)
//! measured CUDA's time-slicing or one GPU's memory, not a fabric: it is stored with that
//! mark ([`RankKind`], part of the key, so only a start with the same sharing finds it) and
//! its buckets are never handed to the plan ([`Tuned::plan_profile`] says why); its screen
//! still bans a candidate that computed a wrong sum.

use crate::algorithms::Algorithm;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kinds::{Backend, CaptureMode, Collective, Transport};
use crate::plan::human_bytes;
use crate::plan::profile::{Profile, ProfileFingerprint};
use crate::report::Record;
use crate::topology::probe::Probe;
use crate::units::fnv1a64;
use serde::{Deserialize, Serialize};

/// Version of the entry format (the header names it; another version is re-tuned). 2: the
/// tune measures the all-gather and the reduce-scatter beside the all-reduce (points,
/// rejections and tables name their collective); an entry of format 1 holds the all-reduce
/// alone, so it is re-tuned rather than read, or the plan would never get those tables on a
/// machine whose cache predates them.
pub const ENTRY_FORMAT: u32 = 2;
const HEADER_MAGIC: &str = "# tpar tuned profile v";

/// What ran the ranks of a tune.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RankKind {
    /// One rank process per GPU, every rank on a GPU of its own: figures of the fabric.
    GpuProcesses,
    /// Rank processes of which some share a GPU: CUDA time-slices them; no fabric.
    SharedGpu,
    /// Ranks as streams of one GPU in one process: kernel cost on one GPU; no fabric.
    Emulated,
    /// CPU rank processes over shared memory.
    Cpu,
}

impl RankKind {
    /// The kind of GPU rank processes whose devices are `devices` (one id per rank): shared
    /// when any two ranks name the same device.
    pub fn of_processes(devices: &[String]) -> RankKind {
        let mut d: Vec<&String> = devices.iter().collect();
        d.sort();
        d.dedup();
        if d.len() < devices.len() {
            RankKind::SharedGpu
        } else {
            RankKind::GpuProcesses
        }
    }

    /// Why the plan must not take this kind's buckets, if it must not.
    pub fn not_fabric(self) -> Option<&'static str> {
        match self {
            RankKind::GpuProcesses | RankKind::Cpu => None,
            RankKind::SharedGpu => Some("measured on rank processes sharing one GPU (CUDA time-slices them): not fabric figures"),
            RankKind::Emulated => Some("measured on ranks emulated as streams of one GPU: kernel cost, not fabric figures"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RankKind::GpuProcesses => "one rank process per GPU",
            RankKind::SharedGpu => "rank processes sharing a GPU",
            RankKind::Emulated => "emulated ranks on one GPU",
            RankKind::Cpu => "CPU rank processes",
        }
    }
}

/// Where and with what a tune was measured. Two tunes are interchangeable exactly when their
/// keys are equal. The cache names an entry by [`TuneKey::stem`] (everything but the
/// software versions), so that a new tpar or driver finds, refuses and replaces the old entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TuneKey {
    /// `CARGO_PKG_VERSION` of the tpar that measured.
    pub tpar_version: String,
    /// `cuDriverGetVersion` (e.g. 13000); 0 on CPU ranks.
    pub cuda_driver: i32,
    /// NVML's driver version (e.g. 580.65.06), when NVML answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub backend: Backend,
    pub ranks: RankKind,
    pub world: usize,
    /// Each rank's device, in rank order (the CUDA UUID); empty on CPU ranks.
    pub devices: Vec<String>,
    /// [`Topology::hash`](crate::topology::Topology::hash) of the topology the plan decides
    /// for (as the ranks see it), 16 hex digits.
    pub topology_hash: String,
    /// The transport of tpar's kernels (p2p, host, shm).
    pub transport: Transport,
    /// Settings that change timings (host protocol, TPAR_BLOCKS, TPAR_PDL, TPAR_LEAN,
    /// TPAR_CHECK_CALLS), as canonical text; empty when none is set.
    pub settings: String,
}

impl TuneKey {
    /// This tpar's version, as keys carry it.
    pub fn this_version() -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    /// The entry's file stem: backend, world and a digest of everything but the versions.
    pub fn stem(&self) -> String {
        let canon = serde_json::json!({
            "backend": self.backend,
            "ranks": self.ranks,
            "world": self.world,
            "devices": self.devices,
            "topology": self.topology_hash,
            "transport": self.transport,
            "settings": self.settings,
        });
        format!("{}-w{}-{:016x}", self.backend, self.world, fnv1a64(canon.to_string().as_bytes()))
    }

    /// Why an entry measured under `stored` does not serve `self`, or `None` when it does.
    pub fn mismatch(&self, stored: &TuneKey) -> Option<String> {
        if stored.tpar_version != self.tpar_version {
            return Some(format!("it was measured by tpar {}, this is tpar {}", stored.tpar_version, self.tpar_version));
        }
        if stored.cuda_driver != self.cuda_driver || stored.driver_version != self.driver_version {
            let d = |k: &TuneKey| format!("{} (CUDA {})", k.driver_version.as_deref().unwrap_or("unknown"), k.cuda_driver);
            return Some(format!("it was measured with driver {}, this is {}", d(stored), d(self)));
        }
        for (field, differs) in [
            ("backend", stored.backend != self.backend),
            ("ranks", stored.ranks != self.ranks),
            ("world", stored.world != self.world),
            ("devices", stored.devices != self.devices),
            ("topology", stored.topology_hash != self.topology_hash),
            ("transport", stored.transport != self.transport),
            ("settings", stored.settings != self.settings),
        ] {
            if differs {
                return Some(format!("its {field} differs from this start's"));
            }
        }
        None
    }
}

/// One timed point: the median per-call time of `algorithm` (per round the slowest rank).
/// `bytes` per rank, as the plan takes them ([`Collective::io_elems`]'s count).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// What the call computed (absent: the all-reduce).
    #[serde(default)]
    pub collective: Collective,
    pub mode: CaptureMode,
    pub dtype: DType,
    pub bytes: u64,
    pub algorithm: Algorithm,
    pub median_us: f64,
}

/// A candidate the bit-exact screen rejected for one collective: it is never chosen for that
/// collective by this tune.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The collective it computed wrong (absent: the all-reduce).
    #[serde(default)]
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub dtype: DType,
    pub bytes: u64,
    /// Elements that differed from what the collective promises (the rank-order f32 sum, its
    /// slice, or the ranks' inputs), over every rank.
    pub wrong: u64,
    /// Whether every rank's output was bitwise the same (the reduce-scatter, whose ranks
    /// hold different slices: true).
    pub identical: bool,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.collective {
            Collective::AllReduce => write!(f, "{} {} {}: {} elements off the rank-order f32 sum", self.algorithm, self.dtype, human_bytes(self.bytes), self.wrong)?,
            Collective::AllGather => write!(f, "{} all-gather {} {} per rank: {} elements off the ranks' inputs", self.algorithm, self.dtype, human_bytes(self.bytes), self.wrong)?,
            Collective::ReduceScatter => {
                write!(f, "{} reduce-scatter {} {} per rank: {} elements off the rank-order f32 sum's slices", self.algorithm, self.dtype, human_bytes(self.bytes), self.wrong)?
            }
        }
        if !self.identical {
            write!(f, ", ranks' outputs differ")?;
        }
        Ok(())
    }
}

/// What a tune cost and measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Wall time of the whole tune (probe, screens, timings, decision), seconds.
    pub seconds: f64,
    /// Of which the link probe, seconds.
    pub probe_seconds: f64,
    /// Of which joining NCCL for the tune, seconds.
    pub nccl_seconds: f64,
    /// Candidate x collective x dtype x size screens run.
    pub screens: usize,
    /// Points timed (candidate or NCCL x collective x dtype x size x mode).
    pub points: usize,
    /// The budget it ran under (sizes, dtypes, modes, rounds), in words.
    pub budget: String,
}

/// A machine's tune: both modes' profiles, and how they were obtained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuned {
    pub key: TuneKey,
    /// The largest message size the tune covered (the communicator's largest).
    pub max_bytes: u64,
    /// Seconds since the Unix epoch when it was measured.
    pub unix_time: u64,
    /// How NCCL took part: `timed`, or `not timed: <why>`.
    pub nccl: String,
    pub cost: Cost,
    pub rejected: Vec<Rejection>,
    /// One profile per capture mode measured (its fingerprint names the mode).
    pub profiles: Vec<Profile>,
}

/// The inputs of [`Tuned::decide`] besides the points.
pub struct Decision<'a> {
    pub key: TuneKey,
    pub max_bytes: u64,
    pub points: &'a [Point],
    pub rejected: Vec<Rejection>,
    /// `Ok(())` when NCCL was timed beside the kernels, else why not.
    pub nccl: std::result::Result<(), String>,
    /// The fingerprint a profile of `mode` carries (what the plan matches it against).
    pub fingerprint: &'a dyn Fn(CaptureMode) -> ProfileFingerprint,
    /// Whether the plan's defaults give (`mode`, `dtype`, `bytes`) to NCCL: without NCCL
    /// timings a profile stops below the first such size (the defaults decide from there).
    pub default_is_nccl: &'a dyn Fn(CaptureMode, DType, u64) -> bool,
    pub probe: Option<Probe>,
    pub cost: Cost,
    pub unix_time: u64,
}

impl Tuned {
    /// Rank 0's decision: per mode, collective, dtype and size the fastest candidate that
    /// passed the screen (ties to the earlier in `Algorithm` order), NCCL among them when it
    /// was timed; equal neighbours merge into one bucket ([`Profile::from_measurements`]). A
    /// candidate rejected for a collective has its points of that collective dropped at
    /// every mode, dtype and size. Without NCCL timings the all-gather and the reduce-scatter
    /// get tables only on CPU ranks (no NCCL to lose to) and on ranks whose tables never
    /// decide ([`RankKind::not_fabric`]: kept to show what the mechanism measured); elsewhere
    /// the plan's simulator keeps deciding them.
    pub fn decide(d: Decision<'_>) -> Tuned {
        let banned = |c: Collective, a: Algorithm| d.rejected.iter().any(|r| r.collective == c && r.algorithm == a);
        let mut modes: Vec<CaptureMode> = d.points.iter().map(|p| p.mode).collect();
        modes.sort();
        modes.dedup();
        let backend = d.key.backend.name();
        let world = d.key.world;
        let profiles = modes
            .into_iter()
            .map(|mode| {
                let mut points: Vec<&Point> = d.points.iter().filter(|p| p.mode == mode && !banned(p.collective, p.algorithm)).collect();
                if d.nccl.is_err() {
                    // Without NCCL's times a kernel would "win" where NCCL may be faster: keep
                    // only the all-reduce's sizes below the first the defaults give to NCCL,
                    // and the other collectives only where there is no NCCL (CPU ranks) or
                    // the tables never decide.
                    if d.key.backend != Backend::Cpu && d.key.ranks.not_fabric().is_none() {
                        points.retain(|p| p.collective == Collective::AllReduce);
                    }
                    let mut cut: Vec<(DType, u64)> = Vec::new();
                    for p in points.iter().filter(|p| p.collective == Collective::AllReduce) {
                        if (d.default_is_nccl)(mode, p.dtype, p.bytes) {
                            match cut.iter_mut().find(|(dt, _)| *dt == p.dtype) {
                                Some(c) => c.1 = c.1.min(p.bytes),
                                None => cut.push((p.dtype, p.bytes)),
                            }
                        }
                    }
                    points.retain(|p| p.collective != Collective::AllReduce || !cut.iter().any(|&(dt, b)| dt == p.dtype && p.bytes >= b));
                }
                let records: Vec<Record> = points
                    .iter()
                    .map(|p| {
                        // A record counts as nccl-tests does: every rank's part of the
                        // all-gather and the reduce-scatter (the profile keys them per rank).
                        let per_rank = (p.bytes as usize) / p.dtype.size();
                        let count = if p.collective == Collective::AllReduce { per_rank } else { per_rank * world };
                        Record::measured_for(p.collective, p.algorithm, backend, p.dtype, world, count, (p.median_us, p.median_us, p.median_us), 0)
                    })
                    .collect();
                let mut profile = Profile::from_measurements(&records, (d.fingerprint)(mode));
                profile.probe = d.probe.clone();
                profile
            })
            .collect();
        let nccl = match &d.nccl {
            Ok(()) => "timed".to_string(),
            Err(why) => format!("not timed: {why}"),
        };
        Tuned { key: d.key, max_bytes: d.max_bytes, unix_time: d.unix_time, nccl, cost: d.cost, rejected: d.rejected, profiles }
    }

    /// The profile measured in `mode`, if any.
    pub fn profile(&self, mode: CaptureMode) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.fingerprint.capture == mode)
    }

    /// The profile the plan takes for calls in `mode`: `Err(why)` when this tune's buckets
    /// must not decide (ranks that share a GPU measured no fabric) or it has none for `mode`.
    pub fn plan_profile(&self, mode: CaptureMode) -> std::result::Result<&Profile, String> {
        if let Some(why) = self.key.ranks.not_fabric() {
            return Err(format!("the tune was {why}; the plan keeps its defaults"));
        }
        self.profile(mode).ok_or_else(|| format!("the tune measured no {mode} calls"))
    }

    /// The screen's rejection of `algorithm` for `collective`, if it was rejected.
    pub fn rejection_for(&self, collective: Collective, algorithm: Algorithm) -> Option<&Rejection> {
        self.rejected.iter().find(|r| r.collective == collective && r.algorithm == algorithm)
    }

    /// Whether this tune serves a start with `key` whose messages go up to `max_bytes`, or
    /// why not.
    pub fn serves(&self, key: &TuneKey, max_bytes: u64) -> std::result::Result<(), String> {
        if let Some(why) = key.mismatch(&self.key) {
            return Err(why);
        }
        if self.max_bytes < max_bytes {
            return Err(format!("it covers messages up to {}, this start takes up to {}", human_bytes(self.max_bytes), human_bytes(max_bytes)));
        }
        Ok(())
    }

    /// One line per mode and dtype: `graph bfloat16: oneshot-push <= 64 KiB < nccl <= 8 MiB`.
    pub fn describe(&self) -> Vec<String> {
        let mut v = Vec::new();
        for p in &self.profiles {
            for line in p.describe() {
                v.push(format!("{} {line}", p.fingerprint.capture));
            }
        }
        v
    }

    /// The entry as the cache stores it: a header naming the format and the FNV-1a 64 of the
    /// body, then the body (TOML).
    pub fn to_entry(&self) -> Result<String> {
        let body = toml::to_string_pretty(self).map_err(|e| Error::invalid("tuned profile", format!("cannot write it as TOML: {e}")))?;
        Ok(format!("{HEADER_MAGIC}{ENTRY_FORMAT} fnv1a64={:016x} bytes={}\n{body}", fnv1a64(body.as_bytes()), body.len()))
    }

    /// Parses and checks an entry: the header's format, the body's length and checksum (a
    /// torn or edited entry is refused), the TOML, and every profile's buckets.
    pub fn from_entry(text: &str) -> Result<Tuned> {
        let bad = |why: String| Error::invalid("tuned profile", why);
        let (header, body) = text.split_once('\n').ok_or_else(|| bad("no header line (truncated?)".into()))?;
        let rest = header.strip_prefix(HEADER_MAGIC).ok_or_else(|| bad("not a tpar tuned profile (header)".into()))?;
        let mut fields = rest.split_whitespace();
        let format: u32 = fields.next().and_then(|v| v.parse().ok()).ok_or_else(|| bad("unreadable format version".into()))?;
        if format != ENTRY_FORMAT {
            return Err(bad(format!("format {format}, this tpar reads {ENTRY_FORMAT}")));
        }
        let (mut sum, mut len) = (None, None);
        for f in fields {
            match f.split_once('=') {
                Some(("fnv1a64", v)) => sum = u64::from_str_radix(v, 16).ok(),
                Some(("bytes", v)) => len = v.parse::<usize>().ok(),
                _ => {}
            }
        }
        let (sum, len) = sum.zip(len).ok_or_else(|| bad("header lacks its checksum or length".into()))?;
        if body.len() != len {
            return Err(bad(format!("{} bytes where the header says {len} (torn write?)", body.len())));
        }
        if fnv1a64(body.as_bytes()) != sum {
            return Err(bad("checksum mismatch (the entry was changed or damaged)".into()));
        }
        let t: Tuned = toml::from_str(body).map_err(|e| bad(format!("bad TOML: {e}")))?;
        for p in &t.profiles {
            // The single-profile checks (ascending buckets, a sane probe).
            Profile::from_toml(&p.to_toml()?)?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::profile::Table;
    use crate::plan::{plan, Overrides, PlanInput};
    use crate::topology::presets;
    use crate::topology::Topology;

    pub(crate) fn key(ranks: RankKind) -> TuneKey {
        TuneKey {
            tpar_version: TuneKey::this_version(),
            cuda_driver: 13000,
            driver_version: Some("580.65.06".into()),
            backend: Backend::Cuda,
            ranks,
            world: 8,
            devices: (0..8).map(|i| format!("GPU-{i}")).collect(),
            topology_hash: "00112233aabbccdd".into(),
            transport: Transport::P2p,
            settings: String::new(),
        }
    }

    fn pt(mode: CaptureMode, bytes: u64, a: Algorithm, us: f64) -> Point {
        Point { collective: Collective::AllReduce, mode, dtype: DType::BF16, bytes, algorithm: a, median_us: us }
    }

    fn decide(t: &Topology, points: &[Point], rejected: Vec<Rejection>, nccl: std::result::Result<(), String>, ranks: RankKind) -> Tuned {
        let fp = |m| ProfileFingerprint::new(t, None, Backend::Cuda, 8, m);
        let nccl_above = |_, _, b: u64| b > 1 << 20;
        Tuned::decide(Decision {
            key: key(ranks),
            max_bytes: 8 << 20,
            points,
            rejected,
            nccl,
            fingerprint: &fp,
            default_is_nccl: &nccl_above,
            probe: None,
            cost: Cost::default(),
            unix_time: 1,
        })
    }

    fn points() -> Vec<Point> {
        use Algorithm::*;
        use CaptureMode::*;
        vec![
            pt(Eager, 16384, OneshotPush, 9.0),
            pt(Eager, 16384, TwoshotPush, 12.0),
            pt(Eager, 16384, Nccl, 30.0),
            pt(Eager, 4 << 20, OneshotPush, 90.0),
            pt(Eager, 4 << 20, TwoshotPush, 50.0),
            pt(Eager, 4 << 20, Nccl, 45.0),
            // In graphs the kernels win everywhere, and the fastest at 16 KiB is wrong.
            pt(Graph, 16384, OneshotPull, 2.0),
            pt(Graph, 16384, OneshotPush, 4.0),
            pt(Graph, 16384, Nccl, 20.0),
            pt(Graph, 4 << 20, OneshotPull, 70.0),
            pt(Graph, 4 << 20, TwoshotPush, 40.0),
            pt(Graph, 4 << 20, Nccl, 44.0),
        ]
    }

    fn rejected_pull() -> Vec<Rejection> {
        vec![Rejection { collective: Collective::AllReduce, algorithm: Algorithm::OneshotPull, dtype: DType::F16, bytes: 1 << 20, wrong: 3, identical: true }]
    }

    #[test]
    fn rank_zero_picks_per_mode_and_bucket_and_a_rejected_candidate_never_wins() {
        let t = presets::h200_nvswitch_8();
        let tuned = decide(&t, &points(), rejected_pull(), Ok(()), RankKind::GpuProcesses);
        let buckets = |m| tuned.profile(m).unwrap().tables[0].buckets.iter().map(|b| (b.max_bytes, b.algorithm)).collect::<Vec<_>>();
        assert_eq!(buckets(CaptureMode::Eager), vec![(16384, Algorithm::OneshotPush), (4 << 20, Algorithm::Nccl)]);
        // Pull failed the screen (at f16 1 MiB): dropped in graph mode at every dtype and size.
        assert_eq!(buckets(CaptureMode::Graph), vec![(16384, Algorithm::OneshotPush), (4 << 20, Algorithm::TwoshotPush)]);
        assert!(tuned.profiles.iter().all(|p| p.tables.iter().all(|t| t.buckets.iter().all(|b| b.algorithm != Algorithm::OneshotPull))));
        assert!(tuned.rejection_for(Collective::AllReduce, Algorithm::OneshotPull).is_some());
        assert_eq!(tuned.nccl, "timed");

        // The plan takes each mode's table for calls of that mode.
        let o = Overrides::default();
        for (mode, bytes, want) in [
            (CaptureMode::Eager, 8192, Algorithm::OneshotPush),
            (CaptureMode::Eager, 1 << 20, Algorithm::Nccl),
            (CaptureMode::Graph, 8192, Algorithm::OneshotPush),
            (CaptureMode::Graph, 1 << 20, Algorithm::TwoshotPush),
        ] {
            let p = tuned.plan_profile(mode).unwrap();
            let got = plan(&PlanInput { topology: &t, world: 8, bytes, dtype: DType::BF16, capture: mode, backend: Backend::Cuda, profile: Some(p), overrides: &o });
            assert_eq!(got.algorithm, want, "{mode} {bytes}: {got}");
            assert!(got.reason.starts_with("profile:"), "{got}");
        }
    }

    /// The all-gather's and reduce-scatter's points beside the all-reduce's (bytes per rank):
    /// push wins the small all-gather, NCCL the large one; the reduce-scatter's push is fastest
    /// everywhere but computed a wrong slice.
    fn gather_scatter_points() -> Vec<Point> {
        use Algorithm::*;
        let mut v = points();
        for mode in [CaptureMode::Eager, CaptureMode::Graph] {
            for (c, bytes, a, us) in [
                (Collective::AllGather, 1792, OneshotPush, 4.0),
                (Collective::AllGather, 1792, Nccl, 15.0),
                (Collective::AllGather, 57344, OneshotPush, 60.0),
                (Collective::AllGather, 57344, Nccl, 35.0),
                (Collective::ReduceScatter, 1792, OneshotPush, 3.0),
                (Collective::ReduceScatter, 1792, Nccl, 16.0),
            ] {
                v.push(Point { collective: c, ..pt(mode, bytes, a, us) });
            }
        }
        v
    }

    #[test]
    fn buckets_and_rejections_are_per_collective() {
        let t = presets::h200_nvswitch_8();
        let mut rejected = rejected_pull();
        rejected.push(Rejection { collective: Collective::ReduceScatter, algorithm: Algorithm::OneshotPush, dtype: DType::BF16, bytes: 1792, wrong: 7, identical: true });
        let tuned = decide(&t, &gather_scatter_points(), rejected, Ok(()), RankKind::GpuProcesses);
        let table = |m, c| tuned.profile(m).unwrap().table(c, DType::BF16).unwrap().buckets.iter().map(|b| (b.max_bytes, b.algorithm, b.rival.map(|r| r.algorithm))).collect::<Vec<_>>();
        for m in CaptureMode::ALL {
            assert_eq!(table(m, Collective::AllGather), vec![(1792, Algorithm::OneshotPush, Some(Algorithm::Nccl)), (57344, Algorithm::Nccl, Some(Algorithm::OneshotPush))]);
            // Push failed the reduce-scatter's screen: NCCL alone there, push still in the all-reduce.
            assert_eq!(table(m, Collective::ReduceScatter), vec![(1792, Algorithm::Nccl, None)]);
            assert!(tuned.profile(m).unwrap().tables.iter().any(|t| t.collective == Collective::AllReduce && t.buckets.iter().any(|b| b.algorithm == Algorithm::OneshotPush)));
        }
        // The all-reduce's tables are what they were without the other collectives.
        let alone = decide(&t, &points(), rejected_pull(), Ok(()), RankKind::GpuProcesses);
        for m in CaptureMode::ALL {
            let ar: Vec<&Table> = tuned.profile(m).unwrap().tables.iter().filter(|t| t.collective == Collective::AllReduce).collect();
            assert_eq!(ar, alone.profile(m).unwrap().tables.iter().collect::<Vec<_>>());
        }
        assert!(tuned.rejection_for(Collective::ReduceScatter, Algorithm::OneshotPush).is_some());
        assert!(tuned.rejection_for(Collective::AllReduce, Algorithm::OneshotPush).is_none());
        let said = tuned.rejected[1].to_string();
        assert!(said.contains("reduce-scatter") && said.contains("7 elements"), "{said}");
        assert!(tuned.describe().iter().any(|l| l == "graph all-gather bfloat16: oneshot-push <= 1.8 KiB < nccl <= 56 KiB"), "{:?}", tuned.describe());
        // The entry keeps every table.
        assert_eq!(Tuned::from_entry(&tuned.to_entry().unwrap()).unwrap(), tuned);
        // Without NCCL timings the other collectives keep no table on GPUs (the simulator
        // decides them), and do on CPU ranks (there is no NCCL to lose to).
        let no_nccl = decide(&t, &gather_scatter_points(), Vec::new(), Err("not joined".into()), RankKind::GpuProcesses);
        assert!(no_nccl.profiles.iter().all(|p| p.tables.iter().all(|t| t.collective == Collective::AllReduce)));
        let emulated = decide(&t, &gather_scatter_points(), Vec::new(), Err("emulated".into()), RankKind::Emulated);
        assert!(emulated.profile(CaptureMode::Graph).unwrap().table(Collective::AllGather, DType::BF16).is_some(), "kept to show what was measured");
        assert!(emulated.plan_profile(CaptureMode::Graph).is_err(), "and never handed to the plan");
        let fp = |m| ProfileFingerprint::new(&Topology::cpu(), None, Backend::Cpu, 8, m);
        let never = |_, _, _| false;
        let cpu = Tuned::decide(Decision {
            key: TuneKey { backend: Backend::Cpu, ranks: RankKind::Cpu, ..key(RankKind::Cpu) },
            max_bytes: 8 << 20,
            points: &gather_scatter_points(),
            rejected: Vec::new(),
            nccl: Err("CPU ranks have no NCCL".into()),
            fingerprint: &fp,
            default_is_nccl: &never,
            probe: None,
            cost: Cost::default(),
            unix_time: 1,
        });
        assert!(cpu.profile(CaptureMode::Eager).unwrap().table(Collective::AllGather, DType::BF16).is_some());
    }

    #[test]
    fn a_profile_without_collectives_reads_as_the_all_reduce_and_an_old_entry_is_re_tuned() {
        let t = presets::h200_nvswitch_8();
        let tuned = decide(&t, &points(), Vec::new(), Ok(()), RankKind::GpuProcesses);
        let p = tuned.profile(CaptureMode::Eager).unwrap();
        let text = p.to_toml().unwrap();
        assert!(!text.contains("collective") && !text.contains("rival"), "the all-reduce's tables are written as before: {text}");
        assert_eq!(Profile::from_toml(&text).unwrap(), *p);
        let entry = tuned.to_entry().unwrap();
        let old = entry.replacen(&format!("v{ENTRY_FORMAT} "), "v1 ", 1);
        assert!(Tuned::from_entry(&old).unwrap_err().to_string().contains(&format!("format 1, this tpar reads {ENTRY_FORMAT}")));
        // Two tables of one collective and dtype are refused.
        let mut twice = p.clone();
        twice.tables.push(twice.tables[0].clone());
        assert!(Profile::from_toml(&twice.to_toml().unwrap()).unwrap_err().to_string().contains("two all-reduce bfloat16 tables"));
    }

    #[test]
    fn without_nccl_timings_a_profile_stops_where_the_defaults_take_nccl() {
        let t = presets::h200_nvswitch_8();
        let tuned = decide(&t, &points(), Vec::new(), Err("ranks share a GPU".into()), RankKind::GpuProcesses);
        assert_eq!(tuned.nccl, "not timed: ranks share a GPU");
        for p in &tuned.profiles {
            assert!(p.tables[0].buckets.iter().all(|b| b.max_bytes <= 1 << 20), "{:?}", p.tables);
        }
    }

    #[test]
    fn shared_gpu_and_emulated_tunes_are_stored_but_never_decide() {
        let t = presets::h200_nvswitch_8();
        for kind in [RankKind::SharedGpu, RankKind::Emulated] {
            let tuned = decide(&t, &points(), Vec::new(), Ok(()), kind);
            assert!(tuned.profile(CaptureMode::Graph).is_some());
            let why = tuned.plan_profile(CaptureMode::Graph).unwrap_err();
            assert!(why.contains("not fabric figures"), "{why}");
        }
        assert_eq!(RankKind::of_processes(&["a".into(), "b".into()]), RankKind::GpuProcesses);
        assert_eq!(RankKind::of_processes(&["a".into(), "b".into(), "a".into()]), RankKind::SharedGpu);
    }

    #[test]
    fn entries_round_trip_and_a_damaged_or_foreign_one_is_refused() {
        let t = presets::h200_nvswitch_8();
        let tuned = decide(&t, &points(), rejected_pull(), Ok(()), RankKind::GpuProcesses);
        let text = tuned.to_entry().unwrap();
        assert_eq!(Tuned::from_entry(&text).unwrap(), tuned);
        // Torn at every length: never accepted.
        for cut in [0, 10, text.len() / 2, text.len() - 1] {
            assert!(Tuned::from_entry(&text[..cut]).is_err(), "cut at {cut}");
        }
        // One byte changed in the body.
        let flipped = text.replacen("timed", "tImed", 1);
        assert!(Tuned::from_entry(&flipped).unwrap_err().to_string().contains("checksum"));
        assert!(Tuned::from_entry("# tpar tuned profile v9 fnv1a64=0 bytes=0\n").unwrap_err().to_string().contains("format 9"));
        assert!(Tuned::from_entry("garbage\n").is_err());
    }

    #[test]
    fn a_key_names_what_changed() {
        let k = key(RankKind::GpuProcesses);
        assert!(k.mismatch(&k).is_none());
        let mut old = k.clone();
        old.tpar_version = "0.0.1".into();
        assert!(k.mismatch(&old).unwrap().contains("tpar 0.0.1"));
        assert_eq!(old.stem(), k.stem(), "a new version replaces the entry of the old one");
        let mut d = k.clone();
        d.cuda_driver = 12080;
        assert!(k.mismatch(&d).unwrap().contains("driver"));
        let mut w = k.clone();
        w.devices.swap(0, 1);
        assert!(k.mismatch(&w).unwrap().contains("devices"));
        assert_ne!(w.stem(), k.stem());
        let tuned = decide(&presets::h200_nvswitch_8(), &points(), Vec::new(), Ok(()), RankKind::GpuProcesses);
        assert!(tuned.serves(&k, 8 << 20).is_ok());
        assert!(tuned.serves(&k, 16 << 20).unwrap_err().contains("up to 8 MiB"));
        assert!(tuned.serves(&old, 1 << 20).is_err());
    }
}
