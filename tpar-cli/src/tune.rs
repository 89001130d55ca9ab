//! `tpar tune`: on this machine, screen every candidate algorithm for bit-exact results,
//! time the survivors at every size, and write a profile (TOML) of the crossovers with a
//! fingerprint; the plan uses it when `TPAR_PROFILE` names it and the fingerprint matches.

use crate::bench::{measure, parse_dtypes, BenchArgs};
use crate::launch;
use crate::util::{parse_size, size_steps};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tpar::plan::{Backend, CaptureMode};
use tpar::profile::{Profile, ProfileFingerprint};
use tpar::testing::{is_exact, poison, special_inputs, Special};
use tpar::{bf16, f16, Algorithm, Communicator, DType, Element, Topology};

/// Algorithms `tune` considers on CPU ranks (the baseline is not a candidate).
const CANDIDATES: [Algorithm; 4] = [
    Algorithm::OneshotPush,
    Algorithm::OneshotPull,
    Algorithm::TwoshotPush,
    Algorithm::TwoshotPull,
];

/// Measure every candidate algorithm here and write a tuned profile (TOML) for the plan.
///
/// Each candidate is first checked bit-exactly on inputs whose sums are exact (small
/// integers, signed zeros, the largest values that cannot overflow); one that fails is
/// never chosen. Then survivors are timed per size and the fastest per size bucket is kept.
/// Use the result with TPAR_PROFILE=FILE (or `tpar plan --profile FILE`).
#[derive(Args, Debug, Clone)]
pub struct TuneArgs {
    /// Rank processes to start (default: 2 on CPU, one per GPU with --backend cuda); ignored
    /// under an outside launcher
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Backend: cpu (shared memory between processes), cuda (one process per GPU), or auto:
    /// cuda when there are 2+ GPUs, else cpu
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// CUDA: tune for calls captured in CUDA graphs (graph) or launched eagerly (eager); a
    /// profile applies only to the mode it was measured in
    #[arg(long, default_value = "graph")]
    pub capture: String,
    /// CUDA: all-reduces per timed iteration
    #[arg(long = "graph-inner", default_value_t = 20)]
    pub graph_inner: usize,
    /// Smallest message in bytes
    #[arg(short = 'b', long = "minbytes", default_value = "64", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest message in bytes
    #[arg(short = 'e', long = "maxbytes", default_value = "4M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Size step factor
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: usize,
    /// Timed iterations per point
    #[arg(short = 'n', long = "iters", default_value_t = 30)]
    pub iters: usize,
    /// Warm-up iterations per point
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Datatypes (comma-separated) or all
    #[arg(short = 'd', long = "datatype", default_value = "all")]
    pub dtype: String,
    /// Where to write the profile
    #[arg(short = 'o', long, default_value = "tpar-profile.toml")]
    pub out: PathBuf,
}

fn screen<T: Element>(comm: &mut Communicator, algo: Algorithm, count: usize) -> tpar::Result<bool> {
    let mut ok = true;
    for kind in Special::ALL {
        let inputs = special_inputs::<T>(kind, comm.world(), count);
        let mut out = vec![T::from_f32(0.0); count];
        poison(&mut out);
        comm.all_reduce_with(algo, &inputs[comm.rank()], &mut out)?;
        ok &= is_exact(&out, &inputs);
    }
    Ok(ok)
}

pub fn run(args: TuneArgs) -> Result<(), String> {
    let sizes = size_steps(args.min_bytes, args.max_bytes, args.step_factor)?;
    let dtypes = parse_dtypes(&args.dtype)?;
    match crate::util::resolve_backend(&args.backend, false)? {
        "cpu" => {}
        "cuda" => return run_cuda(args, sizes, dtypes),
        other => return Err(format!("--backend {other:?}: expected auto, cpu or cuda")),
    }
    if !launch::is_rank() {
        launch::launch(args.ranks.unwrap_or(2), Duration::from_secs(40))?;
        println!("use it with: TPAR_PROFILE={} (or tpar plan --profile {})", args.out.display(), args.out.display());
        return Ok(());
    }
    let mut comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let bench = BenchArgs {
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes,
        step_factor: args.step_factor,
        iters: args.iters,
        warmup: args.warmup,
        check: 1,
        dtype: args.dtype.clone(),
        ranks: Some(comm.world()),
        algo: String::new(),
        backend: "cpu".into(),
        json: None,
        csv: None,
        svg: None,
        emulate_ranks: None,
        graph: false,
        graph_inner: 0,
        mode: "eager".into(),
        sequence: None,
        transport: "p2p".into(),
        device: 0,
    };
    let root = comm.rank() == 0;
    let mut records = vec![];
    let mut rejected = vec![];
    for &dt in &dtypes {
        for algo in CANDIDATES {
            for &size in &sizes {
                let count = size / dt.size();
                let exact = match dt {
                    DType::F32 => screen::<f32>(&mut comm, algo, count),
                    DType::F16 => screen::<f16>(&mut comm, algo, count),
                    DType::BF16 => screen::<bf16>(&mut comm, algo, count),
                }
                .map_err(|e| e.to_string())?;
                let rec = match dt {
                    DType::F32 => measure::<f32>(&mut comm, algo, size, &bench),
                    DType::F16 => measure::<f16>(&mut comm, algo, size, &bench),
                    DType::BF16 => measure::<bf16>(&mut comm, algo, size, &bench),
                }
                .map_err(|e| e.to_string())?;
                // Every rank's verdict reaches rank 0; one inexact rank rejects the candidate.
                let verdicts = comm.gather_bytes(&[exact as u8]).map_err(|e| e.to_string())?;
                if let (Some(mut rec), Some(v)) = (rec, verdicts) {
                    if v.iter().any(|b| b.first() != Some(&1)) {
                        rejected.push(format!("{algo} {dt} {size} B"));
                        rec.wrong = rec.wrong.max(1);
                    }
                    if root {
                        eprint!("\rtune: {dt} {algo:>12} {size:>9} B {:>9.2} us   ", rec.time_us);
                    }
                    records.push(rec);
                }
            }
        }
    }
    if !root {
        return Ok(());
    }
    eprintln!();
    let topology = Topology::cpu();
    let fp = ProfileFingerprint::new(&topology, None, Backend::Cpu, comm.world(), CaptureMode::Eager);
    let profile = Profile::from_measurements(&records, fp);
    profile.save(&args.out).map_err(|e| e.to_string())?;
    println!("# tpar tune: {} ranks, {} points measured, wrote {}", comm.world(), records.len(), args.out.display());
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

#[cfg(feature = "cuda")]
fn run_cuda(args: TuneArgs, sizes: Vec<usize>, dtypes: Vec<DType>) -> Result<(), String> {
    let capture = match args.capture.as_str() {
        "graph" => CaptureMode::Graph,
        "eager" => CaptureMode::Eager,
        c => return Err(format!("--capture {c:?}: expected graph or eager")),
    };
    crate::bench_gpu::tune(crate::bench_gpu::TuneOpts {
        ranks: args.ranks,
        sizes,
        dtypes,
        capture,
        iters: args.iters,
        warmup: args.warmup,
        inner: args.graph_inner,
        out: args.out,
    })
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_args: TuneArgs, _sizes: Vec<usize>, _dtypes: Vec<DType>) -> Result<(), String> {
    Err("this tpar was built without the `cuda` feature".into())
}
