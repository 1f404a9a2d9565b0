"""nemotron_h_moe's MoE (ungated squared-ReLU experts) on the CUDA backend, run on the CPU by Triton's
interpreter (TRITON_INTERPRET=1): moe_act.py's "relu2" activation against a float64 formula; ops/cuda/moe.py's
ungated experts (gate_exps None, act "relu2") with sigmoid routing, a selection bias, groups, renormalization
and a scale on the expert gather, the grouped prefill and the int8 gather over repacked experts against
float64 math (HF NemotronHTopkRouter / NemotronHExperts; llama.cpp build_moe_ffn LLM_FFN_RELU_SQR without a
gate), the CPU reference against the same formula, and the gate's presence checked both ways."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402
from test_gpt_oss_interpreted import Q8, rel, x_hat  # noqa: E402,F401  (Q8: the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

E, D, FE, K = 8, 64, 32, 2


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe"]):
        yield mods


@pytest.mark.parametrize("bias", [False, True])
def test_relu2_activation_against_float64(M, bias):
    """moe_act(act="relu2") with g None (ungated) on a strided view, with and without the per-expert up bias,
    against relu(u + b)^2 in float64; the reference's moe_act agrees."""
    from minfer.ops import paths, reference

    A = M["moe_act"]
    g = torch.Generator().manual_seed(4)
    R, F = 7, 48
    wide = torch.randn(R, 2 * F, generator=g) * 3
    up = wide[:, F:]
    rows_e = torch.randint(0, E, (R,), generator=g)
    ub = torch.randn(E, F, generator=g) if bias else None
    paths.reset()
    got = A.moe_act(None, up, rows_e, None, ub, act="relu2")
    assert paths.snapshot()["counts"].get("moe.act.triton") == 1
    uu = up.double() + (ub.double()[rows_e] if bias else 0)
    want = torch.relu(uu) ** 2
    assert got.shape == (R, F) and rel(got, want) < 1e-6
    assert (got[uu < 0] == 0).all()
    r = torch.cat([reference.moe_act(None, up[i:i + 1], None, ub, int(rows_e[i]), "relu2", 1.702, 7.0)
                   for i in range(R)])
    assert rel(r, want) < 1e-6
    with pytest.raises(ValueError, match="gate_bias"):
        A.moe_act(None, up, rows_e, torch.zeros(E, F), None, act="relu2")


def experts(qtype, seed):
    """Stacked up (E*FE, D) and down (E*D, FE) experts of random raw blocks, with their float64 values."""
    from minfer.weights import QWeight

    rng = np.random.default_rng(seed)

    def w(name, n, k):
        raw = random_weight(qtype, n, k, rng, scale=0.5)
        q = QWeight(name, qtype, (n, k), torch.from_numpy(raw))
        q.n_experts = E
        return q, torch.from_numpy(reference_dequant(raw, qtype, n, k)).double()

    (u, U), (dn, Dn) = w("up", E * FE, D), w("down", E * D, FE)
    return [None, u, dn], (U, Dn)


def formula(h, router, bias, vals, scale, groups=1, used=1, act="relu2", norm=True):
    """float64, token by token (HF NemotronHTopkRouter, NemotronHExperts): p = sigmoid(router h), the K largest
    p + bias within the `used` best of `groups` groups (each scored by its two best), weights p renormalized
    times scale; experts W_down relu(W_up h)^2 (act "silu": silu(W_up h), a stand-in that must miss)."""
    U, Dn = vals
    out = torch.zeros(h.shape[0], D, dtype=torch.float64)
    for t in range(h.shape[0]):
        x = h[t].double()
        p = torch.sigmoid(router.double() @ x)
        s = p + bias.double()
        if groups > 1:
            gs = s.view(groups, -1).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros(groups, dtype=torch.bool)
            keep[gs.topk(used).indices] = True
            s = s.view(groups, -1).masked_fill(~keep[:, None], float("-inf")).view(-1)
        top = torch.topk(s, K).indices
        wts = p[top] / p[top].sum() if norm else p[top]
        for wt, e in zip(wts * scale, top.tolist()):
            u = U[e * FE:(e + 1) * FE] @ x
            a = torch.relu(u) ** 2 if act == "relu2" else torch.nn.functional.silu(u)
            out[t] += wt * (Dn[e * D:(e + 1) * D] @ a)
    return out


def inputs(seed, T):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, D, generator=g), torch.randn(E, D, generator=g) * 0.3, torch.randn(E, generator=g) * 0.3


