//! The harness `bench`, `check` and `tune` share: where ranks run ([`Target`]: CPU rank
//! processes, one rank process per GPU, or ranks emulated as streams of one GPU), the one
//! [`Group`] every command drives (CPU ranks, or GPU ranks of either placement), the rank-process launcher, the one verifier,
//! the one table, progress and output files.
//!
//! Every flag that two commands share is parsed here, so it means the same in each.

/// `$e` with `$T` the element type of the dtype `$d`: the one place a runtime dtype becomes
/// a type parameter.
macro_rules! by_dtype {
    ($d:expr, $T:ident => $e:expr) => {
        match $d {
            tpar::DType::F32 => {
                type $T = f32;
                $e
            }
            tpar::DType::F16 => {
                type $T = tpar::f16;
                $e
            }
            tpar::DType::BF16 => {
                type $T = tpar::bf16;
                $e
            }
        }
    };
}

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod fused;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod launch;
pub mod output;
#[cfg(feature = "cuda")]
pub mod peer;
pub mod progress;
#[cfg(any(feature = "cuda", test))]
pub mod stamps;
pub mod table;
pub mod verify;

use clap::Args;
use tpar::algorithms::registry::{algorithms_emulated, algorithms_on, computes, spec};
use tpar::plan::{Backend, CaptureMode};
use tpar::units::Spread;
use tpar::{Algorithm, Collective, DType, Transport};
pub use verify::Verdict;

/// Every size of a call on the command line (`-b`, `-e`, `--bytes`, `--sequence`, in every
/// command): the one size grammar of `tpar::units` (`42K`, `1.5M`, `1KiB`), and positive: a
/// 0-byte all-reduce moves nothing to measure, check, plan or simulate.
pub fn size(s: &str) -> Result<usize, String> {
    match tpar::units::parse_size(s).map_err(|e| e.to_string())? {
        0 => Err(format!("bad size {s:?}: must be positive")),
        n => Ok(n),
    }
}

/// `-c`: 0 or 1 (clap's own range check would print `0..=1`).
pub fn zero_or_one(s: &str) -> Result<u8, String> {
    match s.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        other => Err(format!("{other:?}: expected 0 or 1")),
    }
}

/// Refuses a size (`flag`'s value) that holds no element of some datatype in `dtypes`: its
/// table would be empty.
pub fn holds_an_element(flag: &str, bytes: usize, dtypes: &[DType]) -> Result<(), String> {
    crate::exit::refusing(|| {
        match dtypes.iter().filter(|d| d.size() > bytes).max_by_key(|d| d.size()) {
            Some(d) => Err(format!(
                "{flag} {bytes}: smaller than one {d} element ({} B); every size must hold at least one element of each datatype",
                d.size()
            )),
            None => Ok(()),
        }
    })
}

/// Where the ranks run and how many there are; the same flags in `bench`, `check`, `tune`.
#[derive(Args, Debug, Clone)]
pub struct RankArgs {
    /// Ranks (world size): rank processes to start. Default, everywhere: one per GPU on the
    /// cuda backend; one per core, 2 to 8, on cpu. Ignored under an outside launcher
    /// (TPAR_WORLD_SIZE is the world then)
    #[arg(long = "world", visible_alias = "ranks", value_name = "N")]
    pub world: Option<usize>,
    /// Backend: cpu (rank processes over shared memory), cuda (one rank process per GPU, or
    /// --emulate-ranks), or auto: cuda when there are 2+ GPUs, else cpu
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Run N ranks (or a list: 2,4,8) as streams of one GPU instead of rank processes
    #[arg(long = "emulate-ranks", value_name = "N[,N..]", help_heading = "Emulated ranks (one GPU)")]
    pub emulate_ranks: Option<String>,
    /// Workspace transport of tpar's kernels: p2p (device memory; CUDA IPC across rank
    /// processes) or host (pinned host memory; a shared host segment across rank processes:
    /// for GPUs without peer-to-peer). Rank processes also take TPAR_TRANSPORT
    #[arg(long, default_value = "p2p", help_heading = "Emulated ranks (one GPU)")]
    pub transport: String,
    /// Emulated ranks: the GPU's ordinal
    #[arg(long, default_value_t = 0, help_heading = "Emulated ranks (one GPU)")]
    pub device: usize,
    /// Test: before every call each emulated rank waits a random time on the device (half the
    /// calls 0, else up to NS ns; per rank and call, eager and in graphs), so that fast ranks
    /// reuse buffers while slow peers still read them. Every output is still checked.
    #[arg(long = "skew-ns", value_name = "NS", help_heading = "Emulated ranks (one GPU)")]
    pub skew_ns: Option<u32>,
    /// Emulated ranks: the islands `hierarchical` reduces over: `halves` (default: the first
    /// ceil(N/2) ranks, then the rest), `one`, island sizes in rank order such as `3+5`, or
    /// `map:01010101` (one character per rank naming its island). A list, `1+3,3+5`, gives one
    /// split per world. They choose the protocol; the ranks still share one GPU
    #[arg(long, value_name = "SPEC", help_heading = "Emulated ranks (one GPU)")]
    pub islands: Option<String>,
}

