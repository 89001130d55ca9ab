//! What a new user met in the first hour on a fresh clone (the "first hour" issue), each
//! through the built binary: one meaning per exit status in every command, a setting CPU
//! ranks cannot honour refused once before any rank, `tpar model`'s flags refused by name and
//! range before any output, `tpar sim` not timing what the plan cannot run, every figure's
//! label agreeing with its one source, the doctor saying what happens at start and each fact
//! once, the help's selftest list, and the README's default bench range.

mod common;

use std::process::{Command, Output};

fn tpar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpar"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TPAR_") {
            c.env_remove(k);
        }
    }
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = tpar();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn repo_file(rel: &str) -> String {
    std::fs::read_to_string(format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// 0 done, 1 ran and failed, 2 refused before anything ran: the same in every command, and
/// said in `tpar --help` and the README. (`settings --check` once exited 1 for the malformed
/// variable that `bench` and `plan` exit 2 for.)
#[test]
fn exit_statuses_mean_one_thing_in_every_command() {
    let malformed = [("TPAR_TUNE", "maybe")];
    let commands: [&[&str]; 6] = [
        &["settings", "--check"],
        &["bench", "--backend", "cpu", "--world", "2", "-e", "1K"],
        &["check", "--backend", "cpu", "--world", "2", "-e", "1K"],
        &["plan", "-t", "pcie-2", "--world", "2", "-b", "1K"],
        &["sim", "-t", "pcie-2", "-b", "1K"],
        &["model"],
    ];
    for args in commands {
        let out = run(args, &malformed);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} with TPAR_TUNE=maybe: {err}");
        assert_eq!(err.matches("TPAR_TUNE=\"maybe\"").count(), 1, "{args:?}: said once: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing runs: {}", text(&out.stdout));
    }
    // Bad usage and values out of range: clap's own errors and tpar's checks alike.
    let refused: [&[&str]; 8] = [
        &["bench", "--no-such-flag"],
        &["plan", "-t", "pcie-2", "-b", "1K"],
        &["sim", "-t", "pcie-2", "--algo", "bogus"],
        &["model", "--hidden", "0"],
        &["model", "--acceptance", "5"],
        &["bench", "--backend", "cpu", "--world", "2", "-b", "4M", "-e", "1K"],
        &["check", "--backend", "cpu", "--world", "2", "-d", "int8"],
        &["plan", "-t", "pcie-2", "--world", "1", "-b", "1K"],
    ];
    for args in refused {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
    // A run that started and failed: every rank times out in the rendezvous.
    let out = run(&["check", "--backend", "cpu", "--world", "2", "-e", "4K"], &[("TPAR_TIMEOUT_MS", "1")]);
    assert_eq!(out.status.code(), Some(1), "ranks failed: {}", text(&out.stderr));
    let out = run(&["settings", "--check"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Said where a user looks.
    let help = text(&run(&["--help"], &[]).stdout);
    assert!(help.contains("Exit status: 0 done; 1 the run failed") && help.contains("2 refused before anything ran"), "{help}");
    let readme = repo_file("README.md");
    assert!(readme.contains("exits 0 when it did what was asked, 1 when it ran and failed"), "the README says the statuses");
}

/// `TPAR_ALGO=nccl tpar bench` on CPU ranks printed the table's header, then the same error
/// once per rank. The launcher now checks it (the communicators' own check) before any rank.
#[test]
fn a_setting_cpu_ranks_cannot_honour_is_refused_once_before_any_rank() {
    for (var, value, says) in [("TPAR_ALGO", "nccl", "TPAR_ALGO=nccl"), ("TPAR_DISABLE", "1", "TPAR_DISABLE=1")] {
        for cmd in ["bench", "check"] {
            let out = run(&[cmd, "--backend", "cpu", "--world", "2", "-e", "1K"], &[(var, value)]);
            let (stdout, err) = (text(&out.stdout), text(&out.stderr));
            assert_eq!(out.status.code(), Some(2), "{cmd} {var}={value}: {err}");
            assert!(stdout.is_empty(), "{cmd} {var}={value}: no header before the error: {stdout}");
            assert_eq!(err.lines().count(), 1, "{cmd} {var}={value}: one error line: {err}");
            assert_eq!(err.matches(says).count(), 1, "{cmd} {var}={value}: {err}");
            assert!(!err.contains("rank 0") && !err.contains("error: tpar: error"), "{cmd} {var}={value}: no rank started: {err}");
        }
    }
}

/// `tpar model`'s figures are refused naming the flag and its range, before any output
/// (before: `--hidden 0` said "invalid argument `records`", `--verify-width 0` "lie in 1 to
/// 0", `--tp 0` "`world`", and `--layers 0` printed the header first).
#[test]
fn model_flags_are_refused_by_name_and_range_before_any_output() {
    let cases: [(&str, &str, &str); 12] = [
        ("--hidden", "0", "1 or more"),
        ("--layers", "0", "1 or more"),
        ("--ar-per-layer", "0", "1 or more"),
        ("--verify-width", "0", "1 or more"),
        ("--tp", "0", "2 to 16"),
        ("--tp", "1", "2 to 16"),
        ("--tp", "17", "2 to 16"),
        ("--tp", "12", "2 to 8"),
        ("--draft-ms", "-1", "0 or more"),
        ("--compute-ms", "-1", "0 or more"),
        ("--verify-compute-factor", "0", "above 0"),
        ("--baseline-tok-s", "0", "above 0"),
    ];
    for (flag, value, range) in cases {
        let arg = format!("{flag}={value}");
        let out = run(&["model", &arg], &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{arg}: {err}");
        assert!(out.stdout.is_empty(), "{arg}: printed before the error: {}", text(&out.stdout));
        assert!(err.contains(flag) && err.contains(range), "{arg}: names the flag and its range: {err}");
        assert!(!err.contains("`records`") && !err.contains("`world`") && !err.contains("1 to 0"), "{arg}: {err}");
    }
}

/// `tpar sim` timed `hierarchical` on a one-island preset where `tpar plan` says it cannot
/// run; it now shows it as not runnable, with the plan's reason.
#[test]
fn sim_does_not_time_what_the_plan_cannot_run() {
    let out = run(&["sim", "-t", "rtxpro6000-pcie-switch-8", "-b", "42K"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let header = stdout.lines().find(|l| l.trim_start().starts_with("size ")).expect("a table header");
    assert!(!header.contains("hierarchical"), "no time for what cannot run: {header}");
    let line = stdout.lines().find(|l| l.starts_with("# hierarchical: not runnable here")).unwrap_or_else(|| panic!("{stdout}"));
    let plan = run(&["plan", "-t", "rtxpro6000-pcie-switch-8", "--world", "8", "-b", "42K"], &[("TPAR_ALGO", "hierarchical")]);
    let reason = "hierarchical needs at least two islands; the 8 ranks form 1";
    assert!(line.contains(reason) && text(&plan.stderr).contains(reason), "sim and plan give one reason:\n{line}\n{}", text(&plan.stderr));
    // Where it can run (two islands), it is timed.
    let two = text(&run(&["sim", "-t", "rtxpro6000-dualsocket-8", "-b", "42K"], &[]).stdout);
    assert!(two.lines().any(|l| l.trim_start().starts_with("size ") && l.contains("hierarchical")), "{two}");
}

/// Every figure has one source and its label says it: no "(published)" time the CPU plan does
/// not have, no "measured" rates on a preset whose probe is published, and every published
/// test a pick rests on listed by `tpar topo --published`.
#[test]
fn labels_agree_with_the_one_source_of_each_figure() {
    // CPU ranks: the threshold is tpar's measurement (its file named); no predicted time.
    let out = run(&["plan", "-t", "cpu", "--backend", "cpu", "--world", "8", "-b", "42K"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("bench/results/2026-12-01-dev-2core-cpu-vs-mpi/README.md"), "{stdout}");
    assert!(!stdout.contains("predicted") && !stdout.contains("published"), "{stdout}");
    // A preset's copy-engine rates are its published figures, as the doctor's header says.
    let out = run(&["doctor", "--topology", "rtxpro6000-pcie-switch-8", "--no-python"], &[]);
    let doctor = text(&out.stdout);
    assert!(out.status.success() && doctor.contains("published figures, not measured by tpar"), "{doctor}");
    assert!(!doctor.contains("measured by the link probe"), "a preset's rates are not measured: {doctor}");
    assert!(doctor.contains("copy-engine rates published for this box"), "{doctor}");
    // Each published test under load that a time rests on is in `tpar topo --published`.
    let listed = text(&run(&["topo", "--published"], &[]).stdout);
    let mut checked = 0;
    for preset in ["rtxpro6000-pcie-switch-8", "rtxpro6000-dualsocket-8"] {
        let sim = text(&run(&["sim", "-t", preset, "-b", "42K"], &[]).stdout);
        for line in sim.lines().filter(|l| l.contains(" rests on: ")) {
            for (_, rest) in line.match_indices(": published (").map(|(i, _)| line.split_at(i + ": published (".len())) {
                let what = rest.split(" (").next().unwrap_or(rest).trim_end_matches(')');
                if what.ends_with("GB/s under all-to-all load") {
                    continue; // a rate of the preset's probe: a row of the first table
                }
                assert!(listed.contains(what), "{preset}: `tpar sim` rests on a published \"{what}\" that `tpar topo --published` does not list:\n{listed}");
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no published test found in `tpar sim`'s sources");
}

/// The doctor says what a communicator will do at start (the first-use tune), prints NVML's
/// error once, and gives pip users the pip line for NVRTC (the script is for clones).
#[test]
fn the_doctor_says_what_start_will_do_and_each_fact_once() {
    let out = run(&["doctor", "--no-python"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tuned = stdout.lines().find(|l| l.starts_with("tuned profile: ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(tuned.contains("TPAR_TUNE=auto (the default)") && tuned.contains("about 8 s") && tuned.contains("bench/results/2026-12-02-h200-tune-engines-large/README.md"), "{tuned}");
    assert!(!tuned.contains("the plan uses its defaults;"), "not while a tune at start replaces them: {tuned}");
    let off = text(&run(&["doctor", "--no-python"], &[("TPAR_TUNE", "off")]).stdout);
    assert!(off.contains("no tune at start (TPAR_TUNE=off): the plan uses its defaults"), "{off}");
    match stdout.lines().find_map(|l| l.strip_prefix("NO GPU: ")) {
        Some(why) => {
            let nvml = why.split("; `--topology").next().unwrap_or(why);
            assert_eq!(stdout.matches(nvml).count(), 1, "NVML's error once, not four times:\n{stdout}");
        }
        None => common::skip("first_hour::the_doctor_says_what_start_will_do_and_each_fact_once (NVML part)", "this machine has GPUs: the NVML error is not printed"),
    }
    let script = repo_file("scripts/install-nvrtc.sh");
    let pin = script.lines().find_map(|l| l.strip_prefix("pin=\"")).and_then(|p| p.strip_suffix('"')).expect("the script's pin");
    if stdout.lines().any(|l| l.starts_with("NVRTC") && l.contains("MISSING")) {
        assert!(stdout.contains(&format!("`pip install {pin}`")), "the pip line, with the script's pin {pin}:\n{stdout}");
        assert!(stdout.contains("in a clone of tpar, `scripts/install-nvrtc.sh`"), "{stdout}");
    } else {
        common::skip("first_hour::the_doctor_says_what_start_will_do_and_each_fact_once (NVRTC hint)", "NVRTC is found here: the hint for its absence is not printed");
    }
}

/// `tpar --help` names every selftest (it left out `fused`).
#[test]
fn the_help_lists_every_selftest() {
    let help = text(&run(&["--help"], &[]).stdout);
    let line = help.lines().skip_while(|l| !l.trim_start().starts_with("selftest")).take(3).collect::<Vec<_>>().join(" ");
    let sub = text(&run(&["selftest", "--help"], &[]).stdout);
    let names: Vec<&str> = sub
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .collect();
    assert!(names.len() >= 9, "{sub}");
    for n in names {
        assert!(line.split([' ', ',']).any(|w| w == n), "`tpar --help` does not list selftest {n}: {line}");
    }
}

/// The README's default bench range is the one `tpar bench` runs (it said 4 MiB; by x4 from
/// 8 B the last row under the default -e 4M is 2 MiB).
#[test]
fn the_readme_bench_range_is_what_bench_runs() {
    let readme = repo_file("README.md");
    let line = readme.lines().find(|l| l.starts_with("tpar bench ") && l.contains("# CPU ranks")).expect("the README's default bench line");
    let range = line.split(", ").find(|p| p.contains(" by x")).unwrap_or_else(|| panic!("{line}"));
    let (from, rest) = range.split_once(" to ").unwrap_or_else(|| panic!("{range}"));
    let to = rest.split(" by ").next().unwrap();
    let bytes = |s: &str| -> usize {
        let (n, unit) = s.split_once(' ').unwrap_or_else(|| panic!("{s}"));
        n.parse::<usize>().unwrap() * match unit {
            "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            other => panic!("unit {other}"),
        }
    };
    let out = run(&["bench", "--backend", "cpu", "--world", "2", "-n", "1", "-w", "0", "--algo", "oneshot-push"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sizes: Vec<usize> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() > 3 && t[1] == "float").then(|| t[2].parse().ok()).flatten()
        })
        .collect();
    assert_eq!((sizes.first().copied(), sizes.last().copied()), (Some(bytes(from)), Some(bytes(to))), "README: {line}\nbench:\n{stdout}");
}

/// The fused family's flags, and `selftest graph`'s `--collective` and `--algo`, are refused
/// (exit 2) naming the flag, before any GPU is asked for: a bad `--pattern`, `--rows`,
/// `--mode`, collective or algorithm is a usage error, not a failed run.
#[test]
fn fused_flags_are_refused_before_any_gpu_is_asked_for() {
    let cases: [(&[&str], &str); 7] = [
        (&["selftest", "fused", "--emulate-ranks", "2", "--pattern", "bogus"], "--pattern"),
        (&["selftest", "graph", "--emulate-ranks", "2", "--collective", "all-gather,bogus"], "--collective"),
        (&["selftest", "graph", "--emulate-ranks", "2", "--collective", "all-gather", "--algo", "twoshot-pull"], "--algo"),
        (&["selftest", "graph", "--emulate-ranks", "2", "--collective", "reduce-scatter", "--algo", "nope"], "--algo"),
        (&["selftest", "fused", "--emulate-ranks", "2", "--rows", "x"], "--rows"),
        (&["selftest", "fused", "--emulate-ranks", "2", "--mode", "sometimes"], "--mode"),
        (&["bench", "--fused", "--emulate-ranks", "2", "--pattern", "rmsnorm,nope"], "--pattern"),
    ];
    for (args, flag) in cases {
        let out = run(args, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?} names {flag}: {err}");
    }
}
