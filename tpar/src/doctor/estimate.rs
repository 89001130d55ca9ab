//! The verify-step estimate of `tpar doctor`: `tpar model`'s arithmetic (122 all-reduces per
//! step of a Kimi-K2-class model; decode carries 1 token, a speculative verify 3) with the
//! all-reduce times of NCCL and of tpar's pick, each with where it comes from.
//!
//! | machine | tpar's side | NCCL's side |
//! |---|---|---|
//! | GPUs (discovered or a preset), a tuned profile that applies | the profile's medians (measured) | `model::nccl_on`: published for that box, else simulated |
//! | GPUs, no profile | `model::PlanLatency`: the plan's pick, timed by the simulator | the same |
//! | no GPU and no preset | `model::default_case`: the founding case (docs/model.md) | as measured on the founding box |
//!
//! Must never: present a simulated figure as measured (every time carries its source), or fail
//! (a case that cannot be modelled says why).

use crate::dtype::DType;
use crate::kinds::{Backend, CaptureMode};
use crate::model::{self, ArLatency, ModelInput};
use crate::plan::profile::{Profile, ProfileFingerprint};
use crate::topology::Topology;
use serde::{Deserialize, Serialize};

/// One step's all-reduce: NCCL's time and tpar's, per call, and over the step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `decode` or `verify`.
    pub step: String,
    pub tokens: usize,
    pub mode: CaptureMode,
    pub bytes: usize,
    pub nccl_us: f64,
    pub nccl_from: String,
    pub tpar_us: f64,
    pub tpar_from: String,
}

/// The estimate, or why there is none.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Estimate {
    /// What is modelled (the machine or preset, and the model).
    pub case: String,
    /// All-reduces per step.
    pub ars_per_step: usize,
    /// Where the figures come from, one line each.
    pub sources: Vec<String>,
    pub rows: Vec<Row>,
    /// Throughput lines where the compute is known (the founding case).
    pub throughput: Vec<String>,
    /// Why there is no estimate.
    pub unavailable: Option<String>,
}

/// The estimate for `tp` ranks (default: the topology's GPUs, else the founding case's TP).
pub fn estimate(t: &Topology, discovered: bool, tp: Option<usize>, hidden: usize, profile: Option<&Profile>) -> Estimate {
    let gpus = t.gpu_count();
    let tp = tp.unwrap_or(if gpus > 0 { gpus } else { model::KIMI_TP });
    let input = ModelInput { hidden, tp, ..ModelInput::founding_case() };
    let mut e = Estimate { ars_per_step: input.ars_per_step(), ..Estimate::default() };
    if tp < 2 {
        e.unavailable = Some(format!("TP {tp}: no all-reduce to estimate (give --tp N)"));
        return e;
    }
    let result = if gpus == 0 { founding(&input, &mut e) } else { on_topology(t, discovered, &input, profile, &mut e) };
    if let Err(err) = result {
        e.rows.clear();
        e.unavailable = Some(format!("no estimate: {err}"));
    }
    e
}

fn row(input: &ModelInput, step: &str, tokens: usize, mode: CaptureMode, nccl: &dyn ArLatency, ours: &dyn ArLatency) -> crate::error::Result<Row> {
    let bytes = input.ar_bytes(tokens);
    let (nccl_us, nccl_from) = nccl.latency(bytes)?;
    let (tpar_us, tpar_from) = ours.latency(bytes)?;
    Ok(Row { step: step.into(), tokens, mode, bytes, nccl_us, nccl_from, tpar_us, tpar_from })
}

/// No GPU and no preset: `model::default_case`, the founding case as docs/model.md works it.
fn founding(input: &ModelInput, e: &mut Estimate) -> crate::error::Result<()> {
    let case = model::default_case(input.clone(), None)?;
    e.case = format!("no GPU here, so {}", case.title);
    e.sources = case.sources.clone();
    for (step, tokens) in [("decode", 1), ("verify", input.verify_width)] {
        e.rows.push(row(input, step, tokens, CaptureMode::Eager, case.nccl.as_ref(), case.plan.as_ref())?);
    }
    let out = model::evaluate(&case.input, case.nccl.as_ref(), &[("tpar", case.plan.as_ref())])?;
    for s in &out.scenarios {
        e.throughput.push(format!(
            "{}: {:.1} tok/s plain, {:.1} tok/s speculative; speculation pays above {:.2} accepted tokens per verify (the founding run accepted {:.2})",
            s.label,
            s.plain.tok_s(),
            s.spec.tok_s(),
            s.break_even_acceptance,
            case.input.acceptance
        ));
    }
    Ok(())
}

