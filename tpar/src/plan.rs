//! The dispatch plan: one pure, total function from (topology, world, bytes, dtype, capture
//! mode, backend, tuned profile, overrides) to a [`Plan`] — algorithm, transport, blocks and
//! a human-readable reason naming the numbers it used.
//!
//! Owns: the decision, its default thresholds (named constants derived from REFERENCE.md's
//! floor arithmetic, or marked "placeholder until measured"), the `TPAR_*` overrides and
//! their validation, the debug log of decisions, and the digest of plan inputs that ranks
//! compare at init ([`plan_fingerprint`]).
//! Must never: do I/O inside [`plan`] (it reads no environment, no file, no clock), return an
//! algorithm whose preconditions do not hold on the fabric (an override or profile that asks
//! for one is ignored, and the reason says so; [`Overrides::validate`] turns it into an error
//! at init), or have a match arm that could mean "nothing".
//!
//! Ranks map to CUDA ordinals `0..world`: the plan for world W on a topology of G >= W GPUs
//! looks at the first W GPUs only. World W > G on the CUDA backend means ranks this topology
//! does not describe (other hosts, or GPUs shared by ranks): NCCL, with that reason.

use crate::algorithms::{Algorithm, Transport};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::profile::{Profile, ProfileFingerprint};
use crate::topology::{fnv1a64, Topology};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

// ---------------------------------------------------------------------------------------
// Thresholds. Each says where its number came from.
// ---------------------------------------------------------------------------------------

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// CPU ranks: one-shot push up to this size, two-shot push above. Measured
/// (bench/results/h200-host.md, cpu-bench-{2,4,8}.json, 16-core host; cpu-2core-dev.md): with
/// 4 and 8 ranks two-shot push is faster from 512 B (8 ranks, 512 B: 4.2 vs 7.5 us); with 2
/// ranks the two tie to within a few percent up to 32 KiB.
pub const CPU_ONESHOT_MAX_BYTES: u64 = 256;

/// NVLink, 2 ranks: one-shot push up to this size, two-shot above. Measured on 4 H200s
/// (NV18 each pair), one process per GPU, bf16 in CUDA graphs, with one block per 8 KiB
/// (bench/results/h200-x4.md, blocks sweep): one-shot stays ahead to 1 MiB (9.05 vs 10.67
/// us). (The 64 KiB measured on 2 H200s earlier was an artefact of 32 KiB per block.)
pub const NVLINK_ONESHOT_MAX_BYTES_2: u64 = MIB;
/// NVLink, 3 or 4 ranks: one-shot push up to this size, two-shot above. Measured on 4 H200s
/// (bench/results/h200-x4.md, blocks sweep, 4 ranks): one-shot 8.99 vs two-shot 9.71 us at
/// 256 KiB, 13.39 vs 10.57 us at 512 KiB. vLLM's dispatch uses 512 KB.
pub const NVLINK_ONESHOT_MAX_BYTES_4: u64 = 256 * KIB;
/// NVLink, more than 4 ranks: one-shot push up to this size, two-shot above (not measured:
/// no 8-GPU machine yet). After: vLLM custom_all_reduce dispatch (1-stage below 256 KB at
/// <= 8 ranks). Floor (REFERENCE.md): 7 x 256 KiB at 370 GB/s is 5.0 us, where two-shot's
/// 2(n-1)/n S starts to pay.
pub const NVLINK_ONESHOT_MAX_BYTES_8: u64 = 256 * KIB;
/// NVLink: tpar's kernels up to this size, NCCL above (bandwidth-bound; NCCL's rings are
/// tuned for it). Measured on H200s, 2, 3 and 4 ranks (bench/results/h200-x4.md): two-shot
/// leads NCCL to 2 MiB and NCCL leads from 4 MiB (4 ranks, 4 MiB: 39.8 vs 43.7 us).
/// vLLM's custom all-reduce defaults to 8 MiB.
pub const NVLINK_CUSTOM_MAX_BYTES: u64 = 2 * MIB;

/// PCIe with P2P: tpar's kernels up to this size, NCCL above. REFERENCE.md, 4x RTX PRO 6000:
/// custom one-shot 104 us vs NCCL 109 us at 1 MB — the latency advantage is gone by 1 MiB.
pub const PCIE_CUSTOM_MAX_BYTES: u64 = MIB;

/// P2P write bandwidth as a fraction of the link's spec bandwidth: 53 / 63 GB/s
/// (REFERENCE.md: 53-56.6 GB/s measured P2P writes on Gen5 x16, 63 GB/s spec).
pub const P2P_WRITE_EFFICIENCY: f64 = 53.0 / 63.0;
/// Fraction of isolated bandwidth each GPU keeps when 8 GPUs all write all peers
/// (REFERENCE.md: 0.38-0.44 on 8 GPUs, one CPU). See [`all_to_all_efficiency`] for other
/// world sizes.
pub const PCIE_ALL_TO_ALL_EFFICIENCY: f64 = 0.4;
/// World size at which [`PCIE_ALL_TO_ALL_EFFICIENCY`] was measured.
pub const PCIE_ALL_TO_ALL_MEASURED_WORLD: usize = 8;
/// One-way latency of a P2P write, us (REFERENCE.md: 0.36-0.52 us measured on Gen5, upper end).
pub const PCIE_HOP_US: f64 = 0.52;
/// Cost of one synchronised step of staged push or one phase of hierarchical, us: a P2P
/// write plus the reader observing it. Placeholder until measured: twice [`PCIE_HOP_US`].
pub const PCIE_STEP_US: f64 = 2.0 * PCIE_HOP_US;
/// Latency of a copy through host memory when GPUs have no P2P, us
/// (REFERENCE.md: about 14 us, rtx6kpro pcie-bandwidth.md).
pub const HOST_COPY_LATENCY_US: f64 = 14.0;
/// NCCL's small-message floor on 8 PCIe GPUs, us (REFERENCE.md: 8x RTX 4090 about 42 us at
/// 8 B, nccl #1530; 8x RTX 3090 about 54 us). The lower figure, to favour NCCL when unsure.
pub const NCCL_PCIE_FLOOR_US: f64 = 42.0;

