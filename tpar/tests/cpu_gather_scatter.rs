//! The all-gather and the reduce-scatter on CPU ranks, by the plan's pick (one-shot push) and
//! by one-shot pull: every dtype x world x count (one that spans several steps included)
//! against the exact expected output on fresh random inputs,
//! outputs poisoned before each call, every rank's output bitwise identical; the
//! reduce-scatter bitwise equal to the same slice of the all-reduce; a collective that differs
//! between ranks is a Mismatch naming the collective; sizes that do not fit are refused.

mod common;
use common::*;
use std::sync::Arc;
use tpar::kinds::Collective;
use tpar::Algorithm;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest, expected, expected_all_gather, expected_reduce_scatter, poison};
use tpar::{bf16, f16, Element, Error};

/// Per-rank counts: empty, sub-vector, odd, a vector, large, and past a 512 KiB step.
const COUNTS: [usize; 6] = [0, 1, 7, 16, 1000, (1 << 18) + 5];

/// Per count: the count, the all-gather's inputs and the reduce-scatter's.
type Cases<T> = Vec<(usize, Vec<Vec<T>>, Vec<Vec<T>>)>;

fn sweep<T: Element>(world: usize, seed: u64) {
    // For each count: the all-gather's inputs (n each) and the reduce-scatter's (world x n).
    let cases: Arc<Cases<T>> = Arc::new(
        COUNTS
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, all_inputs::<T>(seed, 2 * i as u64, world, n), all_inputs::<T>(seed, 2 * i as u64 + 1, world, n * world)))
            .collect(),
    );
    let c2 = cases.clone();
    let results = run_group(world, |_| {}, move |comm| {
        let (me, w) = (comm.rank(), comm.world());
        let mut digests = vec![];
        for ((n, ag_in, rs_in), algo) in c2.iter().flat_map(|c| [(c, None), (c, Some(Algorithm::OneshotPull))]) {
            let mut out = vec![T::from_f32(0.0); n * w];
            poison(&mut out);
            comm.collective(Collective::AllGather, algo, &ag_in[me], &mut out).unwrap_or_else(|e| panic!("all-gather {algo:?} n={n}: {e}"));
            assert_eq!(bit_diffs(&out, &expected_all_gather(ag_in)), 0, "all-gather {algo:?} {:?} n={n} world={w}: not every rank's input in rank order", T::DTYPE);
            digests.push(digest(&out));

            let mut piece = vec![T::from_f32(0.0); *n];
            poison(&mut piece);
            comm.collective(Collective::ReduceScatter, algo, &rs_in[me], &mut piece).unwrap_or_else(|e| panic!("reduce-scatter {algo:?} n={n}: {e}"));
            let exp = expected_reduce_scatter(rs_in, me);
            assert_eq!(bit_diffs(&piece, &exp), 0, "reduce-scatter {algo:?} {:?} n={n} world={w}: differs from the rank-order f32 sum", T::DTYPE);
            let sliced: Vec<Vec<T>> = rs_in.iter().map(|v| v[me * n..(me + 1) * n].to_vec()).collect();
            assert_eq!(count_wrong(&piece, &sliced), 0, "reduce-scatter n={n}: outside f64 tolerance");
            // The same bits as slice `me` of the all-reduce of the same inputs, run for real.
            let mut all = vec![T::from_f32(0.0); n * w];
            poison(&mut all);
            comm.all_reduce(&rs_in[me], &mut all).unwrap();
            assert_eq!(bit_diffs(&all, &expected(rs_in)), 0);
            assert_eq!(bit_diffs(&piece, &all[me * n..(me + 1) * n]), 0, "reduce-scatter n={n}: not the all-reduce's slice");
            // Every rank's piece, gathered, is the whole all-reduce.
            let mut whole = vec![T::from_f32(0.0); n * w];
            poison(&mut whole);
            comm.all_gather(&piece, &mut whole).unwrap();
            assert_eq!(bit_diffs(&whole, &all), 0, "all-gather of the reduce-scatter != all-reduce, n={n}");
        }
        digests
    });
    let digests: Vec<Vec<u64>> = results.into_iter().map(|r| r.unwrap()).collect();
    for (r, d) in digests.iter().enumerate() {
        assert_eq!(d, &digests[0], "rank {r}'s all-gather outputs differ bitwise from rank 0's");
    }
}

