//! Hierarchical: reduce inside each island (GPUs sharing a switch or a socket), then exchange
//! the island sums across islands once, so that each island's sum crosses the socket link
//! once per receiving rank and no rank's raw input crosses it at all.
//!
//! The protocol (kernel: `kernels/hierarchical.cu`; docs/cuda.md has the trips and buffers):
//!
//! 1. Inside island `c` (members in rank order, `m` of them): one-shot push. Every member
//!    writes its input into every mate's inbox, polls its own for its mates, and sums in
//!    rank order in f32, rounded once to the dtype: the island sum `S_c`, bitwise the same
//!    on every member.
//! 2. Across islands: the member at local index `l` of island `c` sends `S_c` to every
//!    member of every other island whose local index `l'` has `l' mod m == l`, into that
//!    receiver's inbox slot named by island `c`'s first rank. Every rank receives exactly one
//!    copy of every other island's sum ([`cross_sends`]).
//! 3. Every rank sums the island sums in island order (islands ordered by their first rank)
//!    in f32, rounded once: the output, bitwise identical on every rank. With one island the
//!    output is `S_c` itself: the rank-order sum, as one-shot push gives.
//!
//! Island sums travel in the dtype (16-bit dtypes: half the cross-socket bytes of f32
//! partials), so the output is rounded twice: [`reduce`] is the exact arithmetic, and
//! `testing::count_wrong_islands` the f64 bound that allows it.
//!
//! This file holds the island arithmetic the kernel's launcher, the simulator's schedule and
//! the verifier share ([`labels`], [`island_word`], [`cross_sends`], [`reduce`]), and the
//! schedule. The CPU backend does not run it (one socket: nothing to win).

use crate::error::{Error, Result};
use super::schedule::{FabricView, Flow, Op, Step, Sync, gpu, step, unsupported};
use crate::kinds::Algorithm;
use crate::kinds::Transport;

/// Islands normalised: members in rank order, islands ordered by their first rank, empty
/// ones and ranks >= `world` dropped. `Err` unless they partition `0..world` exactly.
pub fn normalize(islands: &[Vec<u32>], world: usize) -> Result<Vec<Vec<usize>>> {
    let mut v: Vec<Vec<usize>> = islands
        .iter()
        .map(|i| {
            let mut m: Vec<usize> = i.iter().map(|&g| g as usize).filter(|&g| g < world).collect();
            m.sort_unstable();
            m
        })
        .filter(|m| !m.is_empty())
        .collect();
    v.sort_by_key(|m| m[0]);
    let mut seen = vec![false; world];
    for &r in v.iter().flatten() {
        if std::mem::replace(&mut seen[r], true) {
            return Err(Error::invalid("islands", format!("rank {r} is in two islands")));
        }
    }
    if let Some(r) = seen.iter().position(|s| !s) {
        return Err(Error::invalid("islands", format!("rank {r} of {world} is in no island")));
    }
    Ok(v)
}

/// Per rank, its island's label: the island's first (smallest) rank. The kernel orders
/// islands by label and names the cross-island inbox slot by it.
pub fn labels(islands: &[Vec<u32>], world: usize) -> Result<Vec<u32>> {
    let mut out = vec![0u32; world];
    for isl in normalize(islands, world)? {
        for &r in &isl {
            out[r] = isl[0] as u32;
        }
    }
    Ok(out)
}

/// The kernel's `TparArgs::islands`: 4 bits per rank, rank q's label at bits 4q..4q+3.
/// 0 (every rank labelled 0) is one island. `Err` for more than 16 ranks or islands that do
/// not partition the ranks.
pub fn island_word(islands: &[Vec<u32>], world: usize) -> Result<u64> {
    if world > 16 {
        return Err(Error::invalid("islands", format!("{world} ranks: the kernel's island word holds 16")));
    }
    Ok(labels(islands, world)?.iter().enumerate().fold(0u64, |w, (q, &l)| w | (u64::from(l) << (4 * q))))
}

