//! The public [`CpuCommunicator`]: join a job, then all-reduce.
//!
//! Owns: the per-call chunk loop, the bounded waiter, poisoning (how a rank joins:
//! `crate::config`). Every call either reduces correctly or returns an error; after
//! an error that leaves peers in an unknown state the communicator is poisoned, raises the
//! shared abort flag so peers fail fast, and refuses further calls with the original cause.
//! Must never panic, hang past the timeout, or leave shared memory behind.

use crate::algorithms::{run_chunk, run_gather_scatter, Algorithm, Call};
use crate::kinds::Collective;
use crate::plan::{plan_fingerprint, Backend, CaptureMode, Overrides, PlanInput};
use crate::plan::profile::{Profile, ProfileFingerprint};
use crate::topology::Topology;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::protocol::{Desc, Phase, Wait, Word, MAX_COUNT};
use crate::control::ControlPlane;
use crate::rendezvous::JoinSpec;
pub mod shm_workspace;
use shm_workspace::ShmWorkspace;
use crate::transport::shm::ShmSegment;
use crate::workspace::{hdr, st, Layout, Workspace};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::config::{Config, DEFAULT_SHM_BYTES, DEFAULT_TIMEOUT};
mod futex;
/// Polls per pause when ranks outnumber cores: the peer a wait waits for may need this very
/// core, so a wait yields after a few polls instead of `protocol::SPINS_PER_PAUSE`.
const OVERSUBSCRIBED_SPINS: u32 = 4;
/// A wait this long has outlasted a time slice: its peer is not running (descheduled behind
/// another process, or waiting for this very core), and spinning on only keeps a core from
/// it. The wait sleeps from here on. Not sooner: a sleeper's wake-up waits for a core, and
/// on cores busy with other processes that is up to their time slice, where a polling
/// wait, still runnable, keeps its turn (measured: sleeping after 100 us of a wait once
/// contention had been seen made 8-byte calls whose peer was 50 us late take milliseconds).
const SLICE: Duration = Duration::from_millis(1);
/// A wait whose peer runs on another core yields only every this many pauses (tens of
/// microseconds): a yield hands this core to whatever else wants it, a process beside the
/// job included, and costs the wait a context switch (8-byte calls with one busy process
/// beside the job: 4.5 us yielding at every pause, 0.5 us spinning). The rare yield still
/// lets a peer that shares this core unnoticed (it has not paused here yet) run.
const YIELD_EVERY: u32 = 16;
/// At most one move off a shared core per this period. The scheduler puts the ranks together
/// again each time they block on the control plane between calls (a benchmark does between
/// sizes), so the period is short; a move costs one migration.
const MOVE_PERIOD: Duration = Duration::from_millis(1);
/// How often a waiter checks that the peer it waits for is alive.
const LIVENESS_PERIOD: Duration = Duration::from_millis(2);

/// How this rank's waits went: how often one slept in the kernel, woke a sleeping peer, or
/// moved off a peer's core. For tests and diagnostics ([`CpuCommunicator::wait_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Futex waits this rank slept in (each up to the liveness period or the deadline).
    pub sleeps: u64,
    /// Futex wake-ups this rank sent after its stores (a peer had announced it slept).
    pub wakes: u64,
    /// Pauses that found the awaited peer last paused on this rank's core.
    pub shared_core: u64,
    /// Times this rank moved itself off the core of the peer it waited for.
    pub moves: u64,
}

/// What a rank's waits have learnt, kept across calls.
#[derive(Debug)]
struct WaitState {
    /// More ranks than cores: a spinning rank would hold the core its peer needs, so every
    /// wait yields after [`OVERSUBSCRIBED_SPINS`] polls.
    oversubscribed: bool,
    /// The peer the last pause waited for had last paused on this very core: it needs the
    /// core that spinning holds, so waits yield after [`OVERSUBSCRIBED_SPINS`] polls (kept
    /// across calls: the next call's first wait would otherwise spin a full round first).
    shares_core: bool,
    /// When this rank last moved itself off a peer's core (at most once per [`MOVE_PERIOD`]).
    moved_at: Option<Instant>,
    stats: WaitStats,
}

