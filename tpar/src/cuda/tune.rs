//! The first-use tune's ranks ([`TuneRanks`]), written once over a [`RankSet`] however its
//! ranks are placed, and the start of emulated ranks ([`start_emulated`]).
//!
//! - Rank processes ([`TuneRanks::process`]): one per rank process, on a workspace of the
//!   tune's own (its own IPC areas, stream, buffers, a shorter device deadline) beside the
//!   communicator's, timing NCCL on a communicator joined for the tune over the control plane
//!   and destroyed after it (even when tpar joins none of its own, `NcclUse::Caller`). So a
//!   kernel that fails or hangs in the tune poisons only the tune's workspace: the
//!   communicator keeps the plan's defaults and runs. The communicator starts the tune and
//!   adopts what it decides (`comm/tune_start.rs`).
//! - Emulated ranks ([`TuneRanks::emulated`]): N streams of one GPU in one process, on the
//!   caller's set: the same start as a communicator's ([`crate::tune::start`]: cache, lock,
//!   screen, timings, decision, adoption), so that the mechanism runs and is timed on a
//!   machine with one GPU. They measure kernel cost on one GPU, not a fabric: the key says so
//!   ([`RankKind::Emulated`]), and the plan never takes such a tune's buckets.
//!
//! Screening and timing are the same code for both, for the all-reduce, the all-gather and
//! the reduce-scatter alike: every local rank's input uploaded and output poisoned and judged,
//! the same rounds on the set's origin stream, one figure for every local rank. What differs
//! is only [`Across`]: how the ranks' bytes meet (the control
//! plane, or one process that holds them all), how a call is issued and captured (a resolved
//! launch or NCCL on the rank's stream, or the set's own enqueue and capture across its
//! streams), how the stream is waited for (bounded, watching the peers, or the set's
//! synchronize), NCCL (joined for the tune, or never), and the probe.
//!
//! Owns: the tune's workspace and NCCL, the candidates it screens, the settings its key
//! carries. Must never: let the tune's failure poison the communicator, or know the
//! communicator (it gets a [`Setup`] of plain values); time NCCL on emulated ranks (NCCL
//! refuses several ranks on one GPU) or present their figures as a fabric's.

use super::abi;
use super::driver::{Device, DeviceBuffer, Event, Graph};
use super::launch::Launch;
use super::nccl::{self, NcclComm};
use super::probe_ipc;
use super::rank_set::{RankSet, SetOptions};
use crate::algorithms::registry::{algorithms_emulated, spec, Role, REGISTRY};
use crate::algorithms::Algorithm;
use crate::control::ControlPlane;
use crate::dtype::{by_dtype, DType, Element};
use crate::error::{Error, Result};
use crate::kinds::{Backend, CaptureMode, Collective, Transport};
use crate::plan::feasibility::{check, Fabric};
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{RankKind, TuneKey};
use crate::settings::{LaunchSettings, Settings};
use crate::topology::Topology;
use crate::tune::screen::{judge, ScreenCache};
use crate::tune::{self, step, Judged, Outcome, Ranks, Rounds, StartOptions, StartSpec, TunePlan};
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
    /// `TPAR_BLOCKS`: the communicator's `Overrides::blocks`.
    pub blocks: Option<u32>,
    pub check_calls: bool,
    pub island_word: u64,
    pub islands: Vec<Vec<usize>>,
    pub kind: RankKind,
    /// The plan's candidates that run on this fabric over `transport`.
    pub candidates: Vec<Algorithm>,
}

/// How the tune's ranks are placed: what differs between rank processes and emulated ranks.
enum Across<'a> {
    /// This process is one rank of several: bytes meet over the control plane, waits are
    /// bounded and watch the peers, NCCL is joined for the tune (`nccl`: `None` until
    /// [`Ranks::prepare`]).
    Processes { control: &'a mut ControlPlane, setup: Box<Setup>, nccl: Option<std::result::Result<NcclComm, String>>, nccl_seconds: f64 },
    /// Every rank is a stream of this process on one GPU: its bytes are everyone's, never NCCL.
    OneProcess,
}

/// The tune's rank set: the tune's own (rank processes) or the caller's (emulated ranks).
enum Set<'a> {
    Own(Box<RankSet>),
    Borrowed(&'a mut RankSet),
}

