//! `tpar model`: what all-reduce latency does to decode throughput, with and without
//! speculative decoding, for NCCL and for the algorithm tpar would pick.

use crate::cmd::sim::human;
use std::path::PathBuf;
use tpar::model::{self, ArLatency, BenchLatency, Compute, Fixed, FromFn, LogLogTable, ModelInput};
use tpar::report::Record;
use tpar::topology::Topology;
use tpar::{Algorithm, DType};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "With no figures given, `tpar model` models the founding case (docs/model.md): NCCL as measured on that box, \
tpar's side as tpar::plan picks it on rtxpro6000-dualsocket-8 (timed by the simulator; NCCL's measured time where the plan picks NCCL). \
Otherwise all-reduce latency comes from, in order of precedence: --nccl-us / --plan-us (given), \
--profile (tpar only), --bench (a `tpar bench --json` file, interpolated log-log), or --sim (tpar::plan's pick on a topology, \
timed by the simulator; NCCL as measured where docs/references.md has it for that box, else simulated, and the output says which).\n\n\
Examples:\n  tpar model                                  # the founding case, as docs/model.md works it\n  \
tpar model --bench results.json --acceptance 3.0\n  \
tpar model --measure --tp 4 --graph --baseline-tok-s 60   # on 2+ GPUs: measure their all-reduces first\n  tpar model --compute-ms 2.5 --nccl-us 14K=71,42K=225 --plan-us 20 --acceptance 1.8\n\n\
The worked case is in docs/model.md."
)]
pub struct ModelArgs {
    /// Transformer layers.
    #[arg(long, default_value_t = model::KIMI_LAYERS, value_parser = at_least_one)]
    layers: usize,
    /// Hidden size (elements per token in each all-reduce).
    #[arg(long, default_value_t = model::KIMI_HIDDEN, value_parser = at_least_one)]
    hidden: usize,
    /// Activation dtype: bfloat16, half or float.
    #[arg(long, default_value = "bfloat16")]
    dtype: String,
    /// All-reduces per layer.
    #[arg(long, default_value_t = model::KIMI_AR_PER_LAYER, value_parser = at_least_one)]
    ar_per_layer: usize,
    /// Tensor-parallel size (ranks in each all-reduce).
    #[arg(long, default_value_t = model::KIMI_TP, value_parser = tp_size)]
    tp: usize,
    /// Compute per one-token decode step, ms (everything but the all-reduces).
    #[arg(long, conflicts_with = "baseline_tok_s", value_parser = zero_or_more)]
    compute_ms: Option<f64>,
    /// Measured plain-decode throughput with NCCL, tok/s; compute is backed out of it
    /// (default 89.5, the docs/references.md case, when --compute-ms is not given).
    #[arg(long, value_parser = above_zero)]
    baseline_tok_s: Option<f64>,
    /// Tokens per verify step (rows in each verify all-reduce).
    #[arg(long, default_value_t = ModelInput::default().verify_width, value_parser = at_least_one)]
    verify_width: usize,
    /// Verify compute as a multiple of one-token decode compute (1: decode is bound by
    /// reading weights, an assumption).
    #[arg(long, default_value_t = ModelInput::default().verify_compute_factor, value_parser = above_zero)]
    verify_compute_factor: f64,
    /// Drafting cost per verify step, ms (default: 3, derived for the founding run in
    /// docs/model.md; docs/references.md gives none).
    #[arg(long, default_value_t = ModelInput::founding_case().draft_ms, value_parser = zero_or_more)]
    draft_ms: f64,
    /// Tokens yielded per verify step (accepted drafts + bonus token; default: 1.8, what the
    /// founding run achieved (docs/model.md); EAGLE-3's model cards give 2.3-3.2).
    #[arg(long, default_value_t = ModelInput::founding_case().acceptance)]
    acceptance: f64,
    /// NCCL all-reduce latency, us: one figure for every size, or SIZE=US points
    /// interpolated log-log (e.g. 14K=71,42K=225).
    #[arg(long)]
    nccl_us: Option<String>,
    /// tpar's all-reduce latency, us, in the same forms as --nccl-us.
    #[arg(long)]
    plan_us: Option<String>,
    /// tpar's latency from a tuned profile (TOML, as `tpar tune` writes it): each bucket's
    /// median, interpolated log-log.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Latency from a `tpar bench --json` file (records of world = --tp).
    #[arg(long)]
    bench: Option<PathBuf>,
    /// tpar's latency from tpar::plan's pick on this topology (preset or JSON file), timed by
    /// the simulator; NCCL's measured where docs/references.md has it for that box, else simulated.
    #[arg(long)]
    sim: Option<String>,
    /// CUDA-graph launches instead of eager: with --sim, what the simulator models; with
    /// --bench or --measure, which GPU records are used.
    #[arg(long)]
    graph: bool,
    /// Measure here first (2+ GPUs): run `tpar bench` with --tp rank processes, one per GPU,
    /// at this model's decode and verify sizes, NCCL and every tpar algorithm in the same
    /// run, and model with those figures.
    #[arg(long, conflicts_with_all = ["bench", "sim", "nccl_us", "plan_us", "profile"])]
    measure: bool,
}

