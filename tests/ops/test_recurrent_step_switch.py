"""Switches.recurrent_step_kernels (MINFER_RECURRENT_STEP_KERNELS): on, the CUDA backend's decode step of
a Mamba-2 / gated DeltaNet layer is one Triton launch (ssm.step.triton, deltanet.step.triton), a Mamba-1
layer's two (ssm1.conv.triton, ssm1.scan.triton); off, the
torch ops of the prefill path step it, as before those kernels. Both through the CUDA backend's code
in Triton's interpreter, against the reference forward, on the mamba2, qwen35 and falcon-mamba fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm", "minfer.ops.cuda.ssm_step",
         "minfer.ops.cuda.deltanet_step", "minfer.ops.cuda.ssm1_step", "minfer.ops.cuda"]
KERNEL = {"mamba2": "ssm.step.triton", "qwen35": "deltanet.step.triton", "falcon-mamba": "ssm1.scan.triton"}
TORCH = {"mamba2": "ssm.scan.torch", "qwen35": "deltanet.scan.torch", "falcon-mamba": "ssm1.scan.torch"}


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


@pytest.mark.parametrize("name", ["mamba2", "qwen35", "falcon-mamba"])
@pytest.mark.parametrize("on", [True, False])
def test_decode_step_by_the_kernel_or_the_torch_ops(cuda_ops, monkeypatch, name, on):
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
    toks = torch.arange(3, 13) * 7 % 300 + 3
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, 64)
    m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    cache = KVCache.for_config(m.cfg, 64)
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(recurrent_step_kernels=on), C.Workspace.for_model(m))
    m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)                # the state through the CUDA backend
    monkeypatch.undo()
    ref = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)
    route_to_cuda(monkeypatch, C)
    paths.reset()
    dec = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
    counts = paths.snapshot()["counts"]
    assert float((dec - ref).norm() / ref.norm()) < 1e-5
    assert (KERNEL[name] in counts) == on, counts
    assert (TORCH[name] in counts) == (not on), counts
