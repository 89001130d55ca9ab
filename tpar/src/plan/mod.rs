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
//! | `pcie` | the PCIe decision without a profile: the calibrated simulator's fastest runnable algorithm, or NCCL |
//! | [`profile`] | tuned profiles (TOML) and their fingerprint |
//! | [`tuned`] | a machine's measured tune (both capture modes), its key, decision and cache entry format |
//! | `copy_engines` | the reason's note on `ce-ring` for large PCIe calls (simulated, never picked by default) |
//! Must never: do I/O inside [`plan`] (it reads no environment, no file, no clock), return an
//! algorithm whose preconditions do not hold on the fabric (an override or profile that asks
//! for one is ignored, and the reason says so; [`Overrides::validate`] turns it into an error
//! at init), or have a match arm that could mean "nothing".
//!
//! Ranks map to CUDA ordinals `0..world`: the plan for world W on a topology of G >= W GPUs
//! looks at the first W GPUs only. World W > G on the CUDA backend means ranks this topology
//! does not describe (other hosts, or GPUs shared by ranks): NCCL, with that reason.

pub mod cache;
pub mod call_shape;
mod collectives;
pub use collectives::plan_collective;
pub mod feasibility;
pub mod floors;
mod fused;
pub use fused::{fused_kernel, FUSED_ONESHOT_PULL_MAX};
pub mod overrides;
mod pcie;
pub mod profile;
pub(crate) mod sim_cost;
pub mod tuned;
mod copy_engines;

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
pub use crate::sim::Source;
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

/// The decision. JSON: `{"algorithm", "transport", "blocks", "reason", "predicted_us",
/// "nccl_us", "source", "nccl_source"}` (the last four `null` where the plan has no figure).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub algorithm: Algorithm,
    pub transport: Transport,
    /// Thread blocks (CTAs) per rank for tpar's kernels; 1 on the CPU backend (one thread
    /// per rank); 0 for NCCL, which picks its own channels.
    pub blocks: u32,
    /// Why, naming the numbers used.
    pub reason: String,
    /// The pick's predicted time per call, us: the simulator's, a floor's, or a profile's
    /// median. `None` where the decision used no time (a setting, world 1, CPU ranks).
    #[serde(default)]
    pub predicted_us: Option<f64>,
    /// NCCL's predicted time for the same call, us (the gain is `nccl_us / predicted_us`).
    #[serde(default)]
    pub nccl_us: Option<f64>,
    /// Where the pick's figures come from: the least trusted one its time rests on
    /// (docs/plan.md, "Where each number comes from"). `None` where no figure decided it.
    #[serde(default)]
    pub source: Option<Source>,
    /// Where NCCL's time comes from.
    #[serde(default)]
    pub nccl_source: Option<Source>,
    /// Where the pick's time rests on an unmeasured figure: its time with that figure at the
    /// bound (`Simulator::predict_bound`), which still beat NCCL's, us.
    #[serde(default)]
    pub bound_us: Option<f64>,
    /// Where NCCL replaced the simulator's fastest tpar kernel because that kernel's time
    /// rests on an unmeasured figure and, at the bound, loses to NCCL: which kernel, at what.
    #[serde(default)]
    pub instead_of: Option<Unmeasured>,
}

/// The tpar kernel a plan did not pick because its time rests on an unmeasured figure.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unmeasured {
    pub algorithm: Algorithm,
    /// Its simulated time, us.
    pub us: f64,
    /// The same with the unmeasured figures at the bound, us.
    pub bound_us: f64,
}

impl Plan {
    /// NCCL's time over the pick's: how many times faster the pick is predicted to run.
    pub fn gain(&self) -> Option<f64> {
        match (self.predicted_us, self.nccl_us) {
            (Some(p), Some(n)) if p > 0.0 => Some(n / p),
            _ => None,
        }
    }

    /// This plan with `algorithm` run instead (over `transport`, or NCCL's for NCCL), on the
    /// launch policy's blocks (0), for `reason`; its figures are left as they were. How a
    /// communicator runs an algorithm its caller forced, or [`Plan::without_nccl`]'s kernel.
    pub fn replaced(&self, algorithm: Algorithm, transport: Transport, reason: String) -> Plan {
        let transport = if algorithm == Algorithm::Nccl { Transport::Nccl } else { transport };
        Plan { algorithm, transport, blocks: 0, reason, ..self.clone() }
    }

