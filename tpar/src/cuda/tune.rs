//! The first-use tune of a [`GpuCommunicator`]: [`GpuCommunicator::tune_with`] runs at the end of `init`, on
//! every rank together, after the workspaces connect. Rank 0 reads this machine's tune from
//! the cache, or (holding the cache's lock) the ranks measure it ([`crate::tune`]) and rank
//! 0 stores it; every rank adopts the same bytes, plans each call with the table of its
//! capture mode, and never runs a candidate the screen rejected.
//!
//! The ranks measure on a workspace of the tune's own ([`ProcessRanks`]: its own IPC areas,
//! stream, buffers, a shorter device deadline), beside the communicator's, and time NCCL on
//! a communicator joined for the tune over the control plane and destroyed after it (even
//! when tpar joins none of its own, `NcclUse::Caller`). So a kernel that fails or hangs in
//! the tune poisons only the tune's workspace: the communicator keeps the plan's defaults
//! and runs.
//!
//! Owns: the key of this start (every rank's device UUID, drivers, topology, transport,
//! settings), the tune's workspace and NCCL, adoption. Must never: tune when the plan is
//! forced or `TPAR_PROFILE` names a profile, let the tune's failure poison the communicator,
//! or leave ranks with different tunes (their digests are compared).

use super::abi;
use super::comm::GpuCommunicator;
use super::driver::{Device, DeviceBuffer, Event, Graph};
use super::ipc::IpcWorkspace;
use super::nccl::{self, NcclComm};
use crate::algorithms::registry::{Role, REGISTRY};
use crate::algorithms::Algorithm;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::dtype::{by_dtype, DType, Element};
use crate::error::{Error, Result};
use crate::kinds::{Backend, CaptureMode, Transport};
use crate::plan::feasibility::{check, Fabric};
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{RankKind, TuneKey};
use crate::plan::{plan, PlanInput};
use crate::settings::LaunchSettings;
use crate::topology::ranks::Placement;
use crate::tune::screen::{judge, ScreenCache};
use crate::tune::{self, step, Judged, Outcome, Ranks, Rounds, StartSpec, TunePlan};
use std::time::{Duration, Instant};

/// Written into outputs before each screened call: a NaN in every lane width that no
/// algorithm writes and that is not the workspace's empty sentinel.
pub const POISON_WORD: u32 = 0x7fa5_7fa5;
/// Written into inputs before timed calls: finite and non-zero in every lane width.
pub const TIMING_WORD: u32 = 0x3c00_3c00;
/// Device deadline of the tune's kernels (every wait), unless `TPAR_TIMEOUT_MS` is shorter: a
/// tune call takes microseconds to a millisecond, so a rank that stops comes to light in
/// seconds, not after the communicator's 30 s.
pub const TUNE_DEVICE_TIMEOUT: Duration = Duration::from_secs(5);
/// Beyond the device deadline, what the host allows a tune call (NCCL's calls have no
/// deadline of their own: past this, the tune's NCCL is aborted).
const HOST_GRACE: Duration = Duration::from_secs(1);
/// Salt of the tune workspace's job id (its host segment's name differs from the
/// communicator's).
const TUNE_JOB_SALT: u64 = 0x7475_6e65_0000_0001;

/// What the tune's ranks need from the communicator.
pub struct Setup {
    pub device: Device,
    pub rank: usize,
    pub world: usize,
    pub max_bytes: usize,
    pub timeout: Duration,
    pub transport: Transport,
    pub host_protocol: Option<crate::plan::HostProtocol>,
    pub job_id: u64,
    pub launch: LaunchSettings,
    pub check_calls: bool,
    pub island_word: u64,
    pub islands: Vec<Vec<usize>>,
    pub kind: RankKind,
    /// The plan's candidates that run on this fabric over `transport`.
    pub candidates: Vec<Algorithm>,
}

/// What the tune allocates, once it runs ([`Ranks::prepare`]).
struct State {
    ws: IpcWorkspace,
    input: DeviceBuffer,
    output: DeviceBuffer,
    start: Event,
    end: Event,
    nccl: std::result::Result<NcclComm, String>,
    nccl_seconds: f64,
}

