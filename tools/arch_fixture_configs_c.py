"""The Hugging Face configs of tools/gen_arch_fixtures.py's tiny random models, part three (part one,
tools/arch_fixture_configs.py, merges these into its ARCHS; split to keep each file under 600 lines):
name -> (config class, model class, config keywords)."""

ARCHS_C = {
    # GLM-4.7-Flash (zai-org/GLM-4.7-Flash; Glm4MoeLiteForCausalLM, which llama.cpp's converter, conversion/glm.py
    # Glm4MoeLiteModel(DeepseekV2Model), writes as deepseek2): DeepSeek-V3's MLA with q_lora (48) and kv_lora (32) +
    # 8 rope dims, qk_nope 24 (3x the rope dims, as the release's 192 / 64), v_head 32 != qk_nope (256 != 192),
    # adjacent-pair rope (rope_interleave) with no scaling (theta 1e6, partial_rotary_factor 1: the release's);
    # layer 0 dense (first_k_dense_replace 1: the converter reads it, HF its mlp_layer_types default), layers 1-2
    # top-2 of 8 sigmoid experts chosen on score + e_score_correction_bias (randomized), renormalized, scaled by 1.8
    # (the release's), one shared expert, n_group 1 (the release's); one NextN/MTP layer counted by the converter
    # (num_nextn_predict_layers 1: block_count 4, nextn_predict_layers 1, no tensors: HF builds none), which minfer
    # must not run. scoring_func: the release's config.json has none (llama.cpp picks sigmoid from its 47 layers and
    # 154880 tokens, deepseek2.cpp load_arch_hparams); a tiny model has neither, so it names the sigmoid HF runs
    # and the converter writes expert_gating_func (conversion/base.py)
    "glm4moe-lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=24,
        qk_rope_head_dim=8, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True, first_k_dense_replace=1,
        num_nextn_predict_layers=1, scoring_func="sigmoid", topk_method="noaux_tc", rope_interleave=True,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 1.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Solar Open (upstage/Solar-Open-100B; SolarOpenForCausalLM, which the converter, conversion/glm.py
    # SolarOpenModel(Glm4MoeModel), writes as glm4moe): every layer MoE (no first_k_dense_replace, no dense
    # intermediate_size: the converter writes no feed_forward_length / leading_dense_block_count), Llama's attention
    # (no q/k/v bias, no q/k norms) with head_dim 24 != 64 / 4 (the release's 128 with 64 heads of a 4096 model),
    # GQA 2:1, FULL rotary NEOX (partial_rotary_factor 1, glm4moe's converter default being 0.5) with the release's
    # YaRN (factor 2; the original context 64 here for the release's 65536, so the ramp covers pairs 0-3 of 12 at
    # theta 1e6) and its cos/sin factor 1 + 0.1 ln 2; top-2 of 8 sigmoid experts on score + e_score_correction_bias
    # (randomized), renormalized, routed_scaling_factor 1 and n_group 1 (the release's), one shared expert; no
    # MTP layers
    "solar-open": ("SolarOpenConfig", "SolarOpenForCausalLM", dict(
        hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0,
                         "original_max_position_embeddings": 64, "partial_rotary_factor": 1.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # BitNet b1.58 2B-4T style (bitnet; BitNetForCausalLM): attention and MLP each with an RMSNorm inside the branch
    # (attn_sub_norm before o_proj, ffn_sub_norm before down_proj), a squared-ReLU gate (relu2: the release's
    # hidden_act; the converter patched to write bitnet.hidden_activation), GQA 2:1, NEOX rope at the release's
    # theta 5e5, tied head (llama.cpp's bitnet loads no output tensor). The converter writes each projection as
    # its ternary form times mean |W| (tools/bitnet_fixture.py, whose steps gen_arch_fixtures runs)
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_act="relu2", rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # 1bitLLM/bitnet_b1_58 style (bitnet; the release's BitnetForCausalLM class name and sub-norm names): the same
    # graph with SiLU gating (the release's hidden_act), MHA, theta 10000; no activation key in the file (llama.cpp's
    # default: silu)
    "bitnet-silu": ("BitNetConfig", "BitNetForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Kimi-Linear-48B-A3B style (kimi-linear; KimiLinearForCausalLM): KDA layers (Kimi Delta Attention: the gated
    # delta rule with a per-channel decay, q/k/v short convs of 4, a sigmoid-gated output norm) on layers 0 and 2,
    # MLA layers on 1 and 3 (no q_lora, kv_lora 32 + 8 "rope" dims that get NO rope, as the release: HF
    # KimiLinearAttention, llama.cpp kimi-linear.cpp), qk_nope 16 != v_head 24, 4 KDA heads of 24 (96 != the 64 of
    # the model; as many as the MLA heads: the converter writes no KDA head count, kimi-linear.cpp takes head_count); layer 0 dense, 1-3 top-2 of 8 sigmoid experts on score + e_score_correction_bias (randomized),
    # renormalized, scaled by the release's 2.446, one shared expert. linear_attn_config, first_k_dense_replace and
    # moe_router_activation_func as the release's config.json has them (the converter reads them: conversion/
    # kimi_linear.py, base.py's expert_gating_func)
    "kimi-linear": ("KimiLinearConfig", "KimiLinearForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=24, num_local_experts=8, num_experts_per_tok=2, num_shared_experts=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.446, norm_topk_prob=True, rms_norm_eps=1e-5, tie_word_embeddings=False,
        linear_attn_config={"head_dim": 24, "num_heads": 4, "short_conv_kernel_size": 4,
                            "full_attn_layers": [2, 4], "kda_layers": [1, 3]},
        first_k_dense_replace=1, moe_router_activation_func="sigmoid", pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # HRM-Text (hrm-text; HrmTextForCausalLM, DFM-Mimir 1B's architecture, llama.cpp arch hrm_text): two stacks (L, H)
    # of 2 layers each (num_hidden_layers is the per-stack count; HF and the converter expand block_count to
    # 2 * H_cycles 2 * (L_cycles 2 + 1) = 12 cache slots), so two L passes and one H pass per H cycle, twice: the
    # cycling, the shared weights and every slot of the mapping are exercised (H_cycles and L_cycles > 1 each).
    # head_dim 16 (HF's default 128 is the release's).
    # embedding_scale 4 (HF's default 1 / initializer_range = 50 would bury z_L_init under the random embedding's
    # ~0.19 entries; 4 puts both near 1, so each rule shows). prefix_lm True (the release's; the converter writes
    # hrm.prefix_lm): transformers applies it only to token_type_ids the caller passes, so the reference is causal
    # as llama.cpp's graph. z_L_init is randomized around 1 (gen_arch_fixtures.randomize's 1-D rule; HF inits zeros)
    "hrm-text": ("HrmTextConfig", "HrmTextForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
        H_cycles=2, L_cycles=2, embedding_scale=4.0, prefix_lm=True, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Muse Glimmer's language model (muse-glimmer; MuseGlimmerForConditionalGeneration, text only: the converter's
    # MuseGlimmerModel, conversion/muse_glimmer.py; the vision tower, 1 layer of 32, goes to an mmproj only with
    # --mmproj): a weight-less RMSNorm of the embeddings, centered (1 + w) pre/post norms, scaleless q/k norms with q
    # times qk_scale_factor 2.5 (not the default 3.87, so the value must come from the file's attn_q_norm), the
    # sigmoid attention gate, GQA 2:1, head_dim 16. 5 layers: HF counts its every-4th NoPE/global layer backward from
    # the last (layers 0 and 4), llama.cpp's default pattern forward (layer 3), so the file's per-layer flags rule;
    # window 8 (< the 40-token reference); logits * output_multiplier 0.6 then softcap 4.0 (the default 20 would
    # barely bend the tiny model's logits)
    "muse-glimmer": ("MuseGlimmerConfig", "MuseGlimmerForConditionalGeneration", dict(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256,
                         sliding_window=8, final_logit_softcapping=4.0, output_multiplier=0.6, qk_scale_factor=2.5,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(patch_size=14, pos_emb_height=2, pos_emb_width=2, num_attention_heads=2,
                           num_hidden_layers=1, hidden_size=32, intermediate_size=32),
        out_hidden_size=32, projector_hidden_size=32, tie_word_embeddings=False)),
}

# Chameleon (facebook/chameleon-7b style; ChameleonForConditionalGeneration, text in and out only: llama.cpp's
# converter, conversion/chameleon.py, drops model.vqmodel): Llama with per-head q/k LayerNorms with weight and bias
# (HF ChameleonLayerNorm over head_dim, fixed eps 1e-5) before rope; NORM rope (the converter permutes q/k). MHA
# as the release (the converter's k-norm reorder takes head_dim = hidden / n_kv_heads: GQA does not convert),
# untied head (the release's). The converter keeps only head 0's
# q/k norm row and repeats it (ChameleonModel._reverse_hf_permute: the release's norms are one row repeated), so
# gen_arch_fixtures.py's LLAMACPP_RULES (shared_head_norms) sets every head's row to one random row before the
# reference. vocabulary_map without IMGIMG names: transformers then masks no image
# tokens; llama.cpp's fixed range of ids 4..8195 is past this vocabulary (see minfer/models/chameleon.py). A tiny
# VQ-VAE config only so the HF model builds small (its tensors are not converted).
_CHAMELEON = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, vocabulary_map={},
    vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=8, resolution=16, base_channels=32,
                   channel_multiplier=[1, 1], num_res_blocks=1),   # GroupNorm of 32 groups: 32 channels
    pad_token_id=0, bos_token_id=1, eos_token_id=2)
ARCHS_C |= {
    "chameleon": ("ChameleonConfig", "ChameleonForConditionalGeneration", dict(_CHAMELEON)),
    # the 30B's swin_norm: the norms after attention and after the MLP, on the branch before its residual add
    # (HF ChameleonSwinDecoderLayer; the converter writes chameleon.swin_norm)
    "chameleon-swin": ("ChameleonConfig", "ChameleonForConditionalGeneration", dict(_CHAMELEON, swin_norm=True)),
}

# GPT-J (EleutherAI/gpt-j-6B, GPT4All-J, Pygmalion-6B; GPTJForCausalLM, GGUF arch gptj): one LayerNorm per layer feeding
# attention and MLP in parallel, rotary on the first rotary_dim 8 of each head's 16 dims in adjacent pairs (HF
# rotate_every_two; the 6B: 64 of 256), no q/k/v/out biases, fc_in / fc_out with biases, gelu_new, untied lm_head with
# a bias. n_inner 96 (the release's is 4 D) keeps the file under 250 KB. Not in ARCHS: llama.cpp 0.3.36's converter
# has no GPT-J class, so tools/gptj_fixture.py builds this one (it registers a small converter, see there)
ARCHS_GPTJ = {
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=64, n_inner=96, n_layer=2, n_head=4, rotary_dim=8, n_positions=256, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}
