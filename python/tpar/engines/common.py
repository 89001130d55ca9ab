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

import logging
import os
from contextlib import contextmanager
from typing import Optional

logger = logging.getLogger("tpar")

_SUPPORTED = None  # torch dtypes, filled on first use (importing tpar must not import torch)


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


class TparCustomAllreduce:
    """tpar behind the engines' custom all-reduce contract."""

    #: vLLM reads it (DeepSeek models on Hopper) to pick a path that all-gathers through its
    #: own custom all-gather; tpar has none (custom_all_gather returns None), so say no.
    fully_connected = False

    def __init__(self, group, device, max_size: int = 8192 * 1024, **_engine_options) -> None:
        import torch
        import torch.distributed as dist

        global _SUPPORTED
        _SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
        self.disabled = True
        self.original_disabled = True  # SGLang's piecewise graph runner toggles `disabled`
        self._IS_CAPTURING = False
        self._comm = None
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
        from tpar.torch import Communicator

        try:
            # `group` is the engine's CPU group: it carries tpar's rendezvous. Calls the plan
            # gives to NCCL never reach tpar (should_custom_ar says no), so tpar's own NCCL is
            # only a fallback for direct all_reduce() calls.
            self._comm = Communicator(group, device, max_bytes=self.max_size)
        except Exception as e:  # noqa: BLE001 - an engine must come up without tpar
            logger.warning("tpar: custom all-reduce disabled on rank %d: %s", self.rank, e)
            return
        self.disabled = False
        self.original_disabled = False
        _say("tpar: custom all-reduce on for rank %d of %d on %s (max %d bytes)", self.rank, self.world_size, device, self.max_size)

    # -- deciding --------------------------------------------------------------------------

    def should_custom_ar(self, inp) -> bool:
        """Yes where tpar's plan runs a kernel for this tensor; no where it says NCCL (the
        engine's NCCL then takes the call), for unsupported dtypes, non-contiguous tensors,
        addresses not 16-byte aligned and messages above ``max_size``."""
        if self.disabled or self._comm is None:
            return False
        if inp.dtype not in _SUPPORTED or not inp.is_contiguous() or inp.device != self._comm.device:
            return False
        nbytes = inp.numel() * inp.element_size()
        if nbytes == 0 or nbytes > self.max_size or inp.data_ptr() % 16 != 0:
            return False
        return self._comm.plan(inp) != "nccl"

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
        return self._comm.all_reduce(input)

    def custom_all_gather(self, inp):
        """vLLM asks its custom all-reduce for all-gathers too; None hands them to NCCL."""
        return None

    def custom_reduce_scatter(self, inp):
        """As :meth:`custom_all_gather`: None hands reduce-scatters to NCCL."""
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
            try:
                comm.close()
            except Exception as e:  # noqa: BLE001 - closing at shutdown must not raise
                logger.warning("tpar: close on rank %d: %s", self.rank, e)

    def __del__(self):
        # At interpreter exit peers may be gone: leave without the final barrier.
        comm = getattr(self, "_comm", None)
        if comm is not None and comm._native is not None:
            comm._native.close()
