//! The kernel sources, embedded at build time, and the names of their entry points.
//!
//! Owns: which `.cu` file implements which algorithm, the `extern "C"` entry name for each
//! (algorithm, dtype), and the source hash used as the compile-cache key. Must never
//! compile anything (that is `nvrtc`) nor launch anything.

use crate::algorithms::registry;
use crate::dtype::DType;
use crate::kinds::{Algorithm, Collective};

/// The common header, spliced in where a kernel says `#include "common.cuh"` so that NVRTC
/// needs no include path.
pub const COMMON_CUH: &str = include_str!("../../kernels/common.cuh");

/// The header's second half (layout, frame, descriptors, polls), spliced into
/// [`COMMON_CUH`] where it says `#include "frame.cuh"`.
pub const FRAME_CUH: &str = include_str!("../../kernels/frame.cuh");

/// The call descriptors (every rank tells every peer what it calls), spliced into
/// [`FRAME_CUH`] where it says `#include "desc.cuh"`.
pub const DESC_CUH: &str = include_str!("../../kernels/desc.cuh");

/// The flag protocol (host transport), spliced into [`FRAME_CUH`] where it says
/// `#include "flags.cuh"`.
pub const FLAGS_CUH: &str = include_str!("../../kernels/flags.cuh");

/// The all-reduce kernels' epilogues (the plain one, and the fused residual add + RMSNorm
/// with its fixed-order sum of squares), spliced into [`FRAME_CUH`] where it says
/// `#include "norm.cuh"`.
pub const NORM_CUH: &str = include_str!("../../kernels/norm.cuh");

/// Registered caller buffers (the pull kernels' zero-copy path for graph calls) and the ABI
/// probe, spliced into [`FRAME_CUH`] where it says `#include "io.cuh"`.
pub const IO_CUH: &str = include_str!("../../kernels/io.cuh");

/// The whole header every kernel includes: [`COMMON_CUH`] with [`FRAME_CUH`] spliced in, and
/// [`DESC_CUH`], [`FLAGS_CUH`], [`NORM_CUH`] and [`IO_CUH`] into that.
pub fn header() -> String {
    let frame = FRAME_CUH
        .replace("#include \"desc.cuh\"", DESC_CUH)
        .replace("#include \"flags.cuh\"", FLAGS_CUH)
        .replace("#include \"norm.cuh\"", NORM_CUH)
        .replace("#include \"io.cuh\"", IO_CUH);
    COMMON_CUH.replace("#include \"frame.cuh\"", &frame)
}

/// tpar's single-kernel residual add + RMSNorm (no communication): the unfused path's second
/// kernel and `tpar bench --fused`'s comparison. Not an algorithm: it has no registry entry.
pub const ADD_RMSNORM_CU: &str = include_str!("../../kernels/add_rmsnorm.cu");

/// [`ADD_RMSNORM_CU`] as a translation unit (the header spliced in).
pub fn add_rmsnorm_unit() -> String {
    ADD_RMSNORM_CU.replace("#include \"common.cuh\"", &header())
}

/// Entry name of the add-RMSNorm kernel for `dtype`, e.g. `add_rmsnorm_bf16`.
pub fn add_rmsnorm_entry(dtype: DType) -> String {
    format!("add_rmsnorm_{}", dtype_suffix(dtype))
}

/// Whether `algorithm`'s kernel has the zero-copy path for registered graph calls (io.cuh;
/// the registry's [`Variants::registered`](registry::Variants::registered)).
pub fn has_registered_path(algorithm: Algorithm) -> bool {
    variants(algorithm).registered
}

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub algorithm: Algorithm,
    /// File name under `tpar/kernels/`, also the entry-name stem (without `.cu`).
    pub file: &'static str,
    pub text: &'static str,
}

/// Every kernel file, one per algorithm that has a CUDA kernel, from the registry.
pub fn sources() -> impl Iterator<Item = KernelSource> {
    registry::kernels().map(|(algorithm, k)| KernelSource { algorithm, file: k.file, text: k.text })
}

/// Algorithms that have a CUDA kernel, in the registry's order.
pub fn kernel_algorithms() -> Vec<Algorithm> {
    registry::kernels().map(|(a, _)| a).collect()
}

