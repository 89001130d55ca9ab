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
