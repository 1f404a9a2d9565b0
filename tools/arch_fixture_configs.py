"""The Hugging Face configs of tools/gen_arch_fixtures.py's tiny random models: name -> (config class,
model class, config keywords). One entry per fixture under tests/data/arch/; read by that tool only."""

VOCAB = 320       # the tiny byte-level BPE's size (gen_arch_fixtures.make_tokenizer)

# Small but not degenerate: GQA everywhere, head_dim != hidden/heads where the family allows it.
ARCHS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=1024, tie_word_embeddings=True,
        # Llama-3.1's rope_scaling with the original context shrunk so that every band
        # (unscaled, smoothed, divided by `factor`) holds some of the 8 frequencies of head_dim 16
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=24, rms_norm_eps=1e-5, max_position_embeddings=512,
        sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
        max_position_embeddings=512, sliding_window=8,   # layers 0-4 local, 5 global (pattern 6)
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},
        final_logit_softcapping=None, attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # layers 0 and 2 local (window 8 < SEQ), 1 and 3 global; soft-caps small enough that
    # random weights' scores and logits reach them (a missing cap fails the logits test)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
        max_position_embeddings=512, sliding_window=8, attn_logit_softcapping=3.0,
        final_logit_softcapping=10.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # OLMo 3: converted as `olmo2` with a per-layer sliding-window pattern (layers 0-2 local, 3 global)
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=64,
        original_max_position_embeddings=32, sliding_window=None, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                         "short_factor": [1.0 + 0.05 * i for i in range(8)],
                         "long_factor": [1.0 + 0.9 * i for i in range(8)]})),
    # Phi-4-mini's shape of phi3: partial rotary (3/4 of each head), tied embeddings, LongRoPE
    "phi3partial": ("Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, rms_norm_eps=1e-5, max_position_embeddings=64,
        original_max_position_embeddings=32, sliding_window=None, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                         "partial_rotary_factor": 0.75,
                         "short_factor": [1.0 + 0.1 * i for i in range(6)],
                         "long_factor": [1.0 + 1.3 * i for i in range(6)]})),
    # IBM Granite (3.x): Llama with four multipliers, each far from 1 so a missed one fails the test
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, embedding_multiplier=1.5,
        attention_multiplier=0.3, residual_multiplier=0.8, logits_scaling=1.5, attention_bias=False,
        mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Granite MoE, without and with the shared expert (Granite's multipliers around a top-2-of-8 MoE)
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=1.5, attention_multiplier=0.3, residual_multiplier=0.8, logits_scaling=1.5,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", dict(
        hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=1.5, attention_multiplier=0.3, residual_multiplier=0.8, logits_scaling=1.5,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # ERNIE 4.5 (dense): Llama's computation; its converter reads a SentencePiece model only
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, use_bias=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B's form): layer 0 dense (moe_layer_start_index 1), then top-2 of 8 softmax
    # experts chosen on probability + e_score_correction_bias (randomized below: zeros at init), weights
    # renormalized, plus 2 shared experts (width 2 * 24 = intermediate_size // kv_heads, what the converter writes
    # as expert_shared_feed_forward_length); adjacent-pair rope; the converter reads a SentencePiece model only
    "ernie4_5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True, use_bias=False,
        moe_intermediate_size=24, moe_k=2, moe_num_experts=8, moe_num_shared_experts=2, moe_layer_start_index=1,
        moe_layer_end_index=-1, moe_layer_interval=1, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # the same with MoE layers every second layer (HF moe_layer_interval 2: layers 1 and 3 of 4; layer 0 dense
    # as the leading one, layer 2 dense by the step) and no shared experts
    "ernie4_5-moe-step2": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, use_bias=False,
        moe_intermediate_size=24, moe_k=2, moe_num_experts=8, moe_num_shared_experts=0, moe_layer_start_index=1,
        moe_layer_end_index=-1, moe_layer_interval=2, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # EXAONE 3.5 (exaone): Llama's computation under LG's names; the released Llama-3 rope scaling (the converter
    # writes rope_freqs.weight) with the original context shrunk so that each band holds some of the 8 frequencies
    # (as the llama3 entry); untied head (7.8B/32B). transformers 5 runs it as LlamaForCausalLM; the converter gets
    # the released config (CONFIG_AS_RELEASED)
    "exaone": ("ExaoneConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=1024, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # GLM-4 (0414): q/k/v biases, half the head rotated (adjacent pairs), post-attention and post-MLP
    # norms, the MLP's gate and up fused in one matrix
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # SmolLM3: Llama with no rope on every fourth layer (layer 3 of 4 here)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, use_sliding_window=False,
        sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False)),
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True, use_sliding_window=False,
        rms_norm_eps=1e-6, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False)),
    # gpt-oss: attention sinks, q/k/v/o biases, layers 0 and 2 sliding (window 8 < SEQ), 1 and 3 full;
    # top-2 of 4 experts with router and expert biases, the clamped SwiGLU (alpha 1.702, limit 7:
    # llama.cpp hard-codes both, the GGUF carries neither). Plain rope here (minfer/config.py refuses
    # YaRN); gpt-oss-yarn below has the released files' YaRN. randomize() spreads the sinks and
    # scales the experts' gate/up so the sinks and the clamp both matter.
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, swiglu_alpha=1.702, swiglu_limit=7.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # the same with the released files' YaRN (factor 32 over an original 4096, beta 32/1, truncate
    # False: fractional correction dims 2.0 and 4.4 of the 8 frequencies)
    "gpt-oss-yarn": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
        swiglu_alpha=1.702, swiglu_limit=7.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # GLM-4.5 (glm4moe): layer 0 dense, layers 1-2 top-2 of 8 sigmoid-gated experts chosen on
    # score + e_score_correction_bias (randomized below: zeros at init), renormalized and scaled by
    # 2.5, plus one shared expert; q/k/v biases, per-head q/k norms (the 355B's use_qk_norm), half of
    # each head rotated (NEOX halves). HF's default num_mtp_layers=1 makes the converter count one
    # NextN layer in block_count (4) without tensors; minfer must run 3. Group-limited choice: 4 groups
    # of 2 experts, the best 2 groups eligible (the released configs have n_group 1; the converter
    # writes n_group/topk_group as expert_group_count/expert_group_used_count, conversion/base.py).
    "glm4moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5, max_position_embeddings=256,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # DeepSeek-V2-Lite-like (deepseek2): MLA without q_lora (one q matrix), the latent kv (kv_lora 32 +
    # 8 rope dims, v_head 24 != qk_nope 16), layer 0 dense, layers 1-2 top-2 of 8 softmax experts (no
    # scoring_func: the converter writes no expert_gating_func, llama.cpp's deepseek2 default is
    # softmax), not renormalized, plus 2 shared experts; V2-Lite's YaRN (mscale = mscale_all_dim 0.707:
    # llama.cpp's special case for deepseek2) over a short original context
    "deepseek2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
        first_k_dense_replace=1, routed_scaling_factor=1.0, topk_method="greedy", norm_topk_prob=False,
        rms_norm_eps=1e-6, max_position_embeddings=2560, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 64},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # DeepSeek-V3-like (deepseek2 too): q_lora 48 (q_a, q_a_norm, q_b), kv_lora 32 + 16 rope dims;
    # layer 0 dense, layers 1-2 top-2 of 8 sigmoid experts chosen on score + e_score_correction_bias
    # (randomized: zeros at init) in 2 of 4 groups, renormalized, scaled by 2.5, one shared expert;
    # V3's YaRN (factor 40, mscale = mscale_all_dim 1) over an original 256 (the ramp spans pairs 0-4
    # of 8). scoring_func / topk_method as V3's config.json (the converter reads scoring_func)
    "deepseek3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", rope_interleave=True,
        rms_norm_eps=1e-6, max_position_embeddings=10240, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 256},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Cohere Command-R: LayerNorm (no bias), attention and MLP in parallel from one norm, adjacent-pair
    # rope, tied embeddings, logits * logit_scale (far from 1 so a missed scale fails the test)
    "command-r": ("CohereConfig", "CohereForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        logit_scale=0.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, use_qk_norm=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Command-R+ style: per-head LayerNorms of q and k, a weight per head (llama.cpp loads them for
    # n_layer >= 64 only; minfer takes them when the file has them)
    "command-r-qknorm": ("CohereConfig", "CohereForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        logit_scale=0.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, use_qk_norm=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Cohere2 (Command R7B): layers 0-2 sliding (window 8 < SEQ) with rope, layer 3 global without rope;
    # rotary_pct: the converter reads it (conversion/command_r.py Cohere2Model), HF's config has no field
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        logit_scale=0.25, sliding_window=8, rotary_pct=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Ministral 3 (converted as mistral3): YaRN (factor 8 over an original 16, so the ramp spans pairs 0-2
    # of 12 with rope_theta 1000, mscale_all_dim 0.5 so the cos/sin factor is not 1) and Llama-4's
    # attention temperature, q * (1 + beta ln(1 + floor(pos / 16))), beta 0.5: positions 16-39 of SEQ
    # get 1.35 and 1.55. head_dim 24 != 64 / 4, GQA 4:1
    "mistral3": ("Ministral3Config", "Ministral3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=24, rms_norm_eps=1e-5, max_position_embeddings=128,
        sliding_window=None, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 8.0,
                         "original_max_position_embeddings": 16, "max_position_embeddings": 128, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # ByteDance Seed-OSS: q/k/v biases, no o bias, NEOX rope, head_dim 24 != 64 / 4
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, max_position_embeddings=256,
        attention_bias=True, attention_out_bias=False, mlp_bias=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # LG EXAONE 4.0 (32B's shape): layers 0-2 sliding (window 8 < SEQ) with rope, layer 3 global without
    # rope ("LLLG"), post-attention and post-MLP norms and no pre-norms, per-head q/k norms, Llama-3
    # rope scaling (rope_freqs.weight; original context shrunk so each band holds some of the 8 pairs)
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=1024,
        sliding_window=8, sliding_window_pattern=4, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Google Gemma 4 dense (31B's shape): layers 0,1,3,4 sliding (window 8 < SEQ, head size 16, 2 kv heads,
    # rope base 20000 on all 16 dims), 2 and 5 global (head size 32, 1 kv head, v_proj absent: k as v,
    # proportional rope on a quarter of the head, base 1e6); q/k norms, weightless v norm, attention
    # scale 1, a per-layer output scalar, final soft-cap small enough to bite
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, rms_norm_eps=1e-6, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}},
        final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=0,
        num_kv_shared_layers=0, enable_moe_block=False, tie_word_embeddings=True, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
    # Gemma 4 E2B/E4B's form: per-layer embeddings (16 per layer: the CUDA GEMV reads K in runs of 16),
    # layers 3-5 reuse the caches of layers 1 (window) and 2 (global) (num_kv_shared_layers 3; llama.cpp's
    # reuse rule and HF's agree), double-wide MLPs on the shared layers, v projections everywhere, one
    # kv-head count
    "gemma4-ple": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, attention_k_eq_v=False,
        rms_norm_eps=1e-6, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}},
        final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=3, use_double_wide_mlp=True,
        enable_moe_block=False, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Gemma 4 26B-A4B's form: every layer a shared GELU MLP plus 4 GELU experts (top 2; router on the
    # weightless-normed residual times router.scale / sqrt(D), per-expert scales), the dense fixture's attention
    "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, rms_norm_eps=1e-6, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}},
        final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=0,
        num_kv_shared_layers=0, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Google Gemma 3n E2B/E4B's text model: 4 AltUp streams (stream 0 active; predict / correct with router
    # modalities, the corrected active stream scaled), a LAuReL branch of rank 16, per-layer embeddings of 16 per
    # layer (the CUDA GEMV reads K in runs of 16), layers 0, 1, 3, 4 sliding (window 8 < SEQ, rope base 20000),
    # 2 and 5 global (base 1e6), layers 3-5 reusing the caches of layers 1 (window) and 2 (global)
    # (num_kv_shared_layers 3: llama.cpp's reuse rule and HF's agree), activation sparsity 0.95 on layers 0 and
    # 1 (llama.cpp's 10 released sparse layers, scaled down), a final soft-cap small enough to bite
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB, altup_num_inputs=4, altup_active_idx=0, altup_correct_scale=True,
        laurel_rank=16, num_kv_shared_layers=3, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Liquid LFM2: layers 0, 1, 3, 5 short-convolution blocks (in_proj -> B, C, x; a causal depthwise conv of
    # 3 taps over B*x; C * conv; out_proj), 2 and 4 GQA attention with per-head q/k norms; SwiGLU everywhere,
    # the final norm stored as token_embd_norm, tied lm head. block_auto_adjust_ff_dim off: the FFN is 96 wide
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, norm_eps=1e-5, max_position_embeddings=256, conv_L_cache=3, conv_bias=False,
        block_auto_adjust_ff_dim=False, layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Liquid LFM2-8B-A1B (`lfm2moe`): lfm2's conv / attention layers (conv, attn, conv, attn; GQA 4:2), layer 0's FFN
    # a dense SwiGLU of intermediate_size (num_dense_layers 1), the others a MoE of 8 experts of
    # moe_intermediate_size 24, top 2 by sigmoid(router) + expert_bias (randomize() gives the zeros buffer values),
    # weights the unbiased sigmoids renormalized, routed_scaling_factor 1 (the released config)
    "lfm2moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, norm_eps=1e-5, max_position_embeddings=256, conv_L_cache=3, conv_bias=False,
        num_dense_layers=1, num_experts=8, num_experts_per_tok=2, use_expert_bias=True, norm_topk_prob=True,
        routed_scaling_factor=1.0, layer_types=["conv", "full_attention", "conv", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Llama 4 (`llama4`, the text model): 4 layers, interleave_moe_layer_step 2 (Maverick's form: layers 1 and 3 a
    # top-1 sigmoid MoE of 4 experts of intermediate_size 24 plus a shared expert as wide, the router's sigmoid
    # scaling the experts' input; layers 0 and 2 a SwiGLU MLP of intermediate_size_mlp 96); layer 3 without rope
    # (no_rope_layer_interval 4) and with the temperature tuning, layers 0-2 rope'd with the weightless q/k RMSNorm
    # after rope and chunked attention; Scout's llama3 rope factors (16, low = high = 1, original 8192: both factor
    # sets in 8 pairs). Chunk 8192 and floor_scale 8192 as released (llama.cpp hard-codes both): build() adds the
    # logits and greedy tokens of chunk 8 / floor_scale 4 (logits_local, greedy_local), whose rules then show
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", dict(
        hidden_size=64, intermediate_size=24, intermediate_size_mlp=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True, no_rope_layer_interval=4,
        attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Mamba-2 (`mamba2`, Mamba-Codestral-7B's form): 3 layers of x + mixer(RMSNorm(x)), no attention and no MLP; the
    # mixer of minfer/models/mamba2.py with 8 heads of 16 (inner 128 = expand 2 * 64), 2 groups of state 16, conv
    # kernel 4 with bias, the grouped gated RMSNorm; untied head. The converter writes head_count 0 and
    # feed_forward_length 0 ("unused, but seemingly required when loading")
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16, expand=2, state_size=16, n_groups=2,
        conv_kernel=4, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5, chunk_size=16,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Qwen2.5-VL's language model (the converter writes `qwen2vl`; the vision tower goes to an mmproj
    # only with --mmproj): Qwen2 with M-RoPE sections (2, 3, 3) of the 8 pairs; text-only positions
    "qwen2vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", dict(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           fullatt_block_indexes=[0]), tie_word_embeddings=False)),
    # Qwen3-VL's language model (`qwen3vl`): Qwen3 (per-head q/k norms) with interleaved M-RoPE sections
    # (6, 5, 5) of 16 pairs (the released (24, 20, 20) of 64 scaled down) and 2 deepstack layers, which
    # add nothing without image embeddings
    "qwen3vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", dict(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5],
                                          "mrope_interleaved": True},
                         pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]), tie_word_embeddings=False)),
    # Qwen3-VL MoE's language model (`qwen3vlmoe`): Qwen3-MoE (per-head q/k norms, top-2 of 8 softmax experts,
    # renormalized) with the interleaved M-RoPE sections (6, 5, 5) and 2 deepstack layers of the qwen3vl entry;
    # moe_intermediate_size 24 so that the packed gate_up_proj (2F = 48) and hidden (64) differ in size (the
    # converter splits HF's transposed packed experts by shape)
    "qwen3vlmoe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", dict(
        text_config=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                         num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                         max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5],
                                          "mrope_interleaved": True},
                         pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]), tie_word_embeddings=False)),
    # OLMoE (OLMoE-1B-7B's form): OLMo's q/k RMSNorm over the whole projection, pre-norm blocks, top-2 of 8
    # softmax experts of intermediate_size, not renormalized (norm_topk_prob False, as the released config and
    # llama.cpp's graph); MHA as released (llama.cpp loads attn_k_norm as n_embd wide); eps 1e-5 (the
    # converter writes 1e-5 whatever the config says)
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, rms_norm_eps=1e-5,
        max_position_embeddings=256, clip_qkv=None, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Arcee AFM-4.5B (arcee): Llama's block with an ungated squared-ReLU MLP (hidden_act relu2), GQA, untied head;
    # YaRN as the released config (factor 20 over an original 4096, beta 32 / 1): the low
    # frequencies of head_dim 16 divided by 20, a ramp between, cos/sin times 1 + 0.1 ln 20
    "arcee": ("ArceeConfig", "ArceeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=81920, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, hidden_act="relu2",
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 20.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Swiss AI Apertus (apertus): Llama's block with per-head q/k RMSNorm before rope, NEOX rope (the converter
    # does not permute), an ungated xIELU MLP whose alpha_p / alpha_n / beta / eps are per-layer values (the
    # converter writes them as xielu.* arrays; beta randomized per layer in randomize()), untied head; the
    # released Llama-3 rope scaling (theta 12M, factor 8) with the original context shrunk so that each band
    # holds some of the 8 frequencies
    "apertus": ("ApertusConfig", "ApertusForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=1024, tie_word_embeddings=False,
        attention_bias=False, hidden_act="xielu",
        rope_parameters={"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # rednote dots.llm1 (dots1): Qwen3's attention (per-head q/k RMSNorm before NEOX rope; as many kv heads as
    # heads, which llama.cpp's loader assumes) and DeepSeek-V3's MoE: layer 0 dense (first_k_dense_replace 1),
    # then sigmoid scores chosen on score + e_score_correction_bias (randomized below: zeros at init), 2 groups
    # of which the best 1 stays eligible (released: 1 group), top-2 of 8, weights renormalized and times
    # routed_scaling_factor 2.5, plus 2 shared experts (width 2 * 24); scoring_func as the released config (the
    # converter writes it as expert_gating_func); no sliding window (llama.cpp's graph has none)
    "dots1": ("Dots1Config", "Dots1ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
        n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        scoring_func="sigmoid", sliding_window=None, rms_norm_eps=1e-6, max_position_embeddings=256,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Hunyuan-A13B (hunyuan-moe): hunyuan-dense's attention (per-head q/k RMSNorm AFTER NEOX rope, GQA) and, in
    # every layer, a softmax top-2 of 8 MoE, renormalized, plus an ungated shared SwiGLU MLP; experts and shared
    # MLP both intermediate_size wide (HF's experts take intermediate_size; the converter reads the released
    # per-layer lists moe_intermediate_size / num_shared_expert / moe_topk, kept in config.json as extra keys).
    # Plain rope (theta 1e6): the converter's NTK-alpha branch asserts head size 128 and writes a scaled
    # rope.freq_base, a plain number to the loader (hunyuan-dense's fixture covers the alpha rule)
    "hunyuan-moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_experts=8, moe_topk=[2, 2], moe_intermediate_size=[32, 32], num_shared_expert=[1, 1],
        rms_norm_eps=1e-5, max_position_embeddings=256, attention_bias=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # MiniMax-M2 (minimax-m2): q/k RMSNorm over the whole projection (OLMo 2's), then NEOX rope on the first
    # rotary_dim 8 of each 16-dim head (released: 64 of 128), GQA, untied head; every layer a MoE of sigmoid scores
    # chosen on score + e_score_correction_bias (randomized below: zeros at init), top 2 of 8, renormalized, no
    # shared expert, experts intermediate_size wide; scoring_func as the released config (the converter writes it
    # as expert_gating_func); rotary_dim kept in config.json (the converter reads it)
    "minimax-m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rotary_dim=8, num_local_experts=8, num_experts_per_tok=2, scoring_func="sigmoid",
        rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Hunyuan dense (0.5B-7B's form): per-head q/k RMSNorm AFTER rope, NEOX, GQA, tied head, and the released
    # NTK-alpha rope ("dynamic" with alpha 1000, factor 1, theta 10000, max_position_embeddings 32k: the
    # converter asserts theta and that length, and writes theta * alpha^(Dh/(Dh-2)) as rope.freq_base);
    # head_dim explicit (the converter reads hparams["head_dim"])
    "hunyuan-dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=32768,
        attention_bias=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # StarCoder2: LayerNorm with bias, biases on every linear, a GELU-tanh MLP without gate, GQA, NEOX rope,
    # tied head. The converter writes no sliding window (llama.cpp's graph has none); logits_window8 (below)
    # is transformers' forward of the same weights with sliding_window 8, for a file that carries the key
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, norm_epsilon=1e-5, max_position_embeddings=256, use_bias=True, sliding_window=None,
        hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # IBM Granite 4.0 H (granitehybrid): Mamba-2 layers 0, 2, 3 (8 heads of 16, state 16, 2 groups, conv of 4
    # taps with bias) and a GQA layer 1 without rope (the released "nope"; the converter writes rope off for
    # every non-Bamba hybrid), Granite's four multipliers far from 1, a top-2-of-4 MoE with a shared expert
    # (tiny/small) or the shared MLP alone (micro: num_local_experts 0). chunk_size 8: HF's chunked scan crosses
    # chunks. The layer types go to the converter as released ("mamba"/"attention": LAYER_TYPES_AS_RELEASED)
    "granitehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=True, position_embedding_type="nope",
        layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True,
        mamba_proj_bias=False, embedding_multiplier=1.5, attention_multiplier=0.3, residual_multiplier=0.8,
        logits_scaling=1.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "granitehybrid-dense": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        hidden_size=64, intermediate_size=48, shared_intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=0, num_experts_per_tok=0, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=True, position_embedding_type="nope",
        layer_types=["mamba", "mamba", "attention", "mamba"], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True,
        mamba_proj_bias=False, embedding_multiplier=1.5, attention_multiplier=0.3, residual_multiplier=0.8,
        logits_scaling=1.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # NVIDIA Nemotron-H (nemotron_h): the block pattern M-M*-M (Mamba-2, squared-ReLU MLP, attention without rope),
    # each block one mixer after its RMSNorm. Mamba-2: 12 heads of 16 (inner 192, not twice the width of 64: Nemotron
    # Nano 9B v2's form, 128 heads of 80 at a width of 4480), 2 groups, state 16, conv of 4 taps with bias;
    # chunk_size 8: HF's chunked scan crosses chunks. The config goes to the converter as released
    # (CONFIG_AS_RELEASED: the hybrid_override_pattern string)
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        hidden_size=64, intermediate_size=96, layers_block_type=["linear_attention", "mlp", "linear_attention",
                                                                 "full_attention", "mlp", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=12, mamba_head_dim=16, n_groups=2,
        ssm_state_size=16, conv_kernel=4, chunk_size=8, use_conv_bias=True, use_bias=False, mlp_bias=False,
        attention_bias=False, layer_norm_epsilon=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # TII Falcon-H1 (falcon-h1): attention (NEOX rope) and Mamba-2 side by side on the same normed input in every
    # layer, then a SwiGLU MLP. Every muP multiplier away from 1, each a power of two: llama.cpp's converter folds
    # them into the f16 weights (conversion/falcon_h1.py), so the file holds exactly what transformers runs.
    # Mamba-2: 6 heads of 16 (inner 96, 1.5 x the width: the released 0.5B's ratio), 2 groups, state 16, conv of 4
    # with bias, the gated group norm on (mamba_rms_norm, gate first: norm_before_gate false); chunk_size 8
    "falcon-h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False, mamba_rms_norm=True,
        mamba_norm_before_gate=False, projectors_bias=False, attention_bias=False, mlp_bias=False,
        embedding_multiplier=4.0, lm_head_multiplier=0.25, mlp_multipliers=[2.0, 0.5], key_multiplier=0.25,
        attention_in_multiplier=2.0, attention_out_multiplier=0.5, ssm_in_multiplier=0.5, ssm_out_multiplier=2.0,
        ssm_multipliers=[0.5, 2.0, 0.25, 4.0, 0.5], pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # the released 0.5B/1.5B form: no norm after the gate (mamba_rms_norm false: y * silu(z)), one group, inner
    # twice the width
    "falcon-h1-nonorm": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False, mamba_rms_norm=False,
        mamba_norm_before_gate=False, projectors_bias=False, attention_bias=False, mlp_bias=False,
        embedding_multiplier=2.0, lm_head_multiplier=0.5, mlp_multipliers=[0.5, 2.0], key_multiplier=2.0,
        attention_in_multiplier=0.5, attention_out_multiplier=2.0, ssm_in_multiplier=2.0, ssm_out_multiplier=0.5,
        ssm_multipliers=[2.0, 0.5, 4.0, 0.25, 2.0], pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Qwen3.5 dense (qwen35): gated DeltaNet linear attention on layers 0, 2, 3 (2 key heads and 4 value heads of
    # 16: the converter reorders the value heads to ggml's tiled order; conv of 4 taps, no bias) and gated full
    # attention on layer 1 (q projection twice as wide: query and output gate per head; per-head q/k norms;
    # interleaved M-RoPE over half of each 32-wide head, sections 3/3/2 of its 8 pairs); the layer types given
    # (attention.recurrent_layers), not the every-4th default. The converter adds 1 to the (1 + w) norms
    "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Qwen3.5 MoE (qwen35moe): qwen35's layers (linear attention on 0, 1, 3 with 2 key heads and 6 value heads of
    # 16; gated full attention on 2) with a softmax top-2-of-4 MoE (renormalized) plus the shared expert scaled by
    # sigmoid(w . h); tied head
    "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=6, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Qwen3-Next (qwen3next): linear attention on 0-2 (2 key heads, 4 value heads of 16 in HF's grouped order;
    # beta/alpha from one in_proj_ba) and gated full attention on 3 (the every-4th default), plain NEOX rope on half
    # of each 32-wide head, a softmax top-2-of-4 MoE (norm_topk_prob) plus the sigmoid-gated shared expert
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}

from arch_fixture_configs_b import ARCHS_B  # noqa: E402  (part two: each file under 600 lines)

ARCHS.update(ARCHS_B)
from arch_fixture_configs_c import ARCHS_C  # noqa: E402  (part three)

ARCHS.update(ARCHS_C)
