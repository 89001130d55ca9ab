// norm.cuh — the all-reduce kernels' epilogues, spliced into frame.cuh at its end: PlainOut
// (stores the sum: every plain variant) and NormOut (the fused variant, -DTPAR_FUSED:
// residual add + RMSNorm), and the residual add, the fixed-order sum of squares and the
// normalisation that NormOut and the standalone add_rmsnorm.cu share (one copy of each).
// Semantics, bit for bit: docs/cuda.md "Fused all-reduce + residual add + RMSNorm" and its
// "Fused all-reduce + RMSNorm family" (TparNorm.flags: with or without the residual add, the Gemma weight
// offset, an FP8 e4m3 or an NVFP4 output); references: tpar::testing::rmsnorm_pattern (Rust),
// tpar.testing (torch).
//
// A kernel with a fused variant (TPAR_FUSED_READY) hands every vector v of the message to
// exactly one thread of this rank, in whatever mapping its algorithm has (grid-stride, block
// ranges, two-shot chunks), and calls, for that thread's vectors:
//   stage(a, v)          once, for its first vector, when its own data are out (two-shot
//                        push: prefetch(a, v) before its waits instead);
//   transform(a, v, s)   on the rank-order sum s (rounded once, as the plain kernel's), in
//                        place: the fused epilogue makes it the updated residual
//                        r = round(s + residual), which two-shot then sends to its peers in
//                        place of s (the plain one leaves it: returning a copy instead made
//                        the compiler lay out the plain kernels' cold paths differently);
//   put(a, f, v, r)      the plain epilogue stores r as the output; the fused one stores r
//                        into residual_out and publishes the tile's partial sum of squares;
//   flush(a, f)          (two-shot pull, after its last put: TPAR_NORM_SPREAD below; a no-op
//                        in every other variant)
// then, once every put of the thread is done, norm(a, f, v) for the same vectors (two-shot
// pull's spread norm: any vector; the fused epilogue waits for its row's tiles and stores
// the normalised vector), in loops under
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

// The cluster variant (-DTPAR_FUSED_CLUSTER, with -DTPAR_FUSED; the launcher's choice where
// a row's blocks are one thread-block cluster, cuda/launch.rs `row_cluster`) of a kernel that
// defines TPAR_CLUSTER_ROWS_READY (one vector a thread there, a block's vectors contiguous):
// the row's sums meet in distributed shared memory (below). Like the plain fused variant, it
// copies the first vector's residual and weight into this block's shared memory before the
// all-reduce's waits (stage: cp.async, one slot a thread, in flight beside the waits without
// holding registers across them; holding them in registers slowed the reduction,
// bench/results/2026-12-02-h200-fused-cluster/; staging is 0.15-0.35 us faster at 3 and 8 rows than
// their L1 prefetch, which one-shot pull's barrier acquire invalidates:
// bench/results/2026-12-03-h200-fused-launches-staging/).
#if defined(TPAR_FUSED_CLUSTER)
#if !TPAR_FUSED_ON || !defined(TPAR_CLUSTER_ROWS_READY)
#error "-DTPAR_FUSED_CLUSTER needs -DTPAR_FUSED and a kernel with TPAR_CLUSTER_ROWS_READY"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "-DTPAR_FUSED_CLUSTER needs sm_90 or later (thread-block clusters)"
#endif
#define TPAR_CLUSTER_ROWS 1
#else
#define TPAR_CLUSTER_ROWS 0
#endif

// The rows variant (-DTPAR_FUSED_ROWS, with -DTPAR_FUSED; the launcher's choice,
// cuda/fused.rs `rows_owned`) of a kernel that defines TPAR_FUSED_ROWS_READY (two-shot
// pull): each rank's chunk is whole rows, so a row's tiles are all this rank's puts; the
// owner normalises its rows (norm_export: the output stored and exported into its
// workspace) and peers take the finished outputs (load_export, put_gathered).
#if defined(TPAR_FUSED_ROWS)
#if !TPAR_FUSED_ON || !defined(TPAR_FUSED_ROWS_READY)
#error "-DTPAR_FUSED_ROWS needs -DTPAR_FUSED and a kernel with TPAR_FUSED_ROWS_READY"
#endif
#define TPAR_ROWS_OWNED 1
#else
#define TPAR_ROWS_OWNED 0
#endif

// The spread norm (a kernel that defines TPAR_NORM_SPREAD before including common.cuh:
// two-shot pull): the kernel normalises every vector of the message grid-stride over the
// whole grid, not the vectors each thread put, so a thread may normalise a vector another
// thread (another block) gathered. Its puts therefore publish their tiles only after a
// release: each warp keeps its tile sums in shared memory (at most TPAR_PENDING_TILES, then
// it flushes early) and flush() fences the warp's stores (residual_out above all) before it
// stores the words; row_inv's polls are acquire loads. Only where the kernel sets `spread`
// before its first put (its choice: where its mapping leaves half the grid idle); otherwise
// the tiles are published and polled as in every other variant, and each thread normalises
// its own puts (the release and acquire cost 1-3 us where threads normalise several
// vectors). Two-shot pull maps every step onto the grid's first cvec threads, which in the
// fused variant then normalised world vectors each, one after the other (7168 x 1 at 8
// ranks: block 0 alone; bench/results/2026-12-03-h200-fused-twoshot-spread/).
#if TPAR_FUSED_ON && defined(TPAR_NORM_SPREAD)
#define TPAR_SPREAD 1
#define TPAR_PENDING_TILES 8u
#else
#define TPAR_SPREAD 0
#endif

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

