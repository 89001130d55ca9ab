//! The GPU host transport across processes: one POSIX shared-memory segment for the whole
//! job holding every rank's kernel workspace (data area and flag area), created by rank 0
//! and mapped by every rank process. The CUDA side (`cuda::host_ws`) registers the mapping
//! with the driver in each process and hands the device pointers to the kernels; this file
//! knows nothing of CUDA, so naming, sizes, checks and cleanup are tested without a GPU.
//!
//! Layout: a header page, then per rank `q` its data area at [`HostLayout::data_offset`] and
//! its flag area at [`HostLayout::flag_offset`], each starting on a page. The creator fills
//! every push region with the empty word (the rest stays zero from `ftruncate`) and writes
//! the header's `READY` word last; an attacher checks the welcome bytes (size, areas, name),
//! the segment's size (`fstat`) and every header word before it uses anything.
//!
//! Owns: the segment's name (`/tpar-<job>-<pid>-<rand>-gpuhost`, so a launcher's
//! `leftover_segments(job)` finds it), its size arithmetic and header. Must never trust a
//! size or name it has not checked, or leave the name behind: the creator unlinks it once
//! every rank has mapped it ([`HostSegment::unlink`], after a barrier), and its `Drop`
//! unlinks it when that never happened (a failed join). A creator SIGKILLed in between
//! leaves the name to the launcher's cleanup (`tpar-cli`'s launcher removes the job's
//! leftovers on every exit).

use crate::error::{Error, Result};
use crate::transport::shm::ShmSegment;
use std::sync::atomic::Ordering;

/// Every area starts on a page (CUDA registers whole pages; the kernels need 16 bytes).
pub const PAGE: usize = 4096;
/// `"TPARGHST"`: the header's first word.
pub const MAGIC: u64 = 0x5450_4152_4748_5354;
/// Bumped when the layout changes: a rank of another build must not read it as its own.
pub const VERSION: u64 = 1;
/// The name's suffix (after the job id, pid and a random word).
pub const SUFFIX: &str = "gpuhost";

/// Header words (u64 each).
mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const JOB: usize = 2;
    pub const WORLD: usize = 3;
    pub const DATA_BYTES: usize = 4;
    pub const FLAG_BYTES: usize = 5;
    pub const TOTAL: usize = 6;
    /// Written last by the creator (Release), after every area is initialised.
    pub const READY: usize = 7;
}

/// Bytes of the welcome before the name: total, data bytes, flag bytes.
const WELCOME_FIXED: usize = 24;

fn round_up(x: usize) -> Option<usize> {
    x.checked_add(PAGE - 1).map(|v| v / PAGE * PAGE)
}

/// Where each rank's areas lie in the job's segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLayout {
    pub world: usize,
    /// Bytes of one rank's data area (the kernels' `abi::data_bytes`).
    pub data_bytes: usize,
    /// Bytes of one rank's flag area (`abi::FLAG_BYTES`).
    pub flag_bytes: usize,
    stride: usize,
    total: usize,
}

impl HostLayout {
    /// The layout for `world` ranks whose areas have these sizes.
    pub fn new(world: usize, data_bytes: usize, flag_bytes: usize) -> Result<Self> {
        if !(2..=crate::workspace::MAX_WORLD).contains(&world) {
            return Err(Error::invalid("world", format!("{world}: the host transport runs 2 to {} ranks", crate::workspace::MAX_WORLD)));
        }
        if data_bytes == 0 || flag_bytes == 0 || data_bytes % 16 != 0 || flag_bytes % 16 != 0 {
            return Err(Error::invalid("host workspace", format!("areas of {data_bytes} and {flag_bytes} bytes: need positive multiples of 16")));
        }
        let too_big = || Error::invalid("host workspace", format!("{world} ranks x {data_bytes} bytes overflows"));
        let stride = round_up(data_bytes).and_then(|d| round_up(flag_bytes).and_then(|f| d.checked_add(f))).ok_or_else(too_big)?;
        let total = stride.checked_mul(world).and_then(|b| b.checked_add(PAGE)).ok_or_else(too_big)?;
        if i64::try_from(total).is_err() {
            return Err(too_big());
        }
        Ok(Self { world, data_bytes, flag_bytes, stride, total })
    }