/// One rank process of the tune (see the module's contract).
pub struct ProcessRanks<'a> {
    pub(super) control: &'a mut ControlPlane,
    pub(super) setup: Setup,
    state: Option<State>,
    screen: ScreenCache,
}

impl<'a> ProcessRanks<'a> {
    pub fn new(control: &'a mut ControlPlane, setup: Setup) -> ProcessRanks<'a> {
        ProcessRanks { control, setup, state: None, screen: ScreenCache::default() }
    }

    fn state(&mut self) -> Result<&mut State> {
        self.state.as_mut().ok_or_else(|| Error::invalid("tune", "the tune's workspace is not prepared"))
    }

    fn device_timeout(&self) -> Duration {
        self.setup.timeout.min(TUNE_DEVICE_TIMEOUT)
    }

    /// Waits for the tune's stream, at most the device deadline and a grace: a peer that
    /// died, or NCCL stuck past it, is an error (the tune's NCCL is then aborted).
    fn wait(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.device_timeout() + HOST_GRACE;
        let rank = self.setup.rank;
        let mut polls = 0u32;
        loop {
            let st = self.state()?;
            if st.ws.stream().is_done()? {
                return st.ws.synchronize();
            }
            if Instant::now() >= deadline {
                if let Ok(n) = &mut st.nccl {
                    n.abort();
                }
                st.ws.poison("the tune's stream did not finish in time".into());
                return Err(Error::Timeout { rank, waited_ms: (self.device_timeout() + HOST_GRACE).as_millis() as u64, what: "the tune's GPU stream".into() });
            }
            polls = polls.saturating_add(1);
            if polls % 1024 == 0 {
                if let Some(peer) = self.control.dead_peer() {
                    return Err(Error::PeerDied { rank, peer, during: "the tune".into() });
                }
            }
            if polls < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Enqueues one call of `algo` on the tune's stream (`launch`: the kernel's, resolved).
    fn call(&mut self, algo: Algorithm, launch: Option<&super::launch::Launch>, desc: u32, dtype: DType, count: usize) -> Result<()> {
        let st = self.state()?;
        let (i, o) = (st.input.ptr, st.output.ptr);
        match launch {
            Some(l) => st.ws.launch_resolved(l, desc, count, i, o),
            None => match &st.nccl {
                // SAFETY: both buffers hold max_bytes >= count * dtype.size() bytes (the tune's
                // sizes are within max_bytes) and live until the stream is waited for.
                Ok(n) => unsafe { n.all_reduce(i, o, count, dtype, st.ws.stream()) },
                Err(why) => Err(Error::Unsupported { what: format!("timing {algo}"), reason: why.clone() }),
            },
        }
    }

    fn screen_t<T: Element + Send + 'static>(&mut self, algo: Algorithm, count: usize, seed: u64) -> Result<Vec<Judged>> {
        let (rank, world) = (self.setup.rank, self.setup.world);
        let bytes = count * T::DTYPE.size();
        let set = self.screen.get::<T>(world, count, seed)?;
        let st = self.state.as_mut().ok_or_else(|| Error::invalid("tune", "not prepared"))?;
        st.input.upload(&set.inputs[rank])?;
        st.output.fill_u32(POISON_WORD)?;
        let l = st.ws.resolve(algo, T::DTYPE, bytes, 0)?;
        let desc = if self.setup.check_calls { abi::desc_code(algo, T::DTYPE) } else { 0 };
        self.call(algo, Some(&l), desc, T::DTYPE, count)?;
        self.wait()?;
        let mut out = vec![T::from_f32(0.0); count];
        self.state()?.output.download(&mut out)?;
        let set = self.screen.get::<T>(world, count, seed)?;
        Ok(vec![judge(&out, set.promised(algo, &self.setup.islands))])
    }

    fn time_op(&mut self, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        let inner = rounds.inner.max(1);
        let bytes = count * dtype.size();
        let st = self.state()?;
        st.input.fill_u32(TIMING_WORD)?;
        let launch = if algo == Algorithm::Nccl { None } else { Some(st.ws.resolve(algo, dtype, bytes, 0)?) };
        let desc = if self.setup.check_calls && algo != Algorithm::Nccl { abi::desc_code(algo, dtype) } else { 0 };
        let graph: Option<Graph> = match mode {
            CaptureMode::Eager => None,
            CaptureMode::Graph => {
                // Captured as engines capture: no per-call descriptor inside a graph.
                self.state()?.ws.stream().begin_capture()?;
                let mut r = Ok(());
                for _ in 0..inner {
                    r = r.and_then(|()| self.call(algo, launch.as_ref(), 0, dtype, count));
                }
                let g = self.state()?.ws.stream().end_capture();
                r?;
                Some(g?)
            }
        };
        let mut times = Vec::with_capacity(rounds.iters);
        for k in 0..rounds.warmup + rounds.iters {
            self.sync()?;
            {
                let st = self.state()?;
                st.ws.stream().record(&st.start)?;
            }
            match &graph {
                Some(g) => g.launch(self.state()?.ws.stream())?,
                None => {
                    for _ in 0..inner {
                        self.call(algo, launch.as_ref(), desc, dtype, count)?;
                    }
                }
            }
            {
                let st = self.state()?;
                st.ws.stream().record(&st.end)?;
            }
            self.wait()?;
            if k >= rounds.warmup {
                let st = self.state()?;
                times.push(f64::from(st.start.elapsed_ms(&st.end)?) * 1e3 / inner as f64);
            }
        }
        Ok(vec![times])
    }

    /// Joins the tune's NCCL, or says why it does not (the same on every rank).
    fn join_nccl(&mut self) -> Result<std::result::Result<NcclComm, String>> {
        if self.setup.kind == RankKind::SharedGpu {
            // Every rank must take this branch: the kind comes from the exchanged UUIDs.
            return Ok(Err("ranks share a GPU (NCCL refuses several ranks on one GPU)".into()));
        }
        let joined = nccl::init_over_rendezvous(self.control, &self.setup.device);
        let mine = match &joined {
            Ok(_) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        };
        let all = step(self, Ok(mine))?;
        match all.iter().enumerate().find(|(_, b)| !b.is_empty()) {
            None => Ok(joined.map_err(|e| e.to_string())),
            Some((r, why)) => {
                if let Ok(mut n) = joined {
                    n.abort();
                }
                Ok(Err(format!("rank {r} could not join NCCL for the tune: {}", String::from_utf8_lossy(why))))
            }
        }
    }
}

impl Ranks for ProcessRanks<'_> {
    fn world(&self) -> usize {
        self.setup.world
    }
    fn is_root(&self) -> bool {
        self.setup.rank == 0
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.control.all_gather_bytes(mine)
    }
    fn modes(&self) -> Vec<CaptureMode> {
        CaptureMode::ALL.to_vec()
    }
    fn candidates(&self) -> Vec<Algorithm> {
        self.setup.candidates.clone()
    }
    fn nccl(&self) -> std::result::Result<(), String> {
        match self.state.as_ref().map(|s| &s.nccl) {
            Some(Ok(_)) => Ok(()),
            Some(Err(why)) => Err(why.clone()),
            None => Err("the tune did not start".into()),
        }
    }
    fn nccl_join_seconds(&self) -> f64 {
        self.state.as_ref().map_or(0.0, |s| s.nccl_seconds)
    }
    fn prepare(&mut self) -> Result<()> {
        let s = &self.setup;
        let made = IpcWorkspace::with_transport(s.device.ordinal, s.rank, s.world, s.max_bytes, self.device_timeout(), s.transport, s.host_protocol, s.job_id ^ TUNE_JOB_SALT, s.launch);
        let blob = made.as_ref().map_err(|e| Error::invalid("tune workspace", e.to_string())).and_then(|w| w.handle_blob());
        let blobs = step(self, blob)?;
        let mut ws = made?;
        let connected = ws.connect(&blobs);
        step(self, connected.map(|()| Vec::new()))?;
        ws.set_check_calls(self.setup.check_calls);
        ws.set_islands(self.setup.island_word);
        let extra = (|| -> Result<(DeviceBuffer, DeviceBuffer, Event, Event)> {
            ws.all_attached()?;
            let dev = ws.device().clone();
            Ok((DeviceBuffer::new(&dev, self.setup.max_bytes)?, DeviceBuffer::new(&dev, self.setup.max_bytes)?, Event::new(&dev)?, Event::new(&dev)?))
        })();
        let said = extra.as_ref().map(|_| Vec::new()).map_err(|e| Error::invalid("tune buffers", e.to_string()));
        step(self, said)?;
        let (input, output, start, end) = extra?;
        let t0 = Instant::now();
        let nccl = self.join_nccl()?;
        self.state = Some(State { ws, input, output, start, end, nccl, nccl_seconds: t0.elapsed().as_secs_f64() });
        Ok(())
    }
    fn screen_local(&mut self, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Vec<Judged>> {
        by_dtype!(dtype, T => self.screen_t::<T>(algo, count, seed))
    }
    fn time_local(&mut self, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        self.time_op(algo, dtype, count, mode, rounds)
    }
    fn probe(&mut self) -> Result<Option<crate::topology::probe::Probe>> {
        self.probe_links(&super::probe_ipc::FIRST_USE_PROBE).map(Some)
    }
    fn settle(&mut self) {
        if self.state.is_some() {
            let _ = self.wait();
        }
    }
}

/// The candidates the plan could pick on `topology` over `transport`, for the tune to screen.
pub fn candidates(topology: &crate::topology::Topology, world: usize, transport: Transport) -> Vec<Algorithm> {
    let f = Fabric::of(topology, world, Backend::Cuda);
    REGISTRY.iter().filter(|s| s.role == Role::Candidate && check(s.algorithm, transport, &f).is_ok()).map(|s| s.algorithm).collect()
}

/// Settings that change timings, as the key carries them (empty when none is set).
pub fn timing_settings(overrides: &crate::settings::Overrides, launch: &LaunchSettings, transport: Transport) -> String {
    let mut v = Vec::new();
    if transport == Transport::Host {
        v.push(format!("host_protocol={:?}", overrides.host_protocol));
    }
    if let Some(b) = launch.blocks {
        v.push(format!("TPAR_BLOCKS={b}"));
    }
    if !launch.pdl {
        v.push("TPAR_PDL=0".into());
    }
    if let Some(l) = launch.lean {
        v.push(format!("TPAR_LEAN={}", u8::from(l)));
    }
    if overrides.check_calls == Some(false) {
        v.push("TPAR_CHECK_CALLS=0".into());
    }
    v.join(" ")
}

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
            cuda_driver: super::driver::driver_version(),
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
        let islands = super::comm::islands_for(&self.topology, world);
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
            check_calls: self.check_calls,
            island_word: crate::algorithms::hierarchical::island_word(&super::comm::as_u32(&islands), world).unwrap_or(0),
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
        let outcome = tune::start(&mut ProcessRanks::new(&mut self.control, setup), &spec)?;
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
            .flat_map(|&mode| [(Algorithm::OneshotPush, 5.0), (Algorithm::Nccl, 20.0)].map(|(algorithm, us)| Point { mode, dtype: DType::BF16, bytes: 43008, algorithm, median_us: us }))
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

