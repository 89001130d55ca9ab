// oneshot_push.cu — one-shot push all-reduce over the sentinel protocol.
//
// Every rank writes its whole input into slot [rank] of every peer's inbox (parity epoch&1),
// then polls its OWN inbox until no lane of any peer's slot is empty (all ones), reduces in rank order
// 0..world-1 in f32, writes the output, and clears what it consumed back to empty.
// Reads nothing remote: only posted writes cross the fabric.
//
// Buffer reuse: slot [src] of my inbox at parity p is written next by src's call k+2. src
// reaches call k+2 only after finishing call k+1, which needed my call-k+1 push, which I
// issue only after my call k — including the clears below — has completed (kernel boundary
// on my stream). So the clears always land before the next write to the same slot.
#include "common.cuh"

template <class D>
__device__ void oneshot_push(const TparArgs& a) {
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // The first input vector is loaded before the epoch read so the two latencies overlap.
    V16 pre = {0u, 0u, 0u, 0u};
    if (first < nvec) pre = D::canon(load_input<D>(a, first));
    Frame f = frame_begin(a);
    const u32 par = f.epoch & 1u;

    // Push: staggered destination order so that peers are not all written in one order.
    for (u64 v = first; v < nvec; v += stride) {
        const V16 mine = v == first ? pre : D::canon(load_input<D>(a, v));
        for (u32 i = 1; i < a.world; ++i) {
            const u32 q = (a.rank + i) % a.world;
            st_volatile_v16(inbox_at(a, q, par, a.rank, v), mine);
        }
    }
    frame_mid(a, f);
    // Poll (all peers at once) and reduce in rank order.
    for (u64 v = first; v < nvec; v += stride) {
        // Own vector loaded before any poll: a volatile poll is a compiler barrier, so a load
        // after it would add a memory latency to the critical path.
        const V16 own = v == first ? pre : D::canon(load_input<D>(a, v));
        V16 x[TPAR_MAX_RANKS];
        poll_all_peers<D, SLOT_INBOX>(a, f, x, par, v, 0, nvec, TPAR_PHASE_PUSH_POLL);
        store_output<D>(a, v, reduce_in_rank_order<D>(a, x, own));
        if (f.ok) {
            for (u32 q = 0; q < a.world; ++q) {
                if (q != a.rank) st_volatile_v16(inbox_at(a, a.rank, par, q, v), empty_v16<D>());
            }
        }
    }
    frame_end(a, f);
}

TPAR_INSTANTIATE(oneshot_push)
