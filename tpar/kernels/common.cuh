// common.cuh — shared by every tpar kernel. Reads low level to high: types and the
// argument struct (the one struct of peer pointers every kernel takes), memory-ordering
// helpers named by their ordering, dtype lanes (bf16/fp16 <-> f32 by bit operations and
// PTX, no CUDA headers), the sentinel verbs, the barrier verb, and the call frame (epoch and
// deadline). The Rust twin of every struct here is in tpar/src/cuda/abi.rs; both sides
// assert sizes and offsets.
//
// Contract: nothing here spins without a deadline; nothing here stores an all-ones lane into a push
// inbox except the owner clearing it; nothing here needs a header or an include path.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define TPAR_MAX_RANKS 16
#define TPAR_MAX_BLOCKS 32
#define TPAR_THREADS 512

// Error codes written into TparError::code (0 = no error).
#define TPAR_ERR_TIMEOUT 1u
#define TPAR_ERR_MISMATCH 2u  // a peer's call differs (count, dtype or algorithm)

// Phases named in error records (which wait ran out).
#define TPAR_PHASE_PUSH_POLL 1u
#define TPAR_PHASE_RS_POLL 2u
#define TPAR_PHASE_AG_POLL 3u
#define TPAR_PHASE_BARRIER0 4u
#define TPAR_PHASE_BARRIER1 5u
#define TPAR_PHASE_STAGED 6u
#define TPAR_PHASE_DESC 7u

// Spins read %globaltimer once every this many polls (see poll_until_not_sentinel).
#define TPAR_POLLS_PER_CLOCK 16u

// ---------------------------------------------------------------------------------------
// Plain-data structs shared with the host (twins in abi.rs).

// The kernel argument: one struct, passed by value, built on the host.
struct TparArgs {
    u64 data[TPAR_MAX_RANKS];   // each rank's data area as this rank addresses it
    u64 flags[TPAR_MAX_RANKS];  // each rank's barrier-flag area
    u64 state;                  // this rank's own TparState (never touched by peers)
    u64 err;                    // this rank's TparError, host-visible (pinned, mapped)
    u64 input;                  // this rank's input, 16-byte aligned
    u64 output;                 // this rank's output, 16-byte aligned (may equal input)
    u64 count;                  // elements
    u64 slot_vecs;              // capacity of one slot, in 16-byte vectors
    u64 timeout_ns;             // every spin gives up this long after the kernel starts
    u32 rank;
    u32 world;
    u32 desc_code;              // algorithm code << 4 | dtype code (tpar's Rust codes)
    u32 pad;
};
// NVRTC has no offsetof: sizes are asserted here at compile time, offsets at run time by
// tpar_abi_offsets (below), which the host compares with abi.rs when it loads a module.
static_assert(sizeof(TparArgs) == 328, "TparArgs size: keep in step with abi.rs");
static_assert(alignof(TparArgs) == 8, "TparArgs alignment");

// Per-rank device-local state. The epoch is the call counter, advanced on the device by
// the last block to finish, so a captured graph replays with fresh epochs.
struct TparState {
    u32 epoch;        // calls completed by this rank (mod 2^32)
    u32 done_blocks;  // ticket: blocks of the current call that have finished
    u32 err_claim;    // 0 until one thread of this rank claims the error record
    u32 pad[13];
};
static_assert(sizeof(TparState) == 64, "TparState size");

// Per-rank error record in pinned host memory mapped into the device.
struct TparError {
    u32 code;     // TPAR_ERR_*, written last
    u32 rank;
    u32 peer;     // the rank that was awaited
    u32 phase;    // TPAR_PHASE_*
    u32 block;
    u32 epoch;
    u64 waited_ns;
    u64 ours;     // TPAR_ERR_MISMATCH: this rank's call, count << 8 | desc_code
    u64 theirs;   // TPAR_ERR_MISMATCH: the peer's call, same packing
};
static_assert(sizeof(TparError) == 48, "TparError size");

