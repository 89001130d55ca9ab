//! The fused all-reduce + residual add + RMSNorm and its family (docs/cuda.md "Fused
//! all-reduce + residual add + RMSNorm", "Fused all-reduce + RMSNorm family": [`FusedPattern`]): a call's
//! shape, pattern and buffers, their validation, and the one rule that says
//! whether an algorithm's fused kernel takes the call or the unfused path does (the
//! all-reduce into the normalised output, then tpar's add-RMSNorm kernel in place: the same
//! bits).
//!
//! Owns: [`FusedPattern`], [`FusedCall`], [`FusedBufs`], [`fused_unfit`], [`fused_declined`], [`rows_owned`], [`owned_rows_chunk`], [`fused_flags`], [`FusedPath`],
//! [`FusedRoute`] (a resolved fused call shape), [`FUSED_MAX_ROWS`].
//! Must never decide differently on two ranks of the same call (it is a pure function of the
//! call, the algorithm, the world, the workspace's size, `TPAR_FUSED` and `TPAR_FUSED_ROWS`,
//! all equal across ranks: the ranks compare both at the rendezvous), and
//! never launch anything (`launch`, `emulated`, `ipc` and `comm` do).

use super::abi::{self, TparNorm, NORM_FP8, NORM_GEMMA, NORM_NVFP4, NORM_RESIDUAL, NORM_ROWS, ROW_TILES_MAX, TILE_VECS, VEC_BYTES};
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

/// Which member of the fused all-reduce + RMSNorm family a call is (docs/cuda.md "Fused
/// all-reduce + RMSNorm family"; `tpar::testing::NormPattern` is its reference): with or without the
/// residual add, the Gemma weight offset (`f32(w) + 1`), and an FP8 e4m3fn output quantized
/// with a static per-tensor scale (vLLM's `static_scaled_fp8_quant`; the scale is a device
/// f32, [`FusedBufs::scale`]) or an NVFP4 output (vLLM's `scaled_fp4_quant`: e2m1 codes two a
/// byte, e4m3fn block scales of 16 elements in the 128x4-swizzled layout,
/// [`FusedBufs::scale_out`], with the device f32 global scale [`FusedBufs::scale`]; rows of a
/// multiple of 16 elements). Every pattern runs in the same kernels (the pattern is
/// [`TparNorm::flags`]) on every path the residual pattern takes, and is part of the call's
/// descriptor: ranks that call different patterns get a Mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FusedPattern {
    /// The residual add before the norm (the updated residual is an output).
    pub residual: bool,
    /// The Gemma weight offset: the norm multiplies by `f32(w) + 1`.
    pub gemma: bool,
    /// The output is FP8 e4m3fn (1 byte an element), quantized with the static scale.
    pub fp8: bool,
    /// The output is NVFP4 (half a byte an element, and the block scales); never with `fp8`.
    pub nvfp4: bool,
}

impl FusedPattern {
    /// The residual add + RMSNorm (vLLM's `fused_add_rms_norm`).
    pub const ADD_RMSNORM: FusedPattern = FusedPattern { residual: true, gemma: false, fp8: false, nvfp4: false };

    /// Every pattern: {residual, none} x {plain, gemma} x {dtype, fp8, nvfp4}.
    pub fn all() -> Vec<FusedPattern> {
        (0..12u32).map(|f| FusedPattern { residual: f & 1 == 0, gemma: f & 2 != 0, fp8: f >> 2 == 1, nvfp4: f >> 2 == 2 }).collect()
    }

    /// The kernels' [`TparNorm::flags`].
    pub fn flags(self) -> u32 {
        (if self.residual { NORM_RESIDUAL } else { 0 })
            | (if self.gemma { NORM_GEMMA } else { 0 })
            | (if self.fp8 { NORM_FP8 } else { 0 })
            | (if self.nvfp4 { NORM_NVFP4 } else { 0 })
    }

    /// Whether the output is quantized (FP8 or NVFP4): not the dtype, so never in x.
    pub fn quantized(self) -> bool {
        self.fp8 || self.nvfp4
    }

