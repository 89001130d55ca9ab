//! Every environment variable tpar reads, declared once ([`VARS`]) and parsed in one place
//! ([`Settings::from_env`]), in NCCL's manner (`NCCL_PARAM`): one name, one grammar, one
//! default, one error style (`Error::Config`: "bad setting TPAR_X=\"v\": expected …").
//!
//! | group | variables | who reads the parsed value |
//! |---|---|---|
//! | job | `TPAR_RANK`, `TPAR_WORLD_SIZE`, `TPAR_RDZV`, `TPAR_JOB_ID`, `TPAR_TIMEOUT_MS`, `TPAR_SHM_BYTES` | [`crate::config::Config`] |
//! | plan | `TPAR_ALGO`, `TPAR_TRANSPORT`, `TPAR_MAX_BYTES`, `TPAR_DISABLE`, `TPAR_PROFILE`, `TPAR_TOPOLOGY`, `TPAR_TUNE`, `TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL`, `TPAR_WIRE`, `TPAR_EXACT`, `TPAR_FUSED` | [`Overrides`] (the plan's input), the communicators' init |
//! | launch | `TPAR_BLOCKS`, `TPAR_PDL`, `TPAR_FUSED_CLUSTER`, `TPAR_FUSED_ROWS`, `TPAR_LEAN`, `TPAR_ZERO_COPY` | [`LaunchSettings`] (the CUDA launcher); `TPAR_BLOCKS` alone in [`Overrides::blocks`], which the plan and the launcher both read |
//! | libraries | `TPAR_NVRTC_LIB`, `TPAR_NCCL_LIB`, `TPAR_CACHE_DIR` | [`nvrtc_lib`], [`nccl_lib`], [`cache_dir`] |
//! | logging | `TPAR_DEBUG` | [`Overrides::debug`] |
//! | engines | `TPAR_ENABLE` | the Python plug-ins (the one value Python reads itself) |
//!
//! Owns: the list, the grammars, the defaults, the documentation table (`tpar settings`,
//! the README's table: [`markdown_table`], rendered in `settings/render.rs`). Must never:
//! read a variable that is not in [`VARS`] (a test scans the sources: nothing outside this
//! file reads the environment), or ignore a malformed value.

use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Transport, Wire};
use crate::units::parse_bytes;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

mod render;
pub use render::{markdown_table, text_table};

/// Most thread blocks per rank of one kernel call (the kernels' flag rows; `abi::MAX_BLOCKS`).
pub const MAX_KERNEL_BLOCKS: u32 = 64;
/// Bound on any wait when `TPAR_TIMEOUT_MS` is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Size of the CPU backend's shared workspace when `TPAR_SHM_BYTES` is unset: large enough
/// for ~0.4 MiB chunks at 8 ranks, small enough for a container's default /dev/shm of 64 MiB.
pub const DEFAULT_SHM_BYTES: usize = 48 << 20;

/// What a variable is for (the table's sections).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// How a rank joins its job (set by launchers).
    Job,
    /// What the plan decides with.
    Plan,
    /// How tpar's kernels are launched (for measuring).
    Launch,
    /// Where tpar finds its run-time libraries and cache.
    Libraries,
    /// Logging.
    Logging,
    /// The engines' plug-ins.
    Engines,
    /// Tests only: never for real use.
    Test,
}

impl Group {
    pub fn name(self) -> &'static str {
        match self {
            Group::Job => "job",
            Group::Plan => "plan",
            Group::Launch => "launch",
            Group::Libraries => "libraries",
            Group::Logging => "logging",
            Group::Engines => "engines",
            Group::Test => "test",
        }
    }
}

/// One environment variable: its declaration.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    pub name: &'static str,
    pub group: Group,
    /// The values it takes, as users read them.
    pub values: &'static str,
    /// What unset means.
    pub default: &'static str,
    pub doc: &'static str,
    /// A well-formed value (tests parse it).
    pub example: &'static str,
}

const BOOL: &str = "1/0, true/false, yes/no, on/off";

