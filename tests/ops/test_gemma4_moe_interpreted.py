"""gemma4's MoE (the 26B-A4B form) on the CUDA backend, run on the CPU by Triton's interpreter
(TRITON_INTERPRET=1): moe_act.py's "geglu" activation against a float64 formula; ops/cuda/moe.py's
gemma4 options (GELU experts, the fused gate_up tensor, the router on its own input, the per-expert
output scale) on the expert gather, the grouped prefill and the int8 gather over repacked experts
against float64 math, the CPU reference's options against the same formula; and the gemma4-moe
fixture's prefill and decode step through the CUDA backend's code, the decode step free of host
reads (what the engine's CUDA-graph capture needs), against the CPU reference."""

from __future__ import annotations

import math
import os
import sys
import types

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err, route_to_cuda  # noqa: E402
from test_gpt_oss_interpreted import Q8, no_host_reads, rel, x_hat  # noqa: E402,F401  (Q8: the fixture)

pytestmark = [pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
              # exp(-2c) of a very negative gate is inf in the interpreter's numpy: a / inf = -0, as on a GPU
              pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")]

E, D, FE, K = 4, 64, 32, 2


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """float64 GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (ggml_gelu, HF gelu_pytorch_tanh)."""
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe"]):
        yield mods


@pytest.mark.parametrize("biases", [False, True])
def test_geglu_activation_against_float64(M, biases):
    """moe_act(act="geglu") on strided halves of a fused (R, 2F) row block (as moe.py passes them),
    with and without per-expert biases, against the float64 formula; gates up to |8| (the tanh's
    saturation on both sides)."""
    from minfer.ops import paths

    A = M["moe_act"]
    g = torch.Generator().manual_seed(3)
    R, F = 7, 96
    gu = torch.randn(R, 2 * F, generator=g) * 4
    gate, up = gu[:, :F], gu[:, F:]
    rows_e = torch.randint(0, E, (R,), generator=g)
    gb = torch.randn(E, F, generator=g) if biases else None
    ub = torch.randn(E, F, generator=g) if biases else None
    paths.reset()
    got = A.moe_act(gate, up, rows_e, gb, ub, act="geglu")
    assert paths.snapshot()["counts"].get("moe.act.triton") == 1
    gg, uu = gate.double(), up.double()
    if biases:
        gg, uu = gg + gb.double()[rows_e], uu + ub.double()[rows_e]
    want = gelu_tanh(gg) * uu
    assert got.shape == (R, F) and rel(got, want) < 1e-6
    assert rel(got, torch.nn.functional.silu(gg) * uu) > 1e-2        # not the SwiGLU's
    # the reference's form (reference.moe_act) against the same formula
    from minfer.ops import reference

    r = torch.cat([reference.moe_act(gate[i:i + 1], up[i:i + 1], gb, ub, int(rows_e[i]), "geglu", 1.702, 7.0)
                   for i in range(R)])
    assert rel(r, want) < 1e-6


def experts(qtype, seed, fused):
    """Stacked experts of random raw blocks: fused gate_up (E*2FE, D) or gate and up (E*FE, D) apart,
    down (E*D, FE); with their float64 gate / up / down values (kernel_data.reference_dequant)."""
    from minfer.weights import QWeight

    rng = np.random.default_rng(seed)

    def w(name, n, k):
        raw = random_weight(qtype, n, k, rng, scale=0.5)
        q = QWeight(name, qtype, (n, k), torch.from_numpy(raw))
        q.n_experts = E
        return q, torch.from_numpy(reference_dequant(raw, qtype, n, k)).double()

    if fused:
        gu, vgu = w("gate_up", E * 2 * FE, D)
        v = vgu.view(E, 2, FE, D)
        G, U = v[:, 0].reshape(E * FE, D), v[:, 1].reshape(E * FE, D)
        mats = [gu, None]
    else:
        (g, G), (u, U) = w("gate", E * FE, D), w("up", E * FE, D)
        mats = [g, u]
    dn, Dn = w("down", E * D, FE)
    return mats + [dn], (G, U, Dn)


def formula(h, z, router, vals, scale, act="geglu"):
    """float64, token by token (HF Gemma4TextRouter / Gemma4TextExperts): logits router z, softmax, the
    K largest divided by their sum times scale[e]; experts act(gate h) * up h then down."""
    G, U, Dn = vals
    out = torch.zeros(h.shape[0], D, dtype=torch.float64)
    for t in range(h.shape[0]):
        x = h[t].double()
        p = torch.softmax(router.double() @ z[t].double(), 0)
        top = torch.topk(p, K).indices
        wts = p[top] / p[top].sum()
        for wt, e in zip(wts, top.tolist()):
            g, u = G[e * FE:(e + 1) * FE] @ x, U[e * FE:(e + 1) * FE] @ x
            a = (gelu_tanh(g) if act == "geglu" else torch.nn.functional.silu(g)) * u
            out[t] += wt * (1.0 if scale is None else float(scale[e])) * (Dn[e * D:(e + 1) * D] @ a)
    return out


def inputs(seed, T):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, D, generator=g), torch.randn(T, D, generator=g), torch.randn(E, D, generator=g),
            torch.rand(E, generator=g) + 0.5)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("qtype", [1, 8])              # F16, Q8_0
