//! The one launch path of tpar's kernels, that of every [`RankSet`](super::RankSet)
//! (emulated ranks and rank processes alike): the block policy, the size class, the
//! resolution of a call shape into a [`Launch`] (variant, grid, threads, PDL; under the
//! [`LaunchSettings`] it was built with), loading each variant when a call first needs it, and
//! the launch itself (programmatic dependent launch where the device has it).
//!
//! A call is resolved once per shape ([`Launcher::resolve`]: algorithm, dtype, bytes, planned
//! blocks); per call only its pointers are checked ([`check_pointers`]) before [`launch`].
//!
//! The call's shape (its blocks, `TPAR_BLOCKS` included, threads, lean, registered) is the
//! plan's decision (`plan::call_shape`); this file reads it and adds only what the GPU and
//! the kernels say: which variants a kernel has, how many blocks stay resident, PDL.
//!
//! Owns: the kernels' caps on the plan's shape ([`policy_blocks`], [`threads_for`]),
//! [`add_rmsnorm_threads`], [`Launcher`] (per process and device: the ABI check, the loaded
//! variants, their co-residency limits).
//! Must never launch a grid whose blocks cannot all be resident at once together with the
//! other ranks on the same GPU (the ranks spin on each other: that would deadlock until the
//! deadline), and never launch a kernel for a call it did not validate.

use super::abi::{self, TparArgs, MAX_BLOCKS, THREADS, VEC_BYTES};
use super::driver::{sys, Device, Module, Stream};
use super::kernels::{self, probe_unit};
use super::nvrtc;
use crate::error::{Error, Result};
use crate::plan::{call_shape, HostProtocol};
use crate::settings::LaunchSettings;
use crate::dtype::DType;
use crate::kinds::{Algorithm, Collective, Transport};
use std::collections::HashMap;

// The ABI check: the device compiler's field offsets against abi.rs.
mod abi_check;

/// Most blocks per rank over the host transport (pinned host memory across PCIe): the
/// plan's ([`call_shape::HOST_MAX_BLOCKS`]).
pub const HOST_MAX_BLOCKS: u32 = call_shape::HOST_MAX_BLOCKS;
/// Most blocks per rank over p2p: the kernels' cap (one flag row per block).
pub const P2P_MAX_BLOCKS: u32 = MAX_BLOCKS as u32;

/// The block policy for calls the plan did not size (a forced algorithm, an emulated group's
/// call with 0 blocks): the plan's ([`call_shape::policy_blocks`]), capped by the kernels'
/// flag rows. `TPAR_BLOCKS` overrides it, as it overrides the plan's: [`call_shape::call_blocks`]
/// decides, [`Launcher::resolve`] reads the answer.
pub fn policy_blocks(_algo: Algorithm, transport: Transport, bytes: usize, _world: usize) -> u32 {
    call_shape::policy_blocks(transport, bytes, P2P_MAX_BLOCKS)
}

/// The push kernels' protocol for a workspace of `world` ranks over `transport`: over p2p
/// always the sentinel one; over the host transport (pinned host memory across PCIe)
/// `forced` (`TPAR_HOST_PROTOCOL`), else [`HostProtocol::auto`]. Every kernel of a workspace
/// is compiled for one protocol (a sentinel call cannot follow a flag call: the flag calls
/// leave their data in the inboxes).
pub fn push_protocol(transport: Transport, world: usize, forced: Option<HostProtocol>) -> HostProtocol {
    if transport != Transport::Host {
        return HostProtocol::Sentinel;
    }
    forced.unwrap_or_else(|| HostProtocol::auto(world))
}

/// The compile defines of a protocol: `-DTPAR_PROTO_FLAGS` for the flag protocol (docs/cuda.md).
pub fn protocol_defines(p: HostProtocol) -> Vec<String> {
    match p {
        HostProtocol::Flags => vec!["-DTPAR_PROTO_FLAGS".into()],
        HostProtocol::Sentinel => Vec::new(),
    }
}

/// Which compiled variant of a kernel a call runs: the default one, or the lean one for
/// large messages (`-DTPAR_LEAN`, docs/cuda.md "Variants"): the same arithmetic in the same
/// order, at most 64 registers a thread so that two 512-thread blocks share an SM; or the
/// fused one (`-DTPAR_FUSED`: the default all-reduce with the residual add + RMSNorm
/// epilogue, docs/cuda.md "Fused"), which fused calls ask for by name ([`size_class`]
/// never picks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeClass {
    Default,
    Lean,
    Fused,
    /// The fused variant launched as thread-block clusters of a row's blocks
    /// ([`row_cluster`]; kernels/norm.cuh).
    FusedCluster,
    /// The fused variant whose ranks own whole rows (`-DTPAR_FUSED_ROWS`: two-shot pull,
    /// where `fused::rows_owned` says; kernels/twoshot_pull.cu).
    FusedRows,
}

