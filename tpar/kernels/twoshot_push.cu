// twoshot_push.cu — two-shot push all-reduce: reduce-scatter by writes, then all-gather by
// writes, both over the sentinel protocol. Each rank sends 2(world-1)/world of the message.
//
// The message's vectors are cut into world chunks of cvec vectors; rank q owns chunk q.
// Every thread of every block shares each stage (items flattened over the grid, TPAR_UNROLL
// independent 16-byte loads in flight per thread):
//  1. reduce-scatter: rank r writes its input's chunk q into slot [r] of rank q's inbox.
//  2. rank r polls its inbox for chunk r from every peer still missing (one pass), reduces
//     in rank order 0..world-1 in f32, canonicalises, writes the result to its own output
//     and into every peer's gather area.
//  3. all-gather: rank r polls its gather area for every other chunk and copies it out.
// Every rank's output is the owner's bits: bitwise identical. Two one-way trips.
// In-place calls are safe: a gathered vector of chunk q exists only after q reduced it,
// which needed my reduce-scatter write of it, which came after my read of that input.
//
// Buffer reuse: inbox and gather area of buffer b are cleared by my next call (one call
// behind) and written next by a peer's call k+3. Same argument as oneshot_push.cu.
#define TPAR_LEAN_READY 1  // has a lean variant (frame.cuh: peers in groups)
#define TPAR_LEAN_PEER_GROUP 3  // 4 spills a register in one (arch, dtype)
#define TPAR_FUSED_READY 1  // has a fused variant (norm.cuh: residual add + RMSNorm)
#include "common.cuh"

// Item i of the reduce-scatter and the all-gather, (peer rank+1+k, index i % cvec of its
// chunk): the vector, and in `q` the chunk's owner. The flag variant's block-local items
// are the same map over its block's part [jb, jb + span) of each chunk (cvec = span, and
// `jb` added).
template <class I>
__device__ __forceinline__ I twoshot_item(I i, u32 rank, u32 world, u32 span, I cvec, I jb, u32& q) {
    const u32 k = (u32)i / span;  // 32-bit: a message has < 2^32 vectors
    q = rank + 1u + k < world ? rank + 1u + k : rank + 1u + k - world;
    return (I)q * cvec + jb + ((u32)i - k * span);
}

#if TPAR_FLAGS
// The flag protocol (host transport, flags.cuh): block b covers the same indices [jb, je) of
// every chunk on every rank. Stage 1 sends them to their owners, publishes flag phase 0;
// stage 2 waits for phase 0 from every peer, reduces, sends the result to every gather area,
// publishes phase 1; stage 3 waits for phase 1 from every peer and copies. Nothing cleared.
// In-place calls: block b reads and writes only its own indices, in that order.
template <class D, class O>
__device__ void twoshot_push(const TparArgs& a, O& out) {
    typedef TPAR_IDX I;  // vector indices (u64; u32 in the lean variant)
    Frame f = frame_begin(a);
    const u32 world = a.world, rank = a.rank;
    const I nvec = (I)vecs_for<D>(a.count);
    const I cvec = TPAR_TILE_ALIGN((u32)(nvec + world - 1) / world);  // vectors per chunk (a message has < 2^32)
    I jb, je;
    block_range(cvec, jb, je);
    const u32 span = (u32)(je - jb);
    const I t = threadIdx.x, bd = blockDim.x;
    const I items = (I)(world - 1u) * span;  // (peer, index in my block's part of its chunk)
    const u32 gen = f.epoch + 1u;
    const u32 peers = all_peers(a);
    const I lo = (I)rank * cvec;
    out.prefetch(a, lo + jb + t);

    // 1. reduce-scatter writes; item i: k = i / span (peer rank+1+k), j = jb + i % span.
    for (I base = t; base < items; base += bd * TPAR_UNROLL) {
        V16 val[TPAR_UNROLL];
        V16* dst[TPAR_UNROLL];
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            const I i = base + (I)u * bd;
            dst[u] = (V16*)0;
            if (i < items) {
                u32 q;
                const I v = twoshot_item<I>(i, rank, world, span, cvec, jb, q);
                if (v < nvec) {
                    val[u] = D::canon(load_input<D>(a, v));
                    dst[u] = inbox_at(a, q, f.buf, rank, v);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            if (dst[u]) flag_data_st_v16(dst[u], val[u]);
        }
    }
    flags_publish(a, 0, gen, peers);
    pdl_launch_dependents();
    test_pause(a);
    // 2. every peer's piece of my chunk (flags first, the descriptors ride along), reduce,
    //    publish.
    flags_wait(a, f, 0, gen, peers, desc_mask(a), TPAR_PHASE_RS_POLL);
    for (I j = jb + t; j < je; j += bd) {
        const I v = lo + j;
        if (v >= nvec) break;
        const V16 own = D::canon(load_input<D>(a, v));
        V16 r = load_reduce<D, SLOT_INBOX>(a, f, peers, v, 0, own);
        out.transform(a, v, r);
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            flag_data_st_v16(gather_at(a, q, f.buf, v), r);
        }
        out.put(a, f, v, r);
    }
    flags_publish(a, 1, gen, peers);
    // 3. all-gather: wait for every owner's flag, then copy, TPAR_UNROLL loads in flight.
    flags_wait(a, f, 1, gen, peers, 0u, TPAR_PHASE_AG_POLL);
    for (I base = t; base < items; base += bd * TPAR_UNROLL) {
        V16 val[TPAR_UNROLL];
        I vv[TPAR_UNROLL];
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            const I i = base + (I)u * bd;
            vv[u] = nvec;
            if (i < items) {
                u32 q;
                vv[u] = twoshot_item<I>(i, rank, world, span, cvec, jb, q);
            }
            if (vv[u] < nvec) val[u] = ld_poll_v16(gather_at(a, rank, f.buf, vv[u]));
        }
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u)
            if (vv[u] < nvec) out.put(a, f, vv[u], val[u]);
    }
    if (O::fused()) {  // the same vectors again, normalised: stage 2's, then stage 3's
        for (I j = jb + t; j < je && lo + j < nvec; j += bd) out.norm(a, f, lo + j);
        for (I i = t; i < items; i += bd) {
            u32 q;
            const I v = twoshot_item<I>(i, rank, world, span, cvec, jb, q);
            if (v < nvec) out.norm(a, f, v);
        }
    }
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}
#else

