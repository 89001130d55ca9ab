//! The first-use tune of a [`GpuCommunicator`]: [`GpuCommunicator::tune_with`] runs at the
//! end of `init`, on every rank together, after the workspaces connect. Rank 0 reads this
//! machine's tune from the cache, or (holding the cache's lock) the ranks measure it
//! ([`crate::tune`], on ranks of the tune's own: `cuda::tune::TuneRanks::process`) and rank 0
//! stores it; every rank adopts the same bytes, plans each call with the table of its capture
//! mode, and never runs a candidate the screen rejected.
//!
//! Owns: the key of this start (every rank's device UUID, drivers, topology, transport,
//! settings), adoption, the profiles `TPAR_PROFILE` names. Must never: tune when the plan is
//! forced or `TPAR_PROFILE` names a profile, or leave ranks with different tunes (their
//! digests are compared).

use super::*;
use crate::cuda::tune::{candidates, timing_settings, Setup, TuneRanks};
use crate::kinds::Backend;
use crate::plan::plan;
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{RankKind, TuneKey};
use crate::settings::LaunchSettings;
use crate::tune::{self, Outcome, StartSpec, TunePlan};

/// Why this communicator does not tune, when it must not: the plan is forced, a profile is
/// named, or the ranks are not placed on the topology (every call goes to NCCL).
fn skip_reason(comm: &GpuCommunicator) -> Option<String> {
    let o = &comm.overrides;
    if o.profile.is_some() {
        return Some("TPAR_PROFILE names a profile: it decides".into());
    }
    if o.disable {
        return Some("TPAR_DISABLE=1: every call goes to NCCL".into());
    }
    if let Some(a) = o.algorithm {
        return Some(format!("TPAR_ALGO={a} forces the algorithm"));
    }
    if o.transport == Some(Transport::Nccl) {
        return Some("TPAR_TRANSPORT=nccl: every call goes to NCCL".into());
    }
    if let Placement::Unknown(why) = &comm.placement {
        return Some(format!("the ranks are not placed on the topology ({why}): every call goes to NCCL"));
    }
    None
}

/// What a communicator keeps from its `Config` for later starts of its tune.
#[derive(Clone, Debug)]
pub(super) struct TuneContext {
    pub job_id: u64,
    pub launch: LaunchSettings,
    pub timeout: Duration,
    pub max_bytes: usize,
}

impl TuneContext {
    pub(super) fn of(cfg: &Config, max_bytes: usize) -> TuneContext {
        TuneContext { job_id: cfg.job_id, launch: cfg.launch, timeout: cfg.timeout, max_bytes }
    }
}