    #[test]
    fn candidates_are_what_the_plan_could_pick_here_and_settings_that_change_timings_key() {
        let nv = candidates(&presets::h200_nvswitch_8(), 8, Transport::P2p);
        assert!(nv.contains(&Algorithm::OneshotPush) && nv.contains(&Algorithm::TwoshotPull), "{nv:?}");
        assert!(!nv.contains(&Algorithm::Nccl) && !nv.contains(&Algorithm::GatherBcast), "{nv:?}");
        let host = candidates(&presets::rtx4090_nop2p_4(), 4, Transport::Host);
        assert!(host.iter().all(|a| !crate::algorithms::registry::spec(*a).reads_remote), "no reads over host: {host:?}");
        assert!(!host.is_empty());
        let o = crate::settings::Overrides::default();
        assert_eq!(timing_settings(&o, &LaunchSettings::default(), Transport::P2p), "");
        let s = crate::settings::Settings::from_pairs([("TPAR_BLOCKS", "8"), ("TPAR_PDL", "0")]).unwrap();
        assert_eq!(timing_settings(&s.overrides, &s.launch, Transport::P2p), "TPAR_BLOCKS=8 TPAR_PDL=0");
        assert!(timing_settings(&o, &LaunchSettings::default(), Transport::Host).contains("host_protocol"));
    }
}
