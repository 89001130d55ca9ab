//! Rendezvous over a Unix-domain socket, and the control plane that stays open afterwards.
//!
//! Rank 0 listens; every other rank connects and says who it is. Every message is framed
//! (magic, version, kind, length) and every field is validated; a bad one is refused with a
//! message naming the field, both to the sender and in rank 0's error if the job cannot
//! form. Then rank 0 creates the liveness segment (0600) and the backend's data plane
//! ([`DataPlane`]: the CPU backend's shared workspace, or nothing), every rank maps the
//! liveness segment, takes its lock and attaches the data plane, rank 0 unlinks the names,
//! and says go.
//!
//! ```text
//! rank r                          rank 0
//!   Hello{job, world, rank, pid, fingerprint} ->
//!                                 <- Welcome{liveness name, data-plane bytes} | Reject{field}
//!   Attached                   ->
//!                                 (all attached: names unlinked, socket unlinked earlier)
//!                                 <- Go
//! ```
//!
//! Owns: the socket, message framing and validation. Must never block without a deadline,
//! trust a length it has not bounded, leave the socket file behind, or know what a data
//! plane holds.

use crate::error::{Error, Result};
use crate::transport::shm::ShmSegment;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Frame magic, "TPAR".
pub const FRAME_MAGIC: u32 = 0x5450_4152;
/// Protocol version; bump on any change.
pub const FRAME_VERSION: u16 = 1;
/// Largest payload a frame may carry (control-plane gathers of bench timings included).
pub const MAX_PAYLOAD: u32 = 16 << 20;
const HEADER_LEN: usize = 12;
const HELLO_LEN: usize = 32;

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

fn rdzv_err(rank: usize, field: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Rendezvous {
        rank,
        field,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

fn read_exact_or(stream: &mut UnixStream, buf: &mut [u8], rank: usize, what: &'static str) -> Result<()> {
    stream.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => rdzv_err(rank, what, format!("{} bytes", buf.len()), "a truncated message (peer closed)"),
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout {
            rank,
            waited_ms: 0,
            what: format!("a rendezvous message ({what})"),
        },
        _ => Error::io(rank, format!("reading rendezvous {what}"), e),
    })
}

/// Reads and validates one frame (magic, version, kind, bounded length).
pub fn read_frame(stream: &mut UnixStream, rank: usize) -> Result<(Kind, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    read_exact_or(stream, &mut h, rank, "frame header")?;
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if magic != FRAME_MAGIC {
        return Err(rdzv_err(rank, "magic", format!("{FRAME_MAGIC:#010x}"), format!("{magic:#010x}")));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != FRAME_VERSION {
        return Err(rdzv_err(rank, "version", FRAME_VERSION, version));
    }
    let kind_raw = u16::from_le_bytes([h[6], h[7]]);
    let kind = Kind::from_u16(kind_raw).ok_or_else(|| rdzv_err(rank, "kind", "1..=6", kind_raw))?;
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > MAX_PAYLOAD {
        return Err(rdzv_err(rank, "length", format!("<= {MAX_PAYLOAD}"), len));
    }
    let mut payload = vec![0u8; len as usize];
    read_exact_or(stream, &mut payload, rank, "frame payload")?;
    Ok((kind, payload))
}

fn write_frame(stream: &mut UnixStream, kind: Kind, payload: &[u8], rank: usize) -> Result<()> {
    stream
        .write_all(&encode_frame(kind, payload))
        .map_err(|e| Error::io(rank, format!("sending rendezvous {kind:?}"), e))
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
        let u64_at = |i: usize| u64::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3], p[i + 4], p[i + 5], p[i + 6], p[i + 7]]);
        let u32_at = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        Ok(Hello {
            job_id: u64_at(0),
            world: u32_at(8),
            rank: u32_at(12),
            pid: u32_at(16),
            fingerprint: u64_at(24),
        })
    }
}