// One normalised vector: round((r_i * inv) * g_i) per lane, g_i = w_i, or with the Gemma
// offset (TPAR_NORM_GEMMA) f32(w_i) + 1 rounded once.
template <class D>
__device__ __forceinline__ V16 norm_vec(V16 r, V16 w, float inv, u32 flags) {
    float x[8], g[8];
    D::set(x, r);
    D::set(g, w);
    const bool gemma = (flags & TPAR_NORM_GEMMA) != 0u;
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) x[i] = fmul_rn(fmul_rn(x[i], inv), gemma ? fadd_rn(g[i], 1.0f) : g[i]);
    return D::pack(x);
}

// FP8 e4m3fn (OCP: bias 7, 3 mantissa bits, no infinities) of y, |y| <= 448 and not NaN (the
// quantizer clamps first), round to nearest even, as the byte: normal magnitudes (>= 2^-6)
// round f32's mantissa to 3 bits (the carry steps the exponent), smaller ones are multiples
// of 2^-9 (y * 512 exact, rounded to an integer, ties to even; 8 is the smallest normal,
// 0x08). The sign is kept (-0 and negatives that round to 0 give 0x80). Bit for bit
// tpar::testing::fp8_e4m3_bits on that range.
__device__ __forceinline__ u32 fp8_e4m3_rne(float y) {
    const u32 b = f32_as_u32(y);
    const u32 m = b & 0x7fffffffu;
    u32 q;
    if (m >= 0x3c800000u) {
        q = ((m + 0x7ffffu + ((m >> 20) & 1u)) >> 20) - (120u << 3);
    } else {
        asm("cvt.rni.u32.f32 %0, %1;" : "=r"(q) : "f"(fmul_rn(u32_as_f32(m), 512.0f)));
    }
    return ((b >> 24) & 0x80u) | q;
}

// vLLM's static_scaled_fp8_quant of one value (qinv = 1 / scale, f32): y = x * qinv, clamped
// as fmaxf(fminf(y, 448), -448) (NaN becomes +448: min.f32 returns the other operand), then
// fp8_e4m3_rne.
__device__ __forceinline__ u32 quant_fp8(float x, float qinv) {
    float y = fmul_rn(x, qinv);
    asm("min.f32 %0, %0, 0f43E00000;" : "+f"(y));  // 448
    asm("max.f32 %0, %0, 0fC3E00000;" : "+f"(y));  // -448
    return fp8_e4m3_rne(y);
}

// Stores vector v's normalised values (the dtype's, as rounded) quantized to FP8 at the
// output: D::LANES bytes at output + v * D::LANES (whole vectors: the fused call's rows are).
// The FP8 bytes of one normalised vector o: lanes 0-3 in .x, 4-7 in .y (.z, .w zero).
template <class D>
__device__ __forceinline__ V16 fp8_pack(V16 o, float qinv) {
    float x[8];
    D::set(x, o);
    u32 lo = 0u, hi = 0u;
#pragma unroll
    for (int i = 0; i < D::LANES && i < 4; ++i) lo |= quant_fp8(x[i], qinv) << (8 * i);
#pragma unroll
    for (int i = 4; i < D::LANES; ++i) hi |= quant_fp8(x[i], qinv) << (8 * (i - 4));
    return V16{lo, hi, 0u, 0u};
}

// Stores fp8_pack's D::LANES bytes at `at`.
template <class D>
__device__ __forceinline__ void st_fp8(u64 at, V16 q) {
    if (D::LANES == 8) {
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(at), "r"(q.x), "r"(q.y) : "memory");
    } else {
        asm volatile("st.global.u32 [%0], %1;" ::"l"(at), "r"(q.x) : "memory");
    }
}

// Loads D::LANES bytes of FP8 from a peer's slot (volatile, as ld_poll_v16) into .x (.y).
template <class D>
__device__ __forceinline__ V16 ld_fp8_peer(const V16* p) {
    V16 q = {0u, 0u, 0u, 0u};
    if (D::LANES == 8) {
        asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(q.x), "=r"(q.y) : "l"(p));
    } else {
        asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(q.x) : "l"(p));
    }
    return q;
}

template <class D>
__device__ __forceinline__ void store_fp8(u64 output, u64 v, V16 o, float qinv) {
    st_fp8<D>(output + v * (u64)D::LANES, fp8_pack<D>(o, qinv));
}

