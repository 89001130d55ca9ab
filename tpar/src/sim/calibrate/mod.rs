//! The calibration table: docs/references.md figures, the simulator's prediction for each, and
//! the error, so that docs/sim.md and the tests read the same numbers.
//!
//! Owns: the figures (copied from docs/references.md with their source), the machines they were
//! measured on (presets, or small topologies built here for machines no preset describes),
//! and the error bound each figure is held to. Must never: change a [`Params`] default (that
//! is `params`, where each fitted value says which figure it was fitted to).
//!
//! Error = (predicted - measured) / measured. A range in docs/references.md is compared against
//! its midpoint. "D" marks a figure derived by arithmetic from docs/references.md (docs/model.md
//! shows the arithmetic).
//!
//! Every row is in one set: **fitted** (a parameter was chosen with it in view), **held out**
//! (no parameter was; the honest test), or a **known miss** (shown with its reason, outside
//! the bounds). The bounds, for every row that is not a known miss: within a factor
//! [`MAX_FACTOR`] of the measurement; over the PCIe rows, median |error| at most
//! [`MAX_MEDIAN_ERROR`] (docs/sim.md prints both sets' median and worst, from [`markdown`]).

mod machines;
mod section;

pub use machines::{consumer_nop2p_8, rtxpro6000_root_ports, rtxpro6000_two_socket_root_ports, v100_switch_4};
pub use section::{markdown, summary, DOC_BEGIN, DOC_END};

use super::fabric::{Endpoint, Fabric, Op};
use super::flows;
use super::params::{Launch, Params};
use super::Simulator;
use machines::switch_box;
use crate::error::Result;
use crate::topology::{presets, Link, LinkClass, Topology};
use crate::kinds::Algorithm;

/// What a figure measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantity {
    /// All-reduce time of `algorithm` at `bytes`, us.
    AllReduce { algorithm: Algorithm, bytes: usize },
    /// Large all-to-all writes (copy engines), aggregate over the sum of isolated pairs.
    AllToAllRatio,
    /// Two GPUs of one switch copying both ways at once, GB/s total.
    SwitchPairBidirGbps,
    /// One copy between two GPUs on different root ports of one socket, GB/s.
    SingleHopGbps,
    /// What one GPU sends across the socket link while all ordered pairs copy, GB/s.
    CrossSocketAllFlowsGbps,
    /// One-way latency of a posted write GPU a -> GPU b (p2pBandwidthLatencyTest's), us.
    WriteLatencyUs { a: usize, b: usize },
    /// One-way flag latency a -> b (half a ping-pong: store + poll), us.
    FlagLatencyUs { a: usize, b: usize },
    /// Round trip of a 128 B read by b of a's memory, idle, us.
    ReadRttUs { a: usize, b: usize },
    /// The same while every GPU reads every peer with its read tags full, us.
    LoadedReadRttUs { a: usize, b: usize },
    /// One copy-engine copy across the socket link, GB/s.
    CrossSocketGbps,
    /// Pull one-shot time over push one-shot time at `bytes`.
    PullOverPush { bytes: usize },
    /// Large copy-engine reads, `pattern` of the GPUs reading peers at once (p2pmark's
    /// bandwidth mode): total bytes over the time until the last lands, GB/s.
    ReadAggregateGbps { pattern: &'static str },
}

impl Quantity {
    /// What the row measures, in words (docs/sim.md's "what" column).
    pub fn describe(&self, launch: Launch) -> String {
        let mode = if launch == Launch::Graph { "graph" } else { "eager" };
        match *self {
            Quantity::AllReduce { algorithm, bytes } => format!("{algorithm} {} ({mode})", crate::units::human_bytes(bytes as u64)),
            Quantity::AllToAllRatio => "aggregate / isolated".into(),
            Quantity::SwitchPairBidirGbps => "GB/s, both ways".into(),
            Quantity::SingleHopGbps => "GB/s, one copy".into(),
            Quantity::CrossSocketAllFlowsGbps => "GB/s per GPU across sockets".into(),
            Quantity::WriteLatencyUs { a, b } => format!("write latency GPU{a}->GPU{b}, us"),
            Quantity::FlagLatencyUs { a, b } => format!("flag one way GPU{a}->GPU{b}, us"),
            Quantity::ReadRttUs { a, b } => format!("128 B read GPU{b}<-GPU{a}, us"),
            Quantity::LoadedReadRttUs { a, b } => format!("128 B read GPU{b}<-GPU{a}, all reading, us"),
            Quantity::CrossSocketGbps => "GB/s, one copy across sockets".into(),
            Quantity::PullOverPush { bytes } => format!("oneshot-pull / oneshot-push at {} ({mode})", crate::units::human_bytes(bytes as u64)),
            Quantity::ReadAggregateGbps { pattern } => format!("GB/s aggregate, {pattern}"),
        }
    }

