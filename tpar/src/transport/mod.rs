//! Transports: where bytes travel. The CPU backend's is [`shm`] (its data plane over it is
//! `comm::shm_workspace`); the CUDA backend adds
//! peer device memory, shared host memory ([`host_segment`]: the GPU host transport across
//! processes) and NCCL.

pub(crate) mod holder;
pub mod shm;
pub mod host_segment;
