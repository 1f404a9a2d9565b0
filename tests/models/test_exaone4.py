"""LG EXAONE 4.0 (minfer/models/exaone4.py) against transformers, on the CPU's float32 reference:
the logits at every position, the greedy continuation, the KV cache in pieces across the window and
through the batch engine's paged cache; each rule of the graph needed (with one changed the logits
miss by more than 10x the tolerance); what the model does not run refused by name. Fixture:
tests/data/arch/exaone4.gguf (tools/gen_arch_fixtures.py: transformers' Exaone4ForCausalLM, layers
0-2 sliding with window 8 < the 40-token sequence, layer 3 global without rope, Llama-3 rope scaling,
converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite, reference_switches

NAME = "exaone4"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def load_engine(path):
    from minfer.runtime.engine import Engine

    return Engine.load(path, ctx=64, progress=False, switches=reference_switches())


def test_layer_pattern_from_the_file():
    """HF layer_types (the "LLLG" of sliding_window_pattern 4): three window layers with rope, then a
    global one without; the window and the Llama-3 divisors (rope_freqs.weight) read from the GGUF."""
    m = engine(NAME).model
    hf = json.loads((DATA / "exaone4.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (True, True, True, False)
    assert m.use_rope == m.is_local and m.window == hf["sliding_window"] == 8
    assert m.cfg.rope.style == "neox" and m.cfg.rope.freq_factors is not None
    assert m.cfg.rope.freq_factors[0] == 1.0 and m.cfg.rope.freq_factors[-1] == 8.0


@pytest.mark.parametrize("what", ["window", "rope_on_global_layer", "rope_factors", "adjacent_pairs", "qk_norm",
                                  "qk_norm_whole_projection", "post_attention_norm", "post_ffw_norm", "pre_norms"])
def test_each_rule_is_needed(monkeypatch, what):
    from minfer import ops
    from minfer.models import exaone4
    from minfer.models.layers import ffn_branch

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "rope_on_global_layer":
        monkeypatch.setattr(m, "use_rope", (True,) * m.cfg.n_layers)
    elif what == "rope_factors":                  # the plain rope of freq_base
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, freq_factors=None))   # (this engine's own cfg)
    elif what == "adjacent_pairs":                # NORM instead of NEOX
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))
    elif what == "qk_norm":
        monkeypatch.setattr(exaone4, "head_norm", lambda x, w, eps: x)
    elif what == "qk_norm_whole_projection":      # olmo2's reading: one RMS over all heads, then the weight per head
        def whole(x, w, eps):
            T, H, Dh = x.shape
            return ops.rms_norm(x.reshape(T, H * Dh), torch.ones(H * Dh), eps).view(T, H, Dh) * w
        monkeypatch.setattr(exaone4, "head_norm", whole)
    elif what in ("post_attention_norm", "post_ffw_norm"):   # that post-norm skipped
        real = ops.rms_norm
        skip = {id(b.attn_norm if what == "post_attention_norm" else b.ffn_norm) for b in m.blocks}
        monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps, *a: x if id(w) in skip else real(x, w, eps, *a))
    else:                                         # the same norms as pre-norms (the llama order)
        def forward(self, tokens, step, cache, ctx=None):
            eps = self.cfg.rms_eps
            x = ops.embedding(tokens, self.token_embd)
            for i, blk in enumerate(self.blocks):
                x = x + self._attention(ops.rms_norm(x, blk.attn_norm, eps), blk, i, cache, step, ctx)
                x = x + ffn_branch(ops.rms_norm(x, blk.ffn_norm, eps), blk, ctx)
            return ops.linear(ops.rms_norm(step.rows(x), self.output_norm, eps), self.output)
        monkeypatch.setattr(exaone4.Exaone4Model, "forward", forward)
    assert miss(eng) > 10 * TOL


def test_file_without_window_rotates_every_layer(tmp_path):
    """Without attention.sliding_window (the 1.2B's files; not a 64-layer file) every layer is global
    and rotates (exaone4.cpp: use_rope when swa_type is NONE; HF: sliding_window None)."""
    m = load_engine(rewrite(DATA / "exaone4.gguf", tmp_path / "x.gguf",
                            drop_keys=("exaone4.attention.sliding_window",))).model
    assert m.window == 0 and m.use_rope == (True,) * 4 and m.is_local == (False,) * 4


def test_window_without_local_layers_is_refused(tmp_path):
    key = "exaone4.attention.sliding_window_pattern"
    p = rewrite(DATA / "exaone4.gguf", tmp_path / "x.gguf",
                set_keys={key: ([False] * 4, gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["exaone4.attention.layer_norm_rms_epsilon", "exaone4.block_count",
                                 "exaone4.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "exaone4.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.2.post_ffw_norm.weight", "blk.0.post_attention_norm.weight",
                                    "blk.3.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.3.ffn_up.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "exaone4.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)
