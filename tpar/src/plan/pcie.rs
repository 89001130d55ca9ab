//! The PCIe decision without a profile ([`by_simulator`]): the calibrated simulator's
//! fastest runnable algorithm where its figures are measured, else NCCL unless the algorithm
//! beats it even at the bound.

use super::*;

/// PCIe (peer-to-peer, or through host memory where GPUs have no P2P), no profile: the
/// calibrated simulator's fastest algorithm among those that run here (`feasibility::check`),
/// where the figures its time rests on are measured; where one is not (no probe, profile or
/// published figure for this box measures that operation under load), only if it beats NCCL
/// even with those figures at the bound (`Simulator::predict_bound`), else NCCL, and the
/// reason names the unmeasured figures. No push algorithm where a profile measured reads
/// beating writes (a measurement of this machine outranks the model).
pub(super) fn by_simulator(s: u64, f: &Fabric, forced: Option<Transport>, reads_win: bool, links: &Links<'_>, capture: CaptureMode) -> Plan {
    let n = f.world;
    let size = human_bytes(s);
    let topo = links.topology;
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
        if reads_win && !spec.reads_remote && a != Algorithm::Nccl {
            pushes.push(a.name());
            continue;
        }
        runnable.push((a, t));
    }
    if !pushes.is_empty() {
        skipped.insert(0, format!("no push algorithm ({}): the profile measured reads beating writes", pushes.join(", ")));
    }
    let algos: Vec<Algorithm> = runnable.iter().map(|&(a, _)| a).collect();
    let costs = sim_cost::costs(topo, n, s, capture, &algos);
    let mut timed: Vec<(Algorithm, Transport, sim_cost::Cost)> = Vec::new();
    for (a, t) in runnable {
        match costs.iter().find(|(b, _)| *b == a).map(|(_, c)| c.clone()) {
            Some(Ok(c)) if c.us.is_finite() => timed.push((a, t, c)),
            Some(Err(why)) => skipped.push(format!("{a} not timed by the simulator ({why})")),
            Some(Ok(_)) | None => skipped.push(format!("{a} not timed by the simulator")),
        }
    }
    timed.sort_by(|x, y| x.2.us.total_cmp(&y.2.us));
    let place = if !f.p2p_write {
        match f.missing_write {
            Some((i, j)) => format!("PCIe, no P2P (GPU{i} cannot write GPU{j}): through host memory"),
            None => "PCIe, no P2P: through host memory".to_string(),
        }
    } else if f.islands >= 2 {
        format!("PCIe P2P, {} islands (largest {})", f.islands, f.largest_island)
    } else {
        "PCIe P2P".to_string()
    };
    let others = timed.iter().skip(1).take(3).map(|(a, _, c)| format!("{a} {:.1}", c.us)).collect::<Vec<_>>().join(", ");
    let notes = if skipped.is_empty() { String::new() } else { format!("; {}", skipped.join("; ")) };
    let nccl_cost = timed.iter().find(|(a, _, _)| *a == Algorithm::Nccl).map(|(_, _, c)| c.clone());
    let nccl_us = nccl_cost.as_ref().map(|c| c.us);
    let nccl_src = nccl_source(topo, n, s, capture);
    let head = format!("{place}, {n} ranks, {size}: simulator (docs/sim.md)");
    let Some((a, t, c)) = timed.first().cloned() else {
        return nccl(format!("{head} timed nothing that runs here: NCCL{notes}"));
    };
    let source = links.source(c.source);
    if a == Algorithm::Nccl {
        return nccl(format!("{head} times NCCL fastest at {:.1} us (then {others}){notes}", c.us)).timed(Some(c.us), nccl_src, Some(c.us), Some(nccl_src));
    }
    let vs = nccl_us.map(|u| format!(" vs NCCL {u:.1}")).unwrap_or_default();
    if source.measured() {
        return make(a, t, s, f, format!("{head} fastest runnable: {a} {:.1} us{vs} (then {others}); its figures: {source}{notes}", c.us))
            .timed(Some(c.us), source, nccl_us, Some(nccl_src));
    }
    // The pick's time rests on a figure nothing measured on this box: keep it only where it
    // beats NCCL even with that figure at the bound.
    let unmeasured = c.unmeasured.join(", ");
    let bound = crate::sim::params::UNMEASURED_GPU_GBPS;
    match nccl_us {
        Some(nu) if c.bound_us >= nu => {
            let mut p = nccl(format!(
                "{head} fastest runnable: {a} {:.1} us{vs}, but that rests on unmeasured {unmeasured}: at the bound ({bound} GB/s per GPU, the worst published) it takes {:.1} us, no faster than NCCL: NCCL until a tune or `tpar topo --probe` measures them{notes}",
                c.us, c.bound_us
            ))
            .timed(Some(nu), nccl_src, Some(nu), Some(nccl_src));
            p.instead_of = Some(Unmeasured { algorithm: a, us: c.us, bound_us: c.bound_us });
            p
        }
        Some(nu) => make(
            a,
            t,
            s,
            f,
            format!(
                "{head} fastest runnable: {a} {:.1} us{vs} (then {others}); it rests on unmeasured {unmeasured}, and holds at the bound ({bound} GB/s per GPU, the worst published): {:.1} us < NCCL {nu:.1}{notes}",
                c.us, c.bound_us
            ),
        )
        .timed(Some(c.us), source, Some(nu), Some(nccl_src))
        .bounded(c.bound_us),
        None => nccl(format!("{head} fastest runnable: {a} {:.1} us, which rests on unmeasured {unmeasured}, and NCCL has no time to hold it against: NCCL{notes}", c.us)),
    }
}
