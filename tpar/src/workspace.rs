//! The shared workspace: one block of 64-bit words per rank, owned (polled and cleared) by
//! that rank and written by its peers, plus a header. Defined once here; the CUDA kernels'
//! twin lives in `kernels/common.cuh`.
//!
//! ```text
//! header (16 words): magic, version, world, cap, job id, abort, first epoch, total words;
//!                     on the next line, the CPU backend's sleepers count and futex doorbell
//! rank block r (every region cache-line aligned; every flag on a line of its own):
//!   status      [8]                       pid, entered descriptor, entered epoch, state
//!   push_desc   [2 parity][world] x line  one-shot push: peers' call descriptors (flags),
//!                                         and calls of up to 56 bytes beside them
//!   push_data   [2 parity][world][cap]    one-shot push: peers' inputs
//!   rs_desc     [2 parity][world] x line  two-shot push, reduce-scatter: flags
//!   rs_data     [2 parity][world][piece]  two-shot push: peers' pieces of my share
//!   ag_desc     [2 parity][world] x line  two-shot push, all-gather: flags
//!   ag_data     [2 parity][cap]           two-shot push, all-gather: reduced pieces
//!   exposed     [cap]                     pull algorithms: my input, read by peers
//!   result      [cap]                     pull algorithms: my reduced piece, read by peers
//!   barrier     [world] x line            barrier generations, one slot per peer
//! ```
//!
//! A flag never shares a 64-byte line with another writer's flag, nor with data its writer
//! is still filling: a reader polling a flag must not pull away a line being filled, and
//! ranks raising their flags in one owner's array must not take the line from each other.
//! The one exception is deliberate: a one-shot push of at most 56 bytes is written into
//! the rest of its flag's line *before* the flag, so the reader's poll brings data and flag
//! in one transfer instead of two.
//!
//! Owns: offsets and bounds. Must never hand out a slice outside the mapping: `Workspace::new`
//! checks the length once, and every accessor stays inside the layout it was built from.

use crate::dtype::{Element, EMPTY};
use std::borrow::Cow;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// Words in the header.
pub const HEADER_WORDS: usize = 16;
/// Words in each rank's status region.
pub const STATUS_WORDS: usize = 8;
/// Header magic ("TPARSHM1").
pub const MAGIC: u64 = 0x5450_4152_5348_4d31;
/// Layout version; bump on any change.
pub const LAYOUT_VERSION: u64 = 2;
/// Largest world size the workspace supports.
pub const MAX_WORLD: usize = 16;
/// Smallest chunk capacity in words.
pub const MIN_CAP_WORDS: usize = 1024;
/// Largest workspace tpar creates or attaches (64 GiB). CPU calls run in steps of
/// `plan::floors::CPU_STEP_BYTES` (512 KiB), so a workspace beyond a few hundred MiB buys
/// nothing; the bound leaves room for any deliberate `TPAR_SHM_BYTES` and refuses sizes
/// only a corrupt or hostile welcome would carry (a joining rank allocates a chunk's worth
/// of scratch, so an unbounded `cap` would be an unbounded allocation).
pub const MAX_WORKSPACE_BYTES: usize = 64 << 30;

/// Header word indices.
pub mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const WORLD: usize = 2;
    pub const CAP: usize = 3;
    pub const JOB: usize = 4;
    /// 0 = no abort; r + 1 = rank r failed.
    pub const ABORT: usize = 5;
    pub const FIRST_EPOCH: usize = 6;
    pub const TOTAL: usize = 7;
    /// CPU backend, on a line of their own (a writer reads it after every batch of flags, so
    /// it must stay in every cache while nobody sleeps): how many ranks sleep in a futex wait
    /// on [`DOORBELL`], which a writer that finds the count above zero bumps and wakes.
    pub const SLEEPERS: usize = 8;
    /// CPU backend: the futex word sleeping waiters wait on (its low 32 bits).
    pub const DOORBELL: usize = 9;
}

/// Status word indices.
pub mod st {
    pub const PID: usize = 0;
    /// Encoded descriptor of the call this rank last entered.
    pub const DESC: usize = 1;
    /// Full epoch of that call.
    pub const EPOCH: usize = 2;
    /// CPU backend: 1 + the core this rank last paused a wait on (0: none yet), so that a
    /// waiting peer can see that the two share a core.
    pub const CPU: usize = 3;
}

