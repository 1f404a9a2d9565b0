"""Prefill groups and prefetch bookkeeping (docs/perf-log.md section 7), on the CPU through
Triton's interpreter, with the engine-owned Workspace passed in the ops context.

linear_many (one scratch for a declared group of weights of mixed types, one GEMM) is compared
with torch float64 on the gguf package's dequantization (the independent format reference);
fp32/fp16 only (the interpreter's bf16 is wrong, ANCHORS.md). The prefetch runner runs its
side-stream work inline on the CPU, with the same bookkeeping as on the GPU, so the recorded
sequence, hits, misses and the content of prefetched buffers are checked here.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.ops.context import Context  # noqa: E402
from minfer.ops.cuda.workspace import Workspace  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul", "minfer.ops.cuda"]


@pytest.fixture(scope="module")
def qm():
    """qmatmul (re)loaded with the interpreter on; restored afterwards."""
    yield from interpreted_modules(_MODS)


def ctx_for(weights=(), groups=(), head=(), **switches) -> Context:
    """An engine's context in miniature: switches and a CPU workspace declaring `groups`."""
    return Context(Switches(**switches), Workspace("cpu", weights, groups, head))


def make(qt, n, k, seed, name):
    from minfer.weights import QWeight

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return QWeight(name, qt, (n, k), torch.from_numpy(raw)), torch.from_numpy(reference_dequant(raw, qt, n, k))


GROUPS = {
    "q4k_q4k_q6k": [(12, 64), (12, 32), (14, 32)],      # q, k, v of mixed K-quant types
    "q5_0_q8_0": [(6, 48), (8, 80)],                    # gate, up of two 32-blocks types
}


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_many_matches_reference(qm, group, dtype):
    from minfer.ops import paths

    k = 512
    ws, refs = zip(*[make(qt, n, k, 10 * i + qt, f"blk.0.w{i}.weight") for i, (qt, n) in enumerate(GROUPS[group])])
    ctx = ctx_for(ws, [ws])
    g = torch.Generator().manual_seed(len(ws))
    m = 40                                                   # above the GEMV crossover (32)
    x = (torch.randn(m, k, generator=g) * 0.5).to(dtype)
    biases = [None] + [torch.randn(w.shape[0], generator=g) for w in ws[1:]]
    paths.reset()
    outs = qm["qmatmul"].linear_many(x, ws, biases, ctx)
    assert len(outs) == len(ws)
    for w, ref, b, out in zip(ws, refs, biases, outs):
        want = x.double() @ ref.double().T + (0 if b is None else b.double())
        assert out.shape == (m, w.shape[0]) and out.dtype == dtype
        assert rel_err(out, want) < (1e-5 if dtype == torch.float32 else 3e-3), rel_err(out, want)
    assert paths.snapshot()["counts"].get(f"qmatmul.group{len(ws)}.prefill") == 1
    # the model views q/k/v as (T, H, Dh): every output must allow that view
    outs[0].view(m, 4, outs[0].shape[1] // 4)


def test_group_switch_off_and_decode_path(qm):
    from minfer.ops import paths

    k = 256
    ws, refs = zip(*[make(12, 32, k, s, f"blk.1.w{s}.weight") for s in (1, 2)])
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(3))
    paths.reset()
    outs = qm["qmatmul"].linear_many(x, ws, (None, None), ctx_for(ws, [ws], fuse_groups=False))
    snap = paths.snapshot()
    assert snap["counts"] == {"qmatmul.Q4_K.prefill": 2}
    assert snap["switched_off"]["qmatmul.group2.prefill (switched off by MINFER_FUSE_GROUPS=0)"] == 1
    for out, ref in zip(outs, refs):
        assert rel_err(out, x.double() @ ref.double().T) < 1e-5
    paths.reset()
    outs = qm["qmatmul"].linear_many(x[:3], ws, (None, None), ctx_for(ws, [ws]))   # decode M: GEMV per weight
    assert paths.snapshot()["counts"] == {"qmatmul.Q4_K.decode": 2}
    for out, ref in zip(outs, refs):
        assert rel_err(out, x[:3].double() @ ref.double().T) < 1e-5


