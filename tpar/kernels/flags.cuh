// flags.cuh — the flag protocol of the push kernels over the host transport, spliced into
// frame.cuh at its end (it uses the frame, descriptors and poll verbs above it).

// ---------------------------------------------------------------------------------------
// The flag protocol (push kernels over the host transport: compiled with -DTPAR_PROTO_FLAGS,
// chosen by the launcher per transport). The sentinel protocol needs every inbox slot back
// at all ones before its next use: over PCIe the clears doubled the write traffic of the one
// link. Here the data need no special value and nothing is cleared:
//  - block b of every rank covers the same vectors (block_range; every rank launches the
//    same grid, as the pull barrier already requires), so one flag per (block, source)
//    guards exactly the data that block b of the reader reads;
//  - the writer sends its vectors with 16-byte stores (no sentinel, no canonical form
//    needed, though kept: the same bits as the sentinel kernels), then block_sync, then thread q
//    stores the call's generation (epoch + 1) into slot [phase][b][me] of rank q's flag
//    area with st.release.sys: cumulative over every store of the block ordered before it
//    by the barrier, so the data are visible over PCIe before the flag (the q threads are one
//    warp: one fence per block and stage);
//  - the reader's thread q polls its own slot [phase][b][q] with ld.acquire.sys (every
//    pending peer in parallel, one thread each; block 0's descriptor threads poll the
//    descriptor in the same pass), then block_sync, then the block reads the data with
//    volatile loads (never a stale L1 line).
// The generation names the call, so a slot never has to be reset: the reader waits for
// gen_reached(slot, epoch + 1), modulo 2^32. A slot [phase][b][src] is written only by rank
// src, one call after another (kernel boundaries order them), so its value only grows; a
// value past the call's generation comes from src's next call, which src starts only after
// its call k (data and flags released) is complete. Reuse of the data slots is the triple
// buffer's argument without the clears: buffer b of my area is written by src in call k and
// next in call k+3, which src reaches only after my call k+2 contributed, i.e. after my call
// k finished reading it; a slot's stale contents are never read, because a reader reads only
// after the flag of its own call. Slots shared with the pull barrier hold the same
// generations (epoch + 1), and the host resets them to the epoch with the epochs.
// Every push kernel has a flag variant; in a workspace that runs them no sentinel call may
// follow (the flag calls leave their data in the inboxes), so the launcher compiles every
// kernel of a workspace for one protocol. The pull kernels need no variant: their barrier
// flags are the same slots with the same generations, and they leave nothing behind.

#ifdef TPAR_PROTO_FLAGS
#define TPAR_FLAGS 1
#else
#define TPAR_FLAGS 0
#endif

// Write once (flag protocol): data that several peers read go once into the writer's own
// area, not once into each reader's: host memory is one memory, and every peer reads it
// there as cheaply as its own. One-shot writes its input into slot [me] of its own inbox,
// hierarchical's first step likewise for its mates; each peer reads slot [q] of rank q's
// inbox (SLOT_OWN_INBOX). At 4 ranks one-shot then writes a third of the bytes (23.3 -> 19.3
// us per 42 KiB call on one H200; bench/results/2026-12-01-h200-host-flags-write-once/README.md). Two-shot keeps one
// copy per reader for its all-gather: written once it measured slower (18.0 -> 19.5 us at
// 4 ranks, 30.4 -> 36.6 at 8): its stage-2 writes overlap its reads (the link is full
// duplex), so fewer of them saved nothing, while peers reading the same lines at once cost.
// Slot [q] of rank q's inbox has one writer (q) and no other kernel writes it.

// A data store of the flag protocol: strong (st.volatile, unclobbered), the block's release
// publishes it. Plain (weak) stores are as correct (the release is cumulative over them) and
// measured the same within the spread, slightly slower at 4 ranks over host (18.2 against
// 17.9 us, twoshot push, bench/results/2026-12-01-h200-host-flag-protocol/README.md).
__device__ __forceinline__ void flag_data_st_v16(V16* p, V16 v) { st_send_v16(p, v); }

