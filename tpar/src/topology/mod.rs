//! What the fabric is: GPUs by UUID, the per-pair link class and P2P capabilities, PCIe
//! switches and sockets, and the islands they form.
//!
//! Owns: the [`Topology`] data model, its JSON form and fingerprint ([`Topology::hash`]),
//! the bundled [`presets`], discovery through NVML ([`nvml`], loaded at run time) and the
//! CPU-only topology. Must never: panic or fail because NVML or a GPU is missing (a machine
//! without either is a CPU-only topology with a note), decide anything (that is `plan`'s job:
//! this module only describes), or touch GPU memory.
//!
//! A topology is plain data so that tests, the planner and the simulator can use machines
//! we do not have: `Topology::load("l40s-direct-8")` or `Topology::load("my-box.json")`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

pub mod nvml;
pub mod presets;
pub mod probe;
pub mod ranks;
pub mod render;

/// Version of the JSON schema. Bump when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// PCIe bandwidth per direction of an x16 link, GB/s, by generation.
/// Source: docs/references.md "PCIe physics" (Gen5 63 GB/s, Gen4 31.5 GB/s, PCIe 4.0/5.0 specs);
/// Gen3 is half of Gen4 (8 GT/s, 128b/130b), Gen6 twice Gen5 (spec, before FLIT overhead).
pub fn pcie_x16_gbps(generation: u32) -> f64 {
    match generation {
        0 => 0.0,
        1 => 4.0,
        2 => 8.0,
        3 => 15.75,
        4 => 31.5,
        5 => 63.0,
        _ => 126.0,
    }
}

/// Per-direction bandwidth of a PCIe link of `generation` and `width` lanes, GB/s.
pub fn pcie_gbps(generation: u32, width: u32) -> f64 {
    pcie_x16_gbps(generation) * f64::from(width) / 16.0
}

/// The whole description of one host's fabric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// [`SCHEMA_VERSION`] of the file this came from.
    #[serde(default = "schema_version")]
    pub schema: u32,
    /// Preset name, `discovered`, or `cpu`. Descriptive: not part of [`Topology::hash`].
    pub name: String,
    /// GPUs in CUDA ordinal order (`gpus[i].index == i`).
    pub gpus: Vec<Gpu>,
    /// `links[i][j]`: the path between GPU i and GPU j; `links[i][i]` is [`LinkClass::SelfLink`].
    pub links: Vec<Vec<Link>>,
    /// PCIe switches (logical: one physical chip split in two counts twice).
    #[serde(default)]
    pub switches: Vec<PcieSwitch>,
    /// Groups of GPUs whose pairwise paths never cross the inter-socket link and that reach
    /// each other without the host. See [`Topology::compute_islands`].
    pub islands: Vec<Island>,
    pub cpu: CpuInfo,
    /// Where the data came from and what could not be discovered. Not part of the hash.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Measured (or published) link behaviour between the GPUs: SM stores, SM loads and
    /// copy-engine copies alone and under all-to-all load, and one-way flag latency. The
    /// simulator and the plan use these instead of a link class's assumed figures. Absent
    /// until `tpar topo --probe` or `tpar tune` ran (or a preset carries its machine's
    /// published figures); skipped in JSON when absent. Not part of [`Topology::hash`] (a
    /// measurement of the fabric, not its identity: two probes of one box never agree to the
    /// last digit); [`Topology::probe_digest`] fingerprints it where decisions depend on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<probe::Probe>,
}

fn schema_version() -> u32 {
    SCHEMA_VERSION
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// CUDA ordinal (with CUDA_DEVICE_ORDER=PCI_BUS_ID, as NVML enumerates).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `domain:bus:device.function`, as NVML prints it.
    pub pci_bus_id: String,
    /// NUMA node of the GPU's root port; `None` when unknown.
    pub numa_node: Option<u32>,
    /// CPU socket the GPU's PCIe tree hangs from.
    pub socket: u32,
    /// Index into [`Topology::switches`]; `None` for a GPU on a CPU root port.
    pub switch: Option<usize>,
    /// PCIe generation and lane count of the GPU's own link (maximum, not idle-downclocked).
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Per-direction bandwidth of the GPU's PCIe link, GB/s (spec: see [`pcie_gbps`]).
    pub pcie_gbps: f64,
    /// Per-direction NVLink bandwidth of this GPU, GB/s; 0 when it has none.
    #[serde(default)]
    pub nvlink_gbps: f64,
    /// Device memory, bytes.
    pub memory_bytes: u64,
}

