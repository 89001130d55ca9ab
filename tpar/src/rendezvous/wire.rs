//! The rendezvous' wire format: frames, the Hello, Reject texts, and reads and writes that
//! run against one deadline.
//!
//! A frame is a 12-byte header (magic "TPAR", version, kind, payload length; little-endian)
//! and its payload. Every kind has its own bound on the length ([`max_payload`]), checked
//! on the header before a byte of payload is read or allocated. Every read or write of a
//! frame runs against a [`Deadline`] for the whole exchange, never a timeout per system
//! call, so a peer that sends one byte at a time cannot stretch a wait, and a timeout says
//! how long was really waited.
//!
//! Owns: encoding and validating frames, the Hello's fields, the Reject's fields and making
//! any text a peer sent printable. Must never allocate a length it has not bounded, block
//! past a deadline, or put a peer's bytes into a message unescaped or unbounded.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Frame magic, "TPAR".
pub const FRAME_MAGIC: u32 = 0x5450_4152;
/// Protocol version; bump on any change.
pub const FRAME_VERSION: u16 = 1;
/// Largest payload a Data frame may carry (control-plane gathers of bench timings).
pub const MAX_PAYLOAD: u32 = 16 << 20;
/// Largest Welcome payload: a name of at most [`MAX_NAME`] bytes, its length, and the data
/// plane's bytes (the CPU workspace: 20 bytes and a name of at most [`MAX_NAME`] bytes).
pub const MAX_WELCOME: u32 = 1024;
/// Largest Reject payload: three texts of at most [`MAX_TEXT`] characters and a note of
/// what was cut (UTF-8: up to 4 bytes a character), and two separators.
pub const MAX_REJECT: u32 = 3 * 4 * (MAX_TEXT as u32 + 32) + 2;
/// Longest shared-memory name a Welcome may carry.
pub const MAX_NAME: usize = 200;
/// Characters of one text a peer sent (a Reject's field, expected, got) that reach a
/// message; the rest is cut and counted. Rank 0's own texts are far shorter.
pub const MAX_TEXT: usize = 160;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 12;
/// Bytes of a Hello payload.
pub const HELLO_LEN: usize = 32;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    Hello = 1,
    Welcome = 2,
    Reject = 3,
    Attached = 4,
    Go = 5,
    Data = 6,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        [Kind::Hello, Kind::Welcome, Kind::Reject, Kind::Attached, Kind::Go, Kind::Data]
            .into_iter()
            .find(|k| *k as u16 == v)
    }
}

/// The largest payload a frame of `kind` may declare.
pub fn max_payload(kind: Kind) -> u32 {
    match kind {
        Kind::Hello => HELLO_LEN as u32,
        Kind::Welcome => MAX_WELCOME,
        Kind::Reject => MAX_REJECT,
        Kind::Attached | Kind::Go => 0,
        Kind::Data => MAX_PAYLOAD,
    }
}

/// One deadline for a whole exchange: when it started (for saying how long was waited)
/// and when it ends.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    start: Instant,
    end: Instant,
}

impl Deadline {
    /// Ends `timeout` from now (a timeout too large for the clock means "a year").
    pub fn after(timeout: Duration) -> Deadline {
        let start = Instant::now();
        let end = start
            .checked_add(timeout)
            .or_else(|| start.checked_add(Duration::from_secs(365 * 86_400)))
            .unwrap_or(start);
        Deadline { start, end }
    }

    /// A deadline starting now that ends `window` from now, or at this one's end if sooner.
    pub fn within(&self, window: Duration) -> Deadline {
        let d = Deadline::after(window);
        Deadline { start: d.start, end: d.end.min(self.end) }
    }

    /// Time left, or `None` once the deadline has passed.
    pub fn remaining(&self) -> Option<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        self.remaining().is_none()
    }

    /// Milliseconds since the deadline was set: what a timeout reports.
    pub fn waited_ms(&self) -> u64 {
        self.start.elapsed().as_millis().min(u64::MAX as u128) as u64
    }

    /// Milliseconds from its start to its end.
    pub fn span_ms(&self) -> u64 {
        self.end.duration_since(self.start).as_millis().min(u64::MAX as u128) as u64
    }

    /// When it ends.
    pub fn end(&self) -> Instant {
        self.end
    }
}

