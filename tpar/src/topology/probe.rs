//! What a link probe found between the GPUs: per ordered pair (and per GPU against its own
//! memory and host memory), SM store, SM load and copy-engine bandwidth, alone and under
//! all-to-all load, and one-way flag latency.
//!
//! Owns: the data ([`Probe`], [`PairProbe`]), its checks and the questions the simulator and
//! the plan ask of it (a pair's figures, whether peer writes collapsed). Must never measure
//! anything (that is `cuda::probe`, on the GPU machine) or decide anything.
//!
//! Why a probe: behind some PCIe switches SM stores to peer memory collapse (~2.7 GB/s on
//! Broadcom PEX890xx, ~7 GB/s per pair on Microchip switches once four GPUs write through one
//! switch) while reads stay near 51 GB/s, and on CPU root-complex boxes push measured faster
//! than pull (docs/references.md). No link class predicts which; only a measurement does.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Below this fraction of the same pair's SM-load rate (alone, or both under the same
/// all-to-all load), SM stores count as collapsed and the plan picks no push algorithm.
/// Healthy fabrics show stores at or above loads (docs/references.md: push 39% faster than
/// pull on a CPU root-complex box; 53-56 GB/s writes vs ~51 reads); collapsed ones show
/// 2.7/51 = 0.05 (Broadcom PEX890xx) and 7 vs ~51 GB/s = 0.14 (Microchip, four writers).
/// 0.25 sits between the two with room on both sides.
pub const WRITE_COLLAPSE_FRACTION: f64 = 0.25;

/// One target measured from one GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairProbe {
    /// The GPU issuing the stores and loads (CUDA ordinal).
    pub src: u32,
    /// The memory measured: a GPU's (CUDA ordinal; `src` itself for its own memory), or
    /// `None` for pinned host memory.
    pub dst: Option<u32>,
    /// SM stores from `src` into `dst`'s memory, GB/s, the pair alone.
    #[serde(default)]
    pub sm_store_gbps: Option<f64>,
    /// SM loads by `src` from `dst`'s memory, GB/s, alone.
    #[serde(default)]
    pub sm_load_gbps: Option<f64>,
    /// Copy-engine copy `src` -> `dst`, GB/s, alone.
    #[serde(default)]
    pub ce_gbps: Option<f64>,
    /// The same three while every probed GPU does the same to every other target at once.
    #[serde(default)]
    pub sm_store_loaded_gbps: Option<f64>,
    #[serde(default)]
    pub sm_load_loaded_gbps: Option<f64>,
    #[serde(default)]
    pub ce_loaded_gbps: Option<f64>,
    /// One-way flag latency `src` -> `dst` (half a ping-pong: a store observed by a poller), us.
    #[serde(default)]
    pub flag_us: Option<f64>,
}

impl PairProbe {
    /// An entry with no figures yet.
    pub fn empty(src: u32, dst: Option<u32>) -> PairProbe {
        PairProbe {
            src,
            dst,
            sm_store_gbps: None,
            sm_load_gbps: None,
            ce_gbps: None,
            sm_store_loaded_gbps: None,
            sm_load_loaded_gbps: None,
            ce_loaded_gbps: None,
            flag_us: None,
        }
    }

    /// Whether SM stores collapsed relative to SM loads on this pair (alone, or under the
    /// same load), by [`WRITE_COLLAPSE_FRACTION`].
    pub fn writes_collapsed(&self) -> bool {
        let low = |store: Option<f64>, load: Option<f64>| matches!((store, load), (Some(s), Some(l)) if s < WRITE_COLLAPSE_FRACTION * l);
        low(self.sm_store_gbps, self.sm_load_gbps) || low(self.sm_store_loaded_gbps, self.sm_load_loaded_gbps)
    }
}

/// A probe of one machine's links.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Where the figures came from: `tpar topo --probe` (with the date and bytes per
    /// transfer), or the public source a preset copies them from.
    pub source: String,
    /// Every measured (src, dst).
    pub pairs: Vec<PairProbe>,
}