/// Where the ranks of a run are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// CPU rank processes over POSIX shared memory.
    Cpu,
    /// One rank process per GPU (`GpuCommunicator`).
    Gpu,
    /// Ranks as streams of one GPU, for each of these world sizes.
    Emulated { worlds: Vec<usize>, transport: Transport },
}

impl Target {
    /// The algorithms this target runs, from the registry.
    pub fn algorithms(&self) -> Vec<Algorithm> {
        match self {
            Target::Cpu => algorithms_on(Backend::Cpu),
            Target::Gpu => algorithms_on(Backend::Cuda),
            Target::Emulated { transport, .. } => algorithms_emulated(*transport),
        }
    }

    /// Capture modes it can time, and the default of `--mode`.
    pub fn modes(&self) -> (&'static [CaptureMode], &'static [CaptureMode]) {
        const EAGER: &[CaptureMode] = &[CaptureMode::Eager];
        const BOTH: &[CaptureMode] = &[CaptureMode::Eager, CaptureMode::Graph];
        match self {
            Target::Cpu => (EAGER, EAGER),
            Target::Gpu => (BOTH, BOTH),
            Target::Emulated { .. } => (BOTH, EAGER),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Cpu => "CPU ranks",
            Target::Gpu => "GPU rank processes",
            Target::Emulated { .. } => "emulated ranks",
        }
    }
}

