"""The CUDA backend's attention for values narrower than the keys (deepseek2's latent cache: K rows of
kv_lora + rope dims, V their first kv_lora dims) -- the counted torch path attention.mla.torch of
ops/cuda/attention.py -- run on CPU tensors (it is torch code): eager prefill after a prefix, and the
host-free decode step (start a device tensor, as under a CUDA graph) over a cache whose rows past the
position hold garbage (one row takes this path where the MLA decode kernel is switched off or refused). Expected: softmax(scale q k^T, causal) v written out here in float64."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")


def _want(q, k, v, start, scale):
    T, S = q.shape[0], start + q.shape[0]
    s = torch.einsum("thd,sd->ths", q.double(), k[:S, 0].double()) * scale
    mask = torch.arange(S)[None, :] <= (start + torch.arange(T))[:, None]
    p = torch.softmax(s.masked_fill(~mask[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("ths,sd->thd", p, v[:S, 0].double())


@pytest.mark.parametrize("T,start,graph", [(1, 9, True), (1, 0, True), (1, 9, False), (5, 4, False), (6, 0, False)])
def test_mla_torch_path(T, start, graph):
    import importlib

    from minfer.ops import paths
    from minfer.ops.context import Context

    A = importlib.import_module("minfer.ops.cuda.attention")   # (minfer.ops.cuda.attention is also a function)

    g = torch.Generator().manual_seed(T * 31 + start)
    H, Dk, Dv, rows = 8, 20, 16, 24
    k = torch.randn(rows, 1, Dk, generator=g)
    k[start + T:] = 1e4                              # rows no query may see (stale or unwritten)
    v = k[..., :Dv]
    q = torch.randn(T, H, Dk, generator=g)
    scale = 0.3 / math.sqrt(Dk)
    paths.reset()
    pos = torch.tensor([start]) if graph else start
    # one row: the torch path with the MLA decode kernel switched off (the kernel itself:
    # test_attention_mla_interpreted.py)
    ctx = Context().with_switches(decode_attention=False)
    got = A.attention(q, k, v, pos, ctx, scale=scale)
    assert got.shape == (T, H, Dv)
    assert torch.allclose(got.double(), _want(q, k, v, start, scale), atol=1e-5)
    snap = paths.snapshot()
    assert snap["counts"].get("attention.mla.torch") == 1
    assert any(f.startswith("attention.mla.decode.triton") for f in snap["switched_off"]) == (T == 1)
    assert not snap["fallbacks"]
