"""deepseek2 (DeepSeek-V2-Lite-like and V3-like fixtures) beyond the common checks of
test_arch_vs_transformers.py: each rule of minfer/models/deepseek2.py is needed (with one taken away
the logits miss transformers' by more than 10x the tolerance), the latent cache's layout, and the
files refused by name. Expected values: transformers' logits in tests/data/arch/deepseek{2,3}.npz.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def _roll_rope_first(w: torch.Tensor, heads: int, width: int, rope: int) -> torch.Tensor:
    """Rows of each head's (width) block rolled so that a reader taking the rope dims LAST gets what a
    reader taking them FIRST would: the wrong split of q (and of kv_a's [latent, rope] row)."""
    return torch.roll(w.view(heads, width, -1), rope, dims=1).reshape(heads * width, -1)


def _norm_skipped(monkeypatch, which):
    from minfer import ops

    real = ops.rms_norm
    monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps, *a: x if id(w) in which else real(x, w, eps, *a))


RULES = [
    ("deepseek3", "scale_of_cache_width"), ("deepseek3", "no_mscale"), ("deepseek2", "no_mscale"),
    ("deepseek3", "rope_split"), ("deepseek2", "rope_split"), ("deepseek3", "rope_neox"),
    ("deepseek3", "no_yarn_frequencies"), ("deepseek2", "no_yarn_frequencies"),
    ("deepseek3", "no_q_a_norm"), ("deepseek3", "no_kv_a_norm"), ("deepseek2", "no_kv_a_norm"),
    ("deepseek3", "softmax_gating"), ("deepseek2", "sigmoid_gating"), ("deepseek3", "no_selection_bias"),
    ("deepseek3", "no_groups"), ("deepseek3", "no_weights_scale"), ("deepseek3", "no_weights_norm"),
    ("deepseek3", "no_shared_experts"), ("deepseek2", "no_shared_experts"),
]


@pytest.mark.parametrize("name,rule", RULES)
def test_each_rule_is_needed(monkeypatch, name, rule):
    r = ref(name)
    eng = engine(name)
    m = eng.model
    H, R, Dr, Dn, Dv = m.dims
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) < TOL
    eng.reset()
    if rule == "scale_of_cache_width":              # 1/sqrt(R + Dr), the cache row's width
        m.kq_scale = 1 / math.sqrt(R + Dr)
    elif rule == "no_mscale":                       # 1/sqrt(Dn + Dr) without YaRN's mscale^2
        m.kq_scale = 1 / math.sqrt(Dn + Dr)
    elif rule == "rope_split":                      # rope dims taken first in q and in kv_a's output
        for b in m.blocks:
            qw = b.attn_q_b if b.attn_q_b is not None else b.attn_q
            monkeypatch.setattr(qw, "dense", _roll_rope_first(qw.dense, H, Dn + Dr, Dr))
            monkeypatch.setattr(b.attn_kv_a_mqa, "dense", _roll_rope_first(b.attn_kv_a_mqa.dense, 1, R + Dr, Dr))
    elif rule == "rope_neox":                       # halves rotated instead of adjacent pairs
        m.rope = replace(m.rope, style="neox")
    elif rule == "no_yarn_frequencies":
        m.rope = m.cfg.rope
    elif rule == "no_q_a_norm":
        assert m.blocks[0].attn_q_a_norm is not None
        _norm_skipped(monkeypatch, {id(b.attn_q_a_norm) for b in m.blocks})
    elif rule == "no_kv_a_norm":
        _norm_skipped(monkeypatch, {id(b.attn_kv_a_norm) for b in m.blocks})
    elif rule in ("softmax_gating", "sigmoid_gating"):
        assert m.gating == ("sigmoid" if rule == "softmax_gating" else "softmax")
        m.gating = "softmax" if rule == "softmax_gating" else "sigmoid"
    elif rule == "no_selection_bias":
        assert all(b.select_bias is not None for b in m.blocks[1:])
        for b in m.blocks:
            b.select_bias = None
    elif rule == "no_groups":
        assert (m.cfg.expert_groups, m.cfg.expert_groups_used) == (4, 2)
        object.__setattr__(m.cfg, "expert_groups", 1)      # (this engine's own cfg)
    elif rule == "no_weights_scale":
        assert m.cfg.expert_weights_scale == 2.5
        object.__setattr__(m.cfg, "expert_weights_scale", 1.0)
    elif rule == "no_weights_norm":
        assert m.weights_norm
        m.weights_norm = False
    elif rule == "no_shared_experts":
        for b in m.blocks:
            b.gate_shexp = None
    else:
        raise AssertionError(rule)
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got, r["logits"]) > 10 * TOL, f"{name} without {rule}: {rel_err(got, r['logits']):.2e}"


@pytest.mark.parametrize("name", ["deepseek2", "deepseek3"])
def test_latent_cache_layout(name):
    """One row of kv_lora + rope dims per token and layer (llama.cpp's MLA cache), V its first
    kv_lora dims as a view: nothing stored twice."""
    eng = engine(name)
    m, c = eng.model, eng.cache
    H, R, Dr, Dn, Dv = m.dims
    L = m.cfg.n_layers
    assert c.k.shape == (L, c.n_ctx, 1, R + Dr) and c.v.shape == (L, c.n_ctx, 1, R)
    assert c.v.data_ptr() == c.k.data_ptr()
    assert c.nbytes() == L * c.n_ctx * (R + Dr) * 4
    ids = ref(name)["ids"].tolist()[:6]
    eng.logits(ids)
    assert torch.equal(c.v[:, :6], c.k[:, :6, :, :R]) and c.k[:, :6].abs().sum() > 0


