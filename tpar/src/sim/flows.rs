//! The flow engine: concurrent flows sharing capacitated resources by max-min fairness.
//!
//! Owns: the event-driven progressive-filling solver. A *resource* is anything with a
//! capacity in GB/s that flows share: one direction of a link, a root complex's forwarding
//! engine, a tracker of outstanding non-posted reads (by Little's law, W outstanding requests
//! of R bytes over a round trip T carry at most W·R/T, which is a capacity like any other).
//! A *flow* moves `bytes` across a set of resources, starting at `start_us`, never faster
//! than its own `rate_cap_gbps`, and is complete `latency_us` after its last byte leaves.
//!
//! Contract: pure arithmetic, no topology knowledge, no I/O; returns an error (never panics)
//! on inputs that have no meaning (negative bytes, zero capacity, an unbounded flow).
//!
//! Units: bytes, microseconds, GB/s (1 GB/s = 1e3 bytes/us).
//!
//! Between two events (a flow starting or a flow draining) rates are constant and equal to
//! the max-min fair allocation (after: Bertsekas & Gallager, "Data Networks", progressive
//! filling): raise every unfrozen flow's rate together until a resource saturates or a flow
//! hits its cap, freeze those flows, repeat.

use crate::error::{Error, Result};

/// Bytes per microsecond in one GB/s.
const BYTES_PER_US_PER_GBPS: f64 = 1e3;

/// Relative slack when deciding that a resource is saturated or a flow has drained.
const EPS: f64 = 1e-9;

/// One flow to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSpec {
    /// Indices into the resource capacity list; each resource is used once.
    pub resources: Vec<usize>,
    /// Payload, bytes.
    pub bytes: f64,
    /// When the first byte may leave, us.
    pub start_us: f64,
    /// Added after the last byte leaves (propagation, or a read's first round trip), us.
    pub latency_us: f64,
    /// The flow's own ceiling, GB/s (`f64::INFINITY` for none).
    pub rate_cap_gbps: f64,
}

impl FlowSpec {
    /// A flow with no cap, starting at time 0.
    pub fn new(resources: Vec<usize>, bytes: f64, latency_us: f64) -> Self {
        FlowSpec {
            resources,
            bytes,
            start_us: 0.0,
            latency_us,
            rate_cap_gbps: f64::INFINITY,
        }
    }
}

/// Max-min fair rates (GB/s) of `flows`, each given as (resources, cap), on resources with
/// `capacity` (GB/s). A flow with no resource and no cap gets `f64::INFINITY`.
pub fn max_min_rates(capacity: &[f64], flows: &[(&[usize], f64)]) -> Vec<f64> {
    let mut rate = vec![0.0f64; flows.len()];
    let mut frozen = vec![false; flows.len()];
    let mut left: Vec<f64> = capacity.to_vec();
    // Flows that nothing limits finish instantly.
    for (i, (res, cap)) in flows.iter().enumerate() {
        if res.is_empty() && cap.is_infinite() {
            rate[i] = f64::INFINITY;
            frozen[i] = true;
        }
    }
    loop {
        let mut users = vec![0usize; capacity.len()];
        for (i, (res, _)) in flows.iter().enumerate() {
            if !frozen[i] {
                for &r in res.iter() {
                    users[r] += 1;
                }
            }
        }
        let mut delta = f64::INFINITY;
        for (r, &n) in users.iter().enumerate() {
            if n > 0 {
                delta = delta.min(left[r].max(0.0) / n as f64);
            }
        }
        for (i, (_, cap)) in flows.iter().enumerate() {
            if !frozen[i] {
                delta = delta.min((cap - rate[i]).max(0.0));
            }
        }
        if !delta.is_finite() {
            break; // no unfrozen flow left
        }
        for (i, (res, _)) in flows.iter().enumerate() {
            if !frozen[i] {
                rate[i] += delta;
                for &r in res.iter() {
                    left[r] -= delta;
                }
            }
        }
        let saturated: Vec<bool> = left.iter().zip(capacity).map(|(l, c)| *l <= EPS * c.max(1.0)).collect();
        let mut progressed = false;
        for (i, (res, cap)) in flows.iter().enumerate() {
            if !frozen[i] && (rate[i] >= cap * (1.0 - EPS) || res.iter().any(|&r| saturated[r])) {
                frozen[i] = true;
                progressed = true;
            }
        }
        if !progressed {
            break; // numerical corner: nothing froze, rates are already fair
        }
    }
    rate
}

