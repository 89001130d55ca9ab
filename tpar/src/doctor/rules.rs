//! The engine rules of `tpar doctor`: which engine settings decide whether an engine's
//! tensor-parallel all-reduces reach tpar with `TPAR_ENABLE=1`, read in the engines' own
//! source (vLLM 0.33.0, SGLang 0.5.23; each [`Finding`] names the file), and how each is
//! judged from what the engine's Python has.
//!
//! The one home of these rules. `python/tpar/doctor.py` runs in the engine's Python and only
//! reports what it finds there ([`Facts`]: versions, entry points, the raw values of the
//! variables in [`VARIABLES`], library files) for what [`query`] asks; it judges nothing. Both
//! faces judge here: `tpar doctor` parses doctor.py's answer, `python -m tpar.doctor` hands it
//! over through the native module (`tpar._tpar.doctor`).
//!
//! Owns: the engines' names, distributions and plug-in groups, the variables and
//! distributions the rules read, FlashInfer's TP sizes per architecture, the findings.
//! Must never: read the environment or import an engine (the facts are handed in).

use super::engine::{Candidate, Engine, EngineSection, EntryPoint, Finding, TparInstall};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An engine tpar's drop-in serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineDecl {
    /// `vLLM` or `SGLang`.
    pub name: &'static str,
    /// Its distribution (what `importlib.metadata` knows it by).
    pub distribution: &'static str,
    /// The entry-point group it loads plug-ins from.
    pub plugin_group: &'static str,
    /// The variable that lists the plug-ins it may load.
    pub allow_list: &'static str,
}

/// The engines, in the report's order: vllm/plugins/__init__.py (`vllm.general_plugins`,
/// `VLLM_PLUGINS`), sglang/srt/plugins/__init__.py (`sglang.srt.plugins`, `SGLANG_PLUGINS`).
pub const ENGINES: [EngineDecl; 2] = [
    EngineDecl { name: "vLLM", distribution: "vllm", plugin_group: "vllm.general_plugins", allow_list: "VLLM_PLUGINS" },
    EngineDecl { name: "SGLang", distribution: "sglang", plugin_group: "sglang.srt.plugins", allow_list: "SGLANG_PLUGINS" },
];

/// FlashInfer's distributions (either name), whose presence vLLM's FlashInfer paths need.
pub const FLASHINFER: [&str; 2] = ["flashinfer-python", "flashinfer"];

/// Every engine variable a rule reads (the engine's Python reports each one's raw value).
pub const VARIABLES: [&str; 7] = [
    "VLLM_ALLREDUCE_USE_FLASHINFER",
    "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
    "VLLM_USE_NCCL_SYMM_MEM",
    "VLLM_PLUGINS",
    "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
    "VLLM_BATCH_INVARIANT",
    "SGLANG_PLUGINS",
];

/// TP sizes FlashInfer's all-reduce takes per compute capability: vLLM 0.33.0,
/// vllm/compilation/passes/fusion/allreduce_rms_fusion.py `FI_ALLREDUCE_FUSION_MAX_SIZE_MB`
/// (`FlashInferAllReduce.__init__` disables itself for any other world size).
pub const VLLM_FLASHINFER_TP: [(&str, &[usize]); 4] = [("sm_90", &[2, 4, 8]), ("sm_100", &[2, 4, 8, 16]), ("sm_103", &[2, 4, 8, 16]), ("sm_107", &[2, 4, 8])];

/// What the engine's Python is asked to report (`doctor.py --facts QUERY`, or the argument
/// of the `inspect` callback `python -m tpar.doctor` gives the native module).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Query {
    /// Distributions whose installed version the rules need.
    pub distributions: Vec<String>,
    /// Entry-point groups whose entries the rules need.
    pub plugin_groups: Vec<String>,
    /// Variables whose raw value (or absence) the rules need.
    pub variables: Vec<String>,
    /// Library file names to look for among the installed distributions' files, by kind
    /// (`libnvrtc.so.13` -> `nvrtc`).
    pub library_files: BTreeMap<String, String>,
}

