"""StarCoder 1 / StarCoderBase / SantaCoder (GPTBigCode): the GGUF arch `starcoder`.

    x_0 = E[tokens] + P[positions]                      token_embd (V, D), position_embd (n_ctx_train, D)
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = split(W_qkv h + b_qkv)                rows: H*Dh q, Hkv*Dh k, Hkv*Dh v
        x = x + W_o attn(q, k, v) + b_o                 no rope
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output, or the embedding when tied

Each rule and its source (llama.cpp src/models/starcoder.cpp, src/llama-model.cpp; conversion/starcoder.py
StarCoderModel; HF modeling_gpt_bigcode GPTBigCodeModel / GPTBigCodeAttention / GPTBigCodeMLP):
- Learned absolute position embeddings added to the token embeddings before the first layer
  (starcoder.cpp: inpL = tok_embd rows + ggml_get_rows(pos_embd, inp_pos); HF wte + wpe).
  `position_embd.weight` (n_ctx_train, D) required (load_arch_tensors flag 0). No rope anywhere
  (llama_model_rope_type lists LLM_ARCH_STARCODER under NORM, but the graph never rotates); rope_style
  "normal" is declared for the registry only. A position past the table's rows does not exist: a cache
  whose context (--ctx) exceeds `starcoder.context_length` / the table is refused, naming both.
- LayerNorm (mean removed) with weight AND bias, eps `starcoder.attention.layer_norm_epsilon`
  (build_norm(..., LLM_NORM); HF nn.LayerNorm(layer_norm_epsilon)), before attention and before the MLP,
  sequential residuals (starcoder.cpp: ffn_inp = attn + inpL; cur = ffn + ffn_inp).
- q/k/v from one matrix `blk.N.attn_qkv.weight` (H*Dh + 2*Hkv*Dh, D) with its bias, rows q, then k, then v
  (build_qkv's fused path with wqkv_b; HF multi_query c_attn split (embed_dim, kv_dim, kv_dim): the converter
  writes it as is). Multi-query: `head_count_kv` 1 (the converter always writes 1; HF multi_query).
  Attention scale 1/sqrt(head_dim) (starcoder.cpp; HF scale_attn_weights).
- Biases on the fused q/k/v, the output projection and both MLP matrices, all required (load_arch_tensors
  flag 0; HF nn.Linear default bias).
- The MLP is not gated: W_down gelu(W_up h) (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ); HF GPTBigCodeMLP
  c_fc / c_proj), GELU's tanh approximation (ggml_gelu; HF activation_function gelu_pytorch_tanh (StarCoder),
  gelu_fast (SantaCoder): the same formula). Applied with torch's gelu on both backends.
- The lm head: `output.weight`, else the embedding (TENSOR_NOT_REQUIRED, then token_embd; HF ties lm_head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, merge_heads
from minfer.models.llama import LlamaModel
from minfer.models.starcoder2 import layer_norm
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class StarcoderBlock(Block):
    attn_norm_b: torch.Tensor | None = None      # (D,)
    attn_qkv: QWeight | None = None              # (H*Dh + 2*Hkv*Dh, D)
    attn_qkv_b: torch.Tensor | None = None       # (H*Dh + 2*Hkv*Dh,)
    attn_output_b: torch.Tensor | None = None    # (D,)
    ffn_norm_b: torch.Tensor | None = None       # (D,)
    ffn_up_b: torch.Tensor | None = None         # (F,)
    ffn_down_b: torch.Tensor | None = None       # (D,)

    def matrices(self) -> list[QWeight]:
        """The fused q/k/v matrix, the output projection and the two MLP matrices."""
        return [self.attn_qkv, self.attn_output, self.ffn_up, self.ffn_down]


class StarcoderModel(LlamaModel):
    arch = "starcoder"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_STARCODER -> NORM (never applied: no rope)
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def check_fused_qkv(cls, gf, cfg: ModelConfig) -> None:
        """MinferError for separate q/k/v matrices or heads that do not span the embedding (starcoder, gpt2,
        bloom, mpt: the fused (D + 2 Hkv Dh, D) attn_qkv and a (D, D) output projection)."""
        if "blk.0.attn_q.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_q.weight': separate q/k/v matrices: llama.cpp's "
                              f"{cls.arch} loader takes the fused attn_qkv only")
        if cfg.head_dim * cfg.n_heads != cfg.d_model:
            raise MinferError(f"{gf.path}: {cls.arch} needs head_count * head size == embedding_length (the output "
                              f"projection is (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {cfg.d_model}")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "StarcoderModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_fused_qkv(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, cfg.d_model)
        m.n_pos = cfg.context_length
        m.position_embd = load_qweight(gf, "position_embd.weight", device, (m.n_pos, cfg.d_model), dense=False,
                                       dtype=dtype)
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, D, Fw, q_out, kv_out = t.w, t.v, t.D, t.F, t.q_out, t.kv_out
        return StarcoderBlock(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=None, attn_k=None, attn_v=None,
            attn_qkv=w("attn_qkv", (q_out + 2 * kv_out, D)), attn_qkv_b=v("attn_qkv.bias", q_out + 2 * kv_out),
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D),
            ffn_norm=v("ffn_norm.weight", D), ffn_norm_b=v("ffn_norm.bias", D),
            ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))

    def head_weights(self) -> list:
        return [self.token_embd, self.output, self.position_embd]

    def qweights(self) -> list[QWeight]:
        return super().qweights() + [self.position_embd]

    # ---- the forward ----

    def check_positions(self, step: Step, cache) -> None:
        """MinferError when the cache's context (--ctx) or, on the CPU, a position is past the position table."""
        context = getattr(cache, "context", None)
        if context is not None and context > self.n_pos:
            raise MinferError(f"{self.arch}: a context of {context} positions is past the model's learned position "
                              f"table (position_embd.weight, {self.arch}.context_length {self.n_pos}): use --ctx "
                              f"{self.n_pos} or less")
        pos = step.positions
        if pos.device.type == "cpu" and pos.numel() and int(pos.max()) >= self.n_pos:
            raise MinferError(f"{self.arch}: position {int(pos.max())} is past the model's learned position table "
                              f"(position_embd.weight, {self.n_pos} rows)")

    def attention(self, h: torch.Tensor, blk: StarcoderBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) + b_o (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        cache.write(i, k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step)
        o = cache.attend(i, q.reshape(T, H, Dh), step, ctx)                           # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: StarcoderBlock, ctx) -> torch.Tensor:
        """W_down gelu_tanh(W_up h + b_up) + b_down, (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(F.gelu(u.float(), approximate="tanh").to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        self.check_positions(step, cache)
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd) + ops.embedding(step.positions, self.position_embd)  # (T, D)
        for i, blk in enumerate(self.blocks):
            a = self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step, ctx)
            if i == last:     # starcoder.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + a.float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
