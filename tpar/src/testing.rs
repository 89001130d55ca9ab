//! Correctness tools shared by the tests, `tpar check` and `tpar bench -c 1`: reproducible
//! random inputs that every rank can regenerate for every other rank, the exact expected
//! output (f32 accumulation in rank order, as every algorithm computes it), an f64
//! reference with a tolerance, output poisoning, and a digest to compare ranks bitwise.
//!
//! Owns: nothing shared; pure functions. Must never produce all-zero inputs.

use crate::dtype::{pack_acc, unpack_into, Element};

mod fused;
pub use fused::{
    add_rmsnorm, count_wrong_add_rmsnorm, expected_add_rmsnorm, expected_rmsnorm, fp8_e4m3_bits, fp8_e4m3_value, fused_inputs, inv_rms, quant_fp8_static,
    rmsnorm_pattern, tree_sum, FusedInputs, NormOutputs, NormPattern, FP8_E4M3_MAX,
};
mod nvfp4;
pub use nvfp4::{e2m1_bits, e2m1_value, nvfp4_scale_bytes, nvfp4_scale_offset, quant_nvfp4, quant_nvfp4_block, Nvfp4, E2M1_MAX, NVFP4_BLOCK};

/// Written into outputs before each checked or screened call: a NaN in every lane width
/// (f32, f16, bf16) that no algorithm writes and that is not the workspace's empty sentinel.
pub const POISON_WORD: u32 = 0x7fa5_7fa5;
/// Written into inputs before timed calls: finite and non-zero in every lane width.
pub const TIMING_WORD: u32 = 0x3c00_3c00;

/// splitmix64: fast, good enough for test data, reproducible everywhere.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// Seed of rank `rank`'s input for call `call` of a run seeded `seed`.
pub fn input_seed(seed: u64, call: u64, rank: usize) -> u64 {
    seed ^ call.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Fills `buf` with values in [-1, 1) scaled by (rank + 1), so ranks differ and sums
/// exercise rounding. Never all zeros.
pub fn fill_input<T: Element>(seed: u64, call: u64, rank: usize, buf: &mut [T]) {
    let mut g = SplitMix::new(input_seed(seed, call, rank));
    let scale = (rank + 1) as f32;
    for x in buf.iter_mut() {
        let mut v = g.next_signed() * scale;
        if v == 0.0 {
            v = 0.5;
        }
        *x = T::from_f32(v);
    }
}

/// Every rank's input for one call.
pub fn all_inputs<T: Element>(seed: u64, call: u64, world: usize, count: usize) -> Vec<Vec<T>> {
    (0..world)
        .map(|r| {
            let mut v = vec![T::from_f32(0.0); count];
            fill_input(seed, call, r, &mut v);
            v
        })
        .collect()
}

/// The exact output every algorithm must produce: f32 accumulation in rank order, rounded
/// once to `T` (with the writer's NaN canonicalisation).
pub fn expected<T: Element>(inputs: &[Vec<T>]) -> Vec<T> {
    let n = inputs.first().map_or(0, |v| v.len());
    let mut out = vec![T::from_f32(0.0); n];
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = [-0.0f32; 4]; // -0.0 is the additive identity: -0.0 + x == x
        for inp in inputs {
            acc[0] += inp[i].to_f32();
        }
        let mut one = [T::from_f32(0.0)];
        unpack_into(pack_acc::<T>(&acc), &mut one);
        *o = one[0];
    }
    out
}

/// The exact output of an all-gather of `inputs` (one per rank, equal lengths): every
/// rank's input in rank order, bit for bit. (GPU ranks send a NaN whose bits are all ones —
/// the push protocol's empty mark — as the canonical NaN; random inputs never hold it.)
pub fn expected_all_gather<T: Element>(inputs: &[Vec<T>]) -> Vec<T> {
    inputs.iter().flat_map(|v| v.iter().copied()).collect()
}

