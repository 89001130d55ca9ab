//! The fused all-reduce + residual add + RMSNorm (docs/cuda.md "Fused all-reduce + residual
//! add + RMSNorm"): its exact outputs, its fixed-order sum of squares, an f64 check.

use super::{all_inputs, expected, input_seed, round_to, unit_roundoff, SplitMix};
use crate::dtype::Element;


/// The fixed-order sum of `xs`: a perfect binary tree over `xs` padded with +0.0 to a power of
/// two, every node the f32 sum of its left and right child (what the kernels compute, in
/// vectors, warps and tiles: norm.cuh). Empty: +0.0.
pub fn tree_sum(xs: &[f32]) -> f32 {
    let mut level: Vec<f32> = xs.to_vec();
    level.resize(xs.len().max(1).next_power_of_two(), 0.0);
    while level.len() > 1 {
        level = level.chunks_exact(2).map(|p| p[0] + p[1]).collect();
    }
    level[0]
}

/// 1 / sqrt(ss / hidden + eps), each operation in f32 rounded once (as the kernels' inv_rms).
pub fn inv_rms(ss: f32, hidden: usize, eps: f32) -> f32 {
    1.0 / (ss / hidden as f32 + eps).sqrt()
}

/// tpar's add-RMSNorm of rows of `hidden` elements, bit for bit (the standalone kernel, and
/// the fused call's epilogue with `x` the all-reduce's output): residual_out = round(x +
/// residual) in f32; per row, ss = [`tree_sum`] of residual_out's squares (f32), inv =
/// [`inv_rms`]; norm_out = round((residual_out * inv) * weight). Returns (norm_out,
/// residual_out).
pub fn add_rmsnorm<T: Element>(x: &[T], residual: &[T], weight: &[T], hidden: usize, eps: f32) -> (Vec<T>, Vec<T>) {
    let res_out: Vec<T> = x.iter().zip(residual).map(|(a, b)| round_to::<T>(a.to_f32() + b.to_f32())).collect();
    let mut norm = Vec::with_capacity(x.len());
    for row in res_out.chunks(hidden.max(1)) {
        let sq: Vec<f32> = row.iter().map(|r| r.to_f32() * r.to_f32()).collect();
        let inv = inv_rms(tree_sum(&sq), hidden, eps);
        norm.extend(row.iter().zip(weight).map(|(r, w)| round_to::<T>((r.to_f32() * inv) * w.to_f32())));
    }
    (norm, res_out)
}

/// The fused call's exact outputs for every rank (all equal): [`add_rmsnorm`] of the
/// all-reduce's exact output ([`expected`]: rank order, f32, rounded once).
pub fn expected_add_rmsnorm<T: Element>(inputs: &[Vec<T>], residual: &[T], weight: &[T], hidden: usize, eps: f32) -> (Vec<T>, Vec<T>) {
    add_rmsnorm(&expected(inputs), residual, weight, hidden, eps)
}

/// Which member of the fused all-reduce + RMSNorm family a call is (docs/cuda.md "Fused
/// all-reduce + RMSNorm family"): with or without the residual add, the Gemma weight offset
/// (`out = norm(x) * (1 + w)`, the offset added to the weight in f32 as vLLM's and SGLang's
/// GemmaRMSNorm do), and an FP8 e4m3 output quantized with a static per-tensor scale.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormPattern {
    /// The residual add before the norm (its updated residual is an output).
    pub residual: bool,
    /// The Gemma weight offset: the norm multiplies by `f32(w) + 1.0` (rounded once in f32).
    pub gemma: bool,
    /// The FP8 e4m3fn output's static per-tensor scale (vLLM's `static_scaled_fp8_quant`).
    pub fp8_scale: Option<f32>,
    /// The NVFP4 output's global scale (vLLM's `scaled_fp4_quant`, [`super::quant_nvfp4`]);
    /// never with `fp8_scale`.
    pub nvfp4_scale: Option<f32>,
}

