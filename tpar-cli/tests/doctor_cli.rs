//! `tpar doctor` end to end, on whatever machine runs the tests (CI: no GPU, no NVML, no CUDA
//! library): it reports what it cannot see and exits 0, names a malformed setting and the
//! libraries it could not find, judges an engine's settings from the engine Python's installed
//! distributions, its lines to paste parse back through tpar's own settings, and
//! docs/doctor.md shows what it prints.

mod common;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Variables that change what the engine's Python reports (removed, with every `TPAR_*`
/// variable and every engine variable the doctor's rules read, `tpar::doctor::rules::VARIABLES`,
/// so the caller's shell cannot change what the tests see).
const PYTHON_VARS: [&str; 2] = ["PYTHONPATH", "PYTHONHOME"];

/// Every variable the tests clear.
fn cleared() -> impl Iterator<Item = &'static str> {
    tpar::settings::VARS.iter().map(|v| v.name).chain(tpar::doctor::rules::VARIABLES).chain(PYTHON_VARS)
}

fn doctor_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpar"));
    c.arg("doctor").args(args);
    for v in cleared() {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let out = doctor_cmd(args, env).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "tpar doctor {args:?} failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    (out, text)
}

fn json(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&doctor(&a, env).1).unwrap()
}

/// The section of the text report under `== title`.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text.find(&format!("== {title}")).unwrap_or_else(|| panic!("no section {title}:\n{text}"));
    let rest = &text[start + 3..];
    &rest[..rest.find("\n== ").unwrap_or(rest.len())]
}

