//! The dispatch plan: one pure, total function from (topology, world, bytes, dtype, capture
//! mode, backend, tuned profile, overrides) to a [`Plan`] — algorithm, transport, blocks and
//! a human-readable reason naming the numbers it used.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the decision ([`plan`]), the debug log, the digest ranks compare ([`plan_fingerprint`]) |
//! | [`cache`] | one communicator's memo of decisions per (dtype, size, capture mode) |
//! | [`feasibility`] | what runs here: the registry's gates plus the fabric's conditions (P2P, islands) |
//! | [`floors`] | thresholds (each with where its number came from) and floor arithmetic |
//! | [`overrides`] | `TPAR_*` settings and their validation |
//! | [`profile`] | tuned profiles (TOML) and their fingerprint |
//! Must never: do I/O inside [`plan`] (it reads no environment, no file, no clock), return an
//! algorithm whose preconditions do not hold on the fabric (an override or profile that asks
//! for one is ignored, and the reason says so; [`Overrides::validate`] turns it into an error
//! at init), or have a match arm that could mean "nothing".
//!
//! Ranks map to CUDA ordinals `0..world`: the plan for world W on a topology of G >= W GPUs
//! looks at the first W GPUs only. World W > G on the CUDA backend means ranks this topology
//! does not describe (other hosts, or GPUs shared by ranks): NCCL, with that reason.

pub mod cache;
pub mod feasibility;
pub mod floors;
pub mod overrides;
pub mod profile;
pub(crate) mod sim_cost;

use crate::dtype::DType;
use crate::topology::Topology;
use crate::units::fnv1a64;
use feasibility::{check, natural_transport, transport_usable, Fabric};
use floors::*;
use profile::{Profile, ProfileFingerprint};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};

pub use crate::kinds::{Algorithm, Backend, CaptureMode, Transport};
pub use crate::units::{human_bytes, parse_bytes};
pub use overrides::{HostProtocol, Overrides, MAX_KERNEL_BLOCKS};

// ---------------------------------------------------------------------------------------
// Inputs and output.
// ---------------------------------------------------------------------------------------

/// Everything the decision depends on.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub topology: &'a Topology,
    /// Ranks in the communicator. 0 is planned as 1 (the communicator refuses 0 at init).
    pub world: usize,
    /// Bytes per rank (count x dtype size).
    pub bytes: u64,
    pub dtype: DType,
    pub capture: CaptureMode,
    pub backend: Backend,
    pub profile: Option<&'a Profile>,
    pub overrides: &'a Overrides,
}

/// The decision. JSON: `{"algorithm", "transport", "blocks", "reason"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub algorithm: Algorithm,
    pub transport: Transport,
    /// Thread blocks (CTAs) per rank for tpar's kernels; 1 on the CPU backend (one thread
    /// per rank); 0 for NCCL, which picks its own channels.
    pub blocks: u32,
    /// Why, naming the numbers used.
    pub reason: String,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} over {}, {} blocks: {}", self.algorithm, self.transport, self.blocks, self.reason)
    }
}

// ---------------------------------------------------------------------------------------
// The decision.
// ---------------------------------------------------------------------------------------

