//! Topology discovery through NVML, loaded at run time (`nvml-wrapper` dlopens
//! `libnvidia-ml.so`; nothing NVIDIA is needed to build).
//!
//! Owns: the mapping from NVML's answers to [`Topology`]. Must never: panic or abort when
//! NVML, the driver or a GPU is missing or a query is unsupported (every query that can fail
//! either falls back to a documented default with a note, or makes discovery return
//! [`Error::Library`], which [`Topology::discover`] turns into a CPU-only topology).

use super::{pcie_gbps, CpuInfo, Gpu, Link, LinkClass, PcieSwitch, Topology, SCHEMA_VERSION};
use crate::error::{Error, Result};
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::{Device, Nvml};

/// NVLink links a device can have (NVML_NVLINK_MAX_LINKS in nvml.h, NVML 12).
const NVLINK_MAX_LINKS: u32 = 18;
/// Per-link NVLink bandwidth per direction, GB/s (NVLink 4: 450 GB/s over 18 links,
/// docs/references.md). Used only to fill `nvlink_gbps`; older generations are over-estimated.
const NVLINK_LINK_GBPS: f64 = 25.0;

fn lib_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Library { library: "NVML", reason: format!("{what}: {e}") }
}

/// NVML's common-ancestor level as `nvidia-smi topo -m` names it.
fn class_of(level: TopologyLevel) -> LinkClass {
    match level {
        // Internal: two GPUs on one board (K80-style) share an on-board switch.
        TopologyLevel::Internal | TopologyLevel::Single => LinkClass::Pix,
        TopologyLevel::Multiple => LinkClass::Pxb,
        TopologyLevel::HostBridge => LinkClass::Phb,
        TopologyLevel::Node => LinkClass::Node,
        TopologyLevel::System => LinkClass::Sys,
    }
}

fn p2p_ok(a: &Device, b: &Device, index: P2pCapabilitiesIndex) -> bool {
    matches!(a.p2p_status(b, index), Ok(P2pStatus::Ok))
}

/// The NVIDIA driver's version as NVML reports it (for profile fingerprints); None without
/// NVML.
pub fn driver_version() -> Option<String> {
    Nvml::init().ok()?.sys_driver_version().ok()
}

/// Each GPU's PCI bus id and CUDA compute capability (major, minor), in NVML's order; `None`
/// without NVML (a GPU whose capability NVML cannot give is left out).
pub fn compute_capabilities() -> Option<Vec<(String, u32, u32)>> {
    let nvml = Nvml::init().ok()?;
    let count = nvml.device_count().ok()?;
    let mut out = Vec::new();
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        if let (Ok(pci), Ok(cc)) = (d.pci_info(), d.cuda_compute_capability()) {
            out.push((pci.bus_id, cc.major.max(0) as u32, cc.minor.max(0) as u32));
        }
    }
    Some(out)
}