// One 16-byte vector: the unit every kernel moves.
struct __align__(16) V16 {
    u32 x, y, z, w;
};

// ---------------------------------------------------------------------------------------
// Memory-ordering helpers.

__device__ __forceinline__ u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Yields this warp's issue slots for about `ns` (sm_70+): for a spin off the critical path.
__device__ __forceinline__ void nanosleep_ns(u32 ns) {
    asm volatile("nanosleep.u32 %0;" ::"r"(ns));
}

// Volatile 16-byte load: never served from a stale L1 line, so polling sees peer stores.
__device__ __forceinline__ V16 ld_volatile_v16(const V16* p) {
    V16 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void st_volatile_v16(V16* p, V16 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ u32 ld_volatile_u32(const u32* p) {
    u32 v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_volatile_u32(u32* p, u32 v) {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire_sys_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys_u32(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

__device__ __forceinline__ u32 atom_add_gpu_u32(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.add.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ u32 atom_cas_gpu_u32(u32* p, u32 cmp, u32 v) {
    u32 old;
    asm volatile("atom.cas.gpu.global.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(cmp), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ void block_sync() { __syncthreads(); }

// ---------------------------------------------------------------------------------------
// Dtype lanes. Accumulation is always f32, in rank order 0..world-1.

__device__ __forceinline__ float u32_as_f32(u32 u) {
    float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
    return f;
}
__device__ __forceinline__ u32 f32_as_u32(float f) {
    u32 u;
    asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
    return u;
}
__device__ __forceinline__ float bf16_to_f32(u32 h) { return u32_as_f32(h << 16); }
// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u32 f32_to_bf16(float f) {
    u32 u = f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
__device__ __forceinline__ float f16_to_f32(u32 h) {
    float f;
    u16 hh = (u16)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hh));
    return f;
}
__device__ __forceinline__ u32 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return (u32)h;
}

__device__ __forceinline__ u32 v16_word(const V16& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void v16_set_word(V16& v, int i, u32 w) {
    if (i == 0) v.x = w; else if (i == 1) v.y = w; else if (i == 2) v.z = w; else v.w = w;
}

// The empty sentinel is all ones, the same word for every dtype (a NaN in both lane widths),
// so a buffer cleared by a call of one dtype reads as empty to a call of another: no refill
// between dtypes, and dtypes may mix inside one captured graph or one IPC workspace. A writer
// stores the canonical NaN 0x7fff... in place of an all-ones lane (only a NaN's payload
// changes), so data never looks empty; -0.0 travels exactly. (The first version used -0.0,
// whose bit pattern differs between 32- and 16-bit lanes.) Twin of `tpar::dtype::EMPTY`.
#define TPAR_EMPTY_WORD 0xffffffffu

// 32-bit lanes (f32).
struct DF32 {
    static constexpr int LANES = 4;
    static constexpr u32 EMPTY_WORD = TPAR_EMPTY_WORD;
    __device__ static __forceinline__ bool has_empty_lane(V16 v) {
        return v.x == EMPTY_WORD || v.y == EMPTY_WORD || v.z == EMPTY_WORD || v.w == EMPTY_WORD;
    }
    __device__ static __forceinline__ u32 canon_word(u32 w) { return w == EMPTY_WORD ? 0x7fffffffu : w; }
    __device__ static __forceinline__ V16 canon(V16 v) {
        V16 r = {canon_word(v.x), canon_word(v.y), canon_word(v.z), canon_word(v.w)};
        return r;
    }
    __device__ static __forceinline__ void set(float (&acc)[8], V16 v) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = u32_as_f32(v16_word(v, i));
    }
    __device__ static __forceinline__ void add(float (&acc)[8], V16 v) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += u32_as_f32(v16_word(v, i));
    }
    __device__ static __forceinline__ V16 pack(const float (&acc)[8]) {
        V16 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) v16_set_word(r, i, canon_word(f32_as_u32(acc[i])));
        return r;
    }
    __device__ static __forceinline__ u32 lane_bits(u32 e) { return e; }
};

// 16-bit lanes (f16, bf16). Empty: 0xffff in every lane.
template <bool IS_BF16>
struct D16 {
    static constexpr int LANES = 8;
    static constexpr u32 EMPTY_WORD = TPAR_EMPTY_WORD;
    __device__ static __forceinline__ bool word_has_empty(u32 w) {
        return (w & 0xffffu) == 0xffffu || (w >> 16) == 0xffffu;
    }
    __device__ static __forceinline__ bool has_empty_lane(V16 v) {
        return word_has_empty(v.x) || word_has_empty(v.y) || word_has_empty(v.z) || word_has_empty(v.w);
    }
    __device__ static __forceinline__ u32 canon_half(u32 h) { return h == 0xffffu ? 0x7fffu : h; }
    __device__ static __forceinline__ u32 canon_word(u32 w) {
        return canon_half(w & 0xffffu) | (canon_half(w >> 16) << 16);
    }
    __device__ static __forceinline__ V16 canon(V16 v) {
        V16 r = {canon_word(v.x), canon_word(v.y), canon_word(v.z), canon_word(v.w)};
        return r;
    }
    __device__ static __forceinline__ float to_f32(u32 h) { return IS_BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
    __device__ static __forceinline__ u32 from_f32(float f) { return IS_BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
    __device__ static __forceinline__ void set(float (&acc)[8], V16 v) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 w = v16_word(v, i);
            acc[2 * i] = to_f32(w & 0xffffu);
            acc[2 * i + 1] = to_f32(w >> 16);
        }
    }
    __device__ static __forceinline__ void add(float (&acc)[8], V16 v) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 w = v16_word(v, i);
            acc[2 * i] += to_f32(w & 0xffffu);
            acc[2 * i + 1] += to_f32(w >> 16);
        }
    }
    __device__ static __forceinline__ V16 pack(const float (&acc)[8]) {
        V16 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 lo = canon_half(from_f32(acc[2 * i]));
            u32 hi = canon_half(from_f32(acc[2 * i + 1]));
            v16_set_word(r, i, lo | (hi << 16));
        }
        return r;
    }
};
typedef D16<false> DF16;
typedef D16<true> DBF16;