/// Every variable tpar reads, in the order of the documentation table.
pub const VARS: &[Var] = &[
    Var { name: "TPAR_RANK", group: Group::Job, values: "0 to world size - 1", default: "(required for an outside launcher)", doc: "this process's rank", example: "0" },
    Var { name: "TPAR_WORLD_SIZE", group: Group::Job, values: "2 to 16", default: "(required for an outside launcher)", doc: "the number of ranks", example: "4" },
    Var { name: "TPAR_RDZV", group: Group::Job, values: "unix:/path/to/socket", default: "(required for an outside launcher)", doc: "where rank 0 listens for the others", example: "unix:/tmp/tpar.sock" },
    Var { name: "TPAR_JOB_ID", group: Group::Job, values: "hexadecimal", default: "derived from the socket path and the parent process", doc: "shared by the ranks of one job; set it when ranks do not share a parent process", example: "0x1f" },
    Var { name: "TPAR_TIMEOUT_MS", group: Group::Job, values: "a positive number of milliseconds", default: "30000", doc: "bound on every wait; a dead peer is noticed much sooner", example: "5000" },
    Var { name: "TPAR_SHM_BYTES", group: Group::Job, values: "a size (4096, 42K, 1.5M, 1GiB)", default: "48M", doc: "the CPU backend's shared workspace (larger calls run in chunks)", example: "48M" },
    Var { name: "TPAR_FIRST_EPOCH", group: Group::Test, values: "0 to 4294967295", default: "0", doc: "the first call's epoch (tests start near the wrap-around)", example: "4294967290" },
    Var { name: "TPAR_ALGO", group: Group::Plan, values: "an algorithm (oneshot-push, ...) or auto", default: "auto", doc: "force an algorithm; one this fabric cannot run is an error at init", example: "oneshot-push" },
    Var { name: "TPAR_TRANSPORT", group: Group::Plan, values: "p2p, host, shm, nccl or auto", default: "auto", doc: "force a transport", example: "host" },
    Var { name: "TPAR_MAX_BYTES", group: Group::Plan, values: "a size", default: "(none)", doc: "above this size, NCCL (GPU backends)", example: "8M" },
    Var { name: "TPAR_DISABLE", group: Group::Plan, values: BOOL, default: "0", doc: "always NCCL (GPU backends)", example: "1" },
    Var { name: "TPAR_PROFILE", group: Group::Plan, values: "a file from `tpar tune`", default: "(the tune cache)", doc: "a tuned profile, used when its fingerprint matches this machine", example: "profile.toml" },
    Var { name: "TPAR_TOPOLOGY", group: Group::Plan, values: "a preset name or a JSON file", default: "(discovered through NVML)", doc: "the fabric to plan for instead of the discovered one", example: "h200-nvswitch-8" },
    Var { name: "TPAR_TUNE", group: Group::Plan, values: "auto, off or force", default: "auto", doc: "the first-use tune (docs/tune.md): when a GPU communicator starts and the tune cache has no profile for this machine, the ranks measure it (auto, a few seconds once); never (off: the plan's defaults); or at every start, replacing the cached one (force)", example: "off" },
    Var { name: "TPAR_CHECK_CALLS", group: Group::Plan, values: BOOL, default: "1", doc: "compare every call's count, dtype and algorithm across ranks on the GPU (0 saves about 0.2 us a call; a rank calling something else then yields a wrong sum, not an error)", example: "0" },
    Var { name: "TPAR_HOST_PROTOCOL", group: Group::Plan, values: "flags, sentinel or auto", default: "auto (flags from 3 ranks)", doc: "how the push kernels synchronise over the host transport (GPUs without P2P)", example: "flags" },
    Var { name: "TPAR_WIRE", group: Group::Plan, values: "exact, fp8 or int8", default: "exact", doc: "what ce-ring puts on the wire: fp8/int8 quantise per block of 128 values (lossy: docs/cuda.md states the bound); other algorithms are always exact", example: "fp8" },
    Var { name: "TPAR_EXACT", group: Group::Plan, values: BOOL, default: "0", doc: "insist on bitwise rank-order sums: a lossy TPAR_WIRE is then an error", example: "1" },
    Var { name: "TPAR_FUSED", group: Group::Plan, values: "auto, 1 or 0", default: "auto", doc: "fused all-reduce + residual add + RMSNorm calls: the plan's algorithm's fused kernel where it takes the shape, except two-shot pull's spread-norm form (measured slower than its all-reduce followed by the add-RMSNorm kernel; its owned-rows form, from as many rows as ranks, runs) (auto); the fused kernel wherever it takes the shape (1); never, the all-reduce then the add-RMSNorm kernel (0). The same bits every way; ranks must agree", example: "0" },
    Var { name: "TPAR_BLOCKS", group: Group::Launch, values: "1 to 64, or auto", default: "auto", doc: "thread blocks per kernel call, for measuring", example: "8" },
    Var { name: "TPAR_PDL", group: Group::Launch, values: "1 or 0", default: "1", doc: "programmatic dependent launch on sm_90+ (ranks may differ)", example: "0" },
    Var { name: "TPAR_FUSED_CLUSTER", group: Group::Launch, values: "1 or 0", default: "1", doc: "fused all-reduce + RMSNorm calls whose blocks hold whole rows run each row's blocks as one thread-block cluster, its sums of squares meeting in distributed shared memory (sm_90+); 0: through global memory, for measuring", example: "0" },
    Var { name: "TPAR_FUSED_ROWS", group: Group::Launch, values: "auto, 1 or 0", default: "auto", doc: "two-shot pull's fused all-reduce + RMSNorm splits the message into whole rows a rank, each owner normalising its rows and the all-gather moving the finished outputs: from as many rows as ranks (auto), at every row count (1), never (0: every rank normalises every row after the all-gather). Under TPAR_FUSED=auto the communicator runs the rows variant and declines the spread norm (TPAR_FUSED). The same bits every way; ranks must agree", example: "0" },
    Var { name: "TPAR_LEAN", group: Group::Launch, values: "auto, 1 or 0", default: "auto", doc: "the kernels' lean variant (64 registers, two blocks per SM) for every size (1), never (0), or for large calls of ranks sharing a GPU (auto)", example: "1" },
    Var { name: "TPAR_ZERO_COPY", group: Group::Launch, values: "auto, 1 or 0", default: "auto", doc: "graph-captured pull calls read the ranks' inputs in place, the buffers registered when the capture ends: from each algorithm's measured size (auto), at every size (1), never (0: copy into the workspace)", example: "0" },
    Var { name: "TPAR_NVRTC_LIB", group: Group::Libraries, values: "a path to libnvrtc.so.13", default: "(the Python environment's nvidia-cuda-nvrtc wheel, else by name)", doc: "the NVRTC that compiles tpar's kernels", example: "/usr/local/cuda/lib64/libnvrtc.so.13" },
    Var { name: "TPAR_NCCL_LIB", group: Group::Libraries, values: "a path to libnccl.so.2", default: "(the Python environment's nvidia-nccl-cu13 wheel, else by name)", doc: "the NCCL tpar falls back to", example: "/usr/lib/libnccl.so.2" },
    Var { name: "TPAR_VLLM_LIB", group: Group::Libraries, values: "a path to libtpar_vllm_ar.so", default: ".gpu/vllm-build/libtpar_vllm_ar.so", doc: "vLLM's kernel built by bench/compare/vllm.sh, for `tpar bench --compare vllm`", example: "/tmp/libtpar_vllm_ar.so" },
    Var { name: "TPAR_CACHE_DIR", group: Group::Libraries, values: "a directory", default: "$XDG_CACHE_HOME/tpar, else ~/.cache/tpar", doc: "compiled kernels and tuned profiles (profiles/); a corrupt entry is rebuilt or re-tuned", example: "/tmp/tpar-cache" },
    Var { name: "TPAR_DEBUG", group: Group::Logging, values: "NONE, VERSION, WARN, INFO or TRACE", default: "WARN", doc: "INFO logs each distinct plan decision once, with its reason", example: "INFO" },
    Var { name: "TPAR_ENABLE", group: Group::Engines, values: BOOL, default: "0", doc: "swap tpar in for vLLM's and SGLang's custom all-reduce (their plug-ins read it)", example: "1" },
    Var { name: "TPAR_FUSION", group: Group::Engines, values: BOOL, default: "1", doc: "vLLM: tpar's all-reduce + RMSNorm fusion pass in vLLM's compile stack (0: vLLM's pass manager left alone; the plug-in reads it)", example: "0" },
    Var { name: "TPAR_TEST_UNSAFE_TWO_BUFFERS", group: Group::Test, values: "1", default: "(off)", doc: "compile the kernels with two buffers (the reuse guard removed), so the skewed-rank stress can show it catches the race", example: "1" },
    Var { name: "TPAR_TEST_UNSAFE_ONE_BUFFER", group: Group::Test, values: "1", default: "(off)", doc: "compile the kernels with one buffer (the flag protocol's reuse guard removed)", example: "1" },
    Var { name: "TPAR_TEST_STAMPS", group: Group::Test, values: "1", default: "(off)", doc: "compile the kernels with per-block %globaltimer stamps at their phases (registered pull, one-shot pull and its fused variant); `tpar bench` on emulated ranks then prints where the last timed call's time went", example: "1" },
    Var { name: "TPAR_VLLM_BLOCKS", group: Group::Test, values: "1 to 36", default: "(vLLM's 36, lowered until every emulated rank's blocks are resident)", doc: "the block limit of vLLM's kernel in `tpar bench --compare vllm`, for measuring it on the grid tpar runs", example: "16" },
    Var { name: "TPAR_TEST_UNSAFE_NO_END_BARRIER", group: Group::Test, values: "1", default: "(off)", doc: "compile the registered (zero-copy) path without its end barrier (a rank may leave while peers still use its buffers), so the skewed graph test can show it catches it", example: "1" },
];

