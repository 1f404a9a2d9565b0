"""The CUDA backend's Triton kernels run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

Small sizes, fixed configs (the interpreter cannot autotune), and fp32/fp16 activations only:
the interpreter computes tl.dot on bf16 operands wrongly (ANCHORS.md), fp16/fp32 rightly.
References are independent: the gguf package's dequantize for the formats, torch float64
for the math, minfer.ops.reference for rope/norm/attention conventions.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import (DENSE_MODS, QUANT_NAMES, interpreted_modules, random_weight,  # noqa: E402
                         reference_dequant, rel_err)

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

_MODS = DENSE_MODS

# Triton 3.6's interpreter trips numpy's scalar-conversion deprecation on every index
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

QTYPES = [2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 0, 1, 30]


@pytest.fixture(scope="module")
def K():
    """The kernel modules, (re)loaded with the interpreter on; restored afterwards."""
    for mods in interpreted_modules(_MODS):
        yield type("K", (), {"dq": mods["dequant"], "gemv": mods["gemv"], "qm": mods["qmatmul"],
                             "nra": mods["norm_rope_act"], "emb": mods["embedding"], "attn": mods["attention"]})


def _k_for(qt, blocks):
    return blocks * (32 if QUANT_NAMES[qt] in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") else
                     16 if qt in (0, 1, 30) else 256)


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: QUANT_NAMES[q])
def test_dequant_bit_exact(K, qt):
    rng = np.random.default_rng(100 + qt)
    n, k = 7, _k_for(qt, 3)                    # rows and columns not multiples of the tile
    raw = random_weight(qt, n, k, rng)
    ref = reference_dequant(raw, qt, n, k)
    out = torch.full((n, k), float("nan"))
    K.dq.dequantize_into(torch.from_numpy(raw), qt, n, k, out, interpret=True)
    assert np.array_equal(out.numpy(), ref), f"max diff {np.abs(out.numpy() - ref).max()}"


@pytest.mark.parametrize("qt", [12, 14, 8, 1], ids=lambda q: QUANT_NAMES[q])
def test_dequant_fp16_out_and_row_gather(K, qt):
    rng = np.random.default_rng(7)
    n, k = 9, _k_for(qt, 2)
    raw = random_weight(qt, n, k, rng)
    ref = reference_dequant(raw, qt, n, k)
    idx = torch.tensor([3, 0, 8, 3, 5], dtype=torch.int64)
    out = torch.full((5, k), float("nan"), dtype=torch.float16)
    K.dq.dequantize_into(torch.from_numpy(raw), qt, 5, k, out, idx=idx, interpret=True)
    assert np.array_equal(out.numpy(), ref[idx.numpy()].astype(np.float16))


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: QUANT_NAMES[q])
@pytest.mark.parametrize("m,dtype,split", [(1, torch.float32, None), (1, torch.float32, 3),
                                           (5, torch.float16, None), (3, torch.float32, 2)])
def test_gemv(K, qt, m, dtype, split):
    rng = np.random.default_rng(1000 * qt + m)
    n, k = 21, _k_for(qt, 5)                   # 21 rows: a partial row tile; K not a tile multiple
    raw = random_weight(qt, n, k, rng)
    w = torch.from_numpy(reference_dequant(raw, qt, n, k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(qt + m)).to(dtype)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    ref = x.double() @ w.T + bias.double()
    out = K.gemv.gemv(x, torch.from_numpy(raw), qt, n, k, bias=bias, interpret=True, split=split)
    assert out.dtype == dtype and out.shape == (m, n)
    # fp32 math: far under 1e-5; fp16 operands of the dot: ~3e-4
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("qt", [0, 1, 30], ids=lambda q: QUANT_NAMES[q])
@pytest.mark.parametrize("k", [8, 24, 40])
def test_float_rows_not_a_multiple_of_16(K, qt, k):
    """Float weights are read in runs of 16 values; with K = 8, 24 or 40 a row ends inside a run.
    The GEMV must not take the next row's values (nor read past the tensor), and the decoder must
    not store them into the next output row (both did: gemma4's per-layer embedding of 8 dims)."""
    rng = np.random.default_rng(10 * qt + k)
    n = 7
    raw = random_weight(qt, n, k, rng)
    w = reference_dequant(raw, qt, n, k)
    out = torch.full((n, k), float("nan"))
    K.dq.dequantize_into(torch.from_numpy(raw), qt, n, k, out, interpret=True)
    assert np.array_equal(out.numpy(), w)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(k))
    for m in (1, 2):           # one row: the elementwise loop; two: the same kernel, one program a row
        got = K.gemv.gemv(x[:m].contiguous(), torch.from_numpy(raw), qt, n, k, interpret=True)
        assert rel_err(got, x[:m].double() @ torch.from_numpy(w).double().T) < 1e-5


