"""Issue 7's prefill groups and prefetch bookkeeping, on the CPU through Triton's interpreter.

linear_many (one scratch for several weights of mixed types, one GEMM or one per slice) is
compared with torch float64 on the gguf package's dequantization (the independent format
reference); fp32/fp16 only (the interpreter's bf16 is wrong, ANCHORS.md). The prefetch runner
runs its side-stream work inline on the CPU, with the same bookkeeping as on the GPU, so the
recorded sequence, hits, misses and the content of prefetched buffers are checked here.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.prefetch",
         "minfer.ops.cuda.qmatmul", "minfer.ops.cuda"]
_ENVS = ("MINFER_PREFETCH", "MINFER_FUSE_GROUPS", "MINFER_GROUP_GEMM", "MINFER_GEMV", "MINFER_GEMV_MAX_M",
         "MINFER_GROUP_SCRATCH_MB", "MINFER_GROUP_FFN")


@pytest.fixture(scope="module")
def qm():
    """qmatmul and prefetch (re)loaded with the interpreter on; restored afterwards."""
    yield from interpreted_modules(_MODS)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for e in _ENVS:
        monkeypatch.delenv(e, raising=False)


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
@pytest.mark.parametrize("mode", ["auto", "one", "split"])
def test_linear_many_matches_reference(qm, group, dtype, mode, monkeypatch):
    from minfer.ops import paths

    monkeypatch.setenv("MINFER_GROUP_GEMM", mode)
    k = 512
    ws, refs = zip(*[make(qt, n, k, 10 * i + qt, f"blk.0.w{i}.weight") for i, (qt, n) in enumerate(GROUPS[group])])
    g = torch.Generator().manual_seed(len(ws))
    m = 40                                                   # above the GEMV crossover (32)
    x = (torch.randn(m, k, generator=g) * 0.5).to(dtype)
    biases = [None] + [torch.randn(w.shape[0], generator=g) for w in ws[1:]]
    paths.reset()
    outs = qm["qmatmul"].linear_many(x, ws, biases)
    assert len(outs) == len(ws)
    for w, ref, b, out in zip(ws, refs, biases, outs):
        want = x.double() @ ref.double().T + (0 if b is None else b.double())
        assert out.shape == (m, w.shape[0]) and out.dtype == dtype
        assert rel_err(out, want) < (1e-5 if dtype == torch.float32 else 3e-3), rel_err(out, want)
    assert paths.snapshot()["counts"].get(f"qmatmul.group{len(ws)}.prefill") == 1
    # the model views q/k/v as (T, H, Dh): every output must allow that view
    outs[0].view(m, 4, outs[0].shape[1] // 4)


def test_group_switch_off_and_decode_path(qm, monkeypatch):
    from minfer.ops import paths

    k = 256
    ws, refs = zip(*[make(12, 32, k, s, f"blk.1.w{s}.weight") for s in (1, 2)])
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("MINFER_FUSE_GROUPS", "0")
    paths.reset()
    outs = qm["qmatmul"].linear_many(x, ws, (None, None))
    snap = paths.snapshot()
    assert snap["counts"] == {"qmatmul.Q4_K.prefill": 2}
    assert snap["switched_off"]["qmatmul.group2.prefill (switched off by MINFER_FUSE_GROUPS=0)"] == 1
    for out, ref in zip(outs, refs):
        assert rel_err(out, x.double() @ ref.double().T) < 1e-5
    monkeypatch.delenv("MINFER_FUSE_GROUPS")
    paths.reset()
    outs = qm["qmatmul"].linear_many(x[:3], ws, (None, None))          # decode M: GEMV per weight
    assert paths.snapshot()["counts"] == {"qmatmul.Q4_K.decode": 2}
    for out, ref in zip(outs, refs):
        assert rel_err(out, x[:3].double() @ ref.double().T) < 1e-5


def test_group_too_big_is_chunked(qm, monkeypatch):
    """A group over one buffer (the lm head) goes weight by weight in chunks of a buffer."""
    monkeypatch.setenv("MINFER_GROUP_SCRATCH_MB", "1")     # 262144 fp32 values
    w, ref = make(14, 200, 2048, 3, "output.weight")        # 409600 values -> 2 chunks
    x = torch.randn(33, 2048, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(200)
    out = qm["qmatmul"].linear(x, w, bias)
    assert rel_err(out, x.double() @ ref.double().T + bias.double()) < 1e-5


class _W:
    """A stand-in weight for the sequence logic (weakref-able, identity-compared)."""


def test_sequence_learns_successors(qm):
    S = qm["prefetch"].Sequence
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
    s2 = S()
    x = _W()
    s2.observe((x,))
    s2.observe((a,))                                   # x -> a
    s2.observe((x,))
    assert s2.predicted() == (a,)
    del x                                              # a freed group predicts nothing
    assert s2.predicted() is None


def _forward(qm, layers, x_attn, x_ffn):
    """The calls of a forward: q,k,v | o | gate,up | down per layer, as the model makes them."""
    q = qm["qmatmul"]
    outs = []
    for L in layers:
        outs += q.linear_many(x_attn, L["qkv"], L["qkv_b"])
        outs.append(q.linear(x_attn, L["o"]))
        outs += q.linear_many(x_ffn, L["gu"], (None, None))
        outs.append(q.linear(x_ffn, L["down"]))
    return outs


@pytest.mark.parametrize("ffn", ["0", "1"])
def test_prefetch_hits_and_same_outputs(qm, monkeypatch, ffn):
    from minfer.ops import paths

    monkeypatch.setenv("MINFER_GROUP_FFN", ffn)
    per_layer = 4 if ffn == "1" else 5                       # q,k,v | o | gate,up | down, or gate | up
    qm["prefetch"].reset()
    k = 256
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
    g = torch.Generator().manual_seed(0)
    xa, xf = torch.randn(40, k, generator=g), torch.randn(40, k, generator=g)

    monkeypatch.setenv("MINFER_PREFETCH", "0")
    want = _forward(qm, layers, xa, xf)
    monkeypatch.delenv("MINFER_PREFETCH")
    paths.reset()
    cold = _forward(qm, layers, xa, xf)                       # records the sequence
    assert "prefetch.hit" not in paths.snapshot()["counts"]
    paths.reset()
    warm = _forward(qm, layers, xa, xf)      # its first call closes the recorded cycle, then hits
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.hit") == 2 * per_layer - 1 and "prefetch.miss" not in counts, counts
    paths.reset()
    warm2 = _forward(qm, layers, xa, xf)                      # every group predicted
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.hit") == 2 * per_layer and "prefetch.miss" not in counts, counts
    assert all(torch.equal(a, c) for a, c in zip(want, warm2))
    for a, b_, c in zip(want, cold, warm):
        assert torch.equal(a, b_) and torch.equal(a, c)
    # a mispredicted call: layer 1's o projection out of turn, then the forward again
    paths.reset()
    odd = qm["qmatmul"].linear(xa, layers[1]["o"])
    again = _forward(qm, layers, xa, xf)
    counts = paths.snapshot()["counts"]
    assert counts.get("prefetch.miss", 0) >= 1 and counts.get("prefetch.hit", 0) >= 6, counts
    assert torch.equal(odd, want[10])                        # layer 1: q,k,v,o,gate,up,down, q,k,v, o
    for a, c in zip(want, again):
        assert torch.equal(a, c)


def test_scratch_plan_counts_groups(qm):
    p = qm["prefetch"]
    p._planned.clear()
    for name, n in [("blk.0.attn_q.weight", 100), ("blk.0.attn_k.weight", 20), ("blk.0.attn_v.weight", 20),
                    ("blk.0.ffn_gate.weight", 300), ("blk.0.ffn_up.weight", 300), ("blk.0.ffn_down.weight", 300),
                    ("output.weight", 10**12)]:
        p.note_weight(name, n)
    assert p.planned_group_elems(torch.bfloat16) == 300      # default: gate, up, down alone
    os.environ["MINFER_GROUP_FFN"] = "1"                     # (clean_env restores it)
    assert p.planned_group_elems(torch.bfloat16) == 600      # gate+up; the lm head does not fit
    p._planned.clear()


def test_group_ffn_apart_by_default(qm, monkeypatch):
    """By default gate and up (by their GGUF names) go through the scratch one by one;
    MINFER_GROUP_FFN=1 makes them one group; same results; q/k/v stay one group."""
    from minfer.ops import paths

    g, gd = make(12, 64, 256, 1, "blk.0.ffn_gate.weight")
    u, ud = make(14, 32, 256, 2, "blk.0.ffn_up.weight")
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(0))
    monkeypatch.setenv("MINFER_GROUP_FFN", "1")
    paths.reset()
    on = qm["qmatmul"].linear_many(x, (g, u), (None, None))
    assert paths.snapshot()["counts"].get("qmatmul.group2.prefill") == 1
    monkeypatch.delenv("MINFER_GROUP_FFN")
    paths.reset()
    off = qm["qmatmul"].linear_many(x, (g, u), (None, None))
    snap = paths.snapshot()
    assert "qmatmul.group2.prefill" not in snap["counts"], snap
    assert snap["counts"].get("qmatmul.Q4_K.prefill") == 1 and snap["counts"].get("qmatmul.Q6_K.prefill") == 1, snap
    assert snap["counts"].get("qmatmul.ffn_apart") == 1 and not snap["switched_off"], snap
    for a, b, wd in zip(on, off, (gd, ud)):
        ref = x.double() @ wd.double().T
        assert rel_err(a, ref) < 1e-5 and rel_err(b, ref) < 1e-5
    q, qd = make(12, 32, 256, 3, "blk.0.attn_q.weight")
    k, kd = make(12, 32, 256, 4, "blk.0.attn_k.weight")
    paths.reset()
    qm["qmatmul"].linear_many(x, (q, k), (None, None))
    assert paths.snapshot()["counts"].get("qmatmul.group2.prefill") == 1


def test_single_scratch_sized_by_layer_weights(qm, monkeypatch):
    """The single scratch (graphed prompts, or both switches off) is sized by the largest layer
    weight: the lm head of a prefill is the last row's GEMV and the embedding a gather, so the
    7B's 545M-value output matrix must not claim the 256 MiB cap."""
    q = qm["qmatmul"]
    saved = q._largest_weight[0]
    try:
        q._largest_weight[0] = 0
        q.note_weight(18944 * 3584, "blk.0.ffn_down.weight")
        q.note_weight(152064 * 3584, "output.weight")
        q.note_weight(152064 * 3584, "token_embd.weight")
        monkeypatch.setenv("MINFER_PREFETCH", "0")
        monkeypatch.setenv("MINFER_FUSE_GROUPS", "0")
        assert q.planned_scratch_bytes(torch.bfloat16) == 18944 * 3584 * 2       # 130 MiB, not 256
        assert "+ 130 MiB" not in q.scratch_plan(torch.bfloat16)                  # runner off: one scratch
        monkeypatch.delenv("MINFER_PREFETCH")
        assert "+ 130 MiB when a prompt of <= 1024 tokens is first graphed" in q.scratch_plan(torch.bfloat16)
    finally:
        q._largest_weight[0] = saved
        qm["prefetch"]._planned.clear()
