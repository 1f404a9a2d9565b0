"""Cohere2 MoE (minfer/models/cohere2moe.py) on the CPU's float32 reference: the layout read from the file,
each rule of llama.cpp's graph needed (with one changed the logits miss transformers' by more than 10x the
tolerance), the MoE against a float64 formula, absent optional keys taking llama.cpp's values, what the model
cannot run refused by name. The logits, greedy continuation and KV cache in pieces are
test_arch_vs_transformers' (names "cohere2moe", "cohere2moe-ln"). Fixtures: tests/data/arch/cohere2moe*.gguf
(tools/gen_arch_fixtures.py: transformers 5.25's Cohere2MoeForCausalLM converted by llama.cpp's
convert_hf_to_gguf.py): "cohere2moe" RMSNorm, a dense prefix layer, sigmoid routing, a shared expert;
"cohere2moe-ln" LayerNorm, softmax routing, no shared expert, no dense prefix."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.models.cohere2moe import Cohere2MoeModel, swa_layers_dense_first
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAMES = ("cohere2moe", "cohere2moe-ln")
U32 = gguf.GGUFValueType.UINT32


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def miss_file(path, name: str) -> float:
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(path, ctx=64, progress=False, switches=reference_switches())
    return miss(eng, name)


def test_layout_read_from_the_file():
    m = engine("cohere2moe").model
    c = m.cfg
    assert (c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.n_layers) == (64, 4, 2, 16, 96, 4)
    hf = json.loads((DATA / "cohere2moe.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (False, True, False, True)
    assert m.use_rope == (True, True, False, True) and m.window == 8      # layer 0: the dense prefix's rope
    assert [e is None for e in m.moe] == [True, False, False, False]
    assert m.blocks[0].ffn_gate.shape == (96, 64) and m.blocks[1].ffn_gate is None
    assert (c.n_experts, c.n_experts_used, c.expert_ffn) == (8, 2, 32)
    assert m.gating == "sigmoid" and m.weights_norm and m.rms_norm and m.logit_scale == 0.5
    assert m.moe[1].gate_shexp.shape == (32, 64) and m.output is m.token_embd
    ln = engine("cohere2moe-ln").model
    assert ln.is_local == ln.use_rope == (True, True, True, False)
    assert ln.gating == "softmax" and not ln.rms_norm and all(e.gate_shexp is None for e in ln.moe)
    assert ln.cfg.ffn == 0                                 # no feed_forward_length in the file: no dense layer


def test_integer_pattern_takes_llamacpps_dense_first_rule(tmp_path):
    """An integer sliding_window_pattern P: l local when l % P != 0 (set_swa_pattern(P, dense_first = true)),
    not cohere2's l % P < P - 1; with P = 2 the fixture's layers are what its flags say, and the logits meet
    transformers'."""
    assert swa_layers_dense_first(5, 4) == (False, True, True, True, False)
    assert swa_layers_dense_first(4, 2) == (False, True, False, True)
    assert swa_layers_dense_first(3, 0) == (True, True, True)
    key = "cohere2moe.attention.sliding_window_pattern"
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "p2.gguf", set_keys={key: (2, U32)})
    assert miss_file(p, "cohere2moe") < TOL
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "p0.gguf", drop_keys=(key,))     # default 4: 0 global, 1-3 local
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    assert load_model(GGUFFile(p), progress=False).is_local == (False, True, True, True)


def _rms_instead(x, weight, eps, out_dtype=None):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight
    return y.to(out_dtype or x.dtype)


def _layer_instead(x, weight, eps):
    xf = x.float() - x.float().mean(-1, keepdim=True)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


@pytest.mark.parametrize("name,what", [
    ("cohere2moe", "no_prefix_rope"), ("cohere2moe", "rope_everywhere"), ("cohere2moe", "no_window"),
    ("cohere2moe", "shared_summed"), ("cohere2moe", "softmax_gating"), ("cohere2moe", "no_weights_norm"),
    ("cohere2moe", "layer_norm"), ("cohere2moe", "no_logit_scale"), ("cohere2moe", "sequential"),
    ("cohere2moe-ln", "sigmoid_gating"), ("cohere2moe-ln", "rms_norm"), ("cohere2moe-ln", "rope_everywhere"),
    ("cohere2moe-ln", "no_window")])
def test_each_rule_is_needed(monkeypatch, name, what):
    eng = engine(name)
    m = eng.model
    assert miss(eng, name) < TOL
    if what == "no_prefix_rope":         # rope only where the window is (cohere2's rule)
        monkeypatch.setattr(m, "use_rope", m.is_local)
    elif what == "rope_everywhere":
        monkeypatch.setattr(m, "use_rope", (True,) * m.cfg.n_layers)
    elif what == "no_window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "shared_summed":        # HF's "sum" strategy instead of the average
        monkeypatch.setattr(m, "shared_combine", 1.0)
    elif what == "softmax_gating":
        monkeypatch.setattr(m, "gating", "softmax")
    elif what == "sigmoid_gating":
        monkeypatch.setattr(m, "gating", "sigmoid")
    elif what == "no_weights_norm":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "layer_norm":           # the LayerNorm the file's RMS key replaces
        monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps, *a: ops.layer_norm(x, w, eps))
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", _rms_instead)
    elif what == "no_logit_scale":
        monkeypatch.setattr(m, "logit_scale", 1.0)
    elif what == "sequential":           # x + attn, then + ffn(norm(x + attn)) (a pre-norm block)
        def seq_forward(self, tokens, step, cache, ctx=None):
            x = ops.embedding(tokens, self.token_embd)
            for i, blk in enumerate(self.blocks):
                x = x + self._attention(self._norm(x, blk.attn_norm, torch.float32), blk, i, cache, step, ctx).float()
                x = x + self._ffn(self._norm(x, blk.attn_norm, torch.float32), blk, i, ctx).float()
            return ops.linear(self._norm(x, self.output_norm, torch.float32), self.output, None, ctx) * self.logit_scale
        monkeypatch.setattr(Cohere2MoeModel, "forward", seq_forward)
    assert miss(eng, name) > 10 * TOL, what


