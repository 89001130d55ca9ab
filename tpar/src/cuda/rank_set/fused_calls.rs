//! [`RankSet`]'s fused all-reduce + residual add + RMSNorm and its family (docs/cuda.md
//! "Fused"; the call's [`FusedPattern`](super::super::fused::FusedPattern)): the fused
//! kernel on every local rank, or the unfused path (the plain all-reduce, copy path, then
//! tpar's add-RMSNorm kernel), and tpar's add-RMSNorm kernel alone.

use super::super::abi::{self, TparNorm};
use super::super::fused::{fused_flags, fused_unfit, rows_owned, FusedBufs, FusedCall, FusedPath};
use super::super::launch::{CallSpec, Launch};
use super::RankSet;
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
use crate::dtype::DType;

impl RankSet {
    /// Whether `algo`'s fused kernel takes `call` on this set (`fused::fused_unfit`: `None`),
    /// else why not. The same answer on every rank of the same call.
    pub fn fused_unfit(&self, algo: Algorithm, call: &FusedCall) -> Option<String> {
        fused_unfit(algo, call, self.world, self.slot_vecs)
    }

    /// Whether `algo`'s fused kernel runs `call` with owned rows on this set
    /// (`fused::rows_owned`, under `TPAR_FUSED_ROWS`). The same answer on every rank whose
    /// setting agrees (the descriptor carries it).
    pub fn fused_rows_owned(&self, algo: Algorithm, call: &FusedCall) -> bool {
        rows_owned(algo, call, self.world, self.slot_vecs, self.launcher.settings().fused_rows)
    }

    /// The kernel flags of `algo`'s fused kernel for `call` (`fused::fused_flags`).
    fn fused_kernel_flags(&self, algo: Algorithm, call: &FusedCall) -> u32 {
        fused_flags(algo, call, self.world, self.slot_vecs, self.launcher.settings().fused_rows)
    }

    /// The descriptor code `algo`'s fused kernel announces for `call`: its pattern and its
    /// layout (`abi::fused_desc_code` of [`fused_kernel_flags`](Self::fused_kernel_flags)).
    pub fn fused_desc_code(&self, algo: Algorithm, call: &FusedCall) -> u32 {
        abi::fused_desc_code(algo, call.dtype, self.fused_kernel_flags(algo, call))
    }

    /// Every local rank's fused kernel arguments for `call` by `algo`.
    fn fused_norm_args(&self, algo: Algorithm, call: &FusedCall, bufs: &[FusedBufs]) -> Vec<TparNorm> {
        let flags = self.fused_kernel_flags(algo, call);
        bufs.iter().map(|b| TparNorm { flags, ..call.norm_args(b) }).collect()
    }

    /// Enqueues a fused call on every local rank (`bufs[i]`: local rank i's buffers):
    /// `algo`'s fused kernel where it takes the call ([`fused_unfit`](Self::fused_unfit))
    /// and `unfused` is false; else the unfused path, `algo`'s all-reduce into every rank's
    /// `norm_out` (`FusedBufs::unfused_sum`: FP8 output elsewhere), then tpar's add-RMSNorm
    /// kernel in place. The same bits either way.
    /// Returns the path taken.
    pub fn enqueue_add_rmsnorm(&mut self, algo: Algorithm, call: &FusedCall, bufs: &[FusedBufs], blocks: u32, unfused: bool) -> Result<FusedPath> {
        self.check_fused_args(call, bufs)?;
        let inputs: Vec<u64> = bufs.iter().map(|b| b.input).collect();
        let outputs: Vec<u64> = bufs.iter().map(|b| b.norm_out).collect();
        let all = vec![true; self.ranks.len()];
        if unfused || self.fused_unfit(algo, call).is_some() {
            let sums: Vec<u64> = bufs.iter().map(|b| b.unfused_sum(call)).collect();
            self.enqueue_plain(algo, call.dtype, call.count(), (&inputs, &sums), blocks, &all, false)?;
            let normed: Vec<FusedBufs> = bufs.iter().zip(&sums).map(|(b, &s)| FusedBufs { input: s, ..*b }).collect();
            self.enqueue_norm_only(call, &normed)?;
            return Ok(FusedPath::Unfused(algo));
        }
        let ptrs: Vec<u64> = bufs.iter().flat_map(|b| [b.input, if call.pattern.residual { b.residual } else { b.input }, b.weight, b.norm_out, b.residual_out]).collect();
        let rows = self.fused_rows_owned(algo, call);
        let l = self.launcher.prepare_fused(&self.dev, CallSpec { algo, dtype: call.dtype, count: call.count(), blocks, registered: false, collective: crate::kinds::Collective::AllReduce }, call.row_bytes(), rows, &ptrs)?;
        let code = if self.check_calls { self.fused_desc_code(algo, call) } else { 0 };
        let norm = self.fused_norm_args(algo, call, bufs);
        self.launch_all(&l, (call.count(), code), (&inputs, &outputs, None), &all, Some(&norm))?;
        Ok(FusedPath::Fused(algo))
    }

