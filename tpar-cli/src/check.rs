//! `tpar check`: the correctness sweep, runnable on any machine. Every algorithm x dtype x
//! odd and even counts, then a long sequence of random sizes; outputs poisoned before each
//! call, compared bitwise with the rank-order f32 sum and with an f64 reference, and every
//! rank's outputs compared bitwise with rank 0's.

use crate::bench::{parse_algos, parse_dtypes};
use crate::launch;
use clap::Args;
use std::time::Duration;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest, expected, poison, SplitMix};
use tpar::{bf16, f16, Algorithm, Communicator, DType, Element};

/// Counts every sweep covers: empty, single, odd tails, a word multiple, and one larger than
/// the shared-memory chunk (so chunking is exercised).
pub const COUNTS: [usize; 6] = [0, 1, 7, 16, 1000, (1 << 20) + 3];

/// Verify every algorithm on this machine's ranks (exits non-zero on any wrong element).
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Rank processes to start (default: 4 on CPU, one per GPU with --backend cuda); ignored
    /// under an outside launcher
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Backend: cpu (shared memory between processes), cuda (one process per GPU), or auto:
    /// cuda when there are 2+ GPUs, else cpu
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// CUDA: largest call of the sweep and of the random calls (K, M suffixes)
    #[arg(short = 'e', long = "maxbytes", default_value = "16M", value_parser = crate::util::parse_size)]
    pub max_bytes: usize,
    /// CUDA, fault test: this rank SIGKILLs itself mid-sequence; the others must fail, not hang
    #[arg(long, hide = true)]
    pub kill_rank: Option<usize>,
    /// CUDA, one-GPU test: all ranks share GPU 0 and plan for this topology (preset or JSON)
    #[arg(long, hide = true)]
    pub plan_topology: Option<String>,
    /// CUDA: the last rank calls another dtype than the others; every rank must get an error
    #[arg(long, hide = true)]
    pub mismatch_test: bool,
    /// Datatypes: float, half, bfloat16 (comma-separated) or all
    #[arg(short = 'd', long = "datatype", default_value = "all")]
    pub dtype: String,
    /// Algorithms (comma-separated) or all
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Calls of random size, algorithm and dtype after the sweep
    #[arg(long, default_value_t = 1000)]
    pub calls: u64,
    /// Seed for inputs and the random sequence
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print only the verdict
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Default)]
struct Tally {
    calls: u64,
    wrong_elems: u64,
    failures: Vec<String>,
    digests: Vec<u64>,
}

fn one<T: Element>(comm: &mut Communicator, algo: Algorithm, seed: u64, call: u64, n: usize, t: &mut Tally) -> Result<(), String> {
    let inputs = all_inputs::<T>(seed, call, comm.world(), n);
    let mut out = vec![T::from_f32(0.0); n];
    poison(&mut out);
    comm.all_reduce_with(algo, &inputs[comm.rank()], &mut out)
        .map_err(|e| format!("{algo} {} count {n}: {e}", T::DTYPE))?;
    let bad = bit_diffs(&out, &expected(&inputs)).max(count_wrong(&out, &inputs));
    t.calls += 1;
    if bad > 0 {
        t.wrong_elems += bad as u64;
        t.failures.push(format!("{algo} {} count {n}: {bad} wrong", T::DTYPE));
    }
    t.digests.push(digest(&out));
    Ok(())
}

fn dispatch(comm: &mut Communicator, dt: DType, algo: Algorithm, seed: u64, call: u64, n: usize, t: &mut Tally) -> Result<(), String> {
    match dt {
        DType::F32 => one::<f32>(comm, algo, seed, call, n, t),
        DType::F16 => one::<f16>(comm, algo, seed, call, n, t),
        DType::BF16 => one::<bf16>(comm, algo, seed, call, n, t),
    }
}

