//! The CUDA backend: kernels compiled at run time with NVRTC, workspaces in device or
//! pinned host memory, emulated ranks on one GPU, and NCCL as the fallback.
//!
//! | module | owns |
//! |---|---|
//! | [`comm`] | `GpuCommunicator`: one rank per process and GPU, plan-driven: kernels, NCCL or an error |
//! | `capture` | its checked captures: calls recorded during a capture, compared across ranks when it ends |
//! | [`abi`] | `#[repr(C)]` twins of the kernels' structs, the workspace layout |
//! | [`ce`] | the copy-engine path (`ce-ring`): copies by `cuMemcpyAsync`, its kernels, a rank set's lanes, ordered by flags (rank processes) or events (emulated ranks) |
//! | [`driver`] | owning wrappers of raw driver handles: buffers, host memory, streams, events, graphs, modules |
//! | [`exec`] | streams, events, graphs, modules, kernel launches (re-exported by `driver`) |
//! | [`fused`] | the fused all-reduce + residual add + RMSNorm: its shape, buffers, and when a fused kernel takes it |
//! | [`host_ws`] | the host transport across processes: the job's shared-memory segment, registered with CUDA in every rank |
//! | [`io_tables`] | the registered-buffer tables of graph-captured calls (the pull kernels' zero-copy path) |
//! | [`rank_set`] | `RankSet`: the ranks a process drives, placed as emulated ranks (N streams of one GPU) or as this process's rank of a group (peers through CUDA IPC or the host segment): one launch path, one completion, one fused call, capture |
//! | [`kernels`] | the embedded `.cu` sources and their entry names |
//! | [`launch`] | the one launch path: block policy, size class (default, lean or fused variant), validation, lazy variants, PDL |
//! | [`probe`] / [`probe_ipc`] | the link probe: in one process over GPUs 0..n (`tpar topo --probe`), and across rank processes through CUDA IPC (the first-use tune) |
//! | [`route`] | a resolved call: the plan's decision and where it goes (kernel and launch, NCCL, the caller's NCCL) |
//! | [`tune`] | the first-use tune's ranks, once over a `RankSet`: a `GpuCommunicator`'s (on a workspace and NCCL of its own) and emulated ranks' (the mechanism on one GPU) |
//! | [`nccl`] | NCCL loaded by tpar (finds `libnccl.so.2`), unique-id bytes, multi-rank init, all-reduce |
//! | [`libpath`] | where NVRTC and NCCL are looked for: the setting, the Python environment's wheels, the system |
//! | [`nvrtc`] | finding libnvrtc, compiling to cubin, the checksummed on-disk cache |
//!
//! Contract: nothing here panics because a CUDA library is missing — presence is checked
//! and absence is an [`Error::Library`](crate::Error::Library) that says what to install.
//! Every device-side wait is bounded; a timeout becomes [`Error::Timeout`](crate::Error::Timeout)
//! and poisons the group. Built only with the `cuda` feature; needs no CUDA at build time.

pub mod abi;
pub mod ce;
mod capture;
pub mod comm;
pub mod driver;
pub mod exec;
pub mod fused;
pub mod host_ws;
pub mod io_tables;
pub mod kernels;
pub mod launch;
pub mod libpath;
pub mod nccl;
pub mod nvrtc;
pub mod probe;
pub mod probe_ipc;
pub mod rank_set;
pub mod route;
pub mod tune;

pub use comm::{Call, GpuCommunicator, GpuOptions, NcclCalls, NcclUse, Resolved, Route, Served};
pub use rank_set::{RankPlacement, RankSet, SetOptions};
pub use fused::{FusedBufs, FusedCall, FusedPath, FusedPattern};