impl Probe {
    /// One line per measured pair, `nvidia-smi`-like: rates alone and under all-to-all load
    /// (GB/s), and the one-way flag latency (us); `-` where not measured.
    pub fn table(&self) -> String {
        let f = |v: Option<f64>| v.map(|x| format!("{x:8.2}")).unwrap_or_else(|| "       -".into());
        let mut out = format!("# link probe: {}
#  pair          SM store  SM load  CE copy | loaded: store    load      CE | flag us
", self.source);
        for q in &self.pairs {
            let dst = q.dst.map(|d| format!("GPU{d}")).unwrap_or_else(|| "host".into());
            out.push_str(&format!(
                "  GPU{} -> {:<5} {} {} {} |        {} {} {} | {}\n",
                q.src,
                dst,
                f(q.sm_store_gbps),
                f(q.sm_load_gbps),
                f(q.ce_gbps),
                f(q.sm_store_loaded_gbps),
                f(q.sm_load_loaded_gbps),
                f(q.ce_loaded_gbps),
                f(q.flag_us)
            ));
        }
        out
    }

    /// The entry for `src` -> `dst` (`None`: host memory), if measured.
    pub fn pair(&self, src: usize, dst: Option<usize>) -> Option<&PairProbe> {
        self.pairs.iter().find(|p| p.src as usize == src && p.dst.map(|d| d as usize) == dst)
    }

    /// The first ordered pair of distinct GPUs among `0..world` whose SM stores collapsed,
    /// with its store and load rates (alone), for the plan's reason.
    pub fn collapsed_writes(&self, world: usize) -> Option<&PairProbe> {
        self.pairs.iter().find(|p| {
            let d = p.dst.map(|d| d as usize);
            (p.src as usize) < world && d.is_some_and(|d| d < world && d != p.src as usize) && p.writes_collapsed()
        })
    }

    /// Rejects figures that cannot be rates or latencies, and GPUs out of range.
    pub fn validate(&self, gpus: usize) -> Result<()> {
        for p in &self.pairs {
            if p.src as usize >= gpus || p.dst.is_some_and(|d| d as usize >= gpus) {
                return Err(Error::invalid("topology probe", format!("pair {} -> {:?} names a GPU beyond the {gpus} listed", p.src, p.dst)));
            }
            for (what, v) in [
                ("sm_store_gbps", p.sm_store_gbps),
                ("sm_load_gbps", p.sm_load_gbps),
                ("ce_gbps", p.ce_gbps),
                ("sm_store_loaded_gbps", p.sm_store_loaded_gbps),
                ("sm_load_loaded_gbps", p.sm_load_loaded_gbps),
                ("ce_loaded_gbps", p.ce_loaded_gbps),
                ("flag_us", p.flag_us),
            ] {
                if let Some(v) = v {
                    if !(v.is_finite() && v > 0.0) {
                        return Err(Error::invalid("topology probe", format!("pair {} -> {:?}: {what} = {v} (must be positive)", p.src, p.dst)));
                    }
                }
            }
        }
        Ok(())
    }

    /// A probe with the same figures for every ordered pair of distinct GPUs among `n` (how
    /// a preset states one published figure for its whole fabric).
    pub fn uniform(source: &str, n: usize, fill: impl Fn(usize, usize) -> PairProbe) -> Probe {
        let mut pairs = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    pairs.push(fill(a, b));
                }
            }
        }
        Probe { source: source.into(), pairs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(store: f64, load: f64) -> PairProbe {
        PairProbe { sm_store_gbps: Some(store), sm_load_gbps: Some(load), ..PairProbe::empty(0, Some(1)) }
    }

    #[test]
    fn collapse_is_stores_far_below_loads_on_the_same_pair() {
        // docs/references.md: Broadcom PEX890xx 2.7 vs 51 GB/s collapsed; Gen5 root ports 55 vs 51 not.
        assert!(pair(2.7, 51.0).writes_collapsed());
        assert!(!pair(55.0, 51.0).writes_collapsed());
        let loaded = PairProbe { sm_store_loaded_gbps: Some(1.0), sm_load_loaded_gbps: Some(7.8), ..pair(50.0, 51.0) };
        assert!(loaded.writes_collapsed(), "a collapse only under load counts");
        let p = Probe { source: "test".into(), pairs: vec![pair(2.7, 51.0), PairProbe { src: 1, ..pair(2.7, 51.0) }] };
        assert!(p.collapsed_writes(2).is_some());
        assert!(p.collapsed_writes(1).is_none(), "GPU1 is not among the ranks");
        assert!(p.validate(2).is_ok());
        assert!(p.validate(1).is_err());
        let bad = Probe { source: "t".into(), pairs: vec![pair(-1.0, 2.0)] };
        assert!(bad.validate(2).is_err());
    }
}