    /// `[add_]rmsnorm[_gemma][_fp8|_nvfp4]` (the CLI's `--pattern` values, `NormPattern::name`'s).
    pub fn name(self) -> String {
        abi::pattern_name(self.flags())
    }

    /// The pattern named `name` ([`name`](Self::name)'s form).
    pub fn parse(name: &str) -> Result<FusedPattern> {
        Self::all().into_iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<String> = Self::all().iter().map(|p| p.name()).collect();
            Error::invalid("pattern", format!("{name:?}: one of {}", names.join(", ")))
        })
    }
}

impl fmt::Display for FusedPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The shape of a fused call: `rows` x `hidden` elements of `dtype`, the norm's epsilon, and
/// the pattern.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedCall {
    pub dtype: DType,
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
    pub pattern: FusedPattern,
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

    /// Bytes of the normalised output: 1 an element for FP8, half for NVFP4, else the dtype's.
    pub fn out_bytes(&self) -> usize {
        if self.pattern.fp8 {
            self.count()
        } else if self.pattern.nvfp4 {
            self.count() / 2
        } else {
            self.bytes()
        }
    }

    /// Bytes of the NVFP4 block scales: vLLM's swizzled tensor, rows padded to 128 and the
    /// row's hidden / 16 scales to a multiple of 4 (0 for other patterns). The kernels write
    /// all of it: the rows' scales, and 0 into the padding (as vLLM's kernel does).
    pub fn scale_out_bytes(&self) -> usize {
        if self.pattern.nvfp4 {
            crate::testing::nvfp4_scale_bytes(self.rows, self.hidden)
        } else {
            0
        }
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
        let p = self.pattern;
        if p.fp8 && p.nvfp4 {
            return Err(Error::invalid("pattern", "FP8 and NVFP4 outputs exclude each other".to_string()));
        }
        if p.nvfp4 && self.hidden % 16 != 0 {
            return Err(Error::invalid("hidden", format!("{}: NVFP4 output needs a multiple of 16 elements a row (its scale blocks)", self.hidden)));
        }
        Ok(())
    }

    /// The norm's kernel arguments for `bufs`.
    pub fn norm_args(&self, bufs: &FusedBufs) -> TparNorm {
        TparNorm {
            residual: bufs.residual,
            residual_out: bufs.residual_out,
            weight: bufs.weight,
            hidden: self.hidden as u32,
            eps_bits: self.eps.to_bits(),
            scale: bufs.scale,
            flags: self.pattern.flags(),
            pad: 0,
            scale_out: bufs.scale_out,
        }
    }
}

/// One rank's buffers of a fused call: device addresses, 16-byte aligned. `norm_out` may be
/// `input` (in place, as vLLM's `fused_add_rms_norm`; not for FP8 output), `residual_out` may
/// be `residual` or `input` (vLLM's fusion pass asks for the updated residual in the input
/// when it gives a separate `norm_out`); no other two may overlap. Each alias is safe: an
/// element of x or of the residual is read, by the thread that later writes it or (two-shot,
/// another chunk) only by its owner, before the output that aliases it is written
/// (docs/cuda.md "Fused"). Without a residual (the pattern's), `residual` is 0 and
/// `residual_out` receives the all-reduce's sum; with FP8 output, `norm_out` holds 1 byte an
/// element and `scale` is the f32 scale's address (else 0). The unfused path of an FP8
/// call all-reduces into `residual_out`, or into `input` where `residual_out` is the
/// residual itself (x then holds the sum afterwards).
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
    /// The updated residual (rows x hidden); without a residual, the all-reduce's sum.
    pub residual_out: u64,
    /// FP8 output: the device address of the static scale; NVFP4 output: of the global scale
    /// (one f32, 4-byte aligned); else 0.
    pub scale: u64,
    /// NVFP4 output: the block scales ([`FusedCall::scale_out_bytes`], vLLM's 128x4-swizzled
    /// layout); else 0.
    pub scale_out: u64,
}