pub(crate) fn rdzv_err(rank: usize, field: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Rendezvous {
        rank,
        field,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

fn timed_out(rank: usize, dl: &Deadline, what: &str) -> Error {
    Error::Timeout { rank, waited_ms: dl.waited_ms(), what: what.to_string() }
}

/// Whether `name` looks like a segment name tpar makes: `/tpar-` and then only ASCII
/// letters, digits and dashes, at most [`MAX_NAME`] bytes (so it is safe in a path and in a
/// message).
pub fn is_segment_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.strip_prefix("/tpar-").is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

/// Encodes one frame.
pub fn encode_frame(kind: Kind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    v.extend_from_slice(&FRAME_VERSION.to_le_bytes());
    v.extend_from_slice(&(kind as u16).to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Validates a frame header (magic, version, kind, the kind's bound on the length) and
/// returns the kind and the payload's length.
pub fn parse_header(h: &[u8; HEADER_LEN], rank: usize) -> Result<(Kind, usize)> {
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if magic != FRAME_MAGIC {
        return Err(rdzv_err(rank, "magic", format!("{FRAME_MAGIC:#010x}"), format!("{magic:#010x}")));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != FRAME_VERSION {
        return Err(rdzv_err(rank, "version", FRAME_VERSION, version));
    }
    let kind_raw = u16::from_le_bytes([h[6], h[7]]);
    let kind = Kind::from_u16(kind_raw).ok_or_else(|| rdzv_err(rank, "kind", "1 to 6", kind_raw))?;
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > max_payload(kind) {
        return Err(rdzv_err(rank, "length", format!("at most {} bytes for {kind:?}", max_payload(kind)), len));
    }
    Ok((kind, len as usize))
}

/// Fills `buf` from `stream` before `dl`; `what` names the part in errors.
pub fn read_exact_by(stream: &mut UnixStream, buf: &mut [u8], dl: &Deadline, rank: usize, what: &'static str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = dl.remaining().ok_or_else(|| timed_out(rank, dl, &format!("a rendezvous message ({what}, {got} of {} bytes read)", buf.len())))?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| Error::io(rank, "setting a read timeout", e))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(rdzv_err(rank, what, format!("{} bytes", buf.len()), format!("{got} bytes, then a truncated message (peer closed)")))
            }
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) => return Err(Error::io(rank, format!("reading rendezvous {what}"), e)),
        }
    }
    Ok(())
}

/// Reads and validates one frame before `dl`.
pub fn read_frame(stream: &mut UnixStream, rank: usize, dl: &Deadline) -> Result<(Kind, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    read_exact_by(stream, &mut h, dl, rank, "frame header")?;
    let (kind, len) = parse_header(&h, rank)?;
    let mut payload = vec![0u8; len];
    read_exact_by(stream, &mut payload, dl, rank, "frame payload")?;
    Ok((kind, payload))
}

/// Writes one frame before `dl`.
pub fn write_frame(stream: &mut UnixStream, kind: Kind, payload: &[u8], rank: usize, dl: &Deadline) -> Result<()> {
    let bytes = encode_frame(kind, payload);
    let mut sent = 0;
    while sent < bytes.len() {
        let left = dl
            .remaining()
            .ok_or_else(|| timed_out(rank, dl, &format!("the peer to take a {kind:?} frame ({sent} of {} bytes sent)", bytes.len())))?;
        stream
            .set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| Error::io(rank, "setting a write timeout", e))?;
        match stream.write(&bytes[sent..]) {
            Ok(0) => return Err(Error::io(rank, format!("sending rendezvous {kind:?}"), ErrorKind::WriteZero)),
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) => return Err(Error::io(rank, format!("sending rendezvous {kind:?}"), e)),
        }
    }
    Ok(())
}

/// What a rank says about itself when it joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub job_id: u64,
    pub world: u32,
    pub rank: u32,
    pub pid: u32,
    /// Digest of the inputs every rank's plan depends on; all ranks must agree.
    pub fingerprint: u64,
}

