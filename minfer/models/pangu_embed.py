"""openPangu-Embedded (PanguEmbeddedForCausalLM, openPangu-Embedded-1B / 7B): the GGUF arch `pangu-embedded`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        q, k, v = W_q n(x) + b_q, W_k n(x) + b_k, W_v n(x) + b_v     n = RMSNorm(attn_norm)
        x = x + (W_o attn(rope(q), rope(k), v) + b_o)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

Llama's graph with attention biases (models/llama_bias.py computes it); what differs, and its source:
- Biases: q/k/v each when the file has it (src/models/pangu-embed.cpp load_arch_tensors: create_tensor_qkv,
  TENSOR_NOT_REQUIRED; build_qkv adds each one present), and `attn_output.bias` REQUIRED (wo_b created with
  flag 0; build_attn adds it). HF: every attention projection has bias=config.bias (true in the releases). The
  MLP has none (build_ffn gets no *_b the loader creates): an ffn_*.bias is refused by name, as is a fused
  attn_qkv (the converter, conversion/pangu.py PanguEmbeddedModel, writes the separate q/k/v it finds).
- RoPE NEOX, halves (llama_model_rope_type: LLM_ARCH_PANGU_EMBED -> NEOX) on the rows as the checkpoint has
  them (PanguEmbeddedModel is a plain TextModel, which permutes nothing; HF's rotate_half), over whole heads
  (pangu-embed.cpp asserts n_embd_head == n_rot). A `rope_freqs.weight` is loaded by llama.cpp but never used
  (ggml_rope_ext gets nullptr): dropped here as well.
- head_dim from attention.key_length (the converter writes config.json's head_dim, else hidden / heads, there and
  as rope.dimension_count); scores 1/sqrt(head_dim); RMSNorm eps attention.layer_norm_rms_epsilon; SwiGLU MLP;
  output.weight, or the token embedding when the file has none (the converter skips a tied lm_head;
  load_arch_tensors: TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_per_layer_shapes
from minfer.models.llama_bias import LlamaBiasModel

_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")


class PanguEmbedModel(LlamaBiasModel):
    """LlamaBiasModel (q/k/v biases when present, the o bias) with NEOX rope; the o bias required."""

    arch = "pangu-embedded"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_PANGU_EMBED -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "PanguEmbedModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.rope.n_rot != cfg.head_dim:      # pangu-embed.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's pangu-embedded graph rotates whole heads only)")
        refuse_per_layer_shapes(gf, cfg)
        for i in range(cfg.n_layers):
            for suffix in _REFUSED_TENSORS:
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cls.arch} "
                                      "(llama.cpp's pangu-embedded loader creates no such tensor)")
            if f"blk.{i}.attn_output.bias" not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.attn_output.bias' is missing ({cls.arch}'s "
                                  "output projection has a bias: llama.cpp's loader requires it)")
        if cfg.rope.freq_factors is not None:    # pangu-embed.cpp passes no rope factors to ggml_rope_ext
            cfg = replace(cfg, rope=replace(cfg.rope, freq_factors=None))
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
