"""The repacked decode GEMV and its dequant on the GPU (minfer.ops.cuda.gemv_repack).

Both decodes (inline PTX and portable), split-K reduced by the last program and by a second
kernel, the tl.dot path for small M, the fusions, CUDA-graph replays (the ticket counters must
reset themselves), and the 7B shapes. References: the gguf package's dequant of the raw blocks
(kernel_data) and float64 torch math. The kernel files are loaded by path (gemv_sweep.kernels)
so these tests do not depend on the rest of the engine importing cleanly.
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


@pytest.fixture(scope="module")
def G():
    spec = importlib.util.spec_from_file_location(
        "minfer_gemv_sweep", os.path.join(HERE, "..", "..", "minfer", "bench", "gemv_sweep.py"))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep.kernels()[0]


def _weight(G, qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw).to(DEV), qt, n, k)
    return raw, rw, torch.from_numpy(reference_dequant(raw, qt, n, k))


def poison():
    t = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device=DEV)
    del t


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_repack_on_gpu_is_byte_exact(G, qt):
    raw, rw, _ = _weight(G, qt, 1001, 1536, seed=qt)
    G.check_repacked(raw, rw, qt)
    cpu = G.repack(torch.from_numpy(raw), qt, 1001, 1536)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(rw.planes, cpu.planes))


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequant_exact(G, qt, dtype):
    n, k = 333, 7 * 256
    _, rw, ref = _weight(G, qt, n, k, seed=10 + qt)
    poison()
    out = torch.empty(n, k, device=DEV, dtype=dtype)
    G.dequantize_into(rw, out)
    assert torch.equal(out.cpu(), ref.to(dtype))


CFGS = [((64, 2, 1, 4), True), ((32, 2, 3, 4), True), ((64, 1, 5, 4), False), ((128, 2, 2, 8), True)]


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("asm", [True, False], ids=["asm", "portable"])
@pytest.mark.parametrize("cfg,inline", CFGS, ids=["s1", "s3-inline", "s5-kernel", "bn128-s2"])
def test_gemv_m1(G, qt, asm, cfg, inline, dtype=torch.bfloat16):
    n, k = 1000 + qt, 11 * 256                        # tail rows; 11 blocks: a tail iteration for BB=2
    _, rw, w = _weight(G, qt, n, k, seed=20 + qt)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(qt)).to(dtype)
    poison()
    out = G.gemv(x.to(DEV), rw, config=cfg, inline_reduce=inline, asm=asm)
    assert out.dtype == dtype and out.shape == (1, n)
    assert rel_err(out, G.reference_gemv(x, w)) < (2e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("asm", [True, False], ids=["asm", "portable"])
def test_gemv_m1_fp32(G, qt, asm):
    test_gemv_m1(G, qt, asm, (32, 2, 3, 4), True, torch.float32)


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("m", [2, 7, 16, 33, 64])
def test_gemv_small_m(G, qt, m):
    n, k = 999, 9 * 256
    _, rw, w = _weight(G, qt, n, k, seed=30 + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    poison()
    out = G.gemv(x.to(DEV), rw)
    assert out.shape == (m, n)
    assert rel_err(out, G.reference_gemv(x, w)) < 1e-2
    xf = x.float()
    out32 = G.gemv(xf.to(DEV), rw, config=(64, 1, 2, 4))
    assert rel_err(out32, G.reference_gemv(xf, w)) < 2e-5


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("m", [1, 5])
def test_gemv_fusions(G, qt, m):
    n, k = 777, 6 * 256
    _, rw, w = _weight(G, qt, n, k, seed=40 + m)
    g = torch.Generator().manual_seed(m + qt)
    x = torch.randn(m, k, generator=g) * 3
    kw = dict(norm_weight=torch.randn(k, generator=g), eps=1e-6, up=torch.randn(m, k, generator=g),
              bias=torch.randn(n, generator=g), resid=torch.randn(m, n, generator=g))
    ref = G.reference_gemv(x, w, **kw)
    for cfg in [(64, 2, 1, 4), (32, 1, 3, 4)]:
        out = G.gemv(x.to(DEV), rw, config=cfg, **{a: v.to(DEV) if torch.is_tensor(v) else v for a, v in kw.items()})
        assert rel_err(out, ref) < 2e-5


def test_split_k_deterministic_and_graph_replay(G):
    n, k = 4608, 3584
    _, rw, w = _weight(G, 12, n, k, seed=50)
    x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    ws = G.GemvWorkspace(DEV)
    cfg = (32, 2, 7, 4)
    a = G.gemv(x, rw, config=cfg, ws=ws)
    b = G.gemv(x, rw, config=cfg, ws=ws)
    c = G.gemv(x, rw, config=cfg, inline_reduce=False)
    assert torch.equal(a, b) and torch.equal(a, c)      # same split order in both reductions
    assert int(ws.cnt.abs().sum()) == 0                 # every ticket counter reset
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        G.gemv(x, rw, config=cfg, ws=ws)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = G.gemv(x, rw, config=cfg, ws=ws)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, a)
    assert rel_err(a.cpu(), G.reference_gemv(x.cpu(), w)) < 1e-2


@pytest.mark.parametrize("qt,n,k", [(12, 4608, 3584), (12, 3584, 18944), (14, 3584, 18944), (14, 20000, 3584)])
def test_7b_shapes_default_configs(G, qt, n, k):
    _, rw, w = _weight(G, qt, n, k, seed=60)
    for m in (1, 8):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        out = G.gemv(x.to(DEV), rw)
        assert rel_err(out, G.reference_gemv(x, w)) < 1e-2


def test_engine_decodes_through_repacked_planes(tmp_path):
    """An Engine on CUDA (synthetic Q4_K_M file): the multiplied Q4_K/Q6_K matrices lost their raw
    blocks to planes, every such decode matmul is counted on a repacked path (q/k/v fused where
    one type), no qmatmul fallback, the load report counts the planes, and the logits of a
    prefill and of decode steps match the CPU reference engine."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "tiny-q4km.gguf"
    write_synth(path, p, "q4_k_m", seed=2, progress=False)
    cpu = Engine.load(str(path), device="cpu", ctx=128, progress=False,
                      switches=Switches(cpu_quant=False))   # the float32 reference
    gpu = Engine.load(str(path), device="cuda", ctx=128, progress=False)
    from minfer.ops.cuda.gemv_repack import planes_of
    mats = gpu.model.qweights()
    rp = [w for w in mats if planes_of(w) is not None]
    assert rp and all(w.raw.numel() == 0 for w in rp) and "repacked for the decode GEMV" in gpu.memory_report
    prompt = list(range(5, 45))
    paths.reset()
    lc, lg = cpu.forward(prompt, 0), gpu.forward(prompt, 0)
    assert rel_err(lg.float().cpu(), lc) < 1e-2
    for i, tok in enumerate(prompt[:3]):
        assert rel_err(gpu.forward([tok], 40 + i).float().cpu(), cpu.forward([tok], 40 + i)) < 1e-2
    snap = paths.snapshot()
    # the one-row decode reads the planes through the int8-activation GEMV (".q8", ".q8mixed":
    # gemv_q8.py, the default since the evening session) or the bf16-activation one (".repacked")
    assert any(k.endswith((".decode.repacked", ".decode.q8", ".decode.q8mixed")) for k in snap["counts"]), snap
    assert not any(k.startswith("qmatmul") for k in snap["fallbacks"]), snap