/// Shared memory a backend sets up during the rendezvous (see `control`).
pub trait DataPlane: Sized {
    /// Rank 0, once every rank has said hello: create what the ranks share. The bytes go to
    /// every other rank in the welcome.
    fn create(spec: &JoinSpec) -> Result<(Self, Vec<u8>)>;
    /// Every other rank: attach to what rank 0 created, checking every field of `welcome`.
    fn attach(spec: &JoinSpec, welcome: &[u8]) -> Result<Self>;
    /// Rank 0, once every rank has attached (for example: unlink the segment's name).
    fn all_attached(&mut self) -> Result<()>;
}

/// Settings every rank brings to the rendezvous.
#[derive(Clone, Debug)]
pub struct JoinSpec {
    pub rank: usize,
    pub world: usize,
    pub path: PathBuf,
    pub job_id: u64,
    pub fingerprint: u64,
    pub timeout: Duration,
    /// For the data plane, rank 0 only: the workspace size budget and the first epoch.
    pub shm_budget: usize,
    pub first_epoch: u32,
}

/// Bytes of the liveness segment: one lock byte per rank, a page in all.
const LIVENESS_BYTES: usize = 4096;

/// The control plane: rank 0 holds a stream to every rank, the others one to rank 0.
pub struct Control {
    rank: usize,
    streams: Vec<Option<UnixStream>>,
}

/// What a successful rendezvous yields.
pub struct Joined<D> {
    pub control: Control,
    /// Every rank's liveness lock lives here; this rank holds its own.
    pub liveness: ShmSegment,
    pub data: D,
}

