"""Phi-3 / Phi-3.5 / Phi-4-mini: the GGUF arch `phi3`.

The llama computation (minfer/models/llama.py) with fused weights and its own rope scaling
(llama.cpp src/models/phi3.cpp, conversion/phi.py Phi3MiniModel):
- q, k, v come from one matrix `blk.N.attn_qkv.weight` ((H + 2 Hkv) * Dh, D): rows [0, H*Dh)
  are q, then k, then v (HF Phi3Attention.qkv_proj). Separate attn_q/k/v are accepted too
  (llama.cpp create_tensor_qkv takes either).
- gate and up come from one matrix `blk.N.ffn_up.weight` (2F, D): silu(first F rows) * (last
  F rows) (ggml_swiglu on the fused output; HF Phi3MLP.gate_up_proj chunks gate then up).
- RoPE is NEOX. LongRoPE ('su'/'longrope' models, e.g. Phi-3-mini-128k): per-frequency
  divisors `rope_factors_short.weight` / `rope_factors_long.weight`; llama.cpp takes the long
  ones when the context (here: the KV cache's `context`, the engine's --ctx) exceeds
  `phi3.rope.scaling.original_context_length`, else the short ones
  (llama_model::get_rope_factors), and multiplies cos and sin by
  `phi3.rope.scaling.attn_factor` (ggml_rope_ext attn_factor, from llama-context.cpp): the
  rotated dims of q and k come out multiplied by it, the dims past n_rot (partial rotary,
  Phi-4-mini rotates 96 of 128) unscaled -- as HF's longrope cos/sin scaling does. Here the
  rotated dims are scaled after ops.rope (`rope_scale`, (Dh,)).
- phi3.attention.sliding_window is ignored, as llama.cpp does (phi3.cpp: "Phi SWA is currently
  disabled").
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, load_head
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector


class Phi3Model(LlamaModel):
    arch = "phi3"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_PHI3 -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Phi3Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, F, Dh = cfg.vocab, cfg.d_model, cfg.ffn, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        fused = "blk.0.attn_qkv.weight" in gf.tensors
        blocks = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            if fused:
                qkv = w("attn_qkv", (q_out + 2 * kv_out, D))
                q = k = v = None
            else:
                qkv, q, k, v = None, w("attn_q", (q_out, D)), w("attn_k", (kv_out, D)), w("attn_v", (kv_out, D))
            blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                        attn_q=q, attn_k=k, attn_v=v, attn_output=w("attn_output", (D, q_out)),
                        ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                        ffn_gate=None, ffn_up=w("ffn_up", (2 * F, D)), ffn_down=w("ffn_down", (D, F)))
            blk.attn_qkv = qkv
            blocks.append(blk)
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.rope_scale = None
        if cfg.rope_attn_factor != 1.0:
            s = torch.ones(Dh)
            s[:cfg.rope.n_rot] = cfg.rope_attn_factor
            m.rope_scale = s.to(device)                            # (Dh,)
        return m

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd]
        for b in self.blocks:
            ws += [w for w in (b.attn_qkv, b.attn_q, b.attn_k, b.attn_v, b.attn_output, b.ffn_up, b.ffn_down)
                   if w is not None]
        if self.output is not self.token_embd:
            ws.append(self.output)
        return ws

    def linear_groups(self) -> list[tuple]:
        return [] if self.blocks[0].attn_qkv is not None else super().linear_groups()

    def rope_for(self, cache):
        """Short factors while the context fits the original one, long factors past it.

        The context is `cache.context` (the engine's --ctx), not `cache.n_ctx`: on CUDA the
        cache has its rows rounded up to ops.LENGTH_BUCKET (128), so a 32-position context
        with original_context_length 32 has 128 rows, and reading the rows took the long
        factors on the GPU and the short ones on the CPU (every position past 0 wrong)."""
        c = self.cfg
        if c.rope_long is None:
            return c.rope
        context = getattr(cache, "context", None)
        if context is None:
            raise MinferError(f"{type(cache).__name__} has no `context` (the positions a sequence may "
                              f"use): phi3's LongRoPE picks its factors from it")
        return c.rope_long if context > c.rope_orig_ctx else c.rope

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        c, act, eps = self.cfg, self.act_dtype, self.cfg.rms_eps
        T, H, Hkv, Dh, F = tokens.shape[0], c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
        rope = self.rope_for(cache)
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, blk in enumerate(self.blocks):
            if blk.attn_qkv is not None:
                q, k, v = ops.linear(h, blk.attn_qkv, None, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
            else:
                q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
            q = ops.rope(q.reshape(T, H, Dh), step.positions, rope)
            k = ops.rope(k.reshape(T, Hkv, Dh), step.positions, rope)
            if self.rope_scale is not None:
                q, k = q * self.rope_scale.to(q.dtype), k * self.rope_scale.to(k.dtype)
            cache.write(i, k, v.reshape(T, Hkv, Dh), step)
            o = cache.attend(i, q, step, ctx)                                  # (T, H, Dh)
            x, h = ops.add_rms_norm(x, ops.linear(o.reshape(T, H * Dh), blk.attn_output, None, ctx),
                                    blk.ffn_norm, eps, act, ctx)
            gate_up = ops.linear(h, blk.ffn_up, None, ctx)                     # (T, 2F)
            f = ops.linear(ops.swiglu(gate_up[:, :F].contiguous(), gate_up[:, F:].contiguous()),
                           blk.ffn_down, None, ctx)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
