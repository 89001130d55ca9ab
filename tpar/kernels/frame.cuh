// frame.cuh — the second half of common.cuh (which splices it in): the workspace layout,
// the call frame (epochs, buffers, deadline), call descriptors (desc.cuh, spliced in), the
// clears one call behind, and the poll verbs every kernel waits with; at its end, flags.cuh (the flag protocol),
// norm.cuh (the epilogues: plain, fused add-RMSNorm) and io.cuh (registered caller buffers:
// the zero-copy path; the ABI probe).
// Needs common.cuh's types and helpers before it.

// ---------------------------------------------------------------------------------------
// Workspace layout, in 16-byte vectors from a rank's data area (S = slot_vecs, N = world,
// B = TPAR_BUFS = 3 buffers, the call's buffer `buf` cycling 0, 1, 2):
//
//   push region (sentinel-managed, all ones when empty):
//     inbox[buf 0..2][src 0..N-1][S]   one-shot push, staged push, two-shot reduce-scatter
//     gather[buf 0..2][S]              two-shot all-gather (the chunk owner is implied)
//   pull region (no sentinel; guarded by barriers):
//     pull[buf 0..2][2][S]             [0] = exposed input, [1] = two-shot partial result
//
// Flag area: flags[phase 0..1][block 0..TPAR_MAX_BLOCKS-1][src 0..N-1] (u32 generations),
// then desc[buf 0..2][src 0..TPAR_MAX_RANKS-1] (one 16-byte call descriptor each, below).
//
// Why three buffers: a rank inside call k has finished call k-1, which needed a
// contribution from every peer's call k-1, so every peer is inside call k-1, k or k+1: three
// calls, three buffers, each touched by one call at a time. Call k clears what call k-1 left
// in its buffer (while it waits for peers, off the critical path): the next writer of that
// buffer is a peer's call k+2, which needs my call k+1's data, which I send only after call k
// (clears included) has completed. With two buffers a fast peer's call k+1 could already be
// writing the buffer call k clears.

__device__ __forceinline__ u64 push_region_vecs(const TparArgs& a) { return (u64)TPAR_BUFS * (a.world + 1ull) * a.slot_vecs; }

__device__ __forceinline__ V16* inbox_at(const TparArgs& a, u32 owner, u32 buf, u32 src, u64 v) {
    return (V16*)a.data[owner] + ((u64)(buf * a.world + src) * a.slot_vecs + v);
}
__device__ __forceinline__ V16* gather_at(const TparArgs& a, u32 owner, u32 buf, u64 v) {
    return (V16*)a.data[owner] + ((u64)TPAR_BUFS * a.world * a.slot_vecs + (u64)buf * a.slot_vecs + v);
}
__device__ __forceinline__ V16* pull_at(const TparArgs& a, u32 owner, u32 buf, u32 which, u64 v) {
    return (V16*)a.data[owner] + (push_region_vecs(a) + ((u64)buf * 2ull + which) * a.slot_vecs + v);
}
__device__ __forceinline__ u32* flag_at(const TparArgs& a, u32 owner, u32 phase, u32 block, u32 src) {
    return (u32*)a.flags[owner] + ((phase * TPAR_MAX_BLOCKS + block) * TPAR_MAX_RANKS + src);
}
#define TPAR_DESC_OFFSET (2u * TPAR_MAX_BLOCKS * TPAR_MAX_RANKS * 4u)
__device__ __forceinline__ V16* desc_at(const TparArgs& a, u32 owner, u32 buf, u32 src) {
    return (V16*)((char*)a.flags[owner] + TPAR_DESC_OFFSET) + (buf * TPAR_MAX_RANKS + src);
}

// ---------------------------------------------------------------------------------------
// Call frame: the epoch and buffer this call runs under, and its deadline. The clock is not
// read until a poll has failed: a call whose data is there pays nothing for the deadline.

struct Frame {
    u32 epoch;
    u32 buf;
    u64 deadline_ns;  // 0 until the first failed poll of this thread
    bool ok;          // false once this thread has failed (timeout, mismatch): results are void
    u32 prev_kind;    // what the previous call left in the push region (TPAR_KIND_*)
    u64 prev_nvec;    // its message's vectors
};

__device__ __forceinline__ u64 global_tid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }

// This rank's one error record, claimed by the first thread of the call to fail (false for
// every later one: the record keeps the first failure). publish_error fills the fields every
// error has, then its code, which the host reads first: code last, between fences.
__device__ __forceinline__ bool claim_error(u64 state) {
    return atom_cas_gpu_u32(&((TparState*)state)->err_claim, 0u, 1u) == 0u;
}
__device__ __forceinline__ void fill_error(TparError* e, u32 rank, u32 peer, u32 phase, u32 epoch, u64 waited_ns) {
    e->rank = rank;
    e->peer = peer;
    e->phase = phase;
    e->block = blockIdx.x;
    e->epoch = epoch;
    e->waited_ns = waited_ns;
}
__device__ __forceinline__ void publish_error(TparError* e, u32 code) {
    fence_sc_sys();
    st_volatile_u32(&e->code, code);
    fence_sc_sys();
}

__device__ __noinline__ void record_timeout(u64 err, u64 state, u32 rank, u32 epoch, u64 waited_ns, u32 peer, u32 phase) {
    if (!claim_error(state)) return;
    TparError* e = (TparError*)err;
    if (ld_volatile_u32(&e->code) != 0u) return;  // the host's watchdog recorded a dead peer first
    fill_error(e, rank, peer, phase, epoch, waited_ns);
    publish_error(e, TPAR_ERR_TIMEOUT);
}

// Called after a failed poll. Starts the deadline on the first failure; every
// TPAR_POLLS_PER_CLOCK failures reads the clock and whether the call already failed (then this
// thread stops too): a claim on the device (another thread's timeout or mismatch), or, after
// TPAR_HOST_CHECK_POLLS failed polls, at every 16th clock check, the code of the pinned error
// record, which the host's liveness watchdog writes when a peer dies with no CUDA call (an
// engine queues a whole step of calls: a device write would run after them; read by every
// waiting thread at every check, that host-link read slowed small calls 1.5-30x). False: stop.
__device__ __forceinline__ bool still_waiting(const TparArgs& a, Frame& f, u32& polls, u32 peer, u32 phase) {
    if (f.deadline_ns == 0ull) {
        f.deadline_ns = globaltimer_ns() + a.timeout_ns;
        return true;
    }
    if (++polls % TPAR_POLLS_PER_CLOCK != 0u) return true;
    const u64 now = globaltimer_ns();
    if (now > f.deadline_ns) {
        f.ok = false;
        record_timeout(a.err, a.state, a.rank, f.epoch, now - (f.deadline_ns - a.timeout_ns), peer, phase);
        return false;
    }
    if (ld_volatile_u32(&((TparState*)a.state)->err_claim) != 0u ||
        (polls >= TPAR_HOST_CHECK_POLLS && polls % (16u * TPAR_POLLS_PER_CLOCK) == 0u && ld_volatile_u32(&((const TparError*)a.err)->code) != 0u)) {
        f.ok = false;
        return false;
    }
    return true;
}

#include "desc.cuh"

// Skewed-rank test hook (test_delay_ns != 0 only in tests): the rank stalls here. Called
// when a call starts (a late sender) and again after a push kernel's sends (a slow reader,
// whose clear one call behind then runs late: the case a buffer-reuse race needs).
__device__ __forceinline__ void test_pause(const TparArgs& a) {
    if (a.test_delay_ns == 0u) return;
    const u64 until = globaltimer_ns() + a.test_delay_ns;
    while (globaltimer_ns() < until) nanosleep_ns(100);
}

// Starts a call: waits for the previous kernel on this stream (PDL), reads this block's
// epoch and buffer, and (descriptor thread) announces the call to every peer.
// Every word of the state is loaded at once (one round trip, not one per use): the
// previous call's kind and size are taken for both parities and chosen by the epoch after.
__device__ __forceinline__ Frame frame_begin(const TparArgs& a) {
    pdl_wait();
    test_pause(a);  // skewed-rank test hook: this rank arrives late
    const TparState* st = (const TparState*)a.state;
    Frame f;
    f.epoch = st->epoch[blockIdx.x];
    f.buf = st->buf[blockIdx.x];
#if TPAR_LEAN_ON
    // Lean variant: loaded where used (prev_call): three registers fewer for the whole call.
    f.prev_kind = TPAR_KIND_NONE;
    f.prev_nvec = 0ull;
#else
    const u32 k0 = st->prev_kind[0], k1 = st->prev_kind[1];
    const u64 n0 = st->prev_nvec[0], n1 = st->prev_nvec[1];
    const bool odd = ((f.epoch - 1u) & 1u) != 0u;
    f.prev_kind = odd ? k1 : k0;
    f.prev_nvec = odd ? n1 : n0;
#endif
    f.deadline_ns = 0ull;
    f.ok = true;
    // Unclobbered: the kernel's first loads need not wait behind it (a peer polls it in the
    // same passes as the data, so it need not land before the data either).
    if (is_desc_thread(a)) st_send_v16(desc_at(a, threadIdx.x, f.buf, a.rank), desc_of(a, f.epoch));
    return f;
}

