//! `tpar doctor`: what tpar sees on this box and what it would do inside an engine, in one
//! report that renders as text and as JSON — the same from the `tpar` command and from
//! `python -m tpar.doctor` (through the native module), so each fact has one source.
//!
//! | part | file | from |
//! |---|---|---|
//! | the fabric: GPUs, link matrix, P2P, islands, the link probe | `mod.rs` | `topology` (NVML or a preset), `topology::render`, a tuned profile's probe or `cuda::probe` |
//! | the engine's size classes: the plan's pick, reason, times, gain, sources | `mod.rs` | `plan::plan` with the settings of this shell |
//! | the verify-step estimate | [`estimate`] | `model` (its `default_case` without GPUs) |
//! | run-time libraries and the kernel cache | [`libs`] | `cuda::{driver, nvrtc, nccl}`, `settings` |
//! | the engine: installed engines, versions, plug-ins, pre-empting settings | [`engine`] (the schema), [`rules`] (the judging) | the facts `python/tpar/doctor.py` reports from the engine's Python |
//! | the lines to paste | [`paste`] | all of the above |
//!
//! Owns: the report's data and its gathering. Must never: fail or panic because something is
//! missing (no GPU, driver, library, profile or Python: each is a line of the report; only
//! malformed options are errors), read the environment except through `settings`, or import
//! an engine (the engine part is judged from facts handed in by the caller).

pub mod engine;
pub mod estimate;
pub mod libs;
pub mod paste;
mod render;
pub mod rules;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Backend, CaptureMode, Collective, Transport};
use crate::plan::profile::{Profile, ProfileFingerprint};
use crate::plan::{plan, Overrides, Plan, PlanInput};
use crate::settings::{Settings, Tune};
use crate::topology::{presets, Topology};
use crate::units::human_bytes;
use serde::{Deserialize, Serialize};

pub use engine::EngineSection;
pub use paste::PasteLine;

/// Tokens per all-reduce of the size classes shown: 1 (decode), 2-4 (speculative verify
/// widths), powers of two to 128 (batched decode: the batch sizes engines capture CUDA graphs
/// for) and 512 (a prefill chunk). Each all-reduce carries tokens x hidden x 2 bytes (bf16).
pub const SIZE_CLASS_TOKENS: [usize; 10] = [1, 2, 3, 4, 8, 16, 32, 64, 128, 512];

/// Largest message the engines' drop-in takes, bytes: its default `max_size` (8192 x 1024,
/// the default of vLLM's and SGLang's own custom all-reduce classes, which tpar's replaces;
/// python/tpar/engines/common.py). Larger calls go to the engine's own NCCL.
pub const ENGINE_MAX_BYTES: u64 = 8192 * 1024;

/// The element type of the size classes: the engines' activations.
pub const SIZE_CLASS_DTYPE: DType = DType::BF16;

/// What to report on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// A preset, `cpu`, or a topology JSON file; `None`: this machine (NVML).
    pub topology: Option<String>,
    /// Tensor-parallel size; `None`: one rank per GPU of the topology.
    pub tp: Option<usize>,
    /// Elements per token of each all-reduce (the model's hidden size).
    pub hidden: usize,
    /// Measure this machine's links now (`cuda::probe`, a few seconds on a GPU machine).
    pub probe: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { topology: None, tp: None, hidden: crate::model::KIMI_HIDDEN, probe: false }
    }
}

impl Options {
    /// Refuses options that cannot describe any run (the caller's bad flags).
    pub fn validate(&self) -> Result<()> {
        if let Some(tp) = self.tp {
            if !(1..=crate::workspace::MAX_WORLD).contains(&tp) {
                return Err(Error::invalid("tp", format!("{tp}: expected 1 to {} ranks", crate::workspace::MAX_WORLD)));
            }
        }
        if self.hidden == 0 {
            return Err(Error::invalid("hidden", "expected a positive number of elements per token"));
        }
        if self.probe && self.topology.is_some() {
            return Err(Error::invalid("probe", "--probe measures this machine; it cannot be combined with --topology"));
        }
        Ok(())
    }
}

/// The machine tpar sees (or the preset it was asked to look at).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    /// Where the topology came from: `discovered through NVML`, `preset NAME`, a file.
    pub source: String,
    /// Whether this is the machine itself (not a preset or a file).
    pub discovered: bool,
    /// Why no GPU is listed, when none is.
    pub no_gpu: Option<String>,
    /// Each GPU's architecture (`sm_90`), `?` where unknown.
    pub archs: Vec<String>,
    /// Where the architectures come from (NVML, or the GPUs' names for a preset).
    pub arch_source: String,
    /// Where the link probe shown comes from, or why there is none.
    pub probe: String,
    pub topology: Topology,
}