    /// tpar's add-RMSNorm kernel alone on every local rank, no communication: `residual_out
    /// = input + residual`, `norm_out = rmsnorm(residual_out) * weight` (in place when
    /// `norm_out == input`), as the engines' fused_add_rms_norm after an all-reduce; the
    /// call's pattern as the fused kernels (no residual: `residual_out = input`; Gemma; FP8).
    pub fn enqueue_norm_only(&mut self, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_fused_args(call, bufs)?;
        let l = self.resolve_add_rmsnorm(call)?;
        self.launch_add_rmsnorm(&l, call, bufs)
    }

    /// Resolves the fused variant of `algo` for `call`, once per shape (a call the fused
    /// kernel cannot take is an error: the caller decides the path, every rank the same,
    /// with [`fused_unfit`](Self::fused_unfit)).
    pub fn resolve_fused(&mut self, algo: Algorithm, call: &FusedCall, blocks: u32) -> Result<Launch> {
        call.validate()?;
        if let Some(why) = self.fused_unfit(algo, call) {
            return Err(Error::Unsupported { what: format!("{algo} fused with {} for {} x {} {}", call.pattern, call.rows, call.hidden, call.dtype), reason: why });
        }
        let rows = self.fused_rows_owned(algo, call);
        self.launcher.resolve_fused(&self.dev, algo, call.dtype, (call.bytes(), call.row_bytes()), blocks, rows)
    }

    /// Launches a resolved fused call of `algo` on every local rank (docs/cuda.md "Fused"):
    /// `desc_code` is [`fused_desc_code`](Self::fused_desc_code) (0: no per-call check); the
    /// buffers are checked here.
    pub fn launch_fused_resolved(&mut self, l: &Launch, algo: Algorithm, desc_code: u32, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_connected()?;
        self.check_fused_args(call, bufs)?;
        let inputs: Vec<u64> = bufs.iter().map(|b| b.input).collect();
        let outputs: Vec<u64> = bufs.iter().map(|b| b.norm_out).collect();
        let norm = self.fused_norm_args(algo, call, bufs);
        let all = vec![true; self.ranks.len()];
        self.launch_all(l, (call.count(), desc_code), (&inputs, &outputs, None), &all, Some(&norm))
    }

    /// Resolves tpar's add-RMSNorm kernel (no communication) for `call`'s shape, once per shape.
    pub fn resolve_add_rmsnorm(&mut self, call: &FusedCall) -> Result<Launch> {
        call.validate()?;
        self.launcher.resolve_add_rmsnorm(&self.dev, call.dtype, call.rows, call.row_vecs())
    }

    /// Launches a resolved add-RMSNorm on every local rank: x = `bufs[i].input` (the
    /// unfused path passes the all-reduce's output, `norm_out`, in place).
    pub fn launch_add_rmsnorm(&mut self, l: &Launch, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_fused_args(call, bufs)?;
        let inputs: Vec<u64> = bufs.iter().map(|b| b.input).collect();
        let outputs: Vec<u64> = bufs.iter().map(|b| b.norm_out).collect();
        let norm: Vec<TparNorm> = bufs.iter().map(|b| call.norm_args(b)).collect();
        let all = vec![true; self.ranks.len()];
        self.launch_all(l, (call.count(), 0), (&inputs, &outputs, None), &all, Some(&norm))
    }

    /// A fused or add-RMSNorm call's arguments: the set usable, the shape valid, one set of
    /// checked buffers per local rank.
    fn check_fused_args(&self, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_poisoned()?;
        call.validate()?;
        if bufs.len() != self.ranks.len() {
            return Err(Error::invalid("bufs", format!("need one set of buffers per local rank ({})", self.ranks.len())));
        }
        bufs.iter().try_for_each(|b| b.check(call))
    }

    /// Compiles and loads what fused calls of `dtypes` by `algos` need now: each algorithm's
    /// fused variant (where it has one) and the add-RMSNorm kernel (so that nothing compiles
    /// inside a capture or a timing).
    pub fn preload_fused(&mut self, algos: &[Algorithm], dtypes: &[DType], rows: usize, row_vecs: usize) -> Result<()> {
        for &d in dtypes {
            self.launcher.resolve_add_rmsnorm(&self.dev, d, rows.max(1), row_vecs)?;
            for &a in algos {
                self.launcher.preload(&self.dev, &[(a, d)])?;
                if super::super::kernels::has_fused_variant(a) {
                    let probe = self.ranks[0].state.ptr; // any aligned address: nothing is launched
                    let spec = CallSpec { algo: a, dtype: d, count: 16 / d.size(), blocks: 0, registered: false, collective: crate::kinds::Collective::AllReduce };
                    self.launcher.prepare_fused(&self.dev, spec, 16, false, &[probe])?;
                    if super::super::kernels::has_fused_rows(a) && self.launcher.settings().fused_rows != Some(false) {
                        self.launcher.prepare_fused(&self.dev, spec, 16, true, &[probe])?;
                    }
                }
            }
        }
        Ok(())
    }
}
