//! POSIX shared memory for CPU ranks, and liveness through open-file-description locks.
//!
//! Owns: creating (0600, `O_EXCL`), opening, mapping and unlinking the segment, and the
//! per-rank liveness lock. A rank holds a write lock on byte `rank` of the segment for as
//! long as it lives; the kernel drops it the moment the process dies (even as a zombie), so
//! a peer learns of a death within one check, without signals or pid reuse races.
//! Must never leave a name behind: the creator unlinks once every rank has attached, and
//! `Drop` unlinks if that has not happened yet.

use crate::error::{Error, Result};
use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// A mapped shared-memory segment.
pub struct ShmSegment {
    fd: OwnedFd,
    ptr: NonNull<c_void>,
    len: usize,
    name: String,
    /// Whether this handle still owes an unlink (the creator, before all ranks attached).
    owns_name: bool,
    rank: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the handle itself
// (fd, pointer, length) is plain data that may move between threads.
unsafe impl Send for ShmSegment {}
// SAFETY: as above; `&ShmSegment` only hands out `&[AtomicU64]`.
unsafe impl Sync for ShmSegment {}

fn map(fd: &OwnedFd, len: usize, rank: usize, name: &str) -> Result<NonNull<c_void>> {
    let nz = NonZeroUsize::new(len).ok_or_else(|| Error::invalid("shm size", "zero-length segment"))?;
    // SAFETY: mapping a shared-memory fd we own, with a length the segment has (ftruncate or
    // fstat checked); no address hint, so nothing existing is replaced.
    unsafe { mmap(None, nz, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd, 0) }
        .map_err(|e| Error::io(rank, format!("mmap of shared memory {name} ({len} bytes)"), e))
}

impl ShmSegment {
    /// Creates a new segment readable and writable by this user only.
    pub fn create(name: &str, len: usize, rank: usize) -> Result<Self> {
        let fd = shm_open(name, OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR, Mode::S_IRUSR | Mode::S_IWUSR)
            .map_err(|e| Error::io(rank, format!("shm_open(create) {name}"), e))?;
        let seg_len = i64::try_from(len).map_err(|_| Error::invalid("shm size", format!("{len} bytes")))?;
        if let Err(e) = nix::unistd::ftruncate(&fd, seg_len) {
            let _ = shm_unlink(name);
            return Err(Error::io(
                rank,
                format!("ftruncate of shared memory {name} to {len} bytes (is /dev/shm large enough?)"),
                e,
            ));
        }
        let ptr = match map(&fd, len, rank, name) {
            Ok(p) => p,
            Err(e) => {
                let _ = shm_unlink(name);
                return Err(e);
            }
        };
        Ok(ShmSegment {
            fd,
            ptr,
            len,
            name: name.to_string(),
            owns_name: true,
            rank,
        })
    }