/// Completion time (us) of every flow: when its last byte has left, plus its latency.
pub fn simulate(capacity_gbps: &[f64], flows: &[FlowSpec]) -> Result<Vec<f64>> {
    for (r, c) in capacity_gbps.iter().enumerate() {
        if !(c.is_finite() && *c > 0.0) {
            return Err(Error::invalid(
                "capacity",
                format!("resource {r} has capacity {c} GB/s; must be finite and > 0"),
            ));
        }
    }
    for (i, f) in flows.iter().enumerate() {
        if !(f.bytes.is_finite() && f.bytes >= 0.0) {
            return Err(Error::invalid("bytes", format!("flow {i} has {} bytes", f.bytes)));
        }
        if !(f.start_us.is_finite() && f.latency_us.is_finite() && f.latency_us >= 0.0) {
            return Err(Error::invalid(
                "latency",
                format!("flow {i}: start {} us, latency {} us", f.start_us, f.latency_us),
            ));
        }
        if f.rate_cap_gbps.is_nan() || f.rate_cap_gbps <= 0.0 {
            return Err(Error::invalid(
                "rate_cap",
                format!("flow {i} has rate cap {} GB/s", f.rate_cap_gbps),
            ));
        }
        if let Some(&r) = f.resources.iter().find(|&&r| r >= capacity_gbps.len()) {
            return Err(Error::invalid(
                "resources",
                format!("flow {i} uses resource {r} of {}", capacity_gbps.len()),
            ));
        }
    }
    let n = flows.len();
    let mut left: Vec<f64> = flows.iter().map(|f| f.bytes).collect();
    let mut drained_at: Vec<Option<f64>> = vec![None; n];
    let mut t = flows.iter().map(|f| f.start_us).fold(f64::INFINITY, f64::min);
    if n == 0 {
        return Ok(Vec::new());
    }
    // Each pass drains a flow or starts one (2n events); rounding can leave a flow a few
    // bytes short and cost one extra tiny pass, so allow generous slack before giving up.
    for _ in 0..(8 * n + 16) {
        for i in 0..n {
            if drained_at[i].is_none() && flows[i].start_us <= t && left[i] <= EPS * flows[i].bytes.max(1.0) {
                drained_at[i] = Some(t.max(flows[i].start_us));
            }
        }
        let active: Vec<usize> = (0..n).filter(|&i| drained_at[i].is_none() && flows[i].start_us <= t).collect();
        let next_start = (0..n)
            .filter(|&i| drained_at[i].is_none() && flows[i].start_us > t)
            .map(|i| flows[i].start_us)
            .fold(f64::INFINITY, f64::min);
        if active.is_empty() {
            if next_start.is_infinite() {
                break;
            }
            t = next_start;
            continue;
        }
        let spec: Vec<(&[usize], f64)> = active
            .iter()
            .map(|&i| (flows[i].resources.as_slice(), flows[i].rate_cap_gbps))
            .collect();
        let rates = max_min_rates(capacity_gbps, &spec);
        // Time until the first active flow drains.
        let mut dt = next_start - t;
        let mut first = None;
        for (k, &i) in active.iter().enumerate() {
            let d = if rates[k].is_infinite() {
                0.0
            } else {
                left[i] / (rates[k] * BYTES_PER_US_PER_GBPS)
            };
            if d < dt || (first.is_none() && d <= dt) {
                dt = d;
                first = Some(i);
            }
        }
        for (k, &i) in active.iter().enumerate() {
            if rates[k].is_infinite() {
                left[i] = 0.0;
            } else {
                left[i] = (left[i] - rates[k] * BYTES_PER_US_PER_GBPS * dt).max(0.0);
            }
        }
        t += dt;
        if let Some(i) = first {
            left[i] = 0.0;
        }
    }
    drained_at
        .iter()
        .zip(flows)
        .enumerate()
        .map(|(i, (d, f))| {
            d.map(|d| d + f.latency_us)
                .ok_or_else(|| Error::invalid("flows", format!("flow {i} never drained (a rate of zero?)")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn one_flow_costs_latency_plus_bytes_over_bandwidth() {
        // 1 MB at 50 GB/s = 20 us, plus 0.5 us latency.
        let t = simulate(&[50.0], &[FlowSpec::new(vec![0], 1e6, 0.5)]).unwrap();
        assert!(close(t[0], 20.5), "{t:?}");
    }

    #[test]
    fn n_equal_flows_on_one_link_each_get_one_nth() {
        for n in 1..=8usize {
            let flows: Vec<FlowSpec> = (0..n).map(|_| FlowSpec::new(vec![0], 1e6, 0.0)).collect();
            let t = simulate(&[50.0], &flows).unwrap();
            for ti in &t {
                assert!(close(*ti, 20.0 * n as f64), "n={n}: {t:?}");
            }
            let rates = max_min_rates(&[50.0], &vec![(&[0usize][..], f64::INFINITY); n]);
            for r in rates {
                assert!(close(r, 50.0 / n as f64));
            }
        }
    }

    #[test]
    fn max_min_gives_the_leftover_to_the_unconstrained_flow() {
        // Link 0 (10 GB/s) shared by flows A and B; B also crosses link 1 (2 GB/s).
        // B is held to 2 by link 1, so A gets the remaining 8 (not 5).
        let r = max_min_rates(&[10.0, 2.0], &[(&[0][..], f64::INFINITY), (&[0, 1][..], f64::INFINITY)]);
        assert!(close(r[0], 8.0) && close(r[1], 2.0), "{r:?}");
        // A flow cap acts like a private link.
        let r = max_min_rates(&[10.0], &[(&[0][..], 3.0), (&[0][..], f64::INFINITY)]);
        assert!(close(r[0], 3.0) && close(r[1], 7.0), "{r:?}");
    }

    #[test]
    fn a_finished_flow_releases_its_share() {
        // Two flows on 10 GB/s: 10 kB and 30 kB. Both at 5 GB/s until the small one drains
        // at 2 us; the big one then has 20 kB left at 10 GB/s: done at 4 us.
        let t = simulate(&[10.0], &[FlowSpec::new(vec![0], 1e4, 0.0), FlowSpec::new(vec![0], 3e4, 0.0)]).unwrap();
        assert!(close(t[0], 2.0) && close(t[1], 4.0), "{t:?}");
    }

    #[test]
    fn late_starters_share_from_their_start() {
        let mut b = FlowSpec::new(vec![0], 1e4, 0.0);
        b.start_us = 1.0;
        // A alone for 1 us (10 kB done of 20 kB), then both at 5 GB/s: A done at 3, B at 3.
        let t = simulate(&[10.0], &[FlowSpec::new(vec![0], 2e4, 0.0), b]).unwrap();
        assert!(close(t[0], 3.0) && close(t[1], 3.0), "{t:?}");
    }

    #[test]
    fn zero_byte_flow_costs_only_latency_and_bad_inputs_are_errors() {
        let t = simulate(&[10.0], &[FlowSpec::new(vec![0], 0.0, 1.5)]).unwrap();
        assert!(close(t[0], 1.5));
        assert!(simulate(&[0.0], &[FlowSpec::new(vec![0], 1.0, 0.0)]).is_err());
        assert!(simulate(&[1.0], &[FlowSpec::new(vec![1], 1.0, 0.0)]).is_err());
        assert!(simulate(&[1.0], &[FlowSpec::new(vec![0], -1.0, 0.0)]).is_err());
    }

    proptest::proptest! {
        /// Max-min fairness, checked by its definition: the allocation is feasible, and
        /// every flow is either at its own cap or crosses a saturated resource on which no
        /// other flow gets more (its bottleneck). Also: no flow finishes before its own
        /// latency plus its bytes at the narrowest rate it could ever get.
        #[test]
        fn allocation_is_max_min_fair(
            caps in proptest::collection::vec(1.0f64..100.0, 1..6),
            flows in proptest::collection::vec((proptest::collection::vec(0usize..6, 1..4), 0.5f64..200.0, 1e3f64..1e6, 0.0f64..3.0), 1..12),
        ) {
            let nres = caps.len();
            let flows: Vec<(Vec<usize>, f64, f64, f64)> = flows
                .into_iter()
                .map(|(mut r, cap, bytes, lat)| {
                    r.iter_mut().for_each(|x| *x %= nres);
                    r.sort_unstable();
                    r.dedup();
                    (r, cap, bytes, lat)
                })
                .collect();
            let spec: Vec<(&[usize], f64)> = flows.iter().map(|(r, c, _, _)| (r.as_slice(), *c)).collect();
            let rates = max_min_rates(&caps, &spec);
            let mut load = vec![0.0; nres];
            for (i, (r, _, _, _)) in flows.iter().enumerate() {
                proptest::prop_assert!(rates[i] > 0.0);
                for &x in r {
                    load[x] += rates[i];
                }
            }
            for (x, l) in load.iter().enumerate() {
                proptest::prop_assert!(*l <= caps[x] * (1.0 + 1e-6), "resource {} over: {} > {}", x, l, caps[x]);
            }
            for (i, (r, cap, _, _)) in flows.iter().enumerate() {
                let at_cap = rates[i] >= cap * (1.0 - 1e-6);
                let bottleneck = r.iter().any(|&x| {
                    load[x] >= caps[x] * (1.0 - 1e-6)
                        && flows.iter().enumerate().all(|(j, (rj, _, _, _))| !rj.contains(&x) || rates[j] <= rates[i] * (1.0 + 1e-6))
                });
                proptest::prop_assert!(at_cap || bottleneck, "flow {} has neither cap nor bottleneck", i);
            }
            let specs: Vec<FlowSpec> = flows
                .iter()
                .map(|(r, c, b, l)| FlowSpec { resources: r.clone(), bytes: *b, start_us: 0.0, latency_us: *l, rate_cap_gbps: *c })
                .collect();
            let done = simulate(&caps, &specs).unwrap();
            for (f, t) in specs.iter().zip(&done) {
                let best = f.resources.iter().map(|&x| caps[x]).fold(f.rate_cap_gbps, f64::min);
                proptest::prop_assert!(*t >= f.latency_us + f.bytes / (best * 1e3) * (1.0 - 1e-9));
            }
        }
    }
}
