"""The batched-decode GEMM over repacked Q4_K / Q6_K planes on the GPU (minfer.ops.cuda.qgemm_repack).

At the 7B's shapes and M = 16..256 against torch on the dense weight: the planes' exact decode
(gemv_repack.dequantize_into, itself bit-exact against gguf in test_gemv_repack_gpu) rounded to
bf16, multiplied in float64 -- the kernel must match it to fp32 accumulation (it multiplies the
same bf16 weights); and on a smaller shape against the gguf package's dequant of the raw blocks
(independent of every minfer decode). Also: every sweep config gives the same result, split K
is deterministic, its ticket counters survive CUDA-graph replays, the bias/residual epilogue.
Kernel files are loaded by path (qgemm_sweep.kernels), as the sweep does.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
NAMES = {12: "Q4_K", 14: "Q6_K"}
SHAPES = [(12, 4608, 3584), (12, 3584, 3584), (12, 37888, 3584), (12, 3584, 18944), (14, 3584, 18944),
          (14, 152064, 3584)]


@pytest.fixture(scope="module")
def S():
    spec = importlib.util.spec_from_file_location(
        "minfer_qgemm_sweep", os.path.join(HERE, "..", "..", "minfer", "bench", "qgemm_sweep.py"))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep


def _weight(S, qt, n, k, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rw = S._repack(qt, n, k, gen)
    _, gr = S.kernels()
    dense = torch.empty((n, k), dtype=torch.bfloat16, device=DEV)
    gr.dequantize_into(rw, dense)
    return rw, dense


@pytest.mark.parametrize("qt,n,k", SHAPES, ids=[f"{NAMES[s[0]]}-{s[1]}x{s[2]}" for s in SHAPES])
def test_7b_shapes_against_the_dense_weight(S, qt, n, k):
    qg, _ = S.kernels()
    rw, dense = _weight(S, qt, n, k, seed=n + qt)
    wd = dense.double()
    g = torch.Generator(device=DEV).manual_seed(1)
    for m in (16, 33, 64, 128, 200, 256):
        x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
        ref = x.double() @ wd.T
        out = qg.qgemm(x, rw, out_dtype=torch.float32)            # the table's (or default) config
        assert out.shape == (m, n)
        err = rel_err(out, ref)
        assert err < 1e-5, (m, err)                                # same bf16 weights, fp32 accumulation
        out16 = qg.qgemm(x, rw)
        assert out16.dtype == torch.bfloat16 and rel_err(out16, ref) < 5e-3   # + one bf16 rounding
        assert rel_err(out16, torch.matmul(x, dense.t())) < 1e-2            # beside cuBLAS, as the sweep checks


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_against_gguf_dequant(S, qt):
    """Independent of minfer's decoders: gguf's dequant of the raw blocks, in float64."""
    qg, _ = S.kernels()
    lay = S._load("minfer.ops.cuda.gemv_repack_layout", "minfer/ops/cuda/gemv_repack_layout.py")
    n, k = 1000, 3584
    raw = random_weight(qt, n, k, np.random.default_rng(qt))
    rw = lay.repack(torch.from_numpy(raw).to(DEV), qt, n, k)
    w = torch.from_numpy(reference_dequant(raw, qt, n, k)).double().to(DEV)
    x = torch.randn(48, k, device=DEV, generator=torch.Generator(device=DEV).manual_seed(2)).to(torch.bfloat16)
    out = qg.qgemm(x, rw, out_dtype=torch.float32)
    assert rel_err(out, x.double() @ w.to(torch.bfloat16).double().T) < 1e-5
    assert rel_err(out, x.double() @ w.T) < 4e-3                 # bf16 rounding of the weights only


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decoded_weights_are_bit_exact(S, qt, dtype):
    """One-hot rows of x read single weights out (one nonzero product): fp32 x must give the
    decode's exact fp32 values bit for bit (Q6_K's fma, Q4_K's f*16dl - 16dl - ml), bf16 x their
    round-to-nearest-even bf16 values."""
    qg, _ = S.kernels()
    lay = S._load("minfer.ops.cuda.gemv_repack_layout", "minfer/ops/cuda/gemv_repack_layout.py")
    n, k = 4608, 3584
    raw = random_weight(qt, n, k, np.random.default_rng(5 + qt))
    rw = lay.repack(torch.from_numpy(raw).to(DEV), qt, n, k)
    w = torch.from_numpy(reference_dequant(raw, qt, n, k)).to(DEV)
    cols = torch.cat([torch.arange(32), torch.randperm(k - 32, generator=torch.Generator().manual_seed(qt))[:32] + 32])
    x = torch.zeros(len(cols), k, dtype=dtype, device=DEV)
    x[torch.arange(len(cols)), cols.to(DEV)] = 1.0
    out = qg.qgemm(x, rw, out_dtype=torch.float32, config=(64, 64, 128, 2, 4, 2))
    assert torch.equal(out, w.to(dtype).float()[:, cols.to(DEV)].T)


@pytest.mark.parametrize("qt,n,k", [(12, 3584, 3584), (14, 3584, 18944)], ids=["Q4_K-o", "Q6_K-down"])
def test_every_sweep_config_agrees_and_split_is_deterministic(S, qt, n, k):
    qg, _ = S.kernels()
    rw, dense = _weight(S, qt, n, k, seed=7)
    g = torch.Generator(device=DEV).manual_seed(3)
    for m in (32, 128):                                           # (each config is a compile: ~1.5 s)
        x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
        ref = x.double() @ dense.double().T
        for bn, bm, bk, w, st in S.CANDIDATES[m][:3]:
            for split in (1, 4):
                cfg = (bn, bm, bk, split, w, st)
                a = qg.qgemm(x, rw, out_dtype=torch.float32, config=cfg)
                # fp32 accumulation over K values: ~sqrt(K) * 2^-24 relative, a few times over;
                # K = 18944 in one split measured 2.1e-5 on the H200 (2026-11-30)
                assert rel_err(a, ref) < (5e-5 if k > 8192 else 1e-5), (m, cfg)
                if split > 1:
                    assert torch.equal(a, qg.qgemm(x, rw, out_dtype=torch.float32, config=cfg))
                    b = qg.qgemm(x, rw, out_dtype=torch.float32, config=cfg, inline_reduce=False)
                    assert torch.equal(a, b)                          # both reduces sum in split order


def test_graph_replays_and_epilogue(S):
    """Split K under a CUDA graph: the tickets reset themselves between replays; bias + resid."""
    qg, gr = S.kernels()
    rw, dense = _weight(S, 12, 4608, 3584, seed=9)
    g = torch.Generator(device=DEV).manual_seed(4)
    x = torch.randn(32, 3584, device=DEV, generator=g).to(torch.bfloat16)
    bias = torch.randn(4608, device=DEV, generator=g)
    resid = torch.randn(32, 4608, device=DEV, generator=g).to(torch.bfloat16)
    ws = gr.GemvWorkspace(DEV)
    cfg = (64, 32, 256, 6, 4, 4)
    want = qg.qgemm(x, rw, bias=bias, resid=resid, out_dtype=torch.float32, config=cfg, ws=ws)
    ref = x.double() @ dense.double().T + bias.double() + resid.double()
    assert rel_err(want, ref) < 1e-5
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qg.qgemm(x, rw, bias=bias, resid=resid, out_dtype=torch.float32, config=cfg, ws=ws)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = qg.qgemm(x, rw, bias=bias, resid=resid, out_dtype=torch.float32, config=cfg, ws=ws)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    assert int(ws.cnt.abs().sum()) == 0
