//! The algorithm registry: one entry per algorithm saying what it is and where it runs.
//!
//! Every "which algorithm runs where" question is answered here and nowhere else: the plan's
//! feasibility check, the CPU and GPU dispatch gates, the kernel compile list, the CLI's
//! algorithm lists and help text, and the table in docs/architecture.md (regenerated from
//! [`markdown_table`] and pinned by a test) all read this table. Adding an algorithm touches
//! its own files (`algorithms/<name>.rs`, `kernels/<name>.cu`) and one entry below.
//!
//! Must never: describe a backend or transport that the dispatch code does not run. The
//! property test `tests/plan_props.rs` plans every preset x world x size x dtype x mode x
//! backend and checks the answer against [`runnable`]; the CPU and GPU dispatch refuse
//! exactly what [`runnable`] refuses.

use super::schedule::ScheduleFn;
use super::{ce_ring, gather_bcast, hierarchical, nccl, oneshot_pull, oneshot_push, staged_push, twoshot_pull, twoshot_push};
use crate::kinds::{Algorithm, Backend, Collective, Transport};

/// What the plan may do with an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// One of tpar's own: the plan picks it where it is fastest.
    Candidate,
    /// Runs and is measured, for comparison only: the plan never picks it by itself.
    Baseline,
    /// NCCL: the fallback for sizes and fabrics where tpar's kernels do not win.
    Fallback,
    /// Runs, is measured by `tpar tune`, and is picked only from a tuned profile that measured
    /// it fastest on this machine (or when forced): the default plan never picks it, so it is
    /// chosen nowhere it has not been measured.
    Measured,
}

/// One CUDA kernel source file (under `tpar/kernels/`), embedded at build time.
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    /// File name, also the entry-name stem without `.cu`.
    pub file: &'static str,
    pub text: &'static str,
    /// What the kernel can do besides its default variant (the source states the same in
    /// its markers, which the headers read; a test compares the two).
    pub variants: Variants,
}

/// A kernel's variants (docs/cuda.md "Variants"): what the launch path may ask of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variants {
    /// A flag-protocol variant for the host transport (`#if TPAR_FLAGS`, compiled with
    /// `-DTPAR_PROTO_FLAGS`).
    pub flags: bool,
    /// A lean variant for large messages (`TPAR_LEAN_READY`; `-DTPAR_LEAN`: peers reduced in
    /// groups, at most 64 registers a thread, two 512-thread blocks per SM).
    pub lean: bool,
    /// A fused all-reduce + residual add + RMSNorm variant (`TPAR_FUSED_READY`; `-DTPAR_FUSED`).
    pub fused: bool,
    /// Its fused variant exchanges a row's sums inside a thread-block cluster
    /// (`TPAR_CLUSTER_ROWS_READY`; kernels/norm.cuh, `launch::row_cluster`).
    pub cluster_rows: bool,
    /// Its fused variant has a form whose ranks own whole rows (`TPAR_FUSED_ROWS_READY`;
    /// `-DTPAR_FUSED_ROWS`, kernels/norm.cuh, `fused::rows_owned`).
    pub fused_rows: bool,
    /// A registered (zero-copy) path for captured calls: peers read the registered inputs
    /// (`io_all_reduce<`).
    pub registered: bool,
    /// All-gather and reduce-scatter entries beside the all-reduce (`TPAR_GATHER_SCATTER_READY`;
    /// entries `<stem>_all_gather_<dtype>`, `<stem>_reduce_scatter_<dtype>`), in the default
    /// variant and, where the kernel has one, the flag variant.
    pub gather_scatter: bool,
}

/// One algorithm: what it is and where it runs.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub algorithm: Algorithm,
    /// One line for `--help`, error messages and the docs' table.
    pub summary: &'static str,
    pub role: Role,
    /// The CPU shared-memory backend runs it (`algorithms/<name>.rs`, `run`).
    pub cpu: bool,
    /// Its CUDA kernel, if it has one.
    pub kernel: Option<KernelFile>,
    /// Transports it runs over with one process per GPU (`GpuCommunicator`), as users run it.
    pub gpu_transports: &'static [Transport],
    /// Transports it runs over in an emulated group (all ranks as streams of one GPU).
    pub emulated_transports: &'static [Transport],
    /// Reads peer memory (needs P2P reads between every pair).
    pub reads_remote: bool,
    /// Needs the ranks to form two or more islands (sockets, switches).
    pub needs_islands: bool,
    /// Its communication schedule, replayed by the simulator.
    pub schedule: ScheduleFn,
    /// The collectives it computes (on every backend and transport it runs on); the
    /// all-reduce for all but a few.
    pub collectives: &'static [Collective],
}

