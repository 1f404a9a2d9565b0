"""Tiny random llama/qwen2/qwen3 models for tests, written as GGUF by the `gguf` package's writer.

`hf_weights()` draws weights in Hugging Face layout (q_proj, k_proj, ... rotate_half RoPE);
`write_tiny_model()` converts them the way llama.cpp's convert_hf_to_gguf.py does
(LlamaModel.permute on q/k for arch llama; qwen2 left unpermuted, with q/k/v biases; qwen3
unpermuted, with per-head q/k RMSNorm weights attn_q_norm / attn_k_norm) and
writes a GGUF. `hf_forward()` is an independent float64 forward pass in HF's formulation,
used as the reference for minfer's forward on the GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType as T


@dataclass
class TinySpec:
    arch: str = "llama"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn: int = 96
    vocab: int = 50
    ctx: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = False
    qtype: int = T.F32            # type of the 2-D weights (F32, F16 or Q8_0)
    seed: int = 0

    @property
    def head_dim(self):
        return self.d_model // self.n_heads


def hf_weights(s: TinySpec) -> dict[str, np.ndarray]:
    g = np.random.default_rng(s.seed)
    D, Dh, F = s.d_model, s.head_dim, s.ffn

    def m(*shape, scale=None):
        return (g.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    w = {"embed": m(s.vocab, D, scale=1.0), "norm": (1 + 0.1 * g.standard_normal(D)).astype(np.float32)}
    if not s.tied:
        w["lm_head"] = m(s.vocab, D)
    for i in range(s.n_layers):
        p = f"l{i}."
        w[p + "q"] = m(s.n_heads * Dh, D)
        w[p + "k"] = m(s.n_kv_heads * Dh, D)
        w[p + "v"] = m(s.n_kv_heads * Dh, D)
        w[p + "o"] = m(D, s.n_heads * Dh)
        w[p + "gate"] = m(F, D)
        w[p + "up"] = m(F, D)
        w[p + "down"] = m(D, F)
        w[p + "in_norm"] = (1 + 0.1 * g.standard_normal(D)).astype(np.float32)
        w[p + "post_norm"] = (1 + 0.1 * g.standard_normal(D)).astype(np.float32)
        if s.arch == "qwen2":
            w[p + "q_bias"] = (0.5 * g.standard_normal(s.n_heads * Dh)).astype(np.float32)
            w[p + "k_bias"] = (0.5 * g.standard_normal(s.n_kv_heads * Dh)).astype(np.float32)
            w[p + "v_bias"] = (0.5 * g.standard_normal(s.n_kv_heads * Dh)).astype(np.float32)
        if s.arch == "qwen3":
            w[p + "q_norm"] = (1 + 0.3 * g.standard_normal(Dh)).astype(np.float32)
            w[p + "k_norm"] = (1 + 0.3 * g.standard_normal(Dh)).astype(np.float32)
    return w


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute (a format rule of the llama converter)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _add(wr, name, x, qtype):
    if x.ndim == 1 or qtype == T.F32:
        wr.add_tensor(name, x.astype(np.float32))
    elif qtype == T.F16:
        wr.add_tensor(name, x.astype(np.float16))
    else:
        wr.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)


def write_tiny_model(path, s: TinySpec, w: dict | None = None) -> Path:
    path = Path(path)
    w = w if w is not None else hf_weights(s)
    wr = gguf.GGUFWriter(str(path), s.arch)
    wr.add_name(f"tiny-{s.arch}")
    wr.add_block_count(s.n_layers)
    wr.add_context_length(s.ctx)
    wr.add_embedding_length(s.d_model)
    wr.add_feed_forward_length(s.ffn)
    wr.add_head_count(s.n_heads)
    wr.add_head_count_kv(s.n_kv_heads)
    wr.add_layer_norm_rms_eps(s.rms_eps)
    wr.add_rope_freq_base(s.rope_theta)
    _add(wr, "token_embd.weight", w["embed"], s.qtype)
    for i in range(s.n_layers):
        p, b = f"l{i}.", f"blk.{i}."
        q, k = w[p + "q"], w[p + "k"]
        if s.arch == "llama":
            q, k = permute(q, s.n_heads, s.n_heads), permute(k, s.n_heads, s.n_kv_heads)
        _add(wr, b + "attn_norm.weight", w[p + "in_norm"], s.qtype)
        _add(wr, b + "attn_q.weight", q, s.qtype)
        _add(wr, b + "attn_k.weight", k, s.qtype)
        _add(wr, b + "attn_v.weight", w[p + "v"], s.qtype)
        _add(wr, b + "attn_output.weight", w[p + "o"], s.qtype)
        _add(wr, b + "ffn_norm.weight", w[p + "post_norm"], s.qtype)
        _add(wr, b + "ffn_gate.weight", w[p + "gate"], s.qtype)
        _add(wr, b + "ffn_up.weight", w[p + "up"], s.qtype)
        _add(wr, b + "ffn_down.weight", w[p + "down"], s.qtype)
        if s.arch == "qwen2":
            for n in ("q", "k", "v"):
                _add(wr, b + f"attn_{n}.bias", w[p + f"{n}_bias"], s.qtype)
        if s.arch == "qwen3":   # convert_hf_to_gguf: q_norm -> attn_q_norm, k_norm -> attn_k_norm
            _add(wr, b + "attn_q_norm.weight", w[p + "q_norm"], s.qtype)
            _add(wr, b + "attn_k_norm.weight", w[p + "k_norm"], s.qtype)
    _add(wr, "output_norm.weight", w["norm"], s.qtype)
    if not s.tied:
        _add(wr, "output.weight", w["lm_head"], s.qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def hf_forward(w: dict, s: TinySpec, tokens: list[int]) -> torch.Tensor:
    """Logits (T, V) in float64, HF-Llama/Qwen2/Qwen3 style: rotate_half RoPE on unpermuted q/k
    (Qwen3: q_norm/k_norm RMSNorm over each head first), repeat_kv for GQA, explicit masked
    softmax."""
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    T_, D, H, Hkv, Dh = len(tokens), s.d_model, s.n_heads, s.n_kv_heads, s.head_dim

    def norm(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + s.rms_eps) * g

    inv = 1.0 / (s.rope_theta ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    ang = torch.arange(T_, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]   # (T, 1, Dh)

    def rotate_half(x):
        return torch.cat([-x[..., Dh // 2:], x[..., : Dh // 2]], -1)

    x = t["embed"][torch.tensor(tokens)]
    mask = torch.full((T_, T_), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(s.n_layers):
        p = f"l{i}."
        h = norm(x, t[p + "in_norm"])
        q, k, v = h @ t[p + "q"].T, h @ t[p + "k"].T, h @ t[p + "v"].T
        if s.arch == "qwen2":
            q, k, v = q + t[p + "q_bias"], k + t[p + "k_bias"], v + t[p + "v_bias"]
        q, k, v = q.view(T_, H, Dh), k.view(T_, Hkv, Dh), v.view(T_, Hkv, Dh)
        if s.arch == "qwen3":   # HF Qwen3Attention: q_norm / k_norm on the head_dim view, before rope
            q, k = norm(q, t[p + "q_norm"]), norm(k, t[p + "k_norm"])
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        att = torch.einsum("thd,shd->hts", q, k) / Dh ** 0.5 + mask
        o = torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(T_, H * Dh)
        x = x + o @ t[p + "o"].T
        h = norm(x, t[p + "post_norm"])
        g = h @ t[p + "gate"].T
        x = x + (g * torch.sigmoid(g) * (h @ t[p + "up"].T)) @ t[p + "down"].T
    x = norm(x, t["norm"])
    return x @ (t["embed"] if s.tied else t["lm_head"]).T