/// Most blocks a PCIe kernel uses (DESIGN.md: PCIe fabrics collapse when every SM writes).
/// Placeholder until measured.
pub const PCIE_MAX_BLOCKS: u32 = 4;
/// Bytes per block on PCIe before another block is added. Placeholder until measured.
pub const PCIE_BYTES_PER_BLOCK: u64 = 64 * KIB;
/// Most blocks an NVLink kernel uses: the kernels' cap. Measured on 4 H200s (blocks sweep,
/// bench/results/h200-x4.md): at 1 MiB, 32 blocks beat 16 (one-shot, 4 ranks: 18.75 vs 25.66 us).
pub const NVLINK_MAX_BLOCKS: u32 = MAX_KERNEL_BLOCKS;
/// Bytes per block on NVLink before another block is added: one 16-byte vector per thread.
/// Measured on 4 H200s (blocks sweep): a block moves about 8 KiB per 1.5 us to its peers,
/// so one-shot at 32 KiB, 4 ranks, took 11.62 us on one block and 5.53 us on four.
pub const NVLINK_BYTES_PER_BLOCK: u64 = 8 * KIB;

// ---------------------------------------------------------------------------------------
// Inputs and output.
// ---------------------------------------------------------------------------------------

/// Whether the call is being captured into a CUDA graph. A profile applies only to the mode
/// it was measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum CaptureMode {
    Eager,
    Graph,
}

impl CaptureMode {
    pub const ALL: [CaptureMode; 2] = [CaptureMode::Eager, CaptureMode::Graph];
    pub fn name(self) -> &'static str {
        match self {
            CaptureMode::Eager => "eager",
            CaptureMode::Graph => "graph",
        }
    }
}

impl fmt::Display for CaptureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which backend executes the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CPU rank processes over POSIX shared memory.
    Cpu,
    /// One GPU per rank.
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Cpu, Backend::Cuda];
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Backend::Cpu),
            "cuda" | "gpu" => Ok(Backend::Cuda),
            other => Err(Error::invalid("backend", format!("unknown backend {other:?}; expected cpu or cuda"))),
        }
    }
}

/// Everything the decision depends on.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub topology: &'a Topology,
    /// Ranks in the communicator. 0 is planned as 1 (the communicator refuses 0 at init).
    pub world: usize,
    /// Bytes per rank (count x dtype size).
    pub bytes: u64,
    pub dtype: DType,
    pub capture: CaptureMode,
    pub backend: Backend,
    pub profile: Option<&'a Profile>,
    pub overrides: &'a Overrides,
}

/// The decision. JSON: `{"algorithm", "transport", "blocks", "reason"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub algorithm: Algorithm,
    pub transport: Transport,
    /// Thread blocks (CTAs) per rank for tpar's kernels; 1 on the CPU backend (one thread
    /// per rank); 0 for NCCL, which picks its own channels.
    pub blocks: u32,
    /// Why, naming the numbers used.
    pub reason: String,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} over {}, {} blocks: {}", self.algorithm, self.transport, self.blocks, self.reason)
    }
}

// ---------------------------------------------------------------------------------------
// Overrides.
// ---------------------------------------------------------------------------------------

/// `TPAR_*` settings, NCCL style. The default is "no override".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// `TPAR_ALGO`: force an algorithm (`auto` or unset: none).
    pub algorithm: Option<Algorithm>,
    /// `TPAR_TRANSPORT`: force a transport.
    pub transport: Option<Transport>,
    /// `TPAR_MAX_BYTES`: above this size, NCCL (accepts 42K, 1M, 1G).
    pub max_bytes: Option<u64>,
    /// `TPAR_DISABLE`: always NCCL.
    pub disable: bool,
    /// `TPAR_DEBUG=INFO` (or `TRACE`): log each plan decision once with its reason.
    #[serde(skip)]
    pub debug: bool,
    /// `TPAR_PROFILE`: path of a tuned profile. The path is not part of the plan digest; the
    /// profile's contents are.
    #[serde(skip)]
    pub profile: Option<PathBuf>,
    /// `TPAR_BLOCKS`: thread blocks per call of tpar's kernels (1..=[`MAX_KERNEL_BLOCKS`]),
    /// instead of the size-based default. For measuring; NCCL calls are not affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// `TPAR_CHECK_CALLS=0`: tpar's kernels stop comparing every call's count, dtype and
    /// algorithm across ranks (the check costs a few tenths of a microsecond per call; a
    /// rank calling something else then produces a wrong sum instead of an error). Part of
    /// the plan digest: ranks must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_calls: Option<bool>,
}