/// Whether this command runs emulated ranks (set by [`RankArgs::target`]), so that no
/// message suggests `--emulate-ranks` to a command that refuses it.
static EMULATE_OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Set by `tpar tune`: GPU rank processes join with `TPAR_TUNE=off` (the command runs its
/// own start of the tune once they joined, under its own budget).
static TUNE_AT_JOIN_OFF: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Makes GPU rank processes of this command join without their first-use tune.
pub fn no_tune_at_join() {
    let _ = TUNE_AT_JOIN_OFF.set(());
}

/// Whether [`no_tune_at_join`] was called.
pub fn tune_at_join_off() -> bool {
    TUNE_AT_JOIN_OFF.get().is_some()
}

/// `--transport host` for GPU rank processes, once [`RankArgs::gpu_transport`] saw it.
static GPU_TRANSPORT: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();

/// The transport GPU rank processes were asked to force (`--transport host`), if any.
pub fn gpu_transport() -> Option<Transport> {
    GPU_TRANSPORT.get().copied()
}

/// GPUs NVML sees, discovered once per process.
pub fn gpu_count() -> usize {
    static GPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *GPUS.get_or_init(|| tpar::Topology::discover().gpu_count())
}

/// Cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// 2 to 16 ranks, or why not.
pub fn check_world(world: usize) -> Result<(), String> {
    crate::exit::refusing(|| {
        let max = tpar::workspace::MAX_WORLD;
        if (2..=max).contains(&world) {
            Ok(())
        } else {
            Err(format!("--world {world}: tpar runs 2 to {max} ranks on one host"))
        }
    })
}

/// Refuses, before any rank starts, a well-formed `TPAR_*` setting that CPU ranks cannot
/// honour (`TPAR_ALGO=nccl`, `TPAR_DISABLE=1`, ...): every rank's communicator would refuse
/// it at init with the same message, once per rank, after the table's header. The check is
/// the communicators' own (`Overrides::validate` on the CPU topology).
fn cpu_ranks_honour_the_settings(world: usize) -> Result<(), String> {
    let settings = tpar::Settings::from_env().map_err(|e| e.to_string())?;
    settings
        .overrides
        .validate(&tpar::Topology::cpu(), world, tpar::plan::Backend::Cpu)
        .map_err(|e| format!("{e} (CPU ranks would refuse it at init; `tpar settings` lists every variable)"))
}

impl RankArgs {
    /// Resolves `--backend` and `--emulate-ranks`. `emulate_ok`: whether the command runs
    /// emulated ranks at all (so messages never suggest a flag it refuses).
    pub fn target(&self, cmd: &str, emulate_ok: bool) -> Result<Target, String> {
        crate::exit::refusing(|| {
            let _ = EMULATE_OK.set(emulate_ok);
            if let Some(list) = &self.emulate_ranks {
                if !emulate_ok {
                    return Err(format!("tpar {cmd} does not run emulated ranks: they share one GPU, so they measure no fabric"));
                }
                if self.backend == "cpu" {
                    return Err("--emulate-ranks runs ranks on one GPU: use --backend cuda or auto".into());
                }
                if self.world.is_some() {
                    return Err("--emulate-ranks N gives the world size of emulated ranks; drop --world".into());
                }
                let worlds = list
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().map_err(|_| format!("--emulate-ranks {x:?}: expected a number or a list such as 2,4,8")))
                    .collect::<Result<Vec<_>, _>>()?;
                for &w in &worlds {
                    check_world(w).map_err(|e| e.replace("--world", "--emulate-ranks"))?;
                }
                let transport: Transport = self.transport.parse().map_err(|e: tpar::Error| e.to_string())?;
                if !matches!(transport, Transport::P2p | Transport::Host) {
                    return Err(format!("--transport {transport}: emulated ranks run over p2p or host"));
                }
                return Ok(Target::Emulated { worlds, transport });
            }
            if self.gpu_transport()? == Some(Transport::Host) {
                if self.backend == "cpu" {
                    return Err("--transport host is for GPU ranks: CPU ranks exchange data through shared memory (shm) already".into());
                }
                if let Some(w) = self.world {
                    check_world(w)?;
                }
                return Ok(Target::Gpu);
            }
            if let Some(w) = self.world {
                check_world(w)?;
            }
            let target = match self.backend.as_str() {
                "cpu" => Ok(Target::Cpu),
                "cuda" => Ok(Target::Gpu),
                "auto" => {
                    if !cfg!(feature = "cuda") {
                        return Ok(Target::Cpu);
                    }
                    let gpus = gpu_count();
                    if gpus == 1 && !launch::is_rank() {
                        let how = if emulate_ok { "; --emulate-ranks N runs N ranks on this one" } else { "" };
                        eprintln!("tpar: one GPU here: running CPU ranks (GPU rank processes need 2+ GPUs{how})");
                    }
                    Ok(if gpus >= 2 { Target::Gpu } else { Target::Cpu })
                }
                other => Err(format!("--backend {other:?}: expected auto, cpu or cuda")),
            }?;
            if matches!(target, Target::Cpu) && !launch::is_rank() {
                cpu_ranks_honour_the_settings(self.world(&target)?)?;
            }
            Ok(target)
        })
    }

    /// `--transport` for GPU rank processes: `None` for p2p (the default: the plan and
    /// `TPAR_TRANSPORT` decide), `Some(Host)` to force the host transport. Remembered for
    /// [`gpu_transport`], which the rank's communicator reads when it joins.
    pub fn gpu_transport(&self) -> Result<Option<Transport>, String> {
        let t: Transport = self.transport.parse().map_err(|e: tpar::Error| e.to_string())?;
        match t {
            Transport::P2p => Ok(None),
            Transport::Host => {
                let _ = GPU_TRANSPORT.set(Transport::Host);
                Ok(Some(Transport::Host))
            }
            other => Err(format!("--transport {other}: GPU ranks run over p2p (device memory) or host (shared host memory)")),
        }
    }

    /// The world size: `--world`, else the one default rule (one per GPU; one per core, 2 to 8).
    pub fn world(&self, target: &Target) -> Result<usize, String> {
        if let Some(w) = self.world {
            return Ok(w);
        }
        match target {
            Target::Cpu => Ok(cores().clamp(2, 8)),
            Target::Gpu => {
                let gpus = gpu_count();
                if gpus < 2 {
                    let how = gpus == 1 && EMULATE_OK.get() == Some(&true);
                    return Err(format!(
                        "--backend cuda runs one rank process per GPU and needs 2 or more GPUs; NVML sees {gpus}{}",
                        if how { ". On one GPU, --emulate-ranks N runs N ranks as streams of it" } else { "" }
                    ));
                }
                Ok(gpus)
            }
            Target::Emulated { worlds, .. } => Ok(worlds.iter().copied().max().unwrap_or(2)),
        }
    }
}

