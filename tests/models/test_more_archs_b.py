"""Architectures added after the first set, part two (part one: test_more_archs.py, whose helpers
and batch-engine list these share): each rule of each, shown to be needed on its fixture
(tests/data/arch: tiny random HF models converted by llama.cpp's converter; the logits and greedy
checks are in test_arch_vs_transformers.py), and their bad inputs named.

arcee: Arcee AFM-4.5B (an ungated squared-ReLU MLP, YaRN).
apertus: Swiss AI Apertus (per-layer xIELU, q/k norms before NEOX rope).
dots1: rednote dots.llm1 (Qwen3 attention, DeepSeek-V3 MoE: sigmoid, groups, bias, scale, shared experts).
hunyuan-moe: Hunyuan-A13B (hunyuan-dense attention, a renormalized softmax MoE plus a shared expert).
minimax-m2: MiniMax-M2 (whole-projection q/k norms, partial NEOX rope, a biased sigmoid MoE).
lfm2moe: LFM2-8B-A1B (lfm2's conv / attention layers, a biased sigmoid MoE past a dense lead).
llama4: Llama 4 text (chunked attention, NoPE layers with temperature, a top-1 sigmoid MoE on its input).
mamba2: pure Mamba-2 (the hybrids' mixer in every layer, no attention, no MLP)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite
from models.test_more_archs import logits_err


# ---- arcee ----------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["relu", "plain_rope", "no_yarn_factor", "neox"])
def test_arcee_each_rule_is_needed(monkeypatch, what):
    """The squared ReLU (not plain ReLU), YaRN's per-frequency divisors, its cos/sin factor (q * c^2) and
    NORM rope: with any one changed the logits miss transformers' by far."""
    import math

    import torch

    import minfer.models.arcee as arcee

    eng = engine("arcee")
    m = eng.model
    assert logits_err(eng, "arcee") < TOL and abs(m.q_scale - (1 + 0.1 * math.log(20.0)) ** 2) < 1e-6
    if what == "relu":
        monkeypatch.setattr(arcee, "relu2", torch.relu)
    elif what == "plain_rope":
        m.rope = m.cfg.rope
    elif what == "no_yarn_factor":
        m.q_scale = 1.0
    else:
        m.rope = replace(m.rope, style="neox")
    assert logits_err(eng, "arcee") > 10 * TOL


def test_arcee_without_yarn_runs_plain_rope(tmp_path):
    """A file without rope.scaling keys (no YaRN): the file's own rope, q unscaled."""
    keys = ("type", "factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow")
    p = rewrite(DATA / "arcee.gguf", tmp_path / "a.gguf", drop_keys=tuple(f"arcee.rope.scaling.{k}" for k in keys))
    m = load(p)
    assert m.rope is m.cfg.rope and m.rope.freq_factors is None and m.q_scale == 1.0


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.ffn_up.weight",)), "blk.1.ffn_up.weight"),
    (dict(add_tensors={"blk.0.ffn_gate.weight": [[0.0] * 64] * 96}), "blk.0.ffn_gate.weight"),
    (dict(add_tensors={"blk.1.attn_output.bias": [0.0] * 64}), "blk.1.attn_output.bias"),
    (dict(add_tensors={"blk.0.attn_q.bias": [0.0] * 64}), "blk.0.attn_q.bias"),
])
def test_arcee_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "arcee.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- apertus --------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["raw_alphas", "no_negative_branch", "layer0_everywhere", "no_qk_norm",
                                  "norm_after_rope", "adjacent_pairs", "no_rope_factors"])
