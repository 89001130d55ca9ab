//! The tune's bit-exact screen, shared by every kind of ranks: every rank regenerates every
//! rank's input from one seed (`testing::all_inputs`), computes the output tpar's algorithms
//! promise (the all-reduce: the f32 sum in rank order, rounded once, `hierarchical` across
//! islands rounding each island's sum once more; the all-gather: every rank's input in rank
//! order, a bitwise copy; the reduce-scatter: rank q's slice of the all-reduce's sum, the same
//! bits), and compares its own output with it bit for bit. The inputs and the promised output
//! of one (dtype, count, seed) are kept for every candidate screened on them, so large sizes
//! pay the generation once.
//!
//! Owns: the inputs' set and the judge. Must never: judge NCCL (it rounds every partial sum
//! in the dtype; it is the fallback, not a candidate), or produce all-zero inputs.

use super::Judged;
use crate::algorithms::Algorithm;
use crate::dtype::{DType, Element};
use crate::kinds::Collective;
use crate::testing::{bit_diffs, digest, expected, expected_all_gather, expected_islands, fill_input};
use crate::error::{Error, Result};
use std::any::Any;

/// One (dtype, count, seed)'s inputs for every rank and the rank-order f32 output.
pub struct ScreenSet<T> {
    pub inputs: Vec<Vec<T>>,
    pub expected: Vec<T>,
    /// `hierarchical`'s promised output over the islands, made when first asked for.
    pub islands: Option<Vec<T>>,
    /// The all-gather's promised output (every input in rank order), made when first asked for.
    pub gathered: Option<Vec<T>>,
}

/// The last set made, whatever its dtype.
#[derive(Default)]
pub struct ScreenCache {
    key: Option<(DType, usize, u64, usize)>,
    set: Option<Box<dyn Any + Send>>,
}

impl ScreenCache {
    /// The set of `world` ranks' inputs of `count` elements from `seed`, made once.
    pub fn get<T: Element + Send + 'static>(&mut self, world: usize, count: usize, seed: u64) -> Result<&mut ScreenSet<T>> {
        let key = (T::DTYPE, count, seed, world);
        let fresh = self.key != Some(key) || !self.set.as_ref().is_some_and(|s| s.is::<ScreenSet<T>>());
        if fresh {
            // Every rank's input, generated in parallel (the large sizes are most of a
            // tune's host time); the same values as `testing::all_inputs`.
            let inputs: Vec<Vec<T>> = std::thread::scope(|s| {
                let jobs: Vec<_> = (0..world)
                    .map(|r| {
                        s.spawn(move || {
                            let mut v = vec![T::from_f32(0.0); count];
                            fill_input(seed, 0, r, &mut v);
                            v
                        })
                    })
                    .collect();
                jobs.into_iter().map(|j| j.join().unwrap_or_default()).collect()
            });
            if inputs.iter().any(|v| v.len() != count) {
                return Err(Error::invalid("screen", "an input generator thread failed"));
            }
            let expected = expected(&inputs);
            self.set = Some(Box::new(ScreenSet { inputs, expected, islands: None, gathered: None }));
            self.key = Some(key);
        }
        // The set was just made with this type when it was not one already.
        self.set.as_mut().and_then(|s| s.downcast_mut::<ScreenSet<T>>()).ok_or_else(|| Error::invalid("screen", "the inputs' set has another type (a bug)"))
    }
}

impl<T: Element> ScreenSet<T> {
    /// What `algo` promises on these inputs, over `islands` (normalised; empty or one
    /// island: the rank-order sum).
    pub fn promised(&mut self, algo: Algorithm, islands: &[Vec<usize>]) -> &[T] {
        if algo == Algorithm::Hierarchical && islands.len() > 1 {
            if self.islands.is_none() {
                self.islands = Some(expected_islands(&self.inputs, islands));
            }
            if let Some(v) = &self.islands {
                return v;
            }
        }
        &self.expected
    }