// NVFP4 (TPAR_NORM_NVFP4), vLLM's scaled_fp4_quant of the normalised output with the
// device f32 global scale gs (docs/cuda.md "NVFP4 output"; references: tpar::testing::
// quant_nvfp4, tpar.testing.quant_nvfp4): per block of 16 consecutive elements of a row,
// amax = max |o_i|; sf = e4m3fn(gs * (amax * f32(1/6))) (clamped to 448, RNE: quant_fp8
// with qinv 1); os = 1 / (f32(sf) * (1 / gs)) with exact IEEE reciprocals (0 where a divisor
// is 0), where vLLM's kernel uses rcp.approx.ftz; each value e2m1(o_i * os): |y| clamped to
// 6, round to nearest even on {0, 0.5, 1, 1.5, 2, 3, 4, 6}, the sign kept (NaN: 0; amax
// ignores NaN, as fmaxf). Two
// values a byte, the even element in the low nibble; the block's scale byte at
// nvfp4_sf_offset, the scale tensor's padding 0 (nvfp4_zero_padding: at the kernel's start,
// apart from the vectors). A block spans 16 / D::LANES vectors, which the fused kernels hand to
// adjacent lanes of one warp (tiles: a warp's 32 consecutive vectors, lane l vector
// 32 t + l) and add_rmsnorm.cu to adjacent threads: the block's amax meets over those lanes
// (shfl with their mask; every lane of the block takes part, as every lane of the row's
// vectors does). Software conversion: no sm_100a-only cvt.
#define TPAR_NVFP4_BLOCK 16u

// The e2m1 code (sign bit 8) of y: the count of rounding boundaries |y| passes, ties to the
// even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); past 5:
// 6 (saturated); NaN passes none and gives 0 whatever its sign bit (a NaN's sign is not
// portable: the GPU's arithmetic returns the canonical, positive NaN).
__device__ __forceinline__ u32 e2m1_rne(float y) {
    const float m = fabsf(y);
    const u32 q = (u32)(m > 0.25f) + (u32)(m >= 0.75f) + (u32)(m > 1.25f) + (u32)(m >= 1.75f) + (u32)(m > 2.5f) + (u32)(m >= 3.5f) + (u32)(m > 5.0f);
    return (m == m ? (f32_as_u32(y) >> 28) & 0x8u : 0u) | q;
}

// The value of e4m3fn bits b (b not NaN: quant_fp8 clamps).
__device__ __forceinline__ float fp8_e4m3_value(u32 b) {
    const u32 m = b & 0x7fu;
    const float v = m >= 8u ? u32_as_f32((m << 20) + (120u << 23)) : fmul_rn((float)m, 0.001953125f);  // subnormals: m 2^-9
    return (b & 0x80u) ? -v : v;
}

// Where the scale of block kb of row `row` goes: vLLM's 128x4-swizzled layout (rows padded to
// 128, scale columns to 4): [row / 128][kb / 4][row % 32][(row / 32) % 4][kb % 4].
__device__ __forceinline__ u64 nvfp4_sf_offset(u32 row, u32 kb, u32 hidden) {
    const u32 ktiles = (hidden / TPAR_NVFP4_BLOCK + 3u) / 4u;
    return ((u64)(row >> 7) * ktiles + (kb >> 2)) * 512ull + (u64)((row & 31u) * 16u + ((row >> 5) & 3u) * 4u + (kb & 3u));
}

// 1 / gs, the exact IEEE reciprocal (0 where gs is 0): a per-call constant, handed to
// nvfp4_pack. NormOut takes it beside qinv, once a row (once a thread in practice), not once
// a vector (the compiler cannot hoist it out of the norm loop, whose row changes reload the
// scale); add_rmsnorm.cu at each store (its registers are full there).
__device__ __forceinline__ float nvfp4_rg(float gs) { return gs == 0.0f ? 0.0f : fdiv_rn(1.0f, gs); }

// One normalised vector o quantized to NVFP4 with the global scale gs (rg = nvfp4_rg(gs)): .x
// its e2m1 codes (D::LANES nibbles), .y its block's scale byte. Every lane of the block must call it.
template <class D>
__device__ __forceinline__ V16 nvfp4_pack(V16 o, float gs, float rg) {
    constexpr u32 G = TPAR_NVFP4_BLOCK / (u32)D::LANES;  // lanes of a block: 2 (16-bit), 4 (f32)
    float x[8];
    D::set(x, o);
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) m = fmaxf(m, fabsf(x[i]));
    const u32 lane = threadIdx.x & 31u;
    const u32 mask = ((1u << G) - 1u) << (lane & ~(G - 1u));
#pragma unroll
    for (u32 s = 1u; s < G; s <<= 1) {
        float p;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, %3;" : "=f"(p) : "f"(m), "r"(s), "r"(mask));
        m = fmaxf(m, p);
    }
    const u32 sf = quant_fp8(fmul_rn(gs, fmul_rn(m, 0.16666667163372039795f)), 1.0f);  // f32(1/6) = 0x3e2aaaab
    const float d = fmul_rn(fp8_e4m3_value(sf), rg);
    const float os = d == 0.0f ? 0.0f : fdiv_rn(1.0f, d);
    u32 q = 0u;
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) q |= e2m1_rne(fmul_rn(x[i], os)) << (4 * i);
    return V16{q, sf, 0u, 0u};
}

