//! Emulated ranks: N ranks as streams of one GPU ([`tpar::cuda::RankSet`]), all in
//! this process. They prove correctness and kernel cost, not interconnect behaviour.

use super::verify::{Judge, Outcome, Verdict};
use super::{Group, Io, Timing};
use std::time::{Duration, Instant};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{DeviceBuffer, Event};
use tpar::cuda::{RankSet, SetOptions};
use tpar::plan::CaptureMode;
use tpar::testing::all_inputs;
use tpar::units::{percentiles, Spread};
use tpar::{Algorithm, Collective, DType, Element, Transport};

use super::verify::{err, POISON_WORD, TIMING_WORD};

/// A rank's input and output buffers.
pub struct RankBufs {
    pub input: DeviceBuffer,
    pub output: DeviceBuffer,
}

/// Group options from the environment (`SetOptions::from_env`: `TPAR_TIMEOUT_MS`,
/// `TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL`).
pub fn options(transport: Transport) -> Result<SetOptions, String> {
    SetOptions::from_env(transport).map_err(err)
}

/// The islands of `--islands SPEC` for `world` ranks: `halves` (default), `one`, sizes in
/// rank order (`3+5`), or `map:` and one character per rank naming its island
/// (`map:01010101`: even and odd ranks). A comma list gives one split per world: the one that
/// covers `world` ranks applies.
pub fn islands_for(spec: Option<&str>, world: usize) -> Result<Vec<Vec<u32>>, String> {
    use tpar::algorithms::hierarchical::from_sizes;
    let spec = spec.map(str::trim).unwrap_or("halves");
    match spec {
        "halves" => Ok(from_sizes(&[world.div_ceil(2), world / 2])),
        "one" => Ok(from_sizes(&[world])),
        list => {
            for split in list.split(',') {
                if let Some(map) = split.trim().strip_prefix("map:") {
                    if map.chars().count() == world {
                        let mut names: Vec<char> = map.chars().collect();
                        names.sort_unstable();
                        names.dedup();
                        return Ok(names.iter().map(|n| map.chars().enumerate().filter(|(_, c)| c == n).map(|(r, _)| r as u32).collect()).collect());
                    }
                    continue;
                }
                let sizes = split
                    .split('+')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| format!("--islands {split:?}: expected halves, one, island sizes such as 3+5, or map:01010101"))?;
                if sizes.iter().sum::<usize>() == world {
                    return Ok(from_sizes(&sizes));
                }
            }
            Err(format!("--islands {list:?}: no split of {world} ranks (sizes must add up to the world)"))
        }
    }
}

/// `world` pairs of buffers of `bytes` (rounded up to whole vectors) on the group's GPU.
pub fn alloc_bufs(g: &RankSet, bytes: usize) -> Result<Vec<RankBufs>, String> {
    let b = bytes.max(VEC_BYTES).div_ceil(VEC_BYTES) * VEC_BYTES;
    (0..g.world())
        .map(|_| Ok(RankBufs { input: DeviceBuffer::new(g.device(), b).map_err(err)?, output: DeviceBuffer::new(g.device(), b).map_err(err)? }))
        .collect()
}

pub fn ptrs(bufs: &[RankBufs]) -> (Vec<u64>, Vec<u64>) {
    (bufs.iter().map(|b| b.input.ptr).collect(), bufs.iter().map(|b| b.output.ptr).collect())
}

pub struct EmulatedRanks {
    pub g: RankSet,
    pub bufs: Vec<RankBufs>,
    /// The islands `hierarchical` reduces over, normalised (for the verifier).
    pub islands: Vec<Vec<usize>>,
    /// Where the checked calls' time went, summed over them (see [`Phases`]).
    phases: Phases,
}