fn u64_at(p: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[i..i + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(p: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]])
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HELLO_LEN);
        v.extend_from_slice(&self.job_id.to_le_bytes());
        v.extend_from_slice(&self.world.to_le_bytes());
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&self.fingerprint.to_le_bytes());
        v
    }

    pub fn decode(p: &[u8], rank: usize) -> Result<Hello> {
        if p.len() != HELLO_LEN {
            return Err(rdzv_err(rank, "hello length", HELLO_LEN, p.len()));
        }
        Ok(Hello {
            job_id: u64_at(p, 0),
            world: u32_at(p, 8),
            rank: u32_at(p, 12),
            pid: u32_at(p, 16),
            fingerprint: u64_at(p, 24),
        })
    }
}

/// `s` made safe to print: control and text-direction characters escaped (`\u{1b}`), cut
/// after `max_chars` characters of output with a note of how many bytes were cut.
pub fn printable(s: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for (at, c) in s.char_indices() {
        let hidden = c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
        let piece: String = if hidden { c.escape_unicode().collect() } else { c.to_string() };
        let n = piece.chars().count();
        if shown + n > max_chars {
            out.push_str(&format!("… ({} more bytes)", s.len() - at));
            return out;
        }
        shown += n;
        out.push_str(&piece);
    }
    out
}

/// A refusal's payload: field, expected and got, each printable and at most [`MAX_TEXT`]
/// characters (so the frame stays under [`MAX_REJECT`]).
pub fn encode_reject(field: &str, expected: &str, got: &str) -> Vec<u8> {
    let part = |s: &str| printable(s, MAX_TEXT);
    let mut v = format!("{}\0{}\0{}", part(field), part(expected), part(got)).into_bytes();
    v.truncate(MAX_REJECT as usize);
    v
}

/// A refusal as received: each part printable and bounded, whatever the peer sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    pub field: String,
    pub expected: String,
    pub got: String,
}

impl Reject {
    pub fn decode(p: &[u8]) -> Reject {
        let text = String::from_utf8_lossy(p);
        let mut parts = text.splitn(3, '\0').map(|s| printable(s, MAX_TEXT));
        let mut next = || parts.next().unwrap_or_else(|| "?".to_string());
        let (field, expected, got) = (next(), next(), next());
        Reject { field, expected, got }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_bad_lengths() {
        let h = Hello { job_id: 0xdead_beef, world: 8, rank: 3, pid: 77, fingerprint: 5 };
        assert_eq!(Hello::decode(&h.encode(), 0).unwrap(), h);
        assert!(matches!(Hello::decode(&h.encode()[..31], 0), Err(Error::Rendezvous { field: "hello length", .. })));
    }

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn frames_are_validated() {
        let dl = Deadline::after(Duration::from_secs(5));
        let (mut a, mut b) = pair();
        a.write_all(&encode_frame(Kind::Data, b"xyz")).unwrap();
        assert_eq!(read_frame(&mut b, 0, &dl).unwrap(), (Kind::Data, b"xyz".to_vec()));
        let mut bad = encode_frame(Kind::Data, b"x");
        bad[0] ^= 1;
        a.write_all(&bad).unwrap();
        assert!(matches!(read_frame(&mut b, 0, &dl), Err(Error::Rendezvous { field: "magic", .. })));
        let (mut a, mut b) = pair();
        let mut v = encode_frame(Kind::Data, b"x");
        v[4] = 9;
        a.write_all(&v).unwrap();
        assert!(matches!(read_frame(&mut b, 0, &dl), Err(Error::Rendezvous { field: "version", .. })));
        let (mut a, mut b) = pair();
        let mut v = encode_frame(Kind::Data, b"x");
        v[8..12].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        a.write_all(&v).unwrap();
        assert!(matches!(read_frame(&mut b, 0, &dl), Err(Error::Rendezvous { field: "length", .. })));
        let (mut a, mut b) = pair();
        let v = encode_frame(Kind::Data, b"hello");
        a.write_all(&v[..14]).unwrap();
        drop(a);
        assert!(matches!(read_frame(&mut b, 0, &dl), Err(Error::Rendezvous { field: "frame payload", .. })));
    }

    #[test]
    fn each_kind_has_its_own_length_bound() {
        // A Hello, Go or Reject that declares more than its kind can hold is refused on the
        // header: nothing of that size is allocated or awaited.
        for (kind, bound) in [(Kind::Hello, 32u32), (Kind::Go, 0), (Kind::Attached, 0), (Kind::Reject, MAX_REJECT), (Kind::Welcome, MAX_WELCOME)] {
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&encode_frame(kind, &[])[..HEADER_LEN]);
            h[8..12].copy_from_slice(&bound.to_le_bytes());
            assert_eq!(parse_header(&h, 0).unwrap(), (kind, bound as usize));
            h[8..12].copy_from_slice(&(bound + 1).to_le_bytes());
            let e = parse_header(&h, 0).unwrap_err();
            assert!(matches!(e, Error::Rendezvous { field: "length", .. }), "{kind:?}: {e}");
        }
        const { assert!(MAX_REJECT < 4096 && MAX_WELCOME < 4096) };
    }

