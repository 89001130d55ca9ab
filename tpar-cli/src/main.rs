//! The `tpar` command line. Each subcommand lives in its own file; this file only parses
//! and dispatches. The CLI may exit; the library never does.

use clap::{Parser, Subcommand};

#[cfg(feature = "cuda")]
mod bench_cuda;
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
    /// CUDA backend benchmark and GPU self-checks (emulated ranks on one GPU). Temporary:
    /// to be folded into `tpar bench --backend cuda`.
    #[cfg(feature = "cuda")]
    BenchCuda(bench_cuda::BenchCudaArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), String> = match cli.command {
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
