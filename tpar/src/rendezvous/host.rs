//! Rank 0's side of the rendezvous: listening, reading every connection's Hello side by
//! side, validating it, and refusing what is wrong, then the welcome, attach and go.
//!
//! Connections are read without blocking and side by side, each against its own deadline
//! ([`HELLO_WINDOW`], never past the rendezvous' own), so a peer that trickles its Hello
//! byte by byte, declares a long frame or says nothing holds one of at most
//! [`MAX_PENDING`] places, not rank 0: the other ranks join meanwhile. A new connection is
//! read as soon as it is accepted (a rank's Hello is normally there already), and when
//! every place is taken the oldest pending connection is refused to make room. What was refused is
//! counted and the first [`MAX_LISTED`] are described, so a flood of bad connections
//! yields a short error.
//!
//! Owns: the listening socket and its file, the pending connections, the list of refusals.
//! Must never block without a deadline, read or allocate a length it has not bounded, or
//! leave the socket file behind.

use super::wire::{encode_frame, encode_reject, parse_header, printable, rdzv_err, read_frame, write_frame, Deadline, Hello, Kind, HEADER_LEN, HELLO_LEN, MAX_TEXT};
use super::{Control, DataPlane, JoinSpec, Joined, LIVENESS_BYTES};
use crate::error::{Error, Result};
use crate::transport::shm::ShmSegment;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// How long a connection may take to deliver its Hello. A rank sends its 44 bytes in one
/// write right after connecting, so a complete Hello normally follows within microseconds;
/// 5 s leaves room for a rank descheduled on a loaded machine, and frees the place of a
/// peer that connects and stalls.
pub const HELLO_WINDOW: Duration = Duration::from_secs(5);
/// Connections awaiting their Hello at once (four per rank of the largest world); one
/// more refuses the oldest.
pub const MAX_PENDING: usize = 4 * crate::workspace::MAX_WORLD;
/// Refusals described in rank 0's error; the rest are counted.
pub const MAX_LISTED: usize = 5;
/// Longest sleep between looks at the socket while nothing happens.
const IDLE_POLL: Duration = Duration::from_millis(50);

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
        return Err(("rank", format!("1 to {}", spec.world - 1), h.rank.to_string()));
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

/// What was refused: a count, and the first few described.
#[derive(Default)]
struct Refusals {
    count: usize,
    listed: Vec<String>,
}

impl Refusals {
    fn push(&mut self, what: String) {
        self.count += 1;
        if self.listed.len() < MAX_LISTED {
            self.listed.push(printable(&what, 2 * MAX_TEXT));
        }
    }

    fn summary(&self) -> Option<String> {
        (self.count > 0).then(|| {
            let first = if self.count > self.listed.len() { format!(", the first {}", self.listed.len()) } else { String::new() };
            format!("refused {} connection(s){first}: {}", self.count, self.listed.join("; "))
        })
    }
}

/// Sends a refusal without waiting: the frame is small and the connection new, so it fits
/// the socket's buffer; a peer that cannot take it loses nothing it would have read.
fn refuse(s: &mut UnixStream, refusals: &mut Refusals, field: &'static str, expected: &str, got: &str, who: String) {
    let _ = s.set_nonblocking(true);
    let _ = s.write_all(&encode_frame(Kind::Reject, &encode_reject(field, expected, got)));
    refusals.push(format!("{who}: `{field}` expected {expected}, got {got}"));
}

/// A connection whose Hello is still arriving.
struct Pending {
    stream: UnixStream,
    /// Header, then payload, as far as they have arrived.
    buf: Vec<u8>,
    /// Bytes `buf` must reach: the header, then header and the declared payload.
    want: usize,
    deadline: Deadline,
}

