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
#include "common.cuh"

template <class D>
__device__ void oneshot_pull(const TparArgs& a) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    // The first input vector is loaded before the state, both in flight together.
    V16 pre = {0u, 0u, 0u, 0u};
    if (first < nvec) pre = D::canon(load_input<D>(a, first));
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    for (u64 v = first; v < nvec; v += stride) {
        st_v16(pull_at(a, a.rank, f.buf, 0, v), v == first ? pre : D::canon(load_input<D>(a, v)));
    }
    pdl_launch_dependents();
    barrier_block(a, f, 0, gen);
    const u32 dm = desc_mask(a);
    V16 d = {0u, 0u, 0u, 0u};
    if (dm) d = desc_prefetch(a, f, dm);
    const u32 peers = peers_mask<SLOT_PULL_EXPOSED>(a, 0, 0, nvec);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = v == first ? pre : D::canon(load_input<D>(a, v));
        V16 x[TPAR_MAX_RANKS];
        load_peers<SLOT_PULL_EXPOSED>(a, f, x, peers, v, 0);
        store_output<D>(a, v, reduce_in_rank_order<D>(a, x, own));
    }
    if (dm) desc_check<D>(a, f, d, dm);
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
    frame_end(a, f, nvec, TPAR_KIND_NONE);
}

TPAR_INSTANTIATE(oneshot_pull)
