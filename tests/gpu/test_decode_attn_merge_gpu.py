"""Switches.decode_attn_merge on the GPU: the one-token decode attention whose last program of each
KV head merges the key splits (attention_merge.merge_tail) against the same kernel followed by the
combine launch, at the 7B's heads (28 / 4 x 128, bf16 caches of 4096 rows: 32 splits, 64-key
tiles) with the key count in a device tensor as a graph passes it; the same captured in a CUDA
graph and replayed at other depths (the tickets must reset themselves); and a whole model's
graphed greedy decode with the switch on and off (graphed_pair's rule). The merge sums the
splits in another order than the combine (rounds of 16 with a running max), so the bf16 outputs
agree within a bf16 step and the int8 forms within one quant step, not bit for bit."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

H, HKV, DH, ROWS = 28, 4, 128, 4096


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(ROWS, HKV, DH, generator=g).to(torch.bfloat16).cuda()
    vc = torch.randn(ROWS, HKV, DH, generator=g).to(torch.bfloat16).cuda()
    q = torch.randn(1, H, DH, generator=g).to(torch.bfloat16).cuda()
    return q, kc, vc


def _check_close(a, b, ref):
    """a (merged in the kernel) against b (the combine) and the float64 reference: bf16 outputs
    within a bf16 step of each other, the int8 forms' scales to float32 rounding and their
    dequantized values within one quant step (most of them equal)."""
    from minfer.ops.cuda.q8_rows import dequantize_q8

    assert rel_err(a, ref) < 1e-2 and rel_err(b, ref) < 1e-2
    assert rel_err(a, b) < 2e-3
    assert torch.allclose(a.float(), b.float(), rtol=2 ** -7, atol=1e-4)
    (_, fa), (_, fb) = a.q8, b.q8
    da, db = fa.view(-1, 4)[:, 0], fb.view(-1, 4)[:, 0]
    assert torch.allclose(da, db, rtol=1e-4, atol=0)
    xa, xb = dequantize_q8(a.q8, H * DH), dequantize_q8(b.q8, H * DH)
    assert (xa - xb).abs().max() <= float(db.max()) * 1.0001
    assert (xa != xb).float().mean() < 0.02


@pytest.mark.parametrize("n_keys", [16, 3354])
@pytest.mark.parametrize("pdl", [0, 1])
def test_merge_matches_the_combine_at_the_7b_heads(n_keys, pdl):
    from minfer.ops import paths, reference
    from minfer.ops.cuda import attention_merge as AM
    from minfer.ops.cuda import decode_attention

    q, kc, vc = _inputs(n_keys)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64, device="cuda")
    paths.reset()
    a = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pdl=pdl, pre=True, merge=True)
    b = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pdl=pdl, pre=True, merge=False)
    torch.cuda.synchronize()
    assert paths.snapshot()["counts"].get("attention.decode.merge") == 1
    assert not AM.counters(q.device, HKV).any()              # every ticket reset by its merging program
    ref = reference.attention(q.double(), kc.double(), vc.double(), n_keys - 1)
    _check_close(a, b, ref)
    again = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pdl=pdl, pre=True, merge=True)
    assert torch.equal(a, again) and all(torch.equal(x, y) for x, y in zip(a.q8, again.q8))


def test_merge_replays_in_a_graph_at_other_depths():
    """Captured once (the grid covers the cache), replayed at depths of one, many and all but a
    few splits: each replay equal to the combine path run apart, the tickets zero after each."""
    from minfer.ops import reference
    from minfer.ops.cuda import attention_merge as AM
    from minfer.ops.cuda import decode_attention

    q, kc, vc = _inputs(7)
    pos = torch.tensor([100], dtype=torch.int64, device="cuda")
    decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, merge=True)       # compile, tickets allocated
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, merge=True)
    for n_keys in (16, 3354, 1, 4096, 700, 3354):
        pos.fill_(n_keys - 1)
        g.replay()
        torch.cuda.synchronize()
        assert not AM.counters(q.device, HKV).any(), n_keys
        b = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, merge=False)
        _check_close(out, b, reference.attention(q.double(), kc.double(), vc.double(), n_keys - 1))


def test_graphed_decode_with_the_merge_in_the_kernel(tmp_path, monkeypatch):
    """A whole model's graphed greedy decode with decode_attn_merge against without it: the same
    tokens (graphed_pair's rule); the prefill is untouched (bitwise); the merging kernel counted
    and never fallen back from."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(decode_attn_merge=True), None, seed=13, prompt_seed=4,
                           n_prompt=37, same_prefill=True)
    counts = snap["counts"]
    assert counts.get("graph.decode.replay", 0) >= 40, counts
    assert counts.get("attention.decode.merge", 0) > 0, counts
    assert not [k for k in snap["fallbacks"] if "merge" in k], snap["fallbacks"]