/// Most thread blocks a tpar kernel runs with (the flag area has a slot per block).
pub const MAX_KERNEL_BLOCKS: u32 = 32;

/// The variables [`Overrides`] reads.
pub const OVERRIDE_VARS: [&str; 8] = ["TPAR_ALGO", "TPAR_TRANSPORT", "TPAR_MAX_BYTES", "TPAR_DISABLE", "TPAR_DEBUG", "TPAR_PROFILE", "TPAR_BLOCKS", "TPAR_CHECK_CALLS"];

fn config(var: &'static str, value: &str, reason: impl fmt::Display) -> Error {
    Error::Config { var, value: value.to_string(), reason: reason.to_string() }
}

impl Overrides {
    /// Reads the `TPAR_*` variables of this process.
    /// A value that is not UTF-8 is a `Config` error (`std::env::vars` would panic on it).
    pub fn from_env() -> Result<Overrides> {
        let mut pairs = Vec::new();
        for var in OVERRIDE_VARS {
            if let Some(v) = std::env::var_os(var) {
                let v = v.into_string().map_err(|raw| config(var, &raw.to_string_lossy(), "not valid UTF-8"))?;
                pairs.push((var, v));
            }
        }
        Overrides::from_pairs(pairs)
    }

    /// Parses (name, value) pairs; other names are ignored, empty values mean unset.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Overrides>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut o = Overrides::default();
        for (k, v) in pairs {
            let (k, raw) = (k.as_ref(), v.as_ref());
            let v = raw.trim();
            if v.is_empty() {
                continue;
            }
            match k {
                "TPAR_ALGO" => {
                    o.algorithm = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        Some(v.parse::<Algorithm>().map_err(|e| config("TPAR_ALGO", raw, e))?)
                    }
                }
                "TPAR_TRANSPORT" => {
                    o.transport = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        Some(v.parse::<Transport>().map_err(|e| config("TPAR_TRANSPORT", raw, e))?)
                    }
                }
                "TPAR_MAX_BYTES" => o.max_bytes = Some(parse_bytes(v).map_err(|e| config("TPAR_MAX_BYTES", raw, e))?),
                "TPAR_DISABLE" => o.disable = parse_bool(v).ok_or_else(|| config("TPAR_DISABLE", raw, "expected 1/0, true/false, yes/no or on/off"))?,
                "TPAR_DEBUG" => {
                    o.debug = match v.to_ascii_uppercase().as_str() {
                        "INFO" | "TRACE" => true,
                        "NONE" | "OFF" | "VERSION" | "WARN" => false,
                        _ => return Err(config("TPAR_DEBUG", raw, "expected NONE, VERSION, WARN, INFO or TRACE")),
                    }
                }
                "TPAR_PROFILE" => o.profile = Some(PathBuf::from(v)),
                "TPAR_CHECK_CALLS" => {
                    o.check_calls = Some(parse_bool(v).ok_or_else(|| config("TPAR_CHECK_CALLS", raw, "expected 1/0, true/false, yes/no or on/off"))?)
                }
                "TPAR_BLOCKS" => {
                    o.blocks = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        match v.parse::<u32>() {
                            Ok(b) if (1..=MAX_KERNEL_BLOCKS).contains(&b) => Some(b),
                            _ => return Err(config("TPAR_BLOCKS", raw, format!("expected auto or 1..={MAX_KERNEL_BLOCKS}"))),
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(o)
    }

    /// Refuses overrides that cannot run correctly on this fabric, naming the variable and
    /// why. Call at init: [`plan`] itself ignores such overrides (it must return something),
    /// but a forced setting that is silently ignored would be a lie.
    pub fn validate(&self, topology: &Topology, world: usize, backend: Backend) -> Result<()> {
        let world = world.max(1);
        let fabric = Fabric::of(topology, world, backend);
        match backend {
            Backend::Cpu => {
                if self.disable {
                    return Err(unsupported("TPAR_DISABLE=1", "the CPU backend has no NCCL to fall back to"));
                }
                if let Some(m) = self.max_bytes {
                    return Err(unsupported(&format!("TPAR_MAX_BYTES={m}"), "the CPU backend has no NCCL to send larger messages to"));
                }
            }
            Backend::Cuda => {}
        }
        if self.disable && self.algorithm.is_some_and(|a| a != Algorithm::Nccl) {
            return Err(unsupported("TPAR_DISABLE=1 with TPAR_ALGO", "TPAR_DISABLE forces NCCL; unset one of them"));
        }
        if let Some(t) = self.transport {
            transport_usable(t, &fabric).map_err(|why| unsupported(&format!("TPAR_TRANSPORT={t}"), &why))?;
        }
        if let Some(a) = self.algorithm {
            let t = self.transport.unwrap_or_else(|| natural_transport(a, &fabric));
            check(a, t, &fabric).map_err(|why| unsupported(&format!("TPAR_ALGO={a} over {t}"), &why))?;
        }
        Ok(())
    }
}

fn unsupported(what: &str, why: &str) -> Error {
    Error::Unsupported { what: what.to_string(), reason: why.to_string() }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Parses a size the nccl-tests way: `4096`, `42K`, `1M`, `2G` (K = 1024; `KB`, `KiB` too).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let bad = || Error::invalid("bytes", format!("cannot read {s:?} as a size; expected e.g. 4096, 42K, 1M, 1G"));
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| Error::invalid("bytes", format!("{s:?} overflows 64 bits")))
}