/// The bounded waiter behind every spin of the CPU backend.
///
/// A wait spins [`crate::protocol::SPINS_PER_PAUSE`] polls, then pauses: it polls on,
/// yielding the core every [`YIELD_EVERY`] pauses (at every pause, after fewer polls, where
/// its peer shares its core, which the higher rank then leaves, or where ranks outnumber
/// cores), and sleeps in a futex wait on the workspace's doorbell once the wait has outlasted
/// a time slice. Every pause
/// first checks the deadline, the abort flag and (each [`LIVENESS_PERIOD`]) the peer's
/// liveness, and a sleep never outlasts the next of those checks.
struct Spinner<'a> {
    rank: usize,
    ws: &'a Workspace<'a, AtomicU64>,
    control: &'a ControlPlane,
    desc: Desc,
    start: Instant,
    timeout: Duration,
    /// When the next liveness check is due (one [`LIVENESS_PERIOD`] after the last).
    next_liveness: Option<Instant>,
    suspect: Option<usize>,
    /// When the current wait paused first (its round 0).
    wait_start: Instant,
    state: &'a mut WaitState,
}

impl Spinner<'_> {
    fn describe(&self, peer: usize, phase: Phase) -> String {
        let s = self.ws.status(peer);
        let peer_desc = s[st::DESC].load_acquire();
        let peer_epoch = s[st::EPOCH].load_acquire() as u32;
        let theirs = if peer_desc == 0 {
            "rank {peer} has not entered any call".replace("{peer}", &peer.to_string())
        } else {
            let alg = Algorithm::from_code((peer_desc >> 16) & 0xf).map_or("?", |a| a.name());
            format!(
                "rank {peer} last entered call epoch {peer_epoch} ({alg}, count {})",
                peer_desc >> 22
            )
        };
        format!(
            "rank {peer}'s {phase} in call epoch {} ({}, {}, count {}); {theirs}",
            self.desc.epoch, self.desc.algorithm, self.desc.dtype, self.desc.count
        )
    }

    /// Sleeps on the doorbell until a writer rings it or `until` (the next check) comes.
    /// The announcement (the sleepers count) comes before the last look at the awaited word,
    /// and a writer reads the count after its stores, both behind a full fence: either this
    /// look sees the store, or the writer sees the count and rings (see `published`).
    fn sleep(&mut self, ready: &dyn Fn() -> bool, now: Instant, until: Instant) {
        let h = self.ws.header();
        let (sleepers, bell) = (&h[hdr::SLEEPERS], &h[hdr::DOORBELL]);
        sleepers.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let seq = bell.load(Ordering::Acquire) as u32;
        if !ready() {
            self.state.stats.sleeps += 1;
            futex::wait(bell, seq, until.saturating_duration_since(now).max(Duration::from_micros(1)));
        }
        sleepers.fetch_sub(1, Ordering::Release);
    }
}

