//! `tpar check`: the correctness sweep, on CPU rank processes, one rank process per GPU, or
//! emulated ranks alike. Every variant (the plan's pick, then every algorithm forced) x dtype
//! x counts from 0 to -e with odd tails, then a long sequence of random calls; outputs
//! poisoned first, judged by the one verifier (bitwise against the rank-order f32 sum, and
//! within the f64 reference's bound), and every rank's output compared bitwise with the others'.

use crate::harness::progress::Progress;
use crate::harness::{self, Group, Io, RankArgs, Target, Verdict};
use clap::Args;
use std::collections::BTreeMap;
use std::time::Instant;
use tpar::testing::SplitMix;
use tpar::{Algorithm, CaptureMode, Collective, DType};

/// Verify every algorithm on this machine's ranks (exits non-zero on any wrong element).
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub ranks: RankArgs,
    /// Largest call of the sweep and of the random calls (42K, 1.5M, 1KiB: powers of 1024)
    #[arg(short = 'e', long = "maxbytes", default_value = "4M", value_parser = harness::size)]
    pub max_bytes: usize,
    /// Datatypes: float, half, bfloat16 (comma-separated) or all
    #[arg(short = 'd', long = "datatype", default_value = "all")]
    pub dtype: String,
    /// Algorithms: a comma list, `all` (the plan's pick and every algorithm these ranks run),
    /// or `auto` (the plan's pick only)
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Calls of random size, algorithm and dtype after the sweep
    #[arg(long, default_value_t = 1000)]
    pub calls: u64,
    /// Seed for inputs and the random sequence
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The collective: all-reduce, all-gather or reduce-scatter (nccl-tests' names, such as
    /// all_gather_perf, are taken too). -e is then the all-gather's output and the
    /// reduce-scatter's input, every rank's part, as all_gather_perf and reduce_scatter_perf
    /// size them
    #[arg(long, default_value = "all-reduce", value_parser = harness::parse_collective)]
    pub collective: Collective,
    /// Print only the verdict
    #[arg(long)]
    pub quiet: bool,
    /// GPU rank processes, one-GPU test: every rank on GPU 0, planning for this topology
    /// (preset or JSON). Calls the plan sends to NCCL fail there (NCCL refuses two ranks on
    /// one GPU), so keep -e below the topology's NCCL threshold
    #[arg(long, hide = true)]
    pub plan_topology: Option<String>,
}

/// What `check_group` runs, validated before any rank starts.
pub struct Sweep {
    pub collective: Collective,
    pub dtypes: Vec<DType>,
    pub algos: Vec<Option<Algorithm>>,
    pub max_bytes: usize,
    pub calls: u64,
    pub seed: u64,
    pub quiet: bool,
}

pub fn run(args: CheckArgs) -> Result<(), String> {
    let target = args.ranks.target("check", true)?;
    let c = args.collective;
    let mut algos = harness::parse_algos_for(&args.algo, &target, c)?;
    if args.algo.trim() == "all" && !matches!(target, Target::Emulated { .. }) {
        algos.insert(0, None);
    }
    if algos == [None] && matches!(target, Target::Emulated { .. }) {
        return Err("--algo auto: emulated ranks have no plan; name algorithms or use all".into());
    }
    let dtypes = harness::parse_dtypes(&args.dtype)?;
    harness::holds_an_element("-e", args.max_bytes, &dtypes)?;
    let sweep = Sweep {
        collective: c,
        dtypes,
        algos,
        max_bytes: args.max_bytes,
        calls: args.calls,
        seed: args.seed,
        quiet: args.quiet,
    };
    match (&args.plan_topology, &target) {
        (None, _) => {
            harness::run_groups(&target, &args.ranks, args.max_bytes, |g| check_group(g, &sweep))?;
            Ok(())
        }
        #[cfg(feature = "cuda")]
        (Some(t), Target::Gpu) => {
            let topology = tpar::Topology::load(t).map_err(|e| e.to_string())?;
            if !harness::launch::is_rank() {
                return harness::gpu::launch_ranks(args.ranks.world.unwrap_or(2), harness::launch::FAIL_GRACE, true);
            }
            let mut g = Group::Gpu(harness::gpu::GpuRanks::join(args.max_bytes, Some(&topology))?);
            check_group(&mut g, &sweep)
        }
        (Some(_), _) => Err("--plan-topology puts GPU rank processes on one GPU: use --backend cuda".into()),
    }
}