    /// Where NCCL cannot run (it did not join: `why`) and this plan chose it only instead of
    /// a tpar kernel whose time rests on an unmeasured figure ([`Plan::instead_of`]): that
    /// kernel, over `transport` (the communicator's workspaces), on the policy's blocks (0).
    /// It is correct, only perhaps slower than NCCL would have been, which beats refusing
    /// the call. `None` where NCCL was chosen for any other reason.
    pub fn without_nccl(&self, why: &str, transport: Transport) -> Option<Plan> {
        let u = self.instead_of.filter(|_| self.algorithm == Algorithm::Nccl)?;
        let reason = format!(
            "NCCL did not join ({why}): {}, the kernel NCCL stood in for, {:.1} us simulated ({:.1} at the bound; the plan said: {})",
            u.algorithm, u.us, u.bound_us, self.reason
        );
        Some(Plan {
            predicted_us: Some(u.us),
            nccl_us: None,
            source: None,
            nccl_source: None,
            bound_us: Some(u.bound_us),
            instead_of: None,
            ..self.replaced(u.algorithm, transport, reason)
        })
    }

    fn bounded(mut self, bound_us: f64) -> Plan {
        self.bound_us = Some(bound_us);
        self
    }

    fn timed(mut self, us: Option<f64>, source: Source, nccl_us: Option<f64>, nccl_source: Option<Source>) -> Plan {
        self.predicted_us = us;
        self.source = Some(source);
        self.nccl_us = nccl_us;
        self.nccl_source = nccl_source;
        self
    }
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

    let finish = |p: Plan, notes: Vec<String>| finish_plan(p, o, notes);

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
                                // A tune's measurement on this machine: the most trusted source.
                                let p = make(a, t, s, &f, why).timed(Some(bucket.median_us), Source::Profile, None, None);
                                return finish(p, notes);
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
    let links = Links { topology: probed.as_ref().unwrap_or(input.topology), from_profile: probed.is_some() };
    let p = default_plan(s, &f, forced_transport, reads_win, &links, input.capture);
    finish(p, notes)
}

fn nccl(reason: String) -> Plan {
    Plan { algorithm: Algorithm::Nccl, transport: Transport::Nccl, blocks: 0, reason, predicted_us: None, nccl_us: None, source: None, nccl_source: None, bound_us: None, instead_of: None }
}

/// Builds a plan for a checked (algorithm, transport), choosing blocks.
fn make(a: Algorithm, t: Transport, s: u64, f: &Fabric, reason: String) -> Plan {
    let blocks = match t {
        Transport::Nccl => 0,
        Transport::Shm => 1,
        Transport::P2p if f.nvlink => kernel_blocks(s, BlockClass::NvLink),
        Transport::P2p | Transport::Host => kernel_blocks(s, BlockClass::Pcie),
    };
    Plan { algorithm: a, transport: t, blocks, reason, predicted_us: None, nccl_us: None, source: None, nccl_source: None, bound_us: None, instead_of: None }
}

/// The links the defaults plan on: the topology, or the topology with a matching profile's
/// probe (whose figures are then [`Source::Profile`]).
struct Links<'a> {
    topology: &'a Topology,
    from_profile: bool,
}

impl Links<'_> {
    /// A figure's source, with a profile's probe counted as the profile's.
    fn source(&self, s: Source) -> Source {
        if self.from_profile && s == Source::Probe {
            Source::Profile
        } else {
            s
        }
    }
}

/// Where NCCL's simulated time for this call comes from: published where the calibration
/// holds NCCL figures for this exact box, world and launch mode covering the size (the model
/// is fitted and held out against them there), else assumed.
fn nccl_source(t: &Topology, world: usize, bytes: u64, capture: CaptureMode) -> Source {
    let launch = if capture == CaptureMode::Graph { crate::sim::Launch::Graph } else { crate::sim::Launch::Eager };
    match crate::sim::calibrate::published_nccl(t, world, launch) {
        Some(f) if f.points.first().is_some_and(|p| p.0 as u64 <= bytes) && f.points.last().is_some_and(|p| bytes <= p.0 as u64) => Source::Published,
        Some(_) | None => Source::Assumed,
    }
}