template <class D>
__device__ __forceinline__ V16 empty_v16() {
    V16 r = {D::EMPTY_WORD, D::EMPTY_WORD, D::EMPTY_WORD, D::EMPTY_WORD};
    return r;
}

template <class D>
__device__ __forceinline__ u64 vecs_for(u64 count) {
    return (count + D::LANES - 1) / D::LANES;
}

// Loads vector v of this rank's input. The last vector may be partial: its missing lanes
// read as +0.0 (never the sentinel), so a padded vector still "arrives" as a whole.
template <class D>
__device__ __forceinline__ V16 load_input(const TparArgs& a, u64 v) {
    const u64 first = v * D::LANES;
    if (first + D::LANES <= a.count) {
        return *((const V16*)a.input + v);
    }
    V16 r = {0u, 0u, 0u, 0u};
    const u64 n = a.count - first;
    if (D::LANES == 4) {
        const u32* p = (const u32*)a.input + first;
        for (u64 i = 0; i < n; ++i) v16_set_word(r, (int)i, p[i]);
    } else {
        const u16* p = (const u16*)a.input + first;
        for (u64 i = 0; i < n; ++i) {
            u32 w = v16_word(r, (int)(i / 2)) | ((u32)p[i] << (16 * (i % 2)));
            v16_set_word(r, (int)(i / 2), w);
        }
    }
    return r;
}

// Stores vector v of the output, only the lanes inside `count`.
template <class D>
__device__ __forceinline__ void store_output(const TparArgs& a, u64 v, V16 x) {
    const u64 first = v * D::LANES;
    if (first + D::LANES <= a.count) {
        *((V16*)a.output + v) = x;
        return;
    }
    const u64 n = a.count - first;
    if (D::LANES == 4) {
        u32* p = (u32*)a.output + first;
        for (u64 i = 0; i < n; ++i) p[i] = v16_word(x, (int)i);
    } else {
        u16* p = (u16*)a.output + first;
        for (u64 i = 0; i < n; ++i) p[i] = (u16)(v16_word(x, (int)(i / 2)) >> (16 * (i % 2)));
    }
}

