"""The engines' own entry points, one class per engine, for scripts/engine_harness.py.

Each class drives one rank through the engine's unmodified code: its plug-in loader, its group
set-up, its eager all-reduce, its custom op, its ``graph_capture()``, and a read-back of what
tpar's plug-in changed in the engine's settings. A newer engine version whose entry points
moved gets its branch here; one that kept them needs only its line in
``scripts/engine_carry.py`` ENGINES.
"""

from __future__ import annotations

import os
import sys

#: The rank's environment before the engine and its plug-ins ran (imported before either).
ENV_AT_START = dict(os.environ)


class Skip(Exception):
    """A stage the engine cannot run here (reported as skipped, with the reason)."""


class Engine:
    """The engine's own entry points for one rank."""

    def settings(self, tpar_log):  # what the plug-in changed, read back through the engine
        raise NotImplementedError

    name: str
    tp: object  # the TP GroupCoordinator
    ca: object  # its custom all-reduce object

    def ar(self, x):  # the engine's eager all-reduce
        raise NotImplementedError

    def op(self, x):  # the engine's custom op (what torch.compile'd models call)
        raise NotImplementedError

    def op_unavailable(self, dev):  # why `op` cannot run on `dev`, or None
        return None

    def sp_functions(self):  # the engine's sequence-parallel all-gather and reduce-scatter
        raise Skip(f"{self.name} has no sequence-parallel functions that reach a custom collective")

    def dp_functions(self):  # the engine's DP-attention gather and scatter, as sp_functions
        raise Skip(f"{self.name} has no DP-attention gather routed to tpar")

    def graph_capture(self):
        raise NotImplementedError


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, rank, world, init, device):
        import torch

        from vllm.plugins import load_general_plugins

        load_general_plugins()  # the plug-in loader every vLLM process runs
        from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        self.ps = ps
        self.device = device
        # external_launcher: every rank process is started by someone else (here the harness,
        # as torchrun would); vLLM's default "mp" refuses a TP size above the GPUs it counts.
        backend = "external_launcher" if device.type == "cuda" else None
        cfg = VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world, distributed_executor_backend=backend))
        self._cfg_ctx = set_current_vllm_config(cfg)
        self._cfg_ctx.__enter__()  # what vLLM's worker holds while it builds its groups
        ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method="file://" + init, local_rank=0, backend="gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=world)
        self.tp = ps.get_tp_group()
        if device.type == "cpu":
            # A CPU platform gives the group vLLM's CpuCommunicator; build the CUDA one (the
            # class under test) on the same groups, as vLLM does on a GPU.
            from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

            self.tp.device_communicator = CudaCommunicator(
                cpu_group=self.tp.cpu_group, device=torch.device("cpu"), device_group=self.tp.device_group, unique_name=self.tp.unique_name
            )
        self.ca = self.tp.device_communicator.ca_comm
        from vllm.distributed.communication_op import tensor_model_parallel_all_reduce

        self._ar = tensor_model_parallel_all_reduce

    def ar(self, x):
        return self._ar(x)

    def settings(self, tpar_log):
        """What the plug-in changed in vLLM's own settings, read back through vLLM."""
        import vllm.envs as envs
        from vllm.ray.ray_env import get_env_vars_to_copy

        from tpar.engines import vllm as plugin

        comm = self.tp.device_communicator
        got = {
            "flashinfer_env": os.environ.get("VLLM_ALLREDUCE_USE_FLASHINFER"),
            "use_flashinfer_allreduce": bool(comm.use_flashinfer_allreduce),
            "ray_copies_tpar": sorted(v for v in get_env_vars_to_copy() if v.startswith("TPAR_")),
            # Reported, not required: without FlashInfer (a CPU) vLLM has no fused op to route.
            "fusion_routed": getattr(sys.modules.get(plugin.fusion.VLLM_MODULE), "_tpar_original_" + plugin.fusion.VLLM_OP_ATTR, None) is not None,
            "batch_invariant": bool(self.ca.batch_invariant) == bool(envs.VLLM_BATCH_INVARIANT),
        }
        problems = []
        if "VLLM_ALLREDUCE_USE_FLASHINFER" not in ENV_AT_START and (got["use_flashinfer_allreduce"] or got["flashinfer_env"] != "0"):
            problems.append("FlashInfer's all-reduce is still asked before tpar")
        if "TPAR_ENABLE" not in got["ray_copies_tpar"]:
            problems.append(f"TPAR_ENABLE would not reach Ray workers ({got['ray_copies_tpar']})")
        if not got["batch_invariant"]:
            problems.append("batch invariance differs from VLLM_BATCH_INVARIANT")
        if problems:
            raise RuntimeError("; ".join(problems) + f" ({got})")
        return {"checked": got, "cases": 1}

    def op(self, x):
        import torch

        return torch.ops.vllm.all_reduce(x, group_name=self.tp.unique_name)

    def sp_functions(self):
        """vLLM's sp_all_gather / sp_reduce_scatter (models/common/ops/sequence_parallel.py,
        DeepSeek-V4, Qwen4 and Muse Spark's sequence-parallel decode): the TP group's
        ``custom_all_gather`` / ``custom_reduce_scatter``, else its NCCL (here gloo)."""
        from vllm.models.common.ops.sequence_parallel import sp_all_gather, sp_reduce_scatter

        return sp_all_gather, sp_reduce_scatter

    def graph_capture(self):
        return self.ps.graph_capture(self.device)