/// Words per 64-byte cache line.
pub const LINE_WORDS: usize = 8;
/// Words of data that fit beside a one-shot push flag in its line (56 bytes).
pub const INLINE_WORDS: usize = LINE_WORDS - 1;

fn line(n: usize) -> usize {
    n.div_ceil(LINE_WORDS) * LINE_WORDS
}

/// Offsets (in words) of every region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub world: usize,
    /// Words per chunk: a call moves at most `cap * lanes` elements per epoch.
    pub cap: usize,
    /// Words per reduce-scatter piece: `ceil(cap / world)`.
    pub piece: usize,
    status: usize,
    push_desc: usize,
    push_data: usize,
    rs_desc: usize,
    rs_data: usize,
    ag_desc: usize,
    ag: usize,
    exposed: usize,
    result: usize,
    barrier: usize,
    /// Words per rank block.
    pub block: usize,
    /// Words in the whole workspace.
    pub total: usize,
}

impl Layout {
    /// Layout for `world` ranks and `cap` words per chunk (rounded up to a line). A
    /// workspace larger than [`MAX_WORKSPACE_BYTES`] is refused; the arithmetic is checked,
    /// so no `cap` wraps into a small layout.
    pub fn new(world: usize, cap: usize) -> Result<Layout> {
        if !(2..=MAX_WORLD).contains(&world) {
            return Err(Error::invalid("world", format!("{world} ranks; tpar supports 2 to {MAX_WORLD}")));
        }
        let too_big = || {
            Error::invalid("workspace", format!("{cap} words per chunk at {world} ranks: more than {MAX_WORKSPACE_BYTES} bytes"))
        };
        // Every product below is at most 2 * world * cap (or a line count) before the sum is
        // bounded, so a cap under the bound keeps each term far from overflow.
        if cap > MAX_WORKSPACE_BYTES / 8 {
            return Err(too_big());
        }
        let cap = line(cap.max(1));
        let piece = line(cap.div_ceil(world));
        let mut o: usize = 0;
        let mut overflow = false;
        let mut take = |n: usize| {
            let at = o;
            match o.checked_add(line(n)) {
                Some(v) => o = v,
                None => overflow = true,
            }
            at
        };
        let status = take(STATUS_WORDS);
        let push_desc = take(2 * world * LINE_WORDS);
        let push_data = take(2 * world * cap);
        let rs_desc = take(2 * world * LINE_WORDS);
        let rs_data = take(2 * world * piece);
        let ag_desc = take(2 * world * LINE_WORDS);
        let ag = take(2 * cap);
        let exposed = take(cap);
        let result = take(cap);
        let barrier = take(world * LINE_WORDS);
        let block = o;
        let total = world.checked_mul(block).and_then(|b| b.checked_add(HEADER_WORDS));
        let total = match total {
            Some(t) if !overflow && t <= MAX_WORKSPACE_BYTES / 8 => t,
            _ => return Err(too_big()),
        };
        Ok(Layout {
            world,
            cap,
            piece,
            status,
            push_desc,
            push_data,
            rs_desc,
            rs_data,
            ag_desc,
            ag,
            exposed,
            result,
            barrier,
            block,
            total,
        })
    }

    /// The largest layout whose whole workspace fits in `budget_bytes` (at least the minimum
    /// chunk).
    pub fn for_budget(world: usize, budget_bytes: usize) -> Result<Layout> {
        if budget_bytes > MAX_WORKSPACE_BYTES {
            return Err(Error::invalid("shm budget", format!("{budget_bytes} bytes: at most {MAX_WORKSPACE_BYTES}")));
        }
        // Sizes grow monotonically with cap: binary-search the largest cap that fits.
        let (mut lo, mut hi) = (MIN_CAP_WORDS, (budget_bytes / 8).max(MIN_CAP_WORDS));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if Layout::new(world, mid)?.bytes() <= budget_bytes {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Layout::new(world, lo)
    }

    /// Bytes of the whole workspace.
    pub fn bytes(&self) -> usize {
        self.total * 8
    }
}

/// A view of the workspace over some words (shared memory, or a test's vector of loom
/// atomics).
pub struct Workspace<'a, W> {
    pub layout: Layout,
    words: &'a [W],
}

