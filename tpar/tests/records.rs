//! bench/results holds records, not a lab (bench/results/README.md, "What a record is"): one
//! folder per record, named `YYYY-MM-DD-<machine>-<topic>`, each with a README naming the
//! machine, the date, the commit and the command that reproduces it, and its raw outputs;
//! no archives, scripts, diffs or folders named by a session's call. And every path under
//! bench/results that the repository's text names exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

const RESULTS: &str = "bench/results";

fn walk(dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !skip.contains(&name.as_str()) && !name.starts_with('.') {
                walk(&p, skip, out);
            }
        } else {
            out.push(p);
        }
    }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/")
}

/// The record folders: every directory directly under bench/results.
fn records() -> Vec<(String, PathBuf)> {
    let mut v: Vec<_> = std::fs::read_dir(root().join(RESULTS)).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).map(|p| (p.file_name().unwrap().to_string_lossy().to_string(), p)).collect();
    v.sort();
    v
}

/// `YYYY-MM-DD-<machine>-<topic>`: the date's digits, then at least two lowercase words.
fn record_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    let date_ok = b.len() > 11 && b[..10].iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() }) && b[10] == b'-';
    date_ok && name[11..].split('-').count() >= 2 && name[11..].split('-').all(|w| !w.is_empty() && w.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
}

/// A folder named by a session's round or call (`round12`, `call3`) rather than by what it holds.
fn session_numbered(name: &str) -> bool {
    name.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| ["round", "call"].iter().any(|p| w.strip_prefix(p).is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))))
}

const FORBIDDEN: &[&str] = &[".tar", ".tgz", ".gz", ".zip", ".bz2", ".xz", ".7z", ".sh", ".py", ".diff", ".patch"];

#[test]
fn bench_results_holds_records_only() {
    let mut problems = Vec::new();
    let base = root().join(RESULTS);
    for e in std::fs::read_dir(&base).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_file() && name != "README.md" {
            problems.push(format!("{}: a loose file (a record is a folder with its README)", rel(&p)));
        }
    }
    let mut files = Vec::new();
    walk(&base, &[], &mut files);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_lowercase();
        if let Some(ext) = FORBIDDEN.iter().find(|x| name.ends_with(*x)) {
            problems.push(format!("{}: no {ext} in a record (archives, scripts and diffs are described in words)", rel(f)));
        }
    }
    for (name, dir) in records() {
        if !record_name_ok(&name) {
            problems.push(format!("{RESULTS}/{name}: not named YYYY-MM-DD-<machine>-<topic>"));
        }
        let mut dirs = vec![dir.clone()];
        let mut all = Vec::new();
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    all.push(p.clone());
                    dirs.push(p);
                }
            }
        }
        for d in std::iter::once(&dir).chain(all.iter()) {
            let n = d.file_name().unwrap().to_string_lossy().to_string();
            if session_numbered(&n) {
                problems.push(format!("{}: a folder named by a session's round or call; name it by what it holds", rel(d)));
            }
            if std::fs::read_dir(d).unwrap().next().is_none() {
                problems.push(format!("{}: an empty folder", rel(d)));
            }
        }
        let readme = dir.join("README.md");
        let Ok(text) = std::fs::read_to_string(&readme) else {
            problems.push(format!("{RESULTS}/{name}: no README.md"));
            continue;
        };
        let head: String = text.lines().take(12).collect::<Vec<_>>().join("\n");
        for key in ["Machine:", "Date:", "Commit:", "Reproduce"] {
            if !head.contains(key) {
                problems.push(format!("{RESULTS}/{name}/README.md: no `{key}` in its first 12 lines (the **Record.** paragraph)"));
            }
        }
        if name.len() >= 10 && !head.contains(&format!("Date: {}", &name[..10])) {
            problems.push(format!("{RESULTS}/{name}/README.md: its `Date:` is not the folder's {}", &name[..10]));
        }
        let command = head.split('`').skip(1).step_by(2).any(|code| code.contains("scripts/") || code.contains("bench/compare/") || code.starts_with("tpar "));
        if !command {
            problems.push(format!("{RESULTS}/{name}/README.md: its first 12 lines quote no command (`scripts/...`, `bench/compare/...` or `tpar ...`)"));
        }
        // The entries the reproduce sentence names exist (one that is gone is said in words).
        let reproduce = head.split_once("Reproduce").map(|(_, r)| r.split("Raw:").next().unwrap_or(r)).unwrap_or("");
        for dir in ["scripts/", "bench/compare/"] {
            for (i, _) in reproduce.match_indices(dir) {
                let tail = &reproduce[i..];
                let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c))).unwrap_or(tail.len());
                let entry = tail[..end].trim_end_matches('.');
                if !root().join(entry).is_file() {
                    problems.push(format!("{RESULTS}/{name}/README.md: reproduces with {entry}, which does not exist"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "bench/results:\n  {}", problems.join("\n  "));
}

#[test]
fn the_index_lists_every_record() {
    let index = std::fs::read_to_string(root().join(RESULTS).join("README.md")).unwrap();
    let listed: BTreeSet<String> = index.lines().filter(|l| l.starts_with("| 20")).filter_map(|l| l.split('`').nth(1)).map(|s| s.trim_end_matches('/').to_string()).collect();
    let present: BTreeSet<String> = records().into_iter().map(|(n, _)| n).collect();
    let missing: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(missing.is_empty() && stale.is_empty(), "bench/results/README.md's index: records not listed {missing:?}, listed but absent {stale:?}");
}

/// Every `bench/results/...` path named in the repository's text (docs, READMEs, scripts,
/// tests, source comments, the records' READMEs) exists. The records' raw outputs are not
/// read: they are what a run printed, paths of their day included.
#[test]
fn every_path_into_bench_results_exists() {
    let mut files = Vec::new();
    walk(&root(), &["target", "node_modules", "__pycache__"], &mut files);
    let this_file = root().join("tpar/tests/records.rs");
    let text_ext = ["md", "rs", "sh", "py", "toml", "cu", "cuh", "awk", "txt", "yml", "yaml"];
    let mut problems = Vec::new();
    let mut seen = 0usize;
    for f in files {
        let r = rel(&f);
        let raw_output = r.starts_with("bench/results/") && !r.ends_with("README.md");
        let ext = f.extension().map(|e| e.to_string_lossy().to_string()).unwrap_or_default();
        let scripts_file = r.starts_with("scripts/");
        if raw_output || f == this_file || !(text_ext.contains(&ext.as_str()) || scripts_file) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        let mut rest = text.as_str();
        while let Some(i) = rest.find("bench/results/") {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c))).unwrap_or(tail.len());
            let path = tail[..end].trim_end_matches(['.', ',']);
            seen += 1;
            if !root().join(path).exists() {
                let line = text[..text.len() - rest.len() + i].lines().count().max(1);
                problems.push(format!("{r}:{line}: {path} does not exist"));
            }
            rest = &tail[end.max(1)..];
        }
    }
    assert!(seen > 50, "found only {seen} paths into bench/results: the scan is broken");
    assert!(problems.is_empty(), "paths into bench/results that do not exist:\n  {}", problems.join("\n  "));
}

#[test]
fn the_name_rules_catch_what_they_say() {
    assert!(record_name_ok("2026-12-03-h200-fused-cycle-trace"));
    assert!(!record_name_ok("h200-1gpu-round17"));
    assert!(!record_name_ok("2026-12-03-h200"));
    assert!(session_numbered("call3") && session_numbered("engines-call1") && session_numbered("h200-1gpu-round12"));
    assert!(!session_numbered("calls") && !session_numbered("large-final") && !session_numbered("around"));
}
