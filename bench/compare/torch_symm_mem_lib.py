"""The measuring half of torch_symm_mem.py: its ranks, methods, inputs, checks and timers.

Imported by bench/compare/torch_symm_mem.py (which holds the command line, the records,
the table and the JSON; its docstring says what is measured and how). Importing this module
first enforces the multicast rule (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, set before torch loads; exit status 4 if any is set otherwise),
so it must be imported before anything else imports torch.
"""

import os
import sys

# NCCL, torch's symmetric memory and NVSHMEM read these once, when they load or first
# initialise, so they have to be in place before torch is imported at all. setdefault
# keeps a value the launcher already set; any value other than "off" is refused rather
# than overridden, so a misconfigured machine is noticed instead of silently patched.
REQUIRED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# 2 is left to argparse, which uses it for a bad command line.
EXIT_OK, EXIT_WRONG, EXIT_FATAL, EXIT_MULTICAST = 0, 1, 3, 4


def _enforce_multicast_off() -> None:
    bad = []
    for name, value in REQUIRED_ENV.items():
        os.environ.setdefault(name, value)
        if os.environ[name] != value:
            bad.append(f"{name}={os.environ[name]!r} (must be {value!r})")
    if bad:
        sys.stderr.write(
            "torch_symm_mem.py: NVLink multicast must stay off on this machine; "
            "refusing to run because " + "; ".join(bad) + "\n"
        )
        sys.exit(EXIT_MULTICAST)


_enforce_multicast_off()

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPE = torch.bfloat16
DTYPE_NAME = "bfloat16"
METHODS = ("torch-nccl", "symm-oneshot", "symm-twoshot")
MODES = ("eager", "graph")
# bf16 keeps 8 significant bits, so one rounding to nearest is off by at most 2^-8
# of the rounded value (the unit roundoff).
BF16_UNIT_ROUNDOFF = 2.0 ** -8
# PyTorch's CUDA-graph notes warm up on a side stream before capture (NCCL needs its
# communicator and buffers set up outside capture); they use three calls.
GRAPH_SIDE_STREAM_WARMUP_CALLS = 3
# The symmetric-memory kernels (CUDASymmetricMemoryOps.cu) check that the view's byte
# offset and byte size are multiples of max(4, element size); they dispatch only
# float32 and bfloat16 and only reduce_op "sum".
SYMM_MIN_ALIGNMENT_BYTES = 4
SEED_BASE = 0x7A_5EED


