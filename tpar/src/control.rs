//! The control plane: the rendezvous, host-side gather / all-gather / broadcast / barrier,
//! and peer liveness. Used by the CPU backend ([`crate::Communicator`]) and by the GPU
//! communicator alike; it knows nothing of workspaces.
//!
//! A backend that shares memory between ranks brings a [`DataPlane`]: rank 0 creates it
//! once every rank has said hello, the others attach to it with the bytes rank 0 sends in
//! the welcome, and rank 0 hears that every rank attached before anyone goes on (so rank 0
//! can unlink names). The GPU communicator brings [`NoDataPlane`]: its workspaces are set up
//! afterwards, over this control plane (CUDA IPC handles through `all_gather_bytes`).
//!
//! Liveness: every rank holds a lock byte in a small shared segment of the control plane's
//! own (POSIX shared memory, 0600, unlinked once every rank holds it). A process that exits
//! or is killed drops its lock with it, so [`ControlPlane::dead_peer`] notices within one
//! `fcntl` per peer.
//!
//! Owns: who the peers are, whether they are alive, and messages between them. Must never
//! block without a deadline, or map any memory but the liveness segment.

use crate::error::Result;
pub use crate::rendezvous::DataPlane;
use crate::rendezvous::{self, Control, JoinSpec};
use crate::transport::shm::ShmSegment;
use std::time::Duration;


/// No shared data plane: the control plane alone (the GPU communicator's case).
#[derive(Debug, Default)]
pub struct NoDataPlane;

impl DataPlane for NoDataPlane {
    fn create(_: &JoinSpec) -> Result<(Self, Vec<u8>)> {
        Ok((NoDataPlane, Vec::new()))
    }
    fn attach(_: &JoinSpec, _: &[u8]) -> Result<Self> {
        Ok(NoDataPlane)
    }
    fn all_attached(&mut self) -> Result<()> {
        Ok(())
    }
}

/// One rank's end of the control plane.
pub struct ControlPlane {
    rank: usize,
    world: usize,
    timeout: Duration,
    streams: Control,
    liveness: ShmSegment,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("rank", &self.rank).field("world", &self.world).finish()
    }
}

impl ControlPlane {
    /// Meets every rank of the job described by `spec` (rank 0 hosts it) and sets up `D`.
    pub fn join<D: DataPlane>(spec: &JoinSpec) -> Result<(ControlPlane, D)> {
        let joined = rendezvous::join::<D>(spec)?;
        let cp = ControlPlane { rank: spec.rank, world: spec.world, timeout: spec.timeout, streams: joined.control, liveness: joined.liveness };
        Ok((cp, joined.data))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// The bound on every wait of this control plane.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether some live process holds `rank`'s liveness lock (errs towards "alive").
    pub fn is_alive(&self, rank: usize) -> bool {
        self.liveness.is_alive(rank)
    }

    /// A handle on the peers' liveness for another thread (the GPU communicator's watchdog).
    pub fn liveness_probe(&self) -> Result<crate::transport::shm::LivenessProbe> {
        self.liveness.liveness_probe()
    }

    /// A peer whose process no longer holds its liveness lock (it exited or was killed), if
    /// any. Cheap: one `fcntl` per peer.
    pub fn dead_peer(&self) -> Option<usize> {
        (0..self.world).find(|&p| p != self.rank && !self.is_alive(p))
    }

    /// Every rank's bytes to rank 0, in rank order; `None` on the other ranks.
    pub fn gather_bytes(&mut self, payload: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.streams.gather(payload, self.timeout)
    }

    /// Every rank's bytes to every rank, in rank order.
    pub fn all_gather_bytes(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.streams.all_gather(payload, self.world, self.timeout)
    }

    /// Rank 0's bytes to every rank.
    pub fn broadcast_bytes(&mut self, payload: &[u8]) -> Result<Vec<u8>> {
        self.streams.broadcast(payload, self.timeout)
    }

    /// Returns once every rank has called it (or errs at the timeout, naming the peer).
    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather_bytes(&[]).map(|_| ())
    }
}