def test_apertus_each_rule_is_needed(monkeypatch, what):
    """xIELU with softplus on the file's raw alpha_p / alpha_n (ggml_xielu), its negative branch, each layer's
    own parameters, the per-head q/k norms before rope, NEOX and the Llama-3 factors: with any one changed
    the logits miss transformers' by far."""
    import minfer.models.layers as layers
    from minfer.models.hunyuan_dense import rope_then_norm_heads

    eng = engine("apertus")
    m = eng.model
    assert logits_err(eng, "apertus") < TOL
    p = list(m.xielu)
    if what == "raw_alphas":
        md = load_meta("apertus")
        m.xielu = [(an, ap, b, e) for an, ap, b, e in zip(md["xielu.alpha_n"], md["xielu.alpha_p"], md["xielu.beta"],
                                                           md["xielu.eps"])]
    elif what == "no_negative_branch":
        m.xielu = [(0.0, ap, b, e) for _, ap, b, e in p]
    elif what == "layer0_everywhere":
        assert p[0] != p[1]
        m.xielu = [p[0]] * len(p)
    elif what == "no_qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", None)
            monkeypatch.setattr(b, "attn_k_norm", None)
    elif what == "norm_after_rope":
        monkeypatch.setattr(layers, "attention_heads", rope_then_norm_heads)
    elif what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, freq_factors=None))
    assert logits_err(eng, "apertus") > 10 * TOL


def load_meta(name: str) -> dict:
    from minfer.gguf_file import GGUFFile

    return GGUFFile(DATA / f"{name}.gguf").metadata


def test_apertus_scalar_xielu_keys_stand_for_every_layer(tmp_path):
    """A file with single numbers for the xielu.* keys (llama.cpp get_key_or_arr): every layer gets them."""
    md = load_meta("apertus")
    f32 = gguf.GGUFValueType.FLOAT32
    p = rewrite(DATA / "apertus.gguf", tmp_path / "a.gguf",
                set_keys={f"xielu.{k}": (float(md[f"xielu.{k}"][0]), f32) for k in ("alpha_n", "alpha_p", "beta", "eps")})
    m = load(p)
    assert len(m.xielu) == 2 and m.xielu[0] == m.xielu[1] and abs(m.xielu[0][2] - md["xielu.beta"][0]) < 1e-6


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("xielu.beta",)), "xielu.beta"),
    (dict(set_keys={"xielu.alpha_p": ([1.0], gguf.GGUFValueType.ARRAY)}), "xielu.alpha_p"),
    (dict(drop_tensors=("blk.1.attn_k_norm.weight",)), "blk.1.attn_k_norm.weight"),
    (dict(add_tensors={"blk.0.attn_output.bias": [0.0] * 64}), "blk.0.attn_output.bias"),
    (dict(add_tensors={"blk.1.attn_q_norm.bias": [0.0] * 16}), "blk.1.attn_q_norm.bias"),
    (dict(add_tensors={"blk.0.ffn_gate.weight": [[0.0] * 64] * 96}), "blk.0.ffn_gate.weight"),
])
def test_apertus_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "apertus.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- dots1 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["one_group", "no_select_bias", "softmax", "not_renormalized", "unscaled",
                                  "no_shared_expert", "moe_on_layer0"])
def test_dots1_each_rule_is_needed(monkeypatch, what):
    """The 2 groups (best 1 eligible), the selection bias, sigmoid scores, the renormalized weights, the
    routed scale 2.5, the shared expert and the leading dense layer: with any one changed the logits miss
    transformers' by far."""
    eng = engine("dots1")
    m = eng.model
    c = m.cfg
    assert logits_err(eng, "dots1") < TOL
    assert (c.expert_groups, c.expert_groups_used, c.expert_gating, c.expert_weights_scale) == (2, 1, "sigmoid", 2.5)
    moe = [e for e in m.moe if e is not None]
    if what == "one_group":
        monkeypatch.setattr(m, "cfg", replace(c, expert_groups=1, expert_groups_used=1))
    elif what == "no_select_bias":
        for e in moe:
            monkeypatch.setattr(e, "exp_probs_b", None)
    elif what == "softmax":
        monkeypatch.setattr(m, "cfg", replace(c, expert_gating="softmax"))
    elif what == "not_renormalized":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "unscaled":
        monkeypatch.setattr(m, "cfg", replace(c, expert_weights_scale=1.0))
    elif what == "no_shared_expert":
        for e in moe:
            monkeypatch.setattr(e, "gate_shexp", None)
    else:                                  # layer 0's dense MLP replaced by layer 1's MoE
        monkeypatch.setattr(m, "moe", [moe[0]] + m.moe[1:])
    assert logits_err(eng, "dots1") > 10 * TOL


