//! The settings table rendered from [`VARS`]: Markdown for the README (`tpar settings
//! --markdown`), plain text with the current values for a terminal (`tpar settings`). Reads
//! no environment itself: the values set come from [`set_vars`] (the settings module's).
//! Tested in settings/tests.rs (the README's table is the generated one, each variable once).

use super::{set_vars, VARS};

/// The settings table as Markdown (the README's, `tpar settings --markdown`).
pub fn markdown_table() -> String {
    let mut s = String::from("| variable | group | values | default | what it does |\n|---|---|---|---|---|\n");
    for v in VARS {
        s.push_str(&format!("| `{}` | {} | {} | {} | {} |\n", v.name, v.group.name(), v.values, v.default, v.doc));
    }
    s
}

/// The settings table as plain text for a terminal (`tpar settings`), current values shown.
pub fn text_table() -> String {
    let set = set_vars();
    let width = VARS.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut s = String::new();
    let mut group = None;
    for v in VARS {
        if group != Some(v.group) {
            s.push_str(&format!("{}{}:\n", if group.is_some() { "\n" } else { "" }, v.group.name()));
            group = Some(v.group);
        }
        let now = match set.iter().find(|(n, _)| *n == v.name) {
            Some((_, x)) if !x.trim().is_empty() => format!("  [set: {x}]"),
            _ => String::new(),
        };
        s.push_str(&format!("  {:width$}  {}; default {}. {}{now}\n", v.name, v.values, v.default, v.doc));
    }
    s
}