    /// Whether the figure is a time in us (else a rate or a ratio).
    pub fn is_time(&self) -> bool {
        matches!(
            self,
            Quantity::AllReduce { .. }
                | Quantity::WriteLatencyUs { .. }
                | Quantity::FlagLatencyUs { .. }
                | Quantity::ReadRttUs { .. }
                | Quantity::LoadedReadRttUs { .. }
        )
    }
}

/// A published NCCL all-reduce sweep on a preset's exact box: the calibration's rows for that
/// box, the plan's "published" NCCL times and `tpar model`'s measured NCCL baseline all read
/// these numbers (a test checks each point is a calibration row).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NcclFigures {
    pub preset: &'static str,
    /// The calibration group (docs/sim.md) and where the figures come from.
    pub group: &'static str,
    pub source: &'static str,
    pub world: usize,
    pub launch: Launch,
    /// (bytes, us), ascending.
    pub points: &'static [(usize, f64)],
}

/// Every [`NcclFigures`]. The ASUS sweep leaves out its 256 B and 32 MiB points, which the
/// model misses for stated reasons (docs/sim.md, known misses).
pub const NCCL_FIGURES: &[NcclFigures] = &[
    NcclFigures {
        preset: "rtxpro6000-dualsocket-8",
        group: "S",
        source: "rtx6kpro asus-esc8000a doc, 8 GPU all-reduce table (NCCL untuned, eager)",
        world: 8,
        launch: Launch::Eager,
        points: &[(4 * KIB, 65.6), (8 * KIB, 70.8), (16 * KIB, 69.3), (64 * KIB, 79.5), (256 * KIB, 86.2)],
    },
    NcclFigures { preset: "h200-nvswitch-8", group: "E", source: "sglang PR #22734 (pynccl, CUDA graph)", world: 8, launch: Launch::Graph, points: &[(16 * KIB, 17.8), (32 * KIB, 19.6), (64 * KIB, 19.9)] },
];

/// The published NCCL sweep for ranks `0..world` of `t` in `launch` mode, if `t` is a
/// preset's exact box and one was published.
pub fn published_nccl(t: &Topology, world: usize, launch: Launch) -> Option<&'static NcclFigures> {
    let name = presets::exact(t)?;
    NCCL_FIGURES.iter().find(|f| f.preset == name && f.world == world && f.launch == launch)
}

/// Every row that is not a known miss is predicted within this factor of its measurement
/// (the bound: predicted/measured in [1/1.5, 1.5]).
pub const MAX_FACTOR: f64 = 1.5;
/// NVLink rows are outside this calibration's scope (PCIe); they are shown and held to this
/// looser factor so they cannot rot unseen (F, MSCCL++ in graphs, sits ~2 us above the model).
pub const NVLINK_MAX_FACTOR: f64 = 1.6;
/// Median |error| over the PCIe rows, misses included, at most this.
pub const MAX_MEDIAN_ERROR: f64 = 0.25;

/// Which set a row is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// A parameter was chosen with this figure in view.
    Fitted,
    /// No parameter was: a prediction.
    HeldOut,
    /// Shown, not bounded, with the reason the model misses it.
    Miss(&'static str),
}

/// One row of the calibration table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Figure group, as in docs/sim.md.
    pub figure: &'static str,
    pub source: &'static str,
    pub machine: String,
    pub world: usize,
    pub launch: Launch,
    pub quantity: Quantity,
    /// docs/references.md value (midpoint of a range).
    pub measured: f64,
    pub predicted: f64,
    /// Bound the test holds |error| to; `None`: shown, not bounded (a known miss).
    pub bound: Option<f64>,
    /// Whether a parameter was fitted to this figure.
    pub fitted_to: bool,
    /// Fitted, held out, or a known miss (with why).
    pub set: Set,
    /// Whether the machine is PCIe-only (the rows the median and the factor are held to;
    /// NVLink rows are shown with the same factor bound).
    pub pcie: bool,
}

impl Row {
    pub fn error(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }

    /// max(predicted/measured, measured/predicted).
    pub fn factor(&self) -> f64 {
        let r = self.predicted / self.measured;
        if r >= 1.0 {
            r
        } else {
            1.0 / r
        }
    }

