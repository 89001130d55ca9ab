//! The tune cache across real processes, through `tpar tune --cache` on CPU ranks (what a
//! communicator's start runs, minus the GPU): two jobs starting at once tune once, a tuner
//! killed mid-tune leaves a usable cache (re-tuned by the next start, then read), leftovers
//! of a writer killed mid-write and a torn entry are never trusted, and TPAR_TUNE=off keeps
//! the defaults and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tpar::tune::cache::{Cache, Lookup};
use tpar::tune::cpu::cpu_key;

fn tpar(cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpar"));
    c.env("TPAR_CACHE_DIR", cache).env_remove("TPAR_TUNE");
    c
}

fn cache_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let d = std::env::temp_dir().join(format!("tpar-cli-tunecache-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One start of 2 CPU ranks for messages up to `max`.
fn start(cache: &Path, max: &str) -> Command {
    let mut c = tpar(cache);
    c.args(["tune", "--backend", "cpu", "--world", "2", "--cache", "-e", max]);
    c
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn files(cache: &Path) -> Vec<String> {
    std::fs::read_dir(cache.join("profiles")).map_or_else(|_| Vec::new(), |rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
}

#[test]
fn two_jobs_starting_at_once_tune_once() {
    let cache = cache_dir("race");
    let jobs: Vec<_> = (0..2).map(|_| start(&cache, "64K").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()).collect();
    let outs: Vec<Output> = jobs.into_iter().map(|j| j.wait_with_output().unwrap()).collect();
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    let tuned = outs.iter().filter(|o| text(o).contains("tuned this machine in")).count();
    let read = outs.iter().filter(|o| text(o).contains("read from the cache in")).count();
    assert_eq!((tuned, read), (1, 1), "{}\n---\n{}", text(&outs[0]), text(&outs[1]));
    let f = files(&cache);
    assert_eq!(f.iter().filter(|n| n.ends_with(".toml")).count(), 1, "{f:?}");
    assert!(!f.iter().any(|n| n.ends_with(".tmp")), "{f:?}");
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_killed_tuner_leaves_a_usable_cache_and_the_next_start_re_tunes() {
    let cache = cache_dir("kill");
    let c = Cache::under(&cache);
    let key = cpu_key(2);
    // A long tune (up to 4 MiB, bf16 and f16), killed once rank 0 holds the key's lock.
    let job = start(&cache, "4M").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    let holder = loop {
        if let Some(pid) = c.lock_holder(&key) {
            break pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "rank 0 never took the lock");
        std::thread::sleep(Duration::from_millis(5));
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(matches!(c.read(&key, 1), Lookup::Miss(_)), "killed before it stored anything");
    // The job's rank 0, a process this test started (through the launcher).
    let killed = Command::new("kill").args(["-9", &holder.to_string()]).status().unwrap();
    assert!(killed.success());
    let out = job.wait_with_output().unwrap();
    assert!(!out.status.success(), "the killed job fails: {}", text(&out));
    // Its lock died with it; nothing half-written is trusted.
    assert!(c.try_lock(&key).unwrap().is_some(), "the killed tuner's lock is free");
    assert!(!files(&cache).iter().any(|n| n.ends_with(".toml")), "{:?}", files(&cache));
    let next = start(&cache, "64K").output().unwrap();
    assert!(next.status.success() && text(&next).contains("tuned this machine in"), "{}", text(&next));
    let then = start(&cache, "64K").output().unwrap();
    assert!(then.status.success() && text(&then).contains("read from the cache in"), "{}", text(&then));
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_writer_killed_mid_write_or_a_torn_entry_is_never_trusted() {
    let cache = cache_dir("torn");
    let c = Cache::under(&cache);
    let key = cpu_key(2);
    assert!(start(&cache, "16K").output().unwrap().status.success());
    let path = c.entry_path(&key);
    let whole = std::fs::read(&path).unwrap();
    // What a writer killed between write and rename leaves: a temporary file (the entry is
    // untouched); and a torn entry, as a bad copy or disk would leave.
    let tmp = path.with_file_name(format!(".{}.toml.424242.1.tmp", key.stem()));
    std::fs::write(&tmp, &whole[..whole.len() / 3]).unwrap();
    c.write_raw_for_test(&key, &whole[..whole.len() - 7]).unwrap();
    let out = start(&cache, "16K").output().unwrap();
    let t = text(&out);
    assert!(out.status.success() && t.contains("tuned this machine in") && t.contains("refused"), "{t}");
    assert!(!tmp.exists(), "the next lock holder removed the leftover");
    assert!(matches!(c.read(&key, 1), Lookup::Hit { .. }));
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn tune_off_keeps_the_defaults_and_says_so() {
    let cache = cache_dir("off");
    let out = start(&cache, "16K").env("TPAR_TUNE", "off").output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("no tune (TPAR_TUNE=off): the plan's defaults are in force"), "{t}");
    assert!(files(&cache).is_empty(), "nothing measured, nothing stored: {:?}", files(&cache));
    let forced = start(&cache, "16K").env("TPAR_TUNE", "force").output().unwrap();
    assert!(forced.status.success() && text(&forced).contains("(TPAR_TUNE=force;"), "{}", text(&forced));
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_start_measures_the_all_gather_and_the_reduce_scatter_and_stores_their_tables() {
    let cache = cache_dir("agrs");
    // 16 KiB holds one sequence-parallel tensor (1 token x 7168 x bf16): 7 KiB a rank at 2.
    let out = start(&cache, "16K").output().unwrap();
    let t = text(&out);
    assert!(out.status.success() && t.contains("tuned this machine in"), "{t}");
    assert!(t.contains("all-gather, reduce-scatter: 1 tensors (14 KiB to 14 KiB) x bfloat16"), "the budget names them: {t}");
    // One bucket, of whichever of tpar's two kernels for them (one-shot push and pull, both
    // run by CPU ranks) the start measured faster here.
    for c in ["all-gather", "reduce-scatter"] {
        assert!(["oneshot-push", "oneshot-pull"].iter().any(|k| t.lines().any(|l| l == format!("eager {c} bfloat16: {k} <= 7 KiB"))), "{c}: {t}");
    }
    // The stored entry holds them; the next start reads it back, tables and all.
    let stored = Cache::under(&cache);
    let Lookup::Hit { tuned, .. } = stored.read(&cpu_key(2), 1) else { panic!("no entry: {t}") };
    let p = tuned.profile(tpar::plan::CaptureMode::Eager).unwrap();
    assert!(p.table(tpar::kinds::Collective::ReduceScatter, tpar::DType::BF16).is_some(), "{:?}", p.tables);
    // The same all-gather bucket as measured, whichever kernel it named.
    let measured = t.lines().find(|l| l.starts_with("eager all-gather bfloat16: ")).unwrap_or_default().to_string();
    let again = start(&cache, "16K").output().unwrap();
    assert!(text(&again).contains("read from the cache in") && text(&again).lines().any(|l| l == measured), "{measured:?} read back: {}", text(&again));
    let _ = std::fs::remove_dir_all(cache);
}
