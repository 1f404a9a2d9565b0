"""Qwen3-VL language model (dense): the GGUF arch `qwen3vl` (the vision tower is a separate
mmproj file, not loaded: text input only).

The Qwen3 computation (models/qwen3.py: per-head q/k RMSNorm, no biases, SwiGLU; llama.cpp
src/models/qwen3vl.cpp) with two multimodal parts, neither of which acts on text:
- Interleaved M-RoPE (llama_model_rope_type: LLM_ARCH_QWEN3VL -> LLAMA_ROPE_TYPE_IMROPE): each
  rotary pair takes the t, h or w position in turn (HF modeling_qwen3_vl
  Qwen3VLTextRotaryEmbedding.recomposition_frequencies: pairs 1, 4, .. < 3*s1 from h, 2, 5, ..
  < 3*s2 from w, the rest from t). Text tokens have t = h = w = their position (HF
  get_rope_index; llama-graph.cpp llm_graph_input_pos::set_input), so HF's rotation is exactly
  plain NEOX rope, which minfer runs.
  llama.cpp differs from HF on a few pairs: its ggml_mrope_cache_init (is_imrope) gives a pair of
  sector s the 4th position (0 for text, so unrotated) unless s%3 == 1 and s < 3*s1, s%3 == 2 and
  s < 3*s2, or s%3 == 0 and s < 3*s0. With the released sections (24, 20, 20) of 64 pairs that
  leaves pairs 61 and 62 unrotated, where HF rotates them by the position; their frequencies are
  theta^(-122/128) and theta^(-124/128) (theta 5e6: ~4e-7 rad per position), so the two agree to
  ~1e-6 at the context lengths of these models. minfer follows HF (the model's own definition).
- Deepstack (`qwen3vl.n_deepstack_layers`): after layer il < n, llama.cpp adds slice il+1 of the
  input embedding, which for text tokens is zero padding (llama-graph.cpp build_inp_embd:
  ggml_pad of the token embeddings to n_embd_inp); HF adds visual features only at image
  positions. Nothing to do for text; the text file has no deepstack tensors (those are in mmproj).
"""

from __future__ import annotations

from minfer.models.qwen2vl import TextMRope
from minfer.models.qwen3 import Qwen3Model


class Qwen3VLModel(TextMRope, Qwen3Model):
    arch = "qwen3vl"
    rope_style = "neox"       # IMROPE: NEOX halves; text positions equal in t/h/w (module docstring)
    interleaved_mrope = True
    # recorded only: for text the deepstack slices are zeros (module docstring)
    recorded_keys = {"n_deepstack_layers": "n_deepstack_layers"}
