//! `tpar plan`: what tpar would run for one all-reduce (or all-gather, reduce-scatter), and why — or, with `--table`, the
//! decision across sizes (8 B to 1 GiB) and world sizes (2 to 8) for a topology.
//!
//! Honours the `TPAR_*` variables (TPAR_ALGO, TPAR_TRANSPORT, TPAR_MAX_BYTES, TPAR_DISABLE,
//! TPAR_PROFILE) exactly as the library does at init.

use std::path::PathBuf;
use tpar::units::human_bytes;
use tpar::plan::{plan_collective, Backend, CaptureMode, Overrides, Plan, PlanInput};
use tpar::profile::ProfileFingerprint;
use tpar::{Collective, DType, Profile, Topology, Transport};

#[derive(clap::Args, Debug)]
#[command(after_help = "Settings read from the environment, as a communicator reads them at init:\n  \
    TPAR_ALGO=<algorithm>|auto   force an algorithm (refused if this fabric cannot run it)\n  \
    TPAR_TRANSPORT=p2p|host|shm|nccl|auto\n  \
    TPAR_MAX_BYTES=<size>        NCCL above this size\n  \
    TPAR_DISABLE=1               always NCCL\n  \
    TPAR_PROFILE=<file>          tuned profile (same as --profile)\n  \
    TPAR_BLOCKS=<1 to 64>|auto   thread blocks per kernel call (for measuring)\n  \
    TPAR_CHECK_CALLS=0           stop comparing calls across ranks on the GPU\n  \
    TPAR_HOST_PROTOCOL=flags|sentinel|auto  push kernels' protocol over the host transport\n\n\
Examples:\n  \
    tpar plan -t rtxpro6000-pcie-switch-8 --world 8 --bytes 42K -d bfloat16\n  \
    tpar plan -t l40s-direct-8 --table --graph\n\n\
docs/plan.md explains every threshold.")]
pub struct PlanArgs {
    /// A preset (h200-nvswitch-8, rtxpro6000-pcie-switch-8, rtxpro6000-dualsocket-8,
    /// l40s-direct-8, rtx4090-nop2p-4, pcie-2), `cpu`, `discover` (this machine), or a
    /// topology JSON file.
    #[arg(long, short = 't', default_value = "discover", value_name = "NAME|FILE")]
    pub topology: String,
    /// Ranks in the communicator (one GPU each, ordinals 0..N). Required without --table.
    #[arg(long, value_name = "N")]
    pub world: Option<usize>,
    /// Bytes per rank; suffixes as nccl-tests: 42K, 1M, 1G. Required without --table.
    #[arg(long, short = 'b', value_name = "BYTES", value_parser = parse_size)]
    pub bytes: Option<u64>,
    /// Element type: float, half or bfloat16.
    #[arg(long, short = 'd', default_value = "bfloat16", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Plan for a call captured in a CUDA graph (default: eager launches).
    #[arg(long)]
    pub graph: bool,
    /// The collective: all-reduce, all-gather or reduce-scatter (nccl-tests' names taken too).
    /// For the all-gather and the reduce-scatter, --bytes is per rank: the all-gather's input,
    /// the reduce-scatter's output
    #[arg(long, default_value = "all-reduce", value_parser = crate::harness::parse_collective)]
    pub collective: Collective,
    /// cpu or cuda. Default: cuda when the topology has GPUs, else cpu.
    #[arg(long, value_parser = parse_backend)]
    pub backend: Option<Backend>,
    /// A tuned profile (TOML, from `tpar tune`). Default: $TPAR_PROFILE.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Print the plan as JSON: {algorithm, transport, blocks, reason, predicted_us, nccl_us,
    /// source, nccl_source, bound_us, instead_of}.
    #[arg(long, conflicts_with = "table")]
    pub json: bool,
    /// Print the decision for sizes 8 B to 1 GiB (rows) and world sizes 2 to 8 (columns), then
    /// per world each pick's predicted time, NCCL's, the gain and where each number comes
    /// from (with --world N: that world's only).
    #[arg(long)]
    pub table: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::harness::size(s).map(|b| b as u64)
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(|e: tpar::Error| e.to_string())
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse().map_err(|e: tpar::Error| e.to_string())
}