/// Decides how to run one all-reduce. Pure and total: every input yields a plan whose
/// algorithm and transport are correct on the fabric.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let world = input.world.max(1);
    let f = Fabric::of(input.topology, world, input.backend);
    let mut notes: Vec<String> = Vec::new();
    if input.world == 0 {
        notes.push("world 0 planned as 1 (the communicator refuses 0)".into());
    }
    let o = input.overrides;
    let s = input.bytes;

    let finish = |mut p: Plan, mut notes: Vec<String>| {
        if let Some(b) = o.blocks {
            if matches!(p.transport, Transport::P2p | Transport::Host) {
                notes.push(format!("TPAR_BLOCKS={b} (default {})", p.blocks));
                p.blocks = b;
            }
        }
        if !notes.is_empty() {
            p.reason = format!("{}; {}", p.reason, notes.join("; "));
        }
        p
    };

    // 1. Settings that send everything (or everything large) to NCCL.
    match input.backend {
        Backend::Cpu => {
            if o.disable {
                notes.push("TPAR_DISABLE ignored: the CPU backend has no NCCL (validate refuses it)".into());
            }
            if o.max_bytes.is_some() {
                notes.push("TPAR_MAX_BYTES ignored: the CPU backend has no NCCL (validate refuses it)".into());
            }
        }
        Backend::Cuda => {
            if o.disable {
                return finish(nccl("TPAR_DISABLE=1: always NCCL".into()), notes);
            }
            if let Some(m) = o.max_bytes {
                if s > m {
                    return finish(nccl(format!("{} > TPAR_MAX_BYTES={}: NCCL", human_bytes(s), human_bytes(m))), notes);
                }
            }
            if !f.fits() {
                let why = format!("world {world} exceeds the {} GPUs of this topology (ranks on other hosts or sharing GPUs): NCCL", f.gpus);
                if let Some(a) = o.algorithm.filter(|&a| a != Algorithm::Nccl) {
                    notes.push(format!("TPAR_ALGO={a} ignored: only NCCL spans them (validate refuses it)"));
                }
                return finish(nccl(why), notes);
            }
        }
    }

    // 2. A forced algorithm and/or transport.
    if let Some(a) = o.algorithm {
        let t = o.transport.unwrap_or_else(|| natural_transport(a, &f));
        match check(a, t, &f) {
            Ok(()) => return finish(make(a, t, s, &f, format!("TPAR_ALGO={a} forced")), notes),
            Err(why) => notes.push(format!("TPAR_ALGO={a} over {t} ignored: {why} (validate refuses it)")),
        }
    }
    let mut forced_transport = None;
    if let Some(t) = o.transport {
        match transport_usable(t, &f) {
            Ok(()) => forced_transport = Some(t),
            Err(why) => notes.push(format!("TPAR_TRANSPORT={t} ignored: {why} (validate refuses it)")),
        }
    }
    if forced_transport == Some(Transport::Nccl) {
        return finish(nccl("TPAR_TRANSPORT=nccl: NCCL".into()), notes);
    }

    // 3. A tuned profile, when it was measured here.
    let mut reads_win = false;
    // The topology with the profile's link probe, when the profile carries one and the
    // topology does not: the defaults below then see the measured links.
    let mut probed: Option<Topology> = None;
    if let Some(p) = input.profile {
        let here = ProfileFingerprint::of_input(input.topology, world, input.backend, input.capture);
        match p.mismatch(&here) {
            Some(why) => notes.push(format!("profile ignored: {why}")),
            None => {
                reads_win = p.reads_beat_writes;
                probed = p.topology_with_probe(input.topology);
                match p.lookup(input.dtype, s) {
                    Some(bucket) => {
                        let a = bucket.algorithm;
                        let t = forced_transport.unwrap_or_else(|| natural_transport(a, &f));
                        match check(a, t, &f) {
                            Ok(()) => {
                                let why = format!(
                                    "profile: {a} fastest for {} <= {} ({} ranks, {}, median {:.1} us)",
                                    human_bytes(s),
                                    human_bytes(bucket.max_bytes),
                                    world,
                                    input.dtype,
                                    bucket.median_us
                                );
                                return finish(make(a, t, s, &f, why), notes);
                            }
                            Err(why) => notes.push(format!("profile's {a} ignored: {why}")),
                        }
                    }
                    None => notes.push(format!("profile has no bucket for {} {} at {} ranks: defaults", human_bytes(s), input.dtype, world)),
                }
            }
        }
    }

    // 4. Defaults from the fabric.
    if probed.is_some() {
        notes.push("links from the profile's probe".into());
    }
    let p = default_plan(s, &f, forced_transport, reads_win, probed.as_ref().unwrap_or(input.topology), input.capture);
    finish(p, notes)
}

fn nccl(reason: String) -> Plan {
    Plan { algorithm: Algorithm::Nccl, transport: Transport::Nccl, blocks: 0, reason }
}

