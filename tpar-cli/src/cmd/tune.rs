//! `tpar tune`: the library's one tuner (`tpar::tune`) on this machine's ranks (CPU rank
//! processes, one rank process per GPU, or emulated ranks): the link probe, a bit-exact
//! screen of every candidate, timings of the survivors (and NCCL on GPUs), rank 0's decision.
//! With `-o FILE` it writes the profile of one capture mode (TOML, fingerprinted; the plan
//! uses it when `TPAR_PROFILE` names it and the fingerprint matches), plus, on GPUs, the
//! probed topology beside it. With `--cache` it runs exactly what a communicator's start
//! runs: read this machine's tune from the cache, or tune it under the first-use budget and
//! store it (`TPAR_TUNE` applies), and prints the start's line.

use crate::harness::output;
use crate::harness::{self, Group, RankArgs, Target};
use clap::Args;
use std::path::PathBuf;
use tpar::plan::CaptureMode;
use tpar::tune::{Outcome, Rounds, StartOptions, TunePlan};

/// `tpar tune`'s bound on its own wall time (its budget is the flags'; the first-use tune's
/// is tpar::tune::TUNE_MAX_SECONDS).
const CLI_MAX_SECONDS: f64 = 3600.0;

/// Measure every candidate algorithm here and write a tuned profile (TOML) for the plan.
///
/// On GPUs, first the link probe (--no-probe skips it): SM store, SM load and copy-engine
/// bandwidth between the ranks' GPUs, alone and under all-to-all load, and one-way flag
/// latency, measured by the ranks themselves through their CUDA IPC mappings. Its figures go
/// into the profile and into the topology JSON written beside it (--topology-out); where the
/// profile applies, the plan's defaults (sizes and dtypes it has no bucket for) and the
/// simulator use them instead of the link class's assumed figures.
///
/// Each candidate is then checked bit-exactly: every rank's output of seeded random inputs
/// against the rank-order f32 sum (every rank regenerates every rank's input) and against
/// every other rank's; one that fails is never chosen and is reported. Survivors (and NCCL on
/// GPUs) are timed per size and the fastest per size bucket is kept. The all-gather and the
/// reduce-scatter follow (one-shot push against NCCL, at the engines' sequence-parallel
/// tensors of 1 to 512 tokens within -e, split over the ranks). Use the result with
/// TPAR_PROFILE=FILE (or `tpar plan --profile FILE`).
///
/// --cache runs a communicator's start instead: this machine's tune from the tune cache
/// ($TPAR_CACHE_DIR/profiles), or the first-use tune (both capture modes, messages up to -e)
/// stored there; TPAR_TUNE=off|force applies. Engines get the same at their first start.
///
/// --emulate-ranks N runs N ranks as streams of one GPU: a test of tune (and of the probe) on
/// one GPU; such ranks share one GPU and measure no fabric, so the profile gets no buckets.
#[derive(Args, Debug, Clone)]
pub struct TuneArgs {
    #[command(flatten)]
    pub ranks: RankArgs,
    /// Tune for calls captured in CUDA graphs (graph) or launched eagerly (eager); a profile
    /// applies only to the mode it was measured in. Default: graph on GPUs, eager on CPU
    #[arg(long)]
    pub capture: Option<String>,
    /// GPUs: all-reduces per timed iteration
    #[arg(long = "graph-inner", default_value_t = 20)]
    pub graph_inner: usize,
    /// Smallest message in bytes (42K, 1.5M, 1KiB: powers of 1024)
    #[arg(short = 'b', long = "minbytes", default_value = "64", value_parser = harness::size)]
    pub min_bytes: usize,
    /// Largest message in bytes (with --cache: the largest the tune covers)
    #[arg(short = 'e', long = "maxbytes", default_value = "4M", value_parser = harness::size)]
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
    /// Skip the link probe (on GPUs it runs by default, before timing)
    #[arg(long = "no-probe")]
    pub no_probe: bool,
    /// Where to write the probed topology (JSON, `tpar topo --json`'s format; `tpar sim
    /// --topology FILE` reads it). Default: the profile's path with .topology.json
    #[arg(long = "topology-out", value_name = "FILE")]
    pub topology_out: Option<PathBuf>,
    /// Run a communicator's start instead: read this machine's tune from the tune cache, or
    /// run the first-use tune and store it there (TPAR_TUNE applies); writes no -o file
    #[arg(long)]
    pub cache: bool,
}

impl TuneArgs {
    fn topology_path(&self) -> PathBuf {
        self.topology_out.clone().unwrap_or_else(|| self.out.with_extension("topology.json"))
    }
}

