//! Which GPU each rank runs on: the topology seen from the ranks.
//!
//! Ranks are not CUDA ordinals: `CUDA_VISIBLE_DEVICES` subsets, `CUDA_DEVICE_ORDER`,
//! SGLang's `--base-gpu-id`, and every PP x TP or DP x TP layout on one host put rank r on
//! some GPU other than ordinal r, while NVML (which discovers the topology) ignores
//! `CUDA_VISIBLE_DEVICES` altogether. The one stable key is the PCI address of each rank's
//! CUDA device: ranks exchange theirs at init, and [`Topology::for_ranks`] builds the
//! topology whose GPU r *is* rank r's GPU, so that the plan, the islands and the simulator
//! keep reading "rank r = GPU r".
//!
//! Owns: matching PCI addresses, and the sub-topology. Must never guess silently: a rank
//! whose GPU the topology does not list, or ranks sharing a GPU, are said in the result.

use super::{Link, Topology};

/// How the ranks were placed on the topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every rank's GPU found by its PCI address: GPU r of the result is rank r's.
    ByBusId,
    /// The topology was given (a preset or a file) and does not list the ranks' GPUs: rank
    /// r plans as if it were GPU r of it (tests, and `tpar plan`-style what-ifs).
    AsIf,
    /// The discovered topology does not describe the ranks (a GPU it lacks, or several ranks
    /// on one GPU): the result has no GPUs, so the plan takes NCCL and says why.
    Unknown(String),
}

/// A PCI address in one canonical form: NVML writes `00000000:3B:00.0`, the CUDA driver
/// `0000:3b:00.0`; both become `0000:3b:00.0`. `None` when it does not parse.
pub fn canonical_bus_id(id: &str) -> Option<String> {
    let id = id.trim();
    let (rest, func) = id.rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    if parts.len() != 3 {
        return None;
    }
    let n = |s: &str| u32::from_str_radix(s, 16).ok();
    let (dom, bus, dev, f) = (n(parts[0])?, n(parts[1])?, n(parts[2])?, n(func)?);
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{f:x}"))
}

impl Topology {
    /// The topology as the ranks see it: GPU r of the result is the GPU whose PCI address is
    /// `bus_ids[r]` (every rank's, in rank order, as the ranks exchanged them). `given`: the
    /// topology was named by the user (a preset or a file) rather than discovered; then
    /// addresses it does not list mean "plan as if on its first GPUs" ([`Placement::AsIf`]).
    pub fn for_ranks(&self, bus_ids: &[String], given: bool) -> (Topology, Placement) {
        let keys: Vec<Option<String>> = self.gpus.iter().map(|g| canonical_bus_id(&g.pci_bus_id)).collect();
        let mut picked = Vec::with_capacity(bus_ids.len());
        let mut missing = Vec::new();
        for (r, id) in bus_ids.iter().enumerate() {
            match canonical_bus_id(id).and_then(|c| keys.iter().position(|k| k.as_deref() == Some(c.as_str()))) {
                Some(g) => picked.push(g),
                None => missing.push(format!("rank {r} ({id})")),
            }
        }
        let mut shared = Vec::new();
        for (r, g) in picked.iter().enumerate() {
            if let Some(q) = picked[..r].iter().position(|h| h == g) {
                shared.push(format!("ranks {q} and {r} on GPU{g}"));
            }
        }
        if missing.is_empty() && shared.is_empty() {
            return (self.subset(&picked), Placement::ByBusId);
        }
        if given {
            return (self.clone(), Placement::AsIf);
        }
        let why = if !missing.is_empty() {
            format!("the discovered topology lists no GPU for {}", missing.join(", "))
        } else {
            format!("several ranks share a GPU ({})", shared.join("; "))
        };
        let mut t = Topology::cpu();
        t.name = format!("{} (ranks not placed)", self.name);
        t.notes.push(why.clone());
        (t, Placement::Unknown(why))
    }