pub fn run(args: PlanArgs) -> Result<(), String> {
    let topology = Topology::load(&args.topology).map_err(|e| e.to_string())?;
    let overrides = Overrides::from_env().map_err(|e| e.to_string())?;
    let profile_path = args.profile.clone().or_else(|| overrides.profile.clone());
    let profile = match &profile_path {
        Some(p) => Some(Profile::load(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let backend = args.backend.unwrap_or(if topology.gpu_count() > 0 { Backend::Cuda } else { Backend::Cpu });
    let capture = if args.graph { CaptureMode::Graph } else { CaptureMode::Eager };
    let input = |world: usize, bytes: u64| PlanInput {
        topology: &topology,
        world,
        bytes,
        dtype: args.dtype,
        capture,
        backend,
        profile: profile.as_ref(),
        overrides: &overrides,
    };

    let c = args.collective;
    let plan = |i: &PlanInput<'_>| plan_collective(c, i);
    if args.table {
        let decide = |w, b| plan(&input(w, b));
        let worlds: Vec<usize> = match args.world {
            Some(w) => vec![w],
            None => {
                print!("{}", table(&topology, args.dtype, capture, backend, decide));
                // Worlds past the topology's GPUs are NCCL by rule: the matrix says so.
                let most = if backend == Backend::Cuda && topology.gpu_count() > 0 { topology.gpu_count() } else { usize::MAX };
                TABLE_WORLDS.filter(|&w| w <= most).collect()
            }
        };
        for w in worlds {
            print!("\n{}", detail(w, decide));
        }
        return Ok(());
    }
    let world = args.world.ok_or_else(|| crate::exit::refuse("--world N is required (or use --table)"))?;
    // Every world a communicator accepts (2 to 16), even beyond the topology's GPUs: the
    // plan's own rule answers those (NCCL, and the reason says why; docs/plan.md).
    crate::harness::check_world(world)?;
    let bytes = args.bytes.ok_or_else(|| crate::exit::refuse("--bytes B is required (or use --table)"))?;
    if let Err(e) = overrides.validate(&topology, world, backend) {
        eprintln!("tpar: warning: a communicator would refuse these settings at init: {e}");
    }
    if let Some(prof) = &profile {
        let here = ProfileFingerprint::new(&topology, None, backend, world, capture);
        match prof.warn_if_mismatched(&here) {
            Some(why) => eprintln!("tpar: warning: profile ignored: {why}"),
            None => {
                for line in prof.describe() {
                    eprintln!("tpar: profile: {line}");
                }
            }
        }
    }
    let p = plan(&input(world, bytes));
    if args.json {
        println!("{}", serde_json::to_string(&p).map_err(|e| e.to_string())?);
    } else {
        let what = if c == Collective::AllReduce { String::new() } else { format!("{c} of ") };
        let per = if c == Collective::AllReduce { "" } else { " per rank" };
        println!(
            "{what}{}{per} x {} ranks, {}, {}, {} backend on {}:",
            human_bytes(bytes),
            world,
            args.dtype,
            capture,
            backend,
            topology.name
        );
        println!("  algorithm  {}", p.algorithm);
        println!("  transport  {}", p.transport);
        println!("  blocks     {}", p.blocks);
        println!("  reason     {}", p.reason);
        let us = |v: Option<f64>| v.map(|x| format!("{x:.1} us")).unwrap_or_else(|| "-".into());
        let src = |v: Option<tpar::plan::Source>| v.map(|x| x.name()).unwrap_or("-");
        if p.predicted_us.is_some() || p.source.is_some() {
            println!("  predicted  {} ({})", us(p.predicted_us), src(p.source));
        }
        if p.nccl_us.is_some() {
            let gain = p.gain().map(|g| format!(", {g:.2}x")).unwrap_or_default();
            println!("  nccl       {} ({}){gain}", us(p.nccl_us), src(p.nccl_source));
        }
    }
    Ok(())
}

/// Sizes of the table: powers of two from 8 B to 1 GiB.
pub fn table_sizes() -> impl Iterator<Item = u64> {
    (3..=30).map(|k| 1u64 << k)
}

/// World sizes of the table.
pub const TABLE_WORLDS: std::ops::RangeInclusive<usize> = 2..=8;

fn cell(p: &Plan) -> String {
    let star = if p.instead_of.is_some() { "*" } else { "" };
    match p.transport {
        Transport::Host => format!("{}/host{star}", p.algorithm),
        Transport::P2p | Transport::Shm | Transport::Nccl => format!("{}{star}", p.algorithm),
    }
}

/// One world's decisions with their numbers: the pick, its predicted time, NCCL's, the gain,
/// and where each comes from; for a NCCL that replaced a tpar kernel resting on an unmeasured
/// figure, which kernel and its time at the bound (docs/plan.md, "Where each number comes
/// from"). Deterministic (golden-tested).
fn detail(world: usize, decide: impl Fn(usize, u64) -> Plan) -> String {
    let us = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
    let src = |v: Option<tpar::plan::Source>| v.map(|x| x.name().to_string()).unwrap_or_else(|| "-".into());
    let mut out = format!("# world {world}: the pick, its predicted time per call (us), NCCL's, the gain, and where each comes from\n");
    out.push_str(&format!("{:<10}{:<19}{:>9}{:>9}{:>8}  {:<10} {:<10} {}\n", "bytes", "pick", "us", "nccl us", "gain", "pick from", "nccl from", "note"));
    for s in table_sizes() {
        let p = decide(world, s);
        let gain = p.gain().map(|g| format!("{g:.2}x")).unwrap_or_else(|| "-".into());
        let note = match (&p.instead_of, p.bound_us) {
            (Some(u), _) => format!("{} {:.1} us rests on unmeasured figures: {:.1} us at the bound", u.algorithm, u.us, u.bound_us),
            (None, Some(b)) => format!("rests on unmeasured figures; holds at the bound: {b:.1} us"),
            (None, None) => String::new(),
        };
        let name = cell(&p);
        let line = format!("{:<10}{:<19}{:>9}{:>9}{:>8}  {:<10} {:<10} {note}", human_bytes(s).replace(' ', ""), name, us(p.predicted_us), us(p.nccl_us), gain, src(p.source), src(p.nccl_source));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("# pick from: the least trusted figure the pick's time rests on (profile, probe, published, assumed); \"holds at the bound\": it beats NCCL even with its unmeasured figures at the worst rate published for any PCIe box; nccl*: NCCL instead of a tpar kernel that would not\n");
    out
}

/// The decision matrix, deterministic (golden-tested).
fn table(t: &Topology, dtype: DType, capture: CaptureMode, backend: Backend, decide: impl Fn(usize, u64) -> Plan) -> String {
    // No topology hash in the header: the golden tables guard decisions, and a new
    // descriptive field in Topology must not make them fail.
    let mut out = format!("# {} ({} GPUs), {}, {}, {} backend\n", t.name, t.gpu_count(), dtype, capture, backend);
    let width = 20;
    out.push_str(&format!("{:<10}", "bytes"));
    for w in TABLE_WORLDS {
        out.push_str(&format!("{:<width$}", format!("world {w}")));
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    for s in table_sizes() {
        out.push_str(&format!("{:<10}", human_bytes(s).replace(' ', "")));
        for w in TABLE_WORLDS {
            out.push_str(&format!("{:<width$}", cell(&decide(w, s))));
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    out.push_str("# cells: algorithm; /host = through pinned host memory (no P2P); nccl = NCCL's own transport; nccl* = NCCL because the fastest tpar kernel rests on an unmeasured figure\n");
    out
}
