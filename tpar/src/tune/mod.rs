//! The first-use tune: when a communicator starts on a machine whose tune cache has no
//! profile for it, the ranks measure it together — the link probe, a bit-exact screen of
//! every candidate at the engines' message sizes, and timings of the survivors against NCCL
//! in eager and graph mode, for the all-reduce and then the all-gather and the reduce-scatter
//! ([`TunePlan::collectives`]) — rank 0 decides ([`Tuned::decide`]), stores the result in the
//! cache and every rank adopts the same bytes. Later starts read the cache in milliseconds.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the budget ([`TunePlan`]), the ranks' interface ([`Ranks`]), the measurement ([`measure`]) |
//! | `start.rs` | one start ([`start`]: skip, read, or lock and tune; rank 0 decides, every rank adopts) and its one-line report ([`Outcome::line`]) |
//! | [`screen`] | the screen's inputs (every rank regenerates every rank's) and its judge |
//! | [`cache`] | the cache files: lock, atomic write, checked read |
//! | [`cpu`] | CPU rank processes as [`Ranks`] (`tpar tune --backend cpu`, the tests) |
//!
//! GPU ranks (`crate::cuda::tune`) implement [`Ranks`] for rank processes (on a workspace of
//! the tune's own, so that nothing the tune does can poison the communicator) and for
//! emulated ranks.
//!
//! Every exchange of the tune carries a status ([`agree`]): a rank that fails locally says
//! so at its next exchange, and every rank stops at that same exchange with the same reason
//! (never one rank waiting for peers that gave up). A failed tune leaves the plan's defaults
//! in force ([`Outcome::Failed`]); only a broken control plane is an error of [`start`].
//!
//! Owns: what is measured, in what order, under what budget. Must never: let a rank other
//! than rank 0 decide or touch the cache, tune while another process holds the key's lock,
//! or wait without a bound.

pub mod cache;
pub mod cpu;
pub mod screen;
mod start;

pub use start::{start, Outcome, StartSpec};

use crate::algorithms::Algorithm;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::algorithms::registry::computes;
use crate::kinds::{CaptureMode, Collective};
use crate::plan::human_bytes;
use crate::plan::tuned::{Point, RankKind, Rejection};
use crate::topology::probe::Probe;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Hidden size the engines' message sizes are cut from: DeepSeek-V3 and Kimi-K2 (7168), the
/// models of docs/model.md; one token of bf16 is 14 KiB.
pub const ENGINE_HIDDEN: u64 = 7168;
/// Tokens per all-reduce the engines send: decode batches (1-4), speculative verify steps
/// (3, 8, 16 with drafts), prefill chunks (32-512).
pub const ENGINE_TOKENS: [u64; 10] = [1, 2, 3, 4, 8, 16, 32, 64, 128, 512];
/// The first size of the powers of 4 tuned beside the token sizes (below it every candidate
/// is latency alone; the plan's buckets start at 0).
pub const POW4_FROM: u64 = 256;
/// Token sizes tuned on ranks that share a GPU (1 and 3 tokens: the 14 and 42 KiB calls the
/// project's GPU checks use): enough to run every step of the mechanism.
pub const SHARED_TOKENS: [u64; 2] = [1, 3];
/// Tokens of the engines' sequence-parallel all-gathers and reduce-scatters the first-use tune
/// measures (each rank holds tokens / world of them): decode batches to prefill chunks, a
/// factor of 4 apart, so that push's crossover against NCCL falls between two of them.
pub const GATHER_SCATTER_TOKENS: [u64; 5] = [1, 8, 32, 128, 512];
/// The same on ranks that share a GPU: one size, enough to run the mechanism.
pub const SHARED_GATHER_SCATTER_TOKENS: [u64; 1] = [1];
/// Hard bound on a tune's wall time: past it rank 0 stops the tune and the defaults stay
/// (the target on 8 GPUs is under 10 s; docs/tune.md has what it measured).
pub const TUNE_MAX_SECONDS: f64 = 60.0;
/// How long rank 0 waits for another process's tune of the same machine to finish before
/// it starts on the defaults (bounded further by half the control plane's timeout, which
/// the other ranks wait under).
pub const LOCK_WAIT_MAX: Duration = Duration::from_secs(20);
/// Poll period of that wait.
pub(crate) const LOCK_POLL: Duration = Duration::from_millis(25);

