//! `tpar sim`: predicted all-reduce latency per algorithm and size on a topology, the
//! crossovers, and the algorithm the simulator would pick.

use std::path::PathBuf;
use tpar::plan::{plan, Backend, CaptureMode, Overrides, PlanInput};
use tpar::units::human_bytes;
use tpar::sim::{crossovers, Launch, Params, SimRecord, Simulator};
use tpar::topology::Topology;
use tpar::{Algorithm, DType};

/// Sizes swept when `--bytes` is not given: powers of 4 from 256 B to 16 MiB, plus the
/// Kimi-class all-reduces of 1, 3 and 8 tokens (14, 42, 112 KiB).
const DEFAULT_BYTES: &str = "256,1K,4K,14K,16K,42K,64K,112K,256K,1M,4M,16M";

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tpar sim --topology rtxpro6000-dualsocket-8 --bytes 14K,42K,112K\n  tpar sim --topology h200-nvswitch-8 --graph --svg h200.svg --json h200.json\n  tpar sim --topology my-box.json --world 4 --algo oneshot-push,twoshot-push,nccl\n  tpar sim --topology discover --profile tpar-profile.toml   # links from tune's probe\n\nModel parameters and their sources (spec, measured, fitted): docs/sim.md."
)]
pub struct SimArgs {
    /// Topology: a preset (h200-nvswitch-8, rtxpro6000-pcie-switch-8, rtxpro6000-dualsocket-8,
    /// l40s-direct-8, rtx4090-nop2p-4, pcie-2) or a topology JSON file.
    #[arg(long, short = 't', required_unless_present = "calibration")]
    topology: Option<String>,
    /// Print the calibration table instead (each docs/references.md figure, the prediction, the
    /// error and its bound) as Markdown, as docs/sim.md shows it.
    #[arg(long)]
    calibration: bool,
    /// Message sizes, comma-separated; suffixes K, M, G are powers of 1024 (e.g. 256,42K,1M).
    #[arg(long, short = 'b', default_value = DEFAULT_BYTES)]
    bytes: String,
    /// Algorithms to simulate, comma-separated (default: all).
    #[arg(long, short = 'a')]
    algo: Option<String>,
    /// Ranks (GPUs 0..N of the topology; default: all of its GPUs).
    #[arg(long)]
    world: Option<usize>,
    /// Model calls replayed in a CUDA graph (kernel boundary ~0.5 us) instead of eager
    /// launches (~4 us).
    #[arg(long)]
    graph: bool,
    /// Let NCCL use P2P across the socket link (NCCL_P2P_LEVEL=SYS).
    #[arg(long)]
    nccl_p2p_sys: bool,
    /// Also print where each prediction's time goes: launch + fixed work, then each step.
    #[arg(long)]
    steps: bool,
    /// Write the predictions as JSON: a list of {topology, algorithm, world, bytes, predicted_us}.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a latency-versus-size plot (SVG).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// A tuned profile (`tpar tune`'s TOML): its link probe replaces the link class's
    /// assumed figures (unless the topology carries a probe of its own), and the "tpar
    /// plan" column plans with the profile, as the library does under TPAR_PROFILE.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
}

/// One size of `--bytes`: the one grammar (`tpar::units`), and positive.
pub fn parse_size(s: &str) -> Result<usize, String> {
    match crate::harness::size(s)? {
        0 => Err(format!("bad size {s:?}: must be positive")),
        n => Ok(n),
    }
}

/// Comma-separated sizes, sorted and de-duplicated.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let mut v = s
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(parse_size)
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return Err("no sizes given".into());
    }
    Ok(v)
}

/// Comma-separated algorithm names, or all of them.
pub fn parse_algos(s: Option<&str>) -> Result<Vec<Algorithm>, String> {
    match s {
        None => Ok(Algorithm::ALL.to_vec()),
        Some(s) => s
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(|a| a.parse::<Algorithm>().map_err(|e| e.to_string()))
            .collect(),
    }
}

/// What `tpar::plan` (no overrides) runs for `bytes` of bf16 on this topology, with a tuned
/// profile if given.
pub fn planned_with(topo: &Topology, world: usize, bytes: usize, graph: bool, profile: Option<&tpar::profile::Profile>) -> tpar::plan::Plan {
    let overrides = Overrides::default();
    plan(&PlanInput {
        topology: topo,
        world,
        bytes: bytes as u64,
        dtype: DType::BF16,
        capture: if graph { CaptureMode::Graph } else { CaptureMode::Eager },
        backend: Backend::Cuda,
        profile,
        overrides: &overrides,
    })
}

/// Why tpar's plan refuses `a` on `world` ranks of `topo` (a communicator forced to it with
/// TPAR_ALGO would refuse at init), for the algorithms GPU ranks implement; `None` where it
/// runs. Algorithms with no GPU implementation (gather-bcast) stay in the table as the
/// baselines the simulator models.
fn plan_refuses(topo: &Topology, world: usize, a: Algorithm) -> Option<String> {
    if a == Algorithm::Nccl || tpar::algorithms::registry::spec(a).gpu_transports.is_empty() {
        return None;
    }
    let forced = Overrides { algorithm: Some(a), ..Overrides::default() };
    match forced.validate(topo, world, Backend::Cuda) {
        Ok(()) => None,
        Err(tpar::Error::Unsupported { reason, .. }) => Some(reason),
        Err(e) => Some(e.to_string()),
    }
}

