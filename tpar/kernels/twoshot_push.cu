// twoshot_push.cu — two-shot push all-reduce: reduce-scatter by writes, then all-gather by
// writes, both over the sentinel protocol. Each rank sends 2(world-1)/world of the message.
//
// The message's vectors are cut into world chunks; rank q owns chunk q.
//  1. reduce-scatter: rank r writes its input's chunk q into slot [r] of rank q's inbox.
//  2. rank r polls its inbox for chunk r from every peer, reduces in rank order 0..world-1
//     in f32, canonicalises (an all-ones lane -> the canonical NaN), writes the result to its own output and into
//     every peer's gather area, then clears the inbox vectors it consumed.
//  3. all-gather: rank r polls its gather area for every other chunk, copies it to the
//     output and clears it. Every rank's output is the owner's bits: bitwise identical.
//
// Buffer reuse: inbox and gather area at parity p are written next by a peer's call k+2,
// which it reaches only after my call-k+1 contributions, issued after my call k (and its
// clears) completed. Same argument as oneshot_push.cu.
#include "common.cuh"

template <class D>
__device__ void twoshot_push(const TparArgs& a) {
    Frame f = frame_begin(a);
    const u32 par = f.epoch & 1u;
    const u64 nvec = vecs_for<D>(a.count);
    const u64 cvec = (nvec + a.world - 1) / a.world;  // vectors per chunk
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;

    // 1. reduce-scatter writes.
    for (u32 i = 1; i < a.world; ++i) {
        const u32 q = (a.rank + i) % a.world;
        const u64 lo = (u64)q * cvec;
        const u64 hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (u64 v = lo + first; v < hi; v += stride) {
            st_volatile_v16(inbox_at(a, q, par, a.rank, v), D::canon(load_input<D>(a, v)));
        }
    }
    frame_mid(a, f);
    // 2. reduce my chunk (all peers' pieces polled at once), publish it.
    {
        const u64 lo = (u64)a.rank * cvec;
        const u64 hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (u64 v = lo + first; v < hi; v += stride) {
            const V16 own = D::canon(load_input<D>(a, v));  // before the polls (see oneshot_push.cu)
            V16 x[TPAR_MAX_RANKS];
            poll_all_peers<D, SLOT_INBOX>(a, f, x, par, v, cvec, nvec, TPAR_PHASE_RS_POLL);
            const V16 r = reduce_in_rank_order<D>(a, x, own);
            store_output<D>(a, v, r);
            for (u32 i = 1; i < a.world; ++i) {
                st_volatile_v16(gather_at(a, (a.rank + i) % a.world, par, v), r);
            }
            if (f.ok) {
                for (u32 q = 0; q < a.world; ++q) {
                    if (q != a.rank) st_volatile_v16(inbox_at(a, a.rank, par, q, v), empty_v16<D>());
                }
            }
        }
    }
    // 3. all-gather: thread j takes index j of every other chunk (the same thread that sent
    //    it in step 1, which keeps in-place calls safe), all chunks polled at once.
    for (u64 j = first; j < cvec; j += stride) {
        V16 x[TPAR_MAX_RANKS];
        poll_all_peers<D, SLOT_GATHER_CHUNK>(a, f, x, par, j, cvec, nvec, TPAR_PHASE_AG_POLL);
        V16* base = slot_base<SLOT_GATHER_CHUNK>(a, par);
#pragma unroll
        for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
            if (q >= a.world) break;
            if (q != a.rank && slot_valid<SLOT_GATHER_CHUNK>(q, j, cvec, nvec)) {
                store_output<D>(a, (u64)q * cvec + j, x[q]);
                if (f.ok) st_volatile_v16(slot_of<SLOT_GATHER_CHUNK>(a, base, par, q, j, cvec), empty_v16<D>());
            }
        }
    }
    frame_end(a, f);
}

TPAR_INSTANTIATE(twoshot_push)
