//! Output files (`--json`, `--csv`, `--svg`, `tune -o`): checked before the run starts, so a
//! typo in a path fails at once instead of after minutes of measuring, and written once.

use std::path::Path;
use tpar::report::Record;
use tpar::CaptureMode;

/// Fails unless `path` can be written: its folder exists and the file can be opened for
/// writing. A file this check had to create is removed again.
pub fn check_writable(flag: &str, path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("{flag} {}: the folder {} does not exist", path.display(), dir.display()));
    }
    if path.is_dir() {
        return Err(format!("{flag} {}: is a folder, not a file", path.display()));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("{flag} {}: cannot write there: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Checks every given output path (see [`check_writable`]).
pub fn check_all(paths: &[(&str, Option<&Path>)]) -> Result<(), String> {
    for (flag, p) in paths {
        if let Some(p) = p {
            check_writable(flag, p)?;
        }
    }
    Ok(())
}

/// One measured point as `--json` writes it: the shared record plus how it was timed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRecord {
    #[serde(flatten)]
    pub record: Record,
    /// `eager` or `graph`.
    pub mode: CaptureMode,
    /// Calls per timed iteration.
    pub inner: usize,
}

pub fn write_json(p: &Path, records: &[BenchRecord]) -> Result<(), String> {
    let s = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
    std::fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()))
}

pub fn write_csv(p: &Path, records: &[BenchRecord]) -> Result<(), String> {
    let mut s = String::from("algorithm,backend,dtype,world,bytes,count,time_us,p10_us,p90_us,algbw,busbw,wrong,mode\n");
    for g in records {
        let r = &g.record;
        s.push_str(&format!(
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{},{}\n",
            r.algorithm, r.backend, r.dtype, r.world, r.bytes, r.count, r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw, r.wrong, g.mode
        ));
    }
    std::fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()))
}

/// One curve per algorithm: graph timings where measured (what a serving engine sees).
pub fn write_svg(p: &Path, records: &[BenchRecord]) -> Result<(), String> {
    let mode = if records.iter().any(|g| g.mode == CaptureMode::Graph) { CaptureMode::Graph } else { CaptureMode::Eager };
    let rs: Vec<Record> = records.iter().filter(|g| g.mode == mode).map(|g| g.record.clone()).collect();
    tpar::plot::latency_svg(&rs, p).map_err(|e| format!("writing {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_without_leaving_files() {
        let dir = std::env::temp_dir().join(format!("tpar-cli-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("x.json");
        assert!(check_writable("--json", &ok).is_ok());
        assert!(!ok.exists(), "the check leaves nothing behind");
        let e = check_writable("--json", &dir.join("no/such/x.json")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(check_writable("--svg", &dir).unwrap_err().contains("is a folder"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
