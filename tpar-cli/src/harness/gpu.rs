//! GPU ranks, placed either way the library places them: one rank process per GPU (this
//! process is one rank of a [`tpar::cuda::GpuCommunicator`], the way inference engines run
//! tensor parallelism: rank r takes GPU r, or, for correctness tests on one GPU, every rank
//! GPU 0 planning for another topology), or every rank emulated as a stream of one GPU in
//! this process (a [`tpar::cuda::RankSet::emulated`]: they prove correctness and kernel cost,
//! not interconnect behaviour).
//!
//! One type drives both: the same buffers (one pair per local rank), the same check (upload,
//! poison, one library [`Call`], synchronise, download, one verifier) and the same timing
//! loop (events on the stream that carries the collective, eager or one captured graph).
//! What differs is where the call goes ([`GpuRanks::call`]: the communicator's `call` or
//! the set's, with the same `Call`), how ranks agree (the control plane, or nothing: every
//! rank is here), and what only one placement has (the plan and NCCL; the launch floor,
//! islands and stamps of emulation). Rank 0 prints; other rank processes send what they
//! measured over tpar's control plane.

use super::verify::{Judge, Outcome, Verdict};
use super::{launch, Io, Timing};
use std::time::{Duration, Instant};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{Device, DeviceBuffer, Event, Graph, Stream};
use tpar::cuda::{Call, GpuCommunicator, GpuOptions, RankSet, Served, SetOptions};
use tpar::plan::CaptureMode;
use tpar::testing::all_inputs;
use tpar::units::{percentiles, Spread};
use tpar::{Algorithm, Collective, DType, Element, Transport};

pub use super::verify::{err, POISON_WORD, TIMING_WORD};

/// Launches `world` rank processes of this command. Unless `shared` (a correctness test on
/// one GPU), refuses more ranks than GPUs: processes sharing a GPU measure time-slicing.
pub fn launch_ranks(world: usize, grace: Duration, shared: bool) -> Result<(), String> {
    let gpus = super::gpu_count();
    if world > gpus && !shared {
        return Err(format!("--world {world}: this machine has {gpus} GPU(s); tpar runs one rank process per GPU"));
    }
    launch::launch(world, grace)
}

/// A local rank's input and output buffers.
pub struct RankBufs {
    pub input: DeviceBuffer,
    pub output: DeviceBuffer,
}

/// `n` pairs of buffers of `bytes` (rounded up to whole vectors) on `dev`.
pub fn rank_bufs(dev: &Device, n: usize, bytes: usize) -> Result<Vec<RankBufs>, String> {
    let b = bytes.max(VEC_BYTES).div_ceil(VEC_BYTES) * VEC_BYTES;
    (0..n).map(|_| Ok(RankBufs { input: DeviceBuffer::new(dev, b).map_err(err)?, output: DeviceBuffer::new(dev, b).map_err(err)? })).collect()
}

/// Every local rank's input and output pointers.
pub fn ptrs(bufs: &[RankBufs]) -> (Vec<u64>, Vec<u64>) {
    (bufs.iter().map(|b| b.input.ptr).collect(), bufs.iter().map(|b| b.output.ptr).collect())
}

/// Where the ranks are: the library object that runs their calls, and what only that
/// placement keeps. (One per run, never copied about: its variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Place {
    /// This process is one rank of a group of processes.
    Process {
        comm: GpuCommunicator,
        /// A stream of "the caller's" ([`Io::CallerStream`]) and the buffer its copy reads from.
        caller: Stream,
        stage: DeviceBuffer,
        /// Every rank on GPU 0, planning for this topology (a correctness test).
        shared: Option<String>,
        /// The job id (host segment names carry it).
        job: u64,
    },
    /// Every rank, as a stream of one GPU of this process.
    Emulated {
        set: RankSet,
        /// The islands `hierarchical` reduces over, normalised (for the verifier).
        islands: Vec<Vec<usize>>,
    },
}