/// NVLink, a call captured in a CUDA graph (its buffers registered: two-shot pull reads the
/// inputs in place): [`NVLINK_GRAPH_RULE`] and [`NVLINK_GRAPH_CUSTOM_MAX_BYTES`], measured
/// with emulated ranks on one H200 against vLLM's kernel.
/// `None` where the kernel cannot run on this fabric (`feasibility::check`): the eager rule.
fn graph_nvlink(s: u64, f: &Fabric) -> Option<Plan> {
    let n = f.world;
    let size = human_bytes(s);
    let (push_max, pull_max) = NVLINK_GRAPH_RULE[if n <= 2 { 0 } else if n <= 4 { 1 } else { 2 }];
    let max = human_bytes(NVLINK_GRAPH_CUSTOM_MAX_BYTES);
    let why = "measured with emulated ranks on one H200, graphs";
    let (a, reason) = if s <= push_max {
        (Algorithm::OneshotPush, format!("NVLink, {n} ranks, graph: {size} <= {}: one-shot push ({why})", human_bytes(push_max)))
    } else if s <= pull_max {
        (Algorithm::OneshotPull, format!("NVLink, {n} ranks, graph: {size} <= {}: one-shot pull ({why})", human_bytes(pull_max)))
    } else if s <= NVLINK_GRAPH_CUSTOM_MAX_BYTES {
        (Algorithm::TwoshotPull, format!("NVLink, {n} ranks, graph: {} < {size} <= {max}: two-shot pull, zero copy on registered buffers ({why})", human_bytes(pull_max)))
    } else {
        return Some(nccl(format!("NVLink, {n} ranks, graph: {size} > {max}: NCCL (tpar's kernels measured to {max})")));
    };
    check(a, Transport::P2p, f).ok()?;
    Some(make(a, Transport::P2p, s, f, reason))
}