// ---------------------------------------------------------------------------------------
// Workspace layout, in 16-byte vectors from a rank's data area (S = slot_vecs, N = world):
//
//   push region (sentinel-managed, all ones when empty):
//     inbox[par 0..1][src 0..N-1][S]   one-shot push, staged push, two-shot reduce-scatter
//     gather[par 0..1][S]              two-shot all-gather (the chunk owner is implied)
//   pull region (no sentinel; guarded by barriers):
//     pull[par 0..1][2][S]             [0] = exposed input, [1] = two-shot partial result
//
// Flag area: flags[phase 0..1][block 0..TPAR_MAX_BLOCKS-1][src 0..N-1] (u32 generations),
// then desc[par 0..1][src 0..TPAR_MAX_RANKS-1] (one 16-byte call descriptor each, below).
//
// Why parity (epoch & 1) is enough: a rank inside call k has finished call k-1, which needed
// a contribution from every peer's call k-1, so every peer is inside call k-1, k or k+1;
// of those only call k has parity k & 1. So buffers of parity (k & 1) are touched by call
// k alone, whatever algorithm each call ran.

__device__ __forceinline__ u64 push_region_vecs(const TparArgs& a) { return (2ull * a.world + 2ull) * a.slot_vecs; }

__device__ __forceinline__ V16* inbox_at(const TparArgs& a, u32 owner, u32 par, u32 src, u64 v) {
    return (V16*)a.data[owner] + ((u64)(par * a.world + src) * a.slot_vecs + v);
}
__device__ __forceinline__ V16* gather_at(const TparArgs& a, u32 owner, u32 par, u64 v) {
    return (V16*)a.data[owner] + (2ull * a.world * a.slot_vecs + (u64)par * a.slot_vecs + v);
}
__device__ __forceinline__ V16* pull_at(const TparArgs& a, u32 owner, u32 par, u32 which, u64 v) {
    return (V16*)a.data[owner] + (push_region_vecs(a) + ((u64)par * 2ull + which) * a.slot_vecs + v);
}
__device__ __forceinline__ u32* flag_at(const TparArgs& a, u32 owner, u32 phase, u32 block, u32 src) {
    return (u32*)a.flags[owner] + ((phase * TPAR_MAX_BLOCKS + block) * TPAR_MAX_RANKS + src);
}
#define TPAR_DESC_OFFSET (2u * TPAR_MAX_BLOCKS * TPAR_MAX_RANKS * 4u)
__device__ __forceinline__ V16* desc_at(const TparArgs& a, u32 owner, u32 par, u32 src) {
    return (V16*)((char*)a.flags[owner] + TPAR_DESC_OFFSET) + (par * TPAR_MAX_RANKS + src);
}

// ---------------------------------------------------------------------------------------
// Call frame: the epoch this call runs under and its deadline.

struct Frame {
    u32 epoch;
    u64 start_ns;
    u64 deadline_ns;
    bool ok;  // false once this thread has timed out: it stops waiting, results are void
    u32 desc_pending;  // desc thread: peers whose descriptor had not arrived at frame_mid
};

