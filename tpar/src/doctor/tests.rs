use super::engine::{Engine, Finding, TparInstall};
use super::*;

fn preset(name: &str, tp: Option<usize>) -> Report {
    let mut r = Report::gather(&Options { topology: Some(name.into()), tp, ..Options::default() }).unwrap();
    r.finish(None);
    r
}

#[test]
fn bad_options_are_errors_and_nothing_else_is() {
    for o in [
        Options { tp: Some(0), ..Options::default() },
        Options { tp: Some(17), ..Options::default() },
        Options { hidden: 0, ..Options::default() },
        Options { topology: Some("h200-nvswitch-8".into()), probe: true, ..Options::default() },
        Options { topology: Some("no-such-box".into()), ..Options::default() },
    ] {
        assert!(Report::gather(&o).is_err(), "{o:?}");
    }
    // This machine, whatever it has (CI: no GPU, no driver): a report, never an error.
    let mut r = Report::gather(&Options::default()).unwrap();
    r.finish(None);
    assert!(r.text().contains("== Fabric =="));
    if r.machine.topology.gpu_count() == 0 {
        assert!(r.machine.no_gpu.is_some() && r.text().contains("NO GPU"), "{}", r.text());
        assert!(r.problems.iter().any(|p| p.starts_with("no GPU visible")), "{:?}", r.problems);
        assert!(r.size_classes.is_empty() && r.size_classes_note.is_some());
        assert!(r.estimate.case.contains("founding"), "{:?}", r.estimate);
    }
}

#[test]
fn every_size_class_has_a_pick_a_reason_and_its_sources_on_a_preset() {
    let r = preset("rtxpro6000-pcie-switch-8", Some(8));
    assert_eq!(r.size_classes.len(), SIZE_CLASS_TOKENS.len());
    assert_eq!(r.machine.archs, vec!["sm_120".to_string(); 8]);
    for c in &r.size_classes {
        assert_eq!(c.bytes, (c.tokens * 7168 * 2) as u64);
        for p in [&c.eager, &c.graph] {
            assert!(!p.reason.is_empty(), "{c:?}");
            // On this preset every default pick is timed and its figures named.
            assert!(p.source.is_some() && p.nccl_source.is_some() && p.predicted_us.is_some(), "{} tokens: {p:?}", c.tokens);
        }
    }
    // The decode and verify sizes get a tpar kernel that beats NCCL there (the plan's own
    // decision on this preset, docs/plan.md).
    let verify = &r.size_classes[2];
    assert_eq!(verify.tokens, 3);
    assert_ne!(verify.eager.algorithm, Algorithm::Nccl, "{verify:?}");
    assert!(verify.eager.gain().is_some_and(|g| g > 1.0), "{verify:?}");
    let text = r.text();
    assert!(text.contains("Size classes: TP 8, hidden 7168, bfloat16"), "{text}");
    assert!(text.contains("3 tokens eager: ") && text.contains("published"), "{text}");
}

#[test]
fn calls_above_the_drop_ins_size_go_to_the_engines_nccl() {
    let r = Report::gather(&Options { topology: Some("h200-nvswitch-8".into()), hidden: 16384, ..Options::default() }).unwrap();
    assert_eq!(r.tp, 8, "TP defaults to the topology's GPUs");
    let big = r.size_classes.iter().find(|c| c.tokens == 512).unwrap();
    assert!(big.bytes > ENGINE_MAX_BYTES);
    assert_eq!(big.eager.algorithm, Algorithm::Nccl);
    assert!(big.eager.reason.contains("max_size"), "{}", big.eager.reason);
    let small = r.size_classes.iter().find(|c| c.tokens == 1).unwrap();
    assert_ne!(small.graph.algorithm, Algorithm::Nccl, "{small:?}");
}

#[test]
fn one_rank_has_no_size_classes_and_says_why() {
    let r = preset("h200-nvswitch-8", Some(1));
    assert!(r.size_classes.is_empty());
    assert!(r.size_classes_note.as_deref().is_some_and(|n| n.contains("TP 1")));
    assert!(r.estimate.unavailable.is_some());
}

#[test]
fn the_json_holds_the_same_facts_as_the_text() {
    let r = preset("rtxpro6000-pcie-switch-8", Some(8));
    let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(v["tp"], 8);
    assert_eq!(v["size_classes"].as_array().unwrap().len(), SIZE_CLASS_TOKENS.len());
    assert_eq!(v["size_classes"][0]["eager"]["algorithm"], r.size_classes[0].eager.algorithm.name());
    assert!(v["estimate"]["rows"].as_array().is_some_and(|a| !a.is_empty()));
    assert!(v["paste"].as_array().is_some_and(|a| a.iter().any(|p| p["line"] == "export TPAR_ENABLE=1")));
    assert!(v["libraries"].as_array().is_some_and(|a| a.len() == 3));
}

