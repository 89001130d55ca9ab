//! The kernel sources, embedded at build time, and the names of their entry points.
//!
//! Owns: which `.cu` file implements which algorithm, the `extern "C"` entry name for each
//! (algorithm, dtype), and the source hash used as the compile-cache key. Must never
//! compile anything (that is `nvrtc`) nor launch anything.

use crate::{Algorithm, DType};

/// The common header, spliced in where a kernel says `#include "common.cuh"` so that NVRTC
/// needs no include path.
pub const COMMON_CUH: &str = include_str!("../../kernels/common.cuh");

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub algorithm: Algorithm,
    /// File name under `tpar/kernels/`, also the entry-name stem (without `.cu`).
    pub file: &'static str,
    pub text: &'static str,
}

/// Every kernel file, one per algorithm that has a CUDA kernel.
pub const SOURCES: [KernelSource; 5] = [
    KernelSource { algorithm: Algorithm::OneshotPush, file: "oneshot_push.cu", text: include_str!("../../kernels/oneshot_push.cu") },
    KernelSource { algorithm: Algorithm::OneshotPull, file: "oneshot_pull.cu", text: include_str!("../../kernels/oneshot_pull.cu") },
    KernelSource { algorithm: Algorithm::TwoshotPush, file: "twoshot_push.cu", text: include_str!("../../kernels/twoshot_push.cu") },
    KernelSource { algorithm: Algorithm::TwoshotPull, file: "twoshot_pull.cu", text: include_str!("../../kernels/twoshot_pull.cu") },
    KernelSource { algorithm: Algorithm::StagedPush, file: "staged_push.cu", text: include_str!("../../kernels/staged_push.cu") },
];

/// Algorithms that have a CUDA kernel, in a stable order.
pub const KERNEL_ALGORITHMS: [Algorithm; 5] = [
    Algorithm::OneshotPush,
    Algorithm::OneshotPull,
    Algorithm::TwoshotPush,
    Algorithm::TwoshotPull,
    Algorithm::StagedPush,
];

impl KernelSource {
    /// The stem, e.g. `oneshot_push`.
    pub fn stem(&self) -> &'static str {
        self.file.trim_end_matches(".cu")
    }

    /// The full translation unit handed to NVRTC: the header spliced in.
    pub fn translation_unit(&self) -> String {
        self.text.replace("#include \"common.cuh\"", COMMON_CUH)
    }

    /// Entry name of the instantiation for `dtype`, e.g. `oneshot_push_bf16`.
    pub fn entry(&self, dtype: DType) -> String {
        format!("{}_{}", self.stem(), dtype_suffix(dtype))
    }
}

/// The kernel source of `algorithm`, if it has one.
pub fn source_for(algorithm: Algorithm) -> Option<&'static KernelSource> {
    SOURCES.iter().find(|s| s.algorithm == algorithm)
}

/// Suffix of entry names per dtype (matches `TPAR_INSTANTIATE` in common.cuh).
pub fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// FNV-1a 64 over a string: stable across builds and platforms (std's hasher is not).
pub fn fnv1a64(text: &str) -> u64 {
    fnv1a64_bytes(text.as_bytes())
}

/// FNV-1a 64 over bytes (cache keys and entry checksums).
pub fn fnv1a64_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The header alone as a translation unit: the ABI probe and the empty kernel (no algorithm).
pub const PROBE_UNIT: &str = COMMON_CUH;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_algorithm_has_one_source_and_three_entries() {
        for a in KERNEL_ALGORITHMS {
            let s = source_for(a).unwrap();
            let tu = s.translation_unit();
            assert!(!tu.contains("#include"), "{} still includes something", s.file);
            assert!(tu.contains(&format!("TPAR_INSTANTIATE({})", s.stem())));
            for d in DType::ALL {
                assert!(s.entry(d).starts_with(s.stem()));
            }
        }
    }

    #[test]
    fn header_mentions_the_abi_sizes_it_asserts() {
        assert!(COMMON_CUH.contains("sizeof(TparArgs) == 328"));
        assert!(COMMON_CUH.contains("#define TPAR_MAX_RANKS 16"));
        assert!(COMMON_CUH.contains("#define TPAR_MAX_BLOCKS 32"));
        assert!(COMMON_CUH.contains("#define TPAR_THREADS 512"));
    }
}
