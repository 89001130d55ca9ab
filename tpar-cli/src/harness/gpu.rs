//! One rank process per GPU through [`tpar::cuda::GpuCommunicator`], the way inference
//! engines run tensor parallelism: rank r takes GPU r (or, for correctness tests on one GPU,
//! every rank GPU 0 planning for another topology). Rank 0 prints; the others send what
//! they measured over tpar's control plane.

use super::verify::{Judge, Outcome, Verdict};
use super::{launch, Group, Io, Timing};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{DeviceBuffer, Event, Graph, Stream};
use tpar::cuda::{Call, GpuCommunicator, GpuOptions, Served};
use tpar::plan::CaptureMode;
use tpar::testing::all_inputs;
use tpar::units::Spread;
use tpar::{Algorithm, Collective, DType, Element, Transport};

pub use super::verify::{err, POISON_WORD, TIMING_WORD};

/// Launches `world` rank processes of this command. Unless `shared` (a correctness test on
/// one GPU), refuses more ranks than GPUs: processes sharing a GPU measure time-slicing.
pub fn launch_ranks(world: usize, grace: std::time::Duration, shared: bool) -> Result<(), String> {
    let gpus = super::gpu_count();
    if world > gpus && !shared {
        return Err(format!("--world {world}: this machine has {gpus} GPU(s); tpar runs one rank process per GPU"));
    }
    launch::launch(world, grace)
}

/// One rank: its communicator, a pair of buffers as large as the largest call, timing events.
pub struct GpuGroup {
    pub comm: GpuCommunicator,
    pub input: DeviceBuffer,
    pub output: DeviceBuffer,
    start: Event,
    end: Event,
    max_bytes: usize,
    /// A stream of "the caller's" ([`Io::CallerStream`]) and the buffer its copy reads from.
    caller: Stream,
    stage: DeviceBuffer,
    shared: Option<String>,
    /// The job id (host segment names carry it).
    job: u64,
}

impl GpuGroup {
    /// Joins on GPU `rank` with the discovered topology, or, with `shared`, on GPU 0 planning
    /// for that topology instead (correctness tests of several processes on one GPU).
    pub fn join(max_bytes: usize, shared: Option<&tpar::Topology>) -> Result<GpuGroup, String> {
        Self::join_with(tpar::Config::from_env().map_err(err)?, max_bytes, shared)
    }

    /// A second job of the same rank processes (a test's fresh group after one it poisoned):
    /// its own rendezvous socket beside the first (`<path>-<tag>`) and its own job id.
    pub fn rejoin(max_bytes: usize, shared: Option<&tpar::Topology>, tag: &str) -> Result<GpuGroup, String> {
        let mut cfg = tpar::Config::from_env().map_err(err)?;
        let mut path = cfg.rendezvous.into_os_string();
        path.push(format!("-{tag}"));
        cfg.rendezvous = path.into();
        cfg.job_id ^= tpar::units::fnv1a64(tag.as_bytes());
        Self::join_with(cfg, max_bytes, shared)
    }

    fn join_with(mut cfg: tpar::Config, max_bytes: usize, shared: Option<&tpar::Topology>) -> Result<GpuGroup, String> {
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
        let input = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let output = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let start = Event::new(comm.device()).map_err(err)?;
        let end = Event::new(comm.device()).map_err(err)?;
        let caller = Stream::new(comm.device()).map_err(err)?;
        let stage = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let shared = shared.map(|t| t.name.clone());
        Ok(GpuGroup { comm, input, output, start, end, max_bytes, caller, stage, shared, job: cfg.job_id })
    }

    fn nccl(&self) -> bool {
        self.comm.nccl_status().is_ok()
    }