/// `42 KiB`, `1 MiB`, `100 B`: exact, for reasons and tables.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if b >= size && b % size == 0 {
            return format!("{} {unit}", b / size);
        }
    }
    format!("{b} B")
}

// ---------------------------------------------------------------------------------------
// The fabric the first `world` ranks see.
// ---------------------------------------------------------------------------------------

/// What the plan needs to know about the ranks' GPUs.
#[derive(Clone, Debug)]
struct Fabric {
    backend: Backend,
    world: usize,
    gpus: usize,
    /// Every pair among the first `world` GPUs has P2P write / read.
    p2p_write: bool,
    p2p_read: bool,
    /// First pair lacking P2P write, for reasons.
    missing_write: Option<(usize, usize)>,
    missing_read: Option<(usize, usize)>,
    /// Every pair is NVLink.
    nvlink: bool,
    islands: usize,
    /// GPUs in the largest island.
    largest_island: usize,
    /// Slowest PCIe link among the ranks' GPUs, GB/s per direction.
    pcie_gbps: f64,
}

impl Fabric {
    fn of(t: &Topology, world: usize, backend: Backend) -> Fabric {
        let used = world.min(t.gpu_count());
        let mut f = Fabric {
            backend,
            world,
            gpus: t.gpu_count(),
            p2p_write: true,
            p2p_read: true,
            missing_write: None,
            missing_read: None,
            nvlink: used > 1,
            islands: t.islands_of(used).len(),
            largest_island: t.islands_of(used).iter().map(Vec::len).max().unwrap_or(0),
            pcie_gbps: t.gpus.iter().take(used).map(|g| g.pcie_gbps).fold(f64::INFINITY, f64::min),
        };
        if !f.pcie_gbps.is_finite() {
            f.pcie_gbps = 0.0;
        }
        for i in 0..used {
            for j in 0..used {
                if i == j {
                    continue;
                }
                let link = t.link(i, j).copied();
                let (w, r, nv) = link.map(|l| (l.p2p_write, l.p2p_read, l.class.is_nvlink())).unwrap_or((false, false, false));
                if !w && f.missing_write.is_none() {
                    f.missing_write = Some((i, j));
                }
                if !r && f.missing_read.is_none() {
                    f.missing_read = Some((i, j));
                }
                f.p2p_write &= w;
                f.p2p_read &= r;
                f.nvlink &= nv;
            }
        }
        f
    }

    fn fits(&self) -> bool {
        self.world <= self.gpus
    }

    /// Effective P2P write bandwidth, GB/s.
    fn p2p_gbps(&self) -> f64 {
        self.pcie_gbps * P2P_WRITE_EFFICIENCY
    }
}

/// Whether `transport` can carry anything at all here.
fn transport_usable(t: Transport, f: &Fabric) -> std::result::Result<(), String> {
    match (f.backend, t) {
        (Backend::Cpu, Transport::Shm) => Ok(()),
        (Backend::Cpu, Transport::P2p | Transport::Host | Transport::Nccl) => {
            Err(format!("CPU ranks exchange data only through shared memory (shm), not {t}"))
        }
        (Backend::Cuda, Transport::Shm) => Err("shm carries CPU ranks; GPU ranks use p2p, host or nccl".into()),
        (Backend::Cuda, Transport::Nccl) => Ok(()),
        (Backend::Cuda, Transport::P2p | Transport::Host) if !f.fits() => {
            Err(format!("world {} exceeds the {} GPUs of this topology; only NCCL spans them", f.world, f.gpus))
        }
        (Backend::Cuda, Transport::P2p) => match f.missing_write {
            None => Ok(()),
            Some((i, j)) => Err(format!("GPU{i} cannot write GPU{j} peer-to-peer")),
        },
        (Backend::Cuda, Transport::Host) => Ok(()),
    }
}

/// The transport an algorithm runs over here when none is forced.
fn natural_transport(a: Algorithm, f: &Fabric) -> Transport {
    match f.backend {
        // CPU ranks have one transport; `check` refuses algorithms the CPU backend lacks.
        Backend::Cpu => Transport::Shm,
        Backend::Cuda => match a {
            Algorithm::Nccl => Transport::Nccl,
            Algorithm::OneshotPush
            | Algorithm::OneshotPull
            | Algorithm::TwoshotPush
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast => {
                if f.p2p_write {
                    Transport::P2p
                } else {
                    Transport::Host
                }
            }
        },
    }
}

