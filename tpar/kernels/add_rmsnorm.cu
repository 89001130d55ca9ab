// add_rmsnorm.cu — tpar's single-kernel residual add + RMSNorm, no communication: what the
// engines' fused_add_rms_norm (rms_norm, + static_scaled_fp8_quant) does after an
// all-reduce, with the fused kernels' arithmetic bit for bit (norm.cuh: add_residual, the
// fixed-order sum of squares, inv_rms, norm_vec, store_norm), every pattern of TparNorm.flags:
//   residual_out = round(x + residual)                       (x = a.input, f32 add; without
//                                                             TPAR_NORM_RESIDUAL: x itself)
//   out          = round((residual_out * inv_rms) * g)       (out = a.output, may be x; g the
//                                                             weight, + 1 for Gemma; FP8:
//                                                             quantized, 1 byte an element;
//                                                             NVFP4: 2 elements a byte and
//                                                             block scales, norm.cuh)
// It serves the unfused path (an all-reduce into the output, then this kernel in place) of
// calls no fused kernel takes, and the comparison `tpar bench --fused` makes.
//
// One block per row (grid = rows), threads striding over the row's vectors: pass 1 adds,
// stores the residual, and sums each warp's tile into shared memory (a partial last tile
// counts its missing vectors as +0.0, as the tree's padding does); every warp then sums the
// row's tiles itself (the same bits in every warp: no second barrier); pass 2 normalises.
// The first TPAR_NORM_KEEP vectors of a thread stay in registers between the passes; later
// ones are read back (the thread's own stores). In place (out == x, residual_out ==
// residual): every element is read by the thread that writes it, before it writes it.
#include "common.cuh"

#define TPAR_NORM_KEEP 4  // vectors per thread kept in registers between the two passes

// Pass 1 for row-local vector j (lanes past the row take part in the warp's tile sum with
// +0.0): the residual add, stored; returns the warp's tile sum (every lane), and r and w.
template <class D>
__device__ __forceinline__ float add_rmsnorm_step(const TparFusedArgs& fa, u64 base, u32 j, u32 vrow, V16& r, V16& w) {
    float leaf = 0.0f;
    if (j < vrow) {
        const V16 x = ld_v16((const V16*)fa.a.input + base + j);
        w = ld_v16((const V16*)fa.n.weight + j);
        r = (fa.n.flags & TPAR_NORM_RESIDUAL) ? add_residual<D>(x, ld_v16((const V16*)fa.n.residual + base + j)) : x;
        st_v16((V16*)fa.n.residual_out + base + j, r);
        leaf = vec_sumsq<D>(r);
    }
    return warp_tree(leaf);
}

template <class D>
__device__ void add_rmsnorm(const TparFusedArgs& fa) {
    __shared__ float tiles[TPAR_ROW_TILES_MAX];
    pdl_wait();  // a no-op unless launched as a dependent (its input is the previous kernel's output)
    nvfp4_zero_padding_grid<D>(fa.a, fa.n);  // NVFP4: the scale tensor's padding, first (norm.cuh)
    const u32 vrow = fa.n.hidden / (u32)D::LANES;
    const u64 base = (u64)blockIdx.x * vrow;
    const u32 t = threadIdx.x, bd = blockDim.x, lane = t & 31u;
    V16 r[TPAR_NORM_KEEP], w[TPAR_NORM_KEEP];
#pragma unroll
    for (int k = 0; k < TPAR_NORM_KEEP; ++k) {
        const u32 j = t + (u32)k * bd;
        if (j - lane < vrow) {  // the warp's first vector: the whole warp or none of it
            const float s = add_rmsnorm_step<D>(fa, base, j, vrow, r[k], w[k]);
            if (lane == 0u) tiles[j / TPAR_TILE_VECS] = s;
        }
    }
    for (u32 j = t + TPAR_NORM_KEEP * bd; j - lane < vrow; j += bd) {
        V16 x, y;
        const float s = add_rmsnorm_step<D>(fa, base, j, vrow, x, y);
        if (lane == 0u) tiles[j / TPAR_TILE_VECS] = s;
    }
    block_sync();
    const u32 ntiles = (vrow + TPAR_TILE_VECS - 1u) / TPAR_TILE_VECS;
    const u32 k = tiles_per_lane(ntiles);
    float e[TPAR_ROW_TILES_PER_LANE];
#pragma unroll
    for (u32 u = 0; u < TPAR_ROW_TILES_PER_LANE; ++u) {
        const u32 i = k * lane + u;
        e[u] = u < k && i < ntiles ? tiles[i] : 0.0f;
    }
    const float inv = inv_rms(row_sum(e, k), fa.n.hidden, u32_as_f32(fa.n.eps_bits));
    const float qinv = (fa.n.flags & (TPAR_NORM_FP8 | TPAR_NORM_NVFP4)) ? quant_arg(fa.n, ld_scale(fa.n)) : 1.0f;
    // NVFP4's 1 / gs (nvfp4_rg) at each store, not held in a register across pass 2: one more
    // register there beside the kept vectors spilled the 16-bit kernels on sm_90 (64).
#pragma unroll
    for (int k2 = 0; k2 < TPAR_NORM_KEEP; ++k2) {
        const u32 j = t + (u32)k2 * bd;
        if (j < vrow) store_norm<D>(fa.a, fa.n, base + j, r[k2], w[k2], inv, qinv, nvfp4_rg(qinv));
    }
    for (u32 j = t + TPAR_NORM_KEEP * bd; j < vrow; j += bd) {
        const V16 x = ld_v16((const V16*)fa.n.residual_out + base + j);
        store_norm<D>(fa.a, fa.n, base + j, x, ld_v16((const V16*)fa.n.weight + j), inv, qinv, nvfp4_rg(qinv));
    }
}

#define TPAR_NORM_ENTRY(NAME, SUFFIX, D) \
    extern "C" __global__ void __launch_bounds__(TPAR_THREADS) NAME##_##SUFFIX(const TparFusedArgs fa) { NAME<D>(fa); }
TPAR_EACH_DTYPE(TPAR_NORM_ENTRY, add_rmsnorm)
