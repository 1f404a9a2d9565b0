"""ByteDance Seed-OSS (Seed-OSS-36B): the GGUF arch `seed_oss`.

    x_0 = E[tokens]                                   token_embd (V, D); output (V, D), or tied
    for each layer l:
        x = x + W_o attn(rope(W_q n(x) + b_q), rope(W_k n(x) + b_k), W_v n(x) + b_v)   n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))                  n' = RMSNorm(post_attention_norm)
    logits = W_out RMSNorm(x; output_norm)

Qwen2's computation under other tensor names. Each rule and its source (llama.cpp src/models/seed-oss.cpp;
the converter conversion/olmo.py SeedOssModel, a plain TextModel; HF transformers
models/seed_oss/modeling_seed_oss.py):
- The MLP's pre-norm is stored as `blk.N.post_attention_norm.weight` (LLM_TENSOR_ATTN_POST_NORM, HF
  post_attention_layernorm) and applied to the residual stream before the MLP (graph: attn_post_norm on
  ffn_inp), not to the attention's output: it is the FFN norm. No `ffn_norm` tensor exists.
- q/k/v biases when the file has them (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF attention_bias, True
  in the released config); no output-projection or MLP bias (load_arch_tensors creates none; HF
  attention_out_bias / mlp_bias False): a file with one is refused by name rather than run without it.
- RoPE NEOX, halves (llama_model_rope_type: LLM_ARCH_SEED_OSS; the converter does not permute q/k), no
  rope factors (ggml_rope_ext gets nullptr). head_dim from attention.key_length (128 with 80 heads of a
  5120-wide model: n_heads * head_dim != D). Scores 1/sqrt(head_dim), SwiGLU MLP.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import Block
from minfer.models.llama import LlamaModel
from minfer.weights import load_qweight, load_vector

_UNSUPPORTED_TENSORS = ("attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")


def load_seed_oss_block(gf, cfg, i: int, device, dtype) -> Block:
    """blk.i: q/k/v/o, optional q/k/v biases, attn_norm, post_attention_norm (the FFN's norm), SwiGLU."""
    p = f"blk.{i}."
    D, F = cfg.d_model, cfg.ffn
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    def w(name, shape):
        return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

    def bias(name, n):
        return load_vector(gf, p + name + ".bias", device, n) if p + name + ".bias" in gf.tensors else None

    return Block(
        attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
        attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
        attn_output=w("attn_output", (D, q_out)),
        ffn_norm=load_vector(gf, p + "post_attention_norm.weight", device, D),
        ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)),
        attn_q_bias=bias("attn_q", q_out), attn_k_bias=bias("attn_k", kv_out), attn_v_bias=bias("attn_v", kv_out),
    )


class SeedOssModel(LlamaModel):
    """Block.ffn_norm holds blk.N.post_attention_norm (the MLP's pre-norm here)."""

    arch = "seed_oss"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_SEED_OSS -> NEOX
    qkv_bias = True           # when present (load_seed_oss_block)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "SeedOssModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for suffix in _UNSUPPORTED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cls.arch} "
                                      "(llama.cpp's seed_oss graph has no such bias)")
        if cfg.rope.freq_factors is not None:           # seed-oss.cpp passes no rope factors
            cfg = replace(cfg, rope=replace(cfg.rope, freq_factors=None))
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        return load_seed_oss_block(gf, cfg, i, device, dtype)
