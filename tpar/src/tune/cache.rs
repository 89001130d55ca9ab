//! The tune cache: one entry per machine and software ([`TuneKey::stem`]) under
//! `<cache>/profiles/` beside the compiled kernels (`crate::settings::cache_dir`), read in
//! milliseconds by later starts.
//!
//! Concurrent starts on one machine (two jobs, or any number of processes) must neither
//! corrupt an entry nor tune the same machine twice at once:
//! - whoever tunes holds an exclusive `flock` on `<stem>.lock` for the whole tune (rank 0 of
//!   the tuning job); a killed tuner's lock dies with its process, so nothing is ever stale;
//! - an entry is written to a temporary file unique to the process and moment, `fsync`ed,
//!   renamed into place and the directory `fsync`ed: a reader sees the old entry or the new
//!   one, whole;
//! - a reader checks the header's checksum and length, parses, and compares the key
//!   ([`Tuned::from_entry`], [`Tuned::serves`]): a torn, corrupt, foreign or outdated entry
//!   is a miss with its reason, never trusted. Temporary files a killed writer left behind
//!   are removed by the next lock holder.
//!
//! Owns: file names, the lock, reading and atomic writing. Must never: block (every lock
//! attempt is non-blocking; waiting is the caller's bounded loop), or write an entry without
//! holding the lock.

use crate::error::{Error, Result};
use crate::plan::tuned::{TuneKey, Tuned};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The tune cache under a cache directory.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
}

/// What a read found.
#[derive(Debug)]
pub enum Lookup {
    /// A whole entry that serves the key: the entry's text (what rank 0 broadcasts) and it
    /// parsed.
    Hit { text: String, tuned: Box<Tuned> },
    /// No usable entry, and why (none yet, refused, outdated).
    Miss(String),
}

/// An exclusive hold on one key's tune (an `flock` on its lock file). Released when dropped
/// (the file is closed) or when the process dies.
#[derive(Debug)]
pub struct TuneLock {
    _file: File,
    path: PathBuf,
}

impl TuneLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Cache {
    /// The tune cache under `root` (a cache directory, e.g. `settings::cache_dir()`).
    pub fn under(root: &Path) -> Cache {
        Cache { dir: root.join("profiles") }
    }

    /// The directory holding the entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `key`'s entry lives.
    pub fn entry_path(&self, key: &TuneKey) -> PathBuf {
        self.dir.join(format!("{}.toml", key.stem()))
    }

    fn lock_path(&self, key: &TuneKey) -> PathBuf {
        self.dir.join(format!("{}.lock", key.stem()))
    }

    /// Reads `key`'s entry: a hit only when it is whole, parses, and serves `key` for
    /// messages up to `max_bytes`.
    pub fn read(&self, key: &TuneKey, max_bytes: u64) -> Lookup {
        let path = self.entry_path(key);
        let mut text = String::new();
        match File::open(&path).and_then(|mut f| f.read_to_string(&mut text)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss(format!("no tuned profile for this machine in {}", self.dir.display())),
            Err(e) => return Lookup::Miss(format!("{} cannot be read ({e})", path.display())),
        }
        match Tuned::from_entry(&text) {
            Err(e) => Lookup::Miss(format!("{} was refused: {e}", path.display())),
            Ok(t) => match t.serves(key, max_bytes) {
                Err(why) => Lookup::Miss(format!("{} does not serve this start: {why}", path.display())),
                Ok(()) => Lookup::Hit { text, tuned: Box::new(t) },
            },
        }
    }

    /// Takes `key`'s lock if no one holds it: `Ok(None)` when another process (or another
    /// open of the file in this one) holds it. Writes this process's id into the file for
    /// others' messages, and removes temporary files a killed writer left behind.
    pub fn try_lock(&self, key: &TuneKey) -> Result<Option<TuneLock>> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(0, format!("creating the tune cache {}", self.dir.display()), e))?;
        let path = self.lock_path(key);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(0, format!("opening the tune lock {}", path.display()), e))?;
        // SAFETY: flock on a file descriptor this `File` owns; LOCK_NB never blocks.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(Error::io(0, format!("locking {}", path.display()), e));
        }
        // Best effort: the holder's pid, for the messages of those who wait.
        let _ = file.set_len(0).and_then(|()| file.write_all(std::process::id().to_string().as_bytes()));
        self.remove_leftovers(key);
        Ok(Some(TuneLock { _file: file, path }))
    }

    /// The process id written into `key`'s lock file by its last holder, if readable.
    pub fn lock_holder(&self, key: &TuneKey) -> Option<u32> {
        std::fs::read_to_string(self.lock_path(key)).ok()?.trim().parse().ok()
    }

    fn temp_prefix(key: &TuneKey) -> String {
        format!(".{}.toml.", key.stem())
    }

    fn remove_leftovers(&self, key: &TuneKey) {
        let prefix = Self::temp_prefix(key);
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// Stores `tuned` as `key`'s entry (the lock proves the caller tunes this key): a
    /// temporary file, fsync, rename, fsync of the directory. Returns the entry's path.
    pub fn store(&self, tuned: &Tuned, lock: &TuneLock) -> Result<PathBuf> {
        let path = self.entry_path(&tuned.key);
        if lock.path != self.lock_path(&tuned.key) {
            return Err(Error::invalid("tune cache", format!("storing {} needs its own lock, not {}", path.display(), lock.path.display())));
        }
        let text = tuned.to_entry()?;
        self.write_entry(&tuned.key, text.as_bytes())?;
        Ok(path)
    }

    /// Writes `bytes` as `key`'s entry, atomically (see [`store`](Self::store)).
    fn write_entry(&self, key: &TuneKey, bytes: &[u8]) -> Result<()> {
        let path = self.entry_path(key);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let tmp = self.dir.join(format!("{}{}.{nanos}.tmp", Self::temp_prefix(key), std::process::id()));
        let io = |what: &str, e: std::io::Error| Error::io(0, format!("{what} {}", path.display()), e);
        let r = (|| {
            let mut f = File::create(&tmp).map_err(|e| io("writing", e))?;
            f.write_all(bytes).map_err(|e| io("writing", e))?;
            f.sync_all().map_err(|e| io("syncing", e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io("renaming into", e))?;
            // The rename itself survives a crash only once the directory is synced.
            File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing the directory of", e))
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Test hook: writes raw bytes as `key`'s entry (a torn or foreign entry).
    #[doc(hidden)]
    pub fn write_raw_for_test(&self, key: &TuneKey, bytes: &[u8]) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(0, "creating the tune cache", e))?;
        self.write_entry(key, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tuned::{Cost, RankKind, Tuned};
    use crate::kinds::{Backend, Transport};

    fn tmp(tag: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let d = std::env::temp_dir().join(format!("tpar-tunecache-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn key(world: usize) -> TuneKey {
        TuneKey {
            tpar_version: TuneKey::this_version(),
            cuda_driver: 0,
            driver_version: None,
            backend: Backend::Cpu,
            ranks: RankKind::Cpu,
            world,
            devices: Vec::new(),
            topology_hash: "0".repeat(16),
            transport: Transport::Shm,
            settings: String::new(),
        }
    }

    fn tuned(k: TuneKey, note: &str) -> Tuned {
        Tuned { key: k, max_bytes: 1 << 20, unix_time: 7, nccl: note.into(), cost: Cost::default(), rejected: Vec::new(), profiles: Vec::new() }
    }

    #[test]
    fn a_stored_entry_is_read_back_and_a_damaged_one_is_a_miss_with_its_reason() {
        let root = tmp("rw");
        let c = Cache::under(&root);
        let k = key(2);
        assert!(matches!(c.read(&k, 1), Lookup::Miss(ref w) if w.contains("no tuned profile")));
        let lock = c.try_lock(&k).unwrap().unwrap();
        let path = c.store(&tuned(k.clone(), "timed"), &lock).unwrap();
        drop(lock);
        match c.read(&k, 1 << 20) {
            Lookup::Hit { tuned: t, text } => {
                assert_eq!(t.nccl, "timed");
                assert_eq!(text, std::fs::read_to_string(&path).unwrap());
            }
            Lookup::Miss(w) => panic!("{w}"),
        }
        // Larger messages than it covers, another world's key, another version: misses.
        assert!(matches!(c.read(&k, 2 << 20), Lookup::Miss(ref w) if w.contains("covers messages up to")));
        let mut v = k.clone();
        v.tpar_version = "9.9.9".into();
        assert!(matches!(c.read(&v, 1), Lookup::Miss(ref w) if w.contains("tpar")), "a new tpar refuses (and will replace) the old entry");
        // Torn (a writer killed mid-write would leave only a temporary file; a torn entry can
        // still come from a bad disk or a copy): refused.
        let text = std::fs::read(&path).unwrap();
        c.write_raw_for_test(&k, &text[..text.len() / 2]).unwrap();
        assert!(matches!(c.read(&k, 1), Lookup::Miss(ref w) if w.contains("refused")));
        c.write_raw_for_test(&k, b"").unwrap();
        assert!(matches!(c.read(&k, 1), Lookup::Miss(ref w) if w.contains("refused")));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn one_holder_at_a_time_and_a_dropped_lock_frees_the_key() {
        let root = tmp("lock");
        let c = Cache::under(&root);
        let k = key(4);
        let held = c.try_lock(&k).unwrap().expect("free at first");
        assert_eq!(c.lock_holder(&k), Some(std::process::id()));
        // Another open (as another process would) cannot take it, from any thread.
        let c2 = c.clone();
        let k2 = k.clone();
        assert!(std::thread::spawn(move || c2.try_lock(&k2).unwrap().is_none()).join().unwrap());
        assert!(c.try_lock(&key(3)).unwrap().is_some(), "another key is another lock");
        // Storing needs the key's own lock.
        let other = c.try_lock(&key(5)).unwrap().unwrap();
        assert!(c.store(&tuned(k.clone(), "x"), &other).is_err());
        drop(held);
        assert!(c.try_lock(&k).unwrap().is_some(), "released on drop");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn concurrent_writers_leave_one_whole_entry_and_leftover_temporaries_are_removed() {
        let root = tmp("race");
        let c = Cache::under(&root);
        let k = key(8);
        std::fs::create_dir_all(c.dir()).unwrap();
        // A killed writer's temporary file.
        let stale = c.dir().join(format!("{}999.1.tmp", Cache::temp_prefix(&k)));
        std::fs::write(&stale, b"half an entry").unwrap();
        // Eight threads race: each takes the lock in turn (spinning on try_lock, as the
        // start's bounded loop does) and stores its own entry.
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (c, k) = (c.clone(), k.clone());
                std::thread::spawn(move || loop {
                    if let Some(l) = c.try_lock(&k).unwrap() {
                        c.store(&tuned(k.clone(), &format!("writer {i}")), &l).unwrap();
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(matches!(c.read(&k, 1), Lookup::Hit { .. }));
        let names: Vec<String> = std::fs::read_dir(c.dir()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
        assert!(!stale.exists());
        let _ = std::fs::remove_dir_all(root);
    }
}
