"""gpt-oss's MoE on the CUDA backend, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1):
ops/cuda/moe.py's options (router bias, top-k-then-softmax gating, per-expert gate/up/down
biases, the clamped "swiglu_oai" activation of moe_act.py) on both of its raw-block paths (the
expert gather of a decode step, the grouped prefill) against a float64 formula written here, the
CPU reference's options against the same formula, and the gpt-oss fixture's prefill and decode
step through the CUDA backend's code (attention sinks and MoE) against the CPU reference, with
the whole decode step free of host reads (what the engine's CUDA-graph capture needs)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err, route_to_cuda  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
              # exp(-alpha g) of a very negative gate is inf in the interpreter's numpy: g / inf = -0, as on a GPU
              pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")]

E, D, FE, K = 4, 64, 32, 2


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def experts(qtype, seed):
    """Stacked gate/up (E*FE, D) and down (E*D, FE) QWeights of random raw blocks and their float64
    values decoded by the gguf package (kernel_data.reference_dequant)."""
    from minfer.weights import QWeight

    rng = np.random.default_rng(seed)
    out = []
    for name, n, k in (("gate", E * FE, D), ("up", E * FE, D), ("down", E * D, FE)):
        raw = random_weight(qtype, n, k, rng, scale=0.5)
        w = QWeight(name, qtype, (n, k), torch.from_numpy(raw))
        w.n_experts = E
        out.append((w, torch.from_numpy(reference_dequant(raw, qtype, n, k)).double()))
    return out


def formula(h, router, ws, opts, norm_weights=False):
    """float64, token by token and expert by expert (HF GptOssTopKRouter / GptOssExperts for the
    gpt-oss options; Qwen3MoeSparseMoeBlock for the defaults)."""
    G, U, Dn = (v for _, v in ws)
    alpha, limit = opts.get("alpha", 1.702), opts.get("limit", 7.0)

    def b(name, e):
        x = opts.get(name)
        return 0.0 if x is None else x[e].double()

    out = torch.zeros(h.shape[0], D, dtype=torch.float64)
    for t in range(h.shape[0]):
        x = h[t].double()
        logits = router.double() @ x + (0.0 if opts.get("router_bias") is None else opts["router_bias"].double())
        if opts.get("gating", "softmax") == "topk_softmax":
            top = torch.topk(logits, K).indices
            wts = torch.softmax(logits[top], 0)
        else:
            p = torch.softmax(logits, 0)
            top = torch.topk(p, K).indices
            wts = p[top] / (p[top].sum() if norm_weights else 1.0)
        for wt, e in zip(wts, top.tolist()):
            g = G[e * FE:(e + 1) * FE] @ x + b("gate_bias", e)
            u = U[e * FE:(e + 1) * FE] @ x + b("up_bias", e)
            if opts.get("act", "silu") == "swiglu_oai":
                g = g.clamp(max=limit)
                a = g * torch.sigmoid(alpha * g) * (u.clamp(-limit, limit) + 1)
            else:
                a = torch.nn.functional.silu(g) * u
            out[t] += wt * (Dn[e * D:(e + 1) * D] @ a + b("down_bias", e))
    return out


def options(seed, kind):
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt-oss":
        return dict(router_bias=torch.randn(E, generator=g), gating="topk_softmax",
                    gate_bias=torch.randn(E, FE, generator=g), up_bias=torch.randn(E, FE, generator=g),
                    down_bias=torch.randn(E, D, generator=g), act="swiglu_oai", alpha=1.702, limit=3.0)
    if kind == "biases_silu":     # each option on its own axis: softmax gating with biases, plain SwiGLU
        return dict(router_bias=torch.randn(E, generator=g), gate_bias=torch.randn(E, FE, generator=g),
                    down_bias=torch.randn(E, D, generator=g))
    return dict(act="swiglu_oai", limit=2.0)       # no bias, the clamped activation only


def inputs(seed, T):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, D, generator=g), torch.randn(E, D, generator=g) * 0.5


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe"]):
        yield mods["moe"]


@pytest.mark.parametrize("kind,qtype", [("gpt-oss", 1), ("gpt-oss", 39),     # F16, MXFP4 (the released experts)
                                        ("biases_silu", 1), ("oai_only", 1)])
@pytest.mark.parametrize("T", [1, 12])                  # gather (T*k <= 16) and grouped
def test_cuda_moe_options_against_float64(M, qtype, T, kind):
    from minfer.ops import paths, reference

    ws = experts(qtype, seed=T + qtype)
    h, router = inputs(T, T)
    opts = options(T, kind)
    want = formula(h, router, ws, opts, norm_weights=True)
    paths.reset()
    got = M.moe_ffn(h, router, *(w for w, _ in ws), K, True, **opts)
    counts = paths.snapshot()
    assert rel(got, want) < 1e-5, (kind, T)
    assert counts["counts"].get("moe.act.triton") == 1
    if T * K <= M.GATHER_MAX:
        assert counts["counts"].get("moe.gather") == 1
    else:
        assert any(k.startswith("moe.grouped") for k in counts["fallbacks"])
    ref = reference.moe_ffn(h, router, *(w for w, _ in ws), K, True, **opts)
    assert rel(ref, want) < 1e-5
    plain = formula(h, router, ws, {}, norm_weights=True)        # the options change the result
    assert rel(plain, want) > 1e-2


def test_clamp_and_gating_are_needed(M):
    """The formula's clamp and gating are active on these inputs: dropping either misses by far."""
    ws = experts(1, seed=7)
    h, router = inputs(7, 2)
    opts = options(7, "gpt-oss")
    got = M.moe_ffn(h, router, *(w for w, _ in ws), K, False, **opts)
    assert rel(got, formula(h, router, ws, opts)) < 1e-5
    assert rel(got, formula(h, router, ws, dict(opts, limit=1e30))) > 1e-2
    assert rel(got, formula(h, router, ws, dict(opts, gating="softmax"))) > 1e-2