impl Wait for Spinner<'_> {
    fn pause(&mut self, peer: usize, phase: Phase, round: u32, ready: &dyn Fn() -> bool) -> Result<()> {
        if self.suspect == Some(peer) {
            // The peer's lock was gone and a poll after that still found nothing.
            return Err(Error::PeerDied {
                rank: self.rank,
                peer,
                during: self.describe(peer, phase),
            });
        }
        let abort = self.ws.header()[hdr::ABORT].load_acquire();
        if abort != 0 && abort != self.rank as u64 + 1 {
            return Err(Error::Aborted {
                rank: self.rank,
                by: abort as usize - 1,
            });
        }
        let now = Instant::now();
        let waited = now.duration_since(self.start);
        if waited >= self.timeout {
            return Err(Error::Timeout {
                rank: self.rank,
                waited_ms: waited.as_millis().min(u64::MAX as u128) as u64,
                what: self.describe(peer, phase),
            });
        }
        let next_check = match self.next_liveness {
            Some(t) if now < t => t,
            _ => {
                if !self.control.is_alive(peer) {
                    self.suspect = Some(peer);
                }
                now + LIVENESS_PERIOD
            }
        };
        self.next_liveness = Some(next_check);
        if round == 0 {
            self.wait_start = now;
        }
        let cpu = cpu_word();
        let (mine, theirs) = (&self.ws.status(self.rank)[st::CPU], &self.ws.status(peer)[st::CPU]);
        if mine.load(Ordering::Relaxed) != cpu {
            mine.store(cpu, Ordering::Relaxed);
        }
        self.state.shares_core = cpu != 0 && theirs.load(Ordering::Relaxed) == cpu;
        self.state.stats.shared_core += u64::from(self.state.shares_core);
        // Two ranks on one core while another core is allowed: every wait costs a context
        // switch (a few microseconds) where ranks on two cores answer in a fraction of one.
        // The higher rank of the pair moves (both moving would swap them), unless ranks
        // outnumber cores (sharing is then certain) or it moved a moment ago.
        if self.state.shares_core && self.rank > peer && !self.state.oversubscribed && !self.state.moved_at.is_some_and(|t| now.duration_since(t) < MOVE_PERIOD) {
            self.state.moved_at = Some(now);
            if futex::move_off(cpu as usize - 1) {
                self.state.stats.moves += 1;
                self.state.shares_core = false;
                mine.store(cpu_word(), Ordering::Relaxed);
            }
        }
        if now.duration_since(self.wait_start) >= SLICE {
            let deadline = self.start + self.timeout;
            self.sleep(ready, now, next_check.min(deadline));
        } else if self.state.oversubscribed || self.state.shares_core || round % YIELD_EVERY == YIELD_EVERY - 1 {
            std::thread::yield_now();
        }
        Ok(())
    }

    fn spins_per_pause(&self) -> u32 {
        if self.state.oversubscribed || self.state.shares_core {
            OVERSUBSCRIBED_SPINS
        } else {
            crate::protocol::SPINS_PER_PAUSE
        }
    }

    fn published(&mut self) {
        // Pairs with the fence in `sleep`: the stores before it, then the count after it.
        std::sync::atomic::fence(Ordering::SeqCst);
        let h = self.ws.header();
        if h[hdr::SLEEPERS].load(Ordering::Relaxed) != 0 {
            h[hdr::DOORBELL].fetch_add(1, Ordering::Release);
            futex::wake_all(&h[hdr::DOORBELL]);
            self.state.stats.wakes += 1;
        }
    }
}

/// The core this thread runs on as a status word publishes it: the core's number plus one, or
/// 0 where it cannot be told.
fn cpu_word() -> u64 {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu >= 0 { cpu as u64 + 1 } else { 0 }
}

/// Elements per epoch for a call of `n` elements of `T` with `algo`, the same on every rank
/// (a function of the call and the layout only). Large calls run in steps of
/// `plan::floors::CPU_STEP_BYTES` so that what a peer wrote is read while it is still in
/// cache, and the two parity buffers let one step's writes overlap the previous step's
/// reads; never more than the workspace's chunk capacity.
fn chunk_elems<T: Element>(algo: Algorithm, n: usize, cap_words: usize) -> usize {
    let cap = cap_words * T::LANES;
    let step = match algo {
        Algorithm::TwoshotPush | Algorithm::TwoshotPull | Algorithm::OneshotPush | Algorithm::OneshotPull => {
            (crate::plan::floors::CPU_STEP_BYTES as usize / std::mem::size_of::<T>()).max(1)
        }
        _ => cap,
    };
    if n <= cap && n <= 2 * step {
        // One epoch when it fits and is not much larger than a step (saves a round).
        return n.max(1);
    }
    step.min(cap)
}

/// The first `n` elements of `scratch` (u64 words) as `T`.
fn as_elems_mut<T: Element>(scratch: &mut [u64], n: usize) -> &mut [T] {
    let n = n.min(scratch.len() * T::LANES);
    // SAFETY: `scratch` owns `scratch.len() * 8` bytes, at least `n * size_of::<T>()`,
    // 8-byte aligned (more than any `T` needs); every bit pattern is a valid f32/f16/bf16;
    // the result borrows `scratch` mutably, so nothing else aliases it.
    unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut T, n) }
}

/// What the plan needs, fixed at init and identical on every rank (checked at rendezvous).
struct Dispatch {
    topology: Topology,
    profile: Option<Profile>,
    overrides: Overrides,
    /// Decisions already made, by (dtype, bytes): planning formats a reason, which has no
    /// place on the hot path.
    cache: crate::plan::cache::PlanCache,
}


/// A member of an all-reduce group on the CPU shared-memory backend.
pub struct CpuCommunicator {
    dispatch: Dispatch,
    rank: usize,
    world: usize,
    layout: Layout,
    shm: ShmSegment,
    control: ControlPlane,
    epoch: u32,
    timeout: Duration,
    poisoned: Option<String>,
    scratch: Vec<u64>,
    /// What waits have learnt across calls (ranks outnumber cores, contention seen).
    waits: WaitState,
}

