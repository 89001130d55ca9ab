//! `tpar sim` and `tpar model` end to end: the binary runs, writes what it promises, and
//! fails with a message (not a panic) on bad input.

mod common;
use std::process::Command;

fn tpar(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpar")).args(args).output().unwrap()
}

/// A refusal, not a crash: tpar's exit status `code` (2: refused before anything ran, 1: the
/// run failed; a panic exits 101, a signal has no code), one `tpar: error:` line holding every
/// `expected` part, and no panic text.
fn assert_refused(out: &std::process::Output, code: i32, expected: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "exit status {:?}: {err}", out.status);
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "a panic: {err}");
    let line = err.lines().find(|l| l.starts_with("tpar: error:")).unwrap_or_else(|| panic!("no `tpar: error:` line: {err}"));
    for e in expected {
        assert!(line.contains(e), "expected {e:?} in: {line}");
    }
}

#[test]
fn sim_writes_json_records_and_an_svg() {
    let dir = std::env::temp_dir().join(format!("tpar-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("p.json");
    let svg = dir.join("p.svg");
    let out = tpar(&[
        "sim",
        "--topology",
        "rtxpro6000-dualsocket-8",
        "--bytes",
        "14K,42K",
        "--algo",
        "oneshot-push,nccl",
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("42 KiB") && text.contains("sim pick") && text.contains("tpar plan"),
        "{text}"
    );
    let recs: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(recs.len(), 4);
    for r in &recs {
        for k in ["topology", "algorithm", "world", "bytes", "predicted_us"] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        assert!(r["predicted_us"].as_f64().unwrap() > 0.0);
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("rtxpro6000-dualsocket-8"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sim_refuses_unknown_topology_and_too_many_ranks() {
    let out = tpar(&["sim", "--topology", "no-such-box"]);
    assert_refused(&out, 1, &["\"no-such-box\" is neither a preset", "pcie-2", "nor an existing file"]);
    let out = tpar(&["sim", "--topology", "pcie-2", "--world", "4"]);
    assert_refused(&out, 2, &["`world`", "4 ranks on pcie-2 (2 GPUs)"]);
}

#[test]
fn model_reproduces_the_reference_case() {
    let out = tpar(&[
        "model",
        "--compute-ms",
        "2.5",
        "--nccl-us",
        "14K=71,42K=225",
        "--draft-ms",
        "3",
        "--acceptance",
        "1.8",
        "--plan-us",
        "10",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("89.6") && text.contains("54.6") && text.contains("2.95 tokens"),
        "{text}"
    );
    // A baseline that its own all-reduces cannot fit is an error.
    let out = tpar(&["model", "--baseline-tok-s", "89.5", "--nccl-us", "225"]);
    assert_refused(&out, 1, &["`baseline_tok_s`", "the figures contradict each other"]);
}

/// docs/sim.md shows the calibration table; it must be the one the code computes.
#[test]
fn docs_sim_md_table_matches_the_code() {
    let out = tpar(&["sim", "--calibration"]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sim.md")).unwrap();
    assert!(
        doc.contains(table.trim()),
        "docs/sim.md is out of date: paste the output of `tpar sim --calibration` into it"
    );
}

/// Without GPUs, --measure refuses with the way out instead of modelling CPU ranks as a GPU box.
#[test]
fn model_measure_needs_gpus() {
    let gpus = tpar::Topology::discover().gpu_count();
    if gpus >= 2 {
        common::skip("sim_model_cli::model_measure_needs_gpus", &format!("this machine has {gpus} GPUs; the refusal is for machines without"));
        return;
    }
    let out = tpar(&["model", "--measure", "--tp", "2"]);
    assert_refused(&out, 2, &["--measure needs 2 or more GPUs", "--nccl-us"]);
}

/// Every fenced block in docs/model.md, docs/plan.md and docs/sim.md whose first line is
/// `$ tpar ...` is a command and what it prints: the test runs the command and checks each
/// other line of the block appears in its output, in order (a line `...` stands for lines
/// left out). A drift on either side, the code's or the doc's, fails.
#[test]
fn docs_command_blocks_print_what_the_docs_show() {
    let mut checked = 0usize;
    for doc in ["model.md", "plan.md", "sim.md"] {
        let path = format!("{}/../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim_start() != "```" {
                continue;
            }
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim_start() != "```").collect();
            let Some(cmd) = block.first().and_then(|l| l.strip_prefix("$ tpar ")) else { continue };
            let args: Vec<&str> = cmd.split_whitespace().collect();
            let out = Command::new(env!("CARGO_BIN_EXE_tpar"))
                .args(&args)
                .env_remove("TPAR_PROFILE")
                .env_remove("TPAR_ALGO")
                .env_remove("TPAR_TRANSPORT")
                .env_remove("TPAR_DISABLE")
                .env_remove("TPAR_MAX_BYTES")
                .output()
                .unwrap();
            assert!(out.status.success(), "docs/{doc}: `tpar {cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            let mut have = stdout.lines().map(str::trim_end);
            for want in block[1..].iter().map(|l| l.trim_end()).filter(|l| *l != "...") {
                assert!(
                    have.by_ref().any(|h| h == want),
                    "docs/{doc}: `tpar {cmd}` no longer prints (in this order):\n  {want}\nit prints:\n{stdout}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} command blocks found");
}

/// docs/model.md's prose states the worked case's headline figures in bold (a ratio `2.33x`,
/// a change `-39%`, a break-even `2.95 tokens`); each must be what `tpar model` prints now.
#[test]
fn docs_model_md_headline_figures_are_the_default_output() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/model.md")).unwrap();
    let out = tpar(&["model"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut checked = 0;
    for span in doc.split("**").skip(1).step_by(2) {
        for word in span.split_whitespace() {
            let w = word.trim_matches(|c: char| c == ',' || c == '.' || c == ')' || c == '(');
            let number = w.trim_start_matches('-').trim_end_matches(['x', '%']);
            let figure = (w.ends_with('x') || w.ends_with('%')) && number.contains('.') || w.ends_with('%');
            if figure && number.parse::<f64>().is_ok() {
                assert!(text.contains(w), "docs/model.md states **{span}**, but `tpar model` prints no {w}:\n{text}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} headline figures found");
}
