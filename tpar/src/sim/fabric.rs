//! The fabric as a set of capacitated resources and the routes flows take through them.
//!
//! Owns: turning a [`Topology`] and [`Params`] into resources (each GPU link per direction,
//! each switch uplink per direction, each root complex's peer-forwarding engine and its
//! tracker of outstanding reads, the socket link per direction and its read tracker, each
//! socket's host memory, each GPU's NVLink port per direction, each GPU's kernel injection
//! limit) and routing a write, a read or a host-staged copy through them.
//! Must never: decide what an algorithm sends (that is `schedule`), or share bandwidth
//! (that is `flows`).
//!
//! Routes (GPU a to GPU b, ranks = CUDA ordinals):
//! ```text
//!  NVLink pair:            a.nv_tx -> b.nv_rx
//!  same switch, ACS off:   a.tx -> b.rx                      (the switch forwards)
//!  otherwise:              a.tx [-> sw(a).up] -> rc(s_a) [-> socket(s_a->s_b) -> rc(s_b)]
//!                               [-> sw(b).down] -> b.rx      (ACS redirect takes this path
//!                                                              even inside one switch)
//!  host staging:           a -> ... -> mem(s)  /  mem(s) -> ... -> b
//! ```
//! A read moves data the same way (completer to requester) but pays a round trip, is capped
//! by its window over that round trip, and holds a slot in every read tracker it crosses.

use super::flows::FlowSpec;
mod copy;
mod route;
pub use crate::algorithms::schedule::{Endpoint, Op};
use crate::algorithms::schedule::FabricView;
use super::params::Params;
use super::provenance::{self, Source};
use crate::error::{Error, Result};
use crate::topology::presets::LinkOp;
use crate::topology::{LinkClass, Topology};

/// The larger of two optional rates.
fn max_some(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// One resource: a name for reports and a capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub name: String,
    pub gbps: f64,
}

/// Resource indices of one GPU.
#[derive(Clone, Debug)]
struct GpuRes {
    tx: usize,
    rx: usize,
    nv_tx: Option<usize>,
    nv_rx: Option<usize>,
    /// Kernel injection limit over PCIe / NVLink.
    inject_pcie: usize,
    inject_nv: Option<usize>,
    socket: usize,
    switch: Option<usize>,
}

/// The fabric of the first `world` GPUs of a topology.
#[derive(Clone, Debug)]
pub struct Fabric {
    pub resources: Vec<Resource>,
    gpus: Vec<GpuRes>,
    sw_up: Vec<usize>,
    sw_down: Vec<usize>,
    sw_acs: Vec<bool>,
    rc: Vec<usize>,
    rc_reads: Vec<usize>,
    /// socket_link[a][b] for a != b.
    socket_link: Vec<Vec<Option<usize>>>,
    socket_reads: Option<usize>,
    mem: Vec<usize>,
    classes: Vec<Vec<LinkClass>>,
    p2p_read: Vec<Vec<bool>>,
    p2p_write: Vec<Vec<bool>>,
    /// From the topology's probe, per ordered pair: SM-store and SM-load rate of the pair
    /// alone (a cap on each flow) and the one-way flag latency.
    store_cap: Vec<Vec<Option<f64>>>,
    load_cap: Vec<Vec<Option<f64>>>,
    flag_us: Vec<Vec<Option<f64>>>,
    /// Copy-engine rate of the pair alone, from the probe (`copy`: a cap on copy flows).
    ce_cap: Vec<Vec<Option<f64>>>,
    /// Per GPU, what its SM stores / loads to all peers together sustained under the probe's
    /// all-to-all load (a resource), when the probe measured every peer; else, when the probe
    /// measured pairs alone, its fastest pair alone (assumed: more destinations are not
    /// assumed to add rate to what one GPU's port sustained with one).
    store_loaded: Vec<Option<usize>>,
    load_loaded: Vec<Option<usize>>,
    /// Per (issuer, target), where the rate of SM stores / loads under load comes from
    /// (`provenance::op_source`); `[a][n]` is host memory.
    store_src: Vec<Vec<Source>>,
    load_src: Vec<Vec<Source>>,
    /// The bound (`Params::unmeasured_gpu_gbps`), per GPU for its stores and its loads, on
    /// flows whose rate under load is assumed. Only in a fabric built by [`Fabric::bounded`].
    bound_store: Vec<Option<usize>>,
    bound_load: Vec<Option<usize>>,
    params: Params,
}

