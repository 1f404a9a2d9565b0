"""Apple OpenELM (OpenELMForCausalLM, remote code: OpenELM-270M / 450M / 1_1B / 3B and their -Instruct): the GGUF
arch `openelm`.

    x_0 = E[tokens]                                   token_embd (V, D), also the lm head
    for each layer l (H_l = head_count[l], Hkv_l = head_count_kv[l], F_l = feed_forward_length[l]):
        q, k, v = split(W_qkv n(x))                   attn_qkv ((H_l + 2 Hkv_l) Dh, D): H_l q heads, Hkv_l k, Hkv_l v
        q, k = rope(qn(q)), rope(kn(k))               qn, kn: RMSNorm of each head (attn_q_norm / attn_k_norm), BEFORE rope
        x = x + W_o attn(q, k, v)                     n = RMSNorm(attn_norm); W_o (D, H_l Dh)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm), width F_l
    logits = E RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/openelm.cpp: load_arch_tensors and the graph; the converter
conversion/openelm.py OpenELMModel; HF modeling_openelm.py, remote code):
- Per-layer counts: the converter writes head_count (num_query_heads), head_count_kv (num_kv_heads) and
  feed_forward_length (make_divisible(ffn_multipliers[l] * model_dim, ffn_dim_divisor)) as arrays, one per layer
  (hparams.n_head(il) / n_head_kv(il) / n_ff(il) in the graph); scalars read as every layer alike. The releases'
  largest head count need not be a multiple of every layer's kv count (OpenELM-270M: 12 / 16 / 20 heads over 3 / 4 / 5
  kv heads), only of its own layer's. The cache keeps (Hkv_l, Dh, Dh) rows per layer (gemma4.with_kv_layers).
- The fused attn_qkv: the graph reshapes its output to (Dh, H_l + 2 Hkv_l, T) and views q at head 0, k at head H_l,
  v at head H_l + Hkv_l (ggml_view_3d offsets); HF qkv_proj reshaped the same and split [H, Hkv, Hkv]. The converter
  stores it as is (no permutation). GQA: kv head j serves query heads j g .. j g + g - 1 (g = H_l / Hkv_l).
- q/k norms: build_norm(Qcur / Kcur, attn_q_norm / attn_k_norm, LLM_NORM_RMS) per head, eps
  attention.layer_norm_rms_epsilon (the converter writes 1e-6, HF OpenELMRMSNorm's default), THEN ggml_rope_ext;
  both tensors required by the loader (flag 0).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_OPENELM -> NEOX; HF rotate_half) over the whole head (the converter
  writes rope.dimension_count = head_dim: partial rotation refused here, as no converter makes it), base
  rope.freq_base (HF rope_freq_constant); scores 1/sqrt(head_dim) (the graph's kq_scale); the loader checks
  key_length == value_length (GGML_ASSERT): refused otherwise.
- FFN: build_ffn(LLM_FFN_SILU, LLM_FFN_PAR): silu(gate) * up; the converter splits HF proj_1 (2 F_l, D) into
  ffn_gate (its first F_l rows, HF's y_1) and ffn_up (the rest).
- The lm head: always the token embedding (load_arch_tensors: output from token_embd, TENSOR_DUPLICATED; HF
  share_input_output_layers in every release). An `output.weight` is refused by name (llama.cpp's loader would not
  take it), as are biases, separate attn_q/attn_k/attn_v and rope_freqs (the loader creates none of them).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.chatglm import ChatGLMBlock
from minfer.models.gemma4 import with_kv_layers
from minfer.models.layers import BlockTensors, head_norm, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import load_qweight, load_vector

# tensors llama.cpp's openelm loader does not create: refused by name rather than ignored
_REFUSED = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias",
            "attn_v.bias", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")


def layer_counts(cfg: ModelConfig) -> tuple[tuple, tuple, tuple]:
    """Per layer (H_l, Hkv_l, F_l): the arrays, or the scalar for every layer."""
    L = cfg.n_layers
    return (cfg.heads_per_layer or (cfg.n_heads,) * L, cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L,
            cfg.ffn_per_layer or (cfg.ffn,) * L)


def check_supported(gf, cfg: ModelConfig) -> None:
    a = cfg.arch
    if cfg.rope.n_rot != cfg.head_dim:
        raise MinferError(f"{gf.path}: {a}.rope.dimension_count {cfg.rope.n_rot} != head_dim {cfg.head_dim} (the "
                          "openelm converter rotates whole heads; a partial rotation is not supported)")
    vlen = gf.metadata.get(f"{a}.attention.value_length")
    if vlen is not None and int(vlen) != cfg.head_dim:
        raise MinferError(f"{gf.path}: {a}.attention.value_length {vlen} != key_length {cfg.head_dim} (llama.cpp's "
                          "openelm graph asserts they are equal)")
    if "output.weight" in gf.tensors:
        raise MinferError(f"{gf.path}: tensor 'output.weight' is not supported for {a} (the lm head is the token "
                          "embedding: llama.cpp's openelm loader creates no output tensor of its own)")
    if "rope_freqs.weight" in gf.tensors:
        raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {a} (llama.cpp's openelm "
                          "loader creates no rope factors)")
    for i in range(cfg.n_layers):
        for name in _REFUSED:
            if f"blk.{i}.{name}" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is not supported for {a} (llama.cpp's "
                                  "openelm loader takes one attn_qkv matrix and no biases)")
    if any(f == 0 for f in layer_counts(cfg)[2]):
        raise MinferError(f"{gf.path}: {a}.feed_forward_length {list(layer_counts(cfg)[2])} has a 0 (every "
                          f"{a} layer has an FFN)")


class OpenElmModel(LlamaModel):
    """LlamaModel's loop (its fused residual-add + norm steps; each FFN of its own width) with the per-layer fused
    q/k/v attention: blocks[i].attn_qkv, layer_cfg[i] (the config with layer i's head counts)."""

    arch = "openelm"
    rope_style = "neox"            # llama_model_rope_type: LLM_ARCH_OPENELM -> NEOX
    qk_norm = True
    per_layer_counts = True        # head_count, head_count_kv, feed_forward_length are arrays (ModelConfig)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the caches' per-layer geometry: (Hkv_l, Dh, Dh) on every layer."""
        return with_kv_layers(cfg, [(h, cfg.head_dim, cfg.head_dim) for h in layer_counts(cfg)[1]])

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "OpenElmModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        heads, kv, ff = layer_counts(cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        V, D, Dh = cfg.vocab, cfg.d_model, cfg.head_dim
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=True, dtype=dtype)
        blocks = []
        for i in range(cfg.n_layers):
            t = BlockTensors(gf, cfg, i, device, dtype)
            H, Hkv, F = heads[i], kv[i], ff[i]
            blk = ChatGLMBlock(
                attn_norm=t.v("attn_norm.weight", D), attn_q=None, attn_k=None, attn_v=None,
                attn_output=t.w("attn_output", (D, H * Dh)), ffn_norm=t.v("ffn_norm.weight", D),
                ffn_gate=t.w("ffn_gate", (F, D)), ffn_up=t.w("ffn_up", (F, D)), ffn_down=t.w("ffn_down", (D, F)),
                attn_q_norm=t.v("attn_q_norm.weight", Dh), attn_k_norm=t.v("attn_k_norm.weight", Dh))
            blk.attn_qkv = t.w("attn_qkv", ((H + 2 * Hkv) * Dh, D))
            blocks.append(blk)
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        m = cls(cache_cfg, token_embd, blocks, output_norm, token_embd, act_dtype=act_dtype)
        m.layer_cfg = [replace(cache_cfg, n_heads=heads[i], n_kv_heads=kv[i]) for i in range(cfg.n_layers)]
        return m

    # ---- the forward (LlamaModel.forward's loop) ----

    def attention_heads(self, h: torch.Tensor, blk: ChatGLMBlock, layer: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, H_l * Dh): the fused q/k/v split by heads, the per-head q/k norms, rope, the cache write and
        attention, with layer `layer`'s head counts."""
        c = self.layer_cfg[layer]
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, None, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        q = head_norm(q.reshape(T, H, Dh), blk.attn_q_norm, c.rms_eps)
        k = head_norm(k.reshape(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        return merge_heads(rope_write_attend(cache, layer, q, k, v.reshape(T, Hkv, Dh), step, c.rope, ctx))

    def attention_residual_norm(self, h: torch.Tensor, blk: ChatGLMBlock, i: int, cache, step: Step, ctx,
                                x: torch.Tensor, eps: float, act) -> tuple:
        """(x + W_o attn, its ffn_norm): layers.attention_residual_norm with this attention."""
        return ops.linear_add_rms_norm(self.attention_heads(h, blk, i, cache, step, ctx), blk.attn_output, x,
                                       blk.ffn_norm, eps, act, ctx, into_linear=True, role="ffn_norm")
