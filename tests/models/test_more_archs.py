"""Architectures added after the first set: each rule of each, shown to be needed on its fixture
(tests/data/arch: tiny random HF models converted by llama.cpp's converter; the logits and greedy
checks are in test_arch_vs_transformers.py), and their bad inputs named.

qwen2vl / qwen3vl: the language models of Qwen2(.5)-VL and Qwen3-VL, text input only.
olmoe: OLMoE (whole-projection q/k norms, a MoE whose weights are not renormalized).
starcoder2: StarCoder2 (LayerNorm with bias, biases everywhere, an ungated GELU-tanh MLP).
hunyuan-dense: Hunyuan dense (per-head q/k norms after rope, the NTK-alpha rope base).
qwen3vlmoe: the language model of Qwen3-VL-30B-A3B / 235B-A22B (Qwen3-MoE with text-only M-RoPE).
ernie4_5-moe: ERNIE 4.5 MoE (biased choice, renormalized weights, shared experts, interleaved dense layers).
arcee: Arcee AFM-4.5B (an ungated squared-ReLU MLP, YaRN).
apertus: Swiss AI Apertus (per-layer xIELU, q/k norms before NEOX rope).
dots1: rednote dots.llm1 (Qwen3 attention, DeepSeek-V3 MoE: sigmoid, groups, bias, scale, shared experts).
hunyuan-moe: Hunyuan-A13B (hunyuan-dense attention, a renormalized softmax MoE plus a shared expert).
minimax-m2: MiniMax-M2 (whole-projection q/k norms, partial NEOX rope, a biased sigmoid MoE).
lfm2moe: LFM2-8B-A1B (lfm2's conv / attention layers, a biased sigmoid MoE past a dense lead).
llama4: Llama 4 text (chunked attention, NoPE layers with temperature, a top-1 sigmoid MoE on its input).
mamba2: pure Mamba-2 (the hybrids' mixer in every layer, no attention, no MLP).
exaone: EXAONE 3.0 / 3.5 (Llama under LG's names: NEOX rope, Llama-3 rope factors)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest

from minfer.errors import MinferError
from models.arch_checks import drop_bias_group
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def logits_err(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


@pytest.mark.parametrize("name", ["qwen2vl", "qwen3vl", "olmoe", "starcoder2", "hunyuan-dense", "qwen3vlmoe",
                                  "arcee", "apertus", "dots1", "hunyuan-moe", "minimax-m2",
                                  "ernie4_5-moe", "ernie4_5-moe-step2", "exaone"])
def test_batch_engine_greedy_matches_transformers(name):
    """Through the batch engine's paged cache next to a second sequence (test_arch_vs_transformers'
    check on these fixtures)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers(name)


# ---- qwen2vl / qwen3vl ----------------------------------------------------------------------

def test_mrope_text_positions_are_plain_neox():
    """Which rotary pairs llama.cpp turns by the t/h/w positions (the token's position for text)
    rather than the 4th (0 for text): all of them for Qwen2(.5)-VL's sections (16, 24, 24) and the
    fixtures'; for Qwen3-VL's interleaved (24, 20, 20) all but pairs 61 and 62, which HF rotates
    by the position too (models/qwen3vl.py: minfer follows HF there)."""
    from minfer.models.qwen2vl import text_position_pairs

    assert all(text_position_pairs([16, 24, 24, 0], 64, interleaved=False))
    assert all(text_position_pairs([2, 3, 3, 0], 8, interleaved=False))      # the qwen2vl fixture
    assert all(text_position_pairs([6, 5, 5, 0], 16, interleaved=True))      # the qwen3vl fixture
    q3 = text_position_pairs([24, 20, 20, 0], 64, interleaved=True)
    assert [j for j, r in enumerate(q3) if not r] == [61, 62]
    assert text_position_pairs([2, 3, 2, 1], 8, interleaved=False)[-1] is False   # a 4th section


@pytest.mark.parametrize("name,what", [("qwen2vl", "adjacent_pairs"), ("qwen2vl", "no_qkv_bias"),
                                       ("qwen3vl", "adjacent_pairs"), ("qwen3vl", "no_qk_norm")])
