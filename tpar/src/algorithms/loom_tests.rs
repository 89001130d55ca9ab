//! Model checks of the CPU protocols with loom, on the real algorithm code: the algorithms
//! are generic over the word type, so here they run over a word made of loom's primitives.
//!
//! What is covered, exactly: two ranks (world 2), f32, calls of 1 to 16 elements, three or
//! four calls in a row per test (buffer reuse across parities, barriers across epoch wrap,
//! algorithms mixed in one workspace), one chunk per call. loom explores every interleaving
//! of the two rank threads with at most two preemptions (`preemption_bound = 2`), and for
//! the flags every value the C11 memory model lets an acquire or relaxed load see. Wider
//! worlds, other dtypes, multi-chunk calls and deeper preemption are covered by the
//! process-level tests (`tests/cpu_*.rs`), not by this model.
//!
//! Flags (descriptors, barrier slots, the header) are loom atomics. Data words — what the
//! real code copies and reads plainly (`Word::store_plain`, `Word::view`) — are loom
//! `UnsafeCell`s, so loom checks each plain access against the others: a copy into a slot
//! that is not ordered after the owner's last read of it (or a read not ordered after the
//! copy) is a data race, and fails the model even when the value read happens to be right.
//! A protocol that let a reader see a stale or a next-call word also shows as a wrong sum.

use super::{run_chunk, Algorithm, Call};
use crate::dtype::{unpack_into, DType, Element, EMPTY};
use std::borrow::Cow;
use crate::error::Result;
use crate::protocol::{Desc, Phase, Wait, Word};
use crate::workspace::{Layout, Workspace};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use std::sync::atomic::Ordering;

/// One workspace word for the model: its flag half is used by the atomic verbs, its data
/// half by the plain ones. No word of the workspace is used both ways (flags and data lie in
/// separate regions); `Workspace::init`'s relaxed store of the empty word to every word is
/// the data half's initial value.
struct LoomWord {
    flag: AtomicU64,
    data: UnsafeCell<u64>,
}

impl LoomWord {
    fn new() -> LoomWord {
        LoomWord { flag: AtomicU64::new(0), data: UnsafeCell::new(EMPTY) }
    }
}

// SAFETY: the data half is shared between the rank threads on purpose: that sharing is
// what the model checks. loom tracks every `with` / `with_mut` on it and fails the model on
// any pair of accesses (one a write) not ordered by happens-before, so no race goes unseen.
unsafe impl Sync for LoomWord {}

impl Word for LoomWord {
    fn load_acquire(&self) -> u64 {
        self.flag.load(Ordering::Acquire)
    }
    fn store_release(&self, v: u64) {
        self.flag.store(v, Ordering::Release)
    }
    fn store_relaxed(&self, v: u64) {
        self.flag.store(v, Ordering::Relaxed)
    }
    fn store_plain<T: Element>(dst: &[Self], src: &[T]) {
        for (d, w) in dst.iter().zip(src.chunks(T::LANES)) {
            // SAFETY: loom's cell: the write is checked against every other access.
            d.data.with_mut(|p| unsafe { *p = pack_raw(w) });
        }
    }
    fn view<T: Element>(src: &[Self], count: usize) -> Cow<'_, [T]> {
        let mut out = vec![T::from_f32(0.0); count.min(src.len() * T::LANES)];
        for (w, o) in src.iter().zip(out.chunks_mut(T::LANES)) {
            // SAFETY: loom's cell: the read is checked against every other access.
            unpack_into(w.data.with(|p| unsafe { *p }), o);
        }
        Cow::Owned(out)
    }
}

/// Packs lanes as the real copy lays them out (lane 0 low), without canonicalising.
fn pack_raw<T: Element>(lanes: &[T]) -> u64 {
    lanes.iter().enumerate().fold(0, |w, (l, e)| w | e.to_lane() << (l as u32 * T::LANE_BITS))
}

struct LoomWait;
impl Wait for LoomWait {
    fn pause(&mut self, _peer: usize, _phase: Phase, _round: u32, _ready: &dyn Fn() -> bool) -> Result<()> {
        loom::thread::yield_now();
        Ok(())
    }
    fn spins_per_pause(&self) -> u32 {
        1
    }
}

