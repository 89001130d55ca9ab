//! NVFP4 quantization as vLLM's `scaled_fp4_quant(input, input_global_scale)` computes it
//! (docs/cuda.md "NVFP4 output"), bit for bit what tpar's kernels compute (kernels/norm.cuh
//! `nvfp4_pack`) and `tpar.testing.quant_nvfp4` (Python): e2m1 codes two a byte, e4m3fn
//! scales of 16-element blocks in vLLM's 128x4-swizzled layout.

use super::fused::{fp8_e4m3_value, quant_fp8_static};

/// Elements that share one scale.
pub const NVFP4_BLOCK: usize = 16;
/// The largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// The e2m1 code (4 bits: sign 8, magnitude code 0-7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6) of `y`:
/// |y| clamped to 6, rounded to the nearest grid value, ties to the even code (0.25 -> 0,
/// 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The sign is kept (-0 and
/// negatives that round to 0 give 8). NaN gives 0 whatever its sign bit (it passes no
/// boundary; the GPU's arithmetic returns the canonical, positive NaN).
pub fn e2m1_bits(y: f32) -> u8 {
    let m = y.abs();
    let q = [m > 0.25, m >= 0.75, m > 1.25, m >= 1.75, m > 2.5, m >= 3.5, m > 5.0].iter().filter(|&&b| b).count() as u8;
    (if y.is_sign_negative() && !y.is_nan() { 8 } else { 0 }) | q
}

