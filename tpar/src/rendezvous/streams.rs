//! The control plane's messages once the job has formed: gather, all-gather and broadcast
//! of byte strings over the rendezvous sockets (rank 0 holds a stream to every rank, the
//! others one to rank 0).
//!
//! Owns: the streams and the framing of collective payloads. Must never wait past one
//! deadline per collective, or trust a length a peer packed.

use super::wire::{rdzv_err, read_frame, write_frame, Deadline, Kind};
use crate::error::{Error, Result};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The control plane: rank 0 holds a stream to every rank, the others one to rank 0.
pub struct Control {
    rank: usize,
    streams: Vec<Option<UnixStream>>,
}

impl Control {
    pub(super) fn new(rank: usize, streams: Vec<Option<UnixStream>>) -> Control {
        Control { rank, streams }
    }

    /// Every rank sends `payload`; rank 0 receives all of them in rank order, others `None`.
    /// One deadline, `timeout` from now, bounds the whole gather.
    pub fn gather(&mut self, payload: &[u8], timeout: Duration) -> Result<Option<Vec<Vec<u8>>>> {
        let dl = Deadline::after(timeout);
        let rank = self.rank;
        if rank == 0 {
            let mut all = vec![payload.to_vec()];
            for (r, s) in self.streams.iter_mut().enumerate().skip(1) {
                let s = s.as_mut().ok_or_else(|| Error::invalid("control", format!("no stream to rank {r}")))?;
                match read_frame(s, 0, &dl).map_err(|e| super::with_peer(e, r))? {
                    (Kind::Data, p) => all.push(p),
                    (k, _) => return Err(rdzv_err(0, "kind", "Data", format!("{k:?} from rank {r}"))),
                }
            }
            Ok(Some(all))
        } else {
            let s = self.streams[0].as_mut().ok_or_else(|| Error::invalid("control", "no stream to rank 0"))?;
            write_frame(s, Kind::Data, payload, rank, &dl)?;
            Ok(None)
        }
    }

    /// Every rank's `payload` reaches every rank, in rank order (gather to rank 0, then a
    /// broadcast of the length-prefixed concatenation).
    pub fn all_gather(&mut self, payload: &[u8], world: usize, timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let rank = self.rank;
        let packed = match self.gather(payload, timeout)? {
            Some(all) => {
                let mut v = Vec::new();
                for p in &all {
                    v.extend_from_slice(&(p.len() as u32).to_le_bytes());
                    v.extend_from_slice(p);
                }
                v
            }
            None => Vec::new(),
        };
        let packed = self.broadcast(&packed, timeout)?;
        let out = unpack(&packed, world);
        if out.len() != world {
            return Err(rdzv_err(rank, "all-gather payload", format!("{world} length-prefixed parts"), format!("{} parts", out.len())));
        }
        Ok(out)
    }

    /// Rank 0's `payload` reaches every rank.
    pub fn broadcast(&mut self, payload: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let dl = Deadline::after(timeout);
        let rank = self.rank;
        if rank == 0 {
            for (r, s) in self.streams.iter_mut().enumerate().skip(1) {
                if let Some(s) = s {
                    write_frame(s, Kind::Data, payload, 0, &dl).map_err(|e| super::with_peer(e, r))?;
                }
            }
            Ok(payload.to_vec())
        } else {
            let s = self.streams[0].as_mut().ok_or_else(|| Error::invalid("control", "no stream to rank 0"))?;
            match read_frame(s, rank, &dl)? {
                (Kind::Data, p) => Ok(p),
                (k, _) => Err(rdzv_err(rank, "kind", "Data", format!("{k:?}"))),
            }
        }
    }
}

/// Splits length-prefixed parts; stops at the first part that does not fit, so a caller
/// that expects `world` parts over exactly the whole buffer sees a short count.
fn unpack(packed: &[u8], world: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(world.min(packed.len() / 4 + 1));
    let mut at = 0usize;
    while let Some(len_bytes) = packed.get(at..at + 4) {
        let n = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let Some(part) = packed.get(at + 4..).and_then(|rest| rest.get(..n)) else {
            return Vec::new();
        };
        out.push(part.to_vec());
        at += 4 + n;
    }
    if at != packed.len() {
        return Vec::new();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_refuses_what_does_not_add_up() {
        let mut v = Vec::new();
        for p in [&b"ab"[..], b"", b"xyz"] {
            v.extend_from_slice(&(p.len() as u32).to_le_bytes());
            v.extend_from_slice(p);
        }
        assert_eq!(unpack(&v, 3), vec![b"ab".to_vec(), vec![], b"xyz".to_vec()]);
        assert!(unpack(&v[..v.len() - 1], 3).is_empty(), "a cut part");
        let mut huge = v.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&huge, 3).is_empty(), "a length past the end");
        let mut trailing = v.clone();
        trailing.push(1);
        assert!(unpack(&trailing, 3).is_empty(), "trailing bytes");
    }
}
