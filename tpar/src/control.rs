//! The control plane: the rendezvous, host-side gather / all-gather / broadcast / barrier,
//! and peer liveness. Used by the CPU backend ([`crate::CpuCommunicator`]) and by the GPU
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
//! A [`Watchdog`] asks the same locks from a thread of its own, so that a rank blocked
//! elsewhere (in its engine's synchronisation) still learns of a dead peer: the GPU
//! communicator uses it to end its calls in flight and to fail the next call.
//!
//! Owns: who the peers are, whether they are alive, and messages between them. Must never
//! block without a deadline, or map any memory but the liveness segment.

use crate::error::{Error, Result};
pub use crate::rendezvous::DataPlane;
use crate::rendezvous::{self, Control, JoinSpec};
use crate::transport::shm::ShmSegment;
use crate::transport::shm::LivenessProbe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a [`Watchdog`] (and the GPU communicator's `synchronize`) asks whether a peer's
/// process died: one `fcntl` per peer.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(10);
/// How long a dead peer's work may still complete before a [`Watchdog`] acts (a peer that
/// finished its part and exited is not a failure).
pub const DEAD_PEER_GRACE: Duration = Duration::from_millis(200);


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

/// Watches the peers' liveness from a thread of its own, so that a peer that dies while
/// this rank's host is blocked (in the engine's synchronisation, say) still ends this rank's
/// calls within [`DEAD_PEER_GRACE`] plus a period, instead of at the device deadline.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    /// 0 while every peer lives; else the dead peer + 1.
    dead: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `world` ranks' liveness for rank `rank`; `on_death(peer)` runs once, on
    /// the watchdog's thread, [`DEAD_PEER_GRACE`] after a peer's process was first seen gone.
    pub fn start(probe: LivenessProbe, rank: usize, world: usize, on_death: impl FnOnce(usize) + Send + 'static) -> Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let dead = Arc::new(AtomicUsize::new(0));
        let (s, d) = (Arc::clone(&stop), Arc::clone(&dead));
        let thread = std::thread::Builder::new()
            .name(format!("tpar-watchdog-{rank}"))
            .spawn(move || {
                let mut suspect: Option<(usize, Instant)> = None;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(LIVENESS_PERIOD);
                    match suspect {
                        None => suspect = (0..world).find(|&p| p != rank && !probe.is_alive(p)).map(|p| (p, Instant::now())),
                        Some((peer, since)) if since.elapsed() >= DEAD_PEER_GRACE => {
                            d.store(peer + 1, Ordering::SeqCst);
                            on_death(peer);
                            return;
                        }
                        Some(_) => {}
                    }
                }
            })
            .map_err(|e| Error::io(rank, "starting the liveness watchdog thread", e))?;
        Ok(Watchdog { stop, dead, thread: Some(thread) })
    }

    /// The peer found dead, if any.
    pub fn dead_peer(&self) -> Option<usize> {
        match self.dead.load(Ordering::SeqCst) {
            0 => None,
            p => Some(p - 1),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // A watchdog that panicked has nothing left to clean up; never panic here.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchdog_names_a_dead_peer_soon_after_it_died() {
        let dir = std::env::temp_dir().join(format!("tpar-watchdog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rdzv.sock");
        let spec = move |rank| JoinSpec {
            rank,
            world: 2,
            path: path.clone(),
            job_id: 0x77,
            fingerprint: 0,
            timeout: Duration::from_secs(20),
            shm_budget: 1 << 16,
            first_epoch: 0,
        };
        let peer = std::thread::spawn({
            let spec = spec.clone();
            move || ControlPlane::join::<NoDataPlane>(&spec(1)).map(|(c, _)| c)
        });
        let (me, _) = ControlPlane::join::<NoDataPlane>(&spec(0)).unwrap();
        let other = peer.join().unwrap().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let w = Watchdog::start(me.liveness_probe().unwrap(), 0, 2, move |p| {
            let _ = tx.send((p, Instant::now()));
        })
        .unwrap();
        // Alive: nothing reported.
        assert!(rx.recv_timeout(DEAD_PEER_GRACE + 5 * LIVENESS_PERIOD).is_err());
        assert_eq!(w.dead_peer(), None);
        // Rank 1's process "dies": its control plane (and liveness lock) goes.
        let died = Instant::now();
        drop(other);
        let (p, at) = rx.recv_timeout(Duration::from_secs(10)).expect("the watchdog reported the death");
        assert_eq!(p, 1);
        assert_eq!(w.dead_peer(), Some(1));
        let after = at.duration_since(died);
        assert!(after >= DEAD_PEER_GRACE, "it waited the grace ({after:?})");
        // The bound that matters to engines is 1 s; on a loaded machine the thread may be
        // scheduled late, so this checks the order of magnitude (seconds, not the timeout).
        assert!(after < Duration::from_secs(5), "reported {after:?} after the death");
        drop(w);
        drop(me);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