/// A tuned profile named by `TPAR_PROFILE` and whether it applies here.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileStatus {
    pub path: Option<String>,
    /// One line per finding: what it was tuned for, whether it applies to eager and graph
    /// calls at this TP, or why it could not be read.
    pub lines: Vec<String>,
}

/// One size class: the plan for eager calls and for calls in CUDA graphs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizeClass {
    pub tokens: usize,
    pub bytes: u64,
    pub eager: Plan,
    pub graph: Plan,
}

/// One size class of sequence-parallel decode (vLLM's `sp_all_gather` / `sp_reduce_scatter`):
/// `tokens` rows per rank, `bytes` per rank (the all-gather's input, the reduce-scatter's
/// output), the plan of each collective for calls in CUDA graphs (how engines run decode).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GatherScatterClass {
    pub tokens: usize,
    pub bytes: u64,
    pub all_gather: Plan,
    pub reduce_scatter: Plan,
}

/// The `TPAR_*` settings of this shell.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SettingsStatus {
    pub set: Vec<(String, String)>,
    /// The first malformed one (a communicator would refuse to start).
    pub error: Option<String>,
    /// `TPAR_ENABLE` as parsed.
    pub enable: bool,
}

/// Everything `tpar doctor` prints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub version: String,
    pub settings: SettingsStatus,
    pub machine: Machine,
    pub profile: ProfileStatus,
    pub tp: usize,
    pub hidden: usize,
    pub dtype: DType,
    /// The size classes, or why there are none (no GPU, TP 1).
    pub size_classes: Vec<SizeClass>,
    pub size_classes_note: Option<String>,
    /// The sequence-parallel all-gather and reduce-scatter at the same token counts per rank
    /// (empty where `size_classes` is).
    #[serde(default)]
    pub gather_scatter: Vec<GatherScatterClass>,
    pub estimate: estimate::Estimate,
    pub libraries: Vec<libs::Library>,
    pub cache: libs::CacheStatus,
    /// The engine's Python, as `python/tpar/doctor.py` found it and [`rules`] judged it
    /// (absent: not inspected).
    pub engine: Option<EngineSection>,
    /// The environment lines (and server flags) to paste, each with its reason.
    pub paste: Vec<PasteLine>,
    /// Everything that was looked for and not found, or would stop tpar: one line each.
    pub problems: Vec<String>,
}

/// What the engine rules need from this report: the TP size and the GPUs' architectures.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EngineContext {
    pub tp: usize,
    pub archs: Vec<String>,
}

impl Report {
    /// Gathers everything but the engine's Python and the library search (which may use the
    /// files the engine's Python has: [`Report::finish`]). An error only for bad options.
    pub fn gather(opts: &Options) -> Result<Report> {
        opts.validate()?;
        let (settings, overrides, tune) = settings_status();
        let mut topology = match &opts.topology {
            None => Topology::discover(),
            Some(name) => Topology::load(name)?,
        };
        let discovered = opts.topology.is_none();
        let profile_path = overrides.profile.clone();
        let (profile, mut profile_lines) = load_profile(profile_path.as_deref(), tune, &overrides);
        let probe = attach_probe(&mut topology, discovered, opts.probe, profile.as_ref());
        let (archs, arch_source) = archs_of(&topology, discovered);
        let gpus = topology.gpu_count();
        let tp = opts.tp.unwrap_or(gpus);
        if let Some(p) = &profile {
            profile_lines.extend(profile_applies(p, &topology, tp));
        }
        let no_gpu = (gpus == 0).then(|| {
            let why = topology.notes.iter().find(|n| n.starts_with("no GPU topology")).cloned().unwrap_or_else(|| "the topology lists no GPU".into());
            format!("{why}; `--topology PRESET` shows what tpar would do on a preset box ({})", presets::NAMES.join(", "))
        });
        let (size_classes, size_classes_note) = size_classes(&topology, tp, opts.hidden, &overrides, profile.as_ref());
        let gather_scatter = if size_classes.is_empty() { Vec::new() } else { gather_scatter_classes(&topology, tp, opts.hidden, &overrides, profile.as_ref()) };
        let estimate = estimate::estimate(&topology, discovered, opts.tp, opts.hidden, profile.as_ref());
        let source = match &opts.topology {
            // Without GPUs the first note is NVML's error, which the report prints once, in its
            // NO GPU line.
            None if no_gpu.is_some() => "this machine, through NVML".into(),
            None => topology.notes.first().cloned().unwrap_or_else(|| "discovered".into()),
            Some(name) if presets::by_name(name).is_some() => format!("preset {name} (--topology): a machine tpar knows, not this one"),
            Some(name) => format!("{name} (--topology)"),
        };
        Ok(Report {
            version: env!("CARGO_PKG_VERSION").to_string(),
            settings,
            machine: Machine { source, discovered, no_gpu, archs, arch_source, probe, topology },
            profile: ProfileStatus { path: profile_path.map(|p| p.display().to_string()), lines: profile_lines },
            tp,
            hidden: opts.hidden,
            dtype: SIZE_CLASS_DTYPE,
            size_classes,
            size_classes_note,
            gather_scatter,
            estimate,
            libraries: Vec::new(),
            cache: libs::cache_status(),
            engine: None,
            paste: Vec::new(),
            problems: Vec::new(),
        })
    }

