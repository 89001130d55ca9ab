//! The lossy wire formats of `ce-ring` (`TPAR_WIRE=fp8|int8`), in pure Rust: the codec the
//! kernels run (`kernels/ce_ring.cu`, bit for bit: the same f32 operations in the same order,
//! no fused multiply-add on either side), the output a whole call must give (so a GPU result
//! is checked bitwise, not only against a tolerance), and the documented error bound.
//!
//! The format: per block of [`QBLOCK`] elements of a chunk (blocks start at the chunk's first
//! element), `amax` = the largest magnitude in the block and `scale` = the smallest power of
//! two with `amax / scale <= QMAX` (448 for FP8 E4M3, 127 for INT8; a power of two, as MXFP8's
//! E8M0 scales: scaling is then exact, with no division on either side, and the GPU and this
//! reference agree bit for bit by construction); each value is sent as `q = encode(x *
//! (1/scale))` (round to nearest even; FP8 saturates at ±448, INT8 clamps to ±127) and
//! received as `decode(q) * scale`. A block whose `amax` is below [`TINY`] travels as zeros;
//! a block holding an infinity travels as NaN; a NaN stays NaN. (f32 blocks whose `amax`
//! exceeds 2^127 may overflow to infinity on the way back.)
//!
//! Error bound (docs/cuda.md, "The copy-engine path"). One quantisation errs by at most
//! `eps x amax` of its block: `eps` = 2^-4 for FP8 E4M3 (3 mantissa bits: half an ulp of
//! the value, and below 2^-6 of the scaled range half a subnormal step, 2^-10 x scale, which
//! is smaller), 1/127 for INT8 (half a step, and a power-of-two step is at most amax/63.5);
//! each plus 2^-20 of slack for values scaled below the f32 range. A result element of rank-order sum `S` passes two
//! quantisations: every rank but the owner quantises its input before the reduce-scatter
//! (`A_s` = rank s's block max), the owner quantises its f32 sum before the all-gather
//! (whose block max is at most `M + q1` with `M` the block's largest sum of magnitudes):
//!
//! ```text
//! q1 = eps * sum_{s != owner} A_s
//! e  = q1 + world * 2^-23 * (mag + q1) + eps * (M + q1) * (1 + world * 2^-23)
//! |out - S| <= e + u * (|S| + e) + world * TINY
//! ```
//!
//! (`mag` = the element's sum of magnitudes, `u` = the dtype's unit roundoff). Every rank
//! holds the same bits: the owner dequantises its own quantised sum, as its peers do.
//!
//! Owns: the reference codec, [`expected`] and [`count_wrong`]. Must never: be used as the
//! check of an exact call (those are bitwise against the rank-order sum).

use super::ce_ring::{Geometry, QBLOCK};
use crate::dtype::{pack_acc, unpack_into, DType, Element};
use crate::kinds::Wire;

/// Blocks whose largest magnitude is below this travel as zeros (a smaller scale would be
/// an f32 subnormal: too few bits to keep the bound).
pub const TINY: f32 = 1.0 / (1u128 << 100) as f32; // 2^-100, exact
/// Largest FP8 E4M3 magnitude (E4M3FN: no infinities).
pub const FP8_MAX: f32 = 448.0;
/// INT8 steps each side of zero (symmetric; -128 marks NaN).
pub const INT8_MAX: f32 = 127.0;
/// The INT8 code of a NaN.
pub const INT8_NAN: u8 = 0x80;
/// The FP8 E4M3 code of a NaN (S.1111.111).
pub const FP8_NAN: u8 = 0x7f;
/// The NaN both sides produce (the GPU's canonical NaN).
fn nan() -> f32 {
    f32::from_bits(0x7fff_ffff)
}

/// Per-quantisation error relative to the block's largest magnitude (see the module doc).
pub fn eps(wire: Wire) -> f64 {
    match wire {
        Wire::Exact => 0.0,
        Wire::Fp8 => 2f64.powi(-4) + 2f64.powi(-20),
        Wire::Int8 => 1.0 / 127.0 + 2f64.powi(-20),
    }
}

