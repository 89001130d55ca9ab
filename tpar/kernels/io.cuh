// io.cuh — registered caller buffers: the zero-copy path of the pull kernels, for calls
// captured in a CUDA graph whose buffers the host registered (as vLLM's custom all-reduce
// does for its graphs); and the ABI probe. Spliced into frame.cuh at its end, after
// flags.cuh and norm.cuh (it uses the frame, the barrier and the dtype lanes above it).
//
// A registered call's TparArgs::io points at its TparIo: every rank's input and output of
// that call as this rank addresses them (emulated ranks: plain pointers; rank processes: the
// peers' allocations opened through CUDA IPC, plus the offset). The host writes it after the
// capture that recorded the call and before the graph first runs; nothing changes it while
// the graph lives. A table whose input[rank] is 0 says "not registered" (a rank process whose
// peers could not share their buffers): the kernel then runs its copy path, as every rank
// does for that call (registration is collective: all ranks or none).
//
// Protocol (both pull kernels; trips on the critical path: flag, read request, read reply,
// [write,] flag):
//  1. start barrier (phase 0, per block; TPAR_BAR_ARRIVE: a relaxed signal, acquire polls):
//     every rank's call has started, so its input is complete (the kernel boundary, or
//     griddepcontrol.wait, orders it after the stream's earlier work; nothing this kernel
//     stores needs publishing, so no release: it cost 0.5 us a call);
//  2. reduce straight from every rank's input in rank order, f32 (no copy into the
//     workspace): one-shot all vectors into my output; two-shot my chunk, written into every
//     rank's output (all-gather by writes: a chunk is written once, where it is needed);
//  3. end barrier (phase 1, per block): no rank leaves before every peer is done with its
//     buffers — the caller may overwrite its input, or read its output, as soon as the
//     kernel ends. Two-shot: a release (its peers' stores into my output must be visible);
//     one-shot: reads only (TPAR_BAR_READS_DONE, relaxed: a peer's signal follows its
//     loads' values), about 0.5 us a call cheaper than a release on one H200
//     (bench/results/2026-12-02-h200-registered-barriers-arithmetic/barriers/).
// Block b of every rank meets block b of every peer at both barriers; every rank launches
// the same grid, so when all my blocks have passed the end barrier every block of every peer
// has signalled it: all reads of my input and writes into my output are done (they precede
// the signal in their block, ordered by block_sync and the cumulative st.release.sys).
// In place (input == output): two-shot writes chunk c of rank q's output only from rank c,
// after rank c's own reads of chunk c of every input (same thread, data dependence), and no
// other rank reads chunk c of any input. One-shot in place is NOT safe (every peer reads my
// input while I write my sum over it; wrong sums on one H200 with skewed ranks): the host
// never registers it (io_tables::may_register), such calls copy. No workspace data buffer is
// used, so no reuse argument is needed beyond the barriers: generations (epoch + 1) only
// grow in each flag slot, as for the copy path.

// Per call and rank, in device memory. Twin of abi.rs `TparIo`.
struct TparIo {
    u64 input[TPAR_MAX_RANKS];   // rank q's input of this call, as this rank addresses it
    u64 output[TPAR_MAX_RANKS];  // rank q's output
};
static_assert(sizeof(TparIo) == 256, "TparIo size: keep in step with abi.rs");

// The call's table, loaded once per block (every thread reads the peers' pointers from it).
__shared__ u64 tpar_io_sh[2 * TPAR_MAX_RANKS];

// Whether this call's buffers are registered. Loads the table into shared memory; every
// thread of the block must call it (it ends with block_sync). The table is the host's, not
// the previous kernel's: read before griddepcontrol.wait, overlapping the previous call.
// The lean variant has no zero-copy path (the launcher runs registered calls on the default
// variant, launch::size_class; forced lean, every rank copies: correct, as all ranks run one
// variant): within 64 registers it spilled in one (arch, dtype) whatever the loads in flight.
// Nor has the fused variant (norm.cuh: its epilogue needs the copy path's mapping; the host
// never registers a fused call, and the branch compiles away here).
__device__ __forceinline__ bool io_registered(const TparArgs& a) {
    if (TPAR_LEAN_ON || TPAR_FUSED_ON || a.io == 0ull) return false;
    const u32 t = threadIdx.x;
    if (t < 2u * TPAR_MAX_RANKS) tpar_io_sh[t] = ((const u64*)a.io)[t];
    block_sync();
    return tpar_io_sh[a.rank] != 0ull;
}

// Vector v of rank q's registered input, a whole vector: a peer's is read with a volatile
// load (never a stale L1 line; all in flight, unclobbered).
__device__ __forceinline__ V16 io_load(const TparArgs& a, u32 q, u64 v) {
    const V16* p = (const V16*)tpar_io_sh[q] + v;
    return q == a.rank ? ld_v16(p) : ld_poll_v16(p);
}

// store_vec's base: rank q's registered output.
struct IoOutput {
    __device__ static __forceinline__ u64 at(const TparArgs&, u32 q) { return tpar_io_sh[TPAR_MAX_RANKS + q]; }
};