/// Whether `a` over `t` reduces correctly here; `Err` says why not.
fn check(a: Algorithm, t: Transport, f: &Fabric) -> std::result::Result<(), String> {
    transport_usable(t, f)?;
    match t {
        Transport::Shm => {
            if Algorithm::CPU.contains(&a) {
                Ok(())
            } else {
                Err(format!("the CPU backend runs {}, not {a}", Algorithm::CPU.map(|a| a.name()).join(", ")))
            }
        }
        Transport::Nccl => match a {
            Algorithm::Nccl => Ok(()),
            Algorithm::OneshotPush
            | Algorithm::OneshotPull
            | Algorithm::TwoshotPush
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast => Err(format!("the nccl transport runs only NCCL's own all-reduce, not {a}")),
        },
        Transport::Host => match a {
            Algorithm::OneshotPush | Algorithm::TwoshotPush => Ok(()),
            Algorithm::OneshotPull
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast
            | Algorithm::Nccl => Err(format!("the host transport carries one-shot and two-shot push only, not {a}")),
        },
        Transport::P2p => match a {
            Algorithm::Nccl => Err("NCCL runs over its own transport (nccl), not p2p".into()),
            Algorithm::OneshotPush | Algorithm::TwoshotPush | Algorithm::StagedPush => Ok(()),
            Algorithm::OneshotPull | Algorithm::TwoshotPull | Algorithm::GatherBcast => match f.missing_read {
                None => Ok(()),
                Some((i, j)) => Err(format!("{a} reads peer memory but GPU{i} cannot read GPU{j}")),
            },
            Algorithm::Hierarchical => {
                if f.islands >= 2 {
                    Ok(())
                } else {
                    Err(format!("hierarchical needs at least two islands; the {} ranks form {}", f.world, f.islands))
                }
            }
        },
    }
}

// ---------------------------------------------------------------------------------------
// Floor arithmetic (REFERENCE.md): lower bounds used to place default crossovers.
// ---------------------------------------------------------------------------------------

/// Transfer time of `bytes` at `gbps`, us.
fn xfer_us(bytes: f64, gbps: f64) -> f64 {
    if gbps <= 0.0 {
        f64::INFINITY
    } else {
        bytes / (gbps * 1e3)
    }
}

/// Fraction of isolated P2P bandwidth left when `world` GPUs all write all peers. Known
/// points: 2 ranks have one flow each way (1.0); 8 ranks measured 0.4 (REFERENCE.md).
/// Between them: linear, an assumption until measured. Beyond 8: held at 0.4 (no data).
pub fn all_to_all_efficiency(world: usize) -> f64 {
    let m = PCIE_ALL_TO_ALL_MEASURED_WORLD;
    if world <= 2 {
        1.0
    } else if world >= m {
        PCIE_ALL_TO_ALL_EFFICIENCY
    } else {
        let t = (world - 2) as f64 / (m - 2) as f64;
        1.0 - t * (1.0 - PCIE_ALL_TO_ALL_EFFICIENCY)
    }
}

/// One-shot push: each rank writes (n-1)·S out of its own link, all links busy at once.
fn oneshot_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    PCIE_HOP_US + xfer_us((n as f64 - 1.0) * s as f64, gbps * all_to_all_efficiency(n))
}

/// Staged push: one-shot push in n-1 synchronised steps (step k: rank i writes S to rank
/// i+k), so each link carries one flow at a time, at full speed. The schedule the CUDA
/// kernel (`kernels/staged_push.cu`) and the simulator use.
fn staged_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    (n as f64 - 1.0) * (PCIE_STEP_US + xfer_us(s as f64, gbps))
}

/// Hierarchical: one-shot inside the largest island (k ranks), then exchange island sums
/// with the other m-1 islands, one flow each: two phases.
fn hierarchical_floor_us(k: usize, m: usize, s: u64, gbps: f64) -> f64 {
    2.0 * PCIE_STEP_US
        + xfer_us((k as f64 - 1.0) * s as f64, gbps * all_to_all_efficiency(k))
        + xfer_us((m as f64 - 1.0) * s as f64, gbps)
}

/// One-shot through host memory: write S once, read the other n-1 inputs, through one link.
fn host_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    HOST_COPY_LATENCY_US + xfer_us(n as f64 * s as f64, gbps)
}

/// NCCL: its small-message floor plus a ring's 2(n-1)/n·S.
fn nccl_floor_us(n: usize, s: u64, gbps: f64) -> f64 {
    let n_f = n as f64;
    NCCL_PCIE_FLOOR_US + xfer_us(2.0 * (n_f - 1.0) / n_f * s as f64, gbps)
}

fn blocks_for(bytes: u64, per_block: u64, max: u32) -> u32 {
    let want = bytes.div_ceil(per_block.max(1)).max(1);
    u32::try_from(want).unwrap_or(u32::MAX).min(max)
}

// ---------------------------------------------------------------------------------------
// The decision.
// ---------------------------------------------------------------------------------------

