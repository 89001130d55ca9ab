//! The fused all-reduce + residual add + RMSNorm and its family (the call's `FusedPattern`)
//! on emulated ranks (docs/cuda.md "Fused"): its correctness sweep (`tpar selftest fused`)
//! and its timings beside the all-reduce alone and the all-reduce followed by tpar's
//! add-RMSNorm kernel (`tpar bench --fused`).
//!
//! Every checked call: fresh random inputs (`tpar::testing::fused_inputs`: x per rank, the
//! residual and weight shared), outputs poisoned (or, in place, the outputs are the inputs),
//! every rank's two outputs held bit for bit to `tpar::testing::expected_rmsnorm` (the FP8
//! output's bytes to the reference's e4m3 bytes; the NVFP4 output's codes and its whole
//! swizzled scale tensor, padding zeroed, to the reference's; without a residual,
//! residual_out holds the sum: `tpar::testing::expected`),
//! to the f64 bound (`count_wrong_add_rmsnorm`; patterns without Gemma or a quantized
//! output), and compared across ranks.

use super::gpu::{err, POISON_WORD, TIMING_WORD};
use super::Timing;
use std::time::Instant;
use tpar::cuda::driver::{DeviceBuffer, Event};
use tpar::cuda::{RankSet, FusedBufs, FusedCall, FusedPath, FusedPattern, SetOptions};
use tpar::plan::CaptureMode;
use tpar::testing::{bit_diffs, count_wrong_add_rmsnorm, expected_add_rmsnorm, expected_rmsnorm, fused_inputs, NormPattern};
use tpar::{Algorithm, DType, Element, Transport};

/// One rank's buffers of the largest call.
pub struct RankFused {
    pub input: DeviceBuffer,
    pub residual: DeviceBuffer,
    pub weight: DeviceBuffer,
    pub norm_out: DeviceBuffer,
    pub residual_out: DeviceBuffer,
    /// FP8 patterns' static scale (one f32, [`FP8_SCALE`]), then NVFP4 patterns' global
    /// scale ([`NVFP4_SCALE`], at byte 4).
    pub scale: DeviceBuffer,
    /// NVFP4 patterns' block scales (the swizzled tensor of the largest call).
    pub scale_out: DeviceBuffer,
}

/// The FP8 patterns' static scale: 1 / scale (about 76.9) is not a power of two, and the
/// normalised outputs (up to about 6) reach the +-448 clamp.
pub const FP8_SCALE: f32 = 0.013;

/// The NVFP4 patterns' global scale: 448 * 6 / 4.5 (vLLM's recipe for a tensor whose largest
/// magnitude is 4.5), not a power of two; the normalised outputs (up to about 6) saturate
/// some block scales at 448.
pub const NVFP4_SCALE: f32 = 448.0 * 6.0 / 4.5;

/// Bytes of NVFP4 block scales that any call of up to `max_count` elements, rows of at most
/// `max_hidden`, needs: (rows + 127) x (hidden / 16 + 3) bytes at most, rows <= count / 16.
fn scale_out_cap(max_count: usize, max_hidden: usize) -> usize {
    (max_count / 16 + 128) * (max_hidden / 16 + 4)
}
/// What runs: the all-reduce alone (x into norm_out), the fused call (the fused kernel where
/// it takes the call), the unfused path (the all-reduce, then tpar's add-RMSNorm kernel), or
/// tpar's add-RMSNorm kernel alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    Fused,
    Unfused,
    NormOnly,
}

impl Op {
    pub fn label(self) -> &'static str {
        match self {
            Op::AllReduce => "all-reduce",
            Op::Fused => "fused",
            Op::Unfused => "all-reduce + add-rmsnorm",
            Op::NormOnly => "add-rmsnorm alone",
        }
    }
}