def test_dots1_without_select_bias_loads(tmp_path):
    """exp_probs_b.bias is optional (dots1.cpp: TENSOR_NOT_REQUIRED): without it the choice is on the scores."""
    p = rewrite(DATA / "dots1.gguf", tmp_path / "a.gguf", drop_tensors=("blk.1.exp_probs_b.bias", "blk.2.exp_probs_b.bias"))
    m = load(p)
    assert all(e.exp_probs_b is None for e in m.moe if e is not None)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.attn_q_norm.weight",)), "blk.1.attn_q_norm.weight"),
    (dict(drop_tensors=("blk.2.attn_k_norm.weight",)), "blk.2.attn_k_norm.weight"),
    (dict(drop_tensors=("blk.0.ffn_norm.weight",)), "blk.0.ffn_norm.weight"),
    (dict(drop_tensors=("blk.1.ffn_up_shexp.weight",)), "blk.1.ffn_up_shexp.weight"),
    (dict(drop_keys=("dots1.expert_shared_count",)), "dots1.expert_shared_count"),
    (dict(set_keys={"dots1.expert_shared_count": (0, gguf.GGUFValueType.UINT32)}), "dots1.expert_shared_count"),
    (dict(set_keys={"dots1.expert_gating_func": (3, gguf.GGUFValueType.UINT32)}), "dots1.expert_gating_func"),
])
def test_dots1_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "dots1.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- hunyuan-moe ----------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["norm_before_rope", "not_renormalized", "no_shared_expert", "adjacent_pairs"])
def test_hunyuan_moe_each_rule_is_needed(monkeypatch, what):
    """The per-head q/k norms after rope (not qwen3's order), the renormalized top-k weights, the shared
    expert and NEOX rope: with any one changed the logits miss transformers' by far."""
    import torch

    import minfer.models.hunyuan_dense as hd
    from minfer.models.layers import attention_heads

    eng = engine("hunyuan-moe")
    m = eng.model
    assert logits_err(eng, "hunyuan-moe") < TOL and m.weights_norm
    if what == "norm_before_rope":
        monkeypatch.setattr(hd, "rope_then_norm_heads", attention_heads)   # norms, then rope (qwen3)
    elif what == "not_renormalized":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "no_shared_expert":
        monkeypatch.setattr(m, "shared_expert", lambda h, e, ctx: torch.zeros_like(h))
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    assert logits_err(eng, "hunyuan-moe") > 10 * TOL


def test_hunyuan_moe_weights_norm_key_is_not_read(tmp_path):
    """llama.cpp's graph renormalizes whatever the file says (build_moe_ffn(..., true, ...))."""
    p = rewrite(DATA / "hunyuan-moe.gguf", tmp_path / "a.gguf",
                set_keys={"hunyuan-moe.expert_weights_norm": (False, gguf.GGUFValueType.BOOL)})
    assert load(p).weights_norm is True


@pytest.mark.parametrize("kw,match", [
    (dict(add_tensors={"blk.0.attn_output.bias": [0.0] * 64}), "blk.0.attn_output.bias"),
    (dict(drop_tensors=("blk.1.attn_k_norm.weight",)), "blk.1.attn_k_norm.weight"),
    (dict(drop_tensors=("blk.0.ffn_up_shexp.weight",)), "blk.0.ffn_up_shexp.weight"),
    (dict(drop_keys=("hunyuan-moe.expert_shared_feed_forward_length",)), "hunyuan-moe.expert_shared_feed_forward_length"),
    (dict(set_keys={"hunyuan-moe.expert_feed_forward_length": (16, gguf.GGUFValueType.UINT32)}),
     "hunyuan-moe.expert_feed_forward_length"),
    (dict(set_keys={"hunyuan-moe.expert_gating_func": (2, gguf.GGUFValueType.UINT32)}), "hunyuan-moe.expert_gating_func"),
])
def test_hunyuan_moe_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "hunyuan-moe.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- minimax-m2 -----------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["softmax", "no_select_bias", "not_renormalized", "full_rotation", "adjacent_pairs"])
def test_minimax_m2_each_rule_is_needed(monkeypatch, what):
    """Sigmoid scores, the selection bias, the renormalized weights, rope on the first 8 of 16 dims and NEOX:
    with any one changed the logits miss transformers' by far."""
    eng = engine("minimax-m2")
    m = eng.model
    c = m.cfg
    assert logits_err(eng, "minimax-m2") < TOL and c.expert_gating == "sigmoid" and c.rope.n_rot == 8
    if what == "softmax":
        monkeypatch.setattr(m, "cfg", replace(c, expert_gating="softmax"))
    elif what == "no_select_bias":
        for e in m.moe:
            monkeypatch.setattr(e, "exp_probs_b", None)
    elif what == "not_renormalized":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "full_rotation":
        monkeypatch.setattr(m, "cfg", replace(c, rope=replace(c.rope, n_rot=16)))
    else:
        monkeypatch.setattr(m, "cfg", replace(c, rope=replace(c.rope, style="normal")))
    assert logits_err(eng, "minimax-m2") > 10 * TOL