fn finding(applies: &str, fix: &str, kind: &str) -> Finding {
    Finding {
        engine: "vLLM".into(),
        setting: "VLLM_ALLREDUCE_USE_FLASHINFER".into(),
        now: "unset (default 1)".into(),
        applies: applies.into(),
        why_applies: "sm_90".into(),
        effect: "FlashInfer's all-reduce is asked first".into(),
        source: "vllm/x.py".into(),
        severity: "pre-empts".into(),
        fix: Some(fix.into()),
        fix_kind: Some(kind.into()),
    }
}

#[test]
fn engine_findings_become_paste_lines_where_they_may_apply() {
    let mut r = preset("h200-nvswitch-8", Some(8));
    let engine = EngineSection {
        python: "/py".into(),
        tpar: TparInstall { installed: true, importable: true, ..TparInstall::default() },
        engines: vec![Engine { name: "vLLM".into(), version: Some("0.33.0".into()), pinned: vec!["0.33.0".into()], plugin_registered: true, plugin_allowed: true, ..Engine::default() }],
        findings: vec![
            finding("yes", "export VLLM_ALLREDUCE_USE_FLASHINFER=0", "env"),
            finding("no", "export SHOULD_NOT_APPEAR=1", "env"),
            finding("unknown", "--enforce-disable-flashinfer-allreduce-fusion", "flag"),
        ],
        ..EngineSection::default()
    };
    r.finish(Some(engine));
    let lines: Vec<&str> = r.paste.iter().map(|p| p.line.as_str()).collect();
    assert_eq!(lines[0], "export TPAR_ENABLE=1");
    assert!(lines.contains(&"export VLLM_ALLREDUCE_USE_FLASHINFER=0"), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("SHOULD_NOT_APPEAR")), "{lines:?}");
    assert!(r.paste.iter().any(|p| p.kind == "flag" && p.line.contains("--enforce-disable-flashinfer-allreduce-fusion")), "{:?}", r.paste);
    assert!(r.problems.iter().any(|p| p.contains("VLLM_ALLREDUCE_USE_FLASHINFER")), "{:?}", r.problems);
    let text = r.text();
    assert!(text.contains("with TPAR_ENABLE=1: vLLM 0.33.0 would build tpar's class"), "{text}");
    assert!(text.contains("# and on the server's command line:"), "{text}");
}

#[test]
fn preset_gpus_get_their_architecture_from_their_names() {
    assert_eq!(arch_from_name("NVIDIA H200"), Some("sm_90"));
    assert_eq!(arch_from_name("NVIDIA RTX PRO 6000 Blackwell Server Edition"), Some("sm_120"));
    assert_eq!(arch_from_name("NVIDIA B200"), Some("sm_100"));
    assert_eq!(arch_from_name("a GPU nobody names"), None);
    let r = preset("h200-nvswitch-8", None);
    assert_eq!(r.engine_context(), EngineContext { tp: 8, archs: vec!["sm_90".into()] });
}

#[test]
fn sequence_parallel_classes_show_each_collectives_plan() {
    let r = preset("rtxpro6000-pcie-switch-8", Some(8));
    assert_eq!(r.gather_scatter.len(), SIZE_CLASS_TOKENS.len());
    let one = &r.gather_scatter[0];
    assert_eq!(one.bytes, (r.hidden * 2) as u64);
    for p in [&one.all_gather, &one.reduce_scatter] {
        // A decode token's rows on PCIe: tpar's push, timed against NCCL's ring with sources.
        assert_eq!(p.algorithm, Algorithm::OneshotPush, "{}", p.reason);
        assert!(p.predicted_us.is_some() && p.nccl_us.is_some() && p.nccl_source.is_some(), "{p:?}");
    }
    // 512 tokens of 7168 bf16 per rank (7 MiB) stay in the drop-in; 16384 hidden would not.
    let big = preset_hidden("h200-nvswitch-8", 16384);
    let last = big.gather_scatter.last().unwrap();
    assert!(last.bytes > ENGINE_MAX_BYTES && last.all_gather.algorithm == Algorithm::Nccl && last.all_gather.reason.contains("max_size"), "{:?}", last.all_gather);
    let text = render::text(&r);
    assert!(text.contains("Sequence-parallel all-gather and reduce-scatter") && text.contains("reduce-scatter"), "{text}");
    // No GPU, no classes.
    assert!(Report::gather(&Options { topology: Some("cpu".into()), ..Options::default() }).unwrap().gather_scatter.is_empty());
}

fn preset_hidden(name: &str, hidden: usize) -> Report {
    Report::gather(&Options { topology: Some(name.into()), hidden, ..Options::default() }).unwrap()
}
