//! What all-reduce latency does to decode throughput, with and without speculation.
//!
//! Owns: the step-time arithmetic behind `tpar model` and the latency sources it reads
//! (a fixed figure, `tpar bench --json` records interpolated log-log, or any closure such as
//! the simulator). Must never do I/O: callers load files and hand in records.
//!
//! A decode step costs `compute + ARs x ar(1 token)`; a speculative step costs
//! `verify_compute_factor x compute + ARs x ar(width tokens) + draft` and yields `acceptance`
//! tokens. ARs = layers x all-reduces per layer; an all-reduce carries tokens x hidden x
//! dtype bytes. The break-even acceptance is the number of tokens a speculative step must
//! yield to match plain decode: `spec_step / plain_step`.

mod cases;
mod latency;

pub use cases::{default_case, nccl_on, sim_case_report, Case, Measured, PlanLatency};
pub use latency::{ArLatency, BenchLatency, Fixed, FromFn, LogLogTable, ProfileLatency};

use crate::error::{Error, Result};
use crate::dtype::DType;

/// Kimi-K2 / DeepSeek-V3 layer count (docs/references.md, "Model shapes").
pub const KIMI_LAYERS: usize = 61;
/// Kimi-K2 / DeepSeek-V3 hidden size (docs/references.md).
pub const KIMI_HIDDEN: usize = 7168;
/// Two all-reduces per layer: after attention and after the MLP (docs/references.md).
pub const KIMI_AR_PER_LAYER: usize = 2;
/// Tensor-parallel size of the docs/references.md case.
pub const KIMI_TP: usize = 8;
/// Plain-decode throughput with NCCL in the docs/references.md case (8x RTX PRO 6000), tok/s.
pub const REFERENCE_BASELINE_TOK_S: f64 = 89.5;
/// The founding case's NCCL in plain decode, us per 14 KiB all-reduce. Derived (docs/model.md
/// section 2): 89.5 tok/s is an 11.17 ms step; minus 2.5 ms of compute, 122 all-reduces.
pub const FOUNDING_NCCL_DECODE_US: f64 = 71.0;
/// The founding case's NCCL in the verify step, us per 42 KiB all-reduce. Measured: 200-250 us
/// per call, eager and untuned (docs/references.md); the midpoint.
pub const FOUNDING_NCCL_VERIFY_US: f64 = 225.0;
/// Tokens per verify step the founding run achieved. Derived (docs/model.md section 3): 54.8
/// tok/s with a 30 ms verify step and a draft of a few ms.
pub const FOUNDING_ACCEPTANCE: f64 = 1.8;
/// Draft cost per verify step in the founding run, ms. Derived with the acceptance above
/// (docs/model.md section 3).
pub const FOUNDING_DRAFT_MS: f64 = 3.0;
/// The preset `tpar model` times tpar's pick on for the founding case. Assumed: the founding
/// box's write-up names 8 RTX PRO 6000 on PCIe Gen5 but not its topology; this preset is the
/// two-socket ASUS box, whose own figures are published (docs/references.md).
pub const FOUNDING_TOPOLOGY: &str = "rtxpro6000-dualsocket-8";

/// How the compute time of a decode step is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compute {
    /// Compute (everything but all-reduces) of a one-token decode step, ms.
    StepMs(f64),
    /// A measured plain-decode throughput with NCCL, tok/s; compute is backed out of it.
    BaselineTokS(f64),
}

/// The model and serving setup.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInput {
    pub layers: usize,
    pub hidden: usize,
    pub dtype: DType,
    pub ar_per_layer: usize,
    pub tp: usize,
    pub compute: Compute,
    /// Tokens per verify step (the all-reduce carries this many rows).
    pub verify_width: usize,
    /// Verify compute as a multiple of one-token decode compute. 1.0: decode is bound by
    /// reading weights, which a few more rows do not change (an assumption, not measured).
    pub verify_compute_factor: f64,
    /// Cost of drafting per verify step, ms (draft model compute and its own collectives).
    pub draft_ms: f64,
    /// Tokens yielded per verify step (accepted drafts + the bonus token).
    pub acceptance: f64,
}

impl Default for ModelInput {
    /// Kimi-K2 class at TP 8 with the docs/references.md serving case: 89.5 tok/s plain,
    /// 3-token verify, 2.75 accepted (middle of EAGLE-3's 2.3-3.2), draft cost 3 ms (a guess:
    /// docs/references.md gives none; see docs/model.md).
    fn default() -> Self {
        ModelInput {
            layers: KIMI_LAYERS,
            hidden: KIMI_HIDDEN,
            dtype: DType::BF16,
            ar_per_layer: KIMI_AR_PER_LAYER,
            tp: KIMI_TP,
            compute: Compute::BaselineTokS(REFERENCE_BASELINE_TOK_S),
            verify_width: 3,
            verify_compute_factor: 1.0,
            draft_ms: 3.0,
            acceptance: 2.75,
        }
    }
}

