// hierarchical.cu — hierarchical all-reduce for machines of several islands (two CPU sockets,
// GPUs behind different PCIe switches): one-shot push inside each island, one exchange of the
// island sums across islands, every rank sums the island sums. Sentinel protocol throughout.
//
// TparArgs::islands labels each rank with its island's first (smallest) rank, 4 bits per rank
// (0: one island). Island c has m members in rank order; I am the member at local index l.
//  1. Push: my input into slot [rank] of every mate's inbox (buffer `buf` of three).
//  2. Poll my inbox for every mate still missing (one pass), sum in rank order in f32, round
//     once to the dtype: the island sum S_c, bitwise the same on every mate. Send S_c into
//     slot [c's label] of the inbox of every member of every other island whose local index
//     l' has l' mod m == l: every rank receives exactly one copy of every other island's sum,
//     and no raw input crosses an island boundary.
//  3. Poll my inbox for the other islands' sums, one slot at a time in label order (S_c was
//     parked in my output by step 2 and is read back by the same thread), sum the island
//     sums in label order in f32, round once more: the output, bitwise identical everywhere.
//     One island: step 2's S_c is the output (the rank-order sum, as oneshot_push gives).
// Two one-way trips on the critical path (one inside the island, one across); no fence, no
// barrier. Inbox slots: [mate] from step 1 and [other island's label] from step 2 are
// disjoint (a label lies in its own island); slot [rank] is never written.
//
// Buffer reuse: as oneshot_push.cu. Slot [s] of my inbox in buffer b is written by one rank
// in call k and next in call k+3, and cleared by my call k+1 (TPAR_KIND_INBOX: every slot but
// mine). The writer's call k+2 needs my call k+2's input (every output depends on every
// input, through a chain of sends that starts with mine), which I send only after my call
// k+1, clears included, has completed.
//
// In-place calls: my input is read in steps 1-2 before step 2 writes S_c over the same
// vector (same thread); step 3 needs only S_c; peers never read my input.
#include "common.cuh"

__device__ __forceinline__ u32 island_label(const TparArgs& a, u32 q) { return (u32)(a.islands >> (4u * q)) & 15u; }

// This rank's view of the islands, from the arguments alone (computed before the PDL wait).
struct IslandMasks {
    u32 mates;    // my island, me included
    u32 others;   // the other islands' labels: the inbox slots the exchange fills
    u32 targets;  // the ranks that receive my island's sum from me
    u32 label;    // my island's label
    u32 local;    // my index in my island (rank order)
};

__device__ __forceinline__ IslandMasks island_masks(const TparArgs& a) {
    IslandMasks s;
    const u32 world = a.world, rank = a.rank;
    s.label = island_label(a, rank);
    s.mates = 0u;
    u32 leaders = 0u;
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        const u32 l = island_label(a, q);
        if (l == s.label) s.mates |= 1u << q;
        if (l == q) leaders |= 1u << q;
    }
    s.others = leaders & ~(1u << s.label);
    const u32 m = __popc(s.mates);
    const u32 me = __popc(s.mates & ((1u << rank) - 1u));
    s.local = me;
    s.targets = 0u;
    for (u32 rest = s.others; rest != 0u; rest &= rest - 1u) {
        const u32 f = (u32)(__ffs(rest) - 1);
        u32 k = 0u;  // local index in island f, modulo m
#pragma unroll
        for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
            if (q >= world) break;
            if (island_label(a, q) == f) {
                if (k == me) s.targets |= 1u << q;
                k = k + 1u == m ? 0u : k + 1u;
            }
        }
    }
    return s;
}

// Sum of the ranks in `mask` in rank order, in f32, packed and canonicalised; rank `self`
// contributes `own`, every other rank x[q].
template <class D>
__device__ __forceinline__ V16 sum_masked(const V16 (&x)[TPAR_MAX_RANKS], u32 mask, u32 self, V16 own, u32 world) {
    float acc[8];
    bool first = true;
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        if (!(mask & (1u << q))) continue;
        const V16 v = q == self ? own : x[q];
        if (first) D::set(acc, v);
        else D::add(acc, v);
        first = false;
    }
    return D::pack(acc);
}