macro_rules! kernel {
    ($file:literal, $($v:ident)*) => {
        Some(KernelFile { file: $file, text: include_str!(concat!("../../kernels/", $file)), variants: Variants { $($v: true,)* ..NO_VARIANTS } })
    };
}

const NO_VARIANTS: Variants = Variants { flags: false, lean: false, fused: false, cluster_rows: false, fused_rows: false, registered: false, gather_scatter: false };

const ALL_REDUCE: &[Collective] = &[Collective::AllReduce];
const EVERY_COLLECTIVE: &[Collective] = &[Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];

const P2P: &[Transport] = &[Transport::P2p];
const P2P_HOST: &[Transport] = &[Transport::P2p, Transport::Host];
const NONE: &[Transport] = &[];

/// Every algorithm, in [`Algorithm::ALL`]'s order.
pub static REGISTRY: [Spec; 9] = [
    Spec {
        algorithm: Algorithm::OneshotPush,
        summary: "write my input into every peer's inbox, poll my own, reduce: one hop (sentinel in the data; over host with flags, written once into my own area and read there); all-gather and reduce-scatter the same way (every rank's input, or its piece for each owner, pushed once)",
        role: Role::Candidate,
        cpu: true,
        kernel: kernel!("oneshot_push.cu", flags fused cluster_rows gather_scatter),
        gpu_transports: P2P_HOST,
        emulated_transports: P2P_HOST,
        reads_remote: false,
        needs_islands: false,
        collectives: EVERY_COLLECTIVE,
        schedule: oneshot_push::schedule,
    },
    Spec {
        algorithm: Algorithm::OneshotPull,
        summary: "barrier, read every peer's exposed input, reduce, barrier (reads: for fabrics whose peer writes are slow); all-gather and reduce-scatter the same way (every rank's input exposed once, read by every peer straight into its output: large parts over NVLink)",
        role: Role::Candidate,
        cpu: true,
        kernel: kernel!("oneshot_pull.cu", lean fused cluster_rows registered gather_scatter),
        gpu_transports: P2P,
        emulated_transports: P2P,
        reads_remote: true,
        needs_islands: false,
        collectives: EVERY_COLLECTIVE,
        schedule: oneshot_pull::schedule,
    },
    Spec {
        algorithm: Algorithm::TwoshotPush,
        summary: "reduce-scatter by writes, then all-gather by writes: 2(n-1)/n of the bytes per rank",
        role: Role::Candidate,
        cpu: true,
        kernel: kernel!("twoshot_push.cu", flags lean fused),
        gpu_transports: P2P_HOST,
        emulated_transports: P2P_HOST,
        reads_remote: false,
        needs_islands: false,
        collectives: ALL_REDUCE,
        schedule: twoshot_push::schedule,
    },
    Spec {
        algorithm: Algorithm::TwoshotPull,
        summary: "reduce-scatter by reads, then all-gather by reads (barrier protocol)",
        role: Role::Candidate,
        cpu: true,
        kernel: kernel!("twoshot_pull.cu", lean fused fused_rows registered),
        gpu_transports: P2P,
        emulated_transports: P2P,
        reads_remote: true,
        needs_islands: false,
        collectives: ALL_REDUCE,
        schedule: twoshot_pull::schedule,
    },
    Spec {
        algorithm: Algorithm::StagedPush,
        summary: "one-shot push in n-1 steps, one outbound and one inbound flow per rank per step (PCIe)",
        role: Role::Candidate,
        cpu: false,
        kernel: kernel!("staged_push.cu", flags),
        gpu_transports: P2P,
        emulated_transports: P2P,
        reads_remote: false,
        needs_islands: false,
        collectives: ALL_REDUCE,
        schedule: staged_push::schedule,
    },
    Spec {
        algorithm: Algorithm::Hierarchical,
        summary: "one-shot push inside each island, each island's sum sent once to every rank of the other islands, island sums added in island order (two sockets, switches)",
        role: Role::Candidate,
        cpu: false,
        kernel: kernel!("hierarchical.cu", flags),
        gpu_transports: P2P,
        emulated_transports: P2P_HOST,
        reads_remote: false,
        needs_islands: true,
        collectives: ALL_REDUCE,
        schedule: hierarchical::schedule,
    },
    Spec {
        algorithm: Algorithm::GatherBcast,
        summary: "baseline: rank 0 gathers, reduces and broadcasts; measured for comparison, never picked",
        role: Role::Baseline,
        cpu: true,
        kernel: None,
        gpu_transports: NONE,
        emulated_transports: NONE,
        reads_remote: true,
        needs_islands: false,
        collectives: ALL_REDUCE,
        schedule: gather_bcast::schedule,
    },
    Spec {
        algorithm: Algorithm::Nccl,
        summary: "NCCL's all-reduce, all-gather and reduce-scatter (loaded at run time): the fallback where tpar's kernels do not win",
        role: Role::Fallback,
        cpu: false,
        kernel: None,
        gpu_transports: &[Transport::Nccl],
        emulated_transports: NONE,
        reads_remote: false,
        needs_islands: false,
        collectives: EVERY_COLLECTIVE,
        schedule: nccl::schedule,
    },
    Spec {
        algorithm: Algorithm::CeRing,
        summary: "copy engines move the data (cuMemcpyAsync): every rank's chunks to their owners, the owners' sums back; the small kernels of `ce_ring.cu` sum in rank order; large messages on PCIe, picked only where a tuned profile measured it; TPAR_WIRE=fp8 or int8 quantises on the wire (lossy)",
        role: Role::Measured,
        cpu: false,
        kernel: None,
        gpu_transports: P2P_HOST,
        emulated_transports: P2P_HOST,
        reads_remote: false,
        needs_islands: false,
        collectives: ALL_REDUCE,
        schedule: ce_ring::schedule,
    },
];

