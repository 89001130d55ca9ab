//! docs/architecture.md's pinned facts: the crate list is the workspace's members, and every
//! `crate::<module>` path in the library goes to a module on its own line of the layer list
//! or below, except the exceptions the page names (with their reasons), and names a module
//! (never an item the crate root re-exports: such a path hides which module it depends on).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

fn between<'a>(text: &'a str, begin: &str, end: &str) -> &'a str {
    let a = text.find(begin).unwrap_or_else(|| panic!("docs/architecture.md lacks {begin}"));
    let rest = &text[a..];
    let b = rest.find(end).unwrap_or_else(|| panic!("docs/architecture.md lacks {end}"));
    &rest[..b]
}

#[test]
fn the_crate_list_is_the_workspace() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members_line = cargo.lines().find(|l| l.trim_start().starts_with("members")).unwrap();
    let members: BTreeSet<String> = members_line.split('"').skip(1).step_by(2).map(str::to_string).collect();
    let listed: BTreeSet<String> = between(&doc(), "<!-- crates:begin", "<!-- crates:end")
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    assert_eq!(members, listed, "docs/architecture.md's crate table against Cargo.toml's members");
}

/// Module -> its line in the layer list (0 = top).
fn layers() -> BTreeMap<String, usize> {
    let d = doc();
    let block = between(&d, "<!-- layers:begin", "<!-- layers:end");
    let mut m = BTreeMap::new();
    for (i, line) in block.lines().filter(|l| !l.starts_with("<!--") && !l.starts_with("```") && !l.trim().is_empty()).enumerate() {
        for name in line.split_whitespace() {
            assert!(m.insert(name.to_string(), i).is_none(), "{name} is listed twice");
        }
    }
    m
}

fn exceptions() -> BTreeSet<(String, String)> {
    let d = doc();
    let block = between(&d, "<!-- layer-exceptions:begin", "<!-- layer-exceptions:end");
    let mut out = BTreeSet::new();
    for l in block.lines().filter(|l| l.starts_with("- `")) {
        let (from, to) = l.split_once("->").unwrap();
        let from = from.trim_start_matches("- ").trim().trim_matches('`').to_string();
        let to = to.split(':').next().unwrap();
        for t in to.split(',') {
            out.insert((from.clone(), t.trim().trim_matches('`').to_string()));
        }
    }
    out
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::` path in `text` as (line, first segment, whether it is `$crate::`), with
/// `//` comments left out. A group names each of its top-level members' first segment, as
/// `use crate::{a::X, b::{Y, Z}}` names `a` and `b`, however rustfmt spreads it over lines.
fn crate_paths(text: &str) -> Vec<(usize, String, bool)> {
    // The code without comments, one line per line (so offsets map back to line numbers).
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let ident_end = |s: &str| s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        let macro_path = code[..at].ends_with('$');
        let tail = &code[at + 7..];
        let tail_at = at + 7;
        if let Some(group) = tail.strip_prefix('{') {
            // The group up to its matching brace; members split at commas of depth 0.
            let mut depth = 0usize;
            let mut member_start = 0;
            let mut end = group.len();
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = k;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_member(&mut out, &group[member_start..k], tail_at + 1 + member_start, &line_of, macro_path);
                        member_start = k + 1;
                    }
                    _ => {}
                }
            }
            if member_start < end {
                push_member(&mut out, &group[member_start..end], tail_at + 1 + member_start, &line_of, macro_path);
            }
            from = tail_at + 1 + end;
        } else {
            let end = ident_end(tail);
            out.push((line_of(at), tail[..end].to_string(), macro_path));
            from = tail_at + end;
        }
    }
    out
}

/// One member of a `crate::{..}` group at byte `at`: its first segment, if it names one.
fn push_member(out: &mut Vec<(usize, String, bool)>, member: &str, at: usize, line_of: &dyn Fn(usize) -> usize, macro_path: bool) {
    let lead = member.len() - member.trim_start().len();
    let m = member.trim_start();
    let end = m.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(m.len());
    if end > 0 {
        out.push((line_of(at + lead), m[..end].to_string(), macro_path));
    }
}