// The vectors [lo, hi) of n that block blockIdx.x covers (the same on every rank).
template <class I>
__device__ __forceinline__ void block_range(I n, I& lo, I& hi) {
    const I per = TPAR_TILE_ALIGN((n + gridDim.x - 1u) / gridDim.x);  // fused: whole tiles
    const I l = (I)blockIdx.x * per;
    lo = l < n ? l : n;
    hi = lo + per < n ? lo + per : n;
}

// Every rank but me.
__device__ __forceinline__ u32 all_peers(const TparArgs& a) {
    return ((a.world >= 32u ? 0u : (1u << a.world)) - 1u) & ~(1u << a.rank);
}

// A flag one-shot's share of the call: block b's vectors [lo, hi) (block_range: the same on
// every rank), this thread's first one, and its input loaded before the frame (both in
// flight together; pdl_wait first: the input may be the previous kernel's output).
// One-shot push and staged push (flag variants) start with it and end with reduce_share.
template <class D>
struct BlockShare {
    u64 nvec, hi, bd, first;
    V16 pre;
    // Vector v of my input in canonical form (the first one from registers).
    __device__ __forceinline__ V16 input(const TparArgs& a, u64 v) const {
        return v == first ? pre : D::canon(load_input<D>(a, v));
    }
};
template <class D>
__device__ __forceinline__ BlockShare<D> block_share(const TparArgs& a) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    BlockShare<D> s;
    s.nvec = vecs_for<D>(a.count);
    u64 lo;
    block_range(s.nvec, lo, s.hi);
    s.bd = blockDim.x;
    s.first = lo + threadIdx.x;
    s.pre = {0u, 0u, 0u, 0u};
    if (s.first < s.hi) s.pre = D::canon(load_input<D>(a, s.first));
    return s;
}
// Reduces the share from slot K of every peer in `peers` (their flags already seen) and my
// input, in rank order, and hands each sum to the epilogue `out` (norm.cuh: the plain one
// stores it).
template <class D, int K, class O>
__device__ __forceinline__ void reduce_share(const TparArgs& a, const Frame& f, u32 peers, const BlockShare<D>& s, O& out) {
    for (u64 v = s.first; v < s.hi; v += s.bd) {
        V16 r = load_reduce<D, K>(a, f, peers, v, 0, s.input(a, v));
        out.transform(a, v, r);
        out.put(a, f, v, r);
    }
}

// Publishes this block's stores so far to every rank in `mask` (never me): block_sync, then
// thread q stores `gen` into slot [phase][block][me] of rank q with st.release.sys.
__device__ __forceinline__ void flags_publish(const TparArgs& a, u32 phase, u32 gen, u32 mask) {
    block_sync();
    const u32 q = threadIdx.x;
    if (q < TPAR_MAX_RANKS && ((mask >> q) & 1u)) st_release_sys_u32(flag_at(a, q, phase, blockIdx.x, a.rank), gen);
}

// Waits until every rank in `mask` has published `gen` for this block in `phase`; thread q
// waits for rank q, and a descriptor thread (`dm`, its one-bit mask or 0) also checks its
// peer's descriptor in the same passes. Ends with block_sync: every thread of the block may
// then read the data. A timeout names the rank awaited and `err_phase`.
__device__ __forceinline__ void flags_wait(const TparArgs& a, Frame& f, u32 phase, u32 gen, u32 mask, u32 dm, u32 err_phase) {
    const u32 q = threadIdx.x;
    bool want = q < TPAR_MAX_RANKS && ((mask >> q) & 1u);
    bool want_desc = dm != 0u;
    u32 polls = 0;
    while ((want || want_desc) && f.ok) {
        V16 d;
        u32 g = 0u;
        // The descriptor first: the acquire orders only what follows it.
        if (want_desc) d = ld_poll_v16(desc_at(a, a.rank, f.buf, q));
        if (want) g = ld_acquire_sys_u32(flag_at(a, a.rank, phase, blockIdx.x, q));
        if (want && gen_reached(g, gen)) want = false;
        if (want_desc && desc_is_for(d, f.epoch)) {
            want_desc = false;
            desc_compare(a, f, q, d);
        }
        if (!(want || want_desc) || !f.ok) break;
        if (!still_waiting(a, f, polls, q, want ? err_phase : TPAR_PHASE_DESC)) break;
    }
    block_sync();
}