/// The one place a call's variant is chosen. The lean variant runs where the kernel has one,
/// the plan says so ([`call_shape::lean`]: from a size of its algorithm on, where the default
/// variant cannot keep the call's grid resident twice over on this GPU, `default_holds`
/// false: every rank sharing the GPU, two grids each, as programmatic dependent launch
/// needs), and the call is under 2^31 vectors (the lean kernels index in 32 bits). With one rank per GPU the default always holds, so only ranks that share a GPU
/// (emulated ranks) run the lean variant. `forced` (`TPAR_LEAN`) overrides the rule, never
/// for a kernel without the variant.
pub fn size_class(algo: Algorithm, bytes: usize, forced: Option<bool>, default_holds: bool) -> SizeClass {
    if !kernels::has_lean_variant(algo) || bytes as u64 / VEC_BYTES as u64 >= 1u64 << 31 {
        return SizeClass::Default;
    }
    let lean = forced.unwrap_or_else(|| call_shape::lean(algo, bytes, default_holds));
    if lean {
        SizeClass::Lean
    } else {
        SizeClass::Default
    }
}

/// Whether a call of `bytes` of `algo` captured in a graph runs registered (zero copy: the
/// pull kernels read every rank's input in place, io.cuh): its kernel has the path and the
/// plan says so ([`call_shape::registered`]), or `forced` (`TPAR_ZERO_COPY`) does. Only where the caller registers
/// buffers (an emulated group's capture; a rank's checked capture).
pub fn registers(algo: Algorithm, bytes: usize, forced: Option<bool>) -> bool {
    kernels::has_registered_path(algo) && forced.unwrap_or_else(|| call_shape::registered(algo, bytes))
}

/// Whether a grid of `grid` blocks per rank, for each of `ranks` ranks sharing the GPU, fits
/// twice over in `resident` blocks (the current and the next call, as PDL overlaps them).
pub fn holds_twice(grid: u32, ranks: u32, resident: u32) -> bool {
    2 * grid * ranks <= resident
}

/// Most blocks in a thread-block cluster tpar launches (the portable limit).
pub const MAX_CLUSTER: u32 = 8;

/// The blocks of one row, where a fused call's grid holds whole rows: `grid` blocks of
/// `threads` threads, one 16-byte vector a thread, cover the `bytes` of the call exactly and
/// a row's `row_bytes` are a whole number of 2 to [`MAX_CLUSTER`] blocks (so block b holds
/// vectors [b threads, (b + 1) threads), all of row b / c). Those blocks are launched as one
/// thread-block cluster and exchange the row's sums in distributed shared memory
/// (kernels/norm.cuh). 1 otherwise (the sums meet in global memory).
pub fn row_cluster(grid: u32, threads: u32, bytes: usize, row_bytes: usize) -> u32 {
    let block = threads as usize * VEC_BYTES;
    if block == 0 || row_bytes == 0 || grid as usize * block != bytes || row_bytes % block != 0 {
        return 1;
    }
    match u32::try_from(row_bytes / block) {
        Ok(c) if (2..=MAX_CLUSTER).contains(&c) => c,
        _ => 1,
    }
}

/// The compile defines of a size class: `-DTPAR_LEAN` for the lean variant, `-DTPAR_FUSED`
/// for the fused one.
pub fn size_class_defines(c: SizeClass) -> Vec<String> {
    match c {
        SizeClass::Lean => vec!["-DTPAR_LEAN".into()],
        SizeClass::Fused => vec!["-DTPAR_FUSED".into()],
        SizeClass::FusedCluster => vec!["-DTPAR_FUSED".into(), "-DTPAR_FUSED_CLUSTER".into()],
        SizeClass::FusedRows => vec!["-DTPAR_FUSED".into(), "-DTPAR_FUSED_ROWS".into()],
        SizeClass::Default => Vec::new(),
    }
}

/// Threads per block for a call of `bytes` on `blocks` blocks: the plan's rule
/// ([`call_shape::threads`], one vector per thread, 128..=512).
pub fn threads_for(bytes: usize, blocks: u32) -> u32 {
    call_shape::threads(bytes, blocks, THREADS)
}

/// The launch shape of tpar's add-RMSNorm kernel for rows of `row_vecs` vectors: threads per
/// block (one row a block; the row's vectors spread evenly over at most 512 threads, whole
/// warps).
pub fn add_rmsnorm_threads(row_vecs: usize) -> u32 {
    let per = row_vecs.div_ceil(THREADS as usize).max(1);
    (row_vecs.div_ceil(per).div_ceil(32) * 32).clamp(32, THREADS as usize) as u32
}