impl ModelInput {
    /// The founding case (docs/model.md): Kimi-K2 class at TP 8, 89.5 tok/s plain decode with
    /// NCCL, a 3-token verify that accepted 1.8 tokens with a 3 ms draft.
    pub fn founding_case() -> Self {
        ModelInput { acceptance: FOUNDING_ACCEPTANCE, draft_ms: FOUNDING_DRAFT_MS, ..ModelInput::default() }
    }

    /// All-reduces per step.
    pub fn ars_per_step(&self) -> usize {
        self.layers * self.ar_per_layer
    }

    /// Bytes of one all-reduce carrying `tokens` rows.
    pub fn ar_bytes(&self, tokens: usize) -> usize {
        tokens * self.hidden * self.dtype.size()
    }

    fn check(&self) -> Result<()> {
        let pos = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(field, format!("must be a positive number, got {v}")))
            }
        };
        pos("layers", self.layers as f64)?;
        pos("hidden", self.hidden as f64)?;
        pos("ar_per_layer", self.ar_per_layer as f64)?;
        pos("tp", self.tp as f64)?;
        pos("verify_width", self.verify_width as f64)?;
        pos("verify_compute_factor", self.verify_compute_factor)?;
        pos("acceptance", self.acceptance)?;
        if !(self.draft_ms.is_finite() && self.draft_ms >= 0.0) {
            return Err(Error::invalid("draft_ms", format!("must be >= 0, got {}", self.draft_ms)));
        }
        match self.compute {
            Compute::StepMs(v) if !(v.is_finite() && v >= 0.0) => Err(Error::invalid("compute_ms", format!("must be >= 0, got {v}"))),
            Compute::BaselineTokS(v) => pos("baseline_tok_s", v),
            _ => Ok(()),
        }
    }
}

/// Where one step's time goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub compute_ms: f64,
    pub allreduce_ms: f64,
    pub draft_ms: f64,
    /// Latency of each all-reduce, us, and its size in bytes.
    pub ar_us: f64,
    pub ar_bytes: usize,
    /// What produced `ar_us`.
    pub ar_source: String,
    /// Tokens the step yields.
    pub tokens: f64,
}

impl Step {
    pub fn total_ms(&self) -> f64 {
        self.compute_ms + self.allreduce_ms + self.draft_ms
    }
    pub fn tok_s(&self) -> f64 {
        self.tokens * 1e3 / self.total_ms()
    }
}

/// One all-reduce provider's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// `nccl` or `plan`.
    pub label: String,
    pub plain: Step,
    pub spec: Step,
    /// Tokens per verify step at which speculation matches plain decode.
    pub break_even_acceptance: f64,
}

/// Everything `tpar model` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelOutput {
    pub ars_per_step: usize,
    /// Compute of a one-token step, ms, and whether it was given or backed out.
    pub compute_ms: f64,
    pub compute_backed_out: bool,
    pub scenarios: Vec<Scenario>,
}

fn scenario(input: &ModelInput, label: &str, compute_ms: f64, lat: &dyn ArLatency) -> Result<Scenario> {
    let ars = input.ars_per_step() as f64;
    let (b1, bw) = (input.ar_bytes(1), input.ar_bytes(input.verify_width));
    let (us1, src1) = lat.latency(b1)?;
    let (usw, srcw) = lat.latency(bw)?;
    let plain = Step {
        compute_ms,
        allreduce_ms: ars * us1 / 1e3,
        draft_ms: 0.0,
        ar_us: us1,
        ar_bytes: b1,
        ar_source: src1,
        tokens: 1.0,
    };
    let spec = Step {
        compute_ms: compute_ms * input.verify_compute_factor,
        allreduce_ms: ars * usw / 1e3,
        draft_ms: input.draft_ms,
        ar_us: usw,
        ar_bytes: bw,
        ar_source: srcw,
        tokens: input.acceptance,
    };
    if plain.total_ms() <= 0.0 || spec.total_ms() <= 0.0 {
        return Err(Error::invalid("compute_ms", "a step must take some time"));
    }
    Ok(Scenario {
        label: label.to_string(),
        break_even_acceptance: spec.total_ms() / plain.total_ms(),
        plain,
        spec,
    })
}