/// Variables from outside tpar that the library reads (through this module too).
pub const FOREIGN_VARS: &[&str] = &["CUDA_DEVICE_MAX_CONNECTIONS", "XDG_CACHE_HOME", "HOME"];

/// The declaration of `name`, if tpar reads it.
pub fn var(name: &str) -> Option<&'static Var> {
    VARS.iter().find(|v| v.name == name)
}

fn bad(var: &'static str, raw: &str, expected: impl std::fmt::Display) -> Error {
    Error::Config { var, value: raw.to_string(), reason: format!("expected {expected}") }
}

fn parse_bool(var: &'static str, raw: &str) -> Result<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad(var, raw, BOOL)),
    }
}

/// "1" or "0" (a switch that takes no other spelling, as NCCL's integer switches).
fn parse_switch(var: &'static str, raw: &str) -> Result<bool> {
    match raw.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(bad(var, raw, "1 or 0")),
    }
}

/// "auto" (`None`: tpar's own rule), "1" or "0".
fn parse_auto_switch(var: &'static str, raw: &str) -> Result<Option<bool>> {
    if is_auto(raw) {
        return Ok(None);
    }
    parse_switch(var, raw).map(Some).map_err(|_| bad(var, raw, "auto, 1 or 0"))
}

fn parse_int<T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy>(var: &'static str, raw: &str, lo: T, hi: T) -> Result<T> {
    match raw.trim().parse::<T>() {
        Ok(v) if v >= lo && v <= hi => Ok(v),
        _ => Err(bad(var, raw, format!("a whole number from {lo} to {hi}"))),
    }
}

