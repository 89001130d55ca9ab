//! The first-use tune's ranks as processes ([`ProcessRanks`]): one per rank process, on a
//! workspace of the tune's own (its own IPC areas, stream, buffers, a shorter device
//! deadline) beside the communicator's, timing NCCL on a communicator joined for the tune
//! over the control plane and destroyed after it (even when tpar joins none of its own,
//! `NcclUse::Caller`). So a kernel that fails or hangs in the tune poisons only the tune's
//! workspace: the communicator keeps the plan's defaults and runs. The communicator starts
//! the tune and adopts what it decides (`comm/tune_start.rs`); emulated ranks have their own
//! (`tune_emulated.rs`).
//!
//! Owns: the tune's workspace and NCCL, the candidates it screens, the settings its key
//! carries. Must never: let the tune's failure poison the communicator, or know the
//! communicator (it gets a [`Setup`] of plain values).

use super::abi;
use super::driver::{Device, DeviceBuffer, Event, Graph};
use super::rank_set::{RankSet, SetOptions};
use super::probe_ipc;
use super::nccl::{self, NcclComm};
use crate::algorithms::registry::{Role, REGISTRY};
use crate::algorithms::Algorithm;
use crate::control::ControlPlane;
use crate::dtype::{by_dtype, DType, Element};
use crate::error::{Error, Result};
use crate::kinds::{Backend, CaptureMode, Transport};
use crate::plan::feasibility::{check, Fabric};
use crate::plan::tuned::RankKind;
use crate::settings::LaunchSettings;
use crate::tune::screen::{judge, ScreenCache};
use crate::tune::{step, Judged, Ranks, Rounds};
use std::time::{Duration, Instant};

pub use crate::testing::{POISON_WORD, TIMING_WORD};
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
    ws: RankSet,
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
            Some(l) => st.ws.launch_resolved(l, desc, count, &[i], &[o]),
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
        let opts = SetOptions { transport: s.transport, timeout: self.device_timeout(), check_calls: s.check_calls, islands: Vec::new(), host_protocol: s.host_protocol, launch: s.launch, wire: crate::kinds::Wire::Exact };
        let made = RankSet::process(s.device.ordinal, s.rank, s.world, s.max_bytes, s.job_id ^ TUNE_JOB_SALT, opts);
        let blob = made.as_ref().map_err(|e| Error::invalid("tune workspace", e.to_string())).and_then(|w| w.handle_blob());
        let blobs = step(self, blob)?;
        let mut ws = made?;
        let connected = ws.connect(&blobs);
        step(self, connected.map(|()| Vec::new()))?;
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
        let (device, me, p2p) = (self.setup.device.clone(), self.setup.rank, self.setup.transport == Transport::P2p);
        probe_ipc::probe_links(self, &device, me, p2p, &probe_ipc::FIRST_USE_PROBE).map(Some)
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


#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

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
