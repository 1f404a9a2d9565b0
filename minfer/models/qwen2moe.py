"""Qwen1.5-MoE / Qwen2-MoE (Qwen2-57B-A14B): the GGUF arch `qwen2moe`.

Qwen3-MoE's computation (minfer/models/qwen3moe.py) with these differences (llama.cpp
src/models/qwen2moe.cpp; HF Qwen2MoeSparseMoeBlock; conversion/qwen.py Qwen2MoeModel):
- attention is Qwen2's: q/k/v biases, no q/k norms, NEOX rope;
- the top-k expert weights are NOT renormalized (build_moe_ffn(..., norm_w = false); HF's
  norm_topk_prob defaults to False and the converter writes no key for it);
- a shared expert runs on every token, scaled by a sigmoid gate:
      ffn(h) = moe(h) + sigmoid(w_g . h) * W_down_s(silu(W_gate_s h) * W_up_s h)
  w_g = blk.N.ffn_gate_inp_shexp.weight (D,), the shared expert's matrices blk.N.ffn_{gate,up,down}_shexp
  with F_s = `qwen2moe.expert_shared_feed_forward_length` (llama.cpp: n_ff when absent).
"""

from __future__ import annotations

import torch

from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel
from minfer.weights import load_qweight, load_vector


class Qwen2MoeModel(Qwen3MoeModel):
    arch = "qwen2moe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_QWEN2MOE -> NEOX
    qk_norm = False
    qkv_bias = True
    weights_norm = False      # src/models/qwen2moe.cpp: build_moe_ffn(..., norm_w = false, ...)

    @classmethod
    def load_shared(cls, gf, cfg, e: MoeBlock, i: int, device, dtype) -> None:
        p, D = f"blk.{i}.", cfg.d_model
        Fs = cfg.expert_shared_ffn or cfg.ffn
        e.gate_inp_shexp = load_vector(gf, p + "ffn_gate_inp_shexp.weight", device, D)
        e.gate_shexp = load_qweight(gf, p + "ffn_gate_shexp.weight", device, (Fs, D), dtype=dtype)
        e.up_shexp = load_qweight(gf, p + "ffn_up_shexp.weight", device, (Fs, D), dtype=dtype)
        e.down_shexp = load_qweight(gf, p + "ffn_down_shexp.weight", device, (D, Fs), dtype=dtype)

    def ffn(self, h: torch.Tensor, e: MoeBlock, ctx) -> torch.Tensor:
        routed = super().ffn(h, e, ctx)                                              # (T, D)
        gate = torch.sigmoid(h.float() @ e.gate_inp_shexp.float())[:, None]         # (T, 1)
        return (routed.float() + gate * self.shared_expert(h, e, ctx).float()).to(h.dtype)
