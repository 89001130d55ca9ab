//! The plan's cost model for PCIe fabrics without a tuned profile: the calibrated simulator
//! (`crate::sim`, docs/sim.md), evaluated once per (topology, world, size, capture mode) and
//! remembered, so that `tpar plan` and `tpar sim` rank algorithms with one arithmetic.
//!
//! Owns: the memo of predictions. Must never: read files, the environment or a clock (the
//! memo is a pure function's cache: equal inputs give equal answers, cached or not), or
//! decide what can run (that is `feasibility::check`).

use crate::kinds::{Algorithm, CaptureMode};
use crate::sim::{Launch, Params, Simulator};
use crate::topology::Topology;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Entries kept before the memo is emptied (a long-running process sees few distinct sizes;
/// a property test sees thousands).
const MEMO_ENTRIES: usize = 1 << 16;

/// (topology hash, probe digest, world, bytes, graph): the hash leaves the probe out, and the
/// probe changes predictions.
type Key = (u64, u64, usize, u64, bool);
/// Per algorithm: the predicted time in us, or why the simulator cannot time it.
pub(crate) type Costs = Vec<(Algorithm, Result<f64, String>)>;

fn memo() -> &'static Mutex<HashMap<Key, Costs>> {
    static MEMO: OnceLock<Mutex<HashMap<Key, Costs>>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The simulator's time for each of `algorithms` on ranks `0..world` of `t` at `bytes`.
pub(crate) fn costs(t: &Topology, world: usize, bytes: u64, capture: CaptureMode, algorithms: &[Algorithm]) -> Costs {
    let graph = capture == CaptureMode::Graph;
    let key = (t.hash(), t.probe_digest(), world, bytes, graph);
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
            algorithms.iter().map(|&a| (a, sim.predict(a, b).map(|p| p.total_us).map_err(|e| e.to_string()))).collect()
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
