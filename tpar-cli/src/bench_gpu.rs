//! GPUs as ranks: one rank process per GPU through [`tpar::cuda::GpuCommunicator`], the way
//! inference engines run tensor parallelism. Behind `tpar bench --backend cuda` (timings of
//! every algorithm against NCCL in the same run, eager and inside CUDA graphs),
//! `tpar check --backend cuda` (the correctness sweep and long random sequences, plus the
//! hidden dead-peer test) and `tpar tune --backend cuda` (a measured profile for the plan).
//!
//! Every rank process is started by [`crate::launch`] (or an outside launcher setting
//! TPAR_RANK, TPAR_WORLD_SIZE, TPAR_RDZV); rank r takes GPU r. Rank 0 prints; the others
//! send what they measured over tpar's control plane.

use crate::launch;
use crate::util::percentiles;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{DeviceBuffer, Event, Graph, Stream};
use tpar::cuda::kernels::kernel_algorithms;
use tpar::cuda::{GpuCommunicator, GpuOptions};
use tpar::plan::{Backend, CaptureMode};
use tpar::profile::{Profile, ProfileFingerprint};
use tpar::report::Record;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, count_wrong_stepwise, digest, expected, is_exact, special_inputs, Special, SplitMix};
use tpar::{bf16, f16, Algorithm, DType, Element};

/// Written into outputs before each checked call: a NaN in every lane width (f32, f16,
/// bf16) that no algorithm writes and that is not the workspace's empty sentinel.
const POISON_WORD: u32 = 0x7fa5_7fa5;
/// Written into inputs before timed calls: finite and non-zero in every lane width.
const TIMING_WORD: u32 = 0x3c00_3c00;

/// Median, p10 and p90 in microseconds.
type Spread = (f64, f64, f64);

fn err(x: tpar::Error) -> String {
    x.to_string()
}

/// The algorithms with a CUDA path in a multi-process group, NCCL last.
pub fn cuda_algorithms() -> Vec<Algorithm> {
    let mut v = kernel_algorithms();
    v.push(Algorithm::Nccl);
    v
}

/// `all` or a comma list, restricted to what runs across GPUs.
pub fn parse_cuda_algos(s: &str) -> Result<Vec<Algorithm>, String> {
    if s.trim() == "all" {
        return Ok(cuda_algorithms());
    }
    let all = cuda_algorithms();
    s.split(',')
        .map(|a| {
            let a = a.trim().parse::<Algorithm>().map_err(|e| e.to_string())?;
            if all.contains(&a) {
                Ok(a)
            } else {
                Err(format!(
                    "--algo {a}: no CUDA kernel for it across GPUs; choose from {}",
                    all.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
                ))
            }
        })
        .collect()
}

/// How many rank processes: `--ranks` when given, else one per visible GPU.
pub fn ranks_or_gpus(ranks: Option<usize>) -> Result<usize, String> {
    if let Some(r) = ranks {
        return Ok(r);
    }
    let gpus = crate::util::gpu_count();
    if gpus < 2 {
        return Err(format!(
            "--backend cuda across GPUs needs 2 or more GPUs; NVML sees {gpus}. \
             On one GPU, use --emulate-ranks N (ranks as streams of one GPU)"
        ));
    }
    Ok(gpus)
}

/// Launches `world` rank processes of this command (or returns false when this process is a
/// rank). Unless `shared` (a correctness test on one GPU), the launcher refuses more ranks
/// than GPUs: processes sharing a GPU measure time-slicing, not the fabric.
fn launch_ranks(world: usize, grace: Duration, shared: bool) -> Result<bool, String> {
    if launch::is_rank() {
        return Ok(false);
    }
    let gpus = crate::util::gpu_count();
    if world > gpus && !shared {
        return Err(format!("--ranks {world}: this machine has {gpus} GPU(s); tpar runs one rank process per GPU"));
    }
    launch::launch(world, grace)?;
    Ok(true)
}

/// One rank: its communicator, a pair of buffers as large as the largest call, timing events.
struct Rank {
    comm: GpuCommunicator,
    input: DeviceBuffer,
    output: DeviceBuffer,
    start: Event,
    end: Event,
    max_bytes: usize,
    /// A stream of "the caller's" ([`Io::CallerStream`]) and the buffer its copy reads from.
    caller: Stream,
    stage: DeviceBuffer,
}

/// Where a checked call's input comes from and its output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Io {
    /// Input uploaded, output a separate buffer, poisoned first.
    OutOfPlace,
    /// The input buffer is the output.
    InPlace,
    /// As out of place, but the input is written by a copy on a caller's stream (the input
    /// buffer holds poison until it lands) and the output is read after synchronizing that
    /// stream: `wait_for` and `signal_to` must order both.
    CallerStream,
}

impl Io {
    fn label(self) -> &'static str {
        match self {
            Io::OutOfPlace => "",
            Io::InPlace => " in place",
            Io::CallerStream => " via a caller's stream",
        }
    }
}

/// What one checked call gave on this rank.
struct Outcome {
    algo: Algorithm,
    /// Elements outside the f64 reference's rounding bound.
    wrong: usize,
    /// Elements that differ from the rank-order f32 sum (tpar's kernels promise it; NCCL does not).
    inexact: usize,
    digest: u64,
}

