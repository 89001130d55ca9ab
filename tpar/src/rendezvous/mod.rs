//! Rendezvous over a Unix-domain socket, and the control plane that stays open afterwards.
//!
//! Rank 0 listens; every other rank connects and says who it is. Every message is framed
//! (magic, version, kind, a length bounded per kind) and every field is validated; a bad one
//! is refused with a message naming the field, both to the sender and in rank 0's error if
//! the job cannot form. Then rank 0 creates the liveness segment (0600) and the backend's
//! data plane ([`DataPlane`]: the CPU backend's shared workspace, or nothing), every rank
//! maps the liveness segment, takes its lock and attaches the data plane, rank 0 unlinks
//! the names, and says go.
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
//! Each rank's whole rendezvous runs against one deadline (the timeout from its start);
//! rank 0 reads every connection's Hello side by side, so a slow or hostile peer costs its
//! own place, not the other ranks' ([`host`]). [`wire`] holds the frames, [`streams`] the
//! collectives that use the sockets afterwards.
//!
//! Owns: the socket, message framing and validation. Must never block without a deadline,
//! trust a length it has not bounded, print a peer's text unescaped, leave the socket file
//! behind, or know what a data plane holds.

mod host;
mod streams;
pub mod wire;

use crate::error::{Error, Result};
use crate::transport::shm::ShmSegment;
pub use host::{HELLO_WINDOW, MAX_LISTED, MAX_PENDING};
pub use streams::Control;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
pub use wire::{encode_frame, Hello, Kind, FRAME_MAGIC, FRAME_VERSION, MAX_PAYLOAD};
use wire::{rdzv_err, read_frame, write_frame, Deadline, Reject, MAX_NAME};

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
        host::host(spec)
    } else {
        guest(spec)
    }
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
    let dl = Deadline::after(spec.timeout);
    let rank = spec.rank;
    let mut s = loop {
        match UnixStream::connect(&spec.path) {
            Ok(s) => break s,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
                if dl.passed() {
                    return Err(Error::Timeout {
                        rank,
                        waited_ms: dl.waited_ms(),
                        what: format!("rank 0 to open the rendezvous at {}", spec.path.display()),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::io(rank, format!("connecting to {}", spec.path.display()), e)),
        }
    };
    let hello = Hello {
        job_id: spec.job_id,
        world: spec.world as u32,
        rank: rank as u32,
        pid: std::process::id(),
        fingerprint: spec.fingerprint,
    };
    write_frame(&mut s, Kind::Hello, &hello.encode(), rank, &dl)?;
    let (kind, p) = read_frame(&mut s, rank, &dl)?;
    match kind {
        Kind::Welcome => {}
        Kind::Reject => {
            let r = Reject::decode(&p);
            let field = static_field(&r.field);
            let from = if field == "message" && r.field != "message" { format!(", field `{}`", r.field) } else { String::new() };
            return Err(Error::Rendezvous {
                rank,
                field,
                expected: r.expected,
                got: format!("{} (refused by rank 0{from})", r.got),
            });
        }
        k => return Err(rdzv_err(rank, "kind", "Welcome or Reject", format!("{k:?}"))),
    }
    if p.len() < 2 {
        return Err(rdzv_err(rank, "welcome length", "at least 2 bytes", p.len()));
    }
    let n = u16::from_le_bytes([p[0], p[1]]) as usize;
    if n > MAX_NAME || p.len() < 2 + n {
        return Err(rdzv_err(rank, "shm name length", format!("at most {MAX_NAME} bytes within the {}-byte welcome", p.len()), n));
    }
    let name = std::str::from_utf8(&p[2..2 + n]).map_err(|_| rdzv_err(rank, "shm name", "UTF-8", "invalid bytes"))?;
    if !wire::is_segment_name(name) || !name.ends_with("-live") {
        return Err(rdzv_err(rank, "shm name", "/tpar-…-live", wire::printable(name, wire::MAX_TEXT)));
    }
    let liveness = ShmSegment::open(name, LIVENESS_BYTES, rank)?;
    liveness.hold_liveness(rank)?;
    let data = D::attach(spec, &p[2 + n..])?;
    write_frame(&mut s, Kind::Attached, &[], rank, &dl)?;
    match read_frame(&mut s, rank, &dl)? {
        (Kind::Go, _) => {}
        (k, _) => return Err(rdzv_err(rank, "kind", "Go", format!("{k:?}"))),
    }
    let mut streams: Vec<Option<UnixStream>> = (0..spec.world).map(|_| None).collect();
    streams[0] = Some(s);
    Ok(Joined { control: Control::new(rank, streams), liveness, data })
}

/// Maps a field name from a Reject message onto the static names this module uses.
fn static_field(f: &str) -> &'static str {
    const KNOWN: [&str; 14] = [
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
        "connections",
        "message",
    ];
    KNOWN.into_iter().find(|k| *k == f).unwrap_or("message")
}
