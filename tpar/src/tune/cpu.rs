//! CPU rank processes (`crate::CpuCommunicator` over shared memory) as the tune's [`Ranks`]:
//! what `tpar tune --backend cpu` measures, and how the tune's protocol (screen, agreement,
//! decision, cache) is tested on machines without a GPU, across real rank processes and
//! threads.
//!
//! Owns: running and timing the CPU algorithms for the tune. Must never: time anything but
//! eager calls (there are no graphs on CPU ranks), or offer NCCL.

use super::screen::{judge, ScreenCache};
use super::{Judged, Outcome, Ranks, Rounds, StartOptions, StartSpec, TunePlan};
use crate::algorithms::registry::{algorithms_on, spec, Role};
use crate::algorithms::Algorithm;
use crate::comm::CpuCommunicator;
use crate::dtype::{by_dtype, DType, Element};
use crate::error::Result;
use crate::kinds::{Backend, CaptureMode, Collective, Transport};
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{RankKind, TuneKey};
use crate::topology::Topology;
use crate::testing::poison;
use std::time::Instant;

/// One rank of a CPU group, driven by the tune.
pub struct CpuRanks<'a> {
    comm: &'a mut CpuCommunicator,
    screen: ScreenCache,
    /// Test hook: these calls' output is damaged on the last rank before it is judged.
    corrupt: Vec<(Collective, Algorithm)>,
    /// Test hook: this rank's screens fail locally after this many.
    fail_after: Option<usize>,
    screens: usize,
}

impl<'a> CpuRanks<'a> {
    pub fn new(comm: &'a mut CpuCommunicator) -> CpuRanks<'a> {
        CpuRanks { comm, screen: ScreenCache::default(), corrupt: Vec::new(), fail_after: None, screens: 0 }
    }

    /// Test hook: flips one bit of `algo`'s all-reduce output on the last rank before the
    /// screen judges it (what a kernel with a race would do), so tests can show that a
    /// candidate failing the screen is reported and never chosen.
    #[doc(hidden)]
    pub fn corrupt_for_test(&mut self, algo: Algorithm) {
        self.corrupt_collective_for_test(Collective::AllReduce, algo);
    }

    /// Test hook: as [`corrupt_for_test`](Self::corrupt_for_test), for `algo`'s calls of
    /// `collective`.
    #[doc(hidden)]
    pub fn corrupt_collective_for_test(&mut self, collective: Collective, algo: Algorithm) {
        self.corrupt.push((collective, algo));
    }

    /// Test hook: this rank's screens fail (a local error, as a failed copy of the output
    /// would be) after `n` of them, each once its call completed, so tests can show that every rank stops at the same exchange with the
    /// same reason and keeps the defaults.
    #[doc(hidden)]
    pub fn fail_after_for_test(&mut self, n: usize) {
        self.fail_after = Some(n);
    }

    fn screen_t<T: Element + Send + 'static>(&mut self, collective: Collective, algo: Algorithm, count: usize, seed: u64) -> Result<Vec<Judged>> {
        let (rank, world) = (self.comm.rank(), self.comm.world());
        let (ins, outs) = collective.io_elems(count, world);
        let set = self.screen.get::<T>(world, ins, seed)?;
        let mut out = vec![T::from_f32(0.0); outs];
        poison(&mut out);
        self.comm.collective(collective, Some(algo), &set.inputs[rank], &mut out)?;
        // After the call, so that the peers' calls complete (a rank that fails before a
        // call leaves its peers waiting in it until their timeout).
        self.screens += 1;
        if self.fail_after.is_some_and(|n| self.screens > n) {
            return Err(crate::error::Error::invalid("tune test hook", format!("rank {rank} fails its screen {}", self.screens)));
        }
        if self.corrupt.contains(&(collective, algo)) && rank + 1 == world {
            if let Some(x) = out.first_mut() {
                *x = T::from_lane(x.to_lane() ^ 1);
            }
        }
        Ok(vec![judge(&out, set.promised_for(collective, algo, &[], rank, count))])
    }

    fn time_t<T: Element>(&mut self, collective: Collective, algo: Algorithm, count: usize, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        let (ins, outs) = collective.io_elems(count, self.comm.world());
        let input = vec![T::from_f32(1.0); ins];
        let mut out = vec![T::from_f32(0.0); outs];
        let inner = rounds.inner.max(1);
        let mut times = Vec::with_capacity(rounds.iters);
        for k in 0..rounds.warmup + rounds.iters {
            self.sync()?;
            let t0 = Instant::now();
            for _ in 0..inner {
                self.comm.collective(collective, Some(algo), &input, &mut out)?;
            }
            if k >= rounds.warmup {
                times.push(t0.elapsed().as_secs_f64() * 1e6 / inner as f64);
            }
        }
        Ok(vec![times])
    }
}

impl Ranks for CpuRanks<'_> {
    fn world(&self) -> usize {
        self.comm.world()
    }
    fn is_root(&self) -> bool {
        self.comm.rank() == 0
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.comm.all_gather_bytes(mine)
    }
    fn modes(&self) -> Vec<CaptureMode> {
        vec![CaptureMode::Eager]
    }
    fn candidates(&self) -> Vec<Algorithm> {
        algorithms_on(Backend::Cpu).into_iter().filter(|&a| spec(a).role == Role::Candidate).collect()
    }
    fn nccl(&self) -> std::result::Result<(), String> {
        Err("CPU ranks have no NCCL".into())
    }
    fn screen_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, seed: u64) -> Result<Vec<Judged>> {
        by_dtype!(dtype, T => self.screen_t::<T>(collective, algo, count, seed))
    }
    fn time_local(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, _mode: CaptureMode, rounds: &Rounds) -> Result<Vec<Vec<f64>>> {
        by_dtype!(dtype, T => self.time_t::<T>(collective, algo, count, rounds))
    }
}

/// The key of CPU ranks of `comm`'s world on this machine.
pub fn cpu_key(world: usize) -> TuneKey {
    TuneKey {
        tpar_version: TuneKey::this_version(),
        cuda_driver: 0,
        driver_version: None,
        backend: Backend::Cpu,
        ranks: RankKind::Cpu,
        world,
        devices: Vec::new(),
        topology_hash: format!("{:016x}", Topology::cpu().hash()),
        transport: Transport::Shm,
        settings: String::new(),
    }
}

/// A start of CPU ranks (`tpar tune --backend cpu`): as a communicator's, with `opts`, for
/// messages up to `max_bytes`.
pub fn start_cpu(comm: &mut CpuCommunicator, max_bytes: u64, opts: StartOptions) -> Result<Outcome> {
    let world = comm.world();
    let fingerprint = |m| ProfileFingerprint::new(&Topology::cpu(), None, Backend::Cpu, world, m);
    let no_nccl = |_, _, _| false;
    let timeout = comm.timeout();
    let spec = StartSpec {
        tune: opts.tune,
        skip: None,
        cache: opts.cache,
        key: cpu_key(world),
        max_bytes,
        plan: opts.plan.unwrap_or_else(|| TunePlan::first_use(max_bytes, RankKind::Cpu, &[CaptureMode::Eager])),
        lock_wait: super::LOCK_WAIT_MAX.min(timeout / 2),
        fingerprint: &fingerprint,
        default_is_nccl: &no_nccl,
    };
    super::start(&mut CpuRanks::new(comm), &spec)
}