fn python() -> Option<String> {
    let ok = Command::new("python3").arg("-c").arg("import importlib.metadata").output().is_ok_and(|o| o.status.success());
    ok.then(|| "python3".to_string())
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpar-doctor-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn without_a_gpu_it_says_what_it_cannot_see_and_exits_0() {
    let (_, text) = doctor(&["--no-python"], &[]);
    let fabric = section(&text, "Fabric");
    if !fabric.contains("NO GPU") {
        // A GPU machine: the other tests cover it.
        common::skip("doctor_cli::without_a_gpu_it_says_what_it_cannot_see_and_exits_0", "this machine has a GPU");
        return;
    }
    assert!(fabric.contains("no GPU topology") && fabric.contains("--topology PRESET"), "{fabric}");
    let classes = section(&text, "Size classes");
    assert!(classes.contains("no GPU: nothing to plan for"), "{classes}");
    let est = section(&text, "Verify-step estimate");
    assert!(est.contains("no GPU here, so") && est.contains("122 all-reduces per step") && est.contains("as measured"), "{est}");
    assert!(section(&text, "Engine").contains("not inspected"), "{text}");
    assert!(section(&text, "Problems").contains("- no GPU visible"), "{text}");
}

#[test]
fn a_malformed_setting_is_reported_and_the_report_still_comes() {
    let (_, text) = doctor(&["--no-python", "--topology", "pcie-2"], &[("TPAR_TIMEOUT_MS", "soon")]);
    assert!(section(&text, "Settings").contains("TPAR_TIMEOUT_MS=soon") && text.contains("MALFORMED: "), "{text}");
    let problems = section(&text, "Problems");
    assert!(problems.contains("malformed") && problems.contains("TPAR_TIMEOUT_MS"), "{problems}");
    assert!(section(&text, "Size classes").contains("1 token eager:"), "the rest of the report is there: {text}");
}

#[test]
fn libraries_it_cannot_load_are_named() {
    let v = json(&["--no-python", "--topology", "cpu"], &[("TPAR_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"), ("TPAR_NCCL_LIB", "/nonexistent/libnccl.so.2")]);
    let libs = v["libraries"].as_array().unwrap();
    assert_eq!(libs.len(), 3, "{libs:?}");
    let problems: Vec<&str> = v["problems"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for (name, file) in [("NVRTC", "libnvrtc.so.13"), ("NCCL", "libnccl.so.2")] {
        let lib = libs.iter().find(|l| l["name"] == name).unwrap();
        if lib["status"] == "not-checked" {
            continue; // built without the `cuda` feature
        }
        // The setting names a missing file, so tpar cannot load it that way: missing, or
        // found only by searching (a CUDA machine), never "found".
        assert!(lib["status"] == "missing" || lib["status"] == "found-by-search", "{lib}");
        assert!(problems.iter().any(|p| p.contains(file)), "{file} not in {problems:?}");
    }
}

/// Writes an installed distribution's metadata (what `importlib.metadata` reads; the doctor
/// reads nothing else of an engine: vLLM's real wheel is 336 MB and imports CUDA).
fn dist(site: &Path, name: &str, version: &str) {
    let d = site.join(format!("{}-{version}.dist-info", name.replace('-', "_")));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("METADATA"), format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")).unwrap();
}

#[test]
fn vllm_settings_that_pre_empt_tpar_on_hopper_are_named_with_their_fix() {
    let Some(py) = python() else {
        return common::skip("doctor_cli::vllm_settings_that_pre_empt_tpar_on_hopper_are_named_with_their_fix", "no python3 with importlib.metadata on PATH");
    };
    let site = temp("site");
    dist(&site, "vllm", "0.33.0");
    dist(&site, "flashinfer-python", "0.6.1");
    let pp = site.to_str().unwrap();
    let args = ["--python", py.as_str(), "--topology", "h200-nvswitch-8", "--engine", "vllm"];
    let v = json(&args, &[("PYTHONPATH", pp), ("VLLM_PLUGINS", "lora")]);
    assert!(v["engine"]["error"].is_null(), "{}", v["engine"]);
    assert_eq!(v["engine"]["engines"][0]["version"], "0.33.0");
    let f = v["engine"]["findings"].as_array().unwrap();
    let by = |s: &str| f.iter().find(|x| x["setting"].as_str().is_some_and(|n| n.contains(s))).unwrap_or_else(|| panic!("no {s} in {f:?}"));
    assert_eq!(by("VLLM_ALLREDUCE_USE_FLASHINFER")["applies"], "yes", "sm_90 at TP 8");
    assert_eq!(by("fuse_allreduce_rms")["applies"], "yes");
    // tpar's plug-in runs its own fusion pass before vLLM's: a note, never advice to switch it off.
    assert_eq!(by("fuse_allreduce_rms")["severity"], "note");
    assert_eq!(by("VLLM_PLUGINS")["applies"], "yes");
    let paste: Vec<&str> = v["paste"].as_array().unwrap().iter().filter_map(|p| p["line"].as_str()).collect();
    for want in ["export TPAR_ENABLE=1", "export VLLM_ALLREDUCE_USE_FLASHINFER=0", "export VLLM_PLUGINS=lora,tpar"] {
        assert!(paste.contains(&want), "{want} not in {paste:?}");
    }
    assert!(!paste.iter().any(|l| l.contains("fuse_allreduce_rms")), "{paste:?}");
    let problems = v["problems"].to_string();
    assert!(problems.contains("tpar is not installed") && problems.contains("VLLM_ALLREDUCE_USE_FLASHINFER"), "{problems}");
    // Switched off already: no line for it, and not a problem.
    let v = json(&args, &[("PYTHONPATH", pp), ("VLLM_ALLREDUCE_USE_FLASHINFER", "0")]);
    let paste = v["paste"].to_string();
    assert!(!paste.contains("VLLM_ALLREDUCE_USE_FLASHINFER=0") && !paste.contains("VLLM_PLUGINS"), "{paste}");
    // On sm_120 neither FlashInfer path runs.
    let v = json(&["--python", py.as_str(), "--topology", "rtxpro6000-pcie-switch-8", "--engine", "vllm"], &[("PYTHONPATH", pp)]);
    let paste = v["paste"].to_string();
    assert!(!paste.contains("VLLM_ALLREDUCE_USE_FLASHINFER") && !paste.contains("fuse_allreduce_rms"), "{paste}");
    let text = doctor(&args, &[("PYTHONPATH", pp)]).1;
    let engine = section(&text, "Engine");
    assert!(engine.contains("vLLM 0.33.0") && engine.contains("[pre-empts] vLLM VLLM_ALLREDUCE_USE_FLASHINFER = unset (default 1): applies here"), "{engine}");
    std::fs::remove_dir_all(&site).ok();
}

#[test]
fn a_python_that_cannot_run_is_a_line_not_a_failure() {
    let (_, text) = doctor(&["--topology", "pcie-2", "--python", "/nonexistent/python3"], &[]);
    assert!(section(&text, "Engine").contains("could not inspect it: cannot run it"), "{text}");
    assert!(section(&text, "Problems").contains("could not inspect the engine's Python /nonexistent/python3"), "{text}");
}

#[test]
fn the_paste_lines_parse_back_through_tpars_settings() {
    let Some(py) = python() else {
        return common::skip("doctor_cli::the_paste_lines_parse_back_through_tpars_settings", "no python3 with importlib.metadata on PATH");
    };
    let site = temp("paste");
    dist(&site, "sglang", "0.5.23");
    let pp = site.to_str().unwrap();
    let v = json(&["--python", py.as_str(), "--topology", "h200-nvswitch-8", "--engine", "sglang"], &[("PYTHONPATH", pp), ("SGLANG_PLUGINS", "other")]);
    let lines: Vec<String> = v["paste"].as_array().unwrap().iter().filter(|p| p["kind"] == "env").map(|p| p["line"].as_str().unwrap().to_string()).collect();
    assert!(lines.iter().any(|l| l == "export SGLANG_PLUGINS=other,tpar"), "{lines:?}");
    for l in &lines {
        let (name, _) = l.strip_prefix("export ").and_then(|r| r.split_once('=')).unwrap_or_else(|| panic!("not an export line: {l}"));
        assert!(name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'), "{l}");
    }
    // The lines, pasted into a shell, give an environment tpar's settings accept with tpar on.
    let script = format!("set -e\n{}\nexec \"$0\" doctor --no-python --topology cpu --json", lines.join("\n"));
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(&script).arg(env!("CARGO_BIN_EXE_tpar"));
    for v in cleared() {
        sh.env_remove(v);
    }
    let out = sh.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let back: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back["settings"]["enable"], true, "{}", back["settings"]);
    assert!(back["settings"]["error"].is_null(), "{}", back["settings"]);
    std::fs::remove_dir_all(&site).ok();
}

#[test]
fn help_says_what_it_prints_and_that_it_runs_anywhere() {
    let out = Command::new(env!("CARGO_BIN_EXE_tpar")).args(["doctor", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for want in ["--engine <ENGINE>", "--tp <TP>", "--json", "--python <PATH>", "--topology <NAME|FILE>", "exits 0", "pre-empt"] {
        assert!(help.contains(want), "{want} not in:\n{help}");
    }
}

/// Every fenced block of docs/doctor.md whose first line is `$ tpar doctor ...` is run and each
/// other line of the block must appear in its output, in order (`...` stands for lines left
/// out). A block of this machine (no `--topology`) shows one without a GPU: skipped on a GPU
/// machine.
#[test]
fn docs_doctor_md_shows_what_doctor_prints() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/doctor.md")).unwrap();
    let mut lines = text.lines();
    let mut checked = 0;
    while let Some(line) = lines.next() {
        if !line.trim_start().starts_with("```") {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim_start() != "```").collect();
        let Some(cmd) = block.first().and_then(|l| l.strip_prefix("$ tpar doctor")) else { continue };
        let args: Vec<&str> = cmd.split_whitespace().collect();
        let (_, stdout) = doctor(&args, &[]);
        if !args.contains(&"--topology") && !stdout.contains("NO GPU") {
            // The block shows a machine without a GPU; this one has GPUs.
            common::skip("doctor_cli::docs_doctor_md_shows_what_doctor_prints", &format!("block `$ tpar doctor{cmd}` not checked: it shows a machine without a GPU, this one has GPUs"));
            continue;
        }
        let mut have = stdout.lines().map(str::trim_end);
        for want in block[1..].iter().map(|l| l.trim_end()).filter(|l| *l != "...") {
            assert!(have.by_ref().any(|h| h == want), "docs/doctor.md: `tpar doctor{cmd}` no longer prints (in this order):\n  {want}\nit prints:\n{stdout}");
        }
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} command blocks in docs/doctor.md");
}
