// tpar's C API over vLLM's custom collectives (`vllm::CustomAllreduce`, csrc/custom_all_reduce.cuh,
// and the all-gather and reduce-scatter kernels of csrc/custom_all_gather_reduce_scatter.cuh), so
// that `tpar bench --compare vllm` can time vLLM's kernels beside tpar's, in the same process,
// with the same harness. Nothing of vLLM is in this repository: bench/compare/vllm.sh downloads
// the vLLM source distribution (pinned by sha256), extracts three headers and compiles this
// file against them on the GPU machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I<vllm>/csrc peer.cu
//        -o libtpar_vllm_ar.so -L/usr/local/cuda/lib64/stubs -lcuda
//
// The all-gather and the reduce-scatter: vLLM launches their kernels from
// CustomAllreduce::allgather / reduce_scatter, defined in custom_all_gather_reduce_scatter.cu,
// a file that needs torch; this file launches the same kernels with the same grid (512
// threads, blocks = min(block limit, the 16-byte vectors each thread takes)), over the same
// registered buffers. As vLLM's custom_all_gather / custom_reduce_scatter do, every call first
// copies its input into the rank's registered buffer, eagerly and inside a graph alike (vLLM
// registers no graph inputs for these two).
//
// Contract. One handle drives the ranks of this process that belong to one group:
//   * emulated ranks: every rank of the world, as streams of one GPU; "peer" pointers are plain
//     device pointers of this process (no IPC); after a graph capture, each captured input is
//     registered with every rank's copy of that call's input (vLLM's register_graph_buffers,
//     with the IPC step left out: the pointers are already ours);
//   * one process per GPU: one rank; the signal and staging buffers travel as CUDA IPC handles
//     (bytes the caller exchanges over its own control plane), and so do the inputs captured in
//     a graph (vLLM's get_graph_buffer_ipc_meta / register_graph_buffers).
// Eagerly a call copies its input into the rank's registered buffer and reduces from there;
// while the stream is capturing it reduces straight from the input (zero copy), as vLLM's
// CustomAllreduce.custom_all_reduce does. The signal buffers are zeroed before any peer can
// see them. Every entry point returns 0 or -1 with a message in tpar_peer_last_error(); it
// never throws. vLLM's own CUDACHECK exits the process on a CUDA error: the checks below
// (sizes, world, dtypes, capacity) keep known misuse away from it.
// Single-threaded: call everything from one thread (the runtime's current device is per thread).

// What vLLM's headers use without including it themselves (std::min, std::is_same, printf).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "custom_all_reduce.cuh"
#include "custom_all_gather_reduce_scatter.cuh"

namespace {

// What this file's API looks like; tpar refuses a library with another number.
constexpr int kAbi = 2;
// The dtype codes of tpar::DType::code().
constexpr int kF32 = 1, kF16 = 2, kBf16 = 3;
// The collective codes of tpar::Collective::code().
constexpr int kAllReduce = 0, kAllGather = 1, kReduceScatter = 2;
// vLLM's CustomAllreduce: rank_data of 8 MiB (custom_all_reduce.py: "enough for 65536 such
// tuples"); every captured call takes one RankData per rank and vLLM never gives it back.
constexpr size_t kRankDataBytes = 8u << 20;
// vLLM's kernels run 512 threads per block (CustomAllreduce::allreduce's default).
constexpr int kThreads = 512;
// The bytes below which vLLM's dispatch picks the one-stage kernel (REDUCE_CASE in
// custom_all_reduce.cuh: world <= 4 and < 512 KiB, or world <= 8 and < 256 KiB).
constexpr size_t kOneStageBelow4 = 512u << 10, kOneStageBelow8 = 256u << 10;

thread_local std::string g_error;

int fail(const std::string& what) {
  g_error = what;
  return -1;
}

#define TRY_CUDA(call)                                                              \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      return fail(std::string(#call) + ": " + cudaGetErrorString(e_));             \
  } while (0)

struct Slot {
  int rank = 0;
  vllm::Signal* signal = nullptr;  // sizeof(Signal) + max_bytes (two-stage's scratch after it)
  void* staging = nullptr;         // the registered buffer eager calls copy their input into
  void* rank_data = nullptr;
  vllm::CustomAllreduce* ar = nullptr;
};