/// `42 KiB`-style size for tables (the one formatter, `tpar::units::human_bytes`).
pub fn human(bytes: usize) -> String {
    tpar::units::human_bytes(bytes as u64)
}

fn print_calibration() -> Result<(), String> {
    // The same text docs/sim.md holds between its calibration markers (a test checks it).
    let rows = tpar::sim::calibrate::table(&Params::default()).map_err(|e| e.to_string())?;
    print!("{}", tpar::sim::calibrate::markdown(&rows));
    Ok(())
}

pub fn run(args: SimArgs) -> Result<(), String> {
    if args.calibration {
        return print_calibration();
    }
    let name = args.topology.as_deref().ok_or("--topology is required")?;
    let mut topo = Topology::load(name).map_err(|e| e.to_string())?;
    let world = args.world.unwrap_or(topo.gpu_count());
    let profile = match &args.profile {
        Some(p) => Some(tpar::profile::Profile::load(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut links_from = topo.probe.as_ref().map(|p| format!("links: the topology's probe ({})", p.source));
    if let Some(p) = &profile {
        let here = tpar::profile::ProfileFingerprint::new(&topo, None, Backend::Cuda, world, if args.graph { CaptureMode::Graph } else { CaptureMode::Eager });
        if let Some(why) = p.mismatch(&here) {
            println!("# profile {}: does not apply to this topology and call ({why}); the plan ignores it", args.profile.as_ref().map(|x| x.display().to_string()).unwrap_or_default());
        }
        // The probe describes the links whatever the fingerprint says about world or mode.
        if let Some(with) = p.topology_with_probe(&topo) {
            links_from = with.probe.as_ref().map(|q| format!("links: the profile's probe ({})", q.source));
            topo = with;
        }
    }
    let sizes = parse_sizes(&args.bytes).map_err(crate::exit::refuse)?;
    let algos = parse_algos(args.algo.as_deref()).map_err(crate::exit::refuse)?;
    let params = Params {
        launch: if args.graph { Launch::Graph } else { Launch::Eager },
        nccl_p2p_across_sockets: args.nccl_p2p_sys,
        ..Params::default()
    };
    // Its errors are the flags' (a world the topology cannot hold): a refusal.
    let sim = Simulator::new(&topo, world, &params).map_err(|e| crate::exit::refuse(e.to_string()))?;

    // Which algorithms run here at all (decided at the first size; it does not depend on size).
    let (_, refused) = sim.predict_all(&algos, sizes[0]);
    let runnable: Vec<Algorithm> = algos.iter().copied().filter(|a| !refused.iter().any(|(r, _)| r == a)).collect();
    // What the plan refuses to run on this fabric (hierarchical on one island) is not shown
    // as a time: a communicator forced to it would refuse at init, and `tpar plan` says why.
    let gated: Vec<(Algorithm, String)> = runnable.iter().filter_map(|&a| plan_refuses(&topo, world, a).map(|why| (a, why))).collect();
    let runnable: Vec<Algorithm> = runnable.into_iter().filter(|a| !gated.iter().any(|(g, _)| g == a)).collect();
    if runnable.is_empty() {
        let why: Vec<String> = gated.iter().map(|(a, why)| format!("{a}: {why}")).collect();
        return Err(crate::exit::refuse(format!("none of the requested algorithms can run on {}{}", topo.name, if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) })));
    }

    println!(
        "# tpar sim: {} ({} of {} GPUs), {} launches{}",
        topo.name,
        world,
        topo.gpu_count(),
        if args.graph { "CUDA-graph" } else { "eager" },
        if args.nccl_p2p_sys { ", NCCL P2P across sockets" } else { "" }
    );
    println!("# {}", links_from.as_deref().unwrap_or("links: the link classes' assumed figures (no probe)"));
    println!("# predicted time per all-reduce, us (flow-level model; see docs/sim.md for its error bounds)");
    let mut header = format!("{:>10}", "size");
    for a in &runnable {
        header.push_str(&format!(" {:>13}", a.name()));
    }
    header.push_str(&format!("  {:<13} {:>9} {:<10} {:>9}  {:<22}", "sim pick", "vs nccl", "its from", "at bound", "tpar plan (sim us)"));
    println!("{header}");

    let mut records = Vec::new();
    let mut winners = Vec::new();
    let mut disagreements: Vec<String> = Vec::new();
    for &b in &sizes {
        let mut line = format!("{:>10}", human(b));
        let mut best: Option<(Algorithm, f64)> = None;
        let mut nccl = None;
        for &a in &runnable {
            let p = sim.predict(a, b).map_err(|e| e.to_string())?;
            line.push_str(&format!(" {:>13.2}", p.total_us));
            if a == Algorithm::Nccl {
                nccl = Some(p.total_us);
            }
            if best.map_or(true, |(_, t)| p.total_us < t) {
                best = Some((a, p.total_us));
            }
            records.push(SimRecord {
                topology: topo.name.clone(),
                algorithm: a,
                world,
                bytes: b,
                predicted_us: p.total_us,
            });
        }
        if let Some((a, t)) = best {
            let ratio = nccl.map(|n| format!("{:.2}x", n / t)).unwrap_or_else(|| "-".into());
            // Where the pick's time comes from, and its time with unmeasured figures at the
            // bound (docs/sim.md, "Unmeasured figures").
            let from = sim.provenance(a).map(|p| p.source.name()).unwrap_or("-");
            let bound = if a == Algorithm::Nccl { "-".to_string() } else { sim.predict_bound(a, b).map(|p| format!("{:.2}", p.total_us)).unwrap_or_else(|_| "-".into()) };
            line.push_str(&format!("  {:<13} {:>9} {:<10} {:>9}", a.name(), ratio, from, bound));
            winners.push((b, a));
        }
        let pl = planned_with(&topo, world, b, args.graph, profile.as_ref());
        let pl_us = match sim.predict(pl.algorithm, b) {
            Ok(p) => format!("{:.2}", p.total_us),
            Err(_) => "not simulated".into(),
        };
        line.push_str(&format!("  {} ({pl_us})", pl.algorithm));
        println!("{line}");
        // tpar plan and tpar sim never disagree without saying why.
        if best.is_some_and(|(a, _)| a != pl.algorithm) {
            disagreements.push(format!("# {}: tpar plan picks {} rather than the sim pick: {}", human_bytes(b as u64), pl.algorithm, pl.reason));
        }
    }
    for d in &disagreements {
        println!("{d}");
    }
    for (a, e) in &refused {
        println!("# {a}: not simulated: {e}");
    }
    for (a, why) in &gated {
        println!("# {a}: not runnable here (tpar plan refuses it): {why}");
    }
    println!(
        "# sim pick: the fastest simulated algorithm; its from: the least trusted figure its time rests on (profile, probe, published, assumed); at bound: its time with every unmeasured figure at {} GB/s per GPU, the worst published; tpar plan: what tpar::plan runs {}",
        tpar::sim::params::UNMEASURED_GPU_GBPS,
        if profile.is_some() { "with this profile" } else { "with no tuned profile" }
    );
    // What each algorithm's time rests on.
    for &a in runnable.iter().filter(|&&a| a != Algorithm::Nccl) {
        if let Ok(p) = sim.provenance(a) {
            let figs = p.describe();
            println!("# {a} rests on: {}", if figs.is_empty() { "no link figure".to_string() } else { figs.join("; ") });
        }
    }
    if args.steps {
        println!("# where the time goes, us: fixed (launch + kernel work) | step: time ...");
        for &b in &sizes {
            for &a in &runnable {
                let p = sim.predict(a, b).map_err(|e| e.to_string())?;
                let steps: Vec<String> = p.steps.iter().map(|(l, t)| format!("{l}: {t:.2}")).collect();
                println!(
                    "{:>10} {:<13} over {:<4} total {:>9.2} = fixed {:.2} | {}",
                    human(b),
                    a.name(),
                    p.transport.name(),
                    p.total_us,
                    p.fixed_us,
                    steps.join(" | ")
                );
            }
        }
    }
    let xs = crossovers(&winners);
    if xs.is_empty() {
        if let Some((_, a)) = winners.first() {
            println!("# crossovers: none; {a} is fastest at every size simulated");
        }
    } else {
        for (b, from, to) in xs {
            println!(
                "# crossover: {to} overtakes {from} by {} (sizes between the grid points not simulated)",
                human(b)
            );
        }
    }

    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&records).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("# wrote {} predictions to {}", records.len(), path.display());
    }
    if let Some(path) = &args.svg {
        let mut series: Vec<tpar::plot::Series> = Vec::new();
        for &a in &runnable {
            let points = records
                .iter()
                .filter(|r| r.algorithm == a)
                .map(|r| (r.bytes as f64, r.predicted_us))
                .collect();
            series.push(tpar::plot::Series {
                name: a.name().to_string(),
                points,
            });
        }
        let title = format!(
            "predicted all-reduce latency: {} ({world} ranks, {})",
            topo.name,
            if args.graph { "graph" } else { "eager" }
        );
        tpar::plot::series_svg(&title, &series, path).map_err(|e| e.to_string())?;
        println!("# wrote plot to {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("256").unwrap(), 256);
        assert_eq!(parse_size("42K").unwrap(), 43008);
        assert_eq!(parse_size("42KiB").unwrap(), 43008);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert!(parse_size("x").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(parse_sizes("4K,256,4K").unwrap(), vec![256, 4096]);
        assert!(parse_algos(Some("oneshot-push,bogus")).is_err());
    }
}
