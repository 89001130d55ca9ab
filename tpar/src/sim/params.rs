//! Every number the simulator uses that is not in the [`Topology`](crate::topology::Topology).
//!
//! Owns: [`Params`] and its defaults, each with where it came from: **spec** (a standard or
//! data sheet), **measured** (a figure in docs/references.md, used as is), or **fitted** (chosen so
//! that the predictions in `calibrate` match docs/references.md figures; docs/sim.md lists which).
//! Must never: read files or the environment; tune itself.

/// How the all-reduce kernel is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// A stream launch from the host per call.
    Eager,
    /// Replayed inside a captured CUDA graph.
    Graph,
}

/// Simulator parameters. Times in us, bandwidths in GB/s, sizes in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub launch: Launch,
    /// Host-side cost of one eager kernel launch. Measured: docs/references.md "eager launches ~4 us".
    pub launch_eager_us: f64,
    /// Cost of one kernel boundary inside a graph. Measured: docs/references.md, ~0.5 us on H200.
    pub launch_graph_us: f64,
    /// Fraction of a PCIe link's spec rate that a P2P copy reaches. Measured: 53-56.6 of
    /// 63 GB/s Gen5 same-socket writes (docs/references.md) -> 0.87.
    pub pcie_efficiency: f64,
    /// Fraction of NVLink's spec rate P2P writes reach. Measured: 371-377 of 450 GB/s -> 0.83.
    pub nvlink_efficiency: f64,
    /// Fraction of its link's (efficient) rate that a few-block all-reduce kernel injects
    /// over PCIe. Fitted: custom one-shot on 4x RTX PRO 6000 moves ~31 GB/s per GPU at
    /// 256 KiB-1 MiB, V100 ~10 of 13.7 (docs/references.md tables).
    pub pcie_kernel_fraction: f64,
    /// The same over NVLink. Fitted: MSCCL++ all-pair on H200 adds ~0.8 us per 16 KiB x 7.
    pub nvlink_kernel_fraction: f64,
    /// One-way latency of a posted write, split by what it crosses: the GPU's own egress and
    /// ingress (`pcie_egress_us`), each switch traversal (`switch_hop_us`), each root-complex
    /// traversal (`rc_hop_us`), the socket link (`socket_hop_us`). Fitted (docs/sim.md, group
    /// P) to p2pBandwidthLatencyTest on root ports (0.36-0.52 us) and across the ASUS box's
    /// switches (0.71-0.74 us), and the flag ping-pong inside one switch (633-727 ns); the
    /// other latency figures are held out.
    pub pcie_egress_us: f64,
    pub switch_hop_us: f64,
    pub rc_hop_us: f64,
    /// Extra one-way latency for crossing the socket link (and the far root complex's hop).
    /// Fitted to the ASUS box's cross-NUMA 1.27-1.36 us.
    pub socket_hop_us: f64,
    /// One-way latency of an NVLink write through NVSwitch. Fitted (H200 NCCL, 14 ring hops).
    pub nvlink_write_us: f64,
    /// A read's round trip is two one-way trips plus the completer's memory access. Assumed
    /// (a DRAM access, ~60 ns); the 128 B read figures (group P) test the sum.
    pub completer_us: f64,
    /// Round trip of an NVLink read. Assumed: a few write latencies.
    pub nvlink_read_rtt_us: f64,
    /// Non-posted read bytes one GPU can have outstanding: 768 tags (PCIe 10-bit tags) x
    /// 512 B read requests. Spec-level; by Little's law this is what makes a loaded read
    /// round trip long: 393 KiB queued at a 55 GB/s link is ~7 us (group P's 7.48 us).
    pub gpu_read_outstanding_bytes: f64,
    /// Bytes one reading GPU keeps outstanding per peer (the kernel's window). Assumed:
    /// 16 blocks x 1 KiB in flight per peer.
    pub read_window_bytes: f64,
    /// Bytes of non-posted reads a root complex keeps outstanding for peer traffic, all GPUs
    /// together; with the round trip this is a capacity (Little's law). Fitted to b12x's pull
    /// one-shot at 96 KiB on 8 RTX PRO 6000 (docs/sim.md group M).
    pub rc_read_outstanding_bytes: f64,
    /// The same for a kernel's SM loads that cross the socket link. Fitted to the pull one-shot
    /// time derived from the founding serving run (docs/sim.md group H: 340-380 us at 42 KiB
    /// on 8 GPUs); the ASUS box's own 8-GPU SM-read all-reduce sweep (group T, 151-2665 us at
    /// 16-256 KiB) is held out against it. SM loads keep far fewer bytes outstanding than
    /// copy engines do (the next field): that gap is the mechanism of the pull collapse.
    pub socket_read_outstanding_bytes: f64,
    /// The same for copy-engine reads (64 MB `cudaMemcpyPeerAsync`, p2pmark's bandwidth mode).
    /// Fitted to p2pmark's all-to-all reads on the ASUS dual-socket box (46.4 GB/s for 8 GPUs,
    /// docs/sim.md group R). Only the calibration's copy-engine rows use it: tpar's kernels
    /// move data with SM loads and stores.
    pub socket_ce_read_outstanding_bytes: f64,
    /// Peer traffic a root complex forwards, in multiples of one GPU link. Fitted: 8 GPUs
    /// writing all peers get 0.38-0.44 of their isolated rate on one CPU (docs/references.md).
    pub rc_forward_links: f64,
    /// Socket-link rate for peer traffic when the topology does not give one. Measured:
    /// Gen5 across sockets 39-51 GB/s (docs/references.md) -> 45.
    pub socket_link_gbps: f64,
    /// Host DRAM rate for staged copies, per socket. Spec-level guess (DDR5, 8+ channels).
    pub host_memory_gbps: f64,
    /// Detecting that data landed (a sentinel or flag flips in local memory), per step. Fitted
    /// to the flag ping-pong inside one switch (group P: 633-727 ns one way = write + poll).
    pub poll_us: f64,
    /// Fixed kernel-side work per call (prologue, clearing, reduction of small messages). Fitted.
    pub kernel_fixed_us: f64,
    /// A poll of host memory by a GPU (host transport): one PCIe read round trip of host
    /// memory. Assumed: p2pmark's 4.1 us idle 128 B read (docs/references.md), a conservative
    /// figure (the switch-box reads of group P are 0.7-1.5 us).
    pub host_poll_us: f64,
    /// Latency of one NCCL ring hop through host memory (SHM transport, P2P off for the
    /// pair). Fitted: docs/references.md's AMD figure, 48.2 us untuned vs 26.2 us with P2P at SYS,
    /// 32 KB on 8 GPUs. (A cudaMemcpy through host takes ~14 us; NCCL's LL hand-off through
    /// host memory is a flag poll, far cheaper.)
    pub nccl_shm_hop_us: f64,
    /// The same hop between GPUs on different sockets: the flag and the data sit in one
    /// socket's memory, and the other socket's GPU polls them across the socket link. NCCL's
    /// ring steps at its slowest hop's pace, so on a two-socket box (two of eight hops cross)
    /// this sets the untuned NCCL floor. Fitted to the ASUS box's own 8-GPU NCCL sweep at
    /// 16 KiB (docs/sim.md group S: 69.3 us); its other sizes are held out.
    pub nccl_shm_cross_socket_hop_us: f64,
    /// NCCL's fixed cost per call, launch included, eager or in a graph alike: docs/references.md
    /// shows NCCL floors of 15-20 us both eager (4x RTX PRO 6000) and in graphs (4x V100,
    /// H200 pynccl), so its floor is not the launch. Fitted to those floors.
    pub nccl_fixed_us: f64,
    /// NCCL's cost per ring step besides the hop's own latency (LL hand-off). Fitted, as above.
    pub nccl_step_us: f64,
    /// NCCL's cost per ring step with its Simple protocol (no flag per 8 bytes, so one wire
    /// byte per byte, but a full hand-off per chunk). NCCL takes whichever protocol is faster
    /// for the size; the simulator does the same. Fitted: 4x V100 at 384 KiB (C); the
    /// 12-96 MB NCCL figures (O) are held out.
    pub nccl_simple_step_us: f64,
    /// Bytes on the wire per payload byte for NCCL's LL protocol (8-byte flag per 8 bytes:
    /// spec of the protocol) -> 2.
    pub nccl_ll_wire_factor: f64,
    /// Start of one copy of a copy engine's queue (`ce-ring`'s copies run back to back).
    /// Assumed, not fitted: b12x's DmaAllReduce comments that a sub-step (a copy, a flag, an
    /// add launch) costs about 5 us; the copy's share is taken as 2 us. `ce-ring` is picked
    /// only from measured profiles, never from these predictions.
    pub ce_copy_us: f64,
    /// The bound (docs/sim.md, "Unmeasured figures"): what one GPU's SM stores or SM loads to
    /// all its peers together carry, GB/s, under all-to-all load, where no figure for this box
    /// measures that op under load. The worst such rate published for a PCIe box: the founding
    /// case's pull one-shot (group H, 360 us at 42 KiB on 8 GPUs) moves 7 x 42 KiB per GPU in
    /// 360 - 9.4 us (launch, fixed work, two barriers): 0.86 GB/s (derived). The ASUS box's
    /// own 8-GPU SM-read sweep (group T) runs at 0.7-0.9 GB/s per GPU. The plan keeps a tpar
    /// kernel whose time rests on an unmeasured figure only where it beats NCCL even there.
    pub unmeasured_gpu_gbps: f64,
    /// Whether NCCL uses P2P across the socket link (NCCL_P2P_LEVEL=SYS). Off by default,
    /// as docs/references.md's AMD tuning figure implies (48.2 us untuned vs 26.2 us at SYS).
    pub nccl_p2p_across_sockets: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            launch: Launch::Eager,
            launch_eager_us: 4.0,
            launch_graph_us: 0.5,
            pcie_efficiency: 0.87,
            nvlink_efficiency: 0.83,
            pcie_kernel_fraction: PCIE_KERNEL_FRACTION,
            nvlink_kernel_fraction: 0.40,
            pcie_egress_us: 0.19,
            switch_hop_us: 0.14,
            rc_hop_us: 0.25,
            socket_hop_us: 0.34,
            nvlink_write_us: 0.5,
            completer_us: 0.06,
            nvlink_read_rtt_us: 2.0,
            gpu_read_outstanding_bytes: 768.0 * 512.0,
            read_window_bytes: READ_WINDOW_BYTES,
            rc_read_outstanding_bytes: RC_READ_OUTSTANDING_BYTES,
            socket_read_outstanding_bytes: SOCKET_READ_OUTSTANDING_BYTES,
            socket_ce_read_outstanding_bytes: SOCKET_CE_READ_OUTSTANDING_BYTES,
            rc_forward_links: 3.3,
            socket_link_gbps: 45.0,
            host_memory_gbps: 200.0,
            poll_us: 0.35,
            kernel_fixed_us: KERNEL_FIXED_US,
            host_poll_us: 4.1,
            nccl_shm_hop_us: 1.5,
            nccl_shm_cross_socket_hop_us: NCCL_SHM_CROSS_SOCKET_HOP_US,
            unmeasured_gpu_gbps: UNMEASURED_GPU_GBPS,
            nccl_fixed_us: 12.5,
            nccl_step_us: 0.3,
            nccl_simple_step_us: NCCL_SIMPLE_STEP_US,
            nccl_ll_wire_factor: 2.0,
            nccl_p2p_across_sockets: false,
            ce_copy_us: 2.0,
        }
    }
}

