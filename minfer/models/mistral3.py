"""Mistral Small 3.x, Ministral 3, Magistral (text): the GGUF arch `mistral3`.

    x_0 = E[tokens]                                   token_embd (V, D); output (V, D), or tied
    for each layer l:
        q, k = rope_y(W_q n(x)), rope_y(W_k n(x))                         n = RMSNorm(attn_norm)
        x = x + W_o attn(q * c^2 * tau(p), k, W_v n(x))                   scores q.k / sqrt(Dh)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))                  n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)

Llama's block (minfer/models/llama.py). Each rule and its source (llama.cpp src/models/mistral3.cpp,
its hparams in the same file, src/llama-context.cpp for the YaRN factor, src/llama-graph.cpp
llm_graph_input_attn_temp::set_input; the converter conversion/mistral3.py Ministral3Model; HF
transformers models/ministral3/modeling_ministral3.py):
- RoPE NORM, adjacent pairs (llama_model_rope_type: LLM_ARCH_MISTRAL3; the converter is Llama's and
  permutes q/k), with rope_freqs.weight as divisors when the file has it (model.get_rope_factors).
- YaRN when `rope.scaling.type` is yarn (Ministral 3 / Magistral Small 1.2+ files; Mistral Small 3.1
  files have none): the frequencies of gpt_oss.yarn_rope with truncated correction dims (ggml_rope_yarn_corr_dims
  floors/ceils them; HF truncate defaults True), beta_fast/beta_slow from rope.scaling.yarn_beta_* (defaults
  32 / 1, mistral3.cpp load_arch_hparams), the original context rope.scaling.original_context_length.
  cos and sin are multiplied by c (ggml rope_yarn's mscale times llama-context.cpp's yarn_attn_factor):
      get_mscale(s, m) = 1 + 0.1 m ln s  (s > 1; else 1),   f = rope.scaling.factor,
      L = rope.scaling.yarn_log_multiplier (the converter writes HF's mscale_all_dim unscaled),
      c = get_mscale(f, 1) / get_mscale(f, L) if L != 0 else get_mscale(f, 1),   times rope.scaling.attn_factor
  -- HF's attention_factor get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) with mscale = 1 (llama.cpp
  assumes it; Ministral 3's configs have 1, 1: c = 1). Applied as q * c^2 (both q and k carry c).
- Llama-4 attention temperature when `attention.temperature_scale` = beta is present and not 0:
      tau(p) = 1 + beta * ln(1 + floor(p / n_orig))      n_orig = rope.scaling.original_context_length
  multiplying q after rope (mistral3.cpp: inp_attn_scale; llama-graph.cpp set_input with
  f_attn_temp_offset 0; HF get_llama_4_attn_scale(position_ids, llama_4_scaling_beta,
  original_max_position_embeddings)). llama.cpp falls back to context_length for n_orig; HF has no such
  default, so a file without the key is refused by name.
- Scores 1/sqrt(head_dim) (kq_scale; f_attention_scale is not read from the file), SwiGLU MLP.
- Refused by name, not run: the MoE branch (expert_count > 0), attention-output and MLP biases
  (optional tensors llama.cpp would add; no released Mistral 3 has them), a rope.scaling.yarn_attn_factor
  other than c (llama.cpp ignores the key, HF uses it: the two disagree).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gpt_oss import yarn_rope
from minfer.models.layers import Block, merge_heads, rope_and_write
from minfer.models.llama import LlamaModel

_UNSUPPORTED_TENSORS = ("attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate_inp.weight")


def get_mscale(scale: float, m: float) -> float:
    """llama-context.cpp's get_mscale (HF yarn_get_mscale)."""
    return 1.0 if scale <= 1.0 else 1.0 + 0.1 * m * math.log(scale)


def yarn_cos_sin_factor(md, arch: str, rope_attn_factor: float) -> float:
    """c: the factor of YaRN's cos and sin (module docstring)."""
    f = float(md[f"{arch}.rope.scaling.factor"])
    log_mul = float(md.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    c = get_mscale(f, 1.0) / get_mscale(f, log_mul) if log_mul != 0 else get_mscale(f, 1.0)
    return c * rope_attn_factor


def yarn_setup(gf, arch: str, cfg: ModelConfig) -> tuple:
    """(the rope to apply, q's factor c^2): YaRN's when `rope.scaling.type` is yarn (module docstring),
    else (cfg.rope, 1)."""
    md = gf.metadata
    if md.get(f"{arch}.rope.scaling.type") != "yarn":
        return cfg.rope, 1.0
    if f"{arch}.rope.scaling.factor" not in md:
        raise MinferError(f"{gf.path}: metadata key '{arch}.rope.scaling.factor' is missing (YaRN needs it)")
    rope = yarn_rope(gf, arch, cfg.rope, truncate=True)[0]
    c = yarn_cos_sin_factor(md, arch, cfg.rope_attn_factor)
    given = md.get(f"{arch}.rope.scaling.yarn_attn_factor")
    if given is not None and abs(float(given) - c) > 1e-6:
        raise MinferError(f"{gf.path}: metadata '{arch}.rope.scaling.yarn_attn_factor' = {given}: llama.cpp "
                          f"ignores it (cos/sin factor {c:.6g}) and transformers applies it; not supported")
    return rope, c * c


class Mistral3Model(LlamaModel):
    arch = "mistral3"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_MISTRAL3 -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Mistral3Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        md, a = gf.metadata, cls.arch
        if cfg.n_experts:
            raise MinferError(f"{gf.path}: {a}.expert_count={cfg.n_experts}: the mistral3 MoE branch is not "
                              "supported (dense models only)")
        for suffix in _UNSUPPORTED_TENSORS:
            name = f"blk.0.{suffix}"
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {a} (no released Mistral 3 "
                                  "has it; minfer runs the bias-free dense graph)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.rope, m.q_scale = yarn_setup(gf, a, cfg)
        m.temp_beta = float(md.get(f"{a}.attention.temperature_scale", 0.0) or 0.0)
        m.temp_len = 0
        if m.temp_beta:
            key = f"{a}.rope.scaling.original_context_length"
            if key not in md:
                raise MinferError(f"{gf.path}: metadata key '{key}' is missing (the attention temperature "
                                  f"'{a}.attention.temperature_scale' needs it)")
            m.temp_len = int(md[key])
            if m.temp_len <= 0:
                raise MinferError(f"{gf.path}: metadata '{key}' = {m.temp_len}: expected > 0 with an attention "
                                  "temperature")
        return m

    def temperature(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) float32: 1 + beta ln(1 + floor(p / n_orig)) at each position (computed on the device,
        so a CUDA-graph decode step stays host-free)."""
        p = positions.to(torch.float64)
        return (1.0 + self.temp_beta * torch.log1p(torch.floor(p / self.temp_len))).to(torch.float32)

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """Llama's (the fused decode paths included) unless YaRN or the temperature applies; then q, k, v,
        the YaRN rope and the cache write, q times c^2 tau(p), attention, W_o with the residual add and
        the FFN norm."""
        if self.rope is self.cfg.rope and not self.temp_beta:
            return super().attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q = rope_and_write(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, self.rope, ctx)
        if self.temp_beta:
            q = q * (self.q_scale * self.temperature(step.positions)).to(q.dtype).view(T, 1, 1)
        elif self.q_scale != 1.0:
            q = q * self.q_scale
        o = merge_heads(cache.attend(i, q, step, ctx))
        return ops.linear_add_rms_norm(o, blk.attn_output, x, blk.ffn_norm, eps, act, ctx, into_linear=True,
                                       role="ffn_norm")
