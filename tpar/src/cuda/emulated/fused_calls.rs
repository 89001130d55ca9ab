//! [`EmulatedGroup`]'s fused all-reduce + residual add + RMSNorm (docs/cuda.md "Fused"):
//! the fused kernel on every rank, or the unfused path (the plain all-reduce, copy path, then
//! tpar's add-RMSNorm kernel).

use super::*;

/// The fused all-reduce + residual add + RMSNorm on emulated ranks (docs/cuda.md "Fused").
impl EmulatedGroup {
    /// Enqueues a fused call on every rank (`bufs[r]`: rank r's buffers): `algo`'s fused
    /// kernel where it takes the call ([`fused_unfit`]) and `unfused` is false; else the
    /// unfused path, `algo`'s all-reduce into every rank's `norm_out`, then tpar's add-RMSNorm
    /// kernel in place. The same bits either way. Returns the path taken.
    pub fn enqueue_add_rmsnorm(&mut self, algo: Algorithm, call: &FusedCall, bufs: &[FusedBufs], blocks: u32, unfused: bool) -> Result<FusedPath> {
        self.check_fused_args(call, bufs)?;
        let inputs: Vec<u64> = bufs.iter().map(|b| b.input).collect();
        let outputs: Vec<u64> = bufs.iter().map(|b| b.norm_out).collect();
        if unfused || fused_unfit(algo, call, self.world, self.slot_vecs).is_some() {
            let all = vec![true; self.world];
            self.enqueue_plain(algo, call.dtype, call.count(), (&inputs, &outputs), blocks, &all, false)?;
            let normed: Vec<FusedBufs> = bufs.iter().map(|b| FusedBufs { input: b.norm_out, ..*b }).collect();
            self.enqueue_norm_only(call, &normed)?;
            return Ok(FusedPath::Unfused(algo));
        }
        let ptrs: Vec<u64> = bufs.iter().flat_map(|b| [b.input, b.residual, b.weight, b.norm_out, b.residual_out]).collect();
        let l = self.launcher.prepare_fused(&self.dev, CallSpec { algo, dtype: call.dtype, count: call.count(), blocks, registered: false }, call.row_bytes(), &ptrs)?;
        let code = if self.check_calls { abi::fused_desc_code(algo, call.dtype) } else { 0 };
        let norm: Vec<TparNorm> = bufs.iter().map(|b| call.norm_args(b)).collect();
        let all = vec![true; self.world];
        self.launch_all(&l, (call.count(), code), (&inputs, &outputs, None), &all, Some(&norm))?;
        Ok(FusedPath::Fused(algo))
    }

    /// tpar's add-RMSNorm kernel alone on every rank, no communication: `residual_out =
    /// input + residual`, `norm_out = rmsnorm(residual_out) * weight` (in place when
    /// `norm_out == input`), as the engines' fused_add_rms_norm after an all-reduce.
    pub fn enqueue_norm_only(&mut self, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_fused_args(call, bufs)?;
        let l = self.launcher.resolve_add_rmsnorm(&self.dev, call.dtype, call.rows, call.row_vecs())?;
        let inputs: Vec<u64> = bufs.iter().map(|b| b.input).collect();
        let outputs: Vec<u64> = bufs.iter().map(|b| b.norm_out).collect();
        let norm: Vec<TparNorm> = bufs.iter().map(|b| call.norm_args(b)).collect();
        let all = vec![true; self.world];
        self.launch_all(&l, (call.count(), 0), (&inputs, &outputs, None), &all, Some(&norm))
    }

    /// A fused or add-RMSNorm call's arguments: the group usable, the shape valid, one set of
    /// checked buffers per rank.
    fn check_fused_args(&self, call: &FusedCall, bufs: &[FusedBufs]) -> Result<()> {
        self.check_usable()?;
        call.validate()?;
        if bufs.len() != self.world {
            return Err(Error::invalid("bufs", format!("need one set of buffers per rank ({})", self.world)));
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
                let plain: Vec<(Algorithm, DType)> = vec![(a, d)];
                self.launcher.preload(&self.dev, &plain)?;
                if super::super::kernels::has_fused_variant(a) {
                    let probe = self.state[0].ptr; // any aligned address: nothing is launched
                    self.launcher.prepare_fused(&self.dev, CallSpec { algo: a, dtype: d, count: 16 / d.size(), blocks: 0, registered: false }, 16, &[probe])?;
                }
            }
        }
        Ok(())
    }
}
