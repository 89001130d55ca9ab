//! `tpar selftest fused`: the fused all-reduce + residual add + RMSNorm and its family
//! (--pattern) on emulated ranks, checked over shapes, dtypes, algorithms, capture modes, in
//! place and not, fused and unfused paths, then a mixed sequence in one graph
//! (harness/fused.rs does each call).

use super::{Common, FusedArgs};
use crate::harness::fused::{call, fusable, parse_list, parse_patterns, FusedIo, FusedRanks, FusedVerdict};
use crate::harness::{self, Target};
use tpar::algorithms::registry::algorithms_emulated;
use tpar::cuda::{FusedPath, FusedPattern};
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
    // The flags' values, checked before any rank starts: a bad one is a refusal (exit 2).
    let (dtypes, hidden, rows, patterns, modes) = crate::exit::refusing(|| {
        let modes: Vec<CaptureMode> = match a.mode.as_str() {
            "eager" => vec![CaptureMode::Eager],
            "graph" => vec![CaptureMode::Graph],
            "both" => vec![CaptureMode::Eager, CaptureMode::Graph],
            m => return Err(format!("--mode {m:?}: eager, graph or both")),
        };
        Ok((harness::parse_dtypes(&c.dtype)?, parse_list(&a.hidden, "--hidden")?, parse_list(&a.rows, "--rows")?, parse_patterns(&a.pattern)?, modes))
    })?;
    // Per pattern: calls, fused, failed.
    let mut per_pattern: Vec<(FusedPattern, Tally)> = patterns.iter().map(|p| (*p, Tally::default())).collect();
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
    println!(
        "# tpar selftest fused: algorithms {}, dtypes {}, hidden {:?}, rows {:?}, modes {:?}, patterns {} (in turn)",
        algos.iter().map(|a| a.name()).collect::<Vec<_>>().join(","),
        c.dtype,
        hidden,
        rows,
        a.mode,
        patterns.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
    );
    println!("# {:>5} {:>13} {:>9} {:>6} {:>7} {:>6} {:>8} {:>7}", "world", "algorithm", "dtype", "mode", "calls", "fused", "unfused", "failed");
    for &world in worlds {
        let mut fr = FusedRanks::new(c.ranks.device, world, max_bytes, max_hidden, *transport, c.ranks.skew_ns)?;
        if let Some(e) = a.epoch_start {
            fr.g.set_epoch_for_test(e).map_err(crate::harness::gpu::err)?;
            println!("# epochs start at {e} (the sweep crosses 2^32 after {} calls)", u32::MAX - e + 1);
        }
        let mut n = 0u64;
        for &algo in &algos {
            for &d in &dtypes {
                for &mode in &modes {
                    let mut t = Tally::default();
                    for &h in &hidden {
                        for &r in &rows {
                            let pi = (n as usize) % patterns.len();
                            let fc = call(d, r, h, patterns[pi]);
                            if fc.validate().is_err() {
                                continue; // not whole 16-byte vectors of this dtype: refused by design
                            }
                            n += 1;
                            let io = FusedIo::ALL[(n % 3) as usize];
                            let mut paths = vec![false];
                            if a.unfused_every > 0 && n % a.unfused_every as u64 == 0 {
                                paths.push(true);
                            }
                            for unfused in paths {
                                let (path, v) = fr.check(algo, &fc, c.seed, n, io, mode, unfused, a.replays)?;
                                t.calls += 1;
                                let pt = &mut per_pattern[pi].1;
                                pt.calls += 1;
                                match path {
                                    FusedPath::Fused(_) => {
                                        t.fused += 1;
                                        pt.fused += 1;
                                    }
                                    FusedPath::Unfused(_) => {
                                        t.unfused += 1;
                                        pt.unfused += 1;
                                    }
                                }
                                if !v.ok() {
                                    t.failed += 1;
                                    pt.failed += 1;
                                    bad.push(describe(world, d, mode, r, h, io, path, patterns[pi], &v));
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
            let fc = call(d, a.seq_rows, 7168, FusedPattern::ADD_RMSNORM);
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
    // A rank that makes the plain all-reduce while its peers make the fused call (the
    // descriptor's fused bit): every rank must get Mismatch naming it, then Poisoned.
    if a.mismatch {
        let world = worlds[0];
        let algo = algos[0];
        let d = dtypes[0];
        let mut fr = FusedRanks::new(c.ranks.device, world, 1 << 20, 7168, *transport, None)?;
        let fc = call(d, 3, 7168, patterns[0]);
        fr.check(algo, &fc, c.seed, 1, FusedIo::OutOfPlace, CaptureMode::Eager, false, 1).map_err(|e| format!("mismatch check: the honest control call failed: {e}"))?;
        fr.g.set_desc_override_for_test(Some((world - 1, tpar::cuda::abi::desc_code(algo, d))));
        let bufs = fr.ptrs(FusedIo::OutOfPlace, fc.pattern);
        let r = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs, 0, false).and_then(|_| fr.g.synchronize());
        fr.g.set_desc_override_for_test(None);
        let after = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs, 0, false).and_then(|_| fr.g.synchronize());
        match (&r, &after) {
            (Err(tpar::Error::Mismatch { field, .. }), Err(_)) if field.starts_with("fused") => {
                println!("  {world:>5} a rank calling the plain all-reduce among fused calls: {}; next call: {}", r.as_ref().err().map_or(String::new(), |e| e.to_string()), after.as_ref().err().map_or(String::new(), |e| e.to_string()));
            }
            _ => bad.push(format!("{world} ranks: a plain call among fused ones was not a Mismatch on `fused` then Poisoned: {r:?}, then {after:?}")),
        }
        // Another pattern on one rank (its descriptor's pattern bits), on a fresh group.
        let mut fr = FusedRanks::new(c.ranks.device, world, 1 << 20, 7168, *transport, None)?;
        let other = FusedPattern { gemma: !fc.pattern.gemma, ..fc.pattern };
        fr.check(algo, &fc, c.seed, 2, FusedIo::OutOfPlace, CaptureMode::Eager, false, 1).map_err(|e| format!("pattern mismatch check: the honest control call failed: {e}"))?;
        fr.g.set_desc_override_for_test(Some((world - 1, fr.g.fused_desc_code(algo, &call(d, 3, 7168, other)))));
        let r = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs_of(&fr, fc.pattern), 0, false).and_then(|_| fr.g.synchronize());
        fr.g.set_desc_override_for_test(None);
        let after = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs_of(&fr, fc.pattern), 0, false).and_then(|_| fr.g.synchronize());
        match (&r, &after) {
            (Err(tpar::Error::Mismatch { field, .. }), Err(_)) if field.starts_with("fused pattern") => {
                println!("  {world:>5} a rank calling {other} among {} calls: {}; next call: {}", fc.pattern, r.as_ref().err().map_or(String::new(), |e| e.to_string()), after.as_ref().err().map_or(String::new(), |e| e.to_string()));
            }
            _ => bad.push(format!("{world} ranks: a {other} call among {} ones was not a Mismatch on `fused pattern` then Poisoned: {r:?}, then {after:?}", fc.pattern)),
        }
        // Ranks that agree on the pattern but not on two-shot pull's row ownership (its
        // descriptor's NORM_ROWS bit: TPAR_FUSED_ROWS set differently), on a fresh group.
        if algos.contains(&Algorithm::TwoshotPull) {
            let algo = Algorithm::TwoshotPull;
            let mut fr = FusedRanks::new(c.ranks.device, world, 1 << 20, 7168, *transport, None)?;
            match fr.g.fused_unfit(algo, &fc) {
                Some(why) => println!("  {world:>5} row-ownership mismatch skipped: {algo}'s fused kernel does not take {} x {} ({why})", fc.rows, fc.hidden),
                None => {
                    fr.check(algo, &fc, c.seed, 3, FusedIo::OutOfPlace, CaptureMode::Eager, false, 1).map_err(|e| format!("row-ownership mismatch check: the honest control call failed: {e}"))?;
                    let honest = fr.g.fused_desc_code(algo, &fc);
                    let owned = honest & (tpar::cuda::abi::NORM_ROWS << 8) != 0;
                    fr.g.set_desc_override_for_test(Some((world - 1, honest ^ (tpar::cuda::abi::NORM_ROWS << 8))));
                    let r = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs_of(&fr, fc.pattern), 0, false).and_then(|_| fr.g.synchronize());
                    fr.g.set_desc_override_for_test(None);
                    let after = fr.g.enqueue_add_rmsnorm(algo, &fc, &bufs_of(&fr, fc.pattern), 0, false).and_then(|_| fr.g.synchronize());
                    let lie = if owned { "the spread norm" } else { "owned rows" };
                    match (&r, &after) {
                        (Err(tpar::Error::Mismatch { field, .. }), Err(_)) if field.contains("row ownership") => {
                            println!("  {world:>5} a rank announcing {lie} among {algo} calls that {} rows: {}; next call: {}", if owned { "own" } else { "do not own" }, r.as_ref().err().map_or(String::new(), |e| e.to_string()), after.as_ref().err().map_or(String::new(), |e| e.to_string()));
                        }
                        _ => bad.push(format!("{world} ranks: a rank announcing {lie} among {algo} calls was not a Mismatch on the row ownership then Poisoned: {r:?}, then {after:?}")),
                    }
                }
            }
        }
    }
    for (p, t) in &per_pattern {
        println!("# pattern {:<22} calls {:>6}  fused {:>6}  unfused {:>6}  failed {:>4}", p.name(), t.calls, t.fused, t.unfused, t.failed);
    }
    if !bad.is_empty() {
        for b in bad.iter().take(40) {
            eprintln!("FAIL {b}");
        }
        return Err(format!("{} of {total} checked calls wrong (first ones above)", bad.len()));
    }
    println!("PASS: {total} fused calls bit for bit the reference (FP8: the e4m3 bytes; NVFP4: the e2m1 codes and the whole swizzled scale tensor, padding zeroed), within the f64 bound (patterns without Gemma or a quantized output), every rank identical");
    Ok(())
}

fn bufs_of(fr: &FusedRanks, p: FusedPattern) -> Vec<tpar::cuda::FusedBufs> {
    fr.ptrs(FusedIo::OutOfPlace, p)
}

#[allow(clippy::too_many_arguments)]
fn describe(world: usize, d: DType, mode: CaptureMode, rows: usize, hidden: usize, io: FusedIo, path: FusedPath, p: FusedPattern, v: &FusedVerdict) -> String {
    format!(
        "{world} ranks {path} {p} {d} {rows} x {hidden} ({mode}{}): {} elements differ from the reference, {} residual / {} norm outside the f64 bound, ranks identical: {}",
        io.label(),
        v.inexact,
        v.f64_bad.0,
        v.f64_bad.1,
        v.identical
    )
}