fn parse_size(var: &'static str, raw: &str) -> Result<u64> {
    match parse_bytes(raw) {
        Ok(0) => Err(bad(var, raw, "a positive size (4096, 42K, 1.5M, 1GiB)")),
        Ok(b) => Ok(b),
        Err(_) => Err(bad(var, raw, "a size (4096, 42K, 1.5M, 1GiB)")),
    }
}

fn is_auto(raw: &str) -> bool {
    raw.trim().eq_ignore_ascii_case("auto")
}

/// The push kernels' protocol over the host transport (docs/cuda.md, "Protocols").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostProtocol {
    /// Data polled for a sentinel-free value; the reader clears its inbox one call behind.
    Sentinel,
    /// Data, then one release flag per (block, source) carrying the call's generation;
    /// nothing cleared.
    Flags,
}

impl HostProtocol {
    /// The protocol for `world` ranks when none is forced: flags from
    /// [`HostProtocol::FLAGS_MIN_WORLD`] ranks. They drop the clears (half the PCIe write
    /// traffic) and write one-shot's input once, into the writer's own host area, instead of
    /// once per peer, but add a round trip per stage (flag, then data). On one H200 (emulated
    /// ranks, 122 x 42 KiB, one-shot push, the plan's pick over host; sentinel vs flags):
    /// 2 ranks 7.37 vs 8.27 us, 3 ranks 15.65 vs 13.16, 4 ranks 23.3 vs 19.3, 8 ranks 93.8
    /// vs 60.9 (bench/results/2026-12-01-h200-host-flags-write-once/README.md; two-shot: bench/results/2026-12-01-h200-host-flag-protocol/README.md).
    pub fn auto(world: usize) -> HostProtocol {
        if world >= Self::FLAGS_MIN_WORLD {
            HostProtocol::Flags
        } else {
            HostProtocol::Sentinel
        }
    }
    /// Smallest world that uses flags by default.
    pub const FLAGS_MIN_WORLD: usize = 3;

