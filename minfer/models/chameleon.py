"""Chameleon (facebook/chameleon-7b / -30b, Anole), text in and text out: the GGUF arch `chameleon`.

    x_0 = E[tokens]                                         token_embd (V, D); output (V, D), or token_embd
    for each layer l:
        q, k, v = W_q h + b_q, W_k h + b_k, W_v h + b_v      h = RMSNorm(x; attn_norm) (not with swin_norm: h = x)
        q = LN_head(q; attn_q_norm, attn_q_norm.bias)       per head over head_dim, eps 1e-5; k likewise
        a = W_o attn(rope(q), rope(k), v)
        pre-norm:  x = x + a;             x = x + ffn(RMSNorm(x; ffn_norm))
        swin_norm: x = x + RMSNorm(a; attn_norm);   x = x + RMSNorm(ffn(x); ffn_norm)
    logits = W_out RMSNorm(x; output_norm), then ids 4..8195 (the image tokens) set to -FLT_MAX

Each rule and its source (llama.cpp src/models/chameleon.cpp; HF transformers models/chameleon/modeling_chameleon.py):
- q/k LayerNorm per head, after the q/k projections and before rope: the mean is removed and the variance taken
  over head_dim only, then a weight and a bias PER HEAD: attn_q_norm (Dh, H) and attn_k_norm (Dh, Hkv) in ggml's
  order, one row per head (load_arch_tensors; the graph's build_norm(Qcur, attn_q_norm, attn_q_norm_b, LLM_NORM)
  on the (Dh, H, T) view; HF ChameleonLayerNorm((num_heads, head_dim)): F.layer_norm over the last dim, then
  * weight + bias of shape (H, Dh)). The biases are optional (TENSOR_NOT_REQUIRED: none = 0). The eps is fixed at
  1e-5 (load_arch_hparams: hparams.f_norm_eps = 1e-5, "torch default"; HF F.layer_norm(..., eps=1e-5)), not the
  file's rms epsilon. llama.cpp's converter (conversion/chameleon.py _reverse_hf_permute) writes head 0's row
  reordered for NORM rope and repeated for every head (the releases' rows are one row repeated); a file's rows
  are taken as they are, one per head, as llama.cpp does.
- swin_norm (`chameleon.swin_norm`, default false: load_arch_hparams get_key(LLM_KV_SWIN_NORM, swin_norm, false);
  the 30B's): no norm before attention or the MLP; attn_norm normalizes the attention output and ffn_norm the
  MLP output, each before its residual add (chameleon.cpp `if (hparams.swin_norm)`; HF ChameleonSwinDecoderLayer).
- RMSNorm eps `chameleon.attention.layer_norm_rms_epsilon` (required: load_arch_hparams get_key without default).
- RoPE NORM (llama_model_rope_type: LLM_ARCH_CHAMELEON -> NORM; the converter permutes q/k as LlamaModel) on the
  whole head (chameleon.cpp asserts n_rot == head_dim), scale 1/sqrt(head_dim), GQA by head_count_kv.
- q/k/v biases optional (create_tensor_qkv: TENSOR_NOT_REQUIRED), no attn_output bias (build_attn gets none:
  refused by name), SwiGLU MLP without biases (build_ffn LLM_FFN_SILU, LLM_FFN_PAR), output.weight optional
  (missing: the embedding, TENSOR_DUPLICATED). A fused attn_qkv.weight is refused by name.
- Image-token logits: llama.cpp builds the logits and then writes -FLT_MAX over ids [4, 8196) (chameleon.cpp:
  img_token_start_idx 4, img_token_end_idx 8196, ggml_set_1d at offset 4 elements, "this suppresses the output of
  image tokens, which is required to enable text-only outputs"). Those are the releases' 8192 image-codebook
  tokens (the vocabulary_map names IMGIMG*, which HF's ChameleonForConditionalGeneration.forward sets to
  finfo(float32).min = -FLT_MAX, the same value). Here they are set on every logits row: ggml_set_1d writes one
  run of 8192 values from the start of the (V, n_outputs) buffer, so llama.cpp masks the first output row only
  (the only row in generation; a multi-row request such as perplexity would leave rows 1.. unmasked or, with
  V < 8196, overrun into them). A vocabulary smaller than 8196 (test models only; llama.cpp's graph cannot be
  built for one logits row: ggml_set_impl asserts nelements(a) >= 8192) holds no such range: no mask is applied
  there, as transformers with a vocabulary_map without IMGIMG tokens (the fixtures').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel

QK_NORM_EPS = 1e-5            # chameleon.cpp load_arch_hparams: hparams.f_norm_eps = 1e-5
IMG_TOKENS = (4, 8196)        # chameleon.cpp: img_token_start_idx, img_token_end_idx
NEG_MAX = torch.finfo(torch.float32).min   # -FLT_MAX (chameleon.cpp's ggml_clamp to -FLT_MAX)


@dataclass
class ChameleonBlock(Block):
    attn_q_norm_b: torch.Tensor | None = None      # (H, Dh)
    attn_k_norm_b: torch.Tensor | None = None      # (Hkv, Dh)


def _check_layout(gf, cfg: ModelConfig) -> None:
    """What llama.cpp's chameleon loader does not take, refused by name; the rope width."""
    if cfg.rope.n_rot != cfg.head_dim:
        raise MinferError(f"{gf.path}: chameleon.rope.dimension_count={cfg.rope.n_rot}: chameleon rotates the whole "
                          f"head ({cfg.head_dim}; llama.cpp's chameleon graph asserts n_rot == head_dim)")
    for i in range(cfg.n_layers):
        for name in ("attn_output.bias", "attn_qkv.weight", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"):
            if f"blk.{i}.{name}" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': chameleon has no such tensor here "
                                  "(separate attn_q/attn_k/attn_v, no output-projection or MLP biases)")


