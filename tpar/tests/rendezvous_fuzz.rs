//! Fuzzing the rendezvous with proptest, in CI, for a bounded time (a few seconds on 2
//! cores; `PROPTEST_CASES=N` runs N cases per target for a longer campaign).
//!
//! Three targets, all over the real code:
//! - rank 0 over real sockets: arbitrary bytes and mutated valid Hello frames from up to
//!   three connections (sent whole or in pieces, then closed or held open), then a
//!   well-behaved rank 1. Rank 0 must not panic, the job must form and all-reduce
//!   correctly, and nothing may be left behind.
//! - a joining rank over real sockets: a stand-in rank 0 answers its Hello with arbitrary
//!   or mutated valid Welcome / Reject / Go frames built on real segments. The joining rank
//!   must return (an error, or a working communicator when the mutation was harmless), never
//!   panic or outlive its deadline, and its error must be short and printable.
//! - the parsers alone: frame headers, Hellos, Rejects and the CPU workspace's welcome
//!   (mutated against a real segment), many more cases.
//!
//! Every target also checks that the process holds no more file descriptors afterwards.

mod common;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestRunner};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;
use tpar::rendezvous::wire::{parse_header, Reject, HEADER_LEN};
use tpar::rendezvous::{encode_frame, DataPlane, Hello, JoinSpec, Kind};
use tpar::transport::shm::{leftover_segments, ShmSegment};
use tpar::comm::shm_workspace::ShmWorkspace;
use tpar::{CpuCommunicator, Error};

/// One target at a time: the descriptor count is per process.
static SERIAL: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(PropConfig { cases: cases(default_cases), failure_persistence: None, ..PropConfig::default() })
}

/// Bytes to send: arbitrary, or `base` mutated (bytes set, bits flipped, cut, extended).
fn mutated(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let arbitrary = prop::collection::vec(any::<u8>(), 0..96);
    let edits = (
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 0..4),
        prop::option::of(any::<prop::sample::Index>()),
        prop::collection::vec(any::<u8>(), 0..6),
    );
    let mutant = edits.prop_map(move |(sets, cut, tail)| {
        let mut v = base.clone();
        for (at, b, flip) in sets {
            let i = at.index(v.len());
            v[i] = if flip { v[i] ^ (1 << (b % 8)) } else { b };
        }
        if let Some(c) = cut {
            v.truncate(c.index(v.len() + 1));
        }
        v.extend(tail);
        v
    });
    // A valid header declaring some length, with whatever follows.
    let header = (1u16..=7, prop::sample::select(vec![0u32, 1, 20, 32, 33, 1024, 4096, 16 << 20, u32::MAX]), prop::collection::vec(any::<u8>(), 0..40))
        .prop_map(|(kind, len, body)| {
            let mut v = encode_frame(Kind::Go, &[]);
            v[6..8].copy_from_slice(&kind.to_le_bytes());
            v[8..12].copy_from_slice(&len.to_le_bytes());
            v.extend(body);
            v
        });
    prop_oneof![2 => arbitrary, 5 => mutant, 2 => header]
}

/// A value for one of the CPU welcome's size fields (bytes, cap, first epoch): the edges
/// the fuzzing campaign found, near misses of the real values, or anything.
fn size_edit() -> impl Strategy<Value = Option<(usize, u64)>> {
    let interesting = prop::sample::select(vec![0u64, 1, 7, 8, 1023, 1024, 1025, 1 << 37, 1 << 62, u64::MAX, u64::MAX - 7, 1 << 40]);
    prop::option::weighted(0.7, (0usize..3, prop_oneof![interesting, any::<u64>(), (-64i64..64).prop_map(|d| d as u64)]))
}

/// Applies a size edit to the data plane's welcome bytes at `at` (a relative edit when
/// the value is small: a near miss of the real field).
fn apply_size(w: &mut [u8], at: usize, edit: Option<(usize, u64)>) {
    let Some((field, v)) = edit else { return };
    let (off, width) = [(0, 8), (8, 8), (16, 4)][field];
    let Some(slot) = w.get_mut(at + off..at + off + width) else { return };
    let mut cur = [0u8; 8];
    cur[..width].copy_from_slice(slot);
    let cur = u64::from_le_bytes(cur);
    let new = if (v as i64).unsigned_abs() < 64 { cur.wrapping_add(v) } else { v };
    slot.copy_from_slice(&new.to_le_bytes()[..width]);
}

