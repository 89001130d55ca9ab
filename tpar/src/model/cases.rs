//! The cases `tpar model` and `tpar doctor` model: tpar's side as `tpar::plan`'s pick timed by
//! the simulator ([`PlanLatency`]), NCCL as measured where docs/references.md has it
//! ([`nccl_on`]), the founding case or this machine's measurements ([`default_case`]), and the
//! side-by-side report on a topology ([`sim_case_report`]). Split from `model/mod.rs`, which
//! keeps the step-time arithmetic these feed.

use super::latency::{ArLatency, BenchLatency, FromFn, LogLogTable};
use super::{ModelInput, FOUNDING_NCCL_DECODE_US, FOUNDING_NCCL_VERIFY_US, FOUNDING_TOPOLOGY};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What tpar runs at each size, timed: `tpar::plan`'s pick on a topology (no profile, no
/// overrides); the simulator's time where the pick is a tpar kernel, and where the pick is
/// NCCL, NCCL's own latency from `nccl` (so a measured NCCL stays the measured one).
pub struct PlanLatency {
    topology: crate::topology::Topology,
    tp: usize,
    dtype: DType,
    graph: bool,
    sim: crate::sim::Simulator,
    nccl: Box<dyn ArLatency>,
}

impl PlanLatency {
    pub fn new(topology: &crate::topology::Topology, tp: usize, dtype: DType, graph: bool, nccl: Box<dyn ArLatency>) -> Result<Self> {
        use crate::sim::{Launch, Params, Simulator};
        let sim = Simulator::new(topology, tp, &Params::with_launch(if graph { Launch::Graph } else { Launch::Eager }))?;
        Ok(PlanLatency { topology: topology.clone(), tp, dtype, graph, sim, nccl })
    }

    /// The plan for a call of `bytes`.
    pub fn plan(&self, bytes: usize) -> crate::plan::Plan {
        use crate::plan::{plan, Backend, CaptureMode, Overrides, PlanInput};
        let overrides = Overrides::default();
        plan(&PlanInput {
            topology: &self.topology,
            world: self.tp,
            bytes: bytes as u64,
            dtype: self.dtype,
            capture: if self.graph { CaptureMode::Graph } else { CaptureMode::Eager },
            backend: Backend::Cuda,
            profile: None,
            overrides: &overrides,
        })
    }
}

impl ArLatency for PlanLatency {
    fn latency(&self, bytes: usize) -> Result<(f64, String)> {
        let p = self.plan(bytes);
        let name = &self.topology.name;
        if p.algorithm == crate::kinds::Algorithm::Nccl {
            let (us, src) = self.nccl.latency(bytes)?;
            let why = match p.instead_of {
                Some(u) => format!("{} rests on unmeasured figures", u.algorithm),
                None => "NCCL fastest".to_string(),
            };
            return Ok((us, format!("nccl: tpar plan's pick on {name} ({why}); {src}")));
        }
        let us = self.sim.predict(p.algorithm, bytes)?.total_us;
        let from = p.source.map(|s| s.name()).unwrap_or("-");
        let holds = if p.bound_us.is_some() { ", holds at the bound" } else { "" };
        Ok((us, format!("{}: tpar plan's pick on {name}, timed by the simulator (figures {from}{holds})", p.algorithm)))
    }
}

/// This machine's all-reduce measurements for the model: NCCL and tpar's algorithms timed on
/// the ranks' GPUs (`tpar bench --json` records; what a tune measures). The seam through which
/// `tpar model` on a machine with GPUs will use that machine's figures instead of the
/// founding case's (docs/model.md, "On your GPUs").
pub struct Measured<'a> {
    pub records: &'a [crate::report::Record],
    /// What was measured, for the report (e.g. "this machine, 8x H200").
    pub machine: &'a str,
}