/// `--algo`: `all`, `auto` (the plan's pick per call, as TPAR_ALGO=auto), or a comma list
/// of what `target` runs. `None` in the result stands for `auto`.
pub fn parse_algos(s: &str, target: &Target) -> Result<Vec<Option<Algorithm>>, String> {
    parse_algos_for(s, target, Collective::AllReduce)
}

/// As [`parse_algos`], for calls of `c`: `all` is what these ranks run that computes `c`
/// (the registry's `computes`), and a named algorithm that does not is refused, saying which do.
pub fn parse_algos_for(s: &str, target: &Target, c: Collective) -> Result<Vec<Option<Algorithm>>, String> {
    crate::exit::refusing(|| {
        let runs = target.algorithms();
        let names = || runs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
        let items: Vec<&str> = s.split(',').map(str::trim).collect();
        if items.len() > 1 && items.iter().any(|x| *x == "all" || *x == "auto") {
            return Err(format!("--algo {s:?}: `all` and `auto` stand alone; or list algorithms from: {}", names()));
        }
        match items[..] {
            ["all"] => return Ok(runs.iter().copied().filter(|a| computes(*a, c).is_ok()).map(Some).collect()),
            ["auto"] => return Ok(vec![None]),
            _ => {}
        }
        items
            .iter()
            .map(|x| {
                let a: Algorithm = x.parse().map_err(|_| format!("--algo {x:?}: unknown; {} run: {}, or all, or auto", target.name(), names()))?;
                if !runs.contains(&a) {
                    return Err(format!("--algo {a}: {} do not run it ({}); they run: {}", target.name(), spec(a).summary, names()));
                }
                computes(a, c).map(|()| Some(a)).map_err(|e| format!("--algo {a}: {e}"))
            })
            .collect()
    })
}

/// `-d`: `all` or a comma list of float, half, bfloat16.
pub fn parse_dtypes(s: &str) -> Result<Vec<DType>, String> {
    crate::exit::refusing(|| {
        let names = DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ");
        let expected = || format!("expected one of {names}, a comma list of them (float,bfloat16), or all");
        if s.trim() == "all" {
            return Ok(DType::ALL.to_vec());
        }
        let mut v: Vec<DType> = Vec::new();
        for item in s.split(',').map(str::trim) {
            if item == "all" {
                return Err(format!("-d {s:?}: `all` stands alone; {}", expected()));
            }
            let d = item.parse::<DType>().map_err(|_| format!("-d {item:?}: unknown datatype; {}", expected()))?;
            if !v.contains(&d) {
                v.push(d);
            }
        }
        Ok(v)
    })
}

/// `--mode`: eager, graph or both; `None` is the target's default.
pub fn parse_modes(s: Option<&str>, target: &Target) -> Result<Vec<CaptureMode>, String> {
    crate::exit::refusing(|| {
        let (can, default) = target.modes();
        let want = match s {
            None => return Ok(default.to_vec()),
            Some("both") => vec![CaptureMode::Eager, CaptureMode::Graph],
            Some("eager") => vec![CaptureMode::Eager],
            Some("graph") => vec![CaptureMode::Graph],
            Some(m) => return Err(format!("--mode {m:?}: expected eager, graph or both")),
        };
        if let Some(m) = want.iter().find(|m| !can.contains(m)) {
            return Err(format!("--mode {m}: {} time eager calls only (CUDA graphs are a GPU thing)", target.name()));
        }
        Ok(want)
    })
}

