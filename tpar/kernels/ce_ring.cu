// ce_ring.cu — the kernels of the copy-engine path (`ce-ring`, tpar/src/algorithms/ce_ring.rs).
// Copy engines (cuMemcpyAsync, launched by the host: tpar/src/cuda/ce.rs) move every byte
// between ranks; these kernels only synchronise and compute:
//   ce_signal  after this rank's copies of a phase have completed (stream order): tells every
//              peer so, one 16-byte descriptor per (phase, piece, source) in the peer's flag
//              area (the call's generation, count and algorithm, check word; as frame.cuh's
//              call descriptors);
//   ce_wait    waits for every peer's descriptor of a phase, bounded by the call's deadline
//              (a timeout or a mismatched call is recorded like every kernel's: frame.cuh);
//   ce_quant   (lossy wire) this rank's chunks for the other owners, quantised into its stage;
//   ce_reduce  this rank's own chunk: the f32 sum over ranks in rank order 0..world-1, rounded
//              once (lossy wire: the peers' chunks dequantised, and the sum quantised into the
//              stage for the all-gather and dequantised into the output, as every peer does);
//   ce_finish  the gathered chunks of the other owners into the output (lossy: dequantised).
// Generations are per (phase, piece) and per role in this rank's own `gens` words, advanced
// by the kernel that uses them, so graphs replay with no host involvement.
//
// The wire codec is bit for bit tpar/src/algorithms/ce_wire.rs: the same f32 operations in
// the same order (explicit mul.rn / cvt.rni, never contracted; power-of-two scales: no division).
#include "common.cuh"

#define CE_MAX_PIECES 4u
#define CE_PHASES 3u  // 0: entry, 1: reduce-scatter, 2: all-gather
#define CE_QBLOCK 128u
#define CE_WIRE_EXACT 0u
#define CE_WIRE_FP8 1u
#define CE_WIRE_INT8 2u
// The copy-engine descriptors follow the call descriptors in the flag area (abi.rs:
// CE_FLAG_OFFSET): [phase][piece][src] x 16 bytes.
#define CE_FLAG_OFFSET (TPAR_DESC_OFFSET + 3u * TPAR_MAX_RANKS * 16u)
#define CE_PHASE_CODE_BASE 11u  // error records: 11 + phase (abi::phase_name)

struct CeArgs {
    TparArgs a;        // every rank's areas, this rank's state (err_claim) and error record, the call
    u64 gens;          // this rank's u32 generations: [role 0 send, 1 wait][phase][piece]
    u64 stage;         // this rank's local stage (lossy wire): [chunk][piece] slots
    u64 region;        // byte offset of the inbox in a data area; the gather area follows it
    u64 region_bytes;  // bytes of one inbox (= of one gather area)
    u64 slot_bytes;    // bytes of one slot: [rank][piece] in the inbox, gather area and stage
    u64 piece_v0;      // the piece's vectors [piece_v0, piece_v1)
    u64 piece_v1;
    u64 chunk_vecs;    // vectors per chunk of this piece (the last chunks may be shorter)
    u32 piece;
    u32 pieces;
    u32 phase;
    u32 wire;
};
// 416 = 336 (TparArgs, 8-aligned, its offsets checked by tpar_abi_offsets) + 8 x 8 + 4 x 4:
// no room for padding, so every offset follows from the order; cuda/ce.rs asserts the same
// offsets of its twin at compile time. Loading the module then needs no probe launch (it
// may happen while a stream is being captured).
static_assert(sizeof(CeArgs) == 416, "CeArgs size: keep in step with cuda/ce.rs");
static_assert(alignof(CeArgs) == 8, "CeArgs alignment");

// ---------------------------------------------------------------------------------------
// Geometry (algorithms/ce_ring.rs: Geometry::chunk, chunk_elems, slot_offset).