def test_qwen_vl_each_rule_is_needed(name, what):
    """M-RoPE on text is NEOX (halves), not adjacent pairs; qwen2vl's q/k/v biases; qwen3vl's
    per-head q/k norms: with any one changed the logits miss transformers' by far."""
    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL
    if what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    elif what == "no_qkv_bias":
        for b in m.blocks:
            b.attn_q_bias = b.attn_k_bias = b.attn_v_bias = None
    else:
        for b in m.blocks:
            b.attn_q_norm = b.attn_k_norm = None
    assert logits_err(eng, name) > 10 * TOL


def test_qwen_vl_reads_sections_and_deepstack():
    m2, m3 = engine("qwen2vl").model, engine("qwen3vl").model
    assert m2.rope_sections == (2, 3, 3, 0) and m3.rope_sections == (6, 5, 5, 0)
    assert m3.n_deepstack_layers == 2 and m2.cfg.rope.style == m3.cfg.rope.style == "neox"


@pytest.mark.parametrize("name,kw,match", [
    ("qwen2vl", dict(drop_keys=("qwen2vl.rope.dimension_sections",)), "qwen2vl.rope.dimension_sections"),
    ("qwen3vl", dict(drop_keys=("qwen3vl.rope.dimension_sections",)), "qwen3vl.rope.dimension_sections"),
    ("qwen2vl", dict(drop_tensors=("blk.1.attn_v.bias",)), "blk.1.attn_v.bias"),
    ("qwen3vl", dict(drop_tensors=("blk.0.attn_q_norm.weight",)), "blk.0.attn_q_norm.weight"),
])
def test_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("name", ["qwen2vl", "qwen3vl"])
def test_mrope_fourth_section_is_refused(tmp_path, name):
    """A 4th section's pairs take a position only image input sets (0 for text in llama.cpp, no
    counterpart in HF): refused, not run as NEOX."""
    secs = [2, 3, 2, 1] if name == "qwen2vl" else [6, 5, 4, 1]
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf",
                set_keys={f"{name}.rope.dimension_sections": (secs, gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match="4th section"):
        load(p)


def test_mmproj_file_is_named(tmp_path):
    """A vision projector file (general.architecture clip) gets a message saying what it is."""
    p = rewrite(DATA / "qwen2vl.gguf", tmp_path / "mmproj.gguf", arch="clip")
    with pytest.raises(MinferError, match="architecture 'clip' is not supported.*mmproj"):
        load(p)


# ---- olmoe ----------------------------------------------------------------------------------

def per_head_qk_norm(m):
    """OLMoE's attention with the q/k norms applied per head (the qwen3 reading) instead of over the
    whole projection: each head RMS-normalized, then scaled by its slice of the (H*Dh,) weight."""
    import torch

    from minfer import ops
    from minfer.models.layers import merge_heads, rope_write_attend

    c = m.cfg

    def norm(x, w, heads):
        T = x.shape[0]
        y = ops.rms_norm(x.reshape(T * heads, c.head_dim), torch.ones(c.head_dim), c.rms_eps)
        return (y.reshape(T, -1) * w).view(T, heads, c.head_dim)

    def attention(h, blk, i, cache, step, ctx):
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k = norm(q, blk.attn_q_norm, c.n_heads), norm(k, blk.attn_k_norm, c.n_kv_heads)
        o = rope_write_attend(cache, i, q, k, v.view(h.shape[0], c.n_kv_heads, c.head_dim), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    return attention


@pytest.mark.parametrize("what", ["per_head_qk_norm", "renormalized", "adjacent_pairs"])
def test_olmoe_each_rule_is_needed(what):
    """The q/k norms over the whole projection (not per head), the top-k weights left as they
    are (not renormalized) and NEOX rope: with any one changed the logits miss transformers'."""
    eng = engine("olmoe")
    m = eng.model
    assert logits_err(eng, "olmoe") < TOL and m.weights_norm is False
    if what == "per_head_qk_norm":
        m.attention = per_head_qk_norm(m)
    elif what == "renormalized":
        m.weights_norm = True
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    assert logits_err(eng, "olmoe") > 10 * TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.attn_k_norm.weight",)), "blk.1.attn_k_norm.weight"),
    (dict(drop_keys=("olmoe.expert_used_count",)), "olmoe.expert_used_count"),
    (dict(set_keys={"olmoe.expert_weights_scale": (2.5, gguf.GGUFValueType.FLOAT32)}), "olmoe.expert_weights_scale"),
])
def test_olmoe_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "olmoe.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- starcoder2 -----------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["qkv_bias", "output_bias", "mlp_biases", "norm_biases", "gelu_erf",
                                  "adjacent_pairs"])
