"""The batched-decode GEMM over repacked Q4_K / Q6_K planes (minfer.ops.cuda.qgemm_repack),
run by Triton's interpreter on the CPU at small shapes.

References are independent of the code under test: the gguf package's dequantize of the raw
blocks (kernel_data.reference_dequant) and float64 torch matmul.

Tolerances. The kernel rounds each exact weight once to x's dtype and accumulates in fp32, so
against x @ round(W)^T in float64 (W rounded to bf16/fp16 by torch) the only error left is
fp32 accumulation over K <= 768 terms: < 1e-5 (norm-relative), with fp32 outputs. Against the
exact W the bf16 rounding of the weights adds at most 2^-9 relative per weight; over random
signs the norm-relative error is ~2^-9/sqrt(3) ~ 1.1e-3, so 4e-3 bounds it (fp16: 2^-11, 1e-3).
The interpreter's bf16 tl.dot is wrong (tests/ops/test_gemv_repack.py), so with bf16 x the
interpreted kernel upcasts the already bf16-rounded tile and x to fp32 for the dot (DOT_F32);
the bf16 MMA itself is checked by tests/gpu/test_qgemm_repack_gpu.py.
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

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

TYPES = [12, 14]
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.qgemm_repack"]):
        yield mods["qgemm_repack"]


def _weight(qt, n, k, seed):
    from minfer.ops.cuda.gemv_repack_layout import repack

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = repack(torch.from_numpy(raw), qt, n, k)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


# (N, K, M, config [BN, BM, BK, SPLIT, warps, stages], inline reduce)
CASES = [
    (64, 512, 9, (32, 16, 256, 1, 4, 1), True),          # one M tile, two row tiles, no split
    (192, 512, 40, (64, 16, 512, 1, 4, 1), True),        # three M tiles (rows past M), BK = 512
    (100, 768, 17, (32, 32, 512, 2, 4, 1), True),        # rows past N; K = 768 with BK = 512: a half K step
    (96, 768, 33, (32, 64, 128, 3, 4, 1), True),         # split 3, reduced by the last program; BK = 128
    (80, 512, 12, (16, 16, 256, 2, 4, 1), False),        # split 2, reduced by the second kernel
]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n,k,m,cfg,inline", CASES, ids=[f"n{c[0]}k{c[1]}m{c[2]}s{c[3][3]}" for c in CASES])
def test_qgemm_bf16(Q, qt, n, k, m, cfg, inline):
    rw, w = _weight(qt, n, k, seed=n + m + qt)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    out = Q.qgemm(x, rw, out_dtype=torch.float32, config=cfg, inline_reduce=inline, interpret=True)
    assert out.shape == (m, n) and out.dtype == torch.float32
    xd = x.double()
    # the weights rounded once to bf16 (torch's round-to-nearest-even), fp32 accumulation only
    assert rel_err(out, xd @ w.to(torch.bfloat16).double().T) < 1e-5
    assert rel_err(out, xd @ w.T) < 4e-3
    # bf16 output: one more rounding of 2^-9 relative
    out16 = Q.qgemm(x, rw, config=cfg, inline_reduce=inline, interpret=True)
    assert out16.dtype == torch.bfloat16 and rel_err(out16, xd @ w.T) < 5e-3


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decoded_weights_are_bit_exact(Q, qt, dtype):
    """One-hot rows of x read single weights out: out[m, n] = W[n, j_m] in x's dtype exactly (one
    nonzero product, fp32 accumulation): fp32 x checks the decode's fp32 values bit for bit, bf16
    x their rounding. The columns cover every nibble p and word w of a chunk, both Q6_K scale
    halves, and chunks in the second block and the second K step."""
    n, k = 40, 768
    rw, w = _weight(qt, n, k, seed=21 + qt)
    cols = list(range(32)) + [32 * c + r for c, r in ((1, 5), (7, 31), (8, 0), (9, 17), (15, 30), (16, 3),
                                                       (23, 31), (12, 16), (13, 15))]
    x = torch.zeros(len(cols), k, dtype=dtype)
    x[torch.arange(len(cols)), torch.tensor(cols)] = 1.0
    out = Q.qgemm(x, rw, out_dtype=torch.float32, config=(16, 64, 256, 2, 4, 1), interpret=True)
    want = w.to(dtype).float()[:, cols].T
    assert torch.equal(out, want)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_qgemm_fp16_fp32(Q, qt, dtype):
    n, k, m = 72, 768, 20
    rw, w = _weight(qt, n, k, seed=5 + qt)
    g = torch.Generator().manual_seed(qt)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = Q.qgemm(x, rw, out_dtype=torch.float32, config=(32, 32, 256, 2, 4, 1), interpret=True)
    ref = x.double() @ (w.to(dtype).double() if dtype == torch.float16 else w).T
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, x.double() @ w.T) < (1e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("split", [1, 2])
def test_qgemm_bias_resid(Q, qt, split):
    n, k, m = 50, 512, 11
    rw, w = _weight(qt, n, k, seed=7 + split)
    g = torch.Generator().manual_seed(split)
    x = torch.randn(m, k, generator=g)
    scale = float((x.double() @ w.T).std())                             # bias/resid as large as x @ W^T
    bias = torch.randn(n, generator=g) * scale
    resid = torch.randn(m, n, generator=g) * scale
    out = Q.qgemm(x, rw, bias=bias, resid=resid, config=(32, 16, 256, split, 4, 1), interpret=True)
    ref = x.double() @ w.T + bias.double() + resid.double()
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, x.double() @ w.T) > 1e-2                         # the epilogue really added them


def test_qgemm_counters_reset_between_launches(Q):
    """The split-K tickets reset themselves: a second launch on the same counters (as a CUDA
    graph replays) gives the same bits, and the counters are zero afterwards."""

    class WS:
        def __init__(self):
            self.cnt = torch.zeros(64, dtype=torch.int32)

        def counters(self, need):
            assert need <= self.cnt.numel()
            return self.cnt

    rw, w = _weight(12, 64, 768, seed=11)
    x = torch.randn(24, 768, generator=torch.Generator().manual_seed(2))
    ws = WS()
    a = Q.qgemm(x, rw, config=(32, 16, 128, 3, 4, 1), ws=ws, interpret=True)
    assert int(ws.cnt.abs().sum()) == 0
    b = Q.qgemm(x, rw, config=(32, 16, 128, 3, 4, 1), ws=ws, interpret=True)
    assert torch.equal(a, b) and rel_err(a, x.double() @ w.T) < 1e-5


def test_qgemm_rejects_bad_inputs(Q):
    rw, _ = _weight(12, 16, 256, seed=9)
    with pytest.raises(MinferError, match="expected"):
        Q.qgemm(torch.zeros(9, 512), rw, interpret=True)
    with pytest.raises(MinferError, match="resid"):
        Q.qgemm(torch.zeros(9, 256), rw, resid=torch.zeros(9, 8), interpret=True)
    with pytest.raises(MinferError, match="bias"):
        Q.qgemm(torch.zeros(9, 256), rw, bias=torch.zeros(8), interpret=True)


def test_default_configs_cover_the_7b_shapes(Q):
    """The default rule gives a valid tile for every shape the batch engine multiplies (no
    kernel run: launch sizes only) and splits K only when the row tiles are too few."""
    for n, k in [(4608, 3584), (3584, 3584), (37888, 3584), (18944, 3584), (3584, 18944), (152064, 3584)]:
        for m in (9, 16, 32, 64, 128, 200, 256):
            bn, bm, bk, split, warps, stages = Q.default_config(12, m, n, k)
            assert bm >= m and bm in (16, 32, 64, 128, 256) and bk in (128, 256, 512)
            tiles = -(-n // bn) * -(-m // bm)
            assert (split == 1) == (tiles >= 264) and 1 <= split <= 16


# ---------------------------------------------------------------- wiring (ops/cuda/qmatmul.py, batch_engine)

@pytest.fixture(scope="module")
def QM():
    names = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8", "minfer.ops.cuda.gemv_repack",
             "minfer.ops.cuda.qgemm_repack", "minfer.ops.cuda.qmatmul"]
    for mods in interpreted_modules(names):
        yield mods


def test_linear_takes_qgemm_between_the_gemv_and_qgemm_max_m(QM):
    """Switches.qgemm_repack on: dense_gemv_max_m < M <= qgemm_max_m goes through the GEMM over
    the planes (counted qmatmul.<type>.qgemm), also for a declared q/k/v group (one launch);
    M <= dense_gemv_max_m stays on the GEMV. Off (the default): the path is reported as
    switched off, not as a fallback, and the GEMV takes M <= 32 as before."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches

    qm, gr = QM["qmatmul"], QM["gemv_repack"]
    mk = qweights_with_reference([("blk.0.attn_q.weight", 12, 64, 512), ("blk.0.attn_k.weight", 12, 16, 512),
                    ("blk.0.attn_v.weight", 12, 16, 512), ("blk.0.ffn_down.weight", 14, 48, 512)], seed=3)
    ws = [w for w, _ in mk]
    grp = tuple(ws[:3])
    gr.repack_model(ModelStub(ws, [grp]))
    down, wd = mk[3]
    on = Context(Switches(qgemm_repack=True, dense_gemv_max_m=8), Workspace("cpu", ws, [grp]))
    g = torch.Generator().manual_seed(4)
    for m, want in ((12, "qmatmul.Q6_K.qgemm"), (4, "qmatmul.Q6_K.decode.repacked")):
        x = torch.randn(m, 512, generator=g)
        paths.reset()
        out = qm.linear(x, down, None, on)
        assert rel_err(out, x.double() @ wd.T) < 1e-5
        assert paths.snapshot()["counts"] == {want: 1}
    x = torch.randn(20, 512, generator=g)
    bias = (torch.randn(64, generator=g), None, torch.randn(16, generator=g))
    paths.reset()
    outs = qm.linear_many(x, grp, bias, on)
    assert paths.snapshot()["counts"] == {"qmatmul.group3.qgemm": 1}
    for (w, wref), o, b in zip(mk[:3], outs, bias):
        assert o.shape == (20, w.shape[0])
        assert rel_err(o, x.double() @ wref.T + (0 if b is None else b.double())) < 1e-5
    paths.reset()
    out = qm.linear(x, down, None, Context(Switches(), Workspace("cpu", ws, [grp])))
    snap = paths.snapshot()
    assert rel_err(out, x.double() @ wd.T) < 1e-5
    assert snap["counts"] == {"qmatmul.Q6_K.decode.repacked": 1} and not snap["fallbacks"]
    # (with the int8 GEMM's, qgemm_q8.py: both batched paths are off by default)
    assert set(snap["switched_off"]) == {"qmatmul.Q6_K.qgemm (switched off by MINFER_QGEMM_REPACK=0)",
                                         "qmatmul.Q6_K.qgemm_q8 (switched off by MINFER_QGEMM_Q8=0)"}
    paths.reset()
    qm.linear(torch.randn(40, 512, generator=g), down, None,
              Context(Switches(qgemm_repack=True, qgemm_max_m=32), Workspace("cpu", ws, [grp])))
    assert "qmatmul.Q6_K.qgemm" not in paths.snapshot()["counts"]             # above qgemm_max_m: prefill


