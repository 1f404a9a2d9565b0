"""ERNIE 4.5 (dense: 0.3B): the GGUF arch `ernie4_5`.

Llama's computation (minfer/models/llama.py) under its own name. Each rule and its source
(llama.cpp src/models/ernie4-5.cpp; HF modeling_ernie4_5):
- Pre-norm blocks with RMSNorm, attention scale 1/sqrt(head_dim), SwiGLU MLP, no biases used by
  the graph (build_attn with a NULL o bias; build_ffn with NULL biases), `output.weight` or tied.
- RoPE NORM (llama_model_rope_type: LLM_ARCH_ERNIE4_5): adjacent pairs, as HF Ernie 4.5 rotates
  (its rotate_half interleaves even / odd dims); the converter writes q/k as they are
  (conversion/ernie.py Ernie4_5Model.modify_tensors only renames and splits).
- The MoE variant is another architecture (ernie4_5-moe), not taken here.
"""

from __future__ import annotations

from minfer.models.llama import LlamaModel


class Ernie45Model(LlamaModel):
    arch = "ernie4_5"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_ERNIE4_5 -> NORM