# --------------------------------------------------------------------------- helpers

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Byte counts as nccl-tests writes them: 1024, 1K, 16M, 1G (powers of 1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1024, 1K, 16M")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(m.group(1)) * scale


def size_list(lo: int, hi: int) -> list:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return sizes


def percentile(sorted_vals: list, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted input."""
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def short_error(exc: BaseException) -> str:
    # TORCH_CHECK messages carry a C++ backtrace after the first lines; the first
    # lines say what was wrong, and the JSON should stay readable.
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [
        ln for ln in text.splitlines()
        if ln.strip() and not ln.lstrip().startswith(("Exception raised from", "frame #"))
    ]
    return " | ".join(lines[:3])[:600]


def input_seed(rank: int, nbytes: int) -> int:
    return SEED_BASE + 1_000_003 * (rank + 1) + nbytes


def make_input(rank: int, nbytes: int) -> torch.Tensor:
    """Rank `rank`'s input for `nbytes`, on the CPU.

    Generated on the CPU so that every rank rebuilds every rank's input bit for bit,
    whatever GPU it runs on; zeros are replaced so that an op that skips an element
    can never look right by accident.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(input_seed(rank, nbytes))
    x = torch.randn(nbytes // 2, generator=gen, dtype=torch.float32).to(DTYPE)
    x[x == 0] = 1.0
    return x


# --------------------------------------------------------------------------- ranks


class Bench:
    """The process group and the cross-rank plumbing every measurement uses."""

    def __init__(self, args):
        self.args = args
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            if name not in os.environ:
                sys.stderr.write(
                    f"torch_symm_mem.py: {name} is not set; start it with "
                    "python3 -m torch.distributed.run --standalone --nproc-per-node N ...\n"
                )
                sys.exit(EXIT_FATAL)
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        # device_id binds the group to this GPU (barriers and object collectives then
        # know the device) and creates the NCCL communicator now, not inside a timing.
        # The timeout turns a rank stuck in a spinning kernel into an abort instead of
        # a hang past the session's limits.
        dist.init_process_group(
            backend="nccl",
            device_id=self.device,
            timeout=datetime.timedelta(seconds=args.timeout_s),
        )
        self.group = dist.group.WORLD
        self.group_name = self.group.group_name
        # All-reducing zeros keeps the value at zero however often it is used.
        self._meet = torch.zeros(1, dtype=torch.float32, device=self.device)
        self.symm_mem = None
        self.symm_buf = None
        self.symm_handle = None
        self.symm_reason = "symmetric memory not set up"
        self.symm_info = {}

    # Logging: progress from rank 0 only, so the stderr stays readable; problems from
    # whichever rank sees them.
    def log(self, msg: str) -> None:
        if self.rank == 0:
            sys.stderr.write(f"[torch_symm_mem] {msg}\n")
            sys.stderr.flush()

    def warn(self, msg: str) -> None:
        sys.stderr.write(f"[torch_symm_mem rank {self.rank}] {msg}\n")
        sys.stderr.flush()

    def sync_ranks(self) -> None:
        """Return only once every rank got here with its GPU idle.

        A host-blocking all-reduce of a tiny tensor: after the second synchronize every
        rank knows all others have drained their streams, so the timed work that follows
        starts within host jitter on all ranks and no earlier work leaks into it.
        """
        torch.cuda.synchronize()
        dist.all_reduce(self._meet, group=self.group)
        torch.cuda.synchronize()

    def agree(self, err):
        """All ranks learn whether any rank failed; returns the first failure or None.

        The ops under test fail on host-side checks that are the same on every rank, so
        all ranks normally fail together; this keeps them in lockstep even if not.
        """
        flag = torch.tensor([0 if err is None else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, group=self.group)
        if int(flag.item()) == 0:
            return None
        msgs = [None] * self.world
        dist.all_gather_object(msgs, err, group=self.group)
        for r, m in enumerate(msgs):
            if m is not None:
                return f"rank {r}: {m}"
        return "unknown failure on another rank"

    def sum_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return int(t.item())

    def max_across_ranks(self, samples: list) -> list:
        """Per iteration, the slowest rank's time: a collective ends when its last rank does."""
        mine = torch.tensor(samples, dtype=torch.float64, device=self.device)
        every = torch.empty(self.world * mine.numel(), dtype=torch.float64, device=self.device)
        dist.all_gather_into_tensor(every, mine, group=self.group)
        return every.view(self.world, -1).max(dim=0).values.tolist()

    def identical_across_ranks(self, out: torch.Tensor) -> bool:
        """Bitwise comparison of the whole output of every rank.

        Gathered as raw bytes so NaN payloads and signed zeros count too; cloned first so
        NCCL reads ordinary memory rather than a symmetric-memory mapping. 16 MiB x 4
        ranks fits easily.
        """
        mine = out.detach().reshape(-1).clone().view(torch.uint8)
        every = torch.empty(self.world * mine.numel(), dtype=torch.uint8, device=self.device)
        dist.all_gather_into_tensor(every, mine, group=self.group)
        rows = every.view(self.world, -1)
        return bool((rows == rows[0]).all().item())

    # ------------------------------------------------------------------ symmetric memory

    def _multicast_supported(self):
        """What symmetric memory says about multicast on this GPU (None: cannot ask)."""
        try:
            from torch._C._autograd import DeviceType
            from torch._C._distributed_c10d import _SymmetricMemory

            return bool(_SymmetricMemory.has_multicast_support(DeviceType.CUDA, self.device.index))
        except Exception as exc:  # an older or different build: record, do not guess
            self.symm_info["multicast_query_error"] = short_error(exc)
            return None

    def _rendezvous(self, buf):
        symm_mem = self.symm_mem
        try:
            return symm_mem.rendezvous(buf, self.group_name)
        except Exception:
            # Older releases needed the group enabled for symmetric memory first; current
            # ones deprecate the call as unnecessary, so it is only a fallback here.
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is None:
                raise
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(self.group_name)
            self.symm_info["enable_symm_mem_for_group_called"] = True
            return symm_mem.rendezvous(buf, self.group_name)

    def setup_symm(self, max_bytes: int) -> None:
        """One symmetric buffer of the largest size; every size uses a view of it.

        Views are fine: the ops take input.storage_offset() into account and the
        rendezvous is keyed on the storage, and PyTorch's own tests (and vLLM's
        SymmMemCommunicator) call them on slices of one buffer.
        """
        err = None
        multicast = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            self.symm_mem = symm_mem
            multicast = self._multicast_supported()
        except Exception as exc:
            err = f"cannot import torch.distributed._symmetric_memory: {short_error(exc)}"

        # The multicast check runs before any rendezvous: with the CUDA backend a
        # rendezvous on a multicast-capable GPU binds the buffer to a multicast object,
        # which is exactly what the rule forbids.
        flag = torch.tensor([1 if multicast else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, group=self.group)
        if int(flag.item()) != 0:
            self.warn(
                "symmetric memory reports NVLink multicast support although "
                "TORCH_SYMM_MEM_DISABLE_MULTICAST=1; refusing to run"
            )
            raise MulticastRuleError()
        self.symm_info["multicast_supported"] = multicast

        if err is None:
            try:
                try:
                    self.symm_info["backend"] = self.symm_mem.get_backend(self.device)
                except Exception:
                    self.symm_info["backend"] = None
                numel = max_bytes // 2
                buf = self.symm_mem.empty(numel, dtype=DTYPE, device=self.device)
                buf.zero_()
                hdl = self._rendezvous(buf)
                hdl_world = getattr(hdl, "world_size", self.world)
                if hdl_world != self.world:
                    raise RuntimeError(f"rendezvous world_size {hdl_world} != {self.world}")
                self.symm_buf = buf
                self.symm_handle = hdl
                self.symm_info["buffer_bytes"] = numel * 2
            except Exception as exc:
                err = f"symmetric buffer setup failed: {short_error(exc)}"
        err = self.agree(err)
        self.symm_reason = err
        self.symm_info["unavailable_reason"] = err
        if err is not None:
            self.log(f"symmetric memory unavailable, symm-* methods skipped: {err}")
            self.symm_buf = None

    def release_symm(self) -> None:
        self.symm_handle = None
        self.symm_buf = None


class MulticastRuleError(Exception):
    pass


# --------------------------------------------------------------------------- methods


class Method:
    """One all-reduce implementation. `call` is exactly what is timed."""

    name = "?"

    def __init__(self, bench: Bench):
        self.b = bench
        self.x = None

    def skip_reason(self, nbytes: int):
        return None

    def prepare(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def refill(self) -> None:
        """Put this rank's input back where an in-place op overwrote it.

        Done before every timed iteration (outside the events) so repeated in-place sums
        do not grow the data to inf/NaN; the kernels' speed does not depend on values, but
        the buffer then always holds what a real caller would pass.
        """

    def call(self):
        raise NotImplementedError

    def check_outputs(self) -> list:
        raise NotImplementedError

    def release(self) -> None:
        self.x = None


class TorchNccl(Method):
    name = "torch-nccl"

    def prepare(self, x):
        self.x = x
        self.t = x.clone()

    def refill(self):
        self.t.copy_(self.x)

    def call(self):
        dist.all_reduce(self.t, op=dist.ReduceOp.SUM, group=self.b.group)
        return self.t

    def check_outputs(self):
        # In place: the output is the input, so it cannot be poisoned; an element the
        # collective skipped keeps this rank's input, which is far from the sum.
        self.refill()
        self.call()
        return [("in-place", self.t)]

    def release(self):
        super().release()
        self.t = None


class SymmBase(Method):
    op_name = "?"

    def skip_reason(self, nbytes):
        if self.b.symm_buf is None:
            return self.b.symm_reason or "symmetric memory unavailable"
        if not hasattr(torch.ops.symm_mem, self.op_name):
            return f"torch.ops.symm_mem.{self.op_name} does not exist in torch {torch.__version__}"
        if nbytes % SYMM_MIN_ALIGNMENT_BYTES:
            return (
                f"{nbytes} B is not a multiple of {SYMM_MIN_ALIGNMENT_BYTES} B "
                "(symm_mem kernels need 4-byte-aligned sizes)"
            )
        cap = self.b.symm_buf.numel() * self.b.symm_buf.element_size()
        if nbytes > cap:
            return f"{nbytes} B exceeds the {cap} B symmetric buffer"
        return None

    def prepare(self, x):
        self.x = x
        # A view at offset 0 of the one symmetric buffer (see Bench.setup_symm).
        self.inp = self.b.symm_buf[: x.numel()]
        self.inp.copy_(x)

    def release(self):
        super().release()
        self.inp = None


class SymmOneShot(SymmBase):
    name = "symm-oneshot"
    op_name = "one_shot_all_reduce"
    # Out of place: the symmetric input is only read, so refill() has nothing to do.

    def call(self):
        return torch.ops.symm_mem.one_shot_all_reduce(self.inp, "sum", self.b.group_name)

    def check_outputs(self):
        outs = []
        # The timed op allocates its own output, which cannot be poisoned beforehand;
        # the _out variant runs the same kernel (one_shot_all_reduce_out_impl) into a
        # NaN-filled tensor, so an element it never writes shows up as non-finite.
        if hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            poisoned = torch.full_like(self.x, float("nan"))
            torch.ops.symm_mem.one_shot_all_reduce_out(
                self.inp, "sum", self.b.group_name, poisoned
            )
            outs.append(("out=, NaN-poisoned", poisoned))
        outs.append(("returned", self.call()))
        return outs


class SymmTwoShot(SymmBase):
    name = "symm-twoshot"
    op_name = "two_shot_all_reduce_"

    def refill(self):
        self.inp.copy_(self.x)

    def call(self):
        return torch.ops.symm_mem.two_shot_all_reduce_(self.inp, "sum", self.b.group_name)

    def check_outputs(self):
        # In place (see TorchNccl.check_outputs for why there is no poisoning).
        self.refill()
        self.call()
        return [("in-place", self.inp)]


METHOD_CLASSES = {cls.name: cls for cls in (TorchNccl, SymmOneShot, SymmTwoShot)}


# --------------------------------------------------------------------------- checks


def reference(bench: Bench, inputs_cpu: list, tol_factor: float):
    """Exact sum (float64 is exact for a few bf16 addends) and the per-element bound.

    Every implementation sums `world` bf16 values with world-1 roundings to bf16, in
    whatever order or tree: each is off by at most 2^-8 of a partial sum, and no partial
    sum exceeds sum_r |x_r|, so a right answer is within (world-1) * 2^-8 * sum_r |x_r|.
    The default factor max(2, world-1) is that bound. A flat 2 is too tight for 4 ranks:
    summing 4 random bf16 values in rank order with a bf16 rounding after each add (what
    the symm_mem kernels' load_and_reduce does) exceeds 2 * 2^-8 * sum |x| for about
    1 element in 10^4 (simulated: worst 2.58), which would flag correct results.
    """
    ref = torch.zeros(inputs_cpu[0].numel(), dtype=torch.float64, device=bench.device)
    mag = torch.zeros_like(ref)
    for x in inputs_cpu:
        xd = x.to(bench.device).double()
        ref += xd
        mag += xd.abs()
    tol = mag.mul_(tol_factor * BF16_UNIT_ROUNDOFF)
    return ref, tol


def count_wrong(out: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> int:
    o = out.detach().reshape(-1).double()
    # NaN fails every comparison, so non-finite values are counted explicitly.
    bad = ~torch.isfinite(o) | ((o - ref).abs() > tol)
    return int(bad.sum().item())


def check_point(bench: Bench, method: Method, x_dev, ref, tol):
    """Returns (wrong elements summed over ranks and outputs, identical, error)."""
    err, local_wrong, outs = None, 0, []
    try:
        method.prepare(x_dev)
        bench.sync_ranks()
        outs = method.check_outputs()
        torch.cuda.synchronize()
        local_wrong = sum(count_wrong(o, ref, tol) for _, o in outs)
    except Exception as exc:
        err = short_error(exc)
    err = bench.agree(err)
    if err is not None:
        return None, None, err
    # Every rank has the same number of outputs here, so the gathers line up.
    identical = True
    for _, o in outs:
        identical = bench.identical_across_ranks(o) and identical
    wrong = bench.sum_int(local_wrong)
    return wrong, identical, None


# --------------------------------------------------------------------------- timing


def time_eager(bench: Bench, method: Method, args) -> list:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = []
    for it in range(args.warmup + args.iters):
        method.refill()
        bench.sync_ranks()
        start.record()
        for _ in range(args.inner):
            method.call()
        end.record()
        end.synchronize()
        if it >= args.warmup:
            samples.append(start.elapsed_time(end) * 1000.0 / args.inner)
    return samples


def time_graph(bench: Bench, method: Method, args) -> list:
    graph = torch.cuda.CUDAGraph()
    try:
        method.refill()
        # Warm up on a side stream, as PyTorch's CUDA-graph notes require, so lazy
        # initialisation (NCCL buffers, symmetric-memory handle lookups, kernel loading)
        # happens outside the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_SIDE_STREAM_WARMUP_CALLS):
                method.call()
        torch.cuda.current_stream().wait_stream(side)
        bench.sync_ranks()

        # thread_local: ProcessGroupNCCL's watchdog thread queries CUDA events while this
        # thread captures; only this thread's calls should be able to spoil the capture.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(args.inner):
                method.call()
        bench.sync_ranks()

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        samples = []
        for it in range(args.warmup + args.iters):
            method.refill()
            bench.sync_ranks()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            if it >= args.warmup:
                samples.append(start.elapsed_time(end) * 1000.0 / args.inner)
        return samples
    finally:
        # Free the graph's private memory pool before the next point; after a failed
        # capture there may be nothing to free, which is fine.
        try:
            torch.cuda.synchronize()
            graph.reset()
        except Exception as exc:
            bench.warn(f"graph cleanup: {short_error(exc)}")
