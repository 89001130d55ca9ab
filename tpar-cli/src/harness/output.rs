//! Output files (`--json`, `--csv`, `--svg`, `tune -o`): checked before the run starts, so a
//! typo in a path fails at once instead of after minutes of measuring. `--json` and `--csv`
//! are rewritten as points are measured, marked incomplete until the run ends, so an
//! interrupted run keeps what it measured; every write replaces the file at once, and a
//! rank stopped between the two steps of a write leaves nothing behind: the launcher removes
//! its temporary ([`remove_partial_writes`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
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

/// The output files of this run: every path [`check_all`] accepted (the launcher checks the
/// same arguments as its ranks, so it knows them too).
static OUTPUTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Checks every given output path (see [`check_writable`]) and notes it as this run's.
pub fn check_all(paths: &[(&str, Option<&Path>)]) -> Result<(), String> {
    for (flag, p) in paths {
        if let Some(p) = p {
            check_writable(flag, p)?;
            if let Ok(mut o) = OUTPUTS.lock() {
                o.push(p.to_path_buf());
            }
        }
    }
    Ok(())
}

/// The temporary that process `pid` writes `p`'s next contents into ([`write_atomic`]).
fn temporary(p: &Path, pid: u32) -> PathBuf {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    p.with_file_name(format!(".{name}.tpar-{pid}"))
}

/// Removes what rank process `pid` was writing when it was stopped (a Ctrl-C reaches every
/// rank of the terminal's process group at once, possibly between a write's two steps): its
/// temporary of each of this run's outputs, where one is left. The outputs keep their last
/// complete contents.
pub fn remove_partial_writes(pid: u32) {
    if let Ok(o) = OUTPUTS.lock() {
        for p in o.iter() {
            let _ = std::fs::remove_file(temporary(p, pid));
        }
    }
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

/// Replaces `p`'s contents at once: a temporary file beside it, then a rename, so a run
/// stopped mid-write leaves the previous complete file, never half of one.
fn write_atomic(p: &Path, contents: &str) -> Result<(), String> {
    let tmp = temporary(p, std::process::id());
    std::fs::write(&tmp, contents).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, p).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing {}: {e}", p.display())
    })
}

/// The records as JSON; with `incomplete`, every record says so (`"incomplete": true`),
/// which readers of the plain records ignore.
fn json_of(records: &[BenchRecord], incomplete: bool) -> Result<String, String> {
    let mut v = serde_json::to_value(records).map_err(|e| e.to_string())?;
    if incomplete {
        for r in v.as_array_mut().into_iter().flatten() {
            if let Some(o) = r.as_object_mut() {
                o.insert("incomplete".into(), serde_json::Value::Bool(true));
            }
        }
    }
    serde_json::to_string_pretty(&v).map_err(|e| e.to_string())
}

/// The records as CSV; with `incomplete`, a last line says that the run stopped early.
fn csv_of(records: &[BenchRecord], incomplete: bool) -> String {
    let mut s = String::from("algorithm,backend,dtype,world,bytes,count,time_us,p10_us,p90_us,algbw,busbw,wrong,mode,collective\n");
    for g in records {
        let r = &g.record;
        s.push_str(&format!(
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{},{},{}\n",
            r.algorithm, r.backend, r.dtype, r.world, r.bytes, r.count, r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw, r.wrong, g.mode, r.collective
        ));
    }
    if incomplete {
        s.push_str(INCOMPLETE_CSV_LINE);
        s.push('\n');
    }
    s
}

/// The last line of the CSV of a run that has not finished (or never will: it was stopped).
pub const INCOMPLETE_CSV_LINE: &str = "# incomplete: the run stopped before every point was measured; these rows are the points measured until then";

pub fn write_json(p: &Path, records: &[BenchRecord]) -> Result<(), String> {
    write_atomic(p, &json_of(records, false)?)
}

pub fn write_csv(p: &Path, records: &[BenchRecord]) -> Result<(), String> {
    write_atomic(p, &csv_of(records, false))
}

/// While a run measures: rewrites `--json` and `--csv` with every record so far, marked
/// incomplete, so that a run stopped by Ctrl-C, SIGTERM or a failed rank leaves what it
/// measured. The run's end writes the complete files ([`write_json`], [`write_csv`]).
pub fn write_progress(json: Option<&Path>, csv: Option<&Path>, records: &[BenchRecord]) -> Result<(), String> {
    if let Some(p) = json {
        write_atomic(p, &json_of(records, true)?)?;
    }
    if let Some(p) = csv {
        write_atomic(p, &csv_of(records, true))?;
    }
    Ok(())
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

    #[test]
    fn progress_files_are_marked_incomplete_and_the_final_ones_are_not() {
        let dir = std::env::temp_dir().join(format!("tpar-cli-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (j, c) = (dir.join("r.json"), dir.join("r.csv"));
        let rec = BenchRecord {
            record: Record::measured(tpar::Algorithm::OneshotPush, "cpu", tpar::DType::F32, 2, 256, (3.0, 2.0, 4.0), 0),
            mode: CaptureMode::Eager,
            inner: 1,
        };
        write_progress(Some(&j), Some(&c), std::slice::from_ref(&rec)).unwrap();
        let v: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
        assert_eq!(v[0]["incomplete"], serde_json::Value::Bool(true));
        let back: Vec<Record> = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
        assert_eq!(back[0], rec.record, "readers of plain records still read them");
        assert!(std::fs::read_to_string(&c).unwrap().trim_end().ends_with(INCOMPLETE_CSV_LINE));
        write_json(&j, std::slice::from_ref(&rec)).unwrap();
        write_csv(&c, &[rec]).unwrap();
        assert!(!std::fs::read_to_string(&j).unwrap().contains("incomplete"));
        let csv = std::fs::read_to_string(&c).unwrap();
        assert!(!csv.contains("incomplete"));
        // The collective is the last column, so readers of the earlier columns are unchanged.
        assert!(csv.lines().next().unwrap().ends_with(",mode,collective") && csv.lines().nth(1).unwrap().ends_with(",eager,all-reduce"), "{csv}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary files left: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rank stopped between a write's two steps leaves its temporary; the launcher's
    /// removal takes exactly that rank's temporaries of this run's outputs and leaves the
    /// outputs (their last complete contents) and other processes' temporaries alone.
    #[test]
    fn a_stopped_ranks_half_written_temporary_is_removed() {
        let dir = std::env::temp_dir().join(format!("tpar-cli-partial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let j = dir.join("r.json");
        check_all(&[("--json", Some(j.as_path()))]).unwrap();
        std::fs::write(&j, "[]").unwrap();
        let (stopped, other) = (u32::MAX - 1, u32::MAX - 2);
        std::fs::write(temporary(&j, stopped), "[{\"half").unwrap();
        std::fs::write(temporary(&j, other), "[]").unwrap();
        remove_partial_writes(stopped);
        let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [format!(".r.json.tpar-{other}"), "r.json".to_string()]);
        assert_eq!(std::fs::read_to_string(&j).unwrap(), "[]");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