@pytest.mark.parametrize("name", NAMES)
def test_moe_in_float64(name):
    """build_moe_ffn(gating, norm_w) plus the averaged shared expert, in float64, against the layer's FFN."""
    m = engine(name).model
    i, c = 2, m.cfg
    e, E, F, D, K = m.moe[i], c.n_experts, c.expert_ffn, c.d_model, c.n_experts_used
    torch.manual_seed(3)
    h = torch.randn(7, D)
    logits = h.double() @ e.gate_inp.double().T                               # (T, E)
    p = torch.sigmoid(logits) if m.gating == "sigmoid" else torch.softmax(logits, -1)
    w, idx = p.topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True)                                           # both fixtures: expert_weights_norm
    gate, up = e.gate_exps.dense.double().view(E, F, D), e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    want = torch.zeros(7, D, dtype=torch.float64)
    for t in range(7):
        for k in range(K):
            x = idx[t, k]
            a = torch.nn.functional.silu(gate[x] @ h[t].double()) * (up[x] @ h[t].double())
            want[t] += w[t, k] * (down[x] @ a)
    if e.gate_shexp is not None:
        hs = h.double()
        s = (torch.nn.functional.silu(hs @ e.gate_shexp.dense.double().T) * (hs @ e.up_shexp.dense.double().T)) \
            @ e.down_shexp.dense.double().T
        want = (want + s) * 0.5
    got = m._ffn(h, m.blocks[i], i, None).double()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_absent_gating_key_is_sigmoid(tmp_path):
    """llama.cpp maps an absent expert_gating_func to sigmoid: the sigmoid fixture without the key still meets
    transformers', the softmax one then misses."""
    key = "cohere2moe.expert_gating_func"
    assert miss_file(rewrite(DATA / "cohere2moe.gguf", tmp_path / "s.gguf", drop_keys=(key,)), "cohere2moe") < TOL
    assert miss_file(rewrite(DATA / "cohere2moe-ln.gguf", tmp_path / "l.gguf", drop_keys=(key,)),
                     "cohere2moe-ln") > 10 * TOL


def test_absent_weights_norm_is_false(tmp_path):
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "x.gguf", drop_keys=("cohere2moe.expert_weights_norm",))
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    assert load_model(GGUFFile(p), progress=False).weights_norm is False


def test_untied_head_and_mtp_layers(tmp_path):
    """output.weight is taken when present (TENSOR_NOT_REQUIRED, unlike command-r / cohere2); NextN layers counted
    in block_count (nextn_predict_layers) are not run: the trunk's logits are unchanged."""
    emb = load(DATA / "cohere2moe.gguf").token_embd.dense.numpy()          # (V, D)
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "untied.gguf", add_tensors={"output.weight": emb * 2})
    m = load(p)
    assert m.output is not m.token_embd
    assert miss_file(p, "cohere2moe") > 10 * TOL            # the head doubled: the file's head is what runs
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "mtp.gguf",
                set_keys={"cohere2moe.block_count": (5, U32), "cohere2moe.nextn_predict_layers": (1, U32),
                          "cohere2moe.attention.sliding_window_pattern": (2, U32)})
    assert load(p).cfg.n_layers == 4 and miss_file(p, "cohere2moe") < TOL


@pytest.mark.parametrize("key", ["cohere2moe.logit_scale", "cohere2moe.attention.sliding_window",
                                 "cohere2moe.leading_dense_block_count", "cohere2moe.expert_feed_forward_length",
                                 "cohere2moe.expert_count", "cohere2moe.attention.layer_norm_epsilon",
                                 "cohere2moe.feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused("cohere2moe", tmp_path, dict(drop_keys=(key,)), key)


@pytest.mark.parametrize("tensor", ["blk.1.ffn_gate_exps.weight", "blk.0.ffn_up.weight",
                                    "blk.2.ffn_down_shexp.weight", "blk.3.ffn_gate_inp.weight",
                                    "blk.2.attn_v.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused("cohere2moe", tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("tensor,n", [("blk.1.attn_q_norm.weight", 16), ("blk.0.attn_q.bias", 64),
                                      ("blk.2.exp_probs_b.bias", 8), ("blk.1.attn_qkv.weight", 64)])
def test_unsupported_tensor_is_refused_by_name(tmp_path, tensor, n):
    assert_refused("cohere2moe", tmp_path, dict(add_tensors={tensor: np.zeros(n)}), tensor)


@pytest.mark.parametrize("key,value,match", [
    ("cohere2moe.expert_gating_func", 3, "expert_gating_func=3"),
    ("cohere2moe.attention.sliding_window", 0, "sliding_window"),
    ("cohere2moe.expert_used_count", 9, "expert_used_count=9"),
    ("cohere2moe.rope.dimension_count", 8, "rope.dimension_count=8")])
def test_bad_values_are_named(tmp_path, key, value, match):
    p = rewrite(DATA / "cohere2moe.gguf", tmp_path / "x.gguf", set_keys={key: (value, U32)})
    with pytest.raises(MinferError, match=match):
        load(p)
