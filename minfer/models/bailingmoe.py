"""inclusionAI Ling v1 (Ling-lite, Ling-plus, Ling-Coder-lite; HF BailingMoeForCausalLM): the GGUF arch `bailingmoe`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l:
        q, k, v = W_q n(x), W_k n(x), W_v n(x)                          n = RMSNorm(attn_norm)
        x = x + W_o attn(rope(q), rope(k), v)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          every layer
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/bailingmoe.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/bailingmoe.py BailingMoeModel):
- q/k/v: the converter splits HF attention.query_key_value into attn_q / attn_k / attn_v and permutes q and k's rows
  for NORM rope (BailingMoeModel.permute), so the file's rope is llama.cpp's NORM (llama_model_rope_type:
  LLM_ARCH_BAILINGMOE -> NORM) on HF's rotate_half. create_tensor_qkv: biases TENSOR_NOT_REQUIRED (build_qkv adds
  them); a fused attn_qkv (never written by the converter) is refused by name here, as is attn_output.bias (wo_b is
  never loaded). No q/k norms.
- Scale 1/sqrt(n_rot) and the tensors sized n_head * n_rot: rope.dimension_count (the converter: head_dim) must be the
  head size; minfer refuses a file where it is not.
- Every layer is MoE: load_arch_hparams reads leading_dense_block_count (the converter writes first_k_dense_replace)
  but load_arch_tensors creates ffn_gate_inp / the experts for all layers and the graph calls build_moe_ffn in each.
- build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (fixed in the graph; the file's expert_gating_func is not
  read), no selection bias, no groups:  p = softmax(W_r h); top = the K best p; w = p[top];
  w = w / max(sum w, 2^-14) when expert_weights_norm (HF norm_topk_prob; absent: false);
  w = w * expert_weights_scale (the converter writes 1.0; absent or 0: 1).
- The shared expert (ungated), width n_ff_exp * expert_shared_count (expert_shared_count required by get_key; its
  tensors created with flag 0: a count of 0 is refused).
- output.weight required (untied). HF's norm_head (lm_head normalized over dim 0) is folded in by the converter.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.glm4moe import Glm4MoeModel

# tensors llama.cpp's bailingmoe loader never creates for this graph: refused by name (per layer)
_REFUSED = ("attn_qkv.weight", "attn_qkv.bias", "attn_output.bias", "exp_probs_b.bias", "attn_q_norm.weight",
            "attn_k_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


class BailingMoeModel(Glm4MoeModel):
    arch = "bailingmoe"
    rope_style = "normal"               # llama_model_rope_type: LLM_ARCH_BAILINGMOE -> NORM (converter permutes q/k)
    qkv_bias = True                     # create_tensor_qkv: q/k/v biases TENSOR_NOT_REQUIRED
    qk_norm = False
    ffn_norm_tensor = "ffn_norm.weight"
    expert_gatings = ("softmax",)       # the graph passes LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    # load_arch_hparams: expert_shared_count get_key (required), expert_feed_forward_length get_key_or_arr
    # (required); load_arch_tensors: n_expert / n_expert_used > 0
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count")
    ffn_key_optional = True             # no dense layers: feed_forward_length unused
    select_bias_optional = True         # no exp_probs_b in this graph (one in the file is refused by check_moe)

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        cfg, _ = super().check_moe(gf, cfg)
        a = cls.arch
        if cfg.expert_shared_count <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_shared_count={cfg.expert_shared_count}: expected > 0 "
                              "(llama.cpp's loader requires the shared expert's tensors)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot} differs from the head size "
                              f"{cfg.head_dim} (llama.cpp's bailingmoe graph sizes heads and scales by n_rot)")
        for i in range(cfg.n_layers):
            for name in _REFUSED:
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is not supported for {a} (llama.cpp's "
                                      "bailingmoe graph: split q/k/v, no q/k norms, every layer MoE, no "
                                      "selection bias)")
        # the graph: softmax gating, no groups, whatever the file says
        cfg = replace(cfg, expert_gating="softmax", expert_groups=1, expert_groups_used=1)
        return cfg, cfg.expert_ffn * cfg.expert_shared_count

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        """Every layer (the graph ignores leading_dense_block_count)."""
        return True

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BailingMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.tied_output:
            raise MinferError(f"{gf.path}: tensor 'output.weight' is missing ({cls.arch}'s lm head is its own: "
                              "llama.cpp's loader requires it)")
        return super().from_gguf(gf, cfg, device, dtype, progress, act_dtype)
