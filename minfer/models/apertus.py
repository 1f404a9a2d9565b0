"""Swiss AI Apertus (8B, 70B): the GGUF arch `apertus`.

    x_0 = E[tokens]                                   token_embd (V, D); output (V, D)
    for each layer l:
        q, k = rope(qn(W_q n(x))), rope(kn(W_k n(x)))                   n = RMSNorm(attn_norm)
        x = x + W_o attn(q, k, W_v n(x))                                 qn, kn: per-head RMSNorm
        x = x + W_down xielu_l(W_up n'(x))                               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)

    xielu(u) = a_p u^2 + b u                      u > 0
               a_n (expm1(min(u, eps)) - u) + b u  u <= 0
    a_p = softplus(alpha_p),  a_n = b + softplus(alpha_n),  b = beta       (per layer)

Each rule and its source (llama.cpp src/models/apertus.cpp, ggml.c ggml_xielu, ggml-cpu unary-ops.cpp
op_xielu; the converter conversion/llama.py ApertusModel; HF transformers models/apertus and
activations.py XIELUActivation._xielu_python):
- The xIELU parameters are the per-layer arrays `xielu.alpha_n`, `xielu.alpha_p`, `xielu.beta`,
  `xielu.eps` (no architecture prefix: llama-arch.cpp LLM_KV_XIELU_*; the converter writes the trained
  .act_fn.alpha_n/.alpha_p/.beta/.eps values, one per layer; load_arch_hparams get_key_or_arr, so a
  single number stands for every layer). alpha_p and alpha_n are the raw parameters: softplus is
  applied at load (ggml_xielu: beta + softplus(alpha_n), softplus(alpha_p), with ggml's softplus(x) = x
  above 20), as HF's forward does. Computed in float32 with torch on both backends (counted
  `xielu.torch` on CUDA).
- The MLP is not gated: ffn_up, ffn_down only (load_arch_tensors; HF ApertusMLP = NemotronMLP).
- Per-head q/k RMSNorm BEFORE rope (apertus.cpp build_norm(Qcur/Kcur), then ggml_rope_ext; HF q_norm /
  k_norm before apply_rotary_pos_emb): qwen3's order, the shared attention_heads path.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_APERTUS -> NEOX; the converter sets undo_permute False),
  the released Llama-3 scaling as rope_freqs.weight.
- The released models have no biases; the optional attn_output.bias and q/k norm biases llama.cpp would
  load are refused by name (its graph ignores the norm biases; HF has none).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.arcee import ArceeModel
from minfer.models.layers import Block
from minfer.models.llama import LlamaModel
from minfer.weights import load_vector

_REFUSED_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_q_norm.bias",
                    "attn_k_norm.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate.weight")
XIELU_KEYS = ("alpha_n", "alpha_p", "beta", "eps")


def softplus(x: float) -> float:
    """ggml_compute_softplus_f32: x above 20, else log(1 + e^x)."""
    return x if x > 20.0 else math.log1p(math.exp(x))


def xielu(u: torch.Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> torch.Tensor:
    """xIELU of u (float32) with the effective (softplus-applied) alpha_n, alpha_p (module docstring)."""
    neg = (torch.expm1(torch.clamp(u, max=eps)) - u) * alpha_n + beta * u
    return torch.where(u > 0, alpha_p * u * u + beta * u, neg)


def xielu_params(gf, n_layers: int) -> list[tuple[float, float, float, float]]:
    """Per layer (alpha_n, alpha_p, beta, eps) as the activation uses them: softplus applied to the raw
    alpha_p and to alpha_n, beta added to the latter (ggml_xielu)."""
    vals = {}
    for k in XIELU_KEYS:
        key = f"xielu.{k}"
        if key not in gf.metadata:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (apertus's xIELU activation needs it)")
        v = gf.metadata[key]
        if isinstance(v, list):
            if len(v) < n_layers:
                raise MinferError(f"{gf.path}: metadata '{key}' has {len(v)} values, expected one per layer "
                                  f"({n_layers})")
            vals[k] = [float(x) for x in v[:n_layers]]
        else:
            vals[k] = [float(v)] * n_layers
    return [(b + softplus(an), softplus(ap), b, e)
            for an, ap, b, e in zip(vals["alpha_n"], vals["alpha_p"], vals["beta"], vals["eps"])]


class ApertusModel(ArceeModel):
    """ArceeModel's ungated forward with Llama's attention (per-head q/k norms; no YaRN: ModelConfig refuses
    a yarn file for apertus) and the per-layer xIELU."""

    arch = "apertus"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_APERTUS -> NEOX
    qk_norm = True

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        blk = super().load_block(gf, cfg, i, device, dtype)
        blk.attn_q_norm = load_vector(gf, f"blk.{i}.attn_q_norm.weight", device, cfg.head_dim)
        blk.attn_k_norm = load_vector(gf, f"blk.{i}.attn_k_norm.weight", device, cfg.head_dim)
        return blk

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ApertusModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for suffix in _REFUSED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cls.arch} "
                                      "(the released models have no biases and an ungated MLP)")
        params = xielu_params(gf, cfg.n_layers)
        m = LlamaModel.from_gguf.__func__(cls, gf, cfg, device=device, dtype=dtype, progress=progress,
                                          act_dtype=act_dtype)
        m.xielu = params
        return m

    # Llama's attention (the per-head q/k norms before rope, the fused decode paths), never mistral3's YaRN path
    attention_residual_norm = LlamaModel.attention_residual_norm

    def mlp_hidden(self, h: torch.Tensor, blk: Block, i: int, ctx) -> torch.Tensor:
        """xielu_i(W_up h), (T, D) -> (T, F) in h's dtype (the activation in float32)."""
        if ops._backend(h) is not ops.reference:
            ops.paths.count("xielu.torch")
        return xielu(ops.linear(h, blk.ffn_up, None, ctx).float(), *self.xielu[i]).to(h.dtype)