/// A PCIe switch (as the OS sees it: a physical chip split into two partitions is two).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PcieSwitch {
    /// Position in [`Topology::switches`].
    pub id: usize,
    /// A label, e.g. `PEX0a`.
    pub name: String,
    /// Physical chip this logical switch is part of (equal for two halves of one chip).
    pub chip: usize,
    /// Socket whose root port the uplink reaches.
    pub socket: u32,
    /// Per-direction bandwidth of the uplink to the CPU, GB/s.
    pub uplink_gbps: f64,
    /// ACS redirect on: peer traffic between two ports detours through the root complex
    /// (docs/references.md: 50 vs 103 GB/s bidirectional on vs off).
    pub acs_redirect: bool,
}

/// The path between two GPUs, with `nvidia-smi topo -m`'s names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    /// The GPU itself (`X`).
    SelfLink,
    /// NVLink, directly or through NVSwitch, with this many links (`NV#`).
    NvLink { links: u32 },
    /// At most one PCIe bridge (`PIX`): both behind the same switch.
    Pix,
    /// Several PCIe bridges, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge, typically the CPU (`PHB`).
    Phb,
    /// Between host bridges within one NUMA node (`NODE`).
    Node,
    /// Across the inter-socket link (QPI/UPI/xGMI) (`SYS`).
    Sys,
}

impl LinkClass {
    /// `nvidia-smi topo -m`'s name.
    pub fn label(self) -> String {
        match self {
            LinkClass::SelfLink => "X".into(),
            LinkClass::NvLink { links } => format!("NV{links}"),
            LinkClass::Pix => "PIX".into(),
            LinkClass::Pxb => "PXB".into(),
            LinkClass::Phb => "PHB".into(),
            LinkClass::Node => "NODE".into(),
            LinkClass::Sys => "SYS".into(),
        }
    }

    /// Whether the path crosses the inter-socket link.
    pub fn crosses_sockets(self) -> bool {
        match self {
            LinkClass::Sys => true,
            LinkClass::SelfLink
            | LinkClass::NvLink { .. }
            | LinkClass::Pix
            | LinkClass::Pxb
            | LinkClass::Phb
            | LinkClass::Node => false,
        }
    }

    pub fn is_nvlink(self) -> bool {
        matches!(self, LinkClass::NvLink { .. })
    }
}

impl fmt::Display for LinkClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for LinkClass {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let u = s.trim().to_ascii_uppercase();
        match u.as_str() {
            "X" | "SELF" => Ok(LinkClass::SelfLink),
            "PIX" => Ok(LinkClass::Pix),
            "PXB" => Ok(LinkClass::Pxb),
            "PHB" => Ok(LinkClass::Phb),
            "NODE" => Ok(LinkClass::Node),
            "SYS" => Ok(LinkClass::Sys),
            other => match other.strip_prefix("NV").map(str::parse::<u32>) {
                Some(Ok(links)) if links > 0 => Ok(LinkClass::NvLink { links }),
                Some(_) | None => Err(Error::invalid(
                    "link class",
                    format!("unknown link class {s:?}; expected X, NV<n>, PIX, PXB, PHB, NODE or SYS"),
                )),
            },
        }
    }
}

impl Serialize for LinkClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

impl<'de> Deserialize<'de> for LinkClass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The path between two GPUs and what peer-to-peer access it allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    pub class: LinkClass,
    /// GPU i can read GPU j's memory (NVML P2P caps READ).
    pub p2p_read: bool,
    /// GPU i can write GPU j's memory (NVML P2P caps WRITE).
    pub p2p_write: bool,
    /// GPU i can do atomics on GPU j's memory (NVML P2P caps ATOMICS).
    pub p2p_atomics: bool,
}

impl Link {
    /// The diagonal entry.
    pub const SELF: Link = Link { class: LinkClass::SelfLink, p2p_read: true, p2p_write: true, p2p_atomics: true };

    /// A link with every P2P capability on or off.
    pub fn new(class: LinkClass, p2p: bool) -> Link {
        Link { class, p2p_read: p2p, p2p_write: p2p, p2p_atomics: p2p }
    }
}

/// What holds an island together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IslandKind {
    /// Every pair is NVLink.
    Nvlink,
    /// Every pair sits behind one PCIe switch.
    Switch,
    /// GPUs of one socket (several switches or root ports).
    Socket,
}

/// A group of GPUs that reduce cheaply among themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Island {
    pub kind: IslandKind,
    /// CUDA ordinals, ascending.
    pub gpus: Vec<u32>,
}

