//! `tpar tune`: on this machine's ranks (CPU rank processes or one rank process per GPU),
//! screen every candidate algorithm for bit-exact results, time the survivors at every size,
//! and write a profile (TOML) of the crossovers with a fingerprint; the plan uses it when
//! `TPAR_PROFILE` names it and the fingerprint matches. On GPUs it first runs the link probe
//! (`tpar::cuda::probe`, a few seconds; `--no-probe` skips it) and stores the figures in the
//! profile and in the topology it writes beside it, so that the plan's defaults and
//! `tpar sim` use the measured links instead of the link class's assumed ones.

use crate::harness::output;
use crate::harness::progress::Progress;
use crate::harness::{self, Group, RankArgs, Target, Timing};
use clap::Args;
use std::path::PathBuf;
use tpar::algorithms::registry::{spec, Role};
use tpar::plan::CaptureMode;
use tpar::profile::Profile;
use tpar::report::Record;
use tpar::DType;

/// Measure every candidate algorithm here and write a tuned profile (TOML) for the plan.
///
/// On GPUs, first the link probe (a few seconds; --no-probe skips it): SM store, SM load and
/// copy-engine bandwidth between the GPUs, alone and under all-to-all load, and one-way flag
/// latency. Its figures go into the profile and into the topology JSON written beside it
/// (--topology-out); where the profile applies, the plan's defaults (sizes and dtypes it has
/// no bucket for) and the simulator use them instead of the link class's assumed figures
/// (e.g. no push algorithm where SM stores to peers collapsed).
///
/// Each candidate is then checked bit-exactly on inputs whose sums are exact (small
/// integers, signed zeros, the largest values that cannot overflow); one that fails is
/// never chosen. Survivors are timed per size and the fastest per size bucket is kept.
/// Use the result with TPAR_PROFILE=FILE (or `tpar plan --profile FILE`).
///
/// --emulate-ranks N runs N ranks as streams of one GPU: a test of tune and of the probe on
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
    /// Largest message in bytes
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
    /// Skip the link probe (on GPUs it runs by default, a few seconds, before timing)
    #[arg(long = "no-probe")]
    pub no_probe: bool,
    /// Where to write the probed topology (JSON, `tpar topo --json`'s format; `tpar sim
    /// --topology FILE` reads it). Default: the profile's path with .topology.json
    #[arg(long = "topology-out", value_name = "FILE")]
    pub topology_out: Option<PathBuf>,
}

impl TuneArgs {
    fn topology_path(&self) -> PathBuf {
        self.topology_out.clone().unwrap_or_else(|| self.out.with_extension("topology.json"))
    }
}

pub fn run(args: TuneArgs) -> Result<(), String> {
    let target = args.ranks.target("tune", true)?;
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
        _ => return Err("--capture: expected graph or eager (a profile holds one mode)".into()),
    };
    if harness::first_process() {
        output::check_writable("-o", &args.out)?;
        if !args.no_probe && target != Target::Cpu {
            output::check_writable("--topology-out", &args.topology_path())?;
        }
    }
    let max = sizes.iter().copied().max().unwrap_or(0);
    let ran = harness::run_groups(&target, &args.ranks, max, |g| tune_group(g, &args, &sizes, &dtypes, capture))?;
    if !ran {
        println!("use it with: TPAR_PROFILE={} (or tpar plan --profile {})", args.out.display(), args.out.display());
    }
    Ok(())
}

fn tune_group(g: &mut dyn Group, a: &TuneArgs, sizes: &[usize], dtypes: &[DType], capture: CaptureMode) -> Result<(), String> {
    let root = g.root();
    // The link probe runs first, in the root process (the other ranks wait at the barrier).
    let probe = if root && !a.no_probe && g.label().starts_with("cuda") { probe_links(g, a)? } else { None };
    g.barrier()?;
    let algos: Vec<_> = g.algorithms().into_iter().filter(|x| spec(*x).role != Role::Baseline).collect();
    let inner = if g.label() == "cpu" { 1 } else { a.graph_inner };
    let mut bar = Progress::new(root, dtypes.len() * algos.len() * sizes.len());
    let (mut records, mut rejected) = (Vec::new(), Vec::new());
    for &d in dtypes {
        for &algo in &algos {
            for &bytes in sizes {
                bar.inc();
                let count = bytes / d.size();
                if count == 0 {
                    continue;
                }
                bar.set_message(format!("{capture} {d} {algo} {bytes} B"));
                let exact = g.exact(d, algo, count)?;
                let t = Timing { mode: capture, inner, warmup: a.warmup, iters: a.iters };
                if let Some(s) = g.time(algo, d, count, t)? {
                    if !exact {
                        rejected.push(format!("{algo} {d} {bytes} B"));
                    }
                    records.push(Record::measured(algo, g.label(), d, g.world(), count, (s.median, s.p10, s.p90), i64::from(!exact)));
                }
            }
        }
    }
    bar.finish();
    g.barrier()?;
    if !root {
        return Ok(());
    }
    let mut profile = Profile::from_measurements(&records, g.fingerprint(capture));
    profile.probe = probe;
    profile.save(&a.out).map_err(|e| e.to_string())?;
    println!("# tpar tune: {} ranks ({}), {capture} mode, {} points measured, wrote {}", g.world(), g.label(), records.len(), a.out.display());
    match &profile.probe {
        Some(p) => println!(
            "# link probe: {} entries in the profile and in {}{}",
            p.pairs.len(),
            a.topology_path().display(),
            match p.collapsed_writes(g.world()) {
                Some(c) => format!("; SM stores collapsed (GPU{}->GPU{}): the plan picks no push algorithm where it has no bucket", c.src, c.dst.unwrap_or(c.src)),
                None => String::new(),
            }
        ),
        None if a.no_probe => println!("# link probe: skipped (--no-probe)"),
        None => println!("# link probe: none (CPU ranks)"),
    }
    if profile.tables.is_empty() {
        println!("# no buckets: no checked {} record of world {} (emulated ranks time kernels, not a fabric)", profile.fingerprint.backend, g.world());
    }
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

/// Runs the link probe over the GPUs the ranks use (ranks map to ordinals 0..world; emulated
/// ranks use one GPU, `--device`), prints its table, and writes the discovered topology with
/// the probe to `--topology-out`.
#[cfg(feature = "cuda")]
fn probe_links(g: &dyn Group, a: &TuneArgs) -> Result<Option<tpar::topology::probe::Probe>, String> {
    let gpus = if g.label() == "cuda" { g.world() } else { a.ranks.device + 1 };
    let t0 = std::time::Instant::now();
    let p = tpar::cuda::probe::run(Some(gpus), &tpar::cuda::probe::ProbeOptions::default()).map_err(|e| format!("link probe: {e} (--no-probe skips it)"))?;
    println!("# link probe: {} GPU(s) in {:.1} s", gpus, t0.elapsed().as_secs_f64());
    print!("{}", p.table());
    let mut t = tpar::Topology::discover();
    t.probe = Some(p.clone());
    t.validate().map_err(|e| format!("link probe: {e}"))?;
    let path = a.topology_path();
    std::fs::write(&path, t.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(Some(p))
}

#[cfg(not(feature = "cuda"))]
fn probe_links(_: &dyn Group, _: &TuneArgs) -> Result<Option<tpar::topology::probe::Probe>, String> {
    Ok(None)
}
