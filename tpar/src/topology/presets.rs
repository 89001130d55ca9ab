//! Bundled topologies of machines we may not have, by name.
//!
//! Owns: the preset table and the numbers in it, each with where it came from (docs/references.md
//! or a spec sheet). Must never: probe the machine, or change a preset's numbers without
//! saying why (the fingerprint of every profile tuned on a preset changes with them).

use super::{pcie_gbps, CpuInfo, Gpu, Link, LinkClass, PcieSwitch, Topology, SCHEMA_VERSION};

/// Every preset name, in the order `tpar topo --help` lists them.
pub const NAMES: [&str; 6] = [
    "h200-nvswitch-8",
    "rtxpro6000-pcie-switch-8",
    "rtxpro6000-dualsocket-8",
    "l40s-direct-8",
    "rtx4090-nop2p-4",
    "pcie-2",
];

/// The preset called `name`, if there is one.
pub fn by_name(name: &str) -> Option<Topology> {
    match name {
        "h200-nvswitch-8" => Some(h200_nvswitch_8()),
        "rtxpro6000-pcie-switch-8" => Some(rtxpro6000_pcie_switch_8()),
        "rtxpro6000-dualsocket-8" => Some(rtxpro6000_dualsocket_8()),
        "l40s-direct-8" => Some(l40s_direct_8()),
        "rtx4090-nop2p-4" => Some(rtx4090_nop2p_4()),
        "pcie-2" => Some(pcie_2()),
        _ => None,
    }
}

/// Every preset.
pub fn all() -> Vec<Topology> {
    NAMES.iter().filter_map(|n| by_name(n)).collect()
}

const GIB: u64 = 1 << 30;

/// NVLink 4 bandwidth per direction per GPU, GB/s. Source: docs/references.md "All-reduce
/// latencies, NVLink" (450 GB/s per direction; 371-377 GB/s measured P2P writes, nccl #1264).
const NVLINK4_GBPS: f64 = 450.0;
/// NVLink links per H100/H200 (NVLink 4, 18 links x 25 GB/s per direction = 450 GB/s).
const NVLINK4_LINKS: u32 = 18;
/// Cross-chip (socket-to-socket) bandwidth of GPU peer traffic on the ASUS ESC8000A-E13P:
/// midpoint of 35.9-40.2 GB/s (docs/references.md, rtx6kpro asus-esc8000a doc).
const ASUS_CROSS_SOCKET_GBPS: f64 = 38.0;
/// SM stores to peer memory through that box's Broadcom PEX890xx switches, GB/s
/// (docs/references.md: ~2.7 GB/s; b12x PR #139: 2.6), against SM loads of ~51 GB/s and
/// copy-engine copies of ~56 GB/s on the same pairs.
const BROADCOM_SM_STORE_GBPS: f64 = 2.7;
const BROADCOM_SM_LOAD_GBPS: f64 = 51.0;
const BROADCOM_CE_GBPS: f64 = 56.0;

/// Builds GPUs for a preset (or another described machine, e.g. the simulator's calibration
/// boxes): `sockets[i]`, `switches[i]` per GPU.
pub(crate) fn gpus(preset: &str, name: &str, memory_bytes: u64, gen: u32, sockets: &[u32], switches: &[Option<usize>], nvlink_gbps: f64) -> Vec<Gpu> {
    let tag = super::fnv1a64(preset.as_bytes()) as u32;
    sockets
        .iter()
        .zip(switches)
        .enumerate()
        .map(|(i, (&socket, &switch))| Gpu {
            index: i as u32,
            // Fake but well-formed UUIDs, distinct per preset so profile fingerprints differ.
            uuid: format!("GPU-{tag:08x}-0000-4000-8000-{i:012x}"),
            name: name.into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + 0x10 * i),
            numa_node: Some(socket),
            socket,
            switch,
            pcie_gen: gen,
            pcie_width: 16,
            pcie_gbps: pcie_gbps(gen, 16),
            nvlink_gbps,
            memory_bytes,
        })
        .collect()
}

/// Link matrix from a function of (i, j) for i != j.
pub(crate) fn matrix(n: usize, f: impl Fn(usize, usize) -> Link) -> Vec<Vec<Link>> {
    (0..n).map(|i| (0..n).map(|j| if i == j { Link::SELF } else { f(i, j) }).collect()).collect()
}