def test_minimax_m2_without_gating_key_is_sigmoid(tmp_path):
    """No expert_gating_func: sigmoid (HF's only scoring; llama.cpp has no default for minimax-m2)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    p = rewrite(DATA / "minimax-m2.gguf", tmp_path / "a.gguf", drop_keys=("minimax-m2.expert_gating_func",))
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert eng.model.cfg.expert_gating == "sigmoid" and logits_err(eng, "minimax-m2") < TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "blk.1.exp_probs_b.bias"),
    (dict(drop_tensors=("blk.0.attn_q_norm.weight",)), "blk.0.attn_q_norm.weight"),
    (dict(add_tensors={"blk.1.attn_output.bias": [0.0] * 64}), "blk.1.attn_output.bias"),
    (dict(set_keys={"minimax-m2.expert_feed_forward_length": (16, gguf.GGUFValueType.UINT32)}),
     "minimax-m2.expert_feed_forward_length"),
    (dict(set_keys={"minimax-m2.expert_gating_func": (3, gguf.GGUFValueType.UINT32)}), "minimax-m2.expert_gating_func"),
])
def test_minimax_m2_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "minimax-m2.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- lfm2moe --------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["softmax", "no_select_bias", "not_renormalized", "moe_on_layer0"])
def test_lfm2moe_each_rule_is_needed(monkeypatch, what):
    """Sigmoid scores, the selection bias (choice only), the renormalized weights and the leading dense
    layer: with any one changed the logits miss transformers' by far."""
    eng = engine("lfm2moe")
    m = eng.model
    c = m.cfg
    assert logits_err(eng, "lfm2moe") < TOL
    assert (c.expert_gating, c.leading_dense_blocks, m.weights_norm) == ("sigmoid", 1, True)
    moe = [e for e in m.moe if e is not None]
    if what == "softmax":
        monkeypatch.setattr(m, "cfg", replace(c, expert_gating="softmax"))
    elif what == "no_select_bias":
        for e in moe:
            monkeypatch.setattr(e, "exp_probs_b", None)
    elif what == "not_renormalized":
        monkeypatch.setattr(m, "weights_norm", False)
    else:                                  # layer 0's dense MLP replaced by layer 1's MoE
        monkeypatch.setattr(m, "moe", [moe[0]] + m.moe[1:])
    assert logits_err(eng, "lfm2moe") > 10 * TOL


def test_lfm2moe_layer_kinds():
    """Conv layers where head_count_kv is 0 (0 and 2), attention on 1 and 3; a dense FFN on layer 0 only
    (leading_dense_block_count 1), no dense FFN tensors on the MoE layers."""
    m = engine("lfm2moe").model
    assert m.is_conv == (True, False, True, False)
    assert [e is None for e in m.moe] == [True, False, False, False]
    assert m.blocks[0].ffn_up is not None and all(b.ffn_up is None for b in m.blocks[1:])


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "blk.1.exp_probs_b.bias"),
    (dict(drop_tensors=("blk.2.ffn_gate_inp.weight",)), "blk.2.ffn_gate_inp.weight"),
    (dict(drop_tensors=("blk.0.ffn_up.weight",)), "blk.0.ffn_up.weight"),
    (dict(drop_tensors=("blk.3.attn_k_norm.weight",)), "blk.3.attn_k_norm.weight"),
    (dict(drop_keys=("lfm2moe.expert_gating_func",)), "lfm2moe.expert_gating_func"),
    (dict(drop_keys=("lfm2moe.expert_feed_forward_length",)), "lfm2moe.expert_feed_forward_length"),
    (dict(set_keys={"lfm2moe.expert_weights_scale": (2.5, gguf.GGUFValueType.FLOAT32)}),
     "lfm2moe.expert_weights_scale"),
    (dict(set_keys={"lfm2moe.expert_gating_func": (3, gguf.GGUFValueType.UINT32)}), "lfm2moe.expert_gating_func"),
])
def test_lfm2moe_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "lfm2moe.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