    /// Parses `TPAR_HOST_PROTOCOL`'s value: `auto` is `None`.
    pub fn parse(raw: &str) -> Result<Option<HostProtocol>> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "flags" => Ok(Some(HostProtocol::Flags)),
            "sentinel" => Ok(Some(HostProtocol::Sentinel)),
            _ => Err(bad("TPAR_HOST_PROTOCOL", raw, "auto, flags or sentinel")),
        }
    }
}

/// The plan's settings (NCCL style). The default is "no override". Validated against the
/// fabric by `Overrides::validate` (plan::overrides) at init.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// `TPAR_ALGO`: force an algorithm (`auto` or unset: none).
    pub algorithm: Option<Algorithm>,
    /// `TPAR_TRANSPORT`: force a transport.
    pub transport: Option<Transport>,
    /// `TPAR_MAX_BYTES`: above this size, NCCL.
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
    /// `TPAR_BLOCKS`: thread blocks per call of tpar's kernels (1 to [`MAX_KERNEL_BLOCKS`]),
    /// instead of the size-based default. For measuring; NCCL calls are not affected. Its one
    /// home: the plan applies it to the calls it sizes, and the CUDA launcher gets this value
    /// (`cuda::SetOptions::blocks`) for the calls it did not (a forced algorithm's, the tune's,
    /// an emulated group's). Part of the plan digest: ranks must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// `TPAR_CHECK_CALLS=0`: tpar's kernels stop comparing every call's count, dtype and
    /// algorithm across ranks. Part of the plan digest: ranks must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_calls: Option<bool>,
    /// `TPAR_HOST_PROTOCOL` (`None`: by world size, [`HostProtocol::auto`]). Part of the
    /// plan digest: ranks must agree (the two protocols cannot meet in one workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_protocol: Option<HostProtocol>,
    /// `TPAR_WIRE` (`None`: exact). Part of the plan digest: ranks must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<Wire>,
    /// `TPAR_EXACT=1`: exact results asked for; a lossy wire is refused when parsing.
    #[serde(skip)]
    pub exact: bool,
    /// `TPAR_FUSED` (`None`: auto, `cuda::fused::fused_declined`'s rule). Part of the plan
    /// digest: ranks must agree (a fused kernel meets no unfused peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused: Option<bool>,
}

/// How tpar's kernels are launched (the CUDA launcher reads these). `TPAR_BLOCKS` is not
/// here: it is the plan's as well, stored once in [`Overrides::blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchSettings {
    /// `TPAR_PDL` (used where the device can: sm_90+).
    pub pdl: bool,
    /// `TPAR_LEAN`, when set (the size rule otherwise).
    pub lean: Option<bool>,
    /// Test only: kernels compiled with this many buffers instead of three
    /// (`TPAR_TEST_UNSAFE_TWO_BUFFERS` / `_ONE_BUFFER`).
    pub test_buffers: Option<u32>,
    /// `TPAR_ZERO_COPY`, when set (each algorithm's size rule otherwise).
    pub zero_copy: Option<bool>,
    /// Test only: the registered path without its end barrier (`TPAR_TEST_UNSAFE_NO_END_BARRIER`).
    pub test_no_end_barrier: bool,
    /// Measuring only: kernels compiled with their phase stamps (`TPAR_TEST_STAMPS`).
    pub test_stamps: bool,
    /// `TPAR_FUSED_CLUSTER`: fused calls exchange a row's sums inside a thread-block
    /// cluster where the grid allows (sm_90+); false: always through global memory.
    pub fused_cluster: bool,
    /// `TPAR_FUSED_ROWS`, when set (`cuda::fused::rows_owned`'s rule otherwise): two-shot
    /// pull's fused kernel with whole rows a rank. Ranks must agree (the fused descriptor
    /// carries it: a rank that differs gets a Mismatch).
    pub fused_rows: Option<bool>,
}

