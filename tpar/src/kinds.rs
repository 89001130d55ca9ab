//! The shared kinds every layer names: [`Collective`], [`Algorithm`], [`Transport`],
//! [`Backend`], [`CaptureMode`]. Identity only (names, wire codes, parsing): what an algorithm *is* and
//! where it *runs* lives in the registry (`algorithms::registry`).
//!
//! Owns: the names on the command line, in JSON and on the wire. Must never depend on any
//! other module of the crate but `error`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The name of one pattern of the fused all-reduce + RMSNorm family,
/// `[add_]rmsnorm[_gemma][_fp8|_nvfp4]`: with the residual add, with the Gemma weight offset,
/// with a quantized output (`quant`: "", "fp8" or "nvfp4"; the CLI's `--pattern` values, the
/// selftest's column, mismatch messages).
pub fn norm_pattern_name(residual: bool, gemma: bool, quant: &str) -> String {
    format!("{}rmsnorm{}{}{}", if residual { "add_" } else { "" }, if gemma { "_gemma" } else { "" }, if quant.is_empty() { "" } else { "_" }, quant)
}

/// An all-reduce algorithm. Names are kebab-case on the command line and in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Write my input into every peer's inbox (sentinel protocol), poll locally, reduce.
    OneshotPush,
    /// Barrier, read every peer's exposed input, reduce, barrier.
    OneshotPull,
    /// Reduce-scatter by writes, then all-gather by writes (sentinel protocol).
    TwoshotPush,
    /// Reduce-scatter by reads, then all-gather by reads (barrier protocol).
    TwoshotPull,
    /// One outbound and one inbound flow per rank per step (PCIe fabrics).
    StagedPush,
    /// Reduce inside each island, exchange across islands.
    Hierarchical,
    /// Baseline: rank 0 gathers, reduces and broadcasts. For comparison only.
    GatherBcast,
    /// NCCL's all-reduce.
    Nccl,
    /// Copy engines move the data (reduce-scatter to owners, all-gather back, by
    /// `cuMemcpyAsync`); small kernels reduce in rank order. For large messages on PCIe.
    CeRing,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 9] = [
        Algorithm::OneshotPush,
        Algorithm::OneshotPull,
        Algorithm::TwoshotPush,
        Algorithm::TwoshotPull,
        Algorithm::StagedPush,
        Algorithm::Hierarchical,
        Algorithm::GatherBcast,
        Algorithm::Nccl,
        Algorithm::CeRing,
    ];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneshotPush => "oneshot-push",
            Algorithm::OneshotPull => "oneshot-pull",
            Algorithm::TwoshotPush => "twoshot-push",
            Algorithm::TwoshotPull => "twoshot-pull",
            Algorithm::StagedPush => "staged-push",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::GatherBcast => "gather-bcast",
            Algorithm::Nccl => "nccl",
            Algorithm::CeRing => "ce-ring",
        }
    }

    /// Small integer for on-the-wire descriptors (never 0).
    pub fn code(self) -> u64 {
        match self {
            Algorithm::OneshotPush => 1,
            Algorithm::OneshotPull => 2,
            Algorithm::TwoshotPush => 3,
            Algorithm::TwoshotPull => 4,
            Algorithm::StagedPush => 5,
            Algorithm::Hierarchical => 6,
            Algorithm::GatherBcast => 7,
            Algorithm::Nccl => 8,
            Algorithm::CeRing => 9,
        }
    }

    /// Inverse of [`Algorithm::code`].
    pub fn from_code(c: u64) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.code() == c)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                Error::invalid("algorithm", format!("unknown algorithm {s:?}; expected one of {}", names.join(", ")))
            })
    }
}

/// A collective: what a call computes. Names are kebab-case on the command line and in JSON,
/// and match nccl-tests' binaries (`all_reduce_perf`, `all_gather_perf`,
/// `reduce_scatter_perf`) and torch.distributed's functions.
///
/// Sizes, as nccl-tests and torch.distributed define them: an all-reduce of `n` elements
/// takes `n` and gives `n` on every rank; an all-gather takes `n` per rank and gives
/// `world * n` (rank q's at `q * n`); a reduce-scatter takes `world * n` and gives rank q
/// the sum of elements `q * n .. (q + 1) * n` (`n` elements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// The rank-order sum of every rank's input, on every rank.
    #[default]
    AllReduce,
    /// Every rank's input, concatenated in rank order, on every rank (a bitwise copy).
    AllGather,
    /// Rank q's share of the rank-order sum: the same bits as slice q of the all-reduce.
    ReduceScatter,
}

