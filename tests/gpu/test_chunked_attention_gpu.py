"""llama4's chunked attention in the contiguous cache's decode kernel (ops/cuda/attention.py
_decode_attn_kernel's CHUNK variant, attention.chunked.decode) on the GPU: bf16 at Llama 4 Scout's
heads (40 query heads, 8 KV heads of 128) against a float32 torch formula, at rows on both sides of
chunk boundaries, chunk 8192 and chunks not aligned to the key tiles, with the switches' default
variants (attention()) and plain splits; one CUDA graph captured once and replayed at positions in
different chunks (the chunk's start from the device position); the llama4 fixture (chunk 8) decoding
through the engine's CUDA graphs against the CPU float32 engine. Checked in Triton's interpreter by
tests/ops/test_chunked_decode_attention.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
H, HKV, DH = 40, 8, 128                                       # Llama 4 Scout's attention heads


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _formula(q, kc, vc, p, chunk):
    """float32 torch: q (1, H, Dh) at position p over keys [p // chunk * chunk, p] -> (1, H, Dh)."""
    lo = p // chunk * chunk
    k = kc[lo:p + 1].float().repeat_interleave(H // HKV, 1).transpose(0, 1)        # (H, n, Dh)
    v = vc[lo:p + 1].float().repeat_interleave(H // HKV, 1).transpose(0, 1)
    s = torch.einsum("hd,hnd->hn", q[0].float(), k) / DH ** 0.5
    return torch.einsum("hn,hnd->hd", torch.softmax(s, -1), v)[None]


def _data(S, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = 2 * torch.randn(1, H, DH, device="cuda", generator=g).bfloat16()
    kc = torch.randn(S, HKV, DH, device="cuda", generator=g).bfloat16()
    vc = torch.randn(S, HKV, DH, device="cuda", generator=g).bfloat16()
    return q, kc, vc


@pytest.mark.parametrize("chunk,positions", [
    (8192, [0, 1, 100, 8191, 8192, 8193, 12000, 16383, 16384, 20479]),
    (100, [0, 99, 100, 150, 199, 5000, 20479]),                # not aligned to the 64-key tiles
    (8, [7, 8, 20479])])
def test_chunk_kernel_bf16_matches_formula(chunk, positions):
    import importlib

    A = importlib.import_module("minfer.ops.cuda.attention")
    from minfer.ops import paths

    q, kc, vc = _data(20480, chunk)
    paths.reset()
    for p in positions:
        pos = torch.tensor([p], device="cuda")
        want = _formula(q, kc, vc, p, chunk)
        a = A.attention(q, kc, vc, pos, chunk=chunk)           # the switches' defaults (the model's call)
        b = A.decode_attention(q, kc, vc, pos, n_keys_add=1, chunk=chunk, n_split=5, direct=False)
        for out in (a, b):
            assert torch.isfinite(out.float()).all()
            assert _rel(out, want) < 1e-2, (p, _rel(out, want))
        if p >= chunk:           # the chunk is needed: the whole causal row differs
            full = A.decode_attention(q, kc, vc, pos, n_keys_add=1)
            assert _rel(full, want) > 5e-2, p
    assert paths.snapshot()["counts"].get("attention.chunked.decode") == len(positions)


def test_chunk_kernel_in_one_graph_at_every_position():
    """Captured once at position 0, replayed at positions in chunks 0, 1 and 2 (chunk 8192, a 20480-row
    cache): each replay's chunk start comes from the position tensor."""
    import importlib

    A = importlib.import_module("minfer.ops.cuda.attention")
    q, kc, vc = _data(20480, 1)
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    A.attention(q, kc, vc, pos, chunk=8192)                   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = A.attention(q, kc, vc, pos, chunk=8192)
    for p in (5, 8191, 8192, 9000, 16383, 16384, 20000, 3):
        pos.fill_(p)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, _formula(q, kc, vc, p, 8192)) < 1e-2, p


def test_llama4_fixture_graphed_decode_across_chunks():
    """llama4's fixture with chunk 8 (and temperature floor 4, as the CPU tests): a 10-token prompt,
    then 20 graphed decode steps (positions 10..29: chunk starts 8, 16, 24) in float32 on the GPU
    against the CPU float32 engine, teacher-forced; the chunked layers by the CHUNK kernel, no torch mask."""
    from minfer.ops import paths
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    path = Path(__file__).resolve().parents[1] / "data" / "arch" / "llama4.gguf"
    cpu = Engine.load(str(path), device="cpu", ctx=64, progress=False, switches=Switches(cpu_quant=False))
    gpu = Engine.load(str(path), device="cuda", ctx=64, progress=False,
                      switches=replace(Switches(), act_dtype="float32"))
    for e in (cpu, gpu):
        e.model.chunk, e.model.temp_floor = 8, 4
    prompt = (torch.arange(3, 13) * 7 % 300 + 3).tolist()
    paths.reset()
    lc, lg = cpu.forward(prompt, 0), gpu.forward(prompt, 0)
    assert _rel(lg, lc) < 1e-3
    t, worst = int(lc[-1].argmax()), 0.0
    for i in range(20):
        lc, lg = cpu.forward([t], 10 + i)[-1], gpu.forward([t], 10 + i)[-1]
        worst = max(worst, _rel(lg, lc))
        t = int(lc.argmax())
    assert worst < 1e-3, worst
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.chunked.decode", 0) > 0 and "attention.chunked.torch" not in counts, counts
    assert counts.get("graph.decode.replay", 0) > 0, counts
