// norm.cuh — the all-reduce kernels' epilogues, spliced into frame.cuh at its end: PlainOut
// (stores the sum: every plain variant) and NormOut (the fused variant, -DTPAR_FUSED:
// residual add + RMSNorm), and the residual add, the fixed-order sum of squares and the
// normalisation that NormOut and the standalone add_rmsnorm.cu share (one copy of each).
// Semantics, bit for bit: docs/cuda.md "Fused all-reduce + residual add + RMSNorm";
// references: tpar::testing::expected_add_rmsnorm (Rust), tpar.testing (torch).
//
// A kernel with a fused variant (TPAR_FUSED_READY) hands every vector v of the message to
// exactly one thread of this rank, in whatever mapping its algorithm has (grid-stride, block
// ranges, two-shot chunks), and calls, for that thread's vectors:
//   prefetch(a, v)       once, for its first vector, before the all-reduce's waits;
//   transform(a, v, s)   on the rank-order sum s (rounded once, as the plain kernel's), in
//                        place: the fused epilogue makes it the updated residual
//                        r = round(s + residual), which two-shot then sends to its peers in
//                        place of s (the plain one leaves it: returning a copy instead made
//                        the compiler lay out the plain kernels' cold paths differently);
//   put(a, f, v, r)      the plain epilogue stores r as the output; the fused one stores r
//                        into residual_out and publishes the tile's partial sum of squares;
// then, once every put of the thread is done, norm(a, f, v) for the same vectors (the fused
// epilogue waits for its row's tiles and stores the normalised vector), in loops under
// `if (O::fused())`: the plain variants compile as before. The all-reduce itself is the
// plain kernel's code.
//
// The sum of squares of a row is fixed: a perfect binary tree over the row's squares
// r_i * r_i (f32, r_i the updated residual as stored, i.e. rounded), padded with +0.0 to a
// power of two, each node the f32 sum (round to nearest even) of its left and right child.
// Padding changes no sum (squares are >= +0, and NaN stays NaN), so any power of two that
// holds the row gives the same bits, and so does any machine that computes whole aligned
// subtrees and combines them in tree order: a vector's lanes (vec_sumsq), a warp's 32
// vectors (a tile, warp_tree over lanes), the row's tiles (row_sum). Nothing depends on the
// algorithm, the world, the grid or the block shape. Then, in f32 with one rounding per
// operation: mean = ss / hidden, inv = 1 / sqrt(mean + eps), out_i = (r_i * inv) * w_i,
// rounded once to the dtype.
//
// The fused kernels' tiles: a warp's 32 consecutive vectors of the message start on a
// multiple of 32 (every mapping steps by whole warps from a tile boundary: TPAR_TILE_ALIGN)
// and lie in one row (rows are whole tiles: the launcher's condition). Lane 0 publishes the
// tile's sum into this rank's scratch (the state buffer after TparState, one 8-byte word per
// tile: f32 bits | generation << 32, one store, so a reader sees both or neither), and every
// warp reads its row's tiles back (volatile, tagged with the call's generation epoch + 1: no
// fence, no reset). The scratch is this rank's alone; a call's tiles are all written before
// any of its warps waits for them, and all blocks of a rank are resident at once (the
// launcher's co-residency rule), so the waits end. Reuse: the next call on this rank starts
// after this one completed (kernel boundary or griddepcontrol.wait), and writes another
// generation. The host fills the scratch with the epoch whenever it sets epochs, so a word
// left from before never carries the next call's generation.

// Tiles per row the row sum takes: 4 per lane (bf16 rows of up to 32768 elements).
#define TPAR_ROW_TILES_PER_LANE 4u
#define TPAR_ROW_TILES_MAX (32u * TPAR_ROW_TILES_PER_LANE)

// f32 arithmetic with one rounding each (round to nearest even, denormals kept, never
// contracted into an fma whatever the compile options): the norm's bits are defined by them.
__device__ __forceinline__ float fadd_rn(float x, float y) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}
__device__ __forceinline__ float fmul_rn(float x, float y) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}
__device__ __forceinline__ float fdiv_rn(float x, float y) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
}
__device__ __forceinline__ float fsqrt_rn(float x) {
    float r;
    asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float shfl_xor_f32(float v, u32 lane_mask) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lane_mask));
    return r;
}