impl Collective {
    pub const ALL: [Collective; 3] = [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
        }
    }

    /// Small integer for on-the-wire descriptors (all-reduce is 0, so an all-reduce's
    /// descriptor is unchanged).
    pub fn code(self) -> u64 {
        match self {
            Collective::AllReduce => 0,
            Collective::AllGather => 1,
            Collective::ReduceScatter => 2,
        }
    }

    /// Inverse of [`Collective::code`].
    pub fn from_code(c: u64) -> Option<Collective> {
        Collective::ALL.into_iter().find(|k| k.code() == c)
    }

    /// Each rank's part, in bytes, of a `total`-byte tensor split over `world` ranks (an
    /// all-gather's output, a reduce-scatter's input), rounded down to whole 16-byte vectors:
    /// tpar's kernels place each rank's part at a vector (0: too small to split).
    pub fn part_bytes(total: u64, world: usize) -> u64 {
        total / (world.max(1) as u64) / 16 * 16
    }

    /// Elements of the input and of the output of one rank, for a call of `n` elements per
    /// rank as nccl-tests counts them (the all-gather's input, the reduce-scatter's output).
    pub fn io_elems(self, n: usize, world: usize) -> (usize, usize) {
        match self {
            Collective::AllReduce => (n, n),
            Collective::AllGather => (n, n.saturating_mul(world)),
            Collective::ReduceScatter => (n.saturating_mul(world), n),
        }
    }

    /// The per-rank element count (as [`io_elems`](Self::io_elems) takes it) of a call
    /// with `input` and `output` elements on a rank, or why those lengths do not fit this
    /// collective at `world` ranks.
    pub fn per_rank(self, input: usize, output: usize, world: usize) -> std::result::Result<usize, String> {
        let w = world.max(1);
        let (n, fits) = match self {
            Collective::AllReduce => (input, output == input),
            Collective::AllGather => (input, Some(output) == input.checked_mul(w)),
            Collective::ReduceScatter => (output, Some(input) == output.checked_mul(w)),
        };
        if fits {
            Ok(n)
        } else {
            Err(match self {
                Collective::AllReduce => format!("output holds {output} elements but input holds {input}"),
                Collective::AllGather => format!("an all-gather of {input} elements per rank needs an output of {input} x {w} elements, not {output}"),
                Collective::ReduceScatter => format!("a reduce-scatter over {w} ranks into {output} elements needs an input of {output} x {w} elements, not {input}"),
            })
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        let s = s.strip_suffix("-perf").unwrap_or(&s);
        Collective::ALL
            .into_iter()
            .find(|k| k.name() == s || k.name().replace('-', "") == s)
            .ok_or_else(|| Error::invalid("collective", format!("unknown collective {s:?}; expected all-reduce, all-gather or reduce-scatter")))
    }
}

/// Where bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// CUDA IPC-mapped peer device memory.
    P2p,
    /// Pinned shared host memory mapped into every GPU.
    Host,
    /// POSIX shared memory between CPU rank processes.
    Shm,
    /// NCCL.
    Nccl,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 4] = [Transport::P2p, Transport::Host, Transport::Shm, Transport::Nccl];

    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Transport::P2p => "p2p",
            Transport::Host => "host",
            Transport::Shm => "shm",
            Transport::Nccl => "nccl",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        Transport::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::invalid("transport", format!("unknown transport {s:?}; expected p2p, host, shm or nccl")))
    }
}


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

/// What the copy-engine path (`ce-ring`) puts on the wire. Every other algorithm always
/// moves the exact values. `Fp8` and `Int8` quantise per block of 128 elements with one f32
/// scale each, before a copy, and dequantise into f32 after it: lossy, with the error bound
/// of `algorithms::ce_wire` (docs/cuda.md, "The copy-engine path"); opted into by
/// `TPAR_WIRE`, never the default, refused under `TPAR_EXACT=1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// The values themselves: the rank-order sum, rounded once, bit for bit.
    #[default]
    Exact,
    /// FP8 E4M3 values (scaled to the block's largest magnitude / 448).
    Fp8,
    /// Symmetric INT8 values (scaled to the block's largest magnitude / 127).
    Int8,
}

impl Wire {
    pub const ALL: [Wire; 3] = [Wire::Exact, Wire::Fp8, Wire::Int8];

    pub fn name(self) -> &'static str {
        match self {
            Wire::Exact => "exact",
            Wire::Fp8 => "fp8",
            Wire::Int8 => "int8",
        }
    }

    /// Whether the values change on the wire.
    pub fn is_lossy(self) -> bool {
        self != Wire::Exact
    }

    /// The kernels' code (`CeArgs::wire` in kernels/ce_ring.cu).
    pub fn code(self) -> u32 {
        match self {
            Wire::Exact => 0,
            Wire::Fp8 => 1,
            Wire::Int8 => 2,
        }
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Wire {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        Wire::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| Error::invalid("wire", format!("unknown wire format {s:?}; expected exact, fp8 or int8")))
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