/// Two ranks run `algos` back to back on `n` f32 elements per call, starting at
/// `first_epoch`; every output must be the exact sum.
fn check(algos: &'static [Algorithm], n: usize, first_epoch: u32, bound: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(move || {
        let world = 2;
        let layout = match Layout::new(world, 1) {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        let words: Arc<Vec<LoomWord>> = Arc::new((0..layout.total).map(|_| LoomWord::new()).collect());
        if let Ok(ws) = Workspace::new(layout, &words[..]) {
            ws.init(1, first_epoch, crate::protocol::barrier_init(first_epoch));
        }
        let rank_fn = move |rank: usize, words: Arc<Vec<LoomWord>>| {
            let ws = Workspace::new(layout, &words[..]).expect("layout");
            let mut outs = vec![];
            for (k, algo) in algos.iter().enumerate() {
                let input: Vec<f32> = (0..n).map(|i| (1 + rank * 10 + k * 100 + i) as f32).collect();
                let mut out = vec![0f32; n];
                let desc = Desc {
                    epoch: first_epoch.wrapping_add(k as u32),
                    algorithm: *algo,
                    dtype: DType::F32,
                    collective: crate::kinds::Collective::AllReduce,
                    count: n as u64,
                };
                let mut w = LoomWait;
                let mut call = Call { ws: &ws, rank, desc, waiter: &mut w };
                run_chunk(*algo, &mut call, &input, &mut out).expect("call");
                outs.push(out);
            }
            outs
        };
        let w1 = words.clone();
        let t = loom::thread::spawn(move || rank_fn(1, w1));
        let mine = rank_fn(0, words);
        let theirs = t.join().expect("rank 1");
        for (k, (a, b)) in mine.iter().zip(&theirs).enumerate() {
            let want: Vec<f32> = (0..n).map(|i| (1 + k * 100 + i) as f32 + (11 + k * 100 + i) as f32).collect();
            assert_eq!(a, &want, "rank 0, call {k} ({})", algos[k]);
            assert_eq!(b, &want, "rank 1, call {k} ({})", algos[k]);
        }
    });
}

#[test]
fn oneshot_push_reuses_buffers_safely() {
    // Three calls: the third reuses the first call's parity buffers.
    check(&[Algorithm::OneshotPush, Algorithm::OneshotPush, Algorithm::OneshotPush], 1, 0, 2);
}

#[test]
fn oneshot_push_reuses_out_of_line_buffers_safely() {
    // 16 floats (64 bytes) do not fit beside the flag: the data slot path.
    check(&[Algorithm::OneshotPush, Algorithm::OneshotPush, Algorithm::OneshotPush], 16, 3, 2);
}

#[test]
fn twoshot_push_reuses_buffers_safely() {
    check(&[Algorithm::TwoshotPush, Algorithm::TwoshotPush, Algorithm::TwoshotPush], 4, 7, 2);
}

#[test]
fn pull_barriers_hold_across_epoch_wrap() {
    check(&[Algorithm::OneshotPull, Algorithm::TwoshotPull, Algorithm::OneshotPull], 4, u32::MAX - 1, 2);
}

#[test]
fn mixed_algorithms_share_the_workspace_safely() {
    check(
        &[Algorithm::OneshotPush, Algorithm::GatherBcast, Algorithm::OneshotPush, Algorithm::TwoshotPull],
        2,
        u32::MAX,
        2,
    );
}

/// The model itself must catch a race on the plain copies: a writer that publishes its copy
/// with a relaxed flag (no release) races with the reader's plain read, although a reader
/// that saw the flag would often read the right value. This is what the relaxed-atomic
/// copies of the earlier model let through.
#[test]
#[should_panic(expected = "Causality violation")]
fn a_copy_published_without_release_is_a_data_race() {
    publish(false);
}

/// The control: the same exchange published with release is race-free.
#[test]
fn a_copy_published_with_release_is_not() {
    publish(true);
}

fn publish(release: bool) {
    loom::model(move || {
        let words: Arc<Vec<LoomWord>> = Arc::new((0..2).map(|_| LoomWord::new()).collect());
        let w = words.clone();
        let writer = loom::thread::spawn(move || {
            LoomWord::store_plain(&w[1..], &[1.5f32, 2.5]);
            if release {
                w[0].store_release(1);
            } else {
                w[0].store_relaxed(1);
            }
        });
        while words[0].load_acquire() != 1 {
            loom::thread::yield_now();
        }
        let got = LoomWord::view::<f32>(&words[1..], 2);
        assert_eq!(&got[..], &[1.5, 2.5]);
        writer.join().expect("writer");
    });
}
