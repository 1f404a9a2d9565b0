"""BigScience BLOOM / BLOOMZ (HF BloomForCausalLM): the GGUF arch `bloom`.

    x_0 = LN(E[tokens]; token_embd_norm, token_embd_norm.bias)     no position embeddings
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = split(W_qkv h + b_qkv)                rows: D q, D k, D v
        x = x + W_o attn_alibi(q, k, v) + b_o           no rope; scores + ALiBi's - m_h |p - j|
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output, or the embedding when tied

Each rule and its source (llama.cpp src/models/bloom.cpp, src/llama-model.cpp, src/llama-graph.cpp,
src/llama-kv-cache.cpp, ggml/src/ggml-cpu/ops.cpp ggml_compute_forward_soft_max; conversion/bloom.py BloomModel;
HF modeling_bloom BloomModel / BloomAttention / BloomMLP / build_alibi_tensor):
- The token embeddings go through a LayerNorm with weight AND bias before the first layer (bloom.cpp: build_norm
  (inpL, tok_norm, tok_norm_b, LLM_NORM); HF word_embeddings_layernorm); `token_embd_norm.weight` / `.bias`
  required (load_arch_tensors flag 0). No position embeddings and no rope (llama_model_rope_type: LLM_ARCH_BLOOM
  -> NONE; rope_style "normal" is declared for the registry only).
- ALiBi: each head's scaled scores get - m_h |p - j| added before the softmax (llama-kv-cache set_input_kq_mask
  with use_alibi writes -|p0 - p1| into the mask; ggml_soft_max_ext multiplies the mask by the head's slope).
  The slopes (ops.reference.alibi_slopes, ggml's rule): n_head_log2 = 2^floor(log2 H), m0 = 2^(-max_bias /
  n_head_log2), m1 = 2^(-max_bias / 2 / n_head_log2); head h < n_head_log2 takes m0^(h + 1), the others
  m1^(2 (h - n_head_log2) + 1). max_bias is 8, fixed in llama.cpp's loader for bloom (load_arch_hparams:
  "TODO: become GGUF KV parameter"; no key is read). HF build_alibi_tensor: the same slopes (closest power of 2,
  the extra heads' odd powers of the finer base), added as m_h j: per query row a constant apart from
  - m_h |p - j| on the causal keys, so the same softmax.
- LayerNorm (mean removed) with weight AND bias, eps `bloom.attention.layer_norm_epsilon` (build_norm(...,
  LLM_NORM); HF input_layernorm / post_attention_layernorm / ln_f), before attention and before the MLP,
  sequential residuals on the pre-norm input (bloom.cpp ffn_inp = cur + inpL; HF
  apply_residual_connection_post_layernorm False in every release, which llama.cpp assumes).
- q/k/v from one matrix `blk.N.attn_qkv.weight` (3 D, D) with its bias, rows q, then k, then v: HF's
  query_key_value interleaves them per head (n_head, 3, Dh), which the converter regroups (modify_tensors).
  MHA (head_count_kv = head_count, the converter writes both). Scale 1/sqrt(head_dim) (bloom.cpp kq_scale; HF
  inv_norm_factor), on the scores only, the ALiBi term unscaled (HF baddbmm beta 1, alpha inv_norm_factor).
  Separate q/k/v refused by name (the loader takes attn_qkv only).
- Biases on the fused q/k/v, the output projection and both MLP matrices, all required (flag 0; HF nn.Linear).
- The ungated MLP of `feed_forward_length` (the converter writes 4 D) with GELU's tanh approximation
  (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ): ggml_gelu; HF bloom_gelu_forward: the tanh formula).
- The lm head: `output.weight`, else the embedding (TENSOR_NOT_REQUIRED then TENSOR_DUPLICATED; HF ties lm_head).
- The batch engine's paged cache has no ALiBi: paged_kv False (BatchEngine refuses it by name; `minfer serve`
  serves one request at a time). On CUDA the attention is the counted torch path attention.alibi.torch.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import merge_heads
from minfer.models.starcoder import StarcoderBlock, StarcoderModel
from minfer.models.starcoder2 import layer_norm
from minfer import ops
from minfer.ops.reference import alibi_slopes
from minfer.weights import QWeight, load_vector

BLOOM_MAX_ALIBI_BIAS = 8.0     # llama.cpp llama_model_bloom::load_arch_hparams: f_max_alibi_bias = 8.0f


def file_max_alibi_bias(gf, arch: str, who: str, note: str = "") -> float:
    """The file's `<arch>.attention.max_alibi_bias` where the architecture reads it (mpt, jais), else a MinferError:
    without it llama.cpp's use_alibi is off and such a model has no position information. who: the model as the
    message names it; note: appended inside the message's parentheses."""
    key = f"{arch}.attention.max_alibi_bias"
    v = gf.get(key, None)
    if v is None or not float(v) > 0:
        raise MinferError(f"{gf.path}: {key} is {v}: {who} without ALiBi has no position information "
                          f"(llama.cpp's use_alibi needs max_alibi_bias > 0{note}); not supported")
    return float(v)


class BloomModel(StarcoderModel):
    arch = "bloom"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_BLOOM -> NONE (never applied: no rope)
    norm_eps_key = "attention.layer_norm_epsilon"
    paged_kv = False          # the paged cache has no ALiBi

    @classmethod
    def max_alibi_bias(cls, gf) -> float:
        return BLOOM_MAX_ALIBI_BIAS

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BloomModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_fused_qkv(gf, cfg)
        max_bias = cls.max_alibi_bias(gf)
        m = super(StarcoderModel, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                 act_dtype=act_dtype)
        m.load_embd_norm(gf, cfg, device)
        m.alibi = alibi_slopes(cfg.n_heads, max_bias).to(device)                   # (H,)
        return m

    def load_embd_norm(self, gf, cfg: ModelConfig, device) -> None:
        """The embedding LayerNorm and the output norm's bias (both required)."""
        self.output_norm_b = load_vector(gf, "output_norm.bias", device, cfg.d_model)
        self.embd_norm = load_vector(gf, "token_embd_norm.weight", device, cfg.d_model)
        self.embd_norm_b = load_vector(gf, "token_embd_norm.bias", device, cfg.d_model)

    def head_weights(self) -> list:
        return [self.token_embd, self.output]

    def qweights(self) -> list[QWeight]:
        return super(StarcoderModel, self).qweights()

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: StarcoderBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn_alibi(...) + b_o (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        cache.write(i, k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step)
        o = cache.attend(i, q.reshape(T, H, Dh), step, ctx, alibi=self.alibi)          # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd).float()                            # (T, D)
        x = layer_norm(x, self.embd_norm, self.embd_norm_b, eps, torch.float32)
        for i, blk in enumerate(self.blocks):
            a = self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step, ctx)
            if i == last:     # bloom.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + a.float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
