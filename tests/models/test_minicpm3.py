"""MiniCPM3 (minfer/models/minicpm3.py) on the CPU's float32 reference: the layout and the latent cache's
geometry read from the file, the LongRoPE factors chosen by the context, each MiniCPM3 rule needed (with one
changed the logits miss transformers' by more than 10x the tolerance), what the model needs refused by name.
The logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name
"minicpm3"). Fixture: tests/data/arch/minicpm3.gguf (tools/gen_arch_fixtures.py: transformers'
MiniCPM3ForCausalLM converted by llama.cpp's convert_hf_to_gguf.py); ids_long / logits_long: 48 tokens past
the original context of 32, where transformers takes the long factors."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "minicpm3"


def miss(eng, long: bool = False) -> float:
    r = ref(NAME)
    ids, want = ("ids_long", "logits_long") if long else ("ids", "logits")
    return rel_err(eng.logits(r[ids].tolist()).numpy(), r[want])


def test_layout_and_latent_cache_read_from_the_file():
    from minfer.commands.preflight import cache_config, kv_bytes_per_token
    from minfer.gguf_file import GGUFFile

    m = engine(NAME).model
    c = m.cfg
    assert m.dims == (4, 24, 8, 12, 16)                 # H, kv_lora_rank, rope dims, qk_nope, value dims (D / H)
    assert (c.n_kv_heads, c.head_dim, c.cache_v_in_k) == (1, 32, 24)  # one latent row of R + Dr, V its first R
    assert c.rope.style == "neox" and c.rope.n_rot == 8 and c.rope_long is not None
    assert c.rope.freq_factors != c.rope_long.freq_factors
    b = m.blocks[0]
    assert b.attn_q_a.shape == (32, 64) and b.attn_q_b.shape == (80, 32) and b.attn_k_b.shape == (4, 24, 12)
    assert b.attn_v_b.shape == (4, 16, 24) and b.attn_q is None and b.router is None
    assert m.scale_emb == 12.0 and m.scale_head == 4.0 and abs(m.scale_res - 1.4 / 3 ** 0.5) < 1e-12
    assert m.kq_scale == 1 / 20 ** 0.5
    pre = cache_config(GGUFFile(DATA / f"{NAME}.gguf"))   # the memory preflight counts the latent rows, K only
    assert kv_bytes_per_token(pre, "cpu") == 3 * 32 * 4


def test_long_factors_past_the_original_context():
    """ctx 64 > original 32: the long factors, transformers' for its 48-token reference; the short
    ones there miss, and so do the long ones on the 24-token reference inside the original context."""
    eng = engine(NAME, ctx=64)
    assert miss(eng, long=True) < TOL
    m = eng.model
    m.cfg = replace(m.cfg, rope_long=m.cfg.rope)
    assert miss(eng, long=True) > 10 * TOL
    eng = engine(NAME, ctx=32)
    assert miss(eng) < TOL
    eng.model.cfg = replace(eng.model.cfg, rope=eng.model.cfg.rope_long)
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("what", ["no_scale_emb", "no_scale_depth", "no_head_scale", "adjacent_pairs",
                                  "no_rope_factors", "kq_scale_of_the_latent_row", "values_first",
                                  "no_q_a_norm", "no_kv_a_norm"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if what == "no_scale_emb":
        m.scale_emb = 1.0
    elif what == "no_scale_depth":
        m.scale_res = 1.0
    elif what == "no_head_scale":
        m.scale_head = 1.0
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"), rope_long=replace(c.rope_long, style="normal"))
    elif what == "no_rope_factors":
        m.cfg = replace(c, rope=replace(c.rope, freq_factors=None))
    elif what == "kq_scale_of_the_latent_row":      # 1/sqrt(R + Dr), the cache row's size, not the key's
        m.kq_scale = 1 / 32 ** 0.5
    elif what == "values_first":    # attn_kv_b's rows per head read as Dv value rows, then Dn key rows
        H, R, Dr, Dn, Dv = m.dims
        for b in m.blocks:
            kv = torch.cat((b.attn_k_b.transpose(1, 2), b.attn_v_b), dim=1)          # (H, Dn + Dv, R)
            b.attn_v_b, b.attn_k_b = kv[:, :Dv].contiguous(), kv[:, Dv:].transpose(1, 2).contiguous()
    elif what == "no_q_a_norm":
        for b in m.blocks:
            b.attn_q_a_norm = torch.ones_like(b.attn_q_a_norm)
    else:
        for b in m.blocks:
            b.attn_kv_a_norm = torch.ones_like(b.attn_kv_a_norm)
    assert miss(eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor", ["blk.0.attn_kv_b.weight", "blk.1.attn_q_a_norm.weight", "blk.2.attn_kv_a_mqa.weight",
                                    "blk.1.attn_q_b.weight", "blk.2.ffn_gate.weight", "blk.0.attn_output.weight",
                                    "blk.0.attn_q_a.weight", "rope_factors_long.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", ["minicpm3.attention.q_lora_rank", "minicpm3.attention.kv_lora_rank",
                                 "minicpm3.attention.key_length", "minicpm3.rope.dimension_count"])
def test_missing_key_is_named(tmp_path, key):
    # without rope factors: with them a missing rope.dimension_count (n_rot: the key length) is refused first
    # by config.py, naming rope_factors_short.weight (4 values for n_rot 20)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,),
                drop_tensors=("rope_factors_short.weight", "rope_factors_long.weight"))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_value_length_other_than_the_tensors_refused(tmp_path):
    """attention.value_length 8 (not the D / H = 16 of the file's attn_kv_b rows): the tensor named."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"minicpm3.attention.value_length": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"blk\.0\.attn_kv_b\.weight"):
        load(p)


def test_rope_dims_of_the_whole_key_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"minicpm3.rope.dimension_count": (20, gguf.GGUFValueType.UINT32)},
                drop_tensors=("rope_factors_short.weight", "rope_factors_long.weight"))
    with pytest.raises(MinferError, match=r"key_length=20, rope\.dimension_count=20"):
        load(p)