/// A machine with GPUs: the profile's medians where one applies, else the plan's pick timed
/// by the simulator; NCCL published for the box where docs/references.md has it, else
/// simulated.
fn on_topology(t: &Topology, discovered: bool, input: &ModelInput, profile: Option<&Profile>, e: &mut Estimate) -> crate::error::Result<()> {
    let what = if discovered { "this machine".to_string() } else { format!("the {} preset", t.name) };
    e.case = format!("{what}, TP {}, a Kimi-K2-class model ({} layers x {} all-reduces, hidden {}, {})", input.tp, input.layers, input.ar_per_layer, input.hidden, input.dtype);
    let driver = if discovered { crate::topology::nvml::driver_version() } else { None };
    for mode in [CaptureMode::Eager, CaptureMode::Graph] {
        let graph = mode == CaptureMode::Graph;
        let nccl = model::nccl_on(t, input.tp, graph)?;
        let tuned = profile.filter(|p| p.mismatch(&ProfileFingerprint::new(t, driver.clone(), Backend::Cuda, input.tp, mode)).is_none());
        let ours: Box<dyn ArLatency> = match tuned {
            Some(p) => Box::new(model::ProfileLatency::new(p, DType::BF16)?),
            None => Box::new(model::PlanLatency::new(t, input.tp, input.dtype, graph, model::nccl_on(t, input.tp, graph)?)?),
        };
        let source = match tuned {
            Some(_) => format!("{mode}: tpar from the tuned profile (measured here); NCCL {}", nccl_kind(nccl.as_ref(), input)),
            None => format!("{mode}: tpar's pick timed by the simulator (not measured; `tpar tune` measures); NCCL {}", nccl_kind(nccl.as_ref(), input)),
        };
        e.sources.push(source);
        for (step, tokens) in [("decode", 1), ("verify", input.verify_width)] {
            e.rows.push(row(input, step, tokens, mode, nccl.as_ref(), ours.as_ref())?);
        }
    }
    Ok(())
}

/// Whether NCCL's figure is measured (published) or simulated, from its own label.
fn nccl_kind(nccl: &dyn ArLatency, input: &ModelInput) -> &'static str {
    match nccl.latency(input.ar_bytes(1)) {
        Ok((_, from)) if from.contains("as measured") => "as published for this box (docs/references.md)",
        Ok(_) => "simulated (no measured NCCL for this box)",
        Err(_) => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    #[test]
    fn without_gpus_it_is_the_founding_case_with_nccl_as_measured() {
        let e = estimate(&Topology::cpu(), true, None, model::KIMI_HIDDEN, None);
        assert!(e.unavailable.is_none(), "{e:?}");
        assert_eq!(e.ars_per_step, 122);
        let verify = e.rows.iter().find(|r| r.step == "verify").unwrap();
        assert_eq!((verify.bytes, verify.nccl_us), (43_008, model::FOUNDING_NCCL_VERIFY_US));
        assert!(verify.nccl_from.contains("as measured"), "{verify:?}");
        assert!(e.case.contains("founding") && e.throughput.len() == 2, "{e:?}");
    }

    #[test]
    fn a_preset_is_simulated_and_says_so() {
        let t = presets::rtxpro6000_pcie_switch_8();
        let e = estimate(&t, false, Some(8), model::KIMI_HIDDEN, None);
        assert!(e.unavailable.is_none(), "{e:?}");
        assert_eq!(e.rows.len(), 4, "decode and verify, eager and graph");
        assert!(e.case.contains("rtxpro6000-pcie-switch-8"), "{}", e.case);
        assert!(e.sources.iter().all(|s| s.contains("simulator")), "{:?}", e.sources);
        let verify = e.rows.iter().find(|r| r.step == "verify" && r.mode == CaptureMode::Eager).unwrap();
        assert!(verify.tpar_us < verify.nccl_us, "tpar's pick beats NCCL at 42 KiB on this box: {verify:?}");
        assert!(estimate(&t, false, Some(1), model::KIMI_HIDDEN, None).unavailable.is_some());
    }
}
