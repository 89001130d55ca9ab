//! Settings have one home: no source file but `tpar/src/settings.rs` reads the environment,
//! and every `TPAR_*` variable named in the sources is declared there (`settings::VARS`).
//! Scans the library, the CLI, the Python binding and the Python package (tests excluded:
//! they set variables for the processes they start).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "tests" || n == "__pycache__") {
                continue;
            }
            files(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
    let r = root();
    let mut v = Vec::new();
    for (dir, ext) in [("tpar/src", "rs"), ("tpar/examples", "rs"), ("tpar-cli/src", "rs"), ("tpar-py/src", "rs"), ("python/tpar", "py")] {
        files(&r.join(dir), ext, &mut v);
    }
    assert!(v.len() > 50, "the scan found only {} files: wrong root?", v.len());
    v.into_iter().map(|p| {
        let text = std::fs::read_to_string(&p).unwrap();
        (p, text)
    }).collect()
}

/// `TPAR_*` names in double quotes (a variable read, set or named in a message).
fn quoted_tpar_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("\"TPAR_") {
        let tail = &rest[i + 1..];
        let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        // The bare prefix "TPAR_" names no variable (vLLM's Ray prefix list takes it).
        if tail[end..].starts_with('"') && end > "TPAR_".len() {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn nothing_but_the_settings_module_reads_the_environment() {
    let mut offenders = Vec::new();
    for (p, text) in sources() {
        let rel = p.strip_prefix(root()).unwrap().display().to_string();
        if rel == "tpar/src/settings.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let rust_read = ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("].iter().any(|k| code.contains(k));
            let py_read = rel.ends_with(".py")
                && !code.trim_start().starts_with('#')
                && (code.contains("os.environ") || code.contains("os.getenv"))
                && code.contains("TPAR_");
            // The engines' plug-ins read their on/off switch themselves (they run before
            // tpar's native module may be loadable); it is declared in VARS all the same.
            let allowed = rel == "python/tpar/engines/common.py" && code.contains("\"TPAR_ENABLE\"");
            if (rust_read || py_read) && !allowed {
                offenders.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "environment read outside tpar/src/settings.rs:\n{}", offenders.join("\n"));
}

#[test]
fn every_tpar_variable_named_in_the_sources_is_declared() {
    let mut unknown = Vec::new();
    let mut named = std::collections::BTreeSet::new();
    for (p, text) in sources() {
        for name in quoted_tpar_names(&text) {
            named.insert(name.clone());
            if tpar::settings::var(&name).is_none() {
                unknown.push(format!("{}: {name}", p.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(unknown.is_empty(), "TPAR_* names not declared in tpar::settings::VARS:\n{}", unknown.join("\n"));
    // The scan is not vacuous: the job's variables are named where launchers set them.
    for v in ["TPAR_RANK", "TPAR_WORLD_SIZE", "TPAR_RDZV", "TPAR_ENABLE"] {
        assert!(named.contains(v), "{v} is named nowhere in the sources: the scan is broken");
    }
}
