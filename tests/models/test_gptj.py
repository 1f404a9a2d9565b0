"""EleutherAI GPT-J (minfer/models/gptj.py) against transformers, on the CPU's float32 reference: the rope rule
itself against HF's rotate_every_two formula, each rule of the graph needed (with one changed the logits miss by
far), the fused attn_qkv form equal to the separate one, what the model needs refused by name when missing, and the
CUDA backend's code (Triton's interpreter on CPU tensors) equal to the reference in prefill and decode. The logits,
greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name "gptj").
Fixture: tests/data/arch/gptj.gguf (tools/gptj_fixture.py: transformers' GPTJForCausalLM, rotary_dim 8 of head
dim 16, n_inner 96, biases drawn around 0; llama.cpp's converter machinery with a GPT-J class registered, since
llama.cpp 0.3.36 has none)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

NAME = "gptj"
BASE_ERR = 7.3e-7      # the fixture's float32 miss


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert c.arch == "gptj"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn) == (16, 4, 4, 64, 96)
    assert c.rope.style == "normal" and c.rope.n_rot == 8 and c.rope.theta == 10000.0
    assert not c.tied_output and m.output_b.shape == (c.vocab,) and m.output_norm_b.shape == (64,)
    b = m.blocks[0]
    assert b.ffn_norm is None and b.attn_qkv is None
    assert b.attn_q_bias is None and b.attn_k_bias is None and b.attn_v_bias is None and b.attn_output_b is None
    assert b.ffn_up_b.shape == (96,) and b.ffn_down_b.shape == (64,)


def hf_gptj_rope(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """HF modeling_gptj's rule, restated: create_sinusoidal_positions, rotate_every_two, apply_rotary_pos_emb on the
    first rotary_dim dims of each head, x (T, H, Dh)."""
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64) / rotary_dim))
    ang = pos.float()[:, None] * inv                                   # (T, rotary_dim/2)
    sin = torch.repeat_interleave(ang.sin()[:, None, :], 2, -1)
    cos = torch.repeat_interleave(ang.cos()[:, None, :], 2, -1)
    xr, xp = x[..., :rotary_dim], x[..., rotary_dim:]
    rot = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    return torch.cat((xr * cos + rot * sin, xp), dim=-1)


def test_rope_is_hf_rotate_every_two_on_the_first_rotary_dim():
    """The file's rope config through minfer's rope op equals HF GPT-J's rotation, positions 0..199; the NEOX
    pairing or a whole-head rotation does not."""
    from minfer.ops.reference import rope

    cfg = engine(NAME).config.rope
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, 16, generator=g)
    pos = torch.arange(200)
    want = hf_gptj_rope(x, pos, 8)
    assert torch.allclose(rope(x, pos, cfg), want, atol=2e-5)
    assert torch.equal(rope(x, pos, cfg)[..., 8:], x[..., 8:])          # dims past rotary_dim untouched
    assert not torch.allclose(rope(x, pos, replace(cfg, style="neox")), want, atol=1e-2)
    assert not torch.allclose(rope(x, pos, replace(cfg, n_rot=16)), want, atol=1e-2)


@pytest.mark.parametrize("what", ["halves_rotated", "full_rotation", "no_rope", "sequential", "no_output_bias",
                                  "no_norm_bias", "no_ffn_bias", "gelu_erf"])
def test_each_rule_is_needed(monkeypatch, what):
    import torch.nn.functional as F

    from minfer import ops
    from minfer.models import phi2

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "halves_rotated":                 # NEOX instead of NORM (adjacent pairs)
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))      # (this engine's own cfg)
    elif what == "full_rotation":                # every dim of the head rotated, not rotary_dim's 8
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "no_rope":                      # the rotation matters at all
        monkeypatch.setattr(ops, "rope", lambda x, positions, cfg: x)
    elif what == "sequential":                   # the MLP after the attention's residual add, on its own LayerNorm
        def forward(tokens, step, cache, ctx=None):
            eps, act = m.cfg.rms_eps, m.act_dtype
            x = ops.embedding(tokens, m.token_embd)
            for i, blk in enumerate(m.blocks):
                x = x + m.attention(phi2.layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache,
                                    step, ctx).float()
                x = x + m.mlp(phi2.layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, ctx).float()
            h = phi2.layer_norm(step.rows(x), m.output_norm, m.output_norm_b, eps, act)
            return ops.linear(h, m.output, m.output_b, ctx, out_dtype=torch.float32)
        monkeypatch.setattr(m, "forward", forward)
    elif what == "no_output_bias":               # the lm head's bias
        monkeypatch.setattr(m, "output_b", torch.zeros_like(m.output_b))
    elif what == "no_norm_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_norm_b", torch.zeros_like(b.attn_norm_b))
    elif what == "no_ffn_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_up_b", torch.zeros_like(b.ffn_up_b))
    else:                                        # GELU without the tanh approximation
        monkeypatch.setattr(phi2.Starcoder2Model, "mlp", lambda self, h, blk, ctx: phi2.ops.linear(
            F.gelu(phi2.ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx).float()).to(h.dtype), blk.ffn_down,
            blk.ffn_down_b, ctx))
    err = miss(eng)
    assert err > (100 * BASE_ERR if what == "gelu_erf" else 10 * TOL), (what, err)


def fused_file(tmp_path):
    """The fixture with each layer's q/k/v as one attn_qkv (rows q, k, v): gguf-py's GPTJ tensor list names it."""
    import gguf

    rd = gguf.GGUFReader(str(DATA / "gptj.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    drop, add = [], {}
    for i in range(2):
        p = f"blk.{i}."
        drop += [p + f"attn_{x}.weight" for x in "qkv"]
        add[p + "attn_qkv.weight"] = np.concatenate([t[p + f"attn_{x}.weight"] for x in "qkv"])
    return rewrite(DATA / "gptj.gguf", tmp_path / "fused.gguf", drop_tensors=tuple(drop), add_tensors=add)


def test_fused_qkv_equals_separate(tmp_path):
    from minfer.runtime.engine import Engine

    eng = Engine.load(fused_file(tmp_path), ctx=64, progress=False, switches=reference_switches())
    assert eng.model.blocks[0].attn_qkv is not None and eng.model.blocks[0].attn_q is None
    assert miss(eng) < 10 * BASE_ERR
    r = ref(NAME)
    ids = r["ids"].tolist()
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in ((0, 7), (7, 8), (8, len(ids)))])
    assert rel_err(got, r["logits"]) < TOL


@pytest.mark.parametrize("key", ["gptj.attention.layer_norm_epsilon", "gptj.block_count",
                                 "gptj.feed_forward_length", "gptj.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "gptj.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["output.weight", "output.bias", "output_norm.bias", "blk.1.attn_norm.bias",
                                    "blk.1.ffn_up.bias", "blk.0.ffn_down.bias", "blk.1.attn_k.weight",
                                    "blk.0.attn_output.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "gptj.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
