"""Tencent Hy3 (HF HYV3ForCausalLM, e.g. tencent/Hy3-preview): the GGUF arch `hy_v3`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D) or tied
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        q, k = rope(qn(W_q n(x))), rope(kn(W_k n(x)))                   n = RMSNorm(attn_norm); qn, kn per head
        x = x + W_o attn(q, k, W_v n(x))
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         layers without ffn_gate_inp (dense)
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          layers with it
    logits = W_out RMSNorm(x; output_norm)

dots1's layer (Qwen3's attention around DeepSeek-V3's sigmoid MoE) with a file layout of its own. Each rule and
its source (llama.cpp src/models/hy-v3.cpp: load_arch_hparams, load_arch_tensors, the graph; conversion/hunyuan.py
HYV3Model; HF transformers models/hy_v3: HYV3Attention = ApertusAttention, HYV3TopKRouter, HYV3MoE):
- Per-head q/k RMSNorm (both required: hy-v3.cpp loads them with the trunk's flags) before rope, NEOX rope over
  the whole head (llama_model_rope_type: LLM_ARCH_HY_V3 -> NEOX; the graph asserts n_rot == head_dim), scale
  1/sqrt(head_dim); `rope_freqs.weight` (rope_factors) applies when present.
- Dense or MoE is per layer, by the file's tensors: the graph runs the dense SwiGLU of feed_forward_length where
  blk.N.ffn_gate_inp.weight is absent (HF mlp_layer_types "dense"; the converter writes no
  leading_dense_block_count), else the MoE (build_moe_ffn): p = sigmoid(W_r h) (expert_gating_func; sigmoid when
  absent, hy-v3.cpp's default; config.py refuses the value 0, NONE, by name), the choice on p + blk.N.exp_probs_b
  (the tensor has no `.bias` suffix here: tn(LLM_TENSOR_FFN_EXP_PROBS_B, i); optional, TENSOR_NOT_REQUIRED; HF e_score_correction_bias), weights
  p[top], renormalized when expert_weights_norm (the converter writes HF's route_norm, default true; llama.cpp:
  false when absent), times expert_weights_scale (HF router_scaling_factor), expert groups when the file has
  expert_group_count > 1 (llama.cpp's generic loader; HF Hy3 has none), plus the ungated shared expert of width
  expert_shared_feed_forward_length (HF moe_intermediate_size x num_shared_experts; expert_feed_forward_length
  when absent, as hy-v3.cpp), added to the routed output. The shared expert is required on MoE layers: the graph
  always adds it (HF's shared MLP always exists).
- NextN / MTP blocks past n_layer are not run (hy-v3.cpp's trunk graph does not either).
Where llama.cpp and HF differ this follows llama.cpp: the absent-key defaults, and the renormalization's
denominator (clamped to at least 2^-14 instead of HF's + 1e-20).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.dots1 import Dots1Model
from minfer.weights import load_vector


class HyV3Model(Dots1Model):
    arch = "hy_v3"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_HY_V3 -> NEOX
    ffn_norm_tensor = "ffn_norm.weight"
    qk_norm_required = True
    select_bias_optional = True         # read below under its own name (blk.N.exp_probs_b)
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "HyV3Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            if p + "exp_probs_b.bias" in gf.tensors:     # not a name hy-v3.cpp loads
                raise MinferError(f"{gf.path}: tensor '{p}exp_probs_b.bias' is not a hy_v3 tensor "
                                  f"(hy_v3's selection bias is '{p}exp_probs_b')")
            if cls.moe_layer(gf, cfg, i) and p + "ffn_gate.weight" in gf.tensors:
                raise MinferError(f"{gf.path}: layer {i} has both '{p}ffn_gate_inp.weight' (MoE) and "
                                  f"'{p}ffn_gate.weight' (dense): hy-v3.cpp runs one FFN per layer")
        # Glm4MoeModel.from_gguf (through Dots1Model's check of the shared count, skipped: no such key here)
        m = super(Dots1Model, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                             act_dtype=act_dtype)
        for i, e in enumerate(m.moe):
            name = f"blk.{i}.exp_probs_b"
            if e is not None and name in gf.tensors:
                e.exp_probs_b = load_vector(gf, name, device, cfg.n_experts)
        return m

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        md, a, E, Fe = gf.metadata, cls.arch, cfg.n_experts, cfg.expert_ffn
        if f"{a}.rope.dimension_count" in md and cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}: hy-v3.cpp rotates the whole "
                              f"head ({cfg.head_dim})")
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        gating = cfg.expert_gating if f"{a}.expert_gating_func" in md else "sigmoid"
        Fs = cfg.expert_shared_ffn or Fe        # hy-v3.cpp: n_ff_shexp, else n_ff_exp
        return replace(cfg, expert_gating=gating), Fs

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        """hy-v3.cpp: the MoE where the layer has a router (ffn_gate_inp), else the dense FFN."""
        return f"blk.{i}.ffn_gate_inp.weight" in gf.tensors
