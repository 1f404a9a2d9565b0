"""Qwen3 (dense): the GGUF arch `qwen3`.

The llama computation (minfer/models/llama.py) with these differences (llama.cpp
src/models/qwen3.cpp, convert_hf_to_gguf.py Qwen3Model):
- each head of q and of k is RMS-normalized before rope, with weights
  blk.N.attn_q_norm.weight and blk.N.attn_k_norm.weight, both (head_dim,), eps = the model's
  rms eps (HF Qwen3Attention: q_norm / k_norm on the (.., head_dim) view);
- no q/k/v biases (Qwen2 had them);
- head_dim comes from `qwen3.attention.key_length` (128 for every Qwen3 size), so
  n_heads * head_dim may differ from the embedding length (Qwen3-0.6B: 16 x 128 vs 1024);
- RoPE in ggml NEOX mode (llama_model_rope_type: LLM_ARCH_QWEN3 -> NEOX); q/k unpermuted.
The q/k norm itself lives in the shared attention branch (models/layers.py, `qk_norm`).
"""

from __future__ import annotations

from minfer.models.llama import LlamaModel


class Qwen3Model(LlamaModel):
    arch = "qwen3"
    rope_style = "neox"
    qk_norm = True