/// The host CPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// Logical CPUs available to this process.
    pub cores: u32,
    pub numa_nodes: u32,
    pub sockets: u32,
    /// Per-direction bandwidth that GPU peer traffic gets across the inter-socket link, GB/s;
    /// `None` when unknown (single socket, or not measured).
    #[serde(default)]
    pub inter_socket_gbps: Option<f64>,
}

impl CpuInfo {
    /// This machine's CPU: cores from `available_parallelism`, NUMA nodes from
    /// `/sys/devices/system/node`. Never fails: unknown counts are 1.
    pub fn detect() -> CpuInfo {
        let cores = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.strip_prefix("node").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count() as u32
            })
            .unwrap_or(0)
            .max(1);
        let sockets = count_sockets().unwrap_or(1).max(1);
        CpuInfo { cores, numa_nodes, sockets, inter_socket_gbps: None }
    }
}

/// Distinct `physical_package_id`s under /sys/devices/system/cpu.
fn count_sockets() -> Option<u32> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu").ok()?;
    let mut ids: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("topology/physical_package_id")).ok())
        .map(|s| s.trim().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        None
    } else {
        Some(ids.len() as u32)
    }
}

impl Topology {
    /// A machine with no GPU: CPU ranks only.
    pub fn cpu() -> Topology {
        Topology {
            schema: SCHEMA_VERSION,
            name: "cpu".into(),
            gpus: Vec::new(),
            links: Vec::new(),
            switches: Vec::new(),
            islands: Vec::new(),
            cpu: CpuInfo::detect(),
            notes: Vec::new(),
            probe: None,
        }
    }

    /// This machine: NVML discovery, or the CPU topology with a note saying why no GPU was
    /// found. Never fails and never panics.
    pub fn discover() -> Topology {
        match nvml::discover() {
            Ok(t) => t,
            Err(e) => {
                let mut t = Topology::cpu();
                t.notes.push(format!("no GPU topology: {e}"));
                t
            }
        }
    }