    /// What [`rules::judge`] needs of this report to judge the engine's settings.
    pub fn engine_context(&self) -> EngineContext {
        let mut archs: Vec<String> = self.machine.archs.iter().filter(|a| a.as_str() != "?").cloned().collect();
        archs.dedup();
        EngineContext { tp: self.tp, archs }
    }

    /// Adds the engine's Python (or none), looks for the run-time libraries (also among the
    /// files that Python's installed distributions hold), and works out the lines to paste
    /// and the problems.
    pub fn finish(&mut self, engine: Option<EngineSection>) {
        let candidates = engine.as_ref().map(|e| e.libraries.clone()).unwrap_or_default();
        self.libraries = libs::check(&candidates);
        self.engine = engine;
        self.paste = paste::paste_lines(self);
        self.problems = problems(self);
    }

    /// The text report.
    pub fn text(&self) -> String {
        render::text(self)
    }

    /// The JSON report (the same facts as the text).
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// The settings of this shell, and the plan's overrides from them (none where one is
/// malformed: the report says which).
fn settings_status() -> (SettingsStatus, Overrides, Tune) {
    let set = crate::settings::set_vars().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    match Settings::from_env() {
        Ok(s) => (SettingsStatus { set, error: None, enable: s.enable }, s.overrides, s.tune),
        Err(e) => (SettingsStatus { set, error: Some(e.to_string()), enable: false }, Overrides::default(), Tune::default()),
    }
}

/// Where the first-use tune's time comes from (emulated 2, 4 and 8 ranks on one H200: the
/// first start tuned in 7.5 / 8.1 / 8.0 s, the next read the cache in 0.3-0.6 ms).
const TUNE_TIME_SOURCE: &str = "bench/results/2026-12-02-h200-tune-engines-large/README.md";

/// What a GPU communicator starting here does for its plan when `TPAR_PROFILE` is unset: the
/// first-use tune (`tune::start`), or why it skips it (the skips of a GPU communicator's
/// start, `cuda::comm::tune_start`, that the settings alone decide).
fn without_profile(tune: Tune, o: &Overrides) -> String {
    let skip = if tune == Tune::Off {
        Some("TPAR_TUNE=off".to_string())
    } else if o.disable {
        Some("TPAR_DISABLE=1: every call goes to NCCL".to_string())
    } else if let Some(a) = o.algorithm {
        Some(format!("TPAR_ALGO={a} forces the algorithm"))
    } else if o.transport == Some(Transport::Nccl) {
        Some("TPAR_TRANSPORT=nccl: every call goes to NCCL".to_string())
    } else {
        None
    };
    if let Some(why) = skip {
        return format!("no tuned profile (TPAR_PROFILE is unset) and no tune at start ({why}): the plan uses its defaults; `tpar tune -o FILE` measures this machine");
    }
    if crate::settings::cache_dir().is_none() {
        return "no tuned profile (TPAR_PROFILE is unset) and no cache directory (set TPAR_CACHE_DIR or HOME), so no tune at start: the plan uses its defaults".into();
    }
    let when = match tune {
        Tune::Force => "TPAR_TUNE=force: every GPU communicator's start tunes its machine again",
        _ => "TPAR_TUNE=auto (the default): the first GPU communicator to start on a machine with no cached profile tunes it",
    };
    format!(
        "no TPAR_PROFILE; {when} (about 8 s: 7.5-8.1 s measured with 2-8 ranks, {TUNE_TIME_SOURCE}) and caches the profile \
         (profiles/ in the kernel cache's directory, below); later starts read it in under a millisecond. The plans below are the defaults that profile replaces"
    )
}

fn load_profile(path: Option<&std::path::Path>, tune: Tune, overrides: &Overrides) -> (Option<Profile>, Vec<String>) {
    let Some(path) = path else {
        return (None, vec![without_profile(tune, overrides)]);
    };
    match Profile::load(path) {
        Ok(p) => {
            let f = &p.fingerprint;
            let line = format!("TPAR_PROFILE={}: tuned for world {}, {} calls, topology {}", path.display(), f.world, f.capture, f.topology_hash);
            (Some(p), vec![line])
        }
        Err(e) => (None, vec![format!("TPAR_PROFILE={} cannot be used: {e}", path.display())]),
    }
}

/// Whether the profile applies to eager and to graph calls at `tp` here.
fn profile_applies(p: &Profile, t: &Topology, tp: usize) -> Vec<String> {
    let driver = crate::topology::nvml::driver_version();
    [CaptureMode::Eager, CaptureMode::Graph]
        .into_iter()
        .map(|mode| match p.mismatch(&ProfileFingerprint::new(t, driver.clone(), Backend::Cuda, tp, mode)) {
            None => format!("applies to {mode} calls at TP {tp}"),
            Some(why) => format!("not used for {mode} calls at TP {tp}: {why}"),
        })
        .collect()
}

/// Puts a link probe into the topology where one exists: measured now (`--probe`), a
/// matching profile's, or a preset's published figures. Returns where it came from.
fn attach_probe(t: &mut Topology, discovered: bool, measure: bool, profile: Option<&Profile>) -> String {
    if measure && discovered {
        return match measure_probe() {
            Ok(p) => {
                let what = format!("measured now (--probe): {}", p.source);
                t.probe = Some(p);
                what
            }
            Err(e) => format!("--probe could not measure: {e}"),
        };
    }
    if let Some(p) = &t.probe {
        return format!("the preset's: {}", p.source);
    }
    if let Some(prof) = profile {
        if prof.fingerprint.topology_hash == format!("{:016x}", t.hash()) {
            if let Some(with) = prof.topology_with_probe(t) {
                *t = with;
                return "from the tuned profile (TPAR_PROFILE)".into();
            }
        }
    }
    if discovered && t.gpu_count() > 0 {
        "none: no tuned profile with a probe for this machine; `tpar doctor --probe` measures one now (a few seconds)".into()
    } else {
        "none".into()
    }
}

#[cfg(feature = "cuda")]
fn measure_probe() -> Result<crate::topology::probe::Probe> {
    crate::cuda::probe::run(None, &crate::cuda::probe::ProbeOptions::default())
}

#[cfg(not(feature = "cuda"))]
fn measure_probe() -> Result<crate::topology::probe::Probe> {
    Err(Error::Unsupported { what: "the link probe".into(), reason: "tpar was built without the `cuda` feature".into() })
}

/// Each GPU's architecture: NVML's compute capability for this machine, the GPU's name for a
/// preset or a file.
fn archs_of(t: &Topology, discovered: bool) -> (Vec<String>, String) {
    if discovered {
        if let Some(caps) = crate::topology::nvml::compute_capabilities() {
            let key = |id: &str| crate::topology::ranks::canonical_bus_id(id);
            let archs = t
                .gpus
                .iter()
                .map(|g| caps.iter().find(|(id, _, _)| key(id) == key(&g.pci_bus_id)).map_or_else(|| "?".to_string(), |(_, ma, mi)| format!("sm_{ma}{mi}")))
                .collect();
            return (archs, "NVML's compute capability".into());
        }
    }
    (t.gpus.iter().map(|g| arch_from_name(&g.name).unwrap_or("?").to_string()).collect(), "the GPUs' names (assumed)".into())
}

/// The architecture of a GPU by its marketing name, for presets (whose GPUs cannot be
/// asked). Compute capabilities from NVIDIA's CUDA GPU list.
pub fn arch_from_name(name: &str) -> Option<&'static str> {
    const TABLE: [(&str, &str); 12] = [
        ("GB300", "sm_103"),
        ("B300", "sm_103"),
        ("GB200", "sm_100"),
        ("B200", "sm_100"),
        ("H100", "sm_90"),
        ("H200", "sm_90"),
        ("H800", "sm_90"),
        ("RTX PRO 6000", "sm_120"),
        ("RTX 5090", "sm_120"),
        ("L40", "sm_89"),
        ("RTX 4090", "sm_89"),
        ("A100", "sm_80"),
    ];
    TABLE.iter().find(|(k, _)| name.contains(k)).map(|(_, a)| *a)
}

