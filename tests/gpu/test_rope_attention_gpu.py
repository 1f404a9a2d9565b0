"""The decode attention with rope and the KV append inside it (ops/cuda/decode_attn_rope.py
rope_decode_attention, Switches.decode_attn_rope) on the GPU: against the two-launch path
(rope_kv_write, then decode_attention) at the 7B's head shapes in bf16, and a whole model's
graphed decode with it on and off (teacher-forced: the same tokens fed to both)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minfer.config import RopeConfig
from minfer.switches import Switches

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize("pos", [0, 1, 63, 64, 127, 1000, 3354, 4095])
def test_fused_equals_rope_kv_then_attention(style, pos):
    import importlib

    A = importlib.import_module("minfer.ops.cuda.attention")
    R = importlib.import_module("minfer.ops.cuda.decode_attn_rope")
    N = importlib.import_module("minfer.ops.cuda.norm_rope_act")
    H, Hkv, Dh, S = 28, 4, 128, 4096                          # Qwen2.5-7B's heads, a 4096 cache
    cfg = RopeConfig(theta=1e6, style=style, n_rot=Dh)
    g = torch.Generator(device="cuda").manual_seed(pos)
    qkv = torch.randn(1, (H + 2 * Hkv) * Dh, device="cuda", generator=g).bfloat16()
    q, k, v = torch.split(qkv, [H * Dh, Hkv * Dh, Hkv * Dh], dim=1)
    q, k, v = q.view(1, H, Dh), k.view(1, Hkv, Dh), v.view(1, Hkv, Dh)
    kc = torch.randn(S, Hkv, Dh, device="cuda", generator=g).bfloat16()
    vc = torch.randn(S, Hkv, Dh, device="cuda", generator=g).bfloat16()
    kc2, vc2 = kc.clone(), vc.clone()
    p = torch.tensor([pos], device="cuda")
    out = R.rope_decode_attention(q, k, v, p, N._turns(cfg, "cuda"), style == "neox", kc, vc, q8=True)
    qr = N.rope_kv_write(q, k, v, p, cfg, kc2, vc2)
    ref = A.decode_attention(qr, kc2, vc2, p, q8=True, n_keys_add=1)
    rest = torch.arange(S, device="cuda") != pos
    assert torch.equal(kc[rest], kc2[rest]) and torch.equal(vc, vc2)       # v stored as is, nothing else
    # the rotated key: the same formula in both kernels; the compiler may contract a*c - b*s into
    # an FMA in one and not the other, so within one bf16 rounding
    assert ((kc[pos].float() - kc2[pos].float()).abs() <= kc2[pos].float().abs() * 2 ** -7 + 1e-6).all()
    assert _rel(out, ref) < 1e-2, _rel(out, ref)
    # the o projection's int8 input: both quantize their own output per 32 values
    from minfer.ops.cuda.gemv_q8 import dequantize_q8

    d_out, d_ref = dequantize_q8(out.q8, H * Dh), dequantize_q8(ref.q8, H * Dh)
    assert _rel(d_out, out.reshape(1, -1)) < 2e-2 and _rel(d_out, d_ref) < 2e-2


def test_graphed_decode_with_rope_in_attention_matches_apart(tmp_path):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = dataclasses.replace(get_preset("tiny"), ffn=1024)
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=6, progress=False)
    paths.reset()
    a = Engine.load(str(path), device="cuda", ctx=256, progress=False, switches=Switches(decode_attn_rope=True))
    b = Engine.load(str(path), device="cuda", ctx=256, progress=False, switches=Switches(decode_attn_rope=False))
    prompt = torch.randint(0, p.vocab, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    la, lb = a.prefill(prompt), b.prefill(prompt)
    assert torch.equal(la, lb)
    t = int(la.argmax())
    worst = 0.0
    for step in range(100):
        pos = len(prompt) + step
        la, lb = a.forward([t], pos)[-1], b.forward([t], pos)[-1]
        worst = max(worst, _rel(la, lb))
        t = int(la.argmax())                                  # teacher-forced: both get a's token
    assert worst < 2e-2, worst
    counts = paths.snapshot()["counts"]
    # counted when the graphs were captured: a's layers on the fused kernel, b's on the two launches
    assert counts.get("attention.decode.rope", 0) > 0 and counts.get("attention.decode.triton", 0) > 0
    assert counts.get("rope_kv.triton", 0) > 0 and counts.get("graph.decode.replay", 0) >= 200