/// How one hostile connection behaves.
#[derive(Clone, Debug)]
struct Peer {
    bytes: Vec<u8>,
    /// Send in two writes, split here, with a pause between.
    split: Option<prop::sample::Index>,
    /// Keep the connection open (silent) instead of hanging up.
    hold: bool,
}

fn peer(base: Vec<u8>) -> impl Strategy<Value = Peer> {
    (mutated(base), prop::option::of(any::<prop::sample::Index>()), any::<bool>()).prop_map(|(bytes, split, hold)| Peer { bytes, split, hold })
}

/// Whether `bytes` begin with a Hello that rank 0 would accept for rank 1 (the test's own
/// reading of the wire format, so that an accepted claim is never mistaken for a bug).
fn acceptable_claim(bytes: &[u8], job_id: u64, fingerprint: u64) -> bool {
    let good_header = encode_frame(Kind::Hello, &[0u8; 32]);
    bytes.len() >= 44
        && bytes[..HEADER_LEN] == good_header[..HEADER_LEN]
        && bytes[12..20] == job_id.to_le_bytes()
        && bytes[20..24] == 2u32.to_le_bytes()
        && bytes[24..28] == 1u32.to_le_bytes()
        && bytes[36..44] == fingerprint.to_le_bytes()
}

fn the_fingerprint() -> u64 {
    tpar::plan::plan_fingerprint(&tpar::Topology::cpu(), None, &tpar::Overrides::default())
}

