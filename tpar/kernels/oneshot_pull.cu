// oneshot_pull.cu — one-shot pull all-reduce over the barrier protocol (the design vLLM and
// SGLang ship; for fabrics where reads beat writes).
//
// Each block copies its share of the input into this rank's exposed buffer (buffer `buf`),
// meets block b of every peer at a barrier (thread q signals and waits for rank q: the waits
// run in parallel), reads that share from every peer's exposed buffer (all reads in flight
// at once), reduces in rank order 0..world-1 in f32 and writes the output. Three one-way
// trips: the flag, the read request, the read reply.
//
// Why one barrier suffices: the exposed buffer cycles through three buffers. A peer still
// reading my buffer b is inside call k; I write buffer b again only in call k+3, which I
// enter after finishing call k+2, whose barrier needed every peer to have entered call k+2,
// i.e. to have finished reading in call k.
// Block b of every rank covers the same vectors (same grid, same partition), so a per-block
// barrier orders exactly the data each block reads.
// Registered graph calls (io.cuh) skip the copy: a start barrier, the reduce straight from
// every rank's input, an end barrier (no rank leaves while a peer still reads its input).
#define TPAR_LEAN_READY 1  // has a lean variant (frame.cuh: peers in groups)
#define TPAR_LEAN_PEER_GROUP 3  // 4 spills a register in one (arch, dtype)
#define TPAR_FUSED_READY 1  // has a fused variant (norm.cuh: residual add + RMSNorm)
#define TPAR_CLUSTER_ROWS_READY 1  // has a cluster variant of the fused one (norm.cuh: -DTPAR_FUSED_CLUSTER)
#define TPAR_GATHER_SCATTER_READY 1  // has all-gather and reduce-scatter entries (below)
#include "common.cuh"