impl std::fmt::Debug for CpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCommunicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("epoch", &self.epoch)
            .field("chunk_words", &self.layout.cap)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl CpuCommunicator {
    /// Joins the job: rendezvous, shared workspace, liveness lock.
    pub fn init(cfg: &Config) -> Result<CpuCommunicator> {
        cfg.validate()?;
        let topology = Topology::cpu();
        // A forced algorithm or transport that cannot run here is an error now, not a
        // silent fallback or a hang later.
        cfg.overrides.validate(&topology, cfg.world, Backend::Cpu)?;
        let profile = match &cfg.overrides.profile {
            Some(path) => {
                let p = Profile::load(path)?;
                let here = ProfileFingerprint::new(&topology, None, Backend::Cpu, cfg.world, CaptureMode::Eager);
                p.warn_if_mismatched(&here);
                Some(p)
            }
            None => None,
        };
        let digest = plan_fingerprint(&topology, profile.as_ref(), &cfg.overrides);
        let (control, joined) = ControlPlane::join::<ShmWorkspace>(&JoinSpec { fingerprint: digest ^ cfg.fingerprint, ..cfg.join_spec() })?;
        let ws = Workspace::new(joined.layout, joined.shm.words())?;
        ws.status(cfg.rank)[st::PID].store_relaxed(std::process::id() as u64);
        // A chunk's worth of scratch: the layout is bounded (`MAX_WORKSPACE_BYTES`), and a
        // failed allocation is an error, not an abort.
        let mut scratch = Vec::new();
        scratch
            .try_reserve_exact(joined.layout.cap)
            .map_err(|e| Error::invalid("workspace", format!("{} words of scratch: {e}", joined.layout.cap)))?;
        scratch.resize(joined.layout.cap, 0);
        Ok(CpuCommunicator {
            dispatch: Dispatch {
                topology,
                profile,
                overrides: cfg.overrides.clone(),
                cache: crate::plan::cache::PlanCache::default(),
            },
            rank: cfg.rank,
            world: cfg.world,
            layout: joined.layout,
            scratch,
            shm: joined.shm,
            control,
            epoch: joined.first_epoch,
            timeout: cfg.timeout,
            poisoned: None,
            waits: WaitState {
                oversubscribed: std::thread::available_parallelism().map_or(true, |c| cfg.world > c.get()),
                shares_core: false,
                moved_at: None,
                stats: WaitStats::default(),
            },
        })
    }

    /// Joins the job described by the environment (see [`Config::from_env`]).
    pub fn from_env() -> Result<CpuCommunicator> {
        CpuCommunicator::init(&Config::from_env()?)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The bound on every wait (`Config::timeout`).
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// How this rank's waits have gone so far: kernel sleeps, wake-ups sent, contention seen.
    pub fn wait_stats(&self) -> WaitStats {
        self.waits.stats
    }

    /// The workspace layout (chunk capacity in words, sizes).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The epoch the next call will use.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether an earlier error poisoned this communicator.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// The algorithm the plan picks for `bytes` of `dtype` on this communicator.
    pub fn planned(&mut self, dtype: crate::dtype::DType, bytes: usize) -> Algorithm {
        self.planned_for(Collective::AllReduce, dtype, bytes)
    }

    /// The algorithm the plan picks for `collective` of `bytes` per rank (as
    /// [`Collective::io_elems`] counts them) of `dtype`.
    pub fn planned_for(&mut self, collective: Collective, dtype: crate::dtype::DType, bytes: usize) -> Algorithm {
        let d = &mut self.dispatch;
        let input = PlanInput {
            topology: &d.topology,
            world: self.world,
            bytes: bytes as u64,
            dtype,
            capture: CaptureMode::Eager,
            backend: Backend::Cpu,
            profile: d.profile.as_ref(),
            overrides: &d.overrides,
        };
        d.cache.get_for(collective, &input).algorithm
    }

    /// Every rank's `input`, concatenated in rank order, into `output` (`world x
    /// input.len()` elements; rank q's at `q * input.len()`): torch.distributed's
    /// `all_gather_into_tensor`. A bitwise copy; the algorithm the plan picks.
    pub fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        self.collective(Collective::AllGather, None, input, output)
    }

    /// Rank q's share of the rank-order sum: elements `q * n .. (q + 1) * n` of every rank's
    /// `input` (`world x n` elements) summed into `output` (`n` elements):
    /// torch.distributed's `reduce_scatter_tensor`. Bitwise the same as slice q of the
    /// all-reduce of the inputs; the algorithm the plan picks.
    pub fn reduce_scatter<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        self.collective(Collective::ReduceScatter, None, input, output)
    }

    /// One call of `collective` with `algo` (`None`: the plan's pick for it). The sizes are
    /// [`Collective::io_elems`]'s; a rank whose sizes or collective differ from a peer's gets
    /// [`Error::Mismatch`], as for the all-reduce.
    pub fn collective<T: Element>(&mut self, collective: Collective, algo: Option<Algorithm>, input: &[T], output: &mut [T]) -> Result<()> {
        let n = collective.per_rank(input.len(), output.len(), self.world).map_err(|why| Error::invalid("output", why))?;
        let algo = match algo {
            Some(a) => a,
            None => self.planned_for(collective, T::DTYPE, n * std::mem::size_of::<T>()),
        };
        match collective {
            Collective::AllReduce => self.execute(algo, Some(input), output),
            _ => self.execute_gather_scatter(collective, algo, input, output),
        }
    }

    /// Sums `input` over all ranks into `output`, with the algorithm the plan picks.
    pub fn all_reduce<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        let algo = self.planned(T::DTYPE, std::mem::size_of_val(input));
        self.execute(algo, Some(input), output)
    }

    /// Sums `input` over all ranks into `output` with `algo`.
    pub fn all_reduce_with<T: Element>(&mut self, algo: Algorithm, input: &[T], output: &mut [T]) -> Result<()> {
        self.execute(algo, Some(input), output)
    }

    /// Sums `buf` over all ranks, in place.
    pub fn all_reduce_in_place<T: Element>(&mut self, algo: Option<Algorithm>, buf: &mut [T]) -> Result<()> {
        let algo = match algo {
            Some(a) => a,
            None => self.planned(T::DTYPE, std::mem::size_of_val(buf)),
        };
        self.execute(algo, None, buf)
    }

    /// Waits until every rank has reached this point (an empty all-reduce: every rank
    /// exchanges a call descriptor with every other).
    /// A peer whose process no longer holds its liveness lock (it exited or was killed), if
    /// any. Cheap (one `fcntl` per peer); for callers that wait on something else, such as
    /// a GPU stream.
    pub fn dead_peer(&self) -> Option<usize> {
        self.control.dead_peer()
    }

    pub fn barrier(&mut self) -> Result<()> {
        self.execute::<f32>(Algorithm::OneshotPush, Some(&[]), &mut [])
    }

    /// Control plane: rank 0 receives every rank's bytes (in rank order); others get `None`.
    pub fn gather_bytes(&mut self, payload: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.usable()?;
        self.control.gather_bytes(payload)
    }

    /// Control plane: every rank receives every rank's bytes, in rank order (e.g. CUDA IPC
    /// handles, an NCCL unique id's acknowledgements).
    pub fn all_gather_bytes(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.usable()?;
        self.control.all_gather_bytes(payload)
    }

    /// Control plane: every rank receives rank 0's bytes.
    pub fn broadcast_bytes(&mut self, payload: &[u8]) -> Result<Vec<u8>> {
        self.usable()?;
        self.control.broadcast_bytes(payload)
    }

    fn usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(cause) => Err(Error::Poisoned {
                rank: self.rank,
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: &Error) {
        if e.poisons() {
            self.poisoned = Some(e.to_string());
            if let Ok(ws) = Workspace::new(self.layout, self.shm.words()) {
                let _ = ws.header()[hdr::ABORT].compare_exchange(0, self.rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    fn execute<T: Element>(&mut self, algo: Algorithm, input: Option<&[T]>, output: &mut [T]) -> Result<()> {
        self.usable()?;
        let n = output.len();
        if let Some(i) = input {
            if i.len() != n {
                return Err(Error::invalid(
                    "output",
                    format!("output holds {n} elements but input holds {}", i.len()),
                ));
            }
        }
        if n as u64 > MAX_COUNT {
            return Err(Error::invalid("count", format!("{n} elements exceeds {MAX_COUNT}")));
        }
        crate::algorithms::registry::runnable(algo, Backend::Cpu, crate::kinds::Transport::Shm)
            .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
        let chunk = chunk_elems::<T>(algo, n, self.layout.cap);
        let chunks = n.div_ceil(chunk).max(1);
        for c in 0..chunks {
            let (a, b) = (c * chunk, ((c + 1) * chunk).min(n));
            let out = &mut output[a..b];
            let src: &[T] = match input {
                Some(i) => &i[a..b],
                None => {
                    // In place: the algorithms read my input while writing my output, so
                    // the chunk's input is copied aside first (into cache-resident scratch).
                    let s = as_elems_mut::<T>(&mut self.scratch, b - a);
                    s.copy_from_slice(out);
                    s
                }
            };
            let (ws, control) = (Workspace::new(self.layout, self.shm.words())?, &self.control);
            let r = Self::step(self.rank, self.timeout, &mut self.waits, (&ws, control), Desc { epoch: self.epoch, algorithm: algo, dtype: T::DTYPE, collective: Collective::AllReduce, count: n as u64 }, |call| {
                run_chunk(algo, call, src, out)
            });
            self.epoch = self.epoch.wrapping_add(1);
            if let Err(e) = r {
                self.fail(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// An all-gather or a reduce-scatter with `algo`, in chunks of at most a step (as the
    /// all-reduce): chunk [a, b) of the per-rank count `n` in each epoch.
    fn execute_gather_scatter<T: Element>(&mut self, collective: Collective, algo: Algorithm, input: &[T], output: &mut [T]) -> Result<()> {
        self.usable()?;
        let n = collective.per_rank(input.len(), output.len(), self.world).map_err(|why| Error::invalid("output", why))?;
        if n as u64 > MAX_COUNT {
            return Err(Error::invalid("count", format!("{n} elements exceeds {MAX_COUNT}")));
        }
        crate::algorithms::registry::computes(algo, collective).map_err(|reason| Error::Unsupported { what: format!("{collective} with {algo}"), reason })?;
        crate::algorithms::registry::runnable(algo, Backend::Cpu, crate::kinds::Transport::Shm)
            .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
        // One-shot pull's reduce-scatter exposes a piece for every rank: chunks of a world's share.
        let cap = if algo == Algorithm::OneshotPull { crate::algorithms::oneshot_pull::exposed_elems(collective, self.layout.cap * T::LANES, self.world, T::LANES) / T::LANES } else { self.layout.cap };
        let chunk = chunk_elems::<T>(algo, n, cap.max(1));
        let chunks = n.div_ceil(chunk).max(1);
        for c in 0..chunks {
            let (a, b) = (c * chunk, ((c + 1) * chunk).min(n));
            let (ws, control) = (Workspace::new(self.layout, self.shm.words())?, &self.control);
            let desc = Desc { epoch: self.epoch, algorithm: algo, dtype: T::DTYPE, collective, count: n as u64 };
            let r = Self::step(self.rank, self.timeout, &mut self.waits, (&ws, control), desc, |call| match collective {
                Collective::ReduceScatter => run_gather_scatter(collective, algo, call, (input, &mut output[a..b]), (n, a)),
                _ => run_gather_scatter(collective, algo, call, (&input[a..b], output), (n, a)),
            });
            self.epoch = self.epoch.wrapping_add(1);
            if let Err(e) = r {
                self.fail(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// One epoch of a call: states `desc` in my status words, then runs `body` with the
    /// bounded waiter every spin goes through.
    fn step(
        rank: usize,
        timeout: Duration,
        waits: &mut WaitState,
        (ws, control): (&Workspace<'_, AtomicU64>, &ControlPlane),
        desc: Desc,
        body: impl FnOnce(&mut Call<'_, '_, AtomicU64, Spinner<'_>>) -> Result<()>,
    ) -> Result<()> {
        let status = ws.status(rank);
        status[st::EPOCH].store_relaxed(desc.epoch as u64);
        status[st::DESC].store_relaxed(desc.encode());
        let start = Instant::now();
        let mut spinner = Spinner {
            rank,
            ws,
            control,
            desc,
            start,
            timeout,
            // The first check comes one period into the epoch, not at its first pause: a
            // check reads /proc (tens of microseconds on a busy machine), and a peer a few
            // microseconds late would otherwise cost every call that much.
            next_liveness: Some(start + LIVENESS_PERIOD),
            suspect: None,
            wait_start: start,
            state: waits,
        };
        let mut call = Call { ws, rank, desc, waiter: &mut spinner };
        body(&mut call)
    }
}
