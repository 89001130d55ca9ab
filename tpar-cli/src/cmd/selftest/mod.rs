//! `tpar selftest`: the GPU backend's fault and plumbing tests, each by name. They prove
//! that failures are errors, not hangs or wrong sums (a rank that never arrives, a rank
//! that calls something else, a rank SIGKILLed mid-sequence), that CUDA graphs replay
//! correctly across epochs, and that CUDA IPC and NCCL join over tpar's rendezvous.
//! `scripts/gpu-check.sh` and `scripts/gpu-multi.sh` run them on the GPU machines.

#[cfg(feature = "cuda")]
mod emulated;
#[cfg(feature = "cuda")]
mod fused;
#[cfg(feature = "cuda")]
mod procs;

use crate::harness::{self, RankArgs, Target};
use clap::{Args, Subcommand};

/// Where `selftest graph --scratch` runs each call: the caller's buffers are reused at once
/// after the call, so a rank that leaves while a peer still uses them shows as wrong sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scratch {
    /// In place on one scratch buffer per rank (input copied in, output copied out).
    InPlace,
    /// From one scratch buffer into a second one (one-shot's zero-copy path: in place it
    /// is never registered).
    OutOfPlace,
}

#[derive(Args, Debug)]
pub struct SelftestArgs {
    #[command(subcommand)]
    pub test: Test,
}

