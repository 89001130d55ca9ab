"""The all-reduces peers_multi_gpu.py times: torch's NCCL, tpar, FlashInfer's PCIe IPC
all-reduce and b12x's one-shot and copy-engine all-reduces, one class each.

Imported by bench/compare/peers_multi_gpu.py (its docstring says how they are checked and
timed). Nothing here imports torch or a peer's package at import time: each method imports
what it needs in `setup`, after the script has set NCCL_NVLS_ENABLE=0 and started its ranks.
"""

# The peers move whole 16-byte packs (FlashInfer: PACK_BYTES; b12x: 16-byte alignment;
# b12x's copy-engine ring also shards by world x 8 elements, checked per size below).
PACK_BYTES = 16
# Versions these calls were written against (read from their wheels' source).
PINNED = {"flashinfer": "flashinfer-python 0.7.2.post1", "b12x": "b12x 1.5.1"}


class Method:
    """One all-reduce under test. `run` enqueues one call on the current stream; `capture`
    records `calls` calls into a CUDA graph. `in_place`: the result lands in the input."""

    name = "?"
    in_place = False

    def __init__(self, ranks, args, sizes):
        self.r, self.args, self.sizes = ranks, args, sizes
        self.torch = ranks.torch
        self.version = ""

    def supports(self, nbytes):
        return nbytes % PACK_BYTES == 0

    def shape(self, nbytes):
        return (1, nbytes // 2)

    def run(self, inp, out):
        raise NotImplementedError

    def capture(self, inp, out, calls):
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(g):
            for _ in range(calls):
                self.run(inp, out)
        return g

    def close(self):
        pass


class Nccl(Method):
    name = "nccl"
    in_place = True

    def setup(self):
        self.version = "NCCL %s (torch %s)" % (".".join(map(str, self.torch.cuda.nccl.version())), self.torch.__version__)

    def supports(self, nbytes):
        return True

    def run(self, inp, out):
        self.r.dist.all_reduce(inp, group=self.r.group)


class Tpar(Method):
    name = "tpar"

    def setup(self):
        import tpar
        import tpar.torch as tt

        self.comm = tt.Communicator(self.r.gloo, self.r.device, nccl_group=self.r.group)
        self.version = f"tpar {getattr(tpar, '__version__', '?')}"

    def supports(self, nbytes):
        return True

    def run(self, inp, out):
        self.comm.all_reduce(inp, out=out)

    def capture(self, inp, out, calls):
        g = self.torch.cuda.CUDAGraph()
        with self.comm.capture():
            with self.torch.cuda.graph(g):
                for _ in range(calls):
                    self.run(inp, out)
        return g

    def close(self):
        self.comm.close()


class FlashInfer(Method):
    """PcieIpcAllReduceWorkspace as vLLM 0.33's FlashInferPcieIpcAllReduce sets it up: the
    device group, optional tuning on the CPU group, every shape prepared before capture."""

    name = "flashinfer"

    def setup(self):
        import flashinfer
        from flashinfer.comm.pcie_ipc_ar import PcieIpcAllReduceWorkspace

        torch = self.torch
        self.version = f"flashinfer {flashinfer.__version__} (calls written against {PINNED['flashinfer']})"
        hidden = self.args.flashinfer_tune
        self.hidden = hidden
        max_numel = max(self.sizes) // 2
        self.ws = PcieIpcAllReduceWorkspace(group=self.r.group, max_numel=max_numel, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        self.ws.rebind_stream()
        if hidden:
            self.ws.tune([hidden], dtype=torch.bfloat16, tune_group=self.r.gloo)
        shapes = [self.shape(n) for n in self.sizes if n % PACK_BYTES == 0]
        self.configs = self.ws.prepare(shapes, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        self.ws.rebind_stream()
        self.version += f", profile {self.ws.profile}"

    def shape(self, nbytes):
        n = nbytes // 2
        if self.hidden and n % self.hidden == 0:
            return (n // self.hidden, self.hidden)
        return (1, n)

    def supports(self, nbytes):
        return nbytes % PACK_BYTES == 0 and self.configs.get(self.shape(nbytes)) is not None

    def run(self, inp, out):
        self.ws.all_reduce(inp, out=out)

    def close(self):
        self.ws.destroy()


class B12xOneshot(Method):
    """OneshotAllReducePool (one channel), each shape planned and prepared with the very
    buffers it runs on (b12x binds the prepared input), graphs inside pool.capture()."""

    name = "b12x-oneshot"

    def setup(self):
        import b12x
        from b12x.comm import pcie
        from b12x.comm.pcie import _oneshot_preparation as prep
        from b12x.preparation import prepare_default

        torch = self.torch
        self.version = f"b12x {getattr(b12x, '__version__', '?')} (calls written against {PINNED['b12x']}); is_supported()={pcie.is_supported(self.r.device)}"
        max_bytes = max(self.sizes)
        self.pool = pcie.OneshotAllReducePool.from_process_group(
            process_group=self.r.group, device=self.r.device, max_input_bytes=max_bytes, single_channel=True
        )
        self.chan = self.pool.for_stream()
        self.plans, self.bufs = {}, {}
        for n in self.sizes:
            if n % PACK_BYTES:
                continue
            x = torch.zeros(self.shape(n), dtype=torch.bfloat16, device=self.r.device)
            out = torch.empty_like(x)
            q = pcie.query_from_runtime(self.chan, surface="OneshotAllReducePool.all_reduce", call={"inp": x})
            p = pcie.plan(q, runtime=self.chan)
            prepare_default(p.request(name=f"tpar-peers.oneshot.{n}", prepare_call=lambda state, x=x, out=out: prep._prepare_plain_call(state, inp=x, out=out)))
            self.plans[n], self.bufs[n] = p, (x, out)

    def supports(self, nbytes):
        return nbytes in self.plans

    def buffers(self, nbytes):
        return self.bufs[nbytes]

    def run(self, inp, out):
        self.pool.all_reduce(inp, plan=self.plans[inp.numel() * 2], out=out)

    def capture(self, inp, out, calls):
        g = self.torch.cuda.CUDAGraph()
        with self.pool.capture():
            with self.torch.cuda.graph(g):
                for _ in range(calls):
                    self.run(inp, out)
        return g

    def close(self):
        self.pool.close()


class B12xDma(Method):
    """DmaAllReduce (copy-engine ring; bf16 on the wire unless --b12x-dma-wire), each
    shape planned and primed before use."""

    name = "b12x-dma"

    def setup(self):
        import b12x
        from b12x.comm import pcie
        from b12x.comm.pcie import _dma_preparation as prep
        from b12x.preparation import prepare_default

        torch = self.torch
        wire = self.args.b12x_dma_wire or "0"
        self.version = f"b12x {getattr(b12x, '__version__', '?')} DmaAllReduce wire {wire!r} (calls written against {PINNED['b12x']})"
        self.dma = pcie.DmaAllReduce(exchange_group=self.r.group, device=self.r.device, max_bytes=max(self.sizes), fp8=wire)
        self.plans, self.bufs = {}, {}
        for n in self.sizes:
            count = n // 2
            if n % PACK_BYTES or count % (self.r.world * 8):
                continue
            x = torch.zeros(self.shape(n), dtype=torch.bfloat16, device=self.r.device)
            out = torch.empty_like(x)
            q = prep.query_from_metadata(self.dma, shape=self.shape(n), dtype=torch.bfloat16)
            p = pcie.plan(q, runtime=self.dma)
            prepare_default(p.request(name=f"tpar-peers.dma.{n}", prepare_call=lambda state, x=x, out=out: prep.prepared_call(state, inp=x, out=out)))
            self.plans[n], self.bufs[n] = p, (x, out)

    def supports(self, nbytes):
        return nbytes in self.plans

    def buffers(self, nbytes):
        return self.bufs[nbytes]

    def run(self, inp, out):
        self.dma.all_reduce(inp, plan=self.plans[inp.numel() * 2], out=out)

    def close(self):
        self.dma.close()


CLASSES = {c.name: c for c in (Nccl, Tpar, FlashInfer, B12xOneshot, B12xDma)}
