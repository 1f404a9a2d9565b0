"""Mistral Small 4 (Mistral4ForCausalLM): the GGUF arch `mistral4`.

llama.cpp runs it with deepseek2's graph and hparams (src/models/models.h: llama_model_mistral4
derives from llama_model_deepseek2; src/models/mistral4.cpp builds deepseek2's graph class;
llama_model_rope_type: LLM_ARCH_MISTRAL4 -> NORM, as deepseek2), and its converter is deepseek2's
(conversion/mistral3.py Mistral4Model(DeepseekV2Model): the same keys under `mistral4.`, the
experts already stacked). So this is deepseek2.py's model under another name:
    multi-head latent attention with the low-rank q (attn_q_a, attn_q_a_norm, attn_q_b), the normed
    kv latent (attn_kv_a_mqa, attn_kv_a_norm), attn_k_b / attn_v_b, in the absorbed form over the
    latent cache; NORM rope (HF rope_interleave, adjacent pairs) on the trailing rope dims;
    YaRN (the release: factor 128 over an original 8192, mscale = mscale_all_dim 1) with
    deepseek2's mscale rules (rope.scaling.yarn_log_multiplier = 0.1 mscale_all_dim);
    leading dense layers, then softmax-scored experts (HF Mistral4TopkRouter: softmax, groups by
    their two best scores, top-k, renormalized when norm_topk_prob -> expert_weights_norm, times
    routed_scaling_factor -> expert_weights_scale) plus shared experts.

HF's Mistral4Attention also multiplies q by Llama-4's attention temperature 1 + beta ln(1 +
floor(pos / original_max_position_embeddings)) (rope_parameters llama_4_scaling_beta, 0.1 in the
release): 1 below the original context (8192 released). llama.cpp's HF converter for mistral4
writes no attention.temperature_* keys (only its ministral3 path does), so its files run without
it, as llama.cpp does; a file that does carry attention.temperature_scale / temperature_length
is refused by name (deepseek2.py's rule), not run without the factor.
"""

from __future__ import annotations

from minfer.models.deepseek2 import Deepseek2Model


class Mistral4Model(Deepseek2Model):
    arch = "mistral4"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_MISTRAL4 -> NORM
