// oneshot_push.cu — one-shot push all-reduce over the sentinel protocol.
//
// Every rank writes its whole input into slot [rank] of every peer's inbox (buffer `buf` of
// three), then polls its OWN inbox — every peer still missing in one pass — until no lane of
// any peer's slot is empty (all ones), reduces in rank order 0..world-1 in f32 and writes
// the output. While it waits it clears what the previous call left in its buffer (see
// common.cuh: three buffers, cleared one call behind). Reads nothing remote: only posted
// writes cross the fabric; one one-way trip on the critical path, no fence, no barrier.
//
// Buffer reuse: slot [src] of my inbox in buffer b is written next by src's call k+3, and
// cleared by my call k+1; src reaches call k+2 only after my call k+1 (clears included)
// completed, so the clears land before the next write.
#define TPAR_FUSED_READY 1  // has a fused variant (norm.cuh: residual add + RMSNorm)
#define TPAR_CLUSTER_ROWS_READY 1  // has a cluster variant of the fused one (norm.cuh: -DTPAR_FUSED_CLUSTER)
#define TPAR_GATHER_SCATTER_READY 1  // has all-gather and reduce-scatter entries (below)
#include "common.cuh"

#if TPAR_FLAGS
// The flag protocol (host transport, flags.cuh): block b writes the vectors [lo, hi) it
// covers once, into slot [me] of my own inbox (write once, flags.cuh), publishes its flag to
// every peer, waits for every peer's flag for block b (the descriptors ride along), then
// reads slot [q] of every peer q's inbox and reduces. Nothing cleared. Block b reads and
// writes only its own vectors (in place: safe). Reuse: slot [me] of buffer b is next
// written by my call k+3 (k+2 would do, docs/cuda.md), which I start only after my call
// k+2 had every peer's flag, which each peer publishes only after its call k (its reads of
// my slot included) has completed.
template <class D, class O>
__device__ void oneshot_push(const TparArgs& a, O& out) {
    const BlockShare<D> s = block_share<D>(a);
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    const u32 peers = all_peers(a);
    for (u64 v = s.first; v < s.hi; v += s.bd)
        flag_data_st_v16(inbox_at(a, a.rank, f.buf, a.rank, v), s.input(a, v));  // once, into my own area
    flags_publish(a, 0, gen, peers);
    pdl_launch_dependents();
    out.stage(a, s.first < s.hi ? s.first : ~0ull);  // only a vector this thread reduces: its copy is waited for
    test_pause(a);
    flags_wait(a, f, 0, gen, peers, desc_mask(a), TPAR_PHASE_PUSH_POLL);
    reduce_share<D, SLOT_OWN_INBOX>(a, f, peers, s, out);
    if (O::fused())
        for (u64 v = s.first; v < s.hi; v += s.bd) out.norm(a, f, v);
    frame_end(a, f, s.nvec, TPAR_KIND_NONE);
}
#else

template <class D, class O>
__device__ void oneshot_push(const TparArgs& a, O& out) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    const u32 world = a.world, rank = a.rank;
    // Push: staggered destination order so that peers are not all written in one order.
    // The first input vector is loaded before the state, both in flight together.
    V16 pre = {0u, 0u, 0u, 0u};
    if (first < nvec) pre = D::canon(load_input<D>(a, first));
    Frame f = frame_begin(a);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 mine = v == first ? pre : D::canon(load_input<D>(a, v));
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            st_send_v16(inbox_at(a, q, f.buf, rank, v), mine);
        }
    }
    pdl_launch_dependents();
    out.stage(a, first);
    test_pause(a);
    clear_previous<D>(a, f);
    // Poll (every peer still missing, in one pass; the descriptors ride along) and reduce.
    const u32 peers = peers_mask<SLOT_INBOX>(a, 0, 0, nvec);
    u32 dm = desc_mask(a);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = v == first ? pre : D::canon(load_input<D>(a, v));
        V16 r = poll_reduce<D, SLOT_INBOX>(a, f, peers, dm, v, 0, TPAR_PHASE_PUSH_POLL, own);
        dm = 0u;
        out.transform(a, v, r);
        out.put(a, f, v, r);
    }
    desc_only<D>(a, f, dm);  // a descriptor thread past the message's last vector
    if (O::fused())
        for (u64 v = first; v < nvec; v += stride) out.norm(a, f, v);
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}
#endif  // TPAR_FLAGS

TPAR_INSTANTIATE_FUSABLE(oneshot_push)

// ---------------------------------------------------------------------------------------
// All-gather and reduce-scatter by the same pushes (docs/cuda.md "All-gather and
// reduce-scatter"). `a.count` is the per-rank count as nccl-tests counts it: the
// all-gather's input (its output holds world x count), the reduce-scatter's output (its
// input holds world x count). The host runs them only where count x element size is whole
// 16-byte vectors (the plan's and the launcher's condition), so rank q's part starts at
// vector q x nvec and no vector is partial. They use the inbox exactly as the all-reduce
// does: slot [src] of the owner's inbox, nvec vectors, the same buffers, the same clears one
// call behind (TPAR_KIND_INBOX) and the same descriptors (desc_code says which collective).
// A writer sends the canonical form (a NaN whose lanes are all ones becomes the canonical
// NaN, as in the all-reduce), and the all-gather's own part is stored in that form too, so
// every rank's output is the same bits. (input_vec / output_vec: common.cuh.)