def swin_norm(gf) -> bool:
    """`chameleon.swin_norm` (a bool; absent: false, as llama.cpp's get_key default); another type refused by name."""
    v = gf.metadata.get("chameleon.swin_norm", False)
    if not isinstance(v, (bool, np.bool_)):
        raise MinferError(f"{gf.path}: metadata key 'chameleon.swin_norm' is {v!r}: expected a bool")
    return bool(v)


class ChameleonModel(LlamaModel):
    """Block.attn_q_norm / attn_k_norm (H, Dh) / (Hkv, Dh): LayerNorm weights per head, with ChameleonBlock's
    biases. swin_norm: Block.attn_norm / ffn_norm normalize the branch outputs instead of the inputs."""

    arch = "chameleon"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_CHAMELEON -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ChameleonModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        _check_layout(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.swin_norm = swin_norm(gf)
        m.mask_image_tokens = m.cfg.vocab >= IMG_TOKENS[1]
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, F, q_out, kv_out = t.w, t.v, t.opt, t.D, t.F, t.q_out, t.kv_out
        H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

        def per_head(name, n, rows, required):
            x = v(name, n) if required else opt(name, n)
            return None if x is None else x.view(rows, Dh)

        return ChameleonBlock(
            attn_norm=v("attn_norm.weight", D),
            attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
            attn_q_bias=opt("attn_q.bias", q_out), attn_k_bias=opt("attn_k.bias", kv_out),
            attn_v_bias=opt("attn_v.bias", kv_out), attn_output=w("attn_output", (D, q_out)),
            ffn_norm=v("ffn_norm.weight", D),
            ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)),
            attn_q_norm=per_head("attn_q_norm.weight", q_out, H, True),
            attn_k_norm=per_head("attn_k_norm.weight", kv_out, Hkv, True),
            attn_q_norm_b=per_head("attn_q_norm.bias", q_out, H, False),
            attn_k_norm_b=per_head("attn_k_norm.bias", kv_out, Hkv, False))

    def head_layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """(T, G, Dh) -> LayerNorm over Dh, weight and bias (G, Dh) per head, in x's dtype."""
        T, G, Dh = x.shape
        y = ops.layer_norm(x.reshape(T * G, Dh), weight, QK_NORM_EPS).view(T, G, Dh)
        return y if bias is None else (y.float() + bias).to(x.dtype)

    def attention(self, h: torch.Tensor, blk: ChameleonBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The attention's input h (T, D) -> W_o attn(...) (T, D), h's dtype."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        q = self.head_layer_norm(q.reshape(T, H, Dh), blk.attn_q_norm, blk.attn_q_norm_b)
        k = self.head_layer_norm(k.reshape(T, Hkv, Dh), blk.attn_k_norm, blk.attn_k_norm_b)
        o = rope_write_attend(cache, i, q, k, v.reshape(T, Hkv, Dh), step, c.rope, ctx)   # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def suppress_image_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (R, V) with ids 4..8195 at -FLT_MAX (chameleon.cpp), when the vocabulary holds that range."""
        if self.mask_image_tokens:
            logits[:, IMG_TOKENS[0]:IMG_TOKENS[1]] = NEG_MAX
        return logits

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last, swin = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1, self.swin_norm
        x = ops.embedding(tokens, self.token_embd)                                  # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = x.to(act) if swin else ops.rms_norm_cast(x, blk.attn_norm, eps, act, ctx)
            a = self.attention(h, blk, i, cache, step, ctx).float()
            if i == last:       # chameleon.cpp: the rest of the last layer on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + (ops.rms_norm(a, blk.attn_norm, eps) if swin else a)
            if swin:
                x = x + ops.rms_norm(ffn_branch(x.to(act), blk, ctx).float(), blk.ffn_norm, eps)
            else:
                x = x + ffn_branch(ops.rms_norm_cast(x, blk.ffn_norm, eps, act, ctx), blk, ctx).float()
        h = ops.rms_norm_cast(x, self.output_norm, eps, act, ctx)                   # (R, D)
        return self.suppress_image_tokens(self.head(h, ctx))
