//! Long sequences across epoch wrap-around, and every way a job can be wrong: each must be a
//! clear error naming the rank and field, never a panic, a hang or garbage.

mod common;
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tpar::rendezvous::{encode_frame, Hello, Kind};
use tpar::testing::{all_inputs, bit_diffs, expected, poison, SplitMix};
use tpar::{bf16, f16, Algorithm, CpuCommunicator, Config, Error};

#[test]
fn ten_thousand_calls_of_changing_sizes_cross_epoch_wrap() {
    let world = 4;
    let start = u32::MAX - 4000;
    let results = run_group(world, move |c| c.first_epoch = start, move |comm| {
        assert_eq!(comm.epoch(), start);
        let mut g = SplitMix::new(99); // same sequence on every rank
        let mut checked = 0usize;
        for call in 0..10_000u64 {
            let n = g.below(600) as usize;
            let cpu = tpar::algorithms::registry::algorithms_on(tpar::Backend::Cpu);
            let algo = cpu[g.below(cpu.len() as u64) as usize];
            match g.below(3) {
                0 => {
                    let ins = all_inputs::<f32>(5, call, world, n);
                    let mut out = vec![0f32; n];
                    poison(&mut out);
                    comm.all_reduce_with(algo, &ins[comm.rank()], &mut out).unwrap();
                    assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "call {call} {algo} n={n}");
                }
                1 => {
                    let ins = all_inputs::<f16>(5, call, world, n);
                    let mut out = vec![f16::ZERO; n];
                    poison(&mut out);
                    comm.all_reduce_with(algo, &ins[comm.rank()], &mut out).unwrap();
                    assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "call {call} {algo} n={n}");
                }
                _ => {
                    let ins = all_inputs::<bf16>(5, call, world, n);
                    let mut out = vec![bf16::ZERO; n];
                    poison(&mut out);
                    comm.all_reduce_with(algo, &ins[comm.rank()], &mut out).unwrap();
                    assert_eq!(bit_diffs(&out, &expected(&ins)), 0, "call {call} {algo} n={n}");
                }
            }
            checked += 1;
        }
        (checked, comm.epoch())
    });
    for r in results {
        let (checked, epoch) = r.unwrap();
        assert_eq!(checked, 10_000);
        assert!(epoch < start, "epoch must have wrapped past u32::MAX (now {epoch})");
    }
}

#[test]
fn mismatched_count_or_dtype_is_an_error_naming_the_field() {
    for algo in [Algorithm::OneshotPush, Algorithm::TwoshotPush, Algorithm::OneshotPull] {
        let results = run_group(2, |c| c.timeout = Duration::from_secs(5), move |comm| {
            let n = 10 + comm.rank();
            let input = vec![1f32; n];
            let mut out = vec![0f32; n];
            let first = comm.all_reduce_with(algo, &input, &mut out);
            let second = comm.all_reduce_with(algo, &input, &mut out);
            (first, second)
        });
        let mut named = false;
        for r in results {
            let (first, second) = r.unwrap();
            let e = first.expect_err("a count mismatch must fail");
            if let Error::Mismatch { field, .. } = &e {
                named |= field.contains("count") || field.contains("descriptor");
            }
            assert!(matches!(e, Error::Mismatch { .. } | Error::Aborted { .. }), "{algo}: {e}");
            assert!(matches!(second, Err(Error::Poisoned { .. })), "{algo}: after an error the communicator is poisoned");
        }
        assert!(named, "{algo}: some rank must name the field");
    }
    let results = run_group(3, |c| c.timeout = Duration::from_secs(5), |comm| {
        if comm.rank() == 1 {
            let mut out = vec![f16::ZERO; 8];
            comm.all_reduce_with(Algorithm::OneshotPush, &[f16::ONE; 8], &mut out)
        } else {
            let mut out = vec![bf16::ZERO; 8];
            comm.all_reduce_with(Algorithm::OneshotPush, &[bf16::ONE; 8], &mut out)
        }
    });
    let msgs: Vec<String> = results.into_iter().map(|r| r.unwrap().unwrap_err().to_string()).collect();
    assert!(msgs.iter().any(|m| m.contains("`dtype`") && m.contains("half") && m.contains("bfloat16")), "{msgs:?}");
}

#[test]
fn bad_world_and_rank_are_refused_before_any_io() {
    let p = rdzv_path("bad");
    for world in [0usize, 1, 17] {
        let e = CpuCommunicator::init(&Config::new(0, world, p.clone())).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "world", .. }), "world {world}: {e}");
    }
    let e = CpuCommunicator::init(&Config::new(4, 4, p.clone())).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { field: "rank", .. }), "{e}");
    assert!(!p.exists(), "nothing may be created for a refused config");
}