/// The query of these rules.
pub fn query() -> Query {
    let distributions = ENGINES.iter().map(|e| e.distribution).chain(FLASHINFER).map(String::from).collect();
    Query {
        distributions,
        plugin_groups: ENGINES.iter().map(|e| e.plugin_group.to_string()).collect(),
        variables: VARIABLES.iter().map(|v| v.to_string()).collect(),
        library_files: super::libs::FILES.iter().map(|(f, k)| (f.to_string(), k.to_string())).collect(),
    }
}

/// [`query`] as JSON (what doctor.py's `facts` reads).
pub fn query_json() -> String {
    serde_json::to_string(&query()).unwrap_or_default()
}

/// What the engine's Python reports for a [`Query`]: facts, nothing judged. Every field has a
/// default, so a doctor.py of another release still parses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Facts {
    /// The interpreter (`sys.executable`).
    pub python: String,
    pub python_version: String,
    /// tpar's distribution there (its `plugins` are filled from `entry_points` here).
    pub tpar: TparInstall,
    /// Each asked distribution's version, `None` where it is not installed.
    pub versions: BTreeMap<String, Option<String>>,
    /// Each asked group's entry points.
    pub entry_points: BTreeMap<String, Vec<EntryPoint>>,
    /// Each asked variable's raw value, `None` where it is unset.
    pub variables: BTreeMap<String, Option<String>>,
    /// The versions tpar's contract test checks, by distribution (`tpar.engines`), empty
    /// where tpar is not importable there.
    pub pinned: BTreeMap<String, Vec<String>>,
    /// The asked library files the installed distributions hold.
    pub libraries: Vec<Candidate>,
}

impl Facts {
    fn version(&self, dist: &str) -> Option<&str> {
        self.versions.get(dist).and_then(|v| v.as_deref())
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.variables.get(name).and_then(|v| v.as_deref())
    }

    /// vLLM's boolean variables, `bool(int(os.getenv(VAR, default)))` (vllm/envs.py): the
    /// value as the report shows it, and the boolean (`None`: malformed).
    fn flag(&self, name: &str, default: i64) -> (String, Option<bool>) {
        match self.var(name) {
            None => (format!("unset (default {default})"), Some(default != 0)),
            Some(raw) => (raw.to_string(), raw.trim().parse::<i64>().ok().map(|n| n != 0)),
        }
    }

    /// Whether an engine's allow-list lets tpar's plug-in load.
    fn allowed(&self, var: &str) -> bool {
        let raw = self.var(var);
        if var == "VLLM_PLUGINS" {
            // vllm/plugins/__init__.py: unset = all; else the listed names.
            return match raw {
                None => true,
                Some(r) => r.split(',').any(|n| n == "tpar"),
            };
        }
        // sglang/srt/plugins/__init__.py: empty = all; else the listed names (stripped).
        match raw {
            None | Some("") => true,
            Some(r) => r.split(',').any(|n| n.trim() == "tpar"),
        }
    }

    fn entries(&self, group: &str) -> &[EntryPoint] {
        self.entry_points.get(group).map_or(&[], Vec::as_slice)
    }
}

/// `all` or one engine's distribution (`vllm`, `sglang`).
pub fn check_engine(engine: &str) -> Result<()> {
    if engine == "all" || ENGINES.iter().any(|e| e.distribution == engine) {
        return Ok(());
    }
    let names: Vec<&str> = ENGINES.iter().map(|e| e.distribution).collect();
    Err(Error::invalid("engine", format!("{engine}: all, {}", names.join(", "))))
}

