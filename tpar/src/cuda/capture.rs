//! Checked captures of a [`GpuCommunicator`]: the calls captured into a CUDA graph between
//! [`begin_capture_check`](GpuCommunicator::begin_capture_check) and
//! [`end_capture_check`](GpuCommunicator::end_capture_check) run without per-call
//! descriptors and are compared across ranks over the control plane once, when the capture
//! ends (docs/cuda.md, "Call descriptors").
//!
//! Owns: the recording and the comparison. Must never let a mismatched capture pass: the
//! communicator is poisoned (the graph must not be replayed).

use super::comm::GpuCommunicator;
use crate::error::{Error, Result};

impl GpuCommunicator {
    /// Starts a checked capture: from now until [`end_capture_check`](Self::end_capture_check),
    /// calls made in graph mode are recorded on the host and launched without a per-call
    /// descriptor (the kernels then skip the descriptor exchange); eager calls in between keep
    /// theirs. Every rank must bracket the same capture. Without this bracket, captured calls
    /// carry descriptors as eager ones do.
    pub fn begin_capture_check(&mut self) -> Result<()> {
        self.ws.check_poisoned()?;
        if self.captured.is_some() {
            return Err(Error::invalid("capture", "begin_capture_check called twice without end_capture_check"));
        }
        if self.check_calls {
            self.captured = Some(Vec::new());
        }
        Ok(())
    }

    /// Ends a checked capture: every rank's captured call sequence is compared over the
    /// control plane (a 16-byte digest; the sequences themselves only when digests differ).
    /// Returns how many calls this rank captured. When the ranks differ, every rank gets
    /// `Error::Mismatch` naming the first differing call, and the communicator is poisoned
    /// (the captured graph must not be replayed: its kernels carry no descriptor to catch it).
    pub fn end_capture_check(&mut self) -> Result<usize> {
        let Some(seq) = self.captured.take() else {
            self.ws.check_poisoned()?;
            return Ok(0);
        };
        let digest = |s: &[u64]| {
            let bytes: Vec<u8> = s.iter().flat_map(|c| c.to_le_bytes()).collect();
            crate::units::fnv1a64(&bytes)
        };
        let mut mine = Vec::with_capacity(16);
        mine.extend_from_slice(&(seq.len() as u64).to_le_bytes());
        mine.extend_from_slice(&digest(&seq).to_le_bytes());
        let all = self.control.all_gather_bytes(&mine)?;
        if all.iter().all(|d| *d == mine) {
            return Ok(seq.len());
        }
        let bytes: Vec<u8> = seq.iter().flat_map(|c| c.to_le_bytes()).collect();
        let seqs: Vec<Vec<u64>> = self
            .control
            .all_gather_bytes(&bytes)?
            .iter()
            .map(|b| b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
            .collect();
        let e = match super::abi::first_captured_difference(&seqs) {
            Some(d) => super::abi::captured_mismatch(self.rank(), &seqs, d),
            None => Error::invalid("capture", "the captured sequences' digests differ but their calls do not"),
        };
        self.ws.poison(e.to_string());
        Err(e)
    }
}