def test_starcoder2_each_rule_is_needed(monkeypatch, what):
    """Each group of biases, the LayerNorms' biases, GELU's tanh form (not erf) and NEOX rope: with
    any one changed the logits miss transformers' by far. GELU's two forms differ by < 1e-3 of a
    value, so erf's miss is below the 1e-3 logits tolerance here (2.6e-4): it is held to 100x the
    tanh form's error (1.1e-6) instead."""
    import types

    import torch

    import minfer.models.starcoder2 as sc2

    eng = engine("starcoder2")
    m = eng.model
    base = logits_err(eng, "starcoder2")
    assert base < TOL and m.window == 0
    drop_bias_group(m, what)
    if what == "gelu_erf":
        monkeypatch.setattr(sc2, "F", types.SimpleNamespace(gelu=lambda x, approximate: torch.nn.functional.gelu(x)))
    if what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    err = logits_err(eng, "starcoder2")
    assert err > 100 * base if what == "gelu_erf" else err > 10 * TOL


def test_starcoder2_window_from_the_file(tmp_path):
    """A file with starcoder2.attention.sliding_window attends the last W keys on every layer: with 8,
    transformers' logits of the same weights with sliding_window 8 (the fixture's logits_window8)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    r = ref("starcoder2")
    p = rewrite(DATA / "starcoder2.gguf", tmp_path / "w.gguf",
                set_keys={"starcoder2.attention.sliding_window": (8, gguf.GGUFValueType.UINT32)})
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert eng.model.window == 8
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got, r["logits_window8"]) < TOL and rel_err(got, r["logits"]) > 10 * TOL


@pytest.mark.parametrize("tensor", ["blk.0.attn_norm.bias", "blk.1.attn_output.bias", "blk.0.ffn_up.bias",
                                    "output_norm.bias", "blk.1.attn_k.bias"])
def test_starcoder2_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "starcoder2.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


# ---- hunyuan-dense --------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["norm_before_rope", "no_qk_norm", "unscaled_base", "adjacent_pairs"])
def test_hunyuan_dense_each_rule_is_needed(monkeypatch, what):
    """The per-head q/k norms after rope (not before it, qwen3's order, and not left out), the base
    the converter scaled by alpha^(Dh/(Dh-2)) (not the config's rope_theta 10000) and NEOX rope:
    with any one changed the logits miss transformers' by far."""
    import minfer.models.hunyuan_dense as hd
    from minfer.models.layers import attention_heads

    eng = engine("hunyuan-dense")
    m = eng.model
    assert logits_err(eng, "hunyuan-dense") < TOL and m.cfg.rope.theta > 2e7
    if what == "norm_before_rope":
        monkeypatch.setattr(hd, "rope_then_norm_heads", attention_heads)   # norms, then rope (qwen3)
    elif what == "no_qk_norm":
        monkeypatch.setattr(hd, "head_norm", lambda x, w, eps: x)
    elif what == "unscaled_base":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, theta=10000.0))   # (this engine's own cfg)
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))
    assert logits_err(eng, "hunyuan-dense") > 10 * TOL