impl Default for LaunchSettings {
    fn default() -> Self {
        Self { pdl: true, lean: None, test_buffers: None, zero_copy: None, test_no_end_barrier: false, test_stamps: false, fused_cluster: true, fused_rows: None }
    }
}

/// `TPAR_TUNE`: whether a GPU communicator measures this machine when it first starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tune {
    /// When no tuned profile for this machine exists yet (the default).
    #[default]
    Auto,
    /// Never: the plan's defaults (or `TPAR_PROFILE`).
    Off,
    /// Every start, replacing the cached profile.
    Force,
}

/// How a rank joins its job (an outside launcher sets these).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSettings {
    pub rank: Option<usize>,
    pub world: Option<usize>,
    /// `TPAR_RDZV` as given (`unix:/path` or a path).
    pub rdzv: Option<String>,
    pub job_id: Option<u64>,
    pub timeout: Option<Duration>,
    pub shm_bytes: Option<usize>,
    pub first_epoch: Option<u32>,
}

/// Every setting, parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub job: JobSettings,
    pub overrides: Overrides,
    pub launch: LaunchSettings,
    /// `TPAR_TOPOLOGY`.
    pub topology: Option<String>,
    pub tune: Tune,
    /// `TPAR_ENABLE` (the plug-ins read it themselves; parsed here so a bad value is
    /// reported like any other).
    pub enable: bool,
    /// `TPAR_FUSION=0` (the vLLM plug-in reads it itself; parsed here for the same reason).
    pub fusion_off: bool,
}

impl Settings {
    /// Reads every variable of [`VARS`] from this process's environment. A value that is not
    /// UTF-8 or does not parse is an `Error::Config` naming the variable and what it takes.
    pub fn from_env() -> Result<Settings> {
        let mut pairs = Vec::new();
        for v in VARS {
            if let Some(raw) = std::env::var_os(v.name) {
                let raw = raw.into_string().map_err(|raw| bad(v.name, &raw.to_string_lossy(), "valid UTF-8"))?;
                pairs.push((v.name, raw));
            }
        }
        Settings::from_pairs(pairs)
    }