impl NormPattern {
    /// Every pattern of the family: {residual, none} x {plain, gemma} x {dtype, fp8, nvfp4}.
    pub fn all(fp8_scale: f32, nvfp4_scale: f32) -> Vec<NormPattern> {
        let mut v = Vec::new();
        for (fp8, nvfp4) in [(None, None), (Some(fp8_scale), None), (None, Some(nvfp4_scale))] {
            for gemma in [false, true] {
                for residual in [true, false] {
                    v.push(NormPattern { residual, gemma, fp8_scale: fp8, nvfp4_scale: nvfp4 });
                }
            }
        }
        v
    }

    /// A short name: `[add_]rmsnorm[_gemma][_fp8|_nvfp4]` (the CLI's column and `--pattern` value).
    pub fn name(&self) -> String {
        let quant = if self.nvfp4_scale.is_some() { "nvfp4" } else if self.fp8_scale.is_some() { "fp8" } else { "" };
        crate::kinds::norm_pattern_name(self.residual, self.gemma, quant)
    }
}

/// The largest finite float8 e4m3fn value.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// `x` rounded to float8 e4m3fn (OCP: 4 exponent bits, bias 7, 3 mantissa bits, no
/// infinities, 0x7f/0xff NaN), round to nearest even, as the bits: what CUDA's
/// `__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)` and c10's Float8_e4m3fn conversion give.
/// Magnitudes from 464 (halfway past 448) on, and NaN, give NaN; the quantizer clamps first.
pub fn fp8_e4m3_bits(x: f32) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs() as f64;
    if x.is_nan() || a >= 464.0 {
        return sign | 0x7f;
    }
    // Exact in f64: every quotient below is a power-of-two scaling.
    let min_normal = 2f64.powi(-6);
    if a < min_normal {
        let q = round_half_even(a / 2f64.powi(-9)); // 0..=8; 8 is the smallest normal, 0x08
        return sign | q as u8;
    }
    let mut e = a.log2().floor() as i32;
    if 2f64.powi(e) > a {
        e -= 1; // log2's rounding near powers of two
    } else if 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let mut q = round_half_even((a / 2f64.powi(e) - 1.0) * 8.0);
    if q == 8.0 {
        e += 1;
        q = 0.0;
    }
    sign | (((e + 7) as u8) << 3) | q as u8
}

/// The value of float8 e4m3fn bits (NaN for 0x7f and 0xff).
pub fn fp8_e4m3_value(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xf, b & 7);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f64 * 2f64.powi(-9)
    } else {
        (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
    };
    (sign * v) as f32
}

fn round_half_even(v: f64) -> f64 {
    let f = v.floor();
    let d = v - f;
    if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else {
        f
    }
}

/// vLLM's `static_scaled_fp8_quant` of one value, bit for bit: `inv = 1.0f / scale` (f32),
/// `y = x * inv` (f32), clamped with fminf/fmaxf to +-448 (so NaN becomes +448, as fminf
/// returns its other operand), rounded to e4m3fn ([`fp8_e4m3_bits`]).
pub fn quant_fp8_static(x: f32, scale: f32) -> u8 {
    let inv = 1.0f32 / scale;
    let y = x * inv;
    let y = if y.is_nan() { FP8_E4M3_MAX } else { y.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX) };
    fp8_e4m3_bits(y)
}

/// The outputs of one call of the family.
#[derive(Clone, Debug, PartialEq)]
pub struct NormOutputs<T> {
    /// The normalised output in the dtype (the FP8 output's input where it is quantized).
    pub out: Vec<T>,
    /// The FP8 e4m3fn bits of `out` quantized (`fp8_scale` patterns).
    pub fp8: Option<Vec<u8>>,
    /// `out` quantized to NVFP4 (`nvfp4_scale` patterns): codes and swizzled block scales.
    pub nvfp4: Option<super::Nvfp4>,
    /// The updated residual (`residual` patterns).
    pub residual_out: Option<Vec<T>>,
}