impl GpuCommunicator {
    /// A start of this machine's tune on every rank together (`init` runs one with
    /// `TPAR_TUNE`, the cache and the first-use budget): skip, read the cache, or tune;
    /// then adopt it (each capture mode's table; candidates the screen rejected never run),
    /// check that every rank holds the same, and print the start's line (rank 0; a failure
    /// on every rank). Only a broken control plane or ranks that adopted different tunes are
    /// errors; a failed tune keeps the defaults.
    pub fn tune_with(&mut self, opts: crate::tune::StartOptions) -> Result<&Outcome> {
        let (rank, world) = (self.rank(), self.world());
        let ctx = self.tune_ctx.clone();
        let device = self.ws.device().clone();
        let devices: Vec<String> = self.control.all_gather_bytes(device.uuid()?.as_bytes())?.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect();
        let kind = RankKind::of_processes(&devices);
        let transport = self.ws.transport();
        let key = TuneKey {
            tpar_version: TuneKey::this_version(),
            cuda_driver: crate::cuda::driver::driver_version(),
            // Only rank 0 reads the cache; NVML is asked there alone.
            driver_version: if rank == 0 { crate::topology::nvml::driver_version() } else { None },
            backend: Backend::Cuda,
            ranks: kind,
            world,
            devices,
            topology_hash: format!("{:016x}", self.topology.hash()),
            transport,
            settings: timing_settings(&self.overrides, &ctx.launch, transport),
        };
        let islands = islands_for(&self.topology, world);
        let setup = Setup {
            device,
            rank,
            world,
            max_bytes: ctx.max_bytes,
            timeout: ctx.timeout,
            transport,
            host_protocol: self.overrides.host_protocol,
            job_id: ctx.job_id,
            launch: ctx.launch,
            blocks: self.overrides.blocks,
            check_calls: self.check_calls,
            island_word: crate::algorithms::hierarchical::island_word(&as_u32(&islands), world).unwrap_or(0),
            islands,
            kind,
            candidates: candidates(&self.topology, world, transport),
        };
        let skip = skip_reason(self);
        let (topology, overrides) = (&self.topology, &self.overrides);
        let fingerprint = |m| ProfileFingerprint::new(topology, None, Backend::Cuda, world, m);
        let default_is_nccl = |m, d, b| {
            plan(&PlanInput { topology, world, bytes: b, dtype: d, capture: m, backend: Backend::Cuda, profile: None, overrides }).algorithm == Algorithm::Nccl
        };
        let max_bytes = ctx.max_bytes as u64;
        let spec = StartSpec {
            tune: opts.tune,
            skip,
            cache: opts.cache,
            key,
            max_bytes,
            plan: opts.plan.unwrap_or_else(|| TunePlan::first_use(max_bytes, kind, &CaptureMode::ALL)),
            lock_wait: tune::LOCK_WAIT_MAX.min(ctx.timeout / 2),
            fingerprint: &fingerprint,
            default_is_nccl: &default_is_nccl,
        };
        let outcome = tune::start(&mut TuneRanks::process(&mut self.control, setup), &spec)?;
        self.adopt(outcome)?;
        Ok(&self.tune)
    }

    /// Takes the tune's profiles (each capture mode its own table) and its screen's verdicts,
    /// checks that every rank holds the same tune, and prints the start's line.
    fn adopt(&mut self, outcome: Outcome) -> Result<()> {
        if let Some(t) = outcome.tuned() {
            for mode in CaptureMode::ALL {
                match t.plan_profile(mode) {
                    Ok(p) => self.profiles[mode_index(mode)] = Some(p.clone()),
                    Err(why) => tracing::info!(target: "tpar::tune", "rank {}: {mode} calls keep the defaults: {why}", self.rank()),
                }
            }
            self.rejected = t.rejected.clone();
        }
        let digest = crate::units::fnv1a64(outcome.tuned().map(|t| t.to_entry()).transpose()?.unwrap_or_default().as_bytes());
        let all = self.control.all_gather_bytes(&digest.to_le_bytes())?;
        if let Some((peer, theirs)) = all.iter().enumerate().find(|(_, d)| d.as_slice() != digest.to_le_bytes()) {
            return Err(Error::Mismatch {
                rank: self.rank(),
                peer,
                field: "tuned profile",
                ours: format!("{digest:016x}"),
                theirs: format!("{:016x}", u64::from_le_bytes(theirs.as_slice().try_into().unwrap_or([0; 8]))),
            });
        }
        let line = outcome.line();
        match &outcome {
            Outcome::Failed { .. } => {
                tracing::warn!(target: "tpar::tune", "rank {}: {line}", self.rank());
                eprintln!("rank {}: {line}", self.rank());
            }
            Outcome::Skipped { .. } | Outcome::Cached { .. } | Outcome::Tuned { .. } => {
                tracing::info!(target: "tpar::tune", "{line}");
                if self.rank() == 0 {
                    eprintln!("{line}");
                }
            }
        }
        self.tune = outcome;
        Ok(())
    }
}