/// Counts of the sweep for `d`: small ones, then 1 B to `max_bytes` by factors of 4, each
/// also with one element more (odd tails) where it fits.
pub fn sweep_counts(d: DType, max_bytes: usize) -> Vec<usize> {
    let max = max_bytes / d.size();
    let mut v: Vec<usize> = vec![0, 1, 7, 16, 1000];
    let mut b = 1usize;
    while b <= max_bytes {
        let n = (b / d.size()).max(1);
        v.push(n);
        v.push(n + 1);
        b *= 4;
    }
    v.push(max);
    v.retain(|&n| n <= max);
    v.sort_unstable();
    v.dedup();
    v
}

/// Log-uniform in 1..=max: small and large calls both appear often.
fn log_uniform(g: &mut SplitMix, max: usize) -> usize {
    let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((max.max(1) as f64).ln() * u).exp().clamp(1.0, max.max(1) as f64) as usize
}

/// Counts per rank (as `Collective::io_elems` takes them) of the sweep of `c` for `d` on
/// `world` ranks: [`sweep_counts`] of the per-rank share of `max_bytes` (the all-gather's
/// output, the reduce-scatter's input), without the empty call.
pub fn collective_counts(c: Collective, d: DType, max_bytes: usize, world: usize) -> Vec<usize> {
    match c {
        Collective::AllReduce => sweep_counts(d, max_bytes),
        _ => sweep_counts(d, max_bytes / world.max(1))
            .into_iter()
            .filter(|&n| n > 0)
            .collect(),
    }
}

/// `n` as the call `v` of `c` runs it on `g`: on GPUs, tpar's all-gather and reduce-scatter
/// kernels take whole 16-byte vectors per rank (other counts go to NCCL), so a forced
/// kernel's count is rounded down to them (at least one vector).
fn fit_count(g: &Group, c: Collective, v: Option<Algorithm>, d: DType, n: usize) -> usize {
    let kernel = v.is_some_and(|a| a != Algorithm::Nccl);
    if c == Collective::AllReduce || !kernel || g.label() == "cpu" {
        return n;
    }
    let vec = 16 / d.size();
    (n - n % vec).max(vec)
}

/// An all-gather's or reduce-scatter's output never overlaps its input (tpar refuses it):
/// their in-place draws run out of place.
fn not_in_place_unless_all_reduce(c: Collective, io: Io) -> Io {
    if c != Collective::AllReduce && io == Io::InPlace {
        Io::OutOfPlace
    } else {
        io
    }
}

