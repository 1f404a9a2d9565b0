"""Issue 7 on the GPU: weight groups in one scratch + one GEMM, and the side-stream prefetch.

References: torch float64 on the gguf package's dequantization (independent), and the
per-weight path. Outputs are poisoned (NaN left in the caching allocator), so an unwritten
element fails. Prefetch on vs off must give bit-identical outputs (same kernels, same GEMM
shapes): a missing event between the streams would show as a difference (a GEMM reading a
half-written buffer) at the 7B's shapes, where the side-stream dequant overlaps the GEMM.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


def ctx_for(weights=(), groups=(), head=(), **switches) -> Context:
    """An engine's context in miniature: switches and a workspace of its own declaring `groups`."""
    from minfer.ops.cuda import Workspace

    return Context(Switches(**switches), Workspace(DEV, weights, groups, head))


def poison():
    t = torch.full((128 << 20,), float("nan"), dtype=torch.float32, device=DEV)
    del t


def make(qt, n, k, seed, name, ref=True):
    from minfer.ops.cuda import prepare_weight
    from minfer.weights import QWeight

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    w = QWeight(name, qt, (n, k), torch.from_numpy(raw).to(DEV))
    prepare_weight(w)
    return w, (torch.from_numpy(reference_dequant(raw, qt, n, k)) if ref else None)