def test_hunyuan_dense_alpha_key_scales_the_base(tmp_path):
    """A file with the unscaled base and `rope.scaling.alpha` (HunyuanVL's converter's form) gets
    llama.cpp's load_arch_hparams rule, base * alpha^(Dh/(Dh-2)): transformers' logits again."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    r = ref("hunyuan-dense")
    p = rewrite(DATA / "hunyuan-dense.gguf", tmp_path / "a.gguf",
                set_keys={"hunyuan-dense.rope.freq_base": (10000.0, gguf.GGUFValueType.FLOAT32),
                          "hunyuan-dense.rope.scaling.alpha": (1000.0, gguf.GGUFValueType.FLOAT32)})
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert abs(eng.model.cfg.rope.theta / (10000.0 * 1000.0 ** (16 / 14)) - 1) < 1e-6
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) < TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.attn_q_norm.weight",)), "blk.1.attn_q_norm.weight"),
    (dict(add_tensors={"blk.0.attn_output.bias": [0.0] * 64}), "blk.0.attn_output.bias"),
    (dict(add_tensors={"blk.1.attn_k.bias": [0.0] * 32}), "blk.1.attn_k.bias"),
])
def test_hunyuan_dense_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "hunyuan-dense.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- qwen3vlmoe -----------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["adjacent_pairs", "no_qk_norm", "not_renormalized"])
def test_qwen3vlmoe_each_rule_is_needed(what):
    """Interleaved M-RoPE on text is NEOX (halves), the per-head q/k norms, and the top-k weights
    renormalized (qwen3vlmoe.cpp build_moe_ffn norm_w = true; HF Qwen3VLMoeTextTopKRouter divides
    by their sum): with any one changed the logits miss transformers' by far."""
    eng = engine("qwen3vlmoe")
    m = eng.model
    assert logits_err(eng, "qwen3vlmoe") < TOL and m.weights_norm is True
    if what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    elif what == "no_qk_norm":
        for b in m.blocks:
            b.attn_q_norm = b.attn_k_norm = None
    else:
        m.weights_norm = False
    assert logits_err(eng, "qwen3vlmoe") > 10 * TOL


def test_qwen3vlmoe_reads_sections_and_deepstack():
    m = engine("qwen3vlmoe").model
    assert m.rope_sections == (6, 5, 5, 0) and m.n_deepstack_layers == 2 and m.cfg.rope.style == "neox"
    assert (m.cfg.n_experts, m.cfg.n_experts_used, m.cfg.expert_ffn) == (8, 2, 24)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("qwen3vlmoe.rope.dimension_sections",)), "qwen3vlmoe.rope.dimension_sections"),
    (dict(set_keys={"qwen3vlmoe.rope.dimension_sections": ([6, 5, 4, 1], gguf.GGUFValueType.ARRAY)}), "4th section"),
    (dict(drop_keys=("qwen3vlmoe.expert_feed_forward_length",)), "qwen3vlmoe.expert_feed_forward_length"),
    (dict(drop_tensors=("blk.1.ffn_up_exps.weight",)), "blk.1.ffn_up_exps.weight"),
    (dict(drop_tensors=("blk.0.attn_k_norm.weight",)), "blk.0.attn_k_norm.weight"),
])
def test_qwen3vlmoe_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "qwen3vlmoe.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- ernie4_5-moe ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,what", [("ernie4_5-moe", "no_select_bias"), ("ernie4_5-moe", "not_renormalized"),
                                       ("ernie4_5-moe", "no_shared_experts"), ("ernie4_5-moe", "neox"),
                                       ("ernie4_5-moe-step2", "no_select_bias"), ("ernie4_5-moe-step2", "biased_weights")])
def test_ernie4_5_moe_each_rule_is_needed(monkeypatch, name, what):
    """The selection bias (choice only: weights from the unbiased probabilities), the renormalized
    top-k weights, the shared experts and adjacent-pair rope: with any one changed the logits miss
    transformers' by far."""
    import torch

    from minfer.ops import reference

    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL and m.weights_norm is True
    moe = [e for e in m.moe if e is not None]
    if what == "no_select_bias":
        for e in moe:
            e.exp_probs_b = None
    elif what == "not_renormalized":
        m.weights_norm = False
    elif what == "no_shared_experts":
        assert all(e.gate_shexp is not None for e in moe)
        for e in moe:
            e.gate_shexp = None
    elif what == "biased_weights":         # the weights read from p + b instead of p
        route = reference.route

        def biased(h, router, k, norm, router_bias=None, gating="softmax", select_bias=None, *a):
            w, idx = route(h, router, k, norm, router_bias, gating, select_bias, *a)
            if select_bias is not None:
                w = (torch.softmax(h.float() @ router.float().t(), -1) + select_bias.float()).gather(1, idx)
                w = w / w.sum(-1, keepdim=True)
            return w, idx

        monkeypatch.setattr(reference, "route", biased)
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))    # (this engine's own cfg)
    assert logits_err(eng, name) > 10 * TOL


