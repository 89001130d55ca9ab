// staged_push.cu — one-shot push in world-1 steps, one outbound and one inbound flow per
// rank per step (for PCIe fabrics whose all-to-all bandwidth collapses under many flows).
//
// Step s (1..world-1): rank r writes its input into slot [r] of rank (r+s)'s inbox, clears
// slot [(r-s)] of its inbox in the previous call's buffer (the clear one call behind, one
// source per step), then waits until slot [(r-s)] of this call's buffer has fully arrived
// before starting step s+1. The last step does not wait on its own: the final pass polls
// every peer (all but the last already there), reduces in rank order 0..world-1 in f32 and
// writes the output, so the last arrival costs one dependent poll, not two. The pacing is
// per thread (each thread waits for its own vectors), so flows are bounded per rank without
// a block-wide barrier. At two ranks this is one-shot push.
//
// Deadlock freedom: every step-s write is issued after the step-(s-1) wait, and the step-1
// writes wait for nothing, so by induction every awaited write is issued.
// Buffer reuse: the same inbox, buffers and argument as oneshot_push.cu (every clear of the
// previous call's buffer still happens inside this call).
#include "common.cuh"

#if TPAR_FLAGS
// The flag protocol (host transport, flags.cuh): step s sends block b's vectors [lo, hi) to
// rank r+s, publishes its flag to that rank alone, and (but the last step) waits for the flag
// of rank r-s for block b before step s+1; the final wait takes the last step's peer, then
// the block reads every peer's slot and reduces. Every flag slot [0][b][src] is src's alone,
// so one phase serves every step. Nothing cleared.
template <class D>
__device__ void staged_push(const TparArgs& a) {
    const BlockShare<D> s = block_share<D>(a);
    Frame f = frame_begin(a);
    const u32 gen = f.epoch + 1u;
    const u32 world = a.world, rank = a.rank;
    u32 dm = desc_mask(a);
    for (u32 step = 1; step < world; ++step) {
        const u32 dst = rank + step < world ? rank + step : rank + step - world;
        const u32 src = rank >= step ? rank - step : rank + world - step;
        for (u64 v = s.first; v < s.hi; v += s.bd) flag_data_st_v16(inbox_at(a, dst, f.buf, rank, v), s.input(a, v));
        flags_publish(a, 0, gen, 1u << dst);
        if (step == 1) {
            pdl_launch_dependents();
            test_pause(a);
        }
        flags_wait(a, f, 0, gen, 1u << src, dm, step == world - 1 && world > 2 ? TPAR_PHASE_PUSH_POLL : TPAR_PHASE_STAGED);
        dm = 0u;
    }
    PlainOut<D> out;
    reduce_share<D, SLOT_INBOX>(a, f, all_peers(a), s, out);
    frame_end(a, f, s.nvec, TPAR_KIND_NONE);
}
#else

template <class D>
__device__ void staged_push(const TparArgs& a) {
    pdl_wait();  // before the first input load (frame_begin waits again: a no-op)
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    const u32 world = a.world, rank = a.rank;
    // The first vector of this thread stays in registers for every step and the reduce
    // (loaded before the state: both in flight together).
    const V16 pre = first < nvec ? D::canon(load_input<D>(a, first)) : empty_v16<D>();
    Frame f = frame_begin(a);
    const bool per_step_clear = previous_kind(a, f) == TPAR_KIND_INBOX;
    u32 dm = desc_mask(a);

    for (u32 s = 1; s < world; ++s) {
        const u32 dst = rank + s < world ? rank + s : rank + s - world;
        const u32 src = rank >= s ? rank - s : rank + world - s;
        for (u64 v = first; v < nvec; v += stride) {
            st_send_v16(inbox_at(a, dst, f.buf, rank, v), v == first ? pre : D::canon(load_input<D>(a, v)));
        }
        if (s == 1) {
            pdl_launch_dependents();
            test_pause(a);
            if (!per_step_clear) clear_previous<D>(a, f);  // another kind of call: all at once
        }
        if (per_step_clear) clear_previous_slot<D>(a, f, src);
        if (s == world - 1) break;  // the final pass waits for the last step's peer
        for (u64 v = first; v < nvec; v += stride) {
            poll_one<D>(a, f, inbox_at(a, rank, f.buf, src, v), src, dm, TPAR_PHASE_STAGED);
            dm = 0u;
        }
    }
    const u32 peers = peers_mask<SLOT_INBOX>(a, 0, 0, nvec);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = v == first ? pre : D::canon(load_input<D>(a, v));
        const V16 r = poll_reduce<D, SLOT_INBOX>(a, f, peers, dm, v, 0, world == 2 ? TPAR_PHASE_STAGED : TPAR_PHASE_PUSH_POLL, own);
        dm = 0u;
        store_output<D>(a, v, r);
    }
    desc_only<D>(a, f, dm);  // a descriptor thread past the message's last vector
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}
#endif  // TPAR_FLAGS

TPAR_INSTANTIATE(staged_push)