/// GPU ranks of either placement, with a pair of buffers per local rank as large as the
/// largest call, and timing events.
pub struct GpuRanks {
    pub place: Place,
    /// One pair per local rank: this rank's (rank processes), every rank's (emulated).
    pub bufs: Vec<RankBufs>,
    start: Event,
    end: Event,
    max_bytes: usize,
    /// Where the checked calls' time went, summed over them (see [`Phases`]).
    phases: Phases,
}

/// Host time of checked calls by phase, summed: what `tpar check` spends besides the
/// kernels, printed with its verdict (emulated ranks) so that a slow run shows where its
/// time went.
#[derive(Default)]
struct Phases {
    calls: u64,
    /// Generating every rank's inputs.
    inputs: Duration,
    /// Uploading inputs and poisoning outputs (each copy and fill synchronises).
    copies: Duration,
    /// The call: enqueue on every local rank, then synchronise.
    run: Duration,
    /// Downloading every local rank's output.
    download: Duration,
    /// The references (once per call) and judging every local rank's output.
    judge: Duration,
}

/// Group options of emulated ranks from the environment (`SetOptions::from_env`:
/// `TPAR_TIMEOUT_MS`, `TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL`).
pub fn options(transport: Transport) -> Result<SetOptions, String> {
    SetOptions::from_env(transport).map_err(err)
}

impl GpuRanks {
    /// Joins as one rank process on GPU `rank` with the discovered topology, or, with
    /// `shared`, on GPU 0 planning for that topology instead (correctness tests of several
    /// processes on one GPU).
    pub fn join(max_bytes: usize, shared: Option<&tpar::Topology>) -> Result<GpuRanks, String> {
        Self::join_with(tpar::Config::from_env().map_err(err)?, max_bytes, shared)
    }

    /// A second job of the same rank processes (a test's fresh group after one it poisoned):
    /// its own rendezvous socket beside the first (`<path>-<tag>`) and its own job id.
    pub fn rejoin(max_bytes: usize, shared: Option<&tpar::Topology>, tag: &str) -> Result<GpuRanks, String> {
        let mut cfg = tpar::Config::from_env().map_err(err)?;
        let mut path = cfg.rendezvous.into_os_string();
        path.push(format!("-{tag}"));
        cfg.rendezvous = path.into();
        cfg.job_id ^= tpar::units::fnv1a64(tag.as_bytes());
        Self::join_with(cfg, max_bytes, shared)
    }

    fn join_with(mut cfg: tpar::Config, max_bytes: usize, shared: Option<&tpar::Topology>) -> Result<GpuRanks, String> {
        if super::tune_at_join_off() {
            // `tpar tune` runs its own start once the ranks joined.
            cfg.tune = tpar::settings::Tune::Off;
        }
        if let Some(t) = super::gpu_transport() {
            // `--transport host`: every rank parses the same arguments, so all agree.
            cfg.overrides.transport = Some(t);
        }
        let max_bytes = max_bytes.max(VEC_BYTES).div_ceil(VEC_BYTES) * VEC_BYTES;
        let opts = GpuOptions { device: shared.map(|_| 0), max_bytes, topology: shared.cloned(), ..Default::default() };
        let comm = GpuCommunicator::init(&cfg, &opts).map_err(err)?;
        let caller = Stream::new(comm.device()).map_err(err)?;
        let stage = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let shared = shared.map(|t| t.name.clone());
        let place = Place::Process { comm, caller, stage, shared, job: cfg.job_id };
        Self::around(place, 1, max_bytes)
    }