// Fitted values, named so docs/sim.md and the calibration share them (see the fields).
const PCIE_KERNEL_FRACTION: f64 = 0.65;
const READ_WINDOW_BYTES: f64 = 16384.0;
const RC_READ_OUTSTANDING_BYTES: f64 = 262144.0;
const SOCKET_READ_OUTSTANDING_BYTES: f64 = 8192.0;
const SOCKET_CE_READ_OUTSTANDING_BYTES: f64 = 57344.0;
const NCCL_SHM_CROSS_SOCKET_HOP_US: f64 = 3.6;
/// Derived (group H): 7 x 43008 B per GPU over (360 - 9.4) us.
pub const UNMEASURED_GPU_GBPS: f64 = 0.86;
const KERNEL_FIXED_US: f64 = 2.1;
const NCCL_SIMPLE_STEP_US: f64 = 4.5;

impl Params {
    /// Defaults with the given launch mode.
    pub fn with_launch(launch: Launch) -> Self {
        Params {
            launch,
            ..Params::default()
        }
    }

    /// Launch cost of one kernel in the current mode.
    pub fn launch_us(&self) -> f64 {
        match self.launch {
            Launch::Eager => self.launch_eager_us,
            Launch::Graph => self.launch_graph_us,
        }
    }
}

impl Params {
    /// NCCL with its Simple protocol instead of LL: one wire byte per byte, the Simple step cost.
    pub fn nccl_simple(&self) -> Params {
        Params { nccl_ll_wire_factor: 1.0, nccl_step_us: self.nccl_simple_step_us, ..self.clone() }
    }
}