// Stores the sum of vector v into my output (ALL false: one-shot) or into every rank's,
// staggered from me+1 (ALL true: two-shot); only the lanes inside the count (whole: all).
// Plain stores: the end barrier's release publishes them.
template <class D, bool ALL>
__device__ __forceinline__ void io_store(const TparArgs& a, u64 v, bool whole, V16 r) {
    const u32 world = a.world, rank = a.rank;
    for (u32 i = ALL ? 1u : world; i <= world; ++i) {
        const u32 q = rank + i < world ? rank + i : rank + i - world;
        if (whole) st_v16((V16*)tpar_io_sh[TPAR_MAX_RANKS + q] + v, r);
        else store_vec<D, IoOutput>(a, q, v, r);
    }
}

// Loads a thread keeps in flight in the registered reduce: 8 vectors (32 registers). 16 (as
// the default variant's one-group reduce) was 1-10% slower at 1-16 MiB on one H200
// (bench/results/2026-12-02-h200-peer-loads-registered-reduce/README.md: two-shot pull, 2 ranks, 64 blocks, 1 / 4 / 16 MiB 5.56 / 8.06 / 25.87 us with 16, 5.46 /
// 7.89 / 23.29 with 8); 4 in flight lost at 16 MiB (32 blocks: 34.61 us against 8's 32.28).
#define TPAR_IO_SLOTS 8

// Reduces the whole vectors [lo, hi) (this thread's first, then every grid's worth) over
// every rank's registered input, in rank order 0..world-1 in f32, and stores each sum
// (io_store). W: the world at compile time (2, 4, 8), or TPAR_MAX_RANKS bounded by a.world
// at run time. U vectors per pass and G ranks per load group, all U x G loads in flight
// before any add: at 2 ranks a thread has 8 loads in flight, not 2 (2 ranks reach the
// GPU's bandwidth only so). The same adds in the same order for every (W, U, G).
template <class D, int W, int U, int G, bool ALL>
__device__ __forceinline__ void io_reduce_range(const TparArgs& a, TPAR_IDX lo, TPAR_IDX hi) {
    typedef TPAR_IDX I;
    const u32 world = W < TPAR_MAX_RANKS ? (u32)W : a.world;
    const I stride = (I)grid_threads();
    for (I base = lo + (I)global_tid(); base < hi; base += stride * (I)U) {
        float acc[U][8];
#pragma unroll
        for (u32 g = 0; g < (u32)W; g += (u32)G) {
            if (g >= world) break;
            V16 x[U][G];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const I v = base + (I)u * stride;
                if (v >= hi) break;
#pragma unroll
                for (u32 j = 0; j < (u32)G; ++j) {
                    if (g + j >= world) break;
                    x[u][j] = io_load(a, g + j, v);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const I v = base + (I)u * stride;
                if (v >= hi) break;
#pragma unroll
                for (u32 j = 0; j < (u32)G; ++j) {
                    if (g + j >= world) break;
                    acc_rank<D>(acc[u], g + j, x[u][j]);  // no canon: caller data, no sentinel here; pack canonicalises the sum
                }
                // The last group: this vector's sum is complete (its accumulator dies here).
                if (g + (u32)G >= world) io_store<D, ALL>(a, v, true, D::pack(acc[u]));
            }
        }
    }
}

// The partial last vector v of a message (lanes past the count read as +0.0), one load at
// a time: one thread, once per call.
template <class D, bool ALL>
__device__ __forceinline__ void io_reduce_tail(const TparArgs& a, u64 v) {
    float acc[8];
    for (u32 q = 0; q < a.world; ++q) {
        acc_rank<D>(acc, q, D::canon(load_partial<D, true>((const void*)tpar_io_sh[q], v * D::LANES, a.count - v * D::LANES)));
    }
    io_store<D, ALL>(a, v, false, D::pack(acc));
}

// Vectors [lo, hi) of the call (io_reduce_range for this call's world: 2, 4 and 8 ranks
// compiled for their world, loads in flight sized to it; any other world generic), the
// partial last vector, if it is in the range, by the grid's first thread.
template <class D, bool ALL>
__device__ __forceinline__ void io_reduce_world(const TparArgs& a, TPAR_IDX lo, TPAR_IDX hi) {
    constexpr int S = TPAR_IO_SLOTS;
    const TPAR_IDX whole_end = (TPAR_IDX)(a.count / D::LANES);
    const TPAR_IDX h = hi < whole_end ? hi : whole_end;
#define TPAR_IO_RANGE(W) io_reduce_range<D, W, (S / W > 0 ? S / W : 1), (W < S ? W : S), ALL>(a, lo, h)
    switch (a.world) {
    case 2: TPAR_IO_RANGE(2); break;
    case 4: TPAR_IO_RANGE(4); break;
    case 8: TPAR_IO_RANGE(8); break;
    default: TPAR_IO_RANGE(TPAR_MAX_RANKS); break;
    }
#undef TPAR_IO_RANGE
    if (h < hi && global_tid() == 0) io_reduce_tail<D, ALL>(a, (u64)h);
}