struct CeChunk {
    u64 v0, v1;  // vectors
    u64 e0, e1;  // elements
};
template <class D>
__device__ __forceinline__ CeChunk ce_chunk(const CeArgs& c, u32 owner) {
    CeChunk k;
    const u64 s = c.piece_v0 + (u64)owner * c.chunk_vecs;
    k.v0 = s < c.piece_v1 ? s : c.piece_v1;
    k.v1 = k.v0 + c.chunk_vecs < c.piece_v1 ? k.v0 + c.chunk_vecs : c.piece_v1;
    const u64 e0 = k.v0 * D::LANES, e1 = k.v1 * D::LANES;
    k.e0 = e0 < c.a.count ? e0 : c.a.count;
    k.e1 = e1 < c.a.count ? e1 : c.a.count;
    return k;
}
__device__ __forceinline__ u64 ce_slot_offset(const CeArgs& c, u32 r) { return ((u64)r * c.pieces + c.piece) * c.slot_bytes; }
// Slot [src] of `owner`'s inbox, and slot [chunk owner] of `owner`'s gather area.
__device__ __forceinline__ char* ce_inbox(const CeArgs& c, u32 owner, u32 src) {
    return (char*)c.a.data[owner] + c.region + ce_slot_offset(c, src);
}
__device__ __forceinline__ char* ce_gather(const CeArgs& c, u32 owner, u32 chunk) {
    return (char*)c.a.data[owner] + c.region + c.region_bytes + ce_slot_offset(c, chunk);
}
__device__ __forceinline__ char* ce_stage(const CeArgs& c, u32 chunk) { return (char*)c.stage + ce_slot_offset(c, chunk); }
__device__ __forceinline__ u64 ce_scales_offset(u64 n) { return (n + 15ull) / 16ull * 16ull; }
__device__ __forceinline__ V16* ce_flag_at(const CeArgs& c, u32 owner, u32 src) {
    return (V16*)((char*)c.a.flags[owner] + CE_FLAG_OFFSET) + ((c.phase * CE_MAX_PIECES + c.piece) * TPAR_MAX_RANKS + src);
}
// Whether this rank's call has already failed (a timeout or mismatch recorded, or the
// watchdog's claim): then the data kernels do nothing (the results are void anyway).
__device__ __forceinline__ bool ce_failed(const CeArgs& c) { return ld_volatile_u32(&((TparState*)c.a.state)->err_claim) != 0u; }

// ---------------------------------------------------------------------------------------
// The wire codec (ce_wire.rs).