    /// What `algo` promises rank `rank` for `collective` of `n` elements per rank on these
    /// inputs (made with `collective.io_elems(n, world).0` elements per rank): the
    /// all-reduce's [`promised`](Self::promised), the all-gather's concatenation
    /// (`testing::expected_all_gather`), or slice `rank` of the all-reduce's rank-order sum
    /// (`testing::expected_reduce_scatter`'s bits). Empty where `rank` or `n` do not fit the
    /// inputs (every output then differs from it: the judge counts the difference).
    pub fn promised_for(&mut self, collective: Collective, algo: Algorithm, islands: &[Vec<usize>], rank: usize, n: usize) -> &[T] {
        match collective {
            Collective::AllReduce => self.promised(algo, islands),
            Collective::AllGather => self.gathered.get_or_insert_with(|| expected_all_gather(&self.inputs)),
            Collective::ReduceScatter => rank.checked_mul(n).and_then(|at| self.expected.get(at..at.checked_add(n)?)).unwrap_or(&[]),
        }
    }
}

/// One rank's verdict: elements that differ bitwise from `promised` (a length that differs
/// counts as that many wrong elements), and its output's digest.
pub fn judge<T: Element>(out: &[T], promised: &[T]) -> Judged {
    Judged { off: bit_diffs(out, promised) as u64, digest: digest(out) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn a_set_is_made_once_per_key_and_judges_bitwise() {
        let mut c = ScreenCache::default();
        let p = c.get::<bf16>(3, 100, 7).unwrap().inputs[0].as_ptr();
        assert_eq!(c.get::<bf16>(3, 100, 7).unwrap().inputs[0].as_ptr(), p, "kept");
        assert_eq!(c.get::<f32>(3, 100, 7).unwrap().inputs.len(), 3, "another dtype replaces it");
        let s = c.get::<f32>(3, 100, 7).unwrap();
        assert!(s.inputs.iter().flatten().any(|x| *x != 0.0), "never all zeros");
        assert_eq!(s.inputs, crate::testing::all_inputs::<f32>(7, 0, 3, 100), "testing::all_inputs' values");
        let want = s.promised(Algorithm::OneshotPush, &[]).to_vec();
        assert_eq!(judge(&want, &want).off, 0);
        let mut bad = want.clone();
        bad[5] = f32::from_bits(bad[5].to_bits() ^ 1);
        let j = judge(&bad, &want);
        assert_eq!(j.off, 1);
        assert_ne!(j.digest, judge(&want, &want).digest);
        let isl = s.promised(Algorithm::Hierarchical, &[vec![0], vec![1, 2]]).to_vec();
        assert_eq!(isl.len(), 100);
    }

    #[test]
    fn the_gather_is_the_inputs_and_the_scatter_the_sums_slice() {
        use crate::testing::{all_inputs, expected_all_gather, expected_reduce_scatter};
        let (world, n) = (3, 40);
        let mut c = ScreenCache::default();
        // The all-gather: n elements a rank in, every rank's in rank order out.
        let s = c.get::<bf16>(world, n, 11).unwrap();
        let g = s.promised_for(Collective::AllGather, Algorithm::OneshotPush, &[], 1, n).to_vec();
        assert_eq!(g, expected_all_gather(&all_inputs::<bf16>(11, 0, world, n)));
        assert_eq!(g.len(), world * n);
        assert_eq!(&g[n..2 * n], &s.inputs[1][..], "a bitwise copy");
        // The reduce-scatter: world x n in, slice q of the all-reduce's sum out.
        let s = c.get::<bf16>(world, world * n, 12).unwrap();
        let all = s.expected.clone();
        for q in 0..world {
            let mine = s.promised_for(Collective::ReduceScatter, Algorithm::OneshotPush, &[], q, n).to_vec();
            assert_eq!(mine, expected_reduce_scatter(&s.inputs, q), "rank {q}");
            assert_eq!(mine, all[q * n..(q + 1) * n], "rank {q}: the all-reduce's bits");
            assert_eq!(judge(&mine, &mine).off, 0);
        }
        // Another rank's slice is judged wrong; a rank past the world gets nothing to match.
        let other = s.promised_for(Collective::ReduceScatter, Algorithm::OneshotPush, &[], 0, n).to_vec();
        assert!(judge(&other, s.promised_for(Collective::ReduceScatter, Algorithm::OneshotPush, &[], 1, n)).off > 0);
        assert_eq!(judge(&other, s.promised_for(Collective::ReduceScatter, Algorithm::OneshotPush, &[], world, n)).off, n as u64);
        // The all-reduce is the rank-order sum, as before.
        assert_eq!(s.promised_for(Collective::AllReduce, Algorithm::OneshotPush, &[], 2, world * n), &all[..]);
    }
}
