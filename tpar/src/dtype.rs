//! Element types and their bit-level packing into 64-bit words.
//!
//! Owns: the dtype enum, the `Element` trait (f32, f16, bf16), the empty-slot sentinel and
//! canonicalisation. Must never allocate or panic on the hot path.
//!
//! The sentinel is one word for every dtype: [`EMPTY`] = all ones, a NaN in every lane width.
//! docs/architecture.md started from -0.0 (TensorRT-LLM's Lamport buffers), but tpar's buffers serve calls
//! of different dtypes one after another, and -0.0 has a different bit pattern per lane width:
//! a bf16 reader would take a word cleared with f32's -0.0 (0x80000000) as data. All-ones is
//! empty in every width. A writer replaces an all-ones lane by the canonical quiet NaN of its
//! type, so a written word is never [`EMPTY`]; only a NaN's payload can change, and -0.0
//! travels exactly.

use crate::error::{Error, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of an all-reduce. Names follow nccl-tests (`float`, `half`, `bfloat16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    #[serde(rename = "float")]
    F32,
    #[serde(rename = "half")]
    F16,
    #[serde(rename = "bfloat16")]
    BF16,
}

impl DType {
    /// All supported dtypes.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// nccl-tests' name for the type.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
        }
    }

    /// Small integer used in on-the-wire descriptors (never 0).
    pub fn code(self) -> u64 {
        match self {
            DType::F32 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
        }
    }

    /// Inverse of [`DType::code`].
    pub fn from_code(c: u64) -> Option<DType> {
        match c {
            1 => Some(DType::F32),
            2 => Some(DType::F16),
            3 => Some(DType::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "float" | "f32" | "float32" => Ok(DType::F32),
            "half" | "f16" | "float16" | "fp16" => Ok(DType::F16),
            "bfloat16" | "bf16" => Ok(DType::BF16),
            other => Err(Error::invalid(
                "dtype",
                format!("unknown datatype {other:?}; expected float, half or bfloat16"),
            )),
        }
    }
}

/// `$e` with `$T` the element type of the dtype `$d`: where a run-time dtype becomes a type
/// parameter (the tune's ranks).
macro_rules! by_dtype {
    ($d:expr, $T:ident => $e:expr) => {
        match $d {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $e
            }
            $crate::dtype::DType::F16 => {
                type $T = $crate::f16;
                $e
            }
            $crate::dtype::DType::BF16 => {
                type $T = $crate::bf16;
                $e
            }
        }
    };
}
pub(crate) use by_dtype;

/// A reducible element. Accumulation is always in f32, in fixed rank order.
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug {
    const DTYPE: DType;
    /// Elements per 64-bit word.
    const LANES: usize;
    /// The canonical quiet NaN stored in place of an all-ones lane.
    const QNAN: u64;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    fn to_lane(self) -> u64;
    fn from_lane(bits: u64) -> Self;
    /// Lane width in bits.
    const LANE_BITS: u32 = 64 / Self::LANES as u32;
    /// All ones in one lane (a NaN, and the empty pattern).
    const LANE_ONES: u64 = if Self::LANE_BITS == 64 { u64::MAX } else { (1u64 << Self::LANE_BITS) - 1 };
    /// `acc[i] = -0.0 + src[i]` in f32: the first rank of the rank-order reduce (a separate
    /// pass filling `acc` with -0.0 first cost as much as the adds: it did not vectorise).
    #[inline(always)]
    fn set_from(src: &[Self], acc: &mut [f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a = -0.0 + s.to_f32();
        }
    }
    /// `acc[i] += src[i]` in f32, for the rank-order reduce. Written so the compiler
    /// vectorises it (f32: plain adds; bf16: a shift and an add per lane).
    #[inline(always)]
    fn add_into(src: &[Self], acc: &mut [f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a += s.to_f32();
        }
    }
    /// `out[i] = T(acc[i] + src[i])`: the last rank's add fused with the rounding, so the
    /// accumulators are not stored and loaded once more.
    #[inline(always)]
    fn add_narrow(src: &[Self], acc: &mut [f32], out: &mut [Self]) {
        Self::add_into(src, acc);
        Self::narrow_from(acc, out);
    }
    /// `out[i] = T(acc[i])`, rounded once, an all-ones lane stored as [`Element::QNAN`]
    /// (the same result as [`pack_acc`], word for word).
    #[inline(always)]
    fn narrow_from(acc: &[f32], out: &mut [Self]) {
        for (o, a) in out.iter_mut().zip(acc) {
            let bits = Self::from_f32(*a).to_lane();
            *o = Self::from_lane(if bits == Self::LANE_ONES { Self::QNAN } else { bits });
        }
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const LANES: usize = 2;
    const QNAN: u64 = 0x7fc0_0000;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_lane(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_lane(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
    #[inline(always)]
    fn add_into(src: &[Self], acc: &mut [f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a += *s;
        }
    }
    #[inline(always)]
    fn narrow_from(acc: &[f32], out: &mut [Self]) {
        for (o, a) in out.iter_mut().zip(acc) {
            *o = f32_canonical(*a);
        }
    }
    #[inline(always)]
    fn add_narrow(src: &[Self], acc: &mut [f32], out: &mut [Self]) {
        for ((o, a), s) in out.iter_mut().zip(acc.iter()).zip(src) {
            *o = f32_canonical(*a + *s);
        }
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    const LANES: usize = 4;
    const QNAN: u64 = 0x7e00;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn to_lane(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_lane(bits: u64) -> Self {
        f16::from_bits(bits as u16)
    }
    // half's slice conversions use the CPU's F16C instructions where present (detected at
    // run time), eight lanes at a time; its scalar ones, the same rounding, one at a time.
    #[inline(always)]
    fn set_from(src: &[Self], acc: &mut [f32]) {
        let n = src.len().min(acc.len());
        src[..n].convert_to_f32_slice(&mut acc[..n]);
        for a in &mut acc[..n] {
            *a += -0.0;
        }
    }
    #[inline(always)]
    fn add_into(src: &[Self], acc: &mut [f32]) {
        let mut tmp = [0f32; REDUCE_BLOCK];
        for (s, a) in src.chunks(REDUCE_BLOCK).zip(acc.chunks_mut(REDUCE_BLOCK)) {
            let n = s.len().min(a.len());
            s[..n].convert_to_f32_slice(&mut tmp[..n]);
            for (x, t) in a.iter_mut().zip(&tmp[..n]) {
                *x += *t;
            }
        }
    }
    #[inline(always)]
    fn narrow_from(acc: &[f32], out: &mut [Self]) {
        let n = acc.len().min(out.len());
        out[..n].convert_from_f32_slice(&acc[..n]);
        for o in &mut out[..n] {
            if o.to_bits() == 0xffff {
                *o = f16::from_bits(Self::QNAN as u16);
            }
        }
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    const LANES: usize = 4;
    const QNAN: u64 = 0x7fc0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn to_lane(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_lane(bits: u64) -> Self {
        bf16::from_bits(bits as u16)
    }
    #[inline(always)]
    fn set_from(src: &[Self], acc: &mut [f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a = -0.0 + f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn add_into(src: &[Self], acc: &mut [f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a += f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn narrow_from(acc: &[f32], out: &mut [Self]) {
        for (o, a) in out.iter_mut().zip(acc) {
            *o = bf16::from_bits(bf16_bits_rne(*a));
        }
    }
    #[inline(always)]
    fn add_narrow(src: &[Self], acc: &mut [f32], out: &mut [Self]) {
        for ((o, a), s) in out.iter_mut().zip(acc.iter()).zip(src) {
            *o = bf16::from_bits(bf16_bits_rne(*a + f32::from_bits((s.to_bits() as u32) << 16)));
        }
    }
}

/// An all-ones f32 (the empty pattern) becomes the canonical quiet NaN, as [`pack_acc`].
#[inline(always)]
fn f32_canonical(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits(if b == u32::MAX { <f32 as Element>::QNAN as u32 } else { b })
}

/// f32 to bf16 bits, round to nearest even; a NaN keeps its top bits with the quiet bit
/// set, and the all-ones NaN becomes [`bf16`]'s canonical quiet NaN (as [`pack_acc`]).
/// Branch-free, so the reduce loop vectorises; bit-identical to `half::bf16::from_f32` on
/// every input (tested).
#[inline(always)]
fn bf16_bits_rne(v: f32) -> u16 {
    let x = v.to_bits();
    // Arithmetic shifts keep every result in i16's range with the same low 16 bits, which
    // lets SSE2 narrow four lanes at once (psrad + packssdw) instead of one at a time.
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) as i32 >> 16) as i16 as u16;
    let nan = ((x as i32 >> 16) as i16 as u16) | 0x40;
    let nan = if nan == 0xffff { 0x7fc0 } else { nan };
    if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }
}

/// The empty-slot sentinel, the same for every dtype: all ones (NaN in every lane width).
pub const EMPTY: u64 = u64::MAX;

/// Elements per block of the reduce: the f32 accumulators of one block (2 KiB) stay in L1.
const REDUCE_BLOCK: usize = 512;

/// `out[i] = T(((-0.0 + srcs[0][i]) + srcs[1][i]) + ...)`: the sum in f32, in the order of
/// `srcs` (rank order), rounded once into `T`: bitwise what [`pack_acc`] of a word-by-word
/// sum gives, so every algorithm and rank produces the same bits. Blocked so that the
/// accumulators stay in L1 and the inner loops vectorise; on x86-64 CPUs with AVX2 the same
/// loops run compiled for AVX2 (the same IEEE additions in the same order, so the same bits).
#[inline]
pub fn reduce_into<T: Element>(srcs: &[&[T]], out: &mut [T]) {
    if out.len() <= SMALL_REDUCE {
        return reduce_small(srcs, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked on the line above), the only
            // requirement of calling a `target_feature(enable = "avx2")` function.
            return unsafe { reduce_blocks_avx2(srcs, out) };
        }
    }
    reduce_blocks(srcs, out)
}

/// Calls up to this many elements reduce without the block's accumulator array: filling
/// 512 accumulators costs more than the whole sum of a 2-element call.
const SMALL_REDUCE: usize = 64;

#[inline(always)]
fn reduce_small<T: Element>(srcs: &[&[T]], out: &mut [T]) {
    let mut acc = [-0.0f32; SMALL_REDUCE];
    let acc = &mut acc[..out.len()];
    for s in srcs {
        T::add_into(s, acc);
    }
    T::narrow_from(acc, out);
}

/// [`reduce_blocks`] compiled for AVX2 (eight f32 lanes per instruction instead of four).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_blocks_avx2<T: Element>(srcs: &[&[T]], out: &mut [T]) {
    reduce_blocks(srcs, out)
}

#[inline(always)]
fn reduce_blocks<T: Element>(srcs: &[&[T]], out: &mut [T]) {
    let n = out.len();
    let mut acc = [-0.0f32; REDUCE_BLOCK]; // -0.0 is the additive identity: -0.0 + x == x
    let mut a = 0;
    while a < n {
        let b = (a + REDUCE_BLOCK).min(n);
        let acc = &mut acc[..b - a];
        match srcs {
            [] => {
                acc.fill(-0.0);
                T::narrow_from(acc, &mut out[a..b]);
            }
            [only] => {
                T::set_from(&only[a..b], acc);
                T::narrow_from(acc, &mut out[a..b]);
            }
            [first, middle @ .., last] => {
                T::set_from(&first[a..b], acc);
                for s in middle {
                    T::add_into(&s[a..b], acc);
                }
                T::add_narrow(&last[a..b], acc, &mut out[a..b]);
            }
        }
        a = b;
    }
}

/// Number of 64-bit words that hold `count` elements of `T`.
#[inline]
pub fn words_for<T: Element>(count: usize) -> usize {
    count.div_ceil(T::LANES)
}

/// Packs up to `T::LANES` elements into one word, lane 0 in the low bits. Missing lanes are
/// +0.0 and an all-ones lane (a NaN) is stored as the canonical NaN, so a packed word is
/// never [`EMPTY`] (the "writer canonicalises" rule of the sentinel protocol).
#[inline(always)]
pub fn pack<T: Element>(elems: &[T]) -> u64 {
    let mut w = 0u64;
    for (l, e) in elems.iter().take(T::LANES).enumerate() {
        let mut bits = e.to_lane();
        if bits == T::LANE_ONES {
            bits = T::QNAN;
        }
        w |= bits << (l as u32 * T::LANE_BITS);
    }
    w
}

/// Packs f32 accumulators (one per lane) into a word of `T`, canonicalising NaN as [`pack`].
#[inline(always)]
pub fn pack_acc<T: Element>(acc: &[f32; 4]) -> u64 {
    let mut w = 0u64;
    for (l, a) in acc.iter().take(T::LANES).enumerate() {
        let mut bits = T::from_f32(*a).to_lane();
        if bits == T::LANE_ONES {
            bits = T::QNAN;
        }
        w |= bits << (l as u32 * T::LANE_BITS);
    }
    w
}

/// Adds every lane of `w` (as `T`) into `acc`.
#[inline(always)]
pub fn unpack_add<T: Element>(w: u64, acc: &mut [f32; 4]) {
    let mask = T::LANE_ONES;
    for (l, a) in acc.iter_mut().take(T::LANES).enumerate() {
        *a += T::from_lane((w >> (l as u32 * T::LANE_BITS)) & mask).to_f32();
    }
}

/// Writes the lanes of `w` into `out` (at most `out.len()` of them).
#[inline(always)]
pub fn unpack_into<T: Element>(w: u64, out: &mut [T]) {
    let mask = T::LANE_ONES;
    for (l, o) in out.iter_mut().take(T::LANES).enumerate() {
        *o = T::from_lane((w >> (l as u32 * T::LANE_BITS)) & mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_words_are_never_empty() {
        let ones = [f32::from_bits(u32::MAX); 2];
        assert_ne!(pack(&ones), EMPTY);
        assert!(f32::from_lane(pack(&ones) & 0xffff_ffff).is_nan());
        let h = [bf16::from_bits(u16::MAX); 4];
        assert_ne!(pack(&h), EMPTY);
        let acc = [f32::from_bits(u32::MAX); 4];
        assert_ne!(pack_acc::<f16>(&acc), EMPTY);
        assert_ne!(pack_acc::<f32>(&acc), EMPTY);
        // -0.0 travels exactly.
        let z = [-0.0f32, 1.0];
        let mut out = [0.0f32; 2];
        unpack_into(pack(&z), &mut out);
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn kernels_use_the_same_empty_word() {
        // The CUDA kernels' twin of EMPTY (kernels/common.cuh) must not drift from this one.
        let cuh = include_str!("../kernels/common.cuh");
        let line = cuh.lines().find(|l| l.starts_with("#define TPAR_EMPTY_WORD")).expect("TPAR_EMPTY_WORD defined");
        let hex = line.split_whitespace().nth(2).expect("a value").trim_end_matches('u').trim_start_matches("0x");
        assert_eq!(u32::from_str_radix(hex, 16).expect("hex"), EMPTY as u32);
        assert_eq!(EMPTY, ((EMPTY as u32 as u64) << 32) | EMPTY as u32 as u64);
    }

    #[test]
    fn empty_is_nan_in_every_width() {
        assert!(f32::from_bits(EMPTY as u32).is_nan());
        assert!(f16::from_bits(EMPTY as u16).is_nan());
        assert!(bf16::from_bits(EMPTY as u16).is_nan());
    }

    #[test]
    fn pack_unpack_round_trip() {
        let v = [f16::from_f32(1.5), f16::from_f32(-2.0), f16::from_f32(3.25)];
        let w = pack(&v);
        let mut out = [f16::ZERO; 3];
        unpack_into(w, &mut out);
        assert_eq!(out, v);
        let mut acc = [0.0f32; 4];
        unpack_add::<f16>(w, &mut acc);
        assert_eq!(acc, [1.5, -2.0, 3.25, 0.0]);
    }

    #[test]
    fn bf16_rounding_matches_half_on_every_class_of_input() {
        let check = |x: u32| {
            let v = f32::from_bits(x);
            let want = {
                let b = bf16::from_f32(v).to_bits();
                if b == 0xffff { 0x7fc0 } else { b }
            };
            assert_eq!(bf16_bits_rne(v), want, "{x:#010x}");
        };
        // Every pattern of the top 16 bits with the interesting low halves (ties, just
        // above and below, zero, all ones), then a pseudo-random sweep.
        for hi in 0..=0xffffu32 {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                check(hi << 16 | lo);
            }
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            check(x);
        }
    }

    #[test]
    fn reduce_into_equals_the_word_by_word_sum() {
        fn case<T: Element>(vals: &[f32]) {
            let world = 3;
            let n = vals.len();
            let ins: Vec<Vec<T>> = (0..world).map(|r| vals.iter().map(|v| T::from_f32(v * (r as f32 + 1.5))).collect()).collect();
            let srcs: Vec<&[T]> = ins.iter().map(|v| &v[..]).collect();
            let mut out = vec![T::from_f32(7.0); n];
            reduce_into(&srcs, &mut out);
            for i in 0..n {
                let mut acc = [-0.0f32; 4];
                for inp in &ins {
                    acc[0] += inp[i].to_f32();
                }
                let mut one = [T::from_f32(0.0)];
                unpack_into(pack_acc::<T>(&acc), &mut one);
                assert_eq!(out[i].to_lane(), one[0].to_lane(), "{:?} at {i}", T::DTYPE);
            }
        }
        let vals: Vec<f32> = (0..1500).map(|i| ((i * 7919) % 1000) as f32 * 0.37 - 180.0).collect();
        let mut special = vals.clone();
        special.extend([f32::NAN, f32::from_bits(u32::MAX), f32::INFINITY, -0.0, 0.0, f32::MAX]);
        case::<f32>(&special);
        case::<f16>(&special);
        case::<bf16>(&special);
    }

    #[test]
    fn dtype_names_parse() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().ok(), Some(d));
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert!("int8".parse::<DType>().is_err());
    }
}
