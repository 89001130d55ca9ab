//! A CPU rank whose wait outlasts a time slice sleeps in a futex wait on the workspace's
//! doorbell instead of holding a core, and the peer's next stores wake it. Asleep, it still
//! ends its wait on every bound: a peer killed meanwhile is reported dead, and a peer that
//! never comes is a timeout. `CpuCommunicator::wait_stats` shows the sleeps and wake-ups, so
//! each test proves the wait went through the futex path, not around it. Ranks pinned to
//! one core see that they share it (and the higher one cannot move off it); pinned to two,
//! they never do.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tpar::testing::{all_inputs, bit_diffs, expected, poison};
use tpar::{Algorithm, CpuCommunicator, Error};

#[test]
fn a_late_peer_is_awaited_asleep_and_its_stores_wake_the_sleeper() {
    const CALLS: u64 = 6;
    let world = 2;
    let n = 64;
    let results = run_group(world, |c| c.timeout = Duration::from_secs(30), move |comm| {
        let rank = comm.rank();
        for call in 0..CALLS {
            if rank == 1 {
                // Late by 20 ms: far past a time slice, so rank 0 goes to sleep.
                std::thread::sleep(Duration::from_millis(20));
            }
            let ins = all_inputs::<f32>(23, call, world, n);
            let mut out = vec![0f32; n];
            poison(&mut out);
            let algo = if call % 2 == 0 { Algorithm::OneshotPush } else { Algorithm::OneshotPull };
            comm.all_reduce_with(algo, &ins[rank], &mut out).unwrap();
            assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "call {call} ({algo}) on rank {rank}");
        }
        comm.wait_stats()
    });
    let stats: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    // Rank 0 slept in every call (a 2 ms liveness period caps each sleep, so several per call).
    assert!(stats[0].sleeps >= CALLS, "rank 0 slept {} times in {CALLS} calls 20 ms late: {:?}", stats[0].sleeps, stats[0]);
    // Rank 1 found rank 0 announced as sleeping after its stores and rang: at least once per
    // call (a wake-up lost between the announcement and the sleep would leave this short).
    assert!(stats[1].wakes >= CALLS, "rank 1 woke its sleeping peer {} times in {CALLS} calls: {:?}", stats[1].wakes, stats[1]);
}

#[test]
fn a_peer_that_never_calls_ends_the_sleeping_wait_by_its_timeout() {
    // Rank 1 joins, then never calls, and stays alive until rank 0 has its error: only the
    // timeout can end rank 0's wait, which it spends asleep.
    const TIMEOUT: Duration = Duration::from_millis(400);
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let d = done.clone();
    let results = run_group(2, |c| c.timeout = TIMEOUT, move |comm| {
        let (lock, cv) = &*d;
        if comm.rank() == 1 {
            let _ = cv.wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(60), |finished| !*finished).unwrap();
            return None;
        }
        let mut out = [0f32; 4];
        let t = Instant::now();
        let e = comm.all_reduce_with(Algorithm::OneshotPush, &[1.0; 4], &mut out).unwrap_err();
        let took = t.elapsed();
        *lock.lock().unwrap() = true;
        cv.notify_all();
        Some((e, took, comm.wait_stats()))
    });
    let (e, took, stats) = results.into_iter().next().unwrap().unwrap().unwrap();
    assert!(matches!(e, Error::Timeout { rank: 0, waited_ms, .. } if waited_ms >= 400), "{e}");
    // Asleep, the wait still ends at the deadline (a sleep never outlasts the next check);
    // seconds of slack for a loaded machine.
    assert!(took < TIMEOUT + Duration::from_secs(3), "the timeout fired after {took:?}");
    // 400 ms of waiting in sleeps of at most 2 ms each: well over a hundred.
    assert!(stats.sleeps >= 50, "rank 0 slept {} times in a 400 ms wait: {stats:?}", stats.sleeps);
}

const CHILD: &str = "CPU_FUTEX_TEST_CHILD";