// The member of island `label` that sends me its sum: local index (mine mod its size). Only
// a timeout record needs it.
__device__ __noinline__ u32 island_sender(u64 islands, u32 world, u32 label, u32 local) {
    u32 m = 0u;
    for (u32 q = 0; q < world; ++q) m += ((u32)(islands >> (4u * q)) & 15u) == label ? 1u : 0u;
    const u32 want = local % (m ? m : 1u);
    u32 k = 0u;
    for (u32 q = 0; q < world; ++q) {
        if (((u32)(islands >> (4u * q)) & 15u) != label) continue;
        if (k == want) return q;
        ++k;
    }
    return label;
}

// Polls slot [label] of my inbox (island `label`'s sum) until no lane is empty; returns it.
// One slot at a time, in label order: a thread keeps one vector and the f32 sum live (a poll
// of every island at once would keep 16 vectors beside step 2's state, past 128 registers).
// A timeout names the rank that should have sent it.
template <class D>
__device__ __forceinline__ V16 poll_island(const TparArgs& a, Frame& f, const IslandMasks& is, u32 label, u64 v) {
    const V16* p = inbox_at(a, a.rank, f.buf, label, v);
    u32 polls = 0;
    u32 sender = TPAR_MAX_RANKS;
    while (true) {
        const V16 x = ld_poll_v16(p);
        if (!D::has_empty_lane(x) || !f.ok) return x;
        if (sender == TPAR_MAX_RANKS) sender = island_sender(a.islands, a.world, label, is.local);
        if (!still_waiting(a, f, polls, sender, TPAR_PHASE_ISLAND_POLL)) return x;
    }
}

// Reads back vector v of the output as store_output left it (lanes past `count` read as
// +0.0, as load_input pads them: the island sum of padding is +0.0 too). Same thread, same
// address: program order makes the store visible.
template <class D>
__device__ __forceinline__ V16 load_output(const TparArgs& a, u64 v) {
    return load_input<D, true>(a, v);
}

#if TPAR_FLAGS
// The ranks that send me another island's sum (island_sender of each other island): the
// flags of step 3 are keyed by the sender's rank, as every flag slot [phase][b][src] is
// written by src alone (flags.cuh). Only threads that poll a flag need it.
__device__ __forceinline__ u32 island_senders(const TparArgs& a, const IslandMasks& is) {
    u32 m = 0u;
    if (threadIdx.x >= a.world) return m;
    for (u32 rest = is.others; rest != 0u; rest &= rest - 1u)
        m |= 1u << island_sender(a.islands, a.world, (u32)(__ffs(rest) - 1), is.local);
    return m;
}

