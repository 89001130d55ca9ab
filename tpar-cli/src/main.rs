//! The `tpar` command line. Each subcommand lives in its own file; this file only parses
//! and dispatches. The CLI may exit; the library never does.

mod bench;
mod check;
mod launch;
mod model;
mod plan;
mod sim;
mod topo;
mod tune;
mod util;

#[cfg(feature = "cuda")]
mod bench_cuda;
#[cfg(feature = "cuda")]
mod bench_gpu;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "tpar",
    version,
    about = "Fabric-aware all-reduce for tensor-parallel inference: benchmark, check, plan and tune",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    // Subcommands are added here, one line each, implemented in their own files.
    /// Measure all-reduce latency and bandwidth (nccl-tests' all_reduce_perf flags and table)
    Bench(bench::BenchArgs),
    /// Verify every algorithm on this machine: odd sizes, all dtypes, long random sequences
    Check(check::CheckArgs),
    /// Simulate all-reduce algorithms on a fabric: predicted latency, crossovers, the pick.
    Sim(sim::SimArgs),
    /// Decode throughput with and without speculation, for NCCL and for tpar's pick.
    Model(model::ModelArgs),
    /// Show the GPU fabric like `nvidia-smi topo -m`: links, P2P read/write/atomics, islands.
    Topo(topo::TopoArgs),
    /// Show which algorithm tpar runs for an all-reduce and why, or a decision table.
    Plan(plan::PlanArgs),
    /// Measure every candidate algorithm here and write a tuned profile for the plan
    Tune(tune::TuneArgs),
    /// GPU self-checks of the CUDA backend (sweeps, stress, timeout, graph, IPC tests) and its
    /// benchmark; `tpar bench --backend cuda` is the same benchmark with bench's flags.
    #[cfg(feature = "cuda")]
    #[command(hide = true)]
    BenchCuda(bench_cuda::BenchCudaArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), String> = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Check(a) => check::run(a),
        Command::Sim(args) => sim::run(args),
        Command::Model(args) => model::run(args),
        Command::Topo(args) => topo::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Tune(args) => tune::run(args),
        #[cfg(feature = "cuda")]
        Command::BenchCuda(a) => bench_cuda::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpar: error: {e}");
            ExitCode::FAILURE
        }
    }
}
