"""AI21 Jamba (Jamba-v0.1, Jamba 1.5 Mini / Large, Jamba Mini: HF JambaForCausalLM): the GGUF arch `jamba`,
Mamba-1 layers interleaved with rope-less GQA attention layers, each followed by a softmax top-2 MoE or a
dense SwiGLU.

    x_0 = E[tokens]                                         token_embd (V, D); output (V, D), or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        mamba layer:      a = mamba1(h)                     minfer/models/mamba1.py, dt/B/C normed with weights
        attention layer:  a = W_o attn(W_q h, W_k h, W_v h) scores (q . k) / sqrt(Dh), no rope
        x = x + a
        n = RMSNorm(x; ffn_norm)
        x = x + moe(n)   or   x + W_down(silu(W_gate n) * W_up n)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/jamba.cpp load_arch_hparams / load_arch_tensors / graph,
src/models/mamba-base.cpp build_mamba_layer; the converter conversion/jamba.py JambaModel; HF
models/jamba/modeling_jamba.py):
- Which layers are Mamba: `jamba.attention.head_count_kv` is an array with 0 on them (the converter's
  n_kv_vec from attn_layer_offset / attn_layer_period; llama.cpp is_recr = n_head_kv(il) == 0). minfer takes
  one kv-head count for the attention layers and at least one attention layer (granitehybrid.ssm_layers).
- Attention: q/k/v/o without bias, no rope ("No RoPE :)", llama_model_rope_type NONE; HF JambaAttention has
  none), scale 1/sqrt(head_dim) (build_attn(..., 1.0f/sqrtf(n_embd_head)); HF scaling head_dim**-0.5).
- The Mamba-1 mixer (mamba1.py's; ssm.* keys required, inner size 2 * D only: load_arch_tensors'
  GGML_ASSERT) with RMSNorms *with weights* on dt, B and C before dt_proj (ssm_dt_norm / ssm_b_norm /
  ssm_c_norm, required: build_mamba_layer's build_norm(dt, layer.ssm_dt_norm, NULL, LLM_NORM_RMS) with the
  model's one epsilon; HF dt_layernorm / b_layernorm / c_layernorm, JambaRMSNorm(rms_norm_eps)). The conv
  bias and dt bias required (flag 0; HF mamba_conv_bias, dt_proj's bias); no in/out-projection bias.
- The FFN per layer by the tensors the file holds (load_arch_tensors: ffn_gate_inp TENSOR_NOT_REQUIRED):
  with `blk.N.ffn_gate_inp` a MoE of `expert_count` SwiGLU experts of feed_forward_length, softmax over the
  router's logits, the top `expert_used_count`, their weights NOT renormalized (build_moe_ffn(..., norm_w =
  false, ..., LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF JambaTopKRouter: "the selected weights left
  unnormalized"); without it the dense SwiGLU ffn_{gate,up,down} of feed_forward_length (the converter
  renames experts.0 of a non-expert layer to the plain MLP). expert_count / expert_used_count required.
- Both residual adds plain (no multipliers), the RMSNorms with one epsilon (layer_norm_rms_epsilon), the
  final norm then the head (output, or the embedding when the file has none: TENSOR_DUPLICATED).
- Refused by name: bias tensors on attention or the FFN, an expert_weights_scale other than 0 or 1, a
  missing dt/B/C norm.

The cache and the batch engine: granitehybrid's (runtime/kv_cache.py per-layer geometry: K/V rows on the
attention layers only, state_layers the Mamba-1 layers' conv ring (K, di) and SSM ring (2, di, N);
recurrent = True: a cached prefix reused only whole; paged_kv = True: the state in per-sequence slots,
runtime/paged_state.py, mamba1_mixer's decode rows / prefill chunks).
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.granitehybrid import GraniteHybridModel, check_biases_and_scale
from minfer.models.mamba1 import load_mamba1, mamba1_mixer, read_dims
from minfer.weights import QWeight, load_vector


def check_supported(gf, cfg: ModelConfig) -> None:
    a, md = cfg.arch, gf.metadata
    check_biases_and_scale(gf, cfg)
    for key in ("expert_count", "expert_used_count"):
        if f"{a}.{key}" not in md:
            raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
    if not 0 < cfg.n_experts_used <= cfg.n_experts:
        raise MinferError(f"{gf.path}: {a}.expert_count={cfg.n_experts}, expert_used_count={cfg.n_experts_used}: "
                          "expected 0 < used <= count")


class JambaModel(GraniteHybridModel):
    """granitehybrid's layer plan, cache and forward (its hooks: Mamba-1 as the recurrent mixer, the
    experts where the file has a router, every multiplier 1); mamba[i]: a Mamba-1 layer's weights
    (None on attention layers); moe[i]: the experts (None on a dense layer)."""

    arch = "jamba"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_JAMBA -> NONE (unused: no rope)
    per_layer_counts = True        # head_count_kv is an array (0: a Mamba layer)
    attention_free_layers = True
    paged_kv = True
    recurrent = True
    mixer_kind = "Mamba"

    @staticmethod
    def mixer_dims(gf, cfg: ModelConfig):
        return read_dims(gf, cfg.arch, cfg.d_model)

    @staticmethod
    def load_mixer(gf, i: int, dims, D: int, device, dtype):
        """mamba1.py's tensors plus the required dt/B/C norm weights (load_arch_tensors, flag 0)."""
        w = load_mamba1(gf, i, dims, D, device, dtype)
        for name in ("ssm_dt_norm", "ssm_b_norm", "ssm_c_norm"):
            if f"blk.{i}.{name}.weight" not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}.weight' is missing (required for jamba)")
        w.dt_norm = load_vector(gf, f"blk.{i}.ssm_dt_norm.weight", device, dims.dt_rank)
        w.b_norm = load_vector(gf, f"blk.{i}.ssm_b_norm.weight", device, dims.d_state)
        w.c_norm = load_vector(gf, f"blk.{i}.ssm_c_norm.weight", device, dims.d_state)
        return w

    @staticmethod
    def mixer_matrices(mb) -> list[QWeight]:
        return [mb.ssm_in, mb.ssm_x, mb.ssm_dt, mb.ssm_out]

    def mixer(self, h: torch.Tensor, i: int, state, step: Step, ctx) -> torch.Tensor:
        return mamba1_mixer(h, self.mamba[i], self.dims, state, step.positions, self.cfg.rms_eps, ctx)

    @classmethod
    def check_file(cls, gf, cfg: ModelConfig) -> None:
        check_supported(gf, cfg)

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        """The experts where the file has the router (load_arch_tensors: ffn_gate_inp TENSOR_NOT_REQUIRED)."""
        return f"blk.{i}.ffn_gate_inp.weight" in gf.tensors

    @classmethod
    def load_shared(cls, gf, cfg, e, i: int, device, dtype) -> None:
        """No shared expert in jamba."""

    def load_scales(self, gf, cfg: ModelConfig) -> None:
        self.weights_norm = False                # build_moe_ffn(..., norm_w = false, ...)
        self.embed_scale = self.q_scale = self.residual_scale = self.logit_scale = 1.0