/// Sizes from `min` to `max` multiplying by `factor`, as all_reduce_perf's -b/-e/-f.
pub fn size_steps(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    crate::exit::refusing(|| {
        if min > max {
            return Err(format!("-b {min} is larger than -e {max}"));
        }
        if factor < 2 && min != max {
            return Err("-f must be at least 2".into());
        }
        let mut v = vec![];
        let mut s = min.max(1);
        while s <= max {
            v.push(s);
            match s.checked_mul(factor) {
                Some(n) if factor >= 2 => s = n,
                _ => break,
            }
        }
        Ok(v)
    })
}

/// `--sequence CALLSxBYTES` (e.g. 122x43008 or 122x42K).
pub fn parse_sequence(s: &str) -> Result<(usize, usize), String> {
    crate::exit::refusing(|| {
        let (a, b) = s.split_once(['x', 'X']).ok_or_else(|| format!("--sequence {s:?}: expected CALLSxBYTES, e.g. 122x43008"))?;
        let calls = a.trim().parse::<usize>().map_err(|e| format!("--sequence calls: {e}"))?;
        let bytes = size(b)?;
        if calls == 0 || bytes == 0 {
            return Err("--sequence: calls and bytes must be positive".into());
        }
        Ok((calls, bytes))
    })
}

/// Elements per rank (as `Collective::io_elems` takes them) of a call of `c` whose size is
/// `bytes` as nccl-tests counts it: the all-reduce's buffer; the all-gather's output and the
/// reduce-scatter's input (every rank's part), each rank's part rounded down to whole 16-byte
/// vectors as `all_gather_perf` and `reduce_scatter_perf` round it.
pub fn per_rank_count(c: Collective, d: DType, bytes: usize, world: usize) -> usize {
    match c {
        Collective::AllReduce => bytes / d.size(),
        _ => Collective::part_bytes(bytes as u64, world) as usize / d.size(),
    }
}

/// The parse of `--collective` (nccl-tests' names taken too: `all_gather_perf`).
pub fn parse_collective(s: &str) -> Result<Collective, String> {
    s.parse::<Collective>()
        .map_err(|e| format!("--collective {s:?}: {e}"))
}

/// Where a checked call's input comes from and its output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// Input uploaded, output a separate buffer, poisoned first.
    OutOfPlace,
    /// The input buffer is the output.
    InPlace,
    /// GPU rank processes: the input is written by a copy on a caller's stream and the
    /// output read after that stream: `wait_for` and `signal_to` must order both. Elsewhere
    /// as [`Io::OutOfPlace`].
    CallerStream,
}

impl Io {
    pub fn label(self) -> &'static str {
        match self {
            Io::OutOfPlace => "",
            Io::InPlace => " in place",
            Io::CallerStream => " via a caller's stream",
        }
    }
}

/// How a point is timed: `inner` calls per iteration (back to back, or captured in one
/// graph), `warmup` untimed iterations, then `iters` timed ones.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub mode: CaptureMode,
    pub inner: usize,
    pub warmup: usize,
    pub iters: usize,
}

/// One group of ranks as every command drives it: CPU ranks (a [`tpar::CpuCommunicator`]
/// of host buffers) or GPU ranks of either placement (device buffers through the library's
/// one GPU call, [`gpu::GpuRanks`]). In a rank process, the methods are collective: every
/// rank calls them in the same order; only the root prints. (One per run, never copied
/// about: its variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Group {
    Cpu(cpu::CpuRanks),
    #[cfg(feature = "cuda")]
    Gpu(gpu::GpuRanks),
}

/// `$e` on the group's ranks, whichever they are (both kinds have the same methods).
macro_rules! on_ranks {
    ($g:expr, $r:ident => $e:expr) => {
        match $g {
            Group::Cpu($r) => $e,
            #[cfg(feature = "cuda")]
            Group::Gpu($r) => $e,
        }
    };
}