/// This test binary again, running only [`child_rank`] as rank 1 of `path`'s job.
fn spawn_rank1(path: &std::path::Path, job: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{job:016x} {}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The child side: joins as rank 1, makes one call with rank 0, says READY, then waits to be
/// killed (it never makes a second call).
#[test]
fn child_rank() {
    let Ok(v) = std::env::var(CHILD) else { return };
    let (job, path) = v.split_once(' ').unwrap();
    let mut c = config(1, 2, std::path::Path::new(path));
    c.job_id = u64::from_str_radix(job, 16).unwrap();
    c.timeout = Duration::from_secs(60);
    let mut comm = CpuCommunicator::init(&c).unwrap();
    let mut out = [0f32; 16];
    comm.all_reduce_with(Algorithm::OneshotPush, &[2.0; 16], &mut out).unwrap();
    println!("READY");
    std::thread::sleep(Duration::from_secs(120));
    panic!("the parent should have killed this child");
}

#[test]
fn a_peer_killed_while_its_waiter_sleeps_is_reported_dead() {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let path = rdzv_path("futex-kill");
    let job = u64::from(rand_u32()) << 32 | u64::from(rand_u32());
    let mut child = spawn_rank1(&path, job);
    let mut c = config(0, 2, &path);
    c.job_id = job;
    c.timeout = TIMEOUT;
    let mut comm = CpuCommunicator::init(&c).unwrap();
    let mut out = [0f32; 16];
    comm.all_reduce_with(Algorithm::OneshotPush, &[1.0; 16], &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 3.0), "{out:?}");
    let stdout = child.stdout.take().unwrap();
    assert!(BufReader::new(stdout).lines().map_while(|l| l.ok()).any(|l| l.contains("READY")), "the child ended without saying READY");
    // Kill rank 1 once rank 0 is well into its sleeping wait (SIGKILL: no destructor runs).
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        child.kill().unwrap();
        child.wait().unwrap();
    });
    let t = Instant::now();
    let e = comm.all_reduce_with(Algorithm::OneshotPush, &[1.0; 16], &mut out).unwrap_err();
    let took = t.elapsed();
    killer.join().unwrap();
    let stats = comm.wait_stats();
    assert!(matches!(e, Error::PeerDied { rank: 0, peer: 1, .. }), "{e}");
    assert!(took < TIMEOUT / 4, "the death was reported after {took:?}: {e}");
    assert!(stats.sleeps >= 10, "rank 0 slept {} times in a wait of {took:?}: {stats:?}", stats.sleeps);
    drop(comm);
    let left = tpar::transport::shm::leftover_segments(&format!("{job:016x}"));
    assert!(left.is_empty(), "shared memory left behind: {left:?}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The cores this thread may run on.
fn allowed_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; pid 0 is this thread; the set lives on this frame.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: reads bits of a valid set.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pins this thread to `core` alone.
fn pin(core: usize) {
    // SAFETY: as in `allowed_cores`; `core` is below CPU_SETSIZE (it came from a set).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) }, 0, "pin to core {core}");
}

/// Two ranks pinned to one core see it (their waits yield after a few polls), and the higher
/// rank's move finds no other core to go to; pinned to two cores they never see a shared one.
#[test]
fn ranks_on_one_core_see_it_and_ranks_on_two_do_not() {
    let cores = allowed_cores();
    if cores.len() < 2 {
        common::skip("cpu_futex::ranks_on_one_core_see_it_and_ranks_on_two_do_not", "this process may run on fewer than 2 cores");
        return;
    }
    const CALLS: u64 = 300;
    let n = 16;
    for same in [true, false] {
        let cs = cores.clone();
        let results = run_group(2, |c| c.timeout = Duration::from_secs(30), move |comm| {
            let rank = comm.rank();
            // Pinned after the join: the ranks do not count as outnumbering the cores.
            pin(if same { cs[0] } else { cs[rank] });
            for call in 0..CALLS {
                let ins = all_inputs::<f32>(31, call, 2, n);
                let mut out = vec![0f32; n];
                poison(&mut out);
                comm.all_reduce_with(Algorithm::OneshotPush, &ins[rank], &mut out).unwrap();
                assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "call {call} on rank {rank}");
            }
            comm.wait_stats()
        });
        let stats: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
        if same {
            // On one core every call makes one rank wait for the other, which is off the core.
            let seen: u64 = stats.iter().map(|s| s.shared_core).sum();
            assert!(seen >= CALLS / 2, "two ranks pinned to one core saw it in {seen} pauses of {CALLS} calls: {stats:?}");
            assert_eq!(stats[1].moves, 0, "a rank pinned to one core cannot move: {stats:?}");
        } else {
            assert!(stats.iter().all(|s| s.shared_core == 0 && s.moves == 0), "ranks pinned to two cores saw a shared one: {stats:?}");
        }
    }
}
