//! [`RankSet`]'s completion and capture: waiting for the local ranks' streams, turning a
//! device error record into an error (and poisoning), and capturing calls into one CUDA
//! graph with the captured sequences compared across the local ranks.

use super::super::abi::{self, TparError};
use super::super::driver::Graph;
use super::{RankPlacement, RankSet};
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
use crate::dtype::DType;

impl RankSet {
    /// The captured sequences, compared across the local ranks
    /// (`abi::first_captured_difference`, as a `GpuCommunicator` compares its rank's over
    /// its control plane): the first call where a rank differs from rank 0 (or made fewer
    /// calls) is a Mismatch.
    fn check_captured(&mut self) -> Result<()> {
        let seqs = std::mem::replace(&mut self.captured, vec![Vec::new(); self.ranks.len()]);
        if let Some((k, r)) = abi::first_captured_difference(&seqs) {
            // Reported as the differing rank sees it, against rank 0.
            let e = abi::captured_mismatch(r, &seqs, (k, r));
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Waits for the origin (emulated ranks) and every local rank's stream.
    pub(crate) fn synchronize_streams(&self) -> Result<()> {
        if let Some(f) = &self.fan {
            f.origin.synchronize()?;
        }
        for r in &self.ranks {
            r.stream.synchronize()?;
        }
        Ok(())
    }

    /// Where the error records come from, for their messages.
    fn record_source(&self) -> String {
        match self.placement {
            RankPlacement::Emulated => format!("emulated ranks on {}", self.dev.name),
            RankPlacement::Process { .. } => "CUDA IPC".to_string(),
        }
    }

    /// The error a kernel (or the watchdog) recorded so far on any local rank, without
    /// waiting; it poisons (the first cause stays).
    pub fn recorded_error(&mut self) -> Option<Error> {
        let source = self.record_source();
        for i in 0..self.ranks.len() {
            let rec: TparError = self.err.read(i * std::mem::size_of::<TparError>())?;
            if let Some(e) = abi::device_error(&rec, &source) {
                self.poisoned.get_or_insert_with(|| e.to_string());
                return Some(e);
            }
        }
        None
    }

    /// Waits for all enqueued work and turns any device error record into an error; a
    /// timeout poisons the set.
    pub fn synchronize(&mut self) -> Result<()> {
        let sync = self.synchronize_streams();
        if let Some(e) = self.recorded_error() {
            return Err(e);
        }
        sync
    }

    /// One all-reduce, synchronously: enqueue then synchronize.
    pub fn all_reduce(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        self.enqueue(algo, dtype, count, inputs, outputs, blocks)?;
        self.synchronize()
    }

    /// Captures whatever `body` enqueues into one CUDA graph on the origin stream (emulated
    /// ranks join through the fork/join events). Epochs advance on the device, so the graph
    /// replays correctly any number of times. Calls that `launch::registers` run zero copy:
    /// their buffers are registered here (the tables live as long as the set), so they must
    /// stay allocated while the graph may replay, as vLLM requires of its graph inputs.
    pub fn capture(&mut self, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<Graph> {
        self.check_poisoned()?;
        self.synchronize_streams()?;
        self.origin().begin_capture()?;
        self.captured = vec![Vec::new(); self.ranks.len()];
        let r = self.fork_all().and_then(|()| {
            self.capturing = true;
            let r = body(self);
            self.capturing = false;
            r
        });
        // Join every rank stream back even after an error: a capture must end joined.
        let j = self.join_all();
        let g = self.origin().end_capture();
        j?;
        r?;
        let g = g?;
        self.check_captured()?;
        // The registered calls' tables, before the graph can run.
        self.io.flush()?;
        Ok(g)
    }

    fn fork_all(&self) -> Result<()> {
        if let Some(f) = &self.fan {
            f.origin.record(&f.fork)?;
            for r in &self.ranks {
                r.stream.wait(&f.fork)?;
            }
        }
        Ok(())
    }

    fn join_all(&self) -> Result<()> {
        if let Some(f) = &self.fan {
            for (r, j) in self.ranks.iter().zip(&f.joins) {
                r.stream.record(j)?;
                f.origin.wait(j)?;
            }
        }
        Ok(())
    }

    /// Replays a captured graph on the origin stream (asynchronous).
    pub fn launch(&self, graph: &Graph) -> Result<()> {
        self.check_poisoned()?;
        graph.launch(self.origin())
    }
}
