//! The copy-engine path (`ce-ring`, `cuda::ce`) on emulated ranks: every rank's copies on a
//! copy stream of its own, its kernels on its rank stream, and the ranks ordered by events
//! between those streams. The copies between the ranks' buffers (all on one GPU) still go
//! through the copy engines; the data flow (regions, slots, kernels, wire) is the one rank
//! processes run, only the cross-rank ordering differs: one process enqueues every rank's
//! work in dependency order, so every event a stream waits for was recorded before, nothing
//! spins and nothing can hang (the flag protocol's waits are proven by rank processes).
//!
//! Per call: each rank's input ready (after the skew hook) -> every copy stream waits for
//! every rank's (the entry barrier) -> per piece, each rank's chunks copied out (lossy: after
//! its quantisation) -> each owner waits for the n-1 copies into it, sums, and its copy
//! stream copies the sum out -> each rank waits for the n-1 copies into it and finishes ->
//! each copy stream joins its rank stream. Eager calls fork from and join into the origin
//! stream; in a capture the group forks and joins once around the whole body.
//!
//! Owns: the per-rank copy streams, events and stages of a group, and that ordering. Must
//! never: let a copy into a rank's region start before that rank's previous call ended.

use super::ce::{CallEvents, CeKernels, Call, RankView, Steps};
use super::driver::{Device, DeviceBuffer, Event, Stream};
use crate::algorithms::ce_ring::Geometry;
use crate::error::{Error, Result};
use crate::kinds::Wire;
use crate::dtype::DType;
use std::collections::HashMap;

/// What a call needs of the group: its streams and fork/join events, and each rank's view.
pub struct Group<'a> {
    pub streams: &'a [&'a Stream],
    pub origin: &'a Stream,
    pub fork: &'a Event,
    pub joins: &'a [Event],
    pub views: Vec<RankView>,
    /// Fork from and join into the origin around the call (not inside a capture).
    pub eager: bool,
    /// Skewed-rank test hook: each rank's delay before the call, ns.
    pub delays: Vec<u32>,
}

/// A group's copy-engine state.
pub struct EmulatedCe {
    kernels: HashMap<DType, CeKernels>,
    copies: Vec<Stream>,
    events: Vec<CallEvents>,
    stages: Vec<DeviceBuffer>,
    wire: Wire,
}

impl EmulatedCe {
    /// State for `world` ranks and calls up to `max_bytes` (made with the group: never inside
    /// a capture).
    pub fn new(dev: &Device, world: usize, wire: Wire, max_bytes: usize) -> Result<Self> {
        let stage = super::ce::stage_bytes(max_bytes, world);
        Ok(Self {
            kernels: HashMap::new(),
            copies: (0..world).map(|_| Stream::new(dev)).collect::<Result<_>>()?,
            events: (0..world).map(|_| CallEvents::new(dev)).collect::<Result<_>>()?,
            stages: if wire.is_lossy() { (0..world).map(|_| DeviceBuffer::new(dev, stage)).collect::<Result<_>>()? } else { Vec::new() },
            wire,
        })
    }

    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Enqueues one all-reduce of `count` elements on every rank of `g`.
    // Rank r indexes its stream, copy stream, events and steps together: plainer by index.
    #[allow(clippy::needless_range_loop)]
    pub fn enqueue(&mut self, dev: &Device, mut g: Group<'_>, dtype: DType, count: usize, io: (&[u64], &[u64]), desc_code: u32) -> Result<()> {
        let world = g.views.len();
        if world != g.streams.len() || world != self.copies.len() || io.0.len() != world || io.1.len() != world {
            return Err(Error::invalid("ce-ring", format!("{world} ranks, {} streams, {} copy streams", g.streams.len(), self.copies.len())));
        }
        if !self.kernels.contains_key(&dtype) {
            let k = CeKernels::load(dev, dtype, self.wire)?;
            self.kernels.insert(dtype, k);
        }
        let k = self.kernels.get(&dtype).ok_or_else(|| Error::invalid("ce-ring", "kernels not loaded"))?;
        let geom = Geometry::new(count, dtype, world);
        let calls: Vec<Call> = (0..world)
            .map(|r| Call { geom, wire: self.wire, desc_code, input: io.0[r], output: io.1[r], delay_ns: g.delays.get(r).copied().unwrap_or(0) })
            .collect();
        for (r, v) in g.views.iter_mut().enumerate() {
            v.stage = self.stages.get(r).map_or(0, |s| s.ptr);
            calls[r].check(v, self.stages.get(r).map_or(0, |s| s.bytes))?;
        }
        let st = |r: usize| Steps { k, v: &g.views[r], call: &calls[r] };
        let (ev, cp, rs) = (&self.events, &self.copies, g.streams);
        if g.eager {
            g.origin.record(g.fork)?;
            for s in rs {
                s.wait(g.fork)?;
            }
        }
        for r in 0..world {
            st(r).pause(rs[r])?;
            rs[r].record(&ev[r].input)?;
        }
        // Entry barrier: no copy into any rank before every rank's previous call has ended.
        for c in cp {
            for e in ev {
                c.wait(&e.input)?;
            }
        }
        let lossy = self.wire.is_lossy();
        for p in 0..geom.pieces {
            for r in 0..world {
                if lossy {
                    st(r).quant(p, rs[r])?;
                    rs[r].record(&ev[r].quant[p])?;
                    cp[r].wait(&ev[r].quant[p])?;
                }
                st(r).rs_copies(p, &cp[r])?;
                cp[r].record(&ev[r].rs[p])?;
            }
        }
        for p in 0..geom.pieces {
            for r in 0..world {
                for q in (0..world).filter(|&q| q != r) {
                    rs[r].wait(&ev[q].rs[p])?;
                }
                st(r).reduce(p, rs[r])?;
                rs[r].record(&ev[r].reduced[p])?;
                cp[r].wait(&ev[r].reduced[p])?;
                st(r).ag_copies(p, &cp[r])?;
                cp[r].record(&ev[r].ag[p])?;
            }
        }
        for p in 0..geom.pieces {
            for r in 0..world {
                for q in (0..world).filter(|&q| q != r) {
                    rs[r].wait(&ev[q].ag[p])?;
                }
                st(r).finish(p, rs[r])?;
            }
        }
        for r in 0..world {
            cp[r].record(&ev[r].done)?;
            rs[r].wait(&ev[r].done)?;
        }
        if g.eager {
            for (s, j) in rs.iter().zip(g.joins) {
                s.record(j)?;
                g.origin.wait(j)?;
            }
        }
        Ok(())
    }
}