    #[allow(clippy::too_many_arguments)] // one row's columns, named at the one call site
    fn from(figure: &'static str, source: &'static str, t: &Topology, world: usize, launch: Launch, quantity: Quantity, measured: f64, predicted: f64, set: Set) -> Row {
        Row {
            figure,
            source,
            machine: t.name.clone(),
            world,
            launch,
            quantity,
            measured,
            predicted,
            bound: match set {
                Set::Miss(_) => None,
                Set::Fitted | Set::HeldOut => Some(if t.gpus.iter().all(|g| g.nvlink_gbps == 0.0) { MAX_FACTOR } else { NVLINK_MAX_FACTOR } - 1.0),
            },
            fitted_to: set == Set::Fitted,
            set,
            pcie: t.gpus.iter().all(|g| g.nvlink_gbps == 0.0),
        }
    }
}

struct Series {
    figure: &'static str,
    source: &'static str,
    topo: Topology,
    world: usize,
    launch: Launch,
    algorithm: Algorithm,
    nccl_sys: bool,
    points: &'static [(usize, f64)],
    set: Set,
}

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// Why the serving case's NCCL figure is not the fabric's (docs/model.md).
const MISS_SERVING_NCCL: &str = "225 us per call is not the fabric's: the ASUS box's own NCCL sweep (S) runs 69-80 us at 16-64 KiB untuned, and the same serving run's plain decode implies ~71 us at 14 KiB, which matches S; the verify step ran eager and uncaptured in a busy serving loop (docs/model.md)";

/// Why NCCL's largest size on the two-socket box is missed (found on first evaluation of the
/// held-out S rows; explained, not refitted).
const MISS_NCCL_SHM_LARGE: &str = "at 32 MiB NCCL's SHM hops across the sockets stage 4 MiB per step through host memory at ~20 GB/s bus bandwidth; the model moves a host-staged hop at the socket link's rate (38 GB/s) with no term for the staging copies' own rate (Limits). tpar hands everything above 1 MiB on PCIe to NCCL, so no plan weighs this size";

/// Why the measured SM-read kernel's smallest size is missed (found on first evaluation of
/// the held-out T rows; explained, not refitted).
const MISS_PULL_TINY: &str = "at 256 B the time is the kernel's synchronisation, not the fabric's: the measured kernel (its barriers are not stated) is 5 us lighter than tpar's pull one-shot, whose two barriers across the sockets the model times; from 4 KiB on the reads dominate and the rows are within 18%";

/// Why NCCL's smallest size is missed.
const MISS_NCCL_TINY: &str = "NCCL runs a 256 B all-reduce with another algorithm or channel count than its 4 KiB-256 KiB ring (28.6 us against 65-86 us), which this model, a ring at every size, does not have (Limits)";
/// Why the direct-attach dual-Turin all-to-all is missed.
const MISS_DIRECT_ATTACH: &str = "one cross-socket read pool serves every two-socket box, fitted to the ASUS box (R, 46.4 GB/s); the same CPUs with GPUs on root ports move 3.7x more, so the collapse belongs to that box's switched fabric, not to the socket link alone. The model stays conservative there (pulls across sockets on unknown two-socket boxes look slow); a probe of the machine's loaded reads (`tpar tune`) is the way to know";
/// Why the ASUS box's staggered +4 reads are missed.
const MISS_PLUS4: &str = "on the box the +4 pairs are two partitions of one Broadcom chip (GPU0-GPU4 share chip A), which the preset routes over the socket link; and one fixed read pool cannot give 8 concurrent cross flows more than 32 (the measurement: 118 vs 46 GB/s)";

#[allow(clippy::too_many_arguments)]
fn series(figure: &'static str, source: &'static str, topo: &Topology, world: usize, launch: Launch, algorithm: Algorithm, nccl_sys: bool, points: &'static [(usize, f64)], set: Set) -> Series {
    Series { figure, source, topo: topo.clone(), world, launch, algorithm, nccl_sys, points, set }
}