struct Peer {
  int device = 0;
  int world = 0;
  size_t max_bytes = 0;
  bool full_nvlink = true;
  int block_limit = vllm::defaultBlockLimit;
  // The all-gather's and the reduce-scatter's (their kernels' own residency); 0 when an
  // explicit limit does not fit them, `agrs_error` saying why (the all-reduce still runs).
  int block_limit_agrs = vllm::defaultBlockLimit;
  std::string agrs_error;
  std::vector<Slot> slots;
  // Rank processes: the peers' buffers opened from their IPC handles (closed on destroy).
  std::vector<void*> opened;
  std::string info;
};

size_t elem_size(int dtype) { return dtype == kF32 ? 4 : 2; }

bool dtype_ok(int dtype) { return dtype == kF32 || dtype == kF16 || dtype == kBf16; }

// vLLM's choice between its kernels for one call, as REDUCE_CASE makes it (including its
// VLLM_CUSTOM_ALLREDUCE_ALGO override). 0: it would launch nothing (more than two ranks
// without full NVLink), -1: the override is malformed (vLLM throws).
int stage_for(const Peer& p, size_t bytes) {
  if (const char* env = std::getenv("VLLM_CUSTOM_ALLREDUCE_ALGO")) {
    if (!std::strcmp(env, "1stage") || !std::strcmp(env, "oneshot")) return 1;
    if (!std::strcmp(env, "2stage") || !std::strcmp(env, "twoshot")) return 2;
    return -1;
  }
  if (p.world == 2) return 1;
  if (!p.full_nvlink) return 0;
  if ((p.world <= 4 && bytes < kOneStageBelow4) || (p.world <= 8 && bytes < kOneStageBelow8)) return 1;
  return 2;
}

// Resident blocks per SM of both kernels for one dtype and world (the smaller), and their
// register counts for the description.
template <typename T, int N>
int resident_per_sm(std::string& regs) {
  int a = 0, b = 0;
  cudaFuncAttributes fa{}, fb{};
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a, vllm::cross_device_reduce_1stage<T, N>, kThreads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, vllm::cross_device_reduce_2stage<T, N>, kThreads, 0) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, vllm::cross_device_reduce_1stage<T, N>) != cudaSuccess ||
      cudaFuncGetAttributes(&fb, vllm::cross_device_reduce_2stage<T, N>) != cudaSuccess)
    return -1;
  regs += " " + std::to_string(fa.numRegs) + "/" + std::to_string(fb.numRegs);
  return a < b ? a : b;
}

template <int N>
int resident_all_dtypes(std::string& regs) {
  int m = resident_per_sm<float, N>(regs);
  int h = resident_per_sm<half, N>(regs);
  int b = resident_per_sm<nv_bfloat16, N>(regs);
  if (m < 0 || h < 0 || b < 0) return -1;
  int r = m < h ? m : h;
  return r < b ? r : b;
}

int resident_for_world(int world, std::string& regs) {
  switch (world) {
    case 2: return resident_all_dtypes<2>(regs);
    case 4: return resident_all_dtypes<4>(regs);
    case 6: return resident_all_dtypes<6>(regs);
    case 8: return resident_all_dtypes<8>(regs);
    default: return -1;
  }
}

// The same for the all-gather kernel (one for every dtype) and the reduce-scatter kernel of
// each dtype: the smallest resident blocks per SM, and their register counts.
template <typename K>
bool resident_kernel(K kernel, int& per_sm, std::string& regs) {
  int n = 0;
  cudaFuncAttributes a{};
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess ||
      cudaFuncGetAttributes(&a, kernel) != cudaSuccess)
    return false;
  regs += " " + std::to_string(a.numRegs);
  if (n < per_sm) per_sm = n;
  return true;
}

template <int N>
int resident_agrs(std::string& regs) {
  int per_sm = 1 << 30;
  regs += " all-gather";
  if (!resident_kernel(vllm::cross_device_all_gather<N>, per_sm, regs)) return -1;
  regs += ", reduce-scatter f32,f16,bf16";
  if (!resident_kernel(vllm::cross_device_reduce_scatter<float, N>, per_sm, regs) ||
      !resident_kernel(vllm::cross_device_reduce_scatter<half, N>, per_sm, regs) ||
      !resident_kernel(vllm::cross_device_reduce_scatter<nv_bfloat16, N>, per_sm, regs))
    return -1;
  return per_sm;
}