    /// Parses (name, value) pairs; names tpar does not read are ignored, empty values mean
    /// unset. The first malformed value is the error.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Settings>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut s = Settings::default();
        for (k, v) in pairs {
            let Some(decl) = var(k.as_ref()) else { continue };
            let raw = v.as_ref();
            if raw.trim().is_empty() {
                continue;
            }
            s.set(decl.name, raw)?;
        }
        match s.overrides.wire {
            Some(w) if w.is_lossy() && s.overrides.exact => Err(Error::Unsupported {
                what: format!("TPAR_WIRE={w} with TPAR_EXACT=1"),
                reason: format!("{w} on the wire is lossy (docs/cuda.md states its bound) and TPAR_EXACT=1 asks for bitwise rank-order sums: unset one of them"),
            }),
            _ => Ok(s),
        }
    }

    /// One variable's parser: the only place its grammar is written.
    fn set(&mut self, name: &'static str, raw: &str) -> Result<()> {
        let v = raw.trim();
        match name {
            "TPAR_RANK" => self.job.rank = Some(parse_int(name, v, 0usize, 15)?),
            "TPAR_WORLD_SIZE" => self.job.world = Some(parse_int(name, v, 1usize, 16)?),
            "TPAR_RDZV" => {
                let path = match v.split_once(':') {
                    Some(("unix", p)) => p,
                    Some((scheme, _)) if !v.starts_with('/') => {
                        return Err(Error::Config {
                            var: name,
                            value: raw.to_string(),
                            reason: format!("unsupported scheme {scheme:?}; tpar runs inside one host: expected unix:/path/to/socket"),
                        })
                    }
                    _ => v,
                };
                if path.is_empty() {
                    return Err(bad(name, raw, "unix:/path/to/socket"));
                }
                self.job.rdzv = Some(path.to_string());
            }
            "TPAR_JOB_ID" => {
                let hex = v.trim_start_matches("0x").trim_start_matches("0X");
                self.job.job_id = Some(u64::from_str_radix(hex, 16).map_err(|_| bad(name, raw, "a hexadecimal job id"))?);
            }
            "TPAR_TIMEOUT_MS" => {
                let ms = parse_int(name, v, 1u64, 24 * 3600 * 1000)?;
                self.job.timeout = Some(Duration::from_millis(ms));
            }
            "TPAR_SHM_BYTES" => {
                let b = parse_size(name, v)?;
                self.job.shm_bytes = Some(usize::try_from(b).map_err(|_| bad(name, raw, "a size this machine can address"))?);
            }
            "TPAR_FIRST_EPOCH" => self.job.first_epoch = Some(parse_int(name, v, 0u32, u32::MAX)?),
            "TPAR_ALGO" => {
                self.overrides.algorithm = if is_auto(v) {
                    None
                } else {
                    let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                    Some(v.parse::<Algorithm>().map_err(|_| bad(name, raw, format!("auto or one of {}", names.join(", "))))?)
                }
            }
            "TPAR_TRANSPORT" => {
                self.overrides.transport =
                    if is_auto(v) { None } else { Some(v.parse::<Transport>().map_err(|_| bad(name, raw, "auto, p2p, host, shm or nccl"))?) }
            }
            "TPAR_MAX_BYTES" => self.overrides.max_bytes = Some(parse_size(name, v)?),
            "TPAR_DISABLE" => self.overrides.disable = parse_bool(name, v)?,
            "TPAR_PROFILE" => self.overrides.profile = Some(PathBuf::from(v)),
            "TPAR_TOPOLOGY" => self.topology = Some(v.to_string()),
            "TPAR_TUNE" => {
                self.tune = match v.to_ascii_lowercase().as_str() {
                    "auto" | "1" | "on" => Tune::Auto,
                    "off" | "0" | "no" => Tune::Off,
                    "force" => Tune::Force,
                    _ => return Err(bad(name, raw, "auto, off or force")),
                }
            }
            "TPAR_CHECK_CALLS" => self.overrides.check_calls = Some(parse_bool(name, v)?),
            "TPAR_HOST_PROTOCOL" => self.overrides.host_protocol = HostProtocol::parse(raw)?,
            "TPAR_WIRE" => self.overrides.wire = Some(v.parse::<Wire>().map_err(|_| bad(name, raw, "exact, fp8 or int8"))?),
            "TPAR_EXACT" => self.overrides.exact = parse_bool(name, v)?,
            "TPAR_FUSED" => self.overrides.fused = parse_auto_switch(name, raw)?,
            "TPAR_BLOCKS" => {
                let b = if is_auto(v) {
                    None
                } else {
                    Some(parse_int(name, v, 1u32, MAX_KERNEL_BLOCKS).map_err(|_| bad(name, raw, format!("auto or 1 to {MAX_KERNEL_BLOCKS}")))?)
                };
                self.overrides.blocks = b;
            }
            "TPAR_PDL" => self.launch.pdl = parse_switch(name, raw)?,
            "TPAR_FUSED_CLUSTER" => self.launch.fused_cluster = parse_switch(name, raw)?,
            "TPAR_FUSED_ROWS" => self.launch.fused_rows = parse_auto_switch(name, raw)?,
            "TPAR_LEAN" => self.launch.lean = parse_auto_switch(name, raw)?,
            "TPAR_ZERO_COPY" => self.launch.zero_copy = parse_auto_switch(name, raw)?,
            "TPAR_TEST_UNSAFE_NO_END_BARRIER" => {
                if v != "1" {
                    return Err(bad(name, raw, "1 (or unset)"));
                }
                self.launch.test_no_end_barrier = true;
            }
            "TPAR_TEST_STAMPS" => {
                if v != "1" {
                    return Err(bad(name, raw, "1 (or unset)"));
                }
                self.launch.test_stamps = true;
            }
            "TPAR_DEBUG" => {
                self.overrides.debug = match v.to_ascii_uppercase().as_str() {
                    "INFO" | "TRACE" => true,
                    "NONE" | "OFF" | "VERSION" | "WARN" => false,
                    _ => return Err(bad(name, raw, "NONE, VERSION, WARN, INFO or TRACE")),
                }
            }
            "TPAR_ENABLE" => self.enable = parse_bool(name, v)?,
            "TPAR_FUSION" => self.fusion_off = !parse_bool(name, v)?,
            "TPAR_TEST_UNSAFE_TWO_BUFFERS" | "TPAR_TEST_UNSAFE_ONE_BUFFER" => {
                if v != "1" {
                    return Err(bad(name, raw, "1 (or unset)"));
                }
                let n = if name == "TPAR_TEST_UNSAFE_ONE_BUFFER" { 1 } else { 2 };
                self.launch.test_buffers = Some(self.launch.test_buffers.map_or(n, |m: u32| m.min(n)));
            }
            // Paths read where they are used (`nvrtc_lib`, `nccl_lib`, `cache_dir`): any
            // non-empty value is well-formed.
            "TPAR_NVRTC_LIB" | "TPAR_NCCL_LIB" | "TPAR_CACHE_DIR" | "TPAR_VLLM_LIB" => {}
            // Read where it is used (`vllm_blocks`): checked here.
            "TPAR_VLLM_BLOCKS" => {
                parse_int(name, v, 1u32, 36)?;
            }
            _ => return Err(bad(name, raw, "nothing: tpar declares this variable but has no parser for it (a bug)")),
        }
        Ok(())
    }
}