    /// `world` emulated ranks on GPU `device` over `transport`; `skew_ns`: the test's random
    /// per-rank delays before calls; `islands`: `--islands`'s spec ([`islands_for`]).
    pub fn emulated(device: usize, world: usize, max_bytes: usize, transport: Transport, skew_ns: Option<u32>, islands: Option<&str>) -> Result<GpuRanks, String> {
        let t0 = Instant::now();
        let max_bytes = max_bytes.max(16);
        let isl = islands_for(islands, world)?;
        let norm = tpar::algorithms::hierarchical::normalize(&isl, world).map_err(err)?;
        let mut set = RankSet::emulated(device, world, max_bytes, SetOptions { islands: isl, ..options(transport)? }).map_err(err)?;
        let sizes: Vec<String> = norm.iter().map(|i| i.len().to_string()).collect();
        let protocol = format!("{:?}", set.launcher().protocol()).to_ascii_lowercase();
        eprintln!(
            "# group: {world} emulated ranks on {} ({}), transport {transport} (push protocol {protocol}), max {max_bytes} B, islands {} (hierarchical), ready in {:.0} ms",
            set.device().name,
            set.device().arch(),
            sizes.join("+"),
            t0.elapsed().as_secs_f64() * 1e3
        );
        if let Some(ns) = skew_ns {
            // Fixed seed: a failing skewed run can be repeated exactly.
            set.set_skew_for_test(Some((0x5_4e3, ns)));
            eprintln!("# skewed ranks: random delays of 0 to {ns} ns on the device before calls, per rank and call");
        }
        Self::around(Place::Emulated { set, islands: norm }, world, max_bytes)
    }

    /// `local` pairs of buffers and the timing events on the placement's device.
    fn around(place: Place, local: usize, max_bytes: usize) -> Result<GpuRanks, String> {
        let dev = match &place {
            Place::Process { comm, .. } => comm.device(),
            Place::Emulated { set, .. } => set.device(),
        };
        let bufs = rank_bufs(dev, local, max_bytes)?;
        let start = Event::new(dev).map_err(err)?;
        let end = Event::new(dev).map_err(err)?;
        Ok(GpuRanks { place, bufs, start, end, max_bytes, phases: Phases::default() })
    }

    /// The rank process's communicator and its buffers, or why there is none (emulated ranks).
    pub fn rank_process(&mut self) -> Result<(&mut GpuCommunicator, &RankBufs), String> {
        match (&mut self.place, self.bufs.first()) {
            (Place::Process { comm, .. }, Some(b)) => Ok((comm, b)),
            _ => Err("this test runs on GPU rank processes, not emulated ranks".into()),
        }
    }

    /// The emulated ranks' set and islands, or why there are none (a rank process).
    pub fn emulated_set(&mut self) -> Result<(&mut RankSet, &[Vec<usize>]), String> {
        match &mut self.place {
            Place::Emulated { set, islands } => Ok((set, islands)),
            Place::Process { .. } => Err("this test runs on emulated ranks, not GPU rank processes".into()),
        }
    }

    pub fn world(&self) -> usize {
        match &self.place {
            Place::Process { comm, .. } => comm.world(),
            Place::Emulated { set, .. } => set.world(),
        }
    }

    /// The rank of local rank 0 (a rank process's own rank; emulated ranks: 0).
    fn first_rank(&self) -> usize {
        match &self.place {
            Place::Process { comm, .. } => comm.rank(),
            Place::Emulated { .. } => 0,
        }
    }

    pub fn root(&self) -> bool {
        self.first_rank() == 0
    }

    pub fn label(&self) -> String {
        match &self.place {
            Place::Process { .. } => "cuda".into(),
            Place::Emulated { set, .. } => format!("cuda-emulated-{}", set.transport()),
        }
    }

    pub fn transport(&self, algo: Algorithm) -> Transport {
        match &self.place {
            Place::Process { .. } if algo == Algorithm::Nccl => Transport::Nccl,
            Place::Process { comm, .. } => comm.transport(),
            Place::Emulated { set, .. } => set.transport(),
        }
    }

    /// The stream that carries the whole collective: the events are recorded on it.
    fn origin(&self) -> &Stream {
        match &self.place {
            Place::Process { comm, .. } => comm.stream(),
            Place::Emulated { set, .. } => set.origin(),
        }
    }

