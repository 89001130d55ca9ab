//! Golden outputs of `tpar plan --table` and checks of `tpar topo` / `tpar plan --json`.
//! `TPAR_BLESS=1 cargo test -p tpar-cli --test golden` rewrites the golden files; review
//! the diff, because a changed table is a changed default.

use std::path::PathBuf;
use std::process::Command;

fn tpar(args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpar"));
    cmd.args(args);
    // The table must not depend on the caller's settings.
    for (k, _) in std::env::vars() {
        if k.starts_with("TPAR_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var("TPAR_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}; run with TPAR_BLESS=1 to create it", path.display()));
    if expected != actual {
        let first = expected.lines().zip(actual.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{name} differs from golden at line {}:\n  expected: {:?}\n  actual:   {:?}\n(TPAR_BLESS=1 rewrites it)",
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}

#[test]
fn plan_table_rtxpro6000_pcie_switch_8() {
    let (ok, out, err) = tpar(&["plan", "--topology", "rtxpro6000-pcie-switch-8", "--table"]);
    assert!(ok, "{err}");
    golden("plan-table-rtxpro6000-pcie-switch-8.txt", &out);
}

#[test]
fn plan_table_rtxpro6000_dualsocket_8() {
    let (ok, out, err) = tpar(&["plan", "--topology", "rtxpro6000-dualsocket-8", "--table", "--graph"]);
    assert!(ok, "{err}");
    golden("plan-table-rtxpro6000-dualsocket-8-graph.txt", &out);
}

#[test]
fn plan_json_has_the_decision_and_its_numbers() {
    let (ok, out, err) = tpar(&["plan", "-t", "h200-nvswitch-8", "--world", "8", "--bytes", "42K", "-d", "bfloat16", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["algorithm", "blocks", "bound_us", "instead_of", "nccl_source", "nccl_us", "predicted_us", "reason", "source", "transport"]);
    assert_eq!(obj["algorithm"], "oneshot-push");
    assert_eq!(obj["transport"], "p2p");
    assert!(obj["reason"].as_str().unwrap().contains("42 KiB"));
    // NVLink: thresholds measured with tpar's kernels on H200s; times from the simulator.
    assert_eq!(obj["source"], "published");
    assert!(obj["predicted_us"].as_f64().unwrap() < obj["nccl_us"].as_f64().unwrap());
}

#[test]
fn plan_refuses_bad_input_with_a_message() {
    let (ok, _, err) = tpar(&["plan", "-t", "no-such-preset", "--world", "2", "--bytes", "1K"]);
    assert!(!ok && err.contains("neither a preset"), "{err}");
    let (ok, _, err) = tpar(&["plan", "-t", "pcie-2", "--world", "2", "--bytes", "12Q"]);
    assert!(!ok && err.contains("12Q"), "{err}");
    let (ok, _, err) = tpar(&["plan", "-t", "pcie-2", "--bytes", "1K"]);
    assert!(!ok && err.contains("--world"), "{err}");
}

#[test]
fn topo_prints_smi_style_matrices_and_json() {
    let (ok, out, err) = tpar(&["topo", "--topology", "rtx4090-nop2p-4"]);
    assert!(ok, "{err}");
    for needle in ["GPU0    X     NODE", "P2P write", "P2P read", "P2P atomics", "NS", "Islands", "Legend"] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    let (ok, out, _) = tpar(&["topo", "--topology", "l40s-direct-8", "--json"]);
    assert!(ok);
    let t = tpar::Topology::from_json(&out).unwrap();
    assert_eq!(t, tpar::topology::presets::l40s_direct_8());
    let (ok, out, _) = tpar(&["topo", "--topology", "cpu"]);
    assert!(ok && out.contains("No GPU found"), "{out}");
}

#[test]
fn plan_uses_a_matching_profile_and_ignores_another() {
    use tpar::plan::{Backend, CaptureMode};
    use tpar::profile::{Profile, ProfileFingerprint};
    use tpar::report::Record;
    let t = tpar::topology::presets::rtxpro6000_pcie_switch_8();
    let rec = |algorithm, bytes: usize, time_us| Record {
        collective: Default::default(),
        algorithm,
        backend: "cuda".into(),
        dtype: tpar::DType::BF16,
        world: 8,
        bytes,
        count: bytes / 2,
        time_us,
        p10_us: time_us,
        p90_us: time_us,
        algbw: 0.0,
        busbw: 0.0,
        wrong: 0,
    };
    let records = [rec(tpar::Algorithm::OneshotPull, 65536, 5.0), rec(tpar::Algorithm::OneshotPush, 65536, 6.0)];
    let p = Profile::from_measurements(&records, ProfileFingerprint::new(&t, None, Backend::Cuda, 8, CaptureMode::Graph));
    let path = std::env::temp_dir().join(format!("tpar-cli-profile-{}.toml", std::process::id()));
    p.save(&path).unwrap();
    let path_s = path.to_str().unwrap();
    let args = |world: &'static str, graph: bool| {
        let mut v = vec!["plan", "-t", "rtxpro6000-pcie-switch-8", "--world", world, "--bytes", "42K", "--json", "--profile", path_s];
        if graph {
            v.push("--graph");
        }
        v
    };
    let (ok, out, err) = tpar(&args("8", true));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["algorithm"], "oneshot-pull", "{out}");
    assert!(v["reason"].as_str().unwrap().starts_with("profile:"), "{out}");
    assert!(err.contains("oneshot-pull <= 64 KiB"), "{err}");
    // Measured in graph mode: an eager call ignores it, and says so.
    let (ok, out, err) = tpar(&args("8", false));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_ne!(v["algorithm"], "oneshot-pull", "pull only from a matching profile: {out}");
    assert!(v["reason"].as_str().unwrap().contains("profile ignored: tuned in graph mode, not eager"), "{out}");
    assert!(err.contains("warning: profile ignored"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// `tpar plan --collective all-gather --profile FILE`: a tuned all-gather table decides (both
/// measured figures in the reason) where the simulator would have picked otherwise.
#[test]
fn plan_takes_a_tuned_all_gather_table() {
    use tpar::kinds::Collective;
    use tpar::plan::{Backend, CaptureMode};
    use tpar::profile::{Profile, ProfileFingerprint};
    use tpar::report::Record;
    let t = tpar::topology::presets::rtxpro6000_pcie_switch_8();
    // 4 KiB a rank at 8 ranks: the records count every rank's part, as nccl-tests does.
    let rec = |a, us| Record::measured_for(Collective::AllGather, a, "cuda", tpar::DType::BF16, 8, 4096 / 2 * 8, (us, us, us), 0);
    let records = [rec(tpar::Algorithm::OneshotPush, 31.0), rec(tpar::Algorithm::Nccl, 11.5)];
    let p = Profile::from_measurements(&records, ProfileFingerprint::new(&t, None, Backend::Cuda, 8, CaptureMode::Graph));
    let path = std::env::temp_dir().join(format!("tpar-cli-ag-profile-{}.toml", std::process::id()));
    p.save(&path).unwrap();
    let args = |profile: bool| {
        let mut v = vec!["plan", "-t", "rtxpro6000-pcie-switch-8", "--world", "8", "--bytes", "4K", "--json", "--graph", "--collective", "all-gather"];
        if profile {
            v.extend(["--profile", path.to_str().unwrap()]);
        }
        v
    };
    let (ok, out, err) = tpar(&args(false));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["algorithm"], "oneshot-push", "the simulator's pick: {out}");
    let (ok, out, err) = tpar(&args(true));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["algorithm"], "nccl", "{out}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.starts_with("tuned: all-gather of 4 KiB per rank") && reason.contains("NCCL 11.5 us vs one-shot push 31.0 us"), "{out}");
    assert!(err.contains("all-gather bfloat16: nccl <= 4 KiB"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// The README explains every algorithm the tools print: its table is the registry's.
#[test]
fn readme_explains_every_algorithm_from_the_registry() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let table = tpar::algorithms::registry::markdown_table();
    assert!(readme.contains(&table), "README.md is out of date: paste tpar::algorithms::registry::markdown_table() into it:\n{table}");
    for a in tpar::Algorithm::ALL {
        assert!(readme.contains(&format!("`{a}`")), "README.md does not name {a}");
    }
}

/// `tpar plan --collective`: the all-gather's and reduce-scatter's plan, per-rank bytes, with
/// the simulator's times against NCCL's ring; NCCL where the ring wins or the size is not
/// whole 16-byte vectors per rank.
#[test]
fn plan_answers_for_the_all_gather_and_the_reduce_scatter() {
    for c in ["all-gather", "reduce_scatter_perf"] {
        let plan = |b: &str| {
            let (ok, out, err) = tpar(&["plan", "-t", "rtxpro6000-pcie-switch-8", "--world", "8", "-b", b, "--graph", "--collective", c, "--json"]);
            assert!(ok, "{err}");
            serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
        };
        let small = plan("14K");
        assert_eq!(small["algorithm"], "oneshot-push", "{small}");
        assert!(small["predicted_us"].as_f64().unwrap() < small["nccl_us"].as_f64().unwrap(), "{small}");
        assert_eq!(plan("64M")["algorithm"], "nccl");
        let odd = plan("1001");
        assert!(odd["algorithm"] == "nccl" && odd["reason"].as_str().unwrap().contains("16-byte"), "{odd}");
    }
}
