//! `tpar bench`'s flags, shared by the size sweep (`sweep.rs`) and the fused timing
//! (`fused.rs`).

use crate::harness::{self, RankArgs};
use clap::Args;
use std::path::PathBuf;

/// Measure all-reduce latency and bandwidth like nccl-tests' all_reduce_perf.
///
/// Without a launcher, `tpar bench --world N` starts N rank processes of itself. Under an
/// outside launcher (TPAR_RANK, TPAR_WORLD_SIZE, TPAR_RDZV set) it runs as that rank.
/// Times are medians over -n iterations (per iteration, the slowest rank), with the 10th
/// and 90th percentiles as spread.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Smallest message in bytes (42K, 1.5M, 1KiB: powers of 1024), as all_reduce_perf -b
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = harness::size)]
    pub min_bytes: usize,
    /// Largest message in bytes, as all_reduce_perf -e
    #[arg(short = 'e', long = "maxbytes", default_value = "4M", value_parser = harness::size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between steps, as all_reduce_perf -f
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub step_factor: usize,
    /// Timed iterations per size, as all_reduce_perf -n
    #[arg(short = 'n', long = "iters", default_value_t = 50)]
    pub iters: usize,
    /// Warm-up iterations per size (not timed), as all_reduce_perf -w
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 10)]
    pub warmup: usize,
    /// Check results (1) on fresh random inputs, bitwise against the rank-order sum, or not (0)
    #[arg(short = 'c', long = "check", default_value_t = 1, value_parser = harness::zero_or_one)]
    pub check: u8,
    /// Datatype: float, half, bfloat16, a comma list, or all
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Algorithms: a comma list, `all` (what these ranks run), or `auto` (the plan's pick per
    /// size, as TPAR_ALGO=auto); see `tpar plan` and docs/architecture.md for each
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// The collective, as nccl-tests' binaries: all-reduce (all_reduce_perf), all-gather
    /// (all_gather_perf) or reduce-scatter (reduce_scatter_perf). Sizes are theirs: the
    /// all-gather's output and the reduce-scatter's input, every rank's part (each rounded
    /// down to whole 16-byte vectors per rank); busbw = algbw x (n-1)/n for both
    #[arg(long, default_value = "all-reduce", value_parser = harness::parse_collective)]
    pub collective: tpar::Collective,
    #[command(flatten)]
    pub ranks: RankArgs,
    /// Write every measurement as JSON records to this file
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write every measurement as CSV to this file
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Plot latency versus size per algorithm as SVG to this file
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// GPUs: time eager launches, CUDA graphs, or both (default: both across GPUs, eager on
    /// emulated and CPU ranks)
    #[arg(long, help_heading = "GPUs")]
    pub mode: Option<String>,
    /// GPUs: the same as --mode graph
    #[arg(long, help_heading = "GPUs")]
    pub graph: bool,
    /// GPUs: all-reduces per timed iteration (back to back, or captured in one graph)
    #[arg(long = "graph-inner", default_value_t = 20, help_heading = "GPUs")]
    pub graph_inner: usize,
    /// GPUs: a whole verify step, CALLSxBYTES (e.g. 122x42K), per algorithm and mode
    #[arg(long, help_heading = "GPUs")]
    pub sequence: Option<String>,
    /// GPUs: time other projects' kernels for --collective beside tpar's, same group and
    /// harness, and print tpar / peer per size: `vllm` (vLLM's custom all-reduce, all-gather
    /// and reduce-scatter; bench/compare/vllm.sh builds it), `vllm=LIB` for the library's
    /// path. With --json F, the peers go to F.peers.json
    #[arg(long, value_name = "PEER[=LIB],..", help_heading = "GPUs")]
    pub compare: Option<String>,
    /// GPU rank processes, one-GPU test: every rank on GPU 0, planning for this topology
    /// (preset or JSON). The processes time-slice the one GPU: the times measure that
    /// scheduling, not a fabric
    #[arg(long, hide = true)]
    pub plan_topology: Option<String>,
    /// Time the fused all-reduce + residual add + RMSNorm instead of the size sweep: per
    /// --hidden x --rows and algorithm, the all-reduce alone, the fused call, the all-reduce
    /// followed by tpar's add-RMSNorm kernel, and that kernel alone (emulated ranks)
    #[arg(long, help_heading = "Fused all-reduce + add-RMSNorm")]
    pub fused: bool,
    /// --fused: hidden sizes (elements per row), a comma list [default: 7168]
    #[arg(long, requires = "fused", help_heading = "Fused all-reduce + add-RMSNorm")]
    pub hidden: Option<String>,
    /// --fused: rows (tokens), counts and ranges such as 1-8,16 [default: 1,3,8]
    #[arg(long, requires = "fused", help_heading = "Fused all-reduce + add-RMSNorm")]
    pub rows: Option<String>,
    /// --fused: patterns of the family, a comma list or all [default: add_rmsnorm]:
    /// add_rmsnorm (all-reduce + residual add + RMSNorm), rmsnorm (no residual),
    /// add_rmsnorm_gemma, rmsnorm_gemma (weight + 1), add_rmsnorm_fp8, rmsnorm_fp8,
    /// add_rmsnorm_gemma_fp8, rmsnorm_gemma_fp8 (FP8 e4m3 output, static scale),
    /// add_rmsnorm_nvfp4, rmsnorm_nvfp4, add_rmsnorm_gemma_nvfp4, rmsnorm_gemma_nvfp4 (NVFP4
    /// output, static global scale)
    #[arg(long, requires = "fused", help_heading = "Fused all-reduce + add-RMSNorm")]
    pub pattern: Option<String>,
}

/// The largest message `tpar bench` takes: the largest workspace tpar creates
/// (`tpar::workspace::MAX_WORKSPACE_BYTES`, 64 GiB). Every rank allocates buffers of the
/// largest size (its input and output, and every rank's input to check against), so a
/// larger -b or -e would end each rank on a failed allocation after the ranks started.
pub const MAX_MESSAGE_BYTES: usize = tpar::workspace::MAX_WORKSPACE_BYTES;

impl BenchArgs {
    /// The sizes of the sweep (-b to -e by -f), refused before any rank starts where a size
    /// exceeds [`MAX_MESSAGE_BYTES`]: one line naming the flag and the largest size taken.
    pub fn sizes(&self) -> Result<Vec<usize>, String> {
        for (flag, bytes) in [("-e", self.max_bytes), ("-b", self.min_bytes)] {
            if bytes > MAX_MESSAGE_BYTES {
                return Err(format!(
                    "{flag} {} ({bytes} bytes): larger than tpar bench takes: at most {} ({MAX_MESSAGE_BYTES} bytes), tpar's largest workspace",
                    tpar::units::human_bytes(bytes as u64),
                    tpar::units::human_bytes(MAX_MESSAGE_BYTES as u64),
                ));
            }
        }
        harness::size_steps(self.min_bytes, self.max_bytes, self.step_factor)
    }
}
