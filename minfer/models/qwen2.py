"""Qwen2 / Qwen2.5: the GGUF arch `qwen2`.

The llama computation (minfer/models/llama.py) with two differences:
- attn_q, attn_k, attn_v carry biases (blk.N.attn_{q,k,v}.bias), added after the matmul;
- RoPE in ggml NEOX mode: pairs (x[i], x[i + Dh/2]) (llama.cpp llama_model_rope_type:
  LLM_ARCH_QWEN2 -> LLAMA_ROPE_TYPE_NEOX); the converter leaves q/k unpermuted.
"""

from __future__ import annotations

from minfer.models.llama import LlamaModel


class Qwen2Model(LlamaModel):
    arch = "qwen2"
    rope_style = "neox"
    qkv_bias = True