/// What `tpar model` models when it is handed no figures: a title, one line per figure
/// saying where it comes from, the model input and the two latency sources.
pub struct Case {
    pub title: String,
    pub sources: Vec<String>,
    pub input: ModelInput,
    pub nccl: Box<dyn ArLatency>,
    pub plan: Box<dyn ArLatency>,
}

/// The default case: this machine's measurements when there are some (`measured`), else the
/// founding case of docs/model.md with NCCL as measured there, never a simulated NCCL: tpar's
/// side is `tpar::plan`'s pick on [`FOUNDING_TOPOLOGY`] (an assumption the report states),
/// timed by the simulator where it picks a kernel, NCCL as measured where it picks NCCL.
pub fn default_case(input: ModelInput, measured: Option<&Measured<'_>>) -> Result<Case> {
    if let Some(m) = measured {
        let nccl = BenchLatency::from_records(m.records, input.tp, |a| a == crate::kinds::Algorithm::Nccl)?;
        let plan = BenchLatency::from_records(m.records, input.tp, |a| a != crate::kinds::Algorithm::Nccl)?;
        return Ok(Case {
            title: format!("measured on {}", m.machine),
            sources: vec![format!("NCCL and tpar: measured on {} (profile)", m.machine)],
            input,
            nccl: Box::new(nccl),
            plan: Box::new(plan),
        });
    }
    let points = vec![(input.ar_bytes(1) as f64, FOUNDING_NCCL_DECODE_US), (input.ar_bytes(3) as f64, FOUNDING_NCCL_VERIFY_US)];
    let table = LogLogTable::new(crate::kinds::Algorithm::Nccl, points)?;
    let measured = move |b: usize| table.latency(b).map(|(us, how)| (us, format!("nccl as measured on the founding box ({how})")));
    let topology = crate::topology::presets::by_name(FOUNDING_TOPOLOGY).ok_or_else(|| Error::invalid("topology", format!("no preset {FOUNDING_TOPOLOGY}")))?;
    let table2 = LogLogTable::new(crate::kinds::Algorithm::Nccl, vec![(input.ar_bytes(1) as f64, FOUNDING_NCCL_DECODE_US), (input.ar_bytes(3) as f64, FOUNDING_NCCL_VERIFY_US)])?;
    let fallback = FromFn(move |b: usize| table2.latency(b).map(|(us, how)| (us, format!("as measured on the founding box ({how})"))));
    let plan = PlanLatency::new(&topology, input.tp, input.dtype, false, Box::new(fallback))?;
    Ok(Case {
        title: "the founding case (docs/model.md): 8x RTX PRO 6000 Blackwell, PCIe Gen5, Kimi-K2 class at TP 8, EAGLE-3".into(),
        sources: vec![
            format!(
                "NCCL: as measured on that box (docs/references.md): {FOUNDING_NCCL_VERIFY_US} us per 42 KiB verify all-reduce (200-250 us, eager, untuned: measured), {FOUNDING_NCCL_DECODE_US} us per 14 KiB decode all-reduce (derived from 89.5 tok/s)"
            ),
            format!("tpar: tpar::plan's pick on {FOUNDING_TOPOLOGY}, eager (the box's topology is not stated: assumed), timed by the simulator where it picks a kernel, NCCL as measured where it picks NCCL"),
            format!(
                "compute: backed out of 89.5 tok/s plain decode (measured); draft {} ms and {} tokens per verify step: derived from 54.8 tok/s (docs/model.md section 3)",
                input.draft_ms, input.acceptance
            ),
        ],
        input,
        nccl: Box::new(FromFn(measured)),
        plan: Box::new(plan),
    })
}

