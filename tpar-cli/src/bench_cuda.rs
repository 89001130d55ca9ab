//! `tpar bench-cuda`: the CUDA backend's benchmark and GPU self-checks, with nccl-tests'
//! flags and table. Emulated ranks only for now (`--emulate-ranks N`): N ranks on one GPU.
//! To be folded into `tpar bench --backend cuda`.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{DeviceBuffer, Event};
use tpar::cuda::emulated::{default_blocks, DEFAULT_MAX_BLOCKS};
use tpar::cuda::kernels::KERNEL_ALGORITHMS;
use tpar::cuda::{EmulatedGroup, GroupOptions};
use crate::util::parse_size;
use tpar::report::{bandwidths, Record};
use tpar::{Algorithm, DType, Transport};

#[derive(clap::Args, Debug, Clone)]
pub struct BenchCudaArgs {
    /// Smallest message in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub minbytes: usize,
    /// Largest message in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "8M", value_parser = parse_size)]
    pub maxbytes: usize,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub stepfactor: usize,
    /// Timed iterations (graph replays with --graph).
    #[arg(short = 'n', long = "iters", default_value_t = 200)]
    pub iters: usize,
    /// Warm-up iterations.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 20)]
    pub warmup: usize,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Data types: float, half, bfloat16, a comma list, or all.
    #[arg(short = 'd', long = "datatype", default_value = "bfloat16")]
    pub datatype: String,
    /// Algorithms: a comma list or all (nccl included).
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Emulated ranks on one GPU: a world size or a comma list (e.g. 2,3,4,8).
    #[arg(long = "emulate-ranks", required = true)]
    pub emulate_ranks: String,
    /// Time inside a captured CUDA graph (--graph-inner calls per graph).
    #[arg(long)]
    pub graph: bool,
    /// All-reduces per captured graph with --graph.
    #[arg(long = "graph-inner", default_value_t = 20)]
    pub graph_inner: usize,
    /// A whole verify step: CALLSxBYTES (e.g. 122x43008) captured in one graph, replays timed.
    #[arg(long)]
    pub sequence: Option<String>,
    /// Write the records as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Workspace transport: p2p (device memory) or host (pinned host memory over PCIe).
    #[arg(long, default_value = "p2p")]
    pub transport: String,
    /// Blocks per rank (default: the launch policy, tpar::cuda::launch::blocks_for, which honours TPAR_BLOCKS; --max-blocks caps only the random blocks of --stress and the floor).
    #[arg(long)]
    pub blocks: Option<u32>,
    #[arg(long = "max-blocks", default_value_t = DEFAULT_MAX_BLOCKS)]
    pub max_blocks: u32,
    /// Device-side deadline of every wait.
    #[arg(long = "timeout-ms", env = "TPAR_TIMEOUT_MS", default_value_t = 5000)]
    pub timeout_ms: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Only check correctness (no timing); with --odd also counts n-1, n+1 and 1.
    #[arg(long = "check-only")]
    pub check_only: bool,
    #[arg(long)]
    pub odd: bool,
    /// Run N all-reduces of random algorithm, dtype and size (up to -e), each checked.
    #[arg(long)]
    pub stress: Option<usize>,
    /// Timeout test: the last rank never arrives; expect Error::Timeout within the deadline.
    #[arg(long = "timeout-test")]
    pub timeout_test: bool,
    /// Skewed ranks (test): before every call each rank waits a random time on the device,
    /// half the calls 0, else up to this many ns (per rank, per call; eager and in graphs).
    #[arg(long = "skew-ns")]
    pub skew_ns: Option<u32>,
    /// Mismatch test: the last rank announces another call (dtype, algorithm or count) than
    /// it runs; expect Error::Mismatch naming it, never a silent result.
    #[arg(long = "mismatch-test")]
    pub mismatch_test: bool,
    /// Graph test: capture --sequence (default 122x43008), replay N times, check every output.
    #[arg(long = "graph-test")]
    pub graph_test: Option<usize>,
    /// Start every rank's epoch here (wrap-around test, e.g. 4294967290).
    #[arg(long = "epoch-start")]
    pub epoch_start: Option<u32>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Two-process CUDA IPC test on this GPU: spawn a second `tpar` process as rank 1,
    /// exchange IPC handles over its stdin/stdout, run checked all-reduces and timings.
    #[arg(long = "ipc-test")]
    pub ipc_test: bool,
    /// NCCL over tpar's rendezvous: 2 rank processes, unique id carried by the control plane,
    /// one all-reduce checked if NCCL accepts the placement (it refuses 2 ranks on one GPU:
    /// then the test checks that every rank gets that error instead of hanging).
    #[arg(long = "nccl-rdzv-test")]
    pub nccl_rdzv_test: bool,
}

/// TPAR_CHECK_CALLS (default on): whether emulated groups compare every call across ranks.
fn check_calls_from_env() -> Result<bool, String> {
    Ok(tpar::Overrides::from_env().map_err(|e| e.to_string())?.check_calls != Some(false))
}

