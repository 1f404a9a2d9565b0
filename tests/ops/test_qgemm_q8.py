"""The int8 tensor-core batched-decode GEMM (minfer.ops.cuda.qgemm_q8) in Triton's interpreter.

Independent reference: gguf's dequantize of random raw blocks (kernel_data.reference_dequant)
times the activations' x_hat in float64, x_hat from gemv_q8.dequantize_q8 (the q8 form's
meaning, checked against llama.cpp's q8_1 rule in test_gemv_q8.py). The interpreter runs the
same int8 x int8 -> int32 tl.dot as the GPU (numpy's integer matmul there, the tensor cores
on the device): one code path, no interpreter-only branch.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import (ModelStub, interpreted_modules, qweights_with_reference, random_weight,  # noqa: E402
                         reference_dequant, rel_err)

from minfer.errors import MinferError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.qgemm_q8"]):
        yield mods["qgemm_q8"], mods["gemv_q8"], mods["gemv_repack"]


_W = {}


def _weight(G, qt, n, k):
    if (qt, n, k) not in _W:
        raw = random_weight(qt, n, k, np.random.default_rng(70 + qt))
        _W[qt, n, k] = (G.repack(torch.from_numpy(raw), qt, n, k),
                        torch.from_numpy(reference_dequant(raw, qt, n, k)).double())
    return _W[qt, n, k]


def _rows(q8m, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0, 64:96] = 0.0                                                  # an all-zero chunk: d = 0
    q8 = q8m.quantize_rows(x, interpret=True)
    xh = q8m.dequantize_q8(q8, m * k).view(m, k).double()
    return x, q8, xh


# (M, N, K, config): N not a multiple of BN; split 1 and split K (the ticket reduce); M past BM
CASES = [(3, 45, 512, (32, 16, 4, 1, 4, 1)),
         (17, 45, 768, (32, 16, 2, 3, 4, 1)),
         (33, 70, 512, (64, 32, 8, 2, 4, 1))]


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"m{c[0]}_n{c[1]}_k{c[2]}_split{c[3][3]}")
def test_qgemm_q8_exact_against_gguf(Q, qt, case):
    Q8G, q8m, G = Q
    m, n, k, cfg = case
    rw, w = _weight(G, qt, n, k)
    x, q8, xh = _rows(q8m, m, k, seed=m + qt)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5)) if m != 3 else None
    out = Q8G.qgemm_q8(q8, rw, bias=bias, out_dtype=torch.float32, config=cfg, interpret=True)
    ref = xh @ w.T + (bias.double() if bias is not None else 0.0)
    assert out.shape == (m, n)
    assert rel_err(out, ref) < 1e-5
    # each row on its own too (a wrong M stride or row clamp shows here, not in the norm)
    for r in (0, m - 1):
        assert rel_err(out[r], ref[r]) < 1e-5
    # and it approximates the unquantized product as far as int8 rounding allows
    assert 1e-4 < rel_err(out, x.double() @ w.T + (bias.double() if bias is not None else 0.0)) < 2e-2


def test_qgemm_q8_default_config_and_bf16_out(Q):
    Q8G, q8m, G = Q
    rw, w = _weight(G, 12, 45, 512)
    _, q8, xh = _rows(q8m, 17, 512, seed=9)
    out = Q8G.qgemm_q8(q8, rw, interpret=True)                         # config_for(interpret), bf16 out
    assert out.dtype == torch.bfloat16 and out.shape == (17, 45)
    assert rel_err(out, xh @ w.T) < 1e-2


def test_qgemm_q8_split_counters_reset(Q):
    """The split reduce's tickets come back to zero (CUDA-graph replays reuse them)."""
    Q8G, q8m, G = Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, w = _weight(G, 14, 45, 768)
    _, q8, xh = _rows(q8m, 17, 768, seed=4)
    ws = GemvWorkspace("cpu", 64)
    for _ in range(2):
        out = Q8G.qgemm_q8(q8, rw, out_dtype=torch.float32, config=(32, 16, 2, 3, 4, 1), ws=ws, interpret=True)
        assert rel_err(out, xh @ w.T) < 1e-5
    assert int(ws.cnt.abs().sum()) == 0


def test_qgemm_q8_refuses_bad_inputs(Q):
    Q8G, q8m, G = Q
    rw, _ = _weight(G, 12, 45, 512)
    _, q8, _ = _rows(q8m, 3, 512, seed=1)
    with pytest.raises(MinferError, match="q8 rows"):
        Q8G.qgemm_q8((q8[0][:, :64], q8[1]), rw, interpret=True)
    with pytest.raises(MinferError, match="bias"):
        Q8G.qgemm_q8(q8, rw, bias=torch.zeros(44), interpret=True)
    with pytest.raises(MinferError, match="chunks per step"):
        Q8G.qgemm_q8(q8, rw, config=(32, 16, 3, 1, 4, 1), interpret=True)