/// A shared 64-bit cell. Implemented for `std` atomics (shared memory) and, in tests, for
/// loom's atomics.
pub trait Word: Sync + Sized {
    fn load_acquire(&self) -> u64;
    fn store_release(&self, v: u64);
    fn store_relaxed(&self, v: u64);
    /// Copies `src` into `dst`'s bytes, lane 0 of each word first, with plain stores: no
    /// ordering of its own; a later release (a flag, a barrier) publishes it. At most
    /// `dst.len()` words are written.
    fn store_plain<T: Element>(dst: &[Self], src: &[T]);
    /// The first `count` elements stored in `src` (at most what `src` holds). Only for
    /// words that no peer writes while the view lives: the protocol's acquire made them
    /// visible and the buffer-reuse argument keeps writers away until this call ends.
    fn view<T: Element>(src: &[Self], count: usize) -> Cow<'_, [T]>;
}

impl Word for AtomicU64 {
    #[inline(always)]
    fn load_acquire(&self) -> u64 {
        self.load(Ordering::Acquire)
    }
    #[inline(always)]
    fn store_release(&self, v: u64) {
        self.store(v, Ordering::Release)
    }
    #[inline(always)]
    fn store_relaxed(&self, v: u64) {
        self.store(v, Ordering::Relaxed)
    }
    #[inline]
    fn store_plain<T: Element>(dst: &[Self], src: &[T]) {
        let bytes = std::mem::size_of_val(src).min(std::mem::size_of_val(dst));
        // SAFETY: both ranges are valid for `bytes` bytes (the smaller of the two slices)
        // and do not overlap (`src` is private memory, `dst` the shared mapping, or two
        // distinct regions of it). The words are `AtomicU64`, whose interior mutability
        // allows writes through a shared reference; no other thread or process accesses
        // these words now (buffer-reuse argument, `protocol::clear`), so the plain stores do
        // not race, and the release that follows orders them before the reader's acquire.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, dst.as_ptr() as *mut u8, bytes) }
    }
    #[inline]
    fn view<T: Element>(src: &[Self], count: usize) -> Cow<'_, [T]> {
        let n = count.min(src.len() * T::LANES);
        // SAFETY: `src` holds `src.len() * 8` bytes, at least `n * size_of::<T>()`, 8-byte
        // aligned (more than any `T` needs); every bit pattern is a valid f32/f16/bf16; the
        // slice borrows `src`, so it cannot outlive the mapping. Nobody writes these words
        // while the view lives (the caller's contract above), so reading them plainly is
        // not a data race.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(src.as_ptr() as *const T, n) })
    }
}

impl<'a, W: Word> Workspace<'a, W> {
    /// Wraps `words`, which must hold exactly `layout.total` words.
    pub fn new(layout: Layout, words: &'a [W]) -> Result<Self> {
        if words.len() != layout.total {
            return Err(Error::invalid(
                "workspace",
                format!("mapping holds {} words, layout needs {}", words.len(), layout.total),
            ));
        }
        Ok(Workspace { layout, words })
    }

    /// Writes the initial state: header, every slot empty, barrier slots one generation
    /// before `first_epoch`'s first barrier. Only the creator calls this, before any peer
    /// can see the workspace.
    /// `barrier_initial` is the protocol's value of an untouched barrier slot for this
    /// first epoch (`protocol::barrier_init`).
    pub fn init(&self, job_id: u64, first_epoch: u32, barrier_initial: u64) {
        let l = &self.layout;
        for w in self.words {
            w.store_relaxed(EMPTY);
        }
        let h = self.header();
        for w in h {
            w.store_relaxed(0);
        }
        h[hdr::VERSION].store_relaxed(LAYOUT_VERSION);
        h[hdr::WORLD].store_relaxed(l.world as u64);
        h[hdr::CAP].store_relaxed(l.cap as u64);
        h[hdr::JOB].store_relaxed(job_id);
        h[hdr::FIRST_EPOCH].store_relaxed(first_epoch as u64);
        h[hdr::TOTAL].store_relaxed(l.total as u64);
        for r in 0..l.world {
            for w in self.status(r) {
                w.store_relaxed(0);
            }
            for p in 0..l.world {
                self.barrier_slot(r, p).store_relaxed(barrier_initial);
            }
        }
        // Magic last, with release: a mapping that shows the magic is initialised.
        h[hdr::MAGIC].store_release(MAGIC);
    }