/// Options every test shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    #[command(flatten)]
    pub ranks: RankArgs,
    /// Largest call, for the tests that sweep sizes (42K, 1.5M, 1KiB)
    #[arg(short = 'e', long = "maxbytes", default_value = "1M", value_parser = harness::size)]
    pub max_bytes: usize,
    /// Datatypes: float, half, bfloat16 (comma-separated) or all
    #[arg(short = 'd', long = "datatype", default_value = "bfloat16")]
    pub dtype: String,
    /// Timed iterations (ipc, nccl-local)
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations (ipc, nccl-local)
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 2)]
    pub warmup: usize,
    /// All-reduces per graph (ipc)
    #[arg(long = "graph-inner", default_value_t = 5)]
    pub graph_inner: usize,
    /// Seed of the inputs
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rank processes on one GPU: every rank on GPU 0, planning for this topology (preset or
    /// JSON)
    #[arg(long)]
    pub plan_topology: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Test {
    /// Emulated ranks: the last rank never arrives; every algorithm must end in Error::Timeout
    /// within about TPAR_TIMEOUT_MS, then Poisoned
    Timeout(Common),
    /// The last rank calls something else than the others (emulated ranks: another dtype or
    /// algorithm announced; rank processes: another dtype); every rank must get an error
    Mismatch(Common),
    /// Emulated ranks: capture --sequence in one graph, replay it N times, check every output
    /// and the epochs (--collective: the all-gather and the reduce-scatter too, mixed in one
    /// graph)
    Graph {
        #[command(flatten)]
        common: Common,
        /// Replays of the captured graph
        #[arg(long, default_value_t = 10)]
        replays: usize,
        /// CALLSxBYTES captured in the graph
        #[arg(long, default_value = "122x43008")]
        sequence: String,
        /// Every call on per-rank scratch buffers, its input copied in and its output copied
        /// out inside the graph, right before and after it (a rank that leaves a registered
        /// zero-copy call while a peer still reads or writes its buffers shows as wrong
        /// sums). `--scratch` alone: in place on one buffer; `--scratch out-of-place`: from
        /// one scratch buffer into another (one-shot's zero-copy path runs only out of place)
        #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "in-place", value_name = "MODE")]
        scratch: Option<Scratch>,
        /// Collectives of the sequence, a comma list of all-reduce, all-gather, reduce-scatter.
        /// The all-reduce alone: one graph per algorithm. With the all-gather or the
        /// reduce-scatter named: one graph per dtype whose calls take the named collectives in
        /// turn, each call's algorithm the next of --algo that computes its collective; BYTES
        /// counts as nccl-tests and `tpar check` count it (the all-reduce's buffer, the
        /// all-gather's output, the reduce-scatter's input: each rank's part BYTES / ranks in
        /// whole 16-byte vectors); fresh inputs and poisoned outputs before every replay, every
        /// call judged by `tpar check`'s verifier (all-gather: the concatenation bit for bit;
        /// reduce-scatter: the rank's slice of the rank-order f32 all-reduce). One-shot pull's
        /// registered path runs from 256 KiB per rank (TPAR_ZERO_COPY=1: at every size;
        /// with --scratch, out of place for these two)
        #[arg(long, default_value = "all-reduce", value_name = "LIST")]
        collective: String,
        /// Algorithms, a comma list (default: every kernel, one graph each, for the all-reduce
        /// alone; oneshot-push,oneshot-pull,twoshot-pull in a mixed sequence)
        #[arg(long)]
        algo: Option<String>,
    },
    /// Emulated ranks: start every epoch just below 2^32 and run the check sweep across the
    /// wrap
    EpochWrap {
        #[command(flatten)]
        common: Common,
        /// The first epoch
        #[arg(long, default_value_t = 4_294_967_290)]
        epoch_start: u32,
    },
    /// Rank processes: rank K SIGKILLs itself mid-sequence; every other rank must get an
    /// error within its bound (TPAR_TIMEOUT_MS), then Poisoned
    KillRank {
        #[command(flatten)]
        common: Common,
        /// The rank that dies (default: the last)
        #[arg(long)]
        rank: Option<usize>,
    },
    /// Two processes on one GPU, workspaces shared through CUDA IPC: checked calls, timings
    Ipc(Common),
    /// Two rank processes join one NCCL communicator over tpar's rendezvous
    NcclRdzv(Common),
    /// NCCL with one rank on this GPU: proves the loader and the call path (not a baseline)
    NcclLocal(Common),
    /// Emulated ranks: the fused all-reduce + residual add + RMSNorm and its family (--pattern),
    /// every (algorithm with a fused kernel, dtype, hidden, rows), eager and in graphs, in place and not, fused and
    /// unfused paths, then mixed fused and plain calls in one graph: bit for bit against the
    /// reference, within the f64 bound, every rank identical
    Fused {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        fused: FusedArgs,
    },
}

/// The shapes and paths of `tpar selftest fused`.
#[derive(Args, Debug, Clone)]
pub struct FusedArgs {
    /// Hidden sizes (elements per row), a comma list; sizes that are not whole tiles (bf16:
    /// multiples of 256) run the unfused path
    #[arg(long, default_value = "1024,2880,4096,5120,7168,8192,16384")]
    pub hidden: String,
    /// Rows (tokens): counts and ranges, e.g. 1-8,13,64
    #[arg(long, default_value = "1-9,13,16,31,32,33,48,63,64")]
    pub rows: String,
    /// Algorithms: a comma list, or all (every one with a fused kernel these ranks run)
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Patterns of the family, a comma list or all; the checked calls take them in turn (with
    /// one pattern, every call is of it). Names: add_rmsnorm (all-reduce + residual add +
    /// RMSNorm), rmsnorm (no residual), add_rmsnorm_gemma, rmsnorm_gemma (the Gemma weight
    /// offset, weight + 1), add_rmsnorm_fp8, rmsnorm_fp8, add_rmsnorm_gemma_fp8,
    /// rmsnorm_gemma_fp8 (the output FP8 e4m3, static per-tensor scale), add_rmsnorm_nvfp4,
    /// rmsnorm_nvfp4, add_rmsnorm_gemma_nvfp4, rmsnorm_gemma_nvfp4 (the output NVFP4: e2m1
    /// codes and 128x4-swizzled e4m3 block scales, static global scale)
    #[arg(long, default_value = "all")]
    pub pattern: String,
    /// eager, graph or both
    #[arg(long, default_value = "both")]
    pub mode: String,
    /// Graph mode: replays of each captured call, fresh inputs before each
    #[arg(long, default_value_t = 2)]
    pub replays: usize,
    /// Check the unfused path (all-reduce, then tpar's add-RMSNorm kernel) every Nth call
    /// too (0: never)
    #[arg(long, default_value_t = 3)]
    pub unfused_every: usize,
    /// Calls of the mixed sequence captured in one graph (0: none): fused and plain calls of
    /// every algorithm alternating, on 7168-wide rows of --seq-rows (bfloat16, or the first
    /// dtype)
    #[arg(long, default_value_t = 24)]
    pub seq_calls: usize,
    /// Rows of the mixed sequence's calls
    #[arg(long, default_value_t = 3)]
    pub seq_rows: usize,
    /// Start every epoch here (e.g. 4294967290: the sweep crosses the 2^32 wrap, and the tile
    /// words' generations with it)
    #[arg(long)]
    pub epoch_start: Option<u32>,
    /// Last, on a group of its own: one rank calls the plain all-reduce among fused calls
    /// (the descriptor's fused bit), then one calls another pattern (its pattern bits), then
    /// (two-shot pull) one announces the other row ownership (TPAR_FUSED_ROWS set
    /// differently): every rank must get Mismatch, then Poisoned
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mismatch: bool,
}

pub fn run(args: SelftestArgs) -> Result<(), String> {
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args;
        Err("this tpar was built without the `cuda` feature: the self-tests are GPU tests".into())
    }
    #[cfg(feature = "cuda")]
    match args.test {
        Test::Timeout(c) => emulated::timeout(&emulated_worlds(&c)?, &c),
        Test::Mismatch(c) => match c.ranks.emulate_ranks {
            Some(_) => emulated::mismatch(&emulated_worlds(&c)?, &c),
            None => procs::mismatch(&c),
        },
        Test::Graph { common, replays, sequence, scratch, collective, algo } => {
            let collectives = parse_collectives(&collective)?;
            let seq = harness::parse_sequence(&sequence)?;
            if collectives == [tpar::Collective::AllReduce] {
                emulated::graph(&emulated_worlds(&common)?, &common, replays, seq, scratch, algo.as_deref())
            } else {
                emulated::graph_mixed(&emulated_worlds(&common)?, &common, replays, seq, scratch, (&collectives, algo.as_deref()))
            }
        }
        Test::EpochWrap { common, epoch_start } => emulated::epoch_wrap(&emulated_worlds(&common)?, &common, epoch_start),
        Test::KillRank { common, rank } => procs::kill_rank(&common, rank),
        Test::Ipc(c) => procs::ipc(&c),
        Test::NcclRdzv(c) => procs::nccl_rdzv(&c),
        Test::NcclLocal(c) => emulated::nccl_local(&c),
        Test::Fused { common, fused: f } => fused::fused(&emulated_worlds(&common)?, &common, &f),
    }
}

/// `selftest graph --algo`'s default in a sequence of mixed collectives: both kernels of the
/// all-gather and the reduce-scatter, and a third of the all-reduce (those the ranks' transport
/// runs).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const MIXED_ALGOS: &str = "oneshot-push,oneshot-pull,twoshot-pull";

/// `selftest graph --collective`: a comma list of collectives, each once, in the order given.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn parse_collectives(s: &str) -> Result<Vec<tpar::Collective>, String> {
    crate::exit::refusing(|| {
        let mut v = Vec::new();
        for item in s.split(',').map(str::trim) {
            let c = harness::parse_collective(item)?;
            if v.contains(&c) {
                return Err(format!("--collective {s:?}: {c} named twice"));
            }
            v.push(c);
        }
        Ok(v)
    })
}

