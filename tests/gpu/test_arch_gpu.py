"""The new architectures on the GPU: the CUDA engine against the CPU reference engine and against
transformers, on the committed fixtures of tests/data/arch/ (tools/gen_arch_fixtures.py: tiny
random HF models converted by llama.cpp's convert_hf_to_gguf.py, F16 weights).

- act_dtype float32: every position's logits within 1e-3 of transformers, greedy identical.
- the default bf16: logits within 2e-2 of the CPU engine (prefill and decode steps), and the
  launch paths say the architecture's own kernels ran (window attention, GELU, MoE).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
ARCHS = ["qwen3", "llama3", "mistral", "gemma3", "phi3", "phi3partial", "qwen3moe", "qwen2moe"]
CTX = {"phi3": 32, "phi3partial": 32}
# the launch paths each architecture must show on the GPU
MUST_RUN = {"gemma3": ["attention.window", "geglu.triton"], "qwen3moe": ["moe.gather", "moe.grouped"]}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def engine(name, device, act_dtype=None, ctx=None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    import os

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})   # the CPU side: float32 reference
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(DATA / f"{name}.gguf", device=device, ctx=ctx or CTX.get(name, 64), progress=False,
                       switches=sw)


@pytest.mark.parametrize("name", ARCHS)
def test_arch_gpu_float32_matches_transformers(name):
    from minfer.runtime.sampling import SamplingParams

    r = np.load(DATA / f"{name}.npz")
    eng = engine(name, "cuda", act_dtype="float32")
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got, r["logits"]) < 1e-3
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                              max_new_tokens=len(r["greedy"]))]
    assert out == r["greedy"].tolist()


@pytest.mark.parametrize("name", ARCHS)
def test_arch_gpu_bf16_matches_cpu(name):
    from minfer.ops import paths

    r = np.load(DATA / f"{name}.npz")
    ids = r["ids"].tolist()
    cpu = engine(name, "cpu")
    gpu = engine(name, "cuda")
    paths.reset()
    lc = cpu.forward(ids[:30], 0).numpy()
    lg = gpu.forward(ids[:30], 0).numpy()
    assert np.isfinite(lg).all()
    assert rel_err(lg, lc) < 2e-2
    for i, tok in enumerate(ids[30:34]):           # decode steps (CUDA graphs) through the cache
        dc = cpu.forward([tok], 30 + i).numpy()
        dg = gpu.forward([tok], 30 + i).numpy()
        assert rel_err(dg, dc) < 2e-2
    counts = paths.snapshot()["counts"]
    for p in MUST_RUN.get(name, []):
        assert any(k.startswith(p) for k in counts), (p, counts)


def test_phi3_gpu_long_factors():
    r = np.load(DATA / "phi3.npz")
    eng = engine("phi3", "cuda", act_dtype="float32", ctx=64)
    assert rel_err(eng.logits(r["ids_long"].tolist()).numpy(), r["logits_long"]) < 1e-3


def test_moe_gpu_paths_match_reference():
    """The MoE op alone: the expert gather (few rows) and the grouped matmul (many rows) against
    the reference's expert-by-expert loop, on the fixture's first layer."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import reference
    from minfer.ops.cuda import moe

    gf = GGUFFile(DATA / "qwen3moe.gguf")
    mc, mg = load_model(gf, device="cpu", progress=False), load_model(gf, device="cuda", progress=False)
    ec, eg = mc.moe[0], mg.moe[0]
    g = torch.Generator().manual_seed(0)
    for T in (1, 5, 200):
        h = torch.randn(T, mc.cfg.d_model, generator=g)
        ref = reference.moe_ffn(h, ec.gate_inp, ec.gate_exps, ec.up_exps, ec.down_exps, 2, True)
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            out = moe.moe_ffn(h.cuda().to(dt), eg.gate_inp, eg.gate_exps, eg.up_exps, eg.down_exps, 2, True)
            err = float((out.float().cpu() - ref).abs().max() / ref.abs().max())
            assert err < tol, (T, dt, err)


def test_window_attention_gpu_matches_reference():
    """Sliding-window attention (prefill from 0, after a prefix, and decode) against the reference."""
    from minfer.ops import reference
    from minfer.ops.cuda import attention

    g = torch.Generator().manual_seed(1)
    S, H, Hkv, D, W = 300, 4, 1, 64, 37
    k = torch.randn(S, Hkv, D, generator=g)
    v = torch.randn(S, Hkv, D, generator=g)
    for start, T in ((0, 200), (200, 60), (299, 1), (20, 1)):
        q = torch.randn(T, H, D, generator=g)
        ref = reference.attention(q, k, v, start, window=W)
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            out = attention.attention(q.cuda().to(dt), k.cuda().to(dt), v.cuda().to(dt), start, window=W)
            err = float((out.float().cpu() - ref).abs().max() / ref.abs().max())
            assert err < tol, (start, T, dt, err)
