//! [`RankSet`]'s test and measurement hooks: a rank that announces another call, skewed
//! ranks, absent ranks, an epoch near its wrap, the engine's own copies between calls, the
//! launch floor, the launches a call made, and the kernels' phase stamps. Nothing here is on
//! a call's path unless a test sets it.

use super::super::abi::{self, TparState};
use super::super::launch::Launch;
use super::RankSet;
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
use crate::dtype::DType;

impl RankSet {
    /// Test hook: rank `rank` announces `desc_code` (see `abi::desc_code`) instead of its
    /// call's, as a rank calling another dtype or algorithm would, while moving the same data
    /// as the others; None restores the truth.
    pub fn set_desc_override_for_test(&mut self, o: Option<(usize, u32)>) {
        self.desc_override = o;
    }

    /// Test hook (skewed ranks): from now on, before each call every rank waits on the device
    /// for a random time, drawn per rank and per call (half the time 0, else up to `max_ns`),
    /// inside the kernel, so that PDL chains and graphs are kept. None: no delays.
    pub fn set_skew_for_test(&mut self, skew: Option<(u64, u32)>) {
        self.skew = skew;
    }

    /// Rank `rank`'s skew before the current call (0 without the hook).
    pub(super) fn skew_ns(&self, rank: usize) -> u32 {
        let Some((seed, max)) = self.skew else { return 0 };
        // splitmix64 of (seed, launch, rank): reproducible, different per rank and call.
        let mut z = seed ^ self.launches.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (rank as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z & 1 == 0 || max == 0 {
            0
        } else {
            ((z >> 1) % u64::from(max)) as u32 + 1
        }
    }

    /// Test hook (emulated ranks): restart every rank's epoch at `epoch` (e.g. near u32::MAX
    /// to test wrap-around).
    pub fn set_epoch_for_test(&mut self, epoch: u32) -> Result<()> {
        self.check_poisoned()?;
        if self.fan.is_none() {
            return Err(Error::Unsupported { what: "restarting the epochs of a rank process".into(), reason: "its peers may write into its workspace at any time".into() });
        }
        self.reset_workspaces(epoch)
    }

    /// Test hook behind [`enqueue`](Self::enqueue): launches only the local ranks with
    /// `present[i]`, to prove that a rank that never arrives costs a Timeout, not a hang.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_ranks(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32, present: &[bool]) -> Result<()> {
        self.enqueue_plain(algo, dtype, count, (inputs, outputs), blocks, present, true)
    }

    /// Test hook: on every local rank's stream, copies `bytes` from `src[i]` to `dst[i]`
    /// (device pointers), as an engine's own work between two calls would (capturable:
    /// inside a capture the copies join each rank's chain). The skewed graph test overwrites
    /// a rank's input and reads its output this way right after its call: a rank that left a
    /// registered call while a peer still used its buffers gives wrong sums.
    pub fn enqueue_copies(&mut self, src: &[u64], dst: &[u64], bytes: usize) -> Result<()> {
        self.check_poisoned()?;
        if src.len() != self.ranks.len() || dst.len() != self.ranks.len() {
            return Err(Error::invalid("copies", format!("need one source and destination per local rank ({})", self.ranks.len())));
        }
        let fan = if self.capturing { None } else { self.fan.as_ref() };
        if let Some(f) = fan {
            f.origin.record(&f.fork)?;
        }
        for (i, r) in self.ranks.iter().enumerate() {
            if let Some(f) = fan {
                r.stream.wait(&f.fork)?;
            }
            // SAFETY: the caller's buffers hold at least `bytes` each (a test hook's contract),
            // live until synchronize; the stream is this set's.
            unsafe { super::super::driver::memcpy_async(dst[i], src[i], bytes, &r.stream)? };
            if let Some(f) = fan {
                r.stream.record(&f.joins[i])?;
                f.origin.wait(&f.joins[i])?;
            }
        }
        Ok(())
    }

    /// Measurement hook: launches the empty kernel `tpar_noop` on every local rank exactly as
    /// a collective is launched (fork/join, grid, arguments), to measure the launch floor.
    pub fn enqueue_floor(&mut self, blocks: u32, inputs: &[u64], outputs: &[u64]) -> Result<()> {
        self.check_poisoned()?;
        let all = vec![true; self.ranks.len()];
        let l = self.launcher.floor(blocks)?;
        self.launch_all(&l, (1, 0), (inputs, outputs, None), &all, None)
    }

    /// The launches (grid, block, cluster, PDL) since the last call of this, oldest first:
    /// at most the last [`RECENT_LAUNCHES`](super::RECENT_LAUNCHES). A call's kernels (a fused call's one, an unfused
    /// call's two); nothing for the copy-engine path.
    pub fn take_launches(&mut self) -> Vec<Launch> {
        std::mem::take(&mut self.recent)
    }

    /// Whether the kernels carry their phase stamps (`TPAR_TEST_STAMPS`: measuring only).
    pub fn stamps_enabled(&self) -> bool {
        self.launcher.settings().test_stamps
    }

    /// Zeroes every local rank's stamps (synchronises first), so that a later read shows
    /// only the blocks of calls made since.
    pub fn clear_stamps(&self) -> Result<()> {
        self.synchronize_streams()?;
        let zeros = vec![0u64; abi::STAMP_BYTES / 8];
        for r in &self.ranks {
            r.state.upload_at(abi::stamps_offset(self.slot_vecs), &zeros)?;
        }
        Ok(())
    }

    /// Local rank `i`'s stamps (synchronises first): per block, the `%globaltimer` ns of
    /// each phase the kernel stamped (0 where it wrote none; common.cuh `TPAR_STAMP`).
    pub fn stamps(&self, i: usize) -> Result<Vec<[u64; abi::STAMPS_PER_BLOCK]>> {
        self.synchronize_streams()?;
        let r = self.ranks.get(i).ok_or_else(|| Error::invalid("rank", "out of range"))?;
        let mut words = vec![0u64; abi::STAMP_BYTES / 8];
        r.state.download_at(abi::stamps_offset(self.slot_vecs), &mut words)?;
        Ok(words.chunks_exact(abi::STAMPS_PER_BLOCK).map(|c| std::array::from_fn(|k| c[k])).collect())
    }

    /// Local rank `i`'s device epoch (synchronises first).
    pub fn epoch(&self, i: usize) -> Result<u32> {
        self.synchronize_streams()?;
        let mut st = [TparState::default()];
        self.ranks.get(i).ok_or_else(|| Error::invalid("rank", "out of range"))?.state.download(&mut st)?;
        Ok(st[0].epoch[0])
    }
}