int resident_agrs_for_world(int world, std::string& regs) {
  switch (world) {
    case 2: return resident_agrs<2>(regs);
    case 4: return resident_agrs<4>(regs);
    case 6: return resident_agrs<6>(regs);
    case 8: return resident_agrs<8>(regs);
    default: return -1;
  }
}

// The block limit of one family of kernels: `block_limit` (0: vLLM's default) where every
// local rank's blocks are resident together, `spare` resident blocks left over; the default is
// lowered to fit, an explicit limit that does not fit is refused. -1 with the message set when
// not one block per rank fits.
int fit_block_limit(int block_limit, int per_sm, int sms, int nlocal, int spare, const char* what) {
  int fit = (per_sm * sms - spare) / nlocal;  // blocks per rank that can all be resident together
  int limit = block_limit ? block_limit : vllm::defaultBlockLimit;
  if (limit > fit) {
    if (block_limit) {
      return fail(std::string(what) + ": block limit " + std::to_string(block_limit) + " x " + std::to_string(nlocal) +
                  " ranks on this GPU exceeds its resident blocks (" + std::to_string(per_sm * sms - spare) + ")");
    }
    limit = fit;
  }
  if (limit < 1)
    return fail(std::string(what) + ": not one block per rank is resident: " + std::to_string(nlocal) + " ranks on " +
                std::to_string(sms) + " SMs");
  return limit;
}

int alloc_zeroed(void** p, size_t bytes) {
  TRY_CUDA(cudaMalloc(p, bytes));
  TRY_CUDA(cudaMemset(*p, 0, bytes));
  return 0;
}

// Builds every local rank's CustomAllreduce over `signals` and registers `staging` (one
// pointer per rank of the world).
int build(Peer& p, vllm::Signal** signals, void** staging) {
  TRY_CUDA(cudaDeviceSynchronize());  // every signal buffer zeroed before the first call
  for (Slot& s : p.slots) {
    s.ar = new vllm::CustomAllreduce(signals, s.rank_data, kRankDataBytes, s.rank, p.world, p.full_nvlink);
    s.ar->register_buffer(staging);
  }
  TRY_CUDA(cudaDeviceSynchronize());
  return 0;
}

template <typename T>
void launch(vllm::CustomAllreduce* ar, cudaStream_t st, const void* in, void* out, size_t count, int blocks) {
  ar->allreduce<T>(st, (T*)in, (T*)out, (int)count, kThreads, blocks);
}

// vLLM's all-gather kernel for one world (CustomAllreduce::allgather's AG_CASE): `per_rank`
// 16-byte vectors of every rank's registered buffer (`rd`) into `out`, in rank order.
template <int N>
void launch_ag(const vllm::CustomAllreduce* ar, cudaStream_t st, vllm::RankData* rd, void* out, int per_rank, int blocks) {
  vllm::cross_device_all_gather<N><<<blocks, kThreads, 0, st>>>(rd, ar->sg_, ar->self_sg_,
                                                                reinterpret_cast<vllm::CopyPack*>(out), ar->rank_, per_rank);
}

bool launch_ag_world(int world, const vllm::CustomAllreduce* ar, cudaStream_t st, vllm::RankData* rd, void* out, int per_rank,
                     int blocks) {
  switch (world) {
    case 2: launch_ag<2>(ar, st, rd, out, per_rank, blocks); return true;
    case 4: launch_ag<4>(ar, st, rd, out, per_rank, blocks); return true;
    case 6: launch_ag<6>(ar, st, rd, out, per_rank, blocks); return true;
    case 8: launch_ag<8>(ar, st, rd, out, per_rank, blocks); return true;
    default: return false;
  }
}

// vLLM's reduce-scatter kernel for one dtype and world (CustomAllreduce::reduce_scatter's
// RS_CASE): this rank's `per_rank` 16-byte vectors, summed over every rank's registered buffer.
template <typename T, int N>
void launch_rs(const vllm::CustomAllreduce* ar, cudaStream_t st, vllm::RankData* rd, void* out, int per_rank, int blocks) {
  vllm::cross_device_reduce_scatter<T, N><<<blocks, kThreads, 0, st>>>(rd, ar->sg_, ar->self_sg_, reinterpret_cast<T*>(out),
                                                                       ar->rank_, per_rank);
}

