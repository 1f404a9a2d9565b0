"""GLM-4.7-Flash (HF Glm4MoeLiteForCausalLM, which llama.cpp's converter writes as deepseek2:
minfer/models/deepseek2.py) and Solar Open (HF SolarOpenForCausalLM, written as glm4moe: minfer/models/glm4moe.py) on the CPU's float32 reference:
the layout read from the file, each rule the fixture exercises needed (with one changed the logits miss transformers'
by more than 10x the tolerance), what the model cannot run refused by name. The logits, greedy continuation, KV
cache in pieces and paged cache are test_arch_vs_transformers' (names "glm4moe-lite", "solar-open").
Fixtures: tests/data/arch/glm4moe-lite.gguf, solar-open.gguf (tools/gen_arch_fixtures.py, configs in
tools/arch_fixture_configs_c.py; converted by llama.cpp's convert_hf_to_gguf.py, conversion/glm.py
Glm4MoeLiteModel / SolarOpenModel)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from models.arch_checks import assert_refused, logits_miss, rewritten_engine
from models.test_arch_vs_transformers import DATA, TOL, engine

LITE, SOLAR = "glm4moe-lite", "solar-open"


# ---- GLM-4.7-Flash (deepseek2) -------------------------------------------------------------------------------

def test_glm47flash_layout_read_from_the_file():
    import gguf

    m = engine(LITE).model
    c = m.cfg
    assert m.arch == "deepseek2" and type(m).__name__ == "Deepseek2Model"
    # block_count 4 counts the NextN/MTP layer (num_nextn_predict_layers 1): the trunk is 3 layers (llama.cpp n_layer())
    rd = gguf.GGUFReader(str(DATA / f"{LITE}.gguf"))
    assert rd.fields["deepseek2.block_count"].contents() == 4 and c.n_layers == len(m.blocks) == 3
    assert m.dims == (4, 32, 8, 24, 32)          # H, kv_lora_rank, rope dims, qk_nope, v_head (!= qk_nope)
    assert (c.n_kv_heads, c.head_dim, c.cache_v_in_k) == (1, 40, 32)
    assert m.rope.style == "normal" and m.rope.n_rot == 8 and m.rope.theta == 1e6 and m.rope.freq_factors is None
    assert m.rope_scale == 1.0 and abs(m.kq_scale - 1 / math.sqrt(32)) < 1e-7     # no YaRN: 1/sqrt(qk_nope + rope)
    b0, b1 = m.blocks[0], m.blocks[1]
    assert b0.router is None and b0.ffn_gate.shape == (96, 64)          # first_k_dense_replace 1
    assert b1.attn_q_a.shape == (48, 64) and b1.attn_q is None and b1.select_bias is not None
    assert m.gating == "sigmoid" and m.weights_norm
    assert (c.expert_groups, c.expert_groups_used) == (1, 1) and abs(c.expert_weights_scale - 1.8) < 1e-6


@pytest.mark.parametrize("what", ["neox_pairs", "softmax_gating", "no_select_bias", "no_renorm", "no_weights_scale",
                                  "no_shared_expert"])
def test_glm47flash_each_rule_is_needed(what):
    eng = engine(LITE)
    m = eng.model
    assert logits_miss(LITE, eng) < TOL
    if what == "neox_pairs":             # HF rope_interleave: adjacent pairs (llama.cpp's deepseek2 NORM)
        m.rope = replace(m.rope, style="neox")
    elif what == "softmax_gating":       # HF Glm4MoeTopkRouter: sigmoid scores (expert_gating_func 2)
        m.gating = "softmax"
    elif what == "no_select_bias":       # e_score_correction_bias -> exp_probs_b.bias
        for b in m.blocks:
            b.select_bias = None
    elif what == "no_renorm":            # norm_topk_prob -> expert_weights_norm
        m.weights_norm = False
    elif what == "no_weights_scale":     # routed_scaling_factor 1.8 -> expert_weights_scale
        m.cfg = replace(m.cfg, expert_weights_scale=1.0)
    else:                                # n_shared_experts 1 -> ffn_*_shexp
        for b in m.blocks:
            b.gate_shexp = None
    assert logits_miss(LITE, eng) > 10 * TOL, what


def test_glm47flash_without_gating_key_is_softmax_as_llamacpp(tmp_path):
    """The released config.json has no scoring_func, so the converter writes no expert_gating_func; llama.cpp then
    takes sigmoid only for GLM-4.7-Flash's shape (47/48 layers, 154880 tokens) and softmax otherwise
    (deepseek2.cpp load_arch_hparams), and minfer does the same: the tiny fixture (which names the sigmoid its HF
    model runs, tools/arch_fixture_configs_c.py) would miss transformers without the key."""
    eng = rewritten_engine(LITE, tmp_path, drop_keys=("deepseek2.expert_gating_func",))
    assert eng.model.gating == "softmax"
    assert logits_miss(LITE, eng) > 10 * TOL


def test_glm47flash_residual_is_hf_latent_norm_eps():
    """HF's MLA builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps 1e-6 (modeling_glm4_moe_lite.py
    Glm4MoeLiteAttention, as DeepSeek-V3's), llama.cpp's deepseek2 graph uses the file's layer_norm_rms_epsilon
    (1e-5 for GLM-4.7-Flash; build_norm LLM_NORM_RMS) and the file carries no other: minfer follows llama.cpp.
    That eps is the whole of the fixture's 3e-5 residual: with 1e-6 on those two norms it drops under 1e-5."""
    from minfer import ops

    eng = engine(LITE)
    m = eng.model
    assert abs(m.cfg.rms_eps - 1e-5) < 1e-9
    as_llamacpp = logits_miss(LITE, eng)
    latent = {id(v) for b in m.blocks for v in (b.attn_q_a_norm, b.attn_kv_a_norm)}
    real = ops.rms_norm
    mp = pytest.MonkeyPatch()
    mp.setattr(ops, "rms_norm", lambda x, w, eps, *a: real(x, w, 1e-6 if id(w) in latent else eps, *a))
    try:
        as_hf = logits_miss(LITE, eng)
    finally:
        mp.undo()
    assert as_hf < 1e-5 < as_llamacpp < TOL


