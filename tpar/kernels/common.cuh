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
#define TPAR_MAX_BLOCKS 64
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
#define TPAR_PHASE_ABORTED 8u  // another thread of this rank already failed the call
#define TPAR_PHASE_ISLAND_POLL 9u  // hierarchical: another island's sum (peer = the rank that sends it)
#define TPAR_PHASE_NORM_POLL 10u  // fused: this rank's own tile sums of squares (norm.cuh)

// Spins read %globaltimer once every this many polls (see poll_until_not_sentinel).
#define TPAR_POLLS_PER_CLOCK 16u
// A wait reads the host's error record (a dead peer) only after this many failed polls (each a
// round trip to memory, 0.1 us or more: at least about 0.5 ms; frame.cuh). A poll count, not
// the clock: one register fewer, which the lean variants' 64 need (a spill otherwise).
#define TPAR_HOST_CHECK_POLLS 4096u

// The lean variant (large messages; the launcher compiles it with -DTPAR_LEAN, for the
// kernels that define TPAR_LEAN_READY before including this header): at most 64 registers a
// thread, so that TPAR_LEAN_MIN_BLOCKS blocks of TPAR_THREADS are resident per SM (twice
// the warps of the default, whose ~120 registers allow one). It reduces peers in groups of
// TPAR_PEER_GROUP (frame.cuh: load_reduce, poll_reduce) and keeps fewer loads in flight in
// the bulk loops; every sum is the same f32 adds in the same rank order.
#if defined(TPAR_LEAN) && defined(TPAR_LEAN_READY)
#define TPAR_LEAN_ON 1
#define TPAR_LEAN_MIN_BLOCKS 2
// Peers loaded at a time: the kernel's TPAR_LEAN_PEER_GROUP (the largest that compiles
// without a spill on sm_80/sm_90/sm_120 in every dtype: register allocation at the 64 limit
// differs by a register or two between kernels), else 4 (8 ranks: two groups).
#ifndef TPAR_PEER_GROUP
#ifdef TPAR_LEAN_PEER_GROUP
#define TPAR_PEER_GROUP TPAR_LEAN_PEER_GROUP
#else
#define TPAR_PEER_GROUP 4
#endif
#endif
#ifndef TPAR_GATHER_GROUP
#define TPAR_GATHER_GROUP TPAR_PEER_GROUP  // peers a pull all-gather copies at a time
#endif
// Independent 16-byte loads a thread keeps in flight in the bulk loops.
#ifndef TPAR_UNROLL
#define TPAR_UNROLL 2
#endif
// Vector indices of the kernels' loops: 32-bit (the launcher runs the lean variant only for
// messages under 2^31 vectors, so an index plus a grid's stride never wraps).
#define TPAR_IDX u32
#else
#define TPAR_LEAN_ON 0
#define TPAR_PEER_GROUP TPAR_MAX_RANKS
#define TPAR_GATHER_GROUP TPAR_MAX_RANKS
#define TPAR_UNROLL 4
#define TPAR_IDX u64
#endif

// The fused variant (all-reduce + residual add + RMSNorm; the launcher compiles it with
// -DTPAR_FUSED, for the kernels that define TPAR_FUSED_READY before including this header;
// norm.cuh). Its rows are whole tiles of TPAR_TILE_VECS vectors (one warp's 32 consecutive
// vectors), and every range of vectors the all-reduce hands to a warp starts on a tile:
// two-shot chunks and flag block ranges are rounded up to whole tiles (TPAR_TILE_ALIGN;
// the identity in every other variant, which compile as before).
#define TPAR_TILE_VECS 32u
#ifdef TPAR_FUSED
#define TPAR_FUSED_ASKED 1  // a kernel without the variant refuses it (TPAR_ENTRY)
#else
#define TPAR_FUSED_ASKED 0
#endif
#if defined(TPAR_FUSED) && defined(TPAR_FUSED_READY)
#if TPAR_LEAN_ON
#error "the fused variant has no lean form (the launcher runs the default size class)"
#endif
#define TPAR_FUSED_ON 1
#define TPAR_TILE_ALIGN(n) ((((n) + TPAR_TILE_VECS - 1u) / TPAR_TILE_VECS) * TPAR_TILE_VECS)
#else
#define TPAR_FUSED_ON 0
#define TPAR_TILE_ALIGN(n) (n)
#endif

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
    u32 test_delay_ns;          // test hook: spin this long before the call (skewed ranks); 0 normally
    u64 islands;                // hierarchical: rank q's island label (its first rank) at bits 4q..4q+3; 0 = one island
    u64 io;                     // this call's TparIo (io.cuh: every rank's registered input and output), 0 = none
};
// NVRTC has no offsetof: sizes are asserted here at compile time, offsets at run time by
// tpar_abi_offsets (below), which the host compares with abi.rs when it loads a module.
static_assert(sizeof(TparArgs) == 344, "TparArgs size: keep in step with abi.rs");
static_assert(alignof(TparArgs) == 8, "TparArgs alignment");

