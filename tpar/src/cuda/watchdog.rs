//! The GPU communicator's liveness watchdog: a thread that asks every few milliseconds
//! whether a peer's process died (one `fcntl` per peer on the control plane's liveness
//! locks), and when one did and this rank's calls have had [`DEAD_PEER_GRACE`] to finish,
//! ends them ([`Aborter`]) and tells the communicator, whose next call raises
//! `Error::PeerDied` naming the peer. Without it a rank blocked in its engine's
//! synchronisation would wait for the kernels' device deadline (30 s by default).
//!
//! Owns: the thread, joined on drop. Must never panic, and never outlive the workspace the
//! aborter writes into (the communicator drops it first).

use super::ipc::Aborter;
use crate::error::{Error, Result};
use crate::transport::shm::LivenessProbe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the watchdog (and `GpuCommunicator::synchronize`) asks whether a peer's
/// process died: one `fcntl` per peer.
pub(crate) const LIVENESS_PERIOD: Duration = Duration::from_millis(10);
/// How long a dead peer's work may still complete before this rank's calls in flight are
/// ended (a peer that finished its part and exited is not a failure).
pub(crate) const DEAD_PEER_GRACE: Duration = Duration::from_millis(200);

/// Watches the peers' liveness from a thread of its own, so that a peer that dies while
/// this rank's host is blocked (in the engine's synchronisation, say) still ends this rank's
/// calls within [`DEAD_PEER_GRACE`] plus a period, instead of at the device deadline.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    /// 0 while every peer lives; else the dead peer + 1.
    dead: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn start(probe: LivenessProbe, rank: usize, world: usize, aborter: Aborter) -> Result<Watchdog> {
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
                            if let Err(e) = aborter.peer_died(peer) {
                                tracing::warn!("tpar: rank {rank}: could not end the calls in flight after rank {peer} died: {e}");
                            }
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
    pub(crate) fn dead_peer(&self) -> Option<usize> {
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