#[test]
fn two_ranks_claiming_one_rank() {
    let path = rdzv_path("dup");
    let handles: Vec<_> = [0usize, 1, 1]
        .into_iter()
        .map(|r| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c = config(r, 3, &path);
                c.timeout = Duration::from_millis(1500);
                CpuCommunicator::init(&c).map(|_| ())
            })
        })
        .collect();
    let errs: Vec<Error> = handles.into_iter().map(|h| h.join().unwrap().unwrap_err()).collect();
    let refused = errs.iter().filter(|e| matches!(e, Error::Rendezvous { field: "rank", .. })).count();
    assert_eq!(refused, 1, "exactly one duplicate is refused: {errs:?}");
    let host = errs[0].to_string();
    assert!(host.contains("ranks [2]") && host.contains("already claimed"), "rank 0 explains: {host}");
}

#[test]
fn stale_job_id_and_plan_fingerprint_are_refused() {
    for (field, tweak) in [
        ("job_id", Box::new(|c: &mut Config| c.job_id ^= 1) as Box<dyn Fn(&mut Config) + Send + Sync>),
        ("plan fingerprint (topology, profile, overrides)", Box::new(|c: &mut Config| c.fingerprint = 42)),
    ] {
        let path = rdzv_path("job");
        let p0 = path.clone();
        let host = std::thread::spawn(move || {
            let mut c = config(0, 2, &p0);
            c.timeout = Duration::from_millis(800);
            CpuCommunicator::init(&c).map(|_| ())
        });
        let mut c = config(1, 2, &path);
        tweak(&mut c);
        let e = CpuCommunicator::init(&c).unwrap_err();
        assert!(matches!(&e, Error::Rendezvous { field: f, rank: 1, .. } if *f == field), "{e}");
        let e0 = host.join().unwrap().unwrap_err();
        assert!(e0.to_string().contains(field), "rank 0's timeout names the refusal: {e0}");
    }
}

#[test]
fn garbled_and_truncated_messages_are_refused_and_the_job_still_forms() {
    let path = rdzv_path("garble");
    let p0 = path.clone();
    let host = std::thread::spawn(move || {
        let mut c = config(0, 2, &p0);
        c.timeout = Duration::from_secs(10);
        let mut comm = CpuCommunicator::init(&c)?;
        let mut out = [0f32; 3];
        comm.all_reduce(&[1.0, 2.0, 3.0], &mut out)?;
        Ok::<_, Error>(out)
    });
    let connect = || loop {
        if let Ok(s) = UnixStream::connect(&path) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let reply = |mut s: UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut v = vec![];
        let _ = s.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    };
    // Garbage bytes.
    let mut s = connect();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(reply(s).contains("magic"));
    // A well-formed frame with a truncated Hello.
    let mut s = connect();
    let hello = Hello { job_id: 1, world: 2, rank: 1, pid: 1, fingerprint: 0 }.encode();
    s.write_all(&encode_frame(Kind::Hello, &hello[..20])).unwrap();
    assert!(reply(s).contains("hello length"));
    // A frame cut off mid-header.
    let mut s = connect();
    s.write_all(&encode_frame(Kind::Hello, &hello)[..7]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(reply(s).contains("frame header"));
    // Then the real rank 1.
    let mut comm = CpuCommunicator::init(&config(1, 2, &path)).unwrap();
    let mut out = [0f32; 3];
    comm.all_reduce(&[1.0, 2.0, 3.0], &mut out).unwrap();
    assert_eq!(out, [2.0, 4.0, 6.0]);
    assert_eq!(host.join().unwrap().unwrap(), [2.0, 4.0, 6.0]);
}

#[test]
fn a_peer_that_never_arrives_is_a_timeout_and_poisons() {
    // Rank 1 joins, then never calls, and stays alive until rank 0 has its error: rank 0 can
    // only end by its timeout (a departed peer would be PeerDied instead), so the error's
    // kind proves the wait was bounded, without a wall-clock bound racing a busy machine.
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let d = done.clone();
    let results = run_group(2, |c| c.timeout = Duration::from_millis(700), move |comm| {
        let (lock, cv) = &*d;
        if comm.rank() == 1 {
            // At most a minute: the test fails on rank 0's error kind if rank 1 leaves first.
            let _ = cv.wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(60), |finished| !*finished).unwrap();
            return (None, None);
        }
        let mut out = [0f32; 4];
        let e = comm.all_reduce_with(Algorithm::OneshotPull, &[1.0; 4], &mut out).unwrap_err();
        let again = comm.all_reduce(&[1.0; 4], &mut out).unwrap_err();
        *lock.lock().unwrap() = true;
        cv.notify_all();
        (Some(e), Some(again))
    });
    let (e, again) = results.into_iter().next().unwrap().unwrap();
    let e = e.unwrap();
    assert!(matches!(e, Error::Timeout { rank: 0, waited_ms, .. } if waited_ms >= 700), "{e}");
    assert!(e.to_string().contains("barrier 0") && e.to_string().contains("rank 1"), "{e}");
    assert!(matches!(again.unwrap(), Error::Poisoned { .. }));
}

