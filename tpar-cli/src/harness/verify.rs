//! The one verifier of the CLI, over `tpar::testing`: every checked call of every command
//! and every kind of rank is judged here, to one standard. tpar's algorithms promise the
//! rank-order f32 sum rounded once, so their outputs must equal it bit for bit (and lie
//! within the f64 reference's bound); NCCL rounds every partial sum in half and bf16, so it
//! is held to the bound for that. All ranks' outputs must be bitwise identical.
//!
//! The all-gather must be a bitwise copy of every rank's input in rank order (for NCCL too);
//! rank q's reduce-scatter must equal slice q of the all-reduce's rank-order sum bit for bit
//! (NCCL: within its bound). Ranks hold different slices there, so "identical" means every
//! rank used the same algorithm.

use tpar::algorithms::ce_wire;
use tpar::kinds::Wire;
use tpar::testing::{bit_diffs, digest, expected_all_gather, expected_islands, Reference};
use tpar::{Algorithm, Collective, Element};

pub use tpar::testing::{POISON_WORD, TIMING_WORD};

pub fn err(x: tpar::Error) -> String {
    x.to_string()
}

/// What one checked call gave on one rank.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub algo: Algorithm,
    /// Elements outside the f64 reference's rounding bound.
    pub wrong: usize,
    /// Elements that differ from the rank-order f32 sum (tpar's kernels promise it).
    pub inexact: usize,
    pub digest: u64,
}

/// Judges `out`, the result of `used` on `inputs` (every rank's), the ranks forming one
/// island.
pub fn judge<T: Element>(out: &[T], inputs: &[Vec<T>], used: Algorithm) -> Outcome {
    judge_on(out, inputs, used, &[], Wire::Exact)
}

/// As [`judge`], on ranks forming `islands` (normalised, as
/// `tpar::algorithms::hierarchical::normalize` gives them; empty: one island). Only
/// `hierarchical` depends on them: it must equal its own exact arithmetic (island sums
/// rounded to the dtype, then added in island order) bit for bit, within the f64 bound
/// that allows the second rounding. `wire`: what `ce-ring` put on the wire (`TPAR_WIRE`);
/// on a lossy wire it must equal `ce_wire::expected` (the quantised arithmetic) bit for bit
/// and lie within the documented bound around the f64 sum (`ce_wire::count_wrong`).
pub fn judge_on<T: Element>(out: &[T], inputs: &[Vec<T>], used: Algorithm, islands: &[Vec<usize>], wire: Wire) -> Outcome {
    Judge::new(inputs, used, islands, wire).outcome(out)
}

/// The references of one call, computed once from every rank's inputs and then held
/// against each rank's output: where one process judges every rank's output (emulated
/// ranks), judging costs one reference per call instead of one per rank.
pub struct Judge<T> {
    used: Algorithm,
    collective: Collective,
    reference: Reference<T>,
    /// `hierarchical` across islands: its own exact arithmetic.
    islands: Option<Vec<T>>,
    /// `ce-ring` on a lossy wire: the wire, every rank's inputs (for the bound) and the
    /// quantised arithmetic's output.
    lossy: Option<(Wire, Vec<Vec<T>>, Vec<T>)>,
}

impl<T: Element> Judge<T> {
    /// The references for a call of `used` on `inputs`, the ranks forming `islands` (as in
    /// [`judge_on`]).
    pub fn new(inputs: &[Vec<T>], used: Algorithm, islands: &[Vec<usize>], wire: Wire) -> Judge<T> {
        let islands = (used == Algorithm::Hierarchical && islands.len() > 1)
            .then(|| expected_islands(inputs, islands));
        let lossy = (used == Algorithm::CeRing && wire.is_lossy())
            .then(|| (wire, inputs.to_vec(), ce_wire::expected(inputs, wire)));
        Judge {
            used,
            collective: Collective::AllReduce,
            reference: Reference::new(inputs),
            islands,
            lossy,
        }
    }

    /// The references for a call of `collective` by `used` on `inputs` (every rank's, as
    /// `Collective::io_elems` sizes them). The all-reduce's are [`Judge::new`]'s; the
    /// all-gather's is the concatenation; the reduce-scatter's is the all-reduce's, each rank
    /// then held to its slice ([`outcome_of`](Self::outcome_of)).
    pub fn for_collective(
        collective: Collective,
        inputs: &[Vec<T>],
        used: Algorithm,
        islands: &[Vec<usize>],
        wire: Wire,
    ) -> Judge<T> {
        match collective {
            Collective::AllReduce => Judge::new(inputs, used, islands, wire),
            Collective::AllGather => {
                let exact = expected_all_gather(inputs);
                Judge {
                    used,
                    collective,
                    reference: Reference::copy_of(exact),
                    islands: None,
                    lossy: None,
                }
            }
            Collective::ReduceScatter => Judge {
                used,
                collective,
                reference: Reference::new(inputs),
                islands: None,
                lossy: None,
            },
        }
    }

