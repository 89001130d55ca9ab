//! The host transport with one process per GPU: every rank's workspace (data and flag
//! areas) in the job's POSIX shared-memory segment (`transport::host_segment`), created by
//! rank 0, mapped by every rank process and registered with the CUDA driver in each
//! (`cuMemHostRegister` DEVICEMAP|PORTABLE), so the same kernels as for emulated ranks run on
//! the device pointers each process got — never a peer's: the same physical pages sit at
//! different addresses in different processes. Every access crosses the GPU's PCIe link,
//! which is what GPUs without peer-to-peer (consumer cards) have.
//!
//! Ordering is the kernels' own and unchanged: data polls and sends are `ld/st.volatile`
//! (relaxed, system scope), barrier flags `ld.acquire.sys` / `st.release.sys`, error records
//! `fence.sc.sys`; none of it depends on the ranks sharing a process.
//!
//! Owns: the mapping and its registration (unregistered before unmapped: field order). Must
//! never hand out a pointer of another process or keep the segment's name once every rank
//! has mapped it ([`HostWorkspace::unlink`]).

use super::abi;
use super::driver::{Device, HostRegistration};
use crate::error::Result;
use crate::transport::host_segment::{HostLayout, HostSegment};

/// This process's view of the job's host workspaces.
pub struct HostWorkspace {
    // Field order is drop order: the registration goes before the mapping it covers.
    reg: HostRegistration,
    seg: HostSegment,
}

/// The segment layout for `world` ranks of `slot_vecs` vectors per slot.
pub fn layout(world: usize, slot_vecs: usize) -> Result<HostLayout> {
    HostLayout::new(world, abi::data_bytes(world, slot_vecs), abi::FLAG_BYTES)
}

impl HostWorkspace {
    /// Rank 0: creates and initialises the segment (every push region holds `empty_word`,
    /// flags 0: epoch 0), registers it; returns the welcome bytes for the other ranks.
    pub fn create(dev: &Device, job_id: u64, rank: usize, world: usize, slot_vecs: usize, empty_word: u32) -> Result<(Self, Vec<u8>)> {
        let l = layout(world, slot_vecs)?;
        let (seg, welcome) = HostSegment::create(job_id, rank, l, abi::push_region_bytes(world, slot_vecs), empty_word)?;
        Ok((Self::register(dev, seg)?, welcome))
    }

    /// Any other rank: maps rank 0's segment (every size and header word checked) and
    /// registers it in this process.
    pub fn attach(dev: &Device, job_id: u64, rank: usize, world: usize, slot_vecs: usize, welcome: &[u8]) -> Result<Self> {
        let seg = HostSegment::attach(job_id, rank, layout(world, slot_vecs)?, welcome)?;
        Self::register(dev, seg)
    }

    fn register(dev: &Device, seg: HostSegment) -> Result<Self> {
        // SAFETY: the whole mapping of `seg`, which is moved into the same value and dropped
        // after the registration (field order).
        let reg = unsafe { HostRegistration::new(dev, seg.as_ptr(), seg.len())? };
        Ok(Self { reg, seg })
    }

    /// Rank `q`'s data area, as this process's device pointer.
    pub fn data_ptr(&self, q: usize) -> u64 {
        self.reg.dev + self.seg.layout().data_offset(q) as u64
    }

    /// Rank `q`'s flag area, as this process's device pointer.
    pub fn flag_ptr(&self, q: usize) -> u64 {
        self.reg.dev + self.seg.layout().flag_offset(q) as u64
    }

    /// The segment's name (gone from /dev/shm after [`unlink`](Self::unlink)).
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// Removes the segment's name once every rank has mapped it (rank 0; a no-op elsewhere).
    pub fn unlink(&mut self) -> Result<()> {
        self.seg.unlink()
    }
}