impl Set<'_> {
    fn get(&mut self) -> &mut RankSet {
        match self {
            Set::Own(s) => s,
            Set::Borrowed(s) => s,
        }
    }
}

/// What the tune allocates: the set, one input and output per local rank (each of the
/// largest call's bytes: an all-gather's output and a reduce-scatter's input are every rank's
/// parts together, a tensor the tune keeps within it), the timing events.
struct State<'a> {
    set: Set<'a>,
    inputs: Vec<DeviceBuffer>,
    outputs: Vec<DeviceBuffer>,
    start: Event,
    end: Event,
}

impl<'a> State<'a> {
    /// One input and output of `bytes` per local rank of `set`, and the timing events.
    fn new(mut set: Set<'a>, bytes: usize) -> Result<State<'a>> {
        let ws = set.get();
        let local = if ws.placement() == super::rank_set::RankPlacement::Emulated { ws.world() } else { 1 };
        let dev = ws.device().clone();
        let inputs = (0..local).map(|_| DeviceBuffer::new(&dev, bytes)).collect::<Result<Vec<_>>>()?;
        let outputs = (0..local).map(|_| DeviceBuffer::new(&dev, bytes)).collect::<Result<Vec<_>>>()?;
        Ok(State { set, inputs, outputs, start: Event::new(&dev)?, end: Event::new(&dev)? })
    }

    fn ws(&mut self) -> &mut RankSet {
        self.set.get()
    }

    fn ptrs(&self) -> (Vec<u64>, Vec<u64>) {
        (self.inputs.iter().map(|b| b.ptr).collect(), self.outputs.iter().map(|b| b.ptr).collect())
    }

    /// Whether a call of `collective` of `count` elements per rank fits the buffers, or why not.
    fn fits(&self, collective: Collective, dtype: DType, count: usize, world: usize) -> Result<()> {
        let (ins, outs) = collective.io_elems(count, world);
        let (need_in, need_out) = (ins.saturating_mul(dtype.size()), outs.saturating_mul(dtype.size()));
        let have = |v: &[DeviceBuffer]| v.iter().map(|b| b.bytes).min().unwrap_or(0);
        if need_in > have(&self.inputs) || need_out > have(&self.outputs) {
            return Err(Error::invalid(
                "tune",
                format!("a {collective} of {count} elements per rank needs {need_in} B in and {need_out} B out; the tune's buffers hold {} B", have(&self.inputs).min(have(&self.outputs))),
            ));
        }
        Ok(())
    }
}

/// One call as the tune issues it (see [`TuneRanks::call_of`]).
enum Call {
    /// A kernel resolved once per shape (for its collective), launched on the rank's stream
    /// (rank processes).
    Resolved(Launch),
    /// The tune's NCCL computing the collective (rank processes).
    Nccl(Collective),
    /// The set's own enqueue of the collective, forked across its streams (emulated ranks).
    Enqueue(Collective, Algorithm),
}

/// The tune's ranks on a [`RankSet`] (see the module's contract).
pub struct TuneRanks<'a> {
    across: Across<'a>,
    world: usize,
    /// The global rank of each local rank, in the set's order.
    local: Vec<usize>,
    islands: Vec<Vec<usize>>,
    candidates: Vec<Algorithm>,
    /// `None` until [`Ranks::prepare`] (rank processes) or from the start (emulated ranks).
    state: Option<State<'a>>,
    screen: ScreenCache,
}

/// The islands a group's island word names (rank q's label in bits 4q..4q+3), in order of
/// their first rank; one island when the word is 0.
fn islands_of_word(word: u64, world: usize) -> Vec<Vec<usize>> {
    if word == 0 {
        return vec![(0..world).collect()];
    }
    let mut out: Vec<(u64, Vec<usize>)> = Vec::new();
    for q in 0..world {
        let label = (word >> (4 * q)) & 0xf;
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => v.push(q),
            None => out.push((label, vec![q])),
        }
    }
    out.into_iter().map(|(_, v)| v).collect()
}

