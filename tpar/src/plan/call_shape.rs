//! The per-call decision the launch applies: for a call of `bytes` of an algorithm, its blocks
//! (the plan's, `TPAR_BLOCKS`, or the rule's where neither sized the call: [`call_blocks`],
//! the one place `TPAR_BLOCKS` is applied), threads per block,
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

/// A kernel call's blocks before the GPU's residency is checked ([`call_blocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallBlocks {
    /// Given (the plan's, a caller's) or `TPAR_BLOCKS`: the call runs on exactly these, or is
    /// refused where every rank's grid cannot be resident at once.
    Held(u32),
    /// The block rule's (`rule`): the launch may shrink it to what stays resident.
    Rule(u32),
}

impl CallBlocks {
    /// The blocks, held or the rule's.
    pub fn blocks(self) -> u32 {
        match self {
            CallBlocks::Held(b) | CallBlocks::Rule(b) => b,
        }
    }
}

/// A kernel call's blocks: the caller's where it gives them (`given` > 0: the plan's, which
/// already carry `TPAR_BLOCKS`), else `TPAR_BLOCKS` (`setting`), else the block rule's
/// (`rule`, asked only then). The one place `TPAR_BLOCKS` is applied: the plan's last step
/// asks it for every kernel call it sizes (with its rule's blocks as `rule`, nothing given;
/// `plan::finish_plan`), and the launch asks it for every call (a forced algorithm, the tune's
/// timings, an emulated group's call: 0 blocks given) and reads only its answer.
pub fn call_blocks(given: u32, setting: Option<u32>, rule: impl FnOnce() -> u32) -> CallBlocks {
    match (given, setting) {
        (0, Some(b)) => CallBlocks::Held(b),
        (0, None) => CallBlocks::Rule(rule()),
        (b, _) => CallBlocks::Held(b),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// TPAR_BLOCKS holds a call nothing sized (a forced algorithm's: 0 given) to its blocks, a
    /// call given blocks (the plan's, which carry TPAR_BLOCKS already) keeps them, and the rule
    /// is asked only where neither decides.
    #[test]
    fn tpar_blocks_holds_a_call_nothing_sized_and_the_rule_decides_only_without_it() {
        let never = || -> u32 { panic!("the rule is not asked when the blocks are held") };
        assert_eq!(call_blocks(0, Some(24), never), CallBlocks::Held(24));
        assert_eq!(call_blocks(6, Some(24), never), CallBlocks::Held(6));
        assert_eq!(call_blocks(6, None, never), CallBlocks::Held(6));
        assert_eq!(call_blocks(0, None, || 21), CallBlocks::Rule(21));
        assert_eq!(call_blocks(0, None, || policy_blocks(Transport::P2p, 43008, 64)).blocks(), 21);
    }
}
