//! What a CPU rank's wait costs when its peer is a little late. A check that a peer is alive
//! reads /proc (tens of microseconds on a busy machine); made at the first pause of every
//! call, it cost each call whose peer was a few microseconds late that much (8 B calls took
//! 25 us instead of under 1 us with other processes on the cores). The check now comes once
//! a wait has lasted its period (2 ms), so a late peer costs no read at all.
//!
//! Alone in its test binary: it counts the read system calls of the whole process
//! (/proc/self/io), which other tests running beside it would add to.

mod common;
use common::*;
use std::time::{Duration, Instant};
use tpar::testing::{all_inputs, bit_diffs, expected, poison};
use tpar::Algorithm;

/// Read system calls this process has made so far (`syscr` in /proc/self/io), if readable.
fn reads_so_far() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("syscr: "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_peer_a_little_late_costs_no_liveness_check_per_call() {
    if reads_so_far().is_none() {
        common::skip(
            "cpu_wait::a_peer_a_little_late_costs_no_liveness_check_per_call",
            "/proc/self/io is not readable here",
        );
        return;
    }
    const CALLS: u64 = 400;
    let world = 2;
    let n = 2; // 8 B of f32: a call that is all wait
    let results = run_group(
        world,
        |c| c.timeout = Duration::from_secs(30),
        move |comm| {
            let rank = comm.rank();
            let mut run = |call: u64| {
                let ins = all_inputs::<f32>(11, call, world, n);
                let mut out = vec![0f32; n];
                poison(&mut out);
                comm.all_reduce_with(Algorithm::OneshotPush, &ins[rank], &mut out)
                    .unwrap();
                assert_eq!(
                    bit_diffs(&out, &expected(&ins)),
                    0,
                    "call {call} on rank {rank}"
                );
            };
            run(0); // both ranks are past their setup from here on
            let before = reads_so_far();
            let t0 = Instant::now();
            for call in 1..=CALLS {
                if rank == 1 {
                    // Late by 50 us, far past rank 0's spin (a few microseconds) and far short of
                    // the liveness period: rank 0 pauses in every call.
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(50) {
                        std::hint::spin_loop();
                    }
                }
                run(call);
            }
            let after = reads_so_far();
            let elapsed = t0.elapsed();
            run(CALLS + 1);
            before.zip(after).map(|(b, a)| (a - b, elapsed))
        },
    );
    let (reads, elapsed) = results
        .into_iter()
        .map(|r| r.unwrap())
        .next()
        .flatten()
        .expect("rank 0 read /proc/self/io");
    // A check per call reads /proc/PID/stat at least twice a call: 800+ here. A check per
    // period (2 ms of one wait) may still come where the machine stalls a rank for that long
    // (a loaded 2-core machine: the wall time below says how often it could have), at most
    // one a period of the loop's wall time, a few reads each. The bound is at least half of
    // what a check per call costs (123 reads in 68 ms were seen on a loaded 2-core clone,
    // above a bound of 3 reads a period), so only a check per call crosses it.
    const READS_PER_CHECK: u64 = 3;
    let periods = (elapsed.as_micros() / 2000) as u64;
    let allowed = CALLS.max(READS_PER_CHECK * periods + READS_PER_CHECK);
    if allowed >= 2 * CALLS {
        common::skip(
            "cpu_wait::a_peer_a_little_late_costs_no_liveness_check_per_call",
            &format!("the machine stalled the ranks: {CALLS} calls took {elapsed:?}, so per-period checks could reach what a check per call costs ({reads} reads); nothing to judge"),
        );
        return;
    }
    assert!(reads < allowed, "{reads} read system calls in {CALLS} calls whose peer was 50 us late ({elapsed:?}, at most {allowed} for one check a 2 ms period): a liveness check per call");
}
