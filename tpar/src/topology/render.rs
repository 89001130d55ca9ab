//! The fabric as text, the way `nvidia-smi topo -m` shows it: the link matrix, P2P read /
//! write / atomics matrices, the GPUs (name, PCI bus id, memory), PCIe switches, islands, the
//! CPU, notes, the link probe when there is one, and a legend. `tpar topo` prints it, and so
//! does `tpar doctor` (and `python -m tpar.doctor`), so there is one rendering.
//!
//! Owns: the text layout. Must never: decide anything or discover anything (it renders the
//! [`Topology`] it is handed).

use super::{Link, Topology};

/// A square matrix with GPU headers; `cell(i, j)` gives each entry.
fn matrix(out: &mut String, title: &str, n: usize, cell: impl Fn(usize, usize) -> String) {
    let w = (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| cell(i, j).len()).max().unwrap_or(1).max(5) + 1;
    out.push_str(title);
    out.push('\n');
    out.push_str(&format!("{:<8}", ""));
    for j in 0..n {
        out.push_str(&format!("{:<w$}", format!("GPU{j}")));
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    for i in 0..n {
        out.push_str(&format!("{:<8}", format!("GPU{i}")));
        for j in 0..n {
            out.push_str(&format!("{:<w$}", cell(i, j)));
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    out.push('\n');
}

fn yes(b: bool) -> &'static str {
    if b {
        "OK"
    } else {
        "NS"
    }
}

/// The fabric as `tpar topo` prints it.
pub fn text(t: &Topology) -> String {
    let mut out = String::new();
    let n = t.gpu_count();
    out.push_str(&format!("Topology {} ({} GPUs, fingerprint {:016x})\n\n", t.name, n, t.hash()));
    let cpu = format!(
        "CPU: {} logical cores, {} NUMA node(s), {} socket(s){}\n",
        t.cpu.cores,
        t.cpu.numa_nodes,
        t.cpu.sockets,
        t.cpu.inter_socket_gbps.map(|g| format!(", {g:.1} GB/s across sockets for GPU peer traffic")).unwrap_or_default()
    );
    if n == 0 {
        out.push_str("No GPU found: CPU ranks only (tpar's shm backend).\n");
        out.push_str(&cpu);
        for note in &t.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        return out;
    }
    matrix(&mut out, "Links", n, |i, j| t.links[i][j].class.label());
    let p2p = |name: &str, f: fn(&Link) -> bool, out: &mut String| {
        matrix(out, name, n, |i, j| if i == j { "X".to_string() } else { yes(f(&t.links[i][j])).to_string() });
    };
    p2p("P2P write", |l| l.p2p_write, &mut out);
    p2p("P2P read", |l| l.p2p_read, &mut out);
    p2p("P2P atomics", |l| l.p2p_atomics, &mut out);

    out.push_str("GPUs\n");
    for g in &t.gpus {
        let sw = g.switch.and_then(|s| t.switches.get(s)).map(|s| s.name.clone()).unwrap_or_else(|| "root port".into());
        let nv = if g.nvlink_gbps > 0.0 { format!(", NVLink {:.0} GB/s", g.nvlink_gbps) } else { String::new() };
        out.push_str(&format!(
            "  GPU{:<3} {}  {}  {}  PCIe Gen{} x{} ({:.1} GB/s){nv}  socket {}  NUMA {}  {}  {:.0} GiB\n",
            g.index,
            g.name,
            g.uuid,
            g.pci_bus_id,
            g.pcie_gen,
            g.pcie_width,
            g.pcie_gbps,
            g.socket,
            g.numa_node.map(|n| n.to_string()).unwrap_or_else(|| "?".into()),
            sw,
            g.memory_bytes as f64 / (1u64 << 30) as f64
        ));
    }
    if !t.switches.is_empty() {
        out.push_str("\nPCIe switches\n");
        for s in &t.switches {
            let gpus: Vec<String> = t.gpus.iter().filter(|g| g.switch == Some(s.id)).map(|g| format!("GPU{}", g.index)).collect();
            out.push_str(&format!(
                "  {:<8} chip {}  socket {}  uplink {:.1} GB/s  ACS redirect {}  [{}]\n",
                s.name,
                s.chip,
                s.socket,
                s.uplink_gbps,
                if s.acs_redirect { "on" } else { "off" },
                gpus.join(" ")
            ));
        }
    }
    out.push_str("\nIslands\n");
    for (k, island) in t.islands.iter().enumerate() {
        let gpus: Vec<String> = island.gpus.iter().map(|g| format!("GPU{g}")).collect();
        let kind = serde_json::to_value(island.kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        out.push_str(&format!("  island {k} ({kind}): {}\n", gpus.join(" ")));
    }
    out.push('\n');
    out.push_str(&cpu);
    for note in &t.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    if let Some(p) = &t.probe {
        out.push('\n');
        out.push_str(&p.table());
    }
    out.push_str("\nLegend:\n");
    for (k, v) in [
        ("X", "the GPU itself"),
        ("SYS", "through PCIe and the inter-socket link (QPI/UPI/xGMI)"),
        ("NODE", "through PCIe and between host bridges of one NUMA node"),
        ("PHB", "through PCIe and a host bridge (the CPU)"),
        ("PXB", "through several PCIe bridges, no host bridge"),
        ("PIX", "through at most one PCIe bridge (one switch)"),
        ("NV#", "through # bonded NVLinks (directly or via NVSwitch)"),
        ("OK/NS", "P2P supported / not supported"),
    ] {
        out.push_str(&format!("  {k:<6} = {v}\n"));
    }
    out
}