impl Group {
    pub fn world(&self) -> usize {
        on_ranks!(self, r => r.world())
    }
    /// Whether this process prints and writes the outputs.
    pub fn root(&self) -> bool {
        on_ranks!(self, r => r.root())
    }
    /// `backend` of the records: cpu, cuda, cuda-emulated-p2p, ...
    pub fn label(&self) -> String {
        on_ranks!(self, r => r.label())
    }
    /// What `algo` travels over here.
    pub fn transport(&self, algo: Algorithm) -> Transport {
        on_ranks!(self, r => r.transport(algo))
    }
    /// Lines that say where and how this group runs (the table's preamble).
    pub fn describe(&mut self) -> Result<Vec<String>, String> {
        on_ranks!(self, r => r.describe())
    }
    /// The algorithms this group can run now (NCCL only where it joined).
    pub fn algorithms(&self) -> Vec<Algorithm> {
        on_ranks!(self, r => r.algorithms())
    }
    /// What the plan runs for this call of `c` (`bytes` per rank, as
    /// `Collective::io_elems` counts them), where this group has a plan.
    pub fn planned(&mut self, c: Collective, d: DType, bytes: usize, mode: CaptureMode) -> Option<Algorithm> {
        on_ranks!(self, r => r.planned(c, d, bytes, mode))
    }
    /// One call of `c` on fresh random inputs of every rank (`seed`, `call`), output
    /// poisoned, judged by the one verifier and agreed by every rank. `algo` None: the plan's
    /// pick. `count`: elements per rank as `Collective::io_elems` takes them.
    #[allow(clippy::too_many_arguments)]
    pub fn checked(&mut self, c: Collective, d: DType, algo: Option<Algorithm>, seed: u64, call: u64, count: usize, io: Io) -> Result<Verdict, String> {
        on_ranks!(self, r => r.checked(c, d, algo, seed, call, count, io))
    }
    /// Per-call microseconds of `c`: per iteration the slowest rank; the root gets the spread.
    pub fn time(&mut self, c: Collective, algo: Algorithm, d: DType, count: usize, t: Timing) -> Result<Option<Spread>, String> {
        on_ranks!(self, r => r.time(c, algo, d, count, t))
    }
    pub fn barrier(&mut self) -> Result<(), String> {
        on_ranks!(self, r => r.barrier())
    }
    /// Where the ranks are, for timing another project's kernel beside tpar's (`bench
    /// --compare`); `None` where no peer runs (CPU ranks).
    #[cfg(feature = "cuda")]
    pub fn peer_site(&mut self) -> Option<peer::Site<'_>> {
        match self {
            Group::Cpu(_) => None,
            Group::Gpu(r) => Some(r.peer_site()),
        }
    }
    /// Where checked calls spent their time, where the group measures it (emulated ranks).
    pub fn phase_report(&self) -> Option<String> {
        match self {
            Group::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            Group::Gpu(r) => r.phase_report(),
        }
    }
    /// One start of this machine's tune on this group (the library's one tuner:
    /// `tpar::tune`), for messages up to `max_bytes`; the same outcome on every rank.
    pub fn tune(&mut self, opts: tpar::tune::StartOptions, max_bytes: usize) -> Result<tpar::tune::Outcome, String> {
        on_ranks!(self, r => r.tune(opts, max_bytes))
    }
}

/// Runs `body` on each group of `target`: in this process for emulated ranks (one group per
/// world size), else as one rank of the group (launching the ranks first when this process
/// is not a rank yet: then `body` runs in them, and this returns `Ok(false)`).
pub fn run_groups(
    target: &Target,
    args: &RankArgs,
    max_bytes: usize,
    mut body: impl FnMut(&mut Group) -> Result<(), String>,
) -> Result<bool, String> {
    match target {
        Target::Cpu => {
            if !launch::is_rank() {
                launch::launch(args.world(target)?, launch::FAIL_GRACE)?;
                return Ok(false);
            }
            body(&mut Group::Cpu(cpu::CpuRanks::join()?))?;
        }
        #[cfg(feature = "cuda")]
        Target::Gpu => {
            if !launch::is_rank() {
                gpu::launch_ranks(args.world(target)?, launch::FAIL_GRACE, false)?;
                return Ok(false);
            }
            body(&mut Group::Gpu(gpu::GpuRanks::join(max_bytes, None)?))?;
        }
        #[cfg(feature = "cuda")]
        Target::Emulated { worlds, transport } => {
            for &w in worlds {
                body(&mut Group::Gpu(gpu::GpuRanks::emulated(args.device, w, max_bytes, *transport, args.skew_ns, args.islands.as_deref())?))?;
            }
        }
        #[cfg(not(feature = "cuda"))]
        Target::Gpu | Target::Emulated { .. } => {
            let _ = max_bytes;
            return Err("this tpar was built without the `cuda` feature".into());
        }
    }
    Ok(true)
}

