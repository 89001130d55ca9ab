// oneshot_pull.cu — one-shot pull all-reduce over the barrier protocol (the design vLLM and
// SGLang ship; kept as a baseline and for fabrics where reads beat writes).
//
// Each block copies its share of the input into this rank's exposed buffer (parity
// epoch&1), meets block b of every peer at a barrier, reads that share from every peer's
// exposed buffer, reduces in rank order 0..world-1 in f32 and writes the output.
//
// Why one barrier suffices: the exposed buffer is double-buffered by parity. A peer still
// reading my parity-p buffer is inside call k; I write parity p again only in call k+2,
// which I enter after finishing call k+1, whose barrier needed every peer to have entered
// call k+1, i.e. to have finished reading in call k.
// Block b of every rank covers the same vectors (same grid, same partition), so a per-block
// barrier orders exactly the data each block reads.
#include "common.cuh"

template <class D>
__device__ void oneshot_pull(const TparArgs& a) {
    Frame f = frame_begin(a);
    const u32 par = f.epoch & 1u;
    const u32 gen = f.epoch + 1u;
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;

    for (u64 v = first; v < nvec; v += stride) {
        *pull_at(a, a.rank, par, 0, v) = D::canon(load_input<D>(a, v));
    }
    barrier_block(a, f, 0, gen);
    frame_mid(a, f);
    for (u64 v = first; v < nvec; v += stride) {
        // Every peer's read in flight at once (see the gathering verbs in common.cuh).
        const V16 own = *pull_at(a, a.rank, par, 0, v);
        V16 x[TPAR_MAX_RANKS];
        load_all_peers<SLOT_PULL_EXPOSED>(a, x, par, v, 0, nvec);
        store_output<D>(a, v, reduce_in_rank_order<D>(a, x, own));
    }
    frame_end(a, f);
}

TPAR_INSTANTIATE(oneshot_pull)