/// The exact output of rank `rank`'s reduce-scatter of `inputs` (one per rank, each `world
/// x n` elements): elements `rank * n .. (rank + 1) * n` of [`expected`], the all-reduce's
/// rank-order f32 sum rounded once.
pub fn expected_reduce_scatter<T: Element>(inputs: &[Vec<T>], rank: usize) -> Vec<T> {
    let world = inputs.len().max(1);
    let n = inputs.first().map_or(0, |v| v.len()) / world;
    let slices: Vec<Vec<T>> = inputs.iter().map(|v| v[rank * n..(rank + 1) * n].to_vec()).collect();
    expected(&slices)
}

/// Rounds `x` to `T` as the kernels' writers do (with the NaN canonicalisation).
fn round_to<T: Element>(x: f32) -> T {
    let mut one = [T::from_f32(0.0)];
    unpack_into(pack_acc::<T>(&[x, 0.0, 0.0, 0.0]), &mut one);
    one[0]
}

/// The exact output of `hierarchical` on `islands` (normalised, as
/// `algorithms::hierarchical::normalize` gives them): each island's rank-order f32 sum rounded
/// to `T`, then the island sums in island order in f32, rounded again (one island: the
/// rank-order sum, as [`expected`]).
pub fn expected_islands<T: Element>(inputs: &[Vec<T>], islands: &[Vec<usize>]) -> Vec<T> {
    let n = inputs.first().map_or(0, |v| v.len());
    let round = |x: f32| round_to::<T>(x).to_f32();
    let mut x = vec![0f32; inputs.len()];
    (0..n)
        .map(|i| {
            for (xr, v) in x.iter_mut().zip(inputs) {
                *xr = v[i].to_f32();
            }
            round_to::<T>(crate::algorithms::hierarchical::reduce(&x, islands, round))
        })
        .collect()
}

/// Half an ulp of `T` relative to 1.0.
pub fn unit_roundoff<T: Element>() -> f64 {
    match T::DTYPE {
        crate::dtype::DType::F32 => 2f64.powi(-24),
        crate::dtype::DType::F16 => 2f64.powi(-11),
        crate::dtype::DType::BF16 => 2f64.powi(-8),
    }
}

/// Elements of `out` farther from the f64 sum of `inputs` than rounding can explain:
/// one rounding to `T` (relative to the result) plus f32 accumulation over `world` terms.
pub fn count_wrong<T: Element>(out: &[T], inputs: &[Vec<T>]) -> usize {
    let u = unit_roundoff::<T>();
    count_outside(out, inputs, |s, mag, world| u * s.abs() + world * 2f64.powi(-23) * mag)
}

/// As [`count_wrong`], for `hierarchical`, whose island sums travel in `T`: every island sum
/// is rounded once more, erring by at most `u` times its magnitude, and the island sums'
/// magnitudes add up to at most the sum of magnitudes: `u (|s| + mag)`.
pub fn count_wrong_islands<T: Element>(out: &[T], inputs: &[Vec<T>]) -> usize {
    let u = unit_roundoff::<T>();
    count_outside(out, inputs, |s, mag, world| u * (s.abs() + mag) + world * 2f64.powi(-23) * mag)
}

/// Elements of `out` farther from the f64 sum of `inputs` than `tol(sum, sum of
/// magnitudes, world)` (NaN and infinities always count).
fn count_outside<T: Element>(out: &[T], inputs: &[Vec<T>], tol: impl Fn(f64, f64, f64) -> f64) -> usize {
    let world = inputs.len() as f64;
    out.iter()
        .enumerate()
        .filter(|(i, o)| {
            let (mut s, mut mag) = (0f64, 0f64);
            for inp in inputs {
                let x = inp[*i].to_f32() as f64;
                s += x;
                mag += x.abs();
            }
            let v = o.to_f32() as f64;
            !(v - s).abs().le(&(tol(s, mag, world) + f64::MIN_POSITIVE))
        })
        .count()
}

/// As [`count_wrong`], for implementations that round every partial sum to `T` (NCCL's
/// half and bf16 reductions: a ring of `world` ranks rounds `world - 1` times). Each rounding
/// of a partial sum errs by at most `u` times the partial, and every partial is at most the
/// sum of magnitudes, so the bound is `u (|s| + (world - 1) mag)`.
pub fn count_wrong_stepwise<T: Element>(out: &[T], inputs: &[Vec<T>]) -> usize {
    let u = unit_roundoff::<T>();
    count_outside(out, inputs, |s, mag, world| u * (s.abs() + (world - 1.0) * mag) + world * 2f64.powi(-23) * mag)
}