def test_lfm2moe_moe_layers_norm_is_not_deferred(monkeypatch):
    """A MoE layer's FFN norm is made whole before the router reads it: ops.linear_add_rms_norm without
    into_linear there (on CUDA a one-row decode would leave h to the next GEMV), with it on the dense layer."""
    from minfer import ops

    eng = engine("lfm2moe")
    seen = []
    real = ops.linear_add_rms_norm

    def spy(*a, **kw):
        if kw.get("role") == "ffn_norm":
            seen.append(kw.get("into_linear", False))
        return real(*a, **kw)

    monkeypatch.setattr(ops, "linear_add_rms_norm", spy)
    assert logits_err(eng, "lfm2moe") < TOL
    assert seen == [True, False, False, False]


# ---- llama4 ---------------------------------------------------------------------------------

def llama4_local():
    """The llama4 engine with chunk 8 and temperature floor 4 (llama.cpp's constants 8192, scaled down as
    the fixture's logits_local / greedy_local were made by transformers)."""
    eng = engine("llama4")
    m = eng.model
    assert (m.chunk, m.temp_floor, m.temp_scale) == (8192, 8192, 0.1)     # llama4.cpp's constants
    m.chunk, m.temp_floor = 8, 4
    return eng


def test_llama4_chunks_and_temperature_match_transformers():
    """With chunk 8 and floor 4: transformers' logits at every position (5 chunks of 8), in pieces that
    cross the chunk boundaries (the first query of a chunk sees one key), greedy identical (decode across
    chunks 1 and 2), and the host-free step (the masked torch path of a CUDA-graph decode) equal to the
    host-side one."""
    import numpy as np
    import torch

    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache
    from minfer.runtime.sampling import SamplingParams

    r = ref("llama4")
    eng = llama4_local()
    ids = r["ids"].tolist()
    assert rel_err(eng.logits(ids).numpy(), r["logits_local"]) < TOL
    assert rel_err(eng.logits(ids).numpy(), r["logits"]) > 10 * TOL        # the rules bite at this size
    cuts = [0, 1, 7, 9, 15, 16, 17, 23, 31, 33, len(ids)]
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(got, r["logits_local"]) < TOL
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                              max_new_tokens=len(r["greedy_local"]))]
    assert out == r["greedy_local"].tolist()
    m = eng.model
    cache = KVCache.for_config(m.cfg, 64)
    m.forward(torch.tensor(ids[:20]), Step.at(0, 20, "cpu"), cache)
    host = m.forward(torch.tensor(ids[20:21]), Step.at(20, 1, "cpu"), cache)
    free = m.forward(torch.tensor(ids[20:21]), Step(torch.tensor([20]), None, "all"), cache)
    assert float((host - free).abs().max()) < 1e-5


@pytest.mark.parametrize("what", ["no_chunks", "sliding_window", "no_temperature", "no_qk_norm", "rope_everywhere",
                                  "weight_after_experts", "no_shared_expert", "neox"])