/// NCCL's latency on `topology` for `tp` ranks: the published NCCL sweep for this exact box,
/// world and launch mode where docs/references.md has one (measured; log-log between its
/// points, and the label says when a size lies outside them), else the simulator's, labelled
/// simulated. A simulated NCCL is never presented as the baseline where a measured one exists.
pub fn nccl_on(topology: &crate::topology::Topology, tp: usize, graph: bool) -> Result<Box<dyn ArLatency>> {
    use crate::sim::{Launch, Params, Simulator};
    let launch = if graph { Launch::Graph } else { Launch::Eager };
    if let Some(f) = crate::sim::calibrate::published_nccl(topology, tp, launch) {
        let table = LogLogTable::new(crate::kinds::Algorithm::Nccl, f.points.iter().map(|&(b, us)| (b as f64, us)).collect())?;
        let label = format!("nccl as measured on this box ({}, group {})", f.source, f.group);
        return Ok(Box::new(FromFn(move |b: usize| table.latency(b).map(|(us, how)| (us, format!("{label}, {how}"))))));
    }
    let sim = Simulator::new(topology, tp, &Params::with_launch(launch))?;
    let name = topology.name.clone();
    Ok(Box::new(FromFn(move |b: usize| Ok((sim.predict(crate::kinds::Algorithm::Nccl, b)?.total_us, format!("nccl simulated on {name} (no measured NCCL for this box in docs/references.md)"))))))
}

