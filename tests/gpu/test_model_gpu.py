"""Whole models: the CUDA engine against the CPU reference engine on synthetic GGUF files.

Each architecture and recipe (minfer synth): logits of a prefill and of decode steps within
1e-2 relative error, and 32 greedy tokens identical.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from minfer.switches import Switches

sys.path.insert(0, os.path.dirname(__file__))
from graphed_pair import assert_flip_is_near_tie  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [("tiny", "qwen2", "q4_k_m"), ("tiny", "llama", "q4_k_m"), ("tiny", "qwen2", "q4_0"),
         ("tiny", "llama", "q8_0"), ("tiny", "qwen2", "f16"),
         ("qwen2.5-0.5b", "qwen2", "q4_k_m"),     # 896 columns: Q5_0/Q8_0 fallbacks, like the real file
         ("qwen3-30b-a3b", "qwen3moe", "q4_k_m")]  # 2 layers of 128 experts: the int8 expert gather


# the CPU side is the float32 reference whatever the environment says: the int8 CPU fast path
# (Switches.cpu_quant, on by default) would put its own quantization error into the comparison
CPU_REFERENCE = Switches(cpu_quant=False)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


@pytest.mark.parametrize("preset,arch,recipe", CASES)
def test_gpu_matches_cpu(synth_dir, preset, arch, recipe):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    p = get_preset(preset).with_overrides(arch=arch, layers=2 if preset != "tiny" else None,
                                          vocab=2000 if preset != "tiny" else None)
    path = synth_dir / f"{preset}-{arch}-{recipe}.gguf"
    write_synth(path, p, recipe, seed=1, progress=False)
    cpu = Engine.load(str(path), device="cpu", ctx=256, progress=False, switches=CPU_REFERENCE)
    gpu = Engine.load(str(path), device="cuda", ctx=256, progress=False)
    # the bf16-activation decode (Switches.gemv_q8 off): greedy identical to the CPU reference
    gpu16 = Engine.load(str(path), device="cuda", ctx=256, progress=False, switches=Switches(gemv_q8=False))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, p.vocab, (40,), generator=g).tolist()
    paths.reset()
    lc = cpu.forward(prompt, 0)
    lg = gpu.forward(prompt, 0)
    assert torch.isfinite(lg).all()
    # MoE: bf16 activations flip near-tied router choices now and then, a floor of 3-5% of the
    # logits' norm measured on the CPU (tests/gpu/test_arch_gpu.py); H200 2026-11-30: 1.48e-2
    moe = arch == "qwen3moe"
    tol = 5e-2 if moe else 1e-2
    assert rel(lg, lc) < tol
    gpu16.forward(prompt, 0)
    # decode steps through the cache. The default one-row decode quantizes each matmul input to
    # int8 per 32 values (gemv_q8, llama.cpp's mmvq precision): ~0.4% of a block's largest value
    # per input, which on these 2-3 layer models moved decode logits by up to 1.15e-2 (H200,
    # 2026-11-30) where bf16 inputs stay under 1e-2.
    for i, tok in enumerate(prompt[:4]):
        dc = cpu.forward([tok], 40 + i)
        dg = gpu.forward([tok], 40 + i)
        assert rel(dg, dc) < 2 * tol
        assert rel(gpu16.forward([tok], 40 + i), dc) < tol
    counts = paths.snapshot()["counts"]
    assert any(k.endswith(".prefill") or k.endswith(".cublas_direct") for k in counts), counts
    assert any(k.endswith(".decode") or ".decode." in k for k in counts), counts
    assert paths.snapshot()["fallbacks"] == {}
    if arch == "qwen3moe":
        assert counts.get("moe.gather.q8", 0) >= 4, counts        # the decode steps' experts
    params = SamplingParams(temperature=0)
    cpu.reset()
    gpu.reset()
    gpu16.reset()
    tc = [e.token_id for e in cpu.generate(prompt[:10], params, max_new_tokens=32)]
    t16 = [e.token_id for e in gpu16.generate(prompt[:10], params, max_new_tokens=32)]
    for tg in [t16, [e.token_id for e in gpu.generate(prompt[:10], params, max_new_tokens=32)]]:
        # bf16 or int8 activations (and, on the MoE, bf16 router choices) may flip a near-tie
        # of the reference, nothing else (graphed_pair.assert_flip_is_near_tie). (tiny-llama-q8_0's
        # bf16 decode flips at token 26 of 32, where the reference's two best logits are 0.9421 and
        # 0.9418 with a spread of 0.31: H200, 2026-12-01, after the decode attention took the rope.)
        assert_flip_is_near_tie(cpu, prompt[:10], tc, tg)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_default_prefill_paths_match_cpu(synth_dir, monkeypatch, arch):
    """The default fast paths of issue 7's last step -- the fused residual add + RMSNorm and
    cuDNN prefill attention -- keep the CPU parity: logits within 1e-2, 32 greedy tokens
    equal, and their paths ran (no fallback)."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    p = get_preset("tiny").with_overrides(arch=arch)
    path = synth_dir / f"prepared-{arch}.gguf"
    write_synth(path, p, "q4_k_m", seed=7, progress=False)
    cpu = Engine.load(str(path), device="cpu", ctx=256, progress=False, switches=CPU_REFERENCE)
    gpu = Engine.load(str(path), device="cuda", ctx=256, progress=False)
    prompt = torch.randint(0, p.vocab, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    paths.reset()
    assert rel(gpu.forward(prompt, 0), cpu.forward(prompt, 0)) < 1e-2
    snap = paths.snapshot()
    assert snap["counts"].get("add_rms_norm.triton", 0) > 0
    assert snap["counts"].get("attention.prefill.cudnn", 0) > 0 and not snap["fallbacks"], snap
    cpu.reset()
    gpu.reset()
    params = SamplingParams(temperature=0)
    tc = [e.token_id for e in cpu.generate(prompt[:50], params, max_new_tokens=32)]
    tg = [e.token_id for e in gpu.generate(prompt[:50], params, max_new_tokens=32)]
    assert_greedy_equal_or_bf16_tie(cpu, prompt[:50], tc, tg)


def assert_greedy_equal_or_bf16_tie(cpu, prompt, tc, tg):
    """Greedy identity, except at a first divergence where the CPU reference's top two logits
    are closer than one bf16 step of their magnitude (2^-7 relative): a tie that bf16 activations
    cannot resolve, and where any summation order decides. The H200 run of 2026-11-30 showed one:
    the repacked decode GEMV (another order of the same sums) chose the second of 0.91062 and
    0.90956 at token 27 of the tiny llama model, the raw GEMV the first (bench/results, lead runs)."""
    i = next((j for j in range(min(len(tc), len(tg))) if tc[j] != tg[j]), None)
    if i is None:
        assert len(tg) == len(tc)
        return
    cpu.reset()
    top = cpu.forward(list(prompt) + tc[:i], 0)[-1].topk(2).values.tolist()
    assert top[0] - top[1] < abs(top[0]) * 2 ** -7, (i, tc, tg, top)


def test_cuda_cache_rows_and_bucketed_prefill(synth_dir, monkeypatch):
    """ctx 200 on CUDA: 256 cache rows, the load line says so, the context stays 200; a
    150-token eager prefill (graphs off) rounds its cuDNN length to 256 inside the cache and
    matches the CPU."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.errors import MinferError
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = synth_dir / "rows.gguf"
    write_synth(path, p, "q4_k_m", seed=11, progress=False)
    from minfer.switches import Switches

    gpu = Engine.load(str(path), device="cuda", ctx=200, progress=False, switches=Switches(prefill_graph=False))
    cpu = Engine.load(str(path), device="cpu", ctx=200, progress=False, switches=CPU_REFERENCE)
    assert gpu.n_ctx == 200 and gpu.cache.n_ctx == 256
    assert "(200 positions in 256 rows" in gpu.memory_report, gpu.memory_report
    prompt = torch.randint(0, p.vocab, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    paths.reset()
    lg = gpu.prefill(prompt)
    snap = paths.snapshot()
    assert snap["counts"].get("attention.prefill.cudnn.padded", 0) == p.n_layers, snap
    assert rel(lg, cpu.prefill(prompt)) < 1e-2
    with pytest.raises(MinferError, match="context"):
        gpu.prefill(prompt + prompt)                              # 300 > 200: refused