    fn checked_t<T: Element>(
        &mut self,
        c: Collective,
        algo: Option<Algorithm>,
        (seed, call): (u64, u64),
        count: usize,
        io: Io,
    ) -> Result<Outcome, String> {
        let d = T::DTYPE;
        let what = |x: String| {
            format!(
                "{c} {} {d} count {count}: {x}",
                algo.map_or("plan", |a| a.name())
            )
        };
        let (ins, outs) = c.io_elems(count, self.comm.world());
        let inputs = all_inputs::<T>(seed, call, self.comm.world(), ins);
        // The all-gather and the reduce-scatter never run in place (tpar refuses overlap).
        let io = if c != Collective::AllReduce && io == Io::InPlace {
            Io::OutOfPlace
        } else {
            io
        };
        let out_buf = if io == Io::InPlace {
            &self.input
        } else {
            &self.output
        };
        let via_caller = io == Io::CallerStream && count > 0;
        if count > 0 {
            let mine = &inputs[self.comm.rank()];
            if via_caller {
                self.stage.upload(mine).map_err(err)?;
                self.input.fill_u32(POISON_WORD).map_err(err)?;
                self.input.copy_from_async(&self.stage, std::mem::size_of_val(mine.as_slice()), &self.caller).map_err(err)?;
                // SAFETY: `caller` is a live stream of this rank's device.
                unsafe { self.comm.wait_for(self.caller.raw as u64) }.map_err(err)?;
            } else {
                self.input.upload(mine).map_err(err)?;
            }
            if io != Io::InPlace {
                self.output.fill_u32(POISON_WORD).map_err(err)?;
            }
        }
        let (i, o) = (self.input.ptr, out_buf.ptr);
        // SAFETY: both buffers hold max_bytes >= count * d.size() bytes (the callers keep
        // counts within it) and live until synchronize below returns.
        let used = unsafe { self.comm.call(&Call::new(c, d, count, i, o).forced(algo)) }
            .and_then(Served::ran)
            .map_err(|x| what(x.to_string()))?;
        let mut out = vec![T::from_f32(0.0); outs];
        if via_caller {
            // The output is read once the caller's stream is done: signal_to must have made
            // it wait for the call. (synchronize below still surfaces a device timeout.)
            // SAFETY: as above.
            unsafe { self.comm.signal_to(self.caller.raw as u64) }.map_err(err)?;
            self.caller.synchronize().map_err(err)?;
            out_buf.download(&mut out).map_err(err)?;
        }
        self.comm.synchronize().map_err(|x| what(x.to_string()))?;
        if count > 0 && !via_caller {
            out_buf.download(&mut out).map_err(err)?;
        }
        Ok(
            Judge::for_collective(c, &inputs, used, &self.comm.islands(), self.comm.wire())
                .outcome_of(self.comm.rank(), &out),
        )
    }

