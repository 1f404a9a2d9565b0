"""Qwen3.5 MoE (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B language models): the GGUF arch `qwen35moe`.

Qwen3.5's layers (models/qwen35.py: gated DeltaNet linear attention, gated full attention, the
recurrent state and its engine rules) with a mixture of experts in place of the dense MLP, in every
layer (llama.cpp src/models/qwen35moe.cpp build_layer_ffn; HF modeling_qwen3_5_moe
Qwen3_5MoeSparseMoeBlock; the converter conversion/qwen.py Qwen3_5MoeTextModel <- Qwen2MoeModel):

    ffn(n) = sum_{e in top-k} w_e W_down_e(silu(W_gate_e n) * W_up_e n) + sigmoid(w_s . n) * shexp(n)

- Routing: softmax over `expert_count` router logits (ffn_gate_inp), the top `expert_used_count`,
  their weights renormalized to sum 1 (build_moe_ffn(..., LLM_FFN_SILU, norm_w = true, ...,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF `router_top_value /= router_top_value.sum(...)`, always).
  Experts of `expert_feed_forward_length` (ffn_{gate,up,down}_exps).
- The shared expert: a SwiGLU of `expert_shared_feed_forward_length` (ffn_{gate,up,down}_shexp) times
  sigmoid(ffn_gate_inp_shexp . n), one value per token (qwen35moe.cpp `shared_expert_gate`; HF
  shared_expert_gate), added to the routed sum: qwen2moe.py's Qwen2MoeModel.ffn.
- The files carry no `feed_forward_length` (the converter writes the expert widths only): the class
  declares ffn_key_optional, read by ModelConfig.
- An `expert_weights_scale` other than 0 or 1 is refused by name (the converter writes none; llama.cpp
  would scale the routed sum by it).
"""

from __future__ import annotations

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.qwen35 import Qwen35Model


class Qwen35MoeModel(Qwen35Model):
    arch = "qwen35moe"
    has_experts = True
    ffn_key_optional = True
    weights_norm = True       # qwen35moe.cpp build_moe_ffn(..., norm_w = true, ...)
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length",
                   "expert_shared_feed_forward_length")

    @classmethod
    def check_experts(cls, gf, cfg: ModelConfig) -> None:
        for key in cls.expert_keys:
            if f"{cfg.arch}.{key}" not in gf.metadata:
                raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.{key}' is missing "
                                  f"(needed to build the {cfg.arch} model)")
        E, k = cfg.n_experts, cfg.n_experts_used
        if E <= 0 or not 0 < k <= E or cfg.expert_ffn <= 0 or cfg.expert_shared_ffn <= 0:
            raise MinferError(f"{gf.path}: {cfg.arch}.expert_count={E}, expert_used_count={k}, "
                              f"expert_feed_forward_length={cfg.expert_ffn}, expert_shared_feed_forward_length="
                              f"{cfg.expert_shared_ffn}: expected 0 < used <= count and positive lengths")
        ws = gf.metadata.get(f"{cfg.arch}.expert_weights_scale")
        if ws is not None and float(ws) not in (0.0, 1.0):
            raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.expert_weights_scale' is {ws}, which is not "
                              "supported (0 or 1)")
