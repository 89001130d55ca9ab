//! [`Aborter`]: ending a rank process's calls in flight from another thread (the
//! communicator's liveness watchdog) when a peer dies.

use super::super::abi::{self, TparError, TparState};
use super::super::driver::{Device, Stream};
use super::RankSet;
use crate::error::Result;

impl RankSet {
    /// What a watchdog thread needs to end this rank's calls in flight when a peer dies
    /// ([`Aborter`]): local rank 0's record and state (a rank process has one local rank).
    /// The caller must stop using it before this set is dropped.
    pub fn aborter(&self) -> Result<Aborter> {
        Ok(Aborter {
            dev: self.dev.clone(),
            stream: Stream::new(&self.dev)?,
            state: self.ranks[0].state.ptr,
            err: self.err.host as *mut TparError,
            rank: self.ranks[0].rank as u32,
        })
    }
}

/// Ends a rank's calls in flight from another thread (the GPU communicator's watchdog): it
/// fills the host-visible record with [`abi::ERR_PEER_DIED`] (every spinning thread of the
/// rank's kernels reads its code at its next clock check, `still_waiting` in frame.cuh, and
/// stops), then claims the record on the device (`TparState::err_claim`), so the next call or
/// `synchronize` raises `Error::PeerDied` naming the peer.
pub struct Aborter {
    dev: Device,
    stream: Stream,
    state: u64,
    err: *mut TparError,
    rank: u32,
}

// SAFETY: `err` points into the set's pinned host record, `state` into its device state;
// both stay allocated while the set lives, and the communicator joins the watchdog thread
// (the only user) before dropping the set. The record is written with
// volatile stores only; the device word through the driver.
unsafe impl Send for Aborter {}

impl Aborter {
    /// Fails this rank's calls in flight because `peer` died. The pinned error record first,
    /// with plain stores: waiting kernels read its code (frame.cuh `still_waiting`) and stop,
    /// even when the stream's queue is full of calls behind them, where any CUDA call of the
    /// host would wait for the queue to drain (an engine's eager step enqueues about a
    /// thousand launches before it synchronises: the abort waited for the device timeout).
    /// Then the device claim word, which keeps later kernels from writing a record of their own.
    pub fn peer_died(&self, peer: usize) -> Result<()> {
        // SAFETY: err points to the live pinned record (see the Send impl); a kernel that
        // recorded first (its code set) keeps its record.
        unsafe {
            let code = std::ptr::addr_of!((*self.err).code);
            if std::ptr::read_volatile(code) == 0 {
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).rank), self.rank);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).peer), peer as u32);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).phase), 0);
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.err).code), abi::ERR_PEER_DIED);
            }
        }
        self.dev.bind()?;
        let off = std::mem::offset_of!(TparState, err_claim) as u64;
        // SAFETY: state is the workspace's live TparState allocation (see the Send impl); the
        // claim word is an aligned word inside it.
        unsafe { super::super::driver::set_word_at_async(self.state + off, 1, &self.stream) }?;
        self.stream.synchronize()
    }
}
