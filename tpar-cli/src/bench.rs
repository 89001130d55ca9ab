//! `tpar bench`: all_reduce_perf's flags and table, one block per algorithm, on CPU ranks
//! (this file) or GPUs (`--backend cuda`).

use crate::launch;
use crate::util::{parse_size, percentiles, size_steps};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tpar::report::Record;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, expected, fill_input, poison};
use tpar::{bf16, f16, Algorithm, Communicator, DType, Element};

fn default_ranks() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

/// Measure all-reduce latency and bandwidth like nccl-tests' all_reduce_perf.
///
/// Without a launcher, `tpar bench --ranks N` starts N rank processes of itself. Under an
/// outside launcher (TPAR_RANK, TPAR_WORLD_SIZE, TPAR_RDZV set) it runs as that rank.
/// Times are medians over -n iterations (per iteration, the slowest rank), with the 10th
/// and 90th percentiles as spread.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Smallest message in bytes (K, M, G suffixes), as all_reduce_perf -b
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest message in bytes, as all_reduce_perf -e
    #[arg(short = 'e', long = "maxbytes", default_value = "4M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between steps, as all_reduce_perf -f
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub step_factor: usize,
    /// Timed iterations per size
    #[arg(short = 'n', long = "iters", default_value_t = 50)]
    pub iters: usize,
    /// Warm-up iterations per size (not timed)
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 10)]
    pub warmup: usize,
    /// Check results against an f64 reference on fresh random inputs (1) or not (0)
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Datatype: float, half, bfloat16, or all
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Rank processes to start (default: one per core, 2..8, on CPU; one per GPU with
    /// --backend cuda); ignored under an outside launcher
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Algorithms, comma-separated, or `all` (gather-bcast is the labelled baseline)
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Backend: cpu (shared memory between processes), cuda (one process per GPU, or
    /// --emulate-ranks), or auto: cuda when there are 2+ GPUs, else cpu
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Write every measurement as JSON records to this file
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write every measurement as CSV to this file
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Plot latency versus size per algorithm as SVG to this file
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// CUDA: run N ranks (or a comma list: 2,4,8) as streams on one GPU
    #[arg(long = "emulate-ranks", help_heading = "CUDA backend")]
    pub emulate_ranks: Option<String>,
    /// CUDA: time inside a captured CUDA graph (--graph-inner calls per graph)
    #[arg(long, help_heading = "CUDA backend")]
    pub graph: bool,
    /// CUDA: all-reduces per timed iteration (back to back, or captured in one graph)
    #[arg(long = "graph-inner", default_value_t = 20, help_heading = "CUDA backend")]
    pub graph_inner: usize,
    /// CUDA across GPUs: time eager launches, CUDA graphs, or both (--graph means graph)
    #[arg(long, default_value = "both", help_heading = "CUDA backend")]
    pub mode: String,
    /// CUDA: a whole verify step, CALLSxBYTES captured in one graph (e.g. 122x43008)
    #[arg(long, help_heading = "CUDA backend")]
    pub sequence: Option<String>,
    /// CUDA: workspace transport, p2p (device memory) or host (pinned host memory over PCIe)
    #[arg(long, default_value = "p2p", help_heading = "CUDA backend")]
    pub transport: String,
    /// CUDA: device ordinal
    #[arg(long, default_value_t = 0, help_heading = "CUDA backend")]
    pub device: usize,
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    match crate::util::resolve_backend(&args.backend, args.emulate_ranks.is_some())? {
        "cpu" => {}
        "cuda" => return run_cuda(args),
        other => return Err(format!("--backend {other:?}: expected auto, cpu or cuda")),
    }
    if args.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    // Validate everything before starting ranks, so a typo fails once and at once.
    let sizes = size_steps(args.min_bytes, args.max_bytes, args.step_factor)?;
    let algos = parse_algos(&args.algo)?;
    let dtypes = parse_dtypes(&args.dtype)?;
    if !launch::is_rank() {
        let grace = Duration::from_secs(40);
        return launch::launch(args.ranks.unwrap_or_else(default_ranks), grace);
    }
    let mut comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let root = comm.rank() == 0;
    if root {
        print_preamble(&comm, &args);
    }
    let bar = if root {
        let b = ProgressBar::new((sizes.len() * algos.len() * dtypes.len()) as u64);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut records = vec![];
    for &dtype in &dtypes {
        for &algo in &algos {
            if root {
                bar.suspend(|| print_block_header(algo, comm.world()));
            }
            for &size in &sizes {
                bar.set_message(format!("{algo} {dtype} {size} B"));
                let rec = match dtype {
                    DType::F32 => measure::<f32>(&mut comm, algo, size, &args),
                    DType::F16 => measure::<f16>(&mut comm, algo, size, &args),
                    DType::BF16 => measure::<bf16>(&mut comm, algo, size, &args),
                }
                .map_err(|e| e.to_string())?;
                if let Some(rec) = rec {
                    bar.suspend(|| print_row(&rec));
                    records.push(rec);
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    if root {
        print_summary(&records);
        write_outputs(&records, &args)?;
        let wrong: i64 = records.iter().map(|r| r.wrong.max(0)).sum();
        if wrong > 0 {
            return Err(format!("{wrong} wrong elements in total (see #wrong)"));
        }
    }
    Ok(())
}

/// `--backend cuda`: one rank process per GPU, or with --emulate-ranks N ranks as streams
/// of one GPU; the same flags either way.
#[cfg(feature = "cuda")]
fn run_cuda(args: BenchArgs) -> Result<(), String> {
    let Some(emulate_ranks) = args.emulate_ranks.clone() else {
        let sizes = size_steps(args.min_bytes, args.max_bytes, args.step_factor)?;
        let dtypes = parse_dtypes(&args.dtype)?;
        let algos = crate::bench_gpu::parse_cuda_algos(&args.algo)?;
        let sequence = args.sequence.as_deref().map(crate::bench_cuda::parse_sequence).transpose()?;
        let modes = match args.mode.as_str() {
            "both" => vec![tpar::CaptureMode::Eager, tpar::CaptureMode::Graph],
            "eager" => vec![tpar::CaptureMode::Eager],
            "graph" => vec![tpar::CaptureMode::Graph],
            m => return Err(format!("--mode {m:?}: expected eager, graph or both")),
        };
        let modes = if args.graph { vec![tpar::CaptureMode::Graph] } else { modes };
        if args.transport != "p2p" {
            return Err("--transport host runs with --emulate-ranks only: across GPUs the workspaces are device memory shared through CUDA IPC".into());
        }
        return crate::bench_gpu::bench(crate::bench_gpu::BenchOpts {
            ranks: args.ranks,
            sizes,
            dtypes,
            algos,
            modes,
            iters: args.iters,
            warmup: args.warmup,
            inner: args.graph_inner,
            check: args.check != 0,
            sequence,
            json: args.json,
            svg: args.svg,
        });
    };
    crate::bench_cuda::run(crate::bench_cuda::BenchCudaArgs {
        minbytes: args.min_bytes,
        maxbytes: args.max_bytes,
        stepfactor: args.step_factor,
        iters: args.iters,
        warmup: args.warmup,
        check: args.check as u32,
        datatype: args.dtype,
        algo: if args.algo == "all" { "all".into() } else { args.algo },
        emulate_ranks,
        graph: args.graph,
        graph_inner: args.graph_inner,
        sequence: args.sequence,
        json: args.json,
        transport: args.transport,
        blocks: None,
        max_blocks: tpar::cuda::emulated::DEFAULT_MAX_BLOCKS,
        timeout_ms: tpar::cuda::launch::timeout_from_env().map_err(|e| e.to_string())?.unwrap_or(tpar::comm::DEFAULT_TIMEOUT).as_millis() as u64,
        device: args.device,
        check_only: false,
        odd: false,
        stress: None,
        timeout_test: false,
        skew_ns: None,
        mismatch_test: false,
        graph_test: None,
        epoch_start: None,
        seed: 1,
        ipc_test: false,
        nccl_rdzv_test: false,
    })
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_args: BenchArgs) -> Result<(), String> {
    Err("this tpar was built without the `cuda` feature".into())
}

pub fn parse_algos(s: &str) -> Result<Vec<Algorithm>, String> {
    if s.trim() == "all" {
        return Ok(Algorithm::CPU.to_vec());
    }
    s.split(',').map(|a| a.parse::<Algorithm>().map_err(|e| e.to_string())).collect()
}

pub fn parse_dtypes(s: &str) -> Result<Vec<DType>, String> {
    if s.trim() == "all" {
        return Ok(DType::ALL.to_vec());
    }
    s.split(',').map(|d| d.parse::<DType>().map_err(|e| e.to_string())).collect()
}

fn print_preamble(comm: &Communicator, args: &BenchArgs) {
    println!("# tpar bench (all_reduce_perf format)");
    println!(
        "#  backend: cpu (POSIX shared memory), ranks: {}, minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {}",
        comm.world(),
        args.min_bytes,
        args.max_bytes,
        args.step_factor,
        args.warmup,
        args.iters,
        args.check
    );
    println!(
        "#  time = median per call over iterations (each iteration: the slowest rank); p10/p90 = spread; chunk = {} KiB",
        comm.layout().cap * 8 / 1024
    );
    println!("#  gather-bcast is a baseline (rank 0 gathers, reduces, broadcasts), not an algorithm tpar picks");
}

fn print_block_header(algo: Algorithm, world: usize) {
    let label = if algo == Algorithm::GatherBcast { " (baseline)" } else { "" };
    println!("#");
    println!("# algorithm: {algo}{label}, transport: shm, ranks: {world}");
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>9} {:>7} {:>7} {:>6} {:>9} {:>9}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "p10", "p90"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>9} {:>7} {:>7} {:>6} {:>9} {:>9}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)"
    );
}

fn print_row(r: &Record) {
    let wrong = if r.wrong < 0 { "N/A".to_string() } else { r.wrong.to_string() };
    println!(
        "  {:>10} {:>12} {:>8} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6} {:>9.2} {:>9.2}",
        r.bytes, r.count, r.dtype.name(), "sum", r.time_us, r.algbw, r.busbw, wrong, r.p10_us, r.p90_us
    );
    let _ = std::io::stdout().flush();
}

fn print_summary(records: &[Record]) {
    let base: Vec<&Record> = records.iter().filter(|r| r.algorithm == Algorithm::GatherBcast).collect();
    println!("#");
    println!("# Summary: fastest algorithm per size, against the gather-bcast baseline measured in the same run");
    println!("# {:>8} {:>10} {:>14} {:>10} {:>10} {:>8}", "type", "size (B)", "fastest", "time (us)", "base (us)", "speedup");
    let mut keys: Vec<(DType, usize)> = records.iter().map(|r| (r.dtype, r.bytes)).collect();
    keys.sort();
    keys.dedup();
    for (dt, bytes) in keys {
        let best = records
            .iter()
            .filter(|r| r.dtype == dt && r.bytes == bytes && r.wrong <= 0)
            .min_by(|a, b| a.time_us.total_cmp(&b.time_us));
        let b = base.iter().find(|r| r.dtype == dt && r.bytes == bytes);
        if let Some(best) = best {
            let (bt, sp) = match b {
                Some(b) => (format!("{:.2}", b.time_us), format!("{:.2}x", b.time_us / best.time_us)),
                None => ("-".into(), "-".into()),
            };
            println!("  {:>8} {:>10} {:>14} {:>10.2} {:>10} {:>8}", dt.name(), bytes, best.algorithm.name(), best.time_us, bt, sp);
        }
    }
    let n = records.len().max(1) as f64;
    println!("# Avg bus bandwidth    : {:.4} GB/s", records.iter().map(|r| r.busbw).sum::<f64>() / n);
}

fn write_outputs(records: &[Record], args: &BenchArgs) -> Result<(), String> {
    if let Some(p) = &args.json {
        let s = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
        std::fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.csv {
        let mut s = String::from("algorithm,backend,dtype,world,bytes,count,time_us,p10_us,p90_us,algbw,busbw,wrong\n");
        for r in records {
            s.push_str(&format!(
                "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{}\n",
                r.algorithm, r.backend, r.dtype, r.world, r.bytes, r.count, r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw, r.wrong
            ));
        }
        std::fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.svg {
        tpar::plot::latency_svg(records, p).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Times one (algorithm, size) point on every rank; rank 0 gets the record.
pub(crate) fn measure<T: Element>(comm: &mut Communicator, algo: Algorithm, bytes: usize, args: &BenchArgs) -> tpar::Result<Option<Record>> {
    let count = bytes / T::DTYPE.size();
    let world = comm.world();
    let mut input = vec![T::from_f32(0.0); count];
    fill_input(0xbe4c, bytes as u64, comm.rank(), &mut input);
    let mut out = vec![T::from_f32(0.0); count];
    for _ in 0..args.warmup {
        comm.all_reduce_with(algo, &input, &mut out)?;
    }
    comm.barrier()?;
    let mut times = Vec::with_capacity(args.iters);
    for _ in 0..args.iters {
        let t = Instant::now();
        comm.all_reduce_with(algo, &input, &mut out)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let wrong: i64 = if args.check != 0 {
        let call = 0x5eed ^ bytes as u64 ^ (algo.code() << 40);
        let inputs = all_inputs::<T>(0xc4ec, call, world, count);
        poison(&mut out);
        comm.all_reduce_with(algo, &inputs[comm.rank()], &mut out)?;
        let exact = expected(&inputs);
        (bit_diffs(&out, &exact).max(count_wrong(&out, &inputs))) as i64
    } else {
        -1
    };
    let mut payload = Vec::with_capacity(8 + times.len() * 8);
    payload.extend_from_slice(&wrong.to_le_bytes());
    for t in &times {
        payload.extend_from_slice(&t.to_le_bytes());
    }
    let Some(all) = comm.gather_bytes(&payload)? else {
        return Ok(None);
    };
    let mut slowest = vec![0f64; times.len()];
    let mut wrong_total = 0i64;
    for p in &all {
        let w = i64::from_le_bytes(p[..8].try_into().unwrap_or([0; 8]));
        wrong_total = if w < 0 || wrong_total < 0 { -1 } else { wrong_total + w };
        for (i, c) in p[8..].chunks_exact(8).enumerate().take(slowest.len()) {
            let t = f64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            slowest[i] = slowest[i].max(t);
        }
    }
    Ok(Some(Record::measured(algo, "cpu", T::DTYPE, world, count, percentiles(&mut slowest), wrong_total)))
}
