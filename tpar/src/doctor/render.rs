//! The text of `tpar doctor`'s report: settings, the fabric (`topology::render`, the one
//! rendering `tpar topo` prints too), the size classes with their reasons and sources, the
//! verify-step estimate, libraries and the kernel cache, the engine, the lines to paste, and
//! the problems. Owns the layout only: every fact is in [`Report`].

use super::libs::LibStatus;
use super::{Report, SizeClass};
use crate::kinds::{Algorithm, CaptureMode};
use crate::plan::Plan;
use crate::units::human_bytes;
use std::fmt::Write;

fn heading(out: &mut String, title: &str) {
    let _ = write!(out, "\n== {title} ==\n");
}

/// The whole report.
pub fn text(r: &Report) -> String {
    let mut out = format!("tpar doctor {}: what tpar sees here, and what it would do inside an engine\n", r.version);
    settings(&mut out, r);
    fabric(&mut out, r);
    size_classes(&mut out, r);
    gather_scatter(&mut out, r);
    estimate(&mut out, r);
    libraries(&mut out, r);
    engine(&mut out, r);
    paste(&mut out, r);
    heading(&mut out, "Problems");
    if r.problems.is_empty() {
        out.push_str("none found\n");
    }
    for p in &r.problems {
        let _ = writeln!(out, "- {p}");
    }
    out
}

fn settings(out: &mut String, r: &Report) {
    heading(out, "Settings (TPAR_* in this shell)");
    if r.settings.set.is_empty() {
        out.push_str("none set: every default applies (`tpar settings` lists them)\n");
    }
    for (k, v) in &r.settings.set {
        let _ = writeln!(out, "{k}={v}");
    }
    if let Some(e) = &r.settings.error {
        let _ = writeln!(out, "MALFORMED: {e}");
    }
}

fn fabric(out: &mut String, r: &Report) {
    let m = &r.machine;
    heading(out, "Fabric");
    let _ = writeln!(out, "source: {}", m.source);
    if let Some(why) = &m.no_gpu {
        let _ = writeln!(out, "NO GPU: {why}");
    } else {
        let mut archs: Vec<String> = Vec::new();
        for a in &m.archs {
            if !archs.contains(a) {
                archs.push(a.clone());
            }
        }
        let _ = writeln!(out, "architecture: {} ({})", archs.join(", "), m.arch_source);
    }
    let _ = writeln!(out, "link probe: {}", m.probe);
    out.push('\n');
    // NVML's error is in the NO GPU line above: the topology's copy of it is not repeated.
    let mut shown = m.topology.clone();
    if m.no_gpu.is_some() {
        shown.notes.retain(|n| !n.starts_with("no GPU topology"));
    }
    out.push_str(&crate::topology::render::text(&shown));
}

