//! The first-use tune on emulated ranks (N streams of one GPU in one process): the same
//! start as a communicator's ([`crate::tune::start`]: cache, lock, screen, timings, decision,
//! adoption), so that the mechanism runs and is timed on a machine with one GPU. Emulated
//! ranks measure kernel cost on one GPU, not a fabric: the key says so
//! ([`RankKind::Emulated`]), and the plan never takes such a tune's buckets.
//!
//! Owns: [`EmulatedRanks`] and [`start_emulated`]. Must never time NCCL (NCCL refuses several
//! ranks on one GPU) or present these figures as a fabric's.

use super::driver::{DeviceBuffer, Event, Graph};
use super::rank_set::RankSet;
use super::tune::{POISON_WORD, TIMING_WORD};
use crate::algorithms::registry::{algorithms_emulated, spec, Role};
use crate::algorithms::Algorithm;
use crate::dtype::{by_dtype, DType, Element};
use crate::error::Result;
use crate::kinds::{Backend, CaptureMode};
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{RankKind, TuneKey};
use crate::settings::Settings;
use crate::topology::Topology;
use crate::tune::screen::{judge, ScreenCache};
use crate::tune::{self, Judged, Outcome, Ranks, Rounds, StartOptions, StartSpec, TunePlan};

/// Every rank of an emulated group, in this one process.
pub struct EmulatedRanks<'a> {
    g: &'a mut RankSet,
    inputs: Vec<DeviceBuffer>,
    outputs: Vec<DeviceBuffer>,
    islands: Vec<Vec<usize>>,
    screen: ScreenCache,
}

/// The islands a group's island word names (rank q's label in bits 4q..4q+3), in order of
/// their first rank; one island when the word is 0.
fn islands_of_word(word: u64, world: usize) -> Vec<Vec<usize>> {
    if word == 0 {
        return vec![(0..world).collect()];
    }
    let mut out: Vec<(u64, Vec<usize>)> = Vec::new();
    for q in 0..world {
        let label = (word >> (4 * q)) & 0xf;
        match out.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => v.push(q),
            None => out.push((label, vec![q])),
        }
    }
    out.into_iter().map(|(_, v)| v).collect()
}

impl<'a> EmulatedRanks<'a> {
    /// The ranks of `g`, with buffers for calls of up to `max_bytes`.
    pub fn new(g: &'a mut RankSet, max_bytes: usize) -> Result<EmulatedRanks<'a>> {
        let bytes = max_bytes.max(16).div_ceil(16) * 16;
        let inputs = (0..g.world()).map(|_| DeviceBuffer::new(g.device(), bytes)).collect::<Result<Vec<_>>>()?;
        let outputs = (0..g.world()).map(|_| DeviceBuffer::new(g.device(), bytes)).collect::<Result<Vec<_>>>()?;
        let islands = islands_of_word(g.island_word(), g.world());
        Ok(EmulatedRanks { g, inputs, outputs, islands, screen: ScreenCache::default() })
    }

    fn ptrs(&self) -> (Vec<u64>, Vec<u64>) {
        (self.inputs.iter().map(|b| b.ptr).collect(), self.outputs.iter().map(|b| b.ptr).collect())
    }

    fn screen_t<T: Element + Send + 'static>(&mut self, algo: Algorithm, count: usize, seed: u64) -> Result<Vec<Judged>> {
        let world = self.g.world();
        let (i, o) = self.ptrs();
        let set = self.screen.get::<T>(world, count, seed)?;
        for (b, x) in self.inputs.iter().zip(&set.inputs) {
            b.upload(x)?;
        }
        for b in &self.outputs {
            b.fill_u32(POISON_WORD)?;
        }
        self.g.all_reduce(algo, T::DTYPE, count, &i, &o, 0)?;
        let promised = set.promised(algo, &self.islands).to_vec();
        let mut out = vec![T::from_f32(0.0); count];
        self.outputs
            .iter()
            .map(|b| {
                b.download(&mut out)?;
                Ok(judge(&out, &promised))
            })
            .collect()
    }