// Every figure of the model is checked as clap parses it, so that a value out of range is
// refused naming its flag and range (exit status 2) before anything is printed; the
// library's own checks name its fields (`records`, `world`), which a user never typed.

/// A count (`--layers`, `--hidden`, `--ar-per-layer`, `--verify-width`): 1 or more.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number, 1 or more".into()),
    }
}

/// `--tp`: the ranks of one all-reduce, as every command takes them.
fn tp_size(s: &str) -> Result<usize, String> {
    let max = tpar::workspace::MAX_WORLD;
    match s.trim().parse::<usize>() {
        Ok(n) if (2..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected 2 to {max} ranks (tpar's world sizes on one host)")),
    }
}

fn number(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A time in ms (`--compute-ms`, `--draft-ms`): 0 or more.
fn zero_or_more(s: &str) -> Result<f64, String> {
    number(s).filter(|v| *v >= 0.0).ok_or_else(|| "expected a number, 0 or more".into())
}

/// A rate or factor (`--baseline-tok-s`, `--verify-compute-factor`): more than 0.
fn above_zero(s: &str) -> Result<f64, String> {
    number(s).filter(|v| *v > 0.0).ok_or_else(|| "expected a number above 0".into())
}

/// `--measure`: `tpar bench` at the decode and verify sizes with `tp` ranks, its table shown,
/// its records returned (the JSON goes through a temporary file).
fn measure(args: &ModelArgs, input: &ModelInput) -> Result<Vec<Record>, String> {
    let gpus = if cfg!(feature = "cuda") { crate::harness::gpu_count() } else { 0 };
    if gpus < 2 {
        return Err(crate::exit::refuse(
            "--measure needs 2 or more GPUs (and a tpar built with the `cuda` feature): the model compares tpar with NCCL, \
             which CPU ranks do not have. Without GPUs, model from figures (--nccl-us, --plan-us), a bench file or the simulator",
        ));
    }
    let (one, verify) = (input.ar_bytes(1), input.ar_bytes(input.verify_width));
    let factor = (verify / one.max(1)).max(1);
    let json = std::env::temp_dir().join(format!("tpar-model-measure-{}.json", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| format!("finding my own executable: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    let bench_args: Vec<String> = vec![
        "bench".into(),
        "--world".into(),
        args.tp.to_string(),
        "-b".into(),
        one.to_string(),
        "-e".into(),
        verify.to_string(),
        "-f".into(),
        factor.to_string(),
        "-d".into(),
        args.dtype.clone(),
        "-n".into(),
        "30".into(),
        "-w".into(),
        "5".into(),
        "--mode".into(),
        if args.graph { "graph" } else { "eager" }.into(),
    ];
    println!("# measuring: tpar {}", bench_args.join(" "));
    cmd.args(&bench_args).arg("--json").arg(&json);
    let status = cmd.status().map_err(|e| format!("starting tpar bench: {e}"))?;
    let records = if status.success() { load_bench(&json, args.graph) } else { Err(format!("the measurement (tpar bench) failed: {status}")) };
    let _ = std::fs::remove_file(&json);
    println!("#");
    records
}

/// A bench record as `tpar bench --json` writes it; GPU runs across processes add the mode.
#[derive(serde::Deserialize)]
struct BenchRow {
    #[serde(flatten)]
    record: Record,
    #[serde(default)]
    mode: Option<tpar::CaptureMode>,
}

/// The records of `path` in the wanted mode (records without a mode are kept: those files
/// hold one mode only). Mixing eager and graph points would interpolate between the two.
fn load_bench(path: &std::path::Path, graph: bool) -> Result<Vec<Record>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let rows: Vec<BenchRow> = serde_json::from_str(&text).map_err(|e| format!("{}: not a list of bench records: {e}", path.display()))?;
    let want = if graph { tpar::CaptureMode::Graph } else { tpar::CaptureMode::Eager };
    let any_mode = rows.iter().any(|r| r.mode.is_some());
    let kept: Vec<Record> = rows.into_iter().filter(|r| r.mode.map_or(true, |m| m == want)).map(|r| r.record).collect();
    if any_mode && kept.is_empty() {
        return Err(format!("{}: no {want} records (add or drop --graph)", path.display()));
    }
    Ok(kept)
}

/// `225` (every size) or `14K=71,42K=225` (points, log-log).
fn parse_latency(s: &str, algorithm: Algorithm) -> Result<Box<dyn ArLatency>, String> {
    if !s.contains('=') {
        let us: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("bad latency {s:?}: expected microseconds or SIZE=US,..."))?;
        return Ok(Box::new(Fixed(us)));
    }
    let mut pts = Vec::new();
    for item in s.split(',').filter(|x| !x.trim().is_empty()) {
        let (size, us) = item
            .split_once('=')
            .ok_or_else(|| format!("bad latency point {item:?}: expected SIZE=US"))?;
        let us: f64 = us.trim().parse().map_err(|_| format!("bad latency in {item:?}"))?;
        pts.push((crate::cmd::sim::parse_size(size)? as f64, us));
    }
    let table = LogLogTable::new(algorithm, pts).map_err(|e| e.to_string())?;
    Ok(Box::new(FromFn(move |b| {
        table.latency(b).map(|(us, how)| (us, format!("given ({how})")))
    })))
}

pub fn run(args: ModelArgs) -> Result<(), String> {
    let dtype: DType = args.dtype.parse().map_err(|e: tpar::Error| crate::exit::refuse(format!("--dtype: {e}")))?;
    // A verify step yields at least its bonus token and at most one per row it verifies.
    let most = args.verify_width as f64;
    if !(1.0..=most).contains(&args.acceptance) {
        return Err(crate::exit::refuse(format!(
            "--acceptance {}: tokens per verify step lie in 1 to {} (--verify-width {}: the accepted drafts plus the bonus token)",
            args.acceptance, args.verify_width, args.verify_width
        )));
    }
    let compute = match (args.compute_ms, args.baseline_tok_s) {
        (Some(ms), _) => Compute::StepMs(ms),
        (None, Some(t)) => Compute::BaselineTokS(t),
        (None, None) => Compute::BaselineTokS(model::REFERENCE_BASELINE_TOK_S),
    };
    let input = ModelInput {
        layers: args.layers,
        hidden: args.hidden,
        dtype,
        ar_per_layer: args.ar_per_layer,
        tp: args.tp,
        compute,
        verify_width: args.verify_width,
        verify_compute_factor: args.verify_compute_factor,
        draft_ms: args.draft_ms,
        acceptance: args.acceptance,
    };

    let records: Option<Vec<Record>> = match &args.bench {
        Some(p) => Some(load_bench(p, args.graph)?),
        None if args.measure => Some(measure(&args, &input)?),
        None => None,
    };
    let given = args.nccl_us.is_some() || args.plan_us.is_some() || args.profile.is_some() || records.is_some() || args.sim.is_some();
    // Where a topology times either side, --tp must fit its GPUs: said here, with the flag,
    // rather than as the library's `world` after the output began.
    let times_on_topology = !given || (args.nccl_us.is_none() && records.is_none()) || (args.plan_us.is_none() && args.profile.is_none() && records.is_none());
    if times_on_topology {
        let name = args.sim.as_deref().unwrap_or(model::FOUNDING_TOPOLOGY);
        let gpus = Topology::load(name).map_err(|e| crate::exit::refuse(format!("--sim {name}: {e}")))?.gpu_count();
        if args.tp > gpus {
            return Err(crate::exit::refuse(format!("--tp {}: {name} has {gpus} GPUs, so --tp takes 2 to {gpus} there", args.tp)));
        }
    }

    // No figures given: the default case. Without GPUs it is the founding case with NCCL as
    // measured there (docs/model.md); a tune of this machine will hand its records to the
    // same function (`model::default_case`'s `measured`) and replace it.
    let (nccl, plan): (Box<dyn ArLatency>, Box<dyn ArLatency>) = if !given {
        let case = model::default_case(input.clone(), None).map_err(|e| e.to_string())?;
        println!("# case: {}", case.title);
        for line in &case.sources {
            println!("# {line}");
        }
        println!("# (give --sim PRESET, --bench FILE, --nccl-us / --plan-us or --profile to model something else; docs/model.md)");
        println!();
        (case.nccl, case.plan)
    } else {
        let sim_name = args.sim.clone().unwrap_or_else(|| model::FOUNDING_TOPOLOGY.to_string());
        let topo = Topology::load(&sim_name).map_err(|e| e.to_string())?;
        // NCCL as given, as benched, or on the topology: measured where docs/references.md has
        // it for that box, else simulated (`model::nccl_on` labels which).
        let nccl_source = || -> Result<Box<dyn ArLatency>, String> {
            if let Some(us) = &args.nccl_us {
                parse_latency(us, Algorithm::Nccl)
            } else if let Some(r) = &records {
                Ok(Box::new(BenchLatency::from_records(r, args.tp, |a| a == Algorithm::Nccl).map_err(|e| e.to_string())?))
            } else {
                model::nccl_on(&topo, args.tp, args.graph).map_err(|e| e.to_string())
            }
        };
        let nccl = nccl_source()?;
        let plan: Box<dyn ArLatency> = if let Some(us) = &args.plan_us {
            parse_latency(us, Algorithm::OneshotPush)?
        } else if let Some(p) = &args.profile {
            let prof = tpar::profile::Profile::load(p).map_err(|e| e.to_string())?;
            Box::new(tpar::model::ProfileLatency::new(&prof, dtype).map_err(|e| e.to_string())?)
        } else if let Some(r) = &records {
            Box::new(BenchLatency::from_records(r, args.tp, |a| a != Algorithm::Nccl).map_err(|e| e.to_string())?)
        } else {
            // tpar::plan chooses; the simulator times a kernel; a NCCL pick costs NCCL's time.
            Box::new(model::PlanLatency::new(&topo, args.tp, dtype, args.graph, nccl_source()?).map_err(|e| e.to_string())?)
        };
        // Say which topology tpar's side is planned on (never silent), and the verify step
        // side by side.
        let simulated = args.plan_us.is_none() && args.profile.is_none() && records.is_none();
        if simulated {
            if args.sim.is_none() {
                println!("# no --sim given: tpar's pick is planned on the {sim_name} preset (the founding box's topology is not stated); --sim rtxpro6000-pcie-switch-8 for one socket");
            }
            print!("{}", model::sim_case_report(&topo, &input, args.graph).map_err(|e| e.to_string())?);
            println!();
        }
        (nccl, plan)
    };

    let out = model::evaluate(&input, nccl.as_ref(), &[("plan", plan.as_ref())]).map_err(|e| e.to_string())?;

    println!(
        "# tpar model: {} layers x {} all-reduces = {} per step; hidden {}, {}, TP {}",
        input.layers, input.ar_per_layer, out.ars_per_step, input.hidden, dtype, input.tp
    );
    println!(
        "# all-reduce sizes: decode {} (1 token), verify {} ({} tokens)",
        human(input.ar_bytes(1)),
        human(input.ar_bytes(input.verify_width)),
        input.verify_width
    );
    if out.compute_backed_out {
        let n = &out.scenarios[0].plain;
        println!(
            "# compute: {:.2} ms per step, backed out of {:.1} tok/s ({:.2} ms) minus {} NCCL all-reduces at {:.1} us",
            out.compute_ms,
            n.tok_s(),
            n.total_ms(),
            out.ars_per_step,
            n.ar_us
        );
    } else {
        println!("# compute: {:.2} ms per step (given)", out.compute_ms);
    }
    println!(
        "# speculation: {} tokens per verify, {:.2} accepted, draft {:.2} ms, verify compute x{:.2}",
        input.verify_width, input.acceptance, input.draft_ms, input.verify_compute_factor
    );
    println!();
    println!(
        "{:<6} {:<7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}  all-reduce source",
        "AR by", "mode", "AR (us)", "compute", "all-red.", "draft", "step (ms)", "tok/s"
    );
    for s in &out.scenarios {
        for (mode, st) in [("plain", &s.plain), ("spec", &s.spec)] {
            println!(
                "{:<6} {:<7} {:>10.1} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>9.1}  {}",
                s.label,
                mode,
                st.ar_us,
                st.compute_ms,
                st.allreduce_ms,
                st.draft_ms,
                st.total_ms(),
                st.tok_s(),
                st.ar_source
            );
        }
    }
    println!();
    println!("where a step's time goes (compute / all-reduce / draft):");
    for s in &out.scenarios {
        for (mode, st) in [("plain", &s.plain), ("spec", &s.spec)] {
            let t = st.total_ms();
            println!(
                "  {:<6} {:<6} {:>5.1}% / {:>5.1}% / {:>5.1}%",
                s.label,
                mode,
                100.0 * st.compute_ms / t,
                100.0 * st.allreduce_ms / t,
                100.0 * st.draft_ms / t
            );
        }
    }
    println!();
    for s in &out.scenarios {
        let verdict = if input.acceptance > s.break_even_acceptance {
            "speculation pays"
        } else {
            "speculation loses"
        };
        println!(
            "break-even acceptance ({}): {:.2} tokens per verify step; at {:.2}, {verdict} ({:+.0}% tok/s)",
            s.label,
            s.break_even_acceptance,
            input.acceptance,
            100.0 * (s.spec.tok_s() / s.plain.tok_s() - 1.0)
        );
    }
    if let [n, p] = &out.scenarios[..] {
        println!(
            "plan vs nccl: plain {:.2}x, speculative {:.2}x",
            p.plain.tok_s() / n.plain.tok_s(),
            p.spec.tok_s() / n.spec.tok_s()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: Option<&str>, us: f64) -> serde_json::Value {
        let r = Record::measured(Algorithm::OneshotPush, "cuda", tpar::DType::BF16, 4, 21504, (us, us, us), 0);
        let mut v = serde_json::to_value(r).unwrap();
        if let Some(m) = mode {
            v["mode"] = serde_json::Value::String(m.into());
        }
        v
    }

    #[test]
    fn bench_files_are_read_in_one_mode() {
        let dir = std::env::temp_dir().join(format!("tpar-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mixed = dir.join("mixed.json");
        std::fs::write(&mixed, serde_json::to_string(&vec![row(Some("eager"), 9.0), row(Some("graph"), 5.0)]).unwrap()).unwrap();
        assert_eq!(load_bench(&mixed, false).unwrap().iter().map(|r| r.time_us).collect::<Vec<_>>(), vec![9.0]);
        assert_eq!(load_bench(&mixed, true).unwrap().iter().map(|r| r.time_us).collect::<Vec<_>>(), vec![5.0]);
        let eager_only = dir.join("eager.json");
        std::fs::write(&eager_only, serde_json::to_string(&vec![row(Some("eager"), 9.0)]).unwrap()).unwrap();
        assert!(load_bench(&eager_only, true).unwrap_err().contains("no graph records"));
        let plain = dir.join("plain.json");
        std::fs::write(&plain, serde_json::to_string(&vec![row(None, 7.0)]).unwrap()).unwrap();
        assert_eq!(load_bench(&plain, true).unwrap().len(), 1, "files without modes are used as they are");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