template <typename T>
bool launch_rs_world(int world, const vllm::CustomAllreduce* ar, cudaStream_t st, vllm::RankData* rd, void* out, int per_rank,
                     int blocks) {
  switch (world) {
    case 2: launch_rs<T, 2>(ar, st, rd, out, per_rank, blocks); return true;
    case 4: launch_rs<T, 4>(ar, st, rd, out, per_rank, blocks); return true;
    case 6: launch_rs<T, 6>(ar, st, rd, out, per_rank, blocks); return true;
    case 8: launch_rs<T, 8>(ar, st, rd, out, per_rank, blocks); return true;
    default: return false;
  }
}

// What the all-gather and the reduce-scatter check before their copy: a live slot, a dtype
// vLLM takes, whole 16-byte vectors per rank (`shard` bytes), `staged` bytes (what the copy
// puts into the registered buffer) within it, and vLLM's int sizes. Returns the slot's
// registered buffer's RankData, or null with the message set.
vllm::RankData* agrs_check(Peer& p, int slot, int dtype, size_t count, size_t staged, const char* what) {
  if (slot < 0 || slot >= (int)p.slots.size() || !p.slots[slot].ar) {
    fail("bad slot, or not connected");
    return nullptr;
  }
  if (p.block_limit_agrs < 1) {
    fail(p.agrs_error);
    return nullptr;
  }
  if (!dtype_ok(dtype)) {
    fail("dtype code " + std::to_string(dtype) + ": vLLM's " + what + " takes f32, f16 and bf16");
    return nullptr;
  }
  size_t shard = count * elem_size(dtype);
  if (count == 0 || shard % 16 != 0) {
    fail(std::string("vLLM's ") + what + " needs a positive multiple of 16 bytes per rank, not " + std::to_string(shard));
    return nullptr;
  }
  if (staged > p.max_bytes) {
    fail(std::string(what) + " of " + std::to_string(staged) + " B staged is larger than the registered buffers (" +
         std::to_string(p.max_bytes) + " B)");
    return nullptr;
  }
  if (staged / 16 * (size_t)p.world > (size_t)INT32_MAX) {
    fail(std::string("sizes do not fit vLLM's int"));
    return nullptr;
  }
  Slot& s = p.slots[slot];
  auto it = s.ar->buffers_.find(s.staging);
  if (it == s.ar->buffers_.end()) {
    fail("the registered buffer is not registered with vLLM");
    return nullptr;
  }
  return it->second;
}

void write_u64(std::string& b, uint64_t v) { b.append((const char*)&v, 8); }

bool read_u64(const unsigned char*& p, const unsigned char* end, uint64_t& v) {
  if (end - p < 8) return false;
  std::memcpy(&v, p, 8);
  p += 8;
  return true;
}

}  // namespace

