"""Orion (OrionStarAI Orion-14B-Base / -Chat: OrionForCausalLM, remote code): the GGUF arch `orion`.

    x_0 = E[tokens]                                     token_embd (V, D); output (V, D), required
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v)    q/k/v biases optional
        x = x + W_down(silu(W_gate g) * W_up g),  g = LN(x; ffn_norm, ffn_norm.bias)
    logits = W_out LN(x; output_norm, output_norm.bias)

StableLM's sequential graph with whole-head rope (models/stablelm.py computes it); each rule and its source
(llama.cpp src/models/orion.cpp; HF modeling_orion.py):
- LayerNorm (mean removed) with weight and bias before attention, before the MLP and at the output
  (build_norm(..., attn_norm, attn_norm_b, LLM_NORM), likewise ffn_norm / ffn_norm_b and output_norm /
  output_norm_b; load_arch_tensors creates all six with flag 0, so each is required), eps
  `orion.attention.layer_norm_epsilon` (load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS; the converter,
  conversion/orion.py OrionModel, writes config.json's rms_norm_eps there: "config provides rms norm but it is
  actually layer norm", HF nn.LayerNorm(hidden, eps=config.rms_norm_eps)).
- q/k/v biases optional, each taken when present (create_tensor_qkv: TENSOR_NOT_REQUIRED; build_qkv adds each;
  the releases have none, attention_bias false); no output-projection or MLP bias (build_attn gets NULL for wo_b,
  build_ffn NULL biases: refused by name, as llama.cpp's loader would find tensors it did not create). A fused
  attn_qkv (which create_tensor_qkv would take) is refused by name: the converter writes the separate q/k/v.
- RoPE NEOX, halves (llama_model_rope_type: LLM_ARCH_ORION -> NEOX) on the rows as the checkpoint has them
  (OrionModel is a plain TextModel, which permutes nothing; HF's rotate_half), over whole heads (orion.cpp:
  GGML_ASSERT(n_embd_head == n_rot)), no frequency factors (ggml_rope_ext gets nullptr and the loader creates no
  rope_freqs: a file with one is refused by name). The converter writes no rope.freq_base: llama.cpp's default
  1e4 (the releases' rope_theta) is ModelConfig's default too. Scores 1/sqrt(head_dim), GQA.
- SwiGLU MLP (build_ffn LLM_FFN_SILU, LLM_FFN_PAR); every layer has its ffn_norm (no parallel residual, unlike
  stablelm); output.weight required (no tied head: load_arch_tensors flag 0).
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_per_layer_shapes, require_output
from minfer.models.stablelm import StablelmModel

# tensors llama.cpp's orion loader (orion.cpp load_arch_tensors) never creates for a layer, or that the converter
# never writes (the fused attn_qkv)
_REFUSED = ("attn_qkv.weight", "attn_qkv.bias", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias",
            "attn_q_norm.weight", "attn_k_norm.weight")
# created with flag 0 (required) on every layer; attn_norm.* are loaded as required by StablelmModel already
_REQUIRED = ("ffn_norm.weight", "ffn_norm.bias")


def check_layout(gf, cfg: ModelConfig, arch: str = "orion") -> None:
    """Refuse by name what llama.cpp's orion graph cannot run: partial rope, per-layer counts, rope_freqs, the
    tensors its loader does not create, a missing required tensor."""
    if cfg.rope.n_rot != cfg.head_dim:      # orion.cpp: GGML_ASSERT(n_embd_head == n_rot)
        raise MinferError(f"{gf.path}: {arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                          f"{cfg.head_dim} (llama.cpp's orion graph rotates whole heads only)")
    refuse_per_layer_shapes(gf, cfg)
    if "rope_freqs.weight" in gf.tensors:   # orion.cpp: ggml_rope_ext(..., nullptr, ...); no create_tensor for it
        raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {arch} "
                          "(llama.cpp's orion loader creates no such tensor)")
    require_output(gf, cfg, arch)
    for i in range(cfg.n_layers):
        for suffix in _REFUSED:
            if f"blk.{i}.{suffix}" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {arch} "
                                  "(llama.cpp's orion loader creates no such tensor)")
        for suffix in _REQUIRED:
            if f"blk.{i}.{suffix}" not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is missing ({arch}'s LayerNorm before "
                                  "the MLP has a weight and a bias: llama.cpp's loader requires both)")


class OrionModel(StablelmModel):
    """StablelmModel on every layer's ffn_norm (the sequential residual), without per-head q/k norms, rope over
    whole heads; the checks of check_layout."""

    arch = "orion"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_ORION -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"     # orion.cpp load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "OrionModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_layout(gf, cfg, cls.arch)
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