/// Joins the job described by `spec` (rank 0 hosts it) and sets up the data plane `D`.
pub fn join<D: DataPlane>(spec: &JoinSpec) -> Result<Joined<D>> {
    if spec.rank == 0 {
        host(spec)
    } else {
        guest(spec)
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Removes the socket file when rank 0 leaves the rendezvous, however it leaves.
struct SocketFile<'a>(&'a Path);
impl Drop for SocketFile<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

fn bind(spec: &JoinSpec) -> Result<UnixListener> {
    let path = &spec.path;
    if path.exists() {
        // A live socket means another job uses this address; a dead one is a crash leftover.
        if UnixStream::connect(path).is_ok() {
            return Err(rdzv_err(0, "address", "an unused socket path", format!("{} (another job is listening)", path.display())));
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(|e| Error::io(0, format!("binding rendezvous socket {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(0, format!("chmod 0600 {}", path.display()), e))?;
    l.set_nonblocking(true).map_err(|e| Error::io(0, "set_nonblocking", e))?;
    Ok(l)
}

fn check_hello(h: &Hello, spec: &JoinSpec, claimed: &[Option<u32>]) -> std::result::Result<usize, (&'static str, String, String)> {
    if h.job_id != spec.job_id {
        return Err(("job_id", format!("{:#018x}", spec.job_id), format!("{:#018x} (stale or foreign job)", h.job_id)));
    }
    if h.world as usize != spec.world {
        return Err(("world", spec.world.to_string(), h.world.to_string()));
    }
    let r = h.rank as usize;
    if r == 0 || r >= spec.world {
        return Err(("rank", format!("1..{}", spec.world), h.rank.to_string()));
    }
    if let Some(Some(pid)) = claimed.get(r) {
        return Err(("rank", "an unclaimed rank".to_string(), format!("rank {r}, already claimed by pid {pid}")));
    }
    if h.fingerprint != spec.fingerprint {
        return Err((
            "plan fingerprint (topology, profile, overrides)",
            format!("{:#018x} (rank 0)", spec.fingerprint),
            format!("{:#018x} (rank {r})", h.fingerprint),
        ));
    }
    Ok(r)
}

fn reject_payload(field: &str, expected: &str, got: &str) -> Vec<u8> {
    format!("{field}\0{expected}\0{got}").into_bytes()
}

fn host<D: DataPlane>(spec: &JoinSpec) -> Result<Joined<D>> {
    let deadline = Instant::now() + spec.timeout;
    let listener = bind(spec)?;
    let _socket_file = SocketFile(&spec.path);
    let me = my_uid();
    let mut streams: Vec<Option<UnixStream>> = (0..spec.world).map(|_| None).collect();
    let mut pids: Vec<Option<u32>> = vec![None; spec.world];
    pids[0] = Some(std::process::id());
    let mut refused: Vec<String> = vec![];
    let mut joined = 1;
    while joined < spec.world {
        if Instant::now() >= deadline {
            let missing: Vec<String> = (1..spec.world).filter(|r| pids[*r].is_none()).map(|r| r.to_string()).collect();
            let mut what = format!("ranks [{}] to join the rendezvous at {}", missing.join(", "), spec.path.display());
            if !refused.is_empty() {
                what.push_str(&format!("; refused: {}", refused.join("; ")));
            }
            return Err(Error::Timeout { rank: 0, waited_ms: ms(spec.timeout), what });
        }
        let (mut s, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(Error::io(0, "accepting a rank", e)),
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(remaining(deadline).min(Duration::from_secs(5))));
        if let Some(uid) = peer_uid(&s) {
            if uid != me {
                let _ = write_frame(&mut s, Kind::Reject, &reject_payload("uid", &me.to_string(), &uid.to_string()), 0);
                refused.push(format!("a process of uid {uid}"));
                continue;
            }
        }
        let hello = match read_frame(&mut s, 0).and_then(|(k, p)| {
            if k != Kind::Hello {
                return Err(rdzv_err(0, "kind", "Hello", format!("{k:?}")));
            }
            Hello::decode(&p, 0)
        }) {
            Ok(h) => h,
            Err(e) => {
                let (field, exp, got) = match &e {
                    Error::Rendezvous { field, expected, got, .. } => (*field, expected.clone(), got.clone()),
                    other => ("message", "a Hello frame".to_string(), other.to_string()),
                };
                let _ = write_frame(&mut s, Kind::Reject, &reject_payload(field, &exp, &got), 0);
                refused.push(format!("a connection with a bad `{field}` (expected {exp}, got {got})"));
                continue;
            }
        };
        match check_hello(&hello, spec, &pids) {
            Ok(r) => {
                pids[r] = Some(hello.pid);
                streams[r] = Some(s);
                joined += 1;
            }
            Err((field, exp, got)) => {
                let _ = write_frame(&mut s, Kind::Reject, &reject_payload(field, &exp, &got), 0);
                refused.push(format!("pid {} claiming rank {}: `{field}` expected {exp}, got {got}", hello.pid, hello.rank));
            }
        }
    }
    drop(listener);
    drop(_socket_file);

    let name = format!("/tpar-{:016x}-{}-{:08x}-live", spec.job_id, std::process::id(), rand::random::<u32>());
    let mut liveness = ShmSegment::create(&name, LIVENESS_BYTES, 0)?;
    liveness.hold_liveness(0)?;
    let (mut data, payload) = D::create(spec)?;

    let mut welcome = Vec::new();
    welcome.extend_from_slice(&(name.len() as u16).to_le_bytes());
    welcome.extend_from_slice(name.as_bytes());
    welcome.extend_from_slice(&payload);
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            write_frame(s, Kind::Welcome, &welcome, 0).map_err(|e| with_peer(e, r))?;
        }
    }
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            let _ = s.set_read_timeout(Some(remaining(deadline)));
            match read_frame(s, 0) {
                Ok((Kind::Attached, _)) => {}
                Ok((k, _)) => return Err(rdzv_err(0, "kind", "Attached", format!("{k:?} from rank {r}"))),
                Err(e) => return Err(with_peer(e, r)),
            }
        }
    }
    liveness.unlink()?;
    data.all_attached()?;
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            write_frame(s, Kind::Go, &[], 0).map_err(|e| with_peer(e, r))?;
        }
    }
    Ok(Joined { control: Control { rank: 0, streams }, liveness, data })
}

fn with_peer(e: Error, peer: usize) -> Error {
    match e {
        Error::Io { rank, context, source } => Error::Io {
            rank,
            context: format!("{context} (rank {peer})"),
            source,
        },
        Error::Timeout { rank, waited_ms, what } => Error::Timeout {
            rank,
            waited_ms,
            what: format!("{what} from rank {peer}"),
        },
        other => other,
    }
}