/// Host time of checked calls by phase, summed: what `tpar check` spends besides the
/// kernels, printed with its verdict so that a slow run shows where its time went.
#[derive(Default)]
struct Phases {
    calls: u64,
    /// Generating every rank's inputs.
    inputs: Duration,
    /// Uploading inputs and poisoning outputs (each copy and fill synchronises).
    copies: Duration,
    /// The all-reduce: enqueue on every rank, then synchronise.
    run: Duration,
    /// Downloading every rank's output.
    download: Duration,
    /// The references (once per call) and judging every rank's output.
    judge: Duration,
}

impl EmulatedRanks {
    pub fn new(device: usize, world: usize, max_bytes: usize, transport: Transport, skew_ns: Option<u32>, islands: Option<&str>) -> Result<EmulatedRanks, String> {
        let t0 = Instant::now();
        let max_bytes = max_bytes.max(16);
        let isl = islands_for(islands, world)?;
        let norm = tpar::algorithms::hierarchical::normalize(&isl, world).map_err(err)?;
        let mut g = RankSet::emulated(device, world, max_bytes, SetOptions { islands: isl, ..options(transport)? }).map_err(err)?;
        let sizes: Vec<String> = norm.iter().map(|i| i.len().to_string()).collect();
        let protocol = format!("{:?}", g.launcher().protocol()).to_ascii_lowercase();
        eprintln!(
            "# group: {world} emulated ranks on {} ({}), transport {transport} (push protocol {protocol}), max {max_bytes} B, islands {} (hierarchical), ready in {:.0} ms",
            g.device().name,
            g.device().arch(),
            sizes.join("+"),
            t0.elapsed().as_secs_f64() * 1e3
        );
        let bufs = alloc_bufs(&g, max_bytes)?;
        let mut g = g;
        if let Some(ns) = skew_ns {
            // Fixed seed: a failing skewed run can be repeated exactly.
            g.set_skew_for_test(Some((0x5_4e3, ns)));
            eprintln!("# skewed ranks: random delays of 0 to {ns} ns on the device before calls, per rank and call");
        }
        Ok(EmulatedRanks { g, bufs, islands: norm, phases: Phases::default() })
    }

    /// Blocks for a call: 0, the launch policy (`tpar::cuda::launch::blocks_for`, which
    /// honours `TPAR_BLOCKS`), as for real GPU ranks.
    pub fn blocks(&self, _bytes: usize) -> u32 {
        0
    }

    /// Uploads every rank's input of `inputs`, poisons the outputs, runs `algo`'s `c`, and
    /// judges every rank's output (the inputs themselves, in place) against one reference.
    fn run_and_judge<T: Element>(
        &mut self,
        c: Collective,
        algo: Algorithm,
        inputs: &[Vec<T>],
        count: usize,
        in_place: bool,
    ) -> Result<Vec<Outcome>, String> {
        let outs_len = c.io_elems(count, self.g.world()).1;
        let t = Instant::now();
        for (b, x) in self.bufs.iter().zip(inputs) {
            b.input.upload(x).map_err(err)?;
            b.output.fill_u32(POISON_WORD).map_err(err)?;
        }
        let (i, o) = ptrs(&self.bufs);
        let o = if in_place { i.clone() } else { o };
        let blocks = self.blocks(count * T::DTYPE.size());
        let t_run = Instant::now();
        self.g
            .enqueue_collective(c, algo, T::DTYPE, count, &i, &o, blocks)
            .and_then(|()| self.g.synchronize())
            .map_err(|e| format!("{c} {algo} {} count {count}: {e}", T::DTYPE))?;
        let t_download = Instant::now();
        let outs = self
            .bufs
            .iter()
            .map(|b| {
                let mut out = vec![T::from_f32(0.0); outs_len];
                (if in_place { &b.input } else { &b.output })
                    .download(&mut out)
                    .map_err(err)?;
                Ok(out)
            })
            .collect::<Result<Vec<_>, String>>()?;
        let t_judge = Instant::now();
        let judge = Judge::for_collective(c, inputs, algo, &self.islands, self.g.wire());
        let outcomes = outs
            .iter()
            .enumerate()
            .map(|(r, out)| judge.outcome_of(r, out))
            .collect();
        let p = &mut self.phases;
        p.copies += t_run - t;
        p.run += t_download - t_run;
        p.download += t_judge - t_download;
        p.judge += t_judge.elapsed();
        Ok(outcomes)
    }

