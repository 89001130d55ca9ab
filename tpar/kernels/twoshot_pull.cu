// twoshot_pull.cu — two-shot pull all-reduce: reduce-scatter by reads, all-gather by reads,
// over the barrier protocol.
//
// Vectors are cut into world chunks; rank q owns chunk q. Within every chunk, block b
// covers the same sub-range on every rank, so per-block barriers suffice.
//  1. copy my input's share into my exposed buffer (parity epoch&1); barrier 0.
//  2. reduce my chunk by reading it from every peer's exposed buffer, rank order 0..world-1,
//     f32; write it to my output and my partial-result buffer; barrier 1.
//  3. read every other chunk's result from its owner's partial-result buffer.
//
// Buffer reuse: both buffers are double-buffered by parity; a peer still reading my
// parity-p buffers is inside call k, and I write parity p again only in call k+2, after a
// barrier of call k+1 that every peer entered after finishing call k.
#include "common.cuh"

template <class D>
__device__ void twoshot_pull(const TparArgs& a) {
    Frame f = frame_begin(a);
    const u32 par = f.epoch & 1u;
    const u32 gen = f.epoch + 1u;
    const u64 nvec = vecs_for<D>(a.count);
    const u64 cvec = (nvec + a.world - 1) / a.world;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;

    // 1. expose my share of every chunk (block b covers sub-range b of each chunk).
    for (u32 q = 0; q < a.world; ++q) {
        const u64 lo = (u64)q * cvec;
        const u64 hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (u64 v = lo + first; v < hi; v += stride) {
            *pull_at(a, a.rank, par, 0, v) = D::canon(load_input<D>(a, v));
        }
    }
    barrier_block(a, f, 0, gen);
    frame_mid(a, f);
    // 2. reduce-scatter by reads.
    {
        const u64 lo = (u64)a.rank * cvec;
        const u64 hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (u64 v = lo + first; v < hi; v += stride) {
            const V16 own = *pull_at(a, a.rank, par, 0, v);
            V16 x[TPAR_MAX_RANKS];
            load_all_peers<SLOT_PULL_EXPOSED>(a, x, par, v, cvec, nvec);
            const V16 r = reduce_in_rank_order<D>(a, x, own);
            *pull_at(a, a.rank, par, 1, v) = r;
            store_output<D>(a, v, r);
        }
    }
    barrier_block(a, f, 1, gen);
    // 3. all-gather by reads: thread j takes index j of every other chunk (the same thread
    //    that exposed it in step 1), all reads in flight at once.
    for (u64 j = first; j < cvec; j += stride) {
        V16 x[TPAR_MAX_RANKS];
        load_all_peers<SLOT_PULL_RESULT_CHUNK>(a, x, par, j, cvec, nvec);
#pragma unroll
        for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
            if (q >= a.world) break;
            if (q != a.rank && slot_valid<SLOT_PULL_RESULT_CHUNK>(q, j, cvec, nvec)) store_output<D>(a, (u64)q * cvec + j, x[q]);
        }
    }
    frame_end(a, f);
}

TPAR_INSTANTIATE(twoshot_pull)