// The scale tensor's padding (rows from `rows` up to a multiple of 128, scale columns from
// hidden / 16 up to a multiple of 4) is zeroed, as vLLM's kernel does (its scale tensor is
// allocated empty). It depends on no data of the call, so it is stored at the kernel's start
// (the fused entry, frame.cuh TPAR_FENTRY; add_rmsnorm.cu), while the all-reduce waits for
// its peers, not beside each vector on the norm's dependent tail (where a strided loop over
// the tensor's words, with a division per word, cost about 2.4 us for one row of 7168 on an
// H200: 127 padded rows x 448 bytes). Only after the PDL wait: the previous kernel in the
// stream may still read the tensor. Every thread of the grid (t of nt) takes a strided share;
// the padding's stores never touch a real scale byte (other threads' byte stores), so no
// ordering is needed between them. Word w of the tensor holds row (w / 128 / k_tiles) * 128 +
// (w % 4) * 32 + (w / 4) % 32 and blocks 4 ((w / 128) % k_tiles) + 0..3, so:
// - padded rows lie in the last 128-row tile alone (where rows % 128 != 0): its k_tiles
//   512-byte tiles are 32 k_tiles 16-byte chunks q (tile q / 32, words 4q..4q+3 from the row
//   tile's start), chunk q holding rows c, 32 + c, 64 + c, 96 + c of the row tile (c = q %
//   32): all padding where c >= rows % 128 (one 16-byte store; four word stores where
//   scale_out is only 4-byte aligned, which is all the launcher requires), else the padded
//   ones among its last three words, stored whole. No division: q counts the chunks.
// - a real row's padded blocks (hidden / 16 not a multiple of 4: add_rmsnorm.cu's shapes
//   only, a fused row is whole tiles) are the last k tile's bytes hidden / 16 % 4 .. 3 of its
//   word, stored byte by byte.
__device__ __forceinline__ void nvfp4_zero_padding(const TparNorm& n, u32 rows, u32 t, u32 nt) {
    const u32 nb = n.hidden / TPAR_NVFP4_BLOCK;
    const u32 ktiles = (nb + 3u) / 4u;
    const u32 rr = rows & 127u;  // real rows of the last row tile (0: no padded row)
    if (rr != 0u) {
        const u64 base = n.scale_out + (u64)(rows >> 7) * ktiles * 512ull;
        const bool v4 = (n.scale_out & 15ull) == 0ull;  // the same in every thread
        for (u32 q = t; q < ktiles * 32u; q += nt) {
            const u32 c = q & 31u;
            const u64 at = base + (u64)q * 16ull;
            if (c >= rr && v4) {
                asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(0u), "r"(0u), "r"(0u), "r"(0u) : "memory");
                continue;
            }
#pragma unroll
            for (u32 k = 0u; k < 4u; ++k)
                if (k * 32u + c >= rr) asm volatile("st.global.u32 [%0], %1;" ::"l"(at + k * 4u), "r"(0u) : "memory");
        }
    }
    if (nb & 3u) {
        for (u32 r = t; r < rows; r += nt) {
            const u64 at = n.scale_out + nvfp4_sf_offset(r, nb, n.hidden);  // the row's first padded block
            for (u32 kk = nb & 3u; kk < 4u; ++kk) asm volatile("st.global.u8 [%0], %1;" ::"l"(at + (kk - (nb & 3u))), "h"((unsigned short)0) : "memory");
        }
    }
}

