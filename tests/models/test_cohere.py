"""Command-R and Cohere2 (minfer/models/command_r.py, cohere2.py) beyond the shared transformers
checks of test_arch_vs_transformers.py (logits, greedy, the KV cache in pieces): each rule of the
graph is needed to meet transformers' logits -- with one taken away (monkeypatched) they miss by
more than 10x the tolerance -- and what the models do not run is refused by name. Fixtures:
tests/data/arch/command-r*.gguf, cohere2.gguf (tools/gen_arch_fixtures.py: transformers'
CohereForCausalLM / Cohere2ForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_cohere2_layer_pattern_from_the_file():
    """Three window layers then a global one (llama.cpp load_swa_pattern(ml, 4); HF layer_types),
    rope on the window layers only, the fixture's window and logit scale read from the GGUF."""
    m = engine("cohere2").model
    hf = json.loads((DATA / "cohere2.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (True, True, True, False)
    assert m.use_rope == m.is_local
    assert m.window == hf["sliding_window"] == 8
    assert m.logit_scale == hf["logit_scale"] == 0.25
    c = engine("command-r").model
    assert c.use_rope == (True, True) and c.is_local == (False, False) and c.logit_scale == 0.5


def _sequential_forward(self, tokens, step, cache, ctx=None):
    """The llama order instead of the parallel block: x += attn(LN(x)); x += ffn(LN(x))."""
    from minfer import ops
    from minfer.models.layers import ffn_branch

    eps = self.cfg.rms_eps
    x = ops.embedding(tokens, self.token_embd)
    for i, blk in enumerate(self.blocks):
        x = x + self._attention(ops.layer_norm(x, blk.attn_norm, eps), blk, i, cache, step, ctx).float()
        x = x + ffn_branch(ops.layer_norm(x, blk.attn_norm, eps), blk, ctx).float()
    return ops.linear(ops.layer_norm(step.rows(x), self.output_norm, eps), self.output) * self.logit_scale


def _rms_instead_of_layer_norm(x, weight, eps, out_dtype=None):
    """RMSNorm (no mean subtracted) with the same weights, per-head weights included."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dim() == 2:
        y = (y.view(-1, *weight.shape) * weight).view(y.shape)
    else:
        y = y * weight
    return y.to(out_dtype or x.dtype)


@pytest.mark.parametrize("name,what", [
    ("command-r", "parallel_block"), ("command-r", "layer_norm"), ("command-r", "logit_scale"),
    ("command-r", "adjacent_pairs"), ("command-r-qknorm", "qk_norm"), ("command-r-qknorm", "qk_norm_per_head"),
    ("command-r-qknorm", "layer_norm"), ("cohere2", "parallel_block"), ("cohere2", "layer_norm"),
    ("cohere2", "logit_scale"), ("cohere2", "rope_on_global_layers"), ("cohere2", "window"),
    ("cohere2", "adjacent_pairs")])
def test_each_rule_is_needed(monkeypatch, name, what):
    from minfer import ops
    from minfer.models.command_r import CommandRModel

    eng = engine(name)
    m = eng.model
    assert miss(eng, name) < TOL
    if what == "parallel_block":
        monkeypatch.setattr(CommandRModel, "forward", _sequential_forward)
    elif what == "layer_norm":
        monkeypatch.setattr(ops, "layer_norm", _rms_instead_of_layer_norm)
    elif what == "logit_scale":
        monkeypatch.setattr(m, "logit_scale", 1.0)
    elif what == "adjacent_pairs":      # the halves rotated (NEOX) instead of adjacent pairs (NORM)
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))    # (this engine's own cfg)
    elif what == "qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", None)
            monkeypatch.setattr(b, "attn_k_norm", None)
    elif what == "qk_norm_per_head":    # every head with head 0's weight
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", b.attn_q_norm[:1].expand_as(b.attn_q_norm).contiguous())
            monkeypatch.setattr(b, "attn_k_norm", b.attn_k_norm[:1].expand_as(b.attn_k_norm).contiguous())
    elif what == "rope_on_global_layers":
        monkeypatch.setattr(m, "use_rope", (True,) * m.cfg.n_layers)
    elif what == "window":
        monkeypatch.setattr(m, "window", 0)
    assert miss(eng, name) > 10 * TOL


def test_qk_norm_weights_are_per_head():
    """Command-R+'s q/k LayerNorm weights: one (Dh,) row per head, ggml shape (Dh, H)."""
    m = engine("command-r-qknorm").model
    c = m.cfg
    assert m.blocks[0].attn_q_norm.shape == (c.n_heads, c.head_dim)
    assert m.blocks[0].attn_k_norm.shape == (c.n_kv_heads, c.head_dim)
    assert engine("command-r").model.blocks[0].attn_q_norm is None


def test_layer_norm_reference_is_ggml_norm():
    """ops.layer_norm on the CPU: centred, divided by sqrt(variance + eps) (the biased variance, as
    ggml_norm and HF CohereLayerNorm), times the weight; a (G, D) weight serves row r with row r % G.
    Checked against numpy written from the formula."""
    from minfer import ops

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g) * 3 + 1
    w = torch.randn(3, 16, generator=g)
    xn = x.double().numpy()
    c = xn - xn.mean(-1, keepdims=True)
    want = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
    got = ops.layer_norm(x, w, 1e-5).double().numpy()
    assert np.abs(got - want * np.tile(w.double().numpy(), (2, 1))).max() < 1e-5
    got1 = ops.layer_norm(x, w[0], 1e-5, torch.bfloat16)
    assert got1.dtype == torch.bfloat16
    assert np.abs(got1.double().numpy() - want * w[0].double().numpy()).max() < 3e-2


def test_absent_optional_logit_scale_is_not_applied(tmp_path):
    """command-r.logit_scale is optional in llama.cpp (get_key(..., false); applied only when
    nonzero): without it the logits are the unscaled ones, which the 0.5 fixture's times 2 are."""
    r = ref("command-r")
    p = rewrite(DATA / "command-r.gguf", tmp_path / "x.gguf", drop_keys=("command-r.logit_scale",))
    m = load(p)
    assert m.logit_scale == 1.0
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got * 0.5, r["logits"]) < TOL


