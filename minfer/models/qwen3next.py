"""Qwen3-Next (Qwen3-Next-80B-A3B Instruct / Thinking): the GGUF arch `qwen3next`.

The layers of qwen35moe (models/qwen35.py, models/qwen35moe.py: gated DeltaNet linear attention, gated
full attention, a softmax top-k MoE renormalized plus the sigmoid-gated shared expert, the recurrent
state and its engine rules) with three differences (llama.cpp src/models/qwen3next.cpp; the converter
conversion/qwen.py Qwen3NextModel; HF modeling_qwen3_next):
- Plain NEOX rope on the first `rope.dimension_count` dims (llama_model_rope_type: QWEN3NEXT -> NEOX,
  ggml_rope_ext; HF partial_rotary_factor 0.25): no M-RoPE sections.
- beta and alpha come from one matrix `ssm_ba` (2 Hv, D), HF's in_proj_ba as is: per key head, its
  Hv/Hk beta rows then its Hv/Hk alpha rows (HF fix_query_key_value_ordering; qwen3next.cpp views of
  mixed_ba); deltanet.py's fused_ba.
- The value heads stay in HF's grouped order (Qwen3NextModel does not reorder them, unlike the
  Qwen3.5 converter): value head j reads key head j // (Hv/Hk) (HF repeat_interleave; qwen3next.cpp's
  "repeat interleave" reshape before ggml_repeat_4d).
The (1 + w) norms (HF Qwen3NextRMSNorm) hold the 1 the converter added (Qwen3NextModel.modify_tensors);
the linear attention's gated norm is stored as is. Files of the older layout (one interleaved `ssm_in`
qkvz matrix, qwen3next.cpp's "legacy" path) are refused by name.
"""

from __future__ import annotations

from minfer.models.qwen35moe import Qwen35MoeModel


class Qwen3NextModel(Qwen35MoeModel):
    arch = "qwen3next"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_QWEN3NEXT -> NEOX
    mrope = False             # no rope.dimension_sections
    tiled_v_heads = False     # value heads in HF's grouped order (module doc)
    fused_ba = True           # ssm_ba (module doc)