@pytest.mark.parametrize("m", [1, 4, 40])
def test_linear_paths_and_switch(K, m, monkeypatch):
    from minfer.ops import paths
    from minfer.weights import QWeight

    qt, n, k = 12, 40, 512
    rng = np.random.default_rng(m)
    raw = random_weight(qt, n, k, rng)
    w = QWeight("blk.0.ffn_up.weight", qt, (n, k), torch.from_numpy(raw))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    ref = x.double() @ torch.from_numpy(reference_dequant(raw, qt, n, k)).double().T
    paths.reset()
    out = K.qm.linear(x, w)
    assert rel_err(out, ref) < 1e-5
    snap = paths.snapshot()["counts"]
    # one row over K = 512 <= gemv.ONE_PASS_MAX_K: the one-pass config (Switches.gemv_one_pass)
    assert snap == ({"qmatmul.Q4_K.decode.one_pass": 1} if m == 1 else {"qmatmul.Q4_K.decode": 1} if m <= 32
                    else {"qmatmul.Q4_K.prefill": 1})
    paths.reset()
    out = K.qm.linear(x, w, None, Context(Switches(gemv=False)))
    assert rel_err(out, ref) < 1e-5
    snap = paths.snapshot()
    assert snap["counts"] == {"qmatmul.Q4_K.prefill": 1}
    if m <= 32:
        assert snap["switched_off"] == {"qmatmul.Q4_K.decode (switched off by MINFER_GEMV=0)": 1}


def test_linear_chunked_prefill(K, monkeypatch):
    """A weight larger than the scratch is decoded and multiplied in row chunks."""
    from minfer.weights import QWeight

    qt, n, k = 14, 200, 2048
    raw = random_weight(qt, n, k, np.random.default_rng(3))
    w = QWeight("output.weight", qt, (n, k), torch.from_numpy(raw))
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(n)
    ref = x.double() @ torch.from_numpy(reference_dequant(raw, qt, n, k)).double().T + bias.double()
    # 1 MiB = 262144 fp32 values: 200 x 2048 -> 2 chunks (the single scratch: groups/prefetch off)
    ctx = Context(Switches(scratch_mb=1, prefetch=False, fuse_groups=False))
    out = K.qm.linear(x, w, bias, ctx)
    assert rel_err(out, ref) < 1e-5


