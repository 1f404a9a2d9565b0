"""The Hugging Face configs of tools/gen_arch_fixtures.py's tiny random models, part two (part one,
tools/arch_fixture_configs.py, merges these into its ARCHS; split to keep each file under 600 lines):
name -> (config class, model class, config keywords)."""

ARCHS_B = {
    # MPT (mpt; MptForCausalLM): ALiBi (max 8) over 6 heads (HF's MPT slopes for a head count not a power of two),
    # clip_qkv 0.3 (binds on the fused projection), no biases anywhere (no_bias), LayerNorms without bias, an
    # exact-erf GELU MLP of 4 * d_model, tied head
    "mpt": ("MptConfig", "MptForCausalLM", dict(
        d_model=96, n_heads=6, n_layers=2, expansion_ratio=4, max_seq_len=128, no_bias=True, layer_norm_epsilon=1e-5,
        attn_config=dict(alibi=True, alibi_bias_max=8, clip_qkv=0.3), tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # BLOOM (bloom; BloomForCausalLM): ALiBi (no positions, no rope) over 6 heads (not a power of two: the slopes of
    # heads 4-5 take ggml's / HF's second base), LayerNorm with bias on the embeddings, before attention and before
    # the MLP, the fused query_key_value with bias in HF's per-head (q, k, v) rows (the converter regroups them),
    # biases on every linear (CENTERED_BIAS), a GELU-tanh MLP of 4 * hidden, tied head
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(
        hidden_size=96, n_layer=2, n_head=6, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Pythia style (gptneox; GPTNeoXForCausalLM): parallel residual (use_parallel_residual, the default), partial
    # rotary NEOX on a quarter of each head (4 of 16 dims: rotary_pct 0.25, Pythia's), LayerNorms with bias, the fused
    # query_key_value with bias in HF's per-head (q, k, v) rows (the converter regroups them as q, k, v), biases on
    # every linear (CENTERED_BIAS), an exact-erf GELU MLP of 4 * hidden, untied head (embed_out); rope_theta 10000:
    # the converter writes no rope.freq_base. The config as released (rotary_pct): gen_arch_fixtures CONFIG_AS_RELEASED
    "gptneox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, hidden_act="gelu",
        layer_norm_eps=1e-5, max_position_embeddings=256, use_parallel_residual=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # GPT-NeoX with sequential residuals (gptneox; use_parallel_residual False, as some RedPajama-INCITE / StableLM
    # alpha style conversions): x + attn(ln1(x)), then + mlp(ln2(.)); rotary on half of each head (8 of 16)
    "gptneox-seq": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, hidden_act="gelu",
        layer_norm_eps=1e-5, max_position_embeddings=256, use_parallel_residual=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # GPT-2 (gpt2; GPT2LMHeadModel): learned absolute positions (wpe, n_positions 128), LayerNorms with bias, Conv1D
    # c_attn / c_proj / c_fc (in, out) that the converter transposes, MHA, biases everywhere (CENTERED_BIAS), a
    # GELU-tanh MLP (gelu_new) of 4 * n_embd, tied head. The config as released (n_ctx): CONFIG_AS_RELEASED
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, activation_function="gelu_new", layer_norm_epsilon=1e-5,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # StarCoder 1 / SantaCoder (starcoder; GPTBigCodeForCausalLM): learned absolute position embeddings (wpe, no
    # rope), multi-query attention (one kv head) from one fused c_attn with bias, LayerNorms with bias, an ungated
    # GELU-tanh MLP of 4 * n_embd with biases, tied head. Biases drawn around 0 (CENTERED_BIAS)
    "starcoder": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, multi_query=True, activation_function="gelu_pytorch_tanh",
        layer_norm_epsilon=1e-5, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Falcon-7B style (falcon): multi-query (one kv head: num_kv_heads 1, what the converter reads; HF takes 1 for
    # multi_query whatever the key), attention and MLP in parallel from one LayerNorm (input_layernorm), no linear
    # biases, exact-erf GELU MLP of 4 * hidden, tied head; rope_theta 10000: the converter writes no rope.freq_base
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=1, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True, bias=False, alibi=False, layer_norm_epsilon=1e-5,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Falcon-40B / 180B style (falcon): the new decoder architecture, 2 kv groups of 2 query heads (HF's grouped
    # q/k/v rows, which the converter regroups as q, k, v), two LayerNorms (ln_attn -> attn_norm_2 for the
    # attention, ln_mlp -> attn_norm for the MLP)
    "falcon-40b": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True,
        parallel_attn=True, bias=False, alibi=False, layer_norm_epsilon=1e-5, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Falcon2-11B style (falcon): the new decoder architecture with num_ln_in_parallel_attn 1 (one LayerNorm feeds
    # both branches, as the 7B) and grouped kv
    "falcon-11b": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True,
        num_ln_in_parallel_attn=1, parallel_attn=True, bias=False, alibi=False, layer_norm_epsilon=1e-5,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # NVIDIA Nemotron-3 Nano 30B-A3B style (nemotron_h_moe): the block pattern M E M * E M (Mamba-2, MoE,
    # attention without rope), each block one mixer after its RMSNorm. MoE: 8 ungated squared-ReLU experts of 32,
    # sigmoid scores chosen on score + e_score_correction_bias (random: the selection bias matters), top 2,
    # renormalized (norm_topk_prob), routed_scaling_factor 2.5 (the release's), plus one ungated squared-ReLU
    # shared expert of 48; n_group 1 (the release's; the converter writes no expert_group_used_count, so llama.cpp
    # loads no grouped file). Mamba-2: 12 heads of 16 (inner 192), 2 groups, state 16, conv of 4 with bias,
    # chunk_size 8. The config goes to the converter as released (CONFIG_AS_RELEASED: the pattern string)
    "nemotron_h_moe": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        hidden_size=64, intermediate_size=96, layers_block_type=["linear_attention", "moe", "linear_attention",
                                                                 "full_attention", "moe", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=12, mamba_head_dim=16, n_groups=2,
        ssm_state_size=16, conv_kernel=4, chunk_size=8, use_conv_bias=True, use_bias=False, mlp_bias=False,
        attention_bias=False, layer_norm_epsilon=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
        n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        num_nextn_predict_layers=0, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Nemotron-3 Super style: the same with moe_latent_size 32, the routed experts run in a 32-wide latent
    # (fc1_latent_proj before them, fc2_latent_proj after; the router and the shared expert read the full width)
    "nemotron_h_moe-latent": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        hidden_size=64, intermediate_size=96, layers_block_type=["linear_attention", "moe", "full_attention",
                                                                 "linear_attention", "moe"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=12, mamba_head_dim=16, n_groups=2,
        ssm_state_size=16, conv_kernel=4, chunk_size=8, use_conv_bias=True, use_bias=False, mlp_bias=False,
        attention_bias=False, layer_norm_epsilon=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, moe_shared_expert_intermediate_size=32,
        moe_latent_size=32, n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.0, num_nextn_predict_layers=0, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # OLMo 1 (olmo; OLMo-1B/7B-0424 style): non-parametric LayerNorm (no weight, no bias), GQA (the released are
    # MHA: 2 kv heads check the converter's k permutation by n_kv_head), clip_qkv 2.0 (OLMo-1.7-7B's 8.0 scaled to
    # these activations: about a fifth of the q/k/v values clipped), SwiGLU, untied head
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False, clip_qkv=2.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Gemma 1 / CodeGemma (gemma): MQA as the 2B (one kv head), head_dim 32 != hidden / heads (as the 7B's 256 of
    # 3072 / 16), (1 + w) RMSNorms (random w around 0), the sqrt(D)-scaled embedding, GELU-tanh GeGLU, tied head;
    # rope_theta 10000: the converter writes no rope.freq_base (llama.cpp's default, the released value)
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, hidden_act="gelu_pytorch_tanh",
        attention_bias=False, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Phi-2 style (phi2): attention and MLP in parallel from one LayerNorm with bias, biases on every linear and the
    # lm head (drawn around 0: CENTERED_BIAS), partial rotary 0.5 (8 of 16 dims, NEOX), GELU-tanh MLP of 4 * hidden
    # (the converter writes feed_forward_length 4 D, head_count_kv = head_count), untied head; rope_theta 10000: the
    # converter writes no rope.freq_base
    "phi2": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        layer_norm_eps=1e-5, max_position_embeddings=256, hidden_act="gelu_new", qk_layernorm=False,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # StableLM 2 1.6B style (stablelm): LayerNorm with bias, q/k/v biases, NEOX rope on half of each head
    # (partial_rotary_factor 0.5; the released 0.25), GQA, sequential residual (post_attention_layernorm -> ffn_norm)
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, use_qkv_bias=True,
        qk_layernorm=False, use_parallel_residual=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # StableLM 2 12B style (stablelm-12b): per-head q/k LayerNorms (weight, no bias), the parallel residual (no
    # ffn_norm: the MLP reads the attention's input norm), no q/k/v biases, rope on a quarter of each head
    "stablelm-12b": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, use_qkv_bias=False,
        qk_layernorm=True, use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Nemotron-4 / Minitron style (nemotron): LayerNorm1P (y = LN(x) * (1 + w) + b; the converter stores 1 + w), the
    # ungated squared-ReLU MLP, NEOX rope on half of each head (partial_rotary_factor 0.5, the releases'), GQA, no
    # biases, untied head; a SentencePiece vocabulary (conversion/nemotron.py reads tokenizer.model only)
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # the same with attention_bias (q/k/v/o biases) and mlp_bias (up/down biases), which llama.cpp's loader takes
    # optionally, and rope on a quarter of each head
    "nemotron-bias": ("NemotronConfig", "NemotronForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Phi-3.5-MoE style (phimoe): biased norms (llama.cpp: RMSNorm + bias; the reference runs HF with llama.cpp's rules,
    # gen_arch_fixtures.LLAMACPP_RULES), q/k/v/o biases, lm head bias, 4 experts of 32, top 2 (softmax, renormalized),
    # GQA, NEOX rope without LongRoPE factors (phi3's fixture has them)
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, max_position_embeddings=256,
        attention_bias=True, lm_head_bias=True, tie_word_embeddings=False, router_jitter_noise=0.01,
        input_jitter_noise=0.0, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "original_max_position_embeddings": 256},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Mamba-1 (`mamba`, state-spaces/mamba-*-hf's form): 3 layers of x + mixer(RMSNorm(x)), no attention and no MLP;
    # the selective-scan mixer of minfer/models/mamba1.py: inner 128 = 2 * 64 (llama.cpp loads expand 2 only), state
    # 16, dt_rank 16, conv kernel 4 with bias, no in/out-projection bias; untied head. The converter writes
    # head_count 0 and feed_forward_length 0
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, state_size=16, expand=2, conv_kernel=4, time_step_rank=16,
        use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Falcon-Mamba (the converter writes arch `mamba` with ssm.dt_b_c_rms true): Mamba-1 with weightless RMSNorms on
    # dt (before dt_proj), B and C; llama.cpp uses the one layer_norm_rms_epsilon for them (HF mixer_rms_eps: set
    # equal here)
    "falcon-mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, state_size=16, expand=2, conv_kernel=4, time_step_rank=16,
        use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-6, mixer_rms_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Jamba (jamba; JambaForCausalLM, Jamba 1.5 / Mini's form): 5 layers, attention on layers 1 and 4 (attn_layer_period
    # 3, offset 1: the converter writes head_count_kv 0 on the Mamba layers), MoE on layers 1 and 3 (expert_layer_period
    # 2, offset 1), so each of mamba/attention meets both MoE and dense SwiGLU; GQA without rope; Mamba-1 mixer with
    # weighted RMSNorms on dt, B and C, inner 128 = 2 * 64, state 16, dt_rank 16, conv 4 with bias; 4 experts of 32,
    # top 2, softmax weights not renormalized; untied head
    "jamba": ("JambaConfig", "JambaForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=3,
        attn_layer_offset=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=16,
        mamba_conv_bias=True, mamba_proj_bias=False, use_mamba_kernels=False, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # DBRX style (dbrx): LayerNorms without bias, one fused Wqkv clamped to [-clip_qkv, clip_qkv] (0.3: binds on the
    # fixture's projections), GQA, NEOX rope, 4 experts of 32, top 2, softmax renormalized (L1, as released), untied head
    "dbrx": ("DbrxConfig", "DbrxForCausalLM", dict(
        d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
        attn_config={"kv_n_heads": 2, "clip_qkv": 0.3, "rope_theta": 10000.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2, "moe_normalize_expert_weights": 1.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # LG K-EXAONE style (exaone-moe): pre-norm blocks, per-head q/k norms, layers 0 and 2 sliding (window 8 < SEQ)
    # with NEOX rope, 1 and 3 global without rope (pattern 2, released 4: a global layer mid-stack, whose missing
    # rope shows in the logits), layer 0 dense (first_k_dense_replace 1), then sigmoid scores chosen on score +
    # e_score_correction_bias (randomized: zeros at init) within the best 1 of 2 groups, top-2 of 8 experts of 32,
    # renormalized, times 2.5, plus one shared expert (32); scoring_func in config.json so the converter writes
    # expert_gating_func (llama.cpp's loader requires it); Llama-3 rope factors over base 10000
    "exaone-moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, num_shared_experts=1, n_group=2,
        topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid",
        sliding_window=8, sliding_window_pattern=2, rms_norm_eps=1e-5, max_position_embeddings=1024,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # MiniCPM3-4B style (minicpm3; MiniCPM3ForCausalLM): MLA with q_lora (q_a 32, q_a_norm, q_b) and the latent kv
    # (kv_lora 24 + 8 rope dims; qk_nope 12, so keys of 20 and values of 16 = hidden / heads: the converter writes no
    # value_length, llama.cpp takes n_embd / n_head), NEOX rope on the trailing 8 dims of each head with LongRoPE
    # factors (short / long, original context 32 = max_position_embeddings: HF's attention factor 1, as the release,
    # whose converter writes no attn_factor), the embeddings times scale_emb 12, each residual branch times
    # scale_depth 1.4 / sqrt(3), the normed output times dim_model_base / hidden = 256 / 64 before the head
    # (llama.cpp's graph hard-codes 12, 1.4 and 256: the released values), an untied head (tied, the input token
    # dominates the scaled embedding and greedy repeats it); rms_norm_eps 1e-6 (HF's latent norms
    # are DeepseekV2RMSNorm at 1e-6 whatever the config, llama.cpp's take the config's eps)
    "minicpm3": ("MiniCPM3Config", "MiniCPM3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16, scale_emb=12,
        scale_depth=1.4, dim_model_base=256, rms_norm_eps=1e-6, max_position_embeddings=32, tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                         "short_factor": [1.0 + 0.05 * i for i in range(4)],
                         "long_factor": [1.0 + 1.5 * i for i in range(4)]},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Arcee Trinity style (afmoe; AfmoeForCausalLM): 4 layers, layers 0-2 sliding (window 8 < SEQ) with NEOX rope,
    # layer 3 global without rope (global_attn_every_n_layers 4, llama.cpp's default pattern and its
    # n_no_rope_layer_step 4), per-head q/k RMSNorm, the
    # attention output gated by sigmoid(W_gate h) before o_proj, pre and post norms around the attention and the
    # FFN, the embeddings times sqrt(hidden) (mup_enabled: llama.cpp's graph always scales), layer 0 dense
    # (num_dense_layers 1), then sigmoid scores chosen on score + expert_bias (randomized: zeros at init), top-2 of
    # 8 experts of 24, renormalized (route_norm: what the converter writes as expert_weights_norm; HF's router
    # always renormalizes), times route_scale 2.5, plus one shared expert (24); GQA 4 / 2, untied head
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=4, num_dense_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        num_shared_experts=1, route_scale=2.5, route_norm=True, global_attn_every_n_layers=4, sliding_window=8,
        mup_enabled=True, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Jais-2 style (jais2; Jais2ForCausalLM): LayerNorms with weight and bias (pre-attention, pre-MLP, final), q/k/v
    # and output-projection biases (attention_bias), the ungated squared-ReLU MLP with up / down biases (mlp_bias,
    # hidden_act relu2), NEOX rope over the whole head, GQA 4 / 2, untied head; biases drawn around 0
    # (CENTERED_BIAS)
    "jais2": ("Jais2Config", "Jais2ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        layer_norm_eps=1e-5, max_position_embeddings=256, attention_bias=True, mlp_bias=True,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Cohere2 MoE (cohere2moe; Cohere2MoeForCausalLM, North-Mini style): Cohere's parallel block (one norm feeds
    # attention and the MLP), here RMSNorm (rms_norm_eps set), layer 0 a dense SwiGLU of 96 (first_k_dense_replace
    # 1: full attention WITH rope, the prefix's forced rope), then sliding_window_pattern 2 on the MoE layers (1 and
    # 3 local with rope over a window of 8 < SEQ, 2 global without rope), sigmoid router (expert_selection_fn)
    # over top-2 of 8 experts of 32, renormalized (norm_topk_prob), plus one shared expert averaged with the routed
    # output ("average"), logit_scale 0.5, tied head, GQA 2:1, head_dim 16
    "cohere2moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=32, prefix_dense_intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, layer_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=True, logit_scale=0.5, sliding_window=8,
        sliding_window_pattern=2, first_k_dense_replace=1, num_experts=8, num_experts_per_tok=2,
        num_shared_experts=1, expert_selection_fn="sigmoid", norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # Cohere2 MoE, the other options: LayerNorm (no rms_norm_eps: the converter writes only layer_norm_epsilon),
    # softmax router (top-2 of 8, i.e. softmax over the chosen two), no shared expert, no dense prefix,
    # the default pattern 4 (layers 0-2 local with rope, 3 global without)
    "cohere2moe-ln": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, layer_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True, logit_scale=0.5,
        sliding_window=8, num_experts=8, num_experts_per_tok=2, num_shared_experts=0, expert_selection_fn="softmax",
        norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)),
    # IBM Granite SWA (granite_swa; GraniteSWAForCausalLM, granite-swash style): Granite's four multipliers, a learned
    # per-head attention sink on every layer (randomized: gen_arch_fixtures gives `self_attn.sinks` a spread), the
    # window of 8 < SEQ on layers 1 and 2 (layer_types), full attention on 0 and 3, layer 3 without rope
    # (layer_rope_theta 0; the converter reads no_rope_layers, which gen_arch_fixtures adds from it: NOPE_LAYERS),
    # GQA 2:1, tied head
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True, sliding_window=8,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        layer_rope_theta=[10000.0, 10000.0, 10000.0, 0], rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=1.5, attention_multiplier=0.3, residual_multiplier=0.8, logits_scaling=1.5,
        attention_bias=False, mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # IBM Granite MoE SWA (granite_swa too: GraniteMoeSWAForCausalLM converts to the same arch): granitemoe's softmax
    # top-2 of 8 experts of 32 (renormalized) with their gate/up kept fused by the converter (ffn_gate_up_exps), the
    # shared expert of 48 fused likewise (ffn_up_shexp: gate rows then up rows), the multipliers, sinks, the default
    # layer_types (layer 0 full, 1-2 sliding over 8), rope everywhere, untied head
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", dict(
        hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False, sliding_window=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, embedding_multiplier=1.5,
        attention_multiplier=0.3, residual_multiplier=0.8, logits_scaling=1.5, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # InternLM3 (InternLM3ForCausalLM, internlm3-8b style; transformers 5.25 runs it as LlamaForCausalLM, the converter
    # (conversion/internlm.py InternLM3Model) writes the arch `llama`, q/k permuted as Llama's): GQA 4:1, head_dim 24
    # != 64 / 4 (rope over the whole head), rope_theta 5e7 (the release's) with the release's dynamic-NTK scaling
    # (factor 6), which transformers applies only past max_position_embeddings (256 > SEQ) and the converter does
    # not write, no biases (qkv_bias = bias = false as released), untied head, a SentencePiece vocabulary (the
    # converter reads tokenizer.model only); config.json names InternLM3ForCausalLM as released (CONFIG_AS_RELEASED)
    "internlm3": ("InternLM3Config", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=24, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 50000000.0, "factor": 6.0}, attention_bias=False,
        mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # InternLM3 with qkv_bias = bias = true (HF: biases on q/k/v/o and on the MLP's gate/up/down; llama.cpp's llama
    # loader takes each optionally: create_tensor_qkv, wo_b, ffn_*_b)
    "internlm3-bias": ("InternLM3Config", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=True, mlp_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # OLMo 3 long-context style (olmo3-yarn; Olmo3ForCausalLM, converted as olmo2): the olmo3 fixture's layers (1-3
    # of 4 windowed over 8, the 4th global) with YaRN on the full-attention layers only (rope_parameters
    # full_attention: factor 8 over an original 16 = 128 / 8, beta 32 / 1; the window layers unscaled), HF's default
    # attention_factor 1 + 0.1 ln 8; the converter writes the full-attention entry as rope.scaling.*
    "olmo3-yarn": ("Olmo3Config", "Olmo3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, max_position_embeddings=128, tie_word_embeddings=False, sliding_window=8,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                                            "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                            "beta_slow": 1.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Tencent Hy3 (hy_v3; HYV3ForCausalLM): per-head q/k RMSNorm before NEOX rope over the whole head, GQA 4 / 2,
    # layer 0 dense (mlp_layer_types' default: the first dense), then sigmoid scores chosen on score +
    # e_score_correction_bias (a zeros buffer at init: randomized), top-2 of 8 experts of 24, renormalized, times
    # router_scaling_factor 2.5, plus one shared expert (24 = moe_intermediate_size x num_shared_experts), untied head
    "hy_v3": ("HYV3Config", "HYV3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
        router_scaling_factor=2.5, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # JetBrains Mellum 2 (mellum; MellumForCausalLM): Qwen3-MoE's attention (per-head q/k RMSNorm, NEOX rope over the
    # whole head) with the window of 8 < SEQ on layers 0-2 (layer_types) and full attention on layer 3, the rope
    # base per layer type (full 500000, sliding 10000: rope.freq_base_swa), softmax top-2 of 8 experts of 32,
    # renormalized (norm_topk_prob), every layer MoE, GQA 4 / 2, untied head
    "mellum": ("MellumConfig", "MellumForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"], rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Xiaomi MiMo-V2-Flash (mimo_v2_flash; MiMoV2FlashForCausalLM): layers 1-2 sliding over 8 < SEQ with twice the kv
    # heads (4) and a learned per-head sink, layers 0 and 3 full attention (2 kv heads, no sinks), q/k head 24 and v
    # head 16 (head_dim != v_head_dim), NEOX rope on 8 of 24 dims (partial_rotary_factor 0.334, as released) with the
    # base per layer type (full 5e6, sliding 1e4), the attention output times attention_value_scale 0.707, no q/k
    # norms, layer 0 dense (mlp_layer_types' default), then sigmoid scores chosen on score + e_score_correction_bias
    # (randomized), top-2 of 8 experts of 24, renormalized, times routed_scaling_factor (1.0 as released: the
    # converter writes no scale), no shared expert; untied head; config.json as released (CONFIG_AS_RELEASED)
    "mimo_v2_flash": ("MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
        topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, sliding_window=8, attention_value_scale=0.707,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.334}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # poolside Laguna (laguna; LagunaForCausalLM, XS.2 style): layer 0 full attention with 4 query heads and NEOX rope
    # on 8 of 16 dims (partial_rotary_factor 0.5, base 500000), layers 1-3 sliding over 8 < SEQ with 8 query heads
    # and rope on all 16 (base 10000) -- the converter writes no window pattern, llama.cpp's dense-first default 4
    # is this layout; 2 kv heads everywhere, per-head q/k RMSNorm, the attention output times softplus(g_proj h)
    # per head (gating True), layer 0 dense, then sigmoid scores chosen on score + e_score_correction_bias
    # (randomized), top-2 of 8 experts of 24, renormalized, times moe_routed_scaling_factor 2.5, plus the shared
    # expert of 32; untied head
    "laguna": ("LagunaConfig", "LagunaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_attention_heads_per_layer=[4, 8, 8, 8], num_key_value_heads=2,
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_routed_scaling_factor=2.5, gating=True,
        sliding_window=8, layer_types=["full_attention"] + ["sliding_attention"] * 3, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 1.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Laguna, M.1 style: every layer full attention (sliding_window 0: the converter writes no key), 4 query heads each, the per-element
    # softplus gate (gating "per-element"), rope on 8 of 16 dims; otherwise the laguna fixture's
    "laguna-elem": ("LagunaConfig", "LagunaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, moe_routed_scaling_factor=2.5, gating="per-element", sliding_window=0,
        layer_types=["full_attention"] * 3, rms_norm_eps=1e-6, max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Laguna-XS.2's long-context rope: the laguna fixture's layout with YaRN on the full layer only (rope_parameters
    # full_attention: factor 8 over an original 16 = 128 / 8, beta 32 / 1, on its 8 rotated dims of 16; HF's default
    # attention_factor 1 + 0.1 ln 8 on cos / sin); the window layers unscaled
    "laguna-yarn": ("LagunaConfig", "LagunaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_attention_heads_per_layer=[4, 8, 8, 8], num_key_value_heads=2,
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_routed_scaling_factor=2.5, gating=True,
        sliding_window=8, layer_types=["full_attention"] + ["sliding_attention"] * 3, rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "partial_rotary_factor": 0.5,
                                            "factor": 8.0, "original_max_position_embeddings": 16,
                                            "beta_fast": 32.0, "beta_slow": 1.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 1.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Mellum 2's layer-selective YaRN: the mellum fixture's layout with YaRN on the full layer (rope_parameters
    # full_attention: factor 8 over an original 16 = 128 / 8, beta 32 / 1; HF's default attention_factor 1 + 0.1 ln 8),
    # the window layers unscaled
    "mellum-yarn": ("MellumConfig", "MellumForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"], rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                                            "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                            "beta_slow": 1.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Mistral Small 4 style (mistral4; Mistral4ForCausalLM): deepseek2's MLA with q_lora 32 (q_a, q_a_norm, q_b),
    # kv_lora 24 + 8 rope dims (interleaved: NORM), qk_nope 16, v_head 20; layer 0 dense, layers 1-2 top-2 of 8
    # softmax experts in 2 of 4 groups (a group by its two best scores), renormalized, times 1.5, plus one shared
    # expert; the release's YaRN (mscale = mscale_all_dim 1) at factor 16 over an original 16 < SEQ (the ramp and
    # mscale both matter); llama_4_scaling_beta 0 (HF's q temperature off: llama.cpp's HF converter for mistral4
    # writes no attention.temperature_* key, so a file carries none and runs without it, as in llama.cpp)
    "mistral4": ("Mistral4Config", "Mistral4ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=20, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2,
        first_k_dense_replace=1, routed_scaling_factor=1.5, norm_topk_prob=True, rope_interleave=True,
        rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 16, "llama_4_scaling_beta": 0.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # GLM-4-9B-chat-hf / glm-edge style (chatglm; GlmForCausalLM): Llama's pre-norm block without GLM-4-0414's
    # post-norms, q/k/v biases (attention_bias), no o bias, GQA 2:1 (the 9B: 32 q / 2 kv heads), NORM rope
    # (interleaved pairs) on the first half of each head (partial_rotary_factor 0.5: 8 of 16 dims), the fused
    # [gate; up] MLP (gate_up_proj), untied head. rope_theta 10000: llama.cpp's ChatGLMModel writes
    # 10000 * rope_ratio and never reads rope_theta; head_dim = hidden / heads (the converter's rope dims assume it)
    "chatglm": ("GlmConfig", "GlmForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, attention_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Mixtral-8x7B / 8x22B style (llama, with llama.expert_count; MixtralForCausalLM): Llama attention (GQA 2:1, NORM
    # rope after the converter's q/k permutation, rope_theta 1e6 as the released), every FFN a top-2 of 8 softmax MoE
    # renormalized over the two (HF MixtralSparseMoeBlock; llama.cpp src/models/llama.cpp build_moe_ffn norm_w true),
    # SwiGLU experts of intermediate_size 32 (the converter writes it as feed_forward_length), no sliding window
    # (the 8x7B config's null), untied head
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0, sliding_window=None, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
}