// The registered all-reduce (see the top of this file); SCATTER: two-shot, else one-shot.
// The caller has checked io_registered.
template <class D, bool SCATTER>
__device__ __forceinline__ void io_all_reduce(const TparArgs& a) {
    typedef TPAR_IDX I;
    TPAR_STAMP(a, 0, false);
    Frame f = frame_begin(a);
    TPAR_STAMP(a, 1, false);
    const u32 gen = f.epoch + 1u;
    barrier_block<TPAR_BAR_ARRIVE>(a, f, 0, gen);  // 1. every rank's input is complete
    TPAR_STAMP(a, 2, false);
    desc_only<D>(a, f, desc_mask(a));  // before any read of a peer that may call something else
    test_pause(a);  // skewed-rank test hook: a slow reader
    const I nvec = (I)vecs_for<D>(a.count);
    I lo = 0, hi = nvec;
    if (SCATTER) {
        const I cvec = (nvec + a.world - 1u) / a.world;
        lo = (I)a.rank * cvec < nvec ? (I)a.rank * cvec : nvec;
        hi = lo + cvec < nvec ? lo + cvec : nvec;
    }
    if (f.ok) io_reduce_world<D, SCATTER>(a, lo, hi);  // 2.
    TPAR_STAMP(a, 3, true);
    pdl_launch_dependents();
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
#ifndef TPAR_TEST_UNSAFE_NO_END_BARRIER
    // 3. every peer is done with my buffers: one-shot's peers only read my input; two-shot's
    // also wrote into my output, and their release publishes those stores.
    if (SCATTER) barrier_block<TPAR_BAR_RELEASE>(a, f, 1, gen);
    else barrier_block<TPAR_BAR_READS_DONE>(a, f, 1, gen);
#endif
    TPAR_STAMP(a, 4, false);
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

// ---------------------------------------------------------------------------------------
// Field offsets as this compiler lays them out; the host checks them against abi.rs.
// out[0..8] = offsets of TparArgs.{flags, state, err, input, count, slot_vecs, timeout_ns, rank},
// out[8] = TparError.waited_ns, out[9] = TparState.err_claim, out[10] = TparArgs.desc_code,
// out[11] = TparError.theirs, out[12] = TparState.buf, out[13] = TparState.prev_nvec,
// out[14] = TparState.prev_kind, out[15] = TparArgs.islands, out[16..21] =
// TparFusedArgs.{n, n.residual_out, n.weight, n.hidden, n.eps_bits}, sizeof(TparFusedArgs),
// out[22] = TparArgs.io, out[23] = TparIo.output, out[24..27] = TparFusedArgs.n.{scale, flags, scale_out}.
extern "C" __global__ void tpar_abi_offsets(u64* out) {
    TparArgs a;
    TparError e;
    TparState s;
    TparIo io;
    TparFusedArgs fa;
    const char* fb = (const char*)&fa;
    out[16] = (u64)((const char*)&fa.n - fb);
    out[17] = (u64)((const char*)&fa.n.residual_out - fb);
    out[18] = (u64)((const char*)&fa.n.weight - fb);
    out[19] = (u64)((const char*)&fa.n.hidden - fb);
    out[20] = (u64)((const char*)&fa.n.eps_bits - fb);
    out[21] = (u64)sizeof(TparFusedArgs);
    out[24] = (u64)((const char*)&fa.n.scale - fb);
    out[25] = (u64)((const char*)&fa.n.flags - fb);
    out[26] = (u64)((const char*)&fa.n.scale_out - fb);
    const char* b = (const char*)&a;
    const char* sb = (const char*)&s;
    out[0] = (u64)((const char*)&a.flags - b);
    out[1] = (u64)((const char*)&a.state - b);
    out[2] = (u64)((const char*)&a.err - b);
    out[3] = (u64)((const char*)&a.input - b);
    out[4] = (u64)((const char*)&a.count - b);
    out[5] = (u64)((const char*)&a.slot_vecs - b);
    out[6] = (u64)((const char*)&a.timeout_ns - b);
    out[7] = (u64)((const char*)&a.rank - b);
    out[8] = (u64)((const char*)&e.waited_ns - (const char*)&e);
    out[9] = (u64)((const char*)&s.err_claim - sb);
    out[10] = (u64)((const char*)&a.desc_code - b);
    out[11] = (u64)((const char*)&e.theirs - (const char*)&e);
    out[12] = (u64)((const char*)&s.buf - sb);
    out[13] = (u64)((const char*)&s.prev_nvec - sb);
    out[14] = (u64)((const char*)&s.prev_kind - sb);
    out[15] = (u64)((const char*)&a.islands - b);
    out[22] = (u64)((const char*)&a.io - b);
    out[23] = (u64)((const char*)&io.output - (const char*)&io);
}

// Launch-floor probe: one empty kernel per rank, launched exactly like a collective. What it
// costs is what emulating ranks as concurrent kernels on one GPU costs before any
// communication; the bench prints it beside the algorithms.
extern "C" __global__ void __launch_bounds__(TPAR_THREADS) tpar_noop(const TparArgs a) {}