    /// Rank `rank`'s output judged: as [`outcome`](Self::outcome) for the all-reduce; the
    /// all-gather bit for bit against the concatenation (NCCL too: a copy is exact); the
    /// reduce-scatter against slice `rank` of the all-reduce's references.
    pub fn outcome_of(&self, rank: usize, out: &[T]) -> Outcome {
        match self.collective {
            Collective::AllReduce => self.outcome(out),
            Collective::AllGather => {
                let d = bit_diffs(out, &self.reference.exact);
                Outcome {
                    algo: self.used,
                    wrong: d,
                    inexact: d,
                    digest: digest(out),
                }
            }
            Collective::ReduceScatter => {
                let n = out.len();
                let lo = (rank * n).min(self.reference.exact.len());
                let hi = (lo + n).min(self.reference.exact.len());
                let slice = self.reference.slice(lo..hi);
                let (wrong, inexact) = match self.used {
                    Algorithm::Nccl => (slice.count_wrong_stepwise(out), 0),
                    _ => (slice.count_wrong(out), bit_diffs(out, &slice.exact)),
                };
                Outcome {
                    algo: self.used,
                    wrong,
                    inexact,
                    digest: digest(out),
                }
            }
        }
    }

    /// One rank's output judged (see [`judge_on`]).
    pub fn outcome(&self, out: &[T]) -> Outcome {
        let r = &self.reference;
        if let Some((wire, inputs, want)) = &self.lossy {
            return Outcome { algo: self.used, wrong: ce_wire::count_wrong(out, inputs, *wire), inexact: bit_diffs(out, want), digest: digest(out) };
        }
        let (wrong, inexact) = match (self.used, &self.islands) {
            (Algorithm::Nccl, _) => (r.count_wrong_stepwise(out), 0),
            (Algorithm::Hierarchical, Some(isl)) => (r.count_wrong_islands(out), bit_diffs(out, isl)),
            _ => (r.count_wrong(out), bit_diffs(out, &r.exact)),
        };
        Outcome { algo: self.used, wrong, inexact, digest: digest(out) }
    }
}

/// What all ranks gave for one checked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub algo: Algorithm,
    pub count: usize,
    /// Summed over ranks.
    pub wrong: usize,
    pub inexact: usize,
    /// Every rank's output bitwise identical, and every rank used the same algorithm.
    pub identical: bool,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.wrong == 0 && self.inexact == 0 && self.identical
    }

    /// The `#wrong` column: elements wrong on some rank (all of them if ranks disagree).
    pub fn bad_elements(&self) -> i64 {
        let n = self.wrong.max(self.inexact) + if self.identical { 0 } else { self.count };
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// Combines every rank's outcome (`outcomes`, in rank order).
    pub fn of(outcomes: &[Outcome], count: usize) -> Verdict {
        Verdict::of_collective(Collective::AllReduce, outcomes, count)
    }

    /// As [`Verdict::of`] for `collective`: a reduce-scatter's ranks hold different slices,
    /// so there only the algorithm must agree (each slice was judged bit for bit).
    pub fn of_collective(collective: Collective, outcomes: &[Outcome], count: usize) -> Verdict {
        let first = outcomes
            .first()
            .map_or((Algorithm::OneshotPush, 0), |o| (o.algo, o.digest));
        let mut v = Verdict {
            algo: first.0,
            count,
            wrong: 0,
            inexact: 0,
            identical: true,
        };
        for o in outcomes {
            v.wrong = v.wrong.saturating_add(o.wrong);
            v.inexact = v.inexact.saturating_add(o.inexact);
            let same_bits = collective == Collective::ReduceScatter || o.digest == first.1;
            v.identical &= same_bits && o.algo == first.0;
        }
        v
    }
}