/// Where a fused call's outputs go: new buffers; in place as vLLM's `fused_add_rms_norm`
/// (the norm into x, the residual updated in place; FP8 output: the norm apart, as vLLM's
/// FP8 pattern, and without a residual the sum into the residual's buffer); or as vLLM's
/// fusion pass asks when it gives a separate norm output (the norm apart, the updated
/// residual into x).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedIo {
    OutOfPlace,
    InPlace,
    NormApart,
}

impl FusedIo {
    pub const ALL: [FusedIo; 3] = [FusedIo::OutOfPlace, FusedIo::InPlace, FusedIo::NormApart];
    pub fn label(self) -> &'static str {
        match self {
            FusedIo::OutOfPlace => "",
            FusedIo::InPlace => ", in place",
            FusedIo::NormApart => ", residual into x",
        }
    }
}

/// The judgement of one call on every rank.
#[derive(Clone, Copy, Debug, Default)]
pub struct FusedVerdict {
    /// Elements (residual_out and norm_out, all ranks) whose bits differ from the reference.
    pub inexact: usize,
    /// Elements outside the f64 bound (residual_out, norm_out), all ranks.
    pub f64_bad: (usize, usize),
    /// Every rank's two outputs bitwise equal to rank 0's.
    pub identical: bool,
}

impl FusedVerdict {
    pub fn ok(&self) -> bool {
        self.inexact == 0 && self.f64_bad == (0, 0) && self.identical
    }
}

/// `world` emulated ranks with buffers for fused calls of up to `max_count` elements.
pub struct FusedRanks {
    pub g: RankSet,
    pub bufs: Vec<RankFused>,
    max_count: usize,
    /// What the last timed call launched (`Launch::describe`, kernels joined by ` + `).
    pub last_launch: String,
}

