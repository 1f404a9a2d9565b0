"""GPT-NeoX (EleutherAI Pythia, GPT-NeoX-20B, RedPajama-INCITE, StableLM-alpha; HF GPTNeoXForCausalLM): the GGUF
arch `gptneox`.

    x_0 = E[tokens]                                      token_embd (V, D)
    for each layer l:
        a = W_o attn(rope(q), rope(k), v) + b_o          q, k, v = split(W_qkv LN(x; attn_norm) + b_qkv)
        parallel:   x = x + a + mlp(LN(x; ffn_norm))     use_parallel_residual true
        sequential: x = x + a;  x = x + mlp(LN(x; ffn_norm))
        mlp(h) = W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output (untied)

Each rule and its source (llama.cpp src/models/gptneox.cpp, src/llama-model.cpp; conversion/gptneox.py
GPTNeoXModel; HF modeling_gpt_neox GPTNeoXLayer / GPTNeoXAttention / GPTNeoXMLP):
- Parallel or sequential residual by the required key `gptneox.use_parallel_residual` (load_arch_hparams:
  ml.get_key(LLM_KV_USE_PARALLEL_RESIDUAL) without a default; the converter writes HF's use_parallel_residual,
  default true). Parallel: x + attn(ln1(x)) + mlp(ln2(x)), both norms of the same x (gptneox.cpp use_par_res;
  HF GPTNeoXLayer). Sequential: the MLP's norm reads x + attn. Two norms in either form (attn_norm =
  input_layernorm, ffn_norm = post_attention_layernorm).
- LayerNorm (mean removed) with weight AND bias, eps `gptneox.attention.layer_norm_epsilon` (build_norm(...,
  LLM_NORM); HF nn.LayerNorm(layer_norm_eps)); the final norm `output_norm` with its bias.
- q/k/v from the fused `blk.N.attn_qkv.weight` ((3 D, D)) with its bias, rows q, then k, then v: HF's
  query_key_value is per head (q, k, v) rows, which the converter regroups (modify_tensors reshape (H, 3, Dh, D)).
  MHA: the converter writes no head_count_kv (= head_count). Separate q/k/v are refused by name (the loader
  takes attn_qkv only, flag 0).
- Partial rotary, NEOX (llama_model_rope_type: LLM_ARCH_GPTNEOX -> NEOX; HF rotate_half on the first
  rotary_ndims): `gptneox.rope.dimension_count` = int(rotary_pct * head_dim) (the converter; Pythia 0.25), the
  rest of each head unrotated. Base 10000: the converter writes no rope.freq_base (llama.cpp's default; HF
  rotary_emb_base 10000 in the releases).
- Scale 1/sqrt(head_dim) (gptneox.cpp kq_scale; HF GPTNeoXAttention scaling head_dim**-0.5).
- Biases on the fused q/k/v, the output projection and both MLP matrices, all required (load_arch_tensors flag
  0; HF attention_bias True, nn.Linear default).
- The MLP is ungated: W_down gelu(W_up h + b_up) + b_down (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ); HF
  dense_h_to_4h / dense_4h_to_h). GELU in HF's exact erf form (hidden_act "gelu" in Pythia, RedPajama-INCITE,
  StableLM-alpha; llama.cpp's ggml_gelu is the tanh approximation, a small miss here). torch's gelu on both
  backends.
- Untied head: `output.weight` required (load_arch_tensors flag 0; HF embed_out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.models.starcoder import StarcoderBlock, StarcoderModel
from minfer.models.starcoder2 import layer_norm
from minfer.weights import QWeight, load_vector


class GptneoxModel(StarcoderModel):
    arch = "gptneox"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GPTNEOX -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GptneoxModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if "blk.0.attn_q.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_q.weight': separate q/k/v matrices: llama.cpp's "
                              f"gptneox loader takes the fused attn_qkv only")
        if cfg.tied_output:       # load_arch_tensors: output.weight with flag 0
            raise MinferError(f"{gf.path}: tensor 'output.weight' not found: gptneox has an untied lm head "
                              "(llama.cpp requires it)")
        if cfg.head_dim * cfg.n_heads != cfg.d_model:
            raise MinferError(f"{gf.path}: gptneox needs head_count * head size == embedding_length (the output "
                              f"projection is (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {cfg.d_model}")
        par = gf.require(f"{cls.arch}.use_parallel_residual")
        if not isinstance(par, (bool, int)):
            raise MinferError(f"{gf.path}: metadata key '{cls.arch}.use_parallel_residual' is {par!r}: expected "
                              "a bool")
        # Llama's loading (each block by StarcoderModel.load_block), no position table
        m = super(StarcoderModel, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                 act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, cfg.d_model)
        m.parallel_residual = bool(par)
        return m

    def head_weights(self) -> list:
        return [self.token_embd, self.output]

    def qweights(self) -> list[QWeight]:
        return LlamaModel.qweights(self)

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: StarcoderBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(rope(q), rope(k), v) + b_o (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        o = rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step,
                              c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: StarcoderBlock, ctx) -> torch.Tensor:
        """W_down gelu_erf(W_up h + b_up) + b_down, (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(F.gelu(u.float()).to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            a = self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step, ctx)
            if i == last:     # gptneox.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            if self.parallel_residual:      # x + attn(ln1(x)) + mlp(ln2(x))
                x = x + a.float() + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
            else:                           # x + attn(ln1(x)), then + mlp(ln2(.))
                x = x + a.float()
                x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