def test_llama4_each_rule_is_needed(monkeypatch, what):
    """The chunked mask (not none, not a sliding window of the chunk's size), the NoPE layer's temperature, the
    weightless q/k norm on the rope layers, no rope on every 4th layer, the router's sigmoid on the experts'
    input, the shared expert and adjacent-pair rope: with any one changed the logits miss transformers' (chunk 8,
    floor 4) by far."""
    import torch

    from minfer import ops

    eng = llama4_local()
    m = eng.model
    assert logits_err_local(eng) < TOL
    if what == "no_chunks":
        m.chunk = 10 ** 6
    elif what == "sliding_window":
        monkeypatch.setattr(m, "attend_chunked", lambda cache, i, q, step, ctx: cache.attend(i, q, step, ctx, window=8))
    elif what == "no_temperature":
        m.temp_floor = 10 ** 6
    elif what == "no_qk_norm":
        m.kq_norm = False
    elif what == "rope_everywhere":
        m.use_rope = (True,) * len(m.use_rope)
    elif what == "weight_after_experts":
        def after(h, e, ctx):
            logits = h.float() @ e.gate_inp.float().t()
            s = torch.sigmoid(logits.max(-1, keepdim=True).values)
            routed = ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, 1, False, ctx,
                                 gating="topk_softmax")
            return routed * s + m.shared_expert(h, e, ctx)
        monkeypatch.setattr(m, "moe_ffn", after)
    elif what == "no_shared_expert":
        monkeypatch.setattr(m, "shared_expert", lambda h, e, ctx: torch.zeros_like(h))
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))   # (this engine's own cfg)
    assert logits_err_local(eng) > 10 * TOL


def logits_err_local(eng) -> float:
    r = ref("llama4")
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits_local"])


def test_llama4_layer_kinds_and_temperature():
    """Rope and chunks on layers 0-2, neither on layer 3 (every 4th); MoE on layers 1 and 3
    (interleave_moe_layer_step 2); the q/k norm (4 experts, not 128); the temperature formula at llama.cpp's
    floor 8192: 1 below position 8191, then log(floor((p + 1) / 8192) + 1) * 0.1 + 1 (HF log1p)."""
    import math

    import torch

    from minfer.models.llama4 import chunk_pieces, temperature

    m = engine("llama4").model
    assert m.use_rope == (True, True, True, False) and m.is_chunked == (True, True, True, False)
    assert [e is None for e in m.moe] == [True, False, True, False] and m.kq_norm
    assert m.moe[1].gate_shexp is not None and m.moe[1].exp_probs_b is None
    p = torch.tensor([0, 8190, 8191, 16382, 16383, 100000])
    want = [math.log1p(math.floor((x + 1) / 8192)) * 0.1 + 1 for x in p.tolist()]
    assert torch.allclose(temperature(p, 8192, 0.1), torch.tensor(want), atol=1e-6)
    assert temperature(p, 8192, 0.1)[:2].tolist() == [1.0, 1.0]
    assert chunk_pieces(5, 12, 8) == [(5, 8, 0), (8, 16, 8), (16, 17, 16)]