impl FusedRanks {
    /// A group of `world` ranks on `device` for calls of up to `max_bytes` of x (f32 at most:
    /// buffers are sized for 4-byte elements of `max_bytes / 2` 16-bit ones), `max_hidden`
    /// elements a row; `skew_ns`: the skewed-rank test hook.
    pub fn new(device: usize, world: usize, max_bytes: usize, max_hidden: usize, transport: Transport, skew_ns: Option<u32>) -> Result<FusedRanks, String> {
        let t0 = Instant::now();
        let opts = SetOptions::from_env(transport).map_err(err)?;
        let mut g = RankSet::emulated(device, world, max_bytes, opts).map_err(err)?;
        let protocol = format!("{:?}", g.launcher().protocol()).to_ascii_lowercase();
        eprintln!(
            "# group: {world} emulated ranks on {} ({}), transport {transport} (push protocol {protocol}), max {max_bytes} B, ready in {:.0} ms",
            g.device().name,
            g.device().arch(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        if let Some(ns) = skew_ns {
            g.set_skew_for_test(Some((0x5_4e3, ns)));
            eprintln!("# skewed ranks: random delays of 0 to {ns} ns on the device before calls, per rank and call");
        }
        let bytes = max_bytes.div_ceil(16) * 16;
        let wbytes = (max_hidden * 4).div_ceil(16) * 16;
        let dev = g.device();
        let mut bufs = Vec::with_capacity(world);
        for _ in 0..world {
            let b = |n: usize| DeviceBuffer::new(dev, n).map_err(err);
            let scale = b(16)?;
            scale.upload(&[FP8_SCALE, NVFP4_SCALE]).map_err(err)?;
            let scale_out = b(scale_out_cap(max_bytes / 2, max_hidden).div_ceil(16) * 16)?;
            bufs.push(RankFused { input: b(bytes)?, residual: b(bytes)?, weight: b(wbytes)?, norm_out: b(bytes)?, residual_out: b(bytes)?, scale, scale_out });
        }
        Ok(FusedRanks { g, bufs, max_count: max_bytes / 4, last_launch: String::new() })
    }

    /// Every rank's addresses for outputs placed as `io` says, for `pattern`'s buffers.
    pub fn ptrs(&self, io: FusedIo, pattern: FusedPattern) -> Vec<FusedBufs> {
        self.bufs
            .iter()
            .map(|b| {
                let (n, r) = Self::outputs(b, io, pattern);
                FusedBufs {
                    input: b.input.ptr,
                    residual: if pattern.residual { b.residual.ptr } else { 0 },
                    weight: b.weight.ptr,
                    norm_out: n.ptr,
                    residual_out: r.ptr,
                    scale: if pattern.fp8 { b.scale.ptr } else if pattern.nvfp4 { b.scale.ptr + 4 } else { 0 },
                    scale_out: if pattern.nvfp4 { b.scale_out.ptr } else { 0 },
                }
            })
            .collect()
    }

    /// The buffers that receive (norm_out, residual_out) under `io`.
    fn outputs(b: &RankFused, io: FusedIo, pattern: FusedPattern) -> (&DeviceBuffer, &DeviceBuffer) {
        match io {
            FusedIo::OutOfPlace => (&b.norm_out, &b.residual_out),
            FusedIo::InPlace if pattern.quantized() => (&b.norm_out, &b.residual),
            FusedIo::InPlace => (&b.input, &b.residual),
            FusedIo::NormApart => (&b.norm_out, &b.input),
        }
    }

    fn fits(&self, call: &FusedCall) -> Result<(), String> {
        if call.count() * call.dtype.size() > self.max_count * 4 {
            return Err(format!("{} x {} {} exceeds the buffers", call.rows, call.hidden, call.dtype));
        }
        if call.scale_out_bytes() > self.bufs.first().map_or(0, |b| b.scale_out.bytes) {
            return Err(format!("{} x {} {}: its NVFP4 block scales exceed the buffer", call.rows, call.hidden, call.dtype));
        }
        Ok(())
    }

    /// Enqueues `op` on every rank (`algo`'s kernels; `blocks` 0: the policy).
    pub fn enqueue(&mut self, op: Op, algo: Algorithm, call: &FusedCall, bufs: &[FusedBufs]) -> tpar::Result<Option<FusedPath>> {
        match op {
            Op::AllReduce => {
                let (i, o): (Vec<u64>, Vec<u64>) = bufs.iter().map(|b| (b.input, b.norm_out)).unzip();
                self.g.enqueue(algo, call.dtype, call.count(), &i, &o, 0).map(|()| None)
            }
            Op::Fused => self.g.enqueue_add_rmsnorm(algo, call, bufs, 0, false).map(Some),
            Op::Unfused => self.g.enqueue_add_rmsnorm(algo, call, bufs, 0, true).map(Some),
            Op::NormOnly => self.g.enqueue_norm_only(call, bufs).map(|()| None),
        }
    }

    /// Uploads fresh inputs (seed, call index), poisons the outputs (out of place).
    fn upload<T: Element>(&self, call: &FusedCall, seed: u64, idx: u64, io: FusedIo) -> Result<tpar::testing::FusedInputs<T>, String> {
        let f = fused_inputs::<T>(seed, idx, self.g.world(), call.rows, call.hidden);
        for (b, x) in self.bufs.iter().zip(&f.xs) {
            b.input.upload(x).map_err(err)?;
            b.residual.upload(&f.residual).map_err(err)?;
            b.weight.upload(&f.weight).map_err(err)?;
            // Outputs that are not inputs are poisoned (an input aliased by an output must
            // change into the right output, which its input value is not).
            if io != FusedIo::InPlace || call.pattern.quantized() {
                b.norm_out.fill_u32(POISON_WORD).map_err(err)?;
            }
            if call.pattern.nvfp4 {
                b.scale_out.fill_u32(POISON_WORD).map_err(err)?; // every byte must be written, the padding as 0
            }
            if io == FusedIo::OutOfPlace {
                b.residual_out.fill_u32(POISON_WORD).map_err(err)?;
            }
            if !call.pattern.residual && io == FusedIo::InPlace {
                b.residual.fill_u32(POISON_WORD).map_err(err)?; // the sum's buffer there
            }
        }
        Ok(f)
    }

    /// Downloads and judges every rank's outputs against the exact reference (the call's
    /// pattern) and, for patterns without Gemma or a quantized output, f64.
    fn judge<T: Element>(&self, call: &FusedCall, f: &tpar::testing::FusedInputs<T>, io: FusedIo) -> Result<FusedVerdict, String> {
        let n = call.count();
        let p = call.pattern;
        let np = NormPattern { residual: p.residual, gemma: p.gemma, fp8_scale: p.fp8.then_some(FP8_SCALE), nvfp4_scale: p.nvfp4.then_some(NVFP4_SCALE) };
        let want = expected_rmsnorm(&f.xs, p.residual.then_some(f.residual.as_slice()), &f.weight, call.hidden, call.eps, &np).map_err(err)?;
        let want_res = want.residual_out.clone().unwrap_or_else(|| tpar::testing::expected(&f.xs));
        // The f64 bound: the residual pattern as is; without a residual, a residual of zeros
        // (the sum plus +0 is the sum, but for -0).
        let f64_inputs = (!p.gemma && !p.quantized()).then(|| if p.residual { f.clone() } else { tpar::testing::FusedInputs { residual: vec![T::from_f32(0.0); n], ..f.clone() } });
        let mut v = FusedVerdict { identical: true, ..Default::default() };
        let mut first: Option<(Vec<T>, Vec<u8>, Vec<T>)> = None;
        for b in &self.bufs {
            let mut norm = vec![T::from_f32(0.0); if p.quantized() { 0 } else { n }];
            let mut q = vec![0u8; if p.quantized() { call.out_bytes() } else { 0 }];
            let mut res = vec![T::from_f32(0.0); n];
            let (nb, rb) = Self::outputs(b, io, p);
            if p.fp8 {
                nb.download(&mut q).map_err(err)?;
                let wq = want.fp8.as_deref().unwrap_or_default();
                v.inexact += q.iter().zip(wq).filter(|(a, b)| a != b).count() + wq.len().abs_diff(q.len());
            } else if p.nvfp4 {
                // The codes, then the whole swizzled scale tensor (the rows' scales and the
                // zeroed padding), poisoned before the call.
                nb.download(&mut q).map_err(err)?;
                let w4 = want.nvfp4.as_ref().ok_or("the reference has no NVFP4 output")?;
                v.inexact += q.iter().zip(&w4.packed).filter(|(a, b)| a != b).count() + w4.packed.len().abs_diff(q.len());
                let mut sc = vec![0u8; call.scale_out_bytes()];
                b.scale_out.download(&mut sc).map_err(err)?;
                v.inexact += sc.iter().zip(&w4.scales).filter(|(a, b)| a != b).count() + w4.scales.len().abs_diff(sc.len());
                q.extend_from_slice(&sc); // compared across ranks with the codes
            } else {
                nb.download(&mut norm).map_err(err)?;
                v.inexact += bit_diffs(&norm, &want.out);
            }
            rb.download(&mut res).map_err(err)?;
            v.inexact += bit_diffs(&res, &want_res);
            if let Some(fi) = &f64_inputs {
                let (r, nm) = count_wrong_add_rmsnorm(&norm, &res, fi, call.hidden, call.eps);
                v.f64_bad.0 += r;
                v.f64_bad.1 += nm;
            }
            match &first {
                None => first = Some((norm, q, res)),
                Some((n0, q0, r0)) => v.identical &= bit_diffs(&norm, n0) == 0 && q == *q0 && bit_diffs(&res, r0) == 0,
            }
        }
        Ok(v)
    }

    /// One checked fused call (`unfused`: the unfused path), eager, or captured once and
    /// replayed `replays` times with fresh inputs before each replay (every replay judged;
    /// the verdicts summed). Returns the path taken and the verdict.
    #[allow(clippy::too_many_arguments)]
    pub fn check(&mut self, algo: Algorithm, call: &FusedCall, seed: u64, idx: u64, io: FusedIo, mode: CaptureMode, unfused: bool, replays: usize) -> Result<(FusedPath, FusedVerdict), String> {
        self.fits(call)?;
        by_dtype!(call.dtype, T => self.check_t::<T>(algo, call, seed, idx, io, mode, unfused, replays))
    }

    #[allow(clippy::too_many_arguments)]
    fn check_t<T: Element>(&mut self, algo: Algorithm, call: &FusedCall, seed: u64, idx: u64, io: FusedIo, mode: CaptureMode, unfused: bool, replays: usize) -> Result<(FusedPath, FusedVerdict), String> {
        let op = if unfused { Op::Unfused } else { Op::Fused };
        let bufs = self.ptrs(io, call.pattern);
        let what = |e: tpar::Error| format!("{algo} {} {} {} x {} ({mode}{}): {e}", call.pattern, call.dtype, call.rows, call.hidden, io.label());
        match mode {
            CaptureMode::Eager => {
                let f = self.upload::<T>(call, seed, idx, io)?;
                let path = self.enqueue(op, algo, call, &bufs).map_err(what)?.ok_or("no path")?;
                self.g.synchronize().map_err(what)?;
                Ok((path, self.judge(call, &f, io)?))
            }
            CaptureMode::Graph => {
                let mut path = None;
                let graph = self
                    .g
                    .capture(|g| {
                        path = match op {
                            Op::Fused => Some(g.enqueue_add_rmsnorm(algo, call, &bufs, 0, false)?),
                            _ => Some(g.enqueue_add_rmsnorm(algo, call, &bufs, 0, true)?),
                        };
                        Ok(())
                    })
                    .map_err(what)?;
                let mut total = FusedVerdict { identical: true, ..Default::default() };
                for k in 0..replays.max(1) {
                    let f = self.upload::<T>(call, seed, idx.wrapping_mul(131).wrapping_add(k as u64 + 1), io)?;
                    self.g.launch(&graph).map_err(what)?;
                    self.g.synchronize().map_err(what)?;
                    let v = self.judge(call, &f, io)?;
                    total.inexact += v.inexact;
                    total.f64_bad.0 += v.f64_bad.0;
                    total.f64_bad.1 += v.f64_bad.1;
                    total.identical &= v.identical;
                }
                Ok((path.ok_or("nothing captured")?, total))
            }
        }
    }

    /// Per-call microseconds of `op` per timed iteration (`t.inner` calls back to back, or
    /// captured in one graph), out of place on fixed inputs.
    pub fn time(&mut self, op: Op, algo: Algorithm, call: &FusedCall, t: Timing) -> Result<Vec<f64>, String> {
        self.fits(call)?;
        let bufs = self.ptrs(FusedIo::OutOfPlace, call.pattern);
        for b in &self.bufs {
            b.input.fill_u32(TIMING_WORD).map_err(err)?;
            b.residual.fill_u32(TIMING_WORD).map_err(err)?;
            b.weight.fill_u32(TIMING_WORD).map_err(err)?;
        }
        let what = |e: tpar::Error| format!("{} {algo} {} {} {} x {}: {e}", op.label(), call.pattern, call.dtype, call.rows, call.hidden);
        let inner = t.inner.max(1);
        // Compile and load everything first (nothing compiles inside a capture or a timing).
        self.g.take_launches();
        self.enqueue(op, algo, call, &bufs).map_err(what)?;
        self.g.synchronize().map_err(what)?;
        let mut shapes = self.g.take_launches();
        let graph = match t.mode {
            CaptureMode::Graph => {
                let mut r = Ok(());
                let g = self
                    .g
                    .capture(|g| {
                        for _ in 0..inner {
                            let x = match op {
                                Op::AllReduce => {
                                    let (i, o): (Vec<u64>, Vec<u64>) = bufs.iter().map(|b| (b.input, b.norm_out)).unzip();
                                    g.enqueue(algo, call.dtype, call.count(), &i, &o, 0)
                                }
                                Op::Fused => g.enqueue_add_rmsnorm(algo, call, &bufs, 0, false).map(|_| ()),
                                Op::Unfused => g.enqueue_add_rmsnorm(algo, call, &bufs, 0, true).map(|_| ()),
                                Op::NormOnly => g.enqueue_norm_only(call, &bufs),
                            };
                            if let Err(e) = x {
                                r = Err(e);
                                break;
                            }
                        }
                        Ok(())
                    })
                    .map_err(what)?;
                r.map_err(what)?;
                // The captured call's kernels (a registered call may launch differently).
                let captured = self.g.take_launches();
                shapes = captured[captured.len().saturating_sub(shapes.len())..].to_vec();
                Some(g)
            }
            CaptureMode::Eager => None,
        };
        self.last_launch = shapes.iter().map(|l| l.describe()).collect::<Vec<_>>().join(" + ");
        let start = Event::new(self.g.device()).map_err(err)?;
        let end = Event::new(self.g.device()).map_err(err)?;
        // One timed iteration: the graph, or `inner` calls back to back.
        let run = |me: &mut Self| -> Result<(), String> {
            match &graph {
                Some(gr) => me.g.launch(gr).map_err(what),
                None => (0..inner).try_for_each(|_| me.enqueue(op, algo, call, &bufs).map(|_| ()).map_err(what)),
            }
        };
        let mut samples = Vec::with_capacity(t.iters);
        for k in 0..t.warmup.max(1) + t.iters {
            self.g.origin().record(&start).map_err(err)?;
            run(self)?;
            self.g.origin().record(&end).map_err(err)?;
            self.g.synchronize().map_err(what)?;
            if k >= t.warmup.max(1) {
                samples.push(f64::from(start.elapsed_ms(&end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        if self.g.stamps_enabled() {
            // TPAR_TEST_STAMPS: the timed call once more on cleared stamps, then its phases.
            self.g.clear_stamps().map_err(err)?;
            run(self)?;
            super::stamps::report(&self.g, &format!("{} {algo} {} x {}", op.label(), call.rows, call.hidden))?;
        }
        Ok(samples)
    }
}

/// Distinct input sets of a sequence, cycled over its calls: more than the three buffers, so
/// that a call reading a slot a peer's later call already overwrote sums other bits.
const SEQUENCE_SETS: usize = 4;

impl FusedRanks {
    /// `calls` calls captured in one graph, cycling through `algos` and alternating the fused
    /// call with the plain all-reduce (so that fused and plain calls of every algorithm follow
    /// each other, and each cleans up after the other one call behind), each call on input
    /// set `k % 4` and its own outputs; replayed `replays` times, outputs poisoned before each
    /// replay, every call of every replay judged (fused calls against the fused reference,
    /// plain ones against the rank-order sum). With skewed ranks this is the buffer-reuse test
    /// of fused calls.
    pub fn check_sequence(&mut self, algos: &[Algorithm], call: &FusedCall, seed: u64, calls: usize, replays: usize) -> Result<FusedVerdict, String> {
        self.fits(call)?;
        if call.pattern != FusedPattern::ADD_RMSNORM {
            return Err(format!("the mixed sequence runs the add_rmsnorm pattern, not {}", call.pattern));
        }
        by_dtype!(call.dtype, T => self.sequence_t::<T>(algos, call, seed, calls, replays))
    }

    fn sequence_t<T: Element>(&mut self, algos: &[Algorithm], call: &FusedCall, seed: u64, calls: usize, replays: usize) -> Result<FusedVerdict, String> {
        let world = self.g.world();
        let n = call.count();
        let bytes = (n * call.dtype.size()).div_ceil(16) * 16;
        let wbytes = (call.hidden * call.dtype.size()).div_ceil(16) * 16;
        let dev = self.g.device();
        let buf = |b: usize| DeviceBuffer::new(dev, b).map_err(err);
        let sets: Vec<tpar::testing::FusedInputs<T>> = (0..SEQUENCE_SETS).map(|k| fused_inputs::<T>(seed ^ ((k as u64) << 40), 77, world, call.rows, call.hidden)).collect();
        // Per set and rank: x, residual, weight (uploaded once).
        let mut ins: Vec<Vec<[DeviceBuffer; 3]>> = Vec::with_capacity(SEQUENCE_SETS);
        for f in &sets {
            let mut per = Vec::with_capacity(world);
            for x in &f.xs {
                let b = [buf(bytes)?, buf(bytes)?, buf(wbytes)?];
                b[0].upload(x).map_err(err)?;
                b[1].upload(&f.residual).map_err(err)?;
                b[2].upload(&f.weight).map_err(err)?;
                per.push(b);
            }
            ins.push(per);
        }
        // Per call and rank: norm_out (the all-reduce's output for plain calls), residual_out.
        let mut outs: Vec<Vec<[DeviceBuffer; 2]>> = Vec::with_capacity(calls);
        for _ in 0..calls {
            outs.push((0..world).map(|_| Ok([buf(bytes)?, buf(bytes)?])).collect::<Result<Vec<_>, String>>()?);
        }
        let plan: Vec<(Algorithm, bool)> = (0..calls).map(|k| (algos[k % algos.len()], k % 2 == 0)).collect();
        let bufs_of = |k: usize| -> Vec<FusedBufs> {
            (0..world)
                .map(|r| {
                    let i = &ins[k % SEQUENCE_SETS][r];
                    FusedBufs { input: i[0].ptr, residual: i[1].ptr, weight: i[2].ptr, norm_out: outs[k][r][0].ptr, residual_out: outs[k][r][1].ptr, scale: 0, scale_out: 0 }
                })
                .collect()
        };
        let what = |e: tpar::Error| format!("sequence of {calls} ({} {} x {}): {e}", call.dtype, call.rows, call.hidden);
        // Load every variant outside the capture.
        for &(algo, fused) in &plan[..plan.len().min(2 * algos.len())] {
            let b = bufs_of(0);
            if fused {
                self.g.enqueue_add_rmsnorm(algo, call, &b, 0, false).map_err(what)?;
            } else {
                let (i, o): (Vec<u64>, Vec<u64>) = b.iter().map(|x| (x.input, x.norm_out)).unzip();
                self.g.enqueue(algo, call.dtype, n, &i, &o, 0).map_err(what)?;
            }
        }
        self.g.synchronize().map_err(what)?;
        let graph = self
            .g
            .capture(|g| {
                for (k, &(algo, fused)) in plan.iter().enumerate() {
                    let b = bufs_of(k);
                    if fused {
                        g.enqueue_add_rmsnorm(algo, call, &b, 0, false)?;
                    } else {
                        let (i, o): (Vec<u64>, Vec<u64>) = b.iter().map(|x| (x.input, x.norm_out)).unzip();
                        g.enqueue(algo, call.dtype, n, &i, &o, 0)?;
                    }
                }
                Ok(())
            })
            .map_err(what)?;
        let want: Vec<(Vec<T>, Vec<T>, Vec<T>)> = sets
            .iter()
            .map(|f| {
                let (nm, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, call.hidden, call.eps);
                (nm, r, tpar::testing::expected(&f.xs))
            })
            .collect();
        let mut v = FusedVerdict { identical: true, ..Default::default() };
        for _ in 0..replays.max(1) {
            for per in &outs {
                for o in per {
                    o[0].fill_u32(POISON_WORD).map_err(err)?;
                    o[1].fill_u32(POISON_WORD).map_err(err)?;
                }
            }
            self.g.launch(&graph).map_err(what)?;
            self.g.synchronize().map_err(what)?;
            for (k, &(_, fused)) in plan.iter().enumerate() {
                let (wn, wr, ws) = &want[k % SEQUENCE_SETS];
                let mut first: Option<Vec<T>> = None;
                for o in &outs[k] {
                    let mut norm = vec![T::from_f32(0.0); n];
                    o[0].download(&mut norm).map_err(err)?;
                    if fused {
                        let mut res = vec![T::from_f32(0.0); n];
                        o[1].download(&mut res).map_err(err)?;
                        v.inexact += bit_diffs(&norm, wn) + bit_diffs(&res, wr);
                        let (a, b) = count_wrong_add_rmsnorm(&norm, &res, &sets[k % SEQUENCE_SETS], call.hidden, call.eps);
                        v.f64_bad.0 += a;
                        v.f64_bad.1 += b;
                    } else {
                        v.inexact += bit_diffs(&norm, ws);
                    }
                    match &first {
                        None => first = Some(norm),
                        Some(f0) => v.identical &= bit_diffs(&norm, f0) == 0,
                    }
                }
            }
        }
        Ok(v)
    }
}

/// `--rows`: a comma list of counts and ranges (`1-8,13,64`).
pub fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let bad = || format!("{what} {item:?}: expected a number or a range such as 1-8");
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if a == 0 || b < a {
                    return Err(bad());
                }
                v.extend(a..=b);
            }
            None => v.push(item.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad)?),
        }
    }
    if v.is_empty() {
        return Err(format!("{what}: empty"));
    }
    Ok(v)
}

/// The algorithms with a fused kernel among `runs` (what these ranks run).
pub fn fusable(runs: &[Algorithm]) -> Vec<Algorithm> {
    runs.iter().copied().filter(|a| tpar::cuda::kernels::has_fused_variant(*a)).collect()
}

/// The dtype's f32-rounded eps for tests: 1e-6 (bf16, fp16 and f32 alike).
pub const EPS: f32 = 1e-6;

/// The call of `rows` x `hidden` of `d`, `pattern`.
pub fn call(d: DType, rows: usize, hidden: usize, pattern: FusedPattern) -> FusedCall {
    FusedCall { dtype: d, rows, hidden, eps: EPS, pattern }
}

/// `--pattern`: a comma list of pattern names (`[add_]rmsnorm[_gemma][_fp8|_nvfp4]`), or all.
pub fn parse_patterns(s: &str) -> Result<Vec<FusedPattern>, String> {
    if s.trim() == "all" {
        return Ok(FusedPattern::all());
    }
    let mut v = Vec::new();
    for name in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let p = FusedPattern::parse(name).map_err(|e| format!("--pattern: {e}"))?;
        if !v.contains(&p) {
            v.push(p);
        }
    }
    if v.is_empty() {
        return Err("--pattern: empty".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::{parse_list, parse_patterns};
    use tpar::cuda::FusedPattern;

    #[test]
    fn pattern_lists() {
        assert_eq!(parse_patterns("all").unwrap().len(), 12);
        assert_eq!(parse_patterns("rmsnorm, add_rmsnorm_gemma_fp8,rmsnorm").unwrap(), vec![FusedPattern { residual: false, gemma: false, fp8: false, nvfp4: false }, FusedPattern { residual: true, gemma: true, fp8: true, nvfp4: false }]);
        assert_eq!(parse_patterns("add_rmsnorm_nvfp4").unwrap(), vec![FusedPattern { residual: true, gemma: false, fp8: false, nvfp4: true }]);
        assert!(parse_patterns("plain").unwrap_err().contains("add_rmsnorm"));
        assert!(parse_patterns(",").is_err());
    }

    #[test]
    fn row_lists() {
        assert_eq!(parse_list("1-3,8", "--rows").unwrap(), vec![1, 2, 3, 8]);
        assert_eq!(parse_list("7168", "--hidden").unwrap(), vec![7168]);
        assert!(parse_list("0", "--rows").is_err());
        assert!(parse_list("4-2", "--rows").is_err());
        assert!(parse_list("x", "--rows").is_err());
        assert!(parse_list("", "--rows").is_err());
    }
}