    fn checked_t<T: Element>(
        &mut self,
        c: Collective,
        algo: Algorithm,
        seed: u64,
        call: u64,
        count: usize,
        io: Io,
    ) -> Result<Verdict, String> {
        let t = Instant::now();
        let (ins, outs) = c.io_elems(count, self.g.world());
        let inputs = all_inputs::<T>(seed, call, self.g.world(), ins);
        self.phases.inputs += t.elapsed();
        self.phases.calls += 1;
        let in_place = io == Io::InPlace && c == Collective::AllReduce;
        let outcomes = self.run_and_judge(c, algo, &inputs, count, in_place)?;
        Ok(Verdict::of_collective(c, &outcomes, outs))
    }

    /// Per-call microseconds per timed iteration; `algo` None times the empty kernel (the
    /// launch floor of emulation).
    pub fn time_op(
        &mut self,
        c: Collective,
        algo: Option<Algorithm>,
        d: DType,
        count: usize,
        t: Timing,
    ) -> Result<Vec<f64>, String> {
        let (i, o) = ptrs(&self.bufs);
        for b in &self.bufs {
            b.input.fill_u32(TIMING_WORD).map_err(err)?;
        }
        let blocks = if algo.is_some() { self.blocks(count * d.size()) } else { 1 };
        let enqueue = |g: &mut RankSet| match algo {
            Some(a) => g.enqueue_collective(c, a, d, count, &i, &o, blocks),
            None => g.enqueue_floor(blocks, &i, &o),
        };
        let inner = t.inner.max(1);
        let start = Event::new(self.g.device()).map_err(err)?;
        let end = Event::new(self.g.device()).map_err(err)?;
        let graph = match t.mode {
            CaptureMode::Graph => Some(
                self.g
                    .capture(|g| {
                        for _ in 0..inner {
                            enqueue(g)?;
                        }
                        Ok(())
                    })
                    .map_err(err)?,
            ),
            CaptureMode::Eager => None,
        };
        // One timed iteration: the graph, or `inner` calls back to back.
        let run = |g: &mut RankSet| -> Result<(), String> {
            match &graph {
                Some(gr) => g.launch(gr).map_err(err),
                None => (0..inner).try_for_each(|_| enqueue(g).map_err(err)),
            }
        };
        let mut samples = Vec::with_capacity(t.iters);
        for k in 0..t.warmup.max(1) + t.iters {
            self.g.origin().record(&start).map_err(err)?;
            run(&mut self.g)?;
            self.g.origin().record(&end).map_err(err)?;
            self.g.synchronize().map_err(err)?;
            if k >= t.warmup.max(1) {
                samples.push(f64::from(start.elapsed_ms(&end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        if self.g.stamps_enabled() {
            // TPAR_TEST_STAMPS: the timed call once more on cleared stamps, then its phases.
            self.g.clear_stamps().map_err(err)?;
            run(&mut self.g)?;
            let label = format!("{} {} B", algo.map_or_else(|| "launch floor".to_string(), |a| a.to_string()), count * d.size());
            super::stamps::report(&self.g, &label)?;
        }
        Ok(samples)
    }
}

impl Group for EmulatedRanks {
    fn world(&self) -> usize {
        self.g.world()
    }
    fn root(&self) -> bool {
        true
    }
    fn label(&self) -> String {
        format!("cuda-emulated-{}", self.g.transport())
    }
    fn transport(&self, _algo: Algorithm) -> Transport {
        self.g.transport()
    }
    fn describe(&mut self) -> Result<Vec<String>, String> {
        let mut v = vec![format!(
            "backend: cuda, {} ranks emulated as streams of one {} (transport {}); they prove correctness and kernel cost, not the fabric",
            self.g.world(),
            self.g.device().name,
            self.g.transport()
        )];
        for mode in [CaptureMode::Eager, CaptureMode::Graph] {
            let mut s = self.time_op(
                Collective::AllReduce,
                None,
                DType::BF16,
                1,
                Timing {
                    mode,
                    inner: 20,
                    warmup: 3,
                    iters: 50,
                },
            )?;
            let f = percentiles(&mut s);
            v.push(format!(
                "launch floor ({mode}): an empty kernel on each of {} ranks, launched like a collective: {:.2} us per call (p10 {:.2}, p90 {:.2})",
                self.g.world(),
                f.median,
                f.p10,
                f.p90
            ));
        }
        Ok(v)
    }
    fn algorithms(&self) -> Vec<Algorithm> {
        tpar::algorithms::registry::algorithms_emulated(self.g.transport())
    }
    fn planned(
        &mut self,
        _c: Collective,
        _d: DType,
        _bytes: usize,
        _mode: CaptureMode,
    ) -> Option<Algorithm> {
        None
    }
    fn checked(
        &mut self,
        c: Collective,
        d: DType,
        algo: Option<Algorithm>,
        seed: u64,
        call: u64,
        count: usize,
        io: Io,
    ) -> Result<Verdict, String> {
        let algo = algo.ok_or("emulated ranks have no plan: name the algorithms (--algo all)")?;
        if count == 0 {
            // An empty call launches nothing on emulated ranks; there is nothing to judge.
            return Ok(Verdict { algo, count, wrong: 0, inexact: 0, identical: true });
        }
        by_dtype!(d, T => self.checked_t::<T>(c, algo, seed, call, count, io))
    }
    fn time(
        &mut self,
        c: Collective,
        algo: Algorithm,
        d: DType,
        count: usize,
        t: Timing,
    ) -> Result<Option<Spread>, String> {
        let mut s = self.time_op(c, Some(algo), d, count, t)?;
        Ok(Some(percentiles(&mut s)))
    }
    fn barrier(&mut self) -> Result<(), String> {
        self.g.synchronize().map_err(err)
    }
    fn tune(&mut self, opts: tpar::tune::StartOptions, max_bytes: usize) -> Result<tpar::tune::Outcome, String> {
        let settings = tpar::Settings::from_env().map_err(err)?;
        tpar::cuda::tune::start_emulated(&mut self.g, max_bytes, &settings, opts).map_err(err)
    }
    fn peer_site(&mut self) -> Option<super::peer::Site<'_>> {
        Some(super::peer::Site::Emulated { device: self.g.device(), world: self.g.world() })
    }
    fn phase_report(&self) -> Option<String> {
        let p = &self.phases;
        let n = p.calls.max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / n;
        (p.calls > 0).then(|| {
            format!(
                "host time per checked call ({} calls): inputs {:.3} ms, upload + poison {:.3} ms, all-reduce + sync {:.3} ms, download {:.3} ms, judge {:.3} ms",
                p.calls,
                ms(p.inputs),
                ms(p.copies),
                ms(p.run),
                ms(p.download),
                ms(p.judge)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::islands_for;

    #[test]
    fn island_specs() {
        assert_eq!(islands_for(None, 5).unwrap(), vec![vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(islands_for(Some("one"), 3).unwrap(), vec![vec![0, 1, 2]]);
        assert_eq!(islands_for(Some("1+3,3+5"), 8).unwrap(), vec![vec![0, 1, 2], vec![3, 4, 5, 6, 7]]);
        assert_eq!(islands_for(Some("1+3,3+5"), 4).unwrap(), vec![vec![0], vec![1, 2, 3]]);
        assert_eq!(islands_for(Some("map:0101"), 4).unwrap(), vec![vec![0, 2], vec![1, 3]]);
        assert!(islands_for(Some("3+5"), 4).is_err());
        assert!(islands_for(Some("3+x"), 8).is_err());
        assert!(islands_for(Some("map:01"), 4).is_err());
    }
}
