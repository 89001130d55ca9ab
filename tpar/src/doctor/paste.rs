//! The lines to paste at the end of `tpar doctor`'s report: they follow from the whole
//! [`Report`] (the engine's findings and the libraries found only by searching), so they are
//! computed here, above both the engine schema (`engine.rs`) and the library checks
//! (`libs.rs`). Owns: [`PasteLine`] and [`paste_lines`].

use super::libs::LibStatus;
use super::Report;
use serde::{Deserialize, Serialize};

/// A line to paste, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PasteLine {
    /// `env` (a shell line) or `flag` (for the server's command line).
    pub kind: String,
    pub line: String,
    pub why: String,
}

/// The lines to paste: `TPAR_ENABLE=1`, what undoes each engine setting that pre-empts or
/// blocks tpar (where it applies or may apply), and the library settings where a library was
/// found only by searching.
pub fn paste_lines(r: &Report) -> Vec<PasteLine> {
    let env = |line: String, why: String| PasteLine { kind: "env".into(), line, why };
    let mut out = vec![env("export TPAR_ENABLE=1".into(), "switches tpar's plug-ins on (vLLM and SGLang load them in every process they start)".into())];
    if let Some(e) = &r.engine {
        for f in e.findings.iter().filter(|f| f.applies != "no") {
            let Some(fix) = &f.fix else { continue };
            let when = if f.applies == "unknown" { format!(" ({})", f.why_applies) } else { String::new() };
            out.push(PasteLine { kind: f.fix_kind.clone().unwrap_or_else(|| "env".into()), line: fix.clone(), why: format!("{}: {}{when}", f.engine, f.effect) });
        }
    }
    for l in r.libraries.iter().filter(|l| l.status == LibStatus::FoundBySearch) {
        let Some(path) = &l.path else { continue };
        match &l.variable {
            Some(var) => out.push(env(format!("export {var}={path}"), format!("{} was found only by searching ({})", l.file, l.detail))),
            None => {
                if let Some(dir) = l.dir() {
                    out.push(env(format!("export LD_LIBRARY_PATH={dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"), format!("{} was found only by searching", l.file)));
                }
            }
        }
    }
    out
}