template <class D, class O>
__device__ void twoshot_push(const TparArgs& a, O& out) {
    typedef TPAR_IDX I;  // vector indices (u64; u32 in the lean variant)
    Frame f = frame_begin(a);
    const u32 world = a.world, rank = a.rank;
    const I nvec = (I)vecs_for<D>(a.count);
    const I cvec = TPAR_TILE_ALIGN((u32)(nvec + world - 1) / world);  // vectors per chunk (a message has < 2^32)
    const I stride = (I)grid_threads();
    const I t0 = (I)global_tid();
    const I items = (I)(world - 1u) * cvec;   // (peer, index in its chunk)
    out.prefetch(a, (I)rank * cvec + t0);

    // 1. reduce-scatter writes; item i: k = i / cvec (peer rank+1+k), j = i % cvec.
    for (I base = t0; base < items; base += stride * TPAR_UNROLL) {
        V16 val[TPAR_UNROLL];
        V16* dst[TPAR_UNROLL];
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            const I i = base + (I)u * stride;
            dst[u] = (V16*)0;
            if (i < items) {
                u32 q;
                const I v = twoshot_item<I>(i, rank, world, (u32)cvec, cvec, 0, q);
                if (v < nvec) {
                    val[u] = D::canon(load_input<D>(a, v));
                    dst[u] = inbox_at(a, q, f.buf, rank, v);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            if (dst[u]) st_send_v16(dst[u], val[u]);
        }
    }
    pdl_launch_dependents();
    test_pause(a);
    clear_previous<D>(a, f);
    // 2. reduce my chunk (every peer's piece polled in one pass), publish it.
    const I lo = (I)rank * cvec;
    const I hi = lo + cvec < nvec ? lo + cvec : nvec;
    const u32 peers = peers_mask<SLOT_INBOX>(a, 0, 0, nvec);
    u32 dm = desc_mask(a);
    for (I v = lo + t0; v < hi; v += stride) {
        const V16 own = D::canon(load_input<D>(a, v));  // before the polls
        V16 r = poll_reduce<D, SLOT_INBOX>(a, f, peers, dm, v, 0, TPAR_PHASE_RS_POLL, own);
        out.transform(a, v, r);
        dm = 0u;
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            st_send_v16(gather_at(a, q, f.buf, v), r);
        }
        out.put(a, f, v, r);
    }
    desc_only<D>(a, f, dm);  // no vector of my chunk for this thread: the descriptor alone
    // 3. all-gather: items as in step 1, polled TPAR_UNROLL at a time in one pass.
    for (I base = t0; base < items; base += stride * TPAR_UNROLL) {
        V16 val[TPAR_UNROLL];
        I vv[TPAR_UNROLL];
        u32 owner[TPAR_UNROLL];  // the chunk owner of each item (named by a timeout)
        u32 pend = 0u;
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u) {
            const I i = base + (I)u * stride;
            vv[u] = 0;
            owner[u] = 0;
            if (i < items) {
                u32 q;
                vv[u] = twoshot_item<I>(i, rank, world, (u32)cvec, cvec, 0, q);
                owner[u] = q;
                if (vv[u] < nvec) pend |= 1u << u;
            }
        }
        const u32 valid = pend;
        u32 polls = 0;
        while (pend && f.ok) {
#pragma unroll
            for (int u = 0; u < TPAR_UNROLL; ++u)
                if (pend & (1u << u)) val[u] = ld_poll_v16(gather_at(a, rank, f.buf, vv[u]));
#pragma unroll
            for (int u = 0; u < TPAR_UNROLL; ++u)
                if ((pend & (1u << u)) && !D::has_empty_lane(val[u])) pend &= ~(1u << u);
            if (!pend) break;
            u32 late = 0u;  // owner of the first missing chunk (static indices: x[] stays in registers)
#pragma unroll
            for (int u = TPAR_UNROLL - 1; u >= 0; --u)
                if (pend & (1u << u)) late = owner[u];
            if (!still_waiting(a, f, polls, late, TPAR_PHASE_AG_POLL)) break;
        }
#pragma unroll
        for (int u = 0; u < TPAR_UNROLL; ++u)
            if (valid & (1u << u)) out.put(a, f, vv[u], val[u]);
    }
    if (O::fused()) {  // the same vectors again, normalised: step 2's, then step 3's items
        for (I v = lo + t0; v < hi; v += stride) out.norm(a, f, v);
        for (I i = t0; i < items; i += stride) {
            u32 q;
            const I v = twoshot_item<I>(i, rank, world, (u32)cvec, cvec, 0, q);
            if (v < nvec) out.norm(a, f, v);
        }
    }
    // What the clear one call behind covers: the fused variant's chunks are whole tiles, so it
    // records the vectors that make clear_previous's chunking (ceil(n / world)) its own.
    frame_end(a, f, TPAR_FUSED_ON ? (u64)cvec * world : (u64)nvec, TPAR_KIND_TWOSHOT);
}
#endif  // TPAR_FLAGS

TPAR_INSTANTIATE_FUSABLE(twoshot_push)
