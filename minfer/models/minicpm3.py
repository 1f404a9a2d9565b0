"""MiniCPM3-4B (MiniCPM3ForCausalLM): the GGUF arch `minicpm3`.

    x_0 = 12 E[tokens]                                               token_embd (V, D), scale_emb
    for each layer l (L layers, s = 1.4 / sqrt(L)):
        x = x + s * W_o mla_l(n(x))                                  n  = RMSNorm(attn_norm)
        x = x + s * W_down(silu(W_gate n'(x)) * W_up n'(x))          n' = RMSNorm(ffn_norm)
    logits = W_out (256 / D) RMSNorm(x; output_norm)                  output (or the embedding when tied)

llama.cpp src/models/minicpm3.cpp: scale_emb 12, scale_depth 1.4 and dim_model_base 256 are
constants of the graph (the converter, conversion/minicpm.py MiniCPM3Model, writes none of them;
they are MiniCPM3-4B's values, HF MiniCPM3Config's defaults), so they are constants here too.

Attention: DeepSeek-V2's multi-head latent attention with q_lora (HF MiniCPM3Attention is
DeepseekV2Attention with half-split cos/sin rope), run in deepseek2.py's absorbed form over its
latent cache (one K row of kv_lora_rank R + rope dims Dr per token and layer, V its first R dims):
    q = W_qb RMSNorm(W_qa h; q_a_norm)          attn_q_a (Q, D), attn_q_a_norm, attn_q_b (H*(Dn+Dr), Q)
    c, k_pe = W_kva h split at R                attn_kv_a_mqa (R+Dr, D); c = RMSNorm(c; kv_a_norm)
    rope on q[h, Dn:] and the shared k_pe       NEOX (llama_model_rope_type: LLM_ARCH_MINICPM3), the
                                                graph's ggml_rope_set_offset(q, n_embd_head_qk_nope)
    k_nope[h], v[h] = Kb[h] c, Vb[h] c          attn_kv_b (H*(Dn+Dv), R): per head Dn key rows then Dv
                                                value rows (the graph's views of kv: offset 0 / Dn,
                                                stride Dn+Dv); split here into deepseek2's attn_k_b
                                                (H, R, Dn) (transposed) and attn_v_b (H, Dv, R)
    scale 1/sqrt(Dn + Dr)                       the graph's kq_scale = 1/sqrt(n_embd_head_k)
llama.cpp decompresses (k = [Kb c, k_pe] per head, an MHA cache of H (Dn+Dr) + H Dv values); the
absorbed form computes the same scores q_nope.(Kb^T c) + q_pe.k_pe and values Vb (softmax . c).
Dn + Dr = attention.key_length; Dv = attention.value_length, else D / H (llama.cpp's default: the
converter writes no value_length). The cache's geometry (cache_config): one kv head of R + Dr
dims, V its first R (ModelConfig.cache_v_in_k), whatever head_count_kv says.

LongRoPE: rope_factors_short.weight / rope_factors_long.weight (Dr/2 divisors each, read by
config.py); the long ones when the context exceeds rope.scaling.original_context_length, else
context_length (llama_model::get_rope_factors against n_ctx_orig_yarn, which defaults to the
trained context: the converter writes no original length), phi3.py's rope_for; cos and sin times
rope.scaling.attn_factor (1 when absent, as the release).

Refused by name: a file without q_lora_rank or attn_q_a (every MiniCPM3 has the low-rank q; the
graph has no plain attn_q), rope dims not below the key length, and a value_length other than D / H
with key_length (the converter never writes one).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.deepseek2 import Deepseek2Model, MlaBlock
from minfer.models.layers import load_head
from minfer.weights import load_dense, load_qweight, load_vector

SCALE_EMB = 12.0        # llama.cpp minicpm3.cpp scale_embd (HF scale_emb)
SCALE_DEPTH = 1.4       # scale_depth: each residual branch times scale_depth / sqrt(n_layer)
DIM_MODEL_BASE = 256    # n_embd_base: the normed output times n_embd_base / n_embd before the head


class MiniCPM3Model(Deepseek2Model):
    arch = "minicpm3"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_MINICPM3 -> NEOX
    paged_kv = True           # the latent cache, as deepseek2's (paged_kv.py v_in_k)
    value_in_key = False      # no value_length key: cache_config sets the latent geometry
    expert_gatings = ("softmax",)

    @classmethod
    def mla_dims(cls, gf, cfg: ModelConfig) -> tuple[int, int, int, int, int, int]:
        """(H, R, Dr, Dn, Dv, Q) from the header, checked."""
        md, a = gf.metadata, cls.arch
        for k in ("attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length", "rope.dimension_count"):
            if f"{a}.{k}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{k}' is missing (needed to build the {a} model)")
        H, D = cfg.n_heads, cfg.d_model
        R, Q, Dk = int(md[f"{a}.attention.kv_lora_rank"]), int(md[f"{a}.attention.q_lora_rank"]), cfg.head_dim
        Dr, Dv = cfg.rope.n_rot, int(md.get(f"{a}.attention.value_length", D // H) or 0)
        if R <= 0 or Q <= 0:
            raise MinferError(f"{gf.path}: {a}.attention.kv_lora_rank={R}, q_lora_rank={Q}: expected both positive "
                              "(MiniCPM3's low-rank q and latent kv)")
        if Dk - Dr < 1:
            raise MinferError(f"{gf.path}: {a}.attention.key_length={Dk}, rope.dimension_count={Dr}: expected rope "
                              "dims below the key length (the key's first key_length - rope dims are unrotated)")
        if Dv <= 0:
            raise MinferError(f"{gf.path}: {a}.attention.value_length={Dv}: expected a positive value head size")
        return H, R, Dr, Dk - Dr, Dv, Q

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> ModelConfig:
        """The latent cache's geometry: one kv head of R + Dr dims, V its first R (the memory
        preflight's config, commands/preflight.py, and the model's)."""
        _, R, Dr, _, _, _ = cls.mla_dims(gf, cfg)
        return replace(cfg, n_kv_heads=1, head_dim=R + Dr, cache_v_in_k=R, kv_heads_per_layer=None)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MiniCPM3Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        H, R, Dr, Dn, Dv, Q = cls.mla_dims(gf, cfg)
        D, V, F, Dk = cfg.d_model, cfg.vocab, cfg.ffn, Dn + Dr
        if "blk.0.attn_q_a.weight" not in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_q_a.weight' is missing ({cls.arch} has only the "
                              "low-rank q: attn_q_a, attn_q_a_norm, attn_q_b)")
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer", disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def vec(name, n):
                return load_vector(gf, p + name + ".weight", device, n)

            name = p + "attn_kv_b.weight"
            info = gf.tensor(name)
            if tuple(info.shape) != (H * (Dn + Dv), R):
                raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, expected "
                                  f"({H * (Dn + Dv)}, {R}) (heads x (key_length - rope dims + value dims), "
                                  "kv_lora_rank)")
            kv_b = load_dense(gf, name).view(H, Dn + Dv, R)     # per head: Dn key rows, then Dv value rows
            b = MlaBlock(attn_norm=vec("attn_norm", D), attn_kv_a_mqa=w("attn_kv_a_mqa", (R + Dr, D)),
                         attn_kv_a_norm=vec("attn_kv_a_norm", R),
                         attn_k_b=kv_b[:, :Dn].transpose(1, 2).contiguous().to(device=device, dtype=act_dtype),
                         attn_v_b=kv_b[:, Dn:].contiguous().to(device=device, dtype=act_dtype),
                         attn_output=w("attn_output", (D, H * Dv)), ffn_norm=vec("ffn_norm", D),
                         attn_q_a=w("attn_q_a", (Q, D)), attn_q_a_norm=vec("attn_q_a_norm", Q),
                         attn_q_b=w("attn_q_b", (H * Dk, Q)),
                         ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)))
            blocks.append(b)
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cls.cache_config(gf, cfg), token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.dims = (H, R, Dr, Dn, Dv)
        m.rope = cfg.rope                         # the short factors (config.py); rope_for picks per context
        m.rope_scale = cfg.rope_attn_factor       # cos/sin factor (deepseek2.attention multiplies q_pe, k_pe)
        m.kq_scale = 1.0 / math.sqrt(Dk)
        m.scale_emb, m.scale_res = SCALE_EMB, SCALE_DEPTH / math.sqrt(cfg.n_layers)
        m.scale_head = DIM_MODEL_BASE / D
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

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, s = self.act_dtype, self.cfg.rms_eps, self.scale_res
        rope = self.rope_for(cache)
        x = ops.embedding(tokens, self.token_embd) * self.scale_emb                # (T, D) float32
        for i, b in enumerate(self.blocks):
            h = ops.rms_norm(x, b.attn_norm, eps).to(act)
            a = self.attention(h, b, i, cache, step, ctx, rope=rope)
            x, h = ops.add_rms_norm(x, a.float() * s, b.ffn_norm, eps, act, ctx)
            x = x + self.ffn(h, b, ctx).float() * s
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)              # (R, D)
        return self.head(h, ctx) * self.scale_head   # (R, V)