#[test]
fn every_dtype_and_world_f32() {
    for world in [2, 3, 5, 8] {
        sweep::<f32>(world, 21);
    }
}

#[test]
fn every_dtype_and_world_f16() {
    for world in [2, 4, 7] {
        sweep::<f16>(world, 22);
    }
}

#[test]
fn every_dtype_and_world_bf16() {
    for world in [2, 3, 6, 16] {
        sweep::<bf16>(world, 23);
    }
}

#[test]
fn special_values_are_copied_exactly() {
    // -0.0, NaN payloads, infinities and the all-ones pattern travel bit for bit in an
    // all-gather on CPU ranks (no sentinel in the data there).
    let specials = [f32::from_bits(0x8000_0000), f32::NAN, f32::INFINITY, f32::from_bits(0xffff_ffff), f32::from_bits(0x7fc0_1234), 1.5];
    let res = run_group(3, |_| {}, move |comm| {
        let mut out = vec![0f32; specials.len() * 3];
        comm.all_gather(&specials, &mut out).unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    });
    for r in res {
        let bits = r.unwrap();
        let want: Vec<u32> = (0..3).flat_map(|_| specials.iter().map(|x| x.to_bits())).collect();
        assert_eq!(bits, want);
    }
}

#[test]
fn ranks_calling_different_collectives_get_a_mismatch_naming_it() {
    // Rank 1 reduce-scatters what the others all-gather, with the same per-rank count: the
    // descriptor differs only in its collective.
    let res = run_group(3, |_| {}, move |comm| {
        let n = 64;
        let w = comm.world();
        let r = if comm.rank() == 1 {
            let input = vec![1f32; n * w];
            let mut out = vec![0f32; n];
            comm.reduce_scatter(&input, &mut out)
        } else {
            let input = vec![1f32; n];
            let mut out = vec![0f32; n * w];
            comm.all_gather(&input, &mut out)
        };
        let after = comm.all_gather(&[1f32; 4], &mut [0f32; 12]);
        (r, after.is_err())
    });
    let mut named = 0;
    for (rank, r) in res.into_iter().enumerate() {
        let (e, poisoned) = r.unwrap();
        let e = e.expect_err("a mismatched call must fail on every rank");
        if let Error::Mismatch { field, ours, theirs, .. } = &e {
            assert_eq!(*field, "collective", "rank {rank}: {e}");
            assert_ne!(ours, theirs);
            named += 1;
        } else {
            assert!(matches!(e, Error::Aborted { .. }), "rank {rank}: {e}");
        }
        assert!(poisoned, "rank {rank}: the communicator must be poisoned after a mismatch");
    }
    assert!(named >= 1, "at least one rank names the collective");
}

#[test]
fn sizes_that_do_not_fit_are_refused_without_poisoning() {
    let res = run_group(2, |_| {}, move |comm| {
        let e1 = comm.all_gather(&[1f32; 8], &mut [0f32; 15]).unwrap_err();
        let e2 = comm.reduce_scatter(&[1f32; 15], &mut [0f32; 8]).unwrap_err();
        let mut out = [0f32; 16];
        comm.all_gather(&[2f32; 8], &mut out).unwrap();
        (e1.to_string(), e2.to_string(), out)
    });
    for r in res {
        let (e1, e2, out) = r.unwrap();
        assert!(e1.contains("8 x 2") && e1.contains("not 15"), "{e1}");
        assert!(e2.contains("8 x 2") && e2.contains("not 15"), "{e2}");
        assert_eq!(out, [2f32; 16]);
    }
}

#[test]
fn the_plan_runs_one_shot_push_and_refuses_algorithms_that_cannot() {
    let res = run_group(2, |_| {}, move |comm| {
        let a = comm.planned_for(Collective::AllGather, tpar::DType::F32, 1024);
        let e = comm.collective(Collective::ReduceScatter, Some(tpar::Algorithm::TwoshotPush), &[1f32; 8], &mut [0f32; 4]).unwrap_err();
        (a, e.to_string(), comm.is_poisoned())
    });
    for r in res {
        let (a, e, poisoned) = r.unwrap();
        assert_eq!(a, tpar::Algorithm::OneshotPush);
        assert!(e.contains("twoshot-push computes the all-reduce only"), "{e}");
        assert!(!poisoned);
    }
}
