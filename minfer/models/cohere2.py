"""Cohere Command R7B / Command A: the GGUF arch `cohere2`.

Command-R's parallel block (minfer/models/command_r.py: one LayerNorm feeding attention and the
MLP, both added to the residual, logits * logit_scale, tied lm head) with interleaved sliding-
window layers, which alone carry the positions:

    layer l local (l % P < P - 1, P = 4 by default):  attention over the last W keys, q and k rotated
    layer l global (every P-th):                       attention over every key, NO rope

Each rule and its source (llama.cpp src/models/cohere2.cpp; HF modeling_cohere2):
- The pattern: load_swa_pattern(ml, 4) with LLAMA_SWA_TYPE_STANDARD -- three window layers, then
  one global, or `cohere2.attention.sliding_window_pattern` (a period, or one flag per layer);
  HF Cohere2Config.layer_types: 'sliding_attention' when (i + 1) % 4 != 0. The window W is
  `cohere2.attention.sliding_window`, required (load_arch_hparams get_key without a default): a
  query at p sees keys p - W < j <= p (llama_hparams::is_masked_swa; HF sliding-window mask).
- RoPE on the window layers only (cohere2.cpp: ggml_rope_ext inside `if (is_swa)`; HF
  Cohere2Attention rotates only when self.sliding_window is set), with the file's freq_base and
  rope_freqs.weight if any: the graph uses the context's freq_base/freq_scale (its per-layer
  freq_base_l is commented out as unused), so `cohere2.rope.freq_base_swa`, which
  load_arch_hparams reads, changes nothing. NORM style, adjacent pairs (llama_model_rope_type:
  LLM_ARCH_COHERE2; HF's interleaved rotate_half, q/k unpermuted by conversion/command_r.py
  Cohere2Model, which writes rope.dimension_count = rotary_pct * head_dim).
- `cohere2.logit_scale` is required (load_arch_hparams get_key without a default); a zero one is
  not applied (graph: `if (f_logit_scale)`).
- No q/k norms (load_arch_tensors creates none).
"""

from __future__ import annotations

from minfer.errors import MinferError
from minfer.models.command_r import CommandRModel
from minfer.models.gemma3 import swa_layers

DEFAULT_SWA_PATTERN = 4   # llama_model_cohere2::load_arch_hparams: load_swa_pattern(ml, 4)


class Cohere2Model(CommandRModel):
    arch = "cohere2"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_COHERE2 -> NORM
    logit_scale_required = True
    qk_norm_layers = 0        # no q/k norms (Command A has 64 layers and none)

    @classmethod
    def attention_layout(cls, m, gf) -> None:
        c = m.cfg
        key = f"{c.arch}.attention.sliding_window"
        if key not in gf.metadata:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {c.arch} model)")
        if c.sliding_window <= 0:
            raise MinferError(f"{gf.path}: metadata key '{key}' is {gf.metadata[key]}, expected a window > 0")
        for name in ("attn_q_norm", "attn_k_norm"):
            if f"blk.0.{name}.weight" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.0.{name}.weight': {c.arch} has no q/k norms "
                                  "(llama.cpp's loader refuses the file)")
        m.window = c.sliding_window
        pattern = c.swa_pattern if c.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers(c.n_layers, m.window, pattern)
        m.use_rope = m.is_local
