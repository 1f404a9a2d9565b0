"""OLMoE (OLMoE-1B-7B and its instruct versions): the GGUF arch `olmoe`.

    x_0 = E[tokens]                                    token_embd (V, D); output (V, D), untied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        q = qn(W_q h), k = kn(W_k h), v = W_v h          qn, kn: RMSNorm over the WHOLE projection
        x = x + W_o attn(rope(q), rope(k), v)
        x = x + moe(RMSNorm(x; ffn_norm))
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/olmoe.cpp; HF modeling_olmoe):
- Pre-norm blocks as Llama's (attn_norm, ffn_norm), not OLMo 2's post-norms (olmoe.cpp
  build_norm(inpL, attn_norm) before attention, build_norm(ffn_inp, ffn_norm) before the MoE;
  HF OlmoeDecoderLayer: input_layernorm, post_attention_layernorm as pre-norms).
- q/k norms over the whole projection before the split into heads, as OLMo 2's (olmoe.cpp:
  build_norm on Qcur/Kcur, then ggml_reshape_3d; load_arch_tensors: attn_q_norm and attn_k_norm
  of n_embd; HF OlmoeAttention: q_norm = OlmoeRMSNorm(hidden_size), k_norm over
  (hidden_size // heads) * kv_heads). models/olmo2.py whole_qk_norm_attention.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_OLMOE -> NEOX), scale 1/sqrt(head_dim), no biases.
- The MoE: softmax over the router's logits (ffn_gate_inp), the top `expert_used_count`, their
  weights NOT renormalized (olmoe.cpp build_moe_ffn(..., LLM_FFN_SILU, norm_w = false, ...,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF OlmoeSparseMoeBlock with the released
  norm_topk_prob false; the converter writes no key for it, a file's expert_weights_norm is
  obeyed as for qwen3moe), each expert a SwiGLU of width `olmoe.feed_forward_length`
  (load_arch_tensors: ffn_*_exps {n_embd, n_ff, n_expert}; no expert_feed_forward_length).
  A `olmoe.expert_weights_scale` other than 0 or 1 is refused (build_moe_ffn would scale).
- HF's optional clip_qkv (clamping q/k/v) has no GGUF key and no place in olmoe.cpp; the released
  config has none.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.models.base import Step
from minfer.models.layers import Block, each_block, refuse_expert_weights_scale
from minfer.models.olmo2 import whole_qk_norm_attention
from minfer.models.qwen3moe import Qwen3MoeModel


class OlmoeModel(Qwen3MoeModel):
    """Block.attn_q_norm / attn_k_norm hold the whole-projection vectors (H*Dh,), (Hkv*Dh,)."""

    arch = "olmoe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_OLMOE -> NEOX
    qk_norm = False           # loaded below: whole projection, not per head
    weights_norm = False      # olmoe.cpp: build_moe_ffn(..., norm_w = false, ...)
    expert_keys = ("expert_count", "expert_used_count")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # olmoe.cpp load_arch_tensors: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "OlmoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        refuse_expert_weights_scale(gf, "olmoe")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        for t, blk in each_block(gf, cfg, m.blocks, device, dtype):
            blk.attn_q_norm = t.v("attn_q_norm.weight", t.q_out)      # (H*Dh,)
            blk.attn_k_norm = t.v("attn_k_norm.weight", t.kv_out)     # (Hkv*Dh,)
        return m

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        return whole_qk_norm_attention(h, blk, self.cfg, i, cache, step, self.cfg.rope, ctx)
