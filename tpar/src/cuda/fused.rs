//! The fused all-reduce + residual add + RMSNorm (docs/cuda.md "Fused all-reduce + residual
//! add + RMSNorm"): a call's shape and buffers, their validation, and the one rule that says
//! whether an algorithm's fused kernel takes the call or the unfused path does (the
//! all-reduce into the normalised output, then tpar's add-RMSNorm kernel in place: the same
//! bits).
//!
//! Owns: [`FusedCall`], [`FusedBufs`], [`fused_unfit`], [`fused_declined`], [`FusedPath`],
//! [`FusedRoute`] (a resolved fused call shape), [`FUSED_MAX_ROWS`].
//! Must never decide differently on two ranks of the same call (it is a pure function of the
//! call, the algorithm, the world, the workspace's size and `TPAR_FUSED`, all equal across
//! ranks: the setting is in the plan digest), and
//! never launch anything (`launch`, `emulated`, `ipc` and `comm` do).

use super::abi::{TparNorm, ROW_TILES_MAX, TILE_VECS, VEC_BYTES};
use super::kernels;
use super::launch::Launch;
use super::route::{Resolved, Route};
use crate::plan::Plan;
use std::sync::Arc;
use crate::error::{Error, Result};
use crate::dtype::DType;
use crate::kinds::Algorithm;
use std::fmt;

/// Most rows a fused kernel takes: the decode and speculative-verify range the fused kernels
/// are for (issue 24: 1-64 tokens). Larger calls run the unfused path (same bits): there the
/// message's own time dwarfs the second kernel's boundary (not measured).
pub const FUSED_MAX_ROWS: usize = 64;

/// The shape of a fused call: `rows` x `hidden` elements of `dtype`, and the norm's epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedCall {
    pub dtype: DType,
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
}

impl FusedCall {
    /// Elements of x, the residual and both outputs.
    pub fn count(&self) -> usize {
        self.rows.saturating_mul(self.hidden)
    }

    /// Bytes of x (the all-reduce's message).
    pub fn bytes(&self) -> usize {
        self.count().saturating_mul(self.dtype.size())
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.hidden.saturating_mul(self.dtype.size())
    }

    /// 16-byte vectors per row.
    pub fn row_vecs(&self) -> usize {
        self.hidden * self.dtype.size() / VEC_BYTES
    }

    /// What any path needs: rows of whole 16-byte vectors (tpar's add-RMSNorm kernel moves
    /// vectors), at most [`ROW_TILES_MAX`] tiles a row, a finite epsilon >= 0.
    pub fn validate(&self) -> Result<()> {
        if self.rows == 0 || self.hidden == 0 {
            return Err(Error::invalid("shape", format!("{} rows x {} hidden: both must be positive", self.rows, self.hidden)));
        }
        let per_vec = VEC_BYTES / self.dtype.size();
        if self.hidden % per_vec != 0 {
            return Err(Error::invalid(
                "hidden",
                format!("{}: rows must be whole 16-byte vectors (a multiple of {per_vec} elements of {})", self.hidden, self.dtype),
            ));
        }
        let most = ROW_TILES_MAX * TILE_VECS * per_vec;
        if self.hidden > most {
            return Err(Error::invalid("hidden", format!("{}: tpar's add-RMSNorm takes rows of at most {most} elements of {}", self.hidden, self.dtype)));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(Error::invalid("eps", format!("{}: must be finite and >= 0", self.eps)));
        }
        Ok(())
    }

    /// The norm's kernel arguments for `bufs`.
    pub fn norm_args(&self, bufs: &FusedBufs) -> TparNorm {
        TparNorm { residual: bufs.residual, residual_out: bufs.residual_out, weight: bufs.weight, hidden: self.hidden as u32, eps_bits: self.eps.to_bits() }
    }
}

