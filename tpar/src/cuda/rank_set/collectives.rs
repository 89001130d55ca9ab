//! The all-gather and the reduce-scatter on the rank set: the all-reduce's launch path
//! (one resolve, one kernel argument, one completion, capture and abort), with the entry of
//! the collective and a descriptor that names it (`abi::collective_desc_code`), so that a
//! rank calling one collective while a peer calls another gets a Mismatch. Captured calls of
//! an emulated group are registered as the all-reduce's are (one-shot pull reads every input
//! in place from its size on).

use super::{RankSet, CallSpec};
use crate::cuda::{abi, io_tables};
use crate::cuda::launch::Launch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Collective};

impl RankSet {
    /// Enqueues one call of `collective` of `count` elements per rank (as
    /// [`Collective::io_elems`] counts them) on every local rank (asynchronous), as
    /// [`enqueue`](Self::enqueue) does the all-reduce. `inputs[i]` / `outputs[i]` are local
    /// rank i's device pointers, 16-byte aligned, holding `io_elems(count, world)` elements;
    /// an all-gather's or a reduce-scatter's output never overlaps any local rank's input.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_collective(&mut self, collective: Collective, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        if collective == Collective::AllReduce {
            return self.enqueue(algo, dtype, count, inputs, outputs, blocks);
        }
        self.check_connected()?;
        let n = self.ranks.len();
        if inputs.len() != n || outputs.len() != n {
            return Err(Error::invalid("inputs", format!("need one input and output per local rank ({n})")));
        }
        let (ins, outs) = collective.io_elems(count, self.world);
        let size = dtype.size();
        if let Some((q, p)) = overlap(inputs, outputs, (ins * size) as u64, (outs * size) as u64) {
            return Err(Error::invalid("output", format!("local rank {q}'s {collective} output overlaps local rank {p}'s input")));
        }
        let ptrs: Vec<u64> = inputs.iter().chain(outputs.iter()).copied().collect();
        // Inside an emulated group's capture the buffers are registered where the all-reduce's
        // would be (one-shot pull from its size on: its kernel reads every input in place,
        // kernels/oneshot_pull.cu); outputs never overlap inputs here (checked above).
        let registered = self.capturing && self.registers_when_captured(algo, count.saturating_mul(size));
        let l = self.launcher.prepare(&self.dev, CallSpec { algo, dtype, count, blocks, registered, collective }, &ptrs)?;
        let code = if self.check_calls { abi::collective_desc_code(algo, dtype, collective) } else { 0 };
        let all = vec![true; n];
        let io = if registered { Some(io_tables::table(inputs, outputs)) } else { None };
        self.launch_all(&l, (count, code), (inputs, outputs, io), &all, None)
    }

    /// Resolves a call shape of `collective` ([`Launcher::resolve_collective`](crate::cuda::launch::Launcher::resolve_collective)):
    /// once per shape; launch it with [`launch_resolved`](Self::launch_resolved) and
    /// `abi::collective_desc_code`.
    pub fn resolve_collective(&mut self, collective: Collective, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32) -> Result<Launch> {
        self.launcher.resolve_collective(&self.dev, collective, algo, dtype, bytes, blocks)
    }
}

/// The first (output's rank, input's rank) whose buffers overlap, every output against every
/// input: the ranks of one process share an address space, and the pull kernels read every
/// rank's input (in place where the call is registered) while any rank writes its output.
fn overlap(inputs: &[u64], outputs: &[u64], in_bytes: u64, out_bytes: u64) -> Option<(usize, usize)> {
    outputs.iter().enumerate().find_map(|(q, o)| inputs.iter().position(|i| *i < o.saturating_add(out_bytes) && *o < i.saturating_add(in_bytes)).map(|p| (q, p)))
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn an_output_overlapping_any_ranks_input_is_found() {
        // Two ranks, inputs of 256 bytes, outputs of 512 (an all-gather of 2).
        let (ins, outs) = ([0x1000u64, 0x2000], [0x3000u64, 0x4000]);
        assert_eq!(overlap(&ins, &outs, 256, 512), None);
        assert_eq!(overlap(&ins, &[0x3000, 0x1000 + 255], 256, 512), Some((1, 0)), "rank 1's output reaches into rank 0's input's last byte");
        assert_eq!(overlap(&ins, &[0x2000 - 512, 0x4000], 256, 512), None, "ending where an input starts is no overlap");
        assert_eq!(overlap(&ins, &[0x2000 - 511, 0x4000], 256, 512), Some((0, 1)), "rank 0's output into rank 1's input");
        assert_eq!(overlap(&ins, &[0x1000, 0x4000], 256, 512), Some((0, 0)), "its own input");
    }
}