    /// The segment's size: the header page and every rank's areas.
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Byte offset of rank `q`'s data area (page-aligned).
    pub fn data_offset(&self, q: usize) -> usize {
        PAGE + q * self.stride
    }

    /// Byte offset of rank `q`'s flag area (page-aligned).
    pub fn flag_offset(&self, q: usize) -> usize {
        self.data_offset(q) + self.stride - round_up(self.flag_bytes).unwrap_or(self.flag_bytes)
    }
}

/// A new segment name for job `job_id`: unique to this process and moment, carrying the job
/// id so that a launcher's cleanup finds it.
pub fn segment_name(job_id: u64) -> String {
    format!("/tpar-{job_id:016x}-{}-{:08x}-{SUFFIX}", std::process::id(), rand::random::<u32>())
}

fn field(rank: usize, field: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Rendezvous { rank, field, expected: expected.to_string(), got: got.to_string() }
}

/// The job's host segment as one rank maps it.
pub struct HostSegment {
    shm: ShmSegment,
    layout: HostLayout,
}

impl HostSegment {
    /// Rank 0: creates the segment (0600), allocates every page, fills each rank's first
    /// `push_bytes` of its data area with `empty_word`, writes the header; returns it and
    /// the welcome bytes the other ranks pass to [`attach`](Self::attach).
    pub fn create(job_id: u64, rank: usize, layout: HostLayout, push_bytes: usize, empty_word: u32) -> Result<(Self, Vec<u8>)> {
        if push_bytes > layout.data_bytes || push_bytes % 8 != 0 {
            return Err(Error::invalid("push region", format!("{push_bytes} bytes in a data area of {}", layout.data_bytes)));
        }
        let name = segment_name(job_id);
        let shm = ShmSegment::create(&name, layout.total_bytes(), rank)?;
        // The segment unlinks its name on drop from here on (it owns it until `unlink`).
        shm.reserve()?;
        let w = shm.words();
        let fill = u64::from(empty_word) << 32 | u64::from(empty_word);
        for q in 0..layout.world {
            let first = layout.data_offset(q) / 8;
            for word in &w[first..first + push_bytes / 8] {
                word.store(fill, Ordering::Relaxed);
            }
        }
        let header = [MAGIC, VERSION, job_id, layout.world as u64, layout.data_bytes as u64, layout.flag_bytes as u64, layout.total as u64];
        for (i, v) in header.iter().enumerate() {
            w[i].store(*v, Ordering::Relaxed);
        }
        w[hdr::READY].store(1, Ordering::Release);
        let mut welcome = Vec::with_capacity(WELCOME_FIXED + name.len());
        welcome.extend_from_slice(&(layout.total as u64).to_le_bytes());
        welcome.extend_from_slice(&(layout.data_bytes as u64).to_le_bytes());
        welcome.extend_from_slice(&(layout.flag_bytes as u64).to_le_bytes());
        welcome.extend_from_slice(name.as_bytes());
        Ok((HostSegment { shm, layout }, welcome))
    }

