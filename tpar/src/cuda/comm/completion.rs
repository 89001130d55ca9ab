//! [`GpuCommunicator`]'s completion: raising what is known without waiting, the host-bounded
//! wait for this rank's stream, and giving up on the work in flight (NCCL aborted, the
//! communicator poisoned).

use super::*;

/// Errors and completion on one rank per process.
impl GpuCommunicator {
    /// Raises what is known without waiting: a dead peer (the watchdog), an error a kernel
    /// recorded, or a poisoned state. Cheap (no synchronisation): bindings call it before
    /// every eager call.
    pub fn check_errors(&mut self) -> Result<()> {
        self.ws.check_poisoned()?;
        if let Some(e) = self.ws.recorded_error() {
            return Err(e);
        }
        if let Some(peer) = self.watchdog.dead_peer() {
            let e = Error::PeerDied { rank: self.rank(), peer, during: "its process ended (seen by this rank's liveness watchdog)".into() };
            self.ws.poison(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Waits for this rank's enqueued work on its own stream; never longer than the timeout
    /// (plus a second).
    ///
    /// tpar's kernels bound their own waits on the device (a timeout there is
    /// `Error::Timeout` naming the peer and phase), and the watchdog ends them when a peer
    /// dies. NCCL's do not: a peer that died mid-call would leave this stream waiting
    /// forever. So the host bounds the wait too: a peer whose process is gone (and whose
    /// work does not complete within 200 ms after) is `Error::PeerDied`, no completion by
    /// the deadline is `Error::Timeout`; either aborts NCCL (its kernels return) and poisons
    /// the communicator.
    pub fn synchronize(&mut self) -> Result<()> {
        self.ws.device().bind()?;
        let start = Instant::now();
        let deadline = start + self.timeout + HOST_GRACE;
        let mut next_liveness = start + LIVENESS_PERIOD;
        let mut suspect: Option<(usize, Instant)> = None;
        let mut polls = 0u32;
        while !self.ws.stream().is_done()? {
            let now = Instant::now();
            if now >= next_liveness {
                next_liveness = now + LIVENESS_PERIOD;
                match (suspect, self.control.dead_peer()) {
                    (None, Some(p)) => suspect = Some((p, now)),
                    (Some((peer, since)), _) if now.duration_since(since) >= DEAD_PEER_GRACE => {
                        let during = format!("this rank's work on its GPU stream ({} ms after the peer's process ended)", now.duration_since(since).as_millis());
                        return Err(self.abandon(Error::PeerDied { rank: self.rank(), peer, during }));
                    }
                    _ => {}
                }
            }
            if now >= deadline {
                let what = "this rank's GPU stream (tpar's kernels or NCCL) to finish; NCCL aborted".to_string();
                let waited_ms = now.duration_since(start).as_millis().min(u64::MAX as u128) as u64;
                return Err(self.abandon(Error::Timeout { rank: self.rank(), waited_ms, what }));
            }
            polls = polls.saturating_add(1);
            if polls < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.ws.synchronize()
    }

    /// Gives up on the work in flight: aborts NCCL so its kernels return, refuses further
    /// calls. tpar's own kernels end at their device deadline.
    fn abandon(&mut self, e: Error) -> Error {
        if let Ok(n) = &mut self.nccl {
            n.abort();
        }
        self.ws.poison(e.to_string());
        e
    }
}