impl FusedBufs {
    /// Alignment, non-null, the pattern's buffers present (and only those), and the aliasing
    /// rule (see the type).
    pub fn check(&self, call: &FusedCall) -> Result<()> {
        let n = call.bytes() as u64;
        let w = (call.hidden * call.dtype.size()) as u64;
        let p = call.pattern;
        if !p.residual && self.residual != 0 {
            return Err(Error::invalid("residual", format!("pattern {p} takes no residual, got address {:#x}", self.residual)));
        }
        if p.quantized() {
            if self.scale == 0 || self.scale % 4 != 0 {
                let what = if p.nvfp4 { "NVFP4 global" } else { "FP8" };
                return Err(Error::invalid("scale", format!("pattern {p}: the {what} scale's address {:#x} is null or not 4-byte aligned", self.scale)));
            }
        } else if self.scale != 0 {
            return Err(Error::invalid("scale", format!("pattern {p} has no FP8 or NVFP4 output, got a scale at {:#x}", self.scale)));
        }
        if p.nvfp4 {
            if self.scale_out == 0 || self.scale_out % 4 != 0 {
                return Err(Error::invalid("scale_out", format!("pattern {p}: the NVFP4 block scales' address {:#x} is null or not 4-byte aligned", self.scale_out)));
            }
        } else if self.scale_out != 0 {
            return Err(Error::invalid("scale_out", format!("pattern {p} has no NVFP4 output, got block scales at {:#x}", self.scale_out)));
        }
        let mut named = vec![("input", self.input, n), ("weight", self.weight, w), ("norm_out", self.norm_out, call.out_bytes() as u64), ("residual_out", self.residual_out, n)];
        if p.residual {
            named.insert(1, ("residual", self.residual, n));
        }
        if p.nvfp4 {
            let (s, sb) = (self.scale_out, call.scale_out_bytes() as u64);
            if let Some((what, ptr, len)) = named.iter().copied().chain([("scale", self.scale, 4)]).find(|&(_, ptr, len)| s < ptr + len && ptr < s + sb) {
                return Err(Error::invalid("scale_out", format!("the NVFP4 block scales ({s:#x}, {sb} B) overlap {what} ({ptr:#x}, {len} B)")));
            }
        }
        for &(what, ptr, _) in &named {
            if ptr == 0 || ptr % VEC_BYTES as u64 != 0 {
                return Err(Error::invalid(what, format!("address {ptr:#x} is null or not 16-byte aligned")));
            }
        }
        let allowed = |a: &str, b: &str| matches!((a, b), ("input", "norm_out") if !p.quantized()) || matches!((a, b), ("input", "residual_out") | ("residual", "residual_out"));
        for (i, (a, pa, na)) in named.iter().enumerate() {
            for (b, pb, nb) in &named[i + 1..] {
                let overlap = pa < &(pb + nb) && pb < &(pa + na);
                if overlap && !(allowed(a, b) && pa == pb) {
                    return Err(Error::invalid(
                        "buffers",
                        format!("{a} ({pa:#x}, {na} B) overlaps {b} ({pb:#x}, {nb} B); only norm_out == input (not for FP8 or NVFP4 output), residual_out == residual and residual_out == input may alias"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Where the unfused path all-reduces (then the add-RMSNorm kernel reads it as x, in
    /// place): `norm_out`, or for FP8 output (1 byte an element) `residual_out`, or `input`
    /// where `residual_out` is the residual (which the sum must not overwrite before it is
    /// added).
    pub fn unfused_sum(&self, call: &FusedCall) -> u64 {
        if !call.pattern.quantized() {
            self.norm_out
        } else if call.pattern.residual && self.residual_out == self.residual {
            self.input
        } else {
            self.residual_out
        }
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

/// Whether two-shot pull's fused kernel splits `call` among `world` ranks into whole rows
/// (kernels/twoshot_pull.cu, `TPAR_NORM_ROWS`): `ceil(rows / world)` rows a rank (the last
/// owners fewer, or none), each owner normalising its rows alone and the all-gather moving
/// the finished outputs, instead of chunks of whole tiles after which every rank normalises
/// every row (the spread norm, kernels/norm.cuh). Only where world chunks of that many rows
/// fit a workspace slot (`slot_vecs` vectors). `forced` is `TPAR_FUSED_ROWS`; auto takes it
/// from `rows >= world` on, where no rank owns more than twice its even share (the last
/// ranks may own none: 9 rows of 8 ranks are 2, 2, 2, 2, 1, 0, 0, 0): the redundant norm it removes is (world - 1) / world of the message's
/// normalisation on every rank (on emulated ranks sharing one GPU, world-fold that GPU's
/// work), against moving two outputs instead of one sum in the all-gather. Fewer rows leave
/// ranks idle in the reduce: the spread norm stays there (the A/B: `TPAR_FUSED_ROWS=1`).
/// A pure function of the call, the world, the workspace and the setting: ranks must agree
/// (the descriptor carries the choice, [`NORM_ROWS`]: a rank that differs gets a Mismatch).
pub fn rows_owned(algo: Algorithm, call: &FusedCall, world: usize, slot_vecs: usize, forced: Option<bool>) -> bool {
    if !kernels::has_fused_rows(algo) {
        return false;
    }
    let world = world.max(1);
    owned_rows_chunk(call, world).saturating_mul(world) <= slot_vecs && forced.unwrap_or(call.rows >= world)
}

/// Vectors of each rank's chunk in the rows variant: `ceil(rows / world)` whole rows (rank q
/// owns vectors `[q c, min((q + 1) c, rows x row_vecs))`, kernels/twoshot_pull.cu's `cvec`).
pub fn owned_rows_chunk(call: &FusedCall, world: usize) -> usize {
    call.rows.div_ceil(world.max(1)).saturating_mul(call.row_vecs())
}

/// The [`TparNorm::flags`] `algo`'s fused kernel runs `call` with: the pattern's, and
/// [`NORM_ROWS`] where [`rows_owned`]; the fused descriptor carries them
/// (`abi::fused_desc_code`).
pub fn fused_flags(algo: Algorithm, call: &FusedCall, world: usize, slot_vecs: usize, forced: Option<bool>) -> u32 {
    call.pattern.flags() | if rows_owned(algo, call, world, slot_vecs, forced) { NORM_ROWS } else { 0 }
}

/// Why the plan's `algo` should not run its fused kernel for a call it takes (`None`: it
/// should), under `TPAR_FUSED` (`forced`: `Some(true)` wherever it takes the shape,
/// `Some(false)` never); `rows`: the call runs two-shot pull's owned rows ([`rows_owned`]).
/// Auto declines two-shot pull's spread-norm form: against its all-reduce followed by
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
/// (`all_reduce_add_rmsnorm_with`, the emulated group) are not asked. Its owned-rows form
/// (each row normalised once, by its owner; from as many rows as ranks) is not declined: on
/// one H200, 8 emulated ranks, bf16, graphs, it measured faster than the unfused path at every
/// shape timed, every pattern (hidden 5120 / 7168 / 8192 x 16 and 32 rows: add-RMSNorm 13.40
/// to 15.54 us against 15.31 to 18.31, FP8 13.06 to 15.21 against 15.79 to 19.47, NVFP4 15.95
/// to 17.50 against 16.96 to 21.62; bench/results/2026-12-07-h200-fused-rows-nvfp4/). The
/// reason is logged under `TPAR_DEBUG=INFO`.
pub fn fused_declined(algo: Algorithm, forced: Option<bool>, rows: bool) -> Option<String> {
    match forced {
        Some(true) => None,
        Some(false) => Some("TPAR_FUSED=0".to_string()),
        None if algo == Algorithm::TwoshotPull && !rows => {
            Some("two-shot pull's fused kernel with its spread norm measured slower than its all-reduce followed by the add-RMSNorm kernel (docs/cuda.md; TPAR_FUSED=1 runs it)".to_string())
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(dtype: DType, rows: usize, hidden: usize) -> FusedCall {
        FusedCall { dtype, rows, hidden, eps: 1e-6, pattern: FusedPattern::ADD_RMSNORM }
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
    fn auto_declines_only_two_shot_pulls_spread_norm_and_the_setting_overrides_it() {
        for a in [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPush] {
            assert_eq!(fused_declined(a, None, false), None, "{a}");
            assert_eq!(fused_declined(a, Some(true), false), None, "{a}");
            assert_eq!(fused_declined(a, Some(false), false).as_deref(), Some("TPAR_FUSED=0"), "{a}");
        }
        let why = fused_declined(Algorithm::TwoshotPull, None, false).expect("auto declines two-shot pull's spread norm");
        assert!(why.contains("slower") && why.contains("TPAR_FUSED=1"), "{why}");
        assert_eq!(fused_declined(Algorithm::TwoshotPull, None, true), None, "owned rows measured faster than the unfused path");
        assert_eq!(fused_declined(Algorithm::TwoshotPull, Some(true), true), None);
        assert_eq!(fused_declined(Algorithm::TwoshotPull, Some(true), false), None);
        assert!(fused_declined(Algorithm::TwoshotPull, Some(false), true).is_some());
    }

    /// Owned rows: two-shot pull only, from rows >= world on (auto), forced either way by
    /// TPAR_FUSED_ROWS, never where world chunks of ceil(rows / world) rows overflow a slot;
    /// the kernel's flags and descriptor carry the choice.
    #[test]
    fn two_shot_pull_owns_rows_from_world_rows_on_where_they_fit() {
        let slot = (8 << 20) / 16;
        let c = |rows| call(DType::BF16, rows, 7168);
        for (rows, world, want) in [(32, 8, true), (16, 8, true), (8, 8, true), (9, 8, true), (33, 8, true), (7, 8, false), (1, 8, false), (3, 2, true), (1, 2, false), (64, 4, true)] {
            assert_eq!(rows_owned(Algorithm::TwoshotPull, &c(rows), world, slot, None), want, "{rows} rows, {world} ranks");
        }
        for a in [Algorithm::OneshotPush, Algorithm::OneshotPull, Algorithm::TwoshotPush] {
            assert!(!rows_owned(a, &c(32), 8, slot, Some(true)), "{a}: no owned-rows form");
        }
        assert!(rows_owned(Algorithm::TwoshotPull, &c(1), 8, slot, Some(true)), "forced on below world rows");
        assert!(!rows_owned(Algorithm::TwoshotPull, &c(32), 8, slot, Some(false)), "forced off");
        // 9 rows of 896 vectors among 8 ranks: chunks of 2 rows, 8 x 1792 = 14336 vectors.
        assert!(rows_owned(Algorithm::TwoshotPull, &c(9), 8, 14336, None));
        assert!(!rows_owned(Algorithm::TwoshotPull, &c(9), 8, 14335, Some(true)), "chunks of whole rows overflow the slot");
        let flags = fused_flags(Algorithm::TwoshotPull, &c(32), 8, slot, None);
        assert_eq!(flags, NORM_RESIDUAL | NORM_ROWS);
        assert_eq!(fused_flags(Algorithm::TwoshotPull, &c(3), 8, slot, None), NORM_RESIDUAL);
        assert_eq!(fused_flags(Algorithm::OneshotPull, &c(32), 8, slot, None), NORM_RESIDUAL);
        assert_ne!(abi::fused_desc_code(Algorithm::TwoshotPull, DType::BF16, flags), abi::fused_desc_code(Algorithm::TwoshotPull, DType::BF16, c(32).pattern.flags()), "the descriptor tells the layouts apart");
    }

    /// The rows variant's chunks (the kernel's `cvec`) split the message into whole rows,
    /// each vector owned by exactly one rank (the all-gather skips chunks past the message),
    /// and where auto takes them (rows >= world) no rank owns more than twice its even share.
    #[test]
    fn owned_rows_chunks_are_whole_rows_covering_the_message_once() {
        for world in [1usize, 2, 3, 4, 5, 7, 8, 16] {
            for rows in 1..=64usize {
                let c = call(DType::BF16, rows, 4096); // 512 vectors a row
                let (vrow, nvec, cvec) = (c.row_vecs(), rows * c.row_vecs(), owned_rows_chunk(&c, world));
                assert_eq!(cvec % vrow, 0, "{rows} rows, {world} ranks: chunks of whole rows");
                assert_eq!(cvec % TILE_VECS, 0, "whole tiles");
                let mut owner = vec![usize::MAX; nvec];
                for q in 0..world {
                    for (v, o) in owner.iter_mut().enumerate().take(((q + 1) * cvec).min(nvec)).skip((q * cvec).min(nvec)) {
                        assert_eq!(*o, usize::MAX, "{rows} rows, {world} ranks: vector {v} owned twice");
                        *o = q;
                    }
                }
                assert!(owner.iter().all(|&q| q < world), "{rows} rows, {world} ranks: a vector nobody owns");
                if rows >= world {
                    assert!(cvec / vrow * world <= 2 * rows, "{rows} rows, {world} ranks: {} rows a rank", cvec / vrow);
                }
            }
        }
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
        let ok = FusedBufs { input: base, residual: base + 4096, weight: base + 8192, norm_out: base + 12288, residual_out: base + 16384, scale: 0, scale_out: 0 };
        assert!(ok.check(&c).is_ok());
        assert!(FusedBufs { norm_out: ok.input, residual_out: ok.residual, ..ok }.check(&c).is_ok(), "vLLM's in-place form");
        assert!(FusedBufs { residual_out: ok.input, ..ok }.check(&c).is_ok(), "vLLM's pass: norm_out apart, the residual into x");
        assert!(FusedBufs { norm_out: ok.input, residual_out: ok.input, ..ok }.check(&c).is_err(), "both outputs in one buffer");
        assert!(FusedBufs { norm_out: ok.residual, ..ok }.check(&c).is_err());
        assert!(FusedBufs { norm_out: ok.input + 16, ..ok }.check(&c).is_err(), "a partial overlap");
        assert!(FusedBufs { weight: ok.input + 2048, ..ok }.check(&c).is_err());
        assert!(FusedBufs { residual_out: ok.residual + 8, ..ok }.check(&c).is_err(), "misaligned");
        assert!(FusedBufs { scale: base + 20480, ..ok }.check(&c).is_err(), "a scale without FP8 output");
        // Without a residual: no residual address; residual_out (the sum) still required.
        let plain = FusedCall { pattern: FusedPattern { residual: false, gemma: true, fp8: false, nvfp4: false }, ..c };
        assert!(ok.check(&plain).is_err(), "a residual the pattern does not take");
        assert!(FusedBufs { residual: 0, ..ok }.check(&plain).is_ok());
        assert!(FusedBufs { residual: 0, residual_out: 0, ..ok }.check(&plain).is_err());
        assert!(FusedBufs { residual: 0, residual_out: ok.input, ..ok }.check(&plain).is_ok());
        // FP8 output: a scale, 1 byte an element (norm_out may sit right before residual_out's
        // 2 KiB), never in x.
        let fp8 = FusedCall { pattern: FusedPattern { residual: true, gemma: false, fp8: true, nvfp4: false }, ..c };
        assert!(ok.check(&fp8).is_err(), "no scale");
        let q = FusedBufs { scale: base + 20480, norm_out: base + 16384 - 2048, ..ok };
        assert!(q.check(&fp8).is_ok());
        assert!(FusedBufs { scale: base + 20482, ..q }.check(&fp8).is_err(), "a misaligned scale");
        assert!(FusedBufs { norm_out: ok.input, ..q }.check(&fp8).is_err(), "FP8 output in x");
        assert!(FusedBufs { norm_out: base + 16384 - 1024, ..q }.check(&fp8).is_err(), "overlaps residual_out");
        // The unfused path's sum: never in the FP8 output, never over the residual it adds.
        assert_eq!(ok.unfused_sum(&c), ok.norm_out);
        assert_eq!(q.unfused_sum(&fp8), q.residual_out);
        assert_eq!(FusedBufs { residual_out: q.residual, ..q }.unfused_sum(&fp8), q.input);
        // NVFP4 output: the global scale and the block scales (2 rows padded to 128, 64
        // scales a row: 8 KiB), half a byte an element, never in x; never with FP8.
        let fp4 = FusedCall { pattern: FusedPattern { residual: true, gemma: false, fp8: false, nvfp4: true }, ..c };
        assert_eq!((fp4.out_bytes(), fp4.scale_out_bytes()), (1024, 128 * 64));
        let n4 = FusedBufs { scale: base + 20480, scale_out: base + 24576, norm_out: base + 16384 - 1024, ..ok };
        assert!(n4.check(&fp4).is_ok(), "{:?}", n4.check(&fp4));
        let field = |b: FusedBufs, c: &FusedCall| match b.check(c) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(FusedBufs { scale_out: 0, ..n4 }, &fp4), "scale_out", "no block scales");
        assert_eq!(field(FusedBufs { scale_out: base + 24578, ..n4 }, &fp4), "scale_out", "misaligned block scales");
        assert_eq!(field(FusedBufs { scale_out: base + 16384, ..n4 }, &fp4), "scale_out", "block scales over residual_out");
        assert_eq!(field(FusedBufs { scale: 0, ..n4 }, &fp4), "scale", "no global scale");
        assert_eq!(field(FusedBufs { norm_out: ok.input, ..n4 }, &fp4), "buffers", "NVFP4 output in x");
        assert_eq!(field(FusedBufs { scale_out: base + 24576, ..q }, &fp8), "scale_out", "block scales without NVFP4");
        assert_eq!(n4.unfused_sum(&fp4), n4.residual_out);
        let bad = |pattern: FusedPattern, hidden: usize| FusedCall { pattern, hidden, ..c }.validate();
        assert!(bad(FusedPattern { fp8: true, ..fp4.pattern }, 1024).is_err(), "FP8 and NVFP4 at once");
        assert!(bad(fp4.pattern, 1032).unwrap_err().to_string().contains("multiple of 16"), "a partial scale block");
        assert!(bad(fp4.pattern, 1040).is_ok());
    }

    #[test]
    fn patterns_have_names_flags_and_parse_back() {
        let all = FusedPattern::all();
        assert_eq!(all.len(), 12);
        let mut flags: Vec<u32> = all.iter().map(|p| p.flags()).collect();
        flags.sort_unstable();
        assert_eq!(flags, (0..8).chain(16..20).collect::<Vec<_>>());
        for p in &all {
            assert_eq!(FusedPattern::parse(&p.name()).unwrap(), *p);
            let r = crate::testing::NormPattern { residual: p.residual, gemma: p.gemma, fp8_scale: p.fp8.then_some(1.0), nvfp4_scale: p.nvfp4.then_some(1.0) };
            assert_eq!(r.name(), p.name(), "the reference's name");
        }
        assert_eq!(FusedPattern::ADD_RMSNORM.name(), "add_rmsnorm");
        assert!(FusedPattern::parse("rmsnorm_fp8_gemma").unwrap_err().to_string().contains("add_rmsnorm_gemma_fp8"));
        let c = call(DType::BF16, 2, 1024);
        let gemma = FusedPattern { gemma: true, ..FusedPattern::ADD_RMSNORM };
        assert_ne!(abi::fused_desc_code(Algorithm::OneshotPush, c.dtype, c.pattern.flags()), abi::fused_desc_code(Algorithm::OneshotPush, c.dtype, gemma.flags()));
        assert_eq!(FusedCall { pattern: FusedPattern { fp8: true, ..FusedPattern::ADD_RMSNORM }, ..c }.out_bytes(), 2048);
        assert_eq!(FusedPattern::parse("rmsnorm_gemma_nvfp4").unwrap(), FusedPattern { residual: false, gemma: true, fp8: false, nvfp4: true });
    }
}