def test_ernie4_5_moe_layer_kinds():
    """Dense where l < leading_dense_block_count or (l + 1) % interleave_moe_layer_step != 0 (the graph's
    is_moe_layer, HF's start index and interval): the fixtures' and the released configs'."""
    from minfer.models.ernie4_5_moe import is_moe_layer

    assert [e is None for e in engine("ernie4_5-moe").model.moe] == [True, False, False]
    m2 = engine("ernie4_5-moe-step2").model
    assert [e is None for e in m2.moe] == [True, False, True, False] and m2.moe_step == 2
    assert [is_moe_layer(i, 1, 1) for i in range(28)] == [False] + [True] * 27      # ERNIE-4.5-21B-A3B
    assert [is_moe_layer(i, 3, 1) for i in range(54)] == [False] * 3 + [True] * 51  # ERNIE-4.5-300B-A47B


@pytest.mark.parametrize("name,kw,match", [
    ("ernie4_5-moe", dict(drop_keys=("ernie4_5-moe.interleave_moe_layer_step",)), "ernie4_5-moe.interleave_moe_layer_step"),
    ("ernie4_5-moe", dict(set_keys={"ernie4_5-moe.interleave_moe_layer_step": (0, gguf.GGUFValueType.UINT32)}),
     "ernie4_5-moe.interleave_moe_layer_step"),
    ("ernie4_5-moe", dict(drop_keys=("ernie4_5-moe.expert_shared_feed_forward_length",)), "blk.1.ffn_\\w+_shexp.weight"),
    ("ernie4_5-moe", dict(drop_tensors=("blk.2.ffn_gate_exps.weight",)), "blk.2.ffn_gate_exps.weight"),
    ("ernie4_5-moe", dict(add_tensors={"blk.0.attn_output.bias": [0.0] * 64}), "blk.0.attn_output.bias"),
    # llama.cpp's loader rule (MoE tensors in every layer past the leading ones) on the step-2 file
    ("ernie4_5-moe-step2", dict(set_keys={"ernie4_5-moe.interleave_moe_layer_step": (1, gguf.GGUFValueType.UINT32)}),
     "blk.2.ffn_gate_inp.weight"),
])
def test_ernie4_5_moe_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


# ---- exaone ---------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["adjacent_pairs", "no_rope_factors"])
def test_exaone_each_rule_is_needed(what):
    """NEOX rope (halves, not adjacent pairs) and EXAONE 3.5's Llama-3 frequency divisors
    (rope_freqs.weight): with either changed the logits miss transformers' by far."""
    eng = engine("exaone")
    m = eng.model
    assert logits_err(eng, "exaone") < TOL
    assert m.cfg.rope.freq_factors is not None and {1.0, 8.0} <= set(m.cfg.rope.freq_factors)
    if what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, freq_factors=None))
    assert logits_err(eng, "exaone") > 10 * TOL


@pytest.mark.parametrize("kw,match", [
    (dict(add_tensors={"blk.0.attn_q.bias": [0.0] * 64}), "blk.0.attn_q.bias"),
    (dict(add_tensors={"blk.1.attn_output.bias": [0.0] * 64}), "blk.1.attn_output.bias"),
    (dict(set_keys={"exaone.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}, drop_tensors=("rope_freqs.weight",)),
     "rope.dimension_count 8"),
    (dict(drop_tensors=("blk.1.ffn_gate.weight",)), "blk.1.ffn_gate.weight"),
])
def test_exaone_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "exaone.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
