//! Transports: where bytes travel. The CPU backend's is [`shm`]; the CUDA backend adds
//! peer device memory, shared host memory ([`host_segment`]: the GPU host transport across
//! processes) and NCCL.

pub mod shm;
pub mod shm_workspace;
pub mod host_segment;
