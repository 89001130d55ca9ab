//! Model checks of the protocols over all interleavings (loom), on the real algorithm code:
//! the algorithms are generic over the word type, so here they run over loom's atomics,
//! which explore every ordering the C11 memory model allows, relaxed clears included.
//! A violated buffer-reuse rule shows up as a wrong sum or a stale word being read.

use super::{run_chunk, Algorithm, Call};
use crate::dtype::{unpack_into, DType, Element};
use std::borrow::Cow;
use crate::error::Result;
use crate::protocol::{Desc, Phase, Wait, Word};
use crate::workspace::{Layout, Workspace};
use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use std::sync::atomic::Ordering;

impl Word for AtomicU64 {
    fn load_acquire(&self) -> u64 {
        self.load(Ordering::Acquire)
    }
    fn store_release(&self, v: u64) {
        self.store(v, Ordering::Release)
    }
    fn store_relaxed(&self, v: u64) {
        self.store(v, Ordering::Relaxed)
    }
    // The bulk verbs as relaxed word accesses: the model checker then sees every word the
    // real code copies plainly, and a protocol that let a reader see a stale or a next-call
    // word shows up as a wrong sum.
    fn store_plain<T: Element>(dst: &[Self], src: &[T]) {
        for (d, w) in dst.iter().zip(src.chunks(T::LANES)) {
            d.store(pack_raw(w), Ordering::Relaxed);
        }
    }
    fn view<T: Element>(src: &[Self], count: usize) -> Cow<'_, [T]> {
        let mut out = vec![T::from_f32(0.0); count.min(src.len() * T::LANES)];
        for (w, o) in src.iter().zip(out.chunks_mut(T::LANES)) {
            unpack_into(w.load(Ordering::Relaxed), o);
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
    fn pause(&mut self, _peer: usize, _phase: Phase, _round: u32) -> Result<()> {
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
        let words: Arc<Vec<AtomicU64>> = Arc::new((0..layout.total).map(|_| AtomicU64::new(0)).collect());
        if let Ok(ws) = Workspace::new(layout, &words[..]) {
            ws.init(1, first_epoch, crate::protocol::barrier_init(first_epoch));
        }
        let rank_fn = move |rank: usize, words: Arc<Vec<AtomicU64>>| {
            let ws = Workspace::new(layout, &words[..]).expect("layout");
            let mut outs = vec![];
            for (k, algo) in algos.iter().enumerate() {
                let input: Vec<f32> = (0..n).map(|i| (1 + rank * 10 + k * 100 + i) as f32).collect();
                let mut out = vec![0f32; n];
                let desc = Desc {
                    epoch: first_epoch.wrapping_add(k as u32),
                    algorithm: *algo,
                    dtype: DType::F32,
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
