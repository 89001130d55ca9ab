//! The one table of `tpar bench`, in nccl-tests' `all_reduce_perf` layout: a `#` preamble,
//! one block per algorithm with two header lines (names, units), a row per size, a summary.
//! Every kind of rank prints through these functions.
//!
//! Columns: size, count, type, redop, then per timing mode (eager, graph) time, p10, p90
//! (us; per iteration the slowest rank), algbw, busbw (GB/s), then #wrong.

use super::output::BenchRecord;
use std::io::Write;
use tpar::report::Record;
use tpar::{Algorithm, CaptureMode, DType};

/// Prints `lines` with nccl-tests' `#` prefix.
pub fn preamble(lines: &[String]) {
    for l in lines {
        println!("#  {l}");
    }
}

/// The header of one algorithm's block.
pub fn block_header(algo: &str, transport: &str, world: usize, place: &str, modes: &[CaptureMode]) {
    println!("#");
    println!("# algorithm: {algo}, transport: {transport}, ranks: {world} ({place})");
    let mut h1 = format!("# {:>10} {:>12} {:>8} {:>6}", "size", "count", "type", "redop");
    let mut h2 = format!("# {:>10} {:>12} {:>8} {:>6}", "(B)", "(elements)", "", "");
    for m in modes {
        let time = if modes.len() > 1 { format!("{m} time") } else { "time".to_string() };
        h1.push_str(&format!(" {:>10} {:>9} {:>9} {:>7} {:>7}", time, "p10", "p90", "algbw", "busbw"));
        h2.push_str(&format!(" {:>10} {:>9} {:>9} {:>7} {:>7}", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)"));
    }
    println!("{h1} {:>6}", "#wrong");
    println!("{h2}");
}

/// One size: a cell per mode (in the header's order), then #wrong (-1: not checked).
pub fn row(cells: &[Record], wrong: i64) {
    let Some(f) = cells.first() else { return };
    let redop = if f.collective == tpar::Collective::AllGather {
        "none"
    } else {
        "sum"
    };
    let mut s = format!(
        "  {:>10} {:>12} {:>8} {:>6}",
        f.bytes,
        f.count,
        f.dtype.name(),
        redop
    );
    for r in cells {
        s.push_str(&format!(" {:>10.2} {:>9.2} {:>9.2} {:>7.2} {:>7.2}", r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw));
    }
    let wrong = if wrong < 0 { "N/A".to_string() } else { wrong.to_string() };
    println!("{s} {wrong:>6}");
    let _ = std::io::stdout().flush();
}

/// Per mode, dtype and size: the plan's pick (where the group has a plan) or else the
/// fastest algorithm, against the baseline measured in the same run (NCCL where it ran,
/// else gather-bcast).
pub fn summary(records: &[BenchRecord], pick: &mut dyn FnMut(CaptureMode, DType, usize) -> Option<Algorithm>) {
    let baseline = if records.iter().any(|g| g.record.algorithm == Algorithm::Nccl) { Algorithm::Nccl } else { Algorithm::GatherBcast };
    println!("#");
    println!("# Summary: per size, the plan's pick (or the fastest) against {baseline} measured in the same run (median us per call; speedup = {baseline} / pick)");
    println!(
        "# {:>6} {:>9} {:>10} {:>14} {:>9} {:>14} {:>9} {:>9} {:>8}",
        "mode", "type", "size (B)", "pick", "(us)", "fastest", "(us)", baseline.name(), "speedup"
    );
    let mut keys: Vec<(CaptureMode, DType, usize)> = records.iter().map(|g| (g.mode, g.record.dtype, g.record.bytes)).collect();
    keys.sort();
    keys.dedup();
    for (mode, d, bytes) in keys {
        let here = || records.iter().filter(move |g| g.mode == mode && g.record.dtype == d && g.record.bytes == bytes);
        let at = |a: Algorithm| here().find(|g| g.record.algorithm == a);
        let Some(best) = here()
            .filter(|g| g.record.wrong <= 0 && g.record.algorithm != baseline)
            .min_by(|a, b| a.record.time_us.total_cmp(&b.record.time_us))
        else {
            continue;
        };
        let chosen = pick(mode, d, bytes).and_then(at).unwrap_or(best);
        let (base, speed) = match at(baseline) {
            Some(b) => (format!("{:.2}", b.record.time_us), format!("{:.2}x", b.record.time_us / chosen.record.time_us)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "  {:>6} {:>9} {:>10} {:>14} {:>9.2} {:>14} {:>9.2} {:>9} {:>8}",
            mode.name(),
            d.name(),
            bytes,
            chosen.record.algorithm.name(),
            chosen.record.time_us,
            best.record.algorithm.name(),
            best.record.time_us,
            base,
            speed
        );
    }
    let n = records.len().max(1) as f64;
    // `+ 0.0`: an empty f64 sum is -0.0, which would print as -0.0000.
    println!("# Avg bus bandwidth    : {:.4} GB/s", records.iter().map(|g| g.record.busbw).sum::<f64>() / n + 0.0);
}

/// `--sequence`: one line per algorithm and mode, us per step.
pub fn sequence_header(calls: usize, bytes: usize, d: DType) {
    println!("#");
    println!("# Sequence: {calls} all-reduces of {bytes} B {d} per step (a decode or verify step); us per step, median [p10-p90] over -n iterations, slowest rank");
}

pub fn sequence_row(mode: CaptureMode, algo: Algorithm, calls: usize, step: (f64, f64, f64), vs_nccl: Option<f64>, picked: bool) {
    let (m, l, h) = step;
    let vs = vs_nccl.map_or(String::new(), |n| format!("  NCCL/this {:.2}x", n / m));
    let mark = if picked { "  <- plan" } else { "" };
    println!("  {:>6} {:>14} {:>10.1} us [{l:.1}-{h:.1}]  {:>6.2} us per call{vs}{mark}", mode.name(), algo.name(), m, m / calls as f64);
}