// Call descriptors: every rank tells every peer what it is calling (epoch, count, algorithm,
// dtype), so that ranks that disagree get TPAR_ERR_MISMATCH instead of a sum of mismatched
// data. One thread does it, the last of block 0: it announces in frame_begin, and in
// frame_mid — which each kernel calls after its first sends, where the thread would wait for
// peers' data anyway — loads every peer's descriptor at once and compares; one not there yet
// is polled in frame_end. (Checking only in frame_end put a dependent load after the
// thread's last vector: +0.4-2.4 us per call on one H200.) The check word makes a torn or
// stale descriptor (zeros, a reset's fill, an older epoch) never match.
// Slot reuse: desc[par][src] of mine is written by src in calls e, e+2, ...; src reaches call
// e+2 only after my call e+1 contributed, i.e. after this check of call e finished.
#define TPAR_DESC_SALT 0x9e3779b9u
__device__ __forceinline__ V16 desc_of(const TparArgs& a, u32 epoch) {
    V16 d;
    d.x = epoch;
    d.y = (u32)a.count;
    d.z = (u32)(a.count >> 32) | (a.desc_code << 24);
    d.w = d.x ^ d.y ^ d.z ^ TPAR_DESC_SALT;
    return d;
}
__device__ __forceinline__ bool desc_is_for(V16 d, u32 epoch) {
    return d.x == epoch && d.w == (d.x ^ d.y ^ d.z ^ TPAR_DESC_SALT);
}
// desc_code 0: the host turned the check off (TPAR_CHECK_CALLS=0), on every rank alike.
__device__ __forceinline__ bool is_desc_thread(const TparArgs& a) {
    return blockIdx.x == 0 && threadIdx.x == blockDim.x - 1 && a.desc_code != 0u;
}

__device__ __forceinline__ Frame frame_begin(const TparArgs& a) {
    __shared__ u32 s_epoch;
    TparState* st = (TparState*)a.state;
    if (threadIdx.x == 0) s_epoch = ld_volatile_u32(&st->epoch);
    block_sync();
    Frame f;
    f.epoch = s_epoch;
    f.start_ns = globaltimer_ns();
    f.deadline_ns = f.start_ns + a.timeout_ns;
    f.ok = true;
    f.desc_pending = 0u;
    if (is_desc_thread(a)) {
        const V16 d = desc_of(a, f.epoch);
        for (u32 i = 1; i < a.world; ++i) st_volatile_v16(desc_at(a, (a.rank + i) % a.world, f.epoch & 1u, a.rank), d);
    }
    return f;
}

__device__ __noinline__ void record_mismatch(u64 err, u64 state, u32 rank, u32 epoch, u64 start_ns, u32 peer, u64 ours, u64 theirs) {
    TparState* st = (TparState*)state;
    if (atom_cas_gpu_u32(&st->err_claim, 0u, 1u) != 0u) return;
    TparError* e = (TparError*)err;
    e->rank = rank;
    e->peer = peer;
    e->phase = TPAR_PHASE_DESC;
    e->block = blockIdx.x;
    e->epoch = epoch;
    e->waited_ns = globaltimer_ns() - start_ns;
    e->ours = ours;
    e->theirs = theirs;
    fence_sc_sys();
    st_volatile_u32(&e->code, TPAR_ERR_MISMATCH);
    fence_sc_sys();
}

__device__ __forceinline__ void desc_compare(const TparArgs& a, Frame& f, u32 q, V16 d, V16 mine) {
    if (d.y != mine.y || d.z != mine.z) {
        const u64 theirs = ((((u64)(d.z & 0xffffffu) << 32) | d.y) << 8) | (d.z >> 24);
        const u64 ours = (a.count << 8) | (a.desc_code & 0xffu);
        record_mismatch(a.err, a.state, a.rank, f.epoch, f.start_ns, q, ours, theirs);
        f.ok = false;
    }
}

// Desc thread, after its first sends: every peer's descriptor loaded at once, compared;
// those not there yet are left in f.desc_pending for frame_end. Inlined: a non-inlined
// function taking the kernel argument by reference makes the compiler copy all of it to
// local memory in every thread; the rare path, record_mismatch, takes values.
__device__ __forceinline__ void frame_mid(const TparArgs& a, Frame& f) {
    if (!is_desc_thread(a) || !f.ok) return;
    const V16 mine = desc_of(a, f.epoch);
    V16 d[TPAR_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= a.world) break;
        if (q != a.rank) d[q] = ld_volatile_v16(desc_at(a, a.rank, f.epoch & 1u, q));
    }
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= a.world) break;
        if (q == a.rank) continue;
        if (!desc_is_for(d[q], f.epoch)) {
            f.desc_pending |= 1u << q;
        } else if (f.ok) {
            desc_compare(a, f, q, d[q], mine);
        }
    }
}