/// Step times and throughput with NCCL and with each of `others` (e.g. `("plan", ...)`).
/// A baseline tok/s is taken to be measured with NCCL; compute is what remains of its step.
pub fn evaluate(input: &ModelInput, nccl: &dyn ArLatency, others: &[(&str, &dyn ArLatency)]) -> Result<ModelOutput> {
    input.check()?;
    let ars = input.ars_per_step() as f64;
    let (compute_ms, backed_out) = match input.compute {
        Compute::StepMs(ms) => (ms, false),
        Compute::BaselineTokS(tok_s) => {
            let (us1, _) = nccl.latency(input.ar_bytes(1))?;
            let step_ms = 1e3 / tok_s;
            let c = step_ms - ars * us1 / 1e3;
            if c < 0.0 {
                return Err(Error::invalid(
                    "baseline_tok_s",
                    format!(
                        "{tok_s} tok/s is a {step_ms:.2} ms step, shorter than its {:.0} all-reduces at {us1:.1} us ({:.2} ms): the figures contradict each other",
                        ars,
                        ars * us1 / 1e3
                    ),
                ));
            }
            (c, true)
        }
    };
    let mut scenarios = vec![scenario(input, "nccl", compute_ms, nccl)?];
    for (label, lat) in others {
        scenarios.push(scenario(input, label, compute_ms, *lat)?);
    }
    Ok(ModelOutput {
        ars_per_step: input.ars_per_step(),
        compute_ms,
        compute_backed_out: backed_out,
        scenarios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::profile::Profile;
    use crate::report::Record;
    use crate::kinds::Algorithm;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn kimi_shapes() {
        let m = ModelInput::default();
        assert_eq!(m.ars_per_step(), 122);
        assert_eq!(m.ar_bytes(1), 14_336);
        assert_eq!(m.ar_bytes(3), 43_008);
        assert_eq!(m.ar_bytes(8), 114_688);
    }

    #[test]
    fn hand_computed_case_with_given_compute() {
        // 122 ARs; compute 5 ms; NCCL 50 us at 14 KiB -> plain step 5 + 6.1 = 11.1 ms.
        // Verify: factor 1, AR 100 us -> 12.2 ms, draft 2 ms -> 19.2 ms; 2.5 tokens.
        let m = ModelInput {
            compute: Compute::StepMs(5.0),
            draft_ms: 2.0,
            acceptance: 2.5,
            ..ModelInput::default()
        };
        let nccl = FromFn(|b: usize| Ok((if b == 14_336 { 50.0 } else { 100.0 }, "t".to_string())));
        let plan = Fixed(10.0);
        let out = evaluate(&m, &nccl, &[("plan", &plan)]).unwrap();
        let n = &out.scenarios[0];
        assert!(close(n.plain.total_ms(), 11.1, 1e-9));
        assert!(close(n.plain.tok_s(), 1e3 / 11.1, 1e-9));
        assert!(close(n.spec.total_ms(), 19.2, 1e-9));
        assert!(close(n.spec.tok_s(), 2.5e3 / 19.2, 1e-9));
        assert!(close(n.break_even_acceptance, 19.2 / 11.1, 1e-12));
        // Plan at 10 us everywhere: plain 5 + 1.22 = 6.22 ms; spec 5 + 1.22 + 2 = 8.22 ms.
        let p = &out.scenarios[1];
        assert!(close(p.plain.total_ms(), 6.22, 1e-9));
        assert!(close(p.spec.total_ms(), 8.22, 1e-9));
        assert!(close(p.break_even_acceptance, 8.22 / 6.22, 1e-12));
    }

    #[test]
    fn reference_case_as_docs_model_md_works_it() {
        // docs/model.md: compute 2.5 ms, NCCL 71 us at 14 KiB and 225 us at 42 KiB, draft 3 ms,
        // 1.8 tokens per verify. Plain: 2.5 + 122 x 0.071 = 11.162 ms -> 89.6 tok/s.
        // Spec: 2.5 + 122 x 0.225 + 3 = 32.95 ms -> 1.8 / 32.95 ms = 54.6 tok/s.
        let m = ModelInput {
            compute: Compute::StepMs(2.5),
            draft_ms: 3.0,
            acceptance: 1.8,
            ..ModelInput::default()
        };
        let t = LogLogTable::new(Algorithm::Nccl, vec![(14336.0, 71.0), (43008.0, 225.0)]).unwrap();
        let out = evaluate(&m, &t, &[]).unwrap();
        let n = &out.scenarios[0];
        assert!(close(n.plain.total_ms(), 11.162, 1e-9));
        assert!(close(n.plain.tok_s(), 89.59, 0.01));
        assert!(close(n.spec.total_ms(), 32.95, 1e-9));
        assert!(close(n.spec.tok_s(), 54.63, 0.01));
        assert!(close(n.break_even_acceptance, 32.95 / 11.162, 1e-9));
    }

    #[test]
    fn compute_is_backed_out_of_a_baseline() {
        // 100 tok/s = 10 ms step; 122 x 40 us = 4.88 ms of all-reduce; compute 5.12 ms.
        let m = ModelInput {
            compute: Compute::BaselineTokS(100.0),
            ..ModelInput::default()
        };
        let out = evaluate(&m, &Fixed(40.0), &[]).unwrap();
        assert!(out.compute_backed_out);
        assert!(close(out.compute_ms, 5.12, 1e-9));
        assert!(close(out.scenarios[0].plain.tok_s(), 100.0, 1e-9));
        // A baseline faster than its all-reduces allow is refused, not clamped.
        let m = ModelInput {
            compute: Compute::BaselineTokS(100.0),
            ..ModelInput::default()
        };
        assert!(evaluate(&m, &Fixed(90.0), &[]).is_err());
    }

    #[test]
    fn loglog_interpolation_is_exact_on_power_laws() {
        // t = 2 * b^0.5: a straight line in log-log, so interpolation and extrapolation are exact.
        let pts: Vec<(f64, f64)> = [1e3, 1e4, 1e6].iter().map(|&b: &f64| (b, 2.0 * b.sqrt())).collect();
        let t = LogLogTable::new(Algorithm::Nccl, pts).unwrap();
        for b in [500.0, 1e3, 3e3, 5e5, 4e6] {
            assert!(close(t.at(b), 2.0 * f64::sqrt(b), 1e-6 * b.sqrt()), "{b}");
        }
    }

    fn rec(a: Algorithm, bytes: usize, us: f64, wrong: i64) -> Record {
        Record::measured(a, "cuda", DType::BF16, 8, bytes / 2, (us, us, us), wrong)
    }

    #[test]
    fn profile_latency_follows_bucket_medians() {
        use crate::plan::{Backend, CaptureMode};
        use crate::plan::profile::ProfileFingerprint;
        let topo = crate::topology::presets::pcie_2();
        let fp = ProfileFingerprint::new(&topo, None, Backend::Cuda, 8, CaptureMode::Graph);
        let recs = vec![
            rec(Algorithm::OneshotPush, 16384, 8.0, 0),
            rec(Algorithm::TwoshotPush, 16384, 12.0, 0),
            rec(Algorithm::OneshotPush, 65536, 20.0, 0),
            rec(Algorithm::TwoshotPush, 65536, 14.0, 0),
        ];
        let p = Profile::from_measurements(&recs, fp);
        let l = ProfileLatency::new(&p, DType::BF16).unwrap();
        let (us, src) = l.latency(16384).unwrap();
        assert!(close(us, 8.0, 1e-9) && src.starts_with("oneshot-push"), "{us} {src}");
        let (us, src) = l.latency(65536).unwrap();
        assert!(close(us, 14.0, 1e-9) && src.starts_with("twoshot-push"), "{us} {src}");
        assert!(ProfileLatency::new(&p, DType::F32).is_err());
    }

    #[test]
    fn bench_latency_picks_the_fastest_correct_curve() {
        let recs = vec![
            rec(Algorithm::Nccl, 16384, 20.0, 0),
            rec(Algorithm::Nccl, 65536, 24.0, 0),
            rec(Algorithm::OneshotPush, 16384, 8.0, 0),
            rec(Algorithm::OneshotPush, 65536, 16.0, 0),
            rec(Algorithm::TwoshotPush, 16384, 12.0, 0),
            rec(Algorithm::TwoshotPush, 65536, 14.0, 0),
            rec(Algorithm::OneshotPull, 16384, 1.0, 3), // wrong results: never chosen
            // Another collective's record (an all-gather's bench): never an all-reduce's curve.
            Record { collective: crate::kinds::Collective::AllGather, ..rec(Algorithm::OneshotPush, 16384, 0.5, 0) },
        ];
        let plan = BenchLatency::from_records(&recs, 8, |a| a != Algorithm::Nccl).unwrap();
        let (us, src) = plan.latency(16384).unwrap();
        assert!(close(us, 8.0, 1e-9) && src.starts_with("oneshot-push"), "{us} {src}");
        let (us, src) = plan.latency(65536).unwrap();
        assert!(close(us, 14.0, 1e-9) && src.starts_with("twoshot-push"), "{us} {src}");
        // Geometric midpoint of 16 and 64 KiB is 32 KiB: sqrt(20*24) for NCCL.
        let nccl = BenchLatency::from_records(&recs, 8, |a| a == Algorithm::Nccl).unwrap();
        assert!(close(nccl.latency(32768).unwrap().0, (20.0f64 * 24.0).sqrt(), 1e-9));
        assert!(BenchLatency::from_records(&recs, 4, |_| true).is_err());
    }
}