impl Fabric {
    /// Builds the fabric of GPUs `0..world` of `topo`.
    pub fn new(topo: &Topology, world: usize, params: &Params) -> Result<Fabric> {
        Fabric::build(topo, world, params, false)
    }

    /// The same fabric with every kernel flow whose rate under load no figure for this box
    /// measures capped, per GPU and operation, at `params.unmeasured_gpu_gbps`: what the
    /// plan checks a choice against before it trusts an assumed figure (docs/sim.md).
    pub fn bounded(topo: &Topology, world: usize, params: &Params) -> Result<Fabric> {
        Fabric::build(topo, world, params, true)
    }

    fn build(topo: &Topology, world: usize, params: &Params, bound: bool) -> Result<Fabric> {
        if world < 2 || world > topo.gpu_count() {
            return Err(Error::invalid(
                "world",
                format!(
                    "{world} ranks on {} ({} GPUs): need 2 to {}",
                    topo.name,
                    topo.gpu_count(),
                    topo.gpu_count()
                ),
            ));
        }
        let mut res: Vec<Resource> = Vec::new();
        let mut add = |name: String, gbps: f64| -> Result<usize> {
            if !(gbps.is_finite() && gbps > 0.0) {
                return Err(Error::invalid("topology", format!("{name} has bandwidth {gbps} GB/s")));
            }
            res.push(Resource { name, gbps });
            Ok(res.len() - 1)
        };
        let sockets = topo
            .gpus
            .iter()
            .take(world)
            .map(|g| g.socket as usize + 1)
            .chain(topo.switches.iter().map(|s| s.socket as usize + 1))
            .max()
            .unwrap_or(1)
            .max(topo.cpu.sockets as usize);
        let mean_link = topo.gpus.iter().take(world).map(|g| g.pcie_gbps).sum::<f64>() / world as f64;
        // A round trip through a root complex on one socket, and across the socket link: what
        // the outstanding-read trackers' capacities are reckoned against (Little's law).
        let rtt_rc = 2.0 * (params.pcie_egress_us + params.rc_hop_us) + params.completer_us;
        let rtt_cross = rtt_rc + 2.0 * (params.socket_hop_us + params.rc_hop_us);
        let mut rc = Vec::new();
        let mut rc_reads = Vec::new();
        let mut mem = Vec::new();
        for s in 0..sockets {
            rc.push(add(
                format!("rc{s}.p2p"),
                params.rc_forward_links * mean_link * params.pcie_efficiency,
            )?);
            rc_reads.push(add(
                format!("rc{s}.reads"),
                params.rc_read_outstanding_bytes / rtt_rc / 1e3,
            )?);
            mem.push(add(format!("mem{s}"), params.host_memory_gbps)?);
        }
        let mut socket_link = vec![vec![None; sockets]; sockets];
        let cross = topo.cpu.inter_socket_gbps.unwrap_or(params.socket_link_gbps);
        for (a, row) in socket_link.iter_mut().enumerate() {
            for (b, slot) in row.iter_mut().enumerate() {
                if a != b {
                    *slot = Some(add(format!("socket{a}->{b}"), cross)?);
                }
            }
        }
        let socket_reads = if sockets > 1 {
            Some(add(
                "socket.reads".into(),
                params.socket_read_outstanding_bytes / rtt_cross / 1e3,
            )?)
        } else {
            None
        };
        let (mut sw_up, mut sw_down, mut sw_acs) = (Vec::new(), Vec::new(), Vec::new());
        for s in &topo.switches {
            sw_up.push(add(format!("{}.up", s.name), s.uplink_gbps * params.pcie_efficiency)?);
            sw_down.push(add(format!("{}.down", s.name), s.uplink_gbps * params.pcie_efficiency)?);
            sw_acs.push(s.acs_redirect);
        }
        let mut gpus = Vec::new();
        for g in topo.gpus.iter().take(world) {
            let i = g.index;
            let link = g.pcie_gbps * params.pcie_efficiency;
            let tx = add(format!("gpu{i}.tx"), link)?;
            let rx = add(format!("gpu{i}.rx"), link)?;
            let inject_pcie = add(format!("gpu{i}.kernel.pcie"), link * params.pcie_kernel_fraction)?;
            let (nv_tx, nv_rx, inject_nv) = if g.nvlink_gbps > 0.0 {
                let nv = g.nvlink_gbps * params.nvlink_efficiency;
                (
                    Some(add(format!("gpu{i}.nv.tx"), nv)?),
                    Some(add(format!("gpu{i}.nv.rx"), nv)?),
                    Some(add(format!("gpu{i}.kernel.nv"), nv * params.nvlink_kernel_fraction)?),
                )
            } else {
                (None, None, None)
            };
            if let Some(s) = g.switch {
                if s >= topo.switches.len() {
                    return Err(Error::invalid(
                        "topology",
                        format!("GPU{i} names switch {s} of {}", topo.switches.len()),
                    ));
                }
            }
            gpus.push(GpuRes {
                tx,
                rx,
                nv_tx,
                nv_rx,
                inject_pcie,
                inject_nv,
                socket: g.socket as usize,
                switch: g.switch,
            });
        }
        let n = world;
        let mut classes = vec![vec![LinkClass::SelfLink; n]; n];
        let mut p2p_read = vec![vec![true; n]; n];
        let mut p2p_write = vec![vec![true; n]; n];
        for i in 0..n {
            for j in 0..n {
                let l = topo
                    .link(i, j)
                    .ok_or_else(|| Error::invalid("topology", format!("no link entry for GPU{i}-GPU{j}")))?;
                classes[i][j] = l.class;
                p2p_read[i][j] = i == j || l.p2p_read;
                p2p_write[i][j] = i == j || l.p2p_write;
            }
        }
        let mut store_cap = vec![vec![None; n]; n];
        let mut load_cap = vec![vec![None; n]; n];
        let mut flag_us = vec![vec![None; n]; n];
        let mut ce_cap = vec![vec![None; n]; n];
        let mut store_loaded = vec![None; n];
        let mut load_loaded = vec![None; n];
        if let Some(probe) = &topo.probe {
            for a in 0..n {
                let (mut st, mut ld) = (Some(0.0f64), Some(0.0f64));
                let (mut st_alone, mut ld_alone) = (None::<f64>, None::<f64>);
                for b in (0..n).filter(|&b| b != a) {
                    let q = probe.pair(a, Some(b));
                    store_cap[a][b] = q.and_then(|q| q.sm_store_gbps);
                    load_cap[a][b] = q.and_then(|q| q.sm_load_gbps);
                    flag_us[a][b] = q.and_then(|q| q.flag_us);
                    ce_cap[a][b] = q.and_then(|q| q.ce_gbps);
                    st = st.zip(q.and_then(|q| q.sm_store_loaded_gbps)).map(|(x, y)| x + y);
                    ld = ld.zip(q.and_then(|q| q.sm_load_loaded_gbps)).map(|(x, y)| x + y);
                    st_alone = max_some(st_alone, store_cap[a][b]);
                    ld_alone = max_some(ld_alone, load_cap[a][b]);
                }
                match (st, st_alone) {
                    (Some(g), _) => store_loaded[a] = Some(add(format!("gpu{a}.stores.probed"), g)?),
                    (None, Some(g)) => store_loaded[a] = Some(add(format!("gpu{a}.stores.alone"), g)?),
                    (None, None) => {}
                }
                match (ld, ld_alone) {
                    (Some(g), _) => load_loaded[a] = Some(add(format!("gpu{a}.loads.probed"), g)?),
                    (None, Some(g)) => load_loaded[a] = Some(add(format!("gpu{a}.loads.alone"), g)?),
                    (None, None) => {}
                }
            }
        }
        // Where each operation's rate under load comes from; host memory is column n.
        let exact = crate::topology::presets::exact(topo);
        let src = |op: LinkOp| -> Vec<Vec<Source>> {
            (0..n)
                .map(|a| (0..=n).map(|b| if a == b { Source::Published } else { provenance::op_source_on(topo, exact, op, a, (b < n).then_some(b)).0 }).collect())
                .collect()
        };
        let (store_src, load_src) = (src(LinkOp::Store), src(LinkOp::Load));
        let (mut bound_store, mut bound_load) = (vec![None; n], vec![None; n]);
        if bound {
            for a in 0..n {
                if store_src[a].iter().any(|s| !s.measured()) {
                    bound_store[a] = Some(add(format!("gpu{a}.stores.bound"), params.unmeasured_gpu_gbps)?);
                }
                if load_src[a].iter().any(|s| !s.measured()) {
                    bound_load[a] = Some(add(format!("gpu{a}.loads.bound"), params.unmeasured_gpu_gbps)?);
                }
            }
        }
        Ok(Fabric {
            store_src,
            load_src,
            bound_store,
            bound_load,
            store_cap,
            load_cap,
            flag_us,
            ce_cap,
            store_loaded,
            load_loaded,
            resources: res,
            gpus,
            sw_up,
            sw_down,
            sw_acs,
            rc,
            rc_reads,
            socket_link,
            socket_reads,
            mem,
            classes,
            p2p_read,
            p2p_write,
            params: params.clone(),
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.gpus.len()
    }

    /// Capacities, indexed like [`Fabric::resources`].
    pub fn capacities(&self) -> Vec<f64> {
        self.resources.iter().map(|r| r.gbps).collect()
    }

    /// Link class between ranks a and b.
    pub fn class(&self, a: usize, b: usize) -> LinkClass {
        self.classes[a][b]
    }

    /// Every ordered pair of distinct ranks allows P2P writes.
    pub fn all_p2p_write(&self) -> bool {
        self.p2p_write.iter().all(|r| r.iter().all(|&x| x))
    }

    /// Every ordered pair of distinct ranks allows P2P reads.
    pub fn all_p2p_read(&self) -> bool {
        self.p2p_read.iter().all(|r| r.iter().all(|&x| x))
    }

    /// Whether P2P writes from a to b are allowed.
    pub fn p2p_write(&self, a: usize, b: usize) -> bool {
        self.p2p_write[a][b]
    }

    /// Socket of rank a.
    pub fn socket(&self, a: usize) -> usize {
        self.gpus[a].socket
    }

    /// A flow of `bytes` from `src` to `dst` by `op`, starting at 0, moved by bulk SM stores or
    /// loads (tpar's kernels, the probe's pattern).
    pub fn flow(&self, src: Endpoint, dst: Endpoint, bytes: f64, op: Op) -> Result<FlowSpec> {
        self.flow_of(src, dst, bytes, op, true)
    }

    /// As [`Fabric::flow`]; `bulk` false for NCCL's LL hand-offs, which a probed SM-store
    /// collapse does not cap: on the Broadcom box whose stores collapse to 2.7 GB/s, NCCL
    /// still measured 26.2 us at 32 KB (docs/sim.md, G), which a 2.7 GB/s cap cannot give.
    pub fn flow_of(&self, src: Endpoint, dst: Endpoint, bytes: f64, op: Op, bulk: bool) -> Result<FlowSpec> {
        let p = &self.params;
        match (src, dst, op) {
            (Endpoint::Gpu(a), Endpoint::Gpu(b), Op::Write) => {
                if !self.p2p_write[a][b] {
                    return Err(Error::Unsupported {
                        what: format!("P2P write GPU{a}->GPU{b}"),
                        reason: "the topology says P2P writes are off for this pair".into(),
                    });
                }
                let (mut r, lat, _, nv) = self.p2p_route(a, b)?;
                r.push(self.inject(a, nv)?);
                let mut f = FlowSpec::new(r, bytes, lat);
                if bulk {
                    if let Some(cap) = self.store_cap[a][b] {
                        f.rate_cap_gbps = cap;
                    }
                    if let Some(res) = self.store_loaded[a] {
                        f.resources.push(res);
                    }
                    if let Some(res) = self.bound_store[a].filter(|_| !self.store_src[a][b].measured()) {
                        f.resources.push(res);
                    }
                }
                Ok(f)
            }
            (Endpoint::Gpu(a), Endpoint::Gpu(b), Op::Read) => {
                if !self.p2p_read[b][a] {
                    return Err(Error::Unsupported {
                        what: format!("P2P read by GPU{b} of GPU{a}"),
                        reason: "the topology says P2P reads are off for this pair".into(),
                    });
                }
                let (mut r, lat, via_rc, nv) = self.p2p_route(a, b)?;
                let cross = self.gpus[a].socket != self.gpus[b].socket;
                let rtt = if nv { p.nvlink_read_rtt_us } else { 2.0 * lat + p.completer_us };
                if via_rc {
                    // The requester's root complex tracks the request.
                    r.push(self.rc_reads[self.gpus[b].socket]);
                    if cross {
                        if let Some(t) = self.socket_reads {
                            r.push(t);
                        }
                    }
                }
                r.push(self.inject(b, nv)?);
                if let Some(res) = self.load_loaded[b] {
                    r.push(res);
                }
                if let Some(res) = self.bound_load[b].filter(|_| bulk && !self.load_src[b][a].measured()) {
                    r.push(res);
                }
                let mut f = FlowSpec::new(r, bytes, rtt);
                f.rate_cap_gbps = p.read_window_bytes / rtt / 1e3;
                if let Some(cap) = self.load_cap[b][a] {
                    f.rate_cap_gbps = f.rate_cap_gbps.min(cap);
                }
                Ok(f)
            }
            (src, dst, Op::Copy) => self.copy_flow(src, dst, bytes),
            (Endpoint::Gpu(a), Endpoint::Gpu(b), Op::ViaHost) => {
                // Copy into the writer's host memory, then out to the reader.
                let (mut r, sa) = self.up(a)?;
                r.push(self.mem[sa]);
                let (down, sb) = self.down(b)?;
                r.extend(self.across(sa, sb)?.into_iter().filter(|x| !self.rc.contains(x)));
                r.extend(down);
                r.push(self.gpus[a].inject_pcie);
                let hop = if sa != sb { p.nccl_shm_cross_socket_hop_us } else { p.nccl_shm_hop_us };
                Ok(FlowSpec::new(r, bytes, hop))
            }
            (Endpoint::Gpu(a), Endpoint::Host(s), Op::Write) => {
                let (mut r, sa) = self.up(a)?;
                r.extend(self.across(sa, s)?.into_iter().filter(|x| !self.rc.contains(x)));
                r.push(*self.mem.get(s).ok_or_else(|| Error::invalid("socket", format!("no socket {s}")))?);
                r.push(self.gpus[a].inject_pcie);
                let n = self.gpus.len();
                if let Some(res) = self.bound_store[a].filter(|_| !self.store_src[a][n].measured()) {
                    r.push(res);
                }
                let lat = p.pcie_egress_us + p.rc_hop_us + if sa != s { p.socket_hop_us + p.rc_hop_us } else { 0.0 };
                Ok(FlowSpec::new(r, bytes, lat))
            }
            (Endpoint::Host(s), Endpoint::Gpu(b), Op::Read) => {
                let mut r = vec![*self.mem.get(s).ok_or_else(|| Error::invalid("socket", format!("no socket {s}")))?];
                let (down, sb) = self.down(b)?;
                r.extend(self.across(s, sb)?.into_iter().filter(|x| !self.rc.contains(x)));
                r.extend(down);
                r.push(self.gpus[b].inject_pcie);
                let n = self.gpus.len();
                if let Some(res) = self.bound_load[b].filter(|_| !self.load_src[b][n].measured()) {
                    r.push(res);
                }
                let rtt = p.host_poll_us + if s != sb { 2.0 * (p.socket_hop_us + p.rc_hop_us) } else { 0.0 };
                let mut f = FlowSpec::new(r, bytes, rtt);
                f.rate_cap_gbps = p.read_window_bytes / rtt / 1e3;
                Ok(f)
            }
            (s, d, o) => Err(Error::Unsupported {
                what: format!("{o:?} from {s:?} to {d:?}"),
                reason: "the simulator routes GPU-GPU writes, reads and host copies, GPU-to-host writes and host-to-GPU reads".into(),
            }),
        }
    }

    /// Capacity of rank `b`'s receive link, GB/s.
    pub fn rx_gbps(&self, b: usize) -> Result<f64> {
        Ok(self.resources[self.gpu(b)?.rx].gbps)
    }

    /// Where the rate of `op` issued by `issuer` against `target` (None: host memory) under
    /// load comes from.
    pub fn op_source(&self, op: LinkOp, issuer: usize, target: Option<usize>) -> Source {
        let n = self.gpus.len();
        let t = target.unwrap_or(n).min(n);
        let m = match op {
            LinkOp::Store => &self.store_src,
            LinkOp::Load => &self.load_src,
        };
        m.get(issuer).and_then(|r| r.get(t)).copied().unwrap_or(Source::Assumed)
    }

    /// The parameters the fabric was built with.
    pub fn params(&self) -> &Params {
        &self.params
    }
}

/// The view an algorithm's schedule has of this fabric.
impl FabricView for Fabric {
    fn world(&self) -> usize {
        Fabric::world(self)
    }
    fn socket(&self, a: usize) -> usize {
        Fabric::socket(self, a)
    }
    fn p2p_write(&self, a: usize, b: usize) -> bool {
        Fabric::p2p_write(self, a, b)
    }
    fn all_p2p_write(&self) -> bool {
        Fabric::all_p2p_write(self)
    }
    fn all_p2p_read(&self) -> bool {
        Fabric::all_p2p_read(self)
    }
    fn nccl_direct(&self, a: usize, b: usize) -> bool {
        // NCCL takes P2P over NVLink always, over PCIe only within a socket unless
        // NCCL_P2P_LEVEL=SYS; otherwise the hop goes through host memory (SHM).
        self.p2p_write(a, b) && (self.class(a, b).is_nvlink() || self.params().nccl_p2p_across_sockets || self.socket(a) == self.socket(b))
    }
    fn nccl_wire_factor(&self) -> f64 {
        self.params().nccl_ll_wire_factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::flows::simulate;
    use crate::topology::presets;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs())
    }

    #[test]
    fn one_write_costs_latency_plus_bytes_over_the_kernel_rate() {
        let p = Params::default();
        let t = presets::pcie_2();
        let f = Fabric::new(&t, 2, &p).unwrap();
        let flow = f.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1e6, Op::Write).unwrap();
        let done = simulate(&f.capacities(), &[flow]).unwrap()[0];
        let rate = 63.0 * p.pcie_efficiency * p.pcie_kernel_fraction;
        assert!(close(done, p.pcie_egress_us + p.switch_hop_us + 1e6 / (rate * 1e3), 1e-9), "{done}");
    }