// Ends a call: block b advances its own epoch and buffer; block 0 also those of the blocks
// not launched, and records what this call left in the push region. No fence, no atomic:
// only this rank's next kernel reads them, after the kernel boundary (or griddepcontrol.wait).
__device__ __forceinline__ void frame_end(const TparArgs& a, const Frame& f, u64 nvec, u32 kind) {
    block_sync();  // every thread of the block has read the epoch
    TparState* st = (TparState*)a.state;
    const unsigned char nb = (unsigned char)(f.buf == TPAR_BUFS - 1u ? 0u : f.buf + 1u);
    const u32 t = threadIdx.x;
    if (t == 0) {
        st->epoch[blockIdx.x] = f.epoch + 1u;
        st->buf[blockIdx.x] = nb;
    }
    if (blockIdx.x != 0) return;
    // Block 0: the words of the blocks not launched, one thread each (a block has at least
    // TPAR_MAX_BLOCKS threads), not one thread's serial loop at the kernel's very end.
    if (t >= gridDim.x && t < TPAR_MAX_BLOCKS) {
        st->epoch[t] = f.epoch + 1u;
        st->buf[t] = nb;
    }
    if (t == 0) {
        st->prev_nvec[f.epoch & 1u] = nvec;
        st->prev_kind[f.epoch & 1u] = kind;
    }
}

// What the previous call left in the push region (TPAR_KIND_*) and its vectors. Loaded by
// frame_begin, with the epoch: not a dependent load at the point of use; the lean variant
// loads them here instead (the state's slot of the previous epoch's parity, which only this
// rank's previous kernel wrote: frame_end of this call writes the other one).
__device__ __forceinline__ void prev_call(const TparArgs& a, const Frame& f, u32& kind, u64& nvec) {
#if TPAR_LEAN_ON
    const TparState* st = (const TparState*)a.state;
    const u32 p = (f.epoch - 1u) & 1u;
    kind = st->prev_kind[p];
    nvec = st->prev_nvec[p];
#else
    kind = f.prev_kind;
    nvec = f.prev_nvec;
#endif
}
__device__ __forceinline__ u32 previous_kind(const TparArgs& a, const Frame& f) {
    u32 kind;
    u64 nvec;
    prev_call(a, f, kind, nvec);
    return kind;
}

// Clears slot [src] of my inbox in the previous call's buffer, when that call was a
// TPAR_KIND_INBOX one (staged push clears one source per step, before it waits on it).
template <class D>
__device__ __forceinline__ void clear_previous_slot(const TparArgs& a, const Frame& f, u32 src) {
    u32 kind;
    u64 n;
    prev_call(a, f, kind, n);
    const u32 pb = f.buf == 0u ? TPAR_BUFS - 1u : f.buf - 1u;
    const u64 stride = grid_threads();
    const V16 e = empty_v16<D>();
    for (u64 v = global_tid(); v < n; v += stride) st_v16(inbox_at(a, a.rank, pb, src, v), e);
}