// Desc thread: polls (bounded by the call's deadline) the descriptors frame_mid did not
// find. A peer that never announces is left to the data waits, which time out naming it.
__device__ __forceinline__ void desc_finish(const TparArgs& a, Frame& f) {
    const V16 mine = desc_of(a, f.epoch);
    for (u32 q = 0; q < a.world && f.ok && f.desc_pending != 0u; ++q) {
        if (!(f.desc_pending & (1u << q))) continue;
        const V16* p = desc_at(a, a.rank, f.epoch & 1u, q);
        V16 d = ld_volatile_v16(p);
        u32 polls = 0;
        while (!desc_is_for(d, f.epoch)) {
            if (++polls % TPAR_POLLS_PER_CLOCK == 0u && globaltimer_ns() > f.deadline_ns) return;
            nanosleep_ns(32);  // off the critical path: leave the issue slots to the data polls
            d = ld_volatile_v16(p);
        }
        desc_compare(a, f, q, d, mine);
    }
}

// The last block to finish advances the epoch. Every block read the epoch in frame_begin
// before taking its ticket, so no block can read the advanced value within this call. No
// fence: only this rank's next kernel reads the epoch, and the kernel boundary on this
// rank's stream orders that; a fence here would wait for every outstanding store.
__device__ __forceinline__ void frame_end(const TparArgs& a, Frame& f) {
    if (is_desc_thread(a) && f.ok && f.desc_pending != 0u) desc_finish(a, f);
    block_sync();
    if (threadIdx.x == 0) {
        TparState* st = (TparState*)a.state;
        if (gridDim.x == 1) {
            st_volatile_u32(&st->epoch, f.epoch + 1u);  // no other block to wait for
            return;
        }
        u32 ticket = atom_add_gpu_u32(&st->done_blocks, 1u);
        if (ticket == gridDim.x - 1) {
            st_volatile_u32(&st->done_blocks, 0u);
            st_volatile_u32(&st->epoch, f.epoch + 1u);
        }
    }
}

// First timed-out thread of a rank fills the host-visible record; the code goes last so
// the host never sees a code with half-written fields. Takes values, not references, so
// the kernel argument stays in the parameter space (a reference would copy it to local).
__device__ __noinline__ void record_timeout(u64 err, u64 state, u32 rank, u32 epoch, u64 start_ns, u32 peer, u32 phase) {
    TparState* st = (TparState*)state;
    if (atom_cas_gpu_u32(&st->err_claim, 0u, 1u) != 0u) return;
    TparError* e = (TparError*)err;
    e->rank = rank;
    e->peer = peer;
    e->phase = phase;
    e->block = blockIdx.x;
    e->epoch = epoch;
    e->waited_ns = globaltimer_ns() - start_ns;
    fence_sc_sys();
    st_volatile_u32(&e->code, TPAR_ERR_TIMEOUT);
    fence_sc_sys();
}

__device__ __forceinline__ void report_timeout(const TparArgs& a, Frame& f, u32 peer, u32 phase) {
    f.ok = false;
    record_timeout(a.err, a.state, a.rank, f.epoch, f.start_ns, peer, phase);
}

// Sentinel verb: spins on this rank's own memory until no lane holds the empty pattern.
// The clock is read once every TPAR_POLLS_PER_CLOCK polls: reading %globaltimer costs more
// than a poll, and the reaction time to arriving data is what the poll loop is for.

template <class D>
__device__ __forceinline__ V16 poll_until_not_sentinel(const TparArgs& a, Frame& f, const V16* p, u32 peer, u32 phase) {
    V16 v = ld_volatile_v16(p);
    u32 polls = 0;
    while (D::has_empty_lane(v)) {
        if (!f.ok) return v;
        if (++polls % TPAR_POLLS_PER_CLOCK == 0u && globaltimer_ns() > f.deadline_ns) {
            report_timeout(a, f, peer, phase);
            return v;
        }
        v = ld_volatile_v16(p);
    }
    return v;
}

