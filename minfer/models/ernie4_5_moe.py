"""ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): the GGUF arch `ernie4_5-moe`.

    x_0 = E[tokens]                                                  token_embd (V, D); output or tied
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        h = RMSNorm(x; ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                      dense layers (see below)
        x = x + moe(h) [+ W_down_s(silu(W_gate_s h) * W_up_s h)]     MoE layers, shared experts if any
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/ernie4-5-moe.cpp, the graph; src/models/ernie4-5.cpp
load_arch_hparams / load_arch_tensors, which both ERNIE archs share; conversion/ernie.py
Ernie4_5MoeModel; HF modeling_ernie4_5_moe):
- Attention as the dense ERNIE 4.5's (models/ernie4_5.py): no biases, scale 1/sqrt(head_dim), RoPE
  NORM (adjacent pairs: llama_model_rope_type LLM_ARCH_ERNIE4_5_MOE -> NORM; HF's rotate_half
  interleaves even / odd dims). The graph passes no o bias (build_attn(..., wo, NULL, ...)) although
  the loader takes an optional attn_output.bias, and HF's use_bias would add one everywhere: the
  released models have none, so any bias tensor is refused by name rather than guessed.
- Which layers are MoE: l >= leading_dense_block_count and (l + 1) % interleave_moe_layer_step == 0
  (the graph's is_moe_layer; HF Ernie4_5_MoeDecoderLayer: moe_layer_start_index, moe_layer_interval;
  the converter writes those two). The others have a SwiGLU MLP of feed_forward_length. llama.cpp's
  loader asks MoE tensors of every layer past the leading ones, so it loads only step 1 (the released
  configs); minfer loads each layer by the graph's rule, which for step > 1 is HF's. HF's
  moe_layer_end_index has no GGUF key (the released configs: the last layer).
- The MoE (build_moe_ffn(..., ffn_exp_probs_b, ..., LLM_FFN_SILU, norm_w = true, expert_weights_scale,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF Ernie4_5_MoeTopKRouter):
      p   = softmax(W_r h)                     ffn_gate_inp (E, D), float32
      top = the K largest p + b_sel            exp_probs_b.bias (E,): HF moe_statics.e_score_correction_bias,
                                               used for the choice only (absent: no bias)
      w   = p[top] / sum(p[top])               always renormalized (norm_w = true; HF divides by the sum
                                               clamped at moe_norm_min 1e-12, llama.cpp at 2^-14: the sum
                                               of the K largest of E probabilities is >= K/E, far above both)
      w   = w * expert_weights_scale           (absent or 0: none; the converter writes none)
      moe(h) = sum_k w_k W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)    expert_feed_forward_length wide
  The gating is softmax whatever the file says (the graph's constant); no expert groups.
- Shared experts (HF shared_experts: one SwiGLU of moe_intermediate_size * moe_num_shared_experts),
  ungated, added to the routed sum, when expert_shared_feed_forward_length > 0 (llama.cpp n_ff_shexp;
  the converter writes intermediate_size // num_key_value_heads, which equals HF's width in the
  released configs). Shared-expert tensors in a file without that key are refused by name
  (llama.cpp would ignore them, HF would run them).
- MTP layers (HF num_nextn_predict_layers): the converter drops them; nothing to skip.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.glm4moe import Glm4MoeModel


def is_moe_layer(i: int, lead: int, step: int) -> bool:
    """ernie4-5-moe.cpp: il >= n_layer_dense_lead && (il + 1) % n_moe_layer_step == 0."""
    return i >= lead and (i + 1) % step == 0


class Ernie45MoeModel(Glm4MoeModel):
    arch = "ernie4_5-moe"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_ERNIE4_5_MOE -> NORM
    qkv_bias = False
    qk_norm = False
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "interleave_moe_layer_step")
    ffn_norm_tensor = "ffn_norm.weight"
    select_bias_optional = True         # exp_probs_b.bias: absent = no bias (module doc)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Ernie45MoeModel":
        """glm4moe's loader (its check_moe / moe_layer hooks below); no biases or q/k norms (qkv_bias,
        qk_norm False)."""
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.moe_step = gf.metadata[f"{cls.arch}.interleave_moe_layer_step"]
        m.weights_norm = True      # ernie4-5-moe.cpp: build_moe_ffn(..., norm_w = true, ...)
        return m

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        md, a = gf.metadata, cls.arch
        step = md[f"{a}.interleave_moe_layer_step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise MinferError(f"{gf.path}: metadata key '{a}.interleave_moe_layer_step' is {step!r}: "
                              "expected an integer >= 1")
        E, Fe = cfg.n_experts, cfg.expert_ffn
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        for name in gf.tensors:
            if name.endswith(".bias") and not name.endswith("exp_probs_b.bias"):
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported (ERNIE 4.5 MoE has no biases; "
                                  "llama.cpp's graph would not apply it)")
        Fs = cfg.expert_shared_ffn
        if Fs <= 0:
            stray = [n for n in gf.tensors if n.endswith("_shexp.weight")]
            if stray:
                raise MinferError(f"{gf.path}: tensor '{stray[0]}' is present but metadata key "
                                  f"'{a}.expert_shared_feed_forward_length' is missing or 0")
        # the graph's constants: softmax gating, no groups, always renormalized (module docstring)
        return replace(cfg, expert_gating="softmax", expert_groups=1, expert_groups_used=1), Fs

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        return is_moe_layer(i, cfg.leading_dense_blocks, gf.metadata[f"{cls.arch}.interleave_moe_layer_step"])