fn us(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

fn src(v: Option<crate::sim::Source>) -> String {
    v.map(|s| s.name().to_string()).unwrap_or_else(|| "-".into())
}

fn row(out: &mut String, c: &SizeClass, mode: CaptureMode, p: &Plan) {
    let gain = p.gain().map(|g| format!("{g:.2}x")).unwrap_or_else(|| "-".into());
    let pick = if p.instead_of.is_some() { format!("{}*", p.algorithm) } else { p.algorithm.to_string() };
    let line = format!(
        "{:>6}  {:<9} {:<6} {:<15}{:>8}{:>9}{:>7}  {:<10} {}",
        c.tokens,
        human_bytes(c.bytes),
        mode.name(),
        pick,
        us(p.predicted_us),
        us(p.nccl_us),
        gain,
        src(p.source),
        src(p.nccl_source)
    );
    out.push_str(line.trim_end());
    out.push('\n');
}

fn size_classes(out: &mut String, r: &Report) {
    let tp = if r.tp == 0 { "no TP (no GPU)".to_string() } else { format!("TP {}", r.tp) };
    heading(out, &format!("Size classes: {tp}, hidden {}, {} (tokens x {} x {} bytes)", r.hidden, r.dtype, r.hidden, r.dtype.size()));
    for l in &r.profile.lines {
        let _ = writeln!(out, "tuned profile: {l}");
    }
    if let Some(n) = &r.size_classes_note {
        let _ = writeln!(out, "{n}");
        return;
    }
    let _ = writeln!(out, "{:>6}  {:<9} {:<6} {:<15}{:>8}{:>9}{:>7}  {:<10} nccl from", "tokens", "bytes", "mode", "pick", "us", "nccl us", "gain", "pick from");
    for c in &r.size_classes {
        row(out, c, CaptureMode::Eager, &c.eager);
        row(out, c, CaptureMode::Graph, &c.graph);
    }
    let kernels = |f: fn(&SizeClass) -> &Plan| r.size_classes.iter().filter(|c| f(c).algorithm != Algorithm::Nccl).count();
    let _ = writeln!(
        out,
        "tpar's kernels take {} of {} size classes eager and {} in CUDA graphs; the rest go to the engine's NCCL",
        kernels(|c| &c.eager),
        r.size_classes.len(),
        kernels(|c| &c.graph)
    );
    out.push_str("# us: the pick's predicted time per call; gain: NCCL's over it; from: the least trusted figure each rests on (profile, probe, published, assumed); nccl*: NCCL instead of a tpar kernel resting on unmeasured figures\n");
    out.push_str("why:\n");
    for c in &r.size_classes {
        for (mode, p) in [(CaptureMode::Eager, &c.eager), (CaptureMode::Graph, &c.graph)] {
            let _ = writeln!(out, "  {} token{} {}: {} over {}: {}", c.tokens, if c.tokens == 1 { "" } else { "s" }, mode.name(), p.algorithm, p.transport, p.reason);
        }
    }
}

fn gather_scatter(out: &mut String, r: &Report) {
    if r.gather_scatter.is_empty() {
        return;
    }
    heading(out, &format!("Sequence-parallel all-gather and reduce-scatter (vLLM's sp_all_gather / sp_reduce_scatter): TP {}, CUDA graphs, tokens per rank x {} x {} bytes", r.tp, r.hidden, r.dtype.size()));
    let _ = writeln!(out, "{:>6}  {:<9} {:<15}{:>8}{:>9}  {:<15}{:>8}{:>9}", "tokens", "per rank", "all-gather", "us", "nccl us", "reduce-scatter", "us", "nccl us");
    for c in &r.gather_scatter {
        let (g, s) = (&c.all_gather, &c.reduce_scatter);
        let line = format!(
            "{:>6}  {:<9} {:<15}{:>8}{:>9}  {:<15}{:>8}{:>9}",
            c.tokens,
            human_bytes(c.bytes),
            g.algorithm.to_string(),
            us(g.predicted_us),
            us(g.nccl_us),
            s.algorithm.to_string(),
            us(s.predicted_us),
            us(s.nccl_us)
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(c) = r.gather_scatter.first() {
        let _ = writeln!(out, "why ({} token per rank): all-gather: {}; reduce-scatter: {}", c.tokens, c.all_gather.reason, c.reduce_scatter.reason);
    }
}

fn estimate(out: &mut String, r: &Report) {
    let e = &r.estimate;
    heading(out, "Verify-step estimate (tpar model)");
    if let Some(why) = &e.unavailable {
        let _ = writeln!(out, "{why}");
        return;
    }
    let _ = writeln!(out, "case: {}", e.case);
    let _ = writeln!(out, "{:<7} {:>6} {:<6} {:>9} {:>9} {:>9} {:>7} {:>14} {:>14}", "step", "tokens", "mode", "AR bytes", "nccl us", "tpar us", "x nccl", "AR/step nccl", "AR/step tpar");
    for row in &e.rows {
        let a = e.ars_per_step as f64;
        let _ = writeln!(
            out,
            "{:<7} {:>6} {:<6} {:>9} {:>9.1} {:>9.1} {:>6.2}x {:>11.2} ms {:>11.2} ms",
            row.step,
            row.tokens,
            row.mode.name(),
            human_bytes(row.bytes as u64),
            row.nccl_us,
            row.tpar_us,
            row.nccl_us / row.tpar_us,
            a * row.nccl_us / 1e3,
            a * row.tpar_us / 1e3
        );
    }
    let _ = writeln!(out, "({} all-reduces per step)", e.ars_per_step);
    for l in &e.throughput {
        let _ = writeln!(out, "{l}");
    }
    out.push_str("sources:\n");
    for s in &e.sources {
        let _ = writeln!(out, "  {s}");
    }
    for row in &e.rows {
        let _ = writeln!(out, "  {} {}: nccl: {}; tpar: {}", row.step, row.mode.name(), row.nccl_from, row.tpar_from);
    }
}

fn libraries(out: &mut String, r: &Report) {
    heading(out, "Run-time libraries and the kernel cache");
    for l in &r.libraries {
        let status = match l.status {
            LibStatus::Found => "found",
            LibStatus::FoundBySearch => "FOUND ONLY BY SEARCHING",
            LibStatus::Missing => "MISSING",
            LibStatus::NotChecked => "not checked",
        };
        let at = l.path.as_deref().map(|p| format!(" at {p}")).unwrap_or_default();
        let v = l.version.as_deref().map(|v| format!(", version {v}")).unwrap_or_default();
        let var = l.variable.as_deref().map(|v| format!(" (setting: {v})")).unwrap_or_default();
        let _ = writeln!(out, "{:<14} {:<15} {status}{at}{v}: {}", l.name, l.file, l.detail);
        if !l.needed_for.is_empty() {
            let _ = writeln!(out, "{:<30} needed for {}{var}", "", l.needed_for);
        }
    }
    let c = &r.cache;
    let _ = writeln!(out, "{:<14} {:<15} {}{}", "kernel cache", "TPAR_CACHE_DIR", c.dir.as_deref().map(|d| format!("{d}: ")).unwrap_or_default(), c.detail);
}

fn engine(out: &mut String, r: &Report) {
    let Some(e) = &r.engine else {
        heading(out, "Engine");
        out.push_str("not inspected\n");
        return;
    };
    let py = if e.python_version.is_empty() { e.python.clone() } else { format!("{}, Python {}", e.python, e.python_version) };
    heading(out, &format!("Engine ({py})"));
    if let Some(err) = &e.error {
        let _ = writeln!(out, "could not inspect it: {err}");
        return;
    }
    let t = &e.tpar;
    if t.installed {
        let at = t.location.as_deref().map(|l| format!(" in {l}")).unwrap_or_default();
        let imp = if t.importable { String::new() } else { format!("; does not import: {}", t.error.as_deref().unwrap_or("?")) };
        let _ = writeln!(out, "tpar {}{at}{imp}", t.version.as_deref().unwrap_or("?"));
        for p in &t.plugins {
            let _ = writeln!(out, "  plug-in {} {} -> {}", p.group, p.name, p.value);
        }
    } else {
        let _ = writeln!(out, "tpar: NOT INSTALLED here: {}", super::engine::install_hint(&e.python));
    }
    for g in &e.engines {
        match &g.version {
            None => {
                let _ = writeln!(out, "{}: not installed ({})", g.name, g.distribution);
            }
            Some(v) => {
                let pin = if g.pinned.is_empty() {
                    "the pinned versions are unknown (tpar is not importable here)".to_string()
                } else if g.pins(v) {
                    format!("a version tpar's contract test checks ({})", g.pinned.join(", "))
                } else {
                    format!("NOT a version tpar's contract test checks ({})", g.pinned.join(", "))
                };
                let plug = match (g.plugin_registered, g.plugin_allowed) {
                    (true, true) => "tpar's plug-in is registered and allowed",
                    (true, false) => "tpar's plug-in is registered but the allow-list omits it",
                    (false, _) => "tpar's plug-in is not registered",
                };
                let _ = writeln!(out, "{} {v}: {pin}; {plug} ({})", g.name, g.plugin_group);
            }
        }
    }
    if !e.findings.is_empty() {
        out.push_str("settings that decide whether tpar is reached (read from the engines' own source):\n");
    }
    for f in &e.findings {
        let applies = match f.applies.as_str() {
            "yes" => "applies here".to_string(),
            "no" => format!("does not apply here ({})", f.why_applies),
            _ => format!("may apply ({})", f.why_applies),
        };
        let _ = writeln!(out, "  [{}] {} {} = {}: {applies}", f.severity, f.engine, f.setting, f.now);
        let _ = writeln!(out, "      {} ({})", f.effect, f.source);
    }
    for n in &e.notes {
        let _ = writeln!(out, "note: {n}");
    }
    if !r.settings.enable {
        out.push_str("note: TPAR_ENABLE is not set in this shell: the engines run without tpar\n");
    }
    let installed: Vec<String> = e.installed().map(|g| format!("{} {}", g.name, g.version.as_deref().unwrap_or("?"))).collect();
    if !installed.is_empty() && t.installed && t.importable {
        let kernels = r.size_classes.iter().filter(|c| c.graph.algorithm != Algorithm::Nccl || c.eager.algorithm != Algorithm::Nccl).count();
        let _ = writeln!(
            out,
            "with TPAR_ENABLE=1: {} would build tpar's class for each tensor-parallel group; tpar takes the calls its plan gives a kernel ({kernels} of the {} size classes above), the engine's NCCL the rest, unless a setting above takes them first",
            installed.join(" and "),
            r.size_classes.len()
        );
    }
}

fn paste(out: &mut String, r: &Report) {
    heading(out, "Paste (the shell that starts the server)");
    for p in r.paste.iter().filter(|p| p.kind == "env") {
        let _ = writeln!(out, "# {}", p.why);
        let _ = writeln!(out, "{}", p.line);
    }
    let flags: Vec<_> = r.paste.iter().filter(|p| p.kind == "flag").collect();
    if !flags.is_empty() {
        out.push_str("# and on the server's command line:\n");
        for p in flags {
            let _ = writeln!(out, "#   {}    ({})", p.line, p.why);
        }
    }
    out.push_str("# keep the engine's custom all-reduce on (no --disable-custom-all-reduce): tpar is reached through it\n");
}