// Gathering verbs. A loop "for each peer: load, then use" issues one load, stalls on its
// use, then issues the next: one memory latency per peer (7 at world 8, each a PCIe round
// trip on a real fabric). These verbs put every peer's load in flight first — the unrolled
// loop keeps x[] in registers — and only then look at the values.

// Which slot of rank q a gathering verb reads. Chosen at compile time, not by a lambda: a
// lambda capturing the kernel argument by reference makes the compiler copy all of it to
// local memory.
enum SlotKind {
    SLOT_INBOX = 0,          // my inbox, slot [q], vector v
    SLOT_GATHER_CHUNK = 1,   // my gather area, vector q*cvec + v (v = index in the chunk)
    SLOT_PULL_EXPOSED = 2,   // rank q's exposed input, vector v
    SLOT_PULL_RESULT_CHUNK = 3,  // rank q's partial result, vector q*cvec + v
};

// Base of the slots of kind K as seen from this rank: read from the argument once, before
// the loops (after a volatile poll the compiler would otherwise reload it every time).
template <int K>
__device__ __forceinline__ V16* slot_base(const TparArgs& a, u32 par) {
    if (K == SLOT_INBOX) return inbox_at(a, a.rank, par, 0, 0);
    if (K == SLOT_GATHER_CHUNK) return gather_at(a, a.rank, par, 0);
    return (V16*)0;  // pull kinds address each peer's own area
}

template <int K>
__device__ __forceinline__ V16* slot_of(const TparArgs& a, V16* base, u32 par, u32 q, u64 v, u64 cvec) {
    if (K == SLOT_INBOX) return base + ((u64)q * a.slot_vecs + v);
    if (K == SLOT_GATHER_CHUNK) return base + ((u64)q * cvec + v);
    if (K == SLOT_PULL_EXPOSED) return pull_at(a, q, par, 0, v);
    return pull_at(a, q, par, 1, (u64)q * cvec + v);
}

// Chunked slots exist only inside the message (the last chunks may be short or empty).
template <int K>
__device__ __forceinline__ bool slot_valid(u32 q, u64 v, u64 cvec, u64 nvec) {
    return (K == SLOT_GATHER_CHUNK || K == SLOT_PULL_RESULT_CHUNK) ? (u64)q * cvec + v < nvec : true;
}

// Sentinel verb over every valid peer q != rank: loads all slots at once, then spins
// (bounded) on those that still hold the empty pattern. x[rank] is left untouched. The loops are unrolled
// to TPAR_MAX_RANKS (so x[] stays in registers) and leave at q == world (so small worlds do
// not pay for 16).
template <class D, int K>
__device__ __forceinline__ void poll_all_peers(const TparArgs& a, Frame& f, V16 (&x)[TPAR_MAX_RANKS], u32 par, u64 v, u64 cvec, u64 nvec, u32 phase) {
    V16* base = slot_base<K>(a, par);
    const u32 world = a.world, rank = a.rank;
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        if (q != rank && slot_valid<K>(q, v, cvec, nvec)) x[q] = ld_volatile_v16(slot_of<K>(a, base, par, q, v, cvec));
    }
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        if (q != rank && slot_valid<K>(q, v, cvec, nvec) && D::has_empty_lane(x[q])) {
            x[q] = poll_until_not_sentinel<D>(a, f, slot_of<K>(a, base, par, q, v, cvec), q, phase);
        }
    }
}

// Loads every valid peer's slot (no sentinel: barrier-guarded data), all loads in flight at once.
template <int K>
__device__ __forceinline__ void load_all_peers(const TparArgs& a, V16 (&x)[TPAR_MAX_RANKS], u32 par, u64 v, u64 cvec, u64 nvec) {
    V16* base = slot_base<K>(a, par);
    const u32 world = a.world, rank = a.rank;
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        if (q != rank && slot_valid<K>(q, v, cvec, nvec)) x[q] = ld_volatile_v16(slot_of<K>(a, base, par, q, v, cvec));
    }
}