    fn time_op(&mut self, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        for b in &self.inputs {
            b.fill_u32(TIMING_WORD)?;
        }
        let (i, o) = self.ptrs();
        let inner = rounds.inner.max(1);
        let (start, end) = (Event::new(self.g.device())?, Event::new(self.g.device())?);
        let graph: Option<Graph> = match mode {
            CaptureMode::Eager => None,
            CaptureMode::Graph => Some(self.g.capture(|g| (0..inner).try_for_each(|_| g.enqueue(algo, dtype, count, &i, &o, 0)))?),
        };
        let mut times = Vec::with_capacity(rounds.iters);
        for k in 0..rounds.warmup + rounds.iters {
            self.g.origin().record(&start)?;
            match &graph {
                Some(gr) => self.g.launch(gr)?,
                None => {
                    for _ in 0..inner {
                        self.g.enqueue(algo, dtype, count, &i, &o, 0)?;
                    }
                }
            }
            self.g.origin().record(&end)?;
            self.g.synchronize()?;
            if k >= rounds.warmup {
                times.push(f64::from(start.elapsed_ms(&end)?) * 1e3 / inner as f64);
            }
        }
        // One process times every rank at once: the same figure stands for each.
        Ok(vec![times; self.g.world()])
    }
}

impl Ranks for EmulatedRanks<'_> {
    fn world(&self) -> usize {
        self.g.world()
    }
    fn is_root(&self) -> bool {
        true
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn modes(&self) -> Vec<CaptureMode> {
        CaptureMode::ALL.to_vec()
    }
    fn candidates(&self) -> Vec<Algorithm> {
        algorithms_emulated(self.g.transport()).into_iter().filter(|&a| spec(a).role == Role::Candidate).collect()
    }
    fn nccl(&self) -> std::result::Result<(), String> {
        Err("emulated ranks share one GPU (NCCL refuses several ranks on one GPU)".into())
    }
    fn screen_local(&mut self, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Vec<Judged>> {
        by_dtype!(dtype, T => self.screen_t::<T>(algo, count, seed))
    }
    fn time_local(&mut self, algo: Algorithm, dtype: DType, count: usize, mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        self.time_op(algo, dtype, count, mode, rounds)
    }
    /// The one GPU against its own memory and host memory (GPUs 0 to the group's ordinal, as
    /// `tpar topo --probe` runs it): a test of the probe, not a fabric.
    fn probe(&mut self) -> Result<Option<crate::topology::probe::Probe>> {
        super::probe::run(Some(self.g.device().ordinal + 1), &super::probe::ProbeOptions::default()).map(Some)
    }
}

/// The key of emulated ranks of `g` on this machine.
pub fn emulated_key(g: &RankSet, topology: &Topology, settings: &Settings) -> Result<TuneKey> {
    let uuid = g.device().uuid()?;
    Ok(TuneKey {
        tpar_version: TuneKey::this_version(),
        cuda_driver: super::driver::driver_version(),
        driver_version: crate::topology::nvml::driver_version(),
        backend: Backend::Cuda,
        ranks: RankKind::Emulated,
        world: g.world(),
        devices: vec![uuid; g.world()],
        topology_hash: format!("{:016x}", topology.hash()),
        transport: g.transport(),
        settings: super::tune::timing_settings(&settings.overrides, &settings.launch, g.transport()),
    })
}

/// A start of emulated ranks, as a communicator's start runs it (`opts`: `TPAR_TUNE`, the
/// cache, the budget: by default the first-use one). `settings` gives the timeout and the
/// settings that change timings.
pub fn start_emulated(g: &mut RankSet, max_bytes: usize, settings: &Settings, opts: StartOptions) -> Result<Outcome> {
    let topology = Topology::discover();
    let key = emulated_key(g, &topology, settings)?;
    let world = g.world();
    let fingerprint = |m| ProfileFingerprint::new(&topology, None, Backend::Cuda, world, m);
    let never_nccl = |_, _, _| false;
    let timeout = settings.job.timeout.unwrap_or(crate::settings::DEFAULT_TIMEOUT);
    let spec = StartSpec {
        tune: opts.tune,
        skip: None,
        cache: opts.cache,
        key,
        max_bytes: max_bytes as u64,
        plan: opts.plan.unwrap_or_else(|| TunePlan::first_use(max_bytes as u64, RankKind::Emulated, &CaptureMode::ALL)),
        lock_wait: tune::LOCK_WAIT_MAX.min(timeout / 2),
        fingerprint: &fingerprint,
        default_is_nccl: &never_nccl,
    };
    let mut r = EmulatedRanks::new(g, max_bytes)?;
    tune::start(&mut r, &spec)
}

#[cfg(test)]
mod tests {
    use super::islands_of_word;

    #[test]
    fn an_island_word_reads_back_as_islands() {
        let isl = crate::algorithms::hierarchical::from_sizes(&[3, 5]);
        let word = crate::algorithms::hierarchical::island_word(&isl, 8).unwrap();
        assert_eq!(islands_of_word(word, 8), vec![vec![0, 1, 2], vec![3, 4, 5, 6, 7]]);
        assert_eq!(islands_of_word(0, 3), vec![vec![0, 1, 2]]);
    }
}
