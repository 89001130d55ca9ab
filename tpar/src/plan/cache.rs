//! Decisions already made, for one communicator: an eager call asks the plan once per
//! (dtype, size, capture mode) instead of on every call (the plan formats its reason, and
//! under `TPAR_DEBUG=INFO` logs it).
//!
//! Owns: the memo. Must never be shared between communicators: everything else the plan
//! reads (topology, world, backend, profile, overrides) is fixed per communicator and is not
//! part of the key.

use super::{plan_logged, Plan, PlanInput};
use crate::dtype::DType;
use crate::kinds::{CaptureMode, Collective};
use std::collections::HashMap;
use std::sync::Arc;

/// Entries kept before the memo starts over (a workload of many distinct sizes must not
/// grow it without bound).
pub const PLAN_CACHE_MAX: usize = 4096;

/// One communicator's memo of plan decisions.
#[derive(Debug, Default)]
pub struct PlanCache {
    map: HashMap<(DType, u64, CaptureMode), Arc<Plan>>,
    /// All-gather and reduce-scatter decisions ([`get_for`](Self::get_for)).
    others: HashMap<(Collective, DType, u64, CaptureMode), Arc<Plan>>,
}

impl PlanCache {
    /// The decision for `input`, planned (and logged) the first time its (dtype, bytes,
    /// capture) is seen. Cheap to clone: the plan is shared.
    pub fn get(&mut self, input: &PlanInput<'_>) -> Arc<Plan> {
        let key = (input.dtype, input.bytes, input.capture);
        if let Some(p) = self.map.get(&key) {
            return Arc::clone(p);
        }
        if self.map.len() >= PLAN_CACHE_MAX {
            self.map.clear();
        }
        let p = Arc::new(plan_logged(input));
        self.map.insert(key, Arc::clone(&p));
        p
    }

    /// The decision for `collective` (`plan_collective`), memoised as [`get`](Self::get).
    pub fn get_for(&mut self, collective: Collective, input: &PlanInput<'_>) -> Arc<Plan> {
        if collective == Collective::AllReduce {
            return self.get(input);
        }
        let key = (collective, input.dtype, input.bytes, input.capture);
        if let Some(p) = self.others.get(&key) {
            return Arc::clone(p);
        }
        if self.others.len() >= PLAN_CACHE_MAX {
            self.others.clear();
        }
        let p = Arc::new(super::plan_collective(collective, input));
        self.others.insert(key, Arc::clone(&p));
        p
    }

    /// Decisions held now.
    pub fn len(&self) -> usize {
        self.map.len() + self.others.len()
    }

    /// Whether no decision is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.others.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, Backend, Overrides};
    use crate::topology::presets;

    #[test]
    fn one_decision_per_dtype_size_and_mode_equal_to_the_plan() {
        let t = presets::rtxpro6000_pcie_switch_8();
        let o = Overrides::default();
        let mut c = PlanCache::default();
        let input = |bytes, dtype, capture| PlanInput { topology: &t, world: 8, bytes, dtype, capture, backend: Backend::Cuda, profile: None, overrides: &o };
        for _ in 0..3 {
            for bytes in [1024u64, 43008, 1 << 20] {
                for d in DType::ALL {
                    for m in CaptureMode::ALL {
                        assert_eq!(*c.get(&input(bytes, d, m)), plan(&input(bytes, d, m)));
                    }
                }
            }
        }
        assert_eq!(c.len(), 3 * DType::ALL.len() * CaptureMode::ALL.len());
        let a = c.get(&input(43008, DType::BF16, CaptureMode::Graph));
        let b = c.get(&input(43008, DType::BF16, CaptureMode::Graph));
        assert!(Arc::ptr_eq(&a, &b), "a second call reuses the decision");
    }

    #[test]
    fn the_memo_is_bounded() {
        let t = presets::pcie_2();
        let o = Overrides::default();
        let mut c = PlanCache::default();
        for bytes in 0..(PLAN_CACHE_MAX as u64 + 10) {
            c.get(&PlanInput { topology: &t, world: 2, bytes, dtype: DType::F32, capture: CaptureMode::Eager, backend: Backend::Cuda, profile: None, overrides: &o });
        }
        assert!(c.len() <= PLAN_CACHE_MAX);
        assert!(!c.is_empty());
    }
}
