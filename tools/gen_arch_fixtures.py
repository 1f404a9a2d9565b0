"""Make the architecture fixtures in tests/data/arch/: tiny random Hugging Face models, converted
to GGUF by llama.cpp's own converter, with transformers' float32 logits and greedy continuations.

    pip install transformers            # a tool dependency only: CI reads the committed fixtures
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/arch
    python tools/gen_arch_fixtures.py --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp

For each architecture (ARCHS below) this writes, under tests/data/arch/:
  <name>.gguf        convert_hf_to_gguf.py --outtype f16 of the random model. The random 2-D
                     weights are rounded to float16 before anything else, so the f16 file holds
                     exactly the weights transformers ran (norms and rope factors stay f32).
  <name>.npz         ids (T,) and logits (T, V) float32: transformers' forward of every position;
                     prompt (P,) and greedy (N,): generate(do_sample=False) after the prompt;
                     for phi3 also ids_long / logits_long (a sequence past the original context,
                     where its long rope factors apply).
  <name>.json        the HF config used (for the record) and the transformers version.

The vocabulary is a tiny byte-level BPE (a few hundred tokens) trained here with `tokenizers`.
llama.cpp's converter names the pre-tokenizer by hashing how a tokenizer splits a fixed text and
refuses a hash it does not know; this tokenizer is new, so the converter is run with
get_vocab_base_pre patched to answer 'gpt-2' (the architectures, not the tokenizer, are under test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
VOCAB = 320
EXTRA_SPECIALS = {"glm4": ("<|endoftext|>", "<|user|>"),   # conversion/glm.py Glm4Model.set_vocab looks them up
                  "glm4moe": ("<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>")}   # _set_vocab_glm
SPM = {"ernie4_5", "ernie4_5-moe", "ernie4_5-moe-step2"}     # converters that take a SentencePiece model only (make_spm_tokenizer)
# biases drawn around 0, not around 1 as the other 1-D parameters (norm weights): qwen2vl's q/k/v biases of
# ~1 made one token win everywhere
CENTERED_BIAS = {"qwen2vl", "starcoder2"}
SEQ = 40          # tokens of the logits reference (past gemma3's sliding window of 8)
PROMPT, NEW = 8, 16

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
# transformers 5 saves layer_types as "linear_attention" / "full_attention"; llama.cpp's converter
# (conversion/granite.py GraniteHybridModel.get_attn_layers) takes the released names "mamba" / "attention"
LAYER_TYPES_AS_RELEASED = {"granitehybrid", "granitehybrid-dense"}


def nemotron_h_as_released(c: dict) -> dict:
    """NemotronHConfig (transformers 5) saves the block pattern as layers_block_type, a list whose MLP blocks are
    "mlp"; llama.cpp's converter (conversion/nemotron.py NemotronHModel) counts only "moe" as an MLP block in a
    list and reads the released configs' hybrid_override_pattern string ("M", "-", "*", "E") as written. The
    released config, read as config.json (raw_config below: transformers' AutoConfig would turn the string back
    into the list)."""
    marks = {"linear_attention": "M", "mlp": "-", "full_attention": "*", "moe": "E"}
    pattern = "".join(marks[t] for t in c.pop("layers_block_type"))
    c.pop("layer_types", None)
    if "E" not in pattern:      # a dense release carries no MoE keys (the converter takes num_experts_per_tok as MoE)
        for k in [k for k in c if k.startswith(("moe_", "n_routed", "n_shared", "num_experts", "mtp_", "num_nextn"))
                  or k in ("routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob")]:
            del c[k]
    return {**c, "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}


def exaone_as_released(c: dict) -> dict:
    """ExaoneConfig (transformers 5) saves the Llama names and LlamaForCausalLM; the released config.json
    (EXAONE-3.5) names ExaoneForCausalLM, which llama.cpp's converter registers, and activation_function, which
    conversion/exaone.py ExaoneModel asserts is silu (transformers' AutoConfig would drop the alias)."""
    return {**c, "architectures": ["ExaoneForCausalLM"], "activation_function": c["hidden_act"]}

# the Qwen3.5 / Qwen3-Next converters (conversion/qwen.py _QwenMtpMixin) expect MTP tensors unless told there are none
NO_MTP = {"qwen35", "qwen35moe", "qwen3next"}
# transformers loads the tokenizer of model_type qwen3_5_moe_text as Qwen3_5Tokenizer, which adds <|endoftext|>
# past the vocabulary unless it is there
EXTRA_SPECIALS["qwen35moe"] = ("<|endoftext|>",)
EXTRA_SPECIALS["qwen3next"] = ("<|endoftext|>",)

# configs rewritten to the released form, then read by the converter from config.json as written
CONFIG_AS_RELEASED = {"nemotron_h": nemotron_h_as_released, "exaone": exaone_as_released}

# transformers 5 keeps Qwen3-VL-MoE's packed experts as gate_up_proj (E, 2F, D), down_proj (E, D, F) and saves
# them so; the released checkpoints (and llama.cpp's converter, conversion/qwen3vl.py
# Qwen3VLMoeTextModel.modify_tensors) have them transposed: (E, D, 2F), (E, F, D) (transformers'
# conversion_mapping.py "qwen3_vl_moe": Transpose(1, 2) on load)
EXPERTS_AS_RELEASED = {"qwen3vlmoe"}


def experts_as_released(model_dir: Path) -> None:
    """Transpose the saved packed expert tensors to the released checkpoints' layout (in place)."""
    from safetensors.torch import load_file, save_file

    for f in model_dir.glob("*.safetensors"):
        ts = load_file(f)
        for k in ts:
            if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                ts[k] = ts[k].transpose(1, 2).contiguous()
        save_file(ts, f, metadata={"format": "pt"})


def make_tokenizer(path: Path, extra_specials=()) -> None:
    """A byte-level BPE of VOCAB tokens (ids 0-2 special, then extra_specials) saved as a
    transformers tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") + "\n") * 2
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=VOCAB, min_frequency=2,
                            special_tokens=["<pad>", "<s>", "</s>", *extra_specials], show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def make_spm_tokenizer(path: Path) -> None:
    """A SentencePiece BPE of VOCAB pieces (tokenizer.model), for converters that read only that
    (llama.cpp conversion/ernie.py: _set_vocab_sentencepiece)."""
    import io

    import sentencepiece as spm

    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") + "\n") * 2
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=buf, vocab_size=VOCAB,
                                   model_type="bpe", byte_fallback=False, character_coverage=0.98,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (path / "tokenizer.model").write_bytes(buf.getvalue())


def randomize(model, seed: int, centered_bias: bool = False) -> None:
    """Weights large enough that the logits are far from uniform (greedy has clear winners),
    norm weights away from their identity value (so a missed +1 or a skipped norm shows), and
    every float rounded to float16 (so the f16 GGUF holds exactly what transformers runs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:        # RMSNorm weights (gemma3 stores w with y = x * (1 + w))
                cls = type(model).__name__.lower()
                # gemma4 and gemma3n: y = x * w (gemma3n's altup correct_output_scale too: ones around 1)
                base = 0.0 if "gemma" in cls and "gemma4" not in cls and "gemma3n" not in cls else 1.0
                if centered_bias and name.endswith(".bias"):
                    base = 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))
            if name.endswith("self_attn.sinks"):     # gpt-oss: sinks spread around the scores' scale
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            if name.endswith("experts.gate_up_proj"):  # gpt-oss: gate/up values past the clamp at 7
                p.mul_(6.0)
            if name.endswith("e_score_correction_bias"):   # ernie4_5-moe's selection bias (a parameter there)
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):   # glm4moe's selection bias: a zeros buffer at init
                b.copy_((0.3 * torch.randn(b.shape, generator=g)).half().float())
            if name.endswith("feed_forward.expert_bias"):  # lfm2moe's selection bias: a zeros buffer at init
                b.copy_((0.3 * torch.randn(b.shape, generator=g)).half().float())
            if name.endswith("layer_scalar"):             # gemma4's per-layer output scale: ones at init
                b.copy_((0.5 + torch.rand(b.shape, generator=g)).half().float())
            if name.endswith("act_fn.beta"):              # apertus's xIELU beta: 0.5 at init; one per layer here
                b.copy_((0.3 + 0.4 * torch.rand(b.shape, generator=g)).half().float())