// The fused entry's and add_rmsnorm.cu's call of nvfp4_zero_padding (NVFP4 patterns only: a
// uniform branch), the grid's every thread: the PDL wait first (idempotent, the kernel's own
// waits are then no-ops), rows = the call's vectors / the row's.
template <class D>
__device__ __forceinline__ void nvfp4_zero_padding_grid(const TparArgs& a, const TparNorm& n) {
    if (!(n.flags & TPAR_NORM_NVFP4)) return;
    pdl_wait();
    const u32 rows = (u32)(a.count / (u64)D::LANES) / (n.hidden / (u32)D::LANES);  // 32-bit: a call's vectors are far below 2^32
    nvfp4_zero_padding(n, rows, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// Stores nvfp4_pack's form p of vector v: its D::LANES / 2 bytes at output + v * D::LANES / 2,
// and from the block's first vector the scale byte at its swizzled place in scale_out (the
// padding is nvfp4_zero_padding's, at the kernel's start).
template <class D>
__device__ __forceinline__ void store_nvfp4(const TparArgs& a, const TparNorm& n, u64 v, V16 p) {
    const u64 at = a.output + v * (u64)(D::LANES / 2);
    if (D::LANES == 8) asm volatile("st.global.u32 [%0], %1;" ::"l"(at), "r"(p.x) : "memory");
    else asm volatile("st.global.u16 [%0], %1;" ::"l"(at), "h"((unsigned short)p.x) : "memory");
    const u32 vrow = n.hidden / (u32)D::LANES;
    const u32 vi = (u32)v;  // 32-bit index arithmetic: a call's vectors are far below 2^32
    const u32 rw = vi / vrow, j = vi - rw * vrow;
    if (j % (TPAR_NVFP4_BLOCK / (u32)D::LANES) == 0u) {
        const u64 sa = n.scale_out + nvfp4_sf_offset(rw, j / (TPAR_NVFP4_BLOCK / (u32)D::LANES), n.hidden);
        asm volatile("st.global.u8 [%0], %1;" ::"l"(sa), "h"((unsigned short)p.y) : "memory");
    }
}

// One normalised vector v (r the updated residual, w the weight) stored as the pattern asks:
// the dtype, FP8 with qinv (1 / scale), or NVFP4 with qinv (the global scale) and rg (its
// reciprocal, nvfp4_rg).
template <class D>
__device__ __forceinline__ void store_norm(const TparArgs& a, const TparNorm& n, u64 v, V16 r, V16 w, float inv, float qinv, float rg) {
    const V16 o = norm_vec<D>(r, w, inv, n.flags);
    if (n.flags & TPAR_NORM_FP8) store_fp8<D>(a.output, v, o, qinv);
    else if (n.flags & TPAR_NORM_NVFP4) store_nvfp4<D>(a, n, v, nvfp4_pack<D>(o, qinv, rg));
    else store_output<D>(a, v, o);
}

// qinv from a pattern's scale sc: FP8 1 / sc (f32, rounded once, as vLLM's 1.0f / *scale),
// NVFP4 the global scale itself.
__device__ __forceinline__ float quant_arg(const TparNorm& n, float sc) {
    return (n.flags & TPAR_NORM_NVFP4) ? sc : fdiv_rn(1.0f, sc);
}

// 1 / scale of an FP8 pattern (f32, rounded once, as vLLM's 1.0f / *scale).
__device__ __forceinline__ float ld_scale(const TparNorm& n) {
    float s;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(s) : "l"(n.scale));
    return s;
}

// The row's tiles inside a thread-block cluster (sm_90 and later; the launcher's choice,
// cuda/launch.rs `row_cluster`): where every block holds whole tiles of exactly one row and
// a row's blocks are one cluster (one vector a thread: block b of the grid covers vectors
// [b t, (b + 1) t), row b / c), each warp sends its tile's sum straight into every block of
// the cluster (st.async into distributed shared memory, completing bytes on that block's
// mbarrier), and a block waits on its own mbarrier, in its own shared memory, until the
// row's every tile has landed: one trip between SMs instead of a store to L2 and the polls
// that read it back. The same tiles, summed in the same tree: the same bits as the global
// path. Set-up, at the kernel's entry (before griddepcontrol.wait: with PDL it runs while the
// previous kernel finishes): thread 0 initialises the mbarrier (one arrival, its own, with
// the row's bytes expected), then the cluster barrier (whose acquire also invalidates L1,
// which nothing has used yet there; before the first send it was on the sum's path). A block leaves only
// after every tile sent to it has landed (its wait), and every thread sends its tile
// whatever happened before (a failed wait included), so no send outlives its target.
#if TPAR_FUSED_ON
// Both fused variants stage a thread's first residual and weight here (NormOut::stage).
__shared__ V16 tpar_early[2][TPAR_THREADS];  // [0] residual, [1] weight: thread t's slot t

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif  // TPAR_FUSED_ON

#if TPAR_SPREAD
__shared__ u64 tpar_pending[TPAR_THREADS / 32u][TPAR_PENDING_TILES];  // a warp's unpublished tile words
#endif

#if TPAR_CLUSTER_ROWS
__shared__ float tpar_row_tiles[TPAR_ROW_TILES_MAX];
__shared__ __align__(8) u64 tpar_row_bar;

__device__ __forceinline__ u32 cluster_ctas() {
    u32 n;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
__device__ __forceinline__ u32 cluster_cta() {
    u32 n;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(n));
    return n;
}
// At the kernel's entry, every thread once: thread 0 initialises the mbarrier for `bytes` of
// tiles (its fence makes that visible to the cluster), then the cluster barrier, after which
// every block of the cluster has its mbarrier ready for sends.
__device__ __forceinline__ void cluster_rows_open(u32 bytes) {
    if (threadIdx.x == 0) {
        const u32 bar = smem_u32(&tpar_row_bar);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
// Tile `ti`'s sum into block `cta` of the cluster (its tile array and its mbarrier).
__device__ __forceinline__ void cluster_rows_send(u32 ti, u32 cta, float t) {
    u32 ra, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(smem_u32(&tpar_row_tiles[ti])), "r"(cta));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_u32(&tpar_row_bar)), "r"(cta));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(ra), "r"(f32_as_u32(t)), "r"(rb) : "memory");
}
// Whether every tile has landed here (one bounded try).
__device__ __forceinline__ bool cluster_rows_ready() {
    u32 ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok) : "r"(smem_u32(&tpar_row_bar)) : "memory");
    return ok != 0u;
}
// The row's sum from all its tiles, each lane alone (no shuffles): tiles in shared memory,
// at most 32, padded with +0.0 to 32; the same tree as row_sum's.
__device__ __forceinline__ float row_sum_local(const float* tiles, u32 n) {
    float x[32];
#pragma unroll
    for (u32 i = 0; i < 32u; ++i) x[i] = i < n ? tiles[i] : 0.0f;
#pragma unroll
    for (u32 s = 1u; s < 32u; s <<= 1) {
#pragma unroll
        for (u32 i = 0; i < 32u; i += 2u * s) x[i] = fadd_rn(x[i], x[i + s]);
    }
    return x[0];
}
#endif  // TPAR_CLUSTER_ROWS

