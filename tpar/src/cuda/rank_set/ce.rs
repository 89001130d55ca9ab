//! [`RankSet`]'s copy-engine path (`ce-ring`): one state and data flow (`cuda::ce::CePath`:
//! regions, slots, kernels, wire, a lane per local rank); rank processes order each other by
//! flags on the device, emulated ranks by events between their streams (one process enqueues
//! every rank's work in dependency order, so nothing spins and nothing can hang).

use super::super::abi::{self, TparError};
use super::super::ce::{CePath, Fan, Order};
use super::super::driver::Stream;
use super::RankSet;
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
use crate::dtype::DType;

impl RankSet {
    /// Sets up a rank process's copy-engine path (`ce-ring`) with `wire` on the wire: its
    /// streams, events, generation words and (lossy wire) stage. At init, never inside a
    /// capture. Emulated ranks set theirs up when made.
    pub(crate) fn enable_ce(&mut self, wire: crate::kinds::Wire) -> Result<()> {
        if self.fan.is_none() {
            self.ce = Some(CePath::new(&self.dev, wire, self.slot_vecs * abi::VEC_BYTES, self.world, 1)?);
        }
        Ok(())
    }

    /// What `ce-ring` puts on the wire here.
    pub fn wire(&self) -> crate::kinds::Wire {
        self.ce.as_ref().map_or(crate::kinds::Wire::Exact, CePath::wire)
    }

    /// Local rank i's view for the copy-engine path.
    fn ce_view(&self, i: usize) -> super::super::ce::RankView {
        let (region, region_cap) = super::super::ce::region_of(self.world, self.slot_vecs);
        super::super::ce::RankView {
            data: self.ws.data_ptrs,
            flags: self.ws.flag_ptrs,
            state: self.ranks[i].state.ptr,
            err: self.err.dev + (i * std::mem::size_of::<TparError>()) as u64,
            rank: self.ranks[i].rank,
            world: self.world,
            timeout_ns: self.timeout_ns,
            region,
            region_cap,
            gens: 0,
            stage: 0,
        }
    }

    fn no_ce(&self) -> Error {
        Error::Unsupported { what: format!("ce-ring over {}", self.ws.transport()), reason: "the copy-engine path is not set up on this rank set (the registry runs it over p2p and host; rank processes: enable_ce)".into() }
    }

    /// Loads the copy-engine kernels of `dtype` and checks that a call of `bytes` fits (at
    /// resolution, outside any capture; every call checks again).
    pub(crate) fn ce_prepare(&mut self, dtype: DType, bytes: usize) -> Result<()> {
        let (dev, view) = (self.dev.clone(), self.ce_view(0));
        match self.ce.as_mut() {
            Some(c) => c.prepare(&dev, dtype, bytes / dtype.size(), view),
            None => Err(self.no_ce()),
        }
    }

    /// `ce-ring` on every local rank (`desc_code`: what each announces; 0: no check).
    pub(super) fn enqueue_ce(&mut self, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], present: &[bool]) -> Result<()> {
        let code = if self.check_calls { abi::desc_code(Algorithm::CeRing, dtype) } else { 0 };
        self.ce_launch(dtype, count, inputs, outputs, present, code)
    }

    /// Enqueues `ce-ring` with `desc_code` announced (0: no per-call check).
    pub(crate) fn ce_launch(&mut self, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], present: &[bool], desc_code: u32) -> Result<()> {
        self.check_connected()?;
        if present.iter().any(|p| !p) {
            return Err(Error::Unsupported { what: "ce-ring with absent ranks".into(), reason: "its emulated ranks order each other with events: nothing waits on the device, so there is no timeout to test".into() });
        }
        if count == 0 || count.checked_mul(dtype.size()).map_or(true, |b| b > self.max_bytes) {
            return Err(Error::invalid("count", format!("{count} elements of {dtype}: must be positive and fit max_bytes {}", self.max_bytes)));
        }
        super::super::launch::check_pointers(inputs)?;
        super::super::launch::check_pointers(outputs)?;
        if self.capturing && desc_code != 0 {
            for seq in &mut self.captured {
                seq.push(abi::pack_call(count, desc_code));
            }
        }
        let views: Vec<super::super::ce::RankView> = (0..self.ranks.len()).map(|i| self.ce_view(i)).collect();
        let streams: Vec<&Stream> = self.ranks.iter().map(|r| &r.stream).collect();
        // The skewed-rank hook delays emulated ranks only (a rank process's skew is its own).
        let (order, delays): (Order<'_>, Vec<u32>) = match (&self.fan, streams.first()) {
            (Some(f), _) => (
                Order::Events(Fan { streams: &streams, origin: &f.origin, fork: &f.fork, joins: &f.joins, eager: !self.capturing }),
                self.ranks.iter().map(|r| self.skew_ns(r.rank)).collect(),
            ),
            (None, Some(main)) => (Order::Flags { main }, Vec::new()),
            (None, None) => return Err(self.no_ce()),
        };
        let Some(c) = self.ce.as_mut() else {
            return Err(self.no_ce());
        };
        c.enqueue(&self.dev, order, &views, dtype, count, (inputs, outputs), &delays, desc_code)?;
        self.launches += 1;
        Ok(())
    }

}
