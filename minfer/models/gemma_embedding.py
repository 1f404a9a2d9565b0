"""EmbeddingGemma (google/embeddinggemma-300m): the GGUF arch `gemma-embedding`. Gemma 3's layers (models/gemma3.py)
with bidirectional attention, for embeddings only, and sentence-transformers' Dense layers after the pooling:

    x_0 = E[tokens] * sqrt(D)                                   token_embd (V, D)
    for each layer l (gemma3's):
        a = W_o attn_l(rope_l(qn(W_q n(x))), rope_l(kn(W_k n(x))), W_v n(x))   bidirectional; sliding layers see
        x = x + pn(a)                                                         |i - j| <= W / 2 only
        x = x + fn(W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x)))
    hidden = RMSNorm(x; output_norm)                             (Model.head: taken by an embeddings run)
    pooled = pool(hidden)  (mean, cls, last; 'none': every row)
    e = W_3 (W_2 pooled)                                         dense_2 (F2, D), dense_3 (D, F2), when the file has them

Each rule and its source (llama.cpp src/models/gemma-embedding.cpp llama_model_gemma_embedding::load_arch_hparams /
load_arch_tensors / graph; src/llama-hparams.h is_masked_swa; src/llama-model.cpp llama_model::build_graph;
src/llama-graph.cpp build_dense_out; src/llama-context.cpp decode's embeddings extraction; conversion/gemma.py
EmbeddingGemma and Gemma3Model; transformers' Gemma3TextModel with use_bidirectional_attention):
- The layers are gemma3's, as stored: every `*norm.weight` is 1 + w (the converter's norm_shift), so all norms are
  plain RMSNorms (q/k norms per head); the embedding scaled by sqrt(D); GELU-tanh GeGLU; NEOX rope, the sliding layers
  with `gemma-embedding.rope.freq_base_swa`, the global ones with `rope.freq_base`; q scaled by 1/sqrt(head_dim)
  (load_arch_hparams: f_attention_scale = 1/sqrt(n_embd_head_k), whatever the size; no soft-caps).
- Attention is bidirectional: load_arch_hparams sets causal_attn = false itself (the converter writes no
  `attention.causal` key; config.py reads the absent key as false for this class: causal_key_default), and the graph
  uses build_attn_inp_no_cache: one forward over the whole input from position 0, no KV cache (NoCache).
- Which layers slide: load_swa_pattern(ml, 6): the `attention.sliding_window_pattern` key when the file has one,
  else layer l slides when l % 6 < 5 (gemma3.swa_layers; transformers' layer_types say the same). The window is
  SYMMETRIC (hparams.swa_type = LLAMA_SWA_TYPE_SYMMETRIC; is_masked_swa masks |p1 - p0| > n_swa / 2, integer halving),
  n_swa = `attention.sliding_window`, which the converter takes raw from config.json (transformers' config turns it
  into an exclusive bound n_swa // 2 + 1: the same keys). Without the key every layer is global.
- The rows after output_norm are the embeddings (res->t_embd); llama.cpp's graph makes no logits, so generation is
  refused (head) with a one-line message.
- The Dense layers (`dense_2.weight`, `dense_3.weight`, both optional: written only by the converter's
  --sentence-transformers-dense-modules from 2_Dense / 3_Dense `linear.weight`, bias-free, Identity activation):
  llama_model::build_graph calls build_dense_out after build_pooling, which applies W_2 then W_3 (ggml_mul_mat) to the
  pooled rows (t_embd_pooled) or, with pooling 'none', to every row (t_embd); decode then hands out those rows. Shapes
  from `gemma-embedding.dense_2_feat_out` / `dense_3_feat_in` (load_arch_tensors), with dense_2_feat_in and
  dense_3_feat_out = embedding_length (load_arch_hparams asserts). Here `post_pool` (called by runtime/embed.py after
  pooling) applies them in float32 on the CPU. No normalization in the graph (sentence-transformers' 4_Normalize is
  Engine.embed's normalize, as llama.cpp's common_embd_normalize).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.bert import bidirectional_attention
from minfer.models.gemma3 import Gemma3Model
from minfer.models.layers import Block, head_norm
from minfer.weights import load_dense


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, half: int) -> torch.Tensor:
    """softmax(scale q k^T) v where query i sees key j only when |i - j| <= half (llama.cpp's symmetric window):
    q (T, H, Dh), k / v (T, Hkv, Dh) -> (T, H * Dh) in q's dtype; grouped kv heads repeated as bert's."""
    ops.paths.count("attention.bidirectional.torch")
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    pos = torch.arange(T, device=q.device)
    mask = (pos[:, None] - pos[None, :]).abs() <= half                                 # (T, T): True = attend
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                       scale=scale)                                   # (H, T, Dh)
    return o.transpose(0, 1).reshape(T, H * Dh)


def load_dense_layers(gf, arch: str, D: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dense_2 (F2, D), dense_3 (D, F3)) float32 on the CPU, each None when the file lacks it (module doc)."""
    md = gf.metadata

    def key(name: str) -> int | None:
        v = md.get(f"{arch}.{name}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise MinferError(f"{gf.path}: metadata key '{arch}.{name}' is {v!r:.40}: expected a positive integer")
        return v

    for name in ("dense_2_feat_in", "dense_3_feat_out"):      # load_arch_hparams: "... must be equal to n_embd"
        v = key(name)
        if v is not None and v != D:
            raise MinferError(f"{gf.path}: metadata key '{arch}.{name}' is {v}, expected the embedding_length {D} "
                              "(llama.cpp asserts it)")
    out = []
    for tname, kname, which in (("dense_2.weight", "dense_2_feat_out", 0), ("dense_3.weight", "dense_3_feat_in", 1)):
        if tname not in gf.tensors:
            out.append(None)
            continue
        n = key(kname)
        if n is None:
            raise MinferError(f"{gf.path}: tensor '{tname}' without the metadata key '{arch}.{kname}' (its width: "
                              "llama.cpp's loader needs it to take the tensor)")
        shape = (n, D) if which == 0 else (D, n)
        got = tuple(int(d) for d in gf.tensor(tname).shape)
        if got != shape:
            raise MinferError(f"{gf.path}: tensor '{tname}' has shape {got}, expected {shape} ({arch}.{kname} {n}, "
                              f"embedding_length {D})")
        out.append(load_dense(gf, tname).reshape(shape).float())
    d2, d3 = out
    if d3 is not None and d3.shape[1] != (D if d2 is None else d2.shape[0]):
        raise MinferError(f"{gf.path}: tensor 'dense_3.weight' takes {d3.shape[1]} values, but "
                          f"{'dense_2.weight gives' if d2 is not None else 'the pooled row has'} "
                          f"{D if d2 is None else d2.shape[0]}")
    return d2, d3


class GemmaEmbeddingModel(Gemma3Model):
    arch = "gemma-embedding"
    causal = False            # an encoder: bidirectional attention, embeddings only (runtime/embed.py: one forward)
    causal_key_default = False   # load_arch_hparams sets causal_attn = false; the converter writes no key
    paged_kv = False          # no KV cache at all

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GemmaEmbeddingModel":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        c = m.cfg
        if c.final_logit_softcap:
            raise MinferError(f"{gf.path}: metadata key '{cls.arch}.final_logit_softcapping': llama.cpp's "
                              f"{cls.arch} graph has no soft-cap (and no logits)")
        m.scale = 1.0 / math.sqrt(c.head_dim)          # f_attention_scale = 1/sqrt(n_embd_head_k)
        m.half_window = c.sliding_window // 2          # is_masked_swa SYMMETRIC: half_n_swa = n_swa / 2
        m.dense_2, m.dense_3 = load_dense_layers(gf, cls.arch, c.d_model)
        return m

    # ---- embeddings only ----

    def head(self, h: torch.Tensor, ctx, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden rows to an embeddings run (Model.head); anything else asked logits, which llama.cpp's graph
        for this arch never makes."""
        if self.hidden_sink is None:
            raise MinferError(f"{self.arch} is an encoder (bidirectional attention, no lm head): it only embeds; "
                              "use `minfer embed`, Engine.embed or the server's /v1/embeddings")
        return super().head(h, ctx, bias)

    def post_pool(self, v: torch.Tensor) -> torch.Tensor:
        """The pooled vector (D,) (or, pooling 'none', the rows (T, D)) through dense_2 then dense_3 (build_dense_out),
        float32 on the CPU; unchanged without them."""
        x = v.float().cpu()
        if self.dense_2 is not None:
            x = x @ self.dense_2.T
        if self.dense_3 is not None:
            x = x @ self.dense_3.T
        return x

    # ---- the forward ----

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D): q/k norms, this layer's rope, q * 1/sqrt(Dh), attention over
        every row (global layers) or the symmetric window (sliding layers); nothing cached."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps)
        k = head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        q = ops.rope(q, step.positions, self.layer_rope[i])
        k = ops.rope(k, step.positions, self.layer_rope[i])
        q, k, v = q.to(h.dtype), k.to(h.dtype), v.view(T, Hkv, Dh)
        if self.is_local[i]:
            o = window_attention(q, k, v, self.scale, self.half_window)
        else:
            o = bidirectional_attention(q, k, v, self.scale)
        return ops.linear(o.to(h.dtype), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at positions 0..T-1 -> the rows step.logits names after output_norm, handed to an
        embeddings run (Model.head); the cache is not used."""
        if step.start != 0:
            raise MinferError(f"{self.arch} is an encoder: its attention sees the whole input, which must go through "
                              f"one forward from position 0 (this step starts at {step.start})")
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd).float() * self.embed_scale      # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.post_attention_norm[i], eps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            gate = ops.linear(h, blk.ffn_gate, None, ctx)
            up = ops.linear(h, blk.ffn_up, None, ctx)
            f = ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx)
            x = x + ops.rms_norm(f.float(), self.post_ffw_norm[i], eps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps)                       # (R, D) float32
        return self.head(h, ctx)
