//! The per-call decision the launch applies: for a call of `bytes` of an algorithm, its blocks
//! (the plan's, or the rule's where the plan did not size the call), threads per block,
//! whether it runs the lean variant and whether a captured call runs registered (zero copy).
//! The numbers behind each rule are `floors`'s; the launch (`cuda::launch`) asks here and
//! adds only what the GPU says (which variants a kernel has, how many blocks stay resident).
//!
//! Owns: the call's shape. Must never: read the GPU (its inputs are plain values).

use super::floors::{self, BlockClass};
use crate::kinds::{Algorithm, Transport};

/// Most blocks per rank over the host transport (pinned host memory across PCIe): PCIe
/// fabrics collapse when every SM writes.
pub const HOST_MAX_BLOCKS: u32 = floors::PCIE_MAX_BLOCKS;

/// The block policy for calls the plan did not size (a forced algorithm, an emulated group's
/// call with 0 blocks): the plan's one rule ([`floors::kernel_blocks`]), p2p as one GPU's
/// memory or NVLink, host memory as PCIe, at most `max_blocks`.
pub fn policy_blocks(transport: Transport, bytes: usize, max_blocks: u32) -> u32 {
    let class = if transport == Transport::Host { BlockClass::Pcie } else { BlockClass::NvLink };
    floors::kernel_blocks(bytes as u64, class).clamp(1, max_blocks)
}

/// The grid of a call the plan did not size: [`policy_blocks`], and for `ranks_on_device`
/// ranks sharing a GPU of `sms` SMs at most what leaves every rank's next grid SMs of its own
/// ([`floors::shared_gpu_blocks`]; not for `fused` calls).
pub fn policy_grid(transport: Transport, bytes: usize, max_blocks: u32, ranks_on_device: u32, sms: u32, fused: bool) -> u32 {
    let p = policy_blocks(transport, bytes, max_blocks);
    if fused {
        return p;
    }
    floors::shared_gpu_blocks(p, bytes as u64, ranks_on_device, sms)
}

/// Threads per block for a call of `bytes` on `blocks` blocks (one vector per thread,
/// [`floors::kernel_threads`]), at most `max_threads`.
pub fn threads(bytes: usize, blocks: u32, max_threads: u32) -> u32 {
    floors::kernel_threads(bytes as u64, blocks).min(max_threads)
}

/// Whether a call of `bytes` of `algo` runs the lean variant, where its kernel has one: from
/// [`floors::lean_min_bytes`] on, and only where the default variant cannot keep the call's
/// grid resident twice over (`default_holds` false).
pub fn lean(algo: Algorithm, bytes: usize, default_holds: bool) -> bool {
    bytes as u64 >= floors::lean_min_bytes(algo) && !default_holds
}

/// Whether a graph-captured call of `bytes` of `algo` runs registered (zero copy), where its
/// kernel has the path: from [`floors::registered_min_bytes`] on.
pub fn registered(algo: Algorithm, bytes: usize) -> bool {
    bytes as u64 >= floors::registered_min_bytes(algo)
}
