//! `tpar doctor`: one report an engine user runs on the box — what tpar sees, what its plan
//! would do with each of the engine's size classes and why, what the installed engine would do
//! with `TPAR_ENABLE=1`, the libraries tpar could not find, the lines to paste, and the
//! verify-step estimate. The report is the library's (`tpar::doctor`, whose `rules` judge the
//! engine); this file parses the options and runs the engine facts' reporter
//! (`python/tpar/doctor.py`, carried in the binary) in the engine's Python.

use std::process::Command;
use tpar::doctor::{rules, EngineContext, EngineSection, Options, Report};

/// The engine facts' reporter, run with `PYTHON -c` (standard library only: it works whether
/// or not tpar is installed in that Python, and reports which).
const DOCTOR_PY: &str = include_str!("../../../python/tpar/doctor.py");

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Runs on any machine: without a GPU, driver or library it says what it cannot see and still \
exits 0 (only malformed options are errors). Nothing is changed: no kernel is compiled, no file \
is written, no engine is imported.

Examples:
  tpar doctor                                   this box, the engines in `python3`
  tpar doctor --engine vllm --tp 8 --python /opt/venv/bin/python
  tpar doctor --topology h200-nvswitch-8        what tpar would do on a preset box
  tpar doctor --json | jq .paste                the lines to paste, as JSON")]
pub struct DoctorArgs {
    /// The engine to judge: its settings that would keep calls from tpar, and the lines that
    /// undo them. `all`: each engine installed in the engine's Python.
    #[arg(long, default_value = "all", value_parser = ["all", "vllm", "sglang"])]
    pub engine: String,
    /// Tensor-parallel size (default: one rank per GPU here).
    #[arg(long)]
    pub tp: Option<usize>,
    /// Elements per token of each all-reduce: the model's hidden size (default: Kimi-K2's).
    #[arg(long, default_value_t = tpar::model::KIMI_HIDDEN)]
    pub hidden: usize,
    /// Look at a preset (h200-nvswitch-8, rtxpro6000-pcie-switch-8, ...), `cpu`, or a
    /// topology JSON file instead of this machine.
    #[arg(long, short = 't', value_name = "NAME|FILE")]
    pub topology: Option<String>,
    /// Measure this machine's links now (a few seconds on a GPU machine), as `tpar topo
    /// --probe` does, so that the plan uses the measured figures.
    #[arg(long)]
    pub probe: bool,
    /// The engine's Python interpreter (the one that runs vLLM or SGLang).
    #[arg(long, default_value = "python3", value_name = "PATH")]
    pub python: String,
    /// Do not run any Python (the engine part is left out).
    #[arg(long, conflicts_with = "python")]
    pub no_python: bool,
    /// Print the report as JSON (the same facts).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DoctorArgs) -> Result<(), String> {
    let opts = Options { topology: args.topology.clone(), tp: args.tp, hidden: args.hidden, probe: args.probe };
    let mut report = Report::gather(&opts).map_err(|e| e.to_string())?;
    let engine = (!args.no_python).then(|| inspect(&args.python, &args.engine, &report.engine_context()));
    report.finish(engine);
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

/// Asks doctor.py in `python` for the facts the engine rules read, and judges them; a failure
/// is a section saying why.
fn inspect(python: &str, engine: &str, ctx: &EngineContext) -> EngineSection {
    let query = match serde_json::to_string(&rules::query()) {
        Ok(q) => q,
        Err(e) => return EngineSection::unavailable(python, format!("the doctor's query: {e}")),
    };
    let out = Command::new(python).args(["-c", DOCTOR_PY, "--facts", &query]).output();
    match out {
        Err(e) => EngineSection::unavailable(python, format!("cannot run it: {e} (give --python PATH, or --no-python)")),
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            EngineSection::unavailable(python, format!("it exited with {}: {last}", o.status))
        }
        Ok(o) => rules::judge_answer(python, &String::from_utf8_lossy(&o.stdout), engine, ctx),
    }
}
