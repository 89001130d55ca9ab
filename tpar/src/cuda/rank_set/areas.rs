//! Where a rank set's workspaces live, by placement: every rank's areas in this process
//! (emulated ranks: device memory, or pinned host memory mapped into the device), or this
//! rank's areas exported through CUDA IPC with the peers' opened from their handle bytes, or
//! the job's shared host segment (rank processes over the host transport).
//!
//! Owns: the data and flag areas and the peers' mappings, and the table of device pointers
//! to every rank's areas that the kernels take. Must never refill a push region that peers
//! of another process may be writing into (rank processes initialise their areas once,
//! before any handle is given out); emulated ranks refill theirs between calls only, with
//! every stream idle.

use super::super::abi::{self, MAX_RANKS};
use super::super::driver::{Device, DeviceBuffer, HostMapped, IpcMapping};
use super::super::host_ws::HostWorkspace;
use crate::error::{Error, Result};
use crate::kinds::Transport;

/// Bytes of one rank's handle blob: the data-area handle, then the flag-area handle.
pub const HANDLE_BLOB_BYTES: usize = 128;

/// An emulated rank's area: device memory (what IPC-mapped peers would be) or pinned host
/// memory mapped into the device.
pub(super) enum Mem {
    Device(DeviceBuffer),
    Host(HostMapped),
}

impl Mem {
    pub(super) fn new(dev: &Device, transport: Transport, bytes: usize) -> Result<Self> {
        Ok(match transport {
            Transport::Host => Mem::Host(HostMapped::new(dev, bytes)?),
            _ => Mem::Device(DeviceBuffer::new(dev, bytes)?),
        })
    }
    fn ptr(&self) -> u64 {
        match self {
            Mem::Device(b) => b.ptr,
            Mem::Host(h) => h.dev,
        }
    }
    /// Fills the first `bytes` with `word`. No kernel may be using the memory.
    fn fill_prefix(&self, bytes: usize, word: u32) -> Result<()> {
        match self {
            Mem::Device(b) => b.fill_prefix_u32(bytes, word),
            Mem::Host(h) => {
                for off in (0..bytes.min(h.bytes)).step_by(4) {
                    h.write(off, word);
                }
                Ok(())
            }
        }
    }
}

/// Every rank's data and flag areas, as this process holds them.
pub(super) enum Areas {
    /// Emulated ranks: every rank's areas, in this process.
    Local { data: Vec<Mem>, flags: Vec<Mem> },
    /// A rank process over p2p: its own areas (`cuMemAlloc`, so they can be exported) and
    /// the peers' opened through CUDA IPC (`None` until `connect`, and for itself).
    Ipc { data: DeviceBuffer, flags: DeviceBuffer, peer_data: Vec<Option<IpcMapping>>, peer_flags: Vec<Option<IpcMapping>> },
    /// A rank process over the host transport: the job's shared segment (`None` until
    /// `connect` on the ranks that attach; rank 0 creates it).
    HostSegment { job_id: u64, ws: Option<HostWorkspace>, welcome: Vec<u8> },
}

/// The areas and the pointer table the kernels take (`TparArgs::data` / `flags`).
pub(super) struct Workspaces {
    pub(super) areas: Areas,
    pub(super) data_ptrs: [u64; MAX_RANKS],
    pub(super) flag_ptrs: [u64; MAX_RANKS],
    pub(super) connected: bool,
}

impl Workspaces {
    /// Emulated ranks' areas (`data[q]`, `flags[q]`: rank q's), every pointer known at once.
    pub(super) fn local(data: Vec<Mem>, flags: Vec<Mem>) -> Self {
        let (mut data_ptrs, mut flag_ptrs) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        for (q, (d, f)) in data.iter().zip(&flags).enumerate().take(MAX_RANKS) {
            data_ptrs[q] = d.ptr();
            flag_ptrs[q] = f.ptr();
        }
        Self { areas: Areas::Local { data, flags }, data_ptrs, flag_ptrs, connected: true }
    }