/// Decides how to run one all-reduce. Pure and total: every input yields a plan whose
/// algorithm and transport are correct on the fabric.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let world = input.world.max(1);
    let f = Fabric::of(input.topology, world, input.backend);
    let mut notes: Vec<String> = Vec::new();
    if input.world == 0 {
        notes.push("world 0 planned as 1 (the communicator refuses 0)".into());
    }
    let o = input.overrides;
    let s = input.bytes;

    let finish = |mut p: Plan, mut notes: Vec<String>| {
        if let Some(b) = o.blocks {
            if matches!(p.transport, Transport::P2p | Transport::Host) {
                notes.push(format!("TPAR_BLOCKS={b} (default {})", p.blocks));
                p.blocks = b;
            }
        }
        if !notes.is_empty() {
            p.reason = format!("{}; {}", p.reason, notes.join("; "));
        }
        p
    };

    // 1. Settings that send everything (or everything large) to NCCL.
    match input.backend {
        Backend::Cpu => {
            if o.disable {
                notes.push("TPAR_DISABLE ignored: the CPU backend has no NCCL (validate refuses it)".into());
            }
            if o.max_bytes.is_some() {
                notes.push("TPAR_MAX_BYTES ignored: the CPU backend has no NCCL (validate refuses it)".into());
            }
        }
        Backend::Cuda => {
            if o.disable {
                return finish(nccl("TPAR_DISABLE=1: always NCCL".into()), notes);
            }
            if let Some(m) = o.max_bytes {
                if s > m {
                    return finish(nccl(format!("{} > TPAR_MAX_BYTES={}: NCCL", human_bytes(s), human_bytes(m))), notes);
                }
            }
            if !f.fits() {
                let why = format!("world {world} exceeds the {} GPUs of this topology (ranks on other hosts or sharing GPUs): NCCL", f.gpus);
                if let Some(a) = o.algorithm.filter(|&a| a != Algorithm::Nccl) {
                    notes.push(format!("TPAR_ALGO={a} ignored: only NCCL spans them (validate refuses it)"));
                }
                return finish(nccl(why), notes);
            }
        }
    }

    // 2. A forced algorithm and/or transport.
    if let Some(a) = o.algorithm {
        let t = o.transport.unwrap_or_else(|| natural_transport(a, &f));
        match check(a, t, &f) {
            Ok(()) => return finish(make(a, t, s, &f, format!("TPAR_ALGO={a} forced")), notes),
            Err(why) => notes.push(format!("TPAR_ALGO={a} over {t} ignored: {why} (validate refuses it)")),
        }
    }
    let mut forced_transport = None;
    if let Some(t) = o.transport {
        match transport_usable(t, &f) {
            Ok(()) => forced_transport = Some(t),
            Err(why) => notes.push(format!("TPAR_TRANSPORT={t} ignored: {why} (validate refuses it)")),
        }
    }
    if forced_transport == Some(Transport::Nccl) {
        return finish(nccl("TPAR_TRANSPORT=nccl: NCCL".into()), notes);
    }

    // 3. A tuned profile, when it was measured here.
    let mut reads_win = false;
    if let Some(p) = input.profile {
        let here = ProfileFingerprint::of_input(input.topology, world, input.backend, input.capture);
        match p.mismatch(&here) {
            Some(why) => notes.push(format!("profile ignored: {why}")),
            None => {
                reads_win = p.reads_beat_writes;
                match p.lookup(input.dtype, s) {
                    Some(bucket) => {
                        let a = bucket.algorithm;
                        let t = forced_transport.unwrap_or_else(|| natural_transport(a, &f));
                        match check(a, t, &f) {
                            Ok(()) => {
                                let why = format!(
                                    "profile: {a} fastest for {} <= {} ({} ranks, {}, median {:.1} us)",
                                    human_bytes(s),
                                    human_bytes(bucket.max_bytes),
                                    world,
                                    input.dtype,
                                    bucket.median_us
                                );
                                return finish(make(a, t, s, &f, why), notes);
                            }
                            Err(why) => notes.push(format!("profile's {a} ignored: {why}")),
                        }
                    }
                    None => notes.push(format!("profile has no bucket for {} {} at {} ranks: defaults", human_bytes(s), input.dtype, world)),
                }
            }
        }
    }

    // 4. Defaults from the fabric.
    let p = default_plan(s, &f, forced_transport, reads_win);
    finish(p, notes)
}

fn nccl(reason: String) -> Plan {
    Plan { algorithm: Algorithm::Nccl, transport: Transport::Nccl, blocks: 0, reason }
}

/// Builds a plan for a checked (algorithm, transport), choosing blocks.
fn make(a: Algorithm, t: Transport, s: u64, f: &Fabric, reason: String) -> Plan {
    let blocks = match t {
        Transport::Nccl => 0,
        Transport::Shm => 1,
        Transport::P2p if f.nvlink => blocks_for(s, NVLINK_BYTES_PER_BLOCK, NVLINK_MAX_BLOCKS),
        Transport::P2p | Transport::Host => blocks_for(s, PCIE_BYTES_PER_BLOCK, PCIE_MAX_BLOCKS),
    };
    Plan { algorithm: a, transport: t, blocks, reason }
}