/// One loaded variant.
struct Variant {
    module: Module,
    /// The all-reduce's entry.
    f: sys::CUfunction,
    /// The all-gather's and reduce-scatter's entries, where the kernel has them (looked up
    /// on first use).
    others: HashMap<Collective, sys::CUfunction>,
    /// Blocks of an entry one SM holds at once, by collective and threads per block (filled
    /// on use).
    per_sm: HashMap<(Collective, u32), u32>,
    /// Clusters of it the GPU holds at once, by (threads per block, blocks per cluster).
    per_gpu_clusters: HashMap<(u32, u32), u32>,
}

/// A validated call, ready to launch on every rank.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    pub f: sys::CUfunction,
    pub grid: u32,
    /// Threads per block (`launch::threads_for`).
    pub threads: u32,
    pub pdl: bool,
    /// Blocks per thread-block cluster (1: none). Fused calls only, where the blocks hold
    /// whole rows ([`row_cluster`]): the row's sums meet in distributed shared memory.
    pub cluster: u32,
}

// SAFETY: a `CUfunction` is an opaque handle the driver lets any thread use while its
// context is current (every launch path binds it first); `Launch` is otherwise plain data and
// is never written through.
unsafe impl Send for Launch {}
// SAFETY: as above: shared references only read the handle's value.
unsafe impl Sync for Launch {}

impl Launch {
    /// `grid x threads`, then `cluster C` and `pdl` where they apply: what a call ran.
    pub fn describe(&self) -> String {
        let mut s = format!("{}x{}", self.grid, self.threads);
        if self.cluster > 1 {
            s.push_str(&format!(" cluster {}", self.cluster));
        }
        if self.pdl {
            s.push_str(" pdl");
        }
        s
    }

    /// The launch of a call that moves nothing (zero elements): never launched (callers
    /// return before launching an empty call); it keeps a resolved empty call in the memo.
    pub fn none() -> Self {
        Self { f: std::ptr::null_mut(), grid: 0, threads: 0, pdl: false, cluster: 1 }
    }
}

/// What a call asks for, before validation.
#[derive(Clone, Copy, Debug)]
pub struct CallSpec {
    pub algo: Algorithm,
    pub dtype: DType,
    pub count: usize,
    /// 0: `TPAR_BLOCKS`, else the policy ([`call_shape::call_blocks`]).
    pub blocks: u32,
    /// The call's buffers are registered (it runs its kernel's zero-copy path, which only
    /// the default variant has: [`registers`]).
    pub registered: bool,
    /// What the call computes; `count` is per rank as [`Collective::io_elems`] counts it.
    pub collective: Collective,
}

/// Per call, the one check left once its shape is resolved: every input and output pointer
/// non-null and 16-byte aligned.
pub fn check_pointers(ptrs: &[u64]) -> Result<()> {
    match ptrs.iter().find(|p| **p % VEC_BYTES as u64 != 0 || **p == 0) {
        Some(p) => Err(Error::invalid("buffer", format!("pointer {p:#x} is null or not 16-byte aligned"))),
        None => Ok(()),
    }
}

/// Per device and process: the loaded variants and what one launch may use.
pub struct Launcher {
    arch: String,
    driver: i32,
    probe: Module,
    variants: HashMap<(Algorithm, DType, SizeClass), Variant>,
    /// tpar's add-RMSNorm kernel per dtype (the unfused path), loaded on first use.
    norm: HashMap<DType, Variant>,
    settings: LaunchSettings,
    /// `TPAR_BLOCKS` as the plan reads it (`Overrides::blocks`, passed in by the rank set:
    /// `SetOptions::blocks`), for calls given no blocks.
    blocks: Option<u32>,
    sms: u32,
    /// Ranks of this process whose kernels share the GPU and spin on each other (emulated
    /// ranks: the world; one rank per process: 1).
    ranks_on_device: u32,
    transport: Transport,
    /// The push kernels' protocol ([`push_protocol`]), fixed for the launcher's life.
    protocol: HostProtocol,
    max_bytes: usize,
    /// Ranks of the group (one-shot pull's reduce-scatter exposes a piece for each).
    world: usize,
    can_pdl: bool,
    /// sm_90 and later: thread-block clusters (fused calls' rows, [`row_cluster`]).
    can_cluster: bool,
}

