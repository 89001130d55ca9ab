//! Transports: where bytes travel. The CPU backend's is [`shm`]; the CUDA backend adds
//! peer device memory, shared host memory and NCCL.

pub mod shm;
pub mod shm_workspace;