    /// The one call path: `c` (its buffers aside) on every local rank, on `bufs` (their
    /// inputs as outputs when `in_place`), through the library's entry of the placement.
    fn call(place: &mut Place, bufs: &[RankBufs], c: &Call, in_place: bool) -> Result<Algorithm, tpar::Error> {
        let (i, o) = ptrs(bufs);
        let o = if in_place { i.clone() } else { o };
        match place {
            Place::Process { comm, .. } => {
                let c = Call { input: i[0], output: o[0], ..*c };
                // SAFETY: the buffers hold max_bytes, and the callers keep the collective's
                // input and output within it; the `GpuRanks` that owns them outlives the
                // synchronize (or the graph) that ends the call.
                unsafe { comm.call(&c) }.and_then(Served::ran)
            }
            Place::Emulated { set, .. } => set.call(c, &i, &o),
        }
    }

    pub fn synchronize(&mut self) -> Result<(), tpar::Error> {
        match &mut self.place {
            Place::Process { comm, .. } => comm.synchronize(),
            Place::Emulated { set, .. } => set.synchronize(),
        }
    }

    /// `inner` calls of `c` (out of place) captured into one graph: checked across ranks
    /// when the capture ends, as engines capture (the captured kernels carry no descriptor).
    fn capture(&mut self, c: &Call, inner: usize) -> Result<Graph, String> {
        let c = c.mode(CaptureMode::Graph);
        let (i, o) = ptrs(&self.bufs);
        match &mut self.place {
            Place::Process { comm, .. } => {
                comm.begin_capture_check().map_err(err)?;
                comm.stream().begin_capture().map_err(err)?;
                let call = Call { input: i[0], output: o[0], ..c };
                let mut cap = Ok(());
                for _ in 0..inner {
                    // SAFETY: as in `call`; the graph is dropped before the buffers.
                    cap = cap.and_then(|()| unsafe { comm.call(&call) }.and_then(Served::ran).map(|_| ()));
                }
                let g = comm.stream().end_capture().map_err(err);
                let checked = comm.end_capture_check().map_err(err);
                cap.map_err(err)?;
                checked?;
                g
            }
            Place::Emulated { set, .. } => set.capture(|s| (0..inner).try_for_each(|_| s.call(&c, &i, &o).map(|_| ()))).map_err(err),
        }
    }

    fn launch(&self, graph: &Graph) -> Result<(), String> {
        match &self.place {
            Place::Process { comm, .. } => graph.launch(comm.stream()).map_err(err),
            Place::Emulated { set, .. } => set.launch(graph).map_err(err),
        }
    }

    /// Every rank's outcome: this process's `local` ones (one per local rank), and the other
    /// processes' over the control plane. `outs`: elements of each output.
    fn agree(&mut self, local: Vec<Outcome>, outs: usize) -> Result<Vec<Outcome>, String> {
        match &mut self.place {
            Place::Emulated { .. } => Ok(local),
            Place::Process { comm, .. } => {
                let mine = local.first().map(Outcome::encode).unwrap_or_default();
                let all = comm.all_gather_bytes(&mine).map_err(err)?;
                Ok(all.iter().map(|b| Outcome::decode(b, outs)).collect())
            }
        }
    }