@pytest.mark.parametrize("name,kw,match", [
    ("command-r", dict(add_tensors={"output.weight": np.zeros((320, 64))}), "output.weight"),
    ("command-r", dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64))}), "blk.0.attn_qkv.weight"),
    ("command-r", dict(set_keys={"command-r.logit_scale": (float("inf"), gguf.GGUFValueType.FLOAT32)}),
     "command-r.logit_scale"),
    ("cohere2", dict(set_keys={"cohere2.attention.sliding_window": (0, gguf.GGUFValueType.UINT32)}),
     "cohere2.attention.sliding_window"),
    ("cohere2", dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones((4, 16))}), "blk.0.attn_q_norm.weight"),
    ("cohere2", dict(set_keys={"cohere2.attention.layer_norm_epsilon": (-1.0, gguf.GGUFValueType.FLOAT32)}),
     "cohere2.attention.layer_norm_epsilon"),
])
def test_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("name", ["command-r-qknorm", "cohere2"])
def test_batch_engine_greedy_matches_transformers(name):
    """Through the batch engine's paged cache (blocks of 4: cohere2's window of 8 spans blocks) next
    to a second sequence (test_arch_vs_transformers' check, run on these fixtures)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers(name)


def test_command_r_plus_depth_requires_qk_norms(tmp_path):
    """llama.cpp loads attn_q_norm / attn_k_norm for command-r files of 64 layers or more
    (load_arch_tensors: `if (n_layer >= 64)`, required there): a 64-layer file without them is
    refused naming the tensor; with them it loads (a tiny synthetic file, random weights)."""
    rng = np.random.default_rng(0)
    D, H, Dh, F, V, L = 8, 2, 4, 8, 16, 64

    def write(path, qk_norm: bool):
        w = gguf.GGUFWriter(str(path), "command-r")
        for k, v in (("block_count", L), ("context_length", 32), ("embedding_length", D),
                     ("feed_forward_length", F), ("attention.head_count", H), ("attention.head_count_kv", H)):
            w.add_uint32(f"command-r.{k}", v)
        w.add_float32("command-r.attention.layer_norm_epsilon", 1e-5)
        w.add_float32("command-r.logit_scale", 0.0625)
        t = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
        for i in range(L):
            t.update({f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (H * Dh, D),
                      f"blk.{i}.attn_k.weight": (H * Dh, D), f"blk.{i}.attn_v.weight": (H * Dh, D),
                      f"blk.{i}.attn_output.weight": (D, H * Dh), f"blk.{i}.ffn_gate.weight": (F, D),
                      f"blk.{i}.ffn_up.weight": (F, D), f"blk.{i}.ffn_down.weight": (D, F)})
            if qk_norm:
                t.update({f"blk.{i}.attn_q_norm.weight": (H, Dh), f"blk.{i}.attn_k_norm.weight": (H, Dh)})
        for name, shape in t.items():
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    with pytest.raises(MinferError, match=r"blk\.0\.attn_q_norm\.weight"):
        load(write(tmp_path / "a.gguf", qk_norm=False))
    m = load(write(tmp_path / "b.gguf", qk_norm=True))
    assert m.blocks[63].attn_k_norm.shape == (H, Dh) and m.logit_scale == 0.0625


@pytest.mark.parametrize("name", ["command-r-qknorm", "cohere2"])
def test_output_rows_only_in_the_last_layer(name):
    """The last layer's MLP and adds run on the wanted rows only (command-r.cpp / cohere2.cpp:
    ggml_get_rows before the FFN): Step.logits 'last' and a row tensor (the padded prefill graph's)
    give the same rows as 'all'."""
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    m = engine(name).model
    toks = torch.tensor(ref(name)["ids"][:20])
    T = len(toks)

    def run(logits):
        return m.forward(toks, Step(torch.arange(T), 0, logits), KVCache.for_config(m.cfg, 32))

    full = run("all")
    assert torch.allclose(run("last"), full[-1:], atol=1e-5)
    assert torch.allclose(run(torch.tensor([4, T - 1])), full[[4, T - 1]], atol=1e-5)