/// The entry of `a`.
pub fn spec(a: Algorithm) -> &'static Spec {
    // REGISTRY is in Algorithm::ALL's order (pinned by a test), so this is an index.
    let i = Algorithm::ALL.iter().position(|x| *x == a).unwrap_or(0);
    &REGISTRY[i]
}

impl Spec {
    /// The transports this algorithm runs over on `backend`.
    pub fn transports(&self, backend: Backend) -> &'static [Transport] {
        match backend {
            Backend::Cpu if self.cpu => &[Transport::Shm],
            Backend::Cpu => NONE,
            Backend::Cuda => self.gpu_transports,
        }
    }
}

/// Whether `a` over `t` has code that runs it on `backend` (the fabric's own conditions —
/// P2P, islands — are the plan's to check). `Err` says why not and what runs instead.
pub fn runnable(a: Algorithm, backend: Backend, t: Transport) -> Result<(), String> {
    let s = spec(a);
    if s.transports(backend).contains(&t) {
        return Ok(());
    }
    let names = |v: Vec<Algorithm>| v.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
    Err(match backend {
        Backend::Cpu => format!("the CPU backend runs {} over shm, not {a} over {t}", names(algorithms_on(Backend::Cpu))),
        Backend::Cuda if s.gpu_transports.is_empty() => {
            format!("{a} has no GPU implementation yet; GPU ranks run {}", names(algorithms_on(Backend::Cuda)))
        }
        Backend::Cuda => {
            let ts: Vec<&str> = s.gpu_transports.iter().map(|t| t.name()).collect();
            let over_t: Vec<Algorithm> = REGISTRY.iter().filter(|x| x.gpu_transports.contains(&t)).map(|x| x.algorithm).collect();
            let instead = if over_t.is_empty() { String::new() } else { format!(" (over {t}: {})", names(over_t)) };
            format!("{a} runs over {} with one process per GPU, not over {t}{instead}", ts.join(" or "))
        }
    })
}

/// Whether `a` computes `collective` (`Err`: why not, naming the algorithms that do).
pub fn computes(a: Algorithm, collective: Collective) -> Result<(), String> {
    if spec(a).collectives.contains(&collective) {
        return Ok(());
    }
    let those: Vec<&str> = REGISTRY.iter().filter(|s| s.collectives.contains(&collective)).map(|s| s.algorithm.name()).collect();
    Err(format!("{a} computes the all-reduce only; the {collective} runs on {}", those.join(", ")))
}

/// Algorithms that compute `collective`, in [`Algorithm::ALL`]'s order.
pub fn algorithms_for(collective: Collective) -> Vec<Algorithm> {
    REGISTRY.iter().filter(|s| s.collectives.contains(&collective)).map(|s| s.algorithm).collect()
}

/// Algorithms that run on `backend` over some transport, in [`Algorithm::ALL`]'s order.
pub fn algorithms_on(backend: Backend) -> Vec<Algorithm> {
    REGISTRY.iter().filter(|s| !s.transports(backend).is_empty()).map(|s| s.algorithm).collect()
}

