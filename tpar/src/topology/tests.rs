//! Unit tests of the topology module (kept apart: mod.rs is the model).
use super::*;

#[test]
fn link_class_labels_round_trip() {
    for c in [
        LinkClass::SelfLink,
        LinkClass::NvLink { links: 18 },
        LinkClass::Pix,
        LinkClass::Pxb,
        LinkClass::Phb,
        LinkClass::Node,
        LinkClass::Sys,
    ] {
        assert_eq!(c.label().parse::<LinkClass>().unwrap(), c);
        let j = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<LinkClass>(&j).unwrap(), c);
    }
    assert!("NV0".parse::<LinkClass>().is_err());
    assert!("NVx".parse::<LinkClass>().is_err());
    assert!("QPI".parse::<LinkClass>().is_err());
}

#[test]
fn every_preset_round_trips_through_json_and_validates() {
    for name in presets::NAMES {
        let t = presets::by_name(name).unwrap();
        t.validate().unwrap();
        let back = Topology::from_json(&t.to_json()).unwrap();
        assert_eq!(back, t, "{name}");
        assert_eq!(back.hash(), t.hash(), "{name}");
        assert_eq!(Topology::load(name).unwrap(), t);
    }
}

#[test]
fn preset_hashes_differ_and_ignore_names() {
    let mut hashes: Vec<u64> = presets::NAMES.iter().map(|n| presets::by_name(n).unwrap().hash()).collect();
    hashes.sort();
    hashes.dedup();
    assert_eq!(hashes.len(), presets::NAMES.len());
    let mut t = presets::by_name("pcie-2").unwrap();
    let h = t.hash();
    t.name = "renamed".into();
    t.notes.push("a note".into());
    t.cpu.cores += 7;
    assert_eq!(t.hash(), h);
    t.links[0][1].p2p_read = false;
    assert_ne!(t.hash(), h);
    // A probe is a measurement, not identity: the hash ignores it, the digest does not.
    let mut t = presets::rtxpro6000_dualsocket_8();
    let (h, d) = (t.hash(), t.probe_digest());
    assert_ne!(d, 0);
    t.probe = None;
    assert_eq!(t.hash(), h);
    assert_eq!(t.probe_digest(), 0);
}

#[test]
fn validate_refuses_inconsistent_files() {
    let mut t = presets::by_name("pcie-2").unwrap();
    t.links[0][1].class = LinkClass::Sys;
    assert!(t.validate().is_err());
    let mut t = presets::by_name("pcie-2").unwrap();
    t.islands.pop();
    assert!(t.validate().is_err());
    let mut t = presets::by_name("pcie-2").unwrap();
    t.gpus[1].index = 5;
    assert!(t.validate().is_err());
    assert!(Topology::from_json("{").is_err());
    assert!(Topology::load("/nonexistent/topology.json").is_err());
}

#[test]
fn cpu_topology_has_no_gpus_and_discovery_never_panics() {
    let t = Topology::cpu();
    assert_eq!(t.gpu_count(), 0);
    assert!(t.cpu.cores >= 1 && t.cpu.numa_nodes >= 1);
    t.validate().unwrap();
    // On a machine without NVML this exercises the missing-library path.
    let d = Topology::discover();
    d.validate().unwrap();
    if d.gpu_count() == 0 {
        assert!(!d.notes.is_empty(), "a GPU-less discovery must say why");
    }
}

#[test]
fn islands_follow_sockets() {
    let t = presets::by_name("rtxpro6000-dualsocket-8").unwrap();
    assert_eq!(t.islands_of(8), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(t.islands_of(5), vec![vec![0, 1, 2, 3], vec![4]]);
    assert_eq!(t.islands_of(3), vec![vec![0, 1, 2]]);
    let h = presets::by_name("h200-nvswitch-8").unwrap();
    assert_eq!(h.islands.len(), 1);
    assert_eq!(h.islands[0].kind, IslandKind::Nvlink);
    let p = presets::by_name("pcie-2").unwrap();
    assert_eq!(p.islands[0].kind, IslandKind::Switch);
}