impl KernelSource {
    /// The stem, e.g. `oneshot_push`.
    pub fn stem(&self) -> &'static str {
        self.file.trim_end_matches(".cu")
    }

    /// The full translation unit handed to NVRTC: the header spliced in.
    pub fn translation_unit(&self) -> String {
        self.text.replace("#include \"common.cuh\"", &header())
    }

    /// Entry name of the instantiation for `dtype`, e.g. `oneshot_push_bf16`.
    pub fn entry(&self, dtype: DType) -> String {
        format!("{}_{}", self.stem(), dtype_suffix(dtype))
    }

    /// Entry name of `collective` for `dtype`: the all-reduce's [`entry`](Self::entry), else
    /// e.g. `oneshot_push_all_gather_bf16` (`TPAR_INSTANTIATE_GATHER_SCATTER` in frame.cuh).
    pub fn entry_for(&self, collective: Collective, dtype: DType) -> String {
        match collective {
            Collective::AllReduce => self.entry(dtype),
            Collective::AllGather => format!("{}_all_gather_{}", self.stem(), dtype_suffix(dtype)),
            Collective::ReduceScatter => format!("{}_reduce_scatter_{}", self.stem(), dtype_suffix(dtype)),
        }
    }
}

/// The kernel source of `algorithm`, if it has one.
pub fn source_for(algorithm: Algorithm) -> Option<KernelSource> {
    sources().find(|s| s.algorithm == algorithm)
}

/// The variants the registry declares for `algorithm`'s kernel (none without a kernel).
fn variants(algorithm: Algorithm) -> registry::Variants {
    registry::spec(algorithm).kernel.map(|k| k.variants).unwrap_or_default()
}

/// Whether `algorithm`'s kernel has a flag-protocol variant (the registry's
/// [`Variants::flags`](registry::Variants::flags)).
pub fn has_flag_variant(algorithm: Algorithm) -> bool {
    variants(algorithm).flags
}

/// Whether `algorithm`'s kernel may run in a workspace of the flag protocol: it has a flag
/// variant, or it reads its peers behind barriers (pull: no sentinel, nothing left behind,
/// barrier flags of the same generations).
pub fn runs_with_flags(algorithm: Algorithm) -> bool {
    has_flag_variant(algorithm) || registry::spec(algorithm).reads_remote
}

/// Whether `algorithm`'s kernel has a lean variant for large messages (the registry's
/// [`Variants::lean`](registry::Variants::lean); docs/cuda.md "Variants").
pub fn has_lean_variant(algorithm: Algorithm) -> bool {
    variants(algorithm).lean
}

/// Whether `algorithm`'s kernel has a fused variant (all-reduce + residual add + RMSNorm; the
/// registry's [`Variants::fused`](registry::Variants::fused); docs/cuda.md "Fused").
pub fn has_fused_variant(algorithm: Algorithm) -> bool {
    variants(algorithm).fused
}

/// Whether `algorithm`'s fused kernel exchanges a row's sums inside a thread-block cluster
/// when launched as one (the registry's [`Variants::cluster_rows`](registry::Variants::cluster_rows)).
pub fn has_cluster_rows(algorithm: Algorithm) -> bool {
    variants(algorithm).cluster_rows
}

/// Whether `algorithm`'s fused kernel has a variant whose ranks own whole rows (the
/// registry's [`Variants::fused_rows`](registry::Variants::fused_rows)).
pub fn has_fused_rows(algorithm: Algorithm) -> bool {
    variants(algorithm).fused_rows
}

/// Whether `algorithm`'s kernel has all-gather and reduce-scatter entries (the registry's
/// [`Variants::gather_scatter`](registry::Variants::gather_scatter)).
pub fn has_gather_scatter(algorithm: Algorithm) -> bool {
    variants(algorithm).gather_scatter
}

