//! `tpar selftest fused`: the fused all-reduce + residual add + RMSNorm on emulated ranks,
//! checked over shapes, dtypes, algorithms, capture modes, in place and not, fused and unfused
//! paths, then a mixed sequence in one graph (harness/fused.rs does each call).

use super::{Common, FusedArgs};
use crate::harness::fused::{call, fusable, parse_list, FusedRanks, FusedVerdict};
use crate::harness::{self, Target};
use tpar::algorithms::registry::algorithms_emulated;
use tpar::cuda::FusedPath;
use tpar::plan::CaptureMode;
use tpar::{Algorithm, DType, Transport};

/// Per (world, algorithm, dtype, mode): calls, paths taken, failures.
#[derive(Default)]
struct Tally {
    calls: usize,
    fused: usize,
    unfused: usize,
    failed: usize,
}

pub fn fused((worlds, transport): &(Vec<usize>, Transport), c: &Common, a: &FusedArgs) -> Result<(), String> {
    let dtypes = harness::parse_dtypes(&c.dtype)?;
    let hidden = parse_list(&a.hidden, "--hidden")?;
    let rows = parse_list(&a.rows, "--rows")?;
    let modes: Vec<CaptureMode> = match a.mode.as_str() {
        "eager" => vec![CaptureMode::Eager],
        "graph" => vec![CaptureMode::Graph],
        "both" => vec![CaptureMode::Eager, CaptureMode::Graph],
        m => return Err(format!("--mode {m:?}: eager, graph or both")),
    };
    let target = Target::Emulated { worlds: worlds.clone(), transport: *transport };
    let runs = fusable(&algorithms_emulated(*transport));
    let algos: Vec<Algorithm> = if a.algo == "all" {
        runs.clone()
    } else {
        let picked: Vec<Algorithm> = harness::parse_algos(&a.algo, &target)?.into_iter().flatten().collect();
        if let Some(x) = picked.iter().find(|x| !runs.contains(x)) {
            return Err(format!("--algo {x}: no fused kernel over {transport} (fused: {})", runs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")));
        }
        picked
    };
    let max_hidden = hidden.iter().copied().max().unwrap_or(1).max(7168);
    let max_bytes = (rows.iter().copied().max().unwrap_or(1).max(a.seq_rows) * max_hidden * 4).max(1 << 16);
    let mut bad: Vec<String> = Vec::new();
    let mut total = 0usize;
    println!("# tpar selftest fused: algorithms {}, dtypes {}, hidden {:?}, rows {:?}, modes {:?}", algos.iter().map(|a| a.name()).collect::<Vec<_>>().join(","), c.dtype, hidden, rows, a.mode);
    println!("# {:>5} {:>13} {:>9} {:>6} {:>7} {:>6} {:>8} {:>7}", "world", "algorithm", "dtype", "mode", "calls", "fused", "unfused", "failed");
    for &world in worlds {
        let mut fr = FusedRanks::new(c.ranks.device, world, max_bytes, max_hidden, *transport, c.ranks.skew_ns)?;
        let mut n = 0u64;
        for &algo in &algos {
            for &d in &dtypes {
                for &mode in &modes {
                    let mut t = Tally::default();
                    for &h in &hidden {
                        for &r in &rows {
                            let fc = call(d, r, h);
                            if fc.validate().is_err() {
                                continue; // not whole 16-byte vectors of this dtype: refused by design
                            }
                            n += 1;
                            let in_place = n % 2 == 1;
                            let mut paths = vec![false];
                            if a.unfused_every > 0 && n % a.unfused_every as u64 == 0 {
                                paths.push(true);
                            }
                            for unfused in paths {
                                let (path, v) = fr.check(algo, &fc, c.seed, n, in_place, mode, unfused, a.replays)?;
                                t.calls += 1;
                                match path {
                                    FusedPath::Fused(_) => t.fused += 1,
                                    FusedPath::Unfused(_) => t.unfused += 1,
                                }
                                if !v.ok() {
                                    t.failed += 1;
                                    bad.push(describe(world, d, mode, r, h, in_place, path, &v));
                                }
                            }
                        }
                    }
                    total += t.calls;
                    println!("  {world:>5} {:>13} {:>9} {:>6} {:>7} {:>6} {:>8} {:>7}", algo.name(), d.name(), mode.to_string(), t.calls, t.fused, t.unfused, t.failed);
                }
            }
        }
        if a.seq_calls > 0 {
            let d = if dtypes.contains(&DType::BF16) { DType::BF16 } else { dtypes[0] };
            let fc = call(d, a.seq_rows, 7168);
            let v = fr.check_sequence(&algos, &fc, c.seed, a.seq_calls, a.replays.max(2))?;
            println!(
                "  {world:>5} sequence of {} calls in one graph (fused and plain, {}), {} x 7168 {d}, {} replays: {}",
                a.seq_calls,
                algos.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                a.seq_rows,
                a.replays.max(2),
                if v.ok() { "ok".to_string() } else { format!("{v:?}") }
            );
            total += a.seq_calls * a.replays.max(2);
            if !v.ok() {
                bad.push(format!("{world} ranks: mixed sequence: {v:?}"));
            }
        }
    }
    if !bad.is_empty() {
        for b in bad.iter().take(40) {
            eprintln!("FAIL {b}");
        }
        return Err(format!("{} of {total} checked calls wrong (first ones above)", bad.len()));
    }
    println!("PASS: {total} fused calls bit for bit the reference, within the f64 bound, every rank identical");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn describe(world: usize, d: DType, mode: CaptureMode, rows: usize, hidden: usize, in_place: bool, path: FusedPath, v: &FusedVerdict) -> String {
    format!(
        "{world} ranks {path} {d} {rows} x {hidden} ({mode}{}): {} elements differ from the reference, {} residual / {} norm outside the f64 bound, ranks identical: {}",
        if in_place { ", in place" } else { "" },
        v.inexact,
        v.f64_bad.0,
        v.f64_bad.1,
        v.identical
    )
}