/// The founding case's question on a topology: per call and per verify step, the all-reduce
/// time under NCCL (measured where docs/references.md has it for this box, else simulated:
/// [`nccl_on`]) and under tpar's pick (what `tpar::plan` chooses, timed by the simulator, or
/// NCCL's time where it picks NCCL), side by side, naming the topology and where each time
/// came from. `tpar model --sim TOPOLOGY` prints it above its table.
pub fn sim_case_report(topology: &crate::topology::Topology, input: &ModelInput, graph: bool) -> Result<String> {
    let nccl = nccl_on(topology, input.tp, graph)?;
    let ours = PlanLatency::new(topology, input.tp, input.dtype, graph, nccl_on(topology, input.tp, graph)?)?;
    let a = input.ars_per_step() as f64;
    let mut out = format!(
        "# modelled topology: {} ({} GPUs, TP {}), {} launches\n",
        topology.name,
        topology.gpu_count(),
        input.tp,
        if graph { "CUDA-graph" } else { "eager" }
    );
    out.push_str("step     AR bytes    nccl us  tpar pick      tpar us  x nccl  AR/step nccl ms  AR/step tpar ms\n");
    let mut notes: Vec<String> = Vec::new();
    for (label, tokens) in [("decode", 1), ("verify", input.verify_width)] {
        let bytes = input.ar_bytes(tokens);
        let (n_us, n_src) = nccl.latency(bytes)?;
        let (t_us, t_src) = ours.latency(bytes)?;
        let pick = ours.plan(bytes).algorithm;
        out.push_str(&format!(
            "{label:<8} {:>8} {n_us:>10.1}  {:<13} {t_us:>7.1} {:>6.2}x {:>16.2} {:>16.2}\n",
            crate::units::human_bytes(bytes as u64),
            pick.name(),
            n_us / t_us,
            a * n_us / 1e3,
            a * t_us / 1e3
        ));
        notes.push(format!("# {label}: nccl: {n_src}; tpar: {t_src}"));
    }
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod sim_case_tests {
    use super::super::latency::Fixed;
    use super::super::{evaluate, REFERENCE_BASELINE_TOK_S};
    use super::*;

    #[test]
    fn the_default_case_is_the_founding_case_with_nccl_as_measured() {
        let case = default_case(ModelInput::founding_case(), None).unwrap();
        let out = evaluate(&case.input, case.nccl.as_ref(), &[("plan", case.plan.as_ref())]).unwrap();
        let (n, p) = (&out.scenarios[0], &out.scenarios[1]);
        // docs/model.md's measured case: 89.5 tok/s plain, 54.6 with speculation, break-even 2.95.
        assert!((n.plain.tok_s() - REFERENCE_BASELINE_TOK_S).abs() < 1e-9);
        assert_eq!((n.plain.ar_us, n.spec.ar_us), (FOUNDING_NCCL_DECODE_US, FOUNDING_NCCL_VERIFY_US));
        assert!((n.spec.tok_s() - 54.6).abs() < 0.05 && (n.break_even_acceptance - 2.95).abs() < 0.005, "{n:?}");
        assert!(n.spec.ar_source.contains("as measured"), "never a simulated NCCL: {}", n.spec.ar_source);
        // Where the plan takes NCCL, tpar's side costs NCCL's measured time, not a simulated one.
        let topo = crate::topology::presets::by_name(FOUNDING_TOPOLOGY).unwrap();
        let pl = PlanLatency::new(&topo, 8, DType::BF16, false, Box::new(Fixed(FOUNDING_NCCL_VERIFY_US))).unwrap();
        for (st, bytes) in [(&p.plain, 14_336usize), (&p.spec, 43_008)] {
            if pl.plan(bytes).algorithm == crate::kinds::Algorithm::Nccl {
                assert_eq!(st.ar_us, if bytes == 14_336 { FOUNDING_NCCL_DECODE_US } else { FOUNDING_NCCL_VERIFY_US }, "{st:?}");
            } else {
                assert!(st.ar_source.contains("timed by the simulator"), "{st:?}");
            }
        }
        assert!(case.sources.iter().any(|l| l.contains(FOUNDING_TOPOLOGY) && l.contains("assumed")), "{:?}", case.sources);
    }

    #[test]
    fn measured_records_replace_the_founding_case() {
        // The seam a tune fills: this machine's records, NCCL and tpar, decide both sides.
        use crate::report::Record;
        let rec = |a, bytes: usize, us| Record::measured(a, "cuda", DType::BF16, 8, bytes / 2, (us, us, us), 0);
        let records = vec![
            rec(crate::kinds::Algorithm::Nccl, 14_336, 20.0),
            rec(crate::kinds::Algorithm::Nccl, 43_008, 25.0),
            rec(crate::kinds::Algorithm::TwoshotPush, 14_336, 8.0),
            rec(crate::kinds::Algorithm::TwoshotPush, 43_008, 10.0),
        ];
        let m = Measured { records: &records, machine: "a test box" };
        let case = default_case(ModelInput::founding_case(), Some(&m)).unwrap();
        assert!((case.nccl.latency(43_008).unwrap().0 - 25.0).abs() < 1e-9);
        assert!((case.plan.latency(14_336).unwrap().0 - 8.0).abs() < 1e-9);
        assert!(case.title.contains("a test box"));
    }

    #[test]
    fn a_box_with_a_measured_nccl_never_gets_a_simulated_one() {
        let ds = crate::topology::presets::rtxpro6000_dualsocket_8();
        let (us, src) = nccl_on(&ds, 8, false).unwrap().latency(16_384).unwrap();
        assert!((us - 69.3).abs() < 1e-9);
        assert!(src.contains("as measured"), "{src}");
        // In graphs nothing is published for that box: simulated, and said so.
        let (_, src) = nccl_on(&ds, 8, true).unwrap().latency(16_384).unwrap();
        assert!(src.contains("simulated"), "{src}");
    }

    #[test]
    fn founding_case_report_names_the_topology_and_both_times() {
        let t = crate::topology::presets::rtxpro6000_pcie_switch_8();
        let r = sim_case_report(&t, &ModelInput::default(), false).unwrap();
        assert!(r.contains("rtxpro6000-pcie-switch-8"), "{r}");
        let verify = r.lines().find(|l| l.starts_with("verify")).unwrap();
        let cols: Vec<&str> = verify.split_whitespace().collect();
        // verify, 42, KiB, nccl us, pick, tpar us, ratio, nccl ms, tpar ms
        let (nccl, ours): (f64, f64) = (cols[3].parse().unwrap(), cols[5].parse().unwrap());
        assert!(ours < nccl, "tpar's pick must beat NCCL in the simulator here: {r}");
    }
}
