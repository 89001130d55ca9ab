//! The plan's cost model for PCIe fabrics without a tuned profile: the calibrated simulator
//! (`crate::sim`, docs/sim.md), evaluated once per (topology, world, size, capture mode) and
//! remembered, so that `tpar plan` and `tpar sim` rank algorithms with one arithmetic.
//!
//! Owns: the memo of predictions, each with its time at the bound and where its figures come
//! from. Must never: read files, the environment or a clock (the memo is a pure function's
//! cache: equal inputs give equal answers, cached or not), or decide what can run (that is
//! `feasibility::check`) or what to pick (that is the plan).

use crate::kinds::{Algorithm, CaptureMode};
use crate::sim::{Launch, Params, Simulator, Source};
use crate::topology::Topology;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Entries kept before the memo is emptied (a long-running process sees few distinct sizes;
/// a property test sees thousands).
const MEMO_ENTRIES: usize = 1 << 16;

/// (topology hash, probe digest, topology name, world, bytes, graph): the hash leaves the
/// probe and the name out, and both change predictions or their sources (a preset's
/// published figures apply to its exact box only).
type Key = (u64, u64, String, usize, u64, bool);

/// One algorithm's prediction.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cost {
    /// The simulator's time, us.
    pub us: f64,
    /// The same with every unmeasured figure at the bound (`Simulator::predict_bound`), us.
    pub bound_us: f64,
    /// The least trusted figure the time rests on.
    pub source: Source,
    /// Those figures no measurement covers, in words.
    pub unmeasured: Vec<String>,
}

/// Per algorithm: its cost, or why the simulator cannot time it.
pub(crate) type Costs = Vec<(Algorithm, Result<Cost, String>)>;

fn memo() -> &'static Mutex<HashMap<Key, Costs>> {
    static MEMO: OnceLock<Mutex<HashMap<Key, Costs>>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The simulator's cost of each of `algorithms` on ranks `0..world` of `t` at `bytes`.
pub(crate) fn costs(t: &Topology, world: usize, bytes: u64, capture: CaptureMode, algorithms: &[Algorithm]) -> Costs {
    let graph = capture == CaptureMode::Graph;
    let key = (t.hash(), t.probe_digest(), t.name.clone(), world, bytes, graph);
    if let Some(hit) = memo().lock().ok().and_then(|m| m.get(&key).cloned()) {
        if algorithms.iter().all(|a| hit.iter().any(|(b, _)| b == a)) {
            return hit.into_iter().filter(|(a, _)| algorithms.contains(a)).collect();
        }
    }
    let params = Params::with_launch(if graph { Launch::Graph } else { Launch::Eager });
    let out: Costs = match Simulator::new(t, world, &params) {
        Err(e) => algorithms.iter().map(|&a| (a, Err(e.to_string()))).collect(),
        Ok(sim) => {
            let b = usize::try_from(bytes.max(1)).unwrap_or(usize::MAX);
            algorithms.iter().map(|&a| (a, cost(&sim, a, b).map_err(|e| e.to_string()))).collect()
        }
    };
    if let Ok(mut m) = memo().lock() {
        if m.len() >= MEMO_ENTRIES {
            m.clear();
        }
        m.insert(key, out.clone());
    }
    out
}

fn cost(sim: &Simulator, a: Algorithm, bytes: usize) -> crate::error::Result<Cost> {
    let us = sim.predict(a, bytes)?.total_us;
    let bound_us = sim.predict_bound(a, bytes)?.total_us;
    let p = sim.provenance(a)?;
    Ok(Cost { us, bound_us, source: p.source, unmeasured: p.unmeasured() })
}