#[test]
fn rank0_survives_hostile_frames_and_still_forms_the_job() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fds = open_fds();
    let fingerprint = the_fingerprint();
    let base = encode_frame(Kind::Hello, &Hello { job_id: 0, world: 2, rank: 1, pid: 7, fingerprint }.encode());
    let mut run = runner(400);
    let result = run.run(&prop::collection::vec(peer(base), 1..4), |peers| {
        let path = rdzv_path("fuzz0");
        let job_id = config(0, 2, &path).job_id;
        let p0 = path.clone();
        let host = std::thread::spawn(move || {
            let mut c = config(0, 2, &p0);
            c.shm_budget = 1 << 16;
            let mut comm = CpuCommunicator::init(&c)?;
            let mut out = [0f32; 5];
            comm.all_reduce(&[1.0, 2.0, 3.0, 4.0, 5.0], &mut out)?;
            Ok::<_, Error>(out)
        });
        let mut held = Vec::new();
        for p in &peers {
            let mut bytes = p.bytes.clone();
            if bytes.len() >= 20 {
                bytes[12..20].copy_from_slice(&job_id.to_le_bytes()); // the job's own id, so the rest decides
            }
            if acceptable_claim(&bytes, job_id, fingerprint) {
                bytes[12] ^= 1; // a whole valid claim would be a real rank 1, not a hostile peer
            }
            let mut s = loop {
                match UnixStream::connect(&path) {
                    Ok(s) => break s,
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            };
            let cut = p.split.map_or(bytes.len(), |i| i.index(bytes.len() + 1));
            let _ = s.write_all(&bytes[..cut]);
            if cut < bytes.len() {
                std::thread::sleep(Duration::from_millis(2));
                let _ = s.write_all(&bytes[cut..]);
            }
            if p.hold {
                held.push(s);
            }
        }
        let mut c = config(1, 2, &path);
        c.timeout = Duration::from_secs(20);
        let joined = CpuCommunicator::init(&c).and_then(|mut comm| {
            let mut out = [0f32; 5];
            comm.all_reduce(&[1.0, 2.0, 3.0, 4.0, 5.0], &mut out).map(|_| out)
        });
        let host = host.join().map_err(|_| TestCaseError::fail("rank 0 panicked"))?;
        drop(held);
        prop_assert_eq!(host.map_err(|e| TestCaseError::fail(format!("rank 0: {e}")))?, [2.0, 4.0, 6.0, 8.0, 10.0]);
        prop_assert_eq!(joined.map_err(|e| TestCaseError::fail(format!("rank 1: {e}")))?, [2.0, 4.0, 6.0, 8.0, 10.0]);
        let job = format!("{job_id:016x}");
        prop_assert!(leftover_segments(&job).is_empty());
        prop_assert!(!path.exists());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(open_fds(), fds, "file descriptors leaked");
}

/// Real segments and the genuine welcome a rank 0 of `job_id` would send.
struct Host {
    _live: ShmSegment,
    _data: ShmWorkspace,
    welcome: Vec<u8>,
}

fn real_host(path: &Path, job_id: u64) -> Host {
    let tag = format!("{job_id:016x}-{}-{}", std::process::id(), rand_u32());
    let live = ShmSegment::create(&format!("/tpar-{tag}-live"), 4096, 0).unwrap();
    let spec = JoinSpec { shm_budget: 1 << 16, ..config(0, 2, path).join_spec() };
    let (data, payload) = ShmWorkspace::create(&spec).unwrap();
    let mut welcome = Vec::new();
    welcome.extend_from_slice(&(live.name().len() as u16).to_le_bytes());
    welcome.extend_from_slice(live.name().as_bytes());
    welcome.extend_from_slice(&payload);
    Host { _live: live, _data: data, welcome }
}

#[derive(Clone, Debug)]
struct Answer {
    kind: u16,
    payload: Vec<u8>,
    /// A Go after the peer's Attached (when it gets that far).
    then_go: bool,
}

fn answer() -> impl Strategy<Value = Answer> {
    // The payload is mutated from the genuine welcome later (it is per case), so the
    // strategy yields edits as a stand-in payload: kind 2 with `payload` empty means "the
    // real welcome, mutated by the other fields".
    (prop::sample::select(vec![2u16, 2, 2, 3, 5, 6, 9]), mutated(vec![0; 8]), any::<bool>()).prop_map(|(kind, payload, then_go)| Answer { kind, payload, then_go })
}

#[test]
fn a_joining_rank_survives_a_hostile_rank0() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fds = open_fds();
    let mut run = runner(400);
    let edits = (
        answer(),
        size_edit(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        prop::option::weighted(0.2, any::<prop::sample::Index>()),
    );
    let result = run.run(&edits, |(ans, size, sets, cut)| {
        let path = rdzv_path("fuzz1");
        let job_id = config(0, 2, &path).job_id;
        let host = real_host(&path, job_id);
        let payload = if ans.kind == 2 {
            // The genuine welcome with a size changed, a few bytes set, perhaps cut short.
            let mut w = host.welcome.clone();
            let name_len = u16::from_le_bytes([w[0], w[1]]) as usize;
            apply_size(&mut w, 2 + name_len, size);
            for (at, b) in sets {
                let i = at.index(w.len());
                w[i] = b;
            }
            if let Some(c) = cut {
                w.truncate(c.index(w.len() + 1));
            }
            w
        } else {
            ans.payload.clone()
        };
        let mut frame = encode_frame(Kind::Go, &payload);
        frame[6..8].copy_from_slice(&ans.kind.to_le_bytes());
        let listener = UnixListener::bind(&path).unwrap();
        let then_go = ans.then_go;
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut hello = [0u8; 44];
            if s.read_exact(&mut hello).is_err() {
                return;
            }
            let _ = s.write_all(&frame);
            let mut attached = [0u8; HEADER_LEN];
            if then_go && s.read_exact(&mut attached).is_ok() {
                let _ = s.write_all(&encode_frame(Kind::Go, &[]));
            }
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = [0u8; 64];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let p1 = path.clone();
        let guest = std::thread::spawn(move || {
            let mut c = config(1, 2, &p1);
            c.timeout = Duration::from_millis(500);
            let _ = tx.send(CpuCommunicator::init(&c).map(|_| ()));
        });
        // The joining rank's deadline is 0.5 s; 30 s only catches a hang.
        let outcome = rx.recv_timeout(Duration::from_secs(30)).map_err(|_| TestCaseError::fail("the joining rank panicked or hung"))?;
        guest.join().map_err(|_| TestCaseError::fail("the joining rank panicked"))?;
        fake.join().map_err(|_| TestCaseError::fail("the stand-in rank 0 panicked"))?;
        if let Err(e) = outcome {
            let text = e.to_string();
            prop_assert!(text.len() < 2048, "{} bytes: {}", text.len(), text);
            prop_assert!(!text.chars().any(|c| c.is_control()), "{:?}", text);
        }
        drop(host);
        let job = format!("{job_id:016x}");
        prop_assert!(leftover_segments(&job).is_empty());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(open_fds(), fds, "file descriptors leaked");
}

/// A rank 0 that answers with the genuine welcome one byte every 100 ms: each read succeeds,
/// so a timeout renewed per read would never fire (the welcome would take ~10 s, and the Go
/// after it as long). The joining rank's one deadline (0.5 s) must end the join, as a
/// timeout, within the deadline and a margin far below the trickle's length.
#[test]
fn a_joining_rank_meets_its_deadline_against_a_trickling_rank0() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fds = open_fds();
    let path = rdzv_path("trickle");
    let job_id = config(0, 2, &path).job_id;
    let host = real_host(&path, job_id);
    let welcome = encode_frame(Kind::Welcome, &host.welcome);
    assert!(welcome.len() > 40, "a welcome long enough to trickle for seconds");
    let listener = UnixListener::bind(&path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 44];
        if s.read_exact(&mut hello).is_err() {
            return 0;
        }
        let mut sent = 0;
        for b in welcome.iter().chain(encode_frame(Kind::Go, &[]).iter()) {
            if stop2.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        sent
    });
    const DEADLINE: Duration = Duration::from_millis(500);
    let mut c = config(1, 2, &path);
    c.timeout = DEADLINE;
    let t = std::time::Instant::now();
    let joined = CpuCommunicator::init(&c);
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = fake.join().unwrap();
    let Err(e) = joined else { panic!("a welcome trickled over seconds cannot arrive within 0.5 s") };
    assert!(matches!(e, Error::Timeout { rank: 1, .. }), "a timeout, not {e}");
    assert!(sent >= 2, "the stand-in trickled ({sent} bytes): else this test proves nothing");
    // The deadline plus a margin for a loaded machine; the trickle lasts ~10 s.
    assert!(took < DEADLINE + Duration::from_millis(1000), "the join outlived its deadline: {took:?} ({e})");
    drop(host);
    assert!(leftover_segments(&format!("{job_id:016x}")).is_empty());
    assert_eq!(open_fds(), fds, "file descriptors leaked");
}

#[test]
fn parsers_refuse_without_panicking() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fds = open_fds();
    let mut run = runner(10000);
    let result = run.run(&(prop::array::uniform12(any::<u8>()), prop::collection::vec(any::<u8>(), 0..3000)), |(h, body)| {
        if let Ok((kind, len)) = parse_header(&h, 0) {
            prop_assert!(len as u32 <= tpar::rendezvous::wire::max_payload(kind));
        }
        let _ = Hello::decode(&body, 0);
        let r = Reject::decode(&body);
        for part in [&r.field, &r.expected, &r.got] {
            prop_assert!(!part.chars().any(|c| c.is_control()));
            prop_assert!(part.chars().count() <= tpar::rendezvous::wire::MAX_TEXT + 32);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }

    // The CPU workspace's welcome, mutated against a real segment: refused or attached,
    // never a panic or an absurd allocation.
    let path = rdzv_path("fuzzw");
    let host = real_host(&path, config(0, 2, &path).job_id);
    let name_len = u16::from_le_bytes([host.welcome[0], host.welcome[1]]) as usize;
    let genuine = host.welcome[2 + name_len..].to_vec();
    let spec = config(1, 2, &path).join_spec();
    let attached = ShmWorkspace::attach(&spec, &genuine);
    assert!(attached.is_ok(), "the genuine welcome attaches: {:?}", attached.err());
    drop(attached);
    let mut run = runner(4000);
    let result = run.run(&(size_edit(), mutated(genuine.clone()), any::<bool>()), |(size, mutant, sizes_only)| {
        let mut w = if sizes_only { genuine.clone() } else { mutant };
        apply_size(&mut w, 0, size);
        match ShmWorkspace::attach(&spec, &w) {
            Ok(ws) => prop_assert!(ws.layout.bytes() == ws.shm.len()),
            Err(e) => prop_assert!(matches!(e, Error::Rendezvous { rank: 1, .. } | Error::Io { rank: 1, .. }), "{}", e),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    drop(host);
    assert_eq!(open_fds(), fds, "file descriptors leaked");
}