/// Algorithms an emulated group (ranks as streams of one GPU) runs over `t`.
pub fn algorithms_emulated(t: Transport) -> Vec<Algorithm> {
    REGISTRY.iter().filter(|s| s.emulated_transports.contains(&t)).map(|s| s.algorithm).collect()
}

/// Algorithms with a CUDA kernel, and the kernels, in a stable order.
pub fn kernels() -> impl Iterator<Item = (Algorithm, KernelFile)> {
    REGISTRY.iter().filter_map(|s| s.kernel.map(|k| (s.algorithm, k)))
}

/// The registry as the markdown table of docs/architecture.md.
pub fn markdown_table() -> String {
    let ts = |v: &[Transport]| if v.is_empty() { "—".to_string() } else { v.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ") };
    let mut out = String::from(
        "| algorithm | role | collectives | CPU ranks | kernel | one process per GPU | emulated ranks | reads peers | what it does |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &REGISTRY {
        let role = match s.role {
            Role::Candidate => "candidate",
            Role::Baseline => "baseline",
            Role::Fallback => "fallback",
            Role::Measured => "measured only",
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.algorithm,
            role,
            s.collectives.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "),
            if s.cpu { "shm" } else { "—" },
            s.kernel.map_or("—".to_string(), |k| format!("`{}`", k.file)),
            ts(s.gpu_transports),
            ts(s.emulated_transports),
            if s.reads_remote { "yes" } else { "no" },
            s.summary
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_in_enum_order_and_complete() {
        assert_eq!(REGISTRY.len(), Algorithm::ALL.len());
        for (s, a) in REGISTRY.iter().zip(Algorithm::ALL) {
            assert_eq!(s.algorithm, a);
            assert!(std::ptr::eq(spec(a), s));
        }
    }

    #[test]
    fn gates_follow_the_table() {
        assert!(runnable(Algorithm::OneshotPush, Backend::Cpu, Transport::Shm).is_ok());
        assert!(runnable(Algorithm::StagedPush, Backend::Cpu, Transport::Shm).is_err());
        assert!(runnable(Algorithm::Hierarchical, Backend::Cuda, Transport::P2p).is_ok());
        assert!(runnable(Algorithm::GatherBcast, Backend::Cuda, Transport::P2p).unwrap_err().contains("no GPU implementation"));
        // The host transport runs the push kernels with one process per GPU (shared host
        // segments); the others are refused naming what runs over host instead.
        assert!(runnable(Algorithm::OneshotPush, Backend::Cuda, Transport::Host).is_ok());
        assert!(runnable(Algorithm::TwoshotPush, Backend::Cuda, Transport::Host).is_ok());
        let why = runnable(Algorithm::OneshotPull, Backend::Cuda, Transport::Host).unwrap_err();
        assert!(why.contains("one process per GPU") && why.contains("over host: oneshot-push, twoshot-push"), "{why}");
        assert!(runnable(Algorithm::StagedPush, Backend::Cuda, Transport::Host).is_err());
        assert!(runnable(Algorithm::Nccl, Backend::Cuda, Transport::Nccl).is_ok());
        assert_eq!(algorithms_on(Backend::Cpu).len(), REGISTRY.iter().filter(|s| s.cpu).count());
        // Every algorithm computes the all-reduce; the kernels declare their all-gather and
        // reduce-scatter entries exactly where the registry says the algorithm computes them.
        for s in &REGISTRY {
            assert!(s.collectives.contains(&Collective::AllReduce), "{}", s.algorithm);
            if let Some(k) = s.kernel {
                let gs = s.collectives.contains(&Collective::AllGather) && s.collectives.contains(&Collective::ReduceScatter);
                assert_eq!(k.variants.gather_scatter, gs, "{}", s.algorithm);
            }
        }
        assert!(computes(Algorithm::OneshotPush, Collective::AllGather).is_ok());
        assert!(computes(Algorithm::OneshotPull, Collective::ReduceScatter).is_ok());
        let why = computes(Algorithm::TwoshotPull, Collective::ReduceScatter).unwrap_err();
        assert!(why.contains("oneshot-push, oneshot-pull, nccl"), "{why}");
        // Every kernel file is distinct and named after its algorithm.
        for (a, k) in kernels() {
            assert_eq!(k.file.trim_end_matches(".cu").replace('_', "-"), a.name());
            assert!(!k.text.is_empty());
        }
    }

    #[test]
    fn docs_table_is_generated_from_the_registry() {
        let docs = include_str!("../../../docs/architecture.md");
        assert!(
            docs.contains(&markdown_table()),
            "docs/architecture.md's registry table is stale; paste this in:\n{}",
            markdown_table()
        );
    }
}
