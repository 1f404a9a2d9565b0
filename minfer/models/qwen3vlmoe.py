"""Qwen3-VL MoE language model (Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B): the GGUF arch `qwen3vlmoe`
(the vision tower is a separate mmproj file, not loaded: text input only).

Qwen3-MoE's computation (models/qwen3moe.py: per-head q/k RMSNorm, no biases, softmax top-k experts
renormalized; llama.cpp src/models/qwen3vlmoe.cpp build_moe_ffn(..., LLM_FFN_SILU, norm_w = true,
..., LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF Qwen3VLMoeTextTopKRouter divides the top-k
probabilities by their sum unconditionally) with Qwen3-VL's multimodal parts, neither of which acts
on text (models/qwen3vl.py has the whole argument):
- interleaved M-RoPE (llama_model_rope_type: LLM_ARCH_QWEN3VLMOE -> LLAMA_ROPE_TYPE_IMROPE):
  text tokens have t = h = w = their position, which HF rotates as plain NEOX rope; minfer runs
  that (TextMRope: the sections read and checked, a 4th section refused);
- deepstack (`qwen3vlmoe.n_deepstack_layers`): zeros added for text tokens; recorded only.
HF keeps the experts packed and transposed (gate_up_proj (E, D, 2F) in the checkpoint); the
converter (conversion/qwen3vl.py Qwen3VLMoeTextModel.modify_tensors) splits and transposes them
into the usual ffn_{gate,up,down}_exps, so the file is qwen3moe's layout.
Every layer is a MoE layer: qwen3vlmoe.cpp has no dense layers (the released configs:
decoder_sparse_step 1, mlp_only_layers []).
"""

from __future__ import annotations

from minfer.models.qwen2vl import TextMRope
from minfer.models.qwen3moe import Qwen3MoeModel


class Qwen3VLMoeModel(TextMRope, Qwen3MoeModel):
    arch = "qwen3vlmoe"
    rope_style = "neox"       # IMROPE: NEOX halves; text positions equal in t/h/w (models/qwen3vl.py)
    interleaved_mrope = True
    # recorded only: for text the deepstack slices are zeros (models/qwen3vl.py)
    recorded_keys = {"n_deepstack_layers": "n_deepstack_layers"}
