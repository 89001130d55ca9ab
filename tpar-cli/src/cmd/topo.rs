//! `tpar topo`: prints the fabric as `nvidia-smi topo -m` does — the link matrix, then P2P
//! read / write / atomics matrices, switches, islands and a legend — or its JSON.

use tpar::topology::Topology;

#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// A preset (h200-nvswitch-8, rtxpro6000-pcie-switch-8, rtxpro6000-dualsocket-8,
    /// l40s-direct-8, rtx4090-nop2p-4, pcie-2), `cpu`, `discover` (this machine, through
    /// NVML), or the path of a topology JSON file.
    #[arg(long, short = 't', default_value = "discover", value_name = "NAME|FILE")]
    pub topology: String,
    /// Print the topology as JSON (the format `--topology FILE` reads).
    #[arg(long)]
    pub json: bool,
    /// Measure this machine's links (a few seconds): SM store, SM load and copy-engine
    /// bandwidth between every pair of GPUs (and to host memory), alone and under
    /// all-to-all load, and one-way flag latency. The figures go into the topology (and its
    /// JSON), where the plan and the simulator use them instead of a link class's guess.
    /// (`tpar tune` runs the same probe and keeps it in the profile.) Presets instead carry
    /// their machines' published figures, where there are any (--published lists them).
    #[arg(long)]
    pub probe: bool,
    /// Print the published link figures the PCIe presets carry (with their sources) as
    /// docs/topology.md shows them, then the published tests under load that the plan and
    /// the simulator also count as published (each `published` label rests on a row of one
    /// of the two tables), and exit.
    #[arg(long)]
    pub published: bool,
}

pub fn run(args: TopoArgs) -> Result<(), String> {
    if args.published {
        print!("{}", tpar::topology::presets::published_markdown());
        print!("\n{}", evidence_markdown());
        return Ok(());
    }
    let mut t = Topology::load(&args.topology).map_err(|e| e.to_string())?;
    if args.probe {
        probe_into(&mut t, &args.topology)?;
    }
    if args.json {
        println!("{}", t.to_json());
    } else {
        print!("{}", render(&t));
    }
    Ok(())
}

/// The published tests of an operation under load on a preset's exact box
/// (`presets::EVIDENCE`): figures the plan and the simulator label `published` although no
/// rate under all-to-all load is in the preset's probe (the table above).
fn evidence_markdown() -> String {
    use tpar::topology::presets::{Pairs, EVIDENCE};
    let mut out = String::from("Published tests under load (what makes these operations `published` in `tpar plan`, `tpar sim` and `tpar doctor`):\n\n");
    out.push_str("| preset | pairs | operation under load | what was measured | source |\n|---|---|---|---|---|\n");
    for e in EVIDENCE {
        let pairs = match e.pairs {
            Pairs::All => "all",
            Pairs::SameSwitch => "same switch",
            Pairs::AcrossSwitches => "across switches or root ports, one socket",
            Pairs::AcrossSockets => "across sockets",
        };
        out.push_str(&format!("| `{}` | {pairs} | {} | {} | {} |\n", e.preset, e.op.name(), e.what, e.source));
    }
    out
}

/// Runs the link probe on this machine's GPUs and stores it in `t`.
#[cfg(feature = "cuda")]
fn probe_into(t: &mut Topology, source: &str) -> Result<(), String> {
    if source != "discover" {
        return Err(format!("--probe measures this machine; it cannot be combined with --topology {source}"));
    }
    let p = tpar::cuda::probe::run(None, &tpar::cuda::probe::ProbeOptions::default()).map_err(|e| e.to_string())?;
    eprint!("{}", p.table());
    t.probe = Some(p);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn probe_into(_: &mut Topology, _: &str) -> Result<(), String> {
    Err("this tpar was built without the `cuda` feature: the link probe needs it".into())
}

/// The text report (the library's one rendering, `tpar::topology::render`).
pub fn render(t: &Topology) -> String {
    tpar::topology::render::text(t)
}