    /// Uploads every local rank's input, poisons the outputs, runs `c` (`algo` None: the
    /// plan's pick), and judges every local rank's output (the inputs themselves, in place).
    fn checked_t<T: Element>(&mut self, c: Collective, algo: Option<Algorithm>, (seed, call): (u64, u64), count: usize, io: Io) -> Result<Verdict, String> {
        let d = T::DTYPE;
        let what = |x: tpar::Error| format!("{c} {} {d} count {count}: {x}", algo.map_or("plan", |a| a.name()));
        let t = Instant::now();
        let world = self.world();
        let (ins, outs) = c.io_elems(count, world);
        let inputs = all_inputs::<T>(seed, call, world, ins);
        self.phases.inputs += t.elapsed();
        self.phases.calls += 1;
        let t = Instant::now();
        // The all-gather and the reduce-scatter never run in place (tpar refuses overlap).
        let in_place = io == Io::InPlace && c == Collective::AllReduce;
        let first = self.first_rank();
        let via_caller = io == Io::CallerStream && count > 0 && matches!(self.place, Place::Process { .. });
        if count > 0 {
            for (k, b) in self.bufs.iter().enumerate() {
                let mine = &inputs[first + k];
                match &mut self.place {
                    Place::Process { comm, caller, stage, .. } if via_caller => {
                        stage.upload(mine).map_err(err)?;
                        b.input.fill_u32(POISON_WORD).map_err(err)?;
                        b.input.copy_from_async(stage, std::mem::size_of_val(mine.as_slice()), caller).map_err(err)?;
                        // SAFETY: `caller` is a live stream of this rank's device.
                        unsafe { comm.wait_for(caller.raw as u64) }.map_err(err)?;
                    }
                    _ => b.input.upload(mine).map_err(err)?,
                }
                if !in_place {
                    b.output.fill_u32(POISON_WORD).map_err(err)?;
                }
            }
        }
        let t_run = Instant::now();
        let used = Self::call(&mut self.place, &self.bufs, &Call::new(c, d, count, 0, 0).forced(algo), in_place).map_err(what)?;
        let download = |b: &RankBufs| -> Result<Vec<T>, String> {
            let mut out = vec![T::from_f32(0.0); outs];
            if count > 0 {
                (if in_place { &b.input } else { &b.output }).download(&mut out).map_err(err)?;
            }
            Ok(out)
        };
        let mut early = None;
        if via_caller {
            // The output is read once the caller's stream is done: signal_to must have made
            // it wait for the call. (synchronize below still surfaces a device timeout.)
            if let (Place::Process { comm, caller, .. }, Some(b)) = (&mut self.place, self.bufs.first()) {
                // SAFETY: as above.
                unsafe { comm.signal_to(caller.raw as u64) }.map_err(err)?;
                caller.synchronize().map_err(err)?;
                early = Some(download(b)?);
            }
        }
        self.synchronize().map_err(what)?;
        let t_download = Instant::now();
        let results = match early {
            Some(out) => vec![out],
            None => self.bufs.iter().map(download).collect::<Result<Vec<_>, String>>()?,
        };
        let t_judge = Instant::now();
        let (islands, wire) = match &self.place {
            Place::Process { comm, .. } => (comm.islands(), comm.wire()),
            Place::Emulated { set, islands } => (islands.clone(), set.wire()),
        };
        let judge = Judge::for_collective(c, &inputs, used, &islands, wire);
        let local = results.iter().enumerate().map(|(k, out)| judge.outcome_of(first + k, out)).collect();
        let p = &mut self.phases;
        p.copies += t_run - t;
        p.run += t_download - t_run;
        p.download += t_judge - t_download;
        p.judge += t_judge.elapsed();
        let outcomes = self.agree(local, outs)?;
        Ok(Verdict::of_collective(c, &outcomes, outs))
    }

    /// One call of `c` on fresh random inputs of every rank, judged by the one verifier and
    /// agreed by every rank. Emulated ranks have no plan: `algo` must be named.
    #[allow(clippy::too_many_arguments)]
    pub fn checked(&mut self, c: Collective, d: DType, algo: Option<Algorithm>, seed: u64, call: u64, count: usize, io: Io) -> Result<Verdict, String> {
        if let Place::Emulated { .. } = self.place {
            let algo = algo.ok_or("emulated ranks have no plan: name the algorithms (--algo all)")?;
            if count == 0 {
                // An empty call launches nothing on emulated ranks; there is nothing to judge.
                return Ok(Verdict { algo, count, wrong: 0, inexact: 0, identical: true });
            }
        }
        by_dtype!(d, T => self.checked_t::<T>(c, algo, (seed, call), count, io))
    }

