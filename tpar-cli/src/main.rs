//! The `tpar` command line. Each subcommand lives in its own file under `cmd/`; `bench`,
//! `check` and `tune` run over the shared harness (`harness/`: where ranks run, the launcher,
//! the one verifier and the one table). This file only parses and dispatches. The CLI may
//! exit; the library never does.

mod cmd;
mod harness;

use clap::{Parser, Subcommand};
use cmd::{bench, check, model, plan, selftest, sim, topo, tune};
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
    /// Measure all-reduce latency and bandwidth (nccl-tests' all_reduce_perf flags and table)
    Bench(bench::BenchArgs),
    /// Verify every algorithm on this machine: odd sizes, all dtypes, long random sequences
    Check(check::CheckArgs),
    /// Measure every candidate algorithm here and write a tuned profile for the plan
    Tune(tune::TuneArgs),
    /// Show the GPU fabric like `nvidia-smi topo -m`: links, P2P read/write/atomics, islands.
    Topo(topo::TopoArgs),
    /// Show which algorithm tpar runs for an all-reduce and why, or a decision table.
    Plan(plan::PlanArgs),
    /// Simulate all-reduce algorithms on a fabric: predicted latency, crossovers, the pick.
    Sim(sim::SimArgs),
    /// Decode throughput with and without speculation, for NCCL and for tpar's pick.
    Model(model::ModelArgs),
    /// GPU self-tests by name: timeout, mismatch, graph, epoch-wrap, kill-rank, ipc, nccl-rdzv,
    /// nccl-local
    Selftest(selftest::SelftestArgs),
}

fn main() -> ExitCode {
    // Like every Unix filter: a closed pipe (`tpar bench | head`) ends us quietly, by
    // SIGPIPE, instead of a panic in println!.
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Emulated ranks run one stream each in this process; CUDA maps streams onto
    // CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default), and ranks sharing a queue
    // wait on each other until the timeout (16 emulated ranks did, on one H200). Read when
    // CUDA starts, so it is set here, before any thread or CUDA call, unless the user set it.
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: the first statement of main after the signal disposition: no other thread
        // exists yet that could read the environment concurrently.
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32") };
    }
    let cli = Cli::parse();
    let result: Result<(), String> = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Check(a) => check::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Topo(a) => topo::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Sim(a) => sim::run(a),
        Command::Model(a) => model::run(a),
        Command::Selftest(a) => selftest::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpar: error: {e}");
            ExitCode::FAILURE
        }
    }
}