/// PCIe peer link: read and write, no atomics (docs/architecture.md: many PCIe parts have no remote
/// atomics; tpar's protocols never need them, so a preset claims none).
fn pcie_p2p(class: LinkClass) -> Link {
    Link { class, p2p_read: true, p2p_write: true, p2p_atomics: false }
}

fn switch(id: usize, name: &str, chip: usize, socket: u32, gen: u32) -> PcieSwitch {
    PcieSwitch { id, name: name.into(), chip, socket, uplink_gbps: pcie_gbps(gen, 16), acs_redirect: false }
}

pub(crate) fn finish(name: &str, gpus: Vec<Gpu>, links: Vec<Vec<Link>>, switches: Vec<PcieSwitch>, cpu: CpuInfo, notes: &[&str]) -> Topology {
    let islands = Topology::compute_islands(&gpus, &links);
    Topology {
        schema: SCHEMA_VERSION,
        name: name.into(),
        gpus,
        links,
        switches,
        islands,
        cpu,
        notes: notes.iter().map(|s| s.to_string()).collect(),
        probe: None,
    }
}

/// HGX H200: 8 GPUs, every pair NV18 through NVSwitch; PCIe Gen5 x16 to two sockets.
pub fn h200_nvswitch_8() -> Topology {
    let name = "h200-nvswitch-8";
    // 141 GB HBM3e per GPU (H200 spec sheet).
    let g = gpus(name, "NVIDIA H200", 141_000_000_000, 5, &[0, 0, 0, 0, 1, 1, 1, 1], &[None; 8], NVLINK4_GBPS);
    let links = matrix(8, |_, _| Link::new(LinkClass::NvLink { links: NVLINK4_LINKS }, true));
    // Two 56-core sockets with 2 threads per core (Xeon 8480+, a typical HGX host);
    // placeholder, not used by the plan.
    let cpu = CpuInfo { cores: 224, numa_nodes: 2, sockets: 2, inter_socket_gbps: None };
    finish(name, g, links, Vec::new(), cpu, &["preset: HGX H200, NVLink 4 through NVSwitch (docs/references.md)"])
}

/// 8x RTX PRO 6000 Blackwell, Gen5, behind two PCIe switches (4 GPUs each) on one CPU.
pub fn rtxpro6000_pcie_switch_8() -> Topology {
    let name = "rtxpro6000-pcie-switch-8";
    let sw = [Some(0), Some(0), Some(0), Some(0), Some(1), Some(1), Some(1), Some(1)];
    // 96 GB GDDR7 (RTX PRO 6000 Blackwell spec sheet).
    let g = gpus(name, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 96 * GIB, 5, &[0; 8], &sw, 0.0);
    // Same switch: PIX. Different switches: through the CPU's host bridges, same NUMA node: NODE.
    let links = matrix(8, |i, j| pcie_p2p(if i / 4 == j / 4 { LinkClass::Pix } else { LinkClass::Node }));
    let switches = vec![switch(0, "PEX0", 0, 0, 5), switch(1, "PEX1", 1, 0, 5)];
    let cpu = CpuInfo { cores: 128, numa_nodes: 1, sockets: 1, inter_socket_gbps: None };
    finish(name, g, links, switches, cpu, &["preset: one CPU, two Gen5 switches with four GPUs each, x16 uplinks"])
}