template <class D, class O>
__device__ void oneshot_pull(const TparArgs& a, O& out) {
    if (io_registered(a)) {  // a registered graph call: read every input in place (io.cuh; never fused)
        io_all_reduce<D, false>(a);
        return;
    }
    typedef TPAR_IDX I;  // vector indices (u64; u32 in the lean variant)
    TPAR_STAMP(a, 0, false);
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const I nvec = (I)vecs_for<D>(a.count);
    const I stride = (I)grid_threads();
    const I first = (I)global_tid();
    // The first input vector is loaded before the state, both in flight together.
    V16 pre = {0u, 0u, 0u, 0u};
    if (!TPAR_LEAN_ON && first < nvec) pre = load_input<D>(a, first);  // lean: reloaded (4 registers fewer)
    Frame f = frame_begin(a);
    TPAR_STAMP(a, 1, false);
    const u32 gen = f.epoch + 1u;
    for (I v = first; v < nvec; v += stride) {
        st_v16(pull_at(a, a.rank, f.buf, 0, v), !TPAR_LEAN_ON && v == first ? pre : load_input<D>(a, v));
    }
    pdl_launch_dependents();
    barrier_block_then<TPAR_BAR_RELEASE>(a, f, 0, gen, [&] { out.stage(a, first); });  // fused: the copy behind the signal
    TPAR_STAMP(a, 2, false);
    const u32 dm = desc_mask(a);
    V16 d = {0u, 0u, 0u, 0u};
    if (dm && !TPAR_LEAN_ON) d = desc_prefetch(a, f, dm);  // lean: polled after the data (4 registers fewer)
    const u32 peers = peers_mask<SLOT_PULL_EXPOSED>(a, 0, 0, nvec);
    for (I v = first; v < nvec; v += stride) {
        const V16 own = !TPAR_LEAN_ON && v == first ? pre : load_input<D>(a, v);
        V16 r = load_reduce<D, SLOT_PULL_EXPOSED>(a, f, peers, v, 0, own);
        out.transform(a, v, r);
        out.put(a, f, v, r);
    }
    if (dm) {
        if (TPAR_LEAN_ON) desc_only<D>(a, f, dm);
        else desc_check<D>(a, f, d, dm);
    }
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
    TPAR_STAMP(a, 3, true);
    if (O::fused())
        for (I v = first; v < nvec; v += stride) out.norm(a, f, v);
    TPAR_STAMP(a, 4, true);
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

TPAR_INSTANTIATE_FUSABLE(oneshot_pull)

// ---------------------------------------------------------------------------------------
// All-gather and reduce-scatter over the same barrier (docs/cuda.md "All-gather and
// reduce-scatter"): the large-message pair of one-shot push's. `a.count` is per rank, as
// nccl-tests counts it (the all-gather's input, the reduce-scatter's output); the host runs
// them only where count x element size is whole 16-byte vectors, so part q starts at vector
// q x nvec. Each rank writes its data once, into its own exposed buffer, and every reader
// reads it there straight into its output: nothing is written into a peer, nothing is
// staged twice, nothing is cleared. Reuse: the one-barrier argument at the top of this file
// (exposed[buf] is next written in call k+3); block b of every rank covers the same vectors
// v (same grid, same partition), and v's exposed vectors are read only by block b's threads
// of v, so the per-block barrier orders exactly what each block reads.
//
// Registered graph calls (io.cuh: every rank's input as this rank addresses it) skip the
// copy, as the all-reduce's do: a start barrier (every rank's input is complete), the parts
// read straight from every rank's input, an end barrier (no rank leaves while a peer still
// reads its input). An output never overlaps an input here (RankSet and the Python bindings refuse it;
// GpuCommunicator::call makes it the caller's contract), so no
// in-place case arises.
template <class D, bool SCATTER>
__device__ __forceinline__ void io_gather_scatter(const TparArgs& a) {
    typedef TPAR_IDX I;
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    barrier_block<TPAR_BAR_ARRIVE>(a, f, 0, gen);  // every rank's input is complete
    desc_only<D>(a, f, desc_mask(a));  // before any read of a peer that may call something else
    test_pause(a);  // skewed-rank test hook: a slow reader
    const I nvec = (I)vecs_for<D>(a.count);
    const I stride = (I)grid_threads();
    const u32 world = a.world, rank = a.rank;
    if (f.ok) {
        for (I v = (I)global_tid(); v < nvec; v += stride) {
            V16 x[TPAR_MAX_RANKS];  // every rank's load of this vector in flight at once
#pragma unroll
            for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
                if (q >= world) break;
                x[q] = io_load(a, q, SCATTER ? (u64)rank * nvec + v : (u64)v);
            }
            if (SCATTER) {
                float acc[8];
#pragma unroll
                for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
                    if (q >= world) break;
                    acc_rank<D>(acc, q, x[q]);  // caller data, rank order; pack canonicalises the sum
                }
                output_vec(a, v, D::pack(acc));
            } else {
#pragma unroll
                for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
                    if (q >= world) break;
                    output_vec(a, (u64)q * nvec + v, D::canon(x[q]));  // the copy path's bits
                }
            }
        }
    }
    pdl_launch_dependents();
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
#ifndef TPAR_TEST_UNSAFE_NO_END_BARRIER
    barrier_block<TPAR_BAR_READS_DONE>(a, f, 1, gen);  // every peer is done reading my input
#endif
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

