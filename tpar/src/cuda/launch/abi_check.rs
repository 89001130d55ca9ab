//! [`Launcher::check_abi`]: runs `tpar_abi_offsets` (io.cuh) once per process and device
//! and compares the device compiler's field offsets with abi.rs. Slots: 0-15 TparArgs,
//! TparError and TparState fields; 16-21 TparFusedArgs (its norm part, its size); 22-23
//! TparArgs.io and TparIo.output; 24-26 the norm's scale, flags and scale_out.

use super::super::abi::{self, TparArgs, TparState};
use super::super::driver::{DeviceBuffer, Device, Stream};
use super::Launcher;
use crate::error::{Error, Result};

impl Launcher {
    /// Runs `tpar_abi_offsets` and compares the device compiler's field offsets with abi.rs.
    pub(super) fn check_abi(&mut self, dev: &Device, stream: &Stream) -> Result<()> {
        use std::mem::offset_of;
        const N: usize = 27;
        let out = DeviceBuffer::new(dev, N * 8)?;
        let f = self.probe.function("tpar_abi_offsets")?;
        // SAFETY: tpar_abi_offsets takes one u64 pointer; `out` holds N u64 and outlives the sync below.
        unsafe { super::super::driver::launch_with_struct(f, 1, 1, stream, &out.ptr)? };
        stream.synchronize()?;
        let mut got = [0u64; N];
        out.download(&mut got)?;
        let want = [
            offset_of!(TparArgs, flags),
            offset_of!(TparArgs, state),
            offset_of!(TparArgs, err),
            offset_of!(TparArgs, input),
            offset_of!(TparArgs, count),
            offset_of!(TparArgs, slot_vecs),
            offset_of!(TparArgs, timeout_ns),
            offset_of!(TparArgs, rank),
            offset_of!(abi::TparError, waited_ns),
            offset_of!(TparState, err_claim),
            offset_of!(TparArgs, desc_code),
            offset_of!(abi::TparError, theirs),
            offset_of!(TparState, buf),
            offset_of!(TparState, prev_nvec),
            offset_of!(TparState, prev_kind),
            offset_of!(TparArgs, islands),
            offset_of!(abi::TparFusedArgs, n),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, residual_out),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, weight),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, hidden),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, eps_bits),
            std::mem::size_of::<abi::TparFusedArgs>(),
            offset_of!(TparArgs, io),
            offset_of!(abi::TparIo, output),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, scale),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, flags),
            offset_of!(abi::TparFusedArgs, n) + offset_of!(abi::TparNorm, scale_out),
        ]
        .map(|x| x as u64);
        if got != want {
            return Err(Error::Unsupported { what: "kernel ABI".into(), reason: format!("device field offsets {got:?} differ from abi.rs {want:?}") });
        }
        Ok(())
    }
}