/// 8x RTX PRO 6000 Blackwell, Gen5, two sockets; each socket has one Broadcom switch split
/// into two logical switches, each with two GPUs and its own x16 uplink
/// (docs/references.md: rtx6kpro asus-esc8000a-e13p-broadcom-switches.md).
pub fn rtxpro6000_dualsocket_8() -> Topology {
    let name = "rtxpro6000-dualsocket-8";
    let sockets = [0, 0, 0, 0, 1, 1, 1, 1];
    let sw = [Some(0), Some(0), Some(1), Some(1), Some(2), Some(2), Some(3), Some(3)];
    let g = gpus(name, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 96 * GIB, 5, &sockets, &sw, 0.0);
    let links = matrix(8, |i, j| {
        pcie_p2p(if i / 2 == j / 2 {
            LinkClass::Pix
        } else if i / 4 == j / 4 {
            LinkClass::Node
        } else {
            LinkClass::Sys
        })
    });
    let switches = vec![
        switch(0, "PEX0a", 0, 0, 5),
        switch(1, "PEX0b", 0, 0, 5),
        switch(2, "PEX1a", 1, 1, 5),
        switch(3, "PEX1b", 1, 1, 5),
    ];
    let cpu = CpuInfo { cores: 256, numa_nodes: 2, sockets: 2, inter_socket_gbps: Some(ASUS_CROSS_SOCKET_GBPS) };
    let mut t = finish(
        name,
        g,
        links,
        switches,
        cpu,
        &[
            "preset: ACS redirect off (with it on, a switch pair drops from 103 to 50 GB/s bidirectional, docs/references.md)",
            "preset: SM stores to peers collapse through the Broadcom switches (2.7 vs 51 GB/s loads): the published figures stand in for a probe",
        ],
    );
    t.probe = Some(super::probe::Probe::uniform(
        "published: rtx6kpro asus-esc8000a-e13p-broadcom-switches.md, b12x PR #139 (docs/references.md); not measured by tpar",
        8,
        |a, b| super::probe::PairProbe {
            sm_store_gbps: Some(BROADCOM_SM_STORE_GBPS),
            sm_load_gbps: Some(BROADCOM_SM_LOAD_GBPS),
            ce_gbps: Some(BROADCOM_CE_GBPS),
            ..super::probe::PairProbe::empty(a as u32, Some(b as u32))
        },
    ));
    t
}

/// 8x L40S, Gen4, every GPU on its own CPU root port, four per socket (docs/references.md:
/// flashinfer PR #4870: 26 GB/s single hop, 9.7 GB/s per flow across sockets, all flows on).
pub fn l40s_direct_8() -> Topology {
    let name = "l40s-direct-8";
    let sockets = [0, 0, 0, 0, 1, 1, 1, 1];
    // 48 GB GDDR6 (L40S spec sheet).
    let g = gpus(name, "NVIDIA L40S", 48 * GIB, 4, &sockets, &[None; 8], 0.0);
    let links = matrix(8, |i, j| pcie_p2p(if i / 4 == j / 4 { LinkClass::Node } else { LinkClass::Sys }));
    let cpu = CpuInfo { cores: 128, numa_nodes: 2, sockets: 2, inter_socket_gbps: None };
    finish(
        name,
        g,
        links,
        Vec::new(),
        cpu,
        &["preset: cross-socket bandwidth not measured in isolation; 9.7 GB/s per flow with all flows active (docs/references.md)"],
    )
}

/// 4x RTX 4090, Gen4, on CPU root ports of one socket, no P2P (the stock driver disables it;
/// docs/references.md's 24.4 GB/s P2P figure needs a patched kernel module).
pub fn rtx4090_nop2p_4() -> Topology {
    let name = "rtx4090-nop2p-4";
    // 24 GB GDDR6X (RTX 4090 spec sheet).
    let g = gpus(name, "NVIDIA GeForce RTX 4090", 24 * GIB, 4, &[0; 4], &[None; 4], 0.0);
    let links = matrix(4, |_, _| Link::new(LinkClass::Node, false));
    let cpu = CpuInfo { cores: 64, numa_nodes: 1, sockets: 1, inter_socket_gbps: None };
    finish(name, g, links, Vec::new(), cpu, &["preset: no P2P: peers reach each other only through host memory"])
}

/// Two Gen5 GPUs behind one PCIe switch.
pub fn pcie_2() -> Topology {
    let name = "pcie-2";
    let g = gpus(name, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 96 * GIB, 5, &[0, 0], &[Some(0), Some(0)], 0.0);
    let links = matrix(2, |_, _| pcie_p2p(LinkClass::Pix));
    let cpu = CpuInfo { cores: 32, numa_nodes: 1, sockets: 1, inter_socket_gbps: None };
    finish(name, g, links, vec![switch(0, "PEX0", 0, 0, 5)], cpu, &["preset: two Gen5 GPUs on one switch"])
}