impl Launcher {
    /// Loads the ABI probe (the header alone, compiled for this device) and checks the
    /// device's struct offsets against abi.rs on `stream`. `host_protocol`: the push kernels'
    /// protocol over the host transport when the caller forces one (its
    /// `Overrides::host_protocol`), `None` for [`HostProtocol::auto`]; `settings`: the launch
    /// settings the caller parsed (`crate::settings`); `blocks`: `TPAR_BLOCKS`, the plan's
    /// `Overrides::blocks` (the one stored value), held by every call given no blocks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(dev: &Device, stream: &Stream, world: usize, ranks_on_device: usize, transport: Transport, host_protocol: Option<HostProtocol>, max_bytes: usize, settings: LaunchSettings, blocks: Option<u32>) -> Result<Self> {
        let arch = dev.arch();
        let driver = super::driver::driver_version();
        let probe = load_unit(dev, "common", &probe_unit(), &nvrtc::options(&arch, None), &arch, driver)?;
        let sms = dev.sm_count()?;
        let mut l = Self {
            can_pdl: dev.major >= 9,
            can_cluster: dev.major >= 9,
            arch,
            driver,
            probe,
            variants: HashMap::new(),
            norm: HashMap::new(),
            settings,
            blocks,
            sms,
            ranks_on_device: ranks_on_device.max(1) as u32,
            transport,
            protocol: push_protocol(transport, world, host_protocol),
            max_bytes,
            world,
        };
        l.check_abi(dev, stream)?;
        Ok(l)
    }

    /// The push kernels' protocol of this workspace.
    pub fn protocol(&self) -> HostProtocol {
        self.protocol
    }

    pub fn settings(&self) -> LaunchSettings {
        self.settings
    }

    /// Turns programmatic dependent launch on or off (tests and comparisons; `TPAR_PDL`).
    pub fn set_pdl(&mut self, on: bool) {
        self.settings.pdl = on;
    }

    /// Whether launches use programmatic dependent launch (setting and device).
    pub fn pdl(&self) -> bool {
        self.settings.pdl && self.can_pdl
    }

    /// The kernel of (algo, dtype, class), compiled (or read from the cache) and loaded on
    /// first use.
    fn variant(&mut self, dev: &Device, algo: Algorithm, dtype: DType, class: SizeClass) -> Result<&Variant> {
        if !self.variants.contains_key(&(algo, dtype, class)) {
            let src = kernels::source_for(algo).ok_or_else(|| Error::Unsupported {
                what: format!("algorithm {algo} on the CUDA backend"),
                reason: "it has no kernel (use nccl through tpar::cuda::nccl)".into(),
            })?;
            let lean = match class {
                SizeClass::Lean => "-lean",
                SizeClass::Fused => "-fused",
                SizeClass::FusedCluster => "-fused-cluster",
                SizeClass::FusedRows => "-fused-rows",
                SizeClass::Default => "",
            };
            let label = format!("{}-{}{lean}", src.stem(), kernels::dtype_suffix(dtype));
            if matches!(class, SizeClass::Fused | SizeClass::FusedCluster | SizeClass::FusedRows) && !kernels::has_fused_variant(algo) {
                return Err(Error::Unsupported { what: format!("{algo} fused with add-RMSNorm"), reason: "its kernel has no fused variant (the unfused path runs it)".into() });
            }
            if class == SizeClass::FusedRows && !kernels::has_fused_rows(algo) {
                return Err(Error::Unsupported { what: format!("{algo} fused with add-RMSNorm over owned rows"), reason: "its kernel has no rows variant (two-shot pull's has)".into() });
            }
            if class == SizeClass::FusedCluster && (!kernels::has_cluster_rows(algo) || !self.can_cluster) {
                return Err(Error::Unsupported { what: format!("{algo} fused with add-RMSNorm in clusters"), reason: "its kernel or this GPU (before sm_90) has no cluster variant".into() });
            }
            if self.protocol == HostProtocol::Flags && !kernels::runs_with_flags(algo) {
                return Err(Error::Unsupported {
                    what: format!("{algo} over the host transport with the flag protocol"),
                    reason: "its kernel has no flag variant (TPAR_HOST_PROTOCOL=sentinel runs it)".into(),
                });
            }
            let mut opts = nvrtc::options(&self.arch, Some(dtype));
            opts.extend(protocol_defines(self.protocol));
            opts.extend(size_class_defines(class));
            match self.settings.test_buffers {
                Some(1) => opts.push("-DTPAR_TEST_UNSAFE_ONE_BUFFER".into()),
                Some(2) => opts.push("-DTPAR_TEST_UNSAFE_TWO_BUFFERS".into()),
                _ => {}
            }
            if self.settings.test_no_end_barrier {
                opts.push("-DTPAR_TEST_UNSAFE_NO_END_BARRIER".into());
            }
            if self.settings.test_stamps {
                opts.push("-DTPAR_TEST_STAMPS".into());
            }
            let mut module = load_unit(dev, &label, &src.translation_unit(), &opts, &self.arch, self.driver)?;
            let f = module.function(&src.entry(dtype))?;
            self.variants.insert((algo, dtype, class), Variant { module, f, others: HashMap::new(), per_sm: HashMap::new(), per_gpu_clusters: HashMap::new() });
        }
        self.variants.get(&(algo, dtype, class)).ok_or_else(|| Error::invalid("kernel", "variant not loaded"))
    }

    /// The entry of `collective` in the (algo, dtype, class) kernel (loads the variant).
    fn entry(&mut self, dev: &Device, algo: Algorithm, dtype: DType, class: SizeClass, collective: Collective) -> Result<sys::CUfunction> {
        if collective != Collective::AllReduce && (!kernels::has_gather_scatter(algo) || matches!(class, SizeClass::Fused | SizeClass::FusedCluster | SizeClass::FusedRows)) {
            return Err(Error::Unsupported { what: format!("the {collective} with {algo}"), reason: "its kernel has no such entry (one-shot push and one-shot pull have: the plan runs one of them, or NCCL)".into() });
        }
        self.variant(dev, algo, dtype, class)?;
        let v = self.variants.get_mut(&(algo, dtype, class)).ok_or_else(|| Error::invalid("kernel", "variant not loaded"))?;
        if collective == Collective::AllReduce {
            return Ok(v.f);
        }
        if let Some(f) = v.others.get(&collective) {
            return Ok(*f);
        }
        let src = kernels::source_for(algo).ok_or_else(|| Error::invalid("kernel", format!("{algo} has no source")))?;
        let f = v.module.function(&src.entry_for(collective, dtype))?;
        v.others.insert(collective, f);
        Ok(f)
    }

    /// Blocks of the (algo, dtype, class) kernel's `collective` entry one SM holds at
    /// `threads` threads per block (loads the variant; cached per entry and thread count).
    fn per_sm(&mut self, dev: &Device, (algo, dtype, class): (Algorithm, DType, SizeClass), collective: Collective, threads: u32) -> Result<u32> {
        let f = self.entry(dev, algo, dtype, class, collective)?;
        let v = self.variants.get_mut(&(algo, dtype, class)).ok_or_else(|| Error::invalid("kernel", "variant not loaded"))?;
        if let Some(p) = v.per_sm.get(&(collective, threads)) {
            return Ok(*p);
        }
        // SAFETY: f is a live function of a loaded module (kept in self.variants).
        let p = unsafe { super::driver::occupancy(f, threads) }.map_err(|e| Error::Cuda { context: format!("occupancy of {algo} {collective} {dtype} at {threads} threads"), code: e.to_string() })?.max(1);
        v.per_sm.insert((collective, threads), p);
        Ok(p)
    }

    /// The variant a call of `bytes` of `algo` on `planned` blocks of `threads` runs
    /// ([`size_class`]; the default variant's residency read from the driver). A registered
    /// call runs the default variant (the lean one has no zero-copy path) unless `TPAR_LEAN=1`.
    #[allow(clippy::too_many_arguments)]
    fn class_for(&mut self, dev: &Device, algo: Algorithm, dtype: DType, bytes: usize, planned: u32, threads: u32, registered: bool) -> Result<SizeClass> {
        let forced = self.settings.lean;
        if registered && forced.is_none() {
            return Ok(SizeClass::Default);
        }
        // Cheap cases first: no occupancy query (nor a default variant loaded) when the
        // kernel, the size or TPAR_LEAN already decides.
        let unless_resident = size_class(algo, bytes, forced, false);
        if unless_resident == SizeClass::Default || forced.is_some() {
            return Ok(unless_resident);
        }
        let resident = self.per_sm(dev, (algo, dtype, SizeClass::Default), Collective::AllReduce, threads)? * self.sms;
        Ok(size_class(algo, bytes, None, holds_twice(planned, self.ranks_on_device, resident)))
    }

    /// Loads the variants `calls` will need now, so that nothing compiles later (for example
    /// before a capture, or before timing): the default variant of each and the lean one
    /// where a call of the workspace's largest size would run it ([`size_class`] under the
    /// policy's grid). That is exact: the grid grows with the size, so a workspace none of
    /// whose calls runs the lean variant (one rank per GPU, say) never compiles it.
    pub fn preload(&mut self, dev: &Device, calls: &[(Algorithm, DType)]) -> Result<()> {
        let bytes = self.max_bytes;
        for (a, d) in calls {
            self.variant(dev, *a, *d, SizeClass::Default)?;
            let planned = self.call_blocks(*a, bytes, 0, false).blocks();
            if self.class_for(dev, *a, *d, bytes, planned, threads_for(bytes, planned), false)? == SizeClass::Lean {
                self.variant(dev, *a, *d, SizeClass::Lean)?;
            }
        }
        Ok(())
    }

    /// Validates a call (count, size, blocks, pointers) and chooses its grid and whether it
    /// may use PDL: [`resolve`](Self::resolve) and [`check_pointers`] in one.
    /// `ptrs` are every input and output pointer the call uses.
    pub fn prepare(&mut self, dev: &Device, call: CallSpec, ptrs: &[u64]) -> Result<Launch> {
        let bytes = call.count.checked_mul(call.dtype.size()).ok_or_else(|| Error::invalid("count", "overflows"))?;
        if call.count == 0 {
            return Err(Error::invalid("count", "must be positive"));
        }
        let l = self.resolve_as(dev, call, bytes, None)?;
        check_pointers(ptrs)?;
        Ok(l)
    }

    /// As [`prepare`](Self::prepare), for the fused variant ([`resolve_fused`](Self::resolve_fused)).
    pub fn prepare_fused(&mut self, dev: &Device, call: CallSpec, row_bytes: usize, rows: bool, ptrs: &[u64]) -> Result<Launch> {
        let bytes = call.count.checked_mul(call.dtype.size()).ok_or_else(|| Error::invalid("count", "overflows"))?;
        if call.count == 0 {
            return Err(Error::invalid("count", "must be positive"));
        }
        let l = self.resolve_fused(dev, call.algo, call.dtype, (bytes, row_bytes), call.blocks, rows)?;
        check_pointers(ptrs)?;
        Ok(l)
    }

    /// Resolves a call shape once: validates the size and the blocks against this workspace
    /// and this GPU, chooses the variant ([`size_class`]), the grid, the threads and whether
    /// it may use PDL. `blocks`: the plan's, or 0 for `TPAR_BLOCKS`, else the policy
    /// ([`call_shape::call_blocks`]). The same shape always resolves the same way, so callers
    /// memoise it.
    pub fn resolve(&mut self, dev: &Device, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32) -> Result<Launch> {
        self.resolve_call(dev, algo, dtype, bytes, blocks, false)
    }

    /// [`resolve`](Self::resolve) for a call whose buffers are `registered` or not.
    pub fn resolve_call(&mut self, dev: &Device, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32, registered: bool) -> Result<Launch> {
        self.resolve_as(dev, CallSpec { algo, dtype, count: bytes / dtype.size().max(1), blocks, registered, collective: Collective::AllReduce }, bytes, None)
    }

    /// [`resolve`](Self::resolve) for a call of `collective` of `bytes` per rank (as
    /// [`Collective::io_elems`] counts them): the message each rank sends each peer, which
    /// the workspace's slots hold. The all-gather and the reduce-scatter need whole 16-byte
    /// vectors per rank and a kernel with their entries.
    pub fn resolve_collective(&mut self, dev: &Device, collective: Collective, algo: Algorithm, dtype: DType, bytes: usize, blocks: u32) -> Result<Launch> {
        self.resolve_as(dev, CallSpec { algo, dtype, count: bytes / dtype.size().max(1), blocks, registered: false, collective }, bytes, None)
    }

    /// As [`resolve`](Self::resolve), for the fused variant of `algo` (the caller has checked
    /// the shape: `fused::fused_unfit`) on a call of `bytes` in rows of `row_bytes`: the same
    /// grid as the plain call's, the default size class's code with the fused epilogue;
    /// `rows`: the variant whose ranks own whole rows (`fused::rows_owned` said so). Else,
    /// where a row's blocks can be one thread-block cluster ([`cluster_for`](Self::cluster_for)),
    /// the cluster variant runs instead.
    pub fn resolve_fused(&mut self, dev: &Device, algo: Algorithm, dtype: DType, (bytes, row_bytes): (usize, usize), blocks: u32, rows: bool) -> Result<Launch> {
        let class = if rows { SizeClass::FusedRows } else { SizeClass::Fused };
        let l = self.resolve_as(dev, CallSpec { algo, dtype, count: bytes / dtype.size().max(1), blocks, registered: false, collective: Collective::AllReduce }, bytes, Some(class))?;
        if rows {
            return Ok(l);
        }
        Ok(self.cluster_for(dev, algo, dtype, l, bytes, row_bytes)?.unwrap_or(l))
    }

    /// The cluster variant's launch of the fused call `l`, where it applies: the grid holds
    /// whole rows of `row_bytes` in 2 to 8 blocks each ([`row_cluster`]); the kernel has the
    /// variant and the GPU clusters (sm_90+); `TPAR_FUSED_CLUSTER` allows it; every block of
    /// every rank sharing this GPU has an SM of its own (as for a rank alone on its GPU: where
    /// emulated ranks packed two blocks an SM, clusters measured slower, 8 ranks 7168 x 8
    /// 7.9-8.2 -> 8.4 us); and every rank's clusters are resident at once, with PDL wherever
    /// the plain fused launch has it. The row's sums then meet in distributed shared memory
    /// (kernels/norm.cuh): 8 emulated ranks, 7168 x 1 bf16, 5.36 -> 4.95 us
    /// (bench/results/2026-12-02-h200-fused-cluster/cluster-vs-686f732/).
    fn cluster_for(&mut self, dev: &Device, algo: Algorithm, dtype: DType, l: Launch, bytes: usize, row_bytes: usize) -> Result<Option<Launch>> {
        let c = row_cluster(l.grid, l.threads, bytes, row_bytes);
        if c < 2 || !self.can_cluster || !self.settings.fused_cluster || !kernels::has_cluster_rows(algo) || l.grid * self.ranks_on_device > self.sms {
            return Ok(None);
        }
        self.variant(dev, algo, dtype, SizeClass::FusedCluster)?;
        let v = self.variants.get_mut(&(algo, dtype, SizeClass::FusedCluster)).ok_or_else(|| Error::invalid("kernel", "variant not loaded"))?;
        let clusters = match v.per_gpu_clusters.get(&(l.threads, c)) {
            Some(n) => *n,
            None => {
                // SAFETY: v.f is a live function of a loaded module (kept in self.variants).
                let n = unsafe { super::driver::occupancy_clusters(v.f, l.threads, c) }
                    .map_err(|e| Error::Cuda { context: format!("cluster occupancy of fused {algo} {dtype} at {} threads x {c}", l.threads), code: e.to_string() })?;
                v.per_gpu_clusters.insert((l.threads, c), n);
                n
            }
        };
        let resident = clusters * c;
        let pdl = l.pdl && holds_twice(l.grid, self.ranks_on_device, resident);
        if l.grid * self.ranks_on_device > resident || pdl != l.pdl {
            return Ok(None);
        }
        Ok(Some(Launch { f: v.f, cluster: c, pdl, ..l }))
    }

    /// tpar's add-RMSNorm kernel (no communication) for `rows` rows of `row_vecs` vectors of
    /// `dtype`: one block per row, loaded on first use. Never with PDL: it runs as the
    /// engines' own kernel would, after whatever precedes it.
    pub fn resolve_add_rmsnorm(&mut self, dev: &Device, dtype: DType, rows: usize, row_vecs: usize) -> Result<Launch> {
        if rows == 0 || rows > i32::MAX as usize {
            return Err(Error::invalid("rows", format!("{rows}: must be 1 to 2^31-1")));
        }
        if !self.norm.contains_key(&dtype) {
            let label = format!("add_rmsnorm-{}", kernels::dtype_suffix(dtype));
            let mut module = load_unit(dev, &label, &kernels::add_rmsnorm_unit(), &nvrtc::options(&self.arch, Some(dtype)), &self.arch, self.driver)?;
            let f = module.function(&kernels::add_rmsnorm_entry(dtype))?;
            self.norm.insert(dtype, Variant { module, f, others: HashMap::new(), per_sm: HashMap::new(), per_gpu_clusters: HashMap::new() });
        }
        let f = self.norm.get(&dtype).ok_or_else(|| Error::invalid("kernel", "add-RMSNorm not loaded"))?.f;
        Ok(Launch { f, grid: rows as u32, threads: add_rmsnorm_threads(row_vecs), pdl: false, cluster: 1 })
    }

    /// `fixed`: the variant, else [`class_for`](Self::class_for)'s (a registered call: the
    /// default one, unless `TPAR_LEAN` forces it).
    fn resolve_as(&mut self, dev: &Device, call: CallSpec, bytes: usize, fixed: Option<SizeClass>) -> Result<Launch> {
        let dtype = call.dtype;
        if bytes == 0 || bytes % dtype.size() != 0 {
            return Err(Error::invalid("count", format!("{bytes} B is not a positive number of {dtype} elements")));
        }
        if bytes > self.max_bytes {
            return Err(Error::invalid("count", format!("{bytes} B exceeds the workspace's max_bytes {}", self.max_bytes)));
        }
        if bytes as u64 / VEC_BYTES as u64 >= 1u64 << 32 {
            // The kernels index a message's vectors in 32 bits (chunk arithmetic).
            return Err(Error::invalid("count", format!("{bytes} B: a message must have fewer than 2^32 16-byte vectors")));
        }
        if call.blocks as usize > MAX_BLOCKS {
            return Err(Error::invalid("blocks", format!("{}: must be 1 to {MAX_BLOCKS} (0: the policy)", call.blocks)));
        }
        if call.collective != Collective::AllReduce && bytes % VEC_BYTES != 0 {
            return Err(Error::Unsupported {
                what: format!("an {} of {bytes} B per rank with tpar's kernels", call.collective),
                reason: "each rank's part must be whole 16-byte vectors (the plan sends other sizes to NCCL)".into(),
            });
        }
        if call.algo == Algorithm::OneshotPull {
            crate::algorithms::oneshot_pull::exposed_fits(call.collective, bytes as u64, self.world, self.max_bytes as u64)
                .map_err(|reason| Error::Unsupported { what: format!("an {} of {bytes} B per rank with {}", call.collective, call.algo), reason: format!("{reason} (the plan runs one-shot push or NCCL there)") })?;
        }
        let (ranks, sms, pdl_on) = (self.ranks_on_device, self.sms, self.pdl());
        // Threads follow the call's blocks (held: the plan's, a caller's or TPAR_BLOCKS; or the
        // rule's): one vector per thread. The variant follows the size and the default's
        // residency; residency is then checked for that variant and block shape.
        let blocks = self.call_blocks(call.algo, bytes, call.blocks, matches!(fixed, Some(SizeClass::Fused | SizeClass::FusedRows)));
        let planned = blocks.blocks();
        let threads = threads_for(bytes, planned);
        let class = match fixed {
            Some(c) => c,
            None => self.class_for(dev, call.algo, call.dtype, bytes, planned, threads, call.registered)?,
        };
        let per_sm = self.per_sm(dev, (call.algo, call.dtype, class), call.collective, threads)?;
        let f = self.entry(dev, call.algo, call.dtype, class, call.collective)?;
        let resident = per_sm * sms;
        let fits = (resident / ranks).max(1);
        let grid = match blocks {
            call_shape::CallBlocks::Held(b) if b * ranks > resident => {
                return Err(Error::Unsupported {
                    what: format!("{b} blocks per rank x {ranks} ranks on one GPU"),
                    reason: format!("only {resident} blocks of this kernel ({threads} threads) are resident at once on this GPU ({per_sm} per SM x {sms} SMs); the ranks wait on each other, so all must run at once"),
                });
            }
            call_shape::CallBlocks::Held(b) => b,
            call_shape::CallBlocks::Rule(b) => b.min(fits),
        };
        // With PDL a rank's next grid may become resident while this one runs: both must fit.
        let pdl = pdl_on && holds_twice(grid, ranks, resident);
        Ok(Launch { f, grid, threads, pdl, cluster: 1 })
    }

    /// A call's blocks as the plan's call shape decides them ([`call_shape::call_blocks`]):
    /// `given` (0: none), else `TPAR_BLOCKS` as the plan's overrides carry it (`blocks`, given
    /// at construction), else the policy's grid ([`policy_grid`](Self::policy_grid)).
    fn call_blocks(&self, algo: Algorithm, bytes: usize, given: u32, fused: bool) -> call_shape::CallBlocks {
        call_shape::call_blocks(given, self.blocks, || self.policy_grid(algo, bytes, fused))
    }

    /// The grid of a call the plan did not size: the block policy ([`policy_blocks`]), for
    /// ranks that share this GPU at most what leaves every rank's next grid SMs of its own
    /// ([`call_shape::policy_grid`]; not for `fused` calls).
    fn policy_grid(&self, _algo: Algorithm, bytes: usize, fused: bool) -> u32 {
        call_shape::policy_grid(self.transport, bytes, P2P_MAX_BLOCKS, self.ranks_on_device, self.sms, fused)
    }

    /// The empty kernel, launched like a collective (the launch floor).
    pub fn floor(&mut self, blocks: u32) -> Result<Launch> {
        let f = self.probe.function("tpar_noop")?;
        Ok(Launch { f, grid: blocks.clamp(1, MAX_BLOCKS as u32), threads: THREADS, pdl: self.pdl(), cluster: 1 })
    }
}