/// What all ranks gave for one checked call.
struct Verdict {
    algo: Algorithm,
    wrong: usize,
    inexact: usize,
    identical: bool,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.wrong == 0 && self.inexact == 0 && self.identical
    }
}

impl Rank {
    /// Joins on GPU `rank` with the discovered topology, or, with `shared`, on GPU 0 planning
    /// for that topology instead (correctness tests of several processes on one GPU).
    fn join(max_bytes: usize, shared: Option<&tpar::Topology>) -> Result<Rank, String> {
        let cfg = tpar::Config::from_env().map_err(err)?;
        let max_bytes = max_bytes.max(VEC_BYTES).div_ceil(VEC_BYTES) * VEC_BYTES;
        let opts = GpuOptions { device: shared.map(|_| 0), max_bytes, topology: shared.cloned() };
        let comm = GpuCommunicator::init(&cfg, &opts).map_err(err)?;
        let input = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let output = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        let start = Event::new(comm.device()).map_err(err)?;
        let end = Event::new(comm.device()).map_err(err)?;
        let caller = Stream::new(comm.device()).map_err(err)?;
        let stage = DeviceBuffer::new(comm.device(), max_bytes).map_err(err)?;
        Ok(Rank { comm, input, output, start, end, max_bytes, caller, stage })
    }

    fn root(&self) -> bool {
        self.comm.rank() == 0
    }

    fn nccl(&self) -> bool {
        self.comm.nccl_status().is_ok()
    }

    /// One call on fresh random inputs of every rank (regenerated here from the seed), the
    /// output poisoned first (or the input itself, in place); `algo` None goes through the plan.
    fn checked<T: Element>(&mut self, algo: Option<Algorithm>, (seed, call): (u64, u64), count: usize, io: Io) -> Result<Outcome, String> {
        let d = T::DTYPE;
        let what = |x: String| format!("{} {d} count {count}: {x}", algo.map_or("plan", |a| a.name()));
        let inputs = all_inputs::<T>(seed, call, self.comm.world(), count);
        let out_buf = if io == Io::InPlace { &self.input } else { &self.output };
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
        let used = unsafe {
            match algo {
                Some(a) => self.comm.all_reduce_with(a, d, count, i, o),
                None => self.comm.all_reduce(d, count, i, o),
            }
        }
        .map_err(|x| what(x.to_string()))?;
        let mut out = vec![T::from_f32(0.0); count];
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
        // tpar's kernels promise the rank-order f32 sum, rounded once; NCCL rounds every
        // partial sum in half and bf16, so it is held to the bound for that.
        let (wrong, inexact) = if used == Algorithm::Nccl {
            (count_wrong_stepwise(&out, &inputs), 0)
        } else {
            (count_wrong(&out, &inputs), bit_diffs(&out, &expected(&inputs)))
        };
        Ok(Outcome { algo: used, wrong, inexact, digest: digest(&out) })
    }

    fn checked_dyn(&mut self, d: DType, algo: Option<Algorithm>, sc: (u64, u64), count: usize, io: Io) -> Result<Outcome, String> {
        match d {
            DType::F32 => self.checked::<f32>(algo, sc, count, io),
            DType::F16 => self.checked::<f16>(algo, sc, count, io),
            DType::BF16 => self.checked::<bf16>(algo, sc, count, io),
        }
    }

    /// Every rank's outcome to every rank: sums of wrong elements, and whether all ranks'
    /// outputs are bitwise identical (their digests equal) and all used the same algorithm.
    fn agree(&mut self, o: &Outcome) -> Result<Verdict, String> {
        let mut p = Vec::with_capacity(32);
        p.extend_from_slice(&(o.wrong as u64).to_le_bytes());
        p.extend_from_slice(&(o.inexact as u64).to_le_bytes());
        p.extend_from_slice(&o.digest.to_le_bytes());
        p.extend_from_slice(&o.algo.code().to_le_bytes());
        let all = self.comm.all_gather_bytes(&p).map_err(err)?;
        let word = |b: &[u8], k: usize| b.get(8 * k..8 * k + 8).and_then(|s| s.try_into().ok()).map_or(u64::MAX, u64::from_le_bytes);
        let mut v = Verdict { algo: o.algo, wrong: 0, inexact: 0, identical: true };
        for b in &all {
            v.wrong = v.wrong.saturating_add(word(b, 0) as usize);
            v.inexact = v.inexact.saturating_add(word(b, 1) as usize);
            v.identical &= word(b, 2) == o.digest && word(b, 3) == o.algo.code();
        }
        Ok(v)
    }

