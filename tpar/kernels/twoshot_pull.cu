// twoshot_pull.cu — two-shot pull all-reduce: reduce-scatter by reads, all-gather by reads,
// over the barrier protocol.
//
// Vectors are cut into world chunks; rank q owns chunk q. Within every chunk, block b
// covers the same sub-range on every rank, so per-block barriers suffice.
//  1. copy my input's share into my exposed buffer (buffer `buf`); barrier 0.
//  2. reduce my chunk by reading it from every peer's exposed buffer (all reads in flight),
//     rank order 0..world-1, f32; write it to my output and my partial-result buffer;
//     barrier 1.
//  3. read every other chunk's result from its owner's partial-result buffer.
//
// Registered graph calls (io.cuh): start barrier; reduce my chunk straight from every rank's
// input and write it into every rank's output; end barrier. Two barriers and no copy
// instead of three trips more and two copies.
//
// Buffer reuse: both buffers cycle through three; a peer still reading my buffer b is
// inside call k, and I write buffer b again only in call k+3, after a barrier of call k+2
// that every peer entered after finishing call k.
//
// Fused with owned rows (the rows variant, -DTPAR_FUSED_ROWS with -DTPAR_FUSED: the
// launcher's choice, cuda/fused.rs `rows_owned`; the call's TparNorm.flags and descriptor
// carry TPAR_NORM_ROWS):
// chunks are whole rows, ceil(rows / world) a rank (the last owners may have fewer, or
// none). After step 2 a rank holds every tile of its rows: it normalises them itself (its
// own tiles, as every non-spread fused kernel), storing its outputs and exporting the
// normalised vector into its exposed buffer, in the slot of the vector it just reduced (only
// this rank reads its own chunk there, and only the thread that now overwrites it); step 3
// then reads both finished outputs (the updated residual from the partial-result buffer, the
// normalised vector, or its FP8 bytes, from the exposed buffer) instead of the sum, and no
// rank normalises another's rows.
#define TPAR_LEAN_READY 1  // has a lean variant (frame.cuh: peers in groups)
#define TPAR_FUSED_READY 1  // has a fused variant (norm.cuh: residual add + RMSNorm)
#define TPAR_NORM_SPREAD 1  // the fused variant normalises grid-stride over the whole grid (norm.cuh)
#define TPAR_FUSED_ROWS_READY 1  // has a fused variant with owned rows (norm.cuh: -DTPAR_FUSED_ROWS; below)
#include "common.cuh"

#define TPAR_ROWS_GATHER_GROUP 8u  // owned rows' all-gather: peers whose two vectors are loaded at once