/// tpar's RMSNorm family on `x` (the all-reduce's output), bit for bit: with a residual,
/// r = round(x + residual) in f32 (else r = x); per row, ss = [`tree_sum`] of r's squares,
/// inv = [`inv_rms`]; out = round((r * inv) * g) with g = w, or f32(w) + 1.0 for Gemma; with
/// a scale, fp8 = [`quant_fp8_static`] of out (the engines quantize the norm's dtype
/// output); with an NVFP4 global scale, nvfp4 = [`super::quant_nvfp4`] of out. Errors where
/// a residual's presence does not match the pattern, where both scales are given, and where
/// NVFP4 rows are not whole 16-element blocks.
pub fn rmsnorm_pattern<T: Element>(
    x: &[T],
    residual: Option<&[T]>,
    weight: &[T],
    hidden: usize,
    eps: f32,
    p: &NormPattern,
) -> crate::error::Result<NormOutputs<T>> {
    if residual.is_some() != p.residual {
        return Err(crate::error::Error::InvalidArgument {
            field: "residual",
            reason: format!(
                "pattern {} {} a residual",
                p.name(),
                if p.residual { "needs" } else { "takes no" }
            ),
        });
    }
    if hidden == 0
        || x.len() % hidden != 0
        || weight.len() != hidden
        || residual.is_some_and(|r| r.len() != x.len())
    {
        return Err(crate::error::Error::InvalidArgument {
            field: "hidden",
            reason: format!(
                "rmsnorm {}: x of {} elements, weight of {}, residual of {:?}, hidden {hidden}: rows must be whole, the weight one row",
                p.name(),
                x.len(),
                weight.len(),
                residual.map(|r| r.len())
            ),
        });
    }
    if p.fp8_scale.is_some() && p.nvfp4_scale.is_some() {
        return Err(crate::error::Error::invalid("pattern", format!("pattern {}: FP8 and NVFP4 outputs exclude each other", p.name())));
    }
    let r: Vec<T> = match residual {
        Some(res) => x
            .iter()
            .zip(res)
            .map(|(a, b)| round_to::<T>(a.to_f32() + b.to_f32()))
            .collect(),
        None => x.to_vec(),
    };
    let g: Vec<f32> = weight
        .iter()
        .map(|w| {
            if p.gemma {
                w.to_f32() + 1.0
            } else {
                w.to_f32()
            }
        })
        .collect();
    let mut out = Vec::with_capacity(x.len());
    for row in r.chunks(hidden) {
        let sq: Vec<f32> = row.iter().map(|v| v.to_f32() * v.to_f32()).collect();
        let inv = inv_rms(tree_sum(&sq), hidden, eps);
        out.extend(
            row.iter()
                .zip(&g)
                .map(|(v, w)| round_to::<T>((v.to_f32() * inv) * w)),
        );
    }
    let fp8 = p.fp8_scale.map(|s| {
        out.iter()
            .map(|v| quant_fp8_static(v.to_f32(), s))
            .collect()
    });
    let nvfp4 = match p.nvfp4_scale {
        Some(gs) => Some(super::quant_nvfp4(&out.iter().map(|v| v.to_f32()).collect::<Vec<f32>>(), hidden, gs)?),
        None => None,
    };
    Ok(NormOutputs {
        out,
        fp8,
        nvfp4,
        residual_out: p.residual.then_some(r),
    })
}

/// The family's exact outputs for every rank (all equal): [`rmsnorm_pattern`] of the
/// all-reduce's exact output ([`expected`]).
pub fn expected_rmsnorm<T: Element>(
    inputs: &[Vec<T>],
    residual: Option<&[T]>,
    weight: &[T],
    hidden: usize,
    eps: f32,
    p: &NormPattern,
) -> crate::error::Result<NormOutputs<T>> {
    rmsnorm_pattern(&expected(inputs), residual, weight, hidden, eps, p)
}

/// One fused call's inputs: every rank's x, and the residual and weight (the same on every
/// rank, as under tensor parallelism), rows of `hidden` elements, never zero.
#[derive(Clone, Debug)]
pub struct FusedInputs<T> {
    pub xs: Vec<Vec<T>>,
    pub residual: Vec<T>,
    pub weight: Vec<T>,
}

/// Reproducible inputs of a fused call: x as [`all_inputs`], the residual in [-2, 2) and the
/// weight in [0.5, 1.5) (an RMSNorm weight near one), never zero.
pub fn fused_inputs<T: Element>(seed: u64, call: u64, world: usize, rows: usize, hidden: usize) -> FusedInputs<T> {
    let n = rows * hidden;
    let mut g = SplitMix::new(input_seed(seed ^ 0x7265_7369_6475_616c, call, world));
    let mut nonzero = |scale: f32, offset: f32| {
        let v = g.next_signed() * scale + offset;
        T::from_f32(if v == 0.0 { 0.25 } else { v })
    };
    let residual = (0..n).map(|_| nonzero(2.0, 0.0)).collect();
    let weight = (0..hidden).map(|_| nonzero(0.5, 1.0)).collect();
    FusedInputs { xs: all_inputs(seed, call, world, n), residual, weight }
}