#[test]
fn a_peer_that_leaves_is_reported_as_dead_long_before_the_timeout() {
    // Only liveness can end this wait early: a survivor that waited for its timeout would
    // get Timeout after 20 s. So the error's kind proves the check: some survivor sees
    // PeerDied naming rank 2, and a survivor that reports Aborted was aborted by one that
    // saw the death. The bound (5 s, a quarter of the timeout) keeps the report prompt
    // with seconds of slack for a loaded machine (the check runs every few milliseconds).
    const TIMEOUT: Duration = Duration::from_secs(20);
    let results = run_group(3, |c| c.timeout = TIMEOUT, |comm| {
        let mut out = [0f32; 64];
        comm.all_reduce(&[1.0; 64], &mut out).unwrap();
        if comm.rank() == 2 {
            return None; // drops the communicator: its liveness lock goes with it
        }
        let t = Instant::now();
        let e = comm.all_reduce(&[1.0; 64], &mut out).unwrap_err();
        Some((e, t.elapsed()))
    });
    let survivors: Vec<(Error, Duration)> = results.into_iter().take(2).map(|r| r.unwrap().unwrap()).collect();
    let saw_death: Vec<usize> = (0..2).filter(|&r| matches!(survivors[r].0, Error::PeerDied { peer: 2, .. })).collect();
    assert!(!saw_death.is_empty(), "no survivor reported rank 2's death: {:?}", survivors.iter().map(|s| s.0.to_string()).collect::<Vec<_>>());
    for (r, (e, took)) in survivors.iter().enumerate() {
        match e {
            Error::PeerDied { rank, peer: 2, .. } => assert_eq!(*rank, r, "{e}"),
            Error::Aborted { rank, by, .. } => {
                assert_eq!(*rank, r, "{e}");
                assert!(saw_death.contains(by), "rank {r} was aborted by rank {by}, which did not see the death: {e}");
            }
            other => panic!("rank {r}: expected PeerDied naming rank 2 (or an abort by a rank that saw it), got {other}"),
        }
        assert!(*took < TIMEOUT / 4, "rank {r} took {took:?}: {e}");
    }
}

#[test]
fn local_argument_errors_do_not_poison() {
    let results = run_group(2, |_| {}, |comm| {
        let mut out = [0f32; 3];
        let e = comm.all_reduce(&[1.0; 4], &mut out).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "output", .. }), "{e}");
        let e = comm.all_reduce_with(Algorithm::StagedPush, &[1.0; 3], &mut out).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        comm.all_reduce(&[1.0; 3], &mut out).unwrap();
        out
    });
    for r in results {
        assert_eq!(r.unwrap(), [2.0; 3]);
    }
}

#[test]
fn the_plan_picks_and_overrides_force_and_ranks_must_agree() {
    // Default plan: one-shot push for small CPU messages, two-shot push for large ones.
    let results = run_group(2, |_| {}, |comm| {
        let small = comm.planned(tpar::DType::BF16, 128);
        let large = comm.planned(tpar::DType::BF16, 8 << 20);
        let mut out = [0f32; 5];
        comm.all_reduce(&[1.0; 5], &mut out).unwrap();
        (small, large, out)
    });
    for r in results {
        let (small, large, out) = r.unwrap();
        assert_eq!(small, Algorithm::OneshotPush);
        assert_eq!(large, Algorithm::TwoshotPush);
        assert_eq!(out, [2.0; 5]);
    }
    // TPAR_ALGO forces.
    let results = run_group(2, |c| c.overrides.algorithm = Some(Algorithm::TwoshotPull), |comm| {
        comm.planned(tpar::DType::F32, 64)
    });
    for r in results {
        assert_eq!(r.unwrap(), Algorithm::TwoshotPull);
    }
    // Forcing what the CPU backend cannot run is an error at init, before any rendezvous.
    let mut c = Config::new(0, 2, rdzv_path("force"));
    c.overrides.algorithm = Some(Algorithm::StagedPush);
    let e = CpuCommunicator::init(&c).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // Ranks with different overrides would plan differently: refused at rendezvous.
    let path = rdzv_path("agree");
    let p0 = path.clone();
    let host = std::thread::spawn(move || {
        let mut c = config(0, 2, &p0);
        c.timeout = Duration::from_millis(800);
        CpuCommunicator::init(&c).map(|_| ())
    });
    let mut c = config(1, 2, &path);
    c.overrides.algorithm = Some(Algorithm::OneshotPull);
    let e = CpuCommunicator::init(&c).unwrap_err();
    assert!(e.to_string().contains("plan fingerprint") && e.to_string().contains("rank 1"), "{e}");
    assert!(host.join().unwrap().is_err());
}

#[test]
fn control_plane_all_gather_and_broadcast() {
    let results = run_group(3, |_| {}, |comm| {
        let mine = vec![comm.rank() as u8; comm.rank() * 100 + 1];
        let all = comm.all_gather_bytes(&mine).unwrap();
        let b = comm.broadcast_bytes(if comm.rank() == 0 { b"from zero" } else { b"ignored" }).unwrap();
        (all, b)
    });
    for r in results {
        let (all, b) = r.unwrap();
        assert_eq!(all.len(), 3);
        for (k, p) in all.iter().enumerate() {
            assert_eq!(p, &vec![k as u8; k * 100 + 1]);
        }
        assert_eq!(b, b"from zero");
    }
}