/// Every row of the table under `params` (the launch mode and NCCL's P2P level are set per
/// figure, everything else is taken from `params`).
pub fn table(params: &Params) -> Result<Vec<Row>> {
    use Algorithm::*;
    use Launch::*;
    let dual = presets::rtxpro6000_dualsocket_8();
    let sw8 = switch_box();
    let one4 = rtxpro6000_root_ports(4);
    let v100 = v100_switch_4();
    let h200 = presets::h200_nvswitch_8();
    const RTX6K: &str = "rtx6kpro pcie-oneshot doc";
    const V100: &str = "sglang-V100 fork PR #2";
    const B12X: &str = "b12x commits 9c196c29, 9f6a0248 (docs/references.md)";
    const ASUS8: &str = "rtx6kpro asus-esc8000a doc, 8 GPU all-reduce table";
    let all = [
        series("A. 4x RTX PRO 6000, one socket: NCCL", RTX6K, &one4, 4, Eager, Nccl, false,
            &[(256, 18.0), (4 * KIB, 15.4), (16 * KIB, 19.7), (32 * KIB, 17.6), (64 * KIB, 19.1), (256 * KIB, 46.5), (MIB, 109.0)], Set::Fitted),
        series("B. 4x RTX PRO 6000, one socket: custom one-shot", RTX6K, &one4, 4, Eager, OneshotPush, false,
            &[(256, 6.9), (4 * KIB, 7.4), (16 * KIB, 9.2), (32 * KIB, 11.0), (64 * KIB, 14.0), (256 * KIB, 32.8), (MIB, 104.0)], Set::Fitted),
        series("C. 4x V100, one switch, graph: NCCL", V100, &v100, 4, Graph, Nccl, false,
            &[(4 * KIB, 19.4), (16 * KIB, 22.3), (32 * KIB, 24.2), (128 * KIB, 51.8)], Set::HeldOut),
        series("C. 4x V100: NCCL 384 KiB (Simple protocol)", V100, &v100, 4, Graph, Nccl, false, &[(384 * KIB, 83.5)], Set::Fitted),
        series("D. 4x V100, one switch, graph: push one-shot", V100, &v100, 4, Graph, OneshotPush, false,
            &[(4 * KIB, 4.0), (16 * KIB, 7.2), (32 * KIB, 11.8), (128 * KIB, 44.5), (384 * KIB, 120.3)], Set::Fitted),
        series("E. 8x H200 NVSwitch, graph: NCCL (pynccl)", "sglang PR #22734", &h200, 8, Graph, Nccl, false,
            &[(16 * KIB, 17.8), (32 * KIB, 19.6), (64 * KIB, 19.9)], Set::HeldOut),
        series("F. 8x H200 NVSwitch, graph: MSCCL++ all-pair (push one-shot)", "sglang PR #22734", &h200, 8, Graph, OneshotPush, false,
            &[(16 * KIB, 6.4), (32 * KIB, 7.2), (64 * KIB, 8.2)], Set::Fitted),
        series("G. 8x RTX PRO 6000, two sockets: NCCL untuned, 32 KB", "rtx6kpro nccl-tuning doc", &dual, 8, Eager, Nccl, false, &[(32 * KIB, 48.2)], Set::HeldOut),
        series("G. 8x RTX PRO 6000, two sockets: NCCL P2P_LEVEL=SYS, 32 KB", "rtx6kpro nccl-tuning doc", &dual, 8, Eager, Nccl, true, &[(32 * KIB, 26.2)], Set::Fitted),
        series("L. 8x RTX 4090 (no P2P): NCCL floor, 8 B", "nccl #1530", &consumer_nop2p_8("rtx4090"), 8, Eager, Nccl, false, &[(8, 42.0)], Set::HeldOut),
        series("L. 8x RTX 3090 (no P2P): NCCL floor, 8 B", "nccl #1439", &consumer_nop2p_8("rtx3090"), 8, Eager, Nccl, false, &[(8, 54.0)], Set::HeldOut),
        series("H. serving case: NCCL in the verify step, 42 KiB (200-250 us)", "docs/references.md, the case that started the project", &dual, 8, Eager, Nccl, false,
            &[(42 * KIB, 225.0)], Set::Miss(MISS_SERVING_NCCL)),
        series("H. serving case: SGLang pull one-shot, 42 KiB (D, 340-380 us)", "D: 38 vs 54.8 tok/s, docs/model.md", &dual, 8, Eager, OneshotPull, false,
            &[(42 * KIB, 360.0)], Set::Fitted),
        series("S. ASUS dual socket, 8 GPUs: NCCL untuned", ASUS8, &dual, 8, Eager, Nccl, false, &[(16 * KIB, 69.3)], Set::Fitted),
        series("S. ASUS dual socket, 8 GPUs: NCCL untuned", ASUS8, &dual, 8, Eager, Nccl, false,
            &[(4 * KIB, 65.6), (8 * KIB, 70.8), (64 * KIB, 79.5), (256 * KIB, 86.2)], Set::HeldOut),
        series("S. ASUS dual socket, 8 GPUs: NCCL untuned, 32 MiB", ASUS8, &dual, 8, Eager, Nccl, false, &[(32 * MIB, 2976.0)], Set::Miss(MISS_NCCL_SHM_LARGE)),
        series("S. ASUS dual socket, 8 GPUs: NCCL untuned, 256 B", ASUS8, &dual, 8, Eager, Nccl, false, &[(256, 28.6)], Set::Miss(MISS_NCCL_TINY)),
        series("T. ASUS dual socket, 8 GPUs: custom one-shot (SM reads)", ASUS8, &dual, 8, Eager, OneshotPull, false,
            &[(4 * KIB, 39.5), (8 * KIB, 68.8), (16 * KIB, 151.2), (64 * KIB, 587.5), (256 * KIB, 2665.0)], Set::HeldOut),
        series("T. ASUS dual socket, 8 GPUs: custom one-shot (SM reads), 256 B", ASUS8, &dual, 8, Eager, OneshotPull, false, &[(256, 9.6)], Set::Miss(MISS_PULL_TINY)),
        series("M. 8x RTX PRO 6000: b12x pull one-shot (graph)", B12X, &sw8, 8, Graph, OneshotPull, false, &[(12 * KIB, 10.0)], Set::HeldOut),
        series("M. 8x RTX PRO 6000: b12x pull one-shot (graph)", B12X, &sw8, 8, Graph, OneshotPull, false, &[(96 * KIB, 31.9)], Set::Fitted),
        series("N. 8x RTX PRO 6000: NCCL (PyNCCL, graph)", "rtx6kpro models/ docs (docs/references.md, b12x section)", &sw8, 8, Graph, Nccl, false,
            &[(16 * KIB, 19.8), (56 * KIB, 24.5), (256 * KIB, 39.5)], Set::HeldOut),
        series("O. 8x RTX PRO 6000: NCCL, large messages", B12X, &sw8, 8, Graph, Nccl, false, &[(12 * MIB, 668.0), (48 * MIB, 2588.0), (96 * MIB, 5115.0)], Set::HeldOut),
    ];
    let mut rows = Vec::new();
    for s in &all {
        let p = Params { launch: s.launch, nccl_p2p_across_sockets: s.nccl_sys, ..params.clone() };
        let sim = Simulator::new(&s.topo, s.world, &p)?;
        for &(bytes, measured) in s.points {
            let predicted = sim.predict(s.algorithm, bytes)?.total_us;
            rows.push(Row::from(s.figure, s.source, &s.topo, s.world, s.launch, Quantity::AllReduce { algorithm: s.algorithm, bytes }, measured, predicted, s.set));
        }
    }
    // Q. Push vs pull one-shot on a CPU root-complex box (voipmonitor/cuda-pcie-allreduce
    // 4010cc3: push 39% faster; the size is not stated, so the row compares at 32 KiB).
    {
        let sim = Simulator::new(&one4, 4, &Params { launch: Eager, ..params.clone() })?;
        let bytes = 32 * KIB;
        let ratio = sim.predict(OneshotPull, bytes)?.total_us / sim.predict(OneshotPush, bytes)?.total_us;
        rows.push(Row::from("Q. 4 GPUs on CPU root ports: pull / push one-shot", "voipmonitor/cuda-pcie-allreduce 4010cc3", &one4, 4, Eager, Quantity::PullOverPush { bytes }, 1.39, ratio, Set::HeldOut));
    }
    rows.extend(latency_rows(params)?);
    rows.extend(fabric_rows(params)?);
    Ok(rows)
}