fn guest<D: DataPlane>(spec: &JoinSpec) -> Result<Joined<D>> {
    let deadline = Instant::now() + spec.timeout;
    let rank = spec.rank;
    let mut s = loop {
        match UnixStream::connect(&spec.path) {
            Ok(s) => break s,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        rank,
                        waited_ms: ms(spec.timeout),
                        what: format!("rank 0 to open the rendezvous at {}", spec.path.display()),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::io(rank, format!("connecting to {}", spec.path.display()), e)),
        }
    };
    let _ = s.set_read_timeout(Some(remaining(deadline)));
    let hello = Hello {
        job_id: spec.job_id,
        world: spec.world as u32,
        rank: rank as u32,
        pid: std::process::id(),
        fingerprint: spec.fingerprint,
    };
    write_frame(&mut s, Kind::Hello, &hello.encode(), rank)?;
    let (kind, p) = read_frame(&mut s, rank)?;
    match kind {
        Kind::Welcome => {}
        Kind::Reject => {
            let text = String::from_utf8_lossy(&p).into_owned();
            let mut parts = text.split('\0');
            let field = parts.next().unwrap_or("?").to_string();
            let expected = parts.next().unwrap_or("?").to_string();
            let got = parts.next().unwrap_or("?").to_string();
            return Err(Error::Rendezvous {
                rank,
                field: static_field(&field),
                expected,
                got: format!("{got} (refused by rank 0)"),
            });
        }
        k => return Err(rdzv_err(rank, "kind", "Welcome or Reject", format!("{k:?}"))),
    }
    if p.len() < 2 {
        return Err(rdzv_err(rank, "welcome length", ">= 2", p.len()));
    }
    let n = u16::from_le_bytes([p[0], p[1]]) as usize;
    if p.len() < 2 + n {
        return Err(rdzv_err(rank, "welcome length", format!(">= {}", 2 + n), p.len()));
    }
    let name = String::from_utf8(p[2..2 + n].to_vec()).map_err(|_| rdzv_err(rank, "shm name", "UTF-8", "invalid bytes"))?;
    if !name.starts_with("/tpar-") || !name.ends_with("-live") || name.len() > 200 {
        return Err(rdzv_err(rank, "shm name", "/tpar-…-live", name));
    }
    let liveness = ShmSegment::open(&name, LIVENESS_BYTES, rank)?;
    liveness.hold_liveness(rank)?;
    let data = D::attach(spec, &p[2 + n..])?;
    write_frame(&mut s, Kind::Attached, &[], rank)?;
    match read_frame(&mut s, rank)? {
        (Kind::Go, _) => {}
        (k, _) => return Err(rdzv_err(rank, "kind", "Go", format!("{k:?}"))),
    }
    let mut streams: Vec<Option<UnixStream>> = (0..spec.world).map(|_| None).collect();
    streams[0] = Some(s);
    Ok(Joined { control: Control { rank, streams }, liveness, data })
}

/// Maps a field name from a Reject message onto the static names this module uses.
fn static_field(f: &str) -> &'static str {
    const KNOWN: [&str; 12] = [
        "job_id",
        "world",
        "rank",
        "magic",
        "version",
        "kind",
        "length",
        "hello length",
        "uid",
        "plan fingerprint (topology, profile, overrides)",
        "frame header",
        "frame payload",
    ];
    KNOWN.into_iter().find(|k| *k == f).unwrap_or("message")
}

fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn peer_uid(s: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| c.uid())
}

impl Control {
    /// Every rank sends `payload`; rank 0 receives all of them in rank order, others `None`.
    pub fn gather(&mut self, payload: &[u8], timeout: Duration) -> Result<Option<Vec<Vec<u8>>>> {
        let rank = self.rank;
        if rank == 0 {
            let mut all = vec![payload.to_vec()];
            for (r, s) in self.streams.iter_mut().enumerate().skip(1) {
                let s = s.as_mut().ok_or_else(|| Error::invalid("control", format!("no stream to rank {r}")))?;
                let _ = s.set_read_timeout(Some(timeout));
                match read_frame(s, 0).map_err(|e| with_peer(e, r))? {
                    (Kind::Data, p) => all.push(p),
                    (k, _) => return Err(rdzv_err(0, "kind", "Data", format!("{k:?} from rank {r}"))),
                }
            }
            Ok(Some(all))
        } else {
            let s = self.streams[0].as_mut().ok_or_else(|| Error::invalid("control", "no stream to rank 0"))?;
            write_frame(s, Kind::Data, payload, rank)?;
            Ok(None)
        }
    }