@pytest.mark.parametrize("switch", ["qgemm_repack", "qgemm_q8"])
def test_attach_dense_planes_skips_repacked_weights_with_qgemm(QM, switch):
    """With qgemm_repack (or qgemm_q8: ops/cuda/qgemm_q8.py) the batch engine makes dense planes
    only for weights without repacked planes (here a Q8_0 one), and drops those made before;
    without it, every weight gets one."""
    from minfer.runtime.dense_planes import attach_dense_planes
    from minfer.switches import Switches

    gr = QM["gemv_repack"]
    mk = qweights_with_reference([("blk.0.attn_q.weight", 12, 32, 256), ("blk.0.ffn_down.weight", 14, 16, 256),
                    ("blk.0.attn_k.weight", 8, 16, 256)], seed=5)
    ws = [w for w, _ in mk]
    model = ModelStub(ws)
    gr.repack_model(model)
    full = attach_dense_planes(model, force=True, free_bytes=1 << 30)
    assert full == (32 + 16 + 16) * 256 * 4 and all(w.batch_dense is not None for w in ws)
    assert torch.equal(ws[0].batch_dense.double(), mk[0][1])
    got = attach_dense_planes(model, force=True, free_bytes=1 << 30, switches=Switches(**{switch: True}))
    assert got == 16 * 256 * 4
    assert ws[0].batch_dense is None and ws[1].batch_dense is None and ws[2].batch_dense is not None


def test_sweep_script_smoke(tmp_path):
    """minfer/bench/qgemm_sweep.py end to end on the CPU (--smoke: the interpreter, tiny shapes):
    it checks each config against the dense matmul and writes a table load_configs reads."""
    import json
    import subprocess

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    cfg = tmp_path / "cfg.json"
    res = subprocess.run([sys.executable, os.path.join(root, "minfer", "bench", "qgemm_sweep.py"), "--smoke", "--quick",
                          "--json", str(tmp_path / "rows.json"), "--configs-out", str(cfg)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "WRONG" not in res.stdout
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert len(rows) == 4 and all(r["rel_err_vs_cublas"] < 2e-2 for r in rows)
    from minfer.ops.cuda.qgemm_repack import load_configs

    assert set(load_configs(str(cfg))) == {"Q4_K 128x512 m16", "Q6_K 64x512 m16"}
