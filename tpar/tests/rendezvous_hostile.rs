//! The rendezvous under broken or hostile peers, over real sockets: a peer that trickles its
//! Hello, floods of silent or garbled connections, a rank 0 that sends absurd sizes or
//! escape sequences. Each must end in a clear, bounded error (or, for rank 0, in the job
//! forming without the bad peer), never a panic, a hang past the timeout, or a leak.

mod common;
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tpar::rendezvous::{encode_frame, Hello, Kind, MAX_LISTED, MAX_PENDING};
use tpar::transport::shm::{leftover_segments, ShmSegment};
use tpar::workspace::Layout;
use tpar::{CpuCommunicator, Error};

fn connect(path: &Path) -> UnixStream {
    let t = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(path) {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "rank 0 never listened at {}", path.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Rank 0 of a world of 2 with `timeout_ms`; on success it all-reduces [1, 2, 3] once.
fn rank0(path: &Path, timeout_ms: u64) -> JoinHandle<Result<[f32; 3], Error>> {
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let mut c = config(0, 2, &p);
        c.timeout = Duration::from_millis(timeout_ms);
        let mut comm = CpuCommunicator::init(&c)?;
        let mut out = [0f32; 3];
        comm.all_reduce(&[1.0, 2.0, 3.0], &mut out)?;
        Ok(out)
    })
}

fn rank1_joins(path: &Path, timeout_ms: u64) {
    let mut c = config(1, 2, path);
    c.timeout = Duration::from_millis(timeout_ms);
    let mut comm = CpuCommunicator::init(&c).unwrap();
    let mut out = [0f32; 3];
    comm.all_reduce(&[1.0, 2.0, 3.0], &mut out).unwrap();
    assert_eq!(out, [2.0, 4.0, 6.0]);
}

/// A rank-1 Hello of the right job, written one byte every 450 ms (20 s for the frame),
/// until `stop`.
fn trickler(path: &Path, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let job_id = config(0, 2, path).job_id;
    let mut s = connect(path);
    let frame = encode_frame(Kind::Hello, &Hello { job_id, world: 2, rank: 1, pid: 4242, fingerprint: 0 }.encode());
    std::thread::spawn(move || {
        for b in frame {
            if stop.load(Ordering::Relaxed) || s.write_all(&[b]).is_err() {
                return;
            }
            for _ in 0..45 {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    })
}

fn assert_no_leftovers(path: &Path) {
    let job = format!("{:016x}", config(0, 2, path).job_id);
    let left = leftover_segments(&job);
    assert!(left.is_empty(), "shared memory left behind: {left:?}");
    assert!(!path.exists(), "the socket file is removed");
}

#[test]
fn a_trickling_peer_does_not_lock_out_the_real_rank() {
    // Before: rank 0 read the trickler with a timeout per read, which every byte renewed,
    // so it sat on that one connection for 20 s and the real rank 1 timed out.
    let path = rdzv_path("trickle");
    let host = rank0(&path, 8000);
    let stop = Arc::new(AtomicBool::new(false));
    let t = trickler(&path, stop.clone());
    std::thread::sleep(Duration::from_millis(100));
    rank1_joins(&path, 8000);
    assert_eq!(host.join().unwrap().unwrap(), [2.0, 4.0, 6.0]);
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert_no_leftovers(&path);
}

#[test]
fn a_trickle_alone_ends_at_the_deadline_and_says_how_long() {
    let path = rdzv_path("trickle-alone");
    let start = Instant::now();
    let host = rank0(&path, 1500);
    let stop = Arc::new(AtomicBool::new(false));
    let t = trickler(&path, stop.clone());
    let e = host.join().unwrap().unwrap_err();
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    match &e {
        Error::Timeout { rank: 0, waited_ms, what } => {
            assert!(*waited_ms >= 1500, "reports the time really waited: {e}");
            // The trickler's place ends with the rendezvous: refused, with what it managed.
            assert!(what.contains("ranks [1]") && what.contains("a whole Hello within") && what.contains("of 44 bytes after"), "{e}");
        }
        other => panic!("expected rank 0's timeout, got {other}"),
    }
    // The trickle needs 20 s; ending in less than half of that proves the deadline held,
    // with room for a loaded machine.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_no_leftovers(&path);
}

/// Connects, sends a few bytes of garbage (or nothing), and hangs up, over and over.
fn garbage_flood(path: &Path, stop: Arc<AtomicBool>) -> JoinHandle<usize> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut s) = UnixStream::connect(&path) else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let junk: &[u8] = match n % 3 {
                0 => b"GET / HTTP/1.1\r\n\r\n",
                1 => &[0x52, 0x41, 0x50, 0x54, 1, 0, 6, 0, 0, 0, 0, 1], // Data, 16 MiB declared
                _ => b"",
            };
            let _ = s.write_all(junk);
            n += 1;
        }
        n
    })
}

