//! The `tpar` command line. Each subcommand lives in its own file under `cmd/`; `bench`,
//! `check` and `tune` run over the shared harness (`harness/`: where ranks run, the launcher,
//! the one verifier and the one table). This file only parses and dispatches. The CLI may
//! exit; the library never does.

mod cmd;
mod exit;
mod harness;

use clap::{Parser, Subcommand};
use cmd::{bench, check, doctor, model, plan, selftest, settings, sim, topo, tune};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "tpar",
    version,
    about = "Fabric-aware all-reduce for tensor-parallel inference: benchmark, check, plan and tune",
    long_about = None,
    after_help = exit::FOOTER
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
    /// nccl-local, fused
    Selftest(selftest::SelftestArgs),
    /// Every environment variable tpar reads (TPAR_*), what it takes, and what is set now
    Settings(settings::SettingsArgs),
    /// What tpar sees on this box and what it would do inside vLLM or SGLang: GPUs and links,
    /// the plan per size class, engine settings that pre-empt tpar, missing libraries, the
    /// lines to paste, and the verify-step estimate. Runs anywhere; exits 0 without a GPU.
    Doctor(doctor::DoctorArgs),
}

fn main() -> ExitCode {
    // Like every Unix filter: a closed pipe (`tpar bench | head`) ends us quietly, by
    // SIGPIPE, instead of a panic in println!.
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // The settings are checked once, here, before any rank starts (`settings` lists them and
    // `doctor` reports a malformed one itself): a malformed TPAR_*
    // variable is one message, not one per rank (ranks parse the same environment again).
    if !harness::launch::is_rank() && !matches!(cli.command, Command::Settings(_) | Command::Doctor(_)) {
        if let Err(e) = tpar::Settings::from_env() {
            eprintln!("tpar: error: {e} (`tpar settings` lists every variable)");
            return ExitCode::from(2);
        }
    }
    emulated_queues();
    let result: Result<(), String> = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Check(a) => check::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Topo(a) => topo::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Sim(a) => sim::run(a),
        Command::Model(a) => model::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Settings(a) => settings::run(a),
        Command::Doctor(a) => doctor::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpar: error: {e}");
            exit::failure()
        }
    }
}

/// Emulated ranks run one stream each in this process; CUDA maps streams onto
/// CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default, read when CUDA starts), and
/// ranks whose streams share a queue wait on each other until the timeout (16 emulated ranks
/// did, on one H200). More queues cost CUDA's start time (32: about 0.33 s more on an H200,
/// `bench/results/2026-12-01-h200-check-tune-python/README.md`), so the setting is raised only for a run with more
/// than 8 emulated ranks, to the largest of them (a `bench --compare` run: to what tpar's and
/// the peer's streams need together), and never over the user's own.
fn emulated_queues() {
    if tpar::settings::cuda_hardware_queues_set() {
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(q) = queues_for(&args) {
        // Called before any thread or CUDA call exists (clap spawns none), so no other thread
        // can read the environment concurrently.
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", q.to_string());
    }
}

/// The hardware queues a command line's emulated ranks need beyond CUDA's 8: the largest
/// world of `--emulate-ranks N[,N..]` (either spelling), when it is above 8 (at most 32).
/// `bench --compare` drives a peer's ranks on streams of their own beside tpar's: twice the
/// world and both origin streams (a peer's spin-waiting kernels have no timeout: a rank queued
/// behind another on a shared queue would hang the run).
fn queues_for(args: &[String]) -> Option<usize> {
    let peers = args.iter().any(|a| a == "--compare" || a.starts_with("--compare="));
    let mut worlds = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let list = match a.strip_prefix("--emulate-ranks=") {
            Some(v) => Some(v),
            None if a == "--emulate-ranks" => args.get(i + 1).map(String::as_str),
            None => None,
        };
        worlds.extend(list.into_iter().flat_map(|l| l.split(',')).filter_map(|w| w.trim().parse::<usize>().ok()));
    }
    let need = worlds.into_iter().max().map(|w| if peers { 2 * (w + 1) } else { w });
    need.filter(|q| *q > 8).map(|q| q.min(32))
}

#[cfg(test)]
mod tests {
    use super::queues_for;

    fn q(line: &str) -> Option<usize> {
        queues_for(&line.split(' ').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn queues_only_for_more_than_eight_emulated_ranks() {
        assert_eq!(q("tpar bench --emulate-ranks 8"), None);
        assert_eq!(q("tpar bench --emulate-ranks 2,4,8"), None);
        assert_eq!(q("tpar check --emulate-ranks 2,16 -e 1M"), Some(16));
        assert_eq!(q("tpar check --emulate-ranks=12"), Some(12));
        assert_eq!(q("tpar bench --emulate-ranks 2,4,8 --compare vllm"), Some(18));
        assert_eq!(q("tpar bench --emulate-ranks 2 --compare=vllm"), None);
        assert_eq!(q("tpar bench --emulate-ranks 16 --compare vllm"), Some(32));
        assert_eq!(q("tpar bench --world 16"), None, "rank processes have one stream each");
        assert_eq!(q("tpar bench --emulate-ranks"), None);
    }
}