    /// GPUs `gpus` (indices into this topology), in that order, renumbered 0.., with their
    /// links, the islands recomputed, and the probe's pairs that stay inside the subset.
    fn subset(&self, gpus: &[usize]) -> Topology {
        let mut t = self.clone();
        t.gpus = gpus
            .iter()
            .enumerate()
            .map(|(r, &g)| {
                let mut gpu = self.gpus[g].clone();
                gpu.index = r as u32;
                gpu
            })
            .collect();
        t.links = gpus.iter().map(|&i| gpus.iter().map(|&j| self.links[i][j]).collect::<Vec<Link>>()).collect();
        t.islands = Topology::compute_islands(&t.gpus, &t.links);
        if let Some(p) = &mut t.probe {
            let at = |g: u32| gpus.iter().position(|&x| x == g as usize).map(|r| r as u32);
            p.pairs = p
                .pairs
                .iter()
                .filter_map(|q| {
                    let src = at(q.src)?;
                    let dst = match q.dst {
                        Some(d) => Some(at(d)?),
                        None => None,
                    };
                    Some(super::probe::PairProbe { src, dst, ..q.clone() })
                })
                .collect();
        }
        let order: Vec<String> = gpus.iter().map(|g| format!("GPU{g}")).collect();
        if gpus.iter().enumerate().any(|(r, &g)| r != g) || gpus.len() != self.gpus.len() {
            t.notes.push(format!("ranks 0.. on {}", order.join(", ")));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn ids(t: &Topology, gpus: &[usize]) -> Vec<String> {
        gpus.iter().map(|&g| t.gpus[g].pci_bus_id.clone()).collect()
    }

    #[test]
    fn bus_ids_compare_across_nvml_and_cuda_spellings() {
        assert_eq!(canonical_bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(canonical_bus_id("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(canonical_bus_id("3b:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(canonical_bus_id("nonsense"), None);
    }

    #[test]
    fn ranks_on_the_upper_half_of_a_two_socket_box_get_those_gpus() {
        // Two TP-4 servers on one 8-GPU box: the second has CUDA_VISIBLE_DEVICES=4,5,6,7, so
        // its ranks 0-3 run on GPUs 4-7 (the other socket), not on GPUs 0-3.
        let t = presets::by_name("rtxpro6000-dualsocket-8").unwrap();
        let (sub, how) = t.for_ranks(&ids(&t, &[4, 5, 6, 7]), false);
        assert_eq!(how, Placement::ByBusId);
        assert_eq!(sub.gpu_count(), 4);
        for r in 0..4 {
            assert_eq!(sub.gpus[r].pci_bus_id, t.gpus[4 + r].pci_bus_id);
            assert_eq!(sub.gpus[r].index as usize, r);
            for q in 0..4 {
                assert_eq!(sub.links[r][q], t.links[4 + r][4 + q]);
            }
        }
        sub.validate().unwrap();
        // One socket: one island, where the first four GPUs' view would be the same shape but
        // another socket; a TP-4 spread over both sockets has two.
        assert_eq!(sub.islands_of(4).len(), 1);
        let (spread, _) = t.for_ranks(&ids(&t, &[0, 1, 4, 5]), false);
        assert_eq!(spread.islands_of(4).len(), 2, "ranks across the sockets: two islands");
        let (first, _) = t.for_ranks(&ids(&t, &[0, 1, 2, 3]), false);
        assert_eq!(first.islands_of(4).len(), 1);
    }

    #[test]
    fn a_reordered_device_list_reorders_the_links() {
        let t = presets::by_name("rtxpro6000-dualsocket-8").unwrap();
        let order = [7, 0, 3, 4];
        let (sub, how) = t.for_ranks(&ids(&t, &order), false);
        assert_eq!(how, Placement::ByBusId);
        for (r, &g) in order.iter().enumerate() {
            for (q, &h) in order.iter().enumerate() {
                assert_eq!(sub.links[r][q], t.links[g][h], "rank {r} -> rank {q}");
            }
        }
        sub.validate().unwrap();
    }

    #[test]
    fn unknown_or_shared_gpus_are_said_not_guessed() {
        let t = presets::by_name("h200-nvswitch-8").unwrap();
        let stranger = vec!["0000:ff:00.0".to_string(); 2];
        let (sub, how) = t.for_ranks(&stranger, false);
        assert!(matches!(how, Placement::Unknown(ref w) if w.contains("rank 0")), "{how:?}");
        assert_eq!(sub.gpu_count(), 0, "the plan then takes NCCL for ranks it cannot place");
        let (_, how) = t.for_ranks(&ids(&t, &[2, 2]), false);
        assert!(matches!(how, Placement::Unknown(ref w) if w.contains("share")), "{how:?}");
        // A topology the user named: plan as if on its first GPUs (rank processes sharing one
        // GPU in tests plan on a preset this way).
        let (sub, how) = t.for_ranks(&stranger, true);
        assert_eq!(how, Placement::AsIf);
        assert_eq!(sub, t);
    }
}
