//! The registered-buffer tables of graph-captured calls ([`TparIo`], io.cuh): every rank's
//! input and output of one call as one rank addresses them, in device memory, for the pull
//! kernels' zero-copy path. A captured kernel keeps the table's address in its arguments,
//! so a table is allocated when its call is captured and filled before the graph first
//! runs ([`IoTables::flush`], after the capture ends); it is never rewritten nor freed while
//! the owner lives (a graph may replay any time).
//!
//! Owns: the tables' device memory (chunks that never move) and their host mirror.
//! Must never: change a table once flushed, or hand out an address before its table is
//! flushed to a kernel that runs (callers flush when the capture ends, before any replay).

use super::abi::TparIo;
use super::driver::{Device, DeviceBuffer};
use crate::error::Result;
use crate::kinds::Algorithm;
use std::collections::HashMap;

/// Tables per device allocation (256 B each: 256 KiB chunks).
const TABLES_PER_CHUNK: usize = 1024;
const TABLE_BYTES: usize = std::mem::size_of::<TparIo>();

struct Chunk {
    buf: DeviceBuffer,
    /// Tables handed out, and how many of them are on the device.
    host: Vec<TparIo>,
    flushed: usize,
}

/// Tables of one owner (an emulated group, a rank's workspace), deduplicated by contents:
/// a graph that repeats one call shape on the same buffers shares one table per rank.
#[derive(Default)]
pub struct IoTables {
    chunks: Vec<Chunk>,
    index: HashMap<TparIo, u64>,
}

impl IoTables {
    /// The device address of a table holding `t` (an existing one with the same contents, or
    /// a new one, on the device after the next [`flush`](Self::flush)).
    pub fn address(&mut self, dev: &Device, t: TparIo) -> Result<u64> {
        if let Some(a) = self.index.get(&t) {
            return Ok(*a);
        }
        if self.chunks.last().map_or(true, |c| c.host.len() == TABLES_PER_CHUNK) {
            let buf = DeviceBuffer::new(dev, TABLES_PER_CHUNK * TABLE_BYTES)?;
            self.chunks.push(Chunk { buf, host: Vec::with_capacity(TABLES_PER_CHUNK), flushed: 0 });
        }
        let Some(c) = self.chunks.last_mut() else {
            return Err(crate::error::Error::invalid("io tables", "no chunk after allocating one"));
        };
        let addr = c.buf.ptr + (c.host.len() * TABLE_BYTES) as u64;
        c.host.push(t);
        self.index.insert(t, addr);
        Ok(addr)
    }

    /// Uploads every table handed out since the last flush (synchronous).
    pub fn flush(&mut self) -> Result<()> {
        for c in &mut self.chunks {
            if c.flushed < c.host.len() {
                c.buf.upload_at(c.flushed * TABLE_BYTES, &c.host[c.flushed..])?;
                c.flushed = c.host.len();
            }
        }
        Ok(())
    }

    /// Tables handed out so far.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// The table of one rank for a call whose ranks' buffers are `inputs` and `outputs` (as
/// that rank addresses them; `world` entries each, the rest 0).
pub fn table(inputs: &[u64], outputs: &[u64]) -> TparIo {
    let mut t = TparIo::default();
    for (d, s) in t.input.iter_mut().zip(inputs) {
        *d = *s;
    }
    for (d, s) in t.output.iter_mut().zip(outputs) {
        *d = *s;
    }
    t
}

/// Whether a call of `algo` over `bytes` per rank may run registered on these buffers (one
/// input and one output per rank, all in one address space). The registered kernels read
/// the inputs in place until their end barrier, so no output may overlap any input, with one
/// exception: two-shot pull in place (`inputs[r] == outputs[r]`), where chunk c of every
/// buffer is read and then written by the same thread of rank c and by no one else.
/// One-shot pull in place is not: every rank reads my input while I write my sum over it
/// (seen on one H200: wrong sums with skewed ranks, `selftest graph --scratch`). A call
/// that may not register copies into the workspace, as every unregistered call does.
pub fn may_register(algo: Algorithm, inputs: &[u64], outputs: &[u64], bytes: usize) -> bool {
    let b = bytes as u64;
    let overlap = |x: u64, y: u64| x < y.saturating_add(b) && y < x.saturating_add(b);
    outputs.iter().enumerate().all(|(q, &o)| {
        inputs.iter().enumerate().all(|(p, &i)| {
            if !overlap(o, i) {
                return true;
            }
            algo == Algorithm::TwoshotPull && p == q && o == i
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_registers_only_for_two_shot() {
        let (ins, outs) = ([0x1000u64, 0x9000], [0x5000u64, 0xd000]);
        for a in [Algorithm::OneshotPull, Algorithm::TwoshotPull] {
            assert!(may_register(a, &ins, &outs, 0x4000), "{a}: disjoint buffers");
            assert!(!may_register(a, &ins, &outs, 0x4001), "{a}: output 0 overlaps input 0's last byte");
            assert!(!may_register(a, &ins, &[0x5000, 0x9010], 0x1000), "{a}: rank 1 writes over its own input, shifted");
        }
        assert!(may_register(Algorithm::TwoshotPull, &ins, &ins, 0x4000), "two-shot in place");
        assert!(!may_register(Algorithm::OneshotPull, &ins, &ins, 0x4000), "one-shot in place");
        assert!(!may_register(Algorithm::TwoshotPull, &ins, &[0x9000, 0x1000], 0x4000), "rank 0 writes over rank 1's input");
        assert!(!may_register(Algorithm::TwoshotPull, &ins, &[0x1010, 0x9000], 0x4000), "partly in place");
    }

    #[test]
    fn table_fills_the_ranks_and_zeroes_the_rest() {
        let t = table(&[1, 2, 3], &[4, 5, 6]);
        assert_eq!(&t.input[..4], &[1, 2, 3, 0]);
        assert_eq!(&t.output[..4], &[4, 5, 6, 0]);
    }
}