def test_undeclared_weights_go_one_by_one(qm):
    """Weights passed together that the model did not declare as a group (gate/up: apart by
    decision, docs/perf-log.md section 10) go through the scratch one at a time."""
    from minfer.ops import paths

    g, gd = make(12, 64, 256, 1, "blk.0.ffn_gate.weight")
    u, ud = make(14, 32, 256, 2, "blk.0.ffn_up.weight")
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(0))
    paths.reset()
    on = qm["qmatmul"].linear_many(x, (g, u), (None, None), ctx_for((g, u), [(g, u)]))
    assert paths.snapshot()["counts"].get("qmatmul.group2.prefill") == 1
    paths.reset()
    off = qm["qmatmul"].linear_many(x, (g, u), (None, None), ctx_for((g, u), []))
    snap = paths.snapshot()
    assert "qmatmul.group2.prefill" not in snap["counts"] and not snap["switched_off"], snap
    assert snap["counts"].get("qmatmul.Q4_K.prefill") == 1 and snap["counts"].get("qmatmul.Q6_K.prefill") == 1, snap
    for a, b, wd in zip(on, off, (gd, ud)):
        ref = x.double() @ wd.double().T
        assert rel_err(a, ref) < 1e-5 and rel_err(b, ref) < 1e-5


def test_group_too_big_is_chunked(qm):
    """A weight over one buffer (the lm head) goes in chunks of a buffer."""
    w, ref = make(14, 200, 2048, 3, "output.weight")        # 409600 values -> 2 chunks
    x = torch.randn(33, 2048, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(200)
    out = qm["qmatmul"].linear(x, w, bias, ctx_for((w,), group_scratch_mb=1))   # 262144 fp32 values
    assert rel_err(out, x.double() @ ref.double().T + bias.double()) < 1e-5


class _W:
    """A stand-in weight for the sequence logic (hashed and compared by identity, like QWeight)."""


def test_sequence_learns_successors(qm):
    from minfer.ops.cuda.prefetch import Sequence as S
    a, b, c, d = _W(), _W(), _W(), _W()
    s = S()
    assert [s.observe((a,)), s.observe((b, c)), s.observe((d,))] == ["cold"] * 3
    assert s.predicted() is None                       # d's successor is not known yet
    assert s.observe((a,)) == "cold"                   # learns d -> a
    assert s.predicted() == (b, c)
    assert s.observe((b, c)) == "expected" and s.predicted() == (d,)
    assert s.observe((a,)) == "miss"                   # d skipped
    assert s.predicted() == (b, c)
    assert s.observe((b, c)) == "expected" and s.observe((a,)) == "expected"   # relearned b,c -> a
    e = _W()
    assert s.observe((e,)) == "miss" and s.predicted() is None
    s2 = S()                                           # another workspace's sequence: its own
    assert s2.predicted() is None and s2.observe((a,)) == "cold"


def _forward(qm, layers, x_attn, x_ffn, ctx):
    """The calls of a forward: q,k,v | o | gate | up | down per layer, as the model makes them."""
    q = qm["qmatmul"]
    outs = []
    for L in layers:
        outs += q.linear_many(x_attn, L["qkv"], L["qkv_b"], ctx)
        outs.append(q.linear(x_attn, L["o"], None, ctx))
        outs += [q.linear(x_ffn, w, None, ctx) for w in L["gu"]]
        outs.append(q.linear(x_ffn, L["down"], None, ctx))
    return outs


def _layers(k):
    layers = []
    for i in range(2):
        L = {"qkv": tuple(make(qt, n, k, 100 * i + j, f"blk.{i}.attn_{'qkv'[j]}.weight")[0]
                          for j, (qt, n) in enumerate([(12, 64), (12, 32), (14, 32)])),
             "o": make(12, 256, k, 100 * i + 5, f"blk.{i}.attn_output.weight")[0],
             "gu": tuple(make(qt, 96, k, 100 * i + 6 + j, f"blk.{i}.ffn_{n}.weight")[0]
                         for j, (qt, n) in enumerate([(6, "gate"), (8, "up")])),
             "down": make(14, 256, k, 100 * i + 9, f"blk.{i}.ffn_down.weight")[0]}
        L["qkv_b"] = (torch.randn(64), torch.randn(32), torch.randn(32))
        layers.append(L)
    weights = [w for L in layers for w in (*L["qkv"], L["o"], *L["gu"], L["down"])]
    return layers, weights, [L["qkv"] for L in layers]


def test_prefetch_hits_and_same_outputs(qm):
    from minfer.ops import paths

    per_layer = 5                                            # q,k,v | o | gate | up | down
    k = 256
    layers, weights, groups = _layers(k)
    g = torch.Generator().manual_seed(0)
    xa, xf = torch.randn(40, k, generator=g), torch.randn(40, k, generator=g)

    want = _forward(qm, layers, xa, xf, ctx_for(weights, groups, prefetch=False))
    ctx = ctx_for(weights, groups)                           # a fresh workspace: nothing recorded
    paths.reset()
    cold = _forward(qm, layers, xa, xf, ctx)                  # records the sequence
    assert "prefetch.hit" not in paths.snapshot()["counts"]
    paths.reset()
    warm = _forward(qm, layers, xa, xf, ctx)  # its first call closes the recorded cycle, then hits
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.hit") == 2 * per_layer - 1 and "prefetch.miss" not in counts, counts
    paths.reset()
    warm2 = _forward(qm, layers, xa, xf, ctx)                 # every group predicted
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.hit") == 2 * per_layer and "prefetch.miss" not in counts, counts
    assert all(torch.equal(a, c) for a, c in zip(want, warm2))
    for a, b_, c in zip(want, cold, warm):
        assert torch.equal(a, b_) and torch.equal(a, c)
    # a mispredicted call: layer 1's o projection out of turn, then the forward again
    paths.reset()
    odd = qm["qmatmul"].linear(xa, layers[1]["o"], None, ctx)
    again = _forward(qm, layers, xa, xf, ctx)
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.miss", 0) >= 1 and counts.get("prefetch.hit", 0) >= 6, counts
    assert torch.equal(odd, want[10])                        # layer 1: q,k,v,o,gate,up,down, q,k,v, o
    for a, c in zip(want, again):
        assert torch.equal(a, c)


def test_two_workspaces_keep_their_own_plans(qm):
    """Two engines' workspaces share nothing: one's recorded sequence gives the other no hits,
    and no reset between them is needed."""
    from minfer.ops import paths

    k = 256
    layers, weights, groups = _layers(k)
    g = torch.Generator().manual_seed(1)
    xa, xf = torch.randn(40, k, generator=g), torch.randn(40, k, generator=g)
    a = ctx_for(weights, groups)
    for _ in range(2):
        _forward(qm, layers, xa, xf, a)                       # a learns the sequence
    b = ctx_for(weights, groups)
    paths.reset()
    _forward(qm, layers, xa, xf, b)
    assert "prefetch.hit" not in paths.snapshot()["counts"]  # b starts cold
    assert a.workspace.nbytes() > 0 and b.workspace.nbytes() > 0
    assert a.workspace._runners[torch.float32].bufs[0].data_ptr() != b.workspace._runners[torch.float32].bufs[0].data_ptr()


class _Shape:
    """A stand-in weight with only a shape (the plan reads nothing else)."""

    def __init__(self, n, k=1):
        self.shape = (n, k)


def test_scratch_plan_counts_groups():
    q, k, v, gate, up, down, out = (_Shape(n) for n in (100, 20, 20, 300, 300, 300, 10**12))
    ws = Workspace("cpu", [q, k, v, gate, up, down, out], [(q, k, v)], head=[out])
    assert ws.planned_group_elems(torch.bfloat16, Switches()) == 300     # gate, up, down alone
    ws2 = Workspace("cpu", [q, k, v, gate, up, down, out], [(q, k, v), (gate, up)], head=[out])
    assert ws2.planned_group_elems(torch.bfloat16, Switches()) == 600    # gate+up; the lm head does not fit


def test_single_scratch_sized_by_layer_weights():
    """The single scratch (graphed prompts, or both switches off) is sized by the largest layer
    weight: the lm head of a prefill is the last row's GEMV and the embedding a gather, so the
    7B's 545M-value output matrix must not claim the 256 MiB cap."""
    down, out, emb = _Shape(18944, 3584), _Shape(152064, 3584), _Shape(152064, 3584)
    ws = Workspace("cpu", [emb, down, out], [], head=[emb, out])
    off = Switches(prefetch=False, fuse_groups=False)
    assert ws.planned_scratch_bytes(torch.bfloat16, off) == 18944 * 3584 * 2    # 130 MiB, not 256
    assert "+ 130 MiB" not in ws.plan_text(torch.bfloat16, off)                   # runner off: one scratch
    assert "+ 130 MiB when a prompt of <= 1024 tokens is first graphed" in \
        ws.plan_text(torch.bfloat16, Switches(prefetch=False))