/// Launches one rank's kernel: `cuLaunchKernelEx`, with programmatic stream serialization
/// when `l.pdl` (the kernel's `griddepcontrol.wait` then orders it after the previous one).
///
/// # Safety
/// `l.f` must take one `TparArgs` by value, and every pointer in `args` must be valid for
/// the kernel's accesses (the layout of common.cuh) until it completes.
pub unsafe fn launch(l: &Launch, stream: &Stream, args: &TparArgs) -> Result<()> {
    // SAFETY: the caller's contract is launch_ex's.
    unsafe { super::driver::launch_ex(l.f, l.grid, l.threads, l.pdl, 1, stream, args) }
}

/// As [`launch`], for a fused kernel or tpar's add-RMSNorm kernel (one `TparFusedArgs`).
///
/// # Safety
/// `l.f` must take one `TparFusedArgs` by value, and every pointer in `args` must be valid
/// for the kernel's accesses (common.cuh, norm.cuh) until it completes.
pub unsafe fn launch_fused(l: &Launch, stream: &Stream, args: &abi::TparFusedArgs) -> Result<()> {
    // SAFETY: the caller's contract is launch_ex's; `l.cluster` > 1 only where the grid is a
    // multiple of it (row_cluster).
    unsafe { super::driver::launch_ex(l.f, l.grid, l.threads, l.pdl, l.cluster, stream, args) }
}

/// Compiles (or reads from the cache) one translation unit and loads it; an entry the
/// driver refuses is rebuilt once. Module loading is allowed during a stream capture (the
/// first call of a variant may come inside one): the thread's capture mode is relaxed for it.
pub(crate) fn load_unit(dev: &Device, label: &str, text: &str, opts: &[String], arch: &str, driver: i32) -> Result<Module> {
    let _relaxed = super::driver::RelaxedCapture::enter();
    let (cubin, outcome) = nvrtc::cubin_cached(label, text, opts, arch, driver, false)?;
    match Module::load_image(dev, &cubin) {
        Ok(m) => Ok(m),
        Err(e) if outcome == nvrtc::CacheOutcome::Hit => {
            tracing::warn!("tpar: cached kernel {label} refused by the driver ({e}); rebuilding it");
            let (cubin, _) = nvrtc::cubin_cached(label, text, opts, arch, driver, true)?;
            Module::load_image(dev, &cubin)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