__device__ __forceinline__ float ce_mul(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float ce_rint(float a) {  // round to nearest integer, ties to even
    float r;
    asm("cvt.rni.f32.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float ce_abs(float x) { return u32_as_f32(f32_as_u32(x) & 0x7fffffffu); }
#define CE_NAN_BITS 0x7fffffffu
#define CE_TINY_BITS 0x0d800000u  // 2^-100

__device__ __forceinline__ u32 ce_f32_to_e4m3(float x) {
    const u32 bits = f32_as_u32(x);
    const u32 sign = (bits >> 24) & 0x80u;
    if ((bits & 0x7fffffffu) > 0x7f800000u) return sign | 0x7fu;
    const float a = u32_as_f32(bits & 0x7fffffffu);
    if (a < 0.015625f) return sign | (u32)ce_rint(ce_mul(a, 512.0f));
    int e = (int)((bits >> 23) & 0xffu) - 127;
    const u32 mant = bits & 0x7fffffu;
    u32 m = mant >> 20;
    const u32 rest = mant & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) m += 1u;
    if (m == 8u) {
        m = 0u;
        e += 1;
    }
    const u32 code = ((u32)(e + 7) << 3) | m;
    return sign | (code < 0x7eu ? code : 0x7eu);
}
__device__ __forceinline__ float ce_e4m3_to_f32(u32 c) {
    const u32 e = (c >> 3) & 0xfu, m = c & 7u;
    if (e == 15u && m == 7u) return u32_as_f32(CE_NAN_BITS);
    const float mag = e == 0u ? ce_mul((float)m, u32_as_f32((u32)(127 - 9) << 23)) : ce_mul((float)(8u + m), u32_as_f32((e + 117u) << 23));
    return (c & 0x80u) ? -mag : mag;
}
__device__ __forceinline__ u32 ce_f32_to_i8(float v) {
    if (v != v) return 0x80u;
    float r = ce_rint(v);
    r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
    return (u32)(int)r & 0xffu;
}
__device__ __forceinline__ float ce_i8_to_f32(u32 c) {
    if (c == 0x80u) return u32_as_f32(CE_NAN_BITS);
    return (float)(int)(signed char)(unsigned char)c;
}
// A block's scale: the smallest power of two with amax / scale <= 448 (FP8) or 127 (INT8),
// from amax's bits, and its inverse (both exact): no division anywhere (an IEEE division
// also brings ptxas's slow-path call and a stack frame).
struct CeScale {
    float s, inv;
};
__device__ __forceinline__ float ce_pow2(int k) { return u32_as_f32((u32)(k + 127) << 23); }
template <u32 W>
__device__ __forceinline__ CeScale ce_block_scale(float amax) {
    CeScale r;
    if (amax != amax || amax > 3.40282346638528859812e38f) {
        r.s = r.inv = u32_as_f32(CE_NAN_BITS);
        return r;
    }
    if (amax < u32_as_f32(CE_TINY_BITS)) {
        r.s = r.inv = 0.0f;
        return r;
    }
    const u32 bits = f32_as_u32(amax);
    const int e = (int)((bits >> 23) & 0xffu) - 127;
    const u32 m = bits & 0x7fffffu;
    const int k = W == CE_WIRE_INT8 ? e - 6 + (m > 0x7e0000u ? 1 : 0) : e - 8 + (m > 0x600000u ? 1 : 0);
    r.s = ce_pow2(k);
    r.inv = ce_pow2(-k);
    return r;
}
template <u32 W>
__device__ __forceinline__ u32 ce_quantise(float x, CeScale sc) {
    if (sc.s == 0.0f) return 0u;
    const float v = ce_mul(x, sc.inv);
    return W == CE_WIRE_INT8 ? ce_f32_to_i8(v) : ce_f32_to_e4m3(v);
}
template <u32 W>
__device__ __forceinline__ float ce_dequantise(u32 q, float scale) {
    return ce_mul(W == CE_WIRE_INT8 ? ce_i8_to_f32(q) : ce_e4m3_to_f32(q), scale);
}
__device__ __forceinline__ void ce_amax(float& m, float x) {
    const float a = ce_abs(x);
    if (a > m) m = a;
}

// A vector's wire bytes (one per lane; lane i in byte i): LANES <= 8 bytes.
template <class D>
__device__ __forceinline__ u64 ce_load_codes(const char* payload, u64 byte) {
    return D::LANES == 8 ? *(const u64*)(payload + byte) : (u64) * (const u32*)(payload + byte);
}
template <class D>
__device__ __forceinline__ void ce_store_codes(char* payload, u64 byte, u64 codes) {
    if (D::LANES == 8) *(u64*)(payload + byte) = codes;
    else *(u32*)(payload + byte) = (u32)codes;
}

// ---------------------------------------------------------------------------------------
// Synchronisation (one block of 32 threads; thread q speaks to rank q).

extern "C" __global__ void __launch_bounds__(32) ce_signal(const CeArgs c) {
    u32* gen_word = (u32*)c.gens + (0u * CE_PHASES + c.phase) * CE_MAX_PIECES + c.piece;
    const u32 gen = *gen_word + 1u;
    const u32 q = threadIdx.x;
    if (q < c.a.world && q != c.a.rank) {
        // This rank's copies of the phase completed before the kernel started (stream order
        // or an event); the fence orders everything before it ahead of the descriptor.
        fence_sc_sys();
        st_volatile_v16(ce_flag_at(c, q, c.a.rank), desc_of(c.a, gen));
    }
    block_sync();
    if (q == 0u) *gen_word = gen;
}

extern "C" __global__ void __launch_bounds__(32) ce_wait(const CeArgs c) {
    u32* gen_word = (u32*)c.gens + (1u * CE_PHASES + c.phase) * CE_MAX_PIECES + c.piece;
    const u32 gen = *gen_word + 1u;
    const u32 q = threadIdx.x;
    if (q < c.a.world && q != c.a.rank) {
        Frame f;
        f.epoch = gen;
        f.buf = 0u;
        f.deadline_ns = 0ull;
        f.ok = true;
        f.prev_kind = TPAR_KIND_NONE;
        f.prev_nvec = 0ull;
        const V16* slot = ce_flag_at(c, c.a.rank, q);
        u32 polls = 0u;
        while (true) {
            const V16 d = ld_volatile_v16(slot);
            if (desc_is_for(d, gen)) {
                if (c.a.desc_code != 0u) desc_compare(c.a, f, q, d);
                break;
            }
            if (!still_waiting(c.a, f, polls, q, CE_PHASE_CODE_BASE + c.phase)) break;
        }
        fence_sc_sys();  // the peer's data, landed before its descriptor, after it here
    }
    block_sync();
    if (q == 0u) *gen_word = gen;
}

// Skewed-rank test hook (emulated ranks): this rank's call starts late.
extern "C" __global__ void __launch_bounds__(32) ce_pause(const CeArgs c) { test_pause(c.a); }

// ---------------------------------------------------------------------------------------
// Data kernels (grid-stride loops; any grid).

// Lossy wire: this rank's chunk for every other owner, block by block into its stage slot.
template <class D, u32 W>
__device__ __forceinline__ void ce_quant(const CeArgs& c) {
    if (ce_failed(c)) return;
    const u64 t0 = global_tid(), stride = grid_threads();
    const u64 qvec = CE_QBLOCK / D::LANES;
    for (u32 o = 0; o < c.a.world; ++o) {
        if (o == c.a.rank) continue;
        const CeChunk k = ce_chunk<D>(c, o);
        const u64 n = k.e1 > k.e0 ? k.e1 - k.e0 : 0ull;
        char* payload = ce_stage(c, o);
        float* scales = (float*)(payload + ce_scales_offset(n));
        for (u64 b = t0; b * CE_QBLOCK < n; b += stride) {
            const u64 bv0 = k.v0 + b * qvec, bv1 = bv0 + qvec < k.v1 ? bv0 + qvec : k.v1;
            float m = 0.0f, acc[8];
            for (u64 v = bv0; v < bv1; ++v) {
                D::set(acc, load_input<D>(c.a, v));
#pragma unroll
                for (int i = 0; i < D::LANES; ++i) ce_amax(m, acc[i]);
            }
            const CeScale scale = ce_block_scale<W>(m);
            for (u64 v = bv0; v < bv1; ++v) {
                D::set(acc, load_input<D>(c.a, v));
                u64 codes = 0ull;
#pragma unroll
                for (int i = 0; i < D::LANES; ++i) codes |= (u64)ce_quantise<W>(acc[i], scale) << (8 * i);
                ce_store_codes<D>(payload, (v - k.v0) * D::LANES, codes);
            }
            scales[b] = scale.s;
        }
    }
}

// Rank q's vector v of my chunk k (exact): my input, or slot [q] of my inbox.
template <class D>
__device__ __forceinline__ V16 ce_load_exact(const CeArgs& c, const CeChunk& k, u32 q, u64 v) {
    return q == c.a.rank ? load_input<D>(c.a, v) : *((const V16*)ce_inbox(c, c.a.rank, q) + (v - k.v0));
}

// The same on a lossy wire: a peer's codes dequantised with its block's scale.
template <class D, u32 W>
__device__ __forceinline__ void ce_add_wire(const CeArgs& c, const CeChunk& k, float (&acc)[8], u32 q, u64 v, u64 b, u64 sc_off) {
    if (q == c.a.rank) {
        acc_rank<D>(acc, q, load_input<D>(c.a, v));
        return;
    }
    const char* slot = ce_inbox(c, c.a.rank, q);
    const float scale = ((const float*)(slot + sc_off))[b];
    const u64 codes = ce_load_codes<D>(slot, (v - k.v0) * D::LANES);
#pragma unroll
    for (int i = 0; i < D::LANES; ++i) {
        const float x = ce_dequantise<W>((u32)(codes >> (8 * i)) & 0xffu, scale);
        acc[i] = q == 0u ? x : acc[i] + x;
    }
}

// Ranks are loaded CE_GROUP at a time (the loads of a group in flight together) and added
// in rank order: all sixteen in flight spilled on sm_80.
#define CE_GROUP 4u
template <class D>
__device__ __forceinline__ void ce_reduce_exact(const CeArgs& c, const CeChunk& k) {
    const u64 t0 = global_tid(), stride = grid_threads();
    for (u64 v = k.v0 + t0; v < k.v1; v += stride) {
        float acc[8];
#pragma unroll 1
        for (u32 g = 0; g < c.a.world; g += CE_GROUP) {
            V16 x[CE_GROUP];
#pragma unroll
            for (u32 u = 0; u < CE_GROUP; ++u) {
                if (g + u < c.a.world) x[u] = ce_load_exact<D>(c, k, g + u, v);
            }
#pragma unroll
            for (u32 u = 0; u < CE_GROUP; ++u) {
                if (g + u < c.a.world) acc_rank<D>(acc, g + u, x[u]);
            }
        }
        store_output<D>(c.a, v, D::pack(acc));
    }
}

// Lossy wire: one thread per block of CE_QBLOCK elements; the sums are computed twice (the
// block's largest magnitude first), the same adds in the same order both times.
template <class D, u32 W>
__device__ __forceinline__ void ce_reduce_wire(const CeArgs& c, const CeChunk& k) {
    const u64 t0 = global_tid(), stride = grid_threads();
    const u64 n = k.e1 > k.e0 ? k.e1 - k.e0 : 0ull;
    const u64 qvec = CE_QBLOCK / D::LANES;
    const u64 sc_off = ce_scales_offset(n);
    char* out_payload = ce_stage(c, c.a.rank);
    float* out_scales = (float*)(out_payload + sc_off);
    for (u64 b = t0; b * CE_QBLOCK < n; b += stride) {
        const u64 bv0 = k.v0 + b * qvec, bv1 = bv0 + qvec < k.v1 ? bv0 + qvec : k.v1;
        float m = 0.0f, acc[8];
        for (u64 v = bv0; v < bv1; ++v) {
#pragma unroll 1
            for (u32 q = 0; q < c.a.world; ++q) ce_add_wire<D, W>(c, k, acc, q, v, b, sc_off);
#pragma unroll
            for (int i = 0; i < D::LANES; ++i) {
                if (v * D::LANES + i < k.e1) ce_amax(m, acc[i]);
            }
        }
        const CeScale scale = ce_block_scale<W>(m);
        for (u64 v = bv0; v < bv1; ++v) {
#pragma unroll 1
            for (u32 q = 0; q < c.a.world; ++q) ce_add_wire<D, W>(c, k, acc, q, v, b, sc_off);
            u64 codes = 0ull;
#pragma unroll
            for (int i = 0; i < D::LANES; ++i) {
                const u32 code = ce_quantise<W>(acc[i], scale);
                codes |= (u64)code << (8 * i);
                acc[i] = ce_dequantise<W>(code, scale.s);  // what every peer will decode
            }
            ce_store_codes<D>(out_payload, (v - k.v0) * D::LANES, codes);
            store_output<D>(c.a, v, D::pack(acc));
        }
        out_scales[b] = scale.s;
    }
}

// One kernel per wire format (W a template parameter: a kernel holding all three paths
// spilled on sm_90).
template <class D, u32 W>
__device__ __forceinline__ void ce_reduce(const CeArgs& c) {
    if (ce_failed(c)) return;
    const CeChunk k = ce_chunk<D>(c, c.a.rank);
    if (W == CE_WIRE_EXACT) ce_reduce_exact<D>(c, k);
    else ce_reduce_wire<D, W>(c, k);
}

// The other owners' chunks of the piece, from my gather area into my output.
template <class D, u32 W>
__device__ __forceinline__ void ce_finish(const CeArgs& c) {
    if (ce_failed(c)) return;
    const u64 t0 = global_tid(), stride = grid_threads();
    const u64 qvec = CE_QBLOCK / D::LANES;
    for (u32 o = 0; o < c.a.world; ++o) {
        if (o == c.a.rank) continue;
        const CeChunk k = ce_chunk<D>(c, o);
        const char* slot = ce_gather(c, c.a.rank, o);
        if (W == CE_WIRE_EXACT) {
            for (u64 v = k.v0 + t0; v < k.v1; v += stride) store_output<D>(c.a, v, *((const V16*)slot + (v - k.v0)));
            continue;
        }
        const u64 n = k.e1 > k.e0 ? k.e1 - k.e0 : 0ull;
        const float* scales = (const float*)(slot + ce_scales_offset(n));
        for (u64 v = k.v0 + t0; v < k.v1; v += stride) {
            const float scale = scales[(v - k.v0) / qvec];
            const u64 codes = ce_load_codes<D>(slot, (v - k.v0) * D::LANES);
            float acc[8];
#pragma unroll
            for (int i = 0; i < D::LANES; ++i) acc[i] = ce_dequantise<W>((u32)(codes >> (8 * i)) & 0xffu, scale);
            store_output<D>(c.a, v, D::pack(acc));
        }
    }
}

// Entries: ce_reduce_<dtype> and ce_finish_<dtype> (exact), and ce_{quant,reduce,finish}_
// {fp8,int8}_<dtype>.
#define CE_ENTRY(NAME, WNAME, SUFFIX, D, W) \
    extern "C" __global__ void __launch_bounds__(256) NAME##WNAME##_##SUFFIX(const CeArgs c) { NAME<D, W>(c); }
#define CE_KERNELS(SUFFIX, D)                                  \
    CE_ENTRY(ce_reduce, , SUFFIX, D, CE_WIRE_EXACT)            \
    CE_ENTRY(ce_finish, , SUFFIX, D, CE_WIRE_EXACT)            \
    CE_ENTRY(ce_quant, _fp8, SUFFIX, D, CE_WIRE_FP8)           \
    CE_ENTRY(ce_reduce, _fp8, SUFFIX, D, CE_WIRE_FP8)          \
    CE_ENTRY(ce_finish, _fp8, SUFFIX, D, CE_WIRE_FP8)          \
    CE_ENTRY(ce_quant, _int8, SUFFIX, D, CE_WIRE_INT8)         \
    CE_ENTRY(ce_reduce, _int8, SUFFIX, D, CE_WIRE_INT8)        \
    CE_ENTRY(ce_finish, _int8, SUFFIX, D, CE_WIRE_INT8)
#if defined(TPAR_ONLY_F32)
CE_KERNELS(f32, DF32)
#elif defined(TPAR_ONLY_F16)
CE_KERNELS(f16, DF16)
#elif defined(TPAR_ONLY_BF16)
CE_KERNELS(bf16, DBF16)
#else
CE_KERNELS(f32, DF32)
CE_KERNELS(f16, DF16)
CE_KERNELS(bf16, DBF16)
#endif
