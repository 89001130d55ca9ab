"""The class both engines instantiate in place of their own custom all-reduce.

The contract (the engines' ``custom_all_reduce.py``): ``__init__(group, device, max_size=...,
**more)`` with ``group`` a CPU (gloo) group; ``disabled`` (and SGLang's ``original_disabled``);
``should_custom_ar(x)``; ``custom_all_reduce(x) -> Tensor | None`` (out of place);
``all_reduce(x, *, out=None, registered=False)``; ``capture()``, a context manager the engine
enters around CUDA-graph capture; ``register_graph_buffers()``; ``close()``.

Where tpar differs from the engines' own classes, on purpose:
- ``should_custom_ar`` says yes wherever tpar's plan has a kernel for this fabric and message
  (above all on PCIe with more than two GPUs, where both engines say no) and no where the plan
  says NCCL, so that the engine's own NCCL serves those calls (no second NCCL is used).
- Nothing is registered: tpar's kernels copy through tpar's own workspace, so captured
  addresses need no IPC registration and ``register_graph_buffers`` does nothing.
- Warm-up calls inside ``capture()`` that are not being captured communicate for real (the
  engines return ``torch.empty_like`` there to mimic their allocation pattern); every rank
  makes the same warm-up calls, and the results are correct rather than uninitialised.
"""

from __future__ import annotations

import inspect
import logging
import os
import weakref
from contextlib import contextmanager
from typing import Optional

logger = logging.getLogger("tpar")

_SUPPORTED = None  # torch dtypes, filled on first use (importing tpar must not import torch)

#: Drop-ins by their communicator's handle: what the compiled all-gathers and reduce-scatters
#: run on (``tpar::engine_all_gather`` / ``tpar::engine_reduce_scatter``, registered with the
#: first drop-in: importing tpar must not import torch). Weak: the engine owns its drop-ins.
_dropins = weakref.WeakValueDictionary()
_engine_ops = []


