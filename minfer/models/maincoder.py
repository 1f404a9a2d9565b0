"""Maincoder (MaincoderForCausalLM, Maincode/Maincoder-1B): the GGUF arch `maincoder`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        q, k = rope(W_q n(x)), rope(W_k n(x))         per head, adjacent pairs
        q, k = RMSNorm(q; attn_q_norm), RMSNorm(k; attn_k_norm)      per head, AFTER rope
        x = x + W_o attn(q, k, W_v n(x))              n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

Llama's graph with a per-head q/k RMSNorm; what differs, and its source:
- The q/k norms (blk.N.attn_q_norm / attn_k_norm, (head_dim,), required by maincoder.cpp load_arch_tensors) are
  applied AFTER rope (src/models/maincoder.cpp: ggml_rope_ext on Qcur / Kcur, then build_norm(..,
  attn_q_norm / attn_k_norm, LLM_NORM_RMS)), eps attention.layer_norm_rms_epsilon; qwen3 (models/layers.py
  attention_heads) norms before rope. With a weight per dim the two orders differ.
- RoPE NORM (adjacent pairs) over whole heads (llama_model_rope_type: LLM_ARCH_MAINCODER -> NORM; maincoder.cpp
  asserts n_embd_head == n_rot) on the rows as the checkpoint has them: conversion/maincoder.py MaincoderModel
  is a plain TextModel, which permutes nothing (unlike LlamaModel).
- head_dim from attention.key_length (the converter writes config.json's head_dim there and as
  rope.dimension_count), so H * head_dim may differ from the embedding length.
- scores 1/sqrt(head_dim); SwiGLU MLP (build_ffn LLM_FFN_SILU, LLM_FFN_PAR, no biases); output.weight, or the
  token embedding when the file has none (load_arch_tensors: TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED).
- Biases and a fused attn_qkv: the converter writes none (the release has attention_bias false); refused by name
  rather than ignored.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, head_norm, merge_heads, refuse_layer_tensors, rope_write_attend
from minfer.models.llama import LlamaModel

_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                    "attn_output.bias")


class MaincoderModel(LlamaModel):
    """LlamaModel with the per-head q/k RMSNorm after rope."""

    arch = "maincoder"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_MAINCODER -> NORM
    qk_norm = True            # attn_q_norm / attn_k_norm loaded (layers.load_block); applied here, after rope

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MaincoderModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's maincoder graph rotates whole heads only)")
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "the converter writes attn_q/attn_k/attn_v without "
                                                        "biases")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    def attention_heads(self, h: torch.Tensor, blk: Block, layer: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, H * Dh): q, k, v; rope on q and k; their per-head RMSNorm; the cache write and attention."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q = ops.rope(q.view(T, H, Dh), step.positions, c.rope)
        k = ops.rope(k.view(T, Hkv, Dh), step.positions, c.rope)
        q, k = head_norm(q, blk.attn_q_norm, c.rms_eps), head_norm(k, blk.attn_k_norm, c.rms_eps)
        # rope None: k stored as it is (already rotated, then normed)
        return merge_heads(rope_write_attend(cache, layer, q, k, v.view(T, Hkv, Dh), step, None, ctx))

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """(x + W_o attn, its ffn_norm): layers.attention_residual_norm with this attention."""
        return ops.linear_add_rms_norm(self.attention_heads(h, blk, i, cache, step, ctx), blk.attn_output, x,
                                       blk.ffn_norm, eps, act, ctx, into_linear=True, role="ffn_norm")