/// Everything a call's outputs are judged against, computed once from every rank's inputs:
/// the rank-order f32 sum rounded once ([`expected`]) and, per element, the f64 sum and sum
/// of magnitudes the tolerances use. Judging `world` ranks' outputs of one call against one
/// `Reference` gives the same counts as [`count_wrong`] and friends on each, at `1 / world`
/// of the cost (the reference is the O(world x count) part).
#[derive(Clone, Debug)]
pub struct Reference<T> {
    /// The rank-order f32 sum, rounded once to `T`.
    pub exact: Vec<T>,
    sum: Vec<f64>,
    mag: Vec<f64>,
    world: f64,
}

impl<T: Element> Reference<T> {
    pub fn new(inputs: &[Vec<T>]) -> Reference<T> {
        let n = inputs.first().map_or(0, |v| v.len());
        let (mut sum, mut mag) = (vec![0f64; n], vec![0f64; n]);
        for inp in inputs {
            for ((s, m), x) in sum.iter_mut().zip(mag.iter_mut()).zip(inp) {
                let x = x.to_f32() as f64;
                *s += x;
                *m += x.abs();
            }
        }
        Reference { exact: expected(inputs), sum, mag, world: inputs.len() as f64 }
    }

    /// The references of elements `range` only: what rank q's reduce-scatter is held to
    /// (its slice of the all-reduce's), the same bounds at the same world.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Reference<T> {
        Reference {
            exact: self.exact[range.clone()].to_vec(),
            sum: self.sum[range.clone()].to_vec(),
            mag: self.mag[range].to_vec(),
            world: self.world,
        }
    }

    /// A reference that is a copy (`exact`): the all-gather's. Only
    /// [`exact`](Reference::exact) means anything; a copy is judged bit for bit.
    pub fn copy_of(exact: Vec<T>) -> Reference<T> {
        Reference {
            exact,
            sum: Vec::new(),
            mag: Vec::new(),
            world: 1.0,
        }
    }

    fn outside(&self, out: &[T], tol: impl Fn(f64, f64, f64) -> f64) -> usize {
        out.iter()
            .zip(self.sum.iter().zip(&self.mag))
            .filter(|(o, (s, mag))| {
                let v = o.to_f32() as f64;
                !(v - **s).abs().le(&(tol(**s, **mag, self.world) + f64::MIN_POSITIVE))
            })
            .count()
            + out.len().saturating_sub(self.sum.len())
    }

    /// [`count_wrong`] of `out`.
    pub fn count_wrong(&self, out: &[T]) -> usize {
        let u = unit_roundoff::<T>();
        self.outside(out, |s, mag, world| u * s.abs() + world * 2f64.powi(-23) * mag)
    }

    /// [`count_wrong_islands`] of `out`.
    pub fn count_wrong_islands(&self, out: &[T]) -> usize {
        let u = unit_roundoff::<T>();
        self.outside(out, |s, mag, world| u * (s.abs() + mag) + world * 2f64.powi(-23) * mag)
    }

    /// [`count_wrong_stepwise`] of `out`.
    pub fn count_wrong_stepwise(&self, out: &[T]) -> usize {
        let u = unit_roundoff::<T>();
        self.outside(out, |s, mag, world| u * (s.abs() + (world - 1.0) * mag) + world * 2f64.powi(-23) * mag)
    }
}

/// Overwrites `buf` with a NaN pattern no algorithm produces, so stale outputs show.
pub fn poison<T: Element>(buf: &mut [T]) {
    let bits = match T::DTYPE {
        crate::dtype::DType::F32 => 0x7fa5_a5a5,
        crate::dtype::DType::F16 => 0x7da5,
        crate::dtype::DType::BF16 => 0x7fa5,
    };
    for x in buf.iter_mut() {
        *x = T::from_lane(bits);
    }
}