/// What a caller asks of one start: `TPAR_TUNE`'s value, the cache directory (`None`: no
/// cache: with `force` the ranks tune and nothing is stored, else the start skips), and the
/// budget (`None`: [`TunePlan::first_use`]).
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    pub tune: crate::settings::Tune,
    pub cache: Option<std::path::PathBuf>,
    pub plan: Option<TunePlan>,
}

impl StartOptions {
    /// A communicator's start: `TPAR_TUNE`, the cache directory of the settings, the
    /// first-use budget.
    pub fn first_use(tune: crate::settings::Tune) -> StartOptions {
        StartOptions { tune, cache: crate::settings::cache_dir(), plan: None }
    }

    /// Measure now under `plan` and store nothing (`tpar tune -o FILE`).
    pub fn measure_only(plan: TunePlan) -> StartOptions {
        StartOptions { tune: crate::settings::Tune::Force, cache: None, plan: Some(plan) }
    }
}

/// How one point is timed: `warmup` untimed rounds, then `iters` timed rounds of `inner`
/// calls (back to back, or one CUDA graph of `inner` calls). Per round the slowest rank
/// counts; the point's time is the median round's, per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rounds {
    pub warmup: usize,
    pub iters: usize,
    pub inner: usize,
}

/// The first-use tune's rounds: 1 untimed and 5 timed rounds of 8 calls. At 8 GPUs a round
/// of 8 small calls is under 0.2 ms and the rounds' barriers over the control plane about
/// 0.1 ms each, so a point costs about 1-2 ms; a graph adds its capture and instantiation.
pub const FIRST_USE_ROUNDS: Rounds = Rounds { warmup: 1, iters: 5, inner: 8 };
/// Ranks that share a GPU: CUDA time-slices their spinning kernels (about 13.5 ms per 42 KiB
/// call with rank processes on one H200, /work notes in docs/cuda.md), so two rounds of one.
pub const SHARED_ROUNDS: Rounds = Rounds { warmup: 0, iters: 2, inner: 1 };

/// What a tune measures: the all-reduce's sizes and dtypes, the other collectives', modes,
/// rounds, whether it probes the links, and its bound. The budget is explicit so that what a
/// tune costs can be said and bounded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunePlan {
    /// The all-reduce's sizes, bytes per rank.
    pub sizes: Vec<u64>,
    /// The all-reduce's dtypes.
    pub dtypes: Vec<DType>,
    pub modes: Vec<CaptureMode>,
    pub rounds: Rounds,
    pub probe: bool,
    pub max_seconds: f64,
    /// The all-gather and the reduce-scatter, measured after the all-reduce (none: the
    /// all-reduce alone).
    #[serde(default)]
    pub collectives: Vec<CollectiveSizes>,
}

/// One collective besides the all-reduce that a tune measures: the engines' sequence-parallel
/// calls, a tensor of `tokens x hidden` split across the ranks. Its candidates are the
/// kernels that compute it (`registry::computes`: one-shot push) and NCCL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveSizes {
    pub collective: Collective,
    /// Whole tensors, bytes (every rank's part together: the all-gather's output, the
    /// reduce-scatter's input). Each rank's part, what the points and the plan count, is this
    /// over the world in whole 16-byte vectors ([`Collective::part_bytes`]).
    pub totals: Vec<u64>,
    pub dtypes: Vec<DType>,
}