    /// Per-call microseconds on this process's ranks, one value per timed iteration; `c`
    /// None times the empty kernel launched like a collective (the launch floor of
    /// emulation).
    fn time_local(&mut self, c: Option<&Call>, t: Timing) -> Result<Vec<f64>, String> {
        let inner = t.inner.max(1);
        for b in &self.bufs {
            b.input.fill_u32(TIMING_WORD).map_err(err)?;
        }
        let graph = match (t.mode, c) {
            (CaptureMode::Eager, _) => None,
            (CaptureMode::Graph, Some(c)) => Some(self.capture(c, inner)?),
            (CaptureMode::Graph, None) => match &mut self.place {
                Place::Emulated { set, .. } => {
                    let (i, o) = ptrs(&self.bufs);
                    Some(set.capture(|s| (0..inner).try_for_each(|_| s.enqueue_floor(1, &i, &o))).map_err(err)?)
                }
                Place::Process { .. } => return Err("the launch floor is measured on emulated ranks".into()),
            },
        };
        // Emulated ranks warm up at least once (the first call may load its kernel); rank
        // processes exactly as asked, each iteration after a barrier over the control plane.
        let warmup = match self.place {
            Place::Emulated { .. } => t.warmup.max(1),
            Place::Process { .. } => t.warmup,
        };
        let mut times = Vec::with_capacity(t.iters);
        for k in 0..warmup + t.iters {
            if let Place::Process { comm, .. } = &mut self.place {
                comm.barrier().map_err(err)?;
            }
            self.origin().record(&self.start).map_err(err)?;
            self.iteration(c, graph.as_ref(), inner)?;
            self.origin().record(&self.end).map_err(err)?;
            self.synchronize().map_err(err)?;
            if k >= warmup {
                times.push(f64::from(self.start.elapsed_ms(&self.end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        if matches!(&self.place, Place::Emulated { set, .. } if set.stamps_enabled()) {
            // TPAR_TEST_STAMPS: the timed call once more on cleared stamps, then its phases.
            if let Place::Emulated { set, .. } = &self.place {
                set.clear_stamps().map_err(err)?;
            }
            self.iteration(c, graph.as_ref(), inner)?;
            let label = match c {
                Some(c) => format!("{} {} B", c.algorithm.map_or_else(|| "plan".to_string(), |a| a.to_string()), c.count * c.dtype.size()),
                None => "launch floor 2 B".to_string(),
            };
            if let Place::Emulated { set, .. } = &self.place {
                super::stamps::report(set, &label)?;
            }
        }
        Ok(times)
    }

    /// One timed iteration: the graph, or `inner` calls back to back (`c` None: the floor).
    fn iteration(&mut self, c: Option<&Call>, graph: Option<&Graph>, inner: usize) -> Result<(), String> {
        if let Some(g) = graph {
            return self.launch(g);
        }
        for _ in 0..inner {
            match (c, &mut self.place) {
                (Some(c), place) => Self::call(place, &self.bufs, c, false).map(|_| ()).map_err(err)?,
                (None, Place::Emulated { set, .. }) => {
                    let (i, o) = ptrs(&self.bufs);
                    set.enqueue_floor(1, &i, &o).map_err(err)?;
                }
                (None, Place::Process { .. }) => return Err("the launch floor is measured on emulated ranks".into()),
            }
        }
        Ok(())
    }

    /// Per-call microseconds of `c`: per iteration the slowest rank; the root gets the spread.
    pub fn time(&mut self, c: Collective, algo: Algorithm, d: DType, count: usize, t: Timing) -> Result<Option<Spread>, String> {
        let call = Call::new(c, d, count, 0, 0).forced(Some(algo));
        let mut times = self.time_local(Some(&call), t)?;
        match &mut self.place {
            Place::Emulated { .. } => Ok(Some(percentiles(&mut times))),
            Place::Process { comm, .. } => Ok(comm.gather_bytes(&super::encode_times(&times)).map_err(err)?.map(|all| super::slowest(&times, &all))),
        }
    }

    /// Lines that say where and how these ranks run (the table's preamble).
    pub fn describe(&mut self) -> Result<Vec<String>, String> {
        match &self.place {
            Place::Process { comm, shared, job, .. } => Ok(describe_process(comm, shared.as_deref(), *job, self.max_bytes)),
            Place::Emulated { set, .. } => {
                let mut v = vec![format!(
                    "backend: cuda, {} ranks emulated as streams of one {} (transport {}); they prove correctness and kernel cost, not the fabric",
                    set.world(),
                    set.device().name,
                    set.transport()
                )];
                let world = set.world();
                for mode in [CaptureMode::Eager, CaptureMode::Graph] {
                    let mut s = self.time_local(None, Timing { mode, inner: 20, warmup: 3, iters: 50 })?;
                    let f = percentiles(&mut s);
                    v.push(format!(
                        "launch floor ({mode}): an empty kernel on each of {world} ranks, launched like a collective: {:.2} us per call (p10 {:.2}, p90 {:.2})",
                        f.median, f.p10, f.p90
                    ));
                }
                Ok(v)
            }
        }
    }

    /// The algorithms these ranks can run now (NCCL only where it joined).
    pub fn algorithms(&self) -> Vec<Algorithm> {
        match &self.place {
            Place::Process { comm, .. } => {
                let nccl = comm.nccl_status().is_ok();
                let t = comm.transport();
                super::Target::Gpu
                    .algorithms()
                    .into_iter()
                    .filter(|a| if *a == Algorithm::Nccl { nccl } else { tpar::algorithms::registry::spec(*a).gpu_transports.contains(&t) })
                    .collect()
            }
            Place::Emulated { set, .. } => tpar::algorithms::registry::algorithms_emulated(set.transport()),
        }
    }

    /// What the plan runs for this call (rank processes; emulated ranks have no plan).
    pub fn planned(&mut self, c: Collective, d: DType, bytes: usize, mode: CaptureMode) -> Option<Algorithm> {
        match &mut self.place {
            Place::Process { comm, .. } => Some(comm.plan_for(c, d, bytes, mode).algorithm),
            Place::Emulated { .. } => None,
        }
    }

    pub fn barrier(&mut self) -> Result<(), String> {
        match &mut self.place {
            Place::Process { comm, .. } => comm.barrier().map_err(err),
            Place::Emulated { set, .. } => set.synchronize().map_err(err),
        }
    }

    /// One start of this machine's tune on these ranks (the library's one tuner).
    pub fn tune(&mut self, opts: tpar::tune::StartOptions, max_bytes: usize) -> Result<tpar::tune::Outcome, String> {
        match &mut self.place {
            // The workspace's size (the largest message) was fixed when the ranks joined.
            Place::Process { comm, .. } => comm.tune_with(opts).cloned().map_err(err),
            Place::Emulated { set, .. } => {
                let settings = tpar::Settings::from_env().map_err(err)?;
                tpar::cuda::tune::start_emulated(set, max_bytes, &settings, opts).map_err(err)
            }
        }
    }

    /// Where the ranks are, for timing another project's kernel beside tpar's.
    pub fn peer_site(&mut self) -> super::peer::Site<'_> {
        match &mut self.place {
            Place::Process { comm, shared, .. } => super::peer::Site::Rank { comm, shared: shared.is_some() },
            Place::Emulated { set, .. } => super::peer::Site::Emulated { device: set.device(), world: set.world() },
        }
    }

    /// Where checked calls spent their time (emulated ranks: the process holds every rank).
    pub fn phase_report(&self) -> Option<String> {
        let p = &self.phases;
        let n = p.calls.max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / n;
        (p.calls > 0 && matches!(self.place, Place::Emulated { .. })).then(|| {
            format!(
                "host time per checked call ({} calls): inputs {:.3} ms, upload + poison {:.3} ms, all-reduce + sync {:.3} ms, download {:.3} ms, judge {:.3} ms",
                p.calls,
                ms(p.inputs),
                ms(p.copies),
                ms(p.run),
                ms(p.download),
                ms(p.judge)
            )
        })
    }
}

fn describe_process(comm: &GpuCommunicator, shared: Option<&str>, job: u64, max_bytes: usize) -> Vec<String> {
    let t = comm.topology();
    let ws = match comm.transport() {
        Transport::Host => "host transport: workspaces in one shared host-memory segment, registered with CUDA in every rank",
        _ => "CUDA IPC workspaces",
    };
    let mut v = vec![format!("backend: cuda, {} rank processes (GpuCommunicator, {ws})", comm.world())];
    if comm.transport() == Transport::Host {
        // Observed, not assumed: the segment's name must be gone once every rank joined.
        let left = tpar::transport::shm::leftover_segments(&format!("{job:016x}"));
        v.push(format!("host segment names of this job left in /dev/shm after init: {} (0: unlinked once every rank mapped it)", left.len()));
    }
    match shared {
        Some(name) => v.push(format!("every rank on GPU 0, planning for {name} (a correctness test, not a measurement)")),
        None => {
            for g in t.gpus.iter().take(comm.world()) {
                v.push(format!("rank {} -> GPU {} {} ({})", g.index, g.index, g.name, g.pci_bus_id));
            }
        }
    }
    if t.links.len() >= 2 && t.links[0].len() >= 2 {
        v.push(format!("link GPU0-GPU1: {:?}", t.links[0][1]));
    }
    v.push(format!(
        "NCCL: {}; workspace {} per rank",
        comm.nccl_status().map_or_else(|w| format!("not joined ({w})"), |()| "joined over tpar's rendezvous".into()),
        tpar::units::human_bytes(max_bytes as u64)
    ));
    v
}

/// The islands of `--islands SPEC` for `world` ranks: `halves` (default), `one`, sizes in
/// rank order (`3+5`), or `map:` and one character per rank naming its island
/// (`map:01010101`: even and odd ranks). A comma list gives one split per world: the one that
/// covers `world` ranks applies.
pub fn islands_for(spec: Option<&str>, world: usize) -> Result<Vec<Vec<u32>>, String> {
    use tpar::algorithms::hierarchical::from_sizes;
    let spec = spec.map(str::trim).unwrap_or("halves");
    match spec {
        "halves" => Ok(from_sizes(&[world.div_ceil(2), world / 2])),
        "one" => Ok(from_sizes(&[world])),
        list => {
            for split in list.split(',') {
                if let Some(map) = split.trim().strip_prefix("map:") {
                    if map.chars().count() == world {
                        let mut names: Vec<char> = map.chars().collect();
                        names.sort_unstable();
                        names.dedup();
                        return Ok(names.iter().map(|n| map.chars().enumerate().filter(|(_, c)| c == n).map(|(r, _)| r as u32).collect()).collect());
                    }
                    continue;
                }
                let sizes = split
                    .split('+')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| format!("--islands {split:?}: expected halves, one, island sizes such as 3+5, or map:01010101"))?;
                if sizes.iter().sum::<usize>() == world {
                    return Ok(from_sizes(&sizes));
                }
            }
            Err(format!("--islands {list:?}: no split of {world} ranks (sizes must add up to the world)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::islands_for;

    #[test]
    fn island_specs() {
        assert_eq!(islands_for(None, 5).unwrap(), vec![vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(islands_for(Some("one"), 3).unwrap(), vec![vec![0, 1, 2]]);
        assert_eq!(islands_for(Some("1+3,3+5"), 8).unwrap(), vec![vec![0, 1, 2], vec![3, 4, 5, 6, 7]]);
        assert_eq!(islands_for(Some("1+3,3+5"), 4).unwrap(), vec![vec![0], vec![1, 2, 3]]);
        assert_eq!(islands_for(Some("map:0101"), 4).unwrap(), vec![vec![0, 2], vec![1, 3]]);
        assert!(islands_for(Some("3+5"), 4).is_err());
        assert!(islands_for(Some("3+x"), 8).is_err());
        assert!(islands_for(Some("map:01"), 4).is_err());
    }
}