def test_rms_norm_swiglu(K):
    from minfer.ops import reference

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 300, generator=g) * 3
    wt = torch.randn(300, generator=g)
    assert rel_err(K.nra.rms_norm(x, wt, 1e-6), reference.rms_norm(x.double(), wt.double(), 1e-6)) < 1e-6
    a, b = torch.randn(3, 333, generator=g) * 4, torch.randn(3, 333, generator=g)
    assert rel_err(K.nra.swiglu(a, b), reference.swiglu(a.double(), b.double())) < 1e-6
    # column views of one (T, 2F) group output, as a gate/up dense-plane GEMM gives them
    gu = torch.randn(3, 2 * 333, generator=g) * 3
    ga, ub = torch.split(gu, [333, 333], dim=1)
    assert not ga.is_contiguous()
    assert rel_err(K.nra.swiglu(ga, ub), reference.swiglu(ga.double(), ub.double())) < 1e-6


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_add_rms_norm_fused(K, monkeypatch, out_dtype):
    """The fused residual add + RMSNorm kernel (the default) vs the reference; with
    fused_add_norm off the separate add, rms_norm and cast give the same result."""
    from minfer.ops import paths, reference

    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 300, generator=g) * 3                  # float32 residual
    y = (torch.randn(6, 300, generator=g) * 2).to(torch.float16)  # a branch in the matmul dtype
    wt = torch.randn(300, generator=g)
    paths.reset()
    s, h = K.nra.add_rms_norm(x, y, wt, 1e-6, out_dtype)
    rs, rh = reference.add_rms_norm(x.double(), y.double(), wt.double(), 1e-6, torch.float64)
    assert s.dtype == torch.float32 and h.dtype == out_dtype and h.shape == (6, 300)
    assert rel_err(s, rs) < 1e-7
    assert rel_err(h, rh) < (1e-6 if out_dtype == torch.float32 else 1e-3)
    assert paths.snapshot()["counts"] == {"add_rms_norm.triton": 1}
    paths.reset()                                             # off: add, rms_norm, cast
    s2, h2 = K.nra.add_rms_norm(x, y, wt, 1e-6, out_dtype, Context(Switches(fused_add_norm=False)))
    assert torch.equal(s2, s) and rel_err(h2, rh) < (1e-6 if out_dtype == torch.float32 else 1e-3)
    snap = paths.snapshot()
    assert "add_rms_norm.triton" not in snap["counts"]
    assert snap["switched_off"] == {"add_rms_norm.triton (switched off by MINFER_FUSED_ADD_NORM=0)": 1}, snap


@pytest.mark.parametrize("style", ["neox", "normal"])
def test_rope(K, style):
    from minfer.config import RopeConfig
    from minfer.ops import reference

    cfg = RopeConfig(theta=1e6 if style == "neox" else 5e5, style=style, n_rot=64, freq_scale=0.5,
                     freq_factors=tuple(float(v) for v in np.linspace(1, 8, 32)) if style == "normal" else None)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, 64, generator=g)
    pos = torch.tensor([0, 1, 7, 500, 4095, 30000], dtype=torch.int64)
    ref = reference.rope(x.double(), pos, cfg)
    assert rel_err(K.nra.rope(x, pos, cfg), ref) < 1e-5


def test_embedding(K):
    from minfer.weights import QWeight

    qt, n, d = 14, 11, 512
    raw = random_weight(qt, n, d, np.random.default_rng(9))
    w = QWeight("token_embd.weight", qt, (n, d), torch.from_numpy(raw))
    ids = torch.tensor([10, 0, 4, 4])
    out = K.emb.embedding(ids, w)
    assert np.array_equal(out.numpy(), reference_dequant(raw, qt, n, d)[ids.numpy()])


@pytest.mark.parametrize("h,hkv,start", [(8, 2, 0), (7, 7, 40), (14, 2, 100)])
def test_decode_attention(K, h, hkv, start):
    from minfer.ops import reference

    g = torch.Generator().manual_seed(h + start)
    dh, s_max = 64, 160
    kc = torch.randn(s_max, hkv, dh, generator=g).half()
    vc = torch.randn(s_max, hkv, dh, generator=g).half()
    q = torch.randn(1, h, dh, generator=g).half()
    ref = reference.attention(q.double(), kc.double(), vc.double(), start)
    out = K.attn.decode_attention(q, kc, vc, start + 1, n_split=3)
    assert out.shape == (1, h, dh)
    assert rel_err(out, ref) < 5e-3           # fp16 probabilities into the P.V dot
    # the key count from a tensor (graph replay): the same result
    out2 = K.attn.decode_attention(q, kc, vc, torch.tensor([start + 1], dtype=torch.int32))
    assert rel_err(out2, ref) < 5e-3


def test_decode_attention_many_splits(K):
    """More splits than the combine kernel's chunk (16), most of them empty."""
    from minfer.ops import reference

    g = torch.Generator().manual_seed(5)
    kc = torch.randn(400, 2, 32, generator=g).half()
    vc = torch.randn(400, 2, 32, generator=g).half()
    q = torch.randn(1, 6, 32, generator=g).half()
    ref = reference.attention(q.double(), kc.double(), vc.double(), 290)
    out = K.attn.decode_attention(q, kc, vc, torch.tensor([291]), n_split=25)
    assert rel_err(out, ref) < 5e-3