fn parse_list<T>(s: &str, all: &[T], parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String>
where
    T: Copy,
{
    if s.trim() == "all" {
        return Ok(all.to_vec());
    }
    s.split(',').map(|x| parse(x.trim())).collect()
}

/// A rank's input and output buffers.
struct RankBufs {
    input: DeviceBuffer,
    output: DeviceBuffer,
}

fn alloc_bufs(g: &EmulatedGroup, bytes: usize) -> Result<Vec<RankBufs>, String> {
    let b = bytes.div_ceil(VEC_BYTES) * VEC_BYTES;
    (0..g.world())
        .map(|_| {
            Ok(RankBufs {
                input: DeviceBuffer::new(g.device(), b).map_err(|e| e.to_string())?,
                output: DeviceBuffer::new(g.device(), b).map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

fn ptrs(bufs: &[RankBufs]) -> (Vec<u64>, Vec<u64>) {
    (bufs.iter().map(|b| b.input.ptr).collect(), bufs.iter().map(|b| b.output.ptr).collect())
}

fn eps(d: DType) -> f64 {
    match d {
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 9.765625e-4,
        DType::BF16 => 7.8125e-3,
    }
}

fn quantize(d: DType, v: f32) -> (u32, f64) {
    match d {
        DType::F32 => (v.to_bits(), v as f64),
        DType::F16 => {
            let h = f16::from_f32(v);
            (h.to_bits() as u32, h.to_f64())
        }
        DType::BF16 => {
            let h = bf16::from_f32(v);
            (h.to_bits() as u32, h.to_f64())
        }
    }
}

fn decode(d: DType, bytes: &[u8], i: usize) -> f64 {
    match d {
        DType::F32 => f32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]) as f64,
        DType::F16 => f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64(),
    }
}

/// Fresh random inputs (never zeros) for every rank; returns per-element f64 sum and sum|x|.
fn fill_inputs(bufs: &[RankBufs], d: DType, count: usize, rng: &mut StdRng) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut sum = vec![0f64; count];
    let mut abs = vec![0f64; count];
    for b in bufs {
        let mut raw: Vec<u8> = Vec::with_capacity(count * d.size());
        for i in 0..count {
            let mut v: f32 = rng.gen_range(-1.0f32..1.0f32);
            if v == 0.0 {
                v = 0.5;
            }
            let (bits, q) = quantize(d, v);
            sum[i] += q;
            abs[i] += q.abs();
            match d.size() {
                4 => raw.extend_from_slice(&bits.to_le_bytes()),
                _ => raw.extend_from_slice(&(bits as u16).to_le_bytes()),
            }
        }
        b.input.upload(&raw).map_err(|e| e.to_string())?;
    }
    Ok((sum, abs))
}

fn poison(bufs: &[RankBufs]) -> Result<(), String> {
    for b in bufs {
        b.output.fill_u32(0xFFFF_FFFF).map_err(|e| e.to_string())?; // NaN in every dtype
    }
    Ok(())
}

/// Elements outside tolerance of the f64 reference, plus elements where a rank's output
/// bits differ from rank 0's.
fn verify(bufs: &[RankBufs], d: DType, count: usize, sum: &[f64], abs: &[f64], world: usize) -> Result<i64, String> {
    let outs: Vec<&DeviceBuffer> = bufs.iter().map(|b| &b.output).collect();
    verify_bufs(&outs, d, count, sum, abs, world)
}

fn verify_bufs(outs: &[&DeviceBuffer], d: DType, count: usize, sum: &[f64], abs: &[f64], world: usize) -> Result<i64, String> {
    let nbytes = count * d.size();
    let mut first: Vec<u8> = Vec::new();
    let mut wrong = 0i64;
    for (r, b) in outs.iter().enumerate() {
        let mut out = vec![0u8; nbytes];
        b.download(&mut out).map_err(|e| e.to_string())?;
        if r == 0 {
            for i in 0..count {
                let o = decode(d, &out, i);
                let tol = eps(d) * world as f64 * abs[i];
                if !o.is_finite() || (o - sum[i]).abs() > tol {
                    wrong += 1;
                }
            }
            first = out;
        } else if out != first {
            let es = d.size();
            wrong += (0..count).filter(|i| out[i * es..(i + 1) * es] != first[i * es..(i + 1) * es]).count() as i64;
        }
    }
    Ok(wrong)
}

struct Ctx {
    g: EmulatedGroup,
    bufs: Vec<RankBufs>,
    rng: StdRng,
}

impl Ctx {
    fn check_one(&mut self, algo: Algorithm, d: DType, count: usize, blocks: u32) -> Result<i64, String> {
        self.check_one_mode(algo, d, count, blocks, false)
    }

    /// One checked call; `in_place` reduces into the inputs (output pointer = input pointer).
    fn check_one_mode(&mut self, algo: Algorithm, d: DType, count: usize, blocks: u32, in_place: bool) -> Result<i64, String> {
        let (sum, abs) = fill_inputs(&self.bufs, d, count, &mut self.rng)?;
        poison(&self.bufs)?;
        let (i, o) = ptrs(&self.bufs);
        let o = if in_place { i.clone() } else { o };
        self.g.all_reduce(algo, d, count, &i, &o, blocks).map_err(|e| e.to_string())?;
        if in_place {
            let outs: Vec<&DeviceBuffer> = self.bufs.iter().map(|b| &b.input).collect();
            return verify_bufs(&outs, d, count, &sum, &abs, self.g.world());
        }
        verify(&self.bufs, d, count, &sum, &abs, self.g.world())
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (percentile(&v, 0.5), percentile(&v, 0.1), percentile(&v, 0.9))
}

fn sizes(args: &BenchCudaArgs) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = args.minbytes.max(1);
    while s <= args.maxbytes {
        out.push(s);
        if args.stepfactor <= 1 {
            break;
        }
        s *= args.stepfactor;
    }
    out
}

fn counts_for(bytes: usize, d: DType, odd: bool) -> Vec<usize> {
    let n = (bytes / d.size()).max(1);
    let mut v = vec![n];
    // Odd counts (tails) up to 1 MiB; beyond that the nominal count only, to keep the
    // host-side reference affordable.
    if odd && bytes <= (1 << 20) {
        for c in [1usize, n.saturating_sub(1), n + 1, n + 7] {
            if c >= 1 && c * d.size() <= bytes.max(d.size()) + 7 * d.size() && !v.contains(&c) {
                v.push(c);
            }
        }
    }
    v
}

/// What one timed call enqueues.
#[derive(Clone, Copy)]
enum Op {
    AllReduce(Algorithm),
    /// The empty kernel on every rank: the launch floor of emulation.
    Floor,
}

/// Time per call in microseconds: eager (events around one enqueue) or graph (replays of
/// `inner` captured calls, divided by `inner`).
#[allow(clippy::too_many_arguments)]
fn time_calls(c: &mut Ctx, op: Op, d: DType, count: usize, blocks: u32, args: &BenchCudaArgs, inner: usize, graph: bool) -> Result<Vec<f64>, String> {
    let e = |x: tpar::Error| x.to_string();
    let (i, o) = ptrs(&c.bufs);
    let enqueue = |g: &mut EmulatedGroup| match op {
        Op::AllReduce(algo) => g.enqueue(algo, d, count, &i, &o, blocks),
        Op::Floor => g.enqueue_floor(blocks, &i, &o),
    };
    let start = Event::new(c.g.device()).map_err(e)?;
    let end = Event::new(c.g.device()).map_err(e)?;
    let mut samples = Vec::with_capacity(args.iters);
    c.g.prepare(d).map_err(e)?;
    if graph {
        let gr = c
            .g
            .capture(|g| {
                for _ in 0..inner {
                    enqueue(g)?;
                }
                Ok(())
            })
            .map_err(e)?;
        for _ in 0..args.warmup.max(1) {
            c.g.launch(&gr).map_err(e)?;
        }
        c.g.synchronize().map_err(e)?;
        for _ in 0..args.iters {
            c.g.origin().record(&start).map_err(e)?;
            c.g.launch(&gr).map_err(e)?;
            c.g.origin().record(&end).map_err(e)?;
            end.synchronize().map_err(e)?;
            samples.push(start.elapsed_ms(&end).map_err(e)? as f64 * 1e3 / inner as f64);
        }
        c.g.synchronize().map_err(e)?;
    } else {
        for _ in 0..args.warmup {
            enqueue(&mut c.g).map_err(e)?;
            c.g.synchronize().map_err(e)?;
        }
        for _ in 0..args.iters {
            c.g.origin().record(&start).map_err(e)?;
            enqueue(&mut c.g).map_err(e)?;
            c.g.origin().record(&end).map_err(e)?;
            c.g.synchronize().map_err(e)?;
            samples.push(start.elapsed_ms(&end).map_err(e)? as f64 * 1e3);
        }
    }
    Ok(samples)
}

/// Prints the launch floor of emulation for this world and grid.
fn print_floor(c: &mut Ctx, args: &BenchCudaArgs, blocks: u32, inner: usize, graph: bool) -> Result<f64, String> {
    let (med, p10, p90) = stats(time_calls(c, Op::Floor, DType::BF16, 1, blocks, args, inner, graph)?);
    println!(
        "# launch floor: an empty kernel ({blocks} block(s) x 512 threads) on each of {} ranks, launched like a collective ({}): {med:.2} us per call (p10 {p10:.2}, p90 {p90:.2})",
        c.g.world(),
        if graph { format!("graph of {inner}") } else { "eager".to_string() }
    );
    Ok(med)
}

fn header(algo: &str, world: usize, d: DType, transport: Transport, mode: &str, gpu: &str) {
    println!("#");
    println!("# algorithm {algo}  ranks {world} (emulated on one {gpu})  transport {transport}  type {d}  timing {mode}");
    println!("# {:>10} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8} {:>8} {:>7}", "size", "count", "type", "redop", "time", "p10", "p90", "algbw", "busbw", "#wrong");
    println!("# {:>10} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8} {:>8} {:>7}", "(B)", "(elements)", "", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "");
}

pub fn run(args: BenchCudaArgs) -> Result<(), String> {
    let worlds: Vec<usize> = parse_list(&args.emulate_ranks, &[], |x| x.parse::<usize>().map_err(|e| format!("--emulate-ranks {x:?}: {e}")))?;
    let dtypes: Vec<DType> = parse_list(&args.datatype, &DType::ALL, |x| x.parse::<DType>().map_err(|e| e.to_string()))?;
    let mut all_algos: Vec<Algorithm> = KERNEL_ALGORITHMS.to_vec();
    all_algos.push(Algorithm::Nccl);
    let algos: Vec<Algorithm> = parse_list(&args.algo, &all_algos, |x| x.parse::<Algorithm>().map_err(|e| e.to_string()))?;
    let transport: Transport = args.transport.parse().map_err(|e: tpar::Error| e.to_string())?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let check_calls = check_calls_from_env()?;
    if args.ipc_test {
        return ipc::run(&args, &dtypes, &algos);
    }
    if args.nccl_rdzv_test {
        return nccl_rdzv_test(&args);
    }
    let mut records = Vec::new();
    let seq = match &args.sequence {
        Some(s) => Some(parse_sequence(s)?),
        None => None,
    };

    for &world in &worlds {
        let max_bytes = match seq {
            Some((_, b)) => args.maxbytes.max(b),
            None => args.maxbytes,
        }
        .max(16);
        if args.timeout_test {
            timeout_test(&args, world, transport)?;
            continue;
        }
        if args.mismatch_test {
            mismatch_test(&args, world, transport)?;
            continue;
        }
        let t0 = Instant::now();
        let g = EmulatedGroup::new(args.device, world, max_bytes, GroupOptions { transport, timeout, check_calls }).map_err(|e| e.to_string())?;
        let gpu = g.device().name.clone();
        eprintln!("# group: {world} emulated ranks on {gpu} ({}), transport {transport}, max {max_bytes} B, ready in {:.0} ms", g.device().arch(), t0.elapsed().as_secs_f64() * 1e3);
        let bufs = alloc_bufs(&g, max_bytes)?;
        let mut c = Ctx { g, bufs, rng: StdRng::seed_from_u64(args.seed ^ world as u64) };
        if let Some(ns) = args.skew_ns {
            c.g.set_skew_for_test(Some((args.seed, ns)));
            eprintln!("# skewed ranks: random delays of 0..{ns} ns before calls, per rank and call");
        }
        if let Some(e) = args.epoch_start {
            c.g.set_epoch_for_test(e).map_err(|x| x.to_string())?;
            eprintln!("# epochs start at {e} (wrap-around test)");
        }
        if let Some(n) = args.stress {
            stress(&mut c, &args, n, &dtypes, &algos)?;
            continue;
        }
        if let Some(replays) = args.graph_test {
            graph_test(&mut c, &args, replays, seq.unwrap_or((122, 43008)), &dtypes)?;
            continue;
        }
        if let Some((calls, bytes)) = seq {
            sequence(&mut c, &args, calls, bytes, &dtypes, &algos, &mut records)?;
            continue;
        }
        if !args.check_only {
            let blocks = args.blocks.unwrap_or(1);
            print_floor(&mut c, &args, blocks, args.graph_inner.max(1), args.graph)?;
        }
        for &d in &dtypes {
            for &algo in &algos {
                if algo == Algorithm::Nccl {
                    println!("#\n# algorithm nccl  ranks {world}: not comparable here. NCCL refuses two ranks on one GPU, so");
                    println!("# only a 1-rank NCCL all-reduce can run (a local copy); it is shown to prove NCCL loads and runs,");
                    println!("# not as a baseline. Compare with NCCL on a multi-GPU machine.");
                    if let Err(e) = nccl_one_rank(&c, &args, d, &mut records) {
                        println!("# nccl: {e}");
                    }
                    continue;
                }
                let mode = if args.check_only { "none (check only)" } else if args.graph { "graph" } else { "eager, one host thread launches every rank" };
                header(algo.name(), world, d, transport, mode, &gpu);
                let mut total_wrong = 0i64;
                for bytes in sizes(&args) {
                    for count in counts_for(bytes, d, args.odd || args.check_only) {
                        let nbytes = count * d.size();
                        if nbytes > max_bytes {
                            continue;
                        }
                        let blocks = args.blocks.unwrap_or(0);
                        let wrong = if args.check == 1 { c.check_one(algo, d, count, blocks)? } else { -1 };
                        total_wrong += wrong.max(0);
                        if args.check_only {
                            println!("  {:>10} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8} {:>8} {:>7}", nbytes, count, d.name(), "sum", "-", "-", "-", "-", "-", wrong);
                            continue;
                        }
                        let samples = time_calls(&mut c, Op::AllReduce(algo), d, count, blocks, &args, args.graph_inner.max(1), args.graph)?;
                        let (med, p10, p90) = stats(samples);
                        let (algbw, busbw) = bandwidths(nbytes, world, med);
                        println!("  {:>10} {:>12} {:>9} {:>6} {:>10.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>7}", nbytes, count, d.name(), "sum", med, p10, p90, algbw, busbw, wrong);
                        let backend = format!("cuda-emulated-{transport}{}", if args.graph { "-graph" } else { "" });
                        records.push(Record::measured(algo, backend, d, world, count, (med, p10, p90), wrong));
                    }
                }
                println!("# {} total wrong: {total_wrong}", algo.name());
                if total_wrong != 0 {
                    write_json(&args, &records)?;
                    return Err(format!("{} ranks {world} {d}: {total_wrong} wrong elements", algo.name()));
                }
            }
        }
    }
    write_json(&args, &records)
}

fn write_json(args: &BenchCudaArgs, records: &[Record]) -> Result<(), String> {
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

pub(crate) fn parse_sequence(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(['x', 'X']).ok_or_else(|| format!("--sequence {s:?}: expected CALLSxBYTES, e.g. 122x43008"))?;
    let calls = a.trim().parse::<usize>().map_err(|e| format!("--sequence calls: {e}"))?;
    let bytes = parse_size(b)?;
    if calls == 0 || bytes == 0 {
        return Err("--sequence: calls and bytes must be positive".into());
    }
    Ok((calls, bytes))
}

/// A whole verify step: `calls` all-reduces of `bytes` captured in one graph; replays timed.
fn sequence(c: &mut Ctx, args: &BenchCudaArgs, calls: usize, bytes: usize, dtypes: &[DType], algos: &[Algorithm], records: &mut Vec<Record>) -> Result<(), String> {
    let world = c.g.world();
    println!("#\n# sequence: {calls} all-reduces of {bytes} B per graph replay (one verify step), {world} emulated ranks, transport {}", c.g.transport());
    println!("# {:>14} {:>9} {:>12} {:>10} {:>10} {:>12} {:>7}", "algorithm", "type", "step (us)", "p10", "p90", "per call", "#wrong");
    for &d in dtypes {
        let count = (bytes / d.size()).max(1);
        {
            let blocks = args.blocks.unwrap_or_else(|| default_blocks(count * d.size(), args.max_blocks));
            let (med, p10, p90) = stats(time_calls(c, Op::Floor, d, count, blocks, args, calls, true)?);
            let step = |x: f64| x * calls as f64;
            println!("  {:>14} {:>9} {:>12.1} {:>10.1} {:>10.1} {:>12.2} {:>7}", "floor(empty)", d.name(), step(med), step(p10), step(p90), med, "-");
        }
        for &algo in algos {
            if algo == Algorithm::Nccl {
                println!("  {:>14} {:>9}  not run: NCCL cannot place {world} ranks on one GPU", "nccl", d.name());
                continue;
            }
            let blocks = args.blocks.unwrap_or(0);
            let wrong = if args.check == 1 { c.check_one(algo, d, count, blocks)? } else { -1 };
            let samples = time_calls(c, Op::AllReduce(algo), d, count, blocks, args, calls, true)?;
            let (med, p10, p90) = stats(samples);
            let step = |x: f64| x * calls as f64;
            println!("  {:>14} {:>9} {:>12.1} {:>10.1} {:>10.1} {:>12.2} {:>7}", algo.name(), d.name(), step(med), step(p10), step(p90), med, wrong);
            let backend = format!("cuda-emulated-{}-sequence{calls}", c.g.transport());
            records.push(Record::measured(algo, backend, d, world, count, (med, p10, p90), wrong));
            if wrong > 0 {
                return Err(format!("{} {d}: {wrong} wrong", algo.name()));
            }
        }
    }
    Ok(())
}

/// N calls of random algorithm, dtype, count (log-uniform up to -e), each checked.
fn stress(c: &mut Ctx, args: &BenchCudaArgs, n: usize, dtypes: &[DType], algos: &[Algorithm]) -> Result<(), String> {
    let algos: Vec<Algorithm> = algos.iter().copied().filter(|a| *a != Algorithm::Nccl).collect();
    if algos.is_empty() {
        return Err("--stress needs at least one kernel algorithm".into());
    }
    let t0 = Instant::now();
    let mut wrong_calls = 0usize;
    let mut wrong_total = 0i64;
    let mut in_place_calls = 0usize;
    let max = args.maxbytes.min(c.g.max_bytes());
    for k in 0..n {
        let algo = algos[c.rng.gen_range(0..algos.len())];
        let d = dtypes[c.rng.gen_range(0..dtypes.len())];
        let max_count = (max / d.size()).max(1);
        let lg = c.rng.gen_range(0.0..(max_count as f64).log2().max(0.0) + 1e-9);
        let count = (2f64.powf(lg) as usize + c.rng.gen_range(0..3usize)).clamp(1, max_count);
        let blocks = c.rng.gen_range(1..=args.max_blocks.max(1));
        let in_place = c.rng.gen_range(0..4) == 0;
        in_place_calls += usize::from(in_place);
        let w = c.check_one_mode(algo, d, count, blocks, in_place)?;
        if w != 0 {
            wrong_calls += 1;
            wrong_total += w;
            eprintln!("stress call {k}: {} {d} count {count} blocks {blocks} in_place {in_place}: {w} wrong", algo.name());
        }
    }
    println!(
        "# stress: {n} calls ({in_place_calls} in place), {} emulated ranks, random algorithm/dtype/count (1..{} B)/blocks: {wrong_calls} wrong calls, {wrong_total} wrong elements, {:.1} s",
        c.g.world(),
        max,
        t0.elapsed().as_secs_f64()
    );
    if wrong_calls > 0 {
        return Err(format!("stress: {wrong_calls} calls wrong"));
    }
    Ok(())
}

/// Captures `calls` all-reduces (distinct outputs) in one graph, replays it `replays`
/// times, poisons the outputs before the last replay, and checks every output.
fn graph_test(c: &mut Ctx, args: &BenchCudaArgs, replays: usize, (calls, bytes): (usize, usize), dtypes: &[DType]) -> Result<(), String> {
    let e = |x: tpar::Error| x.to_string();
    let world = c.g.world();
    let algos: Vec<Algorithm> = KERNEL_ALGORITHMS.to_vec();
    for &d in dtypes {
        for algo in &algos {
            let count = (bytes / d.size()).max(1);
            let blocks = args.blocks.unwrap_or(0);
            let outs: Vec<Vec<DeviceBuffer>> = (0..calls)
                .map(|_| (0..world).map(|_| DeviceBuffer::new(c.g.device(), bytes.div_ceil(16) * 16)).collect::<Result<Vec<_>, _>>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            let (sum, abs) = fill_inputs(&c.bufs, d, count, &mut c.rng)?;
            let (i, _) = ptrs(&c.bufs);
            c.g.prepare(d).map_err(e)?;
            let e0 = c.g.epoch(0).map_err(e)?;
            let gr = c
                .g
                .capture(|g| {
                    for out in &outs {
                        let o: Vec<u64> = out.iter().map(|b| b.ptr).collect();
                        g.enqueue(*algo, d, count, &i, &o, blocks)?;
                    }
                    Ok(())
                })
                .map_err(e)?;
            let t0 = Instant::now();
            for _ in 0..replays.saturating_sub(1) {
                c.g.launch(&gr).map_err(e)?;
            }
            c.g.synchronize().map_err(e)?;
            for out in &outs {
                for b in out {
                    b.fill_u32(0xFFFF_FFFF).map_err(e)?;
                }
            }
            c.g.launch(&gr).map_err(e)?;
            c.g.synchronize().map_err(e)?;
            let secs = t0.elapsed().as_secs_f64();
            let mut wrong = 0i64;
            for out in &outs {
                        let refs: Vec<&DeviceBuffer> = out.iter().collect();
                wrong += verify_bufs(&refs, d, count, &sum, &abs, world)?;
            }
            let e1 = c.g.epoch(0).map_err(e)?;
            let expect = e0.wrapping_add((calls * replays) as u32);
            println!(
                "# graph test: {} {d} {world} ranks: {calls} calls x {replays} replays, epoch {e0} -> {e1} (expected {expect}), {wrong} wrong, {:.2} s",
                algo.name(),
                secs
            );
            if wrong != 0 || e1 != expect {
                return Err(format!("graph test failed for {}", algo.name()));
            }
        }
    }
    Ok(())
}

/// The last rank never launches; every algorithm must return Error::Timeout within about
/// the deadline and poison the group.
fn timeout_test(args: &BenchCudaArgs, world: usize, transport: Transport) -> Result<(), String> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let check_calls = check_calls_from_env()?;
    for algo in KERNEL_ALGORITHMS {
        let mut g = EmulatedGroup::new(args.device, world, 64 << 10, GroupOptions { transport, timeout, check_calls }).map_err(|e| e.to_string())?;
        let bufs = alloc_bufs(&g, 64 << 10)?;
        let (i, o) = ptrs(&bufs);
        let mut present = vec![true; world];
        present[world - 1] = false;
        let count = 21504; // 42 KiB of bf16
        let t0 = Instant::now();
        g.enqueue_ranks(algo, DType::BF16, count, &i, &o, 2, &present).map_err(|e| e.to_string())?;
        let r = g.synchronize();
        let took = t0.elapsed();
        let after = g.all_reduce(algo, DType::BF16, count, &i, &o, 2);
        match r {
            Err(tpar::Error::Timeout { rank, waited_ms, what }) => {
                println!(
                    "# timeout test: {} {world} ranks, rank {} absent: Timeout after {:.0} ms wall (deadline {} ms): rank {rank} waited {waited_ms} ms for {what}; next call: {}",
                    algo.name(),
                    world - 1,
                    took.as_secs_f64() * 1e3,
                    args.timeout_ms,
                    match &after {
                        Err(e) => e.to_string(),
                        Ok(()) => "succeeded (WRONG: the group should be poisoned)".into(),
                    }
                );
                if after.is_ok() || took > timeout * 3 + Duration::from_secs(2) {
                    return Err(format!("timeout test failed for {}", algo.name()));
                }
            }
            Err(e) => return Err(format!("timeout test {}: expected Timeout, got: {e}", algo.name())),
            Ok(()) => return Err(format!("timeout test {}: a call with a missing rank succeeded", algo.name())),
        }
    }
    Ok(())
}

/// `--mismatch-test`: for every kernel, the last rank announces a call that differs in one
/// field (dtype, algorithm, count: the data are the same, so only the descriptor check can
/// tell); every call must end in Error::Mismatch, then Poisoned. A control call with the
/// truth announced must succeed first, so the check is shown to pass what it should.
fn mismatch_test(args: &BenchCudaArgs, world: usize, transport: Transport) -> Result<(), String> {
    use tpar::cuda::abi::desc_code;
    let timeout = Duration::from_millis(args.timeout_ms);
    let check_calls = check_calls_from_env()?;
    let count = 21504; // 42 KiB of bf16
    for algo in KERNEL_ALGORITHMS {
        let other = if algo == Algorithm::OneshotPush { Algorithm::TwoshotPush } else { Algorithm::OneshotPush };
        let lies = [("dtype", desc_code(algo, DType::F16)), ("algorithm", desc_code(other, DType::BF16))];
        for (field, code) in lies {
            let mut g = EmulatedGroup::new(args.device, world, 64 << 10, GroupOptions { transport, timeout, check_calls }).map_err(|e| e.to_string())?;
            let bufs = alloc_bufs(&g, 64 << 10)?;
            let (i, o) = ptrs(&bufs);
            g.all_reduce(algo, DType::BF16, count, &i, &o, 2).map_err(|e| format!("mismatch test {}: the honest control call failed: {e}", algo.name()))?;
            g.set_desc_override_for_test(Some((world - 1, code)));
            let t0 = Instant::now();
            let r = g.all_reduce(algo, DType::BF16, count, &i, &o, 2);
            let took = t0.elapsed();
            g.set_desc_override_for_test(None);
            let after = g.all_reduce(algo, DType::BF16, count, &i, &o, 2);
            match r {
                Err(tpar::Error::Mismatch { field: f, .. }) if f == field && after.is_err() => {
                    println!(
                        "# mismatch test: {} {world} ranks, rank {} announces another {field}: {} in {:.1} ms; next call: {}",
                        algo.name(),
                        world - 1,
                        r.as_ref().err().map_or(String::new(), |e| e.to_string()),
                        took.as_secs_f64() * 1e3,
                        after.as_ref().err().map_or(String::new(), |e| e.to_string())
                    );
                }
                Err(e) => return Err(format!("mismatch test {} ({field}): expected Mismatch on `{field}` then Poisoned, got: {e}; next: {after:?}", algo.name())),
                Ok(()) => return Err(format!("mismatch test {} ({field}): a mismatched call succeeded silently", algo.name())),
            }
            // The same lie inside a capture: checked once, when the capture ends.
            let mut g = EmulatedGroup::new(args.device, world, 64 << 10, GroupOptions { transport, timeout, check_calls }).map_err(|e| e.to_string())?;
            let cap = g.capture(|g| {
                g.enqueue(algo, DType::BF16, count, &i, &o, 2)?;
                g.set_desc_override_for_test(Some((world - 1, code)));
                g.enqueue(algo, DType::BF16, count, &i, &o, 2)
            });
            g.set_desc_override_for_test(None);
            let after = g.all_reduce(algo, DType::BF16, count, &i, &o, 2);
            match cap {
                Err(tpar::Error::Mismatch { field: f, .. }) if f == field && after.is_err() => {
                    println!("# mismatch test (graph): {} {world} ranks, rank {} captured another {field}: {}", algo.name(), world - 1, cap.as_ref().err().map_or(String::new(), |e| e.to_string()));
                }
                Err(e) => return Err(format!("mismatch test (graph) {} ({field}): expected Mismatch on `{field}` at capture end, got: {e}; next: {after:?}", algo.name())),
                Ok(_) => return Err(format!("mismatch test (graph) {} ({field}): a mismatched capture succeeded silently", algo.name())),
            }
        }
    }
    Ok(())
}

/// NCCL with one rank on this GPU: proves the loader and the call path; its time is a local
/// copy plus NCCL's launch overhead, labelled so.
fn nccl_one_rank(c: &Ctx, args: &BenchCudaArgs, d: DType, records: &mut Vec<Record>) -> Result<(), String> {
    use tpar::cuda::nccl::{self, NcclComm};
    let e = |x: tpar::Error| x.to_string();
    let lib = nccl::load().map_err(e)?;
    let version = lib.version().map_err(e)?;
    let comms = NcclComm::init_all(&[c.g.device().ordinal as i32]).map_err(e)?;
    let comm = comms.first().ok_or("ncclCommInitAll returned no communicator")?;
    let stream = tpar::cuda::driver::Stream::new(c.g.device()).map_err(e)?;
    let start = Event::new(c.g.device()).map_err(e)?;
    let end = Event::new(c.g.device()).map_err(e)?;
    header(&format!("nccl (1 rank, {} v{version}; NOT comparable)", lib.path), 1, d, Transport::Nccl, if args.graph { "eager (graph not used for nccl here)" } else { "eager" }, &c.g.device().name);
    let b = &c.bufs[0];
    for bytes in sizes(args) {
        let count = (bytes / d.size()).max(1);
        if count * d.size() > c.g.max_bytes() {
            continue;
        }
        // Check: one rank's sum is its input.
        let mut inp = vec![0u8; count * d.size()];
        b.input.download(&mut inp).map_err(e)?;
        b.output.fill_u32(0xFFFF_FFFF).map_err(e)?;
        // SAFETY: both buffers hold at least max_bytes >= count elements and outlive the sync.
        unsafe { comm.all_reduce(b.input.ptr, b.output.ptr, count, d, &stream).map_err(e)? };
        stream.synchronize().map_err(e)?;
        let mut out = vec![0u8; count * d.size()];
        b.output.download(&mut out).map_err(e)?;
        let wrong = (0..count).filter(|i| out[i * d.size()..(i + 1) * d.size()] != inp[i * d.size()..(i + 1) * d.size()]).count() as i64;
        let mut samples = Vec::new();
        for k in 0..(args.warmup + args.iters) {
            stream.record(&start).map_err(e)?;
            // SAFETY: as above.
            unsafe { comm.all_reduce(b.input.ptr, b.output.ptr, count, d, &stream).map_err(e)? };
            stream.record(&end).map_err(e)?;
            end.synchronize().map_err(e)?;
            if k >= args.warmup {
                samples.push(start.elapsed_ms(&end).map_err(e)? as f64 * 1e3);
            }
        }
        let (med, p10, p90) = stats(samples);
        let nbytes = count * d.size();
        let (algbw, busbw) = bandwidths(nbytes, 1, med);
        println!("  {:>10} {:>12} {:>9} {:>6} {:>10.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>7}", nbytes, count, d.name(), "sum", med, p10, p90, algbw, busbw, wrong);
        records.push(Record::measured(Algorithm::Nccl, "nccl-1rank", d, 1, count, (med, p10, p90), wrong));
    }
    Ok(())
}

/// For the two-process tests: outside a launcher, starts 2 rank processes of this command,
/// waits for them and returns `None`; as a rank, joins tpar's rendezvous for its control
/// plane only (the CPU workspace kept small) and returns the communicator.
fn two_rank_control(test: &str) -> Result<Option<tpar::Communicator>, String> {
    let e = |x: tpar::Error| x.to_string();
    if !crate::launch::is_rank() {
        crate::launch::launch(2, Duration::from_secs(40))?;
        println!("# {test}: both ranks exited cleanly");
        return Ok(None);
    }
    let mut cfg = tpar::Config::from_env().map_err(e)?;
    cfg.shm_budget = 1 << 20;
    tpar::Communicator::init(&cfg).map(Some).map_err(e)
}

/// `--nccl-rdzv-test`: two rank processes join one NCCL communicator over tpar's rendezvous.
fn nccl_rdzv_test(args: &BenchCudaArgs) -> Result<(), String> {
    let e = |x: tpar::Error| x.to_string();
    let Some(mut comm) = two_rank_control("nccl-rdzv")? else {
        return Ok(());
    };
    // One GPU per rank when the machine has several; otherwise both share --device.
    let gpus = crate::util::gpu_count();
    let ordinal = if gpus >= comm.world() { comm.rank() } else { args.device };
    let dev = tpar::cuda::driver::Device::open(ordinal).map_err(e)?;
    let t0 = Instant::now();
    let mut failed = false;
    let verdict = match tpar::cuda::nccl::init_over_rendezvous(&mut comm, &dev) {
        Ok(nc) => {
            let n = 4096usize;
            let buf = DeviceBuffer::new(&dev, n * 4).map_err(e)?;
            let vals: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + comm.rank() as f32).collect();
            buf.upload(&vals).map_err(e)?;
            let stream = tpar::cuda::driver::Stream::new(&dev).map_err(e)?;
            // SAFETY: buf holds n f32 and outlives the synchronize below.
            unsafe { nc.all_reduce(buf.ptr, buf.ptr, n, DType::F32, &stream) }.map_err(e)?;
            stream.synchronize().map_err(e)?;
            let mut out = vec![0f32; n];
            buf.download(&mut out).map_err(e)?;
            let w = comm.world() as f32;
            let wrong = out.iter().enumerate().filter(|(i, v)| **v != w * ((*i % 7) as f32) + (0..comm.world()).sum::<usize>() as f32).count();
            failed = wrong > 0;
            format!("joined in {:.0} ms, one all-reduce of {n} floats: {wrong} wrong", t0.elapsed().as_secs_f64() * 1e3)
        }
        Err(x) => format!("refused in {:.0} ms with an error (no hang): {x}", t0.elapsed().as_secs_f64() * 1e3),
    };
    let all = comm.gather_bytes(verdict.as_bytes()).map_err(e)?;
    if let Some(all) = all {
        for (r, v) in all.iter().enumerate() {
            println!("# nccl-rdzv: rank {r}: {}", String::from_utf8_lossy(v));
        }
    }
    comm.barrier().map_err(e)?;
    if failed {
        return Err("NCCL over the rendezvous returned wrong sums".into());
    }
    Ok(())
}

/// `--ipc-test`: two processes on one GPU, one rank each, workspaces shared through CUDA IPC
/// (`tpar::cuda::ipc::IpcWorkspace`). The command re-launches itself as two ranks (as `tpar
/// bench --ranks` does); the ranks meet through tpar's own rendezvous (validated Unix
/// socket), whose control plane carries the IPC handles and the results.
mod ipc {
    use super::*;
    use tpar::cuda::ipc::IpcWorkspace;

    /// The same deterministic inputs in both processes: rank r's input of call i.
    pub(super) fn inputs_of(d: DType, count: usize, seed: u64, call: u64, rank: usize) -> (Vec<u8>, Vec<f64>) {
        let mut rng = StdRng::seed_from_u64(seed ^ (call << 8) ^ rank as u64 ^ 0x9e37_79b9_7f4a_7c15);
        let mut raw = Vec::with_capacity(count * d.size());
        let mut vals = Vec::with_capacity(count);
        for _ in 0..count {
            let mut v: f32 = rng.gen_range(-1.0f32..1.0f32);
            if v == 0.0 {
                v = 0.25;
            }
            let (bits, q) = quantize(d, v);
            vals.push(q);
            match d.size() {
                4 => raw.extend_from_slice(&bits.to_le_bytes()),
                _ => raw.extend_from_slice(&(bits as u16).to_le_bytes()),
            }
        }
        (raw, vals)
    }

    pub fn run(args: &BenchCudaArgs, dtypes: &[DType], algos: &[Algorithm]) -> Result<(), String> {
        let e = |x: tpar::Error| x.to_string();
        let Some(mut comm) = super::two_rank_control("ipc")? else {
            return Ok(());
        };
        let rank = comm.rank();
        let world = comm.world();
        if world != 2 {
            return Err(format!("--ipc-test runs 2 ranks, not {world}"));
        }
        let timeout = Duration::from_millis(args.timeout_ms);
        // Every dtype asked for, in one workspace: the empty sentinel is the same for all.
        let dts: Vec<DType> = dtypes.to_vec();
        let width_dtype = dts.first().copied().ok_or("no dtype")?;
        let max_bytes = args.maxbytes.max(43008);
        let t0 = Instant::now();
        let mut ws = IpcWorkspace::new(args.device, rank, world, max_bytes, width_dtype, timeout).map_err(e)?;
        // Handshake over the rendezvous' control plane: every rank's handles to every rank.
        let mine = ws.handle_blob().map_err(e)?;
        let blobs = comm.all_gather_bytes(&mine).map_err(e)?;
        ws.connect(&blobs).map_err(e)?;
        let say = |m: String| {
            if rank == 0 {
                println!("{m}");
            } else {
                eprintln!("[rank 1] {m}");
            }
        };
        say(format!("# ipc: rank {rank} of 2 processes (pid {}), workspaces mapped through CUDA IPC in {:.0} ms", std::process::id(), t0.elapsed().as_secs_f64() * 1e3));

        let ab = |x: usize| x.div_ceil(VEC_BYTES) * VEC_BYTES;
        let input = DeviceBuffer::new(ws.device(), ab(max_bytes)).map_err(e)?;
        let output = DeviceBuffer::new(ws.device(), ab(max_bytes)).map_err(e)?;
        let kernels: Vec<Algorithm> = algos.iter().copied().filter(|a| *a != Algorithm::Nccl).collect();

        // 1. Checked calls: every algorithm x dtype x count, same order in both processes.
        let mut counts: Vec<usize> = vec![1, 7, 255, 4099, 21504, 65541];
        let mut wrong = 0i64;
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut calls = 0u64;
        for &d in &dts {
            counts.push(max_bytes / d.size());
            for &algo in &kernels {
                for &count in &counts {
                    if count * d.size() > max_bytes {
                        continue;
                    }
                    let (raw, _) = inputs_of(d, count, args.seed, calls, rank);
                    let (_, other) = inputs_of(d, count, args.seed, calls, 1 - rank);
                    let (_, own) = inputs_of(d, count, args.seed, calls, rank);
                    input.upload(&raw).map_err(e)?;
                    output.fill_u32(0xFFFF_FFFF).map_err(e)?;
                    let blocks = args.blocks.unwrap_or(0);
                    ws.enqueue(algo, d, count, input.ptr, output.ptr, blocks).map_err(e)?;
                    ws.synchronize().map_err(e)?;
                    let mut out = vec![0u8; count * d.size()];
                    output.download(&mut out).map_err(e)?;
                    for i in 0..count {
                        let o = decode(d, &out, i);
                        let (r0, r1) = if rank == 0 { (own[i], other[i]) } else { (other[i], own[i]) };
                        let sum = r0 + r1;
                        if !o.is_finite() || (o - sum).abs() > eps(d) * 2.0 * (r0.abs() + r1.abs()) {
                            wrong += 1;
                        }
                    }
                    hash = out.iter().fold(hash, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
                    calls += 1;
                }
            }
        }
        // Both processes report; rank 0 compares the hashes (bitwise-identical outputs).
        let peer_result = comm
            .gather_bytes(format!("{wrong} {hash:016x}").as_bytes())
            .map_err(e)?
            .and_then(|all| all.get(1).map(|r| String::from_utf8_lossy(r).into_owned()));
        if let Some(r) = peer_result {
            let mut it = r.split_whitespace();
            let pw: i64 = it.next().and_then(|x| x.parse().ok()).ok_or("bad RESULT")?;
            let ph = it.next().ok_or("bad RESULT")?;
            let same = ph == format!("{hash:016x}");
            println!(
                "# ipc check: {calls} calls ({} algorithms x {:?} x counts {:?}): rank 0 {wrong} wrong, rank 1 {pw} wrong, outputs bitwise identical across processes: {same}",
                kernels.len(),
                dts.iter().map(|d| d.name()).collect::<Vec<_>>(),
                counts
            );
            if wrong != 0 || pw != 0 || !same {
                return Err("ipc check failed".into());
            }
        }

        // 2. Timings, 42 KiB of the first dtype: eager (each process launches its own rank,
        //    events on its own stream) and in a graph of --graph-inner calls.
        let d = width_dtype;
        let count = 43008 / d.size();
        let blocks = args.blocks.unwrap_or(0);
        if rank == 0 {
            println!("# ipc timing: 2 processes, 1 rank each, 43008 B {d}, rank 0's stream; eager = one launch per call per process; graph = {} calls per replay", args.graph_inner);
            println!("# NOTE: without MPS, kernels of two processes on one GPU do not run concurrently; the GPU time-slices");
            println!("# between the contexts, so a rank spinning on its peer waits for the next slice. These figures measure");
            println!("# that scheduling, not the collective; they only prove that the cross-process path completes.");
            println!("# {:>14} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9}", "algorithm", "eager", "p10", "p90", "graph", "p10", "p90");
        }
        let start = Event::new(ws.device()).map_err(e)?;
        let end = Event::new(ws.device()).map_err(e)?;
        for &algo in &kernels {
            let mut eager = Vec::new();
            for k in 0..(args.warmup + args.iters) {
                ws.stream().record(&start).map_err(e)?;
                ws.enqueue(algo, d, count, input.ptr, output.ptr, blocks).map_err(e)?;
                ws.stream().record(&end).map_err(e)?;
                ws.synchronize().map_err(e)?;
                if k >= args.warmup {
                    eager.push(start.elapsed_ms(&end).map_err(e)? as f64 * 1e3);
                }
            }
            let inner = args.graph_inner.max(1);
            ws.stream().begin_capture().map_err(e)?;
            let mut cap = Ok(());
            for _ in 0..inner {
                cap = cap.and_then(|()| ws.enqueue(algo, d, count, input.ptr, output.ptr, blocks));
            }
            let graph = ws.stream().end_capture().map_err(e)?;
            cap.map_err(e)?;
            let mut g = Vec::new();
            for k in 0..(args.warmup.max(1) + args.iters) {
                ws.stream().record(&start).map_err(e)?;
                graph.launch(ws.stream()).map_err(e)?;
                ws.stream().record(&end).map_err(e)?;
                ws.synchronize().map_err(e)?;
                if k >= args.warmup.max(1) {
                    g.push(start.elapsed_ms(&end).map_err(e)? as f64 * 1e3 / inner as f64);
                }
            }
            let (em, e10, e90) = stats(eager);
            let (gm, g10, g90) = stats(g);
            if rank == 0 {
                println!("  {:>14} {:>10.2} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2}", algo.name(), em, e10, e90, gm, g10, g90);
            }
        }
        // 3. Agree on the end before anything is unmapped or freed.
        comm.barrier().map_err(e)?;
        drop(ws);
        Ok(())
    }
}
