"""OLMo 1 (OLMo-1B, OLMo-7B, OLMo-7B-0424 / OLMo-1.7-7B, the -hf checkpoints): the GGUF arch `olmo`.

    x_0 = E[tokens]                                     token_embd (V, D); output, or the embedding when tied
    for each layer l:
        h = LN(x)                                       no weight, no bias
        q, k, v = clip(W_q h), clip(W_k h), clip(W_v h) clip(y) = clamp(y, -c, c), only with clamp_kqv
        x = x + W_o attn(rope(q), rope(k), v)
        x = x + W_down(silu(W_gate LN(x)) * W_up LN(x))
    logits = W_out LN(x)

Each rule and its source (llama.cpp src/models/olmo.cpp; HF modeling_olmo):
- Non-parametric LayerNorm (mean removed, no weight, no bias) before attention, before the MLP and
  at the output (olmo.cpp build_norm(cur, NULL, NULL, LLM_NORM); HF OlmoLayerNorm: F.layer_norm(x,
  None, None, eps=1e-5) in float32). No attn_norm / ffn_norm / output_norm tensors exist
  (llama_model_olmo::load_arch_tensors); minfer runs ops.layer_norm with a weight of ones.
  eps `olmo.attention.layer_norm_epsilon` (load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS, required;
  the converter writes 1e-5, HF's constant).
- clip_qkv: with `olmo.attention.clamp_kqv` > 0 each of q, k and v is clamped to [-c, c] after its
  projection, before rope (llm_graph_context::build_qkv: ggml_clamp on Qcur, Kcur, Vcur when
  hparams.f_clamp_kqv > 0; load_arch_hparams reads the key optionally; HF OlmoAttention:
  query/key/value_states.clamp_(-clip_qkv, clip_qkv) on the projections). The converter writes the key
  only when clip_qkv is set (conversion/olmo.py; OLMo-1.7-7B: 8.0); absent or 0 (llama.cpp's rule, any
  value <= 0): no clamp. A value that is not a finite number is refused by the key.
- RoPE NORM (llama_model_rope_type: LLM_ARCH_OLMO -> NORM; the converter permutes q/k as for llama:
  conversion/olmo.py OlmoModel.modify_tensors), over the whole head (olmo.cpp asserts n_rot == head
  size: a partial rope.dimension_count is refused), scale 1/sqrt(head_dim), GQA.
- SwiGLU MLP (build_ffn LLM_FFN_SILU, LLM_FFN_PAR), output.weight or the embedding when tied.
- No biases: llama.cpp's loader has no attn_output.bias (a file with it has an unused tensor, which the
  loader refuses) and the released models have none (HF attention_bias False): any bias tensor is refused
  by name. A fused attn_qkv.weight is refused too.
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_heads, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import load_qweight

BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_qkv.weight",
          "ffn_up.bias", "ffn_gate.bias", "ffn_down.bias")


def clamp_kqv(gf) -> float:
    """`{arch}.attention.clamp_kqv`: the q/k/v clip, 0.0 for none (absent, or <= 0 as llama.cpp)."""
    key = f"{gf.architecture}.attention.clamp_kqv"
    v = gf.metadata.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v!r}, expected a finite number")
    return max(float(v), 0.0)


class OlmoModel(LlamaModel):
    """Llama's weights without norm tensors: Block.attn_norm / ffn_norm and output_norm are one shared
    vector of ones (the LayerNorms have no weight). self.clip: the q/k/v clamp (0: none)."""

    arch = "olmo"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_OLMO -> NORM
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "OlmoModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.rope.dimension_count' is {cfg.rope.n_rot}, "
                              f"expected the head size {cfg.head_dim} (olmo rotates the whole head)")
        for i in range(cfg.n_layers):
            for name in BIASES:
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': olmo has no biases and no fused q/k/v "
                                      "(llama.cpp's olmo loader does not take it)")
        clip = clamp_kqv(gf)
        V, D = cfg.vocab, cfg.d_model
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        from tqdm import tqdm

        blocks = [cls.load_block(gf, cfg, i, device, dtype)
                  for i in tqdm(range(cfg.n_layers), desc=f"loading {gf.path.name}", unit="layer",
                                disable=not progress, leave=False)]
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        m = cls(cfg, token_embd, blocks, blocks[0].attn_norm, output, act_dtype=act_dtype)   # no output_norm
        m.clip = clip
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        p, D, F, Dh = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.head_dim
        H, Hkv = cfg.n_heads, cfg.n_kv_heads

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        ones = torch.ones(D, device=device)      # the LayerNorms have no weight (no attn_norm / ffn_norm)
        return Block(attn_norm=ones, attn_q=w("attn_q", (H * Dh, D)), attn_k=w("attn_k", (Hkv * Dh, D)),
                     attn_v=w("attn_v", (Hkv * Dh, D)), attn_output=w("attn_output", (D, H * Dh)),
                     ffn_norm=ones, ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)),
                     ffn_down=w("ffn_down", (D, F)))

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) (T, D), h's dtype; q, k, v clamped first when self.clip."""
        c = self.cfg
        if not self.clip:       # the llama attention (layers.attention_heads: the fused decode paths on CUDA)
            return ops.linear(attention_heads(h, blk, c, cache, i, step, ctx), blk.attn_output, None, ctx)
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = (t.clamp(-self.clip, self.clip) for t in
                   ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx))
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                                   # (T, D) float32
        for i, blk in enumerate(self.blocks):
            x = x + self.attention(ops.layer_norm(x, blk.attn_norm, eps, act), blk, i, cache, step, ctx).float()
            if i == last:       # olmo.cpp: the last layer's MLP on the output rows only
                x = step.rows(x)
            x = x + ffn_branch(ops.layer_norm(x, blk.ffn_norm, eps, act), blk, ctx).float()
        h = ops.layer_norm(x, self.output_norm, eps, act)                            # (R, D)
        return self.head(h, ctx)       # (R, V)