    /// Opens an existing segment, which must be exactly `len` bytes.
    pub fn open(name: &str, len: usize, rank: usize) -> Result<Self> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty()).map_err(|e| Error::io(rank, format!("shm_open {name}"), e))?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| Error::io(rank, format!("fstat {name}"), e))?;
        if st.st_size as u64 != len as u64 {
            return Err(Error::Rendezvous {
                rank,
                field: "shm size",
                expected: len.to_string(),
                got: st.st_size.to_string(),
            });
        }
        let ptr = map(&fd, len, rank, name)?;
        Ok(ShmSegment {
            fd,
            ptr,
            len,
            name: name.to_string(),
            owns_name: false,
            rank,
        })
    }

    /// Removes the name; the mapping stays valid for every rank that has it.
    pub fn unlink(&mut self) -> Result<()> {
        if self.owns_name {
            self.owns_name = false;
            shm_unlink(self.name.as_str()).map_err(|e| Error::io(self.rank, format!("shm_unlink {}", self.name), e))?;
        }
        Ok(())
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mapping's first byte (page-aligned), for handing the whole mapping to a device
    /// driver (the GPU host transport registers it with CUDA); [`len`](Self::len) bytes.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: segments have a positive length).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocates every page of the segment now (`posix_fallocate`), so that a /dev/shm too
    /// small for it is an error here, not a SIGBUS at the first touch of a page.
    pub fn reserve(&self) -> Result<()> {
        let len = libc::off_t::try_from(self.len).map_err(|_| Error::invalid("shm size", format!("{} bytes", self.len)))?;
        // SAFETY: posix_fallocate on a valid fd we own; it touches no memory of ours.
        let rc = unsafe { libc::posix_fallocate(self.fd.as_raw_fd(), 0, len) };
        if rc != 0 {
            return Err(Error::io(
                self.rank,
                format!("allocating {} bytes of shared memory {} (is /dev/shm large enough?)", self.len, self.name),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    /// The mapping as words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page-aligned, `len` bytes long (a multiple of 8 by
        // construction of the layout, rounded down here regardless), lives as long as
        // `self`, and AtomicU64 has u64's size and alignment; every access is atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const AtomicU64, self.len / 8) }
    }

    fn lock_op(&self, cmd: libc::c_int, byte: usize, ty: libc::c_short) -> std::io::Result<libc::flock> {
        lock_op(self.fd.as_fd(), cmd, byte, ty)
    }

    /// A handle on the same liveness locks for another thread (a watchdog): it shares this
    /// segment's open file description, so it sees the peers' locks exactly as this handle
    /// does, and maps nothing.
    pub fn liveness_probe(&self) -> Result<LivenessProbe> {
        let fd = self.fd.try_clone().map_err(|e| Error::io(self.rank, format!("duplicating the liveness descriptor of {}", self.name), e))?;
        Ok(LivenessProbe { fd })
    }

    /// Takes the liveness lock for `rank` (held until this handle closes).
    pub fn hold_liveness(&self, rank: usize) -> Result<()> {
        self.lock_op(libc::F_OFD_SETLK, rank, libc::F_WRLCK as libc::c_short)
            .map(|_| super::holder::record(self.fd.as_fd(), rank))
            .map_err(|e| Error::io(self.rank, format!("liveness lock for rank {rank} (is another process using this rank?)"), e))
    }

    /// Whether some live process holds `rank`'s liveness lock. Errs on the side of "alive"
    /// if the check itself fails: a false "dead" would abort a healthy job.
    pub fn is_alive(&self, rank: usize) -> bool {
        holds_lock(self.fd.as_fd(), rank)
    }
}

/// The liveness locks seen from another thread ([`ShmSegment::liveness_probe`]).
#[derive(Debug)]
pub struct LivenessProbe {
    fd: OwnedFd,
}

impl LivenessProbe {
    /// As [`ShmSegment::is_alive`].
    pub fn is_alive(&self, rank: usize) -> bool {
        holds_lock(self.fd.as_fd(), rank)
    }
}

fn lock_op(fd: std::os::fd::BorrowedFd<'_>, cmd: libc::c_int, byte: usize, ty: libc::c_short) -> std::io::Result<libc::flock> {
    let mut fl = libc::flock {
        l_type: ty,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: byte as libc::off_t,
        l_len: 1,
        l_pid: 0,
    };
    // SAFETY: fcntl on a valid fd with a properly initialised flock; OFD lock commands require
    // l_pid = 0, which it is.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if r == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl)
}

/// Whether some live process (another open file description) holds `rank`'s liveness lock.
/// Errs on the side of "alive" if the check itself fails: a false "dead" would abort a
/// healthy job.
/// A rank whose recorded process has exited counts as dead even while a child it forked
/// still holds the lock through the shared open file description (transport/holder.rs).
fn holds_lock(fd: std::os::fd::BorrowedFd<'_>, rank: usize) -> bool {
    match lock_op(fd, libc::F_OFD_GETLK, rank, libc::F_WRLCK as libc::c_short) {
        Ok(fl) => fl.l_type != libc::F_UNLCK as libc::c_short && !super::holder::exited(fd, rank),
        Err(_) => true,
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        if self.owns_name {
            let _ = shm_unlink(self.name.as_str());
        }
        // SAFETY: ptr/len are the mapping made in `map`; nothing borrows it past `self`.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// Names of tpar segments currently in /dev/shm whose name contains `tag` (for leak checks
/// and for launchers cleaning up after crashed ranks).
pub fn leftover_segments(tag: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tpar-") && n.contains(tag))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes every tpar segment name in /dev/shm that contains `tag` (a job id: what a rank
/// killed between creating and unlinking a segment left) and returns how many. Launchers
/// call it when a job ends; mappings that live processes still hold stay valid.
pub fn remove_leftovers(tag: &str) -> usize {
    leftover_segments(tag).iter().filter(|name| shm_unlink(format!("/{name}").as_str()).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn create_open_unlink_and_liveness() {
        let name = format!("/tpar-test-{}-{}", std::process::id(), rand::random::<u32>());
        let mut a = ShmSegment::create(&name, 4096, 0).unwrap();
        let b = ShmSegment::open(&name, 4096, 1).unwrap();
        assert!(ShmSegment::open(&name, 8192, 1).is_err(), "size mismatch must be refused");
        a.words()[3].store(42, Ordering::Release);
        assert_eq!(b.words()[3].load(Ordering::Acquire), 42);
        let meta = std::fs::metadata(format!("/dev/shm{name}")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        a.unlink().unwrap();
        assert!(leftover_segments(&name[6..]).is_empty());
        assert!(!a.is_alive(1));
        b.hold_liveness(1).unwrap();
        assert!(a.is_alive(1));
        drop(b);
        assert!(!a.is_alive(1), "lock must drop with the handle");
    }

    /// A rank that forked a child (a compile worker, an engine's helper) shares its open file
    /// description with it, so the child keeps the rank's liveness lock after the rank dies;
    /// the rank's death must show all the same (transport/holder.rs). Real processes: the
    /// rank is a forked child that takes its lock and forks a holder, then is killed.
    #[test]
    fn a_forked_child_holding_a_dead_ranks_lock_does_not_hide_the_death() {
        let name = format!("/tpar-test-fork-{}-{}", std::process::id(), rand::random::<u32>());
        let mut observer = ShmSegment::create(&name, 4096, 0).unwrap();
        let rank_seg = ShmSegment::open(&name, 4096, 1).unwrap(); // the rank's own description
        observer.unlink().unwrap();
        // Taking a lock records this process (holder::record), which reads the pid namespace
        // once per process: done here, the forked rank never waits on that one-time read
        // (another test thread might be in it at the moment of the fork).
        observer.hold_liveness(0).unwrap();
        let mut fds: [libc::c_int; 2] = [0; 2];
        // SAFETY: pipe fills a two-int array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child runs only fcntl/pwrite/read of /proc (hold_liveness), fork, write
        // and pause, then ends by _exit or a signal, never returning into the test harness.
        let rank = unsafe { libc::fork() };
        assert!(rank >= 0, "fork failed");
        if rank == 0 {
            // SAFETY: plain syscalls on descriptors this process owns.
            unsafe {
                if rank_seg.hold_liveness(1).is_err() {
                    libc::_exit(2);
                }
                let holder = libc::fork();
                if holder == 0 {
                    // The holder: inherits the rank's descriptor (and lock), outlives it.
                    loop {
                        libc::pause();
                    }
                }
                let _ = libc::write(fds[1], (&holder as *const libc::pid_t).cast(), 4);
                loop {
                    libc::pause();
                }
            }
        }
        // The test process keeps no handle on the rank's description.
        drop(rank_seg);
        // SAFETY: closing the write end we own.
        unsafe { libc::close(fds[1]) };
        let mut holder: libc::pid_t = 0;
        // SAFETY: read of 4 bytes into a live pid_t from the pipe's read end.
        let n = unsafe { libc::read(fds[0], (&mut holder as *mut libc::pid_t).cast(), 4) };
        // SAFETY: closing the read end we own.
        unsafe { libc::close(fds[0]) };
        let kill_holder = |holder: libc::pid_t| {
            if holder > 0 {
                // SAFETY: the holder is our grandchild; init reaps it.
                unsafe { libc::kill(holder, libc::SIGKILL) };
            }
        };
        let reap = |pid: libc::pid_t| {
            let mut st = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
        };
        if n != 4 {
            // SAFETY: our child.
            unsafe { libc::kill(rank, libc::SIGKILL) };
            reap(rank);
            panic!("the rank process did not take its lock and fork its holder");
        }
        let alive_before = observer.is_alive(1);
        // SAFETY: killing our own child, the rank.
        unsafe { libc::kill(rank, libc::SIGKILL) };
        // The rank is dead (a zombie until reaped); its holder still has the lock.
        let t0 = std::time::Instant::now();
        let locked = loop {
            let fl = lock_op(observer.fd.as_fd(), libc::F_OFD_GETLK, 1, libc::F_WRLCK as libc::c_short).unwrap();
            let zombie = std::fs::read_to_string(format!("/proc/{rank}/stat")).is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')));
            if zombie || t0.elapsed() > std::time::Duration::from_secs(10) {
                break fl.l_type != libc::F_UNLCK as libc::c_short;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let dead_as_zombie = !observer.is_alive(1);
        reap(rank);
        let dead_when_gone = !observer.is_alive(1);
        let ns_readable = std::fs::metadata("/proc/self/ns/pid").is_ok();
        kill_holder(holder);
        assert!(alive_before, "the live rank holds its lock");
        assert!(locked, "the holder keeps the dead rank's lock (else this test proves nothing)");
        assert!(dead_as_zombie, "the rank died, its forked child still holds the lock: the death must show");
        // Reaped: gone from this pid namespace, so dead; where the namespace cannot be read,
        // a gone pid cannot be told from another namespace's and the lock decides (alive).
        assert_eq!(dead_when_gone, ns_readable, "reaped rank; pid namespace readable: {ns_readable}");
    }
}
