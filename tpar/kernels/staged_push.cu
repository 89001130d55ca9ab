// staged_push.cu — one-shot push in world-1 steps, one outbound and one inbound flow per
// rank per step (for PCIe fabrics whose all-to-all bandwidth collapses under many flows).
//
// Step s (1..world-1): rank r writes its input into slot [r] of rank (r+s)'s inbox, then
// waits until slot [(r-s)] of its own inbox has fully arrived before starting step s+1.
// After the last step every slot is present; reduce in rank order 0..world-1 in f32, write
// the output, clear. The pacing is per thread (each thread waits for its own vectors), so
// flows are bounded per rank without a block-wide barrier.
//
// Deadlock freedom: every step-s write is issued after the step-(s-1) wait, and the step-1
// writes wait for nothing, so by induction every awaited write is issued.
// Buffer reuse: the same inbox and the same argument as oneshot_push.cu.
#include "common.cuh"

template <class D>
__device__ void staged_push(const TparArgs& a) {
    Frame f = frame_begin(a);
    const u32 par = f.epoch & 1u;
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;

    for (u32 s = 1; s < a.world; ++s) {
        const u32 dst = (a.rank + s) % a.world;
        const u32 src = (a.rank + a.world - s) % a.world;
        for (u64 v = first; v < nvec; v += stride) {
            st_volatile_v16(inbox_at(a, dst, par, a.rank, v), D::canon(load_input<D>(a, v)));
        }
        if (s == 1) frame_mid(a, f);
        for (u64 v = first; v < nvec; v += stride) {
            (void)poll_until_not_sentinel<D>(a, f, inbox_at(a, a.rank, par, src, v), src, TPAR_PHASE_STAGED);
        }
    }
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = D::canon(load_input<D>(a, v));  // before the polls (see oneshot_push.cu)
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

TPAR_INSTANTIATE(staged_push)
