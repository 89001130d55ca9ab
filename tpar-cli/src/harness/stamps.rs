//! Where a call's time goes, from the kernels' own stamps (`TPAR_TEST_STAMPS=1`): thread 0
//! of each block writes `%globaltimer` at the kernel's phases (common.cuh `TPAR_STAMP`), the
//! bench clears them, runs the timed call once more and prints, per rank, the median over
//! its blocks of each phase's end minus the block's entry. For emulated ranks, which
//! profilers cannot take apart (each kernel spins on the others'); measuring only.

/// The phases a stamped kernel marks, after its entry (stamp 0): stamps 1..=4.
pub const PHASES: [&str; 4] = ["frame", "start barrier", "reduce", "end barrier / norm"];

/// A block's stamps if it stamped every phase in order (blocks a call did not launch keep the
/// zeros the bench cleared).
fn valid(s: &[u64; 8]) -> Option<&[u64]> {
    let p = &s[..=PHASES.len()];
    (p.iter().all(|&t| t != 0) && p.windows(2).all(|w| w[0] <= w[1])).then_some(p)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The lines the bench prints for one stamped call: a summary line, then one line per rank.
/// `ranks[r]` holds rank r's stamps, one array per block.
pub fn summary(label: &str, ranks: &[Vec<[u64; 8]>]) -> Vec<String> {
    let blocks: Vec<Vec<&[u64]>> = ranks.iter().map(|r| r.iter().filter_map(valid).collect()).collect();
    let all: Vec<&[u64]> = blocks.iter().flatten().copied().collect();
    let (Some(first), Some(last_entry), Some(last)) =
        (all.iter().map(|p| p[0]).min(), all.iter().map(|p| p[0]).max(), all.iter().map(|p| p[PHASES.len()]).max())
    else {
        return vec![format!("# stamps {label}: none (this kernel carries no stamps, or no block stamped every phase)")];
    };
    let mut out = vec![format!(
        "# stamps {label}: {} blocks on {} ranks; first entry to last stamp {} ns, entries spread over {} ns",
        all.len(),
        ranks.len(),
        last - first,
        last_entry - first
    )];
    for (r, b) in blocks.iter().enumerate() {
        let phases: Vec<String> = PHASES
            .iter()
            .enumerate()
            .map(|(k, name)| format!("{name} {}", median(b.iter().map(|p| p[k + 1] - p[0]).collect())))
            .collect();
        out.push(format!("# stamps {label} rank {r}: {} blocks, median ns from a block's entry: {}", b.len(), phases.join(", ")));
    }
    out
}

/// Reads every rank's stamps of `g` (after the caller cleared them and ran the call once
/// more) and prints [`summary`]'s lines.
#[cfg(feature = "cuda")]
pub fn report(g: &tpar::cuda::RankSet, label: &str) -> Result<(), String> {
    let stamps = (0..g.world()).map(|r| g.stamps(r)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    for line in summary(label, &stamps) {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(entry: u64, d: [u64; 4]) -> [u64; 8] {
        [entry, entry + d[0], entry + d[1], entry + d[2], entry + d[3], 0, 0, 0]
    }

    #[test]
    fn medians_per_rank_and_the_call_span() {
        let r0 = vec![block(1000, [10, 20, 30, 40]), block(1004, [12, 22, 32, 42]), block(1002, [14, 24, 34, 44])];
        let r1 = vec![block(1010, [100, 200, 300, 400])];
        let lines = summary("x", &[r0, r1]);
        assert_eq!(lines[0], "# stamps x: 4 blocks on 2 ranks; first entry to last stamp 410 ns, entries spread over 10 ns");
        assert_eq!(lines[1], "# stamps x rank 0: 3 blocks, median ns from a block's entry: frame 12, start barrier 22, reduce 32, end barrier / norm 42");
        assert_eq!(lines[2], "# stamps x rank 1: 1 blocks, median ns from a block's entry: frame 100, start barrier 200, reduce 300, end barrier / norm 400");
    }

    #[test]
    fn blocks_without_every_phase_in_order_are_left_out() {
        let cleared = [0u64; 8];
        let partial = [5, 6, 7, 0, 0, 0, 0, 0];
        let backwards = [50, 40, 60, 70, 80, 0, 0, 0];
        let good = block(100, [1, 2, 3, 4]);
        let lines = summary("y", &[vec![cleared, partial, backwards, good]]);
        assert!(lines[0].starts_with("# stamps y: 1 blocks on 1 ranks"), "{}", lines[0]);
        assert!(lines[1].contains("frame 1, start barrier 2, reduce 3, end barrier / norm 4"), "{}", lines[1]);
    }

    #[test]
    fn a_kernel_without_stamps_says_so() {
        let lines = summary("z", &[vec![[0u64; 8]; 4], vec![]]);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("none"), "{}", lines[0]);
    }
}