@pytest.mark.parametrize("T", [1, 12])                 # gather (T*k <= 16) and grouped
def test_cuda_moe_gemma4_options_against_float64(M, T, qtype, fused):
    from minfer.ops import paths, reference

    mats, vals = experts(qtype, seed=T + qtype + fused, fused=fused)
    h, z, router, scale = inputs(T, T)
    h = h * (2.0 / float((h.double() @ vals[0].t()).std()))          # gates of spread ~2: GELU is not SiLU there
    opts = dict(act="geglu", router_in=z, down_scale=scale)
    want = formula(h, z, router, vals, scale)
    paths.reset()
    got = M["moe"].moe_ffn(h, router, *mats, K, True, **opts)
    snap = paths.snapshot()
    assert rel(got, want) < 1e-5, (T, qtype, fused)
    assert snap["counts"].get("moe.act.triton") == 1
    if T * K <= M["moe"].GATHER_MAX:
        assert snap["counts"].get("moe.gather") == 1
    else:
        assert any(k.startswith("moe.grouped") for k in snap["fallbacks"])
    ref = reference.moe_ffn(h, router, *mats, K, True, **opts)
    assert rel(ref, want) < 1e-5
    # each option counts: the router on h, no expert scale, SiLU experts each miss by far
    assert rel(got, formula(h, h, router, vals, scale)) > 1e-2
    assert rel(got, formula(h, z, router, vals, None)) > 1e-2
    assert rel(got, formula(h, z, router, vals, scale, act="silu")) > 1e-2


