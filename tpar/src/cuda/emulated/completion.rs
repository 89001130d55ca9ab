//! [`EmulatedGroup`]'s completion and capture: waiting for the rank streams, turning a device
//! error record into an error (and poisoning), and capturing calls into one CUDA graph with
//! the captured sequences compared across ranks.

use super::*;

/// Completion, device errors and graph capture on emulated ranks.
impl EmulatedGroup {
    /// The captured sequences, compared across ranks (`abi::first_captured_difference`, as a
    /// `GpuCommunicator` compares them over its control plane): the first call where a rank
    /// differs from rank 0 (or made fewer calls) is a Mismatch.
    fn check_captured(&mut self) -> Result<()> {
        let seqs = std::mem::take(&mut self.captured);
        if let Some((k, r)) = abi::first_captured_difference(&seqs) {
            // Reported as the differing rank sees it, against rank 0.
            let e = abi::captured_mismatch(r, &seqs, (k, r));
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    pub(super) fn synchronize_streams(&self) -> Result<()> {
        self.origin.synchronize()?;
        for s in &self.streams {
            s.synchronize()?;
        }
        Ok(())
    }

    /// Waits for all enqueued work and turns any device error record into an error; a
    /// timeout poisons the group.
    pub fn synchronize(&mut self) -> Result<()> {
        let sync = self.synchronize_streams();
        if let Some(e) = self.take_device_error() {
            return Err(e);
        }
        sync
    }

    fn take_device_error(&mut self) -> Option<Error> {
        for r in 0..self.world {
            let rec: TparError = self.err.read(r * std::mem::size_of::<TparError>())?;
            if let Some(e) = abi::device_error(&rec, &format!("emulated ranks on {}", self.dev.name)) {
                self.poisoned = Some(e.to_string());
                return Some(e);
            }
        }
        None
    }

    /// One all-reduce, synchronously: enqueue then synchronize.
    pub fn all_reduce(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        self.enqueue(algo, dtype, count, inputs, outputs, blocks)?;
        self.synchronize()
    }

    /// Captures whatever `body` enqueues into one CUDA graph (on the origin stream; the rank
    /// streams join through the fork/join events). Epochs advance on the device, so the graph
    /// replays correctly any number of times. Calls that `launch::registers` run zero copy:
    /// their buffers are registered here (the tables live as long as the group), so they
    /// must stay allocated while the graph may replay, as vLLM requires of its graph inputs.
    pub fn capture(&mut self, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<Graph> {
        self.check_usable()?;
        self.synchronize_streams()?;
        self.origin.begin_capture()?;
        self.captured = vec![Vec::new(); self.world];
        let r = self.fork_all().and_then(|()| {
            self.capturing = true;
            let r = body(self);
            self.capturing = false;
            r
        });
        // Join every rank stream back even after an error: a capture must end joined.
        let j = self.join_all();
        let g = self.origin.end_capture();
        j?;
        r?;
        let g = g?;
        self.check_captured()?;
        // The registered calls' tables, before the graph can run.
        self.io.flush()?;
        Ok(g)
    }

    fn fork_all(&self) -> Result<()> {
        self.origin.record(&self.fork)?;
        for s in &self.streams {
            s.wait(&self.fork)?;
        }
        Ok(())
    }

    fn join_all(&self) -> Result<()> {
        for (s, j) in self.streams.iter().zip(&self.joins) {
            s.record(j)?;
            self.origin.wait(j)?;
        }
        Ok(())
    }

    /// Replays a captured graph on the origin stream (asynchronous).
    pub fn launch(&self, graph: &Graph) -> Result<()> {
        self.check_usable()?;
        graph.launch(&self.origin)
    }
}