    /// Any other rank: maps the segment rank 0 created, after checking the welcome against
    /// this rank's own `layout` and every header word against this job.
    pub fn attach(job_id: u64, rank: usize, layout: HostLayout, welcome: &[u8]) -> Result<Self> {
        if welcome.len() <= WELCOME_FIXED {
            return Err(field(rank, "host workspace welcome", format!("> {WELCOME_FIXED} bytes"), welcome.len()));
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&welcome[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (total, data, flags) = (u64_at(0), u64_at(8), u64_at(16));
        if (data, flags) != (layout.data_bytes as u64, layout.flag_bytes as u64) {
            return Err(field(
                rank,
                "host workspace areas",
                format!("{} + {} bytes per rank (this rank's max_bytes)", layout.data_bytes, layout.flag_bytes),
                format!("{data} + {flags} bytes from rank 0"),
            ));
        }
        if total != layout.total as u64 {
            return Err(field(rank, "host workspace size", layout.total, total));
        }
        let name = std::str::from_utf8(&welcome[WELCOME_FIXED..]).map_err(|_| field(rank, "host workspace name", "UTF-8", "invalid bytes"))?;
        let job_tag = format!("/tpar-{job_id:016x}-");
        if !name.starts_with(&job_tag) || !name.ends_with(SUFFIX) || name.len() > 200 || name[1..].contains('/') {
            return Err(field(rank, "host workspace name", format!("{job_tag}…-{SUFFIX}"), name));
        }
        let shm = ShmSegment::open(name, layout.total_bytes(), rank)?;
        let w = shm.words();
        if w[hdr::READY].load(Ordering::Acquire) != 1 {
            return Err(field(rank, "host workspace ready", 1, w[hdr::READY].load(Ordering::Acquire)));
        }
        let checks: [(usize, &'static str, u64); 7] = [
            (hdr::MAGIC, "host workspace magic", MAGIC),
            (hdr::VERSION, "host workspace layout version", VERSION),
            (hdr::JOB, "host workspace job_id", job_id),
            (hdr::WORLD, "host workspace world", layout.world as u64),
            (hdr::DATA_BYTES, "host workspace data bytes", layout.data_bytes as u64),
            (hdr::FLAG_BYTES, "host workspace flag bytes", layout.flag_bytes as u64),
            (hdr::TOTAL, "host workspace size", layout.total as u64),
        ];
        for (i, what, want) in checks {
            let got = w[i].load(Ordering::Acquire);
            if got != want {
                return Err(field(rank, what, format!("{want:#x}"), format!("{got:#x}")));
            }
        }
        Ok(HostSegment { shm, layout })
    }

    pub fn layout(&self) -> &HostLayout {
        &self.layout
    }

    /// The mapping's first byte in this process (page-aligned; [`len`](Self::len) bytes).
    pub fn as_ptr(&self) -> *mut std::ffi::c_void {
        self.shm.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.shm.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shm.is_empty()
    }

    pub fn name(&self) -> &str {
        self.shm.name()
    }

    /// Reads the u32 at byte offset `off` (tests and diagnostics; the kernels own the areas).
    pub fn read_u32(&self, off: usize) -> Option<u32> {
        let w = self.shm.words().get(off / 8)?.load(Ordering::Acquire);
        if off % 4 != 0 {
            return None;
        }
        Some(if off % 8 == 0 { w as u32 } else { (w >> 32) as u32 })
    }

    /// Removes the name (the creator, once every rank has mapped the segment); the mappings
    /// stay valid. A no-op for ranks that attached.
    pub fn unlink(&mut self) -> Result<()> {
        self.shm.unlink()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::leftover_segments;

    fn layout(world: usize) -> HostLayout {
        HostLayout::new(world, 21 * 4096 + 16, 5 * 1024).unwrap()
    }

    #[test]
    fn layout_is_page_aligned_and_disjoint() {
        let l = layout(4);
        assert_eq!(l.data_offset(0), PAGE);
        for q in 0..4 {
            assert_eq!(l.data_offset(q) % PAGE, 0);
            assert_eq!(l.flag_offset(q) % PAGE, 0);
            assert!(l.data_offset(q) + l.data_bytes <= l.flag_offset(q));
            assert!(l.flag_offset(q) + l.flag_bytes <= if q + 1 < 4 { l.data_offset(q + 1) } else { l.total_bytes() });
        }
        assert_eq!(l.total_bytes() % PAGE, 0);
        assert!(HostLayout::new(1, 16, 16).is_err());
        assert!(HostLayout::new(17, 16, 16).is_err());
        assert!(HostLayout::new(2, 0, 16).is_err());
        assert!(HostLayout::new(2, 24, 16).is_err(), "areas are whole 16-byte vectors");
        assert!(HostLayout::new(16, (usize::MAX / 4) & !15, 16).is_err(), "overflow is an error");
    }

    #[test]
    fn names_carry_the_job_and_are_unique() {
        let a = segment_name(0xabc);
        let b = segment_name(0xabc);
        assert_ne!(a, b);
        assert!(a.starts_with("/tpar-0000000000000abc-") && a.ends_with("-gpuhost"), "{a}");
    }

    #[test]
    fn create_attach_check_and_unlink() {
        let job = rand::random::<u64>();
        let l = layout(3);
        let push = 4096;
        let (mut a, welcome) = HostSegment::create(job, 0, l, push, 0xffff_ffff).unwrap();
        let tag = format!("{job:016x}");
        assert_eq!(leftover_segments(&tag).len(), 1);
        let b = HostSegment::attach(job, 1, l, &welcome).unwrap();
        // The same pages: the push regions hold the empty word, the rest zeroes, in both maps.
        for q in 0..3 {
            assert_eq!(b.read_u32(l.data_offset(q)), Some(0xffff_ffff));
            assert_eq!(b.read_u32(l.data_offset(q) + push - 4), Some(0xffff_ffff));
            assert_eq!(b.read_u32(l.data_offset(q) + push), Some(0));
            assert_eq!(b.read_u32(l.flag_offset(q)), Some(0));
        }
        // SAFETY: a's mapping is live and at least PAGE + 4 bytes; nothing else writes there.
        unsafe { std::ptr::write_volatile((a.as_ptr() as *mut u8).add(l.data_offset(2) + push) as *mut u32, 7) };
        assert_eq!(b.read_u32(l.data_offset(2) + push), Some(7));
        // Wrong sizes, job, world, name: refused with the field named.
        let err = |r: Result<HostSegment>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(HostSegment::attach(job, 1, layout(2), &welcome)).contains("host workspace size"));
        assert!(err(HostSegment::attach(job, 1, HostLayout::new(3, 4096, 5 * 1024).unwrap(), &welcome)).contains("areas"));
        assert!(err(HostSegment::attach(job ^ 1, 1, l, &welcome)).contains("host workspace name"));
        let mut bad = welcome.clone();
        bad.truncate(WELCOME_FIXED);
        assert!(err(HostSegment::attach(job, 1, l, &bad)).contains("welcome"));
        let mut evil = welcome[..WELCOME_FIXED].to_vec();
        evil.extend_from_slice(format!("/tpar-{job:016x}-../../etc-gpuhost").as_bytes());
        assert!(err(HostSegment::attach(job, 1, l, &evil)).contains("host workspace name"));
        // The right name and size but a header of another job, or of another layout version.
        let job_word = |v: u64| {
            // SAFETY: a's mapping is live; the header's JOB word is inside its first page.
            unsafe { std::ptr::write_volatile((a.as_ptr() as *mut u64).add(hdr::JOB), v) }
        };
        job_word(job ^ 1);
        assert!(err(HostSegment::attach(job, 2, l, &welcome)).contains("job_id"));
        job_word(job);
        assert!(HostSegment::attach(job, 2, l, &welcome).is_ok());
        a.unlink().unwrap();
        assert!(leftover_segments(&tag).is_empty());
        // Mappings outlive the name.
        assert_eq!(b.read_u32(l.data_offset(0)), Some(0xffff_ffff));
    }

    #[test]
    fn a_creator_dropped_before_unlink_removes_its_name() {
        let job = rand::random::<u64>();
        let (a, _) = HostSegment::create(job, 0, layout(2), 16, 0).unwrap();
        let tag = format!("{job:016x}");
        assert_eq!(leftover_segments(&tag).len(), 1);
        drop(a);
        assert!(leftover_segments(&tag).is_empty());
    }
}