def test_fused_gate_up_order_is_gate_first(M):
    """The fused tensor's halves read as [up; gate] miss by far (expert e's gate rows come first)."""
    mats, (G, U, Dn) = experts(1, seed=5, fused=True)
    h, z, router, scale = inputs(5, 2)
    h = h * (2.0 / float((h.double() @ G.t()).std()))
    got = M["moe"].moe_ffn(h, router, *mats, K, True, act="geglu", router_in=z, down_scale=scale)
    assert rel(got, formula(h, z, router, (G, U, Dn), scale)) < 1e-5
    assert rel(got, formula(h, z, router, (U, G, Dn), scale)) > 1e-2


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
def test_q8_gather_fused_gate_up(Q8):
    """One decode row over repacked (Q4_K / Q6_K planes) experts with gemma4's options: one int8 GEMV
    of the fused gate_up's 2Fe rows per selected expert, the GELU halves (moe_act), their rows
    quantized, the down projection, the routing weights from router_in times the expert scale,
    against float64 math on the same quantized values."""
    from minfer.ops import paths

    Mo, G = Q8["moe"], Q8["gemv_repack"]
    Ev, Fe, Dm = 4, 256, 512

    def stacked(qt, n, kk, seed):
        raw = random_weight(qt, n, kk, np.random.default_rng(seed))
        rw = G.repack(torch.from_numpy(raw), qt, n, kk)
        return (types.SimpleNamespace(repacked=rw, shape=(n, kk), name=f"blk.0.x{seed}_exps.weight", qtype=qt),
                torch.from_numpy(reference_dequant(raw, qt, n, kk)).double())

    (guw, wgu), (dw, wd) = stacked(12, Ev * 2 * Fe, Dm, 81), stacked(14, Ev * Dm, Fe, 83)
    g = torch.Generator().manual_seed(6)
    h = (torch.randn(1, Dm, generator=g) * 1e-3).to(torch.float16)   # fp16 products in range (test_gemv_q8)
    z = torch.randn(1, Dm, generator=g)
    router = torch.randn(Ev, Dm, generator=g)
    scale = torch.rand(Ev, generator=g) + 0.5
    h.q8 = Q8["gemv_q8"].quantize(h, interpret=True)
    paths.reset()
    out = Mo.moe_ffn(h, router, guw, None, dw, K, True, act="geglu", router_in=z, down_scale=scale)
    assert paths.snapshot()["counts"].get("moe.gather.q8") == 1
    xh = x_hat(h.float())
    p = torch.softmax(router.double() @ z.double()[0], 0)
    top = torch.topk(p, K).indices
    want = torch.zeros(1, Dm, dtype=torch.float64)
    for wt, e in zip(p[top] / p[top].sum(), top.tolist()):
        gu = (xh @ wgu[e * 2 * Fe:(e + 1) * 2 * Fe].T).half().double()
        a = (gelu_tanh(gu[:, :Fe]) * gu[:, Fe:]).half()                         # stored in h's dtype
        want[0] += wt * float(scale[e]) * (x_hat(a) @ wd[e * Dm:(e + 1) * Dm].T)[0]
    assert out.shape == (1, Dm) and rel_err(out, want) < 2e-3


def test_gemma4_moe_through_cuda_backend_interpreted(monkeypatch):
    """The gemma4-moe fixture (tests/data/arch/gemma4-moe.gguf) through the CUDA backend's code: the
    prefill (grouped experts) and a decode step given as a device position, as the engine's CUDA graph
    runs it (expert gather), the whole step with host reads refused, against the CPU reference."""
    from pathlib import Path

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    gguf = Path(__file__).resolve().parents[1] / "data" / "arch" / "gemma4-moe.gguf"
    m = load_model(GGUFFile(gguf), progress=False)
    toks = torch.arange(3, 13) * 7 % 300 + 3                       # 10 tokens: 20 expert rows, grouped
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, 64)
    ref = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)
    L = sum(moe is not None for moe in m.moe)
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                     "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                     "minfer.ops.cuda.attention", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe",
                                     "minfer.ops.cuda"]):
        C = mods["cuda"]
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        cache = KVCache.for_config(m.cfg, 64)
        paths.reset()
        out = m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
        pre = paths.snapshot()
        paths.reset()
        with monkeypatch.context() as mp:   # the whole decode step with host reads refused
            no_host_reads(mp)
            dec = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
        post = paths.snapshot()
        monkeypatch.undo()
    e_pre, e_dec = rel(out, ref), rel(dec, ref_dec)
    assert e_pre < 1e-5 and e_dec < 1e-5, (e_pre, e_dec)
    assert L > 0
    assert pre["counts"].get("moe.act.triton") == L and post["counts"].get("moe.act.triton") == L
    assert post["counts"].get("moe.gather") == L
    assert any(k.startswith("moe.grouped") for k in pre["fallbacks"]) or pre["counts"].get("moe.grouped") == L