enum Step {
    Waiting,
    Hello(Hello),
    Refuse(&'static str, String, String),
}

impl Pending {
    /// Reads what has arrived, without blocking.
    fn advance(&mut self) -> Step {
        loop {
            if self.buf.len() == self.want {
                if self.want == HEADER_LEN {
                    let mut h = [0u8; HEADER_LEN];
                    h.copy_from_slice(&self.buf);
                    match parse_header(&h, 0) {
                        Ok((Kind::Hello, len)) => self.want = HEADER_LEN + len,
                        Ok((k, _)) => return Step::Refuse("kind", "Hello".into(), format!("{k:?}")),
                        Err(e) => return refusal_of(e),
                    }
                }
                if self.buf.len() == self.want {
                    return match Hello::decode(&self.buf[HEADER_LEN..], 0) {
                        Ok(h) => Step::Hello(h),
                        Err(e) => refusal_of(e),
                    };
                }
            }
            let mut chunk = [0u8; HEADER_LEN + HELLO_LEN];
            let n = (self.want - self.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..n]) {
                Ok(0) => {
                    let part = if self.buf.len() < HEADER_LEN { "frame header" } else { "frame payload" };
                    return Step::Refuse(part, format!("{} bytes", self.want), format!("{} bytes, then a truncated message (peer closed)", self.buf.len()));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.deadline.passed() {
                        return Step::Refuse(
                            "message",
                            format!("a whole Hello within {} ms", self.deadline.span_ms()),
                            format!("{} of {} bytes after {} ms", self.buf.len(), self.want.max(HEADER_LEN + HELLO_LEN), self.deadline.waited_ms()),
                        );
                    }
                    return Step::Waiting;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Step::Refuse("message", "a Hello frame".into(), e.to_string()),
            }
        }
    }
}

fn refusal_of(e: Error) -> Step {
    match e {
        Error::Rendezvous { field, expected, got, .. } => Step::Refuse(field, expected, got),
        other => Step::Refuse("message", "a Hello frame".into(), other.to_string()),
    }
}

fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn peer_uid(s: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials).ok().map(|c| c.uid())
}

/// Rank 0: hosts the rendezvous described by `spec`.
pub(super) fn host<D: DataPlane>(spec: &JoinSpec) -> Result<Joined<D>> {
    let dl = Deadline::after(spec.timeout);
    let listener = bind(spec)?;
    let socket_file = SocketFile(&spec.path);
    let streams = meet(spec, &listener, &dl)?;
    drop(listener);
    drop(socket_file);
    welcome(spec, streams, &dl)
}

/// Accepts and validates connections until every rank has said hello.
fn meet(spec: &JoinSpec, listener: &UnixListener, dl: &Deadline) -> Result<Vec<Option<UnixStream>>> {
    let me = my_uid();
    let mut streams: Vec<Option<UnixStream>> = (0..spec.world).map(|_| None).collect();
    let mut pids: Vec<Option<u32>> = vec![None; spec.world];
    pids[0] = Some(std::process::id());
    let mut refusals = Refusals::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut joined = 1;
    while joined < spec.world {
        // At most a round's worth of new connections before the pending ones and the
        // deadline are looked at: a flood must not keep this loop accepting.
        for _ in 0..MAX_PENDING {
            let mut s = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => continue,
                Err(e) => {
                    // Out of descriptors or memory: not this peer's fault nor fatal; try
                    // again after a pause (the deadline still bounds it).
                    refusals.push(format!("a connection that could not be accepted ({e})"));
                    std::thread::sleep(Duration::from_millis(1));
                    break;
                }
            };
            if let Some(uid) = peer_uid(&s) {
                if uid != me {
                    refuse(&mut s, &mut refusals, "uid", &me.to_string(), &uid.to_string(), format!("a process of uid {uid}"));
                    continue;
                }
            }
            if let Err(e) = s.set_nonblocking(true) {
                refusals.push(format!("a connection that could not be read without blocking ({e})"));
                continue;
            }
            // A rank writes its Hello right after connecting, so it is usually here already:
            // read it now, before any older, slower connection is looked at again.
            let mut p = Pending { stream: s, buf: Vec::with_capacity(HEADER_LEN + HELLO_LEN), want: HEADER_LEN, deadline: dl.within(HELLO_WINDOW) };
            if matches!(p.advance(), Step::Waiting) && pending.len() >= MAX_PENDING {
                // The oldest has had the longest to say hello: it makes room.
                let mut old = pending.remove(0);
                let why = format!("a whole Hello before {MAX_PENDING} newer connections");
                let got = format!("{} bytes after {} ms", old.buf.len(), old.deadline.waited_ms());
                refuse(&mut old.stream, &mut refusals, "connections", &why, &got, "a connection".into());
            }
            // Finished or not, the loop below takes it from here: a connection whose Hello is
            // complete (or wrong) reports the same outcome again.
            pending.push(p);
        }
        let mut i = 0;
        while i < pending.len() {
            match pending[i].advance() {
                Step::Waiting => i += 1,
                Step::Refuse(field, exp, got) => {
                    let mut p = pending.swap_remove(i);
                    refuse(&mut p.stream, &mut refusals, field, &exp, &got, "a connection".into());
                }
                Step::Hello(h) => {
                    let mut p = pending.swap_remove(i);
                    match check_hello(&h, spec, &pids) {
                        Ok(r) if p.stream.set_nonblocking(false).is_ok() => {
                            pids[r] = Some(h.pid);
                            streams[r] = Some(p.stream);
                            joined += 1;
                        }
                        Ok(r) => refusals.push(format!("pid {} claiming rank {r}: its socket could not be made blocking", h.pid)),
                        Err((field, exp, got)) => {
                            let who = format!("pid {} claiming rank {}", h.pid, h.rank);
                            refuse(&mut p.stream, &mut refusals, field, &exp, &got, who);
                        }
                    }
                }
            }
        }
        if joined == spec.world {
            break;
        }
        if dl.passed() {
            let missing: Vec<String> = (1..spec.world).filter(|r| pids[*r].is_none()).map(|r| r.to_string()).collect();
            let mut what = format!("ranks [{}] to join the rendezvous at {}", missing.join(", "), spec.path.display());
            if let Some(s) = refusals.summary() {
                what.push_str(&format!("; {s}"));
            }
            if !pending.is_empty() {
                what.push_str(&format!("; {} connection(s) still sending their Hello", pending.len()));
            }
            return Err(Error::Timeout { rank: 0, waited_ms: dl.waited_ms(), what });
        }
        wait_for_activity(listener, &pending, dl);
    }
    // Connections still pending when the job formed are closed (dropped here): a late
    // duplicate learns from the closed socket that the job went on without it.
    Ok(streams)
}