// Clears what the previous call left in its buffer (see the layout: its next writer is a
// peer's call k+2). Every thread of the grid takes its share; plain stores, nothing waits.
template <class D>
__device__ void clear_previous(const TparArgs& a, const Frame& f) {
    u32 kind;
    u64 n;
    prev_call(a, f, kind, n);
    if (kind == TPAR_KIND_NONE) return;
    const u32 pb = f.buf == 0u ? TPAR_BUFS - 1u : f.buf - 1u;
    const u32 world = a.world, rank = a.rank;
    const u64 t0 = global_tid(), stride = grid_threads();
    const V16 e = empty_v16<D>();
    // Source-major loops: no division per item, a warp's stores contiguous.
    if (kind == TPAR_KIND_INBOX) {
        for (u32 src = 0; src < world; ++src) {
            if (src == rank) continue;
            for (u64 v = t0; v < n; v += stride) st_v16(inbox_at(a, rank, pb, src, v), e);
        }
    } else {
        const u64 cvec = (u32)(n + world - 1u) / world;  // 32-bit: a message has < 2^32 vectors
        const u64 lo = (u64)rank * cvec;
        const u64 hi = lo + cvec < n ? lo + cvec : n;
        for (u32 src = 0; src < world; ++src) {
            if (src == rank) continue;
            for (u64 v = lo + t0; v < hi; v += stride) st_v16(inbox_at(a, rank, pb, src, v), e);
        }
        for (u64 v = t0; v < n; v += stride) {
            if (v < lo || v >= hi) st_v16(gather_at(a, rank, pb, v), e);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The poll verb. One pass loads the slot of every peer still missing (a bitmask), and the
// descriptors still missing (descriptor thread only), all in flight at once; then checks
// them; then passes again over what is still missing. One late peer costs one load per
// pass, not one per rank. The loops are unrolled to TPAR_MAX_RANKS (so x[] stays in
// registers) and leave at q == world.

// Which slot of rank q a poll reads. Chosen at compile time, not by a lambda: a lambda
// capturing the kernel argument by reference makes the compiler copy it to local memory.
enum SlotKind {
    SLOT_INBOX = 0,          // my inbox, slot [q], vector v
    SLOT_GATHER_CHUNK = 1,   // my gather area, vector q*cvec + v (v = index in the chunk)
    SLOT_PULL_EXPOSED = 2,   // rank q's exposed input, vector v
    SLOT_PULL_RESULT_CHUNK = 3,  // rank q's partial result, vector q*cvec + v
    SLOT_OWN_INBOX = 4,      // rank q's inbox, its own slot [q], vector v (flags: written once)
    SLOT_PEER_FOR_ME = 5,    // rank q's inbox, slot [me], vector v (flags: a reduce-scatter's piece for me)
    SLOT_PULL_EXPOSED_MINE = 6,  // rank q's exposed input, vector me*cvec + v (pull reduce-scatter: q's piece for me)
};

template <int K>
__device__ __forceinline__ const V16* slot_of(const TparArgs& a, u32 buf, u32 q, u64 v, u64 cvec) {
    if (K == SLOT_INBOX) return inbox_at(a, a.rank, buf, q, v);
    if (K == SLOT_GATHER_CHUNK) return gather_at(a, a.rank, buf, (u64)q * cvec + v);
    if (K == SLOT_PULL_EXPOSED) return pull_at(a, q, buf, 0, v);
    if (K == SLOT_OWN_INBOX) return inbox_at(a, q, buf, q, v);
    if (K == SLOT_PEER_FOR_ME) return inbox_at(a, q, buf, a.rank, v);
    if (K == SLOT_PULL_EXPOSED_MINE) return pull_at(a, q, buf, 0, (u64)a.rank * cvec + v);
    return pull_at(a, q, buf, 1, (u64)q * cvec + v);
}

// Sentinel poll over the peers in `pending` (bit q = rank q) among ranks q0..q0+G-1, and the
// one descriptor in `desc_pending` (a descriptor thread's peer, or 0). x[u] is rank q0+u's
// slot; on return every x[q - q0] of `pending` holds data (unless f.ok is false).
template <class D, int K, int G>
__device__ __forceinline__ void poll_group(const TparArgs& a, Frame& f, V16 (&x)[G], u32 q0, u32 pending, u32 desc_pending, u64 v, u64 cvec, u32 phase) {
    const u32 world = a.world;
    const u32 dq = desc_pending ? (u32)(__ffs(desc_pending) - 1) : 0u;
    u32 polls = 0;
    V16 d;
    while (true) {
#pragma unroll
        for (u32 u = 0; u < (u32)G; ++u) {
            const u32 q = q0 + u;
            if (q >= world) break;
            if (pending & (1u << q)) x[u] = ld_poll_v16(slot_of<K>(a, f.buf, q, v, cvec));
        }
        if (desc_pending) d = ld_poll_v16(desc_at(a, a.rank, f.buf, dq));
#pragma unroll
        for (u32 u = 0; u < (u32)G; ++u) {
            const u32 q = q0 + u;
            if (q >= world) break;
            if ((pending & (1u << q)) && !D::has_empty_lane(x[u])) pending &= ~(1u << q);
        }
        if (desc_pending && desc_is_for(d, f.epoch)) {
            desc_pending = 0u;
            desc_compare(a, f, dq, d);
        }
        if ((pending | desc_pending) == 0u || !f.ok) return;
        const u32 late = pending ? pending : desc_pending;
        if (!still_waiting(a, f, polls, __ffs(late) - 1, pending ? phase : TPAR_PHASE_DESC)) return;
    }
}

// poll_group over every rank at once: x[q] is rank q's slot.
template <class D, int K>
__device__ __forceinline__ void poll_peers(const TparArgs& a, Frame& f, V16 (&x)[TPAR_MAX_RANKS], u32 pending, u32 desc_pending, u64 v, u64 cvec, u32 phase) {
    poll_group<D, K, TPAR_MAX_RANKS>(a, f, x, 0u, pending, desc_pending, v, cvec, phase);
}

// Sentinel poll of one slot `p` (rank `peer`'s data), and the one descriptor in
// `desc_pending` as in poll_peers. For a step that awaits a single peer (staged push): no
// array of peer slots, so nothing else competes for registers.
template <class D>
__device__ __forceinline__ void poll_one(const TparArgs& a, Frame& f, const V16* p, u32 peer, u32 desc_pending, u32 phase) {
    const u32 dq = desc_pending ? (u32)(__ffs(desc_pending) - 1) : 0u;
    bool pending = true;
    u32 polls = 0;
    V16 d;
    while (true) {
        const V16 x = ld_poll_v16(p);
        if (desc_pending) d = ld_poll_v16(desc_at(a, a.rank, f.buf, dq));
        if (!D::has_empty_lane(x)) pending = false;
        if (desc_pending && desc_is_for(d, f.epoch)) {
            desc_pending = 0u;
            desc_compare(a, f, dq, d);
        }
        if ((!pending && desc_pending == 0u) || !f.ok) return;
        if (!still_waiting(a, f, polls, pending ? peer : dq, pending ? phase : TPAR_PHASE_DESC)) return;
    }
}

// Every peer except me, and only chunked slots inside the message.
template <int K>
__device__ __forceinline__ u32 peers_mask(const TparArgs& a, u64 v, u64 cvec, u64 nvec) {
    u32 m = 0u;
#pragma unroll
    for (u32 q = 0; q < TPAR_MAX_RANKS; ++q) {
        if (q >= a.world) break;
        const bool valid = (K == SLOT_GATHER_CHUNK || K == SLOT_PULL_RESULT_CHUNK) ? (u64)q * cvec + v < nvec : true;
        if (q != a.rank && valid) m |= 1u << q;
    }
    return m;
}

// Loads every peer in `mask` among ranks q0..q0+G-1 (no sentinel: barrier- or flag-guarded
// data) into x[q - q0], all loads in flight at once. Volatile (a peer's data must not come
// from a stale L1 line) but unclobbered: all in flight.
template <int K, int G>
__device__ __forceinline__ void load_group(const TparArgs& a, const Frame& f, V16 (&x)[G], u32 q0, u32 mask, u64 v, u64 cvec) {
#pragma unroll
    for (u32 u = 0; u < (u32)G; ++u) {
        const u32 q = q0 + u;
        if (q >= a.world) break;
        if (mask & (1u << q)) x[u] = ld_poll_v16(slot_of<K>(a, f.buf, q, v, cvec));
    }
}

// load_group over every rank at once: x[q] is rank q's slot.
template <int K>
__device__ __forceinline__ void load_peers(const TparArgs& a, const Frame& f, V16 (&x)[TPAR_MAX_RANKS], u32 mask, u64 v, u64 cvec) {
    load_group<K, TPAR_MAX_RANKS>(a, f, x, 0u, mask, v, cvec);
}

// Sum in rank order 0..world-1 in f32, packed and canonicalised; rank `a.rank` contributes
// `own`, every other rank x[q].
template <class D>
__device__ __forceinline__ V16 reduce_in_rank_order(const TparArgs& a, const V16 (&x)[TPAR_MAX_RANKS], V16 own) {
    float acc[8];
    const u32 world = a.world, rank = a.rank;
    D::set(acc, rank == 0 ? own : x[0]);
#pragma unroll
    for (u32 q = 1; q < TPAR_MAX_RANKS; ++q) {
        if (q >= world) break;
        D::add(acc, q == rank ? own : x[q]);
    }
    return D::pack(acc);
}

// ---------------------------------------------------------------------------------------
// Peers in groups (the lean variant). A reduce that loads every peer before adding keeps
// TPAR_MAX_RANKS vectors live (64 registers of a thread's ~120): one 512-thread block per
// SM. The verbs below load TPAR_PEER_GROUP peers at a time and add each group into the f32
// accumulator before loading the next: the same f32 adds in the same rank order 0..world-1
// (bitwise the same result), fewer vectors live. TPAR_PEER_GROUP is TPAR_MAX_RANKS (one
// group: today's code) unless the kernel is compiled as its lean variant (-DTPAR_LEAN, for
// large messages, chosen by the launcher: docs/cuda.md), where it is 4 and the kernel is
// bounded to TPAR_LEAN_MIN_BLOCKS blocks of TPAR_THREADS per SM (64 registers a thread).

// Adds rank q's vector into acc (the first rank sets it): the rank-order sum's one step.
template <class D>
__device__ __forceinline__ void acc_rank(float (&acc)[8], u32 q, V16 y) {
    if (q == 0u) D::set(acc, y);
    else D::add(acc, y);
}

// Adds ranks q0..q0+G-1 (of `world`) into acc in rank order: x[q - q0], or `own` at `rank`.
template <class D, int G>
__device__ __forceinline__ void add_group(float (&acc)[8], const V16 (&x)[G], u32 q0, u32 world, u32 rank, V16 own) {
#pragma unroll
    for (u32 u = 0; u < (u32)G; ++u) {
        const u32 q = q0 + u;
        if (q >= world) break;
        acc_rank<D>(acc, q, q == rank ? own : x[u]);
    }
}

// Loads every peer in `mask` (barrier- or flag-guarded data, as load_peers) and sums in rank
// order with `own` at a.rank, TPAR_PEER_GROUP loads in flight at a time. `mask` must hold
// every rank but me (the sum needs them all).
template <class D, int K>
__device__ __forceinline__ V16 load_reduce(const TparArgs& a, const Frame& f, u32 mask, u64 v, u64 cvec, V16 own) {
#if !TPAR_LEAN_ON
    V16 x[TPAR_MAX_RANKS];  // one group: every load in flight, then the sum (today's code)
    load_peers<K>(a, f, x, mask, v, cvec);
    return reduce_in_rank_order<D>(a, x, own);
#else
    float acc[8];
    const u32 world = a.world, rank = a.rank;
#pragma unroll
    for (u32 g = 0; g < TPAR_MAX_RANKS; g += TPAR_PEER_GROUP) {
        if (g >= world) break;
        V16 x[TPAR_PEER_GROUP];
        load_group<K, TPAR_PEER_GROUP>(a, f, x, g, mask, v, cvec);
        add_group<D, TPAR_PEER_GROUP>(acc, x, g, world, rank, own);
    }
    return D::pack(acc);
#endif
}

// Sentinel-polls every peer in `pending` (and the descriptor in `desc_pending`, before the
// data in the lean variant, in the same passes otherwise) and sums in rank order with `own` at a.rank, one group of TPAR_PEER_GROUP
// ranks at a time: a group is added once all of it has arrived. `pending` must hold every
// rank but me.
template <class D, int K>
__device__ __forceinline__ V16 poll_reduce(const TparArgs& a, Frame& f, u32 pending, u32 desc_pending, u64 v, u64 cvec, u32 phase, V16 own) {
#if !TPAR_LEAN_ON
    V16 x[TPAR_MAX_RANKS];  // one group: every peer polled in one pass, then the sum
    poll_peers<D, K>(a, f, x, pending, desc_pending, v, cvec, phase);
    return reduce_in_rank_order<D>(a, x, own);
#else
    if (desc_pending) {  // the descriptor first, on its own (usually there: one load)
        V16 none[1];
        poll_group<D, K, 1>(a, f, none, 0u, 0u, desc_pending, v, cvec, phase);
    }
    float acc[8];
    const u32 world = a.world, rank = a.rank;
#pragma unroll
    for (u32 g = 0; g < TPAR_MAX_RANKS; g += TPAR_PEER_GROUP) {
        if (g >= world) break;
        V16 x[TPAR_PEER_GROUP];
        const u32 in_group = (TPAR_PEER_GROUP >= 32 ? 0xffffffffu : ((1u << TPAR_PEER_GROUP) - 1u)) << g;
        poll_group<D, K, TPAR_PEER_GROUP>(a, f, x, g, pending & in_group, 0u, v, cvec, phase);
        add_group<D, TPAR_PEER_GROUP>(acc, x, g, world, rank, own);
    }
    return D::pack(acc);
#endif
}

// Descriptor thread of a pull kernel: its peer's descriptor is loaded together with its
// first data loads (desc_prefetch) and checked after them (desc_check), re-polled only if
// it was not there yet.
__device__ __forceinline__ V16 desc_prefetch(const TparArgs& a, const Frame& f, u32 dm) {
    return ld_poll_v16(desc_at(a, a.rank, f.buf, (u32)(__ffs(dm) - 1)));
}
template <class D>
__device__ __forceinline__ void desc_check(const TparArgs& a, Frame& f, V16 d, u32 dm) {
    if (!f.ok) return;
    if (desc_is_for(d, f.epoch)) {
        desc_compare(a, f, (u32)(__ffs(dm) - 1), d);
        return;
    }
    V16 x[TPAR_MAX_RANKS];
    poll_peers<D, SLOT_INBOX>(a, f, x, 0u, dm, 0, 0, TPAR_PHASE_DESC);
}

// A descriptor thread that polled no data (the message has no vector for it, or its share
// is empty): its descriptor alone. `dm` is what is still pending (0: nothing to do).
template <class D>
__device__ __forceinline__ void desc_only(const TparArgs& a, Frame& f, u32 dm) {
    if (dm == 0u || !f.ok) return;
    V16 x[TPAR_MAX_RANKS];
    poll_peers<D, SLOT_INBOX>(a, f, x, 0u, dm, 0, 0, TPAR_PHASE_DESC);
}

// Generations compare modulo 2^32: `have` is at or past `want`.
__device__ __forceinline__ bool gen_reached(u32 have, u32 want) { return (int)(have - want) >= 0; }

// Barrier verb, per block: block b of every rank meets block b of every other rank. Thread q
// (< world) signals rank q and waits for rank q: the waits run in parallel, one per thread.
// ORDER, how strong the meeting is (why each is enough: docs/cuda.md, "registered pull"):
//  - TPAR_BAR_RELEASE: every data store this block made before the barrier is visible to
//    peers that pass it (st.release.sys, cumulative over the stores block_sync ordered
//    before it; the wait ld.acquire.sys);
//  - TPAR_BAR_ARRIVE: "my call has started" (a relaxed signal, publishing nothing; acquire
//    polls, so the block's later loads follow the peer's signal): the registered start;
//  - TPAR_BAR_READS_DONE: "my reads of your buffers are done" (relaxed signal and polls:
//    every load's value went into a store before block_sync): one-shot's registered end.
#define TPAR_BAR_RELEASE 0
#define TPAR_BAR_ARRIVE 1
#define TPAR_BAR_READS_DONE 2
// barrier_block, with `between()` run by every thread after this thread's signal and before
// its wait: work that must not sit ahead of a release signal's fence, which waits for this
// thread's memory operations in flight (a fused call's cp.async of its residual and weight,
// norm.cuh `stage`, would otherwise delay every signal by a load's latency), and that the
// wait then hides.
template <int ORDER, class F>
__device__ __forceinline__ void barrier_block_then(const TparArgs& a, Frame& f, u32 phase, u32 gen, F&& between) {
    block_sync();
    const u32 q = threadIdx.x;
    const bool signals = q < a.world && q != a.rank;
    if (signals) {
        u32* theirs = flag_at(a, q, phase, blockIdx.x, a.rank);
        if (ORDER == TPAR_BAR_RELEASE) st_release_sys_u32(theirs, gen);
        else st_volatile_u32(theirs, gen);
    }
    between();
    if (signals) {
        const u32* mine = flag_at(a, a.rank, phase, blockIdx.x, q);
        u32 polls = 0;
        while (f.ok && !gen_reached(ORDER == TPAR_BAR_READS_DONE ? ld_volatile_u32(mine) : ld_acquire_sys_u32(mine), gen)) {
            if (!still_waiting(a, f, polls, q, phase == 0 ? TPAR_PHASE_BARRIER0 : TPAR_PHASE_BARRIER1)) break;
        }
    }
    block_sync();
}
template <int ORDER = TPAR_BAR_RELEASE>
__device__ __forceinline__ void barrier_block(const TparArgs& a, Frame& f, u32 phase, u32 gen) {
    barrier_block_then<ORDER>(a, f, phase, gen, [] {});
}

// One translation unit per (algorithm, dtype) when the host compiles only what a call needs
// (-DTPAR_ONLY_F32 / _F16 / _BF16); all three otherwise (the CI compile test).
#if TPAR_LEAN_ON
#define TPAR_BOUNDS __launch_bounds__(TPAR_THREADS, TPAR_LEAN_MIN_BLOCKS)
#else
#define TPAR_BOUNDS __launch_bounds__(TPAR_THREADS)
#endif
#define TPAR_ENTRY(NAME, SUFFIX, D) \
    static_assert(!TPAR_FUSED_ASKED, #NAME " has no fused variant"); \
    extern "C" __global__ void TPAR_BOUNDS NAME##_##SUFFIX(const TparArgs a) { NAME<D>(a); }
// Kernels with a fused variant (TPAR_FUSED_READY) take their epilogue as a second argument
// (norm.cuh): the plain one stores the sum; the fused one (-DTPAR_FUSED) adds the residual
// and normalises, and the entry takes the fused arguments. The fused entry also zeroes an
// NVFP4 output's scale padding (norm.cuh nvfp4_zero_padding_grid: after the PDL wait, before
// the all-reduce, whose waits for peers hide it; NormOut's set-up before, which runs under
// the previous kernel with PDL).
#if TPAR_FUSED_ON
#define TPAR_FENTRY(NAME, SUFFIX, D) \
    extern "C" __global__ void TPAR_BOUNDS NAME##_##SUFFIX(const TparFusedArgs fa) { \
        NormOut<D> o(fa.n); \
        nvfp4_zero_padding_grid<D>(fa.a, fa.n); \
        NAME<D>(fa.a, o); \
    }
#else
#define TPAR_FENTRY(NAME, SUFFIX, D) \
    extern "C" __global__ void TPAR_BOUNDS NAME##_##SUFFIX(const TparArgs a) { PlainOut<D> o; NAME<D>(a, o); }
#endif
#if defined(TPAR_ONLY_F32)
#define TPAR_EACH_DTYPE(E, NAME) E(NAME, f32, DF32)
#elif defined(TPAR_ONLY_F16)
#define TPAR_EACH_DTYPE(E, NAME) E(NAME, f16, DF16)
#elif defined(TPAR_ONLY_BF16)
#define TPAR_EACH_DTYPE(E, NAME) E(NAME, bf16, DBF16)
#else
#define TPAR_EACH_DTYPE(E, NAME) E(NAME, f32, DF32) E(NAME, f16, DF16) E(NAME, bf16, DBF16)
#endif
#define TPAR_INSTANTIATE(NAME) TPAR_EACH_DTYPE(TPAR_ENTRY, NAME)
#define TPAR_INSTANTIATE_FUSABLE(NAME) TPAR_EACH_DTYPE(TPAR_FENTRY, NAME)
// Kernels with all-gather and reduce-scatter entries (TPAR_GATHER_SCATTER_READY): NAME_all_gather<D>
// and NAME_reduce_scatter<D>, entries NAME_all_gather_<dtype> and NAME_reduce_scatter_<dtype>
// (tpar::cuda::kernels::KernelSource::entry_for), in every variant but the fused one.
#define TPAR_GS_ENTRY(NAME, SUFFIX, D) \
    extern "C" __global__ void TPAR_BOUNDS NAME##_all_gather_##SUFFIX(const TparArgs a) { NAME##_all_gather<D>(a); } \
    extern "C" __global__ void TPAR_BOUNDS NAME##_reduce_scatter_##SUFFIX(const TparArgs a) { NAME##_reduce_scatter<D>(a); }
#if TPAR_FUSED_ON
#define TPAR_INSTANTIATE_GATHER_SCATTER(NAME)
#else
#define TPAR_INSTANTIATE_GATHER_SCATTER(NAME) TPAR_EACH_DTYPE(TPAR_GS_ENTRY, NAME)
#endif

#include "flags.cuh"
#include "norm.cuh"
#include "io.cuh"
