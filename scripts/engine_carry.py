#!/usr/bin/env python3
"""The engines' own distributed code, unmodified, runnable without the engines' compiled parts.

vLLM and SGLang cannot be installed where tpar is tested (no network on the GPU machine, torch
2.11 there while the engines pin 2.14, wheels of hundreds of MB, 64 MiB a carry). Their
distributed layer is Python, though: this script downloads the pinned wheels (sha256 checked),
unpacks them, and builds

- ``.engine-wheels/src/<engine>-<version>/``: the engine's wheel without its compiled
  extensions (``.so``), plus the stubs of ``STUBS``;
- ``.engine-wheels/site/<python tag>/``: the ``DEPS`` wheels unpacked (the CPU test,
  ``python/tests/test_engine_real.py``, puts both on ``sys.path``);
- ``.gpu/engines/`` (``carry``): for the GPU machine, per engine, the files that the harness
  (``scripts/engine_harness.py``) loads, found by running it here under an import/open tracer,
  plus the module-level import closure of the communicator modules (branches only a GPU
  takes) and ``DATA_DIRS``. ``DEPS`` marked ``HOST`` are not carried: the GPU image has them.

    .venv/bin/python scripts/engine_carry.py        # download, unpack, trace, write .gpu/engines
    .venv/bin/python scripts/engine_carry.py site   # download and unpack only (the CPU test's part)
    .venv/bin/python scripts/engine_carry.py --only vllm-0.33.0   # one ENGINES entry (repeatable)

The trace runs the harness: the Python needs torch and tpar (./scripts/test's .venv). Nothing
of the engines is modified. A newer engine version is one line in ``ENGINES`` (and its version
in ``tpar/engines/__init__.py``); a dependency it adds is reported by name. Stubs replace only
compiled extensions that the communicator path never calls; each says why (as docs/engines.md).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, ".engine-wheels")
CARRY = os.path.join(ROOT, ".gpu", "engines")

#: The GPU machine's Python (docs/engines.md): the carry holds wheels for it.
GPU_PYTHON = "3.12"


HOST, CARRIED = "host", "carry"


class Wheel(NamedTuple):
    name: str
    version: str
    #: sha256 of every wheel file accepted for this pin (one for pure wheels, one per Python
    #: tag for compiled ones: cp311 for this machine and CI, cp312 for the GPU machine).
    hashes: Tuple[str, ...]
    #: "carry": copied to the GPU machine; "host": the GPU machine's image has it (not
    #: carried; pinned here for the CPU test at the version the image had when last read).
    role: str = CARRIED


#: The engines, one line per version. The sha256 is that of the wheel named in the comment:
#: its .py files are the same in every Python tag's wheel (checked for SGLang 0.5.23 cp311
#: vs cp312), and only those and data files are used.
ENGINES: Dict[Tuple[str, str], Wheel] = {
    ("vllm", "0.33.0"): Wheel("vllm", "0.33.0", ("4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",)),  # cp38-abi3-manylinux_2_28_x86_64
    ("sglang", "0.5.23"): Wheel("sglang", "0.5.23", ("8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",)),  # cp312-cp312-manylinux_2_34_x86_64
}


def versions(name: str) -> Tuple[str, ...]:
    """The pinned versions of one engine, in ENGINES' order (what the tests run)."""
    return tuple(v for (n, v) in ENGINES if n == name)