// Per-rank device-local state, touched only by this rank's kernels. Epochs are per block:
// block b reads epoch[b] and buf[b] when it starts and advances them when it ends, so no
// block waits for another and no atomic is taken per call (block 0 also advances the words
// of the blocks this call did not launch). Every word of a rank holds the same value between
// calls. `buf` is the call's buffer, 0, 1, 2, 0, ... (not epoch % 3: 2^32 is not a multiple
// of 3). `prev_*[e & 1]` say what the call of epoch e left in the push region, so that the
// next call clears it (one call behind, off the critical path).
struct TparState {
    u32 epoch[TPAR_MAX_BLOCKS];      // calls completed by this rank (mod 2^32)
    unsigned char buf[TPAR_MAX_BLOCKS];  // buffer index of the next call, 0..2
    u32 err_claim;                   // 0 until one thread of this rank claims the error record
    u32 pad0;
    u64 prev_nvec[2];                // vectors of that call's message
    u32 prev_kind[2];                // TPAR_KIND_*: which push regions that call filled
};
static_assert(sizeof(TparState) == 352, "TparState size");

// What a call leaves in the push region (for the clear one call behind).
#define TPAR_KIND_NONE 0u     // pull algorithms: nothing
#define TPAR_KIND_INBOX 1u    // one-shot and staged push: inbox[buf][src][0..nvec)
#define TPAR_KIND_TWOSHOT 2u  // two-shot push: inbox[buf][src][my chunk], gather[buf][other chunks]
#if defined(TPAR_TEST_UNSAFE_ONE_BUFFER)
// Test only: one buffer, for the flag protocol (which three buffers guard with a margin: two
// are safe there, docs/cuda.md): a writer then reuses a slot its readers may still be
// reading, and the skewed-rank stress must catch it.
#define TPAR_BUFS 1u
#elif defined(TPAR_TEST_UNSAFE_TWO_BUFFERS)
// Test only: the guard removed (two buffers, the clear one call behind then races a fast
// peer's next call). The skewed-rank stress must catch it.
#define TPAR_BUFS 2u
#else
#define TPAR_BUFS 3u
#endif

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

// The fused call's arguments beyond the all-reduce's (norm.cuh): `a.input` is x, `a.output`
// the normalised output (may equal x), `a.count` rows x hidden elements. The standalone
// add-RMSNorm kernel (add_rmsnorm.cu) takes the same struct (no peers: `a` carries only
// input, output, count).
struct TparNorm {
    u64 residual;      // residual input, rows x hidden, 16-byte aligned (TPAR_NORM_RESIDUAL; else 0)
    u64 residual_out;  // the updated residual (without a residual: the sum), 16-byte aligned
    u64 weight;        // RMSNorm weight, hidden elements, 16-byte aligned
    u32 hidden;        // elements per row
    u32 eps_bits;      // epsilon, as f32 bits
    u64 scale;         // TPAR_NORM_FP8: the f32 static scale's device address; TPAR_NORM_NVFP4: the f32 global scale's (else 0)
    u32 flags;         // the pattern: TPAR_NORM_* below
    u32 pad;
    u64 scale_out;     // TPAR_NORM_NVFP4: the block scales (e4m3fn bytes, 128x4-swizzled, norm.cuh nvfp4_sf_offset; else 0)
};
// The fused family's pattern (TparNorm.flags; abi.rs NORM_*; the descriptor carries it).
#define TPAR_NORM_RESIDUAL 1u  // the residual add before the norm
#define TPAR_NORM_GEMMA 2u     // the norm multiplies by f32(w) + 1
#define TPAR_NORM_FP8 4u       // the output is FP8 e4m3fn, quantized with *scale
#define TPAR_NORM_NVFP4 16u    // the output is NVFP4 (e2m1 pairs, e4m3fn block scales into scale_out), global scale *scale
// Not a pattern bit: the call runs two-shot pull's rows variant (-DTPAR_FUSED_ROWS: each
// rank owns whole rows, twoshot_pull.cu), set by the launcher so that the descriptor, which
// carries the flags, tells a rank that split the message otherwise (cuda/fused.rs
// `rows_owned`). The kernels' code never reads it: the variant's compile decides.
#define TPAR_NORM_ROWS 8u
static_assert(sizeof(TparNorm) == 56, "TparNorm size: keep in step with abi.rs");
struct TparFusedArgs {
    TparArgs a;
    TparNorm n;
};
static_assert(sizeof(TparFusedArgs) == 400, "TparFusedArgs size: keep in step with abi.rs");
static_assert(alignof(TparFusedArgs) == 8, "TparFusedArgs alignment");
// This rank's partial sums of squares (fused calls; norm.cuh) live in its state buffer,
// after the TparState: one 8-byte {f32 bits, generation} word per tile of the message.
#define TPAR_SCRATCH_OFFSET 512u

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