/// The value of an e2m1 code (its low 4 bits).
pub fn e2m1_value(code: u8) -> f32 {
    const GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = GRID[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Bytes of the swizzled scale tensor of `rows` x `hidden`: rows padded to 128, the row's
/// `hidden / 16` scales padded to a multiple of 4 (vLLM's int32 `[round_up(rows, 128),
/// round_up(hidden / 16, 4) / 4]` tensor).
pub fn nvfp4_scale_bytes(rows: usize, hidden: usize) -> usize {
    rows.div_ceil(128) * 128 * (hidden / NVFP4_BLOCK).div_ceil(4) * 4
}

/// Where the scale of block `kb` of row `row` lies in the swizzled tensor (vLLM's
/// `cvt_quant_to_fp4_get_sf_out_offset`, layout `[rows / 128][k tiles][32][4][4]`):
/// `(row / 128 * k_tiles + kb / 4) * 512 + (row % 32) * 16 + (row / 32 % 4) * 4 + kb % 4`,
/// `k_tiles = ceil(hidden / 64)`.
pub fn nvfp4_scale_offset(row: usize, kb: usize, hidden: usize) -> usize {
    let k_tiles = (hidden / NVFP4_BLOCK).div_ceil(4);
    (row / 128 * k_tiles + kb / 4) * 512 + (row % 32) * 16 + (row / 32 % 4) * 4 + kb % 4
}

/// One block of 16 values (the dtype's, as f32) quantized with the global scale `gs`: its
/// e4m3fn scale byte and its 8 bytes of e2m1 codes (even element in the low nibble).
/// amax = max |x| (NaN ignored, as CUDA's fmaxf); sf = e4m3fn(gs * (amax * f32(1/6))), clamped to 448 and rounded to nearest
/// even ([`quant_fp8_static`] with scale 1); os = 1 / (f32(sf) * (1 / gs)), each reciprocal
/// the exact IEEE one (0 where its divisor is 0), as vLLM's Python reference
/// `ref_nvfp4_quant` (its CUDA kernel's `rcp.approx.ftz` may differ in the last bit);
/// code_i = [`e2m1_bits`]`(x_i * os)`.
pub fn quant_nvfp4_block(x: &[f32], gs: f32) -> (u8, [u8; 8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let sf = quant_fp8_static(gs * (amax * (1.0f32 / E2M1_MAX)), 1.0);
    let rg = if gs == 0.0 { 0.0 } else { 1.0 / gs };
    let d = fp8_e4m3_value(sf) * rg;
    let os = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut q = [0u8; 8];
    for (i, v) in x.iter().enumerate().take(NVFP4_BLOCK) {
        q[i / 2] |= e2m1_bits(v * os) << (4 * (i % 2));
    }
    (sf, q)
}

/// An NVFP4 tensor: the packed codes (`rows x hidden / 2` bytes) and the swizzled block
/// scales ([`nvfp4_scale_bytes`]; padding 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvfp4 {
    pub packed: Vec<u8>,
    pub scales: Vec<u8>,
}

/// vLLM's `scaled_fp4_quant(x, gs)` of `x` (rows of `hidden` elements, `hidden` a multiple of
/// 16) with the swizzled scale layout, bit for bit ([`quant_nvfp4_block`] per block); the
/// scale tensor's padding is 0 (vLLM's kernel zeroes it; so do tpar's).
pub fn quant_nvfp4(x: &[f32], hidden: usize, gs: f32) -> crate::error::Result<Nvfp4> {
    if hidden == 0 || hidden % NVFP4_BLOCK != 0 || x.len() % hidden != 0 {
        return Err(crate::error::Error::invalid("hidden", format!("{hidden}: NVFP4 needs rows of a multiple of 16 elements ({} elements given)", x.len())));
    }
    let rows = x.len() / hidden;
    let mut packed = Vec::with_capacity(x.len() / 2);
    let mut scales = vec![0u8; nvfp4_scale_bytes(rows, hidden)];
    for (row, r) in x.chunks(hidden).enumerate() {
        for (kb, block) in r.chunks(NVFP4_BLOCK).enumerate() {
            let (sf, q) = quant_nvfp4_block(block, gs);
            scales[nvfp4_scale_offset(row, kb, hidden)] = sf;
            packed.extend_from_slice(&q);
        }
    }
    Ok(Nvfp4 { packed, scales })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SplitMix;

    #[test]
    fn e2m1_rounds_to_the_nearest_grid_value_ties_to_even() {
        // Every code's value gives that code; halfway points go to the even code; just off
        // them to the nearer one; beyond 6 saturates.
        for c in 0u8..16 {
            if c == 8 {
                assert_eq!(e2m1_bits(-0.0), 8);
                continue;
            }
            assert_eq!(e2m1_bits(e2m1_value(c)), c, "code {c}");
        }
        for c in 0u8..7 {
            let (lo, hi) = (e2m1_value(c), e2m1_value(c + 1));
            let mid = (lo + hi) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            for s in [1.0f32, -1.0] {
                let sign = if s < 0.0 { 8 } else { 0 };
                assert_eq!(e2m1_bits(s * mid), sign | even, "{mid} ties to even");
                assert_eq!(e2m1_bits(s * f32::from_bits(mid.to_bits() - 1)), sign | c, "below {mid}");
                assert_eq!(e2m1_bits(s * f32::from_bits(mid.to_bits() + 1)), sign | (c + 1), "above {mid}");
            }
        }
        assert_eq!(e2m1_bits(1e30), 7);
        assert_eq!(e2m1_bits(f32::NEG_INFINITY), 15);
        assert_eq!(e2m1_bits(-1e-30), 8);
        assert_eq!((e2m1_bits(f32::NAN), e2m1_bits(-f32::NAN)), (0, 0));
        // amax ignores NaN; the NaN element's code is 0, the others' as without it.
        let mut x = [1.5f32; 16];
        x[3] = f32::NAN;
        let (sf, q) = quant_nvfp4_block(&x, 4.0);
        assert_eq!(sf, quant_nvfp4_block(&[1.5f32; 16], 4.0).0);
        assert_eq!((q[1] >> 4, q[0]), (0, 0x77));
        // Brute force: the nearest grid value over a sweep.
        let mut g = SplitMix::new(3);
        for _ in 0..20000 {
            let y = g.next_signed() * 7.0;
            let c = e2m1_bits(y);
            let a = y.abs().min(E2M1_MAX);
            let best = (0u8..8).map(|k| (e2m1_value(k) - a).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((e2m1_value(c & 7) - a).abs(), best, "{y}");
            assert_eq!(c & 8 != 0, y.is_sign_negative(), "{y}");
        }
    }

    #[test]
    fn the_swizzle_is_vllms_128x4_layout() {
        // vLLM's reference un-swizzle (tests/kernels/quantization/nvfp4_utils.py,
        // convert_swizzled_to_linear): reshape (m_tiles, k_tiles, 32, 4, 4), permute
        // (0, 3, 2, 1, 4) -> (m_tiles, 4, 32, k_tiles, 4), i.e. linear row = m_tile * 128 +
        // inner * 32 + outer, column = k_tile * 4 + kk: every (row, kb) maps to one distinct
        // byte, and un-swizzling recovers it.
        for (rows, hidden) in [(1usize, 1024usize), (3, 7168), (130, 80), (256, 5120), (33, 16)] {
            let m_tiles = rows.div_ceil(128);
            let k_tiles = (hidden / 16).div_ceil(4);
            assert_eq!(nvfp4_scale_bytes(rows, hidden), m_tiles * k_tiles * 512);
            let mut seen = vec![false; nvfp4_scale_bytes(rows, hidden)];
            for row in 0..m_tiles * 128 {
                for kb in 0..k_tiles * 4 {
                    let off = nvfp4_scale_offset(row, kb, hidden);
                    assert!(!seen[off], "{rows}x{hidden}: ({row}, {kb}) collides");
                    seen[off] = true;
                    // Un-swizzle by the reshape/permute: off = (((mt * k_tiles + kt) * 32 + outer) * 4 + inner) * 4 + kk.
                    let (kk, rest) = (off % 4, off / 4);
                    let (inner, rest) = (rest % 4, rest / 4);
                    let (outer, rest) = (rest % 32, rest / 32);
                    let (kt, mt) = (rest % k_tiles, rest / k_tiles);
                    assert_eq!((mt * 128 + inner * 32 + outer, kt * 4 + kk), (row, kb));
                }
            }
        }
        // A few by hand: row 33 block 5 of hidden 7168 (448 scales, 112 k tiles).
        assert_eq!(nvfp4_scale_offset(33, 5, 7168), 512 + 16 + 4 + 1);
        assert_eq!(nvfp4_scale_offset(129, 0, 7168), 112 * 512 + 16);
    }

    /// The kernels' zeroing of the scale tensor's padding (kernels/norm.cuh
    /// `nvfp4_zero_padding`), mirrored statement for statement: thread `t` of `nt`'s stores,
    /// (byte offset in the tensor, bytes). `v4`: `scale_out` 16-byte aligned.
    fn padding_stores(rows: u32, hidden: u32, v4: bool, t: u32, nt: u32) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let nb = hidden / 16;
        let ktiles = nb.div_ceil(4);
        let rr = rows & 127;
        if rr != 0 {
            let base = (rows >> 7) as usize * ktiles as usize * 512;
            let mut q = t;
            while q < ktiles * 32 {
                let c = q & 31;
                let at = base + q as usize * 16;
                if c >= rr && v4 {
                    out.push((at, 16));
                } else {
                    for k in 0..4u32 {
                        if k * 32 + c >= rr {
                            out.push((at + k as usize * 4, 4));
                        }
                    }
                }
                q += nt;
            }
        }
        if nb & 3 != 0 {
            let mut r = t;
            while r < rows {
                let at = nvfp4_scale_offset(r as usize, nb as usize, hidden as usize);
                for kk in nb & 3..4 {
                    out.push((at + (kk - (nb & 3)) as usize, 1));
                }
                r += nt;
            }
        }
        out
    }

    #[test]
    fn the_kernels_padding_stores_cover_the_padding_once_and_nothing_else() {
        // Every shape class: rows below, at and past each 32-row group and the 128-row tile
        // (whole tiles: no padded row), scale columns a multiple of 4 or not (hidden / 16 % 4
        // = 0..3: add_rmsnorm.cu's shapes; a fused row is whole tiles), and grids smaller and
        // larger than the work.
        let rows_set = [1u32, 2, 31, 32, 33, 63, 64, 65, 96, 97, 127, 128, 129, 160, 255, 256, 257, 300];
        let hidden_set = [16u32, 32, 48, 64, 80, 112, 128, 1024, 5120, 7168, 7168 + 16, 7168 + 48];
        for rows in rows_set {
            for hidden in hidden_set {
                let (r, h, nb) = (rows as usize, hidden as usize, hidden as usize / 16);
                let bytes = nvfp4_scale_bytes(r, h);
                let mut real = vec![false; bytes];
                for row in 0..r {
                    for kb in 0..nb {
                        real[nvfp4_scale_offset(row, kb, h)] = true;
                    }
                }
                for v4 in [true, false] {
                    for nt in [1u32, 7, 32, 512, 5000] {
                        let mut hits = vec![0u32; bytes];
                        for t in 0..nt.min(bytes as u32 + 1) {
                            for (at, len) in padding_stores(rows, hidden, v4, t, nt) {
                                assert!(at % len == 0 && (len != 16 || v4), "{rows}x{hidden} v4 {v4}: a {len}-byte store at {at} misaligned");
                                assert!(at + len <= bytes, "{rows}x{hidden}: a store at {at} past the tensor ({bytes} B)");
                                for h in &mut hits[at..at + len] {
                                    *h += 1;
                                }
                            }
                        }
                        for (b, (&n, &is_real)) in hits.iter().zip(&real).enumerate() {
                            assert_eq!(n, u32::from(!is_real), "{rows}x{hidden} v4 {v4} nt {nt}: byte {b} (real {is_real}) stored {n} times");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn blocks_follow_vllms_recipe() {
        // A zero block: scale 0, output scale 0, every code +0.
        assert_eq!(quant_nvfp4_block(&[0.0; 16], 3.0), (0, [0; 8]));
        // Each grid value at a block scale of exactly 1: gs = 1, amax 6 -> sf = 1.0 (0x38).
        let mut x = [0.0f32; 16];
        for (i, v) in x.iter_mut().enumerate() {
            *v = e2m1_value(i as u8);
        }
        x[8] = -0.0;
        let (sf, q) = quant_nvfp4_block(&x, 1.0);
        assert_eq!(sf, 0x38);
        for (i, v) in x.iter().enumerate() {
            assert_eq!((q[i / 2] >> (4 * (i % 2))) & 15, e2m1_bits(*v), "element {i}");
        }
        assert_eq!(q[0], 0x10, "element 0 (code 0) in the low nibble, element 1 (code 1) in the high");
        // amax at saturation: gs * amax / 6 past 448 clamps to 448 (0x7e).
        let (sf, q) = quant_nvfp4_block(&[1e4; 16], 1.0);
        assert_eq!(sf, 0x7e);
        assert!(q.iter().all(|&b| b == 0x77), "1e4 / 448 saturates to 6");
        // A subnormal e4m3 scale: gs * amax / 6 = 2^-7 (code 4 of 2^-9 steps), and its
        // output scale the exact reciprocal 2^7: 6 * 2^-7 becomes 6.
        let (sf, q) = quant_nvfp4_block(&[6.0 * 2f32.powi(-7); 16], 1.0);
        assert_eq!((sf, q[0]), (0x04, 0x77));
        // Below half the smallest subnormal: scale 0, every code 0 whatever the value.
        let (sf, q) = quant_nvfp4_block(&[1e-6; 16], 1.0);
        assert_eq!((sf, q), (0, [0; 8]));
        // The global scale enters twice: gs = 2 doubles sf, and os stays amax-relative.
        let mut g = SplitMix::new(17);
        let x: Vec<f32> = (0..16).map(|_| g.next_signed() * 3.0).collect();
        let (s1, q1) = quant_nvfp4_block(&x, 1.0);
        let (s2, q2) = quant_nvfp4_block(&x, 2.0);
        assert_eq!(fp8_e4m3_value(s2), 2.0 * fp8_e4m3_value(s1));
        assert_eq!(q1, q2);
        assert!(quant_nvfp4(&x, 24, 1.0).is_err(), "rows of a multiple of 16");
    }

    /// Dequantized, every element lies within half a code step (times the block's scale) of
    /// its f64 value, or is saturated: the reference is a quantizer, not noise.
    #[test]
    fn dequantized_values_are_near_the_input() {
        let mut g = SplitMix::new(29);
        let (rows, hidden) = (5usize, 96usize);
        let x: Vec<f32> = (0..rows * hidden).map(|i| g.next_signed() * 2f32.powi((i % 7) as i32 - 3)).collect();
        let gs = 448.0 * 6.0 / 8.0;
        let q = quant_nvfp4(&x, hidden, gs).unwrap();
        for row in 0..rows {
            for kb in 0..hidden / 16 {
                let sf = fp8_e4m3_value(q.scales[nvfp4_scale_offset(row, kb, hidden)]) as f64 / gs as f64;
                for i in 0..16 {
                    let e = row * hidden + kb * 16 + i;
                    let v = e2m1_value(q.packed[e / 2] >> (4 * (e % 2))) as f64 * sf;
                    let r = (x[e] as f64 / sf).abs();
                    let step = if r < 2.0 { 0.5 } else if r < 4.0 { 1.0 } else { 2.0 };
                    // Half a code step, and the scale's own rounding (e4m3: 2^-4 relative) where the largest values saturate.
                    assert!((v - x[e] as f64).abs() <= step / 2.0 * sf * 1.0001 + (x[e] as f64).abs() / 16.0, "row {row} block {kb} element {i}: {v} vs {}", x[e]);
                }
            }
        }
        // The padding is 0.
        let used: std::collections::HashSet<usize> = (0..rows).flat_map(|r| (0..hidden / 16).map(move |k| nvfp4_scale_offset(r, k, hidden))).collect();
        assert!(q.scales.iter().enumerate().all(|(i, &b)| used.contains(&i) || b == 0));
    }
}