/// The profiles `TPAR_PROFILE` names, by capture mode: a `tpar tune` profile (one mode; the
/// plan ignores it in the other, and says why) in both slots, or a tune cache entry's tables
/// (each mode its own; none from ranks that share a GPU).
pub(super) fn load_profiles(path: &std::path::Path) -> Result<[Option<crate::plan::profile::Profile>; 2]> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(0, format!("reading profile {}", path.display()), e))?;
    if text.starts_with("# tpar tuned profile") {
        let t = crate::plan::tuned::Tuned::from_entry(&text).map_err(|e| Error::invalid("TPAR_PROFILE", format!("{}: {e}", path.display())))?;
        return Ok(CaptureMode::ALL.map(|m| t.plan_profile(m).ok().cloned()));
    }
    let p = crate::plan::profile::Profile::from_toml(&text)?;
    Ok([Some(p.clone()), Some(p)])
}

/// The index of `mode` in a communicator's per-mode tables.
pub(super) fn mode_index(mode: CaptureMode) -> usize {
    match mode {
        CaptureMode::Eager => 0,
        CaptureMode::Graph => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::profile::Profile;
    use crate::plan::tuned::{Cost, Decision, Point, Tuned};
    use crate::topology::presets;

    fn entry(kind: RankKind) -> Tuned {
        let t = presets::h200_nvswitch_8();
        let points: Vec<Point> = CaptureMode::ALL
            .iter()
            .flat_map(|&mode| [(Algorithm::OneshotPush, 5.0), (Algorithm::Nccl, 20.0)].map(|(algorithm, us)| Point { collective: crate::kinds::Collective::AllReduce, mode, dtype: DType::BF16, bytes: 43008, algorithm, median_us: us }))
            .collect();
        let fp = |m| ProfileFingerprint::new(&t, None, Backend::Cuda, 8, m);
        let never = |_, _, _| false;
        let key = TuneKey {
            tpar_version: TuneKey::this_version(),
            cuda_driver: 13000,
            driver_version: None,
            backend: Backend::Cuda,
            ranks: kind,
            world: 8,
            devices: vec!["GPU-x".into(); 8],
            topology_hash: format!("{:016x}", t.hash()),
            transport: Transport::P2p,
            settings: String::new(),
        };
        Tuned::decide(Decision { key, max_bytes: 1 << 20, points: &points, rejected: Vec::new(), nccl: Ok(()), fingerprint: &fp, default_is_nccl: &never, probe: None, cost: Cost::default(), unix_time: 0 })
    }


    #[test]
    fn tpar_profile_takes_a_tune_profile_or_a_cache_entry() {
        let dir = std::env::temp_dir().join(format!("tpar-loadprof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let both = dir.join("entry.toml");
        std::fs::write(&both, entry(RankKind::GpuProcesses).to_entry().unwrap()).unwrap();
        let p = load_profiles(&both).unwrap();
        assert_eq!(p[mode_index(CaptureMode::Eager)].as_ref().unwrap().fingerprint.capture, CaptureMode::Eager);
        assert_eq!(p[mode_index(CaptureMode::Graph)].as_ref().unwrap().fingerprint.capture, CaptureMode::Graph);
        let shared = dir.join("shared.toml");
        std::fs::write(&shared, entry(RankKind::SharedGpu).to_entry().unwrap()).unwrap();
        assert!(load_profiles(&shared).unwrap().iter().all(Option::is_none), "no fabric figures from ranks sharing a GPU");
        let one = dir.join("one.toml");
        let single: Profile = entry(RankKind::GpuProcesses).profile(CaptureMode::Graph).unwrap().clone();
        single.save(&one).unwrap();
        assert!(load_profiles(&one).unwrap().iter().all(|p| p.as_ref() == Some(&single)));
        let torn = dir.join("torn.toml");
        let text = entry(RankKind::GpuProcesses).to_entry().unwrap();
        std::fs::write(&torn, &text[..text.len() - 3]).unwrap();
        assert!(load_profiles(&torn).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

}
