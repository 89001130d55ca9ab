//! Every CPU algorithm x dtype x world size x count against the exact expected output and an
//! f64 reference, on fresh random inputs, outputs poisoned before each call, every rank's
//! output bitwise identical.

mod common;
use common::*;
use std::sync::Arc;
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest, expected, poison};
use tpar::{bf16, f16, Element};

/// (count, every rank's input, the exact expected output)
type Case<T> = (usize, Vec<Vec<T>>, Vec<T>);

const COUNTS: [usize; 6] = [0, 1, 7, 16, 1000, (1 << 20) + 3];

fn sweep<T: Element>(world: usize, seed: u64) {
    // Inputs and expectations computed once, shared by the rank threads.
    let cases: Arc<Vec<Case<T>>> = Arc::new(
        COUNTS
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let inputs = all_inputs::<T>(seed, i as u64, world, n);
                let exp = expected(&inputs);
                assert_eq!(count_wrong(&exp, &inputs), 0, "reference disagrees with itself");
                (n, inputs, exp)
            })
            .collect(),
    );
    let c2 = cases.clone();
    let results = run_group(world, |_| {}, move |comm| {
        let mut digests = vec![];
        for algo in tpar::algorithms::registry::algorithms_on(tpar::Backend::Cpu) {
            for (n, inputs, exp) in c2.iter() {
                let mut out = vec![T::from_f32(0.0); *n];
                poison(&mut out);
                comm.all_reduce_with(algo, &inputs[comm.rank()], &mut out)
                    .unwrap_or_else(|e| panic!("{algo} n={n}: {e}"));
                assert_eq!(bit_diffs(&out, exp), 0, "{algo} {:?} n={n} world={}: output differs from the rank-order f32 sum", T::DTYPE, comm.world());
                assert_eq!(count_wrong(&out, inputs), 0, "{algo} n={n}: outside f64 tolerance");
                // In place, on a copy of the input.
                let mut buf = inputs[comm.rank()].clone();
                comm.all_reduce_in_place(Some(algo), &mut buf).unwrap();
                assert_eq!(bit_diffs(&buf, exp), 0, "{algo} in place n={n}");
                digests.push(digest(&out));
            }
        }
        digests
    });
    let digests: Vec<Vec<u64>> = results.into_iter().map(|r| r.unwrap()).collect();
    for (r, d) in digests.iter().enumerate() {
        assert_eq!(d, &digests[0], "rank {r}'s outputs differ bitwise from rank 0's");
    }
}

#[test]
fn all_algorithms_f32() {
    for world in [2, 3, 4, 5, 8] {
        sweep::<f32>(world, 11);
    }
}

#[test]
fn all_algorithms_f16() {
    for world in [2, 3, 4, 5, 8] {
        sweep::<f16>(world, 12);
    }
}

#[test]
fn all_algorithms_bf16() {
    for world in [2, 3, 4, 5, 8] {
        sweep::<bf16>(world, 13);
    }
}

#[test]
fn special_values_travel_exactly() {
    // -0.0 stays -0.0, NaN stays NaN, infinities add, the empty pattern (all ones) as input is
    // not mistaken for "not yet written".
    let results = run_group(3, |_| {}, |comm| {
        let r = comm.rank();
        let ones = f32::from_bits(u32::MAX);
        let input = [-0.0f32, 1.0, f32::INFINITY, ones, if r == 0 { f32::MAX } else { -0.0 }];
        let mut outs = vec![];
        for algo in tpar::algorithms::registry::algorithms_on(tpar::Backend::Cpu) {
            let mut out = [0f32; 5];
            comm.all_reduce_with(algo, &input, &mut out).unwrap();
            outs.push(out);
        }
        outs
    });
    for r in results {
        for out in r.unwrap() {
            assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
            assert_eq!(out[1], 3.0);
            assert_eq!(out[2], f32::INFINITY);
            assert!(out[3].is_nan());
            assert_eq!(out[4], f32::MAX);
        }
    }
}

#[test]
fn every_world_size_up_to_sixteen() {
    for world in [6, 7, 16] {
        let results = run_group(world, |_| {}, move |comm| {
            let mut digests = vec![];
            for algo in tpar::algorithms::registry::algorithms_on(tpar::Backend::Cpu) {
                for (k, n) in [0usize, 1, 7, 1000, 4099].into_iter().enumerate() {
                    let ins = all_inputs::<bf16>(21, k as u64, comm.world(), n);
                    let mut out = vec![bf16::ZERO; n];
                    poison(&mut out);
                    comm.all_reduce_with(algo, &ins[comm.rank()], &mut out).unwrap();
                    assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "{algo} world {} n={n}", comm.world());
                    digests.push(digest(&out));
                }
            }
            digests
        });
        let d: Vec<Vec<u64>> = results.into_iter().map(|r| r.unwrap()).collect();
        assert!(d.iter().all(|x| x == &d[0]), "world {world}: ranks differ");
    }
}