impl<'a> TuneRanks<'a> {
    /// This rank process's tune: its workspace and NCCL are made in [`Ranks::prepare`].
    pub fn process(control: &'a mut ControlPlane, setup: Setup) -> TuneRanks<'a> {
        let (world, local, islands, candidates) = (setup.world, vec![setup.rank], setup.islands.clone(), setup.candidates.clone());
        TuneRanks { across: Across::Processes { control, setup: Box::new(setup), nccl: None, nccl_seconds: 0.0 }, world, local, islands, candidates, state: None, screen: ScreenCache::default() }
    }

    /// The emulated ranks of `g`, with buffers for calls of up to `max_bytes`.
    pub fn emulated(g: &'a mut RankSet, max_bytes: usize) -> Result<TuneRanks<'a>> {
        let (world, islands) = (g.world(), islands_of_word(g.island_word(), g.world()));
        let candidates = algorithms_emulated(g.transport()).into_iter().filter(|&a| spec(a).role == Role::Candidate).collect();
        let state = State::new(Set::Borrowed(g), max_bytes.max(16).div_ceil(16) * 16)?;
        Ok(TuneRanks { across: Across::OneProcess, world, local: (0..world).collect(), islands, candidates, state: Some(state), screen: ScreenCache::default() })
    }

    fn state(&mut self) -> Result<&mut State<'a>> {
        self.state.as_mut().ok_or_else(|| Error::invalid("tune", "the tune's workspace is not prepared"))
    }

    fn device_timeout(setup: &Setup) -> Duration {
        setup.timeout.min(TUNE_DEVICE_TIMEOUT)
    }

    /// Waits for the tune's calls. Rank processes: at most the device deadline and a grace;
    /// a peer that died, or NCCL stuck past it, is an error (the tune's NCCL is then aborted).
    /// Emulated ranks: the set's synchronize (its own device deadline).
    fn wait(&mut self) -> Result<()> {
        let st = self.state.as_mut().ok_or_else(|| Error::invalid("tune", "the tune's workspace is not prepared"))?;
        let Across::Processes { control, setup, nccl, .. } = &mut self.across else {
            return st.ws().synchronize();
        };
        let allowed = Self::device_timeout(setup) + HOST_GRACE;
        let deadline = Instant::now() + allowed;
        let rank = setup.rank;
        let mut polls = 0u32;
        loop {
            if st.ws().stream().is_done()? {
                return st.ws().synchronize();
            }
            if Instant::now() >= deadline {
                if let Some(Ok(n)) = nccl {
                    n.abort();
                }
                st.ws().poison("the tune's stream did not finish in time".into());
                return Err(Error::Timeout { rank, waited_ms: allowed.as_millis() as u64, what: "the tune's GPU stream".into() });
            }
            polls = polls.saturating_add(1);
            if polls % 1024 == 0 {
                if let Some(peer) = control.dead_peer() {
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

    /// How calls of `algo` computing `collective` (`bytes` per rank) are issued here: rank
    /// processes resolve a kernel once per shape (or take the tune's NCCL); emulated ranks go
    /// through the set's enqueue.
    fn call_of(&mut self, collective: Collective, algo: Algorithm, dtype: DType, bytes: usize) -> Result<Call> {
        match self.across {
            Across::OneProcess => Ok(Call::Enqueue(collective, algo)),
            Across::Processes { .. } if algo == Algorithm::Nccl => Ok(Call::Nccl(collective)),
            Across::Processes { .. } if collective == Collective::AllReduce => Ok(Call::Resolved(self.state()?.ws().resolve(algo, dtype, bytes, 0)?)),
            Across::Processes { .. } => Ok(Call::Resolved(self.state()?.ws().resolve_collective(collective, algo, dtype, bytes, 0)?)),
        }
    }

    /// The descriptor a resolved call announces (`TPAR_CHECK_CALLS`; the set's enqueue
    /// makes its own): the collective's (`abi::collective_desc_code`, the all-reduce's is
    /// `abi::desc_code`).
    fn desc(&self, collective: Collective, algo: Algorithm, dtype: DType) -> u32 {
        match &self.across {
            Across::Processes { setup, .. } if setup.check_calls && algo != Algorithm::Nccl => abi::collective_desc_code(algo, dtype, collective),
            _ => 0,
        }
    }

    /// Enqueues one call on every local rank (asynchronous).
    fn issue(&mut self, call: &Call, desc: u32, dtype: DType, count: usize) -> Result<()> {
        let st = self.state.as_mut().ok_or_else(|| Error::invalid("tune", "the tune's workspace is not prepared"))?;
        let (i, o) = st.ptrs();
        match call {
            Call::Resolved(l) => st.ws().launch_resolved(l, desc, count, &i, &o),
            Call::Enqueue(collective, algo) => st.ws().enqueue_collective(*collective, *algo, dtype, count, &i, &o, 0),
            Call::Nccl(collective) => match &self.across {
                // SAFETY: the input and output buffers hold the call's `io_elems(count, world)`
                // elements (checked by `State::fits` before every screen and timing), are
                // separate allocations, and live until the stream is waited for; the stream
                // is the workspace's live stream on the NCCL communicator's device.
                Across::Processes { nccl: Some(Ok(n)), .. } => unsafe { n.collective_raw(*collective, i[0], o[0], count, dtype, st.ws().stream().raw as u64) },
                Across::Processes { nccl: Some(Err(why)), .. } => Err(Error::Unsupported { what: format!("timing {}", Algorithm::Nccl), reason: why.clone() }),
                _ => Err(Error::Unsupported { what: format!("timing {}", Algorithm::Nccl), reason: "no NCCL was joined for this tune".into() }),
            },
        }
    }

    /// `inner` calls captured into one graph, as engines capture: no per-call descriptor
    /// inside a graph. Rank processes capture on the rank's stream; emulated ranks through the
    /// set's capture (fork/join across its streams, calls checked across ranks).
    fn capture(&mut self, call: &Call, dtype: DType, count: usize, inner: usize) -> Result<Graph> {
        if let Call::Enqueue(collective, algo) = call {
            let st = self.state()?;
            let (i, o) = st.ptrs();
            return st.ws().capture(|g| (0..inner).try_for_each(|_| g.enqueue_collective(*collective, *algo, dtype, count, &i, &o, 0)));
        }
        self.state()?.ws().stream().begin_capture()?;
        let mut r = Ok(());
        for _ in 0..inner {
            r = r.and_then(|()| self.issue(call, 0, dtype, count));
        }
        let g = self.state()?.ws().stream().end_capture();
        r?;
        g
    }

    fn screen_t<T: Element + Send + 'static>(&mut self, collective: Collective, algo: Algorithm, count: usize, seed: u64) -> Result<Vec<Judged>> {
        let bytes = count * T::DTYPE.size();
        let world = self.world;
        let (ins, outs) = collective.io_elems(count, world);
        self.state()?.fits(collective, T::DTYPE, count, world)?;
        let set = self.screen.get::<T>(world, ins, seed)?;
        let st = self.state.as_mut().ok_or_else(|| Error::invalid("tune", "not prepared"))?;
        for (b, &r) in st.inputs.iter().zip(&self.local) {
            b.upload(&set.inputs[r])?;
        }
        for b in &st.outputs {
            b.fill_u32(POISON_WORD)?;
        }
        let call = self.call_of(collective, algo, T::DTYPE, bytes)?;
        let desc = self.desc(collective, algo, T::DTYPE);
        self.issue(&call, desc, T::DTYPE, count)?;
        self.wait()?;
        let set = self.screen.get::<T>(world, ins, seed)?;
        // What each local rank was promised (the reduce-scatter's slice is each rank's own).
        let promised: Vec<Vec<T>> = self.local.iter().map(|&r| set.promised_for(collective, algo, &self.islands, r, count).to_vec()).collect();
        let st = self.state()?;
        let mut out = vec![T::from_f32(0.0); outs];
        st.outputs
            .iter()
            .zip(&promised)
            .map(|(b, p)| {
                b.download(&mut out)?;
                Ok(judge(&out, p))
            })
            .collect()
    }

    fn time_op(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        let inner = rounds.inner.max(1);
        let world = self.world;
        self.state()?.fits(collective, dtype, count, world)?;
        for b in &self.state()?.inputs {
            b.fill_u32(TIMING_WORD)?;
        }
        let call = self.call_of(collective, algo, dtype, count * dtype.size())?;
        let desc = self.desc(collective, algo, dtype);
        let graph: Option<Graph> = match mode {
            CaptureMode::Eager => None,
            CaptureMode::Graph => Some(self.capture(&call, dtype, count, inner)?),
        };
        let mut times = Vec::with_capacity(rounds.iters);
        for k in 0..rounds.warmup + rounds.iters {
            self.sync()?;
            {
                let State { set, start, .. } = self.state()?;
                set.get().origin().record(start)?;
            }
            match &graph {
                Some(g) => self.state()?.ws().launch(g)?,
                None => {
                    for _ in 0..inner {
                        self.issue(&call, desc, dtype, count)?;
                    }
                }
            }
            {
                let State { set, end, .. } = self.state()?;
                set.get().origin().record(end)?;
            }
            self.wait()?;
            if k >= rounds.warmup {
                let st = self.state()?;
                times.push(f64::from(st.start.elapsed_ms(&st.end)?) * 1e3 / inner as f64);
            }
        }
        // The calls of every local rank are timed at once: the same figure stands for each.
        Ok(vec![times; self.local.len()])
    }

    /// Joins the tune's NCCL, or says why it does not (the same on every rank).
    fn join_nccl(&mut self) -> Result<std::result::Result<NcclComm, String>> {
        let joined = match &mut self.across {
            Across::OneProcess => return Ok(Err("emulated ranks share one GPU (NCCL refuses several ranks on one GPU)".into())),
            // Every rank must take this branch: the kind comes from the exchanged UUIDs.
            Across::Processes { setup, .. } if setup.kind == RankKind::SharedGpu => return Ok(Err("ranks share a GPU (NCCL refuses several ranks on one GPU)".into())),
            Across::Processes { control, setup, .. } => nccl::init_over_rendezvous(control, &setup.device),
        };
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

    /// A rank process's workspace of the tune's own, connected to its peers' (collective).
    fn prepare_process(&mut self) -> Result<()> {
        let Across::Processes { setup: s, .. } = &self.across else {
            return Ok(());
        };
        let opts = SetOptions { transport: s.transport, timeout: Self::device_timeout(s), check_calls: s.check_calls, islands: Vec::new(), host_protocol: s.host_protocol, launch: s.launch, blocks: s.blocks, wire: crate::kinds::Wire::Exact };
        let (max_bytes, island_word) = (s.max_bytes, s.island_word);
        let made = RankSet::process(s.device.ordinal, s.rank, s.world, s.max_bytes, s.job_id ^ TUNE_JOB_SALT, opts);
        let blob = made.as_ref().map_err(|e| Error::invalid("tune workspace", e.to_string())).and_then(|w| w.handle_blob());
        let blobs = step(self, blob)?;
        let mut ws = made?;
        let connected = ws.connect(&blobs);
        step(self, connected.map(|()| Vec::new()))?;
        ws.set_islands(island_word);
        let made = ws.all_attached().and_then(|()| State::new(Set::Own(Box::new(ws)), max_bytes));
        let said = made.as_ref().map(|_| Vec::new()).map_err(|e| Error::invalid("tune buffers", e.to_string()));
        step(self, said)?;
        let state = made?;
        let t0 = Instant::now();
        let joined = self.join_nccl()?;
        self.state = Some(state);
        if let Across::Processes { nccl, nccl_seconds, .. } = &mut self.across {
            *nccl = Some(joined);
            *nccl_seconds = t0.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

impl Ranks for TuneRanks<'_> {
    fn world(&self) -> usize {
        self.world
    }
    fn is_root(&self) -> bool {
        match &self.across {
            Across::Processes { setup, .. } => setup.rank == 0,
            Across::OneProcess => true,
        }
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match &mut self.across {
            Across::Processes { control, .. } => control.all_gather_bytes(mine),
            Across::OneProcess => Ok(vec![mine.to_vec()]),
        }
    }
    fn modes(&self) -> Vec<CaptureMode> {
        CaptureMode::ALL.to_vec()
    }
    fn candidates(&self) -> Vec<Algorithm> {
        self.candidates.clone()
    }
    fn nccl(&self) -> std::result::Result<(), String> {
        match &self.across {
            Across::Processes { nccl: Some(Ok(_)), .. } => Ok(()),
            Across::Processes { nccl: Some(Err(why)), .. } => Err(why.clone()),
            Across::Processes { nccl: None, .. } => Err("the tune did not start".into()),
            Across::OneProcess => Err("emulated ranks share one GPU (NCCL refuses several ranks on one GPU)".into()),
        }
    }
    fn nccl_join_seconds(&self) -> f64 {
        match &self.across {
            Across::Processes { nccl_seconds, .. } => *nccl_seconds,
            Across::OneProcess => 0.0,
        }
    }
    fn prepare(&mut self) -> Result<()> {
        self.prepare_process()
    }
    fn screen_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Vec<Judged>> {
        by_dtype!(dtype, T => self.screen_t::<T>(collective, algo, count, seed))
    }
    fn time_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        self.time_op(collective, algo, dtype, count, mode, rounds)
    }
    /// Rank processes: the links between the ranks' GPUs through CUDA IPC. Emulated ranks:
    /// the one GPU against its own memory and host memory (GPUs 0 to the group's ordinal, as
    /// `tpar topo --probe` runs it): a test of the probe, not a fabric.
    fn probe(&mut self) -> Result<Option<crate::topology::probe::Probe>> {
        match &self.across {
            Across::Processes { setup, .. } => {
                let (device, me, p2p) = (setup.device.clone(), setup.rank, setup.transport == Transport::P2p);
                probe_ipc::probe_links(self, &device, me, p2p, &probe_ipc::FIRST_USE_PROBE).map(Some)
            }
            Across::OneProcess => {
                let ordinal = self.state()?.ws().device().ordinal;
                super::probe::run(Some(ordinal + 1), &super::probe::ProbeOptions::default()).map(Some)
            }
        }
    }
    fn settle(&mut self) {
        if matches!(self.across, Across::Processes { .. }) && self.state.is_some() {
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
    if let Some(b) = overrides.blocks {
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

/// The key of emulated ranks of `g` on this machine.
pub fn emulated_key(g: &RankSet, topology: &Topology, settings: &Settings) -> Result<TuneKey> {
    let uuid = g.device().uuid()?;
    Ok(TuneKey {
        tpar_version: TuneKey::this_version(),
        cuda_driver: super::driver::driver_version(),
        driver_version: crate::topology::nvml::driver_version(),
        backend: Backend::Cuda,
        ranks: RankKind::Emulated,
        world: g.world(),
        devices: vec![uuid; g.world()],
        topology_hash: format!("{:016x}", topology.hash()),
        transport: g.transport(),
        settings: timing_settings(&settings.overrides, &settings.launch, g.transport()),
    })
}

/// A start of emulated ranks, as a communicator's start runs it (`opts`: `TPAR_TUNE`, the
/// cache, the budget: by default the first-use one). `settings` gives the timeout and the
/// settings that change timings.
pub fn start_emulated(g: &mut RankSet, max_bytes: usize, settings: &Settings, opts: StartOptions) -> Result<Outcome> {
    let topology = Topology::discover();
    let key = emulated_key(g, &topology, settings)?;
    let world = g.world();
    let fingerprint = |m| ProfileFingerprint::new(&topology, None, Backend::Cuda, world, m);
    let never_nccl = |_, _, _| false;
    let timeout = settings.job.timeout.unwrap_or(crate::settings::DEFAULT_TIMEOUT);
    let spec = StartSpec {
        tune: opts.tune,
        skip: None,
        cache: opts.cache,
        key,
        max_bytes: max_bytes as u64,
        plan: opts.plan.unwrap_or_else(|| TunePlan::first_use(max_bytes as u64, RankKind::Emulated, &CaptureMode::ALL)),
        lock_wait: tune::LOCK_WAIT_MAX.min(timeout / 2),
        fingerprint: &fingerprint,
        default_is_nccl: &never_nccl,
    };
    let mut r = TuneRanks::emulated(g, max_bytes)?;
    tune::start(&mut r, &spec)
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

    #[test]
    fn an_island_word_reads_back_as_islands() {
        let isl = crate::algorithms::hierarchical::from_sizes(&[3, 5]);
        let word = crate::algorithms::hierarchical::island_word(&isl, 8).unwrap();
        assert_eq!(islands_of_word(word, 8), vec![vec![0, 1, 2], vec![3, 4, 5, 6, 7]]);
        assert_eq!(islands_of_word(0, 3), vec![vec![0, 1, 2]]);
    }
}