#if TPAR_FLAGS
// Flag protocol (host transport): every rank writes once into its own area and peers read
// it there. All-gather: my input into slot [me] of my inbox; rank q's part read from slot
// [q] of rank q's inbox. Reduce-scatter: my piece for owner j into slot [j] of my inbox;
// owner j reads slot [j] of every rank's inbox (SLOT_PEER_FOR_ME). Block b covers the same
// vectors on every rank (block_range), so one flag per (block, source) guards them. Reuse as
// for the all-reduce's flag variant: a slot of buffer b is next written in call k+3.
template <class D>
__device__ void oneshot_push_all_gather(const TparArgs& a) {
    const BlockShare<D> s = block_share<D>(a);
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    const u32 peers = all_peers(a);
    for (u64 v = s.first; v < s.hi; v += s.bd) {
        const V16 x = s.input(a, v);
        flag_data_st_v16(inbox_at(a, a.rank, f.buf, a.rank, v), x);
        output_vec(a, (u64)a.rank * s.nvec + v, x);
    }
    flags_publish(a, 0, gen, peers);
    pdl_launch_dependents();
    test_pause(a);
    flags_wait(a, f, 0, gen, peers, desc_mask(a), TPAR_PHASE_PUSH_POLL);
    for (u64 v = s.first; v < s.hi; v += s.bd) {
        V16 x[TPAR_MAX_RANKS];
        load_peers<SLOT_OWN_INBOX>(a, f, x, peers, v, 0);
#pragma unroll
        for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
            if (q >= a.world) break;
            if (q != a.rank) output_vec(a, (u64)q * s.nvec + v, x[q]);
        }
    }
    frame_end(a, f, s.nvec, TPAR_KIND_NONE);
}

template <class D>
__device__ void oneshot_push_reduce_scatter(const TparArgs& a) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const u64 nvec = vecs_for<D>(a.count);
    u64 lo, hi;
    block_range(nvec, lo, hi);
    const u64 first = lo + threadIdx.x, bd = blockDim.x;
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    const u32 peers = all_peers(a);
    for (u64 v = first; v < hi; v += bd) {
        for (u32 i = 1; i < a.world; ++i) {
            const u32 j = a.rank + i < a.world ? a.rank + i : a.rank + i - a.world;
            flag_data_st_v16(inbox_at(a, a.rank, f.buf, j, v), D::canon(input_vec(a, (u64)j * nvec + v)));
        }
    }
    flags_publish(a, 0, gen, peers);
    pdl_launch_dependents();
    test_pause(a);
    flags_wait(a, f, 0, gen, peers, desc_mask(a), TPAR_PHASE_PUSH_POLL);
    for (u64 v = first; v < hi; v += bd) {
        const V16 own = D::canon(input_vec(a, (u64)a.rank * nvec + v));
        output_vec(a, v, load_reduce<D, SLOT_PEER_FOR_ME>(a, f, peers, v, 0, own));
    }
    frame_end(a, f, nvec, TPAR_KIND_NONE);
}
#else

// Sentinel protocol: as the all-reduce's one-shot push, with every peer's slot copied to its
// place in the output (all-gather) or my piece summed in rank order (reduce-scatter).
template <class D>
__device__ void oneshot_push_all_gather(const TparArgs& a) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    const u32 world = a.world, rank = a.rank;
    Frame f = frame_begin(a);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 mine = D::canon(input_vec(a, v));
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            st_send_v16(inbox_at(a, q, f.buf, rank, v), mine);
        }
        output_vec(a, (u64)rank * nvec + v, mine);
    }
    pdl_launch_dependents();
    test_pause(a);
    clear_previous<D>(a, f);
    const u32 peers = peers_mask<SLOT_INBOX>(a, 0, 0, nvec);
    u32 dm = desc_mask(a);
    for (u64 v = first; v < nvec; v += stride) {
        V16 x[TPAR_MAX_RANKS];
        poll_peers<D, SLOT_INBOX>(a, f, x, peers, dm, v, 0, TPAR_PHASE_PUSH_POLL);
        dm = 0u;
#pragma unroll
        for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
            if (q >= world) break;
            if (q != rank) output_vec(a, (u64)q * nvec + v, x[q]);
        }
    }
    desc_only<D>(a, f, dm);  // a descriptor thread past the message's last vector
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}

template <class D>
__device__ void oneshot_push_reduce_scatter(const TparArgs& a) {
    pdl_wait();
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    const u32 world = a.world, rank = a.rank;
    Frame f = frame_begin(a);
    for (u64 v = first; v < nvec; v += stride) {
        for (u32 i = 1; i < world; ++i) {
            const u32 j = rank + i < world ? rank + i : rank + i - world;
            st_send_v16(inbox_at(a, j, f.buf, rank, v), D::canon(input_vec(a, (u64)j * nvec + v)));
        }
    }
    pdl_launch_dependents();
    test_pause(a);
    clear_previous<D>(a, f);
    const u32 peers = peers_mask<SLOT_INBOX>(a, 0, 0, nvec);
    u32 dm = desc_mask(a);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = D::canon(input_vec(a, (u64)rank * nvec + v));
        const V16 r = poll_reduce<D, SLOT_INBOX>(a, f, peers, dm, v, 0, TPAR_PHASE_PUSH_POLL, own);
        dm = 0u;
        output_vec(a, v, r);
    }
    desc_only<D>(a, f, dm);
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}
#endif  // TPAR_FLAGS

TPAR_INSTANTIATE_GATHER_SCATTER(oneshot_push)