/// The spacing of `T`'s subnormals: the absolute error a rounding into them can make.
fn subnormal_step<T: Element>() -> f64 {
    match T::DTYPE {
        crate::dtype::DType::F32 => 2f64.powi(-149),
        crate::dtype::DType::F16 => 2f64.powi(-24),
        crate::dtype::DType::BF16 => 2f64.powi(-133),
    }
}

/// Elements of a fused call's outputs farther from f64 than rounding can explain, as
/// (residual_out, norm_out) counts. residual_out against the f64 sum of every x and the
/// residual: the all-reduce's rounding and f32 accumulation, plus one rounding of the add,
/// `u (|s| + |h|) + world 2^-23 sum|x|`. norm_out against the f64 RMSNorm of the
/// residual_out it was given (so each output is judged on its own): the f32 operations
/// err by at most (log2 of the row + 6) 2^-24 relative, the rounding by u, so
/// `(u + 24 * 2^-24) |n| + one subnormal step` (for rows up to 2^12 elements 2x margin).
pub fn count_wrong_add_rmsnorm<T: Element>(norm_out: &[T], residual_out: &[T], f: &FusedInputs<T>, hidden: usize, eps: f32) -> (usize, usize) {
    let u = unit_roundoff::<T>();
    let world = f.xs.len() as f64;
    let tiny = subnormal_step::<T>();
    let bad_res = residual_out
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            let (mut s, mut mag) = (0f64, 0f64);
            for x in &f.xs {
                let v = x[*i].to_f32() as f64;
                s += v;
                mag += v.abs();
            }
            let h = s + f.residual[*i].to_f32() as f64;
            let tol = u * (s.abs() + h.abs()) * 1.001 + world * 2f64.powi(-23) * mag + tiny;
            !((r.to_f32() as f64) - h).abs().le(&tol)
        })
        .count();
    let mut bad_norm = 0;
    for (row, (n_row, r_row)) in norm_out.chunks(hidden.max(1)).zip(residual_out.chunks(hidden.max(1))).enumerate() {
        let _ = row;
        let ms: f64 = r_row.iter().map(|r| (r.to_f32() as f64).powi(2)).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((n, r), w) in n_row.iter().zip(r_row).zip(&f.weight) {
            let want = r.to_f32() as f64 * inv * w.to_f32() as f64;
            let tol = (u + 24.0 * 2f64.powi(-24)) * want.abs() + tiny;
            if !((n.to_f32() as f64) - want).abs().le(&tol) {
                bad_norm += 1;
            }
        }
    }
    (bad_res, bad_norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// `x` scaled by 2^k (exact: a power of two, far from under- or overflow here).
    fn scaled<T: Element>(v: &[T], k: i32) -> Vec<T> {
        v.iter().map(|x| T::from_f32(x.to_f32() * 2f32.powi(k))).collect()
    }

    /// Inputs of a few units (the other tests' range) make the row's mean square ~10, where an
    /// eps of 1e-6 moves no output: a reference that drops eps, or takes another, passes
    /// there. Scaled by 2^-12 the mean square is ~7e-7 (4 ranks) to ~4e-6 (8), so eps decides a large part of
    /// 1/rms: the reference with the right eps passes the f64 check, and one without eps or
    /// with a tenfold eps fails it (and so would a check that ignored eps).
    fn eps_decides<T: Element>(world: usize, rows: usize, hidden: usize) {
        let eps = 1e-6f32;
        let f: FusedInputs<T> = fused_inputs(11, 4, world, rows, hidden);
        let f = FusedInputs { xs: f.xs.iter().map(|x| scaled(x, -12)).collect(), residual: scaled(&f.residual, -12), weight: f.weight };
        let (n, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, hidden, eps);
        let ms = r.iter().map(|v| (v.to_f32() as f64).powi(2)).sum::<f64>() / r.len() as f64;
        assert!(ms < 8.0 * eps as f64 && ms > eps as f64 / 8.0, "{}: mean square {ms:e} must be near eps {eps:e}", T::DTYPE);
        assert_eq!(count_wrong_add_rmsnorm(&n, &r, &f, hidden, eps), (0, 0), "{}: the reference with the right eps", T::DTYPE);
        for (wrong, what) in [(0.0f32, "without eps"), (eps * 10.0, "with a tenfold eps"), (eps / 10.0, "with a tenth of eps")] {
            let (n2, r2) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, hidden, wrong);
            assert!(r2.iter().zip(&r).all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits()), "eps does not touch residual_out");
            let bad = count_wrong_add_rmsnorm(&n2, &r2, &f, hidden, eps).1;
            assert!(bad > n.len() / 2, "{}: a reference {what} passes the check ({bad} of {} wrong)", T::DTYPE, n.len());
        }
        // And inv_rms itself: with ss / hidden ~ eps, eps changes it by far more than rounding.
        let ss = eps * hidden as f32;
        assert!((inv_rms(ss, hidden, eps) * (2.0 * eps).sqrt() - 1.0).abs() < 1e-6, "1/sqrt(ss/hidden + eps)");
    }

    #[test]
    fn eps_decides_the_norm_of_small_rows() {
        eps_decides::<f32>(4, 3, 1024);
        eps_decides::<bf16>(4, 3, 1024);
        eps_decides::<bf16>(8, 2, 7168);
    }

    /// The nearest e4m3fn code to `x` by brute force over every finite code (ties to the
    /// code with an even mantissa), independent of `fp8_e4m3_bits`'s arithmetic.
    fn nearest_fp8(x: f32) -> u8 {
        let mut best: Option<(f64, u8)> = None;
        for b in 0u8..=255 {
            let v = fp8_e4m3_value(b);
            if v.is_nan() || (v == 0.0 && (b & 0x80 != 0) != x.is_sign_negative()) {
                continue;
            }
            let d = (v as f64 - x as f64).abs();
            best = match best {
                Some((bd, bb)) if bd < d || (bd == d && bb & 1 == 0) => Some((bd, bb)),
                _ => Some((d, b)),
            };
        }
        best.map_or(0x7f, |(_, b)| b)
    }

    #[test]
    fn fp8_rounding_matches_the_nearest_code_ties_to_even() {
        let mut g = SplitMix::new(5);
        let mut xs: Vec<f32> = (0..20000)
            .map(|i| g.next_signed() * 2f32.powi((i % 22) - 12) * 448.0 / 2f32.powi(9))
            .collect();
        for b in 0u8..=0x7e {
            let v = fp8_e4m3_value(b);
            let next = fp8_e4m3_value(b + 1);
            xs.push(v);
            if b < 0x7e {
                xs.push(((v as f64 + next as f64) / 2.0) as f32); // exact halfway points: ties to even
                let mid = ((v as f64 + next as f64) / 2.0) as f32;
                xs.push(f32::from_bits(mid.to_bits() + 1));
            }
        }
        xs.extend([
            448.0,
            463.9,
            -448.0,
            2f32.powi(-10),
            2f32.powi(-10) * 1.0001,
            1e-30,
            -0.0,
        ]);
        for x in xs.iter().copied().filter(|x| x.abs() < 464.0) {
            for x in [x, -x] {
                assert_eq!(fp8_e4m3_bits(x), nearest_fp8(x), "{x:e}");
            }
        }
        assert_eq!(
            fp8_e4m3_bits(464.0),
            0x7f,
            "past the largest finite value: NaN without saturation"
        );
        assert_eq!(fp8_e4m3_bits(f32::NAN), 0x7f);
        assert_eq!(fp8_e4m3_value(0x7e), 448.0);
        assert_eq!(fp8_e4m3_value(0x01), 2f32.powi(-9));
    }

    #[test]
    fn fp8_static_quant_saturates_and_uses_the_rounded_reciprocal() {
        assert_eq!(quant_fp8_static(1000.0, 1.0), 0x7e, "saturates to +448");
        assert_eq!(quant_fp8_static(-1e30, 0.5), 0xfe, "saturates to -448");
        assert_eq!(
            quant_fp8_static(f32::NAN, 1.0),
            0x7e,
            "fminf turns NaN into +448"
        );
        assert_eq!(quant_fp8_static(3.0, 2.0), fp8_e4m3_bits(1.5));
        // x * round(1/scale) differs from x / scale where the reciprocal rounds: find such
        // an x and check the reference takes the product (vLLM's kernel's), not the quotient.
        let mut differ = 0;
        let mut g = SplitMix::new(8);
        for _ in 0..64 {
            let scale = (g.next_signed() + 1.5) * 0.01;
            for b in 0u8..0x7d {
                let mid = (fp8_e4m3_value(b) + fp8_e4m3_value(b + 1)) / 2.0;
                for x in [
                    mid * scale,
                    f32::from_bits((mid * scale).to_bits() + 1),
                    f32::from_bits((mid * scale).to_bits() - 1),
                ] {
                    let (prod, quot) = (fp8_e4m3_bits(x * (1.0 / scale)), fp8_e4m3_bits(x / scale));
                    if prod != quot {
                        differ += 1;
                        assert_eq!(quant_fp8_static(x, scale), prod, "{x:e} / {scale:e}");
                    }
                }
            }
        }
        assert!(
            differ > 0,
            "no input where the product and the quotient round apart: the test proves nothing"
        );
    }

    /// An independent f64 judge of one pattern's outputs: out against the f64 RMSNorm of the
    /// r it was given (Gemma: the weight plus one), fp8 against the f64 quotient of out by
    /// the scale, clamped, to within half a code step (ties either way).
    fn judge<T: Element>(
        o: &NormOutputs<T>,
        x: &[T],
        res: Option<&[T]>,
        w: &[T],
        hidden: usize,
        eps: f32,
        p: &NormPattern,
    ) -> usize {
        let u = unit_roundoff::<T>();
        let tiny = subnormal_step::<T>();
        let r: Vec<f64> = match (&o.residual_out, res) {
            (Some(ro), Some(rs)) => {
                for ((a, b), c) in x.iter().zip(rs).zip(ro) {
                    let h = a.to_f32() as f64 + b.to_f32() as f64;
                    assert!(
                        ((c.to_f32() as f64) - h).abs() <= u * h.abs() + tiny,
                        "residual_out"
                    );
                }
                ro.iter().map(|v| v.to_f32() as f64).collect()
            }
            _ => x.iter().map(|v| v.to_f32() as f64).collect(),
        };
        let mut bad = 0;
        for (row, out_row) in r.chunks(hidden).zip(o.out.chunks(hidden)) {
            let inv =
                1.0 / (row.iter().map(|v| v * v).sum::<f64>() / hidden as f64 + eps as f64).sqrt();
            for ((v, n), w) in row.iter().zip(out_row).zip(w) {
                let g = w.to_f32() as f64 + if p.gemma { 1.0 } else { 0.0 };
                let want = v * inv * g;
                if ((n.to_f32() as f64) - want).abs()
                    > (u + 24.0 * 2f64.powi(-24)) * want.abs() + tiny
                {
                    bad += 1;
                }
            }
        }
        if let (Some(q), Some(s)) = (&o.fp8, p.fp8_scale) {
            for (b, n) in q.iter().zip(&o.out) {
                let want = (n.to_f32() as f64 / s as f64).clamp(-448.0, 448.0);
                let got = fp8_e4m3_value(*b) as f64;
                let step = if want.abs() < 2f64.powi(-6) {
                    2f64.powi(-9)
                } else {
                    2f64.powi(want.abs().log2().floor() as i32 - 3)
                };
                if !(got - want).abs().le(&(step / 2.0 * (1.0 + 1e-6))) {
                    bad += 1;
                }
            }
        }
        if let (Some(q), Some(gs)) = (&o.nvfp4, p.nvfp4_scale) {
            // Dequantized: within half a code step of out at the block's scale, plus the
            // scale's own e4m3 rounding (2^-4 relative) where the block's largest saturate.
            for (e, n) in o.out.iter().enumerate() {
                let (row, col) = (e / hidden, e % hidden);
                let sf = fp8_e4m3_value(q.scales[super::super::nvfp4_scale_offset(row, col / 16, hidden)]) as f64 / gs as f64;
                let got = super::super::e2m1_value(q.packed[e / 2] >> (4 * (e % 2))) as f64 * sf;
                let want = (n.to_f32() as f64).clamp(-6.0 * sf, 6.0 * sf); // a block scale clamped to 448 saturates its largest
                let r = if sf > 0.0 { (want / sf).abs() } else { 0.0 };
                let step = if r < 2.0 { 0.5 } else if r < 4.0 { 1.0 } else { 2.0 };
                if !(got - want).abs().le(&(step / 2.0 * sf * (1.0 + 1e-6) + want.abs() / 16.0 + 1e-30)) {
                    bad += 1;
                }
            }
        }
        bad
    }

    fn family_matches_f64<T: Element>(world: usize, rows: usize, hidden: usize, shift: i32) {
        let eps = 1e-6f32;
        let f: FusedInputs<T> = fused_inputs(21, 3, world, rows, hidden);
        let f = FusedInputs {
            xs: f.xs.iter().map(|x| scaled(x, shift)).collect(),
            residual: scaled(&f.residual, shift),
            weight: f.weight,
        };
        let x = expected(&f.xs);
        for p in NormPattern::all(0.004, 448.0 * 6.0 / 4.0) {
            let res = p.residual.then_some(f.residual.as_slice());
            let o = expected_rmsnorm(&f.xs, res, &f.weight, hidden, eps, &p).expect("valid shapes");
            assert_eq!(
                judge(&o, &x, res, &f.weight, hidden, eps, &p),
                0,
                "{} {} {world}x{rows}x{hidden}",
                p.name(),
                T::DTYPE
            );
            if p.residual && !p.gemma {
                let (n, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, hidden, eps);
                let bits = |v: &[T]| v.iter().map(|e| e.to_f32().to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&o.out),
                    bits(&n),
                    "the plain fused call is the residual pattern"
                );
                assert_eq!(o.residual_out.as_deref().map(bits), Some(bits(&r)));
            }
            if let Some(q) = &o.fp8 {
                assert!(
                    q.iter().any(|b| b & 0x7f == 0x7e),
                    "{}: no saturated output: the scale tests no clamp",
                    p.name()
                );
            }
            // A wrong Gemma offset, or a dropped eps, fails the judge.
            let flipped = NormPattern {
                gemma: !p.gemma,
                ..p
            };
            let o2 = expected_rmsnorm(&f.xs, res, &f.weight, hidden, eps, &flipped)
                .expect("valid shapes");
            assert!(
                judge(&o2, &x, res, &f.weight, hidden, eps, &p) > o.out.len() / 2,
                "{}: a flipped Gemma offset passes",
                p.name()
            );
            if shift < 0 {
                let o3 =
                    expected_rmsnorm(&f.xs, res, &f.weight, hidden, 0.0, &p).expect("valid shapes");
                assert!(
                    judge(&o3, &x, res, &f.weight, hidden, eps, &p) > o.out.len() / 2,
                    "{}: a reference without eps passes",
                    p.name()
                );
            }
        }
    }

    #[test]
    fn the_family_matches_an_independent_f64_computation() {
        family_matches_f64::<bf16>(8, 3, 4096, 0);
        family_matches_f64::<bf16>(4, 3, 1024, -12); // the mean square near eps: eps decides
        family_matches_f64::<half::f16>(4, 2, 5120, 0);
        family_matches_f64::<f32>(2, 2, 1024, 0);
    }

    #[test]
    fn the_family_rejects_bad_shapes() {
        let f: FusedInputs<bf16> = fused_inputs(1, 1, 2, 2, 64);
        let p = NormPattern {
            residual: true,
            ..Default::default()
        };
        assert!(
            expected_rmsnorm(&f.xs, None, &f.weight, 64, 1e-6, &p).is_err(),
            "a residual pattern without a residual"
        );
        let q = NormPattern::default();
        assert!(
            expected_rmsnorm(&f.xs, Some(&f.residual), &f.weight, 64, 1e-6, &q).is_err(),
            "a residual the pattern does not take"
        );
        assert!(
            expected_rmsnorm(&f.xs, None, &f.weight, 48, 1e-6, &q).is_err(),
            "rows not whole"
        );
        assert!(
            expected_rmsnorm(&f.xs, None, &f.weight[..32], 64, 1e-6, &q).is_err(),
            "a short weight"
        );
    }
}