/// Islands given as sizes in rank order ("3+5": ranks 0..2, then 3..7).
pub fn from_sizes(sizes: &[usize]) -> Vec<Vec<u32>> {
    let mut next = 0u32;
    sizes
        .iter()
        .map(|&n| {
            let v: Vec<u32> = (next..next + n as u32).collect();
            next += n as u32;
            v
        })
        .collect()
}

/// The cross-island sends of step 2, `(sender, receiver)`: the member at local index `l` of
/// island A sends A's sum to the members of every other island B whose local index `l'` has
/// `l' mod |A| == l`. `islands` must be normalised ([`normalize`]).
pub fn cross_sends(islands: &[Vec<usize>]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (b, ib) in islands.iter().enumerate() {
        for (p, &j) in ib.iter().enumerate() {
            for (a, ia) in islands.iter().enumerate() {
                if a != b {
                    out.push((ia[p % ia.len()], j));
                }
            }
        }
    }
    out
}

/// The exact arithmetic of the kernel for one element: every island's sum in f32 in rank
/// order, rounded to the dtype by `round`; then, with two or more islands, the island sums
/// in island order in f32, rounded again. `x[r]` is rank r's element as f32.
pub fn reduce(x: &[f32], islands: &[Vec<usize>], round: impl Fn(f32) -> f32) -> f32 {
    // -0.0 is the additive identity (-0.0 + s == s): the first island sum enters unchanged.
    let mut total = -0.0f32;
    for isl in islands {
        let s = round(isl.iter().fold(-0.0f32, |acc, &r| acc + x[r]));
        if islands.len() == 1 {
            return s;
        }
        total += s;
    }
    round(total)
}