@pytest.mark.parametrize("tensor", ["blk.1.attn_q_a_norm.weight", "blk.2.ffn_gate_inp.weight",
                                    "blk.0.ffn_up.weight", "blk.2.ffn_gate_shexp.weight"])
def test_glm47flash_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(LITE, tmp_path, dict(drop_tensors=(tensor,)), tensor)


# ---- Solar Open (glm4moe) --------------------------------------------------------------------------------------

def test_solar_open_layout_read_from_the_file():
    import gguf

    m = engine(SOLAR).model
    c = m.cfg
    assert m.arch == "glm4moe" and type(m).__name__ == "Glm4MoeModel"
    rd = gguf.GGUFReader(str(DATA / f"{SOLAR}.gguf"))
    # the converter writes no dense width and no dense lead (no intermediate_size / first_k_dense_replace)
    assert "glm4moe.feed_forward_length" not in rd.fields and "glm4moe.leading_dense_block_count" not in rd.fields
    assert c.ffn == 0 and c.leading_dense_blocks == 0 and all(e is not None for e in m.moe)
    assert (c.n_heads, c.n_kv_heads, c.head_dim) == (4, 2, 24)       # head_dim != 64 / 4
    assert c.rope.style == "neox" and c.rope.n_rot == 24                # partial_rotary_factor 1: the full head
    b = m.blocks[0]
    assert b.attn_q_bias is None and b.attn_q_norm is None               # Llama's attention
    # YaRN factor 2 over 64: the ramp's divisors on the 12 pairs (1 kept, 2 interpolated) and c^2 on q
    f = m.yarn_rope.freq_factors
    assert len(f) == 12 and f[0] == 1.0 and f[-1] == 2.0 and any(1.0 < x < 2.0 for x in f)
    assert abs(m.yarn_q_scale - (1 + 0.1 * math.log(2)) ** 2) < 1e-6
    assert c.expert_gating == "sigmoid" and m.weights_norm and c.expert_weights_scale in (0.0, 1.0)
    assert all(e.exp_probs_b is not None and e.gate_shexp is not None for e in m.moe)


@pytest.mark.parametrize("what", ["no_yarn_ramp", "no_yarn_mscale", "half_rotation", "adjacent_pairs",
                                  "no_select_bias", "no_renorm"])
def test_solar_open_each_rule_is_needed(what):
    eng = engine(SOLAR)
    m = eng.model
    assert logits_miss(SOLAR, eng) < TOL
    if what == "no_yarn_ramp":           # HF yarn rope_parameters: the plain frequencies miss
        m.yarn_rope = m.cfg.rope
    elif what == "no_yarn_mscale":       # HF yarn attention_factor 1 + 0.1 ln 2 on cos/sin: q * c^2
        m.yarn_q_scale = 1.0
    elif what == "half_rotation":        # glm4moe's converter default partial_rotary_factor 0.5 (not Solar's 1)
        half = replace(m.cfg.rope, n_rot=m.cfg.head_dim // 2)
        m.yarn_rope = replace(half, freq_factors=m.yarn_rope.freq_factors[: half.n_rot // 2])
    elif what == "adjacent_pairs":       # LlamaAttention rotate_half: NEOX halves (llama.cpp LLM_ARCH_GLM4_MOE)
        m.yarn_rope = replace(m.yarn_rope, style="normal")
    elif what == "no_select_bias":       # e_score_correction_bias -> exp_probs_b.bias
        for e in m.moe:
            e.exp_probs_b = None
    else:                                # norm_topk_prob -> expert_weights_norm
        m.weights_norm = False
    assert logits_miss(SOLAR, eng) > 10 * TOL, what


def test_glm4moe_dense_layers_need_feed_forward_length(tmp_path):
    """feed_forward_length is optional for glm4moe (Solar Open's files have none; llama.cpp reads it as optional)
    but the dense layers' width: GLM-4.5's file (layer 0 dense) without it is refused by name."""
    assert_refused("glm4moe", tmp_path, dict(drop_keys=("glm4moe.feed_forward_length",)),
                   "glm4moe.feed_forward_length")


def test_glm4moe_subclasses_keep_their_required_keys():
    """The optional width and the YaRN reading are glm4moe's own: the archs built on its model class keep their
    rules (a file of theirs without feed_forward_length is refused by ModelConfig's required-key check)."""
    from minfer.models import ARCHITECTURES
    from minfer.models.glm4moe import Glm4MoeModel

    assert ARCHITECTURES["glm4moe"] is Glm4MoeModel and Glm4MoeModel.ffn_key_optional and Glm4MoeModel.reads_yarn
    for arch, cls in ARCHITECTURES.items():
        if cls is not Glm4MoeModel and issubclass(cls, Glm4MoeModel):
            assert not cls.reads_yarn, arch
            assert cls.ffn_key_optional == ("ffn_key_optional" in cls.__dict__ and cls.__dict__["ffn_key_optional"])


@pytest.mark.parametrize("key", ["glm4moe.rope.scaling.factor", "glm4moe.rope.scaling.original_context_length"])
def test_solar_open_missing_yarn_key_is_named(tmp_path, key):
    assert_refused(SOLAR, tmp_path, dict(drop_keys=(key,)), key)