/// The all-gather and the reduce-scatter at `tokens` x [`ENGINE_HIDDEN`] bf16 elements, the
/// tensors no larger than `max_bytes` (the tune's buffers hold `max_bytes`).
pub fn gather_scatter(tokens: &[u64], max_bytes: u64, dtypes: &[DType]) -> Vec<CollectiveSizes> {
    let totals: Vec<u64> = tokens.iter().map(|t| t * ENGINE_HIDDEN * 2).filter(|&b| b <= max_bytes).collect();
    if totals.is_empty() {
        return Vec::new();
    }
    [Collective::AllGather, Collective::ReduceScatter].map(|collective| CollectiveSizes { collective, totals: totals.clone(), dtypes: dtypes.to_vec() }).to_vec()
}

/// The engines' size classes up to `max_bytes`: tokens x [`ENGINE_HIDDEN`] bf16 elements,
/// powers of 4 from [`POW4_FROM`], and `max_bytes` itself (so the buckets reach it).
pub fn engine_sizes(max_bytes: u64) -> Vec<u64> {
    let mut v: Vec<u64> = ENGINE_TOKENS.iter().map(|t| t * ENGINE_HIDDEN * 2).filter(|&b| b <= max_bytes).collect();
    let mut p = POW4_FROM;
    while p <= max_bytes {
        v.push(p);
        p *= 4;
    }
    let top = max_bytes / 16 * 16;
    if top > 0 {
        v.push(top);
    }
    v.sort_unstable();
    v.dedup();
    v
}

impl TunePlan {
    /// The budget of a communicator's first start: the engines' sizes up to `max_bytes`, bf16
    /// and f16 (the engines' dtypes), every mode in `modes`, [`FIRST_USE_ROUNDS`], the link
    /// probe; then the all-gather and the reduce-scatter at [`GATHER_SCATTER_TOKENS`] in bf16
    /// alone (one-shot push and NCCL only: 10 screens and at most 40 points, under a tenth
    /// of the all-reduce's). Ranks that share a GPU run the mechanism on [`SHARED_TOKENS`] (and
    /// [`SHARED_GATHER_SCATTER_TOKENS`]) in bf16 with [`SHARED_ROUNDS`] and no probe (there
    /// is no link to measure).
    pub fn first_use(max_bytes: u64, kind: RankKind, modes: &[CaptureMode]) -> TunePlan {
        match kind {
            RankKind::SharedGpu => TunePlan {
                sizes: SHARED_TOKENS.iter().map(|t| t * ENGINE_HIDDEN * 2).filter(|&b| b <= max_bytes).collect(),
                dtypes: vec![DType::BF16],
                modes: modes.to_vec(),
                rounds: SHARED_ROUNDS,
                probe: false,
                max_seconds: TUNE_MAX_SECONDS,
                collectives: gather_scatter(&SHARED_GATHER_SCATTER_TOKENS, max_bytes, &[DType::BF16]),
            },
            RankKind::GpuProcesses | RankKind::Emulated | RankKind::Cpu => TunePlan {
                sizes: engine_sizes(max_bytes),
                dtypes: vec![DType::BF16, DType::F16],
                modes: modes.to_vec(),
                rounds: FIRST_USE_ROUNDS,
                probe: kind == RankKind::GpuProcesses,
                max_seconds: TUNE_MAX_SECONDS,
                collectives: gather_scatter(&GATHER_SCATTER_TOKENS, max_bytes, &[DType::BF16]),
            },
        }
    }