    #[inline(always)]
    fn block(&self, r: usize) -> &'a [W] {
        let b = HEADER_WORDS + r * self.layout.block;
        &self.words[b..b + self.layout.block]
    }

    /// The header words.
    #[inline]
    pub fn header(&self) -> &'a [W] {
        &self.words[..HEADER_WORDS]
    }

    /// Rank `r`'s status words.
    #[inline]
    pub fn status(&self, r: usize) -> &'a [W] {
        &self.block(r)[self.layout.status..self.layout.status + STATUS_WORDS]
    }

    /// In `owner`'s block: the descriptor slot that `from` writes in one-shot push.
    #[inline]
    pub fn push_desc(&self, owner: usize, parity: usize, from: usize) -> &'a W {
        &self.block(owner)[self.layout.push_desc + (parity * self.layout.world + from) * LINE_WORDS]
    }

    /// In `owner`'s block: the rest of the line of `from`'s one-shot push flag
    /// ([`INLINE_WORDS`] words): a call that small travels in the flag's own line, so the
    /// reader's one poll brings the data too.
    #[inline]
    pub fn push_inline(&self, owner: usize, parity: usize, from: usize) -> &'a [W] {
        let at = self.layout.push_desc + (parity * self.layout.world + from) * LINE_WORDS + 1;
        &self.block(owner)[at..at + INLINE_WORDS]
    }

    /// In `owner`'s block: the data slot (`cap` words) that `from` writes in one-shot push.
    #[inline]
    pub fn push_data(&self, owner: usize, parity: usize, from: usize) -> &'a [W] {
        let l = &self.layout;
        let at = l.push_data + (parity * l.world + from) * l.cap;
        &self.block(owner)[at..at + l.cap]
    }

    /// In `owner`'s block: the reduce-scatter descriptor slot that `from` writes.
    #[inline]
    pub fn rs_desc(&self, owner: usize, parity: usize, from: usize) -> &'a W {
        &self.block(owner)[self.layout.rs_desc + (parity * self.layout.world + from) * LINE_WORDS]
    }

    /// In `owner`'s block: the all-gather flag that `from` raises once its reduced piece is
    /// in `owner`'s gather buffer.
    #[inline]
    pub fn ag_desc(&self, owner: usize, parity: usize, from: usize) -> &'a W {
        &self.block(owner)[self.layout.ag_desc + (parity * self.layout.world + from) * LINE_WORDS]
    }

    /// In `owner`'s block: the reduce-scatter slot (`piece` words) that `from` writes.
    #[inline]
    pub fn rs_data(&self, owner: usize, parity: usize, from: usize) -> &'a [W] {
        let l = &self.layout;
        let at = l.rs_data + (parity * l.world + from) * l.piece;
        &self.block(owner)[at..at + l.piece]
    }

    /// In `owner`'s block: the all-gather buffer (`cap` words).
    #[inline]
    pub fn ag_data(&self, owner: usize, parity: usize) -> &'a [W] {
        let l = &self.layout;
        let at = l.ag + parity * l.cap;
        &self.block(owner)[at..at + l.cap]
    }

    /// `owner`'s exposed input (pull algorithms).
    #[inline]
    pub fn exposed(&self, owner: usize) -> &'a [W] {
        &self.block(owner)[self.layout.exposed..self.layout.exposed + self.layout.cap]
    }

    /// `owner`'s reduced result region (pull algorithms).
    #[inline]
    pub fn result(&self, owner: usize) -> &'a [W] {
        &self.block(owner)[self.layout.result..self.layout.result + self.layout.cap]
    }

    /// `owner`'s barrier slot for `peer` (each on a line of its own).
    #[inline]
    pub fn barrier_slot(&self, owner: usize, peer: usize) -> &'a W {
        &self.block(owner)[self.layout.barrier + peer * LINE_WORDS]
    }
}