def test_unknown_options_are_refused(M):
    from minfer.ops import reference

    ws = experts(1, seed=1)
    h, router = inputs(1, 1)
    for f in (M.moe_ffn, reference.moe_ffn):
        with pytest.raises(ValueError, match="act"):
            f(h, router, *(w for w, _ in ws), K, False, act="gelu")
        with pytest.raises(ValueError, match="gating"):
            f(h, router, *(w for w, _ in ws), K, False, gating="sqrt_softplus")


class HostRead(AssertionError):
    pass


def no_host_reads(monkeypatch):
    """Make the torch calls that read a device value back to the host raise (Tensor.item, .tolist,
    .nonzero, .unique, bool/int/float/index of a tensor, and torch.nonzero/unique/bincount): what
    a CUDA-graph capture cannot take."""
    def refuse(name):
        def f(*a, **kw):
            raise HostRead(name)
        return f

    for name in ("item", "tolist", "nonzero", "unique", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))
    for name in ("nonzero", "unique", "bincount"):
        monkeypatch.setattr(torch, name, refuse(name))


def test_host_read_guard_has_teeth(monkeypatch):
    """The CPU reference's MoE loops over the experts in Python (idx.unique().tolist()): under the
    guard it raises, so the guard catches such a read."""
    from minfer.ops import reference

    ws = experts(1, seed=2)
    h, router = inputs(2, 1)
    with monkeypatch.context() as mp:
        no_host_reads(mp)
        with pytest.raises(HostRead):
            reference.moe_ffn(h, router, *(w for w, _ in ws), K, False, **options(2, "gpt-oss"))


def test_gpt_oss_through_cuda_backend_interpreted(monkeypatch):
    """The gpt-oss fixture (tests/data/arch/gpt-oss.gguf, F16 experts) through the CUDA backend's
    code, its MoE included: the prefill (grouped path) and a decode step given as a device
    position, as the engine's CUDA graph runs it (the sink decode kernel, the expert gather),
    the whole step with host reads refused, against the CPU reference."""
    from pathlib import Path

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    gguf = Path(__file__).resolve().parents[1] / "data" / "arch" / "gpt-oss.gguf"
    m = load_model(GGUFFile(gguf), progress=False)
    toks = torch.tensor([5, 77, 12, 140, 9, 33, 201, 18, 64, 3])     # past the window of 8
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, 32)
    ref = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([42]), Step.at(T, 1, "cpu"), ref_cache)
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                     "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                     "minfer.ops.cuda.attention", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe",
                                     "minfer.ops.cuda"]):
        C = mods["cuda"]
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        cache = KVCache.for_config(m.cfg, 32)
        paths.reset()
        out = m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
        pre = paths.snapshot()
        paths.reset()
        pos = torch.tensor([T])
        with monkeypatch.context() as mp:   # the whole decode step with host reads refused
            no_host_reads(mp)
            dec = m.forward(torch.tensor([42]), Step(pos, None, "all"), cache, ctx)
        post = paths.snapshot()
        monkeypatch.undo()
    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5
    L = m.cfg.n_layers
    assert pre["counts"].get("moe.act.triton") == L and post["counts"].get("moe.act.triton") == L
    assert post["counts"].get("moe.gather") == L
    assert any(k.startswith("moe.grouped") for k in pre["fallbacks"]) or pre["counts"].get("moe.grouped") == L
    assert pre["counts"].get("attention.sinks.torch") == L


