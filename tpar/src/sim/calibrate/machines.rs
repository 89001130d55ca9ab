//! The machines calibration figures were measured on that no preset describes, built as the
//! presets build theirs (named in docs/sim.md's calibration section).

use crate::topology::{pcie_gbps, presets, CpuInfo, Gpu, Link, LinkClass, PcieSwitch, Topology};

/// `n` GPUs of one kind on socket 0, all on `switch` (or root ports), as presets build them.
fn gpus(machine: &str, n: usize, name: &str, gen: u32, switch: Option<usize>) -> Vec<Gpu> {
    presets::gpus(machine, name, 0, gen, &vec![0; n], &vec![switch; n], 0.0)
}

fn build(name: &str, gpus: Vec<Gpu>, switches: Vec<PcieSwitch>, class: impl Fn(usize, usize) -> LinkClass) -> Topology {
    let links = presets::matrix(gpus.len(), |i, j| Link { class: class(i, j), p2p_read: true, p2p_write: true, p2p_atomics: false });
    let cpu = CpuInfo { cores: 64, numa_nodes: 1, sockets: 1, inter_socket_gbps: None };
    presets::finish(name, gpus, links, switches, cpu, &["calibration machine (sim::calibrate), not a preset"])
}

/// `rtxpro6000-pcie-switch-8` without its preset probe: the probe carries the very flag
/// latencies group P tests (the WRX90 box's published figures), so the calibration times that
/// box from the model's own hop latencies.
pub(super) fn switch_box() -> Topology {
    let mut t = presets::rtxpro6000_pcie_switch_8();
    t.probe = None;
    t
}

/// `n` Gen5 RTX PRO 6000 on CPU root ports of one socket (rtx6kpro's one-socket boxes).
pub fn rtxpro6000_root_ports(n: usize) -> Topology {
    let machine = format!("rtxpro6000-1socket-{n}");
    build(&machine, gpus(&machine, n, "RTX PRO 6000", 5, None), Vec::new(), |_, _| LinkClass::Node)
}

/// 8 Gen4 consumer GPUs on CPU root ports of one socket, P2P off (stock driver).
pub fn consumer_nop2p_8(name: &str) -> Topology {
    let machine = format!("{name}-nop2p-8");
    let mut t = build(&machine, gpus(&machine, 8, name, 4, None), Vec::new(), |_, _| LinkClass::Node);
    for (i, row) in t.links.iter_mut().enumerate() {
        for (j, l) in row.iter_mut().enumerate() {
            if i != j {
                *l = Link::new(LinkClass::Node, false);
            }
        }
    }
    t.islands = Topology::compute_islands(&t.gpus, &t.links);
    t
}

/// 4 Gen3 V100 behind one PCIe switch (the sglang-V100 fork's box).
pub fn v100_switch_4() -> Topology {
    let g = gpus("v100-switch-4", 4, "V100 PCIe", 3, Some(0));
    let sw = PcieSwitch {
        id: 0,
        name: "PEX".into(),
        chip: 0,
        socket: 0,
        uplink_gbps: pcie_gbps(3, 16),
        acs_redirect: false,
    };
    build("v100-switch-4", g, vec![sw], |_, _| LinkClass::Pix)
}

/// 8 Gen5 RTX PRO 6000 on CPU root ports, four per socket of a two-socket host (the
/// "Festr, dual Turin, direct-attach" reference box of the rtx6kpro asus-esc8000a doc).
pub fn rtxpro6000_two_socket_root_ports() -> Topology {
    let machine = "rtxpro6000-2socket-rootports-8";
    let sockets = [0, 0, 0, 0, 1, 1, 1, 1];
    let g = presets::gpus(machine, "RTX PRO 6000", 0, 5, &sockets, &[None; 8], 0.0);
    let links = presets::matrix(8, |i, j| Link { class: if i / 4 == j / 4 { LinkClass::Node } else { LinkClass::Sys }, p2p_read: true, p2p_write: true, p2p_atomics: false });
    let cpu = CpuInfo { cores: 128, numa_nodes: 2, sockets: 2, inter_socket_gbps: None };
    presets::finish(machine, g, links, Vec::new(), cpu, &["calibration machine (sim::calibrate), not a preset"])
}