/// The element range `[start, end)` of rank `j`'s piece when `n` elements of `T` are split
/// over `world` ranks as evenly as whole cache lines allow: pieces start on a line, so two
/// owners never write the same line of a gather buffer or an output, and a piece of `n`
/// elements fits a slot of `Layout::piece` words whenever `n` fits `cap`.
#[inline]
pub fn piece_range<T: Element>(n: usize, world: usize, j: usize) -> (usize, usize) {
    let unit = LINE_WORDS * T::LANES;
    let lines = n.div_ceil(unit);
    ((j * lines / world * unit).min(n), ((j + 1) * lines / world * unit).min(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn regions_are_disjoint_and_in_bounds() {
        for world in [2, 3, 5, 8, 16] {
            let l = Layout::new(world, 1000).unwrap();
            let words: Vec<AtomicU64> = (0..l.total).map(|_| AtomicU64::new(0)).collect();
            let ws = Workspace::new(l, &words).unwrap();
            let base = words.as_ptr() as usize;
            let mut spans: Vec<(usize, usize)> = vec![];
            let span = |s: &[AtomicU64]| {
                let a = (s.as_ptr() as usize - base) / 8;
                (a, a + s.len())
            };
            spans.push(span(ws.header()));
            for r in 0..world {
                spans.push(span(ws.status(r)));
                spans.push(span(ws.exposed(r)));
                spans.push(span(ws.result(r)));
                for p in 0..world {
                    spans.push(span(std::slice::from_ref(ws.barrier_slot(r, p))));
                }
                for p in 0..2 {
                    spans.push(span(ws.ag_data(r, p)));
                    for f in 0..world {
                        spans.push(span(ws.push_data(r, p, f)));
                        spans.push(span(ws.rs_data(r, p, f)));
                        spans.push(span(std::slice::from_ref(ws.push_desc(r, p, f))));
                        spans.push(span(ws.push_inline(r, p, f)));
                        spans.push(span(std::slice::from_ref(ws.rs_desc(r, p, f))));
                        spans.push(span(std::slice::from_ref(ws.ag_desc(r, p, f))));
                    }
                }
            }
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "overlap {:?} {:?}", w[0], w[1]);
            }
            assert!(spans.last().unwrap().1 <= l.total);
            assert!(l.piece * world >= l.cap);
        }
    }

    #[test]
    fn budget_is_respected() {
        for world in [2, 4, 8, 16] {
            let l = Layout::for_budget(world, 64 << 20).unwrap();
            assert!(l.bytes() <= 64 << 20, "world {world}: {} bytes", l.bytes());
            assert!(l.bytes() > 32 << 20, "world {world}: budget badly used: {} bytes", l.bytes());
        }
        assert!(Layout::new(1, 10).is_err());
        assert!(Layout::new(17, 10).is_err());
    }

    #[test]
    fn absurd_caps_are_refused_not_wrapped() {
        // These wrapped into small layouts (release) or overflowed (debug) before the
        // arithmetic was checked: a welcome's `cap` must never reach a slice index.
        for cap in [1usize << 62, usize::MAX, 1 << 37, MAX_WORKSPACE_BYTES / 8 + 1] {
            for world in [2, 16] {
                let e = Layout::new(world, cap).unwrap_err();
                assert!(e.to_string().contains("words per chunk"), "{e}");
            }
        }
        let l = Layout::new(16, MAX_WORKSPACE_BYTES / 8 / 700).unwrap();
        assert!(l.bytes() <= MAX_WORKSPACE_BYTES);
        assert!(Layout::for_budget(2, MAX_WORKSPACE_BYTES + 1).is_err());
    }

    #[test]
    fn pieces_cover_everything_and_fit_their_slots() {
        for cap in [8, 1000, 4096] {
            for world in 2..=16 {
                let l = Layout::new(world, cap).unwrap();
                for n in [0, 1, 7, 100, 1025, 2 * l.cap - 1, 2 * l.cap] {
                    let mut next = 0;
                    for j in 0..world {
                        let (a, b) = piece_range::<half::bf16>(n, world, j);
                        assert_eq!(a, next);
                        assert!(a == n || a % (LINE_WORDS * 4) == 0, "piece starts on a line");
                        if n <= l.cap * 4 {
                            assert!((b - a).div_ceil(4) <= l.piece, "n {n} world {world}: piece {} words > {}", (b - a).div_ceil(4), l.piece);
                        }
                        next = b;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }
}