/// Suffix of entry names per dtype (matches `TPAR_INSTANTIATE` in common.cuh).
pub fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// The header alone as a translation unit: the ABI probe and the empty kernel (no algorithm).
pub fn probe_unit() -> String {
    header()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry declares each kernel's variants; the source states them in the markers
    /// its headers read. The two must agree (a declared variant the source lacks would compile
    /// the default code under the variant's name; one the registry misses is never run).
    #[test]
    fn the_registry_declares_exactly_the_variants_the_sources_mark() {
        for s in sources() {
            let marked = registry::Variants {
                flags: s.text.contains("#if TPAR_FLAGS"),
                lean: s.text.contains("#define TPAR_LEAN_READY 1"),
                fused: s.text.contains("#define TPAR_FUSED_READY 1"),
                cluster_rows: s.text.contains("#define TPAR_CLUSTER_ROWS_READY 1"),
                fused_rows: s.text.contains("#define TPAR_FUSED_ROWS_READY 1"),
                registered: s.text.contains("io_all_reduce<"),
                gather_scatter: s.text.contains("#define TPAR_GATHER_SCATTER_READY 1"),
            };
            assert_eq!(variants(s.algorithm), marked, "{}: registry vs source markers", s.algorithm);
        }
        assert!(sources().any(|s| variants(s.algorithm).lean) && sources().any(|s| !variants(s.algorithm).lean), "the check sees both answers");
    }

    #[test]
    fn every_kernel_algorithm_has_one_source_and_three_entries() {
        for a in kernel_algorithms() {
            let s = source_for(a).unwrap();
            let tu = s.translation_unit();
            assert!(!tu.contains("#include"), "{} still includes something", s.file);
            let plain = format!("TPAR_INSTANTIATE({})", s.stem());
            let fusable = format!("TPAR_INSTANTIATE_FUSABLE({})", s.stem());
            assert!(tu.contains(if has_fused_variant(a) { &fusable } else { &plain }), "{}", s.file);
            for d in DType::ALL {
                assert!(s.entry(d).starts_with(s.stem()));
            }
        }
    }

    #[test]
    fn gather_scatter_entries_are_instantiated_where_declared() {
        for a in kernel_algorithms() {
            let s = source_for(a).unwrap();
            let inst = format!("TPAR_INSTANTIATE_GATHER_SCATTER({})", s.stem());
            assert_eq!(s.text.contains(&inst), has_gather_scatter(a), "{}", s.file);
            assert_eq!(s.entry_for(Collective::AllReduce, DType::BF16), s.entry(DType::BF16));
        }
        let push = source_for(Algorithm::OneshotPush).unwrap();
        assert_eq!(push.entry_for(Collective::ReduceScatter, DType::F16), "oneshot_push_reduce_scatter_f16");
        assert!(header().contains("#define TPAR_INSTANTIATE_GATHER_SCATTER(NAME)"));
    }

    #[test]
    fn every_kernel_runs_with_flags_and_every_push_kernel_has_a_variant() {
        for a in kernel_algorithms() {
            assert!(runs_with_flags(a), "{a}: no flag variant and not a pull kernel");
            assert_eq!(has_flag_variant(a), !registry::spec(a).reads_remote, "{a}");
        }
    }

    #[test]
    fn the_large_message_kernels_have_lean_variants() {
        use crate::kinds::Algorithm as A;
        for a in [A::OneshotPull, A::TwoshotPush, A::TwoshotPull] {
            assert!(has_lean_variant(a), "{a}");
        }
        // One-shot push is 4-7x slower than the pull kernels from 256 KiB on one GPU: no
        // lean variant (not measured); staged push and hierarchical are for PCIe and islands.
        for a in [A::OneshotPush, A::StagedPush, A::Hierarchical] {
            assert!(!has_lean_variant(a), "{a}");
        }
    }

    #[test]
    fn the_pull_kernels_have_the_registered_path() {
        use crate::kinds::Algorithm as A;
        for a in kernel_algorithms() {
            assert_eq!(has_registered_path(a), matches!(a, A::OneshotPull | A::TwoshotPull), "{a}");
        }
    }

    #[test]
    fn the_one_and_two_shot_kernels_have_fused_variants() {
        use crate::kinds::Algorithm as A;
        for a in [A::OneshotPush, A::OneshotPull, A::TwoshotPush, A::TwoshotPull] {
            assert!(has_fused_variant(a), "{a}");
        }
        for a in [A::StagedPush, A::Hierarchical] {
            assert!(!has_fused_variant(a), "{a}");
        }
        let u = add_rmsnorm_unit();
        assert!(!u.contains("#include"));
        assert!(u.contains("TPAR_EACH_DTYPE(TPAR_NORM_ENTRY, add_rmsnorm)"));
        assert_eq!(add_rmsnorm_entry(DType::BF16), "add_rmsnorm_bf16");
    }

    #[test]
    fn header_mentions_the_abi_sizes_it_asserts() {
        let h = header();
        assert!(!h.contains("#include"), "the header splices in everything it includes");
        assert!(h.contains("sizeof(TparArgs) == 344"));
        assert!(h.contains("sizeof(TparIo) == 256"));
        assert!(h.contains("sizeof(TparFusedArgs) == 400") && h.contains("sizeof(TparNorm) == 56"));
        assert!(h.contains("#define TPAR_SCRATCH_OFFSET 512u") && h.contains("#define TPAR_TILE_VECS 32u"));
        assert!(h.contains("#define TPAR_MAX_RANKS 16"));
        assert!(h.contains("#define TPAR_MAX_BLOCKS 64"));
        assert!(h.contains("#define TPAR_THREADS 512"));
    }
}