// Poll load: volatile (never served from a stale L1 line) but with no memory clobber, so the
// compiler may issue several polls back to back and other loads around them. Only polls
// need this; bulk data moves with the plain verbs below.
__device__ __forceinline__ V16 ld_poll_v16(const V16* p) {
    V16 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Bulk verbs: plain 16-byte loads and stores the compiler and the hardware may overlap
// freely (own memory: clears, exposed copies that a barrier's release publishes).
__device__ __forceinline__ V16 ld_v16(const V16* p) { return *p; }
__device__ __forceinline__ void st_v16(V16* p, V16 v) { *p = v; }

// Send: a strong (volatile) 16-byte store for data a peer polls, with no memory clobber, so
// the compiler may still overlap it with other work. Plain (weak) stores were measured
// 3-4x slower for a chain of sends (staged push, emulated ranks): nothing obliges the
// hardware to make a weak store visible to another thread soon. The sentinel is per lane,
// so sends need no ordering among themselves.
__device__ __forceinline__ void st_send_v16(V16* p, V16 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// Programmatic dependent launch (sm_90+; no-ops when launched without the attribute and on
// older architectures). wait: everything the previous kernel on this stream wrote is
// visible, it has finished; launch_dependents: the next kernel may start its prologue.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
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

// Stamps (compiled with -DTPAR_TEST_STAMPS: `TPAR_TEST_STAMPS=1`, for measuring only):
// thread 0 of each block writes %globaltimer at the kernel's phases into this rank's state
// buffer after the tile words (abi.rs `stamps_offset`), stamp k of block b at word 8 b + k;
// `sync` first waits for the whole block (block_sync), so that a stamp after a phase means
// every thread of the block is past it. The bench (emulated ranks) clears them, runs the
// timed graph once more and prints the phases (tpar-cli harness/stamps.rs). Kernels with
// stamps: the registered pull path (io.cuh) and one-shot pull with its fused variant.
// 0 entry, 1 frame ready (PDL wait, state), 2 start barrier passed, 3 reduce done (every
// thread), 4 end barrier passed / norm done.
#ifdef TPAR_TEST_STAMPS
__device__ __forceinline__ volatile u64* tpar_stamps(const TparArgs& a) {
    return (volatile u64*)(a.state + TPAR_SCRATCH_OFFSET + (a.slot_vecs + TPAR_TILE_VECS - 1ull) / TPAR_TILE_VECS * 8ull);
}
#define TPAR_STAMP(a, k, sync)                                                                   \
    do {                                                                                         \
        if (sync) block_sync();                                                                  \
        if (threadIdx.x == 0) tpar_stamps(a)[(u64)blockIdx.x * 8ull + (u64)(k)] = globaltimer_ns(); \
    } while (0)
#else
#define TPAR_STAMP(a, k, sync) \
    do {                       \
    } while (0)
#endif

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
__device__ __forceinline__ float f16_to_f32(u32 h) {
    float f;
    u16 hh = (u16)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hh));
    return f;
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
    // Rounds the accumulators once (nearest even) and packs them: the hardware's
    // cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, two lanes an instruction (sm_80+), where the
    // shifts and adds of a software bf16 rounding took about 60 instructions a vector: the registered
    // reduce was bound by them (bench/results/2026-12-02-h200-registered-barriers-arithmetic/). The same bits for every number; a NaN stays a
    // quiet NaN (its payload the hardware's), the same on every rank, never the all-ones
    // empty word (canon_word).
    __device__ static __forceinline__ V16 pack(const float (&acc)[8]) {
        V16 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 w;
            if (IS_BF16) {
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(acc[2 * i + 1]), "f"(acc[2 * i]));
            } else {
                asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(acc[2 * i + 1]), "f"(acc[2 * i]));
            }
            w = canon_word(w);
            v16_set_word(r, i, w);
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