/// Discovers this machine's GPUs. Errors only when NVML cannot be loaded or initialised, or
/// cannot count devices.
pub fn discover() -> Result<Topology> {
    let nvml = Nvml::init().map_err(|e| lib_err("cannot load or initialise libnvidia-ml.so", e))?;
    let count = nvml.device_count().map_err(|e| lib_err("device count", e))?;
    let mut notes = vec![match nvml.sys_driver_version() {
        Ok(v) => format!("discovered through NVML, driver {v}"),
        Err(_) => "discovered through NVML".to_string(),
    }];
    let mut devices = Vec::with_capacity(count as usize);
    for i in 0..count {
        devices.push(nvml.device_by_index(i).map_err(|e| lib_err(&format!("device {i}"), e))?);
    }
    let mut gpus = Vec::with_capacity(devices.len());
    let mut active_nvlinks = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        let pci = d.pci_info().ok();
        let numa_node = d.numa_node_id().ok();
        let pcie_gen = d.max_pcie_link_gen().unwrap_or(0);
        let pcie_width = d.max_pcie_link_width().unwrap_or(0);
        let links: Vec<String> = (0..NVLINK_MAX_LINKS)
            .filter(|&l| d.link_wrapper_for(l).is_active().unwrap_or(false))
            .map(|l| d.link_wrapper_for(l).remote_pci_info().map(|p| p.bus_id).unwrap_or_default())
            .collect();
        gpus.push(Gpu {
            index: i as u32,
            uuid: d.uuid().unwrap_or_else(|_| format!("unknown-{i}")),
            name: d.name().unwrap_or_else(|_| "unknown".into()),
            pci_bus_id: pci.map(|p| p.bus_id).unwrap_or_default(),
            numa_node,
            socket: numa_node.unwrap_or(0),
            switch: None,
            pcie_gen,
            pcie_width,
            pcie_gbps: pcie_gbps(pcie_gen, pcie_width),
            nvlink_gbps: links.len() as f64 * NVLINK_LINK_GBPS,
            memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
        });
        active_nvlinks.push(links);
    }
    if gpus.iter().any(|g| g.numa_node.is_none()) {
        notes.push("NUMA node unknown for some GPUs; socket 0 assumed".into());
    }
    let n = devices.len();
    let mut links = vec![vec![Link::SELF; n]; n];
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            let (a, b) = (&devices[i], &devices[j]);
            let nvlink = p2p_ok(a, b, P2pCapabilitiesIndex::NvLink);
            let class = if nvlink {
                // Direct links name the peer; through NVSwitch they name the switch, and
                // every active link carries traffic to every peer.
                let direct = active_nvlinks[i].iter().filter(|bus| **bus == gpus[j].pci_bus_id).count() as u32;
                let links = if direct > 0 { direct } else { active_nvlinks[i].len() as u32 };
                LinkClass::NvLink { links: links.max(1) }
            } else {
                match nvml.topology_common_ancestor(a, b) {
                    Ok(level) => class_of(level),
                    Err(_) => LinkClass::Sys,
                }
            };
            links[i][j] = Link {
                class,
                p2p_read: p2p_ok(a, b, P2pCapabilitiesIndex::Read),
                p2p_write: p2p_ok(a, b, P2pCapabilitiesIndex::Write),
                p2p_atomics: p2p_ok(a, b, P2pCapabilitiesIndex::Atomics),
            };
        }
    }
    // Symmetrise the class (NVML answers are symmetric; a driver that is not must not make
    // the matrix invalid): keep the farther of the two.
    for (i, j) in (0..n).flat_map(|i| ((i + 1)..n).map(move |j| (i, j))) {
        let c = links[i][j].class.max(links[j][i].class);
        links[i][j].class = c;
        links[j][i].class = c;
    }
    let switches = infer_switches(&mut gpus, &links);
    if !switches.is_empty() {
        notes.push("switches inferred from PIX pairs; uplink bandwidth assumed equal to the GPU link, ACS unknown (assumed off)".into());
    }
    let islands = Topology::compute_islands(&gpus, &links);
    let mut cpu = CpuInfo::detect();
    cpu.inter_socket_gbps = None;
    Ok(Topology { schema: SCHEMA_VERSION, name: "discovered".into(), gpus, links, switches, islands, cpu, notes, probe: None })
}

/// NVML has no switch inventory: GPUs joined by PIX paths share a switch, so each connected
/// component of PIX pairs (with more than one GPU) becomes one switch.
fn infer_switches(gpus: &mut [Gpu], links: &[Vec<Link>]) -> Vec<PcieSwitch> {
    let n = gpus.len();
    let mut switches: Vec<PcieSwitch> = Vec::new();
    for i in 0..n {
        if gpus[i].switch.is_some() {
            continue;
        }
        let members: Vec<usize> = (0..n).filter(|&j| j == i || links[i][j].class == LinkClass::Pix).collect();
        if members.len() < 2 {
            continue;
        }
        let id = switches.len();
        switches.push(PcieSwitch {
            id,
            name: format!("switch{id}"),
            chip: id,
            socket: gpus[i].socket,
            uplink_gbps: gpus[i].pcie_gbps,
            acs_redirect: false,
        });
        for j in members {
            if gpus[j].switch.is_none() {
                gpus[j].switch = Some(id);
            }
        }
    }
    switches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_smi_names() {
        assert_eq!(class_of(TopologyLevel::Single).label(), "PIX");
        assert_eq!(class_of(TopologyLevel::Multiple).label(), "PXB");
        assert_eq!(class_of(TopologyLevel::HostBridge).label(), "PHB");
        assert_eq!(class_of(TopologyLevel::Node).label(), "NODE");
        assert_eq!(class_of(TopologyLevel::System).label(), "SYS");
    }

    #[test]
    fn missing_nvml_is_an_error_not_a_panic() {
        // Without a driver this must be Err(Library); with one, Ok. Never a panic.
        match discover() {
            Ok(t) => t.validate().unwrap(),
            Err(Error::Library { library, .. }) => {
                assert_eq!(library, "NVML");
                assert_eq!(driver_version(), None);
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }

    #[test]
    fn switches_are_inferred_from_pix_pairs() {
        let mut t = crate::topology::presets::rtxpro6000_dualsocket_8();
        for g in &mut t.gpus {
            g.switch = None;
        }
        let s = infer_switches(&mut t.gpus, &t.links);
        assert_eq!(s.len(), 4);
        assert_eq!(t.gpus.iter().map(|g| g.switch).collect::<Vec<_>>(), vec![Some(0), Some(0), Some(1), Some(1), Some(2), Some(2), Some(3), Some(3)]);
    }
}