/// The default decision for a feasible fabric (world fits, backend known).
fn default_plan(s: u64, f: &Fabric, forced: Option<Transport>, reads_win: bool) -> Plan {
    let n = f.world;
    let size = human_bytes(s);
    // Pull only where a measured profile says reads beat writes, and reads are possible.
    let pull = |a: Algorithm| -> (Algorithm, &'static str) {
        let alt = match a {
            Algorithm::OneshotPush => Algorithm::OneshotPull,
            Algorithm::TwoshotPush => Algorithm::TwoshotPull,
            Algorithm::OneshotPull
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast
            | Algorithm::Nccl => a,
        };
        let t = forced.unwrap_or_else(|| natural_transport(alt, f));
        if reads_win && alt != a && check(alt, t, f).is_ok() {
            (alt, " (pull: the profile measured reads beating writes)")
        } else {
            (a, "")
        }
    };
    match f.backend {
        Backend::Cpu => {
            if n == 1 {
                return make(Algorithm::OneshotPush, Transport::Shm, s, f, "world 1: copy".into());
            }
            let base = if s <= CPU_ONESHOT_MAX_BYTES { Algorithm::OneshotPush } else { Algorithm::TwoshotPush };
            let (a, why) = pull(base);
            let cmp = if s <= CPU_ONESHOT_MAX_BYTES { "<=" } else { ">" };
            let reason = format!("CPU ranks over shm: {size} {cmp} {} (CPU one-shot limit, measured on CPU ranks){why}", human_bytes(CPU_ONESHOT_MAX_BYTES));
            make(a, Transport::Shm, s, f, reason)
        }
        Backend::Cuda => {
            if n == 1 {
                let t = forced.unwrap_or(Transport::P2p);
                return make(Algorithm::OneshotPush, t, s, f, "world 1: copy".into());
            }
            let use_host = forced == Some(Transport::Host) || !f.p2p_write;
            if use_host {
                let b = f.pcie_gbps * P2P_WRITE_EFFICIENCY;
                let (h, c) = (host_floor_us(n, s, b), nccl_floor_us(n, s, b));
                let why_host = match f.missing_write {
                    Some((i, j)) if forced != Some(Transport::Host) => format!("no P2P (GPU{i} cannot write GPU{j})"),
                    Some(_) | None => "TPAR_TRANSPORT=host".to_string(),
                };
                let numbers = format!("host floor {h:.1} us vs NCCL floor {c:.1} us at {size}, {n} ranks, {b:.1} GB/s");
                return if h <= c {
                    make(Algorithm::OneshotPush, Transport::Host, s, f, format!("{why_host}: one-shot push through host memory: {numbers}"))
                } else {
                    nccl(format!("{why_host}: {numbers}: NCCL"))
                };
            }
            if f.nvlink {
                let limit = if n <= 2 {
                    NVLINK_ONESHOT_MAX_BYTES_2
                } else if n <= 4 {
                    NVLINK_ONESHOT_MAX_BYTES_4
                } else {
                    NVLINK_ONESHOT_MAX_BYTES_8
                };
                let lim = human_bytes(limit);
                let max = human_bytes(NVLINK_CUSTOM_MAX_BYTES);
                return if s <= limit {
                    let (a, why) = pull(Algorithm::OneshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {size} <= {lim} one-shot limit{why}"))
                } else if s <= NVLINK_CUSTOM_MAX_BYTES {
                    let (a, why) = pull(Algorithm::TwoshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {lim} < {size} <= {max}: two-shot{why}"))
                } else {
                    nccl(format!("NVLink, {n} ranks: {size} > {max}: bandwidth-bound, NCCL"))
                };
            }
            let b = f.p2p_gbps();
            let max = human_bytes(PCIE_CUSTOM_MAX_BYTES);
            if s > PCIE_CUSTOM_MAX_BYTES {
                return nccl(format!("PCIe P2P, {n} ranks: {size} > {max}: no latency left to win, NCCL"));
            }
            let one = oneshot_floor_us(n, s, b);
            let eff = all_to_all_efficiency(n);
            if f.islands >= 2 {
                let k = f.largest_island;
                let hier = hierarchical_floor_us(k, f.islands, s, b);
                let numbers = format!(
                    "one-shot floor {one:.1} us vs hierarchical floor {hier:.1} us ({} islands, {size}, P2P {b:.1} GB/s x {eff:.2} all-to-all)",
                    f.islands
                );
                return if one <= hier {
                    let (a, why) = pull(Algorithm::OneshotPush);
                    make(a, Transport::P2p, s, f, format!("PCIe P2P, {n} ranks: {numbers}{why}"))
                } else {
                    make(Algorithm::Hierarchical, Transport::P2p, s, f, format!("PCIe P2P, {n} ranks: {numbers}"))
                };
            }
            if n == 2 {
                let (a, why) = pull(Algorithm::OneshotPush);
                return make(a, Transport::P2p, s, f, format!("PCIe P2P, 2 ranks: one flow each way, one-shot is already staged; {size} <= {max}{why}"));
            }
            let staged = staged_floor_us(n, s, b);
            let numbers = format!(
                "one-shot floor {one:.1} us vs staged floor {staged:.1} us ({size}, P2P {b:.1} GB/s x {eff:.2} all-to-all, hop {PCIE_HOP_US} us, step {PCIE_STEP_US} us)"
            );
            if one <= staged {
                let (a, why) = pull(Algorithm::OneshotPush);
                make(a, Transport::P2p, s, f, format!("PCIe P2P, one island, {n} ranks: {numbers}{why}"))
            } else {
                make(Algorithm::StagedPush, Transport::P2p, s, f, format!("PCIe P2P, one island, {n} ranks: {numbers}"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cross-rank agreement and debug logging.
// ---------------------------------------------------------------------------------------

/// Digest of everything besides (world, bytes, dtype, capture) that the plan depends on:
/// the topology's [`Topology::hash`], the profile's contents and the overrides that change
/// decisions (not `TPAR_DEBUG`, not the profile's path). FNV-1a over canonical JSON. Ranks
/// compare it at init; unequal digests mean ranks could pick different algorithms.
pub fn plan_fingerprint(topology: &Topology, profile: Option<&Profile>, overrides: &Overrides) -> u64 {
    let canon = serde_json::json!({
        "topology": format!("{:016x}", topology.hash()),
        "profile": profile,
        "overrides": overrides,
    });
    fnv1a64(canon.to_string().as_bytes())
}

/// [`plan`], and when `TPAR_DEBUG=INFO` log the decision to stderr once per distinct
/// (world, bytes, dtype, capture, backend, plan) — NCCL's `INFO` habit.
pub fn plan_logged(input: &PlanInput<'_>) -> Plan {
    let p = plan(input);
    if input.overrides.debug {
        let line = format!(
            "tpar INFO plan: world {} {} {} {} {}: {}",
            input.world,
            human_bytes(input.bytes),
            input.dtype,
            input.capture,
            input.backend,
            p
        );
        if first_time(&line) {
            tracing::info!(target: "tpar::plan", "{line}");
            eprintln!("{line}");
        }
    }
    p
}

/// True the first time this process sees `line` (a poisoned lock errs towards logging).
fn first_time(line: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    let key = fnv1a64(line.as_bytes());
    SEEN.get_or_init(|| Mutex::new(HashSet::new())).lock().map(|mut s| s.insert(key)).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn run(t: &Topology, world: usize, bytes: u64, backend: Backend, o: &Overrides) -> Plan {
        plan(&PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend, profile: None, overrides: o })
    }

    #[test]
    fn debug_logs_each_decision_once() {
        assert!(first_time("tpar test line A"));
        assert!(!first_time("tpar test line A"));
        assert!(first_time("tpar test line B"));
        let t = presets::pcie_2();
        let o = Overrides::from_pairs([("TPAR_DEBUG", "INFO")]).unwrap();
        let input = PlanInput { topology: &t, world: 2, bytes: 8, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o };
        assert_eq!(plan_logged(&input), plan(&input));
    }

    #[test]
    fn all_to_all_efficiency_runs_from_one_flow_to_the_measured_eight() {
        assert_eq!(all_to_all_efficiency(2), 1.0);
        assert!((all_to_all_efficiency(8) - 0.4).abs() < 1e-12);
        assert!((all_to_all_efficiency(16) - 0.4).abs() < 1e-12);
        assert!((all_to_all_efficiency(5) - 0.7).abs() < 1e-12);
        for n in 2..16 {
            assert!(all_to_all_efficiency(n + 1) <= all_to_all_efficiency(n));
        }
    }

    #[test]
    fn parse_bytes_accepts_nccl_tests_suffixes() {
        assert_eq!(parse_bytes("42K").unwrap(), 42 * 1024);
        assert_eq!(parse_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1g").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64KiB").unwrap(), 65536);
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("1.5K").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert_eq!(human_bytes(43008), "42 KiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(0), "0 B");
    }

    #[test]
    fn the_motivating_case_gets_a_custom_kernel() {
        // 8x RTX PRO 6000 over PCIe, 42 KiB verify all-reduce: not NCCL.
        let t = presets::rtxpro6000_pcie_switch_8();
        let p = run(&t, 8, 42 * 1024, Backend::Cuda, &Overrides::default());
        assert_eq!(p.transport, Transport::P2p, "{p}");
        assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
        assert!(p.reason.contains("floor"), "{p}");
        assert!(p.blocks >= 1 && p.blocks <= PCIE_MAX_BLOCKS);
    }

    #[test]
    fn shapes_follow_the_design() {
        let o = Overrides::default();
        let h = presets::h200_nvswitch_8();
        assert_eq!(run(&h, 8, 16 * 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
        assert_eq!(run(&h, 8, 1 << 20, Backend::Cuda, &o).algorithm, Algorithm::TwoshotPush);
        assert_eq!(run(&h, 8, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let sw = presets::rtxpro6000_pcie_switch_8();
        assert_eq!(run(&sw, 8, 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
        assert_eq!(run(&sw, 8, 512 * 1024, Backend::Cuda, &o).algorithm, Algorithm::StagedPush);
        assert_eq!(run(&sw, 8, 16 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let ds = presets::rtxpro6000_dualsocket_8();
        assert_eq!(run(&ds, 8, 256 * 1024, Backend::Cuda, &o).algorithm, Algorithm::Hierarchical);
        let np = presets::rtx4090_nop2p_4();
        let p = run(&np, 4, 14 * 1024, Backend::Cuda, &o);
        assert_eq!((p.algorithm, p.transport), (Algorithm::OneshotPush, Transport::Host), "{p}");
        assert_eq!(run(&np, 4, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        assert_eq!(run(&np, 8, 8, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let c = Topology::cpu();
        let p = run(&c, 4, 8, Backend::Cpu, &o);
        assert_eq!((p.algorithm, p.transport, p.blocks), (Algorithm::OneshotPush, Transport::Shm, 1));
        assert_eq!(run(&c, 4, 1 << 20, Backend::Cpu, &o).algorithm, Algorithm::TwoshotPush);
        let p = run(&h, 1, 1 << 20, Backend::Cuda, &o);
        assert!(p.reason.starts_with("world 1: copy"), "{p}");
    }

    #[test]
    fn infeasible_overrides_are_ignored_by_plan_and_refused_by_validate() {
        let np = presets::rtx4090_nop2p_4();
        let o = Overrides::from_pairs([("TPAR_ALGO", "oneshot-pull")]).unwrap();
        let p = run(&np, 4, 1024, Backend::Cuda, &o);
        assert_ne!(p.algorithm, Algorithm::OneshotPull);
        assert!(p.reason.contains("TPAR_ALGO=oneshot-pull over host ignored"), "{p}");
        assert!(o.validate(&np, 4, Backend::Cuda).is_err());
    }
}