/// P. One-way latencies and read round trips.
fn latency_rows(params: &Params) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let one8 = rtxpro6000_root_ports(8);
    let dual = presets::rtxpro6000_dualsocket_8();
    let sw8 = switch_box();
    let f1 = Fabric::new(&one8, 8, params)?;
    let fd = Fabric::new(&dual, 8, params)?;
    let fs = Fabric::new(&sw8, 8, params)?;
    let lat = |figure, source, t: &Topology, q, measured, predicted, set| Row::from(figure, source, t, 8, Launch::Eager, q, measured, predicted, set);
    rows.push(lat("P. Gen5 P2P write latency, CPU root ports (0.36-0.52)", "rtx6kpro pcie-bandwidth.md", &one8, Quantity::WriteLatencyUs { a: 0, b: 1 }, 0.44, f1.write_latency(0, 1)?, Set::Fitted));
    rows.push(lat("P. ASUS dual socket: P2P latency, same NUMA (0.71-0.74)", "rtx6kpro asus-esc8000a doc", &dual, Quantity::WriteLatencyUs { a: 0, b: 2 }, 0.725, fd.write_latency(0, 2)?, Set::Fitted));
    rows.push(lat("P. ASUS dual socket: P2P latency, cross NUMA (1.27-1.36)", "rtx6kpro asus-esc8000a doc", &dual, Quantity::WriteLatencyUs { a: 0, b: 4 }, 1.315, fd.write_latency(0, 4)?, Set::Fitted));
    rows.push(lat("P. flag ping-pong one way, inside a switch (633-727 ns)", "rtx6kpro wrx90-cpayne-8gpu-root-topology-comparison.md", &sw8, Quantity::FlagLatencyUs { a: 0, b: 1 }, 0.68, fs.flag_latency(0, 1)?, Set::Fitted));
    rows.push(lat("P. flag ping-pong one way, across switches (1057-1081 ns)", "rtx6kpro wrx90-cpayne-8gpu-root-topology-comparison.md", &sw8, Quantity::FlagLatencyUs { a: 0, b: 4 }, 1.069, fs.flag_latency(0, 4)?, Set::HeldOut));
    rows.push(lat("P. 128 B P2P read, same switch", "rtx6kpro wrx90-cpayne-2switch-flat.md", &sw8, Quantity::ReadRttUs { a: 1, b: 0 }, 0.72, fs.read_rtt(1, 0)?, Set::HeldOut));
    rows.push(lat("P. 128 B P2P read, across switches (1.40-1.45)", "rtx6kpro wrx90-cpayne-2switch-flat.md", &sw8, Quantity::ReadRttUs { a: 4, b: 0 }, 1.425, fs.read_rtt(4, 0)?, Set::HeldOut));
    // Under full load every GPU keeps its read tags full: by Little's law the probe's read
    // waits behind one GPU's outstanding bytes at its own receive link.
    let loaded = fs.read_rtt(4, 0)? + params.gpu_read_outstanding_bytes / (fs.rx_gbps(0)? * 1e3);
    rows.push(lat("P. 128 B P2P read under full load", "rtx6kpro wrx90-cpayne-2switch-flat.md", &sw8, Quantity::LoadedReadRttUs { a: 4, b: 0 }, 7.48, loaded, Set::HeldOut));
    rows.push(lat(
        "P. 128 B P2P read, idle (p2pmark; machine not described)",
        "lukealonso/p2pmark README",
        &one8,
        Quantity::ReadRttUs { a: 1, b: 0 },
        4.1,
        f1.read_rtt(1, 0)?,
        Set::Miss("p2pmark's README does not describe its machine's fabric, and its 4.1 us is 3-6x the 0.72-1.45 us the switch box measured for the same read; the model follows the described box"),
    ));
    Ok(rows)
}