def test_fixture_keys_as_written():
    """The converter's keys the model reads (the V2-like file has no gating key: softmax default)."""
    m2, m3 = engine("deepseek2").model, engine("deepseek3").model
    assert m2.gating == "softmax" and m2.blocks[0].attn_q is not None and m2.blocks[1].select_bias is None
    assert m3.gating == "sigmoid" and m3.blocks[0].attn_q_a is not None
    assert m2.blocks[0].router is None and m2.blocks[1].router is not None     # one leading dense layer
    # V3's YaRN (factor 40, mscale_all_dim 1): cos/sin unscaled, scores times (1 + 0.1 ln 40)^2 / sqrt(32)
    assert m3.rope_scale == 1.0
    assert m3.kq_scale == pytest.approx((1 + 0.1 * math.log(40)) ** 2 / math.sqrt(32), rel=1e-6)
    assert m2.kq_scale == pytest.approx((1 + 0.0707 * math.log(40)) ** 2 / math.sqrt(24), rel=1e-6)


def test_batch_engine_takes_it_with_the_latent_cache_once():
    """The paged cache holds the latent rows as the contiguous one does (V a view of K's first
    kv_lora dims, runtime/paged_kv.py v_in_k): serve keeps the -np asked, with no warning, the
    batch engine takes the model and sizes its pool by K's bytes only (tests/runtime/test_paged_mla.py
    checks the batched greedy)."""
    from minfer.commands.serve import _one_at_a_time_if_unpaged
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.paged_kv import PagedKVCache

    said = []
    assert _one_at_a_time_if_unpaged(GGUFFile(DATA / "deepseek2.gguf"), 4, 4, said.append) == 4 and not said
    eng = engine("deepseek2")
    be = BatchEngine.from_engine(eng, max_seqs=2)
    H, R, Dr, Dn, Dv = eng.model.dims
    c, L = be.cache, eng.model.cfg.n_layers
    assert c.v_is_view() and c.v.data_ptr() == c.k.data_ptr() and c.v.shape[-1] == R
    assert PagedKVCache.bytes_per_block(eng.model.cfg, c.block_size) == L * c.block_size * (R + Dr) * 4
    assert c.nbytes() == c.n_blocks * PagedKVCache.bytes_per_block(eng.model.cfg, c.block_size)


def test_old_unsplit_file_is_refused(tmp_path):
    """A file from before the MLA split (attn_kv_b) is refused naming the tensor, not misread."""
    p = rewrite(DATA / "deepseek2.gguf", tmp_path / "x.gguf",
                add_tensors={"blk.0.attn_kv_b.weight": np.zeros((4 * 40, 32), dtype=np.float32)})
    with pytest.raises(MinferError, match=r"attn_kv_b"):
        load(p)


def test_temperature_tuning_is_refused(tmp_path):
    import gguf

    p = rewrite(DATA / "deepseek3.gguf", tmp_path / "x.gguf",
                set_keys={"deepseek2.attention.temperature_scale": (0.1, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match=r"deepseek2\.attention\.temperature_scale"):
        load(p)


@pytest.mark.parametrize("key", ["deepseek2.attention.kv_lora_rank", "deepseek2.attention.value_length_mla",
                                 "deepseek2.expert_shared_count", "deepseek2.attention.q_lora_rank"])
def test_missing_mla_key_is_named(tmp_path, key):
    name = "deepseek3" if "q_lora" in key else "deepseek2"
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("scale", [None, 0.37])
@pytest.mark.parametrize("T,start", [(1, 9), (4, 6), (5, 0)])
def test_reference_attention_narrow_values_and_scale(T, start, scale):
    """ops.attention with values narrower than the keys (the latent V) and a given scale, against
    softmax(scale q k^T, causal) v written out here (decode and prefill paths of the reference)."""
    from minfer import ops

    g = torch.Generator().manual_seed(T * 100 + start)
    H, Dk, Dv, S = 4, 12, 8, start + T
    q = torch.randn(T, H, Dk, generator=g)
    k = torch.randn(S + 3, 1, Dk, generator=g)
    v = k[..., :Dv]
    got = ops.attention(q, k, v, start, scale=scale)
    sc = scale if scale is not None else 1 / math.sqrt(Dk)
    s = torch.einsum("thd,sd->ths", q.double(), k[:S, 0].double()) * sc
    mask = torch.arange(S)[None, :] <= (start + torch.arange(T))[:, None]
    p = torch.softmax(s.masked_fill(~mask[:, None, :], float("-inf")), dim=-1)
    want = torch.einsum("ths,sd->thd", p, v[:S, 0].double())
    assert got.shape == (T, H, Dv)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_preflight_counts_the_latent_cache_once():
    """The memory preflight's bytes per position equal what the cache allocates a row (V is a view
    of K: counted once; it counted K and V apart, 1.9x)."""
    import torch

    from minfer.commands.preflight import kv_bytes_per_token
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache

    for name in ("deepseek2", "deepseek3"):
        cfg = ModelConfig.from_gguf(GGUFFile(DATA / f"{name}.gguf"))
        cache = KVCache.for_config(cfg, 16, dtype=torch.float32)
        assert cache.v_is_view()
        assert kv_bytes_per_token(cfg, "cpu") * 16 == cache.nbytes()