// The residual add: round(f32(s) + f32(res)) per lane, canonicalised (D::pack).
template <class D>
__device__ __forceinline__ V16 add_residual(V16 s, V16 res) {
    float acc[8];
    D::set(acc, s);
    D::add(acc, res);
    return D::pack(acc);
}

// The tree's lowest levels: the squares of one vector's lanes, summed pairwise.
template <class D>
__device__ __forceinline__ float vec_sumsq(V16 r) {
    float x[8];
    D::set(x, r);
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) x[i] = fmul_rn(x[i], x[i]);
#pragma unroll
    for (int s = 1; s < D::LANES; s *= 2) {
#pragma unroll
        for (int i = 0; i < D::LANES; i += 2 * s) x[i] = fadd_rn(x[i], x[i + s]);
    }
    return x[0];
}

// Five levels of the tree across a warp: lane l's value is leaf l; every lane returns the
// root (at each level a lane adds its partner's subtree; addition commutes, so both
// partners hold the same bits). Every lane of the warp must call it.
__device__ __forceinline__ float warp_tree(float v) {
#pragma unroll
    for (u32 m = 1u; m < 32u; m <<= 1) v = fadd_rn(v, shfl_xor_f32(v, m));
    return v;
}

// Tiles each lane takes for a row of `tiles` tiles (1, 2 or 4: the row padded to a power of
// two, spread over 32 lanes; at most TPAR_ROW_TILES_MAX tiles).
__device__ __forceinline__ u32 tiles_per_lane(u32 tiles) { return tiles <= 32u ? 1u : tiles <= 64u ? 2u : 4u; }

// The row's sum from its tiles: lane l holds tiles [k l, k l + k) in e[0..k) (+0.0 past the
// row); every lane returns the same bits. Every lane of the warp must call it.
__device__ __forceinline__ float row_sum(const float (&e)[TPAR_ROW_TILES_PER_LANE], u32 k) {
    float s = e[0];
    if (k == 2u) s = fadd_rn(e[0], e[1]);
    if (k == 4u) s = fadd_rn(fadd_rn(e[0], e[1]), fadd_rn(e[2], e[3]));
    return warp_tree(s);
}

// 1 / sqrt(ss / hidden + eps), each operation rounded once.
__device__ __forceinline__ float inv_rms(float ss, u32 hidden, float eps) {
    return fdiv_rn(1.0f, fsqrt_rn(fadd_rn(fdiv_rn(ss, (float)hidden), eps)));
}

// One normalised vector: round((r_i * inv) * w_i) per lane.
template <class D>
__device__ __forceinline__ V16 norm_vec(V16 r, V16 w, float inv) {
    float x[8], g[8];
    D::set(x, r);
    D::set(g, w);
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) x[i] = fmul_rn(fmul_rn(x[i], inv), g[i]);
    return D::pack(x);
}

// The plain epilogue: the sum is the output.
template <class D>
struct PlainOut {
    __device__ static constexpr bool fused() { return false; }
    __device__ __forceinline__ void prefetch(const TparArgs&, u64) {}
    __device__ __forceinline__ void transform(const TparArgs&, u64, V16&) const {}
    __device__ __forceinline__ void put(const TparArgs& a, const Frame&, u64 v, V16 r) { store_output<D>(a, v, r); }
    __device__ __forceinline__ void norm(const TparArgs&, Frame&, u64) {}
};

__device__ __forceinline__ u64* norm_scratch(const TparArgs& a) { return (u64*)(a.state + TPAR_SCRATCH_OFFSET); }

// The fused epilogue (see the top of this file). `a.output` is the normalised output.
template <class D>
struct NormOut {
    __device__ static constexpr bool fused() { return true; }
    const TparNorm& n;
    u32 vrow;       // vectors per row
    float eps;
    u64 kept_v;     // the first vector put: its result and weight stay for norm
    V16 kept_r, kept_w;
    u32 row;        // the row norm last waited for, and its 1 / rms
    float inv;

    __device__ __forceinline__ explicit NormOut(const TparNorm& n_)
        : n(n_), vrow(n_.hidden / (u32)D::LANES), eps(u32_as_f32(n_.eps_bits)), kept_v(~0ull), row(~0u), inv(0.0f) {
        kept_r = kept_w = V16{0u, 0u, 0u, 0u};
    }