    /// Rank `rank`'s areas of a multi-process group over `transport`, initialised (push
    /// region empty, flags 0) before any peer can see them. Over the host transport rank 0
    /// creates the job's segment (every rank's areas); the others map it in `connect`.
    pub(super) fn process(dev: &Device, transport: Transport, rank: usize, world: usize, slot_vecs: usize, job_id: u64) -> Result<Self> {
        let word = abi::EMPTY_WORD;
        let (mut data_ptrs, mut flag_ptrs) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        let areas = match transport {
            Transport::Host if rank == 0 => {
                let (ws, welcome) = HostWorkspace::create(dev, job_id, rank, world, slot_vecs, word)?;
                for q in 0..world {
                    data_ptrs[q] = ws.data_ptr(q);
                    flag_ptrs[q] = ws.flag_ptr(q);
                }
                Areas::HostSegment { job_id, ws: Some(ws), welcome }
            }
            Transport::Host => Areas::HostSegment { job_id, ws: None, welcome: Vec::new() },
            _ => {
                let data = DeviceBuffer::new(dev, abi::data_bytes(world, slot_vecs))?;
                let flags = DeviceBuffer::new(dev, abi::FLAG_BYTES)?;
                data.fill_u32(0)?;
                data.fill_prefix_u32(abi::push_region_bytes(world, slot_vecs), word)?;
                flags.fill_u32(0)?;
                data_ptrs[rank] = data.ptr;
                flag_ptrs[rank] = flags.ptr;
                Areas::Ipc { data, flags, peer_data: (0..world).map(|_| None).collect(), peer_flags: (0..world).map(|_| None).collect() }
            }
        };
        Ok(Self { areas, data_ptrs, flag_ptrs, connected: false })
    }

    /// The transport of these areas.
    pub(super) fn transport(&self) -> Transport {
        match &self.areas {
            Areas::Local { data, .. } => match data.first() {
                Some(Mem::Host(_)) => Transport::Host,
                _ => Transport::P2p,
            },
            Areas::Ipc { .. } => Transport::P2p,
            Areas::HostSegment { .. } => Transport::Host,
        }
    }

    /// The bytes every peer needs to map this rank's areas. Host transport: rank 0's are the
    /// shared segment's welcome, the others' are empty. Emulated ranks have none to give.
    pub(super) fn handle_blob(&self) -> Result<Vec<u8>> {
        match &self.areas {
            Areas::Ipc { data, flags, .. } => {
                let mut v = Vec::with_capacity(HANDLE_BLOB_BYTES);
                v.extend_from_slice(&data.ipc_handle()?);
                v.extend_from_slice(&flags.ipc_handle()?);
                Ok(v)
            }
            Areas::HostSegment { welcome, .. } => Ok(welcome.clone()),
            Areas::Local { .. } => Err(Error::invalid("handle_blob", "emulated ranks share one process: there is nothing to exchange")),
        }
    }

    /// Maps every peer's areas from `blobs[q]` (rank `rank`'s own entry is ignored).
    pub(super) fn connect(&mut self, dev: &Device, rank: usize, world: usize, slot_vecs: usize, blobs: &[Vec<u8>]) -> Result<()> {
        if blobs.len() != world {
            return Err(Error::invalid("blobs", format!("need {world} handle blobs, got {}", blobs.len())));
        }
        match &mut self.areas {
            Areas::Local { .. } => {}
            Areas::HostSegment { job_id, ws, .. } => {
                if ws.is_none() {
                    let w = HostWorkspace::attach(dev, *job_id, rank, world, slot_vecs, &blobs[0])?;
                    for q in 0..world {
                        // This process's own device pointers to every rank's areas.
                        self.data_ptrs[q] = w.data_ptr(q);
                        self.flag_ptrs[q] = w.flag_ptr(q);
                    }
                    *ws = Some(w);
                }
            }
            Areas::Ipc { peer_data, peer_flags, .. } => {
                for (q, b) in blobs.iter().enumerate() {
                    if q == rank {
                        continue;
                    }
                    if b.len() != HANDLE_BLOB_BYTES {
                        return Err(Error::Rendezvous { rank, field: "cuda ipc handles", expected: format!("{HANDLE_BLOB_BYTES} bytes"), got: format!("{} bytes from rank {q}", b.len()) });
                    }
                    let mut h = [0u8; 64];
                    h.copy_from_slice(&b[..64]);
                    let d = IpcMapping::open(dev, &h)?;
                    h.copy_from_slice(&b[64..]);
                    let f = IpcMapping::open(dev, &h)?;
                    self.data_ptrs[q] = d.ptr;
                    self.flag_ptrs[q] = f.ptr;
                    peer_data[q] = Some(d);
                    peer_flags[q] = Some(f);
                }
            }
        }
        self.connected = true;
        Ok(())
    }

    /// Once every rank has connected: the host segment's name goes (rank 0).
    pub(super) fn all_attached(&mut self) -> Result<()> {
        match &mut self.areas {
            Areas::HostSegment { ws: Some(w), .. } => w.unlink(),
            _ => Ok(()),
        }
    }

    /// Emulated ranks only: refills every push region with the empty sentinel and every flag
    /// with `epoch` (no kernel may be running).
    pub(super) fn refill_local(&self, world: usize, slot_vecs: usize, epoch: u32) -> Result<()> {
        if let Areas::Local { data, flags } = &self.areas {
            let push = abi::push_region_bytes(world, slot_vecs);
            for r in 0..world {
                data[r].fill_prefix(push, abi::EMPTY_WORD)?;
                flags[r].fill_prefix(abi::FLAG_BYTES, epoch)?;
            }
        }
        Ok(())
    }
}