// ROWS: fused with owned rows (above), the rows variant's compile (-DTPAR_FUSED_ROWS: the
// two paths in one fused variant spilled registers on sm_90).
template <class D, class O, bool ROWS>
__device__ __forceinline__ void twoshot_pull_body(const TparArgs& a, O& out) {
    typedef TPAR_IDX I;  // vector indices (u64; u32 in the lean variant)
    TPAR_STAMP(a, 0, false);
    Frame f = frame_begin(a);
    TPAR_STAMP(a, 1, false);
    const u32 gen = f.epoch + 1u;
    const I nvec = (I)vecs_for<D>(a.count);
    const bool rows = O::fused() && ROWS;  // chunks of whole rows (above)
    const I vrow = rows ? (I)out.row_vecs() : (I)1;
    const I cvec = rows ? ((nvec / vrow + a.world - 1) / a.world) * vrow : TPAR_TILE_ALIGN((nvec + a.world - 1) / a.world);
    const I stride = (I)grid_threads();
    const I first = (I)global_tid();

    // Fused: the norm spread over the whole grid where the steps below leave at least half
    // of it idle (norm.cuh TPAR_NORM_SPREAD; below, after the all-gather). Owned rows have
    // no norm after the all-gather.
    const bool spread = !rows && 2 * cvec <= stride;
    out.set_spread(spread);
    // 1. expose my share of every chunk (block b covers sub-range b of each chunk).
    for (u32 q = 0; q < a.world; ++q) {
        const I lo = (I)q * cvec;
        const I hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (I v = lo + first; v < hi; v += stride) {
            st_v16(pull_at(a, a.rank, f.buf, 0, v), load_input<D>(a, v));
        }
    }
    pdl_launch_dependents();
    // Fused: the residual and weight of my chunk's first vector, behind the signal.
    barrier_block_then<TPAR_BAR_RELEASE>(a, f, 0, gen, [&] {
        const I mine = (I)a.rank * cvec + first;
        out.stage(a, first < cvec && mine < nvec ? (u64)mine : ~0ull);  // only a vector step 2 reduces: its copy is waited for
    });
    TPAR_STAMP(a, 2, false);
    const u32 dm = desc_mask(a);
    V16 d = {0u, 0u, 0u, 0u};
    if (dm && !TPAR_LEAN_ON) d = desc_prefetch(a, f, dm);  // lean: polled after the data (4 registers fewer)
    // 2. reduce-scatter by reads.
    {
        const I lo = (I)a.rank * cvec;
        const I hi = lo + cvec < nvec ? lo + cvec : nvec;
        const u32 peers = peers_mask<SLOT_PULL_EXPOSED>(a, 0, 0, nvec);
        for (I v = lo + first; v < hi; v += stride) {
            const V16 own = ld_v16(pull_at(a, a.rank, f.buf, 0, v));
            V16 r = load_reduce<D, SLOT_PULL_EXPOSED>(a, f, peers, v, 0, own);
            out.transform(a, v, r);
            st_v16(pull_at(a, a.rank, f.buf, 1, v), r);
            out.put(a, f, v, r);
        }
    }
    if (dm) {
        if (TPAR_LEAN_ON) desc_only<D>(a, f, dm);
        else desc_check<D>(a, f, d, dm);
    }
    if (rows) {  // owned rows: normalised here, exported for the all-gather
        const I lo = (I)a.rank * cvec;
        const I hi = lo + cvec < nvec ? lo + cvec : nvec;
        for (I v = lo + first; v < hi; v += stride) out.norm_export(a, f, v, pull_at(a, a.rank, f.buf, 0, v));
    }
    barrier_block(a, f, 1, gen);
    // 3. all-gather by reads: thread j takes index j of every other chunk (the same thread
    //    that exposed it in step 1), all reads in flight at once. Owned rows: both finished
    //    outputs of each peer's vector, peers in groups of TPAR_ROWS_GATHER_GROUP (two
    //    vectors a peer in registers).
    if (rows) {
        for (I j = first; j < cvec; j += stride) {
            const u32 m = peers_mask<SLOT_PULL_RESULT_CHUNK>(a, j, cvec, nvec);
#pragma unroll
            for (u32 g = 0; g < TPAR_MAX_RANKS; g += TPAR_ROWS_GATHER_GROUP) {
                if (g >= a.world) break;
                V16 r[TPAR_ROWS_GATHER_GROUP], o[TPAR_ROWS_GATHER_GROUP];
                load_group<SLOT_PULL_RESULT_CHUNK, TPAR_ROWS_GATHER_GROUP>(a, f, r, g, m, j, cvec);
#pragma unroll
                for (u32 u = 0; u < TPAR_ROWS_GATHER_GROUP; ++u) {
                    const u32 q = g + u;
                    if (q >= a.world) break;
                    if (m & (1u << q)) o[u] = out.load_export(pull_at(a, q, f.buf, 0, (u64)q * cvec + j));
                }
#pragma unroll
                for (u32 u = 0; u < TPAR_ROWS_GATHER_GROUP; ++u) {
                    const u32 q = g + u;
                    if (q >= a.world) break;
                    if (m & (1u << q)) out.put_gathered(a, (u64)q * cvec + j, r[u], o[u]);
                }
            }
        }
    } else
    for (I j = first; j < cvec; j += stride) {
        const u32 m = peers_mask<SLOT_PULL_RESULT_CHUNK>(a, j, cvec, nvec);
#pragma unroll
        for (u32 g = 0; g < TPAR_MAX_RANKS; g += TPAR_GATHER_GROUP) {  // one group unless lean
            if (g >= a.world) break;
            V16 x[TPAR_GATHER_GROUP];
            load_group<SLOT_PULL_RESULT_CHUNK, TPAR_GATHER_GROUP>(a, f, x, g, m, j, cvec);
#pragma unroll
            for (u32 u = 0; u < TPAR_GATHER_GROUP; ++u) {
                const u32 q = g + u;
                if (q >= a.world) break;
                if (m & (1u << q)) out.put(a, f, (I)q * cvec + j, x[u]);
            }
        }
    }
    out.flush(a, f);  // fused: this warp's tiles, published after a release (norm.cuh)
    clear_previous<D>(a, f);  // only after a push call (mixed sequences)
    TPAR_STAMP(a, 3, true);  // the all-reduce done (and, fused, every put)
    // Fused: the same vectors again, normalised. The steps above use only the grid's first
    // cvec threads, world vectors each in step 3; where that leaves at least half the grid
    // idle, every vector of the message is normalised grid-stride over the whole grid
    // instead (a vector's residual may be another thread's put, visible through its row's
    // tiles: norm.cuh TPAR_NORM_SPREAD), else each thread normalises its own puts: step 2's,
    // then step 3's (bench/results/2026-12-03-h200-fused-twoshot-spread/README.md: the spread up to 6.3 us
    // faster where cvec is a fraction of the grid, its publication 1-3 us slower where cvec
    // exceeds half of it).
    if (O::fused() && !rows) {
        if (spread) {
            for (I v = first; v < nvec; v += stride) out.norm(a, f, v);
        } else {
            const I lo = (I)a.rank * cvec;
            const I hi = lo + cvec < nvec ? lo + cvec : nvec;
            for (I v = lo + first; v < hi; v += stride) out.norm(a, f, v);
            for (I j = first; j < cvec; j += stride) {
                const u32 m = peers_mask<SLOT_PULL_RESULT_CHUNK>(a, j, cvec, nvec);
                for (u32 q = 0; q < a.world; ++q)
                    if (m & (1u << q)) out.norm(a, f, (I)q * cvec + j);
            }
        }
    }
    TPAR_STAMP(a, 4, true);
    frame_end(a, f, (u64)nvec, TPAR_KIND_NONE);
}

template <class D, class O>
__device__ void twoshot_pull(const TparArgs& a, O& out) {
    if (io_registered(a)) {  // a registered graph call: no copy, all-gather by writes (io.cuh; never fused)
        io_all_reduce<D, true>(a);
        return;
    }
    twoshot_pull_body<D, O, O::fused() && TPAR_ROWS_OWNED>(a, out);
}

TPAR_INSTANTIATE_FUSABLE(twoshot_pull)