/// Builds a plan for a checked (algorithm, transport), choosing blocks.
fn make(a: Algorithm, t: Transport, s: u64, f: &Fabric, reason: String) -> Plan {
    let blocks = match t {
        Transport::Nccl => 0,
        Transport::Shm => 1,
        Transport::P2p if f.nvlink => kernel_blocks(s, BlockClass::NvLink),
        Transport::P2p | Transport::Host => kernel_blocks(s, BlockClass::Pcie),
    };
    Plan { algorithm: a, transport: t, blocks, reason }
}

/// The default decision for a feasible fabric (world fits, backend known).
fn default_plan(s: u64, f: &Fabric, forced: Option<Transport>, reads_win: bool, topo: &Topology, capture: CaptureMode) -> Plan {
    let n = f.world;
    let size = human_bytes(s);
    // Pull only where a measured profile says reads beat writes, and reads are possible.
    let pull = |a: Algorithm| -> (Algorithm, &'static str) {
        let alt = match a {
            Algorithm::OneshotPush => Algorithm::OneshotPull,
            Algorithm::TwoshotPush => Algorithm::TwoshotPull,
            Algorithm::OneshotPull
            | Algorithm::TwoshotPull
            | Algorithm::StagedPush
            | Algorithm::Hierarchical
            | Algorithm::GatherBcast
            | Algorithm::Nccl
            | Algorithm::CeRing => a,
        };
        let t = forced.unwrap_or_else(|| natural_transport(alt, f));
        if reads_win && alt != a && check(alt, t, f).is_ok() {
            (alt, " (pull: the profile measured reads beating writes)")
        } else {
            (a, "")
        }
    };
    match f.backend {
        Backend::Cpu => {
            if n == 1 {
                return make(Algorithm::OneshotPush, Transport::Shm, s, f, "world 1: copy".into());
            }
            let base = if s <= CPU_ONESHOT_MAX_BYTES { Algorithm::OneshotPush } else { Algorithm::TwoshotPush };
            let (a, why) = pull(base);
            let cmp = if s <= CPU_ONESHOT_MAX_BYTES { "<=" } else { ">" };
            let reason = format!("CPU ranks over shm: {size} {cmp} {} (CPU one-shot limit, measured on CPU ranks){why}", human_bytes(CPU_ONESHOT_MAX_BYTES));
            make(a, Transport::Shm, s, f, reason)
        }
        Backend::Cuda => {
            if n == 1 {
                let t = forced.unwrap_or(Transport::P2p);
                return make(Algorithm::OneshotPush, t, s, f, "world 1: copy".into());
            }
            let use_host = forced == Some(Transport::Host) || !f.p2p_write;
            if use_host {
                let b = f.p2p_gbps();
                let (h, c) = (host_floor_us(n, s, b), nccl_floor_us(n, s, b));
                let why_host = match f.missing_write {
                    Some((i, j)) if forced != Some(Transport::Host) => format!("no P2P (GPU{i} cannot write GPU{j})"),
                    Some(_) | None => "TPAR_TRANSPORT=host".to_string(),
                };
                let numbers = format!("host floor {h:.1} us vs NCCL floor {c:.1} us at {size}, {n} ranks, {b:.1} GB/s");
                return match check(Algorithm::OneshotPush, Transport::Host, f) {
                    Err(why) => nccl(format!("{why_host}: one-shot push through host memory cannot run here ({why}): NCCL")),
                    Ok(()) if h <= c => {
                        make(Algorithm::OneshotPush, Transport::Host, s, f, format!("{why_host}: one-shot push through host memory: {numbers}"))
                    }
                    Ok(()) => nccl(format!("{why_host}: {numbers}: NCCL")),
                };
            }
            if f.nvlink {
                let limit = if n <= 2 {
                    NVLINK_ONESHOT_MAX_BYTES_2
                } else if n <= 4 {
                    NVLINK_ONESHOT_MAX_BYTES_4
                } else {
                    NVLINK_ONESHOT_MAX_BYTES_8
                };
                let lim = human_bytes(limit);
                let max = human_bytes(NVLINK_CUSTOM_MAX_BYTES);
                return if s <= limit {
                    let (a, why) = pull(Algorithm::OneshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {size} <= {lim} one-shot limit{why}"))
                } else if s <= NVLINK_CUSTOM_MAX_BYTES {
                    let (a, why) = pull(Algorithm::TwoshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {lim} < {size} <= {max}: two-shot{why}"))
                } else {
                    nccl(format!("NVLink, {n} ranks: {size} > {max}: bandwidth-bound, NCCL"))
                };
            }
            let max = human_bytes(PCIE_CUSTOM_MAX_BYTES);
            if s > PCIE_CUSTOM_MAX_BYTES {
                return nccl(format!("PCIe P2P, {n} ranks: {size} > {max}: no latency left to win, NCCL{}", ce_ring_note(s, f, topo, capture)));
            }
            pcie_by_simulator(s, f, forced, reads_win, topo, capture)
        }
    }
}

/// What the simulator says of `ce-ring` (copy engines) for a large PCIe call the default
/// plan sends to NCCL: `ce-ring` is picked only from a tuned profile that measured it on this
/// machine (`Role::Measured`), so an unmeasured prediction, however fast, only shows in the
/// reason, with where its copy-engine rates came from.
fn ce_ring_note(s: u64, f: &Fabric, topo: &Topology, capture: CaptureMode) -> String {
    let a = Algorithm::CeRing;
    if check(a, natural_transport(a, f), f).is_err() {
        return String::new();
    }
    let n = f.world;
    let costs = sim_cost::costs(topo, n, s, capture, &[a, Algorithm::Nccl]);
    let us = |x: Algorithm| costs.iter().find(|(b, _)| *b == x).and_then(|(_, c)| c.as_ref().ok().copied()).filter(|v| v.is_finite());
    let (Some(ce), Some(nc)) = (us(a), us(Algorithm::Nccl)) else {
        return String::new();
    };
    let probed = topo.probe.as_ref().is_some_and(|p| (0..n).all(|i| (0..n).filter(|&j| j != i).all(|j| p.pair(i, Some(j)).is_some_and(|q| q.ce_gbps.is_some()))));
    let rates = if probed { "copy-engine rates measured by the link probe" } else { "copy-engine rates assumed (the links' rates)" };
    format!("; the simulator times ce-ring at {ce:.1} us against NCCL {nc:.1} us ({rates}, per-copy start assumed): unmeasured on this machine, so NCCL until `tpar tune` measures ce-ring")
}

/// PCIe with P2P, no profile: the calibrated simulator's fastest algorithm among those that
/// run here (`feasibility::check`), with no push algorithm where the probe shows collapsed
/// peer writes or a profile measured reads beating writes.
fn pcie_by_simulator(s: u64, f: &Fabric, forced: Option<Transport>, reads_win: bool, topo: &Topology, capture: CaptureMode) -> Plan {
    let n = f.world;
    let size = human_bytes(s);
    let collapsed = topo.probe.as_ref().and_then(|p| p.collapsed_writes(n));
    let mut skipped: Vec<String> = Vec::new();
    let mut runnable: Vec<(Algorithm, Transport)> = Vec::new();
    let mut pushes: Vec<&str> = Vec::new();
    for spec in crate::algorithms::registry::REGISTRY.iter() {
        let a = spec.algorithm;
        if !(spec.role == crate::algorithms::registry::Role::Candidate || a == Algorithm::Nccl) {
            continue;
        }
        let t = if a == Algorithm::Nccl { Transport::Nccl } else { forced.unwrap_or_else(|| natural_transport(a, f)) };
        if let Err(why) = check(a, t, f) {
            skipped.push(format!("{a} cannot run ({why})"));
            continue;
        }
        if !spec.reads_remote && a != Algorithm::Nccl && (collapsed.is_some() || reads_win) {
            pushes.push(a.name());
            continue;
        }
        runnable.push((a, t));
    }
    if !pushes.is_empty() {
        let why = match collapsed {
            Some(c) => format!(
                "the probe shows collapsed peer writes (GPU{}->GPU{}: SM stores {:.1} vs loads {:.1} GB/s)",
                c.src,
                c.dst.unwrap_or(c.src),
                c.sm_store_gbps.or(c.sm_store_loaded_gbps).unwrap_or(0.0),
                c.sm_load_gbps.or(c.sm_load_loaded_gbps).unwrap_or(0.0)
            ),
            None => "the profile measured reads beating writes".into(),
        };
        skipped.insert(0, format!("no push algorithm ({}): {why}", pushes.join(", ")));
    }
    let algos: Vec<Algorithm> = runnable.iter().map(|&(a, _)| a).collect();
    let costs = sim_cost::costs(topo, n, s, capture, &algos);
    let mut timed: Vec<(Algorithm, Transport, f64)> = Vec::new();
    for (a, t) in runnable {
        match costs.iter().find(|(b, _)| *b == a).map(|(_, c)| c.clone()) {
            Some(Ok(us)) if us.is_finite() => timed.push((a, t, us)),
            Some(Err(why)) => skipped.push(format!("{a} not timed by the simulator ({why})")),
            Some(Ok(_)) | None => skipped.push(format!("{a} not timed by the simulator")),
        }
    }
    timed.sort_by(|x, y| x.2.total_cmp(&y.2));
    let place = if f.islands >= 2 { format!(", {} islands (largest {})", f.islands, f.largest_island) } else { String::new() };
    let others = timed.iter().skip(1).take(3).map(|(a, _, us)| format!("{a} {us:.1}")).collect::<Vec<_>>().join(", ");
    let notes = if skipped.is_empty() { String::new() } else { format!("; {}", skipped.join("; ")) };
    match timed.first() {
        Some(&(Algorithm::Nccl, _, us)) => nccl(format!(
            "PCIe P2P{place}, {n} ranks, {size}: simulator (docs/sim.md) times NCCL fastest at {us:.1} us (then {others}){notes}"
        )),
        Some(&(a, t, us)) => make(
            a,
            t,
            s,
            f,
            format!("PCIe P2P{place}, {n} ranks, {size}: simulator (docs/sim.md) fastest runnable: {a} {us:.1} us (then {others}){notes}"),
        ),
        None => nccl(format!("PCIe P2P{place}, {n} ranks, {size}: the simulator timed nothing that runs here: NCCL{notes}")),
    }
}

// ---------------------------------------------------------------------------------------
// Cross-rank agreement and debug logging.
// ---------------------------------------------------------------------------------------

/// Digest of everything besides (world, bytes, dtype, capture) that the plan depends on:
/// the topology's [`Topology::hash`] and its probe, the profile's contents (its probe
/// included) and the overrides that change
/// decisions (not `TPAR_DEBUG`, not the profile's path). FNV-1a over canonical JSON. Ranks
/// compare it at init; unequal digests mean ranks could pick different algorithms.
pub fn plan_fingerprint(topology: &Topology, profile: Option<&Profile>, overrides: &Overrides) -> u64 {
    let canon = serde_json::json!({
        "topology": format!("{:016x}", topology.hash()),
        "probe": format!("{:016x}", topology.probe_digest()),
        "profile": profile,
        "overrides": overrides,
    });
    fnv1a64(canon.to_string().as_bytes())
}

/// [`plan`], and when `TPAR_DEBUG=INFO` log the decision to stderr once per distinct
/// (world, bytes, dtype, capture, backend, plan) — NCCL's `INFO` habit.
pub fn plan_logged(input: &PlanInput<'_>) -> Plan {
    let p = plan(input);
    if input.overrides.debug {
        let line = format!(
            "tpar INFO plan: world {} {} {} {} {}: {}",
            input.world,
            human_bytes(input.bytes),
            input.dtype,
            input.capture,
            input.backend,
            p
        );
        if first_time(&line) {
            tracing::info!(target: "tpar::plan", "{line}");
            eprintln!("{line}");
        }
    }
    p
}

/// True the first time this process sees `line` (a poisoned lock errs towards logging).
fn first_time(line: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    let key = fnv1a64(line.as_bytes());
    SEEN.get_or_init(|| Mutex::new(HashSet::new())).lock().map(|mut s| s.insert(key)).unwrap_or(true)
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn run(t: &Topology, world: usize, bytes: u64, backend: Backend, o: &Overrides) -> Plan {
        plan(&PlanInput { topology: t, world, bytes, dtype: DType::BF16, capture: CaptureMode::Graph, backend, profile: None, overrides: o })
    }

    #[test]
    fn debug_logs_each_decision_once() {
        assert!(first_time("tpar test line A"));
        assert!(!first_time("tpar test line A"));
        assert!(first_time("tpar test line B"));
        let t = presets::pcie_2();
        let o = Overrides::from_pairs([("TPAR_DEBUG", "INFO")]).unwrap();
        let input = PlanInput { topology: &t, world: 2, bytes: 8, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o };
        assert_eq!(plan_logged(&input), plan(&input));
    }

    /// The simulator's fastest algorithm among those `feasibility::check` accepts.
    fn sim_fastest_runnable(t: &Topology, world: usize, bytes: u64, capture: CaptureMode) -> (Algorithm, f64) {
        let f = Fabric::of(t, world, Backend::Cuda);
        let sim = crate::sim::Simulator::new(t, world, &crate::sim::Params::with_launch(if capture == CaptureMode::Graph { crate::sim::Launch::Graph } else { crate::sim::Launch::Eager })).unwrap();
        let collapsed = t.probe.as_ref().and_then(|p| p.collapsed_writes(world)).is_some();
        crate::algorithms::registry::REGISTRY
            .iter()
            .filter(|sp| sp.role == crate::algorithms::registry::Role::Candidate || sp.algorithm == Algorithm::Nccl)
            .filter(|sp| check(sp.algorithm, natural_transport(sp.algorithm, &f), &f).is_ok())
            .filter(|sp| !(collapsed && !sp.reads_remote && sp.algorithm != Algorithm::Nccl))
            .filter_map(|sp| sim.predict(sp.algorithm, bytes as usize).ok().map(|p| (sp.algorithm, p.total_us)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
    }

    #[test]
    fn pcie_switch_plan_is_the_simulators_fastest_runnable_algorithm() {
        // Issue 14: on rtxpro6000-pcie-switch-8 at the Kimi sizes (1-8 tokens: 14-112 KiB).
        let t = presets::rtxpro6000_pcie_switch_8();
        for capture in CaptureMode::ALL {
            for kib in [14u64, 28, 42, 56, 84, 112] {
                let bytes = kib * 1024;
                let p = plan(&PlanInput { topology: &t, world: 8, bytes, dtype: DType::BF16, capture, backend: Backend::Cuda, profile: None, overrides: &Overrides::default() });
                let (want, us) = sim_fastest_runnable(&t, 8, bytes, capture);
                assert_eq!(p.algorithm, want, "{kib} KiB {capture}: {p}");
                assert!(p.reason.contains(&format!("{us:.1} us")), "{p}");
            }
        }
    }

    #[test]
    fn collapsed_peer_writes_pick_no_push_algorithm() {
        // The dual-socket preset carries the ASUS box's published 2.7 GB/s SM stores.
        let ds = presets::rtxpro6000_dualsocket_8();
        assert!(ds.probe.as_ref().and_then(|p| p.collapsed_writes(8)).is_some());
        // The same collapse on the one-CPU switch box.
        let mut sw = presets::rtxpro6000_pcie_switch_8();
        sw.probe = ds.probe.clone();
        for t in [&ds, &sw] {
            for world in 2..=8 {
                for bytes in [256u64, 14 * 1024, 43008, 112 * 1024, 1 << 20] {
                    let p = run(t, world, bytes, Backend::Cuda, &Overrides::default());
                    let spec = crate::algorithms::registry::spec(p.algorithm);
                    assert!(spec.reads_remote || p.algorithm == Algorithm::Nccl, "{} world {world} {bytes}: {p}", t.name);
                }
            }
        }
        let p = run(&sw, 8, 43008, Backend::Cuda, &Overrides::default());
        assert!(p.reason.contains("collapsed peer writes"), "{p}");
    }

    #[test]
    fn the_motivating_case_gets_a_custom_kernel() {
        // 8x RTX PRO 6000 over PCIe, 42 KiB verify all-reduce: not NCCL.
        let t = presets::rtxpro6000_pcie_switch_8();
        let p = run(&t, 8, 42 * 1024, Backend::Cuda, &Overrides::default());
        assert_eq!(p.transport, Transport::P2p, "{p}");
        assert_ne!(p.algorithm, Algorithm::Nccl, "{p}");
        assert!(p.reason.contains("simulator"), "{p}");
        assert!(p.blocks >= 1 && p.blocks <= PCIE_MAX_BLOCKS);
    }

    #[test]
    fn shapes_follow_the_design() {
        let o = Overrides::default();
        let h = presets::h200_nvswitch_8();
        assert_eq!(run(&h, 8, 16 * 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
        assert_eq!(run(&h, 8, 1 << 20, Backend::Cuda, &o).algorithm, Algorithm::TwoshotPush);
        assert_eq!(run(&h, 8, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let sw = presets::rtxpro6000_pcie_switch_8();
        assert_eq!(run(&sw, 8, 1024, Backend::Cuda, &o).algorithm, Algorithm::OneshotPush);
        assert_eq!(run(&sw, 8, 512 * 1024, Backend::Cuda, &o).algorithm, sim_fastest_runnable(&sw, 8, 512 * 1024, CaptureMode::Graph).0);
        assert_eq!(run(&sw, 8, 16 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let ds = presets::rtxpro6000_dualsocket_8();
        // Two sockets: hierarchical runs, and the simulator decides among everything that runs.
        let p = run(&ds, 8, 256 * 1024, Backend::Cuda, &o);
        assert_eq!(p.algorithm, sim_fastest_runnable(&ds, 8, 256 * 1024, CaptureMode::Graph).0, "{p}");
        assert!(!p.reason.contains("hierarchical cannot run"), "{p}");
        // No P2P: one-shot push through shared host memory while its floor beats NCCL's.
        let np = presets::rtx4090_nop2p_4();
        let p = run(&np, 4, 14 * 1024, Backend::Cuda, &o);
        assert_eq!((p.algorithm, p.transport), (Algorithm::OneshotPush, Transport::Host), "{p}");
        assert!(p.reason.contains("no P2P") && p.reason.contains("host floor"), "{p}");
        assert_eq!(run(&np, 4, 64 << 20, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        assert_eq!(run(&np, 8, 8, Backend::Cuda, &o).algorithm, Algorithm::Nccl);
        let c = Topology::cpu();
        let p = run(&c, 4, 8, Backend::Cpu, &o);
        assert_eq!((p.algorithm, p.transport, p.blocks), (Algorithm::OneshotPush, Transport::Shm, 1));
        assert_eq!(run(&c, 4, 1 << 20, Backend::Cpu, &o).algorithm, Algorithm::TwoshotPush);
        let p = run(&h, 1, 1 << 20, Backend::Cuda, &o);
        assert!(p.reason.starts_with("world 1: copy"), "{p}");
    }

    #[test]
    fn infeasible_overrides_are_ignored_by_plan_and_refused_by_validate() {
        let np = presets::rtx4090_nop2p_4();
        let o = Overrides::from_pairs([("TPAR_ALGO", "oneshot-pull")]).unwrap();
        let p = run(&np, 4, 1024, Backend::Cuda, &o);
        assert_ne!(p.algorithm, Algorithm::OneshotPull);
        assert!(p.reason.contains("TPAR_ALGO=oneshot-pull over host ignored"), "{p}");
        assert!(o.validate(&np, 4, Backend::Cuda).is_err());
    }
}