/// Inputs whose sum is exact in every dtype, for `tpar tune`'s bit-exact screening of
/// candidates before they are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// Integers in [-8, 8]: every partial sum over 16 ranks is exact, even in bf16.
    SmallIntegers,
    /// +0.0 and -0.0 mixed across ranks and elements (the sum of all -0.0 is -0.0).
    SignedZeros,
    /// ±(largest finite / world): as large as values can be without the sum overflowing.
    NearMax,
}

impl Special {
    pub const ALL: [Special; 3] = [Special::SmallIntegers, Special::SignedZeros, Special::NearMax];
}

/// Every rank's input of kind `kind`.
pub fn special_inputs<T: Element>(kind: Special, world: usize, count: usize) -> Vec<Vec<T>> {
    let max = match T::DTYPE {
        crate::dtype::DType::F32 => f32::MAX,
        crate::dtype::DType::F16 => 65504.0,
        crate::dtype::DType::BF16 => half::bf16::MAX.to_f32(),
    };
    (0..world)
        .map(|r| {
            (0..count)
                .map(|i| {
                    let v = match kind {
                        Special::SmallIntegers => ((i * 7 + r * 3) % 17) as f32 - 8.0,
                        // Element i is -0.0 on every rank when i % 3 == 0, mixed otherwise.
                        Special::SignedZeros => {
                            if i % 3 == 0 || (i + r) % 2 == 0 {
                                -0.0
                            } else {
                                0.0
                            }
                        }
                        // T's largest finite value divided by world, rounded down into T.
                        Special::NearMax => {
                            let sign = if (i + r) % 2 == 0 { 1.0 } else { -1.0 };
                            let mut v = T::from_f32(max / world as f32).to_f32();
                            if v * world as f32 > max {
                                v = T::from_f32(v * 0.99).to_f32();
                            }
                            sign * v
                        }
                    };
                    T::from_f32(v)
                })
                .collect()
        })
        .collect()
}

/// Whether `out` is bit-for-bit the exact sum of `inputs` (which [`special_inputs`] makes
/// exactly representable): equal to the rank-order f32 sum and to the f64 sum, sign of zero
/// included.
pub fn is_exact<T: Element>(out: &[T], inputs: &[Vec<T>]) -> bool {
    if bit_diffs(out, &expected(inputs)) != 0 {
        return false;
    }
    out.iter().enumerate().all(|(i, o)| {
        let mut s = -0.0f64;
        for inp in inputs {
            s += inp[i].to_f32() as f64;
        }
        let v = o.to_f32() as f64;
        v == s && v.is_sign_negative() == s.is_sign_negative()
    })
}

/// Elements whose bits differ between `a` and `b`.
pub fn bit_diffs<T: Element>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_lane() != y.to_lane()).count() + a.len().abs_diff(b.len())
}