// All-gather: my input into exposed[buf] and into part [me] of my output; barrier; part q
// read from rank q's exposed[buf], every peer's load of a vector in flight at once (peer
// groups of TPAR_GATHER_GROUP in the lean variant). The writer stores the canonical form
// (an all-ones lane becomes the canonical NaN, as one-shot push sends it), its own part
// too, so every rank's output is the same bits.
template <class D>
__device__ void oneshot_pull_all_gather(const TparArgs& a) {
    if (io_registered(a)) {  // a registered graph call: read every input in place
        io_gather_scatter<D, false>(a);
        return;
    }
    typedef TPAR_IDX I;
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const I nvec = (I)vecs_for<D>(a.count);
    const I stride = (I)grid_threads();
    const I first = (I)global_tid();
    const u32 world = a.world, rank = a.rank;
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    for (I v = first; v < nvec; v += stride) {
        const V16 x = D::canon(input_vec(a, v));
        st_v16(pull_at(a, rank, f.buf, 0, v), x);
        output_vec(a, (u64)rank * nvec + v, x);
    }
    pdl_launch_dependents();
    barrier_block<TPAR_BAR_RELEASE>(a, f, 0, gen);
    const u32 dm = desc_mask(a);
    V16 d = {0u, 0u, 0u, 0u};
    if (dm && !TPAR_LEAN_ON) d = desc_prefetch(a, f, dm);  // lean: polled after the data
    const u32 peers = peers_mask<SLOT_PULL_EXPOSED>(a, 0, 0, nvec);
    for (I v = first; v < nvec; v += stride) {
#pragma unroll
        for (u32 g = 0; g < TPAR_MAX_RANKS; g += TPAR_GATHER_GROUP) {  // one group unless lean
            if (g >= world) break;
            V16 x[TPAR_GATHER_GROUP];
            load_group<SLOT_PULL_EXPOSED, TPAR_GATHER_GROUP>(a, f, x, g, peers, v, 0);
#pragma unroll
            for (u32 u = 0; u < TPAR_GATHER_GROUP; ++u) {
                const u32 q = g + u;
                if (q >= world) break;
                if (q != rank) output_vec(a, (u64)q * nvec + v, x[u]);
            }
        }
    }
    if (dm) {
        if (TPAR_LEAN_ON) desc_only<D>(a, f, dm);
        else desc_check<D>(a, f, d, dm);
    }
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

// Reduce-scatter: my whole input but my own piece exposed, piece j at exposed vectors
// j x nvec.. of buffer `buf`'s pull area (its exposed and partial slots, 2 x slot_vecs
// vectors: the host runs it only where world x nvec fits, `oneshot_pull::exposed_fits`);
// barrier; piece [me] read from every peer (SLOT_PULL_EXPOSED_MINE), all loads of a vector
// in flight at once, summed in rank order 0..world-1 in f32 with my own piece from my
// input, rounded once: the all-reduce's arithmetic, hence bitwise its slice [me]. Caller
// data are added without the canonical-form pass, as the all-reduce's pull does (the
// exposed area is never polled for the sentinel); the packed sum is canonicalised.
template <class D>
__device__ void oneshot_pull_reduce_scatter(const TparArgs& a) {
    if (io_registered(a)) {  // a registered graph call: read every input in place
        io_gather_scatter<D, true>(a);
        return;
    }
    typedef TPAR_IDX I;
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const I nvec = (I)vecs_for<D>(a.count);
    const I stride = (I)grid_threads();
    const I first = (I)global_tid();
    const u32 world = a.world, rank = a.rank;
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    for (I v = first; v < nvec; v += stride) {
        for (u32 i = 1; i < world; ++i) {
            const u32 j = rank + i < world ? rank + i : rank + i - world;
            const u64 at = (u64)j * nvec + v;
            st_v16(pull_at(a, rank, f.buf, 0, at), input_vec(a, at));
        }
    }
    pdl_launch_dependents();
    barrier_block<TPAR_BAR_RELEASE>(a, f, 0, gen);
    const u32 peers = peers_mask<SLOT_PULL_EXPOSED_MINE>(a, 0, 0, nvec);
    for (I v = first; v < nvec; v += stride) {
        const V16 own = input_vec(a, (u64)rank * nvec + v);
        output_vec(a, v, load_reduce<D, SLOT_PULL_EXPOSED_MINE>(a, f, peers, v, nvec, own));
    }
    // The descriptor polled after the data (a prefetch beside 16 loads in flight spilled on
    // sm_120): the result is void on a mismatch, and it is seen in the descriptor's pass.
    desc_only<D>(a, f, desc_mask(a));
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

TPAR_INSTANTIATE_GATHER_SCATTER(oneshot_pull)