# ---------------------------------------------------------------- wiring (ops/cuda/qmatmul.py, batch_engine)

@pytest.fixture(scope="module")
def QM():
    names = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.gemv_repack",
             "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8", "minfer.ops.cuda.qgemm_repack", "minfer.ops.cuda.qgemm_q8",
             "minfer.ops.cuda.qmatmul"]
    for mods in interpreted_modules(names):
        yield mods


def test_linear_takes_qgemm_q8_between_the_gemv_and_qgemm_max_m(QM):
    """Switches.qgemm_q8 on: dense_gemv_max_m < M <= qgemm_max_m goes through the int8 GEMM
    (counted qmatmul.<type>.qgemm_q8), a declared group in one launch, a mixed-type group (q/k
    Q4_K + v Q6_K) weight by weight; x.q8 is used when it matches. Off (the default): reported
    as switched off, not as a fallback."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches

    qm, gr, q8m = QM["qmatmul"], QM["gemv_repack"], QM["gemv_q8"]
    mk = qweights_with_reference([("blk.0.attn_q.weight", 12, 64, 256), ("blk.0.attn_k.weight", 12, 16, 256),
                    ("blk.0.attn_v.weight", 12, 16, 256), ("blk.0.ffn_down.weight", 14, 48, 256),
                    ("blk.1.attn_q.weight", 12, 32, 256), ("blk.1.attn_k.weight", 12, 16, 256),
                    ("blk.1.attn_v.weight", 14, 16, 256)], seed=3)
    ws = [w for w, _ in mk]
    grp, mixed = tuple(ws[:3]), tuple(ws[4:])
    gr.repack_model(ModelStub(ws, [grp, mixed]))
    assert getattr(ws[4], "repacked_segments", None) is not None
    on = Context(Switches(qgemm_q8=True), Workspace("cpu", ws, [grp, mixed]))
    g = torch.Generator().manual_seed(4)

    def xh(x):
        return q8m.dequantize_q8(q8m.quantize_rows(x, interpret=True), x.numel()).view(x.shape).double()

    down, wd = mk[3]
    x = torch.randn(12, 256, generator=g)
    paths.reset()
    out = qm.linear(x, down, None, on)
    assert rel_err(out, xh(x) @ wd.T) < 1e-5
    assert paths.snapshot()["counts"] == {"qmatmul.Q6_K.qgemm_q8": 1}
    x = torch.randn(20, 256, generator=g)
    bias = (torch.randn(64, generator=g), None, torch.randn(16, generator=g))
    paths.reset()
    outs = qm.linear_many(x, grp, bias, on)
    assert paths.snapshot()["counts"] == {"qmatmul.group3.qgemm_q8": 1}
    x_hat = xh(x)
    for (w, wref), o, b in zip(mk[:3], outs, bias):
        assert o.shape == (20, w.shape[0])
        assert rel_err(o, x_hat @ wref.T + (0 if b is None else b.double())) < 1e-5
    paths.reset()
    outs = qm.linear_many(x, mixed, (None, None, None), on)
    assert paths.snapshot()["counts"] == {"qmatmul.Q4_K.qgemm_q8": 2, "qmatmul.Q6_K.qgemm_q8": 1}
    for (w, wref), o in zip(mk[4:], outs):
        assert rel_err(o, x_hat @ wref.T) < 1e-5
    # the rows' int8 form carried by the tensor is used as is: a marked q8 (x's rows doubled)
    # shows in the output
    x2 = x.clone()
    x2.q8 = q8m.quantize_rows(2 * x, interpret=True)
    assert rel_err(qm.linear(x2, down, None, on), 2 * x_hat @ wd.T) < 1e-5
    paths.reset()
    x = x[:12]                                                         # the GEMV takes it when off
    out = qm.linear(x, down, None, Context(Switches(), Workspace("cpu", ws, [grp, mixed])))
    snap = paths.snapshot()
    assert rel_err(out, x.double() @ wd.T) < 1e-5 and not snap["fallbacks"]
    assert "qmatmul.Q6_K.qgemm_q8 (switched off by MINFER_QGEMM_Q8=0)" in snap["switched_off"]


def test_sweep_tiny_runs_in_the_interpreter(QM, tmp_path, capsys):
    """minfer/bench/qgemm_q8_sweep.py's code path (--tiny: the interpreter, tiny shapes): it checks
    each config against the float32 reference and writes a table load_configs reads."""
    from minfer.bench import qgemm_q8_sweep

    out = tmp_path / "cfg.json"
    assert qgemm_q8_sweep.main(["--tiny", "--out", str(out), "--json", str(tmp_path / "rows.json")]) == 0
    text = capsys.readouterr().out
    assert "WRONG" not in text and "Error" not in text
    assert set(QM["qgemm_q8"].load_configs(str(out))) == {"Q4_K 96x512 m16", "Q6_K 64x512 m16"}