#: Third-party wheels the engines' distributed layer imports (found by tracing: `carry`
#: reports any import that is missing). Versions: the engines' pins where they pin
#: (xgrammar, apache-tvm-ffi, oss-harmony), the GPU image's for HOST ones where known
#: (transformers 5.17.0, huggingface_hub 1.33.0, tokenizers 0.23.2, safetensors 0.8.0,
#: triton 3.6.0 = torch 2.11's pin), else the newest that satisfies both engines (2026-12).
DEPS: List[Wheel] = [
    Wheel("pydantic", "2.14.4", ('653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc',), CARRIED),  # py3-none
    Wheel("pydantic-core", "2.50.5", ('488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70', '470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("annotated-types", "0.8.0", ('f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0',), CARRIED),  # py3-none
    Wheel("typing-inspection", "0.4.5", ('bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39',), CARRIED),  # py3-none
    Wheel("typing-extensions", "4.16.0", ('481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8',), CARRIED),  # py3-none
    Wheel("pyzmq", "27.3.0", ('477b8ad30d66fc905c5388351e83b9ac25824b00e82c0d052b72ea6392636dfd', '858fe25231e0fd8612da142efde019faa5ef63fa150a821a27870e791b38c798',), CARRIED),  # cp311-cp311, cp312-abi3
    Wheel("msgspec", "0.23.0", ('2e514e5b2a23e376f545f4962834b7312d9400705627c53330116b46daddfbe3', 'c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("cbor2", "6.3.0", ('ebe634e9fe6ae36b3fe1c42d280c4ecb368397efbcd497f8d5826d48e9093f1b', '4f160b662059cc30ced4436fca332f4c27d0259698a5bde8373c9c6f829aabdf',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("cachetools", "8.0.2", ('502bf3c17c6e35d78ccdaa70da8c7001b28634541f5cde0dee33c93bb252277d',), CARRIED),  # py3-none
    Wheel("openai", "3.57.0", ('f97bc74024c06ced8428b56c4a3594066709d3082779bf9d0b4b6092fbf587a8',), CARRIED),  # py3-none
    Wheel("sniffio", "1.3.1", ('2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2',), CARRIED),  # py3-none
    Wheel("fastapi", "0.136.3", ('3d2a69bdf04b7e9f3afa292c3bc7a98816bbfafa10bc9b45f3f3700d2f761620',), CARRIED),  # py3-none
    Wheel("starlette", "1.10.0", ('478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4',), CARRIED),  # py3-none
    Wheel("annotated-doc", "0.0.7", ('6bc31bbbec6dfaaedc1676dbc11dbda96fe22a2b5c400e9ebad113fec44a9dc6',), CARRIED),  # py3-none
    Wheel("partial-json-parser", "0.2.1.1.post7", ('145119e5eabcf80cbb13844a6b50a85c68bf99d376f8ed771e2a3c3b03e653ae',), CARRIED),  # py3-none
    Wheel("pybase64", "1.5.1", ('13cfb64d2a0a8e15b9196c8b1ad61d8adfd8ee68bf4ce749cbb3a313239fef3b', 'c212d02fd072c5845d39b4699eb65efa827b79a5cf7fecc9f468f8cad2b8540f',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("httpx2", "2.16.2", ('f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5',), CARRIED),  # py3-none
    Wheel("httpcore2", "2.16.2", ('16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a',), CARRIED),  # py3-none
    Wheel("truststore", "0.10.5", ('9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c',), CARRIED),  # py3-none
    Wheel("xgrammar", "0.2.8", ('885d7468636a8ca829513b9740fef21cbb438239fa3f91cce06e95e31973b8c6', '4045b096735bb2523e0d874039a55994c1b390620d547c4a0d4f43b9a106177b',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("apache-tvm-ffi", "0.1.11", ('87f84e7c2393fadac340fd179a631a697effe54d7317b2543e0930452a0a673d', '2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128',), CARRIED),  # cp311-cp311, cp312-abi3
    Wheel("oss-harmony", "0.0.11", ('d877c6b526cdbdf55068bae8f05c60398e929c9e296c7f69a1d533339708be80',), CARRIED),  # cp38-abi3
    Wheel("llguidance", "1.7.6", ('ceec951d29a74309984e3be0fe7f5f56c1362434cd937abd517b259a60908b1e',), CARRIED),  # cp39-abi3 (its extension: STUBS)
    Wheel("orjson", "3.13.0", ('89bcf2d4bc6c9a7e1763c8cf534f38712e66b76a0fefda7fb7785462f0d635e4', 'bceadfd314bd238f584fc229a4bbaf0e573597e7a026dec5429fbf29fd66c641',), CARRIED),  # cp311-cp311, cp312-cp312
    Wheel("ipython", "9.18.1", ('997ce9140d374531a61069c70c0f9ef299d6dd3559ea0f94b8af589726e3c1d5',), CARRIED),  # py3-none
    Wheel("traitlets", "5.16.1", ('f775618166caa0396c8e337099240f2bd3e5e917d203b2e6fbe21a58d3cb1f6b',), CARRIED),  # py3-none
    Wheel("triton", "3.6.0", ('e8e323d608e3a9bfcc2d9efcc90ceefb764a82b99dea12a86d643c72539ad5d3', '74caf5e34b66d9f3a429af689c1c7128daba1d8208df60e81106b115c00d6fca',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("transformers", "5.17.0", ('78ec1ce21579b38dfb83950a0658cd119f87212a2fcfdff478096ce9d6c03801',), HOST),  # py3-none
    Wheel("tokenizers", "0.23.2", ('41c2f84d172449b4dadb9cdc508e3e364076613c35b16e76ecfe47a60d1e3305',), HOST),  # cp310-abi3
    Wheel("huggingface-hub", "1.33.0", ('04e434b06e100eddbce9a6e817d72693a7884b10a79bd67ab48080d5c07eb899',), HOST),  # py3-none
    Wheel("safetensors", "0.8.0", ('fd6f3f93c9a0a7cc2788ee63fb763353d4bd2e89b0751bc78fcf7dda00bea774',), HOST),  # cp310-abi3
    Wheel("aiohttp", "3.14.5", ('50a195903119008fe9cc68710535eb37f556ffffd6a7759afe70a2c145587045', '20f085697d7e911f1f73c43ed03fafbed1e7121797e2eb5428efa80398060584',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("aiohappyeyeballs", "2.7.1", ('9243213661e29250eb41368e5daa826fc017156c3b8a11440826b2e3ed376472',), HOST),  # py3-none
    Wheel("aiosignal", "1.4.0", ('053243f8b92b990551949e63930a839ff0cf0b0ebbe0597b0f3fb19e1a0fe82e',), HOST),  # py3-none
    Wheel("attrs", "26.1.0", ('c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309',), HOST),  # py3-none
    Wheel("frozenlist", "1.8.0", ('2552f44204b744fba866e573be4c1f9048d6a324dfe14475103fd51613eb1d1f', '494a5952b1c597ba44e0e78113a7266e656b9794eec897b19ead706bd7074383',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("multidict", "7.2.1", ('3b7542fad2706595c1b1853b46f2c3c4ae5cc5a6252b7225f294d607a29e1bdf', '1fb8c1a3480c130c3a6422d5f16f3cad6552bf08c2089dd288ba7134649183b5',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("propcache", "0.5.4", ('6e9368e87a3efc285e559131092c5db643eb8e56de4ee42064d5baec22ef2bb5', '2814ecd8e818f487bee4b0f921bc4d1c176cc5fc71ac0f072d0fa67eda4ac14b',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("yarl", "1.25.1", ('d5add7b4ca7afeea91d52e4d4e4db3b1fe9885b71f07054560d8c4296b7441a2', 'c6f117789d22dce188e5754e8bc65b7e6ebf8cb73963b9fa761f672a5883769d',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("pillow", "13.0.0", ('a625df9a2a5597fa5e5266e01aefc82604bb85d291e3547981e863560d75da6c', '42d63be3af4f9b951b199b0a9d23365d37ab14687e6d77b74940432c8515c4ca',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("pyyaml", "6.0.4", ('622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee', '93bfb2459195406a518e2f487a9bbf01df240175f31e06f5a252ac6734c7bbf0',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("regex", "2026.11.19", ('86d3b2ea69b3c56df3e8ddbac6cd98eaf5a8c5b5e7e006897ebdf7a28d6818e6', '8a966a5afe94ed9fb06deeecd9e3e51c3a5ab7d920e13f8128338e3fcdfed2b0',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("requests", "2.34.2", ('2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0',), HOST),  # py3-none
    Wheel("urllib3", "2.8.0", ('0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3',), HOST),  # py3-none
    Wheel("idna", "3.20", ('ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c',), HOST),  # py3-none
    Wheel("certifi", "2026.10.19.post1", ('1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2',), HOST),  # py3-none
    Wheel("psutil", "7.2.2", ('076a2d2f923fd4821644f5ba89f059523da90dc9014e85f8e45a5774ca5bc6f9',), HOST),  # cp36-abi3
    Wheel("tqdm", "4.70.1", ('c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73',), HOST),  # py3-none
    Wheel("httpx", "0.28.1", ('d909fcccc110f8c7faf814ca82a9a4d816bc5a6dbfea25d6591d6985b8ba59ad',), HOST),  # py3-none
    Wheel("httpcore", "1.0.9", ('2d400746a40668fc9dec9810239072b40b4484b640a8c38fd654a024c7a1bf55',), HOST),  # py3-none
    Wheel("h11", "0.16.0", ('63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86',), HOST),  # py3-none
    Wheel("anyio", "4.16.0", ('c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026',), HOST),  # py3-none
    Wheel("uvloop", "0.23.0", ('ab17b3a8aa754be0de0e397f7b95f13b14e56f077a4c6ae295e3d4afd199b325', '090865d8ce7a03986755a3ce711b7dd0d4b44eb14ab74368b717f3fad1180208',), HOST),  # cp311-cp311, cp312-cp312
    Wheel("prometheus-client", "0.26.0", ('fa93d06737aa02bacd05794768508bb97d2fbee28cb3bca04eaae92f0ca953d6',), HOST),  # py3-none
    Wheel("cloudpickle", "3.1.3", ('1654f4f18e416447210a63c5c25a135d65a292156aa5fa519dfa4baf7726dddb',), HOST),  # py3-none
    Wheel("einops", "0.8.2", ('54058201ac7087911181bfec4af6091bb59380360f069276601256a76af08193',), HOST),  # py3-none (vllm/v1/attention/ops/vit_attn_wrappers.py, which a CUDA platform's pass manager reaches through qk_norm_rope_fusion)
    Wheel("py-cpuinfo", "9.0.0", ('859625bc251f64e21f077d099d4162689c762b5d6a4c3c97553d56241c9674d5',), HOST),  # py3-none
]

# ----------------------------------------------------------------------------------------
# Stubs: compiled extensions that the communicator path never calls, replaced by a module
# whose every name raises when used. path inside the engine's tree (owner: the engine) or the
# site (owner: the dependency) -> (owner, names the importers take from it, reason).
STUBS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "vllm/_C_stable_libtorch.py": (
        "vllm",
        (),
        "vLLM's CUDA kernels for torch's stable ABI (93 MB, built against torch 2.14). "
        "`vllm/platforms/cuda.py` imports it at module level only to register `torch.ops._C*` kernels; "
        "the communicator path (CudaCommunicator with pynccl off, the custom all-reduce replaced by "
        "tpar's) calls none of them, and a call would fail loudly (the op is not registered).",
    ),
    "vllm/vllm_flash_attn/_vllm_fa2_C.py": (
        "vllm",
        (),
        "FlashAttention-2's CUDA kernels (a compiled extension of the vLLM wheel). On a GPU, "
        "`vllm/v1/attention/backends/fa_utils.py` imports `vllm.vllm_flash_attn` at module level, whose "
        "`__init__` refuses to import unless one FlashAttention extension imports; the compile passes "
        "that the fusion stage loads reach fa_utils, but no attention runs (the layer is linear -> "
        "all-reduce -> norm), and a call would fail loudly (`torch.ops._vllm_fa2_C` is not registered).",
    ),
    "openai_harmony/openai_harmony.py": (
        "oss-harmony",
        ("HarmonyError", "PyHarmonyEncoding", "PyStreamableParser", "load_harmony_encoding", "get_tool_namespace_config"),
        "The Harmony chat-format encoder (a 6 MB Rust extension of oss-harmony, whose Python part is "
        "carried). vLLM imports `openai_harmony` at module level for its pydantic message types; only "
        "chat rendering and parsing call the encoder. The package's own fallback for a missing "
        "extension lacks `HarmonyError`, which vLLM imports, hence a stub rather than an omission.",
    ),
    "llguidance/_lib.py": (
        "llguidance",
        ("LLTokenizer", "LLInterpreter", "JsonCompiler", "LarkCompiler", "RegexCompiler", "LLExecutor", "LLMatcher",
         "LLParserLimits", "regex_to_lark", "get_version"),
        "llguidance's grammar engine (an 8 MB Rust extension; its Python part is carried). vLLM's "
        "guidance structured-output backend evaluates the dataclass annotations `llguidance.LLMatcher` "
        "and `llguidance.LLTokenizer` when `vllm.v1.structured_output` is imported; only structured "
        "output (a request with a grammar) calls the engine.",
    ),
}

# vLLM's compiled ops (``torch.ops._C``, registered by its ``_C`` extension when
# ``vllm/platforms/cuda.py`` imports it; the carry stubs that extension) that the compile
# passes' modules name, most at import: on a CUDA platform vLLM's pass manager imports its
# CUDA-only fusion modules (act_quant_fusion, rms_quant_fusion, qk_norm_rope_fusion,
# allreduce_rms_fusion, ... and matcher_utils), several naming these without a hasattr guard,
# and tpar's plug-in imports that pass manager when vLLM loads its plug-ins. So the harness
# registers these schemas (vLLM's own: csrc torch_bindings.cpp, checked against the pinned
# wheel's Python callers) before the engine's set-up where the fusion stage runs
# (scripts/engine_fusion.py ``register_before_setup``), as a real install has ``_C`` then;
# an op already registered (a real ``_C``) is kept. schema -> (torch reference or None,
# reason). A reference: an op the fusion layer calls or the patterns match, computing what
# vLLM's kernel computes. None: the op only has to exist (for a module to import, or for a
# pass to compare a node's target); a call raises. Each is required: without any one but
# ``rms_norm`` (compared at compile time only), importing the pass manager on a CUDA platform
# fails (python/tests/test_fusion_carry_cuda_imports.py, the platform faked on CPU). The carry's
# MANIFEST.json lists them with their reasons (``c_op_stubs``).
def _static_scaled_fp8_quant(result, input, scale, group_shape=None):
    """vLLM's static per-tensor FP8 quant: input * (1 / scale) in float32, clamped to e4m3's
    range, rounded to e4m3 (csrc/quantization/w8a8/fp8/common.cuh scaled_fp8_conversion)."""
    import torch

    finfo = torch.finfo(result.dtype)
    inv = 1.0 / scale.float().reshape(-1)[0]
    result.copy_((input.float() * inv).clamp(finfo.min, finfo.max).to(result.dtype))


def _scaled_fp4_quant_out(input, input_scale, is_sf_swizzled_layout, *, output, output_scale):
    """vLLM's NVFP4 quant (``scaled_fp4_quant``, the swizzled 128x4 scale layout) as its Python
    reference computes it (exact reciprocals; ``tpar.testing.quant_nvfp4``)."""
    import torch

    from tpar.testing import quant_nvfp4

    if not is_sf_swizzled_layout:
        raise RuntimeError("_C.scaled_fp4_quant stub: only the swizzled scale layout")
    q, sf = quant_nvfp4(input, input_scale)
    output.copy_(q.reshape(output.shape))
    scales = output_scale.view(torch.int32)
    scales.copy_(sf.reshape(scales.shape))


C_OP_STUBS: Dict[str, Tuple[Optional[object], str]] = {
    "scaled_fp4_quant(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout) -> (Tensor, Tensor)": (
        None,
        "the NVFP4 quant's functional form, defined before its .out overload as in vLLM's _C: once "
        "`_C` has scaled_fp4_quant, `vllm/_custom_ops.py` registers its fake at import "
        "(register_fake(\"_C::scaled_fp4_quant\")), which fails unless this overload exists; vLLM's "
        "scaled_fp4_quant calls the .out overload, nothing calls this one",
    ),
    "scaled_fp4_quant.out(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout, *, Tensor(a!) output, Tensor(b!) output_scale) -> ()": (
        _scaled_fp4_quant_out,
        "the NVFP4 quant (its .out overload) that vLLM's scaled_fp4_quant calls and the all-reduce "
        "fusion patterns match where vLLM has it; where tpar's pass hands a call back, it computes "
        "the output, so it is vLLM's Python reference's semantics in torch",
    ),
    "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()": (
        _static_scaled_fp8_quant,
        "the static FP8 quant that vLLM's QuantFP8 layer calls and the all-reduce fusion patterns "
        "match (matcher_utils QUANT_OPS); where tpar's pass hands a call back, it computes the "
        "output, so it is vLLM's semantics in torch",
    ),
    "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()": (None, "named by matcher_utils and rms_quant_fusion QUANT_OPS at import; no dynamic quant in the fusion layer"),
    "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub) -> ()": (None, "as dynamic_scaled_fp8_quant"),
    "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()": (None, "matcher_utils ROTARY_OP at import; no rotary embedding in the fusion layer"),
    "silu_and_mul(Tensor! result, Tensor input) -> ()": (None, "matcher_utils SILU_MUL_OP at import; no activation in the fusion layer"),
    "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()": (None, "rms_quant_fusion RMS_ADD_OP at import; the layer's norm is vLLM's IR op (vllm_ir.fused_add_rms_norm, native)"),
    "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()": (None, "rms_quant_fusion FUSED_OPS at import; the RMSNorm + quant fusion pass is not configured in the stage"),
    "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()": (None, "as rms_norm_static_fp8_quant"),
    "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual) -> ()": (None, "as rms_norm_static_fp8_quant"),
    # rms_norm: FixFunctionalizationPass compares every auto-functionalized node against it
    # (compile time, any platform). The rest: named without a hasattr guard at import where
    # vLLM's platform is CUDA (never on CPU), where the pass manager imports act_quant_fusion
    # and qk_norm_rope_fusion.
    "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()": (None, "FixFunctionalizationPass compares auto-functionalized nodes against it at compile time; the layer's norm is vLLM's IR op (native)"),
    "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()": (None, "act_quant_fusion FUSED_OPS at import (CUDA only) and FixFunctionalizationPass; no activation in the fusion layer"),
    "silu_and_mul_per_block_quant(Tensor! out, Tensor input, Tensor! scales, int group_size, Tensor? scale_ub=None, bool is_scale_transposed=False) -> ()": (None, "act_quant_fusion FUSED_OPS at import (CUDA only, no hasattr guard); no activation in the fusion layer"),
    "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, int head_dim, float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, bool is_neox, Tensor position_ids, int forced_token_heads_per_warp=-1) -> ()": (None, "qk_norm_rope_fusion at import (CUDA only) and FixFunctionalizationPass; no attention in the fusion layer"),
}

_c_lib = []


def register_c_op_stubs() -> List[str]:
    """Defines the ``C_OP_STUBS`` ops (overloads) that ``torch.ops._C`` lacks: CPU and CUDA
    kernels (the reference, or one that raises) and, for an op that only mutates, a Meta kernel
    (nothing to allocate); an op that returns tensors gets its fake from vLLM, which registers
    it at import once the op exists (``vllm/_custom_ops.py``, as on a real install). Returns the
    names defined. Idempotent; an op already registered (vLLM's own ``_C``) is left alone."""
    import torch

    done = []
    if not _c_lib:
        _c_lib.append(torch.library.Library("_C", "FRAGMENT"))
    lib = _c_lib[0]
    for schema, (ref, _why) in C_OP_STUBS.items():
        name = schema.split("(", 1)[0]
        base, _, overload = name.partition(".")
        if hasattr(torch.ops._C, base) and hasattr(getattr(torch.ops._C, base), overload or "default"):
            continue
        lib.define(schema)

        def raising(*args, _n=name, **kwargs):
            raise RuntimeError(f"_C.{_n}: a stub of vLLM's compiled op (tpar's scripts/engine_carry.py C_OP_STUBS); the code under test called it")

        impl = ref if ref is not None else raising
        lib.impl(name, impl, "CPU")
        lib.impl(name, impl, "CUDA")
        if schema.endswith("-> ()"):  # mutates only: nothing to allocate
            lib.impl(name, lambda *a, **k: None, "Meta")
        done.append(name)
    return done


#: Files of a wheel replaced by a stub above (left out when the wheel is unpacked).
OMIT = {"openai_harmony/openai_harmony.abi3.so", "llguidance/_lib.abi3.so"}

STUB_TEXT = '''"""Stub written by tpar's scripts/engine_carry.py (STUBS), not part of {owner}: {reason}"""

_WHY = "{module}: a stub of a compiled extension (tpar's scripts/engine_carry.py STUBS); the code under test used it"


class _Stubbed:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(_WHY)


{names}

def __getattr__(name):
    raise AttributeError(_WHY + " (" + name + ")")
'''


def stub_text(path: str) -> str:
    owner, names, reason = STUBS[path]
    lines = []
    for n in names:
        base = "Exception" if n.endswith("Error") else "_Stubbed"  # an exception type is named in `except`
        lines.append(f"class {n}({base}):\n    pass\n\n")
    return STUB_TEXT.format(owner=owner, reason=reason, module=path[:-3].replace("/", "."), names="".join(lines))


# ----------------------------------------------------------------------------------------
def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def py_tag(version: Optional[str] = None) -> str:
    v = version or "%d.%d" % sys.version_info[:2]
    return "cp" + v.replace(".", "")


def _pip_download(w: Wheel, python: Optional[str], dest: str) -> str:
    """Downloads one pinned wheel (pip checks the hash: --require-hashes), or reuses a cached
    file whose sha256 is one of the pinned ones. Returns its path."""
    os.makedirs(dest, exist_ok=True)
    norm = w.name.replace("-", "_").lower()
    for f in os.listdir(dest):
        if f.lower().startswith(norm + "-" + w.version + "-") and f.endswith(".whl"):
            p = os.path.join(dest, f)
            if _tag_fits(f, python) and sha256(p) in w.hashes:
                return p
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "req.txt")
        with open(req, "w") as f:
            f.write(f"{w.name}=={w.version} " + " ".join(f"--hash=sha256:{h}" for h in w.hashes) + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir", "--no-deps",
               "--only-binary=:all:", "--require-hashes", "-r", req, "-d", tmp]
        if python:
            cmd += ["--python-version", python, "--implementation", "cp"]
            cmd += [a for m in (39, 38, 35, 34, 31, 28, 27, 26, 24, 17, 12, 5) for a in ("--platform", f"manylinux_2_{m}_x86_64")]
            cmd += ["--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64", "--platform", "manylinux1_x86_64"]
        subprocess.run(cmd, check=True)
        got = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        assert len(got) == 1, got
        p = os.path.join(tmp, got[0])
        if sha256(p) not in w.hashes:  # pip checked it; check again, cheaply, before trusting the cache
            raise SystemExit(f"{got[0]}: sha256 {sha256(p)} is not pinned for {w.name}=={w.version}")
        final = os.path.join(dest, got[0])
        shutil.move(p, final)
        return final


def _tag_fits(filename: str, python: Optional[str]) -> bool:
    """Whether a wheel file's Python tag fits `python` (None: this interpreter)."""
    tags = filename[:-4].split("-")[-3:]
    pyt, abi = tags[0], tags[1]
    want = py_tag(python)
    if abi == "none":
        return True
    if abi == "abi3":  # cpXY-abi3: CPython X.Y or newer
        return any(t.startswith("cp") and int(t[2:]) <= int(want[2:]) for t in pyt.split("."))
    return want in pyt.split(".")


def engine_wheel(name: str, version: str) -> str:
    """The pinned engine wheel's path (downloaded and checked on first use)."""
    w = ENGINES[(name, version)]
    # Any Python tag holds the same .py files; the pinned one is fetched for GPU_PYTHON.
    return _pip_download(w, GPU_PYTHON, WHEELS)


def dep_wheels(python: Optional[str]) -> List[str]:
    return [_pip_download(w, python, os.path.join(WHEELS, "deps")) for w in DEPS]


def _unpack(whl: str, dest: str, skip=lambda name: False) -> List[str]:
    out = []
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.endswith("/") or skip(n):
                continue
            target = n
            parts = n.split("/")
            # <dist>.data/{purelib,platlib}/x -> x (the only .data parts these wheels use)
            if parts[0].endswith(".data") and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                target = "/".join(parts[2:])
            elif parts[0].endswith(".data"):
                continue
            z.extract(n, dest) if target == n else _extract_to(z, n, os.path.join(dest, target))
            out.append(target)
    return out


def _extract_to(z, member, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with z.open(member) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)


def _stamp_ok(path: str, key: str) -> bool:
    try:
        with open(path) as f:
            return f.read() == key
    except OSError:
        return False


def lock_key(extra: str = "") -> str:
    # OMIT sorted: a set's str() follows the process's hash seed, which made the key (and so
    # the stamps) differ between processes, each mismatch rebuilding the trees under a running test
    return hashlib.sha256(json.dumps([list(ENGINES.items()), DEPS, STUBS, sorted(OMIT), extra], default=str).encode()).hexdigest()


def build_site(python: Optional[str] = None) -> str:
    """`.engine-wheels/site/<tag>/`: every DEPS wheel unpacked (OMIT applied). Rebuilt only
    when the pins change."""
    dest = os.path.join(WHEELS, "site", py_tag(python))
    stamp = dest + ".stamp"
    key = lock_key(py_tag(python))
    if os.path.isdir(dest) and _stamp_ok(stamp, key):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    owners = {}  # file -> the DEPS name it came from (the carry copies CARRIED ones only)
    for w, whl in zip(DEPS, dep_wheels(python)):
        for f in _unpack(whl, dest, skip=lambda n: n in OMIT or n.endswith("/RECORD")):
            owners[f] = w.name
    _write_stubs(dest, {w.name for w in DEPS})
    owners.update({path: owner for path, (owner, _, _) in STUBS.items() if owner in {w.name for w in DEPS}})
    with open(os.path.join(dest, OWNERS), "w") as f:
        json.dump(owners, f)
    with open(stamp, "w") as f:
        f.write(key)
    return dest


OWNERS = "tpar-owners.json"


def build_src(name: str, version: str) -> str:
    """`.engine-wheels/src/<name>-<version>/`: the engine's wheel without its compiled
    extensions, plus STUBS."""
    dest = os.path.join(WHEELS, "src", f"{name}-{version}")
    stamp = dest + ".stamp"
    key = lock_key(name + version)
    if os.path.isdir(dest) and _stamp_ok(stamp, key):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    whl = engine_wheel(name, version)

    def compiled(n):
        base = n.rsplit("/", 1)[-1]
        return n.endswith(".so") or ".so." in base or n.endswith("/RECORD") or n == f"{name}/vllm-rs"

    _unpack(whl, dest, skip=compiled)
    _write_stubs(dest, {name})
    with open(stamp, "w") as f:
        f.write(key)
    return dest


def _write_stubs(dest: str, owners: Set[str]) -> None:
    for path, (owner, _, _) in STUBS.items():
        if owner in owners:
            with open(os.path.join(dest, path), "w") as f:
                f.write(stub_text(path))


def prepare(name: str, version: str, python: Optional[str] = None) -> List[str]:
    """What to put first on `sys.path` (PYTHONPATH) to import the engine's real modules here:
    the engine's tree, then the dependencies' site."""
    return [build_src(name, version), build_site(python)]


# ----------------------------------------------------------------------------------------
# The closure: what the harness loads on this machine's CPU (traced), plus the module-level
# import closure of the engine's communicator modules.

#: Engine modules whose every import (function bodies too) is followed one level: the
#: communicator path on a GPU executes imports in functions the CPU run never reaches
#: (graph_capture, CudaPlatform's methods).
GPU_ROOTS = {
    "vllm": [
        "vllm.platforms.cuda", "vllm.distributed.parallel_state", "vllm.distributed.communication_op",
        "vllm.distributed.device_communicators.cuda_communicator", "vllm.distributed.device_communicators.pynccl",
        "vllm.distributed.device_communicators.custom_all_reduce", "vllm.distributed.device_communicators.symm_mem",
        "vllm.distributed.device_communicators.flashinfer_all_reduce", "vllm.distributed.device_communicators.all_reduce_utils",
        "vllm.distributed.device_communicators.shm_broadcast", "vllm.utils.torch_utils",
    ],
    "sglang": [
        "sglang.srt.distributed.parallel_state", "sglang.srt.distributed.communication_op",
        "sglang.srt.distributed.device_communicators.custom_all_reduce", "sglang.srt.distributed.device_communicators.pynccl",
        "sglang.srt.distributed.device_communicators.shm_broadcast", "sglang.srt.utils.custom_op",
    ],
}


#: Engine files the CPU trace cannot see (stat-checked at import, or GPU-only); dirs go whole.
DATA_DIRS = {
    # sglang/kernels/jit/utils/compile/paths.py raises at import unless both exist; imported
    # by GroupCoordinator.__init__ through custom_all_reduce_v2 (found by the GPU script's CPU check).
    "sglang": ["sglang/kernels/jit/include", "sglang/kernels/jit/csrc"],
    # files too: vLLM's platform check imports its pynvml on GPUs only (the trace runs on CPU)
    "vllm": ["vllm/third_party/__init__.py", "vllm/third_party/pynvml.py"],
}


def _module_file(root: str, mod: str) -> Optional[str]:
    p = os.path.join(root, *mod.split("."))
    if os.path.isfile(os.path.join(p, "__init__.py")):
        return os.path.join(p, "__init__.py")
    if os.path.isfile(p + ".py"):
        return p + ".py"
    return None


def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body, into_functions: bool):
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not into_functions:
            continue
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield n
            continue
        if isinstance(n, ast.If) and _is_type_checking(n.test):
            yield from _imports(n.orelse, into_functions)
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(n, field, None)
            if isinstance(sub, list):
                yield from _imports(sub, into_functions)


def import_closure(root: str, pkg: str, roots: Iterable[str], deep: Iterable[str] = ()) -> Set[str]:
    """Files of package `pkg` under `root` that importing `roots` loads, statically: every
    module-level import (inside `try`/`if` too, except `if TYPE_CHECKING`), every parent
    package, and, for the modules in `deep`, the imports inside their functions as well."""
    deep = set(deep)
    seen: Dict[str, Optional[str]] = {}
    todo = list(roots) + list(deep)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        f = _module_file(root, m)
        seen[m] = f
        if f is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open(f, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), f)
        is_pkg = f.endswith("__init__.py")
        for n in _imports(tree.body, m in deep):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            else:
                if n.level:
                    base = parts if is_pkg else parts[:-1]
                    base = base[: len(base) - (n.level - 1)]
                    mod = ".".join(base + ([n.module] if n.module else []))
                else:
                    mod = n.module or ""
                names = [mod] + [mod + "." + a.name for a in n.names]
            todo += [x for x in names if x.split(".")[0] == pkg and _module_file(root, x)]
    return {f for f in seen.values() if f}


# ----------------------------------------------------------------------------------------
#: Top-level modules the GPU machine has besides HOST ones (its image: torch and the
#: libraries torch needs) and the standard library: a closure's import of anything else that
#: is neither carried nor HOST is reported.
GPU_IMAGE = {"torch", "numpy", "triton", "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "filelock", "fsspec",
             "packaging", "setuptools", "pkg_resources", "_distutils_hack", "six", "pytest", "pygments", "cuda", "pynvml"}


def trace(name: str, version: str, out_dir: str, world: int = 2) -> Set[str]:
    """Runs the harness for `name` on this machine's CPU with the tracer on; returns the
    absolute paths of every file its ranks loaded or opened under the engine's tree and the
    site."""
    paths = prepare(name, version)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    tdir = tempfile.mkdtemp(prefix=f"tpar-trace-{name}-")
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "engine_harness.py"), name, str(world), "--device", "cpu",
           "--stages", "settings,eager,compile,thread" + (",sp,fusion" if name == "vllm" else ",dp,dp_compile"), "--trace", tdir, "--out", out_dir]
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise SystemExit(f"the harness failed on this machine's CPU for {name} {version} (logs in {out_dir}): fix that first")
    files: Set[str] = set()
    for f in os.listdir(tdir):
        with open(os.path.join(tdir, f)) as fh:
            files.update(json.load(fh))
    shutil.rmtree(tdir, ignore_errors=True)
    return files


def _gpu_name(rel: str, files_312: Set[str]) -> Optional[str]:
    """The cp312 wheel's file for a file traced in the cp311 one (extension names differ)."""
    if rel in files_312:
        return rel
    d, base = os.path.split(rel)
    stem = base.split(".")[0]
    if d.endswith(".libs"):
        stem = stem.split("-")[0]
    ext = ".so" if ".so" in base else os.path.splitext(base)[1]
    cands = [f for f in files_312 if os.path.dirname(f) == d and ext in os.path.basename(f)
             and os.path.basename(f).split(".")[0].split("-")[0] == stem.split("-")[0]]
    return cands[0] if len(cands) == 1 else None


def carry(out: str = CARRY, only: Optional[Iterable[str]] = None) -> None:
    """Writes the GPU machine's carry: per engine the traced and closed files of its tree,
    and one shared site of the CARRIED dependencies' traced files (cp312 builds). `only`:
    the ``name-version`` entries of ENGINES to carry (default all; the budget may need a
    choice once several versions are pinned)."""
    chosen = [(n, v) for (n, v) in ENGINES if not only or f"{n}-{v}" in set(only)]
    if not chosen:
        raise SystemExit(f"--only {sorted(only or [])}: none of {[f'{n}-{v}' for n, v in ENGINES]}")
    logs = tempfile.mkdtemp(prefix="tpar-carry-logs-")
    site311, site312 = build_site(None), build_site(GPU_PYTHON)
    with open(os.path.join(site312, OWNERS)) as f:
        owners312 = json.load(f)
    with open(os.path.join(site311, OWNERS)) as f:
        owners311 = json.load(f)
    role = {w.name: w.role for w in DEPS}
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    manifest = {"engines": {}, "site": "site", "python": GPU_PYTHON, "lock": lock_key(),
                "host": {w.name: w.version for w in DEPS if w.role == HOST}, "stubs": sorted(STUBS),
                "c_op_stubs": {schema: {"reference": ref is not None, "why": why} for schema, (ref, why) in C_OP_STUBS.items()}}
    site_files: Set[str] = set()
    not_carried: Dict[str, Set[str]] = {}
    for (name, version) in chosen:
        src = build_src(name, version)
        traced = trace(name, version, logs)
        eng = {os.path.relpath(f, src) for f in traced if f.startswith(src + os.sep)}
        mods = [r[:-3].replace("/", ".").removesuffix(".__init__") for r in eng if r.endswith(".py")]
        closed = import_closure(src, name, mods, GPU_ROOTS.get(name, ()))
        eng |= {os.path.relpath(f, src) for f in closed}
        for d in DATA_DIRS.get(name, ()):
            if not os.path.exists(os.path.join(src, d)):
                raise SystemExit(f"{name} {version}: DATA_DIRS names {d}, which the wheel lacks")
            eng |= {d} if os.path.isfile(os.path.join(src, d)) else {os.path.relpath(os.path.join(dp, f), src) for dp, _, fs in os.walk(os.path.join(src, d)) for f in fs}
        dest = os.path.join(out, f"{name}-{version}")
        for rel in sorted(eng):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(os.path.join(src, rel), os.path.join(dest, rel))
        for f in traced:
            if f.startswith(site311 + os.sep):
                rel = os.path.relpath(f, site311)
                owner = owners311.get(rel)
                if owner is None:
                    continue
                if role[owner] == HOST:
                    not_carried.setdefault(owner, set()).add(rel)
                    continue
                g = _gpu_name(rel, {k for k, v in owners312.items() if v == owner})
                if g is None:
                    raise SystemExit(f"{rel} ({owner}): no counterpart in the cp312 wheel")
                site_files.add(g)
        manifest["engines"][f"{name}-{version}"] = {"name": name, "version": version, "dir": f"{name}-{version}", "files": len(eng),
                                     "bytes": sum(os.path.getsize(os.path.join(dest, r)) for r in eng)}
    # Each carried dependency's metadata (importlib.metadata reads versions from it).
    carried = {owners312[f] for f in site_files}
    for f, o in owners312.items():
        if o in carried and ".dist-info/" in f:
            site_files.add(f)
    for rel in sorted(site_files):
        os.makedirs(os.path.dirname(os.path.join(out, "site", rel)), exist_ok=True)
        shutil.copy2(os.path.join(site312, rel), os.path.join(out, "site", rel))
    manifest["site_bytes"] = sum(os.path.getsize(os.path.join(out, "site", r)) for r in site_files)
    manifest["carried"] = {w.name: w.version for w in DEPS if w.name in carried}
    manifest["host_used"] = sorted(not_carried)
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(f"carry: {out}: {total / 2**20:.1f} MiB "
          + ", ".join(f"{n} {e['files']} files {e['bytes'] / 2**20:.1f} MiB" for n, e in manifest["engines"].items())
          + f", site {len(site_files)} files {manifest['site_bytes'] / 2**20:.1f} MiB ({', '.join(sorted(carried))});"
          + f" from the GPU image: {', '.join(sorted(not_carried))}")
    if total > CARRY_BUDGET:
        raise SystemExit(f"the carry is {total / 2**20:.1f} MiB, over its budget of {CARRY_BUDGET / 2**20:.0f} MiB")
    shutil.rmtree(logs, ignore_errors=True)


CARRY_BUDGET = 50 << 20  # of a GPU call's 64 MiB: the rest is the repository (~6) and tpar's wheel (~5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", default="carry", choices=("carry", "site"))
    ap.add_argument("--out", default=CARRY)
    ap.add_argument("--only", action="append", metavar="NAME-VERSION", help="carry only these ENGINES entries (repeatable)")
    args = ap.parse_args()
    if args.what == "site":
        for (name, version) in ENGINES:
            print(name, version, os.pathsep.join(prepare(name, version)))
        return
    carry(args.out, args.only)


if __name__ == "__main__":
    main()
