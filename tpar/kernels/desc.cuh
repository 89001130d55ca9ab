// desc.cuh — the call descriptors, spliced into frame.cuh where frame.cuh includes it
// (tpar::cuda::kernels::header; NVRTC sees one translation unit).
// The verbs that poll descriptors beside the data (desc_prefetch, desc_check, desc_only)
// stay in frame.cuh, after the polls they use.

// Call descriptors: every rank tells every peer what it is calling (epoch, count, algorithm,
// dtype), so that ranks that disagree get TPAR_ERR_MISMATCH instead of a sum of mismatched
// data. One thread per peer: thread q (q < world, q != rank) of block 0 announces this call
// to rank q before its first sends, and loads rank q's descriptor in the same poll passes as
// its data (poll_peers below): no load of its own on the critical path, and one descriptor
// in registers per thread. (One thread checking every peer kept 16 descriptors live beside
// the 16 data vectors of a poll: past 128 registers, the push kernels spilled 0.6-3 KB per
// thread to local memory and ran 1.2-3.7x slower.) The check word makes a torn or stale
// descriptor (zeros, a reset's fill, an older epoch) never match. Slot reuse: desc[buf][src]
// of mine is written by src in calls k, k+3, ...; src reaches call k+3 only after my call
// k+2 contributed.
#define TPAR_DESC_SALT 0x9e3779b9u
__device__ __forceinline__ V16 desc_of(const TparArgs& a, u32 epoch) {
    V16 d;
    d.x = epoch;
    d.y = (u32)a.count;
    d.z = ((u32)(a.count >> 32) & 0xffffu) | (a.desc_code << 16);  // counts < 2^48; desc_code's 16 bits (a fused call's pattern in bits 8-12)
    d.w = d.x ^ d.y ^ d.z ^ TPAR_DESC_SALT;
    return d;
}
__device__ __forceinline__ bool desc_is_for(V16 d, u32 epoch) {
    return d.x == epoch && d.w == (d.x ^ d.y ^ d.z ^ TPAR_DESC_SALT);
}
// desc_code 0: the host checks calls itself (a captured graph's sequence, TPAR_CHECK_CALLS=0).
// Thread q of block 0 is rank q's descriptor thread (none for q == rank).
__device__ __forceinline__ bool is_desc_thread(const TparArgs& a) {
    return blockIdx.x == 0 && threadIdx.x < a.world && threadIdx.x != a.rank && a.desc_code != 0u;
}
// The peer whose descriptor the calling thread must still see, as a one-bit mask (0 for
// every thread that is not a descriptor thread).
__device__ __forceinline__ u32 desc_mask(const TparArgs& a) {
    return is_desc_thread(a) ? 1u << threadIdx.x : 0u;
}

__device__ __noinline__ void record_mismatch(u64 err, u64 state, u32 rank, u32 epoch, u32 peer, u64 ours, u64 theirs) {
    if (!claim_error(state)) return;
    TparError* e = (TparError*)err;
    if (ld_volatile_u32(&e->code) != 0u) return;  // as in record_timeout
    fill_error(e, rank, peer, TPAR_PHASE_DESC, epoch, 0ull);
    e->ours = ours;
    e->theirs = theirs;
    publish_error(e, TPAR_ERR_MISMATCH);
}

__device__ __forceinline__ void desc_compare(const TparArgs& a, Frame& f, u32 q, V16 d) {
    const V16 mine = desc_of(a, f.epoch);
    if (d.y != mine.y || d.z != mine.z) {
        const u32 tc = d.z >> 16;  // as abi.rs pack_call: pattern << 56 | count << 8 | code's low byte
        const u64 theirs = ((u64)(tc >> 8) << 56) | ((((u64)(d.z & 0xffffu) << 32) | d.y) << 8) | (tc & 0xffu);
        const u64 ours = ((u64)(a.desc_code >> 8) << 56) | (a.count << 8) | (a.desc_code & 0xffu);
        record_mismatch(a.err, a.state, a.rank, f.epoch, q, ours, theirs);
        f.ok = false;
    }
}
