//! Sleeping on a word of the shared workspace until a peer wakes it: Linux futexes on a
//! shared mapping (no `FUTEX_PRIVATE_FLAG`: the waiter and the waker are different
//! processes, and the kernel keys the wait on the page, not on this process's addresses).
//!
//! Owns: the two system calls. Never blocks without a bound: every wait carries a timeout,
//! and a wait that returns early for any reason (woken, the word already changed, a signal)
//! is only a reason to look again.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The futex word inside a 64-bit shared word: its low 32 bits.
#[cfg(target_os = "linux")]
fn low_half(word: &AtomicU64) -> *const u32 {
    let p = word.as_ptr() as *const u32;
    if cfg!(target_endian = "big") {
        // SAFETY: an AtomicU64 spans 8 bytes; its low half is the second 4 on big-endian.
        unsafe { p.add(1) }
    } else {
        p
    }
}

/// Sleeps while the low 32 bits of `word` equal `expected`, at most `timeout` (woken early by
/// [`wake_all`] on the same word, from any process that maps it).
#[cfg(target_os = "linux")]
pub fn wait(word: &AtomicU64, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the address is 4-byte aligned (inside an 8-byte aligned AtomicU64) and stays
    // mapped for the call (the workspace outlives every wait on it); the kernel only reads
    // the word and the timespec, which lives on this stack frame. Errors (EAGAIN: the word
    // changed; EINTR; ETIMEDOUT) all mean "look again", which the caller does.
    unsafe {
        libc::syscall(libc::SYS_futex, low_half(word), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0u32);
    }
}

/// Wakes every thread sleeping in [`wait`] on `word`.
#[cfg(target_os = "linux")]
pub fn wake_all(word: &AtomicU64) {
    // SAFETY: as in `wait`; FUTEX_WAKE reads nothing but the address.
    unsafe {
        libc::syscall(libc::SYS_futex, low_half(word), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0u32);
    }
}

/// Elsewhere: a short sleep (a wake-up arrives at the next look).
#[cfg(not(target_os = "linux"))]
pub fn wait(_word: &AtomicU64, _expected: u32, timeout: Duration) {
    std::thread::sleep(timeout.min(Duration::from_micros(50)));
}

#[cfg(not(target_os = "linux"))]
pub fn wake_all(_word: &AtomicU64) {}

/// Moves the calling thread off core `cpu` onto another core its affinity allows, then gives
/// the affinity back unchanged: the kernel migrates a running thread at once when its core
/// leaves the allowed set, and restoring the set does not move it back. Returns whether it
/// moved (false: `cpu` is the only allowed core, or a call failed; nothing changed then).
#[cfg(target_os = "linux")]
pub fn move_off(cpu: usize) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the set is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 || cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    let mut others = allowed;
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), inside the set.
    unsafe { libc::CPU_CLR(cpu, &mut others) };
    // SAFETY: reads the set's bits only.
    if unsafe { libc::CPU_COUNT(&others) } == 0 {
        return false;
    }
    // SAFETY: as above; the sets live on this stack frame.
    let moved = unsafe { libc::sched_setaffinity(0, size, &others) } == 0;
    // SAFETY: as above. Restores what the thread was allowed before (on failure the thread
    // keeps `others`, a subset of it, which is still a valid affinity).
    unsafe { libc::sched_setaffinity(0, size, &allowed) };
    moved
}

#[cfg(not(target_os = "linux"))]
pub fn move_off(_cpu: usize) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    fn affinity() -> Vec<usize> {
        // SAFETY: as in `move_off`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as in `move_off`.
        assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }, 0);
        // SAFETY: reads bits of a valid set.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
    }

    #[test]
    fn move_off_leaves_the_core_and_keeps_the_affinity() {
        let before = affinity();
        if before.len() < 2 {
            eprintln!("skipped: move_off_leaves_the_core_and_keeps_the_affinity: this thread may run on {} core(s), a move needs 2", before.len());
            return;
        }
        for _ in 0..4 {
            // SAFETY: no arguments.
            let here = unsafe { libc::sched_getcpu() } as usize;
            assert!(move_off(here), "could not move off core {here} (allowed: {before:?})");
            // SAFETY: no arguments.
            let there = unsafe { libc::sched_getcpu() } as usize;
            assert_ne!(there, here, "still on core {here} after the move");
            assert!(before.contains(&there), "moved to core {there}, outside {before:?}");
            assert_eq!(affinity(), before, "the affinity was not given back");
        }
    }

    #[test]
    fn a_wait_ends_at_its_timeout_or_at_a_wake() {
        let word = Arc::new(AtomicU64::new(7));
        // The word already differs: back at once.
        let t = Instant::now();
        wait(&word, 8, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // Nobody wakes it: the timeout ends it.
        let t = Instant::now();
        wait(&word, 7, Duration::from_millis(30));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(25) && took < Duration::from_secs(2), "{took:?}");
        // A wake from another thread ends it long before its 20 s timeout.
        let w = word.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.fetch_add(1, Ordering::Release);
            wake_all(&w);
        });
        let t = Instant::now();
        while word.load(Ordering::Acquire) == 7 {
            wait(&word, 7, Duration::from_secs(20));
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        waker.join().unwrap();
    }
}
