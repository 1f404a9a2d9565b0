"""IBM Granite (3.x dense): the GGUF arch `granite`.

    x_0 = E[tokens] * es                                     token_embd (V, D); output, or tied
    for each layer l:
        a = W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))   scores (q . k) * as      n = RMSNorm(attn_norm)
        x = x + rs * a
        x = x + rs * W_down(silu(W_gate n'(x)) * W_up n'(x))                            n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm) / ls

Llama's block with four multipliers. Each rule and its source:
- The multipliers and their keys: `granite.embedding_scale` (es), `granite.attention.scale` (as),
  `granite.residual_scale` (rs), `granite.logit_scale` (ls), written by llama.cpp's converter from
  HF's embedding_multiplier, attention_multiplier, residual_multiplier and logits_scaling
  (conversion/granite.py GraniteModel.set_gguf_parameters). llama.cpp reads the logit scale as
  required and the others as optional (src/models/granite.cpp load_arch_hparams); an absent or
  zero one is not applied: the embeddings unscaled (llama-graph.cpp build_inp_embd:
  `f_embedding_scale != 0`), kq_scale 1/sqrt(head_dim) (granite.cpp build_attention_layer), the
  branches added unscaled (granite.cpp build_layer_ffn: `if (hparams.f_residual_scale)`).
- Where they act (granite.cpp graph): the embeddings are scaled once; the attention scores by as
  in place of 1/sqrt(head_dim); each branch output (attention after W_o, the MLP after W_down) by
  rs before its residual add; the logits by 1/ls after the lm head. HF modeling_granite does the
  same (GraniteModel.forward: inputs_embeds * embedding_multiplier; GraniteAttention.scaling =
  attention_multiplier; GraniteDecoderLayer: residual + hidden_states * residual_multiplier;
  GraniteForCausalLM: logits / logits_scaling).
- Here the query is scaled by as * sqrt(head_dim) before the rope (a linear map: the same scores),
  so the attention kernels keep their 1/sqrt(head_dim).
- RoPE NORM (llama_model_rope_type: LLM_ARCH_GRANITE; the converter permutes q/k as Llama's),
  SwiGLU MLP (granite.cpp LLM_FFN_SILU, LLM_FFN_PAR), `output.weight` or the tied embedding.
- Not taken, refused by name: the optional bias tensors (attn_output.bias, ffn_*.bias;
  granite.cpp load_arch_tensors: TENSOR_NOT_REQUIRED), rope switched off
  (`granite.rope.scaling.finetuned` false: load_arch_hparams uses it as the rope switch), the
  vision models' deepstack inputs (`granite.deepstack_mapping`), and the MoE / hybrid / SWA
  variants, which are other architectures (granitemoe, granitehybrid, granite_swa).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel

_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def refuse_biases(gf, cfg: ModelConfig, names: tuple = _BIASES) -> None:
    """MinferError naming the first `blk.N.<name>.bias` tensor the file has, for each name of `names` (the
    matrices these models run without bias: granite, granitehybrid, jamba, falcon-h1, nemotron_h)."""
    for i in range(cfg.n_layers):
        for name in names:
            t = f"blk.{i}.{name}.bias"
            if t in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{t}': {cfg.arch} files with bias tensors are not supported")


def check_supported(gf, cfg: ModelConfig) -> None:
    """Refuse what this model does not run, naming the tensor or key (module doc)."""
    a = cfg.arch
    refuse_biases(gf, cfg)
    md = gf.metadata
    if md.get(f"{a}.rope.scaling.finetuned", True) is False:
        raise MinferError(f"{gf.path}: metadata key '{a}.rope.scaling.finetuned' is false (no rope), "
                          "which is not supported")
    mapping = md.get(f"{a}.deepstack_mapping")
    if mapping is not None and any(int(v) >= 0 for v in mapping):
        raise MinferError(f"{gf.path}: metadata key '{a}.deepstack_mapping' maps vision inputs into "
                          "decoder layers (Granite Vision), which is not supported")


def _scale(gf, key: str, required: bool = False) -> float:
    """A multiplier key: its value, or 0.0 (not applied) when absent; a required one must be there."""
    if key not in gf.metadata:
        if required:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the granite model)")
        return 0.0
    v = float(gf.metadata[key])
    if not math.isfinite(v) or v < 0 or (required and v == 0):
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v}, expected a positive number")
    return v


class GraniteScales:
    """The four multipliers and the forward that applies them, for GraniteModel and
    GraniteMoeModel (minfer/models/granitemoe.py): the FFN is the subclass's `_ffn(i, h, ctx)`."""

    def _load_scales(self, gf, cfg: ModelConfig) -> None:
        self.embed_scale = _scale(gf, f"{cfg.arch}.embedding_scale") or 1.0
        attn = _scale(gf, f"{cfg.arch}.attention.scale")
        self.q_scale = attn * math.sqrt(cfg.head_dim) if attn else 1.0
        self.residual_scale = _scale(gf, f"{cfg.arch}.residual_scale") or 1.0
        self.logit_scale = _scale(gf, f"{cfg.arch}.logit_scale", required=True)

    def _branch(self, a: torch.Tensor) -> torch.Tensor:
        """A branch output scaled for its residual add (float32, as the residual stream)."""
        a = a.float()
        return a * self.residual_scale if self.residual_scale != 1.0 else a

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D), the query scaled by q_scale."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        f = None
        for i, blk in enumerate(blocks):
            x, h = ops.add_rms_norm(x, self._branch(self._attention(h, blk, i, cache, step, ctx)), blk.ffn_norm,
                                    eps, act, ctx)
            f = self._ffn(i, h, ctx)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, self._branch(f), blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                                    # (R, D)
        _, h = ops.add_rms_norm(x, self._branch(f), self.output_norm, eps, act, ctx)
        logits = self.head(h, ctx)     # (R, V)
        return logits * (1.0 / self.logit_scale)        # granite.cpp: ggml_scale(cur, 1.0f / f_logit_scale)


class GraniteModel(GraniteScales, LlamaModel):
    """Llama's weights; GraniteScales' forward applies the four multipliers (module doc)."""

    arch = "granite"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_GRANITE -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GraniteModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m._load_scales(gf, cfg)
        return m

    def _ffn(self, i: int, h: torch.Tensor, ctx) -> torch.Tensor:
        return ffn_branch(h, self.blocks[i], ctx)