/// The engine's size classes at `tp` ranks: the plan (with this shell's settings and the
/// tuned profile) for eager calls and for calls in CUDA graphs.
fn size_classes(t: &Topology, tp: usize, hidden: usize, overrides: &Overrides, profile: Option<&Profile>) -> (Vec<SizeClass>, Option<String>) {
    if t.gpu_count() == 0 {
        return (Vec::new(), Some("no GPU: nothing to plan for (give --topology PRESET to see a preset box)".into()));
    }
    if tp < 2 {
        return (Vec::new(), Some(format!("TP {tp}: an engine runs no all-reduce with one rank (give --tp N)")));
    }
    // As a GPU communicator does at init: messages above the drop-in's size go to NCCL.
    let mut o = overrides.clone();
    o.max_bytes = Some(o.max_bytes.map_or(ENGINE_MAX_BYTES, |m| m.min(ENGINE_MAX_BYTES)));
    let decide = |bytes: u64, capture: CaptureMode| -> Plan {
        if bytes > ENGINE_MAX_BYTES {
            return Plan {
                algorithm: Algorithm::Nccl,
                transport: Transport::Nccl,
                blocks: 0,
                reason: format!("{} > the drop-in's max_size ({}): the engine's own NCCL", human_bytes(bytes), human_bytes(ENGINE_MAX_BYTES)),
                predicted_us: None,
                nccl_us: None,
                source: None,
                nccl_source: None,
                bound_us: None,
                instead_of: None,
            };
        }
        plan(&PlanInput { topology: t, world: tp, bytes, dtype: SIZE_CLASS_DTYPE, capture, backend: Backend::Cuda, profile, overrides: &o })
    };
    let classes = SIZE_CLASS_TOKENS
        .iter()
        .map(|&tokens| {
            let bytes = (tokens * hidden * SIZE_CLASS_DTYPE.size()) as u64;
            SizeClass { tokens, bytes, eager: decide(bytes, CaptureMode::Eager), graph: decide(bytes, CaptureMode::Graph) }
        })
        .collect();
    (classes, None)
}

