//! The CPU backend's data plane: one POSIX shared-memory workspace for the whole job,
//! created by rank 0 during the rendezvous and mapped by every rank.
//!
//! Owns: creating the segment (0600), its welcome bytes (size, chunk capacity, first epoch,
//! name) and checking every field of them and of the segment's header on attach. Must never
//! trust a size or name it has not checked, or leave the name behind once all attached.

use crate::control::DataPlane;
use crate::error::{Error, Result};
use crate::protocol::Word;
use crate::rendezvous::wire::{is_segment_name, printable, MAX_NAME, MAX_TEXT};
use crate::rendezvous::JoinSpec;
use crate::transport::shm::ShmSegment;
use crate::workspace::{hdr, Layout, Workspace, LAYOUT_VERSION, LINE_WORDS, MAGIC, MAX_WORKSPACE_BYTES, MIN_CAP_WORDS};

/// Bytes of the welcome before the name: size, chunk capacity, first epoch.
const WELCOME_FIXED: usize = 20;

/// The mapped workspace of a CPU job.
pub struct ShmWorkspace {
    pub shm: ShmSegment,
    pub layout: Layout,
    pub first_epoch: u32,
}

fn field(rank: usize, field: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Rendezvous { rank, field, expected: expected.to_string(), got: got.to_string() }
}

/// What a welcome's chunk capacity must be for a segment of `bytes`: from the least chunk
/// tpar makes to the words the segment holds. A segment smaller than the least chunk admits
/// none, and the message says so rather than print the range backwards.
fn cap_range(bytes: usize) -> String {
    let most = bytes / 8;
    if most < MIN_CAP_WORDS {
        format!("at least {MIN_CAP_WORDS} words, a multiple of {LINE_WORDS}, which a segment of {bytes} bytes ({most} words) cannot hold")
    } else {
        format!("{MIN_CAP_WORDS} to {most} words, a multiple of {LINE_WORDS}")
    }
}

impl DataPlane for ShmWorkspace {
    fn create(spec: &JoinSpec) -> Result<(Self, Vec<u8>)> {
        let layout = Layout::for_budget(spec.world, spec.shm_budget)?;
        let name = format!("/tpar-{:016x}-{}-{:08x}", spec.job_id, std::process::id(), rand::random::<u32>());
        let shm = ShmSegment::create(&name, layout.bytes(), 0)?;
        Workspace::new(layout, shm.words())?.init(spec.job_id, spec.first_epoch, crate::protocol::barrier_init(spec.first_epoch));
        let mut welcome = Vec::new();
        welcome.extend_from_slice(&(layout.bytes() as u64).to_le_bytes());
        welcome.extend_from_slice(&(layout.cap as u64).to_le_bytes());
        welcome.extend_from_slice(&spec.first_epoch.to_le_bytes());
        welcome.extend_from_slice(name.as_bytes());
        Ok((ShmWorkspace { shm, layout, first_epoch: spec.first_epoch }, welcome))
    }

    fn attach(spec: &JoinSpec, p: &[u8]) -> Result<Self> {
        let rank = spec.rank;
        if p.len() < WELCOME_FIXED {
            return Err(field(rank, "welcome length", format!("at least {WELCOME_FIXED} bytes"), p.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3], p[i + 4], p[i + 5], p[i + 6], p[i + 7]]);
        let (bytes, cap) = (u64_at(0), u64_at(8));
        let first_epoch = u32::from_le_bytes([p[16], p[17], p[18], p[19]]);
        let name = std::str::from_utf8(&p[WELCOME_FIXED..]).map_err(|_| field(rank, "shm name", "UTF-8", "invalid bytes"))?;
        if !is_segment_name(name) {
            return Err(field(rank, "shm name", format!("/tpar-… (letters, digits, dashes) of at most {MAX_NAME} bytes"), printable(name, MAX_TEXT)));
        }
        // Every size is bounded before any arithmetic or allocation uses it: the segment's
        // size by what tpar ever creates, the chunk by the segment, and the two must agree
        // with this build's layout exactly (and later with the segment's real size).
        let bytes = usize::try_from(bytes).ok().filter(|b| *b <= MAX_WORKSPACE_BYTES && b % 8 == 0).ok_or_else(|| {
            field(rank, "shm size", format!("a multiple of 8 of at most {MAX_WORKSPACE_BYTES} bytes"), bytes)
        })?;
        let cap_ok = usize::try_from(cap)
            .ok()
            .filter(|c| (MIN_CAP_WORDS..=bytes / 8).contains(c) && c % LINE_WORDS == 0);
        let Some(cap) = cap_ok else {
            return Err(field(rank, "cap", cap_range(bytes), cap));
        };
        let layout = Layout::new(spec.world, cap).map_err(|e| field(rank, "cap", format!("a layout of {bytes} bytes"), format!("{cap} words ({e})")))?;
        if layout.bytes() != bytes {
            return Err(field(rank, "shm size", format!("{} bytes (the layout of {cap} words at {} ranks)", layout.bytes(), spec.world), bytes));
        }
        let shm = ShmSegment::open(name, bytes, rank)?;
        {
            let ws = Workspace::new(layout, shm.words())?;
            let h = ws.header();
            let magic = h[hdr::MAGIC].load_acquire();
            if magic != MAGIC {
                return Err(field(rank, "shm magic", format!("{MAGIC:#x}"), format!("{magic:#x}")));
            }
            // A rank of another build must not read this layout as its own.
            let version = h[hdr::VERSION].load_acquire();
            if version != LAYOUT_VERSION {
                return Err(field(rank, "shm layout version", LAYOUT_VERSION, version));
            }
            let job = h[hdr::JOB].load_acquire();
            if job != spec.job_id {
                return Err(field(rank, "shm job_id", format!("{:#x}", spec.job_id), format!("{job:#x}")));
            }
            let world = h[hdr::WORLD].load_acquire();
            if world != spec.world as u64 {
                return Err(field(rank, "shm world", spec.world, world));
            }
            let (h_cap, h_total) = (h[hdr::CAP].load_acquire(), h[hdr::TOTAL].load_acquire());
            if h_cap != cap as u64 || h_total != layout.total as u64 {
                return Err(field(rank, "shm cap", format!("{cap} words, {} in all (the welcome)", layout.total), format!("{h_cap} words, {h_total} in all")));
            }
            let h_epoch = h[hdr::FIRST_EPOCH].load_acquire();
            if h_epoch != first_epoch as u64 {
                return Err(field(rank, "shm first epoch", first_epoch, h_epoch));
            }
        }
        Ok(ShmWorkspace { shm, layout, first_epoch })
    }

    fn all_attached(&mut self) -> Result<()> {
        self.shm.unlink()
    }
}
