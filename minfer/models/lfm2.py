"""Liquid AI LFM2 / LFM2.5 (350M, 700M, 1.2B, 2.6B): the GGUF arch `lfm2`, a hybrid of
short-convolution blocks and GQA attention blocks.

    x_0 = E[tokens]                                       token_embd (V, D); output (V, D), or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)                         (HF operator_norm)
        conv layer:  [B; C; u] = W_in h                   shortconv.in_proj (3D, D): three chunks of D
                     s_p = B_p * u_p                      (per position p)
                     y_p = C_p * sum_k w[:, k] s_{p-L+1+k}    shortconv.conv (D, L), s_j = 0 for j < 0
                     x = x + W_out y                      shortconv.out_proj (D, D)
        attn layer:  x = x + W_o attn(rope(qn(W_q h)), rope(kn(W_k h)), W_v h)   qn, kn: RMSNorm per head
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))   n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; token_embd_norm)

Each rule and its source (llama.cpp src/models/lfm2.cpp; the converter conversion/lfm2.py
LFM2Model; HF transformers models/lfm2/modeling_lfm2.py):
- Which layers are convolutions: `lfm2.attention.head_count_kv` is an array, 0 on the conv layers
  (the converter writes 0 where HF layer_types says "conv"; llama.cpp is_recr = n_head_kv(il) == 0).
  A scalar head_count_kv means attention everywhere (llama.cpp's reading too). minfer takes one
  kv-head count for every attention layer (the released models) and refuses others by the key.
- The conv block (build_shortconv_block; HF Lfm2ShortConv): in_proj's rows are B, C, x in that
  order (HF BCx.chunk(3)); a causal depthwise conv of `lfm2.shortconv.l_cache` = L taps (the
  released files: 3) over B*x, tap L-1 on the current position (HF F.conv1d with L-1 left
  padding, a cross-correlation; ggml_ssm_conv over [state, Bx]); no biases (llama.cpp loads none;
  HF conv_bias is False in the released configs). The converter squeezes HF's (D, 1, L) to
  (D, L) (ggml {L, D}).
- Attention: q/k RMSNorm per head before rope (HF q_layernorm / k_layernorm), RoPE NEOX
  (llama_model_rope_type: LLM_ARCH_LFM2 -> NEOX; q/k unpermuted), scale 1/sqrt(head_dim).
- Pre-norms only, SwiGLU FFN on every layer (n_layer_dense_lead = n_layer: no MoE in `lfm2`),
  one eps (attention.layer_norm_rms_epsilon) for all norms.
- The final norm is stored as `token_embd_norm.weight` (llama.cpp LLM_TENSOR_OUTPUT_NORM_LFM2, "fix
  for wrong tensor name": HF's embedding_norm, applied after the last layer).
- Refused by name: `lfm2.attention.sliding_window` > 0 (llama.cpp's window variant: no HF model
  has it), `lfm2.attention.causal` false (the bidirectional embedding models), L < 2.

The conv state. llama.cpp keeps a rolling state of the last L-1 values of B*x per sequence. minfer
stores B*x of every position in the KV cache instead: a conv layer's per-layer geometry
(runtime/kv_cache.py kv_layers) is (1, D, 0) -- K rows of D values, no V -- and its step writes
its rows and reads each token's last L rows back (cache.write_window). Decode, a prompt in pieces,
a reused prefix and the paged cache then need no state of their own; the price is D values per
position per conv layer where llama.cpp holds (L-1) * D per sequence (the preflight counts them:
kv_bytes_per_position). The conv itself is a few torch ops on every device (counted on CUDA as
`shortconv.torch`; there is no Triton kernel for it).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import with_kv_layers
from minfer.models.layers import Block, attention_residual_norm, load_block
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_dense, load_qweight, load_vector


def conv_layers(gf, cfg: ModelConfig) -> tuple:
    """Which layers are short convolutions (head_count_kv 0), checking the kv-head counts of the rest."""
    per = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * cfg.n_layers
    counts = {h for h in per if h}
    if len(counts) != 1:
        raise MinferError(f"{gf.path}: {cfg.arch}.attention.head_count_kv {list(per)}: minfer takes one kv-head "
                          "count for every attention layer")
    return tuple(h == 0 for h in per)


def l_cache(gf, arch: str) -> int:
    key = f"{arch}.shortconv.l_cache"
    if key not in gf.metadata:
        raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model: "
                          "the short convolution's kernel size)")
    L = gf.metadata[key]
    if not isinstance(L, int) or isinstance(L, bool) or not 2 <= L <= 64:
        raise MinferError(f"{gf.path}: metadata key '{key}' = {L!r}: expected an integer in 2..64")
    return L


class Lfm2Model(LlamaModel):
    """blocks[i] holds the FFN and both norms of every layer, q/k/v/o (with q/k norms) of attention
    layers only; conv_in / conv_w / conv_out[i] the conv layers' (None elsewhere)."""

    arch = "lfm2"
    rope_style = "neox"            # llama_model_rope_type: LLM_ARCH_LFM2 -> NEOX
    qk_norm = True
    per_layer_counts = True        # head_count_kv is an array (0: a conv layer)
    attention_free_layers = True   # ... whose zeros ModelConfig accepts for this class

    @classmethod
    def check_supported(cls, gf, cfg: ModelConfig) -> None:
        arch = cfg.arch
        window = gf.metadata.get(f"{arch}.attention.sliding_window", 0)
        if window:
            raise MinferError(f"{gf.path}: metadata '{arch}.attention.sliding_window' = {window}: a sliding window on "
                              f"the attention layers is not supported for {arch}")
        if gf.metadata.get(f"{arch}.attention.causal", True) is False:
            raise MinferError(f"{gf.path}: metadata '{arch}.attention.causal' is false (a bidirectional embedding "
                              "model): not supported")

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the caches' per-layer geometry: (Hkv, Dh, Dh) on attention layers, (1, D, 0) on conv
        layers (B*x of every position; the memory preflight's config, commands/preflight.py)."""
        return with_kv_layers(cfg, tuple((1, cfg.d_model, 0) if conv else (cfg.n_kv_heads, cfg.head_dim, cfg.head_dim)
                                         for conv in conv_layers(gf, cfg)))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Lfm2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_supported(gf, cfg)
        is_conv, L = conv_layers(gf, cfg), l_cache(gf, cfg.arch)
        V, D = cfg.vocab, cfg.d_model
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = [cls.load_lfm2_block(gf, cfg, i, is_conv[i], device, dtype) for i in range(cfg.n_layers)]
        # the final norm under the embedding norm's name (llama.cpp LLM_TENSOR_OUTPUT_NORM_LFM2)
        output_norm = load_vector(gf, "token_embd_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.cfg = cls.cache_config(gf, cfg)
        m.is_conv, m.l_cache = is_conv, L
        m.conv_in, m.conv_w, m.conv_out = [None] * cfg.n_layers, [None] * cfg.n_layers, [None] * cfg.n_layers
        for i in (i for i, c in enumerate(is_conv) if c):
            p = f"blk.{i}.shortconv."
            m.conv_in[i] = load_qweight(gf, p + "in_proj.weight", device, (3 * D, D), dtype=dtype)
            m.conv_out[i] = load_qweight(gf, p + "out_proj.weight", device, (D, D), dtype=dtype)
            info = gf.tensor(p + "conv.weight")
            if tuple(info.shape) != (D, L):
                raise MinferError(f"{gf.path}: tensor '{p}conv.weight' has shape {tuple(info.shape)}, expected "
                                  f"({D}, {L}) (embedding_length, shortconv.l_cache)")
            m.conv_w[i] = load_dense(gf, p + "conv.weight").reshape(D, L).t().contiguous().to(device)   # (L, D)
        return m

    @staticmethod
    def load_lfm2_block(gf, cfg: ModelConfig, i: int, conv: bool, device, dtype) -> Block:
        """blk.i's norms and FFN, and q/k/v/o with the q/k norms on an attention layer (the conv
        weights: from_gguf)."""
        if not conv:
            return load_block(gf, cfg, i, device, dtype, qk_norm=True)
        p, D, F = f"blk.{i}.", cfg.d_model, cfg.ffn

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        return Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D), attn_q=None, attn_k=None,
                     attn_v=None, attn_output=None, ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                     ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)))

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        return super().qweights() + [w for w in (*self.conv_in, *self.conv_out) if w is not None]

    # ---- the forward ----

    def short_conv(self, h: torch.Tensor, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's conv block before out_proj: C * conv(B * x), (T, D) in h's dtype. B*x of the step's
        tokens goes to the cache; each token's last L rows come back (cache.write_window)."""
        D = self.cfg.d_model
        bcx = ops.linear(h, self.conv_in[i], None, ctx)                       # (T, 3D)
        b, c, x = bcx[:, :D], bcx[:, D:2 * D], bcx[:, 2 * D:]
        rows = cache.write_window(i, b * x, step, self.l_cache)              # (T, L, D)
        if ops._backend(h) is not ops.reference:      # the CUDA backend (or the tests' interpreted one)
            ops.paths.count("shortconv.torch")
        conv = (rows.float() * self.conv_w[i]).sum(1)                        # (T, D) float32
        return (c.float() * conv).to(h.dtype)

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """The layer's operator (conv or attention), its residual add and the FFN norm."""
        if not self.is_conv[i]:
            return attention_residual_norm(h, blk, self.cfg, cache, i, step, ctx, x, blk.ffn_norm, eps, act)
        return ops.linear_add_rms_norm(self.short_conv(h, i, cache, step, ctx), self.conv_out[i], x, blk.ffn_norm, eps,
                                       act, ctx, into_linear=True, role="ffn_norm")
