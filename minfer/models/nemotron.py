"""Nemotron-4 / Minitron (Nemotron-4 15B / 340B, Minitron 4B / 8B, Mistral-NeMo-Minitron 8B): the GGUF arch `nemotron`.

    x_0 = E[tokens]                                     token_embd (V, D); output (V, D), required
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)             the file's weight is HF's 1 + w (LayerNorm1P)
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o     biases optional
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down relu(W_up h + b_up)^2 + b_down                                  biases optional
    logits = W_out LN(x; output_norm, output_norm.bias)

Each rule and its source (llama.cpp src/models/nemotron.cpp; HF modeling_nemotron):
- LayerNorm1P: HF NemotronLayerNorm1P is F.layer_norm(x, weight + 1, bias, eps) in float32; llama.cpp's
  converter stores weight + 1 (conversion/nemotron.py NemotronModel.modify_tensors: every "norm.weight"),
  so the file's norms are plain LayerNorms with weight and bias, all required (load_arch_tensors:
  attn_norm(.bias), ffn_norm(.bias), output_norm(.bias) flag 0; build_norm(..., LLM_NORM)); minfer adds
  nothing. eps `nemotron.attention.layer_norm_epsilon` (LLM_KV_ATTENTION_LAYERNORM_EPS, required; HF
  norm_eps). ops.layer_norm, then + bias (models/starcoder2.py layer_norm).
- The MLP is ungated squared ReLU: W_down relu(W_up h)^2 (build_ffn(..., LLM_FFN_RELU_SQR, LLM_FFN_SEQ);
  HF NemotronMLP down_proj(act_fn(up_proj(x))), hidden_act relu2). The square in float32 (models/arcee.py
  relu2; torch on both backends, counted `relu2.torch` on CUDA).
- Biases optional, each taken when present: q/k/v (create_tensor_qkv TENSOR_NOT_REQUIRED), attn_output
  (wo_b), ffn_up and ffn_down (TENSOR_NOT_REQUIRED); HF attention_bias (q/k/v/o) and mlp_bias (up/down),
  False in the releases. A fused q/k/v and an ffn_gate are refused by name.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_NEMOTRON -> NEOX; HF rotate_half on the first rot_dim dims)
  on the first `rope.dimension_count` dims of each head (the converter writes partial_rotary_factor *
  hidden / heads: half in the releases; nemotron.cpp does not assert n_rot == head size), linear scaling
  when `rope.scaling.type` is linear (the converter's `factor`; ModelConfig), head size
  `attention.key_length` (Minitron's 128 of 4096 / 32 = 128, Mistral-NeMo-Minitron's head_dim), scale
  1/sqrt(head_dim), GQA.
- output.weight required (load_arch_tensors flag 0: no tied head).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.arcee import relu2
from minfer.models.layers import Block, BlockTensors, require_output
from minfer.models.starcoder2 import Starcoder2Block, Starcoder2Model


class NemotronModel(Starcoder2Model):
    """starcoder2's computation (LayerNorms with bias, NEOX rope, attention with optional biases, an ungated
    MLP) with the squared-ReLU MLP, optional biases and no window."""

    arch = "nemotron"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_NEMOTRON -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NemotronModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        require_output(gf, cfg, "nemotron")
        for i in range(cfg.n_layers):
            for name in ("attn_qkv.weight", "ffn_gate.weight", "ffn_gate.bias"):
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': nemotron has no such tensor "
                                      "(llama.cpp's nemotron loader does not take it)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.window = 0              # nemotron.cpp: build_attn_inp_kv, no window
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw = t.w, t.v, t.opt, t.D, t.F
        return Starcoder2Block(
            **t.ln_attention(), attn_output_b=opt("attn_output.bias", D),
            ffn_norm=v("ffn_norm.weight", D), ffn_norm_b=v("ffn_norm.bias", D),
            ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=opt("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=opt("ffn_down.bias", D))

    def mlp(self, h: torch.Tensor, blk: Starcoder2Block, ctx) -> torch.Tensor:
        """W_down relu(W_up h + b_up)^2 + b_down, (T, D) -> (T, D)."""
        if ops._backend(h) is not ops.reference:
            ops.paths.count("relu2.torch")
        u = relu2(ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx).float()).to(h.dtype)
        return ops.linear(u, blk.ffn_down, blk.ffn_down_b, ctx)