/// Sleeps until the listener or a pending connection is readable, the next deadline, or
/// [`IDLE_POLL`], whichever comes first.
fn wait_for_activity(listener: &UnixListener, pending: &[Pending], dl: &Deadline) {
    let next = pending.iter().map(|p| p.deadline.end()).chain([dl.end()]).min().unwrap_or(dl.end());
    let wait = next.saturating_duration_since(std::time::Instant::now()).min(IDLE_POLL);
    let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX);
    let mut fds: Vec<PollFd> = Vec::with_capacity(1 + pending.len());
    fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
    fds.extend(pending.iter().map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)));
    // An error here (EINTR) only ends the sleep early; the loop looks again.
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

/// Every rank has said hello: create the liveness segment and the data plane, welcome every
/// rank, hear that each attached, unlink the names, say go.
fn welcome<D: DataPlane>(spec: &JoinSpec, mut streams: Vec<Option<UnixStream>>, dl: &Deadline) -> Result<Joined<D>> {
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
            write_frame(s, Kind::Welcome, &welcome, 0, dl).map_err(|e| super::with_peer(e, r))?;
        }
    }
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            match read_frame(s, 0, dl) {
                Ok((Kind::Attached, _)) => {}
                Ok((k, _)) => return Err(rdzv_err(0, "kind", "Attached", format!("{k:?} from rank {r}"))),
                Err(e) => return Err(super::with_peer(e, r)),
            }
        }
    }
    liveness.unlink()?;
    data.all_attached()?;
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            write_frame(s, Kind::Go, &[], 0, dl).map_err(|e| super::with_peer(e, r))?;
        }
    }
    Ok(Joined { control: Control::new(0, streams), liveness, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_and_the_first_few_described() {
        let mut r = Refusals::default();
        assert!(r.summary().is_none());
        for k in 0..1742 {
            r.push(format!("connection {k}: \u{1b}[2J{}", "y".repeat(10_000)));
        }
        let s = r.summary().unwrap();
        assert!(s.starts_with("refused 1742 connection(s), the first 5: connection 0"), "{s}");
        assert!(s.len() < 3000, "{} bytes", s.len());
        assert!(!s.contains('\u{1b}'));
    }
}