// The plain epilogue: the sum is the output.
template <class D>
struct PlainOut {
    __device__ static constexpr bool fused() { return false; }
    __device__ __forceinline__ void prefetch(const TparArgs&, u64) {}
    __device__ __forceinline__ void stage(const TparArgs&, u64) {}
    __device__ __forceinline__ void transform(const TparArgs&, u64, V16&) const {}
    __device__ __forceinline__ void put(const TparArgs& a, const Frame&, u64 v, V16 r) { store_output<D>(a, v, r); }
    __device__ __forceinline__ void norm(const TparArgs&, Frame&, u64) {}
    __device__ __forceinline__ void flush(const TparArgs&, const Frame&) {}
    __device__ __forceinline__ void set_spread(bool) {}
    __device__ __forceinline__ u32 row_vecs() const { return 0u; }
    __device__ __forceinline__ void norm_export(const TparArgs&, Frame&, u64, V16*) {}
    __device__ __forceinline__ V16 load_export(const V16*) const { return V16{0u, 0u, 0u, 0u}; }
    __device__ __forceinline__ void put_gathered(const TparArgs&, u64, V16, V16) const {}
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
    float qinv;     // FP8 patterns: 1 / scale; NVFP4: the global scale
    float rg;       // NVFP4: 1 / the global scale (nvfp4_rg, with qinv: once a row, not a vector)
    u64 early_v;    // the vector stage() copied into shared memory (~0: none)
#if TPAR_SPREAD
    u32 npend;      // tile words this warp keeps in tpar_pending (the same in every lane)
    bool spread;    // the kernel's choice, before any put: the norm spread over the grid
#endif
#if TPAR_CLUSTER_ROWS
    u32 ncta;       // > 1: launched as clusters, a row's blocks one cluster
#endif

    __device__ __forceinline__ explicit NormOut(const TparNorm& n_)
        : n(n_), vrow(n_.hidden / (u32)D::LANES), eps(u32_as_f32(n_.eps_bits)), kept_v(~0ull), row(~0u), inv(0.0f), qinv(0.0f), rg(0.0f) {
        kept_r = kept_w = V16{0u, 0u, 0u, 0u};
        early_v = ~0ull;
#if TPAR_SPREAD
        npend = 0u;
        spread = false;
#endif
#if TPAR_CLUSTER_ROWS
        ncta = cluster_ctas();
        if (ncta > 1u) cluster_rows_open(vrow / TPAR_TILE_VECS * 4u);  // under the previous kernel with PDL
#endif
    }

    __device__ __forceinline__ const V16* weight_of(u64 v) const { return (const V16*)n.weight + (u32)v % vrow; }

    // Two-shot push's (the one kernel that does not stage): before the all-reduce waits, v's
    // residual and weight into L1 (v past the message: nothing; no registers held across
    // the all-reduce, whose default variant uses 116-128 of a thread's 128).
    __device__ __forceinline__ void prefetch(const TparArgs& a, u64 v) {
        if (v >= vecs_for<D>(a.count)) return;
        if (n.flags & TPAR_NORM_RESIDUAL) asm volatile("prefetch.global.L1 [%0];" ::"l"((const V16*)n.residual + v));
        asm volatile("prefetch.global.L1 [%0];" ::"l"(weight_of(v)));
    }
    // The other kernels' copy of their first vector's residual and weight into this
    // thread's shared-memory slot (cp.async: in flight beside the waits without holding
    // registers across them; an L1 prefetch does not survive the pull kernels' barrier,
    // whose acquire invalidates L1), issued once this thread's own data are out (the copy
    // into the exposed buffer, or the sends), so that it rides beside the waits, not the
    // copy; in the pull kernels after the thread's start signal (frame.cuh
    // barrier_block_then), whose release fence would otherwise wait for it. v: a vector
    // this thread transforms (its copy is waited for there), or past the message.
    __device__ __forceinline__ void stage(const TparArgs& a, u64 v) {
        if (v >= vecs_for<D>(a.count)) return;
        early_v = v;
        if (n.flags & TPAR_NORM_RESIDUAL) cp_async_16(&tpar_early[0][threadIdx.x], (const V16*)n.residual + v);
        cp_async_16(&tpar_early[1][threadIdx.x], weight_of(v));
        cp_async_commit();
    }