    #[test]
    fn a_trickling_peer_meets_one_deadline_and_the_timeout_says_how_long() {
        // One byte every 50 ms of a 44-byte frame: the old per-read timeout was renewed by
        // every byte (2.2 s here); one deadline of 300 ms ends it, and says ~300 ms, not 0.
        let (mut a, mut b) = pair();
        let writer = std::thread::spawn(move || {
            for byte in encode_frame(Kind::Hello, &[0u8; HELLO_LEN]) {
                if a.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let dl = Deadline::after(Duration::from_millis(300));
        let t = Instant::now();
        let e = read_frame(&mut b, 0, &dl).unwrap_err();
        let took = t.elapsed();
        drop(b);
        writer.join().unwrap();
        match e {
            Error::Timeout { waited_ms, ref what, .. } => {
                assert!(waited_ms >= 300, "reports the time really waited: {e}");
                assert!(what.contains("bytes read"), "{e}");
            }
            other => panic!("expected a timeout, got {other}"),
        }
        // The frame would take 2.2 s to arrive; a bound far below that proves the deadline
        // held without racing a loaded machine's scheduler.
        assert!(took < Duration::from_millis(1800), "took {took:?}");
    }

    #[test]
    fn a_silent_peer_times_out_with_the_true_wait() {
        let (_a, mut b) = pair();
        let dl = Deadline::after(Duration::from_millis(120));
        let e = read_frame(&mut b, 3, &dl).unwrap_err();
        assert!(matches!(e, Error::Timeout { rank: 3, waited_ms, .. } if waited_ms >= 120), "{e}");
        assert!(!e.to_string().contains("after 0 ms"), "{e}");
    }

    #[test]
    fn peer_text_is_escaped_and_bounded() {
        assert_eq!(printable("a\u{1b}[31mred\n", 100), "a\\u{1b}[31mred\\u{a}");
        assert_eq!(printable("abc\u{202e}", 100), "abc\\u{202e}");
        let long = "x".repeat(10_000);
        let p = printable(&long, MAX_TEXT);
        assert!(p.starts_with(&"x".repeat(MAX_TEXT)) && p.ends_with(&format!("({} more bytes)", 10_000 - MAX_TEXT)), "{p}");
        let enc = encode_reject("rank", &"é".repeat(5000), "\u{1b}]0;pwned\u{7}");
        assert!(enc.len() <= MAX_REJECT as usize);
        let r = Reject::decode(&enc);
        assert_eq!(r.field, "rank");
        assert!(!r.got.chars().any(|c| c.is_control()), "{r:?}");
        let r = Reject::decode(b"only-a-field");
        assert_eq!((r.field.as_str(), r.expected.as_str(), r.got.as_str()), ("only-a-field", "?", "?"));
        let r = Reject::decode(&[0xff, 0, 0x1b, 0]);
        assert!(!format!("{r:?}").contains('\u{1b}'));
    }

    #[test]
    fn segment_names_are_plain() {
        assert!(is_segment_name("/tpar-00ab-12-ff-live"));
        for bad in ["/tpar-", "tpar-x", "/tpar-a/b", "/tpar-a\u{1b}b", "/tpar-a b", "/tpar-é", &format!("/tpar-{}", "a".repeat(MAX_NAME))] {
            assert!(!is_segment_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn deadlines_survive_absurd_timeouts() {
        let d = Deadline::after(Duration::from_millis(u64::MAX));
        assert!(!d.passed());
        assert!(d.within(Duration::from_millis(10)).end() <= d.end());
    }
}