/// The engine part of the report: `facts` judged for `engine` (`all`: each installed one) at
/// `tp` ranks on GPUs of `archs`.
pub fn judge(facts: &Facts, engine: &str, tp: usize, archs: &[String]) -> Result<EngineSection> {
    check_engine(engine)?;
    let mut tpar = facts.tpar.clone();
    tpar.plugins = ENGINES.iter().flat_map(|e| facts.entries(e.plugin_group)).filter(|p| p.value.starts_with("tpar.")).cloned().collect();
    let mut engines = Vec::new();
    let mut findings = Vec::new();
    for d in ENGINES {
        let e = Engine {
            name: d.name.into(),
            distribution: d.distribution.into(),
            version: facts.version(d.distribution).map(String::from),
            pinned: facts.pinned.get(d.distribution).cloned().unwrap_or_default(),
            plugin_group: d.plugin_group.into(),
            plugin_registered: facts.entries(d.plugin_group).iter().any(|p| p.name == "tpar" && p.value.starts_with("tpar.")),
            plugin_allowed: facts.allowed(d.allow_list),
        };
        let wanted = engine == "all" || engine == d.distribution;
        if wanted && (engine != "all" || e.version.is_some()) {
            findings.extend(if d.distribution == "vllm" { vllm(facts, tp, archs) } else { sglang(facts, tp, archs) });
        }
        if wanted {
            engines.push(e);
        }
    }
    Ok(EngineSection {
        python: facts.python.clone(),
        python_version: facts.python_version.clone(),
        error: None,
        tpar,
        engines,
        findings,
        libraries: facts.libraries.clone(),
        notes: Vec::new(),
    })
}

/// The engine part from the engine Python's answer to [`query`] (`python` names that Python
/// in an error): judged for `engine` in `ctx`, or a section saying why it could not be.
pub fn judge_answer(python: &str, answer: &str, engine: &str, ctx: &super::EngineContext) -> EngineSection {
    let facts = match serde_json::from_str::<Facts>(answer) {
        Ok(f) => f,
        Err(err) => return EngineSection::unavailable(python, format!("its answer is not the doctor's JSON ({err})")),
    };
    judge(&facts, engine, ctx.tp, &ctx.archs).unwrap_or_else(|e| EngineSection::unavailable(python, e.to_string()))
}

/// [`judge`] from and to JSON: the facts as doctor.py's `facts` writes them, the section as the
/// report's JSON holds it. Malformed facts are an error.
pub fn judge_json(facts: &str, engine: &str, tp: usize, archs: &[String]) -> Result<String> {
    let facts: Facts = serde_json::from_str(facts).map_err(|e| Error::invalid("facts", format!("not the doctor's facts JSON: {e}")))?;
    serde_json::to_string(&judge(&facts, engine, tp, archs)?).map_err(|e| Error::invalid("facts", e))
}

/// A finding; `fix_kind` only where there is a fix.
#[allow(clippy::too_many_arguments)]
fn finding(engine: &str, setting: &str, now: String, (applies, why): (&str, String), effect: &str, source: &str, severity: &str, fix: Option<(String, &str)>) -> Finding {
    Finding {
        engine: engine.into(),
        setting: setting.into(),
        now,
        applies: applies.into(),
        why_applies: why,
        effect: effect.into(),
        source: source.into(),
        severity: severity.into(),
        fix_kind: fix.as_ref().map(|(_, k)| k.to_string()),
        fix: fix.map(|(f, _)| f),
    }
}

/// Whether a rule for GPUs that `matches` applies on `archs` (none known: unknown).
fn arch_rule(archs: &[String], matches: impl Fn(&str) -> bool) -> (&'static str, String) {
    if archs.is_empty() {
        return ("unknown", "on sm_90 and sm_10x GPUs; the GPUs here are unknown".into());
    }
    let here = format!("the GPUs here are {}", archs.join(", "));
    (if archs.iter().any(|a| matches(a)) { "yes" } else { "no" }, here)
}

