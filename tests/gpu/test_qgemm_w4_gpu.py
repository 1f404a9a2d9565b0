"""The Gluon w4 GEMM on the GPU (minfer.ops.cuda.qgemm_w4_mma) over planes made from random raw
Q4_K / Q6_K blocks.

References: the planes' values (qgemm_w4.dequantize_w4, itself checked against the gguf package
in tests/ops/test_qgemm_w4.py) multiplied in float64 -- the kernel multiplies the same bf16
values, so only fp32 accumulation separates them; one-hot rows read single values back bit for
bit; and the gguf package's float32 values (independent of every minfer decode) within the
planes' bf16 scale rounding.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                                 reason="the kernel is written for sm_90 (runtime/dense_planes.w4_unsupported)")]
NAMES = {12: "Q4_K", 14: "Q6_K"}


def _planes(qt, n, k, seed):
    from minfer.ops.cuda.gemv_repack_layout import repack
    from minfer.ops.cuda.qgemm_w4 import dequantize_w4, make_w4

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    p = make_w4(repack(torch.from_numpy(raw).cuda(), qt, n, k))
    ref = torch.from_numpy(reference_dequant(raw, qt, n, k)).double().cuda()
    return p, dequantize_w4(p).double(), ref


# (N, K, M, config (BN, BM, SPLIT, warps[, programs/SM, register cap, ring stages]) or None)
CASES = [(4608, 3584, 32, None), (3584, 3584, 16, None), (1000, 1024, 40, (64, 32, 1, 4)),
         (3584, 2048, 33, (64, 64, 3, 4)), (2048, 1024, 9, (128, 16, 2, 4)), (512, 3584, 128, None),
         (1000, 1024, 40, (64, 32, 1, 4, 4, 128, 3)), (3584, 2048, 33, (64, 64, 3, 4, 4, 128, 4)),
         (2048, 1024, 9, (128, 16, 2, 4, 2, 0, 2))]


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("n,k,m,cfg", CASES, ids=[f"n{c[0]}k{c[1]}m{c[2]}" + (f"r{c[3][6]}" if c[3] and len(c[3]) > 6
                                                                                    else "") for c in CASES])
def test_against_planes_and_gguf(qt, n, k, m, cfg):
    from minfer.ops.cuda.qgemm_w4_mma import qgemm_w4_mma

    p, wq, ref = _planes(qt, n, k, seed=n + m + qt)
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    out = qgemm_w4_mma(x, p, out_dtype=torch.float32, config=cfg)
    assert out.shape == (m, n)
    assert rel_err(out, x.double() @ wq.T) < 1e-5
    assert rel_err(out, x.double() @ ref.T) < 4e-3
    # deterministic (split K sums in split order), and a bf16 output is the fp32 one rounded
    assert torch.equal(out, qgemm_w4_mma(x, p, out_dtype=torch.float32, config=cfg))
    assert torch.equal(qgemm_w4_mma(x, p, config=cfg), out.to(torch.bfloat16))


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_one_hot_rows_read_values_exactly(qt):
    from minfer.ops.cuda.qgemm_w4_mma import qgemm_w4_mma

    n, k = 200, 1024
    p, wq, _ = _planes(qt, n, k, seed=5 + qt)
    cols = torch.tensor(list(range(0, 128)) + [200, 333, 511, 640, 777, 1023], device="cuda")
    x = torch.zeros(len(cols), k, device="cuda", dtype=torch.bfloat16)
    x[torch.arange(len(cols), device="cuda"), cols] = 1.0
    for cfg in [None, (64, 64, 4, 4), (128, 32, 1, 4), (64, 32, 2, 4, 4, 128, 3), (64, 16, 1, 4, 4, 128, 4)]:
        out = qgemm_w4_mma(x, p, out_dtype=torch.float32, config=cfg)
        assert torch.equal(out, wq.float()[:, cols].T), cfg


def test_bias_and_counters_survive_graph_replays():
    from minfer.ops.cuda.qgemm_w4_mma import qgemm_w4_mma

    n, k, m = 3584, 3584, 32
    p, wq, _ = _planes(12, n, k, seed=3)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=g)
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")

    class WS:
        def counters(self, need):
            return cnt

    cfg = (64, 32, 4, 4, 4, 128, 3)
    want = qgemm_w4_mma(x, p, bias=bias, out_dtype=torch.float32, config=cfg, ws=WS())
    assert rel_err(want, x.double() @ wq.T + bias.double()) < 1e-5
    assert int(cnt.abs().sum()) == 0
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        qgemm_w4_mma(x, p, bias=bias, out_dtype=torch.float32, config=cfg, ws=WS())     # compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out = qgemm_w4_mma(x, p, bias=bias, out_dtype=torch.float32, config=cfg, ws=WS())
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
