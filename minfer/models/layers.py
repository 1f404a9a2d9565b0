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


def attention_branch(h: torch.Tensor, blk: Block, cfg, cache, layer: int, start_pos,
                     positions: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of the normed input h (T, D) -> W_o attn(...) (T, D), h's dtype.

    Writes this step's rotated keys and values into the cache at `positions`. start_pos is an
    int, or (decode under a CUDA graph) a (1,) device tensor equal to positions.
    """
    T = h.shape[0]
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                              (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias))
    q = ops.rope(q.view(T, H, Dh), positions, cfg.rope)
    k = ops.rope(k.view(T, Hkv, Dh), positions, cfg.rope)
    k_cache, v_cache = cache.update(layer, start_pos, k, v.view(T, Hkv, Dh), positions)  # (S, Hkv, Dh)
    o = ops.attention(q, k_cache, v_cache, start_pos)             # (T, H, Dh)
    return ops.linear(o.reshape(T, H * Dh), blk.attn_output)


def ffn_branch(h: torch.Tensor, blk: Block) -> torch.Tensor:
    """SwiGLU MLP of the normed input: W_down(silu(W_gate h) * W_up h). (T, D) -> (T, D)."""
    gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None))
    return ops.linear(ops.swiglu(gate, up), blk.ffn_down)
