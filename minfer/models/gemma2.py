"""Gemma 2: the GGUF arch `gemma2`.

    x_0 = E[tokens] * sqrt(D)                          token_embd (V, D), tied lm head
    for each layer l:
        s = cap_a * tanh((q_l . k_l) * scale / cap_a)      attention scores, soft-capped
        a = W_o softmax(s) v_l                              q_l, k_l: rope_l(W_q n(x)), rope_l(W_k n(x))
        x = x + pn(a)                                       n = RMSNorm(attn_norm), pn = RMSNorm(post_attention_norm)
        f = W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x))    n' = RMSNorm(ffn_norm)
        x = x + fn(f)                                       fn = RMSNorm(post_ffw_norm)
    logits = cap_f * tanh(W_out RMSNorm(x; output_norm) / cap_f)

Gemma 3's block without its q/k norms, plus two soft-caps. Each rule and its source:
- Norms: the converter stores every `*norm.weight` as 1 + w (llama.cpp conversion/gemma.py
  Gemma2Model.modify_tensors; HF Gemma2RMSNorm computes x * (1 + w)), so all are plain RMSNorms.
  Both post-norms (post_attention_norm, post_ffw_norm) are applied to the branch output before
  the residual add (llama.cpp src/models/gemma2.cpp graph: attn_post_norm, ffn_post_norm; HF
  Gemma2DecoderLayer.forward: post_attention_layernorm, post_feedforward_layernorm).
- No q/k norms (gemma2.cpp builds Q/K straight from build_qkv; HF Gemma2Attention has none).
- Embeddings scaled by sqrt(D) (gemma2.cpp: ggml_scale(inpL, sqrtf(n_embd)); HF Gemma2Model
  `normalizer`).
- Query scale: gemma2.cpp multiplies Q by f_attention_scale and attends with kq_scale 1;
  llama_model_gemma2::load_arch_hparams sets it to 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head)
  for the 27B (46 layers). The GGUF carries no query_pre_attn_scalar (HF scales by
  query_pre_attn_scalar**-0.5, which equals those for every released size).
- Attention soft-cap: scores (already scaled) -> cap * tanh(scores / cap) before the mask and
  softmax (llama.cpp src/llama-graph.cpp build_attn_mha, hparams.attn_soft_cap; HF
  modeling_gemma2.eager_attention_forward `softcap`). Key `gemma2.attn_logit_softcapping`,
  default 50 (llama-hparams.h f_attn_logit_softcapping).
- Final soft-cap: logits -> cap * tanh(logits / cap), key `gemma2.final_logit_softcapping`,
  default 30 (llama-hparams.h f_final_logit_softcapping; gemma2.cpp applies it always; HF
  Gemma2ForCausalLM.forward).
- Sliding window on alternating layers: load_swa_pattern(ml, 2) with LLAMA_SWA_TYPE_STANDARD
  -> layer l is local when l % 2 == 0 (layers 0, 2, 4, ... local; 1, 3, 5, ... global), as HF
  Gemma2Config.layer_types ('sliding_attention' when (i + 1) % 2). Window from
  `gemma2.attention.sliding_window`, default 4096 (load_arch_hparams n_swa).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_GEMMA2), one base for all layers unless
  `gemma2.rope.freq_base_swa` is present (load_arch_hparams: rope_freq_base_train_swa defaults
  to rope_freq_base_train, and the local layers keep the global freq_scale).
- FFN: GELU with the tanh approximation (gemma2.cpp LLM_FFN_GELU; HF gelu_pytorch_tanh).
"""

from __future__ import annotations

from dataclasses import replace

from minfer.errors import MinferError
from minfer.models.gemma3 import Gemma3Model, swa_layers

# llama.cpp llama_model_gemma2::load_arch_hparams and llama-hparams.h defaults
DEFAULT_SWA_PATTERN = 2
DEFAULT_WINDOW = 4096
DEFAULT_ATTN_SOFTCAP = 50.0
DEFAULT_FINAL_SOFTCAP = 30.0


def _positive(gf, key: str, default: float) -> float:
    v = float(gf.metadata.get(key, default))
    if not v > 0:
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v}, expected a positive soft-cap")
    return v


class Gemma2Model(Gemma3Model):
    """Gemma 3's block (models/gemma3.py) without q/k norms, with its own window, rope and
    soft-cap keys."""

    arch = "gemma2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA2 -> NEOX
    qk_norm = False
    big_n_layers = 46         # the 27B

    @classmethod
    def attention_layout(cls, m, gf) -> None:
        c, md = m.cfg, gf.metadata
        m.window = int(md.get("gemma2.attention.sliding_window", DEFAULT_WINDOW) or 0)
        pattern = c.swa_pattern if c.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers(c.n_layers, m.window, pattern)
        rope_swa = replace(c.rope, theta=float(md["gemma2.rope.freq_base_swa"])) \
            if "gemma2.rope.freq_base_swa" in md else c.rope
        m.layer_rope = [rope_swa if loc else c.rope for loc in m.is_local]
        m.attn_softcap = _positive(gf, "gemma2.attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP)
        m.final_softcap = _positive(gf, "gemma2.final_logit_softcapping", DEFAULT_FINAL_SOFTCAP)
