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

from dataclasses import fields

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import KVLayersConfig, with_kv_layers
from minfer.models.granite import _BIASES
from minfer.models.granitehybrid import GraniteHybridModel, HybridCacheConfig, ssm_layers
from minfer.models.layers import Block
from minfer.models.mamba1 import load_mamba1, mamba1_mixer, read_dims
from minfer.models.mamba2 import recurrent_state
from minfer.models.qwen3moe import MoeBlock, load_experts
from minfer.weights import QWeight, load_qweight, load_vector


def check_supported(gf, cfg: ModelConfig) -> None:
    a, md = cfg.arch, gf.metadata
    for i in range(cfg.n_layers):
        for name in _BIASES:
            t = f"blk.{i}.{name}.bias"
            if t in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{t}': {a} files with bias tensors are not supported")
    ws = md.get(f"{a}.expert_weights_scale")
    if ws is not None and float(ws) not in (0.0, 1.0):
        raise MinferError(f"{gf.path}: metadata key '{a}.expert_weights_scale' is {ws}, which is not supported "
                          "(0 or 1)")
    for key in ("expert_count", "expert_used_count"):
        if f"{a}.{key}" not in md:
            raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
    if not 0 < cfg.n_experts_used <= cfg.n_experts:
        raise MinferError(f"{gf.path}: {a}.expert_count={cfg.n_experts}, expert_used_count={cfg.n_experts_used}: "
                          "expected 0 < used <= count")


class JambaModel(GraniteHybridModel):
    """granitehybrid's layer structure and forward with every multiplier 1; mamba[i]: a Mamba-1 layer's
    weights (None on attention layers); moe[i]: the experts (None on a dense layer)."""

    arch = "jamba"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_JAMBA -> NONE (unused: no rope)
    per_layer_counts = True        # head_count_kv is an array (0: a Mamba layer)
    attention_free_layers = True
    paged_kv = True
    recurrent = True

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """(Hkv, Dh, Dh) rows on attention layers; the Mamba-1 layers' per-sequence state."""
        is_ssm = ssm_layers(gf, cfg)
        dims = read_dims(gf, cfg.arch, cfg.d_model)
        kv = with_kv_layers(cfg, [None if s else (cfg.n_kv_heads, cfg.head_dim, cfg.head_dim) for s in is_ssm])
        return HybridCacheConfig(**{f.name: getattr(kv, f.name) for f in fields(KVLayersConfig)},
                                 state_layers=tuple(dims.state_shapes() if s else None for s in is_ssm))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "JambaModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        is_ssm, dims = ssm_layers(gf, cfg), read_dims(gf, cfg.arch, cfg.d_model)
        V, D = cfg.vocab, cfg.d_model
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, mamba = [], [], []
        for i in range(cfg.n_layers):
            blk, e = cls.load_layer(gf, cfg, i, is_ssm[i], device, dtype)
            blocks.append(blk)
            moe.append(e)
            mamba.append(cls.load_mixer(gf, i, dims, D, device, dtype) if is_ssm[i] else None)
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe, m.mamba, m.is_ssm, m.dims = moe, mamba, is_ssm, dims
        m.weights_norm = False                   # build_moe_ffn(..., norm_w = false, ...)
        m.embed_scale = m.q_scale = m.residual_scale = m.logit_scale = 1.0
        return m

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

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, ssm: bool, device, dtype) -> tuple:
        """blk.i's norms, attention (attention layers) and FFN: MoE where ffn_gate_inp is present, else dense."""
        p, D, F, Dh, E = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.head_dim, cfg.n_experts
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D), attn_q=None, attn_k=None,
                    attn_v=None, attn_output=None, ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                    ffn_gate=None, ffn_up=None, ffn_down=None)
        if not ssm:
            blk.attn_q, blk.attn_k = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D))
            blk.attn_v, blk.attn_output = w("attn_v", (kv_out, D)), w("attn_output", (D, q_out))
        if p + "ffn_gate_inp.weight" not in gf.tensors:
            blk.ffn_gate, blk.ffn_up, blk.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            return blk, None
        e = MoeBlock(gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
                     gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, F, D), dtype),
                     up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, F, D), dtype),
                     down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, F), dtype))
        return blk, e

    def layer_matrices(self, i: int) -> list[QWeight]:
        """A Mamba-1 layer's four projections before the experts."""
        mb = self.mamba[i]
        extra = [] if self.moe[i] is None else self.moe[i].matrices()
        return ([mb.ssm_in, mb.ssm_x, mb.ssm_dt, mb.ssm_out] if mb is not None else []) + extra

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's mixer of the normed input h (T, D): Mamba-1, or granitehybrid's rope-less attention."""
        if self.is_ssm[i]:
            state = recurrent_state(cache, self.arch, "Mamba")
            return mamba1_mixer(h, self.mamba[i], self.dims, state(i), step.positions, self.cfg.rms_eps, ctx)
        return super()._attention(h, blk, i, cache, step, ctx)
