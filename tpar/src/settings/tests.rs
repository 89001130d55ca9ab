//! Tests of `settings` (a file of their own: settings.rs stays under the 600-line limit).

use super::*;

#[test]
fn every_declared_variable_parses_its_example() {
    for v in VARS {
        let s = Settings::from_pairs([(v.name, v.example)]);
        assert!(s.is_ok(), "{}={:?}: {:?}", v.name, v.example, s.err());
    }
    let names: std::collections::HashSet<_> = VARS.iter().map(|v| v.name).collect();
    assert_eq!(names.len(), VARS.len(), "a variable is declared twice");
}

#[test]
fn one_error_style_for_every_malformed_value() {
    for (var, raw) in [
        ("TPAR_TIMEOUT_MS", "0"),
        ("TPAR_TIMEOUT_MS", "-5"),
        ("TPAR_TIMEOUT_MS", "abc"),
        ("TPAR_SHM_BYTES", "lots"),
        ("TPAR_BLOCKS", "65"),
        ("TPAR_BLOCKS", "0"),
        ("TPAR_PDL", "yes"),
        ("TPAR_LEAN", "maybe"),
        ("TPAR_ZERO_COPY", "yes"),
        ("TPAR_FUSED", "always"),
        ("TPAR_TEST_UNSAFE_NO_END_BARRIER", "0"),
        ("TPAR_TEST_STAMPS", "yes"),
        ("TPAR_ALGO", "ring"),
        ("TPAR_TRANSPORT", "nvlink"),
        ("TPAR_DISABLE", "2"),
        ("TPAR_DEBUG", "LOUD"),
        ("TPAR_TUNE", "sometimes"),
        ("TPAR_HOST_PROTOCOL", "lamport"),
        ("TPAR_RDZV", "tcp:host:1"),
        ("TPAR_JOB_ID", "xyz"),
        ("TPAR_ENABLE", "2"),
    ] {
        match Settings::from_pairs([(var, raw)]) {
            Err(Error::Config { var: v, value, reason }) => {
                assert_eq!(v, var);
                assert_eq!(value, raw);
                assert!(reason.starts_with("expected") || reason.contains("expected"), "{var}: {reason}");
                assert!(!reason.contains("..="), "{var}: Rust range in a user message: {reason}");
            }
            other => panic!("{var}={raw:?}: {other:?}"),
        }
    }
}

#[test]
fn values_parse_as_documented() {
    let s = Settings::from_pairs([
        ("TPAR_SHM_BYTES", "48M"),
        ("TPAR_MAX_BYTES", "1.5M"),
        ("TPAR_TIMEOUT_MS", " 250 "),
        ("TPAR_BLOCKS", "12"),
        ("TPAR_PDL", "0"),
        ("TPAR_LEAN", "auto"),
        ("TPAR_ZERO_COPY", "0"),
        ("TPAR_FUSED", "1"),
        ("TPAR_TEST_UNSAFE_NO_END_BARRIER", "1"),
        ("TPAR_TEST_STAMPS", "1"),
        ("TPAR_ALGO", "auto"),
        ("TPAR_TRANSPORT", "host"),
        ("TPAR_RDZV", "unix:/tmp/x.sock"),
        ("TPAR_JOB_ID", "0xff"),
        ("TPAR_TUNE", "force"),
        ("TPAR_TEST_UNSAFE_ONE_BUFFER", "1"),
        ("TPAR_TEST_UNSAFE_TWO_BUFFERS", "1"),
        ("NOT_TPAR", "whatever"),
        ("TPAR_DISABLE", ""),
    ])
    .unwrap();
    assert_eq!(s.job.shm_bytes, Some(48 << 20));
    assert_eq!(s.overrides.max_bytes, Some(3 << 19));
    assert_eq!(s.job.timeout, Some(Duration::from_millis(250)));
    assert_eq!(s.overrides.blocks, Some(12));
    assert!(!s.launch.pdl);
    assert_eq!(s.launch.lean, None);
    assert_eq!(s.launch.zero_copy, Some(false));
    assert_eq!(s.overrides.fused, Some(true));
    assert!(s.launch.test_no_end_barrier);
    assert!(s.launch.test_stamps);
    assert_eq!(s.overrides.algorithm, None);
    assert_eq!(s.overrides.transport, Some(Transport::Host));
    assert_eq!(s.job.rdzv.as_deref(), Some("/tmp/x.sock"));
    assert_eq!(s.job.job_id, Some(255));
    assert_eq!(s.tune, Tune::Force);
    assert_eq!(s.launch.test_buffers, Some(1), "the stricter guard removal wins");
    assert!(!s.overrides.disable, "empty means unset");
}

#[test]
fn the_readme_table_is_the_generated_one() {
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let begin = readme.find("<!-- settings:begin").expect("README has the settings markers");
    let body = &readme[begin..];
    let start = body.find('\n').unwrap() + 1;
    let end = body.find("<!-- settings:end -->").expect("README closes the settings table");
    assert_eq!(&body[start..end], markdown_table(), "README's settings table is stale: paste `tpar settings --markdown`");
}

#[test]
fn the_table_lists_every_variable_once() {
    let t = markdown_table();
    for v in VARS {
        assert_eq!(t.matches(&format!("`{}`", v.name)).count(), 1, "{}", v.name);
    }
}

#[test]
fn the_wire_is_exact_unless_opted_in_and_refused_under_exact() {
    use crate::kinds::Wire;
    // Unset: exact, and not in the plan digest (existing digests are unchanged).
    let s = Settings::from_pairs([("TPAR_EXACT", "1")]).unwrap();
    assert_eq!(s.overrides.wire, None);
    assert!(s.overrides.exact);
    assert!(!serde_json::to_string(&Overrides::default()).unwrap().contains("wire"));
    for (raw, w) in [("fp8", Wire::Fp8), ("INT8", Wire::Int8), (" exact ", Wire::Exact)] {
        let s = Settings::from_pairs([("TPAR_WIRE", raw)]).unwrap();
        assert_eq!(s.overrides.wire, Some(w));
        // Set: in the digest, so ranks that differ are refused at init.
        assert!(serde_json::to_string(&s.overrides).unwrap().contains(&format!("\"wire\":\"{}\"", w.name())));
    }
    // Exact results asked for: a lossy wire is an error naming both settings and why.
    for w in ["fp8", "int8"] {
        match Settings::from_pairs([("TPAR_WIRE", w), ("TPAR_EXACT", "1")]) {
            Err(Error::Unsupported { what, reason }) => {
                assert!(what.contains(&format!("TPAR_WIRE={w}")) && what.contains("TPAR_EXACT=1"), "{what}");
                assert!(reason.contains("lossy"), "{reason}");
            }
            other => panic!("TPAR_WIRE={w} with TPAR_EXACT=1: {other:?}"),
        }
    }
    assert!(Settings::from_pairs([("TPAR_WIRE", "exact"), ("TPAR_EXACT", "1")]).is_ok());
    assert!(Settings::from_pairs([("TPAR_WIRE", "fp8"), ("TPAR_EXACT", "0")]).is_ok());
    // Overrides built in code meet the same refusal at init (`validate`).
    let t = crate::topology::Topology::cpu();
    let o = Overrides { wire: Some(Wire::Int8), exact: true, ..Overrides::default() };
    assert!(matches!(o.validate(&t, 2, crate::kinds::Backend::Cpu), Err(Error::Unsupported { .. })));
    let o = Overrides { wire: Some(Wire::Int8), ..Overrides::default() };
    assert!(o.validate(&t, 2, crate::kinds::Backend::Cpu).is_ok());
}
