//! User-facing text says ranges the way people write them ("2 to 16"), not as Rust ranges
//! (`2..=16`, `0..{n}`). Every string literal of the library, the CLI and the Python binding
//! is scanned (test modules excluded). `PENDING` may list (file, fragment) exceptions while
//! other work rewrites a file; it is empty now, and a listed one that is gone fails too.

use std::path::{Path, PathBuf};

/// (file, literal fragment) of messages still showing a Rust range: none left.
const PENDING: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literals of `src` (outside `#[cfg(test)]` modules and comments), roughly: what
/// lies between unescaped double quotes on a line.
fn literals(src: &str) -> Vec<String> {
    let body = src.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    for line in body.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut inside = false;
        let mut cur = String::new();
        let mut prev = ' ';
        for c in line.chars() {
            if !inside && c == '/' && prev == '/' {
                break; // a trailing comment
            }
            if c == '"' && prev != '\\' {
                if inside {
                    out.push(std::mem::take(&mut cur));
                }
                inside = !inside;
            } else if inside {
                cur.push(c);
            }
            prev = c;
        }
    }
    out
}

fn is_rust_range(s: &str) -> bool {
    let b = s.as_bytes();
    (1..b.len().saturating_sub(2)).any(|i| {
        b[i] == b'.' && b[i + 1] == b'.' && (b[i - 1].is_ascii_digit() || b[i - 1] == b'}') && {
            let after = if b.get(i + 2) == Some(&b'=') { b.get(i + 3) } else { b.get(i + 2) };
            after.is_some_and(|c| c.is_ascii_digit() || *c == b'{')
        }
    })
}

#[test]
fn messages_say_ranges_in_words() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let mut files = Vec::new();
    for d in ["tpar/src", "tpar-cli/src", "tpar-py/src"] {
        rust_files(&root.join(d), &mut files);
    }
    let mut found: Vec<(String, String)> = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        for lit in literals(&std::fs::read_to_string(f).unwrap()) {
            if is_rust_range(&lit) {
                found.push((rel.clone(), lit));
            }
        }
    }
    let pending = |(file, lit): &(String, String)| PENDING.iter().any(|(f, frag)| f == file && lit.contains(frag));
    let new: Vec<_> = found.iter().filter(|x| !pending(x)).collect();
    assert!(new.is_empty(), "messages showing a Rust range (write \"2 to 16\"): {new:#?}");
    let gone: Vec<_> = PENDING.iter().filter(|(f, frag)| !found.iter().any(|(file, lit)| file == f && lit.contains(frag))).collect();
    assert!(gone.is_empty(), "fixed since: remove from PENDING: {gone:?}");
}

#[test]
fn the_scan_sees_ranges_and_nothing_else() {
    for yes in ["need 2..=16 ranks", "0..{ns} ns", "{a}..={b}", "1..32"] {
        assert!(is_rust_range(yes), "{yes}");
    }
    for no in ["2 to 16", "../docs", "1.5K", "{:.2}", "x..y", "wait..."] {
        assert!(!is_rust_range(no), "{no}");
    }
    assert_eq!(literals("let x = \"a \\\"b\\\" 1..2\"; // \"3..4\"\n"), vec!["a \\\"b\\\" 1..2".to_string()]);
}

/// Every command that takes a topology names every preset in its help (the help text is
/// written by hand; `presets::NAMES` is the list), so a new preset cannot be left out.
#[test]
fn help_lists_every_preset() {
    for cmd in ["topo", "plan", "sim"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpar")).args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{help}");
        for name in tpar::topology::presets::NAMES {
            assert!(help.contains(name), "`tpar {cmd} --help` does not name the preset {name}:\n{help}");
        }
    }
}
