//! The CPU backend's data plane: one POSIX shared-memory workspace for the whole job,
//! created by rank 0 during the rendezvous and mapped by every rank.
//!
//! Owns: creating the segment (0600), its welcome bytes (size, chunk capacity, first epoch,
//! name) and checking every field of them and of the segment's header on attach. Must never
//! trust a size or name it has not checked, or leave the name behind once all attached.

use crate::control::DataPlane;
use crate::error::{Error, Result};
use crate::protocol::Word;
use crate::rendezvous::JoinSpec;
use crate::transport::shm::ShmSegment;
use crate::workspace::{hdr, Layout, Workspace, LAYOUT_VERSION, MAGIC};

/// The mapped workspace of a CPU job.
pub struct ShmWorkspace {
    pub shm: ShmSegment,
    pub layout: Layout,
    pub first_epoch: u32,
}

fn field(rank: usize, field: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Rendezvous { rank, field, expected: expected.to_string(), got: got.to_string() }
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
        if p.len() < 20 {
            return Err(field(rank, "welcome length", ">= 20", p.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3], p[i + 4], p[i + 5], p[i + 6], p[i + 7]]);
        let bytes = u64_at(0) as usize;
        let cap = u64_at(8) as usize;
        let first_epoch = u32::from_le_bytes([p[16], p[17], p[18], p[19]]);
        let name = String::from_utf8(p[20..].to_vec()).map_err(|_| field(rank, "shm name", "UTF-8", "invalid bytes"))?;
        if !name.starts_with("/tpar-") || name.len() > 200 {
            return Err(field(rank, "shm name", "/tpar-…", name));
        }
        let layout = Layout::new(spec.world, cap)?;
        if layout.bytes() != bytes {
            return Err(field(rank, "shm size", layout.bytes(), bytes));
        }
        let shm = ShmSegment::open(&name, bytes, rank)?;
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
        }
        Ok(ShmWorkspace { shm, layout, first_epoch })
    }

    fn all_attached(&mut self) -> Result<()> {
        self.shm.unlink()
    }
}
