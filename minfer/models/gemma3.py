"""Gemma 3 (text): the GGUF arch `gemma3`.

    x_0 = E[tokens] * sqrt(D)                          token_embd (V, D), tied lm head
    for each layer l:
        a = W_o attn_l(rope_l(qn(W_q n(x))), rope_l(kn(W_k n(x))), W_v n(x))    n  = RMSNorm(attn_norm)
        x = x + pn(a)                                                           pn = RMSNorm(post_attention_norm)
        f = W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x))                        n' = RMSNorm(ffn_norm)
        x = x + fn(f)                                                           fn = RMSNorm(post_ffw_norm)
    logits = W_out RMSNorm(x; output_norm)   [then cap * tanh(logits / cap) if final_logit_softcapping]

Facts from llama.cpp (src/models/gemma3.cpp, llama-hparams.cpp) and its converter
(conversion/gemma.py Gemma3Model):
- The converter stores every `*norm.weight` as 1 + w (HF Gemma3RMSNorm computes x * (1 + w)),
  so all norms here are plain RMSNorms, q/k norms (per head, (Dh,)) included.
- Sliding-window layers: with `gemma3.attention.sliding_window` = W > 0, layer l is local when
  l % P < P - 1, P = `gemma3.attention.sliding_window_pattern` (default 6: five local layers,
  then one global); an array-valued pattern lists each layer. A local query at position p sees
  keys p - W < j <= p (llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD: masked when
  p - j >= W). Without the key every layer is global.
- Local layers rotate with `gemma3.rope.freq_base_swa` (default 10000, llama_hparams
  rope_freq_base_train_swa), global ones with `gemma3.rope.freq_base`. RoPE is NEOX.
- Attention scale: 1/sqrt(head_dim) (= query_pre_attn_scalar^-0.5 for every released size but
  27B, for which llama.cpp uses 1/sqrt(n_embd / n_head); the GGUF has no query_pre_attn_scalar).
- The FFN activation is GELU with the tanh approximation (HF gelu_pytorch_tanh; ggml_gelu).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, head_norm
from minfer.models.llama import LlamaModel
from minfer.weights import load_vector

# llama.cpp llama_model_gemma3::load_arch_hparams: load_swa_pattern(ml, 6)
DEFAULT_SWA_PATTERN = 6


def swa_layers(n_layers: int, window: int, pattern) -> tuple[bool, ...]:
    """Which layers use the sliding window (llama_hparams::set_swa_pattern, dense_first=False)."""
    if window <= 0:
        return (False,) * n_layers
    if isinstance(pattern, (list, tuple)):
        if len(pattern) < n_layers:
            raise MinferError(f"gemma3.attention.sliding_window_pattern has {len(pattern)} entries, "
                              f"expected one per layer ({n_layers})")
        return tuple(bool(p) for p in pattern[:n_layers])
    p = DEFAULT_SWA_PATTERN if pattern is None else int(pattern)
    return tuple(p == 0 or (i % p) < p - 1 for i in range(n_layers))


class Gemma3Model(LlamaModel):
    arch = "gemma3"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA3 -> NEOX
    qk_norm = True
    big_n_layers = 62         # the 27B, whose query scale is 1/sqrt(n_embd / n_head)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Gemma3Model":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        c, D = m.cfg, m.cfg.d_model
        m.post_attention_norm = [load_vector(gf, f"blk.{i}.post_attention_norm.weight", device, D)
                                 for i in range(c.n_layers)]                              # (D,) each
        m.post_ffw_norm = [load_vector(gf, f"blk.{i}.post_ffw_norm.weight", device, D)
                           for i in range(c.n_layers)]
        cls.attention_layout(m, gf)
        # q is pre-scaled so that attention's 1/sqrt(Dh) gives llama.cpp's f_attention_scale
        # (a soft-cap then sees the same scaled scores as llama.cpp's and HF's)
        scale = 1.0 / math.sqrt(D / c.n_heads) if c.n_layers == cls.big_n_layers else 1.0 / math.sqrt(c.head_dim)
        m.q_scale = scale * math.sqrt(c.head_dim)
        m.embed_scale = math.sqrt(D)
        return m

    @classmethod
    def attention_layout(cls, m, gf) -> None:
        """m.is_local, m.window, m.layer_rope, and the soft-caps (m.attn_softcap, m.final_softcap;
        0: none) from the config (gemma2 overrides this with its own keys)."""
        c = m.cfg
        m.is_local = swa_layers(c.n_layers, c.sliding_window, c.swa_pattern)
        m.window = c.sliding_window
        m.layer_rope = [c.rope_swa if loc else c.rope for loc in m.is_local]
        m.attn_softcap = 0.0
        m.final_softcap = c.final_logit_softcap or 0.0

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D): q/k norms (qk_norm), this layer's rope and
        window, soft-capped scores (attn_softcap > 0)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k = q.view(T, H, Dh), k.view(T, Hkv, Dh)
        if self.qk_norm:
            q = head_norm(q, blk.attn_q_norm, c.rms_eps)
            k = head_norm(k, blk.attn_k_norm, c.rms_eps)
        q = ops.rope(q, step.positions, self.layer_rope[i])
        k = ops.rope(k, step.positions, self.layer_rope[i])
        if self.q_scale != 1.0:
            q = q * self.q_scale
        cache.write(i, k, v.view(T, Hkv, Dh), step)
        o = cache.attend(i, q, step, ctx, window=self.window if self.is_local[i] else 0,
                         softcap=self.attn_softcap)                                   # (T, H, Dh)
        return ops.linear(o.reshape(T, H * Dh), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd) * self.embed_scale        # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.post_attention_norm[i], eps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            gate = ops.linear(h, blk.ffn_gate, None, ctx)
            up = ops.linear(h, blk.ffn_up, None, ctx)
            f = ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx)
            x = x + ops.rms_norm(f.float(), self.post_ffw_norm[i], eps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)        # (R, D)
        logits = self.head(h, ctx)                # (R, V)
        cap = self.final_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits
