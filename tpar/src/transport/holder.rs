//! Who holds a rank's liveness lock. The lock is an OFD lock on the liveness segment, and an
//! open file description is shared with every child a rank forks: a compile worker or an
//! engine's helper process that outlives its rank keeps the lock, and the rank's death would
//! go unseen until a timeout. So each rank also records its process (pid, start time, pid
//! namespace) in the segment, and a peer counts as dead when that process has exited (a
//! zombie or gone) or was replaced (another start time) — where the checker shares its pid
//! namespace. Where a namespace cannot be read (some sandboxes hide /proc/self/ns), a
//! recorded process that is still listed with its own start time and has exited (a zombie)
//! is dead all the same; gone or replaced then cannot be told from "in another namespace",
//! and the lock alone decides.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Byte offset of rank `r`'s record in the liveness segment (after the lock bytes).
fn offset(rank: usize) -> libc::off_t {
    (256 + 16 * rank) as libc::off_t
}

/// This process as a record: pid, the low 32 bits of its start time (clock ticks since
/// boot, /proc/PID/stat field 22), the inode of its pid namespace (0 where it cannot be read).
fn me() -> Option<[u8; 16]> {
    let pid = std::process::id();
    let start = start_time(pid)?.0;
    let ns = pid_namespace().unwrap_or(0); // 0: not known
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&pid.to_le_bytes());
    b[4..8].copy_from_slice(&(start as u32).to_le_bytes());
    b[8..].copy_from_slice(&ns.to_le_bytes());
    Some(b)
}

/// This process's pid namespace (its inode), read once: a liveness check runs every 10 ms.
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static NS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()))
}

/// (start time, state) of process `pid`, or None where /proc does not say.
fn start_time(pid: u32) -> Option<(u64, char)> {
    match proc_entry(pid) {
        Entry::Listed(t, state) => Some((t, state)),
        Entry::Gone | Entry::Unreadable => None,
    }
}

/// (start time, state) from the text of /proc/PID/stat (fields 22 and 3; the name in field 2
/// may hold spaces and parentheses, so fields count from its last `)`).
fn parse_stat(s: &str) -> Option<(u64, char)> {
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some((f.get(19)?.parse().ok()?, f.first()?.chars().next()?))
}

/// Records this process as the holder of `rank`'s lock. Best effort: without /proc the lock
/// alone decides, as before.
pub(crate) fn record(fd: BorrowedFd<'_>, rank: usize) {
    if let Some(b) = me() {
        // SAFETY: pwrite of 16 bytes from a live buffer to a valid fd; the segment is a page.
        let _ = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), b.len(), offset(rank)) };
    }
}

/// Whether `rank`'s recorded process has certainly exited: it is listed with its recorded
/// start time and is a zombie; or it was recorded in this pid namespace and is now gone or
/// another process holds its pid. False whenever that cannot be told (no record, another or
/// an unreadable namespace, /proc unreadable): a false "dead" would abort a healthy job.
pub(crate) fn exited(fd: BorrowedFd<'_>, rank: usize) -> bool {
    let mut b = [0u8; 16];
    // SAFETY: pread of 16 bytes into a live buffer from a valid fd.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), offset(rank)) };
    if n != 16 {
        return false;
    }
    let pid = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let start = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let ns = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
    if pid == 0 {
        return false;
    }
    judge(start, ns != 0 && pid_namespace() == Some(ns), proc_entry(pid))
}

/// What /proc says of a pid: gone, unreadable, or its (start time, state).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Entry {
    Gone,
    Unreadable,
    Listed(u64, char),
}

/// One read of /proc/PID/stat: gone (no such entry, or reaped while it was read),
/// unreadable (any other error, or text that does not parse), or listed.
fn proc_entry(pid: u32) -> Entry {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => parse_stat(&s).map_or(Entry::Unreadable, |(t, state)| Entry::Listed(t, state)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => Entry::Gone,
        Err(_) => Entry::Unreadable,
    }
}

/// The rule of [`exited`]: `start` recorded, `same_ns` whether the record was made in the
/// checker's (readable) pid namespace, `now` what /proc lists under the recorded pid.
fn judge(start: u32, same_ns: bool, now: Entry) -> bool {
    match now {
        // The recorded process itself (its own start time): dead once it has exited.
        Entry::Listed(t, state) if t as u32 == start => state == 'Z' || state == 'X',
        // Another process under that pid, or none: dead only where the pid means the same.
        Entry::Listed(..) | Entry::Gone => same_ns,
        Entry::Unreadable => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_recorded_process_is_live_until_it_exits() {
        let f = tempfile_in_tmp();
        record(f.as_fd(), 3);
        assert!(!exited(f.as_fd(), 3), "this very process");
        assert!(!exited(f.as_fd(), 2), "no record: the lock alone decides");
        // A child that has exited and been reaped, recorded as rank 1 in this namespace.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mut b = me().unwrap();
        b[..4].copy_from_slice(&pid.to_le_bytes());
        // SAFETY: as in `record`.
        let wrote = unsafe { libc::pwrite(f.as_raw_fd(), b.as_ptr().cast(), 16, offset(1)) };
        assert_eq!(wrote, 16);
        assert!(exited(f.as_fd(), 1), "a reaped child is gone");
        // The same record from another pid namespace tells nothing.
        b[8..].copy_from_slice(&(pid_namespace().unwrap() ^ 1).to_le_bytes());
        // SAFETY: as above.
        let wrote = unsafe { libc::pwrite(f.as_raw_fd(), b.as_ptr().cast(), 16, offset(1)) };
        assert_eq!(wrote, 16);
        assert!(
            !exited(f.as_fd(), 1),
            "another namespace: not judged by pid"
        );
    }

    #[test]
    fn a_zombie_is_dead_even_where_the_namespace_cannot_be_read() {
        let f = tempfile_in_tmp();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it has run.
        let t0 = std::time::Instant::now();
        let start = loop {
            match start_time(pid) {
                Some((t, 'Z')) => break t,
                _ if t0.elapsed() < std::time::Duration::from_secs(20) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                other => panic!("the child never became a zombie: {other:?}"),
            }
        };
        let mut b = [0u8; 16]; // namespace 0: not known
        b[..4].copy_from_slice(&pid.to_le_bytes());
        b[4..8].copy_from_slice(&(start as u32).to_le_bytes());
        // SAFETY: as in `record`.
        let wrote = unsafe { libc::pwrite(f.as_raw_fd(), b.as_ptr().cast(), 16, offset(0)) };
        assert_eq!(wrote, 16);
        assert!(exited(f.as_fd(), 0), "a zombie with its own start time");
        child.wait().unwrap();
        assert!(!exited(f.as_fd(), 0), "reaped, namespace unknown: cannot be told from another namespace");
    }

    #[test]
    fn the_rule_for_each_thing_proc_can_say() {
        let start = 1234u32;
        for same_ns in [false, true] {
            assert!(!judge(start, same_ns, Entry::Listed(1234, 'S')), "the recorded process, alive");
            assert!(!judge(start, same_ns, Entry::Listed(1234, 'R')));
            assert!(judge(start, same_ns, Entry::Listed(1234, 'Z')), "the recorded process, exited");
            assert!(judge(start, same_ns, Entry::Listed(1234 + (1u64 << 32), 'Z')), "start times compare in 32 bits, as recorded");
            assert_eq!(judge(start, same_ns, Entry::Listed(99, 'S')), same_ns, "another process under the pid");
            assert_eq!(judge(start, same_ns, Entry::Gone), same_ns, "no process under the pid");
            assert!(!judge(start, same_ns, Entry::Unreadable));
        }
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!(
            "tpar-holder-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(4096).unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