@pytest.fixture(scope="module")
def Q8():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.gemv_q8_experts", "minfer.ops.cuda.dequant",
                                     "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe"]):
        yield mods


def x_hat(v: torch.Tensor) -> torch.Tensor:
    """float64 values of v (1, K) after the int8 quantization per 32 values (q8_rows' rule)."""
    b = v.double().view(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    t = torch.where(d > 0, b / d, torch.zeros_like(b))
    return (torch.sign(t) * torch.floor(t.abs() + 0.5) * d).view(1, -1)


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
def test_q8_gather_with_gpt_oss_options(Q8):
    """One decode row over repacked (Q4_K / Q6_K planes) experts: the int8 expert GEMVs, the biased
    clamped activation (moe_act) and its rows quantized in a launch of their own, the down
    projection and its bias, against float64 math on the same quantized values."""
    import types

    from minfer.ops import paths

    M, G = Q8["moe"], Q8["gemv_repack"]
    Ev, Fe, Dm = 4, 256, 512

    def stacked(qt, n, kk, seed):
        raw = random_weight(qt, n, kk, np.random.default_rng(seed))
        rw = G.repack(torch.from_numpy(raw), qt, n, kk)
        return (types.SimpleNamespace(repacked=rw, shape=(n, kk), name=f"blk.0.x{seed}_exps.weight", qtype=qt),
                torch.from_numpy(reference_dequant(raw, qt, n, kk)).double())

    (gw, wg), (uw, wu), (dw, wd) = stacked(12, Ev * Fe, Dm, 71), stacked(12, Ev * Fe, Dm, 72), stacked(14, Ev * Dm, Fe, 73)
    g = torch.Generator().manual_seed(4)
    h = (torch.randn(1, Dm, generator=g) * 1e-3).to(torch.float16)   # fp16 products in range (test_gemv_q8)
    router = torch.randn(Ev, Dm, generator=g)
    opts = dict(router_bias=torch.randn(Ev, generator=g), gating="topk_softmax",
                gate_bias=0.5 * torch.randn(Ev, Fe, generator=g), up_bias=0.5 * torch.randn(Ev, Fe, generator=g),
                down_bias=20 * torch.randn(Ev, Dm, generator=g), act="swiglu_oai", alpha=1.702, limit=0.4)
    h.q8 = Q8["gemv_q8"].quantize(h, interpret=True)
    paths.reset()
    out = M.moe_ffn(h, router, gw, uw, dw, K, False, **opts)
    assert paths.snapshot()["counts"].get("moe.gather.q8") == 1
    xh = x_hat(h.float())
    logits = router.double() @ h.double()[0] + opts["router_bias"].double()
    top = torch.topk(logits, K).indices
    want = torch.zeros(1, Dm, dtype=torch.float64)
    db = torch.zeros(1, Dm, dtype=torch.float64)
    for wt, e in zip(torch.softmax(logits[top], 0), top.tolist()):
        db[0] += wt * opts["down_bias"][e].double()
        gg = (xh @ wg[e * Fe:(e + 1) * Fe].T).half().double() + opts["gate_bias"][e].double()
        uu = (xh @ wu[e * Fe:(e + 1) * Fe].T).half().double() + opts["up_bias"][e].double()
        gg = gg.clamp(max=0.4)
        a = (gg * torch.sigmoid(1.702 * gg) * (uu.clamp(-0.4, 0.4) + 1)).half()      # stored in h's dtype
        want[0] += wt * ((x_hat(a) @ wd[e * Dm:(e + 1) * Dm].T)[0] + opts["down_bias"][e].double())
    assert out.shape == (1, Dm) and rel_err(out, want) < 2e-3
    assert rel_err(out, want - db) > 5e-2 and rel_err(out, db) > 5e-2      # the down bias and the rest both count
