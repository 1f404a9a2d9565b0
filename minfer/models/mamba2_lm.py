"""Pure Mamba-2 language models (HF Mamba2ForCausalLM: Mamba-Codestral-7B, the state-spaces mamba2-*
checkpoints): the GGUF arch `mamba2`. (The file is not models/mamba2.py: that is the Mamba-2 mixer the
hybrids share, used here by import.)

    x_0 = E[tokens]                                       token_embd (V, D); output (V, D), or tied
    for each layer l:
        x = x + mixer(RMSNorm(x; attn_norm))              models/mamba2.py mamba2_mixer
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/mamba2.cpp load_arch_hparams / load_arch_tensors, the graph
llama_model_mamba::graph of src/models/mamba.cpp with build_mamba2_layer of mamba-base.cpp; conversion/mamba.py
Mamba2Model; HF transformers models/mamba2/modeling_mamba2.py Mamba2Block, Mamba2Mixer, Mamba2RMSNormGated):
- Every layer is the mixer alone after its RMSNorm (build_norm(inpL, attn_norm), build_mamba2_layer, the
  residual add; HF Mamba2Block: residual + mixer(norm(hidden_states))): no attention, no MLP. Then the final
  RMSNorm (output_norm; HF norm_f) and the head (output, or the embedding when the file has none).
- The mixer is models/mamba2.py's (its module doc cites each rule): the ssm.* keys all required (mamba2.cpp
  load_arch_hparams: get_key without default), the inner size not tied to 2 * D (mamba2.cpp asserts nothing;
  the converter asserts d_inner == expand * d_model itself), the conv bias and the grouped norm required
  (load_arch_tensors: flag 0 for ssm_conv1d.bias and ssm_norm; HF Mamba2RMSNormGated(group_size =
  intermediate_size / n_groups)).
- One epsilon (attention.layer_norm_rms_epsilon) for the layer norms, the final norm and the mixer's grouped
  norm (llama.cpp f_norm_rms_eps everywhere; HF layer_norm_epsilon everywhere).
- The converter writes attention.head_count 0 and feed_forward_length 0 ("unused, but seemingly required when
  loading"): ModelConfig takes them as no heads for this class (attention_free), metadata_check as valid.

The cache: no K/V rows (every layer's kv_layers entry None), each layer's per-sequence state in the cache's
recurrent_state (state_layers: the mixer's conv ring and SSM ring), as the hybrids' Mamba-2 layers
(granitehybrid.py HybridCacheConfig). recurrent: the engine reuses a cached prefix only whole. The batch
engine keeps the state in per-sequence slots as for the hybrids (runtime/paged_state.py): paged_kv True;
its KV blocks hold nothing (PagedKVCache.bytes_per_block counts 1 byte so the pool sizing holds).

The loader, the cache config and the forward (load_mixer_lm, state_cache_config, mixer_lm_forward) serve
models/mamba1.py's Mamba1Model too: the two models differ in the mixer (its dims, loader and step) alone.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.granitehybrid import HybridCacheConfig
from minfer.models.llama import LlamaModel
from minfer.models.mamba2 import load_mamba2, mamba2_mixer, read_dims, recurrent_state
from minfer.weights import QWeight, load_qweight, load_vector


# ---- the mixer-only language model, shared with mamba1.py's Mamba1Model (the mixer its only difference) ----

def state_cache_config(cfg: ModelConfig, dims) -> HybridCacheConfig:
    """cfg with no K/V rows and each layer's per-sequence state dims.state_shapes() (the preflight's config).
    (gemma4.with_kv_layers wants one layer with rows; here none has any)"""
    return HybridCacheConfig(**{f.name: getattr(cfg, f.name) for f in fields(ModelConfig)},
                             kv_layers=(None,) * cfg.n_layers, state_layers=(dims.state_shapes(),) * cfg.n_layers)


def load_mixer_lm(cls, gf, cfg: ModelConfig, dims, load_mixer, device, dtype, act_dtype: torch.dtype):
    """The mixer-only model cls from gf, loaded in this order: token_embd, each layer's attn_norm, each layer's
    mixer load_mixer(gf, i, dims, D, device, dtype) (its tensors checked by name there), output_norm and
    the head (output, or the embedding when the file has none); then cls.cache_config."""
    V, D = cfg.vocab, cfg.d_model
    token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
    norms = [load_vector(gf, f"blk.{i}.attn_norm.weight", device, D) for i in range(cfg.n_layers)]
    mamba = [load_mixer(gf, i, dims, D, device, dtype) for i in range(cfg.n_layers)]
    output_norm = load_vector(gf, "output_norm.weight", device, D)
    output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
    m = cls(cls.cache_config(gf, cfg), token_embd, [], output_norm, output, act_dtype=act_dtype)
    m.norms, m.mamba, m.dims = norms, mamba, dims
    return m


def mixer_lm_forward(m, tokens: torch.Tensor, step: Step, state, mixer, ctx) -> torch.Tensor:
    """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows) of the model m
    load_mixer_lm made: each layer x + mixer(h, m.mamba[i], m.dims, state(i), positions, eps, ctx) with h
    the layer's RMSNorm of x, then the final norm and the head. state: recurrent_state's layer -> state."""
    act, eps, n = m.act_dtype, m.cfg.rms_eps, len(m.mamba)
    x = ops.embedding(tokens, m.token_embd)                              # (T, D) float32
    h = ops.rms_norm_cast(x, m.norms[0], eps, act, ctx)
    for i in range(n):
        a = mixer(h, m.mamba[i], m.dims, state(i), step.positions, eps, ctx).float()
        if i + 1 < n:                  # the residual add and the next layer's norm
            x, h = ops.add_rms_norm(x, a, m.norms[i + 1], eps, act, ctx)
    x, a = step.rows(x), step.rows(a)                                    # (R, D)
    _, h = ops.add_rms_norm(x, a, m.output_norm, eps, act, ctx)
    return m.head(h, ctx)     # (R, V)


class Mamba2Model(LlamaModel):
    """blocks: None (no attention or MLP weights); norms[i] each layer's attn_norm, mamba[i] its mixer."""

    arch = "mamba2"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_MAMBA2 -> NONE (unused: no rope)
    attention_free = True          # head_count / feed_forward_length 0 (ModelConfig, metadata_check)
    paged_kv = True                # the batch engine keeps its state in per-sequence slots (runtime/paged_state.py)
    recurrent = True               # the engine's prefix rule (granitehybrid's)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """cfg with no K/V rows and each layer's per-sequence Mamba-2 state (the preflight's config)."""
        return state_cache_config(cfg, read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Mamba2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        dims = read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False)
        for i in range(cfg.n_layers):      # mamba2.cpp load_arch_tensors: both with flag 0
            for name in ("ssm_conv1d.bias", "ssm_norm.weight"):
                if f"blk.{i}.{name}" not in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is missing (required for {cfg.arch})")
        return load_mixer_lm(cls, gf, cfg, dims, load_mamba2, device, dtype, act_dtype)

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd] + [w for mb in self.mamba for w in (mb.ssm_in, mb.ssm_out)]
        return ws + ([self.output] if self.output is not self.token_embd else [])

    def linear_groups(self) -> list[tuple]:
        return []

    # ---- the forward ----

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        return mixer_lm_forward(self, tokens, step, recurrent_state(cache, self.arch), mamba2_mixer, ctx)