pub fn run(args: CheckArgs) -> Result<(), String> {
    match crate::util::resolve_backend(&args.backend, false)? {
        "cpu" => {}
        "cuda" => return run_cuda(args),
        other => return Err(format!("--backend {other:?}: expected auto, cpu or cuda")),
    }
    let algos = parse_algos(&args.algo)?;
    let dtypes = parse_dtypes(&args.dtype)?;
    if !launch::is_rank() {
        return launch::launch(args.ranks.unwrap_or(4), Duration::from_secs(40));
    }
    let mut comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let mut t = Tally::default();
    let mut call = 0u64;
    for &dt in &dtypes {
        for &algo in &algos {
            for &n in &COUNTS {
                dispatch(&mut comm, dt, algo, args.seed, call, n, &mut t)?;
                call += 1;
            }
        }
    }
    let mut g = SplitMix::new(args.seed ^ SEQUENCE_SALT);
    for _ in 0..args.calls {
        let dt = dtypes[g.below(dtypes.len() as u64) as usize];
        let algo = algos[g.below(algos.len() as u64) as usize];
        let n = g.below(5000) as usize;
        dispatch(&mut comm, dt, algo, args.seed, call, n, &mut t)?;
        call += 1;
    }
    let mut payload = Vec::new();
    payload.extend_from_slice(&t.wrong_elems.to_le_bytes());
    payload.extend_from_slice(&(t.failures.len() as u64).to_le_bytes());
    for d in &t.digests {
        payload.extend_from_slice(&d.to_le_bytes());
    }
    let all = comm.gather_bytes(&payload).map_err(|e| e.to_string())?;
    if !t.failures.is_empty() {
        for f in t.failures.iter().take(20) {
            eprintln!("tpar check: rank {}: {f}", comm.rank());
        }
    }
    let Some(all) = all else {
        return if t.failures.is_empty() { Ok(()) } else { Err(format!("{} wrong elements", t.wrong_elems)) };
    };
    let mut wrong = 0u64;
    let mut diverged = vec![];
    for (r, p) in all.iter().enumerate() {
        wrong += u64::from_le_bytes(p[..8].try_into().unwrap_or([0; 8]));
        if p[16..] != all[0][16..] {
            diverged.push(r);
        }
    }
    let verdict = if wrong == 0 && diverged.is_empty() { "PASS" } else { "FAIL" };
    if !args.quiet {
        println!("# tpar check: {} ranks, algorithms [{}], dtypes [{}]", comm.world(),
            algos.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
            dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "));
        println!("#   sweep counts {COUNTS:?} then {} calls of random size (0..5000), algorithm and dtype", args.calls);
        println!("#   epochs {}..{}", comm.epoch().wrapping_sub(call as u32), comm.epoch());
    }
    println!(
        "{verdict}: {} calls per rank, {wrong} wrong elements, ranks bitwise identical to rank 0: {}",
        t.calls,
        if diverged.is_empty() { "all".to_string() } else { format!("no (ranks {diverged:?} differ)") }
    );
    if verdict == "PASS" {
        Ok(())
    } else {
        Err("check failed".into())
    }
}

#[cfg(feature = "cuda")]
fn run_cuda(args: CheckArgs) -> Result<(), String> {
    crate::bench_gpu::check(crate::bench_gpu::CheckOpts {
        ranks: args.ranks,
        dtypes: parse_dtypes(&args.dtype)?,
        algos: crate::bench_gpu::parse_cuda_algos(&args.algo)?,
        max_bytes: args.max_bytes,
        calls: args.calls,
        seed: args.seed,
        quiet: args.quiet,
        kill_rank: args.kill_rank,
        plan_topology: args.plan_topology,
        mismatch_test: args.mismatch_test,
    })
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_args: CheckArgs) -> Result<(), String> {
    Err("this tpar was built without the `cuda` feature".into())
}

/// Mixes the seed for the random sequence so it differs from the sweep's inputs.
const SEQUENCE_SALT: u64 = 0x5e9_5a17;