/// Without the engine in that Python, whether FlashInfer comes with it cannot be told.
fn unless_here((applies, why): (&'static str, String), here: bool) -> (&'static str, String) {
    if here || applies != "yes" {
        return (applies, why);
    }
    ("unknown", format!("{why}; vLLM is not installed in this Python, so whether FlashInfer is cannot be told"))
}

fn env_fix(line: String) -> Option<(String, &'static str)> {
    Some((line, "env"))
}

fn on_or_off(on: bool) -> String {
    if on { "switched on" } else { "off (vLLM's default)" }.into()
}

/// Settings of vLLM 0.33.0 that decide whether its tensor-parallel all-reduces reach tpar.
fn vllm(f: &Facts, tp: usize, archs: &[String]) -> Vec<Finding> {
    let v = "vLLM";
    let no_flashinfer = FLASHINFER.iter().all(|d| f.version(d).is_none());
    let here = f.version("vllm").is_some();
    let invariant = f.flag("VLLM_BATCH_INVARIANT", 0).1 == Some(true);
    let mut out = Vec::new();

    let (now, on) = f.flag("VLLM_ALLREDUCE_USE_FLASHINFER", 1);
    let applies = if on == Some(false) {
        ("no", "switched off".into())
    } else if invariant {
        ("no", "VLLM_BATCH_INVARIANT=1 switches it off".into())
    } else if no_flashinfer && here {
        ("no", "FlashInfer is not installed in this Python".into())
    } else {
        let table = |a: &str| VLLM_FLASHINFER_TP.iter().any(|(arch, tps)| *arch == a && tps.contains(&tp));
        let (a, why) = arch_rule(archs, table);
        unless_here((a, format!("{why} (FlashInfer's all-reduce runs on sm_90/100/103/107 at TP 2, 4, 8; 16 on sm_100/103)")), here)
    };
    out.push(finding(
        v,
        "VLLM_ALLREDUCE_USE_FLASHINFER",
        now,
        applies,
        "FlashInfer's all-reduce takes every call under its size limit before tpar's class is asked: TPAR_ENABLE=1 alone changes nothing for those calls",
        "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.all_reduce (fi_ar_comm before ca_comm), flashinfer_all_reduce.py FlashInferAllReduce.__init__",
        "pre-empts",
        env_fix("export VLLM_ALLREDUCE_USE_FLASHINFER=0".into()),
    ));

    let applies = if invariant {
        ("no", "VLLM_BATCH_INVARIANT=1 switches it off".into())
    } else if no_flashinfer && here {
        ("no", "FlashInfer is not installed in this Python".into())
    } else if tp < 2 {
        ("no", format!("TP {tp}"))
    } else {
        let (a, why) = arch_rule(archs, |a| a == "sm_90" || a.starts_with("sm_10"));
        unless_here((a, format!("{why} (on by default at -O2 and -O3 for TP > 1 on sm_90 and sm_10x with FlashInfer installed)")), here)
    };
    out.push(finding(
        v,
        "compilation pass_config.fuse_allreduce_rms",
        "the optimisation level's default (a server option: not visible from here)".into(),
        applies,
        "the compiler fuses all-reduce + RMSNorm (+ FP8/NVFP4 quant) into FlashInfer's kernel; with TPAR_ENABLE=1 tpar's plug-in runs its own fusion pass before it, so the token ranges tpar's plan takes go to tpar's fused kernels and FlashInfer keeps the larger ranges: leave it on",
        "vllm/config/vllm.py enable_allreduce_rms_fusion, OPTIMIZATION_LEVEL_02/03; vllm/compilation/passes/pass_manager.py PostGradPassManager.configure",
        "note",
        None,
    ));

    let (now, on) = f.flag("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", 0);
    let on = on == Some(true);
    out.push(finding(
        v,
        "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
        now,
        (if on { "yes" } else { "no" }, on_or_off(on)),
        "FlashInfer's PCIe IPC all-reduce is asked before tpar's class",
        "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.all_reduce",
        "pre-empts",
        env_fix("export VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=0".into()),
    ));

    let (now, on) = f.flag("VLLM_USE_NCCL_SYMM_MEM", 0);
    let on = on == Some(true);
    out.push(finding(
        v,
        "VLLM_USE_NCCL_SYMM_MEM",
        now,
        (if on && !invariant { "yes" } else { "no" }, on_or_off(on)),
        "NCCL's symmetric-memory all-reduce takes the small and the large sizes before tpar's class is asked",
        "vllm/distributed/device_communicators/all_reduce_utils.py should_nccl_symm_mem_allreduce, asked first in CudaCommunicator.all_reduce",
        "pre-empts",
        env_fix("export VLLM_USE_NCCL_SYMM_MEM=0".into()),
    ));

    let raw = f.var("VLLM_PLUGINS");
    let ok = f.allowed("VLLM_PLUGINS");
    let listed: Vec<&str> = raw.unwrap_or("").split(',').filter(|p| !p.is_empty()).chain(["tpar"]).collect();
    out.push(finding(
        v,
        "VLLM_PLUGINS",
        raw.unwrap_or("unset (every plug-in loads)").to_string(),
        if ok { ("no", "tpar is allowed".into()) } else { ("yes", "the allow-list omits tpar".into()) },
        "vLLM loads only the plug-ins this list names: without `tpar`, TPAR_ENABLE=1 does nothing",
        "vllm/plugins/__init__.py load_plugins_by_group",
        "blocks",
        if ok { None } else { env_fix(format!("export VLLM_PLUGINS={}", listed.join(","))) },
    ));

    let prefixes: Vec<&str> = f.var("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY").unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    let ray_ok = prefixes.iter().any(|p| "TPAR_".starts_with(p));
    out.push(finding(
        v,
        "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
        if prefixes.is_empty() { "unset".into() } else { prefixes.join(",") },
        if ray_ok { ("no", "TPAR_ variables are copied".into()) } else { ("unknown", "only with --distributed-executor-backend ray".into()) },
        "Ray workers get only the variables vLLM copies (VLLM_, NCCL_, ...): TPAR_ENABLE never reaches them",
        "vllm/envs.py VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
        "blocks",
        if ray_ok { None } else { env_fix(format!("export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY={}", prefixes.iter().copied().chain(["TPAR_"]).collect::<Vec<_>>().join(","))) },
    ));

    let (now, _) = f.flag("VLLM_BATCH_INVARIANT", 0);
    out.push(finding(
        v,
        "VLLM_BATCH_INVARIANT",
        now,
        (if invariant { "yes" } else { "no" }, on_or_off(invariant)),
        "vLLM's own custom all-reduce would take every size; tpar gives the sizes its plan sends to NCCL to the engine's NCCL, so the reduction order can change with the batch size",
        "vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.__init__",
        "note",
        None,
    ));
    out
}

/// Settings of SGLang 0.5.23 that decide whether its all-reduces reach tpar.
fn sglang(f: &Facts, tp: usize, archs: &[String]) -> Vec<Finding> {
    let s = "SGLang";
    let applies = if tp < 2 {
        ("no", format!("TP {tp}"))
    } else {
        let (a, why) = arch_rule(archs, |a| matches!(a, "sm_90" | "sm_100" | "sm_103"));
        // It depends on the model's architecture, which is not known here.
        let a = if a == "yes" { "unknown" } else { a };
        (a, format!("{why} (auto-enabled on sm_90/sm_100 at TP > 1 for some MoE architectures, e.g. Kimi-K2.5, Qwen3.5-MoE, Nemotron-H, without attention DP)"))
    };
    let mut out = vec![finding(
        s,
        "flashinfer_allreduce_fusion_backend",
        "the model's default (a server option: not visible from here)".into(),
        applies,
        "SGLang fuses those all-reduces with the residual add + RMSNorm into FlashInfer's call; with TPAR_ENABLE=1 tpar's plug-in replaces that call (flashinfer_allreduce_residual_rmsnorm) by tpar's fused kernel wherever tpar's plan takes the size, and hands the rest to FlashInfer: leave it on",
        "sglang/srt/arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable; sglang/srt/layers/flashinfer_comm_fusion.py flashinfer_allreduce_residual_rmsnorm",
        "note",
        None,
    )];
    let raw = f.var("SGLANG_PLUGINS").unwrap_or("");
    let ok = f.allowed("SGLANG_PLUGINS");
    let listed: Vec<&str> = raw.split(',').map(str::trim).filter(|p| !p.is_empty()).chain(["tpar"]).collect();
    out.push(finding(
        s,
        "SGLANG_PLUGINS",
        if raw.is_empty() { "unset (every plug-in loads)".into() } else { raw.to_string() },
        if ok { ("no", "tpar is allowed".into()) } else { ("yes", "the allow-list omits tpar".into()) },
        "SGLang loads only the plug-ins this list names: without `tpar`, TPAR_ENABLE=1 does nothing",
        "sglang/srt/plugins/__init__.py",
        "blocks",
        if ok { None } else { env_fix(format!("export SGLANG_PLUGINS={}", listed.join(","))) },
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(vars: &[(&str, &str)], dists: &[(&str, &str)]) -> Facts {
        let mut f = Facts { python: "py".into(), ..Facts::default() };
        for v in VARIABLES {
            f.variables.insert(v.into(), None);
        }
        for (k, v) in vars {
            f.variables.insert(k.to_string(), Some(v.to_string()));
        }
        for (d, v) in dists {
            f.versions.insert(d.to_string(), Some(v.to_string()));
        }
        f
    }

    fn by<'a>(s: &'a EngineSection, setting: &str) -> &'a Finding {
        s.findings.iter().find(|f| f.setting == setting).unwrap_or_else(|| panic!("no {setting} in {:?}", s.findings))
    }

    fn sm(a: &str) -> Vec<String> {
        vec![a.to_string()]
    }

    #[test]
    fn flashinfer_applies_where_its_table_says_and_nowhere_else() {
        let f = facts(&[], &[("vllm", "0.33.0"), ("flashinfer-python", "0.6.1")]);
        for (tp, arch, want) in [(8, "sm_90", "yes"), (16, "sm_100", "yes"), (16, "sm_90", "no"), (3, "sm_90", "no"), (8, "sm_120", "no"), (8, "sm_107", "yes")] {
            let s = judge(&f, "vllm", tp, &sm(arch)).unwrap();
            assert_eq!(by(&s, "VLLM_ALLREDUCE_USE_FLASHINFER").applies, want, "TP {tp} on {arch}");
        }
        assert_eq!(by(&judge(&f, "vllm", 8, &[]).unwrap(), "VLLM_ALLREDUCE_USE_FLASHINFER").applies, "unknown", "GPUs unknown");
        // Without FlashInfer beside vLLM, or switched off, or batch-invariant: never.
        let none = facts(&[], &[("vllm", "0.33.0")]);
        assert_eq!(by(&judge(&none, "vllm", 8, &sm("sm_90")).unwrap(), "VLLM_ALLREDUCE_USE_FLASHINFER").applies, "no");
        for vars in [[("VLLM_ALLREDUCE_USE_FLASHINFER", "0")], [("VLLM_BATCH_INVARIANT", "1")]] {
            let f = facts(&vars, &[("vllm", "0.33.0"), ("flashinfer", "0.6.1")]);
            assert_eq!(by(&judge(&f, "vllm", 8, &sm("sm_90")).unwrap(), "VLLM_ALLREDUCE_USE_FLASHINFER").applies, "no", "{vars:?}");
        }
        // vLLM not in that Python: whether FlashInfer comes with it cannot be told.
        let s = judge(&facts(&[], &[]), "vllm", 8, &sm("sm_90")).unwrap();
        assert_eq!(by(&s, "VLLM_ALLREDUCE_USE_FLASHINFER").applies, "unknown");
        assert_eq!(by(&s, "compilation pass_config.fuse_allreduce_rms").applies, "unknown");
    }

    #[test]
    fn allow_lists_without_tpar_block_it_and_the_fix_appends_it() {
        let f = facts(&[("VLLM_PLUGINS", "lora"), ("SGLANG_PLUGINS", " other ")], &[]);
        let v = judge(&f, "vllm", 8, &sm("sm_90")).unwrap();
        let p = by(&v, "VLLM_PLUGINS");
        assert_eq!((p.applies.as_str(), p.fix.as_deref(), p.fix_kind.as_deref()), ("yes", Some("export VLLM_PLUGINS=lora,tpar"), Some("env")));
        assert!(!v.engines[0].plugin_allowed);
        let s = judge(&f, "sglang", 8, &sm("sm_90")).unwrap();
        assert_eq!(by(&s, "SGLANG_PLUGINS").fix.as_deref(), Some("export SGLANG_PLUGINS=other,tpar"));
        // vLLM does not strip the names; SGLang does.
        let f = facts(&[("VLLM_PLUGINS", "tpar,lora"), ("SGLANG_PLUGINS", "a, tpar")], &[]);
        assert_eq!(by(&judge(&f, "vllm", 8, &[]).unwrap(), "VLLM_PLUGINS").applies, "no");
        assert_eq!(by(&judge(&f, "sglang", 8, &[]).unwrap(), "SGLANG_PLUGINS").applies, "no");
        let f = facts(&[("VLLM_PLUGINS", "lora, tpar")], &[]);
        assert_eq!(by(&judge(&f, "vllm", 8, &[]).unwrap(), "VLLM_PLUGINS").applies, "yes");
    }

    #[test]
    fn flags_read_as_vllm_reads_them() {
        let f = facts(&[("VLLM_USE_NCCL_SYMM_MEM", "1"), ("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "yes")], &[]);
        let s = judge(&f, "vllm", 8, &[]).unwrap();
        assert_eq!(by(&s, "VLLM_USE_NCCL_SYMM_MEM").applies, "yes");
        let pcie = by(&s, "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC");
        assert_eq!((pcie.now.as_str(), pcie.applies.as_str()), ("yes", "no"), "malformed: vLLM would fail to parse it, so not on");
        assert_eq!(by(&s, "VLLM_BATCH_INVARIANT").now, "unset (default 0)");
        let ray = by(&s, "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY");
        assert_eq!((ray.applies.as_str(), ray.fix.as_deref()), ("unknown", Some("export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=TPAR_")));
        let f = facts(&[("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY", "FOO_, TP")], &[]);
        assert_eq!(by(&judge(&f, "vllm", 8, &[]).unwrap(), "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY").applies, "no", "TP copies TPAR_");
    }

    #[test]
    fn engines_are_judged_where_installed_or_asked_for() {
        let f = facts(&[], &[("sglang", "0.5.23")]);
        let all = judge(&f, "all", 8, &sm("sm_90")).unwrap();
        assert_eq!(all.engines.len(), 2);
        assert!(all.findings.iter().all(|x| x.engine == "SGLang"), "{:?}", all.findings);
        assert_eq!(by(&all, "flashinfer_allreduce_fusion_backend").applies, "unknown", "depends on the model");
        // tpar's plug-in routes SGLang's fused call (docs/engines.md): a note, nothing to switch off.
        let fusion = by(&all, "flashinfer_allreduce_fusion_backend");
        assert_eq!((fusion.severity.as_str(), fusion.fix.as_deref()), ("note", None), "{fusion:?}");
        let v = judge(&f, "vllm", 8, &sm("sm_90")).unwrap();
        assert_eq!(v.engines.len(), 1);
        assert!(v.findings.iter().all(|x| x.engine == "vLLM"));
        assert!(judge(&f, "trtllm", 8, &[]).is_err());
    }

    #[test]
    fn tpars_entry_points_are_its_plugins() {
        let mut f = facts(&[], &[]);
        let ep = |g: &str, n: &str, v: &str| EntryPoint { group: g.into(), name: n.into(), value: v.into() };
        f.entry_points.insert("vllm.general_plugins".into(), vec![ep("vllm.general_plugins", "lora", "lora.x:f"), ep("vllm.general_plugins", "tpar", "tpar.engines.vllm:register")]);
        let s = judge(&f, "all", 2, &[]).unwrap();
        assert_eq!(s.tpar.plugins.len(), 1);
        assert!(s.engines[0].plugin_registered && !s.engines[1].plugin_registered);
    }

    #[test]
    fn every_variable_asked_is_judged_and_every_variable_judged_is_asked() {
        let s = judge(&facts(&[], &[("vllm", "0"), ("sglang", "0")]), "all", 8, &sm("sm_90")).unwrap();
        let judged: Vec<&str> = s.findings.iter().map(|f| f.setting.as_str()).filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_')).collect();
        for v in VARIABLES {
            assert!(judged.contains(&v) || s.findings.iter().any(|f| f.why_applies.contains(v)), "{v} is asked but no rule reads it");
        }
        for j in judged {
            assert!(VARIABLES.contains(&j), "{j} is judged but not asked for");
        }
        // tpar's own settings are read by `settings` alone, never through the engine's Python.
        assert!(VARIABLES.iter().all(|v| !v.starts_with("TPAR_")));
        let q = query();
        assert!(q.distributions.iter().any(|d| d == "flashinfer-python") && q.plugin_groups.len() == ENGINES.len());
    }
}
