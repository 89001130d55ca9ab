//! CPU rank processes: this process is one rank of a [`tpar::CpuCommunicator`] over POSIX
//! shared memory (started by [`super::launch`] or an outside launcher).

use super::verify::{Judge, Outcome, Verdict};
use super::{Io, Timing};
use std::time::Instant;
use tpar::algorithms::registry::algorithms_on;
use tpar::plan::{Backend, CaptureMode};
use tpar::testing::{all_inputs, fill_input, poison};
use tpar::units::Spread;
use tpar::{Algorithm, Collective, CpuCommunicator, DType, Element, Transport};

pub struct CpuRanks {
    comm: CpuCommunicator,
}

fn err(e: tpar::Error) -> String {
    e.to_string()
}

impl CpuRanks {
    pub fn join() -> Result<CpuRanks, String> {
        Ok(CpuRanks { comm: CpuCommunicator::from_env().map_err(err)? })
    }

    /// A control-plane error, named by its cause when a peer has died (its liveness lock is
    /// gone): the socket only says that the connection closed.
    fn ctl(&self, e: tpar::Error) -> String {
        match self.comm.dead_peer() {
            Some(p) => format!("rank {}: peer rank {p} died ({e})", self.comm.rank()),
            None => e.to_string(),
        }
    }

    fn checked_t<T: Element>(
        &mut self,
        c: Collective,
        algo: Option<Algorithm>,
        seed: u64,
        call: u64,
        count: usize,
        io: Io,
    ) -> Result<Verdict, String> {
        let world = self.comm.world();
        let (ins, outs) = c.io_elems(count, world);
        let inputs = all_inputs::<T>(seed, call, world, ins);
        let what = |e: tpar::Error| {
            format!(
                "{c} {} {} count {count}: {e}",
                algo.map_or("plan", |a| a.name()),
                T::DTYPE
            )
        };
        let used =
            algo.unwrap_or_else(|| self.comm.planned_for(c, T::DTYPE, count * T::DTYPE.size()));
        let out = if io == Io::InPlace && c == Collective::AllReduce {
            let mut buf = inputs[self.comm.rank()].clone();
            self.comm.all_reduce_in_place(algo, &mut buf).map_err(what)?;
            buf
        } else {
            let mut out = vec![T::from_f32(0.0); outs];
            poison(&mut out);
            self.comm
                .collective(c, algo, &inputs[self.comm.rank()], &mut out)
                .map_err(what)?;
            out
        };
        let mine = Judge::for_collective(c, &inputs, used, &[], tpar::kinds::Wire::Exact)
            .outcome_of(self.comm.rank(), &out);
        let all = self
            .comm
            .all_gather_bytes(&mine.encode())
            .map_err(|e| self.ctl(e))?;
        let outcomes: Vec<Outcome> = all.iter().map(|b| Outcome::decode(b, count)).collect();
        Ok(Verdict::of_collective(c, &outcomes, outs))
    }

    fn time_t<T: Element>(
        &mut self,
        c: Collective,
        algo: Algorithm,
        count: usize,
        t: Timing,
    ) -> Result<Option<Spread>, String> {
        let (ins, outs) = c.io_elems(count, self.comm.world());
        let mut input = vec![T::from_f32(0.0); ins];
        fill_input(
            0xbe4c,
            (ins * T::DTYPE.size()) as u64,
            self.comm.rank(),
            &mut input,
        );
        let mut out = vec![T::from_f32(0.0); outs];
        let inner = t.inner.max(1);
        for _ in 0..t.warmup {
            self.comm
                .collective(c, Some(algo), &input, &mut out)
                .map_err(err)?;
        }
        self.comm.barrier().map_err(err)?;
        let mut times = Vec::with_capacity(t.iters);
        for _ in 0..t.iters {
            let t0 = Instant::now();
            for _ in 0..inner {
                self.comm
                    .collective(c, Some(algo), &input, &mut out)
                    .map_err(err)?;
            }
            times.push(t0.elapsed().as_secs_f64() * 1e6 / inner as f64);
        }
        match self.comm.gather_bytes(&super::encode_times(&times)) {
            Ok(all) => Ok(all.map(|all| super::slowest(&times, &all))),
            Err(e) => Err(self.ctl(e)),
        }
    }
}

/// What [`super::Group`] asks of CPU ranks.
impl CpuRanks {
    pub fn world(&self) -> usize {
        self.comm.world()
    }
    pub fn root(&self) -> bool {
        self.comm.rank() == 0
    }
    pub fn label(&self) -> String {
        "cpu".into()
    }
    pub fn transport(&self, _algo: Algorithm) -> Transport {
        Transport::Shm
    }
    pub fn describe(&mut self) -> Result<Vec<String>, String> {
        Ok(vec![
            format!("backend: cpu (rank processes over POSIX shared memory), ranks: {}", self.comm.world()),
            format!("chunk = {} KiB of shared workspace per call", self.comm.layout().cap * 8 / 1024),
            "gather-bcast is a baseline (rank 0 gathers, reduces, broadcasts), not an algorithm tpar picks".into(),
        ])
    }
    pub fn algorithms(&self) -> Vec<Algorithm> {
        algorithms_on(Backend::Cpu)
    }
    pub fn planned(
        &mut self,
        c: Collective,
        d: DType,
        bytes: usize,
        _mode: CaptureMode,
    ) -> Option<Algorithm> {
        Some(self.comm.planned_for(c, d, bytes))
    }
    #[allow(clippy::too_many_arguments)]
    pub fn checked(
        &mut self,
        c: Collective,
        d: DType,
        algo: Option<Algorithm>,
        seed: u64,
        call: u64,
        count: usize,
        io: Io,
    ) -> Result<Verdict, String> {
        by_dtype!(d, T => self.checked_t::<T>(c, algo, seed, call, count, io))
    }
    pub fn time(
        &mut self,
        c: Collective,
        algo: Algorithm,
        d: DType,
        count: usize,
        t: Timing,
    ) -> Result<Option<Spread>, String> {
        by_dtype!(d, T => self.time_t::<T>(c, algo, count, t))
    }
    pub fn barrier(&mut self) -> Result<(), String> {
        self.comm.barrier().map_err(err)
    }
    pub fn tune(&mut self, opts: tpar::tune::StartOptions, max_bytes: usize) -> Result<tpar::tune::Outcome, String> {
        tpar::tune::cpu::start_cpu(&mut self.comm, max_bytes as u64, opts).map_err(|e| self.ctl(e))
    }
}