GROUPS = {"q4k_q4k_q6k": [(12, 1024), (12, 256), (14, 256)], "q5_0_q8_0": [(6, 1000), (8, 1000)]}


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("m", [64, 333, 3354])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_many_vs_linear_vs_reference(group, m, dtype):
    from minfer.ops import paths
    from minfer.ops.cuda import linear, linear_many

    k = 1024
    ws, refs = zip(*[make(qt, n, k, 7 * i + qt + m, f"blk.0.w{i}.weight") for i, (qt, n) in enumerate(GROUPS[group])])
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(dtype)
    biases = [torch.randn(w.shape[0], generator=g) for w in ws[:-1]] + [None]
    paths.reset()
    poison()
    outs = linear_many(x.to(DEV), ws, [None if b is None else b.to(DEV) for b in biases], ctx_for(ws, [ws]))
    torch.cuda.synchronize()
    assert paths.snapshot()["counts"].get(f"qmatmul.group{len(ws)}.prefill") == 1
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for w, ref, b, out in zip(ws, refs, biases, outs):
        want = x.double() @ ref.double().T + (0 if b is None else b.double())
        assert out.shape == (m, w.shape[0]) and out.dtype == dtype
        assert rel_err(out, want) < tol, rel_err(out, want)
        single = linear(x.to(DEV), w, None if b is None else b.to(DEV))
        assert rel_err(out, single.double().cpu()) < tol
    outs[0].view(m, 8, outs[0].shape[1] // 8)          # the model's q.view(T, H, Dh)


def _layers(n_layers, d, f, seed, ref=False):
    """Weights of n layers in the model's shapes; the qkv tuples are the declared groups."""
    layers = []
    for i in range(n_layers):
        s = seed + 100 * i
        L = {"qkv": tuple(make(qt, n, d, s + j, f"blk.{i}.attn_{'qkv'[j]}.weight", ref)[0]
                          for j, (qt, n) in enumerate([(12, d), (12, d // 7), (14, d // 7)])),
             "o": make(12, d, d, s + 3, f"blk.{i}.attn_output.weight", ref)[0],
             "gu": tuple(make(12, f, d, s + 4 + j, f"blk.{i}.ffn_{n}.weight", ref)[0]
                         for j, n in enumerate(["gate", "up"])),
             "down": make(14, d, f, s + 6, f"blk.{i}.ffn_down.weight", ref)[0]}
        L["qkv_b"] = tuple(torch.randn(w.shape[0], device=DEV) for w in L["qkv"])
        layers.append(L)
    return layers


def _weights(layers):
    return [w for L in layers for w in (*L["qkv"], L["o"], *L["gu"], L["down"])]


def _forward(layers, x, xf, ctx):
    """The model's order of calls; the outputs feed nothing back, so they compare exactly."""
    from minfer.ops.cuda import linear, linear_many

    outs = []
    for L in layers:
        outs += linear_many(x, L["qkv"], L["qkv_b"], ctx)
        outs.append(linear(x, L["o"], None, ctx))
        outs += [linear(x, w, None, ctx) for w in L["gu"]]
        outs.append(linear(xf, L["down"], None, ctx))
    return [o.clone() for o in outs]


@pytest.mark.parametrize("m", [512, 3354])
def test_prefetch_identical_and_hits_at_7b_shapes(m):
    """3 layers of the 7B's shapes (d 3584, ffn 18944): prefetch on == off, bit for bit."""
    from minfer.ops import paths
    from minfer.ops.cuda import linear

    per_layer = 5                                    # q,k,v | o | gate | up | down
    d, f = 3584, 18944
    layers = _layers(3, d, f, seed=1)
    weights, groups = _weights(layers), [L["qkv"] for L in layers]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(m, d, generator=g).to(torch.bfloat16).to(DEV)
    xf = torch.randn(m, f, generator=g).to(torch.bfloat16).to(DEV)
    want = _forward(layers, x, xf, ctx_for(weights, groups, prefetch=False))
    ctx = ctx_for(weights, groups)
    paths.reset()
    for _ in range(3):                       # cold (records), closing the cycle, all predicted
        poison()
        got = _forward(layers, x, xf, ctx)
        torch.cuda.synchronize()
        for a, b in zip(want, got):
            assert torch.equal(a, b)
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.hit") == 3 * per_layer - 1 + 3 * per_layer and "prefetch.miss" not in counts, counts
    # mispredicted: layer 2's down out of turn, then a forward: outputs still identical
    paths.reset()
    odd = linear(xf, layers[2]["down"], None, ctx).clone()   # the forward's last output, out of turn
    got = _forward(layers, x, xf, ctx)
    torch.cuda.synchronize()
    assert torch.equal(odd, want[-1])
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.miss", 0) >= 1 and counts.get("prefetch.hit", 0) >= 8, counts
    assert ctx.workspace.nbytes() <= 2 * (f * d * 2)          # two buffers of at most one gate


def test_group_switches_same_values():
    """fuse_groups and prefetch off (the single-scratch path) agree with the fused one."""
    from minfer.ops import paths
    from minfer.ops.cuda import linear_many

    ws = [make(12, 4096, 1024, s, f"blk.3.w{s}.weight", ref=False)[0] for s in (1, 2)]
    x = torch.randn(333, 1024, device=DEV, dtype=torch.bfloat16)
    paths.reset()
    a = linear_many(x, ws, (None, None), ctx_for(ws, [tuple(ws)]))
    b = linear_many(x, ws, (None, None), ctx_for(ws, [tuple(ws)], fuse_groups=False, prefetch=False))
    snap = paths.snapshot()
    assert snap["counts"]["qmatmul.group2.prefill"] == 1 and snap["counts"]["qmatmul.Q4_K.prefill"] == 2
    assert any("MINFER_FUSE_GROUPS" in key for key in snap["switched_off"])
    for u, v in zip(a, b):
        assert rel_err(u, v.double().cpu()) < 1e-2


def test_memory_report_prints_the_plan():
    from minfer.ops.cuda import Workspace, memory_report

    ws = [make(12, n, 1024, n, name, ref=False)[0] for n, name in
          [(2048, "blk.0.ffn_gate.weight"), (2048, "blk.0.ffn_up.weight"), (1024, "blk.0.attn_q.weight")]]
    line = memory_report(ws, Workspace(DEV, ws, []), Switches(), torch.bfloat16)
    assert "prefill scratch 2 x 4 MiB" in line, line                  # gate: 2048 x 1024 bf16
    line = memory_report(ws, Workspace(DEV, ws, [tuple(ws[:2])]), Switches(), torch.bfloat16)
    assert "prefill scratch 2 x 8 MiB" in line, line                  # a declared gate+up group: 8 MiB