def _register_engine_ops() -> None:
    """The ops a compiled ``custom_all_gather`` / ``custom_reduce_scatter`` emits. Dynamo
    cannot trace the eager decision (it reads data pointers and asks tpar's plan, whose answer
    depends on a size that is symbolic under vLLM's dynamic batch), and vLLM's contract —
    None sends the call to the engine's NCCL — is a branch a graph cannot take at run time.
    So the compiled call is one opaque op that decides when it runs: tpar's kernel where the
    drop-in takes the call eagerly, else the engine's own fallback (:meth:`_engine_fallback`).
    The output's shape is the collective's either way."""
    if _engine_ops:
        return
    import torch

    if not (hasattr(torch, "library") and hasattr(torch.library, "custom_op")):
        return

    @torch.library.custom_op("tpar::engine_all_gather", mutates_args=(), schema="(Tensor x, int world, int handle) -> Tensor")
    def engine_all_gather(x: torch.Tensor, world: int, handle: int) -> torch.Tensor:
        return _dropin(handle)._decide_when_run("all-gather", x)

    @engine_all_gather.register_fake
    def _(x: torch.Tensor, world: int, handle: int) -> torch.Tensor:
        return x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))

    @torch.library.custom_op("tpar::engine_reduce_scatter", mutates_args=(), schema="(Tensor x, int world, int handle) -> Tensor")
    def engine_reduce_scatter(x: torch.Tensor, world: int, handle: int) -> torch.Tensor:
        return _dropin(handle)._decide_when_run("reduce-scatter", x)

    @engine_reduce_scatter.register_fake
    def _(x: torch.Tensor, world: int, handle: int) -> torch.Tensor:
        return x.new_empty((x.shape[0] // world,) + tuple(x.shape[1:]))

    _engine_ops.extend([engine_all_gather, engine_reduce_scatter])


def _dropin(handle: int) -> "TparCustomAllreduce":
    d = _dropins.get(handle)
    if d is None:
        from tpar import InvalidArgumentError

        raise InvalidArgumentError(f"invalid argument `handle`: no open tpar drop-in has handle {handle}")
    return d


def enabled() -> bool:
    """Whether ``TPAR_ENABLE`` switches the drop-ins on (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("TPAR_ENABLE", "").strip().lower() in ("1", "true", "yes", "on")


def patch_engine(engine: str, module: str, attr: str, replacement) -> None:
    """Replaces ``module.attr`` with ``replacement`` when ``TPAR_ENABLE`` is on: the one
    mechanism behind both plug-ins. Idempotent; the original is kept as
    ``module._tpar_original_<attr>``; an engine that cannot be imported is logged, never
    raised (the engine must start without tpar)."""
    if not enabled():
        return
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the engine must start without tpar
        logger.warning("tpar: cannot patch %s (%s): %s", engine, module, e)
        return
    if getattr(mod, attr, None) is replacement:
        return
    setattr(mod, "_tpar_original_" + attr, getattr(mod, attr, None))
    setattr(mod, attr, replacement)
    _say("tpar: %s's %s replaced by tpar (TPAR_ENABLE=1)" % (engine, attr))


def _capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


def _debug() -> bool:
    """``TPAR_DEBUG=INFO``, as tpar's native settings module parses it (a malformed value is
    reported by the communicator, which refuses to start)."""
    try:
        from tpar._tpar import debug_logging

        return debug_logging()
    except Exception:  # noqa: BLE001 - logging must never stop an engine
        return False


def _say(msg: str, *args) -> None:
    """Logged at INFO; with ``TPAR_DEBUG=INFO`` also printed to stderr (engines often raise
    their own loggers' levels)."""
    logger.info(msg, *args)
    if _debug():
        import sys

        print("tpar INFO " + (msg % args if args else msg), file=sys.stderr, flush=True)


#: Algorithms whose sum is not the rank-order float32 sum rounded once (docs/architecture.md):
#: ``hierarchical`` adds island sums, NCCL its own order. Every other tpar kernel gives
#: bitwise the same result for a message, whichever runs, so a batch-invariant engine may
#: use any of them.
NOT_RANK_ORDER = frozenset({"hierarchical", "nccl", "none"})

#: Python memo of the routes asked (per dtype, bytes and capture state): bounded so that an
#: engine calling with ever new sizes cannot grow it without end (a decode step has a few
#: dozen distinct sizes; prefill adds one per batch length).
PLAN_MEMO_LIMIT = 4096


def _host_key():
    """(host name, kernel boot id): ranks that differ in either are not on one host."""
    import socket

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return (socket.gethostname(), boot)


def spans_hosts(group) -> Optional[str]:
    """None when every rank of ``group`` (a CPU group) runs on this host, else a message
    naming the ranks and hosts. A collective over the group: every rank calls it."""
    import torch.distributed as dist

    keys = [None] * dist.get_world_size(group)
    dist.all_gather_object(keys, _host_key(), group=group)
    hosts = {}
    for r, k in enumerate(keys):
        hosts.setdefault(tuple(k), []).append(r)
    if len(hosts) == 1:
        return None
    parts = ["ranks %s on %s" % (_ranges(rs), k[0] + (" (boot id %s)" % k[1][:8] if k[1] else "")) for k, rs in hosts.items()]
    return "the group spans %d hosts (%s); tpar serves the GPUs of one host" % (len(hosts), "; ".join(parts))


def _ranges(rs):
    out, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else "%d-%d" % (start, a))
            start = b
    return ",".join(out)


class TparCustomAllreduce:
    """tpar behind the engines' custom all-reduce contract."""

    #: vLLM reads it (DeepSeek-V4.1 on Hopper) to shard a projection by token and all-gather its
    #: output through ``custom_all_gather`` (vLLM's own class sets it where every pair of GPUs
    #: has NVLink). tpar leaves it False, so the model keeps its unsharded path: a choice about
    #: the fabric that tpar's plan has not been tested making for the engine.
    fully_connected = False
    #: vLLM's DeepSeek-V4.1 fused all-reduce + mHC kernel needs the custom all-reduce's NVLink
    #: multicast buffers (``ops/mhc.py`` reads this pointer through an alias of ``ca_comm``);
    #: tpar never uses multicast (it can take a shared host's GPUs out of service), so 0: no.
    mnnvl_lamport_ag_multicast_ptr = 0
    #: SGLang's NVLink vocab gather asks ``getattr(ca_comm, "has_multicast", False)``: no.
    has_multicast = False

    #: Set by an engine's subclass when the engine promises batch-invariant results
    #: (vLLM's ``VLLM_BATCH_INVARIANT``); see :meth:`should_custom_ar`.
    batch_invariant = False

    def __init__(self, group, device, max_size: int = 8192 * 1024, **_engine_options) -> None:
        import torch
        import torch.distributed as dist

        global _SUPPORTED
        _SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
        self.disabled = True
        self.original_disabled = True  # SGLang's class keeps it equal to `disabled`
        self._IS_CAPTURING = False  # SGLang reads it (getattr) to pick its registered paths
        self._comm = None
        self._routes = {}  # (collective, dtype, nbytes, capturing) -> route (see _route)
        self._chunks = {}  # batch-invariant splits: (dtype, nbytes, capturing) -> chunk elements
        self.group = group
        self.max_size = int(max_size)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if isinstance(device, int):
            device = torch.device("cuda", device)
        elif isinstance(device, str):
            device = torch.device(device)
        self.device = device
        if self.world_size == 1:
            return
        try:
            # Before tpar's rendezvous: a group across hosts would otherwise wait out the
            # timeout there (rank 0's socket is local).
            why = spans_hosts(group)
        except Exception as e:  # noqa: BLE001 - an engine must come up without tpar
            why = "cannot compare the ranks' hosts: %s" % e
        if why:
            if self.rank == 0:
                logger.warning("tpar: custom all-reduce off for this group: %s; the engine's NCCL serves it", why)
            return
        from tpar.torch import Communicator

        options = {}
        if "join_nccl" in inspect.signature(Communicator.__init__).parameters:
            # The engine's NCCL serves every call the plan gives to NCCL (should_custom_ar
            # says no): tpar joins none of its own.
            options["join_nccl"] = False
        try:
            self._comm = Communicator(group, device, max_bytes=self.max_size, **options)
        except Exception as e:  # noqa: BLE001 - an engine must come up without tpar
            logger.warning("tpar: custom all-reduce disabled on rank %d: %s", self.rank, e)
            return
        self._engine_checks()
        self.disabled = False
        self.original_disabled = False
        _register_engine_ops()
        _dropins[self._comm.handle] = self
        _say("tpar: custom all-reduce on for rank %d of %d on %s (max %d bytes%s)", self.rank, self.world_size, device,
             self.max_size, ", batch-invariant" if self.batch_invariant else "")

    def _engine_checks(self) -> None:
        """An engine's subclass warns here about settings that take calls away from tpar
        (it must not raise)."""

    # -- deciding --------------------------------------------------------------------------

    def _route(self, inp, nbytes: int, collective: str = "all-reduce", per_rank=None) -> str:
        """The algorithm tpar runs for ``collective`` of ``inp`` (``nbytes``; ``per_rank``:
        the tensor the plan counts, the all-gather's input or the reduce-scatter's output)
        now: asked once per collective, dtype, size and capture state, then remembered
        (engines ask several times per call)."""
        capturing = self._comm._cuda and _capturing()
        key = (collective, inp.dtype, nbytes, capturing)
        r = self._routes.get(key)
        if r is None:
            if len(self._routes) >= PLAN_MEMO_LIMIT:
                self._routes.clear()
            if collective == "all-reduce":
                r = self._comm.plan(inp)
            else:
                r = self._comm.plan_collective(collective, per_rank)
            self._routes[key] = r
        return r

    def _eligible(self, inp) -> bool:
        """Whether tpar can take ``inp`` at all: on, a supported dtype, contiguous, on this
        communicator's device, 16-byte aligned."""
        if self.disabled or self._comm is None:
            return False
        if inp.dtype not in _SUPPORTED or not inp.is_contiguous() or inp.device != self._comm.device:
            return False
        return inp.data_ptr() % 16 == 0

    def should_custom_ar(self, inp) -> bool:
        """Yes where tpar's plan runs a kernel for this tensor; no where it says NCCL (the
        engine's NCCL then takes the call), for unsupported dtypes, non-contiguous tensors,
        addresses not 16-byte aligned and messages above ``max_size``.

        Batch-invariant (:attr:`batch_invariant`): yes for every eligible size, above
        ``max_size`` too, so that no size goes to NCCL's order; each call then runs through
        kernels that sum in rank order (chunked where the plan would pick NCCL or
        ``hierarchical``), bitwise the same for every size. Where even the smallest chunk
        would not, no."""
        if not self._eligible(inp):
            return False
        nbytes = inp.numel() * inp.element_size()
        if nbytes == 0:
            return False
        if self.batch_invariant:
            return self._chunk(inp, nbytes) is not None
        if nbytes > self.max_size:
            return False
        return self._route(inp, nbytes) not in NOT_RANK_ORDER

    def _chunk(self, inp, nbytes: int) -> Optional[int]:
        """Batch-invariant calls: the chunk (elements) that splits this message into calls
        tpar runs in rank order (the whole message when it already is one), or None."""
        capturing = self._comm._cuda and _capturing()
        key = (inp.dtype, nbytes, capturing)
        if key in self._chunks:
            return self._chunks[key]
        esize = inp.element_size()
        n = nbytes // esize
        unit = max(1, 16 // esize)  # chunks start 16-byte aligned

        flat = inp.view(-1)

        def rank_order(count):
            return count == 0 or self._route(flat[:count], count * esize) not in NOT_RANK_ORDER

        c = min(n, self.max_size // esize // unit * unit)
        found = None
        while c >= 1:
            if rank_order(c) and rank_order(n % c):
                found = c
                break
            c = c // 2 // unit * unit if c > unit else 0
        self._chunks[key] = found
        return found

    # -- reducing --------------------------------------------------------------------------

    def all_reduce(self, inp, *, out=None, registered: bool = False):
        """Out-of-place all-reduce into ``out`` (a new tensor when None). ``registered`` is
        accepted for the contract; tpar needs no registered buffers."""
        return self._comm.all_reduce(inp, out=out)

    def custom_all_reduce(self, input) -> Optional[object]:  # noqa: A002 - the engines' name
        """The engines' entry point: the sum in a new tensor, or None when tpar does not take
        the call."""
        if self.disabled or not self.should_custom_ar(input):
            return None
        if self.batch_invariant:
            nbytes = input.numel() * input.element_size()
            c = self._chunk(input, nbytes)
            if c < input.numel():
                return self._chunked(input, c)
        return self._comm.all_reduce(input)

    def _chunked(self, inp, c: int):
        """``inp`` reduced in chunks of ``c`` elements (every rank splits alike: same sizes)."""
        import torch

        out = torch.empty_like(inp)
        flat_in, flat_out = inp.view(-1), out.view(-1)
        for s in range(0, flat_in.numel(), c):
            self._comm.all_reduce(flat_in[s : s + c], out=flat_out[s : s + c])
        return out

    @property
    def served_calls(self) -> int:
        """How many reductions tpar ran for this group on this rank (its communicator's
        ``served_calls``: a batch-invariant call split into chunks counts once per chunk).
        A call the engine's own fallback took does not count, whatever ``should_custom_ar``
        said; the engines' tests read it to tell tpar's calls from the fallback's."""
        return self._comm.served_calls if self._comm is not None else 0

    def _takes_collective(self, collective: str, inp, per_rank) -> bool:
        """Whether tpar runs ``collective`` of ``inp`` (``per_rank``: the all-gather's input,
        the reduce-scatter's output, as tpar's plan counts it): eligible tensors as for the
        all-reduce, whole 16-byte vectors per rank (tpar's kernels' rule; NCCL takes other
        sizes anyway), at most ``max_size`` bytes per rank, and a route that is tpar's
        kernel (every one of them sums in rank order)."""
        if not self._eligible(inp):
            return False
        nbytes = per_rank.numel() * per_rank.element_size()
        if nbytes == 0 or nbytes % 16 != 0 or nbytes > self.max_size:
            return False
        return self._route(inp, nbytes, collective, per_rank) not in NOT_RANK_ORDER

    def _compiled_op(self, inp) -> bool:
        """Whether this call is being traced by Dynamo and goes into the graph as tpar's op:
        only facts a trace can hold (on, a dtype tpar supports, this device, more than one
        rank); the rest is decided when the op runs."""
        import torch

        if not torch.compiler.is_compiling() or not _engine_ops:
            return False
        if self.disabled or self._comm is None or self.world_size < 2:
            return False
        return inp.dtype in _SUPPORTED and inp.device == self._comm.device

    def _decide_when_run(self, collective: str, inp):
        """A compiled call's op, running: tpar's kernel where the eager drop-in takes the
        call, else the engine's fallback (what vLLM's caller runs on None)."""
        out = self.custom_all_gather(inp) if collective == "all-gather" else self.custom_reduce_scatter(inp)
        return out if out is not None else self._engine_fallback(collective, inp)

    def _engine_fallback(self, collective: str, inp):
        """The engine's own path for a call the drop-in declines (an engine subclass knows
        it); raises where none is known."""
        from tpar import UnsupportedError

        raise UnsupportedError(f"a compiled {collective} that tpar declines: this engine's drop-in names no fallback for it")

    def custom_all_gather(self, inp):
        """vLLM's ``custom_all_gather``: every rank's ``inp`` concatenated along dim 0
        (``[n * world, ...]``), a bitwise copy, in a new tensor; None where tpar's plan gives
        the call to NCCL (or the tensor is not eligible): the engine's NCCL then runs it.
        Compiled (Dynamo tracing): one ``tpar::engine_all_gather`` op that decides when it
        runs (:func:`_register_engine_ops`)."""
        if self._compiled_op(inp):
            import torch

            return torch.ops.tpar.engine_all_gather(inp.contiguous(), self.world_size, self._comm.handle)
        if not self._takes_collective("all-gather", inp, inp):
            return None
        out = inp.new_empty((inp.shape[0] * self.world_size,) + tuple(inp.shape[1:]))
        return self._comm.all_gather_into_tensor(out, inp)

    def custom_reduce_scatter(self, inp):
        """vLLM's ``custom_reduce_scatter``: this rank's share along dim 0 of the sum
        (``[n / world, ...]``), summed in rank order (bitwise slice ``rank`` of tpar's
        all-reduce), in a new tensor; None where dim 0 does not split into ``world`` parts or
        tpar's plan gives the call to NCCL. Compiled: one ``tpar::engine_reduce_scatter`` op,
        as :meth:`custom_all_gather`."""
        if inp.dim() == 0 or inp.shape[0] % self.world_size != 0:
            return None
        if self._compiled_op(inp):
            import torch

            return torch.ops.tpar.engine_reduce_scatter(inp.contiguous(), self.world_size, self._comm.handle)
        n = inp.shape[0] // self.world_size
        # The plan counts the output; a view of that shape asks it without allocating one
        # for calls that go to NCCL.
        if self._takes_collective("reduce-scatter", inp, inp[:n]):
            out = inp.new_empty((n,) + tuple(inp.shape[1:]))
            return self._comm.reduce_scatter_tensor(out, inp)
        if self.batch_invariant:
            # One order at every size: where the plan would give this reduce-scatter to NCCL,
            # tpar's all-reduce (rank order, chunked as needed) and this rank's slice of it:
            # the same bits as tpar's reduce-scatter would give.
            full = self.custom_all_reduce(inp)
            if full is not None:
                return full[self.rank * n:(self.rank + 1) * n].clone()
        return None

    @contextmanager
    def capture(self):
        """Entered by the engines around CUDA-graph capture. tpar reads the capture state
        from the stream itself; the block is ``tpar.torch.Communicator.capture``: the calls
        captured inside carry no per-call check on the device, and the ranks' captured
        sequences are compared when it ends (``MismatchError`` on every rank if they differ)."""
        if self._comm is None:
            yield
            return
        try:
            self._IS_CAPTURING = True
            with self._comm.capture():
                yield
        finally:
            self._IS_CAPTURING = False
            if not self.disabled:
                self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        """Nothing to register: tpar copies through its own workspace."""

    def check(self) -> None:
        """Raises any error tpar's kernels recorded (waits for the current stream)."""
        if self._comm is not None:
            self._comm.check()

    def close(self) -> None:
        comm, self._comm = self._comm, None
        self.disabled = True
        if comm is not None:
            _dropins.pop(comm.handle, None)
            try:
                comm.close()
            except Exception as e:  # noqa: BLE001 - closing at shutdown must not raise
                logger.warning("tpar: close on rank %d: %s", self.rank, e)

    def __del__(self):
        # At interpreter exit peers may be gone: leave without the final barrier.
        comm = getattr(self, "_comm", None)
        if comm is not None and comm._native is not None:
            comm._native.close()