#[test]
fn the_import_scan_reads_groups_over_several_lines_and_nested() {
    let names = |t: &str| crate_paths(t).into_iter().map(|(n, m, _)| (n, m)).collect::<Vec<_>>();
    let one_line = "use crate::{cuda::X, plan::Y};";
    assert_eq!(names(one_line), [(1, "cuda".to_string()), (1, "plan".to_string())]);
    let rustfmt = "use std::io;\nuse crate::{\n    cuda::{ipc::A, launch::B},\n    // comm::Commented,\n    plan::{\n        self,\n        Y,\n    },\n    Error,\n};\nfn f() -> crate::units::U { crate::x::y() }\n";
    assert_eq!(
        names(rustfmt),
        [(3, "cuda".to_string()), (5, "plan".to_string()), (9, "Error".to_string()), (11, "units".to_string()), (11, "x".to_string())]
    );
    assert!(crate_paths("$crate::{a::B}")[0].2, "a macro's path is marked");
}

#[test]
fn every_module_imports_only_its_layer_or_below() {
    let layers = layers();
    let allowed = exceptions();
    let src = root().join("tpar/src");
    // Every module the crate root declares is placed in the list.
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for l in lib.lines() {
        if let Some(name) = l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")) {
            let name = name.trim_end_matches(';');
            assert!(layers.contains_key(name), "module {name} is in lib.rs but not in docs/architecture.md's layer list");
        }
    }
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut up = Vec::new();
    let mut root = Vec::new();
    let mut seen_exceptions = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let Some(&mine) = layers.get(&module) else { panic!("{} belongs to no listed module", rel.display()) };
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, target, macro_path) in crate_paths(&text) {
            // The crate root's `pub use`s are the face for users: the library names an
            // item by the module that defines it (a root path hides the edge it makes).
            // `$crate::` in an exported macro must take the public face: it is exempt.
            if !macro_path && !layers.contains_key(&target) {
                root.push(format!("{}:{n}: crate::{target}", rel.display()));
            }
            let Some(&theirs) = layers.get(&target) else { continue };
            if target != module && theirs < mine {
                if allowed.contains(&(module.clone(), target.clone())) {
                    seen_exceptions.insert((module.clone(), target));
                } else {
                    up.push(format!("{}:{n}: {module} (line {mine}) -> {target} (line {theirs})", rel.display()));
                }
            }
        }
    }
    assert!(root.is_empty(), "library code names items by their defining module, not the crate root's re-exports:\n{}", root.join("\n"));
    assert!(up.is_empty(), "imports up the layer list (move the code, or name the exception and its reason in docs/architecture.md):\n{}", up.join("\n"));
    // A named exception that the code no longer needs must go from the page too.
    let stale: Vec<_> = allowed.difference(&seen_exceptions).collect();
    assert!(stale.is_empty(), "docs/architecture.md names exceptions the code no longer has: {stale:?}");
}

/// Every module the crate root declares has a row in lib.rs's tour (its doc comment) and in
/// docs/architecture.md's module table (a row naming `name/`, `name.rs` or `` `name` ``), so
/// neither map leaves a module out.
#[test]
fn every_module_has_a_row_in_the_tour_and_the_module_table() {
    let lib = std::fs::read_to_string(root().join("tpar/src/lib.rs")).unwrap();
    let tour: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("//! | ")).collect();
    let d = doc();
    let table: Vec<&str> = d.lines().filter(|l| l.starts_with("| `")).collect();
    let mut missing = Vec::new();
    for l in lib.lines() {
        let Some(name) = l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")) else { continue };
        let name = name.trim_end_matches(';');
        let in_row = |row: &&str| {
            let first = row.split(" | ").next().unwrap_or("");
            [format!("`{name}`"), format!("`{name}/`"), format!("`{name}.rs`"), format!("[`{name}`]")].iter().any(|n| first.contains(n.as_str()))
        };
        if !tour.iter().any(in_row) {
            missing.push(format!("{name}: no row in lib.rs's tour"));
        }
        if !table.iter().any(in_row) {
            missing.push(format!("{name}: no row in docs/architecture.md's module table"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