    // Without a residual (TPAR_NORM_RESIDUAL clear) r is the sum itself.
    __device__ __forceinline__ void transform(const TparArgs&, u64 v, V16& s) const {
        if (v == early_v) {
            cp_async_wait_all();  // this thread's own copies: no barrier needed
            if (n.flags & TPAR_NORM_RESIDUAL) s = add_residual<D>(s, tpar_early[0][threadIdx.x]);
            return;
        }
        if (n.flags & TPAR_NORM_RESIDUAL) s = add_residual<D>(s, ld_v16((const V16*)n.residual + v));
    }

    // Stores the updated residual and publishes its tile's sum (lane 0). Every lane of the
    // warp calls it for the same tile.
    __device__ __forceinline__ void put(const TparArgs& a, const Frame& f, u64 v, V16 r) {
        st_v16((V16*)n.residual_out + v, r);
        if (kept_v == ~0ull) {
            kept_v = v;
            kept_r = r;
            kept_w = v == early_v ? tpar_early[1][threadIdx.x] : ld_v16(weight_of(v));  // staged (after transform's wait), or in flight while the tiles come
        }
        const float t = warp_tree(vec_sumsq<D>(r));
#if TPAR_CLUSTER_ROWS
        if (ncta > 1u) {  // one vector a thread (the launcher's condition): one put a thread
            const u32 lane = threadIdx.x & 31u;
            if (lane < ncta) cluster_rows_send(cluster_cta() * (blockDim.x >> 5) + (threadIdx.x >> 5), lane, t);
            return;
        }
#endif
#if TPAR_SPREAD
        if (spread) {
            if ((threadIdx.x & 31u) == 0u) tpar_pending[threadIdx.x >> 5][npend] = (v / TPAR_TILE_VECS) << 32 | f32_as_u32(t);
            if (++npend == TPAR_PENDING_TILES) flush(a, f);
            return;
        }
#endif
        if ((threadIdx.x & 31u) == 0u) publish_tile(a, f, v / TPAR_TILE_VECS, f32_as_u32(t));
    }

    // Tile `ti`'s sum (f32 bits) into this rank's scratch: one 8-byte store of the bits and
    // the call's generation (epoch + 1), so a reader sees both or neither.
    __device__ __forceinline__ static void publish_tile(const TparArgs& a, const Frame& f, u64 ti, u32 bits) {
        const u64 word = ((u64)(f.epoch + 1u) << 32) | bits;
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(norm_scratch(a) + ti), "l"(word));
    }

    // Two-shot pull's choice, before its first put: its norm spread over the whole grid.
    __device__ __forceinline__ void set_spread(bool on) {
#if TPAR_SPREAD
        spread = on;
#else
        (void)on;
#endif
    }

    // The spread norm's publication of this warp's kept tiles: every lane's stores so far
    // (the updated residuals) ordered before the words by the warp barrier and lane 0's
    // release fence. Every lane of the warp calls it (the kernel, after its last put).
    __device__ __forceinline__ void flush(const TparArgs& a, const Frame& f) {
#if TPAR_SPREAD
        if (!spread) return;  // the same in every lane
        __syncwarp();
        if ((threadIdx.x & 31u) == 0u && npend > 0u) {
            fence_acq_rel_gpu();
            for (u32 i = 0; i < npend; ++i) {
                const u64 e = tpar_pending[threadIdx.x >> 5][i];  // tile << 32 | sum's bits
                publish_tile(a, f, e >> 32, (u32)e);
            }
        }
        npend = 0u;
        __syncwarp();
#else
        (void)a;
        (void)f;
#endif
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
#if TPAR_SPREAD  // spread: acquire, the tile's writer released its residuals before the word (no fence after: it would wait for this thread's own stores)
                if ((pending & (1u << u)) && spread) asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(w[u]) : "l"(base + first + u) : "memory");
                else
#endif
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
#if TPAR_SPREAD
        if (spread) __syncwarp();  // every lane's acquired tiles ordered before every lane's loads of the row
#endif
        return inv_rms(row_sum(e, k), n.hidden, eps);
    }

    // The cluster path's 1 / rms: waits on this block's mbarrier (whatever `f.ok` says:
    // every tile sent here lands, and the block must not leave before), bounded by the
    // call's timeout; then every lane sums the row's tiles from shared memory.
#if TPAR_CLUSTER_ROWS
    __device__ __forceinline__ float row_inv_cluster(const TparArgs& a, Frame& f) const {
        u64 start = 0ull;
        u32 polls = 0u;
        while (!cluster_rows_ready()) {
            if (++polls % TPAR_POLLS_PER_CLOCK != 0u) continue;
            const u64 now = globaltimer_ns();
            if (start == 0ull) {
                start = now;
            } else if (now - start > a.timeout_ns) {
                if (f.ok) record_timeout(a.err, a.state, a.rank, f.epoch, now - start, a.rank, TPAR_PHASE_NORM_POLL);
                f.ok = false;
                break;
            }
        }
        const u32 tiles = vrow / TPAR_TILE_VECS;
        if (tiles <= 32u) return inv_rms(row_sum_local(tpar_row_tiles, tiles), n.hidden, eps);
        const u32 k = tiles_per_lane(tiles);
        const u32 first = k * (threadIdx.x & 31u);
        float e[TPAR_ROW_TILES_PER_LANE];
#pragma unroll
        for (u32 u = 0; u < TPAR_ROW_TILES_PER_LANE; ++u) e[u] = u < k && first + u < tiles ? tpar_row_tiles[first + u] : 0.0f;
        return inv_rms(row_sum(e, k), n.hidden, eps);
    }