// The last vector of a message may be partial: lanes [0, n) of the vector whose first lane
// is element `first` of `base`, the missing lanes +0.0 (never the sentinel), so a padded
// vector still "arrives" as a whole. PEER: `base` is a peer's buffer (registered inputs,
// io.cuh): volatile element loads, never served from a stale L1 line.
template <bool B, class T, class F> struct pick_type { typedef T type; };
template <class T, class F> struct pick_type<false, T, F> { typedef F type; };
template <class D, bool PEER = false>
__device__ __forceinline__ V16 load_partial(const void* base, u64 first, u64 n) {
    typedef typename pick_type<PEER, const volatile u32, const u32>::type W32;
    typedef typename pick_type<PEER, const volatile u16, const u16>::type W16;
    V16 r = {0u, 0u, 0u, 0u};
    if (D::LANES == 4) {
        W32* p = (W32*)base + first;
        for (u64 i = 0; i < n; ++i) v16_set_word(r, (int)i, p[i]);
    } else {
        W16* p = (W16*)base + first;
        for (u64 i = 0; i < n; ++i) {
            u32 w = v16_word(r, (int)(i / 2)) | ((u32)p[i] << (16 * (i % 2)));
            v16_set_word(r, (int)(i / 2), w);
        }
    }
    return r;
}

// Loads vector v of this rank's input (OUT: of its output, as store_output left it).
// (The field is read in each branch rather than once before them: read once, the compiler
// allocated registers differently, and one lean variant spilled.)
template <bool OUT>
__device__ __forceinline__ u64 io_base(const TparArgs& a) {
    return OUT ? a.output : a.input;
}
template <class D, bool OUT = false>
__device__ __forceinline__ V16 load_input(const TparArgs& a, u64 v) {
    const u64 first = v * D::LANES;
    if (first + D::LANES <= a.count) {
        return *((const V16*)io_base<OUT>(a) + v);
    }
    return load_partial<D>((const void*)io_base<OUT>(a), first, a.count - first);
}

// Whole vector i of this rank's input / output (the all-gather and the reduce-scatter: the
// host runs them only where every rank's part is whole 16-byte vectors, so no vector is
// partial and part q starts at vector q x nvec).
__device__ __forceinline__ V16 input_vec(const TparArgs& a, u64 i) { return *((const V16*)a.input + i); }
__device__ __forceinline__ void output_vec(const TparArgs& a, u64 i, V16 x) { *((V16*)a.output + i) = x; }

// Where store_vec stores: B::at(a, q) is the base address, read where it is used (in each
// branch, as load_input reads its field: hoisted out as a value, the compiler kept it live
// and one lean variant spilled). MyOutput: this rank's output.
struct MyOutput {
    __device__ static __forceinline__ u64 at(const TparArgs& a, u32) { return a.output; }
};

// Stores vector v at B's base for rank q, only the lanes inside `count`.
template <class D, class B>
__device__ __forceinline__ void store_vec(const TparArgs& a, u32 q, u64 v, V16 x) {
    const u64 first = v * D::LANES;
    if (first + D::LANES <= a.count) {
        *((V16*)B::at(a, q) + v) = x;
        return;
    }
    const u64 n = a.count - first;
    if (D::LANES == 4) {
        u32* p = (u32*)B::at(a, q) + first;
        for (u64 i = 0; i < n; ++i) p[i] = v16_word(x, (int)i);
    } else {
        u16* p = (u16*)B::at(a, q) + first;
        for (u64 i = 0; i < n; ++i) p[i] = (u16)(v16_word(x, (int)(i / 2)) >> (16 * (i % 2)));
    }
}

// Stores vector v of the output, only the lanes inside `count`.
template <class D>
__device__ __forceinline__ void store_output(const TparArgs& a, u64 v, V16 x) {
    store_vec<D, MyOutput>(a, 0u, v, x);
}

// The workspace layout, the call frame, descriptors, clears and the poll verbs: frame.cuh,
// spliced in here as this file is spliced into each kernel (no include path needed).
#include "frame.cuh"