// Sum in rank order 0..world-1 in f32, packed and canonicalised; rank `a.rank` contributes
// `own`, every other rank x[q].
template <class D>
__device__ __forceinline__ V16 reduce_in_rank_order(const TparArgs& a, const V16 (&x)[TPAR_MAX_RANKS], V16 own) {
    float acc[8];
    const u32 world = a.world, rank = a.rank;
    D::set(acc, rank == 0 ? own : x[0]);
#pragma unroll
    for (u32 q = 1; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        D::add(acc, q == rank ? own : x[q]);
    }
    return D::pack(acc);
}

// Generations compare modulo 2^32: `have` is at or past `want`.
__device__ __forceinline__ bool gen_reached(u32 have, u32 want) { return (int)(have - want) >= 0; }

// Barrier verb, per block: block b of every rank meets block b of every other rank. Every
// data store this block made before the barrier is visible to peers that pass it.
__device__ __forceinline__ void barrier_block(const TparArgs& a, Frame& f, u32 phase, u32 gen) {
    block_sync();
    const u32 q = threadIdx.x;
    if (q < a.world) {
        // The release is cumulative over the block's stores ordered before it by block_sync.
        st_release_sys_u32(flag_at(a, q, phase, blockIdx.x, a.rank), gen);
        const u32* mine = flag_at(a, a.rank, phase, blockIdx.x, q);
        u32 polls = 0;
        while (f.ok && !gen_reached(ld_acquire_sys_u32(mine), gen)) {
            if (++polls % TPAR_POLLS_PER_CLOCK == 0u && globaltimer_ns() > f.deadline_ns)
                report_timeout(a, f, q, phase == 0 ? TPAR_PHASE_BARRIER0 : TPAR_PHASE_BARRIER1);
        }
    }
    block_sync();
}

#define TPAR_INSTANTIATE(NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(TPAR_THREADS) NAME##_f32(const TparArgs a) { NAME<DF32>(a); } \
    extern "C" __global__ void __launch_bounds__(TPAR_THREADS) NAME##_f16(const TparArgs a) { NAME<DF16>(a); } \
    extern "C" __global__ void __launch_bounds__(TPAR_THREADS) NAME##_bf16(const TparArgs a) { NAME<DBF16>(a); }

// Field offsets as this compiler lays them out; the host checks them against abi.rs.
// out[0..8] = offsets of TparArgs.{flags, state, err, input, count, slot_vecs, timeout_ns, rank},
// out[8] = TparError.waited_ns, out[9] = TparState.err_claim, out[10] = TparArgs.desc_code,
// out[11] = TparError.theirs.
extern "C" __global__ void tpar_abi_offsets(u64* out) {
    TparArgs a;
    TparError e;
    TparState s;
    const char* b = (const char*)&a;
    out[0] = (u64)((const char*)&a.flags - b);
    out[1] = (u64)((const char*)&a.state - b);
    out[2] = (u64)((const char*)&a.err - b);
    out[3] = (u64)((const char*)&a.input - b);
    out[4] = (u64)((const char*)&a.count - b);
    out[5] = (u64)((const char*)&a.slot_vecs - b);
    out[6] = (u64)((const char*)&a.timeout_ns - b);
    out[7] = (u64)((const char*)&a.rank - b);
    out[8] = (u64)((const char*)&e.waited_ns - (const char*)&e);
    out[9] = (u64)((const char*)&s.err_claim - (const char*)&s);
    out[10] = (u64)((const char*)&a.desc_code - b);
    out[11] = (u64)((const char*)&e.theirs - (const char*)&e);
}

// Launch-floor probe: one empty kernel per rank, launched exactly like a collective. What it
// costs is what emulating ranks as concurrent kernels on one GPU costs before any
// communication; the bench prints it beside the algorithms.
extern "C" __global__ void __launch_bounds__(TPAR_THREADS) tpar_noop(const TparArgs a) {}