/// Runs the sweep and the random calls on `g`; the root prints the verdict.
pub fn check_group(g: &mut Group, o: &Sweep) -> Result<(), String> {
    let root = g.root();
    let c = o.collective;
    let runs = g.algorithms();
    let variants: Vec<Option<Algorithm>> = o.algos.iter().copied().filter(|c| c.map_or(true, |a| runs.contains(&a))).collect();
    let label = |v: Option<Algorithm>| v.map_or("plan".to_string(), |a| a.name().to_string());
    let describe = g.describe()?;
    if root && !o.quiet {
        println!("# tpar check ({c})");
        crate::harness::table::preamble(&describe);
        println!("#  variants: {}", variants.iter().map(|v| label(*v)).collect::<Vec<_>>().join(", "));
    }
    let mut failures: Vec<String> = Vec::new();
    let (mut wrong, mut identical) = (0usize, true);
    let mut note = |v: &Verdict, what: String| {
        wrong += v.wrong.max(v.inexact);
        identical &= v.identical;
        if !v.ok() {
            failures.push(format!("{what} ({}): {} wrong, {} differ from the rank-order sum, ranks identical: {}", v.algo, v.wrong, v.inexact, v.identical));
        }
    };
    let t0 = Instant::now();
    let mut call = 0u64;
    let mut skipped = 0u64;
    let world = g.world();
    if c != Collective::AllReduce && o.max_bytes / world < 16 {
        return Err(format!(
            "-e {}: the {c} of {world} ranks needs at least 16 bytes per rank ({} B)",
            o.max_bytes,
            16 * world
        ));
    }
    let total: usize = o
        .dtypes
        .iter()
        .map(|d| collective_counts(c, *d, o.max_bytes, world).len())
        .sum::<usize>()
        * variants.len();
    let mut bar = Progress::new(root, total);
    for &d in &o.dtypes {
        for &v in &variants {
            for n in collective_counts(c, d, o.max_bytes, world) {
                let n = fit_count(g, c, v, d, n);
                bar.set_message(format!("sweep {} {d} {n}", label(v)));
                if v.is_none()
                    && nccl_pick_without_nccl(
                        g.planned(c, d, n * d.size(), CaptureMode::Eager),
                        &runs,
                    )
                {
                    skipped += 1;
                    bar.inc();
                    continue;
                }
                let io = not_in_place_unless_all_reduce(
                    c,
                    match call % 8 {
                        3 | 7 => Io::InPlace,
                        5 => Io::CallerStream,
                        _ => Io::OutOfPlace,
                    },
                );
                let verdict = g.checked(c, d, v, o.seed, call, n, io)?;
                note(
                    &verdict,
                    format!("sweep {} {d} count {n}{}", label(v), io.label()),
                );
                call += 1;
                bar.inc();
            }
        }
    }
    bar.finish();
    let sweep_calls = call;
    let sweep_s = t0.elapsed().as_secs_f64();
    let mut rng = SplitMix::new(o.seed ^ SEQUENCE_SALT);
    let mut used: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut bar = Progress::new(root, o.calls as usize);
    for i in 0..o.calls {
        let d = o.dtypes[rng.below(o.dtypes.len() as u64) as usize];
        let v = variants[rng.below(variants.len() as u64) as usize];
        let per_rank = if c == Collective::AllReduce {
            o.max_bytes
        } else {
            o.max_bytes / world.max(1)
        };
        let n = fit_count(g, c, v, d, log_uniform(&mut rng, per_rank / d.size()));
        let io = not_in_place_unless_all_reduce(
            c,
            match rng.below(8) {
                0 | 1 => Io::InPlace,
                2 => Io::CallerStream,
                _ => Io::OutOfPlace,
            },
        );
        if v.is_none()
            && nccl_pick_without_nccl(g.planned(c, d, n * d.size(), CaptureMode::Eager), &runs)
        {
            skipped += 1;
            continue;
        }
        let verdict = g.checked(c, d, v, o.seed, call, n, io)?;
        *used.entry(verdict.algo.name()).or_default() += 1;
        note(&verdict, format!("random call {i}: {} {d} count {n}{}", label(v), io.label()));
        call += 1;
        if i % 64 == 0 {
            bar.set_message(format!("random calls, seed {}", o.seed));
            bar.set_position(i);
        }
        // Where the time goes, now and then: a run stopped by its time limit still says.
        if root && i > 0 && i % PHASE_REPORT_EVERY == 0 {
            if let Some(p) = g.phase_report() {
                bar.suspend(|| eprintln!("tpar: after {i} random calls: {p}"));
            }
        }
    }
    bar.finish();
    g.barrier()?;
    if !root {
        return if failures.is_empty() { Ok(()) } else { Err(format!("{} failed calls", failures.len())) };
    }
    if !o.quiet {
        let max = tpar::units::human_bytes(o.max_bytes as u64);
        println!(
            "#  sweep: {} dtypes x {} variants x counts from 0 to {max} (1 B to {max} by x4, odd tails; of every 8 calls 2 in place, 1 through a caller's stream on GPUs): {sweep_calls} calls, {sweep_s:.1} s",
            o.dtypes.len(),
            variants.len()
        );
        println!(
            "#  random: {} calls, dtype, variant and log-uniform size to {max} drawn from seed {} (a quarter in place), {:.1} s; algorithms that ran: {used:?}",
            o.calls,
            o.seed,
            t0.elapsed().as_secs_f64() - sweep_s
        );
        if let Some(p) = g.phase_report() {
            println!("#  {p}");
        }
        if skipped > 0 {
            println!("#  skipped: {skipped} calls whose plan pick is NCCL, which these ranks do not have (ranks sharing one GPU: NCCL refuses two ranks on one device); the forced variants cover those sizes");
        }
        match c {
            Collective::AllReduce => {}
            Collective::AllGather => println!("#  all-gather: -e is the output (every rank's part); each rank's output must be every rank's input in rank order, bit for bit"),
            Collective::ReduceScatter => println!("#  reduce-scatter: -e is the input (every rank's part); rank q's output is held to slice q of the all-reduce's references below"),
        }
        println!("#  each call: fresh random inputs, output poisoned, compared with the f64 sum (tpar's algorithms: one rounding, and bitwise with the rank-order f32 sum; hierarchical across islands: bitwise with its island arithmetic, a second rounding allowed; NCCL: a rounding per partial sum); all ranks' outputs compared bitwise");
    }
    for f in failures.iter().take(200) {
        println!("  FAIL {f}");
    }
    if failures.len() > 200 {
        println!("  ... and {} more", failures.len() - 200);
    }
    let verdict = if failures.is_empty() { "PASS" } else { "FAIL" };
    let skips = if skipped > 0 { format!(", {skipped} plan calls skipped (NCCL picks without NCCL)") } else { String::new() };
    println!(
        "{verdict}: {} ranks, {call} calls per rank, {wrong} wrong elements, ranks bitwise identical: {}, {} failed calls{skips}",
        g.world(),
        if identical { "all" } else { "no" },
        failures.len()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err("check failed".into())
    }
}

