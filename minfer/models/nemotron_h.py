"""NVIDIA Nemotron-H (Nemotron-H 8B/47B, Nemotron Nano 9B v2 / 12B v2): the GGUF arch `nemotron_h`, a
per-layer pattern of three block kinds, each one mixer after its own RMSNorm.

    x_0 = E[tokens]                                         token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)                           every block's norm is attn_norm
        Mamba-2 block:    x = x + mamba2(h)                 minfer/models/mamba2.py
        attention block:  x = x + W_o attn(W_q h, W_k h, W_v h)     GQA, no rope, 1/sqrt(head_dim)
        MLP block:        x = x + W_down relu(W_up h)^2     squared ReLU, no gate
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/nemotron-h.cpp; the converter conversion/nemotron.py
NemotronHModel on conversion/granite.py GraniteHybridModel; HF modeling_nemotron_h):
- The block kinds: the converter writes `attention.head_count_kv` with the kv heads on attention
  blocks ("*" in hybrid_override_pattern) and 0 elsewhere, and `feed_forward_length` with n_ff on
  MLP blocks ("-") and 0 elsewhere; llama.cpp load_arch_hparams: a block is recurrent iff both are
  0 (is_recr), an attention block iff n_ff is 0 (and kv > 0), else an MLP block (the graph's
  is_recr / n_ff(il) == 0 / else). HF NemotronHBlock: norm, one mixer of layers_block_type, residual.
  minfer takes one kv-head count for the attention blocks and refuses a file with none.
- One norm per block, `attn_norm` (load_arch_tensors: "all blocks use the attn norm"; HF
  NemotronHBlock.norm), RMSNorm with `attention.layer_norm_epsilon` (the converter writes only that
  key; llama.cpp reads it as required and takes `layer_norm_rms_epsilon` when present, else the
  same value), which the Mamba-2 group norm also uses (HF NemotronHRMSNormGated eps =
  layer_norm_epsilon).
- The Mamba-2 mixer is mamba2.py's (build_mamba2_layer; HF NemotronHMamba2Mixer, the gate before a
  group norm of group_size di / n_groups), with an inner size that need not be 2 * D
  (d_inner = mamba_num_heads * mamba_head_dim: conversion/nemotron.py; no assert in nemotron-h.cpp).
- Attention: no rope (llama_model_rope_type: LLM_ARCH_NEMOTRON_H -> NONE; the graph calls no
  ggml_rope; HF NemotronHAttention has no rotary embedding), scores scaled by 1/sqrt(head_dim)
  (build_attention_layer: kq_scale 1/sqrt(n_embd_head) as nemotron_h reads no attention.scale;
  HF scaling = head_dim ** -0.5), head size `attention.key_length`.
- The MLP: build_ffn(up, down, LLM_FFN_RELU_SQR, LLM_FFN_PAR) = W_down (relu(W_up h))^2; HF
  NemotronHMLP with mlp_hidden_act "relu2".
- Refused by name: bias tensors (attention, MLP; optional in llama.cpp, absent from the released
  models: HF attention_bias / mlp_bias / use_bias false), the MoE variant (nemotron_h_moe, another
  architecture), a file with no attention block.

The cache and the engine: as granitehybrid (runtime/kv_cache.py `state_layers`, `recurrent = True`,
`paged_kv = True`: the batch engine's state slots, runtime/paged_state.py): attention blocks keep
K/V rows, Mamba-2 blocks their per-sequence state, MLP blocks nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import KVLayersConfig, with_kv_layers
from minfer.models.granite import refuse_biases
from minfer.models.granitehybrid import HybridCacheConfig
from minfer.models.layers import Block, merge_heads
from minfer.models.llama import LlamaModel
from minfer.models.mamba2 import load_mamba2, mamba2_mixer, read_dims, recurrent_state
from minfer.weights import QWeight, load_qweight, load_vector

MAMBA, ATTENTION, MLP = "mamba2", "attention", "mlp"
_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down", "ssm_in", "ssm_out")


def relu2(u: torch.Tensor) -> torch.Tensor:
    """The MLP's activation relu(u)^2 (llama.cpp LLM_FFN_RELU_SQR; HF ACT2FN["relu2"])."""
    return torch.relu(u).square()


def layer_kinds(gf, cfg: ModelConfig) -> tuple:
    """Per layer: MAMBA, ATTENTION or MLP, as llama.cpp reads them (module doc); the attention
    blocks' kv-head count checked."""
    kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * cfg.n_layers
    ff = cfg.ffn_per_layer or (cfg.ffn,) * cfg.n_layers
    kinds = tuple(MAMBA if h == 0 and f == 0 else ATTENTION if f == 0 else MLP for h, f in zip(kv, ff))
    counts = {h for h, k in zip(kv, kinds) if k == ATTENTION}
    if len(counts) != 1:
        raise MinferError(f"{gf.path}: {cfg.arch}.attention.head_count_kv {list(kv)} with feed_forward_length "
                          f"{list(ff)}: minfer takes one kv-head count for the attention blocks and at least one "
                          "attention block")
    return kinds


