//! `tpar bench --fused`: the fused all-reduce + residual add + RMSNorm (and, with --pattern,
//! the rest of the family) timed in the same run as the all-reduce alone and as the
//! all-reduce followed by tpar's add-RMSNorm kernel of the same pattern (what an engine runs:
//! its all-reduce, then its fused_add_rms_norm / rms_norm, the FP8 or NVFP4 quantization in
//! the same kernel), per (pattern, hidden, rows, algorithm, mode), on emulated ranks. Each point is checked first (one fused call on fresh
//! inputs, bit for bit: #wrong). Torch's unfused ops are timed by bench/compare/fused_torch.py.

use super::args::BenchArgs;
use crate::harness::fused::{call, fusable, parse_list, parse_patterns, FusedIo, FusedRanks, Op};
use crate::harness::gpu::err;
use crate::harness::{self, Target, Timing};
use serde::Serialize;
use tpar::algorithms::registry::algorithms_emulated;
use tpar::units::percentiles;
use tpar::{Algorithm, CaptureMode};

/// Issue 24's targets (one H200, 8 emulated ranks, hidden 7168 x 1, 3, 8 rows, bf16, graphs):
/// the fused call within this much of the all-reduce alone, in us...
const TARGET_OVER_ALLREDUCE_US: f64 = 0.5;
/// ...and at least this much faster than the all-reduce followed by an add-RMSNorm kernel.
const TARGET_UNDER_UNFUSED_US: f64 = 1.5;

