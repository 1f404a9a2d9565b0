"""MiniCPM 1 / 2 / 4 (MiniCPMForCausalLM: MiniCPM-1B, MiniCPM-2B, MiniCPM-2B-128k, MiniCPM4): the GGUF arch `minicpm`.

    x_0 = es E[tokens]                                             token_embd (V, D)
    for each layer l:
        x = x + rs W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))     n = RMSNorm(attn_norm), GQA
        x = x + rs W_down(silu(W_gate n'(x)) * W_up n'(x))                 n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm) / ls                     output, or token_embd when tied

Llama's block with granite's multipliers less the attention one (minfer/models/granite.py GraniteScales does the
forward; only the rope differs, see below). Each rule and its source:
- The converter (conversion/minicpm.py MiniCPMModel.set_gguf_parameters) writes `minicpm.embedding_scale` = HF
  scale_emb (es), `minicpm.residual_scale` = scale_depth / sqrt(num_hidden_layers) (rs) and `minicpm.logit_scale`
  = hidden_size / dim_model_base (ls). HF modeling_minicpm: inputs_embeds * scale_emb; residual + h * (scale_depth
  / sqrt(num_hidden_layers)) after the attention and after the MLP; lm_head(h / (hidden_size / dim_model_base)).
- llama.cpp's graph is granite's (src/models/models.h: llama_model_minicpm::graph = llama_model_granite::graph):
  embeddings scaled once (llama-graph.cpp build_inp_embd), each branch after W_o / W_down scaled by rs before its
  add (granite.cpp build_layer_ffn), logits times 1 / ls (granite.cpp ggml_scale(cur, 1.0f / f_logit_scale)).
  The attention scale is 1/sqrt(head_dim): minicpm's load_arch_hparams never reads attention.scale, so
  f_attention_scale stays 0 (granite.cpp build_attention_layer's default); the key is ignored here too.
- Defaults when a key is absent (older files; src/models/minicpm.cpp load_arch_hparams): es 12, rs 1.4 /
  sqrt(n_layer) (MiniCPM-2B's scale_emb, scale_depth). The logit scale's default here is n_embd / 256 (HF's
  hidden_size / dim_model_base with the release's dim_model_base 256, and the pre-granite llama.cpp graph's
  `ggml_scale(cur, n_embd_base / n_embd)`); llama.cpp 0.3.36 sets f_logit_scale = 256 / n_embd and divides by it,
  the reciprocal -- the same argmax, other probabilities. A key of 0 applies no scale for es and rs (as llama.cpp:
  `f_embedding_scale != 0`, `if (hparams.f_residual_scale)`) and is refused for ls (a division by zero).
- RoPE NORM (llama_model_rope_type: LLM_ARCH_MINICPM; the converter permutes q/k rows as Llama's,
  MiniCPMModel.modify_tensors), always on (minicpm.cpp: rope_finetuned = true), SwiGLU MLP.
- LongRoPE (MiniCPM-2B-128k, MiniCPM4: HF rope_scaling longrope): the converter writes the factors as
  rope_factors_long.weight / rope_factors_short.weight (MiniCPMModel.generate_extra_tensors, head_dim/2 each) and
  `rope.scaling.type` longrope but no original context length and no attention factor. llama.cpp takes the long
  factors when the context exceeds rope.scaling.original_context_length, else context_length (the trained one:
  llama_model::get_rope_factors against n_ctx_orig_yarn), the short ones otherwise: rope_for, as minicpm3.py's.
  The type key is accepted for this class only (`longrope_factors`, config.py _freq_scale: no linear scale).
  HF's MiniCPMLongRoPE also multiplies cos/sin by sqrt(1 + ln(max_pos / original) / ln(original)) and switches to
  the long factors past original_max_position_embeddings; llama.cpp does neither (no attn_factor written, the
  switch at the trained context): the same as HF where max_position_embeddings equals the original length,
  llama.cpp's numbers otherwise (followed here).

Refused by name: bias tensors (llama.cpp loads attn_output.bias and ffn_*.bias optionally, TENSOR_NOT_REQUIRED;
the converter never writes them: HF MiniCPM has none), experts (expert_count > 0: the MoE branch of minicpm.cpp's
loader, MiniCPM-MoE-8x2B), and rope.scaling.attn_factor other than 1 (the converter never writes one).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.granite import GraniteScales, refuse_biases
from minfer.models.layers import Block, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel

SCALE_EMB = 12.0        # minicpm.cpp load_arch_hparams: f_embedding_scale default
SCALE_DEPTH = 1.4       # minicpm.cpp: f_residual_scale default 1.4 / sqrt(n_layer)
DIM_MODEL_BASE = 256    # HF dim_model_base of the release (logit scale default n_embd / 256, module doc)


def _key(gf, key: str, default: float, zero_ok: bool = True) -> float:
    """A scale key's value, the default when absent; a negative or non-finite value (or 0 where not allowed) refused."""
    if key not in gf.metadata:
        return default
    v = float(gf.metadata[key])
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v}, expected a positive number")
    return v


def check_supported(gf, cfg: ModelConfig) -> None:
    """Refuse what this model does not run, naming the tensor or key (module doc)."""
    refuse_biases(gf, cfg, ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"))
    if cfg.n_experts > 0 or "blk.0.ffn_gate_inp.weight" in gf.tensors:
        raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.expert_count' is {cfg.n_experts} / tensor "
                          f"'blk.0.ffn_gate_inp.weight': MiniCPM-MoE files are not supported")
    if cfg.rope_attn_factor != 1.0:
        raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.rope.scaling.attn_factor' is {cfg.rope_attn_factor}; "
                          f"{cfg.arch} runs without a rope attention factor (its converter writes none)")


class MiniCPMModel(GraniteScales, LlamaModel):
    """Llama's weights; GraniteScales' forward with MiniCPM's three scales and LongRoPE's factor choice."""

    arch = "minicpm"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_MINICPM -> NORM
    longrope_factors = True   # rope.scaling.type longrope accepted (config.py): rope_for picks the factors

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MiniCPMModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        a = cfg.arch
        m.embed_scale = _key(gf, f"{a}.embedding_scale", SCALE_EMB) or 1.0
        m.residual_scale = _key(gf, f"{a}.residual_scale", SCALE_DEPTH / math.sqrt(cfg.n_layers)) or 1.0
        m.logit_scale = _key(gf, f"{a}.logit_scale", cfg.d_model / DIM_MODEL_BASE, zero_ok=False)
        m.q_scale = 1.0       # kq_scale 1/sqrt(head_dim): attention.scale is not read (module doc)
        return m

    def rope_for(self, cache):
        """The short factors while the context (the engine's --ctx, phi3.py's rope_for) fits
        rope.scaling.original_context_length, else context_length; the long ones past it."""
        c = self.cfg
        if c.rope_long is None:
            return c.rope
        context = getattr(cache, "context", None)
        if context is None:
            raise MinferError(f"{type(cache).__name__} has no `context` (the positions a sequence may "
                              f"use): {self.arch}'s LongRoPE picks its factors from it")
        return c.rope_long if context > (c.rope_orig_ctx or c.context_length) else c.rope

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D), rotated with rope_for's factors."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step,
                              self.rope_for(cache), ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def _ffn(self, i: int, h: torch.Tensor, ctx) -> torch.Tensor:
        return ffn_branch(h, self.blocks[i], ctx)