    #[test]
    fn read_round_trips_add_latency_per_outstanding_window() {
        // One read, no contention: the window over the round trip is the binding rate, so
        // k windows cost (1 + k) round trips (the first response, then one per window).
        let p = Params::default();
        let t = presets::pcie_2();
        let f = Fabric::new(&t, 2, &p).unwrap();
        for k in [1.0, 4.0, 16.0] {
            let bytes = k * p.read_window_bytes;
            let flow = f.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), bytes, Op::Read).unwrap();
            let done = simulate(&f.capacities(), &[flow]).unwrap()[0];
            let rtt = f.read_rtt(0, 1).unwrap();
            assert!(close(done, (1.0 + k) * rtt, 1e-9), "k={k}: {done}");
        }
    }

    #[test]
    fn acs_redirect_sends_switch_pairs_through_the_root_complex() {
        let p = Params::default();
        let mut t = presets::rtxpro6000_pcie_switch_8();
        let f = Fabric::new(&t, 8, &p).unwrap();
        let direct = f.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1.0, Op::Write).unwrap();
        t.switches[0].acs_redirect = true;
        let f2 = Fabric::new(&t, 8, &p).unwrap();
        let redirected = f2.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1.0, Op::Write).unwrap();
        assert!(redirected.resources.len() > direct.resources.len());
        assert!(redirected.resources.iter().any(|&r| f2.resources[r].name.starts_with("rc")));
    }

    #[test]
    fn no_p2p_preset_refuses_p2p_and_routes_via_host() {
        let p = Params::default();
        let t = presets::rtx4090_nop2p_4();
        let f = Fabric::new(&t, 4, &p).unwrap();
        assert!(!f.all_p2p_write());
        assert!(f.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1.0, Op::Write).is_err());
        assert!(f.flow(Endpoint::Gpu(0), Endpoint::Gpu(1), 1.0, Op::ViaHost).is_ok());
        assert!(f.flow(Endpoint::Gpu(0), Endpoint::Host(0), 1.0, Op::Write).is_ok());
        assert!(Fabric::new(&t, 5, &p).is_err());
    }
}
