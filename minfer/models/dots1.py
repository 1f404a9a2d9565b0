"""rednote dots.llm1 (base, inst; HF Dots1ForCausalLM): the GGUF arch `dots1`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l:
        q, k = rope(qn(W_q n(x))), rope(kn(W_k n(x)))                   n = RMSNorm(attn_norm); qn, kn per head
        x = x + W_o attn(q, k, W_v n(x))
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)

Qwen3's attention around DeepSeek-V3's MoE. Each rule and its source (llama.cpp src/models/dots1.cpp:
load_arch_hparams, load_arch_tensors, the graph; conversion/dots1.py Dots1Model (Qwen2MoeModel's, with
first_k_dense_replace, n_shared_experts, routed_scaling_factor, norm_topk_prob written; n_group,
topk_group and scoring_func by conversion/base.py); HF transformers models/dots1 = Qwen3Attention +
DeepseekV3MoE / DeepseekV3TopkRouter):
- Per-head q/k RMSNorm (both required) before rope, NEOX rope over the whole head (llama_model_rope_type:
  LLM_ARCH_DOTS1 -> NEOX), scale 1/sqrt(head_dim). llama.cpp's loader sizes K and V by head_count (the
  released models have as many kv heads as heads); minfer takes either. q/k/v biases optional as in
  create_tensor_qkv (the released models have none).
- The FFN's norm is `ffn_norm` (LLM_TENSOR_FFN_NORM; glm4moe's is post_attention_norm).
- The first leading_dense_block_count layers: a SwiGLU MLP of feed_forward_length; the others the MoE of
  glm4moe.py (build_moe_ffn): p = sigmoid(W_r h) (expert_gating_func 2, the converter writes it from
  scoring_func), choice on p + exp_probs_b.bias within the expert_group_used_count best of
  expert_group_count groups (each scored by its two best), weights p[top], renormalized when
  expert_weights_norm, times expert_weights_scale (HF routed_scaling_factor), plus the shared expert of
  width expert_feed_forward_length * expert_shared_count (required here: dots1.cpp loads the shexp
  tensors with flag 0). The selection bias is optional (TENSOR_NOT_REQUIRED): without it the choice is on p.
- Absent keys: expert_gating_func -> sigmoid (HF's only scoring; llama.cpp has no default for dots1),
  expert_weights_norm -> false, expert_weights_scale -> 1 (llama.cpp's defaults, HF's config defaults).
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.glm4moe import Glm4MoeModel


class Dots1Model(Glm4MoeModel):
    arch = "dots1"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_DOTS1 -> NEOX
    ffn_norm_tensor = "ffn_norm.weight"
    qk_norm_required = True
    select_bias_optional = True         # dots1.cpp: ffn_exp_probs_b TENSOR_NOT_REQUIRED

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Dots1Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.expert_shared_count <= 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_shared_count={cfg.expert_shared_count}: expected > 0 "
                              "(dots1's MoE layers always have the shared expert)")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