/// Whether the declared variable `name` is set to something non-empty (launchers ask whether
/// this process is a rank). Undeclared names are never "set".
pub fn is_set(name: &str) -> bool {
    var(name).is_some() && std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// `TPAR_NVRTC_LIB`: the NVRTC library file to load first.
pub fn nvrtc_lib() -> Option<PathBuf> {
    path_var("TPAR_NVRTC_LIB")
}

/// `TPAR_VLLM_LIB`: the comparison library of vLLM's kernel (`tpar bench --compare vllm`).
pub fn vllm_lib() -> Option<PathBuf> {
    path_var("TPAR_VLLM_LIB")
}

/// `TPAR_VLLM_BLOCKS`: vLLM's block limit in `tpar bench --compare vllm` (None: its default,
/// lowered to what is resident). A malformed value is None here; `Settings::from_env`
/// reports it.
pub fn vllm_blocks() -> Option<u32> {
    std::env::var("TPAR_VLLM_BLOCKS").ok().and_then(|v| parse_int("TPAR_VLLM_BLOCKS", &v, 1u32, 36).ok())
}

/// `TPAR_NCCL_LIB`: the NCCL library file to try first.
pub fn nccl_lib() -> Option<PathBuf> {
    path_var("TPAR_NCCL_LIB")
}

/// The active Python environments' prefixes, `VIRTUAL_ENV` then `CONDA_PREFIX` (set by a
/// venv's or conda's activation): where the CLI looks for the pip wheels' NVRTC and NCCL when
/// no Python process registered its own directories (`cuda::libpath`).
pub fn python_env_prefixes() -> Vec<PathBuf> {
    ["VIRTUAL_ENV", "CONDA_PREFIX"].into_iter().filter_map(path_var).collect()
}

/// Directory of the compile cache and the tuned profiles, if one can be named
/// (`TPAR_CACHE_DIR`, else `$XDG_CACHE_HOME/tpar`, else `~/.cache/tpar`).
pub fn cache_dir() -> Option<PathBuf> {
    path_var("TPAR_CACHE_DIR")
        .or_else(|| path_var("XDG_CACHE_HOME").map(|x| x.join("tpar")))
        .or_else(|| path_var("HOME").map(|h| h.join(".cache").join("tpar")))
}

/// The hardware queues CUDA maps this process's streams onto: `CUDA_DEVICE_MAX_CONNECTIONS`
/// (1 to 32), 8 when unset or unreadable (CUDA's own default and range).
pub fn cuda_hardware_queues() -> usize {
    std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| (1..=32).contains(n)).unwrap_or(8)
}

/// Whether `CUDA_DEVICE_MAX_CONNECTIONS` is set (the CLI sets it for many emulated ranks
/// unless the user did).
pub fn cuda_hardware_queues_set() -> bool {
    std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_some()
}

/// The declared variables set (non-empty) in this process's environment, with their raw
/// values, in [`VARS`] order (`tpar doctor` shows them; a value that is not UTF-8 is shown
/// lossily, and [`Settings::from_env`] refuses it).
pub fn set_vars() -> Vec<(&'static str, String)> {
    VARS.iter()
        .filter_map(|v| std::env::var_os(v.name).filter(|x| !x.is_empty()).map(|x| (v.name, x.to_string_lossy().into_owned())))
        .collect()
}

#[cfg(test)]
mod tests;