/// Whether the plan's pick for a call (`planned`, from the group's communicator, which has
/// already replaced NCCL by a kernel wherever one can take the call) is NCCL that this group
/// has not joined (`runs`: what it runs). Ranks sharing one GPU (`--plan-topology`) never have
/// NCCL, which refuses two ranks on one device: those calls are skipped and counted, not
/// failed.
fn nccl_pick_without_nccl(planned: Option<Algorithm>, runs: &[Algorithm]) -> bool {
    planned == Some(Algorithm::Nccl) && !runs.contains(&Algorithm::Nccl)
}

/// Random calls between two reports of where a group's time went (emulated ranks).
const PHASE_REPORT_EVERY: u64 = 1000;

/// Mixes the seed for the random sequence so it differs from the sweep's inputs.
const SEQUENCE_SALT: u64 = 0x5e9_5a17;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_counts_cover_tails_and_stay_within_the_workspace() {
        let c = sweep_counts(DType::BF16, 16 << 20);
        assert_eq!(c.first(), Some(&0));
        assert_eq!(c.last(), Some(&(8 << 20)));
        assert!(c.contains(&1) && c.contains(&3) && c.contains(&(1 << 19)) && c.contains(&((1 << 19) + 1)));
        assert!(c.windows(2).all(|w| w[0] < w[1]));
        let f = sweep_counts(DType::F32, 1000);
        assert!(f.iter().all(|&n| n <= 250), "{f:?}");
    }

    #[test]
    fn plan_calls_to_nccl_are_skipped_only_where_nccl_is_missing() {
        let kernels = [Algorithm::OneshotPush, Algorithm::TwoshotPush];
        let with_nccl = [Algorithm::OneshotPush, Algorithm::Nccl];
        assert!(nccl_pick_without_nccl(Some(Algorithm::Nccl), &kernels), "ranks on one GPU: skip");
        assert!(!nccl_pick_without_nccl(Some(Algorithm::Nccl), &with_nccl), "NCCL joined: run it");
        assert!(!nccl_pick_without_nccl(Some(Algorithm::OneshotPush), &kernels), "a kernel pick runs");
        assert!(!nccl_pick_without_nccl(None, &kernels), "no plan (emulated ranks): nothing to skip");
    }

    #[test]
    fn log_uniform_spans_the_range() {
        let mut g = SplitMix::new(7);
        let xs: Vec<usize> = (0..20000).map(|_| log_uniform(&mut g, 1 << 20)).collect();
        assert!(xs.iter().all(|&x| (1..=1 << 20).contains(&x)));
        assert!(xs.iter().filter(|&&x| x < 64).count() > 3000, "small sizes are common");
        assert!(xs.iter().filter(|&&x| x > 1 << 18).count() > 1000, "large sizes appear");
    }
}