/// Copy-engine figures: bandwidth under contention, without a kernel's injection limit.
fn fabric_rows(params: &Params) -> Result<Vec<Row>> {
    let p = Params { pcie_kernel_fraction: 1.0, ..params.clone() };
    let big = 64.0 * 1024.0 * 1024.0;
    let mut rows = Vec::new();
    let dual = presets::rtxpro6000_dualsocket_8();
    let rate = |fab: &Fabric, flows: &[(usize, usize)]| -> Result<Vec<f64>> {
        let specs = flows
            .iter()
            .map(|&(a, b)| fab.flow_of(Endpoint::Gpu(a), Endpoint::Gpu(b), big, Op::Write, false))
            .collect::<Result<Vec<_>>>()?;
        let t = flows::simulate(&fab.capacities(), &specs)?;
        Ok(specs.iter().zip(t).map(|(s, t)| big / ((t - s.latency_us) * 1e3)).collect())
    };
    let pairs = |n: usize| -> Vec<(usize, usize)> { (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b))).collect() };
    let row = |figure, source, t: &Topology, q, measured, predicted, set| Row::from(figure, source, t, t.gpu_count(), Launch::Eager, q, measured, predicted, set);

    // I. 8 GPUs writing all peers on one CPU: aggregate over 8 x one isolated writer.
    let one = rtxpro6000_root_ports(8);
    let fab = Fabric::new(&one, 8, &p)?;
    let iso = rate(&fab, &[(0, 1)])?[0];
    let all: f64 = rate(&fab, &pairs(8))?.iter().sum();
    rows.push(row("I. 8 GPUs write all peers, one CPU: aggregate / isolated", "rtx6kpro pcie-bandwidth.md", &one, Quantity::AllToAllRatio, 0.41, all / (8.0 * iso), Set::Fitted));
    rows.push(row("I. Gen5 P2P write, same socket, isolated (GB/s)", "rtx6kpro pcie-bandwidth.md", &one, Quantity::SingleHopGbps, 54.8, iso, Set::Fitted));

    // Gen5 across sockets, one copy (39-51 GB/s), on the two-socket preset.
    let cross = rate(&Fabric::new(&dual, 8, &p)?, &[(0, 4)])?[0];
    rows.push(row("I. Gen5 P2P write across sockets (39-51 GB/s)", "rtx6kpro pcie-bandwidth.md", &dual, Quantity::CrossSocketGbps, 45.0, cross, Set::HeldOut));

    // RTX 4090 Gen4 P2P write (patched driver), one copy on root ports.
    let mut g4 = consumer_nop2p_8("rtx4090");
    for (i, r) in g4.links.iter_mut().enumerate() {
        for (j, l) in r.iter_mut().enumerate() {
            if i != j {
                *l = Link::new(LinkClass::Node, true);
            }
        }
    }
    let one4090 = rate(&Fabric::new(&g4, 8, &p)?, &[(0, 1)])?[0];
    rows.push(row("I. RTX 4090 Gen4 P2P write, one copy (GB/s)", "tinygrad/open-gpu-kernel-modules README", &g4, Quantity::SingleHopGbps, 24.4, one4090, Set::HeldOut));

    // J. Switch pair both ways, ACS redirect off / on.
    let mut sw = switch_box();
    let off: f64 = rate(&Fabric::new(&sw, 8, &p)?, &[(0, 1), (1, 0)])?.iter().sum();
    for s in &mut sw.switches {
        s.acs_redirect = true;
    }
    let on: f64 = rate(&Fabric::new(&sw, 8, &p)?, &[(0, 1), (1, 0)])?.iter().sum();
    rows.push(row("J. switch pair bidirectional, ACS redirect off (GB/s)", "rtx6kpro broadcom-switches.md", &sw, Quantity::SwitchPairBidirGbps, 103.0, off, Set::HeldOut));
    rows.push(row("J. switch pair bidirectional, ACS redirect on (GB/s)", "rtx6kpro broadcom-switches.md", &sw, Quantity::SwitchPairBidirGbps, 50.0, on, Set::HeldOut));

    // K. L40S Gen4: single hop, and cross-socket flows with every pair active.
    let l40 = presets::l40s_direct_8();
    let fab = Fabric::new(&l40, 8, &p)?;
    let single = rate(&fab, &[(0, 1)])?[0];
    let prs = pairs(8);
    let r = rate(&fab, &prs)?;
    // docs/references.md's "9.7 GB/s across sockets with all flows active" is read as what one
    // GPU sends across the socket link in total (its four cross flows together).
    let cross: f64 = prs.iter().zip(&r).filter(|((a, b), _)| *a == 0 && a / 4 != b / 4).map(|(_, r)| *r).sum();
    rows.push(row("K. L40S Gen4 single hop (GB/s)", "flashinfer PR #4870", &l40, Quantity::SingleHopGbps, 26.0, single, Set::HeldOut));
    rows.push(row("K. L40S across sockets, all flows active, per GPU (GB/s)", "flashinfer PR #4870", &l40, Quantity::CrossSocketAllFlowsGbps, 9.7, cross, Set::HeldOut));

    // R. p2pmark's bandwidth mode (64 MB copy-engine reads) on the ASUS dual-socket box and
    // on a dual-Turin box with every GPU on a root port (rtx6kpro asus-esc8000a doc). A copy
    // engine keeps the GPU's read tags full, so its window is the GPU's outstanding bytes.
    let pr = Params { read_window_bytes: params.gpu_read_outstanding_bytes, socket_read_outstanding_bytes: params.socket_ce_read_outstanding_bytes, ..p.clone() };
    let reads = |t: &Topology, n: usize, flows: &[(usize, usize)]| -> Result<f64> {
        let fab = Fabric::new(t, n, &pr)?;
        let specs = flows
            .iter()
            .map(|&(reader, peer)| fab.flow_of(Endpoint::Gpu(peer), Endpoint::Gpu(reader), big, Op::Read, false))
            .collect::<Result<Vec<_>>>()?;
        let t = flows::simulate(&fab.capacities(), &specs)?;
        let last = specs.iter().zip(t).map(|(s, t)| t - s.latency_us).fold(0.0f64, f64::max);
        Ok(big * specs.len() as f64 / (last * 1e3))
    };
    const P2PMARK: &str = "rtx6kpro asus-esc8000a doc (p2pmark 3c39f36)";
    let all8 = "8 GPUs each read all peers";
    let all4 = "4 GPUs of one socket each read all peers";
    rows.push(row("R. ASUS dual socket: all-to-all reads, 8 GPUs", P2PMARK, &dual, Quantity::ReadAggregateGbps { pattern: all8 }, 46.4, reads(&dual, 8, &pairs(8))?, Set::Fitted));
    rows.push(row("R. ASUS dual socket: all-to-all reads, 4 GPUs (NUMA 0)", P2PMARK, &dual, Quantity::ReadAggregateGbps { pattern: all4 }, 129.2, reads(&dual, 4, &pairs(4))?, Set::HeldOut));
    let plus4: Vec<(usize, usize)> = (0..8).map(|a| (a, (a + 4) % 8)).collect();
    rows.push(row(
        "R. ASUS dual socket: every GPU reads its +4 peer (cross NUMA)",
        P2PMARK,
        &dual,
        Quantity::ReadAggregateGbps { pattern: "8 GPUs each read GPU i+4" },
        118.0,
        reads(&dual, 8, &plus4)?,
        Set::Miss(MISS_PLUS4),
    ));
    let direct = rtxpro6000_two_socket_root_ports();
    rows.push(row("R. dual Turin, GPUs on root ports: all-to-all reads, 4 GPUs", P2PMARK, &direct, Quantity::ReadAggregateGbps { pattern: all4 }, 130.0, reads(&direct, 4, &pairs(4))?, Set::HeldOut));
    rows.push(row("R. dual Turin, GPUs on root ports: all-to-all reads, 8 GPUs", P2PMARK, &direct, Quantity::ReadAggregateGbps { pattern: all8 }, 173.0, reads(&direct, 8, &pairs(8))?, Set::Miss(MISS_DIRECT_ATTACH)));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recomputes every row: each within a factor MAX_FACTOR unless a listed miss, the PCIe
    /// median within MAX_MEDIAN_ERROR, and at least a third of the rows held out.
    #[test]
    fn calibration_errors_within_stated_bounds() {
        let rows = table(&Params::default()).unwrap();
        let mut bad = Vec::new();
        for r in &rows {
            eprintln!("{:<62} {:<34} measured {:>8.2} predicted {:>8.2} error {:+6.1}% {:?}", r.figure, r.quantity.describe(r.launch), r.measured, r.predicted, 100.0 * r.error(), r.set);
            let bound = if r.pcie { MAX_FACTOR } else { NVLINK_MAX_FACTOR };
            if !matches!(r.set, Set::Miss(_)) && r.factor() > bound {
                bad.push(format!("{} ({:?}): {:.2}x > {MAX_FACTOR}x", r.figure, r.quantity, r.factor()));
            }
        }
        let (_, median, _) = summary(rows.iter().filter(|r| r.pcie)).unwrap();
        eprintln!("PCIe median |error| {:.1}%", 100.0 * median);
        assert!(median <= MAX_MEDIAN_ERROR, "PCIe median |error| {median}");
        for set in [Set::Fitted, Set::HeldOut] {
            let (_, med, worst) = summary(rows.iter().filter(|r| r.pcie && r.set == set)).unwrap();
            eprintln!("{set:?}: median {:.1}% worst {:.1}%", 100.0 * med, 100.0 * worst);
        }
        let held = rows.iter().filter(|r| r.set == Set::HeldOut).count();
        assert!(3 * held >= rows.len(), "{held} of {} held out", rows.len());
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    /// Every published NCCL point the plan and `tpar model` read is a calibration row of its
    /// preset, world and launch mode (the two cannot drift apart).
    #[test]
    fn published_nccl_figures_are_calibration_rows() {
        let rows = table(&Params::default()).unwrap();
        for f in NCCL_FIGURES {
            for &(bytes, us) in f.points {
                let hit = rows.iter().any(|r| {
                    r.machine == f.preset
                        && r.world == f.world
                        && r.launch == f.launch
                        && r.quantity == Quantity::AllReduce { algorithm: Algorithm::Nccl, bytes }
                        && r.measured == us
                        && !matches!(r.set, Set::Miss(_))
                });
                assert!(hit, "{} {bytes} B {us} us is not a calibration row", f.preset);
            }
            assert!(published_nccl(&presets::by_name(f.preset).unwrap(), f.world, f.launch).is_some());
        }
        // Only the exact box: a look-alike under another name has none.
        let mut t = presets::rtxpro6000_dualsocket_8();
        t.name = "discovered".into();
        assert!(published_nccl(&t, 8, Launch::Eager).is_none());
    }

    /// docs/sim.md's calibration section is exactly what `markdown` prints now.
    #[test]
    fn docs_calibration_table_is_generated() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/sim.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let want = markdown(&table(&Params::default()).unwrap());
        let (b, e) = (doc.find(DOC_BEGIN), doc.find(DOC_END));
        let have = match (b, e) {
            (Some(b), Some(e)) if b < e => &doc[b + DOC_BEGIN.len()..e],
            _ => "",
        };
        assert!(have.trim() == want.trim(), "docs/sim.md's calibration table is stale; replace the text between the markers with `tpar sim --calibration`:\n{DOC_BEGIN}\n{want}{DOC_END}");
    }
}