    /// Every rank's `payload` reaches every rank, in rank order (gather to rank 0, then a
    /// broadcast of the length-prefixed concatenation).
    pub fn all_gather(&mut self, payload: &[u8], world: usize, timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let rank = self.rank;
        let packed = match self.gather(payload, timeout)? {
            Some(all) => {
                let mut v = Vec::new();
                for p in &all {
                    v.extend_from_slice(&(p.len() as u32).to_le_bytes());
                    v.extend_from_slice(p);
                }
                v
            }
            None => Vec::new(),
        };
        let packed = self.broadcast(&packed, timeout)?;
        let mut out = Vec::with_capacity(world);
        let mut at = 0usize;
        while at + 4 <= packed.len() {
            let n = u32::from_le_bytes([packed[at], packed[at + 1], packed[at + 2], packed[at + 3]]) as usize;
            let end = at + 4 + n;
            if end > packed.len() {
                break;
            }
            out.push(packed[at + 4..end].to_vec());
            at = end;
        }
        if out.len() != world || at != packed.len() {
            return Err(rdzv_err(rank, "all-gather payload", format!("{world} length-prefixed parts"), format!("{} parts", out.len())));
        }
        Ok(out)
    }

    /// Rank 0's `payload` reaches every rank.
    pub fn broadcast(&mut self, payload: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let rank = self.rank;
        if rank == 0 {
            for (r, s) in self.streams.iter_mut().enumerate().skip(1) {
                if let Some(s) = s {
                    write_frame(s, Kind::Data, payload, 0).map_err(|e| with_peer(e, r))?;
                }
            }
            Ok(payload.to_vec())
        } else {
            let s = self.streams[0].as_mut().ok_or_else(|| Error::invalid("control", "no stream to rank 0"))?;
            let _ = s.set_read_timeout(Some(timeout));
            match read_frame(s, rank)? {
                (Kind::Data, p) => Ok(p),
                (k, _) => Err(rdzv_err(rank, "kind", "Data", format!("{k:?}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_bad_lengths() {
        let h = Hello {
            job_id: 0xdead_beef,
            world: 8,
            rank: 3,
            pid: 77,
            fingerprint: 5,
        };
        assert_eq!(Hello::decode(&h.encode(), 0).unwrap(), h);
        assert!(matches!(Hello::decode(&h.encode()[..31], 0), Err(Error::Rendezvous { field: "hello length", .. })));
    }

    #[test]
    fn frames_are_validated() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&encode_frame(Kind::Data, b"xyz")).unwrap();
        assert_eq!(read_frame(&mut b, 0).unwrap(), (Kind::Data, b"xyz".to_vec()));
        let mut bad = encode_frame(Kind::Data, b"x");
        bad[0] ^= 1;
        a.write_all(&bad).unwrap();
        assert!(matches!(read_frame(&mut b, 0), Err(Error::Rendezvous { field: "magic", .. })));
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut v = encode_frame(Kind::Data, b"x");
        v[4] = 9;
        a.write_all(&v).unwrap();
        assert!(matches!(read_frame(&mut b, 0), Err(Error::Rendezvous { field: "version", .. })));
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let mut v = encode_frame(Kind::Data, b"x");
        v[8..12].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        a.write_all(&v).unwrap();
        assert!(matches!(read_frame(&mut b, 0), Err(Error::Rendezvous { field: "length", .. })));
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let v = encode_frame(Kind::Data, b"hello");
        a.write_all(&v[..14]).unwrap();
        drop(a);
        assert!(matches!(read_frame(&mut b, 0), Err(Error::Rendezvous { field: "frame payload", .. })));
    }
}