/// Per iteration, the slowest of every rank's `times` (`all`: each rank's as little-endian
/// f64s, as [`encode_times`] writes them), as a spread.
pub fn slowest(times: &[f64], all: &[Vec<u8>]) -> Spread {
    let mut worst = times.to_vec();
    for p in all {
        for (w, c) in worst.iter_mut().zip(p.chunks_exact(8)) {
            *w = w.max(c.try_into().map_or(f64::INFINITY, f64::from_le_bytes));
        }
    }
    tpar::units::percentiles(&mut worst)
}

/// `times` for the control plane.
pub fn encode_times(times: &[f64]) -> Vec<u8> {
    times.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Whether this process prints what the ranks do before they run (the launcher, or rank 0
/// under an outside launcher).
pub fn first_process() -> bool {
    !launch::is_rank() || tpar::Settings::from_env().is_ok_and(|s| s.job.rank == Some(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_the_one_grammar() {
        assert_eq!(size("42K"), Ok(43008));
        assert_eq!(size("1KiB"), Ok(1024));
        assert_eq!(size("1.5K"), Ok(1536));
        assert!(size("3X").is_err());
        assert_eq!(size_steps(8, 128, 4).unwrap(), vec![8, 32, 128]);
        assert_eq!(size_steps(64, 64, 1).unwrap(), vec![64]);
    }

    #[test]
    fn algo_lists_name_only_what_the_target_runs() {
        let cpu = Target::Cpu;
        assert_eq!(parse_algos("all", &cpu).unwrap().len(), algorithms_on(Backend::Cpu).len());
        assert_eq!(parse_algos("auto", &cpu).unwrap(), vec![None]);
        let e = parse_algos("all,x", &cpu).unwrap_err();
        assert!(e.contains("stand alone") && e.contains("oneshot-push") && !e.contains("staged-push"), "{e}");
        let e = parse_algos("staged-push", &cpu).unwrap_err();
        assert!(e.contains("do not run it") && !e.contains("nccl"), "{e}");
        let gpu = Target::Gpu;
        assert!(parse_algos("gather-bcast", &gpu).unwrap_err().contains("GPU rank processes do not run it"));
        assert_eq!(parse_algos("oneshot-push,nccl", &gpu).unwrap(), vec![Some(Algorithm::OneshotPush), Some(Algorithm::Nccl)]);
    }

    #[test]
    fn collective_sizes_are_nccl_tests_sizes() {
        assert_eq!(
            per_rank_count(Collective::AllReduce, DType::BF16, 1024, 8),
            512
        );
        // 1 KiB of bf16 gathered from 8 ranks: 64 elements each.
        assert_eq!(
            per_rank_count(Collective::AllGather, DType::BF16, 1024, 8),
            64
        );
        // 3 ranks: 170 per rank, rounded down to whole vectors of 8 bf16.
        assert_eq!(
            per_rank_count(Collective::ReduceScatter, DType::BF16, 1024, 3),
            168
        );
        assert_eq!(per_rank_count(Collective::AllGather, DType::F32, 8, 4), 0);
        assert_eq!(
            parse_collective("all_gather_perf"),
            Ok(Collective::AllGather)
        );
        assert!(parse_collective("broadcast")
            .unwrap_err()
            .contains("--collective"));
        let cpu = Target::Cpu;
        assert_eq!(parse_algos_for("all", &cpu, Collective::AllGather).unwrap(), vec![Some(Algorithm::OneshotPush), Some(Algorithm::OneshotPull)]);
        let e = parse_algos_for("twoshot-push", &cpu, Collective::ReduceScatter).unwrap_err();
        assert!(e.contains("all-reduce only"), "{e}");
    }

    #[test]
    fn sequences_parse() {
        assert_eq!(parse_sequence("122x43008"), Ok((122, 43008)));
        assert_eq!(parse_sequence("122x42K"), Ok((122, 43008)));
        assert!(parse_sequence("0x1").is_err());
    }
}
