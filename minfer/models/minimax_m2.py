"""MiniMax-M2 (HF MiniMaxM2ForCausalLM): the GGUF arch `minimax-m2`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l:
        q, k = qn(W_q n(x)), kn(W_k n(x))          n = RMSNorm(attn_norm); qn, kn over the WHOLE projection
        x = x + W_o attn(rope(q), rope(k), W_v n(x))                    rope on the first n_rot dims of each head
        x = x + moe(RMSNorm(x; ffn_norm))
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/minimax-m2.cpp: load_arch_hparams, load_arch_tensors, the
graph; conversion/minimax.py MiniMaxM2Model; HF transformers models/minimax_m2):
- q/k RMSNorm over the whole projection before the split into heads (load_arch_tensors: attn_q_norm of
  n_embd_head_k * n_head, attn_k_norm of n_embd_k_gqa; the graph's build_norm before ggml_reshape_3d; HF
  MiniMaxM2Attention = FlexOlmoAttention's q_norm / k_norm): olmo2.py whole_qk_norm_attention.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_MINIMAX_M2 -> NEOX) on the first rope.dimension_count dims of
  each head (the converter writes rotary_dim: 64 of 128 released; HF partial_rotary_factor), the rest passed
  through; scale 1/sqrt(head_dim). No biases (build_attn with no wo_b).
- Every layer's FFN is a MoE, no shared expert (build_moe_ffn; HF MiniMaxM2SparseMoeBlock /
  MiniMaxM2TopKRouter):
      p = sigmoid(W_r h) (expert_gating_func 2, which the converter writes from scoring_func; sigmoid when
          absent: HF's only scoring, llama.cpp has no default), choice: the K largest p + exp_probs_b.bias
          (required: load_arch_tensors flag 0; HF e_score_correction_bias), weights p[top] / sum(p[top])
          (norm_w true, hard-coded: a file's expert_weights_norm is not read), no scale (the graph passes
          expert_weights_scale, which minimax-m2 never loads).
  The experts are feed_forward_length wide (load_arch_tensors {n_embd, n_ff, n_expert}; HF Mixtral experts of
  intermediate_size; the converter writes intermediate_size as both lengths), so a file whose
  expert_feed_forward_length differs is refused. ops.moe_ffn on both backends.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.glm4moe import Glm4MoeBlock
from minfer.models.layers import Block
from minfer.models.olmo2 import whole_qk_norm_attention
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel
from minfer.weights import load_vector

_REFUSED_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


class MinimaxM2Model(Qwen3MoeModel):
    """Block.attn_q_norm / attn_k_norm hold the whole-projection vectors (H*Dh,), (Hkv*Dh,); self.moe the
    routers and experts with their selection biases (Glm4MoeBlock)."""

    arch = "minimax-m2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_MINIMAX_M2 -> NEOX
    qk_norm = False           # loaded below: whole projection, not per head
    weights_norm = True       # minimax-m2.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...)
    expert_gatings = ("sigmoid", "softmax")   # build_moe_ffn takes the file's expert_gating_func
    expert_keys = ("expert_count", "expert_used_count")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # load_arch_tensors: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MinimaxM2Model":
        from dataclasses import replace

        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cls.arch
        for suffix in _REFUSED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {a} "
                                      "(llama.cpp's minimax-m2 graph has no attention biases)")
        if cfg.expert_ffn and cfg.expert_ffn != cfg.ffn:
            raise MinferError(f"{gf.path}: {a}.expert_feed_forward_length={cfg.expert_ffn} differs from "
                              f"{a}.feed_forward_length={cfg.ffn} (llama.cpp sizes the experts by the latter, "
                              "transformers by intermediate_size: not supported)")
        if f"{a}.expert_gating_func" not in gf.metadata:
            cfg = replace(cfg, expert_gating="sigmoid")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True     # hard-coded in the graph, whatever the file says
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        E = cfg.n_experts
        for i, blk in enumerate(m.blocks):
            blk.attn_q_norm = load_vector(gf, f"blk.{i}.attn_q_norm.weight", device, q_out)     # (H*Dh,)
            blk.attn_k_norm = load_vector(gf, f"blk.{i}.attn_k_norm.weight", device, kv_out)    # (Hkv*Dh,)
            e = m.moe[i]
            m.moe[i] = Glm4MoeBlock(gate_inp=e.gate_inp, gate_exps=e.gate_exps, up_exps=e.up_exps,
                                    down_exps=e.down_exps,
                                    exp_probs_b=load_vector(gf, f"blk.{i}.exp_probs_b.bias", device, E))
        return m

    def ffn(self, h: torch.Tensor, e: MoeBlock, ctx) -> torch.Tensor:
        """The routed experts of the normed input h (T, D) -> (T, D)."""
        c = self.cfg
        return ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, c.n_experts_used, self.weights_norm,
                           ctx, gating=c.expert_gating, select_bias=e.exp_probs_b)

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        return whole_qk_norm_attention(h, blk, self.cfg, i, cache, step, self.cfg.rope, ctx)
