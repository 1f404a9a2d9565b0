"""Orion (minfer/models/orion.py, GGUF arch `orion`) on the CPU's float32 reference, against two references that
minfer made neither of: a torch forward of the HF checkpoint written from the architecture (tools/gen_orion_fixture.py
reference(): LayerNorms with bias, rotate_half rope on the unpermuted rows), and llama.cpp's own logits
(llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache). transformers 5.25 has no Orion class (remote code
only), so this file runs the model's own checks: its layout, each rule of the graph needed (with one changed the logits
miss both references by more than 10x the tolerance), the optional q/k/v biases (a file with them against both
references' logits of that case), the loader's refusals.

Fixture: tests/data/arch/orion.{gguf,npz,json} (tools/gen_orion_fixture.py build + goldens): hidden 32, 4 heads of 8
over 2 kv heads, FFN 64, 2 layers, vocab 320, no rope.freq_base key (llama.cpp's default 1e4), an untied lm_head,
converted by llama.cpp's convert_hf_to_gguf.py (conversion/orion.py OrionModel).

The checks every llama.cpp-checked decoder shares (logits against both references at every position, greedy, the
cache in pieces, the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this
fixture; the CUDA backend's code through Triton's interpreter in tests/ops/test_arch_forward_interpreted.py."""

from __future__ import annotations

import re
from dataclasses import replace

import gguf
import numpy as np
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "orion"
BASE_ERR = 5e-6      # the fixture's float32 misses: see test_logits_match_both_references


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.gguf_file import GGUFFile
    from minfer.models.orion import OrionModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is OrionModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (8, 4, 2, 32, 64, 320, 2)
    assert c.rope.style == "neox" and c.rope.n_rot == 8 and c.rope.theta == 1e4 and c.rope.freq_factors is None
    assert f"{NAME}.rope.freq_base" not in GGUFFile(DATA / f"{NAME}.gguf").metadata     # the converter writes none
    assert abs(c.rms_eps - 1e-5) < 1e-9              # attention.layer_norm_epsilon (HF rms_norm_eps)
    assert not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]
    assert tuple(b.attn_q.shape) == (32, 32) and tuple(b.attn_k.shape) == (16, 32)
    assert b.attn_q_bias is None and b.attn_q_norm is None
    assert tuple(b.attn_norm_b.shape) == (32,) and tuple(b.ffn_norm_b.shape) == (32,)
    assert all(blk.ffn_norm is not None for blk in m.blocks)      # sequential on every layer
    assert tuple(m.output_norm_b.shape) == (32,)


def test_logits_match_both_references():
    """At every position (the shared checks in test_llamacpp_decoders.py do the same; measured here)."""
    r = ref(NAME)
    got = engine(NAME).logits(r["ids"].tolist()).numpy()
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR          # the two references agree (1.2e-6)
    assert rel_err(got, r["logits"]) < BASE_ERR                     # 2.0e-6
    assert rel_err(got, r["lc_logits"]) < BASE_ERR                  # 2.4e-6
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 6          # not a degenerate continuation


@pytest.mark.parametrize("what", ["normal_rope", "base", "rms_norm", "attn_norm_bias", "ffn_norm_bias",
                                  "output_norm_bias", "parallel"])
def test_each_rule_is_needed(monkeypatch, what):
    """NEOX rope on the unpermuted rows (not NORM's adjacent pairs), the default rope base 1e4 (the file has no
    freq_base), LayerNorm's mean removal (not RMSNorm), each LayerNorm's bias (attention, MLP, output), the
    sequential MLP on its own norm of x + attn (not stablelm's parallel residual)."""
    from minfer import ops

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "normal_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="normal"))     # (this engine's own cfg)
    elif what == "base":
        object.__setattr__(c, "rope", replace(c.rope, theta=1e6))
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x.float(), w, eps)
                            .to(out_dtype or x.dtype))
    elif what == "output_norm_bias":
        monkeypatch.setattr(m, "output_norm_b", m.output_norm_b * 0)
    for blk in m.blocks:
        if what == "attn_norm_bias":
            monkeypatch.setattr(blk, "attn_norm_b", blk.attn_norm_b * 0)
        elif what == "ffn_norm_bias":
            monkeypatch.setattr(blk, "ffn_norm_b", None)
        elif what == "parallel":
            monkeypatch.setattr(blk, "ffn_norm", None)
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def _qkv_bias_tensors(r) -> dict:
    H, KV, Dh = 4, 2, 8
    out = {}
    for i, row in enumerate(r["qkv_bias"]):
        q, k, v = row[:H * Dh], row[H * Dh:(H + KV) * Dh], row[(H + KV) * Dh:]
        out |= {f"blk.{i}.attn_q.bias": q, f"blk.{i}.attn_k.bias": k, f"blk.{i}.attn_v.bias": v}
    return out


def test_qkv_biases_are_optional(tmp_path):
    """A file with blk.N.attn_{q,k,v}.bias (create_tensor_qkv: TENSOR_NOT_REQUIRED; the releases have none) runs with
    them: both references' logits of that case (llama.cpp ran the same biases added to its F32 copy)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    r = ref(NAME)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "qkvb.gguf", add_tensors=_qkv_bias_tensors(r))
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert tuple(eng.model.blocks[1].attn_v_bias.shape) == (16,)
    nb = len(r["logits_qkvb"])
    got = eng.logits(r["ids"][:nb].tolist()).numpy()
    assert rel_err(r["lc_logits_qkvb"], r["logits_qkvb"]) < BASE_ERR       # 8.4e-7
    assert rel_err(got, r["logits_qkvb"]) < BASE_ERR and rel_err(got, r["lc_logits_qkvb"]) < BASE_ERR
    assert rel_err(got, r["logits"][:nb]) > 10 * TOL                       # the biases did matter
    for blk in eng.model.blocks:                                            # and the v bias alone
        blk.attn_v_bias = None
    assert rel_err(eng.logits(r["ids"][:nb].tolist()).numpy(), r["lc_logits_qkvb"]) > 10 * TOL


@pytest.mark.parametrize("tensor", ["blk.1.attn_output.bias", "blk.0.ffn_up.bias", "blk.1.ffn_down.bias",
                                    "blk.0.attn_qkv.weight", "blk.1.attn_q_norm.weight", "rope_freqs.weight"])
def test_tensors_the_loader_does_not_create_are_refused(tmp_path, tensor):
    """llama.cpp's orion loader creates none of these (its graph adds no o / MLP bias, no q/k norm, no rope factors;
    the converter writes no fused attn_qkv): refused by name."""
    with pytest.raises(MinferError, match=re.escape(f"'{tensor}' is not supported for orion")):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", add_tensors={tensor: np.zeros(4)}))


@pytest.mark.parametrize("tensor", ["blk.1.ffn_norm.weight", "blk.0.ffn_norm.bias", "blk.1.attn_norm.bias",
                                    "output_norm.bias", "output.weight"])
def test_required_tensors_are_named(tmp_path, tensor):
    """Each LayerNorm's weight and bias and the untied head (load_arch_tensors: flag 0): a file without one is refused
    naming it (without ffn_norm stablelm's graph would run the parallel residual; orion's has none)."""
    with pytest.raises(MinferError, match=re.escape(f"'{tensor}' is missing")):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,)))


def test_partial_rope_refused(tmp_path):
    """orion.cpp asserts n_embd_head == n_rot."""
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "a.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (4, gguf.GGUFValueType.UINT32)}))
