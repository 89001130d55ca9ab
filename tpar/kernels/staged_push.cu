// staged_push.cu — one-shot push in world-1 steps, one outbound and one inbound flow per
// rank per step (for PCIe fabrics whose all-to-all bandwidth collapses under many flows).
//
// Step s (1..world-1): rank r writes its input into slot [r] of rank (r+s)'s inbox, then
// waits until slot [(r-s)] of its own inbox has fully arrived before starting step s+1.
// After the last step every slot is present; reduce in rank order 0..world-1 in f32 and
// write the output. The pacing is per thread (each thread waits for its own vectors), so
// flows are bounded per rank without a block-wide barrier. The clear of the previous call's
// buffer runs during the first wait.
//
// Deadlock freedom: every step-s write is issued after the step-(s-1) wait, and the step-1
// writes wait for nothing, so by induction every awaited write is issued.
// Buffer reuse: the same inbox, buffers and argument as oneshot_push.cu.
#include "common.cuh"

template <class D>
__device__ void staged_push(const TparArgs& a) {
    Frame f = frame_begin(a);
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    u32 dm = desc_mask(a);

    for (u32 s = 1; s < a.world; ++s) {
        const u32 dst = (a.rank + s) % a.world;
        const u32 src = (a.rank + a.world - s) % a.world;
        for (u64 v = first; v < nvec; v += stride) {
            st_send_v16(inbox_at(a, dst, f.buf, a.rank, v), D::canon(load_input<D>(a, v)));
        }
        if (s == 1) {
            pdl_launch_dependents();
            test_pause(a);
            clear_previous<D>(a, f);
        }
        for (u64 v = first; v < nvec; v += stride) {
            V16 x[TPAR_MAX_RANKS];
            poll_peers<D, SLOT_INBOX>(a, f, x, 1u << src, dm, v, 0, TPAR_PHASE_STAGED);
            dm = 0u;
        }
    }
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = D::canon(load_input<D>(a, v));
        V16 x[TPAR_MAX_RANKS];
        poll_peers<D, SLOT_INBOX>(a, f, x, peers_mask<SLOT_INBOX>(a, 0, 0, nvec), 0u, v, 0, TPAR_PHASE_PUSH_POLL);
        store_output<D>(a, v, reduce_in_rank_order<D>(a, x, own));
    }
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}

TPAR_INSTANTIATE(staged_push)