def test_llama4_batch_engine_serves_it():
    """The paged cache applies the chunked mask (attend(chunk=)): BatchEngine.from_engine (minfer serve's) runs
    two prompts at once (chunk 8) with the single-sequence greedy answers (tests/runtime/test_paged_chunked.py
    checks the paths, the kernel and the mask being needed)."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    eng = llama4_local()
    ids = ref("llama4")["ids"].tolist()
    prompts = [ids[:19], ids[7:20]]
    outs = BatchEngine.from_engine(eng, max_seqs=2).generate_many(prompts, SamplingParams(temperature=0), 6)
    for p, o in zip(prompts, outs):
        assert [ev.token_id for ev in o] == [ev.token_id for ev in eng.generate(p, SamplingParams(temperature=0),
                                                                                 max_new_tokens=6)]


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("llama4.interleave_moe_layer_step",)), "llama4.interleave_moe_layer_step"),
    (dict(drop_keys=("llama4.expert_feed_forward_length",)), "llama4.expert_feed_forward_length"),
    (dict(set_keys={"llama4.expert_used_count": (2, gguf.GGUFValueType.UINT32)}), "llama4.expert_used_count"),
    (dict(set_keys={"llama4.expert_weights_scale": (2.5, gguf.GGUFValueType.FLOAT32)}), "llama4.expert_weights_scale"),
    (dict(set_keys={"llama4.attention.sliding_window": (0, gguf.GGUFValueType.UINT32)}),
     "llama4.attention.sliding_window"),
    (dict(set_keys={"llama4.attention.sliding_window_pattern": (2, gguf.GGUFValueType.UINT32)}),
     "llama4.attention.sliding_window_pattern"),
    (dict(set_keys={"llama4.rope.freq_base_swa": (10000.0, gguf.GGUFValueType.FLOAT32)}), "llama4.rope.freq_base_swa"),
    (dict(drop_tensors=("blk.1.ffn_gate_shexp.weight",)), "blk.1.ffn_gate_shexp.weight"),
    (dict(drop_tensors=("blk.3.ffn_gate_inp.weight",)), "blk.3.ffn_gate_inp.weight"),
    (dict(drop_tensors=("blk.2.ffn_up.weight",)), "blk.2.ffn_up.weight"),
    (dict(add_tensors={"blk.0.attn_q.bias": [0.0] * 64}), "blk.0.attn_q.bias"),
    (dict(set_keys={"llama4.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}, drop_tensors=("rope_freqs.weight",)),
     "llama4.rope.dimension_count"),
])
def test_llama4_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "llama4.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- mamba2 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["one_norm_group", "no_conv_bias", "no_D", "tied_head"])
def test_mamba2_each_rule_is_needed(monkeypatch, what):
    """The mixer's norm over 2 groups (not the whole inner size), the conv bias (required here), the D skip and the
    untied head: with any one changed the logits miss transformers' by far."""
    import torch

    import minfer.models.mamba2 as mm

    eng = engine("mamba2")
    m = eng.model
    assert logits_err(eng, "mamba2") < TOL and m.dims.n_groups == 2
    if what == "one_norm_group":
        real = mm.gated_group_norm
        monkeypatch.setattr(mm, "gated_group_norm", lambda y, z, w, groups, eps: real(y, z, w, 1, eps))
    elif what == "no_conv_bias":
        for mb in m.mamba:
            monkeypatch.setattr(mb, "conv_b", None)
    elif what == "no_D":
        for mb in m.mamba:
            monkeypatch.setattr(mb, "D", torch.zeros_like(mb.D))
    else:
        monkeypatch.setattr(m, "output", m.token_embd)
    assert logits_err(eng, "mamba2") > 10 * TOL


def test_mamba2_cache_holds_state_only():
    """No K/V rows (every layer's kv_layers entry None: 0 bytes per position), each layer's conv ring (K,
    conv_dim) and SSM ring (2, H, P, N) as its state; the converter's head_count / feed_forward_length 0 read as no
    heads; the batch engine sizes its pool (KV blocks of no bytes, the state in slots: batched greedy in
    tests/runtime/test_paged_recurrent.py)."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.kv_cache import kv_bytes_per_position, state_bytes

    eng = engine("mamba2")
    c = eng.model.cfg
    assert (c.n_heads, c.n_kv_heads, c.ffn) == (0, 0, 0)
    assert c.kv_layers == (None, None, None) and c.state_layers == (((4, 192), (2, 8, 16, 16)),) * 3
    assert kv_bytes_per_position(c, 4) == 0 and state_bytes(c) == 3 * 4 * (4 * 192 + 2 * 8 * 16 * 16)
    be = BatchEngine.from_engine(eng, max_seqs=2)       # the default pool sizing: blocks of no bytes
    assert be.cache.states is not None and be.blocks.prefix_cache is False


@pytest.mark.parametrize("name,kw,match", [
    ("mamba2", dict(drop_tensors=("blk.1.ssm_conv1d.bias",)), "blk.1.ssm_conv1d.bias"),
    ("mamba2", dict(drop_tensors=("blk.2.ssm_norm.weight",)), "blk.2.ssm_norm.weight"),
    ("mamba2", dict(drop_keys=("mamba2.ssm.group_count",)), "mamba2.ssm.group_count"),
    ("mamba2", dict(set_keys={"mamba2.attention.head_count": (4, gguf.GGUFValueType.UINT32)}),
     "mamba2.attention.head_count"),
    # head_count 0 stays refused for an architecture with attention
    ("qwen3", dict(set_keys={"qwen3.attention.head_count": (0, gguf.GGUFValueType.UINT32)}), "qwen3.attention.head_count"),
])
def test_mamba2_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