/// The communication schedule the simulator replays: all-to-all inside each island, then
/// the cross-island sends of [`cross_sends`] (one message of island sum per receiver).
pub(crate) fn schedule(s: f64, fabric: &dyn FabricView, islands: &[Vec<u32>]) -> Result<(Transport, Vec<Step>)> {
    if !fabric.all_p2p_write() {
        return Err(unsupported(Algorithm::Hierarchical, "it pushes peer to peer and this fabric has no P2P writes"));
    }
    let n = fabric.world();
    let islands = normalize(islands, n).map_err(|_| Error::invalid("islands", format!("islands do not cover the {n} ranks")))?;
    let write = |i: usize, j: usize| Flow { src: gpu(i), dst: gpu(j), bytes: s, op: Op::Write };
    let mut inside = Vec::new();
    for isl in &islands {
        for &i in isl {
            for &j in isl {
                if i != j {
                    inside.push(write(i, j));
                }
            }
        }
    }
    let mut steps = vec![step("reduce inside island", inside, Sync::Poll)];
    if islands.len() > 1 {
        let across = cross_sends(&islands).into_iter().map(|(i, j)| write(i, j)).collect();
        steps.push(step("exchange across islands", across, Sync::Poll));
    }
    Ok((Transport::P2p, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_split(world: usize) -> Vec<Vec<Vec<u32>>> {
        // Contiguous splits into 1..=3 islands, plus an interleaved one (even/odd ranks).
        let mut v = vec![from_sizes(&[world])];
        for a in 1..world {
            v.push(from_sizes(&[a, world - a]));
            for b in 1..world - a {
                v.push(from_sizes(&[a, b, world - a - b]));
            }
        }
        v.push(vec![(0..world as u32).step_by(2).collect(), (1..world as u32).step_by(2).collect()]);
        v.push((0..world as u32).map(|r| vec![r]).collect());
        v
    }

    #[test]
    fn every_rank_receives_each_other_island_once_and_each_island_crosses_once_per_receiver() {
        for world in 2..=16usize {
            for split in every_split(world) {
                let isl = normalize(&split, world).unwrap();
                let label = labels(&split, world).unwrap();
                let sends = cross_sends(&isl);
                for j in 0..world {
                    let from: Vec<u32> = sends.iter().filter(|s| s.1 == j).map(|s| label[s.0]).collect();
                    let mut want: Vec<u32> = isl.iter().map(|i| i[0] as u32).filter(|&l| l != label[j]).collect();
                    let mut got = from.clone();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "world {world} {split:?}: rank {j} receives one sum of every other island");
                }
                // No send stays inside an island; a sender of A sends to at most ceil(|B|/|A|)
                // members of each other island B.
                for &(i, j) in &sends {
                    assert_ne!(label[i], label[j]);
                }
                for ia in &isl {
                    for ib in &isl {
                        if ia[0] == ib[0] {
                            continue;
                        }
                        for &i in ia {
                            let k = sends.iter().filter(|s| s.0 == i && label[s.1] == ib[0] as u32).count();
                            assert!(k <= ib.len().div_ceil(ia.len()), "{split:?}: {i} sends {k} copies to island {}", ib[0]);
                        }
                    }
                }
                assert_eq!(sends.len(), world * (isl.len() - 1));
            }
        }
    }

    #[test]
    fn labels_and_word_name_each_islands_first_rank() {
        let isl = vec![vec![5, 4, 7], vec![1, 0], vec![2, 3, 6]];
        assert_eq!(labels(&isl, 8).unwrap(), vec![0, 0, 2, 2, 4, 4, 2, 4]);
        let w = island_word(&isl, 8).unwrap();
        for (q, l) in [0u64, 0, 2, 2, 4, 4, 2, 4].iter().enumerate() {
            assert_eq!((w >> (4 * q)) & 15, *l);
        }
        assert_eq!(island_word(&from_sizes(&[16]), 16).unwrap(), 0, "one island is the zero word");
        assert_eq!(island_word(&from_sizes(&[8, 8]), 16).unwrap() >> 60, 8);
        assert!(labels(&[vec![0, 1], vec![1, 2]], 3).is_err(), "overlap");
        assert!(labels(&[vec![0, 1]], 3).is_err(), "rank 2 in no island");
        assert!(island_word(&from_sizes(&[17]), 17).is_err());
        // Ranks past the world are dropped (the first `world` GPUs of a topology).
        assert_eq!(labels(&[vec![0, 1, 2, 3], vec![4, 5, 6, 7]], 5).unwrap(), vec![0, 0, 0, 0, 4]);
    }

    #[test]
    fn reduce_is_the_rank_order_sum_on_one_island_and_rounds_island_sums_otherwise() {
        let bf16 = |f: f32| half::bf16::from_f32(f).to_f32();
        let x = [1.0f32, 2f32.powi(-9), 2f32.powi(-9), 3.0];
        let one = normalize(&from_sizes(&[4]), 4).unwrap();
        assert_eq!(reduce(&x, &one, bf16), bf16(x.iter().fold(-0.0, |a, b| a + b)));
        // 1 + 2^-9 rounds to 1 in bf16 inside island {0,1}; the rank-order sum keeps both.
        let two = normalize(&from_sizes(&[2, 2]), 4).unwrap();
        assert_eq!(reduce(&x, &two, bf16), bf16(1.0 + bf16(2f32.powi(-9) + 3.0)));
        assert_eq!(reduce(&[-0.0, -0.0], &normalize(&from_sizes(&[1, 1]), 2).unwrap(), bf16).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn schedule_crosses_the_socket_link_once_per_receiver_and_island() {
        struct F(usize);
        impl FabricView for F {
            fn world(&self) -> usize { self.0 }
            fn socket(&self, a: usize) -> usize { usize::from(a >= self.0 / 2) }
            fn p2p_write(&self, _: usize, _: usize) -> bool { true }
            fn all_p2p_write(&self) -> bool { true }
            fn all_p2p_read(&self) -> bool { true }
            fn nccl_direct(&self, _: usize, _: usize) -> bool { true }
            fn nccl_wire_factor(&self) -> f64 { 1.0 }
        }
        let (_, steps) = schedule(1.0, &F(8), &from_sizes(&[4, 4])).unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].flows.len(), 2 * 4 * 3);
        assert_eq!(steps[1].flows.len(), 8, "each rank receives the other island's sum once");
        let (_, one) = schedule(1.0, &F(4), &from_sizes(&[4])).unwrap();
        assert_eq!(one.len(), 1, "one island: one-shot push, no exchange");
        assert!(schedule(1.0, &F(8), &from_sizes(&[4, 3])).is_err());
    }
}
