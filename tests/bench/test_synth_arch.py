"""`minfer synth` for the issue-16 families: qwen3, llama3 rope scaling, gemma3, qwen3moe.

The plans carry the tensors llama.cpp's loaders require for each architecture (src/models/
<arch>.cpp load_arch_tensors); small versions of each preset are written and run by the CPU
engine (finite logits; the cached run equals the whole-sequence run).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.bench.presets import get_preset
from minfer.bench.synth import llama3_rope_factors, plan_tensors, write_synth


def names(p):
    return {t.name: t for t in plan_tensors(p, "q4_k_m")}


def test_qwen3_30b_a3b_plan_has_stacked_experts():
    p = get_preset("qwen3-30b-a3b")
    t = names(p)
    g = t["blk.0.ffn_gate_exps.weight"]
    assert (g.experts, g.shape) == (128, (128 * 768, 2048))
    assert t["blk.0.ffn_down_exps.weight"].shape == (128 * 2048, 768)
    assert t["blk.0.ffn_gate_inp.weight"].shape == (128, 2048)
    assert "blk.0.ffn_gate.weight" not in t and "blk.0.attn_q_norm.weight" in t
    # the Q4_K_M rule's ffn_down layers apply to the stacked experts too (llama-quant.cpp)
    assert t["blk.0.ffn_down_exps.weight"].qtype.name == "Q6_K"
    assert t["blk.10.ffn_down_exps.weight"].qtype.name == "Q4_K"


def test_gemma3_and_llama3_plans():
    t = names(get_preset("gemma3-4b"))
    for n in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
        assert f"blk.33.{n}.weight" in t
    assert "output.weight" not in t                      # tied
    p = get_preset("llama3.1-8b")
    assert names(p)["rope_freqs.weight"].shape == (64,)
    f = llama3_rope_factors(p)
    # the converter's bands: high frequencies unscaled, low ones divided by `factor`
    assert f[0] == 1.0 and f[-1] == 8.0 and ((f >= 1) & (f <= 8)).all()


SMALL = {
    "qwen3-8b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=64, vocab=600),
    "llama3.1-8b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=32, vocab=600),
    "gemma3-4b": dict(hidden=128, ffn=256, n_layers=6, n_head=4, n_kv_head=2, head_dim=64, vocab=600,
                      sliding_window=5),
    "qwen3-30b-a3b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=64, vocab=600,
                          n_expert=8, n_expert_used=2, expert_ffn=64),
    "gemma2-2b": dict(hidden=128, ffn=256, n_layers=4, n_head=4, n_kv_head=2, head_dim=64, vocab=600,
                      sliding_window=5),
    "olmo2-7b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=32, vocab=600),
    "granite-3.3-8b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=32, vocab=600),
    "smollm3-3b": dict(hidden=128, ffn=256, n_layers=4, n_head=4, n_kv_head=2, head_dim=32, vocab=600),
    "ernie4.5-0.3b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=32, vocab=600),
    "glm4-9b": dict(hidden=128, ffn=256, n_layers=2, n_head=4, n_kv_head=2, head_dim=32, vocab=600, rope_dims=16),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_synth_files_run(tmp_path, name):
    import os

    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    p = replace(get_preset(name), **SMALL[name])
    path = tmp_path / f"{name}.gguf"
    write_synth(path, p, "q8_0", seed=3, progress=False)
    eng = Engine.load(path, ctx=64, progress=False,   # the float32 reference path on the CPU
                      switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))
    assert eng.config.arch == p.arch
    ids = list(range(3, 23))
    whole = eng.logits(ids)
    assert whole.shape == (20, p.vocab) and torch.isfinite(whole).all()
    parts = torch.cat([eng.forward(ids[:7], 0), eng.forward(ids[7:], 7)])
    assert np.allclose(parts.numpy(), whole.numpy(), rtol=1e-4, atol=1e-4)


def test_new_architecture_presets(tmp_path):
    """granite's four multipliers reach the loaded model; glm4's plan has its fused gate/up (2F rows,
    no ffn_gate), q/k/v biases, post-norms and half-head rotation (rope.dimension_count)."""
    import os

    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    t = names(get_preset("glm4-9b"))
    assert t["blk.0.ffn_up.weight"].shape == (2 * 13696, 4096) and "blk.0.ffn_gate.weight" not in t
    assert {"blk.0.attn_q.bias", "blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= set(t)
    p = replace(get_preset("granite-3.3-8b"), **SMALL["granite-3.3-8b"])
    write_synth(tmp_path / "g.gguf", p, "q8_0", seed=3, progress=False)
    m = Engine.load(tmp_path / "g.gguf", ctx=64, progress=False,
                    switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})).model
    assert (m.embed_scale, m.residual_scale, m.logit_scale) == pytest.approx((12.0, 0.22, 16.0))
    assert m.q_scale == pytest.approx(0.0078125 * 32 ** 0.5)
    p = replace(get_preset("glm4-9b"), **SMALL["glm4-9b"])
    write_synth(tmp_path / "z.gguf", p, "q8_0", seed=3, progress=False)
    eng = Engine.load(tmp_path / "z.gguf", ctx=64, progress=False)
    assert eng.config.rope.n_rot == 16 and eng.config.head_dim == 32