/// One rank's buffers of a fused call: device addresses, 16-byte aligned. `norm_out` may be
/// `input` (in place, as vLLM's `fused_add_rms_norm`), `residual_out` may be `residual` or
/// `input` (vLLM's fusion pass asks for the updated residual in the input when it gives a
/// separate `norm_out`); no other two may overlap. Each alias is safe: an element of x or of
/// the residual is read, by the thread that later writes it or (two-shot, another chunk) only
/// by its owner, before the output that aliases it is written (docs/cuda.md "Fused").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedBufs {
    /// x, this rank's partial sum (rows x hidden).
    pub input: u64,
    /// The residual (rows x hidden), the same on every rank.
    pub residual: u64,
    /// The RMSNorm weight (hidden), the same on every rank.
    pub weight: u64,
    /// The normalised output (rows x hidden).
    pub norm_out: u64,
    /// The updated residual (rows x hidden).
    pub residual_out: u64,
}

impl FusedBufs {
    /// Alignment, non-null, and the aliasing rule (see the type).
    pub fn check(&self, call: &FusedCall) -> Result<()> {
        let n = call.bytes() as u64;
        let w = (call.hidden * call.dtype.size()) as u64;
        let named = [("input", self.input, n), ("residual", self.residual, n), ("weight", self.weight, w), ("norm_out", self.norm_out, n), ("residual_out", self.residual_out, n)];
        for (what, p, _) in named {
            if p == 0 || p % VEC_BYTES as u64 != 0 {
                return Err(Error::invalid(what, format!("address {p:#x} is null or not 16-byte aligned")));
            }
        }
        let allowed = |a: &str, b: &str| matches!((a, b), ("input", "norm_out") | ("input", "residual_out") | ("residual", "residual_out"));
        for (i, (a, pa, na)) in named.iter().enumerate() {
            for (b, pb, nb) in &named[i + 1..] {
                let overlap = pa < &(pb + nb) && pb < &(pa + na);
                if overlap && !(allowed(a, b) && pa == pb) {
                    return Err(Error::invalid(
                        "buffers",
                        format!("{a} ({pa:#x}, {na} B) overlaps {b} ({pb:#x}, {nb} B); only norm_out == input, residual_out == residual and residual_out == input may alias"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Which path a fused call took, and the algorithm of its all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedPath {
    /// One kernel: the algorithm's fused variant.
    Fused(Algorithm),
    /// The algorithm's all-reduce (or NCCL) into the output, then tpar's add-RMSNorm kernel.
    Unfused(Algorithm),
}

impl FusedPath {
    pub fn algorithm(self) -> Algorithm {
        match self {
            FusedPath::Fused(a) | FusedPath::Unfused(a) => a,
        }
    }
}

impl fmt::Display for FusedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FusedPath::Fused(a) => write!(f, "{a} fused"),
            FusedPath::Unfused(a) => write!(f, "{a} + add-rmsnorm"),
        }
    }
}

/// Where a fused call shape goes, resolved once (`GpuCommunicator::resolve_fused`).
#[derive(Clone, Copy, Debug)]
pub enum FusedRoute {
    /// The algorithm's fused kernel: its launch and the descriptor the call announces
    /// (`abi::fused_desc_code`).
    Fused { algorithm: Algorithm, launch: Launch, desc_code: u32 },
    /// The all-reduce's own route (a kernel, NCCL, or the caller's NCCL), then tpar's
    /// add-RMSNorm kernel (`norm`) in place on its output.
    Unfused { all_reduce: Route, norm: Launch },
}

/// One fused call shape, resolved once: the plan's decision (for x's bytes) and its route.
#[derive(Clone, Debug)]
pub struct FusedResolved {
    pub plan: Arc<Plan>,
    pub route: FusedRoute,
}

impl FusedResolved {
    /// The path and algorithm a call of this shape takes (NCCL for both NCCL routes).
    pub fn path(&self) -> FusedPath {
        match self.route {
            FusedRoute::Fused { algorithm, .. } => FusedPath::Fused(algorithm),
            FusedRoute::Unfused { all_reduce, .. } => FusedPath::Unfused(Resolved { plan: Arc::clone(&self.plan), route: all_reduce, collective: crate::kinds::Collective::AllReduce }.algorithm()),
        }
    }
}

/// Why `algo`'s fused kernel cannot take `call` among `world` ranks in a workspace of
/// `slot_vecs` vectors a slot (`None`: it can). The fused kernels need: a fused variant; at
/// most [`FUSED_MAX_ROWS`] rows; rows of whole tiles (32 vectors: one warp's; bf16 and fp16
/// rows of a multiple of 256 elements, f32 of 128), at most [`ROW_TILES_MAX`] of them; and
/// for two-shot, chunks rounded up to whole tiles that still fit a slot.
pub fn fused_unfit(algo: Algorithm, call: &FusedCall, world: usize, slot_vecs: usize) -> Option<String> {
    if !kernels::has_fused_variant(algo) {
        return Some(format!("{algo} has no fused kernel"));
    }
    if call.rows > FUSED_MAX_ROWS {
        return Some(format!("{} rows: the fused kernels take 1 to {FUSED_MAX_ROWS}", call.rows));
    }
    let per_vec = VEC_BYTES / call.dtype.size();
    let vrow = call.row_vecs();
    if call.hidden % per_vec != 0 || vrow % TILE_VECS != 0 {
        return Some(format!("hidden {}: the fused kernels take rows of whole {}-element tiles of {}", call.hidden, TILE_VECS * per_vec, call.dtype));
    }
    if vrow / TILE_VECS > ROW_TILES_MAX {
        return Some(format!("hidden {}: more than {ROW_TILES_MAX} tiles a row", call.hidden));
    }
    let nvec = call.rows * vrow;
    if matches!(algo, Algorithm::TwoshotPush | Algorithm::TwoshotPull) {
        let cvec = nvec.div_ceil(world.max(1)).div_ceil(TILE_VECS) * TILE_VECS;
        if cvec * world > slot_vecs {
            return Some(format!("{world} chunks of {cvec} vectors (whole tiles) exceed the workspace's {slot_vecs}-vector slots"));
        }
    }
    if nvec > slot_vecs {
        return Some(format!("{} B exceed the workspace", call.bytes()));
    }
    None
}

/// Why the plan's `algo` should not run its fused kernel for a call it takes (`None`: it
/// should), under `TPAR_FUSED` (`forced`: `Some(true)` wherever it takes the shape,
/// `Some(false)` never). Auto declines two-shot pull's: against its all-reduce followed by
/// the add-RMSNorm kernel (one H200, emulated ranks, bf16, 7168 x rows, graphs) the fused
/// kernel measured slower wherever the plan picks two-shot pull: 8 ranks 10 / 16 / 24 / 32
/// / 48 rows 21.86 / 23.18 / 23.72 / 24.54 / 25.78 us against 14.62 / 15.03 / 15.74 / 16.75
/// / 25.52, 4 ranks 24 / 32 / 48 rows 14.67 / 14.79 / 14.87 against 11.16 / 11.25 / 14.45,
/// 2 ranks 64 rows 14.00 against 11.05 (the copy-path all-reduce `GpuCommunicator` runs);
/// faster only at 64 rows of 4 and 8 ranks (15.07 vs 15.36, 27.60 vs 28.76;
/// bench/results/2026-12-03-h200-fused-twoshot-barrier/). The spread norm (kernels/norm.cuh
/// `TPAR_NORM_SPREAD`) took up to 6.3 us off it, not enough there: 8 ranks 16 / 32 rows
/// 16.61 / 20.62 against 14.99 / 17.20, 4 ranks 32 rows 12.99 against 11.31
/// (bench/results/2026-12-03-h200-fused-twoshot-spread/README.md). Callers that name the path
/// (`all_reduce_add_rmsnorm_with`, the emulated group) are not asked. The reason is logged
/// under `TPAR_DEBUG=INFO`.
pub fn fused_declined(algo: Algorithm, forced: Option<bool>) -> Option<String> {
    match forced {
        Some(true) => None,
        Some(false) => Some("TPAR_FUSED=0".to_string()),
        None if algo == Algorithm::TwoshotPull => {
            Some("two-shot pull's fused kernel measured slower than its all-reduce followed by the add-RMSNorm kernel (docs/cuda.md; TPAR_FUSED=1 runs it)".to_string())
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(dtype: DType, rows: usize, hidden: usize) -> FusedCall {
        FusedCall { dtype, rows, hidden, eps: 1e-6 }
    }

    #[test]
    fn the_fused_kernels_take_whole_tiles_up_to_64_rows() {
        let slot = (8 << 20) / 16;
        for h in [1024, 2048, 4096, 5120, 7168, 8192, 12288, 16384] {
            for rows in [1, 3, 8, 63, 64] {
                for a in [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPush, Algorithm::TwoshotPull] {
                    assert_eq!(fused_unfit(a, &call(DType::BF16, rows, h), 8, slot), None, "{a} {rows} x {h}");
                }
            }
        }
        assert!(fused_unfit(Algorithm::OneshotPush, &call(DType::BF16, 65, 4096), 8, slot).unwrap().contains("rows"));
        assert!(fused_unfit(Algorithm::OneshotPush, &call(DType::BF16, 1, 2880), 8, slot).unwrap().contains("tiles"));
        assert!(fused_unfit(Algorithm::StagedPush, &call(DType::BF16, 1, 4096), 8, slot).unwrap().contains("no fused kernel"));
        assert!(fused_unfit(Algorithm::Nccl, &call(DType::BF16, 1, 4096), 8, slot).is_some());
        // f32 rows are tiles of 128 elements.
        assert_eq!(fused_unfit(Algorithm::OneshotPush, &call(DType::F32, 2, 128), 2, slot), None);
        assert!(fused_unfit(Algorithm::OneshotPush, &call(DType::BF16, 2, 128), 2, slot).is_some());
        // Two-shot's chunks of whole tiles must fit a slot: 1 row of 7168 bf16 among 16 ranks
        // is 896 vectors, chunks of 64 (56 rounded up): 1024 vectors.
        assert!(fused_unfit(Algorithm::TwoshotPush, &call(DType::BF16, 1, 7168), 16, 1000).unwrap().contains("chunks"));
        assert_eq!(fused_unfit(Algorithm::OneshotPush, &call(DType::BF16, 1, 7168), 16, 1000), None);
    }

    #[test]
    fn auto_declines_only_two_shot_pulls_fused_kernel_and_the_setting_overrides_it() {
        for a in [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPush] {
            assert_eq!(fused_declined(a, None), None, "{a}");
            assert_eq!(fused_declined(a, Some(true)), None, "{a}");
            assert_eq!(fused_declined(a, Some(false)).as_deref(), Some("TPAR_FUSED=0"), "{a}");
        }
        let why = fused_declined(Algorithm::TwoshotPull, None).expect("auto declines two-shot pull's");
        assert!(why.contains("slower") && why.contains("TPAR_FUSED=1"), "{why}");
        assert_eq!(fused_declined(Algorithm::TwoshotPull, Some(true)), None);
        assert!(fused_declined(Algorithm::TwoshotPull, Some(false)).is_some());
    }

    #[test]
    fn shapes_and_buffers_are_validated() {
        assert!(call(DType::BF16, 0, 4096).validate().is_err());
        assert!(call(DType::BF16, 1, 4100).validate().is_err(), "not whole vectors");
        assert!(call(DType::BF16, 1, 2880).validate().is_ok(), "the unfused path takes it");
        assert!(call(DType::BF16, 1, 65536).validate().is_err(), "more tiles than the row sum takes");
        assert!(FusedCall { eps: f32::NAN, ..call(DType::F16, 1, 1024) }.validate().is_err());
        let c = call(DType::BF16, 2, 1024); // 4 KiB tensors, a 2 KiB weight
        let base = 1u64 << 32;
        let ok = FusedBufs { input: base, residual: base + 4096, weight: base + 8192, norm_out: base + 12288, residual_out: base + 16384 };
        assert!(ok.check(&c).is_ok());
        assert!(FusedBufs { norm_out: ok.input, residual_out: ok.residual, ..ok }.check(&c).is_ok(), "vLLM's in-place form");
        assert!(FusedBufs { residual_out: ok.input, ..ok }.check(&c).is_ok(), "vLLM's pass: norm_out apart, the residual into x");
        assert!(FusedBufs { norm_out: ok.input, residual_out: ok.input, ..ok }.check(&c).is_err(), "both outputs in one buffer");
        assert!(FusedBufs { norm_out: ok.residual, ..ok }.check(&c).is_err());
        assert!(FusedBufs { norm_out: ok.input + 16, ..ok }.check(&c).is_err(), "a partial overlap");
        assert!(FusedBufs { weight: ok.input + 2048, ..ok }.check(&c).is_err());
        assert!(FusedBufs { residual_out: ok.residual + 8, ..ok }.check(&c).is_err(), "misaligned");
    }
}