/// The calls of `selftest graph`'s mixed sequence: call k is of collective `k % n` of
/// `collectives` and runs the next of `algos` that computes it (those that do, taken in turn
/// over that collective's calls), so that every collective meets every named algorithm and
/// the algorithms interleave in the graph. An error names a collective no listed algorithm
/// computes.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn mixed_sequence(calls: usize, collectives: &[tpar::Collective], algos: &[tpar::Algorithm]) -> Result<Vec<(tpar::Collective, tpar::Algorithm)>, String> {
    let by: Vec<Vec<tpar::Algorithm>> = collectives
        .iter()
        .map(|&c| {
            let those: Vec<tpar::Algorithm> = algos.iter().copied().filter(|a| tpar::algorithms::registry::computes(*a, c).is_ok()).collect();
            if those.is_empty() {
                let names: Vec<&str> = algos.iter().map(|a| a.name()).collect();
                let what = tpar::algorithms::registry::algorithms_for(c).iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
                Err(format!("--algo {}: none computes the {c} (those that do: {what})", names.join(",")))
            } else {
                Ok(those)
            }
        })
        .collect::<Result<_, _>>()?;
    let n = collectives.len().max(1);
    Ok((0..calls).filter_map(|k| {
        let (c, those) = (collectives.get(k % n)?, by.get(k % n)?);
        Some((*c, *those.get((k / n) % those.len())?))
    }).collect())
}

/// The world sizes of `--emulate-ranks` (required by the emulated tests).
#[cfg(feature = "cuda")]
fn emulated_worlds(c: &Common) -> Result<(Vec<usize>, tpar::Transport), String> {
    if c.ranks.emulate_ranks.is_none() {
        return Err("this test runs emulated ranks: give --emulate-ranks N (or a list 2,4,8)".into());
    }
    match c.ranks.target("selftest", true)? {
        Target::Emulated { worlds, transport } => Ok((worlds, transport)),
        _ => Err("this test runs emulated ranks: give --emulate-ranks N".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpar::{Algorithm, Collective};

    #[test]
    fn collectives_parse_in_order_once_each() {
        assert_eq!(parse_collectives("all-reduce").unwrap(), vec![Collective::AllReduce]);
        assert_eq!(parse_collectives("reduce-scatter, all-gather").unwrap(), vec![Collective::ReduceScatter, Collective::AllGather]);
        assert!(parse_collectives("all-gather,all-gather").is_err());
        assert!(parse_collectives("all-to-all").is_err());
    }

    #[test]
    fn the_mixed_sequence_alternates_collectives_and_their_algorithms() {
        let c = [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];
        let a = [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPull];
        let s = mixed_sequence(12, &c, &a).unwrap();
        assert_eq!(s.len(), 12);
        for (k, (col, _)) in s.iter().enumerate() {
            assert_eq!(*col, c[k % 3], "call {k}");
        }
        // The all-reduce takes all three in turn; the others push and pull in turn (two-shot
        // pull computes the all-reduce only).
        let algos = |col: Collective| s.iter().filter(|x| x.0 == col).map(|x| x.1).collect::<Vec<_>>();
        assert_eq!(algos(Collective::AllReduce), [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPull, Algorithm::OneshotPush]);
        for col in [Collective::AllGather, Collective::ReduceScatter] {
            assert_eq!(algos(col), [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::OneshotPush, Algorithm::OneshotPull], "{col}");
        }
        assert!(s.iter().all(|(col, a)| tpar::algorithms::registry::computes(*a, *col).is_ok()));
        // No listed algorithm computes the all-gather: refused, naming those that do.
        let e = mixed_sequence(4, &[Collective::AllGather], &[Algorithm::TwoshotPull]).unwrap_err();
        assert!(e.contains("all-gather") && e.contains("oneshot-push"), "{e}");
    }
}