@pytest.mark.parametrize("qtype", [1, 8])              # F16, Q8_0
@pytest.mark.parametrize("T", [1, 12])                 # gather (T*k <= 16) and grouped
@pytest.mark.parametrize("groups", [1, 4])
def test_cuda_moe_relu2_against_float64(M, T, qtype, groups):
    from minfer.ops import paths, reference

    mats, vals = experts(qtype, seed=T + qtype + groups)
    h, router, bias = inputs(T + groups, T)
    opts = dict(act="relu2", gating="sigmoid", select_bias=bias, n_group=groups, topk_group=2 if groups > 1 else 1,
                weights_scale=2.5)
    want = formula(h, router, bias, vals, 2.5, groups, opts["topk_group"])
    paths.reset()
    got = M["moe"].moe_ffn(h, router, *mats, K, True, **opts)
    snap = paths.snapshot()
    assert rel(got, want) < 1e-5, (T, qtype, groups)
    assert snap["counts"].get("moe.act.triton") == 1
    if T * K <= M["moe"].GATHER_MAX:
        assert snap["counts"].get("moe.gather") == 1
    else:
        assert any(k.startswith("moe.grouped") for k in snap["fallbacks"])
    assert rel(reference.moe_ffn(h, router, *mats, K, True, **opts), want) < 1e-5
    # each rule counts: the selection bias, the scale, the renormalization, the squared ReLU
    assert rel(got, formula(h, router, torch.zeros(E), vals, 2.5, groups, opts["topk_group"])) > 1e-2
    assert rel(got, formula(h, router, bias, vals, 1.0, groups, opts["topk_group"])) > 1e-2
    assert rel(got, formula(h, router, bias, vals, 2.5, groups, opts["topk_group"], norm=False)) > 1e-2
    assert rel(got, formula(h, router, bias, vals, 2.5, groups, opts["topk_group"], act="silu")) > 1e-2


def test_gate_presence_is_checked(M):
    """act "relu2" takes no gate_exps; the gated acts need one (both backends)."""
    from minfer.ops import reference

    (_, u, dn), _ = experts(1, seed=3)
    h, router, _ = inputs(3, 2)
    for f in (M["moe"].moe_ffn, reference.moe_ffn):
        with pytest.raises(ValueError, match="takes no gate_exps"):
            f(h, router, u, u, dn, K, True, act="relu2")
        with pytest.raises(ValueError, match="needs gate_exps"):
            f(h, router, None, u, dn, K, True, act="silu")


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
def test_q8_gather_ungated(Q8):
    """One decode row over repacked (Q4_K / Q6_K planes) experts with act "relu2": one int8 GEMV of each
    selected expert's up rows, relu(u)^2 (moe_act) quantized, the down projection, the sigmoid / biased /
    renormalized / scaled weights, against float64 math on the same quantized values."""
    from minfer.ops import paths

    Mo, G = Q8["moe"], Q8["gemv_repack"]
    Ev, Fe, Dm = 4, 256, 512

    def stacked(qt, n, kk, seed):
        raw = random_weight(qt, n, kk, np.random.default_rng(seed))
        rw = G.repack(torch.from_numpy(raw), qt, n, kk)
        return (types.SimpleNamespace(repacked=rw, shape=(n, kk), name=f"blk.0.x{seed}_exps.weight", qtype=qt),
                torch.from_numpy(reference_dequant(raw, qt, n, kk)).double())

    (uw, wu), (dw, wd) = stacked(12, Ev * Fe, Dm, 91), stacked(14, Ev * Dm, Fe, 93)
    g = torch.Generator().manual_seed(8)
    h = (torch.randn(1, Dm, generator=g) * 1e-3).to(torch.float16)   # fp16 products in range (test_gemv_q8)
    router = torch.randn(Ev, Dm, generator=g)
    bias = torch.randn(Ev, generator=g) * 0.3
    h.q8 = Q8["gemv_q8"].quantize(h, interpret=True)
    paths.reset()
    out = Mo.moe_ffn(h, router, None, uw, dw, K, True, act="relu2", gating="sigmoid", select_bias=bias,
                     weights_scale=2.5)
    assert paths.snapshot()["counts"].get("moe.gather.q8") == 1
    xh = x_hat(h.float())
    p = torch.sigmoid(router.double() @ h.double()[0])
    top = torch.topk(p + bias.double(), K).indices
    want = torch.zeros(1, Dm, dtype=torch.float64)
    for wt, e in zip(p[top] / p[top].sum() * 2.5, top.tolist()):
        u = (xh @ wu[e * Fe:(e + 1) * Fe].T).half().double()
        a = (torch.relu(u) ** 2).half()                                   # stored in h's dtype
        want[0] += wt * (x_hat(a) @ wd[e * Dm:(e + 1) * Dm].T)[0]
    assert out.shape == (1, Dm) and rel_err(out, want) < 2e-3