#endif

    // inv, qinv and rg for vector v's row: its tiles waited for when the row changes.
    __device__ __forceinline__ void row_scale(const TparArgs& a, Frame& f, u64 v) {
        const u32 rw = (u32)v / vrow;
        if (rw != row) {  // the same for the whole warp: a tile lies in one row
            row = rw;
            const float sc = (n.flags & (TPAR_NORM_FP8 | TPAR_NORM_NVFP4)) ? ld_scale(n) : 1.0f;  // in flight beside the polls
            inv = row_inv(a, f, rw);
            qinv = quant_arg(n, sc);
            if (n.flags & TPAR_NORM_NVFP4) rg = nvfp4_rg(sc);
        }
    }

    // Normalises vector v (after every put of this thread) into the output.
    __device__ __forceinline__ void norm(const TparArgs& a, Frame& f, u64 v) {
#if TPAR_CLUSTER_ROWS
        if (ncta > 1u) {  // one row, one vector a thread
            if (row == ~0u) {
                row = 0u;
                const float sc = (n.flags & (TPAR_NORM_FP8 | TPAR_NORM_NVFP4)) ? ld_scale(n) : 1.0f;  // in flight beside the wait
                inv = row_inv_cluster(a, f);
                qinv = quant_arg(n, sc);
                if (n.flags & TPAR_NORM_NVFP4) rg = nvfp4_rg(sc);
            }
        } else
#endif
        {
            row_scale(a, f, v);
        }
        const bool kept = v == kept_v;
        const V16 r = kept ? kept_r : ld_v16((const V16*)n.residual_out + v);  // this thread's own store
        const V16 w = kept ? kept_w : ld_v16(weight_of(v));
        store_norm<D>(a, n, v, r, w, inv, qinv, rg);
    }

    // The rows variant (TPAR_ROWS_OWNED: a rank's chunk is whole rows, so all of a row's
    // tiles are this rank's puts): as norm, and the finished output also into
    // `slot` (this rank's workspace, vector v's own 16 bytes: the dtype's vector, for FP8
    // its D::LANES bytes at the start, for NVFP4 nvfp4_pack's .x and .y), where the peers' all-gather reads it. Only this
    // thread reads or writes vector v's slot in this call before the barrier that publishes it.
    __device__ __forceinline__ void norm_export(const TparArgs& a, Frame& f, u64 v, V16* slot) {
        row_scale(a, f, v);
        const bool kept = v == kept_v;
        const V16 r = kept ? kept_r : ld_v16((const V16*)n.residual_out + v);  // this thread's own store
        const V16 w = kept ? kept_w : ld_v16(weight_of(v));
        const V16 o = norm_vec<D>(r, w, inv, n.flags);
        if (n.flags & TPAR_NORM_FP8) {
            const V16 q = fp8_pack<D>(o, qinv);
            st_fp8<D>(a.output + v * (u64)D::LANES, q);
            st_fp8<D>((u64)slot, q);
        } else if (n.flags & TPAR_NORM_NVFP4) {  // the codes and the block's scale byte: .x, .y
            const V16 q = nvfp4_pack<D>(o, qinv, rg);
            store_nvfp4<D>(a, n, v, q);
            asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"((u64)slot), "r"(q.x), "r"(q.y) : "memory");
        } else {
            store_output<D>(a, v, o);
            st_v16(slot, o);
        }
    }

    // An owner's exported output (norm_export's `slot`, read after the barrier that
    // published it): the dtype's vector, or the FP8 bytes in .x (.y).
    __device__ __forceinline__ V16 load_export(const V16* p) const {
        if (n.flags & TPAR_NORM_FP8) return ld_fp8_peer<D>(p);
        if (n.flags & TPAR_NORM_NVFP4) {
            V16 q = {0u, 0u, 0u, 0u};
            asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(q.x), "=r"(q.y) : "l"(p));
            return q;
        }
        return ld_poll_v16(p);
    }

    // Vector v of a row another rank owns, finished there: the updated residual r and the
    // normalised output o (load_export's form), stored as this rank's outputs.
    __device__ __forceinline__ void put_gathered(const TparArgs& a, u64 v, V16 r, V16 o) const {
        st_v16((V16*)n.residual_out + v, r);
        if (n.flags & TPAR_NORM_FP8) st_fp8<D>(a.output + v * (u64)D::LANES, o);
        else if (n.flags & TPAR_NORM_NVFP4) store_nvfp4<D>(a, n, v, o);
        else store_output<D>(a, v, o);
    }

    __device__ __forceinline__ u32 row_vecs() const { return vrow; }
};