// The flag protocol (host transport, flags.cuh): the same steps, block b covering the same
// vectors [lo, hi) on every rank; step 1 writes my input once into slot [me] of my own inbox
// (write once, flags.cuh; my mates read it there) and publishes flag phase 0 to my mates, step 2 phase 1
// to my targets; step 3 waits for the phase-1 flag of every rank that sends me an island
// sum, then reads them. Nothing cleared.
template <class D>
__device__ void hierarchical(const TparArgs& a) {
    const IslandMasks is = island_masks(a);
    Frame f = frame_begin(a);
    const u64 nvec = vecs_for<D>(a.count);
    u64 lo, hi;
    block_range(nvec, lo, hi);
    const u64 bd = blockDim.x;
    const u64 first = lo + threadIdx.x;
    const u32 world = a.world, rank = a.rank;
    const u32 peers = is.mates & ~(1u << rank);
    const u32 gen = f.epoch + 1u;

    // 1. Push to my mates.
    for (u64 v = first; v < hi; v += bd) {
        const V16 mine = D::canon(load_input<D>(a, v));
        if (peers != 0u) flag_data_st_v16(inbox_at(a, rank, f.buf, rank, v), mine);  // once, my own area
    }
    flags_publish(a, 0, gen, peers);
    pdl_launch_dependents();
    test_pause(a);
    // 2. My island's sum, sent across.
    flags_wait(a, f, 0, gen, peers, desc_mask(a), TPAR_PHASE_PUSH_POLL);
    for (u64 v = first; v < hi; v += bd) {
        const V16 own = D::canon(load_input<D>(a, v));
        V16 x[TPAR_MAX_RANKS];
        load_peers<SLOT_OWN_INBOX>(a, f, x, peers, v, 0);
        const V16 s = sum_masked<D>(x, is.mates, rank, own, world);
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            if (is.targets & (1u << q)) flag_data_st_v16(inbox_at(a, q, f.buf, is.label, v), s);
        }
        store_output<D>(a, v, s);  // one island: the result; else parked for step 3
    }
    // 3. The other islands' sums, summed in label order.
    if (is.others != 0u) {
        flags_publish(a, 1, gen, is.targets);
        flags_wait(a, f, 1, gen, island_senders(a, is), 0u, TPAR_PHASE_ISLAND_POLL);
        const u32 mine_and_others = is.others | (1u << is.label);
        for (u64 v = first; v < hi; v += bd) {
            const V16 s = load_output<D>(a, v);  // S_c, parked there by step 2
            float acc[8];
            bool head = true;
            for (u32 rest = mine_and_others; rest != 0u; rest &= rest - 1u) {
                const u32 q = (u32)(__ffs(rest) - 1);
                const V16 x = q == is.label ? s : ld_poll_v16(inbox_at(a, a.rank, f.buf, q, v));
                if (head) D::set(acc, x);
                else D::add(acc, x);
                head = false;
            }
            store_output<D>(a, v, D::pack(acc));
        }
    }
    frame_end(a, f, nvec, TPAR_KIND_NONE);
}
#else
template <class D>
__device__ void hierarchical(const TparArgs& a) {
    const IslandMasks is = island_masks(a);
    Frame f = frame_begin(a);
    const u64 nvec = vecs_for<D>(a.count);
    const u64 stride = grid_threads();
    const u64 first = global_tid();
    const u32 world = a.world, rank = a.rank;
    const u32 peers = is.mates & ~(1u << rank);

    // 1. Push to my mates (staggered order, as oneshot_push).
    V16 pre = {0u, 0u, 0u, 0u};
    for (u64 v = first; v < nvec; v += stride) {
        const V16 mine = D::canon(load_input<D>(a, v));
        if (v == first) pre = mine;
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            if (peers & (1u << q)) st_send_v16(inbox_at(a, q, f.buf, rank, v), mine);
        }
    }
    pdl_launch_dependents();
    test_pause(a);
    clear_previous<D>(a, f);
    // 2. My island's sum (mates polled in one pass; the descriptors ride along), sent across.
    u32 dm = desc_mask(a);
    for (u64 v = first; v < nvec; v += stride) {
        const V16 own = v == first ? pre : D::canon(load_input<D>(a, v));
        V16 x[TPAR_MAX_RANKS];
        poll_peers<D, SLOT_INBOX>(a, f, x, peers, dm, v, 0, TPAR_PHASE_PUSH_POLL);
        dm = 0u;
        const V16 s = sum_masked<D>(x, is.mates, rank, own, world);
        for (u32 i = 1; i < world; ++i) {
            const u32 q = rank + i < world ? rank + i : rank + i - world;
            if (is.targets & (1u << q)) st_send_v16(inbox_at(a, q, f.buf, is.label, v), s);
        }
        store_output<D>(a, v, s);  // one island: the result; else parked for step 3
    }
    desc_only<D>(a, f, dm);  // a descriptor thread past the message's last vector
    // 3. The other islands' sums, polled one island at a time, summed in label order.
    if (is.others != 0u) {
        const u32 mine_and_others = is.others | (1u << is.label);
        for (u64 v = first; v < nvec; v += stride) {
            const V16 s = load_output<D>(a, v);  // S_c, parked there by step 2
            float acc[8];
            bool head = true;
            for (u32 rest = mine_and_others; rest != 0u; rest &= rest - 1u) {
                const u32 q = (u32)(__ffs(rest) - 1);
                const V16 x = q == is.label ? s : poll_island<D>(a, f, is, q, v);
                if (head) D::set(acc, x);
                else D::add(acc, x);
                head = false;
            }
            store_output<D>(a, v, D::pack(acc));
        }
    }
    frame_end(a, f, nvec, TPAR_KIND_INBOX);
}
#endif  // TPAR_FLAGS

TPAR_INSTANTIATE(hierarchical)