    __device__ __forceinline__ const V16* weight_of(u64 v) const { return (const V16*)n.weight + (u32)v % vrow; }

    // Brings v's residual and weight into L1 before the all-reduce waits (v past the message:
    // nothing), so that transform's and put's loads after the wait hit it: no registers held
    // across the all-reduce, whose default variant uses 116-128 of a thread's 128 (holding
    // the two vectors in registers spilled the f32 push kernels and two-shot pull).
    __device__ __forceinline__ void prefetch(const TparArgs& a, u64 v) {
        if (v >= vecs_for<D>(a.count)) return;
        asm volatile("prefetch.global.L1 [%0];" ::"l"((const V16*)n.residual + v));
        asm volatile("prefetch.global.L1 [%0];" ::"l"(weight_of(v)));
    }

    __device__ __forceinline__ void transform(const TparArgs&, u64 v, V16& s) const {
        s = add_residual<D>(s, ld_v16((const V16*)n.residual + v));
    }

    // Stores the updated residual and publishes its tile's sum (lane 0). Every lane of the
    // warp calls it for the same tile.
    __device__ __forceinline__ void put(const TparArgs& a, const Frame& f, u64 v, V16 r) {
        st_v16((V16*)n.residual_out + v, r);
        if (kept_v == ~0ull) {
            kept_v = v;
            kept_r = r;
            kept_w = ld_v16(weight_of(v));  // in flight while the tiles come
        }
        const float t = warp_tree(vec_sumsq<D>(r));
        if ((threadIdx.x & 31u) == 0u) {
            const u64 word = ((u64)(f.epoch + 1u) << 32) | f32_as_u32(t);
            asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(norm_scratch(a) + v / TPAR_TILE_VECS), "l"(word));
        }
    }

    // 1 / rms of `row`: waits for its tiles (this call's generation), sums them.
    __device__ __forceinline__ float row_inv(const TparArgs& a, Frame& f, u32 rw) const {
        const u32 tiles = vrow / TPAR_TILE_VECS;
        const u32 k = tiles_per_lane(tiles);
        const u32 first = k * (threadIdx.x & 31u);
        const u64* base = norm_scratch(a) + (u64)rw * tiles;
        const u32 gen = f.epoch + 1u;
        float e[TPAR_ROW_TILES_PER_LANE];
        u32 pending = 0u;
#pragma unroll
        for (u32 u = 0; u < TPAR_ROW_TILES_PER_LANE; ++u) {
            e[u] = 0.0f;
            if (u < k && first + u < tiles) pending |= 1u << u;
        }
        u32 polls = 0;
        while (pending != 0u && f.ok) {
            u64 w[TPAR_ROW_TILES_PER_LANE];
#pragma unroll
            for (u32 u = 0; u < TPAR_ROW_TILES_PER_LANE; ++u) {
                w[u] = 0ull;
                if (pending & (1u << u)) asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w[u]) : "l"(base + first + u));
            }
#pragma unroll
            for (u32 u = 0; u < TPAR_ROW_TILES_PER_LANE; ++u) {
                if ((pending & (1u << u)) && (u32)(w[u] >> 32) == gen) {
                    e[u] = u32_as_f32((u32)w[u]);
                    pending &= ~(1u << u);
                }
            }
            if (pending == 0u) break;
            if (!still_waiting(a, f, polls, a.rank, TPAR_PHASE_NORM_POLL)) break;
        }
        return inv_rms(row_sum(e, k), n.hidden, eps);
    }

    // Normalises vector v (after every put of this thread) into the output.
    __device__ __forceinline__ void norm(const TparArgs& a, Frame& f, u64 v) {
        const u32 rw = (u32)v / vrow;
        if (rw != row) {  // the same for the whole warp: a tile lies in one row
            row = rw;
            inv = row_inv(a, f, rw);
        }
        const bool kept = v == kept_v;
        const V16 r = kept ? kept_r : ld_v16((const V16*)n.residual_out + v);  // this thread's own store
        const V16 w = kept ? kept_w : ld_v16(weight_of(v));
        store_output<D>(a, v, norm_vec<D>(r, w, inv));
    }
};