    /// In words: `18 sizes (256 B to 8 MiB) x bfloat16, float16 x eager, graph; all-gather,
    /// reduce-scatter: 5 tensors (14 KiB to 7 MiB) x bfloat16; rounds 1 + 5 x 8`.
    pub fn describe(&self) -> String {
        let range = |v: &[u64]| {
            let (lo, hi) = (v.iter().copied().min().unwrap_or(0), v.iter().copied().max().unwrap_or(0));
            format!("{} to {}", human_bytes(lo), human_bytes(hi))
        };
        let names = |v: Vec<String>| v.join(", ");
        let mut others = String::new();
        // Collectives measured at the same tensors and dtypes are named together.
        let mut said: Vec<&CollectiveSizes> = Vec::new();
        for c in &self.collectives {
            if said.iter().any(|d| d.totals == c.totals && d.dtypes == c.dtypes) {
                continue;
            }
            let same: Vec<String> = self.collectives.iter().filter(|d| d.totals == c.totals && d.dtypes == c.dtypes).map(|d| d.collective.to_string()).collect();
            others.push_str(&format!(
                "; {}: {} tensors ({}) x {}",
                same.join(", "),
                c.totals.len(),
                range(&c.totals),
                names(c.dtypes.iter().map(|d| d.to_string()).collect())
            ));
            said.push(c);
        }
        format!(
            "{} sizes ({}) x {} x {}{others}; rounds {} + {} x {}{}",
            self.sizes.len(),
            range(&self.sizes),
            names(self.dtypes.iter().map(|d| d.to_string()).collect()),
            names(self.modes.iter().map(|m| m.to_string()).collect()),
            self.rounds.warmup,
            self.rounds.iters,
            self.rounds.inner,
            if self.probe { "; link probe" } else { "" }
        )
    }

    /// What [`measure`] runs, in order: the all-reduce at `sizes`, then each of
    /// `collectives` at its tensors split over `world` ranks; per collective its dtypes and
    /// sizes in bytes per rank (ascending, whole 16-byte vectors, none 0).
    pub fn work(&self, world: usize) -> Vec<(Collective, Vec<DType>, Vec<u64>)> {
        let mut v = vec![(Collective::AllReduce, self.dtypes.clone(), self.sizes.clone())];
        for c in &self.collectives {
            let mut sizes: Vec<u64> = c.totals.iter().map(|&t| Collective::part_bytes(t, world)).filter(|&b| b > 0).collect();
            sizes.sort_unstable();
            sizes.dedup();
            v.push((c.collective, c.dtypes.clone(), sizes));
        }
        v
    }
}

/// One rank's verdict on one screened call: elements that differ bitwise from what the
/// collective promises ([`screen::ScreenSet::promised_for`]), and a digest of its output
/// (ranks must agree bitwise where their outputs are the same: not the reduce-scatter's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    pub off: u64,
    pub digest: u64,
}

/// The ranks a tune measures. Every method is collective: every process of the group calls
/// it in the same order with the same arguments. A method that fails locally returns its
/// error without exchanging anything; the caller then announces it ([`agree`]).
pub trait Ranks {
    fn world(&self) -> usize;
    /// Whether this process is rank 0's (it decides, reads and writes the cache).
    fn is_root(&self) -> bool;
    /// Every process's bytes to every process, in process order (rank processes: rank
    /// order; ranks emulated in one process: that one process's bytes).
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// The capture modes calls run in here.
    fn modes(&self) -> Vec<CaptureMode>;
    /// The kernels to screen and time: the plan's candidates that run on this fabric.
    fn candidates(&self) -> Vec<Algorithm>;
    /// Whether NCCL is timed beside them (the same answer on every process), or why not.
    fn nccl(&self) -> std::result::Result<(), String>;
    /// Runs `algo` once as `collective` of `count` elements per rank ([`Collective::io_elems`]'s
    /// count) on every local rank's input regenerated from `seed` (`testing::all_inputs`, the
    /// input's length per rank), outputs poisoned first; judges each local rank's output
    /// against [`screen::ScreenSet::promised_for`].
    fn screen_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Vec<Judged>>;
    /// Times `algo` (or NCCL) as `collective` of `count` elements per rank: for each local
    /// rank, per timed round, microseconds per call. Rounds are separated by
    /// [`sync`](Self::sync).
    fn time_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>>;
    /// Allocates what the tune needs (collective; may exchange, announcing its own failures
    /// with [`step`]). Called once, before anything is measured.
    fn prepare(&mut self) -> Result<()> {
        Ok(())
    }
    /// Seconds spent joining NCCL for the tune (0 where none was joined).
    fn nccl_join_seconds(&self) -> f64 {
        0.0
    }
    /// The link probe between the ranks' GPUs, the same on every process; `Ok(None)` where
    /// there is nothing to probe.
    fn probe(&mut self) -> Result<Option<Probe>> {
        Ok(None)
    }
    /// After a local error, before it is announced: wait (bounded) for whatever this rank
    /// still has running, so that nothing of it touches peers once the ranks stop.
    fn settle(&mut self) {}
    /// A barrier that carries status: a peer's announced failure stops here.
    fn sync(&mut self) -> Result<()> {
        agree(self, Ok(Vec::new())).map(|_| ())
    }
}

