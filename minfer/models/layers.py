"""The pieces shared by the llama-family models: a block's weights, attention, feed-forward.

Names follow the GGUF tensor names (`blk.N.attn_q.weight` -> Block.attn_q), so loading needs
no rename table. All math goes through minfer.ops, which picks the CPU or CUDA version.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class Block:
    """One transformer layer's weights. Biases are None where the architecture has none."""

    attn_norm: torch.Tensor          # (D,)
    attn_q: QWeight                  # (H*Dh, D)
    attn_k: QWeight                  # (Hkv*Dh, D)
    attn_v: QWeight                  # (Hkv*Dh, D)
    attn_output: QWeight             # (D, H*Dh)
    ffn_norm: torch.Tensor           # (D,)
    ffn_gate: QWeight                # (F, D)
    ffn_up: QWeight                  # (F, D)
    ffn_down: QWeight                # (D, F)
    attn_q_bias: torch.Tensor | None = None  # (H*Dh,)
    attn_k_bias: torch.Tensor | None = None  # (Hkv*Dh,)
    attn_v_bias: torch.Tensor | None = None  # (Hkv*Dh,)


def load_block(gf, cfg, i: int, device, dtype, biases: bool) -> Block:
    p = f"blk.{i}."
    D, F, q_out, kv_out = cfg.d_model, cfg.ffn, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    def w(name, shape):
        return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

    blk = Block(
        attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
        attn_q=w("attn_q", (q_out, D)),
        attn_k=w("attn_k", (kv_out, D)),
        attn_v=w("attn_v", (kv_out, D)),
        attn_output=w("attn_output", (D, q_out)),
        ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
        ffn_gate=w("ffn_gate", (F, D)),
        ffn_up=w("ffn_up", (F, D)),
        ffn_down=w("ffn_down", (D, F)),
    )
    if biases:
        blk.attn_q_bias = load_vector(gf, p + "attn_q.bias", device, q_out)
        blk.attn_k_bias = load_vector(gf, p + "attn_k.bias", device, kv_out)
        blk.attn_v_bias = load_vector(gf, p + "attn_v.bias", device, kv_out)
    return blk


def self_attention(x: torch.Tensor, blk: Block, cfg, cache, layer: int, start_pos,
                   positions: torch.Tensor, act: torch.dtype = torch.float32) -> torch.Tensor:
    """Pre-norm causal self-attention with its residual. x (T, D) -> (T, D), x's dtype.

    Writes this step's rotated keys and values into the cache at `positions`. start_pos is an
    int, or (decode under a CUDA graph) a (1,) device tensor equal to positions. The matmuls
    run in `act` (bf16 on CUDA); the residual stream x keeps its own dtype (float32).
    """
    T = x.shape[0]
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = ops.rms_norm(x, blk.attn_norm, cfg.rms_eps).to(act)
    q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                              (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias))
    q = ops.rope(q.view(T, H, Dh), positions, cfg.rope)
    k = ops.rope(k.view(T, Hkv, Dh), positions, cfg.rope)
    k_cache, v_cache = cache.update(layer, start_pos, k, v.view(T, Hkv, Dh), positions)  # (S, Hkv, Dh)
    o = ops.attention(q, k_cache, v_cache, start_pos)             # (T, H, Dh)
    return x + ops.linear(o.reshape(T, H * Dh), blk.attn_output)


def feed_forward(x: torch.Tensor, blk: Block, cfg, act: torch.dtype = torch.float32) -> torch.Tensor:
    """Pre-norm SwiGLU MLP with its residual: x + W_down(silu(W_gate h) * W_up h). (T, D) -> (T, D)."""
    h = ops.rms_norm(x, blk.ffn_norm, cfg.rms_eps).to(act)
    gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None))
    return x + ops.linear(ops.swiglu(gate, up), blk.ffn_down)
