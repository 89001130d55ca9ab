//! `tpar tune`: on this machine's ranks (CPU rank processes or one rank process per GPU),
//! screen every candidate algorithm for bit-exact results, time the survivors at every size,
//! and write a profile (TOML) of the crossovers with a fingerprint; the plan uses it when
//! `TPAR_PROFILE` names it and the fingerprint matches.

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
/// Each candidate is first checked bit-exactly on inputs whose sums are exact (small
/// integers, signed zeros, the largest values that cannot overflow); one that fails is
/// never chosen. Then survivors are timed per size and the fastest per size bucket is kept.
/// Use the result with TPAR_PROFILE=FILE (or `tpar plan --profile FILE`).
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
}

pub fn run(args: TuneArgs) -> Result<(), String> {
    let target = args.ranks.target("tune", false)?;
    let sizes = harness::size_steps(args.min_bytes, args.max_bytes, args.step_factor)?;
    let dtypes = harness::parse_dtypes(&args.dtype)?;
    if args.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    let capture = match harness::parse_modes(args.capture.as_deref().or(if target == Target::Cpu { None } else { Some("graph") }), &target)?[..] {
        [m] => m,
        _ => return Err("--capture: expected graph or eager (a profile holds one mode)".into()),
    };
    if harness::first_process() {
        output::check_writable("-o", &args.out)?;
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
    let profile = Profile::from_measurements(&records, g.fingerprint(capture));
    profile.save(&a.out).map_err(|e| e.to_string())?;
    println!("# tpar tune: {} ranks ({}), {capture} mode, {} points measured, wrote {}", g.world(), g.label(), records.len(), a.out.display());
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