/// `x` to FP8 E4M3 (E4M3FN), round to nearest even, saturating at ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if x.is_nan() {
        return sign | FP8_NAN;
    }
    let a = f32::from_bits(bits & 0x7fff_ffff);
    if a < 0.015_625 {
        // Subnormal range, steps of 2^-9: a * 512 is exact (a power of two).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mant = bits & 0x7f_ffff;
    let mut m = mant >> 20;
    let rest = mant & 0xf_ffff;
    if rest > 0x8_0000 || (rest == 0x8_0000 && m & 1 == 1) {
        m += 1;
    }
    if m == 8 {
        m = 0;
        e += 1;
    }
    let code = (((e + 7) as u32) << 3) | m;
    sign | code.min(0x7e) as u8
}

/// FP8 E4M3 to f32 (exact).
pub fn e4m3_to_f32(c: u8) -> f32 {
    let e = i32::from((c >> 3) & 0xf);
    let m = i32::from(c & 7);
    if e == 15 && m == 7 {
        return nan();
    }
    let mag = if e == 0 { m as f32 * pow2(-9) } else { (8 + m) as f32 * pow2(e - 10) };
    if c & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `x` to INT8, round to nearest even, clamped to ±127; NaN to [`INT8_NAN`].
pub fn f32_to_i8(x: f32) -> u8 {
    if x.is_nan() {
        return INT8_NAN;
    }
    x.round_ties_even().clamp(-INT8_MAX, INT8_MAX) as i8 as u8
}

/// INT8 to f32.
pub fn i8_to_f32(c: u8) -> f32 {
    if c == INT8_NAN {
        nan()
    } else {
        f32::from(c as i8)
    }
}

/// The largest magnitude of `xs` (NaNs ignored, as the kernels' comparison ignores them).
pub fn amax(xs: impl IntoIterator<Item = f32>) -> f32 {
    let mut m = 0.0f32;
    for x in xs {
        let a = x.abs();
        if a > m {
            m = a;
        }
    }
    m
}

/// The scale of a block whose largest magnitude is `amax` (the smallest power of two with
/// `amax / scale <= QMAX`, from the bits: FP8 `2^(e - 8)`, doubled when amax's mantissa
/// exceeds 1.75; INT8 `2^(e - 6)`, doubled above 127/64), and its inverse: (0, 0) below
/// [`TINY`], NaN when `amax` is not finite.
pub fn block_scale(amax: f32, wire: Wire) -> (f32, f32) {
    if amax.is_nan() || amax > f32::MAX {
        return (nan(), nan());
    }
    if amax < TINY {
        return (0.0, 0.0);
    }
    let bits = amax.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127;
    let m = bits & 0x7f_ffff;
    let k = if wire == Wire::Int8 { e - 6 + i32::from(m > 0x7e_0000) } else { e - 8 + i32::from(m > 0x60_0000) };
    (pow2(k), pow2(-k))
}

/// One value onto the wire at a block's (`scale`, `inverse`).
pub fn quantise(x: f32, (scale, inv): (f32, f32), wire: Wire) -> u8 {
    if scale == 0.0 {
        return 0;
    }
    let v = x * inv;
    if wire == Wire::Int8 {
        f32_to_i8(v)
    } else {
        f32_to_e4m3(v)
    }
}

/// One value off the wire (exact: a power-of-two scale).
pub fn dequantise(q: u8, scale: f32, wire: Wire) -> f32 {
    let v = if wire == Wire::Int8 { i8_to_f32(q) } else { e4m3_to_f32(q) };
    v * scale
}

/// `xs` through the wire and back, block by block (blocks of [`QBLOCK`] from `xs[0]`).
pub fn round_trip(xs: &[f32], wire: Wire) -> Vec<f32> {
    let mut out = Vec::with_capacity(xs.len());
    for block in xs.chunks(QBLOCK) {
        let scale = block_scale(amax(block.iter().copied()), wire);
        out.extend(block.iter().map(|&x| dequantise(quantise(x, scale, wire), scale.0, wire)));
    }
    out
}

fn round_to<T: Element>(x: f32) -> T {
    let mut one = [T::from_f32(0.0)];
    unpack_into(pack_acc::<T>(&[x, 0.0, 0.0, 0.0]), &mut one);
    one[0]
}

/// The output every rank of a `ce-ring` call on a lossy `wire` must hold, bit for bit: per
/// chunk, every rank's values but the owner's through the wire, the f32 sum in rank order,
/// that sum through the wire, rounded once to `T`.
pub fn expected<T: Element>(inputs: &[Vec<T>], wire: Wire) -> Vec<T> {
    let world = inputs.len();
    let count = inputs.first().map_or(0, Vec::len);
    let g = Geometry::new(count, T::DTYPE, world);
    let mut out = vec![T::from_f32(0.0); count];
    for p in 0..g.pieces {
        for c in 0..world {
            let r = g.chunk_elems(p, c);
            if r.is_empty() {
                continue;
            }
            let mut acc: Vec<f32> = Vec::new();
            for (s, x) in inputs.iter().enumerate() {
                let exact: Vec<f32> = x[r.clone()].iter().map(|v| v.to_f32()).collect();
                let vals = if s == c { exact } else { round_trip(&exact, wire) };
                if s == 0 {
                    acc = vals;
                } else {
                    for (a, v) in acc.iter_mut().zip(vals) {
                        *a += v;
                    }
                }
            }
            for (o, v) in out[r].iter_mut().zip(round_trip(&acc, wire)) {
                *o = round_to::<T>(v);
            }
        }
    }
    out
}

/// Elements of `out` outside the documented bound around the f64 sum of `inputs` (NaN and
/// infinities always count).
pub fn count_wrong<T: Element>(out: &[T], inputs: &[Vec<T>], wire: Wire) -> usize {
    let world = inputs.len();
    let count = out.len();
    let g = Geometry::new(count, T::DTYPE, world);
    let e = eps(wire);
    let u = unit_roundoff::<T>();
    let w23 = world as f64 * 2f64.powi(-23);
    let mut wrong = 0usize;
    for p in 0..g.pieces {
        for c in 0..world {
            let r = g.chunk_elems(p, c);
            for b0 in (r.start..r.end).step_by(QBLOCK) {
                let b1 = (b0 + QBLOCK).min(r.end);
                let a_sum: f64 = (0..world).filter(|&s| s != c).map(|s| f64::from(amax(inputs[s][b0..b1].iter().map(|v| v.to_f32())))).sum();
                let mags: Vec<f64> = (b0..b1).map(|i| inputs.iter().map(|x| f64::from(x[i].to_f32()).abs()).sum()).collect();
                let m_block = mags.iter().copied().fold(0.0, f64::max);
                let q1 = e * a_sum;
                for (k, i) in (b0..b1).enumerate() {
                    let s: f64 = inputs.iter().map(|x| f64::from(x[i].to_f32())).sum();
                    let core = q1 + w23 * (mags[k] + q1) + e * (m_block + q1) * (1.0 + w23);
                    let bound = core + u * (s.abs() + core) + world as f64 * f64::from(TINY);
                    let v = f64::from(out[i].to_f32());
                    let within = (v - s).abs() <= bound;
                    if !within {
                        wrong += 1;
                    }
                }
            }
        }
    }
    wrong
}

/// The unit roundoff of `T` (half an ulp at 1).
fn unit_roundoff<T: Element>() -> f64 {
    match T::DTYPE {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
    }
}

// Tests: tpar/tests/ce_wire.rs (they draw inputs from `testing`, a layer above this one).