/// The sequence-parallel size classes at `tp` ranks ([`GatherScatterClass`]): the plan of
/// each collective in CUDA graphs, per-rank bytes above the drop-in's `max_size` left to NCCL
/// as the drop-in leaves them.
fn gather_scatter_classes(t: &Topology, tp: usize, hidden: usize, overrides: &Overrides, profile: Option<&Profile>) -> Vec<GatherScatterClass> {
    let decide = |collective: Collective, bytes: u64| -> Plan {
        let input = PlanInput { topology: t, world: tp, bytes, dtype: SIZE_CLASS_DTYPE, capture: CaptureMode::Graph, backend: Backend::Cuda, profile, overrides };
        let mut p = crate::plan::plan_collective(collective, &input);
        if bytes > ENGINE_MAX_BYTES && p.algorithm != Algorithm::Nccl {
            let why = format!("{} per rank > the drop-in's max_size ({}): the engine's own NCCL", human_bytes(bytes), human_bytes(ENGINE_MAX_BYTES));
            p = Plan { predicted_us: p.nccl_us, source: p.nccl_source, ..p.replaced(Algorithm::Nccl, Transport::Nccl, why) };
        }
        p
    };
    SIZE_CLASS_TOKENS
        .iter()
        .map(|&tokens| {
            let bytes = (tokens * hidden * SIZE_CLASS_DTYPE.size()) as u64;
            GatherScatterClass { tokens, bytes, all_gather: decide(Collective::AllGather, bytes), reduce_scatter: decide(Collective::ReduceScatter, bytes) }
        })
        .collect()
}

/// One line per thing looked for and not found, or that would keep tpar out.
fn problems(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(e) = &r.settings.error {
        out.push(format!("a TPAR_* setting is malformed, and every communicator would refuse to start: {e}"));
    }
    if r.machine.no_gpu.is_some() && r.machine.discovered {
        // NVML's error is printed once, in the Fabric section's NO GPU line.
        out.push("no GPU visible (why: the Fabric section's NO GPU line)".into());
    }
    if r.machine.discovered && r.tp > r.machine.topology.gpu_count() && r.machine.topology.gpu_count() > 0 {
        out.push(format!("TP {} is more than the {} GPUs here: the plan gives every call to NCCL", r.tp, r.machine.topology.gpu_count()));
    }
    out.extend(r.profile.lines.iter().filter(|l| l.contains("cannot be used")).cloned());
    if r.machine.probe.starts_with("--probe could not") {
        out.push(r.machine.probe.clone());
    }
    for l in &r.libraries {
        if let Some(p) = l.problem() {
            out.push(p);
        }
    }
    if let Some(p) = r.cache.problem() {
        out.push(p);
    }
    if let Some(e) = &r.engine {
        out.extend(e.problems());
    }
    out
}

#[cfg(test)]
mod tests;