impl Outcome {
    /// For the control plane: 32 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(32);
        for w in [self.wrong as u64, self.inexact as u64, self.digest, self.algo.code()] {
            p.extend_from_slice(&w.to_le_bytes());
        }
        p
    }

    /// Inverse of [`Outcome::encode`]; a malformed payload reads as all wrong.
    pub fn decode(b: &[u8], count: usize) -> Outcome {
        let word = |k: usize| b.get(8 * k..8 * k + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
        match (word(0), word(1), word(2), word(3).and_then(Algorithm::from_code)) {
            (Some(w), Some(i), Some(d), Some(a)) => Outcome { algo: a, wrong: w as usize, inexact: i as usize, digest: d },
            _ => Outcome { algo: Algorithm::OneshotPush, wrong: count.max(1), inexact: 0, digest: u64::MAX },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpar::testing::{all_inputs, count_wrong, count_wrong_islands, count_wrong_stepwise, expected};

    #[test]
    fn the_exact_sum_passes_and_a_flipped_bit_does_not() {
        let inputs = all_inputs::<f32>(1, 2, 3, 100);
        let good = expected(&inputs);
        let o = judge(&good, &inputs, Algorithm::OneshotPush);
        assert_eq!((o.wrong, o.inexact), (0, 0));
        let mut bad = good.clone();
        bad[7] = f32::from_bits(bad[7].to_bits() ^ 1);
        let b = judge(&bad, &inputs, Algorithm::OneshotPush);
        assert_eq!(b.inexact, 1, "one ulp off the rank-order sum is caught");
        let v = Verdict::of(&[o, b], 100);
        assert!(!v.ok() && !v.identical && v.bad_elements() >= 100);
        let round = Outcome::decode(&o.encode(), 100);
        assert_eq!((round.digest, round.algo), (o.digest, o.algo));
        assert!(Verdict::of(&[o, o], 100).ok());
    }

    #[test]
    fn one_judge_per_call_counts_as_the_functions_do() {
        use tpar::algorithms::hierarchical::{from_sizes, normalize};
        let inputs = all_inputs::<half::f16>(5, 6, 8, 300);
        let isl = normalize(&from_sizes(&[3, 5]), 8).unwrap();
        let mut off = expected(&inputs);
        off[3] = half::f16::from_f32(off[3].to_f32() + 0.5);
        for algo in [Algorithm::OneshotPush, Algorithm::Nccl, Algorithm::Hierarchical] {
            let j = Judge::new(&inputs, algo, &isl, Wire::Exact);
            for out in [expected(&inputs), expected_islands(&inputs, &isl), off.clone()] {
                let o = j.outcome(&out);
                let want = match algo {
                    Algorithm::Nccl => (count_wrong_stepwise(&out, &inputs), 0),
                    Algorithm::Hierarchical => (count_wrong_islands(&out, &inputs), bit_diffs(&out, &expected_islands(&inputs, &isl))),
                    _ => (count_wrong(&out, &inputs), bit_diffs(&out, &expected(&inputs))),
                };
                assert_eq!((o.wrong, o.inexact), want, "{algo}");
            }
        }
    }

    #[test]
    fn hierarchical_is_held_to_its_island_arithmetic() {
        use tpar::algorithms::hierarchical::{from_sizes, normalize};
        let inputs = all_inputs::<half::bf16>(3, 4, 8, 500);
        let isl = normalize(&from_sizes(&[3, 5]), 8).unwrap();
        let good = expected_islands(&inputs, &isl);
        let o = judge_on(&good, &inputs, Algorithm::Hierarchical, &isl, Wire::Exact);
        assert_eq!((o.wrong, o.inexact), (0, 0));
        // The rank-order sum is not what the kernel computes across islands: some elements differ.
        assert!(judge_on(&expected(&inputs), &inputs, Algorithm::Hierarchical, &isl, Wire::Exact).inexact > 0);
        // One island: the rank-order sum, bit for bit.
        let one = normalize(&from_sizes(&[8]), 8).unwrap();
        assert_eq!(judge_on(&expected(&inputs), &inputs, Algorithm::Hierarchical, &one, Wire::Exact).inexact, 0);
    }

    #[test]
    fn a_lossy_ce_ring_is_held_to_its_quantised_arithmetic_and_bound() {
        let inputs = all_inputs::<half::bf16>(7, 8, 4, 3000);
        for wire in [Wire::Fp8, Wire::Int8] {
            let good = ce_wire::expected(&inputs, wire);
            let o = judge_on(&good, &inputs, Algorithm::CeRing, &[], wire);
            assert_eq!((o.wrong, o.inexact), (0, 0), "{wire}");
            // The exact rank-order sum is not what a lossy wire gives: bits differ, in bound.
            let o = judge_on(&expected(&inputs), &inputs, Algorithm::CeRing, &[], wire);
            assert!(o.inexact > 0 && o.wrong == 0, "{wire}: {o:?}");
            // A value off by a rank's whole magnitude is wrong.
            let mut bad = good.clone();
            bad[10] = half::bf16::from_f32(bad[10].to_f32() + 6.0);
            assert_eq!(judge_on(&bad, &inputs, Algorithm::CeRing, &[], wire).wrong, 1, "{wire}");
        }
        // Exact wire: ce-ring is held to the rank-order sum like every tpar algorithm.
        let o = judge_on(&ce_wire::expected(&inputs, Wire::Fp8), &inputs, Algorithm::CeRing, &[], Wire::Exact);
        assert!(o.inexact > 0);
    }
}