pub fn run(args: TuneArgs) -> Result<(), String> {
    let target = args.ranks.target("tune", true)?;
    harness::no_tune_at_join();
    if matches!(target, Target::Emulated { .. }) && harness::first_process() {
        eprintln!("tpar tune: emulated ranks share one GPU and measure no fabric: a test of tune (and of the link probe); the profile gets no buckets");
    }
    let sizes = harness::size_steps(args.min_bytes, args.max_bytes, args.step_factor)?;
    let dtypes = harness::parse_dtypes(&args.dtype)?;
    harness::holds_an_element("-b", args.min_bytes, &dtypes)?;
    if args.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    let capture = match harness::parse_modes(args.capture.as_deref().or(if target == Target::Cpu { None } else { Some("graph") }), &target)?[..] {
        [m] => m,
        _ => return Err("--capture: expected graph or eager (a profile holds one mode; --cache tunes both)".into()),
    };
    if harness::first_process() && !args.cache {
        output::check_writable("-o", &args.out)?;
        if !args.no_probe && target != Target::Cpu {
            output::check_writable("--topology-out", &args.topology_path())?;
        }
    }
    let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
    let plan = TunePlan {
        sizes: sizes.iter().map(|&s| s as u64).collect(),
        collectives: tpar::tune::gather_scatter(&tpar::tune::GATHER_SCATTER_TOKENS, largest, &dtypes),
        dtypes,
        modes: vec![capture],
        rounds: Rounds { warmup: args.warmup, iters: args.iters, inner: if target == Target::Cpu { 1 } else { args.graph_inner.max(1) } },
        probe: !args.no_probe && target != Target::Cpu,
        max_seconds: CLI_MAX_SECONDS,
    };
    let max = if args.cache { args.max_bytes } else { sizes.iter().copied().max().unwrap_or(0) };
    let ran = harness::run_groups(&target, &args.ranks, max, |g| tune_group(g, &args, &plan, capture))?;
    if !ran && !args.cache {
        println!("use it with: TPAR_PROFILE={} (or tpar plan --profile {})", args.out.display(), args.out.display());
    }
    Ok(())
}

fn tune_group(g: &mut Group, a: &TuneArgs, plan: &TunePlan, capture: CaptureMode) -> Result<(), String> {
    let root = g.root();
    if a.cache {
        let settings = tpar::Settings::from_env().map_err(|e| e.to_string())?;
        let o = g.tune(StartOptions::first_use(settings.tune), a.max_bytes)?;
        if root {
            println!("# {} ranks ({}): {}", g.world(), g.label(), o.line());
            if let Some(t) = o.tuned() {
                for line in t.describe() {
                    println!("{line}");
                }
            }
        }
        return match o {
            Outcome::Failed { why, .. } => Err(format!("the tune failed: {why}")),
            Outcome::Skipped { .. } | Outcome::Cached { .. } | Outcome::Tuned { .. } => Ok(()),
        };
    }
    let o = g.tune(StartOptions::measure_only(plan.clone()), a.max_bytes)?;
    let tuned = match &o {
        Outcome::Tuned { tuned, .. } => tuned,
        other => return Err(other.line()),
    };
    if !root {
        return Ok(());
    }
    let fabric = tuned.key.ranks.not_fabric();
    let mut profile = match tuned.profile(capture) {
        Some(p) => p.clone(),
        None => return Err(format!("the tune measured no {capture} calls")),
    };
    if fabric.is_some() {
        profile.tables.clear();
    }
    profile.save(&a.out).map_err(|e| e.to_string())?;
    println!(
        "# tpar tune: {} ranks ({}), {capture} mode, {} screens and {} points measured in {:.2} s, wrote {}",
        g.world(),
        g.label(),
        tuned.cost.screens,
        tuned.cost.points,
        tuned.cost.seconds,
        a.out.display()
    );
    println!("# NCCL {}", tuned.nccl);
    match &profile.probe {
        Some(p) => {
            print!("{}", p.table());
            write_topology(a, p)?;
            println!(
                "# link probe: {} entries in the profile and in {} ({:.2} s){}",
                p.pairs.len(),
                a.topology_path().display(),
                tuned.cost.probe_seconds,
                match p.collapsed_writes(g.world()) {
                    Some(c) => format!("; SM stores collapsed (GPU{}->GPU{}): the plan picks no push algorithm where it has no bucket", c.src, c.dst.unwrap_or(c.src)),
                    None => String::new(),
                }
            );
        }
        None if a.no_probe => println!("# link probe: skipped (--no-probe)"),
        None if g.label() == "cpu" => println!("# link probe: none (CPU ranks)"),
        None => println!("# link probe: none ({})", if tuned.cost.budget.contains("probe failed") { tuned.cost.budget.as_str() } else { "nothing to probe" }),
    }
    if let Some(why) = fabric {
        println!("# no buckets: {why}");
    } else if profile.tables.is_empty() {
        println!("# no buckets: nothing measured");
    }
    if tuned.rejected.is_empty() {
        println!("# every candidate was bit-exact: every rank's output equal to the rank-order f32 sum of seeded random inputs, and to every other rank's");
    } else {
        let r: Vec<String> = tuned.rejected.iter().map(|x| x.to_string()).collect();
        println!("# rejected (not bit-exact), never chosen: {}", r.join("; "));
    }
    for line in profile.describe() {
        println!("{line}");
    }
    Ok(())
}

/// Writes the discovered topology with the probe's figures to `--topology-out`.
fn write_topology(a: &TuneArgs, p: &tpar::topology::probe::Probe) -> Result<(), String> {
    let mut t = tpar::Topology::discover();
    t.probe = Some(p.clone());
    if t.validate().is_err() {
        // The probe names the ranks' GPUs (0..world); a machine whose discovery lists fewer
        // (emulated ranks) keeps the figures in the profile only.
        println!("# link probe: not written into the discovered topology (its GPUs differ from the probed ranks')");
        return Ok(());
    }
    let path = a.topology_path();
    std::fs::write(&path, t.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}
