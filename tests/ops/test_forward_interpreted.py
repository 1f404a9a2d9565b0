"""The whole model through the CUDA backend's code (Triton's interpreter, CPU tensors) in the
three Step modes the engine uses -- eager prefill, the decode graph's host-free step, the padded
prefill graph's device-picked row -- against the reference forward. This runs the engine's
Context/Workspace plumbing (declared q/k/v group, prefetch sequence, per-engine buffers) that
the GPU runs, without a GPU. fp32 activations (the interpreter's bf16 dot is wrong, ANCHORS.md)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kernel_data import DENSE_MODS, interpreted_modules, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = DENSE_MODS


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


@pytest.mark.parametrize("arch,rope_in_attn", [("llama", True), ("qwen3", True), ("llama", False)])
def test_cuda_backend_forward_in_every_step_mode(cuda_ops, monkeypatch, tmp_path, arch, rope_in_attn):
    """rope_in_attn: the decode step's rope + KV append inside the attention kernel
    (Switches.decode_attn_rope, attention.decode.rope) or apart (rope_kv, attention.decode.triton)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches
    from models.tiny import TinySpec, write_tiny_model

    C = cuda_ops["cuda"]
    path = write_tiny_model(tmp_path / "m.gguf", TinySpec(arch=arch, qtype=T.Q8_0, seed=3))
    m = load_model(GGUFFile(path), progress=False)
    toks = torch.tensor([3, 17, 42, 5, 9, 33, 1, 28, 11, 49] * 4)     # 40: above the GEMV crossover
    ref_cache = KVCache.for_config(m.cfg, 64)
    ref = m.forward(toks, Step.at(0, 40, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(40, 1, "cpu"), ref_cache)

    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(decode_attn_rope=rope_in_attn), C.Workspace.for_model(m))
    cache = KVCache.for_config(m.cfg, 64)
    paths.reset()
    for _ in range(2):                                   # the second forward is prefetched
        out = m.forward(toks, Step.at(0, 40, "cpu"), cache, ctx)
    dec = m.forward(torch.tensor([7]), Step(torch.tensor([40]), None, "all"), cache, ctx)
    last = m.forward(toks, Step(torch.arange(40), 0, torch.tensor([39])), cache, ctx)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5 and rel(last, ref[-1:]) < 1e-5
    counts = paths.snapshot()["counts"]
    assert counts["qmatmul.group3.prefill"] == 3 * m.cfg.n_layers            # the declared q/k/v group
    assert counts["prefetch.hit"] > 0
    if rope_in_attn:
        assert counts["attention.decode.rope"] == m.cfg.n_layers and "attention.decode.triton" not in counts
    else:
        assert counts["attention.decode.triton"] == m.cfg.n_layers and "attention.decode.rope" not in counts
    assert ctx.workspace.nbytes() > 0