def check_supported(gf, cfg: ModelConfig) -> None:
    refuse_biases(gf, cfg, _BIASES)


class NemotronHModel(LlamaModel):
    """blocks[i]: every layer's attn_norm, q/k/v/o on attention blocks, ffn_up/ffn_down on MLP
    blocks; mamba[i]: a Mamba-2 block's weights (None elsewhere); kinds[i]: the block kind."""

    arch = "nemotron_h"
    rope_style = "normal"          # llama_model_rope_type: NEMOTRON_H -> NONE (unused: no rope)
    per_layer_counts = True        # head_count_kv and feed_forward_length are arrays (0: not this kind)
    attention_free_layers = True
    paged_kv = True                # the paged cache's state slots (runtime/paged_state.py)
    recurrent = True               # the engine's prefix rule (granitehybrid's)
    norm_eps_key = "attention.layer_norm_epsilon"   # the converter's one key (module doc)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """cfg with the caches' geometry: (Hkv, Dh, Dh) rows on attention blocks, none elsewhere; a
        Mamba-2 block's state_layers entry is its per-sequence state (the preflight's config)."""
        kinds = layer_kinds(gf, cfg)
        dims = read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False)
        kv = with_kv_layers(cfg, [(cfg.n_kv_heads, cfg.head_dim, cfg.head_dim) if k == ATTENTION else None
                                  for k in kinds])
        return HybridCacheConfig(**{f.name: getattr(kv, f.name) for f in fields(KVLayersConfig)},
                                 state_layers=tuple(dims.state_shapes() if k == MAMBA else None for k in kinds))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NemotronHModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        rms = gf.metadata.get(f"{cfg.arch}.attention.layer_norm_rms_epsilon")
        if rms is not None:            # load_arch_hparams: the RMS key when present, else layer_norm_epsilon
            cfg = dataclasses.replace(cfg, rms_eps=float(rms))
        check_supported(gf, cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        kinds, dims = layer_kinds(gf, cfg), read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, mamba = [], []
        for i, kind in enumerate(kinds):
            blocks.append(cls.load_layer(gf, cfg, i, kind, device, dtype))
            mamba.append(load_mamba2(gf, i, dims, D, device, dtype) if kind == MAMBA else None)
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.close()
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.mamba, m.kinds, m.dims = mamba, kinds, dims
        return m

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, kind: str, device, dtype) -> Block:
        """blk.i's norm and its attention (attention blocks) or up/down (MLP blocks)."""
        p, D, Dh = f"blk.{i}.", cfg.d_model, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D), attn_q=None, attn_k=None,
                    attn_v=None, attn_output=None, ffn_norm=None, ffn_gate=None, ffn_up=None, ffn_down=None)
        if kind == ATTENTION:
            blk.attn_q, blk.attn_k = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D))
            blk.attn_v, blk.attn_output = w("attn_v", (kv_out, D)), w("attn_output", (D, q_out))
        elif kind == MLP:
            F = cfg.ffn_per_layer[i] if cfg.ffn_per_layer else cfg.ffn
            blk.ffn_up, blk.ffn_down = w("ffn_up", (F, D)), w("ffn_down", (D, F))
        return blk

    # ---- declarations ----

    def layer_matrices(self, i: int) -> list[QWeight]:
        mb = self.mamba[i]
        return [mb.ssm_in, mb.ssm_out] if mb is not None else []

    # ---- the forward ----

    def mixer(self, h: torch.Tensor, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Block i's mixer of its normed input h (T, D) -> (T, D)."""
        kind, blk = self.kinds[i], self.blocks[i]
        if kind == MAMBA:
            state = recurrent_state(cache, self.arch)
            return mamba2_mixer(h, self.mamba[i], self.dims, state(i), step.positions, self.cfg.rms_eps, ctx)
        if kind == MLP:                # W_down relu(W_up h)^2 (LLM_FFN_RELU_SQR), the square in float32
            if ops._backend(h) is not ops.reference:
                ops.paths.count("relu2.torch")
            u = relu2(ops.linear(h, blk.ffn_up, None, ctx).float())
            return ops.linear(u.to(h.dtype), blk.ffn_down, None, ctx)
        c = self.cfg                   # attention without rope
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        cache.write(i, k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step)
        o = cache.attend(i, q.view(T, H, Dh), step, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i in range(len(blocks)):
            a = self.mixer(h, i, cache, step, ctx).float()
            if i + 1 < len(blocks):    # the residual add and the next block's norm
                x, h = ops.add_rms_norm(x, a, blocks[i + 1].attn_norm, eps, act, ctx)
        x, a = step.rows(x), step.rows(a)                                    # (R, D)
        _, h = ops.add_rms_norm(x, a, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)     # (R, V)
