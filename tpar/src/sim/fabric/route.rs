//! The routes P2P data takes through the fabric's resources: up from a GPU to its root
//! complex, across sockets, down to a GPU, and the whole GPU-to-GPU route with its one-way
//! latency (the module doc of `fabric` draws them); a GPU's injection limit; the latencies
//! of a write, a read and a flag that follow from a route.

use super::{Fabric, GpuRes};
use crate::error::{Error, Result};

impl Fabric {
    pub(super) fn gpu(&self, a: usize) -> Result<&GpuRes> {
        self.gpus
            .get(a)
            .ok_or_else(|| Error::invalid("rank", format!("rank {a} of {}", self.gpus.len())))
    }

    /// Resources from rank a's GPU up to its root complex (exclusive), and the socket.
    pub(super) fn up(&self, a: usize) -> Result<(Vec<usize>, usize)> {
        let g = self.gpu(a)?;
        let mut v = vec![g.tx];
        if let Some(s) = g.switch {
            v.push(self.sw_up[s]);
        }
        Ok((v, g.socket))
    }

    pub(super) fn down(&self, b: usize) -> Result<(Vec<usize>, usize)> {
        let g = self.gpu(b)?;
        let mut v = Vec::new();
        if let Some(s) = g.switch {
            v.push(self.sw_down[s]);
        }
        v.push(g.rx);
        Ok((v, g.socket))
    }

    /// Between two sockets' root complexes (exclusive of the first), or nothing.
    pub(super) fn across(&self, sa: usize, sb: usize) -> Result<Vec<usize>> {
        if sa == sb {
            return Ok(Vec::new());
        }
        let link = self
            .socket_link
            .get(sa)
            .and_then(|r| r.get(sb))
            .copied()
            .flatten()
            .ok_or_else(|| Error::invalid("topology", format!("no link between sockets {sa} and {sb}")))?;
        Ok(vec![link, self.rc[sb]])
    }

    /// Resources and one-way latency of P2P data from rank a to rank b, plus whether the
    /// route goes through a root complex (and so through its read tracker).
    pub(super) fn p2p_route(&self, a: usize, b: usize) -> Result<(Vec<usize>, f64, bool, bool)> {
        let p = &self.params;
        let (ga, gb) = (self.gpu(a)?, self.gpu(b)?);
        if self.classes[a][b].is_nvlink() {
            if let (Some(tx), Some(rx)) = (ga.nv_tx, gb.nv_rx) {
                return Ok((vec![tx, rx], p.nvlink_write_us, false, true));
            }
        }
        let probed = |lat: f64| match self.flag_us[a][b] {
            // A probed flag is a store plus the poll that sees it.
            Some(f) => (f - p.poll_us).max(0.1 * f),
            None => lat,
        };
        if let (Some(sa), Some(sb)) = (ga.switch, gb.switch) {
            if sa == sb && !self.sw_acs[sa] {
                return Ok((vec![ga.tx, gb.rx], probed(p.pcie_egress_us + p.switch_hop_us), false, false));
            }
        }
        let (mut v, s_a) = self.up(a)?;
        v.push(self.rc[s_a]);
        let (down, s_b) = self.down(b)?;
        v.extend(self.across(s_a, s_b)?);
        v.extend(down);
        let switches = [ga.switch, gb.switch].iter().filter(|s| s.is_some()).count() as f64;
        let mut lat = p.pcie_egress_us + switches * p.switch_hop_us + p.rc_hop_us;
        if s_a != s_b {
            lat += p.socket_hop_us + p.rc_hop_us;
        }
        Ok((v, probed(lat), true, false))
    }

    pub(super) fn inject(&self, a: usize, nvlink: bool) -> Result<usize> {
        let g = self.gpu(a)?;
        Ok(if nvlink {
            g.inject_nv.unwrap_or(g.inject_pcie)
        } else {
            g.inject_pcie
        })
    }

    /// One-way write latency between two ranks (for barrier flags).
    pub fn write_latency(&self, a: usize, b: usize) -> Result<f64> {
        if self.p2p_write[a][b] {
            Ok(self.p2p_route(a, b)?.1)
        } else {
            Ok(self.params.host_poll_us + self.params.pcie_egress_us + self.params.rc_hop_us)
        }
    }

    /// Round trip of an idle read of a few bytes by `reader` from `completer`'s memory.
    pub fn read_rtt(&self, completer: usize, reader: usize) -> Result<f64> {
        let (_, lat, _, nv) = self.p2p_route(completer, reader)?;
        Ok(if nv { self.params.nvlink_read_rtt_us } else { 2.0 * lat + self.params.completer_us })
    }

    /// One-way flag latency: a store and the poll that sees it (what a ping-pong halves).
    pub fn flag_latency(&self, a: usize, b: usize) -> Result<f64> {
        Ok(self.write_latency(a, b)? + self.params.poll_us)
    }
}