/// The default decision for a feasible fabric (world fits, backend known).
fn default_plan(s: u64, f: &Fabric, forced: Option<Transport>, reads_win: bool, links: &Links<'_>, capture: CaptureMode) -> Plan {
    let n = f.world;
    let size = human_bytes(s);
    let topo = links.topology;
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
    // The simulator's times for `a` and NCCL (for tables: predicted time and gain).
    let simulated = |a: Algorithm| -> (Option<f64>, Option<f64>) {
        let costs = sim_cost::costs(topo, n, s, capture, &[a, Algorithm::Nccl]);
        let us = |x: Algorithm| costs.iter().find(|(b, _)| *b == x).and_then(|(_, c)| c.as_ref().ok()).map(|c| c.us);
        (us(a), us(Algorithm::Nccl))
    };
    match f.backend {
        Backend::Cpu => {
            if n == 1 {
                return make(Algorithm::OneshotPush, Transport::Shm, s, f, "world 1: copy".into());
            }
            let base = if s <= CPU_ONESHOT_MAX_BYTES { Algorithm::OneshotPush } else { Algorithm::TwoshotPush };
            let (a, why) = pull(base);
            let cmp = if s <= CPU_ONESHOT_MAX_BYTES { "<=" } else { ">" };
            // The threshold is tpar's own measurement on CPU ranks, and the reason says where
            // it lives. The plan predicts no time for CPU ranks, so it carries no source: a
            // source names where a predicted time comes from, and there is none.
            let reason = format!(
                "CPU ranks over shm: {size} {cmp} {} (the CPU one-shot limit, measured by tpar on CPU ranks: bench/results/2026-12-01-dev-2core-cpu-vs-mpi/README.md){why}",
                human_bytes(CPU_ONESHOT_MAX_BYTES)
            );
            make(a, Transport::Shm, s, f, reason)
        }
        Backend::Cuda => {
            if n == 1 {
                let t = forced.unwrap_or(Transport::P2p);
                return make(Algorithm::OneshotPush, t, s, f, "world 1: copy".into());
            }
            if forced == Some(Transport::Host) && f.p2p_write {
                // A forced host transport on a fabric with P2P: the simulator routes peers
                // peer-to-peer there, so the floors (docs/plan.md) time the host path.
                let b = f.p2p_gbps();
                let (h, c) = (host_floor_us(n, s, b), nccl_floor_us(n, s, b));
                let numbers = format!("host floor {h:.1} us vs NCCL floor {c:.1} us at {size}, {n} ranks, {b:.1} GB/s");
                return match check(Algorithm::OneshotPush, Transport::Host, f) {
                    Err(why) => nccl(format!("TPAR_TRANSPORT=host: one-shot push through host memory cannot run here ({why}): NCCL")),
                    Ok(()) if h <= c => make(Algorithm::OneshotPush, Transport::Host, s, f, format!("TPAR_TRANSPORT=host: one-shot push through host memory: {numbers}"))
                        .timed(Some(h), Source::Assumed, Some(c), Some(Source::Assumed)),
                    Ok(()) => nccl(format!("TPAR_TRANSPORT=host: {numbers}: NCCL")).timed(Some(c), Source::Assumed, Some(c), Some(Source::Assumed)),
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
                // Thresholds measured with tpar's kernels on 2-4 H200s (floors.rs); from 5 ranks
                // the one-shot limit follows vLLM's dispatch and says so. NVLink's links are
                // measured (nccl #1264), so the choice against NCCL rests on published figures.
                let measured = if n <= 4 { "measured on H200s" } else { "after vLLM's dispatch, not measured at this world" };
                let nccl_src = nccl_source(topo, n, s, capture);
                let graph = if capture == CaptureMode::Graph && forced.is_none() { graph_nvlink(s, f) } else { None };
                let p = if let Some(p) = graph {
                    p
                } else if s <= limit {
                    let (a, why) = pull(Algorithm::OneshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {size} <= {lim} one-shot limit ({measured}){why}"))
                } else if s <= NVLINK_CUSTOM_MAX_BYTES {
                    let (a, why) = pull(Algorithm::TwoshotPush);
                    make(a, Transport::P2p, s, f, format!("NVLink, {n} ranks: {lim} < {size} <= {max}: two-shot ({measured}){why}"))
                } else {
                    nccl(format!("NVLink, {n} ranks: {size} > {max}: bandwidth-bound, NCCL (measured on H200s)"))
                };
                let (us, nccl_us) = simulated(p.algorithm);
                return if p.algorithm == Algorithm::Nccl {
                    p.timed(nccl_us, nccl_src, nccl_us, Some(nccl_src))
                } else {
                    p.timed(us, Source::Published, nccl_us, Some(nccl_src))
                };
            }
            let max = human_bytes(PCIE_CUSTOM_MAX_BYTES);
            if s > PCIE_CUSTOM_MAX_BYTES {
                let (_, nccl_us) = simulated(Algorithm::Nccl);
                let src = nccl_source(topo, n, s, capture);
                return nccl(format!("PCIe, {n} ranks: {size} > {max}: no latency left to win, NCCL{}", copy_engines::ce_ring_note(s, f, topo, capture))).timed(nccl_us, src, nccl_us, Some(src));
            }
            pcie::by_simulator(s, f, forced, reads_win, links, capture)
        }
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


/// The last step of every plan (all-reduce and the other collectives): `TPAR_BLOCKS` on a
/// planned kernel call ([`call_shape::call_blocks`], where it is applied to every call, planned
/// or not), and the notes appended to the reason.
fn finish_plan(mut p: Plan, o: &Overrides, mut notes: Vec<String>) -> Plan {
    if matches!(p.transport, Transport::P2p | Transport::Host) {
        if let call_shape::CallBlocks::Held(b) = call_shape::call_blocks(0, o.blocks, || p.blocks) {
            notes.push(format!("TPAR_BLOCKS={b} (default {})", p.blocks));
            p.blocks = b;
        }
    }
    if !notes.is_empty() {
        p.reason = format!("{}; {}", p.reason, notes.join("; "));
    }
    p
}
#[cfg(test)]
mod tests;
