//! `tpar sim` and `tpar model` end to end: the binary runs, writes what it promises, and
//! fails with a message (not a panic) on bad input.

use std::process::Command;

fn tpar(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpar")).args(args).output().unwrap()
}

/// A refusal, not a crash: exit status 1 (tpar's error exit; a panic exits 101, a signal
/// has no code), one `tpar: error:` line holding every `expected` part, and no panic text.
fn assert_refused(out: &std::process::Output, expected: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status {:?}: {err}", out.status);
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
    assert_refused(&out, &["\"no-such-box\" is neither a preset", "pcie-2", "nor an existing file"]);
    let out = tpar(&["sim", "--topology", "pcie-2", "--world", "4"]);
    assert_refused(&out, &["`world`", "4 ranks on pcie-2 (2 GPUs)"]);
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
    assert_refused(&out, &["`baseline_tok_s`", "the figures contradict each other"]);
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
        eprintln!("skipped: this machine has {gpus} GPUs; the refusal is for machines without");
        return;
    }
    let out = tpar(&["model", "--measure", "--tp", "2"]);
    assert_refused(&out, &["--measure needs 2 or more GPUs", "--nccl-us"]);
}