    /// Per-call microseconds on this rank, one value per timed iteration.
    fn time_local(
        &mut self,
        c: Collective,
        algo: Algorithm,
        d: DType,
        count: usize,
        t: Timing,
    ) -> Result<Vec<f64>, String> {
        let inner = t.inner.max(1);
        self.input.fill_u32(TIMING_WORD).map_err(err)?;
        let (i, o) = (self.input.ptr, self.output.ptr);
        let graph: Option<Graph> = match t.mode {
            CaptureMode::Eager => None,
            CaptureMode::Graph => {
                // A checked capture: the ranks' sequences are compared when it ends, and the
                // captured kernels run without per-call descriptors (as engines capture).
                self.comm.begin_capture_check().map_err(err)?;
                self.comm.stream().begin_capture().map_err(err)?;
                let mut cap = Ok(algo);
                for _ in 0..inner {
                    // SAFETY: both buffers hold max_bytes >= count * d.size() bytes and
                    // outlive the graph (dropped at the end of this function).
                    cap = cap.and_then(|_| {
                        // SAFETY: as above.
                        unsafe { self.comm.call(&Call::new(c, d, count, i, o).mode(CaptureMode::Graph).forced(Some(algo))) }
                            .and_then(Served::ran)
                    });
                }
                let g = self.comm.stream().end_capture().map_err(err);
                let checked = self.comm.end_capture_check().map_err(err);
                cap.map_err(err)?;
                checked?;
                Some(g?)
            }
        };
        let mut times = Vec::with_capacity(t.iters);
        for k in 0..t.warmup + t.iters {
            self.comm.barrier().map_err(err)?;
            self.comm.stream().record(&self.start).map_err(err)?;
            match &graph {
                Some(g) => g.launch(self.comm.stream()).map_err(err)?,
                None => {
                    for _ in 0..inner {
                        // SAFETY: as above; synchronize below waits for every call.
                        unsafe { self.comm.call(&Call::new(c, d, count, i, o).forced(Some(algo))) }
                            .and_then(Served::ran)
                            .map_err(err)?;
                    }
                }
            }
            self.comm.stream().record(&self.end).map_err(err)?;
            self.comm.synchronize().map_err(err)?;
            if k >= t.warmup {
                times.push(f64::from(self.start.elapsed_ms(&self.end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        Ok(times)
    }
}

impl Group for GpuGroup {
    fn world(&self) -> usize {
        self.comm.world()
    }
    fn root(&self) -> bool {
        self.comm.rank() == 0
    }
    fn label(&self) -> String {
        "cuda".into()
    }
    fn transport(&self, algo: Algorithm) -> Transport {
        if algo == Algorithm::Nccl {
            Transport::Nccl
        } else {
            self.comm.transport()
        }
    }
    fn describe(&mut self) -> Result<Vec<String>, String> {
        let t = self.comm.topology();
        let ws = match self.comm.transport() {
            Transport::Host => "host transport: workspaces in one shared host-memory segment, registered with CUDA in every rank",
            _ => "CUDA IPC workspaces",
        };
        let mut v = vec![format!("backend: cuda, {} rank processes (GpuCommunicator, {ws})", self.comm.world())];
        if self.comm.transport() == Transport::Host {
            // Observed, not assumed: the segment's name must be gone once every rank joined.
            let left = tpar::transport::shm::leftover_segments(&format!("{:016x}", self.job));
            v.push(format!("host segment names of this job left in /dev/shm after init: {} (0: unlinked once every rank mapped it)", left.len()));
        }
        match &self.shared {
            Some(name) => v.push(format!("every rank on GPU 0, planning for {name} (a correctness test, not a measurement)")),
            None => {
                for g in t.gpus.iter().take(self.comm.world()) {
                    v.push(format!("rank {} -> GPU {} {} ({})", g.index, g.index, g.name, g.pci_bus_id));
                }
            }
        }
        if t.links.len() >= 2 && t.links[0].len() >= 2 {
            v.push(format!("link GPU0-GPU1: {:?}", t.links[0][1]));
        }
        v.push(format!(
            "NCCL: {}; workspace {} per rank",
            self.comm.nccl_status().map_or_else(|w| format!("not joined ({w})"), |()| "joined over tpar's rendezvous".into()),
            tpar::units::human_bytes(self.max_bytes as u64)
        ));
        Ok(v)
    }
    fn algorithms(&self) -> Vec<Algorithm> {
        let nccl = self.nccl();
        let t = self.comm.transport();
        super::Target::Gpu
            .algorithms()
            .into_iter()
            .filter(|a| if *a == Algorithm::Nccl { nccl } else { tpar::algorithms::registry::spec(*a).gpu_transports.contains(&t) })
            .collect()
    }
    fn planned(
        &mut self,
        c: Collective,
        d: DType,
        bytes: usize,
        mode: CaptureMode,
    ) -> Option<Algorithm> {
        Some(self.comm.plan_for(c, d, bytes, mode).algorithm)
    }
    fn checked(
        &mut self,
        c: Collective,
        d: DType,
        algo: Option<Algorithm>,
        seed: u64,
        call: u64,
        count: usize,
        io: Io,
    ) -> Result<Verdict, String> {
        let o = by_dtype!(d, T => self.checked_t::<T>(c, algo, (seed, call), count, io)?);
        let all = self.comm.all_gather_bytes(&o.encode()).map_err(err)?;
        let outs = c.io_elems(count, self.comm.world()).1;
        let outcomes: Vec<Outcome> = all.iter().map(|b| Outcome::decode(b, outs)).collect();
        Ok(Verdict::of_collective(c, &outcomes, outs))
    }
    fn time(
        &mut self,
        c: Collective,
        algo: Algorithm,
        d: DType,
        count: usize,
        t: Timing,
    ) -> Result<Option<Spread>, String> {
        let times = self.time_local(c, algo, d, count, t)?;
        Ok(self
            .comm
            .gather_bytes(&super::encode_times(&times))
            .map_err(err)?
            .map(|all| super::slowest(&times, &all)))
    }
    fn barrier(&mut self) -> Result<(), String> {
        self.comm.barrier().map_err(err)
    }
    fn tune(&mut self, opts: tpar::tune::StartOptions, _max_bytes: usize) -> Result<tpar::tune::Outcome, String> {
        // The workspace's size (the largest message) was fixed when the ranks joined.
        self.comm.tune_with(opts).cloned().map_err(err)
    }
    fn peer_site(&mut self) -> Option<super::peer::Site<'_>> {
        Some(super::peer::Site::Rank { comm: &mut self.comm, shared: self.shared.is_some() })
    }
}