/// One timed point, as `--json` writes it.
#[derive(Serialize, Clone)]
struct FusedRecord {
    world: usize,
    transport: String,
    dtype: String,
    pattern: String,
    hidden: usize,
    rows: usize,
    bytes: usize,
    algorithm: String,
    mode: String,
    op: String,
    median_us: f64,
    p10_us: f64,
    p90_us: f64,
    calls_per_iteration: usize,
    wrong: i64,
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    let target = args.ranks.target("bench", true)?;
    let Target::Emulated { worlds, transport } = &target else {
        return Err("--fused runs on emulated ranks (--emulate-ranks N): one-process-per-GPU fused timings are not wired into tpar bench yet (tpar.torch's all_reduce_add_rmsnorm runs there)".into());
    };
    // The flags' values, checked before any rank starts: a bad one is a refusal (exit 2).
    let (hidden, rows, dtypes, patterns) = crate::exit::refusing(|| {
        if args.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        Ok((
            parse_list(args.hidden.as_deref().unwrap_or("7168"), "--hidden")?,
            parse_list(args.rows.as_deref().unwrap_or("1,3,8"), "--rows")?,
            harness::parse_dtypes(&args.dtype)?,
            parse_patterns(args.pattern.as_deref().unwrap_or("add_rmsnorm"))?,
        ))
    })?;
    let mode = if args.graph { Some("graph") } else { args.mode.as_deref() };
    let modes = harness::parse_modes(mode, &target)?;
    let runs = fusable(&algorithms_emulated(*transport));
    let algos: Vec<Algorithm> = match args.algo.as_str() {
        "all" => runs.clone(),
        s => {
            let v: Vec<Algorithm> = harness::parse_algos(s, &target)?.into_iter().flatten().collect();
            if let Some(x) = v.iter().find(|x| !runs.contains(x)) {
                return Err(format!("--algo {x}: no fused kernel over {transport}; fused: {}", runs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")));
            }
            v
        }
    };
    if let Some(f) = &args.json {
        crate::harness::output::check_all(&[("--json", Some(f.as_path()))])?;
    }
    let max_hidden = hidden.iter().copied().max().unwrap_or(1);
    let max_bytes = (rows.iter().copied().max().unwrap_or(1) * max_hidden * 4).max(1 << 16);
    let mut records = Vec::new();
    let mut wrong_total = 0i64;
    let inner = args.graph_inner.max(1);
    println!("# tpar bench --fused: all-reduce + residual add + RMSNorm (one kernel where the algorithm has one) against the all-reduce alone and the all-reduce followed by tpar's add-RMSNorm kernel");
    println!("#  time = median us per call over -n {} iterations of {inner} calls (back to back, or one captured graph), p10-p90 in brackets; #wrong: one fused call checked bit for bit first", args.iters);
    for &world in worlds {
        let mut fr = FusedRanks::new(args.ranks.device, world, max_bytes, max_hidden, *transport, args.ranks.skew_ns)?;
        for &d in &dtypes {
            for (&mode, &pattern) in modes.iter().flat_map(|m| patterns.iter().map(move |p| (m, p))) {
                println!("#");
                println!("# {world} emulated ranks, transport {transport}, {d}, {mode}, pattern {pattern}");
                println!(
                    "# {:>6} {:>5} {:>9} {:>13} {:>20} {:>20} {:>20} {:>20} {:>8} {:>10} {:>6}",
                    "hidden", "rows", "bytes", "algorithm", "all-reduce", "fused", "AR + add-rmsnorm", "add-rmsnorm", "fused-AR", "unfused-f", "#wrong"
                );
                for &h in &hidden {
                    for &r in &rows {
                        let fc = call(d, r, h, pattern);
                        fc.validate().map_err(err)?;
                        for &algo in &algos {
                            let wrong = if args.check != 0 {
                                let (_, v) = fr.check(algo, &fc, 0xf05e, (h * 1000 + r) as u64, FusedIo::OutOfPlace, CaptureMode::Eager, false, 1)?;
                                (v.inexact + v.f64_bad.0 + v.f64_bad.1 + usize::from(!v.identical)) as i64
                            } else {
                                -1
                            };
                            wrong_total += wrong.max(0);
                            let t = Timing { mode, inner, warmup: args.warmup, iters: args.iters };
                            let mut cells = Vec::new();
                            let mut launched = Vec::new();
                            for op in [Op::AllReduce, Op::Fused, Op::Unfused, Op::NormOnly] {
                                let mut s = fr.time(op, algo, &fc, t)?;
                                if op != Op::NormOnly {
                                    launched.push(format!("{} {}", op.label(), fr.last_launch));
                                }
                                let p = percentiles(&mut s);
                                records.push(FusedRecord {
                                    world,
                                    transport: transport.to_string(),
                                    dtype: d.name().into(),
                                    pattern: pattern.name(),
                                    hidden: h,
                                    rows: r,
                                    bytes: fc.bytes(),
                                    algorithm: algo.name().into(),
                                    mode: mode.to_string(),
                                    op: op.label().into(),
                                    median_us: p.median,
                                    p10_us: p.p10,
                                    p90_us: p.p90,
                                    calls_per_iteration: inner,
                                    wrong,
                                });
                                cells.push(p);
                            }
                            // Grid x block, cluster, PDL of the all-reduce's, the fused call's and
                            // the unfused path's kernels (emulated ranks share the GPU's SMs: the
                            // launcher sizes grids for that).
                            println!("# launches {h} x {r} {}: {}", algo.name(), launched.join("; "));
                            let cell = |p: &tpar::units::Spread| format!("{:.2} [{:.2}-{:.2}]", p.median, p.p10, p.p90);
                            println!(
                                "  {h:>6} {r:>5} {:>9} {:>13} {:>20} {:>20} {:>20} {:>20} {:>+8.2} {:>+10.2} {:>6}",
                                fc.bytes(),
                                algo.name(),
                                cell(&cells[0]),
                                cell(&cells[1]),
                                cell(&cells[2]),
                                cell(&cells[3]),
                                cells[1].median - cells[0].median,
                                cells[2].median - cells[1].median,
                                wrong
                            );
                        }
                    }
                }
            }
        }
    }
    println!("#");
    println!("# fused-AR: the fused call minus the all-reduce alone (issue 24's target at hidden 7168 x 1, 3, 8 rows, bf16, graphs, 8 ranks: <= +{TARGET_OVER_ALLREDUCE_US} us); unfused-f: the all-reduce + add-rmsnorm minus the fused call (target >= {TARGET_UNDER_UNFUSED_US} us)");
    if let Some(f) = &args.json {
        let text = serde_json::to_string_pretty(&records).map_err(|e| e.to_string())?;
        std::fs::write(f, text).map_err(|e| format!("--json {}: {e}", f.display()))?;
        println!("# wrote {} records to {}", records.len(), f.display());
    }
    if wrong_total > 0 {
        return Err(format!("{wrong_total} wrong elements in total (see #wrong)"));
    }
    Ok(())
}