class SglangEngine(Engine):
    name = "sglang"

    def __init__(self, rank, world, init, device):
        from sglang.srt.plugins import load_plugins

        load_plugins()  # the plug-in loader every SGLang scheduler process runs
        from sglang.srt.distributed import parallel_state as ps

        self.ps = ps
        self.device = device
        ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method="file://" + init, local_rank=0, backend="gloo")
        # initialize_model_parallel builds the TP group with this call and pynccl on; NCCL
        # refuses ranks sharing a GPU, so the same call with use_pynccl=False.
        self.tp = ps.init_model_parallel_group(
            [list(range(world))], ps.get_world_group().local_rank, "gloo", use_pynccl=False, group_name="tp"
        )
        ps._TP = self.tp  # what initialize_model_parallel stores
        self.ca = self.tp.ca_comm

    def ar(self, x):
        if x.is_cpu:
            # SGLang sends CPU tensors to shared memory before its dispatch, and registers its
            # all-reduce op for CUDA only: call the dispatch and what the op runs.
            return self.tp._all_reduce_out_place(x, self.tp._resolve_outplace_all_reduce_method(x) or "auto")
        return self.tp.all_reduce(x)

    def settings(self, tpar_log):
        """tpar's dispatcher replaced SGLang's, and checks SGLang's calls."""
        import sglang.srt.distributed.device_communicators.custom_all_reduce as m

        from tpar.engines import sglang as plugin

        if m.dispatch_custom_allreduce is not plugin.dispatch_custom_allreduce:
            raise RuntimeError(f"SGLang's dispatch_custom_allreduce is {m.dispatch_custom_allreduce!r}, not tpar's")
        if m.dispatch_custom_allreduce(group=self.tp.cpu_group, device=self.device) is not plugin.SglangCustomAllreduce:
            raise RuntimeError("tpar's dispatcher did not return tpar's class for SGLang's call")
        try:
            m.dispatch_custom_allreduce(group=self.tp.cpu_group, device=self.device, not_a_parameter=1)
            raise RuntimeError("tpar's dispatcher accepted a call SGLang's original would refuse")
        except TypeError:
            pass
        return {"checked": {"dispatch": "tpar's, checked against the original's signature"}, "cases": 1}

    def op_unavailable(self, dev):
        if dev.type == "cpu":
            return "SGLang registers its all-reduce op (sglang::outplace_all_reduce) for CUDA only"
        return None

    def op(self, x):
        return self.ps.outplace_all_reduce(x, group_name=self.tp.unique_name, outplace_all_reduce_method="auto")

    def graph_capture(self):
        return self.tp.graph_capture()

    def dp_functions(self):
        """SGLang's DP-attention gather and scatter (``layers/dp_attention.py``), as the
        engine runs them with one attention-TP rank per DP rank (``--tp N --dp N
        --enable-dp-attention``): ``dp_gather_partial`` with the MAX_LEN padding (every DP
        rank's rows padded to one length: ``tp_group.all_gather_into_tensor``) and
        ``dp_reduce_scatter_tensor`` (``tp_size == attn_dp_size``:
        ``tp_group.reduce_scatter_tensor``), each reaching ``GroupCoordinator``'s
        ``_all_gather_into_tensor`` / ``_reduce_scatter_tensor``, which tpar's plug-in wraps.

        What the server would have set is set through SGLang's own API: the parallel
        layout (``get_parallel().override_permanently``, validated by SGLang) and the batch's
        padding mode (``dp_padding_mode``, the one field of ``ForwardBatch`` the gather
        reads). The scatter's input is the gathered buffer, ``world`` equal slots: rows the
        harness gives beyond a whole number of slots are padded with zeros, as the server's
        buffer is. On a CPU, the path is the one SGLang takes on CUDA: its
        ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` call its custom ops
        ``sglang::reg_all_gather_into_tensor`` / ``reg_reduce_scatter_tensor`` (opaque to
        Dynamo), whose body calls the wrapped method; SGLang registers the ops' body for
        CUDA only, so the harness registers the same body for CPU tensors too."""
        import inspect
        import types

        import torch

        from sglang.srt.layers import dp_attention as dpa
        from sglang.srt.runtime_context import get_parallel

        world, rank = self.tp.world_size, self.tp.rank_in_group
        if self.device.type == "cpu" and getattr(self, "_cpu_ops", None) is None:
            lib = torch.library.Library("sglang", "IMPL")
            for op in (self.ps.reg_all_gather_into_tensor, self.ps.reg_reduce_scatter_tensor):
                lib.impl(op.__name__, inspect.unwrap(op), "CPU")  # SGLang's own op body
            self._cpu_ops = lib  # kept: the registration lasts as long as the Library
        get_parallel().override_permanently(
            tp_group=self.tp, tp_size=world, tp_rank=rank, attn_tp_size=1, attn_tp_rank=0, attn_dp_size=world, attn_dp_rank=rank, attn_cp_size=1, attn_cp_rank=0
        )
        batch = types.SimpleNamespace(dp_padding_mode=dpa.DpPaddingMode.MAX_LEN)

        def gather(local):
            out = local.new_empty((world * local.shape[0],) + tuple(local.shape[1:]))
            dpa.dp_gather_partial(out, local, batch)
            return out

        def scatter(global_):
            pad = -global_.shape[0] % world
            if pad:
                global_ = torch.nn.functional.pad(global_, (0, 0, 0, pad))
            out = global_.new_empty((global_.shape[0] // world,) + tuple(global_.shape[1:]))
            dpa.dp_reduce_scatter_tensor(out, global_)
            return out

        return gather, scatter