#[test]
fn a_flood_of_bad_connections_yields_a_short_error() {
    // Before: every refusal was listed; 1,742 of them made a 191 KB one-line error.
    let path = rdzv_path("flood");
    let host = rank0(&path, 1500);
    let _ = connect(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let flood = garbage_flood(&path, stop.clone());
    let e = host.join().unwrap().unwrap_err();
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().unwrap();
    let text = e.to_string();
    assert!(matches!(e, Error::Timeout { rank: 0, .. }), "{text}");
    assert!(sent > MAX_LISTED + 1, "the flood sent only {sent} connections");
    assert!(text.contains(&format!("the first {MAX_LISTED}:")), "{text}");
    assert!(text.len() < 4096, "{} bytes: {text}", text.len());
    assert_no_leftovers(&path);
}

#[test]
fn silent_and_garbled_floods_do_not_lock_out_the_real_rank() {
    // More silent connections than rank 0 keeps places for, and garbage meanwhile: the real
    // rank's Hello is read as soon as it is accepted.
    let path = rdzv_path("silent");
    let host = rank0(&path, 8000);
    let silent: Vec<UnixStream> = (0..2 * MAX_PENDING).map(|_| connect(&path)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = garbage_flood(&path, stop.clone());
    std::thread::sleep(Duration::from_millis(50));
    rank1_joins(&path, 8000);
    assert_eq!(host.join().unwrap().unwrap(), [2.0, 4.0, 6.0]);
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    drop(silent);
    assert_no_leftovers(&path);
}

/// A stand-in rank 0: accepts one connection, reads its Hello, lets `reply` answer, then
/// holds the connection until the peer hangs up.
fn fake_rank0(path: &Path, reply: impl FnOnce(&mut UnixStream) + Send + 'static) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 44];
        s.read_exact(&mut hello).unwrap();
        reply(&mut s);
        let mut sink = [0u8; 256];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    })
}

fn rank1_error(path: &Path) -> Error {
    let mut c = config(1, 2, path);
    c.timeout = Duration::from_secs(10);
    CpuCommunicator::init(&c).unwrap_err()
}

#[test]
fn a_reject_text_is_escaped_and_bounded() {
    let path = rdzv_path("reject-ansi");
    let fake = fake_rank0(&path, |s| {
        let p = format!("\u{1b}[2Jrank\0\u{1b}]0;pwned\u{7}\0{}\u{1b}[31m\r", "x".repeat(1000));
        let _ = s.write_all(&encode_frame(Kind::Reject, p.as_bytes()));
    });
    let e = rank1_error(&path);
    fake.join().unwrap();
    let text = e.to_string();
    assert!(matches!(e, Error::Rendezvous { rank: 1, .. }), "{text}");
    assert!(!text.chars().any(|c| c.is_control()), "control characters reach the message: {text:?}");
    assert!(text.contains("\\u{1b}") && text.contains("more bytes"), "{text}");
    assert!(text.len() < 1500, "{} bytes", text.len());

    // A Reject of 8 MiB is refused on its header: before, all of it was read and printed.
    let path = rdzv_path("reject-huge");
    let fake = fake_rank0(&path, |s| {
        let mut f = encode_frame(Kind::Reject, &[]);
        f[8..12].copy_from_slice(&(8u32 << 20).to_le_bytes());
        let _ = s.write_all(&f);
        let _ = s.write_all(&vec![b'A'; 8 << 20]);
    });
    let e = rank1_error(&path);
    fake.join().unwrap();
    assert!(matches!(e, Error::Rendezvous { rank: 1, field: "length", .. }), "{e}");
    assert!(e.to_string().len() < 300, "{e}");
}

#[test]
fn absurd_sizes_in_the_welcome_are_refused_naming_rank_and_field() {
    // Before: cap = 2^62 panicked on a slice index, 2^64-1 divided by zero, 2^37 aborted on
    // a 1 TiB allocation (in a debug build the layout's arithmetic overflowed first).
    let real = Layout::new(2, 1024).unwrap().bytes() as u64;
    let cases: [(u64, u64, &str); 7] = [
        (2048, 1024, "cap"),
        (real, 1 << 62, "cap"),
        (real, u64::MAX, "cap"),
        (real, 1 << 37, "cap"),
        (real, 0, "cap"),
        (real, 1027, "cap"),
        (1 << 62, 1024, "shm size"),
    ];
    for (bytes, cap, field) in cases {
        let path = rdzv_path("cap");
        let job = config(0, 2, &path).job_id;
        let tag = format!("{job:016x}-{}-{}", std::process::id(), rand_u32());
        // Real segments, so that nothing but the sizes is wrong.
        let live = ShmSegment::create(&format!("/tpar-{tag}-live"), 4096, 0).unwrap();
        let data_name = format!("/tpar-{tag}");
        let data = ShmSegment::create(&data_name, real as usize, 0).unwrap();
        let live_name = live.name().to_string();
        let fake = fake_rank0(&path, move |s| {
            let mut w = Vec::new();
            w.extend_from_slice(&(live_name.len() as u16).to_le_bytes());
            w.extend_from_slice(live_name.as_bytes());
            w.extend_from_slice(&bytes.to_le_bytes());
            w.extend_from_slice(&cap.to_le_bytes());
            w.extend_from_slice(&0u32.to_le_bytes());
            w.extend_from_slice(data_name.as_bytes());
            let _ = s.write_all(&encode_frame(Kind::Welcome, &w));
        });
        let t = std::thread::spawn(move || rank1_error(&path));
        let e = t.join().expect("a joining rank must not panic on a welcome's sizes");
        fake.join().unwrap();
        assert!(matches!(&e, Error::Rendezvous { rank: 1, field: f, .. } if *f == field), "cap {cap}, bytes {bytes}: {e}");
        // A segment too small for any chunk: the range is never printed backwards
        // ("expected 1024 to 256 words").
        let text = e.to_string();
        if bytes == 2048 {
            assert!(text.contains("at least 1024 words") && text.contains("2048 bytes (256 words)"), "{text}");
        }
        drop((live, data));
        assert!(leftover_segments(&tag).is_empty());
    }
}
