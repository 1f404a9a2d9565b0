"""The issue-16 CUDA ops run on the CPU by Triton's interpreter (TRITON_INTERPRET=1), against the
torch reference: GELU-tanh gating (gemma3), sliding-window attention (decode kernel and masked
prefill), and the MoE FFN (expert gather and the grouped path's device-only fallback) on the
qwen3moe fixture's weights (tests/data/arch, made by llama.cpp's converter)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules  # noqa: E402

from minfer.ops import reference  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe"]
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(_MODS):
        yield mods


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def test_geglu_kernel(K):
    g = torch.Generator().manual_seed(0)
    gate, up = torch.randn(5, 300, generator=g) * 3, torch.randn(5, 300, generator=g)
    out = K["norm_rope_act"].geglu(gate, up)
    # float64 formula of HF's gelu_pytorch_tanh, independent of both implementations
    x = gate.double()
    want = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3))) * up.double()
    assert rel(out, want) < 1e-6
    assert rel(reference.geglu(gate, up), want) < 1e-6


@pytest.mark.parametrize("n_keys,window", [(70, 16), (70, 100), (9, 4), (33, 0)])
def test_window_decode_kernel(K, n_keys, window):
    g = torch.Generator().manual_seed(n_keys)
    S, H, Hkv, D = 96, 4, 2, 32
    k, v = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    q = torch.randn(1, H, D, generator=g)
    ref = reference.attention(q, k, v, n_keys - 1, window=window)
    for nk in (n_keys, torch.tensor([n_keys], dtype=torch.int32)):   # host length, and graph-style
        out = K["attention"].decode_attention(q, k, v, nk, window=window)
        assert rel(out, ref) < 1e-5


def test_window_masked_prefill_and_chunk(K):
    g = torch.Generator().manual_seed(3)
    S, H, Hkv, D, W = 80, 4, 1, 32, 7
    k, v = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    for start, T in ((0, 40), (40, 25)):
        q = torch.randn(T, H, D, generator=g)
        out = K["attention"].attention(q, k, v, start, window=W)
        ref = reference.attention(q, k, v, start, window=W)
        assert rel(out, ref) < 1e-5
        # the window matters: plain causal attention differs
        assert rel(reference.attention(q, k, v, start), ref) > 1e-2


def test_reference_window_mask_is_llamacpps():
    """llama_hparams::is_masked_swa (STANDARD): key j masked for the query at p when p - j >= W."""
    m = reference.window_mask(torch.tensor([0, 5, 9]), 10, 4)
    assert m[0].tolist() == [True] + [False] * 9
    assert m[1].tolist() == [False, False, True, True, True, True, False, False, False, False]
    assert m[2].nonzero().flatten().tolist() == [6, 7, 8, 9]


@pytest.mark.parametrize("T", [1, 3, 20])
def test_moe_ffn_kernel_paths(K, T):
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import paths

    m = load_model(GGUFFile(DATA / "qwen3moe.gguf"), progress=False)
    e = m.moe[1]
    g = torch.Generator().manual_seed(T)
    h = torch.randn(T, m.cfg.d_model, generator=g)
    ref = reference.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, 2, True)
    paths.reset()
    out = K["moe"].moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, 2, True)
    assert rel(out, ref) < 1e-5
    snap = paths.snapshot()
    if T * 2 <= K["moe"].GATHER_MAX:
        assert snap["counts"].get("moe.gather") == 1
    else:   # no bf16 grouped GEMM on the CPU: the padded batched matmul, said as a fallback
        assert any(k.startswith("moe.grouped") for k in snap["fallbacks"]), snap


def test_moe_reference_is_a_plain_loop():
    """The reference itself against a token-by-token, expert-by-expert float64 sum."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model

    m = load_model(GGUFFile(DATA / "qwen3moe.gguf"), progress=False)
    e = m.moe[0]
    E, D = e.gate_inp.shape
    Fe = e.gate_exps.shape[0] // E
    h = torch.randn(4, D, generator=torch.Generator().manual_seed(5))
    # the loader keeps the experts' file blocks only (no dense copy): decoded whole here
    G, U, Dn = (x.dequantize_rows(torch.arange(x.shape[0])).double() for x in (e.gate_exps, e.up_exps, e.down_exps))
    want = torch.zeros(4, D, dtype=torch.float64)
    for t in range(4):
        p = torch.softmax(e.gate_inp.double() @ h[t].double(), 0)
        top = torch.topk(p, 2).indices.tolist()
        wsum = sum(p[i] for i in top)
        for i in top:
            a = G[i * Fe:(i + 1) * Fe] @ h[t].double()
            b = U[i * Fe:(i + 1) * Fe] @ h[t].double()
            want[t] += p[i] / wsum * (Dn[i * D:(i + 1) * D] @ (torch.nn.functional.silu(a) * b))
    got = reference.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, 2, True)
    assert rel(got, want) < 1e-5
