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
}