/// Exchanges `local` (this rank's bytes, or its failure) with every process. Returns every
/// process's bytes, or — when any failed — the first failure as `Error::Tune { agreed: true }`
/// on every process alike (the caller announces nothing more). A failure of the exchange
/// itself is `Error::Tune { agreed: false }`: the control plane is broken.
pub fn agree<R: Ranks + ?Sized>(r: &mut R, local: Result<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let mine = match &local {
        Ok(b) => [&[0u8][..], b].concat(),
        Err(Error::Tune { reason, .. }) => [&[1u8][..], reason.as_bytes()].concat(),
        Err(e) => [&[1u8][..], e.to_string().as_bytes()].concat(),
    };
    let all = r.all_gather(&mine).map_err(|e| Error::Tune { agreed: false, reason: format!("the control plane failed: {e}") })?;
    let mut out = Vec::with_capacity(all.len());
    for (p, b) in all.into_iter().enumerate() {
        match b.split_first() {
            Some((0, rest)) => out.push(rest.to_vec()),
            Some((_, why)) => return Err(Error::Tune { agreed: true, reason: format!("rank {p}: {}", String::from_utf8_lossy(why)) }),
            None => return Err(Error::Tune { agreed: true, reason: format!("rank {p} sent nothing") }),
        }
    }
    Ok(out)
}

/// Exchanges a local step's result: a local failure is settled and announced, an agreed
/// one (`Error::Tune`) passed on as it is.
pub fn step<R: Ranks + ?Sized>(r: &mut R, local: Result<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    match local {
        Err(e @ Error::Tune { .. }) => Err(e),
        Err(e) => {
            r.settle();
            agree(r, Err(e))
        }
        ok => agree(r, ok),
    }
}

/// What the screen found for one candidate at one dtype and size, over every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Screened {
    pub off: u64,
    pub identical: bool,
}

fn screen<R: Ranks + ?Sized>(r: &mut R, collective: Collective, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Screened> {
    let local = r.screen_local(collective, algo, dtype, count, seed).map(|js| js.iter().flat_map(|j| [j.off.to_le_bytes(), j.digest.to_le_bytes()]).flatten().collect());
    let all = step(r, local)?;
    let words: Vec<u64> = all.iter().flat_map(|b| b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0xff; 8])))).collect();
    let off = words.iter().step_by(2).fold(0u64, |a, &w| a.saturating_add(w));
    let digests: Vec<u64> = words.iter().skip(1).step_by(2).copied().collect();
    // Every rank answered; where the collective gives every rank the same output, the same
    // bits (a reduce-scatter's ranks hold different slices, each judged against its own).
    let same = collective == Collective::ReduceScatter || digests.windows(2).all(|w| w[0] == w[1]);
    let identical = digests.len() == r.world() && same;
    Ok(Screened { off, identical })
}