extern "C" {

int tpar_peer_abi(void) { return kAbi; }

const char* tpar_peer_last_error(void) { return g_error.c_str(); }

// A group of `world` ranks of which this process drives `nlocal`: ranks[0..nlocal). Emulated
// ranks: nlocal == world. `block_limit` 0: vLLM's default (36), lowered so that every local
// rank's blocks are resident at once (spin-waiting kernels of ranks that share one GPU deadlock
// otherwise); refused when not even one block per rank fits.
int tpar_peer_create(int device, int world, const int* ranks, int nlocal, size_t max_bytes, int full_nvlink,
                     int block_limit, void** out) {
  *out = nullptr;
  if (world != 2 && world != 4 && world != 6 && world != 8)
    return fail("vLLM's custom all-reduce runs 2, 4, 6 or 8 ranks, not " + std::to_string(world));
  if (nlocal < 1 || nlocal > world) return fail("bad number of local ranks");
  if (!full_nvlink && world > 2)
    return fail("vLLM's custom all-reduce runs more than two ranks only with full NVLink (it launches nothing otherwise)");
  if (max_bytes == 0 || max_bytes % 16 != 0) return fail("max_bytes must be a positive multiple of 16");
  if (block_limit < 0 || block_limit > vllm::kMaxBlocks)
    return fail("block limit must be 0..=" + std::to_string(vllm::kMaxBlocks));
  TRY_CUDA(cudaSetDevice(device));
  std::string regs, regs_agrs;
  int per_sm = resident_for_world(world, regs);
  int per_sm_agrs = resident_agrs_for_world(world, regs_agrs);
  if (per_sm < 0 || per_sm_agrs < 0) return fail("cudaOccupancyMaxActiveBlocksPerMultiprocessor failed for vLLM's kernels");
  int sms = 0;
  TRY_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int limit = fit_block_limit(block_limit, per_sm, sms, nlocal, 0, "all-reduce");
  if (limit < 0) return -1;
  // The all-gather and the reduce-scatter copy their input before their kernel in a graph
  // too, while other ranks' kernels may already spin: one SM's worth of blocks stays free
  // for a copy the GPU runs on its SMs (with one rank per process there is nothing to share).
  int spare = nlocal > 1 ? per_sm_agrs : 0;
  int limit_agrs = fit_block_limit(block_limit, per_sm_agrs, sms, nlocal, spare, "all-gather/reduce-scatter");
  std::string agrs_error = limit_agrs < 0 ? g_error : std::string();
  Peer* p = new Peer();
  p->device = device;
  p->world = world;
  p->max_bytes = max_bytes;
  p->full_nvlink = full_nvlink != 0;
  p->block_limit = limit;
  p->block_limit_agrs = limit_agrs < 0 ? 0 : limit_agrs;
  p->agrs_error = agrs_error;
  p->info = "blocks per call <= " + std::to_string(limit) + " (vLLM's default " + std::to_string(vllm::defaultBlockLimit) +
            "; " + std::to_string(nlocal) + " local rank(s) x " + std::to_string(limit) + " <= " + std::to_string(per_sm) +
            " per SM x " + std::to_string(sms) + " SMs, all resident), registers 1stage/2stage per dtype f32,f16,bf16:" + regs +
            "; all-gather/reduce-scatter blocks <= " + (limit_agrs > 0 ? std::to_string(limit_agrs) : "none (" + agrs_error + ")") +
            " (" + std::to_string(per_sm_agrs) + " per SM, one SM's worth left free for the input copies), registers" + regs_agrs + ", full_nvlink " + (p->full_nvlink ? "true" : "false");
  for (int i = 0; i < nlocal; i++) {
    Slot s;
    s.rank = ranks[i];
    if (s.rank < 0 || s.rank >= world) {
      delete p;
      return fail("rank out of range");
    }
    p->slots.push_back(s);
  }
  for (Slot& s : p->slots) {
    if (alloc_zeroed((void**)&s.signal, sizeof(vllm::Signal) + max_bytes) || alloc_zeroed(&s.staging, max_bytes) ||
        alloc_zeroed(&s.rank_data, kRankDataBytes)) {
      std::string e = g_error;
      for (Slot& t : p->slots) {
        cudaFree(t.signal);
        cudaFree(t.staging);
        cudaFree(t.rank_data);
      }
      delete p;
      return fail(e);
    }
  }
  *out = p;
  return 0;
}

const char* tpar_peer_info(void* h) { return static_cast<Peer*>(h)->info.c_str(); }

// The block limit of `collective` (tpar::Collective::code()): the all-reduce's, or the
// all-gather's and reduce-scatter's.
int tpar_peer_block_limit(void* h, int collective) {
  Peer& p = *static_cast<Peer*>(h);
  if (collective == kAllReduce) return p.block_limit;
  if (collective == kAllGather || collective == kReduceScatter)
    return p.block_limit_agrs > 0 ? p.block_limit_agrs : fail(p.agrs_error);
  return fail("unknown collective code " + std::to_string(collective));
}

// Emulated ranks: connects every rank to every other by plain pointers.
int tpar_peer_connect_local(void* h) {
  Peer& p = *static_cast<Peer*>(h);
  if ((int)p.slots.size() != p.world) return fail("connect_local needs every rank of the world in this process");
  vllm::Signal* signals[vllm::kMaxCustomCollectiveRanks] = {};
  void* staging[vllm::kMaxCustomCollectiveRanks] = {};
  for (const Slot& s : p.slots) {
    signals[s.rank] = s.signal;
    staging[s.rank] = s.staging;
  }
  TRY_CUDA(cudaSetDevice(p.device));
  try {
    return build(p, signals, staging);
  } catch (const std::exception& e) {
    return fail(std::string("vLLM: ") + e.what());
  }
}

// Rank processes: this rank's two IPC handles (signal, staging), 2 x 64 bytes, for the others.
int tpar_peer_export(void* h, unsigned char* out, size_t cap, size_t* len) {
  Peer& p = *static_cast<Peer*>(h);
  if (p.slots.size() != 1) return fail("export is for one rank per process");
  if (cap < 2 * sizeof(cudaIpcMemHandle_t)) return fail("export buffer too small");
  TRY_CUDA(cudaSetDevice(p.device));
  TRY_CUDA(cudaIpcGetMemHandle((cudaIpcMemHandle_t*)out, p.slots[0].signal));
  TRY_CUDA(cudaIpcGetMemHandle((cudaIpcMemHandle_t*)(out + sizeof(cudaIpcMemHandle_t)), p.slots[0].staging));
  *len = 2 * sizeof(cudaIpcMemHandle_t);
  return 0;
}

// Rank processes: every rank's export, in rank order (`each` bytes apiece), opened here.
int tpar_peer_connect(void* h, const unsigned char* all, size_t each) {
  Peer& p = *static_cast<Peer*>(h);
  if (p.slots.size() != 1) return fail("connect is for one rank per process");
  if (each != 2 * sizeof(cudaIpcMemHandle_t)) return fail("unexpected export size " + std::to_string(each));
  TRY_CUDA(cudaSetDevice(p.device));
  vllm::Signal* signals[vllm::kMaxCustomCollectiveRanks] = {};
  void* staging[vllm::kMaxCustomCollectiveRanks] = {};
  const Slot& me = p.slots[0];
  for (int r = 0; r < p.world; r++) {
    if (r == me.rank) {
      signals[r] = me.signal;
      staging[r] = me.staging;
      continue;
    }
    cudaIpcMemHandle_t hs, hb;
    std::memcpy(&hs, all + r * each, sizeof hs);
    std::memcpy(&hb, all + r * each + sizeof hs, sizeof hb);
    void* ps = nullptr;
    void* pb = nullptr;
    TRY_CUDA(cudaIpcOpenMemHandle(&ps, hs, cudaIpcMemLazyEnablePeerAccess));
    p.opened.push_back(ps);
    TRY_CUDA(cudaIpcOpenMemHandle(&pb, hb, cudaIpcMemLazyEnablePeerAccess));
    p.opened.push_back(pb);
    signals[r] = (vllm::Signal*)ps;
    staging[r] = pb;
  }
  try {
    return build(p, signals, staging);
  } catch (const std::exception& e) {
    return fail(std::string("vLLM: ") + e.what());
  }
}

// Which of vLLM's kernels a call of `bytes` runs: 1 or 2 (stages).
int tpar_peer_stage(void* h, size_t bytes) {
  int s = stage_for(*static_cast<Peer*>(h), bytes);
  if (s == -1) return fail("VLLM_CUSTOM_ALLREDUCE_ALGO must be 1stage, oneshot, 2stage or twoshot");
  if (s == 0) return fail("vLLM launches nothing for this call (more than two ranks without full NVLink)");
  return s;
}

// One all-reduce of `count` elements on local rank `slot`, enqueued on `stream`.
int tpar_peer_all_reduce(void* h, int slot, void* stream, int dtype, const void* in, void* out, size_t count) {
  Peer& p = *static_cast<Peer*>(h);
  if (slot < 0 || slot >= (int)p.slots.size() || !p.slots[slot].ar) return fail("bad slot, or not connected");
  if (!dtype_ok(dtype)) return fail("dtype code " + std::to_string(dtype) + ": vLLM reduces f32, f16 and bf16");
  size_t bytes = count * elem_size(dtype);
  if (count == 0 || bytes % 16 != 0) return fail("vLLM needs a positive multiple of 16 bytes, not " + std::to_string(bytes));
  if (bytes > p.max_bytes) return fail("call larger than the buffers (" + std::to_string(p.max_bytes) + " B)");
  if (count > (size_t)INT32_MAX) return fail("count does not fit vLLM's int");
  if (tpar_peer_stage(h, bytes) < 0) return -1;
  cudaStream_t st = (cudaStream_t)stream;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  TRY_CUDA(cudaStreamIsCapturing(st, &cap));
  Slot& s = p.slots[slot];
  const void* src = in;
  if (cap != cudaStreamCaptureStatusActive) {
    // vLLM's eager path: the input goes into the registered buffer first.
    TRY_CUDA(cudaMemcpyAsync(s.staging, in, bytes, cudaMemcpyDeviceToDevice, st));
    src = s.staging;
  } else if (s.ar->d_rank_data_base_ + s.ar->graph_unreg_buffers_.size() + 1 > s.ar->d_rank_data_end_) {
    return fail("vLLM's rank data is full (" + std::to_string(kRankDataBytes / sizeof(vllm::RankData)) + " captured calls)");
  }
  try {
    switch (dtype) {
      case kF32: launch<float>(s.ar, st, src, out, count, p.block_limit); break;
      case kF16: launch<half>(s.ar, st, src, out, count, p.block_limit); break;
      default: launch<nv_bfloat16>(s.ar, st, src, out, count, p.block_limit); break;
    }
  } catch (const std::exception& e) {
    return fail(std::string("vLLM: ") + e.what());
  }
  TRY_CUDA(cudaGetLastError());
  return 0;
}

// One all-gather on local rank `slot`, enqueued on `stream`: `count` elements of this rank's
// `in` to every rank, `out` (world x count elements) in rank order. vLLM's custom_all_gather:
// the input copied into the registered buffer, then cross_device_all_gather.
int tpar_peer_all_gather(void* h, int slot, void* stream, int dtype, const void* in, void* out, size_t count) {
  Peer& p = *static_cast<Peer*>(h);
  size_t bytes = count * elem_size(dtype);
  vllm::RankData* rd = agrs_check(p, slot, dtype, count, bytes, "all-gather");
  if (!rd) return -1;
  if (!p.full_nvlink) return fail("vLLM's custom all-gather runs only with full NVLink");
  cudaStream_t st = (cudaStream_t)stream;
  Slot& s = p.slots[slot];
  int per_rank = (int)(bytes / sizeof(vllm::CopyPack));
  int total = per_rank * p.world;
  int blocks = std::min(p.block_limit_agrs, (total + kThreads - 1) / kThreads);
  TRY_CUDA(cudaMemcpyAsync(s.staging, in, bytes, cudaMemcpyDeviceToDevice, st));
  if (!launch_ag_world(p.world, s.ar, st, rd, out, per_rank, blocks))
    return fail("vLLM's custom all-gather runs 2, 4, 6 or 8 ranks");
  TRY_CUDA(cudaGetLastError());
  return 0;
}

// One reduce-scatter on local rank `slot`, enqueued on `stream`: `in` holds world x count
// elements, `out` gets this rank's `count` of their sum over the ranks (slot `rank` of the
// all-reduce). vLLM's custom_reduce_scatter: the input copied into the registered buffer,
// then cross_device_reduce_scatter (an f32 sum in rank order, rounded once).
int tpar_peer_reduce_scatter(void* h, int slot, void* stream, int dtype, const void* in, void* out, size_t count) {
  Peer& p = *static_cast<Peer*>(h);
  size_t staged = count * elem_size(dtype) * (size_t)p.world;
  vllm::RankData* rd = agrs_check(p, slot, dtype, count, staged, "reduce-scatter");
  if (!rd) return -1;
  if (!p.full_nvlink) return fail("vLLM's custom reduce-scatter runs only with full NVLink");
  cudaStream_t st = (cudaStream_t)stream;
  Slot& s = p.slots[slot];
  int per_rank = (int)(count * elem_size(dtype) / 16);
  int blocks = std::min(p.block_limit_agrs, (per_rank + kThreads - 1) / kThreads);
  TRY_CUDA(cudaMemcpyAsync(s.staging, in, staged, cudaMemcpyDeviceToDevice, st));
  bool ok = false;
  switch (dtype) {
    case kF32: ok = launch_rs_world<float>(p.world, s.ar, st, rd, out, per_rank, blocks); break;
    case kF16: ok = launch_rs_world<half>(p.world, s.ar, st, rd, out, per_rank, blocks); break;
    default: ok = launch_rs_world<nv_bfloat16>(p.world, s.ar, st, rd, out, per_rank, blocks); break;
  }
  if (!ok) return fail("vLLM's custom reduce-scatter runs 2, 4, 6 or 8 ranks");
  TRY_CUDA(cudaGetLastError());
  return 0;
}

// Emulated ranks, after a capture: the k-th captured input of every rank is registered as the
// k-th call's peers (vLLM's register_graph_buffers, with the peers' own pointers).
int tpar_peer_register_graph_local(void* h) {
  Peer& p = *static_cast<Peer*>(h);
  if ((int)p.slots.size() != p.world) return fail("register_graph_local needs every rank in this process");
  size_t n = p.slots[0].ar->graph_unreg_buffers_.size();
  for (const Slot& s : p.slots) {
    if (s.ar->graph_unreg_buffers_.size() != n) return fail("ranks captured different numbers of calls");
  }
  TRY_CUDA(cudaSetDevice(p.device));
  for (Slot& s : p.slots) {
    std::vector<vllm::RankData> rd(n);
    for (size_t k = 0; k < n; k++) {
      for (const Slot& q : p.slots) rd[k].ptrs[q.rank] = q.ar->graph_unreg_buffers_[k];
    }
    if (s.ar->d_rank_data_base_ + n > s.ar->d_rank_data_end_) return fail("vLLM's rank data is full");
    if (n) TRY_CUDA(cudaMemcpy(s.ar->d_rank_data_base_, rd.data(), n * sizeof(vllm::RankData), cudaMemcpyHostToDevice));
  }
  for (Slot& s : p.slots) {
    s.ar->d_rank_data_base_ += n;
  }
  for (Slot& s : p.slots) s.ar->graph_unreg_buffers_.clear();
  // cudaMemcpy from pageable memory may return before the copy lands, and tpar's streams do
  // not wait for the legacy stream: the graph must not run before its peers are in place.
  TRY_CUDA(cudaDeviceSynchronize());
  return 0;
}

// Rank processes, after a capture: this rank's captured inputs as vLLM exports them
// (get_graph_buffer_ipc_meta): u64 n, n IPC handles, n i64 offsets. `len` gets the size; with
// `out` null only the size is returned.
int tpar_peer_graph_meta(void* h, unsigned char* out, size_t cap, size_t* len) {
  Peer& p = *static_cast<Peer*>(h);
  if (p.slots.size() != 1) return fail("graph_meta is for one rank per process");
  TRY_CUDA(cudaSetDevice(p.device));
  std::string blob;
  try {
    auto [handles, offsets] = p.slots[0].ar->get_graph_buffer_ipc_meta();
    write_u64(blob, offsets.size());
    blob += handles;
    for (int64_t o : offsets) write_u64(blob, (uint64_t)o);
  } catch (const std::exception& e) {
    return fail(std::string("vLLM: ") + e.what());
  }
  *len = blob.size();
  if (!out) return 0;
  if (cap < blob.size()) return fail("graph meta buffer too small");
  std::memcpy(out, blob.data(), blob.size());
  return 0;
}

// Rank processes: every rank's graph meta (rank order), registered (vLLM's
// register_graph_buffers: the peers' captured inputs opened by IPC).
int tpar_peer_register_graph(void* h, const unsigned char* const* metas, const size_t* lens) {
  Peer& p = *static_cast<Peer*>(h);
  if (p.slots.size() != 1) return fail("register_graph is for one rank per process");
  vllm::CustomAllreduce* ar = p.slots[0].ar;
  size_t n = ar->graph_unreg_buffers_.size();
  std::vector<std::string> handles(p.world);
  std::vector<std::vector<int64_t>> offsets(p.world);
  const size_t hs = sizeof(cudaIpcMemHandle_t);
  for (int r = 0; r < p.world; r++) {
    const unsigned char* c = metas[r];
    const unsigned char* end = c + lens[r];
    uint64_t m = 0;
    if (!read_u64(c, end, m) || m != n || (size_t)(end - c) < m * hs + m * 8)
      return fail("rank " + std::to_string(r) + " captured " + std::to_string(m) + " calls, this rank " + std::to_string(n));
    handles[r].assign((const char*)c, m * hs);
    c += m * hs;
    for (uint64_t k = 0; k < m; k++) {
      uint64_t o = 0;
      read_u64(c, end, o);
      offsets[r].push_back((int64_t)o);
    }
  }
  if (ar->d_rank_data_base_ + n > ar->d_rank_data_end_) return fail("vLLM's rank data is full");
  TRY_CUDA(cudaSetDevice(p.device));
  try {
    ar->register_graph_buffers(handles, offsets);
  } catch (const std::exception& e) {
    return fail(std::string("vLLM: ") + e.what());
  }
  TRY_CUDA(cudaDeviceSynchronize());  // as in register_graph_local
  return 0;
}

void tpar_peer_destroy(void* h) {
  Peer* p = static_cast<Peer*>(h);
  if (!p) return;
  cudaSetDevice(p->device);
  cudaDeviceSynchronize();
  for (Slot& s : p->slots) delete s.ar;  // closes the graph inputs it opened
  for (void* q : p->opened) cudaIpcCloseMemHandle(q);
  for (Slot& s : p->slots) {
    cudaFree(s.signal);
    cudaFree(s.staging);
    cudaFree(s.rank_data);
  }
  delete p;
}

}  // extern "C"
