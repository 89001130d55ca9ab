//! The engine part of `tpar doctor`: what the engine's Python has (installed distributions,
//! entry points, library files; nothing imported from the engines, as
//! `python/tpar/doctor.py` reports it) and the engine settings judged by [`super::rules`].
//!
//! [`EngineSection`] is that part of the report (text and JSON). Owns: that schema and the
//! engine's problem lines (the lines to paste follow from the whole report: `paste.rs`).
//! Must never: judge an engine setting itself (`rules.rs` does, the one home of the engine
//! rules), or know the rest of the report (`libs.rs` reads its [`Candidate`]s, so it stands
//! below the library checks).

use serde::{Deserialize, Serialize};

/// A library file one of the engine Python's distributions holds (e.g. `libnvrtc.so.13` of
/// the `nvidia-cuda-nvrtc` wheel).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Candidate {
    /// `nvrtc`, `nccl` or `cuda`.
    pub library: String,
    pub path: String,
    /// The distribution and its version.
    pub distribution: String,
}

/// An entry point of tpar's distribution.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EntryPoint {
    pub group: String,
    pub name: String,
    pub value: String,
}

/// tpar's Python package in the engine's Python.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TparInstall {
    pub installed: bool,
    pub version: Option<String>,
    pub location: Option<String>,
    /// Whether `import tpar` (and its native module) works there.
    pub importable: bool,
    pub error: Option<String>,
    pub plugins: Vec<EntryPoint>,
}

/// One engine (installed or not).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Engine {
    /// `vLLM` or `SGLang`.
    pub name: String,
    pub distribution: String,
    /// `None`: not installed.
    pub version: Option<String>,
    /// The versions tpar's contract test checks (`tpar.engines.VLLM_VERSIONS` /
    /// `SGLANG_VERSIONS`); empty where tpar could not be asked.
    pub pinned: Vec<String>,
    /// The entry-point group the engine loads plug-ins from.
    pub plugin_group: String,
    /// tpar's entry point is registered in that group.
    pub plugin_registered: bool,
    /// The engine's allow-list (if any) lets tpar's plug-in load.
    pub plugin_allowed: bool,
}

impl Engine {
    /// Whether `version` is one of the pinned ones (a local build tag, `0.33.0+cu130`, aside).
    pub fn pins(&self, version: &str) -> bool {
        let base = version.split('+').next().unwrap_or(version);
        self.pinned.iter().any(|p| p == base)
    }
}

/// An engine setting that keeps calls from tpar, or stops it, or is worth knowing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Finding {
    pub engine: String,
    /// The variable or server flag.
    pub setting: String,
    /// Its value now, as the engine reads it.
    pub now: String,
    /// `yes`, `no`, or `unknown` (depends on the GPUs or the model, unknown here), with why.
    pub applies: String,
    pub why_applies: String,
    /// What the engine does with it, in tpar's terms.
    pub effect: String,
    /// Where in the engine's source this is read (file and function, pinned version).
    pub source: String,
    /// `pre-empts` (calls go elsewhere before tpar is asked), `blocks` (tpar never loads),
    /// or `note`.
    pub severity: String,
    /// The line that undoes it, and whether it is an environment line or a server flag.
    pub fix: Option<String>,
    pub fix_kind: Option<String>,
}

/// The engine part of the report: the facts of the engine's Python, judged (`rules::judge`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineSection {
    /// The interpreter (`sys.executable`).
    pub python: String,
    pub python_version: String,
    /// Set by the caller when that Python could not be run or answered nothing usable.
    pub error: Option<String>,
    pub tpar: TparInstall,
    pub engines: Vec<Engine>,
    pub findings: Vec<Finding>,
    pub libraries: Vec<Candidate>,
    pub notes: Vec<String>,
}

impl EngineSection {
    /// A section that says why the engine's Python could not be inspected.
    pub fn unavailable(python: &str, error: String) -> EngineSection {
        EngineSection { python: python.to_string(), error: Some(error), ..EngineSection::default() }
    }

    /// The installed engines.
    pub fn installed(&self) -> impl Iterator<Item = &Engine> {
        self.engines.iter().filter(|e| e.version.is_some())
    }

    /// One line per thing that keeps tpar out of the engine here.
    pub fn problems(&self) -> Vec<String> {
        let py = if self.python.is_empty() { "the engine's Python" } else { self.python.as_str() };
        if let Some(e) = &self.error {
            return vec![format!("could not inspect the engine's Python {py}: {e}")];
        }
        let mut out = Vec::new();
        if !self.tpar.installed {
            out.push(format!("tpar is not installed in {py}, so TPAR_ENABLE=1 does nothing there: {}", install_hint(py)));
        } else if !self.tpar.importable {
            out.push(format!("tpar is installed in {py} but does not import: {}", self.tpar.error.as_deref().unwrap_or("?")));
        }
        if self.installed().next().is_none() {
            out.push(format!("neither vLLM nor SGLang is installed in {py} (give --python PATH for the engine's interpreter)"));
        }
        for e in self.installed() {
            let v = e.version.as_deref().unwrap_or("?");
            if !e.pinned.is_empty() && !e.pins(v) {
                out.push(format!("{} {v} is not a version tpar's contract test checks ({}): the drop-in may not fit it", e.name, e.pinned.join(", ")));
            }
            if self.tpar.installed && !e.plugin_registered {
                out.push(format!("{}: tpar's entry point in {} is missing: reinstall tpar in {py}", e.name, e.plugin_group));
            }
        }
        for f in self.findings.iter().filter(|f| f.applies != "no" && f.severity != "note") {
            let when = if f.applies == "unknown" { format!(" ({})", f.why_applies) } else { String::new() };
            out.push(format!("{}: {} = {}: {}{when}", f.engine, f.setting, f.now, f.effect));
        }
        out
    }
}

/// How to install tpar into `python`.
pub fn install_hint(python: &str) -> String {
    format!("`{python} -m pip install /path/to/tpar` (the repository: needs Rust), or a wheel built with `maturin build --release`")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::{rules, EngineContext};

    #[test]
    fn an_answer_from_another_release_still_parses_and_garbage_is_a_line() {
        let ctx = EngineContext { tp: 8, archs: vec!["sm_90".into()] };
        let e = rules::judge_answer("py", r#"{"python": "/usr/bin/python3", "tpar": {"installed": false}, "future_field": 1}"#, "all", &ctx);
        assert_eq!(e.python, "/usr/bin/python3");
        assert!(e.problems().iter().any(|p| p.contains("tpar is not installed") && p.contains("pip install")), "{:?}", e.problems());
        let bad = rules::judge_answer("py", "Traceback (most recent call last):", "all", &ctx);
        assert!(bad.error.is_some() && bad.problems()[0].contains("could not inspect"), "{bad:?}");
    }

    #[test]
    fn an_unpinned_version_and_a_missing_entry_point_are_problems() {
        let e = EngineSection {
            python: "py".into(),
            tpar: TparInstall { installed: true, importable: true, ..TparInstall::default() },
            engines: vec![Engine { name: "vLLM".into(), version: Some("0.99.0".into()), pinned: vec!["0.33.0".into()], plugin_group: "vllm.general_plugins".into(), ..Engine::default() }],
            ..EngineSection::default()
        };
        let p = e.problems();
        assert!(p.iter().any(|l| l.contains("0.99.0") && l.contains("0.33.0")), "{p:?}");
        assert!(p.iter().any(|l| l.contains("entry point")), "{p:?}");
    }
}
