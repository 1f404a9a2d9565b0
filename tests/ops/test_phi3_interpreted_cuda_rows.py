"""phi3 through the CUDA backend's code (Triton's interpreter, CPU tensors) with the cache the CUDA
engine really builds: rows rounded up to ops.LENGTH_BUCKET (cache_rows: 32 positions -> 128 rows),
context 32, against transformers' logits (tests/data/arch/phi3.npz).

test_arch_forward_interpreted.py gives its caches exactly n_ctx rows, which is why it passed while
the H200 failed: phi3 chose its LongRoPE factors from the row count (128 > the original context
32: long factors) on the GPU only. This test takes the GPU's row count and fails without the fix
(rows past position 0 off by a relative 1.48, the H200's number)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe", "minfer.ops.cuda"]
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


def test_phi3_cuda_backend_with_cuda_cache_rows(cuda_ops, monkeypatch):
    import minfer.ops as O
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    r = np.load(DATA / "phi3.npz")
    m = load_model(GGUFFile(DATA / "phi3.gguf"), progress=False)
    rows = -(-32 // O.LENGTH_BUCKET) * O.LENGTH_BUCKET             # cache_rows(32, "cuda")
    assert rows == 128
    cache = KVCache.for_config(m.cfg, rows, context=32)
    # minfer.ops sends CPU tensors to the reference: route them to the CUDA backend's code
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    ids = torch.tensor(r["ids"])
    got = m.forward(ids, Step.at(0, len(ids), "cpu"), cache, ctx).numpy()
    ref = r["logits"]
    err = float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())
    assert err < 1e-3, err
    assert paths.snapshot()["counts"].get("rope.triton", 0) > 0