def convert(model_dir: Path, out: Path, llamacpp: Path, raw_config: bool = False, no_mtp: bool = False) -> None:
    """llama.cpp's convert_hf_to_gguf.py with its own gguf-py, in a child process. raw_config: the
    converter reads config.json as written (what its load_hparams falls back to where transformers
    does not know the model type) instead of transformers' AutoConfig.to_dict()."""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(llamacpp)!r}, {str(llamacpp / 'gguf-py')!r}]\n"
        "import conversion.base as base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        + ("import json\n"
           "base.ModelBase.load_hparams = staticmethod(lambda d, is_mistral_format=False: json.loads((d / 'config.json').read_text()))\n"
           if raw_config else "") +
        # Gemma2Model reads a sentencepiece tokenizer.model only; ours is a byte-level BPE
        "import conversion.gemma as gemma\n"
        "gemma.Gemma2Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        "gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        # HunYuanMoEModel.set_vocab reads a tiktoken tokenizer's mergeable_ranks only
        "import conversion.hunyuan as hunyuan\n"
        "hunyuan.HunYuanMoEModel.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        "import convert_hf_to_gguf as c\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(model_dir)!r}, '--outfile', {str(out)!r}, '--outtype', 'f16']" + (" + ['--no-mtp']" if no_mtp else "") + "\n"
        "c.main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=llamacpp)
    if r.returncode:
        raise SystemExit(f"conversion of {model_dir} failed:\n{r.stderr[-4000:]}")


