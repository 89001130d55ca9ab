// Link probe kernels (tpar/src/cuda/probe.rs): bulk SM stores and SM loads into a target's
// memory (a peer GPU's, this GPU's own, or pinned host memory), and a one-thread flag
// ping-pong. Not an all-reduce: nothing here is in the algorithm registry.

struct ProbeArgs {
    unsigned long long target;  // memory stored to / loaded from
    unsigned long long bytes;   // multiple of 16
    unsigned long long sink;    // this GPU's memory: the loads' checksum lands here
    unsigned long long pad;
};

// Every thread stores 16-byte vectors, grid-strided: the pattern of tpar's push kernels.
extern "C" __global__ void probe_store(ProbeArgs a) {
    uint4* t = reinterpret_cast<uint4*>(a.target);
    unsigned long long n = a.bytes / 16;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned int v = (unsigned int)i;
        t[i] = make_uint4(v, v ^ 1u, v ^ 2u, v ^ 3u);
    }
}

// Every thread loads 16-byte vectors past the caches (ld.global.cv), grid-strided: the
// pattern of tpar's pull kernels. The xor keeps the loads alive.
extern "C" __global__ void probe_load(ProbeArgs a) {
    const uint4* t = reinterpret_cast<const uint4*>(a.target);
    unsigned long long n = a.bytes / 16;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = __ldcv(t + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) {
        reinterpret_cast<unsigned int*>(a.sink)[0] = acc;
    }
}

struct PingArgs {
    unsigned long long mine;    // the flag this side polls
    unsigned long long theirs;  // the flag this side stores to
    unsigned int iters;
    unsigned int role;          // 0 pings first, 1 answers
    unsigned long long deadline_ns;  // give up (flag stays unanswered) after this long
};

__device__ __forceinline__ unsigned long long probe_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ bool probe_wait(const volatile unsigned int* f, unsigned int want, unsigned long long end) {
    while (*f != want) {
        if (probe_clock_ns() > end) return false;
    }
    return true;
}

// One thread; with gridDim.x == 2 on one GPU, block b plays role b (flags in one memory).
extern "C" __global__ void probe_pingpong(PingArgs a) {
    if (threadIdx.x != 0) return;
    unsigned int role = gridDim.x == 2 ? blockIdx.x : a.role;
    volatile unsigned int* mine = reinterpret_cast<volatile unsigned int*>(gridDim.x == 2 && role == 1 ? a.theirs : a.mine);
    volatile unsigned int* theirs = reinterpret_cast<volatile unsigned int*>(gridDim.x == 2 && role == 1 ? a.mine : a.theirs);
    unsigned long long end = probe_clock_ns() + a.deadline_ns;
    for (unsigned int i = 1; i <= a.iters; ++i) {
        if (role == 0) {
            *theirs = i;
            __threadfence_system();
            if (!probe_wait(mine, i, end)) return;
        } else {
            if (!probe_wait(mine, i, end)) return;
            *theirs = i;
            __threadfence_system();
        }
    }
}