    /// Per-call microseconds on this rank, one value per timed iteration: `inner` calls of
    /// `algo` back to back between two events (eager), or captured once into a graph and
    /// replayed (graph). Every iteration starts after a barrier over the control plane.
    fn time(&mut self, algo: Algorithm, d: DType, count: usize, mode: CaptureMode, inner: usize, (warmup, iters): (usize, usize)) -> Result<Vec<f64>, String> {
        let inner = inner.max(1);
        self.input.fill_u32(TIMING_WORD).map_err(err)?;
        let (i, o) = (self.input.ptr, self.output.ptr);
        self.comm.set_capture_mode(mode);
        let graph: Option<Graph> = match mode {
            CaptureMode::Eager => None,
            CaptureMode::Graph => {
                self.comm.stream().begin_capture().map_err(err)?;
                let mut cap = Ok(algo);
                for _ in 0..inner {
                    // SAFETY: both buffers hold max_bytes >= count * d.size() bytes and
                    // outlive the graph (dropped at the end of this function).
                    cap = cap.and_then(|_| unsafe { self.comm.all_reduce_with(algo, d, count, i, o) });
                }
                let g = self.comm.stream().end_capture().map_err(err);
                cap.map_err(err)?;
                Some(g?)
            }
        };
        let mut times = Vec::with_capacity(iters);
        for k in 0..warmup + iters {
            self.comm.barrier().map_err(err)?;
            self.comm.stream().record(&self.start).map_err(err)?;
            match &graph {
                Some(g) => g.launch(self.comm.stream()).map_err(err)?,
                None => {
                    for _ in 0..inner {
                        // SAFETY: as above; synchronize below waits for every call.
                        unsafe { self.comm.all_reduce_with(algo, d, count, i, o) }.map_err(err)?;
                    }
                }
            }
            self.comm.stream().record(&self.end).map_err(err)?;
            self.comm.synchronize().map_err(err)?;
            if k >= warmup {
                times.push(f64::from(self.start.elapsed_ms(&self.end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        self.comm.set_capture_mode(CaptureMode::Eager);
        Ok(times)
    }

    /// Rank 0 gets, per iteration, the slowest rank's time, as (median, p10, p90); others None.
    fn slowest(&mut self, times: &[f64]) -> Result<Option<Spread>, String> {
        let bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
        let Some(all) = self.comm.gather_bytes(&bytes).map_err(err)? else {
            return Ok(None);
        };
        let mut worst = times.to_vec();
        for p in &all {
            for (w, c) in worst.iter_mut().zip(p.chunks_exact(8)) {
                *w = w.max(c.try_into().map_or(f64::INFINITY, f64::from_le_bytes));
            }
        }
        Ok(Some(percentiles(&mut worst)))
    }
}

/// One line to stderr in one write, so lines of several rank processes do not interleave.
fn say_err(line: String) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

fn bar(root: bool, len: usize) -> ProgressBar {
    if !root {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len as u64);
    b.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

fn preamble(r: &Rank, what: &str, shared: Option<&str>) {
    let t = r.comm.topology();
    println!("# tpar {what} --backend cuda: {} rank processes (GpuCommunicator, CUDA IPC workspaces)", r.comm.world());
    match shared {
        Some(name) => println!("#   every rank on GPU 0, planning for {name} (a correctness test, not a measurement)"),
        None => {
            for g in t.gpus.iter().take(r.comm.world()) {
                println!("#   rank {} -> GPU {} {} ({})", g.index, g.index, g.name, g.pci_bus_id);
            }
        }
    }
    if t.links.len() >= 2 && t.links[0].len() >= 2 {
        println!("#   link GPU0-GPU1: {:?}", t.links[0][1]);
    }
    println!(
        "#   NCCL: {}; workspace {} per rank",
        r.comm.nccl_status().map_or_else(|w| format!("not joined ({w})"), |()| "joined over tpar's rendezvous".into()),
        tpar::plan::human_bytes(r.max_bytes as u64)
    );
}

// ---------------------------------------------------------------------------------------------
// tpar bench --backend cuda

/// What `tpar bench --backend cuda` measures across GPUs.
pub struct BenchOpts {
    pub ranks: Option<usize>,
    pub sizes: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub algos: Vec<Algorithm>,
    pub modes: Vec<CaptureMode>,
    pub iters: usize,
    pub warmup: usize,
    /// Calls per timed iteration (back to back eager, or captured in one graph).
    pub inner: usize,
    pub check: bool,
    /// A whole decode/verify step: CALLS all-reduces of BYTES.
    pub sequence: Option<(usize, usize)>,
    pub json: Option<PathBuf>,
    pub svg: Option<PathBuf>,
}

/// One measured point as `--json` writes it: the shared record plus how it was timed.
#[derive(serde::Serialize)]
struct GpuRecord {
    #[serde(flatten)]
    record: Record,
    /// `eager` or `graph`.
    mode: CaptureMode,
    /// Calls per timed iteration.
    inner: usize,
}

pub fn bench(o: BenchOpts) -> Result<(), String> {
    let world = ranks_or_gpus(o.ranks)?;
    if o.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    if launch_ranks(world, Duration::from_secs(60), false)? {
        return Ok(());
    }
    let seq_bytes = o.sequence.map_or(0, |(_, b)| b);
    let mut r = Rank::join(o.sizes.iter().copied().max().unwrap_or(0).max(seq_bytes), None)?;
    let root = r.root();
    let algos: Vec<Algorithm> = o.algos.iter().copied().filter(|a| *a != Algorithm::Nccl || r.nccl()).collect();
    if root {
        preamble(&r, "bench", None);
        println!(
            "#   time = median us per call over -n {} iterations (per iteration the slowest rank), p10/p90 = spread; \
             eager: {} calls back to back between two events; graph: the same calls captured once, replayed",
            o.iters, o.inner
        );
        if algos.len() < o.algos.len() {
            println!("#   NCCL is not measured: it did not join");
        }
    }
    let pb = bar(root, o.dtypes.len() * algos.len() * o.sizes.len());
    let mut records: Vec<GpuRecord> = Vec::new();
    let mut wrong_total = 0i64;
    for &d in &o.dtypes {
        for &algo in &algos {
            if root {
                pb.suspend(|| block_header(algo, world, &o.modes));
            }
            for &bytes in &o.sizes {
                let count = bytes / d.size();
                if count == 0 {
                    pb.inc(1);
                    continue;
                }
                pb.set_message(format!("{algo} {d} {bytes} B"));
                let wrong = if o.check {
                    let out = r.checked_dyn(d, Some(algo), (0xbe4c, bytes as u64 ^ (algo.code() << 40)), count, Io::OutOfPlace)?;
                    let v = r.agree(&out)?;
                    (v.wrong + v.inexact + usize::from(!v.identical) * count) as i64
                } else {
                    -1
                };
                wrong_total += wrong.max(0);
                let mut row = Vec::new();
                for &mode in &o.modes {
                    let times = r.time(algo, d, count, mode, o.inner, (o.warmup, o.iters))?;
                    if let Some(spread) = r.slowest(&times)? {
                        let record = Record::measured(algo, "cuda", d, world, count, spread, wrong);
                        row.push(record.clone());
                        records.push(GpuRecord { record, mode, inner: o.inner });
                    }
                }
                if root {
                    pb.suspend(|| print_row(&row));
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    if let Some((calls, bytes)) = o.sequence {
        sequence(&mut r, &o, calls, bytes, &algos)?;
    }
    if root {
        summary(&mut r, &records, &o);
        write_outputs(&records, &o)?;
    }
    r.comm.barrier().map_err(err)?;
    if wrong_total > 0 {
        return Err(format!("{wrong_total} wrong elements in total (see #wrong)"));
    }
    Ok(())
}

fn block_header(algo: Algorithm, world: usize, modes: &[CaptureMode]) {
    println!("#");
    println!("# algorithm: {algo}, ranks: {world} (one per GPU)");
    let mut h1 = format!("# {:>10} {:>12} {:>8} {:>6}", "size", "count", "type", "redop");
    let mut h2 = format!("# {:>10} {:>12} {:>8} {:>6}", "(B)", "(elements)", "", "");
    for m in modes {
        h1.push_str(&format!(" | {:>9} {:>9} {:>9} {:>7}", format!("{m} time"), "p10", "p90", "busbw"));
        h2.push_str(&format!(" | {:>9} {:>9} {:>9} {:>7}", "(us)", "(us)", "(us)", "(GB/s)"));
    }
    println!("{h1} | {:>6}", "#wrong");
    println!("{h2} |");
}

fn print_row(row: &[Record]) {
    let Some(f) = row.first() else { return };
    let mut s = format!("  {:>10} {:>12} {:>8} {:>6}", f.bytes, f.count, f.dtype.name(), "sum");
    for r in row {
        s.push_str(&format!(" | {:>9.2} {:>9.2} {:>9.2} {:>7.2}", r.time_us, r.p10_us, r.p90_us, r.busbw));
    }
    let wrong = if f.wrong < 0 { "N/A".to_string() } else { f.wrong.to_string() };
    println!("{s} | {wrong:>6}");
    let _ = std::io::stdout().flush();
}

/// Per size and mode: what the plan picks and its time, the fastest tpar kernel, and NCCL
/// measured in the same run.
fn summary(r: &mut Rank, records: &[GpuRecord], o: &BenchOpts) {
    println!("#");
    println!("# Summary: the plan's pick against NCCL measured in the same run (median us per call; speedup = NCCL / plan)");
    println!("# {:>6} {:>9} {:>10} {:>14} {:>9} {:>14} {:>9} {:>9} {:>8}", "mode", "type", "size (B)", "plan", "(us)", "best kernel", "(us)", "NCCL", "speedup");
    for &mode in &o.modes {
        r.comm.set_capture_mode(mode);
        for &d in &o.dtypes {
            for &bytes in &o.sizes {
                let at = |a: Algorithm| records.iter().find(|g| g.mode == mode && g.record.dtype == d && g.record.bytes == bytes && g.record.algorithm == a);
                let pick = r.comm.plan(d, bytes).algorithm;
                let best = records
                    .iter()
                    .filter(|g| g.mode == mode && g.record.dtype == d && g.record.bytes == bytes && g.record.algorithm != Algorithm::Nccl && g.record.wrong <= 0)
                    .min_by(|a, b| a.record.time_us.total_cmp(&b.record.time_us));
                let (Some(p), Some(b)) = (at(pick), best) else { continue };
                let (nccl, speed) = match at(Algorithm::Nccl) {
                    Some(n) => (format!("{:.2}", n.record.time_us), format!("{:.2}x", n.record.time_us / p.record.time_us)),
                    None => ("-".into(), "-".into()),
                };
                println!(
                    "  {:>6} {:>9} {:>10} {:>14} {:>9.2} {:>14} {:>9.2} {:>9} {:>8}",
                    mode.name(),
                    d.name(),
                    bytes,
                    pick.name(),
                    p.record.time_us,
                    b.record.algorithm.name(),
                    b.record.time_us,
                    nccl,
                    speed
                );
            }
        }
    }
    r.comm.set_capture_mode(CaptureMode::Eager);
}

/// `--sequence CALLSxBYTES`: a whole step of all-reduces, per algorithm and mode (bf16 when
/// measured, else the first dtype). The plan's pick is marked.
fn sequence(r: &mut Rank, o: &BenchOpts, calls: usize, bytes: usize, algos: &[Algorithm]) -> Result<(), String> {
    let d = if o.dtypes.contains(&DType::BF16) { DType::BF16 } else { o.dtypes[0] };
    let count = bytes / d.size();
    if count == 0 {
        return Err(format!("--sequence: {bytes} B is less than one {d} element"));
    }
    let root = r.root();
    if root {
        println!("#");
        println!("# Sequence: {calls} all-reduces of {bytes} B {d} per step (a decode or verify step); us per step, median [p10-p90] over -n iterations, slowest rank");
    }
    let mut rows: Vec<(Algorithm, Vec<Spread>)> = Vec::new();
    for &algo in algos {
        let mut cells = Vec::new();
        for &mode in &o.modes {
            let times = r.time(algo, d, count, mode, calls, (o.warmup.min(3), o.iters))?;
            if let Some((m, l, h)) = r.slowest(&times)? {
                cells.push((m * calls as f64, l * calls as f64, h * calls as f64));
            }
        }
        rows.push((algo, cells));
    }
    if root {
        let nccl: Option<Vec<Spread>> = rows.iter().find(|(a, _)| *a == Algorithm::Nccl).map(|(_, c)| c.clone());
        for (k, &mode) in o.modes.iter().enumerate() {
            r.comm.set_capture_mode(mode);
            let pick = r.comm.plan(d, bytes).algorithm;
            for (a, cells) in &rows {
                let Some(&(m, l, h)) = cells.get(k) else { continue };
                let vs = nccl.as_ref().and_then(|n| n.get(k)).map_or(String::new(), |n| format!("  NCCL/this {:.2}x", n.0 / m));
                let mark = if *a == pick { "  <- plan" } else { "" };
                println!("  {:>6} {:>14} {:>10.1} us [{:.1}-{:.1}]  {:>6.2} us per call{vs}{mark}", mode.name(), a.name(), m, l, h, m / calls as f64);
            }
        }
        r.comm.set_capture_mode(CaptureMode::Eager);
    }
    Ok(())
}

fn write_outputs(records: &[GpuRecord], o: &BenchOpts) -> Result<(), String> {
    if let Some(p) = &o.json {
        let s = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
        std::fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()))?;
        println!("# wrote {} records to {}", records.len(), p.display());
    }
    if let Some(p) = &o.svg {
        // One curve per algorithm: graph timings where measured (what a serving engine sees).
        let mode = if o.modes.contains(&CaptureMode::Graph) { CaptureMode::Graph } else { CaptureMode::Eager };
        let rs: Vec<Record> = records.iter().filter(|g| g.mode == mode).map(|g| g.record.clone()).collect();
        tpar::plot::latency_svg(&rs, p).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// tpar check --backend cuda

/// What `tpar check --backend cuda` verifies across GPUs.
pub struct CheckOpts {
    pub ranks: Option<usize>,
    pub dtypes: Vec<DType>,
    pub algos: Vec<Algorithm>,
    pub max_bytes: usize,
    pub calls: u64,
    pub seed: u64,
    pub quiet: bool,
    /// Hidden fault test: this rank SIGKILLs itself mid-sequence.
    pub kill_rank: Option<usize>,
    /// Hidden: every rank on GPU 0, planning for this topology (preset or JSON), to test the
    /// multi-process path on a one-GPU machine. Calls the plan sends to NCCL fail there
    /// (NCCL refuses two ranks on one GPU), so keep -e below the topology's NCCL threshold.
    pub plan_topology: Option<String>,
    /// Hidden: the last rank calls with another dtype, then another count, than the others.
    pub mismatch_test: bool,
}

/// Counts of the sweep for `d`: the CPU check's small ones, then 1 B to `max_bytes` by
/// factors of 4, each also with one element more (odd tails) where it fits.
fn sweep_counts(d: DType, max_bytes: usize) -> Vec<usize> {
    let max = max_bytes / d.size();
    let mut v: Vec<usize> = vec![0, 1, 7, 16, 1000];
    let mut b = 1usize;
    while b <= max_bytes {
        let n = (b / d.size()).max(1);
        v.push(n);
        v.push(n + 1);
        b *= 4;
    }
    v.push(max);
    v.retain(|&n| n <= max);
    v.sort_unstable();
    v.dedup();
    v
}

/// Log-uniform in 1..=max: small and large calls both appear often.
fn log_uniform(g: &mut SplitMix, max: usize) -> usize {
    let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((max as f64).ln() * u).exp().clamp(1.0, max as f64) as usize
}

pub fn check(o: CheckOpts) -> Result<(), String> {
    let shared = match &o.plan_topology {
        Some(t) => Some(tpar::Topology::load(t).map_err(err)?),
        None => None,
    };
    let world = match (&shared, o.ranks) {
        (Some(_), r) => r.unwrap_or(2),
        (None, r) => ranks_or_gpus(r)?,
    };
    if let Some(k) = o.kill_rank {
        return fault(world, k, o.seed, o.max_bytes, shared.as_ref());
    }
    if o.mismatch_test {
        return mismatch(world, shared.as_ref());
    }
    if launch_ranks(world, Duration::from_secs(60), shared.is_some())? {
        return Ok(());
    }
    let mut r = Rank::join(o.max_bytes, shared.as_ref())?;
    let root = r.root();
    // None = through the plan; then every algorithm forced.
    let mut variants: Vec<Option<Algorithm>> = vec![None];
    variants.extend(o.algos.iter().copied().filter(|a| *a != Algorithm::Nccl || r.nccl()).map(Some));
    let label = |v: Option<Algorithm>| v.map_or("plan".to_string(), |a| a.name().to_string());
    if root && !o.quiet {
        preamble(&r, "check", o.plan_topology.as_deref());
        println!("#   variants: {}", variants.iter().map(|v| label(*v)).collect::<Vec<_>>().join(", "));
    }
    let mut failures: Vec<String> = Vec::new();
    let mut note = |v: &Verdict, what: String| {
        if !v.ok() {
            failures.push(format!("{what} ({}): {} wrong, {} differ from the rank-order sum, ranks identical: {}", v.algo, v.wrong, v.inexact, v.identical));
        }
    };
    let t0 = Instant::now();
    let mut call = 0u64;
    let mut sweep_calls = 0u64;
    let total: usize = o.dtypes.iter().map(|d| sweep_counts(*d, o.max_bytes).len()).sum::<usize>() * variants.len();
    let pb = bar(root, total);
    for &d in &o.dtypes {
        for &v in &variants {
            for n in sweep_counts(d, o.max_bytes) {
                pb.set_message(format!("sweep {} {d} {n}", label(v)));
                let io = match call % 8 {
                    3 | 7 => Io::InPlace,
                    5 => Io::CallerStream,
                    _ => Io::OutOfPlace,
                };
                let out = r.checked_dyn(d, v, (o.seed, call), n, io)?;
                let verdict = r.agree(&out)?;
                note(&verdict, format!("sweep {} {d} count {n}{}", label(v), io.label()));
                call += 1;
                sweep_calls += 1;
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let sweep_s = t0.elapsed().as_secs_f64();
    let mut g = SplitMix::new(o.seed ^ 0x5e9_5a17);
    let mut used: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let pb = bar(root, o.calls as usize);
    for i in 0..o.calls {
        let d = o.dtypes[g.below(o.dtypes.len() as u64) as usize];
        let v = variants[g.below(variants.len() as u64) as usize];
        let n = log_uniform(&mut g, o.max_bytes / d.size());
        let io = match g.below(8) {
            0 | 1 => Io::InPlace,
            2 => Io::CallerStream,
            _ => Io::OutOfPlace,
        };
        let out = r.checked_dyn(d, v, (o.seed, call), n, io)?;
        let verdict = r.agree(&out)?;
        *used.entry(verdict.algo.name()).or_default() += 1;
        note(&verdict, format!("random call {i}: {} {d} count {n}{}", label(v), io.label()));
        call += 1;
        if i % 256 == 0 {
            pb.set_position(i);
        }
    }
    pb.finish_and_clear();
    r.comm.barrier().map_err(err)?;
    if !root {
        return if failures.is_empty() { Ok(()) } else { Err(format!("{} failed calls", failures.len())) };
    }
    if !o.quiet {
        println!(
            "#   sweep: {} dtypes x {} variants x counts 0..{} (1 B to {} by x4, odd tails; of every 8 calls 2 in place, 1 through a caller's stream): {sweep_calls} calls, {sweep_s:.1} s",
            o.dtypes.len(),
            variants.len(),
            o.max_bytes,
            tpar::plan::human_bytes(o.max_bytes as u64)
        );
        println!(
            "#   random: {} calls, dtype, variant and log-uniform size to {} drawn from seed {} (a quarter in place, an eighth through a caller's stream), {:.1} s; algorithms that ran: {used:?}",
            o.calls,
            tpar::plan::human_bytes(o.max_bytes as u64),
            o.seed,
            t0.elapsed().as_secs_f64() - sweep_s
        );
        println!("#   each call: fresh random inputs, output poisoned, compared with the f64 sum (tpar's kernels: one rounding, and bitwise with the rank-order f32 sum; NCCL: a rounding per partial sum); all ranks' outputs compared bitwise");
    }
    for f in failures.iter().take(200) {
        println!("  FAIL {f}");
    }
    if failures.len() > 200 {
        println!("  ... and {} more", failures.len() - 200);
    }
    let verdict = if failures.is_empty() { "PASS" } else { "FAIL" };
    println!("{verdict}: {} ranks, {call} calls per rank, {} failed", r.comm.world(), failures.len());
    if failures.is_empty() {
        Ok(())
    } else {
        Err("check failed".into())
    }
}

/// Hidden `--kill-rank K`: rank K SIGKILLs itself after 200 calls of `bytes` (bf16) each,
/// through the plan (tpar's kernels or NCCL, by size); every other rank must get an error
/// (not hang) within its bound, then Poisoned.
fn fault(world: usize, kill: usize, seed: u64, bytes: usize, shared: Option<&tpar::Topology>) -> Result<(), String> {
    if kill >= world {
        return Err(format!("--kill-rank {kill}: there are only {world} ranks"));
    }
    if !launch::is_rank() {
        let timeout = std::env::var("TPAR_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok()).map_or(tpar::comm::DEFAULT_TIMEOUT, Duration::from_millis);
        let t0 = Instant::now();
        let r = launch_ranks(world, timeout * 3 + Duration::from_secs(30), shared.is_some());
        let failures = match r {
            Ok(_) => return Err(format!("fault test: rank {kill} was to kill itself, but every rank exited 0")),
            Err(e) => e,
        };
        let others: Vec<&str> = failures.split("; ").filter(|f| !f.starts_with(&format!("rank {kill} "))).collect();
        println!("# fault test: launcher saw \"{failures}\" after {:.1} s", t0.elapsed().as_secs_f64());
        if !others.is_empty() {
            return Err(format!("fault test: survivors failed the test: {}", others.join("; ")));
        }
        println!("PASS: rank {kill} was SIGKILLed; every other rank got an error within its bound and exited cleanly");
        return Ok(());
    }
    let cfg = tpar::Config::from_env().map_err(err)?;
    let mut r = Rank::join(bytes, shared)?;
    let rank = r.comm.rank();
    let d = DType::BF16;
    let count = (bytes / 2).max(1);
    if rank == 0 {
        println!("# fault test: {world} ranks, calls of {bytes} B bf16 through the plan ({}), rank {kill} dies after 200", r.comm.plan(d, count * 2).algorithm);
    }
    let inputs = all_inputs::<bf16>(seed, 0, world, count);
    r.input.upload(&inputs[rank]).map_err(err)?;
    let (i, o) = (r.input.ptr, r.output.ptr);
    let t0 = Instant::now();
    let bound = cfg.timeout * 2 + Duration::from_secs(5);
    let mut calls = 0u64;
    loop {
        if rank == kill && calls == 200 {
            say_err(format!("[rank {rank}] fault test: SIGKILL to myself after {calls} calls"));
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        let t = Instant::now();
        // SAFETY: both buffers hold max(bytes, 16) B >= count bf16 elements and live past synchronize.
        let res = unsafe { r.comm.all_reduce(d, count, i, o) }.map_err(err).and_then(|_| r.comm.synchronize().map_err(err));
        calls += 1;
        if let Err(x) = res {
            let waited = t.elapsed();
            say_err(format!(
                "[rank {rank}] fault test: error after {calls} calls, {:.0} ms into the failing call (timeout {} ms): {x}",
                waited.as_secs_f64() * 1e3,
                cfg.timeout.as_millis()
            ));
            // SAFETY: as above.
            let again = unsafe { r.comm.all_reduce(d, count, i, o) }.map_err(err).and_then(|_| r.comm.synchronize().map_err(err));
            say_err(format!("[rank {rank}] fault test: the next call: {}", again.as_ref().err().map_or("succeeded", |s| s.as_str())));
            if again.is_ok() {
                return Err(format!("rank {rank}: a call after the failure succeeded; the group should be poisoned"));
            }
            if waited > bound {
                return Err(format!("rank {rank}: the error took {:.1} s, beyond {:.1} s", waited.as_secs_f64(), bound.as_secs_f64()));
            }
            return Ok(());
        }
        if t0.elapsed() > bound * 2 + Duration::from_secs(10) {
            return Err(format!("rank {rank}: no error after {calls} calls in {:.0} s", t0.elapsed().as_secs_f64()));
        }
    }
}

/// Hidden `--mismatch-test`: after an honest call, the last rank calls bf16 where the others
/// call f16 (same bytes, so only the call descriptors differ); every rank must get an error,
/// not a sum of mismatched data.
fn mismatch(world: usize, shared: Option<&tpar::Topology>) -> Result<(), String> {
    if launch_ranks(world, Duration::from_secs(60), shared.is_some())? {
        println!("PASS: every rank got an error for a call whose dtype or count differed on rank {}", world - 1);
        return Ok(());
    }
    let mut r = Rank::join(64 << 10, shared)?;
    let rank = r.comm.rank();
    let last = rank + 1 == world;
    let count = 21504;
    r.input.fill_u32(TIMING_WORD).map_err(err)?;
    let (i, o) = (r.input.ptr, r.output.ptr);
    let call = |r: &mut Rank, d: DType, n: usize| {
        // SAFETY: both buffers hold 64 KiB >= n elements of d; synchronize follows.
        unsafe { r.comm.all_reduce_with(Algorithm::OneshotPush, d, n, i, o) }.map_err(err).and_then(|_| r.comm.synchronize().map_err(err))
    };
    call(&mut r, DType::BF16, count).map_err(|e| format!("rank {rank}: the honest call failed: {e}"))?;
    let d = if last { DType::BF16 } else { DType::F16 };
    match call(&mut r, d, count) {
        Ok(()) => return Err(format!("rank {rank}: a call whose dtype differed on rank {} succeeded", world - 1)),
        Err(e) => say_err(format!("[rank {rank}] mismatch test, dtype: {e}")),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// tpar tune --backend cuda

/// What `tpar tune --backend cuda` measures.
pub struct TuneOpts {
    pub ranks: Option<usize>,
    pub sizes: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub capture: CaptureMode,
    pub iters: usize,
    pub warmup: usize,
    pub inner: usize,
    pub out: PathBuf,
}

/// Bit-exact screening on inputs whose sums are exact in any order (so NCCL can pass too).
fn screen<T: Element>(r: &mut Rank, algo: Algorithm, count: usize) -> Result<bool, String> {
    let mut ok = true;
    for kind in Special::ALL {
        let inputs = special_inputs::<T>(kind, r.comm.world(), count);
        r.input.upload(&inputs[r.comm.rank()]).map_err(err)?;
        r.output.fill_u32(POISON_WORD).map_err(err)?;
        // SAFETY: both buffers hold max_bytes >= count * T's size and live past synchronize.
        unsafe { r.comm.all_reduce_with(algo, T::DTYPE, count, r.input.ptr, r.output.ptr) }.map_err(err)?;
        r.comm.synchronize().map_err(err)?;
        let mut out = vec![T::from_f32(0.0); count];
        r.output.download(&mut out).map_err(err)?;
        ok &= is_exact(&out, &inputs);
    }
    Ok(ok)
}

pub fn tune(o: TuneOpts) -> Result<(), String> {
    let world = ranks_or_gpus(o.ranks)?;
    if launch_ranks(world, Duration::from_secs(60), false)? {
        println!("use it with: TPAR_PROFILE={} (or tpar plan --profile {})", o.out.display(), o.out.display());
        return Ok(());
    }
    let mut r = Rank::join(o.sizes.iter().copied().max().unwrap_or(0), None)?;
    let root = r.root();
    let algos: Vec<Algorithm> = cuda_algorithms().into_iter().filter(|a| *a != Algorithm::Nccl || r.nccl()).collect();
    let pb = bar(root, o.dtypes.len() * algos.len() * o.sizes.len());
    let (mut records, mut rejected) = (Vec::new(), Vec::new());
    for &d in &o.dtypes {
        for &algo in &algos {
            for &bytes in &o.sizes {
                let count = bytes / d.size();
                if count == 0 {
                    pb.inc(1);
                    continue;
                }
                pb.set_message(format!("{algo} {d} {bytes} B"));
                let exact = match d {
                    DType::F32 => screen::<f32>(&mut r, algo, count)?,
                    DType::F16 => screen::<f16>(&mut r, algo, count)?,
                    DType::BF16 => screen::<bf16>(&mut r, algo, count)?,
                };
                let all_exact = r.comm.all_gather_bytes(&[u8::from(exact)]).map_err(err)?.iter().all(|b| b.first() == Some(&1));
                let times = r.time(algo, d, count, o.capture, o.inner, (o.warmup, o.iters))?;
                if let Some(spread) = r.slowest(&times)? {
                    if !all_exact {
                        rejected.push(format!("{algo} {d} {bytes} B"));
                    }
                    pb.suspend(|| say_err(format!("tune: {:>6} {d:>9} {algo:>13} {bytes:>9} B {:>9.2} us", o.capture.name(), spread.0)));
                    records.push(Record::measured(algo, "cuda", d, world, count, spread, i64::from(!all_exact)));
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    r.comm.barrier().map_err(err)?;
    if !root {
        return Ok(());
    }
    let fp = ProfileFingerprint::new(r.comm.topology(), None, Backend::Cuda, world, o.capture);
    let profile = Profile::from_measurements(&records, fp);
    profile.save(&o.out).map_err(err)?;
    println!("# tpar tune --backend cuda: {world} ranks (one per GPU), {} mode, {} points measured, wrote {}", o.capture, records.len(), o.out.display());
    if rejected.is_empty() {
        println!("# every candidate was bit-exact on small integers, signed zeros and near-max values");
    } else {
        println!("# rejected (not bit-exact): {}", rejected.join(", "));
    }
    for line in profile.describe() {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_counts_cover_tails_and_stay_within_the_workspace() {
        let c = sweep_counts(DType::BF16, 16 << 20);
        assert_eq!(c.first(), Some(&0));
        assert_eq!(c.last(), Some(&(8 << 20)));
        assert!(c.contains(&1) && c.contains(&3) && c.contains(&(1 << 19)) && c.contains(&((1 << 19) + 1)));
        assert!(c.windows(2).all(|w| w[0] < w[1]));
        let f = sweep_counts(DType::F32, 1000);
        assert!(f.iter().all(|&n| n <= 250), "{f:?}");
    }

    #[test]
    fn log_uniform_spans_the_range() {
        let mut g = SplitMix::new(7);
        let xs: Vec<usize> = (0..20000).map(|_| log_uniform(&mut g, 1 << 20)).collect();
        assert!(xs.iter().all(|&x| (1..=1 << 20).contains(&x)));
        assert!(xs.iter().filter(|&&x| x < 64).count() > 3000, "small sizes are common");
        assert!(xs.iter().filter(|&&x| x > 1 << 18).count() > 1000, "large sizes appear");
    }

    #[test]
    fn cuda_algos_refuse_what_has_no_kernel() {
        assert_eq!(parse_cuda_algos("all").unwrap().last(), Some(&Algorithm::Nccl));
        assert!(parse_cuda_algos("gather-bcast").unwrap_err().contains("no CUDA kernel"));
        assert_eq!(parse_cuda_algos("oneshot-push,nccl").unwrap(), vec![Algorithm::OneshotPush, Algorithm::Nccl]);
    }
}