def reference(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def build(name: str, llamacpp: Path, seed: int) -> None:
    import torch
    import transformers

    cfg_name, cls_name, kw = ARCHS[name]
    torch.manual_seed(seed)
    if "text_config" in kw:      # a vision-language model: the vocabulary is the text model's
        kw = {**kw, "text_config": {**kw["text_config"], "vocab_size": VOCAB}}
        cfg = getattr(transformers, cfg_name)(**kw)
    else:
        cfg = getattr(transformers, cfg_name)(vocab_size=VOCAB, **kw)
    model = getattr(transformers, cls_name)(cfg).float().eval()
    randomize(model, seed, centered_bias=name in CENTERED_BIAS)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        model.save_pretrained(d, safe_serialization=True)
        make_tokenizer(d, EXTRA_SPECIALS.get(name, ()))
        if name in SPM:
            make_spm_tokenizer(d)
        if name.startswith("phi3"):   # llama.cpp's Phi3 converter takes a byte-level BPE only under this class name
            tc = json.loads((d / "tokenizer_config.json").read_text())
            tc["tokenizer_class"] = "GPT2Tokenizer"
            (d / "tokenizer_config.json").write_text(json.dumps(tc))
        if name in LAYER_TYPES_AS_RELEASED:
            c = json.loads((d / "config.json").read_text())
            names = {"linear_attention": "mamba", "full_attention": "attention"}
            c["layer_types"] = [names.get(t, t) for t in c["layer_types"]]
            (d / "config.json").write_text(json.dumps(c))
        if name in CONFIG_AS_RELEASED:
            c = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps(CONFIG_AS_RELEASED[name](c)))
        if name in EXPERTS_AS_RELEASED:
            experts_as_released(d)
        convert(d, OUT / f"{name}.gguf", llamacpp, raw_config=name in CONFIG_AS_RELEASED,
                no_mtp=name in NO_MTP)

    rng = np.random.default_rng(seed)
    seq_len = 24 if name.startswith("phi3") else SEQ   # phi3: inside the original context (short factors)
    ids = rng.integers(3, VOCAB, size=seq_len).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(model, ids)}
    if name.startswith("phi3"):  # past original_max_position_embeddings: transformers switches to long factors
        ids_long = rng.integers(3, VOCAB, size=48).tolist()
        arrays["ids_long"] = np.array(ids_long, dtype=np.int64)
        arrays["logits_long"] = reference(model, ids_long)
    if name == "starcoder2":   # the same weights with a window of 8 (HF reads config.sliding_window per call)
        model.config.sliding_window = 8
        arrays["logits_window8"] = reference(model, ids)
        model.config.sliding_window = None
    prompt = ids[:PROMPT]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                             pad_token_id=0, eos_token_id=None)
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = out[0, PROMPT:].numpy().astype(np.int64)
    if name == "llama4":   # chunk 8 and temperature floor 4 (released: 8192 both, llama.cpp's constants)
        model.config.attention_chunk_size = 8
        for layer in model.model.layers:
            layer.self_attn.floor_scale = 4
        arrays["logits_local"] = reference(model, ids)
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                 pad_token_id=0, eos_token_id=None)
        arrays["greedy_local"] = out[0, PROMPT:].numpy().astype(np.int64)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    (OUT / f"{name}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": cls_name, "seed": seed,
        "config": json.loads(cfg.to_json_string())}, indent=1, sort_keys=True) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{name}: {(OUT / f'{name}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 logit gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp", required=True, type=Path,
                    help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    ap.add_argument("--only", nargs="*", choices=sorted(ARCHS), help="some architectures only")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in a.only or ARCHS:
        build(name, a.llamacpp.resolve(), a.seed)


if __name__ == "__main__":
    main()