    /// A preset name (see [`presets::NAMES`]), `discover`/`auto` for this machine, `cpu`, or
    /// the path of a JSON file.
    pub fn load(name_or_path: &str) -> Result<Topology> {
        match name_or_path {
            "discover" | "auto" => return Ok(Topology::discover()),
            "cpu" => return Ok(Topology::cpu()),
            _ => {}
        }
        if let Some(t) = presets::by_name(name_or_path) {
            return Ok(t);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(Error::invalid(
                "topology",
                format!(
                    "{name_or_path:?} is neither a preset ({}, cpu, discover) nor an existing file",
                    presets::NAMES.join(", ")
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(0, format!("reading topology {}", path.display()), e))?;
        Topology::from_json(&text)
    }

    /// Parses and validates the JSON form.
    pub fn from_json(text: &str) -> Result<Topology> {
        let t: Topology = serde_json::from_str(text).map_err(|e| Error::invalid("topology", format!("bad topology JSON: {e}")))?;
        t.validate()?;
        Ok(t)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks internal consistency: square symmetric link matrix with `X` on the diagonal,
    /// ordinals in order, switch indices in range, islands a partition of the GPUs.
    pub fn validate(&self) -> Result<()> {
        let n = self.gpus.len();
        if self.schema != SCHEMA_VERSION {
            return Err(Error::invalid("topology", format!("schema {} is not supported (expected {SCHEMA_VERSION})", self.schema)));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if g.index as usize != i {
                return Err(Error::invalid("topology", format!("gpus[{i}] has index {}; GPUs must be listed in CUDA ordinal order", g.index)));
            }
            if let Some(s) = g.switch {
                if s >= self.switches.len() {
                    return Err(Error::invalid("topology", format!("GPU{i} names switch {s} but there are {}", self.switches.len())));
                }
            }
        }
        if self.links.len() != n || self.links.iter().any(|row| row.len() != n) {
            return Err(Error::invalid("topology", format!("links must be a {n}x{n} matrix")));
        }
        for i in 0..n {
            for j in 0..n {
                let c = self.links[i][j].class;
                if (i == j) != (c == LinkClass::SelfLink) {
                    return Err(Error::invalid("topology", format!("links[{i}][{j}] is {c}; X belongs exactly on the diagonal")));
                }
                if c != self.links[j][i].class {
                    return Err(Error::invalid("topology", format!("links[{i}][{j}] is {c} but links[{j}][{i}] is {}", self.links[j][i].class)));
                }
            }
        }
        let mut seen = vec![false; n];
        for island in &self.islands {
            for &g in &island.gpus {
                let g = g as usize;
                if g >= n || seen[g] {
                    return Err(Error::invalid("topology", format!("islands must partition the GPUs; GPU{g} is out of range or listed twice")));
                }
                seen[g] = true;
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(Error::invalid("topology", "islands must partition the GPUs; some GPU is in no island"));
        }
        if let Some(p) = &self.probe {
            p.validate(n)?;
        }
        Ok(())
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// The link from GPU i to GPU j, if both exist.
    pub fn link(&self, i: usize, j: usize) -> Option<&Link> {
        self.links.get(i).and_then(|row| row.get(j))
    }

    /// Islands restricted to the first `world` GPUs (ranks map to CUDA ordinals 0..world),
    /// empty islands dropped.
    pub fn islands_of(&self, world: usize) -> Vec<Vec<u32>> {
        self.islands
            .iter()
            .map(|i| i.gpus.iter().copied().filter(|&g| (g as usize) < world).collect::<Vec<u32>>())
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// Islands from the link matrix: connected components of the pairs that do not cross
    /// sockets (NVLink, PIX, PXB, PHB, NODE). Kind: `nvlink` if every pair inside is NVLink,
    /// `switch` if every GPU in it sits behind one switch, else `socket`.
    pub fn compute_islands(gpus: &[Gpu], links: &[Vec<Link>]) -> Vec<Island> {
        let n = gpus.len();
        let mut comp: Vec<usize> = (0..n).collect();
        fn root(comp: &mut [usize], mut x: usize) -> usize {
            while comp[x] != x {
                comp[x] = comp[comp[x]];
                x = comp[x];
            }
            x
        }
        for i in 0..n {
            for j in (i + 1)..n {
                let class = links.get(i).and_then(|r| r.get(j)).map(|l| l.class).unwrap_or(LinkClass::Sys);
                if !class.crosses_sockets() {
                    let (a, b) = (root(&mut comp, i), root(&mut comp, j));
                    comp[a.max(b)] = a.min(b);
                }
            }
        }
        let mut islands: Vec<Island> = Vec::new();
        let mut owner: Vec<Option<usize>> = vec![None; n];
        for i in 0..n {
            let r = root(&mut comp, i);
            match owner[r] {
                Some(k) => islands[k].gpus.push(i as u32),
                None => {
                    owner[r] = Some(islands.len());
                    islands.push(Island { kind: IslandKind::Socket, gpus: vec![i as u32] });
                }
            }
        }
        for island in &mut islands {
            let members: Vec<usize> = island.gpus.iter().map(|&g| g as usize).collect();
            let all_nvlink = members.iter().all(|&i| {
                members.iter().all(|&j| i == j || links.get(i).and_then(|r| r.get(j)).is_some_and(|l| l.class.is_nvlink()))
            });
            let one_switch = {
                let first = members.first().and_then(|&i| gpus.get(i)).and_then(|g| g.switch);
                first.is_some() && members.iter().all(|&i| gpus.get(i).and_then(|g| g.switch) == first)
            };
            island.kind = if all_nvlink && members.len() > 1 {
                IslandKind::Nvlink
            } else if one_switch {
                IslandKind::Switch
            } else {
                IslandKind::Socket
            };
        }
        islands
    }

    /// Stable 64-bit fingerprint: FNV-1a over the canonical JSON (serde_json, fields in
    /// declaration order, no whitespace) of everything except `name` and `notes`, which are
    /// descriptive, `cpu.cores`, which follows each process's CPU affinity mask and so may
    /// differ between ranks of one host, and `probe`, a measurement of the fabric rather
    /// than its identity (so a profile tuned with the link probe matches the discovered
    /// topology, which has none). Equal fabrics hash equal on every rank and across
    /// releases that keep [`SCHEMA_VERSION`].
    pub fn hash(&self) -> u64 {
        let mut canon = self.clone();
        canon.name.clear();
        canon.notes.clear();
        canon.cpu.cores = 0;
        canon.probe = None;
        fnv1a64(serde_json::to_string(&canon).unwrap_or_default().as_bytes())
    }

    /// FNV-1a over the probe's canonical JSON, 0 without one: the part of a topology that
    /// [`Topology::hash`] leaves out but the simulator and the plan read.
    pub fn probe_digest(&self) -> u64 {
        self.probe.as_ref().map_or(0, |p| fnv1a64(serde_json::to_string(p).unwrap_or_default().as_bytes()))
    }
}

pub use crate::units::fnv1a64;

#[cfg(test)]
mod tests;