/// FNV-1a over the bits of `buf`, to compare outputs across ranks cheaply.
pub fn digest<T: Element>(buf: &[T]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in buf {
        h ^= x.to_lane();
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ buf.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn a_reference_judges_as_the_functions_do() {
        fn check<T: Element>(world: usize, n: usize) {
            let inputs: Vec<Vec<T>> = all_inputs(7, world as u64, world, n);
            let r = Reference::new(&inputs);
            assert_eq!(bit_diffs(&r.exact, &expected(&inputs)), 0);
            let mut outs = vec![r.exact.clone()];
            let mut off = r.exact.clone();
            for (k, x) in off.iter_mut().enumerate().filter(|(k, _)| k % 5 == 0) {
                *x = T::from_f32(x.to_f32() * (1.0 + 0.01 * (k % 3) as f32) + 0.001);
            }
            outs.push(off);
            let mut nan = r.exact.clone();
            poison(&mut nan[..n / 2]);
            outs.push(nan);
            for out in &outs {
                assert_eq!(r.count_wrong(out), count_wrong(out, &inputs));
                assert_eq!(r.count_wrong_islands(out), count_wrong_islands(out, &inputs));
                assert_eq!(r.count_wrong_stepwise(out), count_wrong_stepwise(out, &inputs));
            }
            assert!(r.count_wrong(&outs[2]) >= n / 2, "poisoned elements count");
        }
        check::<f32>(8, 1000);
        check::<half::f16>(3, 777);
        check::<bf16>(16, 513);
    }

    #[test]
    fn inputs_are_reproducible_and_nonzero() {
        let a: Vec<Vec<bf16>> = all_inputs(1, 2, 3, 100);
        let b: Vec<Vec<bf16>> = all_inputs(1, 2, 3, 100);
        assert_eq!(a, b);
        assert!(a.iter().flatten().all(|x| x.to_f32() != 0.0));
        assert_ne!(a[0], a[1]);
    }

    /// A ring that rounds every partial sum to bf16 (as NCCL does) fails the one-rounding
    /// bound on many elements but passes the stepwise one; a wrong sum fails both.
    #[test]
    fn stepwise_bound_admits_per_step_rounding_only() {
        let ins: Vec<Vec<bf16>> = all_inputs(3, 4, 8, 4096);
        let ring: Vec<bf16> = (0..4096)
            .map(|i| ins.iter().skip(1).fold(ins[0][i], |acc, x| bf16::from_f32(acc.to_f32() + x[i].to_f32())))
            .collect();
        assert!(count_wrong(&ring, &ins) > 100, "per-step rounding exceeds the one-rounding bound");
        assert_eq!(count_wrong_stepwise(&ring, &ins), 0);
        let mut bad = ring.clone();
        // The bound here is at most 2^-8 (36 + 7 x 36) < 1.2: off by 4 is wrong; NaN is wrong.
        bad[7] = bf16::from_f32(bad[7].to_f32() + 4.0);
        bad[9] = bf16::NAN;
        assert_eq!(count_wrong_stepwise(&bad, &ins), 2);
    }

    #[test]
    fn special_inputs_have_exact_sums() {
        for kind in Special::ALL {
            let ins: Vec<Vec<bf16>> = special_inputs(kind, 16, 64);
            let exp = expected(&ins);
            assert!(is_exact(&exp, &ins), "{kind:?}");
            let mut off = exp.clone();
            off[5] = bf16::from_f32(off[5].to_f32() + 1.0);
            assert!(!is_exact(&off, &ins), "{kind:?}: a wrong element must be caught");
        }
        let z: Vec<Vec<f32>> = special_inputs(Special::SignedZeros, 4, 6);
        let e = expected(&z);
        assert!(e[0].is_sign_negative() && e[1].is_sign_positive());
        let m: Vec<Vec<f32>> = special_inputs(Special::NearMax, 4, 2);
        assert!(m[0][0] > 8.0e37 && expected(&m).iter().all(|x| x.is_finite()));
    }

    /// The kernels' decomposition of the sum of squares (norm.cuh): a vector's lanes pairwise,
    /// a warp's 32 vectors by xor shuffles (lane l adds lane l ^ m's value), the row's tiles in
    /// runs of 1, 2 or 4 per lane then shuffles again, a partial last tile's missing vectors
    /// +0.0 — equals the tree over the row, for every hidden size, bit for bit.
    #[test]
    fn the_kernels_decomposition_of_the_sum_of_squares_is_the_tree() {
        fn warp_tree(v: &mut [f32; 32]) {
            let mut m = 1;
            while m < 32 {
                let prev = *v;
                for l in 0..32 {
                    v[l] = prev[l] + prev[l ^ m];
                }
                m <<= 1;
            }
            assert!(v.iter().all(|x| x.to_bits() == v[0].to_bits()), "every lane holds the root");
        }
        let mut g = SplitMix::new(42);
        for lanes in [4usize, 8] {
            for hidden in [8usize, 64, 256, 1000, 1024, 2048, 2880, 4096, 5120, 7168, 8192, 12288, 16384, 32768] {
                if hidden % lanes != 0 || hidden / lanes > 128 * 32 {
                    continue;
                }
                let row: Vec<f32> = (0..hidden).map(|_| g.next_signed() * 3.0).collect();
                let sq: Vec<f32> = row.iter().map(|x| x * x).collect();
                let vrow = hidden / lanes;
                // Leaves: each vector's lanes, pairwise.
                let leaf = |j: usize| {
                    let mut x: Vec<f32> = sq[j * lanes..(j + 1) * lanes].to_vec();
                    let mut s = 1;
                    while s < lanes {
                        for i in (0..lanes).step_by(2 * s) {
                            x[i] += x[i + s];
                        }
                        s *= 2;
                    }
                    x[0]
                };
                let ntiles = vrow.div_ceil(32);
                let tiles: Vec<f32> = (0..ntiles)
                    .map(|t| {
                        let mut v = [0f32; 32];
                        for (l, x) in v.iter_mut().enumerate() {
                            if t * 32 + l < vrow {
                                *x = leaf(t * 32 + l);
                            }
                        }
                        warp_tree(&mut v);
                        v[0]
                    })
                    .collect();
                let k = if ntiles <= 32 { 1 } else if ntiles <= 64 { 2 } else { 4 };
                let mut v = [0f32; 32];
                for (l, x) in v.iter_mut().enumerate() {
                    let e: Vec<f32> = (0..4).map(|u| if u < k && k * l + u < ntiles { tiles[k * l + u] } else { 0.0 }).collect();
                    *x = match k {
                        1 => e[0],
                        2 => e[0] + e[1],
                        _ => (e[0] + e[1]) + (e[2] + e[3]),
                    };
                }
                warp_tree(&mut v);
                assert_eq!(v[0].to_bits(), tree_sum(&sq).to_bits(), "lanes {lanes} hidden {hidden}");
                // And a sequential sum differs somewhere (the order is what is being fixed).
                let _ = sq.iter().sum::<f32>();
            }
        }
        assert_eq!(tree_sum(&[]), 0.0);
        assert_eq!(tree_sum(&[1.0, 2.0, 3.0]).to_bits(), ((1.0f32 + 2.0) + 3.0).to_bits());
    }

    #[test]
    fn the_fused_reference_passes_its_f64_check_and_catches_errors() {
        for (world, rows, hidden) in [(2usize, 1usize, 1024usize), (8, 3, 7168), (4, 5, 256)] {
            let f: FusedInputs<bf16> = fused_inputs(9, 1, world, rows, hidden);
            let (n, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, hidden, 1e-6);
            assert_eq!(count_wrong_add_rmsnorm(&n, &r, &f, hidden, 1e-6), (0, 0), "{world} x {rows} x {hidden}");
            // A wrong residual element is caught (the norm is then judged against it).
            let mut r2 = r.clone();
            r2[hidden / 2] = bf16::from_f32(r2[hidden / 2].to_f32() * 1.05 + 0.5);
            assert_eq!(count_wrong_add_rmsnorm(&n, &r2, &f, hidden, 1e-6).0, 1);
            // Wrong norm elements are caught, NaN included.
            let mut n2 = n.clone();
            n2[hidden - 1] = bf16::from_f32(n2[hidden - 1].to_f32() * 1.05 + 0.1);
            poison(&mut n2[0..1]);
            assert_eq!(count_wrong_add_rmsnorm(&n2, &r, &f, hidden, 1e-6), (0, 2));
        }
        // f32 and f16 too, and the standalone add-RMSNorm is the epilogue of the sum.
        let f: FusedInputs<half::f16> = fused_inputs(3, 2, 4, 2, 4096);
        let (n, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, 4096, 1e-5);
        assert_eq!(count_wrong_add_rmsnorm(&n, &r, &f, 4096, 1e-5), (0, 0));
        assert_eq!((n.clone(), r.clone()), add_rmsnorm(&expected(&f.xs), &f.residual, &f.weight, 4096, 1e-5));
        let f: FusedInputs<f32> = fused_inputs(3, 2, 3, 2, 1024);
        let (n, r) = expected_add_rmsnorm(&f.xs, &f.residual, &f.weight, 1024, 1e-5);
        assert_eq!(count_wrong_add_rmsnorm(&n, &r, &f, 1024, 1e-5), (0, 0));
    }

    #[test]
    fn checker_catches_wrong_outputs() {
        let inputs: Vec<Vec<bf16>> = all_inputs(7, 0, 4, 257);
        let mut out = expected(&inputs);
        assert_eq!(count_wrong(&out, &inputs), 0);
        out[100] = bf16::from_f32(out[100].to_f32() + 0.5);
        poison(&mut out[200..202]);
        assert_eq!(count_wrong(&out, &inputs), 3);
    }
}
