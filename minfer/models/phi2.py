"""Microsoft Phi-2 and Phi-1 / Phi-1.5 (HF PhiForCausalLM): the GGUF arch `phi2`.

    x_0 = E[tokens]                                             token_embd (V, D)
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)                    one norm feeds both branches
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o
              + W_down gelu(W_up h + b_up) + b_down             attention and MLP in parallel
    logits = W_out LN(x; output_norm, output_norm.bias) + b_out

Each rule and its source (llama.cpp src/models/phi2.cpp; conversion/phi.py Phi2Model; HF modeling_phi):
- Parallel block: the attention and the MLP both read the same LayerNorm of x and their sum joins
  the residual (phi2.cpp: ffn_output = build_ffn(attn_norm_output), cur + ffn_output + inpL; HF
  PhiDecoderLayer: attn_outputs + feed_forward_hidden_states + residual). No ffn_norm.
- LayerNorm (mean removed) with weight AND bias, eps `phi2.attention.layer_norm_epsilon`
  (build_norm(..., LLM_NORM); load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS; HF nn.LayerNorm).
- Biases: attn_output, ffn_up, ffn_down, output_norm and the lm head `output.bias` are required
  (load_arch_tensors flag 0; HF dense / fc1 / fc2 / lm_head bias=True); q/k/v biases are optional
  (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF always writes them). q/k/v may come fused as
  `attn_qkv` ((3 D, D), rows q, k, v; with `attn_qkv.bias`), as the older phi-2 GGUFs have them
  (create_tensor_qkv takes either; phi2.cpp build_qkv splits).
- Partial rotary, NEOX (llama_model_rope_type: LLM_ARCH_PHI2 -> NEOX; HF rotate_half on the first
  rotary_ndims): `phi2.rope.dimension_count` = int(partial_rotary_factor * D) // H (the converter;
  phi-2: 32 of 80), the rest of each head unrotated. Base 10000: the converter writes no
  rope.freq_base (llama.cpp's default; HF rope_theta 10000 in every release).
- Scale 1/sqrt(head_dim) (phi2.cpp scales Q, then attends with kq_scale 1; HF head_dim**-0.5).
  MHA: the converter writes head_count_kv = head_count (phi2.cpp asserts nothing else).
- MLP ungated, W_down gelu(W_up h + b) + b with GELU's tanh approximation (build_ffn(...,
  LLM_FFN_GELU, LLM_FFN_SEQ); HF hidden_act gelu_new); `feed_forward_length` is 4 D as the
  converter writes it. Applied with torch's gelu on both backends (starcoder2's MLP).
- Untied head: `output.weight` required (load_arch_tensors flag 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import merge_heads, rope_write_attend
from minfer.models.starcoder2 import Starcoder2Block, Starcoder2Model, layer_norm
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class Phi2Block(Starcoder2Block):
    attn_qkv: QWeight | None = None              # (3 D, D): q, k, v rows (older conversions)
    attn_qkv_b: torch.Tensor | None = None       # (3 D,)


class Phi2Model(Starcoder2Model):
    arch = "phi2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_PHI2 -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Phi2Block:
        p = f"blk.{i}."
        D, Fw = cfg.d_model, cfg.ffn
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        def v(name, n, optional=False):
            return load_vector(gf, p + name, device, n) if not optional or p + name in gf.tensors else None

        blk = Phi2Block(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=None, attn_k=None, attn_v=None,
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D),
            ffn_norm=None, ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))
        if p + "attn_qkv.weight" in gf.tensors:
            blk.attn_qkv = w("attn_qkv", (q_out + 2 * kv_out, D))
            blk.attn_qkv_b = v("attn_qkv.bias", q_out + 2 * kv_out, optional=True)
        else:
            blk.attn_q, blk.attn_k, blk.attn_v = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D)), \
                w("attn_v", (kv_out, D))
        if blk.attn_qkv_b is None:
            blk.attn_q_bias = v("attn_q.bias", q_out, optional=True)
            blk.attn_k_bias = v("attn_k.bias", kv_out, optional=True)
            blk.attn_v_bias = v("attn_v.bias", kv_out, optional=True)
        return blk

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Phi2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.tied_output:       # load_arch_tensors: output.weight with flag 0
            raise MinferError(f"{gf.path}: tensor 'output.weight' not found: {cls.arch} has an untied lm head "
                              "(llama.cpp requires it)")
        # Llama's loading (each block by load_block below), not starcoder2's (its window)
        m = super(Starcoder2Model, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                  act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, m.cfg.d_model)
        m.output_b = load_vector(gf, "output.bias", device, m.cfg.vocab)
        m.window = 0              # phi2.cpp: build_attn_inp_kv, no window
        return m

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd]
        for b in self.blocks:
            ws += [w for w in (b.attn_qkv, *b.matrices()) if w is not None]
        return ws + [self.output]

    def linear_groups(self) -> list[tuple]:
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.blocks if b.attn_qkv is None]

    def attention(self, h: torch.Tensor, blk: Phi2Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) + b_o (T, D): fused or separate q/k/v."""
        if blk.attn_qkv is None:
            return super().attention(h, blk, i, cache, step, ctx)
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        qkv = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx)
        if blk.attn_qkv_b is None and blk.attn_q_bias is not None:     # fused weight, separate biases
            qkv = qkv + torch.cat((blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias)).to(qkv.dtype)
        q, k, v = qkv.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        o = rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step,
                              c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act)
            a = self.attention(h, blk, i, cache, step, ctx)
            x = x + a.float() + self.mlp(h, blk, ctx).float()
        h = layer_norm(step.rows(x), self.output_norm, self.output_norm_b, eps, act)    # (R, D)
        return self.head(h, ctx, self.output_b)  # (R, V)