fn time<R: Ranks + ?Sized>(r: &mut R, collective: Collective, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<f64> {
    let local = r.time_local(collective, algo, dtype, count, mode, rounds).map(|per_rank| {
        let mut v = Vec::new();
        for times in per_rank {
            v.extend_from_slice(&(times.len() as u64).to_le_bytes());
            v.extend(times.iter().flat_map(|t| t.to_le_bytes()));
        }
        v
    });
    let all = step(r, local)?;
    // Per round, the slowest rank.
    let mut worst = vec![0.0f64; rounds.iters];
    for b in &all {
        let words: Vec<[u8; 8]> = b.chunks_exact(8).map(|c| c.try_into().unwrap_or([0; 8])).collect();
        let mut at = 0;
        while at < words.len() {
            let n = u64::from_le_bytes(words[at]) as usize;
            for (i, w) in words.iter().skip(at + 1).take(n).enumerate() {
                if let Some(slot) = worst.get_mut(i) {
                    *slot = slot.max(f64::from_le_bytes(*w));
                }
            }
            at += 1 + n;
        }
    }
    Ok(crate::units::percentiles(&mut worst).median)
}

/// The inputs of one (collective, dtype, size)'s screen: the same on every rank.
fn screen_seed(collective: Collective, dtype: DType, bytes: u64) -> u64 {
    match collective {
        Collective::AllReduce => crate::units::fnv1a64(format!("tpar tune screen {dtype} {bytes}").as_bytes()),
        c => crate::units::fnv1a64(format!("tpar tune screen {c} {dtype} {bytes}").as_bytes()),
    }
}

/// What the ranks measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub points: Vec<Point>,
    pub rejected: Vec<Rejection>,
    pub screens: usize,
    pub nccl: Option<std::result::Result<(), String>>,
    pub probe: Option<Probe>,
    /// Why the probe gave nothing, when it failed (the timings decide anyway).
    pub probe_failed: Option<String>,
    pub probe_seconds: f64,
}

/// Measures `plan` on `r`: the probe, then per collective ([`TunePlan::work`]: the
/// all-reduce first), dtype and size a bit-exact screen of every candidate that computes it
/// and is not yet rejected for it, and timings of the survivors and NCCL in each mode. A
/// candidate rejected once for a collective is neither timed nor screened again for it. The
/// budget is checked before every size of every collective. An error is agreed by every rank
/// (`Error::Tune`), or a broken control plane.
pub fn measure<R: Ranks + ?Sized>(r: &mut R, plan: &TunePlan) -> Result<Measured> {
    let t0 = Instant::now();
    let prepared = r.prepare().map(|()| Vec::new());
    step(r, prepared)?;
    let mut m = Measured { nccl: Some(r.nccl()), ..Measured::default() };
    if plan.probe {
        let tp = Instant::now();
        let local = r.probe().map(|p| p.map(|p| serde_json::to_vec(&p).unwrap_or_default()).unwrap_or_default());
        match step(r, local) {
            Ok(all) => m.probe = all.first().and_then(|b| serde_json::from_slice(b).ok()),
            Err(Error::Tune { agreed: true, reason }) => m.probe_failed = Some(reason),
            Err(e) => return Err(e),
        }
        m.probe_seconds = tp.elapsed().as_secs_f64();
    }
    let modes: Vec<CaptureMode> = r.modes().into_iter().filter(|x| plan.modes.contains(x)).collect();
    let kernels: Vec<Algorithm> = r.candidates().into_iter().filter(|&a| a != Algorithm::Nccl).collect();
    let nccl = matches!(m.nccl, Some(Ok(())));
    for (collective, dtypes, sizes) in plan.work(r.world()) {
        let kernels: Vec<Algorithm> = kernels.iter().copied().filter(|&a| computes(a, collective).is_ok()).collect();
        if kernels.is_empty() && !nccl {
            continue;
        }
        for &dtype in &dtypes {
            for &bytes in &sizes {
                let count = (bytes as usize) / dtype.size();
                if count == 0 {
                    continue;
                }
                // Rank 0 keeps the budget: every rank stops at this exchange when it is spent.
                let over = r.is_root() && t0.elapsed().as_secs_f64() > plan.max_seconds;
                let local = if over { Err(Error::invalid("tune", format!("past its bound of {:.0} s", plan.max_seconds))) } else { Ok(Vec::new()) };
                step(r, local)?;
                let rejected = |m: &Measured, a: Algorithm| m.rejected.iter().any(|x| x.collective == collective && x.algorithm == a);
                for &a in &kernels {
                    if rejected(&m, a) {
                        continue;
                    }
                    let s = screen(r, collective, a, dtype, count, screen_seed(collective, dtype, bytes))?;
                    m.screens += 1;
                    if s.off != 0 || !s.identical {
                        m.rejected.push(Rejection { collective, algorithm: a, dtype, bytes, wrong: s.off, identical: s.identical });
                    }
                }
                let timed: Vec<Algorithm> = kernels.iter().copied().filter(|&a| !rejected(&m, a)).chain(nccl.then_some(Algorithm::Nccl)).collect();
                for &mode in &modes {
                    for &a in &timed {
                        let us = time(r, collective, a, dtype, count, mode, &plan.rounds)?;
                        m.points.push(Point { collective, mode, dtype, bytes, algorithm: a, median_us: us });
                    }
                }
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_sizes_are_token_classes_and_powers_of_four_up_to_the_cap() {
        let s = engine_sizes(8 << 20);
        for t in [1u64, 3, 64, 512] {
            assert!(s.contains(&(t * 14336)), "{t} tokens");
        }
        assert!(s.contains(&256) && s.contains(&(4 << 20)) && s.contains(&(8 << 20)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        let small = engine_sizes(64 << 10);
        assert_eq!(small.last(), Some(&(64 << 10)));
        assert!(!small.contains(&(8 * 14336)), "clipped to max_bytes");
        let p = TunePlan::first_use(8 << 20, RankKind::GpuProcesses, &[CaptureMode::Eager, CaptureMode::Graph]);
        assert_eq!(p.dtypes, vec![DType::BF16, DType::F16]);
        assert!(p.describe().contains("link probe"), "{}", p.describe());
        let shared = TunePlan::first_use(8 << 20, RankKind::SharedGpu, &[CaptureMode::Eager]);
        assert_eq!(shared.sizes, vec![14336, 43008]);
        assert!(!shared.probe);
    }

    #[test]
    fn the_gather_and_scatter_are_the_engines_sequence_parallel_parts_in_bf16() {
        let p = TunePlan::first_use(8 << 20, RankKind::GpuProcesses, &[CaptureMode::Eager, CaptureMode::Graph]);
        let kinds: Vec<Collective> = p.collectives.iter().map(|c| c.collective).collect();
        assert_eq!(kinds, vec![Collective::AllGather, Collective::ReduceScatter]);
        assert!(p.collectives.iter().all(|c| c.dtypes == vec![DType::BF16] && c.totals == vec![14336, 8 * 14336, 32 * 14336, 128 * 14336, 512 * 14336]));
        assert!(p.describe().contains("; all-gather, reduce-scatter: 5 tensors (14 KiB to 7 MiB) x bfloat16;"), "{}", p.describe());
        // Per rank: the tensor over the world, whole 16-byte vectors.
        let work = p.work(8);
        assert_eq!(work[0], (Collective::AllReduce, p.dtypes.clone(), p.sizes.clone()), "the all-reduce first, as before");
        assert_eq!(work[1].2, vec![1792, 8 * 1792, 32 * 1792, 128 * 1792, 512 * 1792]);
        let three = p.work(3);
        assert_eq!(three[1].2[0], 4768, "14336 / 3 = 4778.7, down to whole vectors");
        assert!(three.iter().skip(1).all(|(_, _, s)| s.iter().all(|b| b % 16 == 0 && *b > 0)));
        // Clipped to the tune's buffers; none where not even one token fits.
        assert_eq!(TunePlan::first_use(64 << 10, RankKind::Cpu, &[CaptureMode::Eager]).collectives[0].totals, vec![14336]);
        assert!(TunePlan::first_use(8 << 10, RankKind::Cpu, &[CaptureMode::Eager]).collectives.is_empty());
        let shared = TunePlan::first_use(8 << 20, RankKind::SharedGpu, &[CaptureMode::Eager]);
        assert!(shared.collectives.iter().all(|c| c.totals == vec![14336]));
        // A plan of an older `tpar tune` (no collectives) still reads: the all-reduce alone.
        let mut v = serde_json::to_value(&p).unwrap();
        v.as_object_mut().unwrap().remove("collectives");
        let old: TunePlan = serde_json::from_value(v).unwrap();
        assert!(old.collectives.is_empty() && old.work(8).len() == 1);
    }
}
